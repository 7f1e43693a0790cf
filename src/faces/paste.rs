//! Paste-back: in, a frame and its restored face crops with their frame->crop transforms; out,
//! the frame with each face blended in through a feathered mask (the face's shape, or the whole
//! crop), over the face regions only; overlapping faces combine by the larger mask value.
//!
//! Crops are sampled bicubically (a bilinear sample blurs between pixels, and the warp into
//! the crop and back would blur the face twice). A crop pasted onto a face much smaller than
//! itself (each frame pixel covers [`MIP_FROM`] crop pixels or more) is sampled from a
//! box-filtered mip level of the crop instead of the crop itself, so fine detail the frame
//! cannot hold averages out instead of aliasing (shimmering between frames); the level keeps
//! at least 1.5 of its pixels per frame pixel, so it does not blur what the frame can hold.

use wide::f32x4;

use crate::frame::{Change, Occluder};
use crate::geom::{Affine, Rect};
use crate::kernels::halve::{halve, halve_steps};
use crate::kernels::sample::{cubic3_taps, cubic_weights4, sample_cubic3, Tap};
use crate::kernels::warp::mip_level;
use crate::kernels::CHANGE_STEPS;

/// The paste mask's shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskKind {
    /// The face's own outline from the face mesh, forehead to chin, following its pose, with
    /// a feather that lies mostly inside it (the ellipse where a face has no mesh).
    #[default]
    Mesh,
    /// The face, forehead and hairline (an ellipse placed by the alignment template), feathered:
    /// what the model regenerates in the crop's corners (background, a neighbour) stays out.
    Face,
    /// The whole crop, feathered at its border.
    Box,
}

/// How the pasted face keeps the original's colour (`--color-fix`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ColorFix {
    /// The original's low band (a Haar wavelet pyramid's, 8 x 8 cells over the crop) with the
    /// restorer's finer bands: its detail is taken, a cast or a change of
    /// brightness is not (see [`crate::kernels::lowband`]).
    #[default]
    Wavelet,
    /// The restorer's change as it gave it.
    Off,
}

impl std::fmt::Display for MaskKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MaskKind::Mesh => "mesh",
            MaskKind::Face => "face",
            MaskKind::Box => "box",
        })
    }
}

/// Border (fraction of the crop) where the box mask is zero, and the width of its ramp.
const BOX_BORDER: f64 = 0.03;
const BOX_FEATHER: f64 = 0.12;
/// The face ellipse in units of the eye-to-mouth distance `d` of the template: it reaches
/// `FACE_TOP` above the eyes (forehead and hairline), `FACE_CHIN` below the mouth, and
/// `FACE_HALF_WIDTH` to each side of the face's axis.
const FACE_TOP: f64 = 1.25;
const FACE_CHIN: f64 = 0.62;
const FACE_HALF_WIDTH: f64 = 1.2;
/// Share of the ellipse's radius over which the face mask ramps from one to zero.
const FACE_FEATHER: f64 = 0.3;
/// The mesh mask's feather, as a share of the outline's size (the square root of its area):
/// it ramps from zero `MESH_FEATHER_OUT` of the feather outside the outline to one inside, so
/// weight 0.5 lies a fifth of the feather inside the outline (the outline covered at 0.5 or
/// more: about 95 % of it; a quarter outside left the temples and jaw under 0.5 on real photos).
const MESH_FEATHER: f64 = 0.06;
const MESH_FEATHER_OUT: f64 = 0.6;
/// Table cells along each side of a mesh mask (made per face, so made small: a cell is half
/// the feather or less at any crop size, the feather being about 15 of the 512-pixel crop).
const MESH_CELLS: usize = 64;

/// A soft mask over the crop, tabulated per crop pixel (`size x size`), read bilinearly.
#[derive(Clone, Debug)]
pub struct Mask {
    size: usize,
    /// Crop pixels per table cell (the table is `size / step` square).
    step: usize,
    table: Vec<f32>,
    /// A shape (crop pixels) outside which the mask is zero, where it has one: the paste
    /// visits only the pixels of each row that fall inside it.
    support: Option<Support>,
    /// Scratch of the mesh mask, kept for its next face: the outline, and its points sorted.
    points: Vec<(f64, f64)>,
    sorted: Vec<(f64, f64)>,
    edges: Vec<[f64; 6]>,
}

/// An ellipse in crop pixels: its centre, the unit vector of its first axis and its two
/// semi-axes (along that vector, and across it).
#[derive(Clone, Copy, Debug)]
struct Ellipse {
    centre: (f64, f64),
    axis: (f64, f64),
    semi: (f64, f64),
}

/// Where a mask can be non-zero.
#[derive(Clone, Debug)]
enum Support {
    Ellipse(Ellipse),
    /// A polygon (crop pixels), grown beyond the mask's reach.
    Polygon(Vec<(f64, f64)>),
}

impl Support {
    /// The range of `t` for which the point `p + t d` may lie inside (None if the line misses).
    fn span(&self, p: (f64, f64), d: (f64, f64)) -> Option<(f64, f64)> {
        match self {
            Support::Ellipse(e) => e.span(p, d),
            Support::Polygon(pts) => {
                // Every crossing of the line with an edge: the inside lies between the first
                // and the last.
                let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
                for (i, &a) in pts.iter().enumerate() {
                    let b = pts[(i + 1) % pts.len()];
                    let e = (b.0 - a.0, b.1 - a.1);
                    let den = d.0 * e.1 - d.1 * e.0;
                    if den.abs() < 1e-12 {
                        continue;
                    }
                    let w = (a.0 - p.0, a.1 - p.1);
                    let t = (w.0 * e.1 - w.1 * e.0) / den;
                    let s = (w.0 * d.1 - w.1 * d.0) / den;
                    if (0.0..=1.0).contains(&s) {
                        lo = lo.min(t);
                        hi = hi.max(t);
                    }
                }
                (lo <= hi).then_some((lo, hi))
            }
        }
    }
}

impl Ellipse {
    /// The range of `t` for which the point `p + t d` lies inside (None if the line misses it).
    fn span(&self, p: (f64, f64), d: (f64, f64)) -> Option<(f64, f64)> {
        let (px, py) = (p.0 - self.centre.0, p.1 - self.centre.1);
        let (ax, ay) = self.axis;
        // Coordinates along and across the axis, each linear in t: a0 + a1 t, b0 + b1 t.
        let (a0, a1) = ((px * ax + py * ay) / self.semi.0, (d.0 * ax + d.1 * ay) / self.semi.0);
        let (b0, b1) = ((-px * ay + py * ax) / self.semi.1, (-d.0 * ay + d.1 * ax) / self.semi.1);
        let (qa, qb, qc) = (a1 * a1 + b1 * b1, 2.0 * (a0 * a1 + b0 * b1), a0 * a0 + b0 * b0 - 1.0);
        if qa < 1e-18 {
            return (qc <= 0.0).then_some((f64::NEG_INFINITY, f64::INFINITY));
        }
        let disc = qb * qb - 4.0 * qa * qc;
        if disc < 0.0 {
            return None;
        }
        let r = disc.sqrt();
        Some(((-qb - r) / (2.0 * qa), (-qb + r) / (2.0 * qa)))
    }
}

/// The convex hull of `pts` (Andrew's monotone chain), counter-clockwise in image axes.
/// `p` (sorted and deduplicated in place) is the point set; the hull goes into `hull`.
fn convex_hull(p: &mut Vec<(f64, f64)>, hull: &mut Vec<(f64, f64)>) {
    p.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    p.dedup();
    hull.clear();
    if p.len() < 3 {
        hull.extend_from_slice(p);
        return;
    }
    let cross = |o: (f64, f64), a: (f64, f64), b: (f64, f64)| (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0);
    // Lower chain left to right, then upper chain right to left.
    for pass in 0..2 {
        let start = hull.len();
        for i in 0..p.len() {
            let q = if pass == 0 { p[i] } else { p[p.len() - 1 - i] };
            while hull.len() >= start + 2 && cross(hull[hull.len() - 2], hull[hull.len() - 1], q) <= 0.0 {
                hull.pop();
            }
            hull.push(q);
        }
        hull.pop();
    }
}

