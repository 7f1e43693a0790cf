//! Odd but valid files from strangers: in, files FFmpeg makes the way people make them
//! (stream-copied trims with edit lists, pictures with alpha, chapters, interlaced video, audio
//! with cover art) and damaged or unusual pictures; out, assertions that each valid file is
//! restored with what it holds kept (or a warning naming what is not), and that each bad one
//! gets a message naming its real cause.

use crate::common;

use std::path::Path;

use common::*;

/// A stream-copied trim (`-ss 0.37 -t 1.2 -c copy`, which writes an edit list whose start is
/// not a keyframe) restores: the frames FFmpeg shows, with their timestamps, and the audio.
/// A file genuinely cut short is still called truncated (bad_inputs_fail_clearly_... in e2e).
#[test]
fn a_stream_copied_trim_with_an_edit_list_restores_as_ffmpeg_decodes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (trim, out) = (dir.path().join("trim.mp4"), dir.path().join("out.mp4"));
    let src = asset("samples/test/astronaut.mp4");
    ffmpeg(&["-ss", "0.37", "-i", arg(&src), "-t", "1.2", "-c", "copy", arg(&trim)]);
    let err = ok(&gpen(&[
        &trim,
        &out,
        &"--model",
        &asset("models/standin/identity-256.onnx"),
    ]));
    assert!(!err.contains("truncated"), "{err}");
    let (pin, pout) = (video_pts(&trim), video_pts(&out));
    assert!(pin.len() > 20, "{pin:?}");
    assert_eq!(pin.len(), pout.len(), "frame count as FFmpeg decodes the trim");
    assert_eq!(time_base(&trim), time_base(&out));
    assert_eq!(pin, pout, "timestamps");
    assert_eq!(packet_md5(&trim, "0:a"), packet_md5(&out, "0:a"), "audio");
}

/// The alpha channel of a picture file, as FFmpeg decodes it.
fn alpha_of(f: &Path) -> Vec<u8> {
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            arg(f),
            "-vf",
            "alphaextract",
            "-f",
            "rawvideo",
            "-",
        ],
    )
}

/// An RGBA PNG (a third transparent, a third half, a third opaque) keeps its alpha exactly in
/// PNG, TIFF and WebP outputs; a JPEG output, which cannot hold it, says so and what to use.
#[test]
fn a_transparent_picture_keeps_its_alpha_where_the_output_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rgba = d.join("rgba.png");
    ffmpeg(&[
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-vf",
        "scale=256:-2,format=rgba,geq=r='r(X,Y)':g='g(X,Y)':b='b(X,Y)':a='if(lt(X,W/3),0,if(lt(X,2*W/3),128,255))'",
        arg(&rgba),
    ]);
    let want = alpha_of(&rgba);
    assert!(want.contains(&0) && want.contains(&128) && want.contains(&255));
    let model = asset("models/standin/identity-256.onnx");
    for ext in ["png", "tiff", "webp"] {
        let out = d.join(format!("o.{ext}"));
        let err = ok(&gpen(&[&rgba, &out, &"--model", &model]));
        assert!(!err.contains("alpha"), "{ext}: {err}");
        assert!(alpha_of(&out) == want, "{ext}: the alpha channel changed");
    }
    let err = ok(&gpen(&[&rgba, &d.join("o.jpg"), &"--model", &model]));
    assert!(
        err.contains("an alpha channel") && err.contains(".jpg file cannot hold it") && err.contains(".png"),
        "{err}"
    );
    // A palette picture with nothing transparent is not warned about.
    let pal = d.join("pal.png");
    ffmpeg(&[
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-vf",
        "scale=256:-2",
        "-pix_fmt",
        "pal8",
        arg(&pal),
    ]);
    let err = ok(&gpen(&[&pal, &d.join("p.jpg"), &"--model", &model]));
    assert!(!err.contains("alpha"), "{err}");
}

/// A VP9 video with alpha: the alpha is dropped with a warning that says how to merge it back,
/// and the output does not claim an alpha channel it lacks (no ALPHA_MODE tag).
#[test]
fn a_vp9_alpha_video_says_its_alpha_is_dropped_and_does_not_claim_it() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("alpha.webm"), dir.path().join("o.webm"));
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=s=160x120:r=25,format=yuva420p,geq=lum='lum(X,Y)':cb='cb(X,Y)':cr='cr(X,Y)':a='if(lt(X,W/2),0,255)'",
        "-frames:v",
        "5",
        "-c:v",
        "libvpx-vp9",
        arg(&input),
    ]);
    let tags = |f: &Path| {
        let raw = tool("ffprobe", &["-v", "error", "-show_entries", "stream_tags", arg(f)]);
        String::from_utf8_lossy(&raw).to_ascii_lowercase()
    };
    assert!(tags(&input).contains("alpha_mode=1"), "{}", tags(&input));
    let err = ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &asset("models/standin/identity-256.onnx"),
    ]));
    assert!(err.contains("alpha channel") && err.contains("alphamerge"), "{err}");
    let raw = tool("ffprobe", &["-v", "error", "-show_entries", "stream_tags", arg(&out)]);
    assert!(
        !String::from_utf8_lossy(&raw)
            .to_ascii_lowercase()
            .contains("alpha_mode"),
        "the output claims alpha"
    );
}

