//! The pipeline: in, an `Engine` (loaded sessions) and a `Job` (one source, one output); out,
//! the finished output file, its side outputs and a `Summary`.
//!
//! ```text
//!  decode ─> detect ─> smooth ─> align ─> dispatch ═╦═> worker 0 (session on cpu / cuda:0) ═╦═> dispatch ─> paste ─> encode ─> OUT
//!   frames    faces     points    crops   gathers    ╚═> worker 1 (cuda:1) ...             ═╝   frames in    blend    source pts,
//!                       over time         batches        whichever is free takes a batch         order     (mask)   audio copied
//! ```
//! Each stage (`stages.rs`, `dispatch.rs`) is a scoped thread joined to the next by a bounded
//! channel, so memory stays bounded however long the video; buffers travel back through pools
//! instead of being reallocated. From detection on, every stage passes the same envelope, a
//! `FaceFrame`. End of stream is a dropped sender. A stage whose downstream has gone simply
//! stops; the stage that failed reports the error, and the partial output is removed.

mod dispatch;
mod sink;
mod stages;
mod stream;

use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{bounded, unbounded};

pub use stages::align_face;
pub use stream::{run_images, ImageDone, Outcome};

use crate::engine::{Engine, Job};
use crate::frame::{FaceFrame, Frame, Pool};
use crate::media::decode::Decoder;
use crate::media::still::Writer;
use crate::output::Partial;
use crate::runtime::Target;
use crate::stats::{gpu_memory_by_index, peak_rss, Summary, WorkerStat};
use dispatch::{held_frames, Batch, Restored};

/// Frames in flight between two stages.
pub(crate) const DEPTH: usize = 4;

/// Runs `job` on `engine` to completion, writing `job.output` (and its faces JSON). `progress`
/// is called with the number of frames encoded so far. The engine stays usable for another
/// job; on any error nothing is left under the output names.
pub fn run(engine: &mut Engine, job: &Job, progress: &(dyn Fn(u64) + Sync)) -> Result<Summary> {
    let partial = Partial::beside(&job.output)?;
    match run_inner(engine, job, partial.path(), progress) {
        Ok((summary, faces)) => {
            if summary.faces_not_finite() > 0 {
                tracing::warn!(
                    "{} of {} faces kept their original pixels: the model returned NaN or infinity for them (a broken or overflowing model; an fp16 export may overflow where fp32 does not)",
                    summary.faces_not_finite(),
                    summary.faces
                );
            }
            partial.rename_to(&job.output)?;
            if let Some(sink) = faces {
                sink.commit()?;
            }
            Ok(summary)
        }
        Err(e) => {
            partial.discard();
            Err(e)
        }
    }
}

/// Buffer pools sized to what can be in flight, so a buffer is never dropped and reallocated
/// (a fresh 1080p RGB buffer costs page faults on every first touch).
struct Pools {
    rgb: Pool<Vec<u8>>,
    det: Pool<Vec<u8>>,
    crop: Pool<Vec<f32>>,
    restored: Pool<Vec<f32>>,
    /// The paste's change buffers, from paste to encode (sizes of face regions, not crops).
    change: Pool<Vec<f32>>,
}

impl Pools {
    fn new(batch: usize, n_workers: usize, smooth_held: usize) -> Self {
        // Six queues, one frame in each stage, what the smoother and the dispatcher hold.
        let frames = 6 * DEPTH + 8 + smooth_held + held_frames(batch, n_workers);
        // One crop per face of the frames in flight, plus the batches at the workers.
        let crops = frames + 2 * batch * n_workers;
        Self {
            rgb: Pool::new(frames),
            det: Pool::new(frames),
            crop: Pool::new(crops),
            restored: Pool::new(crops),
            change: Pool::new(frames),
        }
    }
}

