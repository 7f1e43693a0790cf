//! Decoding: in, a video file (or a file's bytes in memory, a service's upload); out, its best
//! video stream's frames in packed RGB24 (full size and a detection-size copy), each with its
//! index and original timestamp.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use ffmpeg::format::Pixel;
use ffmpeg::software::scaling::Flags;
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg::{media, Rational};
use ffmpeg_next as ffmpeg;

use crate::frame::{Frame, Picture, Pool};
use crate::media::color::{is_full_range, DetCopy, Matrix, Planar, ToRgb};
use crate::media::input::Opened;
pub use crate::media::read::read_packet;

/// What the pipeline needs to know about a source before any frame is decoded.
#[derive(Clone)]
pub struct SourceInfo {
    /// The file; for a source in memory only its name (for messages and its extension),
    /// never opened.
    pub path: PathBuf,
    /// The whole file when the source lives in memory (a service's upload), else `None`.
    pub bytes: Option<Arc<[u8]>>,
    pub stream_index: usize,
    pub width: usize,
    pub height: usize,
    pub time_base: Rational,
    pub(crate) avg_frame_rate: Rational,
    /// Frame count the container declares, if any.
    pub(crate) declared_frames: Option<u64>,
    /// Stream (or container) duration in seconds, if known.
    pub(crate) duration_s: Option<f64>,
    pub codec: String,
    pub params: ffmpeg::codec::Parameters,
    /// Display rotation from the stream's display matrix, degrees counterclockwise: 0, 90,
    /// 180 or 270 (phone videos are often stored sideways).
    pub rotation: u32,
    /// Whether the display matrix also mirrors the picture (a front camera's), after `rotation`.
    pub mirror: bool,
    /// HDR10 static metadata (mastering display, light levels), from the stream or its first
    /// frame, which the encoder writes again.
    pub hdr: Option<crate::media::hdr::Hdr10>,
    /// The most pixels a picture its decoders allocate may have (a service's `--max-pixels`,
    /// set on its uploads): FFmpeg refuses a larger one itself, whatever its header said.
    pub max_pixels: Option<u64>,
    /// EXIF orientation of a still (1 to 8, 1 upright): the decode stage turns its frames
    /// upright, and `width` and `height` are the stored picture's.
    pub orientation: u8,
    /// A still `image` reads (its header): decoded by [`crate::media::still_in`], not FFmpeg,
    /// and `params` is empty.
    pub still: Option<Arc<crate::media::still_in::Header>>,
}

impl std::fmt::Debug for SourceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceInfo")
            .field("path", &self.path)
            .field("in_memory", &self.bytes.as_ref().map(|b| b.len()))
            .field("size", &(self.width, self.height))
            .field("time_base", &self.time_base)
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

impl SourceInfo {
    /// Frame count for progress: declared, else estimated from duration and rate.
    pub(crate) fn estimated_frames(&self) -> Option<u64> {
        self.declared_frames.or_else(|| {
            let fps = f64::from(self.avg_frame_rate);
            self.duration_s.filter(|_| fps > 0.0).map(|d| (d * fps).round() as u64)
        })
    }

    /// Frames a run will encode, for progress: the estimate, cut at `--frames`.
    pub fn frames_to_run(&self, max_frames: Option<u64>) -> Option<u64> {
        self.estimated_frames().map(|n| max_frames.map_or(n, |m| m.min(n)))
    }

    /// The picture's size as shown (after its EXIF orientation).
    pub fn upright_size(&self) -> (usize, usize) {
        crate::media::orient::upright_size(self.orientation, self.width, self.height)
    }
}

/// Whether a video's pictures carry an alpha channel (RGBA, YUVA: VP9 alpha decoded by libvpx,
/// ProRes 4444, PNG-in-MOV); palettes and GIF (decoded to BGRA) count as opaque.
pub(crate) fn has_alpha(params: &ffmpeg::codec::Parameters) -> bool {
    has_alpha_channel(params)
        && params.id() != ffmpeg::codec::Id::GIF
        && ffmpeg::codec::context::Context::from_parameters(params.clone())
            .and_then(|c| c.decoder().video())
            .is_ok_and(|d| d.format() != ffmpeg::format::Pixel::PAL8)
}

/// Whether the decoder's pixel format can carry alpha at all (palettes included: a palette PNG
/// may have transparent entries, or none).
pub(crate) fn has_alpha_channel(params: &ffmpeg::codec::Parameters) -> bool {
    ffmpeg::codec::context::Context::from_parameters(params.clone())
        .and_then(|c| c.decoder().video())
        .ok()
        .and_then(|d| d.format().descriptor())
        // SAFETY: the descriptor points into FFmpeg's static table of pixel formats.
        .is_some_and(|d| unsafe { (*d.as_ptr()).flags } & ffmpeg::ffi::AV_PIX_FMT_FLAG_ALPHA as u64 != 0)
}