/// Chapters (with titles) are copied; an interlaced source keeps its field order with the
/// default encoder, and an encoder that would make it progressive says so.
#[test]
fn chapters_and_field_order_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (inter, chap, meta) = (d.join("inter.mp4"), d.join("chap.mkv"), d.join("chapters.txt"));
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=s=320x240:r=25",
        "-frames:v",
        "50",
        "-vf",
        "setfield=tff",
        "-flags",
        "+ildct+ilme",
        "-c:v",
        "libx264",
        arg(&inter),
    ]);
    assert_eq!(probe_video(&inter, "stream=field_order").trim(), "tt");
    std::fs::write(
        &meta,
        ";FFMETADATA1\n[CHAPTER]\nTIMEBASE=1/1000\nSTART=0\nEND=1000\ntitle=Opening\n[CHAPTER]\nTIMEBASE=1/1000\nSTART=1000\nEND=2000\ntitle=Second part\n",
    )
    .unwrap();
    ffmpeg(&[
        "-i",
        arg(&inter),
        "-i",
        arg(&meta),
        "-map_metadata",
        "1",
        "-map_chapters",
        "1",
        "-c",
        "copy",
        arg(&chap),
    ]);
    let model = asset("models/standin/identity-256.onnx");
    let chapters = |f: &Path| {
        let raw = tool("ffprobe", &["-v", "error", "-show_chapters", "-of", "compact", arg(f)]);
        String::from_utf8_lossy(&raw)
            .lines()
            .map(|l| {
                let keep = |k: &str| l.split('|').find(|f| f.starts_with(k)).unwrap_or("").to_string();
                [keep("start_time="), keep("end_time="), keep("tag:title=")].join("|")
            })
            .collect::<Vec<_>>()
    };
    for ext in ["mkv", "mp4"] {
        let out = d.join(format!("o.{ext}"));
        ok(&gpen(&[&chap, &out, &"--model", &model]));
        assert_eq!(chapters(&out), chapters(&chap), "{ext}: chapters");
        assert_eq!(chapters(&out).len(), 2);
        assert_eq!(
            probe_video(&out, "stream=field_order").trim(),
            "tt",
            "{ext}: field order"
        );
    }
    let err = ok(&gpen(&[&inter, &d.join("o.webm"), &"--model", &model]));
    assert!(
        err.contains("interlaced (top field first)") && err.contains("--codec libx264"),
        "{err}"
    );
}

/// An mp3 whose only picture is its cover art is refused with a message saying so and how to
/// restore the picture; a video that also carries cover art restores its video.
#[test]
fn audio_with_cover_art_is_not_a_video() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (jpg, mp3, withcover) = (d.join("cover.jpg"), d.join("song.mp3"), d.join("withcover.mp4"));
    ffmpeg(&[
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-vf",
        "scale=256:-2",
        arg(&jpg),
    ]);
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "sine=d=1",
        "-i",
        arg(&jpg),
        "-map",
        "0",
        "-map",
        "1",
        "-c:a",
        "libmp3lame",
        "-c:v",
        "copy",
        "-disposition:v",
        "attached_pic",
        "-id3v2_version",
        "3",
        arg(&mp3),
    ]);
    let model = asset("models/standin/identity-256.onnx");
    fails(&mp3, &d.join("o.mp4"), &[&"--model", &model], "only cover art");
    let src = asset("samples/test/astronaut.mp4");
    ffmpeg(&[
        "-i",
        arg(&src),
        "-i",
        arg(&jpg),
        "-map",
        "0:v",
        "-map",
        "1",
        "-c",
        "copy",
        "-disposition:v:1",
        "attached_pic",
        arg(&withcover),
    ]);
    let out = d.join("o2.mp4");
    ok(&gpen(&[&withcover, &out, &"--model", &model]));
    assert_eq!(video_pts(&out).len(), video_pts(&src).len());
}

