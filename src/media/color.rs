//! Colour conversion: in, decoded pictures (FFmpeg frames) or packed RGB24 buffers; out, the
//! other form: whole pictures through swscale (set to the source's matrix and range), single
//! face regions of yuv420p pictures to RGB by hand, and the paste's RGB changes added to a
//! planar YUV picture at its own depth and chroma layout, so pixels the model did not change
//! are never converted at all.

use std::mem::MaybeUninit;

use anyhow::Result;
use ffmpeg::format::Pixel;
use ffmpeg::software::scaling::{Context as Scaler, Flags};
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg_next as ffmpeg;

use crate::frame::{Change, Frame, Picture};
use crate::geom::Rect;
use crate::kernels::Cpu;
use wide::f32x4;

/// The YCbCr matrix of a picture (limited range): what its stream says, else the usual
/// default by size (BT.709 for HD and larger, BT.601 below), the same both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Matrix {
    Bt601,
    Bt709,
    Bt2020,
}

impl Matrix {
    /// The matrix a stream tagged `space` (maybe unspecified) of `width x height` uses.
    pub(crate) fn from_tag(space: ffmpeg::color::Space, width: usize, height: usize) -> Self {
        use ffmpeg::color::Space;
        match space {
            Space::BT709 | Space::SMPTE240M => Matrix::Bt709,
            Space::BT2020NCL | Space::BT2020CL => Matrix::Bt2020,
            Space::BT470BG | Space::SMPTE170M | Space::FCC => Matrix::Bt601,
            _ if width >= 1280 || height > 576 => Matrix::Bt709,
            _ => Matrix::Bt601,
        }
    }

    /// The matrix of a decoded picture (its own tag and size).
    pub fn of(frame: &VideoFrame) -> Self {
        Self::from_tag(frame.color_space(), frame.width() as usize, frame.height() as usize)
    }

    /// Kr and Kb, the red and blue luma weights.
    fn weights(self) -> (f32, f32) {
        match self {
            Matrix::Bt601 => (0.299, 0.114),
            Matrix::Bt709 => (0.2126, 0.0722),
            Matrix::Bt2020 => (0.2627, 0.0593),
        }
    }

    /// Integer RGB -> YCbCr coefficients (x256) for limited range: Y, Cb and Cr rows (the
    /// tests' conversion back; the output adds changes with [`Matrix::change_rows`]).
    #[cfg(test)]
    fn forward(self) -> [[i32; 3]; 3] {
        let (kr, kb) = self.weights();
        let kg = 1.0 - kr - kb;
        let (y, c) = (219.0 / 255.0 * 256.0, 224.0 / 255.0 * 256.0);
        let (cb, cr) = (c / (2.0 * (1.0 - kb)), c / (2.0 * (1.0 - kr)));
        let r = |v: f32| v.round() as i32;
        [
            [r(y * kr), r(y * kg), r(y * kb)],
            [r(-cb * kr), r(-cb * kg), r(cb * (1.0 - kb))],
            [r(cr * (1.0 - kr)), r(-cr * kg), r(-cr * kb)],
        ]
    }

    /// YCbCr -> RGB factors for limited range: luma scale, Cr->R, Cb->G, Cr->G, Cb->B.
    fn inverse(self) -> [f32; 5] {
        let (kr, kb) = self.weights();
        let kg = 1.0 - kr - kb;
        let c = 255.0 / 224.0;
        [
            255.0 / 219.0,
            2.0 * (1.0 - kr) * c,
            2.0 * kb * (1.0 - kb) / kg * c,
            2.0 * kr * (1.0 - kr) / kg * c,
            2.0 * (1.0 - kb) * c,
        ]
    }
}

/// Converts `src` to packed RGB24 of `width x height` in `dst` (no row padding). swscale writes
/// into `tmp`, an FFmpeg frame with the aligned and padded rows its SIMD code may write past the
/// line end, and the rows are copied out: writing straight into a tight buffer corrupts memory
/// for widths whose rows are not a multiple of the vector size.
pub(crate) fn scale_packed(
    scaler: &mut Scaler,
    src: &VideoFrame,
    tmp: &mut VideoFrame,
    size: (usize, usize),
    dst: &mut Vec<u8>,
) -> Result<()> {
    scaler.run(src, tmp)?;
    copy_rows(tmp, size, dst);
    Ok(())
}

/// The `width x height` packed RGB24 rows of `tmp`, without its row padding, into `dst`.
fn copy_rows(tmp: &VideoFrame, (width, height): (usize, usize), dst: &mut Vec<u8>) {
    let (stride, data, row) = (tmp.stride(0), tmp.data(0), width * 3);
    dst.clear();
    dst.reserve(height * row);
    for y in 0..height {
        dst.extend_from_slice(&data[y * stride..y * stride + row]);
    }
}

/// A picture's conversion to packed RGB24, at its own size or another, through swscale
/// ([`scale_packed`]'s): on one thread, or with each picture's rows shared among `threads`
/// threads of swscale's own (its slice threading), for a conversion that would otherwise hold a
/// stage's one thread (the decode stage's on a host of many cores). Both give the same values.
pub(crate) enum ToRgb {
    One(Scaler),
    Sliced(Sliced),
}

/// An swscale context made with its `threads` option (see [`ToRgb`]), freed on drop.
pub(crate) struct Sliced {
    ctx: std::ptr::NonNull<ffmpeg::ffi::SwsContext>,
    dst: (Pixel, u32, u32),
}

// SAFETY: as for `SendScaler`: swscale keeps no thread-local state, and the context is only
// used through `&mut self` of its one owner (its slice threads are its own, joined in each call).
unsafe impl Send for Sliced {}

