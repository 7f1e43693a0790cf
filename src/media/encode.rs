//! Encoding: in, restored RGB frames in order with their source timestamps; out, a finished
//! video file with the source's resolution, frame timing, audio and subtitle packets copied
//! unchanged, and its metadata.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use ffmpeg::format::Pixel;
use ffmpeg::software::scaling::{Context as Scaler, Flags};
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg::{codec, encoder, media, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

use crate::frame::{Frame, Picture};
use crate::kernels::Cpu;
use crate::media::color::{add_changes, convert, set_matrix, writable, Matrix, Planar, SendScaler};
use crate::media::decode::SourceInfo;

use crate::defaults::{CODEC as DEFAULT_CODEC, CRF as DEFAULT_CRF, CRF_VP9, PRESET as DEFAULT_PRESET};

/// Encoders tried, in order, for WebM outputs when no `--codec` is given.
pub(crate) const WEBM_CODECS: [&str; 3] = ["libvpx-vp9", "libaom-av1", "libsvtav1"];

/// Encoder choices from the command line: `None` is the default for the container.
/// Each field is its own flag (crf and preset reach the encoders that have them).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, clap::Args)]
pub struct EncodeSettings {
    /// FFmpeg encoder name; by default libx264, or a VP9/AV1 encoder for .webm.
    #[arg(long, value_name = "NAME", help_heading = "Output", help = format!(
        "FFmpeg video encoder [default: {}; for .webm the first of {} this FFmpeg has]",
        crate::defaults::CODEC, WEBM_CODECS.join(", ")))]
    pub codec: Option<String>,
    /// Constant rate factor (x264/x265 default 18; VP9 31; AV1 encoders their own scale).
    #[arg(long, value_name = "N", help_heading = "Output", value_parser = parse_crf, help = format!(
        "Constant rate factor: lower is better quality and larger files [default: {} for x264/x265, {} for VP9; AV1 encoders their own]",
        crate::defaults::CRF, crate::defaults::CRF_VP9))]
    pub crf: Option<u32>,
    /// x264/x265 preset (default medium; GPEN_VIDEO_PRESET sets it for every run of a shell).
    #[arg(long, value_name = "NAME", help_heading = "Output", env = "GPEN_VIDEO_PRESET",
          help = format!("x264/x265 preset, ultrafast ... veryslow [default: {}]", crate::defaults::PRESET))]
    pub preset: Option<String>,
    /// JPEG and WebP still outputs: 1 to 100 (default `defaults::QUALITY`).
    #[arg(long, value_name = "N", help_heading = "Output", value_parser = parse_quality, help = format!(
        "JPEG and WebP image outputs: quality 1 (smallest file) to 100 (best picture) [default: {}]. PNG, TIFF and BMP outputs are lossless",
        crate::defaults::QUALITY))]
    pub quality: Option<u32>,
}

/// A whole number of 0 or more, with a message that says what the flag wants (clap's own
/// names the range of the integer type: `0..=4294967295`).
fn parse_level(s: &str, what: &str) -> Result<u32, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("{n} is below 0: {what}")),
        Ok(n) => u32::try_from(n).map_err(|_| format!("{n} is too large: {what}")),
        Err(_) => Err(format!("`{s}` is not a whole number: {what}")),
    }
}

fn parse_crf(s: &str) -> Result<u32, String> {
    parse_level(
        s,
        "give 0 (best quality, largest file) or more; each encoder has its own maximum",
    )
}

fn parse_quality(s: &str) -> Result<u32, String> {
    parse_level(s, "give 1 (smallest file) to 100 (best picture)")
}

/// Whether `codec` is one of the encoders that take `--preset` (and `--crf` on x264's scale).
pub(crate) fn takes_preset(codec: &str) -> bool {
    matches!(codec, "libx264" | "libx264rgb" | "libx265")
}

