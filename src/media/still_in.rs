//! Still inputs read with the `image` crate: in, a still's bytes (its file, or bytes in memory)
//! in a format `image` decodes here (PNG, JPEG, WebP, BMP, TIFF, QOI) and the most pixels it may
//! have; out, its [`Header`] (stored size, alpha, depth, EXIF orientation, ICC profile and EXIF
//! block) and its picture as stored (packed RGB8, and its alpha), decoded under `image`'s
//! `Limits`, so no header and no compressed chunk makes a decoder allocate past them. Other
//! formats (AVIF, HEIC, GIF, videos), and variants `image` calls unsupported in a file, are
//! left to FFmpeg.
//!
//! The bounds: a picture of more pixels than the cap (a service's `--max-pixels`) or than
//! FFmpeg converts and encodes is refused once its header is read, before its data is; every
//! decoder is held to sides within the cap, and besides the picture may allocate
//! [`crate::defaults::MAX_METADATA_BYTES`] and a row (PNG's inflated ICC profile and its rows)
//! and, for TIFF, another picture's worth of compressed strips. PNG text chunks are never
//! inflated, and an ICC profile past the limit is dropped by the PNG decoder. A frame header
//! that hides another (a second JPEG SOF, a WebP bitstream larger than its canvas) is an error
//! of the decoder, not a larger allocation.
//!
//! Colour: 8 bits a channel whatever the source's depth (16-bit PNG and TIFF rounded to 8), grey
//! repeated into R, G and B, CMYK JPEG converted to RGB by the JPEG decoder, the colours under
//! transparent pixels kept as stored (the alpha is read again for outputs that hold it:
//! [`alpha`]). A palette PNG has alpha only when it has a transparency chunk.

use std::io::{BufRead, BufReader, Cursor, Seek};
use std::path::Path;

use anyhow::{anyhow, Result};
use image::{DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};

/// The formats read here; anything else goes to FFmpeg.
const FORMATS: [ImageFormat; 6] = [
    ImageFormat::Png,
    ImageFormat::Jpeg,
    ImageFormat::WebP,
    ImageFormat::Bmp,
    ImageFormat::Tiff,
    ImageFormat::Qoi,
];

/// Bytes a PNG decoder allocates for each pixel of a row (RGBA at 16 bits, at most).
const ROW_BYTES_PER_PIXEL: u64 = 8;

/// The format `image` reads of a picture whose bytes start with `head`, among those read here.
pub(crate) fn format_of(head: &[u8]) -> Option<ImageFormat> {
    image::guess_format(head).ok().filter(|f| FORMATS.contains(f))
}

/// What a still's header says, read before its picture is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub format: ImageFormat,
    /// The picture as stored (before its EXIF orientation).
    pub width: u32,
    pub height: u32,
    /// The decoded picture has an alpha channel (RGBA, grey and alpha, a palette with a
    /// transparency chunk).
    pub alpha: bool,
    /// Bits per channel as stored (16 for a 16-bit PNG or TIFF).
    pub depth: u8,
    /// EXIF orientation, 1 (upright) to 8.
    pub orientation: u8,
    /// The ICC profile, as the decoder read it (a PNG's inflated within the limit).
    pub icc: Option<Vec<u8>>,
    /// The EXIF block (a TIFF structure, without JPEG's `Exif\0\0` prefix).
    pub(crate) exif: Option<Vec<u8>>,
}

impl Header {
    /// FFmpeg's name of the format's decoder, as a source's codec is named.
    pub(crate) fn codec(&self) -> &'static str {
        match self.format {
            ImageFormat::Png => "png",
            ImageFormat::Jpeg => "mjpeg",
            ImageFormat::WebP => "webp",
            ImageFormat::Bmp => "bmp",
            ImageFormat::Tiff => "tiff",
            ImageFormat::Qoi => "qoi",
            _ => "",
        }
    }
}

/// Why a still was not read.
#[derive(Debug)]
pub(crate) enum Unread {
    /// A variant of its format `image` does not decode (FFmpeg may, for a file).
    Unsupported(String),
    /// A picture of `(width, height)` over the cap.
    TooLarge(u64, u64),
    /// An animated WebP: a moving picture, not a still.
    Animated,
    /// Damaged, cut short, or past the limits: what the decoder said.
    Damaged(String),
    /// The file could not be read.
    Io(std::io::Error),
}

