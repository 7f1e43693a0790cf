//! Picture quality without a reference (BRISQUE, Mittal, Moorthy and Bovik 2012): in, a packed RGB24
//! picture (a face crop); out, its BRISQUE score, about 0 for a clean natural picture to 100 and
//! more for a blurred, noisy or blocky one (lower is better).
//!
//! The parameters, an RBF epsilon-SVR over 36 features and the features' min/max scaling, are those
//! shipped in the image-quality 1.2.7 package (`imquality.brisque`, Apache-2.0), exported to
//! `models/brisque.json` by `models/quality_export.py`. Every step follows that package's code
//! (with scikit-image 0.18 and SciPy, which it was written for), so that the scores match its own
//! (`tests/suite/quality.rs` checks them against `models/brisque-check.json`):
//! - grey: scikit-image's `rgb2gray` (0.2125 R + 0.7154 G + 0.0721 B of values in 0..1);
//! - MSCN coefficients: local mean and deviation by a 7x7 Gaussian window of sigma 7/6 (normalised
//!   to sum 1) convolved with zeros beyond the picture (`scipy.signal.convolve2d(.., "same")`),
//!   `(I - mu) / (sqrt(|mu^2 - conv(I^2)|) + 1/255)`;
//! - per scale 18 features: an asymmetric generalised Gaussian fitted by moment matching to the
//!   MSCN coefficients (its shape and the mean of the two variances) and to their products with
//!   the right, lower, lower-right and lower-left neighbours (shape, mean, left and right
//!   variances); the shape solves `phi(alpha) = R_hat` (the package finds the root with SciPy's
//!   `root` from 0.2; here it is bracketed, to the same root);
//! - the second scale: the grey picture halved by `skimage.transform.rescale(.., 1/2, order=2,
//!   mode="constant", anti_aliasing=False)`, i.e. SciPy's quadratic B-spline (`map_coordinates`
//!   with its mirror-boundary prefilter) at `2 x + 0.5`, clipped to the input's range;
//! - features scaled to -1..1 by the package's min/max, then libsvm's RBF SVR decision
//!   `sum coef_i exp(-gamma |x - sv_i|^2) - rho`.
//!
//! Everything is computed in f64 in buffers kept between calls ([`QualityScratch`]); the scores
//! agree with the reference's to about 1e-7. Where a picture has exactly flat 7x7 windows
//! (clipped highlights, JPEG blocks) its MSCN coefficients there are rounding noise whose signs
//! decide on which side of the asymmetric fit they count, and those follow the order of
//! floating-point operations (the reference's own grey conversion is an OpenBLAS product, with
//! FMAs where the CPU has them): there the scores agree to a few hundredths. Time, on one core:
//! about 1.1 ms for a 256x256 crop, 4.6 ms for a 512x512 one.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// The parameters' file name in the models folder.
pub const BRISQUE_MODEL: &str = "brisque.json";

/// Features per scale and in all.
const PER_SCALE: usize = 18;
const FEATURES: usize = 2 * PER_SCALE;
/// The reference's Gaussian window: 7 x 7, sigma 7/6.
const RADIUS: usize = 3;
const SIGMA: f64 = 7.0 / 6.0;
/// The reference's stabilising constant in the MSCN denominator (values are in 0..1).
const C: f64 = 1.0 / 255.0;
/// Where the shape parameter is looked for (phi is increasing; the reference's root lies inside
/// for any picture it scores; outside, the nearer end is taken).
const ALPHA_MIN: f64 = 0.02;
const ALPHA_MAX: f64 = 1000.0;
/// The shape taken where the moments say nothing (an empty or all-zero set of coefficients, where
/// the reference gives NaN): a Gaussian's.
const ALPHA_DEGENERATE: f64 = 2.0;
/// The pole of the quadratic B-spline prefilter (`sqrt(8) - 3`).
const SPLINE_POLE: f64 = -0.171_572_875_253_809_9;
/// Where the prefilter's causal start stops summing: later terms (below 1e-20 of a value, far
/// below f64's precision) leave the coefficients as they are (SciPy sums them all, to powers of
/// the pole that turn subnormal past about 400 samples, which is slow).
const NEGLIGIBLE: f64 = 1e-20;

#[derive(Deserialize)]
struct ModelFile {
    feature_min: Vec<f64>,
    feature_max: Vec<f64>,
    gamma: f64,
    rho: f64,
    sv_coef: Vec<f64>,
    support_vectors: Vec<Vec<f64>>,
}

