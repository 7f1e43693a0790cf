//! Steady, seamless faces: in, clips generated here with FFmpeg from the public-domain portrait
//! (still with temporal sensor noise, moving along a known path, cut); out, assertions on the
//! landmarks `--faces-json` records (the points used for the crop and the paste) and on the
//! pictures the real binary writes.

use crate::common;

use std::path::Path;

use common::*;

type Points = Vec<[f64; 2]>;

/// Every face's five points per frame, from `--faces-json`, ordered left to right.
fn all_points(path: &Path) -> Vec<Vec<Points>> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let mut faces: Vec<Points> = f["faces"]
                .as_array()
                .unwrap()
                .iter()
                .map(|face| {
                    face["landmarks"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()])
                        .collect()
                })
                .collect();
            faces.sort_by(|a, b| a[0][0].total_cmp(&b[0][0]));
            faces
        })
        .collect()
}

fn eye_distance(p: &Points) -> f64 {
    (p[0][0] - p[1][0]).hypot(p[0][1] - p[1][1])
}

/// RMS distance of each landmark from its temporal mean, and the mean eye distance.
fn jitter(track: &[&Points]) -> (f64, f64) {
    let n = track.len() as f64;
    let mean: Vec<[f64; 2]> = (0..5)
        .map(|k| {
            let s = track.iter().fold([0.0, 0.0], |s, p| [s[0] + p[k][0], s[1] + p[k][1]]);
            [s[0] / n, s[1] / n]
        })
        .collect();
    let se: f64 = track
        .iter()
        .flat_map(|p| (0..5).map(|k| (p[k][0] - mean[k][0]).powi(2) + (p[k][1] - mean[k][1]).powi(2)))
        .sum();
    ((se / (5.0 * n)).sqrt(), eye_distance(&mean))
}

/// Runs the identity stand-in on `input` with `extra` flags; every face's points per frame (the
/// frames written are not looked at: the encoder's fastest preset).
fn points_of(dir: &Path, input: &Path, name: &str, extra: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<Vec<Points>> {
    let model = asset("models/standin/identity-256.onnx");
    let mut extra = extra.to_vec();
    extra.extend([&"--preset" as &dyn AsRef<std::ffi::OsStr>, &"ultrafast"]);
    run_with_faces(dir, input, name, &model, &extra);
    all_points(&dir.join(format!("{name}.faces.json")))
}

/// Writes `frames` frames made by the filter `graph` from the portrait (`[0:v]`) over a plain
/// background (`[1:v]`, the lavfi source `background`), its result labelled `[v]`, encoded with
/// libx264 (ultrafast, `crf`).
fn portrait_clip(out: &Path, background: &str, graph: &str, frames: usize, crf: u32) {
    let png = asset("samples/astronaut.png");
    let (n, crf) = (frames.to_string(), crf.to_string());
    ffmpeg(&[
        "-loop",
        "1",
        "-i",
        png.to_str().unwrap(),
        "-f",
        "lavfi",
        "-i",
        background,
        "-filter_complex",
        graph,
        "-map",
        "[v]",
        "-frames:v",
        &n,
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-crf",
        &crf,
        out.to_str().unwrap(),
    ]);
}

/// Writes `frames` frames of a still 1080p picture with temporal sensor noise (FFmpeg's
/// `noise` filter, new noise each frame): the portrait at two sizes, eye distances about 53 and
/// 31 px.
fn noisy_still_clip(out: &Path, frames: usize) {
    portrait_clip(
        out,
        "color=c=0x405060:s=1920x1080:r=25",
        "[0:v]split[p0][p1];[p0]scale=640:640[a];[p1]scale=400:400[b];\
         [1:v][a]overlay=x=200:y=60[o];[o][b]overlay=x=1200:y=300,noise=alls=12:allf=t,format=yuv420p[v]",
        frames,
        20,
    );
}

/// A still 1080p picture with temporal sensor noise (FFmpeg's `noise` filter, new noise each
/// frame): the portrait at two sizes, eye distances about 53 and 31 px. Nothing moves, so every
/// movement of the points is jitter. The default smoothing holds the larger face within 0.5 px
/// and both within 1 % of their eye distance (about 1.8 px and 3.4 % unsmoothed).
#[test]
fn still_faces_in_a_noisy_clip_hold_still() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("noisy.mp4");
    noisy_still_clip(&input, 40);
    let frames = points_of(dir.path(), &input, "still.mp4", &[]);
    // The detector's own points, without the face mesh: the mesh's may not be less steady.
    let plain = points_of(dir.path(), &input, "still-no-mesh.mp4", &[&"--mesh", &"none"]);
    assert_eq!(frames.len(), 40);
    assert!(frames.iter().all(|f| f.len() == 2), "two faces on every frame");
    assert!(
        plain.iter().all(|f| f.len() == 2),
        "two faces on every frame without the mesh"
    );
    for (i, want_eye) in [(0, 53.0), (1, 31.0)] {
        let track: Vec<&Points> = frames.iter().map(|f| &f[i]).collect();
        let (rms, eye) = jitter(&track);
        let (rms_plain, _) = jitter(&plain.iter().map(|f| &f[i]).collect::<Vec<_>>());
        eprintln!(
            "face {i}: eye distance {eye:.1} px, jitter {rms:.3} px ({:.2} %); without the mesh {rms_plain:.3} px",
            100.0 * rms / eye
        );
        assert!(
            rms <= rms_plain * 1.1 + 0.01,
            "face {i}: jitter {rms:.3} px with the mesh, {rms_plain:.3} px without"
        );
        assert!((eye - want_eye).abs() < 6.0, "face {i}: eye distance {eye:.1}");
        assert!(
            rms <= 0.01 * eye,
            "face {i}: jitter {rms:.3} px at {eye:.1} px eye distance"
        );
        if i == 0 {
            assert!(rms <= 0.5, "jitter {rms:.3} px at {eye:.1} px eye distance");
        }
    }
}

