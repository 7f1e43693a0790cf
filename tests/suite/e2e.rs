//! End-to-end tests: in, the generated sample clips and stand-in models (scripts/setup.sh makes
//! them); out, assertions on the real binary's output files, read back with FFmpeg's own tools.

use crate::common;

use std::path::Path;

use common::*;

#[test]
fn keeps_frames_timestamps_audio_and_subtitles() {
    let dir = tempfile::tempdir().unwrap();
    for (clip, ext, streams) in [
        ("astronaut.mp4", "mp4", &["0:a"][..]),
        ("vfr.mkv", "mkv", &["0:a"]),
        ("group.mkv", "mkv", &["0:a", "0:s"]),
    ] {
        let input = asset(&format!("samples/test/{clip}"));
        let out = dir.path().join(format!("out-{clip}.{ext}"));
        ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &asset("models/standin/identity-256.onnx"),
        ]));
        let (pin, pout) = (video_pts(&input), video_pts(&out));
        assert!(!pin.is_empty());
        assert_eq!(pin.len(), pout.len(), "{clip}: frame count");
        assert_eq!(time_base(&input), time_base(&out), "{clip}: time base");
        assert_eq!(pin, pout, "{clip}: timestamps");
        for map in streams {
            let (a, b) = (packet_md5(&input, map), packet_md5(&out, map));
            assert!(!a.is_empty(), "{clip} has {map} packets");
            assert_eq!(a, b, "{clip}: {map} packets identical");
        }
    }
}

#[test]
fn finds_the_astronaut_in_at_least_95_percent_of_frames() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/identity-256.onnx");
    let (_, frames, _) = run_with_faces(dir.path(), &input, "o.mp4", &model, &[]);
    assert_eq!(frames.len(), video_pts(&input).len());
    assert_faces_found(&frames, 95);
    // Found the right way up: eyes left to right, above the nose, above the mouth; and on
    // the face, in the upper half of the picture (a mirrored or turned mapping breaks this).
    let points = landmarks(&dir.path().join("o.mp4.faces.json"));
    for (i, lm) in points.iter().enumerate() {
        let Some(p) = lm else { continue };
        let upright = p[0][0] < p[1][0] && p[0][1].max(p[1][1]) < p[2][1] && p[2][1] < p[3][1].min(p[4][1]);
        assert!(upright && p[2][1] < 180.0, "frame {i}: face points {p:?}");
    }
}

#[test]
fn identity_leaves_everything_outside_faces_as_a_plain_reencode_would() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let (faces, w, got, want) = run_against_plain(dir.path(), &input, &asset("models/standin/identity-512.onnx"));
    let mut all = Vec::new();
    assert_faces_found(&faces, 95);
    for (i, (g, p)) in got.iter().zip(&want).enumerate() {
        let regions = &faces[i].0;
        let (outside, n) = psnr(g, p, w, |x, y| !inside(regions, x, y, 2.0));
        assert!(n > 0 && outside > 36.0, "frame {i}: PSNR outside faces {outside:.1} dB");
        all.push(outside);
        let (face, n) = psnr(g, p, w, |x, y| inside(regions, x, y, 0.0));
        assert!(
            regions.is_empty() || (n > 0 && face > 28.0),
            "frame {i}: identity model changed the face (PSNR {face:.1} dB)"
        );
    }
    let mean = mean_psnr(&all);
    assert!(mean > 40.0, "PSNR outside faces over the clip {mean:.1} dB");
}

#[test]
fn a_visible_change_lands_on_faces_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let (faces, w, got, want) = run_against_plain(dir.path(), &input, &asset("models/standin/negate-512.onnx"));
    assert_faces_found(&faces, 95);
    assert_change_only_on_faces(&faces, w, &got, &want);
}

#[test]
fn multi_face_clip_fills_batches_of_four_and_fixed_batch_models_run_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let model = asset("models/standin/identity-256.onnx");
    let (_, frames, err) = run_with_faces(dir.path(), &input, "g.mkv", &model, &[]);
    let faces: usize = frames.iter().map(|(_, b)| b.len()).sum();
    assert!(
        frames.iter().all(|(_, b)| b.len() >= 4),
        "every frame has at least 4 faces: {:?}",
        frames.iter().map(|f| f.1.len()).collect::<Vec<_>>()
    );
    assert_eq!(
        batches(&err),
        faces.div_ceil(4) as u64,
        "{faces} faces in full batches of 4"
    );

    let out1 = dir.path().join("g1.mkv");
    let err = ok(&gpen(&[
        &input,
        &out1,
        &"--model",
        &asset("models/standin/identity-512-batch1.onnx"),
    ]));
    assert_eq!(batches(&err), faces as u64, "a batch-1 model runs one crop per call");
    assert_eq!(video_pts(&out1).len(), frames.len());
}

#[test]
fn frames_without_faces_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/noface.mp4");
    let model = asset("models/standin/negate-256.onnx");
    let (out, faces, err) = run_with_faces(dir.path(), &input, "n.mp4", &model, &[]);
    assert!(err.contains(" 0 faces"), "{err}");
    assert!(faces.iter().all(|(r, b)| r.is_empty() && b.is_empty()));
    assert_eq!(video_pts(&out), video_pts(&input));
    // Untouched pictures: what a plain re-encode with the same settings gives.
    let plain = dir.path().join("plain.mp4");
    plain_reencode(&input, &plain);
    let ((w, _, got), (_, _, want)) = (rgb_frames(&out), rgb_frames(&plain));
    assert_eq!(got.len(), want.len());
    for (i, (g, p)) in got.iter().zip(&want).enumerate() {
        let (db, _) = psnr(g, p, w, |_, _| true);
        assert!(db > 40.0, "frame {i}: {db:.1} dB from a plain re-encode");
    }
}

