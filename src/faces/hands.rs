//! Hands near a face: in, a frame's packed RGB and a face's box; out, the hands in the face's
//! neighbourhood (MediaPipe's palm detector and hand landmark model, converted to ONNX by
//! `models/hand_export.py`), each as its 21 points in frame pixels with a presence probability,
//! and the region a hand covers (capsules along its bones as wide as a finger, and its palm),
//! from which a mask can be made in any coordinate frame. A tracker follows a face's hands from
//! frame to frame by their points, as MediaPipe does, and runs the palm detector only every few
//! frames or when it follows no hand; or, gated ([`HandTracker::gated`], what the pipeline's
//! hands stage runs), when a track starts, on fixed frame numbers and when the face's
//! surroundings change ([`ring`]): that is what a frame without hands costs.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ort::session::Session;
use ort::value::{TensorRef, ValueType};

use crate::faces::detect::iou;
use crate::frame::Occluder;
use crate::geom::{crop_footprint, Affine};
use crate::kernels::warp::{warp_face, WarpScratch};
use crate::kernels::Cpu;
use crate::runtime::SessionOptions;
use crate::stats::thread_cpu_time;

/// The palm detector's input side in pixels.
pub(crate) const PALM_SIZE: usize = 192;
/// The hand landmark model's input side in pixels.
pub(crate) const HAND_SIZE: usize = 224;
/// Points of a hand: 0 wrist; 1-4 thumb; 5-8 index; 9-12 middle; 13-16 ring; 17-20 little
/// finger (each finger from its root to its tip).
pub const POINTS: usize = 21;
/// The palm detector's anchors.
const ANCHORS: usize = 2016;
/// Values per anchor of the palm detector's `boxes`: box centre, size, seven keypoints.
const BOX_VALUES: usize = 18;
/// The square searched for palms round a face, as a multiple of its box's longer side.
pub(crate) const NEIGHBOURHOOD: f32 = 2.5;
/// Palms overlapping by more than this are one palm (MediaPipe's weighted suppression).
const PALM_IOU: f32 = 0.3;
/// The hand crop round a palm, as a multiple of the palm box's longer side, and its shift
/// towards the fingers as a share of the box's height (MediaPipe's palm-to-hand rectangle).
const PALM_CROP: (f64, f64) = (2.6, -0.5);
/// The hand crop round a hand followed from its points (MediaPipe's landmarks-to-hand rectangle).
const FOLLOW_CROP: (f64, f64) = (2.0, -0.1);
/// Hands with a presence at or below this are dropped (MediaPipe's threshold).
pub(crate) const PRESENCE: f32 = 0.5;
/// A bone's radius as a share of the hand's size ([`Hand::size`]): half a finger's width. On
/// the set-up's handSrc.jpg the fingers are 54 to 60 pixels wide for a hand size of 267 pixels
/// (as the landmark model places its points), 0.20 to 0.22 of it.
pub(crate) const RADIUS: f32 = 0.11;
/// The palm's width (index root to little-finger root) over the wrist-to-middle-root length
/// of an open hand: a hand's size is the larger of that length and the palm's width scaled by
/// it, so a hand seen end on, its fingers pointing at the camera, keeps its size.
const PALM_WIDTH: f32 = 0.7;
/// Pixels over which [`Hand::coverage`] falls from 1 at the region's edge to 0 outside it.
pub(crate) const FEATHER: f32 = 3.0;
/// MediaPipe's hand connections: the bones and the palm's edges.
pub(crate) const BONES: [(usize, usize); 21] = [
    (0, 1),
    (1, 2),
    (2, 3),
    (3, 4),
    (0, 5),
    (5, 6),
    (6, 7),
    (7, 8),
    (5, 9),
    (9, 10),
    (10, 11),
    (11, 12),
    (9, 13),
    (13, 14),
    (14, 15),
    (15, 16),
    (13, 17),
    (17, 18),
    (18, 19),
    (19, 20),
    (0, 17),
];
/// The palm's polygon: wrist, thumb root, the four fingers' roots.
const PALM: [usize; 6] = [0, 1, 5, 9, 13, 17];
/// The points MediaPipe places a followed hand's crop by (the fingertips move too freely).
const STEADY: [usize; 12] = [0, 1, 2, 3, 5, 6, 9, 10, 13, 14, 17, 18];

/// What the paste keeps in front of a face (`--occlusion`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Occlusion {
    /// Hands found near each face keep the original picture where they lie.
    #[default]
    Hands,
    /// The restored face is pasted over whatever lies in front of it.
    Off,
}

/// The error of a run that keeps hands in front of faces where the hand models are missing.
pub(crate) fn missing() -> anyhow::Error {
    let [palm, marks] = crate::defaults::HAND_MODELS;
    anyhow::anyhow!(
        "--occlusion hands needs the hand models {palm} and {marks}, which are missing: run scripts/setup.sh (it makes them from MediaPipe's models), or use --occlusion off"
    )
}

/// One palm found by the palm detector, in frame pixels.
#[derive(Clone, Debug, PartialEq)]
pub struct Palm {
    /// x1, y1, x2, y2.
    pub bbox: [f32; 4],
    /// The wrist, the roots of the index, middle, ring and little fingers, two on the thumb.
    pub(crate) keypoints: [[f32; 2]; 7],
    /// The palm probability.
    pub score: f32,
}

impl Palm {
    /// The frame -> hand-crop transform MediaPipe cuts round a palm: a square of 2.6 times the
    /// box's longer side, shifted by half its height towards the fingers, turned so that the
    /// wrist-to-middle-finger line points up.
    pub fn roi(&self) -> Affine {
        let [x0, y0, x1, y1] = self.bbox.map(f64::from);
        let angle = rotation(self.keypoints[0], self.keypoints[2]);
        crop(((x0 + x1) / 2.0, (y0 + y1) / 2.0), (x1 - x0, y1 - y0), angle, PALM_CROP)
    }
}

/// One hand: its 21 points (see [`POINTS`]) and its presence probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hand {
    pub points: [[f32; 2]; POINTS],
    pub presence: f32,
}

impl Hand {
    /// The hand's size in its pixels: the wrist-to-middle-finger-root length, or the palm's
    /// width over [`PALM_WIDTH`] where that is larger (a hand turned end on).
    pub fn size(&self) -> f32 {
        let p = &self.points;
        dist(p[0], p[9]).max(dist(p[5], p[17]) / PALM_WIDTH)
    }

    /// The radius of the capsule round each bone: half a finger's width.
    pub fn radius(&self) -> f32 {
        RADIUS * self.size()
    }

