//! A `gpen-video serve` child on a loopback port for the end-to-end tests: in, its flags; out,
//! its address, its log, and a real HTTP client's requests to it (ureq).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{asset, tool};

/// A running service: the child and its address.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    /// The service's state folder (`XDG_STATE_HOME`: its default jobs folder is under it), so a
    /// test never writes under the user's home.
    pub state: tempfile::TempDir,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Self::start_env(extra, &[])
    }

    /// [`Server::start`] with `env` set besides.
    pub fn start_env(extra: &[&str], env: &[(&str, &Path)]) -> Server {
        let state = tempfile::tempdir().unwrap();
        let mut child = serve_command(extra, state.path())
            .env("GPEN_VIDEO_MODEL", asset("models/standin/identity-512.onnx"))
            .env("GPEN_VIDEO_PRESET", super::TEST_PRESET)
            .envs(env.iter().copied())
            .env("RUST_LOG", "gpen_video=info")
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let (mut line, mut before) = (String::new(), String::new());
        let addr = loop {
            line.clear();
            assert!(
                err.read_line(&mut line).unwrap() > 0,
                "serve ended before listening: {before}"
            );
            before.push_str(&line);
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        // The whole log, kept for the checks (and so the pipe never fills).
        let log = std::sync::Arc::new(std::sync::Mutex::new(before));
        let sink = log.clone();
        std::thread::spawn(move || {
            for l in err.lines().map_while(Result::ok) {
                sink.lock().unwrap().push_str(&(l + "\n"));
            }
        });
        let server = Server {
            child,
            addr,
            log,
            state,
        };
        for _ in 0..600 {
            if server.get("/healthz").0 == 200 {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("not ready after 30 s");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&self.url(path))
            .config()
            .http_status_as_error(false)
            .build()
            .call()
        {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// POSTs `body` to `path`: the status, the body and the Retry-After and X-Faces headers.
    pub fn post(&self, path: &str, body: &[u8]) -> (u16, Vec<u8>, Option<String>, Option<String>) {
        let r = ureq::post(&self.url(path))
            .config()
            .http_status_as_error(false)
            .build()
            .send(body)
            .expect("the service answers");
        let header = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (retry, faces) = (header("retry-after"), header("x-faces"));
        let status = r.status().as_u16();
        let mut body = Vec::new();
        r.into_body().into_reader().read_to_end(&mut body).unwrap();
        (status, body, retry, faces)
    }

    pub fn metric(&self, name: &str) -> f64 {
        let page = self.get("/metrics").1;
        page.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in {page}"))
    }

    /// Sends SIGTERM; the exit code.
    pub fn stop(mut self) -> Option<i32> {
        tool("kill", &["-TERM", &self.child.id().to_string()]);
        self.child.wait().unwrap().code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

impl Server {
    /// Any request: the status, the headers asked for (lower case) and the body.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        want: &[&str],
    ) -> (u16, Vec<Option<String>>, Vec<u8>) {
        let url = self.url(path);
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .allow_non_standard_methods(true)
            .max_redirects(0)
            .build()
            .into();
        let r = match body {
            Some(body) => agent.run(b.body(body.to_vec()).unwrap()),
            None => agent.run(b.body(()).unwrap()),
        }
        .expect("the service answers");
        let got = want
            .iter()
            .map(|n| r.headers().get(*n).and_then(|v| v.to_str().ok()).map(str::to_string))
            .collect();
        let status = r.status().as_u16();
        let mut bytes = Vec::new();
        r.into_body().into_reader().read_to_end(&mut bytes).unwrap();
        (status, got, bytes)
    }
}

impl Server {
    /// Posts a job (`query` without the leading `?`), waits until it is done (failing on a failed
    /// job or after two minutes) and returns its result's bytes.
    pub fn run_job(&self, query: &str, body: &[u8]) -> Vec<u8> {
        let (status, _, answer) = self.call("POST", &format!("/v1/jobs?{query}"), &[], Some(body), &[]);
        assert_eq!(status, 202, "{query}: {}", String::from_utf8_lossy(&answer));
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        let id = v["id"].as_str().unwrap().to_string();
        let start = std::time::Instant::now();
        loop {
            let (_, _, rec) = self.call("GET", &format!("/v1/jobs/{id}"), &[], None, &[]);
            let v: serde_json::Value = serde_json::from_slice(&rec).unwrap();
            if v["state"] == "done" {
                break;
            }
            assert!(v["state"] != "failed", "{query}: {v}");
            assert!(start.elapsed().as_secs() < 120, "{query}: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.call("GET", &format!("/v1/jobs/{id}/result"), &[], None, &[]).2
    }
}

/// `gpen-video serve` with `extra`: its exit code and log once it exits (at most 60 s), or a
/// failure if it is still running then.
pub fn serve_exits(extra: &[&dyn AsRef<std::ffi::OsStr>]) -> (Option<i32>, String) {
    let state = tempfile::tempdir().unwrap();
    let mut child = serve_command(extra, state.path()).spawn().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "serve still running 60 s after {:?}",
                extra.iter().map(|a| a.as_ref()).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = reader.join().unwrap();
    assert!(!log.contains("panicked"), "{log}");
    (status.code(), log)
}

/// `gpen-video serve` on a free loopback port with `extra`, its state under `state`, no user's
/// folders, this checkout's ONNX Runtime, its log piped.
fn serve_command<S: AsRef<std::ffi::OsStr>>(extra: &[S], state: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpen-video"));
    c.args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env("XDG_STATE_HOME", state)
        .env("XDG_CONFIG_HOME", super::no_user_dirs())
        .env("XDG_DATA_HOME", super::no_user_dirs())
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .stderr(Stdio::piped());
    c
}