/// Opens `path`, picks the best video stream and checks a decoder exists for it.
pub fn probe(path: &Path) -> Result<SourceInfo> {
    crate::init_ffmpeg();
    let meta = std::fs::metadata(path).map_err(|e| anyhow!("cannot read input {}: {e}", path.display()))?;
    if !meta.is_file() {
        bail!("input {} is not a file", path.display());
    }
    probe_source(path, None)
}

/// [`probe`] for a file's `bytes` in memory (a service's upload) named `name`: the same checks
/// and messages, and nothing read from or written to the file system (`name` is never
/// opened). The result carries the bytes, so its decoder reads them too.
pub fn probe_memory(name: &Path, bytes: Arc<[u8]>) -> Result<SourceInfo> {
    probe_source(name, Some(bytes))
}

/// What [`probe`] and [`probe_memory`] share: the source `path` names, read from `bytes` when
/// given, else from the file.
fn probe_source(path: &Path, bytes: Option<Arc<[u8]>>) -> Result<SourceInfo> {
    crate::init_ffmpeg();
    if crate::media::kind::is_still_input(path) {
        use crate::media::still_in::{header, Unread};
        match header(path, bytes.as_deref(), None) {
            Ok(Some(h)) => return Ok(still_source(path, bytes, h)),
            Ok(None) => {}
            // A file of a kind `image` does not decode (an arithmetic-coded JPEG, a TIFF of
            // an unusual layout) is FFmpeg's; bytes in memory (a service's) are read only by
            // `image`, within its limits.
            Err(Unread::Unsupported(why)) if bytes.is_none() => {
                tracing::debug!(file = %path.display(), why, "left to FFmpeg");
            }
            Err(e) => return Err(e.into_error(path, bytes.as_deref(), None)),
        }
    }
    let explain = || crate::media::sniff::explain_source(path, bytes.as_deref());
    let mut ictx = crate::media::input::open_source(path, bytes.as_ref()).map_err(|e| {
        if e.is::<crate::media::input::Refused>() {
            e
        } else if let Some(why) = explain() {
            anyhow!("input {}: {why}", path.display())
        } else {
            anyhow!("input {} is not a readable video ({e})", path.display())
        }
    })?;
    // Cover art (an attached picture, as audio files and some videos carry) is not the video.
    let cover = |s: &ffmpeg::format::stream::Stream| {
        s.disposition()
            .contains(ffmpeg::format::stream::Disposition::ATTACHED_PIC)
    };
    let video = |s: &ffmpeg::format::stream::Stream| s.parameters().medium() == media::Type::Video;
    let stream = match ictx.streams().best(media::Type::Video) {
        Some(s) if !cover(&s) => s,
        _ => match ictx.streams().find(|s| video(s) && !cover(s)) {
            Some(s) => s,
            None if ictx.streams().any(|s| cover(&s)) => bail!(
                "input {p} has no video, only cover art (a picture attached to its audio): there is nothing to restore over time. To restore the picture itself, extract it (ffmpeg -i {p} -an -c:v copy cover.jpg) and restore that",
                p = path.display()
            ),
            None => bail!("input {} has no video stream", path.display()),
        },
    };
    let params = stream.parameters();
    let dec = ffmpeg::codec::context::Context::from_parameters(params.clone())
        .and_then(|c| c.decoder().video())
        .with_context(|| format!("input {}: no decoder for its video stream", path.display()))?;
    if dec.width() == 0 || dec.height() == 0 {
        match explain() {
            Some(why) => bail!("input {}: {why}", path.display()),
            None => bail!(
                "input {}: FFmpeg could not read its picture size: the file is damaged, or not the kind of file its name says",
                path.display()
            ),
        }
    }
    let tb = stream.time_base();
    let duration_s = if stream.duration() > 0 {
        Some(stream.duration() as f64 * f64::from(tb))
    } else if ictx.duration() > 0 {
        Some(ictx.duration() as f64 / f64::from(ffmpeg::ffi::AV_TIME_BASE))
    } else {
        None
    };
    let codec = ffmpeg::codec::decoder::find(params.id())
        .map(|c| c.name().to_string())
        .unwrap_or_default();
    let (rotation, mirror) = stream
        .side_data()
        .find(|sd| sd.kind() == ffmpeg::codec::packet::side_data::Type::DisplayMatrix && sd.data().len() >= 36)
        .map(|sd| {
            let m: [i32; 9] =
                std::array::from_fn(|i| i32::from_ne_bytes(sd.data()[4 * i..4 * i + 4].try_into().unwrap_or_default()));
            (upright_turn(m), mirrors(&m))
        })
        .unwrap_or((0, false));
    let orientation = match &bytes {
        _ if !crate::media::kind::is_still_input(path) => 1,
        Some(b) => crate::media::orient::exif_orientation_of(b),
        None => crate::media::orient::exif_orientation(path),
    };
    let (stream_index, avg_frame_rate, frames) = (stream.index(), stream.avg_frame_rate(), stream.frames());
    // Read last: a PQ or HLG video's first frame may be decoded for it.
    let hdr = if crate::media::kind::is_still_input(path) {
        None
    } else {
        crate::media::hdr::Hdr10::probe(&mut ictx, stream_index, &params)
    };
    Ok(SourceInfo {
        path: path.to_path_buf(),
        bytes,
        stream_index,
        width: dec.width() as usize,
        height: dec.height() as usize,
        time_base: tb,
        avg_frame_rate,
        declared_frames: (frames > 0).then_some(frames as u64),
        duration_s,
        codec,
        params,
        rotation,
        mirror,
        orientation,
        hdr,
        max_pixels: None,
        still: None,
    })
}

