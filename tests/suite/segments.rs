//! Long videos in segments end to end: in, clips made from the shipped portrait (a moving face
//! under noise, audio, subtitles, a variable frame rate, a display rotation) and the stand-in
//! models; out, the joined file compared with what one run writes (frames, timestamps, side
//! streams, faces record), a run killed in its third segment resumed, and two batch shards on
//! one clip.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A clip of `frames` frames at about 25 frames/s (every seventh frame half a frame late, so
/// the rate varies), a keyframe every `gop` frames, with audio and a subtitle, stored sideways
/// and turned upright by its display matrix.
fn clip(dir: &Path, frames: u32, gop: u32) -> PathBuf {
    let upright = dir.join("upright.mp4");
    let srt = dir.join("subs.srt");
    std::fs::write(
        &srt,
        "1\n00:00:00,500 --> 00:00:02,000\nhello\n\n2\n00:00:05,000 --> 00:00:06,000\nagain\n",
    )
    .unwrap();
    let graph = "[1:v]scale=180:180,noise=alls=6:allf=t[a];[0:v][a]overlay=x='60+30*sin(t)':y=20,settb=1/12800,setpts='(N+0.5*floor(N/7))*512',format=yuv420p[v]";
    // The audio as long as the video (its frames at about 25/s, every seventh half a frame late).
    let sine = format!("sine=f=440:r=48000:d={}", f64::from(frames) * 1.08 / 25.0);
    let (frames, gop) = (frames.to_string(), gop.to_string());
    let portrait = asset("samples/astronaut.png");
    let x264 = [
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-g",
        &gop,
        "-keyint_min",
        &gop,
        "-x264-params",
        "scenecut=0",
    ];
    let mut args = vec![
        "-f",
        "lavfi",
        "-i",
        "color=c=0x405060:s=320x240:r=25",
        "-i",
        arg(&portrait),
        "-f",
        "lavfi",
        "-i",
        &sine,
        "-i",
        arg(&srt),
        "-filter_complex",
        graph,
        "-map",
        "[v]",
        "-map",
        "2:a",
        "-map",
        "3:s",
        "-frames:v",
        &frames,
        "-fps_mode",
        "passthrough",
    ];
    args.extend(x264);
    args.extend(["-c:a", "aac", "-c:s", "mov_text", arg(&upright)]);
    ffmpeg(&args);
    let sideways = dir.join("sideways.mp4");
    let mut args = vec![
        "-i",
        arg(&upright),
        "-map",
        "0",
        "-vf",
        "transpose=1",
        "-fps_mode",
        "passthrough",
    ];
    args.extend(x264);
    args.extend(["-c:a", "copy", "-c:s", "copy", arg(&sideways)]);
    ffmpeg(&args);
    let out = dir.join("long.mp4");
    ffmpeg(&[
        "-i",
        arg(&sideways),
        "-map",
        "0",
        "-c",
        "copy",
        "-metadata:s:v",
        "rotate=90",
        arg(&out),
    ]);
    out
}

/// Restores `input` into `out` with `model` and a lossless encoder (its fastest preset: the
/// frames decode the same), cut into segments of `segment` seconds (0: one run); its stats JSON.
/// The identity guard and the hands decide afresh on stretches of 128 frames, and a segment
/// warms up from its stretch's start: on a clip shorter than a stretch every segment would warm
/// up from frame 0, which joins exactly whatever the tracker and the filters keep. Tests of
/// what a segment's own warm-up carries, and of claims, resumes and shards, run without them
/// (the four-segment join runs with them; their stretches are tested in `faithful.rs` and
/// `occlusion.rs`), and so run faster.
const WARM_UP_OWN: &[&str] = &["--identity-guard", "off", "--occlusion", "off"];

