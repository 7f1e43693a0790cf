//! The face mesh end to end: in, the shipped portrait's face turned by perspective warps (yaw
//! about 30 and 60 degrees, both ways) on a flat wall, and textures with no face; out, the
//! negate stand-in's paste weight measured against each face's mesh outline (from the faces
//! JSON: the mesh equals TFLite's own, models/test_mesh_export.py): how much lands outside it,
//! how much of it is covered, the wall beside the face unchanged, and detections that are not
//! faces dropped.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

/// The portrait's head turned by a perspective warp (`corners`: where the crop's corners land,
/// as FFmpeg's perspective filter takes them), on a flat 512x384 wall.
fn turned(dir: &Path, name: &str, corners: &str) -> PathBuf {
    let out = dir.join(format!("{name}.png"));
    let graph = format!(
        "[1:v]crop=300:300:110:0,perspective={corners}:sense=destination:eval=init[p];[0:v][p]overlay=106:42,format=rgb24"
    );
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "color=c=0x6a7f8c:s=512x384",
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-filter_complex",
        &graph,
        "-frames:v",
        "1",
        arg(&out),
    ]);
    out
}

/// Packed RGB24 of a picture file.
fn rgb(f: &Path) -> Vec<u8> {
    tool(
        "ffmpeg",
        &["-v", "error", "-i", arg(f), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
    )
}

/// Whether (x, y) lies inside the polygon (even-odd rule).
fn inside(poly: &[[f64; 2]], x: f64, y: f64) -> bool {
    let mut c = false;
    for i in 0..poly.len() {
        let (a, b) = (poly[i], poly[(i + 1) % poly.len()]);
        if (a[1] > y) != (b[1] > y) && x < a[0] + (y - a[1]) / (b[1] - a[1]) * (b[0] - a[0]) {
            c = !c;
        }
    }
    c
}

/// The face outlines of a faces JSON's first record.
fn outlines(json: &Path) -> Vec<Vec<[f64; 2]>> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v[0]["faces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| {
            let pts = f["outline"].as_array()?;
            Some(
                pts.iter()
                    .map(|p| [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()])
                    .collect(),
            )
        })
        .collect()
}

/// Paste weight per pixel of the negate stand-in: how far each pixel moved towards its
/// negative (least squares over R, G, B), where the two differ enough to tell.
fn weights(input: &[u8], output: &[u8]) -> Vec<Option<f64>> {
    input
        .chunks_exact(3)
        .zip(output.chunks_exact(3))
        .map(|(i, o)| {
            let (mut num, mut den) = (0.0, 0.0);
            for c in 0..3 {
                let (i, o) = (i[c] as f64, o[c] as f64);
                let n = 255.0 - i;
                num += (o - i) * (n - i);
                den += (n - i) * (n - i);
            }
            (den >= 3.0 * 60.0 * 60.0).then(|| (num / den).clamp(0.0, 1.0))
        })
        .collect()
}

/// (Share of the paste weight outside the outline, share of the outline's pixels pasted at
/// 0.5 or more), over pixels whose weight can be told.
fn mask_figures(input: &[u8], output: &[u8], w: usize, outline: &[[f64; 2]]) -> (f64, f64) {
    let (mut outside, mut total, mut covered, mut area) = (0.0, 0.0, 0usize, 0usize);
    for (i, m) in weights(input, output).into_iter().enumerate() {
        let Some(m) = m else { continue };
        let (x, y) = ((i % w) as f64, (i / w) as f64);
        let inn = inside(outline, x, y);
        total += m;
        if !inn {
            outside += m;
        } else {
            area += 1;
            covered += usize::from(m >= 0.5);
        }
    }
    (outside / total.max(1e-9), covered as f64 / area.max(1) as f64)
}

