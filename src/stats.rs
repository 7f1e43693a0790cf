//! Run statistics: in, per-stage busy times and counts recorded by the pipeline; out, the
//! end-of-run summary (frames, faces, wall time, fps, each stage's busy share).

use std::fmt;
use std::time::{Duration, Instant};

/// Busy time and item count of one stage.
#[derive(Clone, Debug, Default)]
pub struct StageStat {
    pub name: &'static str,
    pub busy: Duration,
    pub items: u64,
}

/// Measures the time a stage spends working (not waiting on its channels).
pub struct Clock {
    stat: StageStat,
}

impl Clock {
    pub fn new(name: &'static str) -> Self {
        Self {
            stat: StageStat {
                name,
                ..Default::default()
            },
        }
    }

    /// Runs `f`, counting its time as busy.
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.stat.busy += t.elapsed();
        r
    }

    /// Adds time measured by the caller.
    pub fn add(&mut self, d: Duration) {
        self.stat.busy += d;
    }

    pub fn count(&mut self, n: u64) {
        self.stat.items += n;
    }

    pub fn finish(self) -> StageStat {
        self.stat
    }
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub frames: u64,
    pub faces: u64,
    /// Frames with at least one face.
    pub frames_with_faces: u64,
    pub batches: u64,
    pub wall: Duration,
    pub stages: Vec<StageStat>,
}

impl Summary {
    pub fn fps(&self) -> f64 {
        self.frames as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_frame = self.faces as f64 / self.frames.max(1) as f64;
        writeln!(
            f,
            "{} frames, {} faces ({per_frame:.2} per frame, {} frames with faces), {} batches, {:.2} s, {:.1} fps",
            self.frames,
            self.faces,
            self.frames_with_faces,
            self.batches,
            self.wall.as_secs_f64(),
            self.fps()
        )?;
        write!(f, "stage busy:")?;
        for s in &self.stages {
            let share = 100.0 * s.busy.as_secs_f64() / self.wall.as_secs_f64().max(1e-9);
            write!(f, "  {} {share:.0}%", s.name)?;
        }
        Ok(())
    }
}
