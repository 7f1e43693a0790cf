//! The bicubic warp in two passes, for a face turned by a few degrees at most: in, a loader of
//! the frame's texels, the crop -> frame map and the crop's size; out, the crop (a [`CropOut`]),
//! or nothing where the face is turned too far or its crop passes the frame's top or bottom row.
//! First along the frame's rows (four taps per crop column and frame row), then down the crop's
//! columns (four taps per crop pixel): fewer than eight taps a crop pixel where the direct warp
//! takes sixteen, with the kernel sheared by the face's turn (the direct warp's crop within a
//! rounding at no turn, within a few levels at five degrees).

use wide::f32x4;

use crate::geom::{Affine, Rect};
use crate::kernels::crop::CropOut;
use crate::kernels::sample::{cubic_weights, cubic_weights4};
use crate::kernels::Cpu;

/// The largest shear (the tangent of the face's turn, 5 degrees) the two passes take: past it,
/// the sheared kernel strays from the direct warp's by more than a few levels.
pub(crate) const MAX_SHEAR: f64 = 0.0875;

/// Crop columns a strip of the two passes covers: the first pass's planes for a strip (12 bytes
/// a crop column and frame row) stay in a core's cache until the second pass reads them.
const STRIP: usize = 64;

/// Texels kept clear of a strip's computed extent on each side, for the rounding of the taps'
/// points in f32.
const MARGIN: usize = 2;

/// The two passes of a warp: the first pass's map (frame row `j`, crop column `u` -> frame
/// column `a u + b j + c`), the second's (crop pixel (u, v) -> frame row `m3 u + m4 v + m5`),
/// and each strip's texels.
pub(crate) struct TwoPass {
    first: [f64; 3],
    second: [f64; 3],
    size: usize,
    strips: Vec<Strip>,
}

/// A strip of crop columns `us` and the texels its passes read: `w x h` from frame pixel
/// (x0, y0), which may lie past the frame's edges (those texels repeat the edge's, as the
/// clamped sampler reads them), and the texel coordinates the points are clamped to (the
/// frame's, as the clamped sampler clamps them, within the taps' reach of the texels).
struct Strip {
    us: std::ops::Range<usize>,
    x0: i64,
    y0: i64,
    w: usize,
    h: usize,
    xs: (f32, f32),
    ys: (f32, f32),
}

impl TwoPass {
    /// The two passes of a `size` crop under the crop -> frame map `inv` on a `width x height`
    /// frame, where the face is turned by at most [`MAX_SHEAR`] and its crop's points lie
    /// between the frame's top and bottom rows; `None` elsewhere (the direct warp's).
    pub(crate) fn plan(inv: &Affine, size: usize, (width, height): (usize, usize)) -> Option<TwoPass> {
        let [m0, m1, m2, m3, m4, m5] = inv.0;
        let fine = |v: f64| v.is_finite();
        if !(m0 > 0.0 && m4 > 0.0 && inv.0.iter().all(|&v| fine(v)) && size > 0) {
            return None;
        }
        if m1.abs() > MAX_SHEAR * m4 || m3.abs() > MAX_SHEAR * m0 {
            return None;
        }
        // Along frame row j, crop column u lies at the frame column where that column's line
        // (v free) meets the row.
        let first = [m0 - m1 * m3 / m4, m1 / m4, m2 - m1 * m5 / m4];
        let second = [m3, m4, m5];
        let mut strips = Vec::with_capacity(size.div_ceil(STRIP));
        for u0 in (0..size).step_by(STRIP) {
            let u1 = (u0 + STRIP).min(size);
            let (ua, ub) = (u0 as f64, (u1 - 1) as f64);
            // Frame rows the second pass reads: the extremes are at the strip's corners.
            let ys = [(ua, 0.0), (ub, 0.0), (ua, (size - 1) as f64), (ub, (size - 1) as f64)]
                .map(|(u, v)| m3 * u + m4 * v + m5);
            let (y0, y1) = extent(&ys)?;
            // A point above or below the frame is clamped to its edge row at the point's own
            // column, where the second pass would read the rows' points on the column's line
            // (apart by the turn times the distance): those take the direct warp. A point past
            // the left or right edge is clamped to the edge column in both.
            if y0 < 0 || y1 > height as i64 - 1 {
                return None;
            }
            let rows = (y0 - 1 - MARGIN as i64, y1 + 3 + MARGIN as i64);
            // Frame columns the first pass reads over those rows.
            let xs = [(ua, rows.0), (ub, rows.0), (ua, rows.1), (ub, rows.1)]
                .map(|(u, j)| first[0] * u + first[1] * j as f64 + first[2]);
            let (x0, x1) = extent(&xs)?;
            let (x0, x1) = (x0.clamp(0, width as i64 - 1), x1.clamp(0, width as i64 - 1));
            let cols = (x0 - 1 - MARGIN as i64, x1 + 3 + MARGIN as i64);
            let (w, h) = ((cols.1 - cols.0) as usize, (rows.1 - rows.0) as usize);
            // The frame's pixels in texel coordinates, within the taps' reach of the texels
            // (the first pass reads texels ix - 1 ..= ix + 2, the second rows iy - 1 ..= iy + 3).
            let edge =
                |o: i64, n: usize, reach: usize| ((-o).max(1) as f32, ((n as i64 - 1 - o).min(reach as i64)) as f32);
            strips.push(Strip {
                us: u0..u1,
                x0: cols.0,
                y0: rows.0,
                w,
                h,
                xs: edge(cols.0, width, w - 3),
                ys: edge(rows.0, height, h - 4),
            });
        }
        Some(TwoPass {
            first,
            second,
            size,
            strips,
        })
    }

