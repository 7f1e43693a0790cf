//! `gpen-video serve` end to end: in, the real binary serving on a loopback port and a real
//! HTTP client (ureq, and raw sockets for what a client should not do); out, the restored bytes
//! compared with `gpen-video IN OUT`'s, the batches concurrent requests fill, each bad request's
//! status with the service still serving after it, and a SIGTERM under load.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::server::Server;
use common::*;

/// The shipped portrait scaled to `side`, as `ext`.
fn portrait(dir: &Path, side: u32, ext: &str) -> PathBuf {
    let out = dir.join(format!("portrait-{side}.{ext}"));
    ffmpeg(&[
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-vf",
        &format!("scale={side}:{side}"),
        arg(&out),
    ]);
    out
}

fn model(name: &str) -> String {
    arg(&asset(&format!("models/{name}"))).to_string()
}

#[test]
fn restored_bytes_equal_a_single_run_in_every_format_asked() {
    let dir = tempfile::tempdir().unwrap();
    let m = model("standin/negate-256.onnx");
    let server = Server::start(&["--model", &m]);
    for (ext, query, out_ext, extra) in [
        ("png", "", "png", vec![]),
        ("jpg", "?format=png", "png", vec![]),
        (
            "png",
            "?blend=0.5&compare=split",
            "png",
            vec!["--blend", "0.5", "--compare", "split"],
        ),
        ("jpg", "", "jpg", vec![]),
    ] {
        let input = portrait(dir.path(), 512, ext);
        let (status, body, _, faces) = server.post(&format!("/v1/restore{query}"), &std::fs::read(&input).unwrap());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(faces.as_deref(), Some("1"));
        let out = dir.path().join(format!("single.{out_ext}"));
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &m];
        args.extend(extra.iter().map(|e| e as &dyn AsRef<std::ffi::OsStr>));
        ok(&gpen(&args));
        assert!(
            body == std::fs::read(&out).unwrap(),
            "{ext} {query}: the service's bytes are the CLI's"
        );
    }
    let (status, body, _, _) = server.post(
        "/v1/restore?json=1",
        &std::fs::read(portrait(dir.path(), 512, "png")).unwrap(),
    );
    assert_eq!(status, 200);
    let record: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(record["faces"].as_array().unwrap().len(), 1, "{record}");
    assert!(record["total_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn concurrent_clients_fill_the_batches() {
    let dir = tempfile::tempdir().unwrap();
    let image = std::fs::read(portrait(dir.path(), 256, "png")).unwrap();
    let server = Server::start(&["--model", &model("gpen-bfr-256-random.onnx"), "--batch", "4"]);
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| {
                for _ in 0..3 {
                    let (status, body, _, _) = server.post("/v1/restore", &image);
                    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                }
            });
        }
    });
    let fill = server.metric("gpen_worker_batch_fill");
    assert!(fill >= 0.9, "16 clients' faces fill the batches of 4: mean fill {fill}");
    assert_eq!(server.metric("gpen_requests_total{outcome=\"ok\"}"), 48.0);
    // A lone request is not held for company.
    let t = std::time::Instant::now();
    assert_eq!(server.post("/v1/restore", &image).0, 200);
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// Sends `head` (a request line and headers) and `body` on a raw connection, then closes its
/// sending side after `pause`; the status line of the answer.
fn raw(addr: &str, head: &str, body: &[u8], pause: Duration) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    std::thread::sleep(pause);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn bad_requests_get_their_status_and_the_service_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(portrait(dir.path(), 256, "png")).unwrap();
    let server = Server::start(&[
        "--model",
        &model("standin/identity-256.onnx"),
        "--read-timeout-s",
        "1",
        "--max-body-mb",
        "2",
    ]);
    let still_serving = |what: &str| {
        let (status, _, _, _) = server.post("/v1/restore", &good);
        assert_eq!(status, 200, "after {what}");
    };
    // A decompression bomb: a valid PNG header announcing 50000 x 50000 pixels in 60 bytes.
    let mut bomb = good[..16].to_vec();
    bomb.extend(50000u32.to_be_bytes());
    bomb.extend(50000u32.to_be_bytes());
    bomb.extend(&good[24..64]);
    let (status, body, _, _) = server.post("/v1/restore", &bomb);
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("50000x50000"));
    still_serving("a bomb");
    let (status, body, _, _) = server.post("/v1/restore", b"this is not a picture");
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("JPEG, PNG"));
    still_serving("garbage");
    let (status, body, _, _) = server.post("/v1/restore", b"");
    assert_eq!(
        (status, String::from_utf8_lossy(&body).contains("empty body")),
        (400, true)
    );
    still_serving("an empty body");
    // A whole PNG cut short: its header reads, its pixels do not.
    let (status, body, _, _) = server.post("/v1/restore", &good[..good.len() / 2]);
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    still_serving("a cut picture");
    // A body larger than --max-body-mb (sent only until the answer can come).
    let head = format!(
        "POST /v1/restore HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        3 << 20
    );
    let status = raw(&server.addr, &head, &vec![0u8; (2 << 20) + 4096], Duration::ZERO);
    assert!(status.contains(" 413 "), "{status}");
    still_serving("a large body");
    let (status, _, _, _) = server.post("/v1/restore?compare=sideways", &good);
    assert_eq!(status, 400);
    let (status, body, _, _) = server.post("/v1/restore?blend=lots", &good);
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    // An upload that stops: fewer bytes than its Content-Length, then the connection closes.
    let head = format!(
        "POST /v1/restore HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        good.len()
    );
    let status = raw(&server.addr, &head, &good[..1000], Duration::ZERO);
    assert!(status.is_empty() || status.contains(" 400 "), "{status}");
    still_serving("a truncated upload");
    // A slow sender: part of the body, then nothing for longer than --read-timeout-s.
    let status = raw(&server.addr, &head, &good[..1000], Duration::from_millis(2500));
    assert!(status.contains(" 408 "), "{status}");
    still_serving("a slow sender");
    assert!(server.metric("gpen_requests_total{outcome=\"slow_client\"}") >= 1.0);
    // A client that never finishes its headers is cut off too (it would hold a connection).
    let mut c = TcpStream::connect(&server.addr).unwrap();
    c.write_all(b"POST /v1/restore HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = std::time::Instant::now();
    let mut buf = [0u8; 256];
    // The server ends the connection (read returns) well before the client's own 10 s timeout.
    let read = c.read(&mut buf);
    assert!(
        t.elapsed() < Duration::from_secs(9),
        "the connection was not closed after the header deadline: {read:?}"
    );
    still_serving("a client that never finished its headers");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn a_full_queue_answers_503_and_sigterm_loses_no_accepted_request() {
    let dir = tempfile::tempdir().unwrap();
    let image = std::fs::read(portrait(dir.path(), 256, "png")).unwrap();
    let server = Server::start(&["--model", &model("gpen-bfr-256-random.onnx"), "--queue", "4"]);
    // Twelve at once into a queue of four: some wait, the rest are told to come back.
    let answers: Vec<(u16, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|_| {
                s.spawn(|| {
                    let (status, _, retry, _) = server.post("/v1/restore", &image);
                    (status, retry)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy = answers.iter().filter(|a| a.0 == 503).count();
    assert!(busy >= 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| a.0 == 200 || (a.0 == 503 && a.1.as_deref() == Some("1"))),
        "{answers:?}"
    );
    assert_eq!(
        server.post("/v1/restore", &image).0,
        200,
        "serving again once the queue drains"
    );
    drop(server);

    // A deadline shorter than the wait: those not restored in time get 504, and the service
    // goes on.
    let server = Server::start(&["--model", &model("gpen-bfr-256-random.onnx"), "--deadline-s", "1"]);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..24)
            .map(|_| s.spawn(|| server.post("/v1/restore", &image).0))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        statuses.contains(&504) && statuses.iter().all(|s| *s == 200 || *s == 504),
        "{statuses:?}"
    );
    assert!(server.metric("gpen_requests_total{outcome=\"timeout\"}") >= 1.0);
    // Once what was accepted has drained, a request is restored in time again.
    let again = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(250));
        server.post("/v1/restore", &image).0 == 200
    });
    assert!(again, "serving after deadlines passed");
    drop(server);

    // SIGTERM while eight clients keep sending: every request the service accepted is answered
    // 200; the later ones are refused at the door (no connection), never dropped half-way.
    let server = Server::start(&["--model", &model("gpen-bfr-256-random.onnx")]);
    let addr = server.addr.clone();
    let pid = server.child.id().to_string();
    let results: Vec<Vec<u16>> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..8)
            .map(|_| {
                let image = &image;
                let addr = &addr;
                s.spawn(move || {
                    let mut got = Vec::new();
                    for _ in 0..20 {
                        let r = ureq::post(&format!("http://{addr}/v1/restore"))
                            .config()
                            .http_status_as_error(false)
                            .build()
                            .send(&image[..]);
                        match r {
                            Ok(r) => got.push(r.status().as_u16()),
                            Err(_) => break,
                        }
                    }
                    got
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        tool("kill", &["-TERM", &pid]);
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let all: Vec<u16> = results.concat();
    assert!(!all.is_empty() && all.iter().all(|s| *s == 200), "{results:?}");
    let log = server.log.clone();
    let mut server = server;
    let code = server.child.wait().unwrap().code();
    assert_eq!(code, Some(0), "{}", log.lock().unwrap());
    let answered = log.lock().unwrap().matches("status=200").count();
    assert_eq!(answered, all.len(), "every accepted request was answered and logged");
}

/// Every file and folder under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            out.extend(files_under(&e.path()));
        }
    }
    out
}

