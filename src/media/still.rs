//! Still-image outputs: in, the restored frame of a still source (full-resolution RGB) and
//! OUT's extension; out, exactly one PNG, JPEG, WebP, TIFF or BMP file (the encoded picture
//! written as it is, no muxer, no sequence pattern), or the same bytes kept in memory (a
//! service's answer, [`StillWriter::in_memory`]), with the source's EXIF and ICC blocks where
//! both formats hold them. Also [`Writer`], the one interface the encode stage calls for videos
//! and stills alike.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use ffmpeg::format::Pixel;
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg::{codec, encoder, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

use crate::frame::{Frame, Picture};
use crate::geom::Rect;
use crate::media::color::{convert, yuv420p_to_rgb_region, SendScaler};
use crate::media::decode::SourceInfo;
use crate::media::encode::{EncodeSettings, Encoder};

use crate::defaults::QUALITY as DEFAULT_QUALITY;

pub(crate) use crate::media::kind::{ext_of, is_still, STILL_EXTENSIONS};

/// The FFmpeg image encoder for a still output named `path`.
pub(crate) fn encoder_for(path: &Path) -> Option<&'static str> {
    match ext_of(path).as_str() {
        "png" => Some("png"),
        "jpg" | "jpeg" => Some("mjpeg"),
        "webp" => Some("libwebp"),
        "tif" | "tiff" => Some("tiff"),
        "bmp" => Some("bmp"),
        _ => None,
    }
}

/// The picture format `name` is fed: RGB where the encoder takes it (PNG, TIFF: lossless),
/// full-chroma YUV for JPEG (no 4:2:0 subsampling), else what it takes first.
fn pixel_for(name: &str, formats: &[Pixel]) -> Pixel {
    let prefer = [Pixel::RGB24, Pixel::BGR24, Pixel::YUVJ444P, Pixel::BGRA, Pixel::RGBA];
    prefer
        .into_iter()
        .find(|p| formats.contains(p))
        .or_else(|| formats.first().copied())
        .unwrap_or_else(|| if name == "mjpeg" { Pixel::YUVJ444P } else { Pixel::RGB24 })
}

/// The alpha-holding format `name` is fed, if it takes one (PNG, TIFF and WebP do).
fn alpha_pixel_for(formats: &[Pixel]) -> Option<Pixel> {
    [Pixel::RGBA, Pixel::BGRA, Pixel::YUVA420P]
        .into_iter()
        .find(|p| formats.contains(p))
}

/// The alpha channel of the first picture of the source `path` (read from its `bytes` when it
/// is in memory, by `image` for a still it reads (`by_image`), else by FFmpeg; one byte a
/// pixel, turned upright for EXIF orientation `o`): read again from the source, since the
/// restoration works in RGB.
fn read_alpha(
    path: &Path,
    (bytes, max_pixels): (Option<&Arc<[u8]>>, Option<u64>),
    by_image: bool,
    o: u8,
) -> Result<Vec<u8>> {
    let (w, h, alpha) = if by_image {
        let picture = crate::media::still_in::decode(path, bytes.map(|b| &b[..]), max_pixels)?;
        (
            picture.width() as usize,
            picture.height() as usize,
            crate::media::still_in::alpha(&picture),
        )
    } else {
        ffmpeg_alpha(path, (bytes, max_pixels))?
    };
    // Three equal channels, so the RGB orientation code turns it.
    let a3: Vec<u8> = alpha.iter().flat_map(|&a| [a; 3]).collect();
    let mut up = Vec::new();
    crate::media::orient::upright(o, &a3, w, h, &mut up);
    Ok(up.into_iter().step_by(3).collect())
}

/// The alpha channel of the first picture FFmpeg decodes of the source `path` (of its `bytes`
/// when given) as stored, with the picture's width and height.
fn ffmpeg_alpha(
    path: &Path,
    (bytes, max_pixels): (Option<&Arc<[u8]>>, Option<u64>),
) -> Result<(usize, usize, Vec<u8>)> {
    let mut ictx = crate::media::input::open_source(path, bytes)?;
    let stream = ictx
        .streams()
        .best(ffmpeg::media::Type::Video)
        .ok_or_else(|| anyhow!("{}: no picture stream", path.display()))?;
    let index = stream.index();
    let mut ctx = codec::context::Context::from_parameters(stream.parameters())?;
    crate::media::decode::cap_pixels(&mut ctx, max_pixels);
    let mut dec = ctx.decoder().video()?;
    let Some(picture) = crate::media::read::first_picture(&mut ictx, index, &mut dec, usize::MAX) else {
        bail!(
            "{}: its picture could not be decoded again for its alpha channel",
            path.display()
        );
    };
    let mut rgba = VideoFrame::empty();
    convert(&mut None, picture.format(), Pixel::RGBA, &picture, &mut rgba)?;
    let (w, h) = (picture.width() as usize, picture.height() as usize);
    let stride = rgba.stride(0);
    let mut alpha = Vec::with_capacity(w * h);
    for y in 0..h {
        alpha.extend(
            rgba.data(0)[y * stride..y * stride + w * 4]
                .chunks_exact(4)
                .map(|px| px[3]),
        );
    }
    Ok((w, h, alpha))
}

