//! Whose face: in, a face's five points over a packed RGB picture (or a model crop); out, its
//! identity descriptor (dlib's 128-D face-recognition ResNet, converted to ONNX by
//! `models/identity_export.py`, `models/face-id.onnx`) from a 150-pixel chip aligned as dlib
//! aligns it, and the distance between two descriptors: two faces of one person lie closer than
//! [`crate::defaults::FACE_DISTANCE`] (dlib's 0.6), two people farther.
//! Also the flags that use it, checked: which people a job restores ([`Selection`]) and what
//! the identity guard does ([`Guard`]); `crate::people` holds what they do.

use anyhow::{bail, Result};
use ort::session::Session;
use ort::value::{TensorRef, ValueType};

use crate::geom::{crop_footprint, fit_similarity, Affine};
use crate::kernels::warp::{warp_face, WarpScratch};

/// Which faces a job restores: the people named by photo, and the smallest face worth it. The
/// flags of the command line, `batch`, segments and (by the service's own names) jobs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, clap::Args)]
pub(crate) struct Selection {
    /// Restore only the faces of the people in these photos (repeatable). Each photo's largest
    /// face names one person; a face is theirs when its identity descriptor lies within
    /// --face-distance of the photo's. Decided per track on its best (large, frontal) views,
    /// kept through profiles and blur.
    #[arg(long = "only-face", value_name = "PHOTO", help_heading = "Faces")]
    pub only_face: Vec<std::path::PathBuf>,
    /// Never restore the faces of the people in these photos (repeatable; as --only-face).
    #[arg(long = "skip-face", value_name = "PHOTO", help_heading = "Faces")]
    pub skip_face: Vec<std::path::PathBuf>,
    /// Identity distance under which two faces are one person (dlib's descriptors: 0.6 is its
    /// usual threshold; lower is stricter).
    #[arg(long, value_name = "D", default_value_t = crate::defaults::FACE_DISTANCE, help_heading = "Faces")]
    pub face_distance: f32,
    /// Leave alone faces under PX pixels tall in the upright picture (0: every face is
    /// restored; a tiny face comes out of the model as a mask).
    #[arg(long, value_name = "PX", default_value_t = 0, help_heading = "Faces")]
    pub min_face: u32,
}

impl Selection {
    /// Whether the selection leaves any face out (a stage of its own runs then).
    pub(crate) fn active(&self) -> bool {
        !self.only_face.is_empty() || !self.skip_face.is_empty() || self.min_face > 0
    }

    /// Whether people are named by photo (the identity model is needed).
    pub(crate) fn names_people(&self) -> bool {
        !self.only_face.is_empty() || !self.skip_face.is_empty()
    }

    pub(crate) fn check(&self) -> Result<()> {
        if !(self.face_distance > 0.0 && self.face_distance <= 2.0) {
            bail!(
                "--face-distance must be above 0 and at most 2, got {}",
                self.face_distance
            );
        }
        Ok(())
    }
}

/// The identity guard (`--identity-guard`): what a track whose restored faces would no longer be
/// the same person gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guard {
    /// Nothing measured.
    Off,
    /// Measured and said, nothing changed.
    Warn,
    /// Less of the model's change, step by step, until the same person again.
    #[default]
    BackOff,
}

/// The chip's side in pixels.
pub(crate) const SIZE: usize = 150;
/// Values of a descriptor.
pub(crate) const DIMS: usize = 128;

/// Where dlib's chip puts a face's five points (left eye centre, right eye centre, nose tip,
/// left and right mouth corners, as seen): dlib's 68-point mean face mapped into a 150-pixel
/// chip with padding 0.25 (`get_face_chip_details`), each eye the mean of its six points.
pub(crate) const CHIP_TEMPLATE: [[f32; 2]; 5] = [
    [47.232_19, 46.288_37],
    [99.806_29, 46.288_37],
    [73.519_28, 76.052_08],
    [50.078_8, 102.336_48],
    [96.959_66, 102.336_48],
];

/// A face's identity descriptor.
pub(crate) type Descriptor = [f32; DIMS];

/// The Euclidean distance of two descriptors (dlib's measure: the same person below 0.6).
pub fn distance(a: &Descriptor, b: &Descriptor) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt()
}

/// The picture -> chip transform of a face with these five points.
pub(crate) fn to_chip(landmarks: &[[f32; 2]; 5]) -> Affine {
    fit_similarity(landmarks, &CHIP_TEMPLATE)
}

