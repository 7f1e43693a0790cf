//! The command line as a newcomer meets it: no restorer is picked unasked (a stand-in runs only
//! when named), an existing OUT is kept unless `-y` (`-n` never replaces it), `--stats-json -`
//! writes to standard output, `-q` is silent on success and the tables come with `--stats`, a
//! clip without a face says so, and `serve` says where its page is. Runs here get only the
//! arguments and environment each test gives (`gpen_plain`).

use crate::common;

use common::*;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[test]
fn no_restorer_is_picked_unasked_and_a_named_stand_in_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (asset("samples/test/astronaut.mp4"), dir.path().join("out.mp4"));
    let r = gpen_plain(&[&input, &out, &"--frames", &"4"], &[]);
    let err = text(&r.stderr);
    assert!(!r.status.success(), "{err}");
    assert!(
        err.contains("no restorer") && err.contains("models fetch GPEN-BFR-512") && err.contains("--model"),
        "{err}"
    );
    assert!(!out.exists());
    let stand_in = asset("models/standin/identity-512.onnx");
    let r = gpen_plain(&[&input, &out, &"--frames", &"4", &"--model", &stand_in], &[]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let out2 = dir.path().join("out2.mp4");
    let r = gpen_plain(
        &[&input, &out2, &"--frames", &"4"],
        &[("GPEN_VIDEO_MODEL", stand_in.to_str().unwrap())],
    );
    assert!(r.status.success() && out2.is_file(), "{}", text(&r.stderr));
}

#[test]
fn an_existing_out_is_kept_unless_y_and_n_never_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let out = dir.path().join("out.mp4");
    std::fs::write(&out, b"the user's own file").unwrap();
    let model = asset("models/standin/negate-512.onnx");
    let run = |extra: &[&str]| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--frames", &"4", &"--model", &model];
        args.extend(extra.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
        gpen_plain(&args, &[])
    };
    let r = run(&[]);
    assert!(!r.status.success() && text(&r.stderr).contains("exists: pass -y to replace it"));
    assert_eq!(std::fs::read(&out).unwrap(), b"the user's own file");
    let r = run(&["-n"]);
    assert!(r.status.success() && text(&r.stderr).contains("kept as it is (-n)"));
    assert_eq!(std::fs::read(&out).unwrap(), b"the user's own file");
    let r = run(&["-y"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    assert_ne!(std::fs::read(&out).unwrap(), b"the user's own file");
    assert_eq!(rgb_frames(&out).2.len(), 4);
    assert!(!run(&["-y", "-n"]).status.success(), "-y and -n together are refused");
}

#[test]
fn quiet_is_silent_the_tables_come_with_stats_and_stats_json_goes_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/negate-512.onnx");
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--frames", &"6", &"--model", &model];
        // The guard's own warning about the negated face is not this test's.
        args.extend(AS_GIVEN.iter().chain(extra).map(|a| a as &dyn AsRef<std::ffi::OsStr>));
        let r = gpen_plain(&args, &[]);
        assert!(r.status.success(), "{}", text(&r.stderr));
        (text(&r.stdout), text(&r.stderr))
    };
    // The stand-in's own warning is the only line of a quiet run.
    let (stdout, stderr) = run("q.mp4", &["-q"]);
    assert!(stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].contains("stand-in (negate): not a restorer"),
        "{stderr}"
    );
    // By default one summary line, no tables.
    let (_, stderr) = run("default.mp4", &[]);
    assert!(stderr.contains("6 frames, 6 faces"), "{stderr}");
    assert!(!stderr.contains("core-ms/face"), "{stderr}");
    let (_, stderr) = run("stats.mp4", &["--stats"]);
    assert!(
        stderr.contains("core-ms/face") && stderr.contains("batches"),
        "{stderr}"
    );
    let (stdout, _) = run("json.mp4", &["-q", "--stats-json", "-"]);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["frames"], 6);
    assert!(!dir.path().join("-").exists() && !std::path::Path::new("-").exists());
}

#[test]
fn a_clip_without_a_face_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.mp4");
    let model = asset("models/standin/negate-512.onnx");
    let r = gpen_plain(
        &[
            &asset("samples/test/noface.mp4"),
            &out,
            &"--model",
            &model,
            &"--frames",
            &"6",
        ],
        &[],
    );
    let err = text(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("no face was found") && err.contains("re-encoded, unchanged"),
        "{err}"
    );
}

#[test]
fn serve_says_where_its_page_is() {
    let server = common::server::Server::start(&["--model", arg(&asset("models/standin/identity-256.onnx"))]);
    let log = server.log.lock().unwrap().clone();
    assert!(
        log.contains(&format!("the page: open http://{}/ in a browser", server.addr)),
        "{log}"
    );
    assert_eq!(server.stop(), Some(0));
}
