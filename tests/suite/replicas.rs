//! Service replicas sharing jobs through PostgreSQL (`serve --jobs-db`), end to end: in, a real
//! PostgreSQL cluster of the test's own on loopback, two or three real `gpen-video serve`
//! processes sharing it and one jobs folder, real clips and photos posted to one of them; out,
//! any replica answering for any job, a film's segments spread over the replicas and joined once
//! with every frame once, a replica killed with SIGKILL whose segments another takes over, a
//! cancel through one replica stopping another's segments, and replicas starting at once on an
//! empty database.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::pg::Postgres;
use common::server::Server;
use common::*;

/// The replicas' tests one at a time: each runs two or three services on the same cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn model() -> String {
    arg(&asset("models/standin/identity-256.onnx")).to_string()
}

/// What each test starts with: its own database and folder, a film of `seconds`, and `n`
/// replicas with `extra` flags (the replicas' tests one at a time).
struct Setup {
    r: Vec<Server>,
    film: PathBuf,
    jobs_dir: PathBuf,
    dir: tempfile::TempDir,
    db: Postgres,
    _one: std::sync::MutexGuard<'static, ()>,
}

fn setup(seconds: u32, n: usize, extra: &[&str]) -> Setup {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let db = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let jobs_dir = dir.path().join("jobs");
    let film = moving_portrait(dir.path(), seconds);
    let r = replicas(&db, &jobs_dir, n, extra);
    Setup {
        r,
        film,
        jobs_dir,
        dir,
        db,
        _one: one,
    }
}

/// Checks `server`'s result of job `id` has the frames one CLI run makes of `film`; the result.
fn assert_as_one_run(server: &Server, id: &str, film: &Path, dir: &Path) -> PathBuf {
    let got = result_of(server, id, dir);
    let want = dir.join("cli.mp4");
    cli_run(film, &want);
    assert_eq!(framemd5(&got, "0:v", false), framemd5(&want, "0:v", false));
    got
}

/// The replicas' and the CLI's settings besides the model: lossless, so the encoder's fastest
/// preset (the frames decode the same); without the guard's and the hands' stretches, which
/// would warm every job segment of these short films up from the film's start (what is tested
/// here is how replicas share segments; the stretches are tested in faithful.rs, occlusion.rs).
const SETTINGS: [&str; 8] = [
    "--crf",
    "0",
    "--preset",
    "ultrafast",
    "--identity-guard",
    "off",
    "--occlusion",
    "off",
];