/// The portrait's left edge, per frame, in the moving clip: still for 20 frames, a slow pan of
/// 2 px per frame, a sudden jump of 200 px at frame 40, the pan again, and at frame 55 a cut
/// (new background) where the face reappears 12 px away (a quarter of its eye distance, close
/// enough that only the cut tells it is a new shot).
fn moving_x(n: usize) -> f64 {
    match n {
        0..=19 => 100.0,
        20..=39 => 100.0 + 2.0 * (n - 20) as f64,
        40..=54 => 340.0 + 2.0 * (n - 20) as f64,
        _ => 420.0,
    }
}

#[test]
fn moving_faces_follow_their_path_without_lag_and_a_cut_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("moving.mp4");
    // The overlay's frame number runs one ahead of the output's here, hence n - 1 in its path.
    let graph = "[1:v]drawbox=x=0:y=0:w=iw:h=ih:color=0xd0c8a0:t=fill:enable='gte(n,55)'[bg];\
        [0:v]scale=512:512[a];\
        [bg][a]overlay=eval=frame:y=100:x='if(lt(n,21),100,if(lt(n,41),100+2*(n-21),if(lt(n,56),340+2*(n-21),420)))',\
        noise=alls=12:allf=t,format=yuv420p[v]";
    portrait_clip(&input, "color=c=0x2a3440:s=1280x720:r=25", graph, 70, 20);
    let raw = points_of(dir.path(), &input, "raw.mp4", &[&"--smooth", &"0"]);
    let smoothed = points_of(dir.path(), &input, "smooth.mp4", &[]);
    assert_eq!((raw.len(), smoothed.len()), (70, 70));
    assert!(
        raw.iter().chain(&smoothed).all(|f| f.len() == 1),
        "one face on every frame"
    );
    // The truth: the still picture's points (the mean over the still frames) moved as the
    // portrait was.
    let still: Vec<&Points> = raw[..20].iter().map(|f| &f[0]).collect();
    let reference: Vec<[f64; 2]> = (0..5)
        .map(|k| {
            let s = still.iter().fold([0.0, 0.0], |s, p| [s[0] + p[k][0], s[1] + p[k][1]]);
            [s[0] / 20.0, s[1] / 20.0]
        })
        .collect();
    let eye = eye_distance(&reference);
    let error = |p: &Points, n: usize| {
        let dx = moving_x(n) - moving_x(0);
        let se: f64 = (0..5)
            .map(|k| (p[k][0] - reference[k][0] - dx).powi(2) + (p[k][1] - reference[k][1]).powi(2))
            .sum();
        (se / 5.0).sqrt()
    };
    let rms = |frames: &[Vec<Points>], range: std::ops::Range<usize>| {
        let n = range.len() as f64;
        (range.map(|i| error(&frames[i][0], i).powi(2)).sum::<f64>() / n).sqrt()
    };
    for (what, range) in [("pan", 20..40), ("jump", 40..55), ("after the cut", 55..70)] {
        let (r, s) = (rms(&raw, range.clone()), rms(&smoothed, range.clone()));
        eprintln!("{what}: error to the truth {r:.2} px unsmoothed, {s:.2} px smoothed (eye distance {eye:.1} px)");
        assert!(
            s <= r,
            "{what}: smoothed error {s:.2} px is larger than unsmoothed {r:.2} px"
        );
    }
    // No overshoot or lag at the jump and no pull toward the old shot at the cut: every frame
    // there is as close to its own truth as detection noise allows.
    for n in (38..44).chain(55..60) {
        let e = error(&smoothed[n][0], n);
        assert!(
            e < 0.06 * eye,
            "frame {n}: {e:.2} px from the truth (eye distance {eye:.1})"
        );
    }
}