/// The frontal face and turned ones (both ways, about 30 and 60 degrees): the mesh mask keeps
/// the paste inside the face's outline (at most 8 % of its weight outside, the wall beside the
/// face unchanged) and covers it (93 % or more at weight 0.5, leaving room for real photos'
/// outlines, which it covers less); the ellipse is measured beside it.
#[test]
fn the_mesh_mask_follows_turned_faces() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = asset("models/standin/negate-256.onnx");
    let model512 = asset("models/standin/negate-512.onnx");
    let cases = [
        ("frontal", "0:0:W:0:0:H:W:H"),
        ("right-30", "0:0:W*0.8:H*0.07:0:H:W*0.8:H*0.93"),
        ("right-60", "0:0:W*0.6:H*0.14:0:H:W*0.6:H*0.86"),
        ("left-30", "W*0.2:H*0.07:W:0:W*0.2:H*0.93:W:H"),
        ("left-60", "W*0.4:H*0.14:W:0:W*0.4:H*0.86:W:H"),
    ];
    for (name, corners) in cases {
        let input = turned(d, name, corners);
        let before = rgb(&input);
        let mut figures = Vec::new();
        let mut outline = Vec::new();
        // The 512 crop's mask (coarser table cells) on one case.
        let runs: &[(&str, &Path)] = if name == "right-60" {
            &[("mesh", &model), ("face", &model), ("mesh", &model512)]
        } else {
            &[("mesh", &model), ("face", &model)]
        };
        for (k, (mask, model)) in runs.iter().enumerate() {
            let (out, json) = (d.join(format!("{name}-{k}.png")), d.join(format!("{name}-{k}.json")));
            ok(&gpen(&[
                &input,
                &out,
                &"--model",
                model,
                &"--mask",
                mask,
                &"--faces-json",
                &json,
                &AS_GIVEN[0],
                &AS_GIVEN[1],
                &AS_GIVEN[2],
                &AS_GIVEN[3],
            ]));
            let found = outlines(&json);
            assert_eq!(found.len(), 1, "{name}: one face with an outline");
            if k == 0 {
                outline = found[0].clone();
            }
            figures.push(mask_figures(&before, &rgb(&out), 512, &outline));
        }
        if let Some(&(out512, cov512)) = figures.get(2) {
            println!(
                "{name}, 512 crop: outside {:.1} %, covered {:.1} %",
                out512 * 100.0,
                cov512 * 100.0
            );
            assert!(
                out512 <= 0.08 && cov512 >= 0.93,
                "{name}, 512 crop: {out512:.3}, {cov512:.3}"
            );
        }
        let ((out_mesh, cov_mesh), (out_face, cov_face)) = (figures[0], figures[1]);
        println!(
            "{name}: weight outside the outline mesh {:.1} % (ellipse {:.1} %), outline covered mesh {:.1} % (ellipse {:.1} %)",
            out_mesh * 100.0,
            out_face * 100.0,
            cov_mesh * 100.0,
            cov_face * 100.0
        );
        assert!(
            out_mesh <= 0.08,
            "{name}: {:.1} % of the weight outside",
            out_mesh * 100.0
        );
        assert!(cov_mesh >= 0.93, "{name}: {:.1} % covered", cov_mesh * 100.0);
        // The wall beside the face (to either side of the outline's widest row, beyond a
        // margin of a tenth of the face) keeps its pixels.
        let after = rgb(&d.join(format!("{name}-0.png")));
        let (x0, x1) = outline
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p[0]), b.max(p[0])));
        let (y0, y1) = outline
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p[1]), b.max(p[1])));
        let margin = (x1 - x0) / 10.0;
        for y in (y0 as usize)..(y1 as usize) {
            for x in (0..512).filter(|&x| (x as f64) < x0 - margin || (x as f64) > x1 + margin) {
                if !(106..406).contains(&x) {
                    let i = (y * 512 + x) * 3;
                    assert_eq!(
                        before[i..i + 3],
                        after[i..i + 3],
                        "{name}: wall pixel ({x}, {y}) changed"
                    );
                }
            }
        }
    }
}

/// Face-like texture (a Mandelbrot set) at a low detector threshold: the detector finds
/// "faces" in it, the face mesh drops every one (counted in the stats), and the picture comes
/// out unchanged; without the mesh, they are restored.
#[test]
fn detections_that_are_not_faces_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tex = d.join("tex.png");
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "mandelbrot=s=640x480",
            "-frames:v",
            "1",
            "-vf",
            "format=rgb24",
            arg(&tex),
        ],
    );
    let model = asset("models/standin/negate-256.onnx");
    let low: [&dyn AsRef<std::ffi::OsStr>; 4] = [&"--model", &model, &"--det-threshold", &"0.05"];
    let (plain, checked, stats) = (d.join("plain.png"), d.join("checked.png"), d.join("stats.json"));
    ok(&gpen(
        &[
            &[&tex as &dyn AsRef<std::ffi::OsStr>, &plain, &"--mesh", &"none"][..],
            &low,
        ]
        .concat(),
    ));
    assert_ne!(
        rgb(&plain),
        rgb(&tex),
        "without the mesh, the detector's false faces are restored"
    );
    ok(&gpen(
        &[
            &[&tex as &dyn AsRef<std::ffi::OsStr>, &checked, &"--stats-json", &stats][..],
            &low,
        ]
        .concat(),
    ));
    assert_eq!(rgb(&checked), rgb(&tex), "the mesh dropped every false face");
    let json = std::fs::read_to_string(&stats).unwrap();
    assert!(json_number(&json, "detections_not_faces") >= 1, "{json}");
    assert_eq!(json_number(&json, "faces"), 0, "{json}");
}

