//! Face alignment: in, five landmarks and a frame; out, the similarity transform to the FFHQ
//! template and the warped crop as a normalised NCHW tensor slice.
//!
//! A face larger than the crop (each crop pixel covers several frame pixels) is sampled from a
//! box-filtered level of the frame region with four taps over each crop pixel's footprint, so
//! fine frame detail averages out instead of aliasing into the crop.

use wide::f32x4;

use crate::geom::{Affine, Rect};
use crate::kernels::change_steps;
use crate::kernels::Cpu;

/// Frame pixels per crop pixel from which the warp filters first (below it, one bilinear
/// sample per crop pixel reads every frame pixel at least once).
pub(crate) const PREFILTER_RATIO: f64 = 1.5;

/// The FFHQ five-point template, normalised to the crop size (x, y): left eye, right eye, nose,
/// left mouth corner, right mouth corner (as facexlib and facefusion use it).
pub(crate) const FFHQ_TEMPLATE: [[f64; 2]; 5] = [
    [0.376_916_76, 0.468_646_64],
    [0.622_856_97, 0.469_128_13],
    [0.501_238_6, 0.613_319_04],
    [0.393_088_22, 0.725_411],
    [0.611_502_05, 0.724_904_65],
];

/// The tighter arcface_128 template facefusion pairs with GPEN-BFR-256.
pub(crate) const ARCFACE_128_TEMPLATE: [[f64; 2]; 5] = [
    [0.361_676_56, 0.403_877_34],
    [0.636_967_19, 0.402_354_69],
    [0.500_196_87, 0.560_442_19],
    [0.387_103_91, 0.721_605_47],
    [0.615_077_34, 0.720_344_53],
];

/// The FFHQ template scaled to a crop of `size` pixels.
pub fn template(size: usize) -> [[f32; 2]; 5] {
    Template::Ffhq.points(size)
}

/// The five-point template a model was trained with: resolved once, from the model file's
/// `gpen_video.template` metadata or the registry, when the model is loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Template {
    /// FFHQ's (GPEN-BFR-512 and 1024, facexlib, facefusion).
    #[default]
    Ffhq,
    /// The tighter arcface_128 facefusion pairs with GPEN-BFR-256.
    Arcface128,
}

impl Template {
    /// Every template by its name, as model files and the registry write it.
    pub(crate) const NAMES: [(&'static str, Template); 2] =
        [("ffhq", Template::Ffhq), ("arcface_128", Template::Arcface128)];

    /// The template's points scaled to a crop of `size` pixels.
    pub fn points(self, size: usize) -> [[f32; 2]; 5] {
        let t = match self {
            Template::Ffhq => FFHQ_TEMPLATE,
            Template::Arcface128 => ARCFACE_128_TEMPLATE,
        };
        t.map(|[x, y]| [(x * size as f64) as f32, (y * size as f64) as f32])
    }

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, t)| *t == self).map_or("ffhq", |(n, _)| n)
    }
}

impl std::str::FromStr for Template {
    type Err = String;
    /// A template by name; an unknown name is an error naming the choices.
    fn from_str(s: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown alignment template `{s}` (the choices are {})",
                    names.join(", ")
                )
            })
    }
}

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
fn cubic_weights(t: f32) -> [f32; 4] {
    let (t2, t3) = (t * t, t * t * t);
    [
        0.5 * (-t3 + 2.0 * t2 - t),
        0.5 * (3.0 * t3 - 5.0 * t2 + 2.0),
        0.5 * (-3.0 * t3 + 4.0 * t2 + t),
        0.5 * (t3 - t2),
    ]
}

/// Bicubic (Catmull-Rom) sample of packed RGB24 at (x, y), edges replicated, clamped to
/// [0, 255]. It passes a picture's detail through a resampling nearly untouched where bilinear
/// sampling halves it between pixels, so a warp into the crop and back keeps what the model
/// did not change; exact at pixel centres.
#[inline(always)]
pub(crate) fn sample_rgb_cubic_f32(rgb: &[u8], width: usize, height: usize, x: f32, y: f32) -> [f32; 3] {
    sample_cubic3(rgb, width, height, x, y).map(|v| v.clamp(0.0, 255.0))
}

/// Bicubic (Catmull-Rom) sample of any packed three-channel picture (RGB24, or a signed
/// change field in f32) at (x, y), edges replicated, not clamped.
#[inline(always)]
pub(crate) fn sample_cubic3<T: Copy + Into<f32>>(px: &[T], width: usize, height: usize, x: f32, y: f32) -> [f32; 3] {
    let xf = x.clamp(0.0, (width - 1) as f32);
    let yf = y.clamp(0.0, (height - 1) as f32);
    // Non-negative after the clamp, so truncation is floor.
    let (x0, y0) = (xf as usize, yf as usize);
    let (wx, wy) = (cubic_weights(xf - x0 as f32), cubic_weights(yf - y0 as f32));
    let xs = [
        x0.saturating_sub(1),
        x0,
        (x0 + 1).min(width - 1),
        (x0 + 2).min(width - 1),
    ]
    .map(|x| x * 3);
    let ys = [
        y0.saturating_sub(1),
        y0,
        (y0 + 1).min(height - 1),
        (y0 + 2).min(height - 1),
    ];
    let mut out = [0.0f32; 3];
    for (&yy, &wj) in ys.iter().zip(&wy) {
        let row = &px[yy * width * 3..(yy + 1) * width * 3];
        let mut acc = [0.0f32; 3];
        for (&xx, &wi) in xs.iter().zip(&wx) {
            let p = &row[xx..xx + 3];
            for c in 0..3 {
                acc[c] += wi * p[c].into();
            }
        }
        for c in 0..3 {
            out[c] += wj * acc[c];
        }
    }
    out
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

/// Where a warp writes its crop: planar RGB, one plane after another (`size * size` values
/// each), a pixel `i` at a time as levels (0..=255).
pub trait CropOut {
    fn put(&mut self, i: usize, p: [f32; 3]);

    /// Four pixels `i .. i + 4` at once, levels already in 0..=255, one vector per channel:
    /// what four calls of [`CropOut::put`] write.
    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        let [r, g, b] = rgb.map(|v| v.to_array());
        for k in 0..4 {
            self.put(i + k, [r[k], g[k], b[k]]);
        }
    }
}

