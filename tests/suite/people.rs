//! Whose faces: `--only-face`, `--skip-face` and `--min-face` on real photos of two real people
//! side by side (Barack Obama and Joe Biden, White House photographs from face_recognition's test
//! images, public domain, unpacked by scripts/test.sh into samples/people/), named by other
//! photos of them, in a video and a still, through a stand-in that changes every face it is given.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

fn people(p: &str) -> PathBuf {
    let path = asset(&format!("samples/people/{p}"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/test.sh first",
        path.display()
    );
    path
}

/// Obama on the left, Biden on the right, each fitted into 360x480: a one-second clip, or one still.
fn pair(dir: &Path, still: bool) -> PathBuf {
    pair_of(dir, still, 1)
}

/// [`pair`] as a clip of `seconds` (keyframes each second).
fn pair_of(dir: &Path, still: bool, seconds: u32) -> PathBuf {
    let out = dir.join(if still {
        "pair.png".to_string()
    } else {
        format!("pair-{seconds}.mp4")
    });
    let t = seconds.to_string();
    let (a, b) = (people("obama.jpg"), people("biden.jpg"));
    let fit = "scale=360:480:force_original_aspect_ratio=decrease,pad=360:480:(ow-iw)/2:(oh-ih)/2";
    let filter = format!("[0]{fit}[a];[1]{fit}[b];[a][b]hstack,format=yuv420p");
    let mut args = vec![
        "-loop",
        "1",
        "-i",
        arg(&a),
        "-loop",
        "1",
        "-i",
        arg(&b),
        "-filter_complex",
        &filter,
    ];
    if still {
        args.extend(["-frames:v", "1"]);
    } else {
        args.extend(["-t", &t, "-r", "10", "-g", "10", "-c:v", "libx264", "-crf", "16"]);
    }
    args.push(arg(&out));
    ffmpeg(&args);
    out
}

/// Mean absolute change (levels) inside each box from `input` to `output`, across frames.
fn boxes_changed(input: &Path, output: &Path, boxes: &[[f64; 4]]) -> Vec<f64> {
    let ((w, _, a), (_, _, b)) = (rgb_frames(input), rgb_frames(output));
    boxes
        .iter()
        .map(|bx| {
            let (mut sum, mut n) = (0.0, 0.0);
            for (fa, fb) in a.iter().zip(&b) {
                for y in bx[1] as usize..bx[3] as usize {
                    for x in bx[0] as usize..bx[2] as usize {
                        let i = (y * w + x) * 3;
                        sum += (0..3)
                            .map(|c| (f64::from(fa[i + c]) - f64::from(fb[i + c])).abs())
                            .sum::<f64>();
                        n += 3.0;
                    }
                }
            }
            sum / n
        })
        .collect()
}

/// Runs the negating stand-in on `input` with `extra`; the change of each half and the
/// `left` reasons of the first frame's faces, left to right.
fn run(dir: &Path, input: &Path, extra: &[&str]) -> (Vec<f64>, Vec<String>) {
    let ext = input.extension().unwrap().to_str().unwrap();
    let out = dir.join(format!("out-{}.{ext}", extra.join("-").replace(['/', '.'], "_")));
    let json = dir.join("faces.json");
    let model = asset("models/standin/negate-512.onnx");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &model, &"--faces-json", &json];
    args.extend(AS_GIVEN.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
    let extra: Vec<String> = extra
        .iter()
        .map(|a| {
            if a.ends_with(".jpg") {
                arg(&people(a)).to_string()
            } else {
                a.to_string()
            }
        })
        .collect();
    for a in &extra {
        args.push(a);
    }
    ok(&gpen(&args));
    let faces = first_faces(&json);
    assert_eq!(faces.len(), 2, "two faces in {faces:?}");
    let boxes: Vec<[f64; 4]> = faces.iter().map(|f| f.0).collect();
    (
        boxes_changed(input, &out, &boxes),
        faces.into_iter().map(|f| f.1).collect(),
    )
}

fn check(input: &Path, dir: &Path) {
    // Everyone: both faces change.
    let (c, left) = run(dir, input, &[]);
    let (l, r) = (c[0], c[1]);
    assert!(l > 8.0 && r > 8.0, "both restored: {l} {r}");
    assert_eq!(left, ["", ""]);
    // Only Obama, named by another photo of him.
    let (c, left) = run(dir, input, &["--only-face", "obama2.jpg"]);
    let (l, r) = (c[0], c[1]);
    assert!(l > 8.0 && r < 2.5, "only the left face: {l} {r}");
    assert_eq!(left, ["", "not named"]);
    // Never Obama: Biden alone changes.
    let (c, left) = run(dir, input, &["--skip-face", "obama3.jpg"]);
    let (l, r) = (c[0], c[1]);
    assert!(l < 2.5 && r > 8.0, "only the right face: {l} {r}");
    assert_eq!(left, ["skipped", ""]);
    // Faces under 1,000 pixels tall (both) are left alone.
    let (c, left) = run(dir, input, &["--min-face", "1000"]);
    let (l, r) = (c[0], c[1]);
    assert!(l < 2.5 && r < 2.5, "neither: {l} {r}");
    assert_eq!(left, ["small", "small"]);
}

#[test]
fn only_skip_and_min_face_choose_the_faces_of_a_video() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair(dir.path(), false);
    check(&input, dir.path());
}

