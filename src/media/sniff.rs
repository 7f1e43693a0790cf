//! What a file's own bytes say when its decoder (FFmpeg, or `image` for a still) cannot read
//! it: in, a path or the file's bytes in memory with its name (its first and last bytes: PNG
//! chunks, JPEG markers, WebP chunks, ISO-BMFF boxes); out, a sentence naming the real cause (a
//! picture too large to decode, an animated WebP, a HEIC picture, a JPEG without its frame
//! header, a file cut short, a playlist or list of other files) and what to do, or nothing when
//! the bytes say nothing. Words only: what a still may allocate is bounded where it is decoded
//! (`media::still_in`).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The most pixels FFmpeg decodes in one picture: `av_image_check_size` wants
/// (w + 128) * (h + 128) below INT_MAX / 8.
const FFMPEG_MAX_PIXELS: u64 = (i32::MAX as u64) / 8;

/// The widest (or tallest) picture FFmpeg takes, one pixel high (see [`FFMPEG_MAX_PIXELS`]).
pub(crate) fn ffmpeg_max_side() -> u64 {
    (FFMPEG_MAX_PIXELS - 1) / 129 - 128
}

/// How many bytes of the file's start are looked at.
const HEAD: usize = 64 * 1024;

/// The cause of FFmpeg's failure on `path`, in words, with what to do; `None` when its bytes
/// show nothing wrong (the caller keeps FFmpeg's own reason).
pub(crate) fn explain(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let size = f.metadata().ok()?.len();
    let mut head = Vec::with_capacity(HEAD);
    f.by_ref().take(HEAD as u64).read_to_end(&mut head).ok()?;
    let mut tail = [0u8; 16];
    let tail_len = if size >= 16 {
        f.seek(SeekFrom::End(-16)).ok()?;
        f.read_exact(&mut tail).ok()?;
        16
    } else {
        0
    };
    judge(path, &head, &tail[..tail_len], size)
}

/// The cause of FFmpeg's failure on a file's `bytes` in memory, named `name` (as [`explain`]
/// of that file says it).
pub(crate) fn explain_bytes(name: &Path, bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(HEAD)];
    let tail = if bytes.len() >= 16 {
        &bytes[bytes.len() - 16..]
    } else {
        &[]
    };
    judge(name, head, tail, bytes.len() as u64)
}

/// [`explain_bytes`] for a source in memory (`bytes` given), else [`explain`] of its file.
pub(crate) fn explain_source(path: &Path, bytes: Option<&[u8]>) -> Option<String> {
    match bytes {
        Some(b) => explain_bytes(path, b),
        None => explain(path),
    }
}

/// The verdict on a file of `size` bytes from its first bytes (`head`, at most [`HEAD`]) and
/// its last 16 (`tail`, none when it is shorter), `{in}` in it replaced by `path`.
fn judge(path: &Path, head: &[u8], tail: &[u8], size: u64) -> Option<String> {
    let why = if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        png(head, tail, size)
    } else if head.starts_with(&[0xff, 0xd8]) {
        jpeg(head)
    } else if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        webp(head)
    } else if head.len() >= 12 && &head[4..8] == b"ftyp" {
        iso_bmff(head, size)
    } else {
        list(head)
    };
    why.map(|w| w.replace("{in}", &path.display().to_string()))
}

/// A playlist or list of other files (HLS, DASH, an FFmpeg concat list), in words.
fn list(head: &[u8]) -> Option<String> {
    let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let text = &text[text.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(text.len())..];
    let kind = if text.starts_with(b"ffconcat version") {
        "an FFmpeg concat list"
    } else if text.starts_with(b"#EXTM3U") {
        "an HLS playlist"
    } else if text.starts_with(b"<") && head.windows(4).any(|w| w == b"<MPD") {
        "a DASH manifest"
    } else {
        return None;
    };
    Some(format!(
        "{kind}, which names other files or addresses, and gpen-video reads only the file it is given; make one self-contained file from the sources you trust (for example `ffmpeg -i LIST -c copy one.mp4`) and give that"
    ))
}

/// "a W x H picture (N megapixels) ..." when it is larger than FFmpeg decodes, converts and
/// encodes (a still read by `image` is still converted and written by FFmpeg).
pub(crate) fn too_large(w: u64, h: u64) -> Option<String> {
    (w.saturating_add(128).saturating_mul(h.saturating_add(128)) >= FFMPEG_MAX_PIXELS).then(|| {
        format!(
            "a {w}x{h} picture ({} megapixels), larger than FFmpeg decodes or encodes (about {} megapixels at most, e.g. 16000x16000): scale it down first (e.g. magick {{in}} -resize 50% smaller.png) and restore that",
            w * h / 1_000_000,
            FFMPEG_MAX_PIXELS / 1_000_000
        )
    })
}

