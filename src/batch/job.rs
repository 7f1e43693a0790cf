//! One batch job: in, clips from the shared queues and the job's resolved settings (its device);
//! out, an event for every clip (started, progress, then done with the manifest entry to
//! record, failed, or cancelled), sent to the coordinator, until the queues are empty or a stop
//! is asked for. Still images go first, streamed through one engine (`pipeline::run_images`),
//! each taken from the queue as the stream's decoder is ready for it; then the videos, one
//! pipeline run each. A job owns nothing shared: the coordinator keeps the report and manifest.

use parking_lot::Mutex;
use std::path::PathBuf;

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
    /// Length of a long video's segments in seconds (0: never cut).
    pub(crate) segment: f64,
    pub(crate) shard: Option<crate::batch::clips::Shard>,
    /// With a shard, the long videos whose segments every shard shares (no clip claim: each
    /// segment is claimed).
    pub(crate) long: std::sync::Arc<std::collections::BTreeSet<String>>,
}

/// Takes `clip`'s claim, or says why it is skipped: another batch process over the same
/// folders is restoring it, or has finished it since this one scanned them.
fn claim(ctx: &JobContext, clip: &Clip) -> Result<Taken> {
    let (input, output) = (ctx.in_dir.join(&clip.rel), ctx.out_dir.join(&clip.rel));
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    }
    let Some(claim) = Claim::take(&output)? else {
        return Ok(Taken::Held);
    };
    // Only an output that exists can have been finished meanwhile.
    if output.exists() {
        let all = Manifest::load_all(&ctx.out_dir)?;
        let stamp = Stamp::of(&input)?;
        if manifest::vouched(&all, &clip.key, stamp, &ctx.settings_hash, &output)
            && (!ctx.force || manifest::finished_after(&all, &clip.key, ctx.started_unix_ms))
        {
            return Ok(Taken::Finished);
        }
    }
    Ok(Taken::Mine(claim))
}

/// What taking a clip's claim found.
enum Taken {
    Mine(Claim),
    /// Another batch process is restoring it now.
    Held,
    /// Another batch process finished it since this one's scan.
    Finished,
}

/// Why a clip is reported skipped when another process held it to the end.
const HELD: &str = "being restored by another batch process";

