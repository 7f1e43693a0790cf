//! The people a user names: in, reference photos (`--only-face`, `--skip-face`), the detector and
//! the identity model; out, each photo's identity descriptor (its largest face), or an error
//! naming the photo and what to do, before any frame of a job is decoded. An engine keeps the
//! descriptors ([`References`]), so a photo is described once however many of its runs (a
//! folder's clips, a long video's segments, a service's jobs) name it.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use crate::faces::detect::{det_size, Detector};
use crate::faces::identity::{chip, distance, Descriptor, Guard, Identifier, Selection};
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

/// The descriptor of the person in the reference photo `path`: its largest face's, its chip
/// warped at the CPU level `cpu`. A photo without a face is an error naming it.
pub fn reference(
    path: &Path,
    detector: &mut Detector,
    identifier: &mut Identifier,
    cpu: crate::kernels::Cpu,
) -> Result<Reference> {
    let (rgb, w, h, faces) = faces_in_photo(path, detector)?;
    let Some(face) = faces.first() else {
        bail!(
            "reference photo {}: no face found in it; give a photo where the person's face is clear and at least 40 pixels tall",
            path.display()
        );
    };
    let mut scratch = WarpScratch::at(cpu);
    let c = chip(&rgb, (w, h), &face.landmarks, &mut scratch);
    let descriptor = identifier.describe(&[&c])?[0];
    Ok(Reference {
        descriptor,
        faces: faces.len(),
    })
}

/// What names one described photo: the identity model and the photo, each by path, and the
/// photo's size and modification time (a photo replaced under its name is described afresh).
type PhotoKey = (
    std::path::PathBuf,
    std::path::PathBuf,
    Option<(u64, std::time::SystemTime)>,
);

/// The reference photos an engine has described, kept for its later runs: a folder's clips, a
/// long video's segments and a service's jobs describe each photo once, not once a run.
#[derive(Default)]
pub struct References {
    described: std::collections::HashMap<PhotoKey, Descriptor>,
    /// Photos described so far (each once).
    pub count: u64,
}