/// The FFmpeg options an encoder gets: crf and preset only where that encoder has them, and
/// the source's HDR10 metadata where it writes it (x264, x265).
fn encoder_options(codec: &str, s: &EncodeSettings, hdr: Option<&crate::media::hdr::Hdr10>) -> Dictionary<'static> {
    let mut opts = Dictionary::new();
    if let Some((key, value)) = hdr.and_then(|h| h.encoder_params(codec)) {
        opts.set(key, &value);
    }
    match codec {
        _ if takes_preset(codec) => {
            opts.set("crf", &s.crf.unwrap_or(DEFAULT_CRF).to_string());
            opts.set("preset", s.preset.as_deref().unwrap_or(DEFAULT_PRESET));
        }
        // Constant quality (with no bitrate cap: libvpx's default is a low fixed bitrate).
        "libvpx-vp9" => {
            opts.set("crf", &s.crf.unwrap_or(CRF_VP9).to_string());
            opts.set("b", "0");
        }
        "libaom-av1" | "libsvtav1" => {
            if let Some(crf) = s.crf {
                opts.set("crf", &crf.to_string());
            }
        }
        _ => {}
    }
    // As the ffmpeg tool does: let the encoder pick its thread count (libavcodec's default
    // of one thread would make encoding the pipeline's serial bottleneck).
    opts.set("threads", "auto");
    opts
}

/// The largest constant rate factor `codec` takes (x264 and x265: 51; VP9 and AV1: 63).
pub(crate) fn max_crf(codec: &str) -> u32 {
    match codec {
        "libvpx-vp9" | "libaom-av1" | "libsvtav1" => 63,
        _ => 51,
    }
}

/// Checks the encoder settings themselves (before any source is looked at): the encoder
/// exists and is a video encoder, its crf and `--quality` are in range.
pub(crate) fn check_encoder(s: &EncodeSettings) -> Result<()> {
    crate::init_ffmpeg();
    check_quality(s.quality)?;
    if let Some(name) = &s.codec {
        let c = encoder::find_by_name(name)
            .ok_or_else(|| anyhow!("video encoder `{name}` is not available in this FFmpeg build"))?;
        if c.medium() != media::Type::Video {
            bail!("`{name}` is not a video encoder");
        }
    }
    let name = s.codec.as_deref().unwrap_or(crate::defaults::CODEC);
    if let Some(p) = s.preset.as_deref() {
        if takes_preset(name) && !X264_PRESETS.contains(&p) {
            bail!(
                "--preset {p} is not an x264/x265 preset (GPEN_VIDEO_PRESET gives it when the flag is absent): use one of {}",
                X264_PRESETS.join(", ")
            );
        }
    }
    if let Some(crf) = s.crf {
        let max = max_crf(name);
        if crf > max {
            bail!("--crf {crf} is out of range for {name}: use 0 to {max}");
        }
    }
    Ok(())
}

/// The presets x264 and x265 both take, fastest first.
const X264_PRESETS: [&str; 10] = [
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
];

/// `--quality` must be 1 to 100.
fn check_quality(q: Option<u32>) -> Result<()> {
    if let Some(q) = q.filter(|q| !(1..=100).contains(q)) {
        bail!("--quality {q} is out of range: use 1 (smallest file) to 100 (best picture)");
    }
    Ok(())
}

/// The muxer FFmpeg picks for files ending in `.ext`, if any.
fn guess_format(ext: &str) -> *const ffmpeg::ffi::AVOutputFormat {
    crate::init_ffmpeg();
    let Ok(name) = std::ffi::CString::new(format!("x.{ext}")) else {
        return std::ptr::null();
    };
    // SAFETY: `name` is a valid NUL-terminated string; null short name and MIME type are
    // allowed; FFmpeg returns a pointer to a static muxer description (or null).
    unsafe { ffmpeg::ffi::av_guess_format(std::ptr::null(), name.as_ptr(), std::ptr::null()) }
}

/// Whether FFmpeg has a muxer for files ending in `.ext`.
pub(crate) fn container_known(ext: &str) -> bool {
    !guess_format(ext).is_null()
}

