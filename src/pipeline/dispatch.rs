//! The dispatcher and the enhancement workers: in, aligned frames from the align stage; out,
//! the same frames, in order, with every face's restored crop attached. The dispatcher gathers
//! crops across frames into batches, hands each to whichever worker is free and holds at most
//! a bounded number of frames, so a model slower than decoding holds the decoder back.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use crossbeam_channel::{never, select, Receiver, Sender};

use super::DEPTH;
use crate::faces::enhance::Restored as Output;
use crate::faces::enhance::Worker;
use crate::frame::{FaceFrame, Pool};
use crate::kernels::tensor::{bytes_change, tensor_change};
use crate::stats::{Clock, StageStat, WorkerStat};

/// Bounds of how long a partial batch waits for more crops while every worker is idle: a few
/// times the usual gap between frames, so a slow upstream does not split every batch.
const PARTIAL_WAIT: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// A batch on its way to a worker: the crops travel by move, not copy.
pub(crate) struct Batch {
    /// (frame sequence number, face index) of each crop.
    keys: Vec<(u64, usize)>,
    crops: Vec<Vec<u8>>,
    /// Another fidelity than the run's, for this batch only (the identity guard's re-runs).
    fidelity: Option<f32>,
    /// Where the result goes when not to the dispatcher (the identity guard's re-runs).
    reply: Option<Sender<Result<Restored>>>,
}

impl Batch {
    /// A batch of `crops` run at `fidelity`, its result sent to `reply`.
    pub(crate) fn rerun(crops: Vec<Vec<u8>>, fidelity: f32, reply: Sender<Result<Restored>>) -> Self {
        Batch {
            keys: (0..crops.len()).map(|i| (0, i)).collect(),
            crops,
            fidelity: Some(fidelity),
            reply: Some(reply),
        }
    }
}

/// A batch back from a worker.
pub(crate) struct Restored {
    keys: Vec<(u64, usize)>,
    /// `None` for a crop the model returned non-finite values for: that face keeps its pixels.
    restored: Vec<Option<Vec<i16>>>,
    crops: Vec<Vec<u8>>,
}

/// Each crop's change (`None`: not finite), and the crops given back.
pub(crate) type Changes = (Vec<Option<Vec<i16>>>, Vec<Vec<u8>>);

impl Restored {
    /// The changes, in the batch's order, and the crops given back.
    pub(crate) fn into_parts(self) -> Changes {
        (self.restored, self.crops)
    }
}

/// The identity guard's way to the enhancement workers: runs crops again at another fidelity
/// on whichever worker is free, between the dispatcher's batches.
pub(crate) struct Rerunner {
    jobs: Sender<Batch>,
    batch: usize,
}

impl Rerunner {
    /// Re-runs through the workers that take `jobs`, at most `batch` crops a call.
    pub(crate) fn new(jobs: Sender<Batch>, batch: usize) -> Self {
        Rerunner {
            jobs,
            batch: batch.max(1),
        }
    }

    /// Runs `crops` at `fidelity`: each crop's change (`None`: not finite), and the crops back.
    pub(crate) fn run(&self, crops: Vec<Vec<u8>>, fidelity: f32) -> Result<Changes> {
        let (mut changes, mut back) = (Vec::with_capacity(crops.len()), Vec::with_capacity(crops.len()));
        let mut crops = crops.into_iter().peekable();
        while crops.peek().is_some() {
            let part: Vec<Vec<u8>> = crops.by_ref().take(self.batch).collect();
            let (tx, rx) = crossbeam_channel::bounded(1);
            self.jobs
                .send(Batch::rerun(part, fidelity, tx))
                .map_err(|_| anyhow!("every enhance worker has stopped"))?;
            let (c, b) = rx
                .recv()
                .map_err(|_| anyhow!("the enhance worker stopped before running the crops again"))??
                .into_parts();
            changes.extend(c);
            back.extend(b);
        }
        Ok((changes, back))
    }
}

/// Frames the dispatcher may hold while their faces are being enhanced.
pub(crate) fn held_frames(batch: usize, n_workers: usize) -> usize {
    2 * batch.max(DEPTH) * n_workers
}