/// The sides of a polygon as [`signed_distance`] reads them: each side's start, its vector and
/// the inverse of its squared length, and its end's y (made once per outline, not once per
/// point asked).
fn edges_of(pts: &[(f64, f64)], out: &mut Vec<[f64; 6]>) {
    out.clear();
    out.extend(pts.iter().enumerate().map(|(i, &a)| {
        let b = pts[(i + 1) % pts.len()];
        let (ex, ey) = (b.0 - a.0, b.1 - a.1);
        [a.0, a.1, ex, ey, 1.0 / (ex * ex + ey * ey).max(1e-12), b.1]
    }));
}

/// Distance from `p` to the outline of the polygon whose sides are `edges` (see [`edges_of`]),
/// positive inside, negative outside: the nearest side by squared distance, one root.
fn signed_distance(edges: &[[f64; 6]], p: (f64, f64)) -> f64 {
    let (mut best, mut inside) = (f64::INFINITY, false);
    for &[ax, ay, ex, ey, inv, by] in edges {
        let (wx, wy) = (p.0 - ax, p.1 - ay);
        let t = ((wx * ex + wy * ey) * inv).clamp(0.0, 1.0);
        let (dx, dy) = (wx - ex * t, wy - ey * t);
        best = best.min(dx * dx + dy * dy);
        // Even-odd crossing of the ray to the right of p.
        if (ay > p.1) != (by > p.1) && p.0 < ax + (p.1 - ay) / ey * ex {
            inside = !inside;
        }
    }
    if inside {
        best.sqrt()
    } else {
        -best.sqrt()
    }
}

/// How much of crop point `p` the occluder `o` covers: 1 inside it, falling smoothly to 0 at
/// its feather outside (`polygons`: the edges of its polygons, see [`edges_of`]).
fn cover(o: &Occluder, polygons: &[Vec<[f64; 6]>], p: (f64, f64)) -> f64 {
    // The distance outside the nearest part (negative inside).
    let mut outside = f64::INFINITY;
    for &(a, b, r) in &o.strokes {
        let (ax, ay, bx, by) = (f64::from(a[0]), f64::from(a[1]), f64::from(b[0]), f64::from(b[1]));
        let (ex, ey, wx, wy) = (bx - ax, by - ay, p.0 - ax, p.1 - ay);
        let len2 = ex * ex + ey * ey;
        let t = if len2 > 0.0 {
            ((wx * ex + wy * ey) / len2).clamp(0.0, 1.0)
        } else {
            0.0
        };
        outside = outside.min((wx - ex * t).hypot(wy - ey * t) - f64::from(r));
    }
    for edges in polygons {
        outside = outside.min(-signed_distance(edges, p));
    }
    smoothstep(1.0 - outside / f64::from(o.feather.max(0.5)))
}

/// The crop pixels `o` covers at all: `[x0, y0, x1, y1]`.
fn bounds(o: &Occluder) -> [f64; 4] {
    let grow = f64::from(o.feather.max(0.5));
    let mut b = [f64::INFINITY, f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY];
    let mut add = |q: [f32; 2], r: f64| {
        b = [
            b[0].min(f64::from(q[0]) - r),
            b[1].min(f64::from(q[1]) - r),
            b[2].max(f64::from(q[0]) + r),
            b[3].max(f64::from(q[1]) + r),
        ];
    };
    for &(a, e, r) in &o.strokes {
        add(a, f64::from(r) + grow);
        add(e, f64::from(r) + grow);
    }
    for q in o.polygons.iter().flatten() {
        add(*q, grow);
    }
    b
}

fn smoothstep(t: f64) -> f64 {
    let t = t.clamp(0.0, 1.0);
    t * t * (3.0 - 2.0 * t)
}

impl Mask {
    /// The feathered box: zero on a thin border, rising smoothly to one inside.
    pub fn new(size: usize) -> Self {
        Self::tabulate(size, |u, v| Self::box_at(size, u, v))
    }

    /// A mask of `kind` for crops of `size` aligned to `template` (its five points in crop
    /// pixels); for `Mesh`, the ellipse used where a face has no outline.
    pub fn build(kind: MaskKind, size: usize, template: &[[f32; 2]; 5]) -> Self {
        match kind {
            MaskKind::Box => Self::new(size),
            MaskKind::Face | MaskKind::Mesh => Self::face(size, template),
        }
    }

    /// The mesh mask of one face: its outline polygon (crop pixels) filled, with a feather of
    /// [`MESH_FEATHER`] of its size that lies mostly inside it, within the box mask.
    pub fn polygon(size: usize, outline: &[[f32; 2]]) -> Self {
        let mut m = Self {
            size,
            step: 1,
            table: Vec::new(),
            support: None,
            points: Vec::new(),
            sorted: Vec::new(),
            edges: Vec::new(),
        };
        m.set_polygon(size, outline);
        m
    }

    /// Makes this mask [`Mask::polygon`]'s, reusing its table.
    pub fn set_polygon(&mut self, size: usize, outline: &[[f32; 2]]) {
        // The mask's own buffers are reused: it is remade for every face of every frame.
        let mut pts = std::mem::take(&mut self.points);
        pts.clear();
        pts.extend(outline.iter().map(|p| (p[0] as f64, p[1] as f64)));
        let mut edges = std::mem::take(&mut self.edges);
        edges_of(&pts, &mut edges);
        let area = pts
            .iter()
            .zip(pts.iter().cycle().skip(1))
            .map(|(a, b)| a.0 * b.1 - b.0 * a.1)
            .sum::<f64>()
            .abs()
            / 2.0;
        let feather = (MESH_FEATHER * area.sqrt()).max(2.0);
        let out = MESH_FEATHER_OUT * feather;
        let step = (size / MESH_CELLS).max(1);
        let n = size.div_ceil(step);
        let mut table = std::mem::take(&mut self.table);
        table.clear();
        table.resize(n * n, 0.0);
        let value = |d: f64, u: f64, v: f64| -> f32 {
            if d > -out {
                (smoothstep((d + out) / (feather + out)) * Self::box_at(size, u, v) as f64) as f32
            } else {
                0.0
            }
        };
        // Blocks of cells: the distance changes by at most the distance moved, so a block
        // whose centre lies farther from the outline than the feather's reach plus half its
        // diagonal is wholly inside (one, within the box mask) or wholly outside (zero).
        const BLOCK: usize = 8;
        let reach = (BLOCK as f64 * step as f64) * std::f64::consts::FRAC_1_SQRT_2 + 1.0;
        for by in (0..n).step_by(BLOCK) {
            for bx in (0..n).step_by(BLOCK) {
                let (ex, ey) = ((bx + BLOCK).min(n), (by + BLOCK).min(n));
                let centre = (
                    (bx + ex - 1) as f64 * step as f64 / 2.0,
                    (by + ey - 1) as f64 * step as f64 / 2.0,
                );
                let dc = if pts.len() < 3 {
                    f64::NEG_INFINITY
                } else {
                    signed_distance(&edges, centre)
                };
                for y in by..ey {
                    for x in bx..ex {
                        let (u, v) = ((x * step) as f64, (y * step) as f64);
                        table[y * n + x] = if dc < -(out + reach) {
                            0.0
                        } else if dc > feather + reach {
                            Self::box_at(size, u, v)
                        } else {
                            value(signed_distance(&edges, (u, v)), u, v)
                        };
                    }
                }
            }
        }
        // Zero beyond the outline by more than `out` and one table cell: the outline's convex
        // hull (a folded or notched outline included) with each corner pushed out from the
        // centre by that and more holds every non-zero value.
        let margin = 1.5 * (out + 2.0 * step as f64 + 2.0);
        let mut grown = match self.support.take() {
            Some(Support::Polygon(v)) => v,
            _ => Vec::new(),
        };
        let enough = pts.len() >= 3;
        let mut sorted = std::mem::take(&mut self.sorted);
        sorted.clear();
        sorted.extend_from_slice(&pts);
        convex_hull(&mut sorted, &mut grown);
        let k = grown.len().max(1) as f64;
        let c = grown.iter().fold((0.0, 0.0), |c, p| (c.0 + p.0 / k, c.1 + p.1 / k));
        for p in grown.iter_mut() {
            let (dx, dy) = (p.0 - c.0, p.1 - c.1);
            let r = dx.hypot(dy).max(1e-9);
            // A hull side leans away from its corners' rays (by less than 60 degrees for an
            // outline round its centre): twice the margin along the ray covers it.
            *p = (p.0 + dx / r * margin * 2.0, p.1 + dy / r * margin * 2.0);
        }
        let support = enough.then_some(Support::Polygon(grown));
        *self = Self {
            size,
            step,
            table,
            support,
            points: pts,
            sorted,
            edges,
        };
    }

