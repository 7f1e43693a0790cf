//! The face mesh: in, a frame's detected faces (box and five points) and its RGB; out, per face
//! MediaPipe's 468 points (its face landmark model, converted to ONNX by
//! `models/mesh_export.py`, run on ONNX Runtime in one batch per frame), a presence score that
//! drops detections that are not faces, the five points GPEN's template needs derived from the
//! mesh (eye centres from the eye contours, nose tip, mouth corners) and the face's outline,
//! forehead to chin, for the paste mask.

use anyhow::{bail, Result};
use ort::session::Session;
use ort::value::{TensorRef, ValueType};

use crate::frame::Face;
use crate::geom::Affine;

/// The model's input side in pixels.
pub(crate) const SIZE: usize = 192;
/// Points of the mesh.
pub(crate) const POINTS: usize = 468;
/// The crop around a detection, as a multiple of its box's longer side (MediaPipe enlarges
/// its detection rectangle 1.5 times).
const ROI_SCALE: f64 = 1.5;

/// MediaPipe's face outline, in order round the face (10: top of the forehead, 152: chin).
pub(crate) const OUTLINE: [usize; 36] = [
    10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377, 152, 148, 176, 149, 150,
    136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109,
];
/// The contour of the eye seen on the picture's left (the person's right eye).
const EYE_LEFT: [usize; 16] = [
    7, 33, 133, 144, 145, 153, 154, 155, 157, 158, 159, 160, 161, 163, 173, 246,
];
/// The contour of the eye seen on the right.
const EYE_RIGHT: [usize; 16] = [
    249, 263, 362, 373, 374, 380, 381, 382, 384, 385, 386, 387, 388, 390, 398, 466,
];
const NOSE_TIP: usize = 1;
const MOUTH_LEFT: usize = 61;
const MOUTH_RIGHT: usize = 291;

/// One face's mesh in frame pixels, with its presence probability.
#[derive(Clone, Debug)]
pub(crate) struct Mesh {
    pub points: Vec<[f32; 2]>,
    pub presence: f32,
}

impl Mesh {
    /// Left eye, right eye, nose tip, left and right mouth corners (as seen), as the detector
    /// gives them and the alignment templates expect.
    pub(crate) fn five_points(&self) -> [[f32; 2]; 5] {
        let mean = |idx: &[usize]| {
            let (sx, sy) = idx.iter().fold((0.0f32, 0.0f32), |(sx, sy), &i| {
                (sx + self.points[i][0], sy + self.points[i][1])
            });
            [sx / idx.len() as f32, sy / idx.len() as f32]
        };
        [
            mean(&EYE_LEFT),
            mean(&EYE_RIGHT),
            self.points[NOSE_TIP],
            self.points[MOUTH_LEFT],
            self.points[MOUTH_RIGHT],
        ]
    }

    /// The face's outline polygon, forehead to chin and back.
    pub(crate) fn outline(&self) -> Vec<[f32; 2]> {
        OUTLINE.iter().map(|&i| self.points[i]).collect()
    }

    /// The box round the face's outline (x1, y1, x2, y2): where a face followed by its mesh
    /// is, for the next frame's crop and for the detector's new faces to be told from it.
    pub(crate) fn outline_box(&self) -> [f32; 4] {
        OUTLINE.iter().fold([f32::MAX, f32::MAX, f32::MIN, f32::MIN], |b, &i| {
            let [x, y] = self.points[i];
            [b[0].min(x), b[1].min(y), b[2].max(x), b[3].max(y)]
        })
    }
}

/// The frame -> mesh-crop transform for a detected face: a square of [`ROI_SCALE`] times the
/// box's longer side round the box's centre, turned so the eyes are level.
pub(crate) fn roi(face: &Face) -> Affine {
    let [x0, y0, x1, y1] = face.bbox.map(f64::from);
    let side = ROI_SCALE * (x1 - x0).max(y1 - y0).max(1.0);
    roi_at(((x0 + x1) / 2.0, (y0 + y1) / 2.0), side, eye_angle(face))
}

/// Steps, per octave, of the side of a followed face's crop.
const FOLLOW_SIDE_STEPS: f64 = 24.0;
/// Steps of a followed face's crop centre, as a fraction of the crop's side.
const FOLLOW_CENTRE_STEP: f64 = 1.0 / 64.0;
/// Steps of a followed face's crop angle, in radians (1.4 degrees).
const FOLLOW_ANGLE_STEP: f64 = std::f64::consts::PI / 128.0;