/// The source of a still `image` reads, from its header `h`: one picture, timed as FFmpeg
/// times a picture file (1/25 s).
fn still_source(path: &Path, bytes: Option<Arc<[u8]>>, h: crate::media::still_in::Header) -> SourceInfo {
    SourceInfo {
        path: path.to_path_buf(),
        bytes,
        stream_index: 0,
        width: h.width as usize,
        height: h.height as usize,
        time_base: Rational(1, 25),
        avg_frame_rate: Rational(25, 1),
        declared_frames: Some(1),
        duration_s: Some(0.04),
        codec: h.codec().to_string(),
        params: ffmpeg::codec::Parameters::new(),
        rotation: 0,
        mirror: false,
        hdr: None,
        max_pixels: None,
        orientation: h.orientation,
        still: Some(Arc::new(h)),
    }
}

/// Caps the pictures decoder context `ctx` allocates at `max` pixels (none: FFmpeg's own
/// limit): FFmpeg checks it wherever it sizes a picture, and fails the decode of a larger one.
pub(crate) fn cap_pixels(ctx: &mut ffmpeg::codec::context::Context, max: Option<u64>) {
    if let Some(n) = max {
        // SAFETY: `ctx` is a live decoder context, not yet opened; `max_pixels` is a plain
        // field FFmpeg reads when it sizes a picture.
        unsafe { (*ctx.as_mut_ptr()).max_pixels = n.min(i64::MAX as u64) as i64 };
    }
}

/// Whether display matrix `m` mirrors the picture (its determinant is negative).
fn mirrors(m: &[i32; 9]) -> bool {
    i64::from(m[0]) * i64::from(m[4]) < i64::from(m[1]) * i64::from(m[3])
}

/// The turn, degrees counterclockwise (0, 90, 180 or 270), that shows a picture stored under
/// display matrix `m` with its faces upright. A matrix that mirrors (a front camera's, its
/// determinant negative) is the mirror after a turn: the turn is the matrix's once its mirror
/// is taken off (FFmpeg's own reading takes a horizontal mirror for a half turn, and faces
/// would be searched upside down). Mirrored faces are still upright faces.
fn upright_turn(mut m: [i32; 9]) -> u32 {
    if mirrors(&m) {
        // A horizontal mirror undone: the first column negated (av_display_matrix_flip's way).
        for i in [0, 3, 6] {
            m[i] = m[i].saturating_neg();
        }
    }
    // SAFETY: `m` is a display matrix of nine 32-bit integers, as the function reads.
    let angle = unsafe { ffmpeg::ffi::av_display_rotation_get(m.as_ptr()) };
    if angle.is_nan() {
        0
    } else {
        (((angle / 90.0).round() as i64 * 90).rem_euclid(360)) as u32
    }
}

/// How decoding ended.
#[derive(Debug, Default)]
pub struct DecodeReport {
    pub frames: u64,
    /// Packets the decoder rejected as corrupt and skipped.
    pub(crate) corrupt_packets: u64,
    /// Packets the demuxer marked to be decoded but not shown: those before an edit list's
    /// start (a stream-copied trim), which FFmpeg decodes for their references and drops.
    pub(crate) discarded_packets: u64,
    /// CPU time the conversions through swscale (the detection copy; the whole picture's RGB
    /// for a source not converted region by region) took on the decoding thread when made
    /// there alone (none when shared among swscale's threads): work a host of more cores
    /// shares out.
    pub(crate) convert_cpu: std::time::Duration,
}

