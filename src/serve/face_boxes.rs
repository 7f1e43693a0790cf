//! Where a job found its faces, as the page draws them: in, the run's faces record (one entry a
//! frame, every field); out, a small `faces.json` in the job's folder with the picture's size
//! and each kept frame's boxes, at most [`MAX_FRAMES`] frames however long the clip.

use std::fmt;
use std::io::BufReader;
use std::path::Path;

use anyhow::{Context, Result};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::media::decode::SourceInfo;

/// The most frames the record keeps: a longer clip keeps every 2nd, 4th, ... frame.
pub(super) const MAX_FRAMES: usize = 2000;

/// The most boxes kept of one frame (the largest).
pub(super) const MAX_BOXES: usize = 32;

/// The name of the record in a job's folder.
pub(super) const FILE: &str = "faces.json";

/// The name of the run's whole record while the job runs (removed once made small).
pub(super) const RAW: &str = "faces-run.json";

/// One frame's entry of the run's record: only the boxes are read.
#[derive(Deserialize)]
struct RawFrame {
    frame: u64,
    #[serde(default)]
    faces: Vec<RawFace>,
}

#[derive(Deserialize)]
struct RawFace {
    bbox: [Option<f32>; 4],
    #[serde(default)]
    track: Option<u64>,
    /// Who the pasted face still is, its blend (the identity guard's), its quality before and
    /// after, where the run measured them.
    #[serde(default)]
    identity: Option<f32>,
    #[serde(default)]
    blend: Option<f32>,
    #[serde(default)]
    quality: Option<RawQuality>,
    /// Why the face was left alone (the job's selection), when it was.
    #[serde(default)]
    left: Option<String>,
}

#[derive(Deserialize)]
struct RawQuality {
    before: f32,
    after: f32,
}

/// What a job's faces became, for the page: the worst track's identity (1 unchanged, below 0.5
/// another person), the tracks the identity guard backed off, and the faces' median quality
/// before and after (BRISQUE, lower is better), where the run measured them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct Faithful {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) identity: Option<f32>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub(crate) guarded: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) quality_before: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) quality_after: Option<f32>,
    /// Faces found and left alone (the job's selection: `min-face`, `only-face`,
    /// `skip-face`), by why.
    #[serde(skip_serializing_if = "left_none", default)]
    pub(crate) left: crate::stats::Left,
}

fn left_none(l: &crate::stats::Left) -> bool {
    l.total() == 0
}

/// The figures of every face measured, gathered as the record is read.
#[derive(Default)]
struct Figures {
    /// The job's blend: a face pasted at less was backed off by the identity guard.
    blend: f32,
    /// Per track (`u64::MAX`: faces without one): identities measured.
    identity: std::collections::BTreeMap<u64, Vec<f32>>,
    guarded: std::collections::BTreeSet<u64>,
    quality: Vec<[f32; 2]>,
    left: crate::stats::Left,
}

impl Figures {
    fn take(&mut self, face: &RawFace) {
        // The record's blend is the job's times the guard's share.
        let track = face.track.unwrap_or(u64::MAX);
        if let Some(i) = face.identity {
            self.identity.entry(track).or_default().push(i);
        }
        if face.blend.is_some_and(|b| b < self.blend - 1e-4) {
            self.guarded.insert(track);
        }
        if let Some(q) = &face.quality {
            self.quality.push([q.before, q.after]);
        }
        if let Some(why) = &face.left {
            self.left.add(why);
        }
    }

    /// The worst track's median identity, the tracks backed off, the median quality.
    fn summary(&self) -> Faithful {
        let median = |mut v: Vec<f32>| {
            v.sort_by(f32::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let worst = self
            .identity
            .values()
            .filter_map(|v| median(v.clone()))
            .min_by(f32::total_cmp);
        Faithful {
            identity: worst,
            guarded: self.guarded.iter().copied().filter(|&t| t != u64::MAX).collect(),
            quality_before: median(self.quality.iter().map(|q| q[0]).collect()),
            quality_after: median(self.quality.iter().map(|q| q[1]).collect()),
            left: self.left,
        }
    }
}

/// One kept frame: its index, its time in seconds (clips) and its boxes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(super) struct Frame {
    pub(crate) frame: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) t: Option<f64>,
    pub(crate) boxes: Vec<[u32; 4]>,
}

