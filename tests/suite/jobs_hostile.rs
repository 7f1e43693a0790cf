//! Jobs against hostile but realistic users and neighbours: in, the real binary serving on a
//! loopback port, a jobs folder planted with records and links as another container sharing the
//! volume could leave them, raw HTTP requests a browser on another site or a slow client would
//! send; out, that nothing outside the jobs folder is read or written, that what does not check
//! out is listed and left alone, that the limits hold under uploads sent together, that a
//! deletion outlives a kill, and who may call.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::server::Server;
use common::*;

fn model() -> String {
    arg(&asset("models/standin/identity-256.onnx")).to_string()
}

fn clip(dir: &Path, seconds: u32) -> PathBuf {
    moving_portrait(dir, seconds)
}

/// A job record as the service writes it (`job.json`), with the given state and file names.
fn record(id: &str, state: &str, input: &str, output: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    serde_json::json!({
        "id": id, "state": state, "kind": "video", "name": "clip.mp4", "input": input,
        "output": output, "query": {}, "created": now, "started": now, "finished": now,
        "frames_done": 1, "frames_total": 1, "fps": null, "error": null, "result_bytes": null
    })
    .to_string()
}

fn id(k: u8) -> String {
    format!("{k:x}").repeat(32)
}

/// An answer read off a raw connection: its status, its head (lower case) and its body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `method path` with `headers` (the Host first, as given) and `body` on a connection of
/// its own, and reads the whole answer.
fn raw(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head += &format!("Host: {addr}\r\n");
    }
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += &format!("Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    c.write_all(head.as_bytes()).unwrap();
    let _ = c.write_all(body);
    read_answer(&mut c)
}

