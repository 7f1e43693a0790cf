//! Warps into a square crop: in, a packed RGB24 picture (or a loader of its texels), the
//! picture -> crop affine and the crop's size; out, the crop as planar RGB (model floats in
//! [-1, 1] or bytes), sampled bicubically, or through an area filter over box-filtered levels
//! for a picture region larger than the crop. By tiles of the crop for a large region, with the
//! taps two texels per eight-lane AVX2+FMA step at a [`Cpu`] that has it (the same fused sums as
//! the plain body, to the bit).

use wide::f32x4;

use crate::geom::{Affine, Rect};
use crate::kernels::crop::CropOut;
use crate::kernels::sample::{cubic_clamped_split, cubic_weights4, sample_rgb_cubic_f32, sample_rgb_f32};
use crate::kernels::twopass::TwoPass;
use crate::kernels::Cpu;

/// Frame pixels per crop pixel from which the warp filters first (below it, one bilinear
/// sample per crop pixel reads every frame pixel at least once).
pub(crate) const PREFILTER_RATIO: f64 = 1.5;

/// Warps the face into a `size x size` crop, written as planar RGB in [-1, 1] (one NCHW item,
/// `3 * size * size` floats), sampled bicubically. `to_crop` maps frame pixels to crop pixels.
/// Every sample is clamped (the plain form, for a face whose footprint misses the frame; the
/// fast paths of [`warp_face`] give the same crop and are tested against it).
pub fn warp_to_tensor<O: CropOut + ?Sized>(
    rgb: &[u8],
    width: usize,
    height: usize,
    to_crop: &Affine,
    size: usize,
    out: &mut O,
) {
    let inv = to_crop.inverse().unwrap_or(Affine::IDENTITY);
    let mut row = CropRow::new(&inv);
    for y in 0..size {
        row.start(y);
        for x in 0..size {
            let (fx, fy) = row.point(x);
            out.put(y * size + x, sample_rgb_cubic_f32(rgb, width, height, fx, fy));
        }
    }
}

/// Reusable buffers of the warp: box-filtered levels of the frame region under a large face,
/// and the region under a face as four f32 lanes per pixel; and the CPU level its taps run at.
pub struct WarpScratch {
    levels: Vec<Vec<u8>>,
    texels: Vec<f32x4>,
    inner: Vec<f32x4>,
    rows: Vec<f32>,
    cpu: Cpu,
}

impl WarpScratch {
    /// The CPU level its warps run at.
    pub fn cpu(&self) -> Cpu {
        self.cpu
    }

    /// Buffers for warps whose taps run at `cpu` (the run's level: see `crate::kernels::cpu`).
    pub fn at(cpu: Cpu) -> WarpScratch {
        WarpScratch {
            levels: Vec::new(),
            texels: Vec::new(),
            inner: Vec::new(),
            rows: Vec::new(),
            cpu,
        }
    }
}

/// Copies the `r` region of packed RGB24 `width` wide into `out` as (R, G, B, 0) in f32, row
/// by row: what the bicubic warp reads, converted once per pixel instead of once per tap.
pub(crate) fn load_texels(rgb: &[u8], width: usize, r: Rect, out: &mut Vec<f32x4>) {
    let w = r.width();
    out.clear();
    out.resize(w * r.height(), f32x4::ZERO);
    for (y, dst) in (r.y0..r.y1).zip(out.chunks_exact_mut(w)) {
        let src = &rgb[(y * width + r.x0) * 3..][..w * 3];
        for (d, p) in dst.iter_mut().zip(src.chunks_exact(3)) {
            *d = f32x4::new([p[0] as f32, p[1] as f32, p[2] as f32, 0.0]);
        }
    }
}

