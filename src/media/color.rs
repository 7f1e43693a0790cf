//! Colour conversion: in, decoded pictures (FFmpeg frames) or packed RGB24 buffers; out, the
//! other form: whole pictures through swscale (set to the source's matrix and range), single
//! face regions of yuv420p pictures to RGB by hand, and the paste's RGB changes added to a
//! planar YUV picture at its own depth and chroma layout, so pixels the model did not change
//! are never converted at all. The policy and the FFmpeg side live here (a picture's [`Matrix`]
//! and range, its format's layout, the scalers); the conversions by hand are kernels over plane
//! views (`crate::kernels::yuv`), which this module makes from a frame's planes.

use anyhow::Result;
use ffmpeg::format::Pixel;
use ffmpeg::software::scaling::{Context as Scaler, Flags};
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg_next as ffmpeg;

use crate::frame::{Change, Frame, Picture};
use crate::geom::Rect;
use crate::kernels::yuv::{self, Planes, PlanesMut, RgbChange};
use crate::kernels::Cpu;
use wide::f32x4;

pub(crate) use crate::kernels::yuv::Planar;

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
    pub(crate) fn of(frame: &VideoFrame) -> Self {
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
/// ([`ToRgb::run`]'s): on one thread, or with each picture's rows shared among `threads`
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

    /// Converts `src` to packed RGB24 in `dst` (no row padding). swscale writes into `tmp`, an
    /// FFmpeg frame with the aligned and padded rows its SIMD code may write past the line end,
    /// and the rows are copied out: writing straight into a tight buffer corrupts memory for
    /// widths whose rows are not a multiple of the vector size.
    pub(crate) fn run(&mut self, src: &VideoFrame, tmp: &mut VideoFrame, dst: &mut Vec<u8>) -> Result<()> {
        self.run_into(src, tmp)?;
        let size = (tmp.width() as usize, tmp.height() as usize);
        copy_rows(tmp, size, dst);
        Ok(())
    }

    /// Converts `src` into the frame `out` (made or remade at this conversion's output size and
    /// format where it is not), rows padded as FFmpeg allocates them: a picture for a next step.
    pub(crate) fn run_into(&mut self, src: &VideoFrame, out: &mut VideoFrame) -> Result<()> {
        let (fmt, w, h) = match self {
            ToRgb::One(s) => (s.output().format, s.output().width, s.output().height),
            ToRgb::Sliced(s) => s.dst,
        };
        if out.format() != fmt || out.width() != w || out.height() != h {
            *out = VideoFrame::new(fmt, w, h);
        }
        match self {
            ToRgb::One(s) => s.run(src, out)?,
            ToRgb::Sliced(s) => {
                // SAFETY: both frames are valid; `out` has buffers of the context's output size
                // and format, which swscale writes.
                let r = unsafe { ffmpeg::ffi::sws_scale_frame(s.ctx.as_ptr(), out.as_mut_ptr(), src.as_ptr()) };
                if r < 0 {
                    return Err(ffmpeg::Error::from(r).into());
                }
            }
        }
        Ok(())
    }
}

/// The detection copy's conversion: a picture to packed RGB24 at the detection size,
/// area-averaged. A yuv420p picture at limited range is first shrunk in its own planes
/// (swscale's planar scalers), then turned to RGB at the small size (its unscaled converter):
/// about 2.6 times faster than one conversion that scales into RGB, whose packed output of a
/// scaled picture is swscale's generic path; the copy's chroma is then a quarter of its pixels,
/// as the picture's is, and its levels within one or two of the one conversion's (the
/// converter's coarser coefficients): what the detector reads faces from is the same. Other
/// pictures take the one conversion.
pub(crate) struct DetCopy {
    shrink: Option<(ToRgb, VideoFrame)>,
    to_rgb: ToRgb,
}

