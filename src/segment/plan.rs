//! Planning a long video's segments: in, the source (its video packets read once, nothing
//! decoded) and the settings; out, the display-order timestamp of every frame, its keyframes,
//! and the segments (frame ranges cut at keyframes, about `--segment` seconds each) with the
//! warm-up each decodes before its first frame.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::config::Treatment;
use crate::engine::CancelToken;
use crate::media::decode::{read_packet, SourceInfo};

/// What one pass over a video's packets finds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Scan {
    /// Every shown frame's timestamp (stream time base), in display order.
    pub(crate) pts: Vec<i64>,
    /// The keyframes: each one's frame number and the timestamp to seek to for it.
    pub(crate) keys: Vec<(u64, i64)>,
}

/// One segment: frames `start..end` written, decoded from the keyframe at `seek` (the start of
/// the file when `None`), the frames from `warm_from` to `start` run as its warm-up and those
/// from `end` to `until` as its look-ahead (the smoother places a frame's points from frames
/// after it too).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Segment {
    pub number: usize,
    pub start: u64,
    pub end: u64,
    pub(crate) warm_from: u64,
    pub until: u64,
    pub(crate) seek: Option<i64>,
}

impl Segment {
    pub fn frames(&self) -> u64 {
        self.end - self.start
    }

    /// Warm-up and look-ahead frames run through the pipeline and not written.
    pub fn warm_frames(&self) -> u64 {
        self.start - self.warm_from + self.until - self.end
    }
}

/// Reads the video packets of `src` (no decoding): every shown frame's timestamp and the
/// keyframes. `None` when the stream cannot be cut by timestamps (packets without one, two
/// frames at one time): such a video runs as one segment.
pub(crate) fn scan(src: &SourceInfo, cancel: &CancelToken) -> Result<Option<Scan>> {
    let mut ictx = crate::media::input::open_input(&src.path)?;
    let mut packet = ffmpeg_next::Packet::empty();
    let mut pts = Vec::new();
    let mut keys = Vec::new();
    let mut n = 0u64;
    loop {
        match read_packet(&mut ictx, &mut packet) {
            Ok(()) => {}
            Err(ffmpeg_next::Error::Eof) => break,
            Err(ffmpeg_next::Error::InvalidData) => continue,
            Err(e) => bail!("{}: read error while planning segments ({e})", src.path.display()),
        }
        if packet.stream() != src.stream_index {
            continue;
        }
        n += 1;
        if n.is_multiple_of(4096) && cancel.is_cancelled() {
            bail!("interrupted while planning segments");
        }
        // SAFETY: `packet` holds a packet just read; `flags` is a plain field.
        let flags = unsafe { (*ffmpeg_next::packet::Ref::as_ptr(&packet)).flags };
        if flags & ffmpeg_next::ffi::AV_PKT_FLAG_DISCARD != 0 {
            continue;
        }
        let Some(p) = packet.pts() else { return Ok(None) };
        if packet.is_key() {
            keys.push((p, packet.dts().map_or(p, |d| d.min(p))));
        }
        pts.push(p);
    }
    pts.sort_unstable();
    if pts.is_empty() || pts.windows(2).any(|w| w[0] == w[1]) {
        return Ok(None);
    }
    let keys = keys
        .into_iter()
        .filter_map(|(p, seek)| pts.binary_search(&p).ok().map(|i| (i as u64, seek)))
        .collect();
    Ok(Some(Scan { pts, keys }))
}

/// Frames before a segment's first frame that rebuild what a run from the start has there:
/// the temporal filter's reach, the smoother's look-back, and a few detection cycles for the
/// detector's tracking windows to settle on the same grid.
pub(crate) fn warm_up(t: &Treatment) -> u64 {
    let smooth = (2.0 * t.smooth.max(0.0)).ceil() as u64;
    crate::faces::temporal::reach(t.temporal) + smooth + 4 * u64::from(t.detection.every) + 16
}

/// The frames of the stretches the identity guard decides a track on afresh when it backs off
/// (see `people::GUARD_STRETCH`; what it gives a face depends on the track's faces since its
/// stretch began) and the hands stage starts its trackers afresh on (`faces::hands::STRETCH`,
/// with `--occlusion hands`): the least common multiple of those that apply, else 1. A
/// segment's warm-up counts back from the start of the stretch its first frame is in.
pub(crate) fn guard_stretch(t: &Treatment) -> u64 {
    let guard = if t.identity_guard == crate::faces::identity::Guard::BackOff {
        crate::people::GUARD_STRETCH
    } else {
        1
    };
    let hands = if t.occlusion == crate::faces::hands::Occlusion::Hands {
        crate::faces::hands::STRETCH
    } else {
        1
    };
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    guard / gcd(guard, hands) * hands
}

/// Frames after a segment's last one that its last frames depend on: the smoother's
/// look-ahead.
pub(crate) fn look_ahead(t: &Treatment) -> u64 {
    (2.0 * t.smooth.max(0.0)).ceil() as u64 + 1
}