/// The part of a video one segment decodes: from the keyframe at `seek` (the start when
/// `None`), frames before `warm_from` are decoded and dropped, frames from `warm_from` to
/// `start` are sent as warm-up ([`Frame::warm`]), frames from `start` to `end` as the
/// segment's own, and frames from `end` to `until` as its look-ahead (warm too). Frames are numbered by their place in `pts`, the display-order timestamps of
/// every frame of the video (the segment plan's scan of its packets).
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) seek: Option<i64>,
    pub(crate) warm_from: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) until: u64,
    pub(crate) pts: std::sync::Arc<Vec<i64>>,
}

/// Decodes the source's video stream frame by frame.
pub struct Decoder {
    info: SourceInfo,
    det_size: (usize, usize),
    hwaccel: bool,
    /// Frames of planar YUV sources are marked [`Frame::planes`] (their output is made from
    /// their own planes): set for video outputs.
    planes: bool,
    span: Option<Span>,
    /// Threads the conversions through swscale share each picture among (1: the decode
    /// stage's own thread alone).
    convert_threads: usize,
}

/// A CUDA device context for FFmpeg's hwaccel (NVDEC), freed on drop.
struct HwDevice(*mut ffmpeg::ffi::AVBufferRef);

impl HwDevice {
    fn cuda() -> Result<Self> {
        crate::init_ffmpeg();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is an out-pointer FFmpeg fills; null device name and options are allowed.
        let r = unsafe {
            ffmpeg::ffi::av_hwdevice_ctx_create(
                &mut ctx,
                ffmpeg::ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA,
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
            )
        };
        if r < 0 || ctx.is_null() {
            bail!(
                "--hwaccel cuda: FFmpeg could not open a CUDA device ({}); it needs an NVIDIA GPU and driver and an FFmpeg built with CUDA/NVDEC. Drop --hwaccel to decode on the CPU",
                ffmpeg::Error::from(r)
            );
        }
        Ok(Self(ctx))
    }
}

impl Drop for HwDevice {
    fn drop(&mut self) {
        // SAFETY: `self.0` is the reference `av_hwdevice_ctx_create` gave us, released once.
        unsafe { ffmpeg::ffi::av_buffer_unref(&mut self.0) };
    }
}

/// Checks that FFmpeg can open a CUDA device for decoding.
pub(crate) fn check_cuda_hwaccel() -> Result<()> {
    HwDevice::cuda().map(drop)
}

impl Decoder {
    /// The file decoded (for a source in memory, its name).
    pub fn path(&self) -> &Path {
        &self.info.path
    }

    pub fn new(info: SourceInfo, det_size: (usize, usize), hwaccel: bool) -> Self {
        Self {
            info,
            det_size,
            hwaccel,
            planes: false,
            span: None,
            convert_threads: 1,
        }
    }

    /// Shares the conversions through swscale (the detection copy, and the whole picture's RGB
    /// where it is made here) among `threads` threads of swscale's own (see
    /// [`crate::media::color::ToRgb`]): on a host of many cores the decode stage's one thread
    /// would otherwise spend most of its time on them.
    pub(crate) fn with_convert_threads(mut self, threads: usize) -> Self {
        self.convert_threads = threads.max(1);
        self
    }

    /// Decodes only `span` (a segment and its warm-up).
    pub(crate) fn with_span(mut self, span: Span) -> Self {
        self.span = Some(span);
        self
    }

    /// Marks the frames of planar YUV sources for an output made from their own planes.
    pub(crate) fn with_planes(mut self, planes: bool) -> Self {
        self.planes = planes;
        self
    }

    /// Decodes every frame and hands it to `emit` (which returns false to stop early). Buffers
    /// come from `recycle` when one is free. Errors name the file and the frame.
    ///
    /// Like the pipeline, in steps: open the demuxer and decoder ([`Decoder::open`]), send the
    /// stream's packets, receive and convert each decoded picture ([`Convert`]), flush, and
    /// check that the file was not cut short ([`Decoder::check_complete`]).
    pub fn run(
        &self,
        pools: (&Pool<Vec<u8>>, &Pool<Vec<u8>>),
        max_frames: Option<u64>,
        emit: impl FnMut(Frame) -> bool,
    ) -> Result<DecodeReport> {
        if self.info.still.is_some() {
            return self.run_still(pools, emit);
        }
        // FFmpeg's reason for a file it could not read through ("invalid data", a read or
        // flush failure) is replaced by what the file's bytes show, when they show it; other
        // failures (the GPU, the truncation check, conversions) keep their own.
        self.run_frames(pools, max_frames, emit).map_err(|e| {
            let text = format!("{e:#}");
            let unreadable = [
                "Invalid data",
                "read error",
                "flushing the decoder failed",
                "decoding failed",
                "no video frame could be decoded",
            ]
            .iter()
            .any(|k| text.contains(k));
            match unreadable
                .then(|| crate::media::sniff::explain_source(&self.info.path, self.info.bytes.as_deref()))
                .flatten()
            {
                Some(why) => anyhow!("{}: {why}; no output written", self.info.path.display()),
                None => e,
            }
        })
    }

