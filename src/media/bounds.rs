//! What a picture's bytes will make its decoder allocate, read before anything is decoded: in,
//! a picture file's bytes (PNG, JPEG, WebP, TIFF or BMP); out, the largest picture any of its
//! frame headers declares (every SOF of a JPEG, every VP8X/VP8/VP8L/ANMF chunk of a WebP, the
//! IHDR and fcTL of a PNG), and the bytes its compressed metadata (PNG zTXt, iTXt, iCCP)
//! inflates to, counted without keeping them.

use miniz_oxide::inflate::stream::{inflate, InflateState};
use miniz_oxide::{DataFormat, MZFlush, MZStatus};

/// The largest picture, `(width, height)`, that any frame header in `bytes` declares (a picture
/// of format `ext`, as the service's sniffing named it): what a decoder allocates, whichever
/// header it reads. `None` when no header can be read.
pub(crate) fn largest_frame(bytes: &[u8], ext: &str) -> Option<(u64, u64)> {
    match ext {
        "png" => png_frames(bytes),
        "jpg" => jpeg_frames(bytes),
        "webp" => webp_frames(bytes),
        "bmp" => bmp_size(bytes),
        _ => imagesize::blob_size(bytes)
            .ok()
            .map(|s| (s.width as u64, s.height as u64)),
    }
}

/// The first compressed metadata chunk of a PNG whose inflated bytes, added to those of the
/// chunks before it, pass `limit`: its type (`"zTXt"`, `"iTXt"` or `"iCCP"`). `None` for a
/// PNG within the limit, or any other format (whose metadata is stored as it is, bounded by
/// the body's size).
pub(crate) fn metadata_over(bytes: &[u8], limit: u64) -> Option<&'static str> {
    let mut total = 0u64;
    for (kind, data) in png_chunks(bytes) {
        // Where the compressed stream starts: after a keyword's NUL and the method byte (zTXt,
        // iCCP); an iTXt's after its keyword, flag, method, language and translated keyword,
        // and only when its flag says it is compressed.
        let (name, stream) = match kind {
            b"zTXt" => ("zTXt", after_nul(data).and_then(|d| d.get(1..))),
            b"iCCP" => ("iCCP", after_nul(data).and_then(|d| d.get(1..))),
            b"iTXt" => (
                "iTXt",
                after_nul(data)
                    .filter(|d| d.first() == Some(&1))
                    .and_then(|d| d.get(2..))
                    .and_then(after_nul)
                    .and_then(after_nul),
            ),
            _ => continue,
        };
        let Some(stream) = stream else { continue };
        total += inflated_len(stream, limit.saturating_sub(total) + 1);
        if total > limit {
            return Some(name);
        }
    }
    None
}

/// The bytes after the first NUL of `data`.
fn after_nul(data: &[u8]) -> Option<&[u8]> {
    data.iter().position(|&b| b == 0).map(|i| &data[i + 1..])
}

/// How many bytes the zlib stream `z` inflates to, counted up to `cap` (the count stops
/// there): a damaged stream counts what it gave before the damage.
fn inflated_len(z: &[u8], cap: u64) -> u64 {
    let mut state = InflateState::new_boxed(DataFormat::Zlib);
    let mut out = vec![0u8; 64 * 1024];
    let (mut input, mut total) = (z, 0u64);
    while total < cap {
        let r = inflate(&mut state, input, &mut out, MZFlush::None);
        input = &input[r.bytes_consumed..];
        total += r.bytes_written as u64;
        match r.status {
            Ok(MZStatus::StreamEnd) | Err(_) => break,
            Ok(_) if r.bytes_consumed == 0 && r.bytes_written == 0 => break,
            Ok(_) => {}
        }
    }
    total
}

/// A PNG's chunks, `(type, data)`, up to the first that does not fit.
fn png_chunks(bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut at = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        8
    } else {
        bytes.len()
    };
    std::iter::from_fn(move || {
        let len = u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        let kind = bytes.get(at + 4..at + 8)?;
        let data = bytes.get(at + 8..(at + 8).checked_add(len)?)?;
        at += 12 + len;
        Some((kind, data))
    })
}

fn be32(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?)))
}

fn le24(b: &[u8], i: usize) -> Option<u64> {
    let v = b.get(i..i + 3)?;
    Some(u64::from(v[0]) | u64::from(v[1]) << 8 | u64::from(v[2]) << 16)
}