/// [`warp_to_tensor`] for a face whose crop covers `region` of the frame (its footprint, where
/// `rgb` holds the picture with two pixels to spare): see [`warp_cubic_loading`].
pub(crate) fn warp_cubic<O: CropOut + ?Sized>(
    rgb: &[u8],
    (width, height): (usize, usize),
    to_crop: &Affine,
    region: Rect,
    size: usize,
    out: &mut O,
    scratch: &mut WarpScratch,
) {
    let mut load = |r: Rect, t: &mut Vec<f32x4>| load_texels(rgb, width, r, t);
    warp_cubic_loading(&mut load, (width, height), to_crop, region, size, out, scratch);
}

/// [`warp_to_tensor`] for a face whose crop covers `region` of a `width x height` frame:
/// `load` fills the texels of a rectangle of the frame (row by row, R, G, B, 0 in f32; from
/// the RGB picture, or straight from the decoded planes), once per face for the region grown
/// by two pixels, then sampled by [`warp_cubic_plain`].
pub(crate) fn warp_cubic_loading<O: CropOut + ?Sized>(
    load: &mut dyn FnMut(Rect, &mut Vec<f32x4>),
    frame: (usize, usize),
    to_crop: &Affine,
    region: Rect,
    size: usize,
    out: &mut O,
    scratch: &mut WarpScratch,
) {
    let r = texel_rect(region, frame);
    let inv = to_crop.inverse().unwrap_or(Affine::IDENTITY);
    if let Some(two) = TwoPass::plan(&inv, size, frame) {
        let bufs = (&mut scratch.texels, &mut scratch.inner, &mut scratch.rows);
        return two.run(scratch.cpu, frame, load, bufs, out);
    }
    for (tile, t) in tiles(&inv, size, r, frame, 0.0) {
        scratch.texels.clear();
        load(t, &mut scratch.texels);
        warp_cubic_plain(scratch.cpu, (&scratch.texels, t), frame, &inv, size, tile, out);
    }
}

/// Crop pixels on a side of a tile of a warp that goes by tiles (see [`tiles`]).
const TILE: usize = 128;

/// Texels of a face from which its warp goes by tiles (2 MB of four-float texels: about what
/// a core's cache holds, where a large face's region is many times that).
const TILES_FROM: usize = 1 << 17;

/// A rectangle of crop pixels a warp writes in one go: rows `ys`, columns `xs` (starting at a
/// multiple of four).
pub(crate) struct Tile {
    ys: std::ops::Range<usize>,
    xs: std::ops::Range<usize>,
}

impl Tile {
    /// The whole crop.
    pub(crate) fn whole(size: usize) -> Self {
        Tile {
            ys: 0..size,
            xs: 0..size,
        }
    }
}

/// The parts of a warp of a `size` crop (crop -> frame map `inv`) over the texels of `r` on a
/// `width x height` frame: the whole crop over `r` for a face of few texels; for a larger one,
/// tiles of [`TILE`] crop pixels, each over the part of `r` its taps read (the frame points of
/// its corners, clamped to the frame as the clamped samplers clamp them, grown by the taps'
/// reach, `spread` frame pixels more and a margin for the points' rounding), so each tile's
/// texels are made and read while they are in the cache. Each tile's pixels read the same
/// texels as over the whole of `r`, and take the fast or the clamped taps as they would there:
/// the same crop.
pub(crate) fn tiles(
    inv: &Affine,
    size: usize,
    r: Rect,
    (width, height): (usize, usize),
    spread: f64,
) -> impl Iterator<Item = (Tile, Rect)> {
    let step = if r.width() * r.height() < TILES_FROM || size <= TILE {
        size
    } else {
        TILE
    };
    let (m, reach) = (inv.0, 4.0 + spread);
    let starts = move || (0..size).step_by(step);
    starts().flat_map(move |ty| {
        starts().map(move |tx| {
            let tile = Tile {
                ys: ty..(ty + step).min(size),
                xs: tx..(tx + step).min(size),
            };
            if step == size {
                return (tile, r);
            }
            // The tile's corners on the frame, clamped to it: their extremes bound its points.
            let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
            for y in [tile.ys.start, tile.ys.end - 1].map(|v| v as f64) {
                for x in [tile.xs.start, tile.xs.end - 1].map(|v| v as f64) {
                    let fx = (m[0] * x + m[1] * y + m[2]).clamp(0.0, (width - 1) as f64);
                    let fy = (m[3] * x + m[4] * y + m[5]).clamp(0.0, (height - 1) as f64);
                    (x0, x1, y0, y1) = (x0.min(fx), x1.max(fx), y0.min(fy), y1.max(fy));
                }
            }
            let lo = |v: f64, floor: usize| ((v - reach).floor().max(0.0) as usize).max(floor);
            let hi = |v: f64, ceil: usize| ((v + reach).ceil() as usize + 1).min(ceil);
            let t = Rect::new(lo(x0, r.x0), lo(y0, r.y0), hi(x1, r.x1), hi(y1, r.y1));
            // A tile whose taps fall outside `r` (none do) reads the whole of it.
            (tile, if t.x0 < t.x1 && t.y0 < t.y1 { t } else { r })
        })
    })
}

