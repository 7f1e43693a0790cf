//! Hands in front of faces, end to end: in, short clips made from real photos (OpenCV's open
//! palm, samples/hands/handSrc.jpg, cut out of its background and moved across Eileen Collins'
//! face, samples/astronaut.png, over her eyes, nose and mouth) and the project's clip without
//! hands; out, the binary's frames with the negating stand-in: with `--occlusion hands` (the
//! default) the hand's pixels inside the face keep their values and the face around the hand
//! is restored; `--occlusion off` paints the hand over as before; on a clip without hands both
//! give the same frames to the bit, and `off` never opens the hand models.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{asset, cutout, gpen, ok, rgb_frames};
use gpen_video::api::faces::detect::Detector;
use gpen_video::api::people::faces_in_photo;
use gpen_video::api::runtime::{session, SessionOptions};

/// The portrait (packed RGB, its size) and its face's box.
fn portrait() -> (Vec<u8>, (usize, usize), [f32; 4]) {
    let det = session(&asset("models/centerface.onnx"), &SessionOptions::cpu(1), "detector").unwrap();
    let mut det = Detector::new(det, (640, 640), 0.5, 0.3, 0).unwrap();
    let (rgb, w, h, faces) = faces_in_photo(&asset("samples/astronaut.png"), &mut det).unwrap();
    assert_eq!(faces.len(), 1);
    (rgb, (w, h), faces[0].bbox)
}

/// A clip of the portrait, `frames` long, the cut-out's top left corner at `at(k)` on frame k
/// (none where `at` gives `None`); with which frame pixels are the hand on each frame. Encoded
/// near losslessly (x264 at CRF 4, yuv420p) so the comparison sees the pipeline, not the codec.
fn clip(dir: &Path, name: &str, frames: usize, at: impl Fn(usize) -> Option<(i64, i64)>) -> (PathBuf, Vec<Vec<bool>>) {
    gpen_video::init_ffmpeg();
    let (photo, (w, h), _) = portrait();
    let c = cutout(180);
    let out = dir.join(name);
    let mut ff = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s"])
        .arg(format!("{w}x{h}"))
        .args([
            "-r", "30", "-i", "-", "-c:v", "libx264", "-crf", "4", "-g", "30", "-pix_fmt", "yuv420p",
        ])
        .arg(&out)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut masks = Vec::new();
    {
        let stdin = ff.stdin.as_mut().unwrap();
        for k in 0..frames {
            let (mut rgb, mut hand) = (photo.clone(), vec![false; w * h]);
            if let Some(at) = at(k) {
                for y in 0..c.h {
                    for x in 0..c.w {
                        let (fx, fy) = (at.0 + x as i64, at.1 + y as i64);
                        if !c.hand[y * c.w + x] || fx < 0 || fy < 0 || fx >= w as i64 || fy >= h as i64 {
                            continue;
                        }
                        let (i, j) = (fy as usize * w + fx as usize, y * c.w + x);
                        rgb[3 * i..3 * i + 3].copy_from_slice(&c.rgb[3 * j..3 * j + 3]);
                        hand[i] = true;
                    }
                }
            }
            stdin.write_all(&rgb).unwrap();
            masks.push(hand);
        }
    }
    assert!(ff.wait().unwrap().success());
    (out, masks)
}

/// Whether a pixel changed: any channel by more than 16 levels (the negating stand-in moves a
/// level v to 255 - v, the hand's mid-tones too, whose red and blue lie 20 levels or more
/// apart; x264 at CRF 4 in and out errs by a few levels).
fn changed(a: &[u8], b: &[u8], i: usize) -> bool {
    (0..3).any(|c| (i32::from(a[3 * i + c]) - i32::from(b[3 * i + c])).abs() > 16)
}

/// Of the frames' hand pixels inside `face`, the share that changed; of the face's other
/// pixels at least 12 pixels from the hand, the share that changed.
fn shares(
    input: &[Vec<u8>],
    output: &[Vec<u8>],
    masks: &[Vec<bool>],
    (w, h): (usize, usize),
    face: [f32; 4],
) -> (f64, f64) {
    let [x0, y0, x1, y1] = face.map(|v| v.round() as usize);
    let (mut hand, mut hand_changed, mut rest, mut rest_changed) = (0usize, 0usize, 0usize, 0usize);
    for ((a, b), m) in input.iter().zip(output).zip(masks) {
        let near = |x: usize, y: usize| {
            let r = 12usize;
            (y.saturating_sub(r)..(y + r).min(h)).any(|v| (x.saturating_sub(r)..(x + r).min(w)).any(|u| m[v * w + u]))
        };
        for y in y0..y1.min(h) {
            for x in x0..x1.min(w) {
                let i = y * w + x;
                if m[i] {
                    hand += 1;
                    hand_changed += usize::from(changed(a, b, i));
                } else if (x + y) % 3 == 0 && !near(x, y) {
                    rest += 1;
                    rest_changed += usize::from(changed(a, b, i));
                }
            }
        }
    }
    assert!(hand > 1000 && rest > 1000, "{hand} hand pixels, {rest} others");
    (hand_changed as f64 / hand as f64, rest_changed as f64 / rest as f64)
}