#[test]
fn a_request_leaves_nothing_on_disk_even_when_its_client_leaves() {
    let dir = tempfile::tempdir().unwrap();
    // The service's temporary folder: no request may leave anything in it.
    let tmp = tempfile::tempdir().unwrap();
    let image = std::fs::read(portrait(dir.path(), 256, "png")).unwrap();
    let server = Server::start_env(
        &["--model", &model("standin/identity-256.onnx")],
        &[("TMPDIR", tmp.path())],
    );
    // What the service made before any request (ONNX Runtime keeps a small id file there).
    let before = files_under(tmp.path());
    let (status, body, _, _) = server.post("/v1/restore?format=jpg", &image);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(body.starts_with(&[0xff, 0xd8]), "a JPEG answer");
    // Clients that send a whole picture and leave while it is being restored.
    let head = format!(
        "POST /v1/restore HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        image.len()
    );
    for pause in [0, 5, 20, 60] {
        let mut c = TcpStream::connect(&server.addr).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&image).unwrap();
        std::thread::sleep(Duration::from_millis(pause));
        drop(c);
    }
    // A bad picture and a refused one leave nothing either.
    assert_eq!(server.post("/v1/restore", &image[..image.len() / 2]).0, 400);
    // Whatever the requests left behind is there once they are answered.
    assert_eq!(server.post("/v1/restore", &image).0, 200, "still serving");
    std::thread::sleep(Duration::from_millis(500));
    let left = files_under(tmp.path());
    assert_eq!(left, before, "the requests left files behind");
    // The clients that left are logged and counted, each as answered or gone.
    let gone = server.metric("gpen_requests_total{outcome=\"client_gone\"}");
    let ok = server.metric("gpen_requests_total{outcome=\"ok\"}");
    assert!(gone >= 1.0, "no request counted as its client gone");
    assert_eq!(gone + ok, 6.0, "every request counted once: {gone} gone, {ok} ok");
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("client_gone"), "{log}");
    assert_eq!(server.stop(), Some(0));
}

