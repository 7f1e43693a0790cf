//! The `--faces-json` record: in, each encoded frame's faces; out, a JSON array streamed to a
//! temporary file frame by frame (memory stays flat however long the video) and moved into
//! place only when the run succeeds.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::frame::{Face, FaceJob};
use crate::geom::Rect;
use crate::output::PendingFile;

/// One frame's entry: the frame regions pasted into and the faces found.
#[derive(Serialize)]
struct FrameRecord<'a> {
    frame: u64,
    regions: Vec<Rect>,
    faces: Vec<FaceRecord<'a>>,
}

/// A face and its track: the same number on every frame of one track (a new one after a cut,
/// a jump or a loss), absent for a face not linked to one (pictures).
#[derive(Serialize)]
struct FaceRecord<'a> {
    #[serde(flatten)]
    face: &'a Face,
    #[serde(skip_serializing_if = "Option::is_none")]
    track: Option<u64>,
    /// Why the face was left alone (`small`, `not named`, `skipped`), absent when restored.
    #[serde(skip_serializing_if = "Option::is_none")]
    left: Option<&'static str>,
    /// Who the pasted face still is (1 unchanged, below 0.5 another person: see
    /// `people::identity_of`), where measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    identity: Option<f32>,
    /// The blend it was pasted at (the identity guard's share of the change times the
    /// picture's blend), where the guard backs off.
    #[serde(skip_serializing_if = "Option::is_none")]
    blend: Option<f32>,
    /// The fidelity the identity guard ran it at, where it raised the run's.
    #[serde(skip_serializing_if = "Option::is_none")]
    fidelity: Option<f32>,
    /// Its quality before and after restoration (BRISQUE, lower is better), where measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    quality: Option<Quality>,
    /// The share of its paste region held back for a hand in front of it, where one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    hands: Option<f32>,
}

/// A face's quality before and after.
#[derive(Serialize)]
struct Quality {
    before: f32,
    after: f32,
}

/// Streams frame records into a pending file.
pub(crate) struct FacesSink {
    file: PendingFile,
    frames: u64,
    path: String,
    /// The record line of the latest warm-up frame seen (a segment's, before its own frames).
    tail: Option<String>,
}

impl FacesSink {
    pub(super) fn create(path: &Path) -> Result<Self> {
        let mut file = PendingFile::create(path)?;
        file.write_all(b"[")
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            file,
            frames: 0,
            path: path.display().to_string(),
            tail: None,
        })
    }

    /// One frame's record line.
    fn line(index: u64, faces: &[FaceJob]) -> Result<String> {
        let record = FrameRecord {
            frame: index,
            regions: faces
                .iter()
                .filter(|f| f.left.is_none())
                .filter_map(|f| f.region)
                .collect(),
            faces: faces
                .iter()
                .map(|f| FaceRecord {
                    face: &f.face,
                    track: f.track,
                    left: f.left,
                    identity: f.identity,
                    blend: f.blend,
                    fidelity: f.fidelity,
                    quality: f.quality.map(|[before, after]| Quality { before, after }),
                    hands: f.held,
                })
                .collect(),
        };
        Ok(serde_json::to_string(&record)?)
    }

    /// Keeps a warm-up frame's record (not written): the last one kept is the frame just
    /// before a segment, whose tracks the join links to the previous segment's.
    pub(crate) fn warm_frame(&mut self, index: u64, faces: &[FaceJob]) -> Result<()> {
        // Look-ahead frames come after the segment's own: only the warm-up's count.
        if self.frames == 0 {
            self.tail = Some(Self::line(index, faces)?);
        }
        Ok(())
    }

    /// The record line of the last warm-up frame.
    pub(crate) fn tail(&self) -> Option<&str> {
        self.tail.as_deref()
    }

    /// Appends one frame (one line).
    pub(super) fn frame(&mut self, index: u64, faces: &[FaceJob]) -> Result<()> {
        let line = Self::line(index, faces)?;
        let sep: &[u8] = if self.frames == 0 { b"\n" } else { b",\n" };
        self.file
            .write_all(sep)
            .and_then(|()| self.file.write_all(line.as_bytes()))
            .with_context(|| format!("writing {}", self.path))?;
        self.frames += 1;
        Ok(())
    }

    /// Closes the array and moves the file into place.
    pub(crate) fn commit(mut self) -> Result<()> {
        self.file
            .write_all(b"\n]\n")
            .with_context(|| format!("writing {}", self.path))?;
        self.file.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_stream_as_one_json_array_with_a_line_per_frame() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faces.json");
        let mut sink = FacesSink::create(&path).unwrap();
        let mut job = FaceJob::detected(Face {
            bbox: [1.0, 2.0, 30.5, 40.0],
            score: 0.9,
            landmarks: [[f32::NAN, 1.0]; 5],
            outline: None,
        });
        job.region = Some(Rect::new(0, 1, 20, 30));
        sink.frame(0, &[job]).unwrap();
        sink.frame(1, &[]).unwrap();
        assert!(!path.exists(), "only complete records appear");
        sink.commit().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON, NaN written as null");
        assert_eq!(v.as_array().unwrap().len(), 2);
        assert_eq!(v[0]["regions"][0], serde_json::json!([0, 1, 20, 30]));
        assert_eq!(v[0]["faces"][0]["bbox"][2], 30.5);
        assert!(v[0]["faces"][0]["landmarks"][0][0].is_null());
        assert_eq!(text.lines().filter(|l| l.starts_with("{\"frame\"")).count(), 2);
    }
}
