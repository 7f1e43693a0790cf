//! The Python wheel (scripts/wheel.sh): in, the release build this test binary came with, the
//! set-up's models and the sample clip; out, assertions that the wheel installed into a fresh
//! virtual environment outside the checkout runs from an empty folder without ORT_DYLIB_PATH or
//! LD_LIBRARY_PATH, gives the frames the checkout's build gives, takes every FFmpeg library from
//! the installed package, serves `gpen_video.restore`, and keeps downloads and the user's
//! models in the XDG folders, never in site-packages.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use common::{arg, asset, framemd5, root};

/// The ONNX Runtime the set-up installs (scripts/setup.sh), so both builds run the same one.
const ORT_VERSION: &str = "1.31.1";

fn run(c: &mut Command) -> Output {
    let out = c.output().unwrap_or_else(|e| panic!("cannot start {c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The installed command's environment: a user's shell with nothing of the set-up's, its home
/// and XDG folders under `home`.
fn clean<'a>(c: &'a mut Command, venv: &Path, home: &Path) -> &'a mut Command {
    c.env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", venv.join("bin").display()))
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("RUST_LOG", "warn")
}

/// Every file under `dir`, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| e.unwrap().into_path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// Serves `body` once over HTTP on a loopback port; returns the URL.
fn serve_once(body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/centerface.onnx", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = Vec::new();
        let mut byte = [0u8; 1];
        while !req.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            req.push(byte[0]);
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes()).and_then(|()| s.write_all(&body));
    });
    url
}