/// A service whose engine cannot load (here `--device cuda:0` on a machine without the GPU
/// build of ONNX Runtime) exits non-zero with the reason, instead of answering /healthz 503
/// "loading the model" for ever.
#[test]
fn a_service_whose_model_cannot_load_exits_non_zero_with_the_reason() {
    // A restorer named (no stand-in is picked unasked): what fails is the device.
    let model = asset("models/standin/identity-512.onnx");
    let (code, log) = common::server::serve_exits(&[&"--device", &"cuda:0", &"--model", &model]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("could not load its model") && log.contains("cuda"),
        "{log}"
    );
}

/// A picture whose header claims more pixels than `--max-pixels` is a 413 whatever its format,
/// read from the header before any decoder (a JPEG's header claiming 60000x60000 with nothing
/// after it, a TIFF 100000 wide, a WebP 16384 square, besides PNG and BMP), and counted as too
/// large, never as a bad request.
#[test]
fn every_picture_over_the_limit_is_too_large_whatever_its_format() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small.jpg");
    lavfi_picture("color=c=gray:s=64x48", &small);
    let mut jpeg = std::fs::read(&small).unwrap();
    let sof = jpeg.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
    jpeg[sof + 5..sof + 9].copy_from_slice(&[0xea, 0x60, 0xea, 0x60]);
    // Its header alone: the decoder finds it cut short, the header says how large it is.
    jpeg.truncate(sof + 9);
    let mut tiff = b"II*\0\x08\0\0\0\x02\0".to_vec();
    for (tag, v) in [(256u16, 100_000u32), (257, 1000)] {
        tiff.extend(tag.to_le_bytes());
        tiff.extend(4u16.to_le_bytes());
        tiff.extend(1u32.to_le_bytes());
        tiff.extend(v.to_le_bytes());
    }
    tiff.extend([0u8; 4]);
    let mut webp = b"RIFF\x16\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
    webp.extend([0xff, 0x3f, 0x00, 0xff, 0x3f, 0x00]);
    let server = Server::start(&[
        "--model",
        &model("standin/identity-256.onnx"),
        "--max-pixels",
        "40000000",
    ]);
    for (name, body) in [("jpeg", &jpeg), ("tiff", &tiff), ("webp", &webp)] {
        let (status, answer, _, _) = server.post("/v1/restore", body);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert_eq!(status, 413, "{name}: {answer}");
        assert!(answer.contains("--max-pixels"), "{name}: {answer}");
    }
    assert_eq!(server.metric("gpen_requests_total{outcome=\"bad_request\"}"), 0.0);
}