fn restore(input: &Path, out: &Path, model: &str, segment: &str, extra: &[&str]) -> String {
    let faces = out.with_extension("json");
    let stats = out.with_extension("stats");
    let model = asset(&format!("models/{model}"));
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &input,
        &out,
        &"--model",
        &model,
        &"--codec",
        &"libx264",
        &"--crf",
        &"0",
        &"--preset",
        &"ultrafast",
        &"--segment",
        &segment,
        &"--faces-json",
        &faces,
        &"--stats-json",
        &stats,
    ];
    args.extend(extra.iter().map(|e| e as &dyn AsRef<std::ffi::OsStr>));
    ok(&gpen(&args));
    std::fs::read_to_string(&stats).unwrap()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

/// Everything a viewer gets from `f`: each frame decoded (hash and time), the audio and
/// subtitle packets, the display rotation.
fn contents(f: &Path) -> (Vec<String>, Vec<i64>, Vec<String>, Vec<String>, String) {
    (
        framemd5(f, "0:v", false),
        video_pts(f),
        packet_md5(f, "0:a"),
        packet_md5(f, "0:s"),
        probe_video(f, "stream_side_data=rotation"),
    )
}

/// Starts the binary with `args` (no progress bar, warnings only, the encoder's fastest preset,
/// as [`restore`]); its stderr piped when `keep_err` (a test reads it), else dropped.
fn start(args: &[&str], keep_err: bool) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_gpen-video"))
        .args(args)
        .args(["--quiet", "--preset", "ultrafast"])
        .env("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"))
        .env("RUST_LOG", "warn")
        .stderr(if keep_err {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .spawn()
        .unwrap()
}

/// Waits until `file` appears while `child` runs (at most 4 minutes).
fn wait_for(child: &mut std::process::Child, file: &Path) {
    let start = std::time::Instant::now();
    while !file.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before {} appeared",
            file.display()
        );
        assert!(start.elapsed().as_secs() < 240, "no {} after 4 minutes", file.display());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_long_clip_in_four_segments_joins_into_what_one_run_writes() {
    let dir = tempfile::tempdir().unwrap();
    let input = clip(dir.path(), 300, 25);
    // The negating stand-in changes every face pixel, so any frame the join gets wrong shows.
    let model = "standin/negate-256.onnx";
    let one = dir.path().join("one.mp4");
    let joined = dir.path().join("joined.mp4");
    let single = json(&restore(&input, &one, model, "0", &[]));
    assert_eq!(single["frames"], 300, "one run: {single}");
    let stats = json(&restore(&input, &joined, model, "2.4", &[]));
    assert_eq!(stats["segments"], 4, "{stats}");
    assert_eq!(stats["restored_here"].as_array().unwrap().len(), 4);
    let warm: Vec<u64> = stats["restored_here"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["warm_frames"].as_u64().unwrap())
        .collect();
    assert!(
        warm[3] > 100,
        "the last segment rebuilds its state from warm-up frames: {warm:?}"
    );
    assert_eq!(stats["joined"]["frames"], 300);
    let (a, b) = (contents(&one), contents(&joined));
    assert_eq!(a.0.len(), 300);
    assert!(a.4.contains("-90") || a.4.contains("90"), "rotation kept: {}", a.4);
    assert!(
        !a.2.is_empty() && a.3.len() >= 2,
        "audio and subtitles: {} {}",
        a.2.len(),
        a.3.len()
    );
    assert_eq!(a.1, b.1, "{model}: frame timestamps");
    assert_eq!(a.2, b.2, "{model}: audio packets");
    assert_eq!(a.3, b.3, "{model}: subtitle packets");
    assert_eq!(a.4, b.4, "{model}: display rotation");
    let differ: Vec<usize> = (0..300).filter(|&i| a.0[i] != b.0[i]).collect();
    assert!(differ.is_empty(), "{model}: frames {differ:?} differ from one run's");
    assert_eq!(
        std::fs::read_to_string(one.with_extension("json")).unwrap(),
        std::fs::read_to_string(joined.with_extension("json")).unwrap(),
        "{model}: the faces record, tracks numbered as one run numbers them"
    );
    assert!(
        !gpen_video::api::segment::work_dir(&joined).exists(),
        "the segments are removed once joined"
    );
}

/// A face large enough that the detector tracks it in a window it shrinks (not one cut at the
/// copy's own scale): the windows are snapped to a grid, so a segment's warm-up settles on the
/// single run's (without the snap, half the frames differed).
#[test]
fn a_large_face_tracked_in_a_shrunk_window_joins_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "color=c=0x405060:s=640x480:r=25",
        "-i",
        arg(&asset("samples/astronaut.png")),
        "-filter_complex",
        "[1:v]scale=560:560,noise=alls=6:allf=t[a];[0:v][a]overlay=x='40+30*sin(t)':y='-40+10*sin(t/2)',format=yuv420p[v]",
        "-map",
        "[v]",
        "-frames:v",
        "300",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-g",
        "25",
        "-x264-params",
        "scenecut=0",
        arg(&input),
    ]);
    let (one, joined) = (dir.path().join("one.mkv"), dir.path().join("joined.mkv"));
    restore(&input, &one, "standin/negate-256.onnx", "0", WARM_UP_OWN);
    let stats = json(&restore(&input, &joined, "standin/negate-256.onnx", "2.4", WARM_UP_OWN));
    assert_eq!(stats["segments"], 4, "{stats}");
    let faces = std::fs::read_to_string(one.with_extension("json")).unwrap();
    let side = faces_json(&one.with_extension("json"))[0].1[0];
    assert!(side[3] - side[1] > 100.0, "a large face: {side:?}");
    assert_eq!(faces, std::fs::read_to_string(joined.with_extension("json")).unwrap());
    assert_eq!(framemd5(&one, "0:v", false), framemd5(&joined, "0:v", false));
}