    /// [`Decoder::run`] for a still `image` reads: its one picture decoded (within
    /// `max_pixels`, see [`crate::media::still_in`]), its detection copy made through swscale
    /// as a decoded picture's is.
    fn run_still(
        &self,
        pools: (&Pool<Vec<u8>>, &Pool<Vec<u8>>),
        mut emit: impl FnMut(Frame) -> bool,
    ) -> Result<DecodeReport> {
        let info = &self.info;
        let picture = crate::media::still_in::decode(&info.path, info.bytes.as_deref(), info.max_pixels)?;
        let (w, h) = (picture.width() as usize, picture.height() as usize);
        if (w, h) != (info.width, info.height) {
            bail!(
                "{}: the picture is {w}x{h}, its header said {}x{}",
                info.path.display(),
                info.width,
                info.height
            );
        }
        let rgb = crate::media::still_in::rgb(picture);
        let mut staged = VideoFrame::new(Pixel::RGB24, w as u32, h as u32);
        let stride = staged.stride(0);
        for (row, line) in rgb.chunks_exact(w * 3).zip(staged.data_mut(0).chunks_mut(stride)) {
            line[..w * 3].copy_from_slice(row);
        }
        let (dw, dh) = self.det_size;
        // The detection copy is area-averaged, as a decoded picture's (see `Convert::frame`).
        let mut det = ToRgb::new(
            (Pixel::RGB24, w as u32, h as u32),
            (Pixel::RGB24, dw as u32, dh as u32),
            Flags::AREA,
            self.convert_threads,
            Matrix::of(&staged),
            true,
        )?;
        let one = matches!(det, ToRgb::One(_)).then(crate::stats::thread_cpu_time);
        let mut det_buf = pools.1.get();
        det.run(&staged, &mut VideoFrame::empty(), &mut det_buf)?;
        let mut report = DecodeReport {
            frames: 1,
            ..Default::default()
        };
        if let Some(c) = one {
            report.convert_cpu = crate::stats::thread_cpu_time().saturating_sub(c);
        }
        emit(Frame {
            index: 0,
            pts: Some(0),
            width: w,
            height: h,
            rgb,
            det: det_buf,
            det_size: (dw, dh),
            item: 0,
            warm: false,
            view: None,
            dropped: None,
            picture: Picture::Rgb,
            pass: None,
            ticket: None,
        });
        Ok(report)
    }

