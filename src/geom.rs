//! Geometry: in, points, boxes and transforms; out, the types every stage shares (`Rect`,
//! `Affine`), the least-squares similarity fit that aligns a face, and a crop's footprint in
//! the frame.

use serde::{Serialize, Serializer};

/// A frame rectangle in pixels, end exclusive: `x0 <= x < x1`, `y0 <= y < y1`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rect {
    pub x0: usize,
    pub y0: usize,
    pub x1: usize,
    pub y1: usize,
}

impl Rect {
    pub const fn new(x0: usize, y0: usize, x1: usize, y1: usize) -> Self {
        Self { x0, y0, x1, y1 }
    }

    pub fn width(&self) -> usize {
        self.x1.saturating_sub(self.x0)
    }

    pub fn height(&self) -> usize {
        self.y1.saturating_sub(self.y0)
    }

    pub fn is_empty(&self) -> bool {
        self.width() == 0 || self.height() == 0
    }

    /// Clipped to a `width x height` picture.
    pub fn clip(&self, width: usize, height: usize) -> Rect {
        Rect::new(
            self.x0.min(width),
            self.y0.min(height),
            self.x1.min(width),
            self.y1.min(height),
        )
    }

    /// Grown by `margin` on every side, clipped to the picture, the start rounded down to even
    /// (so a 4:2:0 chroma sample is never cut in half).
    pub(crate) fn grown_even(&self, margin: usize, width: usize, height: usize) -> Rect {
        Rect::new(
            self.x0.saturating_sub(margin) & !1,
            self.y0.saturating_sub(margin) & !1,
            (self.x1 + margin).min(width),
            (self.y1 + margin).min(height),
        )
    }

    /// Widened to even bounds (start down, end up), clipped to the picture: the chroma samples
    /// of a 4:2:0 picture it touches are then covered whole.
    pub fn even(&self, width: usize, height: usize) -> Rect {
        Rect::new(
            self.x0 & !1,
            self.y0 & !1,
            ((self.x1 + 1) & !1).min(width),
            ((self.y1 + 1) & !1).min(height),
        )
    }
}

/// Written as `[x0, y0, x1, y1]`.
impl Serialize for Rect {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        [self.x0, self.y0, self.x1, self.y1].serialize(s)
    }
}

/// A 2x3 affine map `[a b c; d e f]`: (x, y) -> (a x + b y + c, d x + e y + f).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Affine(pub [f64; 6]);

impl Affine {
    pub(crate) const IDENTITY: Affine = Affine([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);

    pub(crate) fn apply(&self, x: f64, y: f64) -> (f64, f64) {
        let m = &self.0;
        (m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5])
    }

    /// The inverse map, or `None` when the matrix is singular.
    pub(crate) fn inverse(&self) -> Option<Affine> {
        let [a, b, c, d, e, f] = self.0;
        let det = a * e - b * d;
        if det.abs() < 1e-12 {
            return None;
        }
        let (ia, ib, id, ie) = (e / det, -b / det, -d / det, a / det);
        Some(Affine([ia, ib, -(ia * c + ib * f), id, ie, -(id * c + ie * f)]))
    }

    /// Uniform scale factor of a similarity (sqrt of the determinant).
    pub fn scale(&self) -> f64 {
        let m = &self.0;
        (m[0] * m[4] - m[1] * m[3]).abs().sqrt()
    }
}

/// Least-squares 4-degree-of-freedom similarity (rotation, uniform scale, translation) that
/// maps `src` onto `dst` (Umeyama without reflection, closed form in 2-D).
pub fn fit_similarity(src: &[[f32; 2]], dst: &[[f32; 2]]) -> Affine {
    let n = src.len().min(dst.len()) as f64;
    let mean = |p: &[[f32; 2]]| {
        let (sx, sy) = p
            .iter()
            .fold((0.0, 0.0), |(sx, sy), q| (sx + q[0] as f64, sy + q[1] as f64));
        (sx / n, sy / n)
    };
    let (msx, msy) = mean(src);
    let (mdx, mdy) = mean(dst);
    let (mut num_a, mut num_b, mut den) = (0.0, 0.0, 0.0);
    for (s, d) in src.iter().zip(dst) {
        let (px, py) = (s[0] as f64 - msx, s[1] as f64 - msy);
        let (qx, qy) = (d[0] as f64 - mdx, d[1] as f64 - mdy);
        num_a += px * qx + py * qy;
        num_b += px * qy - py * qx;
        den += px * px + py * py;
    }
    if den < 1e-12 {
        return Affine([1.0, 0.0, mdx - msx, 0.0, 1.0, mdy - msy]);
    }
    let (a, b) = (num_a / den, num_b / den);
    Affine([a, -b, mdx - (a * msx - b * msy), b, a, mdy - (b * msx + a * msy)])
}

