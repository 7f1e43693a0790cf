//! The image stream: in, an `Engine` and still-image `Job`s pulled one at a time; out, each
//! image restored into its own output (written under a temporary name, renamed when complete),
//! exactly one outcome per image, and the stream's `Summary`.
//!
//! ```text
//!  next() ─> decode ─> detect ─> align ─> dispatch ═> workers ═> dispatch ─> paste ─> encode ─> OUT 0, OUT 1, ...
//!  job 0, 1   picture k            crops of pictures k, k+1, ... fill one batch       one writer per picture
//! ```
//! One pipeline run carries every picture: each is a frame of the stream (`Frame::item` says
//! which), so the dispatcher fills batches with the crops of consecutive pictures instead of
//! one partial batch per picture, and the sessions, threads and pools are set up once. Each
//! picture is a scene of its own at its own size: the detector starts afresh on it and nothing
//! is smoothed across pictures. A picture that cannot be read or written fails alone; a failure
//! of the model fails the pictures in flight, and the stream.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{Receiver, Sender};

use super::ctx::DEPTH;
use super::dispatch::Flush;
use super::wire::{wire, Encoded, Middle};
use crate::engine::{Cancelled, Engine, Job, Kind, KindExt};
use crate::faces::detect::det_size;
use crate::frame::{FaceFrame, Frame, Pool};
use crate::media::decode::Decoder;
use crate::media::still::Writer;
use crate::output::Partial;
use crate::stats::{Clock, StageStat, Summary};

/// One picture of the stream, restored and in place.
#[derive(Clone, Debug)]
pub(crate) struct ImageDone {
    pub(crate) faces: u64,
    /// Each face's box (x1, y1, x2, y2, picture pixels as stored).
    pub(crate) boxes: Vec<[f32; 4]>,
    /// From the moment its decoding started to its rename.
    pub(crate) seconds: f64,
    /// The restored picture's bytes, for a job that keeps it in memory (`Job::to_memory`).
    pub(crate) bytes: Option<Vec<u8>>,
}

/// What each picture reports: the tag it came with (whatever its caller answers it by: a
/// request's reply, a batch's clip) and its outcome.
///
/// Each picture is pasted with its own job's blend and compare view; the mask is `first`'s.
pub(crate) type Outcome<'a, R> = &'a (dyn Fn(R, Result<ImageDone>) + Sync);

/// The pictures pulled and not yet reported, by their number in the stream: each one's job,
/// when it started and its tag. The stream's one table: callers keep none.
type Table<R> = Mutex<HashMap<usize, (Job, Instant, R)>>;

/// Runs `first` and every job `next` gives (until it returns `None` or a job's cancel token
/// is set) through `engine` as one stream; `long_side` is the detection copy's long side
/// (`--det-size`). The mask is `first`'s for every picture; blend and the compare view each
/// picture's own. A partial batch goes out when `flush` says (`None`: only at the end or when
/// too many pictures wait, as a folder is streamed). `done`
/// hears exactly once of every picture taken. Fails only when the stream as a whole broke
/// (the model failed); the pictures it took with it are reported failed first.
pub(crate) fn run_images<R: Send>(
    engine: &mut Engine,
    (long_side, flush): (usize, Option<std::time::Duration>),
    first: (Job, R),
    next: &mut (dyn FnMut() -> Option<(Job, R)> + Send),
    done: Outcome<R>,
) -> Result<Summary> {
    let table: Table<R> = Mutex::new(HashMap::new());
    let result = run_inner(engine, (long_side, flush), first, next, done, &table);
    let left: Vec<R> = table.lock().drain().map(|(_, (_, _, r))| r).collect();
    for r in left {
        let why = match &result {
            Err(e) => anyhow!("{e:#}"),
            Ok(_) => anyhow!("internal error: the picture was lost in the stream"),
        };
        done(r, Err(why));
    }
    result
}