impl Drop for Sliced {
    fn drop(&mut self) {
        // SAFETY: the context was made by `sws_alloc_context` and is freed once, here.
        unsafe { ffmpeg::ffi::sws_freeContext(self.ctx.as_ptr()) }
    }
}

impl ToRgb {
    /// Converts `src` (`from`, `w x h`) to `to` at `dw x dh` with `flags`, on `threads` threads
    /// (1: the calling thread alone), set to `matrix` and `full` range towards RGB.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        (from, w, h): (Pixel, u32, u32),
        (to, dw, dh): (Pixel, u32, u32),
        flags: Flags,
        threads: usize,
        matrix: Matrix,
        full: bool,
    ) -> Result<Self> {
        if threads <= 1 {
            let mut s = Scaler::get(from, w, h, to, dw, dh, flags)?;
            set_matrix(&mut s, matrix, full, true);
            return Ok(ToRgb::One(s));
        }
        // SAFETY: a fresh context, given its options by name (each one swscale has, set to a
        // value of its type) before `sws_init_context`; freed on any failure.
        unsafe {
            use ffmpeg::ffi::{av_opt_set_int, av_opt_set_pixel_fmt, AVPixelFormat};
            let ctx = std::ptr::NonNull::new(ffmpeg::ffi::sws_alloc_context())
                .ok_or_else(|| anyhow::anyhow!("out of memory making a scaler"))?;
            let sliced = Sliced { ctx, dst: (to, dw, dh) };
            let p = ctx.as_ptr().cast::<std::ffi::c_void>();
            let mut ok = true;
            for (name, v) in [(c"srcw", w), (c"srch", h), (c"dstw", dw), (c"dsth", dh)] {
                ok &= av_opt_set_int(p, name.as_ptr(), i64::from(v), 0) >= 0;
            }
            ok &= av_opt_set_pixel_fmt(p, c"src_format".as_ptr(), AVPixelFormat::from(from), 0) >= 0;
            ok &= av_opt_set_pixel_fmt(p, c"dst_format".as_ptr(), AVPixelFormat::from(to), 0) >= 0;
            ok &= av_opt_set_int(p, c"sws_flags".as_ptr(), i64::from(flags.bits()), 0) >= 0;
            ok &= av_opt_set_int(p, c"threads".as_ptr(), threads as i64, 0) >= 0;
            if !ok || ffmpeg::ffi::sws_init_context(ctx.as_ptr(), std::ptr::null_mut(), std::ptr::null_mut()) < 0 {
                anyhow::bail!("swscale cannot convert {from:?} {w}x{h} to {to:?} {dw}x{dh} on {threads} threads");
            }
            set_matrix_of(ctx.as_ptr(), matrix, full, true);
            Ok(ToRgb::Sliced(sliced))
        }
    }

    /// [`scale_packed`] through this conversion.
    pub(crate) fn run(&mut self, src: &VideoFrame, tmp: &mut VideoFrame, dst: &mut Vec<u8>) -> Result<()> {
        match self {
            ToRgb::One(s) => {
                let (w, h) = (s.output().width as usize, s.output().height as usize);
                scale_packed(s, src, tmp, (w, h), dst)
            }
            ToRgb::Sliced(s) => {
                let (fmt, w, h) = s.dst;
                if tmp.format() != fmt || tmp.width() != w || tmp.height() != h {
                    *tmp = VideoFrame::new(fmt, w, h);
                }
                // SAFETY: both frames are valid; `tmp` has buffers of the context's output size
                // and format, which swscale writes (rows padded as FFmpeg allocates them).
                let r = unsafe { ffmpeg::ffi::sws_scale_frame(s.ctx.as_ptr(), tmp.as_mut_ptr(), src.as_ptr()) };
                if r < 0 {
                    return Err(ffmpeg::Error::from(r).into());
                }
                copy_rows(tmp, (w as usize, h as usize), dst);
                Ok(())
            }
        }
    }
}

/// An swscale context owned by one thread at a time. ffmpeg-next marks it `!Send` because it
/// holds a raw pointer, but libswscale keeps no thread-local state: moving it is sound as long as
/// it is never used from two threads at once, which ownership here guarantees.
pub(crate) struct SendScaler(pub Scaler);
// SAFETY: see above; the context is only ever used through `&mut self` of its single owner.
unsafe impl Send for SendScaler {}

/// Converts `input` into `output` (same size) with the scaler in `slot`, made on first use.
pub(crate) fn convert(
    slot: &mut Option<SendScaler>,
    from: Pixel,
    to: Pixel,
    input: &VideoFrame,
    output: &mut VideoFrame,
) -> Result<()> {
    let (w, h) = (input.width(), input.height());
    let scaler = match slot {
        Some(s) => s,
        None => slot.insert(SendScaler(Scaler::get(
            from,
            w,
            h,
            to,
            w,
            h,
            Flags::BILINEAR | Flags::ACCURATE_RND,
        )?)),
    };
    scaler.0.run(input, output)?;
    Ok(())
}

/// Converts one region of packed RGB24 back into a yuv420p picture (limited range, the picture's
/// [`Matrix`]: the inverse of [`yuv420p_to_rgb_region`]). The region is widened to even bounds so
/// every chroma sample it touches is recomputed from its four pixels. The output never takes this
/// way back (it adds the paste's changes to the source's planes: [`add_changes`]); the tests
/// use it to check the forward conversion.
/// Makes sure `f.rgb` holds the picture over `region` (plus a margin covering the even
/// widening the encoder applies when it converts the region back), for frames whose RGB is
/// filled region by region.
pub fn ensure_rgb(f: &mut Frame, region: Rect) {
    rgb_buffer(f);
    if let Some(src) = f.picture.partial_source() {
        let r = region.grown_even(2, f.width, f.height);
        yuv420p_to_rgb_region(src, &mut f.rgb, f.width, f.height, r);
    }
}