fn bigger(a: Option<(u64, u64)>, b: (u64, u64)) -> Option<(u64, u64)> {
    match a {
        Some(a) if a.0 * a.1 >= b.0 * b.1 => Some(a),
        _ => Some(b),
    }
}

/// The IHDR's size and every APNG frame's (fcTL), the largest.
fn png_frames(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut best = None;
    for (kind, data) in png_chunks(bytes) {
        match kind {
            b"IHDR" => best = bigger(best, (be32(data, 0)?, be32(data, 4)?)),
            b"fcTL" => best = bigger(best, (be32(data, 4)?, be32(data, 8)?)),
            _ => {}
        }
    }
    best
}

/// Every frame header (SOF0 to SOF15 but DHT, JPG and DAC) of a JPEG, the largest: markers
/// are walked through the whole file, segments skipped by their length and entropy-coded data
/// searched for the next marker, so a small frame header before the real one hides nothing.
fn jpeg_frames(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut best = None;
    let mut i = 2;
    while i + 1 < bytes.len() {
        if bytes[i] != 0xff {
            i += 1;
            continue;
        }
        let m = bytes[i + 1];
        // Fill bytes, stuffed 0xff 0x00, restart markers, SOI, EOI, TEM: no length follows.
        if matches!(m, 0xff | 0x00 | 0x01 | 0xd0..=0xd9) {
            i += if m == 0xff { 1 } else { 2 };
            continue;
        }
        let Some(len) = bytes
            .get(i + 2..i + 4)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        else {
            break;
        };
        if (0xc0..=0xcf).contains(&m) && !matches!(m, 0xc4 | 0xc8 | 0xcc) {
            if let Some(s) = bytes.get(i + 5..i + 9) {
                let (h, w) = (u16::from_be_bytes([s[0], s[1]]), u16::from_be_bytes([s[2], s[3]]));
                best = bigger(best, (u64::from(w), u64::from(h)));
            }
        }
        i += 2 + len.max(2);
    }
    best
}

/// Every size a WebP declares (its VP8X canvas, each VP8 and VP8L bitstream's own header, each
/// animation frame's), the largest.
fn webp_frames(bytes: &[u8]) -> Option<(u64, u64)> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WEBP" {
        return None;
    }
    webp_chunks(&bytes[12..], 0)
}

/// The largest size the RIFF chunks in `body` declare; `depth` bounds nesting (frames hold
/// chunks).
fn webp_chunks(body: &[u8], depth: u8) -> Option<(u64, u64)> {
    let mut best = None;
    let mut at = 0usize;
    while let Some(head) = body.get(at..at + 8) {
        let len = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
        let data = &body[(at + 8).min(body.len())..(at + 8).saturating_add(len).min(body.len())];
        let size = match &head[..4] {
            b"VP8X" => le24(data, 4).zip(le24(data, 7)).map(|(w, h)| (w + 1, h + 1)),
            // A key frame's start code, then 14-bit sides (two bits of scale above each).
            b"VP8 " if data.get(3..6) == Some(&[0x9d, 0x01, 0x2a]) => {
                let side = |i: usize| u64::from(u16::from_le_bytes([data[i], data[i + 1]]) & 0x3fff);
                (data.len() >= 10).then(|| (side(6), side(8)))
            }
            // The signature byte, then width - 1 and height - 1 in 14 bits each.
            b"VP8L" if data.first() == Some(&0x2f) && data.len() >= 5 => {
                let v = u32::from_le_bytes(data[1..5].try_into().ok()?);
                Some((u64::from(v & 0x3fff) + 1, u64::from((v >> 14) & 0x3fff) + 1))
            }
            b"ANMF" if depth == 0 && data.len() >= 16 => {
                let own = (le24(data, 6)? + 1, le24(data, 9)? + 1);
                let inner = webp_chunks(&data[16..], depth + 1);
                Some(inner.map_or(own, |i| bigger(Some(own), i).unwrap_or(own)))
            }
            _ => None,
        };
        if let Some(s) = size {
            best = bigger(best, s);
        }
        at = at.saturating_add(8).saturating_add(len).saturating_add(len & 1);
    }
    best
}

