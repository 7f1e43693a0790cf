//! The pipeline: in, a resolved `Plan`; out, the finished output file and a `Summary`.
//!
//! ```text
//!  decode ─> detect ─> align ─> dispatch ═╦═> worker 0 (session on cpu / cuda:0) ═╦═> dispatch ─> paste ─> encode ─> OUT
//!   frames    faces     crops   gathers    ╚═> worker 1 (cuda:1) ...             ═╝   frames in    blend    source pts,
//!                               batches        whichever is free takes a batch         order                audio copied
//! ```
//! Each stage is a scoped thread joined to the next by a bounded channel, so memory stays
//! bounded however long the video; buffers travel back through pools instead of being
//! reallocated. End of stream is a dropped sender. A stage whose downstream has gone simply
//! stops; the stage that failed reports the error, and the partial output is removed.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use crossbeam_channel::{bounded, never, select, unbounded, Receiver, Sender};

use crate::align::{fit_similarity, template_named, tensor_to_rgb, warp_to_tensor, Affine};
use crate::decode::Decoder;
use crate::detect::Detector;
use crate::encode::Encoder;
use crate::enhance::{Batcher, Worker};
use crate::frame::{Face, FaceFrame, FaceJob, Frame, Pool, Region};
use crate::paste::{paste, region, Mask};
use crate::plan::Plan;
use crate::runtime::Target;
use crate::stats::{gpu_memory_by_index, peak_rss, Clock, StageStat, Summary, WorkerStat};

/// Frames in flight between two stages.
const DEPTH: usize = 4;
/// Bounds of how long a partial batch waits for more crops while every worker is idle: a few
/// times the usual gap between frames, so a slow upstream does not split every batch.
const PARTIAL_WAIT: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// Face regions of one frame, for `--faces-json`.
struct FrameFaces {
    index: u64,
    regions: Vec<Region>,
    faces: Vec<Face>,
}

/// A batch on its way to a worker: the crops travel by move, not copy.
struct Job {
    keys: Vec<(u64, usize)>,
    crops: Vec<Vec<f32>>,
}

/// A batch back from a worker.
struct Done {
    keys: Vec<(u64, usize)>,
    restored: Vec<Vec<u8>>,
    crops: Vec<Vec<f32>>,
}

/// Runs the plan to completion, writing `plan.output`. `progress` is called with the number of
/// frames encoded so far. The plan's sessions stay usable for another run.
pub fn run(plan: &mut Plan, progress: &(dyn Fn(u64) + Sync)) -> Result<Summary> {
    let partial = crate::plan::partial_path(&plan.output)?;
    let result = run_inner(plan, &partial, progress);
    if result.is_err() {
        std::fs::remove_file(&partial).ok();
    }
    result
}

