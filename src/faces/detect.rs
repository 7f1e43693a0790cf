//! Face detection with CenterFace on ONNX Runtime: in, a downscaled RGB copy of a frame; out,
//! faces (box, score, five landmarks) in frame coordinates after a score threshold and NMS.
//!
//! Faces are tracked between full detections. With the face mesh the pipeline follows them by
//! their meshes itself and asks the detector only for its whole-frame passes
//! ([`Detector::pass_due`], [`Detector::pass`]); without it, on most frames the detector looks
//! only at a small window around each face of the previous frame ([`Detector::detect`]), a
//! fraction of a full pass. A full pass runs every `every` frames, when no face is tracked,
//! when a tracked face is lost, and on a scene change, so a face that appears next to a tracked
//! one is found within `every` frames.

use anyhow::{bail, Result};
use ort::session::Session;
use ort::value::{TensorRef, ValueType};

use crate::frame::Face;
use crate::geom::display_to_storage;
use crate::stats::DetectCounts;

/// Detection input size for a frame: the long side scaled to `long_side` (never up), each side
/// rounded to the nearest multiple of 32 as CenterFace needs (the stretch stays under half a
/// step; rounding up instead would add up to a step of work per frame). Returns (width, height).
pub(crate) fn det_size(width: usize, height: usize, long_side: usize) -> (usize, usize) {
    let s = (long_side as f64 / width.max(height) as f64).min(1.0);
    let round32 = |v: f64| ((v / 32.0).round() as usize).max(1) * 32;
    (round32(width as f64 * s), round32(height as f64 * s))
}

/// The mean light ((R + 2 G + B) / 4, in whole levels) of each of [`SCENE_BLOCKS`] x
/// [`SCENE_BLOCKS`] blocks of a packed RGB copy `w x h` into `sums` (pixel `x` of row `y` in
/// block `(y B / h, x B / w)`), `counts` their pixels: the picture's summary a scene cut is told
/// by. A row's blocks run by run (their bounds worked out once, where a division per pixel
/// was most of the time).
fn block_means(det: &[u8], (w, h): (usize, usize), sums: &mut [u32], counts: &mut [u32]) {
    const B: usize = SCENE_BLOCKS;
    // Block bx holds the pixels x with x B / w == bx: from ceil(bx w / B) to ceil((bx + 1) w / B).
    let starts: [usize; B + 1] = std::array::from_fn(|b| (b * w).div_ceil(B));
    for (y, row) in det.chunks_exact(3 * w).take(h).enumerate() {
        let by = y * B / h;
        for bx in 0..B {
            let run = &row[3 * starts[bx]..3 * starts[bx + 1]];
            let light: u32 = run
                .chunks_exact(3)
                .map(|px| (px[0] as u32 + 2 * px[1] as u32 + px[2] as u32) / 4)
                .sum();
            sums[by * B + bx] += light;
            counts[by * B + bx] += (starts[bx + 1] - starts[bx]) as u32;
        }
    }
    for (s, c) in sums.iter_mut().zip(counts.iter()) {
        *s /= (*c).max(1);
    }
}

/// Intersection over union of two x1,y1,x2,y2 boxes.
pub(crate) fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |r: &[f32; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union <= 0.0 {
        0.0
    } else {
        inter / union
    }
}

/// Greedy non-maximum suppression: keeps the best-scoring face of each overlapping group
/// (IoU >= `threshold`), best first.
pub(crate) fn nms(faces: Vec<Face>, threshold: f32) -> Vec<Face> {
    nms_by(faces, |f| (f.bbox, f.score), threshold)
}

/// [`nms`] of any items, `of` giving each one's box and score.
pub(crate) fn nms_by<T>(mut items: Vec<T>, of: impl Fn(&T) -> ([f32; 4], f32), threshold: f32) -> Vec<T> {
    items.sort_by(|a, b| of(b).1.total_cmp(&of(a).1));
    let mut kept: Vec<T> = Vec::with_capacity(items.len());
    for f in items {
        let b = of(&f).0;
        if kept.iter().all(|k| iou(&of(k).0, &b) < threshold) {
            kept.push(f);
        }
    }
    kept
}

/// Decodes CenterFace's four maps (heatmap, log-scale, offset, landmarks; each `h x w` at a
/// quarter of the input size) into faces in input pixels, as the reference implementation does.
pub(crate) fn decode_maps(
    heat: &[f32],
    scale: &[f32],
    offset: &[f32],
    lms: &[f32],
    (h, w): (usize, usize),
    (in_w, in_h): (usize, usize),
    threshold: f32,
) -> Vec<Face> {
    let plane = h * w;
    let mut faces = Vec::new();
    for r in 0..h {
        for c in 0..w {
            let i = r * w + c;
            let score = heat[i];
            // A NaN score is skipped too.
            if score.is_nan() || score <= threshold {
                continue;
            }
            let s0 = scale[i].exp() * 4.0;
            let s1 = scale[plane + i].exp() * 4.0;
            let (o0, o1) = (offset[i], offset[plane + i]);
            let x1 = ((c as f32 + o1 + 0.5) * 4.0 - s1 / 2.0).clamp(0.0, in_w as f32);
            let y1 = ((r as f32 + o0 + 0.5) * 4.0 - s0 / 2.0).clamp(0.0, in_h as f32);
            let bbox = [x1, y1, (x1 + s1).min(in_w as f32), (y1 + s0).min(in_h as f32)];
            let mut landmarks = [[0.0; 2]; 5];
            for (j, lm) in landmarks.iter_mut().enumerate() {
                lm[0] = lms[(2 * j + 1) * plane + i] * s1 + x1;
                lm[1] = lms[2 * j * plane + i] * s0 + y1;
            }
            // A broken or adversarial model can give infinities or NaN: never a face.
            if !bbox.iter().chain(landmarks.iter().flatten()).all(|v| v.is_finite()) {
                continue;
            }
            faces.push(Face {
                bbox,
                score,
                landmarks,
                outline: None,
            });
        }
    }
    faces
}

