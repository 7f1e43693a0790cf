//! Restorers of other contracts: CodeFormer's (a float64 `weight` input beside the image, the
//! image output among three) through a stand-in made by models/make_standins.py, whose output
//! is x (1 - 2 w): `--fidelity 0` gives the face back, 1 negates it; a model without a weight
//! input refuses `--fidelity` before any frame.

use crate::common;

use std::path::Path;

use common::*;

/// Mean absolute difference (levels) between two videos' or pictures' frames.
fn mean_change(a: &Path, b: &Path) -> f64 {
    let ((_, _, fa), (_, _, fb)) = (rgb_frames(a), rgb_frames(b));
    assert_eq!(fa.len(), fb.len());
    let (mut sum, mut n) = (0.0, 0.0);
    for (x, y) in fa.iter().zip(&fb) {
        for (p, q) in x.iter().zip(y) {
            sum += (f64::from(*p) - f64::from(*q)).abs();
            n += 1.0;
        }
    }
    sum / n
}

#[test]
fn codeformers_fidelity_chooses_between_the_face_given_and_the_one_made() {
    let dir = tempfile::tempdir().unwrap();
    let model = asset("models/standin/codeformer-512.onnx");
    for input in [asset("samples/test/astronaut.mp4"), {
        let p = dir.path().join("astronaut.png");
        ffmpeg(&["-i", arg(&asset("samples/astronaut.png")), arg(&p)]);
        p
    }] {
        let ext = input.extension().unwrap().to_str().unwrap().to_string();
        let run = |extra: &[&str]| {
            let out = dir.path().join(format!("out-{}.{ext}", extra.join("-")));
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &model];
            // The stand-ins' changes as they give them (they are no restorers to guard).
            args.extend(AS_GIVEN.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
            if ext == "mp4" {
                args.extend([&"--frames" as &dyn AsRef<std::ffi::OsStr>, &"8"]);
            }
            for a in extra {
                args.push(a);
            }
            ok(&gpen(&args));
            out
        };
        let plain = dir.path().join(format!("plain.{ext}"));
        let identity = asset("models/standin/identity-512.onnx");
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &plain, &"--model", &identity];
        if ext == "mp4" {
            args.extend([&"--frames" as &dyn AsRef<std::ffi::OsStr>, &"8"]);
        }
        ok(&gpen(&args));
        let (given, made, half) = (run(&["--fidelity", "0"]), run(&["--fidelity", "1"]), run(&[]));
        let (d_given, d_made, d_half) = (
            mean_change(&plain, &given),
            mean_change(&plain, &made),
            mean_change(&plain, &half),
        );
        assert!(d_given < 0.3, "{ext}: fidelity 0 gives the face back: {d_given}");
        assert!(d_made > 1.5, "{ext}: fidelity 1 changes the face: {d_made}");
        assert!(
            d_half > 0.75 && (d_half - d_made).abs() > 0.3,
            "{ext}: the default 0.5 is neither: {d_half}"
        );
    }
}

#[test]
fn a_model_without_a_weight_refuses_fidelity_before_any_frame() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.mp4");
    fails(
        &asset("samples/test/astronaut.mp4"),
        &out,
        &[
            &"--model",
            &asset("models/standin/identity-512.onnx"),
            &"--fidelity",
            &"0.3",
        ],
        "has no fidelity input",
    );
    fails(
        &asset("samples/test/astronaut.mp4"),
        &out,
        &[
            &"--model",
            &asset("models/standin/codeformer-512.onnx"),
            &"--fidelity",
            &"1.5",
        ],
        "--fidelity must be between 0 and 1",
    );
}