fn run_inner(plan: &mut Plan, partial: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<Summary> {
    let start = Instant::now();
    let out_name = plan.output.display().to_string();
    let in_name = plan.source.path.display().to_string();
    let size = plan.info.size;
    let template_name = plan.info.template.clone();
    let w = plan.source.width;
    let (batch, blend, max_frames) = (plan.batch, plan.blend, plan.max_frames);
    let keep_log = plan.faces_json.is_some();
    let (cancel, cancel_encode) = (plan.cancel.clone(), plan.cancel.clone());
    // Built before any thread starts: an output that cannot be created fails here.
    let mut encoder =
        Encoder::create(partial, &plan.source, &plan.encode).with_context(|| format!("output {out_name}"))?;
    let decoder = Decoder::new(plan.source.clone(), plan.detector.size, plan.hwaccel_cuda);
    let detector: &mut Detector = &mut plan.detector;
    detector.reset();
    let worker_targets: Vec<Target> = plan.workers.iter().map(|w| w.target.clone()).collect();
    let workers: &mut [Worker] = &mut plan.workers;
    let n_workers = workers.len();

    // Room for every frame that can be in flight (five queues, one in each stage, and what the
    // dispatcher holds), so a frame buffer is never dropped and reallocated: a fresh 1080p RGB
    // buffer costs page faults on every first touch.
    let in_flight = 5 * DEPTH + 8 + held_frames(batch, n_workers);
    let (rgb_pool, det_pool) = (Pool::<Vec<u8>>::new(in_flight), Pool::<Vec<u8>>::new(in_flight));
    // Crops (and restored crops) in flight: one per face of the frames in flight, plus the
    // batches at the workers.
    let crops_in_flight = in_flight + 2 * batch * n_workers;
    let (crop_pool, restored_pool) = (
        Pool::<Vec<f32>>::new(crops_in_flight),
        Pool::<Vec<u8>>::new(crops_in_flight),
    );
    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let (det_tx, det_rx) = bounded::<(Frame, Vec<Face>)>(DEPTH);
    let (align_tx, align_rx) = bounded::<FaceFrame>(DEPTH);
    let (enh_tx, enh_rx) = bounded::<FaceFrame>(DEPTH);
    let (paste_tx, paste_rx) = bounded::<(Frame, FrameFaces)>(DEPTH);
    let (job_tx, job_rx) = bounded::<Job>(2 * n_workers);
    let (done_tx, done_rx) = unbounded::<Result<Done>>();

    std::thread::scope(|s| {
        let decode = {
            let (rgb_pool, det_pool) = (&rgb_pool, &det_pool);
            let in_name = &in_name;
            s.spawn(move || -> Result<StageStat> {
                let mut clock = Clock::new("decode", 0);
                let mut t = Instant::now();
                let mut cancelled = false;
                decoder
                    .run((rgb_pool, det_pool), max_frames, |f| {
                        clock.add(t.elapsed());
                        clock.count(1);
                        cancelled = cancel.load(Ordering::Relaxed);
                        let ok = !cancelled && dec_tx.send(f).is_ok();
                        t = Instant::now();
                        ok
                    })
                    .with_context(|| format!("decode stage, input {in_name}"))?;
                if cancelled {
                    bail!(
                        "cancelled after {} frames of {in_name}; no output written",
                        clock.finish().items
                    );
                }
                Ok(clock.finish())
            })
        };

        let detect = {
            let det_pool = &det_pool;
            s.spawn(move || -> Result<(StageStat, crate::detect::DetectCounts)> {
                let mut clock = Clock::new("detect", DEPTH);
                while let Some(mut f) = recv(&dec_rx, &mut clock) {
                    let faces = clock
                        .time(|| detector.detect(&f.det, f.width, f.height))
                        .with_context(|| format!("detect stage, frame {}", f.index))?;
                    det_pool.put(std::mem::take(&mut f.det));
                    if det_tx.send((f, faces)).is_err() {
                        break;
                    }
                }
                Ok((clock.finish(), detector.counts()))
            })
        };

        let align = {
            let (crop_pool, template_name) = (&crop_pool, &template_name);
            s.spawn(move || -> Result<StageStat> {
                let mut clock = Clock::new("align", DEPTH);
                let tpl = template_named(template_name, size);
                while let Some((mut f, faces)) = recv(&det_rx, &mut clock) {
                    let jobs = clock.time(|| {
                        faces
                            .into_iter()
                            .map(|face| {
                                let mut crop = crop_pool.get();
                                let (to_crop, region) = align_face(&mut f, &face, &tpl, size, &mut crop);
                                FaceJob {
                                    face,
                                    to_crop,
                                    region,
                                    crop,
                                    restored: None,
                                }
                            })
                            .collect::<Vec<_>>()
                    });
                    if align_tx.send(FaceFrame { frame: f, faces: jobs }).is_err() {
                        break;
                    }
                }
                Ok(clock.finish())
            })
        };

        let mut worker_threads = Vec::new();
        for worker in workers.iter_mut() {
            let (job_rx, done_tx, restored_pool) = (job_rx.clone(), done_tx.clone(), &restored_pool);
            worker_threads.push(s.spawn(move || work(worker, batch, size, &job_rx, &done_tx, restored_pool)));
        }
        drop((job_rx, done_tx));

        let dispatch = {
            let crop_pool = &crop_pool;
            s.spawn(move || -> Result<(StageStat, u64, usize)> {
                dispatch(align_rx, &job_tx, &done_rx, &enh_tx, batch, n_workers, crop_pool)
            })
        };

        let paste_stage = {
            let restored_pool = &restored_pool;
            s.spawn(move || -> Result<StageStat> {
                let mut clock = Clock::new("paste", DEPTH);
                let mask = Mask::new(size);
                while let Some(FaceFrame { mut frame, faces }) = recv(&enh_rx, &mut clock) {
                    let info = clock.time(|| {
                        let mut info = FrameFaces {
                            index: frame.index,
                            regions: Vec::new(),
                            faces: Vec::new(),
                        };
                        for job in faces {
                            if let Some(crop) = job.restored {
                                // Nothing to blend in at 0 (or off the frame): the frame stays
                                // as decoded.
                                if let Some(r) = job.region.filter(|_| blend > 0.0) {
                                    paste(&mut frame.rgb, w, &crop, &job.to_crop, r, &mask, blend);
                                    frame.dirty.push(r);
                                }
                                restored_pool.put(crop);
                            }
                            info.regions.extend(job.region);
                            info.faces.push(job.face);
                        }
                        info
                    });
                    if paste_tx.send((frame, info)).is_err() {
                        break;
                    }
                }
                Ok(clock.finish())
            })
        };

        let encode_stage = {
            let (out_name, rgb_pool) = (&out_name, &rgb_pool);
            s.spawn(move || -> Result<(StageStat, Vec<FrameFaces>, u64, u64)> {
                let mut clock = Clock::new("encode", DEPTH);
                let (mut faces, mut with_faces) = (0u64, 0u64);
                let mut log = Vec::new();
                while let Some((mut frame, info)) = recv(&paste_rx, &mut clock) {
                    if cancel_encode.load(Ordering::Relaxed) {
                        bail!("cancelled at frame {}; no output written", frame.index);
                    }
                    clock
                        .time(|| encoder.write(&mut frame))
                        .with_context(|| format!("encode stage, output {out_name}, frame {}", frame.index))?;
                    clock.count(1);
                    faces += info.faces.len() as u64;
                    with_faces += u64::from(!info.faces.is_empty());
                    progress(encoder.frames);
                    rgb_pool.put(std::mem::take(&mut frame.rgb));
                    if keep_log {
                        log.push(info);
                    }
                }
                let cut = max_frames.is_some_and(|m| encoder.frames >= m);
                clock
                    .time(|| encoder.finish(cut))
                    .with_context(|| format!("encode stage, finishing {out_name}"))?;
                Ok((clock.finish(), log, faces, with_faces))
            })
        };

        // The first failing stage in pipeline order is the cause; later ones only saw it stop.
        let decode = joined("decode", decode.join())?;
        let (detect, detect_counts) = joined("detect", detect.join())?;
        let align = joined("align", align.join())?;
        let (dispatch, batches, held_max) = joined("dispatch", dispatch.join())?;
        let mut worker_stats = Vec::new();
        for t in worker_threads {
            worker_stats.push(joined("enhance worker", t.join())?);
        }
        if worker_targets.iter().any(|t| matches!(t, Target::Cuda(_))) {
            let used = gpu_memory_by_index();
            for (stat, target) in worker_stats.iter_mut().zip(&worker_targets) {
                if let Target::Cuda(id) = target {
                    stat.device_mib = used.iter().find(|(i, _)| i == id).map(|(_, m)| *m);
                }
            }
        }
        let paste_stat = joined("paste", paste_stage.join())?;
        let (encode, log, faces, frames_with_faces) = joined("encode", encode_stage.join())?;

        if let Some(path) = &plan.faces_json {
            write_faces_json(path, &log).with_context(|| format!("writing {}", path.display()))?;
        }
        std::fs::rename(partial, &plan.output)
            .with_context(|| format!("cannot move the finished file into place as {out_name}"))?;
        Ok(Summary {
            frames: encode.items,
            faces,
            frames_with_faces,
            batches,
            held_max,
            detect: detect_counts,
            wall: start.elapsed(),
            stages: vec![decode, detect, align, dispatch, paste_stat, encode],
            workers: worker_stats,
            peak_rss: peak_rss(),
        })
    })
}

/// Aligns one face of `f` to the template: makes sure the frame's RGB covers the face, warps
/// it into `crop` (an NCHW item of `size`) and returns the frame-to-crop transform with the
/// frame region the crop covers.
pub fn align_face(
    f: &mut Frame,
    face: &Face,
    tpl: &[[f32; 2]; 5],
    size: usize,
    crop: &mut Vec<f32>,
) -> (Affine, Option<Region>) {
    let to_crop = fit_similarity(&face.landmarks, tpl);
    let r = region(&to_crop, size, f.width, f.height);
    if let Some(r) = r {
        f.ensure_rgb(r);
    }
    crop.resize(3 * size * size, 0.0);
    warp_to_tensor(&f.rgb, f.width, f.height, &to_crop, size, crop);
    (to_crop, r)
}

/// Frames the dispatcher may hold while their faces are being enhanced.
fn held_frames(batch: usize, n_workers: usize) -> usize {
    2 * batch.max(DEPTH) * n_workers
}

/// Receives the next item, recording the queue length the stage found.
fn recv<T>(rx: &Receiver<T>, clock: &mut Clock) -> Option<T> {
    clock.queue(rx.len());
    rx.recv().ok()
}

fn joined<T>(name: &str, r: std::thread::Result<Result<T>>) -> Result<T> {
    r.map_err(|_| anyhow!("internal error: the {name} stage panicked"))?
}

/// Gathers crops across frames into batches, hands each to whichever worker is free, and
/// releases frames in order once all their faces are back. A partial batch goes out at the end
/// of the stream, when too many frames wait, or after a short wait with every worker idle.
fn dispatch(
    align_rx: Receiver<FaceFrame>,
    job_tx: &Sender<Job>,
    done_rx: &Receiver<Result<Done>>,
    enh_tx: &Sender<FaceFrame>,
    batch: usize,
    n_workers: usize,
    crop_pool: &Pool<Vec<f32>>,
) -> Result<(StageStat, u64, usize)> {
    let mut clock = Clock::new("dispatch", DEPTH);
    let mut batcher = Batcher::new(batch, held_frames(batch, n_workers));
    let max_in_flight = 2 * n_workers;
    let (mut in_flight, mut batches, mut end, mut stalled) = (0usize, 0u64, false, false);
    let mut held_max = 0usize;
    // Mean gap between frames arriving, smoothed.
    let (mut gap, mut last_arrival) = (PARTIAL_WAIT.0, Instant::now());
    loop {
        // Finished frames leave first, so a batcher full only of them is not taken for one
        // stuck with a partial batch.
        while let Some(f) = batcher.pop_ready() {
            clock.count(1);
            if enh_tx.send(f).is_err() {
                return Ok((clock.finish(), batches, held_max));
            }
        }
        clock.time(|| -> Result<()> {
            while in_flight < max_in_flight {
                let Some(keys) = batcher.due(end || stalled) else { break };
                let crops = keys
                    .iter()
                    .map(|&(seq, face)| std::mem::take(&mut batcher.frame_mut(seq).faces[face].crop))
                    .collect();
                job_tx
                    .send(Job { keys, crops })
                    .map_err(|_| anyhow!("every enhance worker has stopped"))?;
                in_flight += 1;
                batches += 1;
                stalled = false;
            }
            Ok(())
        })?;
        if end && in_flight == 0 && batcher.held() == 0 {
            return Ok((clock.finish(), batches, held_max));
        }
        // Full: leave frames upstream, so the bounded queues hold the decoder back.
        held_max = held_max.max(batcher.held());
        let input = if end || batcher.is_full() { &never() } else { &align_rx };
        let wait = if batcher.pending() > 0 && in_flight == 0 {
            (gap * 3).clamp(PARTIAL_WAIT.0, PARTIAL_WAIT.1)
        } else {
            Duration::from_secs(3600)
        };
        clock.queue(align_rx.len());
        select! {
            recv(input) -> m => match m {
                Ok(f) => {
                    gap = (gap * 7 + last_arrival.elapsed()) / 8;
                    last_arrival = Instant::now();
                    batcher.push(f);
                }
                Err(_) => end = true,
            },
            recv(done_rx) -> d => {
                let done = d.map_err(|_| anyhow!("enhance workers stopped unexpectedly"))??;
                in_flight -= 1;
                clock.time(|| {
                    for ((seq, face), rgb) in done.keys.into_iter().zip(done.restored) {
                        batcher.frame_mut(seq).faces[face].restored = Some(rgb);
                        batcher.done(seq);
                    }
                    done.crops.into_iter().for_each(|c| crop_pool.put(c));
                });
            },
            default(wait) => stalled = true,
        }
    }
}

/// One worker's loop: takes batches, runs its session, sends the restored crops back.
fn work(
    worker: &mut Worker,
    batch: usize,
    size: usize,
    jobs: &Receiver<Job>,
    done: &Sender<Result<Done>>,
    restored_pool: &Pool<Vec<u8>>,
) -> Result<WorkerStat> {
    let mut stat = WorkerStat {
        name: worker.target.to_string(),
        batch,
        ..Default::default()
    };
    for job in jobs {
        let t = Instant::now();
        // A panic in the run is reported like an error: its batch would otherwise never come
        // back and the dispatcher would wait for it forever.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<Done> {
            if worker.fault.fail_at == Some(stat.batches + 1) {
                bail!("injected failure (GPEN_VIDEO_FAULTS)");
            }
            if worker.fault.delay_ms > 0 {
                std::thread::sleep(Duration::from_millis(worker.fault.delay_ms));
            }
            let mut restored: Vec<Vec<u8>> = (0..job.crops.len()).map(|_| restored_pool.get()).collect();
            let crops: Vec<&[f32]> = job.crops.iter().map(Vec::as_slice).collect();
            worker
                .enhancer
                .run(&crops, |i, out| tensor_to_rgb(out, size, &mut restored[i]))?;
            Ok(Done {
                keys: job.keys,
                restored,
                crops: job.crops,
            })
        }))
        .unwrap_or_else(|_| Err(anyhow!("the model run panicked")));
        stat.busy += t.elapsed();
        match result {
            Ok(d) => {
                stat.batches += 1;
                stat.faces += d.keys.len() as u64;
                if done.send(Ok(d)).is_err() {
                    break;
                }
            }
            Err(e) => {
                let e = e.context(format!("enhance worker {} (batch {})", worker.target, stat.batches + 1));
                let msg = format!("{e:#}");
                let _ = done.send(Err(e));
                bail!(msg);
            }
        }
    }
    Ok(stat)
}

fn write_faces_json(path: &Path, log: &[FrameFaces]) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "[")?;
    for (i, f) in log.iter().enumerate() {
        let regions: Vec<String> = f
            .regions
            .iter()
            .map(|r| format!("[{},{},{},{}]", r.0, r.1, r.2, r.3))
            .collect();
        let boxes: Vec<String> = f
            .faces
            .iter()
            .map(|x| {
                let lms: Vec<String> = x
                    .landmarks
                    .iter()
                    .map(|p| format!("[{:.1},{:.1}]", p[0], p[1]))
                    .collect();
                format!(
                    "{{\"bbox\":[{:.1},{:.1},{:.1},{:.1}],\"score\":{:.3},\"landmarks\":[{}]}}",
                    x.bbox[0],
                    x.bbox[1],
                    x.bbox[2],
                    x.bbox[3],
                    x.score,
                    lms.join(",")
                )
            })
            .collect();
        let comma = if i + 1 < log.len() { "," } else { "" };
        writeln!(
            out,
            "{{\"frame\":{},\"regions\":[{}],\"faces\":[{}]}}{comma}",
            f.index,
            regions.join(","),
            boxes.join(",")
        )?;
    }
    writeln!(out, "]")?;
    out.flush()?;
    Ok(())
}
