//! Helpers shared by the end-to-end test binaries: in, the set-up's clips and models; out, the
//! real binary's results and FFmpeg's own reading of its output files.
#![allow(dead_code)]

pub mod pg;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A set-up file; a missing one fails the test with the fix.
pub fn asset(rel: &str) -> PathBuf {
    let p = root().join(rel);
    assert!(p.exists(), "{} is missing: run scripts/setup.sh first", p.display());
    p
}

/// An empty folder this test process gives the binary as its XDG config and data folders, so no
/// test reads or writes the user's own models' list (a test that wants one sets its own).
pub fn no_user_dirs() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// The x264 preset the tests' runs and services get (see [`gpen_env`]).
pub const TEST_PRESET: &str = "ultrafast";

pub fn gpen(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    gpen_env(args, &[])
}

/// Runs the binary with extra environment, killing it (and failing) if it runs past 5 minutes:
/// a hang is a failure, not a stuck CI job. Runs and benchmarks get `--quiet --stats` (no
/// progress bar, the whole summary; `models` has neither), a run `-y` (each test's outputs are
/// its own), and GPEN_VIDEO_MODEL names the identity stand-in (a test that wants another passes
/// --model). GPEN_VIDEO_PRESET is x264's fastest preset: the medium preset users get is most of
/// a test run's CPU, and a test's frames are compared with its own runs' (a test about the
/// default encode passes `--preset medium`, which the variable gives way to).
pub fn gpen_env(args: &[&dyn AsRef<std::ffi::OsStr>], env: &[(&str, &str)]) -> Output {
    let first = args.first().map(|a| a.as_ref().to_string_lossy().to_string());
    let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = args.to_vec();
    if first.as_deref() != Some("models") {
        all.extend([&"--quiet" as &dyn AsRef<std::ffi::OsStr>, &"--stats"]);
    }
    if !matches!(first.as_deref(), Some("models" | "batch" | "serve" | "bench")) {
        all.push(&"-y");
    }
    let model = asset("models/standin/identity-512.onnx");
    let model = model.to_str().unwrap();
    let mut with: Vec<(&str, &str)> = vec![
        ("RUST_LOG", "warn"),
        ("GPEN_VIDEO_MODEL", model),
        ("GPEN_VIDEO_PRESET", TEST_PRESET),
    ];
    with.extend_from_slice(env);
    gpen_plain(&all, &with)
}

/// Runs the binary with these arguments and environment only (besides ONNX Runtime's library
/// and empty XDG folders; no RUST_LOG, GPEN_VIDEO_MODEL or GPEN_VIDEO_CPU from the caller's
/// environment), as a user's shell would, with the 5-minute limit of [`gpen_env`].
pub fn gpen_plain(args: &[&dyn AsRef<std::ffi::OsStr>], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpen-video"));
    c.args(args.iter().map(|a| a.as_ref()));
    c.env_remove("RUST_LOG")
        .env_remove("GPEN_VIDEO_MODEL")
        .env_remove("GPEN_VIDEO_CPU")
        .env_remove("GPEN_VIDEO_PRESET");
    c.env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"));
    c.env("XDG_CONFIG_HOME", no_user_dirs())
        .env("XDG_DATA_HOME", no_user_dirs());
    c.envs(env.iter().copied());
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("start gpen-video");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > std::time::Duration::from_secs(300) {
            child.kill().ok();
            panic!("gpen-video hung: killed after 5 minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("collect output")
}

pub fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "gpen-video failed: {err}");
    err
}

/// Runs FFmpeg quietly, overwriting its output; a failure fails the test with its message.
pub fn ffmpeg(args: &[&str]) {
    let mut all = vec!["-v", "error", "-y"];
    all.extend_from_slice(args);
    tool("ffmpeg", &all);
}

/// One picture of FFmpeg's lavfi `source` (e.g. `color=c=gray:s=16400x16`) written to `out`.
pub fn lavfi_picture(source: &str, out: &Path) {
    ffmpeg(&["-f", "lavfi", "-i", source, "-frames:v", "1", arg(out)]);
}