/// BRISQUE's parameters: the feature scaling and the SVR.
pub struct Brisque {
    /// The scaled feature is `-1 + scale * (f - min)`, as the reference writes it.
    min: [f64; FEATURES],
    scale: [f64; FEATURES],
    gamma: f64,
    rho: f64,
    coef: Vec<f64>,
    support: Vec<[f64; FEATURES]>,
}

/// Buffers reused between calls of [`Brisque::score`].
#[derive(Default)]
pub struct QualityScratch {
    grey: Vec<f64>,
    half: Vec<f64>,
    /// A row of the window's pass down the columns over the picture and over its squares.
    down: Vec<f64>,
    down_sq: Vec<f64>,
    mean_row: Vec<f64>,
    sq_row: Vec<f64>,
    mscn: Vec<f64>,
    /// The B-spline coefficients, and the half picture's columns over all rows.
    coef: Vec<f64>,
    columns: Vec<f64>,
    block: Vec<f64>,
    col_taps: Vec<([usize; 3], [f64; 3])>,
    row_taps: Vec<([usize; 3], [f64; 3])>,
    line: Vec<f64>,
}

impl Brisque {
    /// Reads the parameters that `models/quality_export.py` wrote.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the BRISQUE parameters {}", path.display()))?;
        let file: ModelFile = serde_json::from_str(&text)
            .with_context(|| format!("parsing the BRISQUE parameters {}", path.display()))?;
        Self::from_file(file).with_context(|| format!("the BRISQUE parameters {}", path.display()))
    }

    fn from_file(f: ModelFile) -> Result<Self> {
        if f.feature_min.len() != FEATURES || f.feature_max.len() != FEATURES {
            bail!(
                "{} and {} feature bounds, not {FEATURES}",
                f.feature_min.len(),
                f.feature_max.len()
            );
        }
        if f.support_vectors.is_empty() || f.sv_coef.len() != f.support_vectors.len() {
            bail!(
                "{} coefficients for {} support vectors",
                f.sv_coef.len(),
                f.support_vectors.len()
            );
        }
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        if !(f.gamma > 0.0 && f.gamma.is_finite() && f.rho.is_finite() && finite(&f.sv_coef)) {
            bail!("gamma, rho or a coefficient is not a usable number");
        }
        let mut min = [0.0; FEATURES];
        let mut scale = [0.0; FEATURES];
        for i in 0..FEATURES {
            let (lo, hi) = (f.feature_min[i], f.feature_max[i]);
            if !(lo.is_finite() && hi.is_finite() && hi > lo) {
                bail!("feature {i}'s bounds {lo}..{hi} are not a range");
            }
            min[i] = lo;
            scale[i] = 2.0 / (hi - lo);
        }
        let mut support = Vec::with_capacity(f.support_vectors.len());
        for (i, sv) in f.support_vectors.iter().enumerate() {
            let v: [f64; FEATURES] = sv
                .as_slice()
                .try_into()
                .ok()
                .filter(|v: &[f64; FEATURES]| finite(v))
                .with_context(|| format!("support vector {i} is not {FEATURES} numbers"))?;
            support.push(v);
        }
        Ok(Self {
            min,
            scale,
            gamma: f.gamma,
            rho: f.rho,
            coef: f.sv_coef,
            support,
        })
    }

    /// The score of a packed RGB24 picture `rgb` of `width` x `height` (lower is better).
    ///
    /// NaN for an empty picture. Panics if `rgb` holds fewer than `3 * width * height` bytes.
    pub fn score(&self, rgb: &[u8], width: usize, height: usize, scratch: &mut QualityScratch) -> f32 {
        let n = width * height;
        assert!(
            rgb.len() >= 3 * n,
            "{} bytes for a {width}x{height} RGB24 picture",
            rgb.len()
        );
        if n == 0 {
            return f32::NAN;
        }
        let mut grey = std::mem::take(&mut scratch.grey);
        grey.clear();
        grey.extend(rgb[..3 * n].chunks_exact(3).map(|p| {
            let [r, g, b] = [p[0], p[1], p[2]].map(|v| f64::from(v) * (1.0 / 255.0));
            r * 0.2125 + g * 0.7154 + b * 0.0721
        }));
        let mut features = [0.0; FEATURES];
        scale_features(&grey, width, height, scratch, &mut features[..PER_SCALE]);
        let mut half = std::mem::take(&mut scratch.half);
        let (hw, hh) = halve(&grey, width, height, scratch, &mut half);
        scale_features(&half, hw, hh, scratch, &mut features[PER_SCALE..]);
        scratch.grey = grey;
        scratch.half = half;
        self.predict(&features) as f32
    }

    /// libsvm's epsilon-SVR decision on the scaled features.
    fn predict(&self, features: &[f64; FEATURES]) -> f64 {
        let mut x = [0.0; FEATURES];
        for i in 0..FEATURES {
            x[i] = -1.0 + self.scale[i] * (features[i] - self.min[i]);
        }
        let mut sum = 0.0;
        for (sv, c) in self.support.iter().zip(&self.coef) {
            let d: f64 = sv.iter().zip(&x).map(|(s, v)| (v - s) * (v - s)).sum();
            sum += c * (-self.gamma * d).exp();
        }
        sum - self.rho
    }
}