/// What the muxer of `.ext` says of a stream of `id`: `Some(true)` it takes it, `Some(false)`
/// it does not, `None` it cannot tell (then only writing the header tells).
pub(crate) fn container_takes(ext: &str, id: codec::Id) -> Option<bool> {
    let fmt = guess_format(ext);
    if fmt.is_null() {
        return Some(false);
    }
    // SAFETY: `fmt` is a static muxer description from FFmpeg.
    match unsafe { ffmpeg::ffi::avformat_query_codec(fmt, id.into(), ffmpeg::ffi::FF_COMPLIANCE_NORMAL) } {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    }
}

/// A container that surely keeps a stream of `id`, to name in a message.
pub(crate) fn container_for(id: codec::Id) -> Option<&'static str> {
    ["mkv", "mp4", "mov", "webm", "ts"]
        .into_iter()
        .find(|ext| container_takes(ext, id) == Some(true))
}

/// The encoder a file ending in `.ext` gets: the one asked for, else libx264, or for WebM the
/// first VP9/AV1 encoder this FFmpeg has.
pub(crate) fn codec_for(s: &EncodeSettings, ext: &str) -> String {
    if let Some(c) = &s.codec {
        return c.clone();
    }
    if ext.eq_ignore_ascii_case("webm") {
        crate::init_ffmpeg();
        if let Some(c) = WEBM_CODECS.into_iter().find(|c| encoder::find_by_name(c).is_some()) {
            return c.to_string();
        }
    }
    DEFAULT_CODEC.to_string()
}

/// The pixel format the encoder `name` (`codec`) writes for a source decoded as `source`: the
/// source's own where the encoder takes it (10-bit stays 10-bit, 4:2:2 and 4:4:4 keep their
/// chroma), else the closest it takes, said once with what is lost; yuv420p for sources that are
/// not planar YUV.
fn output_format(codec: &ffmpeg::Codec, source: Pixel, name: &str) -> Pixel {
    let formats = codec
        .video()
        .ok()
        .and_then(|v| v.formats().map(|f| f.collect::<Vec<_>>()))
        .unwrap_or_default();
    let want = if Planar::of(source).is_some() {
        source
    } else {
        Pixel::YUV420P
    };
    if formats.is_empty() || formats.contains(&want) {
        return want;
    }
    let list: Vec<ffmpeg::ffi::AVPixelFormat> = formats
        .iter()
        .map(|&f| f.into())
        .chain([ffmpeg::ffi::AVPixelFormat::AV_PIX_FMT_NONE])
        .collect();
    // SAFETY: `list` is terminated by AV_PIX_FMT_NONE as FFmpeg requires; `loss` is a local.
    let best = unsafe {
        let mut loss = 0;
        ffmpeg::ffi::avcodec_find_best_pix_fmt_of_list(list.as_ptr(), want.into(), 0, &mut loss)
    };
    let best = Pixel::from(best);
    let best = if best == Pixel::None { formats[0] } else { best };
    if Planar::of(source).is_some() {
        let depth = |p: Pixel| Planar::of(p).map_or(8, |p| p.bits);
        let hint = if depth(best) < depth(source) {
            " (libx265 and libx264 both encode 10-bit: try --codec libx265)"
        } else {
            ""
        };
        tracing::warn!(
            "{name} takes no {} pictures: the output is converted to {}{hint}",
            pix_name(source),
            pix_name(best)
        );
    }
    best
}

/// FFmpeg's name of a pixel format (`yuv420p10le`).
fn pix_name(p: Pixel) -> String {
    p.descriptor()
        .map_or_else(|| format!("{p:?}"), |d| d.name().to_string())
}

/// Copies a source's non-video streams (audio, subtitles) packet for packet, interleaved by
/// time with the video the encoder writes. It reads the source through its own demuxer so the
/// decode stage never waits on the muxer.
struct SideStreams {
    ictx: crate::media::input::Opened,
    /// Input stream index -> (output stream index, input time base).
    map: Vec<Option<(usize, Rational)>>,
    /// A packet read but not yet due.
    next: Option<(Packet, f64)>,
    done: bool,
}