#[test]
fn bad_inputs_fail_clearly_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/identity-256.onnx");
    let out = d.join("out.mp4");
    let m: [&dyn AsRef<std::ffi::OsStr>; 2] = [&"--model", &model];

    fails(&d.join("missing.mp4"), &out, &m, "cannot read input");
    let text = d.join("notes.mp4");
    std::fs::write(&text, "this is not a video\n".repeat(50)).unwrap();
    fails(&text, &out, &m, "is not a readable video");

    let bytes = std::fs::read(&good).unwrap();
    let cut = d.join("cut.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(&cut, &out, &m, "truncated");

    fails(&good, &out, &[&"--model", &d.join("nope.onnx")], "cannot read model");
    let junk = d.join("junk.onnx");
    std::fs::write(&junk, b"not a model").unwrap();
    fails(&good, &out, &[&"--model", &junk], "cannot load model");
    fails(
        &good,
        &out,
        &[&"--model", &asset("models/standin/bad-shape.onnx")],
        "[N,3,S,S]",
    );

    fails(&good, &d.join("no/such/dir/out.mp4"), &m, "does not exist");
    fails(&good, Path::new("/proc/gpen-video-test.mp4"), &m, "not writable");
    fails(&good, &d.join("out.unknownext"), &m, "cannot tell the container");
    fails(
        &good,
        &out,
        &[&"--model", &model, &"--device", &"cuda:0"],
        "CUDA execution provider could not start",
    );

    // OUT equal to IN is refused and the input is untouched.
    let copy = d.join("same.mp4");
    std::fs::copy(&good, &copy).unwrap();
    fails(&copy, &copy, &m, "is the input file");
    assert_eq!(std::fs::read(&copy).unwrap(), bytes);
    // A usage error (clap's exit code 2), not a one-frame video.
    let r = gpen(&[&good, &out, &"--frames", &"0"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(err.contains("--frames"), "{err}");
    assert!(!out.exists());
}

#[test]
fn runs_the_exported_gpen_256_in_batches_of_four() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let model = asset("models/gpen-bfr-256-random.onnx");
    // 24 of the clip's 60 frames: six batches of the real architecture, not fifteen.
    let (out, frames, err) = run_with_faces(
        dir.path(),
        &input,
        "gpen.mp4",
        &model,
        &[&"--batch", &"4", &"--frames", &"24"],
    );
    let faces: usize = frames.iter().map(|(_, b)| b.len()).sum();
    assert!(faces > 0);
    // One face per frame: batches fill across frames. A partial batch may leave early only when
    // the enhancer sat idle waiting, so the mean fill stays high.
    let b = batches(&err) as f64;
    let fill = faces as f64 / (4.0 * b);
    assert!(
        b >= faces.div_ceil(4) as f64 && fill >= 0.75,
        "{faces} faces in {b} batches of 4: {err}"
    );
    assert_eq!(video_pts(&out), video_pts(&input)[..24]);
}

#[test]
fn model_names_resolve_through_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let r = gpen(&[&"models", &"list"]);
    let list = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success() && list.contains("GPEN-BFR-512") && list.contains("centerface"),
        "{list}"
    );
    let input = asset("samples/test/astronaut.mp4");
    let out = dir.path().join("o.mp4");
    ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &"gpen-bfr-256-random",
        &"--frames",
        &"4",
    ]));
    assert_eq!(video_pts(&out).len(), 4, "--frames 4 writes 4 frames");
    let missing = dir.path().join("m.mp4");
    fails(
        &input,
        &missing,
        &[&"--model", &"GPEN-BFR-2048"],
        "models fetch GPEN-BFR-2048",
    );
}

#[test]
fn ctrl_c_or_sigterm_stops_a_run_and_leaves_no_output() {
    // The exit status is 128 + the signal, as a shell reports it: 130 for Ctrl-C, 143 for a
    // SIGTERM (what Kubernetes and Slurm send).
    for (signal, code) in [("-INT", 130), ("-TERM", 143)] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.mp4");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_gpen-video"))
            .args([asset("samples/test/astronaut.mp4").as_os_str(), out.as_os_str()])
            .args(["--quiet", "--model"])
            .arg(asset("models/standin/identity-256.onnx"))
            .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
            // Slow batches keep the run going long enough to be interrupted.
            .env("GPEN_VIDEO_FAULTS", "slow=0:500")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2000));
        let kill = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let r = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(code), "{signal}: {err}");
        assert!(err.contains("interrupted"), "{err}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no output and no partial file"
        );
    }
}

#[test]
fn sideways_phone_video_keeps_its_rotation_and_its_faces_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/rotated.mp4");
    let model = asset("models/standin/negate-256.onnx");
    let (frames, w, got, want) = run_against_plain(dir.path(), &input, &model);
    let out = dir.path().join("run.mp4");
    let rotation = |f: &std::path::Path| probe_video(f, "stream_side_data=rotation").trim().to_string();
    assert_eq!(rotation(&input), "90");
    assert_eq!(rotation(&out), "90", "display matrix copied");
    // The faces lie on their side in the stored picture: found only if detection turns it
    // upright, and changed where they are only if their points are mapped back correctly.
    assert_faces_found(&frames, 95);
    assert_change_only_on_faces(&frames, w, &got, &want);
    // And their points are the face's: the clip is the upright test clip turned 90 degrees
    // clockwise (a pixel at (x, y) of the 640x360 picture is stored at (359 - y, x)), so the
    // eyes, nose and mouth found upright, turned, land where they were found sideways.
    let upright = asset("samples/test/astronaut.mp4");
    let identity = asset("models/standin/identity-256.onnx");
    let up_json = dir.path().join("up.json");
    let up_out = dir.path().join("up.mp4");
    ok(&gpen(&[
        &upright,
        &up_out,
        &"--model",
        &identity,
        &"--frames",
        &"30",
        &"--faces-json",
        &up_json,
    ]));
    let (shown, stored) = (landmarks(&up_json), landmarks(&dir.path().join("run.mp4.faces.json")));
    let mut matched = 0;
    for (s, u) in stored.iter().zip(&shown) {
        let (Some(s), Some(u)) = (s, u) else { continue };
        let eyes = ((u[0][0] - u[1][0]).powi(2) + (u[0][1] - u[1][1]).powi(2)).sqrt();
        let off = s
            .iter()
            .zip(u)
            .map(|(p, q)| ((p[0] - (359.0 - q[1])).powi(2) + (p[1] - q[0]).powi(2)).sqrt())
            .fold(0.0, f64::max);
        matched += usize::from(off < 0.25 * eyes);
    }
    assert!(
        matched * 100 >= frames.len() * 90,
        "{matched} of {} frames have the face's points where it is",
        frames.len()
    );
    assert_eq!(video_pts(&out), video_pts(&input));
}

/// From four cores the decode stage shares its conversions through swscale among swscale's
/// threads (the detection copy; for a source not converted region by region, such as yuv444p,
/// the whole picture's RGB too): none of their time is then on the stage's own thread, where a
/// run on two cores spends it, and the pictures are the same.
#[test]
fn conversions_shared_among_threads_write_the_same_pictures() {
    let dir = tempfile::tempdir().unwrap();
    let yuv444 = dir.path().join("in444.mkv");
    deep_source(&yuv444, "yuv444p", "libx264", false);
    let model = asset("models/standin/negate-256.onnx");
    for input in [yuv444, asset("samples/test/astronaut.mp4")] {
        // The pictures, and the conversions' CPU seconds on the decode stage's own thread.
        let run = |threads: &str| {
            let (out, stats) = (dir.path().join("shared.mkv"), dir.path().join("shared.json"));
            let args: [&dyn AsRef<std::ffi::OsStr>; 10] = [
                &input,
                &out,
                &"--model",
                &model,
                &"--frames",
                &"12",
                &"--threads",
                &threads,
                &"--stats-json",
                &stats,
            ];
            ok(&gpen(&args));
            let json = std::fs::read_to_string(&stats).unwrap();
            let decode = json.split("{\"name\":\"decode\"").nth(1).expect("a decode stage");
            let spread = decode.split("\"spread_cpu_s\":").nth(1).expect("its spread");
            let end = spread.find([',', '}']).unwrap();
            (framemd5(&out, "0:v", false), spread[..end].parse::<f64>().unwrap())
        };
        let ((alone, on_thread), (shared, left)) = (run("2"), run("8"));
        assert!(
            on_thread > 0.0 && left == 0.0,
            "{on_thread} s on two cores, {left} s on eight"
        );
        assert_eq!(alone, shared, "{}", input.display());
    }
}