#[test]
fn only_skip_and_min_face_choose_the_faces_of_a_still() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair(dir.path(), true);
    check(&input, dir.path());
}

#[test]
fn a_reference_photo_without_a_face_fails_before_any_frame() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair(dir.path(), false);
    let wall = dir.path().join("wall.png");
    lavfi_picture("color=c=gray:s=320x240", &wall);
    let out = dir.path().join("out.mp4");
    fails(&input, &out, &[&"--only-face", &wall], "wall.png: no face found");
    let missing = dir.path().join("nobody.jpg");
    fails(&input, &out, &[&"--skip-face", &missing], "nobody.jpg");
    // A photo of two people names the larger: the run says so.
    let two = pair(dir.path(), true);
    let model = asset("models/standin/identity-512.onnx");
    let words = ok(&gpen(&[&input, &out, &"--model", &model, &"--only-face", &two]));
    assert!(words.contains("pair.png: 2 faces in it, the largest taken"), "{words}");
}

/// Faces found and left alone are counted apart from faces restored: `--skip-face` of both
/// people restores none, says every face found was left alone and why, never that no face was
/// found; `--stats-json` gives the faces found, restored and left by why. `--only-face` of one
/// counts the other as not named.
#[test]
fn faces_left_alone_are_counted_apart_from_faces_restored() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair(dir.path(), false);
    let model = asset("models/standin/identity-512.onnx");
    let (one, two) = (people("obama2.jpg"), people("biden.jpg"));
    let out = dir.path().join("out.mp4");
    let stats = dir.path().join("stats.json");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &model, &"--stats-json", &stats];
    let skip_both: [&dyn AsRef<std::ffi::OsStr>; 4] = [&"--skip-face", &two, &"--skip-face", &one];
    args.extend(skip_both);
    let r = gpen(&args);
    let err = ok(&r);
    assert!(!err.contains("no face was found"), "{err}");
    assert!(
        err.contains("0 faces restored") && err.contains("left alone") && err.contains("named by --skip-face"),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(s["faces"], 0, "{s}");
    let found = s["faces_found"].as_u64().unwrap();
    assert!(found >= 2 && s["faces_left"]["skipped"].as_u64() == Some(found), "{s}");
    let r = gpen(&[
        &input,
        &out,
        &"--model",
        &model,
        &"--stats-json",
        &stats,
        &"--only-face",
        &one,
    ]);
    ok(&r);
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let (restored, not_named) = (
        s["faces"].as_u64().unwrap(),
        s["faces_left"]["not_named"].as_u64().unwrap(),
    );
    assert!(restored > 0 && not_named > 0, "{s}");
    assert_eq!(s["faces_found"].as_u64(), Some(restored + not_named), "{s}");
}

