//! Still-image tests: in, pictures generated with FFmpeg from samples/astronaut.png (512x512
//! RGB) in every format gpen-video reads, and the identity stand-in; out, assertions on the
//! single image files the real binary writes, read back with FFmpeg.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

/// `samples/astronaut.png` converted by FFmpeg into `dir/astronaut.EXT`.
fn picture(dir: &Path, ext: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("astronaut.{ext}"));
    let src = asset("samples/astronaut.png");
    let mut args = vec!["-v", "error", "-y", "-i", src.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(out.to_str().unwrap());
    tool("ffmpeg", &args);
    out
}

/// The picture format a file holds, from its first bytes.
fn magic(f: &Path) -> &'static str {
    let b = std::fs::read(f).unwrap();
    match &b[..] {
        [0x89, b'P', b'N', b'G', ..] => "png",
        [0xff, 0xd8, 0xff, ..] => "jpeg",
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => "webp",
        [b'I', b'I', 42, 0, ..] | [b'M', b'M', 0, 42, ..] => "tiff",
        [b'B', b'M', ..] => "bmp",
        _ => "unknown",
    }
}

fn identity() -> PathBuf {
    asset("models/standin/identity-256.onnx")
}

/// Every listed format in (to PNG) and out (from PNG): one picture of the source's size in
/// the format OUT names, with the astronaut's face found.
#[test]
fn every_format_in_and_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let png = picture(d, "png", &[]);
    for (ext, want) in [
        ("jpg", "jpeg"),
        ("webp", "webp"),
        ("tiff", "tiff"),
        ("bmp", "bmp"),
        ("png", "png"),
    ] {
        let input = if ext == "png" {
            png.clone()
        } else {
            picture(d, ext, &[])
        };
        assert_eq!(magic(&input), want, "generated {ext}");
        let (out, faces, _) = run_with_faces(d, &input, &format!("from-{ext}.png"), &identity(), &[]);
        assert_eq!(magic(&out), "png", "{ext} in, PNG out");
        assert_eq!(faces.len(), 1, "{ext}: one picture");
        assert_eq!(faces[0].1.len(), 1, "{ext}: the face is found");
        let (w, h, frames) = rgb_frames(&out);
        assert_eq!((w, h, frames.len()), (512, 512, 1), "{ext}");

        let (out, faces, _) = run_with_faces(d, &png, &format!("to-{ext}.{ext}"), &identity(), &[]);
        assert_eq!(magic(&out), want, "PNG in, {ext} out");
        assert_eq!(faces[0].1.len(), 1);
        let (w, h, frames) = rgb_frames(&out);
        assert_eq!((w, h, frames.len()), (512, 512, 1), "{ext} out");
    }
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
        .collect();
    assert!(left.is_empty(), "no temporary file left");
}

/// `f` decoded as gpen-video decodes a still (the `image` crate, 8-bit RGB), as one frame.
fn decoded_rgb(f: &Path) -> Vec<Vec<u8>> {
    vec![image::open(f).unwrap().into_rgb8().into_raw()]
}

/// Full-resolution RGB throughout: with the identity stand-in a PNG and a JPEG come out exactly
/// as they were decoded outside the pasted face regions.
#[test]
fn outside_the_faces_the_picture_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (ext, tolerance) in [("png", 0u8), ("jpg", 0)] {
        let input = picture(d, ext, &[]);
        let (out, faces, _) = run_with_faces(d, &input, &format!("{ext}.png"), &identity(), &[]);
        let (w, want) = (512, decoded_rgb(&input));
        let (_, _, got) = rgb_frames(&out);
        let regions = &faces[0].0;
        assert_eq!(regions.len(), 1, "{ext}: one pasted region");
        let (mut outside, mut worst) = (0usize, 0u8);
        for (i, (a, b)) in got[0].chunks_exact(3).zip(want[0].chunks_exact(3)).enumerate() {
            if !inside(regions, i % w, i / w, 1.0) {
                outside += 1;
                for c in 0..3 {
                    worst = worst.max(a[c].abs_diff(b[c]));
                }
            }
        }
        assert!(
            outside > 512 * 512 / 4,
            "{ext}: most of the picture is outside the face"
        );
        assert!(worst <= tolerance, "{ext}: outside the face a pixel moved by {worst}");
        let (inner, _) = psnr(&got[0], &want[0], w, |x, y| inside(regions, x, y, 0.0));
        assert!(inner > 25.0, "{ext}: the identity model keeps the face ({inner:.1} dB)");
    }
    // JPEG output follows --quality: a smaller file at a lower quality, close at the highest.
    let png = picture(d, "png", &[]);
    let (_, _, src) = rgb_frames(&png);
    let mut sizes = Vec::new();
    for q in ["100", "30"] {
        let out = d.join(format!("q{q}.jpg"));
        ok(&gpen(&[&png, &out, &"--model", &identity(), &"--quality", &q]));
        let (w, _, got) = rgb_frames(&out);
        let (p, _) = psnr(&got[0], &src[0], w, |_, _| true);
        if q == "100" {
            assert!(p > 38.0, "quality 100: {p:.1} dB");
        }
        sizes.push(std::fs::metadata(&out).unwrap().len());
    }
    assert!(sizes[1] < sizes[0], "quality 30 is smaller: {sizes:?}");
}