    fn run_frames(
        &self,
        pools: (&Pool<Vec<u8>>, &Pool<Vec<u8>>),
        max_frames: Option<u64>,
        mut emit: impl FnMut(Frame) -> bool,
    ) -> Result<DecodeReport> {
        let info = &self.info;
        let path = info.path.display();
        let (mut ictx, mut dec, _hw) = self.open()?;
        let mut convert = Convert::new(self, pools);
        let mut report = DecodeReport::default();
        let span = self.span.as_ref();
        if let Some(ts) = span.and_then(|s| s.seek) {
            // SAFETY: `ictx` is an open demuxer; the stream index is one of its streams.
            let r = unsafe {
                ffmpeg::ffi::av_seek_frame(
                    ictx.as_mut_ptr(),
                    info.stream_index as i32,
                    ts,
                    ffmpeg::ffi::AVSEEK_FLAG_BACKWARD,
                )
            };
            if r < 0 {
                bail!(
                    "{path}: cannot seek to a segment's keyframe ({})",
                    ffmpeg::Error::from(r)
                );
            }
        }
        // A segment's next frame number, and whether its last frame was reached.
        let mut next_index = span.map_or(0, |s| s.warm_from);
        let mut drain = |dec: &mut ffmpeg::decoder::Video, report: &mut DecodeReport| -> Result<bool> {
            while dec.receive_frame(&mut convert.yuv).is_ok() {
                let index = match span {
                    None => report.frames,
                    Some(s) => {
                        let pts = convert.yuv.timestamp().or(convert.yuv.pts());
                        let Some(i) = pts.and_then(|p| s.pts.binary_search(&p).ok()) else {
                            bail!(
                                "{path}: a decoded frame's timestamp ({pts:?}) is not among its packets' (the segment plan's): the file changed since it was planned (run again with --force), or its timestamps cannot be cut by (run it as one with --segment 0)"
                            );
                        };
                        let i = i as u64;
                        if i < s.warm_from {
                            continue;
                        }
                        if i >= s.until {
                            return Ok(false);
                        }
                        next_index = i + 1;
                        i
                    }
                };
                let mut frame = convert.frame(index)?;
                report.convert_cpu += std::mem::take(&mut convert.convert_cpu);
                frame.warm = span.is_some_and(|s| index < s.start || index >= s.end);
                report.frames += 1;
                if !emit(frame) || max_frames.is_some_and(|m| report.frames >= m) {
                    return Ok(false);
                }
            }
            Ok(true)
        };

        let mut packet = ffmpeg::Packet::empty();
        loop {
            match read_packet(&mut ictx, &mut packet) {
                Ok(()) => {}
                Err(ffmpeg::Error::Eof) => break,
                Err(ffmpeg::Error::InvalidData) => {
                    report.corrupt_packets += 1;
                    continue;
                }
                Err(e) => bail!(
                    "{path}: read error after frame {} ({e}); the file may be truncated or damaged",
                    report.frames
                ),
            }
            if packet.stream() != info.stream_index {
                continue;
            }
            // SAFETY: `packet` holds a packet just read; `flags` is a plain field.
            if unsafe { (*ffmpeg::packet::Ref::as_ptr(&packet)).flags } & ffmpeg::ffi::AV_PKT_FLAG_DISCARD != 0 {
                report.discarded_packets += 1;
            }
            match dec.send_packet(&packet) {
                Ok(()) => {}
                Err(ffmpeg::Error::InvalidData) => {
                    report.corrupt_packets += 1;
                    tracing::warn!(file = %path, frame = report.frames, "corrupt video packet skipped");
                }
                Err(e) => bail!("{path}: decoding failed at frame {} ({e})", report.frames),
            }
            if !drain(&mut dec, &mut report)? {
                return Ok(report);
            }
        }
        // Eof here means the decoder was already flushed; anything else is a real failure.
        match dec.send_eof() {
            Ok(()) | Err(ffmpeg::Error::Eof) => {}
            Err(e) => bail!(
                "{path}: flushing the decoder failed after frame {} ({e})",
                report.frames
            ),
        }
        if !drain(&mut dec, &mut report)? {
            return Ok(report);
        }
        if let Some(s) = span {
            if next_index < s.until {
                bail!(
                    "{path}: truncated: decoding stopped at frame {next_index} of a segment that ends at frame {}; no output written",
                    s.until
                );
            }
            return Ok(report);
        }
        self.check_complete(&report, convert.last_pts)?;
        Ok(report)
    }

    /// The source's demuxer and its video decoder (frame-threaded; on NVDEC with `hwaccel`,
    /// whose device is returned to outlive the decoder's use of it).
    fn open(&self) -> Result<(Opened, ffmpeg::decoder::Video, Option<HwDevice>)> {
        let path = self.info.path.display();
        let ictx = crate::media::input::open_source(&self.info.path, self.info.bytes.as_ref())
            .with_context(|| format!("cannot open {path}"))?;
        let mut ctx = ffmpeg::codec::context::Context::from_parameters(self.info.params.clone())?;
        cap_pixels(&mut ctx, self.info.max_pixels);
        let hw = if self.hwaccel { Some(HwDevice::cuda()?) } else { None };
        if let Some(hw) = &hw {
            // SAFETY: `ctx` is a live decoder context not yet opened; `hw.0` a valid device
            // reference, of which the context takes a new reference of its own.
            let r = unsafe { ffmpeg::ffi::av_buffer_ref(hw.0) };
            if r.is_null() {
                bail!("{path}: out of memory setting up the CUDA decoder");
            }
            // SAFETY: as above; the context now owns `r`.
            unsafe { (*ctx.as_mut_ptr()).hw_device_ctx = r };
        }
        // Frame threads: decoding a 1080p stream on one core would cap the whole pipeline.
        ctx.set_threading(ffmpeg::codec::threading::Config {
            kind: ffmpeg::codec::threading::Type::Frame,
            count: 0,
            ..Default::default()
        });
        Ok((ictx, ctx.decoder().video()?, hw))
    }

    /// A file that ends before its header says it should is reported, not silently shortened.
    fn check_complete(&self, report: &DecodeReport, last_pts: Option<i64>) -> Result<()> {
        let info = &self.info;
        let path = info.path.display();
        if report.frames == 0 {
            bail!("{path}: no video frame could be decoded; the file is empty, truncated or damaged");
        }
        if let Some(declared) = info.declared_frames {
            // The header counts every packet; those outside the edit list are never shown.
            let shown = declared.saturating_sub(report.discarded_packets);
            // A few frames of slack: some muxers count frames the decoder drops by design.
            if report.frames + 2 < shown {
                let edit = match report.discarded_packets {
                    0 => String::new(),
                    n => format!(", {n} more before its edit list's start"),
                };
                bail!(
                    "{path}: truncated: decoded {} of the {shown} frames its header declares{edit} ({} corrupt packets skipped); no output written",
                    report.frames,
                    report.corrupt_packets
                );
            }
        } else if let (Some(d), Some(pts)) = (info.duration_s, last_pts) {
            let t = pts as f64 * f64::from(info.time_base);
            let fps = f64::from(info.avg_frame_rate).max(1.0);
            if t + 5.0 / fps + 0.5 < d {
                bail!(
                    "{path}: truncated: decoding stopped at {t:.2} s of a {d:.2} s stream after {} frames; no output written",
                    report.frames
                );
            }
        }
        Ok(())
    }
}