fn run_inner<R: Send>(
    engine: &mut Engine,
    (long_side, flush): (usize, Option<std::time::Duration>),
    first: (Job, R),
    next: &mut (dyn FnMut() -> Option<(Job, R)> + Send),
    done: Outcome<R>,
    table: &Table<R>,
) -> Result<Summary> {
    let start = Instant::now();
    engine.detector.reset();
    let fixed = engine.detector.fixed_size();
    let middle = Middle {
        treatment: first.0.treatment.clone(),
        video: false,
        flush: flush.map_or(Flush::Never, Flush::After),
        // Pictures are turned upright as they are decoded.
        sides: Default::default(),
        identity: first.0.identity,
        each_face: true,
        identity_model: first.0.identity_model.clone(),
        quality_model: first.0.quality_model.clone(),
        hand_models: first.0.hand_models.clone(),
    };
    // Pictures are opened and written on as many threads as the pool stages have: a photo's
    // decoding or PNG encoding takes longer than its model share on a GPU.
    let (threads, cpu) = (engine.pool_threads, engine.cpu);
    let (summary, ()) = wire(
        engine,
        middle,
        start,
        move |p, tx| {
            decode(
                first,
                next,
                (long_side, fixed),
                (&p.rgb, &p.det),
                threads,
                table,
                done,
                tx,
            )
        },
        move |p, rx| encode(&p.rgb, (threads, cpu), table, done, rx),
    )?;
    Ok(summary)
}

/// Opens the pictures and sends each one's (first) frame on, numbered in the order `next`
/// gave them, on `threads` threads (a picture each at a time: frames leave as they are ready,
/// the detector starts afresh on each); a picture that cannot be decoded is reported failed
/// here and the stream goes on.
#[allow(clippy::too_many_arguments)]
fn decode<R: Send>(
    first: (Job, R),
    next: &mut (dyn FnMut() -> Option<(Job, R)> + Send),
    (long_side, fixed): (usize, Option<(usize, usize)>),
    pools: (&Pool<Vec<u8>>, &Pool<Vec<u8>>),
    threads: usize,
    table: &Table<R>,
    done: Outcome<R>,
    tx: Sender<Frame>,
) -> Result<StageStat> {
    // The next picture and its number, taken under one lock.
    let source = Mutex::new((Some(first), next, 0usize));
    let gone = std::sync::atomic::AtomicBool::new(false);
    let take = || -> Option<(usize, (Job, R))> {
        if gone.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let mut s = source.lock();
        let (pending, next, k) = &mut *s;
        let job = pending.take().or_else(&mut **next)?;
        *k += 1;
        Some((*k - 1, job))
    };
    let one = |clock: &mut Clock, k: usize, (job, tag): (Job, R)| {
        let input = job.source.path.display().to_string();
        if job.cancel.is_cancelled() {
            // Not wanted any more (a stop, a request past its deadline): the stream goes on
            // with the next, if `next` gives one.
            done(tag, Err(Cancelled { frames: 0, input }.into()));
            return;
        }
        let (t, c) = (Instant::now(), crate::stats::thread_cpu_time());
        let o = job.source.orientation;
        let (w, h) = job.source.upright_size();
        let upright = fixed.unwrap_or_else(|| det_size(w, h, long_side));
        let stored = if crate::media::orient::swaps(o) {
            (upright.1, upright.0)
        } else {
            upright
        };
        let decoder = Decoder::new(job.source.clone(), stored, job.hwaccel_cuda);
        let (view, dropped) = (job.view(), job.cancel.flag());
        table.lock().insert(k, (job, t, tag));
        let mut sent = false;
        // A still has one picture; the first frame is the one written.
        let run = decoder.run(pools, Some(1), |mut f| {
            if o > 1 {
                crate::media::orient::turn_frame(o, &mut f, stored, pools);
            }
            f.item = k;
            f.view = Some(view);
            f.dropped = Some(dropped.clone());
            clock.add(t.elapsed(), crate::stats::thread_cpu_time().saturating_sub(c));
            clock.count(1);
            sent = true;
            if tx.send(f).is_err() {
                gone.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            false
        });
        if let Err(e) = run {
            let taken = if sent { None } else { table.lock().remove(&k) };
            if let Some((_, _, tag)) = taken {
                done(
                    tag,
                    Err(e.context(format!("decode stage, input {input}"))).kind(Kind::BadInput),
                );
            }
        }
    };
    let stats: Vec<StageStat> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut clock = Clock::new("decode", 0);
                    while let Some((k, job)) = take() {
                        one(&mut clock, k, job);
                    }
                    clock.finish()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<std::thread::Result<_>>()
    })
    .map_err(|_| anyhow!("internal error: a thread of the decode stage panicked"))?;
    Ok(StageStat::sum("decode", 0, stats))
}

