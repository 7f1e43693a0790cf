//! YUV planes and RGB: in, the planes of a YUV picture as plain views ([`Planes`], [`PlanesMut`]:
//! slices, strides and the picture's size, no FFmpeg frame), a region, and the colour matrix as
//! numbers (the inverse's five factors, or a change's three rows); out, the region of an 8-bit
//! 4:2:0 picture as packed RGB24 rows or f32 texels, or the planes with a change of RGB added at
//! their depth and chroma layout ([`Planar`]). `media::color` chooses the matrix and the layout of
//! an FFmpeg picture, makes the views and calls these.

use std::mem::MaybeUninit;

use wide::f32x4;

use crate::geom::Rect;
use crate::kernels::Cpu;

/// The planes of a YUV picture to read: up to three (Y, then Cb and Cr, or CbCr interleaved in
/// the second with the third empty), each with its stride in bytes, and the picture's size in
/// pixels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planes<'a> {
    data: [&'a [u8]; 3],
    stride: [usize; 3],
    width: usize,
    height: usize,
}

impl<'a> Planes<'a> {
    /// The view of planes `data` with rows `stride` bytes apart, of a `width x height` picture.
    pub(crate) fn new(data: [&'a [u8]; 3], stride: [usize; 3], (width, height): (usize, usize)) -> Self {
        Planes {
            data,
            stride,
            width,
            height,
        }
    }

    /// Plane `i`'s bytes.
    #[inline(always)]
    pub(crate) fn data(&self, i: usize) -> &'a [u8] {
        self.data[i]
    }

    /// Plane `i`'s stride in bytes.
    #[inline(always)]
    pub(crate) fn stride(&self, i: usize) -> usize {
        self.stride[i]
    }

    /// The picture's width in pixels.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// The picture's height in pixels.
    pub(crate) fn height(&self) -> usize {
        self.height
    }
}

/// The planes of a YUV picture to write: as [`Planes`], each plane's bytes held mutably.
#[derive(Debug)]
pub(crate) struct PlanesMut<'a> {
    data: [&'a mut [u8]; 3],
    stride: [usize; 3],
    width: usize,
    height: usize,
}

impl<'a> PlanesMut<'a> {
    /// The view of planes `data` with rows `stride` bytes apart, of a `width x height` picture.
    pub(crate) fn new(data: [&'a mut [u8]; 3], stride: [usize; 3], (width, height): (usize, usize)) -> Self {
        PlanesMut {
            data,
            stride,
            width,
            height,
        }
    }

    /// Plane `i`'s bytes, to write.
    #[inline(always)]
    pub(crate) fn data_mut(&mut self, i: usize) -> &mut [u8] {
        self.data[i]
    }

    /// Plane `i`'s stride in bytes.
    #[inline(always)]
    pub(crate) fn stride(&self, i: usize) -> usize {
        self.stride[i]
    }

    /// The picture's width in pixels.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// The picture's height in pixels.
    pub(crate) fn height(&self) -> usize {
        self.height
    }
}

/// A YUV layout whose planes a change is added to (see [`add_change_planar`]): the chroma planes'
/// subsampling as shifts, the bits per sample (8, or 10 and 12 in 16-bit words, stored `shift`
/// bits up), and whether Cb and Cr share one interleaved plane (NV12 and P010, what GPU decoders
/// give). `media::color` gives the layout of an FFmpeg pixel format (`Planar::of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planar {
    pub(crate) hshift: u32,
    pub(crate) vshift: u32,
    pub(crate) bits: u32,
    pub(crate) shift: u32,
    pub(crate) interleaved: bool,
}

impl Planar {
    /// 8-bit 4:2:0 in three planes (yuv420p), the layout [`add_change_420`] takes.
    pub(crate) const YUV420P: Planar = Planar {
        hshift: 1,
        vshift: 1,
        bits: 8,
        shift: 0,
        interleaved: false,
    };
}

/// A change of a picture's RGB over one region: per pixel of `rect`, row by row, the change of
/// R, G and B in levels (the paste's `Change`, borrowed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RgbChange<'a> {
    pub(crate) rect: Rect,
    pub(crate) rgb: &'a [f32],
}

/// Converts region `r` of an 8-bit 4:2:0 picture (limited range, `k` its matrix's inverse
/// factors: luma scale, Cr->R, Cb->G, Cr->G, Cb->B; chroma interpolated bilinearly with MPEG-2
/// siting), handing each row of packed RGB24 to `row` (its y, then its bytes), top to bottom.
pub(crate) fn yuv420p_rgb_rows(yuv: &Planes<'_>, k: [f32; 5], r: Rect, mut row: impl FnMut(usize, &[u8])) {
    let mut out = Vec::new();
    yuv420p_region_rows(yuv, k, r, |y, src| {
        let n = src.luma.len();
        out.resize(n * 3, 0);
        for (i, px) in out.chunks_exact_mut(3).enumerate() {
            let [r, g, b] = src.at(i);
            // Saturating casts of values in 0..=255.5: truncation after the half rounds.
            px.copy_from_slice(&[r as u8, g as u8, b as u8]);
        }
        row(y, &out);
    });
}

