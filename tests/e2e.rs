//! End-to-end tests: in, the generated sample clips and stand-in models (scripts/setup.sh makes
//! them); out, assertions on the real binary's output files, read back with FFmpeg's own tools.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A set-up file; a missing one fails the test with the fix.
fn asset(rel: &str) -> PathBuf {
    let p = root().join(rel);
    assert!(p.exists(), "{} is missing: run scripts/setup.sh first", p.display());
    p
}

fn gpen(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpen-video"));
    c.args(args.iter().map(|a| a.as_ref()))
        .arg("--quiet")
        .env("RUST_LOG", "warn");
    c.env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"));
    c.output().expect("run gpen-video")
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "gpen-video failed: {err}");
    err
}

fn tool(prog: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Video frame timestamps (pts, in the stream's time base) as FFmpeg decodes them.
fn video_pts(f: &Path) -> Vec<i64> {
    let out = tool(
        "ffprobe",
        &[
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "frame=pts",
            "-of",
            "default=nw=1:nk=1",
            f.to_str().unwrap(),
        ],
    );
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.trim().trim_end_matches(',').parse().ok())
        .collect()
}

fn time_base(f: &Path) -> String {
    let out = tool(
        "ffprobe",
        &[
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=time_base",
            "-of",
            "default=nw=1:nk=1",
            f.to_str().unwrap(),
        ],
    );
    String::from_utf8_lossy(&out).trim().to_string()
}

/// Per-packet hashes and timing of the streams selected by `map` (e.g. "0:a"), without header.
fn packet_md5(f: &Path, map: &str) -> Vec<String> {
    let out = tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            f.to_str().unwrap(),
            "-map",
            map,
            "-c",
            "copy",
            "-f",
            "framemd5",
            "-",
        ],
    );
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// All frames as packed RGB24, with the picture size.
fn rgb_frames(f: &Path) -> (usize, usize, Vec<Vec<u8>>) {
    let dims = tool(
        "ffprobe",
        &[
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=width,height",
            "-of",
            "csv=p=0",
            f.to_str().unwrap(),
        ],
    );
    let dims = String::from_utf8_lossy(&dims);
    let mut it = dims.trim().split(',').map(|v| v.parse::<usize>().unwrap());
    let (w, h) = (it.next().unwrap(), it.next().unwrap());
    let raw = tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            f.to_str().unwrap(),
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
    );
    (w, h, raw.chunks_exact(w * h * 3).map(<[u8]>::to_vec).collect())
}

/// Face regions per frame from `--faces-json`: (x0, y0, x1, y1) lists, and box lists.
type Rect = [f64; 4];
fn faces_json(f: &Path) -> Vec<(Vec<Rect>, Vec<Rect>)> {
    let text = std::fs::read_to_string(f).unwrap();
    let nums = |s: &str| -> Vec<Rect> {
        s.split('[')
            .filter_map(|chunk| {
                let v: Vec<f64> = chunk
                    .split(']')
                    .next()?
                    .split(',')
                    .filter_map(|x| x.trim().parse().ok())
                    .collect();
                (v.len() == 4).then(|| [v[0], v[1], v[2], v[3]])
            })
            .collect()
    };
    text.lines()
        .filter(|l| l.starts_with("{\"frame\""))
        .map(|l| {
            let regions = l
                .split("\"regions\":[")
                .nth(1)
                .unwrap()
                .split("],\"faces\"")
                .next()
                .unwrap();
            let faces = l.split("\"faces\":").nth(1).unwrap();
            (nums(regions), nums(faces))
        })
        .collect()
}

fn inside(r: &[Rect], x: usize, y: usize, margin: f64) -> bool {
    r.iter().any(|b| {
        (x as f64) >= b[0] - margin
            && (x as f64) < b[2] + margin
            && (y as f64) >= b[1] - margin
            && (y as f64) < b[3] + margin
    })
}

/// PSNR between two frames over the pixels `keep` selects, and how many pixels that was.
fn psnr(a: &[u8], b: &[u8], w: usize, keep: impl Fn(usize, usize) -> bool) -> (f64, usize) {
    let (mut se, mut n) = (0.0f64, 0usize);
    for (i, (pa, pb)) in a.chunks_exact(3).zip(b.chunks_exact(3)).enumerate() {
        if keep(i % w, i / w) {
            for c in 0..3 {
                se += (pa[c] as f64 - pb[c] as f64).powi(2);
            }
            n += 3;
        }
    }
    let mse = se / n.max(1) as f64;
    (
        if mse == 0.0 {
            99.0
        } else {
            10.0 * (255.0f64.powi(2) / mse).log10()
        },
        n / 3,
    )
}

fn plain_reencode(input: &Path, out: &Path) {
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-y",
            "-i",
            input.to_str().unwrap(),
            "-map",
            "0:v:0",
            "-c:v",
            "libx264",
            "-crf",
            "18",
            "-preset",
            "medium",
            "-pix_fmt",
            "yuv420p",
            out.to_str().unwrap(),
        ],
    );
}