/// With the face mask, what the model regenerates in the crop's corners (here the negated
/// background) stays out of the picture; with `--mask box` it goes in.
#[test]
fn the_face_mask_leaves_the_crop_corners_alone() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/negate-256.onnx");
    let plain = dir.path().join("plain.mp4");
    plain_reencode(&input, &plain);
    let (_, _, want) = rgb_frames(&plain);
    let mut changed_corners = Vec::new();
    for mask in ["face", "box"] {
        let (out, faces, _) = run_with_faces(
            dir.path(),
            &input,
            &format!("{mask}.mp4"),
            &model,
            &[&"--mask", &mask, &"--frames", &"10"],
        );
        let (w, _, got) = rgb_frames(&out);
        let points = all_points(&dir.path().join(format!("{mask}.mp4.faces.json")));
        let mut corner_db = Vec::new();
        for (i, g) in got.iter().enumerate() {
            let p = &points[i][0];
            // The crop's corners: around the face, outside cheeks and hair, beside the eyes
            // by 1.6 eye distances and above them by 1.5 (the crop spans about 3.2).
            let (cx, cy, e) = ((p[0][0] + p[1][0]) / 2.0, (p[0][1] + p[1][1]) / 2.0, eye_distance(p));
            let corners: Vec<Rect> = [(-1.0, -1.0), (1.0, -1.0)]
                .iter()
                .map(|(sx, sy)| {
                    let (x, y) = (cx + sx * 1.45 * e, cy + sy * 1.35 * e);
                    [x - 0.12 * e, y - 0.12 * e, x + 0.12 * e, y + 0.12 * e]
                })
                .collect();
            assert!(!faces[i].0.is_empty());
            let (db, n) = psnr(g, &want[i], w, |x, y| inside(&corners, x, y, 0.0));
            assert!(n > 0);
            corner_db.push(db);
        }
        let worst = corner_db.iter().cloned().fold(99.0, f64::min);
        eprintln!("--mask {mask}: crop corners at least {worst:.1} dB from a plain re-encode");
        changed_corners.push(worst);
    }
    assert!(
        changed_corners[0] > 33.0,
        "face mask: corners changed ({:.1} dB)",
        changed_corners[0]
    );
    assert!(
        changed_corners[1] < 20.0,
        "box mask: corners kept ({:.1} dB)",
        changed_corners[1]
    );
}