/// Writes one still image: the first frame it is given, encoded whole.
pub struct StillWriter {
    path: PathBuf,
    name: &'static str,
    enc: Option<encoder::video::Encoder>,
    pix: Pixel,
    /// The source's alpha is written too (its orientation with it).
    alpha: Option<u8>,
    /// The source may have transparency the output format cannot hold (checked at write).
    alpha_lost: bool,
    /// JPEG's fixed quantiser (in lambda units), if any.
    qscale_lambda: Option<i32>,
    scaler: Option<SendScaler>,
    /// The full RGB picture (for sources the decoder converted only in face regions).
    full: Vec<u8>,
    /// The source file (for a source in memory, its name), whose EXIF and ICC blocks are
    /// carried over.
    source: PathBuf,
    /// The source's bytes, when it is in memory.
    source_bytes: Option<Arc<[u8]>>,
    /// The source's header, when `image` reads it (its ICC profile and EXIF block are taken
    /// from it, its alpha read again by `image`).
    still: Option<Arc<crate::media::still_in::Header>>,
    /// The cap on the pictures the source's decoder allocates (see `SourceInfo::max_pixels`).
    max_pixels: Option<u64>,
    /// The picture is kept in memory ([`StillWriter::in_memory`]), not written to `path`.
    in_memory: bool,
    /// The encoded picture, kept in memory until taken.
    encoded: Option<Vec<u8>>,
    pub frames: u64,
}

impl StillWriter {
    /// Opens the image encoder OUT's extension picks for `src`'s picture size; `path` is the
    /// (temporary) file the picture is written to.
    pub fn create(path: &Path, src: &SourceInfo, settings: &EncodeSettings) -> Result<Self> {
        crate::init_ffmpeg();
        let name = encoder_for(path).ok_or_else(|| anyhow!("{} is not a still-image name", path.display()))?;
        let codec = encoder::find_by_name(name)
            .ok_or_else(|| anyhow!("this FFmpeg build has no {name} encoder; choose a .png or .jpg output"))?;
        let formats: Vec<Pixel> = codec
            .video()
            .ok()
            .and_then(|v| v.formats().map(|f| f.collect()))
            .unwrap_or_default();
        let mut pix = pixel_for(name, &formats);
        let (mut alpha, mut alpha_lost) = (None, false);
        // A palette may have transparent entries or none: whether anything is transparent is
        // known once the picture is read again (at write).
        let has_alpha = match &src.still {
            Some(h) => h.alpha,
            None => crate::media::decode::has_alpha_channel(&src.params),
        };
        if has_alpha {
            match alpha_pixel_for(&formats) {
                Some(p) => (pix, alpha) = (p, Some(src.orientation)),
                None => alpha_lost = true,
            }
        }
        // Stills go through 8-bit RGB: say so for a deeper source (a 16-bit PNG or TIFF).
        let depth = match &src.still {
            Some(h) => i32::from(h.depth),
            None => codec::context::Context::from_parameters(src.params.clone())
                .and_then(|c| c.decoder().video())
                .ok()
                .and_then(|d| d.format().descriptor())
                // SAFETY: the descriptor points into FFmpeg's static table of pixel formats.
                .map_or(8, |d| unsafe { (*d.as_ptr()).comp[0].depth }),
        };
        if depth > 8 {
            tracing::warn!(file = %src.path.display(), "a {depth}-bit picture: the still is written with 8 bits per channel");
        }
        let quality = settings.quality.unwrap_or(DEFAULT_QUALITY);
        let (w, h) = (src.width as u32, src.height as u32);
        let mut ctx = codec::context::Context::new_with_codec(codec).encoder().video()?;
        ctx.set_width(w);
        ctx.set_height(h);
        ctx.set_format(pix);
        ctx.set_time_base(Rational(1, 25));
        let mut opts = Dictionary::new();
        let mut qscale_lambda = None;
        match name {
            "mjpeg" => {
                // Quality 100 -> quantiser 1 (best), 1 -> 31 (worst).
                let q = 1 + (100u32.saturating_sub(quality) * 30).div_ceil(99) as i32;
                let lambda = q * ffmpeg::ffi::FF_QP2LAMBDA;
                ctx.set_flags(codec::Flags::QSCALE);
                ctx.set_global_quality(lambda);
                ctx.set_qmin(1);
                ctx.set_color_range(ffmpeg::util::color::Range::JPEG);
                ctx.set_colorspace(ffmpeg::util::color::Space::BT470BG);
                opts.set("huffman", "optimal");
                qscale_lambda = Some(lambda);
            }
            "libwebp" => {
                opts.set("quality", &quality.to_string());
            }
            _ => {}
        }
        let enc = ctx
            .open_as_with(codec, opts)
            .with_context(|| format!("cannot open the {name} encoder for a {w}x{h} picture"))?;
        Ok(Self {
            path: path.to_path_buf(),
            name,
            enc: Some(enc),
            pix,
            alpha,
            alpha_lost,
            qscale_lambda,
            scaler: None,
            full: Vec::new(),
            source: src.path.clone(),
            source_bytes: src.bytes.clone(),
            still: src.still.clone(),
            max_pixels: src.max_pixels,
            in_memory: false,
            encoded: None,
            frames: 0,
        })
    }