/// A WebP answer is the client's choice: for a picture wider than WebP holds (16383 pixels a
/// side) it is a 400 that says so, not a 500 from the encoder; the service goes on, and the same
/// picture in PNG is restored.
#[test]
fn a_webp_too_wide_for_webp_is_a_bad_request() {
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.png");
    lavfi_picture("color=c=gray:s=16400x16", &wide);
    let wide = std::fs::read(&wide).unwrap();
    let server = Server::start(&["--model", &model("standin/identity-256.onnx")]);
    let (status, body, _, _) = server.post("/v1/restore?format=webp", &wide);
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("16383") && body.contains("16400x16"), "{body}");
    let (status, _, _, _) = server.post("/v1/restore?format=png", &wide);
    assert_eq!(status, 200);
}

/// Valid BMPs whose headers differ from the common one are sized as decoders size them: a
/// top-down BMP (negative height, as many Windows tools write) and an OS/2 1.x BMP (12-byte
/// header, 16-bit sides) are restored, not refused as absurdly large.
#[test]
fn top_down_and_os2_bmps_are_sized_right() {
    let dir = tempfile::tempdir().unwrap();
    let bmp = std::fs::read(portrait(dir.path(), 256, "bmp")).unwrap();
    let u32_at = |i: usize| u32::from_le_bytes(bmp[i..i + 4].try_into().unwrap()) as usize;
    let (offset, w, h) = (u32_at(10), u32_at(18), u32_at(22));
    assert_eq!((u32_at(14), bmp[28]), (40, 24), "a 24-bit BMP with a Windows header");
    let row = (w * 3 + 3) & !3;
    let rows: Vec<&[u8]> = bmp[offset..offset + row * h].chunks_exact(row).collect();
    // Top-down: the rows in reading order, the height negative.
    let mut top_down = bmp[..offset].to_vec();
    top_down[22..26].copy_from_slice(&(-(h as i32)).to_le_bytes());
    rows.iter().rev().for_each(|r| top_down.extend_from_slice(r));
    // OS/2 1.x: a 12-byte core header with 16-bit sides, the same rows.
    let mut os2 = b"BM".to_vec();
    os2.extend(((26 + row * h) as u32).to_le_bytes());
    os2.extend([0u8; 4]);
    os2.extend(26u32.to_le_bytes());
    os2.extend(12u32.to_le_bytes());
    os2.extend((w as u16).to_le_bytes());
    os2.extend((h as u16).to_le_bytes());
    os2.extend(1u16.to_le_bytes());
    os2.extend(24u16.to_le_bytes());
    rows.iter().for_each(|r| os2.extend_from_slice(r));
    let server = Server::start(&["--model", &model("standin/identity-256.onnx")]);
    for (what, body) in [("top-down", &top_down), ("OS/2 1.x", &os2)] {
        let (status, out, _, _) = server.post("/v1/restore?format=png", body);
        assert_eq!(status, 200, "{what}: {}", String::from_utf8_lossy(&out));
        assert_eq!(&out[..8], b"\x89PNG\r\n\x1a\n", "{what}");
    }
}

/// The CRC-32 of a PNG chunk's type and data (ISO 3309, as PNG uses it).
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

/// `png` with a chunk of `kind` holding `data` put after its IHDR, its CRC right.
fn with_chunk(png: &[u8], kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend(kind);
    chunk.extend(data);
    chunk.extend(crc32(&chunk[4..]).to_be_bytes());
    let mut out = png[..33].to_vec();
    out.extend(chunk);
    out.extend(&png[33..]);
    out
}