#[test]
fn other_pixel_formats_in_and_out_keep_faces_changed_and_the_rest_intact() {
    let dir = tempfile::tempdir().unwrap();
    let src = asset("samples/test/astronaut.mp4");
    // A yuv444p source (its own planes kept, crops read from a whole-picture RGB copy) and an RGB
    // encoder (libx264rgb), besides the yuv420p-to-yuv420p path the other tests take.
    let yuv444 = dir.path().join("in444.mkv");
    deep_source(&yuv444, "yuv444p", "libx264", false);
    for (input, codec) in [(&yuv444, "libx264"), (&src, "libx264rgb")] {
        let (out, faces, _) = run_with_faces(
            dir.path(),
            input,
            &format!("o-{codec}.mkv"),
            &asset("models/standin/negate-256.onnx"),
            &[&"--codec", &codec, &"--frames", &"12"],
        );
        let (w, _, got) = rgb_frames(&out);
        let (_, _, orig) = rgb_frames(input);
        assert_eq!(got.len(), 12, "{codec}");
        for (i, (g, o)) in got.iter().zip(&orig).enumerate() {
            let (regions, boxes) = &faces[i];
            let (outside, _) = psnr(g, o, w, |x, y| !inside(regions, x, y, 2.0));
            assert!(outside > 30.0, "{codec} frame {i}: outside faces {outside:.1} dB");
            let (face, n) = psnr(g, o, w, |x, y| inside(boxes, x, y, -10.0));
            assert!(
                n > 0 && face < 15.0,
                "{codec} frame {i}: face not changed ({face:.1} dB)"
            );
        }
    }
}

/// Makes a 640x360, 10 fps, 40-frame clip from the portrait: face A from the start; a smaller
/// face B from frame 13 (a local change, not a new scene); at frame 27 a cut (new background)
/// where face C appears while A and B stay.
fn appearing_faces_clip(out: &std::path::Path) {
    let graph = "[1:v]drawbox=x=0:y=0:w=iw:h=ih:color=0xd0c8a0:t=fill:enable='gte(t,2.65)'[bg];\
        [0:v]split=3[a0][b0][c0];[a0]scale=200:200[a];[b0]scale=150:150[b];[c0]scale=130:130[c];\
        [bg][a]overlay=x=20:y=80:shortest=1[o1];\
        [o1][b]overlay=x=470:y=20:enable='gte(t,1.25)'[o2];\
        [o2][c]overlay=x=290:y=215:enable='gte(t,2.65)',format=yuv420p[v]";
    portrait_clip(out, graph, 40);
}

/// Makes a 640x360, 10 fps clip of `frames` frames from the portrait (input 0, looped) over a
/// plain background (input 1) through the filter `graph`, whose output is `[v]`.
fn portrait_clip(out: &std::path::Path, graph: &str, frames: u32) {
    let png = asset("samples/astronaut.png");
    let (frames, length) = (
        frames.to_string(),
        format!("color=c=0x2a3440:s=640x360:r=10:d={}", frames.div_ceil(10)),
    );
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-y",
            "-loop",
            "1",
            "-i",
            png.to_str().unwrap(),
            "-f",
            "lavfi",
            "-i",
            &length,
            "-filter_complex",
            graph,
            "-map",
            "[v]",
            "-frames:v",
            &frames,
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-crf",
            "16",
            out.to_str().unwrap(),
        ],
    );
}

/// Runs the identity stand-in on `input` with `--detect-every every`, with the face mesh or
/// without it (`--mesh none`); returns the faces and the whole-frame passes, the windows round
/// tracked faces and the faces followed by the mesh.
fn detection_run(dir: &Path, input: &Path, every: &str, mesh: bool) -> (Faces, u64, u64, u64) {
    let tag = format!("{every}{}", if mesh { "" } else { "-nomesh" });
    let stats = dir.join(format!("s{tag}.json"));
    let model = asset("models/standin/identity-256.onnx");
    let mut extra: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"--detect-every", &every, &"--stats-json", &stats];
    if !mesh {
        extra.extend([&"--mesh" as &dyn AsRef<std::ffi::OsStr>, &"none"]);
    }
    let (_, faces, _) = run_with_faces(dir, input, &format!("o{tag}.mp4"), &model, &extra);
    let stats = std::fs::read_to_string(stats).unwrap();
    (
        faces,
        json_number(&stats, "detect_full"),
        json_number(&stats, "detect_windows"),
        json_number(&stats, "detect_followed"),
    )
}

/// Faces are followed between whole-frame passes: by the face mesh from their points on the
/// frame before (with a mesh), or by the detector in windows round them (without).
#[test]
fn tracked_faces_match_full_detection_and_new_faces_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("appear.mp4");
    appearing_faces_clip(&input);
    for mesh in [true, false] {
        let run = |every: &str| detection_run(dir.path(), &input, every, mesh);
        let (every_frame, full_1, windows_1, followed_1) = run("1");
        let (tracked, full_5, windows_5, followed_5) = run("5");
        let counts = |f: &Faces| f.iter().map(|(_, b)| b.len()).collect::<Vec<_>>();

        // The clip is what it claims: whole-frame detection on every frame sees 1, then 2, then 3.
        let expect: Vec<usize> = (0..40)
            .map(|n| 1 + usize::from(n >= 13) + usize::from(n >= 27))
            .collect();
        assert_eq!(counts(&every_frame), expect, "mesh {mesh}");
        assert_eq!((full_1, windows_1, followed_1), (40, 0, 0), "mesh {mesh}");

        // Tracking: B (a local change) is found within 5 frames of appearing; C, which comes
        // with a cut, on the cut itself; no face is ever dropped.
        let got = counts(&tracked);
        for (n, (&g, &e)) in got.iter().zip(&expect).enumerate() {
            let late_b = (13..18).contains(&n) && g == e - 1;
            assert!(
                g == e || late_b,
                "mesh {mesh}, frame {n}: {g} faces, expected {e} (all: {got:?})"
            );
        }
        assert!(got[17..].iter().zip(&expect[17..]).all(|(g, e)| g == e));
        assert!(full_5 <= 40 / 5 + 3, "mesh {mesh}: {full_5} full passes over 40 frames");
        let (used, unused) = if mesh {
            (followed_5, windows_5)
        } else {
            (windows_5, followed_5)
        };
        assert!(
            used > 40 && unused == 0,
            "mesh {mesh}: {windows_5} windows, {followed_5} followed"
        );

        // Tracked faces sit where whole-frame detection puts them.
        for (n, ((_, a), (_, b))) in every_frame.iter().zip(&tracked).enumerate() {
            for fa in a {
                let best = b.iter().map(|fb| iou(fa, fb)).fold(0.0, f64::max);
                assert!(
                    best > 0.7 || (13..18).contains(&n),
                    "mesh {mesh}, frame {n}: IoU {best:.2} with full detection"
                );
            }
        }
    }
}