    /// Like [`StillWriter::create`], but the picture is kept in memory (see
    /// [`StillWriter::take_encoded`]) and no file is written: `name` only picks the format by
    /// its extension and names the output in messages.
    pub fn in_memory(name: &Path, src: &SourceInfo, settings: &EncodeSettings) -> Result<Self> {
        let mut w = Self::create(name, src, settings)?;
        w.in_memory = true;
        Ok(w)
    }

    /// The encoded picture (with the source's EXIF and ICC blocks) of a writer made with
    /// [`StillWriter::in_memory`], once written; `None` before, after it was taken, and for a
    /// writer to a file.
    pub fn take_encoded(&mut self) -> Option<Vec<u8>> {
        self.encoded.take()
    }

    /// Encodes `frame` into the file (or into memory); only the first frame of a source is
    /// written (a still has one).
    pub fn write(&mut self, frame: &mut Frame) -> Result<()> {
        self.frames += 1;
        if self.frames > 1 {
            if self.frames == 2 {
                tracing::warn!(file = %self.path.display(), "the source has more than one frame: only the first is written");
            }
            return Ok(());
        }
        let (w, h) = (frame.width, frame.height);
        let alpha = self.source_alpha(w, h)?;
        let rgb = self.full_rgb(frame);
        let staged = stage(rgb, alpha.as_deref(), w, h);
        let bytes = self.encode(staged)?;
        let (icc, exif) = match (&self.still, &self.source_bytes) {
            (Some(h), _) => (h.icc.clone(), h.exif.clone()),
            (None, Some(src)) => metadata_of(src),
            (None, None) => std::fs::read(&self.source).map_or((None, None), |src| metadata_of(&src)),
        };
        self.deliver(with_metadata(icc, exif, bytes))
    }

    /// The whole RGB picture of `frame`: its own, or for a source the decoder converted only in
    /// the face regions, the rest converted the same way with the pasted regions laid over it.
    fn full_rgb<'a>(&'a mut self, frame: &'a Frame) -> &'a [u8] {
        let (w, h) = (frame.width, frame.height);
        match &frame.picture {
            Picture::RgbOf {
                source: src,
                partial: true,
                dirty,
            } => {
                self.full.resize(w * h * 3, 0);
                yuv420p_to_rgb_region(src, &mut self.full, w, h, Rect::new(0, 0, w, h));
                for r in dirty {
                    let r = r.clip(w, h);
                    for y in r.y0..r.y1 {
                        let (a, b) = ((y * w + r.x0) * 3, (y * w + r.x1) * 3);
                        self.full[a..b].copy_from_slice(&frame.rgb[a..b]);
                    }
                }
                &self.full
            }
            _ => &frame.rgb,
        }
    }

