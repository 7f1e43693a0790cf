//! Temporal smoothing of face landmarks: in, each frame's detected faces in order; out, the same
//! faces with their five points smoothed over time along their track, a bounded number of frames
//! later (the look-ahead).
//!
//! Faces are linked into tracks frame to frame (box overlap, no jump). Each point of a track is
//! replaced by a Gaussian-weighted local *linear* fit over the track's samples within `radius`
//! frames on both sides: on a still face this is a Gaussian mean (jitter falls by about
//! `sqrt(3.5 sigma)`), and on a face moving at a steady speed the fit follows the motion with
//! no lag (a centred window of a straight line is the line). A track ends when its face is not
//! found, jumps (moves more than [`JUMP`] of its eye distance in one frame) or the scene cuts;
//! a face found after that starts a new track, so it is never pulled toward the old one.

use std::collections::VecDeque;

use ffmpeg_next::util::frame::video::Video as VideoFrame;

use crate::defaults::{SUPPORT_EYES, SUPPORT_FRAMES, SUPPORT_MOUTH, SUPPORT_REACH, SUPPORT_SCORE};
use crate::faces::detect::iou;
use crate::frame::{Face, FaceFrame};

/// A face moving more than this share of its eye distance between two frames has jumped (a
/// cut inside a shot, a different face in the same place): its track is ended.
pub(crate) const JUMP: f32 = 0.35;
/// Speed (share of the eye distance per frame) at which the smoothing window has narrowed to
/// sigma / sqrt(2).
const SPEED: f64 = 0.01;
/// Least box overlap between a face and its track's face of the previous frame.
const LINK_IOU: f32 = 0.3;
/// Blocks per side of the luma summary the scene-cut test compares.
const CUT_BLOCKS: usize = 8;
/// Mean absolute change of the block means (luma levels) that counts as a cut.
const CUT_LEVEL: u32 = 30;

type Points = [[f32; 2]; 5];

struct Track {
    id: u64,
    /// Still linked: the face was found on the last frame seen.
    live: bool,
    last_frame: u64,
    last_bbox: [f32; 4],
    last_points: Points,
    /// (frame, detected points), oldest first, only as far back as smoothing still needs.
    samples: VecDeque<(u64, Points)>,
}

/// The smoothing state of one job: tracks, the frames held for look-ahead, the cut detector.
pub(crate) struct Smoother {
    sigma: f32,
    radius: u64,
    tracks: Vec<Track>,
    next_id: u64,
    /// Frames waiting for their look-ahead, each with the track id of every face.
    held: VecDeque<(FaceFrame, Vec<u64>)>,
    summary: Vec<u32>,
    next_summary: Vec<u32>,
    /// Tracks started and ended by a jump, a cut or a loss (for the record).
    pub(crate) cuts: u64,
    /// Faces the mesh doubted, dropped and kept by their support.
    doubted: (u64, u64),
    /// Every face that supports the doubted faces where it lies ([`supports`]: frame, box),
    /// oldest first, as far back as a doubted face still held may look ([`SUPPORT_REACH`]).
    strong: VecDeque<(u64, [f32; 4])>,
}

impl Smoother {
    /// `sigma` in frames (0: off, frames pass straight through); the look-ahead is `2 sigma`.
    pub(crate) fn new(sigma: f32) -> Self {
        let sigma = if sigma.is_finite() { sigma.max(0.0) } else { 0.0 };
        Self {
            sigma,
            radius: (2.0 * sigma).ceil() as u64,
            tracks: Vec::new(),
            next_id: 0,
            held: VecDeque::new(),
            summary: Vec::new(),
            next_summary: Vec::new(),
            cuts: 0,
            doubted: (0, 0),
            strong: VecDeque::new(),
        }
    }

    /// The faces the mesh doubted ([`crate::frame::FaceJob::doubt`]) this smoother dropped and
    /// kept: one is kept when at least [`SUPPORT_FRAMES`] faces that support it ([`supports`])
    /// lie where it lies (its own included if it supports; boxes overlapping as tracks link
    /// them) within [`SUPPORT_REACH`] frames of it, behind it or in the look-ahead: a face the
    /// detector finds now and then where it was, even with its track broken by the frames it
    /// missed, or with its points misplaced on a frame or two; not texture the detector finds
    /// again and again in one place, its points huddled.
    pub(crate) fn doubted(&self) -> (u64, u64) {
        self.doubted
    }

