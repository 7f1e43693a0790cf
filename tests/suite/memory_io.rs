//! Sources and stills in memory (a service's uploads and answers): in, pictures generated with
//! FFmpeg from samples/astronaut.png (PNG with and without alpha, a JPEG with an EXIF
//! orientation and an ICC profile), crafted playlists and garbage, all as bytes named by paths
//! that do not exist; out, assertions that probing, decoding and encoding the bytes give what
//! the same files give, byte for byte, that a playlist in memory opens nothing, that garbage is
//! an error and never a panic, and that no file is read or created on the way.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use gpen_video::api::frame::{Frame, Pool};
use gpen_video::api::media::decode::{probe, probe_memory, Decoder, SourceInfo};
use gpen_video::api::media::encode::EncodeSettings;
use gpen_video::api::media::still::{StillWriter, Writer};

/// `samples/astronaut.png` converted by FFmpeg into `dir/NAME`.
fn picture(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let src = asset("samples/astronaut.png");
    let mut args = vec!["-v", "error", "-y", "-i", src.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(out.to_str().unwrap());
    tool("ffmpeg", &args);
    out
}

/// `jpeg` with an EXIF APP1 segment holding only Orientation = `o`, right after its SOI marker,
/// and an ICC profile.
fn with_orientation_and_icc(jpeg: &[u8], o: u16) -> Vec<u8> {
    use img_parts::{Bytes, DynImage, ImageICC};
    let out = with_orientation(jpeg, o);
    let mut img = DynImage::from_bytes(out.into()).unwrap().unwrap();
    img.set_icc_profile(Some(Bytes::from(
        (0..600u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    )));
    img.encoder().bytes().to_vec()
}

/// The test's inputs in `dir`: an RGB PNG, an RGBA PNG (transparent corner) and a sideways
/// JPEG with orientation 6 and an ICC profile, each 128 pixels on its longer side.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let png = picture(dir, "plain.png", &["-vf", "scale=128:96"]);
    let rgba = picture(
        dir,
        "alpha.png",
        &[
            "-vf",
            "scale=96:96,format=rgba,geq=r='r(X,Y)':g='g(X,Y)':b='b(X,Y)':a='if(lt(X+Y,40),0,255)'",
        ],
    );
    let plain = picture(dir, "plain.jpg", &["-vf", "scale=128:96,transpose=2", "-q:v", "3"]);
    let sideways = dir.join("sideways.jpg");
    std::fs::write(&sideways, with_orientation_and_icc(&std::fs::read(&plain).unwrap(), 6)).unwrap();
    vec![png, rgba, sideways]
}

/// A name for `file`'s bytes that no file answers to: anything that tried to open it fails.
fn nowhere(file: &Path) -> PathBuf {
    file.parent()
        .unwrap()
        .join("no-such-folder")
        .join(file.file_name().unwrap())
}

/// `f`'s bytes as a source in memory, named as nothing on disk.
fn in_memory(f: &Path) -> SourceInfo {
    let bytes: Arc<[u8]> = std::fs::read(f).unwrap().into();
    probe_memory(&nowhere(f), bytes).unwrap_or_else(|e| panic!("{}: {e:#}", f.display()))
}

/// Every frame of `info`, as stored (not turned upright), its RGB whole.
fn decode(info: &SourceInfo) -> Vec<Frame> {
    let pools = (Pool::new(4), Pool::new(4));
    let mut frames = Vec::new();
    Decoder::new(info.clone(), (32, 32), false)
        .run((&pools.0, &pools.1), None, |mut f| {
            gpen_video::api::media::color::into_rgb(&mut f);
            frames.push(f);
            true
        })
        .unwrap_or_else(|e| panic!("{}: {e:#}", info.path.display()));
    frames
}

/// Decoding the bytes of a PNG, an RGBA PNG and a JPEG with an EXIF orientation gives the
/// file's size, orientation and pictures, exactly.
#[test]
fn bytes_in_memory_probe_and_decode_as_their_files_do() {
    let dir = tempfile::tempdir().unwrap();
    for f in inputs(dir.path()) {
        let (file, mem) = (probe(&f).unwrap(), in_memory(&f));
        let name = f.display();
        assert!(mem.bytes.is_some() && file.bytes.is_none(), "{name}");
        assert_eq!(mem.path, nowhere(&f), "{name}: the name is kept");
        assert_eq!((mem.width, mem.height), (file.width, file.height), "{name}");
        assert_eq!(mem.orientation, file.orientation, "{name}");
        assert_eq!(
            (mem.stream_index, &mem.codec, mem.rotation),
            (file.stream_index, &file.codec, file.rotation),
            "{name}"
        );
        assert_eq!(mem.upright_size(), file.upright_size(), "{name}");
        let (a, b) = (decode(&file), decode(&mem));
        assert_eq!((a.len(), b.len()), (1, 1), "{name}: one picture");
        assert_eq!((b[0].width, b[0].height), (a[0].width, a[0].height), "{name}");
        assert!(a[0].rgb == b[0].rgb, "{name}: the same RGB");
    }
    let sideways = in_memory(&dir.path().join("sideways.jpg"));
    assert_eq!(sideways.orientation, 6, "the EXIF orientation read from the bytes");
    assert_eq!(sideways.upright_size(), (128, 96));
}

/// The picture `writer` makes of `info`'s first frame, turned upright as the pipeline does.
fn write_with(info: &SourceInfo, make: impl FnOnce(&SourceInfo) -> StillWriter) -> StillWriter {
    let mut frame = decode(info).into_iter().next().unwrap();
    let pools = (Pool::new(2), Pool::new(2));
    gpen_video::api::media::orient::turn_frame(info.orientation, &mut frame, (32, 32), (&pools.0, &pools.1));
    let mut out = info.clone();
    (out.width, out.height) = info.upright_size();
    let mut writer = make(&out);
    writer.write(&mut frame).unwrap();
    writer
}

/// A still encoded in memory is byte for byte the still written to a file, EXIF, ICC and
/// alpha included, from a source in memory as from its file; `Writer` hands the same bytes.
#[test]
fn a_still_in_memory_is_the_file_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let settings = EncodeSettings::default();
    for f in inputs(dir.path()) {
        let (file, mem) = (probe(&f).unwrap(), in_memory(&f));
        for ext in ["png", "jpg", "webp"] {
            let out = dir.path().join(format!("out.{ext}"));
            std::fs::write(&out, b"").unwrap();
            let w = write_with(&file, |s| StillWriter::create(&out, s, &settings).unwrap());
            assert_eq!(w.finish().unwrap(), 1);
            let want = std::fs::read(&out).unwrap();
            let name = nowhere(&out);
            let mut w = write_with(&mem, |s| StillWriter::in_memory(&name, s, &settings).unwrap());
            let got = w.take_encoded().expect("the picture is kept");
            assert!(w.take_encoded().is_none(), "taken once");
            assert!(
                got == want,
                "{} to .{ext}: {} bytes, the file {}",
                f.display(),
                got.len(),
                want.len()
            );
            if ext == "png" && f.ends_with("alpha.png") {
                assert_eq!(
                    got[25], 6,
                    "the alpha channel, read again from the bytes, is kept (RGBA)"
                );
            }
            // From the source's file into memory: the same again.
            let mut w = write_with(&file, |s| StillWriter::in_memory(&name, s, &settings).unwrap());
            assert!(
                w.take_encoded().unwrap() == want,
                "{} to .{ext}, file to memory",
                f.display()
            );
        }
    }
    // The JPEG's EXIF block came along into the PNG (with the orientation reset), and its ICC.
    let png = dir.path().join("out.png");
    let mem = in_memory(&dir.path().join("sideways.jpg"));
    let mut w = write_with(&mem, |s| StillWriter::in_memory(&png, s, &settings).unwrap());
    let got = w.take_encoded().unwrap();
    assert!(got.windows(4).any(|w| w == b"eXIf") && got.windows(4).any(|w| w == b"iCCP"));

    // `Writer`: the same picture; a video name is refused; a file writer keeps nothing.
    let mut frame = decode(&mem).into_iter().next().unwrap();
    let pools = (Pool::new(2), Pool::new(2));
    gpen_video::api::media::orient::turn_frame(mem.orientation, &mut frame, (32, 32), (&pools.0, &pools.1));
    let mut out = mem.clone();
    (out.width, out.height) = mem.upright_size();
    let mut w = Writer::in_memory(Path::new("answer.png"), &out, &settings).unwrap();
    assert!(w.take_encoded().is_none(), "nothing before the picture");
    w.write(&mut frame).unwrap();
    assert!(w.take_encoded().unwrap() == got);
    assert_eq!(w.finish(false).unwrap(), 1);
    let e = Writer::in_memory(Path::new("answer.mp4"), &out, &settings)
        .err()
        .expect("a video");
    assert!(format!("{e:#}").contains("only a still"), "{e:#}");
}