/// Appends region `r` of an 8-bit 4:2:0 picture to `out` as texels, row by row (R, G, B, 0 in
/// f32: the levels [`yuv420p_rgb_rows`] gives, what the crop warp reads), eight pixels at a time
/// with AVX2 and four without, with no packed RGB row between.
pub(crate) fn yuv420p_texels(cpu: Cpu, yuv: &Planes<'_>, k: [f32; 5], r: Rect, out: &mut Vec<f32x4>) {
    #[cfg(target_arch = "x86_64")]
    let eight = cpu.avx2();
    yuv420p_region_rows(yuv, k, r, |_, src| {
        let (start, n) = (out.len(), src.luma.len());
        // Written in place of the row's texels, not zeroed first (that doubled the stores).
        out.reserve(n);
        let dst = &mut out.spare_capacity_mut()[..n];
        #[allow(unused_mut)]
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if eight {
            // SAFETY: the CPU has AVX2 (a `Cpu` says so only where it does, see `kernels::cpu`).
            done = unsafe { src.texels_avx2(dst) };
        }
        src.texels(dst, done);
        // SAFETY: `texels` wrote every texel of `dst` from `done` on, and `texels_avx2` the
        // ones before: the `n` values after `start` are initialised.
        unsafe { out.set_len(start + n) };
    });
}
/// One luma row of a region and what its pixels' colours are made from: its chroma rows'
/// values along x (interpolated once per chroma row), their mix across and the inverse matrix.
struct RegionRow<'a> {
    luma: &'a [u8],
    u: [&'a [f32]; 2],
    v: [&'a [f32]; 2],
    fy: f32,
    k: [f32; 5],
}

impl RegionRow<'_> {
    /// Pixel `i`'s R, G and B before the cast to a level (half added, clamped to 0..=255).
    #[inline(always)]
    fn at(&self, i: usize) -> [f32; 3] {
        let [ky, kvr, kug, kvg, kub] = self.k;
        let ([u0, u1], [v0, v1], fy) = (self.u, self.v, self.fy);
        let d = u0[i] + (u1[i] - u0[i]) * fy - 128.0;
        let e = v0[i] + (v1[i] - v0[i]) * fy - 128.0;
        let c = ky * (self.luma[i] as f32 - 16.0);
        [
            (c + kvr * e + 0.5).clamp(0.0, 255.0),
            (c - kug * d - kvg * e + 0.5).clamp(0.0, 255.0),
            (c + kub * d + 0.5).clamp(0.0, 255.0),
        ]
    }

    /// The row's texels from pixel `from` on into `dst` (one per pixel of the row): four pixels
    /// at a time, the rest one by one.
    fn texels(&self, dst: &mut [MaybeUninit<f32x4>], from: usize) {
        let n = self.luma.len().min(dst.len());
        let mut i = from;
        while i + 4 <= n {
            let [r, g, b] = self.at4(i);
            for (d, t) in dst[i..i + 4].iter_mut().zip(f32x4::transpose([r, g, b, f32x4::ZERO])) {
                d.write(t);
            }
            i += 4;
        }
        for (k, d) in dst.iter_mut().enumerate().take(n).skip(i) {
            let [r, g, b] = self.at(k);
            d.write(f32x4::new([r, g, b, 0.0].map(|v| (v as u8) as f32)));
        }
    }

    /// [`RegionRow::texels`] eight pixels at a time in AVX2 registers (the same operations on
    /// each value, so the same levels), for as many whole eights as the row has; returns how
    /// many pixels it made.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn texels_avx2(&self, dst: &mut [MaybeUninit<f32x4>]) -> usize {
        use std::arch::x86_64::*;
        let n = self.luma.len().min(dst.len());
        let [ky, kvr, kug, kvg, kub] = self.k.map(|k| _mm256_set1_ps(k));
        let ([u0, u1], [v0, v1]) = (self.u, self.v);
        let (fy, c128, c16) = (_mm256_set1_ps(self.fy), _mm256_set1_ps(128.0), _mm256_set1_ps(16.0));
        let (half, zero, top) = (_mm256_set1_ps(0.5), _mm256_setzero_ps(), _mm256_set1_ps(255.0));
        let mut i = 0;
        while i + 8 <= n {
            let eight = |s: &[f32]| {
                let s: &[f32; 8] = s[i..i + 8].try_into().expect("8 values");
                // SAFETY: `s` is eight f32 (an unaligned load of 32 bytes inside it).
                unsafe { _mm256_loadu_ps(s.as_ptr()) }
            };
            let mix = |a: &[f32], b: &[f32]| {
                let (a, b) = (eight(a), eight(b));
                _mm256_sub_ps(_mm256_add_ps(a, _mm256_mul_ps(_mm256_sub_ps(b, a), fy)), c128)
            };
            let (d, e) = (mix(u0, u1), mix(v0, v1));
            let l: &[u8; 8] = self.luma[i..i + 8].try_into().expect("8 levels");
            // SAFETY: `l` is eight bytes (an unaligned 64-bit load inside it).
            let l = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(l.as_ptr().cast()) }));
            let c = _mm256_mul_ps(ky, _mm256_sub_ps(l, c16));
            // The half added, clamped to 0..=255 and truncated: the casts to levels.
            let level = |v: __m256| {
                let v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, half), zero), top);
                _mm256_cvtepi32_ps(_mm256_cvttps_epi32(v))
            };
            let r = level(_mm256_add_ps(c, _mm256_mul_ps(kvr, e)));
            let g = level(_mm256_sub_ps(
                _mm256_sub_ps(c, _mm256_mul_ps(kug, d)),
                _mm256_mul_ps(kvg, e),
            ));
            let b = level(_mm256_add_ps(c, _mm256_mul_ps(kub, d)));
            // Eight texels (R, G, B, 0) from the three planes: pairs, then quads, then in order.
            let (rg_lo, rg_hi) = (_mm256_unpacklo_ps(r, g), _mm256_unpackhi_ps(r, g));
            let (bz_lo, bz_hi) = (_mm256_unpacklo_ps(b, zero), _mm256_unpackhi_ps(b, zero));
            let quads = |a: __m256, b: __m256| {
                let (a, b) = (_mm256_castps_pd(a), _mm256_castps_pd(b));
                (
                    _mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                    _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)),
                )
            };
            // [t0 | t4], [t1 | t5], [t2 | t6], [t3 | t7].
            let (t04, t15) = quads(rg_lo, bz_lo);
            let (t26, t37) = quads(rg_hi, bz_hi);
            let out: &mut [MaybeUninit<f32x4>; 8] = (&mut dst[i..i + 8]).try_into().expect("8 texels");
            let p = out.as_mut_ptr().cast::<f32>();
            // SAFETY: `out` is eight texels of four f32 each: four stores of eight floats fill it.
            unsafe {
                _mm256_storeu_ps(p, _mm256_permute2f128_ps::<0x20>(t04, t15));
                _mm256_storeu_ps(p.add(8), _mm256_permute2f128_ps::<0x20>(t26, t37));
                _mm256_storeu_ps(p.add(16), _mm256_permute2f128_ps::<0x31>(t04, t15));
                _mm256_storeu_ps(p.add(24), _mm256_permute2f128_ps::<0x31>(t26, t37));
            }
            i += 8;
        }
        i
    }

    /// Pixels `i .. i + 4`'s levels (R, G, B a vector each): [`RegionRow::at`] lane by lane
    /// (the same operations), truncated to whole levels as its casts are.
    #[inline(always)]
    fn at4(&self, i: usize) -> [f32x4; 3] {
        let [ky, kvr, kug, kvg, kub] = self.k.map(f32x4::splat);
        let ([u0, u1], [v0, v1]) = (self.u, self.v);
        let four = |s: &[f32]| f32x4::new(s[i..i + 4].try_into().expect("4 values"));
        let (fy, c128) = (f32x4::splat(self.fy), f32x4::splat(128.0));
        let (u0, u1, v0, v1) = (four(u0), four(u1), four(v0), four(v1));
        let d = u0 + (u1 - u0) * fy - c128;
        let e = v0 + (v1 - v0) * fy - c128;
        let l = &self.luma[i..i + 4];
        let c = ky * (f32x4::new([l[0], l[1], l[2], l[3]].map(f32::from)) - f32x4::splat(16.0));
        let (half, lo, hi) = (f32x4::splat(0.5), f32x4::ZERO, f32x4::splat(255.0));
        // In 0..=255 after the clamp: truncation is the cast to a level.
        let level = |v: f32x4| (v + half).max(lo).min(hi).fast_trunc_int().round_float();
        [level(c + kvr * e), level(c - kug * d - kvg * e), level(c + kub * d)]
    }
}