/// Every contract users bring (facefusion's enhancers: CodeFormer, GFPGAN, GPEN-BFR,
/// RestoreFormer++; batch fixed at 1, stand-ins made by models/make_standins.py), recorded by the
/// names people know with `models add`, restores a still, a video, a video in segments, a folder
/// (of a photo: `batch` on clips is tests/suite/batch.rs's) and a service job taken by name; the
/// service's `/v1/info` offers each with its fidelity.
#[test]
fn every_contract_restores_stills_videos_folders_and_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, data) = (dir.path().join("config"), dir.path().join("data"));
    let env = [
        ("XDG_CONFIG_HOME", cfg.to_str().unwrap()),
        ("XDG_DATA_HOME", data.to_str().unwrap()),
    ];
    let contracts = [
        ("codeformer-512.onnx", "codeformer"),
        ("ff-gfpgan-512.onnx", "gfpgan-1.4"),
        ("ff-gpen-bfr-256.onnx", "gpen-bfr-256"),
        ("ff-restoreformer-512.onnx", "restoreformer-pp"),
    ];
    for (file, name) in contracts {
        let f = asset(&format!("models/standin/{file}"));
        let said = gpen_env(&[&"models", &"add", &f, &"--name", &name], &env);
        assert!(
            String::from_utf8_lossy(&said.stdout).contains("symbolic batch"),
            "{name}"
        );
    }
    let still = dir.path().join("astronaut.png");
    ffmpeg(&["-i", arg(&asset("samples/astronaut.png")), arg(&still)]);
    let clip = dir.path().join("clip.mp4");
    ffmpeg(&[
        "-i",
        arg(&asset("samples/test/astronaut.mp4")),
        "-t",
        "1",
        "-c:v",
        "libx264",
        // A keyframe every 10 frames: `--segment 0.4` cuts the second's 30 frames in two.
        "-g",
        "10",
        arg(&clip),
    ]);
    let folder = dir.path().join("in");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(&still, folder.join("photo.png")).unwrap();
    let plain = |input: &Path| {
        let out = dir
            .path()
            .join(format!("plain-{}", input.file_name().unwrap().to_str().unwrap()));
        ok(&gpen(&[
            &input,
            &out,
            &"--model",
            &asset("models/standin/identity-512.onnx"),
        ]));
        out
    };
    let (plain_still, plain_clip) = (plain(&still), plain(&clip));
    let changed = |what: &str, name: &str, plain: &Path, out: &Path| {
        let d = mean_change(plain, out);
        assert!(d > 0.4, "{name}: the {what} is restored (mean change {d:.2})");
    };
    let server = common::server::Server::start_env(
        &[
            &["--model", arg(&asset("models/standin/identity-512.onnx"))][..],
            &AS_GIVEN[..],
        ]
        .concat(),
        &[("XDG_CONFIG_HOME", &cfg), ("XDG_DATA_HOME", &data)],
    );
    let (_, info) = server.get("/v1/info");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let clip_bytes = std::fs::read(&clip).unwrap();
    for (_, name) in contracts {
        let run = |input: &Path, out: &Path, extra: &[&str]| {
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out, &"--model", &name];
            args.extend(AS_GIVEN.iter().chain(extra).map(|a| a as &dyn AsRef<std::ffi::OsStr>));
            ok(&gpen_env(&args, &env));
        };
        let out = dir.path().join(format!("{name}.png"));
        run(&still, &out, &[]);
        changed("still", name, &plain_still, &out);
        let out = dir.path().join(format!("{name}.mp4"));
        run(&clip, &out, &[]);
        changed("video", name, &plain_clip, &out);
        let out = dir.path().join(format!("{name}-segments.mp4"));
        let stats = dir.path().join(format!("{name}-segments.json"));
        run(&clip, &out, &["--segment", "0.4", "--stats-json", arg(&stats)]);
        let stats = std::fs::read_to_string(&stats).unwrap();
        assert!(stats.contains("\"segments\":2"), "{name}: {stats}");
        changed("video in segments", name, &plain_clip, &out);
        let out_dir = dir.path().join(format!("out-{name}"));
        ok(&gpen_env(
            &[
                &"batch",
                &folder,
                &out_dir,
                &"--model",
                &name,
                &AS_GIVEN[0],
                &AS_GIVEN[1],
                &AS_GIVEN[2],
                &AS_GIVEN[3],
            ],
            &env,
        ));
        changed("folder's photo", name, &plain_still, &out_dir.join("photo.png"));
        let offered = info["restorers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
            .unwrap_or_else(|| panic!("{name} not offered: {info}"));
        let fidelity = if name == "codeformer" {
            serde_json::json!(0.5)
        } else {
            serde_json::Value::Null
        };
        assert_eq!(offered["fidelity"], fidelity, "{name}: {offered}");
        let out = dir.path().join(format!("{name}-job.mp4"));
        std::fs::write(
            &out,
            server.run_job(&format!("name=clip.mp4&model={name}"), &clip_bytes),
        )
        .unwrap();
        changed("job's video", name, &plain_clip, &out);
    }
    // A job's fidelity reaches CodeFormer's weight: 0 gives the face back.
    let out = dir.path().join("codeformer-0.mp4");
    std::fs::write(
        &out,
        server.run_job("name=clip.mp4&model=codeformer&fidelity=0", &clip_bytes),
    )
    .unwrap();
    assert!(mean_change(&plain_clip, &out) < 0.3);
    assert_eq!(server.stop(), Some(0));
}