/// A FIFO at `path` that counts the times anyone opens it for reading (a writer waits on it in
/// a thread); the returned function stops the watch and gives the count.
fn tripwire(path: &Path) -> impl FnOnce() -> usize {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let (opened, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let (o, d, p) = (opened.clone(), done.clone(), path.to_path_buf());
    let watch = std::thread::spawn(move || loop {
        // Blocks until a reader opens the FIFO; closing it at once gives that reader its end.
        let w = std::fs::OpenOptions::new().write(true).open(&p);
        if d.load(Ordering::SeqCst) {
            return;
        }
        if w.is_ok() {
            o.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    });
    let path = path.to_path_buf();
    move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let n = opened.load(Ordering::SeqCst);
        done.store(true, Ordering::SeqCst);
        // Lets the waiting writer through (a non-blocking reader opens at once).
        use std::os::unix::fs::OpenOptionsExt;
        let _r = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        watch.join().unwrap();
        n
    }
}

/// Playlists and lists in memory (HLS naming a local file by a relative path, an absolute one,
/// a file:// URL and an address on loopback; ffconcat lists naming a local file and
/// /etc/passwd; a DASH manifest) are refused, and nothing they name is opened: the named file
/// is a FIFO no one opens and the listener sees no connection.
#[test]
fn a_playlist_in_memory_is_refused_and_opens_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let secret = d.join("secret.ts");
    let opened = tripwire(&secret);
    let (port, hits) = listener();
    let hls = |entry: &str| {
        format!(
            "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:1.0,\n{entry}\n#EXT-X-ENDLIST\n"
        )
    };
    let lists = [
        ("upload.m3u8", hls("secret.ts")),
        ("upload.mp4", hls("secret.ts")),
        ("upload.jpg", hls(&secret.display().to_string())),
        ("upload.mp4", hls(&format!("file://{}", secret.display()))),
        ("upload.mp4", hls(&format!("http://127.0.0.1:{port}/secret.ts"))),
        ("upload.mp4", "ffconcat version 1.0\nfile 'secret.ts'\n".to_string()),
        ("upload.txt", "ffconcat version 1.0\nfile '/etc/passwd'\n".to_string()),
        (
            "upload.mpd",
            format!(
                "<?xml version=\"1.0\"?><MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" type=\"static\" mediaPresentationDuration=\"PT1S\"><Period><AdaptationSet><Representation id=\"0\" bandwidth=\"1000\"><BaseURL>http://127.0.0.1:{port}/</BaseURL><SegmentList duration=\"1\"><SegmentURL media=\"secret.ts\"/></SegmentList></Representation></AdaptationSet></Period></MPD>"
            ),
        ),
    ];
    for (name, text) in &lists {
        let bytes: Arc<[u8]> = text.as_bytes().into();
        let e = probe_memory(&d.join(name), bytes.clone()).err();
        let e = e.unwrap_or_else(|| panic!("{name} holding {text:?} was read"));
        let said = format!("{e:#}");
        assert!(
            said.contains(name) && said.contains("other files or addresses"),
            "{said}"
        );
        let opened = gpen_video::api::media::input::open_source(&d.join(name), Some(&bytes));
        assert!(opened.is_err(), "{name} holding {text:?} was opened");
    }
    assert_eq!(opened(), 0, "the named file was never opened");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "no connection to the listener");
}