/// A video with an image OUT, a still with a video OUT, image formats it does not write and a
/// bad --quality are refused up front, naming what to do, with nothing written.
#[test]
fn mismatched_kinds_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("in");
    std::fs::create_dir(&d).unwrap();
    let png = picture(&d, "png", &[]);
    let video = asset("samples/test/astronaut.mp4");
    let o = dir.path().join("out");
    std::fs::create_dir(&o).unwrap();
    fails(&video, &o.join("frame.png"), &[], "give a video output such as out.mp4");
    fails(&video, &o.join("frame.JPG"), &[], "is a video and output");
    fails(&png, &o.join("clip.mp4"), &[], "give an image output such as out.png");
    fails(&png, &o.join("a.gif"), &[], "does not write .gif images");
    fails(
        &png,
        &o.join("a.jpg"),
        &[&"--quality", &"0"],
        "--quality 0 is out of range",
    );
    fails(&png, &png, &[], "is the input file");
    assert_eq!(std::fs::read_dir(&o).unwrap().count(), 0, "nothing written");
}

/// `--compare side` writes the original left and the restored right (twice the width);
/// `--compare split` the left half original and the right half restored; for stills and videos.
#[test]
fn compare_views_hold_the_original_and_the_restored_halves() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let png = picture(d, "png", &[]);
    let model = asset("models/standin/negate-256.onnx");
    let (_, _, src) = rgb_frames(&png);
    let restored = d.join("restored.png");
    ok(&gpen(&[&png, &restored, &"--model", &model]));
    let (_, _, fixed) = rgb_frames(&restored);
    assert_ne!(src[0], fixed[0], "the negating stand-in changes the face");
    let row = |f: &[u8], y: usize, w: usize, x0: usize, x1: usize| f[(y * w + x0) * 3..(y * w + x1) * 3].to_vec();

    let side = d.join("side.png");
    ok(&gpen(&[&png, &side, &"--model", &model, &"--compare", &"side"]));
    let (w, h, got) = rgb_frames(&side);
    assert_eq!((w, h), (1024, 512));
    for y in 0..512 {
        assert_eq!(
            row(&got[0], y, 1024, 0, 512),
            row(&src[0], y, 512, 0, 512),
            "side: row {y} left"
        );
        assert_eq!(
            row(&got[0], y, 1024, 512, 1024),
            row(&fixed[0], y, 512, 0, 512),
            "side: row {y} right"
        );
    }

    let split = d.join("split.png");
    ok(&gpen(&[&png, &split, &"--model", &model, &"--compare", &"split"]));
    let (w, h, got) = rgb_frames(&split);
    assert_eq!((w, h), (512, 512));
    for y in 0..512 {
        assert_eq!(
            row(&got[0], y, 512, 0, 256),
            row(&src[0], y, 512, 0, 256),
            "split: row {y} left"
        );
        assert_eq!(
            row(&got[0], y, 512, 256, 512),
            row(&fixed[0], y, 512, 256, 512),
            "split: row {y} right"
        );
    }

    // A video side by side: twice the width, the left half the source's picture.
    let clip = asset("samples/test/astronaut.mp4");
    let out = d.join("side.mp4");
    ok(&gpen(&[
        &clip,
        &out,
        &"--model",
        &model,
        &"--compare",
        &"side",
        &"--frames",
        &"3",
        &AS_GIVEN[0],
        &AS_GIVEN[1],
        &AS_GIVEN[2],
        &AS_GIVEN[3],
    ]));
    let (w, h, frames) = rgb_frames(&out);
    let (sw, sh, source) = rgb_frames(&clip);
    assert_eq!((w, h, frames.len()), (2 * sw, sh, 3));
    let left: Vec<u8> = (0..h).flat_map(|y| row(&frames[0], y, w, 0, sw)).collect();
    let (p, _) = psnr(&left, &source[0], sw, |_, _| true);
    assert!(p > 35.0, "side video: left half is the source ({p:.1} dB)");
    let right: Vec<u8> = (0..h).flat_map(|y| row(&frames[0], y, w, sw, w)).collect();
    let (p, _) = psnr(&right, &source[0], sw, |_, _| true);
    assert!(p < 35.0, "side video: right half is restored ({p:.1} dB)");
}

