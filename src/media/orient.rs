//! EXIF orientation of still inputs: in, a picture file or its bytes in memory (its EXIF
//! Orientation tag, read with the `exif` crate) and decoded frames as stored; out, the frames
//! turned upright (rotated or mirrored, packed RGB24), so detection and the output see the
//! picture as a viewer shows it.

use std::path::Path;

use crate::frame::Frame;

/// The EXIF Orientation of `path` (1 to 8; 1, upright, when it has none or it cannot be read).
pub(crate) fn exif_orientation(path: &Path) -> u8 {
    let Ok(file) = std::fs::File::open(path) else { return 1 };
    orientation_in(std::io::BufReader::new(file))
}

/// The EXIF Orientation of a picture's `bytes` (as [`exif_orientation`] of its file).
pub(crate) fn exif_orientation_of(bytes: &[u8]) -> u8 {
    orientation_in(std::io::Cursor::new(bytes))
}

/// The EXIF Orientation `reader`'s picture holds (1 when none, or it cannot be read).
fn orientation_in(mut reader: impl std::io::BufRead + std::io::Seek) -> u8 {
    let Ok(exif) = exif::Reader::new().read_from_container(&mut reader) else {
        return 1;
    };
    exif.get_field(exif::Tag::Orientation, exif::In::PRIMARY)
        .and_then(|f| f.value.get_uint(0))
        .filter(|v| (1..=8).contains(v))
        .map_or(1, |v| v as u8)
}

/// Whether orientation `o` swaps width and height (a quarter turn, with or without a mirror).
pub(crate) fn swaps(o: u8) -> bool {
    (5..=8).contains(&o)
}

/// The upright size of a picture stored as `width` x `height` with orientation `o`.
pub(crate) fn upright_size(o: u8, width: usize, height: usize) -> (usize, usize) {
    if swaps(o) {
        (height, width)
    } else {
        (width, height)
    }
}

/// Writes the upright picture of `src` (packed RGB24, stored `w` x `h`, orientation `o`) into
/// `dst`.
pub(crate) fn upright(o: u8, src: &[u8], w: usize, h: usize, dst: &mut Vec<u8>) {
    let (uw, uh) = upright_size(o, w, h);
    dst.clear();
    dst.resize(uw * uh * 3, 0);
    for y in 0..uh {
        for x in 0..uw {
            // Where the upright pixel (x, y) is stored.
            let (sx, sy) = match o {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                8 => (w - 1 - y, x),
                _ => (x, y),
            };
            let (d, s) = ((y * uw + x) * 3, (sy * w + sx) * 3);
            dst[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
}

/// Turns `frame` upright for orientation `o` (its detection copy, stored `det` in size, too);
/// spare buffers come from and go back to the pools.
pub fn turn_frame(
    o: u8,
    frame: &mut Frame,
    det: (usize, usize),
    pools: (&crate::frame::Pool<Vec<u8>>, &crate::frame::Pool<Vec<u8>>),
) {
    if o <= 1 {
        return;
    }
    // The encoder takes the upright RGB whole, never the stored picture.
    crate::media::color::into_rgb(frame);
    let (w, h) = (frame.width, frame.height);
    let mut rgb = pools.0.get();
    upright(o, &frame.rgb, w, h, &mut rgb);
    pools.0.put(std::mem::replace(&mut frame.rgb, rgb));
    let mut small = pools.1.get();
    upright(o, &frame.det, det.0, det.1, &mut small);
    pools.1.put(std::mem::replace(&mut frame.det, small));
    frame.det_size = upright_size(o, det.0, det.1);
    (frame.width, frame.height) = upright_size(o, w, h);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_orientation_puts_the_stored_corner_where_a_viewer_sees_it() {
        // A 3x2 picture whose pixels are numbered 0..6 in storage order.
        let src: Vec<u8> = (0..6).flat_map(|v| [v, v, v]).collect();
        let got = |o: u8| {
            let mut dst = Vec::new();
            upright(o, &src, 3, 2, &mut dst);
            dst.chunks_exact(3).map(|p| p[0]).collect::<Vec<u8>>()
        };
        assert_eq!(got(1), [0, 1, 2, 3, 4, 5]);
        assert_eq!(got(2), [2, 1, 0, 5, 4, 3]);
        assert_eq!(got(3), [5, 4, 3, 2, 1, 0]);
        assert_eq!(got(4), [3, 4, 5, 0, 1, 2]);
        // Quarter turns: 2 wide, 3 high.
        assert_eq!(got(5), [0, 3, 1, 4, 2, 5]);
        assert_eq!(got(6), [3, 0, 4, 1, 5, 2]);
        assert_eq!(got(7), [5, 2, 4, 1, 3, 0]);
        assert_eq!(got(8), [2, 5, 1, 4, 0, 3]);
        assert_eq!(upright_size(6, 3, 2), (2, 3));
        assert_eq!(upright_size(3, 3, 2), (3, 2));
    }
}
