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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use super::dispatch::{self, Batch, Restored};
use super::{joined, stages, Pools, DEPTH};
use crate::engine::{Cancelled, Engine, Job};
use crate::faces::detect::det_size;
use crate::frame::{FaceFrame, Frame, Pool};
use crate::media::decode::Decoder;
use crate::media::still::Writer;
use crate::output::Partial;
use crate::runtime::Target;
use crate::stats::{peak_rss, Clock, StageStat, Summary};

/// One picture of the stream, restored and in place.
#[derive(Clone, Debug)]
pub struct ImageDone {
    pub output: PathBuf,
    pub faces: u64,
    /// From the moment its decoding started to its rename.
    pub seconds: f64,
}

/// What each picture reports: its number in the stream (0 for `first`, then in the order
/// `next` gave them) and its outcome.
pub type Outcome<'a> = &'a (dyn Fn(usize, Result<ImageDone>) + Sync);

/// The pictures pulled and not yet reported, with when each started.
type Table = Mutex<HashMap<usize, (Job, Instant)>>;

/// Runs `first` and every job `next` gives (until it returns `None` or a job's cancel token
/// is set) through `engine` as one stream; `long_side` is the detection copy's long side
/// (`--det-size`). Blend, mask and the compare view are `first`'s, for every picture. `done`
/// hears exactly once of every picture taken. Fails only when the stream as a whole broke
/// (the model failed); the pictures it took with it are reported failed first.
pub fn run_images(
    engine: &mut Engine,
    long_side: usize,
    first: Job,
    next: &mut (dyn FnMut() -> Option<Job> + Send),
    done: Outcome,
) -> Result<Summary> {
    let table: Table = Mutex::new(HashMap::new());
    let result = run_inner(engine, long_side, first, next, done, &table);
    let left: Vec<usize> = table
        .lock()
        .expect("no panic holds it")
        .drain()
        .map(|(k, _)| k)
        .collect();
    for k in left {
        let why = match &result {
            Err(e) => anyhow!("{e:#}"),
            Ok(_) => anyhow!("internal error: the picture was lost in the stream"),
        };
        done(k, Err(why));
    }
    result
}

fn run_inner(
    engine: &mut Engine,
    long_side: usize,
    first: Job,
    next: &mut (dyn FnMut() -> Option<Job> + Send),
    done: Outcome,
    table: &Table,
) -> Result<Summary> {
    let start = Instant::now();
    let (size, batch) = (engine.info.size, engine.batch);
    engine.detector.reset();
    let fixed = engine.detector.fixed_size();
    let template = engine.info.template.clone();
    let n_workers = engine.workers.len();
    let worker_targets: Vec<Target> = engine.workers.iter().map(|w| w.target.clone()).collect();
    let (detector, workers) = (&mut engine.detector, &mut engine.workers);
    let pools = Pools::new(batch, n_workers, 1);
    let (mask, compare, blend) = (first.mask, first.compare, first.blend);
    let tpl = template.as_str();

    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let (det_tx, det_rx) = bounded::<FaceFrame>(DEPTH);
    let (align_tx, align_rx) = bounded::<FaceFrame>(DEPTH);
    let (enh_tx, enh_rx) = bounded::<FaceFrame>(DEPTH);
    let (paste_tx, paste_rx) = bounded::<FaceFrame>(DEPTH);
    let (batch_tx, batch_rx) = bounded::<Batch>(2 * n_workers);
    let (done_tx, done_rx) = unbounded::<Result<Restored>>();

    std::thread::scope(|s| {
        let p = &pools;
        let decode = s.spawn(move || decode(first, next, (long_side, fixed), (&p.rgb, &p.det), table, done, dec_tx));
        let detect = s.spawn(move || stages::detect(detector, &p.det, dec_rx, det_tx));
        let align = s.spawn(|| stages::align(&template, size, &p.crop, det_rx, align_tx));
        let worker_threads: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                let (rx, tx) = (batch_rx.clone(), done_tx.clone());
                s.spawn(move || dispatch::work(w, batch, size, &rx, &tx, &p.restored))
            })
            .collect();
        drop((batch_rx, done_tx));
        let dispatch = s.spawn(move || {
            dispatch::dispatch(align_rx, &batch_tx, &done_rx, &enh_tx, batch, n_workers, &p.crop, false)
        });
        let paste = s.spawn(move || {
            stages::paste_back(
                (size, tpl, mask),
                blend,
                compare,
                (&p.restored, &p.change),
                enh_rx,
                paste_tx,
            )
        });
        let encode = s.spawn(move || encode(&p.rgb, table, done, paste_rx));

        let decode = joined("decode", decode.join())?;
        let (detect, detect_counts) = joined("detect", detect.join())?;
        let align = joined("align", align.join())?;
        let dispatch = joined("dispatch", dispatch.join())?;
        let mut worker_stats = Vec::new();
        for t in worker_threads {
            worker_stats.push(joined("enhance worker", t.join())?);
        }
        super::add_gpu_memory(&mut worker_stats, &worker_targets);
        let paste = joined("paste", paste.join())?;
        let (encode, faces, with_faces) = joined("encode", encode.join())?;
        Ok(Summary {
            frames: encode.items,
            faces,
            frames_with_faces: with_faces,
            batches: dispatch.batches,
            held_max: dispatch.held_max,
            detect: detect_counts,
            wall: start.elapsed(),
            stages: vec![decode, detect, align, dispatch.stage, paste, encode],
            workers: worker_stats,
            peak_rss: peak_rss(),
        })
    })
}