/// `n` replicas started at once on `db`, sharing `jobs_dir`, with [`SETTINGS`] and `extra`.
fn replicas(db: &Postgres, jobs_dir: &Path, n: usize, extra: &[&str]) -> Vec<Server> {
    let (m, url, dir) = (model(), db.url(), arg(jobs_dir).to_string());
    let mut flags: Vec<String> = ["--model", &m, "--jobs-dir", &dir, "--jobs-db", &url]
        .iter()
        .chain(&SETTINGS)
        .map(|s| s.to_string())
        .collect();
    flags.extend(extra.iter().map(|s| s.to_string()));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let flags = flags.clone();
            std::thread::spawn(move || {
                let f: Vec<&str> = flags.iter().map(String::as_str).collect();
                Server::start(&f)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn post(server: &Server, file: &Path, query: &str) -> String {
    let name = file.file_name().unwrap().to_str().unwrap();
    let (status, _, body) = server.call(
        "POST",
        &format!("/v1/jobs?name={name}{query}"),
        &[],
        Some(&std::fs::read(file).unwrap()),
        &[],
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["id"].as_str().unwrap().to_string()
}

fn record(server: &Server, id: &str) -> (u16, serde_json::Value) {
    let (status, _, body) = server.call("GET", &format!("/v1/jobs/{id}"), &[], None, &[]);
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// Waits until job `id`, asked of `server`, is in one of `states`: its record.
fn wait_for(server: &Server, id: &str, states: &[&str], secs: u64, all: &[&Server]) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (status, v) = record(server, id);
        assert_eq!(status, 200, "{v}");
        if states.iter().any(|s| v["state"] == *s) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "job {id} not {states:?} after {secs} s: {v}\n{}",
            logs(all)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn logs(all: &[&Server]) -> String {
    all.iter()
        .enumerate()
        .map(|(i, s)| format!("--- replica {i} ---\n{}", s.log.lock().unwrap()))
        .collect()
}

/// The segments a replica's log says it restored for job `id` (numbers from 1).
fn restored(server: &Server, id: &str) -> Vec<usize> {
    let log = server.log.lock().unwrap().clone();
    log.lines()
        .filter(|l| l.contains(id) && l.contains("restored here"))
        .filter_map(|l| l.split("segment ").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// A replica's name, as its first lines say it.
fn name_of(s: &Server) -> String {
    let log = s.log.lock().unwrap().clone();
    let at = log.find("replica=").expect("the replica's name in its log");
    log[at + 8..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_matches('"')
        .to_string()
}

fn cli_run(input: &Path, out: &Path) {
    let model = model();
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &model];
    args.extend(SETTINGS.iter().map(|s| s as &dyn AsRef<std::ffi::OsStr>));
    ok(&gpen(&args));
}

fn result_of(server: &Server, id: &str, dir: &Path) -> PathBuf {
    let (status, _, bytes) = server.call("GET", &format!("/v1/jobs/{id}/result"), &[], None, &[]);
    assert_eq!(status, 200);
    let got = dir.join(format!("{id}.mp4"));
    std::fs::write(&got, bytes).unwrap();
    got
}

#[test]
fn a_job_posted_to_one_replica_is_answered_by_another_and_replicas_start_at_once() {
    // Three replicas starting at once on an empty database agree on one schema.
    let Setup {
        r,
        film: video,
        jobs_dir,
        dir,
        db,
        _one,
    } = setup(3, 3, &["--job-segment-s", "1"]);
    let all: Vec<&Server> = r.iter().collect();
    let mut c = db.client();
    let v: i32 = c
        .query_one("SELECT version FROM gpen_video_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, 1);
    assert_eq!(
        c.query_one("SELECT count(*) FROM gpen_video_schema", &[])
            .unwrap()
            .get::<_, i64>(0),
        1
    );

    // A clip posted to one replica, asked of another, listed by the third, served by any.
    let id = post(&r[0], &video, "");
    let (status, v) = record(&r[1], &id);
    assert_eq!(status, 200, "{v}");
    let done = wait_for(&r[2], &id, &["done", "failed"], 120, &all);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["frames_done"], 90, "{done}");
    let listed = r[1].get("/v1/jobs").1;
    assert!(listed.contains(&id), "{listed}");
    let got = assert_as_one_run(&r[1], &id, &video, dir.path());
    // By range, through yet another replica.
    let (status, h, part) = r[2].call(
        "GET",
        &format!("/v1/jobs/{id}/result"),
        &[("Range", "bytes=0-99")],
        None,
        &["content-range"],
    );
    assert_eq!((status, part.len()), (206, 100), "{h:?}");
    assert_eq!(part, std::fs::read(&got).unwrap()[..100]);

    // A photo stays on the replica that took it.
    let photo = portrait_jpeg(dir.path());
    let pid = post(&r[1], &photo, "");
    assert_eq!(wait_for(&r[0], &pid, &["done", "failed"], 60, &all)["state"], "done");
    let log1 = r[1].log.lock().unwrap().clone();
    assert!(
        log1.lines().any(|l| l.contains(&pid) && l.contains("job started here")),
        "{}",
        logs(&all)
    );
    for (i, s) in r.iter().enumerate() {
        let page = s.get("/metrics").1;
        assert!(page.contains("gpen_jobs_backlog 0"), "replica {i}: {page}");
        assert!(page.contains("gpen_jobs{state=\"done\"} 2"), "replica {i}: {page}");
    }

    // Left in the shared folder by a replica killed mid-upload: a folder no job owns and
    // nothing touched for an hour goes; a newer one (an upload on its way) stays.
    let (old, new) = (jobs_dir.join("0".repeat(32)), jobs_dir.join("1".repeat(32)));
    for d in [&old, &new] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("input.part"), b"cut off").unwrap();
    }
    tool("touch", &["-d", "2 hours ago", arg(&old.join("input.part")), arg(&old)]);
    let fourth = replicas(&db, &jobs_dir, 1, &[]);
    let start = Instant::now();
    while old.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", logs(&[&fourth[0]]));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(new.join("input.part").exists());
    drop(fourth);

    // Deleted through another replica: gone for all, its folder removed.
    let (status, _, _) = r[2].call("DELETE", &format!("/v1/jobs/{id}"), &[], None, &[]);
    assert_eq!(status, 200);
    for s in &r {
        assert_eq!(record(s, &id).0, 404);
    }
    assert!(!jobs_dir.join(&id).exists());

    // The backlog query deploy/k8s-serve-shared.yaml gives KEDA reads this schema, and agrees
    // with the metrics' gpen_jobs_backlog.
    let manifest = std::fs::read_to_string(asset("deploy/k8s-serve-shared.yaml")).unwrap();
    let query: String = manifest
        .split("query: >-")
        .nth(1)
        .expect("the ScaledObject's query")
        .lines()
        .skip(1)
        .map(str::trim)
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let backlog: i64 = c.query_one(query.as_str(), &[]).unwrap().get(0);
    assert_eq!(backlog, 0, "{query}");

    // A database of a newer schema is refused, by name, before anything is served; a URL that
    // is none is refused by its flag, at once; a password is never shown.
    c.execute("UPDATE gpen_video_schema SET version = 99", &[]).unwrap();
    let url = db.url();
    for (url, want) in [
        (url.as_str(), "schema version 99"),
        ("notaurl", "--jobs-db: invalid connection string"),
        (
            "postgres://u:secret@127.0.0.1:0/x?connect_timeout=1&bogus=1",
            "--jobs-db",
        ),
    ] {
        let err = serve_fails(&jobs_dir, url);
        assert!(err.contains(want) && !err.contains("secret"), "{err}");
    }
}

/// `serve` on `url` fails at start, exit status 1: what it says.
fn serve_fails(jobs_dir: &Path, url: &str) -> String {
    let m = model();
    let out = gpen_plain(
        &[
            &"serve",
            &"--listen",
            &"127.0.0.1:0",
            &"--jobs-dir",
            &jobs_dir,
            &"--jobs-db",
            &url,
        ],
        &[("GPEN_VIDEO_MODEL", m.as_str())],
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

/// Four segments of a 12 s film (keyframes each second, segments of about 3 s: the cuts at
/// 3, 6 and 9 s) spread over two replicas; every frame once, as one run makes it.
#[test]
fn a_film_is_restored_by_two_replicas_each_segment_once() {
    let Setup {
        r,
        film,
        jobs_dir,
        dir,
        db: _db,
        _one,
    } = setup(12, 2, &["--job-segment-s", "2.9"]);
    let all: Vec<&Server> = r.iter().collect();
    let start = Instant::now();
    let id = post(&r[0], &film, "");
    let done = wait_for(&r[1], &id, &["done", "failed"], 600, &all);
    let wall = start.elapsed().as_secs_f64();
    assert_eq!(done["state"], "done", "{done}\n{}", logs(&all));
    let (a, b) = (restored(&r[0], &id), restored(&r[1], &id));
    eprintln!("two replicas: {wall:.1} s; segments {a:?} and {b:?}");
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both replicas work: {a:?} {b:?}\n{}",
        logs(&all)
    );
    let mut every: Vec<usize> = a.iter().chain(&b).copied().collect();
    every.sort();
    assert_eq!(every, (1..=4).collect::<Vec<_>>(), "each segment once\n{}", logs(&all));
    let joins = all
        .iter()
        .map(|s| s.log.lock().unwrap().matches("film joined here").count())
        .sum::<usize>();
    assert_eq!(joins, 1, "{}", logs(&all));
    assert_eq!(done["frames_done"], 360, "{done}");
    // Every frame once, as one run makes it; the sound kept.
    let got = assert_as_one_run(&r[1], &id, &film, dir.path());
    let sound = packet_md5(&got, "0:a");
    assert!(!sound.is_empty(), "no sound kept");
    assert_eq!(sound, packet_md5(&dir.path().join("cli.mp4"), "0:a"));
    assert!(!jobs_dir.join(&id).join(".result.mp4.segments").exists());
}

#[test]
fn a_replica_killed_mid_film_loses_its_segments_to_the_other() {
    let Setup {
        mut r,
        film,
        jobs_dir: _jobs_dir,
        dir,
        db,
        _one,
    } = setup(12, 2, &["--job-segment-s", "2", "--job-lease-s", "2"]);
    let id = post(&r[0], &film, "");
    // Killed while it holds a segment, before the film is done.
    let start = Instant::now();
    let mut c = db.client();
    let held = |c: &mut postgres::Client| -> Vec<(i32, String)> {
        c.query(
            "SELECT number, holder FROM gpen_video_segments WHERE job = $1 AND state = 'running'",
            &[&id],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
    };
    let victim = name_of(&r[0]);
    loop {
        let h = held(&mut c);
        let done: i64 = c
            .query_one(
                "SELECT count(*) FROM gpen_video_segments WHERE job = $1 AND state = 'done'",
                &[&id],
            )
            .unwrap()
            .get(0);
        if done >= 1 && h.iter().any(|(_, w)| *w == victim) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "no segment held by the first replica"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    r[0].child.kill().unwrap();
    r[0].child.wait().unwrap();
    let survivor = r.pop().unwrap();
    let done = wait_for(&survivor, &id, &["done", "failed"], 300, &[&survivor]);
    assert_eq!(done["state"], "done", "{done}");
    let log = survivor.log.lock().unwrap().clone();
    assert!(log.contains(&format!("taken over from replica {victim}")), "{log}");
    assert_as_one_run(&survivor, &id, &film, dir.path());
}

#[test]
fn a_cancel_through_one_replica_stops_the_others_segments() {
    let Setup {
        r,
        film,
        jobs_dir,
        dir: _dir,
        db: _db,
        _one,
    } = setup(20, 2, &["--job-segment-s", "2"]);
    let all: Vec<&Server> = r.iter().collect();
    let id = post(&r[0], &film, "");
    let start = Instant::now();
    // Both replicas hold a segment of it.
    while r.iter().any(|s| s.metric("gpen_replica_segments_held") < 1.0) {
        assert!(start.elapsed() < Duration::from_secs(120), "{}", logs(&all));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its progress is summed over both replicas' segments, its speed theirs together.
    loop {
        let (_, v) = record(&r[1], &id);
        assert_eq!(v["state"], "running", "{v}");
        if v["fps"].as_f64().is_some_and(|f| f > 0.0) && v["frames_done"].as_u64() > Some(0) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no speed: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A second film waits in line, queued, while the first one's segments keep both replicas
    // busy (a replica finishing a segment takes the next one before planning another film);
    // deleted through the other replica while it waits, it is gone for both.
    let second = post(&r[1], &film, "");
    let done_before: usize = r.iter().map(|s| restored(s, &id).len()).sum();
    while r.iter().map(|s| restored(s, &id).len()).sum::<usize>() < done_before + 2 {
        assert!(start.elapsed() < Duration::from_secs(180), "{}", logs(&all));
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, v) = record(&r[0], &second);
    assert_eq!(
        (v["state"].as_str(), v["place"].as_u64()),
        (Some("queued"), Some(1)),
        "{v}"
    );
    let (status, _, _) = r[0].call("DELETE", &format!("/v1/jobs/{second}"), &[], None, &[]);
    assert_eq!(status, 200);
    assert_eq!(record(&r[1], &second).0, 404);
    assert!(!jobs_dir.join(&second).exists());
    // The cancel comes while both replicas hold a segment of the film (one may be between two
    // segments for a moment: it holds nothing then, and nothing of it is stopped).
    while r.iter().any(|s| s.metric("gpen_replica_segments_held") < 1.0) {
        assert!(start.elapsed() < Duration::from_secs(180), "{}", logs(&all));
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, _, body) = r[0].call("POST", &format!("/v1/jobs/{id}/cancel"), &[], None, &[]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let stopped = Instant::now();
    while r.iter().any(|s| s.metric("gpen_replica_segments_held") > 0.0) {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "segments still held after a cancel\n{}",
            logs(&all)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log1 = r[1].log.lock().unwrap().clone();
    assert!(
        log1.lines().any(|l| l.contains(&id) && l.contains("stopped")),
        "{}",
        logs(&all)
    );
    let before: usize = r.iter().map(|s| restored(s, &id).len()).sum();
    std::thread::sleep(Duration::from_secs(2));
    let after: usize = r.iter().map(|s| restored(s, &id).len()).sum();
    assert_eq!(before, after, "segments restored after the cancel");
    for s in &r {
        assert_eq!(record(s, &id).1["state"], "cancelled");
    }
    assert!(before < 10, "the film was done before the cancel");
    assert!(!jobs_dir.join(&id).join("result.mp4").exists());
}

#[test]
fn a_replica_paused_past_its_lease_puts_nothing_in_place() {
    let Setup {
        r,
        film,
        jobs_dir: _jobs_dir,
        dir,
        db,
        _one,
    } = setup(8, 2, &["--job-segment-s", "2", "--job-lease-s", "2"]);
    let all: Vec<&Server> = r.iter().collect();
    let (victim, other) = (name_of(&r[0]), name_of(&r[1]));
    let id = post(&r[1], &film, "");
    let mut c = db.client();
    let start = Instant::now();
    // Paused (SIGSTOP) while it makes a segment, for longer than its lease.
    let number = loop {
        let row = c
            .query_opt(
                "SELECT number FROM gpen_video_segments WHERE job = $1 AND state = 'running' AND holder = $2",
                &[&id, &victim],
            )
            .unwrap();
        if let Some(row) = row {
            break row.get::<_, i32>(0);
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{}", logs(&all));
        std::thread::sleep(Duration::from_millis(10));
    };
    tool("kill", &["-STOP", &r[0].child.id().to_string()]);
    let taken = format!("segment {} of", number + 1);
    let paused = Instant::now();
    loop {
        let log = r[1].log.lock().unwrap().clone();
        if log
            .lines()
            .any(|l| l.contains(&taken) && l.contains(&format!("taken over from replica {victim}")))
        {
            break;
        }
        assert!(paused.elapsed() < Duration::from_secs(60), "{}", logs(&all));
        std::thread::sleep(Duration::from_millis(50));
    }
    tool("kill", &["-CONT", &r[0].child.id().to_string()]);
    let done = wait_for(&r[0], &id, &["done", "failed"], 180, &all);
    assert_eq!(done["state"], "done", "{done}");
    // Woken, it finds the segment another's: its copy is never put in place.
    let wake = Instant::now();
    loop {
        let log = r[0].log.lock().unwrap().clone();
        let lost = log
            .lines()
            .any(|l| l.contains(&id) && (l.contains("another replica holds it") || l.contains("its lease lapsed")));
        if lost {
            break;
        }
        assert!(wake.elapsed() < Duration::from_secs(20), "{}", logs(&all));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!restored(&r[0], &id).contains(&(number as usize + 1)), "{}", logs(&all));
    let row = c
        .query_one(
            "SELECT holder, tries FROM gpen_video_segments WHERE job = $1 AND number = $2",
            &[&id, &number],
        )
        .unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i32>(1)), (other, 2));
    assert_as_one_run(&r[0], &id, &film, dir.path());
}

#[test]
fn a_replica_with_other_settings_hands_segments_back_and_a_segment_tried_too_often_fails_the_job() {
    let Setup {
        r,
        film,
        jobs_dir,
        dir,
        db,
        _one,
    } = setup(12, 1, &["--job-segment-s", "2"]);
    // A second replica whose settings differ (its blend), started once the first has cut the
    // film, never works on it: it finds the plan made with other settings and hands back.
    let id = post(&r[0], &film, "");
    let mut c = db.client();
    let start = Instant::now();
    while c
        .query_one("SELECT count(*) FROM gpen_video_segments WHERE job = $1", &[&id])
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(start.elapsed() < Duration::from_secs(60), "never planned");
        std::thread::sleep(Duration::from_millis(5));
    }
    let other = replicas(&db, &jobs_dir, 1, &["--job-segment-s", "2", "--blend", "0.5"]);
    let all = [&r[0], &other[0]];
    let done = wait_for(&other[0], &id, &["done", "failed"], 180, &all);
    assert_eq!(done["state"], "done", "{done}");
    assert!(restored(&other[0], &id).is_empty(), "{}", logs(&all));
    let log = other[0].log.lock().unwrap().clone();
    assert!(log.contains("planned with other settings"), "{}", logs(&all));
    assert_as_one_run(&r[0], &id, &film, dir.path());

    // A segment every replica that took it died on is not claimed again: its job fails, saying so.
    drop(other);
    let id = post(&r[0], &film, "");
    let start = Instant::now();
    loop {
        let n = c
            .execute(
                "UPDATE gpen_video_segments SET tries = 3 WHERE job = $1 AND number = 3 AND state = 'pending'",
                &[&id],
            )
            .unwrap();
        if n == 1 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "segment 4 never pending");
        std::thread::sleep(Duration::from_millis(5));
    }
    let failed = wait_for(&r[0], &id, &["done", "failed"], 120, &[&r[0]]);
    assert_eq!(failed["state"], "failed", "{failed}");
    let why = failed["error"].as_str().unwrap();
    assert!(why.contains("segment 4 was started 3 times"), "{why}");
}

/// The 40 s film's wall time (posted to done) on one service without a database, on one
/// replica and on two, alternated `GPEN_VIDEO_ROUNDS` times (3): medians, their ratios, and what
/// each replica did. A benchmark, not a check of speed: `scripts/bench-replicas.sh` runs it.
#[test]
#[ignore = "a benchmark: scripts/bench-replicas.sh"]
fn wall_time_of_a_film_on_one_replica_and_on_two() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rounds: usize = std::env::var("GPEN_VIDEO_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let db = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let jobs_dir = dir.path().join("jobs");
    let film = moving_portrait(dir.path(), 40);
    let mut walls: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        for n in [0, 1, 2] {
            let r = if n == 0 {
                let (m, own) = (model(), dir.path().join(format!("alone-{round}")));
                let f = [
                    &["--model", &m, "--jobs-dir", arg(&own), "--job-segment-s", "5"][..],
                    &SETTINGS,
                ]
                .concat();
                vec![Server::start(&f)]
            } else {
                replicas(&db, &jobs_dir, n, &["--job-segment-s", "5"])
            };
            let all: Vec<&Server> = r.iter().collect();
            let start = Instant::now();
            let id = post(&r[0], &film, "");
            let done = wait_for(&r[0], &id, &["done", "failed"], 900, &all);
            let wall = start.elapsed().as_secs_f64();
            assert_eq!(done["state"], "done");
            let did: Vec<Vec<usize>> = r.iter().map(|s| restored(s, &id)).collect();
            let total: usize = did.iter().map(Vec::len).sum();
            if n == 0 {
                eprintln!("round {round}, no database: {wall:.1} s");
            } else {
                eprintln!(
                    "round {round}, {n} replica(s): {wall:.1} s; segments restored by each: {did:?}; redone: {}",
                    total - 8
                );
                assert_eq!(total, 8);
            }
            walls[n].push(wall);
            for s in r {
                assert_eq!(s.stop(), Some(0));
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [alone, one, two] = walls.each_mut().map(median);
    eprintln!(
        "median wall time: no database {alone:.1} s, one replica {one:.1} s (one/alone {:.3}), two replicas {two:.1} s (two/one {:.3})",
        one / alone,
        two / one
    );
}

/// A database gone: `/metrics` fails and says why (503) rather than report no jobs at all.
#[test]
fn metrics_answer_the_databases_failure_not_zeros() {
    let db = Postgres::start();
    let jobs = tempfile::tempdir().unwrap();
    let servers = replicas(&db, jobs.path(), 1, &[]);
    assert_eq!(servers[0].get("/metrics").0, 200);
    drop(db);
    let (status, page) = servers[0].get("/metrics");
    assert_eq!(status, 503, "{page}");
    assert!(page.contains("cannot read the jobs' figures"), "{page}");
    assert!(!page.contains("gpen_jobs{"), "{page}");
}