/// How faces are looked for: what the detector is built with (part of every job's recipe).
/// Each field is its own flag (the doc comment its help).
#[derive(Clone, Debug, PartialEq, serde::Serialize, clap::Args)]
pub struct DetectSettings {
    /// Long side, in pixels, of the downscaled copy the detector sees.
    #[arg(long, default_value_t = crate::defaults::DET_SIZE, value_name = "PX", help_heading = "Detection")]
    pub det_size: usize,
    /// Minimum detector score for a face.
    #[arg(long = "det-threshold", id = "det_threshold", default_value_t = crate::defaults::DET_THRESHOLD, help_heading = "Detection")]
    pub threshold: f32,
    /// Overlap above which two detections are one face (no flag).
    #[arg(skip = crate::defaults::NMS_IOU)]
    pub(crate) nms_iou: f32,
    /// Look for faces in the whole frame every N frames; in between, follow the faces of the
    /// previous frame (much cheaper): by the face mesh from their points there, or, without the
    /// mesh, by the detector in a window around each. A whole-frame pass also runs on a scene
    /// change, when no face is tracked and when a tracked face is lost. 1 searches every frame.
    #[arg(long = "detect-every", id = "detect_every", value_name = "N", default_value_t = crate::defaults::DETECT_EVERY,
          value_parser = clap::value_parser!(u32).range(1..=1000), help_heading = "Detection")]
    pub every: u32,
    /// Restore at most N faces per frame, the best-scoring ones (a warning says when a frame
    /// had more).
    #[arg(long, value_name = "N", default_value_t = crate::defaults::MAX_FACES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000), help_heading = "Detection")]
    pub max_faces: usize,
}

impl Default for DetectSettings {
    /// Each field's flag default (the one place they are written).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            detection: DetectSettings,
        }
        <Flags as clap::Parser>::parse_from(["gpen-video"]).detection
    }
}

/// A CenterFace session with its input buffer.
pub struct Detector {
    session: Session,
    /// More sessions of the same model (on the CPU): a frame's windows are shared out among
    /// them and `session`, one thread each.
    extra: Vec<Session>,
    /// CPU time the helper threads running `extra` spent so far.
    helper_cpu: std::time::Duration,
    /// CPU nanoseconds spent inside the sessions' runs so far, on every thread.
    model_ns: std::sync::atomic::AtomicU64,
    input_name: String,
    /// Size (width, height) of the downscaled copy the decoder makes, in stored orientation.
    pub size: (usize, usize),
    /// The model's input size: `size` turned upright for display.
    input_size: (usize, usize),
    /// Counterclockwise display rotation of the video (0, 90, 180 or 270): faces are found on
    /// the upright picture, and their points mapped back to the stored one.
    rotation: u32,
    pub threshold: f32,
    pub(crate) nms_iou: f32,
    /// At most this many faces per frame, the best-scoring ones.
    pub max_faces: usize,
    /// Frames that had more faces than `max_faces` since the last reset.
    pub(crate) capped: u64,
    input: Vec<f32>,
    /// The model takes any input size, so windows around tracked faces can be run.
    dynamic: bool,
    /// The model's input size is fixed: `size` never changes.
    fixed: bool,
    track: Tracking,
}

/// Side, in model pixels, of the window a tracked face is looked for in: the face then spans
/// about half of it, a size CenterFace finds reliably.
const TRACK_INPUT: f32 = 192.0;
/// Windows up to this side (copy pixels) are cut from the copy at its own scale, on the grid a
/// whole-frame pass sees (see `Detector::window`); snapped to that grid such a window is at most
/// 224 x 224, under a quarter of a 640 x 352 pass.
const TRACK_NATIVE: f32 = 192.0;
/// The least side (copy pixels) of a window at the copy's own scale around a small face (box
/// under [`TRACK_SMALL`]): the model needs about this much of the picture around a small face
/// to place its points as a whole-frame pass does (0.7 % of the eye distance apart at 192;
/// 3.1 % at 128 and 3.6 % at 96, for a face of 15 px eye distance in 720p).
const TRACK_NATIVE_MIN: f32 = 192.0;
/// Faces whose box's longer side is at least this many copy pixels are looked for in a window
/// of [`TRACK_CONTEXT_LARGE`] times their box alone: they carry their own context.
const TRACK_SMALL: f32 = 48.0;
/// The window around a tracked face, as a multiple of the face box's longer side.
const TRACK_CONTEXT: f32 = 2.0;
/// The window around a face of [`TRACK_SMALL`] or more, as a multiple of its box's longer side
/// (before the window is snapped to the 32-pixel grid): a face of 47 px eye distance in 720p
/// is placed within 1.3 % of its eye distance of a whole-frame pass (0.8 % at twice its box,
/// 0.7 % in a 192 px window), at about half a 192 px window's cost.
const TRACK_CONTEXT_LARGE: f32 = 1.5;
/// Mean change (0-255) of the block averages of the detection copy that counts as a new scene.
const SCENE_CHANGE: u32 = 24;
/// Blocks per side of the picture summary used to spot scene changes.
const SCENE_BLOCKS: usize = 16;

/// What the detector remembers between frames.
#[derive(Default)]
struct Tracking {
    /// Full detection on every frame whose index is a multiple of this (and whenever a face
    /// is lost or the scene changes); 1 runs it on every frame.
    every: u32,
    /// Boxes of the previous frame's faces, in upright detection-copy pixels.
    boxes: Vec<[f32; 4]>,
    /// Block averages of the previous detection copy, and the current one's being built.
    summary: Vec<u32>,
    next: Vec<u32>,
    counts: Vec<u32>,
    /// Full and windowed passes so far.
    full_runs: u64,
    window_runs: u64,
}

