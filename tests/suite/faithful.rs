//! Faces true to the film: in, clips made here from real photos (the set-up's portrait of
//! Eileen Collins; Joe Biden from face_recognition's test images, public domain) and stand-in
//! restorers (models/make_standins.py): one that returns another real person's aligned face,
//! one that casts colour and sharpens, one that blurs, and the identity; out, what the identity
//! guard, the colour fix and the quality figure make of them, read from the output's frames,
//! `--faces-json` and `--stats-json`.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use gpen_video::api::faces::detect::Detector;
use gpen_video::api::runtime::{session, SessionOptions};

/// Joe Biden's face from biden.jpg, aligned to the FFHQ template at 256 as the pipeline aligns a
/// face (planar RGB24), and a 512x512 picture around it.
fn biden() -> (Vec<u8>, image::RgbImage) {
    gpen_video::init_ffmpeg();
    let opts = SessionOptions::cpu(1);
    let det = session(&asset("models/centerface.onnx"), &opts, "detector").unwrap();
    let mut detector = Detector::new(det, (640, 640), 0.5, 0.3, 0).unwrap();
    let (rgb, w, h, faces) =
        gpen_video::api::people::faces_in_photo(&asset("samples/people/biden.jpg"), &mut detector).unwrap();
    let face = &faces[0];
    let size = 256;
    let tpl = gpen_video::api::faces::align::Template::Ffhq.points(size);
    let to_crop = gpen_video::api::geom::fit_similarity(&face.landmarks, &tpl);
    let region = gpen_video::api::geom::crop_footprint(&to_crop, size, w, h);
    let mut crop = vec![0u8; 3 * size * size];
    let mut scratch = gpen_video::api::kernels::warp::WarpScratch::at(gpen_video::api::kernels::Cpu::detected());
    gpen_video::api::kernels::warp::warp_face(&rgb, (w, h), &to_crop, region, size, &mut crop[..], &mut scratch);
    // A square around the face, 2.5 times its height.
    let [x0, y0, x1, y1] = face.bbox;
    let side = (2.5 * (y1 - y0)) as u32;
    let (cx, cy) = ((x0 + x1) / 2.0, (y0 + y1) / 2.0);
    let left = (cx - side as f32 / 2.0).max(0.0) as u32;
    let top = (cy - side as f32 / 2.0).max(0.0) as u32;
    let side = side.min(w as u32 - left).min(h as u32 - top);
    let photo = image::RgbImage::from_raw(w as u32, h as u32, rgb).unwrap();
    let square = image::imageops::crop_imm(&photo, left, top, side, side).to_image();
    let square = image::imageops::resize(&square, 512, 512, image::imageops::FilterType::Triangle);
    (crop, square)
}

/// The stand-in that returns Biden's aligned face whatever it is given (built in `dir`).
fn person_standin(dir: &Path, face: &[u8]) -> PathBuf {
    standin(dir, face, "person")
}