/// A followed face that jumps across the picture (no scene cut: the background stays) is lost by
/// the mesh in its old place, and a whole-frame pass looks for it at once: it is restored on
/// every frame, at its new place from the jump on, not only from the next scheduled pass.
#[test]
fn a_face_the_mesh_loses_is_looked_for_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("jump.mp4");
    portrait_clip(
        &input,
        "[0:v]scale=130:130[a];[1:v][a]overlay=x='if(lt(t,1.25),30,440)':y=110:shortest=1,format=yuv420p[v]",
        30,
    );
    let (faces, full, _, followed) = detection_run(dir.path(), &input, "5", true);
    assert_eq!(faces.len(), 30);
    for (n, (_, boxes)) in faces.iter().enumerate() {
        assert_eq!(boxes.len(), 1, "frame {n}: {boxes:?}");
        let x = boxes[0][0];
        // Frame 13 (t = 1.3 s) is the first at the new place: not a scheduled pass's frame.
        assert!(if n >= 13 { x > 400.0 } else { x < 200.0 }, "frame {n}: {boxes:?}");
    }
    // Passes on frames 0, 5, .. 25, and one on the jump's frame.
    assert!(full > 6, "{full} whole-frame passes");
    assert!(followed >= 20, "{followed} faces followed by the mesh");
}

/// The first face's five landmarks per frame, from `--faces-json`.
fn landmarks(path: &Path) -> Vec<Option<Vec<[f64; 2]>>> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let lm = f["faces"].get(0)?["landmarks"].as_array()?;
            Some(
                lm.iter()
                    .map(|p| [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()])
                    .collect(),
            )
        })
        .collect()
}

fn iou(a: &Rect, b: &Rect) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let area = |r: &Rect| (r[2] - r[0]) * (r[3] - r[1]);
    w * h / (area(a) + area(b) - w * h)
}

#[test]
fn tracking_works_on_a_sideways_video() {
    // Windows are cut from the upright picture: a wrong mapping would lose the face on every
    // frame and fall back to whole-frame passes, or put it elsewhere.
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/rotated.mp4");
    for mesh in [true, false] {
        let run = |every: &str| detection_run(dir.path(), &input, every, mesh);
        let ((every_frame, ..), (tracked, full, windows, followed)) = (run("1"), run("5"));
        let used = if mesh { followed } else { windows };
        assert!(
            used > 3 * full,
            "mesh {mesh}: {used} followed or windows, {full} whole-frame passes"
        );
        let mut matched = 0;
        for ((_, a), (_, b)) in every_frame.iter().zip(&tracked) {
            for fa in a {
                let best = b.iter().map(|fb| iou(fa, fb)).fold(0.0, f64::max);
                matched += usize::from(best > 0.7);
            }
        }
        let total: usize = every_frame.iter().map(|(_, b)| b.len()).sum();
        assert!(total > 0);
        assert!(
            matched * 100 >= total * 95,
            "mesh {mesh}: {matched} of {total} faces tracked where whole-frame detection puts them"
        );
    }
}

/// Side outputs never overwrite an input, the model, the detector or OUT, and a bad path is
/// refused before any frame is decoded (so nothing is lost at the end of a long run).
#[test]
fn side_outputs_never_overwrite_inputs_and_bad_paths_fail_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("in.mp4");
    std::fs::copy(asset("samples/test/astronaut.mp4"), &input).unwrap();
    let model = d.join("model.onnx");
    std::fs::copy(asset("models/standin/identity-256.onnx"), &model).unwrap();
    let out = d.join("out.mp4");
    let (input_bytes, model_bytes) = (std::fs::read(&input).unwrap(), std::fs::read(&model).unwrap());
    let m: [&dyn AsRef<std::ffi::OsStr>; 2] = [&"--model", &model];
    for (flag, target) in [
        ("--faces-json", &input),
        ("--stats-json", &input),
        ("--faces-json", &model),
        ("--stats-json", &out),
    ] {
        fails(&input, &out, &[m[0], m[1], &flag, target], "is also");
    }
    let stats = d.join("s.json");
    fails(
        &input,
        &out,
        &[m[0], m[1], &"--faces-json", &stats, &"--stats-json", &stats],
        "is also",
    );
    fails(&input, &out, &[m[0], m[1], &"--faces-json", &d], "is a folder");
    let t = std::time::Instant::now();
    fails(
        &input,
        &out,
        &[m[0], m[1], &"--faces-json", &d.join("no/such/faces.json")],
        "does not exist",
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "refused up front, not after the run"
    );
    assert_eq!(std::fs::read(&input).unwrap(), input_bytes, "input untouched");
    assert_eq!(std::fs::read(&model).unwrap(), model_bytes, "model untouched");
    // A good run writes both side outputs, complete, and leaves no temporary file.
    let faces = d.join("f.json");
    ok(&gpen(&[
        &input,
        &out,
        m[0],
        m[1],
        &"--faces-json",
        &faces,
        &"--stats-json",
        &stats,
        &"--frames",
        &"6",
    ]));
    let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&faces).unwrap()).unwrap();
    assert_eq!(f.as_array().unwrap().len(), 6);
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(s["frames"], 6);
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A closed stderr or stdout (a reader that went away) does not panic the tool: the run
/// finishes and writes its output.
#[test]
fn a_closed_stdout_or_stderr_does_not_stop_or_panic_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.mp4");
    let input = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/identity-256.onnx");
    let script = format!(
        "'{bin}' '{i}' '{o}' --model '{m}' --frames 8 2>&1 >/dev/null | true; echo \"${{PIPESTATUS[0]}}\"",
        bin = env!("CARGO_BIN_EXE_gpen-video"),
        i = input.display(),
        o = out.display(),
        m = model.display()
    );
    let r = std::process::Command::new("bash")
        .args(["-c", &script])
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .output()
        .unwrap();
    let code = String::from_utf8_lossy(&r.stdout).trim().to_string();
    assert_eq!(
        code,
        "0",
        "exit code with stderr closed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(out.exists(), "the run finished");
    let script = format!(
        "'{bin}' models list | true; echo \"${{PIPESTATUS[0]}}\"",
        bin = env!("CARGO_BIN_EXE_gpen-video")
    );
    let r = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    let code = String::from_utf8_lossy(&r.stdout).trim().to_string();
    assert!(
        code == "0",
        "models list into a closed pipe exited {code}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
}

/// Two runs writing the same OUT at once, each as PID 1 of its own PID namespace (as two
/// Kubernetes pods on shared storage are): their temporary files never collide, both finish,
/// and OUT is one complete video, not a mix of both.
#[test]
fn two_runs_as_pid_1_writing_one_output_never_share_a_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("same.mp4");
    let input = asset("samples/test/astronaut.mp4");
    let spawn = |model: &str| {
        std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--map-root-user"])
            .arg(env!("CARGO_BIN_EXE_gpen-video"))
            .arg(&input)
            .arg(&out)
            .args(["--model", asset(model).to_str().unwrap(), "--quiet", "--frames", "30"])
            .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
            .env("GPEN_VIDEO_FAULTS", "slow=0:40")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) runs")
    };
    let (a, b) = (
        spawn("models/standin/identity-256.onnx"),
        spawn("models/standin/negate-256.onnx"),
    );
    for child in [a, b] {
        let r = child.wait_with_output().unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    }
    assert_eq!(video_pts(&out).len(), 30, "a complete video");
    let errors = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&out)
        .args(["-f", "null", "-"])
        .output()
        .unwrap();
    assert!(
        errors.stderr.is_empty(),
        "decodes cleanly: {}",
        String::from_utf8_lossy(&errors.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "only OUT is left: {left:?}");
}