/// A file name holding BEL and ESC reaches the terminal escaped, in errors and in the log.
#[test]
fn control_characters_in_names_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let name = dir.path().join("bell\u{7}\u{1b}[31mred.png");
    ffmpeg(&[
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-vf",
        "scale=256:-2",
        arg(&name),
    ]);
    let model = asset("models/standin/identity-256.onnx");
    for out in [dir.path().join("o.mp4"), dir.path().join("o.png")] {
        let r = gpen_env(&[&name, &out, &"--model", &model], &[("RUST_LOG", "info")]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(err.contains("bell\\x07\\x1b[31mred.png"), "{err}");
        assert!(
            !r.stderr.iter().any(|b| *b == 7 || *b == 0x1b),
            "raw control bytes: {err}"
        );
    }
}

/// CRC-32 (PNG's), for crafted chunks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for b in bytes {
        c ^= u32::from(*b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(kind);
    v.extend_from_slice(data);
    v.extend_from_slice(&crc32(&[&kind[..], data].concat()).to_be_bytes());
    v
}

/// Each damaged or unusual picture, and an mp4 cut before its index, gets a message naming
/// its real cause and what to do, instead of "no picture size", "a video", "flushing the
/// decoder failed" or "not a readable video"; an AVIF picture restores as a still.
#[test]
fn damaged_and_unusual_files_are_named_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = asset("models/standin/identity-256.onnx");
    let m: [&dyn AsRef<std::ffi::OsStr>; 2] = [&"--model", &model];
    let portrait = asset("samples/astronaut.png");
    let out = d.join("out.png");

    // A JPEG whose frame header was overwritten.
    let jpg = d.join("a.jpg");
    ffmpeg(&["-i", arg(&portrait), "-vf", "scale=256:-2", arg(&jpg)]);
    let mut bytes = std::fs::read(&jpg).unwrap();
    let sof = bytes.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
    bytes[sof..sof + 12].fill(0);
    let damaged = d.join("damaged.jpg");
    std::fs::write(&damaged, &bytes).unwrap();
    fails(&damaged, &out, &m, "the JPEG is damaged");

    // An animated WebP.
    let anim = d.join("anim.webp");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=s=128x96:r=5",
        "-frames:v",
        "5",
        "-c:v",
        "libwebp_anim",
        "-loop",
        "0",
        arg(&anim),
    ]);
    fails(&anim, &out, &m, "an animated WebP, which FFmpeg cannot decode");

    // A 30000x20000 PNG (its header; FFmpeg refuses the size before reading any data).
    let mut huge = b"\x89PNG\r\n\x1a\n".to_vec();
    huge.extend(png_chunk(
        b"IHDR",
        &[&30000u32.to_be_bytes()[..], &20000u32.to_be_bytes(), &[1, 0, 0, 0, 0]].concat(),
    ));
    huge.extend(png_chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]));
    huge.extend(png_chunk(b"IEND", b""));
    let huge_path = d.join("huge.png");
    std::fs::write(&huge_path, &huge).unwrap();
    fails(
        &huge_path,
        &out,
        &m,
        "a 30000x20000 picture (600 megapixels), larger than FFmpeg decodes",
    );

    // A PNG cut in half.
    let png = d.join("a.png");
    ffmpeg(&["-i", arg(&portrait), "-vf", "scale=256:-2", arg(&png)]);
    let bytes = std::fs::read(&png).unwrap();
    let half = d.join("half.png");
    std::fs::write(&half, &bytes[..bytes.len() / 2]).unwrap();
    fails(&half, &out, &m, "the PNG is cut short");

    // An mp4 that keeps its index at the end, cut short.
    let mp4 = d.join("moov-at-end.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=s=320x240:r=25",
        "-frames:v",
        "50",
        "-c:v",
        "libx264",
        arg(&mp4),
    ]);
    let bytes = std::fs::read(&mp4).unwrap();
    let cut = d.join("cut.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(&cut, &d.join("out.mp4"), &m, "its index (the moov box");

    // A HEIC picture (its file-type box), and an AVIF one, which restores as a still.
    let heic = d.join("photo.heic");
    std::fs::write(&heic, b"\0\0\0\x18ftypheic\0\0\0\0mif1heic\0\0\0\x08meta").unwrap();
    fails(&heic, &out, &m, "a HEIC/HEIF picture, which this FFmpeg cannot read");
    let avif = d.join("a.avif");
    ffmpeg(&[
        "-i",
        arg(&png),
        "-c:v",
        "libaom-av1",
        "-still-picture",
        "1",
        "-cpu-used",
        "8",
        arg(&avif),
    ]);
    ok(&gpen(&[&avif, &out, &"--model", &model]));
    assert_eq!(probe_video(&out, "stream=codec_name").trim(), "png");
}