impl References {
    /// The descriptor of the photo at `path` by the identity model at `model`: the one kept, or
    /// the photo described now ([`reference`], which names a photo without a face) and kept.
    pub fn get(
        &mut self,
        (model, path): (&Path, &Path),
        detector: &mut Detector,
        identifier: &mut Identifier,
        cpu: crate::kernels::Cpu,
    ) -> Result<Descriptor> {
        let stamp = std::fs::metadata(path)
            .ok()
            .and_then(|m| Some((m.len(), m.modified().ok()?)));
        let key = (model.to_path_buf(), path.to_path_buf(), stamp);
        if let Some(d) = self.described.get(&key) {
            return Ok(*d);
        }
        let r = reference(path, detector, identifier, cpu)?;
        if r.faces > 1 {
            tracing::warn!(
                "reference photo {}: {} faces in it, the largest taken",
                path.display(),
                r.faces
            );
        }
        self.count += 1;
        tracing::debug!(photos = self.count, "reference photo {} described", path.display());
        self.described.insert(key, r.descriptor);
        Ok(r.descriptor)
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
pub(crate) struct Chooser {
    selection: Selection,
    only: Vec<Descriptor>,
    skip: Vec<Descriptor>,
    identifier: Option<Identifier>,
    tracks: std::collections::HashMap<u64, TrackChoice>,
    rotation: u32,
    scratch: WarpScratch,
    /// Faces described, and faces left alone.
    pub(crate) described: u64,
    pub(crate) left: u64,
}

impl Chooser {
    /// The chooser of `selection`: each reference photo described (by `detector`, left reset,
    /// and the identity model at `model`) or taken from those `references` kept, or an error
    /// naming the photo. `rotation` is the video's display rotation (faces are measured
    /// upright); `cpu` the run's CPU level.
    pub(crate) fn new(
        selection: &Selection,
        (detector, references): (&mut Detector, &mut References),
        model: Option<(&Path, &crate::runtime::SessionOptions)>,
        (rotation, cpu): (u32, crate::kernels::Cpu),
    ) -> Result<Self> {
        let mut identifier = None;
        let (mut only, mut skip) = (Vec::new(), Vec::new());
        if selection.names_people() {
            let (model, opts) = model.ok_or_else(|| {
                anyhow!("--only-face and --skip-face need the face-identity model models/face-id.onnx: run scripts/setup.sh")
            })?;
            let mut id = Identifier::open(model, opts)?;
            for (paths, out) in [(&selection.only_face, &mut only), (&selection.skip_face, &mut skip)] {
                for p in paths {
                    out.push(references.get((model, p), detector, &mut id, cpu)?);
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
            scratch: WarpScratch::at(cpu),
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
        let worth = view_worth(&job.face, self.rotation);
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

/// The calibrated identity of two faces whose descriptors lie `distance` apart: 1 for the same
/// face, 0.5 at dlib's threshold of one person (0.6, [`crate::defaults::FACE_DISTANCE`]), 0 at
/// twice that or farther; linear between. dlib chose 0.6 on Labeled Faces in the Wild (99.38 %
/// of its pairs told apart there); on the real photos the tests ship (three of Barack Obama, one
/// of Joe Biden, one of Eileen Collins: `tests/suite/identity.rs`) one person's photos lie 0.36-0.44
/// apart (0.63-0.70 on this scale) and two people's 0.75-0.87 (0.28-0.37).
pub fn identity_of(distance: f32) -> f32 {
    (1.0 - distance / (2.0 * crate::defaults::FACE_DISTANCE)).clamp(0.0, 1.0)
}

/// The distance whose calibrated identity is `identity` (the inverse of [`identity_of`] on its
/// range).
pub(crate) fn distance_of(identity: f32) -> f32 {
    (1.0 - identity) * 2.0 * crate::defaults::FACE_DISTANCE
}

/// How much of the model's change a track backed off by the guard gets, tried in this order.
const BACK_OFF: [f32; 4] = [0.75, 0.5, 0.25, 0.0];

/// How good a view of a face is for describing it: its upright height times how frontal it is
/// (the nose between the eyes).
fn view_worth(face: &crate::frame::Face, rotation: u32) -> f32 {
    let [x0, y0, x1, y1] = face.bbox;
    let upright = if rotation == 90 || rotation == 270 {
        x1 - x0
    } else {
        y1 - y0
    };
    let l = &face.landmarks;
    let eyes = ((l[1][0] - l[0][0]).powi(2) + (l[1][1] - l[0][1]).powi(2))
        .sqrt()
        .max(1.0);
    let mid = (l[0][0] + l[1][0]) / 2.0;
    upright * (1.0 - 2.0 * (l[2][0] - mid).abs() / eyes).clamp(0.05, 1.0)
}

/// Frames of one stretch of the guard's: a track is decided afresh on each stretch (its first
/// face there, then clearly better views), the stretches counted from the video's first frame,
/// so what the guard gives a face depends only on its track's faces since its stretch began: a
/// long video's segment that warms up from there decides it as one run does
/// (`segment::plan::cut`).
pub(crate) const GUARD_STRETCH: u64 = 128;

/// The fidelities a track the guard finds another person is run at again, in order, before its
/// share of the change is lowered, on a model with a fidelity input (CodeFormer's `weight`: 1
/// most faithful); only those above the fidelity its faces were run at.
const FIDELITY_UP: [f32; 2] = [0.75, 1.0];

/// Runs one crop (planar RGB24 at the model's size) through the run's model at a fidelity:
/// its change, or `None` where the model gave values that are not finite.
pub(crate) type Rerun<'a> = dyn FnMut(&[u8], f32) -> Result<Option<Vec<i16>>> + 'a;

/// What the identity stage knows of one track.
struct TrackMeter {
    /// The first and last frame seen.
    frames: [u64; 2],
    /// Its best view described, and views described.
    best: f32,
    views: u32,
    /// The identity of what is pasted per face measured, and the restorer's own per face
    /// measured as the run's settings ran it.
    pasted: Vec<f32>,
    own: Vec<f32>,
    /// The share of the model's change its faces get (the guard's; 1 until it acts).
    share: f32,
    /// The fidelity the guard runs its faces at, where it raised it.
    fidelity: Option<f32>,
    /// The restorer's own identity when the guard first found it another person.
    flagged: Option<f32>,
    /// The stretch (see [`GUARD_STRETCH`]) the guard's decision (`views`, `best`, `share`,
    /// `fidelity`) is of.
    stretch: u64,
    /// The least and the most of the model's change its faces were given, and the highest
    /// fidelity they were run at (over all stretches).
    given: [f32; 2],
    most_faithful: Option<f32>,
    /// Quality before and after, per face measured.
    quality: Vec<[f32; 2]>,
}

impl TrackMeter {
    fn new(frame: u64) -> Self {
        TrackMeter {
            frames: [frame, frame],
            best: 0.0,
            views: 0,
            pasted: Vec::new(),
            own: Vec::new(),
            share: 1.0,
            fidelity: None,
            flagged: None,
            stretch: frame / GUARD_STRETCH,
            given: [1.0, 0.0],
            most_faithful: None,
            quality: Vec::new(),
        }
    }

    /// Forgets the guard's decision when frame `index` begins a new stretch for the track.
    fn settle(&mut self, index: u64) {
        let stretch = index / GUARD_STRETCH;
        if stretch != self.stretch {
            (self.stretch, self.views, self.best) = (stretch, 0, 0.0);
            (self.share, self.fidelity) = (1.0, None);
        }
    }
}

/// Who a restored face still is, and the guard: on a few views of each track (its first, then
/// each clearly better one, up to [`TRACK_VIEWS`]; every face when the faces are recorded) the
/// identity descriptors of the face as the model was given it and as it is pasted (colour fixed,
/// at the picture's blend) are compared in the model's crop, on the calibrated scale of
/// [`identity_of`]. With the guard backing off, a track whose pasted face lies `--face-distance`
/// or farther from the original gets less of the model's change ([`BACK_OFF`]) until it is the
/// same person again, or none; its faces' changes are scaled here, before the paste. On a model
/// with a fidelity input the track's faces are first run again at a higher fidelity
/// ([`FIDELITY_UP`]), and only then is the share lowered.
pub(crate) struct IdentityMeter {
    identifier: Identifier,
    each: bool,
    guard: Guard,
    /// The run's fidelity, on a model with a fidelity input the guard may raise.
    fidelity: Option<f32>,
    near: f32,
    fix: bool,
    rotation: u32,
    /// BRISQUE and its buffers, for the quality figure.
    quality: Option<(crate::faces::quality::Brisque, crate::faces::quality::QualityScratch)>,
    tracks: std::collections::BTreeMap<Option<u64>, TrackMeter>,
    scratch: WarpScratch,
    low: crate::kernels::lowband::LowBand,
    packed: [Vec<u8>; 2],
    change: Vec<f32>,
}

impl IdentityMeter {
    /// A meter with the identity model's `identifier` (see [`Identifier::open`]) for a
    /// run's `guard`, face distance (`near`) and colour fix (`fix`), and BRISQUE's parameters
    /// at `quality` where given, measuring every face (`each`) or a few views of each track;
    /// `rotation` is the video's display rotation, `cpu` the run's CPU level.
    pub(crate) fn new(
        identifier: Identifier,
        (guard, near, fix): (Guard, f32, bool),
        quality: Option<&Path>,
        (each, rotation, cpu): (bool, u32, crate::kernels::Cpu),
    ) -> Result<Self> {
        let quality = quality.map(crate::faces::quality::Brisque::load).transpose()?;
        Ok(IdentityMeter {
            identifier,
            each,
            guard,
            fidelity: None,
            near,
            fix,
            rotation,
            quality: quality.map(|b| (b, Default::default())),
            tracks: Default::default(),
            scratch: WarpScratch::at(cpu),
            low: crate::kernels::lowband::LowBand::at(cpu),
            packed: Default::default(),
            change: Vec::new(),
        })
    }

    /// CPU time the identity model's runs have taken so far (a GPU host runs them on its GPU,
    /// as it runs detection's: see `Engine::identity_opts`).
    pub(crate) fn model_cpu(&self) -> std::time::Duration {
        self.identifier.model_cpu()
    }

    /// The identity model's session, given back for the engine's next run.
    pub(crate) fn into_identifier(self) -> Identifier {
        self.identifier
    }

    /// Lets the guard (backing off) run a track's faces again at a higher fidelity than the
    /// run's `fidelity` before it lowers their share: a model with a fidelity input.
    pub(crate) fn raising(mut self, fidelity: f32) -> Self {
        self.fidelity = (self.guard == Guard::BackOff).then_some(fidelity);
        self
    }

    /// Whether the guard may run faces again at a higher fidelity (see
    /// [`IdentityMeter::raising`]).
    pub(crate) fn raises(&self) -> bool {
        self.fidelity.is_some()
    }

    /// Starts frame `index`: the tracks whose stretch it ends are decided afresh (see
    /// [`GUARD_STRETCH`]). Called before the frame's faces are run again or looked at.
    pub(crate) fn begin(&mut self, index: u64) {
        self.tracks.values_mut().for_each(|t| t.settle(index));
    }

    /// The fidelity the guard runs `track`'s faces at, where it raised it.
    pub(crate) fn raised(&self, track: Option<u64>) -> Option<f32> {
        self.tracks.get(&Some(track?)).and_then(|t| t.fidelity)
    }

    /// Looks at one restored face of frame `index` (a warm-up frame's too): measures it when
    /// due, from `crop` (planar RGB24 of `size`, the crop the model was given) and its change,
    /// at the picture's `blend`, running it again through `rerun` at a higher fidelity where the
    /// guard raises its track's; then gives its change the track's share (the guard's).
    pub(crate) fn look(
        &mut self,
        job: &mut crate::frame::FaceJob,
        (crop, size): (&[u8], usize),
        (index, blend): (u64, f32),
        rerun: &mut Rerun<'_>,
    ) -> Result<()> {
        if job.restored.is_none() {
            return Ok(());
        }
        let worth = view_worth(&job.face, self.rotation);
        let t = self.tracks.entry(job.track).or_insert_with(|| TrackMeter::new(index));
        // A face without a track stands alone.
        if job.track.is_none() {
            *t = TrackMeter::new(index);
        }
        t.frames[1] = index;
        let due = self.each || t.views == 0 || (t.views < TRACK_VIEWS && worth > BETTER_VIEW * t.best);
        if due {
            t.views += 1;
            t.best = t.best.max(worth);
            self.measure(job, (crop, size), blend, rerun)?;
        }
        let t = self.tracks.get_mut(&job.track).expect("the track was entered");
        if self.guard == Guard::BackOff {
            t.given = [t.given[0].min(t.share), t.given[1].max(t.share)];
            if t.fidelity > t.most_faithful {
                t.most_faithful = t.fidelity;
            }
            job.blend = Some(t.share * blend);
            if t.share < 1.0 {
                if let Some(change) = job.restored.as_mut() {
                    for v in change.iter_mut() {
                        *v = crate::kernels::round_steps(f32::from(*v) * t.share);
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes `change` as it will be pasted (colour fixed), in levels, into `self.change`.
    fn load_change(&mut self, change: &[i16], size: usize) {
        let plane = size * size;
        let mut fixed;
        let change: &[i16] = if self.fix {
            fixed = change.to_vec();
            crate::kernels::lowband::remove_low_band(&mut fixed, size, &mut self.low);
            &fixed
        } else {
            change
        };
        self.change.clear();
        self.change
            .extend(change[..3 * plane].iter().map(|&v| crate::kernels::change_levels(v)));
    }

    /// Measures `job` (see [`IdentityMeter::look`]), raising its track's fidelity and backing it
    /// off when the guard says.
    fn measure(
        &mut self,
        job: &mut crate::frame::FaceJob,
        (crop, size): (&[u8], usize),
        blend: f32,
        rerun: &mut Rerun<'_>,
    ) -> Result<()> {
        let plane = size * size;
        if job.restored.as_ref().is_none_or(|c| c.len() < 3 * plane) {
            return Ok(());
        }
        self.load_change(job.restored.as_deref().unwrap_or_default(), size);
        // Run at the run's fidelity: the restorer's own identity is the run's.
        let at_run = job.fidelity.is_none();
        let points = job.face.landmarks.map(|[x, y]| {
            let (u, v) = job.to_crop.apply(f64::from(x), f64::from(y));
            [u as f32, v as f32]
        });
        let given = &mut self.packed[0];
        given.resize(3 * plane, 0);
        for i in 0..plane {
            for c in 0..3 {
                given[3 * i + c] = crop[c * plane + i];
            }
        }
        let a = chip(given, (size, size), &points, &mut self.scratch);
        // The restorer's own (its whole change at the picture's blend, at the fidelity the face
        // was run at), then what the track's share pastes: run again at a higher fidelity, then
        // backed off further, while it is someone else.
        let mut share = self.tracks[&job.track].share;
        let b = self.pasted_chip(blend, size, &points);
        let ds = self.identifier.describe(&[&a, &b])?;
        let (original, own) = (ds[0], distance(&ds[0], &ds[1]));
        if own >= self.near {
            self.tracks
                .get_mut(&job.track)
                .expect("the track was entered")
                .flagged
                .get_or_insert(identity_of(own));
        }
        let mut dist = own;
        if self.guard == Guard::BackOff {
            if share < 1.0 {
                dist = if share == 0.0 {
                    0.0
                } else {
                    let b = self.pasted_chip(share * blend, size, &points);
                    distance(&original, &self.identifier.describe(&[&b])?[0])
                };
            }
            if let Some(run_at) = self.fidelity {
                let from = job.fidelity.unwrap_or(run_at);
                for &f in FIDELITY_UP.iter().filter(|&&f| f > from) {
                    if dist < self.near {
                        break;
                    }
                    let Some(again) = rerun(crop, f)?.filter(|c| c.len() >= 3 * plane) else {
                        break;
                    };
                    self.load_change(&again, size);
                    job.restored = Some(again);
                    job.fidelity = Some(f);
                    self.tracks.get_mut(&job.track).expect("the track was entered").fidelity = Some(f);
                    let b = self.pasted_chip(share * blend, size, &points);
                    dist = distance(&original, &self.identifier.describe(&[&b])?[0]);
                }
            }
            let from = share;
            for &s in BACK_OFF.iter().filter(|&&s| s < from) {
                if dist < self.near {
                    break;
                }
                share = s;
                dist = if s == 0.0 {
                    0.0
                } else {
                    let b = self.pasted_chip(s * blend, size, &points);
                    distance(&original, &self.identifier.describe(&[&b])?[0])
                };
            }
        }
        // Quality before (the crop given) and after (as pasted at the track's share).
        let quality = match &mut self.quality {
            Some((brisque, scratch)) => {
                let [given, pasted] = &mut self.packed;
                for ((o, &g), &c) in pasted.iter_mut().zip(given.iter()).zip(&self.change) {
                    *o = (f32::from(g) + share * blend * c).round().clamp(0.0, 255.0) as u8;
                }
                Some([
                    brisque.score(given, size, size, scratch),
                    brisque.score(pasted, size, size, scratch),
                ])
            }
            None => None,
        };
        job.quality = quality;
        let t = self.tracks.get_mut(&job.track).expect("the track was entered");
        t.quality.extend(quality);
        t.share = share;
        let figure = identity_of(dist);
        t.pasted.push(figure);
        if at_run {
            t.own.push(identity_of(own));
        }
        job.identity = Some(figure);
        Ok(())
    }

    /// The chip of the crop given (`packed[0]`) with `share` of the change in levels added.
    fn pasted_chip(&mut self, share: f32, size: usize, points: &[[f32; 2]; 5]) -> Vec<u8> {
        let [given, pasted] = &mut self.packed;
        pasted.resize(given.len(), 0);
        for ((o, &g), &c) in pasted.iter_mut().zip(given.iter()).zip(&self.change) {
            *o = (f32::from(g) + share * c).round().clamp(0.0, 255.0) as u8;
        }
        chip(pasted, (size, size), points, &mut self.scratch)
    }

    /// Each track's identity figures (see [`crate::stats::TrackIdentity`]), and a warning for
    /// each track the guard found another person, naming it, its frames and what was done.
    pub(crate) fn finish(&self) -> Vec<crate::stats::TrackIdentity> {
        let median = |v: &[f32]| {
            let mut s = v.to_vec();
            s.sort_by(f32::total_cmp);
            s.get(s.len() / 2).copied()
        };
        let same_above = identity_of(self.near);
        self.tracks
            .iter()
            .filter_map(|(&track, t)| {
                let pasted = median(&t.pasted)?;
                let own = median(&t.own).unwrap_or(pasted);
                let guard = match (self.guard, t.flagged) {
                    (_, None) => None,
                    (Guard::BackOff, Some(_)) if t.given[1] == 0.0 => Some("left as it was"),
                    (Guard::BackOff, Some(_)) => Some("backed off"),
                    (_, Some(_)) => Some("warned"),
                };
                if let Some(what) = guard {
                    let who = track.map_or("a picture's face".to_string(), |n| format!("track {n}"));
                    let [first, last] = t.frames;
                    let done = match what {
                        "warned" => "left as restored (--identity-guard warn)".to_string(),
                        "left as it was" => "left as it was: no share of the model's change kept them the same person".to_string(),
                        _ => {
                            let raised = t.most_faithful.map_or(String::new(), |f| {
                                format!(
                                    "run again at fidelity {f:.2} (the run's {:.2}) and ",
                                    self.fidelity.unwrap_or(f)
                                )
                            });
                            let [least, most] = t.given;
                            let given = if least == most {
                                format!("{least:.2}")
                            } else {
                                format!("{least:.2} to {most:.2}")
                            };
                            format!("{raised}given {given} of the model's change (identity {pasted:.2})")
                        }
                    };
                    tracing::warn!(
                        "{who} (frames {first}-{last}): the restored faces are no longer the same person (identity {:.2}, the same person above {:.2} at --face-distance {}): {done}",
                        t.flagged.unwrap_or(own),
                        same_above,
                        self.near
                    );
                }
                let quality = |k: usize| median(&t.quality.iter().map(|q| q[k]).collect::<Vec<_>>());
                Some(crate::stats::TrackIdentity {
                    track,
                    median: pasted,
                    own,
                    same: distance_of(pasted) < self.near,
                    share: t.given[0].min(t.share),
                    fidelity: t.most_faithful,
                    guard,
                    frames: t.frames,
                    measured: t.pasted.len() as u64,
                    quality: quality(0).zip(quality(1)).map(|(b, a)| crate::stats::Quality { before: b, after: a }),
                })
            })
            .collect()
    }
}
