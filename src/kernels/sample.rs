//! Samplers of packed three-channel pictures: in, a picture (RGB24 bytes, or a change in
//! floats or steps) and a point; out, its bilinear or bicubic (Catmull-Rom) value, one point or
//! four at a time, with the weights they share.

use wide::f32x4;

/// Bilinear sample of packed RGB24 at (x, y), edges replicated. Returns the three channels.
#[inline]
#[cfg(test)]
pub(crate) fn sample_rgb(rgb: &[u8], width: usize, height: usize, x: f64, y: f64) -> [f32; 3] {
    sample_rgb_f32(rgb, width, height, x as f32, y as f32)
}

/// A bilinear sample in f32, the form the per-pixel loops use.
#[inline(always)]
pub(crate) fn sample_rgb_f32(rgb: &[u8], width: usize, height: usize, x: f32, y: f32) -> [f32; 3] {
    let xf = x.clamp(0.0, (width - 1) as f32);
    let yf = y.clamp(0.0, (height - 1) as f32);
    // Non-negative after the clamp, so truncation is floor.
    let (x0, y0) = (xf as usize, yf as usize);
    let dx = if x0 + 1 < width { 3 } else { 0 };
    let dy = if y0 + 1 < height { width * 3 } else { 0 };
    let (fx, fy) = (xf - x0 as f32, yf - y0 as f32);
    let i = (y0 * width + x0) * 3;
    let (a, b) = (&rgb[i..i + 3], &rgb[i + dx..i + dx + 3]);
    let (c, d) = (&rgb[i + dy..i + dy + 3], &rgb[i + dy + dx..i + dy + dx + 3]);
    let mut out = [0.0; 3];
    for k in 0..3 {
        let top = a[k] as f32 + (b[k] as f32 - a[k] as f32) * fx;
        let bottom = c[k] as f32 + (d[k] as f32 - c[k] as f32) * fx;
        out[k] = top + (bottom - top) * fy;
    }
    out
}

/// Catmull-Rom weights of the four samples around a point `t` past the second one (0 <= t < 1).
#[inline(always)]
pub(crate) fn cubic_weights(t: f32) -> [f32; 4] {
    let (t2, t3) = (t * t, t * t * t);
    [
        0.5 * (-t3 + 2.0 * t2 - t),
        0.5 * (3.0 * t3 - 5.0 * t2 + 2.0),
        0.5 * (-3.0 * t3 + 4.0 * t2 + t),
        0.5 * (t3 - t2),
    ]
}

/// Bicubic (Catmull-Rom) sample of packed RGB24 at (x, y), edges replicated, clamped to
/// [0, 255], its taps summed in the crop warp's order ([`cubic_clamped_split`]). It passes a
/// picture's detail through a resampling nearly untouched where bilinear sampling halves it
/// between pixels, so a warp into the crop and back keeps what the model did not change; exact
/// at pixel centres.
#[inline(always)]
pub(crate) fn sample_rgb_cubic_f32(rgb: &[u8], width: usize, height: usize, x: f32, y: f32) -> [f32; 3] {
    cubic_clamped_split((width, height), x, y, |xx, yy| {
        let p = &rgb[(yy * width + xx) * 3..][..3];
        [p[0].into(), p[1].into(), p[2].into()]
    })
    .map(|v| v.clamp(0.0, 255.0))
}

/// Bicubic (Catmull-Rom) sample of any packed three-channel picture (RGB24, or a signed
/// change field in f32) at (x, y), edges replicated, not clamped.
#[inline(always)]
pub(crate) fn sample_cubic3<T: Copy + Into<f32>>(px: &[T], width: usize, height: usize, x: f32, y: f32) -> [f32; 3] {
    cubic_clamped((width, height), x, y, |xx, yy| {
        let p = &px[(yy * width + xx) * 3..][..3];
        [p[0].into(), p[1].into(), p[2].into()]
    })
}

/// The bicubic sum at (x, y) of a `width x height` picture whose pixel (x, y) `tap` reads, the
/// point and the 4 x 4 neighbourhood clamped to the picture (edges replicated): the one body
/// of the clamped samplers over packed pixels ([`sample_cubic3`], the paste's), so they give
/// the same sums in the same order as [`cubic3_taps`]. Each row's taps in turn, then the rows.
#[inline(always)]
pub(crate) fn cubic_clamped(size: (usize, usize), x: f32, y: f32, tap: impl Fn(usize, usize) -> [f32; 3]) -> [f32; 3] {
    let (xs, ys, wx, wy) = clamped_taps(size, x, y);
    let mut out = [0.0f32; 3];
    for (&yy, &wj) in ys.iter().zip(&wy) {
        let mut acc = [0.0f32; 3];
        for (&xx, &wi) in xs.iter().zip(&wx) {
            let p = tap(xx, yy);
            for c in 0..3 {
                acc[c] += wi * p[c];
            }
        }
        for c in 0..3 {
            out[c] += wj * acc[c];
        }
    }
    out
}