    /// The signed distance from (x, y) to the hand's region, negative inside: the capsules of
    /// [`Hand::radius`] round its bones and the palm's polygon grown by the same radius.
    pub(crate) fn signed_distance(&self, x: f32, y: f32) -> f32 {
        let p = &self.points;
        let bones = BONES
            .iter()
            .map(|&(a, b)| segment_distance([x, y], p[a], p[b]))
            .fold(f32::INFINITY, f32::min);
        let palm = PALM.map(|i| p[i]);
        let edge = (0..palm.len())
            .map(|i| segment_distance([x, y], palm[i], palm[(i + 1) % palm.len()]))
            .fold(f32::INFINITY, f32::min);
        let polygon = if inside(&palm, x, y) { -edge } else { edge };
        bones.min(polygon) - self.radius()
    }

    /// How much (x, y) is covered by the hand: 1 inside its region, falling to 0 over
    /// [`FEATHER`] pixels outside it.
    pub fn coverage(&self, x: f32, y: f32) -> f32 {
        (1.0 - self.signed_distance(x, y) / FEATHER).clamp(0.0, 1.0)
    }

    /// The box (x1, y1, x2, y2) holding every pixel [`Hand::coverage`] covers.
    pub fn bbox(&self) -> [f32; 4] {
        let grow = self.radius() + FEATHER;
        let b = points_box(&self.points);
        [b[0] - grow, b[1] - grow, b[2] + grow, b[3] + grow]
    }

    /// The same hand with its points mapped through `t` (into a crop, say): its region maps
    /// with them, the radius scaling with the points under a similarity.
    pub fn mapped(&self, t: &Affine) -> Hand {
        Hand {
            points: self.points.map(|[x, y]| {
                let (u, v) = t.apply(f64::from(x), f64::from(y));
                [u as f32, v as f32]
            }),
            presence: self.presence,
        }
    }

    /// The hand as the paste holds it back in a face's crop (`to_crop`, the frame -> crop
    /// similarity): a stroke as wide as a finger along each bone (and across the palm from the
    /// thumb's root to the index finger's, the one palm edge that is no bone) and the palm's
    /// polygon, feathered over [`FEATHER`] frame pixels in crop pixels.
    pub(crate) fn occluder(&self, to_crop: &Affine) -> Occluder {
        let m = self.mapped(to_crop);
        let r = m.radius();
        let strokes = BONES
            .iter()
            .chain(&[(1, 5)])
            .map(|&(a, b)| (m.points[a], m.points[b], r))
            .collect();
        Occluder {
            strokes,
            polygons: vec![PALM.iter().map(|&i| m.points[i]).collect()],
            feather: (FEATHER * to_crop.scale() as f32).max(1.0),
        }
    }

    /// The frame -> hand-crop transform for this hand on the next frame (MediaPipe's crop from
    /// landmarks): the box of the steadier points, turned so that the wrist-to-fingers line
    /// points up, twice its longer side, shifted a tenth of its height towards the fingers.
    pub fn roi(&self) -> Affine {
        let p = self.points.map(|q| q.map(f64::from));
        let mid = |a: [f64; 2], b: [f64; 2]| [(a[0] + b[0]) / 2.0, (a[1] + b[1]) / 2.0];
        let knuckles = mid(mid(p[5], p[13]), p[9]);
        let angle = rotation(self.points[0], knuckles.map(|v| v as f32));
        let fold = |f: fn(f64, f64) -> f64, init: f64, k: usize| STEADY.iter().map(|&i| p[i][k]).fold(init, f);
        let (ax, ay) = (
            (fold(f64::min, f64::INFINITY, 0) + fold(f64::max, f64::NEG_INFINITY, 0)) / 2.0,
            (fold(f64::min, f64::INFINITY, 1) + fold(f64::max, f64::NEG_INFINITY, 1)) / 2.0,
        );
        // The points' box in the hand's own axes, round the axis-aligned box's centre.
        let (s, c) = (-angle).sin_cos();
        let turned: Vec<(f64, f64)> = STEADY
            .iter()
            .map(|&i| {
                let (x, y) = (p[i][0] - ax, p[i][1] - ay);
                (x * c - y * s, x * s + y * c)
            })
            .collect();
        let lo = turned
            .iter()
            .fold((f64::INFINITY, f64::INFINITY), |m, q| (m.0.min(q.0), m.1.min(q.1)));
        let hi = turned.iter().fold((f64::NEG_INFINITY, f64::NEG_INFINITY), |m, q| {
            (m.0.max(q.0), m.1.max(q.1))
        });
        let (px, py) = ((lo.0 + hi.0) / 2.0, (lo.1 + hi.1) / 2.0);
        let (s, c) = angle.sin_cos();
        let centre = (px * c - py * s + ax, px * s + py * c + ay);
        crop(centre, (hi.0 - lo.0, hi.1 - lo.1), angle, FOLLOW_CROP)
    }
}

/// MediaPipe's rotation of a hand whose fingers point from `from` to `to`: the angle that
/// turns that line upright (0 for fingers up, positive clockwise on the picture).
fn rotation(from: [f32; 2], to: [f32; 2]) -> f64 {
    let (dx, dy) = (f64::from(to[0] - from[0]), f64::from(to[1] - from[1]));
    let a = std::f64::consts::FRAC_PI_2 - (-dy).atan2(dx);
    // Into (-pi, pi].
    let tau = std::f64::consts::TAU;
    a - tau * ((a + std::f64::consts::PI) / tau).floor()
}

/// The frame -> hand-crop transform of MediaPipe's rectangle round `centre` of `(w, h)` frame
/// pixels turned by `angle`: shifted by `shift` of its height along its own up, made square on
/// its longer side and scaled by `scale`.
fn crop(centre: (f64, f64), (w, h): (f64, f64), angle: f64, (scale, shift): (f64, f64)) -> Affine {
    let (s, c) = angle.sin_cos();
    let (cx, cy) = (centre.0 - h * shift * s, centre.1 + h * shift * c);
    let side = w.max(h).max(1.0) * scale;
    // Crop (u, v) -> frame: centre + R(angle) ((u, v) - half) side / size.
    let k = side / HAND_SIZE as f64;
    let half = HAND_SIZE as f64 / 2.0;
    let to_frame = Affine([
        c * k,
        -s * k,
        cx - (c - s) * half * k,
        s * k,
        c * k,
        cy - (s + c) * half * k,
    ]);
    to_frame.inverse().unwrap_or(Affine::IDENTITY)
}