impl Detector {
    /// Checks the session looks like CenterFace (one [N,3,H,W] input, four outputs) and picks
    /// the detection size: the model's own if its spatial dimensions are fixed, else `wanted`
    /// (given in stored orientation). `rotation` is the video's display rotation.
    pub fn new(session: Session, wanted: (usize, usize), threshold: f32, nms_iou: f32, rotation: u32) -> Result<Self> {
        let turned = rotation == 90 || rotation == 270;
        let swap = |(a, b): (usize, usize)| if turned { (b, a) } else { (a, b) };
        let inputs = session.inputs();
        if inputs.len() != 1 || session.outputs().len() != 4 {
            bail!(
                "expected a CenterFace model (1 input, 4 outputs: heatmap, scale, offset, landmarks), found {} inputs and {} outputs",
                inputs.len(),
                session.outputs().len()
            );
        }
        let input_name = inputs[0].name().to_string();
        let ValueType::Tensor { shape, .. } = inputs[0].dtype() else {
            bail!("detector input `{input_name}` is not a tensor");
        };
        if shape.len() != 4 || (shape[1] != 3 && shape[1] != -1) {
            bail!("detector input `{input_name}` must be [N,3,H,W], found {shape:?}");
        }
        let dynamic = shape[2] <= 0 && shape[3] <= 0;
        let fixed = shape[2] > 0 && shape[3] > 0;
        let size = if shape[2] > 0 && shape[3] > 0 {
            if shape[2] % 32 != 0 || shape[3] % 32 != 0 {
                bail!(
                    "detector input has fixed size {}x{}: use scripts/prepare_detector.py to make it dynamic",
                    shape[3],
                    shape[2]
                );
            }
            if shape[0] > 1 {
                bail!(
                    "detector input is fixed at {:?}: make its dimensions dynamic with scripts/prepare_detector.py",
                    shape
                );
            }
            (shape[3] as usize, shape[2] as usize)
        } else {
            swap(wanted)
        };
        Ok(Self {
            session,
            extra: Vec::new(),
            helper_cpu: std::time::Duration::ZERO,
            model_ns: std::sync::atomic::AtomicU64::new(0),
            input_name,
            size: swap(size),
            input_size: size,
            rotation: if turned || rotation == 180 { rotation } else { 0 },
            threshold,
            nms_iou,
            max_faces: usize::MAX,
            capped: 0,
            input: Vec::new(),
            dynamic,
            fixed,
            track: Tracking {
                every: 1,
                ..Default::default()
            },
        })
    }

    /// Full detection every `every` frames (at least 1) and tracking in between. A model with
    /// a fixed input size cannot look at windows, so it runs a full pass on every frame.
    pub(crate) fn with_tracking(mut self, every: u32) -> Self {
        self.track.every = if self.dynamic { every.max(1) } else { 1 };
        self
    }

    /// More sessions of the same model, each on a thread of its own for a frame's windows (on the
    /// CPU, where a frame's tracked faces would otherwise wait for each other on one thread).
    pub(crate) fn with_sessions(mut self, extra: Vec<Session>) -> Self {
        self.extra = extra;
        self
    }

    /// Whether faces are followed from frame to frame (`--detect-every` above 1 on a model
    /// that takes any input size), with a whole-frame pass only now and then.
    pub(crate) fn tracks(&self) -> bool {
        self.track.every > 1
    }

    /// The frames whose numbers are multiples of this get a whole-frame pass.
    pub(crate) fn every(&self) -> u64 {
        u64::from(self.track.every.max(1))
    }

    /// Sessions the windows are shared out among.
    pub(crate) fn sessions(&self) -> usize {
        1 + self.extra.len()
    }

    /// CPU time the helper threads spent so far (the calling thread's own is not in it).
    pub(crate) fn helper_cpu(&self) -> std::time::Duration {
        self.helper_cpu
    }