impl SideStreams {
    /// Maps `ictx`'s (a fresh demuxer of the source) audio and subtitle streams into `octx`.
    /// Streams the muxer could not vouch for are listed in `tried`; those in `skip` (refused
    /// by an earlier attempt) are left out.
    fn open(
        ictx: crate::media::input::Opened,
        src: &SourceInfo,
        octx: &mut ffmpeg::format::context::Output,
        ext: &str,
        skip: &[usize],
        tried: &mut Vec<usize>,
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
            match container_takes(ext, id) {
                Some(true) => {}
                // The muxer cannot say (MPEG-TS, MPEG-PS for most audio): try it; only a
                // refusal when the header is written drops it.
                None if !skip.contains(&ist.index()) => tried.push(ist.index()),
                _ => {
                    let keep = container_for(id).map_or(String::new(), |c| format!(" (choose .{c} to keep it)"));
                    tracing::warn!(stream = ist.index(), codec = ?id, "a .{ext} file cannot hold this stream; it is dropped{keep}");
                    continue;
                }
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

/// Where the encoder's packets go: the output file (muxed with the source's other streams), or
/// a segment's packet file (video only, joined into the output later by [`Muxer`]).
enum Out {
    File(Box<Muxer>),
    Packets(crate::media::packets::PacketWriter),
}

/// Encodes frames (their own planes with the paste's changes, or RGB) into the output file.
pub struct Encoder {
    /// The CPU level the paste's changes are added at (the run's).
    cpu: Cpu,
    out: Out,
    enc: encoder::video::Encoder,
    /// Interlaced coding: whether the top field comes first.
    fields: Option<bool>,
    /// The source's planar format -> the encoder's, when the encoder does not take it.
    scaler: Option<SendScaler>,
    /// RGB24 -> the encoder's format, for frames whose output is RGB.
    rgb_scaler: Option<SendScaler>,
    pix: Pixel,
    /// The matrix and range the output's YUV is tagged with (for RGB frames).
    matrix: (Matrix, bool),
    /// RGB staging frame for frames whose output is RGB, made on first use.
    rgb: Option<VideoFrame>,
    yuv: VideoFrame,
    /// Reusable frame (the source's format) that changes are added into when the decoder
    /// still holds the decoded picture.
    work: Option<VideoFrame>,
    enc_tb: Rational,
    last_pts: Option<i64>,
    pub frames: u64,
}

/// The video encoder opened for a source: what [`Encoder`] and the join's [`Muxer`] share.
struct Opened {
    enc: encoder::video::Encoder,
    codec: ffmpeg::Codec,
    pix: Pixel,
    fields: Option<bool>,
    matrix: (Matrix, bool),
}

/// Whether the muxer of `.ext` wants the codec's headers out of band (mp4, mkv, mov).
fn global_header(ext: &str) -> bool {
    let fmt = guess_format(ext);
    // SAFETY: a non-null `fmt` is a static muxer description from FFmpeg.
    !fmt.is_null() && unsafe { (*fmt).flags } & ffmpeg::ffi::AVFMT_GLOBALHEADER != 0
}

/// Opens the encoder a file ending in `.ext` gets for `src`: its size, time base, colour
/// description, pixel format and field order, with `settings`' options.
fn open_encoder(src: &SourceInfo, settings: &EncodeSettings, ext: &str) -> Result<Opened> {
    crate::init_ffmpeg();
    let name = codec_for(settings, ext);
    let codec = encoder::find_by_name(&name).ok_or_else(|| anyhow!("video encoder `{name}` not found"))?;
    // Keep the source's colour description, pixel aspect ratio and, where the encoder
    // takes it, its pixel format (depth and chroma layout).
    let described = codec::context::Context::from_parameters(src.params.clone())
        .and_then(|c| c.decoder().video())
        .with_context(|| format!("reading the colour description of {}", src.path.display()))?;
    let pix = output_format(&codec, described.format(), &name);
    let (w, h) = (src.width as u32, src.height as u32);
    let mut ctx = codec::context::Context::new_with_codec(codec).encoder().video()?;
    ctx.set_width(w);
    ctx.set_height(h);
    ctx.set_format(pix);
    ctx.set_time_base(src.time_base);
    if src.avg_frame_rate.numerator() > 0 {
        ctx.set_frame_rate(Some(src.avg_frame_rate));
    }
    if global_header(ext) {
        ctx.set_flags(codec::Flags::GLOBAL_HEADER);
    }
    ctx.set_colorspace(described.color_space());
    ctx.set_color_range(described.color_range());
    ctx.set_aspect_ratio(described.aspect_ratio());
    // SAFETY: `ctx` is a live, not yet opened encoder context we own; ffmpeg-next has no
    // setter for these two plain enum fields.
    unsafe {
        (*ctx.as_mut_ptr()).color_primaries = described.color_primaries().into();
        (*ctx.as_mut_ptr()).color_trc = described.color_transfer_characteristic().into();
    }
    // SAFETY: `src.params` holds valid codec parameters; `field_order` is a plain field.
    let field_order = unsafe { (*src.params.as_ptr()).field_order };
    use ffmpeg::ffi::AVFieldOrder::{AV_FIELD_PROGRESSIVE, AV_FIELD_TB, AV_FIELD_TT, AV_FIELD_UNKNOWN};
    let mut fields = None;
    if !matches!(field_order, AV_FIELD_PROGRESSIVE | AV_FIELD_UNKNOWN) {
        if name == "libx264" {
            fields = Some(matches!(field_order, AV_FIELD_TT | AV_FIELD_TB));
            // Interlaced coding, its field order (x264 reads top-first from it) kept.
            // SAFETY: plain fields of the unopened context; the flags keep those set above.
            unsafe {
                (*ctx.as_mut_ptr()).flags |=
                    ffmpeg::ffi::AV_CODEC_FLAG_INTERLACED_DCT as i32 | ffmpeg::ffi::AV_CODEC_FLAG_INTERLACED_ME as i32;
                (*ctx.as_mut_ptr()).field_order = field_order;
            }
        } else {
            let order = if matches!(field_order, AV_FIELD_TT | AV_FIELD_TB) {
                "top field first"
            } else {
                "bottom field first"
            };
            tracing::warn!(
                file = %src.path.display(),
                "the video is interlaced ({order}) and {name} writes it as progressive frames; use --codec libx264 to keep its fields and their order"
            );
        }
    }
    let opts = encoder_options(&name, settings, src.hdr.as_ref());
    let odd = Planar::of(pix).is_some_and(|p| (p.hshift > 0 && w % 2 == 1) || (p.vshift > 0 && h % 2 == 1));
    let enc = ctx.open_as_with(codec, opts).with_context(|| {
        if odd {
            format!(
                "cannot open encoder {name} for {w}x{h}: 4:2:0 video needs an even width and height. Use --codec libx264rgb (any size), or crop the source first (ffmpeg -vf crop=trunc(iw/2)*2:trunc(ih/2)*2)"
            )
        } else {
            format!("cannot open encoder {name} for {w}x{h} {pix:?} (check --crf and --preset)")
        }
    })?;
    Ok(Opened {
        enc,
        codec,
        pix,
        fields,
        // Untagged, the source picture's size decides (not a side-by-side view's).
        matrix: (
            Matrix::from_tag(
                described.color_space(),
                described.width() as usize,
                described.height() as usize,
            ),
            described.color_range() == ffmpeg::color::Range::JPEG,
        ),
    })
}

/// The output file: the encoded video stream (its packets handed in, from the encoder or from
/// a segment's packet file), the source's audio and subtitles copied and interleaved, its
/// metadata, stream side data and chapters.
pub(crate) struct Muxer {
    octx: ffmpeg::format::context::Output,
    side: SideStreams,
    ost_tb: Rational,
    /// End time (seconds) of the latest video packet written.
    last_video_time: Option<f64>,
}

impl Muxer {
    /// Creates `path` for `src` with a video stream described by `opened` (whose codec headers
    /// are replaced by `extradata` when given: a joined segment's own).
    fn create(
        path: &Path,
        src: &SourceInfo,
        opened: &Opened,
        extradata: Option<&[u8]>,
        skip: &[usize],
        tried: &mut Vec<usize>,
    ) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let mut octx = ffmpeg::format::output(path).with_context(|| format!("cannot create {}", path.display()))?;
        // One demuxer of the source for its metadata and for copying its other streams.
        let ictx = crate::media::input::open_source(&src.path, src.bytes.as_ref())
            .with_context(|| format!("cannot reopen {}", src.path.display()))?;
        {
            let mut ost = octx.add_stream(opened.codec)?;
            ost.set_parameters(&opened.enc);
            if let Some(extra) = extradata {
                set_extradata(&mut ost, extra)?;
            }
            ost.set_time_base(src.time_base);
            if src.avg_frame_rate.numerator() > 0 {
                ost.set_avg_frame_rate(src.avg_frame_rate);
            }
            if let Some(ist) = ictx.stream(src.stream_index) {
                // A VP9 alpha stream's ALPHA_MODE tag is dropped with the alpha it announced.
                let alpha_mode = ist.metadata().get("alpha_mode") == Some("1");
                if alpha_mode || crate::media::decode::has_alpha(&src.params) {
                    let input = src.path.display();
                    tracing::warn!(
                        file = %input,
                        "the video has transparency (an alpha channel); gpen-video writes opaque video, so it is dropped. To put it back, merge it from the source with an encoder that keeps alpha: ffmpeg -i OUT -c:v libvpx-vp9 -i {input} -filter_complex \"[1:v]alphaextract[a];[0:v][a]alphamerge\" -c:v libvpx-vp9 -pix_fmt yuva420p with-alpha.webm"
                    );
                }
                let mut meta = Dictionary::new();
                for (k, v) in ist.metadata().iter() {
                    if !k.eq_ignore_ascii_case("alpha_mode") {
                        meta.set(k, v);
                    }
                }
                ost.set_metadata(meta);
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
            // Chapters, with their titles (containers without chapters leave them out).
            for ch in ictx.chapters() {
                let title = ch.metadata().get("title").unwrap_or_default().to_string();
                octx.add_chapter(ch.id(), ch.time_base(), ch.start(), ch.end(), &title)?;
            }
        }
        let side = SideStreams::open(ictx, src, &mut octx, ext, skip, tried)?;
        octx.write_header()
            .with_context(|| format!("cannot write the header of {}", path.display()))?;
        let ost_tb = octx.stream(0).expect("video stream added").time_base();
        Ok(Self {
            octx,
            side,
            ost_tb,
            last_video_time: None,
        })
    }

    /// [`Muxer::create`], retried without the source streams the muxer could not vouch for
    /// when it refuses them.
    fn create_retrying(path: &Path, src: &SourceInfo, opened: &Opened, extradata: Option<&[u8]>) -> Result<Self> {
        let mut tried = Vec::new();
        match Self::create(path, src, opened, extradata, &[], &mut tried) {
            Err(e) if !tried.is_empty() => {
                let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                // The retry warns for each stream it leaves out.
                tracing::debug!(streams = ?tried, "the .{ext} muxer refused stream(s) it could not vouch for ({e:#})");
                // The first attempt left a file behind; the retry creates it anew.
                Self::create(path, src, opened, extradata, &tried, &mut Vec::new())
            }
            r => r,
        }
    }

    /// Opens `path` to join segments of `src` encoded with `settings`: the video stream is
    /// described as the encoder describes it, with the segments' own codec headers.
    pub(crate) fn for_join(path: &Path, src: &SourceInfo, settings: &EncodeSettings, extradata: &[u8]) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let opened = open_encoder(src, settings, ext)?;
        let extra = (opened.enc_extradata() != extradata).then_some(extradata);
        Self::create_retrying(path, src, &opened, extra)
    }

    /// Writes one video packet whose timestamps are in `tb`, after the side packets due
    /// before it.
    pub(crate) fn write_video(&mut self, mut p: Packet, tb: Rational) -> Result<()> {
        p.rescale_ts(tb, self.ost_tb);
        let t = p.dts().or(p.pts()).map(|ts| ts as f64 * f64::from(self.ost_tb));
        self.side.write_until(&mut self.octx, t)?;
        if let Some(end) = p.pts().map(|ts| (ts + p.duration()) as f64 * f64::from(self.ost_tb)) {
            self.last_video_time = Some(self.last_video_time.map_or(end, |l: f64| l.max(end)));
        }
        p.set_stream(0);
        p.set_position(-1);
        p.write_interleaved(&mut self.octx).context("writing a video packet")
    }

    /// Writes the remaining audio/subtitle packets (only up to the last video frame when
    /// `cut`, i.e. the run stopped early on purpose) and the trailer.
    pub(crate) fn finish(mut self, cut: bool) -> Result<()> {
        let until = if cut { self.last_video_time } else { None };
        self.side.write_until(&mut self.octx, until)?;
        self.octx.write_trailer().context("writing the trailer")
    }
}

impl Opened {
    /// The encoder's codec headers (empty when it has none out of band).
    fn enc_extradata(&self) -> &[u8] {
        // SAFETY: the encoder context is open; `extradata` is null or `extradata_size` bytes.
        unsafe {
            let ctx = self.enc.as_ptr();
            if (*ctx).extradata.is_null() || (*ctx).extradata_size <= 0 {
                &[]
            } else {
                std::slice::from_raw_parts((*ctx).extradata, (*ctx).extradata_size as usize)
            }
        }
    }
}

/// Replaces the codec headers of `ost` with `extra`.
fn set_extradata(ost: &mut ffmpeg::format::stream::StreamMut, extra: &[u8]) -> Result<()> {
    // SAFETY: `ost`'s parameters are live; the new buffer is allocated by FFmpeg with the
    // padding it requires, filled, and owned by the parameters (the old one freed first).
    unsafe {
        let par = (*ost.as_mut_ptr()).codecpar;
        ffmpeg::ffi::av_freep(std::ptr::addr_of_mut!((*par).extradata).cast());
        (*par).extradata_size = 0;
        let buf = ffmpeg::ffi::av_mallocz(extra.len() + ffmpeg::ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize) as *mut u8;
        if buf.is_null() {
            bail!("out of memory copying the codec headers");
        }
        std::ptr::copy_nonoverlapping(extra.as_ptr(), buf, extra.len());
        (*par).extradata = buf;
        (*par).extradata_size = extra.len() as i32;
    }
    Ok(())
}

impl Encoder {
    /// Creates `path` (its container chosen from its extension) for `src`'s picture size,
    /// time base and streams; the paste's changes are added at the CPU level `cpu`.
    pub fn create(path: &Path, src: &SourceInfo, settings: &EncodeSettings, cpu: Cpu) -> Result<Self> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let opened = open_encoder(src, settings, ext)?;
        let muxer = Muxer::create_retrying(path, src, &opened, None)?;
        Ok(Self::with_out(opened, Out::File(Box::new(muxer)), src, cpu))
    }

    /// An encoder for one segment of `src` whose packets go to the packet file `path`, encoded
    /// as a file ending in `.ext` (OUT's) encodes them, so that the segments join into it.
    pub(crate) fn for_segment(
        path: &Path,
        src: &SourceInfo,
        (settings, ext): (&EncodeSettings, &str),
        cpu: Cpu,
    ) -> Result<Self> {
        let opened = open_encoder(src, settings, ext)?;
        let packets = crate::media::packets::PacketWriter::create(path, opened.enc_extradata())?;
        Ok(Self::with_out(opened, Out::Packets(packets), src, cpu))
    }

    fn with_out(opened: Opened, out: Out, src: &SourceInfo, cpu: Cpu) -> Self {
        Self {
            cpu,
            out,
            enc: opened.enc,
            fields: opened.fields,
            scaler: None,
            rgb_scaler: None,
            pix: opened.pix,
            matrix: opened.matrix,
            rgb: None,
            yuv: VideoFrame::empty(),
            work: None,
            enc_tb: src.time_base,
            last_pts: None,
            frames: 0,
        }
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
        let picture = match &mut frame.picture {
            Picture::Planes {
                source: src, changes, ..
            } => {
                let fmt = src.format();
                let picture = if changes.is_empty() {
                    // No face, or the paste stage added its changes already.
                    src
                } else if writable(src) {
                    // No one else holds the picture (the decoder no longer needs it as a
                    // reference): add the changes straight in, without a whole-frame copy.
                    add_changes(src, changes, self.cpu);
                    src
                } else {
                    // The decoder still references its buffer (a reference picture): write into
                    // our own reusable frame (a fresh buffer per frame would cost page faults).
                    let work = self
                        .work
                        .get_or_insert_with(|| VideoFrame::new(fmt, frame.width as u32, frame.height as u32));
                    // SAFETY: both frames are valid and of the same size and format.
                    let ok = unsafe {
                        ffmpeg::ffi::av_frame_make_writable(work.as_mut_ptr()) >= 0
                            && ffmpeg::ffi::av_frame_copy(work.as_mut_ptr(), src.as_ptr()) >= 0
                    };
                    if !ok {
                        bail!("out of memory copying frame {}", frame.index);
                    }
                    // The colour description travels with the picture (av_frame_copy copies
                    // pixels only).
                    work.set_color_space(src.color_space());
                    work.set_color_range(src.color_range());
                    add_changes(work, changes, self.cpu);
                    work
                };
                if fmt == self.pix {
                    picture
                } else {
                    // An encoder that does not take the source's format (said once at the start).
                    convert(&mut self.scaler, fmt, self.pix, picture, &mut self.yuv)?;
                    &mut self.yuv
                }
            }
            _ => {
                // The output is the RGB picture (a side-by-side view, a source that is not
                // planar YUV): convert it whole, with the matrix the output is tagged with.
                let rgb = self
                    .rgb
                    .get_or_insert_with(|| VideoFrame::new(Pixel::RGB24, frame.width as u32, frame.height as u32));
                let (w, stride) = (frame.width * 3, rgb.stride(0));
                let data = rgb.data_mut(0);
                for (y, row) in frame.rgb.chunks_exact(w).enumerate() {
                    data[y * stride..y * stride + w].copy_from_slice(row);
                }
                if self.rgb_scaler.is_none() {
                    let (w, h) = (rgb.width(), rgb.height());
                    let mut s = Scaler::get(
                        Pixel::RGB24,
                        w,
                        h,
                        self.pix,
                        w,
                        h,
                        Flags::BILINEAR | Flags::ACCURATE_RND,
                    )?;
                    set_matrix(&mut s, self.matrix.0, self.matrix.1, false);
                    self.rgb_scaler = Some(SendScaler(s));
                }
                convert(&mut self.rgb_scaler, Pixel::RGB24, self.pix, rgb, &mut self.yuv)?;
                &mut self.yuv
            }
        };
        // Encode as the encoder decides, not where the source had its keyframes.
        picture.set_kind(ffmpeg::picture::Type::None);
        picture.set_pts(Some(pts));
        if let Some(top_first) = self.fields {
            // x264 takes the field order from each picture (frames copied or converted on the
            // way here lose the decoder's flags).
            // SAFETY: `picture` is a valid frame we hold; these are plain int fields.
            unsafe {
                (*picture.as_mut_ptr()).interlaced_frame = 1;
                (*picture.as_mut_ptr()).top_field_first = i32::from(top_first);
            }
        }
        self.enc
            .send_frame(picture)
            .with_context(|| format!("encoding frame {}", frame.index))?;
        self.frames += 1;
        self.drain()
    }

    fn drain(&mut self) -> Result<()> {
        let mut p = Packet::empty();
        while self.enc.receive_packet(&mut p).is_ok() {
            let packet = std::mem::replace(&mut p, Packet::empty());
            match &mut self.out {
                Out::File(m) => m.write_video(packet, self.enc_tb)?,
                Out::Packets(w) => w.write(&packet)?,
            }
        }
        Ok(())
    }

    /// Flushes the encoder and finishes the file: for an output file the remaining
    /// audio/subtitle packets (only up to the last video frame when `cut`, i.e. the run stopped
    /// early on purpose) and the trailer.
    pub fn finish(mut self, cut: bool) -> Result<u64> {
        self.enc.send_eof()?;
        self.drain()?;
        match self.out {
            Out::File(m) => m.finish(cut)?,
            Out::Packets(w) => w.finish()?,
        }
        Ok(self.frames)
    }
}