    /// Keeps the original picture where `occluders` lie in front of the face: each occluder
    /// takes from each table cell the share of what is left that it covers. Returns the share of
    /// the mask's weight held back (0 to 1).
    pub(crate) fn hold_back(&mut self, occluders: &[Occluder]) -> f32 {
        let total: f64 = self.table.iter().map(|&m| f64::from(m)).sum();
        if occluders.is_empty() || total <= 0.0 {
            return 0.0;
        }
        let (n, step) = (self.size.div_ceil(self.step), self.step as f64);
        let mut held = 0.0;
        for o in occluders {
            let polygons: Vec<Vec<[f64; 6]>> = o
                .polygons
                .iter()
                .map(|poly| {
                    let pts: Vec<(f64, f64)> = poly.iter().map(|q| (f64::from(q[0]), f64::from(q[1]))).collect();
                    let mut edges = Vec::new();
                    edges_of(&pts, &mut edges);
                    edges
                })
                .collect();
            let [x0, y0, x1, y1] = bounds(o);
            let cell = |c: f64| (c / step).clamp(0.0, n as f64);
            let (cx0, cy0) = (cell(x0).floor() as usize, cell(y0).floor() as usize);
            let (cx1, cy1) = (cell(x1).ceil() as usize, cell(y1).ceil() as usize);
            for y in cy0..cy1.min(n) {
                for x in cx0..cx1.min(n) {
                    let m = &mut self.table[y * n + x];
                    if *m == 0.0 {
                        continue;
                    }
                    let c = cover(o, &polygons, (x as f64 * step, y as f64 * step));
                    held += f64::from(*m) * c;
                    *m = (f64::from(*m) * (1.0 - c)) as f32;
                }
            }
        }
        (held / total).clamp(0.0, 1.0) as f32
    }

    /// The face mask: a feathered ellipse along the eyes-to-mouth axis, inside the box mask.
    pub fn face(size: usize, t: &[[f32; 2]; 5]) -> Self {
        let mid = |a: [f32; 2], b: [f32; 2]| ((a[0] + b[0]) as f64 / 2.0, (a[1] + b[1]) as f64 / 2.0);
        let (ex, ey) = mid(t[0], t[1]);
        let (mx, my) = mid(t[3], t[4]);
        let d = (mx - ex).hypot(my - ey).max(1.0);
        // Unit vectors: down the face (eyes to mouth) and across it.
        let (dx, dy) = ((mx - ex) / d, (my - ey) / d);
        let (semi_v, semi_u) = ((FACE_TOP + 1.0 + FACE_CHIN) / 2.0 * d, FACE_HALF_WIDTH * d);
        let centre = (1.0 + FACE_CHIN - FACE_TOP) / 2.0 * d;
        let (cx, cy) = (ex + dx * centre, ey + dy * centre);
        // Zero at every table sample outside the ellipse, so zero beyond it by more than the
        // one crop pixel a bilinear read reaches (two to spare).
        let support = Support::Ellipse(Ellipse {
            centre: (cx, cy),
            axis: (dx, dy),
            semi: (semi_v + 2.0, semi_u + 2.0),
        });
        let mask = Self::tabulate(size, |u, v| {
            let (px, py) = (u - cx, v - cy);
            let along = px * dx + py * dy;
            let across = -px * dy + py * dx;
            let r = ((along / semi_v).powi(2) + (across / semi_u).powi(2)).sqrt();
            let face = smoothstep((1.0 - r) / FACE_FEATHER);
            (face * Self::box_at(size, u, v) as f64) as f32
        });
        Self {
            support: Some(support),
            ..mask
        }
    }

    fn box_at(size: usize, u: f64, v: f64) -> f32 {
        let s = (size - 1) as f64;
        let d = u.min(v).min(s - u).min(s - v) / size as f64;
        smoothstep((d - BOX_BORDER) / BOX_FEATHER) as f32
    }

    fn tabulate(size: usize, f: impl Fn(f64, f64) -> f32) -> Self {
        let table = (0..size * size)
            .map(|i| f((i % size) as f64, (i / size) as f64))
            .collect();
        Self {
            size,
            step: 1,
            table,
            support: None,
            points: Vec::new(),
            sorted: Vec::new(),
            edges: Vec::new(),
        }
    }

    /// Mask value at crop coordinates (u, v) (bilinear between table cells), 0 outside the crop.
    #[inline]
    pub fn at(&self, u: f64, v: f64) -> f32 {
        let lim = (self.size - 1) as f64;
        if !(0.0..=lim).contains(&u) || !(0.0..=lim).contains(&v) {
            return 0.0;
        }
        let s = self.size.div_ceil(self.step);
        let (u, v) = if self.step == 1 {
            (u, v)
        } else {
            (u / self.step as f64, v / self.step as f64)
        };
        let (x0, y0) = ((u as usize).min(s - 1), (v as usize).min(s - 1));
        let (x1, y1) = ((x0 + 1).min(s - 1), (y0 + 1).min(s - 1));
        let (fx, fy) = ((u - x0 as f64) as f32, (v - y0 as f64) as f32);
        let t = &self.table;
        let top = t[y0 * s + x0] + (t[y0 * s + x1] - t[y0 * s + x0]) * fx;
        let bottom = t[y1 * s + x0] + (t[y1 * s + x1] - t[y1 * s + x0]) * fx;
        top + (bottom - top) * fy
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// [`Mask::at`] of four points at once in f32 (0 where a point lies off the crop).
    #[inline(always)]
    fn at4(&self, u: f32x4, v: f32x4) -> f32x4 {
        let (zero, lim) = (f32x4::ZERO, f32x4::splat((self.size - 1) as f32));
        let inside = u.simd_ge(zero) & u.simd_le(lim) & v.simd_ge(zero) & v.simd_le(lim);
        if inside.to_bitmask() == 0 {
            return zero;
        }
        let s = self.size.div_ceil(self.step);
        let r = f32x4::splat(1.0 / self.step as f32);
        let (u, v) = (u.max(zero) * r, v.max(zero) * r);
        // Non-negative, so truncation is floor.
        let (iu, iv) = (u.trunc_int(), v.trunc_int());
        let (fx, fy) = (u - iu.round_float(), v - iv.round_float());
        let (iu, iv) = (iu.to_array(), iv.to_array());
        let t = &self.table;
        let (mut a, mut b, mut c, mut d) = ([0.0f32; 4], [0.0f32; 4], [0.0f32; 4], [0.0f32; 4]);
        for k in 0..4 {
            let (x0, y0) = ((iu[k] as usize).min(s - 1), (iv[k] as usize).min(s - 1));
            let (x1, y1) = ((x0 + 1).min(s - 1), (y0 + 1).min(s - 1));
            (a[k], b[k], c[k], d[k]) = (t[y0 * s + x0], t[y0 * s + x1], t[y1 * s + x0], t[y1 * s + x1]);
        }
        let (a, b, c, d) = (f32x4::new(a), f32x4::new(b), f32x4::new(c), f32x4::new(d));
        let top = a + (b - a) * fx;
        let bottom = c + (d - c) * fx;
        (top + (bottom - top) * fy) & inside
    }
}

/// Crop pixels per frame pixel from which the paste reads a mip level (level k from
/// `MIP_FROM * 2^(k-1)` crop pixels per frame pixel).
pub(crate) const MIP_FROM: f64 = 3.0;

/// One face to paste: what the model changed in its crop (restored minus the crop it was given,
/// packed RGB in steps of [`CHANGE_STEPS`], the mask's size: see
/// [`crate::kernels::tensor::tensor_change`]) and where it goes.
pub struct Paste<'a> {
    pub change: &'a [i16],
    pub to_crop: Affine,
    pub region: Rect,
    /// The face's own mask (its mesh outline), instead of the shared one.
    pub mask: Option<&'a Mask>,
    /// The colour fix, where the paste takes it off (see [`fixed_from_a_level`]): the change's
    /// low band removed from the level the face is sampled from.
    pub fix: bool,
}