/// A concat list saved as a file, naming a file beside it by a relative (safe) name: FFmpeg's
/// concat demuxer opens the files it lists past the input's opener, so it is refused before it
/// opens anything, with a message that says what the file is.
#[test]
fn a_concat_list_file_opens_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let opened = tripwire(&d.join("secret.ts"));
    let upload = d.join("upload.mp4");
    std::fs::write(&upload, "ffconcat version 1.0\nfile 'secret.ts'\n").unwrap();
    let said = format!("{:#}", probe(&upload).unwrap_err());
    assert!(
        said.contains("concat list") && said.contains("self-contained"),
        "{said}"
    );
    assert!(gpen_video::api::media::input::open_input(&upload).is_err());
    assert_eq!(opened(), 0, "the listed file was never opened");
}

/// Bytes that are no picture (empty, garbage, text, a picture cut short or with bytes turned,
/// a PNG header of a picture too large to decode) are errors that name the upload, never a
/// panic, whatever the name's extension.
#[test]
fn garbage_in_memory_is_an_error_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let jpeg = std::fs::read(picture(dir.path(), "small.jpg", &["-vf", "scale=64:48"])).unwrap();
    let png = std::fs::read(picture(dir.path(), "small.png", &["-vf", "scale=64:48"])).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let mut huge = png[..33].to_vec();
    huge[16..24].copy_from_slice(&[0, 0, 0x75, 0x30, 0, 0, 0x4e, 0x20]);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("noise", noise(5000)),
        ("text", b"hello, this is not a picture\n".to_vec()),
        ("huge", huge.clone()),
        ("png-cut", png[..png.len() / 2].to_vec()),
        ("jpeg-cut", jpeg[..jpeg.len() / 3].to_vec()),
        ("jpeg-head", jpeg[..200].to_vec()),
    ];
    for k in 1..12 {
        let mut b = jpeg.clone();
        let at = (k * 7919) % b.len();
        let span = noise(40);
        let end = (at + span.len()).min(b.len());
        b[at..end].copy_from_slice(&span[..end - at]);
        cases.push(("jpeg-turned", b));
    }
    for (what, bytes) in cases {
        for ext in ["png", "jpg", "mp4", "webp", ""] {
            let name = dir.path().join(format!("upload-{what}.{ext}"));
            match probe_memory(&name, bytes.clone().into()) {
                Err(e) => {
                    let said = format!("{e:#}");
                    assert!(said.contains("upload-"), "{what}.{ext}: {said}");
                }
                Ok(_) if ["empty", "noise", "text", "huge"].contains(&what) => {
                    panic!("{what} bytes named .{ext} were read")
                }
                // Readable enough to probe (a damaged JPEG may decode): decoding ends, with a
                // picture or an error.
                Ok(info) => {
                    let pools = (Pool::new(2), Pool::new(2));
                    let _ = Decoder::new(info, (32, 32), false).run((&pools.0, &pools.1), None, |_| true);
                }
            }
        }
    }
    let said = format!(
        "{:#}",
        probe_memory(&dir.path().join("big.png"), huge.into()).unwrap_err()
    );
    assert!(said.contains("30000x20000"), "sniffed from the bytes: {said}");
}