/// Gives a partial picture its whole-frame RGB buffer if it has none yet: fresh and zeroed
/// (the allocator's untouched zero pages, see `defaults::MMAP_THRESHOLD`), so a frame costs
/// resident memory only where its face regions are converted.
pub fn rgb_buffer(f: &mut Frame) {
    let n = f.width * f.height * 3;
    if f.rgb.len() != n && f.picture.partial_source().is_some() {
        f.rgb = vec![0; n];
    }
}

/// Takes `f.rgb` off the frame: a whole picture's buffer back to `pool` for the next frame, a
/// partial picture's (made for it, see [`rgb_buffer`]) freed, so its pages go back and no pool
/// keeps buffers that decoding never takes for a partial picture.
pub fn give_back_rgb(f: &mut Frame, pool: &crate::frame::Pool<Vec<u8>>) {
    let rgb = std::mem::take(&mut f.rgb);
    if f.picture.partial_source().is_none() {
        pool.put_vec(rgb);
    }
}

/// Makes `f.rgb` the whole picture and the output, dropping the decoded picture (a still
/// turned upright, a side-by-side view).
pub fn into_rgb(f: &mut Frame) {
    ensure_rgb(f, Rect::new(0, 0, f.width, f.height));
    f.picture = Picture::Rgb;
}

#[cfg(test)]
pub(crate) fn rgb_to_yuv420p_region(rgb: &[u8], width: usize, height: usize, yuv: &mut VideoFrame, r: Rect) {
    let Rect { x0, y0, x1, y1 } = r.even(width, height);
    let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
    let px = |x: usize, y: usize| {
        let i = (y * width + x) * 3;
        (rgb[i] as i32, rgb[i + 1] as i32, rgb[i + 2] as i32)
    };
    let [ly, lu, lv] = Matrix::of(yuv).forward();
    let luma = |(r, g, b): (i32, i32, i32)| (((ly[0] * r + ly[1] * g + ly[2] * b + 128) >> 8) + 16).clamp(0, 255) as u8;
    {
        let plane = yuv.data_mut(0);
        for y in y0..y1 {
            for x in x0..x1 {
                plane[y * ys + x] = luma(px(x, y));
            }
        }
    }
    for cy in (y0 / 2)..y1.div_ceil(2) {
        for cx in (x0 / 2)..x1.div_ceil(2) {
            let (mut sr, mut sg, mut sb, mut n) = (0, 0, 0, 0);
            for (x, y) in [
                (2 * cx, 2 * cy),
                (2 * cx + 1, 2 * cy),
                (2 * cx, 2 * cy + 1),
                (2 * cx + 1, 2 * cy + 1),
            ] {
                if x < width && y < height {
                    let (r, g, b) = px(x, y);
                    (sr, sg, sb, n) = (sr + r, sg + g, sb + b, n + 1);
                }
            }
            let (r, g, b) = ((sr + n / 2) / n, (sg + n / 2) / n, (sb + n / 2) / n);
            let u = (((lu[0] * r + lu[1] * g + lu[2] * b + 128) >> 8) + 128).clamp(0, 255) as u8;
            let v = (((lv[0] * r + lv[1] * g + lv[2] * b + 128) >> 8) + 128).clamp(0, 255) as u8;
            yuv.data_mut(1)[cy * us + cx] = u;
            yuv.data_mut(2)[cy * vs + cx] = v;
        }
    }
}

/// Converts one region of a yuv420p picture to packed RGB24 (limited range, the picture's
/// [`Matrix`], chroma interpolated bilinearly with MPEG-2 siting): the inverse of [`rgb_to_yuv420p_region`], used
/// so only face regions are ever converted.
pub(crate) fn yuv420p_to_rgb_region(yuv: &VideoFrame, rgb: &mut [u8], width: usize, height: usize, r: Rect) {
    let Rect { x0, x1, .. } = r.clip(width, height);
    yuv420p_rgb_rows(yuv, (width, height), r, |y, row| {
        rgb[(y * width + x0) * 3..(y * width + x1) * 3].copy_from_slice(row);
    });
}