/// Warps a face of a packed RGB24 picture of `width x height` into its chip (planar RGB24,
/// `3 * SIZE * SIZE` bytes), area-filtered where the face is larger than the chip.
pub(crate) fn chip(
    rgb: &[u8],
    (width, height): (usize, usize),
    landmarks: &[[f32; 2]; 5],
    scratch: &mut WarpScratch,
) -> Vec<u8> {
    let t = to_chip(landmarks);
    let region = crop_footprint(&t, SIZE, width, height);
    let mut out = vec![0u8; 3 * SIZE * SIZE];
    warp_face(rgb, (width, height), &t, region, SIZE, &mut out[..], scratch);
    out
}

/// An identity session and its input buffer.
pub struct Identifier {
    session: Session,
    input_name: String,
    input: Vec<f32>,
    /// CPU time spent inside the session's runs so far.
    model_cpu: std::time::Duration,
}

impl Identifier {
    /// Opens the face-identity model at `model` with `opts` and checks it (see
    /// [`Identifier::new`]); an error names the file.
    pub(crate) fn open(model: &std::path::Path, opts: &crate::runtime::SessionOptions) -> Result<Self> {
        use anyhow::Context;
        let session = crate::runtime::session(model, opts, "face-identity model")?;
        Identifier::new(session).with_context(|| format!("face-identity model {}", model.display()))
    }

    /// Checks the session is an identity model (one [N,3,150,150] input, one [N,128] output).
    pub fn new(session: Session) -> Result<Self> {
        let (inputs, outputs) = (session.inputs(), session.outputs());
        if inputs.len() != 1 || outputs.len() != 1 {
            bail!(
                "expected one input and one output (a face-identity model), found {} and {}",
                inputs.len(),
                outputs.len()
            );
        }
        let ValueType::Tensor { shape, .. } = inputs[0].dtype() else {
            bail!("the identity model's input is not a tensor");
        };
        let dims: Vec<i64> = shape.iter().copied().collect();
        if dims.len() != 4 || dims[1] != 3 || dims[2] != SIZE as i64 || dims[3] != SIZE as i64 {
            bail!("the identity model's input is {dims:?}, not [N,3,{SIZE},{SIZE}]");
        }
        let input_name = inputs[0].name().to_string();
        Ok(Self {
            session,
            input_name,
            input: Vec::new(),
            model_cpu: std::time::Duration::ZERO,
        })
    }

    /// CPU time spent inside the session's runs so far.
    pub fn model_cpu(&self) -> std::time::Duration {
        self.model_cpu
    }

    /// The descriptors of `chips` (each planar RGB24 of [`SIZE`] square), in one run.
    pub fn describe(&mut self, chips: &[&[u8]]) -> Result<Vec<Descriptor>> {
        let n = chips.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let plane = 3 * SIZE * SIZE;
        self.input.clear();
        for c in chips {
            // The model takes levels (0..=255) and subtracts dlib's means itself.
            self.input.extend(c[..plane].iter().map(|&b| f32::from(b)));
        }
        let tensor = TensorRef::from_array_view(([n, 3, SIZE, SIZE], &self.input[..]))?;
        let start = crate::stats::thread_cpu_time();
        let outputs = self.session.run(ort::inputs![self.input_name.as_str() => tensor])?;
        self.model_cpu += crate::stats::thread_cpu_time().saturating_sub(start);
        let (_, values) = outputs[0].try_extract_tensor::<f32>()?;
        if values.len() != n * DIMS {
            bail!(
                "the identity model gave {} values for {n} faces: is this the face-id model?",
                values.len()
            );
        }
        Ok(values
            .chunks_exact(DIMS)
            .map(|v| v.try_into().expect("128 values"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_of_descriptors() {
        let mut a = [0.0f32; DIMS];
        let mut b = [0.0f32; DIMS];
        (a[0], b[1]) = (0.3, 0.4);
        assert!((distance(&a, &b) - 0.5).abs() < 1e-6);
        assert_eq!(distance(&a, &a), 0.0);
    }

    #[test]
    fn a_face_at_the_template_maps_onto_the_chip_unchanged() {
        let t = to_chip(&CHIP_TEMPLATE);
        for [x, y] in CHIP_TEMPLATE {
            let (u, v) = t.apply(f64::from(x), f64::from(y));
            assert!((u - f64::from(x)).abs() < 1e-3 && (v - f64::from(y)).abs() < 1e-3);
        }
    }
}