fn read_answer(c: &mut TcpStream) -> Answer {
    let mut bytes = Vec::new();
    let _ = c.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// Opens an upload to `/v1/jobs?name=NAME` declaring `len` bytes and sends `first` of them;
/// the connection, to go on with.
fn open_upload(addr: &str, name: &str, len: usize, first: &[u8]) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /v1/jobs?name={name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(first).unwrap();
    c
}

fn jobs_list(server: &Server) -> serde_json::Value {
    let (status, _, body) = server.call("GET", "/v1/jobs", &[], None, &[]);
    assert_eq!(status, 200);
    serde_json::from_slice(&body).unwrap()
}

fn state_of(server: &Server, id: &str) -> (u16, serde_json::Value) {
    let (status, _, body) = server.call("GET", &format!("/v1/jobs/{id}"), &[], None, &[]);
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// Before: a record naming `../../outside/secret.txt` or an absolute path was served from
/// /result, a result that is a link to an outside file was served, a queued record naming an
/// outside output was run and wrote there, a link named like an id was loaded, a truncated
/// record's job was removed at start with its result, and a second service on the folder removed
/// the first one's upload in flight.
#[test]
fn the_jobs_folder_is_the_only_place_touched_and_what_does_not_check_out_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(&jobs).unwrap();
    let secret = outside.join("secret.txt");
    std::fs::write(&secret, b"not yours").unwrap();
    let video = clip(dir.path(), 1);
    let plant = |k: u8, state: &str, output: &str| {
        let d = jobs.join(id(k));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(&video, d.join("input.mp4")).unwrap();
        std::fs::write(d.join("job.json"), record(&id(k), state, "input.mp4", output)).unwrap();
        d
    };
    // 1: a finished record naming a file outside by a relative path; 2: by an absolute one.
    plant(1, "done", "../../outside/secret.txt");
    plant(2, "done", arg(&secret));
    // 3: a result that is a link to an outside file.
    let d3 = plant(3, "done", "result.mp4");
    std::os::unix::fs::symlink(&secret, d3.join("result.mp4")).unwrap();
    // 4: a queued record whose output is outside: it would be written there.
    plant(4, "queued", "../../outside/written.mp4");
    // 5: a link named like an id, to an outside folder holding a good-looking record.
    let elsewhere = outside.join("job5");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(&video, elsewhere.join("input.mp4")).unwrap();
    std::fs::write(
        elsewhere.join("job.json"),
        record(&id(5), "queued", "input.mp4", "result.mp4"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&elsewhere, jobs.join(id(5))).unwrap();
    // 6: a finished job whose record was cut short: its result must stay.
    let d6 = plant(6, "done", "result.mp4");
    std::fs::write(d6.join("result.mp4"), b"a result").unwrap();
    let whole = record(&id(6), "done", "input.mp4", "result.mp4");
    std::fs::write(d6.join("job.json"), &whole[..whole.len() / 2]).unwrap();
    // 7: a queued job with a link planted in its segments' folder.
    let d7 = plant(7, "queued", "result.mp4");
    std::fs::create_dir_all(d7.join(".result.mp4.segments")).unwrap();
    std::os::unix::fs::symlink(&outside, d7.join(".result.mp4.segments/seg")).unwrap();
    // 8: a finished job of an earlier version, its query's flags as numbers and nulls: kept.
    let d8 = plant(8, "done", "result.mp4");
    std::fs::copy(&video, d8.join("result.mp4")).unwrap();
    let old = record(&id(8), "done", "input.mp4", "result.mp4").replace(
        "\"query\":{}",
        "\"query\":{\"name\":\"clip.mp4\",\"model\":null,\"blend\":0.5,\"mask\":null,\"temporal\":null,\"smooth\":null,\"compare\":null}",
    );
    assert!(old.contains("\"blend\":0.5"), "{old}");
    std::fs::write(d8.join("job.json"), old).unwrap();
    let before = |p: &Path| std::fs::read_dir(p).unwrap().count();
    let outside_before = before(&outside);

    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs)]);
    let listed = jobs_list(&server);
    let listed = listed["jobs"].as_array().unwrap();
    // 5: a link named like a job is no job: not answered, not listed, left where it is.
    let (status, _) = state_of(&server, &id(5));
    assert_eq!(status, 404, "a link answered as a job: {listed:?}");
    assert!(!listed.iter().any(|j| j["id"] == id(5)), "{listed:?}");
    let (status, _, _) = server.call("DELETE", &format!("/v1/jobs/{}", id(5)), &[], None, &[]);
    assert_eq!(status, 404);
    assert!(std::fs::symlink_metadata(jobs.join(id(5))).is_ok(), "the link went");
    assert!(elsewhere.join("job.json").exists() && elsewhere.join("input.mp4").exists());
    for k in [1u8, 2, 3, 4, 6, 7] {
        let (status, rec) = state_of(&server, &id(k));
        assert_eq!(status, 200, "job {k} not listed: {listed:?}");
        assert_eq!(rec["state"], "failed", "job {k}: {rec}");
        let error = rec["error"].as_str().unwrap_or_default();
        assert!(error.contains("left on disk"), "job {k}: {error}");
        assert!(!error.contains(arg(dir.path())), "job {k} names a server path: {error}");
        let (status, _, body) = server.call("GET", &format!("/v1/jobs/{}/result", id(k)), &[], None, &[]);
        assert_eq!(status, 409, "job {k}'s result: {}", String::from_utf8_lossy(&body));
        assert!(!String::from_utf8_lossy(&body).contains("not yours"));
        // Left for its owner: a DELETE does not remove it.
        let (status, _, _) = server.call("DELETE", &format!("/v1/jobs/{}", id(k)), &[], None, &[]);
        assert_eq!(status, 409, "job {k} deleted");
        assert!(
            std::fs::symlink_metadata(jobs.join(id(k))).is_ok(),
            "job {k}'s folder went"
        );
    }
    assert_eq!(
        state_of(&server, &id(8)).1["state"],
        "done",
        "an earlier version's record"
    );
    let (status, _, _) = server.call("GET", &format!("/v1/jobs/{}/result", id(8)), &[], None, &[]);
    assert_eq!(status, 200);
    assert!(state_of(&server, &id(6)).1["error"]
        .as_str()
        .unwrap()
        .contains("damaged record"));
    assert_eq!(std::fs::read(d6.join("result.mp4")).unwrap(), b"a result");
    assert!(elsewhere.join("job.json").exists() && elsewhere.join("input.mp4").exists());

    // A second service on the folder is refused, naming the first; the first's upload in flight
    // is not touched and completes.
    let bytes = std::fs::read(&video).unwrap();
    let mut upload = open_upload(&server.addr, "late.mp4", bytes.len(), &bytes[..bytes.len() / 2]);
    let start = Instant::now();
    while !std::fs::read_dir(&jobs)
        .unwrap()
        .flatten()
        .any(|e| e.path().join("input.part").exists())
    {
        assert!(start.elapsed() < Duration::from_secs(20), "the upload never began");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = serve_expecting_refusal(&jobs, &[], None);
    let words = String::from_utf8_lossy(&second.stderr);
    assert_ne!(second.status.code(), Some(0), "{words}");
    assert!(
        words.contains("in use by another gpen-video serve") && words.contains(&server.child.id().to_string()),
        "{words}"
    );
    upload.write_all(&bytes[bytes.len() / 2..]).unwrap();
    let answer = read_answer(&mut upload);
    assert_eq!(answer.status, 202, "{}", answer.body);
    let late: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    let late = late["id"].as_str().unwrap().to_string();
    let start = Instant::now();
    while state_of(&server, &late).1["state"] != "done" {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{}",
            server.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    assert_eq!(std::fs::read(&secret).unwrap(), b"not yours");
    assert_eq!(
        before(&outside),
        outside_before,
        "a file was written outside the jobs folder"
    );
    assert!(!outside.join("written.mp4").exists());
    assert!(!elsewhere.join("result.mp4").exists());
    assert_eq!(server.stop(), Some(0));
}

/// Before: DELETE of a running job answered 200 while its record still said running, so a
/// service killed then ran the job again at its next start.
#[test]
fn a_deletion_is_on_disk_before_it_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let video = clip(dir.path(), 6);
    let flags = ["--model", &model(), "--jobs-dir", arg(&jobs), "--job-segment-s", "1"];
    let mut server = Server::start(&flags);
    let (status, _, body) = server.call(
        "POST",
        "/v1/jobs?name=clip.mp4",
        &[],
        Some(&std::fs::read(&video).unwrap()),
        &[],
    );
    assert_eq!(status, 202);
    let job: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let job = job["id"].as_str().unwrap().to_string();
    let start = Instant::now();
    while state_of(&server, &job).1["state"] != "running" {
        assert!(start.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The service stops its job threads only between frames: the record is read the moment
    // the answer is in, before the folder can go.
    let (status, _, _) = server.call("DELETE", &format!("/v1/jobs/{job}"), &[], None, &[]);
    let on_disk = std::fs::read_to_string(jobs.join(&job).join("job.json"));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert_eq!(status, 200);
    if let Ok(rec) = on_disk {
        let rec: serde_json::Value = serde_json::from_str(&rec).unwrap();
        assert_eq!(
            rec["state"], "cancelled",
            "the deletion was answered before it was on disk"
        );
    }
    let server = Server::start(&flags);
    assert_eq!(state_of(&server, &job).0, 404, "the deleted job came back");
    assert!(!jobs.join(&job).exists(), "the deleted job's files stay");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!server.log.lock().unwrap().contains("job started"));
    assert_eq!(server.stop(), Some(0));
}

/// Before: with --max-jobs 1 four uploads sent together were all accepted; with a 20 MB quota
/// eight 6 MB uploads sent together were all taken and the folder held 2.4 times the quota.
#[test]
fn uploads_in_flight_count_against_max_jobs_and_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let video = std::fs::read(clip(dir.path(), 2)).unwrap();
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs), "--max-jobs", "1"]);
    // Four uploads open at once, each half sent: one place.
    let mut open: Vec<TcpStream> = (0..4)
        .map(|_| open_upload(&server.addr, "clip.mp4", video.len(), &video[..video.len() / 2]))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let statuses: Vec<u16> = open
        .iter_mut()
        .map(|c| {
            let _ = c.write_all(&video[video.len() / 2..]);
            read_answer(c).status
        })
        .collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 3, "{statuses:?}");
    drop(server);

    let jobs = dir.path().join("jobs-quota");
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs), "--jobs-quota-gb", "0.02"]);
    let quota = 20_000_000u64;
    let body = vec![9u8; 6_000_000];
    // Eight 6 MB uploads, each 1 MB sent, then the rest together.
    let mut open: Vec<TcpStream> = (0..8)
        .map(|_| open_upload(&server.addr, "clip.mp4", body.len(), &body[..1_000_000]))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let (peak, done, jobs) = (peak.clone(), done.clone(), jobs.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let bytes: u64 = walk_bytes(&jobs);
                peak.fetch_max(bytes, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let senders: Vec<_> = open
        .drain(..)
        .map(|mut c| {
            let rest = body[1_000_000..].to_vec();
            std::thread::spawn(move || {
                let _ = c.write_all(&rest);
                read_answer(&mut c)
            })
        })
        .collect();
    let answers: Vec<Answer> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    watch.join().unwrap();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    // The bytes are no video: those taken whole are refused as such (400), the others for room.
    let refused = statuses.iter().filter(|&&s| s == 413).count();
    assert!(refused >= 5, "{statuses:?}");
    assert!(statuses.iter().all(|&s| s == 413 || s == 400), "{statuses:?}");
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(peak <= quota, "the folder held {peak} bytes of a {quota} quota");
    let words = &answers.iter().find(|a| a.status == 413).unwrap().body;
    assert!(words.contains("--jobs-quota-gb"), "{words}");
    assert_eq!(server.stop(), Some(0));
}

fn walk_bytes(dir: &Path) -> u64 {
    let Ok(d) = std::fs::read_dir(dir) else { return 0 };
    d.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Before: a 2 KB chunked upload, and a request declaring 11 MB that sent 2 KB and closed, each
/// removed the oldest finished result for room their bytes never needed.
#[test]
fn finished_results_are_removed_only_for_bytes_that_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    // A finished job of this service's holding 15 MB of a 20 MB quota.
    let old = id(10);
    let d = jobs.join(&old);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("input.mp4"), vec![1u8; 1_000]).unwrap();
    std::fs::write(d.join("result.mp4"), vec![2u8; 15_000_000]).unwrap();
    std::fs::write(d.join("job.json"), record(&old, "done", "input.mp4", "result.mp4")).unwrap();
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs), "--jobs-quota-gb", "0.02"]);
    assert_eq!(state_of(&server, &old).1["state"], "done");
    // Chunked, no length: 2 KB.
    let mut c = TcpStream::connect(&server.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v1/jobs?name=clip.mp4 HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n800\r\n",
        server.addr
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&[3u8; 0x800]).unwrap();
    c.write_all(b"\r\n0\r\n\r\n").unwrap();
    let answer = read_answer(&mut c);
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(
        state_of(&server, &old).1["state"],
        "done",
        "removed for a 2 KB chunked upload"
    );
    // 11 MB declared, 2 KB sent, closed.
    let c = open_upload(&server.addr, "clip.mp4", 11_000_000, &[4u8; 2048]);
    std::thread::sleep(Duration::from_millis(300));
    c.shutdown(std::net::Shutdown::Both).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        state_of(&server, &old).1["state"],
        "done",
        "removed for 11 MB that never came"
    );
    assert!(d.join("result.mp4").exists());
    // 6 MB that arrive need its room: it goes then.
    let answer = raw(
        &server.addr,
        "POST",
        "/v1/jobs?name=clip.mp4",
        &[],
        &vec![5u8; 6_000_000],
    );
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(
        state_of(&server, &old).0,
        404,
        "the room was not made when the bytes came"
    );
    assert_eq!(server.stop(), Some(0));
}