/// A path as a command-line argument (the tests' paths are UTF-8).
pub fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn tool(prog: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// One ffprobe field of the first video stream (`section=entry`), a value per line.
pub fn probe_video(f: &Path, entry: &str) -> String {
    let args = [
        "-v",
        "error",
        "-select_streams",
        "v:0",
        "-show_entries",
        entry,
        "-of",
        "default=nw=1:nk=1",
    ];
    let out = tool("ffprobe", &[&args[..], &[f.to_str().unwrap()]].concat());
    String::from_utf8_lossy(&out).into_owned()
}

/// Video frame timestamps (pts, in the stream's time base) as FFmpeg decodes them.
pub fn video_pts(f: &Path) -> Vec<i64> {
    probe_video(f, "frame=pts")
        .lines()
        .filter_map(|l| l.trim().trim_end_matches(',').parse().ok())
        .collect()
}

pub fn time_base(f: &Path) -> String {
    probe_video(f, "stream=time_base").trim().to_string()
}

/// Per-packet (`copy`) or per-decoded-frame hashes and timing of the streams `map` selects
/// (e.g. "0:a"), without the header.
pub fn framemd5(f: &Path, map: &str, copy: bool) -> Vec<String> {
    let mut args = vec!["-v", "error", "-i", f.to_str().unwrap(), "-map", map];
    if copy {
        args.extend(["-c", "copy"]);
    }
    args.extend(["-f", "framemd5", "-"]);
    let out = tool("ffmpeg", &args);
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Per-packet hashes and timing of the streams selected by `map` (e.g. "0:a"), without header.
pub fn packet_md5(f: &Path, map: &str) -> Vec<String> {
    framemd5(f, map, true)
}

/// All frames as packed RGB24, with the picture size.
pub fn rgb_frames(f: &Path) -> (usize, usize, Vec<Vec<u8>>) {
    let w: usize = probe_video(f, "stream=width").trim().parse().unwrap();
    let h: usize = probe_video(f, "stream=height").trim().parse().unwrap();
    let raw = tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            // The stored picture, as --faces-json's coordinates are.
            "-noautorotate",
            "-i",
            f.to_str().unwrap(),
            // Every decoded frame once: no duplicates to fill gaps in the timeline.
            "-fps_mode",
            "passthrough",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
    );
    (w, h, raw.chunks_exact(w * h * 3).map(<[u8]>::to_vec).collect())
}

/// Face regions per frame from `--faces-json`: (x0, y0, x1, y1) lists, and box lists.
pub type Rect = [f64; 4];
pub fn faces_json(f: &Path) -> Faces {
    let text = std::fs::read_to_string(f).unwrap();
    let nums = |s: &str| -> Vec<Rect> {
        s.split('[')
            .filter_map(|chunk| {
                let v: Vec<f64> = chunk
                    .split(']')
                    .next()?
                    .split(',')
                    .filter_map(|x| x.trim().parse().ok())
                    .collect();
                (v.len() == 4).then(|| [v[0], v[1], v[2], v[3]])
            })
            .collect()
    };
    text.lines()
        .filter(|l| l.starts_with("{\"frame\""))
        .map(|l| {
            let regions = l
                .split("\"regions\":[")
                .nth(1)
                .unwrap()
                .split("],\"faces\"")
                .next()
                .unwrap();
            let faces = l.split("\"faces\":").nth(1).unwrap();
            (nums(regions), nums(faces))
        })
        .collect()
}

pub fn inside(r: &[Rect], x: usize, y: usize, margin: f64) -> bool {
    r.iter().any(|b| {
        (x as f64) >= b[0] - margin
            && (x as f64) < b[2] + margin
            && (y as f64) >= b[1] - margin
            && (y as f64) < b[3] + margin
    })
}

/// PSNR between two frames over the pixels `keep` selects, and how many pixels that was.
pub fn psnr(a: &[u8], b: &[u8], w: usize, keep: impl Fn(usize, usize) -> bool) -> (f64, usize) {
    let (mut se, mut n) = (0.0f64, 0usize);
    for (i, (pa, pb)) in a.chunks_exact(3).zip(b.chunks_exact(3)).enumerate() {
        if keep(i % w, i / w) {
            for c in 0..3 {
                se += (pa[c] as f64 - pb[c] as f64).powi(2);
            }
            n += 3;
        }
    }
    let mse = se / n.max(1) as f64;
    (
        if mse == 0.0 {
            99.0
        } else {
            10.0 * (255.0f64.powi(2) / mse).log10()
        },
        n / 3,
    )
}

pub fn plain_reencode(input: &Path, out: &Path) {
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-y",
            // Stored as the input is stored, as gpen-video keeps it (with its display matrix).
            "-noautorotate",
            "-i",
            input.to_str().unwrap(),
            "-map",
            "0:v:0",
            "-c:v",
            "libx264",
            "-crf",
            "18",
            // The encode the tests' runs get (GPEN_VIDEO_PRESET, see `gpen_env`).
            "-preset",
            TEST_PRESET,
            "-pix_fmt",
            "yuv420p",
            out.to_str().unwrap(),
        ],
    );
}