/// Converts region `r` of a yuv420p picture of `width x height` as [`yuv420p_to_rgb_region`]
/// does, handing each row of packed RGB24 to `row` (its y, then its bytes), top to bottom.
pub(crate) fn yuv420p_rgb_rows(
    yuv: &VideoFrame,
    (width, height): (usize, usize),
    r: Rect,
    mut row: impl FnMut(usize, &[u8]),
) {
    let mut out = Vec::new();
    yuv420p_region_rows(yuv, (width, height), r, |y, src| {
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

/// Appends region `r` of a yuv420p picture of `width x height` to `out` as texels, row by row
/// (R, G, B, 0 in f32: the levels [`yuv420p_rgb_rows`] gives, what the crop warp reads), eight
/// pixels at a time with AVX2 and four without, with no packed RGB row between.
pub(crate) fn yuv420p_texels(
    cpu: Cpu,
    yuv: &VideoFrame,
    (width, height): (usize, usize),
    r: Rect,
    out: &mut Vec<f32x4>,
) {
    #[cfg(target_arch = "x86_64")]
    let eight = cpu.avx2();
    yuv420p_region_rows(yuv, (width, height), r, |_, src| {
        let (start, n) = (out.len(), src.luma.len());
        // Written in place of the row's texels, not zeroed first (that doubled the stores).
        out.reserve(n);
        let dst = &mut out.spare_capacity_mut()[..n];
        #[allow(unused_mut)]
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if eight {
            // SAFETY: the CPU has AVX2 (checked once above).
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

/// Walks region `r` of a yuv420p picture of `width x height` row by row, top to bottom, handing
/// each luma row with its chroma to `each` (its y, then the row).
fn yuv420p_region_rows(
    yuv: &VideoFrame,
    (width, height): (usize, usize),
    r: Rect,
    mut each: impl FnMut(usize, &RegionRow<'_>),
) {
    let Rect { x0, y0, x1, y1 } = r.clip(width, height);
    if x0 >= x1 || y0 >= y1 {
        return;
    }
    let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
    let (yp, up, vp) = (yuv.data(0), yuv.data(1), yuv.data(2));
    let (cw, ch) = (width.div_ceil(2), height.div_ceil(2));
    let k = Matrix::of(yuv).inverse();
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

/// A YUV layout whose planes the output is made from (see [`add_changes`]): the chroma planes'
/// subsampling as shifts, the bits per sample (8, or 10 and 12 in 16-bit words, stored `shift`
/// bits up), and whether Cb and Cr share one interleaved plane (NV12 and P010, what GPU decoders
/// give).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planar {
    pub hshift: u32,
    pub vshift: u32,
    pub bits: u32,
    pub shift: u32,
    pub interleaved: bool,
}

impl Planar {
    /// The layout of `fmt`, if it is one of the 4:2:0, 4:2:2 or 4:4:4 formats handled.
    pub fn of(fmt: Pixel) -> Option<Planar> {
        use Pixel as P;
        let (hshift, vshift, bits) = match fmt {
            P::YUV420P | P::YUVJ420P | P::NV12 => (1, 1, 8),
            P::YUV422P | P::YUVJ422P => (1, 0, 8),
            P::YUV444P | P::YUVJ444P => (0, 0, 8),
            P::YUV420P10LE | P::P010LE => (1, 1, 10),
            P::YUV422P10LE => (1, 0, 10),
            P::YUV444P10LE => (0, 0, 10),
            P::YUV420P12LE => (1, 1, 12),
            P::YUV422P12LE => (1, 0, 12),
            P::YUV444P12LE => (0, 0, 12),
            _ => return None,
        };
        let interleaved = matches!(fmt, P::NV12 | P::P010LE);
        let shift = if fmt == P::P010LE { 6 } else { 0 };
        Some(Planar {
            hshift,
            vshift,
            bits,
            shift,
            interleaved,
        })
    }
}

/// Whether a picture's YUV is full range (JPEG levels): its tag, or a yuvj format.
pub(crate) fn is_full_range(frame: &VideoFrame) -> bool {
    frame.color_range() == ffmpeg::color::Range::JPEG
        || matches!(frame.format(), Pixel::YUVJ420P | Pixel::YUVJ422P | Pixel::YUVJ444P)
}

impl Matrix {
    /// Linear RGB -> YCbCr rows (no offsets) for changes: a change of one level of R, G or B
    /// becomes this change of Y, Cb and Cr samples of a `bits` deep picture, limited or `full`
    /// range.
    fn change_rows(self, bits: u32, full: bool) -> [[f32; 3]; 3] {
        let (kr, kb) = self.weights();
        let kg = 1.0 - kr - kb;
        let depth = (1u32 << (bits - 8)) as f32;
        let (y, c) = if full {
            (depth, depth)
        } else {
            (219.0 / 255.0 * depth, 224.0 / 255.0 * depth)
        };
        let (cb, cr) = (c / (2.0 * (1.0 - kb)), c / (2.0 * (1.0 - kr)));
        [
            [y * kr, y * kg, y * kb],
            [-cb * kr, -cb * kg, cb * (1.0 - kb)],
            [cr * (1.0 - kr), -cr * kg, -cr * kb],
        ]
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

/// Whether no one else holds `pic`'s buffers (the decoder keeps a reference picture's while it
/// decodes the pictures that refer to it): only then may its planes be written. Once true it
/// stays true (a decoder never takes a picture back).
pub(crate) fn writable(pic: &mut VideoFrame) -> bool {
    // SAFETY: `pic` is a valid frame we own; the call only reads its buffers' reference counts.
    unsafe { ffmpeg::ffi::av_frame_is_writable(pic.as_mut_ptr()) > 0 }
}

/// Adds the paste's RGB `changes` to a YUV picture in place, at its own depth, chroma layout,
/// range and [`Matrix`]: each luma sample takes its pixel's change, each chroma sample the mean
/// change over the pixels it covers. Samples whose change is under half a step keep their
/// values exactly. Returns false (and changes nothing) for a format [`Planar`] does not describe.
pub(crate) fn add_changes(pic: &mut VideoFrame, changes: &[Change]) -> bool {
    let Some(layout) = Planar::of(pic.format()) else {
        return false;
    };
    let Planar {
        hshift,
        vshift,
        bits,
        shift,
        interleaved,
    } = layout;
    let (width, height) = (pic.width() as usize, pic.height() as usize);
    let rows = Matrix::of(pic).change_rows(bits, is_full_range(pic));
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
    // 8-bit 4:2:0 in three planes (what decoders give most videos): a form without the
    // per-sample checks, the same values.
    if layout == Planar::of(Pixel::YUV420P).expect("a planar layout") && !GENERAL_ADD.get() {
        for ch in changes {
            add_change_420(Cpu::detected(), pic, ch, &rows);
        }
        return true;
    }
    for ch in changes {
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
    true
}

/// The sum of change `ch` over the pixels of chroma sample (cx, cy) (blocks of `bw x bh`
/// pixels) that lie in `r` (the change clipped to the picture), row by row.
fn block_sum(ch: &Change, r: Rect, (cx, cy): (usize, usize), (bw, bh): (usize, usize)) -> [f32; 3] {
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

thread_local! {
    /// Takes every layout through the general loop of [`add_changes`] (the tests' reference for
    /// the 4:2:0 form).
    static GENERAL_ADD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`add_changes`] of one change to an 8-bit 4:2:0 picture in three planes, with `rows` its
/// matrix's rows: each luma row's samples in one loop without branches (a change under half a
/// level leaves a sample as it was either way: `(p + d + 0.5)` truncated is `p`), each chroma
/// sample whose 2 x 2 pixels all lie in the change from their sum in the same order; chroma
/// samples at the change's edges (pixels outside it changed by zero) as the general loop does.
fn add_change_420(cpu: Cpu, pic: &mut VideoFrame, ch: &Change, rows: &[[f32; 3]; 3]) {
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
unsafe fn add_change_420_avx2(pic: &mut VideoFrame, ch: &Change, rows: &[[f32; 3]; 3]) {
    add_change_420_body(pic, ch, rows)
}

/// The body of [`add_change_420`].
#[inline(always)]
fn add_change_420_body(pic: &mut VideoFrame, ch: &Change, rows: &[[f32; 3]; 3]) {
    let (width, height) = (pic.width() as usize, pic.height() as usize);
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

/// Sets a scaler between YUV and RGB to the YUV side's `matrix` and range (`full` or limited;
/// swscale otherwise assumes BT.601 whatever the stream says), `to_rgb` the direction.
pub(crate) fn set_matrix(scaler: &mut Scaler, matrix: Matrix, full: bool, to_rgb: bool) {
    // SAFETY: the scaler is a live context we own.
    set_matrix_of(unsafe { scaler.as_mut_ptr() }, matrix, full, to_rgb);
}

/// [`set_matrix`] for the live swscale context `ctx`.
fn set_matrix_of(ctx: *mut ffmpeg::ffi::SwsContext, matrix: Matrix, full: bool, to_rgb: bool) {
    let cs = match matrix {
        Matrix::Bt601 => ffmpeg::ffi::SWS_CS_ITU601,
        Matrix::Bt709 => ffmpeg::ffi::SWS_CS_ITU709,
        Matrix::Bt2020 => ffmpeg::ffi::SWS_CS_BT2020,
    };
    // The RGB side's range flag stays 0: swscale's tables already map to and from full-range
    // RGB, and a 1 there adds a second range conversion.
    let full = i32::from(full);
    let (src_range, dst_range) = if to_rgb { (full, 0) } else { (0, full) };
    // SAFETY: `ctx` is a live context we own; the table is FFmpeg's static coefficients for a
    // valid colour space constant, read (not kept) by the call.
    unsafe {
        let table = ffmpeg::ffi::sws_getCoefficients(cs);
        ffmpeg::ffi::sws_setColorspaceDetails(ctx, table, src_range, table, dst_range, 0, 1 << 16, 1 << 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A yuv420p picture of flat 8x8 patches, luma and chroma constant over each patch, all inside
    /// the RGB gamut (so a round trip through RGB has nothing to clip).
    fn patches(w: usize, h: usize) -> VideoFrame {
        crate::init_ffmpeg();
        let mut f = VideoFrame::new(Pixel::YUV420P, w as u32, h as u32);
        let (ys, us, vs) = (f.stride(0), f.stride(1), f.stride(2));
        let patch = |x: usize, y: usize| (x / 8 + 3 * (y / 8)) as u8;
        for y in 0..h {
            for x in 0..w {
                f.data_mut(0)[y * ys + x] = 80 + patch(x, y).wrapping_mul(37) % 100;
            }
        }
        for y in 0..h / 2 {
            for x in 0..w / 2 {
                let p = patch(2 * x, 2 * y);
                f.data_mut(1)[y * us + x] = 108 + p.wrapping_mul(53) % 40;
                f.data_mut(2)[y * vs + x] = 108 + p.wrapping_mul(29) % 40;
            }
        }
        f
    }

    #[test]
    fn yuv_to_rgb_and_back_keeps_flat_patches_within_a_level() {
        let (w, h) = (64, 48);
        let src = patches(w, h);
        let mut rgb = vec![0u8; w * h * 3];
        yuv420p_to_rgb_region(&src, &mut rgb, w, h, Rect::new(0, 0, w, h));
        let mut back = patches(w, h);
        // Start from a different picture, so only what the conversion writes is compared.
        for p in 0..3 {
            back.data_mut(p).fill(0);
        }
        rgb_to_yuv420p_region(&rgb, w, h, &mut back, Rect::new(0, 0, w, h));
        let mut worst = 0i32;
        for y in 0..h {
            for x in 0..w {
                // Patch interiors: chroma interpolation mixes neighbours at patch edges.
                if x % 8 < 2 || x % 8 > 5 || y % 8 < 2 || y % 8 > 5 {
                    continue;
                }
                let d = src.data(0)[y * src.stride(0) + x] as i32 - back.data(0)[y * back.stride(0) + x] as i32;
                worst = worst.max(d.abs());
                let (cx, cy) = (x / 2, y / 2);
                for p in 1..3 {
                    let d = src.data(p)[cy * src.stride(p) + cx] as i32 - back.data(p)[cy * back.stride(p) + cx] as i32;
                    worst = worst.max(d.abs());
                }
            }
        }
        assert!(worst <= 1, "round trip moved a sample by {worst} levels");
    }

    #[test]
    fn matrices_follow_the_tag_then_the_size_and_bt601_keeps_its_integers() {
        use ffmpeg::color::Space;
        assert_eq!(
            Matrix::Bt601.forward(),
            [[66, 129, 25], [-38, -74, 112], [112, -94, -18]]
        );
        let inv = Matrix::Bt601.inverse();
        assert!((inv[1] - 1.596_026_8).abs() < 1e-4 && (inv[4] - 2.017_232_2).abs() < 1e-4);
        assert_eq!(Matrix::from_tag(Space::Unspecified, 1920, 1080), Matrix::Bt709);
        assert_eq!(Matrix::from_tag(Space::Unspecified, 640, 360), Matrix::Bt601);
        assert_eq!(Matrix::from_tag(Space::BT470BG, 1920, 1080), Matrix::Bt601);
        assert_eq!(Matrix::from_tag(Space::BT709, 640, 360), Matrix::Bt709);
        assert_eq!(Matrix::from_tag(Space::BT2020NCL, 3840, 2160), Matrix::Bt2020);
    }

    #[test]
    fn rgb_to_yuv_and_back_keeps_known_colours() {
        let (w, h) = (16, 16);
        let colours = [
            [0u8, 0, 0],
            [255, 255, 255],
            [128, 128, 128],
            [200, 40, 30],
            [30, 160, 60],
            [40, 60, 210],
        ];
        for c in colours {
            let rgb: Vec<u8> = (0..w * h).flat_map(|_| c).collect();
            let mut yuv = patches(w, h);
            rgb_to_yuv420p_region(&rgb, w, h, &mut yuv, Rect::new(0, 0, w, h));
            let mut back = vec![0u8; w * h * 3];
            yuv420p_to_rgb_region(&yuv, &mut back, w, h, Rect::new(0, 0, w, h));
            for px in back.chunks_exact(3) {
                for k in 0..3 {
                    assert!((px[k] as i32 - c[k] as i32).abs() <= 3, "{c:?} came back as {px:?}");
                }
            }
        }
    }

    #[test]
    fn region_conversions_touch_only_their_region() {
        let (w, h) = (40, 30);
        let mut yuv = patches(w, h);
        let before = (0..3).map(|p| yuv.data(p).to_vec()).collect::<Vec<_>>();
        let rgb = vec![250u8; w * h * 3];
        let r = Rect::new(9, 7, 21, 17);
        rgb_to_yuv420p_region(&rgb, w, h, &mut yuv, r);
        let even = r.even(w, h);
        for y in 0..h {
            for x in 0..w {
                let inside = (even.x0..even.x1).contains(&x) && (even.y0..even.y1).contains(&y);
                let i = y * yuv.stride(0) + x;
                assert_eq!(yuv.data(0)[i] != before[0][i], inside, "luma at ({x}, {y})");
            }
        }
        let mut out = vec![7u8; w * h * 3];
        yuv420p_to_rgb_region(&yuv, &mut out, w, h, r);
        let touched = out
            .chunks_exact(3)
            .filter(|p| p[0] != 7 || p[1] != 7 || p[2] != 7)
            .count();
        assert_eq!(touched, r.width() * r.height());
    }

    /// The region converter interpolates each chroma row along x once and mixes two rows per
    /// luma row: exactly what interpolating every pixel on its own gives, for regions at every
    /// edge of an odd-sized picture.
    #[test]
    fn region_conversion_equals_the_per_pixel_formula() {
        crate::init_ffmpeg();
        // An odd and an even width: the last chroma column is its own next on the even one.
        for (w, h) in [(37usize, 29usize), (40, 30)] {
            region_conversion_at(w, h);
        }
    }

    /// A yuv420p picture `w x h` whose samples run through `low .. low + span` in a scattered
    /// pattern (the same in every call).
    fn patterned(w: usize, h: usize, span: usize, low: u8) -> VideoFrame {
        crate::init_ffmpeg();
        let mut yuv = VideoFrame::new(Pixel::YUV420P, w as u32, h as u32);
        for plane in 0..3 {
            let n = yuv.data(plane).len();
            for (i, v) in yuv.data_mut(plane)[..n].iter_mut().enumerate() {
                *v = ((i * 7919 + plane * 31) % span) as u8 + low;
            }
        }
        yuv
    }

    /// A conversion shared among swscale's threads is the one-thread conversion byte for byte:
    /// the detection copy from 1080p and 720p to the detector's 640 x 360 and at a size of no
    /// whole ratio, a whole picture's RGB at its own size, both matrices and both ranges; from
    /// NV12 (what NVDEC gives) and 10-bit 4:2:0 too.
    #[test]
    fn a_conversion_on_several_threads_is_the_one_thread_conversion() {
        // The detection copy (area) and a whole picture's RGB at its own size (bilinear).
        let sizes = [
            ((1920, 1080), (640, 360), Flags::AREA),
            ((1280, 720), (640, 360), Flags::AREA),
            ((1000, 562), (333, 187), Flags::AREA),
            ((1920, 1080), (1920, 1080), Flags::BILINEAR),
            ((1000, 562), (1000, 562), Flags::BILINEAR),
        ];
        for fmt in [Pixel::YUV420P, Pixel::NV12, Pixel::YUV420P10LE] {
            for ((w, h), (dw, dh), flags) in sizes {
                let mut yuv = patterned(w, h, 219, 16);
                if fmt != Pixel::YUV420P {
                    let mut other = VideoFrame::empty();
                    convert(&mut None, Pixel::YUV420P, fmt, &yuv, &mut other).expect("swscale converts 4:2:0");
                    yuv = other;
                }
                for (matrix, full) in [(Matrix::Bt709, false), (Matrix::Bt601, true)] {
                    let converted = |threads| {
                        let mut s = ToRgb::new(
                            (fmt, w as u32, h as u32),
                            (Pixel::RGB24, dw, dh),
                            flags,
                            threads,
                            matrix,
                            full,
                        )
                        .expect("a conversion swscale makes");
                        assert_eq!(matches!(s, ToRgb::Sliced(_)), threads > 1);
                        let (mut tmp, mut out) = (VideoFrame::empty(), Vec::new());
                        // Twice: the second picture reuses the first's buffers.
                        for _ in 0..2 {
                            s.run(&yuv, &mut tmp, &mut out).expect("the conversion runs");
                        }
                        out
                    };
                    let one = converted(1);
                    assert_eq!(one.len(), (dw * dh * 3) as usize);
                    for threads in [2, 4] {
                        let what = format!("{fmt:?} {w}x{h} to {dw}x{dh}, {matrix:?} full {full}, {threads} threads");
                        assert!(one == converted(threads), "{what}");
                    }
                }
            }
        }
    }

    fn region_conversion_at(w: usize, h: usize) {
        let yuv = patterned(w, h, 241, 8);
        let per_pixel = |r: Rect| {
            let mut rgb = vec![0u8; w * h * 3];
            let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
            let (yp, up, vp) = (yuv.data(0), yuv.data(1), yuv.data(2));
            let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
            let [ky, kvr, kug, kvg, kub] = Matrix::of(&yuv).inverse();
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
            let mut got = vec![0u8; w * h * 3];
            yuv420p_to_rgb_region(&yuv, &mut got, w, h, r);
            assert_eq!(got, per_pixel(r), "{r:?}");
        }
    }

    /// The 4:2:0 form adds what the general loop adds, sample for sample: changes at even and
    /// odd offsets, cut by the picture's edges, overlapping, zero in places, large enough to
    /// clamp at both ends, on an odd-sized picture.
    #[test]
    fn the_420_form_adds_what_the_general_loop_adds() {
        crate::init_ffmpeg();
        let (w, h) = (37usize, 23usize);
        let base = patterned(w, h, 256, 0);
        let change = |rect: Rect, seed: usize| Change {
            rect,
            rgb: (0..rect.width() * rect.height() * 3)
                .map(|i| match (i * 31 + seed) % 7 {
                    0 => 0.0,
                    1 => 300.0,
                    2 => -300.0,
                    _ => ((i * 7919 + seed) % 97) as f32 * 0.37 - 18.0,
                })
                .collect(),
        };
        let changes = [
            change(Rect::new(0, 0, 10, 8), 1),
            change(Rect::new(3, 5, 20, 18), 2),
            change(Rect::new(30, 15, 40, 30), 3),
            change(Rect::new(11, 1, 12, 2), 4),
            change(Rect::new(6, 9, 13, 16), 5),
        ];
        let (mut fast, mut general) = (patterned(w, h, 256, 0), patterned(w, h, 256, 0));
        assert!(add_changes(&mut fast, &changes));
        GENERAL_ADD.set(true);
        assert!(add_changes(&mut general, &changes));
        GENERAL_ADD.set(false);
        // The 4:2:0 form at every level this CPU runs gives the general loop's planes.
        for cpu in Cpu::available() {
            let mut at = patterned(w, h, 256, 0);
            let rows = Matrix::of(&at).change_rows(8, is_full_range(&at));
            for ch in &changes {
                add_change_420(cpu, &mut at, ch, &rows);
            }
            for plane in 0..3 {
                assert_eq!(at.data(plane), general.data(plane), "{}: plane {plane}", cpu.name());
            }
        }
        let mut moved = 0;
        for plane in 0..3 {
            assert_eq!(fast.data(plane), general.data(plane), "plane {plane}");
            moved += fast
                .data(plane)
                .iter()
                .zip(base.data(plane))
                .filter(|(a, b)| a != b)
                .count();
        }
        assert!(moved > 300, "the changes moved {moved} samples");
    }

    /// The texels the crop warp reads straight from the planes are the region's levels, eight
    /// or four pixels at a time and the rest one by one, over the whole range (the clamps at
    /// both ends).
    #[test]
    fn texels_from_the_planes_are_the_regions_levels() {
        crate::init_ffmpeg();
        let (w, h) = (41usize, 23usize);
        let yuv = patterned(w, h, 256, 0);
        let mut clamped = 0;
        for r in [
            Rect::new(0, 0, w, h),
            Rect::new(3, 2, 20, 15),
            Rect::new(5, 1, 10, 22),
            Rect::new(40, 22, 41, 23),
            Rect::new(1, 0, 8, 3),
        ] {
            let mut rgb = vec![0u8; w * h * 3];
            yuv420p_to_rgb_region(&yuv, &mut rgb, w, h, r);
            let mut want = Vec::new();
            for y in r.y0..r.y1 {
                for p in rgb[(y * w + r.x0) * 3..(y * w + r.x1) * 3].chunks_exact(3) {
                    clamped += p.iter().filter(|&&v| v == 0 || v == 255).count();
                    want.push([p[0] as f32, p[1] as f32, p[2] as f32, 0.0]);
                }
            }
            for cpu in Cpu::available() {
                let mut got = vec![f32x4::splat(-1.0)];
                yuv420p_texels(cpu, &yuv, (w, h), r, &mut got);
                let got: Vec<[f32; 4]> = got[1..].iter().map(|t| t.to_array()).collect();
                assert_eq!(got, want, "{}: {r:?}", cpu.name());
            }
            // The plain rows too, where the CPU takes eight pixels at a time above.
            let mut plain = Vec::new();
            yuv420p_region_rows(&yuv, (w, h), r, |_, src| {
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

    /// A picture of `fmt` with every chroma sample at the mid value and a little texture on
    /// luma, at the format's depth.
    fn flat(fmt: Pixel, w: usize, h: usize, space: ffmpeg::color::Space) -> VideoFrame {
        crate::init_ffmpeg();
        let mut f = VideoFrame::new(fmt, w as u32, h as u32);
        f.set_color_space(space);
        let p = Planar::of(fmt).unwrap();
        let (cw, chh) = (w.div_ceil(1 << p.hshift), h.div_ceil(1 << p.vshift));
        for (plane, c) in [(0, false), (1, true), (2, true)] {
            if p.interleaved && plane == 2 {
                continue;
            }
            for y in 0..if c { chh } else { h } {
                for x in 0..if !c {
                    w
                } else if p.interleaved {
                    2 * cw
                } else {
                    cw
                } {
                    let v = if c { 128 } else { 100 + ((x * 7 + y * 3) % 11) as u32 };
                    set(&mut f, plane, x, y, v << (p.bits - 8));
                }
            }
        }
        f
    }

    fn set(f: &mut VideoFrame, plane: usize, x: usize, y: usize, v: u32) {
        let (s, p) = (f.stride(plane), Planar::of(f.format()).unwrap());
        if p.bits > 8 {
            f.data_mut(plane)[y * s + 2 * x..][..2].copy_from_slice(&((v as u16) << p.shift).to_le_bytes());
        } else {
            f.data_mut(plane)[y * s + x] = v as u8;
        }
    }

    /// Sample `x` of row `y` of component `comp` (0 Y, 1 Cb, 2 Cr), wherever the layout keeps it.
    fn sample(f: &VideoFrame, comp: usize, x: usize, y: usize) -> i32 {
        let p = Planar::of(f.format()).unwrap();
        let (plane, x) = match (comp, p.interleaved) {
            (0, _) => (0, x),
            (c, true) => (1, 2 * x + c - 1),
            (c, false) => (c, x),
        };
        let s = f.stride(plane);
        if p.bits > 8 {
            (u16::from_le_bytes([f.data(plane)[y * s + 2 * x], f.data(plane)[y * s + 2 * x + 1]]) >> p.shift) as i32
        } else {
            f.data(plane)[y * s + x] as i32
        }
    }

    /// The planes path: no change keeps every sample; a grey change moves luma only, by the
    /// format's scale; a red one raises Cr and lowers Cb; samples away from the region keep
    /// their values; for 4:2:0, 4:2:2 and 4:4:4 at 8 and 10 bits, planar and interleaved.
    #[test]
    fn changes_are_added_at_the_pictures_depth_layout_and_matrix() {
        use ffmpeg::color::Space;
        let (w, h) = (24, 16);
        let r = Rect::new(4, 2, 12, 10);
        let change = |rgb: [f32; 3]| Change {
            rect: r,
            rgb: rgb.repeat(r.width() * r.height()),
        };
        for fmt in [
            Pixel::YUV420P,
            Pixel::YUV422P10LE,
            Pixel::YUV444P,
            Pixel::YUV420P10LE,
            Pixel::NV12,
            Pixel::P010LE,
        ] {
            let bits = Planar::of(fmt).unwrap().bits;
            let k = (1 << (bits - 8)) as f32;
            let before = flat(fmt, w, h, Space::BT709);
            let mut pic = flat(fmt, w, h, Space::BT709);
            assert!(add_changes(&mut pic, &[change([0.0; 3])]));
            let p = Planar::of(fmt).unwrap();
            for (plane, sh) in [(0, (0, 0)), (1, (p.hshift, p.vshift)), (2, (p.hshift, p.vshift))] {
                for y in 0..h >> sh.1 {
                    for x in 0..w >> sh.0 {
                        assert_eq!(
                            sample(&pic, plane, x, y),
                            sample(&before, plane, x, y),
                            "{fmt:?}: a zero change moved plane {plane}"
                        );
                    }
                }
            }
            assert!(add_changes(&mut pic, &[change([40.0; 3])]));
            let dy = (40.0 * 219.0 / 255.0 * k).round() as i32;
            for y in 0..h {
                for x in 0..w {
                    let inside = (r.x0..r.x1).contains(&x) && (r.y0..r.y1).contains(&y);
                    let want = sample(&before, 0, x, y) + if inside { dy } else { 0 };
                    assert_eq!(sample(&pic, 0, x, y), want, "{fmt:?} luma ({x}, {y})");
                }
            }
            assert_eq!(
                sample(&pic, 1, 3, 3),
                sample(&before, 1, 3, 3),
                "{fmt:?}: grey moved chroma"
            );
            let mut red = flat(fmt, w, h, Space::BT709);
            add_changes(&mut red, &[change([40.0, 0.0, 0.0])]);
            let (cb, cr) = (
                sample(&red, 1, 4, 3) - (128 << (bits - 8)),
                sample(&red, 2, 4, 3) - (128 << (bits - 8)),
            );
            // BT.709: Cr = 0.5 R' - ..., so +40 of red is +40 * 0.5 / (1 - 0.2126) * 224 / 255.
            let want_cr = (40.0 * 0.5 * 224.0 / 255.0 * k).round() as i32;
            assert!(
                (cr - want_cr).abs() <= 1 && cb < 0,
                "{fmt:?}: Cb {cb}, Cr {cr} (want {want_cr})"
            );
            let (lx, ly) = ((w - 1) >> p.hshift, (h - 1) >> p.vshift);
            assert_eq!(
                sample(&red, 2, lx, ly),
                sample(&before, 2, lx, ly),
                "{fmt:?}: chroma away from the region"
            );
        }
        let mut rgb = VideoFrame::new(Pixel::RGB24, 8, 8);
        assert!(!add_changes(&mut rgb, &[]), "not a planar YUV picture");
    }
}