/// The size a PNG's header (its first chunk, IHDR) declares, whatever follows it.
pub(crate) fn png_size(head: &[u8]) -> Option<(u64, u64)> {
    // The signature, then length, "IHDR", width, height.
    if !head.starts_with(b"\x89PNG\r\n\x1a\n") || head.get(12..16) != Some(b"IHDR") {
        return None;
    }
    let side = |i: usize| Some(u64::from(u32::from_be_bytes(head.get(i..i + 4)?.try_into().ok()?)));
    Some((side(16)?, side(20)?))
}

/// The size a still's header declares, read from its first bytes (`head`) in every format the
/// service takes (PNG, JPEG, WebP, TIFF, BMP) whatever follows, so a picture claiming more
/// pixels than allowed is refused for its size before a decoder is asked (which may refuse it
/// first in words of its own). `None` when the header says nothing readable in `head`.
pub(crate) fn declared_size(head: &[u8]) -> Option<(u64, u64)> {
    let u16be = |i: usize| Some(u64::from(u16::from_be_bytes(head.get(i..i + 2)?.try_into().ok()?)));
    let u16le = |i: usize| Some(u64::from(u16::from_le_bytes(head.get(i..i + 2)?.try_into().ok()?)));
    let u32le = |i: usize| Some(u32::from_le_bytes(head.get(i..i + 4)?.try_into().ok()?));
    if let Some(s) = png_size(head) {
        return Some(s);
    }
    if head.starts_with(&[0xff, 0xd8]) {
        // The markers up to the frame header (SOF0-SOF15 but DHT, JPG, DAC).
        let mut i = 2;
        while i + 4 <= head.len() && head[i] == 0xff {
            let m = head[i + 1];
            if m == 0xff {
                i += 1;
                continue;
            }
            if (0xc0..=0xcf).contains(&m) && !matches!(m, 0xc4 | 0xc8 | 0xcc) {
                return Some((u16be(i + 7)?, u16be(i + 5)?));
            }
            if m == 0xda || m == 0xd9 {
                return None;
            }
            i += 2 + u16be(i + 2)? as usize;
        }
        return None;
    }
    if head.len() >= 30 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        let u24 = |i: usize| u64::from(u32::from_le_bytes([head[i], head[i + 1], head[i + 2], 0]));
        return match &head[12..16] {
            b"VP8X" => Some((1 + u24(24), 1 + u24(27))),
            b"VP8 " if head[23..26] == [0x9d, 0x01, 0x2a] => Some((u16le(26)? & 0x3fff, u16le(28)? & 0x3fff)),
            b"VP8L" if head[20] == 0x2f => {
                let bits = u32le(21)?;
                Some((u64::from(bits & 0x3fff) + 1, u64::from((bits >> 14) & 0x3fff) + 1))
            }
            _ => None,
        };
    }
    if head.starts_with(b"II*\0") || head.starts_with(b"MM\0*") {
        // The first directory's ImageWidth (256) and ImageLength (257), SHORT or LONG.
        let le = head[0] == b'I';
        let n16 = |i: usize| -> Option<u64> {
            let b: [u8; 2] = head.get(i..i + 2)?.try_into().ok()?;
            Some(u64::from(if le {
                u16::from_le_bytes(b)
            } else {
                u16::from_be_bytes(b)
            }))
        };
        let n32 = |i: usize| -> Option<u64> {
            let b: [u8; 4] = head.get(i..i + 4)?.try_into().ok()?;
            Some(u64::from(if le {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }))
        };
        let ifd = n32(4)? as usize;
        let (mut w, mut h) = (None, None);
        for k in 0..n16(ifd)? as usize {
            let e = ifd + 2 + 12 * k;
            let value = match n16(e + 2)? {
                3 => n16(e + 8)?,
                4 => n32(e + 8)?,
                _ => continue,
            };
            match n16(e)? {
                256 => w = Some(value),
                257 => h = Some(value),
                _ => {}
            }
        }
        return w.zip(h);
    }
    if head.starts_with(b"BM") {
        // An OS/2 1.x core header (12 bytes) holds 16-bit sides; the others signed 32-bit ones
        // (a negative height: rows top-down).
        if u32le(14)? == 12 {
            return Some((u16le(18)?, u16le(20)?));
        }
        let side = |i: usize| u32le(i).map(|v| u64::from((v as i32).unsigned_abs()));
        return Some((side(18)?, side(22)?));
    }
    None
}