    /// CPU time spent inside the sessions' runs so far (this thread's and the helpers').
    pub(crate) fn model_cpu(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.model_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Keeps at most `n` faces per frame (at least 1).
    pub(crate) fn with_max_faces(mut self, n: usize) -> Self {
        self.max_faces = n.max(1);
        self
    }

    /// Forgets the faces of the previous frame (a new video starts) and zeroes the counts.
    pub fn reset(&mut self) {
        self.capped = 0;
        let every = self.track.every;
        self.track = Tracking {
            every,
            ..Default::default()
        };
    }

    /// Starts a job whose detection copy is `size` (stored orientation; the model's own size
    /// when that is fixed): forgets the previous faces and zeroes the counts.
    pub fn start(&mut self, size: (usize, usize)) {
        self.reset();
        self.set_size(size);
    }

    /// The next picture of an image stream, its detection copy `size`: a new scene of its own
    /// (no face is tracked into it), the counts go on.
    pub(crate) fn next_picture(&mut self, size: (usize, usize)) {
        self.set_size(size);
        let t = &mut self.track;
        t.boxes.clear();
        t.summary.clear();
    }

    /// The detection copy's size (stored orientation) when the model's input size is fixed:
    /// every picture is shrunk to it, whatever its own size.
    pub(crate) fn fixed_size(&self) -> Option<(usize, usize)> {
        self.fixed.then_some(self.size)
    }

    fn set_size(&mut self, size: (usize, usize)) {
        let size = self.fixed_size().unwrap_or(size);
        let turned = self.rotation == 90 || self.rotation == 270;
        self.size = size;
        self.input_size = if turned { (size.1, size.0) } else { size };
    }

    /// Passes run since the last reset.
    pub fn counts(&self) -> DetectCounts {
        DetectCounts {
            full: self.track.full_runs,
            windows: self.track.window_runs,
            capped: self.capped,
            followed: 0,
            not_faces: 0,
            kept_doubted: 0,
        }
    }

    /// Detects faces in `det` (packed RGB24 at `self.size`) and maps them to a frame of
    /// `frame_w x frame_h` (stored orientation). Consecutive calls are consecutive frames;
    /// `index` is the frame's place in the video.
    ///
    /// What is found depends on a few frames before only, never on where decoding began: the
    /// full passes fall on frame indices (multiples of `every`), not on a count since the last
    /// one, and the windows are snapped to a grid, so a run started some frames earlier (a
    /// segment's warm-up) finds the faces a run from the first frame finds.
    pub fn detect(&mut self, det: &[u8], frame_w: usize, frame_h: usize, index: u64) -> Result<Vec<Face>> {
        let scene_cut = self.track.every > 1 && self.scene_changed(det);
        let boxes = std::mem::take(&mut self.track.boxes);
        let t = &self.track;
        let mut full = t.every <= 1 || boxes.is_empty() || index.is_multiple_of(u64::from(t.every)) || scene_cut;
        // Faces in upright detection-copy pixels. A tracked face is always located through its
        // window, even on frames with a full pass, so its points come from one estimator and do
        // not jump each time the full pass runs.
        let mut found = Vec::new();
        if self.track.every > 1 && !scene_cut {
            let windows: Vec<_> = boxes.iter().map(|b| self.window(b)).collect();
            // Windows of one size run as one batch: one model call for the faces of a frame.
            let mut done = vec![false; windows.len()];
            for i in 0..windows.len() {
                if done[i] {
                    continue;
                }
                let size = windows[i].1;
                let group: Vec<usize> = (i..windows.len())
                    .filter(|&j| !done[j] && windows[j].1 == size)
                    .collect();
                let plane = 3 * size.0 * size.1;
                self.input.clear();
                self.input.resize(plane * group.len(), 0.0);
                for (n, &j) in group.iter().enumerate() {
                    done[j] = true;
                    let mut input = std::mem::take(&mut self.input);
                    self.fill_window(det, windows[j].0, size, &mut input[n * plane..(n + 1) * plane]);
                    self.input = input;
                }
                self.track.window_runs += group.len() as u64;
                let batch = self.infer_shared(size, group.len())?;
                for (faces, &j) in batch.into_iter().zip(&group) {
                    let (x0, y0, k) = windows[j].0;
                    if faces.is_empty() {
                        // Lost (it moved fast, turned away or left): look everywhere.
                        full = true;
                    }
                    // Back to the copy, kept inside the picture as a whole-frame pass keeps it.
                    let (cw, ch) = (self.input_size.0 as f32, self.input_size.1 as f32);
                    found.extend(faces.into_iter().map(|f| {
                        let mut f = map_face(f, |x, y| (x0 + x * k, y0 + y * k));
                        f.bbox = [
                            f.bbox[0].clamp(0.0, cw),
                            f.bbox[1].clamp(0.0, ch),
                            f.bbox[2].clamp(0.0, cw),
                            f.bbox[3].clamp(0.0, ch),
                        ];
                        f
                    }));
                }
            }
        }
        if full {
            self.fill_full(det);
            self.track.full_runs += 1;
            // New faces only: the tracked ones were found in their windows.
            let tracked = found.len();
            for f in self.infer(self.input_size)? {
                if found[..tracked].iter().all(|g| iou(&g.bbox, &f.bbox) < self.nms_iou) {
                    found.push(f);
                }
            }
        }
        let mut found = nms(found, self.nms_iou);
        self.cap(&mut found);
        self.track.boxes = found.iter().map(|f| f.bbox).collect();
        Ok(self.to_frame(found, (frame_w, frame_h)))
    }

    /// Keeps the first `max_faces` of a frame's faces (best first), counting and, the first
    /// time, saying when there were more.
    pub(crate) fn cap<T>(&mut self, found: &mut Vec<T>) {
        if found.len() > self.max_faces {
            if self.capped == 0 {
                tracing::warn!(
                    found = found.len(),
                    "more than {} faces in one frame: keeping the best {0} (raise --max-faces to restore more, or raise --det-threshold if these are not faces)",
                    self.max_faces
                );
            }
            self.capped += 1;
            found.truncate(self.max_faces);
        }
    }

    /// Faces in upright detection-copy pixels mapped to a frame of `frame_w x frame_h` (stored
    /// orientation).
    fn to_frame(&self, found: Vec<Face>, frame: (usize, usize)) -> Vec<Face> {
        self.geometry().to_frame(found, frame)
    }

    /// Whether the copy `det` starts a new scene, next to the copy of the previous call (only
    /// looked at when tracking, every > 1; else false). For a caller that follows the faces
    /// itself: call it once a frame, before [`Detector::pass_due`].
    pub(crate) fn scene_cut(&mut self, det: &[u8]) -> bool {
        self.track.every > 1 && self.scene_changed(det)
    }

    /// Whether a whole-frame pass is due on frame `index` for a caller that follows the faces
    /// itself (the face mesh, from their points on the frame before): on frame indices that are
    /// multiples of `every` (never on a count since the last one, so a segment's warm-up finds
    /// what one run finds), on a scene cut, and when nothing is followed.
    pub(crate) fn pass_due(&self, index: u64, cut: bool, nothing_followed: bool) -> bool {
        let every = u64::from(self.track.every.max(1));
        every == 1 || index.is_multiple_of(every) || cut || nothing_followed
    }

    /// A whole-frame pass over the copy `det`: the faces in a frame of `frame_w x frame_h`
    /// (stored orientation), best first, overlapping ones left out (not capped).
    pub(crate) fn pass(&mut self, det: &[u8], frame: (usize, usize)) -> Result<Vec<Face>> {
        self.fill_full(det);
        self.track.full_runs += 1;
        let found = nms(self.infer(self.input_size)?, self.nms_iou);
        Ok(self.to_frame(found, frame))
    }

    /// Whether `det` looks like a new scene next to the previous frame's copy.
    fn scene_changed(&mut self, det: &[u8]) -> bool {
        let (w, h) = self.size;
        let t = &mut self.track;
        let (sums, counts) = (&mut t.next, &mut t.counts);
        sums.clear();
        sums.resize(SCENE_BLOCKS * SCENE_BLOCKS, 0);
        counts.clear();
        counts.resize(SCENE_BLOCKS * SCENE_BLOCKS, 0);
        block_means(det, (w, h), sums, counts);
        std::mem::swap(&mut t.summary, &mut t.next);
        let (now, prev) = (&t.summary, &t.next);
        if prev.len() != now.len() {
            return true;
        }
        let diff: u32 = prev.iter().zip(now).map(|(a, b)| a.abs_diff(*b)).sum();
        diff / prev.len() as u32 >= SCENE_CHANGE
    }

    /// Fills the model input with the whole copy, turned upright.
    fn fill_full(&mut self, det: &[u8]) {
        fill_full(det, self.geometry(), &mut self.input);
    }

    /// The copy's stored size, the model's input size and the rotation between them.
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.size,
            input_size: self.input_size,
            rotation: self.rotation,
        }
    }

    /// Hands up to `max` of the helper sessions (the windows' when there is no mesh) to passers
    /// that run whole frames on threads of their own, ahead of the frame-by-frame chain (see
    /// [`Passer`]), each at this detector's present settings; [`Detector::take_back`] returns
    /// them.
    pub(crate) fn passers(&mut self, max: usize) -> Vec<Passer> {
        let geometry = self.geometry();
        let keep = self.extra.len().saturating_sub(max);
        self.extra
            .split_off(keep)
            .into_iter()
            .map(|session| Passer {
                session,
                input_name: self.input_name.clone(),
                input: Vec::new(),
                geometry,
                threshold: self.threshold,
                nms_iou: self.nms_iou,
                model_ns: std::sync::atomic::AtomicU64::new(0),
                runs: 0,
            })
            .collect()
    }

    /// Takes back the sessions of [`Detector::passers`], counting their model time (their
    /// passes count where they ran: [`Passer::runs`]).
    pub(crate) fn take_back(&mut self, passers: Vec<Passer>) {
        for p in passers {
            self.model_ns
                .fetch_add(p.model_ns.into_inner(), std::sync::atomic::Ordering::Relaxed);
            self.extra.push(p.session);
        }
    }

    /// The window a face tracked at box `b` (upright copy pixels) is looked for in: its
    /// top-left corner, its pixel size `k` in copy pixels, and its size in model pixels. Up to
    /// [`TRACK_NATIVE`] copy pixels a side the window is a tile of the copy itself on the
    /// model's 32-pixel grid (k = 1): the model sees the very pixels, at the same phase, that a
    /// whole-frame pass sees, and finds the same points. Larger faces are looked for in a
    /// window shrunk to [`TRACK_INPUT`].
    fn window(&self, b: &[f32; 4]) -> ((f32, f32, f32), (usize, usize)) {
        let side = TRACK_CONTEXT * (b[2] - b[0]).max(b[3] - b[1]).max(8.0);
        let (cx, cy) = ((b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0);
        if side <= TRACK_NATIVE {
            let (cw, ch) = (self.input_size.0 as f32, self.input_size.1 as f32);
            let snap = |lo: f32, hi: f32, limit: f32| {
                let a = ((lo / 32.0).floor() * 32.0).max(0.0);
                let b = ((hi / 32.0).ceil() * 32.0).min((limit / 32.0).ceil() * 32.0);
                (a, ((b - a) as usize).max(32))
            };
            // A small face gets the context a whole-frame pass gives it around, not just its
            // own width: the model's outputs near a window's edge differ from a full pass's.
            let box_side = (b[2] - b[0]).max(b[3] - b[1]);
            let half = if box_side < TRACK_SMALL {
                side.max(TRACK_NATIVE_MIN) / 2.0
            } else {
                TRACK_CONTEXT_LARGE * box_side / 2.0
            };
            let (x0, nw) = snap(cx - half, cx + half, cw);
            let (y0, nh) = snap(cy - half, cy + half, ch);
            return ((x0, y0, 1.0), (nw, nh));
        }
        // A larger face is shrunk into a window of at most TRACK_INPUT model pixels. Its side
        // (in steps of 16 copy pixels) and corner (in steps of the model's stride of 4 window
        // pixels) are snapped, so nearby boxes give the same window: what is found then no
        // longer carries every earlier frame's rounding along.
        let side = (side / 16.0).ceil() * 16.0;
        let n = (((side.min(TRACK_INPUT)) / 32.0).ceil() as usize).max(1) * 32;
        let k = side / n as f32;
        let step = 4.0 * k;
        let snap = |v: f32| (v / step).round() * step;
        ((snap(cx - side / 2.0), snap(cy - side / 2.0), k), (n, n))
    }

    /// Fills `input` (one `nw x nh` model input) with the window of the upright copy whose
    /// top-left corner is (x0, y0) and whose pixels are `k` copy pixels wide: bilinear, black
    /// outside (see [`fill_window`]).
    fn fill_window(&self, det: &[u8], window: (f32, f32, f32), dims: (usize, usize), input: &mut [f32]) {
        fill_window(det, self.size, self.rotation, window, dims, input);
    }

    /// Runs the model on `self.input` of `w x h` pixels; faces in input pixels, before NMS.
    fn infer(&mut self, (w, h): (usize, usize)) -> Result<Vec<Face>> {
        Ok(self.infer_batch((w, h), 1)?.pop().unwrap_or_default())
    }

    /// [`Detector::infer_batch`] with the `n` inputs shared out among the sessions, each part on
    /// a thread of its own (one part on this thread); the faces in the inputs' order.
    fn infer_shared(&mut self, (w, h): (usize, usize), n: usize) -> Result<Vec<Vec<Face>>> {
        let parts = self.sessions().min(n);
        if parts <= 1 {
            return self.infer_batch((w, h), n);
        }
        let (per, plane) = (n.div_ceil(parts), 3 * w * h);
        let (name, threshold, model_ns) = (self.input_name.as_str(), self.threshold, &self.model_ns);
        let input = &self.input[..n * plane];
        let mut chunks = input.chunks(per * plane);
        let own = chunks.next().expect("n > 0");
        let (found, cpu) = std::thread::scope(|s| {
            let helpers: Vec<_> = self
                .extra
                .iter_mut()
                .zip(chunks)
                .map(|(session, part)| {
                    s.spawn(move || {
                        let found = run_batch(session, name, part, (w, h), part.len() / plane, (threshold, model_ns));
                        (found, crate::stats::thread_cpu_time())
                    })
                })
                .collect();
            let mut found = run_batch(
                &mut self.session,
                name,
                own,
                (w, h),
                own.len() / plane,
                (threshold, model_ns),
            );
            let mut cpu = std::time::Duration::ZERO;
            for h in helpers {
                let (part, c) = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                cpu += c;
                found = found.and_then(|mut f| {
                    f.extend(part?);
                    Ok(f)
                });
            }
            (found, cpu)
        });
        self.helper_cpu += cpu;
        found
    }

    /// Runs the model on `n` inputs of `w x h` pixels in `self.input`; each one's faces in
    /// input pixels, before NMS.
    fn infer_batch(&mut self, (w, h): (usize, usize), n: usize) -> Result<Vec<Vec<Face>>> {
        let input = &self.input[..n * 3 * w * h];
        let model = (self.threshold, &self.model_ns);
        run_batch(&mut self.session, &self.input_name, input, (w, h), n, model)
    }
}