impl From<ImageError> for Unread {
    fn from(e: ImageError) -> Self {
        match e {
            ImageError::Unsupported(u) => Unread::Unsupported(u.to_string()),
            ImageError::IoError(io) if io.kind() != std::io::ErrorKind::UnexpectedEof => Unread::Io(io),
            ImageError::IoError(_) => Unread::Damaged("it ends early".into()),
            ImageError::Limits(l) => Unread::Damaged(format!(
                "{l}: it would make its decoder allocate more than a picture of its size needs"
            )),
            other => Unread::Damaged(other.to_string()),
        }
    }
}

impl Unread {
    /// What is wrong with the still `path` names (read from `bytes` when given), `cap` the most
    /// pixels it may have, in words with what to do: the file's own bytes are asked where the
    /// decoder's words are not enough (a PNG cut short, a JPEG without its frame header).
    pub(crate) fn words(self, path: &Path, bytes: Option<&[u8]>, cap: Option<u64>) -> String {
        let name = path.display().to_string();
        match self {
            Unread::TooLarge(w, h) => too_large(w, h, cap).replace("{in}", &name),
            Unread::Animated => crate::media::sniff::ANIMATED_WEBP.replace("{in}", &name),
            Unread::Io(e) => format!("it cannot be read ({e})"),
            Unread::Unsupported(why) => format!(
                "a kind of picture gpen-video does not decode ({why}); save it as an ordinary PNG or JPEG and restore that"
            ),
            Unread::Damaged(why) => crate::media::sniff::explain_source(path, bytes).unwrap_or_else(|| {
                format!(
                    "its picture cannot be decoded ({why}): the file is damaged, or not the kind of file its name says"
                )
            }),
        }
    }

    /// The error of input `path` that [`Unread::words`] says.
    pub(crate) fn into_error(self, path: &Path, bytes: Option<&[u8]>, cap: Option<u64>) -> anyhow::Error {
        anyhow!("input {}: {}", path.display(), self.words(path, bytes, cap))
    }
}

/// "a W x H picture (N megapixels) ...": over `cap`, else over what FFmpeg takes.
fn too_large(w: u64, h: u64, cap: Option<u64>) -> String {
    match cap {
        Some(cap) if w.saturating_mul(h) > cap => format!(
            "a {w}x{h} picture ({:.1} megapixels), larger than this service takes ({:.1}, --max-pixels); scale it down first",
            w.saturating_mul(h) as f64 / 1e6,
            cap as f64 / 1e6
        ),
        _ => crate::media::sniff::too_large(w, h).unwrap_or_default(),
    }
}

/// Whether a `w` x `h` picture is within `cap` pixels and what FFmpeg converts and encodes.
fn fits(w: u64, h: u64, cap: Option<u64>) -> bool {
    cap.is_none_or(|c| w.saturating_mul(h) <= c) && crate::media::sniff::too_large(w, h).is_none()
}

/// The limits a still's decoder works under, `head` the source's first bytes: sides within the
/// cap (set once its header showed it fits, so a picture too large is named with its size), and
/// for what it allocates before its size is known [`crate::defaults::MAX_METADATA_BYTES`] (a
/// PNG's inflated ICC profile) and, for a PNG, a row of the width its header declares (PNG's
/// whole budget, given before its header is read).
fn limits(cap: Option<u64>, head: &[u8]) -> Limits {
    let side = crate::media::sniff::ffmpeg_max_side().min(cap.unwrap_or(u64::MAX));
    let row = crate::media::sniff::png_size(head).map_or(0, |(w, _)| w.min(side));
    let mut l = Limits::no_limits();
    l.max_image_width = Some(u32::try_from(side).unwrap_or(u32::MAX));
    l.max_image_height = l.max_image_width;
    l.max_alloc = Some(crate::defaults::MAX_METADATA_BYTES + row * ROW_BYTES_PER_PIXEL);
    l
}

/// A reader that `image` can seek.
trait Input: BufRead + Seek {}
impl<T: BufRead + Seek> Input for T {}

/// The source's reader: its bytes in memory, or its file.
fn open<'a>(path: &Path, bytes: Option<&'a [u8]>) -> Result<Box<dyn Input + 'a>, Unread> {
    Ok(match bytes {
        Some(b) => Box::new(Cursor::new(b)),
        None => Box::new(BufReader::new(std::fs::File::open(path).map_err(Unread::Io)?)),
    })
}

/// The source's first bytes (enough for its format and a PNG's header), the reader rewound.
fn head_of(input: &mut dyn Input) -> Result<Vec<u8>, Unread> {
    let mut head = [0u8; 32];
    let mut n = 0;
    while n < head.len() {
        match std::io::Read::read(input, &mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Unread::Io(e)),
        }
    }
    input.rewind().map_err(Unread::Io)?;
    Ok(head[..n].to_vec())
}