/// The stand-in `kind` (`person`, `person-fidelity`) around Biden's aligned face, built in `dir`.
fn standin(dir: &Path, face: &[u8], kind: &str) -> PathBuf {
    let (raw, model) = (dir.join("biden-256.raw"), dir.join(format!("{kind}-256.onnx")));
    std::fs::write(&raw, face).unwrap();
    let out = std::process::Command::new(asset(".deps/venv/bin/python"))
        .args([
            asset("models/make_standins.py").as_os_str(),
            kind.as_ref(),
            raw.as_os_str(),
            model.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    model
}

/// A lossless one-second clip (10 fps) of `picture` held still.
fn still_clip(dir: &Path, picture: &image::RgbImage, name: &str) -> PathBuf {
    let (png, clip) = (dir.join(format!("{name}.png")), dir.join(format!("{name}.mkv")));
    picture.save(&png).unwrap();
    ffmpeg(&[
        "-v",
        "error",
        "-y",
        "-loop",
        "1",
        "-i",
        arg(&png),
        "-t",
        "1",
        "-r",
        "10",
        "-pix_fmt",
        "yuv444p",
        "-c:v",
        "ffv1",
        arg(&clip),
    ]);
    clip
}

/// Each face of a `--faces-json` record: (frame, track, identity, blend, quality before/after).
type FaceFigures = (u64, u64, Option<f64>, Option<f64>, Option<(f64, f64)>);
fn face_figures(json: &Path) -> Vec<FaceFigures> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let mut out = Vec::new();
    for frame in v.as_array().unwrap() {
        for f in frame["faces"].as_array().unwrap() {
            let q = &f["quality"];
            out.push((
                frame["frame"].as_u64().unwrap(),
                f["track"].as_u64().unwrap_or(u64::MAX),
                f["identity"].as_f64(),
                f["blend"].as_f64(),
                q["before"].as_f64().zip(q["after"].as_f64()),
            ));
        }
    }
    out
}

/// Runs `model` on `clip` with `flags`, writing an FFV1 copy, its faces record and its
/// statistics; returns the output, the faces' figures, the statistics and what it printed.
fn run(
    dir: &Path,
    clip: &Path,
    model: &Path,
    name: &str,
    flags: &[&str],
) -> (PathBuf, Vec<FaceFigures>, serde_json::Value, String) {
    let (out, faces, stats) = (
        dir.join(format!("{name}.mkv")),
        dir.join(format!("{name}.faces.json")),
        dir.join(format!("{name}.stats.json")),
    );
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &clip,
        &out,
        &"--model",
        &model,
        &"--codec",
        &"ffv1",
        &"--faces-json",
        &faces,
        &"--stats-json",
        &stats,
    ];
    args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
    let err = ok(&gpen(&args));
    let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    (out, face_figures(&faces), stats, err)
}

/// Collins (left) beside Biden (right), a one-second still clip in `dir`.
fn collins_and_biden(dir: &Path, square: &image::RgbImage) -> PathBuf {
    let collins = image::open(asset("samples/astronaut.png")).unwrap().to_rgb8();
    let mut both = image::RgbImage::new(1024, 512);
    image::imageops::replace(&mut both, &collins, 0, 0);
    image::imageops::replace(&mut both, square, 512, 0);
    still_clip(dir, &both, "two")
}