fn png(head: &[u8], tail: &[u8], size: u64) -> Option<String> {
    if let Some(why) = png_size(head).and_then(|(w, h)| too_large(w, h)) {
        return Some(why);
    }
    // Every PNG ends with an empty IEND chunk: its type and CRC are the last 8 bytes.
    if size > 8 && !tail.ends_with(b"IEND\xae\x42\x60\x82") {
        return Some(
            "the PNG is cut short (it ends before its closing IEND chunk: an interrupted download or copy); copy it again from its source".into(),
        );
    }
    None
}

fn jpeg(head: &[u8]) -> Option<String> {
    // Walk the markers up to the scan: a frame header (SOF0-SOF15 but DHT, JPG, DAC) must come
    // before it.
    let mut i = 2;
    while i + 4 <= head.len() {
        if head[i] != 0xff {
            break;
        }
        let m = head[i + 1];
        if m == 0xff {
            i += 1;
            continue;
        }
        if (0xc0..=0xcf).contains(&m) && !matches!(m, 0xc4 | 0xc8 | 0xcc) {
            let (h, w) = (
                u16::from_be_bytes([*head.get(i + 5)?, *head.get(i + 6)?]) as u64,
                u16::from_be_bytes([*head.get(i + 7)?, *head.get(i + 8)?]) as u64,
            );
            if w == 0 || h == 0 {
                break;
            }
            return None;
        }
        if m == 0xda || m == 0xd9 {
            break;
        }
        let len = u16::from_be_bytes([head[i + 2], head[i + 3]]) as usize;
        i += 2 + len;
    }
    if i + 4 > head.len() && head.len() == HEAD {
        // Metadata longer than was read: nothing can be said.
        return None;
    }
    Some(
        "the JPEG is damaged: it has no readable frame header (the part that gives the picture's size), so nothing can be decoded; export or copy it again from the original".into(),
    )
}

/// What an animated WebP is and what to do, `{in}` its name.
pub(crate) const ANIMATED_WEBP: &str = "an animated WebP, which FFmpeg cannot decode; convert it to a video first (e.g. magick {in} frame-%04d.png, then ffmpeg -framerate 10 -i frame-%04d.png anim.mp4) and restore that";

fn webp(head: &[u8]) -> Option<String> {
    // VP8X's flags byte: bit 1 is "animated"; an ANIM chunk says the same.
    let animated =
        (head.len() > 20 && &head[12..16] == b"VP8X" && head[20] & 0x02 != 0) || head.windows(4).any(|w| w == b"ANIM");
    if animated {
        return Some(ANIMATED_WEBP.into());
    }
    if head.len() > 30 && &head[12..16] == b"VP8X" {
        let w = 1 + u32::from_le_bytes([head[24], head[25], head[26], 0]) as u64;
        let h = 1 + u32::from_le_bytes([head[27], head[28], head[29], 0]) as u64;
        return too_large(w, h);
    }
    None
}