impl DetCopy {
    /// The copy of `from` pictures (`w x h`) at `dw x dh`, on `threads` threads (see
    /// [`ToRgb`]), read with `matrix` at `full` range or not.
    pub(crate) fn new(
        (from, w, h): (Pixel, u32, u32),
        (dw, dh): (u32, u32),
        threads: usize,
        matrix: Matrix,
        full: bool,
    ) -> Result<Self> {
        let staged = from == Pixel::YUV420P && !full && dw < w && dh < h && dw % 2 == 0 && dh % 2 == 0;
        if !staged {
            let to_rgb = ToRgb::new((from, w, h), (Pixel::RGB24, dw, dh), Flags::AREA, threads, matrix, full)?;
            return Ok(DetCopy { shrink: None, to_rgb });
        }
        // The planes shrunk at limited range both sides (no range or matrix conversion), then
        // the small picture to RGB.
        let shrink = ToRgb::new((from, w, h), (from, dw, dh), Flags::AREA, threads, matrix, false)?;
        let to_rgb = ToRgb::new(
            (from, dw, dh),
            (Pixel::RGB24, dw, dh),
            Flags::AREA,
            threads,
            matrix,
            false,
        )?;
        Ok(DetCopy {
            shrink: Some((shrink, VideoFrame::empty())),
            to_rgb,
        })
    }

    /// Whether the conversions run on the calling thread alone (see [`ToRgb`]).
    pub(crate) fn on_this_thread(&self) -> bool {
        matches!(self.to_rgb, ToRgb::One(_)) && matches!(self.shrink, None | Some((ToRgb::One(_), _)))
    }