/// The tracks of Collins (the left face) and Biden in a faces record.
fn her_and_his(json: &Path) -> (u64, u64) {
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let track_at = |left: bool| -> u64 {
        let f = json[0]["faces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| (f["bbox"][0].as_f64().unwrap() < 512.0) == left)
            .unwrap();
        f["track"].as_u64().unwrap()
    };
    (track_at(true), track_at(false))
}

/// A restorer with a fidelity input (CodeFormer's contract) that gives Biden's face at fidelity
/// 0 and the input at 1: run at 0, the guard runs Collins' faces again at a higher fidelity
/// before it lowers their share, so she is herself again with the whole of a more faithful
/// change; Biden's track keeps the run's fidelity.
#[test]
fn a_fidelity_model_is_run_again_more_faithfully_before_its_share_is_lowered() {
    let dir = tempfile::tempdir().unwrap();
    let (face, square) = biden();
    let model = standin(dir.path(), &face, "person-fidelity");
    let clip = collins_and_biden(dir.path(), &square);
    let at_zero = ["--fidelity", "0", "--color-fix", "off"];
    let (guarded, _, stats, err) = run(dir.path(), &clip, &model, "raised", &at_zero);
    let (her, his) = her_and_his(&dir.path().join("raised.faces.json"));
    let tracks = stats["identity"].as_array().unwrap();
    let of = |t: u64| tracks.iter().find(|r| r["track"] == t).unwrap();
    assert_eq!(of(her)["guard"], "backed off", "{stats}");
    assert!(of(her)["identity_restorer"].as_f64().unwrap() <= 0.5, "{stats}");
    let raised = of(her)["fidelity"].as_f64().unwrap();
    assert!(raised >= 0.75, "{stats}");
    assert_eq!(of(her)["share"].as_f64(), Some(1.0), "{stats}");
    assert_eq!(of(her)["same"], true, "{stats}");
    assert!(of(his)["fidelity"].is_null() && of(his)["guard"].is_null(), "{stats}");
    assert!(
        err.contains(&format!("track {her} (frames 0-9)"))
            && err.contains(&format!("run again at fidelity {raised:.2} (the run's 0.00)")),
        "{err}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("raised.faces.json")).unwrap()).unwrap();
    for frame in json.as_array().unwrap() {
        for f in frame["faces"].as_array().unwrap() {
            if f["track"] == her {
                // Every face of hers, the first included, was pasted from the raised fidelity.
                assert_eq!(f["fidelity"].as_f64(), Some(raised), "{frame}");
                assert_eq!(f["blend"].as_f64(), Some(1.0), "{frame}");
                assert!(f["identity"].as_f64().unwrap() > 0.5, "{frame}");
            } else {
                assert!(f["fidelity"].is_null(), "{frame}");
            }
        }
    }
    // Her faces at the raised fidelity are what a run at it gives them.
    let (whole, _, _, _) = run(
        dir.path(),
        &clip,
        &model,
        "whole",
        &[
            "--fidelity",
            &format!("{raised}"),
            "--color-fix",
            "off",
            "--identity-guard",
            "off",
        ],
    );
    let (w, _, guarded) = rgb_frames(&guarded);
    let (_, _, whole) = rgb_frames(&whole);
    for (g, o) in guarded.iter().zip(&whole) {
        let row = 3 * w;
        for y in 0..512 {
            assert_eq!(g[y * row..][..3 * 448], o[y * row..][..3 * 448], "row {y}");
        }
    }
}

/// A restorer that turns Eileen Collins into Joe Biden: by default the guard backs her track
/// off until she is herself again (and says so, naming the track and its frames); Biden's own
/// track, which the stand-in leaves Biden, is untouched. `warn` reads another person (at most
/// 0.5) and changes nothing of `off`'s output.
#[test]
fn another_persons_face_is_backed_off_on_that_track_only() {
    let dir = tempfile::tempdir().unwrap();
    let (face, square) = biden();
    let model = person_standin(dir.path(), &face);
    let clip = collins_and_biden(dir.path(), &square);

    // The guard alone: the colour fix keeps the original's broad light and dark (her dark hair
    // and face), which makes much of her again by itself (measured apart below).
    let (guarded, faces, stats, err) = run(dir.path(), &clip, &model, "guarded", &["--color-fix", "off"]);
    let tracks = stats["identity"].as_array().unwrap();
    assert_eq!(tracks.len(), 2, "{stats}");
    // Collins is the left face, Biden the right.
    let (her, his) = her_and_his(&dir.path().join("guarded.faces.json"));
    let of = |t: u64| tracks.iter().find(|r| r["track"] == t).unwrap();
    assert!(of(her)["guard"].is_string(), "{stats}");
    assert!(of(her)["identity_restorer"].as_f64().unwrap() <= 0.5, "{stats}");
    assert!(of(her)["share"].as_f64().unwrap() < 1.0, "{stats}");
    assert_eq!(of(her)["same"], true, "{stats}");
    assert!(of(his)["guard"].is_null(), "{stats}");
    assert_eq!(of(his)["share"].as_f64(), Some(1.0), "{stats}");
    assert!(of(his)["identity"].as_f64().unwrap() > 0.6, "{stats}");
    assert!(
        err.contains(&format!(
            "track {her} (frames 0-9): the restored faces are no longer the same person"
        )),
        "{err}"
    );
    assert!(!err.contains(&format!("track {his} (frames")), "{err}");
    for (frame, track, identity, blend, _) in &faces {
        let (identity, blend) = (identity.unwrap(), blend.unwrap());
        if *track == her {
            assert!(identity > 0.5 && blend < 1.0, "frame {frame}: {identity} at {blend}");
        } else {
            assert_eq!(blend, 1.0, "frame {frame}");
        }
    }

    let (warned, faces, stats, err) = run(
        dir.path(),
        &clip,
        &model,
        "warned",
        &["--identity-guard", "warn", "--color-fix", "off"],
    );
    assert!(err.contains("left as restored (--identity-guard warn)"), "{err}");
    for (frame, track, identity, blend, _) in &faces {
        assert!(blend.is_none());
        if *track == her {
            assert!(identity.unwrap() <= 0.5, "frame {frame}: {identity:?}");
        }
    }
    assert_eq!(stats["identity"].as_array().unwrap().len(), 2);
    let (off, faces, stats, _) = run(dir.path(), &clip, &model, "off", &AS_GIVEN);
    assert!(faces.iter().all(|f| f.2.is_none() && f.3.is_none()));
    assert!(stats.get("identity").is_none(), "{stats}");
    let frames = |p: &Path| rgb_frames(p).2;
    assert_eq!(frames(&warned), frames(&off), "warn changed the output");
    assert_ne!(frames(&guarded), frames(&off), "the guard changed nothing");
}

/// The face region's inner half of each frame: the mean of R, G and B, and the mean squared
/// Laplacian of its luma (how much fine detail it holds).
fn face_colour_and_detail(frames: &[Vec<u8>], w: usize, boxes: &[[f64; 4]]) -> ([f64; 3], f64) {
    let (mut sum, mut n, mut lap, mut m) = ([0f64; 3], 0f64, 0f64, 0f64);
    for (f, b) in frames.iter().zip(boxes) {
        let (bw, bh) = (b[2] - b[0], b[3] - b[1]);
        let (x0, x1) = ((b[0] + bw / 4.0) as usize, (b[2] - bw / 4.0) as usize);
        let (y0, y1) = ((b[1] + bh / 4.0) as usize, (b[3] - bh / 4.0) as usize);
        let luma = |x: usize, y: usize| {
            let p = &f[(y * w + x) * 3..][..3];
            0.299 * f64::from(p[0]) + 0.587 * f64::from(p[1]) + 0.114 * f64::from(p[2])
        };
        for y in y0..y1 {
            for x in x0..x1 {
                for c in 0..3 {
                    sum[c] += f64::from(f[(y * w + x) * 3 + c]);
                }
                n += 1.0;
                let l = 4.0 * luma(x, y) - luma(x - 1, y) - luma(x + 1, y) - luma(x, y - 1) - luma(x, y + 1);
                lap += l * l;
                m += 1.0;
            }
        }
    }
    (sum.map(|s| s / n), lap / m)
}

/// A restorer that casts 20 levels of red and sharpens: with the colour fix (the default) the
/// face keeps the input's colour within 2 levels and the sharpening stays; `--color-fix off`
/// lets the cast through.
#[test]
fn a_cast_is_kept_out_and_the_sharpening_kept() {
    let dir = tempfile::tempdir().unwrap();
    let collins = image::open(asset("samples/astronaut.png")).unwrap().to_rgb8();
    let clip = still_clip(dir.path(), &collins, "collins");
    let model = asset("models/standin/cast-sharpen-256.onnx");
    let (fixed, _, _, _) = run(dir.path(), &clip, &model, "fixed", &[]);
    let (cast, _, _, _) = run(dir.path(), &clip, &model, "cast", &["--color-fix", "off"]);
    let boxes: Vec<[f64; 4]> = faces_json(&dir.path().join("fixed.faces.json"))
        .iter()
        .map(|(_, b)| b[0])
        .collect();
    let (w, _, input) = rgb_frames(&clip);
    let (before, detail_before) = face_colour_and_detail(&input, w, &boxes);
    let (after, detail_after) = face_colour_and_detail(&rgb_frames(&fixed).2, w, &boxes);
    let (passed, _) = face_colour_and_detail(&rgb_frames(&cast).2, w, &boxes);
    for c in 0..3 {
        assert!(
            (after[c] - before[c]).abs() <= 2.0,
            "channel {c}: {:.2} -> {:.2} with the colour fix",
            before[c],
            after[c]
        );
    }
    assert!(
        passed[0] - before[0] >= 12.0,
        "red {:.2} -> {:.2} without it",
        before[0],
        passed[0]
    );
    assert!(
        detail_after > 1.5 * detail_before,
        "the sharpening was lost: {detail_before:.1} -> {detail_after:.1}"
    );
    // A face small in the frame (about 30 pixels wide, a fifth of the crop's face), whose
    // change the paste samples from a level of it: the fix is taken off there.
    let small = image::imageops::resize(&collins, 160, 160, image::imageops::FilterType::Triangle);
    let mut frame = image::RgbImage::new(320, 240);
    image::imageops::replace(&mut frame, &small, 80, 40);
    let clip = still_clip(dir.path(), &frame, "small");
    let (fixed, _, _, _) = run(dir.path(), &clip, &model, "small-fixed", &[]);
    let (cast, _, _, _) = run(dir.path(), &clip, &model, "small-cast", &["--color-fix", "off"]);
    let boxes: Vec<[f64; 4]> = faces_json(&dir.path().join("small-fixed.faces.json"))
        .iter()
        .map(|(_, b)| b[0])
        .collect();
    assert!(boxes.iter().all(|b| b[2] - b[0] < 40.0), "{boxes:?}");
    let (before, _) = face_colour_and_detail(&rgb_frames(&clip).2, 320, &boxes);
    let (after, _) = face_colour_and_detail(&rgb_frames(&fixed).2, 320, &boxes);
    let (passed, _) = face_colour_and_detail(&rgb_frames(&cast).2, 320, &boxes);
    for c in 0..3 {
        assert!(
            (after[c] - before[c]).abs() <= 2.0,
            "small face, channel {c}: {:.2} -> {:.2}",
            before[c],
            after[c]
        );
    }
    assert!(
        passed[0] - before[0] >= 12.0,
        "small face, red {:.2} -> {:.2} without it",
        before[0],
        passed[0]
    );
    // A still the same way.
    let (png, out) = (dir.path().join("collins.png"), dir.path().join("fixed.png"));
    let json = dir.path().join("still.faces.json");
    ok(&gpen(&[&png, &out, &"--model", &model, &"--faces-json", &json]));
    let b = faces_json(&json)[0].1[0];
    let (_, _, input) = rgb_frames(&png);
    let (before, _) = face_colour_and_detail(&input, 512, &[b]);
    let (after, _) = face_colour_and_detail(&rgb_frames(&out).2, 512, &[b]);
    for c in 0..3 {
        assert!(
            (after[c] - before[c]).abs() <= 2.0,
            "still, channel {c}: {:.2} -> {:.2}",
            before[c],
            after[c]
        );
    }
}

/// A restorer that blurs reads worse after than before on every face measured (BRISQUE: higher);
/// the identity stand-in keeps every face's quality as it was, and its identity at 1. The
/// summary gives each track's medians.
#[test]
fn a_blur_reads_worse_and_an_unchanged_face_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let collins = image::open(asset("samples/astronaut.png")).unwrap().to_rgb8();
    let clip = still_clip(dir.path(), &collins, "collins");
    let (_, faces, stats, _) = run(dir.path(), &clip, &asset("models/standin/blur-256.onnx"), "blur", &[]);
    assert_eq!(faces.len(), 10);
    for (frame, _, _, _, quality) in &faces {
        let (before, after) = quality.unwrap();
        assert!(after > before + 5.0, "frame {frame}: quality {before:.1} -> {after:.1}");
    }
    assert_eq!(stats["quality_metric"], "brisque");
    let q = &stats["identity"][0]["quality"];
    assert!(q["after"].as_f64().unwrap() > q["before"].as_f64().unwrap(), "{stats}");
    let (_, faces, _, err) = run(
        dir.path(),
        &clip,
        &asset("models/standin/identity-256.onnx"),
        "same",
        &[],
    );
    for (frame, _, identity, blend, quality) in &faces {
        let (before, after) = quality.unwrap();
        assert!(
            (after - before).abs() < 0.01,
            "frame {frame}: quality {before:.2} -> {after:.2}"
        );
        assert!(identity.unwrap() > 0.995 && *blend == Some(1.0), "frame {frame}");
    }
    assert!(err.contains("quality"), "{err}");
}

/// Collins blurred (sigma 6) for 1.2 s, sharpening by 1.6 s and sharp to 6.4 s (160 frames at
/// 25 frames/s, every frame a keyframe, 320x320): one track that the guard leaves as it was
/// under the `person` stand-in while she is blurred (Biden's detail would be all her face had)
/// and gives half the change once she is sharp, from the second stretch (frame 128) on.
fn blurred_then_sharp(dir: &Path) -> PathBuf {
    let clip = dir.join("sharpening.mkv");
    let portrait = asset("samples/astronaut.png");
    ffmpeg(&[
        "-v",
        "error",
        "-y",
        "-loop",
        "1",
        "-framerate",
        "25",
        "-t",
        "1.6",
        "-i",
        arg(&portrait),
        "-loop",
        "1",
        "-framerate",
        "25",
        "-t",
        "5.2",
        "-i",
        arg(&portrait),
        "-filter_complex",
        "[0]scale=320:320,setsar=1,gblur=sigma=6[a];[1]scale=320:320,setsar=1[b];[a][b]xfade=transition=fade:duration=0.4:offset=1.2,format=yuv444p",
        "-frames:v",
        "160",
        "-c:v",
        "ffv1",
        arg(&clip),
    ]);
    clip
}

/// A long video restored in segments gets what one run gives it with the guard backing off a
/// track: the guard decides a track afresh on each stretch of frames (its first face there,
/// then better views), and a segment warms up from the start of its first frame's stretch, so a
/// track begun long before a segment is decided there as one run decides it. Here the track is
/// left as it was while blurred and given half the change once sharp; the second segment starts
/// at frame 100, inside the first stretch. (The warm-up from the stretch's start is held by
/// `segment::plan`'s unit test: this clip joins equal without it too.)
#[test]
fn a_guarded_track_begun_before_a_segment_is_decided_there_as_one_run_decides_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = person_standin(dir.path(), &biden().0);
    let clip = blurred_then_sharp(dir.path());
    let restore = |name: &str, segment: &str, faces: bool| -> (PathBuf, serde_json::Value, String) {
        let (out, json, stats) = (
            dir.path().join(format!("{name}.mkv")),
            dir.path().join(format!("{name}.faces.json")),
            dir.path().join(format!("{name}.stats.json")),
        );
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
            &clip,
            &out,
            &"--model",
            &model,
            &"--codec",
            &"ffv1",
            &"--segment",
            &segment,
            &"--stats-json",
            &stats,
        ];
        if faces {
            args.extend([&"--faces-json" as &dyn AsRef<std::ffi::OsStr>, &json]);
        }
        let err = ok(&gpen(&args));
        let stats = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        (out, stats, err)
    };
    for faces in [true, false] {
        let (one, stats, err) = restore("one", "0", faces);
        assert_eq!(stats["frames"], 160, "{stats}");
        assert!(
            err.contains("track 0 (frames 0-159)") && err.contains("given 0.00 to 0.50 of the model's change"),
            "{err}"
        );
        let (joined, stats, _) = restore("joined", "4", faces);
        assert_eq!(stats["segments"], 2, "{stats}");
        let (a, b) = (rgb_frames(&one).2, rgb_frames(&joined).2);
        let differ: Vec<usize> = (0..160).filter(|&i| a[i] != b[i]).collect();
        assert!(
            differ.is_empty(),
            "faces recorded {faces}: frames {differ:?} differ from one run's"
        );
        if faces {
            let record = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
            assert_eq!(record("one.faces.json"), record("joined.faces.json"));
            let figures = face_figures(&dir.path().join("one.faces.json"));
            let blend = |range: std::ops::Range<u64>| -> Vec<f64> {
                figures
                    .iter()
                    .filter(|f| range.contains(&f.0))
                    .map(|f| f.3.unwrap())
                    .collect()
            };
            assert!(
                blend(0..25).iter().all(|&b| b == 0.0),
                "blurred, left: {:?}",
                blend(0..25)
            );
            assert!(
                blend(128..160).iter().all(|&b| b == 0.5),
                "sharp, decided afresh: {:?}",
                blend(128..160)
            );
        }
    }
}