/// A single run killed with kill -9 leaves its partial file; the next run of the same OUT
/// removes it (nobody holds its lock), and keeps one whose writer is alive.
#[test]
fn a_rerun_removes_the_partial_file_of_a_killed_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.mp4");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    let dead = dir.path().join(".o.mp4.partial-0000000000000001.mp4");
    std::fs::write(&dead, b"half").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&dead)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let live = dir.path().join(".o.mp4.partial-0000000000000002.mp4");
    std::fs::write(&live, b"in flight").unwrap();
    let lock = std::fs::File::options().write(true).open(&live).unwrap();
    lock.set_modified(old).unwrap();
    lock.lock().unwrap();
    let model = asset("models/standin/identity-256.onnx");
    ok(&gpen(&[
        &asset("samples/test/astronaut.mp4"),
        &out,
        &"--model",
        &model,
        &"--frames",
        &"4",
    ]));
    assert!(!dead.exists(), "the killed run's partial file is removed");
    assert!(live.exists(), "a live run's partial file is kept");
}

/// A model that returns NaN leaves every face as it was (not a black square), warns with a
/// count, and the stats say how many; a model whose output is not float32 is refused at load.
#[test]
fn non_finite_model_outputs_keep_the_original_faces() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = asset("samples/test/astronaut.mp4");
    let (nan, blend0, stats) = (d.join("nan.mp4"), d.join("blend0.mp4"), d.join("s.json"));
    let r = gpen(&[
        &input,
        &nan,
        &"--model",
        &asset("models/standin/nan-256.onnx"),
        &"--frames",
        &"12",
        &"--stats-json",
        &stats,
    ]);
    let err = ok(&r);
    assert!(err.contains("kept their original pixels"), "{err}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(s["faces"].as_u64().unwrap() >= 10, "faces found: {s}");
    assert_eq!(s["faces_not_finite"], s["faces"], "every face counted: {s}");
    let model = asset("models/standin/identity-256.onnx");
    ok(&gpen(&[
        &input,
        &blend0,
        &"--model",
        &model,
        &"--frames",
        &"12",
        &"--blend",
        &"0",
    ]));
    assert_eq!(
        framemd5(&nan, "0:v", false),
        framemd5(&blend0, "0:v", false),
        "pictures as if nothing was pasted"
    );
    fails(
        &input,
        &d.join("h.mp4"),
        &[&"--model", &asset("models/standin/half-output-256.onnx")],
        "expected float32",
    );
}

/// Detection settings that would turn every detector cell into a face are refused, and a frame
/// never yields more than `--max-faces` faces (the best ones), with a warning.
#[test]
fn detection_is_bounded_by_checked_settings_and_max_faces() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = asset("samples/test/astronaut.mp4");
    let out = d.join("o.mp4");
    for (flag, value, expect) in [
        ("--det-threshold", "0", "--det-threshold must be above 0"),
        ("--det-threshold", "nan", "--det-threshold must be above 0"),
        ("--det-threshold", "1.5", "--det-threshold must be above 0"),
        ("--det-size", "16", "--det-size must be at least 32"),
        ("--crf", "52", "out of range for libx264"),
        ("--preset", "slowest", "--preset slowest is not an x264/x265 preset"),
    ] {
        fails(&input, &out, &[&flag, &value], expect);
    }
    // The preset from the environment is checked as the flag is, and the message names it.
    let r = gpen_env(&[&input, &out], &[("GPEN_VIDEO_PRESET", "slowest")]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("GPEN_VIDEO_PRESET") && err.contains("use one of ultrafast"),
        "{err}"
    );
    assert!(!out.exists());
    let r = gpen(&[&input, &out, &"--max-faces", &"0"]);
    assert_eq!(r.status.code(), Some(2), "a usage error");
    let r = gpen(&[&"bench", &input, &"--repeat", &"0"]);
    assert_eq!(r.status.code(), Some(2), "a usage error");
    let r = gpen(&[&"bench", &input, &"--ceiling-s=-1"]);
    assert_eq!(r.status.code(), Some(2), "a usage error");

    let group = asset("samples/test/group.mkv");
    let model = asset("models/standin/identity-256.onnx");
    let (out, faces, err) = run_with_faces(d, &group, "g.mkv", &model, &[&"--max-faces", &"2"]);
    assert!(out.exists());
    assert!(err.contains("keeping the best 2"), "{err}");
    assert!(faces.iter().all(|(_, b)| b.len() <= 2), "at most 2 faces per frame");
    assert!(faces.iter().any(|(_, b)| b.len() == 2));
}

/// Image-sequence patterns, and still-image names for a video IN, are refused up front, with
/// nothing written (FFmpeg would expand `%03d` into hidden partial files and leave an empty OUT).
#[test]
fn sequence_patterns_and_image_outputs_of_videos_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = asset("samples/test/astronaut.mp4");
    fails(&input, &d.join("out%03d.mp4"), &[], "image-sequence pattern");
    fails(&input, &d.join("out%d.jpg"), &[], "image-sequence pattern");
    fails(&input, &d.join("out.png"), &[], "is a video and output");
    fails(&input, &d.join("out.JPG"), &[], "give a video output such as out.mp4");
    fails(&d.join("in%02d.mp4"), &d.join("o.mp4"), &[], "image-sequence pattern");
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 0, "nothing written");
}