/// The 18 features of one scale: the fits to the MSCN coefficients and to their four products.
fn scale_features(img: &[f64], w: usize, h: usize, s: &mut QualityScratch, out: &mut [f64]) {
    mscn(img, w, h, s);
    let (m, line) = (&s.mscn, &mut s.line);
    // The reference's pairs: [:, :-1] * [:, 1:], [:-1, :] * [1:, :], [:-1, :-1] * [1:, 1:] and
    // [1:, :-1] * [:-1, 1:].
    let mut sets = [Moments::default(); 5];
    let mut products = |set: &mut Moments, a: &[f64], b: &[f64]| {
        line.clear();
        line.extend(a.iter().zip(b).map(|(x, y)| x * y));
        set.add(line);
    };
    for y in 0..h {
        let row = &m[y * w..(y + 1) * w];
        sets[0].add(row);
        products(&mut sets[1], &row[..w - 1], &row[1..]);
        if y + 1 < h {
            let next = &m[(y + 1) * w..(y + 2) * w];
            products(&mut sets[2], row, next);
            products(&mut sets[3], &row[..w - 1], &next[1..]);
            products(&mut sets[4], &next[..w - 1], &row[1..]);
        }
    }
    let fit = sets.map(|s| s.fit());
    out[0] = fit[0].alpha;
    out[1] = (fit[0].left_var + fit[0].right_var) / 2.0;
    for (k, f) in fit[1..].iter().enumerate() {
        out[2 + 4 * k..6 + 4 * k].copy_from_slice(&[f.alpha, f.mean, f.left_var, f.right_var]);
    }
}

/// The MSCN coefficients of `img` into `s.mscn`, row by row: the window's pass down the columns
/// over the picture and its squares, then along the row (beyond the picture, zeros: nothing
/// added; each sum in the taps' order).
fn mscn(img: &[f64], w: usize, h: usize, s: &mut QualityScratch) {
    let k = window();
    s.mscn.resize(w * h, 0.0);
    for v in [&mut s.down, &mut s.down_sq, &mut s.mean_row, &mut s.sq_row] {
        v.resize(w, 0.0);
    }
    let row = |r: usize| &img[r * w..(r + 1) * w];
    for y in 0..h {
        if y >= RADIUS && y + RADIUS < h {
            let r: [&[f64]; TAPS] = std::array::from_fn(|i| row(y + i - RADIUS));
            for (x, (m, q)) in s.down.iter_mut().zip(s.down_sq.iter_mut()).enumerate() {
                let p: [f64; TAPS] = std::array::from_fn(|i| r[i][x]);
                *m = taps7(&k, &p);
                *q = taps7(&k, &p.map(|v| v * v));
            }
        } else {
            s.down.fill(0.0);
            s.down_sq.fill(0.0);
            for (i, &ki) in k.iter().enumerate() {
                let Some(r) = (y + i).checked_sub(RADIUS).filter(|&r| r < h) else {
                    continue;
                };
                for ((m, q), &p) in s.down.iter_mut().zip(s.down_sq.iter_mut()).zip(row(r)) {
                    *m += ki * p;
                    *q += ki * (p * p);
                }
            }
        }
        along(&k, &s.down, &mut s.mean_row);
        along(&k, &s.down_sq, &mut s.sq_row);
        let dst = &mut s.mscn[y * w..(y + 1) * w];
        for (((d, &v), &mu), &sq) in dst.iter_mut().zip(row(y)).zip(&s.mean_row).zip(&s.sq_row) {
            let sigma = (mu * mu - sq).abs().sqrt();
            *d = (v - mu) / (sigma + C);
        }
    }
}