#[test]
fn the_wheel_installs_and_runs_like_the_checkout_build() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let clip = asset("samples/test/astronaut.mp4");
    let model = asset("models/gpen-bfr-256-random.onnx");

    // The wheel, from the release build this test came with.
    let started = Instant::now();
    let built = run(Command::new(root().join("scripts/wheel.sh"))
        .args(["--bin", env!("CARGO_BIN_EXE_gpen-video"), "--out"])
        .arg(t.join("dist")));
    let whl = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
    let name = whl.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-py3-none-manylinux_2_36_x86_64.whl"), "{name}");
    let mb = std::fs::metadata(&whl).unwrap().len() as f64 / 1e6;
    eprintln!(
        "wheel {name}: {mb:.1} MB, built in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // A fresh virtual environment outside the checkout; onnxruntime and its dependencies from
    // the cache in .deps/wheels (filled from the package index the first time).
    let venv = t.join("venv");
    let home = t.join("home");
    let empty = t.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let cache = root().join(".deps/wheels");
    let started = Instant::now();
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    let pip = venv.join("bin/pip");
    let install = |offline: bool| {
        let mut c = Command::new(&pip);
        c.args(["install", "-q", "--disable-pip-version-check"]);
        if offline {
            c.arg("--no-index");
        }
        c.arg("--find-links")
            .arg(&cache)
            .arg(&whl)
            .arg(format!("onnxruntime=={ORT_VERSION}"));
        c.output().unwrap()
    };
    if !install(true).status.success() {
        run(Command::new(root().join(".deps/venv/bin/python"))
            .args([
                "-m",
                "pip",
                "download",
                "-q",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "-d",
            ])
            .arg(&cache)
            .arg(format!("onnxruntime=={ORT_VERSION}")));
        let again = install(true);
        assert!(
            again.status.success(),
            "pip install failed:\n{}",
            String::from_utf8_lossy(&again.stderr)
        );
    }
    let site = PathBuf::from(
        String::from_utf8_lossy(
            &run(Command::new(venv.join("bin/python")).args([
                "-c",
                "import gpen_video, os; print(os.path.dirname(os.path.dirname(gpen_video.__file__)))",
            ]))
            .stdout,
        )
        .trim(),
    );
    let package = site.join("gpen_video");
    // The hand models the default `--occlusion hands` runs with.
    for m in ["models/palm-detect.onnx", "models/hand-landmarks.onnx"] {
        assert!(package.join(m).is_file(), "{m} is not in the wheel");
    }
    let before = files(&package);

    // The installed command, from an empty folder, without the set-up's environment.
    let got = t.join("wheel.mp4");
    run(clean(&mut Command::new(venv.join("bin/gpen-video")), &venv, &home)
        .current_dir(&empty)
        .arg(&clip)
        .arg(&got)
        .args(["--quiet", "-y", "--frames", "20", "--model"])
        .arg(&model));
    let took = started.elapsed().as_secs_f64();
    eprintln!(
        "pip install to a finished run (20 frames of {}): {took:.1} s",
        clip.display()
    );

    // The checkout's own build on the same clip gives the same frames.
    let want = t.join("checkout.mp4");
    common::ok(&common::gpen_plain(
        &[&clip, &want, &"--quiet", &"-y", &"--frames", &"20", &"--model", &model],
        &[("RUST_LOG", "warn")],
    ));
    let (a, b) = (framemd5(&got, "0:v", false), framemd5(&want, "0:v", false));
    assert_eq!(a.len(), 20, "the clip's first 20 frames");
    assert_eq!(a, b, "the installed command's frames differ from the checkout build's");

    // Every FFmpeg library (and encoder) the installed executable loads is the package's own.
    let exe = package.join("bin/gpen-video");
    let ldd = String::from_utf8_lossy(&run(Command::new("ldd").arg(&exe)).stdout).into_owned();
    assert!(!ldd.contains("not found"), "{ldd}");
    let lib = package.join("lib");
    let ffmpeg: Vec<&str> = ldd
        .lines()
        .filter(|l| {
            ["libav", "libsw", "libx264", "libx265"]
                .iter()
                .any(|p| l.trim_start().starts_with(p))
        })
        .collect();
    assert!(ffmpeg.len() >= 7, "FFmpeg's libraries and encoders in ldd:\n{ldd}");
    let lib = lib.canonicalize().unwrap();
    for l in &ffmpeg {
        let path = l.split("=> ").nth(1).and_then(|r| r.split(" (").next()).unwrap_or("");
        let path = Path::new(path).canonicalize().unwrap_or_default();
        assert!(path.starts_with(&lib), "not from the package: {l}");
    }
    let system: Vec<&str> = ldd
        .lines()
        .filter(|l| l.contains("=> /") && !l.contains(&*site.to_string_lossy()))
        .collect();
    eprintln!(
        "ldd: {} libraries from {}, from the system only:\n{}",
        ffmpeg.len(),
        lib.display(),
        system.join("\n")
    );

    // The Python module: the run's statistics, and the command's own error for a missing input.
    let script = format!(
        r#"
import gpen_video, sys
stats = gpen_video.restore({clip:?}, "py.mp4", model={model:?}, frames=5, overwrite=True, quiet=True)
assert stats["frames"] == 5, stats
try:
    gpen_video.restore("missing.mp4", "never.mp4", model={model:?}, quiet=True, echo=False)
    sys.exit("no error for a missing input")
except gpen_video.Error as e:
    assert "missing.mp4" in e.message and e.returncode != 0, (e.message, e.returncode)
    print(e.returncode, e.message)
import os, shutil, tempfile
with tempfile.TemporaryDirectory() as t:
    clips, restored = os.path.join(t, "clips"), os.path.join(t, "restored")
    os.makedirs(clips)
    shutil.copy({clip:?}, os.path.join(clips, "one.mp4"))
    report = gpen_video.restore_folder(clips, restored, model={model:?}, frames=3, quiet=True)
    assert [d["clip"] for d in report["done"]] == ["one.mp4"] and not report["failed"], report
    assert os.path.isfile(os.path.join(restored, "one.mp4"))
"#,
        clip = arg(&clip),
        model = arg(&model),
    );
    let py = run(clean(&mut Command::new(venv.join("bin/python")), &venv, &home)
        .current_dir(&empty)
        .args(["-c", &script]));
    eprintln!("gpen_video.Error: {}", String::from_utf8_lossy(&py.stdout).trim());
    let help =
        run(clean(&mut Command::new(venv.join("bin/python")), &venv, &home).args(["-m", "gpen_video", "--version"]));
    assert!(String::from_utf8_lossy(&help.stdout).contains("gpen-video"));

    // `models fetch` and `models add` write to the XDG folders, never into the package.
    let url = serve_once(std::fs::read(asset("models/centerface.onnx")).unwrap());
    let gv = venv.join("bin/gpen-video");
    run(clean(&mut Command::new(&gv), &venv, &home).current_dir(&empty).args([
        "models",
        "fetch",
        "CenterFace",
        "--url",
        &url,
    ]));
    assert!(home.join("data/gpen-video/models/centerface.onnx").is_file());
    let batch1 = asset("models/standin/ff-gpen-bfr-256.onnx");
    run(clean(&mut Command::new(&gv), &venv, &home)
        .current_dir(&empty)
        .args(["models", "add"])
        .arg(&batch1)
        .args(["--name", "mine"]));
    assert!(home.join("config/gpen-video/models.toml").is_file());
    assert_eq!(
        files(&home.join("data/gpen-video/models")).len(),
        2,
        "the download and the batched copy"
    );
    assert_eq!(
        files(&package)
            .into_iter()
            .filter(|p| !p.to_string_lossy().contains("__pycache__"))
            .collect::<Vec<_>>(),
        before
            .into_iter()
            .filter(|p| !p.to_string_lossy().contains("__pycache__"))
            .collect::<Vec<_>>(),
        "the installed package changed"
    );
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        1,
        "only py.mp4 in the working folder"
    );
}