fn dist(a: [f32; 2], b: [f32; 2]) -> f32 {
    (a[0] - b[0]).hypot(a[1] - b[1])
}

/// The distance from `p` to the segment from `a` to `b`.
fn segment_distance(p: [f32; 2], a: [f32; 2], b: [f32; 2]) -> f32 {
    let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
    let len2 = dx * dx + dy * dy;
    let t = if len2 > 0.0 {
        (((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / len2).clamp(0.0, 1.0)
    } else {
        0.0
    };
    dist(p, [a[0] + t * dx, a[1] + t * dy])
}

/// Whether (x, y) lies inside the polygon (even-odd rule).
fn inside(poly: &[[f32; 2]], x: f32, y: f32) -> bool {
    let mut c = false;
    for i in 0..poly.len() {
        let (a, b) = (poly[i], poly[(i + 1) % poly.len()]);
        if (a[1] > y) != (b[1] > y) && x < a[0] + (y - a[1]) / (b[1] - a[1]) * (b[0] - a[0]) {
            c = !c;
        }
    }
    c
}

fn points_box(points: &[[f32; 2]]) -> [f32; 4] {
    points
        .iter()
        .fold([f32::MAX, f32::MAX, f32::MIN, f32::MIN], |b, &[x, y]| {
            [b[0].min(x), b[1].min(y), b[2].max(x), b[3].max(y)]
        })
}

/// The square searched for a face's hands, [`NEIGHBOURHOOD`] times the face box's longer side
/// round its centre, clipped to a `w x h` frame (x1, y1, x2, y2); `None` for a box that is not
/// finite or a square that misses the frame.
pub(crate) fn neighbourhood(face_box: [f32; 4], (w, h): (usize, usize)) -> Option<[f32; 4]> {
    if !face_box.iter().all(|v| v.is_finite()) {
        return None;
    }
    let [x0, y0, x1, y1] = face_box;
    let half = NEIGHBOURHOOD * (x1 - x0).max(y1 - y0).max(1.0) / 2.0;
    let (cx, cy) = ((x0 + x1) / 2.0, (y0 + y1) / 2.0);
    let r = [
        (cx - half).max(0.0),
        (cy - half).max(0.0),
        (cx + half).min(w as f32),
        (cy + half).min(h as f32),
    ];
    (r[2] - r[0] >= 1.0 && r[3] - r[1] >= 1.0).then_some(r)
}

/// MediaPipe's weighted non-maximum suppression: the best palm left and every palm overlapping
/// it by more than [`PALM_IOU`] become one palm, their boxes and keypoints averaged by score,
/// with the best one's score.
fn weighted_nms(mut palms: Vec<Palm>) -> Vec<Palm> {
    palms.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut out = Vec::new();
    while let Some(best) = palms.first().cloned() {
        let (group, rest): (Vec<Palm>, Vec<Palm>) =
            palms.into_iter().partition(|p| iou(&best.bbox, &p.bbox) > PALM_IOU);
        palms = rest;
        let total: f32 = group.iter().map(|p| p.score).sum();
        let mut merged = Palm {
            bbox: [0.0; 4],
            keypoints: [[0.0; 2]; 7],
            score: best.score,
        };
        for p in &group {
            let wt = p.score / total;
            for k in 0..4 {
                merged.bbox[k] += wt * p.bbox[k];
            }
            for (m, q) in merged.keypoints.iter_mut().zip(&p.keypoints) {
                m[0] += wt * q[0];
                m[1] += wt * q[1];
            }
        }
        out.push(merged);
    }
    out
}

/// CPU time spent inside the two models' runs, and the runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HandsCpu {
    pub palm: Duration,
    pub palm_runs: u64,
    pub landmarks: Duration,
    pub landmark_runs: u64,
}

/// The palm detector's and the hand landmark model's sessions, their input buffer and the
/// warp's scratch.
pub struct Hands {
    palm: Session,
    palm_input: String,
    /// Indices of `boxes`, `scores` and `anchors` among the palm detector's outputs.
    palm_outputs: [usize; 3],
    marks: Session,
    marks_input: String,
    /// Indices of `landmarks` and `presence` among the hand model's outputs.
    marks_outputs: [usize; 2],
    input: Vec<f32>,
    scratch: WarpScratch,
    cpu: HandsCpu,
}

/// The input name of a session taking one [N,3,side,side] tensor, and the indices of the
/// outputs `names`; `what` names the model in the error.
fn check(session: &Session, side: usize, names: &[&str], what: &str) -> Result<(String, Vec<usize>)> {
    let inputs = session.inputs();
    if inputs.len() != 1 {
        bail!("the {what} takes {} inputs, not one", inputs.len());
    }
    let ValueType::Tensor { shape, .. } = inputs[0].dtype() else {
        bail!("the {what}'s input is not a tensor");
    };
    let dims: Vec<i64> = shape.iter().copied().collect();
    if dims.len() != 4 || dims[1] != 3 || dims[2] != side as i64 || dims[3] != side as i64 {
        bail!("the {what}'s input is {dims:?}, not [N,3,{side},{side}]");
    }
    let found: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
    let idx = names
        .iter()
        .map(|n| {
            found
                .iter()
                .position(|f| f == n)
                .with_context(|| format!("the {what} has no output `{n}` (its outputs: {found:?})"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((inputs[0].name().to_string(), idx))
}

impl Hands {
    /// Checks the sessions are the palm detector ([N,3,192,192] in; `boxes`, `scores`,
    /// `anchors` out) and the hand landmark model ([N,3,224,224] in; `landmarks`, `presence`
    /// out); the crops are warped at `cpu`.
    pub fn new(palm: Session, landmarks: Session, cpu: Cpu) -> Result<Self> {
        let (palm_input, p) = check(&palm, PALM_SIZE, &["boxes", "scores", "anchors"], "palm detector")?;
        let (marks_input, m) = check(&landmarks, HAND_SIZE, &["landmarks", "presence"], "hand landmark model")?;
        Ok(Self {
            palm,
            palm_input,
            palm_outputs: [p[0], p[1], p[2]],
            marks: landmarks,
            marks_input,
            marks_outputs: [m[0], m[1]],
            input: Vec::new(),
            scratch: WarpScratch::at(cpu),
            cpu: HandsCpu::default(),
        })
    }

    /// Opens both models (`models/palm-detect.onnx` and `models/hand-landmarks.onnx`, which
    /// `scripts/setup.sh` converts) on the options' target.
    pub fn open(palm: &Path, landmarks: &Path, opts: &SessionOptions, cpu: Cpu) -> Result<Self> {
        let p = crate::runtime::session(palm, opts, "palm detector")?;
        let m = crate::runtime::session(landmarks, opts, "hand landmark model")?;
        Self::new(p, m, cpu).with_context(|| {
            format!(
                "{} and {}: expected MediaPipe's palm detector and hand landmarks as models/hand_export.py converts them (run scripts/setup.sh)",
                palm.display(),
                landmarks.display()
            )
        })
    }

    /// CPU time spent inside the models' runs so far (this thread's clock round each run).
    pub fn model_cpu(&self) -> HandsCpu {
        self.cpu
    }

    /// The hands near a face: palms in its neighbourhood, then each palm's hand by the
    /// landmark model, those present. `rgb` is a packed RGB24 frame of `w x h`.
    pub fn find(&mut self, rgb: &[u8], (w, h): (usize, usize), face_box: [f32; 4]) -> Result<Vec<Hand>> {
        let rois: Vec<Affine> = self.palms(rgb, (w, h), face_box)?.iter().map(Palm::roi).collect();
        let mut hands = self.landmarks(rgb, (w, h), &rois)?;
        hands.retain(|h| h.presence > PRESENCE);
        Ok(hands)
    }

    /// The palms in a face's [`neighbourhood`]: that square letterboxed to the palm detector's
    /// input (the frame's outside black), anchors decoded, those above even odds kept and
    /// merged by weighted suppression, best first, in frame pixels.
    pub fn palms(&mut self, rgb: &[u8], (w, h): (usize, usize), face_box: [f32; 4]) -> Result<Vec<Palm>> {
        check_frame(rgb, (w, h))?;
        let Some([x0, y0, x1, y1]) = neighbourhood(face_box, (w, h)) else {
            return Ok(Vec::new());
        };
        let side = PALM_SIZE as f64;
        let k = side / f64::from((x1 - x0).max(y1 - y0));
        let (rw, rh) = (f64::from(x1 - x0) * k, f64::from(y1 - y0) * k);
        let (ox, oy) = ((side - rw) / 2.0, (side - rh) / 2.0);
        let to_crop = Affine([k, 0.0, ox - f64::from(x0) * k, 0.0, k, oy - f64::from(y0) * k]);
        let plane = PALM_SIZE * PALM_SIZE;
        self.input.resize(3 * plane, 0.0);
        let region = crop_footprint(&to_crop, PALM_SIZE, w, h);
        warp_face(
            rgb,
            (w, h),
            &to_crop,
            region,
            PALM_SIZE,
            &mut self.input[..],
            &mut self.scratch,
        );
        // The crop is in [-1, 1]; the model takes [0, 1], black outside the square.
        let kept = |v: usize, len: f64, off: f64| (v as f64 + 0.5) >= off && (v as f64 + 0.5) <= off + len;
        for (i, x) in self.input.iter_mut().enumerate() {
            let (v, u) = ((i % plane) / PALM_SIZE, i % PALM_SIZE);
            *x = if kept(u, rw, ox) && kept(v, rh, oy) {
                *x * 0.5 + 0.5
            } else {
                0.0
            };
        }
        let tensor = TensorRef::from_array_view(([1usize, 3, PALM_SIZE, PALM_SIZE], &self.input[..]))?;
        let start = thread_cpu_time();
        let outputs = self.palm.run(ort::inputs![self.palm_input.as_str() => tensor])?;
        self.cpu.palm += thread_cpu_time().saturating_sub(start);
        self.cpu.palm_runs += 1;
        let [bi, si, ai] = self.palm_outputs;
        let (_, boxes) = outputs[bi].try_extract_tensor::<f32>()?;
        let (_, scores) = outputs[si].try_extract_tensor::<f32>()?;
        let (_, anchors) = outputs[ai].try_extract_tensor::<f32>()?;
        if boxes.len() != ANCHORS * BOX_VALUES || scores.len() != ANCHORS || anchors.len() != ANCHORS * 2 {
            bail!(
                "the palm detector gave {} boxes, {} scores and {} anchor values, not {ANCHORS} of each: is this models/palm-detect.onnx?",
                boxes.len() / BOX_VALUES,
                scores.len(),
                anchors.len() / 2
            );
        }
        let to_frame = to_crop.inverse().unwrap_or(Affine::IDENTITY);
        let at = |x: f32, y: f32| {
            let (fx, fy) = to_frame.apply(f64::from(x) * side, f64::from(y) * side);
            [fx as f32, fy as f32]
        };
        let mut palms = Vec::new();
        for (i, &logit) in scores.iter().enumerate() {
            // Sigmoid above 0.5 is a logit above 0.
            if logit.is_nan() || logit <= 0.0 {
                continue;
            }
            let b = &boxes[i * BOX_VALUES..][..BOX_VALUES];
            let (ax, ay) = (anchors[2 * i], anchors[2 * i + 1]);
            let s = PALM_SIZE as f32;
            let (cx, cy, bw, bh) = (b[0] / s + ax, b[1] / s + ay, b[2] / s, b[3] / s);
            let [bx0, by0] = at(cx - bw / 2.0, cy - bh / 2.0);
            let [bx1, by1] = at(cx + bw / 2.0, cy + bh / 2.0);
            let keypoints = std::array::from_fn(|j| at(b[4 + 2 * j] / s + ax, b[5 + 2 * j] / s + ay));
            palms.push(Palm {
                bbox: [bx0, by0, bx1, by1],
                keypoints,
                score: 1.0 / (1.0 + (-logit.min(100.0)).exp()),
            });
        }
        Ok(weighted_nms(palms))
    }

    /// The hands in the crops `rois` (frame -> hand-crop transforms, from [`Palm::roi`] or
    /// [`Hand::roi`]), in one batch: each hand's points in frame pixels and its presence, in
    /// the crops' order, present or not.
    pub fn landmarks(&mut self, rgb: &[u8], (w, h): (usize, usize), rois: &[Affine]) -> Result<Vec<Hand>> {
        check_frame(rgb, (w, h))?;
        let n = rois.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let plane = 3 * HAND_SIZE * HAND_SIZE;
        self.input.resize(n * plane, 0.0);
        for (t, input) in rois.iter().zip(self.input.chunks_exact_mut(plane)) {
            let region = crop_footprint(t, HAND_SIZE, w, h);
            warp_face(rgb, (w, h), t, region, HAND_SIZE, input, &mut self.scratch);
            for x in input.iter_mut() {
                *x = *x * 0.5 + 0.5;
            }
        }
        let tensor = TensorRef::from_array_view(([n, 3, HAND_SIZE, HAND_SIZE], &self.input[..n * plane]))?;
        let start = thread_cpu_time();
        let outputs = self.marks.run(ort::inputs![self.marks_input.as_str() => tensor])?;
        self.cpu.landmarks += thread_cpu_time().saturating_sub(start);
        self.cpu.landmark_runs += 1;
        let (_, points) = outputs[self.marks_outputs[0]].try_extract_tensor::<f32>()?;
        let (_, presence) = outputs[self.marks_outputs[1]].try_extract_tensor::<f32>()?;
        if points.len() != n * POINTS * 3 || presence.len() != n {
            bail!(
                "the hand landmark model gave {} values for {n} crops: is this models/hand-landmarks.onnx?",
                points.len()
            );
        }
        Ok(rois
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let inv = t.inverse().unwrap_or(Affine::IDENTITY);
                let p = &points[i * POINTS * 3..][..POINTS * 3];
                Hand {
                    points: std::array::from_fn(|j| {
                        let (x, y) = inv.apply(f64::from(p[3 * j]), f64::from(p[3 * j + 1]));
                        [x as f32, y as f32]
                    }),
                    presence: presence[i],
                }
            })
            .collect())
    }
}

/// Checks `rgb` holds a packed RGB24 frame of `w x h`.
fn check_frame(rgb: &[u8], (w, h): (usize, usize)) -> Result<()> {
    if w == 0 || h == 0 || rgb.len() < w * h * 3 {
        bail!(
            "a {w}x{h} frame needs {} bytes of packed RGB, got {}",
            w * h * 3,
            rgb.len()
        );
    }
    Ok(())
}

/// The smoothing of a followed hand's points: MediaPipe's one-euro filter for hand points (min
/// cutoff 0.05 Hz, beta 80, derivative cutoff 1 Hz, speeds in hand sizes, here at 30 frames a
/// second and counted in frames), each point with its own filtered velocity. A still point's
/// jitter (its velocity averaging out) is filtered hard; a moving point's cutoff rises with
/// its speed, so it follows the hand within a pixel or two instead of lagging it.
const MIN_CUTOFF: f32 = 0.05 / 30.0;
const BETA: f32 = 80.0;
const SPEED_CUTOFF: f32 = 1.0 / 30.0;

/// The weight of a new sample in a first-order low-pass of `cutoff` cycles per frame.
fn alpha(cutoff: f32) -> f32 {
    let tau = 1.0 / (std::f32::consts::TAU * cutoff);
    1.0 / (1.0 + tau)
}

/// A hand followed from frame to frame.
#[derive(Clone, Debug)]
struct Followed {
    /// The model's points of the latest frame, where the next crop is placed.
    raw: Hand,
    /// The points given out.
    smooth: Hand,
    /// Each point's filtered velocity, hand sizes per frame.
    velocity: [[f32; 2]; POINTS],
}

impl Followed {
    fn start(hand: Hand) -> Self {
        Followed {
            raw: hand,
            smooth: hand,
            velocity: [[0.0; 2]; POINTS],
        }
    }

    fn update(&mut self, hand: Hand) {
        let size = hand.size().max(1.0);
        let a_speed = alpha(SPEED_CUTOFF);
        for i in 0..POINTS {
            let (p, last, v, s) = (
                hand.points[i],
                self.raw.points[i],
                &mut self.velocity[i],
                &mut self.smooth.points[i],
            );
            for k in 0..2 {
                v[k] += a_speed * ((p[k] - last[k]) / size - v[k]);
            }
            let a = alpha(MIN_CUTOFF + BETA * v[0].hypot(v[1]));
            for k in 0..2 {
                s[k] += a * (p[k] - s[k]);
            }
        }
        self.smooth.presence = hand.presence;
        self.raw = hand;
    }
}

/// Follows one face's hands over a video: each frame, the hands of the frame before are
/// found again in crops placed by their points (the landmark model alone); the palm detector
/// runs on the face's neighbourhood on frames whose index is a multiple of `every`, and on
/// any frame where no hand is followed. On a video without hands that is one palm detection
/// per face every `every` frames and no landmark run; with hands, one landmark run per frame
/// for all of a face's hands.
///
/// Gated ([`HandTracker::gated`]), the palm detector runs less: on the track's first frame of
/// each stretch of [`STRETCH`] frames (counted from the video's first frame; the tracker starts
/// afresh there, so what it gives depends only on the frames since the stretch began, and a
/// segment that warms up from there decides as one run does), on frame numbers that are
/// multiples of `every`, and on a frame where the face's surroundings ([`ring`]) changed since
/// the models last looked and found no hand (at most once every [`QUIET`] frames). A frame on
/// which none of that holds and no hand is followed runs no model at all.
pub struct HandTracker {
    every: u64,
    /// Gated: the stretch the tracker is in (`None` before its first frame).
    gate: Option<Option<u64>>,
    /// The face's surroundings when the models last looked and found no hand.
    reference: Vec<f32>,
    /// The first frame the change trigger may run the palm detector again.
    quiet_until: u64,
    followed: Vec<Followed>,
    out: Vec<Hand>,
}

/// Two hands whose points' boxes overlap by more than this are one hand.
const SAME_HAND_IOU: f32 = 0.5;

/// Frames of a gated tracker's stretch (see [`HandTracker`]).
pub(crate) const STRETCH: u64 = 128;
/// A gated tracker's palm detection on fixed frame numbers: every this many frames.
pub(crate) const EVERY: u32 = 64;
/// Frames after a look that found nothing before the change trigger may run the palm detector
/// again (a camera that moves all the time costs one palm detection in this many frames).
pub(crate) const QUIET: u64 = 3;
/// Cells across the square [`ring`] samples.
pub(crate) const RING_CELLS: usize = 12;
/// The ring's side as a multiple of the model's crop: about the face's [`NEIGHBOURHOOD`] (the
/// face spans about half an aligned crop).
pub(crate) const RING_SIDE: f64 = 1.25;
/// The rows and columns of ring cells the face covers: the middle 60 % of the crop, cells 3 to
/// 8 of 12 (their centres within 0.26 crops of its centre).
const FACE_CELLS: std::ops::Range<usize> = 3..9;
/// Samples across a ring cell (its mean is of this many squared).
const RING_SAMPLES: usize = 5;
/// A ring cell changed: its luma moved by more than this many levels.
const RING_LEVELS: f32 = 24.0;
/// The change trigger fires when at least this share of the ring's cells changed (and at
/// least two): a hand's edge entering the neighbourhood.
const RING_SHARE: f32 = 0.04;

/// What a tracker runs on a frame (see [`HandTracker::look`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// No model: no hand followed and nothing due.
    Nothing,
    /// The landmark model on the hands followed.
    Follow,
    /// The palm detector on the neighbourhood, then the landmark model.
    Search,
}

/// The face's surroundings, cheaply: the mean luma of each of [`RING_CELLS`] x [`RING_CELLS`]
/// cells of a square of [`RING_SIDE`] times the model's crop round the crop's centre, in the
/// crop's own frame (`to_frame`, crop -> frame, from the face's five points: a face moving or
/// turning with its background sees the same values, and the points, unlike a box, are placed
/// alike on the detector's passes and between them), each from a grid of samples, leaving out
/// the central cells the face lies in (a talking face changes there): always the same cells,
/// so two rings compare cell by cell. `luma(x, y)` reads one frame pixel's luma (clamped to the
/// frame by the caller).
#[cfg(test)]
fn ring(to_frame: &Affine, crop: usize, luma: &mut impl FnMut(f32, f32) -> f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(RING_CELLS * RING_CELLS);
    ring_into(to_frame, crop, luma, &mut out);
    out
}

/// [`ring`] into `out` (cleared first): a caller that keeps `out` allocates nothing per frame.
pub(crate) fn ring_into(to_frame: &Affine, crop: usize, luma: &mut impl FnMut(f32, f32) -> f32, out: &mut Vec<f32>) {
    out.clear();
    let side = RING_SIDE * crop as f64;
    let c = crop as f64 / 2.0;
    let cell = side / RING_CELLS as f64;
    let step = cell / RING_SAMPLES as f64;
    for j in 0..RING_CELLS {
        for i in 0..RING_CELLS {
            if FACE_CELLS.contains(&i) && FACE_CELLS.contains(&j) {
                continue;
            }
            // A grid of samples over the cell: its mean moves little when the picture shifts
            // by a pixel or two under the face (a point sample on an edge would jump).
            let (left, top) = (c - side / 2.0 + i as f64 * cell, c - side / 2.0 + j as f64 * cell);
            let mut sum = 0.0;
            for v in 0..RING_SAMPLES {
                for u in 0..RING_SAMPLES {
                    let (x, y) = to_frame.apply(left + (u as f64 + 0.5) * step, top + (v as f64 + 0.5) * step);
                    sum += luma(x as f32, y as f32);
                }
            }
            out.push(sum / (RING_SAMPLES * RING_SAMPLES) as f32);
        }
    }
}

/// Whether the surroundings `now` differ from `then` (both from [`ring`]) as a hand entering
/// them does (enough cells changed beyond the ring's median change); a ring not sampled before
/// counts as changed.
pub(crate) fn ring_changed(then: &[f32], now: &[f32]) -> bool {
    if then.len() != now.len() {
        return true;
    }
    if now.is_empty() {
        return false;
    }
    // Each cell's change beside the ring's median change: the light or the exposure changing
    // over the whole picture moves every cell alike.
    let mut cells = [0.0f32; RING_CELLS * RING_CELLS];
    let d = &mut cells[..now.len().min(RING_CELLS * RING_CELLS)];
    for ((v, a), b) in d.iter_mut().zip(then).zip(now) {
        *v = b - a;
    }
    let mid = d.len() / 2;
    let median = *d.select_nth_unstable_by(mid, f32::total_cmp).1;
    let moved = d.iter().filter(|v| (**v - median).abs() > RING_LEVELS).count();
    moved >= 2 && moved as f32 >= RING_SHARE * now.len() as f32
}

impl HandTracker {
    /// A tracker that looks for new hands every `every` frames (0 counts as 1).
    pub fn new(every: u32) -> Self {
        HandTracker {
            every: u64::from(every.max(1)),
            gate: None,
            reference: Vec::new(),
            quiet_until: 0,
            followed: Vec::new(),
            out: Vec::new(),
        }
    }

    /// A gated tracker (see [`HandTracker`]): the palm detector every [`EVERY`] frames, on a
    /// track's first frame of each [`STRETCH`] and when its surroundings change.
    pub fn gated() -> Self {
        HandTracker {
            gate: Some(None),
            ..HandTracker::new(EVERY)
        }
    }

    /// Forgets the hands followed (a scene cut, the face lost): the next frame looks afresh.
    pub fn reset(&mut self) {
        self.followed.clear();
        self.out.clear();
        self.reference.clear();
        self.quiet_until = 0;
    }

    /// Whether the palm detector runs on frame `index`.
    fn due(&self, index: u64) -> bool {
        self.followed.is_empty() || index.is_multiple_of(self.every)
    }

    /// What a gated tracker runs on frame `index`, the face's surroundings being `ring` (see
    /// [`ring`]); an ungated one searches where [`HandTracker::next`] would. A new stretch
    /// starts the tracker afresh.
    pub fn look(&mut self, index: u64, ring: &[f32]) -> Look {
        let Some(at) = self.gate else {
            return if self.due(index) { Look::Search } else { Look::Follow };
        };
        let stretch = index / STRETCH;
        if at != Some(stretch) {
            self.reset();
            self.gate = Some(Some(stretch));
            return Look::Search;
        }
        let periodic = index.is_multiple_of(self.every);
        if !self.followed.is_empty() {
            return if periodic { Look::Search } else { Look::Follow };
        }
        if periodic || (index >= self.quiet_until && ring_changed(&self.reference, ring)) {
            return Look::Search;
        }
        Look::Nothing
    }

    /// Whether the tracker follows any hand.
    pub fn following(&self) -> bool {
        !self.followed.is_empty()
    }

    /// The face's hands on frame `index` (packed RGB24 of `w x h`), smoothed over time.
    pub fn next(
        &mut self,
        hands: &mut Hands,
        rgb: &[u8],
        (w, h): (usize, usize),
        face_box: [f32; 4],
        index: u64,
    ) -> Result<&[Hand]> {
        let look = if self.due(index) { Look::Search } else { Look::Follow };
        self.next_looked(hands, rgb, (w, h), face_box, (index, look), &[])
    }

    /// The face's hands on frame `index` after `look` (from [`HandTracker::look`]; the frame's
    /// RGB must hold the face's neighbourhood and the followed hands' crops where a model runs),
    /// smoothed over time. Where the models looked and found no hand, `ring` becomes the
    /// surroundings the change trigger compares with.
    pub fn next_looked(
        &mut self,
        hands: &mut Hands,
        rgb: &[u8],
        (w, h): (usize, usize),
        face_box: [f32; 4],
        (index, look): (u64, Look),
        ring: &[f32],
    ) -> Result<&[Hand]> {
        if look == Look::Nothing {
            self.out.clear();
            return Ok(&self.out);
        }
        let Some(area) = neighbourhood(face_box, (w, h)) else {
            self.followed.clear();
            self.out.clear();
            return Ok(&[]);
        };
        let mut rois: Vec<Affine> = self.followed.iter().map(|f| f.raw.roi()).collect();
        let followed = rois.len();
        if look == Look::Search {
            for palm in hands.palms(rgb, (w, h), face_box)? {
                // A palm on a hand already followed is that hand.
                let [x0, y0, x1, y1] = palm.bbox;
                let (cx, cy) = ((x0 + x1) / 2.0, (y0 + y1) / 2.0);
                if self.followed.iter().any(|f| f.raw.signed_distance(cx, cy) <= 0.0) {
                    continue;
                }
                rois.push(palm.roi());
            }
        }
        let found = hands.landmarks(rgb, (w, h), &rois)?;
        let mut next: Vec<Followed> = Vec::with_capacity(found.len());
        for (i, hand) in found.into_iter().enumerate() {
            // Gone, left the face's neighbourhood, or found twice.
            if hand.presence <= PRESENCE || iou(&hand.bbox(), &area) <= 0.0 {
                continue;
            }
            let b = points_box(&hand.points);
            if next.iter().any(|f| iou(&points_box(&f.raw.points), &b) > SAME_HAND_IOU) {
                continue;
            }
            next.push(if i < followed {
                let mut f = self.followed[i].clone();
                f.update(hand);
                f
            } else {
                Followed::start(hand)
            });
        }
        self.followed = next;
        if self.followed.is_empty() {
            self.reference.clear();
            self.reference.extend_from_slice(ring);
            self.quiet_until = index + QUIET;
        }
        self.out.clear();
        self.out.extend(self.followed.iter().map(|f| f.smooth));
        Ok(&self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upright open hand: wrist at (90, 200), fingers up, the middle finger's root 100
    /// pixels above the wrist, the fingers 20 pixels apart.
    fn upright() -> Hand {
        let mut points = [[0.0f32; 2]; POINTS];
        points[0] = [90.0, 200.0];
        // Thumb out to the left.
        for (j, i) in (1..=4).enumerate() {
            points[i] = [70.0 - 15.0 * j as f32, 180.0 - 15.0 * j as f32];
        }
        // Fingers: roots 20 apart at y = 100, 25 pixels a joint.
        for f in 0..4 {
            let x = 70.0 + 20.0 * f as f32;
            for j in 0..4 {
                points[5 + 4 * f + j] = [x, 100.0 - 25.0 * j as f32];
            }
        }
        Hand { points, presence: 1.0 }
    }

    #[test]
    fn a_gated_tracker_searches_at_a_tracks_start_on_fixed_frames_and_on_a_change() {
        let still = vec![100.0; 40];
        let mut t = HandTracker::gated();
        // The track's first frame, then nothing while the surroundings stay.
        assert_eq!(t.look(5, &still), Look::Search);
        t.reference = still.clone();
        t.quiet_until = 5 + QUIET;
        assert_eq!(t.look(6, &still), Look::Nothing);
        // A few cells changed by a hand's edge: searched once the quiet frames are over.
        let mut entered = still.clone();
        entered[..3].fill(200.0);
        assert_eq!(t.look(7, &entered), Look::Nothing, "within the quiet frames");
        assert_eq!(t.look(8, &entered), Look::Search);
        // Noise below the levels, or one cell, is no change.
        let mut noise = still.clone();
        noise.iter_mut().for_each(|v| *v += 10.0);
        noise[0] = 250.0;
        assert!(!ring_changed(&still, &noise));
        // Fixed frame numbers, and every stretch afresh (on which a segment's warm-up relies).
        assert_eq!(t.look(u64::from(EVERY), &still), Look::Search);
        t.reference = still.clone();
        assert_eq!(t.look(STRETCH - 1, &still), Look::Nothing);
        assert_eq!(t.look(STRETCH + 1, &still), Look::Search);
        assert!(t.reference.is_empty(), "a new stretch forgets what came before");
        assert_eq!(STRETCH % u64::from(EVERY), 0);
        assert_eq!(crate::people::GUARD_STRETCH % STRETCH, 0);
    }

    #[test]
    fn the_ring_leaves_the_face_out_and_moves_with_it() {
        // A picture whose luma is x + y: the crop's own frame sees the same ring wherever the
        // face is, offset by its move.
        let mut luma = |x: f32, y: f32| x + y;
        let a = ring(&Affine([0.5, 0.0, 100.0, 0.0, 0.5, 100.0]), 256, &mut luma);
        let b = ring(&Affine([0.5, 0.0, 110.0, 0.0, 0.5, 100.0]), 256, &mut luma);
        assert_eq!(a.len(), RING_CELLS * RING_CELLS - FACE_CELLS.len() * FACE_CELLS.len());
        assert!(a.iter().zip(&b).all(|(p, q)| (q - p - 10.0).abs() < 1e-2));
        assert!(!ring_changed(&a, &b), "a uniform change is no hand");
    }

    #[test]
    fn a_hands_occluder_covers_its_region_in_the_crop() {
        let h = upright();
        let t = Affine([0.5, 0.0, 10.0, 0.0, 0.5, 20.0]);
        let o = h.occluder(&t);
        assert_eq!(o.strokes.len(), BONES.len() + 1);
        assert!((o.strokes[0].2 - 5.5).abs() < 1e-4);
        assert!((o.feather - FEATHER * 0.5).abs() < 1e-4 || o.feather == 1.0);
        assert_eq!(o.polygons[0].len(), PALM.len());
    }

    #[test]
    fn the_region_covers_the_fingers_width_and_the_palm() {
        let h = upright();
        assert!((h.size() - 100.0).abs() < 1e-3);
        assert!((h.radius() - 11.0).abs() < 1e-3);
        // On a finger's line, beside it within the radius, and the palm's middle.
        assert_eq!(h.coverage(70.0, 50.0), 1.0);
        assert_eq!(h.coverage(78.0, 50.0), 1.0);
        assert_eq!(h.coverage(100.0, 150.0), 1.0);
        // A fingertip's cap, and beside the little finger's root, past the palm's edge.
        assert_eq!(h.coverage(130.0, 17.0), 1.0);
        assert_eq!(h.coverage(136.0, 108.0), 1.0);
        // Between two fingers (20 apart, radius 11) is covered; far from the hand is not, and
        // the feather falls over FEATHER pixels.
        assert!(h.coverage(80.0, 40.0) > 0.99);
        assert_eq!(h.coverage(200.0, 100.0), 0.0);
        let edge = h.coverage(130.0 + 11.0 + FEATHER / 2.0, 50.0);
        assert!((edge - 0.5).abs() < 1e-3, "{edge}");
        let b = h.bbox();
        assert!(b[0] <= 15.0 && b[1] <= 15.0 && b[3] >= 210.0, "{b:?}");
    }

    #[test]
    fn a_mapped_hand_covers_the_mapped_pixels() {
        let h = upright();
        // Half size, turned a quarter, moved.
        let t = Affine([0.0, -0.5, 300.0, 0.5, 0.0, 20.0]);
        let m = h.mapped(&t);
        assert!((m.radius() - 5.5).abs() < 1e-3);
        for (x, y) in [(70.0, 50.0), (100.0, 150.0), (200.0, 100.0), (135.0, 40.0)] {
            let (u, v) = t.apply(x, y);
            let (a, b) = (
                h.signed_distance(x as f32, y as f32),
                m.signed_distance(u as f32, v as f32),
            );
            assert!((a / 2.0 - b).abs() < 1e-3, "{a} {b}");
        }
    }

    #[test]
    fn a_followed_hands_crop_holds_it_upright() {
        let h = upright();
        let t = h.roi();
        // Upright already: no turn, the wrist below the middle finger's root in the crop, the
        // whole hand inside it.
        let (w, m) = (t.apply(90.0, 200.0), t.apply(90.0, 100.0));
        assert!((w.0 - m.0).abs() < 1e-6 && w.1 > m.1, "{w:?} {m:?}");
        for p in h.points {
            let (u, v) = t.apply(f64::from(p[0]), f64::from(p[1]));
            assert!((0.0..HAND_SIZE as f64).contains(&u) && (0.0..HAND_SIZE as f64).contains(&v));
        }
        // Turned a quarter (fingers to the right): the crop turns it back upright.
        let q = Affine([0.0, -1.0, 400.0, 1.0, 0.0, 0.0]);
        let turned = h.mapped(&q);
        let t = turned.roi();
        let [w, m] = [turned.points[0], turned.points[9]].map(|p| t.apply(f64::from(p[0]), f64::from(p[1])));
        assert!((w.0 - m.0).abs() < 1e-6 && w.1 > m.1, "{w:?} {m:?}");
        assert!((t.scale() - h.roi().scale()).abs() < 1e-9);
    }

    #[test]
    fn a_palms_crop_is_shifted_towards_the_fingers() {
        // A palm box 100 wide, fingers to the right (the middle root right of the wrist).
        let palm = Palm {
            bbox: [100.0, 100.0, 200.0, 200.0],
            keypoints: [
                [110.0, 150.0],
                [0.0; 2],
                [190.0, 150.0],
                [0.0; 2],
                [0.0; 2],
                [0.0; 2],
                [0.0; 2],
            ],
            score: 0.9,
        };
        let t = palm.roi();
        let inv = t.inverse().unwrap();
        let centre = inv.apply(HAND_SIZE as f64 / 2.0, HAND_SIZE as f64 / 2.0);
        // Half the box's height towards the fingers, 2.6 times its side.
        assert!(
            (centre.0 - 200.0).abs() < 1e-6 && (centre.1 - 150.0).abs() < 1e-6,
            "{centre:?}"
        );
        assert!((1.0 / t.scale() - 260.0 / HAND_SIZE as f64).abs() < 1e-9);
        // The fingers point up in the crop.
        let (w, m) = (t.apply(110.0, 150.0), t.apply(190.0, 150.0));
        assert!((w.0 - m.0).abs() < 1e-6 && w.1 > m.1, "{w:?} {m:?}");
    }

    #[test]
    fn overlapping_palms_merge_by_score() {
        let palm = |x: f32, score: f32| Palm {
            bbox: [x, 0.0, x + 10.0, 10.0],
            keypoints: [[x, 0.0]; 7],
            score,
        };
        let out = weighted_nms(vec![palm(0.0, 0.6), palm(2.0, 0.9), palm(50.0, 0.7)]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].score, 0.9);
        let x = (0.6 * 0.0 + 0.9 * 2.0) / 1.5;
        assert!((out[0].bbox[0] - x).abs() < 1e-5 && (out[0].keypoints[3][0] - x).abs() < 1e-5);
        assert_eq!(out[1], palm(50.0, 0.7));
    }

    #[test]
    fn the_neighbourhood_is_a_square_round_the_face_clipped_to_the_frame() {
        assert_eq!(
            neighbourhood([100.0, 100.0, 140.0, 180.0], (640, 480)),
            Some([20.0, 40.0, 220.0, 240.0])
        );
        assert_eq!(
            neighbourhood([0.0, 0.0, 40.0, 80.0], (640, 480)),
            Some([0.0, 0.0, 120.0, 140.0])
        );
        assert_eq!(neighbourhood([f32::NAN, 0.0, 1.0, 1.0], (640, 480)), None);
        assert_eq!(neighbourhood([900.0, 900.0, 950.0, 950.0], (640, 480)), None);
    }

    #[test]
    fn a_still_hand_is_steadied_and_a_moving_one_followed_without_lag() {
        let h = upright();
        let shifted = |h: &Hand, dx: f32, jitter: f32| {
            let mut m = *h;
            for (i, p) in m.points.iter_mut().enumerate() {
                p[0] += dx + if i % 2 == 0 { jitter } else { -jitter };
            }
            m
        };
        // Still with a pixel of jitter either way: the points barely move.
        let mut f = Followed::start(h);
        for k in 0..30 {
            f.update(shifted(&h, 0.0, if k % 2 == 0 { 1.0 } else { -1.0 }));
        }
        let worst = f
            .smooth
            .points
            .iter()
            .zip(&h.points)
            .map(|(a, b)| dist(*a, *b))
            .fold(0.0, f32::max);
        assert!(worst < 0.6, "a still hand's points move {worst} for a jitter of 1");
        // Then 20 pixels a frame: within two pixels from the first moving frame on.
        for k in 1..=10 {
            f.update(shifted(&h, 20.0 * k as f32, 0.0));
            let lag = f.smooth.points[0][0] - (90.0 + 20.0 * k as f32);
            assert!(lag.abs() < 2.0, "frame {k}: {lag} pixels behind");
        }
    }
}