/// The peak memory (VmHWM, bytes) of the process `pid` so far.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

/// Compressed metadata that inflates to 64 MiB (a zTXt comment, an ICC profile, a compressed
/// iTXt) is never inflated past the decoder's limit: the picture is restored, the profile left
/// out, and the service's peak memory grows by far less than the bomb. A frame header that hides
/// a larger one (a 16x16 JPEG SOF before a 2000x2000 one, a 2000x2000 WebP bitstream in a 64x64
/// canvas) is refused as damaged by its decoder, never decoded at the larger size.
#[test]
fn metadata_bombs_are_not_inflated_and_hidden_frame_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(portrait(dir.path(), 256, "png")).unwrap();
    assert_eq!(&good[12..16], b"IHDR");
    // 64 MiB of zeros in 64 KB: a zTXt comment, an ICC profile, a compressed iTXt.
    let zeros = miniz_oxide::deflate::compress_to_vec_zlib(&vec![0u8; 64 << 20], 9);
    let meta = |head: &[u8]| [head, &zeros[..]].concat();
    let bombs = [
        ("zTXt", with_chunk(&good, b"zTXt", &meta(b"Comment\0\0"))),
        ("iCCP", with_chunk(&good, b"iCCP", &meta(b"icc\0\0"))),
        (
            "iTXt",
            with_chunk(&good, b"iTXt", &meta(b"XML:com.adobe.xmp\0\x01\0\0\0")),
        ),
    ];
    // A real comment, compressed, is kept out of the way and the picture restored.
    let small = miniz_oxide::deflate::compress_to_vec_zlib(&b"restored with care ".repeat(100), 6);
    let commented = with_chunk(&good, b"zTXt", &[&b"Comment\0\0"[..], &small].concat());
    // A 2000x2000 JPEG with a 16x16 frame header before its own, and a 2000x2000 lossless
    // WebP inside a VP8X canvas that says 64x64: the decoder makes the large picture.
    let big_jpg = dir.path().join("big.jpg");
    lavfi_picture("testsrc2=s=2000x2000", &big_jpg);
    let big_jpg = std::fs::read(big_jpg).unwrap();
    let mut two_sofs = vec![
        0xff, 0xd8, 0xff, 0xc0, 0, 17, 8, 0, 16, 0, 16, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1,
    ];
    two_sofs.extend(&big_jpg[2..]);
    let big_webp = dir.path().join("big.webp");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=s=2000x2000",
        "-frames:v",
        "1",
        "-c:v",
        "libwebp",
        "-lossless",
        "1",
        arg(&big_webp),
    ]);
    let big_webp = std::fs::read(big_webp).unwrap();
    assert_eq!(&big_webp[12..16], b"VP8L", "a simple lossless WebP");
    let mut body = b"WEBPVP8X".to_vec();
    body.extend(10u32.to_le_bytes());
    body.extend([0, 0, 0, 0, 63, 0, 0, 63, 0, 0]);
    body.extend(&big_webp[12..]);
    let mut canvas = b"RIFF".to_vec();
    canvas.extend((body.len() as u32).to_le_bytes());
    canvas.extend(body);

    let server = Server::start(&[
        "--model",
        &model("standin/identity-256.onnx"),
        "--max-pixels",
        "1000000",
    ]);
    let (status, _, _, _) = server.post("/v1/restore?format=png", &commented);
    assert_eq!(status, 200);
    let before = peak_memory(server.child.id());
    for (chunk, bomb) in &bombs {
        let (status, body, _, _) = server.post("/v1/restore?format=png", bomb);
        assert_eq!(status, 200, "{chunk}: {}", String::from_utf8_lossy(&body));
        assert!(body.len() < 1 << 20, "{chunk}: {} bytes answered", body.len());
    }
    let grown = peak_memory(server.child.id()).saturating_sub(before);
    assert!(grown < 24 << 20, "the peak grew by {} MiB", grown >> 20);
    for (what, hidden, why) in [
        ("JPEG", &two_sofs, "Two Start of Frame Markers"),
        ("WebP", &canvas, "Inconsistent image sizes"),
    ] {
        let (status, body, _, _) = server.post("/v1/restore", hidden);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, 400, "{what}: {text}");
        assert!(
            text.contains("cannot be decoded") && text.contains(why),
            "{what}: {text}"
        );
    }
    let (status, body, _, _) = server.post("/v1/restore?format=png", &commented);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}
