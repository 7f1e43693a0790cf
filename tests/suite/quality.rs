//! BRISQUE in Rust against the reference implementation: in, the face crops of samples/quality/
//! (squares around the faces of the project's real photos at 256 and 512 pixels, one blurred, one
//! noisy, one JPEG-compressed) and the scores that image-quality 1.2.7's own `imquality.brisque`
//! gave them (models/brisque-check.json), both made by models/quality_export.py from
//! scripts/setup.sh; out, each crop's Rust score within TOLERANCE of the reference's, and the
//! blurred crop scored worse than its sharp original.

use std::path::{Path, PathBuf};

use gpen_video::api::faces::quality::{Brisque, QualityScratch, BRISQUE_MODEL};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The largest |Rust - reference| allowed, in BRISQUE points (the scores here span -5..80), for a
/// crop with no exactly flat 7x7 window. Both sides compute the same steps in f64 and differ only
/// in rounding: summation orders (a separable window against SciPy's 7x7 one, running sums
/// against NumPy's pairwise ones), the shape's root (SciPy's `root` stops at a relative 1.5e-8, the
/// bisection here at full precision) and the Gamma function; that moves the features by 1e-8 or
/// less and the score by about 1e-7 (measured: at most 9e-8). 1e-3 leaves room for other builds
/// of the reference's libraries while any step done differently (window, resize, boundary,
/// scaling) moves scores by 0.1 to tens of points.
const TOLERANCE: f64 = 1e-3;

/// The same for a crop with exactly flat 7x7 windows (clipped highlights, JPEG blocks): there the
/// MSCN coefficients are rounding noise (about 1e-15) whose signs, which decide the side of the
/// asymmetric fit each one counts on, follow the exact order of floating-point operations, and
/// the reference's own order is not even fixed (its grey conversion is an OpenBLAS matrix
/// product, computed with FMAs where the CPU has them). Measured: 0.017 on the blocky JPEG crop,
/// under 1e-3 on the others; 0.1 is well below the 1-point differences that matter in use.
const FLAT_TOLERANCE: f64 = 0.1;

/// Whether some 7x7 window of the packed RGB picture holds one colour only.
fn has_flat_window(rgb: &[u8], w: usize, h: usize) -> bool {
    let px = |x: usize, y: usize| &rgb[3 * (y * w + x)..3 * (y * w + x) + 3];
    (0..h.saturating_sub(6)).any(|y| {
        (0..w.saturating_sub(6)).any(|x| {
            let c = px(x, y);
            (y..y + 7).all(|yy| (x..x + 7).all(|xx| px(xx, yy) == c))
        })
    })
}

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
    assert!(
        check.crops.len() >= 5,
        "{}: only {} crops",
        check_path.display(),
        check.crops.len()
    );
    let mut scratch = QualityScratch::default();
    let (mut worst, mut failures) = (0.0f64, Vec::new());
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
        let flat = has_flat_window(img.as_raw(), w, h);
        let limit = if flat { FLAT_TOLERANCE } else { TOLERANCE };
        println!(
            "{:24} reference {:9.4}  rust {:9.4}  |diff| {:.2e}{}",
            crop.file,
            crop.score,
            got,
            diff,
            if flat { "  (flat windows)" } else { "" }
        );
        if diff > limit {
            failures.push(format!(
                "{}: rust {got}, reference {}, |diff| {diff} > {limit}",
                crop.file, crop.score
            ));
        }
        worst = worst.max(diff);
        scores.insert(crop.file.clone(), got);
    }
    println!("max |rust - reference| {worst:.3e}, against {}", check.reference);
    assert!(
        failures.is_empty(),
        "scores differ from the reference:\n{}",
        failures.join("\n")
    );
    let (sharp, blurred) = (scores["obama-512.png"], scores["obama-512-blur.png"]);
    assert!(
        blurred > sharp + 10.0,
        "blurred {blurred} should score well above sharp {sharp}"
    );
    let noisy = scores["obama-512-noise.png"];
    assert!(
        noisy > sharp + 10.0,
        "noisy {noisy} should score well above sharp {sharp}"
    );
}