/// The record the service keeps and `GET /v1/jobs/{id}/faces` answers.
#[derive(Serialize, Deserialize, Debug)]
pub(super) struct Faces {
    pub(crate) width: usize,
    pub(crate) height: usize,
    /// Frames a second (clips).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) fps: Option<f64>,
    /// Every how many frames one is kept (1: all).
    pub(crate) every: u64,
    pub(crate) frames: Vec<Frame>,
    /// What the faces became (see [`Faithful`]).
    #[serde(default)]
    pub(crate) faithful: Faithful,
}

/// Reads the run's record frame by frame, keeping every `every`-th one and doubling `every`
/// whenever more than [`MAX_FRAMES`] are kept: memory stays flat however long the clip.
struct Sampler {
    /// The frames' size as decoded (a still's turned upright, a video's as stored).
    size: (usize, usize),
    /// A video's display rotation (degrees counterclockwise) and mirror: boxes are turned to
    /// the picture as a player shows it.
    turn: (u32, bool),
    every: u64,
    kept: Vec<(u64, Vec<[u32; 4]>)>,
    figures: Figures,
}

impl Sampler {
    fn take(&mut self, f: RawFrame) {
        if !f.frame.is_multiple_of(self.every) {
            return;
        }
        for face in &f.faces {
            self.figures.take(face);
        }
        let (w, h) = (self.size.0 as f32, self.size.1 as f32);
        let mut boxes: Vec<[u32; 4]> = f
            .faces
            .iter()
            .filter_map(|face| {
                let [x0, y0, x1, y1] = face.bbox;
                let (x0, y0, x1, y1) = (
                    x0?.clamp(0.0, w),
                    y0?.clamp(0.0, h),
                    x1?.clamp(0.0, w),
                    y1?.clamp(0.0, h),
                );
                (x1 > x0 && y1 > y0).then(|| shown([x0, y0, x1, y1], (w, h), self.turn))
            })
            .collect();
        let area = |b: &[u32; 4]| u64::from(b[2] - b[0]) * u64::from(b[3] - b[1]);
        boxes.sort_by_key(|b| std::cmp::Reverse(area(b)));
        boxes.truncate(MAX_BOXES);
        self.kept.push((f.frame, boxes));
        while self.kept.len() > MAX_FRAMES {
            self.every *= 2;
            let every = self.every;
            self.kept.retain(|(i, _)| i.is_multiple_of(every));
        }
    }
}

impl<'de> Visitor<'de> for &mut Sampler {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of frame records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(frame) = seq.next_element::<RawFrame>()? {
            self.take(frame);
        }
        Ok(())
    }
}

/// A box of a frame of `size` as decoded, in pixels of the picture as shown: turned by a
/// video's display rotation (the inverse of [`crate::geom::display_to_storage`]), then mirrored.
fn shown([x0, y0, x1, y1]: [f32; 4], (w, h): (f32, f32), (rotation, mirror): (u32, bool)) -> [u32; 4] {
    let (mut b, dw) = match rotation {
        90 => ([y0, w - x1, y1, w - x0], h),
        180 => ([w - x1, h - y1, w - x0, h - y0], w),
        270 => ([h - y1, x0, h - y0, x1], h),
        _ => ([x0, y0, x1, y1], w),
    };
    if mirror {
        b = [dw - b[2], b[1], dw - b[0], b[3]];
    }
    b.map(|v| v.round().max(0.0) as u32)
}

/// The picture's size as shown (a still upright, a video turned by its display rotation).
fn picture_size(source: &SourceInfo) -> (usize, usize) {
    let (w, h) = source.upright_size();
    if source.rotation % 180 == 90 {
        (h, w)
    } else {
        (w, h)
    }
}

/// Makes the small record of `raw` (the run's faces record) for `source`, whose job pasted at
/// `blend`.
pub(super) fn compact(raw: &Path, source: &SourceInfo, photo: bool, blend: f32) -> Result<Faces> {
    let file = std::fs::File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    let mut sampler = Sampler {
        size: source.upright_size(),
        turn: (source.rotation, source.mirror),
        every: 1,
        kept: Vec::new(),
        figures: Figures {
            blend,
            ..Default::default()
        },
    };
    let mut de = serde_json::Deserializer::from_reader(BufReader::new(file));
    de.deserialize_seq(&mut sampler).context("reading the faces record")?;
    let fps = Some(f64::from(source.avg_frame_rate)).filter(|f| !photo && f.is_finite() && *f > 0.0);
    let (width, height) = picture_size(source);
    let every = sampler.every;
    let faithful = sampler.figures.summary();
    let frames = sampler
        .kept
        .into_iter()
        .map(|(frame, boxes)| Frame {
            frame,
            t: fps.map(|f| (frame as f64 / f * 1000.0).round() / 1000.0),
            boxes,
        })
        .collect();
    Ok(Faces {
        width,
        height,
        fps,
        every,
        frames,
        faithful,
    })
}