/// Before: an upload trickling a byte every 2 s was never cut off, and kept SIGTERM from
/// stopping the service (still running after 25 s).
#[test]
fn a_trickling_upload_is_cut_off_and_does_not_hold_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs), "--read-timeout-s", "2"]);
    let mut c = open_upload(&server.addr, "clip.mp4", 1_000_000, b"x");
    let start = Instant::now();
    let mut cut = false;
    // A byte every half second; the answer is looked for before each byte (a byte written
    // after the service closed would reset the connection and lose the answer).
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(500));
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let peeked = c.peek(&mut b);
        c.set_nonblocking(false).unwrap();
        if matches!(peeked, Ok(n) if n > 0) {
            cut = true;
            break;
        }
        if c.write_all(b"x").is_err() {
            cut = true;
            break;
        }
    }
    assert!(cut, "the trickle was not cut off in 20 s");
    let answer = read_answer(&mut c);
    assert_eq!(answer.status, 408, "{}", answer.body);
    assert!(answer.body.contains("--min-upload-kbs"), "{}", answer.body);
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    drop(server);

    // SIGTERM while a trickle is in flight (a long --read-timeout-s keeps it within its pace).
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs), "--read-timeout-s", "60"]);
    let mut c = open_upload(&server.addr, "clip.mp4", 1_000_000, b"x");
    std::thread::sleep(Duration::from_millis(800));
    let _ = c.write_all(b"x");
    let pid = server.child.id();
    let start = Instant::now();
    let stopped = std::thread::spawn(move || server.stop());
    let answer = read_answer(&mut c);
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(stopped.join().unwrap(), Some(0), "serve {pid}");
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
}

