//! The people a user names: in, reference photos (`--only-face`, `--skip-face`), the detector and
//! the identity model; out, each photo's identity descriptor (its largest face), or an error
//! naming the photo and what to do, before any frame of a job is decoded.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use crate::faces::detect::{det_size, Detector};
use crate::faces::identity::{chip, distance, Descriptor, Identifier};
use crate::frame::{Face, Pool};
use crate::geom::Rect;
use crate::kernels::warp::WarpScratch;

/// A reference photo's descriptor, and how many faces it held (the largest is the one taken).
pub struct Reference {
    pub descriptor: Descriptor,
    pub faces: usize,
}

/// Decodes the picture `path` and finds its faces: its packed RGB24, width and height, and the
/// faces, largest first.
pub fn faces_in_photo(path: &Path, detector: &mut Detector) -> Result<(Vec<u8>, usize, usize, Vec<Face>)> {
    let info = crate::media::decode::probe(path)
        .with_context(|| format!("reference photo {}: not a picture FFmpeg reads", path.display()))?;
    let (w, h) = (info.width, info.height);
    let size = det_size(w, h, crate::defaults::DET_SIZE);
    let decoder = crate::media::decode::Decoder::new(info, size, false);
    let (rgb_pool, det_pool) = (Pool::new(1), Pool::new(1));
    let mut picture = None;
    decoder
        .run((&rgb_pool, &det_pool), Some(1), |mut f| {
            let whole = Rect::new(0, 0, f.width, f.height);
            crate::media::color::ensure_rgb(&mut f, whole);
            picture = Some((f.rgb, f.det, f.det_size));
            false
        })
        .with_context(|| format!("reference photo {}", path.display()))?;
    let (rgb, det, det_dims) =
        picture.ok_or_else(|| anyhow!("reference photo {}: no picture in it", path.display()))?;
    detector.start(det_dims);
    let mut faces = detector.detect(&det, w, h, 0)?;
    detector.reset();
    let area = |f: &Face| (f.bbox[2] - f.bbox[0]) * (f.bbox[3] - f.bbox[1]);
    faces.sort_by(|a, b| area(b).total_cmp(&area(a)));
    Ok((rgb, w, h, faces))
}

/// The descriptor of the person in the reference photo `path`: its largest face's. A photo
/// without a face is an error naming it.
pub fn reference(path: &Path, detector: &mut Detector, identifier: &mut Identifier) -> Result<Reference> {
    let (rgb, w, h, faces) = faces_in_photo(path, detector)?;
    let Some(face) = faces.first() else {
        bail!(
            "reference photo {}: no face found in it; give a photo where the person's face is clear and at least 40 pixels tall",
            path.display()
        );
    };
    let mut scratch = WarpScratch::default();
    let c = chip(&rgb, (w, h), &face.landmarks, &mut scratch);
    let descriptor = identifier.describe(&[&c])?[0];
    Ok(Reference {
        descriptor,
        faces: faces.len(),
    })
}

/// Which faces a job restores: the people named by photo, and the smallest face worth it. The
/// flags of the command line, `batch`, segments and (by the service's own names) jobs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, clap::Args)]
pub struct Selection {
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
    pub fn active(&self) -> bool {
        !self.only_face.is_empty() || !self.skip_face.is_empty() || self.min_face > 0
    }

    /// Whether people are named by photo (the identity model is needed).
    pub fn names_people(&self) -> bool {
        !self.only_face.is_empty() || !self.skip_face.is_empty()
    }

    pub fn check(&self) -> Result<()> {
        if !(self.face_distance > 0.0 && self.face_distance <= 2.0) {
            bail!(
                "--face-distance must be above 0 and at most 2, got {}",
                self.face_distance
            );
        }
        Ok(())
    }
}

/// Views of a track described at most (its first, then each clearly better one).
const TRACK_VIEWS: u32 = 3;
/// How much better (height x frontality) a view must be than the best described one to be
/// described too.
const BETTER_VIEW: f32 = 1.25;

/// What a track has shown so far: its best view's worth, the views described, the closest it
/// came to the people named (to keep, to skip).
struct TrackChoice {
    best: f32,
    views: u32,
    only: f32,
    skip: f32,
}

impl TrackChoice {
    /// A track not described yet.
    const NONE: TrackChoice = TrackChoice {
        best: 0.0,
        views: 0,
        only: f32::MAX,
        skip: f32::MAX,
    };
}