fn batches(stderr: &str) -> u64 {
    let line = stderr.lines().find(|l| l.contains(" batches, ")).expect("summary line");
    line.split(" batches")
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn keeps_frames_timestamps_audio_and_subtitles() {
    let dir = tempfile::tempdir().unwrap();
    for (clip, ext, streams) in [
        ("astronaut.mp4", "mp4", &["0:a"][..]),
        ("vfr.mkv", "mkv", &["0:a"]),
        ("group.mkv", "mkv", &["0:a", "0:s"]),
    ] {
        let input = asset(&format!("samples/test/{clip}"));
        let out = dir.path().join(format!("out-{clip}.{ext}"));
        ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &asset("models/standin/identity-256.onnx"),
        ]));
        let (pin, pout) = (video_pts(&input), video_pts(&out));
        assert!(!pin.is_empty());
        assert_eq!(pin.len(), pout.len(), "{clip}: frame count");
        assert_eq!(time_base(&input), time_base(&out), "{clip}: time base");
        assert_eq!(pin, pout, "{clip}: timestamps");
        for map in streams {
            let (a, b) = (packet_md5(&input, map), packet_md5(&out, map));
            assert!(!a.is_empty(), "{clip} has {map} packets");
            assert_eq!(a, b, "{clip}: {map} packets identical");
        }
    }
}

#[test]
fn finds_the_astronaut_in_at_least_95_percent_of_frames() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let (out, json) = (dir.path().join("o.mp4"), dir.path().join("faces.json"));
    ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &asset("models/standin/identity-256.onnx"),
        &"--faces-json",
        &json,
    ]));
    let frames = faces_json(&json);
    assert_eq!(frames.len(), video_pts(&input).len());
    let found = frames.iter().filter(|(r, _)| !r.is_empty()).count();
    assert!(
        found * 100 >= frames.len() * 95,
        "faces in {found} of {} frames",
        frames.len()
    );
}

#[test]
fn identity_leaves_everything_outside_faces_as_a_plain_reencode_would() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let (out, json, plain) = (
        dir.path().join("id.mp4"),
        dir.path().join("f.json"),
        dir.path().join("plain.mp4"),
    );
    ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &asset("models/standin/identity-512.onnx"),
        &"--faces-json",
        &json,
    ]));
    plain_reencode(&input, &plain);
    let faces = faces_json(&json);
    let (w, _, got) = rgb_frames(&out);
    let (_, _, want) = rgb_frames(&plain);
    assert_eq!(got.len(), want.len());
    let mut all = Vec::new();
    for (i, (g, p)) in got.iter().zip(&want).enumerate() {
        let regions = &faces[i].0;
        let (outside, n) = psnr(g, p, w, |x, y| !inside(regions, x, y, 2.0));
        assert!(n > 0 && outside > 36.0, "frame {i}: PSNR outside faces {outside:.1} dB");
        all.push(outside);
        let (face, _) = psnr(g, p, w, |x, y| inside(regions, x, y, 0.0));
        assert!(
            face > 28.0,
            "frame {i}: identity model changed the face (PSNR {face:.1} dB)"
        );
    }
    let mean = mean_psnr(&all);
    assert!(mean > 40.0, "PSNR outside faces over the clip {mean:.1} dB");
}

#[test]
fn a_visible_change_lands_on_faces_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let (out, json, plain) = (
        dir.path().join("neg.mp4"),
        dir.path().join("f.json"),
        dir.path().join("plain.mp4"),
    );
    ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &asset("models/standin/negate-512.onnx"),
        &"--faces-json",
        &json,
    ]));
    plain_reencode(&input, &plain);
    let faces = faces_json(&json);
    let (w, _, got) = rgb_frames(&out);
    let (_, _, want) = rgb_frames(&plain);
    let mut all = Vec::new();
    for (i, (g, p)) in got.iter().zip(&want).enumerate() {
        let (regions, boxes) = &faces[i];
        let (outside, _) = psnr(g, p, w, |x, y| !inside(regions, x, y, 2.0));
        assert!(outside > 36.0, "frame {i}: PSNR outside faces {outside:.1} dB");
        all.push(outside);
        if boxes.is_empty() {
            continue;
        }
        // The middle of each detected face box must be visibly different (colours inverted).
        let core: Vec<Rect> = boxes
            .iter()
            .map(|b| {
                let (cx, cy, hw, hh) = (
                    (b[0] + b[2]) / 2.0,
                    (b[1] + b[3]) / 2.0,
                    (b[2] - b[0]) / 4.0,
                    (b[3] - b[1]) / 4.0,
                );
                [cx - hw, cy - hh, cx + hw, cy + hh]
            })
            .collect();
        let (face, n) = psnr(g, p, w, |x, y| inside(&core, x, y, 0.0));
        assert!(
            n > 0 && face < 15.0,
            "frame {i}: face not changed (PSNR {face:.1} dB over {n} px)"
        );
    }
}

