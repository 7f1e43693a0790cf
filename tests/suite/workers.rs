//! Scheduling across several enhancement workers, with CPU sessions standing in for GPUs: in,
//! the test clips and stand-in models; out, assertions that batches go to whichever worker is
//! free, frames still leave in order, a failing worker stops the run cleanly, and the GPU paths
//! fail clearly on a machine without one.

use crate::common;

use common::*;

/// A worker's batch count from `--stats-json`.
fn worker_batches(json: &str, name: &str) -> u64 {
    let at = json
        .find(&format!("\"name\":\"{name}\",\"batches\":"))
        .unwrap_or_else(|| panic!("{name} in {json}"));
    let rest = &json[at..];
    rest.split("\"batches\":")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn uneven_workers_share_batches_and_frames_stay_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let model = asset("models/standin/identity-256.onnx");
    let one = dir.path().join("one.mkv");
    ok(&gpen(&[&input, &one, &"--model", &model]));
    let (two, stats) = (dir.path().join("two.mkv"), dir.path().join("stats.json"));
    let err = ok(&gpen_env(
        &[
            &input,
            &two,
            &"--model",
            &model,
            &"--device",
            &"cpu:2",
            &"--stats-json",
            &stats,
        ],
        &[("GPEN_VIDEO_FAULTS", "slow=1:300")],
    ));
    let json = std::fs::read_to_string(&stats).unwrap();
    let (fast, slow) = (worker_batches(&json, "cpu0"), worker_batches(&json, "cpu1"));
    assert!(slow >= 1, "the slow worker took part: {json}\n{err}");
    assert!(fast > slow, "the free worker takes more batches ({fast} vs {slow})");
    assert_eq!(fast + slow, batches(&err));
    // Same pictures, same order, whatever worker restored them.
    let (a, b) = (framemd5(&one, "0:v", false), framemd5(&two, "0:v", false));
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

#[test]
fn a_worker_failing_mid_run_stops_everything_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let out = dir.path().join("out.mkv");
    let r = gpen_env(
        &[
            &input,
            &out,
            &"--model",
            &asset("models/standin/identity-256.onnx"),
            &"--device",
            &"cpu:2",
        ],
        &[("GPEN_VIDEO_FAULTS", "slow=0:100,fail=1:3")],
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("enhance worker cpu1") && err.contains("injected failure"),
        "{err}"
    );
    assert!(!out.exists(), "no output after a failed worker");
    let left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(left, 0, "no partial file left");
}

#[test]
fn stats_json_has_stages_queues_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let json = identity_run_stats(dir.path(), &asset("samples/test/astronaut.mp4"), &[]);
    for key in [
        "\"frames\":60",
        "\"stages\":[",
        "\"queue_fill\":",
        "\"busy_share\":",
        "\"workers\":[{\"name\":\"cpu0\"",
        "\"mean_batch_fill\":",
        "\"ms_per_batch\":",
        "\"peak_rss_bytes\":",
    ] {
        assert!(json.contains(key), "{key} missing in {json}");
    }
    for stage in ["decode", "detect", "align", "dispatch", "paste", "encode"] {
        assert!(
            json.contains(&format!("{{\"name\":\"{stage}\"")),
            "stage {stage} in {json}"
        );
    }
}

#[test]
fn bench_reports_pipeline_ceiling_and_efficiency() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let input = asset("samples/test/astronaut.mp4");
    let model = asset("models/standin/identity-256.onnx");
    let r = gpen(&[
        &"bench",
        &input,
        &"--model",
        &model,
        &"--repeat",
        &"1",
        &"--ceiling-s",
        &"0",
        &"--frames",
        &"20",
        &"--json",
        &json,
    ]);
    let table = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        table.contains("pipeline") && table.contains("enhance") && table.contains("pipeline efficiency"),
        "{table}"
    );
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(
        j.contains("\"measure\":\"pipeline\"")
            && j.contains("\"measure\":\"enhance\"")
            && j.contains("\"efficiency\":"),
        "{j}"
    );
    assert!(j.contains("\"frames\":20"), "--frames caps each run: {j}");
    // `--ceiling-s 0`: each enhance-only run stops at its fourth batch (one CPU worker); the
    // default's 3 s would run hundreds of the stand-in's.
    let j: serde_json::Value = serde_json::from_str(&j).unwrap();
    let enhance = j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["measure"] == "enhance")
        .unwrap();
    assert_eq!(enhance["ceiling_batches"], 4, "{enhance}");
}