pub fn batches(stderr: &str) -> u64 {
    let line = stderr.lines().find(|l| l.contains(" batches, ")).expect("summary line");
    line.split(" batches")
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs a failing case: non-zero exit, a message naming the problem, no output and no partial
/// file left behind.
pub fn fails(input: &Path, out: &Path, extra: &[&dyn AsRef<std::ffi::OsStr>], expect: &str) {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out];
    args.extend_from_slice(extra);
    let r = gpen(&args);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "exit code for `{expect}`: {err}");
    assert!(err.contains(expect), "expected `{expect}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists() || out == input, "no output for `{expect}`");
    if let Some(dir) = out.parent().filter(|d| d.is_dir()) {
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
            .collect();
        assert!(left.is_empty(), "partial file left for `{expect}`");
    }
}

/// PSNR over the whole clip from per-frame PSNRs of equal pixel counts (mean of the MSEs).
pub fn mean_psnr(frames: &[f64]) -> f64 {
    let mse: f64 = frames
        .iter()
        .map(|p| 255.0f64.powi(2) / 10f64.powf(p / 10.0))
        .sum::<f64>()
        / frames.len() as f64;
    10.0 * (255.0f64.powi(2) / mse).log10()
}

/// Runs `model` on `input` with `--faces-json`, and a plain re-encode with the same settings:
/// the faces per frame, the picture width, and both outputs' decoded frames.
pub fn run_against_plain(dir: &Path, input: &Path, model: &Path) -> FacesAndFrames {
    let plain = dir.join("plain.mp4");
    let (out, faces, _) = run_with_faces(dir, input, "run.mp4", model, &[]);
    plain_reencode(input, &plain);
    let (w, _, got) = rgb_frames(&out);
    let (_, _, want) = rgb_frames(&plain);
    assert_eq!(got.len(), want.len());
    (faces, w, got, want)
}

/// Each frame's face regions and boxes, from `--faces-json`.
pub type Faces = Vec<(Vec<Rect>, Vec<Rect>)>;

/// The restorer's change pasted as it gave it: no colour fix, no identity guard. The negate
/// stand-in makes someone else of a face (the guard would hold it back) and its change is mostly
/// a low band (the colour fix would keep it out): the tests of where and how a change lands run
/// with these; tests/suite/faithful.rs tests the two defaults themselves.
pub const AS_GIVEN: [&str; 4] = ["--color-fix", "off", "--identity-guard", "off"];

/// Runs the binary on `input` with `model`, [`AS_GIVEN`] and `extra` flags, writing `dir/name`
/// and its `--faces-json` beside it; returns the output path, the faces and what it printed.
pub fn run_with_faces(
    dir: &Path,
    input: &Path,
    name: &str,
    model: &Path,
    extra: &[&dyn AsRef<std::ffi::OsStr>],
) -> (PathBuf, Faces, String) {
    let (out, json) = (dir.join(name), dir.join(format!("{name}.faces.json")));
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &model, &"--faces-json", &json];
    args.extend(AS_GIVEN.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
    args.extend_from_slice(extra);
    let err = ok(&gpen(&args));
    (out, faces_json(&json), err)
}