    /// Frames this smoother can hold at once.
    pub(crate) fn capacity(&self) -> usize {
        self.radius as usize + 1
    }

    /// Takes the next frame; hands every frame whose look-ahead is complete to `emit`, in order
    /// (`emit` returns false to stop: the receiver has gone).
    pub(crate) fn push(&mut self, ff: FaceFrame, emit: &mut impl FnMut(FaceFrame) -> bool) -> bool {
        let n = ff.frame.index;
        let cut = ff.frame.picture.source().is_some_and(|s| self.scene_cut(s));
        let ids = self.link(n, &ff.faces.iter().map(|j| &j.face).collect::<Vec<_>>(), cut);
        let strong = ff.faces.iter().filter(|j| supports(&j.face));
        self.strong.extend(strong.map(|j| (n, j.face.bbox)));
        if self.radius == 0 {
            // No smoothing: the faces are only linked into tracks (the temporal filter follows
            // them).
            let mut ff = ff;
            for (job, id) in ff.faces.iter_mut().zip(&ids) {
                job.track = Some(*id);
            }
            self.judge_doubted(&mut ff);
            self.prune(n);
            return emit(ff);
        }
        self.held.push_back((ff, ids));
        while self.held.front().is_some_and(|(f, _)| f.frame.index + self.radius <= n) {
            if !self.emit_front(emit) {
                return false;
            }
        }
        self.prune(n);
        true
    }

    /// Hands out every frame still held (the input has ended).
    pub(crate) fn finish(&mut self, emit: &mut impl FnMut(FaceFrame) -> bool) -> bool {
        while !self.held.is_empty() {
            if !self.emit_front(emit) {
                return false;
            }
        }
        true
    }

    fn emit_front(&mut self, emit: &mut impl FnMut(FaceFrame) -> bool) -> bool {
        let (mut ff, ids) = self.held.pop_front().expect("checked by the caller");
        let n = ff.frame.index;
        for (job, id) in ff.faces.iter_mut().zip(&ids) {
            job.track = Some(*id);
            if let Some(t) = self.tracks.iter().find(|t| t.id == *id) {
                smooth_face(&mut job.face, &t.samples, n, self.sigma, self.radius);
            }
        }
        self.judge_doubted(&mut ff);
        emit(ff)
    }

    /// Keeps each face of `ff` the mesh doubted that others support, drops the others (see
    /// [`Smoother::doubted`]).
    fn judge_doubted(&mut self, ff: &mut FaceFrame) {
        if !ff.faces.iter().any(|j| j.doubt) {
            return;
        }
        let n = ff.frame.index;
        let (strong, doubted) = (&self.strong, &mut self.doubted);
        ff.faces.retain_mut(|job| {
            if !job.doubt {
                return true;
            }
            let support = strong
                .iter()
                .filter(|(f, b)| {
                    f + SUPPORT_REACH >= n && *f <= n + SUPPORT_REACH && iou(b, &job.face.bbox) >= LINK_IOU
                })
                .count();
            job.doubt = false;
            let keep = support >= SUPPORT_FRAMES;
            if keep {
                doubted.1 += 1;
            } else {
                doubted.0 += 1;
            }
            keep
        });
    }