const TAPS: usize = 2 * RADIUS + 1;

/// `sum k_i p_i`, in the taps' order.
#[inline(always)]
fn taps7(k: &[f64; TAPS], p: &[f64; TAPS]) -> f64 {
    k[0] * p[0] + k[1] * p[1] + k[2] * p[2] + k[3] * p[3] + k[4] * p[4] + k[5] * p[5] + k[6] * p[6]
}

/// The window along a row, zeros beyond its ends.
fn along(k: &[f64; TAPS], src: &[f64], dst: &mut [f64]) {
    let w = src.len();
    let edge = |x: usize| {
        let mut a = 0.0;
        for (i, &ki) in k.iter().enumerate() {
            if let Some(p) = (x + i).checked_sub(RADIUS).and_then(|j| src.get(j)) {
                a += ki * p;
            }
        }
        a
    };
    if w > 2 * RADIUS {
        let n = w - 2 * RADIUS;
        let s: [&[f64]; TAPS] = std::array::from_fn(|i| &src[i..i + n]);
        for (x, d) in dst[RADIUS..RADIUS + n].iter_mut().enumerate() {
            *d = taps7(k, &std::array::from_fn(|i| s[i][x]));
        }
    }
    for x in (0..w.min(RADIUS)).chain(w.saturating_sub(RADIUS).max(RADIUS)..w) {
        dst[x] = edge(x);
    }
}

/// The reference's 7x7 Gaussian window, normalised to sum 1, is the outer product of this one.
fn window() -> [f64; TAPS] {
    let mut k = [0.0; TAPS];
    for (i, v) in k.iter_mut().enumerate() {
        let d = i as f64 - RADIUS as f64;
        *v = (-(d * d) / (2.0 * SIGMA * SIGMA)).exp();
    }
    let sum: f64 = k.iter().sum();
    k.map(|v| v / sum)
}

/// Sums over one set of coefficients, enough for the reference's moment-matching fit: the count
/// and squares of the negative values (its left side), the squares of the others (its right side,
/// 0 included) and the absolute values.
#[derive(Clone, Copy, Default)]
struct Moments {
    n: usize,
    left: usize,
    left_sq: f64,
    right_sq: f64,
    abs: f64,
}

impl Moments {
    /// Adds `values`, in four interleaved running sums (branch-free, so that they vectorise).
    fn add(&mut self, values: &[f64]) {
        let (mut left_sq, mut right_sq, mut abs) = ([0.0; 4], [0.0; 4], [0.0; 4]);
        let chunks = values.chunks_exact(4);
        let rest = chunks.remainder();
        for c in chunks {
            for l in 0..4 {
                // min and max, not a comparison: the compiler would branch on it.
                let (lv, rv) = (c[l].min(0.0), c[l].max(0.0));
                left_sq[l] += lv * lv;
                right_sq[l] += rv * rv;
                abs[l] += c[l].abs();
            }
        }
        for &v in rest {
            let (lv, rv) = (v.min(0.0), v.max(0.0));
            left_sq[0] += lv * lv;
            right_sq[0] += rv * rv;
            abs[0] += v.abs();
        }
        let sum = |a: [f64; 4]| (a[0] + a[1]) + (a[2] + a[3]);
        self.n += values.len();
        self.left += values.iter().filter(|&&v| v < 0.0).count();
        self.left_sq += sum(left_sq);
        self.right_sq += sum(right_sq);
        self.abs += sum(abs);
    }

    /// The asymmetric generalised Gaussian of the reference's `AsymmetricGeneralizedGaussian`:
    /// the variances of each side about 0, the shape matching `R_hat`, and the mean.
    fn fit(&self) -> Fit {
        let n = self.n as f64;
        let side = |sq: f64, k: usize| if k == 0 { 0.0 } else { sq / k as f64 };
        let (left_var, right_var) = (side(self.left_sq, self.left), side(self.right_sq, self.n - self.left));
        let (sl, sr) = (left_var.sqrt(), right_var.sqrt());
        let mean_sq = (self.left_sq + self.right_sq) / n;
        let mean_abs = self.abs / n;
        let r_hat = mean_abs * mean_abs / mean_sq;
        let g = sl / sr;
        let big_r = r_hat * (g * g * g + 1.0) * (g + 1.0) / ((g * g + 1.0) * (g * g + 1.0));
        let alpha = if big_r.is_finite() && big_r > 0.0 {
            solve_alpha(big_r)
        } else {
            ALPHA_DEGENERATE
        };
        let (l1, l2, l3) = (ln_gamma(1.0 / alpha), ln_gamma(2.0 / alpha), ln_gamma(3.0 / alpha));
        // (sr - sl) sqrt(G(1/a) / G(3/a)) G(2/a) / G(1/a)
        let mean = (sr - sl) * (0.5 * (l1 - l3) + l2 - l1).exp();
        Fit {
            alpha,
            mean,
            left_var,
            right_var,
        }
    }
}