/// The frames the summary says hands were kept in front on.
fn hands_kept(err: &str) -> u64 {
    err.split("hands kept in front on ")
        .nth(1)
        .and_then(|t| t.split(')').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The hand moved across the face, left to right, its fingers over the eyes, nose and mouth
/// (a third of the face's width a frame), and kept in front of it: at most 10 % of its pixels
/// inside the face change, while most of the face around it is restored; `--occlusion off`
/// paints most of the hand over, as before. The summary and the faces record say so.
#[test]
fn a_hand_across_the_face_is_kept_and_the_face_around_it_restored() {
    let dir = tempfile::tempdir().unwrap();
    let (_, (w, h), face) = portrait();
    let fw = f64::from(face[2] - face[0]);
    let start = f64::from(face[0]) - 0.6 * fw;
    let (input, masks) = clip(dir.path(), "hand.mp4", 10, |k| {
        Some(((start + k as f64 * fw / 6.0) as i64, (face[1] - 10.0) as i64))
    });
    let negate = asset("models/standin/negate-512.onnx");
    let run = |name: &str, occlusion: &str| {
        let out = dir.path().join(name);
        let faces = dir.path().join(format!("{name}.json"));
        let err = ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &negate,
            &"--occlusion",
            &occlusion,
            &"--crf",
            &"4",
            // The negating stand-in is another person: the guard would give it a quarter.
            &"--identity-guard",
            &"off",
            &"--faces-json",
            &faces,
        ]));
        (rgb_frames(&out).2, err, std::fs::read_to_string(faces).unwrap())
    };
    let src = rgb_frames(&input).2;
    let (kept, err, record) = run("hands.mp4", "hands");
    let (hand, rest) = shares(&src, &kept, &masks, (w, h), face);
    eprintln!(
        "hands: {:.1} % of the hand changed, {:.1} % of the face around it",
        100.0 * hand,
        100.0 * rest
    );
    assert!(
        hand <= 0.10,
        "{:.1} % of the hand's pixels inside the face changed",
        100.0 * hand
    );
    assert!(hands_kept(&err) >= 8, "{err}");
    let held = record.matches("\"hands\":").count();
    assert!(
        held >= 8,
        "the faces record gives a hand share per face: {held}\n{record}"
    );

    let (painted, err, record) = run("off.mp4", "off");
    let (painted_hand, off_rest) = shares(&src, &painted, &masks, (w, h), face);
    eprintln!(
        "off: {:.1} % of the hand changed, {:.1} % of the face around it",
        100.0 * painted_hand,
        100.0 * off_rest
    );
    // Painted over as before: the hand's pixels inside the mesh outline are negated (its
    // mid-tones move little, and part of it inside the face box lies outside the outline).
    assert!(
        painted_hand >= 0.25 && painted_hand >= 10.0 * hand,
        "--occlusion off painted {:.1} % of the hand, hands {:.1} %",
        100.0 * painted_hand,
        100.0 * hand
    );
    // The face around the hand (its box's pixels away from the hand, some of them background
    // outside the face's outline) is restored as without the hands stage.
    assert!(off_rest > 0.3, "{off_rest}");
    assert!(
        rest >= 0.9 * off_rest,
        "the face around the hand: {:.1} % restored, {:.1} % with --occlusion off",
        100.0 * rest,
        100.0 * off_rest
    );
    assert!(!err.contains("hands kept"), "{err}");
    assert!(!record.contains("\"hands\":"), "{record}");
}

/// On a clip without hands the hands stage keeps nothing, so `hands` and `off` give the same
/// frames to the bit; `off` never opens the hand models (files that are no models fail a run
/// that opens them, and leave `off` untouched).
#[test]
fn without_hands_the_output_is_offs_and_off_opens_no_hand_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let clip = asset("samples/test/astronaut.mp4");
    let negate = asset("models/standin/negate-512.onnx");
    let run = |out: &Path, occlusion: &str, cwd: &Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpen-video"));
        c.current_dir(cwd)
            .arg(&clip)
            .arg(out)
            .args([
                "-y",
                "--quiet",
                "--stats",
                "--frames",
                "20",
                "--occlusion",
                occlusion,
                "--model",
            ])
            .arg(&negate)
            .env_remove("GPEN_VIDEO_MODEL")
            .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
            .env("XDG_CONFIG_HOME", common::no_user_dirs())
            .env("XDG_DATA_HOME", common::no_user_dirs())
            .env("RUST_LOG", "warn");
        c.output().unwrap()
    };
    let (a, b) = (d.join("hands.mp4"), d.join("off.mp4"));
    let r = run(&a, "hands", &common::root());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success() && err.contains("hands kept in front on 0)"), "{err}");
    assert!(run(&b, "off", &common::root()).status.success());
    assert_eq!(
        common::framemd5(&a, "0:v", false),
        common::framemd5(&b, "0:v", false),
        "a clip without hands: the same frames with and without the hands stage"
    );
    // Hand models that are no models, found first from the working folder.
    let cwd = d.join("cwd");
    std::fs::create_dir_all(cwd.join("models")).unwrap();
    for m in ["palm-detect.onnx", "hand-landmarks.onnx"] {
        std::fs::write(cwd.join("models").join(m), b"not a model").unwrap();
    }
    let bad = run(&d.join("bad.mp4"), "hands", &cwd);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("palm"), "{err}");
    let off = run(&d.join("off2.mp4"), "off", &cwd);
    assert!(off.status.success(), "{}", String::from_utf8_lossy(&off.stderr));
    assert_eq!(
        common::framemd5(&d.join("off2.mp4"), "0:v", false),
        common::framemd5(&b, "0:v", false)
    );
}