/// An ICC profile in a JPEG input is kept in PNG and JPEG outputs.
#[test]
fn icc_profiles_are_kept() {
    use img_parts::{Bytes, DynImage, ImageICC};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plain = std::fs::read(picture(d, "jpg", &[])).unwrap();
    let mut img = DynImage::from_bytes(plain.into()).unwrap().unwrap();
    let profile = Bytes::from((0..600u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    img.set_icc_profile(Some(profile.clone()));
    let input = d.join("icc.jpg");
    std::fs::write(&input, img.encoder().bytes()).unwrap();
    for ext in ["png", "jpg"] {
        let (out, _, _) = run_with_faces(d, &input, &format!("icc-out.{ext}"), &identity(), &[]);
        let got = DynImage::from_bytes(std::fs::read(&out).unwrap().into())
            .unwrap()
            .unwrap();
        assert_eq!(got.icc_profile(), Some(profile.clone()), "{ext}: the profile is kept");
    }
}

/// A portrait stored sideways with an EXIF orientation tag comes out upright, its face found.
#[test]
fn exif_orientation_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The upright picture (512x384) and the same stored a quarter turn anticlockwise (384x512),
    // which a viewer turns clockwise (orientation 6).
    let upright = picture(d, "png", &["-vf", "crop=512:384:0:0"]);
    let sideways = d.join("sideways.jpg");
    let plain = picture(d, "jpg", &["-vf", "crop=512:384:0:0,transpose=2", "-q:v", "2"]);
    std::fs::write(&sideways, with_orientation(&std::fs::read(&plain).unwrap(), 6)).unwrap();
    let (_, _, want) = rgb_frames(&upright);
    let (out, faces, _) = run_with_faces(d, &sideways, "upright.png", &identity(), &[]);
    let (w, h, got) = rgb_frames(&out);
    assert_eq!((w, h), (512, 384), "turned upright");
    assert_eq!(faces[0].1.len(), 1, "the face is found");
    let (p, _) = psnr(&got[0], &want[0], w, |_, _| true);
    assert!(p > 30.0, "the upright picture ({p:.1} dB)");
    // The output keeps the EXIF block, its orientation reset: read again, it is not turned.
    let bytes = std::fs::read(&out).unwrap();
    assert!(bytes.windows(4).any(|w| w == b"eXIf"), "EXIF kept in the PNG");
    let (again, _, _) = run_with_faces(d, &out, "again.jpg", &identity(), &[]);
    let (w, h, _) = rgb_frames(&again);
    assert_eq!((w, h), (512, 384), "the kept EXIF says upright");
    // Without the tag the picture stays as stored.
    let (out, _, _) = run_with_faces(d, &plain, "stored.png", &identity(), &[]);
    let (w, h, _) = rgb_frames(&out);
    assert_eq!((w, h), (384, 512));
}

/// A 16-bit PNG goes through 8-bit RGB: the run says so, once, and the picture is written.
#[test]
fn a_deeper_still_is_written_with_eight_bits_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep.png");
    let src = asset("samples/astronaut.png");
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            src.to_str().unwrap(),
            "-pix_fmt",
            "rgb48be",
            deep.to_str().unwrap(),
        ],
    );
    let out = dir.path().join("out.png");
    let err = ok(&gpen(&[&deep, &out, &"--model", &identity()]));
    assert_eq!(err.matches("written with 8 bits per channel").count(), 1, "{err}");
    assert_eq!(magic(&out), "png");
}

/// A WebP output wider than WebP holds is refused before the run, naming the limit (libwebp
/// refused it only after the whole run).
#[test]
fn a_webp_output_too_wide_for_webp_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.png");
    lavfi_picture("color=c=gray:s=16400x16", &wide);
    let out = dir.path().join("out.webp");
    let r = gpen(&[&wide, &out]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(err.contains("16383") && err.contains("out.webp"), "{err}");
    assert!(!err.contains("starting"), "refused before the run: {err}");
    assert!(!out.exists());
}

/// A QOI picture is read as a still (by `image`; it was taken for a video and refused with a
/// still OUT): restored to PNG exactly as the PNG it was made from, the face found. QOI is not
/// written.
#[test]
fn a_qoi_still_is_read_as_its_png_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let png = picture(d, "png", &[]);
    let qoi = picture(d, "qoi", &[]);
    assert_eq!(&std::fs::read(&qoi).unwrap()[..4], b"qoif");
    let (from_qoi, faces, _) = run_with_faces(d, &qoi, "from-qoi.png", &identity(), &[]);
    assert_eq!(faces[0].1.len(), 1, "the face is found");
    let (from_png, _, _) = run_with_faces(d, &png, "from-png.png", &identity(), &[]);
    assert_eq!(rgb_frames(&from_qoi), rgb_frames(&from_png), "the same picture");
    fails(&png, &d.join("out.qoi"), &[], "does not write .qoi images");
}