/// Opens the pictures one after another and sends each one's (first) frame on, numbered;
/// a picture that cannot be decoded is reported failed here and the stream goes on.
fn decode(
    first: Job,
    next: &mut (dyn FnMut() -> Option<Job> + Send),
    (long_side, fixed): (usize, Option<(usize, usize)>),
    pools: (&Pool<Vec<u8>>, &Pool<Vec<u8>>),
    table: &Table,
    done: Outcome,
    tx: Sender<Frame>,
) -> Result<StageStat> {
    let mut clock = Clock::new("decode", 0);
    let mut pending = Some(first);
    for k in 0.. {
        let Some(job) = pending.take().or_else(&mut *next) else {
            break;
        };
        let input = job.source.path.display().to_string();
        if job.cancel.is_cancelled() {
            done(k, Err(Cancelled { frames: 0, input }.into()));
            break;
        }
        let t = Instant::now();
        let o = job.source.orientation;
        let (w, h) = job.source.upright_size();
        let upright = fixed.unwrap_or_else(|| det_size(w, h, long_side));
        let stored = if crate::media::orient::swaps(o) {
            (upright.1, upright.0)
        } else {
            upright
        };
        let decoder = Decoder::new(job.source.clone(), stored, job.hwaccel_cuda);
        table.lock().expect("no panic holds it").insert(k, (job, t));
        let (mut sent, mut gone) = (false, false);
        // A still has one picture; the first frame is the one written.
        let run = decoder.run(pools, Some(1), |mut f| {
            if o > 1 {
                crate::media::orient::turn_frame(o, &mut f, stored, pools);
            }
            f.item = k;
            clock.add(t.elapsed());
            clock.count(1);
            sent = true;
            gone = tx.send(f).is_err();
            false
        });
        if let Err(e) = run {
            if !sent {
                table.lock().expect("no panic holds it").remove(&k);
                done(k, Err(e.context(format!("decode stage, input {input}"))));
            }
        }
        if gone {
            break;
        }
    }
    Ok(clock.finish())
}

/// Writes each picture into its own output as it comes (under a temporary name, renamed when
/// complete) and reports it; frame buffers go back to `rgb_pool`. Returns the stage's
/// statistics, the faces restored and the pictures with faces.
fn encode(
    rgb_pool: &Pool<Vec<u8>>,
    table: &Table,
    done: Outcome,
    rx: Receiver<FaceFrame>,
) -> Result<(StageStat, u64, u64)> {
    let mut clock = Clock::new("encode", DEPTH);
    let (mut n_faces, mut with_faces) = (0u64, 0u64);
    while let Ok(FaceFrame { mut frame, faces }) = {
        clock.queue(rx.len());
        rx.recv()
    } {
        let k = frame.item;
        let Some((job, t)) = table.lock().expect("no panic holds it").remove(&k) else {
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
                .time(|| write_picture(&job, &mut frame))
                .with_context(|| format!("encode stage, output {}", job.output.display()))
                .map(|()| ImageDone {
                    output: job.output.clone(),
                    faces: faces.len() as u64,
                    seconds: t.elapsed().as_secs_f64(),
                })
        };
        if outcome.is_ok() {
            clock.count(1);
            n_faces += faces.len() as u64;
            with_faces += u64::from(!faces.is_empty());
        }
        done(k, outcome);
        rgb_pool.put(std::mem::take(&mut frame.rgb));
    }
    Ok((clock.finish(), n_faces, with_faces))
}

/// Writes `frame` as `job`'s output: under a temporary name beside it, renamed when complete,
/// removed on any error.
fn write_picture(job: &Job, frame: &mut Frame) -> Result<()> {
    let partial = Partial::beside(&job.output)?;
    let written = (|| {
        let mut out_src = job.source.clone();
        let (w, h) = job.source.upright_size();
        (out_src.width, out_src.height) = crate::media::compare::Compare::output_size(job.compare, w, h);
        let mut writer = Writer::create(partial.path(), &out_src, &job.encode)?;
        writer.write(frame)?;
        writer.finish(false)
    })();
    match written {
        Ok(_) => partial.rename_to(&job.output),
        Err(e) => {
            partial.discard();
            Err(e)
        }
    }
}