/// Walks region `r` of an 8-bit 4:2:0 picture row by row, top to bottom, handing each luma row
/// with its chroma and the inverse matrix `k` to `each` (its y, then the row).
fn yuv420p_region_rows(yuv: &Planes<'_>, k: [f32; 5], r: Rect, mut each: impl FnMut(usize, &RegionRow<'_>)) {
    let (width, height) = (yuv.width(), yuv.height());
    let Rect { x0, y0, x1, y1 } = r.clip(width, height);
    if x0 >= x1 || y0 >= y1 {
        return;
    }
    let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
    let (yp, up, vp) = (yuv.data(0), yuv.data(1), yuv.data(2));
    let (cw, ch) = (width.div_ceil(2), height.div_ceil(2));
    // Chroma columns sit on even luma columns: column x reads chroma x / 2 and, when odd, half
    // of the next. Each chroma row is interpolated along x once for the region (the very sums
    // the per-pixel form makes), and each luma row mixes its two chroma rows.
    let n = x1 - x0;
    let horizontal = |p: &[u8], stride: usize, cy: usize, out: &mut Vec<f32>| {
        let row = &p[cy * stride..][..cw];
        // An even column is its chroma sample; an odd one, halfway to the next (the per-pixel
        // form's sums: a + (b - a) * 0.5), the last chroma column its own next.
        let odd = |c: usize| {
            let a = row[c] as f32;
            a + (row[(c + 1).min(cw - 1)] as f32 - a) * 0.5
        };
        out.clear();
        let mut x = x0;
        if x & 1 == 1 {
            out.push(odd(x >> 1));
            x += 1;
        }
        // Whole pairs of columns (even, odd) over chroma columns that have a next one: a loop
        // without branches, which the compiler turns into vector code.
        let c0 = x >> 1;
        let pairs = ((x1 - x) / 2).min((cw - 1).saturating_sub(c0));
        let start = out.len();
        out.resize(start + 2 * pairs, 0.0);
        let (here, next) = (&row[c0..c0 + pairs], &row[c0 + 1..c0 + 1 + pairs]);
        for ((o, &a), &b) in out[start..].chunks_exact_mut(2).zip(here).zip(next) {
            let (a, b) = (a as f32, b as f32);
            o[0] = a;
            o[1] = a + (b - a) * 0.5;
        }
        x += 2 * pairs;
        while x < x1 {
            let c = x >> 1;
            out.push(if x & 1 == 0 { row[c] as f32 } else { odd(c) });
            x += 1;
        }
    };
    // (chroma row, its U and V along x) for the two rows the current luma row reads.
    let mut rows: [(usize, Vec<f32>, Vec<f32>); 2] = [
        (usize::MAX, Vec::new(), Vec::new()),
        (usize::MAX, Vec::new(), Vec::new()),
    ];
    for y in y0..y1 {
        // Chroma rows sit between luma rows: luma row y is at chroma row (y - 0.5) / 2.
        let cy = (y as f32 - 0.5) * 0.5;
        let cy0 = cy.floor().max(0.0) as usize;
        let cy1 = (cy0 + 1).min(ch - 1);
        let fy = (cy - cy0 as f32).clamp(0.0, 1.0);
        if rows[0].0 != cy0 && rows[1].0 == cy0 {
            rows.swap(0, 1);
        }
        for (slot, want) in [(0, cy0), (1, cy1)] {
            if rows[slot].0 != want {
                let (c, u, v) = &mut rows[slot];
                horizontal(up, us, want, u);
                horizontal(vp, vs, want, v);
                *c = want;
            }
        }
        let ((_, u0, v0), (_, u1, v1)) = (&rows[0], &rows[1]);
        each(
            y,
            &RegionRow {
                luma: &yp[y * ys + x0..][..n],
                u: [u0, u1],
                v: [v0, v1],
                fy,
                k,
            },
        );
    }
}