/// Streams are kept wherever the container can hold them (MPEG-TS answers "unknown" for AAC
/// and carries it fine), and every refusal names what to do instead.
#[test]
fn containers_keep_what_they_can_and_refusals_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = asset("samples/test/astronaut.mp4");
    let streams = |f: &Path, kind: &str| {
        let out = tool(
            "ffprobe",
            &[
                "-v",
                "error",
                "-select_streams",
                kind,
                "-show_entries",
                "stream=codec_name",
                "-of",
                "csv=p=0",
                f.to_str().unwrap(),
            ],
        );
        // MPEG-TS lists its streams again under its program: one entry per stream.
        let mut names: Vec<String> = String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        names.dedup();
        names
    };
    for ext in ["ts", "m2ts"] {
        let out = d.join(format!("o.{ext}"));
        ok(&gpen(&[&input, &out, &"--frames", &"10"]));
        assert_eq!(streams(&out, "a"), ["aac"], ".{ext} keeps the audio");
    }
    // MPEG-PS refuses AAC only when its header is written: the video is still written, and the
    // warning names a container that keeps the audio.
    let mpg = d.join("o.mpg");
    let err = ok(&gpen_env(&[&input, &mpg, &"--frames", &"10"], &[("RUST_LOG", "warn")]));
    assert_eq!(streams(&mpg, "v"), ["h264"]);
    assert!(
        err.contains("cannot hold this stream") && err.contains("choose .mkv"),
        "{err}"
    );
    // mov_text subtitles cannot go into Matroska: the warning names a container that keeps them.
    std::fs::write(d.join("s.srt"), "1\n00:00:00,000 --> 00:00:01,000\nhello\n").unwrap();
    let subbed = d.join("subbed.mp4");
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            input.to_str().unwrap(),
            "-i",
            d.join("s.srt").to_str().unwrap(),
            "-map",
            "0",
            "-map",
            "1",
            "-c:v",
            "copy",
            "-c:a",
            "copy",
            "-c:s",
            "mov_text",
            subbed.to_str().unwrap(),
        ],
    );
    let r = gpen_env(
        &[&subbed, &d.join("o.mkv"), &"--frames", &"10"],
        &[("RUST_LOG", "warn")],
    );
    let err = ok(&r);
    assert!(
        err.contains("choose .mp4 to keep it") || err.contains("choose .mov to keep it"),
        "{err}"
    );
    assert!(!err.contains("choose .mkv"), "{err}");
    // WebM gets a WebM encoder by default, and H.264 into WebM is refused with the way out.
    let webm = d.join("o.webm");
    ok(&gpen(&[&input, &webm, &"--frames", &"4"]));
    assert_eq!(streams(&webm, "v"), ["vp9"]);
    fails(
        &input,
        &d.join("x.webm"),
        &[&"--codec", &"libx264"],
        "use --codec libvpx-vp9",
    );
    // Odd picture sizes: the message names the encoder in use and one that takes any size.
    let odd = d.join("odd.mp4");
    tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            input.to_str().unwrap(),
            "-frames:v",
            "4",
            "-vf",
            "scale=321:181",
            "-c:v",
            "libx264rgb",
            odd.to_str().unwrap(),
        ],
    );
    fails(
        &odd,
        &d.join("o.mp4"),
        &[&"--codec", &"libx265"],
        "cannot open encoder libx265 for 321x181",
    );
    fails(&odd, &d.join("o2.mp4"), &[&"--codec", &"libx265"], "--codec libx264rgb");
    ok(&gpen(&[&odd, &d.join("o3.mkv"), &"--codec", &"libx264rgb"]));
}

/// A source of `pix_fmt` made from the portrait clip (12 frames), tagged HDR10 when `hdr`.
fn deep_source(out: &Path, pix_fmt: &str, codec: &str, hdr: bool) {
    let src = asset("samples/test/astronaut.mp4");
    let mut args = vec![
        "-v",
        "error",
        "-i",
        src.to_str().unwrap(),
        "-frames:v",
        "12",
        "-an",
        "-pix_fmt",
        pix_fmt,
        "-c:v",
        codec,
        "-crf",
        "14",
    ];
    if hdr {
        args.extend([
            "-color_primaries",
            "bt2020",
            "-color_trc",
            "smpte2084",
            "-colorspace",
            "bt2020nc",
        ]);
    }
    if codec == "libx265" {
        args.extend(["-x265-params", "log-level=error"]);
    }
    args.push(out.to_str().unwrap());
    tool("ffmpeg", &args);
}

/// 10-bit (HDR10-tagged), 4:2:2 and 4:4:4 sources come out at their own depth and chroma
/// layout with their tags, the faces changed and the rest as it was; the identity model's output
/// is the `--blend 0` file; an encoder that cannot take the source's format converts, and says so
/// once.
#[test]
fn deep_and_full_chroma_sources_keep_their_depth_layout_and_tags() {
    let dir = tempfile::tempdir().unwrap();
    let negate = asset("models/standin/negate-256.onnx");
    for (pix, codec, hdr, ext) in [
        ("yuv420p10le", "libx264", true, "mp4"),
        ("yuv422p", "libx264", false, "mkv"),
        ("yuv444p10le", "libx265", false, "mkv"),
        // Interleaved chroma, as GPU decoders give it.
        ("nv12", "libx264", false, "nut"),
    ] {
        let input = dir.path().join(format!("in-{pix}.{ext}"));
        deep_source(&input, pix, if pix == "nv12" { "rawvideo" } else { codec }, hdr);
        let name = format!("out-{pix}.{ext}");
        let (out, faces, err) = run_with_faces(dir.path(), &input, &name, &negate, &[&"--codec", &codec]);
        assert!(!err.contains("converted to"), "{pix}: {err}");
        // H.264 decodes interleaved chroma as planar.
        let want = if pix == "nv12" { "yuv420p" } else { pix };
        assert_eq!(probe_video(&out, "stream=pix_fmt").trim(), want, "{pix}: pixel format");
        if hdr {
            let tags = probe_video(&out, "stream=color_primaries,color_transfer,color_space");
            assert_eq!(
                tags.split_whitespace().collect::<Vec<_>>(),
                ["bt2020nc", "smpte2084", "bt2020"],
                "{pix}: tags"
            );
        }
        let (w, _, got) = rgb_frames(&out);
        let (_, _, orig) = rgb_frames(&input);
        assert_eq!(got.len(), 12, "{pix}");
        for (i, (g, o)) in got.iter().zip(&orig).enumerate() {
            let (regions, boxes) = &faces[i];
            let (outside, _) = psnr(g, o, w, |x, y| !inside(regions, x, y, 2.0));
            assert!(outside > 35.0, "{pix} frame {i}: outside faces {outside:.1} dB");
            let (face, n) = psnr(g, o, w, |x, y| inside(boxes, x, y, -10.0));
            assert!(n > 0 && face < 15.0, "{pix} frame {i}: face not changed ({face:.1} dB)");
        }
        if hdr || pix == "nv12" {
            // Identity: the output's pictures are a plain re-encode's with the same settings (a
            // trip through RGB and back would not be).
            let identity = asset("models/standin/identity-256.onnx");
            let id = dir.path().join(format!("id.{ext}"));
            ok(&gpen(&[&input, &id, &"--model", &identity]));
            let plain = dir.path().join(format!("plain.{ext}"));
            let (i, p) = (input.to_str().unwrap(), plain.to_str().unwrap());
            tool(
                "ffmpeg",
                &[
                    "-v",
                    "error",
                    "-i",
                    i,
                    "-map",
                    "0:v:0",
                    "-c:v",
                    codec,
                    "-crf",
                    "18",
                    "-preset",
                    common::TEST_PRESET,
                    p,
                ],
            );
            let (_, _, got) = rgb_frames(&id);
            let (_, _, want) = rgb_frames(&plain);
            let per_frame: Vec<f64> = got
                .iter()
                .zip(&want)
                .map(|(g, w)| psnr(g, w, 640, |_, _| true).0)
                .collect();
            let db = mean_psnr(&per_frame);
            eprintln!("{pix}: identity {db:.1} dB from a plain re-encode");
            assert!(db >= 60.0, "{pix}: identity {db:.1} dB from a plain re-encode");
        }
    }
    // MPEG-4 Part 2 takes yuv420p only: converted, said once.
    let input = dir.path().join("in-422-10.mkv");
    deep_source(&input, "yuv422p10le", "libx264", false);
    let out = dir.path().join("out-mpeg4.mkv");
    let err = ok(&gpen(&[&input, &out, &"--model", &negate, &"--codec", &"mpeg4"]));
    assert_eq!(probe_video(&out, "stream=pix_fmt").trim(), "yuv420p");
    assert_eq!(err.matches("takes no yuv422p10le pictures").count(), 1, "{err}");
}

