//! Paste-back: in, a frame and its restored face crops with their frame->crop transforms; out,
//! the frame with each face blended in through a feathered mask, over the face region only.

use crate::align::sample_rgb_f32;
use crate::geom::{Affine, Rect};

/// A feathered box mask over the crop: zero on a thin border, rising smoothly to one inside, so
/// no edge or seam of the crop shows in the frame.
#[derive(Clone, Debug)]
pub struct Mask {
    size: usize,
    /// Border (fraction of the crop) where the mask is zero.
    border: f64,
    /// Width (fraction of the crop) of the ramp from zero to one.
    feather: f64,
}

impl Mask {
    pub fn new(size: usize) -> Self {
        Self {
            size,
            border: 0.03,
            feather: 0.12,
        }
    }

    /// Mask value at crop coordinates (u, v), 0 outside the crop.
    #[inline]
    pub fn at(&self, u: f64, v: f64) -> f32 {
        let s = (self.size - 1) as f64;
        let d = u.min(v).min(s - u).min(s - v) / self.size as f64;
        let t = ((d - self.border) / self.feather).clamp(0.0, 1.0);
        (t * t * (3.0 - 2.0 * t)) as f32
    }
}

/// Blends a restored crop (packed RGB24, the mask's `size x size`) into the frame: each frame
/// pixel in `r` (the crop's footprint, [`crate::geom::crop_footprint`]) is mapped into the crop, sampled
/// bilinearly and mixed by `mask * blend`.
pub fn paste(frame: &mut [u8], width: usize, crop: &[u8], to_crop: &Affine, r: Rect, mask: &Mask, blend: f32) {
    let Rect { x0, y0, x1, y1 } = r;
    let size = mask.size;
    let m = to_crop.0;
    let lim = (size - 1) as f64;
    for y in y0..y1 {
        let row = &mut frame[y * width * 3..(y + 1) * width * 3];
        // Step along the row: the crop point moves by (m0, m3) per frame pixel.
        let (mut u, mut v) = (
            m[0] * x0 as f64 + m[1] * y as f64 + m[2],
            m[3] * x0 as f64 + m[4] * y as f64 + m[5],
        );
        for x in x0..x1 {
            let (cu, cv) = (u, v);
            u += m[0];
            v += m[3];
            if !(0.0..=lim).contains(&cu) || !(0.0..=lim).contains(&cv) {
                continue;
            }
            let a = mask.at(cu, cv) * blend;
            if a <= 0.0 {
                continue;
            }
            let p = sample_rgb_f32(crop, size, size, cu as f32, cv as f32);
            let px = &mut row[x * 3..x * 3 + 3];
            for c in 0..3 {
                let old = px[c] as f32;
                // Non-negative, so +0.5 and truncation round to nearest.
                px[c] = (old + (p[c] - old) * a + 0.5).clamp(0.0, 255.0) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_is_zero_at_the_border_one_in_the_middle_and_monotone() {
        let m = Mask::new(512);
        assert_eq!(m.at(0.0, 256.0), 0.0);
        assert_eq!(m.at(511.0, 511.0), 0.0);
        assert_eq!(m.at(256.0, 256.0), 1.0);
        let mut last = 0.0;
        for u in 0..256 {
            let v = m.at(u as f64, 256.0);
            assert!(v >= last, "not monotone at {u}");
            assert!((0.0..=1.0).contains(&v));
            last = v;
        }
        // Symmetric.
        assert!((m.at(40.0, 256.0) - m.at(471.0, 256.0)).abs() < 1e-6);
    }

    #[test]
    fn paste_changes_only_the_face_region_and_respects_blend() {
        let (w, h, size) = (200usize, 120usize, 64usize);
        let to_crop = Affine([1.0, 0.0, -50.0, 0.0, 1.0, -20.0]); // crop at (50, 20)
        let crop = vec![200u8; size * size * 3];
        let mask = Mask::new(size);
        let mut frame = vec![10u8; w * h * 3];
        let r = crate::geom::crop_footprint(&to_crop, size, w, h).unwrap();
        paste(&mut frame, w, &crop, &to_crop, r, &mask, 1.0);
        let px = |f: &[u8], x: usize, y: usize| f[(y * w + x) * 3];
        assert_eq!(px(&frame, 82, 52), 200, "centre replaced");
        assert_eq!(px(&frame, 10, 10), 10, "outside untouched");
        assert_eq!(px(&frame, 50, 52), 10, "crop border zeroed by the mask");
        let changed = (0..w * h).filter(|&i| frame[i * 3] != 10).count();
        assert!(changed < size * size);

        let mut half = vec![10u8; w * h * 3];
        paste(&mut half, w, &crop, &to_crop, r, &mask, 0.5);
        assert_eq!(px(&half, 82, 52), 105);
        let mut none = vec![10u8; w * h * 3];
        paste(&mut none, w, &crop, &to_crop, r, &mask, 0.0);
        assert!(none.iter().all(|&v| v == 10));
    }
}
