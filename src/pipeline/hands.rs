//! The hands stage: in, face frames whose faces are placed (detected, smoothed, tracked); out,
//! the same frames with each face's hands in front of it as `Occluder`s in the model's crop
//! (`FaceJob::occluders`), where the paste keeps the original picture. One gated
//! `HandTracker` per face track (see `faces::hands`): a frame with no hand near a face and
//! nothing due runs no model for it, only a few hundred luma samples of its surroundings read
//! from the decoded picture.

use std::collections::HashMap;

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};

use super::ctx::{StageCtx, DEPTH};
use super::stages::recv;
use crate::faces::hands::{neighbourhood, ring_into, HandTracker, Hands, Look};
use crate::frame::{FaceFrame, Frame, Picture};
use crate::geom::{fit_similarity, Rect};
use crate::stats::{Clock, StageStat};

/// Runs each face's hand tracker on the frames of `rx` (see the module's words). Returns the
/// stage's statistics and the frames (not warm-up ones) on which a hand was kept in front of a
/// face.
pub(crate) fn hands(
    hands: &mut Hands,
    ctx: &StageCtx,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<(StageStat, u64)> {
    let mut clock = Clock::new("hands", DEPTH);
    let mut trackers: HashMap<u64, HandTracker> = HashMap::new();
    // The faces' surroundings, one buffer for the run.
    let mut around = Vec::new();
    let mut kept = 0;
    let at_start = hands.model_cpu();
    while let Some(mut ff) = recv(&rx, &mut clock) {
        let index = ff.frame.index;
        clock
            .time(|| frame_hands(hands, (&mut trackers, &mut around), ctx, &mut ff))
            .with_context(|| format!("hands stage, frame {index}"))?;
        if !ff.frame.warm && ff.faces.iter().any(|j| !j.occluders.is_empty()) {
            kept += 1;
        }
        if tx.send(ff).is_err() {
            break;
        }
    }
    let mut stat = clock.finish();
    let spent = hands.model_cpu();
    stat.model_cpu = (spent.palm + spent.landmarks).saturating_sub(at_start.palm + at_start.landmarks);
    stat.chain = true;
    tracing::debug!(
        "hands: {} palm detections, {} landmark runs",
        spent.palm_runs - at_start.palm_runs,
        spent.landmark_runs - at_start.landmark_runs
    );
    Ok((stat, kept))
}

/// One frame's faces: each face's tracker (by its track; a face without one, a still's, looks
/// afresh) looks at its surroundings and runs the models it needs; the hands found become the
/// face's occluders in its crop. Trackers of tracks not on the frame are dropped.
fn frame_hands(
    hands: &mut Hands,
    (trackers, around): (&mut HashMap<u64, HandTracker>, &mut Vec<f32>),
    ctx: &StageCtx,
    ff: &mut FaceFrame,
) -> Result<()> {
    let f = &mut ff.frame;
    let (w, h) = (f.width, f.height);
    trackers.retain(|t, _| ff.faces.iter().any(|j| j.track == Some(*t)));
    for job in &mut ff.faces {
        let face_box = job.face.bbox;
        let mut fresh = HandTracker::gated();
        let tracker = match job.track {
            Some(t) => trackers.entry(t).or_insert_with(HandTracker::gated),
            None => &mut fresh,
        };
        // The crop alignment will cut (the same fit of the same points).
        let to_crop = fit_similarity(&job.face.landmarks, &ctx.template);
        let to_frame = to_crop.inverse().unwrap_or(crate::geom::Affine::IDENTITY);
        {
            let mut luma = luma_reader(f);
            ring_into(&to_frame, ctx.size, &mut luma, around);
        }
        let look = tracker.look(f.index, around);
        if look != Look::Nothing {
            if let Some(r) = reach(face_box, (w, h)) {
                crate::media::color::ensure_rgb(f, r);
            }
        }
        let found = tracker.next_looked(hands, &f.rgb, (w, h), face_box, (f.index, look), around)?;
        if found.is_empty() {
            continue;
        }
        let size = ctx.size as f32;
        job.occluders = found
            .iter()
            .map(|hand| hand.occluder(&to_crop))
            .filter(|o| {
                // Only hands over the crop.
                o.strokes.iter().any(|(a, b, r)| {
                    [a, b]
                        .iter()
                        .any(|p| p[0] > -r && p[1] > -r && p[0] < size + r && p[1] < size + r)
                })
            })
            .collect();
    }
    Ok(())
}

/// What the hand models may read round a face: its neighbourhood grown to twice its side round
/// its centre (a hand's crop reaches past the neighbourhood), clipped to the frame.
fn reach(face_box: [f32; 4], (w, h): (usize, usize)) -> Option<Rect> {
    let [x0, y0, x1, y1] = neighbourhood(face_box, (w, h))?;
    let (cx, cy) = ((x0 + x1) / 2.0, (y0 + y1) / 2.0);
    let half = (x1 - x0).max(y1 - y0);
    let clamp = |v: f32, hi: usize| v.clamp(0.0, hi as f32) as usize;
    let r = Rect::new(
        clamp((cx - half).floor(), w),
        clamp((cy - half).floor(), h),
        clamp((cx + half).ceil(), w),
        clamp((cy + half).ceil(), h),
    );
    (!r.is_empty()).then_some(r)
}

/// A reader of one frame pixel's luma, its coordinates clamped to the frame: from the decoded
/// picture's luma plane where the frame's RGB holds only regions (a yuv420p source; nothing is
/// converted for it), else from the RGB (BT.601 weights). A frame without pixels reads 0.
fn luma_reader(f: &Frame) -> impl FnMut(f32, f32) -> f32 + '_ {
    let (w, h) = (f.width, f.height);
    let plane = match &f.picture {
        Picture::RgbOf {
            source, partial: true, ..
        }
        | Picture::Planes {
            source, partial: true, ..
        } => Some((source.data(0), source.stride(0))),
        _ => None,
    };
    let rgb = &f.rgb;
    move |x: f32, y: f32| {
        if w == 0 || h == 0 {
            return 0.0;
        }
        let (x, y) = ((x.max(0.0) as usize).min(w - 1), (y.max(0.0) as usize).min(h - 1));
        match plane {
            Some((data, stride)) => data.get(y * stride + x).copied().map_or(0.0, f32::from),
            None => rgb.get(3 * (y * w + x)..3 * (y * w + x) + 3).map_or(0.0, |p| {
                (0.299 * f32::from(p[0]) + 0.587 * f32::from(p[1]) + 0.114 * f32::from(p[2])).round()
            }),
        }
    }
}