/// `bench --portraits`: generated 1024x1024 portraits streamed at each batch size; a row per
/// size in the table and the JSON, every figure positive, the ceiling above the stream, the
/// cost per 1,000 images what the price and the rate make.
#[test]
fn bench_on_portraits_gives_a_row_per_batch_size_with_its_cost() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("portraits.json");
    let model = asset("models/standin/identity-256.onnx");
    let r = gpen(&[
        &"bench",
        &"--portraits",
        &"--images",
        &"4",
        &"--batches",
        &"1,2",
        &"--repeat",
        &"1",
        &"--ceiling-s",
        &"0.2",
        &"--price-per-hour",
        &"2.5",
        &"--model",
        &model,
        &"--json",
        &json,
    ]);
    let table = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    for column in [
        "images/s",
        "ms/batch",
        "host MiB",
        "GPU MiB",
        "ceiling",
        "efficiency",
        "latency ms",
        "per 1000",
    ] {
        assert!(table.contains(column), "{column} in {table}");
    }
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["side"], 1024, "{j}");
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(
        rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(),
        [1, 2]
    );
    for row in rows {
        let num = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
        assert_eq!(row["images"], 4, "{row}");
        assert_eq!(row["faces"], 4, "one face per portrait: {row}");
        for k in [
            "images_per_s",
            "ms_per_batch",
            "ceiling_images_per_s",
            "efficiency",
            "latency_ms",
            "host_peak_mib",
        ] {
            assert!(num(k) > 0.0, "{k} in {row}");
        }
        assert!(row["gpu_peak_mib"].is_null(), "no GPU memory on the CPU: {row}");
        assert!(
            num("efficiency") <= 1.0 && num("ceiling_images_per_s") > num("images_per_s"),
            "{row}"
        );
        let want = 2.5 / 3600.0 / num("images_per_s") * 1000.0;
        assert!((num("cost_per_1000") - want).abs() < 1e-9 * want.max(1.0), "{row}");
    }
    let r = gpen(&[&"bench", &"--price-per-hour", &"1", &"--model", &model]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("goes with --portraits"));
}

#[test]
fn gpu_options_fail_clearly_without_a_gpu_and_never_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let out = dir.path().join("o.mp4");
    let model = asset("models/standin/identity-256.onnx");
    let visible = std::path::Path::new("/proc/driver/nvidia/gpus").exists();
    let r = gpen(&[&input, &out, &"--model", &model, &"--device", &"cuda:0"]);
    let err = String::from_utf8_lossy(&r.stderr);
    // The CPU build of ONNX Runtime has no CUDA provider: an error, never a silent CPU run.
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("CUDA execution provider could not start on cuda:0"),
        "{err}"
    );
    if !visible {
        let r = gpen(&[&input, &out, &"--model", &model, &"--device", &"cuda:all"]);
        assert_eq!(r.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&r.stderr).contains("no NVIDIA GPU is visible"));
        let r = gpen(&[&input, &out, &"--model", &model, &"--hwaccel", &"cuda"]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1));
        assert!(err.contains("could not open a CUDA device"), "{err}");
    }
    let r = gpen(&[&input, &out, &"--model", &model, &"--fp16"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("not an fp16 export"));
    assert!(!out.exists());
}