/// Cuts the first `frames` frames of `scan` into segments at keyframes, each starting at the
/// first keyframe at least `seconds` after the previous start (a last piece shorter than half
/// of that joins the one before); `seconds` 0, or a video under one and a half times it, is one
/// segment. Each segment's warm-up is `warm` frames, decoded from the keyframe before, and its
/// look-ahead `ahead` frames (none past the last frame), the warm-up counted back from the
/// start of the `stretch` (see [`guard_stretch`]) its first frame is in.
pub(crate) fn cut(
    scan: &Scan,
    time_base: f64,
    seconds: f64,
    frames: u64,
    (warm, ahead, stretch): (u64, u64, u64),
) -> Vec<Segment> {
    let frames = frames.min(scan.pts.len() as u64);
    let time = |i: u64| (scan.pts[i as usize] - scan.pts[0]) as f64 * time_base;
    let mut starts = vec![0u64];
    if seconds > 0.0 && frames > 0 && time(frames - 1) >= 1.5 * seconds {
        for &(k, _) in &scan.keys {
            let last = *starts.last().expect("starts at 0");
            if k > last && k < frames && time(k) - time(last) >= seconds {
                starts.push(k);
            }
        }
        // A short last piece joins the one before.
        while starts.len() > 1 && time(frames - 1) - time(*starts.last().expect("two")) < seconds / 2.0 {
            starts.pop();
        }
    }
    let ends: Vec<u64> = starts.iter().skip(1).copied().chain([frames]).collect();
    starts
        .iter()
        .zip(ends)
        .enumerate()
        .map(|(number, (&start, end))| {
            // From the start of the stretch the first frame is in, where the guard decides its
            // tracks afresh.
            let warm_from = (start - start % stretch.max(1)).saturating_sub(warm);
            // The last keyframe at or before the first warm-up frame.
            let seek = (warm_from > 0)
                .then(|| scan.keys.iter().rev().find(|(k, _)| *k <= warm_from).map(|&(_, ts)| ts))
                .flatten();
            Segment {
                number,
                start,
                end,
                warm_from,
                until: (end + ahead).min(frames),
                seek,
            }
        })
        .collect()
}

/// A segment file's name in the work folder.
pub(crate) fn file_name(number: usize) -> String {
    format!("{number:05}.seg")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(frames: i64, gop: i64) -> Scan {
        Scan {
            pts: (0..frames).map(|i| i * 10).collect(),
            keys: (0..frames).step_by(gop as usize).map(|i| (i as u64, i * 10)).collect(),
        }
    }

    #[test]
    fn the_stretch_holds_the_guards_and_the_hands() {
        let mut t = Treatment::default();
        assert_eq!(guard_stretch(&t), 128);
        t.occlusion = crate::faces::hands::Occlusion::Off;
        assert_eq!(guard_stretch(&t), crate::people::GUARD_STRETCH);
        t.identity_guard = crate::faces::identity::Guard::Off;
        assert_eq!(guard_stretch(&t), 1);
        t.occlusion = crate::faces::hands::Occlusion::Hands;
        assert_eq!(guard_stretch(&t), crate::faces::hands::STRETCH);
    }

    #[test]
    fn segments_start_at_keyframes_about_the_set_length_apart() {
        // 100 frames of 0.1 s, a keyframe every 12.
        let s = scan(100, 12);
        let segs = cut(&s, 0.01, 2.0, 100, (30, 5, 1));
        let starts: Vec<u64> = segs.iter().map(|s| s.start).collect();
        assert_eq!(starts, vec![0, 24, 48, 72]);
        assert_eq!(segs.last().unwrap().end, 100);
        assert_eq!(
            (segs[0].until, segs[3].until),
            (29, 100),
            "a look-ahead, none past the end"
        );
        assert_eq!(segs[0].seek, None);
        assert_eq!(
            (segs[1].warm_from, segs[1].seek),
            (0, None),
            "the warm-up reaches the start"
        );
        assert_eq!((segs[2].warm_from, segs[2].seek), (18, Some(120)));
        // The guard's stretches of 40 frames: each warm-up from the start of its first frame's.
        let guarded = cut(&s, 0.01, 2.0, 100, (30, 5, 40));
        let from: Vec<u64> = guarded.iter().map(|s| s.warm_from).collect();
        assert_eq!(from, vec![0, 0, 10, 10]);
        assert_eq!(guarded[2].seek, Some(0), "the keyframe at or before frame 10");
        assert!(segs.windows(2).all(|w| w[0].end == w[1].start));
        // A short last piece joins the one before; short videos and 0 are one segment.
        assert_eq!(cut(&s, 0.01, 4.0, 100, (30, 5, 1)).len(), 2);
        assert_eq!(cut(&s, 0.01, 7.0, 100, (30, 5, 1)).len(), 1);
        assert_eq!(cut(&s, 0.01, 0.0, 100, (30, 5, 1)).len(), 1);
        // --frames cuts the plan.
        let segs = cut(&s, 0.01, 2.0, 50, (30, 5, 1));
        assert_eq!(segs.last().unwrap().end, 50);
    }
}