/// Turns each decoded picture into a [`Frame`]: brought to the host from the GPU, checked for
/// size, converted to RGB (whole, or region by region later for yuv420p at limited range) and
/// to the detection copy, with its timestamp; the decoded picture travels on as the source.
struct Convert<'a> {
    decoder: &'a Decoder,
    pools: (&'a Pool<Vec<u8>>, &'a Pool<Vec<u8>>),
    /// The whole-picture and detection scalers, for the pixel format they were made for.
    scalers: Option<(Option<ToRgb>, DetCopy, Pixel)>,
    /// The picture the decoder fills.
    yuv: VideoFrame,
    sw: VideoFrame,
    rgb: VideoFrame,
    small: VideoFrame,
    last_pts: Option<i64>,
    /// See [`DecodeReport::convert_cpu`]: since it was last taken.
    convert_cpu: std::time::Duration,
}

impl<'a> Convert<'a> {
    fn new(decoder: &'a Decoder, pools: (&'a Pool<Vec<u8>>, &'a Pool<Vec<u8>>)) -> Self {
        Self {
            decoder,
            pools,
            scalers: None,
            yuv: VideoFrame::empty(),
            sw: VideoFrame::empty(),
            rgb: VideoFrame::empty(),
            small: VideoFrame::empty(),
            last_pts: None,
            convert_cpu: std::time::Duration::ZERO,
        }
    }

    /// The frame `index` made from the picture just received into `yuv`.
    fn frame(&mut self, index: u64) -> Result<Frame> {
        let info = &self.decoder.info;
        let path = info.path.display();
        if self.yuv.format() == Pixel::CUDA {
            self.fetch_from_gpu(index)?;
        }
        let (w, h) = (info.width, info.height);
        let (dw, dh) = self.decoder.det_size;
        let yuv = &self.yuv;
        if yuv.width() as usize != w || yuv.height() as usize != h {
            bail!(
                "{path}: picture size changed from {w}x{h} to {}x{} at frame {index}; streams that change size are not supported",
                yuv.width(),
                yuv.height()
            );
        }
        let fmt = yuv.format();
        // yuv420p at limited range is converted to RGB region by region where faces are;
        // anything else whole.
        let regions = fmt == Pixel::YUV420P && !is_full_range(yuv);
        if self.scalers.as_ref().is_none_or(|s| s.2 != fmt) {
            let to_rgb = |(dw, dh): (usize, usize), flags| {
                ToRgb::new(
                    (fmt, w as u32, h as u32),
                    (Pixel::RGB24, dw as u32, dh as u32),
                    flags,
                    self.decoder.convert_threads,
                    Matrix::of(yuv),
                    is_full_range(yuv),
                )
            };
            let full = (!regions).then(|| to_rgb((w, h), Flags::BILINEAR)).transpose()?;
            // The detection copy is area-averaged: a fast bilinear shrink by 2-3 times
            // skips pixels and aliases, which moves the points the detector finds.
            let det = DetCopy::new(
                (fmt, w as u32, h as u32),
                (dw as u32, dh as u32),
                self.decoder.convert_threads,
                Matrix::of(yuv),
                is_full_range(yuv),
            )?;
            self.scalers = Some((full, det, fmt));
        }
        let (full, det, _) = self.scalers.as_mut().expect("just set");
        let partial = full.is_none();
        // A partial picture's RGB buffer is made when a face region is first converted into it
        // (`ensure_rgb`), fresh and zeroed, so only the pages under its faces are ever resident.
        let (mut buf, mut det_buf) = (
            if partial { Vec::new() } else { self.pools.0.get() },
            self.pools.1.get(),
        );
        let planes = self.decoder.planes && Planar::of(fmt).is_some();
        let one = det.on_this_thread().then(crate::stats::thread_cpu_time);
        if let Some(full) = full {
            full.run(yuv, &mut self.rgb, &mut buf)
                .with_context(|| format!("{path}: colour conversion failed at frame {index}"))?;
        }
        det.run(yuv, &mut self.small, &mut det_buf)?;
        if let Some(c) = one {
            self.convert_cpu += crate::stats::thread_cpu_time().saturating_sub(c);
        }
        let pts = yuv.timestamp().or(yuv.pts()).or_else(|| self.last_pts.map(|p| p + 1));
        self.last_pts = pts;
        let source = std::mem::replace(&mut self.yuv, VideoFrame::empty());
        let picture = if planes {
            Picture::Planes {
                source,
                partial,
                changes: Vec::new(),
            }
        } else {
            Picture::RgbOf {
                source,
                partial,
                dirty: Vec::new(),
            }
        };
        Ok(Frame {
            index,
            pts,
            width: w,
            height: h,
            rgb: buf,
            det: det_buf,
            det_size: (dw, dh),
            item: 0,
            warm: false,
            view: None,
            dropped: None,
            picture,
            pass: None,
            ticket: None,
        })
    }