    /// Links the faces of frame `n` to tracks (ending those not found), records their points and
    /// returns each face's track id.
    fn link(&mut self, n: u64, faces: &[&Face], cut: bool) -> Vec<u64> {
        let mut ids = vec![u64::MAX; faces.len()];
        let mut free: Vec<usize> = (0..self.tracks.len())
            .filter(|&i| {
                let t = &self.tracks[i];
                t.live && !cut && t.last_frame + 1 == n
            })
            .collect();
        // Best overlaps first, each track and face used once.
        let mut pairs: Vec<(f32, usize, usize)> = Vec::new();
        for (fi, f) in faces.iter().enumerate() {
            for &ti in &free {
                let t = &self.tracks[ti];
                let o = iou(&t.last_bbox, &f.bbox);
                if o >= LINK_IOU && !jumped(&t.last_points, &f.landmarks) {
                    pairs.push((o, fi, ti));
                }
            }
        }
        pairs.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (_, fi, ti) in pairs {
            if ids[fi] != u64::MAX || !free.contains(&ti) {
                continue;
            }
            free.retain(|&t| t != ti);
            let t = &mut self.tracks[ti];
            ids[fi] = t.id;
            t.last_frame = n;
            t.last_bbox = faces[fi].bbox;
            t.last_points = faces[fi].landmarks;
            t.samples.push_back((n, faces[fi].landmarks));
        }
        for t in &mut self.tracks {
            if t.live && t.last_frame != n {
                t.live = false;
                self.cuts += 1;
            }
        }
        for (fi, f) in faces.iter().enumerate() {
            if ids[fi] == u64::MAX {
                let id = self.next_id;
                self.next_id += 1;
                ids[fi] = id;
                self.tracks.push(Track {
                    id,
                    live: true,
                    last_frame: n,
                    last_bbox: f.bbox,
                    last_points: f.landmarks,
                    samples: VecDeque::from([(n, f.landmarks)]),
                });
            }
        }
        ids
    }

    /// Drops samples no held frame can use and tracks with none left.
    fn prune(&mut self, n: u64) {
        let oldest = self.held.front().map_or(n, |(f, _)| f.frame.index);
        let keep_from = oldest.saturating_sub(self.radius);
        for t in &mut self.tracks {
            while t.samples.front().is_some_and(|(f, _)| *f < keep_from) {
                t.samples.pop_front();
            }
        }
        self.tracks.retain(|t| t.live || !t.samples.is_empty());
        while self.strong.front().is_some_and(|(f, _)| f + SUPPORT_REACH < oldest) {
            self.strong.pop_front();
        }
    }

    /// Whether the picture's luma differs from the previous frame's as a new scene does.
    fn scene_cut(&mut self, src: &VideoFrame) -> bool {
        let (w, h) = (src.width() as usize, src.height() as usize);
        if w == 0 || h == 0 || src.planes() == 0 {
            return false;
        }
        let (stride, data) = (src.stride(0), src.data(0));
        let sums = &mut self.next_summary;
        sums.clear();
        sums.resize(2 * CUT_BLOCKS * CUT_BLOCKS, 0);
        // Every 8th pixel of every 8th row: enough for block means, a small cost per frame.
        for y in (0..h).step_by(8) {
            let by = y * CUT_BLOCKS / h;
            let row = &data[y * stride..y * stride + w];
            for x in (0..w).step_by(8) {
                let i = by * CUT_BLOCKS + x * CUT_BLOCKS / w;
                sums[2 * i] += row[x] as u32;
                sums[2 * i + 1] += 1;
            }
        }
        for i in 0..CUT_BLOCKS * CUT_BLOCKS {
            sums[2 * i] /= sums[2 * i + 1].max(1);
        }
        std::mem::swap(&mut self.summary, &mut self.next_summary);
        let (now, prev) = (&self.summary, &self.next_summary);
        if prev.len() != now.len() {
            return false;
        }
        let diff: u32 = (0..CUT_BLOCKS * CUT_BLOCKS)
            .map(|i| now[2 * i].abs_diff(prev[2 * i]))
            .sum();
        diff / (CUT_BLOCKS * CUT_BLOCKS) as u32 >= CUT_LEVEL
    }
}