#[test]
fn multi_face_clip_fills_batches_of_four_and_fixed_batch_models_run_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let (out, json) = (dir.path().join("g.mkv"), dir.path().join("g.json"));
    let err = ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &asset("models/standin/identity-256.onnx"),
        &"--faces-json",
        &json,
    ]));
    let frames = faces_json(&json);
    let faces: usize = frames.iter().map(|(_, b)| b.len()).sum();
    assert!(
        frames.iter().all(|(_, b)| b.len() >= 4),
        "every frame has at least 4 faces: {:?}",
        frames.iter().map(|f| f.1.len()).collect::<Vec<_>>()
    );
    assert_eq!(
        batches(&err),
        faces.div_ceil(4) as u64,
        "{faces} faces in full batches of 4"
    );

    let out1 = dir.path().join("g1.mkv");
    let err = ok(&gpen(&[
        &input,
        &out1,
        &"--model",
        &asset("models/standin/identity-512-batch1.onnx"),
    ]));
    assert_eq!(batches(&err), faces as u64, "a batch-1 model runs one crop per call");
    assert_eq!(video_pts(&out1).len(), frames.len());
}

#[test]
fn frames_without_faces_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/noface.mp4");
    let out = dir.path().join("n.mp4");
    let err = ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &asset("models/standin/negate-256.onnx"),
    ]));
    assert!(err.contains(" 0 faces"), "{err}");
    assert_eq!(video_pts(&out), video_pts(&input));
}

/// Runs a failing case: non-zero exit, a message naming the problem, no output and no partial
/// file left behind.
fn fails(input: &Path, out: &Path, extra: &[&dyn AsRef<std::ffi::OsStr>], expect: &str) {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out];
    args.extend_from_slice(extra);
    let r = gpen(&args);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "exit code for `{expect}`: {err}");
    assert!(err.contains(expect), "expected `{expect}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists() || out == input, "no output for `{expect}`");
    if let Some(dir) = out.parent().filter(|d| d.is_dir()) {
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
            .collect();
        assert!(left.is_empty(), "partial file left for `{expect}`");
    }
}

#[test]
fn bad_inputs_fail_clearly_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/identity-256.onnx");
    let out = d.join("out.mp4");
    let m: [&dyn AsRef<std::ffi::OsStr>; 2] = [&"--model", &model];

    fails(&d.join("missing.mp4"), &out, &m, "cannot read input");
    let text = d.join("notes.mp4");
    std::fs::write(&text, "this is not a video\n".repeat(50)).unwrap();
    fails(&text, &out, &m, "is not a readable video");

    let bytes = std::fs::read(&good).unwrap();
    let cut = d.join("cut.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(&cut, &out, &m, "truncated");

    fails(&good, &out, &[&"--model", &d.join("nope.onnx")], "cannot read model");
    let junk = d.join("junk.onnx");
    std::fs::write(&junk, b"not a model").unwrap();
    fails(&good, &out, &[&"--model", &junk], "cannot load model");
    fails(
        &good,
        &out,
        &[&"--model", &asset("models/standin/bad-shape.onnx")],
        "[N,3,S,S]",
    );

    fails(&good, &d.join("no/such/dir/out.mp4"), &m, "does not exist");
    fails(&good, Path::new("/proc/gpen-video-test.mp4"), &m, "not writable");
    fails(&good, &d.join("out.unknownext"), &m, "cannot tell the container");
    fails(
        &good,
        &out,
        &[&"--model", &model, &"--device", &"cuda:0"],
        "CUDA execution provider could not start",
    );

    // OUT equal to IN is refused and the input is untouched.
    let copy = d.join("same.mp4");
    std::fs::copy(&good, &copy).unwrap();
    fails(&copy, &copy, &m, "is the input file");
    assert_eq!(std::fs::read(&copy).unwrap(), bytes);
}

/// PSNR over the whole clip from per-frame PSNRs of equal pixel counts (mean of the MSEs).
fn mean_psnr(frames: &[f64]) -> f64 {
    let mse: f64 = frames
        .iter()
        .map(|p| 255.0f64.powi(2) / 10f64.powf(p / 10.0))
        .sum::<f64>()
        / frames.len() as f64;
    10.0 * (255.0f64.powi(2) / mse).log10()
}

#[test]
fn runs_the_exported_gpen_256_in_batches_of_four() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let (out, json) = (dir.path().join("gpen.mp4"), dir.path().join("f.json"));
    let model = asset("models/gpen-bfr-256-random.onnx");
    let err = ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &model,
        &"--batch",
        &"4",
        &"--faces-json",
        &json,
    ]));
    let frames = faces_json(&json);
    let faces: usize = frames.iter().map(|(_, b)| b.len()).sum();
    assert!(faces > 0);
    // One face per frame: batches fill across frames. A partial batch may leave early only when
    // the enhancer sat idle waiting, so the mean fill stays high.
    let b = batches(&err) as f64;
    let fill = faces as f64 / (4.0 * b);
    assert!(
        b >= faces.div_ceil(4) as f64 && fill >= 0.75,
        "{faces} faces in {b} batches of 4: {err}"
    );
    assert_eq!(video_pts(&out), video_pts(&input));
}
