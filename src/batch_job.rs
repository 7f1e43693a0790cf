//! One batch job: in, clips from the shared queue and the job's resolved settings (its device);
//! out, an event for every clip (started, progress, then done with the manifest entry to
//! record, failed, or cancelled), sent to the coordinator, until the queue is empty or a stop
//! is asked for. A job owns nothing shared: the coordinator keeps the report and manifest.

use std::path::PathBuf;

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};

use crate::batch_report::ClipDone;
use crate::clips::Clip;
use crate::config::Settings;
use crate::engine::{is_cancelled, CancelToken, Engine};
use crate::interrupt::Interrupts;
use crate::manifest::{self, Entry, Stamp};

/// What a job tells the coordinator.
pub(crate) enum Event {
    Started {
        job: usize,
        clip: String,
        frames: Option<u64>,
    },
    Progress {
        job: usize,
        frames: u64,
    },
    Done {
        job: usize,
        done: ClipDone,
        entry: Entry,
    },
    Failed {
        job: usize,
        clip: String,
        reason: String,
    },
    Cancelled {
        job: usize,
        clip: String,
    },
}

/// What every job shares, read-only.
#[derive(Clone)]
pub(crate) struct JobContext {
    pub(crate) in_dir: PathBuf,
    pub(crate) out_dir: PathBuf,
    pub(crate) ints: Interrupts,
    /// [`manifest::settings_hash`] of the batch's settings.
    pub(crate) settings_hash: String,
}

/// One job: takes clips until none is left or a stop is asked for.
pub(crate) fn job_loop(
    job: usize,
    ctx: &JobContext,
    settings: Settings,
    clips: &Receiver<Clip>,
    events: &Sender<Event>,
) {
    let mut cached: Option<Engine> = None;
    loop {
        if ctx.ints.requested() {
            break;
        }
        let Ok(clip) = clips.try_recv() else { break };
        let event = match run_clip(job, ctx, &settings, &clip, &mut cached, events) {
            Ok((done, entry)) => Event::Done { job, done, entry },
            Err(e) if is_cancelled(&e) => Event::Cancelled { job, clip: clip.key },
            Err(e) => Event::Failed {
                job,
                clip: clip.key,
                reason: format!("{e:#}"),
            },
        };
        if events.send(event).is_err() {
            break;
        }
    }
}

/// Restores one clip; returns what the coordinator records.
fn run_clip(
    job: usize,
    ctx: &JobContext,
    settings: &Settings,
    clip: &Clip,
    cached: &mut Option<Engine>,
    events: &Sender<Event>,
) -> Result<(ClipDone, Entry)> {
    let (input, output) = (ctx.in_dir.join(&clip.rel), ctx.out_dir.join(&clip.rel));
    let stamp = Stamp::of(&input)?;
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    }
    let job_spec = settings.job(&input, &output, CancelToken::from_flag(ctx.ints.hard.clone()))?;
    let _ = events.send(Event::Started {
        job,
        clip: clip.key.clone(),
        frames: job_spec.source.frames_to_run(job_spec.max_frames),
    });
    let engine = settings.engine_for(cached, &job_spec)?;
    let run = crate::pipeline::run(engine, &job_spec, &|frames| {
        let _ = events.send(Event::Progress { job, frames });
    });
    // A failed run may leave a session in a bad state: the next clip loads fresh ones.
    let summary = run.inspect_err(|_| *cached = None)?;
    // Flushed to disk before the manifest vouches for it.
    std::fs::File::open(&output)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("flushing {}", output.display()))?;
    let entry = Entry {
        input_size: stamp.size,
        input_mtime_ns: stamp.mtime_ns,
        settings: ctx.settings_hash.clone(),
        output_size: std::fs::metadata(&output)?.len(),
        finished_unix_ms: manifest::now_unix_ms(),
    };
    let done = ClipDone {
        clip: clip.key.clone(),
        frames: summary.frames,
        faces: summary.faces,
        seconds: summary.wall.as_secs_f64(),
    };
    Ok((done, entry))
}
