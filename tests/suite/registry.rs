//! Registry tests: in, a tiny HTTP/1.1 server on 127.0.0.1 (a thread serving a fixed number of
//! canned responses, optionally holding the connection open without sending: a stalled server),
//! the stand-in models and the set-up's detector; out, assertions on what `fetch_url`, `fetch`,
//! `fetch_entry`, `gpen-video models fetch`, `verify_path` and `resolve_model` leave on disk,
//! say and exit with.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpen_video::api::registry::{self, Checksum, ModelFacts};
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A set-up file; a missing one fails the test with the fix.
fn asset(rel: &str) -> PathBuf {
    let p = root().join(rel);
    assert!(p.exists(), "{} is missing: run scripts/setup.sh first", p.display());
    p
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic test payload.
fn payload(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Serves `responses` in order, one per connection, then stops; gives up after 20 s without a
/// client. Returns the base URL and a handle yielding the request lines it saw.
fn serve(responses: Vec<Vec<u8>>) -> (String, JoinHandle<Vec<String>>) {
    serve_holding(responses.into_iter().map(|r| (r, Duration::ZERO)).collect())
}

/// [`serve`], each response followed by holding the connection open, silent, for its duration
/// before closing it.
fn serve_holding(responses: Vec<(Vec<u8>, Duration)>) -> (String, JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for (resp, hold) in responses {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut stream: TcpStream = loop {
                match listener.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => return seen,
                }
            };
            stream.set_nonblocking(false).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut req = Vec::new();
            let mut byte = [0u8; 1];
            while !req.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => req.push(byte[0]),
                    _ => break,
                }
            }
            let text = String::from_utf8_lossy(&req);
            seen.push(text.lines().next().unwrap_or("").to_string());
            let _ = stream.write_all(&resp);
            let _ = stream.flush();
            std::thread::sleep(hold);
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        seen
    });
    (base, handle)
}

fn ok_response(body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// Names of everything in `dir`.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn good_download_is_verified_and_lands_under_its_name() {
    let body = payload(300_000);
    let (base, server) = serve(vec![ok_response(&body)]);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("m.onnx");
    let got = registry::fetch_url(&format!("{base}/m.onnx"), &dest, Some(&sha_hex(&body)), false).unwrap();
    assert_eq!(got, dest);
    assert_eq!(std::fs::read(&dest).unwrap(), body);
    assert_eq!(listing(tmp.path()), ["m.onnx"], "no partial file left behind");
    assert_eq!(server.join().unwrap(), ["GET /m.onnx HTTP/1.1"]);
}

