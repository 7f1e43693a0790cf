//! Restorers of other contracts: CodeFormer's (a float64 `weight` input beside the image, the
//! image output among three) through a stand-in made by models/make_standins.py, whose output
//! is x (1 - 2 w): `--fidelity 0` gives the face back, 1 negates it; a model without a weight
//! input refuses `--fidelity` before any frame.

mod common;

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