/// How samples sit in a plane: 16-bit little-endian words or bytes, stored `shift` bits up,
/// at most `max`.
#[derive(Clone, Copy)]
struct Samples {
    wide: bool,
    shift: u32,
    max: f32,
}

/// Adds `d` to the sample at index `x` of row `y` of a plane, rounded to the nearest value and
/// clamped. A change under half a step leaves it as it was.
#[inline]
fn add_sample(plane: &mut [u8], stride: usize, s: Samples, (x, y): (usize, usize), d: f32) {
    if s.wide {
        let i = y * stride + 2 * x;
        let old = (u16::from_le_bytes([plane[i], plane[i + 1]]) >> s.shift) as f32;
        let new = ((old + d).clamp(0.0, s.max) + 0.5) as u16;
        plane[i..i + 2].copy_from_slice(&(new << s.shift).to_le_bytes());
    } else {
        let i = y * stride + x;
        plane[i] = ((plane[i] as f32 + d).clamp(0.0, s.max) + 0.5) as u8;
    }
}

/// Adds change `ch` to the planes of a YUV picture of any [`Planar`] layout, with `rows` the
/// RGB -> YCbCr rows of its matrix, depth and range (a change of one level of R, G or B as the
/// change of Y, Cb and Cr samples): each luma sample takes its pixel's change, each chroma
/// sample the mean change over the pixels it covers. Samples whose change is under half a step
/// keep their values exactly. The general loop, with a check per sample; [`add_change_420`] is
/// the same for 8-bit 4:2:0 in three planes, without them.
pub(crate) fn add_change_planar(pic: &mut PlanesMut<'_>, layout: Planar, ch: RgbChange<'_>, rows: &[[f32; 3]; 3]) {
    let Planar {
        hshift,
        vshift,
        bits,
        shift,
        interleaved,
    } = layout;
    let (width, height) = (pic.width(), pic.height());
    let samples = Samples {
        wide: bits > 8,
        shift,
        max: ((1u32 << bits) - 1) as f32,
    };
    // Where Cb and Cr sit: (plane, first sample, step) along a row.
    let chroma = if interleaved {
        [(1, 0, 2), (1, 1, 2)]
    } else {
        [(1, 0, 1), (2, 0, 1)]
    };
    let dot = |k: &[f32; 3], d: &[f32]| k[0] * d[0] + k[1] * d[1] + k[2] * d[2];
    let r = ch.rect.clip(width, height);
    let rw = ch.rect.width();
    let at = |x: usize, y: usize| &ch.rgb[((y - ch.rect.y0) * rw + x - ch.rect.x0) * 3..][..3];
    let stride = pic.stride(0);
    let luma = pic.data_mut(0);
    for y in r.y0..r.y1 {
        for x in r.x0..r.x1 {
            let d = dot(&rows[0], at(x, y));
            if d != 0.0 {
                add_sample(luma, stride, samples, (x, y), d);
            }
        }
    }
    // Chroma samples whose pixels reach into the region; pixels outside it changed by zero.
    let (bw, bh) = (1usize << hshift, 1usize << vshift);
    let area = (bw * bh) as f32;
    for cy in (r.y0 >> vshift)..r.y1.div_ceil(bh) {
        for cx in (r.x0 >> hshift)..r.x1.div_ceil(bw) {
            let sum = block_sum(ch, r, (cx, cy), (bw, bh));
            if sum == [0.0; 3] {
                continue;
            }
            let mean = sum.map(|v| v / area);
            for ((plane, first, step), k) in chroma.into_iter().zip([&rows[1], &rows[2]]) {
                let d = dot(k, &mean);
                if d != 0.0 {
                    let stride = pic.stride(plane);
                    add_sample(pic.data_mut(plane), stride, samples, (cx * step + first, cy), d);
                }
            }
        }
    }
}