/// What the dispatcher did: its stage statistics, batches sent, most frames held at once.
pub(crate) struct DispatchStat {
    pub(crate) stage: StageStat,
    pub(crate) batches: u64,
    pub(crate) held_max: usize,
}

/// When a partial batch goes out (besides the end of the stream and too many frames waiting).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Flush {
    /// Never: an image stream of a folder (the gap between two pictures is no sign of an end).
    Never,
    /// After a short wait with every worker idle (a video).
    Idle,
    /// Once its first crop has waited this long and a worker is free (a service: a lone
    /// request is not held, and under load the batches fill while the workers are busy).
    After(Duration),
}

/// Gathers crops across frames into batches, hands each to whichever worker is free, and
/// releases frames in order once all their faces are back. A partial batch goes out at the end
/// of the stream, when too many frames wait, or as `flush` says: after a short wait with
/// every worker idle (a video), once its first crop has waited a set time (a service). An image
/// stream of a folder has no flush: the gap between two pictures (opening,
/// decoding a whole photo) is no sign that the stream has ended, and a partial batch sent in it
/// would split the batches of every picture.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch(
    align_rx: Receiver<FaceFrame>,
    job_tx: &Sender<Batch>,
    done_rx: &Receiver<Result<Restored>>,
    enh_tx: &Sender<FaceFrame>,
    batch: usize,
    n_workers: usize,
    (crop_pool, keep): (&Pool<Vec<u8>>, bool),
    flush: Flush,
) -> Result<DispatchStat> {
    let mut clock = Clock::new("dispatch", DEPTH);
    let mut batcher = Batcher::new(batch, held_frames(batch, n_workers));
    let max_in_flight = 2 * n_workers;
    let (mut in_flight, mut batches, mut end, mut stalled) = (0usize, 0u64, false, false);
    let mut held_max = 0usize;
    // Mean gap between frames arriving, smoothed.
    let (mut gap, mut last_arrival) = (PARTIAL_WAIT.0, Instant::now());
    // Since when crops have waited for a batch.
    let mut pending_since: Option<Instant> = None;
    loop {
        // Finished frames leave first, so a batcher full only of them is not taken for one
        // stuck with a partial batch.
        while let Some(f) = batcher.pop_ready() {
            clock.count(1);
            if enh_tx.send(f).is_err() {
                return Ok(DispatchStat {
                    stage: clock.finish(),
                    batches,
                    held_max,
                });
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
                    .send(Batch {
                        keys,
                        crops,
                        fidelity: None,
                        reply: None,
                    })
                    .map_err(|_| anyhow!("every enhance worker has stopped"))?;
                in_flight += 1;
                batches += 1;
                stalled = false;
            }
            Ok(())
        })?;
        if end && in_flight == 0 && batcher.held() == 0 {
            return Ok(DispatchStat {
                stage: clock.finish(),
                batches,
                held_max,
            });
        }
        // Full: leave frames upstream, so the bounded queues hold the decoder back.
        held_max = held_max.max(batcher.held());
        let input = if end || batcher.is_full() { &never() } else { &align_rx };
        if batcher.pending() == 0 {
            pending_since = None;
        } else if pending_since.is_none() {
            pending_since = Some(Instant::now());
        }
        let wait = match (flush, pending_since) {
            (Flush::Idle, Some(_)) if in_flight == 0 => (gap * 3).clamp(PARTIAL_WAIT.0, PARTIAL_WAIT.1),
            // Only to a worker that is free: while they are all busy, crops gather into a
            // full batch anyway.
            (Flush::After(d), Some(t)) if in_flight < n_workers => d.saturating_sub(t.elapsed()),
            _ => Duration::from_secs(3600),
        };
        clock.queue(align_rx.len());
        select! {
            recv(input) -> m => match m {
                Ok(mut f) => {
                    gap = (gap * 7 + last_arrival.elapsed()) / 8;
                    last_arrival = Instant::now();
                    // A picture no longer wanted costs the model nothing.
                    if f.frame.dropped.as_ref().is_some_and(|d| d.load(std::sync::atomic::Ordering::Relaxed)) {
                        f.faces.drain(..).for_each(|j| crop_pool.put(j.crop));
                    }
                    batcher.push(f);
                }
                Err(_) => end = true,
            },
            recv(done_rx) -> d => {
                let done = d.map_err(|_| anyhow!("enhance workers stopped unexpectedly"))??;
                in_flight -= 1;
                clock.time(|| {
                    // Each crop back to its face when a later stage reads it (`keep`: the identity
                    // stage, which gives it back), else to the pool.
                    let mut crops = done.crops.into_iter();
                    for ((seq, face), rgb) in done.keys.into_iter().zip(done.restored) {
                        let job = &mut batcher.frame_mut(seq).faces[face];
                        job.restored = rgb;
                        if let Some(c) = crops.next() {
                            if keep {
                                job.crop = c;
                            } else {
                                crop_pool.put(c);
                            }
                        }
                        batcher.done(seq);
                    }
                    crops.for_each(|c| crop_pool.put(c));
                });
            },
            default(wait) => stalled = true,
        }
    }
}

