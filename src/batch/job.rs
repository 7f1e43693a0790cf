//! One batch job: in, clips from the shared queues and the job's resolved settings (its device);
//! out, an event for every clip (started, progress, then done with the manifest entry to
//! record, failed, or cancelled), sent to the coordinator, until the queues are empty or a stop
//! is asked for. Still images go first, streamed through one engine (`pipeline::run_images`),
//! each taken from the queue as the stream's decoder is ready for it; then the videos, one
//! pipeline run each. A job owns nothing shared: the coordinator keeps the report and manifest.

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};

use crate::batch::clips::Clip;
use crate::batch::manifest::{self, Entry, Manifest, Stamp};
use crate::batch::report::{ClipDone, ImageStream};
use crate::config::Settings;
use crate::engine::{is_cancelled, CancelToken, Engine, Job};
use crate::interrupt::Interrupts;
use crate::output::Claim;

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
        /// Held until the coordinator has recorded the clip in the manifest.
        claim: Option<Claim>,
    },
    /// Another batch process is restoring the clip, or finished it after this one's scan.
    Skipped {
        job: usize,
        clip: String,
        reason: String,
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
    /// An image stream ended: what its batches did.
    Images {
        stat: ImageStream,
    },
}

/// The clips still to run: still images (streamed) and videos.
#[derive(Clone)]
pub(crate) struct Queues {
    pub(crate) images: Receiver<Clip>,
    pub(crate) videos: Receiver<Clip>,
}

/// What every job shares, read-only.
#[derive(Clone)]
pub(crate) struct JobContext {
    pub(crate) in_dir: PathBuf,
    pub(crate) out_dir: PathBuf,
    pub(crate) ints: Interrupts,
    /// [`manifest::settings_hash`] of the batch's settings.
    pub(crate) settings_hash: String,
    /// `--force`: redo clips finished before this run started.
    pub(crate) force: bool,
    /// When this run started, milliseconds since the Unix epoch.
    pub(crate) started_unix_ms: u64,
}

/// Takes `clip`'s claim, or says why it is skipped: another batch process over the same
/// folders is restoring it, or has finished it since this one scanned them.
fn claim(ctx: &JobContext, clip: &Clip) -> Result<std::result::Result<Claim, String>> {
    let (input, output) = (ctx.in_dir.join(&clip.rel), ctx.out_dir.join(&clip.rel));
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    }
    let Some(claim) = Claim::take(&output)? else {
        return Ok(Err("being restored by another batch process".into()));
    };
    // Only an output that exists can have been finished meanwhile.
    if output.exists() {
        let all = Manifest::load_all(&ctx.out_dir)?;
        let stamp = Stamp::of(&input)?;
        if manifest::vouched(&all, &clip.key, stamp, &ctx.settings_hash, &output)
            && (!ctx.force || manifest::finished_after(&all, &clip.key, ctx.started_unix_ms))
        {
            return Ok(Err("finished by another batch process".into()));
        }
    }
    Ok(Ok(claim))
}

/// The claim on `clip`, or `None` when the clip is skipped or failed (the event is sent).
fn claim_or_say(job: usize, ctx: &JobContext, clip: &Clip, events: &Sender<Event>) -> Option<Claim> {
    let event = match claim(ctx, clip) {
        Ok(Ok(c)) => return Some(c),
        Ok(Err(reason)) => Event::Skipped {
            job,
            clip: clip.key.clone(),
            reason,
        },
        Err(e) => Event::Failed {
            job,
            clip: clip.key.clone(),
            reason: format!("{e:#}"),
        },
    };
    let _ = events.send(event);
    None
}