pub type FacesAndFrames = (Faces, usize, Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Runs the binary on `input` with the identity-256 stand-in, `--stats-json` and `env`; returns
/// the stats JSON.
pub fn identity_run_stats(dir: &Path, input: &Path, env: &[(&str, &str)]) -> String {
    let (out, stats) = (dir.join("stats-run.mp4"), dir.join("stats-run.json"));
    ok(&gpen_env(
        &[
            &input,
            &out,
            &"--model",
            &asset("models/standin/identity-256.onnx"),
            &"--stats-json",
            &stats,
        ],
        env,
    ));
    std::fs::read_to_string(&stats).unwrap()
}

/// The whole number after `"key":` in a JSON text.
pub fn json_number(json: &str, key: &str) -> u64 {
    let at = json
        .split(&format!("\"{key}\":"))
        .nth(1)
        .unwrap_or_else(|| panic!("{key} missing in {json}"));
    let end = at.find(|c: char| !c.is_ascii_digit()).unwrap_or(at.len());
    at[..end]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

/// At least `percent` % of the frames have a face.
pub fn assert_faces_found(frames: &Faces, percent: usize) {
    let found = frames.iter().filter(|(_, b)| !b.is_empty()).count();
    assert!(
        !frames.is_empty() && found * 100 >= frames.len() * percent,
        "faces in {found} of {} frames",
        frames.len()
    );
}

/// A model that inverts colours changed the middle of every face box (PSNR under 15 dB) and
/// nothing outside the pasted regions (over 36 dB per frame, 40 over the clip), `got` against
/// a plain re-encode `want`.
pub fn assert_change_only_on_faces(faces: &Faces, w: usize, got: &[Vec<u8>], want: &[Vec<u8>]) {
    assert_eq!(got.len(), want.len());
    let mut all = Vec::new();
    for (i, (g, p)) in got.iter().zip(want).enumerate() {
        let (regions, boxes) = &faces[i];
        let (outside, _) = psnr(g, p, w, |x, y| !inside(regions, x, y, 2.0));
        assert!(outside > 36.0, "frame {i}: PSNR outside faces {outside:.1} dB");
        all.push(outside);
        let core: Vec<Rect> = boxes
            .iter()
            .map(|b| {
                let (cx, cy, hw, hh) = (
                    (b[0] + b[2]) / 2.0,
                    (b[1] + b[3]) / 2.0,
                    (b[2] - b[0]) / 4.0,
                    (b[3] - b[1]) / 4.0,
                );
                [cx - hw, cy - hh, cx + hw, cy + hh]
            })
            .collect();
        if !core.is_empty() {
            let (face, n) = psnr(g, p, w, |x, y| inside(&core, x, y, 0.0));
            assert!(
                n > 0 && face < 15.0,
                "frame {i}: face not changed (PSNR {face:.1} dB over {n} px)"
            );
        }
    }
    let mean = mean_psnr(&all);
    assert!(mean > 40.0, "PSNR outside faces over the clip {mean:.1} dB");
}

/// `jpeg` with an EXIF APP1 segment holding only Orientation = `o`, right after its SOI marker.
pub fn with_orientation(jpeg: &[u8], o: u16) -> Vec<u8> {
    assert_eq!(&jpeg[..2], [0xff, 0xd8], "a JPEG");
    // A little-endian TIFF header, one IFD with one SHORT entry (0x0112), no next IFD.
    let mut tiff = b"II\x2a\x00\x08\x00\x00\x00\x01\x00\x12\x01\x03\x00\x01\x00\x00\x00".to_vec();
    tiff.extend_from_slice(&o.to_le_bytes());
    tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xff, 0xe1]);
    out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// A listener on loopback counting the connections made to it, and its port.
pub fn listener() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(c);
        }
    });
    (port, hits)
}

/// A clip of `seconds` at 30 fps with a keyframe every second, from the shipped portrait
/// moving a little (so a film is cut into one-second segments), with a tone.
/// A 256 px JPEG of the sample portrait, `DIR/portrait.jpg`: the jobs tests' photo.
pub fn portrait_jpeg(dir: &Path) -> PathBuf {
    let out = dir.join("portrait.jpg");
    ffmpeg(&[
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-vf",
        "scale=256:256",
        "-q:v",
        "4",
        arg(&out),
    ]);
    out
}

pub fn moving_portrait(dir: &Path, seconds: u32) -> PathBuf {
    let out = dir.join(format!("clip-{seconds}s.mp4"));
    ffmpeg(&[
        "-loop",
        "1",
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-f",
        "lavfi",
        "-i",
        &format!("sine=frequency=440:duration={seconds}"),
        "-vf",
        "scale=640:640,crop=480:360:x='80+40*sin(t)':y=60,format=yuv420p",
        "-r",
        "30",
        "-t",
        &seconds.to_string(),
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-g",
        "30",
        "-c:a",
        "aac",
        "-shortest",
        arg(&out),
    ]);
    out
}

/// The hand of handSrc.jpg (Debian's opencv-doc, through the set-up), turned fingers up (its
/// wrist at the bottom edge) and scaled to `height` pixels: packed RGB and which pixels are the
/// hand (the background is grey, the skin redder than it is blue).
pub struct Cutout {
    pub w: usize,
    pub h: usize,
    pub rgb: Vec<u8>,
    pub hand: Vec<bool>,
}

pub fn cutout(height: u32) -> Cutout {
    let photo = image::open(asset("samples/hands/handSrc.jpg")).unwrap().to_rgb8();
    // A quarter turn counterclockwise: the fingers, pointing right, point up.
    let up = image::imageops::rotate270(&photo);
    let w = (f64::from(up.width()) * f64::from(height) / f64::from(up.height())).round() as u32;
    let small = image::imageops::resize(&up, w, height, image::imageops::FilterType::Triangle);
    let hand = small.pixels().map(|p| i32::from(p[0]) - i32::from(p[2]) > 20).collect();
    Cutout {
        w: w as usize,
        h: height as usize,
        rgb: small.into_raw(),
        hand,
    }
}