/// Whether a face at `to_crop` of a crop of `size` is sampled from one of its change's levels
/// (a face much smaller in the frame than its crop), where the colour fix is cheapest taken
/// off ([`crate::kernels::lowband::remove_low_band_from_level`]: a quarter of the crop's pixels
/// or fewer); the others' change is fixed whole before the paste.
pub(crate) fn fixed_from_a_level(to_crop: &Affine, size: usize) -> bool {
    level_of(to_crop, size) > 0
}

/// The level of its change a face at `to_crop` of a crop of `size` is sampled from.
fn level_of(to_crop: &Affine, size: usize) -> u32 {
    // Frame pixels per crop pixel inverted: crop pixels one frame pixel covers.
    mip_level(to_crop.scale() * 2.0 / MIP_FROM, 5.min(size.ilog2().saturating_sub(3)))
}

/// Reusable buffers of the paste stage: mip levels of one change crop and the accumulation
/// buffer of a group of overlapping faces.
pub struct Scratch {
    levels: Levels,
    acc: Vec<f32>,
}

impl Scratch {
    /// Buffers for pastes whose kernels run at `cpu` (the run's level: see `crate::kernels::cpu`).
    pub fn at(cpu: crate::kernels::Cpu) -> Scratch {
        Scratch {
            levels: Levels::at(cpu),
            acc: Vec::new(),
        }
    }

    /// The CPU level its pastes run at.
    pub fn cpu(&self) -> crate::kernels::Cpu {
        self.levels.cpu
    }
}

/// Reusable buffers of one face's change as [`accumulate`] reads it: its mip levels, the row
/// pairs' sums the first level is made from ([`halve_steps`]), and the change widened into
/// floats for a face larger than the crop.
struct Levels {
    mips: Vec<Vec<f32>>,
    sums: Vec<i32>,
    widened: Vec<f32>,
    /// The CPU level the halving runs at (the run's).
    cpu: crate::kernels::Cpu,
    /// The colour fix's buffers.
    low: crate::kernels::lowband::LowBand,
}

impl Levels {
    /// Buffers for halvings and colour fixes run at `cpu`.
    fn at(cpu: crate::kernels::Cpu) -> Levels {
        Levels {
            mips: Vec::new(),
            sums: Vec::new(),
            widened: Vec::new(),
            cpu,
            low: crate::kernels::lowband::LowBand::at(cpu),
        }
    }
}

/// What pasting `faces` changes in the frame, one [`Change`] per group of overlapping faces.
/// Each frame pixel of a face's region is mapped into the crop, the change there sampled
/// bicubically (from the crop's mip level for a face much smaller than the crop) and weighted
/// by `mask * blend`. Where regions overlap, the faces' changes are averaged weighted by their
/// mask values and weighted by the largest: a face never paints over another one's centre, and
/// no seam shows where their masks cross.
///
/// Only the change travels, never a resampled copy of the face: where the model changes
/// nothing, the frame keeps its pixels exactly (no blur from the warp into the crop and back),
/// and detail finer than the crop (a face larger than it) survives the paste.
///
/// The changes' buffers come from `buffer` (a pool's spare, so the hot path does not allocate).
pub fn changes(
    faces: &[Paste],
    mask: &Mask,
    blend: f32,
    scratch: &mut Scratch,
    buffer: &mut dyn FnMut() -> Vec<f32>,
) -> Vec<Change> {
    let mut out = Vec::new();
    for group in overlapping_groups(faces) {
        let r = group.iter().fold(faces[group[0]].region, |r, &i| {
            let q = faces[i].region;
            Rect::new(r.x0.min(q.x0), r.y0.min(q.y0), r.x1.max(q.x1), r.y1.max(q.y1))
        });
        let (rw, rh) = (r.width(), r.height());
        let mut rgb = buffer();
        rgb.clear();
        // A face's region varies a little from frame to frame: a buffer sized up to the next
        // power of two is not grown again each time it comes back from the pool.
        let n = rw * rh * 3;
        if rgb.capacity() < n {
            rgb.reserve_exact(n.next_power_of_two());
        }
        rgb.resize(n, 0.0);
        if let [one] = group[..] {
            // A face alone: its weighted change goes straight into the change buffer.
            accumulate(
                &mut rgb,
                Cells::Direct(blend),
                r,
                &faces[one],
                mask,
                &mut scratch.levels,
            );
            out.push(Change { rect: r, rgb });
            continue;
        }
        // Per pixel: sum of m * change (3), sum of m, largest m.
        let mut acc = std::mem::take(&mut scratch.acc);
        acc.clear();
        acc.resize(rw * rh * 5, 0.0);
        for &i in &group {
            accumulate(&mut acc, Cells::Sums, r, &faces[i], mask, &mut scratch.levels);
        }
        for (a, d) in acc.chunks_exact(5).zip(rgb.chunks_exact_mut(3)) {
            let alpha = a[4] * blend;
            if alpha > 0.0 && a[3] > 0.0 {
                let k = alpha / a[3];
                for c in 0..3 {
                    d[c] = a[c] * k;
                }
            }
        }
        scratch.acc = acc;
        out.push(Change { rect: r, rgb });
    }
    out
}

/// What [`accumulate`] writes per pixel.
#[derive(Clone, Copy)]
enum Cells {
    /// Five sums for a group of overlapping faces: m * change (3), m, and the largest m.
    Sums,
    /// A face alone at this blend: its pasted change (3), the very value the sums would give
    /// (m * change * (m * blend / m)).
    Direct(f32),
}

/// Adds `changes` to a packed RGB24 frame `width` wide, rounding to the nearest level.
pub(crate) fn apply_rgb(frame: &mut [u8], width: usize, changes: &[Change]) {
    for ch in changes {
        let r = ch.rect;
        for y in r.y0..r.y1 {
            let row = &mut frame[(y * width + r.x0) * 3..(y * width + r.x1) * 3];
            let d = &ch.rgb[(y - r.y0) * r.width() * 3..][..row.len()];
            for (p, &d) in row.iter_mut().zip(d) {
                // Clamped to [0, 255] first, so +0.5 and truncation round to nearest.
                *p = ((*p as f32 + d).clamp(0.0, 255.0) + 0.5) as u8;
            }
        }
    }
}

/// Pastes `faces` into a packed RGB24 frame (see [`changes`]): the tests' one-call form.
#[cfg(test)]
pub(crate) fn paste_all(
    frame: &mut [u8],
    width: usize,
    faces: &[Paste],
    mask: &Mask,
    blend: f32,
    scratch: &mut Scratch,
) {
    let c = changes(faces, mask, blend, scratch, &mut Vec::new);
    apply_rgb(frame, width, &c);
}

/// Pastes one face's change crop into the frame (see [`changes`]).
#[cfg(test)]
pub(crate) fn paste(
    frame: &mut [u8],
    width: usize,
    change: &[i16],
    to_crop: &Affine,
    r: Rect,
    mask: &Mask,
    blend: f32,
) {
    let face = Paste {
        change,
        to_crop: *to_crop,
        region: r,
        mask: None,
        fix: false,
    };
    paste_all(
        frame,
        width,
        &[face],
        mask,
        blend,
        &mut Scratch::at(crate::kernels::Cpu::detected()),
    );
}