/// A model input item: planar RGB in [-1, 1] (one NCHW item of floats).
impl CropOut for [f32] {
    #[inline(always)]
    fn put(&mut self, i: usize, p: [f32; 3]) {
        const K: f32 = 1.0 / 127.5;
        let plane = self.len() / 3;
        self[i] = p[0] * K - 1.0;
        self[plane + i] = p[1] * K - 1.0;
        self[2 * plane + i] = p[2] * K - 1.0;
    }

    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        let (k, one) = (f32x4::splat(1.0 / 127.5), f32x4::splat(1.0));
        let plane = self.len() / 3;
        for (c, v) in rgb.into_iter().enumerate() {
            let at: &mut [f32; 4] = (&mut self[c * plane + i..][..4]).try_into().expect("4 values");
            *at = (v * k - one).to_array();
        }
    }
}

/// A crop in bytes: planar RGB24, each level rounded (half up) and clamped, what travels to the
/// model's worker (a quarter of the floats' size); [`crop_to_tensor`] makes the model's input.
impl CropOut for [u8] {
    #[inline(always)]
    fn put(&mut self, i: usize, p: [f32; 3]) {
        let plane = self.len() / 3;
        // Saturating casts: below zero gives 0, above 255 gives 255.
        self[i] = (p[0] + 0.5) as u8;
        self[plane + i] = (p[1] + 0.5) as u8;
        self[2 * plane + i] = (p[2] + 0.5) as u8;
    }

    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        let half = f32x4::splat(0.5);
        let plane = self.len() / 3;
        for (c, v) in rgb.into_iter().enumerate() {
            // In 0..=255.5 after the half, so truncation rounds half up as `put` does.
            let n = (v + half).fast_trunc_int();
            let at: &mut [u8; 4] = (&mut self[c * plane + i..][..4]).try_into().expect("4 bytes");
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::*;
                // SAFETY: SSE2 is part of x86-64; i32x4 is four i32 lanes like __m128i (both
                // plain data of 16 bytes). The lanes are 0..=255, so both packs keep them.
                let word = unsafe {
                    let n = std::mem::transmute::<wide::i32x4, __m128i>(n);
                    let bytes = _mm_packus_epi16(_mm_packs_epi32(n, n), _mm_setzero_si128());
                    _mm_cvtsi128_si32(bytes)
                };
                *at = word.to_le_bytes();
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                *at = n.to_array().map(|v| v as u8);
            }
        }
    }
}

/// A vector of either, as its slice.
impl<T> CropOut for Vec<T>
where
    [T]: CropOut,
{
    #[inline(always)]
    fn put(&mut self, i: usize, p: [f32; 3]) {
        self.as_mut_slice().put(i, p);
    }

    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        self.as_mut_slice().put4(i, rgb);
    }
}

/// The model's input (an NCHW item in [-1, 1]) from a crop in bytes: each level `b` as
/// `b / 127.5 - 1` (the value the float warp gives a whole level), eight at a time on a CPU
/// with AVX2.
pub fn crop_to_tensor(cpu: Cpu, crop: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { crop_to_tensor_avx2(crop, out) };
    }
    crop_to_tensor_body(crop, out);
}

/// [`crop_to_tensor_body`] compiled for AVX2 (the same values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn crop_to_tensor_avx2(crop: &[u8], out: &mut [f32]) {
    crop_to_tensor_body(crop, out);
}

/// The body of [`crop_to_tensor`].
#[inline(always)]
fn crop_to_tensor_body(crop: &[u8], out: &mut [f32]) {
    const K: f32 = 1.0 / 127.5;
    for (o, &b) in out.iter_mut().zip(crop) {
        *o = f32::from(b) * K - 1.0;
    }
}

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
#[derive(Default)]
pub struct WarpScratch {
    levels: Vec<Vec<u8>>,
    texels: Vec<f32x4>,
    cpu: Cpu,
}

impl WarpScratch {
    /// The CPU level its warps run at.
    pub fn cpu(&self) -> Cpu {
        self.cpu
    }

    /// Buffers for warps whose taps run at `cpu` (the default: the detected level).
    pub fn at(cpu: Cpu) -> WarpScratch {
        WarpScratch {
            cpu,
            ..WarpScratch::default()
        }
    }
}

/// Copies the `r` region of packed RGB24 `width` wide into `out` as (R, G, B, 0) in f32, row
/// by row: what the bicubic warp reads, converted once per pixel instead of once per tap.
fn load_texels(rgb: &[u8], width: usize, r: Rect, out: &mut Vec<f32x4>) {
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
fn tiles(
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
fn texel_rect(region: Rect, (width, height): (usize, usize)) -> Rect {
    Rect::new(
        region.x0.saturating_sub(2),
        region.y0.saturating_sub(2),
        region.x1 + 2,
        region.y1 + 2,
    )
    .clip(width, height)
}

/// The plain bicubic over the texels of `r` (sixteen taps a crop pixel): the same sums in the
/// same order as [`sample_cubic3`], so the same crop as [`warp_to_tensor`] (the fused taps
/// within a few float steps of it). Samples at the frame's edge take a clamped sampler over
/// the same texels.
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
        // SAFETY: a `Cpu` says AVX2 and FMA only where this CPU has them (see `crate::kernels::cpu`).
        unsafe { warp_cubic_fused(tex, r, frame, inv, size, tile, out) };
        return;
    }
    warp_cubic_body::<O, false>(tex, r, frame, inv, size, tile, out);
}