    /// NVDEC decoded into GPU memory: brings the picture (and its timestamps) to the host.
    fn fetch_from_gpu(&mut self, index: u64) -> Result<()> {
        let path = self.decoder.info.path.display();
        // SAFETY: `yuv` is a valid CUDA frame and `sw` an empty frame FFmpeg fills.
        let r = unsafe { ffmpeg::ffi::av_hwframe_transfer_data(self.sw.as_mut_ptr(), self.yuv.as_ptr(), 0) };
        if r < 0 {
            bail!(
                "{path}: copying frame {index} from the GPU failed ({})",
                ffmpeg::Error::from(r)
            );
        }
        // SAFETY: both frames are valid; only their properties (timestamps) are copied.
        let r = unsafe { ffmpeg::ffi::av_frame_copy_props(self.sw.as_mut_ptr(), self.yuv.as_ptr()) };
        if r < 0 {
            bail!(
                "{path}: copying the timestamps of frame {index} from the GPU failed ({})",
                ffmpeg::Error::from(r)
            );
        }
        std::mem::swap(&mut self.yuv, &mut self.sw);
        self.sw = VideoFrame::empty();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::upright_turn;

    /// Display matrix of `turn` degrees (as `av_display_rotation_set` makes it), mirrored.
    fn matrix(turn: u32, hflip: i32, vflip: i32) -> [i32; 9] {
        let mut m = [0i32; 9];
        // SAFETY: `m` is nine 32-bit integers, the display matrix both functions write.
        unsafe {
            ffmpeg_next::ffi::av_display_rotation_set(m.as_mut_ptr(), f64::from(turn));
            ffmpeg_next::ffi::av_display_matrix_flip(m.as_mut_ptr(), hflip, vflip);
        }
        m
    }

    #[test]
    fn every_display_matrix_turns_faces_upright_mirrors_included() {
        for turn in [0u32, 90, 180, 270] {
            // The plain turn reads as FFmpeg reads it (the other way round from how it is set);
            // a horizontal mirror keeps it, a vertical one (a mirror and a half turn) adds 180.
            let plain = upright_turn(matrix(turn, 0, 0));
            assert_eq!(plain, (360 - turn) % 360);
            assert_eq!(upright_turn(matrix(turn, 1, 0)), plain, "turn {turn}, mirrored");
            assert_eq!(
                upright_turn(matrix(turn, 0, 1)),
                (plain + 180) % 360,
                "turn {turn}, flipped"
            );
            assert_eq!(
                upright_turn(matrix(turn, 1, 1)),
                (plain + 180) % 360,
                "turn {turn}, both"
            );
        }
    }

    /// Decodes the first picture of the shipped 512x512 portrait, its decoder capped at `cap`.
    fn decodes_with_cap(cap: Option<u64>) -> bool {
        crate::init_ffmpeg();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/astronaut.png");
        let bytes: std::sync::Arc<[u8]> = std::fs::read(&path).expect("the set-up's samples/astronaut.png").into();
        let mut ictx = crate::media::input::open_source(&path, Some(&bytes)).unwrap();
        let stream = ictx.streams().best(ffmpeg_next::media::Type::Video).unwrap();
        let index = stream.index();
        let mut ctx = ffmpeg_next::codec::context::Context::from_parameters(stream.parameters()).unwrap();
        super::cap_pixels(&mut ctx, cap);
        // The decoder refuses at opening a size its parameters already say, or at decoding.
        let Ok(mut dec) = ctx.decoder().video() else {
            return false;
        };
        crate::media::read::first_picture(&mut ictx, index, &mut dec, usize::MAX).is_some()
    }

    #[test]
    fn a_capped_decoder_refuses_a_picture_over_its_pixels() {
        assert!(decodes_with_cap(None));
        assert!(decodes_with_cap(Some(512 * 512)));
        assert!(!decodes_with_cap(Some(512 * 512 - 1)));
    }
}