/// The frame -> mesh-crop transform for a face followed from its mesh on the frame before
/// (`face.bbox` round its outline, its eyes from the mesh): [`roi`]'s square, its side, centre
/// and angle snapped to fixed steps. The steps make two runs that began on different frames
/// (a segment's warm-up) give the same crop as soon as their points agree to within a step,
/// and from then on the same points: a face is followed alike however far back a run began.
pub(crate) fn follow_roi(face: &Face) -> Affine {
    let [x0, y0, x1, y1] = face.bbox.map(f64::from);
    let side = ROI_SCALE * (x1 - x0).max(y1 - y0).max(1.0);
    let side = (side.log2() * FOLLOW_SIDE_STEPS).round() / FOLLOW_SIDE_STEPS;
    let side = side.exp2();
    let step = side * FOLLOW_CENTRE_STEP;
    let snap = |v: f64| (v / step).round() * step;
    let angle = (eye_angle(face) / FOLLOW_ANGLE_STEP).round() * FOLLOW_ANGLE_STEP;
    roi_at((snap((x0 + x1) / 2.0), snap((y0 + y1) / 2.0)), side, angle)
}

/// The angle of the line from the left eye to the right one.
fn eye_angle(face: &Face) -> f64 {
    let [le, re] = [face.landmarks[0], face.landmarks[1]].map(|p| p.map(f64::from));
    (re[1] - le[1]).atan2(re[0] - le[0])
}

/// The frame -> mesh-crop transform of a square of `side` frame pixels round `(cx, cy)`,
/// turned by `angle`.
fn roi_at((cx, cy): (f64, f64), side: f64, angle: f64) -> Affine {
    // Crop (u, v) -> frame: centre + R(angle) * ((u, v) - half) * side / SIZE.
    let k = side / SIZE as f64;
    let (s, c) = angle.sin_cos();
    let half = SIZE as f64 / 2.0;
    let to_frame = Affine([
        c * k,
        -s * k,
        cx - (c * half - s * half) * k,
        s * k,
        c * k,
        cy - (s * half + c * half) * k,
    ]);
    to_frame.inverse().unwrap_or(Affine::IDENTITY)
}

/// A face-mesh session and its input buffer.
pub(crate) struct Mesher {
    session: Session,
    input_name: String,
    input: Vec<f32>,
    /// The meshes of the latest call (their buffers reused).
    meshes: Vec<Mesh>,
    /// CPU time spent inside the session's runs so far (this thread's clock around each).
    model_cpu: std::time::Duration,
    /// Runs are padded to a power-of-two batch (on a GPU, where each new input shape costs the
    /// provider a search of its own).
    pad: bool,
}

impl Mesher {
    /// Checks the session is the face mesh (one [N,3,192,192] input; 1,404 points and a
    /// presence logit out).
    pub(crate) fn new(session: Session) -> Result<Self> {
        let inputs = session.inputs();
        if inputs.len() != 1 || session.outputs().len() != 2 {
            bail!(
                "expected one input and two outputs (a face mesh), found {} and {}",
                inputs.len(),
                session.outputs().len()
            );
        }
        let ValueType::Tensor { shape, .. } = inputs[0].dtype() else {
            bail!("the face mesh's input is not a tensor");
        };
        let dims: Vec<i64> = shape.iter().copied().collect();
        if dims.len() != 4 || dims[1] != 3 || dims[2] != SIZE as i64 || dims[3] != SIZE as i64 {
            bail!("the face mesh's input is {dims:?}, not [N,3,{SIZE},{SIZE}]");
        }
        let input_name = inputs[0].name().to_string();
        Ok(Self {
            session,
            input_name,
            input: Vec::new(),
            meshes: Vec::new(),
            model_cpu: std::time::Duration::ZERO,
            pad: false,
        })
    }

    /// Pads every run to a batch of a power of two (the extra crops' meshes are not read), so
    /// a GPU sees a few input shapes whatever the number of faces.
    pub(crate) fn with_padding(mut self, pad: bool) -> Self {
        self.pad = pad;
        self
    }

