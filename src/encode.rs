//! Encoding: in, restored RGB frames in order with their source timestamps; out, a finished
//! video file with the source's resolution, frame timing, audio and subtitle packets copied
//! unchanged, and its metadata.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use ffmpeg::format::Pixel;
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg::{codec, encoder, media, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

use crate::color::{convert, rgb_to_yuv420p_region, SendScaler};
use crate::decode::SourceInfo;
use crate::frame::Frame;

/// The default video encoder and its x264/x265 settings.
pub const DEFAULT_CODEC: &str = "libx264";
pub const DEFAULT_CRF: u32 = 18;
pub const DEFAULT_PRESET: &str = "medium";

/// Encoder choices from the command line.
#[derive(Clone, Debug)]
pub struct EncodeSettings {
    /// FFmpeg encoder name (libx264 by default).
    pub codec: String,
    pub crf: Option<u32>,
    pub preset: Option<String>,
}

impl Default for EncodeSettings {
    fn default() -> Self {
        Self {
            codec: DEFAULT_CODEC.into(),
            crf: Some(DEFAULT_CRF),
            preset: Some(DEFAULT_PRESET.into()),
        }
    }
}

/// Whether FFmpeg has a muxer for files ending in `.ext`.
pub fn container_known(ext: &str) -> bool {
    crate::init_ffmpeg();
    let Ok(name) = std::ffi::CString::new(format!("x.{ext}")) else {
        return false;
    };
    // SAFETY: `name` is a valid NUL-terminated string; null short name and MIME type are
    // allowed; the returned pointer is only compared with null.
    unsafe { !ffmpeg::ffi::av_guess_format(std::ptr::null(), name.as_ptr(), std::ptr::null()).is_null() }
}

/// Checks the encoder exists and can be opened with these settings, before any work starts.
pub fn check_settings(s: &EncodeSettings) -> Result<()> {
    crate::init_ffmpeg();
    let c = encoder::find_by_name(&s.codec)
        .ok_or_else(|| anyhow!("video encoder `{}` is not available in this FFmpeg build", s.codec))?;
    if c.medium() != media::Type::Video {
        bail!("`{}` is not a video encoder", s.codec);
    }
    Ok(())
}

/// Copies a source's non-video streams (audio, subtitles) packet for packet, interleaved by
/// time with the video the encoder writes. It reads the source through its own demuxer so the
/// decode stage never waits on the muxer.
struct SideStreams {
    ictx: ffmpeg::format::context::Input,
    /// Input stream index -> (output stream index, input time base).
    map: Vec<Option<(usize, Rational)>>,
    /// A packet read but not yet due.
    next: Option<(Packet, f64)>,
    done: bool,
}

impl SideStreams {
    /// Maps `ictx`'s (a fresh demuxer of the source) audio and subtitle streams into `octx`.
    fn open(
        ictx: ffmpeg::format::context::Input,
        src: &SourceInfo,
        octx: &mut ffmpeg::format::context::Output,
    ) -> Result<Self> {
        let mut map = vec![None; ictx.nb_streams() as usize];
        for ist in ictx.streams() {
            let kind = ist.parameters().medium();
            if ist.index() == src.stream_index || !matches!(kind, media::Type::Audio | media::Type::Subtitle) {
                if ist.index() != src.stream_index {
                    tracing::warn!(stream = ist.index(), kind = ?kind, "stream not copied (only audio and subtitles are)");
                }
                continue;
            }
            let id = ist.parameters().id();
            // SAFETY: the output format pointer is valid for the life of `octx`.
            let supported = unsafe {
                ffmpeg::ffi::avformat_query_codec(octx.format().as_ptr(), id.into(), ffmpeg::ffi::FF_COMPLIANCE_NORMAL)
                    == 1
            };
            if !supported {
                tracing::warn!(stream = ist.index(), codec = ?id, "this container cannot hold the stream; it is dropped (choose .mkv to keep it)");
                continue;
            }
            let mut ost = octx.add_stream(encoder::find(codec::Id::None))?;
            ost.set_parameters(ist.parameters());
            ost.set_time_base(ist.time_base());
            ost.set_metadata(ist.metadata().to_owned());
            // SAFETY: `ost` and `ist` are live streams of open contexts; these are plain fields
            // ffmpeg-next has no setters for.
            unsafe {
                (*ost.parameters().as_mut_ptr()).codec_tag = 0;
                (*ost.as_mut_ptr()).disposition = (*ist.as_ptr()).disposition;
            }
            map[ist.index()] = Some((ost.index(), ist.time_base()));
        }
        Ok(Self {
            ictx,
            map,
            next: None,
            done: false,
        })
    }

    fn streams(&self) -> usize {
        self.map.iter().flatten().count()
    }

    /// Writes every side packet due at or before `until` seconds (all of them with `None`).
    fn write_until(&mut self, octx: &mut ffmpeg::format::context::Output, until: Option<f64>) -> Result<()> {
        loop {
            if self.next.is_none() {
                if self.done || self.streams() == 0 {
                    return Ok(());
                }
                let mut p = Packet::empty();
                match p.read(&mut self.ictx) {
                    Ok(()) => {}
                    Err(ffmpeg::Error::Eof) => {
                        self.done = true;
                        return Ok(());
                    }
                    Err(ffmpeg::Error::InvalidData) => continue,
                    Err(e) => return Err(anyhow!("reading audio/subtitle packets: {e}")),
                }
                let Some((_, tb)) = self.map.get(p.stream()).copied().flatten() else {
                    continue;
                };
                let t = p
                    .dts()
                    .or(p.pts())
                    .map_or(f64::NEG_INFINITY, |ts| ts as f64 * f64::from(tb));
                self.next = Some((p, t));
            }
            let (_, t) = self.next.as_ref().expect("filled above");
            if until.is_some_and(|u| *t > u) {
                return Ok(());
            }
            let (mut p, _) = self.next.take().expect("filled above");
            let (out, itb) = self.map[p.stream()].expect("mapped");
            let otb = octx.stream(out).expect("added").time_base();
            p.rescale_ts(itb, otb);
            p.set_stream(out);
            p.set_position(-1);
            p.write_interleaved(octx).context("writing an audio/subtitle packet")?;
        }
    }
}

/// Encodes RGB frames into the output file.
pub struct Encoder {
    octx: ffmpeg::format::context::Output,
    enc: encoder::video::Encoder,
    /// yuv420p -> the encoder's format, when it is not yuv420p.
    scaler: Option<SendScaler>,
    /// RGB24 -> the encoder's format, for sources that are not yuv420p.
    rgb_scaler: Option<SendScaler>,
    pix: Pixel,
    /// RGB staging frame for sources that are not yuv420p, made on first use.
    rgb: Option<VideoFrame>,
    yuv: VideoFrame,
    /// Reusable yuv420p frame that pasted regions are written into.
    work: Option<VideoFrame>,
    side: SideStreams,
    enc_tb: Rational,
    ost_tb: Rational,
    last_pts: Option<i64>,
    /// End time (seconds) of the latest video packet written.
    last_video_time: Option<f64>,
    pub frames: u64,
}

impl Encoder {
    /// Creates `path` (its container chosen from its extension) for `src`'s picture size,
    /// time base and streams.
    pub fn create(path: &Path, src: &SourceInfo, settings: &EncodeSettings) -> Result<Self> {
        crate::init_ffmpeg();
        let codec = encoder::find_by_name(&settings.codec)
            .ok_or_else(|| anyhow!("video encoder `{}` not found", settings.codec))?;
        let mut octx = ffmpeg::format::output(path).with_context(|| format!("cannot create {}", path.display()))?;
        let global = octx.format().flags().contains(ffmpeg::format::Flags::GLOBAL_HEADER);
        let pix = codec
            .video()
            .ok()
            .and_then(|v| v.formats().map(|f| f.collect::<Vec<_>>()))
            .map(|f| {
                if f.is_empty() || f.contains(&Pixel::YUV420P) {
                    Pixel::YUV420P
                } else {
                    f[0]
                }
            })
            .unwrap_or(Pixel::YUV420P);
        let (w, h) = (src.width as u32, src.height as u32);
        let mut ctx = codec::context::Context::new_with_codec(codec).encoder().video()?;
        ctx.set_width(w);
        ctx.set_height(h);
        ctx.set_format(pix);
        ctx.set_time_base(src.time_base);
        if src.avg_frame_rate.numerator() > 0 {
            ctx.set_frame_rate(Some(src.avg_frame_rate));
        }
        if global {
            ctx.set_flags(codec::Flags::GLOBAL_HEADER);
        }
        // Keep the source's colour description and pixel aspect ratio.
        let described = codec::context::Context::from_parameters(src.params.clone())
            .and_then(|c| c.decoder().video())
            .with_context(|| format!("reading the colour description of {}", src.path.display()))?;
        ctx.set_colorspace(described.color_space());
        ctx.set_color_range(described.color_range());
        ctx.set_aspect_ratio(described.aspect_ratio());
        // SAFETY: `ctx` is a live, not yet opened encoder context we own; ffmpeg-next has no
        // setter for these two plain enum fields.
        unsafe {
            (*ctx.as_mut_ptr()).color_primaries = described.color_primaries().into();
            (*ctx.as_mut_ptr()).color_trc = described.color_transfer_characteristic().into();
        }
        let mut opts = Dictionary::new();
        if let Some(crf) = settings.crf {
            opts.set("crf", &crf.to_string());
        }
        if let Some(p) = &settings.preset {
            opts.set("preset", p);
        }
        // As the ffmpeg tool does: let the encoder pick its thread count (libavcodec's default
        // of one thread would make encoding the pipeline's serial bottleneck).
        opts.set("threads", "auto");
        let enc = ctx
            .open_as_with(codec, opts)
            .with_context(|| {
                format!(
                    "cannot open encoder {} for {w}x{h} {pix:?} (check --crf and --preset; x264 needs an even width and height)",
                    settings.codec
                )
            })?;
        // One demuxer of the source for its metadata and for copying its other streams.
        let ictx = ffmpeg::format::input(&src.path).with_context(|| format!("cannot reopen {}", src.path.display()))?;
        {
            let mut ost = octx.add_stream(codec)?;
            ost.set_parameters(&enc);
            ost.set_time_base(src.time_base);
            if src.avg_frame_rate.numerator() > 0 {
                ost.set_avg_frame_rate(src.avg_frame_rate);
            }
            if let Some(ist) = ictx.stream(src.stream_index) {
                ost.set_metadata(ist.metadata().to_owned());
                // Stream side data: the display matrix (phone videos' rotation), HDR mastering
                // and light levels, and the like, which players need to show the picture right.
                for sd in ist.side_data() {
                    let bytes = sd.data();
                    // SAFETY: `ost` is a live stream of `octx`; FFmpeg returns a buffer of exactly
                    // `bytes.len()` bytes (or null), which the copy fills.
                    unsafe {
                        let dst = ffmpeg::ffi::av_stream_new_side_data(ost.as_mut_ptr(), sd.kind().into(), bytes.len());
                        if !dst.is_null() {
                            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
                        }
                    }
                }
            }
            octx.set_metadata(ictx.metadata().to_owned());
        }
        let side = SideStreams::open(ictx, src, &mut octx)?;
        octx.write_header()
            .with_context(|| format!("cannot write the header of {}", path.display()))?;
        let ost_tb = octx.stream(0).expect("video stream added").time_base();
        Ok(Self {
            octx,
            enc,
            scaler: None,
            rgb_scaler: None,
            pix,
            rgb: None,
            yuv: VideoFrame::empty(),
            work: None,
            side,
            enc_tb: src.time_base,
            ost_tb,
            last_pts: None,
            last_video_time: None,
            frames: 0,
        })
    }

    /// Encodes one frame at its source timestamp. When the decoded picture is already in the
    /// encoder's format (yuv420p), it is sent as it is with only the pasted regions converted
    /// back from RGB; otherwise the whole RGB frame is converted.
    pub fn write(&mut self, frame: &mut Frame) -> Result<()> {
        // Keep timestamps as decoded; only a non-increasing one (broken source) is nudged.
        let pts = match (frame.pts, self.last_pts) {
            (Some(p), Some(l)) if p <= l => {
                tracing::warn!(frame = frame.index, pts = p, "non-increasing timestamp nudged forward");
                l + 1
            }
            (Some(p), _) => p,
            (None, l) => l.map_or(0, |l| l + 1),
        };
        self.last_pts = Some(pts);
        // The decoder converted only face regions to RGB exactly when the source is yuv420p.
        let yuv420 = frame.rgb_partial && frame.source.is_some();
        let picture = if yuv420 {
            let src = frame.source.as_mut().expect("checked above");
            // SAFETY: `src` is a valid decoded frame we own.
            let writable = unsafe { ffmpeg::ffi::av_frame_is_writable(src.as_mut_ptr()) } > 0;
            let picture = if frame.dirty.is_empty() {
                src
            } else if writable {
                // No one else holds the picture (the decoder no longer needs it as a
                // reference): paste the regions straight in, without a whole-frame copy.
                for r in &frame.dirty {
                    rgb_to_yuv420p_region(&frame.rgb, frame.width, frame.height, src, *r);
                }
                src
            } else {
                // The decoder still references its buffer (a reference picture): write into our
                // own reusable frame (a fresh buffer per frame would cost page faults each time).
                let work = self
                    .work
                    .get_or_insert_with(|| VideoFrame::new(Pixel::YUV420P, frame.width as u32, frame.height as u32));
                // SAFETY: both frames are valid and of the same size and format.
                let ok = unsafe {
                    ffmpeg::ffi::av_frame_make_writable(work.as_mut_ptr()) >= 0
                        && ffmpeg::ffi::av_frame_copy(work.as_mut_ptr(), src.as_ptr()) >= 0
                };
                if !ok {
                    bail!("out of memory copying frame {}", frame.index);
                }
                // The colour matrix travels with the picture (av_frame_copy copies pixels only).
                work.set_color_space(src.color_space());
                for r in &frame.dirty {
                    rgb_to_yuv420p_region(&frame.rgb, frame.width, frame.height, work, *r);
                }
                work
            };
            if self.pix == Pixel::YUV420P {
                picture
            } else {
                // An encoder that wants another format: convert the finished yuv420p picture.
                convert(&mut self.scaler, Pixel::YUV420P, self.pix, picture, &mut self.yuv)?;
                &mut self.yuv
            }
        } else {
            // Other source formats were converted to RGB whole by the decoder.
            let rgb = self
                .rgb
                .get_or_insert_with(|| VideoFrame::new(Pixel::RGB24, frame.width as u32, frame.height as u32));
            let (w, stride) = (frame.width * 3, rgb.stride(0));
            let data = rgb.data_mut(0);
            for (y, row) in frame.rgb.chunks_exact(w).enumerate() {
                data[y * stride..y * stride + w].copy_from_slice(row);
            }
            convert(&mut self.rgb_scaler, Pixel::RGB24, self.pix, rgb, &mut self.yuv)?;
            &mut self.yuv
        };
        // Encode as the encoder decides, not where the source had its keyframes.
        picture.set_kind(ffmpeg::picture::Type::None);
        picture.set_pts(Some(pts));
        self.enc
            .send_frame(picture)
            .with_context(|| format!("encoding frame {}", frame.index))?;
        self.frames += 1;
        self.drain()
    }

    fn drain(&mut self) -> Result<()> {
        let mut p = Packet::empty();
        while self.enc.receive_packet(&mut p).is_ok() {
            p.rescale_ts(self.enc_tb, self.ost_tb);
            let t = p.dts().or(p.pts()).map(|ts| ts as f64 * f64::from(self.ost_tb));
            self.side.write_until(&mut self.octx, t)?;
            if let Some(end) = p.pts().map(|ts| (ts + p.duration()) as f64 * f64::from(self.ost_tb)) {
                self.last_video_time = Some(self.last_video_time.map_or(end, |l: f64| l.max(end)));
            }
            p.set_stream(0);
            p.write_interleaved(&mut self.octx).context("writing a video packet")?;
        }
        Ok(())
    }

    /// Flushes the encoder, writes the remaining audio/subtitle packets (only up to the last
    /// video frame when `cut`, i.e. the run stopped early on purpose) and the trailer.
    pub fn finish(mut self, cut: bool) -> Result<u64> {
        self.enc.send_eof()?;
        self.drain()?;
        let until = if cut { self.last_video_time } else { None };
        self.side.write_until(&mut self.octx, until)?;
        self.octx.write_trailer().context("writing the trailer")?;
        Ok(self.frames)
    }
}