#[test]
fn the_random_weight_gpen_joins_within_one_level_and_with_the_same_faces() {
    let dir = tempfile::tempdir().unwrap();
    // 40 frames in two segments, run side by side: the second's batches of four are cut where
    // one run's are not (what a real model's floats see), and its warm-up is the first's frames.
    // GPEN-BFR-256's structure at an eighth of its width (scripts/test.sh makes it): its floats,
    // a sixth of its cost.
    let input = clip(dir.path(), 40, 10);
    let (one, joined) = (dir.path().join("one.mp4"), dir.path().join("joined.mp4"));
    let model = "gpen-bfr-256-narrow-random.onnx";
    restore(&input, &one, model, "0", WARM_UP_OWN);
    let stats = json(&restore(
        &input,
        &joined,
        model,
        "0.8",
        &[WARM_UP_OWN, &["--jobs", "2"]].concat(),
    ));
    assert_eq!(stats["segments"], 2, "{stats}");
    let (a, b) = (rgb_frames(&one), rgb_frames(&joined));
    assert_eq!(a.2.len(), 40);
    assert_eq!(a.2.len(), b.2.len());
    let most =
        a.2.iter()
            .zip(&b.2)
            .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| p.abs_diff(*q)))
            .max()
            .unwrap();
    assert!(most <= 1, "joined frames within one level of one run's: {most}");
    assert_eq!(video_pts(&one), video_pts(&joined));
    assert_eq!(
        std::fs::read_to_string(one.with_extension("json")).unwrap(),
        std::fs::read_to_string(joined.with_extension("json")).unwrap()
    );
}

#[test]
fn a_run_killed_in_its_third_segment_redoes_only_the_third_and_fourth() {
    let dir = tempfile::tempdir().unwrap();
    let input = clip(dir.path(), 300, 25);
    let model = asset("models/standin/negate-256.onnx");
    let out = dir.path().join("out.mp4");
    let work = gpen_video::api::segment::work_dir(&out);
    let mut child = start(
        &[
            arg(&input),
            arg(&out),
            "--model",
            arg(&model),
            "--codec",
            "libx264",
            "--crf",
            "0",
            "--segment",
            "2.4",
            "--identity-guard",
            "off",
            "--occlusion",
            "off",
        ],
        false,
    );
    wait_for(&mut child, &work.join("00001.json"));
    // kill -9: no chance to tidy up.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(work.join("00000.json").exists() && !work.join("00002.json").exists());
    assert!(!out.exists(), "no output from a partial set");
    let stats = json(&restore(&input, &out, "standin/negate-256.onnx", "2.4", WARM_UP_OWN));
    let redone: Vec<u64> = stats["restored_here"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["segment"].as_u64().unwrap())
        .collect();
    assert_eq!(redone, vec![2, 3], "{stats}");
    assert_eq!(stats["kept"], 2);
    let one = dir.path().join("one.mp4");
    restore(&input, &one, "standin/negate-256.onnx", "0", WARM_UP_OWN);
    assert_eq!(framemd5(&one, "0:v", false), framemd5(&out, "0:v", false));
    assert!(!work.exists());
}