    /// The source's alpha channel (`w` x `h`, upright) when the output keeps it; a warning
    /// when the source has transparency the output format cannot hold.
    fn source_alpha(&self, w: usize, h: usize) -> Result<Option<Vec<u8>>> {
        let bytes = (self.source_bytes.as_ref(), self.max_pixels);
        let by_image = self.still.is_some();
        if self.alpha_lost && read_alpha(&self.source, bytes, by_image, 1).is_ok_and(|a| a.iter().any(|&v| v < 255)) {
            tracing::warn!(
                file = %self.source.display(),
                "the picture has transparency (an alpha channel) and a .{} file cannot hold it: its transparent pixels are written as the colours stored under them. Choose .png, .webp or .tiff to keep it",
                ext_of(&self.path)
            );
        }
        let Some(o) = self.alpha else { return Ok(None) };
        let a = read_alpha(&self.source, bytes, by_image, o)?;
        if a.len() != w * h {
            bail!(
                "{}: its alpha channel does not match the picture's size",
                self.source.display()
            );
        }
        Ok(Some(a))
    }

    /// The encoder's bytes for the `staged` picture (RGB24 or RGBA), converted to the format
    /// the encoder takes.
    fn encode(&mut self, staged: VideoFrame) -> Result<Vec<u8>> {
        let mut picture = if self.pix == staged.format() {
            staged
        } else {
            let mut out = VideoFrame::empty();
            convert(&mut self.scaler, staged.format(), self.pix, &staged, &mut out)?;
            out
        };
        if self.pix == Pixel::YUVJ444P {
            picture.set_color_range(ffmpeg::util::color::Range::JPEG);
        }
        picture.set_pts(Some(0));
        if let Some(lambda) = self.qscale_lambda {
            // SAFETY: `picture` is a valid frame we own; `quality` is a plain field (the fixed
            // quantiser the MJPEG encoder reads per picture) ffmpeg-next has no setter for.
            unsafe { (*picture.as_mut_ptr()).quality = lambda };
        }
        let name = self.name;
        let enc = self.enc.as_mut().expect("open until finished");
        enc.send_frame(&picture)
            .with_context(|| format!("{name} encoder refused the picture"))?;
        enc.send_eof()?;
        let mut bytes = Vec::new();
        let mut p = Packet::empty();
        while enc.receive_packet(&mut p).is_ok() {
            bytes.extend_from_slice(p.data().unwrap_or_default());
        }
        if bytes.is_empty() {
            bail!("the {name} encoder gave no picture");
        }
        Ok(bytes)
    }

    /// Keeps the encoded picture in memory, or writes it into the (temporary) file.
    fn deliver(&mut self, bytes: Vec<u8>) -> Result<()> {
        if self.in_memory {
            self.encoded = Some(bytes);
            return Ok(());
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.path)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok(())
    }

    /// Checks a picture was written.
    pub fn finish(self) -> Result<u64> {
        if self.frames == 0 {
            bail!("no picture was decoded, so none was written");
        }
        Ok(self.frames.min(1))
    }
}

/// `rgb` (packed RGB24, `w` x `h`) in a frame, with `alpha` (one byte a pixel) as RGBA when
/// given.
fn stage(rgb: &[u8], alpha: Option<&[u8]>, w: usize, h: usize) -> VideoFrame {
    let pix = if alpha.is_some() { Pixel::RGBA } else { Pixel::RGB24 };
    let mut staged = VideoFrame::new(pix, w as u32, h as u32);
    let stride = staged.stride(0);
    let data = staged.data_mut(0);
    for (y, row) in rgb.chunks_exact(w * 3).enumerate() {
        let line = &mut data[y * stride..];
        match alpha {
            None => line[..w * 3].copy_from_slice(row),
            Some(a) => {
                for ((d, s), a) in line[..w * 4]
                    .chunks_exact_mut(4)
                    .zip(row.chunks_exact(3))
                    .zip(&a[y * w..])
                {
                    d[..3].copy_from_slice(s);
                    d[3] = *a;
                }
            }
        }
    }
    staged
}

/// The ICC profile and EXIF block of a still FFmpeg reads, from its file's bytes (`source`):
/// those of a JPEG, PNG or WebP (what `img-parts` reads), none of any other.
fn metadata_of(source: &[u8]) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    use img_parts::{Bytes, DynImage, ImageEXIF, ImageICC};
    match DynImage::from_bytes(Bytes::copy_from_slice(source)) {
        Ok(Some(src)) => (src.icc_profile().map(|b| b.to_vec()), src.exif().map(|b| b.to_vec())),
        _ => (None, None),
    }
}