/// The texels a warp over `region` of a `frame`-sized picture reads: the region grown by the
/// bicubic's two pixels, on the frame.
pub(crate) fn texel_rect(region: Rect, (width, height): (usize, usize)) -> Rect {
    Rect::new(
        region.x0.saturating_sub(2),
        region.y0.saturating_sub(2),
        region.x1 + 2,
        region.y1 + 2,
    )
    .clip(width, height)
}

/// The plain bicubic over the texels of `r` (sixteen taps a crop pixel): the same fused sums in
/// the same order as [`cubic_clamped_split`], so the same crop as [`warp_to_tensor`], at every
/// level (the AVX2+FMA taps do each lane's products and sums in the plain order; the AVX2 level
/// without FMA takes the plain body, whose fused operations are the C library's there).
/// Samples at the frame's edge take a clamped sampler over the same texels.
pub(crate) fn warp_cubic_plain<O: CropOut + ?Sized>(
    cpu: Cpu,
    (tex, r): (&[f32x4], Rect),
    frame: (usize, usize),
    inv: &Affine,
    size: usize,
    tile: Tile,
    out: &mut O,
) {
    #[cfg(target_arch = "x86_64")]
    if cpu.fma() {
        // SAFETY: a `Cpu` says AVX2 and FMA only where this CPU has them (see
        // `crate::kernels::cpu`).
        unsafe { warp_cubic_avx2(tex, r, frame, inv, size, tile, out) };
        return;
    }
    warp_cubic_body::<O, false>(tex, r, frame, inv, size, tile, out);
}

/// [`warp_cubic_body`] compiled for AVX2 and FMA, its interior taps two rows at a time (and
/// the clamped sampler's fused operations single instructions).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn warp_cubic_avx2<O: CropOut + ?Sized>(
    tex: &[f32x4],
    r: Rect,
    frame: (usize, usize),
    inv: &Affine,
    size: usize,
    tile: Tile,
    out: &mut O,
) {
    warp_cubic_body::<O, true>(tex, r, frame, inv, size, tile, out);
}

/// The sixteen taps of an interior sample: texels `base ..= base + 3` of four rows `tw` apart,
/// weighted by `wx` along the row and `wy` across, as [`cubic_taps16`] adds them: a row's
/// texels 0 and 1 in one eight-lane product, 2 and 3 in another, their sum (the even taps' sum
/// in the low half, the odd taps' in the high) weighted by the row and added down the rows, the
/// halves added at the end. Each lane's products, fused multiply-adds and sums are the plain
/// taps' in their order, so the crop is the plain level's to the bit.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn paired_taps16(tex: &[f32x4], base: usize, tw: usize, wx: [f32; 4], wy: [f32; 4]) -> f32x4 {
    use std::arch::x86_64::*;
    let pair = |a: f32, b: f32| _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a));
    let (w01, w23) = (pair(wx[0], wx[1]), pair(wx[2], wx[3]));
    // One check for the sixteen taps (a check per row cost a twentieth of the warp).
    assert!(base + 3 * tw + 4 <= tex.len(), "taps inside the texels");
    let p0 = tex.as_ptr().cast::<f32>();
    let mut acc = _mm256_setzero_ps();
    for (j, &wj) in wy.iter().enumerate() {
        // SAFETY: row j's four texels (sixteen f32) start at texel base + j tw, and the last
        // row's end is inside `tex` (asserted above), so both eight-float loads are inside it.
        let (t01, t23) = unsafe {
            let p = p0.add((base + j * tw) * 4);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        };
        let r = _mm256_fmadd_ps(t23, w23, _mm256_mul_ps(t01, w01));
        acc = _mm256_fmadd_ps(r, _mm256_set1_ps(wj), acc);
    }
    let sum = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    // SAFETY: __m128 and f32x4 are both four f32 lanes (16 bytes of plain data).
    unsafe { std::mem::transmute::<__m128, f32x4>(sum) }
}