#[test]
fn two_batch_shards_on_one_long_clip_finish_it_once_joined_once() {
    let dir = tempfile::tempdir().unwrap();
    let (input_dir, out_dir) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&input_dir).unwrap();
    let made = clip(dir.path(), 300, 25);
    std::fs::rename(&made, input_dir.join("film.mp4")).unwrap();
    let model = asset("models/standin/negate-256.onnx");
    let shard = |k: usize| {
        let report = dir.path().join(format!("report-{k}.json"));
        let shard = format!("{k}/2");
        let child = start(
            &[
                "batch",
                arg(&input_dir),
                arg(&out_dir),
                "--model",
                arg(&model),
                "--codec",
                "libx264",
                "--crf",
                "0",
                "--segment",
                "2.4",
                "--shard",
                &shard,
                "--report",
                arg(&report),
                "--identity-guard",
                "off",
                "--occlusion",
                "off",
            ],
            true,
        );
        (child, report)
    };
    let runs = [shard(0), shard(1)];
    let mut reports = Vec::new();
    for (child, report) in runs {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        reports.push(json(&std::fs::read_to_string(report).unwrap()));
    }
    let done: Vec<&serde_json::Value> = reports.iter().flat_map(|r| r["done"].as_array().unwrap()).collect();
    assert_eq!(done.len(), 1, "joined once: {reports:?}");
    // Each segment restored exactly once, by one shard or the other.
    let notes: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r["done"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["segments"].as_str().unwrap().to_string())
                .chain(
                    r["skipped"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s["reason"].as_str().unwrap().to_string()),
                )
                .collect::<Vec<_>>()
        })
        .collect();
    let here: u64 = notes
        .iter()
        .map(|n| {
            n.split(" of 4 segments restored here")
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(here, 4, "{notes:?}");
    let joined = out_dir.join("film.mp4");
    let one = dir.path().join("one.mp4");
    restore(
        &input_dir.join("film.mp4"),
        &one,
        "standin/negate-256.onnx",
        "0",
        WARM_UP_OWN,
    );
    assert_eq!(framemd5(&one, "0:v", false), framemd5(&joined, "0:v", false));
    assert_eq!(packet_md5(&one, "0:a"), packet_md5(&joined, "0:a"));
    // A resubmission redoes nothing.
    for k in 0..2 {
        let (child, report) = shard(k);
        assert!(child.wait_with_output().unwrap().status.success());
        let r = json(&std::fs::read_to_string(report).unwrap());
        assert!(r["done"].as_array().unwrap().is_empty(), "{r}");
    }
}

#[test]
fn ctrl_c_keeps_the_finished_segments_and_other_settings_or_force_start_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let input = clip(dir.path(), 300, 25);
    let model = asset("models/standin/identity-256.onnx");
    let out = dir.path().join("out.mp4");
    let work = gpen_video::api::segment::work_dir(&out);
    let args = [
        &[arg(&input), arg(&out), "--model", arg(&model), "--segment", "2.4"][..],
        WARM_UP_OWN,
    ]
    .concat();
    let mut child = start(&args, true);
    wait_for(&mut child, &work.join("00000.json"));
    tool("kill", &["-INT", &child.id().to_string()]);
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{err}");
    assert!(
        err.contains("not written") && err.contains("run the same command again to resume"),
        "{err}"
    );
    assert!(!out.exists() && work.join("00000.json").exists());
    let run = |extra: &[&str]| {
        let stats = dir.path().join("stats.json");
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
            &input,
            &out,
            &"--model",
            &model,
            &"--segment",
            &"2.4",
            &"--stats-json",
            &stats,
        ];
        args.extend(
            ["--preset", "ultrafast"]
                .iter()
                .chain(WARM_UP_OWN)
                .chain(extra)
                .map(|e| e as &dyn AsRef<std::ffi::OsStr>),
        );
        ok(&gpen(&args));
        let s = json(&std::fs::read_to_string(&stats).unwrap());
        (
            s["restored_here"].as_array().unwrap().len(),
            s["kept"].as_u64().unwrap(),
        )
    };
    // Another setting: what was made for the old one is not used.
    assert_eq!(run(&["--blend", "0.5"]), (4, 0));
    assert!(out.exists() && !work.exists());
    // --force starts afresh even where the settings are the same.
    std::fs::remove_file(&out).unwrap();
    let mut child = start(&args, false);
    wait_for(&mut child, &work.join("00001.json"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(run(&["--force"]), (4, 0));
}

/// A whole run (`--segment 0`) of an OUT whose earlier segmented run left its work folder names
/// the folder, with its size, and keeps it (a rerun with --segment resumes from it).
#[test]
fn a_whole_run_names_the_segments_folder_an_earlier_run_left() {
    let dir = tempfile::tempdir().unwrap();
    let input = clip(dir.path(), 30, 25);
    let out = dir.path().join("out.mp4");
    let work = gpen_video::api::segment::work_dir(&out);
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("00000.mkv"), vec![0u8; 2_000_000]).unwrap();
    let model = asset("models/standin/negate-256.onnx");
    let r = gpen(&[&input, &out, &"--model", &model, &"--segment", &"0"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(out.exists());
    assert!(
        err.contains(&work.display().to_string()) && err.contains("2.0 MB") && err.contains("--segment"),
        "{err}"
    );
    assert!(work.join("00000.mkv").exists(), "the folder is kept");
}

/// Two runs of one OUT started together (a user's double click, two terminals): each segment
/// is made once, by one of them; one joins, the other says so and succeeds too; the work folder
/// goes, with nothing left behind and no run redoing joined segments. Three rounds, as the race
/// falls differently each time.
#[test]
fn two_runs_of_one_out_at_once_make_each_segment_once_and_join_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = clip(dir.path(), 300, 25);
    let model = asset("models/standin/identity-256.onnx");
    let out = dir.path().join("out.mp4");
    let work = gpen_video::api::segment::work_dir(&out);
    for round in 0..3 {
        let stats = |k: usize| dir.path().join(format!("stats-{round}-{k}.json"));
        let children: Vec<_> = (0..2)
            .map(|k| {
                let s = stats(k);
                start(
                    &[
                        arg(&input),
                        arg(&out),
                        "--model",
                        arg(&model),
                        "--segment",
                        "3",
                        "--stats-json",
                        arg(&s),
                        "--identity-guard",
                        "off",
                        "--occlusion",
                        "off",
                    ],
                    true,
                )
            })
            .collect();
        let mut made = Vec::new();
        let mut joins = 0;
        for (k, child) in children.into_iter().enumerate() {
            let done = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&done.stderr);
            assert!(done.status.success(), "round {round}, run {k}: {err}");
            assert!(
                !err.contains("cannot remove") && !err.contains("not empty"),
                "round {round}, run {k}: {err}"
            );
            let s = json(&std::fs::read_to_string(stats(k)).unwrap());
            assert_eq!(s["segments"], 4, "{s}");
            made.extend(
                s["restored_here"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["segment"].as_u64().unwrap()),
            );
            joins += usize::from(!s["joined"].is_null());
        }
        made.sort();
        assert_eq!(made, [0, 1, 2, 3], "round {round}: each segment made once");
        assert_eq!(joins, 1, "round {round}: one join");
        assert!(
            out.exists() && !work.exists(),
            "round {round}: OUT written, the folder gone"
        );
        assert_eq!(video_pts(&out).len(), 300, "round {round}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "round {round}: left behind {left:?}");
        std::fs::remove_file(&out).unwrap();
    }
}