struct Fit {
    alpha: f64,
    mean: f64,
    left_var: f64,
    right_var: f64,
}

/// `phi(a) = G(2/a)^2 / (G(1/a) G(3/a))`, increasing from 0 to 3/4.
fn phi(alpha: f64) -> f64 {
    (2.0 * ln_gamma(2.0 / alpha) - ln_gamma(1.0 / alpha) - ln_gamma(3.0 / alpha)).exp()
}

/// The shape whose `phi` is `target`, by bisection in log space to full precision.
fn solve_alpha(target: f64) -> f64 {
    let (mut lo, mut hi) = (ALPHA_MIN.ln(), ALPHA_MAX.ln());
    if phi(ALPHA_MIN) >= target {
        return ALPHA_MIN;
    }
    if phi(ALPHA_MAX) <= target {
        return ALPHA_MAX;
    }
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if phi(mid.exp()) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (0.5 * (lo + hi)).exp()
}

/// ln Gamma(x) for x > 0 (Lanczos, g = 7, 9 terms: about 1e-15 relative), by reflection below 1/2.
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEF: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = COEF[0];
    let t = x + G + 0.5;
    for (i, c) in COEF.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// `skimage.transform.rescale(img, 1/2, order=2, mode="constant", anti_aliasing=False)` of
/// scikit-image 0.18 into `out`; returns its width and height.
///
/// Its size rounds half of each side half to even (NumPy's `round`); each output pixel samples
/// the input at `f (x + 0.5) - 0.5` (`f` the side's ratio: 2 for an even side), always inside
/// the picture, by SciPy's quadratic B-spline: coefficients by the recursive prefilter with
/// mirror boundaries, taps beyond an edge mirrored (`2 n - 2 - i`); then clipped to the input's
/// range (a 0 kept where 0 lies below that range: the reference's `cval` rule).
fn halve(img: &[f64], w: usize, h: usize, s: &mut QualityScratch, out: &mut Vec<f64>) -> (usize, usize) {
    let half_side = |n: usize| ((n as f64 * 0.5).round_ties_even() as usize).max(1);
    let (hw, hh) = (half_side(w), half_side(h));
    // Coefficients: the prefilter along columns, then along rows (SciPy's axis order).
    s.coef.clear();
    s.coef.extend_from_slice(img);
    spline_filter_columns(&mut s.coef, w, h, &mut s.line);
    spline_filter_rows(&mut s.coef, w, h, &mut s.block, &mut s.line);
    taps(w, hw, &mut s.col_taps);
    taps(h, hh, &mut s.row_taps);
    s.columns.resize(h * hw, 0.0);
    for y in 0..h {
        let src = &s.coef[y * w..(y + 1) * w];
        let dst = &mut s.columns[y * hw..(y + 1) * hw];
        for (d, (i, k)) in dst.iter_mut().zip(&s.col_taps) {
            *d = k[0] * src[i[0]] + k[1] * src[i[1]] + k[2] * src[i[2]];
        }
    }
    let (lo, hi) = range(img);
    let keep_zero = !(lo <= 0.0 && 0.0 <= hi);
    out.clear();
    out.resize(hw * hh, 0.0);
    for (y, (i, k)) in s.row_taps.iter().enumerate() {
        let rows = i.map(|r| &s.columns[r * hw..(r + 1) * hw]);
        for (x, d) in out[y * hw..(y + 1) * hw].iter_mut().enumerate() {
            let v = k[0] * rows[0][x] + k[1] * rows[1][x] + k[2] * rows[2][x];
            *d = if keep_zero && v == 0.0 { 0.0 } else { v.clamp(lo, hi) };
        }
    }
    (hw, hh)
}