    /// CPU time spent inside the session's runs so far.
    pub(crate) fn model_cpu(&self) -> std::time::Duration {
        self.model_cpu
    }

    /// The input buffer for `n` crops (NCHW, RGB in [0,1]), to be filled by the caller.
    pub(crate) fn input(&mut self, n: usize) -> &mut [f32] {
        self.input.resize(n * 3 * SIZE * SIZE, 0.0);
        &mut self.input
    }

    /// The meshes of the latest [`Mesher::run`] of `n` crops.
    pub(crate) fn last(&self, n: usize) -> &[Mesh] {
        &self.meshes[..n]
    }

    /// Runs the model on the `n` crops in the input buffer; `to_crop[i]` is crop i's
    /// frame -> crop transform. Each mesh comes back in frame pixels.
    pub(crate) fn run(&mut self, to_crop: &[Affine]) -> Result<&[Mesh]> {
        let n = to_crop.len();
        if n == 0 {
            return Ok(&[]);
        }
        let fed = if self.pad { n.next_power_of_two() } else { n };
        self.input.resize(fed * 3 * SIZE * SIZE, 0.0);
        let tensor = TensorRef::from_array_view(([fed, 3, SIZE, SIZE], &self.input[..fed * 3 * SIZE * SIZE]))?;
        let start = crate::stats::thread_cpu_time();
        let outputs = self.session.run(ort::inputs![self.input_name.as_str() => tensor])?;
        self.model_cpu += crate::stats::thread_cpu_time().saturating_sub(start);
        let (_, points) = outputs[0].try_extract_tensor::<f32>()?;
        let (_, presence) = outputs[1].try_extract_tensor::<f32>()?;
        if points.len() != fed * POINTS * 3 || presence.len() != fed {
            bail!(
                "the face mesh gave {} values for {n} faces: is this the face-mesh model?",
                points.len()
            );
        }
        while self.meshes.len() < n {
            self.meshes.push(Mesh {
                points: Vec::with_capacity(POINTS),
                presence: 0.0,
            });
        }
        for (i, (t, mesh)) in to_crop.iter().zip(&mut self.meshes).enumerate() {
            let inv = t.inverse().unwrap_or(Affine::IDENTITY);
            mesh.points.clear();
            mesh.points
                .extend(points[i * POINTS * 3..][..POINTS * 3].chunks_exact(3).map(|p| {
                    let (x, y) = inv.apply(p[0] as f64, p[1] as f64);
                    [x as f32, y as f32]
                }));
            mesh.presence = 1.0 / (1.0 + (-presence[i]).exp());
        }
        Ok(&self.meshes[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roi_is_square_round_the_box_and_turned_with_the_eyes() {
        let face = Face {
            bbox: [100.0, 100.0, 200.0, 220.0],
            landmarks: [[120.0, 140.0], [180.0, 200.0], [0.0; 2], [0.0; 2], [0.0; 2]],
            ..Default::default()
        };
        let t = roi(&face);
        // The box's centre is the crop's centre.
        let (u, v) = t.apply(150.0, 160.0);
        assert!((u - 96.0).abs() < 1e-9 && (v - 96.0).abs() < 1e-9);
        // 1.5 times the longer side (120) spans the crop.
        assert!((t.scale() - 192.0 / 180.0).abs() < 1e-9);
        // The eyes (45 degrees apart) come out level.
        let (a, b) = (t.apply(120.0, 140.0), t.apply(180.0, 200.0));
        assert!((a.1 - b.1).abs() < 1e-9 && b.0 > a.0);
    }

    #[test]
    fn a_followed_faces_crop_is_the_detections_snapped_to_fixed_steps() {
        let face = |dx: f32| Face {
            bbox: [100.3 + dx, 100.0, 200.3 + dx, 221.0],
            landmarks: [[120.0, 140.0], [180.0, 143.0], [0.0; 2], [0.0; 2], [0.0; 2]],
            ..Default::default()
        };
        let (exact, snapped) = (roi(&face(0.0)), follow_roi(&face(0.0)));
        // Within half a step of the unsnapped crop: scale, angle and centre.
        let ratio = snapped.scale() / exact.scale();
        assert!(
            (ratio.log2()).abs() <= 0.5 / FOLLOW_SIDE_STEPS + 1e-9,
            "scale ratio {ratio}"
        );
        let side = ROI_SCALE * 121.0;
        let centre = |t: &Affine| t.inverse().unwrap().apply(96.0, 96.0);
        let (a, b) = (centre(&exact), centre(&snapped));
        let step = side * FOLLOW_CENTRE_STEP * 1.02;
        assert!(
            (a.0 - b.0).abs() <= step / 2.0 && (a.1 - b.1).abs() <= step / 2.0,
            "{a:?} {b:?}"
        );
        // Points that differ by less than a step mostly land on the very same crop, and the
        // unsnapped ones never do.
        let same = (1..=20)
            .filter(|&k| follow_roi(&face(k as f32 * 0.01)) == snapped)
            .count();
        assert!(same >= 10, "{same} of 20 nearby faces on the same crop");
        assert!((1..=20).all(|k| roi(&face(k as f32 * 0.01)) != exact));
    }

    /// A GPU's runs are padded to a power-of-two batch: the faces' meshes are those of the
    /// unpadded run (on the CPU here, where the padding can be checked).
    #[test]
    fn a_padded_batch_gives_the_meshes_of_the_unpadded_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/face-mesh.onnx");
        let session = |pad| {
            let s = crate::runtime::cpu_session(&path, 1, "face mesh").expect("the set-up makes the face mesh");
            Mesher::new(s).unwrap().with_padding(pad)
        };
        let (mut plain, mut padded) = (session(false), session(true));
        let rois: Vec<Affine> = (0..3)
            .map(|i| Affine([1.0, 0.0, -(i as f64) * 7.0, 0.0, 1.0, 3.0 * i as f64]))
            .collect();
        for m in [&mut plain, &mut padded] {
            for (i, x) in m.input(3).iter_mut().enumerate() {
                *x = ((i * 7919) % 255) as f32 / 255.0;
            }
        }
        let meshes = |m: &mut Mesher| -> Vec<_> {
            m.run(&rois)
                .unwrap()
                .iter()
                .map(|m| (m.points.clone(), m.presence))
                .collect()
        };
        let (a, b) = (meshes(&mut plain), meshes(&mut padded));
        assert_eq!(padded.input.len(), 4 * 3 * SIZE * SIZE, "fed as a batch of four");
        assert_eq!(a.len(), 3);
        for ((pa, sa), (pb, sb)) in a.iter().zip(&b) {
            assert!((sa - sb).abs() < 1e-5, "{sa} {sb}");
            let worst = pa
                .iter()
                .zip(pb)
                .map(|(p, q)| (p[0] - q[0]).abs().max((p[1] - q[1]).abs()))
                .fold(0.0, f32::max);
            assert!(worst < 1e-3, "points {worst} apart");
        }
    }

    #[test]
    fn the_outline_box_holds_the_outline() {
        let mut points = vec![[50.0f32, 60.0]; POINTS];
        points[OUTLINE[0]] = [40.0, 10.0];
        points[OUTLINE[18]] = [55.0, 90.0];
        points[OUTLINE[9]] = [80.0, 50.0];
        points[OUTLINE[27]] = [20.0, 50.0];
        // A point off the outline is not in it.
        points[NOSE_TIP] = [500.0, 500.0];
        assert_eq!(Mesh { points, presence: 1.0 }.outline_box(), [20.0, 10.0, 80.0, 90.0]);
    }

    #[test]
    fn five_points_come_from_the_eye_contours_nose_and_mouth_corners() {
        let mut points = vec![[0.0f32; 2]; POINTS];
        for &i in &EYE_LEFT {
            points[i] = [10.0 + (i % 3) as f32, 20.0];
        }
        for &i in &EYE_RIGHT {
            points[i] = [50.0, 20.0];
        }
        points[NOSE_TIP] = [30.0, 40.0];
        points[MOUTH_LEFT] = [15.0, 60.0];
        points[MOUTH_RIGHT] = [45.0, 60.0];
        let m = Mesh { points, presence: 1.0 };
        let five = m.five_points();
        assert_eq!(five[1], [50.0, 20.0]);
        assert_eq!(five[2..], [[30.0, 40.0], [15.0, 60.0], [45.0, 60.0]]);
        assert!(five[0][0] > 10.0 && five[0][0] < 12.0);
        assert_eq!(m.outline().len(), 36);
    }
}