/// [`cubic_clamped`]'s sum in the crop warp's order, which eight lanes add two taps at a time,
/// with fused multiply-adds (one rounding each, IEEE's `fma`): each row's even taps
/// (`fma(t2, w2, t0 w0)`) and odd taps (`fma(t3, w3, t1 w1)`), each pair weighted by its row and
/// added down the rows (`fma(pair, wy, sum)`), then the two sums added. The warp's samplers
/// over texels (the plain and the AVX2+FMA taps, the clamped one at the frame's edge) and
/// [`sample_rgb_cubic_f32`] all compute this, so each gives the others' value to the bit
/// (`f32::mul_add` is the fused operation on every CPU: one instruction where it has FMA, the
/// C library's `fmaf` elsewhere).
#[inline(always)]
pub(crate) fn cubic_clamped_split(
    size: (usize, usize),
    x: f32,
    y: f32,
    tap: impl Fn(usize, usize) -> [f32; 3],
) -> [f32; 3] {
    let (xs, ys, wx, wy) = clamped_taps(size, x, y);
    let (mut even, mut odd) = ([0.0f32; 3], [0.0f32; 3]);
    for (&yy, &wj) in ys.iter().zip(&wy) {
        let t = xs.map(|xx| tap(xx, yy));
        for c in 0..3 {
            let e = t[2][c].mul_add(wx[2], t[0][c] * wx[0]);
            let o = t[3][c].mul_add(wx[3], t[1][c] * wx[1]);
            even[c] = e.mul_add(wj, even[c]);
            odd[c] = o.mul_add(wj, odd[c]);
        }
    }
    [0, 1, 2].map(|c| even[c] + odd[c])
}

/// The clamped samplers' neighbourhood of (x, y): its columns and rows (edges replicated) and
/// their weights.
#[inline(always)]
fn clamped_taps((width, height): (usize, usize), x: f32, y: f32) -> ([usize; 4], [usize; 4], [f32; 4], [f32; 4]) {
    let xf = x.clamp(0.0, (width - 1) as f32);
    let yf = y.clamp(0.0, (height - 1) as f32);
    // Non-negative after the clamp, so truncation is floor.
    let (x0, y0) = (xf as usize, yf as usize);
    let (wx, wy) = (cubic_weights(xf - x0 as f32), cubic_weights(yf - y0 as f32));
    let around = |v: usize, n: usize| [v.saturating_sub(1), v, (v + 1).min(n - 1), (v + 2).min(n - 1)];
    (around(x0, width), around(y0, height), wx, wy)
}

/// Whether [`cubic3_taps`] may read the neighbourhood of (x, y) in a packed three-channel
/// picture of `width x height`: inside it with a pixel to spare on the right (the paste tests
/// it four points at a time, in the same terms).
#[cfg(test)]
pub(crate) fn cubic3_inside(width: usize, height: usize, x: f32, y: f32) -> bool {
    x >= 1.0 && y >= 1.0 && x < width as f32 - 3.0 && y < height as f32 - 2.0
}

/// The bicubic sum of [`sample_cubic3`] over the 4 x 4 neighbourhood of pixel (x0, y0) of a
/// packed three-channel picture `width` wide (floats, or a change in steps), with the weights `wx` along a row and `wy`
/// down the rows (the same order of operations, so the same value; lane 3 is junk). Each tap is
/// one four-lane load: see [`cubic3_inside`].
#[inline(always)]
pub(crate) fn cubic3_taps<T: Tap>(
    px: &[T],
    width: usize,
    (x0, y0): (usize, usize),
    wx: [f32; 4],
    wy: [f32; 4],
) -> f32x4 {
    let wx = wx.map(f32x4::splat);
    let row = width * 3;
    let base = (y0 - 1) * row + (x0 - 1) * 3;
    let mut out = f32x4::ZERO;
    for (j, &wj) in wy.iter().enumerate() {
        let p: &[T; 13] = px[base + j * row..][..13].try_into().expect("13 values");
        let mut acc = f32x4::ZERO;
        for (i, &wi) in wx.iter().enumerate() {
            // Each tap's four values loaded and converted at once (one instruction for a
            // change in steps on a CPU with SSE4.1).
            let t: &[T; 4] = p[3 * i..3 * i + 4].try_into().expect("4 values");
            acc += T::four(t) * wi;
        }
        out += acc * f32x4::splat(wj);
    }
    out
}

/// A value of a picture the bicubic taps read: four of them as four float lanes.
pub(crate) trait Tap: Copy + Into<f32> {
    fn four(v: &[Self; 4]) -> f32x4;
}

impl Tap for f32 {
    #[inline(always)]
    fn four(v: &[f32; 4]) -> f32x4 {
        f32x4::new(*v)
    }
}

impl Tap for i16 {
    /// Loaded as one 64-bit word and widened in vector registers (SSE2: every x86-64 CPU has
    /// it), where converting value by value costs more than the tap's arithmetic.
    #[inline(always)]
    fn four(v: &[i16; 4]) -> f32x4 {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            // SAFETY: SSE2 is part of x86-64; the load reads the four values' eight bytes (an
            // unaligned 64-bit load), and f32x4 is four f32 lanes like __m128 (both plain data
            // of 16 bytes).
            unsafe {
                let w = _mm_loadl_epi64(v.as_ptr().cast());
                let wide = _mm_srai_epi32::<16>(_mm_unpacklo_epi16(w, w));
                std::mem::transmute::<__m128, f32x4>(_mm_cvtepi32_ps(wide))
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        f32x4::new(v.map(f32::from))
    }
}

/// [`cubic_weights`] of four points at once (the same operations lane by lane).
#[inline(always)]
pub(crate) fn cubic_weights4(t: f32x4) -> [f32x4; 4] {
    let (t2, t3) = (t * t, t * t * t);
    let (half, two, three) = (f32x4::splat(0.5), f32x4::splat(2.0), f32x4::splat(3.0));
    [
        half * (-t3 + two * t2 - t),
        half * (three * t3 - f32x4::splat(5.0) * t2 + two),
        half * (-three * t3 + f32x4::splat(4.0) * t2 + t),
        half * (t3 - t2),
    ]
}