/// For each of `m` output samples of a side of `n` input samples: the three coefficient indices
/// and weights of SciPy's quadratic B-spline at `f (x + 0.5) - 0.5`.
fn taps(n: usize, m: usize, out: &mut Vec<([usize; 3], [f64; 3])>) {
    let f = n as f64 / m as f64;
    let fold = |i: i64| -> usize {
        if n <= 1 {
            return 0;
        }
        let (n, s2) = (n as i64, 2 * n as i64 - 2);
        let mut i = i.rem_euclid(s2);
        if i >= n {
            i = s2 - i;
        }
        i as usize
    };
    out.clear();
    out.extend((0..m).map(|x| {
        let c = f * (x as f64 + 0.5) - 0.5;
        let centre = (c + 0.5).floor();
        let t = c - centre;
        let w1 = 0.75 - t * t;
        let y = 0.5 - t;
        let w0 = 0.5 * y * y;
        let w2 = 1.0 - w0 - w1;
        let start = centre as i64 - 1;
        ([fold(start), fold(start + 1), fold(start + 2)], [w0, w1, w2])
    }));
}

/// The least and greatest of `values` (four running pairs, so that they vectorise).
fn range(values: &[f64]) -> (f64, f64) {
    let (mut lo, mut hi) = ([f64::INFINITY; 4], [f64::NEG_INFINITY; 4]);
    let chunks = values.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..4 {
            lo[l] = lo[l].min(c[l]);
            hi[l] = hi[l].max(c[l]);
        }
    }
    for &v in rest {
        lo[0] = lo[0].min(v);
        hi[0] = hi[0].max(v);
    }
    (
        lo.iter().fold(f64::INFINITY, |a, &b| a.min(b)),
        hi.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b)),
    )
}

/// Rows filtered side by side: up to this many, interleaved, through [`spline_filter_columns`].
const ROW_LANES: usize = 8;

/// SciPy's prefilter along each row of a `w` x `h` picture: the rows, `ROW_LANES` at a time,
/// interleaved into `block` and filtered there as its columns.
fn spline_filter_rows(c: &mut [f64], w: usize, h: usize, block: &mut Vec<f64>, start: &mut Vec<f64>) {
    for y0 in (0..h).step_by(ROW_LANES) {
        let k = ROW_LANES.min(h - y0);
        block.clear();
        block.resize(k * w, 0.0);
        for l in 0..k {
            for (x, &v) in c[(y0 + l) * w..(y0 + l + 1) * w].iter().enumerate() {
                block[x * k + l] = v;
            }
        }
        spline_filter_columns(block, k, w, start);
        for l in 0..k {
            for (x, v) in c[(y0 + l) * w..(y0 + l + 1) * w].iter_mut().enumerate() {
                *v = block[x * k + l];
            }
        }
    }
}

