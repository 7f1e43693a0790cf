//! Before/after views (`--compare`): in, a frame just before and just after its restored faces
//! are pasted; out, the frame the output gets instead of the restored picture alone: the
//! original and the restored side by side (twice the width), or split down the middle (left
//! half original, right half restored, the source's size).

use crate::frame::{Frame, Picture};
use crate::geom::Rect;
use crate::media::decode::SourceInfo;

// The view itself is a plain value that travels with frames: it lives in `frame`.
pub(crate) use crate::frame::Compare;

impl Compare {
    /// The output's picture size for `src` (its pictures turned upright by their EXIF
    /// orientation, as decoding turns them) under `view`.
    pub(crate) fn output_size(view: Option<Compare>, src: &SourceInfo) -> (usize, usize) {
        let (width, height) = src.upright_size();
        match view {
            Some(Compare::Side) if Sides::of(src).stacked => (width, 2 * height),
            Some(Compare::Side) => (2 * width, height),
            _ => (width, height),
        }
    }
}

/// Where a side-by-side view puts its two pictures in the stored frame, so that a player,
/// turning and mirroring it by the display matrix the output keeps, shows the original on the
/// left and the restored on the right.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Sides {
    /// One above the other in the stored frame (shown side by side after a quarter turn).
    pub(crate) stacked: bool,
    /// The restored picture first (left or top in the stored frame): a half or three-quarter
    /// turn, or a mirror, shows the stored order the other way round.
    pub(crate) restored_first: bool,
}

impl Sides {
    /// The layout for a source shown turned by `src.rotation` degrees counterclockwise, then
    /// mirrored when `src.mirror` (pictures turned upright by decoding have neither).
    pub(crate) fn of(src: &SourceInfo) -> Self {
        Self::shown(src.rotation, src.mirror)
    }

    /// The layout for a picture shown turned by `turn` degrees counterclockwise, then mirrored.
    fn shown(turn: u32, mirror: bool) -> Self {
        Sides {
            stacked: turn % 180 == 90,
            restored_first: matches!(turn, 180 | 270) != mirror,
        }
    }
}

/// What [`before_paste`] kept of the original picture.
pub(crate) enum Kept {
    /// The whole original picture (side by side), and where it goes.
    Whole(Vec<u8>, Sides),
    /// The left-half parts of the regions about to be pasted (split).
    Parts(Vec<(Rect, Vec<u8>)>),
    /// Nothing: the frame's output is its planes plus the paste's changes, and the changes
    /// left of the middle are dropped (split).
    LeftUnchanged,
}

fn copy_out(rgb: &[u8], width: usize, r: Rect) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.width() * r.height() * 3);
    for y in r.y0..r.y1 {
        out.extend_from_slice(&rgb[(y * width + r.x0) * 3..(y * width + r.x1) * 3]);
    }
    out
}

fn copy_in(rgb: &mut [u8], width: usize, r: Rect, part: &[u8]) {
    let row = r.width() * 3;
    for (i, y) in (r.y0..r.y1).enumerate() {
        rgb[(y * width + r.x0) * 3..(y * width + r.x1) * 3].copy_from_slice(&part[i * row..(i + 1) * row]);
    }
}

/// Keeps what `view` needs of `frame`'s original picture before `regions` are pasted. For
/// side by side (laid out as `sides` says) the whole picture is made RGB first (the encoder
/// then takes it whole).
pub(crate) fn before_paste(view: Compare, sides: Sides, frame: &mut Frame, regions: &[Rect]) -> Kept {
    let (w, h) = (frame.width, frame.height);
    match view {
        Compare::Split if frame.picture.is_planes() => Kept::LeftUnchanged,
        Compare::Side => {
            // The output is the RGB picture, twice the width.
            crate::media::color::into_rgb(frame);
            Kept::Whole(frame.rgb.clone(), sides)
        }
        Compare::Split => Kept::Parts(
            regions
                .iter()
                .map(|r| r.clip(w, h))
                .map(|r| Rect::new(r.x0, r.y0, r.x1.min(w / 2).max(r.x0), r.y1))
                .filter(|r| r.width() > 0 && r.height() > 0)
                .map(|r| (r, copy_out(&frame.rgb, w, r)))
                .collect(),
        ),
    }
}