    /// Warps into `out` from a `width x height` frame: each strip's texels loaded by `load`
    /// into `texels` (row by row, R, G, B, 0 in f32; through `inner` for a strip past the
    /// frame's edge), the first pass into `rows` (three planes of a row of the strip's columns a
    /// texel row), the second into `out`. The same sums at every CPU level (`cpu` only picks the
    /// instructions).
    pub(crate) fn run<O: CropOut + ?Sized>(
        &self,
        cpu: Cpu,
        (width, height): (usize, usize),
        load: &mut dyn FnMut(Rect, &mut Vec<f32x4>),
        (texels, inner, rows): (&mut Vec<f32x4>, &mut Vec<f32x4>, &mut Vec<f32>),
        out: &mut O,
    ) {
        for st in &self.strips {
            load_strip(st, (width, height), load, texels, inner);
            #[cfg(target_arch = "x86_64")]
            if cpu.avx2() {
                // SAFETY: a `Cpu` says AVX2 only where this CPU has it.
                unsafe { self.strip_avx2(texels, st, rows, out) };
                continue;
            }
            let _ = cpu;
            self.first_pass(texels, st, rows);
            self.second_pass(rows, st, out);
        }
    }

    /// A strip's two passes compiled for AVX2 (the same operations, in eight-lane registers).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn strip_avx2<O: CropOut + ?Sized>(&self, tex: &[f32x4], st: &Strip, rows: &mut Vec<f32>, out: &mut O) {
        // SAFETY: this function's caller has AVX2.
        unsafe {
            self.first_pass_avx2(tex, st, rows);
            self.second_pass_avx2(rows, st, out);
        }
    }

    /// For each texel row and crop column of strip `st`, four taps along the row at the
    /// column's point: `rows`, three planes (R, G, B) of a row of [`stride`] values a texel row.
    #[inline(always)]
    fn first_pass(&self, tex: &[f32x4], st: &Strip, rows: &mut Vec<f32>) {
        let (tw, th, us) = (st.w, st.h, &st.us);
        let n = us.len();
        let stride = stride(n);
        let plane = stride * th;
        grow(rows, 3 * plane);
        let (rp, rest) = rows.split_at_mut(plane);
        let (gp, bp) = rest.split_at_mut(plane);
        let [a, b, c] = self.first;
        let step = f32x4::splat(a as f32);
        let (lo, hi) = (f32x4::splat(st.xs.0), f32x4::splat(st.xs.1));
        let lanes = f32x4::new([0.0, 1.0, 2.0, 3.0]);
        for (j, row) in tex.chunks_exact(tw).enumerate() {
            let fy = (st.y0 + j as i64) as f64;
            // The texel column of crop column `us.start` on this row.
            let start = f32x4::splat((a * us.start as f64 + b * fy + c - st.x0 as f64) as f32);
            for q in (0..n).step_by(4) {
                // Clamped to the frame (the clamped sampler's), within the taps' reach.
                let x = (start + step * (lanes + f32x4::splat(q as f32)))
                    .fast_max(lo)
                    .fast_min(hi);
                let ix = x.trunc_int();
                let w = cubic_weights4(x - ix.round_float()).map(|w| w.to_array());
                let ix = ix.to_array();
                let mut px = [f32x4::ZERO; 4];
                for (k, p) in px.iter_mut().enumerate() {
                    let t: &[f32x4; 4] = row[ix[k] as usize - 1..][..4].try_into().expect("4 texels");
                    *p = taps4(t, [w[0][k], w[1][k], w[2][k], w[3][k]]);
                }
                let [cr, cg, cb, _] = f32x4::transpose(px);
                let at = j * stride + q;
                for (p, v) in [&mut *rp, &mut *gp, &mut *bp].into_iter().zip([cr, cg, cb]) {
                    p[at..at + 4].copy_from_slice(&v.to_array());
                }
            }
        }
    }

    /// [`TwoPass::first_pass`] with each point's four texels in two eight-lane products (texels
    /// 0 and 1, then 2 and 3), the points' weights eight at a time: the same operations.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn first_pass_avx2(&self, tex: &[f32x4], st: &Strip, rows: &mut Vec<f32>) {
        use std::arch::x86_64::*;
        let (tw, th, us) = (st.w, st.h, &st.us);
        let n = us.len();
        let stride = stride(n);
        let plane = stride * th;
        grow(rows, 3 * plane);
        assert!(tex.len() >= tw * th && tw >= 4, "the strip's texels");
        let [a, b, c] = self.first;
        let step = _mm256_set1_ps(a as f32);
        let (lo, hi) = (_mm256_set1_ps(st.xs.0), _mm256_set1_ps(st.xs.1));
        let lanes = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let t0 = tex.as_ptr().cast::<f32>();
        let pair = |a: f32, b: f32| _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a));
        for j in 0..th {
            let fy = (st.y0 + j as i64) as f64;
            let start = _mm256_set1_ps((a * us.start as f64 + b * fy + c - st.x0 as f64) as f32);
            for q in (0..n).step_by(8) {
                let at_q = _mm256_add_ps(lanes, _mm256_set1_ps(q as f32));
                let x = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(start, _mm256_mul_ps(step, at_q)), lo), hi);
                let ix = _mm256_cvttps_epi32(x);
                let w = cubic_weights_avx2(_mm256_sub_ps(x, _mm256_cvtepi32_ps(ix)));
                // SAFETY: __m256i and [i32; 8], __m256 and [f32; 8]: 32 bytes of plain data.
                let (ix, w) = unsafe {
                    (
                        std::mem::transmute::<__m256i, [i32; 8]>(ix),
                        w.map(|v| std::mem::transmute::<__m256, [f32; 8]>(v)),
                    )
                };
                let mut px = [f32x4::ZERO; 8];
                for (k, p) in px.iter_mut().enumerate().take((n - q).min(8)) {
                    // SAFETY: ix is in 1 ..= tw - 3 (clamped above: `Strip::xs`), so texels ix - 1 ..= ix + 2
                    // of row j (sixteen f32) are inside `tex` (asserted above).
                    let (t01, t23) = unsafe {
                        let p = t0.add((j * tw + ix[k] as usize - 1) * 4);
                        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                    };
                    let sum = _mm256_add_ps(
                        _mm256_mul_ps(t01, pair(w[0][k], w[1][k])),
                        _mm256_mul_ps(t23, pair(w[2][k], w[3][k])),
                    );
                    // Low half t0 w0 + t2 w2, high half t1 w1 + t3 w3: taps4's sums.
                    let sum = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
                    // SAFETY: __m128 and f32x4 are both four f32 lanes (16 bytes of plain data).
                    *p = unsafe { std::mem::transmute::<__m128, f32x4>(sum) };
                }
                let at = j * stride + q;
                for h in 0..2 {
                    if q + 4 * h >= n {
                        break;
                    }
                    let [cr, cg, cb, _] = f32x4::transpose([px[4 * h], px[4 * h + 1], px[4 * h + 2], px[4 * h + 3]]);
                    for (c, v) in [cr, cg, cb].into_iter().enumerate() {
                        let o = c * plane + at + 4 * h;
                        rows[o..o + 4].copy_from_slice(&v.to_array());
                    }
                }
            }
        }
    }

    /// For each crop pixel of strip `st`, four taps down its column of `rows` (the strip's texel
    /// rows) at the pixel's frame row; out as levels clamped to 0..=255. One pixel at a time,
    /// the operations [`TwoPass::second_pass_avx2`] does eight lanes at a time.
    fn second_pass<O: CropOut + ?Sized>(&self, rows: &[f32], st: &Strip, out: &mut O) {
        let (us, th, size) = (&st.us, st.h, self.size);
        let n = us.len();
        let (stride, plane) = (stride(n), stride(n) * th);
        let [m3, m4, m5] = self.second;
        let step = m3 as f32;
        for v in 0..size {
            let start = (m3 * us.start as f64 + m4 * v as f64 + m5 - st.y0 as f64) as f32;
            for q in 0..n {
                // Clamped to the frame (the clamped sampler's), within the taps' reach.
                let y = (start + step * q as f32).max(st.ys.0).min(st.ys.1);
                let iy = y as usize;
                let w = cubic_weights(y - iy as f32);
                let at = (iy - 1) * stride + q;
                let rgb = [0, 1, 2].map(|c| {
                    let t = [0, 1, 2, 3].map(|k| rows[c * plane + at + k * stride]);
                    ((t[0] * w[0] + t[1] * w[1]) + (t[2] * w[2] + t[3] * w[3])).clamp(0.0, 255.0)
                });
                out.put(v * size + us.start + q, rgb);
            }
        }
    }

    /// [`TwoPass::second_pass`] eight pixels of a crop row at a time, the same operations lane
    /// by lane. The eight pixels' rows are at most one apart (the turn is small): each tap reads
    /// two rows' eight values and takes each lane's.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn second_pass_avx2<O: CropOut + ?Sized>(&self, rows: &[f32], st: &Strip, out: &mut O) {
        use std::arch::x86_64::*;
        let (us, th, size) = (&st.us, st.h, self.size);
        let n = us.len();
        let (stride, plane) = (stride(n), stride(n) * th);
        let [m3, m4, m5] = self.second;
        let step = _mm256_set1_ps(m3 as f32);
        let (lo, hi) = (_mm256_set1_ps(st.ys.0), _mm256_set1_ps(st.ys.1));
        let lanes = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let (zero, top) = (_mm256_setzero_ps(), _mm256_set1_ps(255.0));
        // Every read below is of eight values starting at most at the last row's start plus
        // the last group's column, inside the three planes (asserted once).
        assert!(
            rows.len() >= 3 * plane && n <= stride && stride % 8 == 0,
            "planes of whole rows"
        );
        let p0 = rows.as_ptr();
        for v in 0..size {
            let start = _mm256_set1_ps((m3 * us.start as f64 + m4 * v as f64 + m5 - st.y0 as f64) as f32);
            for q in (0..n).step_by(8) {
                let at_q = _mm256_add_ps(lanes, _mm256_set1_ps(q as f32));
                let y = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(start, _mm256_mul_ps(step, at_q)), lo), hi);
                let iy = _mm256_cvttps_epi32(y);
                let fiy = _mm256_cvtepi32_ps(iy);
                let w = cubic_weights_avx2(_mm256_sub_ps(y, fiy));
                // The least row of the eight, and the lanes one row further.
                let least = _mm_min_epi32(_mm256_castsi256_si128(iy), _mm256_extracti128_si256::<1>(iy));
                let least = _mm_min_epi32(least, _mm_shuffle_epi32::<0b01_00_11_10>(least));
                let least = _mm_min_epi32(least, _mm_shuffle_epi32::<0b10_11_00_01>(least));
                let base = _mm_cvtsi128_si32(least) as usize;
                let further = _mm256_cmp_ps::<_CMP_GT_OQ>(fiy, _mm256_set1_ps(base as f32));
                let mixed = _mm256_movemask_ps(further) != 0;
                let at = (base - 1) * stride + q;
                let mut rgb = [zero; 3];
                for (c, o) in rgb.iter_mut().enumerate() {
                    // SAFETY: `base` is at most th - 4 (`Strip::ys`), so rows base - 1 ..= base + 3 are rows of
                    // the plane, and q + 8 <= stride: each eight-value load is inside `rows`.
                    let t: [__m256; 5] =
                        std::array::from_fn(|k| unsafe { _mm256_loadu_ps(p0.add(c * plane + at + k * stride)) });
                    let t: [__m256; 4] = if mixed {
                        std::array::from_fn(|k| _mm256_blendv_ps(t[k], t[k + 1], further))
                    } else {
                        [t[0], t[1], t[2], t[3]]
                    };
                    let s01 = _mm256_add_ps(_mm256_mul_ps(t[0], w[0]), _mm256_mul_ps(t[1], w[1]));
                    let s23 = _mm256_add_ps(_mm256_mul_ps(t[2], w[2]), _mm256_mul_ps(t[3], w[3]));
                    *o = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(s01, s23), zero), top);
                }
                let i = v * size + us.start + q;
                let count = (n - q).min(8);
                if count == 8 {
                    // SAFETY: __m128 and f32x4 are both four f32 lanes (16 bytes of plain data).
                    let half = |c: __m256, h: usize| unsafe {
                        std::mem::transmute::<__m128, f32x4>(if h == 0 {
                            _mm256_castps256_ps128(c)
                        } else {
                            _mm256_extractf128_ps::<1>(c)
                        })
                    };
                    out.put4(i, rgb.map(|c| half(c, 0)));
                    out.put4(i + 4, rgb.map(|c| half(c, 1)));
                } else {
                    // SAFETY: __m256 and [f32; 8] are both eight f32 (32 bytes of plain data).
                    let [cr, cg, cb] = rgb.map(|c| unsafe { std::mem::transmute::<__m256, [f32; 8]>(c) });
                    for k in 0..count {
                        out.put(i + k, [cr[k], cg[k], cb[k]]);
                    }
                }
            }
        }
    }
}