/// The identity figure on its calibrated scale: each recorded face's, 1 through a stand-in that
/// gives its input back and far lower through one that negates it (the guard only warning);
/// each track's median in the summary and the stats file.
#[test]
fn identity_is_kept_by_an_unchanged_face_and_lost_by_a_changed_one() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair(dir.path(), false);
    let figures = |model: &str, guard: &str, fix: &str| -> (Vec<f64>, String, String) {
        let (out, json, stats) = (
            dir.path().join(format!("{model}.mp4")),
            dir.path().join(format!("{model}.json")),
            dir.path().join(format!("{model}-stats.json")),
        );
        let m = asset(&format!("models/standin/{model}.onnx"));
        let r = gpen(&[
            &input,
            &out,
            &"--model",
            &m,
            &"--faces-json",
            &json,
            &"--stats-json",
            &stats,
            &"--identity-guard",
            &guard,
            &"--color-fix",
            &fix,
        ]);
        let stderr = ok(&r);
        let text = std::fs::read_to_string(&json).unwrap();
        let each: Vec<f64> = text
            .split("\"identity\":")
            .skip(1)
            .map(|t| t.split(['}', ',']).next().unwrap().parse().unwrap())
            .collect();
        (each, stderr, std::fs::read_to_string(&stats).unwrap())
    };
    let (same, words, stats) = figures("identity-512", "back-off", "wavelet");
    assert_eq!(same.len(), 20, "every face of the 10 frames measured");
    assert!(same.iter().all(|&v| v > 0.995), "{same:?}");
    assert!(
        words.contains("identity (1 is unchanged") && words.contains("track 0 1.00"),
        "{words}"
    );
    assert!(stats.contains("\"identity\":[{\"track\":0,\"identity\":"), "{stats}");
    // The negation as it is (the colour fix keeps its low band out). A negated face is far from
    // itself, but dlib still finds one of the two people in theirs (0.52; the other 0.37).
    let (changed, words, _) = figures("negate-512", "warn", "off");
    assert!(changed.iter().all(|&v| v < 0.6), "{changed:?}");
    assert!(changed.iter().any(|&v| v < 0.45), "{changed:?}");
    assert!(
        words.contains("(another person)") && words.contains("worst 0."),
        "{words}"
    );
    // --identity alone measures a few faces of each track for the summary; a plain run without
    // the guard, none.
    let out = dir.path().join("sampled.mp4");
    let m = asset("models/standin/negate-512.onnx");
    let words = ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &m,
        &"--identity",
        &"--identity-guard",
        &"off",
    ]));
    assert!(
        words.contains("identity (1 is unchanged") && words.contains("track 1 0."),
        "{words}"
    );
    let words = ok(&gpen(&[&input, &out, &"--model", &m, &"--identity-guard", &"off"]));
    assert!(!words.contains("identity"), "{words}");
}

/// The first frame's faces in a `--faces-json` record, left to right: each box and why it was
/// left alone (empty when restored).
fn first_faces(json: &Path) -> Vec<([f64; 4], String)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let mut faces: Vec<([f64; 4], String)> = v[0]["faces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let b: Vec<f64> = f["bbox"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            ([b[0], b[1], b[2], b[3]], f["left"].as_str().unwrap_or("").to_string())
        })
        .collect();
    faces.sort_by(|a, b| a.0[0].total_cmp(&b.0[0]));
    faces
}

/// The face boxes of `input`'s first frame, left to right (from a run with `--faces-json`).
fn boxes(dir: &Path, input: &Path) -> Vec<[f64; 4]> {
    let ext = input.extension().unwrap().to_str().unwrap();
    let (out, json) = (dir.join(format!("boxes.{ext}")), dir.join("boxes.json"));
    let model = asset("models/standin/identity-512.onnx");
    ok(&gpen(&[&input, &out, &"--model", &model, &"--faces-json", &json]));
    first_faces(&json).into_iter().map(|f| f.0).collect()
}