/// The axis-aligned frame rectangle covered by a crop of `size` under `to_crop`'s inverse,
/// clipped to a `width x height` frame; `None` when it misses the frame.
pub fn crop_footprint(to_crop: &Affine, size: usize, width: usize, height: usize) -> Option<Rect> {
    let inv = to_crop.inverse()?;
    let s = size as f64;
    let corners = [(0.0, 0.0), (s, 0.0), (0.0, s), (s, s)].map(|(u, v)| inv.apply(u, v));
    let fold = |f: fn(f64, f64) -> f64, init: f64, pick: fn(&(f64, f64)) -> f64| corners.iter().map(pick).fold(init, f);
    let x0 = fold(f64::min, f64::INFINITY, |p| p.0).floor().max(0.0) as usize;
    let y0 = fold(f64::min, f64::INFINITY, |p| p.1).floor().max(0.0) as usize;
    let x1 = (fold(f64::max, f64::NEG_INFINITY, |p| p.0).ceil() + 1.0).clamp(0.0, width as f64) as usize;
    let y1 = (fold(f64::max, f64::NEG_INFINITY, |p| p.1).ceil() + 1.0).clamp(0.0, height as f64) as usize;
    (x0 < x1 && y0 < y1).then_some(Rect::new(x0, y0, x1, y1))
}

/// The similarity turning by `angle`, scaling by `scale` and moving by (tx, ty), for tests.
/// Maps a point of a picture shown rotated by `rotation` degrees counterclockwise (a multiple
/// of 90, as a display matrix says) back to the stored picture of `w x h` pixels.
pub(crate) fn display_to_storage(x: f32, y: f32, rotation: u32, (w, h): (usize, usize)) -> (f32, f32) {
    let (wl, hl) = (w as f32 - 1.0, h as f32 - 1.0);
    match rotation {
        90 => (wl - y, x),
        180 => (wl - x, hl - y),
        270 => (y, hl - x),
        _ => (x, y),
    }
}

#[cfg(test)]
pub(crate) fn similarity(angle: f64, scale: f64, tx: f64, ty: f64) -> Affine {
    let (s, c) = angle.sin_cos();
    Affine([scale * c, -scale * s, tx, scale * s, scale * c, ty])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_known_similarities() {
        let cases = [
            (0.0, 1.0, 0.0, 0.0),
            (0.3, 2.5, -40.0, 17.0),
            (-1.2, 0.4, 300.0, -90.0),
            (3.0, 1.7, 5.0, 5.0),
        ];
        let src = [[38.3, 51.7], [73.5, 51.5], [56.0, 71.7], [41.5, 92.4], [70.7, 92.2]];
        for (angle, scale, tx, ty) in cases {
            let truth = similarity(angle, scale, tx, ty);
            let dst = src.map(|[x, y]| {
                let (u, v) = truth.apply(x as f64, y as f64);
                [u as f32, v as f32]
            });
            let fit = fit_similarity(&src, &dst);
            for (p, q) in src.iter().zip(&dst) {
                let (u, v) = fit.apply(p[0] as f64, p[1] as f64);
                assert!((u - q[0] as f64).hypot(v - q[1] as f64) < 0.01, "case {angle} {scale}");
            }
            assert!((fit.scale() - scale).abs() < 1e-4);
        }
    }

    #[test]
    fn inverse_round_trips_points_under_half_a_pixel() {
        let m = similarity(0.7, 3.1, 812.0, -33.0);
        let inv = m.inverse().expect("invertible");
        for (x, y) in [(0.0, 0.0), (1919.0, 1079.0), (640.5, 333.25)] {
            let (u, v) = m.apply(x, y);
            let (bx, by) = inv.apply(u, v);
            assert!((bx - x).hypot(by - y) < 0.5);
        }
        assert!(Affine([1.0, 2.0, 0.0, 2.0, 4.0, 0.0]).inverse().is_none());
    }

    #[test]
    fn footprint_is_clipped_to_the_frame() {
        let to_crop = Affine([1.0, 0.0, 30.0, 0.0, 1.0, 30.0]); // crop starts at (-30, -30)
        assert_eq!(crop_footprint(&to_crop, 64, 100, 100), Some(Rect::new(0, 0, 35, 35)));
        let off = Affine([1.0, 0.0, -500.0, 0.0, 1.0, 0.0]);
        assert_eq!(crop_footprint(&off, 64, 100, 100), None);
    }

    #[test]
    fn rects_grow_and_widen_to_even_bounds_inside_the_picture() {
        let r = Rect::new(3, 5, 9, 11);
        assert_eq!((r.width(), r.height()), (6, 6));
        assert_eq!(r.even(100, 100), Rect::new(2, 4, 10, 12));
        assert_eq!(r.even(9, 11), Rect::new(2, 4, 9, 11));
        assert_eq!(r.grown_even(2, 10, 12), Rect::new(0, 2, 10, 12));
        assert_eq!(Rect::new(0, 0, 200, 50).clip(100, 100), Rect::new(0, 0, 100, 50));
        assert!(Rect::new(4, 4, 4, 9).is_empty());
        assert_eq!(serde_json::to_string(&r).unwrap(), "[3,5,9,11]");
    }
}