/// A long clip with a hand going back and forth across the face, cut into segments: the hands
/// stage starts its trackers afresh on fixed stretches of frames and each segment warms up from
/// the start of its first frame's stretch, so the joined segments are one run's frames to the
/// bit, faces record and hand shares included.
#[test]
fn segments_keep_the_hands_one_run_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, face) = portrait();
    let fw = f64::from(face[2] - face[0]);
    let (input, _) = clip(dir.path(), "long.mp4", 120, |k| {
        let t = (k % 60) as f64 / 60.0;
        let swing = if t < 0.5 { 2.0 * t } else { 2.0 - 2.0 * t };
        // Away from the face for a few frames of the first segment, so it is found again.
        (!(30..40).contains(&k)).then(|| {
            (
                (f64::from(face[0]) - 0.6 * fw + swing * 1.2 * fw) as i64,
                (face[1] - 10.0) as i64,
            )
        })
    });
    let negate = asset("models/standin/negate-256.onnx");
    let run = |name: &str, segment: &str| {
        let out = dir.path().join(name);
        let faces = out.with_extension("json");
        let stats = out.with_extension("stats");
        ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &negate,
            &"--identity-guard",
            &"off",
            &"--codec",
            &"libx264",
            &"--crf",
            &"0",
            &"--segment",
            &segment,
            &"--faces-json",
            &faces,
            &"--stats-json",
            &stats,
        ]));
        (
            common::framemd5(&out, "0:v", false),
            std::fs::read_to_string(faces).unwrap(),
            std::fs::read_to_string(stats).unwrap(),
        )
    };
    let (one, one_faces, one_stats) = run("one.mp4", "0");
    let (joined, joined_faces, stats) = run("joined.mp4", "1.5");
    assert!(stats.contains("\"segments\":2"), "{stats}");
    // The frames with hands kept, counted alike by one run and by the join of the segments.
    let hands = |json: &str, at: &[&str]| {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        at.iter().fold(&v, |v, k| &v[*k]).as_u64()
    };
    let kept = hands(&one_stats, &["frames_with_hands"]).expect("one run counts the frames with hands");
    assert!(kept > 50, "hands kept on {kept} frames");
    assert_eq!(hands(&stats, &["joined", "frames_with_hands"]), Some(kept), "{stats}");
    assert_eq!(one.len(), 120);
    assert!(
        one_faces.matches("\"hands\":").count() > 50,
        "hands kept on many frames"
    );
    let differ: Vec<usize> = (0..120).filter(|&i| one[i] != joined[i]).collect();
    assert!(differ.is_empty(), "frames {differ:?} differ from one run's");
    assert_eq!(one_faces, joined_faces, "the faces record");
}

/// Without the hand models (a copy of the binary run from a folder without the set-up's
/// models) the default `--occlusion hands` is no error: the run says once that hands are
/// painted over, naming the missing files and the set-up, and restores the faces as `off`.
#[test]
fn without_the_hand_models_the_default_run_says_so_and_runs_as_off() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bin = d.join("bin/gpen-video");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_gpen-video"), &bin).unwrap();
    let r = Command::new(&bin)
        .current_dir(d)
        .arg(asset("samples/test/astronaut.mp4"))
        .arg(d.join("o.mp4"))
        .args(["--frames", "5", "--identity-guard", "off", "--mesh", "none", "--model"])
        .arg(asset("models/standin/negate-256.onnx"))
        .arg("--detector")
        .arg(asset("models/centerface.onnx"))
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .env("XDG_CONFIG_HOME", common::no_user_dirs())
        .env("XDG_DATA_HOME", common::no_user_dirs())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert_eq!(err.matches("no hand models").count(), 1, "{err}");
    assert!(
        err.contains("models/palm-detect.onnx") && err.contains("scripts/setup.sh"),
        "{err}"
    );
    assert!(err.contains("5 faces") && !err.contains("hands kept"), "{err}");
}
