//! The values that flow between stages: in, a decoded picture; out, the same picture with its
//! faces, their alignment and (after enhancement) their restored crops attached.

use ffmpeg_next::util::frame::video::Video as VideoFrame;

use serde::Serialize;

use crate::geom::{Affine, Rect};

/// The before/after view written instead of the restored picture (`--compare`; made by
/// `media::compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// Original on the left, restored on the right: twice the source's width.
    Side,
    /// Left half of the picture original, right half restored: the source's size.
    Split,
}

impl std::fmt::Display for Compare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compare::Side => "side",
            Compare::Split => "split",
        })
    }
}

/// How one picture is shown: its blend of the restored face (0 the original, 1 the restored)
/// and its before/after view. The treatment gives every picture's; a service's request may
/// bring its own (`?blend=`, `?compare=`), which its frame then carries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct View {
    pub blend: f32,
    pub compare: Option<Compare>,
}

/// One decoded frame, with where it sits in the source: its picture (see [`Picture`]: the
/// decoded planes the paste's changes go into, or whole RGB), the face regions' packed RGB the
/// crop warp reads where it needs them, and the detector's downscaled copy.
pub struct Frame {
    /// Position in decode order of output frames (0-based).
    pub index: u64,
    /// Presentation timestamp in the source stream's time base, as decoded.
    pub pts: Option<i64>,
    pub width: usize,
    pub height: usize,
    /// Packed RGB24, `width * height * 3` bytes, no padding. When the picture is `partial`
    /// only the face regions hold it: see [`crate::media::color::ensure_rgb`].
    pub rgb: Vec<u8>,
    /// Downscaled packed RGB24 copy for the detector (`det_width * det_height * 3`).
    pub det: Vec<u8>,
    /// The detection copy's (width, height).
    pub det_size: (usize, usize),
    /// Which picture of an image stream the frame is (0 in a single run).
    pub item: usize,
    /// A segment's warm-up frame: it goes through the pipeline to rebuild what earlier frames
    /// leave behind (tracks, the temporal filter) but is not written.
    pub warm: bool,
    /// This picture's own blend and compare view, where they differ from the stream's (a
    /// service's requests each bring theirs).
    pub(crate) view: Option<View>,
    /// Set when the picture is no longer wanted (a service's request past its deadline): its
    /// faces are not sent to the model.
    pub dropped: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// What the output is made from (and what of the decoded picture is kept).
    pub picture: Picture,
    /// The detector's whole-frame pass over `det`, run ahead of the detect stage's chain on a
    /// frame where one falls due by its number (frame pixels, best first), if it was.
    pub pass: Option<Vec<Face>>,
    /// The frame's place in its line's budget of frames in flight, given back when the frame is
    /// dropped (a video's decode stage takes it; other frames have none).
    pub(crate) ticket: Option<crate::budget::Ticket>,
}

/// What a frame's output is made from: its RGB picture, or the decoded picture's own planes.
pub enum Picture {
    /// `rgb` is the whole picture and the output; nothing decoded is kept (a still turned
    /// upright, a side-by-side view, a test frame).
    Rgb,
    /// `rgb` is the output; `source` is the decoded picture as FFmpeg gave it (scene cuts read
    /// it). With `partial`, `rgb` holds only the regions filled from `source` so far (yuv420p
    /// sources), and the writer converts the rest from `source` and lays the pasted regions
    /// (`dirty`) over it.
    RgbOf {
        source: VideoFrame,
        partial: bool,
        /// Regions of `rgb` changed by paste-back.
        dirty: Vec<Rect>,
    },
    /// The output is `source`'s own planes with `changes` added (planar YUV sources going to a
    /// video): `rgb` (whole, or with `partial` only the regions filled from `source`) is only
    /// read for the crops, never written back, so pixels away from the model's changes keep
    /// their values exactly, at the source's depth and chroma layout.
    Planes {
        source: VideoFrame,
        partial: bool,
        /// What paste-back changed, in RGB levels.
        changes: Vec<Change>,
    },
}