/// One job: takes clips until none is left or a stop is asked for.
pub(crate) fn job_loop(job: usize, ctx: &JobContext, settings: Settings, queues: &Queues, events: &Sender<Event>) {
    let mut cached: Option<Engine> = None;
    stream_images(job, ctx, &settings, &queues.images, &mut cached, events);
    let clips = &queues.videos;
    loop {
        if ctx.ints.requested() {
            break;
        }
        let Ok(clip) = clips.try_recv() else { break };
        let Some(claim) = claim_or_say(job, ctx, &clip, events) else {
            continue;
        };
        let event = match run_clip(job, ctx, &settings, &clip, &mut cached, events) {
            Ok((done, entry)) => Event::Done {
                job,
                done,
                entry,
                claim: Some(claim),
            },
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

/// Streams still images from `images` through the job's engine until the queue is empty or a
/// stop is asked for; a stream the model broke is followed by a new one on fresh sessions.
fn stream_images(
    job: usize,
    ctx: &JobContext,
    settings: &Settings,
    images: &Receiver<Clip>,
    cached: &mut Option<Engine>,
    events: &Sender<Event>,
) {
    // The clips of the stream running, by their number in it.
    let taken: Mutex<Vec<(Clip, Stamp, Option<Claim>)>> = Mutex::new(Vec::new());
    let mut take = || -> Option<Job> {
        loop {
            if ctx.ints.requested() {
                return None;
            }
            let clip = images.try_recv().ok()?;
            let Some(claim) = claim_or_say(job, ctx, &clip, events) else {
                continue;
            };
            match prepare(job, ctx, settings, &clip, events) {
                Ok((spec, stamp)) => {
                    taken
                        .lock()
                        .expect("no panic holds it")
                        .push((clip, stamp, Some(claim)));
                    return Some(spec);
                }
                Err(e) => {
                    let reason = format!("{e:#}");
                    let _ = events.send(Event::Failed {
                        job,
                        clip: clip.key,
                        reason,
                    });
                }
            }
        }
    };
    let done = |k: usize, outcome: Result<crate::pipeline::ImageDone>| {
        let (clip, stamp, claim) = {
            let mut t = taken.lock().expect("no panic holds it");
            let e = &mut t[k];
            (e.0.clone(), e.1, e.2.take())
        };
        let event = match outcome.and_then(|d| record(ctx, &clip, stamp, 1, d.faces, d.seconds)) {
            Ok((done, entry)) => {
                let _ = events.send(Event::Progress { job, frames: 1 });
                Event::Done {
                    job,
                    done,
                    entry,
                    claim,
                }
            }
            Err(e) if is_cancelled(&e) => Event::Cancelled { job, clip: clip.key },
            Err(e) => Event::Failed {
                job,
                clip: clip.key,
                reason: format!("{e:#}"),
            },
        };
        let _ = events.send(event);
    };
    while let Some(first) = take() {
        // A new stream numbers its pictures from 0 again: `first` is its 0 (every picture of
        // an earlier stream has been reported).
        {
            let mut t = taken.lock().expect("no panic holds it");
            let first_clip = t.pop().expect("take() just pushed it");
            t.clear();
            t.push(first_clip);
        }
        let engine = match settings.engine_for(cached, &first) {
            Ok(e) => e,
            Err(e) => {
                done(0, Err(e));
                continue;
            }
        };
        let batch = engine.batch;
        match crate::pipeline::run_images(
            engine,
            settings.recipe.treatment.detection.det_size,
            first,
            &mut take,
            &done,
        ) {
            Ok(summary) => {
                tracing::debug!(job, "image stream: {summary}");
                let stat = ImageStream::of(&summary, batch);
                let _ = events.send(Event::Images { stat });
            }
            // Its pictures are reported; a failed run may leave a session in a bad state.
            Err(_) => *cached = None,
        }
    }
}

/// A clip's job: its input stamped, its output folder made, its job built (source probed,
/// output checked); the coordinator hears that it started.
fn prepare(
    job: usize,
    ctx: &JobContext,
    settings: &Settings,
    clip: &Clip,
    events: &Sender<Event>,
) -> Result<(Job, Stamp)> {
    let (input, output) = (ctx.in_dir.join(&clip.rel), ctx.out_dir.join(&clip.rel));
    let stamp = Stamp::of(&input)?;
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    }
    let spec = settings.job(&input, &output, CancelToken::from_flag(ctx.ints.hard.clone()))?;
    let _ = events.send(Event::Started {
        job,
        clip: clip.key.clone(),
        frames: spec.source.frames_to_run(spec.max_frames),
    });
    Ok((spec, stamp))
}

/// What the coordinator records of a finished clip: its output flushed to disk (before the
/// manifest vouches for it) and its manifest entry.
fn record(
    ctx: &JobContext,
    clip: &Clip,
    stamp: Stamp,
    frames: u64,
    faces: u64,
    seconds: f64,
) -> Result<(ClipDone, Entry)> {
    let output = ctx.out_dir.join(&clip.rel);
    std::fs::File::open(&output)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("flushing {}", output.display()))?;
    let out = Stamp::of(&output)?;
    let entry = Entry {
        input_size: stamp.size,
        input_mtime_ns: stamp.mtime_ns,
        settings: ctx.settings_hash.clone(),
        output_size: out.size,
        output_mtime_ns: Some(out.mtime_ns),
        finished_unix_ms: manifest::now_unix_ms(),
    };
    let done = ClipDone {
        clip: clip.key.clone(),
        frames,
        faces,
        seconds,
        flicker: None,
    };
    Ok((done, entry))
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
    let (job_spec, stamp) = prepare(job, ctx, settings, clip, events)?;
    let engine = settings.engine_for(cached, &job_spec)?;
    let run = crate::pipeline::run(engine, &job_spec, &|frames| {
        let _ = events.send(Event::Progress { job, frames });
    });
    // A failed run may leave a session in a bad state: the next clip loads fresh ones.
    let summary = run.inspect_err(|_| *cached = None)?;
    let (mut done, entry) = record(
        ctx,
        clip,
        stamp,
        summary.frames,
        summary.faces,
        summary.wall.as_secs_f64(),
    )?;
    done.flicker = summary.flicker.filter(|f| f.pairs > 0).map(|f| f.output());
    Ok((done, entry))
}