/// Whether `face` supports the faces the mesh doubted where it lies (see [`SUPPORT_SCORE`]): it
/// scores at least that, and the mesh took it for a face (it has the mesh's outline) or its
/// five points are spread as a face's are: the eyes at least [`SUPPORT_EYES`] of its box's width
/// apart, the mouth corners at least [`SUPPORT_MOUTH`]. The points are the detector's here (a
/// doubted face keeps them, and the smoother reads them before smoothing).
fn supports(face: &Face) -> bool {
    if face.score < SUPPORT_SCORE {
        return false;
    }
    if face.outline.is_some() {
        return true;
    }
    let p = &face.landmarks;
    let width = (face.bbox[2] - face.bbox[0]).max(1.0);
    let apart = |a: [f32; 2], b: [f32; 2]| (a[0] - b[0]).hypot(a[1] - b[1]) / width;
    apart(p[0], p[1]) >= SUPPORT_EYES && apart(p[3], p[4]) >= SUPPORT_MOUTH
}

/// Distance between the eyes of a face's points (at least a pixel).
fn eye_distance(p: &Points) -> f32 {
    ((p[0][0] - p[1][0]).hypot(p[0][1] - p[1][1])).max(1.0)
}

/// The mean point moved more than [`JUMP`] eye distances.
fn jumped(a: &Points, b: &Points) -> bool {
    let moved: f32 = a
        .iter()
        .zip(b)
        .map(|(p, q)| (p[0] - q[0]).hypot(p[1] - q[1]))
        .sum::<f32>()
        / 5.0;
    moved > JUMP * eye_distance(a)
}

/// Replaces the points of the face at frame `n` by the Gaussian-weighted local linear fit of
/// the track's samples within `radius` frames; the box moves with the points' mean. The
/// Gaussian narrows with the face's speed (a first fit measures it): a still face gets the whole
/// `sigma`, a moving one less, so a start or stop of motion (a kink the line cannot follow)
/// is not rounded off.
fn smooth_face(face: &mut Face, samples: &VecDeque<(u64, Points)>, n: u64, sigma: f32, radius: u64) {
    let Some((_, speed)) = fit(face.landmarks, samples, n, sigma, radius) else {
        return;
    };
    let v0 = SPEED * eye_distance(&face.landmarks) as f64;
    let narrowed = (sigma as f64 / (1.0 + (speed / v0).powi(2)).sqrt()) as f32;
    let Some((out, _)) = fit(face.landmarks, samples, n, narrowed.max(0.5), radius) else {
        return;
    };
    let shift = |c: usize| out.iter().zip(&face.landmarks).map(|(a, b)| a[c] - b[c]).sum::<f32>() / 5.0;
    let (dx, dy) = (shift(0), shift(1));
    face.bbox = [
        face.bbox[0] + dx,
        face.bbox[1] + dy,
        face.bbox[2] + dx,
        face.bbox[3] + dy,
    ];
    face.landmarks = out;
}