/// Runs a CenterFace `session` on `n` inputs of `w x h` pixels (planar, one after another in
/// `input`); each one's faces in input pixels scoring `threshold` or more, before NMS. The CPU
/// time of the session's run is added to `model_ns`.
fn run_batch(
    session: &mut Session,
    input_name: &str,
    input: &[f32],
    (w, h): (usize, usize),
    n: usize,
    (threshold, model_ns): (f32, &std::sync::atomic::AtomicU64),
) -> Result<Vec<Vec<Face>>> {
    let tensor = TensorRef::from_array_view(([n, 3, h, w], input))?;
    let start = crate::stats::thread_cpu_time();
    let outputs = session.run(ort::inputs![input_name => tensor])?;
    let spent = crate::stats::thread_cpu_time().saturating_sub(start);
    model_ns.fetch_add(spent.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    let map = |k: usize| outputs[k].try_extract_tensor::<f32>().map(|(_, d)| d);
    let (heat, scale, offset, lms) = (map(0)?, map(1)?, map(2)?, map(3)?);
    let (mh, mw) = (h / 4, w / 4);
    let plane = mh * mw;
    if heat.len() != n * plane
        || scale.len() != 2 * n * plane
        || offset.len() != 2 * n * plane
        || lms.len() != 10 * n * plane
    {
        bail!("detector output maps are not {n}x{mw}x{mh}: is this a CenterFace model?");
    }
    Ok((0..n)
        .map(|i| {
            decode_maps(
                &heat[i * plane..][..plane],
                &scale[2 * i * plane..][..2 * plane],
                &offset[2 * i * plane..][..2 * plane],
                &lms[10 * i * plane..][..10 * plane],
                (mh, mw),
                (w, h),
                threshold,
            )
        })
        .collect())
}

/// The detection copy's stored size, the model's input size (the copy turned upright) and the
/// rotation between them.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    size: (usize, usize),
    input_size: (usize, usize),
    rotation: u32,
}