/// Makes the pasted `frame` the before/after view from what [`before_paste`] kept.
pub(crate) fn after_paste(frame: &mut Frame, kept: Kept) {
    let (w, h) = (frame.width, frame.height);
    match kept {
        Kept::LeftUnchanged => {
            let Picture::Planes { changes, .. } = &mut frame.picture else {
                return;
            };
            for ch in changes {
                let (r, rw) = (ch.rect, ch.rect.width());
                let left = (w / 2).clamp(r.x0, r.x1) - r.x0;
                for row in ch.rgb.chunks_exact_mut(rw * 3) {
                    row[..left * 3].fill(0.0);
                }
            }
        }
        Kept::Parts(parts) => {
            for (r, part) in parts {
                copy_in(&mut frame.rgb, w, r, &part);
            }
        }
        Kept::Whole(original, sides) => {
            let restored = std::mem::take(&mut frame.rgb);
            let (first, second) = if sides.restored_first {
                (&restored, &original)
            } else {
                (&original, &restored)
            };
            if sides.stacked {
                frame.rgb = [&first[..], &second[..]].concat();
                frame.height = 2 * h;
            } else {
                let mut both = vec![0u8; 2 * w * h * 3];
                for (y, row) in both.chunks_exact_mut(6 * w).enumerate() {
                    row[..3 * w].copy_from_slice(&first[y * 3 * w..(y + 1) * 3 * w]);
                    row[3 * w..].copy_from_slice(&second[y * 3 * w..(y + 1) * 3 * w]);
                }
                frame.rgb = both;
                frame.width = 2 * w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(w: usize, h: usize, v: u8) -> Frame {
        let mut f = Frame::blank(0);
        (f.width, f.height, f.rgb) = (w, h, vec![v; w * h * 3]);
        f
    }

    #[test]
    fn split_keeps_the_left_half_and_side_doubles_the_width() {
        let region = Rect::new(2, 1, 8, 3);
        let mut f = frame(8, 4, 10);
        let kept = before_paste(Compare::Split, Sides::default(), &mut f, &[region]);
        f.rgb.iter_mut().for_each(|p| *p = 200);
        after_paste(&mut f, kept);
        for y in 0..4 {
            for x in 0..8 {
                let want = if x < 4 && (2..8).contains(&x) && (1..3).contains(&y) {
                    10
                } else {
                    200
                };
                assert_eq!(f.rgb[(y * 8 + x) * 3], want, "({x}, {y})");
            }
        }
        let mut f = frame(8, 4, 10);
        let kept = before_paste(Compare::Side, Sides::default(), &mut f, &[region]);
        f.rgb.iter_mut().for_each(|p| *p = 200);
        after_paste(&mut f, kept);
        assert_eq!((f.width, f.height, f.rgb.len()), (16, 4, 16 * 4 * 3));
        for y in 0..4 {
            assert!(f.rgb[y * 48..y * 48 + 24].iter().all(|&p| p == 10));
            assert!(f.rgb[y * 48 + 24..(y + 1) * 48].iter().all(|&p| p == 200));
        }
        // Stacked, the restored first (a video shown after a three-quarter turn).
        let mut f = frame(8, 4, 10);
        let sides = Sides {
            stacked: true,
            restored_first: true,
        };
        let kept = before_paste(Compare::Side, sides, &mut f, &[region]);
        f.rgb.iter_mut().for_each(|p| *p = 200);
        after_paste(&mut f, kept);
        assert_eq!((f.width, f.height, f.rgb.len()), (8, 8, 8 * 8 * 3));
        assert!(f.rgb[..96].iter().all(|&p| p == 200) && f.rgb[96..].iter().all(|&p| p == 10));
    }

    /// Under every turn and mirror, the point a player shows at the middle of the left half
    /// (mapped back to the stored frame as detection maps points: the mirror undone, then
    /// `display_to_storage`) lies in the original picture, and the right half's in the restored.
    #[test]
    fn players_show_the_original_left_under_every_turn_and_mirror() {
        let (w, h) = (8usize, 6usize);
        for turn in [0u32, 90, 180, 270] {
            for mirror in [false, true] {
                let sides = Sides::shown(turn, mirror);
                let stored = if sides.stacked { (w, 2 * h) } else { (2 * w, h) };
                let shown = if turn % 180 == 90 { (stored.1, stored.0) } else { stored };
                for (x, want_original) in [(shown.0 as f32 * 0.25, true), (shown.0 as f32 * 0.75, false)] {
                    let y = shown.1 as f32 * 0.5;
                    let x = if mirror { shown.0 as f32 - 1.0 - x } else { x };
                    let (sx, sy) = crate::geom::display_to_storage(x, y, turn, stored);
                    let along = if sides.stacked { sy / h as f32 } else { sx / w as f32 };
                    let first = along < 1.0;
                    let original = first != sides.restored_first;
                    assert_eq!(original, want_original, "turn {turn}, mirror {mirror}, x {x}");
                }
            }
        }
    }
}
