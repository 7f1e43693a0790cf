//! BRISQUE in Rust against the reference implementation: in, the face crops of samples/quality/
//! (squares around the faces of the project's real photos at 256 and 512 pixels, one blurred, one
//! noisy, one JPEG-compressed) and the scores that image-quality 1.2.7's own `imquality.brisque`
//! gave them (models/brisque-check.json), both made by models/quality_export.py from
//! scripts/setup.sh; out, each crop's Rust score within TOLERANCE of the reference's, and the
//! blurred crop scored worse than its sharp original.

use std::path::{Path, PathBuf};

use gpen_video::faces::quality::{Brisque, QualityScratch, BRISQUE_MODEL};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The largest |Rust - reference| allowed, in BRISQUE points (the scores span about -5..100 here).
/// Both compute the same steps in f64; what differs is the summation order (separable window
/// against a 7x7 one, running sums against NumPy's pairwise ones), the shape parameter's root
/// (SciPy's `root` stops at a relative 1.5e-8, the bisection here at full precision) and the
/// Gamma function: differences of 1e-8 or less in the features, far below 0.001 points in the
/// score. 0.01 leaves room for other builds of the reference's libraries while still catching
/// any step done differently (a wrong window, resize or boundary moves the score by 0.1 to 10s).
const TOLERANCE: f64 = 0.01;

#[derive(Deserialize)]
struct Check {
    reference: String,
    crops: Vec<Crop>,
}

#[derive(Deserialize)]
struct Crop {
    file: String,
    sha256: String,
    score: f64,
}

fn need(p: &Path) -> &Path {
    assert!(p.is_file(), "{} is missing: run scripts/setup.sh", p.display());
    p
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn rust_scores_match_the_reference() {
    let model = Brisque::load(need(&root().join("models").join(BRISQUE_MODEL))).unwrap();
    let check_path = root().join("models/brisque-check.json");
    let check: Check = serde_json::from_str(&std::fs::read_to_string(need(&check_path)).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", check_path.display()));
    assert!(check.crops.len() >= 5, "{}: only {} crops", check_path.display(), check.crops.len());
    let mut scratch = QualityScratch::default();
    let mut worst = (0.0f64, String::new());
    let mut scores = std::collections::HashMap::new();
    for crop in &check.crops {
        let path = root().join("samples/quality").join(&crop.file);
        let bytes = std::fs::read(need(&path)).unwrap();
        let digest = hex::encode(Sha256::digest(&bytes));
        assert_eq!(
            digest,
            crop.sha256,
            "{} is not the crop the reference scored: run scripts/setup.sh (remove models/brisque-check.json first)",
            path.display()
        );
        let img = image::load_from_memory(&bytes).unwrap().to_rgb8();
        let (w, h) = (img.width() as usize, img.height() as usize);
        let got = f64::from(model.score(img.as_raw(), w, h, &mut scratch));
        let diff = (got - crop.score).abs();
        println!("{:24} reference {:9.4}  rust {:9.4}  |diff| {:.2e}", crop.file, crop.score, got, diff);
        if diff >= worst.0 {
            worst = (diff, crop.file.clone());
        }
        scores.insert(crop.file.clone(), got);
    }
    println!("max |rust - reference| {:.3e} ({}), against {}", worst.0, worst.1, check.reference);
    assert!(worst.0 <= TOLERANCE, "{} differs from the reference by {} > {TOLERANCE}", worst.1, worst.0);
    let (sharp, blurred) = (scores["obama-512.png"], scores["obama-512-blur.png"]);
    assert!(blurred > sharp + 10.0, "blurred {blurred} should score well above sharp {sharp}");
    let noisy = scores["obama-512-noise.png"];
    assert!(noisy > sharp + 10.0, "noisy {noisy} should score well above sharp {sharp}");
}