impl Geometry {
    /// Faces in upright detection-copy pixels mapped to a frame of `frame_w x frame_h` (stored
    /// orientation).
    fn to_frame(self, found: Vec<Face>, (frame_w, frame_h): (usize, usize)) -> Vec<Face> {
        let (w, h) = self.input_size;
        let turned = self.rotation == 90 || self.rotation == 270;
        let (dw, dh) = if turned { (frame_h, frame_w) } else { (frame_w, frame_h) };
        let (sx, sy) = (dw as f32 / w as f32, dh as f32 / h as f32);
        let rotation = self.rotation;
        found
            .into_iter()
            .map(|f| {
                map_face(f, |x, y| {
                    display_to_storage(x * sx, y * sy, rotation, (frame_w, frame_h))
                })
            })
            .collect()
    }
}

/// Fills `input` with the whole copy `det`, turned upright (one planar model input).
fn fill_full(det: &[u8], g: Geometry, input: &mut Vec<f32>) {
    let (w, h) = g.input_size;
    let plane = w * h;
    input.resize(3 * plane, 0.0);
    if g.rotation == 0 {
        for (i, px) in det.chunks_exact(3).enumerate().take(plane) {
            input[i] = px[0] as f32;
            input[plane + i] = px[1] as f32;
            input[2 * plane + i] = px[2] as f32;
        }
    } else {
        // Turn the stored copy upright while filling the input.
        let (sw, _) = g.size;
        for yd in 0..h {
            for xd in 0..w {
                let (xs, ys) = display_to_storage(xd as f32, yd as f32, g.rotation, g.size);
                let k = (ys as usize * sw + xs as usize) * 3;
                let i = yd * w + xd;
                input[i] = det[k] as f32;
                input[plane + i] = det[k + 1] as f32;
                input[2 * plane + i] = det[k + 2] as f32;
            }
        }
    }
}