/// [`warp_cubic_body`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn warp_cubic_fused<O: CropOut + ?Sized>(
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
/// weighted by `wx` along the row and `wy` across, two texels per eight-lane fused multiply-add
/// (the same sums as [`cubic3_taps`] in another order: within a few float steps of it).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fused_taps16(tex: &[f32x4], base: usize, tw: usize, wx: [f32; 4], wy: [f32; 4]) -> f32x4 {
    use std::arch::x86_64::*;
    let pair = |a: f32, b: f32| _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a));
    let (w01, w23) = (pair(wx[0], wx[1]), pair(wx[2], wx[3]));
    let mut acc = _mm256_setzero_ps();
    for (j, &wj) in wy.iter().enumerate() {
        let row: &[f32x4; 4] = tex[base + j * tw..][..4].try_into().expect("4 texels");
        let p = row.as_ptr().cast::<f32>();
        // SAFETY: `row` is four texels of four f32 each, so both eight-float loads are inside it.
        let (t01, t23) = unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) };
        let r = _mm256_fmadd_ps(t01, w01, _mm256_mul_ps(t23, w23));
        acc = _mm256_fmadd_ps(r, _mm256_set1_ps(wj), acc);
    }
    let sum = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    // SAFETY: __m128 and f32x4 are both four f32 lanes (16 bytes of plain data).
    unsafe { std::mem::transmute::<__m128, f32x4>(sum) }
}