/// Indices of faces in groups whose regions overlap (directly or through another face).
fn overlapping_groups(faces: &[Paste]) -> Vec<Vec<usize>> {
    let overlap = |a: Rect, b: Rect| a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
    let mut group: Vec<usize> = (0..faces.len()).collect();
    fn root(g: &mut [usize], mut i: usize) -> usize {
        while g[i] != i {
            g[i] = g[g[i]];
            i = g[i];
        }
        i
    }
    for i in 0..faces.len() {
        for j in i + 1..faces.len() {
            if overlap(faces[i].region, faces[j].region) {
                let (a, b) = (root(&mut group, i), root(&mut group, j));
                group[a] = b;
            }
        }
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for (i, face) in faces.iter().enumerate() {
        if face.region.is_empty() {
            continue;
        }
        let r = root(&mut group, i);
        match roots.iter().position(|&q| q == r) {
            Some(k) => out[k].push(i),
            None => {
                roots.push(r);
                out.push(vec![i]);
            }
        }
    }
    out
}

/// Adds one face's mask-weighted change to `acc` (per pixel of `r`, what `cells` says).
fn accumulate(
    acc: &mut [f32],
    cells: Cells,
    r: Rect,
    face: &Paste,
    mask: &Mask,
    Levels {
        mips,
        sums,
        widened,
        cpu,
        low,
    }: &mut Levels,
) {
    let mask = face.mask.unwrap_or(mask);
    let size = mask.size;
    let level = level_of(&face.to_crop, size);
    while mips.len() < level as usize {
        mips.push(Vec::new());
    }
    let mut sw = size;
    for l in 0..level as usize {
        let (done, rest) = mips.split_at_mut(l);
        sw = match l {
            0 => halve_steps(*cpu, face.change, sw, sw, &mut rest[0], sums).0,
            _ => halve(&done[l - 1], sw, sw, &mut rest[0]).0,
        };
    }
    if face.fix && level > 0 {
        crate::kernels::lowband::remove_low_band_from_level(&mut mips[level as usize - 1], sw, size, low);
    }
    let (region, crop) = (face.region.width() * face.region.height(), size * size);
    match level {
        // A face larger than the crop reads most of its change many times over: widened once
        // into floats, its taps are plain loads (widening each tap's values costs more). A
        // change still to be fixed is fixed so.
        0 if region > crop || face.fix => {
            widened.clear();
            widened.extend(face.change.iter().map(|&v| f32::from(v)));
            if face.fix {
                crate::kernels::lowband::remove_low_band_from_level(widened, sw, size, low);
            }
            accumulate_level(acc, cells, r, face, mask, (&widened[..], sw, level));
        }
        0 => accumulate_level(acc, cells, r, face, mask, (face.change, sw, level)),
        _ => accumulate_level(acc, cells, r, face, mask, (&mips[level as usize - 1], sw, level)),
    }
}

/// [`accumulate`] from the change's mip `level` `src` (`sw` square, in steps: the change
/// itself at level 0, a halving's floats above).
fn accumulate_level<T: Tap>(
    acc: &mut [f32],
    cells: Cells,
    r: Rect,
    face: &Paste,
    mask: &Mask,
    (src, sw, level): (&[T], usize, u32),
) {
    let size = mask.size;
    let m = face.to_crop.0;
    let k = (1usize << level) as f32;
    let lim = (size - 1) as f64;
    let rw = r.width();
    let Rect { x0, y0, x1, y1 } = face.region;
    let (half, inv_k) = (f32x4::splat((k - 1.0) / 2.0), f32x4::splat(1.0 / k));
    // Level points whose taps [`cubic3_taps`] may read (see [`crate::kernels::sample::cubic3_inside`]).
    let (one, lim_u, lim_v) = (
        f32x4::splat(1.0),
        f32x4::splat(sw as f32 - 3.0),
        f32x4::splat(sw as f32 - 2.0),
    );
    for y in y0..y1 {
        // The row's pixels whose crop point lies inside the crop (a line crosses the square
        // once): the rest are skipped without a look.
        let (u0, v0) = (m[1] * y as f64 + m[2], m[4] * y as f64 + m[5]);
        let (mut xa, mut xb) = (x0 as f64, (x1 - 1) as f64);
        for (start, step) in [(u0, m[0]), (v0, m[3])] {
            if step.abs() < 1e-12 {
                if !(0.0..=lim).contains(&(start + step * x0 as f64)) {
                    (xa, xb) = (1.0, 0.0);
                }
                continue;
            }
            let (a, b) = ((0.0 - start) / step, (lim - start) / step);
            xa = xa.max(a.min(b).floor() - 1.0);
            xb = xb.min(a.max(b).ceil() + 1.0);
        }
        if let Some(e) = &mask.support {
            match e.span((u0, v0), (m[0], m[3])) {
                Some((a, b)) => {
                    xa = xa.max(a.floor() - 1.0);
                    xb = xb.min(b.ceil() + 1.0);
                }
                None => continue,
            }
        }
        if xa > xb {
            continue;
        }
        let stride = match cells {
            Cells::Sums => 5,
            Cells::Direct(_) => 3,
        };
        let row = &mut acc[(y - r.y0) * rw * stride..][..rw * stride];
        // Four pixels at a time: their crop points, mask values, level points and bicubic
        // weights in one vector pass each, their taps one by one.
        let (first, last) = (xa as usize, xb as usize);
        let (su, sv, u0, v0) = (
            f32x4::splat(m[0] as f32),
            f32x4::splat(m[3] as f32),
            f32x4::splat(u0 as f32),
            f32x4::splat(v0 as f32),
        );
        for x4 in (first..=last).step_by(4) {
            let n = (last + 1 - x4).min(4);
            let xs = f32x4::splat(x4 as f32) + f32x4::new([0.0, 1.0, 2.0, 3.0]);
            let (cu, cv) = (u0 + su * xs, v0 + sv * xs);
            let alpha = mask.at4(cu, cv);
            let live = alpha.simd_gt(f32x4::ZERO).to_bitmask() & ((1 << n) - 1);
            if live == 0 {
                continue;
            }
            // Level pixel j covers crop pixels [j k, (j + 1) k): its centre is at j k + (k - 1) / 2.
            let (lu, lv) = ((cu - half) * inv_k, (cv - half) * inv_k);
            let fast = (lu.simd_ge(one) & lv.simd_ge(one) & lu.simd_lt(lim_u) & lv.simd_lt(lim_v)).to_bitmask();
            // Floors where the fast taps read (positive there); elsewhere unused.
            let (iu, iv) = (lu.trunc_int(), lv.trunc_int());
            let wu = cubic_weights4(lu - iu.round_float()).map(|w| w.to_array());
            let wv = cubic_weights4(lv - iv.round_float()).map(|w| w.to_array());
            let (iu, iv, lu, lv, alpha) = (
                iu.to_array(),
                iv.to_array(),
                lu.to_array(),
                lv.to_array(),
                alpha.to_array(),
            );
            for k in 0..n {
                if live & (1 << k) == 0 {
                    continue;
                }
                let p = if fast & (1 << k) != 0 {
                    let (u, v) = (iu[k] as usize, iv[k] as usize);
                    let t = cubic3_taps(src, sw, (u, v), wu.map(|w| w[k]), wv.map(|w| w[k])).to_array();
                    [t[0], t[1], t[2]]
                } else {
                    sample_cubic3(src, sw, sw, lu[k], lv[k])
                }
                .map(|v| v * (1.0 / CHANGE_STEPS));
                accumulate_cell(row, cells, x4 + k - r.x0, alpha[k], p);
            }
        }
    }
}

/// Adds one pixel's mask value `a` and sampled change `p` to its cell of `row` (see [`Cells`]).
#[inline(always)]
fn accumulate_cell(row: &mut [f32], cells: Cells, x: usize, a: f32, p: [f32; 3]) {
    match cells {
        Cells::Sums => {
            let cell = &mut row[x * 5..][..5];
            for c in 0..3 {
                cell[c] += a * p[c];
            }
            cell[3] += a;
            cell[4] = cell[4].max(a);
        }
        Cells::Direct(blend) => {
            let alpha = a * blend;
            if alpha > 0.0 {
                let k = alpha / a;
                let cell = &mut row[x * 3..][..3];
                for c in 0..3 {
                    cell[c] = (a * p[c]) * k;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::halve::halve_steps_body;

    /// Four points at once give what one point at a time gives (f32 against f64 arithmetic:
    /// within a millionth), off the crop included, for a tabulated mask and a coarser mesh one.
    #[test]
    fn the_mask_four_points_at_a_time_is_the_mask_point_by_point() {
        let outline: Vec<[f32; 2]> = (0..36)
            .map(|k| {
                let a = k as f32 / 36.0 * std::f32::consts::TAU;
                [128.0 + 70.0 * a.sin(), 140.0 - 90.0 * a.cos()]
            })
            .collect();
        for m in [Mask::new(256), Mask::polygon(256, &outline)] {
            for j in 0..400 {
                let u = [0, 1, 2, 3].map(|k| ((j * 37 + k * 101) % 300) as f32 - 20.5 + 0.37 * k as f32);
                let v = [0, 1, 2, 3].map(|k| ((j * 53 + k * 67) % 300) as f32 - 21.25 + 0.11 * k as f32);
                let got = m.at4(f32x4::new(u), f32x4::new(v)).to_array();
                for k in 0..4 {
                    let want = m.at(u[k] as f64, v[k] as f64);
                    assert!(
                        (got[k] - want).abs() < 1e-6,
                        "({}, {}): {} vs {want}",
                        u[k],
                        v[k],
                        got[k]
                    );
                }
            }
        }
    }

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
    fn the_support_of_a_notched_or_folded_outline_holds_its_mask() {
        // A star (deep notches) and an outline folded over itself.
        let star: Vec<[f32; 2]> = (0..36)
            .map(|k| {
                let a = k as f32 / 36.0 * std::f32::consts::TAU;
                let r = if k % 2 == 0 { 90.0 } else { 45.0 };
                [128.0 + r * a.sin(), 128.0 - r * a.cos()]
            })
            .collect();
        let mut folded = star.clone();
        folded.swap(5, 20);
        for outline in [star, folded] {
            let m = Mask::polygon(256, &outline);
            assert_support_holds_the_mask(&m);
        }
    }

    /// Every point where `m` is not zero lies inside its support, along lines of three
    /// directions through it.
    fn assert_support_holds_the_mask(m: &Mask) {
        let support = m.support.as_ref().expect("a polygon mask has a support");
        for v in 0..m.size {
            for u in 0..m.size {
                let (uf, vf) = (u as f64 + 0.5, v as f64 + 0.5);
                if m.at(uf, vf) > 0.0 {
                    for d in [(1.0, 0.0), (0.6, 0.8), (-0.3, 1.0)] {
                        let (a, b) = support.span((uf, vf), d).expect("the line meets the support");
                        assert!(a <= 0.0 && b >= 0.0, "({u}, {v}) outside the support along {d:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_mesh_mask_fills_its_outline_feathers_inside_and_its_support_holds_it() {
        let size = 256;
        // A face-like outline, turned and lopsided.
        let outline: Vec<[f32; 2]> = (0..36)
            .map(|k| {
                let a = k as f32 / 36.0 * std::f32::consts::TAU;
                let r = 1.0 + 0.15 * (2.0 * a).sin();
                [128.0 + 60.0 * r * a.sin() + 10.0 * a.cos(), 140.0 - 85.0 * r * a.cos()]
            })
            .collect();
        let m = Mask::polygon(size, &outline);
        let pts: Vec<(f64, f64)> = outline.iter().map(|p| (p[0] as f64, p[1] as f64)).collect();
        let mut edges = Vec::new();
        edges_of(&pts, &mut edges);
        // The block shortcut gives every cell the value the distance gives it.
        let n = size.div_ceil(m.step);
        let area = pts
            .iter()
            .zip(pts.iter().cycle().skip(1))
            .map(|(a, b)| a.0 * b.1 - b.0 * a.1)
            .sum::<f64>()
            .abs()
            / 2.0;
        let feather = MESH_FEATHER * area.sqrt();
        let out = MESH_FEATHER_OUT * feather;
        for y in 0..n {
            for x in 0..n {
                let (u, v) = ((x * m.step) as f64, (y * m.step) as f64);
                let d = signed_distance(&edges, (u, v));
                let want = if d > -out {
                    (smoothstep((d + out) / (feather + out)) * Mask::box_at(size, u, v) as f64) as f32
                } else {
                    0.0
                };
                assert_eq!(m.table[y * n + x], want, "cell ({x}, {y})");
                if d > feather {
                    assert_eq!(
                        want,
                        Mask::box_at(size, u, v),
                        "deep inside is one (within the box mask)"
                    );
                }
            }
        }
        // Every point where the mask is not zero lies inside the support along any line.
        assert_support_holds_the_mask(&m);
    }

    #[test]
    fn face_mask_covers_the_face_and_forehead_not_the_corners_and_has_no_step() {
        let size = 512;
        let t = crate::faces::align::template(size);
        let m = Mask::face(size, &t);
        // Eyes, nose, mouth corners: inside.
        for p in t {
            assert!(m.at(p[0] as f64, p[1] as f64) > 0.99, "{p:?}");
        }
        // The forehead above the eyes and the chin below the mouth.
        assert!(m.at(256.0, 150.0) > 0.5);
        assert!(m.at(256.0, 420.0) > 0.5);
        // Corners and the sides at eye level beyond the cheeks: outside.
        for (u, v) in [
            (40.0, 40.0),
            (470.0, 40.0),
            (40.0, 470.0),
            (470.0, 470.0),
            (30.0, 240.0),
            (480.0, 240.0),
        ] {
            assert_eq!(m.at(u, v), 0.0, "({u}, {v})");
        }
        // Feathered: neighbouring crop pixels never differ by more than 4 %.
        let mut worst = 0.0f32;
        for v in 0..size - 1 {
            for u in 0..size - 1 {
                let a = m.at(u as f64, v as f64);
                worst = worst.max((a - m.at(u as f64 + 1.0, v as f64)).abs());
                worst = worst.max((a - m.at(u as f64, v as f64 + 1.0)).abs());
            }
        }
        assert!(worst < 0.04, "mask step {worst}");
    }

    #[test]
    fn paste_changes_only_the_face_region_and_respects_blend() {
        let (w, h, size) = (200usize, 120usize, 64usize);
        let to_crop = Affine([1.0, 0.0, -50.0, 0.0, 1.0, -20.0]); // crop at (50, 20)
                                                                  // A crop restored to 200 from a frame of 10.
        let crop = vec![crate::kernels::change_steps(190.0); size * size * 3];
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

    #[test]
    fn a_hand_in_front_of_the_face_keeps_the_original_there_and_the_rest_is_pasted() {
        let (w, h, size) = (200usize, 120usize, 64usize);
        let to_crop = Affine([1.0, 0.0, -50.0, 0.0, 1.0, -20.0]); // crop at (50, 20)
        let crop = vec![crate::kernels::change_steps(190.0); size * size * 3];
        let r = crate::geom::crop_footprint(&to_crop, size, w, h).unwrap();
        let px = |f: &[u8], x: usize, y: usize| f[(y * w + x) * 3];
        // A finger across the crop (crop row 30, half width 4) and a palm in its lower right.
        let hand = Occluder {
            strokes: vec![([10.0, 30.0], [40.0, 30.0], 4.0)],
            polygons: vec![vec![[44.0, 40.0], [60.0, 40.0], [60.0, 60.0], [44.0, 60.0]]],
            feather: 3.0,
        };
        for whole in [
            Mask::new(size),
            Mask::face(size, &crate::faces::align::Template::Ffhq.points(size)),
        ] {
            let before = whole.clone();
            let mut held = whole.clone();
            let share = held.hold_back(std::slice::from_ref(&hand));
            assert!(share > 0.05 && share < 0.6, "{share}");
            for (u, v) in [(25.0, 30.0), (12.0, 27.0), (38.0, 33.5), (50.0, 50.0)] {
                assert_eq!(held.at(u, v), 0.0, "inside the hand at ({u}, {v})");
            }
            for (u, v) in [(25.0, 40.0), (32.0, 14.0), (30.0, 50.0)] {
                assert_eq!(held.at(u, v), before.at(u, v), "away from the hand at ({u}, {v})");
            }
            let (mut frame, mut as_before) = (vec![10u8; w * h * 3], vec![10u8; w * h * 3]);
            paste(&mut frame, w, &crop, &to_crop, r, &held, 1.0);
            paste(&mut as_before, w, &crop, &to_crop, r, &before, 1.0);
            // The finger's pixels (frame = crop + (50, 20)) keep the original; the face above it
            // is pasted as without the hand.
            for x in 62..88 {
                for y in 47..54 {
                    assert_eq!(px(&frame, x, y), 10, "finger pixel ({x}, {y})");
                }
            }
            assert_eq!(px(&frame, 80, 40), px(&as_before, 80, 40));
            assert!(px(&frame, 80, 40) > 50, "{}", px(&frame, 80, 40));
        }
        // No occluder: the mask as it was, nothing held back.
        let mut m = Mask::new(size);
        assert_eq!(m.hold_back(&[]), 0.0);
        assert_eq!(m.table, Mask::new(size).table);
    }

    #[test]
    fn overlapping_faces_combine_by_the_larger_mask_in_any_order() {
        let (w, h, size) = (160usize, 64usize, 64usize);
        let mask = Mask::new(size);
        let crop = vec![crate::kernels::change_steps(240.0); size * size * 3];
        let at = |x0: f64| Affine([1.0, 0.0, -x0, 0.0, 1.0, 0.0]);
        let faces = |order: [f64; 2]| {
            order.map(|x0| Paste {
                change: &crop,
                to_crop: at(x0),
                region: crate::geom::crop_footprint(&at(x0), size, w, h).unwrap(),
                mask: None,
                fix: false,
            })
        };
        let mut a = vec![10u8; w * h * 3];
        let mut b = vec![10u8; w * h * 3];
        let mut s = Scratch::at(crate::kernels::Cpu::detected());
        paste_all(&mut a, w, &faces([0.0, 40.0]), &mask, 1.0, &mut s);
        paste_all(&mut b, w, &faces([40.0, 0.0]), &mask, 1.0, &mut s);
        assert_eq!(a, b, "the order of the faces does not matter");
        // In the overlap each pixel is mixed by the larger of the two mask values, not by both
        // one after the other.
        for x in 40..64 {
            let y = 32;
            let m = mask.at(x as f64, y as f64).max(mask.at(x as f64 - 40.0, y as f64));
            let want = (10.0 + 240.0 * m + 0.5).floor() as i32;
            assert!(
                (a[(y * w + x) * 3] as i32 - want).abs() <= 1,
                "x {x}: {} vs {want}",
                a[(y * w + x) * 3]
            );
        }
    }

    #[test]
    fn a_fine_checkerboard_pasted_small_averages_to_grey() {
        let size = 256;
        let crop: Vec<i16> = (0..size * size)
            .flat_map(|i| {
                let v = crate::kernels::change_steps(if (i % size + i / size) % 2 == 0 { 0.0 } else { 255.0 });
                [v, v, v]
            })
            .collect();
        // The crop shrunk 6.4 times: a 40 px face.
        let s = 6.4;
        let to_crop = Affine([s, 0.0, -s * 10.0, 0.0, s, -s * 10.0]);
        let (w, h) = (80, 80);
        let r = crate::geom::crop_footprint(&to_crop, size, w, h).unwrap();
        let mut frame = vec![0u8; w * h * 3];
        paste(&mut frame, w, &crop, &to_crop, r, &Mask::new(size), 1.0);
        // Inside, where the mask is one: the mean grey, flat.
        let vals: Vec<f64> = (20..40)
            .flat_map(|y| (20..40).map(move |x| (x, y)))
            .map(|(x, y)| frame[(y * w + x) * 3] as f64)
            .collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let sd = (vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64).sqrt();
        assert!((mean - 127.5).abs() <= 2.0 && sd < 3.0, "mean {mean:.1}, sd {sd:.1}");
    }

    /// A noisy, textured frame warped into the crop and pasted back as the change onto a black
    /// frame (what a model that restored the whole face would paste) at the scales of a 53 px eye distance face into 256 and 512 crops and of a
    /// 31 px one into 256: inside the face it comes back within 40 dB PSNR (bilinear both ways
    /// gives about 37, and a mip level read at 2 crop pixels per frame pixel about 35).
    #[test]
    fn a_round_trip_into_the_crop_and_back_keeps_the_face() {
        let (w, h) = (400usize, 400usize);
        let mut seed = 12345u32;
        let mut noise = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 24) as f64 / 255.0 - 0.5
        };
        let frame: Vec<u8> = (0..w * h)
            .flat_map(|i| {
                let (x, y) = ((i % w) as f64, (i / w) as f64);
                let base = 128.0 + 60.0 * (x / 23.0).sin() * (y / 31.0).cos() + 30.0 * (x / 7.0 + y / 11.0).sin();
                let v = (base + 24.0 * noise()).round().clamp(0.0, 255.0) as u8;
                [v, v / 2 + 40, 255 - v]
            })
            .collect();
        for (size, scale) in [(256usize, 1.19), (512, 2.4), (256, 2.03)] {
            let to_crop = crate::geom::similarity(0.1, scale, -(scale * 37.3), -(scale * 41.7));
            let region = crate::geom::crop_footprint(&to_crop, size, w, h).unwrap();
            let mut t = vec![0.0f32; 3 * size * size];
            let mut scratch = crate::kernels::warp::WarpScratch::at(crate::kernels::Cpu::detected());
            crate::kernels::warp::warp_face(&frame, (w, h), &to_crop, Some(region), size, &mut t, &mut scratch);
            let (mut crop, zero) = (Vec::new(), vec![0u8; t.len()]);
            assert!(crate::kernels::tensor::tensor_change(
                crate::kernels::Cpu::detected(),
                &t,
                &zero,
                size,
                &mut crop
            ));
            let mask = Mask::new(size);
            let mut back = vec![0u8; frame.len()];
            paste(&mut back, w, &crop, &to_crop, region, &mask, 1.0);
            let (mut se, mut n) = (0.0f64, 0usize);
            for y in region.y0..region.y1 {
                for x in region.x0..region.x1 {
                    let (u, v) = to_crop.apply(x as f64, y as f64);
                    if mask.at(u, v) < 1.0 {
                        continue;
                    }
                    for c in 0..3 {
                        let i = (y * w + x) * 3 + c;
                        se += (back[i] as f64 - frame[i] as f64).powi(2);
                        n += 1;
                    }
                }
            }
            let db = 10.0 * (255.0f64.powi(2) / (se / n as f64)).log10();
            assert!(
                n > 1000 && db >= 40.0,
                "crop {size}, scale {scale}: {db:.1} dB over {n} samples"
            );
        }
    }

    /// Where the model changed nothing, the frame keeps every pixel, however the face is
    /// placed: no resampling of the face itself reaches the frame.
    #[test]
    fn a_zero_change_leaves_the_frame_exactly_as_it_was() {
        let (w, h, size) = (300usize, 260usize, 256usize);
        let frame: Vec<u8> = (0..w * h * 3).map(|i| (i * 7919 % 251) as u8).collect();
        let to_crop = crate::geom::similarity(0.3, 1.7, -80.0, -60.0);
        let r = crate::geom::crop_footprint(&to_crop, size, w, h).unwrap();
        let mut out = frame.clone();
        paste(
            &mut out,
            w,
            &vec![0; size * size * 3],
            &to_crop,
            r,
            &Mask::new(size),
            1.0,
        );
        assert_eq!(out, frame);
    }

    /// A face larger than the crop reads its change widened into floats first: the very sums
    /// the taps on the steps give.
    #[test]
    fn a_change_widened_first_pastes_what_its_steps_paste() {
        let size = 64;
        let change: Vec<i16> = (0..size * size * 3)
            .map(|i| ((i * 7919) % 6001) as i16 - 3000)
            .collect();
        let mask = Mask::new(size);
        let to_crop = crate::geom::similarity(0.3, 0.5, 10.0, -4.0);
        let region = crate::geom::crop_footprint(&to_crop, size, 400, 300).unwrap();
        assert!(
            region.width() * region.height() > size * size,
            "a face larger than the crop"
        );
        let face = Paste {
            change: &change,
            to_crop,
            region,
            mask: None,
            fix: false,
        };
        let n = region.width() * region.height() * 5;
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        accumulate(
            &mut a,
            Cells::Sums,
            region,
            &face,
            &mask,
            &mut Levels::at(crate::kernels::Cpu::detected()),
        );
        accumulate_level(&mut b, Cells::Sums, region, &face, &mask, (&change[..], size, 0));
        assert_eq!(a, b);
        assert!(a.iter().any(|&v| v != 0.0));
    }

    /// The colour fix taken off where the paste samples a small face's change (one of its
    /// levels) pastes what fixing the whole change first pastes, to a hundredth of a level; a
    /// face as large as its crop is fixed whole by the paste stage.
    #[test]
    fn a_fix_taken_off_a_level_pastes_what_the_whole_fix_pastes() {
        let (w, h, size) = (700usize, 500usize, 256usize);
        let change: Vec<i16> = (0..size * size * 3)
            .map(|i| {
                let (p, c) = (i / 3, i % 3);
                let (x, y) = ((p % size) as f32, (p / size) as f32);
                // A cast, a ramp and detail.
                crate::kernels::change_steps([20.0, -8.0, 5.0][c] + x / 30.0 - y / 50.0 + 6.0 * (x / 3.0).sin())
            })
            .collect();
        let mut fixed = change.clone();
        crate::kernels::lowband::remove_low_band(
            &mut fixed,
            size,
            &mut crate::kernels::lowband::LowBand::at(crate::kernels::Cpu::detected()),
        );
        let t = crate::faces::align::template(size);
        let mask = Mask::face(size, &t);
        for (scale, levelled) in [(3.5, true), (5.0, true), (9.0, true), (1.1, false)] {
            let to_crop = crate::geom::similarity(0.2, scale, -300.0 * scale, -200.0 * scale);
            assert_eq!(fixed_from_a_level(&to_crop, size), levelled, "scale {scale}");
            let region = crate::geom::crop_footprint(&to_crop, size, w, h).unwrap();
            let at = |change: &[i16], fix: bool| {
                let face = Paste {
                    change,
                    to_crop,
                    region,
                    mask: None,
                    fix,
                };
                changes(
                    &[face],
                    &mask,
                    1.0,
                    &mut Scratch::at(crate::kernels::Cpu::detected()),
                    &mut Vec::new,
                )
                .remove(0)
                .rgb
            };
            // At level 0 the paste stage fixes the change whole; given one to fix, the paste
            // does the same in floats.
            let (a, b) = (at(&change, true), at(&fixed, false));
            let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= 0.01, "scale {scale}: {worst} levels apart");
            let cast = at(&change, false);
            assert!(
                cast.iter().any(|&v| v > 10.0),
                "scale {scale}: the cast is there unfixed"
            );
        }
    }

    /// The paste visits only the pixels of each row inside the face mask's ellipse: what it
    /// pastes is exactly what visiting every pixel of the region pastes, for faces turned,
    /// larger and smaller than the crop, and cut by the frame's edge.
    #[test]
    fn skipping_what_lies_outside_the_face_mask_changes_nothing() {
        let (w, h, size) = (700usize, 500usize, 256usize);
        let change: Vec<i16> = (0..size * size * 3)
            .map(|i| crate::kernels::change_steps(((i * 31) % 17) as f32 - 8.0))
            .collect();
        let t = crate::faces::align::template(size);
        let with = Mask::face(size, &t);
        let without = Mask {
            support: None,
            ..with.clone()
        };
        for (angle, scale, tx, ty) in [
            (0.1, 1.3, -200.0, -150.0),
            (-0.6, 0.5, -100.0, -60.0),
            (2.5, 0.9, 500.0, 400.0),
            (0.0, 1.0, 0.0, 0.0),
            (1.2, 2.7, -1200.0, -300.0),
        ] {
            let to_crop = crate::geom::similarity(angle, scale, tx, ty);
            let Some(region) = crate::geom::crop_footprint(&to_crop, size, w, h) else {
                continue;
            };
            let faces = [Paste {
                change: &change,
                to_crop,
                region,
                mask: None,
                fix: false,
            }];
            let mut s = Scratch::at(crate::kernels::Cpu::detected());
            let a = changes(&faces, &with, 0.8, &mut s, &mut Vec::new);
            let b = changes(&faces, &without, 0.8, &mut s, &mut Vec::new);
            assert_eq!(a, b, "angle {angle}, scale {scale}");
            assert!(a[0].rgb.iter().any(|&v| v != 0.0), "something is pasted");
            // A face alone is written straight into its change: the value the five sums of a
            // group give.
            let (rw, rh) = (region.width(), region.height());
            let mut sums = vec![0.0; rw * rh * 5];
            accumulate(
                &mut sums,
                Cells::Sums,
                region,
                &faces[0],
                &with,
                &mut Levels::at(crate::kernels::Cpu::detected()),
            );
            let mut want = vec![0.0f32; rw * rh * 3];
            for (a, d) in sums.chunks_exact(5).zip(want.chunks_exact_mut(3)) {
                let alpha = a[4] * 0.8;
                if alpha > 0.0 && a[3] > 0.0 {
                    for c in 0..3 {
                        d[c] = a[c] * (alpha / a[3]);
                    }
                }
            }
            assert_eq!(a[0].rgb, want, "angle {angle}, scale {scale}");
        }
    }

    #[test]
    fn halving_averages_blocks() {
        let src = [
            0.0f32, 0.0, 0.0, 100.0, 100.0, 100.0, 200.0, 200.0, 200.0, 40.0, 40.0, 40.0,
        ];
        let mut out = Vec::new();
        assert_eq!(halve(&src, 2, 2, &mut out), (1, 1));
        assert_eq!(out, vec![85.0, 85.0, 85.0]);
        // Even sides (the rows side by side) and odd ones (the last pixel repeated), from steps:
        // each value its block's sum in the same order.
        for (w, h) in [(6usize, 4usize), (5, 3)] {
            let src: Vec<i16> = (0..w * h * 3).map(|i| (i * 7919 % 2001) as i16 - 1000).collect();
            let (hw, hh) = halve(&src, w, h, &mut out);
            let at = |x: usize, y: usize, c: usize| f32::from(src[(y.min(h - 1) * w + x.min(w - 1)) * 3 + c]);
            for (i, v) in out.iter().enumerate() {
                let (c, x, y) = (i % 3, (i / 3) % hw, i / 3 / hw);
                let (x, y) = (2 * x, 2 * y);
                let want = (((at(x, y, c) + at(x + 1, y, c)) + at(x, y + 1, c)) + at(x + 1, y + 1, c)) * 0.25;
                assert_eq!(*v, want, "{w}x{h}: value {i}");
            }
            assert_eq!(out.len(), hw * hh * 3);
        }
        // Halving steps in integers gives those very values, to the extremes of the range.
        for (w, h) in [(6usize, 4usize), (5, 3), (512, 2), (8, 8)] {
            let mut src: Vec<i16> = (0..w * h * 3).map(|i| (i * 7919 % 65535) as i32 as i16).collect();
            src[0] = i16::MAX;
            src[3] = i16::MAX;
            src[3 * w] = i16::MAX;
            src[3 * w + 3] = i16::MAX;
            if src.len() > 3 * w + 4 {
                src[1] = i16::MIN;
                src[4] = i16::MIN;
                src[3 * w + 1] = i16::MIN;
                src[3 * w + 4] = i16::MIN;
            }
            let mut fast = Vec::new();
            let want = halve(&src, w, h, &mut out);
            for cpu in crate::kernels::Cpu::available() {
                // The row pairs' sums reused from a wider change, as from face to face.
                let mut sums = vec![i32::MAX; 9 * w];
                assert_eq!(halve_steps(cpu, &src, w, h, &mut fast, &mut sums), want);
                assert_eq!(fast, out, "{}: {w}x{h}", cpu.name());
            }
            let mut sums = Vec::new();
            if w % 2 == 0 && h % 2 == 0 {
                assert_eq!(halve_steps_body(&src, w, h, &mut fast, &mut sums), (w / 2, h / 2));
                assert_eq!(fast, out, "plain body, {w}x{h}");
            }
        }
        assert_eq!(mip_level(1.0, 5), 0);
        assert_eq!(mip_level(2.0, 5), 1);
        assert_eq!(mip_level(13.0, 5), 3);
        assert_eq!(mip_level(1000.0, 2), 2);
    }
}