/// Two portraits drifting slowly in a noisy 720p clip, one large and one small (eye distances
/// about 47 and 15 px): the points tracking finds (the default `--detect-every`) sit where
/// whole-frame detection on every frame puts them, on the same area-averaged detection copy,
/// within 3 % of the eye distance (median over the frames) for each face (about 5 and 13 %
/// with windows resampled around each face).
#[test]
fn tracked_points_match_whole_frame_detection_small_faces_included() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("two.mp4");
    portrait_clip(
        &input,
        "color=c=0x36403a:s=1280x720:r=25",
        "[0:v]split[a0][b0];[a0]scale=576:576[a];[b0]scale=180:180[b];\
         [1:v][a]overlay=eval=frame:x=64+n*0.24:y=72[o];\
         [o][b]overlay=eval=frame:x=920:y=144+n*0.2,noise=alls=5:allf=t,format=yuv420p[v]",
        30,
        18,
    );
    let whole = points_of(
        dir.path(),
        &input,
        "whole.mp4",
        &[&"--smooth", &"0", &"--detect-every", &"1"],
    );
    let tracked = points_of(dir.path(), &input, "tracked.mp4", &[&"--smooth", &"0"]);
    assert_eq!((whole.len(), tracked.len()), (30, 30));
    let mut errors = [Vec::new(), Vec::new()];
    for (n, (a, b)) in whole.iter().zip(&tracked).enumerate() {
        assert_eq!((a.len(), b.len()), (2, 2), "frame {n}: two faces in both runs");
        for (i, (pa, pb)) in a.iter().zip(b).enumerate() {
            let d = (0..5)
                .map(|k| (pa[k][0] - pb[k][0]).hypot(pa[k][1] - pb[k][1]))
                .sum::<f64>()
                / 5.0;
            errors[i].push(d / eye_distance(pa));
        }
    }
    for (i, e) in errors.iter_mut().enumerate() {
        e.sort_by(f64::total_cmp);
        let eye = eye_distance(&whole[0][i]);
        let (median, worst) = (e[e.len() / 2], e[e.len() - 1]);
        eprintln!(
            "face {i} (eye distance {eye:.1} px): tracked points {:.2} % of it from whole-frame detection (median), {:.2} % at most",
            100.0 * median,
            100.0 * worst
        );
        assert!(
            median <= 0.03,
            "face {i}: median {:.2} % of the eye distance",
            100.0 * median
        );
    }
}

/// Where the model changes nothing, nothing changes: the identity stand-in (crops of 512, so
/// the small face is enlarged 4 times into the crop and shrunk back) on the noisy 1080p clip
/// gives, inside the faces, the plain re-encode's pictures (at least 40 dB PSNR; about 31 dB
/// when a resampled copy of the face was pasted back), the difference from it does not move
/// from frame to frame, and the file is the `--blend 0` one, byte for byte.
#[test]
fn the_identity_model_changes_nothing_inside_faces() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("noisy.mp4");
    noisy_still_clip(&input, 12);
    let model = asset("models/standin/identity-512.onnx");
    let (faces, w, got, want) = run_against_plain(dir.path(), &input, &model);
    assert!(faces.iter().all(|f| f.0.len() == 2), "two faces on every frame");
    let (mut dbs, mut flicker) = (Vec::new(), Vec::new());
    for i in 0..got.len() {
        let keep = |x: usize, y: usize| inside(&faces[i].0, x, y, 0.0);
        dbs.push(psnr(&got[i], &want[i], w, keep).0);
        if i > 0 {
            // Frame to frame change of (output - plain re-encode) inside the faces.
            let (mut sum, mut n) = (0.0, 0usize);
            for (k, ((a, b), (c, d))) in got[i]
                .iter()
                .zip(&want[i])
                .zip(got[i - 1].iter().zip(&want[i - 1]))
                .enumerate()
            {
                let p = k / 3;
                if keep(p % w, p / w) {
                    sum += ((*a as f64 - *b as f64) - (*c as f64 - *d as f64)).abs();
                    n += 1;
                }
            }
            flicker.push(sum / n as f64);
        }
    }
    let db = mean_psnr(&dbs);
    let moves = flicker.iter().sum::<f64>() / flicker.len() as f64;
    eprintln!("inside faces: {db:.1} dB from a plain re-encode; (output - plain) moves {moves:.3} levels a frame");
    assert!(db >= 40.0, "inside faces {db:.1} dB from a plain re-encode");
    assert!(moves < 0.1, "(output - plain) moves {moves:.3} levels a frame");
    let zero = dir.path().join("blend0.mp4");
    ok(&gpen(&[&input, &zero, &"--model", &model, &"--blend", &"0"]));
    assert_eq!(
        std::fs::read(&zero).unwrap(),
        std::fs::read(dir.path().join("run.mp4")).unwrap(),
        "identity at blend 1 is the blend 0 file"
    );
}