impl Picture {
    /// The decoded picture, if it is kept.
    pub fn source(&self) -> Option<&VideoFrame> {
        match self {
            Picture::Rgb => None,
            Picture::RgbOf { source, .. } | Picture::Planes { source, .. } => Some(source),
        }
    }

    /// The decoded picture, when `rgb` holds only the regions filled from it so far.
    pub(crate) fn partial_source(&self) -> Option<&VideoFrame> {
        match self {
            Picture::RgbOf {
                source, partial: true, ..
            }
            | Picture::Planes {
                source, partial: true, ..
            } => Some(source),
            _ => None,
        }
    }

    /// Whether the output is the decoded picture's planes plus the paste's changes.
    pub(crate) fn is_planes(&self) -> bool {
        matches!(self, Picture::Planes { .. })
    }
}

impl Frame {
    /// A frame with no picture: for tests of stages that look only at faces and order.
    pub(crate) fn blank(index: u64) -> Frame {
        Frame {
            index,
            pts: Some(index as i64),
            width: 0,
            height: 0,
            rgb: Vec::new(),
            det: Vec::new(),
            det_size: (0, 0),
            item: 0,
            warm: false,
            view: None,
            dropped: None,
            picture: Picture::Rgb,
            pass: None,
            ticket: None,
        }
    }
}

/// What the paste changes over one frame region: per pixel of `rect`, row by row, the change of
/// R, G and B in levels, already weighted by the mask and the blend (zero where nothing is pasted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Change {
    pub(crate) rect: Rect,
    pub rgb: Vec<f32>,
}

/// A detected face in frame coordinates (written as is into `--faces-json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Face {
    /// x1, y1, x2, y2 in frame pixels.
    pub bbox: [f32; 4],
    pub score: f32,
    /// Left eye, right eye, nose, left mouth corner, right mouth corner (x, y).
    pub landmarks: [[f32; 2]; 5],
    /// The face's outline from the face mesh (forehead to chin and back, frame pixels), when
    /// the mesh ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outline: Option<Vec<[f32; 2]>>,
}

/// One face on its way through the stages: found by detection, aligned (its transform, frame
/// footprint and crop), then restored.
pub struct FaceJob {
    pub face: Face,
    /// Frame -> crop transform (identity until aligned).
    pub to_crop: Affine,
    /// The frame region the crop covers (clipped to the frame), if any; set at alignment.
    pub region: Option<Rect>,
    /// The aligned crop in planar RGB24 (`3 * size * size` bytes: the model's input before
    /// its float conversion, see [`crate::kernels::tensor::crop_to_tensor`]).
    pub crop: Vec<u8>,
    /// What the model changed in the crop, once enhanced: packed RGB of `size * size` in
    /// steps of [`CHANGE_STEPS`](crate::kernels::CHANGE_STEPS) (see [`crate::kernels::tensor::tensor_change`]).
    pub restored: Option<Vec<i16>>,
    /// The mesh outline in the model's crop (placed by the mesh's own five points, so the
    /// smoothing of the points does not move it), for the mesh paste mask.
    pub(crate) outline_crop: Option<Vec<[f32; 2]>>,
    /// The face's track (from the smoother), if it was linked to one.
    pub track: Option<u64>,
    /// Luma (levels) of the crop given to the model at half resolution, for the temporal
    /// filter (empty without it).
    pub luma: Vec<f32>,
    /// The face mesh doubts it is a face (presence below `--face-check`) and the detector is
    /// not confident: the smoother keeps it only if detections that look like a face confirm it
    /// where it lies (see [`crate::defaults::SUPPORT_SCORE`]).
    pub(crate) doubt: bool,
    /// Why the face is left alone (`small`, `not named`, `skipped`: see `people::Chooser`).
    pub left: Option<&'static str>,
    /// How much of who the face is its restoration kept (the cosine similarity of its identity
    /// descriptors before and after), where measured (see `people::IdentityMeter`).
    pub identity: Option<f32>,
    /// The blend the face was pasted at: the picture's, times the share of the model's change
    /// the identity guard gave its track (where the guard backs off).
    pub blend: Option<f32>,
    /// The fidelity the identity guard ran the face at, where it raised the run's.
    pub fidelity: Option<f32>,
    /// The face's no-reference quality (BRISQUE, lower is better) in the model's crop before
    /// and after restoration, where measured.
    pub quality: Option<[f32; 2]>,
    /// What lies in front of the face (hands), in the model's crop: the paste keeps the
    /// original picture there.
    pub(crate) occluders: Vec<Occluder>,
    /// The share of the face's paste mask held back for what lies in front of it, where
    /// anything did.
    pub held: Option<f32>,
}