/// Set in the child process [`nothing_is_created_on_disk`] starts: the path of the picture
/// whose bytes it works on.
const CHILD: &str = "GPEN_MEMORY_IO_CHILD";

/// Probes, decodes and encodes a picture in memory, under relative names, in a process whose
/// working and temporary folders are fresh and empty: they stay empty.
#[test]
fn nothing_is_created_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let src = inputs(dir.path()).pop().unwrap();
    let (cwd, tmp) = (dir.path().join("cwd"), dir.path().join("tmp"));
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    // The child test's full name in this binary (its module path less the crate's name).
    let child = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::child_works_in_memory"),
        None => "child_works_in_memory".to_string(),
    };
    let r = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &child, "--nocapture", "--test-threads=1"])
        .current_dir(&cwd)
        .env(CHILD, &src)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success() && out.contains("1 passed"),
        "{out}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    for d in [&cwd, &tmp] {
        let left: Vec<_> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "{left:?} left in {}", d.display());
    }
}

/// The child's work for [`nothing_is_created_on_disk`] (nothing when run on its own).
#[test]
fn child_works_in_memory() {
    let Some(src) = std::env::var_os(CHILD) else { return };
    let bytes: Arc<[u8]> = std::fs::read(&src).unwrap().into();
    let info = probe_memory(Path::new("upload.jpg"), bytes).unwrap();
    let mut frame = decode(&info).into_iter().next().unwrap();
    let pools = (Pool::new(2), Pool::new(2));
    gpen_video::api::media::orient::turn_frame(info.orientation, &mut frame, (32, 32), (&pools.0, &pools.1));
    let mut out = info.clone();
    (out.width, out.height) = info.upright_size();
    for name in ["answer.png", "answer.jpg", "answer.webp"] {
        let mut w = Writer::in_memory(Path::new(name), &out, &EncodeSettings::default()).unwrap();
        w.write(&mut frame).unwrap();
        assert!(w.take_encoded().is_some_and(|b| b.len() > 100), "{name}");
        w.finish(false).unwrap();
    }
    let list = "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:1.0,\nsecret.ts\n#EXT-X-ENDLIST\n";
    assert!(probe_memory(Path::new("list.m3u8"), list.as_bytes().into()).is_err());
}