/// The claim on `clip`, or `None` when the clip is skipped, failed (the event is sent) or held
/// by another process (then it goes into `held`, to be tried again once the queues are empty).
fn claim_or_say(
    job: usize,
    ctx: &JobContext,
    clip: &Clip,
    events: &Sender<Event>,
    held: &Mutex<Vec<Clip>>,
) -> Option<Claim> {
    let event = match claim(ctx, clip) {
        Ok(Taken::Mine(c)) => return Some(c),
        Ok(Taken::Held) => {
            held.lock().push(clip.clone());
            return None;
        }
        Ok(Taken::Finished) => Event::Skipped {
            job,
            clip: clip.key.clone(),
            reason: "finished by another batch process".into(),
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
    let held = Mutex::new(Vec::new());
    stream_images(job, ctx, &settings, &queues.images, &mut cached, events, &held);
    let clips = &queues.videos;
    loop {
        if ctx.ints.requested() {
            break;
        }
        let Ok(clip) = clips.try_recv() else { break };
        if ctx.long.contains(&clip.key) {
            // Shared with the other shards segment by segment.
            if !run_claimed(job, ctx, &settings, (clip, None), &mut cached, events) {
                return;
            }
            continue;
        }
        let Some(claim) = claim_or_say(job, ctx, &clip, events, &held) else {
            continue;
        };
        if !run_claimed(job, ctx, &settings, (clip, Some(claim)), &mut cached, events) {
            return;
        }
    }
    // The clips another process held: waited for, then restored here if that process did not
    // finish them (it failed or was stopped), or reported skipped if it did.
    let mut waiting = held.into_inner();
    while !waiting.is_empty() {
        if ctx.ints.requested() {
            for clip in waiting {
                let _ = events.send(Event::Skipped {
                    job,
                    clip: clip.key,
                    reason: HELD.into(),
                });
            }
            return;
        }
        let again = Mutex::new(Vec::new());
        for clip in std::mem::take(&mut waiting) {
            if let Some(claim) = claim_or_say(job, ctx, &clip, events, &again) {
                if !run_claimed(job, ctx, &settings, (clip, Some(claim)), &mut cached, events) {
                    return;
                }
            }
        }
        waiting = again.into_inner();
        if !waiting.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
}

/// Restores a clip whose claim this job holds (none for a long clip every shard shares: its
/// segments are claimed one by one) and says how it ended: done, skipped when another shard
/// joins it, failed or cancelled; false when the coordinator has gone.
fn run_claimed(
    job: usize,
    ctx: &JobContext,
    settings: &Settings,
    (clip, claim): (Clip, Option<Claim>),
    cached: &mut Option<Engine>,
    events: &Sender<Event>,
) -> bool {
    let event = match run_clip(job, ctx, settings, &clip, cached, events) {
        Ok(Ran::Done(done, entry)) => Event::Done {
            job,
            done,
            entry,
            claim,
        },
        Ok(Ran::NotJoined(reason)) => Event::Skipped {
            job,
            clip: clip.key,
            reason,
        },
        Err(e) if is_cancelled(&e) => Event::Cancelled { job, clip: clip.key },
        Err(e) => Event::Failed {
            job,
            clip: clip.key,
            reason: format!("{e:#}"),
        },
    };
    events.send(event).is_ok()
}

/// What an image stream answers each picture by: its clip, its input's stamp and its claim.
type Picture = (Clip, Stamp, Option<Claim>);

/// Streams still images from `images` through the job's engine until the queue is empty or a
/// stop is asked for; a stream the model broke is followed by a new one on fresh sessions.
fn stream_images(
    job: usize,
    ctx: &JobContext,
    settings: &Settings,
    images: &Receiver<Clip>,
    cached: &mut Option<Engine>,
    events: &Sender<Event>,
    held: &Mutex<Vec<Clip>>,
) {
    // Each picture goes with its clip, stamp and claim (the stream answers by them).
    let mut take = || -> Option<(Job, Picture)> {
        loop {
            if ctx.ints.requested() {
                return None;
            }
            let clip = images.try_recv().ok()?;
            let Some(claim) = claim_or_say(job, ctx, &clip, events, held) else {
                continue;
            };
            match prepare(job, ctx, settings, &clip, events) {
                Ok((spec, stamp)) => return Some((spec, (clip, stamp, Some(claim)))),
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
    let done = |(clip, stamp, claim): Picture, outcome: Result<crate::pipeline::ImageDone>| {
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
        let engine = match settings.engine_for(cached, &first.0) {
            Ok(e) => e,
            Err(e) => {
                done(first.1, Err(e));
                continue;
            }
        };
        let batch = engine.batch;
        match crate::pipeline::run_images(
            engine,
            (settings.recipe.treatment.detection.det_size, None),
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
        frames: spec.source.frames_to_run(spec.treatment.max_frames),
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
        segments: None,
    };
    Ok((done, entry))
}

/// How a clip's run ended.
enum Ran {
    /// Finished: what the coordinator records.
    Done(ClipDone, Entry),
    /// A long clip's segments were done here, but others are not yet: the shard that finishes
    /// the last one joins it.
    NotJoined(String),
}

/// Restores one clip (a long one in segments: this shard's share, joined when the set is
/// whole); returns what the coordinator records.
fn run_clip(
    job: usize,
    ctx: &JobContext,
    settings: &Settings,
    clip: &Clip,
    cached: &mut Option<Engine>,
    events: &Sender<Event>,
) -> Result<Ran> {
    let (job_spec, stamp) = prepare(job, ctx, settings, clip, events)?;
    // A sharded batch's --force cannot be told apart from another shard's fresh segments: only
    // an unsharded one starts a long clip afresh.
    let force = ctx.force && ctx.shard.is_none();
    if let Some(work) = crate::segment::Work::open(settings, &job_spec, ctx.segment, force)? {
        let start = std::time::Instant::now();
        let shard = ctx.shard;
        let key = clip.key.clone();
        let mine = move |s: &crate::segment::plan::Segment| shard.is_none_or(|sh| sh.owns_segment(&key, s.number));
        let share = crate::segment::Share {
            jobs: 1,
            threads_given: true,
            mine: &mine,
            wait: shard.is_none(),
            // The first Ctrl-C: the segment in flight finishes, the clip stops there (its
            // finished segments are kept for the next run).
            stop: &|| ctx.ints.requested(),
            claims: &crate::segment::FileClaims,
            engine: None,
        };
        let total = work.segments().len();
        let done = crate::segment::run(settings, &job_spec, &work, &share, &|p, _| {
            let _ = events.send(Event::Progress { job, frames: p.frames });
        })
        .inspect_err(|_| *cached = None)?;
        let Some(joined) = &done.joined else {
            return Ok(Ran::NotJoined(format!(
                "{}; the shard that finishes the last segment joins it",
                crate::segment::describe(&done, total)
            )));
        };
        let (mut note, entry) = record(
            ctx,
            clip,
            stamp,
            joined.frames,
            joined.faces,
            start.elapsed().as_secs_f64(),
        )?;
        note.segments = Some(crate::segment::describe(&done, total));
        return Ok(Ran::Done(note, entry));
    }
    let engine = settings.engine_for(cached, &job_spec)?;
    let run = crate::pipeline::run(engine, &job_spec, &|p| {
        let _ = events.send(Event::Progress { job, frames: p.frames });
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
    Ok(Ran::Done(done, entry))
}