/// The body of [`warp_cubic_loading`]; `FUSED` takes the interior taps through
/// [`fused_taps16`] (only from [`warp_cubic_fused`], on a CPU that has them).
#[inline(always)]
fn warp_cubic_body<O: CropOut + ?Sized, const FUSED: bool>(
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
                    if FUSED {
                        #[cfg(target_arch = "x86_64")]
                        {
                            // SAFETY: FUSED is only set by `warp_cubic_fused`, entered on a CPU
                            // with AVX2 and FMA.
                            unsafe { fused_taps16(tex, base, tw, wxk, wyk) }
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        unreachable!("fused taps are x86-64 only")
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

/// The sixteen taps of an interior sample in four lanes, in [`sample_cubic3`]'s order.
#[inline(always)]
fn cubic_taps16(tex: &[f32x4], base: usize, tw: usize, wx: [f32; 4], wy: [f32; 4]) -> f32x4 {
    let wxk = wx.map(f32x4::splat);
    let mut acc_out = f32x4::ZERO;
    for (j, &wj) in wy.iter().enumerate() {
        let row: &[f32x4; 4] = tex[base + j * tw..][..4].try_into().expect("4 texels");
        let mut acc = f32x4::ZERO;
        for (&t, &wi) in row.iter().zip(&wxk) {
            acc += t * wi;
        }
        acc_out += acc * f32x4::splat(wj);
    }
    acc_out
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
/// makes, reads `r`'s edge).
fn cubic_texels_clamped(tex: &[f32x4], r: Rect, (width, height): (usize, usize), x: f32, y: f32) -> [f32; 3] {
    let xf = x.clamp(0.0, (width - 1) as f32);
    let yf = y.clamp(0.0, (height - 1) as f32);
    // Non-negative after the clamp, so truncation is floor.
    let (x0, y0) = (xf as usize, yf as usize);
    let (wx, wy) = (cubic_weights(xf - x0 as f32), cubic_weights(yf - y0 as f32));
    let xs = [
        x0.saturating_sub(1),
        x0,
        (x0 + 1).min(width - 1),
        (x0 + 2).min(width - 1),
    ]
    .map(|x| x.clamp(r.x0, r.x1 - 1) - r.x0);
    let ys = [
        y0.saturating_sub(1),
        y0,
        (y0 + 1).min(height - 1),
        (y0 + 2).min(height - 1),
    ]
    .map(|y| y.clamp(r.y0, r.y1 - 1) - r.y0);
    let tw = r.width();
    let mut out = [0.0f32; 3];
    for (&yy, &wj) in ys.iter().zip(&wy) {
        let mut acc = [0.0f32; 3];
        for (&xx, &wi) in xs.iter().zip(&wx) {
            let p = tex[yy * tw + xx].to_array();
            for c in 0..3 {
                acc[c] += wi * p[c];
            }
        }
        for c in 0..3 {
            out[c] += wj * acc[c];
        }
    }
    out.map(|v| v.clamp(0.0, 255.0))
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

/// Halves the `r` region of packed RGB24 `width` wide by 2x2 box averages (odd edges repeat
/// the region's last pixel).
fn halve_region(src: &[u8], width: usize, r: Rect, out: &mut Vec<u8>) -> (usize, usize) {
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
pub fn filtered(to_crop: &Affine) -> bool {
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
fn bilinear_texels_clamped(tex: &[f32x4], t: Rect, (width, height): (usize, usize), x: f32, y: f32) -> [f32; 3] {
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
fn area_taps<O: CropOut + ?Sized>(
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

/// Maps one NCHW item in [-1, 1] back to packed RGB24 with clamping and rounding (the tests'
/// view of a crop; the pipeline passes on [`tensor_change`]).
#[cfg(test)]
pub(crate) fn tensor_to_rgb(t: &[f32], size: usize, out: &mut Vec<u8>) {
    let plane = size * size;
    out.clear();
    out.reserve(plane * 3);
    let (r, g, b) = (&t[..plane], &t[plane..2 * plane], &t[2 * plane..3 * plane]);
    // Clamped to [0.5, 255.5) then truncated: round half up, without a libm call.
    let px = |v: f32| ((v + 1.0) * 127.5 + 0.5).clamp(0.0, 255.0) as u8;
    for i in 0..plane {
        out.extend_from_slice(&[px(r[i]), px(g[i]), px(b[i])]);
    }
}

/// What the model changed in one crop: `restored` (its output, an NCHW item in [-1, 1]) minus
/// `given` (its input, the crop in planar bytes), as packed RGB in steps of
/// [`CHANGE_STEPS`](crate::kernels::CHANGE_STEPS) (levels x 128), the output clamped to the
/// picture's range first. Zero where the model gave its input back. False when an output
/// value is not finite (a broken model, an overflow in fp16): `out` is then not a change.
pub(crate) fn tensor_change(cpu: Cpu, restored: &[f32], given: &[u8], size: usize, out: &mut Vec<i16>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { tensor_change_avx2(restored, given, size, out) };
    }
    tensor_change_body(restored, given, size, out)
}

/// [`tensor_change_body`] compiled for AVX2 (eight values a vector; the same values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tensor_change_avx2(restored: &[f32], given: &[u8], size: usize, out: &mut Vec<i16>) -> bool {
    tensor_change_body(restored, given, size, out)
}

/// The body of [`tensor_change`]: a run of 64 pixels at a time, each plane's values to steps
/// (loops the compiler turns into vector code, the finiteness check among them), then the
/// three planes' steps interleaved into pixels.
#[inline(always)]
fn tensor_change_body(restored: &[f32], given: &[u8], size: usize, out: &mut Vec<i16>) -> bool {
    const RUN: usize = 64;
    let plane = size * size;
    // Every value is written below: a buffer back from the pool at this size is not zeroed first.
    out.resize(plane * 3, 0);
    let (restored, given) = (&restored[..3 * plane], &given[..3 * plane]);
    let mut steps = [[0i16; RUN]; 3];
    let mut finite = true;
    for (start, dst) in (0..plane).step_by(RUN).zip(out.chunks_mut(RUN * 3)) {
        let n = (plane - start).min(RUN);
        for (c, s) in steps.iter_mut().enumerate() {
            let (r, g) = (&restored[c * plane + start..][..n], &given[c * plane + start..][..n]);
            for ((s, &v), &g) in s[..n].iter_mut().zip(r).zip(g) {
                finite &= v.is_finite();
                *s = change_steps(((v + 1.0) * 127.5).clamp(0.0, 255.0) - f32::from(g));
            }
        }
        for (k, p) in dst.chunks_exact_mut(3).enumerate() {
            p.copy_from_slice(&[steps[0][k], steps[1][k], steps[2][k]]);
        }
    }
    finite
}

/// What a model with byte I/O changed in one crop: `restored` minus `given`, both planar bytes
/// (levels), as packed RGB in steps (see [`tensor_change`]; whole levels are exact).
pub(crate) fn bytes_change(restored: &[u8], given: &[u8], size: usize, out: &mut Vec<i16>) {
    let plane = size * size;
    let unit = crate::kernels::CHANGE_STEPS as i16;
    // Every value is written below: a buffer back from the pool at this size is not zeroed first.
    out.resize(plane * 3, 0);
    for c in 0..3 {
        let (r, g) = (&restored[c * plane..][..plane], &given[c * plane..][..plane]);
        for ((o, &r), &g) in out[c..].iter_mut().step_by(3).zip(r).zip(g) {
            *o = (i16::from(r) - i16::from(g)) * unit;
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

/// Luma (levels) of each 2x2 block of a crop in planar bytes of `size`, for the temporal
/// filter's likeness test.
pub(crate) fn crop_luma_half(cpu: Cpu, crop: &[u8], size: usize, out: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { crop_luma_half_avx2(crop, size, out) };
    }
    crop_luma_half_body(crop, size, out);
}

/// [`crop_luma_half_body`] compiled for AVX2 (the same values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn crop_luma_half_avx2(crop: &[u8], size: usize, out: &mut Vec<f32>) {
    crop_luma_half_body(crop, size, out);
}

/// The body of [`crop_luma_half`]: each row pair's pixels' luma a run of 64 at a time (loops
/// the compiler turns into vector code), then each cell's sum in the pixel-by-pixel order.
#[inline(always)]
fn crop_luma_half_body(crop: &[u8], size: usize, out: &mut Vec<f32>) {
    const RUN: usize = 64;
    let (h, plane) = (size / 2, size * size);
    out.clear();
    out.resize(h * h, 0.0);
    let (r, g, b) = (&crop[..plane], &crop[plane..2 * plane], &crop[2 * plane..3 * plane]);
    let luma_run = |at: usize, n: usize, l: &mut [f32; RUN]| {
        let rows = r[at..at + n].iter().zip(&g[at..at + n]).zip(&b[at..at + n]);
        for (l, ((&r, &g), &b)) in l.iter_mut().zip(rows) {
            *l = 0.299 * f32::from(r) + 0.587 * f32::from(g) + 0.114 * f32::from(b);
        }
    };
    let (mut lt, mut lb) = ([0.0f32; RUN], [0.0f32; RUN]);
    for (y, o) in out.chunks_exact_mut(h).enumerate() {
        let (top, bottom) = (2 * y * size, (2 * y + 1) * size);
        for (start, o) in (0..2 * h).step_by(RUN).zip(o.chunks_mut(RUN / 2)) {
            let n = (2 * h - start).min(RUN);
            luma_run(top + start, n, &mut lt);
            luma_run(bottom + start, n, &mut lb);
            for ((o, t), b) in o.iter_mut().zip(lt.chunks_exact(2)).zip(lb.chunks_exact(2)) {
                *o = (((t[0] + t[1]) + b[0]) + b[1]) * 0.25;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::geom::{crop_footprint, fit_similarity, similarity};

    /// A large face's warp tile by tile (each tile's texels made apart) writes, to the bit, the
    /// crop the warp over all its texels at once writes: bicubically and through the area
    /// filter, inside the picture, cut by its edges and turned (upside down too).
    #[test]
    fn a_warp_tile_by_tile_is_the_warp_over_the_whole_region() {
        let (w, h, size) = (1280usize, 720usize, 512usize);
        let frame: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919 + i / 977) % 251) as u8).collect();
        let tpl = template(size);
        let (mut cubic, mut area) = (0, 0);
        for (eye, cx, cy, angle) in [
            (150.0, 640.0, 360.0, 0.1),
            (170.0, 90.0, 640.0, -0.5),
            (230.0, 1200.0, 90.0, 2.0),
            (200.0, 640.0, 360.0, 0.0),
            (120.0, 40.0, 30.0, 0.7),
            (240.0, 700.0, 420.0, 3.1),
        ] {
            // The face `eye` frame pixels between the eyes at (cx, cy), turned by `angle`.
            let k = eye / (tpl[1][0] - tpl[0][0]) as f64;
            let (sn, cs) = f64::sin_cos(angle);
            let points = tpl.map(|[x, y]| {
                let (x, y) = (x as f64 - size as f64 / 2.0, y as f64 - size as f64 / 2.0);
                [(cx + k * (cs * x - sn * y)) as f32, (cy + k * (sn * x + cs * y)) as f32]
            });
            let to_crop = fit_similarity(&points, &tpl);
            let inv = to_crop.inverse().expect("a similarity");
            let region = crop_footprint(&to_crop, size, w, h).expect("on the frame");
            let r = texel_rect(region, (w, h));
            let by_area = area_at_level_zero(&to_crop);
            let spread = if by_area { 1.0 } else { 0.0 };
            assert!(tiles(&inv, size, r, (w, h), spread).count() > 1, "eye {eye}: one tile");
            let mut load = |t: Rect, tex: &mut Vec<f32x4>| load_texels(&frame, w, t, tex);
            let (mut tiled, mut whole) = (vec![0u8; 3 * size * size], vec![1u8; 3 * size * size]);
            let (mut scratch, mut tex) = (WarpScratch::default(), Vec::new());
            load_texels(&frame, w, r, &mut tex);
            if by_area {
                warp_area_loading(&mut load, (w, h), &to_crop, region, size, &mut tiled[..], &mut scratch);
                area_taps(&tex, r, &inv, size, Tile::whole(size), &mut whole[..], |x, y| {
                    bilinear_texels_clamped(&tex, r, (w, h), x, y)
                });
                area += 1;
            } else {
                warp_cubic_loading(&mut load, (w, h), &to_crop, region, size, &mut tiled[..], &mut scratch);
                warp_cubic_plain(
                    scratch.cpu(),
                    (&tex, r),
                    (w, h),
                    &inv,
                    size,
                    Tile::whole(size),
                    &mut whole[..],
                );
                cubic += 1;
            }
            assert!(tiled == whole, "eye {eye}, angle {angle}: the tiles' crop differs");
        }
        assert!(cubic >= 2 && area >= 2, "{cubic} bicubic and {area} area warps");
    }

    /// Whether a face aligned by `to_crop` is read through the area filter at the frame's own
    /// resolution (as the pipeline does for the faces it warps from the planes).
    fn area_at_level_zero(to_crop: &Affine) -> bool {
        filtered(to_crop) && mip_level(1.0 / to_crop.scale(), 6) == 0
    }

    /// Renders a soft blob, warps it into the crop with the fitted transform and back with the
    /// inverse: the blob's centroid must land within half a pixel of where it started.
    #[test]
    fn warp_round_trip_keeps_a_feature_within_half_a_pixel() {
        let (w, h) = (320usize, 240usize);
        let (cx, cy) = (171.3f64, 118.6f64);
        let mut img = vec![0u8; w * h * 3];
        for y in 0..h {
            for x in 0..w {
                let d2 = (x as f64 - cx).powi(2) + (y as f64 - cy).powi(2);
                let v = (255.0 * (-d2 / 50.0).exp()).round() as u8;
                img[(y * w + x) * 3..][..3].copy_from_slice(&[v, v, v]);
            }
        }
        // Landmarks of a face around the blob, slightly rotated.
        let size = 128;
        let truth = similarity(0.2, 0.9, cx - 50.0, cy - 70.0);
        let lm = template(size).map(|[x, y]| {
            let (u, v) = truth.apply(x as f64, y as f64);
            [u as f32, v as f32]
        });
        let to_crop = fit_similarity(&lm, &template(size));
        let mut t = vec![0.0; 3 * size * size];
        warp_to_tensor(&img, w, h, &to_crop, size, &mut t);
        let mut crop = Vec::new();
        tensor_to_rgb(&t, size, &mut crop);
        // Back into the frame: sample the crop at to_crop(frame pixel).
        let (mut sx, mut sy, mut sw) = (0.0, 0.0, 0.0);
        for y in 0..h {
            for x in 0..w {
                let (u, v) = to_crop.apply(x as f64, y as f64);
                if u < 0.0 || v < 0.0 || u > (size - 1) as f64 || v > (size - 1) as f64 {
                    continue;
                }
                let p = sample_rgb(&crop, size, size, u, v)[0] as f64;
                sx += p * x as f64;
                sy += p * y as f64;
                sw += p;
            }
        }
        let (ex, ey) = (sx / sw - cx, sy / sw - cy);
        assert!(ex.hypot(ey) < 0.5, "centroid moved by ({ex:.3}, {ey:.3})");
    }

    /// A one-pixel frame checkerboard under a face `ratio` times larger than the crop, turned a
    /// little: the crop's inner pixels (mean, standard deviation) as the warp reads them.
    fn checkerboard_crop(ratio: f64, filtered: bool) -> (f64, f64) {
        let size = 256;
        let (w, h) = (1600usize, 1500usize);
        let img: Vec<u8> = (0..w * h)
            .flat_map(|i| {
                let v = if (i % w + i / w) % 2 == 0 { 0 } else { 255 };
                [v, v, v]
            })
            .collect();
        let truth = similarity(0.15, ratio, 300.0, 40.0);
        let lm = template(size).map(|[x, y]| {
            let (u, v) = truth.apply(x as f64, y as f64);
            [u as f32, v as f32]
        });
        let to_crop = fit_similarity(&lm, &template(size));
        let region = crate::geom::crop_footprint(&to_crop, size, w, h);
        let mut t = vec![0.0; 3 * size * size];
        if filtered {
            warp_face(
                &img,
                (w, h),
                &to_crop,
                region,
                size,
                &mut t,
                &mut WarpScratch::default(),
            );
        } else {
            warp_to_tensor(&img, w, h, &to_crop, size, &mut t);
        }
        let mut crop = Vec::new();
        tensor_to_rgb(&t, size, &mut crop);
        let vals: Vec<f64> = (16..size - 16)
            .flat_map(|y| (16..size - 16).map(move |x| (x, y)))
            .map(|(x, y)| crop[(y * size + x) * 3] as f64)
            .collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn a_fine_checkerboard_under_a_large_face_reaches_the_crop_as_grey() {
        // A 1080p close-up into a 256 crop (about five frame pixels per crop pixel), and faces
        // just past the threshold and between mip levels.
        for ratio in [4.8, 1.6, 2.9, 3.7] {
            let (mean, sd) = checkerboard_crop(ratio, true);
            assert!(
                (mean - 127.5).abs() <= 2.0 && sd < 8.0,
                "ratio {ratio}: mean {mean:.1}, sd {sd:.1}"
            );
        }
        // One bilinear sample per crop pixel aliases: the checkerboard shows as a pattern.
        let (_, sd) = checkerboard_crop(4.8, false);
        assert!(sd > 20.0, "unfiltered sd {sd:.1}");
    }

    /// The fast paths (the region as f32 texels, four-lane taps, four pixels' weights at once;
    /// the four-lane change sampler) give exactly what the clamped per-pixel sampler gives (the
    /// fused eight-lane taps within a thousandth of a level),
    /// for faces inside the picture and across its edges, turned and scaled both ways.
    #[test]
    fn the_fast_samplers_equal_the_clamped_ones_exactly() {
        let (w, h, size) = (333usize, 250usize, 128usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        let cases = [
            // A face near the crop's size (below the area filter's threshold).
            (0.1, 1.0 / 1.3, -20.0, -10.0),
            (0.1, 1.0 / 0.7, -60.0, -40.0),
            (0.3, 1.0 / 1.2, -20.0, 10.0),
            (-0.2, 1.0 / 0.5, 40.0, 30.0),
            (2.9, 1.0 / 0.9, 150.0, 140.0),
        ];
        for (angle, scale, tx, ty) in cases {
            let to_crop = crate::geom::similarity(angle, scale, tx, ty);
            let region = crate::geom::crop_footprint(&to_crop, size, w, h);
            let mut b = vec![0.0; 3 * size * size];
            warp_to_tensor(&img, w, h, &to_crop, size, &mut b);
            // At every level this CPU runs: the fused taps add the same products in another
            // order, a few float steps apart (in [-1, 1], so 1e-5 is about a thousandth of a
            // level); the plain taps are exact.
            for cpu in Cpu::available() {
                let mut a = vec![0.0; 3 * size * size];
                let mut scratch = WarpScratch::at(cpu);
                warp_face(&img, (w, h), &to_crop, region, size, &mut a, &mut scratch);
                let apart = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                let allowed = if cpu.fma() { 1e-5 } else { 0.0 };
                assert!(
                    apart <= allowed,
                    "{}: angle {angle}, scale {scale}: {apart} apart",
                    cpu.name()
                );
            }
            // Each sampler on its own.
            let Some(region) = region else { continue };
            let mut a = vec![0.0; 3 * size * size];
            let apart = |a: &[f32]| a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            let r = texel_rect(region, (w, h));
            let mut tex = Vec::new();
            load_texels(&img, w, r, &mut tex);
            let inv = to_crop.inverse().unwrap();
            warp_cubic_body::<[f32], false>(&tex, r, (w, h), &inv, size, Tile::whole(size), &mut a[..]);
            assert_eq!(apart(&a), 0.0, "plain taps: angle {angle}, scale {scale}");
            #[cfg(target_arch = "x86_64")]
            if Cpu::detected().fma() {
                // SAFETY: a `Cpu` says AVX2 and FMA only where this CPU has them.
                unsafe { warp_cubic_fused(&tex, r, (w, h), &inv, size, Tile::whole(size), &mut a[..]) };
                assert!(
                    apart(&a) <= 1e-5,
                    "fused taps: angle {angle}, scale {scale}: {} apart",
                    apart(&a)
                );
            }
        }
        let field: Vec<f32> = (0..w * h * 3).map(|i| ((i * 31) % 97) as f32 - 48.5).collect();
        for k in 0..4000 {
            let (x, y) = ((k * 37 % 3400) as f32 * 0.1 - 5.0, (k * 53 % 2600) as f32 * 0.1 - 5.0);
            if !cubic3_inside(w, h, x, y) {
                continue;
            }
            let (x0, y0) = (x as usize, y as usize);
            let wt = cubic_weights4(f32x4::new([x - x0 as f32, y - y0 as f32, 0.0, 0.0])).map(|v| v.to_array());
            let t = cubic3_taps(&field, w, (x0, y0), wt.map(|v| v[0]), wt.map(|v| v[1])).to_array();
            assert_eq!([t[0], t[1], t[2]], sample_cubic3(&field, w, h, x, y), "at ({x}, {y})");
        }
    }

    /// Halving a region row by row gives the 2 x 2 means a pixel-by-pixel loop gives, odd
    /// edges included.
    #[test]
    fn halving_a_region_averages_its_blocks() {
        let (w, h) = (41usize, 30usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        for r in [Rect::new(3, 2, 40, 29), Rect::new(0, 0, 41, 30), Rect::new(5, 5, 6, 6)] {
            let mut out = Vec::new();
            let (hw, hh) = halve_region(&img, w, r, &mut out);
            assert_eq!((hw, hh), (r.width().div_ceil(2), r.height().div_ceil(2)));
            for y in 0..hh {
                for x in 0..hw {
                    let xs = [r.x0 + (2 * x).min(r.width() - 1), r.x0 + (2 * x + 1).min(r.width() - 1)];
                    let ys = [
                        r.y0 + (2 * y).min(r.height() - 1),
                        r.y0 + (2 * y + 1).min(r.height() - 1),
                    ];
                    for c in 0..3 {
                        let mut s = 0u32;
                        for yy in ys {
                            for xx in xs {
                                s += img[(yy * w + xx) * 3 + c] as u32;
                            }
                        }
                        assert_eq!(out[(y * hw + x) * 3 + c] as u32, (s + 2) / 4, "{r:?} ({x}, {y}) {c}");
                    }
                }
            }
        }
    }

    /// The change, four pixels at a time, is what the per-value formula gives, including a
    /// crop whose side is not a multiple of four and values the clamp cuts.
    /// Four values of a change in steps widened in vector registers are the values one by one,
    /// at both ends of the range and around zero.
    #[test]
    fn four_steps_at_once_are_the_steps_one_by_one() {
        let vals: Vec<i16> = [i16::MIN, -32640, -129, -1, 0, 1, 127, 32640, i16::MAX, 5, -7]
            .into_iter()
            .chain((0..200).map(|i| (i * 331 - 33000) as i16))
            .collect();
        for w in vals.windows(4) {
            let v: [i16; 4] = w.try_into().unwrap();
            assert_eq!(<i16 as Tap>::four(&v).to_array(), v.map(f32::from), "{v:?}");
        }
    }

    /// Every kernel of this file at every level the CPU runs gives, to the bit, what its plain
    /// body gives (the warp's taps: see the fast samplers' test).
    #[test]
    fn every_kernel_at_every_level_equals_its_plain_body() {
        let size = 70;
        let n = 3 * size * size;
        let crop: Vec<u8> = (0..n).map(|i| (i * 7919 % 251) as u8).collect();
        let out: Vec<f32> = (0..n).map(|i| ((i * 37) % 1001) as f32 / 480.0 - 1.04).collect();
        for cpu in Cpu::available() {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            assert_eq!(
                tensor_change(cpu, &out, &crop, size, &mut a),
                tensor_change_body(&out, &crop, size, &mut b)
            );
            assert_eq!(a, b, "{}", cpu.name());
            let (mut a, mut b) = (vec![0.0f32; n], vec![0.0f32; n]);
            crop_to_tensor(cpu, &crop, &mut a);
            crop_to_tensor_body(&crop, &mut b);
            assert_eq!(a, b, "{}", cpu.name());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            crop_luma_half(cpu, &crop, size, &mut a);
            crop_luma_half_body(&crop, size, &mut b);
            assert_eq!(a, b, "{}", cpu.name());
        }
    }

    /// The half-resolution luma of a crop is, to the bit, each 2 x 2 block's pixel-by-pixel
    /// sum (crops of a run, of runs and a remainder, and of an odd side).
    #[test]
    fn a_crops_half_luma_is_the_pixel_by_pixel_sum() {
        for size in [8usize, 130, 256, 11] {
            let (h, plane) = (size / 2, size * size);
            let crop: Vec<u8> = (0..3 * plane).map(|i| (i * 7919 % 251) as u8).collect();
            let mut out = Vec::new();
            crop_luma_half(Cpu::detected(), &crop, size, &mut out);
            let luma = |i: usize| {
                0.299 * f32::from(crop[i]) + 0.587 * f32::from(crop[plane + i]) + 0.114 * f32::from(crop[2 * plane + i])
            };
            for y in 0..h {
                for x in 0..h {
                    let (t, b) = (2 * y * size + 2 * x, (2 * y + 1) * size + 2 * x);
                    let s = luma(t) + luma(t + 1) + luma(b) + luma(b + 1);
                    assert_eq!(out[y * h + x], s * 0.25, "size {size}, cell ({x}, {y})");
                }
            }
        }
    }

    /// Every level to the model's input, eight at a time and the remainder, is the level's
    /// value one at a time.
    #[test]
    fn a_crop_to_the_models_input_is_each_levels_value() {
        let crop: Vec<u8> = (0..3 * 7 * 7 + 256).map(|i| (i * 37 % 256) as u8).collect();
        let mut t = vec![0.0f32; crop.len()];
        crop_to_tensor(Cpu::detected(), &crop, &mut t);
        for (&b, &v) in crop.iter().zip(&t) {
            assert_eq!(v, b as f32 * (1.0 / 127.5) - 1.0, "level {b}");
        }
    }

    /// An output value that is not finite, anywhere in the crop (a run's first, its last, the
    /// crop's last), makes the change no change.
    #[test]
    fn a_change_with_a_value_not_finite_is_refused() {
        let size = 9;
        let n = 3 * size * size;
        let given = vec![7u8; n];
        let mut out = Vec::new();
        assert!(tensor_change(
            Cpu::detected(),
            &vec![0.25f32; n],
            &given,
            size,
            &mut out
        ));
        for at in [0, 63, 64, size * size + 5, n - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut restored = vec![0.25f32; n];
                restored[at] = bad;
                assert!(
                    !tensor_change(Cpu::detected(), &restored, &given, size, &mut out),
                    "{bad} at {at}"
                );
            }
        }
    }

    /// A byte model's change and a float model's giving the same levels are the same steps.
    #[test]
    fn a_change_from_bytes_is_the_change_from_the_same_floats() {
        let size = 8;
        let n = 3 * size * size;
        let out: Vec<u8> = (0..n).map(|i| ((i * 97) % 256) as u8).collect();
        let given: Vec<u8> = (0..n).map(|i| ((i * 53) % 256) as u8).collect();
        let floats: Vec<f32> = out.iter().map(|&b| b as f32 / 127.5 - 1.0).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        bytes_change(&out, &given, size, &mut a);
        assert!(tensor_change(Cpu::detected(), &floats, &given, size, &mut b));
        assert_eq!(a, b);
    }

    #[test]
    fn a_change_into_a_used_buffer_is_the_change_into_a_fresh_one() {
        // Pooled buffers come back holding an earlier face's change (and are not zeroed).
        for size in [8usize, 9, 13] {
            let n = 3 * size * size;
            let out: Vec<u8> = (0..n).map(|i| ((i * 97) % 256) as u8).collect();
            let given: Vec<u8> = (0..n).map(|i| ((i * 53) % 256) as u8).collect();
            let floats: Vec<f32> = out.iter().map(|&b| b as f32 / 127.5 - 1.0).collect();
            let (mut fresh_f, mut fresh_b) = (Vec::new(), Vec::new());
            assert!(tensor_change(Cpu::detected(), &floats, &given, size, &mut fresh_f));
            bytes_change(&out, &given, size, &mut fresh_b);
            for used_len in [n, n + 50] {
                let mut used = vec![i16::MIN; used_len];
                assert!(tensor_change(Cpu::detected(), &floats, &given, size, &mut used));
                assert_eq!(used, fresh_f, "floats, size {size}, buffer of {used_len}");
                let mut used = vec![i16::MIN; used_len];
                bytes_change(&out, &given, size, &mut used);
                assert_eq!(used, fresh_b, "bytes, size {size}, buffer of {used_len}");
            }
        }
    }

    #[test]
    fn the_change_is_the_clamped_output_minus_the_input() {
        for size in [8usize, 7] {
            let n = 3 * size * size;
            let restored: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 40.0 - 1.26).collect();
            let given: Vec<u8> = (0..n).map(|i| ((i * 53) % 256) as u8).collect();
            let mut got = Vec::new();
            assert!(tensor_change(Cpu::detected(), &restored, &given, size, &mut got));
            let plane = size * size;
            let level = |v: f32| (v + 1.0) * 127.5;
            for i in 0..plane {
                for c in 0..3 {
                    let j = c * plane + i;
                    let float = level(restored[j]).clamp(0.0, 255.0) - f32::from(given[j]);
                    assert_eq!(got[3 * i + c], change_steps(float), "{i} {c}");
                    // The nearest step: within half of one (1/256 of a level) of the float.
                    let off = crate::kernels::change_levels(got[3 * i + c]) - float;
                    assert!(off.abs() <= 0.5 / crate::kernels::CHANGE_STEPS, "{i} {c}: {off}");
                }
            }
        }
    }

    #[test]
    fn tensor_round_trip_is_exact_for_u8_values() {
        let size = 4;
        let rgb: Vec<u8> = (0..size * size * 3).map(|i| (i * 5 % 256) as u8).collect();
        let mut t = vec![0.0; rgb.len()];
        warp_to_tensor(&rgb, size, size, &Affine::IDENTITY, size, &mut t);
        assert!(t.iter().all(|v| (-1.0..=1.0).contains(v)));
        let mut back = Vec::new();
        tensor_to_rgb(&t, size, &mut back);
        assert_eq!(back, rgb);
    }

    /// The byte path: a crop warped into bytes is the float crop rounded (within half a level,
    /// on every path: bicubic, area-filtered, clamped at the frame's edge), the model's input
    /// made from it is within half a level of the float crop, and a model that gives its input
    /// back changes nothing (within a thousandth of a level).
    #[test]
    fn a_crop_in_bytes_is_the_float_crop_within_half_a_level() {
        let (w, h, size) = (160usize, 120usize, 64usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        let tpl = template(size);
        // A small face (bicubic), a large one (area filter) and one over the frame's corner.
        for (eye, cx, cy) in [(12.0f32, 80.0f32, 60.0f32), (60.0, 80.0, 60.0), (20.0, 4.0, 4.0)] {
            let s = eye / (tpl[1][0] - tpl[0][0]);
            let lm = tpl.map(|[x, y]| [cx + s * (x - size as f32 / 2.0), cy + s * (y - size as f32 / 2.0)]);
            let to_crop = crate::geom::fit_similarity(&lm, &tpl);
            let region = crate::geom::crop_footprint(&to_crop, size, w, h);
            let (mut f, mut b) = (vec![0.0f32; 3 * size * size], vec![0u8; 3 * size * size]);
            let mut scratch = WarpScratch::default();
            warp_face(&img, (w, h), &to_crop, region, size, &mut f, &mut scratch);
            warp_face(&img, (w, h), &to_crop, region, size, &mut b, &mut scratch);
            let mut t = vec![0.0f32; f.len()];
            crop_to_tensor(Cpu::detected(), &b, &mut t);
            for ((x, y), z) in f.iter().zip(&b).zip(&t) {
                let level = (x + 1.0) * 127.5;
                assert!((level - f32::from(*y)).abs() <= 0.5 + 1e-3, "eye {eye}: {level} vs {y}");
                assert!(((z + 1.0) * 127.5 - level).abs() <= 0.5 + 1e-3);
            }
            let mut change = Vec::new();
            assert!(tensor_change(Cpu::detected(), &t, &b, size, &mut change));
            assert!(change.iter().all(|&v| v == 0), "eye {eye}");
        }
    }
}