/// A session of the detector that runs whole-frame passes on a thread of its own, ahead of the
/// frame-by-frame chain that follows the faces (a video's passes fall on frame numbers, so they
/// can be run before the chain reaches them): the same faces as [`Detector::pass`].
pub(crate) struct Passer {
    session: Session,
    input_name: String,
    input: Vec<f32>,
    geometry: Geometry,
    threshold: f32,
    nms_iou: f32,
    model_ns: std::sync::atomic::AtomicU64,
    runs: u64,
}

impl Passer {
    /// Whether this passer was made for a detection copy of `size` (stored orientation).
    pub(crate) fn fits(&self, size: (usize, usize)) -> bool {
        self.geometry.size == size
    }

    /// [`Detector::pass`] on this passer's session.
    pub(crate) fn pass(&mut self, det: &[u8], frame: (usize, usize)) -> Result<Vec<Face>> {
        fill_full(det, self.geometry, &mut self.input);
        self.runs += 1;
        let (w, h) = self.geometry.input_size;
        let found = run_batch(
            &mut self.session,
            &self.input_name,
            &self.input[..3 * w * h],
            (w, h),
            1,
            (self.threshold, &self.model_ns),
        )?
        .pop()
        .unwrap_or_default();
        Ok(self.geometry.to_frame(nms(found, self.nms_iou), frame))
    }

    /// Passes run so far.
    pub(crate) fn runs(&self) -> u64 {
        self.runs
    }