/// `encoded` with the source's ICC profile and EXIF block, where its format holds them (JPEG,
/// PNG and WebP; TIFF and BMP carry none). The EXIF orientation is reset to upright: the
/// picture was turned upright before it was encoded.
fn with_metadata(icc: Option<Vec<u8>>, exif: Option<Vec<u8>>, encoded: Vec<u8>) -> Vec<u8> {
    use img_parts::{Bytes, DynImage, ImageEXIF, ImageICC};
    if icc.is_none() && exif.is_none() {
        return encoded;
    }
    let exif = exif.map(|mut tiff| {
        set_orientation_upright(&mut tiff);
        Bytes::from(tiff)
    });
    match DynImage::from_bytes(Bytes::from(encoded.clone())) {
        Ok(Some(mut out)) => {
            out.set_icc_profile(icc.map(Bytes::from));
            out.set_exif(exif);
            out.encoder().bytes().to_vec()
        }
        _ => encoded,
    }
}

/// Sets the Orientation entry (0x0112) of an EXIF block's first IFD, if it has one, to 1.
fn set_orientation_upright(tiff: &mut [u8]) {
    let _ = image::metadata::Orientation::remove_from_exif_chunk(tiff);
}

/// What the encode stage writes into: a video file or one still image.
pub enum Writer {
    Video(Box<Encoder>),
    Still(Box<StillWriter>),
}

impl Writer {
    /// A still writer when `path` (the temporary output, OUT's extension) names a still image,
    /// else the video encoder (adding the paste's changes at the CPU level `cpu`).
    pub fn create(path: &Path, src: &SourceInfo, settings: &EncodeSettings, cpu: crate::kernels::Cpu) -> Result<Self> {
        if is_still(path) {
            StillWriter::create(path, src, settings).map(|w| Writer::Still(Box::new(w)))
        } else {
            Encoder::create(path, src, settings, cpu).map(|e| Writer::Video(Box::new(e)))
        }
    }

    /// A still writer that keeps its picture in memory ([`StillWriter::in_memory`]): `name`
    /// (OUT's name) picks the format by its extension; a video name is an error (videos are
    /// written to files only).
    pub fn in_memory(name: &Path, src: &SourceInfo, settings: &EncodeSettings) -> Result<Self> {
        if !is_still(name) {
            bail!(
                "{}: only a still picture (.{}) can be written to memory; a video is written to a file",
                name.display(),
                STILL_EXTENSIONS.join(", .")
            );
        }
        StillWriter::in_memory(name, src, settings).map(|w| Writer::Still(Box::new(w)))
    }

    /// The encoded picture of a writer made with [`Writer::in_memory`], once written
    /// ([`StillWriter::take_encoded`]); `None` for a video.
    pub fn take_encoded(&mut self) -> Option<Vec<u8>> {
        match self {
            Writer::Video(_) => None,
            Writer::Still(s) => s.take_encoded(),
        }
    }

    pub fn write(&mut self, frame: &mut Frame) -> Result<()> {
        match self {
            Writer::Video(e) => e.write(frame),
            Writer::Still(s) => s.write(frame),
        }
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        match self {
            Writer::Video(e) => e.frames,
            Writer::Still(s) => s.frames.min(1),
        }
    }

    /// Finishes the file (`cut`: the run stopped early on purpose, for videos).
    pub fn finish(self, cut: bool) -> Result<u64> {
        match self {
            Writer::Video(e) => e.finish(cut),
            Writer::Still(s) => s.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::kind::is_other_image;

    #[test]
    fn the_orientation_entry_is_reset_in_either_byte_order() {
        let mut le = b"II\x2a\x00\x08\x00\x00\x00\x02\x00\x0f\x01\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00\x12\x01\x03\x00\x01\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00".to_vec();
        set_orientation_upright(&mut le);
        assert_eq!(&le[30..32], [1, 0]);
        let mut be =
            b"MM\x00\x2a\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00\x08\x00\x00\x00\x00\x00\x00"
                .to_vec();
        set_orientation_upright(&mut be);
        assert_eq!(&be[18..20], [0, 1]);
        let mut short = b"II\x2a\x00\xff\x00\x00\x00".to_vec();
        set_orientation_upright(&mut short);
        assert_eq!(short, b"II\x2a\x00\xff\x00\x00\x00", "a broken block is left alone");
    }

    #[test]
    fn stills_are_told_by_extension() {
        assert!(is_still(Path::new("a/b.JPG")) && is_still(Path::new("x.tiff")));
        assert!(!is_still(Path::new("x.mp4")) && !is_still(Path::new("x")));
        assert!(is_other_image(Path::new("x.gif")));
        assert_eq!(encoder_for(Path::new("x.jpeg")), Some("mjpeg"));
    }
}