/// A Mandelbrot zoom (FFmpeg's `mandelbrot` source, 640x360, 3 s) at the default settings: the
/// detector finds "faces" in its texture again and again in one place, some scoring 0.5 or
/// more, and the face mesh doubts them; the detector's five points on them huddle in the box's
/// middle, so no detection supports another and none is restored (the negate stand-in would
/// show it), though the detector alone finds them.
#[test]
fn texture_found_again_and_again_in_one_place_is_not_restored() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let zoom = d.join("zoom.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "mandelbrot=s=640x360:r=25",
        "-t",
        "3",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        "-threads",
        "1",
        arg(&zoom),
    ]);
    let model = asset("models/standin/negate-256.onnx");
    let run = |extra: &[&dyn AsRef<std::ffi::OsStr>]| {
        let (out, stats) = (d.join("out.mp4"), d.join("stats.json"));
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&zoom, &out, &"--model", &model, &"--stats-json", &stats];
        args.extend_from_slice(extra);
        ok(&gpen(&args));
        std::fs::read_to_string(&stats).unwrap()
    };
    let alone = run(&[&"--mesh", &"none"]);
    assert!(
        json_number(&alone, "frames_with_faces") >= 2,
        "the detector alone finds the texture's faces: {alone}"
    );
    let checked = run(&[]);
    assert_eq!(json_number(&checked, "faces"), 0, "{checked}");
    assert_eq!(json_number(&checked, "detections_kept_doubted"), 0, "{checked}");
    assert!(json_number(&checked, "detections_not_faces") >= 2, "{checked}");
}

/// A face mesh file that is not there is an error naming it and what to do; `--mesh none`
/// runs without one (no outline recorded).
#[test]
fn a_missing_mesh_is_named_and_none_runs_without() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = asset("models/standin/identity-256.onnx");
    let input = asset("samples/test/astronaut.mp4");
    fails(
        &input,
        &d.join("o.mp4"),
        &[&"--model", &model, &"--mesh", &d.join("nope.onnx")],
        "face mesh",
    );
    let json = d.join("f.json");
    ok(&gpen(&[
        &input,
        &d.join("o2.mp4"),
        &"--model",
        &model,
        &"--mesh",
        &"none",
        &"--faces-json",
        &json,
        &"--frames",
        &"5",
    ]));
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(text.contains("landmarks") && !text.contains("outline"), "{text}");
}

/// Without the face-mesh file (a copy of the binary run from a folder without the set-up's
/// models) the run is not an error: it says once that it falls back to the detector's points
/// and the ellipse, and restores the faces.
#[test]
fn without_the_mesh_file_the_run_falls_back_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bin = d.join("bin/gpen-video");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_gpen-video"), &bin).unwrap();
    let out = d.join("o.mp4");
    let r = std::process::Command::new(&bin)
        .current_dir(d)
        .arg(asset("samples/test/astronaut.mp4"))
        .arg(&out)
        .args(["--frames", "5", "--model"])
        .arg(asset("models/standin/negate-256.onnx"))
        // No face-identity model there either: the guard, which needs it, is off.
        .args(["--identity-guard", "off"])
        .arg("--detector")
        .arg(asset("models/centerface.onnx"))
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert_eq!(err.matches("no face mesh").count(), 1, "{err}");
    assert!(err.contains("ellipse") && err.contains("scripts/setup.sh"), "{err}");
    assert!(err.contains("5 faces"), "{err}");
}