#[test]
fn a_model_slower_than_decoding_holds_the_decoder_back_instead_of_piling_up_frames() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/astronaut.mp4");
    let frames = video_pts(&input).len();
    // 60 ms per batch of four: decoding and detection run far ahead of the model.
    let json = identity_run_stats(dir.path(), &input, &[("GPEN_VIDEO_FAULTS", "slow=0:60")]);
    let held = json_number(&json, "frames_held_max") as usize;
    assert!(frames >= 40, "clip too short to show it: {frames} frames");
    // The dispatcher holds at most two batches' worth of frames per worker (8 here).
    assert!(held <= 8, "dispatcher held {held} frames of {frames}");
    assert!(held >= 4, "held {held}: a batch of four needs four frames");
    assert_eq!(json_number(&json, "frames"), frames as u64);
}

#[test]
fn partial_batches_reuse_a_few_buffer_sizes_and_keep_their_crops_apart() {
    use gpen_video::api::faces::enhance::Enhancer;
    use gpen_video::api::runtime::{cpu_session, Target};
    std::env::set_var("ORT_DYLIB_PATH", asset(".deps/lib/libonnxruntime.so"));
    let session = cpu_session(&asset("models/standin/identity-256.onnx"), 1, "model").unwrap();
    let mut e = Enhancer::for_target(session, &Target::Cpu(0), gpen_video::api::kernels::Cpu::detected()).unwrap();
    e.set_batch(16);
    let item = 3 * 256 * 256;
    // Every size from 16 down to 1: each crop a different constant, so a mix-up shows.
    for n in (1..=16).rev() {
        let crops: Vec<Vec<u8>> = (0..n).map(|k| vec![(k * 16) as u8; item]).collect();
        let refs: Vec<&[u8]> = crops.iter().map(Vec::as_slice).collect();
        let mut seen = 0;
        e.run(&refs, |i, out| {
            let gpen_video::api::faces::enhance::Restored::Floats(out) = out else {
                panic!("a float model gives floats")
            };
            let want = f32::from(crops[i][0]) / 127.5 - 1.0;
            assert!(
                out.iter().all(|&v| (v - want).abs() < 1e-6),
                "batch of {n}: crop {i} mixed up"
            );
            seen += 1;
        })
        .unwrap();
        assert_eq!(seen, n);
    }
    // Not one buffer set per size (136 crops' worth): padded to powers of two, 31 at most.
    assert_eq!(e.bound_sizes(), vec![1, 2, 4, 8, 16]);
}