/// One worker's loop: takes batches, runs its session, sends the restored crops back.
pub(crate) fn work(
    worker: &mut Worker,
    batch: usize,
    size: usize,
    jobs: &Receiver<Batch>,
    done: &Sender<Result<Restored>>,
    restored_pool: &Pool<Vec<i16>>,
) -> Result<WorkerStat> {
    let mut stat = WorkerStat {
        name: worker.target.to_string(),
        batch,
        ..Default::default()
    };
    let fidelity = worker.enhancer.fidelity();
    // The run's level, as the crops went in.
    let cpu = worker.enhancer.cpu();
    for mut job in jobs {
        let t = Instant::now();
        let reply = job.reply.take();
        let done = reply.as_ref().unwrap_or(done);
        worker.enhancer.set_fidelity(job.fidelity.unwrap_or(fidelity));
        // A panic in the run is reported like an error: its batch would otherwise never come
        // back and the dispatcher would wait for it forever.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<Restored> {
            if worker.fault.fail_at == Some(stat.batches + 1) {
                bail!("injected failure (GPEN_VIDEO_FAULTS)");
            }
            if worker.fault.delay_ms > 0 {
                std::thread::sleep(Duration::from_millis(worker.fault.delay_ms));
            }
            let mut restored: Vec<Option<Vec<i16>>> = (0..job.crops.len()).map(|_| Some(restored_pool.get())).collect();
            let crops: Vec<&[u8]> = job.crops.iter().map(Vec::as_slice).collect();
            if worker.skip_model {
                for r in restored.iter_mut().flatten() {
                    r.clear();
                    r.resize(3 * size * size, 0);
                }
                return Ok(Restored {
                    keys: job.keys,
                    restored,
                    crops: job.crops,
                });
            }
            worker.enhancer.run(&crops, |i, out| match out {
                // NaN or infinity (a broken model, an overflow in fp16): keep the face as it was
                // rather than paste a black or white square.
                Output::Floats(out) => {
                    if !tensor_change(cpu, out, crops[i], size, restored[i].as_mut().expect("filled above")) {
                        if let Some(buf) = restored[i].take() {
                            restored_pool.put(buf);
                        }
                    }
                }
                Output::Bytes(out) => {
                    bytes_change(out, crops[i], size, restored[i].as_mut().expect("filled above"));
                }
            })?;
            Ok(Restored {
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
                worker.live.add(d.keys.len() as u64, t.elapsed());
                stat.nonfinite += d.restored.iter().filter(|r| r.is_none()).count() as u64;
                // A re-run's asker gone stops nothing; the dispatcher gone stops the worker.
                if done.send(Ok(d)).is_err() && reply.is_none() {
                    break;
                }
            }
            Err(e) => {
                let e = e.context(format!(
                    "enhance worker {} (batch {}), model {}",
                    worker.target,
                    stat.batches + 1,
                    worker.model.display()
                ));
                let msg = format!("{e:#}");
                let _ = done.send(Err(e));
                bail!(msg);
            }
        }
    }
    Ok(stat)
}