/// The choice of faces along a job: each face too small left alone, each track matched against
/// the people named on a few of its best views and its decision kept along it (a new track, after
/// a cut or a re-entry, is matched afresh); faces without a track (pictures) each on their own.
pub struct Chooser {
    selection: Selection,
    only: Vec<Descriptor>,
    skip: Vec<Descriptor>,
    identifier: Option<Identifier>,
    tracks: std::collections::HashMap<u64, TrackChoice>,
    rotation: u32,
    scratch: WarpScratch,
    /// Faces described, and faces left alone.
    pub described: u64,
    pub left: u64,
}

impl Chooser {
    /// The chooser of `selection`: each reference photo described (by `detector`, left reset,
    /// and the identity model at `model`), or an error naming the photo. `rotation` is the
    /// video's display rotation (faces are measured upright).
    pub fn new(
        selection: &Selection,
        detector: &mut Detector,
        model: Option<(&Path, &crate::runtime::SessionOptions)>,
        rotation: u32,
    ) -> Result<Self> {
        let mut identifier = None;
        let (mut only, mut skip) = (Vec::new(), Vec::new());
        if selection.names_people() {
            let (model, opts) = model.ok_or_else(|| {
                anyhow!("--only-face and --skip-face need the face-identity model models/face-id.onnx: run scripts/setup.sh")
            })?;
            let session = crate::runtime::session(model, opts, "face-identity model")?;
            let mut id =
                Identifier::new(session).with_context(|| format!("face-identity model {}", model.display()))?;
            for (paths, out) in [(&selection.only_face, &mut only), (&selection.skip_face, &mut skip)] {
                for p in paths {
                    let r = reference(p, detector, &mut id)?;
                    if r.faces > 1 {
                        tracing::warn!(
                            "reference photo {}: {} faces in it, the largest taken",
                            p.display(),
                            r.faces
                        );
                    }
                    out.push(r.descriptor);
                }
            }
            identifier = Some(id);
        }
        Ok(Chooser {
            selection: selection.clone(),
            only,
            skip,
            identifier,
            tracks: Default::default(),
            rotation,
            scratch: WarpScratch::default(),
            described: 0,
            left: 0,
        })
    }

    /// Moves the faces of `ff` the selection leaves out into `ff.left`, each with its reason.
    pub(crate) fn choose(&mut self, ff: &mut crate::frame::FaceFrame) -> Result<()> {
        let faces = std::mem::take(&mut ff.faces);
        for mut job in faces {
            let why = self.leaves(&mut ff.frame, &job)?;
            if let Some(why) = why {
                job.left = Some(why);
                self.left += 1;
                ff.left.push(job);
            } else {
                ff.faces.push(job);
            }
        }
        Ok(())
    }

    /// Why `job` is left alone, if it is.
    fn leaves(&mut self, frame: &mut crate::frame::Frame, job: &crate::frame::FaceJob) -> Result<Option<&'static str>> {
        let [x0, y0, x1, y1] = job.face.bbox;
        let turned = self.rotation == 90 || self.rotation == 270;
        let upright = if turned { x1 - x0 } else { y1 - y0 };
        if upright < self.selection.min_face as f32 {
            return Ok(Some("small"));
        }
        let Some(id) = self.identifier.as_mut() else {
            return Ok(None);
        };
        let l = &job.face.landmarks;
        let eyes = ((l[1][0] - l[0][0]).powi(2) + (l[1][1] - l[0][1]).powi(2))
            .sqrt()
            .max(1.0);
        let mid = (l[0][0] + l[1][0]) / 2.0;
        let frontal = (1.0 - 2.0 * (l[2][0] - mid).abs() / eyes).clamp(0.05, 1.0);
        let worth = upright * frontal;
        let due = match job.track.and_then(|t| self.tracks.get(&t)) {
            None => true,
            Some(t) => t.views < TRACK_VIEWS && worth > BETTER_VIEW * t.best,
        };
        if due {
            let t = to_chip_region(&job.face.landmarks, frame.width, frame.height);
            if let Some(r) = t {
                crate::media::color::ensure_rgb(frame, r);
            }
            let c = chip(&frame.rgb, (frame.width, frame.height), l, &mut self.scratch);
            let d = id.describe(&[&c])?[0];
            self.described += 1;
            let closest = |refs: &[Descriptor]| refs.iter().map(|r| distance(r, &d)).fold(f32::MAX, f32::min);
            let (only, skip) = (closest(&self.only), closest(&self.skip));
            let key = job.track.unwrap_or(u64::MAX);
            let e = self.tracks.entry(key).or_insert(TrackChoice::NONE);
            // A face without a track is decided on its own view alone.
            if job.track.is_none() {
                *e = TrackChoice::NONE;
            }
            e.best = e.best.max(worth);
            e.views += 1;
            e.only = e.only.min(only);
            e.skip = e.skip.min(skip);
        }
        let t = &self.tracks[&job.track.unwrap_or(u64::MAX)];
        let near = self.selection.face_distance;
        Ok(if t.skip < near {
            Some("skipped")
        } else if !self.only.is_empty() && t.only >= near {
            Some("not named")
        } else {
            None
        })
    }
}

