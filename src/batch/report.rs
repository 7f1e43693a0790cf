//! The outcome of a batch run: in, what happened to each clip; out, the summary on stderr, the
//! JSON `--report` and the exit code.

use std::path::PathBuf;

use serde::Serialize;

/// A clip this run restored.
#[derive(Clone, Debug, Serialize)]
pub struct ClipDone {
    pub clip: String,
    pub frames: u64,
    pub faces: u64,
    pub seconds: f64,
    /// The restoration's flicker inside faces (levels of frame-to-frame change beyond the
    /// input's), for videos with tracked faces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flicker: Option<f64>,
    /// A long video restored in segments: what this process did of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segments: Option<String>,
}

/// A clip this run skipped or failed, and why.
#[derive(Clone, Debug, Serialize)]
pub struct ClipNote {
    pub clip: String,
    pub reason: String,
}

/// What the image streams of a batch did, over all its jobs: pictures written, faces
/// restored, model calls and how full they were.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ImageStream {
    pub images: u64,
    pub faces: u64,
    pub batches: u64,
    /// Crops per model call asked for.
    pub batch: usize,
    /// Faces over the room the batches had (batches times batch size): 1 when every call was
    /// full.
    pub mean_fill: f64,
    /// Batches times their size, summed.
    #[serde(skip)]
    room: u64,
}

impl ImageStream {
    /// One stream's figures from its run summary.
    pub fn of(summary: &crate::stats::Summary, batch: usize) -> Self {
        let batches: u64 = summary.workers.iter().map(|w| w.batches).sum();
        let faces: u64 = summary.workers.iter().map(|w| w.faces).sum();
        let room = batches * batch as u64;
        ImageStream {
            images: summary.frames,
            faces,
            batches,
            batch,
            mean_fill: faces as f64 / room.max(1) as f64,
            room,
        }
    }
}

/// What a batch run did; written as JSON by `--report`.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub in_dir: PathBuf,
    pub out_dir: PathBuf,
    pub shard: Option<String>,
    pub manifest: PathBuf,
    pub settings: String,
    pub jobs: usize,
    /// Ctrl-C or SIGTERM stopped the run early.
    pub interrupted: bool,
    /// The exit status for that (130 Ctrl-C, 143 SIGTERM).
    #[serde(skip)]
    pub(crate) interrupt_code: u8,
    pub done: Vec<ClipDone>,
    pub skipped: Vec<ClipNote>,
    pub failed: Vec<ClipNote>,
    /// Clips stopped by a second Ctrl-C: no output written.
    pub cancelled: Vec<String>,
    /// Clips not started because of an interrupt.
    pub not_started: Vec<String>,
    pub not_video: Vec<String>,
    /// Clips left to the other shards.
    pub(crate) other_shards: usize,
    /// The still images' streams, when there were any.
    pub images: Option<ImageStream>,
}

impl Report {
    pub fn exit_code(&self) -> u8 {
        if self.interrupted {
            self.interrupt_code
        } else if !self.failed.is_empty() || !self.cancelled.is_empty() {
            1
        } else {
            0
        }
    }
}

impl Report {
    /// Adds one image stream's figures to the batch's.
    pub(crate) fn add_images(&mut self, s: &ImageStream) {
        let all = self.images.get_or_insert_with(|| ImageStream {
            batch: s.batch,
            ..Default::default()
        });
        all.images += s.images;
        all.faces += s.faces;
        all.batches += s.batches;
        all.room += s.room;
        all.mean_fill = all.faces as f64 / all.room.max(1) as f64;
    }
}

impl ClipNote {
    pub fn new(clip: &str, reason: String) -> ClipNote {
        ClipNote {
            clip: clip.to_string(),
            reason,
        }
    }
}

impl Report {
    /// Prints the counts and every clip's fate to stderr.
    pub(crate) fn print_summary(&self) {
        let r = self;
        let mut line = format!(
            "batch: {} done, {} skipped, {} failed",
            r.done.len(),
            r.skipped.len(),
            r.failed.len()
        );
        if r.interrupted {
            line += &format!(
                ", {} cancelled, {} not started (interrupted)",
                r.cancelled.len(),
                r.not_started.len()
            );
        }
        if !r.not_video.is_empty() {
            line += &format!(", {} non-video file(s) ignored", r.not_video.len());
        }
        crate::console::eprint!("{line}");
        if let Some(i) = &r.images {
            crate::console::eprint!(
                "  images: {} streamed, {} faces in {} model calls of {}, mean fill {:.0}%",
                i.images,
                i.faces,
                i.batches,
                i.batch,
                100.0 * i.mean_fill
            );
        }
        for d in &r.done {
            crate::console::eprint!("  done       {} ({} frames, {:.1} s)", d.clip, d.frames, d.seconds);
        }
        for s in &r.skipped {
            crate::console::eprint!("  skipped    {}: {}", s.clip, s.reason);
        }
        for f in &r.failed {
            crate::console::eprint!("  failed     {}: {}", f.clip, f.reason);
        }
        for c in &r.cancelled {
            crate::console::eprint!("  cancelled  {c}");
        }
        for c in &r.not_started {
            crate::console::eprint!("  not started {c}");
        }
        for n in &r.not_video {
            crate::console::eprint!("  not video  {n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Summary, WorkerStat};

    fn stream(images: u64, faces: u64, batches: u64, batch: usize) -> ImageStream {
        let worker = WorkerStat {
            faces,
            batches,
            batch,
            ..Default::default()
        };
        let summary = Summary {
            frames: images,
            workers: vec![worker],
            ..Default::default()
        };
        ImageStream::of(&summary, batch)
    }

    #[test]
    fn the_fill_of_the_streams_is_their_faces_over_the_room_their_batches_had() {
        assert_eq!(stream(20, 20, 5, 4).mean_fill, 1.0);
        assert_eq!(stream(3, 3, 1, 4).mean_fill, 0.75);
        let mut r = Report::default();
        assert!(r.images.is_none());
        // Two jobs: 20 faces in 5 full batches of 4, and 3 faces in one batch of 4.
        r.add_images(&stream(20, 20, 5, 4));
        r.add_images(&stream(3, 3, 1, 4));
        let all = r.images.as_ref().unwrap();
        assert_eq!((all.images, all.faces, all.batches), (23, 23, 6));
        assert!((all.mean_fill - 23.0 / 24.0).abs() < 1e-12);
        let json = serde_json::to_string(all).unwrap();
        assert!(json.contains("\"mean_fill\"") && !json.contains("room"), "{json}");
    }
}