/// Gathers face crops across consecutive frames into batches and releases frames in order once
/// all their faces are back. It holds at most `max_hold` frames: the dispatcher stops taking
/// frames when it is full, so a model slower than decoding holds the decoder back instead of
/// piling frames up in memory. A partial batch runs only when the stream ends or when the
/// batcher is full (long stretches with few faces).
pub(crate) struct Batcher {
    batch: usize,
    max_hold: usize,
    held: VecDeque<FaceFrame>,
    /// Faces still to run: (position in `held` counted from `base`, face index).
    pending: VecDeque<(u64, usize)>,
    /// Sequence number of `held[0]`.
    base: u64,
    /// Faces not yet restored per held frame.
    waiting: VecDeque<usize>,
}

impl Batcher {
    pub(super) fn new(batch: usize, max_hold: usize) -> Self {
        Self {
            batch: batch.max(1),
            max_hold: max_hold.max(1),
            held: VecDeque::new(),
            pending: VecDeque::new(),
            base: 0,
            waiting: VecDeque::new(),
        }
    }

    pub(super) fn push(&mut self, f: FaceFrame) {
        let seq = self.base + self.held.len() as u64;
        for i in 0..f.faces.len() {
            self.pending.push_back((seq, i));
        }
        self.waiting.push_back(f.faces.len());
        self.held.push_back(f);
    }

    /// The next batch to run, if one is due: full, or partial when `end` or too much is held.
    pub(crate) fn due(&mut self, end: bool) -> Option<Vec<(u64, usize)>> {
        let due = self.pending.len() >= self.batch || (!self.pending.is_empty() && (end || self.is_full()));
        due.then(|| {
            let n = self.pending.len().min(self.batch);
            self.pending.drain(..n).collect()
        })
    }

    /// The held frame with sequence `seq`.
    pub(crate) fn frame_mut(&mut self, seq: u64) -> &mut FaceFrame {
        &mut self.held[(seq - self.base) as usize]
    }

    /// Marks one face of frame `seq` as restored.
    pub(super) fn done(&mut self, seq: u64) {
        let w = &mut self.waiting[(seq - self.base) as usize];
        *w = w.saturating_sub(1);
    }

    /// The oldest frame, if all its faces are back.
    pub(crate) fn pop_ready(&mut self) -> Option<FaceFrame> {
        if *self.waiting.front()? > 0 {
            return None;
        }
        self.waiting.pop_front();
        self.base += 1;
        self.held.pop_front()
    }

    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// Holds as many frames as it may: take no more until some leave.
    pub(crate) fn is_full(&self) -> bool {
        self.held.len() >= self.max_hold
    }

    /// Faces waiting for a batch.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Face, FaceJob, Frame};

    fn frame(index: u64, faces: usize) -> FaceFrame {
        let job = || {
            FaceJob::detected(Face {
                bbox: [0.0; 4],
                score: 1.0,
                landmarks: [[0.0; 2]; 5],
                outline: None,
            })
        };
        FaceFrame {
            frame: Frame::blank(index),
            faces: (0..faces).map(|_| job()).collect(),
            left: Vec::new(),
        }
    }

    /// Drives the batcher like the enhance stage does; returns the batch sizes run and the
    /// order frames came out in.
    fn drive(faces: &[usize], batch: usize, max_hold: usize) -> (Vec<usize>, Vec<u64>) {
        let mut b = Batcher::new(batch, max_hold);
        let (mut sizes, mut out) = (Vec::new(), Vec::new());
        let step = |b: &mut Batcher, end: bool, sizes: &mut Vec<usize>, out: &mut Vec<u64>| {
            while let Some(jobs) = b.due(end) {
                sizes.push(jobs.len());
                for (seq, face) in jobs {
                    b.frame_mut(seq).faces[face].restored = Some(vec![1]);
                    b.done(seq);
                }
                while let Some(f) = b.pop_ready() {
                    out.push(f.frame.index);
                }
            }
            while let Some(f) = b.pop_ready() {
                out.push(f.frame.index);
            }
        };
        for (i, &n) in faces.iter().enumerate() {
            b.push(frame(i as u64, n));
            step(&mut b, false, &mut sizes, &mut out);
        }
        step(&mut b, true, &mut sizes, &mut out);
        assert_eq!(b.held(), 0);
        (sizes, out)
    }