/// Before: without a token any Host was answered (DNS rebinding), a cross-origin text/plain POST
/// made a job, the page could be framed; with a token a cookie POST from another port of the
/// host was taken, an empty token started an open service, and `bearer` in lower case was refused.
#[test]
fn who_may_call() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let server = Server::start(&[
        "--model",
        &model(),
        "--jobs-dir",
        arg(&jobs),
        "--allow-host",
        "studio.lan",
    ]);
    let addr = server.addr.clone();
    let port = addr.rsplit(':').next().unwrap();
    let get = |host: &str| raw(&addr, "GET", "/v1/jobs", &[("Host", host)], b"").status;
    assert_eq!(get("evil.example"), 403);
    assert_eq!(get(&format!("evil.example:{port}")), 403);
    assert_eq!(get(&format!("localhost:{port}")), 200);
    assert_eq!(get(&addr), 200);
    assert_eq!(get(&format!("studio.lan:{port}")), 200);
    assert_eq!(raw(&addr, "GET", "/", &[("Host", "evil.example")], b"").status, 403);
    let refused = raw(&addr, "GET", "/v1/jobs", &[("Host", "evil.example")], b"");
    assert!(refused.body.contains("--allow-host"), "{}", refused.body);
    // Writes from another site, by Origin or by Fetch metadata, are refused; the service's own
    // page and clients that say nothing (curl) are not.
    let post = |headers: &[(&str, &str)]| raw(&addr, "POST", "/v1/jobs?name=a.mp4", headers, b"not a video");
    assert_eq!(
        post(&[("Origin", "http://evil.example"), ("Content-Type", "text/plain")]).status,
        403
    );
    assert_eq!(post(&[("Origin", "null")]).status, 403);
    assert_eq!(post(&[("Sec-Fetch-Site", "cross-site")]).status, 403);
    assert_eq!(post(&[("Origin", &format!("http://{addr}"))]).status, 400);
    assert_eq!(post(&[]).status, 400);
    let delete = raw(
        &addr,
        "DELETE",
        &format!("/v1/jobs/{}", id(1)),
        &[("Origin", "http://evil.example")],
        b"",
    );
    assert_eq!(delete.status, 403);
    assert_eq!(
        std::fs::read_dir(&jobs)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().unwrap().is_dir())
            .count(),
        0
    );
    // No framing, anywhere.
    for path in ["/", "/v1/jobs", "/healthz"] {
        let a = raw(&addr, "GET", path, &[], b"");
        assert!(a.head.contains("x-frame-options: deny"), "{path}: {}", a.head);
        assert!(a.head.contains("frame-ancestors 'none'"), "{path}: {}", a.head);
    }
    drop(server);

    // With a token: a cookie from another port of the host (the same site to SameSite=Strict)
    // changes nothing; the scheme is read in any case.
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs), "--token", "s3cret"]);
    let addr = server.addr.clone();
    let cookie = format!("gpen_token={}", hex_of("s3cret"));
    let from = |origin: &str| {
        raw(
            &addr,
            "POST",
            "/v1/jobs?name=a.mp4",
            &[("Cookie", &cookie), ("Origin", origin)],
            b"not a video",
        )
        .status
    };
    assert_eq!(from("http://127.0.0.1:3000"), 403);
    assert_eq!(from(&format!("http://{addr}")), 400);
    assert_eq!(
        raw(
            &addr,
            "GET",
            "/v1/jobs",
            &[("Host", "evil.example"), ("Authorization", "bearer s3cret")],
            b""
        )
        .status,
        200
    );
    assert_eq!(
        raw(&addr, "GET", "/v1/jobs", &[("Authorization", "BEARER  s3cret")], b"").status,
        200
    );
    assert_eq!(
        raw(&addr, "GET", "/v1/jobs", &[("Authorization", "Basic s3cret")], b"").status,
        401
    );
    drop(server);

    // An empty token is refused at start, from the flag or the variable.
    for (flag, env) in [(&["--token", ""][..], None), (&[][..], Some(""))] {
        let out = serve_expecting_refusal(&jobs, flag, env);
        let words = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{words}");
        assert!(words.contains("is empty"), "{words}");
    }
}