#[test]
fn bad_hash_leaves_nothing() {
    let body = payload(50_000);
    let (base, server) = serve(vec![ok_response(&body)]);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("m.onnx");
    let url = format!("{base}/m.onnx");
    let wrong = "0".repeat(64);
    let err = registry::fetch_url(&url, &dest, Some(&wrong), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sha256") && err.contains(&wrong), "{err}");
    assert!(err.contains(&sha_hex(&body)), "names the hash it got: {err}");
    assert!(err.contains(&url), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

#[test]
fn truncated_body_leaves_nothing() {
    let body = payload(40_000);
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n".to_vec();
    resp.extend_from_slice(&body);
    let (base, server) = serve(vec![resp]);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("m.onnx");
    let url = format!("{base}/m.onnx");
    let err = registry::fetch_url(&url, &dest, None, false).unwrap_err().to_string();
    assert!(err.contains(&url), "{err}");
    assert!(err.contains("100000") || err.contains("broke off"), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

#[test]
fn http_404_is_an_error_naming_the_status() {
    let resp = b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found".to_vec();
    let (base, server) = serve(vec![resp]);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("m.onnx");
    let url = format!("{base}/missing.onnx");
    let err = registry::fetch_url(&url, &dest, None, false).unwrap_err().to_string();
    assert!(err.contains("404") && err.contains(&url), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

#[test]
fn refused_connection_says_the_host_cannot_be_reached() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("m.onnx");
    let url = format!("http://127.0.0.1:{port}/m.onnx");
    let err = registry::fetch_url(&url, &dest, None, false).unwrap_err().to_string();
    assert!(err.contains("cannot reach 127.0.0.1"), "{err}");
    assert!(err.contains("no network"), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
}

#[test]
fn fetch_by_name_saves_under_the_registry_file_name() {
    // The detector has a sha256 on record: served from anywhere, it verifies by checksum.
    let body = std::fs::read(asset("models/centerface.onnx")).unwrap();
    let (base, server) = serve(vec![ok_response(&body)]);
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{base}/anything.onnx");
    let got = registry::fetch("CenterFace", Some(tmp.path()), Some(&url), false).unwrap();
    assert_eq!(got, tmp.path().join("centerface.onnx"));
    assert_eq!(std::fs::read(&got).unwrap(), body);
    assert_eq!(listing(tmp.path()), ["centerface.onnx"]);
    server.join().unwrap();
    // Present already: no second request (the server is gone), the file stays.
    let again = registry::fetch("centerface", Some(tmp.path()), Some(&url), false).unwrap();
    assert_eq!(again, got);
}

/// A one-entry registry for an enhancer with no checksum on record (like every GPEN-BFR entry),
/// `bytes` and `input_size` as given.
fn entry_without_checksum(bytes: u64, input_size: usize) -> registry::Entry {
    let toml = format!(
        "[[model]]\nname = \"test-model\"\nkind = \"enhancer\"\nfile = \"test-model.onnx\"\n\
         source = \"download\"\nurl = \"http://127.0.0.1:9/test-model.onnx\"\nsha256 = \"\"\n\
         bytes = {bytes}\ninput_size = {input_size}\nbatch = \"dynamic\"\ntemplate = \"ffhq\"\n\
         normalisation = \"[-1,1] RGB NCHW\"\n"
    );
    registry::Registry::parse(&toml).unwrap().models.remove(0)
}

#[test]
fn download_without_checksum_lands_only_if_size_and_contract_verify() {
    let model = std::fs::read(asset("models/standin/identity-256.onnx")).unwrap();
    let n = model.len() as u64;
    // Right size, GPEN's I/O contract, the crop size on record: kept.
    let (base, server) = serve(vec![ok_response(&model)]);
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{base}/m.onnx");
    let got = registry::fetch_entry(&entry_without_checksum(n, 256), Some(tmp.path()), Some(&url), false).unwrap();
    assert_eq!(std::fs::read(&got).unwrap(), model);
    assert_eq!(listing(tmp.path()), ["test-model.onnx"]);
    server.join().unwrap();
    // Size unknown (0): the contract alone decides; a model for another crop size is refused.
    for (bytes, size, why) in [(0, 512, "takes 512x512"), (n + 1, 256, "bytes")] {
        let (base, server) = serve(vec![ok_response(&model)]);
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("{base}/m.onnx");
        let err = registry::fetch_entry(
            &entry_without_checksum(bytes, size),
            Some(tmp.path()),
            Some(&url),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(why) && err.contains(&url) && err.contains("nothing was kept"),
            "{err}"
        );
        assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
        server.join().unwrap();
    }
    // A model file with the wrong contract (not [N,3,S,S]) is refused, size unknown.
    let bad = std::fs::read(asset("models/standin/bad-shape.onnx")).unwrap();
    let (base, server) = serve(vec![ok_response(&bad)]);
    let tmp = tempfile::tempdir().unwrap();
    let err = registry::fetch_entry(
        &entry_without_checksum(0, 256),
        Some(tmp.path()),
        Some(&format!("{base}/m.onnx")),
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not a usable enhancer model"), "{err}");
    assert!(!err.contains(".part-"), "names the partial file: {err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

/// `gpen-video models fetch NAME --to DIR --url URL` with extra environment.
fn cli_fetch(name: &str, dir: &Path, url: &str, env: &[(&str, &str)]) -> (bool, String, Duration) {
    let start = Instant::now();
    let out = common::gpen_env(&[&"models", &"fetch", &name, &"--to", &dir, &"--url", &url], env);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.code().is_some_and(|c| c == 0 || c == 1),
        "exit {:?} (a panic?): {err}",
        out.status
    );
    (out.status.success(), err, start.elapsed())
}

#[test]
fn an_html_page_is_not_kept_as_a_model_without_checksum() {
    let page = b"<html><body>Not Found</body></html>\r\n\r\n";
    assert_eq!(page.len(), 39);
    let (base, server) = serve(vec![ok_response(page)]);
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{base}/GPEN-BFR-512.onnx");
    let (ok, err, _) = cli_fetch("GPEN-BFR-512", tmp.path(), &url, &[]);
    assert!(!ok, "kept a 39-byte page: {err}");
    assert!(
        err.contains("not the model on record for GPEN-BFR-512") && err.contains("39 bytes"),
        "{err}"
    );
    assert!(err.contains("web page"), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
    // The same page already under the final name (from an older version) is not vouched for.
    std::fs::write(tmp.path().join("GPEN-BFR-512.onnx"), page).unwrap();
    let (ok, err, _) = cli_fetch("GPEN-BFR-512", tmp.path(), &url, &[]);
    assert!(
        !ok && err.contains("already there") && err.contains("delete it"),
        "{err}"
    );
}

#[test]
fn a_truncated_body_without_length_is_not_kept() {
    let model = std::fs::read(asset("models/standin/identity-256.onnx")).unwrap();
    let cut = &model[..model.len() * 2 / 3];
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n".to_vec();
    resp.extend_from_slice(cut);
    // GPEN-BFR-512 has its size on record; GPEN-BFR-1024 does not: the ONNX check catches it.
    for (name, why) in [
        ("GPEN-BFR-512", "284244491 bytes"),
        ("GPEN-BFR-1024", "not a usable enhancer model"),
    ] {
        let (base, server) = serve(vec![resp.clone()]);
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("{base}/{name}.onnx");
        let (ok, err, _) = cli_fetch(name, tmp.path(), &url, &[]);
        assert!(!ok, "{name}: kept a truncated body: {err}");
        assert!(err.contains(why) && err.contains("nothing was kept"), "{name}: {err}");
        assert!(listing(tmp.path()).is_empty(), "{name}: left {:?}", listing(tmp.path()));
        server.join().unwrap();
    }
}

#[test]
fn a_server_that_stalls_mid_body_is_given_up_after_the_stall_timeout() {
    let body = payload(40_000);
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n".to_vec();
    resp.extend_from_slice(&body);
    let (base, server) = serve_holding(vec![(resp, Duration::from_secs(6))]);
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{base}/GPEN-BFR-512.onnx");
    let (ok, err, took) = cli_fetch("GPEN-BFR-512", tmp.path(), &url, &[(registry::STALL_ENV, "1")]);
    assert!(!ok, "{err}");
    assert!(
        took < Duration::from_secs(4),
        "gave up after {took:?}, not about 1 s: {err}"
    );
    assert!(
        err.contains("stalled") && err.contains("40000 of 100000 bytes"),
        "{err}"
    );
    assert!(err.contains("answered") && !err.contains("no network"), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

/// Ctrl-C while the server is slow mid-body: the command ends at once (exit 130, not after the
/// stall timeout) and its partial file is gone.
#[test]
fn an_interrupted_fetch_removes_its_partial_file() {
    let body = payload(40_000);
    let mut resp = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n".to_vec();
    resp.extend_from_slice(&body);
    let (base, server) = serve_holding(vec![(resp, Duration::from_secs(8))]);
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{base}/GPEN-BFR-512.onnx");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpen-video"))
        .args(["models", "fetch", "GPEN-BFR-512", "--to"])
        .arg(tmp.path())
        .args(["--url", &url])
        .env(registry::STALL_ENV, "60")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let partial_with_bytes = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .any(|e| e.metadata().is_ok_and(|m| m.len() > 0))
    };
    while !partial_with_bytes() {
        assert!(child.try_wait().unwrap().is_none(), "the fetch ended early");
        assert!(start.elapsed() < Duration::from_secs(20), "no partial file appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "took {:?}",
        stopped.elapsed()
    );
    assert!(err.contains("interrupted") && err.contains("nothing was kept"), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

#[test]
fn a_host_that_accepts_but_never_answers_is_not_blamed_on_the_network() {
    let (base, server) = serve_holding(vec![(Vec::new(), Duration::from_secs(6))]);
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{base}/GPEN-BFR-512.onnx");
    let (ok, err, took) = cli_fetch("GPEN-BFR-512", tmp.path(), &url, &[(registry::STALL_ENV, "1")]);
    assert!(!ok && took < Duration::from_secs(4), "{took:?}: {err}");
    assert!(err.contains("accepted the connection"), "{err}");
    assert!(!err.contains("no network") && !err.contains("network is down"), "{err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
    server.join().unwrap();
}

#[test]
fn a_bad_stall_timeout_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, err, _) = cli_fetch(
        "GPEN-BFR-512",
        tmp.path(),
        "http://127.0.0.1:9/x.onnx",
        &[(registry::STALL_ENV, "0")],
    );
    assert!(!ok && err.contains(registry::STALL_ENV), "{err}");
}

#[test]
fn fetch_of_a_local_export_says_how_to_build_it() {
    let tmp = tempfile::tempdir().unwrap();
    let err = registry::fetch("gpen-bfr-512-random", Some(tmp.path()), None, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("python models/gpen_export.py --size 512"), "{err}");
    assert!(listing(tmp.path()).is_empty());
    let err = registry::fetch("no-such-model", Some(tmp.path()), None, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPEN-BFR-512"), "lists the known names: {err}");
}

#[test]
fn verify_reads_a_stand_in_enhancer() {
    let path = asset("models/standin/identity-256.onnx");
    let r = registry::verify_path(&path).unwrap();
    assert_eq!(r.sha256, sha_hex(&std::fs::read(&path).unwrap()));
    assert_eq!(r.checksum, Checksum::NoEntry);
    let ModelFacts::Enhancer { info, .. } = &r.facts else {
        panic!("not read as an enhancer: {r}");
    };
    assert_eq!(info.size, 256);
    assert_eq!(info.fixed_batch, None, "dynamic batch");
    assert_eq!(info.input, "input");
    assert!(info.weights_note.as_deref().unwrap_or("").contains("stand-in"), "{r}");
    let text = r.to_string();
    assert!(
        text.contains("size       256") && text.contains("batch      dynamic"),
        "{text}"
    );
    assert!(text.contains("stand-in (identity)"), "{text}");
}

#[test]
fn verify_reports_a_fixed_batch() {
    let r = registry::verify_path(&asset("models/standin/identity-512-batch1.onnx")).unwrap();
    let ModelFacts::Enhancer { info, .. } = &r.facts else {
        panic!("not read as an enhancer: {r}");
    };
    assert_eq!((info.size, info.fixed_batch), (512, Some(1)));
    assert!(r.to_string().contains("batch      fixed 1"), "{r}");
}

#[test]
fn verify_refuses_junk_and_wrong_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.onnx");
    std::fs::write(&junk, b"this is not an ONNX model at all").unwrap();
    let err = format!("{:#}", registry::verify_path(&junk).unwrap_err());
    assert!(err.contains("junk.onnx"), "{err}");
    let err = format!(
        "{:#}",
        registry::verify_path(&asset("models/standin/bad-shape.onnx")).unwrap_err()
    );
    assert!(err.contains("I/O contract"), "{err}");
    assert!(registry::verify_path(&tmp.path().join("absent.onnx")).is_err());
}

#[test]
fn verify_matches_the_detector_to_its_entry() {
    let r = registry::verify_path(&asset("models/centerface.onnx")).unwrap();
    assert_eq!(r.entry.as_ref().map(|e| e.name.as_str()), Some("centerface"));
    assert_eq!(r.checksum, Checksum::Match, "{r}");
    assert!(matches!(r.facts, ModelFacts::Detector { outputs: 4, .. }), "{r}");
}

/// The set-up's face mesh is the registry's, checked against the mesh's I/O, and a stand-in
/// enhancer is not taken for a mesh.
#[test]
fn verify_matches_the_face_mesh_to_its_entry() {
    let r = registry::verify_path(&asset("models/face-mesh.onnx")).unwrap();
    assert_eq!(r.entry.as_ref().map(|e| e.name.as_str()), Some("face-mesh"));
    assert_eq!(r.checksum, Checksum::Match, "{r}");
    assert!(matches!(r.facts, ModelFacts::Mesh), "{r}");
    assert!(r.to_string().contains("face mesh (I/O: ok)"), "{r}");
}

/// The set-up's hand models (MediaPipe's, converted by models/hand_export.py) are the registry's,
/// each checked against its own I/O; an enhancer under the hand model's file name is refused,
/// naming the file and what writes it.
#[test]
fn verify_matches_the_hand_models_to_their_entries() {
    for (file, name, says) in [
        ("models/palm-detect.onnx", "palm-detect", "palm detector (I/O: ok)"),
        (
            "models/hand-landmarks.onnx",
            "hand-landmarks",
            "hand landmarks (I/O: ok)",
        ),
    ] {
        let r = registry::verify_path(&asset(file)).unwrap();
        assert_eq!(r.entry.as_ref().map(|e| e.name.as_str()), Some(name));
        assert_eq!(r.checksum, Checksum::Match, "{r}");
        assert!(matches!(r.facts, ModelFacts::Hand { .. }), "{r}");
        assert!(r.to_string().contains(says), "{r}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let wrong = tmp.path().join("hand-landmarks.onnx");
    std::fs::copy(asset("models/standin/identity-512.onnx"), &wrong).unwrap();
    let err = format!("{:#}", registry::verify_path(&wrong).unwrap_err());
    assert!(err.contains("hand-landmarks.onnx"), "{err}");
    assert!(err.contains("models/hand_export.py"), "{err}");
}

/// The set-up's face-identity model (dlib's, converted) is the registry's, with a descriptor's I/O.
#[test]
fn verify_matches_the_identity_model_to_its_entry() {
    let r = registry::verify_path(&asset("models/face-id.onnx")).unwrap();
    assert_eq!(r.entry.as_ref().map(|e| e.name.as_str()), Some("face-id"));
    assert_eq!(r.checksum, Checksum::Match, "{r}");
    assert!(matches!(r.facts, ModelFacts::Identity { size: 150, dims: 128 }), "{r}");
}

#[test]
fn resolve_model_maps_names_to_files_under_models() {
    let p = registry::resolve_model("centerface").unwrap();
    assert!(p.ends_with("models/centerface.onnx"), "{}", p.display());
    assert!(p.is_file());
    // A path stays a path.
    let standin = asset("models/standin/identity-512.onnx");
    assert_eq!(registry::resolve_model(standin.to_str().unwrap()).unwrap(), standin);
    // A known download that is not here says how to get it.
    let reg = registry::registry().unwrap();
    let e = reg
        .models
        .iter()
        .find(|e| e.source == registry::Source::Download && e.local_path().is_none())
        .expect("the registry lists downloads that the set-up does not install");
    {
        let err = registry::resolve_model(&e.name).unwrap_err().to_string();
        assert!(
            err.contains(&format!("gpen-video models fetch {}", e.name)) && err.contains("not downloaded"),
            "{err}"
        );
    }
}

#[test]
fn a_download_that_needs_the_contract_check_fails_before_fetching_without_onnx_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-libonnxruntime.so");
    let (ok, err, _) = cli_fetch(
        "GPEN-BFR-512",
        tmp.path(),
        "http://127.0.0.1:9/x.onnx",
        &[("ORT_DYLIB_PATH", missing.to_str().unwrap())],
    );
    assert!(!ok, "{err}");
    assert!(
        err.contains("ONNX Runtime") && err.contains("no checksum on record"),
        "{err}"
    );
    assert!(!err.contains("cannot reach"), "tried the download first: {err}");
    assert!(listing(tmp.path()).is_empty(), "left {:?}", listing(tmp.path()));
}