/// A signal that comes after OUT is renamed into place changes nothing: the run says OUT is
/// complete and in place and exits 0, and OUT is what an uninterrupted run writes.
#[test]
fn a_signal_after_the_output_is_in_place_leaves_a_successful_run() {
    let dir = tempfile::tempdir().unwrap();
    let (out, plain) = (dir.path().join("o.mkv"), dir.path().join("plain.mkv"));
    let model = asset("models/standin/identity-256.onnx");
    let input = asset("samples/test/group.mkv");
    ok(&gpen(&[&input, &plain, &"--model", &model]));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpen-video"))
        .args([input.as_os_str(), out.as_os_str()])
        .args(["--quiet", "--model"])
        .arg(&model)
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .env("GPEN_VIDEO_HOLD_AFTER_OUTPUT_MS", "3000")
        .env("GPEN_VIDEO_PRESET", common::TEST_PRESET)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !out.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before OUT appeared");
        assert!(start.elapsed().as_secs() < 120, "OUT never appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let r = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(0), "{err}");
    assert!(
        err.contains("complete and in place") && !err.contains("not written"),
        "{err}"
    );
    assert_eq!(framemd5(&out, "0:v", false), framemd5(&plain, "0:v", false));
}

/// `--quality` on a video output is not ignored silently: the run says it applies to JPEG and
/// WebP pictures and that a video's quality is set by --crf, and runs.
#[test]
fn quality_on_a_video_is_named_as_having_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.mkv");
    let r = gpen(&[
        &asset("samples/test/group.mkv"),
        &out,
        &"--model",
        &asset("models/standin/identity-256.onnx"),
        &"--quality",
        &"50",
    ]);
    let err = ok(&r);
    assert!(
        err.contains("--quality 50 applies to JPEG and WebP pictures") && err.contains("--crf"),
        "{err}"
    );
    assert!(out.is_file());
}

/// `src`'s video remuxed into `out` (through `vf`, re-encoded, when given) with its track's
/// display matrix set to `abcd` (the 2x2 part, 16.16 fixed point) in the MP4 track header, as
/// a phone writes it: a front camera's mirror, a picture stored upside down or transposed.
fn with_display_matrix(src: &Path, out: &Path, vf: Option<&str>, abcd: [i32; 4]) {
    let mut args = vec!["-i", src.to_str().unwrap(), "-an", "-frames:v", "30"];
    match vf {
        Some(vf) => args.extend(["-vf", vf, "-c:v", "libx264", "-preset", "ultrafast", "-crf", "12"]),
        None => args.extend(["-c", "copy"]),
    }
    args.push(out.to_str().unwrap());
    ffmpeg(&args);
    let mut mp4 = std::fs::read(out).unwrap();
    let at = mp4.windows(4).position(|w| w == b"tkhd").unwrap();
    let matrix = at + if mp4[at + 4] == 1 { 56 } else { 44 };
    for (k, v) in abcd.into_iter().enumerate() {
        let i = matrix + 4 * [0, 1, 3, 4][k];
        mp4[i..i + 4].copy_from_slice(&v.to_be_bytes());
    }
    std::fs::write(out, mp4).unwrap();
}

#[test]
fn mirrored_and_flipped_phone_videos_are_searched_upright_and_keep_their_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let upright = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/identity-256.onnx");
    const ONE: i32 = 1 << 16;
    // A front camera's horizontal mirror (stored upright), a picture stored upside down and
    // shown through a vertical mirror, and one stored transposed.
    for (name, vf, abcd) in [
        ("hflip", None, [-ONE, 0, 0, ONE]),
        ("vflip", Some("vflip"), [ONE, 0, 0, -ONE]),
        ("transposed", Some("transpose=cclock_flip"), [0, ONE, ONE, 0]),
    ] {
        let input = dir.path().join(format!("{name}.mp4"));
        with_display_matrix(&upright, &input, vf, abcd);
        let matrix = |f: &Path| probe_video(f, "stream_side_data=displaymatrix").trim().to_string();
        assert!(!matrix(&input).is_empty(), "{name}: the source has its matrix");
        let (out, faces, _) = run_with_faces(dir.path(), &input, &format!("{name}-out.mp4"), &model, &[]);
        assert_faces_found(&faces, 90);
        assert_eq!(matrix(&out), matrix(&input), "{name}: the display matrix kept");
    }
}

/// Frame `n` of `f` as a player shows it (turned by its display matrix): width, height, RGB.
fn shown_frame(f: &Path, n: usize) -> (usize, usize, Vec<u8>) {
    let size = probe_video(f, "stream=width,height");
    let mut wh = size.split_whitespace().map(|v| v.parse::<usize>().unwrap());
    let (w, h) = (wh.next().unwrap(), wh.next().unwrap());
    let turned = probe_video(f, "stream_side_data=rotation")
        .trim()
        .parse::<i32>()
        .unwrap_or(0)
        % 180
        != 0;
    let (w, h) = if turned { (h, w) } else { (w, h) };
    let rgb = tool(
        "ffmpeg",
        &[
            "-v",
            "error",
            "-i",
            f.to_str().unwrap(),
            "-vf",
            &format!("select=eq(n\\,{n})"),
            "-frames:v",
            "1",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
    );
    assert_eq!(rgb.len(), w * h * 3, "{}: one {w}x{h} frame as shown", f.display());
    (w, h, rgb)
}

#[test]
fn side_by_side_of_a_sideways_video_shows_the_original_left_and_the_restored_right() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/rotated.mp4");
    let out = dir.path().join("side.mp4");
    let model = asset("models/standin/negate-256.onnx");
    ok(&gpen(&[
        &input,
        &out,
        &"--model",
        &model,
        &"--compare",
        &"side",
        &"--frames",
        &"12",
        &AS_GIVEN[0],
        &AS_GIVEN[1],
        &AS_GIVEN[2],
        &AS_GIVEN[3],
    ]));
    assert_eq!(
        probe_video(&out, "stream_side_data=rotation").trim(),
        "90",
        "the rotation kept"
    );
    let restored = dir.path().join("restored.mp4");
    ok(&gpen(&[
        &input,
        &restored,
        &"--model",
        &model,
        &"--frames",
        &"12",
        &AS_GIVEN[0],
        &AS_GIVEN[1],
        &AS_GIVEN[2],
        &AS_GIVEN[3],
    ]));
    let (w, h, source) = shown_frame(&input, 11);
    let (_, _, fixed) = shown_frame(&restored, 11);
    let (ow, oh, both) = shown_frame(&out, 11);
    assert_eq!((ow, oh), (2 * w, h), "shown side by side");
    // Where the restoring changed the picture (the face), each half is compared with the
    // source and the restored video as shown: the left must be the one, the right the other.
    let px = |rgb: &[u8], stride: usize, x: usize, y: usize| -> [i32; 3] {
        let i = (y * stride + x) * 3;
        [rgb[i], rgb[i + 1], rgb[i + 2]].map(i32::from)
    };
    let off = |a: [i32; 3], b: [i32; 3]| (0..3).map(|c| (a[c] - b[c]).abs()).sum::<i32>();
    let (mut n, mut sums) = (0, [0i64; 4]);
    for y in 0..h {
        for x in 0..w {
            let (s, f) = (px(&source, w, x, y), px(&fixed, w, x, y));
            if off(s, f) < 90 {
                continue;
            }
            let (l, r) = (px(&both, ow, x, y), px(&both, ow, w + x, y));
            n += 1;
            for (k, d) in [off(l, s), off(r, f), off(l, f), off(r, s)].into_iter().enumerate() {
                sums[k] += i64::from(d);
            }
        }
    }
    assert!(n > 300, "the face changed: {n} pixels");
    let [left_source, right_restored, left_restored, right_source] = sums.map(|s| s as f64 / n as f64);
    assert!(
        left_source < 20.0 && right_restored < 20.0 && left_restored > 60.0 && right_source > 60.0,
        "left against source {left_source:.1}, right against restored {right_restored:.1}, left against restored {left_restored:.1}, right against source {right_source:.1}"
    );
}