fn run_inner(
    engine: &mut Engine,
    job: &Job,
    partial: &std::path::Path,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(Summary, Option<sink::FacesSink>)> {
    let start = Instant::now();
    let out_name = job.output.display().to_string();
    let (size, batch) = (engine.info.size, engine.batch);
    // Built before any thread starts: an output that cannot be created fails here.
    // A side-by-side view is twice the source's width.
    let mut out_src = job.source.clone();
    let (w, h) = job.source.upright_size();
    (out_src.width, out_src.height) = crate::media::compare::Compare::output_size(job.compare, w, h);
    let encoder = Writer::create(partial, &out_src, &job.encode).with_context(|| format!("output {out_name}"))?;
    let faces_sink = job.faces_json.as_deref().map(sink::FacesSink::create).transpose()?;
    // An image stream may have left the detector at another picture's size.
    engine.detector.start(engine.key.det_size);
    let (decoder, turn) = decoder_for(job, engine.detector.size);
    let template = engine.info.template.clone();
    let worker_targets: Vec<Target> = engine.workers.iter().map(|w| w.target.clone()).collect();
    let n_workers = engine.workers.len();
    let (detector, workers) = (&mut engine.detector, &mut engine.workers);
    let smoother = crate::faces::smooth::Smoother::new(job.smooth);
    let pools = Pools::new(batch, n_workers, smoother.capacity());
    let (mask, compare) = (job.mask, job.compare);
    let tpl = template.as_str();
    // What the stage threads read of the job (the source's FFmpeg parameters stay here).
    let (max_frames, cancel, blend, output) = (job.max_frames, &job.cancel, job.blend, job.output.as_path());

    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let (det_tx, det_rx) = bounded::<FaceFrame>(DEPTH);
    let (smooth_tx, smooth_rx) = bounded::<FaceFrame>(DEPTH);
    let (align_tx, align_rx) = bounded::<FaceFrame>(DEPTH);
    let (enh_tx, enh_rx) = bounded::<FaceFrame>(DEPTH);
    let (paste_tx, paste_rx) = bounded::<FaceFrame>(DEPTH);
    let (batch_tx, batch_rx) = bounded::<Batch>(2 * n_workers);
    let (done_tx, done_rx) = unbounded::<Result<Restored>>();

    std::thread::scope(|s| {
        let p = &pools;
        let decode = s.spawn(move || stages::decode(decoder, turn, (&p.rgb, &p.det), max_frames, cancel, dec_tx));
        let detect = s.spawn(move || stages::detect(detector, &p.det, dec_rx, det_tx));
        let smooth = s.spawn(move || stages::smooth(smoother, det_rx, smooth_tx));
        let align = s.spawn(|| stages::align(&template, size, &p.crop, smooth_rx, align_tx));
        let worker_threads: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                let (rx, tx) = (batch_rx.clone(), done_tx.clone());
                s.spawn(move || dispatch::work(w, batch, size, &rx, &tx, &p.restored))
            })
            .collect();
        drop((batch_rx, done_tx));
        let dispatch = s
            .spawn(move || dispatch::dispatch(align_rx, &batch_tx, &done_rx, &enh_tx, batch, n_workers, &p.crop, true));
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
        let encode = s.spawn(move || {
            stages::encode(
                encoder,
                output,
                faces_sink,
                (&p.rgb, &p.change),
                max_frames,
                cancel,
                progress,
                paste_rx,
            )
        });

        // The first failing stage in pipeline order is the cause; later ones only saw it stop.
        let decode = joined("decode", decode.join())?;
        let (detect, detect_counts) = joined("detect", detect.join())?;
        let smooth = joined("smooth", smooth.join())?;
        let align = joined("align", align.join())?;
        let dispatch = joined("dispatch", dispatch.join())?;
        let mut worker_stats = Vec::new();
        for t in worker_threads {
            worker_stats.push(joined("enhance worker", t.join())?);
        }
        add_gpu_memory(&mut worker_stats, &worker_targets);
        let paste = joined("paste", paste.join())?;
        let encode = joined("encode", encode.join())?;

        let summary = Summary {
            frames: encode.stage.items,
            faces: encode.faces,
            frames_with_faces: encode.frames_with_faces,
            batches: dispatch.batches,
            held_max: dispatch.held_max,
            detect: detect_counts,
            wall: start.elapsed(),
            stages: vec![decode, detect, smooth, align, dispatch.stage, paste, encode.stage],
            workers: worker_stats,
            peak_rss: peak_rss(),
        };
        Ok((summary, encode.sink))
    })
}

/// Fills in the GPU memory each CUDA worker's GPU holds for this process.
fn add_gpu_memory(stats: &mut [WorkerStat], targets: &[Target]) {
    if targets.iter().any(|t| matches!(t, Target::Cuda(_))) {
        let used = gpu_memory_by_index();
        for (stat, target) in stats.iter_mut().zip(targets) {
            if let Target::Cuda(id) = target {
                stat.device_mib = used.iter().find(|(i, _)| i == id).map(|(_, m)| *m);
            }
        }
    }
}

/// The decoder for `job`'s source with the detector's input size `det` (upright), and for a
/// still stored sideways or mirrored, its EXIF orientation with the detection copy's stored
/// size (the decode stage turns both upright).
fn decoder_for(job: &Job, det: (usize, usize)) -> (Decoder, Option<stages::Turn>) {
    let o = job.source.orientation;
    let stored = if crate::media::orient::swaps(o) {
        (det.1, det.0)
    } else {
        det
    };
    // A video's output is made from its source's own planes; a still's is written from RGB.
    let planes = !crate::media::kind::is_still(&job.output);
    let decoder = Decoder::new(job.source.clone(), stored, job.hwaccel_cuda).with_planes(planes);
    (decoder, (o > 1).then_some((o, stored)))
}

fn joined<T>(name: &str, r: std::thread::Result<Result<T>>) -> Result<T> {
    r.map_err(|_| anyhow!("internal error: the {name} stage panicked"))?
}

/// The aligned crops of the first faces of `job`'s source, at most `want` of them from at most
/// `max_frames` frames, made by the pipeline's own decode, detect and align stages (what bench
/// times the enhancer alone on).
pub fn collect_crops(engine: &mut Engine, job: &Job, want: usize, max_frames: u64) -> Result<Vec<Vec<f32>>> {
    let size = engine.info.size;
    let template = engine.info.template.clone();
    // An image stream may have left the detector at another picture's size.
    engine.detector.start(engine.key.det_size);
    let (decoder, turn) = decoder_for(job, engine.detector.size);
    let detector = &mut engine.detector;
    let (rgb, det, crop) = (Pool::new(DEPTH), Pool::new(DEPTH), Pool::new(0));
    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let (det_tx, det_rx) = bounded::<FaceFrame>(DEPTH);
    let (align_tx, align_rx) = bounded::<FaceFrame>(DEPTH);
    let cancel = &job.cancel;
    std::thread::scope(|s| {
        let decode = s.spawn(|| stages::decode(decoder, turn, (&rgb, &det), Some(max_frames), cancel, dec_tx));
        let detect = s.spawn(|| stages::detect(detector, &det, dec_rx, det_tx));
        let align = s.spawn(|| stages::align(&template, size, &crop, det_rx, align_tx));
        let mut crops = Vec::new();
        for ff in &align_rx {
            crops.extend(ff.faces.into_iter().map(|f| f.crop));
            if crops.len() >= want {
                break;
            }
        }
        drop(align_rx);
        crops.truncate(want);
        // Stopping early is not an error of the stages.
        joined("decode", decode.join())?;
        joined("detect", detect.join())?;
        joined("align", align.join())?;
        Ok(crops)
    })
}