    /// CPU time spent inside this passer's session runs so far.
    pub(crate) fn model_cpu(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.model_ns.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Fills `input` (one `nw x nh` model input, planar) with the window of the copy `det`
/// (packed RGB24 of `size`, stored orientation; `rotation` turns it upright) whose top-left
/// corner is (x0, y0) in upright copy pixels and whose pixels are `k` copy pixels wide:
/// bilinear, black outside. A tile at the copy's own scale on whole pixels of an upright copy is
/// copied as it is, which is what the bilinear read gives there.
fn fill_window(
    det: &[u8],
    size: (usize, usize),
    rotation: u32,
    (x0, y0, k): (f32, f32, f32),
    (nw, nh): (usize, usize),
    input: &mut [f32],
) {
    let plane = nw * nh;
    input.fill(0.0);
    let (sw, sh) = size;
    if k == 1.0 && rotation == 0 && x0.fract() == 0.0 && y0.fract() == 0.0 && x0 >= 0.0 && y0 >= 0.0 {
        let (xa, ya) = (x0 as usize, y0 as usize);
        let cols = nw.min(sw.saturating_sub(xa));
        for yi in 0..nh.min(sh.saturating_sub(ya)) {
            let src = &det[((ya + yi) * sw + xa) * 3..][..cols * 3];
            for (xi, px) in src.chunks_exact(3).enumerate() {
                let i = yi * nw + xi;
                input[i] = px[0] as f32;
                input[plane + i] = px[1] as f32;
                input[2 * plane + i] = px[2] as f32;
            }
        }
        return;
    }
    fill_window_resampled(det, size, rotation, (x0, y0, k), (nw, nh), input);
}

/// [`fill_window`] by a bilinear read of every window pixel (`input` zeroed first).
fn fill_window_resampled(
    det: &[u8],
    (sw, sh): (usize, usize),
    rotation: u32,
    (x0, y0, k): (f32, f32, f32),
    (nw, nh): (usize, usize),
    input: &mut [f32],
) {
    let plane = nw * nh;
    for yi in 0..nh {
        for xi in 0..nw {
            let xd = x0 + (xi as f32 + 0.5) * k - 0.5;
            let yd = y0 + (yi as f32 + 0.5) * k - 0.5;
            let (xs, ys) = display_to_storage(xd, yd, rotation, (sw, sh));
            if xs < -0.5 || ys < -0.5 || xs > sw as f32 - 0.5 || ys > sh as f32 - 0.5 {
                continue;
            }
            let px = crate::kernels::sample::sample_rgb_f32(det, sw, sh, xs, ys);
            for (c, v) in px.into_iter().enumerate() {
                input[c * plane + yi * nw + xi] = v;
            }
        }
    }
}

/// Moves a face's box and landmarks through `f` (a map that may turn the picture).
fn map_face(mut face: Face, f: impl Fn(f32, f32) -> (f32, f32)) -> Face {
    let (ax, ay) = f(face.bbox[0], face.bbox[1]);
    let (bx, by) = f(face.bbox[2], face.bbox[3]);
    face.bbox = [ax.min(bx), ay.min(by), ax.max(bx), ay.max(by)];
    for lm in &mut face.landmarks {
        let (x, y) = f(lm[0], lm[1]);
        *lm = [x, y];
    }
    face
}

#[cfg(test)]
mod tests {
    use super::*;

    fn face(b: [f32; 4], score: f32) -> Face {
        Face {
            bbox: b,
            score,
            ..Default::default()
        }
    }

    /// The blocks' means run by run are the pixel-by-pixel ones (each pixel's block by its
    /// own division), at sizes whose width the blocks divide and do not.
    #[test]
    fn block_means_run_by_run_are_the_pixel_by_pixel_ones() {
        for (w, h) in [(640usize, 352usize), (333, 187), (17, 16), (20, 9)] {
            let det: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
            let n = SCENE_BLOCKS * SCENE_BLOCKS;
            let (mut sums, mut counts) = (vec![0u32; n], vec![0u32; n]);
            block_means(&det, (w, h), &mut sums, &mut counts);
            let (mut want, mut want_counts) = (vec![0u32; n], vec![0u32; n]);
            for (y, row) in det.chunks_exact(3 * w).enumerate() {
                for (x, px) in row.chunks_exact(3).enumerate() {
                    let i = (y * SCENE_BLOCKS / h) * SCENE_BLOCKS + x * SCENE_BLOCKS / w;
                    want[i] += (px[0] as u32 + 2 * px[1] as u32 + px[2] as u32) / 4;
                    want_counts[i] += 1;
                }
            }
            for (s, c) in want.iter_mut().zip(&want_counts) {
                *s /= (*c).max(1);
            }
            assert_eq!((sums, counts), (want, want_counts), "{w}x{h}");
        }
    }

    #[test]
    fn det_size_is_the_nearest_multiple_of_32_and_never_upscales() {
        assert_eq!(det_size(1920, 1080, 640), (640, 352));
        assert_eq!(det_size(1080, 1920, 640), (352, 640));
        assert_eq!(det_size(640, 360, 640), (640, 352));
        assert_eq!(det_size(320, 240, 640), (320, 256));
        assert_eq!(det_size(3840, 2160, 1280), (1280, 736));
        assert_eq!(det_size(100, 40, 640), (96, 32));
        assert_eq!(det_size(20, 10, 640), (32, 32));
    }

    #[test]
    fn display_points_map_back_to_the_stored_picture() {
        // A 4x2 stored picture; its corners under each display rotation.
        let size = (4, 2);
        // Rotated 90 degrees counterclockwise the picture is 2x4: its top-left shows the stored
        // top-right pixel.
        assert_eq!(display_to_storage(0.0, 0.0, 90, size), (3.0, 0.0));
        assert_eq!(display_to_storage(1.0, 3.0, 90, size), (0.0, 1.0));
        assert_eq!(display_to_storage(0.0, 0.0, 180, size), (3.0, 1.0));
        assert_eq!(display_to_storage(0.0, 0.0, 270, size), (0.0, 1.0));
        assert_eq!(display_to_storage(1.0, 3.0, 270, size), (3.0, 0.0));
        assert_eq!(display_to_storage(2.5, 1.5, 0, size), (2.5, 1.5));
    }

    /// A tile at the copy's own scale is copied as it is: the bilinear read of every pixel
    /// gives the same input, inside the copy and past its right and bottom edges.
    #[test]
    fn a_tile_at_the_copys_scale_is_its_pixels() {
        let (sw, sh) = (100usize, 70usize);
        let det: Vec<u8> = (0..sw * sh * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        for (x0, y0, nw, nh) in [(32.0, 0.0, 64, 64), (64.0, 32.0, 64, 64), (0.0, 0.0, 128, 96)] {
            let (mut a, mut b) = (vec![1.0; 3 * nw * nh], vec![0.0; 3 * nw * nh]);
            fill_window(&det, (sw, sh), 0, (x0, y0, 1.0), (nw, nh), &mut a);
            fill_window_resampled(&det, (sw, sh), 0, (x0, y0, 1.0), (nw, nh), &mut b);
            assert_eq!(a, b, "tile at ({x0}, {y0}) of {nw}x{nh}");
        }
    }

    #[test]
    fn iou_of_known_boxes() {
        assert_eq!(iou(&[0.0, 0.0, 10.0, 10.0], &[0.0, 0.0, 10.0, 10.0]), 1.0);
        assert_eq!(iou(&[0.0, 0.0, 10.0, 10.0], &[20.0, 20.0, 30.0, 30.0]), 0.0);
        assert!((iou(&[0.0, 0.0, 10.0, 10.0], &[5.0, 0.0, 15.0, 10.0]) - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn nms_keeps_the_best_of_each_cluster() {
        let faces = vec![
            face([0.0, 0.0, 10.0, 10.0], 0.6),
            face([1.0, 1.0, 11.0, 11.0], 0.9),
            face([50.0, 50.0, 60.0, 60.0], 0.7),
            face([51.0, 50.0, 61.0, 60.0], 0.2),
            face([100.0, 0.0, 110.0, 10.0], 0.5),
        ];
        let kept = nms(faces, 0.3);
        let scores: Vec<f32> = kept.iter().map(|f| f.score).collect();
        assert_eq!(scores, vec![0.9, 0.7, 0.5]);
        assert!(nms(Vec::new(), 0.3).is_empty());
    }

    #[test]
    fn decode_maps_places_a_peak_where_it_is() {
        let (h, w) = (8, 8);
        let plane = h * w;
        let mut heat = vec![0.0; plane];
        heat[3 * w + 5] = 0.9; // row 3, col 5
        let scale = vec![(10.0f32 / 4.0).ln(); 2 * plane]; // 10 px boxes
        let offset = vec![0.0; 2 * plane];
        let lms = vec![0.5; 10 * plane];
        let faces = decode_maps(&heat, &scale, &offset, &lms, (h, w), (32, 32), 0.5);
        assert_eq!(faces.len(), 1);
        let f = &faces[0];
        // centre (5.5 * 4, 3.5 * 4) = (22, 14), 10 px box
        assert!((f.bbox[0] - 17.0).abs() < 1e-4 && (f.bbox[1] - 9.0).abs() < 1e-4);
        assert!((f.bbox[2] - 27.0).abs() < 1e-4 && (f.bbox[3] - 19.0).abs() < 1e-4);
        assert!((f.landmarks[0][0] - 22.0).abs() < 1e-4 && (f.landmarks[0][1] - 14.0).abs() < 1e-4);
    }
}