/// [`cubic_weights`] of eight points, the same operations lane by lane.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn cubic_weights_avx2(t: std::arch::x86_64::__m256) -> [std::arch::x86_64::__m256; 4] {
    use std::arch::x86_64::*;
    let (add, sub, mul, k) = (_mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_set1_ps);
    let t2 = mul(t, t);
    let t3 = mul(t2, t);
    let neg_t3 = _mm256_xor_ps(t3, k(-0.0));
    [
        mul(k(0.5), sub(add(neg_t3, mul(k(2.0), t2)), t)),
        mul(k(0.5), add(sub(mul(k(3.0), t3), mul(k(5.0), t2)), k(2.0))),
        mul(k(0.5), add(add(mul(k(-3.0), t3), mul(k(4.0), t2)), t)),
        mul(k(0.5), sub(t3, t2)),
    ]
}

/// Loads the texels of strip `st` of a `width x height` frame into `texels`: through `load`
/// straight for a strip inside the frame; else its part inside the frame into `inner`, each
/// texel past an edge the edge's (the clamped sampler's reading there).
fn load_strip(
    st: &Strip,
    (width, height): (usize, usize),
    load: &mut dyn FnMut(Rect, &mut Vec<f32x4>),
    texels: &mut Vec<f32x4>,
    inner: &mut Vec<f32x4>,
) {
    let clip = |v: i64, n: usize| v.clamp(0, n as i64) as usize;
    let (x1, y1) = (st.x0 + st.w as i64, st.y0 + st.h as i64);
    let r = Rect::new(
        clip(st.x0, width),
        clip(st.y0, height),
        clip(x1, width),
        clip(y1, height),
    );
    texels.clear();
    if (r.x0 as i64, r.y0 as i64, r.x1 as i64, r.y1 as i64) == (st.x0, st.y0, x1, y1) {
        return load(r, texels);
    }
    inner.clear();
    load(r, inner);
    let iw = r.width();
    for y in 0..st.h as i64 {
        let row = &inner[((st.y0 + y).clamp(r.y0 as i64, r.y1 as i64 - 1) as usize - r.y0) * iw..][..iw];
        texels.extend((0..st.w as i64).map(|x| row[(st.x0 + x).clamp(r.x0 as i64, r.x1 as i64 - 1) as usize - r.x0]));
    }
}