/// Writes each picture into its own output as it comes (under a temporary name, renamed when
/// complete) and reports it, on `threads` threads (a video file taking the paste's changes at
/// the CPU level `cpu`); frame buffers go back to `rgb_pool`. Counts the faces restored and the
/// pictures with faces.
fn encode<R: Send>(
    rgb_pool: &Pool<Vec<u8>>,
    (threads, cpu): (usize, crate::kernels::Cpu),
    table: &Table<R>,
    done: Outcome<R>,
    rx: Receiver<FaceFrame>,
) -> Result<Encoded<()>> {
    let run = || {
        let mut clock = Clock::new("encode", DEPTH);
        let (mut n_faces, mut with_faces) = (0u64, 0u64);
        let mut left_alone = crate::stats::Left::default();
        while let Ok(FaceFrame { mut frame, faces, left }) = {
            clock.queue(rx.len());
            rx.recv()
        } {
            let k = frame.item;
            let Some((job, t, tag)) = table.lock().remove(&k) else {
                continue;
            };
            let outcome = if job.cancel.is_cancelled() {
                Err(Cancelled {
                    frames: 0,
                    input: job.source.path.display().to_string(),
                }
                .into())
            } else {
                clock
                    .time(|| write_picture(&job, &mut frame, cpu))
                    .with_context(|| format!("encode stage, output {}", job.output.display()))
                    .kind(Kind::Io)
                    .map(|bytes| ImageDone {
                        bytes,
                        faces: faces.len() as u64,
                        boxes: faces.iter().map(|f| f.face.bbox).collect(),
                        seconds: t.elapsed().as_secs_f64(),
                    })
            };
            if outcome.is_ok() {
                clock.count(1);
                n_faces += faces.len() as u64;
                with_faces += u64::from(!faces.is_empty());
                for j in left.iter().filter_map(|j| j.left) {
                    left_alone.add(j);
                }
            }
            done(tag, outcome);
            crate::media::color::give_back_rgb(&mut frame, rgb_pool);
        }
        (clock.finish(), n_faces, with_faces, left_alone)
    };
    let parts: Vec<(StageStat, u64, u64, crate::stats::Left)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(run)).collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<std::thread::Result<_>>()
    })
    .map_err(|_| anyhow!("internal error: a thread of the encode stage panicked"))?;
    Ok(Encoded {
        faces: parts.iter().map(|p| p.1).sum(),
        frames_with_faces: parts.iter().map(|p| p.2).sum(),
        left: parts.iter().fold(crate::stats::Left::default(), |mut a, p| {
            a.merge(p.3);
            a
        }),
        stage: StageStat::sum("encode", DEPTH, parts.into_iter().map(|p| p.0)),
        extra: (),
    })
}

/// Writes `frame` as `job`'s output: under a temporary name beside it, renamed when complete,
/// removed on any error; or for a job kept in memory, its bytes.
fn write_picture(job: &Job, frame: &mut Frame, cpu: crate::kernels::Cpu) -> Result<Option<Vec<u8>>> {
    let mut out_src = job.source.clone();
    (out_src.width, out_src.height) = crate::media::compare::Compare::output_size(job.view().compare, &job.source);
    let encode = &job.treatment.encode;
    if job.to_memory {
        let mut writer = Writer::in_memory(&job.output, &out_src, encode)?;
        writer.write(frame)?;
        let bytes = writer.take_encoded();
        writer.finish(false)?;
        return Ok(bytes);
    }
    let partial = Partial::beside(&job.output)?;
    let written = (|| {
        let mut writer = Writer::create(partial.path(), &out_src, encode, cpu)?;
        writer.write(frame)?;
        writer.finish(false)
    })();
    match written {
        Ok(_) => partial.rename_to(&job.output).map(|()| None),
        Err(e) => {
            partial.discard();
            Err(e)
        }
    }
}
