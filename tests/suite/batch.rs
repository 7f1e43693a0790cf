//! End-to-end tests of `gpen-video batch`: in, short clips cut from the set-up's samples into a
//! temporary folder; out, assertions on what the real binary leaves in OUT_DIR (outputs read
//! back with ffprobe, manifests, the JSON report) across reruns, failures, `kill -9`, Ctrl-C
//! and concurrent shards.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{asset, gpen, ok, probe_video, tool, video_pts};
use serde_json::Value;

const MANIFEST: &str = ".gpen-video-manifest.json";

/// Makes `n` clips of `frames` frames at 320x180 in `dir` (names `clip-I.mp4`, each cut from a
/// different point of the sample so their contents differ).
fn make_clips(dir: &Path, names: &[&str], frames: u32) {
    let src = asset("samples/test/astronaut.mp4");
    for (i, name) in names.iter().enumerate() {
        let out = dir.join(name);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let (ss, frames) = (format!("{:.2}", 0.1 * i as f64), frames.to_string());
        tool(
            "ffmpeg",
            &[
                "-v",
                "error",
                "-y",
                "-ss",
                &ss,
                "-i",
                src.to_str().unwrap(),
                "-frames:v",
                &frames,
                "-vf",
                "scale=320:180",
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-an",
                out.to_str().unwrap(),
            ],
        );
    }
}

/// Writes the portrait through the FFmpeg filter `vf` into `dest` (its extension picks the format).
fn portrait(dest: &Path, vf: &str) {
    let src = asset("samples/astronaut.png");
    let (src, dest) = (src.to_str().unwrap(), dest.to_str().unwrap());
    tool("ffmpeg", &["-v", "error", "-y", "-i", src, "-vf", vf, dest]);
}

/// `gpen-video batch IN OUT` with the fast stand-in model and encoder; the scheduler variables
/// of the environment the tests run in are cleared.
fn batch_cmd(input: &Path, output: &Path, extra: &[&str], env: &[(&str, &str)]) -> Command {
    batch_cmd_with("models/standin/identity-256.onnx", input, output, extra, env)
}