/// Makes `rows` hold `len` values at least, keeping what an earlier strip left: the first pass
/// writes every value of a strip's columns before the second reads it; the padding past a
/// strip's last column is read only into lanes that are not written out. (Clearing them cost a
/// fill of the planes, about 1.5 MB, per 512 crop.)
fn grow(rows: &mut Vec<f32>, len: usize) {
    if rows.len() < len {
        rows.resize(len, 0.0);
    }
}

/// Values a row of the first pass's planes holds for `n` crop columns: room for whole
/// eight-lane loads.
fn stride(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Four texels weighted by `w`: products and sums in one order at every CPU level (no fused
/// operation; [`TwoPass::first_pass_avx2`]'s), so every level gives the same crop.
#[inline(always)]
fn taps4(t: &[f32x4; 4], w: [f32; 4]) -> f32x4 {
    // The even taps' sum and the odd taps', as the eight-lane form pairs them.
    (t[0] * f32x4::splat(w[0]) + t[2] * f32x4::splat(w[2])) + (t[1] * f32x4::splat(w[1]) + t[3] * f32x4::splat(w[3]))
}

/// The floors of the least and greatest of `v`, or `None` for a value out of reach.
fn extent(v: &[f64; 4]) -> Option<(i64, i64)> {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min).floor();
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max).floor();
    (lo.is_finite() && hi.is_finite() && lo.abs() < 1e9 && hi.abs() < 1e9).then_some((lo as i64, hi as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geom::{crop_footprint, similarity};
    use crate::kernels::warp::{warp_face, warp_to_tensor, WarpScratch};

    /// The set-up's public-domain portrait as packed RGB24.
    fn portrait() -> (Vec<u8>, usize, usize) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/astronaut.png");
        let img = image::open(&path)
            .expect("the set-up's samples/astronaut.png")
            .to_rgb8();
        let (w, h) = (img.width() as usize, img.height() as usize);
        (img.into_raw(), w, h)
    }

    /// The face of the portrait into a `size` crop, 2.2 crop pixels a frame pixel, turned by
    /// `degrees` about the frame's corner.
    fn face(degrees: f64) -> Affine {
        similarity(degrees.to_radians(), 2.2, -2.2 * 170.0, -2.2 * 90.0)
    }

    /// The largest difference in levels and the PSNR of `a` against `b`.
    fn apart(a: &[u8], b: &[u8]) -> (u8, f64) {
        let max = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0);
        let mse = a
            .iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
            .sum::<f64>()
            / a.len() as f64;
        (max, 10.0 * (255.0f64.powi(2) / mse.max(1e-12)).log10())
    }

    /// The crop of `to_crop` warped by the clamped sampler (the direct warp, pixel by pixel),
    /// and by `warp_face` at every CPU level this machine runs.
    fn crops(img: &[u8], (w, h): (usize, usize), to_crop: &Affine, size: usize) -> (Vec<u8>, Vec<(Cpu, Vec<u8>)>) {
        let mut direct = vec![0u8; 3 * size * size];
        warp_to_tensor(img, w, h, to_crop, size, &mut direct[..]);
        let region = crop_footprint(to_crop, size, w, h);
        let at = |cpu: Cpu| {
            let mut crop = vec![0u8; 3 * size * size];
            let scratch = &mut WarpScratch::at(cpu);
            warp_face(img, (w, h), to_crop, region, size, &mut crop[..], scratch);
            (cpu, crop)
        };
        (direct, Cpu::available().into_iter().map(at).collect())
    }

    /// A face turned by five degrees or less is warped in two passes, inside the frame or
    /// across its edges: its crop is the direct warp's within a rounding at no turn and within a
    /// few levels at five degrees (the sheared kernel), and the same to the bit at every CPU
    /// level.
    #[test]
    fn two_passes_give_the_direct_crop_within_a_few_levels_up_to_five_degrees() {
        let (img, w, h) = portrait();
        let size = 256;
        let wf = w as f64;
        let cases = [
            (face(0.0), 0.0, 1, 80.0),
            (face(-2.0), -2.0, 3, 58.0),
            (face(3.0), 3.0, 4, 56.0),
            (face(-5.0), -5.0, 5, 55.0),
            // Half off the frame's left edge; past its right edge, turned.
            (similarity(0.0, 2.2, 2.2 * 50.0, -2.2 * 90.0), 0.0, 1, 80.0),
            (similarity(0.0, 2.0, -2.0 * (wf - 60.0), -2.0 * 200.0), 0.0, 1, 80.0),
            (
                similarity((-3.0f64).to_radians(), 2.0, -2.0 * (wf - 60.0), -2.0 * 200.0),
                -3.0,
                4,
                56.0,
            ),
        ];
        for (to_crop, degrees, most, psnr) in cases {
            let inv = to_crop.inverse().expect("a similarity");
            assert!(TwoPass::plan(&inv, size, (w, h)).is_some(), "{to_crop:?}: two passes");
            let (direct, crops) = crops(&img, (w, h), &to_crop, size);
            for (cpu, crop) in &crops {
                let (max, db) = apart(crop, &direct);
                assert!(
                    max <= most && db >= psnr,
                    "{to_crop:?}, {}: {max} levels, {db:.1} dB",
                    cpu.name()
                );
                // A turned face's kernel is sheared: not the direct crop (which it would be,
                // were the two passes not taken).
                assert!(degrees == 0.0 || max > 0, "{to_crop:?}: the direct crop");
                assert!(
                    crop == &crops[0].1,
                    "{to_crop:?}: {} differs from the first level",
                    cpu.name()
                );
            }
        }
    }

    /// A face turned further, or whose crop reaches past the frame's top or bottom row, is
    /// warped directly: the clamped sampler's crop to the bit.
    #[test]
    fn a_face_turned_further_or_past_the_top_or_bottom_is_warped_directly() {
        let (img, w, h) = portrait();
        let size = 256;
        let (wf, hf) = (w as f64, h as f64);
        let cases = [
            face(6.0),
            face(-20.0),
            similarity(3.0, 2.2, 700.0, 600.0),
            similarity(0.0, 2.0, -2.0 * 200.0, -2.0 * (hf - 70.0)),
            similarity((-3.0f64).to_radians(), 2.0, -2.0 * (wf - 60.0), -2.0 * (hf - 70.0)),
            similarity(0.0, 2.2, -2.2 * 100.0, 2.2 * 10.0),
        ];
        for to_crop in cases {
            let inv = to_crop.inverse().expect("a similarity");
            assert!(TwoPass::plan(&inv, size, (w, h)).is_none(), "{to_crop:?}: direct");
            let (direct, crops) = crops(&img, (w, h), &to_crop, size);
            for (cpu, crop) in crops {
                assert!(crop == direct, "{to_crop:?}, {}: the direct crop", cpu.name());
            }
        }
    }
}