/// The local linear fit at `n` with a Gaussian of `sigma`: the points, and the mean speed of
/// the points (pixels per frame, after the slope's shrinkage). `None` without samples.
fn fit(start: Points, samples: &VecDeque<(u64, Points)>, n: u64, sigma: f32, radius: u64) -> Option<(Points, f64)> {
    let near = || samples.iter().filter(|(f, _)| f.abs_diff(n) <= radius);
    let weight = |f: u64| {
        let d = f as f64 - n as f64;
        (-d * d / (2.0 * sigma as f64 * sigma as f64)).exp()
    };
    let (mut sw, mut st) = (0.0f64, 0.0f64);
    for (f, _) in near() {
        let w = weight(*f);
        sw += w;
        st += w * (*f as f64 - n as f64);
    }
    if sw <= 0.0 {
        return None;
    }
    let mt = st / sw;
    let stt: f64 = near()
        .map(|(f, _)| weight(*f) * (*f as f64 - n as f64 - mt).powi(2))
        .sum();
    let sww: f64 = near()
        .map(|(f, _)| weight(*f).powi(2) * (*f as f64 - n as f64 - mt).powi(2))
        .sum();
    let mut out = start;
    let mut speed = 0.0;
    for (k, o) in out.iter_mut().enumerate() {
        let mut v = [0.0f64; 2];
        for c in 0..2 {
            let (mut sx, mut stx) = (0.0f64, 0.0f64);
            for (f, p) in near() {
                let w = weight(*f);
                let x = p[k][c] as f64;
                sx += w * x;
                stx += w * (*f as f64 - n as f64 - mt) * x;
            }
            let mx = sx / sw;
            let mut slope = if stt > 1e-9 { stx / stt } else { 0.0 };
            // The slope is shrunk by how clearly it stands out of the noise (b^2 / (b^2 + var b)):
            // a moving face keeps it (no lag), a still one near the end of its track does not
            // extrapolate its jitter.
            if slope != 0.0 {
                let res: f64 = near()
                    .map(|(f, p)| {
                        let t = *f as f64 - n as f64 - mt;
                        weight(*f) * (p[k][c] as f64 - mx - slope * t).powi(2)
                    })
                    .sum::<f64>()
                    / sw;
                let var = res * sww / (stt * stt);
                slope *= slope * slope / (slope * slope + var);
            }
            v[c] = slope;
            // At n (t = 0 relative): the mean plus the slope times the distance from the mean time.
            o[c] = (mx + slope * (0.0 - mt)) as f32;
        }
        speed += v[0].hypot(v[1]) / 5.0;
    }
    Some((out, speed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FaceJob, Frame};

    fn points_at(x: f32, y: f32) -> Points {
        [
            [x, y],
            [x + 50.0, y],
            [x + 25.0, y + 25.0],
            [x + 8.0, y + 50.0],
            [x + 42.0, y + 50.0],
        ]
    }

    fn frame(index: u64, faces: &[Points]) -> FaceFrame {
        FaceFrame {
            frame: Frame::blank(index),
            faces: faces
                .iter()
                .map(|p| {
                    FaceJob::detected(Face {
                        bbox: [p[0][0] - 20.0, p[0][1] - 40.0, p[1][0] + 20.0, p[3][1] + 30.0],
                        score: 0.9,
                        landmarks: *p,
                        outline: None,
                    })
                })
                .collect(),
            left: Vec::new(),
        }
    }

    /// Runs `frames` through a smoother of `sigma`; the first face's points of every frame out.
    fn run(sigma: f32, frames: Vec<FaceFrame>) -> Vec<Option<Points>> {
        let mut s = Smoother::new(sigma);
        let mut out = Vec::new();
        let mut emit = |ff: FaceFrame| {
            out.push(ff.faces.first().map(|j| j.face.landmarks));
            true
        };
        for ff in frames {
            assert!(s.push(ff, &mut emit));
            assert!(s.held.len() <= s.capacity());
        }
        assert!(s.finish(&mut emit));
        out
    }

    /// A deterministic noise in [-1, 1] (splitmix64 of the frame and coordinate).
    fn noise(i: u64, k: usize) -> f32 {
        let mut z = (i * 16 + k as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    }

    #[test]
    fn a_still_face_is_steadied_and_every_frame_comes_out_in_order() {
        let frames: Vec<FaceFrame> = (0..60)
            .map(|i| {
                let mut p = points_at(100.0, 100.0);
                for (k, q) in p.iter_mut().enumerate() {
                    q[0] += 2.0 * noise(i, 2 * k);
                    q[1] += 2.0 * noise(i, 2 * k + 1);
                }
                frame(i, &[p])
            })
            .collect();
        let rms = |pts: &[Option<Points>]| {
            let truth = points_at(100.0, 100.0);
            let se: f32 = pts
                .iter()
                .flatten()
                .flat_map(|p| {
                    p.iter()
                        .zip(&truth)
                        .map(|(a, b)| (a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2))
                })
                .sum();
            (se / (5 * pts.len()) as f32).sqrt()
        };
        let (raw, smoothed) = (run(0.0, frames_clone(&frames)), run(5.0, frames));
        assert_eq!(smoothed.len(), 60);
        assert!(rms(&smoothed) < 0.45 * rms(&raw), "{} vs {}", rms(&smoothed), rms(&raw));
    }

    fn frames_clone(f: &[FaceFrame]) -> Vec<FaceFrame> {
        f.iter()
            .map(|ff| {
                frame(
                    ff.frame.index,
                    &ff.faces.iter().map(|j| j.face.landmarks).collect::<Vec<_>>(),
                )
            })
            .collect()
    }

    #[test]
    fn a_steady_pan_has_no_lag_and_a_jump_no_overshoot() {
        // 1.5 px per frame, then a jump of 100 px at frame 30.
        let x = |i: u64| 100.0 + 1.5 * i as f32 + if i >= 30 { 100.0 } else { 0.0 };
        let frames = (0..60).map(|i| frame(i, &[points_at(x(i), 80.0)])).collect();
        for (i, p) in run(5.0, frames).into_iter().enumerate() {
            let p = p.unwrap();
            assert!(
                (p[0][0] - x(i as u64)).abs() < 1e-3,
                "frame {i}: {} for {}",
                p[0][0],
                x(i as u64)
            );
        }
    }

    #[test]
    fn a_face_found_again_or_after_a_jump_keeps_its_own_points() {
        // Frames 0-9 a face at 100; 10-11 none; 12-19 a face at 130 (found again): its points
        // are its own, not pulled toward the old place.
        let frames = (0..20)
            .map(|i| match i {
                0..=9 => frame(i, &[points_at(100.0, 100.0)]),
                10 | 11 => frame(i, &[]),
                _ => frame(i, &[points_at(130.0, 100.0)]),
            })
            .collect();
        let out = run(5.0, frames);
        for p in &out[12..] {
            assert_eq!(p.unwrap()[0][0], 130.0);
        }
        // Two faces side by side are two tracks.
        let frames = (0..20)
            .map(|i| frame(i, &[points_at(100.0, 100.0), points_at(400.0, 100.0)]))
            .collect::<Vec<_>>();
        let mut s = Smoother::new(3.0);
        let mut out = Vec::new();
        for ff in frames {
            s.push(ff, &mut |ff: FaceFrame| {
                out.push(ff.faces.iter().map(|j| j.face.landmarks[0][0]).collect::<Vec<_>>());
                true
            });
        }
        s.finish(&mut |ff: FaceFrame| {
            out.push(ff.faces.iter().map(|j| j.face.landmarks[0][0]).collect::<Vec<_>>());
            true
        });
        assert!(out.iter().all(|v| v == &vec![100.0, 400.0]), "{out:?}");
    }

    /// Doubted faces found again and again in one place are kept when their points are spread
    /// as a face's are (a face the mesh doubts), dropped when the points huddle in the box's
    /// middle (texture), and kept where face-shaped detections around them support them.
    #[test]
    fn doubted_faces_are_kept_by_face_shaped_support_only() {
        // A box 90 px wide round the points; `spread` 1 is a face's points, 0.1 huddled ones.
        let doubted = |i: u64, spread: f32| {
            let mut ff = frame(i, &[points_at(100.0, 100.0)]);
            let job = &mut ff.faces[0];
            let c = [125.0, 125.0];
            for q in &mut job.face.landmarks {
                *q = [c[0] + (q[0] - c[0]) * spread, c[1] + (q[1] - c[1]) * spread];
            }
            (job.face.score, job.doubt) = (0.6, true);
            ff
        };
        let kept = |frames: Vec<FaceFrame>| {
            let mut s = Smoother::new(3.0);
            let mut kept = Vec::new();
            let mut emit = |ff: FaceFrame| {
                kept.push(ff.faces.len());
                true
            };
            for ff in frames {
                s.push(ff, &mut emit);
            }
            s.finish(&mut emit);
            kept
        };
        assert_eq!(kept((0..20).map(|i| doubted(i, 1.0)).collect()), vec![1; 20]);
        assert_eq!(kept((0..20).map(|i| doubted(i, 0.1)).collect()), vec![0; 20]);
        // Points misplaced on one frame of a face: the frames around it keep it.
        let mixed = (0..20).map(|i| doubted(i, if i == 10 { 0.1 } else { 1.0 })).collect();
        assert_eq!(kept(mixed), vec![1; 20]);
    }

    #[test]
    fn off_passes_frames_straight_through() {
        let mut s = Smoother::new(0.0);
        let mut seen = 0;
        assert!(s.push(frame(0, &[points_at(1.0, 2.0)]), &mut |_| {
            seen += 1;
            true
        }));
        assert_eq!(seen, 1);
    }
}