/// `gpen-video batch IN OUT` with the model `model` (a set-up file).
fn batch_cmd_with(model: &str, input: &Path, output: &Path, extra: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpen-video"));
    c.arg("batch")
        .arg(input)
        .arg(output)
        .args(["--model", asset(model).to_str().unwrap()])
        .args(["--preset", "ultrafast", "--quiet"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"));
    for v in [
        "JOB_COMPLETION_INDEX",
        "JOB_COMPLETIONS",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_COUNT",
        "GPEN_VIDEO_FAULTS",
    ] {
        c.env_remove(v);
    }
    c.envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child`, killing it and failing if it runs past `limit`.
fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("gpen-video batch did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

/// Runs a batch to the end with `--report`; returns the exit status, stderr and the report.
fn run(input: &Path, output: &Path, extra: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String, Value) {
    run_with("models/standin/identity-256.onnx", input, output, extra, env)
}

/// [`run`] with the model `model` (a set-up file).
fn run_with(
    model: &str,
    input: &Path,
    output: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (ExitStatus, String, Value) {
    let report = output.with_extension("report.json");
    std::fs::remove_file(&report).ok();
    let mut args = vec!["--report", report.to_str().unwrap()];
    args.extend_from_slice(extra);
    let child = batch_cmd_with(model, input, output, &args, env)
        .spawn()
        .expect("start gpen-video");
    let out = finish(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("no report ({e}): {err}"));
    (out.status, err, serde_json::from_str(&text).expect("report is JSON"))
}

/// The clip names of one report list (`done`, `skipped`, `failed`: objects; others: strings).
fn names(report: &Value, list: &str) -> BTreeSet<String> {
    report[list]
        .as_array()
        .unwrap_or_else(|| panic!("report has no `{list}`: {report}"))
        .iter()
        .map(|v| v.get("clip").unwrap_or(v).as_str().unwrap().to_string())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Clip keys of a manifest file (which must be valid JSON).
fn manifest_keys(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    v["clips"].as_object().expect("clips").keys().cloned().collect()
}

/// Every file under `dir` (relative, `/`-separated), hidden ones included.
fn files(dir: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(sub) = stack.pop() {
        for e in std::fs::read_dir(dir.join(&sub)).unwrap().flatten() {
            let rel = sub.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                stack.push(rel);
            } else {
                found.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    found
}

/// The outputs under `dir`: files not hidden (no manifest, no partial file), by relative path.
fn outputs(dir: &Path) -> BTreeSet<String> {
    files(dir)
        .into_iter()
        .filter(|f| !f.rsplit('/').next().unwrap().starts_with('.') && !f.ends_with(".json"))
        .collect()
}

fn no_partials(dir: &Path) {
    let left: Vec<String> = files(dir).into_iter().filter(|f| f.contains(".partial-")).collect();
    assert!(left.is_empty(), "partial files left: {left:?}");
}

/// Each output decodes to as many frames as its input.
fn complete(input: &Path, output: &Path, clips: &BTreeSet<String>) {
    for c in clips {
        let (i, o) = (video_pts(&input.join(c)).len(), video_pts(&output.join(c)).len());
        assert!(i > 0 && i == o, "{c}: input has {i} frames, output {o}");
    }
}

fn mtimes(dir: &Path, clips: &BTreeSet<String>) -> BTreeMap<String, SystemTime> {
    clips
        .iter()
        .map(|c| (c.clone(), std::fs::metadata(dir.join(c)).unwrap().modified().unwrap()))
        .collect()
}

/// Waits until `path` (a manifest) holds at least one clip, or fails after `limit`.
fn wait_for_entry(path: &Path, child: &mut Child, limit: Duration) {
    let start = Instant::now();
    loop {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains("\"input_size\"")) {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("gpen-video batch ended ({status}) before finishing a clip");
        }
        assert!(start.elapsed() < limit, "no clip finished within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {sig}");
}

#[test]
fn reruns_skip_finished_clips_and_redo_changed_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    make_clips(&input, &["a.mp4", "b.mkv", "sub/c.mp4"], 8);
    std::fs::write(input.join("notes.txt"), "not a video").unwrap();
    let all = set(&["a.mp4", "b.mkv", "sub/c.mp4"]);

    let (st, err, r) = run(&input, &output, &["--recursive"], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), all, "{err}");
    assert_eq!(names(&r, "not_video"), set(&["notes.txt"]));
    assert!(err.contains("notes.txt"), "non-video files are listed: {err}");
    assert_eq!(outputs(&output), all, "outputs mirror the inputs' relative paths");
    assert_eq!(manifest_keys(&output.join(MANIFEST)), all);
    complete(&input, &output, &all);
    let before = mtimes(&output, &all);

    // Nothing changed: nothing to do, no output touched.
    let (st, err, r) = run(&input, &output, &["--recursive"], &[]);
    assert!(st.success(), "{err}");
    assert!(names(&r, "done").is_empty(), "second run redid work: {err}");
    assert_eq!(names(&r, "skipped"), all);
    assert_eq!(
        mtimes(&output, &all),
        before,
        "outputs rewritten by a run with nothing to do"
    );

    // Changed input: only that clip is redone. An output the manifest does not vouch for (here
    // a stray file for a new clip) is never trusted.
    let later = SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .append(true)
        .open(input.join("b.mkv"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    make_clips(&input, &["d.mp4"], 6);
    std::fs::write(output.join("d.mp4"), "stale junk").unwrap();
    let (st, err, r) = run(&input, &output, &["--recursive"], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), set(&["b.mkv", "d.mp4"]), "{err}");
    assert_eq!(names(&r, "skipped"), set(&["a.mp4", "sub/c.mp4"]));
    assert_eq!(before["a.mp4"], mtimes(&output, &set(&["a.mp4"]))["a.mp4"]);
    complete(&input, &output, &set(&["b.mkv", "d.mp4"]));

    // Other settings redo everything; so does --force. Without --recursive, only the top level.
    let (st, err, r) = run(&input, &output, &["--crf", "30", "--glob", "*.mp4"], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), set(&["a.mp4", "d.mp4"]), "{err}");
    let (st, err, r) = run(&input, &output, &["--crf", "30", "--glob", "*.mp4"], &[]);
    assert!(st.success() && names(&r, "done").is_empty(), "{err}");
    let (st, err, r) = run(&input, &output, &["--crf", "30", "--glob", "a.*", "--force"], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), set(&["a.mp4"]), "{err}");
    no_partials(&output);

    // OUT_DIR == IN_DIR is refused.
    let out = batch_cmd(&input, &input, &[], &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("OUT_DIR is IN_DIR"));
}

#[test]
fn a_failing_clip_does_not_stop_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    make_clips(&input, &["a.mp4", "c.mp4"], 6);
    std::fs::write(input.join("b.mp4"), vec![7u8; 4096]).unwrap();

    // The sessions opened are logged: the face-identity model's once for both clips (the
    // engine keeps it from one clip to the next), not once per clip.
    let log = [("RUST_LOG", "warn,gpen_video::runtime=debug")];
    let (st, err, r) = run(&input, &output, &["--jobs", "1"], &log);
    assert_eq!(st.code(), Some(1), "{err}");
    assert_eq!(names(&r, "done"), set(&["a.mp4", "c.mp4"]), "{err}");
    assert_eq!(err.matches("opening the face-identity model").count(), 1, "{err}");
    assert_eq!(names(&r, "failed"), set(&["b.mp4"]));
    let reason = r["failed"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("b.mp4"), "reason names the clip: {reason}");
    assert!(
        err.contains("failed") && err.contains("b.mp4"),
        "summary lists the failure: {err}"
    );
    assert_eq!(outputs(&output), set(&["a.mp4", "c.mp4"]));
    assert_eq!(manifest_keys(&output.join(MANIFEST)), set(&["a.mp4", "c.mp4"]));
    complete(&input, &output, &set(&["a.mp4", "c.mp4"]));
    no_partials(&output);
}

#[test]
fn kill_9_then_rerun_processes_every_clip_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    let all = set(&["k0.mp4", "k1.mp4", "k2.mp4", "k3.mp4"]);
    make_clips(&input, &["k0.mp4", "k1.mp4", "k2.mp4", "k3.mp4"], 12);
    // A partial file left by some earlier dead process (nobody holds its lock).
    std::fs::create_dir_all(&output).unwrap();
    let old = SystemTime::now() - Duration::from_secs(120);
    let dead = output.join(".k3.mp4.partial-00000000deadbeef.mp4");
    std::fs::write(&dead, "half a video").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&dead)
        .unwrap()
        .set_modified(old)
        .unwrap();
    // One of a process still running (this test holds its lock, as a run on another machine
    // sharing the folder would): kept, however old.
    let live = output.join(".k2.mp4.partial-0123456789abcdef.mp4");
    std::fs::write(&live, "another run's video").unwrap();
    let live_lock = std::fs::File::options().write(true).open(&live).unwrap();
    live_lock.set_modified(old).unwrap();
    live_lock.lock().unwrap();

    let mut child = batch_cmd(&input, &output, &[], &[("GPEN_VIDEO_FAULTS", "slow=0:200")])
        .spawn()
        .unwrap();
    wait_for_entry(&output.join(MANIFEST), &mut child, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(150));
    signal(&child, "-9");
    let killed = finish(child, Duration::from_secs(10));
    assert_eq!(killed.status.code(), None, "killed by a signal");
    let recorded = manifest_keys(&output.join(MANIFEST));
    assert!(
        !recorded.is_empty() && recorded.len() < all.len(),
        "killed mid-batch: {recorded:?}"
    );
    // Whatever is under a final name is complete.
    complete(&input, &output, &outputs(&output));

    let (st, err, r) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "skipped"), recorded, "finished clips are not redone: {err}");
    let done = names(&r, "done");
    assert!(done.is_disjoint(&recorded));
    assert_eq!(&done | &recorded, all, "every clip is processed exactly once");
    assert_eq!(outputs(&output), all);
    assert_eq!(manifest_keys(&output.join(MANIFEST)), all);
    complete(&input, &output, &all);
    assert!(live.exists(), "a running process's partial file was removed");
    assert!(!dead.exists(), "a dead run's partial file was kept");
    drop(live_lock);
    std::fs::remove_file(&live).unwrap();
    no_partials(&output);
}

#[test]
fn ctrl_c_finishes_clips_in_flight_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    let all = set(&["i0.mp4", "i1.mp4", "i2.mp4", "i3.mp4"]);
    // Long enough that decoding cannot run ahead of a slowed model to the end of a clip: the
    // pipeline notices a cancel while it still decodes.
    make_clips(&input, &["i0.mp4", "i1.mp4", "i2.mp4", "i3.mp4"], 40);
    let report = tmp.path().join("r.json");
    let slow = [("GPEN_VIDEO_FAULTS", "slow=0:100")];

    // One Ctrl-C: the clip in flight finishes, no new one starts.
    let mut child = batch_cmd(&input, &output, &["--report", report.to_str().unwrap()], &slow)
        .spawn()
        .unwrap();
    wait_for_entry(&output.join(MANIFEST), &mut child, Duration::from_secs(60));
    signal(&child, "-INT");
    let out = finish(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["interrupted"], Value::Bool(true));
    let (done, not_started) = (names(&r, "done"), names(&r, "not_started"));
    assert!(done.len() >= 2, "the clip in flight was finished: {err}");
    assert!(!not_started.is_empty(), "no new clip starts after Ctrl-C: {err}");
    assert_eq!(&done | &not_started, all);
    assert_eq!(manifest_keys(&output.join(MANIFEST)), done);
    assert_eq!(outputs(&output), done);
    complete(&input, &output, &done);
    no_partials(&output);

    // Twice: the clip in flight is cancelled at once and leaves nothing.
    let mut child = batch_cmd(&input, &output, &["--report", report.to_str().unwrap()], &slow)
        .spawn()
        .unwrap();
    // A clip is in flight once its partial file exists.
    let start = Instant::now();
    while !files(&output).iter().any(|f| f.contains(".partial-")) {
        assert!(child.try_wait().unwrap().is_none(), "ended before starting a clip");
        assert!(start.elapsed() < Duration::from_secs(60), "no clip started");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&child, "-INT");
    std::thread::sleep(Duration::from_millis(100));
    signal(&child, "-INT");
    let t = Instant::now();
    let out = finish(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "stopped promptly");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let cancelled = names(&r, "cancelled");
    assert!(!cancelled.is_empty(), "the clip in flight was cancelled: {err}");
    assert!(
        outputs(&output).is_disjoint(&cancelled),
        "a cancelled clip left an output"
    );
    assert_eq!(manifest_keys(&output.join(MANIFEST)), &done | &names(&r, "done"));
    assert_eq!(outputs(&output), manifest_keys(&output.join(MANIFEST)));
    no_partials(&output);

    // A rerun finishes the rest.
    let (st, err, r) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(&names(&r, "done") | &names(&r, "skipped"), all);
    assert!(names(&r, "skipped").is_superset(&done));
    assert_eq!(outputs(&output), all);
    complete(&input, &output, &all);
}

#[test]
fn three_shards_process_every_clip_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    let list: Vec<String> = (0..7).map(|i| format!("s{i}.mp4")).collect();
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    let all = set(&list);
    make_clips(&input, &list, 6);

    // Three processes at once: an explicit K/N, a Slurm array task and a Kubernetes index.
    let spawn = |extra: &[&str], env: &[(&str, &str)], k: usize| {
        let report = tmp.path().join(format!("r{k}.json"));
        let mut args = vec!["--report".to_string(), report.to_str().unwrap().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (batch_cmd(&input, &output, &args, env).spawn().unwrap(), report)
    };
    let shards = [
        spawn(&["--shard", "0/3"], &[], 0),
        spawn(
            &["--shard", "auto"],
            &[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_COUNT", "3")],
            1,
        ),
        spawn(
            &["--shard", "auto", "--shard-count", "3"],
            &[("JOB_COMPLETION_INDEX", "2")],
            2,
        ),
    ];
    let mut union = BTreeSet::new();
    for (k, (child, report)) in shards.into_iter().enumerate() {
        let out = finish(child, Duration::from_secs(120));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "shard {k}: {err}");
        let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
        let mine = manifest_keys(&output.join(format!(".gpen-video-manifest.shard-{k}-of-3.json")));
        assert_eq!(names(&r, "done"), mine, "shard {k} records what it did");
        assert!(
            union.is_disjoint(&mine),
            "a clip done by two shards: {union:?} and {mine:?}"
        );
        union.extend(mine);
    }
    assert_eq!(union, all, "the shards together cover every clip");
    assert_eq!(outputs(&output), all);
    complete(&input, &output, &all);

    // Without sharding, every manifest is read: nothing is redone.
    let (st, err, r) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    assert!(names(&r, "done").is_empty(), "{err}");
    assert_eq!(names(&r, "skipped"), all);

    // `--shard auto` outside a scheduler says what is missing.
    let out = batch_cmd(&input, &output, &["--shard", "auto"], &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("JOB_COMPLETION_INDEX"));
}

/// `--report` never overwrites a clip, an output or a manifest, and a manifest path that is a
/// folder is refused before any clip runs: both fail at the start with nothing changed.
#[test]
fn bad_report_and_manifest_paths_fail_before_any_clip_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    make_clips(&input, &["r0.mp4", "r1.mp4"], 6);
    let clip = input.join("r0.mp4");
    let before = std::fs::read(&clip).unwrap();
    for report in [clip.clone(), output.join("r1.mp4"), output.join(MANIFEST)] {
        let child = batch_cmd(&input, &output, &["--report", report.to_str().unwrap()], &[])
            .spawn()
            .unwrap();
        let out = finish(child, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("is also"), "{err}");
    }
    assert_eq!(std::fs::read(&clip).unwrap(), before, "the clip is untouched");
    assert!(outputs(&output).is_empty(), "no clip ran");
    std::fs::create_dir_all(output.join(MANIFEST)).unwrap();
    let out = finish(
        batch_cmd(&input, &output, &[], &[]).spawn().unwrap(),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is a folder"), "{err}");
    assert!(outputs(&output).is_empty(), "no clip ran: {err}");
}

/// A folder of videos and still images: each image comes out as the same kind of image at the
/// mirrored path, in the same manifest; a broken image fails alone; a rerun redoes nothing but
/// the failure, and `--shard` splits stills like videos.
#[test]
fn mixed_folders_of_videos_and_images() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    make_clips(&input, &["a.mp4"], 4);
    std::fs::create_dir_all(input.join("photos")).unwrap();
    let src = asset("samples/astronaut.png");
    for name in ["photos/p.png", "photos/q.jpg", "r.webp"] {
        tool(
            "ffmpeg",
            &[
                "-v",
                "error",
                "-y",
                "-i",
                src.to_str().unwrap(),
                input.join(name).to_str().unwrap(),
            ],
        );
    }
    std::fs::write(input.join("broken.png"), vec![7u8; 2048]).unwrap();
    let good = set(&["a.mp4", "photos/p.png", "photos/q.jpg", "r.webp"]);

    let (st, err, r) = run(&input, &output, &["--recursive"], &[]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert_eq!(names(&r, "done"), good, "{err}");
    assert_eq!(names(&r, "failed"), set(&["broken.png"]));
    assert_eq!(outputs(&output), good, "outputs mirror the inputs");
    assert_eq!(manifest_keys(&output.join(MANIFEST)), good);
    for (name, magic) in [
        ("photos/p.png", &b"\x89PNG"[..]),
        ("photos/q.jpg", b"\xff\xd8\xff"),
        ("r.webp", b"RIFF"),
    ] {
        let bytes = std::fs::read(output.join(name)).unwrap();
        assert!(bytes.starts_with(magic), "{name} is written as its own kind of image");
    }
    complete(&input, &output, &set(&["a.mp4"]));
    no_partials(&output);

    // Resume: only the failure is tried again.
    let (st, err, r) = run(&input, &output, &["--recursive"], &[]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(names(&r, "done").is_empty(), "nothing redone: {err}");
    assert_eq!(names(&r, "failed"), set(&["broken.png"]));

    // Shards split the stills too: together they cover the folder once.
    let (a, b) = (tmp.path().join("s1"), tmp.path().join("s2"));
    let (_, _, r1) = run(&input, &a, &["--recursive", "--shard", "0/2"], &[]);
    let (_, _, r2) = run(&input, &b, &["--recursive", "--shard", "1/2"], &[]);
    let (d1, d2) = (names(&r1, "done"), names(&r2, "done"));
    assert!(d1.is_disjoint(&d2));
    let all: BTreeSet<String> = d1.union(&d2).cloned().collect();
    assert_eq!(all, good);
}

/// A PNG whose header is intact and whose picture data is scrambled: it probes as a picture and
/// fails only when decoded.
fn scramble_png_data(png: &[u8]) -> Vec<u8> {
    let mut b = png.to_vec();
    let mut i = 8;
    while i + 8 <= b.len() {
        let n = u32::from_be_bytes(b[i..i + 4].try_into().unwrap()) as usize;
        if &b[i + 4..i + 8] == b"IDAT" {
            b[i + 10..i + 8 + n].iter_mut().for_each(|v| *v ^= 0x5a);
        }
        i += 12 + n;
    }
    b
}

/// Issue 12: a folder of one-face portraits streams through one engine, so the crops of
/// consecutive pictures fill the batches (mean fill at least 0.95 with the exported GPEN-256;
/// one run per picture would fill a quarter of each). Every picture comes out as it does on its
/// own (each is a scene of its own, at its own size), a picture that fails to decode in the
/// middle of the stream fails alone, and a rerun skips them all.
#[test]
fn a_folder_of_portraits_streams_through_full_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    let mut good = Vec::new();
    for i in 0..20 {
        // Each a little different: another crop of the portrait, another size, some JPEG.
        let name = format!("p{i:02}.{}", if i % 5 == 4 { "jpg" } else { "png" });
        let (side, out) = (480 - 4 * i, 400 + 8 * i);
        let vf = format!("crop={side}:{side}:{}:{},scale={out}:{out}", 2 * i, 3 * (i % 5));
        let dest = input.join(&name);
        portrait(&dest, &vf);
        good.push(name);
    }
    let bad = scramble_png_data(&std::fs::read(input.join("p10.png")).unwrap());
    std::fs::write(input.join("p10-scrambled.png"), bad).unwrap();
    let good: BTreeSet<String> = good.into_iter().collect();
    let model = "models/gpen-bfr-256-random.onnx";

    let (st, err, r) = run_with(model, &input, &output, &["--batch", "4"], &[]);
    assert_eq!(st.code(), Some(1), "the scrambled picture fails: {err}");
    assert_eq!(names(&r, "done"), good, "{err}");
    assert_eq!(names(&r, "failed"), set(&["p10-scrambled.png"]), "{err}");
    let images = &r["images"];
    assert_eq!(images["images"], 20, "{images}");
    assert_eq!(images["faces"], 20, "one face per portrait: {images}");
    let fill = images["mean_fill"].as_f64().unwrap();
    assert!(
        fill >= 0.95,
        "mean batch fill {fill:.2} over a stream of portraits: {images}"
    );
    assert!(err.contains("mean fill"), "the summary gives the fill: {err}");
    assert_eq!(outputs(&output), good);
    no_partials(&output);
    for name in &good {
        let size = |f: &Path| probe_video(f, "stream=width,height");
        assert_eq!(size(&input.join(name)), size(&output.join(name)), "{name}");
    }
    // The picture the stream wrote is the one a run on it alone writes.
    let alone = tmp.path().join("alone.png");
    let m = asset(model);
    ok(&gpen(&[&input.join("p07.png"), &alone, &"--model", &m]));
    assert!(
        std::fs::read(&alone).unwrap() == std::fs::read(output.join("p07.png")).unwrap(),
        "p07.png streamed differs from p07.png run alone"
    );

    // Resume: every picture is vouched for; only the failure is tried again.
    let before = mtimes(&output, &good);
    let (st, err, r) = run_with(model, &input, &output, &["--batch", "4"], &[]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert_eq!(names(&r, "skipped"), good, "{err}");
    assert!(names(&r, "done").is_empty(), "{err}");
    assert_eq!(mtimes(&output, &good), before, "no picture rewritten");
}

/// A model that fails in the middle of an image stream fails the pictures the stream had taken
/// (with the model's error) and no other; the job goes on with a new stream on fresh sessions
/// for the pictures still queued. Every picture is reported once, under its own name: a picture
/// reported done has its output, a failed one has none.
#[test]
fn a_model_failure_fails_the_pictures_in_flight_and_a_new_stream_takes_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    let all: BTreeSet<String> = (0..48).map(|i| format!("s{i:02}.png")).collect();
    for (i, name) in all.iter().enumerate() {
        let vf = format!("crop={0}:{0},scale=160:160", 480 - 2 * i);
        let dest = input.join(name);
        portrait(&dest, &vf);
    }
    // Each stream's second model call fails; its first is slow, so the stream has taken as
    // many pictures as it holds (fewer than 48) by then.
    let faults = [("GPEN_VIDEO_FAULTS", "slow=0:300,fail=0:2")];
    let (st, err, r) = run(&input, &output, &[], &faults);
    assert_eq!(st.code(), Some(1), "{err}");
    let (done, failed) = (names(&r, "done"), names(&r, "failed"));
    assert!(done.is_disjoint(&failed), "{err}");
    assert_eq!(done.union(&failed).cloned().collect::<BTreeSet<_>>(), all, "{err}");
    assert_eq!(
        outputs(&output),
        done,
        "a picture is done exactly when its output is there"
    );
    assert!(done.len() >= 8, "two streams, one full call each: {err}");
    for f in r["failed"].as_array().unwrap() {
        assert!(f["reason"].as_str().unwrap().contains("injected failure"), "{f}");
    }
    no_partials(&output);
}

/// A symbolic link inside IN_DIR to a file outside it is skipped with a warning (on a shared
/// upload folder a link can name anyone's file); a link to a file inside is taken; with
/// `--follow-links-out` the outside one is taken too.
#[test]
fn links_that_leave_the_input_folder_are_skipped_unless_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output, elsewhere) = (tmp.path().join("in"), tmp.path().join("out"), tmp.path().join("secret"));
    make_clips(&input, &["a.mp4"], 6);
    make_clips(&elsewhere, &["s.mp4"], 6);
    std::os::unix::fs::symlink(elsewhere.join("s.mp4"), input.join("leak.mp4")).unwrap();
    std::os::unix::fs::symlink(input.join("a.mp4"), input.join("alias.mp4")).unwrap();

    let (st, err, r) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), set(&["a.mp4", "alias.mp4"]), "{err}");
    assert!(
        err.contains("leak.mp4") && err.contains("outside the input folder"),
        "the skipped link is named: {err}"
    );
    assert_eq!(outputs(&output), set(&["a.mp4", "alias.mp4"]));

    let (st, err, r) = run(&input, &output, &["--follow-links-out"], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), set(&["leak.mp4"]), "{err}");
}

/// `batch raw . --recursive` where `raw` has a subfolder `raw`: the output of `raw/raw/x.mp4`
/// would be `./raw/x.mp4`, an input. Refused before any work, naming the clip and the path;
/// every input is as it was and no output is written. An OUT_DIR above IN_DIR whose outputs all
/// land outside IN_DIR is fine.
#[test]
fn a_layout_that_would_write_over_an_input_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().join("top");
    let raw = top.join("raw");
    make_clips(&raw, &["x.mp4", "raw/x.mp4"], 6);
    let before = std::fs::read(raw.join("x.mp4")).unwrap();
    let out = finish(
        batch_cmd(&raw, &top, &["--recursive"], &[]).spawn().unwrap(),
        Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("inside the input folder, over an input") && err.contains("raw/x.mp4"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(raw.join("x.mp4")).unwrap(),
        before,
        "the input is untouched"
    );
    assert_eq!(files(&top), set(&["raw/x.mp4", "raw/raw/x.mp4"]), "nothing written");

    // Without --recursive the subfolder is not scanned: raw/x.mp4 goes to top/x.mp4.
    let out = finish(
        batch_cmd(&raw, &top, &[], &[]).spawn().unwrap(),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(top.join("x.mp4").is_file());
    assert_eq!(std::fs::read(raw.join("x.mp4")).unwrap(), before);
}

/// An output changed in place at the same size (zeroed) is no longer vouched for by the
/// manifest: a rerun redoes that clip, and leaves the untouched one alone.
#[test]
fn an_output_zeroed_in_place_is_redone() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    make_clips(&input, &["a.mp4", "b.mp4"], 6);
    let (st, err, _) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    let target = output.join("a.mp4");
    let size = std::fs::metadata(&target).unwrap().len() as usize;
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&target).unwrap();
        f.write_all(&vec![0u8; size]).unwrap();
    }
    assert_eq!(std::fs::metadata(&target).unwrap().len() as usize, size);
    let (st, err, r) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    assert_eq!(names(&r, "done"), set(&["a.mp4"]), "{err}");
    assert_eq!(names(&r, "skipped"), set(&["b.mp4"]));
    complete(&input, &output, &set(&["a.mp4", "b.mp4"]));
}

/// Two `batch` processes started together on the same folders, without shards: each clip
/// (videos and pictures) is restored by one of them only (a claim per clip); the clips the
/// other took are reported skipped, the shared manifest keeps every clip, and a rerun does
/// nothing.
#[test]
fn two_unsharded_batches_at_once_do_each_clip_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    let list: Vec<String> = (0..8).map(|i| format!("c{i}.mp4")).collect();
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    make_clips(&input, &list, 10);
    for i in 0..3 {
        portrait(&input.join(format!("p{i}.png")), "scale=256:-2");
    }
    let mut all = set(&list);
    all.extend((0..3).map(|i| format!("p{i}.png")));

    let spawn = |k: usize| {
        let report = tmp.path().join(format!("r{k}.json"));
        let child = batch_cmd(&input, &output, &["--report", report.to_str().unwrap()], &[])
            .spawn()
            .unwrap();
        (child, report)
    };
    let runs = [spawn(0), spawn(1)];
    let mut done = Vec::new();
    for (k, (child, report)) in runs.into_iter().enumerate() {
        let out = finish(child, Duration::from_secs(180));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "process {k}: {err}");
        let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
        let (d, s) = (names(&r, "done"), names(&r, "skipped"));
        assert!(d.is_disjoint(&s), "process {k}");
        assert_eq!(&d | &s, all, "process {k} accounts for every clip");
        done.push(d);
    }
    assert!(done[0].is_disjoint(&done[1]), "a clip restored twice: {done:?}");
    assert_eq!(&done[0] | &done[1], all, "every clip restored once");
    assert_eq!(
        manifest_keys(&output.join(MANIFEST)),
        all,
        "the manifest keeps both processes' clips"
    );
    assert_eq!(outputs(&output), all);
    no_partials(&output);
    let claims: Vec<_> = files(&output).into_iter().filter(|f| f.ends_with(".claim")).collect();
    assert!(claims.is_empty(), "claims left: {claims:?}");
    complete(&input, &output, &set(&list));

    let (st, err, r) = run(&input, &output, &[], &[]);
    assert!(st.success(), "{err}");
    assert!(names(&r, "done").is_empty(), "{err}");
}

/// A clip whose claim another process holds is not left undone when that process lets go
/// without finishing it (it failed or was stopped): the batch waits for the claim once its own
/// clips are done, then restores the clip itself.
#[test]
fn a_clip_another_process_gave_up_is_restored_after_all() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("out"));
    make_clips(&input, &["a.mp4", "b.mp4", "c.mp4"], 6);
    std::fs::create_dir_all(&output).unwrap();
    // "Another process" holds b.mp4's claim, then gives it up without an output.
    let claim = std::fs::File::create(output.join(".b.mp4.claim")).unwrap();
    claim.lock().unwrap();
    let report = tmp.path().join("r.json");
    let child = batch_cmd(&input, &output, &["--report", report.to_str().unwrap()], &[])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !(output.join("a.mp4").exists() && output.join("c.mp4").exists()) {
        assert!(start.elapsed() < Duration::from_secs(120), "a and c never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !output.join("b.mp4").exists(),
        "b was restored while its claim was held"
    );
    drop(claim);
    let out = finish(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    assert_eq!(names(&r, "done"), set(&["a.mp4", "b.mp4", "c.mp4"]), "{err}");
    complete(&input, &output, &set(&["a.mp4", "b.mp4", "c.mp4"]));
}