/// The sum of change `ch` over the pixels of chroma sample (cx, cy) (blocks of `bw x bh`
/// pixels) that lie in `r` (the change clipped to the picture), row by row.
fn block_sum(ch: RgbChange<'_>, r: Rect, (cx, cy): (usize, usize), (bw, bh): (usize, usize)) -> [f32; 3] {
    let rw = ch.rect.width();
    let mut sum = [0.0f32; 3];
    for y in (cy * bh).max(r.y0)..((cy + 1) * bh).min(r.y1) {
        for x in (cx * bw).max(r.x0)..((cx + 1) * bw).min(r.x1) {
            let d = &ch.rgb[((y - ch.rect.y0) * rw + x - ch.rect.x0) * 3..][..3];
            for c in 0..3 {
                sum[c] += d[c];
            }
        }
    }
    sum
}

/// [`add_change_planar`] of one change to an 8-bit 4:2:0 picture in three planes
/// ([`Planar::YUV420P`]), with `rows` its matrix's rows: each luma row's samples in one loop
/// without branches (a change under half a level leaves a sample as it was either way:
/// `(p + d + 0.5)` truncated is `p`), each chroma sample whose 2 x 2 pixels all lie in the
/// change from their sum in the same order; chroma samples at the change's edges (pixels outside
/// it changed by zero) as the general loop does.
pub(crate) fn add_change_420(cpu: Cpu, pic: &mut PlanesMut<'_>, ch: RgbChange<'_>, rows: &[[f32; 3]; 3]) {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { add_change_420_avx2(pic, ch, rows) };
    }
    add_change_420_body(pic, ch, rows)
}