/// A BMP's size from its info header, read as decoders read it: a Windows header's height
/// negative for a picture stored top-down (as many Windows tools write it), an OS/2 1.x header
/// (12 bytes) with 16-bit sides. `None` for a header too short to hold them.
fn bmp_size(bytes: &[u8]) -> Option<(u64, u64)> {
    let u16_at = |i: usize| Some(u16::from_le_bytes(bytes.get(i..i + 2)?.try_into().ok()?));
    let i32_at = |i: usize| Some(i32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?));
    let header = u32::from_le_bytes(bytes.get(14..18)?.try_into().ok()?);
    if header == 12 {
        return Some((u64::from(u16_at(18)?), u64::from(u16_at(20)?)));
    }
    Some((
        u64::from(i32_at(18)?.unsigned_abs()),
        u64::from(i32_at(22)?.unsigned_abs()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend(kind);
        c.extend(data);
        c.extend([0; 4]);
        c
    }

    fn png(chunks: &[Vec<u8>]) -> Vec<u8> {
        let mut p = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = 64u32.to_be_bytes().to_vec();
        ihdr.extend(48u32.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        p.extend(chunk(b"IHDR", &ihdr));
        for c in chunks {
            p.extend(c);
        }
        p.extend(chunk(b"IEND", &[]));
        p
    }

    #[test]
    fn compressed_metadata_is_counted_as_it_inflates() {
        let zeros = miniz_oxide::deflate::compress_to_vec_zlib(&vec![0u8; 3 << 20], 9);
        let mut ztxt = b"Comment\0\0".to_vec();
        ztxt.extend(&zeros);
        let mut iccp = b"icc\0\0".to_vec();
        iccp.extend(&zeros);
        let mut itxt = b"XML\0\x01\0en\0\0".to_vec();
        itxt.extend(&zeros);
        let mut plain_itxt = b"XML\0\0\0en\0\0".to_vec();
        plain_itxt.extend(&zeros);
        for (c, name) in [
            (chunk(b"zTXt", &ztxt), "zTXt"),
            (chunk(b"iCCP", &iccp), "iCCP"),
            (chunk(b"iTXt", &itxt), "iTXt"),
        ] {
            let p = png(&[c]);
            assert_eq!(metadata_over(&p, 2 << 20), Some(name));
            assert_eq!(metadata_over(&p, 4 << 20), None, "{name} within the limit");
        }
        // Two chunks within the limit each, over it together; an uncompressed iTXt is not
        // inflated.
        let two = png(&[chunk(b"zTXt", &ztxt), chunk(b"iCCP", &iccp)]);
        assert_eq!(metadata_over(&two, 4 << 20), Some("iCCP"));
        assert_eq!(metadata_over(&png(&[chunk(b"iTXt", &plain_itxt)]), 1 << 10), None);
        assert_eq!(png_frames(&two), Some((64, 48)));
    }

    #[test]
    fn every_frame_header_counts_not_only_the_first() {
        // JPEG: a 16x16 frame header before a 3000x2000 one, with an APP segment whose bytes
        // look like a frame header between them (skipped by its length).
        let sof = |w: u16, h: u16| {
            let mut s = vec![0xff, 0xc0, 0, 17, 8];
            s.extend(h.to_be_bytes());
            s.extend(w.to_be_bytes());
            s.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
            s
        };
        let mut j = vec![0xff, 0xd8];
        j.extend(sof(16, 16));
        j.extend([0xff, 0xe1, 0, 11, 0xff, 0xc0, 0, 17, 8, 0x7f, 0xff, 0x7f, 0xff]);
        j.extend([0xff, 0xda, 0, 2, 0x12, 0xff, 0x00, 0x34, 0xff, 0xd0, 0x56]);
        j.extend(sof(3000, 2000));
        j.extend([0xff, 0xd9]);
        assert_eq!(jpeg_frames(&j), Some((3000, 2000)));
        // WebP: a 64x64 VP8X canvas around a 3000x3000 lossless bitstream.
        let mut vp8x = vec![0u8; 10];
        vp8x[4] = 63;
        vp8x[7] = 63;
        let packed: u32 = 2999 | (2999 << 14);
        let mut vp8l = vec![0x2f];
        vp8l.extend(packed.to_le_bytes());
        vp8l.push(0);
        let mut body = b"WEBP".to_vec();
        for (k, d) in [(b"VP8X", &vp8x), (b"VP8L", &vp8l)] {
            body.extend(k);
            body.extend((d.len() as u32).to_le_bytes());
            body.extend(d.iter());
        }
        let mut w = b"RIFF".to_vec();
        w.extend((body.len() as u32).to_le_bytes());
        w.extend(body);
        assert_eq!(webp_frames(&w), Some((3000, 3000)));
        // Cut or garbled bytes give what they can, never a panic.
        for n in 0..w.len() {
            let _ = webp_frames(&w[..n]);
        }
        for n in 0..j.len() {
            let _ = jpeg_frames(&j[..n]);
        }
    }
}
