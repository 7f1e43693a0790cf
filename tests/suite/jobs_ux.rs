//! The jobs API as the page uses it: in, the real binary serving on a loopback port, clips and
//! photos posted to `/v1/jobs`; out, a cancelled job kept as cancelled and then removed, each
//! queued job's place in its line, lists that answer each browser's key its own jobs, a photo
//! that finishes while a film runs, and the faces each job found.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::server::Server;
use common::*;

fn start(dir: &Path, extra: &[&str]) -> Server {
    let model = asset("models/standin/identity-256.onnx");
    let jobs = dir.join("jobs");
    let mut flags = vec!["--model", arg(&model), "--jobs-dir", arg(&jobs)];
    flags.extend_from_slice(extra);
    Server::start(&flags)
}

/// Posts `file` as a job with `headers`: its id.
fn post(server: &Server, file: &Path, headers: &[(&str, &str)]) -> String {
    let name = file.file_name().unwrap().to_str().unwrap();
    let (status, _, body) = server.call(
        "POST",
        &format!("/v1/jobs?name={name}"),
        headers,
        Some(&std::fs::read(file).unwrap()),
        &[],
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    json(&body)["id"].as_str().unwrap().to_string()
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

fn record(server: &Server, id: &str) -> serde_json::Value {
    let (status, _, body) = server.call("GET", &format!("/v1/jobs/{id}"), &[], None, &[]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    json(&body)
}

/// Waits until job `id` is in one of `states` (within `secs`): its record.
fn wait_for(server: &Server, id: &str, states: &[&str], secs: u64) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let v = record(server, id);
        if states.iter().any(|s| v["state"] == *s) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "job {id} not {states:?} after {secs} s: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The ids `GET /v1/jobs` answers with `headers`.
fn listed(server: &Server, headers: &[(&str, &str)]) -> Vec<String> {
    let (status, _, body) = server.call("GET", "/v1/jobs", headers, None, &[]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    json(&body)["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            assert!(j.get("owner").is_none(), "a list shows the owner's key: {j}");
            j["id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Before: a job could only be deleted (gone from every list); a page showed it as "no job".
/// Now `POST /v1/jobs/ID/cancel` stops it where it is and keeps it, cancelled, until DELETE; a
/// queued job shows its place in its lane's line.
#[test]
fn cancel_keeps_a_job_cancelled_and_queued_jobs_know_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let film = moving_portrait(dir.path(), 12);
    let server = start(dir.path(), &[]);
    let running = post(&server, &film, &[]);
    wait_for(&server, &running, &["running"], 30);
    let (second, third) = (post(&server, &film, &[]), post(&server, &film, &[]));
    assert_eq!(
        record(&server, &second)["place"],
        1,
        "the next film is not first in line"
    );
    assert_eq!(record(&server, &third)["place"], 2);
    assert!(record(&server, &running).get("place").is_none());
    // A queued job cancelled never runs; the one behind it moves up.
    let (status, _, body) = server.call("POST", &format!("/v1/jobs/{second}/cancel"), &[], None, &[]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["state"], "cancelled");
    assert_eq!(record(&server, &third)["place"], 1);
    // A running job cancelled stops, and stays listed as cancelled (not failed, not gone).
    let (status, _, body) = server.call("POST", &format!("/v1/jobs/{running}/cancel"), &[], None, &[]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    wait_for(&server, &third, &["running"], 30);
    std::thread::sleep(Duration::from_millis(500));
    for id in [&running, &second] {
        let v = record(&server, id);
        assert_eq!(v["state"], "cancelled", "{v}");
        assert!(v["error"].is_null(), "{v}");
    }
    assert!(listed(&server, &[]).contains(&running));
    // Removed: gone, with its files.
    assert_eq!(
        server.call("DELETE", &format!("/v1/jobs/{running}"), &[], None, &[]).0,
        200
    );
    assert_eq!(
        server.call("GET", &format!("/v1/jobs/{running}"), &[], None, &[]).0,
        404
    );
    server.call("POST", &format!("/v1/jobs/{third}/cancel"), &[], None, &[]);
    // A cancelled job is still cancelled after a restart (never run again).
    assert_eq!(server.stop(), Some(0));
    let server = start(dir.path(), &[]);
    assert_eq!(record(&server, &second)["state"], "cancelled");
    assert_eq!(record(&server, &third)["state"], "cancelled");
    assert_eq!(server.stop(), Some(0));
}

/// Before: every visitor of a shared service saw every job. Now a list answers the jobs made
/// with the caller's `X-Gpen-Owner` key (without one, those made without one); with --token, a
/// caller without a key sees them all.
#[test]
fn a_list_answers_each_key_its_own_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let pic = portrait_jpeg(dir.path());
    let server = start(dir.path(), &[]);
    let a = post(&server, &pic, &[("X-Gpen-Owner", "key-a")]);
    let b = post(&server, &pic, &[("X-Gpen-Owner", "key-b")]);
    let none = post(&server, &pic, &[]);
    assert_eq!(listed(&server, &[("X-Gpen-Owner", "key-a")]), vec![a.clone()]);
    assert_eq!(listed(&server, &[("X-Gpen-Owner", "key-b")]), vec![b.clone()]);
    assert_eq!(listed(&server, &[]), vec![none.clone()]);
    assert!(listed(&server, &[("X-Gpen-Owner", "key-c")]).is_empty());
    let (status, _, _) = server.call("GET", "/v1/jobs", &[("X-Gpen-Owner", "../x y")], None, &[]);
    assert_eq!(status, 400, "a key of odd characters is taken");
    assert_eq!(server.stop(), Some(0));
    // The token's holder sees every job.
    let server = start(dir.path(), &["--token", "sesame"]);
    let auth = [("Authorization", "Bearer sesame")];
    let mut all = listed(&server, &auth);
    all.sort();
    let mut want = vec![a, b, none];
    want.sort();
    assert_eq!(all, want);
    assert_eq!(server.stop(), Some(0));
}

/// Before: a photo waited behind a film (0.9 s of work queued 81 s). Now photos have a lane of
/// their own: one finishes while a film runs.
#[test]
fn a_photo_finishes_while_a_film_runs() {
    let dir = tempfile::tempdir().unwrap();
    let film = moving_portrait(dir.path(), 12);
    let pic = portrait_jpeg(dir.path());
    let server = start(dir.path(), &[]);
    let film_id = post(&server, &film, &[]);
    wait_for(&server, &film_id, &["running"], 30);
    let photo_id = post(&server, &pic, &[]);
    let v = wait_for(&server, &photo_id, &["done", "failed"], 30);
    assert_eq!(v["state"], "done", "{v}");
    assert_eq!(
        record(&server, &film_id)["state"],
        "running",
        "the film was done before the photo: the test proves nothing"
    );
    let (status, _, body) = server.call("GET", &format!("/v1/jobs/{photo_id}/input"), &[], None, &[]);
    assert_eq!(status, 200);
    assert_eq!(body, std::fs::read(&pic).unwrap(), "the input served is not the upload");
    server.call("POST", &format!("/v1/jobs/{film_id}/cancel"), &[], None, &[]);
    assert_eq!(server.stop(), Some(0));
}

/// The faces each job found, which the page shows (and warns of none): none in a clip without
/// a face, some in one of a face.
#[test]
fn a_job_counts_the_faces_it_found() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let none = post(&server, &asset("samples/test/noface.mp4"), &[]);
    let face = post(&server, &asset("samples/test/astronaut.mp4"), &[]);
    let v = wait_for(&server, &none, &["done", "failed"], 60);
    assert_eq!(
        (v["state"].as_str(), v["faces_done"].as_u64()),
        (Some("done"), Some(0)),
        "{v}"
    );
    let v = wait_for(&server, &face, &["done", "failed"], 60);
    assert_eq!(v["state"], "done", "{v}");
    assert!(v["faces_done"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(server.stop(), Some(0));
}

/// A job that fails (a clip cut off after its header) says why in the upload's own name: never
/// the folder the service keeps jobs in, nor the files it names inside it.
#[test]
fn a_failed_jobs_error_names_no_server_path() {
    let dir = tempfile::tempdir().unwrap();
    // Its index first (faststart), so it is taken, and its media cut off after 60%.
    let whole = dir.path().join("whole.mp4");
    let moving = moving_portrait(dir.path(), 4);
    ffmpeg(&["-i", arg(&moving), "-c", "copy", "-movflags", "+faststart", arg(&whole)]);
    let bytes = std::fs::read(&whole).unwrap();
    let cut = dir.path().join("holiday.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() * 6 / 10]).unwrap();
    let server = start(dir.path(), &[]);
    let id = post(&server, &cut, &[]);
    let v = wait_for(&server, &id, &["done", "failed"], 60);
    let error = v["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(v["state"], "failed", "{v}");
    let jobs = dir.path().join("jobs");
    for leak in [arg(&jobs), arg(dir.path()), "input.mp4", "result.mp4", &id] {
        assert!(!error.contains(leak), "the error shows {leak:?}: {error}");
    }
    assert!(
        error.contains("holiday.mp4"),
        "the error does not name the upload: {error}"
    );
    assert_eq!(server.stop(), Some(0));
}

/// Checks job `id`'s faces record: the picture's size, and at least one box, each inside it.
fn faces_inside(server: &Server, id: &str, clip: bool) -> serde_json::Value {
    let (status, _, body) = server.call("GET", &format!("/v1/jobs/{id}/faces"), &[], None, &[]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v = json(&body);
    let (w, h) = (v["width"].as_u64().unwrap(), v["height"].as_u64().unwrap());
    assert!(w > 0 && h > 0, "{v}");
    let frames = v["frames"].as_array().unwrap();
    assert!(!frames.is_empty(), "{v}");
    let mut boxes = 0;
    for f in frames {
        assert!(f["frame"].is_u64(), "{f}");
        assert_eq!(
            f["t"].is_number(),
            clip,
            "a clip's frames have a time, a photo's none: {f}"
        );
        for b in f["boxes"].as_array().unwrap() {
            let b: Vec<u64> = b.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert!(
                b[0] < b[2] && b[2] <= w && b[1] < b[3] && b[3] <= h,
                "{b:?} outside {w}x{h}"
            );
            boxes += 1;
        }
    }
    assert!(boxes > 0, "no face box for the portrait: {v}");
    v
}

/// Before: a job's record said how many faces it restored, not where. Now
/// `GET /v1/jobs/ID/faces` answers a done job's boxes (a clip's frame by frame, with their
/// times), kept in the job's folder and removed with it; 404 for a job it does not know.
#[test]
fn a_job_answers_where_its_faces_are() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let pic = post(&server, &portrait_jpeg(dir.path()), &[]);
    let clip = post(&server, &asset("samples/test/astronaut.mp4"), &[]);
    for (id, is_clip) in [(&pic, false), (&clip, true)] {
        let v = wait_for(&server, id, &["done", "failed"], 60);
        assert_eq!(v["state"], "done", "{v}");
        let faces = faces_inside(&server, id, is_clip);
        if is_clip {
            assert!(faces["frames"].as_array().unwrap().len() > 1, "{faces}");
            assert!(faces["fps"].as_f64().unwrap() > 0.0, "{faces}");
        } else {
            assert_eq!(
                (faces["width"].as_u64(), faces["height"].as_u64()),
                (Some(256), Some(256))
            );
        }
    }
    let unknown = "0123456789abcdef0123456789abcdef";
    assert_eq!(
        server
            .call("GET", &format!("/v1/jobs/{unknown}/faces"), &[], None, &[])
            .0,
        404
    );
    let folder = dir.path().join("jobs").join(&pic);
    assert!(
        folder.join("faces.json").is_file(),
        "the record is not in the job's folder"
    );
    assert_eq!(server.call("DELETE", &format!("/v1/jobs/{pic}"), &[], None, &[]).0, 200);
    assert_eq!(
        server.call("GET", &format!("/v1/jobs/{pic}/faces"), &[], None, &[]).0,
        404
    );
    assert!(!folder.exists(), "the job's folder outlived it");
    assert_eq!(server.stop(), Some(0));
}