/// Alignment and paste run on pools of threads, the temporal filter's bands and the face mesh's
/// crops on as many; frames still leave in order and every frame
/// comes out as one thread makes it: with the negate stand-in (every face visibly changed) the
/// output's pictures and the faces record are the same with pools of one and of four threads
/// (with four, the detector's whole-frame passes also run ahead of detection's chain),
/// and the stage table says how wide each pool was and what each stage cost per face.
#[test]
fn pools_of_threads_align_and_paste_frames_in_order_as_one_thread_does() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let model = asset("models/standin/negate-256.onnx");
    let run = |threads: &str| {
        let (out, faces, stats) = (
            dir.path().join(format!("out-{threads}.mkv")),
            dir.path().join(format!("faces-{threads}.json")),
            dir.path().join(format!("stats-{threads}.json")),
        );
        ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &model,
            &"--threads",
            &threads,
            &"--faces-json",
            &faces,
            &"--stats-json",
            &stats,
        ]));
        let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        (
            framemd5(&out, "0:v", false),
            std::fs::read_to_string(&faces).unwrap(),
            stats,
        )
    };
    let (one, faces_one, stats_one) = run("1");
    // Four threads: the whole-frame passes also run ahead of detection, on three sessions.
    let (three, faces_three, stats) = run("4");
    assert!(
        faces_one.matches("\"bbox\"").count() >= 50,
        "faces found on most frames"
    );
    assert_eq!(faces_one, faces_three, "the same faces, frame by frame");
    assert_eq!(one, three, "the same pictures, in the same order");
    let stage = |name: &str| {
        stats["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {stats}"))
            .clone()
    };
    for name in ["detect", "align", "temporal", "paste"] {
        let s = stage(name);
        assert_eq!(s["threads"], 4, "{s}");
        assert!(s["cpu_ms_per_face"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["busy_share"].as_f64().unwrap() <= 1.0, "{s}");
    }
    let pass = stage("pass");
    assert_eq!(pass["threads"], 3, "{pass}");
    assert!(pass["cpu_ms_per_face"].as_f64().unwrap() > 0.0, "{pass}");
    let names = |s: &serde_json::Value| -> Vec<String> {
        s["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        !names(&stats_one).contains(&"pass".to_string()),
        "one thread: no passes ahead"
    );
    // The passes counted wherever they ran.
    assert_eq!(stats_one["detect_full"], stats["detect_full"]);
}

/// `bench --stage feeder`: the stages around the model timed without it, at the run's encoder
/// settings and with the fastest preset; the table says which side limits the run and what a
/// machine of N cores feeds, the JSON has each stage's core-ms per face.
#[test]
fn bench_reports_what_the_stages_around_the_model_can_feed() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let input = asset("samples/test/group.mkv");
    let model = asset("models/standin/identity-256.onnx");
    let r = gpen(&[
        &"bench",
        &input,
        &"--model",
        &model,
        &"--repeat",
        &"1",
        &"--ceiling-s",
        &"0.2",
        &"--json",
        &json,
    ]);
    let table = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        table.contains("feeder (group.mkv): without the model")
            && table.contains("the model alone")
            && table.contains("a machine of N cores")
            && table.contains("a host of 16 cores would feed about")
            && table.contains("with its models on its GPU (detection, the mesh, hands, identity"),
        "{table}"
    );
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let f = &j["feeder"][0];
    for k in [
        "faces_per_s",
        "fast_faces_per_s",
        "process_core_ms",
        "fast_process_core_ms",
        "per_core_faces_per_s",
        "detect_limit",
        "model_faces_per_s",
    ] {
        assert!(f[k].as_f64().is_some_and(|v| v > 0.0), "{k} in {f}");
    }
    let stages: Vec<&str> = f["stage_core_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[0].as_str().unwrap())
        .collect();
    for s in ["decode", "detect", "align", "paste", "encode"] {
        assert!(stages.contains(&s), "{s} in {stages:?}");
    }
    for k in ["host_16", "gpu_host_16"] {
        let host = &f[k];
        assert!(
            host[0].as_f64().is_some_and(|v| v > 0.0) && !host[1].as_str().unwrap().is_empty(),
            "{k}: {host}"
        );
    }
    // The model runs of detection and the mesh, hands and identity are timed apart from the rest
    // of their stages.
    let per_stage = |k: &str| -> Vec<(&str, f64)> {
        f[k].as_array()
            .unwrap()
            .iter()
            .map(|s| (s[0].as_str().unwrap(), s[1].as_f64().unwrap()))
            .collect()
    };
    let (runs, fast) = (per_stage("fast_stage_model_ms"), per_stage("fast_stage_core_ms"));
    // Each model a GPU host runs besides GPEN's: detection (with the mesh it follows faces by),
    // the hands model and the identity guard's.
    let timed: Vec<&str> = runs.iter().map(|(n, _)| *n).collect();
    assert_eq!(timed, ["detect", "hands", "identity"], "{f}");
    for (name, ms) in &runs {
        let whole = fast.iter().find(|(n, _)| n == name).map(|(_, ms)| *ms).unwrap();
        assert!(*ms > 0.0 && *ms < whole, "{name}: model {ms} of {whole} core-ms");
    }
    // Detection follows the faces by the mesh here: its crops' warps are timed apart, a part of
    // what its model runs leave (a GPU host spreads them over its pool).
    let spread = per_stage("fast_stage_spread_ms");
    let at = |v: &[(&str, f64)]| v.iter().find(|(n, _)| *n == "detect").map(|(_, ms)| *ms).unwrap();
    let (warps, model_ms, whole) = (at(&spread), at(&runs), at(&fast));
    assert!(
        warps > 0.0 && warps < whole - model_ms,
        "detect: warps {warps}, model {model_ms} of {whole} core-ms"
    );
    // Detection and the mesh left to the GPU: more faces/s, never fewer.
    assert!(f["gpu_host_16"][0].as_f64() >= f["host_16"][0].as_f64(), "{f}");
    // Only the feeder: no pipeline or enhance rows.
    let r = gpen(&[
        &"bench",
        &input,
        &"--model",
        &model,
        &"--repeat",
        &"1",
        &"--stage",
        &"feeder",
    ]);
    let table = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        table.contains("feeder (group.mkv)") && !table.contains("the model alone"),
        "{table}"
    );
}