fn iso_bmff(head: &[u8], size: u64) -> Option<String> {
    let brands = &head[8..head.len().min(u32::from_be_bytes(head[..4].try_into().ok()?) as usize)];
    let has = |b: &[u8; 4]| brands.chunks_exact(4).any(|c| c == b);
    if [b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"]
        .iter()
        .any(|b| has(b))
        || (has(b"mif1") && !has(b"avif"))
    {
        return Some(
            "a HEIC/HEIF picture, which this FFmpeg cannot read; convert it to PNG or JPEG first (e.g. heif-convert {in} picture.png) and restore that".into(),
        );
    }
    // Top-level boxes: a file whose media data runs past its end and that has no index (moov)
    // was cut short while its index was still to be written at the end.
    let mut at = 0u64;
    let mut moov = false;
    let mut cut_in_mdat = false;
    while at + 8 <= head.len() as u64 {
        let i = at as usize;
        let mut len = u32::from_be_bytes(head[i..i + 4].try_into().ok()?) as u64;
        let kind = &head[i + 4..i + 8];
        if len == 1 {
            len = u64::from_be_bytes(head.get(i + 8..i + 16)?.try_into().ok()?);
        } else if len == 0 {
            len = size.saturating_sub(at);
        }
        if len < 8 {
            break;
        }
        moov |= kind == b"moov";
        // A size past any file (a crafted header) is a box that runs past this one's end.
        let end = at.saturating_add(len);
        if end > size {
            cut_in_mdat = kind == b"mdat";
            break;
        }
        if kind == b"mdat" && end == size {
            // The media data runs to the very end: nothing after it, so no index there.
            cut_in_mdat = !moov;
        }
        at = end;
        if at as usize >= head.len() {
            // The rest of the boxes lie beyond what was read (moov after a long mdat): walk on
            // by seeking is not needed for the verdict below.
            break;
        }
    }
    (cut_in_mdat && !moov).then(|| {
        "the file is cut short: it ends inside its media data, and its index (the moov box, which this file keeps at the end) was never written, so no frame can be found. Copy it again from its source; a recording that stopped abruptly can sometimes be rebuilt from a good file of the same camera (e.g. with untrunc)".into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `f` says of `bytes` written to a file; what they say in memory is the same.
    fn with(bytes: &[u8], f: impl FnOnce(&Path) -> Option<String>) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, bytes).unwrap();
        let said = f(&p);
        assert_eq!(
            explain_bytes(&p, bytes),
            said,
            "the bytes in memory say what their file says"
        );
        said
    }

    #[test]
    fn an_oversized_png_header_and_a_missing_end_chunk_are_named() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&30000u32.to_be_bytes());
        png.extend_from_slice(&20000u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        let why = with(&png, explain).unwrap();
        assert!(why.contains("30000x20000") && why.contains("scale it down"), "{why}");
        let mut small = png.clone();
        small[16..20].copy_from_slice(&64u32.to_be_bytes());
        small[20..24].copy_from_slice(&64u32.to_be_bytes());
        assert!(with(&small, explain).unwrap().contains("cut short"));
        small.extend_from_slice(b"\0\0\0\0IEND\xae\x42\x60\x82");
        assert_eq!(with(&small, explain), None);
    }

    #[test]
    fn a_jpeg_without_a_frame_header_is_damaged_and_one_with_it_is_not_judged() {
        let mut ok = vec![
            0xff, 0xd8, 0xff, 0xe0, 0, 4, 0, 0, 0xff, 0xc0, 0, 11, 8, 0, 16, 0, 16, 1, 1, 0x11, 0,
        ];
        ok.extend_from_slice(&[0xff, 0xda, 0, 2]);
        assert_eq!(with(&ok, explain), None);
        let mut bad = ok.clone();
        bad[8..21].fill(0);
        assert!(with(&bad, explain).unwrap().contains("JPEG is damaged"));
    }

    #[test]
    fn playlists_and_lists_are_named() {
        let concat = with(b"\xef\xbb\xbf ffconcat version 1.0\nfile 'a.mp4'\n", explain).unwrap();
        assert!(
            concat.contains("concat list") && concat.contains("self-contained"),
            "{concat}"
        );
        assert!(with(b"#EXTM3U\n#EXTINF:1,\na.ts\n", explain).unwrap().contains("HLS"));
        let mpd = b"<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">";
        assert!(with(mpd, explain).unwrap().contains("DASH"));
        assert_eq!(
            with(b"file 'a.mp4'\n", explain),
            None,
            "not a list FFmpeg reads by itself"
        );
    }

    #[test]
    fn heic_brands_and_an_mp4_cut_before_its_index_are_named() {
        let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic\0\0\0\x08meta";
        assert!(with(heic, explain).unwrap().contains("HEIC"));
        let mut mp4 = b"\0\0\0\x18ftypisom\0\0\0\0isomavc1".to_vec();
        mp4.extend_from_slice(&100_000u32.to_be_bytes());
        mp4.extend_from_slice(b"mdat");
        mp4.extend_from_slice(&[0; 500]);
        assert!(with(&mp4, explain).unwrap().contains("index"));
        let mut whole = b"\0\0\0\x18ftypisom\0\0\0\0isomavc1".to_vec();
        whole.extend_from_slice(&16u32.to_be_bytes());
        whole.extend_from_slice(b"mdat");
        whole.extend_from_slice(&[0; 8]);
        whole.extend_from_slice(&8u32.to_be_bytes());
        whole.extend_from_slice(b"moov");
        assert_eq!(with(&whole, explain), None);
        // A 64-bit box size at the edge of u64 ends the walk (it wrapped round to the start).
        let mut crafted = b"\0\0\0\x18ftypisom\0\0\0\0isomavc1".to_vec();
        crafted.extend_from_slice(&1u32.to_be_bytes());
        crafted.extend_from_slice(b"free");
        crafted.extend_from_slice(&(u64::MAX - 23).to_be_bytes());
        crafted.extend_from_slice(&[0; 64]);
        assert_eq!(with(&crafted, explain), None);
        // An IHDR of 0xFFFFFFFF square does not overflow.
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&[0xff; 8]);
        png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert!(with(&png, explain).unwrap().contains("larger than FFmpeg decodes"));
    }
}