impl FaceJob {
    /// A face just found, not yet aligned.
    pub fn detected(face: Face) -> Self {
        Self {
            face,
            to_crop: Affine::IDENTITY,
            region: None,
            crop: Vec::new(),
            restored: None,
            outline_crop: None,
            track: None,
            luma: Vec::new(),
            doubt: false,
            left: None,
            identity: None,
            blend: None,
            fidelity: None,
            quality: None,
            occluders: Vec::new(),
            held: None,
        }
    }
}

/// The envelope every stage from detection onward passes on: a frame with its faces (an empty
/// list for frames without faces).
pub(crate) struct FaceFrame {
    pub(crate) frame: Frame,
    pub(crate) faces: Vec<FaceJob>,
    /// Faces the job's selection leaves alone (each with [`FaceJob::left`]): recorded, never
    /// restored.
    pub(crate) left: Vec<FaceJob>,
}

/// A free list of reusable buffers shared between stages: the hot path takes a buffer here
/// instead of allocating, and whoever finishes with it puts it back. Bounded, so a burst never
/// keeps more than `cap` spare buffers alive.
pub struct Pool<T> {
    tx: crossbeam_channel::Sender<T>,
    rx: crossbeam_channel::Receiver<T>,
    /// Buffers made because none was spare: after warm-up, each one is a step up of resident
    /// memory (more frames in flight after a stall), logged at debug level.
    made: std::sync::atomic::AtomicUsize,
}

impl<T: Default> Pool<T> {
    pub fn new(cap: usize) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(cap.max(1));
        Self {
            tx,
            rx,
            made: Default::default(),
        }
    }

    /// A spare buffer, or a new empty one.
    pub fn get(&self) -> T {
        self.rx.try_recv().unwrap_or_else(|_| {
            let made = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            tracing::debug!(made, kind = std::any::type_name::<T>(), "pool buffer made");
            T::default()
        })
    }

    /// How many buffers this pool has made so far.
    pub fn made(&self) -> usize {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Returns a buffer for reuse (dropped when the pool is full).
    pub fn put(&self, x: T) {
        let _ = self.tx.try_send(x);
    }
}

impl<T> Pool<Vec<T>> {
    /// Returns a vector for reuse unless it holds no memory (one given back earlier: see the
    /// alignment stage), so the pool's places keep real buffers.
    pub(crate) fn put_vec(&self, v: Vec<T>) {
        if v.capacity() > 0 {
            self.put(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pool;

    #[test]
    fn a_pool_counts_only_the_buffers_it_had_to_make() {
        let pool: Pool<Vec<u8>> = Pool::new(2);
        let (a, b) = (pool.get(), pool.get());
        assert_eq!(pool.made(), 2);
        pool.put(a);
        pool.put(b);
        let (a, b) = (pool.get(), pool.get());
        assert_eq!(pool.made(), 2, "spare buffers were handed out again");
        pool.put(a);
        pool.put(b);
        pool.put(Vec::new()); // over the cap: dropped
        let _ = (pool.get(), pool.get(), pool.get());
        assert_eq!(pool.made(), 3);
    }
}

/// Something in front of a face, in crop pixels, where the paste keeps the original picture:
/// round-ended strokes (a finger's bone, its two ends and half its width) and filled polygons
/// (a palm), feathered over `feather` pixels outside them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Occluder {
    pub(crate) strokes: Vec<([f32; 2], [f32; 2], f32)>,
    pub(crate) polygons: Vec<Vec<[f32; 2]>>,
    pub(crate) feather: f32,
}