    #[test]
    fn batches_fill_across_frames_and_frames_leave_in_order() {
        let cases: &[(&[usize], usize, &[usize])] = &[
            (&[1, 1, 1, 1, 1, 1, 1, 1], 4, &[4, 4]),
            (&[4, 4, 4], 4, &[4, 4, 4]),
            (&[3, 0, 2, 0, 0, 3], 4, &[4, 4]),
            (&[1, 1, 1], 4, &[3]),
            (&[5], 4, &[4, 1]),
            (&[0, 0, 0], 4, &[]),
            (&[2, 2, 2], 1, &[1, 1, 1, 1, 1, 1]),
        ];
        for &(faces, batch, want) in cases {
            let (sizes, out) = drive(faces, batch, 1000);
            assert_eq!(sizes, want, "faces {faces:?} batch {batch}");
            assert_eq!(out, (0..faces.len() as u64).collect::<Vec<_>>(), "order for {faces:?}");
        }
    }

    /// Runs `dispatch` on frames of one face each arriving `gap` apart, with one worker that
    /// answers at once; returns the size of every batch it sent.
    fn dispatched(n: u64, gap: Duration, flush: Flush) -> Vec<usize> {
        let (align_tx, align_rx) = crossbeam_channel::bounded::<FaceFrame>(DEPTH);
        let (job_tx, job_rx) = crossbeam_channel::bounded::<Batch>(2);
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Result<Restored>>();
        let (enh_tx, enh_rx) = crossbeam_channel::unbounded::<FaceFrame>();
        let pool = Pool::new(8);
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..n {
                    std::thread::sleep(gap);
                    align_tx.send(frame(i, 1)).unwrap();
                }
            });
            let worker = s.spawn(move || {
                let mut sizes = Vec::new();
                for b in &job_rx {
                    sizes.push(b.keys.len());
                    let restored = b.keys.iter().map(|_| Some(Vec::new())).collect();
                    let back = Restored {
                        keys: b.keys,
                        restored,
                        crops: b.crops,
                    };
                    done_tx.send(Ok(back)).unwrap();
                }
                sizes
            });
            dispatch(align_rx, &job_tx, &done_rx, &enh_tx, 4, 1, (&pool, false), flush).unwrap();
            drop(job_tx);
            assert_eq!(enh_rx.try_iter().count() as u64, n, "every frame comes out");
            worker.join().unwrap()
        })
    }

    #[test]
    fn an_image_stream_waits_for_full_batches_however_slow_its_pictures_come() {
        // Pictures 150 ms apart (a large photo to open and decode): a video's dispatcher sends
        // what it has once every worker has been idle a few frame gaps; a stream's waits.
        let gap = Duration::from_millis(150);
        assert_eq!(dispatched(9, gap, Flush::Never), vec![4, 4, 1]);
    }

    #[test]
    fn a_service_holds_a_lone_crop_only_its_wait_and_fills_batches_from_a_burst() {
        // Requests 150 ms apart, a 20 ms wait: each goes out alone, without waiting for more.
        let lone = dispatched(3, Duration::from_millis(150), Flush::After(Duration::from_millis(20)));
        assert_eq!(lone, vec![1, 1, 1]);
        // A burst (1 ms apart) within the wait fills whole batches.
        let burst = dispatched(8, Duration::from_millis(1), Flush::After(Duration::from_millis(200)));
        assert_eq!(burst, vec![4, 4]);
    }

    #[test]
    fn a_long_faceless_stretch_does_not_hold_frames_forever() {
        let mut faces = vec![1];
        faces.extend(std::iter::repeat_n(0, 50));
        let (sizes, out) = drive(&faces, 4, 8);
        assert_eq!(
            sizes,
            vec![1],
            "the lone face runs as a partial batch once 8 frames wait"
        );
        assert_eq!(out.len(), 51);
        let mut b = Batcher::new(4, 8);
        b.push(frame(0, 1));
        for i in 1..7 {
            b.push(frame(i, 0));
            assert!(b.due(false).is_none(), "7 frames held is still fine");
            assert!(!b.is_full());
        }
        b.push(frame(7, 0));
        assert!(b.is_full(), "8 held: the dispatcher takes no more");
        assert_eq!(b.due(false).map(|j| j.len()), Some(1));
    }
}
