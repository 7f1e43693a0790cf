//! The source's colour matrix: in, clips of known colour patches made here with FFmpeg (BT.709
//! tagged, HD untagged, SD untagged with BT.601); out, the RGB the pipeline's decoder hands to
//! alignment (what the model sees), read through the library, against the true colours.

use gpen_video::api::frame::Pool;
use gpen_video::api::geom::Rect;
use gpen_video::api::media::decode::{probe, Decoder};

const PATCHES: [[u8; 3]; 4] = [[200, 60, 40], [40, 160, 70], [50, 70, 210], [230, 200, 170]];

/// Writes a lossless clip of the four patches side by side, converted to YCbCr with `matrix`,
/// tagged with it when `tag`.
fn patches_clip(path: &std::path::Path, (w, h): (usize, usize), matrix: &str, tag: bool) {
    let pw = w / 4;
    let mut args: Vec<String> = ["-v", "error", "-y"].iter().map(|s| s.to_string()).collect();
    for c in PATCHES {
        args.extend([
            "-f".into(),
            "lavfi".into(),
            "-i".into(),
            format!("color=c=0x{:02x}{:02x}{:02x}:s={pw}x{h}:r=10:d=0.3", c[0], c[1], c[2]),
        ]);
    }
    args.extend([
        "-filter_complex".into(),
        // Exact RGB first (the colour source may start in YCbCr), then one conversion.
        format!(
            "[0:v]format=rgb24[a];[1:v]format=rgb24[b];[2:v]format=rgb24[c];[3:v]format=rgb24[d];\
             [a][b][c][d]hstack=inputs=4,scale=out_color_matrix={matrix}:out_range=tv,format=yuv420p[v]"
        ),
        "-map".into(),
        "[v]".into(),
        "-c:v".into(),
        "libx264".into(),
        "-qp".into(),
        "0".into(),
    ]);
    if tag {
        args.extend(["-colorspace".into(), matrix.into()]);
    }
    args.push(path.to_str().unwrap().into());
    let out = std::process::Command::new("ffmpeg").args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The first frame's RGB at each patch's centre, as the pipeline converts it.
fn decoded_patches(path: &std::path::Path) -> Vec<[u8; 3]> {
    let info = probe(path).unwrap();
    let (w, h) = (info.width, info.height);
    let decoder = Decoder::new(info, (64, 64), false);
    let (rgb, det) = (Pool::new(2), Pool::new(2));
    let mut got = Vec::new();
    decoder
        .run((&rgb, &det), Some(1), |mut f| {
            gpen_video::api::media::color::ensure_rgb(&mut f, Rect::new(0, 0, w, h));
            got = (0..4)
                .map(|i| {
                    let (x, y) = (w / 8 + i * w / 4, h / 2);
                    let p = &f.rgb[(y * w + x) * 3..][..3];
                    [p[0], p[1], p[2]]
                })
                .collect();
            false
        })
        .unwrap();
    got
}

#[test]
fn the_model_sees_the_true_colours_of_bt709_bt601_and_untagged_sources() {
    let dir = tempfile::tempdir().unwrap();
    for (name, size, matrix, tag) in [
        ("tagged709.mp4", (1280, 720), "bt709", true),
        ("untagged-hd.mp4", (1280, 720), "bt709", false),
        ("untagged-sd.mp4", (640, 360), "bt601", false),
        ("tagged601-hd.mp4", (1280, 720), "bt470bg", true),
    ] {
        let path = dir.path().join(name);
        patches_clip(&path, size, matrix, tag);
        for (got, want) in decoded_patches(&path).iter().zip(PATCHES) {
            let off = (0..3).map(|c| (got[c] as i32 - want[c] as i32).abs()).max().unwrap();
            assert!(off <= 2, "{name}: {want:?} reached the model as {got:?}");
        }
    }
}
