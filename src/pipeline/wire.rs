//! The one wiring of the pipeline: in, an `Engine`, what sets the middle stages apart
//! (`Middle`: mask, blend, compare view, smoothing or none, idle flush or none) and the two
//! ends a caller brings (a decode stage that sends `Frame`s, an encode stage that receives
//! `FaceFrame`s); out, the run's `Summary` and what the encode stage handed back.
//!
//! ```text
//!  decode ─> detect ─> [mesh] ─> [smooth] ─> align ─> dispatch ═╦═> worker 0 ═╦═> dispatch ─> [temporal] ─> paste ─> encode
//!  (caller's)                                                     ╚═> worker 1 ═╝                                     (caller's)
//! ```
//! A video run and an image stream both run through [`wire`]; only their real differences
//! stay with them: how frames are decoded and written, smoothing (videos only) and the
//! dispatcher's idle flush (videos only). Every stage is a scoped thread joined to the next by
//! a bounded channel of `DEPTH` items; the pools are sized from the queues and stages built
//! here, so a new stage changes the count by itself.

use std::time::Instant;

use anyhow::{anyhow, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use super::dispatch::{self, held_frames, Batch, Restored};
use super::stages;
use crate::engine::Engine;
use crate::faces::paste::MaskKind;
use crate::faces::smooth::Smoother;
use crate::frame::{FaceFrame, Frame, Pool};
use crate::media::compare::Compare;
use crate::runtime::Target;
use crate::stats::{gpu_memory_by_index, peak_rss, StageStat, Summary, WorkerStat};

/// Frames in flight between two stages.
pub(crate) const DEPTH: usize = 4;

/// Buffer pools sized to what can be in flight, so a buffer is never dropped and reallocated
/// (a fresh 1080p RGB buffer costs page faults on every first touch).
pub(crate) struct Pools {
    pub rgb: Pool<Vec<u8>>,
    pub det: Pool<Vec<u8>>,
    pub crop: Pool<Vec<f32>>,
    pub restored: Pool<Vec<f32>>,
    /// The paste's change buffers, from paste to encode (sizes of face regions, not crops).
    pub change: Pool<Vec<f32>>,
    /// Half-resolution luma of the crops, from alignment to the temporal filter.
    pub luma: Pool<Vec<f32>>,
}

impl Pools {
    /// Pools for `queues` frame queues of `DEPTH` between `stages` stages, with what the
    /// smoother (`smooth_held` frames) and the dispatcher hold besides.
    fn new(queues: usize, stages: usize, smooth_held: usize, batch: usize, n_workers: usize) -> Self {
        // Every queue full, one frame in (or blocked sending from) each stage, one spare.
        let frames = queues * DEPTH + stages + 1 + smooth_held + held_frames(batch, n_workers);
        // One crop per face of the frames in flight, plus the batches at the workers.
        let crops = frames + 2 * batch * n_workers;
        Self {
            rgb: Pool::new(frames),
            det: Pool::new(frames),
            crop: Pool::new(crops),
            restored: Pool::new(crops),
            change: Pool::new(frames),
            luma: Pool::new(crops),
        }
    }
}

/// What sets the middle of a pipeline apart.
pub(crate) struct Middle {
    pub mask: MaskKind,
    /// The face mesh's presence threshold (with a mesh).
    pub face_check: f32,
    /// Memory of the temporal filter of the model's change, when it runs (videos; it needs the
    /// smoother's tracks).
    pub temporal: Option<f32>,
    pub blend: f32,
    pub compare: Option<Compare>,
    /// Each tracked face's points smoothed over time; `None` in an image stream, where every
    /// picture is a scene of its own.
    pub smoother: Option<Smoother>,
    /// When the dispatcher sends a partial batch (see [`dispatch::dispatch`]).
    pub flush: dispatch::Flush,
}

/// What an encode stage reports: its clock, the faces it wrote, the frames with faces, and
/// whatever else the caller needs back (`extra`).
pub(crate) struct Encoded<T> {
    pub stage: StageStat,
    pub faces: u64,
    pub frames_with_faces: u64,
    pub extra: T,
}

/// Runs `decode -> detect -> [smooth] -> align -> dispatch/workers -> paste -> encode` on
/// `engine` to the end of `decode`'s frames. `start` is when the run began (for the wall
/// time). The first failing stage in pipeline order is the error reported; later ones only
/// saw it stop.
pub(crate) fn wire<T: Send>(
    engine: &mut Engine,
    middle: Middle,
    start: Instant,
    decode: impl FnOnce(&Pools, Sender<Frame>) -> Result<StageStat> + Send,
    encode: impl FnOnce(&Pools, Receiver<FaceFrame>) -> Result<Encoded<T>> + Send,
) -> Result<(Summary, T)> {
    let (size, batch, threads) = (engine.info.size, engine.batch, engine.pool_threads);
    let template = engine.info.template.clone();
    let worker_targets: Vec<Target> = engine.workers.iter().map(|w| w.target.clone()).collect();
    let n_workers = engine.workers.len();
    let (detector, workers, meshers) = (&mut engine.detector, &mut engine.workers, &mut engine.meshers);
    let Middle {
        mask,
        face_check,
        temporal,
        blend,
        compare,
        smoother,
        flush,
    } = middle;
    // Every frame queue is made here, counted as it is made: the pools are sized from them.
    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let mut queues = 1;
    let mut queue = || {
        queues += 1;
        bounded::<FaceFrame>(DEPTH)
    };
    let (det_tx, det_rx) = queue();
    let mesh_queue = (!meshers.is_empty()).then(&mut queue);
    let mesh_threads = meshers.len().max(1);
    let smooth_queue = smoother.as_ref().map(|_| queue());
    let (align_tx, align_rx) = queue();
    let (enh_tx, enh_rx) = queue();
    // The temporal filter needs the smoother's tracks.
    let temporal = temporal.filter(|_| smoother.is_some());
    let temporal_queue = temporal.is_some().then(&mut queue);
    let (paste_tx, paste_rx) = queue();
    let (batch_tx, batch_rx) = bounded::<Batch>(2 * n_workers);
    let (done_tx, done_rx) = unbounded::<Result<Restored>>();
    // One stage drains each queue, and the encode stage ends the line; each extra thread of
    // the two pool stages holds a frame, and its reorder buffer up to about two more (see
    // `pool::ordered`).
    let smooth_held = smoother.as_ref().map_or(0, Smoother::capacity);
    let stages = queues + 1 + 2 * 3 * (threads - 1) + 3 * (mesh_threads - 1);
    let pools = Pools::new(queues, stages, smooth_held, batch, n_workers);
    let tpl = template.as_str();

    std::thread::scope(|s| {
        let p = &pools;
        let decode = s.spawn(move || decode(p, dec_tx));
        let detect = s.spawn(move || stages::detect(detector, &p.det, dec_rx, det_tx));
        // Without a mesh, detection feeds smoothing directly.
        let (mesh, mesh_out) = match mesh_queue {
            Some((tx, rx)) => (
                Some(s.spawn(move || stages::mesh(meshers, face_check, (tpl, size), det_rx, tx))),
                rx,
            ),
            None => (None, det_rx),
        };
        // Without smoothing, it feeds alignment.
        let (smooth, align_in) = match (smoother, smooth_queue) {
            (Some(smoother), Some((tx, rx))) => (Some(s.spawn(move || stages::smooth(smoother, mesh_out, tx))), rx),
            _ => (None, mesh_out),
        };
        let luma = temporal.is_some().then_some(&p.luma);
        let align = s.spawn(move || stages::align(tpl, size, (&p.crop, luma), threads, align_in, align_tx));
        let worker_threads: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                let (rx, tx) = (batch_rx.clone(), done_tx.clone());
                s.spawn(move || dispatch::work(w, batch, size, &rx, &tx, &p.restored))
            })
            .collect();
        drop((batch_rx, done_tx));
        let dispatch = s.spawn(move || {
            dispatch::dispatch(align_rx, &batch_tx, &done_rx, &enh_tx, batch, n_workers, &p.crop, flush)
        });
        // With the temporal filter, the dispatcher's frames go through it to the paste.
        let (temporal, paste_in) = match (temporal, temporal_queue) {
            (Some(memory), Some((tx, rx))) => (
                Some(s.spawn(move || stages::temporal(memory, (tpl, size), &p.luma, enh_rx, tx))),
                rx,
            ),
            _ => (None, enh_rx),
        };
        let paste = s.spawn(move || {
            stages::paste_back(
                (size, tpl, mask),
                blend,
                compare,
                (&p.restored, &p.change),
                threads,
                paste_in,
                paste_tx,
            )
        });
        let encode = s.spawn(move || encode(p, paste_rx));

        let mut stages = vec![joined("decode", decode.join())?];
        let (detect, mut detect_counts) = joined("detect", detect.join())?;
        stages.push(detect);
        if let Some(mesh) = mesh {
            let (stage, not_faces) = joined("mesh", mesh.join())?;
            stages.push(stage);
            detect_counts.not_faces = not_faces;
        }
        if let Some(smooth) = smooth {
            stages.push(joined("smooth", smooth.join())?);
        }
        stages.push(joined("align", align.join())?);
        let dispatch = joined("dispatch", dispatch.join())?;
        stages.push(dispatch.stage);
        let mut worker_stats = Vec::new();
        for t in worker_threads {
            worker_stats.push(joined("enhance worker", t.join())?);
        }
        add_gpu_memory(&mut worker_stats, &worker_targets);
        let mut flicker = None;
        if let Some(temporal) = temporal {
            let (stage, f) = joined("temporal", temporal.join())?;
            stages.push(stage);
            flicker = Some(f);
        }
        stages.push(joined("paste", paste.join())?);
        let encoded = joined("encode", encode.join())?;
        let frames = encoded.stage.items;
        stages.push(encoded.stage);

        let summary = Summary {
            frames,
            faces: encoded.faces,
            frames_with_faces: encoded.frames_with_faces,
            batches: dispatch.batches,
            held_max: dispatch.held_max,
            detect: detect_counts,
            wall: start.elapsed(),
            stages,
            workers: worker_stats,
            peak_rss: peak_rss(),
            flicker,
        };
        Ok((summary, encoded.extra))
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

/// A stage thread's result, a panic turned into an error naming the stage.
pub(crate) fn joined<T>(name: &str, r: std::thread::Result<Result<T>>) -> Result<T> {
    r.map_err(|_| anyhow!("internal error: the {name} stage panicked"))?
}