/// The picture region a face's chip reads (clipped), if any.
fn to_chip_region(landmarks: &[[f32; 2]; 5], width: usize, height: usize) -> Option<Rect> {
    crate::geom::crop_footprint(
        &crate::faces::identity::to_chip(landmarks),
        crate::faces::identity::SIZE,
        width,
        height,
    )
}

/// Faces of a track between two measures of its identity when the faces are not each recorded
/// (`--faces-json` measures every face): its first face, then one in this many.
pub const IDENTITY_EVERY: u64 = 50;

/// How much a restoration keeps of who a face is: the cosine similarity of the identity
/// descriptors of a face as the model was given it and as it is pasted (1 for an unchanged
/// face), measured in the model's crop (the same chip geometry both times) on the faces of each
/// track at `every`, and gathered per track for the summary.
pub struct IdentityMeter {
    identifier: Identifier,
    every: u64,
    /// Per track (`None`: faces without one): faces seen and figures measured.
    tracks: std::collections::BTreeMap<Option<u64>, (u64, Vec<f32>)>,
    scratch: WarpScratch,
    packed: [Vec<u8>; 2],
}

impl IdentityMeter {
    /// A meter with the identity model at `model`, measuring every face (`each`) or a track's
    /// first and one in [`IDENTITY_EVERY`].
    pub fn new(model: &Path, opts: &crate::runtime::SessionOptions, each: bool) -> Result<Self> {
        let session = crate::runtime::session(model, opts, "face-identity model")?;
        let identifier =
            Identifier::new(session).with_context(|| format!("face-identity model {}", model.display()))?;
        Ok(IdentityMeter {
            identifier,
            every: if each { 1 } else { IDENTITY_EVERY },
            tracks: Default::default(),
            scratch: WarpScratch::default(),
            packed: Default::default(),
        })
    }

    /// Whether `job`'s identity is to be measured (counting it among its track's faces): a
    /// restored face of a frame that is written, its track's first or one in `every`.
    pub(crate) fn due(&mut self, job: &crate::frame::FaceJob, warm: bool) -> bool {
        if warm || job.restored.is_none() {
            return false;
        }
        let (seen, _) = self.tracks.entry(job.track).or_default();
        *seen += 1;
        job.track.is_none() || (*seen - 1) % self.every == 0
    }

    /// Measures `job` from `crop` (planar RGB24 of `size`: the crop the model was given) and its
    /// restored change, writing the figure into
    /// [`crate::frame::FaceJob::identity`].
    pub(crate) fn measure(&mut self, job: &mut crate::frame::FaceJob, crop: &[u8], size: usize) -> Result<()> {
        let plane = size * size;
        let Some(change) = job.restored.as_deref().filter(|c| c.len() >= 3 * plane) else {
            return Ok(());
        };
        // The crop as given (planar) and as restored, both packed.
        let [given, restored] = &mut self.packed;
        given.resize(3 * plane, 0);
        restored.resize(3 * plane, 0);
        for i in 0..plane {
            for c in 0..3 {
                let g = crop[c * plane + i];
                given[3 * i + c] = g;
                let d = crate::kernels::change_levels(change[3 * i + c]);
                restored[3 * i + c] = (f32::from(g) + d).round().clamp(0.0, 255.0) as u8;
            }
        }
        let points = job.face.landmarks.map(|[x, y]| {
            let (u, v) = job.to_crop.apply(f64::from(x), f64::from(y));
            [u as f32, v as f32]
        });
        let a = chip(given, (size, size), &points, &mut self.scratch);
        let b = chip(restored, (size, size), &points, &mut self.scratch);
        let d = self.identifier.describe(&[&a, &b])?;
        let figure = crate::faces::identity::cosine(&d[0], &d[1]);
        job.identity = Some(figure);
        self.tracks.entry(job.track).or_default().1.push(figure);
        Ok(())
    }

    /// Each track's identity figures: its median, the faces measured.
    pub fn tracks(&self) -> Vec<crate::stats::TrackIdentity> {
        self.tracks
            .iter()
            .filter(|(_, (_, f))| !f.is_empty())
            .map(|(&track, (_, f))| {
                let mut s = f.clone();
                s.sort_by(f32::total_cmp);
                crate::stats::TrackIdentity {
                    track,
                    median: s[s.len() / 2],
                    measured: s.len() as u64,
                }
            })
            .collect()
    }
}