/// Real faces as people bring them to a restorer (the shipped portrait clip made blocky,
/// smeared, blurred, noisy, grainy and tiny; two tiny LFW faces under noise): the face check
/// keeps the face in at least 95 % of the frames where the detector alone finds it, though the
/// face mesh doubts most of them.
#[test]
fn degraded_real_faces_are_restored_where_the_detector_finds_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = asset("samples/test/astronaut.mp4");
    // A QCIF frame around the face (about 17 px between the eyes), as old phone clips are.
    let qcif = "crop=240:196:205:10,scale=176:144";
    let film = "hue=s=0.2,noise=alls=30:allf=t+u,eq=brightness='0.06*sin(7*t)':eval=frame,vignette,gblur=sigma=1.5";
    let x264 = |crf: &'static str| vec!["-c:v", "libx264", "-crf", crf];
    let clips: Vec<(&str, &str, Vec<&str>)> = vec![
        (
            "qcif-4kb.mp4",
            qcif,
            vec!["-c:v", "libx264", "-b:v", "8k", "-preset", "veryfast"],
        ),
        ("qcif-blocky.mp4", qcif, vec!["-c:v", "mpeg4", "-q:v", "31"]),
        ("jpeg-blocks.avi", "scale=320:180", vec!["-c:v", "mjpeg", "-q:v", "31"]),
        (
            "shrunk-blocky.mp4",
            "scale=176:144",
            vec!["-c:v", "mpeg4", "-q:v", "31"],
        ),
        ("blur.mp4", "gblur=sigma=4", x264("23")),
        ("noise.mp4", "noise=alls=45:allf=t", x264("23")),
        ("old-film.mp4", film, x264("26")),
    ];
    let model = asset("models/standin/identity-256.onnx");
    // Real faces of another source, small and noisy: two of the set-up's LFW faces (25x25,
    // from the scikit-image wheel) scaled up four times, swaying on a grey wall.
    let lfw = asset("samples/lfw-faces.pgm");
    let lfw_clip = |k: usize| {
        let graph = format!(
            "[1:v]crop=25:25:{}:0,scale=100:100:flags=bicubic,format=yuv420p[f];[0:v][f]overlay=x='90+20*sin(n/8)':y=50,noise=alls=40:allf=t,format=yuv420p",
            25 * k
        );
        let out = d.join(format!("lfw-{k}-noise.mp4"));
        ffmpeg(&[
            "-f",
            "lavfi",
            "-i",
            "color=c=0x707070:s=320x240:r=25",
            "-i",
            arg(&lfw),
            "-filter_complex",
            &graph,
            "-frames:v",
            "40",
            "-c:v",
            "libx264",
            "-crf",
            "28",
            "-threads",
            "1",
            arg(&out),
        ]);
        out
    };
    let mut made: Vec<PathBuf> = vec![lfw_clip(2), lfw_clip(3)];
    for (name, vf, codec) in clips {
        let clip = d.join(name);
        let mut args = vec!["-i", arg(&src), "-an", "-threads", "1", "-vf", vf];
        args.extend(codec);
        args.push(arg(&clip));
        ffmpeg(&args);
        made.push(clip);
    }
    let mut report = Vec::new();
    for clip in made {
        let name = clip.file_name().unwrap().to_string_lossy().into_owned();
        let run = |extra: &[&dyn AsRef<std::ffi::OsStr>]| {
            let (out, stats) = (d.join(format!("out-{name}")), d.join("stats.json"));
            // What is counted is detection's: the guard and the hands stage are left out, and
            // the frames written are not looked at (the encoder's fastest preset).
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
                &clip,
                &out,
                &"--model",
                &model,
                &"--stats-json",
                &stats,
                &"--identity-guard",
                &"off",
                &"--occlusion",
                &"off",
                &"--preset",
                &"ultrafast",
            ];
            args.extend_from_slice(extra);
            ok(&gpen(&args));
            std::fs::read_to_string(&stats).unwrap()
        };
        let alone = json_number(&run(&[&"--mesh", &"none"]), "frames_with_faces");
        let checked = run(&[]);
        let kept = json_number(&checked, "frames_with_faces");
        report.push(format!(
            "{name}: {kept} of {alone} ({} kept though the mesh doubted them)",
            json_number(&checked, "detections_kept_doubted")
        ));
        assert!(alone >= 10, "{name}: the detector finds the face in {alone} frames");
        assert!(kept * 100 >= alone * 95, "{}", report.join("; "));
    }
    eprintln!("{}", report.join("\n"));
}