/// The HDR10 static metadata in the first SEI messages of `f`'s video bitstream (as FFmpeg's
/// `trace_headers` reads them, for H.264 and HEVC alike): each field's name and value.
fn hdr10_in_bitstream(f: &Path) -> Vec<(String, u64)> {
    let out = std::process::Command::new("ffmpeg")
        .args([
            "-v",
            "verbose",
            "-i",
            f.to_str().unwrap(),
            "-map",
            "0:v:0",
            "-c",
            "copy",
            "-bsf:v",
            "trace_headers",
            "-frames:v",
            "1",
            "-f",
            "null",
            "-",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    let mut fields: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().skip(4);
            let name = words.next()?;
            let wanted = [
                "display_primaries_",
                "white_point_",
                "_display_mastering_luminance",
                "light_level",
            ];
            wanted.iter().any(|w| name.contains(w)).then_some(())?;
            Some((name.to_string(), l.rsplit("= ").next()?.trim().parse().ok()?))
        })
        .collect();
    fields.sort();
    fields.dedup();
    fields
}

#[test]
fn hdr10_mastering_display_and_light_levels_are_kept_by_x265_and_x264() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("hdr10.mp4");
    let src = asset("samples/test/astronaut.mp4");
    tool(
        "ffmpeg",
        &[
            "-v", "error", "-i", src.to_str().unwrap(), "-frames:v", "8", "-an", "-pix_fmt", "yuv420p10le",
            "-c:v", "libx265", "-preset", "ultrafast",
            "-x265-params", "master-display=G(13250,34500)B(7500,3000)R(34000,16000)WP(15635,16450)L(10000000,1):max-cll=1000,400:log-level=error",
            "-color_primaries", "bt2020", "-color_trc", "smpte2084", "-colorspace", "bt2020nc",
            input.to_str().unwrap(),
        ],
    );
    let want = hdr10_in_bitstream(&input);
    let has = |name: &str, v: u64| want.iter().any(|(n, x)| n == name && *x == v);
    assert!(
        has("max_content_light_level", 1000)
            && has("max_display_mastering_luminance", 10_000_000)
            && has("white_point_x", 15635),
        "the source carries HDR10: {want:?}"
    );
    let model = asset("models/standin/identity-256.onnx");
    for (codec, ext) in [("libx265", "mkv"), ("libx264", "mp4"), ("libx265", "mp4")] {
        let out = dir.path().join(format!("{codec}.{ext}"));
        ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &model,
            &"--codec",
            &codec,
            &"--preset",
            &"ultrafast",
        ]));
        assert_eq!(hdr10_in_bitstream(&out), want, "{codec} into .{ext}");
    }
}

/// The face-identity model is one of the run's models, found with the others before any frame:
/// a run that asks for it (the identity guard, on by default, or `--identity` with the guard
/// off) from a folder without it fails naming the file and how to make it; a run that asks for
/// nothing of it runs without it.
#[test]
fn a_missing_identity_model_is_named_when_the_run_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bin = d.join("bin/gpen-video");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_gpen-video"), &bin).unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(&bin)
            .current_dir(d)
            .arg(asset("samples/test/astronaut.mp4"))
            .arg(d.join("o.mp4"))
            .args(["-y", "--quiet", "--frames", "3", "--mesh", "none", "--model"])
            .arg(asset("models/standin/identity-256.onnx"))
            .arg("--detector")
            .arg(asset("models/centerface.onnx"))
            .args(extra)
            .env_remove("GPEN_VIDEO_MODEL")
            .env_remove("GPEN_VIDEO_CPU")
            .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
            .env("XDG_CONFIG_HOME", no_user_dirs())
            .env("XDG_DATA_HOME", no_user_dirs())
            .output()
            .unwrap()
    };
    for (extra, asked) in [
        (&[][..], "--identity-guard back-off"),
        (&["--identity-guard", "off", "--identity"][..], "--identity"),
    ] {
        let r = run(extra);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(&format!("error: {asked}"))
                && err.contains("needs the face-identity model models/face-id.onnx, which is missing")
                && err.contains("scripts/setup.sh"),
            "{extra:?}: {err}"
        );
        assert!(!err.contains("panicked") && !d.join("o.mp4").exists(), "{err}");
    }
    let r = run(&["--identity-guard", "off"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

/// `GPEN_VIDEO_CPU=plain` holds a whole run's kernels (the warps, the tensor conversions, the
/// colour fix, the temporal filter, the paste's halving and its changes added to the planes) to
/// their plain bodies: the frames equal the default run's (the highest level this CPU runs) to
/// the bit. A level not known is refused naming the variable and the levels this CPU runs.
#[test]
fn a_run_held_to_the_plain_cpu_level_equals_the_default_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let model = asset("models/standin/cast-sharpen-256.onnx");
    let mut frames = Vec::new();
    for (name, env) in [
        ("default.mkv", &[][..]),
        ("plain.mkv", &[("GPEN_VIDEO_CPU", "plain")][..]),
    ] {
        let out = dir.path().join(name);
        // Lossless, so the frames compared are the run's own (a lossy encode can hide a level).
        let args: [&dyn AsRef<std::ffi::OsStr>; 8] =
            [&input, &out, &"--model", &model, &"--frames", &"24", &"--crf", &"0"];
        ok(&gpen_env(&args, env));
        frames.push(framemd5(&out, "0:v", false));
    }
    assert_eq!(frames[0].len(), 24);
    assert_eq!(
        frames[0], frames[1],
        "the plain level's frames differ from the default's"
    );
    let out = dir.path().join("refused.mkv");
    let r = gpen_env(&[&input, &out, &"--model", &model], &[("GPEN_VIDEO_CPU", "sse9")]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("GPEN_VIDEO_CPU=sse9: unknown CPU level `sse9`: use one of plain"),
        "{err}"
    );
    assert!(!out.exists());
}