    /// The copy of `src` in `dst` (packed rows), through the frame `tmp`.
    pub(crate) fn run(&mut self, src: &VideoFrame, tmp: &mut VideoFrame, dst: &mut Vec<u8>) -> Result<()> {
        match &mut self.shrink {
            Some((shrink, small)) => {
                shrink.run_into(src, small)?;
                self.to_rgb.run(small, tmp, dst)
            }
            None => self.to_rgb.run(src, tmp, dst),
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
pub(crate) fn rgb_buffer(f: &mut Frame) {
    let n = f.width * f.height * 3;
    if f.rgb.len() != n && f.picture.partial_source().is_some() {
        f.rgb = vec![0; n];
    }
}

/// Takes `f.rgb` off the frame: a whole picture's buffer back to `pool` for the next frame, a
/// partial picture's (made for it, see [`rgb_buffer`]) freed, so its pages go back and no pool
/// keeps buffers that decoding never takes for a partial picture.
pub(crate) fn give_back_rgb(f: &mut Frame, pool: &crate::frame::Pool<Vec<u8>>) {
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

/// Converts one region of packed RGB24 back into a yuv420p picture (limited range, the picture's
/// [`Matrix`]: the inverse of [`yuv420p_to_rgb_region`]). The region is widened to even bounds so
/// every chroma sample it touches is recomputed from its four pixels. The output never takes this
/// way back (it adds the paste's changes to the source's planes: [`add_changes`]); the tests
/// use it to check the forward conversion.
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

/// The planes of `yuv` as a kernel reads them, for a picture of `width x height` (Cb and Cr in
/// one interleaved plane, the third left empty, where the format has two).
fn planes(yuv: &VideoFrame, (width, height): (usize, usize)) -> Planes<'_> {
    let n = yuv.planes().min(3);
    let data = std::array::from_fn(|i| if i < n { yuv.data(i) } else { &[][..] });
    let stride = std::array::from_fn(|i| if i < n { yuv.stride(i) } else { 0 });
    Planes::new(data, stride, (width, height))
}

/// The planes of `pic` as a kernel writes them, all at once (as [`planes`], at the picture's
/// own size).
fn planes_mut(pic: &mut VideoFrame) -> PlanesMut<'_> {
    let (n, size) = (pic.planes().min(3), (pic.width() as usize, pic.height() as usize));
    let stride = std::array::from_fn(|i| if i < n { pic.stride(i) } else { 0 });
    let spans: [(*mut u8, usize); 3] = std::array::from_fn(|i| {
        if i < n {
            let plane = pic.data_mut(i);
            (plane.as_mut_ptr(), plane.len())
        } else {
            (std::ptr::NonNull::dangling().as_ptr(), 0)
        }
    });
    let ends = spans.map(|(p, len)| (p as usize, p as usize + len));
    for (i, a) in ends.iter().enumerate() {
        for b in &ends[i + 1..] {
            assert!(
                a.0 == a.1 || b.0 == b.1 || a.1 <= b.0 || b.1 <= a.0,
                "a picture's planes overlap"
            );
        }
    }
    // SAFETY: each span is the bytes `data_mut` gives for one plane (or an empty slice at a
    // dangling, aligned pointer): valid for reads and writes while `pic` is. The planes of a
    // picture are disjoint buffers (FFmpeg allocates each one its own, or lays them one after
    // another in one buffer), which the check above makes sure of, so the three slices never
    // alias; and they borrow `pic` mutably for the view's lifetime, so nothing else reaches
    // those bytes while the view lives.
    let data = spans.map(|(p, len)| unsafe { std::slice::from_raw_parts_mut(p, len) });
    PlanesMut::new(data, stride, size)
}

/// Converts one region of a yuv420p picture to packed RGB24 (limited range, the picture's
/// [`Matrix`], chroma interpolated bilinearly with MPEG-2 siting): the inverse of
/// [`rgb_to_yuv420p_region`], used so only face regions are ever converted.
pub(crate) fn yuv420p_to_rgb_region(yuv: &VideoFrame, rgb: &mut [u8], width: usize, height: usize, r: Rect) {
    let Rect { x0, x1, .. } = r.clip(width, height);
    yuv420p_rgb_rows(yuv, (width, height), r, |y, row| {
        rgb[(y * width + x0) * 3..(y * width + x1) * 3].copy_from_slice(row);
    });
}

/// Converts region `r` of a yuv420p picture of `width x height` as [`yuv420p_to_rgb_region`]
/// does, handing each row of packed RGB24 to `row` (its y, then its bytes), top to bottom
/// ([`yuv::yuv420p_rgb_rows`] with the picture's matrix).
pub(crate) fn yuv420p_rgb_rows(yuv: &VideoFrame, size: (usize, usize), r: Rect, row: impl FnMut(usize, &[u8])) {
    yuv::yuv420p_rgb_rows(&planes(yuv, size), Matrix::of(yuv).inverse(), r, row);
}

/// Appends region `r` of a yuv420p picture of `width x height` to `out` as texels, row by row
/// (R, G, B, 0 in f32: the levels [`yuv420p_rgb_rows`] gives, what the crop warp reads), eight
/// pixels at a time with AVX2 and four without ([`yuv::yuv420p_texels`] with the picture's
/// matrix).
pub(crate) fn yuv420p_texels(cpu: Cpu, yuv: &VideoFrame, size: (usize, usize), r: Rect, out: &mut Vec<f32x4>) {
    yuv::yuv420p_texels(cpu, &planes(yuv, size), Matrix::of(yuv).inverse(), r, out);
}

/// The YUV layout of a pixel format (the kernels' [`Planar`], which knows nothing of FFmpeg).
impl Planar {
    /// The layout of `fmt`, if it is one of the 4:2:0, 4:2:2 or 4:4:4 formats handled.
    pub(crate) fn of(fmt: Pixel) -> Option<Planar> {
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
/// values exactly. 8-bit 4:2:0 in three planes (what decoders give most videos) takes
/// [`yuv::add_change_420`], a form without the per-sample checks (the same values); every other
/// layout the general loop, [`yuv::add_change_planar`]; `cpu` is the run's CPU level. Returns
/// false (and changes nothing) for a format [`Planar`] does not describe.
pub(crate) fn add_changes(pic: &mut VideoFrame, changes: &[Change], cpu: Cpu) -> bool {
    let Some(layout) = Planar::of(pic.format()) else {
        return false;
    };
    let rows = Matrix::of(pic).change_rows(layout.bits, is_full_range(pic));
    let mut planes = planes_mut(pic);
    for ch in changes {
        let ch = RgbChange {
            rect: ch.rect,
            rgb: &ch.rgb,
        };
        if layout == Planar::YUV420P {
            yuv::add_change_420(cpu, &mut planes, ch, &rows);
        } else {
            yuv::add_change_planar(&mut planes, layout, ch, &rows);
        }
    }
    true
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

    /// The detection copy of a yuv420p picture at limited range goes in two steps (its planes
    /// shrunk, then to RGB at the small size): on a picture of smooth light and colour it is the
    /// one conversion's copy to within two levels on average and a few at most, the same on one
    /// thread and several; a picture at full range or of another format takes the one
    /// conversion itself.
    #[test]
    fn the_detection_copy_in_two_steps_is_the_one_conversions_copy() {
        crate::init_ffmpeg();
        let (w, h, dw, dh) = (1920usize, 1080usize, 640u32, 352u32);
        let mut yuv = VideoFrame::new(Pixel::YUV420P, w as u32, h as u32);
        for plane in 0..3 {
            let (pw, ph, stride) = if plane == 0 {
                (w, h, yuv.stride(0))
            } else {
                (w / 2, h / 2, yuv.stride(plane))
            };
            let k = if plane == 0 { 1.0 } else { 2.0 };
            for y in 0..ph {
                for x in 0..pw {
                    let v = ((k * x as f64 / 90.0 + plane as f64).sin() * (k * y as f64 / 70.0).cos()) * 60.0;
                    yuv.data_mut(plane)[y * stride + x] = (if plane == 0 { 120.0 } else { 128.0 } + v) as u8;
                }
            }
        }
        let mut one = ToRgb::new(
            (Pixel::YUV420P, w as u32, h as u32),
            (Pixel::RGB24, dw, dh),
            Flags::AREA,
            1,
            Matrix::Bt709,
            false,
        )
        .expect("a conversion swscale makes");
        let (mut tmp, mut want) = (VideoFrame::empty(), Vec::new());
        one.run(&yuv, &mut tmp, &mut want).expect("the conversion runs");
        let copy = |threads| {
            let mut d = DetCopy::new(
                (Pixel::YUV420P, w as u32, h as u32),
                (dw, dh),
                threads,
                Matrix::Bt709,
                false,
            )
            .expect("the copy's conversions");
            assert!(d.shrink.is_some(), "two steps");
            assert_eq!(d.on_this_thread(), threads == 1);
            let (mut tmp, mut out) = (VideoFrame::empty(), Vec::new());
            for _ in 0..2 {
                d.run(&yuv, &mut tmp, &mut out).expect("the copy runs");
            }
            out
        };
        let got = copy(1);
        assert_eq!(got.len(), want.len());
        let diffs: Vec<i32> = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as i32 - *b as i32).abs())
            .collect();
        let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
        let max = *diffs.iter().max().expect("values");
        // (swscale's unscaled converter rounds its coefficients coarser: red and blue a level
        // or so above the one conversion's on average.)
        assert!(mean < 2.0 && max <= 10, "mean {mean}, max {max}");
        assert!(got == copy(3), "one thread and three");
        for (fmt, full) in [(Pixel::YUV420P, true), (Pixel::NV12, false)] {
            let d = DetCopy::new((fmt, w as u32, h as u32), (dw, dh), 1, Matrix::Bt709, full).expect("a conversion");
            assert!(d.shrink.is_none(), "{fmt:?} full {full}: one conversion");
        }
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

    /// On a frame (FFmpeg's strides and planes), [`add_changes`] adds what the general loop adds
    /// over the frame's planes, sample for sample: changes at even and odd offsets, cut by the
    /// picture's edges, overlapping, zero in places, large enough to clamp at both ends, on an
    /// odd-sized 4:2:0 picture (which takes the 4:2:0 form; `kernels::yuv` compares the two forms
    /// at every CPU level).
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
        assert!(add_changes(&mut fast, &changes, Cpu::detected()));
        let layout = Planar::of(general.format()).expect("a planar layout");
        assert_eq!(layout, Planar::YUV420P, "the layout the 4:2:0 form takes");
        let rows = Matrix::of(&general).change_rows(layout.bits, is_full_range(&general));
        let mut planes = planes_mut(&mut general);
        for ch in &changes {
            let ch = RgbChange {
                rect: ch.rect,
                rgb: &ch.rgb,
            };
            yuv::add_change_planar(&mut planes, layout, ch, &rows);
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

    /// The texels the crop warp reads straight from a frame's planes are the region's levels
    /// (as [`yuv420p_to_rgb_region`] converts them), at every CPU level, over the whole range.
    #[test]
    fn texels_from_the_planes_are_the_regions_levels() {
        crate::init_ffmpeg();
        let (w, h) = (41usize, 23usize);
        let yuv = patterned(w, h, 256, 0);
        let mut clamped = 0;
        for r in [
            Rect::new(0, 0, w, h),
            Rect::new(3, 2, 20, 15),
            Rect::new(40, 22, 41, 23),
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
            assert!(add_changes(&mut pic, &[change([0.0; 3])], Cpu::detected()));
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
            assert!(add_changes(&mut pic, &[change([40.0; 3])], Cpu::detected()));
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
            add_changes(&mut red, &[change([40.0, 0.0, 0.0])], Cpu::detected());
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
        assert!(!add_changes(&mut rgb, &[], Cpu::detected()), "not a planar YUV picture");
    }
}