/// Runs `serve` on `jobs` with `extra` flags and `GPEN_VIDEO_TOKEN` set to `token` (unset
/// without), for a start that is refused: its exit and its words.
fn serve_expecting_refusal(jobs: &Path, extra: &[&str], token: Option<&str>) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpen-video"));
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--model",
        &model(),
        "--jobs-dir",
        arg(jobs),
    ])
    .args(extra)
    .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
    .env_remove("GPEN_VIDEO_TOKEN")
    .stdin(Stdio::null());
    if let Some(t) = token {
        c.env("GPEN_VIDEO_TOKEN", t);
    }
    c.output().unwrap()
}

fn hex_of(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Before: a 300-character extension was a 500 (`File name too long`), an upload that was no
/// video was refused naming the server's folder, and misspelt parameters were ignored.
#[test]
fn answers_name_the_parameter_and_the_upload_never_a_server_path() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    let server = Server::start(&["--model", &model(), "--jobs-dir", arg(&jobs)]);
    let addr = server.addr.clone();
    let long = format!("/v1/jobs?name=clip.{}", "x".repeat(300));
    let a = raw(&addr, "POST", &long, &[], b"not a video");
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.starts_with("name:"), "{}", a.body);
    // An mp4 box header and nothing after: FFmpeg refuses it; the words name the upload.
    let mut fake = vec![0, 0, 0, 24];
    fake.extend(b"ftypisom\0\0\0\0isomiso2");
    fake.extend(vec![0u8; 4000]);
    let a = raw(&addr, "POST", "/v1/jobs?name=holiday.mp4", &[], &fake);
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("holiday.mp4"), "{}", a.body);
    assert!(
        !a.body.contains(arg(dir.path())) && !a.body.contains("input."),
        "{}",
        a.body
    );
    for (query, named) in [
        ("/v1/jobs?name=a.mp4&blnd=0.3&temporl=2", "blnd"),
        ("/v1/jobs?name=a.mp4&blend=lots", "blend=lots"),
        ("/v1/jobs?name=a.mp4&blend=7", "blend must be between 0 and 1"),
        ("/v1/restore?formt=png", "formt"),
        ("/v1/restore?blend=x", "blend=x"),
    ] {
        let a = raw(&addr, "POST", query, &[], b"not a picture");
        assert_eq!(a.status, 400, "{query}: {}", a.body);
        assert!(a.body.starts_with(named), "{query}: {}", a.body);
    }
    let a = raw(&addr, "GET", &format!("/v1/jobs/{}/result?dowload=1", id(1)), &[], b"");
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(server.stop(), Some(0));
}