/// A still's decoder, its header read, and what the header says.
type Opened<'a> = (Box<dyn ImageDecoder + 'a>, Header);

/// A still's decoder with its header read, under the limits for `cap`, checked to fit it and
/// then given the limits for its own size; with its header. `None` when the source is not a
/// format read here.
fn decoder<'a>(path: &Path, bytes: Option<&'a [u8]>, cap: Option<u64>) -> Result<Option<Opened<'a>>, Unread> {
    let mut input = open(path, bytes)?;
    let head = head_of(&mut input)?;
    let Some(format) = format_of(&head) else {
        return Ok(None);
    };
    // The size its header declares, when over the limit: said before any decoder reads it, so
    // a picture too large is that whatever its format (a decoder may refuse it first in words
    // of its own, as damage).
    if let Some((w, h)) = crate::media::sniff::declared_size(bytes.unwrap_or(&head)) {
        if !fits(w, h, cap) {
            return Err(Unread::TooLarge(w, h));
        }
    }
    let mut limits = limits(cap, &head);
    let opened = if format == ImageFormat::WebP {
        image::codecs::webp::WebPDecoder::new(input)
            .map_err(Unread::from)
            .and_then(|d| {
                if d.has_animation() {
                    return Err(Unread::Animated);
                }
                Ok(Box::new(d) as Box<dyn ImageDecoder + 'a>)
            })
    } else {
        let mut reader = ImageReader::with_format(input, format);
        let mut first = limits.clone();
        (first.max_image_width, first.max_image_height) = (None, None);
        reader.limits(first);
        reader
            .into_decoder()
            .map(|d| Box::new(d) as Box<dyn ImageDecoder + 'a>)
            .map_err(Unread::from)
    };
    let mut dec = match opened {
        Ok(d) => d,
        // A PNG whose data does not follow its header (cut short, or only a header): the size
        // it declares, when too large, is what to say first.
        Err(Unread::Damaged(_)) if crate::media::sniff::png_size(&head).is_some_and(|(w, h)| !fits(w, h, cap)) => {
            let (w, h) = crate::media::sniff::png_size(&head).unwrap_or_default();
            return Err(Unread::TooLarge(w, h));
        }
        Err(e) => return Err(e),
    };
    let (w, h) = dec.dimensions();
    if !fits(u64::from(w), u64::from(h), cap) {
        return Err(Unread::TooLarge(w.into(), h.into()));
    }
    // Its picture, and besides it another picture's worth and what the limits gave before:
    // TIFF sizes its picture and its compressed strips by them (one strip may hold it all).
    let picture = dec.total_bytes();
    limits.max_alloc = limits.max_alloc.map(|m| m.saturating_add(picture.saturating_mul(2)));
    dec.set_limits(limits)?;
    let original = dec.original_color_type();
    let channels = u16::from(original.channel_count().max(1));
    // Metadata that cannot be read is left out, never a reason to refuse the picture.
    let header = Header {
        format,
        width: w,
        height: h,
        alpha: dec.color_type().has_alpha(),
        depth: (original.bits_per_pixel() / channels).min(255) as u8,
        orientation: dec.orientation().map_or(1, |o| o.to_exif()),
        icc: dec.icc_profile().ok().flatten(),
        exif: dec.exif_metadata().ok().flatten().map(|mut e| {
            if e.starts_with(b"Exif\0\0") {
                e.drain(..6);
            }
            e
        }),
    };
    Ok(Some((dec, header)))
}

/// The header of the still `path` names (read from `bytes` when given), `cap` the most pixels
/// it may have. `Ok(None)` for a source that is not a format read here.
pub(crate) fn header(path: &Path, bytes: Option<&[u8]>, cap: Option<u64>) -> Result<Option<Header>, Unread> {
    Ok(decoder(path, bytes, cap)?.map(|(_, h)| h))
}

/// The still's picture as stored, decoded under the limits for `cap`; an error names the file
/// and says that nothing was written.
pub(crate) fn decode(path: &Path, bytes: Option<&[u8]>, cap: Option<u64>) -> Result<DynamicImage> {
    decoder(path, bytes, cap)
        .and_then(|d| d.ok_or_else(|| Unread::Unsupported("not a format read here".into())))
        .and_then(|(dec, _)| DynamicImage::from_decoder(dec).map_err(Unread::from))
        .map_err(|e| anyhow!("{}: {}; no output written", path.display(), e.words(path, bytes, cap)))
}

/// The still's picture as packed RGB8, `width * height * 3` bytes, as stored.
pub(crate) fn rgb(picture: DynamicImage) -> Vec<u8> {
    picture.into_rgb8().into_raw()
}

/// The alpha channel of the still's picture, one byte a pixel as stored (255 throughout for a
/// picture without one).
pub(crate) fn alpha(picture: &DynamicImage) -> Vec<u8> {
    match picture {
        DynamicImage::ImageRgba8(p) => p.pixels().map(|px| px.0[3]).collect(),
        DynamicImage::ImageLumaA8(p) => p.pixels().map(|px| px.0[1]).collect(),
        p => p.to_rgba8().pixels().map(|px| px.0[3]).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w` x `h` PNG of `color`, its pixels a ramp.
    fn png(w: u32, h: u32, color: image::ExtendedColorType) -> Vec<u8> {
        use image::ImageEncoder;
        let n = (w * h) as usize * color.bits_per_pixel() as usize / 8;
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        image::codecs::png::PngEncoder::new(&mut out)
            .write_image(&data, w, h, color)
            .unwrap();
        out
    }

    /// `png` with a chunk of `kind` holding `data` after its IHDR, its CRC right.
    fn with_chunk(png: &[u8], kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend(kind);
        c.extend(data);
        let crc = crc32(&c[4..]);
        c.extend(crc.to_be_bytes());
        [&png[..33], &c, &png[33..]].concat()
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
            }
        }
        !c
    }

    fn read(bytes: &[u8], cap: Option<u64>) -> Result<Header, Unread> {
        header(Path::new("x.png"), Some(bytes), cap).map(|h| h.expect("a PNG"))
    }

    #[test]
    fn only_the_formats_read_here_are_claimed() {
        assert_eq!(format_of(b"\x89PNG\r\n\x1a\n\0\0"), Some(ImageFormat::Png));
        assert_eq!(format_of(&[0xff, 0xd8, 0xff, 0xe0]), Some(ImageFormat::Jpeg));
        assert_eq!(format_of(b"qoif\0\0\0\x01"), Some(ImageFormat::Qoi));
        assert_eq!(
            format_of(b"GIF89a\x01\0\x01\0"),
            None,
            "GIF is read by FFmpeg, as a video"
        );
        assert_eq!(format_of(b"\0\0\0\x1cftypavif"), None);
        assert_eq!(format_of(b""), None);
        let text = b"not a picture";
        assert!(matches!(header(Path::new("x.png"), Some(text), None), Ok(None)));
    }

    #[test]
    fn the_limits_bound_the_sides_by_the_cap_and_by_ffmpeg() {
        let head = png(640, 2, image::ExtendedColorType::Rgb8);
        let l = limits(Some(1_000_000), &head);
        assert_eq!(l.max_image_width, Some(1_000_000));
        assert_eq!(l.max_alloc, Some(crate::defaults::MAX_METADATA_BYTES + 640 * 8));
        let side = crate::media::sniff::ffmpeg_max_side();
        let l = limits(None, b"\xff\xd8\xff");
        assert_eq!(
            (l.max_image_height, l.max_alloc),
            (Some(side as u32), Some(crate::defaults::MAX_METADATA_BYTES))
        );
        assert!(fits(16000, 16000, None) && !fits(20000, 20000, None));
        assert!(fits(side, 1, None) && !fits(side + 1, 1, None));
        assert!(fits(1000, 1000, Some(1_000_000)) && !fits(1001, 1000, Some(1_000_000)));
        assert!(too_large(2000, 2000, Some(1_000_000)).contains("2000x2000 picture (4.0 megapixels)"));
        assert!(too_large(30000, 20000, None).contains("30000x20000 picture (600 megapixels)"));
    }

    #[test]
    fn a_header_says_size_alpha_and_depth_and_the_picture_is_rgb8() {
        use image::ExtendedColorType::{La8, Rgb16, Rgba8};
        let h = read(&png(40, 30, Rgba8), None).unwrap();
        assert_eq!(
            (h.width, h.height, h.alpha, h.depth, h.orientation),
            (40, 30, true, 8, 1)
        );
        assert_eq!((h.codec(), &h.icc, &h.exif), ("png", &None, &None));
        assert_eq!(read(&png(4, 3, Rgb16), None).unwrap().depth, 16);
        let bytes = png(5, 4, La8);
        let picture = decode(Path::new("x.png"), Some(&bytes), None).unwrap();
        let alpha = alpha(&picture);
        let rgb = rgb(picture);
        assert_eq!((rgb.len(), alpha.len()), (5 * 4 * 3, 5 * 4));
        // Grey and alpha: grey repeated into R, G and B, the alpha apart.
        assert_eq!((&rgb[..6], &alpha[..2]), (&[0u8, 0, 0, 2, 2, 2][..], &[1u8, 3][..]));
    }

    /// An uncompressed `w` x `h` RGB TIFF of one strip (as some scanners write them).
    fn tiff_one_strip(w: u32, h: u32) -> Vec<u8> {
        let data_len = w * h * 3;
        let tags: [(u16, u16, u32); 9] = [
            (256, 4, w),
            (257, 4, h),
            (258, 3, 8),
            (259, 3, 1),
            (262, 3, 2),
            (273, 4, 8 + 2 + 9 * 12 + 4),
            (277, 3, 3),
            (278, 4, h),
            (279, 4, data_len),
        ];
        let mut t = b"II*\0\x08\0\0\0".to_vec();
        t.extend(9u16.to_le_bytes());
        for (tag, kind, value) in tags {
            t.extend(tag.to_le_bytes());
            t.extend(kind.to_le_bytes());
            t.extend(1u32.to_le_bytes());
            // BitsPerSample's one value stands for all three samples.
            t.extend(if kind == 3 {
                [value.to_le_bytes()[0], value.to_le_bytes()[1], 0, 0]
            } else {
                value.to_le_bytes()
            });
        }
        t.extend(0u32.to_le_bytes());
        t.extend((0..data_len).map(|i| (i % 253) as u8));
        t
    }

    #[test]
    fn a_tiff_whose_one_strip_is_larger_than_the_metadata_allowance_is_read() {
        let tiff = tiff_one_strip(2000, 1500);
        assert!(tiff.len() as u64 > crate::defaults::MAX_METADATA_BYTES);
        let path = Path::new("scan.tiff");
        let h = header(path, Some(&tiff), Some(3_000_000)).unwrap().expect("a TIFF");
        assert_eq!((h.codec(), h.width, h.height, h.depth), ("tiff", 2000, 1500, 8));
        let picture = decode(path, Some(&tiff), Some(3_000_000)).unwrap();
        assert_eq!(&rgb(picture)[..4], &[0, 1, 2, 3]);
    }

    #[test]
    fn pictures_past_the_cap_or_the_limits_are_refused_or_left_out() {
        use image::ExtendedColorType::Rgb8;
        // Over the cap: refused once the header is read, named by its size.
        assert!(matches!(
            read(&png(1001, 1000, Rgb8), Some(1_000_000)),
            Err(Unread::TooLarge(1001, 1000))
        ));
        assert!(read(&png(1000, 1000, Rgb8), Some(1_000_000)).is_ok());
        // A header that declares 30000x20000 and nothing after it: its size is what is said.
        let mut huge = png(8, 8, Rgb8)[..33].to_vec();
        huge[16..24].copy_from_slice(&[0, 0, 0x75, 0x30, 0, 0, 0x4e, 0x20]);
        assert!(matches!(read(&huge, None), Err(Unread::TooLarge(30000, 20000))));
        let said = read(&huge, None)
            .unwrap_err()
            .words(Path::new("x.png"), Some(&huge), None);
        assert!(said.contains("larger than FFmpeg decodes or encodes"), "{said}");
        // An ICC profile that inflates past the limit is left out; the picture is read.
        let good = png(16, 16, Rgb8);
        let zeros = miniz_oxide::deflate::compress_to_vec_zlib(&vec![0u8; 64 << 20], 9);
        let bomb = with_chunk(&good, b"iCCP", &[&b"icc\0\0"[..], &zeros].concat());
        let h = read(&bomb, Some(1_000_000)).unwrap();
        assert_eq!((h.width, h.icc), (16, None));
        let small = miniz_oxide::deflate::compress_to_vec_zlib(&[7u8; 600], 6);
        let kept = with_chunk(&good, b"iCCP", &[&b"icc\0\0"[..], &small].concat());
        assert_eq!(read(&kept, Some(1_000_000)).unwrap().icc, Some(vec![7u8; 600]));
        // Cut short: damaged, in the file's own words where they say more.
        let cut = &good[..good.len() - 20];
        let said = decode(Path::new("cut.png"), Some(cut), None).unwrap_err().to_string();
        assert!(said.contains("cut.png") && said.contains("cut short"), "{said}");
    }
}