/// A model with byte I/O (uint8 levels in and out, its conversions inside the graph: see
/// `models/byte_io.py`) restores what the same model with float I/O restores: the negate
/// stand-in both ways on the group clip gives the same faces and the same pictures within one
/// level (encoded losslessly in YUV 4:2:0, whose conversion back to RGB can make a level's
/// difference in a pixel two, in one value of a thousand or fewer).
#[test]
fn a_model_with_byte_io_gives_the_float_models_pictures_within_one_level() {
    let dir = tempfile::tempdir().unwrap();
    let input = asset("samples/test/group.mkv");
    let flags: [&dyn AsRef<std::ffi::OsStr>; 4] = [&"--frames", &"10", &"--crf", &"0"];
    let run = |model: &str, name: &str| {
        let (out, faces, _) = run_with_faces(dir.path(), &input, name, &asset(model), &flags);
        (faces, rgb_frames(&out).2)
    };
    let (float_faces, float_frames) = run("models/standin/negate-256.onnx", "float.mkv");
    let (byte_faces, byte_frames) = run("models/standin/negate-256-bytes.onnx", "bytes.mkv");
    assert_eq!(float_faces, byte_faces);
    assert!(float_faces.iter().any(|(r, _)| !r.is_empty()), "no face restored");
    assert_eq!(float_frames.len(), byte_frames.len());
    for (i, (a, b)) in float_frames.iter().zip(&byte_frames).enumerate() {
        let worst = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0);
        let over = a.iter().zip(b).filter(|(x, y)| x.abs_diff(**y) > 1).count();
        eprintln!(
            "frame {i}: at most {worst} levels apart, {over} values of {} over one",
            a.len()
        );
        assert!(
            worst <= 2 && over * 1000 <= a.len(),
            "frame {i}: {worst} levels apart, {over} values over one"
        );
    }
}

/// `bench` on a photo says what times pictures (--portraits) before any work, naming the
/// photo and no file of its own.
#[test]
fn bench_on_a_photo_says_how_to_time_pictures() {
    let photo = asset("samples/astronaut.png");
    let r = gpen(&[&"bench", &photo, &"--repeat", &"1"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("astronaut.png is a still image") && err.contains("--portraits") && !err.contains(".mkv"),
        "{err}"
    );
}

/// A video held to the smallest budget of decoded frames in flight (the smoother's look-ahead
/// and one) writes the same pictures as one at its default budget, and neither ever had more
/// frames out than its budget.
#[test]
fn a_video_held_to_a_small_budget_of_frames_writes_the_same_pictures() {
    let input = asset("samples/test/group.mkv");
    let (wide_dir, narrow_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let wide = identity_run_stats(wide_dir.path(), &input, &[]);
    let narrow = identity_run_stats(narrow_dir.path(), &input, &[("GPEN_VIDEO_IN_FLIGHT", "1")]);
    let (wide_budget, narrow_budget) = (
        json_number(&wide, "frames_in_flight_budget"),
        json_number(&narrow, "frames_in_flight_budget"),
    );
    assert!(
        narrow_budget > 1 && narrow_budget < wide_budget,
        "{narrow_budget} against {wide_budget}"
    );
    assert!(json_number(&wide, "frames_in_flight_max") <= wide_budget, "{wide}");
    // The smoother lets its first frame go only once it holds the whole budget.
    assert_eq!(json_number(&narrow, "frames_in_flight_max"), narrow_budget, "{narrow}");
    let pictures = |d: &tempfile::TempDir| framemd5(&d.path().join("stats-run.mp4"), "0:v", false);
    assert_eq!(pictures(&wide_dir), pictures(&narrow_dir));
}