/// A long clip in segments: each segment (with its warm-up) restores Obama alone, and the photo
/// naming him is described once on the engine the segments share, not once a segment.
#[test]
fn a_long_clip_in_segments_restores_only_the_named_person() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair_of(dir.path(), false, 4);
    let b = boxes(dir.path(), &input);
    let out = dir.path().join("segments.mp4");
    let (model, photo) = (asset("models/standin/negate-512.onnx"), people("obama2.jpg"));
    let stats = dir.path().join("stats.json");
    let err = ok(&gpen_env(
        &[
            &input,
            &out,
            &"--model",
            &model,
            &"--only-face",
            &photo,
            &"--segment",
            &"1",
            &"--stats-json",
            &stats,
            &AS_GIVEN[0],
            &AS_GIVEN[1],
            &AS_GIVEN[2],
            &AS_GIVEN[3],
        ],
        &[("RUST_LOG", "warn,gpen_video::people=debug")],
    ));
    let stats = std::fs::read_to_string(&stats).unwrap();
    assert!(stats.contains("\"segments\":"), "cut into segments");
    assert!(json_number(&stats, "segments") >= 2, "{stats}");
    assert_eq!(err.matches("obama2.jpg described").count(), 1, "{err}");
    let c = boxes_changed(&input, &out, &b);
    assert!(c[0] > 8.0 && c[1] < 2.5, "only the left face, in every segment: {c:?}");
}

/// A folder (`batch`) of a clip and a still: both restore Biden alone.
#[test]
fn a_folder_restores_only_the_people_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in");
    std::fs::create_dir(&src).unwrap();
    let (clip, still) = (pair(&src, false), pair(&src, true));
    let (bc, bs) = (boxes(dir.path(), &clip), boxes(dir.path(), &still));
    let out = dir.path().join("out");
    let (model, photo) = (asset("models/standin/negate-512.onnx"), people("obama3.jpg"));
    ok(&gpen(&[
        &"batch",
        &src,
        &out,
        &"--model",
        &model,
        &AS_GIVEN[0],
        &AS_GIVEN[1],
        &AS_GIVEN[2],
        &AS_GIVEN[3],
        &"--skip-face",
        &photo,
    ]));
    for (input, b) in [(&clip, &bc), (&still, &bs)] {
        let c = boxes_changed(input, &out.join(input.file_name().unwrap()), b);
        assert!(
            c[0] < 2.5 && c[1] > 8.0,
            "{}: only the right face: {c:?}",
            input.display()
        );
    }
}

/// The service's jobs name people by the names it holds (`--face NAME=PHOTO`), never by a path:
/// a video job with `only-face=obama` restores Obama alone; an unknown name is refused naming the
/// ones held.
#[test]
fn a_service_job_restores_only_the_person_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let input = pair(dir.path(), false);
    let b = boxes(dir.path(), &input);
    let (model, photo) = (asset("models/standin/negate-512.onnx"), people("obama2.jpg"));
    let face = format!("obama={}", arg(&photo));
    let jobs = dir.path().join("jobs");
    let mut flags = vec!["--model", arg(&model), "--jobs-dir", arg(&jobs), "--face", &face];
    flags.extend(AS_GIVEN);
    let server = common::server::Server::start(&flags);
    let (status, _, info) = server.call("GET", "/v1/info", &[], None, &[]);
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&info).contains("\"faces\":[\"obama\"]"));
    let body = std::fs::read(&input).unwrap();
    let post = |query: &str| server.call("POST", &format!("/v1/jobs?name=pair.mp4{query}"), &[], Some(&body), &[]);
    for bad in ["nobody", "..%2Fobama2.jpg"] {
        let (status, _, words) = post(&format!("&only-face={bad}"));
        let words = String::from_utf8_lossy(&words).to_string();
        assert_eq!(status, 400, "{words}");
        assert!(
            words.contains("no such face") && words.contains("holds obama"),
            "{words}"
        );
    }
    let result = server.run_job("name=pair.mp4&only-face=obama", &body);
    let out = dir.path().join("job.mp4");
    std::fs::write(&out, result).unwrap();
    let c = boxes_changed(&input, &out, &b);
    assert!(c[0] > 8.0 && c[1] < 2.5, "only the left face: {c:?}");
    // The record counts the other face apart: found, not named, left alone.
    let (status, list) = server.get("/v1/jobs");
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let rec = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["state"] == "done")
        .unwrap()
        .clone();
    assert!(rec["faces_done"].as_u64().unwrap() > 0, "{rec}");
    assert!(rec["faithful"]["left"]["not_named"].as_u64().unwrap() > 0, "{rec}");
    assert_eq!(server.stop(), Some(0));
}