/// SciPy's `spline_filter1d(order=2, mode="constant")` down each column of a `w` x `h` picture, the
/// columns side by side: the gain, then one causal and one anticausal recursion with SciPy's
/// mirror-boundary starts (`_init_causal_mirror`, `_init_anticausal_mirror`), the same operations
/// in the same order on each column.
fn spline_filter_columns(c: &mut [f64], w: usize, h: usize, start: &mut Vec<f64>) {
    if h < 2 {
        return;
    }
    let z = SPLINE_POLE;
    let gain = (1.0 - z) * (1.0 - 1.0 / z);
    for v in c.iter_mut() {
        *v *= gain;
    }
    let row = |i: usize| i * w..(i + 1) * w;
    let z_n_1 = z.powf((h - 1) as f64);
    start.clear();
    start.extend(c[row(0)].iter().zip(&c[row(h - 1)]).map(|(a, b)| a + z_n_1 * b));
    let mut z_i = z;
    for i in 1..h - 1 {
        for ((s, a), b) in start.iter_mut().zip(&c[row(i)]).zip(&c[row(h - 1 - i)]) {
            *s += z_i * (a + z_n_1 * b);
        }
        z_i *= z;
        if z_i.abs() < NEGLIGIBLE {
            break;
        }
    }
    let d = 1.0 - z_n_1 * z_n_1;
    for (v, s) in c[row(0)].iter_mut().zip(start.iter()) {
        *v = s / d;
    }
    for i in 1..h {
        let (prev, cur) = c[(i - 1) * w..(i + 1) * w].split_at_mut(w);
        for (v, p) in cur.iter_mut().zip(prev.iter()) {
            *v += z * p;
        }
    }
    {
        let (prev, last) = c[(h - 2) * w..h * w].split_at_mut(w);
        for (v, p) in last.iter_mut().zip(prev.iter()) {
            *v = (z * p + *v) * z / (z * z - 1.0);
        }
    }
    for i in (0..h - 1).rev() {
        let (cur, next) = c[i * w..(i + 2) * w].split_at_mut(w);
        for (v, n) in cur.iter_mut().zip(next.iter()) {
            *v = z * (n - *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Brisque {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join(BRISQUE_MODEL);
        Brisque::load(&path).expect("models/brisque.json (run scripts/setup.sh)")
    }

    /// A repeatable uniform source in 0..1 (xorshift).
    fn uniforms(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// A synthetic scene with a natural picture's statistics: waves in all directions whose
    /// amplitudes fall as 1/frequency, and a few sharp-edged discs; RGB, slightly tinted.
    fn scene(w: usize, h: usize) -> Vec<u8> {
        let mut u = uniforms(0x2545_f491_4f6c_dd1d);
        let waves: Vec<[f64; 4]> = (0..48)
            .map(|i| {
                let f = (1.0 / 96.0) * (24.0f64).powf(i as f64 / 47.0); // cycles per pixel
                let a = std::f64::consts::TAU * u();
                [f * a.cos(), f * a.sin(), std::f64::consts::TAU * u(), 0.5 / (f * 96.0)]
            })
            .collect();
        let discs: Vec<[f64; 4]> = (0..6)
            .map(|_| [u() * w as f64, u() * h as f64, 8.0 + 30.0 * u(), u() - 0.5])
            .collect();
        let mut grey = Vec::with_capacity(w * h);
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f64, y as f64);
                let mut v: f64 = waves
                    .iter()
                    .map(|[kx, ky, p, a]| a * (std::f64::consts::TAU * (kx * fx + ky * fy) + p).sin())
                    .sum();
                for [cx, cy, r, d] in &discs {
                    if (fx - cx).powi(2) + (fy - cy).powi(2) < r * r {
                        v += 2.0 * d;
                    }
                }
                grey.push(v);
            }
        }
        let (lo, hi) = grey
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        grey.iter()
            .flat_map(|v| {
                let t = 20.0 + 215.0 * (v - lo) / (hi - lo);
                [t * 1.05, t, t * 0.9].map(|c| c.round().clamp(0.0, 255.0) as u8)
            })
            .collect()
    }

    /// `rgb` with roughly normal noise of standard deviation `amount` added.
    fn noisy(rgb: &[u8], amount: f64) -> Vec<u8> {
        let mut u = uniforms(0x9e37_79b9_7f4a_7c15);
        rgb.iter()
            .map(|&v| {
                // The sum of 4 uniforms less 2 has deviation 1/sqrt(3).
                let g: f64 = (0..4).map(|_| u()).sum::<f64>() - 2.0;
                (f64::from(v) + amount * g * 3f64.sqrt()).round().clamp(0.0, 255.0) as u8
            })
            .collect()
    }

    /// A 5x5 box blur, twice.
    fn blurred(rgb: &[u8], w: usize, h: usize) -> Vec<u8> {
        let mut cur = rgb.to_vec();
        for _ in 0..2 {
            let mut next = cur.clone();
            for y in 0..h {
                for x in 0..w {
                    for c in 0..3 {
                        let (mut sum, mut count) = (0u32, 0u32);
                        for yy in y.saturating_sub(2)..(y + 3).min(h) {
                            for xx in x.saturating_sub(2)..(x + 3).min(w) {
                                sum += u32::from(cur[3 * (yy * w + xx) + c]);
                                count += 1;
                            }
                        }
                        next[3 * (y * w + x) + c] = ((sum + count / 2) / count) as u8;
                    }
                }
            }
            cur = next;
        }
        cur
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing.json");
        let e = format!("{:#}", Brisque::load(&missing).err().unwrap());
        assert!(e.contains("nothing.json"), "{e}");
        let short = dir.path().join("short.json");
        std::fs::write(
            &short,
            r#"{"feature_min":[0],"feature_max":[1],"gamma":0.05,"rho":0,"sv_coef":[1],"support_vectors":[[0]]}"#,
        )
        .unwrap();
        let e = format!("{:#}", Brisque::load(&short).err().unwrap());
        assert!(e.contains("short.json") && e.contains("feature bounds"), "{e}");
    }

    /// The separable window's products against `imquality.statistics.gaussian_kernel2d(7, 7/6)`.
    #[test]
    fn window_is_the_reference_kernel() {
        let k = window();
        let cases = [
            ((3, 3), 0.11739635539001349),
            ((0, 0), 0.0001577586358082699),
            ((0, 3), 0.0043035205210607925),
            ((1, 2), 0.018705566786105406),
        ];
        for ((y, x), want) in cases {
            assert!(
                (k[y] * k[x] - want).abs() < 1e-15 * want,
                "({y}, {x}): {} not {want}",
                k[y] * k[x]
            );
        }
        assert!((k.iter().sum::<f64>() - 1.0).abs() < 1e-15);
    }

    #[test]
    fn ln_gamma_matches_known_values() {
        let cases = [
            (0.5, std::f64::consts::PI.sqrt().ln()),
            (1.0, 0.0),
            (2.0, 0.0),
            (5.0, 24f64.ln()),
            (0.1, 9.513_507_698_668_732f64.ln()),
            (15.0, 87_178_291_200f64.ln()),
        ];
        for (x, want) in cases {
            assert!(
                (ln_gamma(x) - want).abs() < 1e-12,
                "lnG({x}) = {} not {want}",
                ln_gamma(x)
            );
        }
        // A Gaussian's phi is 2/pi, a Laplacian's 1/2.
        assert!((phi(2.0) - 2.0 / std::f64::consts::PI).abs() < 1e-14);
        assert!((solve_alpha(0.5) - 1.0).abs() < 1e-12);
    }

    /// Values from scikit-image 0.18.3 + SciPy 1.10.1: `rescale(a, 1/2, order=2, mode="constant",
    /// anti_aliasing=False)` of the arrays below (odd sides round half to even; the second's minimum
    /// is above 0, so clipping and the kept-zero rule both apply).
    #[test]
    fn halving_matches_scikit_image() {
        let mut s = QualityScratch::default();
        let mut out = Vec::new();
        let a: Vec<f64> = (0..5 * 7)
            .map(|k| ((k / 7 * 7 + k % 7 * 3) % 11) as f64 / 10.0)
            .collect();
        let want_a = [
            0.6783267806412345,
            0.21725083937457518,
            0.7130951974776661,
            0.229899377009326,
            0.83060356635552,
            0.4147096979179935,
            0.17964106582500367,
            0.46526439801773006,
        ];
        assert_eq!(halve(&a, 7, 5, &mut s, &mut out), (4, 2));
        for (got, want) in out.iter().zip(want_a) {
            assert!((got - want).abs() < 1e-13, "{got} not {want}");
        }
        let b: Vec<f64> = (0..6 * 8)
            .map(|k| ((k / 8 * 5 + (k % 8) * (k % 8)) % 13) as f64 / 12.0 + 0.05)
            .collect();
        let want_b = [
            0.19303881938755713,
            0.5835010426050036,
            0.6470619501806066,
            0.5710207387248569,
            0.6135674393436343,
            0.5815523694108481,
            0.20289128154473923,
            0.9811190192022408,
            0.6696298373093229,
            0.5790173302429364,
            0.7009515412168454,
            0.554092009733673,
        ];
        assert_eq!(halve(&b, 8, 6, &mut s, &mut out), (4, 3));
        for (got, want) in out.iter().zip(want_b) {
            assert!((got - want).abs() < 1e-13, "{got} not {want}");
        }
    }

    #[test]
    fn flat_and_noisy_pictures_score_finite() {
        let model = model();
        let mut s = QualityScratch::default();
        let (w, h) = (96, 80);
        let flat = vec![128u8; 3 * w * h];
        let black = vec![0u8; 3 * w * h];
        for rgb in [&flat, &black, &noisy(&flat, 30.0), &noisy(&scene(w, h), 60.0)] {
            let q = model.score(rgb, w, h, &mut s);
            assert!(q.is_finite(), "score {q}");
        }
        assert!(model.score(&[], 0, 0, &mut s).is_nan());
        assert!(model.score(&[7, 8, 9], 1, 1, &mut s).is_finite());
    }

    #[test]
    fn noisier_and_blurrier_score_worse() {
        let model = model();
        let mut s = QualityScratch::default();
        let (w, h) = (256, 256);
        let clean = scene(w, h);
        let base = model.score(&clean, w, h, &mut s);
        let noise = model.score(&noisy(&clean, 25.0), w, h, &mut s);
        let blur = model.score(&blurred(&clean, w, h), w, h, &mut s);
        assert!(noise > base + 5.0, "noisy {noise} vs clean {base}");
        assert!(blur > base + 5.0, "blurred {blur} vs clean {base}");
        // The scratch's sizes do not leak between pictures of different sizes.
        let again = model.score(&clean, w, h, &mut s);
        assert_eq!(again, base);
    }
}