/// Makes `dir`'s small record of its run's record (a job pasted at `blend`), which goes: kept
/// only when made whole. Returns what the faces became.
pub(super) fn keep(dir: &Path, source: &SourceInfo, photo: bool, blend: f32) -> Result<Faithful> {
    let raw = dir.join(RAW);
    let made = compact(&raw, source, photo, blend).and_then(|faces| {
        crate::output::write_atomic(&dir.join(FILE), &serde_json::to_vec(&faces)?)
            .with_context(|| format!("writing {FILE}"))?;
        Ok(faces.faithful)
    });
    std::fs::remove_file(&raw).ok();
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(w: usize, h: usize) -> Sampler {
        Sampler {
            size: (w, h),
            turn: (0, false),
            every: 1,
            kept: Vec::new(),
            figures: Figures {
                blend: 1.0,
                ..Default::default()
            },
        }
    }

    #[test]
    fn boxes_are_clamped_to_the_picture_largest_first() {
        let mut s = sampler(100, 80);
        let raw = r#"[{"frame":0,"regions":[],"faces":[{"bbox":[10,10,20,20],"score":0.9},{"bbox":[-5,30,150.4,90],"score":0.8},{"bbox":[null,1,2,3]}]}]"#;
        serde_json::Deserializer::from_str(raw).deserialize_seq(&mut s).unwrap();
        assert_eq!(s.kept, vec![(0, vec![[0, 30, 100, 80], [10, 10, 20, 20]])]);
    }

    /// The worst track's identity, the tracks pasted at less than the job's blend, and the
    /// median quality are gathered from the faces measured.
    #[test]
    fn what_the_faces_became() {
        let mut s = sampler(100, 80);
        let raw = r#"[{"frame":0,"faces":[{"bbox":[1,1,9,9],"track":0,"identity":0.9,"blend":1.0,"quality":{"before":40,"after":20}},{"bbox":[20,1,29,9],"track":1,"identity":0.55,"blend":0.5}]},
            {"frame":1,"faces":[{"bbox":[1,1,9,9],"track":0,"identity":0.8,"blend":1.0,"quality":{"before":42,"after":30}},{"bbox":[20,1,29,9],"track":1,"blend":0.5}]}]"#;
        serde_json::Deserializer::from_str(raw).deserialize_seq(&mut s).unwrap();
        let f = s.figures.summary();
        assert_eq!(f.identity, Some(0.55));
        assert_eq!(f.guarded, vec![1]);
        assert_eq!((f.quality_before, f.quality_after), (Some(42.0), Some(30.0)));
    }

    #[test]
    fn a_turned_video_boxes_as_shown() {
        // A 100x80 frame stored, shown 80x100 turned 90 degrees counterclockwise: its stored top
        // right corner is shown at the top left.
        let b = [90.0, 0.0, 100.0, 10.0];
        assert_eq!(shown(b, (100.0, 80.0), (90, false)), [0, 0, 10, 10]);
        assert_eq!(shown(b, (100.0, 80.0), (270, false)), [70, 90, 80, 100]);
        assert_eq!(shown(b, (100.0, 80.0), (180, false)), [0, 70, 10, 80]);
        assert_eq!(shown(b, (100.0, 80.0), (0, true)), [0, 0, 10, 10]);
        assert_eq!(shown(b, (100.0, 80.0), (0, false)), [90, 0, 100, 10]);
    }

    #[test]
    fn a_long_clip_keeps_at_most_max_frames_evenly() {
        let mut s = sampler(10, 10);
        for i in 0..(MAX_FRAMES as u64 * 5 + 7) {
            s.take(RawFrame {
                frame: i,
                faces: vec![RawFace {
                    bbox: [Some(1.0), Some(1.0), Some(5.0), Some(5.0)],
                    track: None,
                    identity: None,
                    blend: None,
                    quality: None,
                    left: None,
                }],
            });
        }
        assert!(
            s.kept.len() <= MAX_FRAMES && s.kept.len() > MAX_FRAMES / 4,
            "{}",
            s.kept.len()
        );
        assert_eq!(s.every, 8);
        assert!(s.kept.iter().all(|(i, _)| i.is_multiple_of(8)));
    }
}
