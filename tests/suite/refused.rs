//! What can never run is refused before any work: in, settings no run of them could go with
//! (a `--fidelity` the model has no input for, a reference photo without a face or not a
//! picture) given to `serve`, a job's query, `batch` and a segmented run; out, exit 1 (or a 400)
//! with the real reason said once, and nothing made: no service listening, no job stored, no
//! output folder, no segments folder.

use crate::common;

use std::path::{Path, PathBuf};

use common::server::{serve_exits, Server};
use common::*;

/// A picture without a face (grey), and a "photo" that is text.
fn bad_photos(dir: &Path) -> (PathBuf, PathBuf) {
    let (grey, text) = (dir.join("wall.png"), dir.join("notes.jpg"));
    lavfi_picture("color=c=gray:s=320x240", &grey);
    std::fs::write(&text, "not a picture\n").unwrap();
    (grey, text)
}

/// `serve --fidelity` on a model without a fidelity input, and `serve --face NAME=PHOTO` with a
/// photo without a face or one that is not a picture, exit 1 with the reason before listening.
#[test]
fn a_service_that_could_never_run_exits_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let model = asset("models/standin/identity-256.onnx");
    let (code, log) = serve_exits(&[&"--model", &model, &"--fidelity", &"0.7"]);
    assert!(!log.contains("listening on"), "it listened first: {log}");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("has no fidelity input"), "{log}");
    let (grey, text) = bad_photos(dir.path());
    for (photo, why) in [(&grey, "no face found"), (&text, "not a picture")] {
        let face = format!("wall={}", photo.display());
        let (code, log) = serve_exits(&[&"--model", &model, &"--face", &face]);
        assert!(!log.contains("listening on"), "it listened first: {log}");
        assert_eq!(code, Some(1), "{log}");
        assert!(log.contains(&photo.display().to_string()) && log.contains(why), "{log}");
    }
}

/// A job asking for a fidelity the model has no input for is a 400 at POST naming the
/// parameter and the model by the name the job knows, never the service's path to it; nothing
/// of the upload is kept.
#[test]
fn a_job_whose_flags_cannot_run_is_refused_at_post() {
    let model = asset("models/standin/identity-256.onnx");
    let server = Server::start(&["--model", arg(&model)]);
    let clip = std::fs::read(asset("samples/test/astronaut.mp4")).unwrap();
    let (status, body, _, _) = server.post("/v1/jobs?name=clip.mp4&fidelity=0.4", &clip);
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("fidelity=0.4") && body.contains("identity-256.onnx") && body.contains("no fidelity input"),
        "{body}"
    );
    assert!(!body.contains(&asset("models").display().to_string()), "{body}");
    let (status, list) = server.get("/v1/jobs");
    assert_eq!(status, 200);
    assert!(!list.contains("clip.mp4"), "{list}");
    // The same service takes the job without it.
    let (status, _, _, _) = server.post("/v1/jobs?name=clip.mp4", &clip);
    assert_eq!(status, 202);
}

/// `batch --only-face` with a photo without a face says so once, before any file, exits 1 and
/// leaves the output folder unmade; `--fidelity` on a model without one the same.
#[test]
fn a_batch_that_could_never_run_says_why_once_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (grey, _) = bad_photos(dir.path());
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for n in ["a", "b"] {
        std::fs::copy(asset("samples/astronaut.png"), input.join(format!("{n}.png"))).unwrap();
    }
    std::fs::copy(asset("samples/test/astronaut.mp4"), input.join("c.mp4")).unwrap();
    let out = dir.path().join("out");
    let model = asset("models/standin/identity-256.onnx");
    for (flags, why) in [
        (vec!["--only-face", arg(&grey)], "no face found"),
        (vec!["--fidelity", "0.5"], "has no fidelity input"),
    ] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"batch", &input, &out, &"--model", &model];
        args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
        let r = gpen(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{err}");
        assert_eq!(err.matches(why).count(), 1, "said once: {err}");
        assert!(
            !err.contains("stopped unexpectedly") && !err.contains("panicked"),
            "{err}"
        );
        assert!(!out.exists(), "the output folder was made: {err}");
    }
}

/// A segmented run refused before any frame says the real reason, not that finished segments
/// are kept, and leaves no segments folder.
#[test]
fn a_segmented_run_that_could_never_run_leaves_no_segments_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (grey, _) = bad_photos(dir.path());
    let clip = moving_portrait(dir.path(), 4);
    let out = dir.path().join("out.mp4");
    let model = asset("models/standin/identity-256.onnx");
    for (flags, why) in [
        (vec!["--only-face", arg(&grey)], "no face found"),
        (vec!["--fidelity", "0.5"], "has no fidelity input"),
    ] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&clip, &out, &"--model", &model, &"--segment", &"1"];
        args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
        let r = gpen(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{err}");
        assert!(err.contains(why) && !err.contains("segments are kept"), "{err}");
        assert!(!out.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("segments"))
            .collect();
        assert!(left.is_empty(), "a segments folder was left: {left:?}: {err}");
    }
}