/// [`add_change_420_body`] compiled for AVX2 (the same operations on each value, so the same
/// values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_change_420_avx2(pic: &mut PlanesMut<'_>, ch: RgbChange<'_>, rows: &[[f32; 3]; 3]) {
    add_change_420_body(pic, ch, rows)
}
/// The body of [`add_change_420`].
#[inline(always)]
fn add_change_420_body(pic: &mut PlanesMut<'_>, ch: RgbChange<'_>, rows: &[[f32; 3]; 3]) {
    let (width, height) = (pic.width(), pic.height());
    let r = ch.rect.clip(width, height);
    if r.x0 >= r.x1 || r.y0 >= r.y1 {
        return;
    }
    let rw = ch.rect.width();
    let row_of = |y: usize| &ch.rgb[((y - ch.rect.y0) * rw + r.x0 - ch.rect.x0) * 3..][..(r.x1 - r.x0) * 3];
    // In 0.5 ..= 255.5 after the clamp, so truncating to i32 is the saturating cast to u8's
    // value, in a form the compiler turns into vector code.
    let level = |p: u8, d: f32| ((p as f32 + d).clamp(0.0, 255.0) + 0.5) as i32 as u8;
    // Chroma samples whose blocks lie wholly in the change, then the ones at its edges.
    let (ix0, ix1) = (r.x0.div_ceil(2), r.x1 / 2);
    let (iy0, iy1) = (r.y0.div_ceil(2), r.y1 / 2);
    let mean_of = |sum: [f32; 3]| sum.map(|v| v / 4.0);
    let (k, luma_stride) = (rows[0], pic.stride(0));
    // Each row's luma, and once a pair of rows makes whole chroma blocks, both chroma planes'
    // samples of that pair while its rows are still in the cache: the change, a frame's worth
    // of floats under a large face, is read from memory once where a pass a plane read it
    // three times (the same operations on each value, so the same values).
    for y in r.y0..r.y1 {
        let dst = &mut pic.data_mut(0)[y * luma_stride + r.x0..][..r.x1 - r.x0];
        for (p, c) in dst.iter_mut().zip(row_of(y).chunks_exact(3)) {
            *p = level(*p, k[0] * c[0] + k[1] * c[1] + k[2] * c[2]);
        }
        let cy = y / 2;
        if y % 2 == 0 || !(iy0..iy1).contains(&cy) || ix0 >= ix1 {
            continue;
        }
        let off = (2 * ix0 - r.x0) * 3;
        let (top, bottom) = (&row_of(2 * cy)[off..], &row_of(2 * cy + 1)[off..]);
        for (plane, k) in [(1, rows[1]), (2, rows[2])] {
            let stride = pic.stride(plane);
            let dst = &mut pic.data_mut(plane)[cy * stride + ix0..][..ix1 - ix0];
            for ((p, t), b) in dst.iter_mut().zip(top.chunks_exact(6)).zip(bottom.chunks_exact(6)) {
                let m = mean_of(std::array::from_fn(|c| ((t[c] + t[3 + c]) + b[c]) + b[3 + c]));
                *p = level(*p, k[0] * m[0] + k[1] * m[1] + k[2] * m[2]);
            }
        }
    }
    let (cx0, cx1) = (r.x0 >> 1, r.x1.div_ceil(2));
    let (cy0, cy1) = (r.y0 >> 1, r.y1.div_ceil(2));
    let (us, vs) = (pic.stride(1), pic.stride(2));
    for cy in cy0..cy1 {
        let inner = (iy0..iy1).contains(&cy) && ix0 < ix1;
        let edge = (cx0..cx1).filter(|cx| !(inner && (ix0..ix1).contains(cx)));
        for cx in edge {
            let sum = block_sum(ch, r, (cx, cy), (2, 2));
            if sum == [0.0; 3] {
                continue;
            }
            let m = mean_of(sum);
            for (plane, stride, k) in [(1, us, &rows[1]), (2, vs, &rows[2])] {
                let at = &mut pic.data_mut(plane)[cy * stride + cx];
                *at = level(*at, k[0] * m[0] + k[1] * m[1] + k[2] * m[2]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The planes of an 8-bit 4:2:0 picture, owned by a test.
    struct Owned {
        planes: [Vec<u8>; 3],
        stride: [usize; 3],
        size: (usize, usize),
    }

    impl Owned {
        /// A `w x h` picture whose samples run through `low .. low + span` in a scattered
        /// pattern (the same in every call), its rows padded past their ends (strides that are
        /// not the planes' widths, as a decoder's are).
        fn yuv420p(w: usize, h: usize, span: usize, low: u8) -> Owned {
            let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
            let (stride, rows) = ([w + 13, cw + 7, cw + 9], [h, ch, ch]);
            let planes = std::array::from_fn(|p| {
                (0..stride[p] * rows[p])
                    .map(|i| ((i * 7919 + p * 31) % span) as u8 + low)
                    .collect()
            });
            Owned {
                planes,
                stride,
                size: (w, h),
            }
        }

        fn view(&self) -> Planes<'_> {
            Planes::new(self.planes.each_ref().map(|p| &p[..]), self.stride, self.size)
        }

        fn view_mut(&mut self) -> PlanesMut<'_> {
            PlanesMut::new(self.planes.each_mut().map(|p| &mut p[..]), self.stride, self.size)
        }
    }

    /// BT.601's red and blue luma weights.
    const KR_KB: (f32, f32) = (0.299, 0.114);

    /// YCbCr -> RGB factors for limited range (what `media::color`'s matrix gives).
    fn inverse() -> [f32; 5] {
        let (kr, kb) = KR_KB;
        let (kg, c) = (1.0 - kr - kb, 255.0 / 224.0);
        [
            255.0 / 219.0,
            2.0 * (1.0 - kr) * c,
            2.0 * kb * (1.0 - kb) / kg * c,
            2.0 * kr * (1.0 - kr) / kg * c,
            2.0 * (1.0 - kb) * c,
        ]
    }

    /// RGB -> YCbCr change rows for 8-bit limited range (what `media::color`'s matrix gives).
    fn change_rows() -> [[f32; 3]; 3] {
        let (kr, kb) = KR_KB;
        let kg = 1.0 - kr - kb;
        let (y, c) = (219.0 / 255.0, 224.0 / 255.0);
        let (cb, cr) = (c / (2.0 * (1.0 - kb)), c / (2.0 * (1.0 - kr)));
        [
            [y * kr, y * kg, y * kb],
            [-cb * kr, -cb * kg, cb * (1.0 - kb)],
            [cr * (1.0 - kr), -cr * kg, -cr * kb],
        ]
    }

    /// Region `r` of `yuv` as packed RGB24 rows laid into a whole picture's buffer.
    fn rgb_region(yuv: &Planes<'_>, r: Rect) -> Vec<u8> {
        let w = yuv.width();
        let mut rgb = vec![0u8; w * yuv.height() * 3];
        let Rect { x0, x1, .. } = r.clip(w, yuv.height());
        yuv420p_rgb_rows(yuv, inverse(), r, |y, row| {
            rgb[(y * w + x0) * 3..(y * w + x1) * 3].copy_from_slice(row);
        });
        rgb
    }

    fn region_conversion_at(w: usize, h: usize) {
        let pic = Owned::yuv420p(w, h, 241, 8);
        let yuv = pic.view();
        let per_pixel = |r: Rect| {
            let mut rgb = vec![0u8; w * h * 3];
            let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
            let (yp, up, vp) = (yuv.data(0), yuv.data(1), yuv.data(2));
            let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
            let [ky, kvr, kug, kvg, kub] = inverse();
            for y in r.y0..r.y1 {
                let cy = (y as f32 - 0.5) * 0.5;
                let cy0 = cy.floor().max(0.0) as usize;
                let cy1 = (cy0 + 1).min(ch - 1);
                let fy = (cy - cy0 as f32).clamp(0.0, 1.0);
                for x in r.x0..r.x1 {
                    let cx = x as f32 * 0.5;
                    let cx0 = cx as usize;
                    let cx1 = (cx0 + 1).min(cw - 1);
                    let fx = cx - cx0 as f32;
                    let bil = |p: &[u8], s: usize| {
                        let a = p[cy0 * s + cx0] as f32 + (p[cy0 * s + cx1] as f32 - p[cy0 * s + cx0] as f32) * fx;
                        let b = p[cy1 * s + cx0] as f32 + (p[cy1 * s + cx1] as f32 - p[cy1 * s + cx0] as f32) * fx;
                        a + (b - a) * fy - 128.0
                    };
                    let (d, e) = (bil(up, us), bil(vp, vs));
                    let c = ky * (yp[y * ys + x] as f32 - 16.0);
                    let px = &mut rgb[(y * w + x) * 3..(y * w + x) * 3 + 3];
                    px[0] = (c + kvr * e + 0.5).clamp(0.0, 255.0) as u8;
                    px[1] = (c - kug * d - kvg * e + 0.5).clamp(0.0, 255.0) as u8;
                    px[2] = (c + kub * d + 0.5).clamp(0.0, 255.0) as u8;
                }
            }
            rgb
        };
        for r in [
            Rect::new(0, 0, w, h),
            Rect::new(3, 2, 20, 15),
            Rect::new(8, 17, 37, 29),
            Rect::new(36, 28, 37, 29),
            Rect::new(w - 3, 0, w, h),
        ] {
            assert_eq!(rgb_region(&yuv, r), per_pixel(r), "{r:?}");
        }
    }

    /// The region converter interpolates each chroma row along x once and mixes two rows per
    /// luma row: exactly what interpolating every pixel on its own gives, for regions at every
    /// edge of an odd-sized picture.
    #[test]
    fn region_conversion_equals_the_per_pixel_formula() {
        // An odd and an even width: the last chroma column is its own next on the even one.
        for (w, h) in [(37usize, 29usize), (40, 30)] {
            region_conversion_at(w, h);
        }
    }

    /// The texels the crop warp reads straight from the planes are the region's levels, eight
    /// or four pixels at a time and the rest one by one, over the whole range (the clamps at
    /// both ends).
    #[test]
    fn texels_from_the_planes_are_the_regions_levels() {
        let (w, h) = (41usize, 23usize);
        let pic = Owned::yuv420p(w, h, 256, 0);
        let yuv = pic.view();
        let mut clamped = 0;
        for r in [
            Rect::new(0, 0, w, h),
            Rect::new(3, 2, 20, 15),
            Rect::new(5, 1, 10, 22),
            Rect::new(40, 22, 41, 23),
            Rect::new(1, 0, 8, 3),
        ] {
            let rgb = rgb_region(&yuv, r);
            let mut want = Vec::new();
            for y in r.y0..r.y1 {
                for p in rgb[(y * w + r.x0) * 3..(y * w + r.x1) * 3].chunks_exact(3) {
                    clamped += p.iter().filter(|&&v| v == 0 || v == 255).count();
                    want.push([p[0] as f32, p[1] as f32, p[2] as f32, 0.0]);
                }
            }
            for cpu in Cpu::available() {
                let mut got = vec![f32x4::splat(-1.0)];
                yuv420p_texels(cpu, &yuv, inverse(), r, &mut got);
                let got: Vec<[f32; 4]> = got[1..].iter().map(|t| t.to_array()).collect();
                assert_eq!(got, want, "{}: {r:?}", cpu.name());
            }
            // The plain rows too, where the CPU takes eight pixels at a time above.
            let mut plain = Vec::new();
            yuv420p_region_rows(&yuv, inverse(), r, |_, src| {
                let mut row = vec![MaybeUninit::new(f32x4::splat(-1.0)); src.luma.len()];
                src.texels(&mut row, 0);
                // SAFETY: every texel was made initialised above (and written again).
                plain.extend(row.into_iter().map(|t| unsafe { t.assume_init() }.to_array()));
            });
            assert_eq!(plain, want, "plain: {r:?}");
        }
        assert!(
            clamped > 100,
            "the picture reaches both ends of the range ({clamped} values)"
        );
    }

    /// The 4:2:0 form at every level this CPU runs adds what the general loop adds, sample for
    /// sample: changes at even and odd offsets, cut by the picture's edges, overlapping, zero in
    /// places, large enough to clamp at both ends, on an odd-sized picture.
    #[test]
    fn the_420_form_adds_what_the_general_loop_adds() {
        let (w, h) = (37usize, 23usize);
        let change = |rect: Rect, seed: usize| {
            let rgb: Vec<f32> = (0..rect.width() * rect.height() * 3)
                .map(|i| match (i * 31 + seed) % 7 {
                    0 => 0.0,
                    1 => 300.0,
                    2 => -300.0,
                    _ => ((i * 7919 + seed) % 97) as f32 * 0.37 - 18.0,
                })
                .collect();
            (rect, rgb)
        };
        let changes = [
            change(Rect::new(0, 0, 10, 8), 1),
            change(Rect::new(3, 5, 20, 18), 2),
            change(Rect::new(30, 15, 40, 30), 3),
            change(Rect::new(11, 1, 12, 2), 4),
            change(Rect::new(6, 9, 13, 16), 5),
        ];
        let views = || changes.iter().map(|(rect, rgb)| RgbChange { rect: *rect, rgb });
        let rows = change_rows();
        let base = Owned::yuv420p(w, h, 256, 0);
        let mut general = Owned::yuv420p(w, h, 256, 0);
        let mut planes = general.view_mut();
        for ch in views() {
            add_change_planar(&mut planes, Planar::YUV420P, ch, &rows);
        }
        for cpu in Cpu::available() {
            let mut at = Owned::yuv420p(w, h, 256, 0);
            let mut planes = at.view_mut();
            for ch in views() {
                add_change_420(cpu, &mut planes, ch, &rows);
            }
            assert!(at.planes == general.planes, "{}", cpu.name());
        }
        let moved: usize = (0..3)
            .map(|p| {
                let (a, b) = (&general.planes[p], &base.planes[p]);
                a.iter().zip(b).filter(|(a, b)| a != b).count()
            })
            .sum();
        assert!(moved > 300, "the changes moved {moved} samples");
        // Padding past each row's end is never written.
        for p in 0..3 {
            let (s, pw) = (general.stride[p], if p == 0 { w } else { w.div_ceil(2) });
            for (a, b) in general.planes[p].chunks(s).zip(base.planes[p].chunks(s)) {
                assert_eq!(a[pw..], b[pw..], "plane {p}'s padding");
            }
        }
    }
}