/// The body of [`warp_cubic_loading`]; `PAIRED` takes the interior taps through
/// [`paired_taps16`] (only from [`warp_cubic_avx2`], on a CPU that has AVX2 and FMA).
#[inline(always)]
pub(crate) fn warp_cubic_body<O: CropOut + ?Sized, const PAIRED: bool>(
    tex: &[f32x4],
    r: Rect,
    (width, height): (usize, usize),
    inv: &Affine,
    size: usize,
    Tile { ys, xs }: Tile,
    out: &mut O,
) {
    let (tw, th) = (r.width(), r.height());
    // Region coordinates at which all sixteen taps lie inside the texels.
    let (lo, lim_x, lim_y) = (
        f32x4::splat(1.0),
        f32x4::splat(tw as f32 - 2.0),
        f32x4::splat(th as f32 - 2.0),
    );
    let (ox, oy) = (f32x4::splat(r.x0 as f32), f32x4::splat(r.y0 as f32));
    let mut row = CropRow::new(inv);
    for y in ys {
        row.start(y);
        // Four crop pixels at a time: their source points, weights and whether they are inside
        // in one vector pass each, their taps one by one.
        for x4 in xs.clone().step_by(4) {
            let n = (xs.end - x4).min(4);
            let (vx, vy) = row.points(x4);
            let (lx, ly) = (vx - ox, vy - oy);
            let inside = (lx.simd_ge(lo) & ly.simd_ge(lo) & lx.simd_lt(lim_x) & ly.simd_lt(lim_y)).to_bitmask();
            // Positive where inside, so truncation is floor there; the other lanes take the
            // clamped sampler and their weights are not used.
            let (ix, iy) = (vx.trunc_int(), vy.trunc_int());
            let (wx, wy) = (
                cubic_weights4(vx - ix.round_float()).map(|w| w.to_array()),
                cubic_weights4(vy - iy.round_float()).map(|w| w.to_array()),
            );
            let (ix, iy) = (ix.to_array(), iy.to_array());
            let (fx, fy) = (vx.to_array(), vy.to_array());
            let mut px = [f32x4::ZERO; 4];
            for k in 0..n {
                px[k] = if inside & (1 << k) != 0 {
                    let base = (iy[k] as usize - 1 - r.y0) * tw + (ix[k] as usize - 1 - r.x0);
                    let wxk = [wx[0][k], wx[1][k], wx[2][k], wx[3][k]];
                    let wyk = [wy[0][k], wy[1][k], wy[2][k], wy[3][k]];
                    if PAIRED {
                        #[cfg(target_arch = "x86_64")]
                        {
                            // SAFETY: PAIRED is only set by `warp_cubic_avx2`, entered on a CPU
                            // with AVX2 and FMA.
                            unsafe { paired_taps16(tex, base, tw, wxk, wyk) }
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        unreachable!("paired taps are x86-64 only")
                    } else {
                        cubic_taps16(tex, base, tw, wxk, wyk)
                    }
                } else {
                    let [r, g, b] = cubic_texels_clamped(tex, r, (width, height), fx[k], fy[k]);
                    f32x4::new([r, g, b, 0.0])
                };
            }
            // The four pixels' channels side by side, clamped to the levels, out at once.
            // (The taps' sums are finite: the fast forms clamp as the IEEE ones do.)
            let [r, g, b, _] = f32x4::transpose(px).map(|v| v.fast_max(f32x4::ZERO).fast_min(f32x4::splat(255.0)));
            if n == 4 {
                out.put4(y * size + x4, [r, g, b]);
            } else {
                let [r, g, b] = [r, g, b].map(|v| v.to_array());
                for k in 0..n {
                    out.put(y * size + x4 + k, [r[k], g[k], b[k]]);
                }
            }
        }
    }
}

/// The sixteen taps of an interior sample in four lanes, in [`cubic_clamped_split`]'s order
/// (its fused multiply-adds lane by lane).
#[inline(always)]
fn cubic_taps16(tex: &[f32x4], base: usize, tw: usize, wx: [f32; 4], wy: [f32; 4]) -> f32x4 {
    let w = wx.map(f32x4::splat);
    let (mut even, mut odd) = (f32x4::ZERO, f32x4::ZERO);
    for (j, &wj) in wy.iter().enumerate() {
        let t: &[f32x4; 4] = tex[base + j * tw..][..4].try_into().expect("4 texels");
        let wj = f32x4::splat(wj);
        even = fused(fused(t[2], w[2], t[0] * w[0]), wj, even);
        odd = fused(fused(t[3], w[3], t[1] * w[1]), wj, odd);
    }
    even + odd
}

/// `a b + c` lane by lane, rounded once (`f32::mul_add`; `wide`'s own rounds twice on a build
/// without FMA).
#[inline(always)]
fn fused(a: f32x4, b: f32x4, c: f32x4) -> f32x4 {
    let (a, b, c) = (a.to_array(), b.to_array(), c.to_array());
    f32x4::new([0, 1, 2, 3].map(|k| a[k].mul_add(b[k], c[k])))
}

/// The frame points under a row of crop pixels, four at a time, in f32: the row's start in
/// f64, then `start + step * x` lane by lane, so the plain sampler and the fast paths read the
/// same points (a vector pass, where stepping one pixel at a time made a chain of additions and
/// a store the vector load had to wait for).
pub(crate) struct CropRow {
    m: [f64; 6],
    step: (f32x4, f32x4),
    start: (f32x4, f32x4),
}

impl CropRow {
    /// For the crop -> frame map `inv`.
    pub(crate) fn new(inv: &Affine) -> Self {
        let m = inv.0;
        CropRow {
            m,
            step: (f32x4::splat(m[0] as f32), f32x4::splat(m[3] as f32)),
            start: (f32x4::ZERO, f32x4::ZERO),
        }
    }

    /// Moves to crop row `y`.
    #[inline(always)]
    pub(crate) fn start(&mut self, y: usize) {
        let m = self.m;
        self.start = (
            f32x4::splat((m[1] * y as f64 + m[2]) as f32),
            f32x4::splat((m[4] * y as f64 + m[5]) as f32),
        );
    }

    /// The frame points of crop pixels `x4 .. x4 + 4` of the row.
    #[inline(always)]
    pub(crate) fn points(&self, x4: usize) -> (f32x4, f32x4) {
        let xs = f32x4::new([0.0, 1.0, 2.0, 3.0]) + f32x4::splat(x4 as f32);
        (self.start.0 + self.step.0 * xs, self.start.1 + self.step.1 * xs)
    }

    /// The frame point of crop pixel `x` of the row (the same value as its lane of
    /// [`CropRow::points`]).
    #[inline(always)]
    pub(crate) fn point(&self, x: usize) -> (f32, f32) {
        let (vx, vy) = self.points(x & !3);
        (vx.to_array()[x & 3], vy.to_array()[x & 3])
    }
}

/// [`sample_rgb_cubic_f32`] over the texels of rectangle `r` of a `width x height` frame: the
/// frame's edge is clamped as there (and a tap past `r` inside the frame, which the warp never
/// makes, reads `r`'s edge). Inlined, so its fused operations are one instruction each in the
/// AVX2+FMA body (a call of the C library's `fmaf` each in a function of its own).
#[inline(always)]
fn cubic_texels_clamped(tex: &[f32x4], r: Rect, (width, height): (usize, usize), x: f32, y: f32) -> [f32; 3] {
    let tw = r.width();
    let out = cubic_clamped_split((width, height), x, y, |xx, yy| {
        let (tx, ty) = (xx.clamp(r.x0, r.x1 - 1) - r.x0, yy.clamp(r.y0, r.y1 - 1) - r.y0);
        let p = tex[ty * tw + tx].to_array();
        [p[0], p[1], p[2]]
    });
    out.map(|v| v.clamp(0.0, 255.0))
}

/// Halves the `r` region of packed RGB24 `width` wide by 2x2 box averages (odd edges repeat
/// the region's last pixel).
pub(crate) fn halve_region(src: &[u8], width: usize, r: Rect, out: &mut Vec<u8>) -> (usize, usize) {
    let (w, h) = (r.width(), r.height());
    let (hw, hh) = (w.div_ceil(2).max(1), h.div_ceil(2).max(1));
    out.clear();
    out.resize(hw * hh * 3, 0);
    // Pairs of whole pixels along a row; an odd last column repeats its pixel.
    let pairs = w / 2;
    for (y, dst) in out.chunks_exact_mut(hw * 3).enumerate() {
        let (ya, yb) = (r.y0 + (2 * y).min(h - 1), r.y0 + (2 * y + 1).min(h - 1));
        let a = &src[(ya * width + r.x0) * 3..][..w * 3];
        let b = &src[(yb * width + r.x0) * 3..][..w * 3];
        for ((d, pa), pb) in dst
            .chunks_exact_mut(3)
            .zip(a.chunks_exact(6))
            .zip(b.chunks_exact(6))
            .take(pairs)
        {
            for c in 0..3 {
                let s = pa[c] as u32 + pa[c + 3] as u32 + pb[c] as u32 + pb[c + 3] as u32;
                d[c] = ((s + 2) / 4) as u8;
            }
        }
        if pairs < hw {
            let x = w - 1;
            for c in 0..3 {
                let s = 2 * (a[3 * x + c] as u32 + b[3 * x + c] as u32);
                dst[3 * pairs + c] = ((s + 2) / 4) as u8;
            }
        }
    }
    (hw, hh)
}

/// Whether [`warp_face`] reads a face aligned by `to_crop` through the area filter (a face
/// larger than the crop by [`PREFILTER_RATIO`] or more) rather than bicubically.
pub(crate) fn filtered(to_crop: &Affine) -> bool {
    1.0 / to_crop.scale() >= PREFILTER_RATIO
}

/// Warps the face into the crop as [`warp_to_tensor`] does; a face larger than the crop by
/// [`PREFILTER_RATIO`] or more is read from the mip level of the frame `region` (the crop's
/// footprint, where `rgb` holds the picture) that one crop pixel spans, by four bilinear taps
/// spread over the crop pixel's footprint (an area average, not a point sample).
pub fn warp_face<O: CropOut + ?Sized>(
    rgb: &[u8],
    (width, height): (usize, usize),
    to_crop: &Affine,
    region: Option<Rect>,
    size: usize,
    out: &mut O,
    scratch: &mut WarpScratch,
) {
    let ratio = 1.0 / to_crop.scale();
    let Some(r) = region.filter(|r| !r.is_empty()) else {
        return warp_to_tensor(rgb, width, height, to_crop, size, out);
    };
    if ratio < PREFILTER_RATIO {
        return warp_cubic(rgb, (width, height), to_crop, r, size, out, scratch);
    }
    let level = mip_level(ratio, 6) as usize;
    if level == 0 {
        let mut load = |t: Rect, texels: &mut Vec<f32x4>| load_texels(rgb, width, t, texels);
        return warp_area_loading(&mut load, (width, height), to_crop, r, size, out, scratch);
    }
    let levels = &mut scratch.levels;
    while levels.len() < level {
        levels.push(Vec::new());
    }
    let (mut lw, mut lh) = (width, height);
    for l in 0..level {
        let (done, rest) = levels.split_at_mut(l);
        (lw, lh) = if l == 0 {
            halve_region(rgb, width, r, &mut rest[0])
        } else {
            halve_region(&done[l - 1], lw, Rect::new(0, 0, lw, lh), &mut rest[0])
        };
    }
    let src: &[u8] = &levels[level - 1];
    // Level pixel j covers frame pixels [o + j k, o + (j + 1) k): its centre is o + j k + (k - 1) / 2.
    let k = (1usize << level) as f64;
    let (ox, oy) = (r.x0 as f64 + (k - 1.0) / 2.0, r.y0 as f64 + (k - 1.0) / 2.0);
    let inv = to_crop.inverse().unwrap_or(Affine::IDENTITY);
    // Crop -> level coordinates.
    let m = Affine([
        inv.0[0] / k,
        inv.0[1] / k,
        (inv.0[2] - ox) / k,
        inv.0[3] / k,
        inv.0[4] / k,
        (inv.0[5] - oy) / k,
    ]);
    // The level's pixels under the face are read as f32 texels.
    let t = Rect::new(0, 0, lw, lh);
    load_texels(src, lw, t, &mut scratch.texels);
    area_taps(&scratch.texels, t, &m, size, Tile::whole(size), out, |x, y| {
        sample_rgb_f32(src, lw, lh, x, y)
    });
}

/// [`warp_face`] of a face larger than the crop whose crop pixels span less than two frame
/// pixels (mip level 0): the frame region `region` grown by two pixels is loaded by `load`
/// as texels (from the RGB picture, or straight from the decoded planes), and taps at the
/// frame's edge are clamped over them, the bilinear [`sample_rgb_f32`] gives there.
pub(crate) fn warp_area_loading<O: CropOut + ?Sized>(
    load: &mut dyn FnMut(Rect, &mut Vec<f32x4>),
    (width, height): (usize, usize),
    to_crop: &Affine,
    region: Rect,
    size: usize,
    out: &mut O,
    scratch: &mut WarpScratch,
) {
    let r = texel_rect(region, (width, height));
    let inv = to_crop.inverse().unwrap_or(Affine::IDENTITY);
    // The four taps spread a quarter of a crop pixel from its point along each crop axis.
    let m = inv.0;
    let spread = 0.25 * (m[0].abs() + m[1].abs() + m[3].abs() + m[4].abs());
    for (tile, t) in tiles(&inv, size, r, (width, height), spread) {
        scratch.texels.clear();
        load(t, &mut scratch.texels);
        let tex = &scratch.texels[..];
        area_taps(tex, t, &inv, size, tile, out, |x, y| {
            bilinear_texels_clamped(tex, t, (width, height), x, y)
        });
    }
}

/// [`sample_rgb_f32`] over the texels of rectangle `t` of a `width x height` picture, which
/// holds every pixel it reads (a rectangle reaching the picture's edge where the point is
/// clamped to it): the same sums on the same levels.
pub(crate) fn bilinear_texels_clamped(
    tex: &[f32x4],
    t: Rect,
    (width, height): (usize, usize),
    x: f32,
    y: f32,
) -> [f32; 3] {
    let xf = x.clamp(0.0, (width - 1) as f32);
    let yf = y.clamp(0.0, (height - 1) as f32);
    // Non-negative after the clamp, so truncation is floor.
    let (x0, y0) = (xf as usize, yf as usize);
    let (x1, y1) = ((x0 + 1).min(width - 1), (y0 + 1).min(height - 1));
    let (fx, fy) = (xf - x0 as f32, yf - y0 as f32);
    let tw = t.width();
    let at =
        |x: usize, y: usize| tex[(y.clamp(t.y0, t.y1 - 1) - t.y0) * tw + x.clamp(t.x0, t.x1 - 1) - t.x0].to_array();
    let (a, b, c, d) = (at(x0, y0), at(x1, y0), at(x0, y1), at(x1, y1));
    let mut out = [0.0; 3];
    for k in 0..3 {
        let top = a[k] + (b[k] - a[k]) * fx;
        let bottom = c[k] + (d[k] - c[k]) * fx;
        out[k] = top + (bottom - top) * fy;
    }
    out
}

/// The area filter's taps: each crop pixel the mean of four bilinear taps a quarter of a crop
/// pixel from its centre along each crop axis, in the picture (frame or mip level) `m` maps the
/// crop into, read from the texels of its rectangle `t`; a tap whose four pixels are not all
/// in `t` takes `outside`.
pub(crate) fn area_taps<O: CropOut + ?Sized>(
    tex: &[f32x4],
    t: Rect,
    m: &Affine,
    size: usize,
    Tile { ys, xs }: Tile,
    out: &mut O,
    outside: impl Fn(f32, f32) -> [f32; 3],
) {
    let m = m.0;
    let taps = [(-0.25, -0.25), (0.25, -0.25), (-0.25, 0.25), (0.25, 0.25)]
        .map(|(du, dv)| ((m[0] * du + m[1] * dv) as f32, (m[3] * du + m[4] * dv) as f32));
    let tw = t.width();
    let (t0x, t0y) = (f32x4::splat(t.x0 as f32), f32x4::splat(t.y0 as f32));
    let (lo, lim_x, lim_y) = (
        f32x4::ZERO,
        f32x4::splat(tw as f32 - 1.0),
        f32x4::splat(t.height() as f32 - 1.0),
    );
    let (dxs, dys) = (f32x4::new(taps.map(|t| t.0)), f32x4::new(taps.map(|t| t.1)));
    let mut row = CropRow::new(&Affine(m));
    for y in ys {
        row.start(y);
        for x4 in xs.clone().step_by(4) {
            let (vx, vy) = row.points(x4);
            let (vx, vy) = (vx.to_array(), vy.to_array());
            for k in 0..(xs.end - x4).min(4) {
                // The pixel's four taps, one per lane.
                let (px, py) = (f32x4::splat(vx[k]) + dxs, f32x4::splat(vy[k]) + dys);
                let (lx, ly) = (px - t0x, py - t0y);
                let inside = (lx.simd_ge(lo) & ly.simd_ge(lo) & lx.simd_lt(lim_x) & ly.simd_lt(lim_y)).to_bitmask();
                // Non-negative where inside, so truncation is floor there.
                let (ix, iy) = (px.trunc_int(), py.trunc_int());
                let (fx, fy) = ((px - ix.round_float()).to_array(), (py - iy.round_float()).to_array());
                let (ix, iy, pxa, pya) = (ix.to_array(), iy.to_array(), px.to_array(), py.to_array());
                let mut acc = f32x4::ZERO;
                for q in 0..4 {
                    acc += if inside & (1 << q) != 0 {
                        let i = (iy[q] as usize - t.y0) * tw + ix[q] as usize - t.x0;
                        let (a, b, c, d) = (tex[i], tex[i + 1], tex[i + tw], tex[i + tw + 1]);
                        let (fx, fy) = (f32x4::splat(fx[q]), f32x4::splat(fy[q]));
                        let top = a + (b - a) * fx;
                        let bottom = c + (d - c) * fx;
                        top + (bottom - top) * fy
                    } else {
                        let p = outside(pxa[q], pya[q]);
                        f32x4::new([p[0], p[1], p[2], 0.0])
                    };
                }
                let acc = (acc * f32x4::splat(0.25)).to_array();
                out.put(y * size + x4 + k, [acc[0], acc[1], acc[2]]);
            }
        }
    }
}

/// The mip level to sample when one frame pixel covers `scale` crop pixels: the largest `k`
/// with `2^k <= scale` (0 for faces as large as the crop or larger), at most `max`.
pub(crate) fn mip_level(scale: f64, max: u32) -> u32 {
    if scale < 2.0 || !scale.is_finite() {
        0
    } else {
        (scale.log2().floor() as u32).min(max)
    }
}
