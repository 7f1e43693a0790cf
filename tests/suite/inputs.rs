//! Inputs from strangers: in, crafted files and names (playlists that list other files and
//! addresses, names that spell FFmpeg protocols) beside a "secret" clip and a local HTTP
//! listener; out, assertions that gpen-video reads only the file it was given: the secret
//! never reaches an output, the listener sees no connection, a playlist is refused with a
//! message that says why, and a file whose name spells a protocol is read as the file it is.

use crate::common;

use std::path::Path;
use std::sync::atomic::Ordering;

use common::*;

/// A small clip of `size` (a test pattern, no face) at `path`.
fn clip(path: &Path, size: &str, frames: u32) {
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        &format!("testsrc2=s={size}:r=25"),
        "-frames:v",
        &frames.to_string(),
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        path.to_str().unwrap(),
    ]);
}

/// An HLS playlist saved as `upload.mp4` that lists a secret segment by a relative path, by a
/// `file://` URL and by an address on loopback: refused, with a message naming what it asked
/// for, no output, and no connection made.
#[test]
fn a_playlist_named_like_a_video_is_refused_and_nothing_it_lists_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let (secret_dir, up) = (dir.path().join("secret"), dir.path().join("up"));
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::create_dir_all(&up).unwrap();
    let secret = secret_dir.join("secret.ts");
    // MPEG-TS, as a playlist's segments are (the extension picks it).
    clip(&secret, "320x240", 25);
    let (port, hits) = listener();
    let entries = [
        "../secret/secret.ts".to_string(),
        format!("file://{}", secret.display()),
        format!("http://127.0.0.1:{port}/secret.ts"),
    ];
    for (i, entry) in entries.iter().enumerate() {
        let upload = up.join(format!("upload{i}.mp4"));
        std::fs::write(
            &upload,
            format!(
                "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:1.0,\n{entry}\n#EXT-X-ENDLIST\n"
            ),
        )
        .unwrap();
        let out = up.join(format!("out{i}.mp4"));
        fails(&upload, &out, &[], "refers to other files or addresses");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "no connection to the listener");
}

/// Names that spell FFmpeg protocols are files: `concat:other.mp4` (a file of that very name)
/// is read, not `other.mp4`; a path whose folders spell `http:/127.0.0.1:PORT/` is read from
/// disk, and the listener there sees no request.
#[test]
fn names_that_spell_protocols_are_read_as_the_files_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The file named, 320x240; the one its name would make FFmpeg read, 640x480.
    clip(&d.join("named.mp4"), "320x240", 10);
    clip(&d.join("other.mp4"), "640x480", 10);
    std::fs::rename(d.join("named.mp4"), d.join("concat:other.mp4")).unwrap();
    let out = d.join("out.mp4");
    // Relative, as a user types it, from the folder that holds both.
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_gpen-video"))
        .current_dir(d)
        .args(["concat:other.mp4", "out.mp4", "--quiet", "--model"])
        .arg(asset("models/standin/identity-512.onnx"))
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(
        probe_video(&out, "stream=width").trim(),
        "320",
        "the file named was read"
    );

    let (port, hits) = listener();
    let sub = d.join(format!("http:/127.0.0.1:{port}"));
    std::fs::create_dir_all(&sub).unwrap();
    clip(&sub.join("x.mp4"), "320x240", 10);
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_gpen-video"))
        .current_dir(d)
        .args([
            &format!("http:/127.0.0.1:{port}/x.mp4"),
            "out2.mp4",
            "--quiet",
            "--model",
        ])
        .arg(asset("models/standin/identity-512.onnx"))
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(probe_video(&d.join("out2.mp4"), "stream=width").trim(), "320");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "no request to the listener");
}
