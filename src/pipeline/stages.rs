//! The stages, one function each: in, the channel from the stage before (and what the stage
//! owns: decoder, detector, encoder, pools); out, the channel to the next and the stage's
//! statistics. Each returns when its input ends or its output's receiver is gone.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender};

use super::ctx::StageCtx;
use super::pool;
use super::sink::FacesSink;
use super::DEPTH;
use crate::budget::Budget;
use crate::engine::{CancelToken, Cancelled, Kind, KindExt};
use crate::faces::detect::{iou, nms_by, Detector, Passer};
use crate::faces::mesh::{self, Mesher};
use crate::faces::paste::{apply_rgb, changes, fixed_from_a_level, ColorFix, Mask, MaskKind, Paste, Scratch};
use crate::faces::smooth::Smoother;
use crate::frame::{Face, FaceFrame, FaceJob, Frame, Picture, Pool, View};
use crate::geom::{crop_footprint, fit_similarity, Affine, Rect};
use crate::kernels::lowband::{remove_low_band, LowBand};
use crate::kernels::warp::{filtered, mip_level, warp_area_loading, warp_cubic_loading, warp_face, WarpScratch};
use crate::media::color::{add_changes, writable};
use crate::media::decode::Decoder;
use crate::media::still::Writer;
use crate::stats::DetectCounts;
use crate::stats::{thread_cpu_time, Clock, StageStat};

/// Receives the next item, recording the queue length the stage found.
pub(super) fn recv<T>(rx: &Receiver<T>, clock: &mut Clock) -> Option<T> {
    clock.queue(rx.len());
    rx.recv().ok()
}

/// A still's EXIF orientation and its detection copy's stored size.
pub(crate) type Turn = (u8, (usize, usize));

/// Decodes frames into `tx` (turned upright by `turn`: a still's EXIF orientation and its
/// detection copy's stored size) until the source ends, `max_frames` are out, the receiver is gone
/// or `cancel` is set (then it fails with [`Cancelled`]). With a `budget`, each frame waits for
/// its ticket before it is sent (the wait is not the stage's work).
#[allow(clippy::too_many_arguments)]
pub(super) fn decode(
    decoder: Decoder,
    turn: Option<Turn>,
    pools: (&Pool<Vec<u8>>, &Pool<Vec<u8>>),
    budget: Option<&Arc<Budget>>,
    max_frames: Option<u64>,
    cancel: &CancelToken,
    tx: Sender<Frame>,
) -> Result<StageStat> {
    let mut clock = Clock::new("decode", 0);
    let (mut t, mut c) = (Instant::now(), thread_cpu_time());
    let mut cancelled = false;
    let input = decoder.path().display().to_string();
    let report = decoder
        .run(pools, max_frames, |mut f| {
            if let Some((o, det)) = turn {
                crate::media::orient::turn_frame(o, &mut f, det, pools);
            }
            clock.add(t.elapsed(), thread_cpu_time().saturating_sub(c));
            clock.count(1);
            f.ticket = budget.map(|b| b.take());
            cancelled = cancel.is_cancelled();
            let ok = !cancelled && tx.send(f).is_ok();
            (t, c) = (Instant::now(), thread_cpu_time());
            ok
        })
        .with_context(|| format!("decode stage, input {input}"))
        .kind(Kind::BadInput)?;
    let mut stat = clock.finish();
    // The detection copies made on this thread alone: a host of more cores shares them out.
    stat.spread_cpu = report.convert_cpu;
    if cancelled {
        return Err(Cancelled {
            frames: stat.items,
            input,
        }
        .into());
    }
    Ok(stat)
}

/// Finds the faces of each frame; the detection copy goes back to `det_pool`. Each picture of
/// an image stream is a scene of its own, at its own detection size.
pub(super) fn detect(
    detector: &mut Detector,
    det_pool: &Pool<Vec<u8>>,
    rx: Receiver<Frame>,
    tx: Sender<FaceFrame>,
) -> Result<(StageStat, DetectCounts)> {
    let mut clock = Clock::new("detect", DEPTH);
    let (helpers_at_start, model_at_start) = (detector.helper_cpu(), detector.model_cpu());
    let mut item = None;
    while let Some(mut frame) = recv(&rx, &mut clock) {
        if item != Some(frame.item) {
            if item.is_some() || frame.det_size != detector.size {
                detector.next_picture(frame.det_size);
            }
            item = Some(frame.item);
        }
        let faces = clock
            .time(|| detector.detect(&frame.det, frame.width, frame.height, frame.index))
            .with_context(|| format!("detect stage, frame {}", frame.index))?;
        det_pool.put(std::mem::take(&mut frame.det));
        let faces = faces.into_iter().map(FaceJob::detected).collect();
        if tx
            .send(FaceFrame {
                frame,
                faces,
                left: Vec::new(),
            })
            .is_err()
        {
            break;
        }
    }
    // The helpers' CPU (windows on the detector's other sessions) beside this thread's.
    let spent = detector.helper_cpu().saturating_sub(helpers_at_start);
    clock.add(std::time::Duration::ZERO, spent);
    let mut stat = clock.finish();
    stat.threads = detector.sessions();
    stat.chain = true;
    stat.model_cpu = detector.model_cpu().saturating_sub(model_at_start);
    Ok((stat, detector.counts()))
}

/// Finds and follows the faces of a video, the face mesh on the detector's one chain of frames
/// (a video with a mesh, `--detect-every` above 1).
///
/// Between the detector's whole-frame passes a face kept on the frame before is followed by its
/// mesh alone, in a crop placed by its points there ([`mesh::follow_roi`]): the mesh's points,
/// outline and box are the face's on this frame, and no detector model runs for it. A pass runs
/// on its frames ([`Detector::pass_due`]: frame indices that are multiples of `--detect-every`,
/// a scene cut, nothing followed), at once when a followed face is lost (the mesh no longer
/// takes it for a face), and while a face is kept without a mesh. On a pass's frame every face
/// it finds is meshed from its detection and judged as the mesh stage judges detections
/// ([`judge`]), the faces followed so far taking the place of none of them: what is found then
/// does not depend on the frames before, so a segment's warm-up finds from its first pass on
/// exactly what one run finds. A followed face the pass missed is still followed.
///
/// A frame's crops are shared out among `meshers`' sessions, a part on a thread each; frames
/// leave in order. The detection copy goes back to the detection pool.
pub(crate) fn detect_follow(
    detector: &mut Detector,
    meshers: &mut [Mesher],
    ctx: &StageCtx,
    rx: Receiver<Frame>,
    tx: Sender<FaceFrame>,
) -> Result<(StageStat, DetectCounts)> {
    let mut clock = Clock::new("detect", DEPTH);
    let models =
        |d: &Detector, m: &[Mesher]| d.model_cpu() + m.iter().map(Mesher::model_cpu).sum::<std::time::Duration>();
    let model_at_start = models(detector, meshers);
    let tally = Tally::default();
    let mut meshing = Meshing::new(meshers.len(), ctx.threads, ctx.cpu);
    let mut follow = Follow::default();
    while let Some(mut frame) = recv(&rx, &mut clock) {
        follow.picture(&frame, detector);
        let Follow {
            prev,
            unfollowed,
            followed,
            ..
        } = &mut follow;
        let (index, dims) = (frame.index, (frame.width, frame.height));
        let mut step = || -> Result<Vec<FaceJob>> {
            let cut = detector.scene_cut(&frame.det);
            if cut {
                prev.clear();
            }
            let mut found = Vec::new();
            let passed = detector.pass_due(index, cut, prev.is_empty()) || *unfollowed;
            if passed {
                found = match frame.pass.take() {
                    Some(ahead) => ahead,
                    None => detector.pass(&frame.det, dims)?,
                };
                // The followed faces the pass found are its own from here.
                prev.retain(|p| found.iter().all(|f| iou(&p.bbox, &f.bbox) < detector.nms_iou));
            }
            // The followed faces by their meshes, then the pass's by theirs, in one go.
            let n = prev.len();
            let rois = prev.iter().map(mesh::follow_roi).chain(found.iter().map(mesh::roi));
            let meshed_now = meshing.run(meshers, &mut frame, rois)?;
            let mut jobs = Vec::with_capacity(meshed_now);
            let mut lost = false;
            let mut meshes = meshed(meshers, meshed_now);
            for (face, found) in prev.drain(..).zip(meshes.by_ref().take(n)) {
                if found.presence < ctx.treatment.face_check {
                    lost = true;
                    continue;
                }
                let mut job = FaceJob::detected(Face {
                    bbox: found.outline_box(),
                    ..face
                });
                take_mesh(&mut job, found, &ctx.template);
                jobs.push(job);
            }
            *followed += jobs.len() as u64;
            for (face, found) in found.drain(..).zip(meshes) {
                let mut job = FaceJob::detected(face);
                if judge(&mut job, found, ctx, &tally) {
                    jobs.push(job);
                }
            }
            if lost && !passed {
                // Look for the lost face (and any other) at once.
                found = detector.pass(&frame.det, dims)?;
                found.retain(|f| jobs.iter().all(|j| iou(&j.face.bbox, &f.bbox) < detector.nms_iou));
                let meshed_now = meshing.run(meshers, &mut frame, found.iter().map(mesh::roi))?;
                for (face, found) in found.into_iter().zip(meshed(meshers, meshed_now)) {
                    let mut job = FaceJob::detected(face);
                    if judge(&mut job, found, ctx, &tally) {
                        jobs.push(job);
                    }
                }
            }
            let mut jobs = nms_by(jobs, |j| (j.face.bbox, j.face.score), detector.nms_iou);
            detector.cap(&mut jobs);
            Ok(jobs)
        };
        let faces = clock
            .time(&mut step)
            .with_context(|| format!("detect stage, frame {index}"))?;
        follow.keep(&faces);
        ctx.pools.det.put(std::mem::take(&mut frame.det));
        if tx
            .send(FaceFrame {
                frame,
                faces,
                left: Vec::new(),
            })
            .is_err()
        {
            break;
        }
    }
    clock.add(std::time::Duration::ZERO, meshing.cpu.helpers);
    let mut stat = clock.finish();
    stat.threads = meshers.len().max(1);
    stat.chain = true;
    stat.spread_cpu = meshing.cpu.warps;
    stat.model_cpu = models(detector, meshers).saturating_sub(model_at_start);
    let mut counts = detector.counts();
    counts.followed = follow.followed;
    (counts.not_faces, counts.kept_doubted) = tally.counts();
    Ok((stat, counts))
}

/// What the detect stage of [`detect_follow`] carries from frame to frame.
#[derive(Default)]
struct Follow {
    /// The faces followed into the next frame (their boxes and points; outlines not kept).
    prev: Vec<Face>,
    /// A face was kept without a mesh on the frame before: a whole-frame pass finds it again.
    unfollowed: bool,
    /// The picture of an image stream the faces are on (a video's frames are all picture 0).
    item: Option<usize>,
    /// Faces followed by their meshes so far.
    followed: u64,
}

impl Follow {
    /// Starts afresh where `frame` begins another picture of a stream (the detector set to its
    /// size): nothing is followed from one picture into the next.
    fn picture(&mut self, frame: &Frame, detector: &mut Detector) {
        if self.item == Some(frame.item) {
            return;
        }
        if self.item.is_some() || frame.det_size != detector.size {
            detector.next_picture(frame.det_size);
        }
        self.item = Some(frame.item);
        self.prev.clear();
        self.unfollowed = false;
    }

    /// Keeps a frame's faces to follow into the next: those with a mesh by their points; one
    /// kept without asks for a whole-frame pass.
    fn keep(&mut self, faces: &[FaceJob]) {
        self.unfollowed = faces.iter().any(|j| j.face.outline.is_none());
        self.prev
            .extend(faces.iter().filter(|j| j.face.outline.is_some()).map(|j| Face {
                bbox: j.face.bbox,
                score: j.face.score,
                landmarks: j.face.landmarks,
                outline: None,
            }));
    }
}

/// Runs a video's whole-frame passes ahead of the detect stage's chain
/// ([`detect_follow`]), on as many threads as there are `passers` (a detector session each):
/// every frame whose number is a multiple of `every` gets its pass in [`Frame::pass`], the
/// faces the chain's own pass would find there; frames leave in order. Returns the stage's
/// statistics and the passes run. The chain then only
/// meshes on those frames, and runs a pass itself only where one falls due otherwise (a scene
/// cut, nothing followed, a face lost).
pub(crate) fn pass_ahead(
    passers: &mut [Passer],
    every: u64,
    rx: Receiver<Frame>,
    tx: Sender<Frame>,
) -> Result<(StageStat, u64)> {
    let runs_at_start: u64 = passers.iter().map(Passer::runs).sum();
    let threads = passers.len();
    let model_at_start: std::time::Duration = passers.iter().map(Passer::model_cpu).sum();
    let free = parking_lot::Mutex::new(passers.iter_mut().collect::<Vec<_>>());
    let init = || free.lock().pop();
    let work = |p: &mut Option<&mut Passer>, f: &mut Frame| -> Result<()> {
        match p.as_deref_mut() {
            Some(p) if f.index.is_multiple_of(every) && p.fits(f.det_size) => {
                let found = p
                    .pass(&f.det, (f.width, f.height))
                    .with_context(|| format!("detect stage, frame {}", f.index))?;
                f.pass = Some(found);
                Ok(())
            }
            _ => Ok(()),
        }
    };
    let mut stat = pool::ordered("pass", DEPTH, threads, init, work, rx, tx)?;
    drop(free);
    let model: std::time::Duration = passers.iter().map(Passer::model_cpu).sum();
    stat.model_cpu = model.saturating_sub(model_at_start);
    Ok((stat, passers.iter().map(Passer::runs).sum::<u64>() - runs_at_start))
}

/// What meshing a video's faces keeps from frame to frame in the detect stage: a warp scratch
/// per thread the crops are shared out on, their pool, the crops' frame -> crop transforms and
/// frame regions, and the CPU time it spent.
struct Meshing {
    scratch: Vec<WarpScratch>,
    pool: Option<rayon::ThreadPool>,
    rois: Vec<Affine>,
    regions: Vec<Option<Rect>>,
    cpu: MeshCpu,
}

impl Meshing {
    /// A warp scratch per thread the crops are shared out on: each of `sessions`' own, or with
    /// one session (a GPU), the pool's `threads`.
    fn new(sessions: usize, threads: usize, cpu: crate::kernels::Cpu) -> Meshing {
        let warpers = if sessions > 1 { sessions } else { threads.max(1) };
        Meshing {
            scratch: (0..warpers).map(|_| WarpScratch::at(cpu)).collect(),
            pool: crate::parts::pool(warpers, "mesh"),
            rois: Vec::new(),
            regions: Vec::new(),
            cpu: MeshCpu::default(),
        }
    }

    /// Meshes the faces of `f` whose frame -> crop transforms are `rois` ([`mesh_faces`]);
    /// returns how many were meshed (their meshes are then read with [`meshed`]).
    fn run(&mut self, meshers: &mut [Mesher], f: &mut Frame, rois: impl Iterator<Item = Affine>) -> Result<usize> {
        self.rois.clear();
        self.rois.extend(rois);
        let scratch = (&mut self.scratch[..], self.pool.as_ref());
        mesh_faces(meshers, scratch, f, (&self.rois, &mut self.regions), &mut self.cpu)?;
        Ok(self.rois.len())
    }
}

/// CPU time a frame's meshing spent: on threads other than the caller's, and warping crops on
/// any thread (the part a GPU host still spreads over threads).
#[derive(Default)]
struct MeshCpu {
    helpers: std::time::Duration,
    warps: std::time::Duration,
}

/// Meshes the faces of `f` whose frame -> crop transforms are `rois` (`regions` holds their
/// frame regions while it runs; see [`meshed`] for where
/// their meshes are then read): the crops shared out among the sessions of `meshers` in
/// consecutive parts, each part warped and run on a thread of `pool` (all on this thread
/// without one). With one session (a GPU) the crops are still warped on as many threads as
/// there are `scratch` buffers, and run as one batch here.
fn mesh_faces(
    meshers: &mut [Mesher],
    (scratch, pool): (&mut [WarpScratch], Option<&rayon::ThreadPool>),
    f: &mut Frame,
    (rois, regions): (&[Affine], &mut Vec<Option<Rect>>),
    cpu: &mut MeshCpu,
) -> Result<()> {
    let n = rois.len();
    if n == 0 {
        return Ok(());
    }
    let (w, h) = (f.width, f.height);
    // The crops' frame regions, in a buffer the caller keeps from frame to frame.
    regions.clear();
    regions.extend(rois.iter().map(|t| crop_footprint(t, mesh::SIZE, w, h)));
    let regions = &regions[..];
    for (t, r) in rois.iter().zip(regions) {
        ready_to_warp(f, t, *r);
    }
    let f = &*f;
    let plane = 3 * mesh::SIZE * mesh::SIZE;
    // Warps crops into consecutive planes of `input`; returns the thread CPU it took.
    let warp = |input: &mut [f32], sc: &mut WarpScratch, ts: &[Affine], rs: &[Option<Rect>]| {
        let start = thread_cpu_time();
        for ((t, r), input) in ts.iter().zip(rs).zip(input.chunks_exact_mut(plane)) {
            warp_ready(f, t, *r, mesh::SIZE, input, sc);
            // The crop is in [-1, 1]; the mesh takes [0, 1].
            for x in input.iter_mut() {
                *x = *x * 0.5 + 0.5;
            }
        }
        thread_cpu_time().saturating_sub(start)
    };
    let warp = &warp;
    // Parts of `per` crops each, on `parts` threads (this one first).
    let (threads, shared) = if meshers.len() > 1 {
        (meshers.len(), false)
    } else {
        (scratch.len(), true)
    };
    let per = n.div_ceil(threads.clamp(1, n));
    let (helpers, warps, done) = if shared {
        // One session: warp in parallel into its one input, then run it here (below).
        let input = &mut meshers[0].input(n)[..n * plane];
        let jobs = input
            .chunks_mut(per * plane)
            .zip(scratch.iter_mut())
            .zip(rois.chunks(per).zip(regions.chunks(per)))
            .map(|((input, sc), (ts, rs))| move || (Ok(()), warp(input, sc, ts, rs)))
            .collect();
        run_parts(pool, jobs)
    } else {
        let jobs = meshers
            .iter_mut()
            .zip(scratch.iter_mut())
            .zip(rois.chunks(per).zip(regions.chunks(per)))
            .map(|((m, sc), (ts, rs))| {
                move || {
                    let input = &mut m.input(ts.len())[..ts.len() * plane];
                    let spent = warp(input, sc, ts, rs);
                    (m.run(ts).map(|_| ()), spent)
                }
            })
            .collect();
        run_parts(pool, jobs)
    };
    let done = if shared {
        done.and_then(|()| meshers[0].run(rois).map(|_| ()))
    } else {
        done
    };
    cpu.helpers += helpers;
    cpu.warps += warps;
    done.with_context(|| format!("face mesh, frame {}", f.index))
}

/// Runs `jobs` (each giving its outcome and the CPU it spent warping): on the threads of `pool`
/// when there are several (this thread waits), else here; returns the CPU time they took on
/// the pool, the warping time of all and the first failure.
fn run_parts<J>(
    pool: Option<&rayon::ThreadPool>,
    jobs: Vec<J>,
) -> (std::time::Duration, std::time::Duration, Result<()>)
where
    J: FnOnce() -> (Result<()>, std::time::Duration) + Send,
{
    let zero = std::time::Duration::ZERO;
    let Some(pool) = pool.filter(|_| jobs.len() > 1) else {
        let (mut done, mut warps) = (Ok(()), zero);
        for job in jobs {
            let (part, w) = job();
            warps += w;
            done = done.and(part);
        }
        return (zero, warps, done);
    };
    // Each job's outcome and warping time, with the CPU its thread spent on it.
    type Done = ((Result<()>, std::time::Duration), std::time::Duration);
    let mut slots: Vec<Option<Done>> = (0..jobs.len()).map(|_| None).collect();
    pool.scope(|s| {
        for (job, slot) in jobs.into_iter().zip(slots.iter_mut()) {
            s.spawn(move |_| {
                let start = thread_cpu_time();
                let out = job();
                *slot = Some((out, thread_cpu_time().saturating_sub(start)));
            });
        }
    });
    let (mut done, mut warps, mut helpers) = (Ok(()), zero, zero);
    for ((part, w), c) in slots.into_iter().flatten() {
        helpers += c;
        warps += w;
        done = done.and(part);
    }
    (helpers, warps, done)
}

/// The meshes of the latest [`mesh_faces`] of `n` crops on `meshers`, in the crops' order.
fn meshed(meshers: &[Mesher], n: usize) -> impl Iterator<Item = &mesh::Mesh> {
    let per = if n == 0 {
        1
    } else {
        n.div_ceil(meshers.len().clamp(1, n))
    };
    meshers
        .iter()
        .take(n.div_ceil(per))
        .enumerate()
        .flat_map(move |(p, m)| m.last(per.min(n - p * per)))
}

/// Runs the face mesh on every frame's faces (one batch per frame, on as many threads as
/// `meshers` has sessions; frames leave in order). A detection whose face-presence probability
/// is at least `face_check` takes the five points derived from its mesh and its outline, in
/// frame pixels (for the record) and in the crop of `size` aligned to `template` by those
/// points (for the mesh mask). One the mesh doubts keeps the detector's points and no outline:
/// it is kept if the detector is confident ([`crate::defaults::CONFIDENT`]); in a video, one
/// scoring at least [`crate::defaults::SUPPORT_SCORE`] is left to the faces found where it is
/// on the frames around it (marked [`FaceJob::doubt`], see the smoother); any other is dropped. Returns the stage's
/// statistics, the detections dropped and those kept despite the mesh's doubt.
pub(crate) fn mesh(
    meshers: &mut [Mesher],
    ctx: &StageCtx,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<(StageStat, (u64, u64))> {
    let tally = Tally::default();
    let threads = meshers.len();
    let model_at_start: std::time::Duration = meshers.iter().map(|m| m.model_cpu()).sum();
    let free = parking_lot::Mutex::new(meshers.iter_mut().collect::<Vec<_>>());
    let init = || {
        let m = free.lock().pop();
        (m, WarpScratch::at(ctx.cpu), Vec::new())
    };
    let work = |(m, scratch, rois): &mut (Option<&mut Mesher>, WarpScratch, Vec<Affine>), ff: &mut FaceFrame| {
        let Some(m) = m.as_deref_mut() else {
            return Ok(());
        };
        if ff.faces.is_empty() {
            return Ok(());
        }
        let (w, h) = (ff.frame.width, ff.frame.height);
        rois.clear();
        rois.extend(ff.faces.iter().map(|j| mesh::roi(&j.face)));
        let n = rois.len();
        let plane = 3 * mesh::SIZE * mesh::SIZE;
        for (i, t) in rois.iter().enumerate() {
            let r = crop_footprint(t, mesh::SIZE, w, h);
            let input = &mut m.input(n)[i * plane..][..plane];
            warp_from_frame(&mut ff.frame, t, r, mesh::SIZE, input, scratch);
            // The crop is in [-1, 1]; the mesh takes [0, 1].
            for x in input.iter_mut() {
                *x = *x * 0.5 + 0.5;
            }
        }
        let meshes = m
            .run(rois)
            .with_context(|| format!("mesh stage, frame {}", ff.frame.index))?;
        let mut found = meshes.iter();
        ff.faces.retain_mut(|job| {
            let Some(found) = found.next() else { return true };
            judge(job, found, ctx, &tally)
        });
        Ok(())
    };
    let mut stat = pool::ordered("mesh", DEPTH, threads, init, work, rx, tx)?;
    drop(free);
    let model: std::time::Duration = meshers.iter().map(|m| m.model_cpu()).sum();
    stat.model_cpu = model.saturating_sub(model_at_start);
    Ok((stat, tally.counts()))
}

/// Detections the face mesh dropped, and those kept though it doubted them.
#[derive(Default)]
struct Tally {
    dropped: std::sync::atomic::AtomicU64,
    kept: std::sync::atomic::AtomicU64,
}

impl Tally {
    fn counts(self) -> (u64, u64) {
        (self.dropped.into_inner(), self.kept.into_inner())
    }
}

/// What the face mesh `found` says of a detection (see [`mesh`]): false drops it. A face it
/// takes gets the mesh's five points and outline (see [`take_mesh`]).
fn judge(job: &mut FaceJob, found: &mesh::Mesh, ctx: &StageCtx, tally: &Tally) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    if found.presence < ctx.treatment.face_check {
        if job.face.score >= crate::defaults::CONFIDENT {
            tally.kept.fetch_add(1, Relaxed);
            return true;
        }
        if ctx.tracked && job.face.score >= crate::defaults::SUPPORT_SCORE {
            job.doubt = true;
            return true;
        }
        tally.dropped.fetch_add(1, Relaxed);
        return false;
    }
    take_mesh(job, found, &ctx.template);
    true
}

/// Gives `job` the mesh's five points and outline, in frame pixels (for the record) and in the
/// crop aligned to `tpl` by those points (for the mesh mask).
fn take_mesh(job: &mut FaceJob, found: &mesh::Mesh, tpl: &[[f32; 2]; 5]) {
    let five = found.five_points();
    let outline = found.outline();
    let to_tpl = fit_similarity(&five, tpl);
    job.outline_crop = Some(
        outline
            .iter()
            .map(|p| {
                let (u, v) = to_tpl.apply(p[0] as f64, p[1] as f64);
                [u as f32, v as f32]
            })
            .collect(),
    );
    job.face.landmarks = five;
    job.face.outline = Some(outline);
}

/// Filters each track's change over time (see [`crate::faces::temporal`]), each frame's faces
/// in bands of rows on the pool stages' threads; frames leave in order. The crops' luma goes
/// back to `luma_pool`. Returns the stage's statistics and the run's flicker figures.
pub(crate) fn temporal(
    ctx: &StageCtx,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<(StageStat, crate::stats::Flicker)> {
    let mut clock = Clock::new("temporal", DEPTH);
    let luma_pool = &ctx.pools.luma;
    let mut filter = crate::faces::temporal::Temporal::new(ctx.treatment.temporal, ctx.size, &ctx.template, ctx.cpu)
        .threads(ctx.threads);
    while let Some(mut ff) = recv(&rx, &mut clock) {
        clock.time(|| filter.filter(ff.frame.index, &mut ff.faces, ff.frame.warm));
        for job in &mut ff.faces {
            luma_pool.put(std::mem::take(&mut job.luma));
        }
        if tx.send(ff).is_err() {
            break;
        }
    }
    // The helpers' CPU beside this thread's: the stage's cost per face is all of it.
    clock.add(std::time::Duration::ZERO, filter.helper_cpu());
    let mut stat = clock.finish();
    stat.threads = ctx.threads;
    stat.chain = true;
    Ok((stat, filter.flicker))
}

/// Smooths each tracked face's points over time (see [`crate::faces::smooth`]); frames leave in
/// order, `smoother`'s look-ahead later. The smoother is the job's own.
/// Returns the stage's statistics and the doubted faces it dropped and kept (see
/// [`Smoother::push`]).
pub(super) fn smooth(
    mut smoother: Smoother,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<(StageStat, (u64, u64))> {
    let mut clock = Clock::new("smooth", DEPTH);
    // Frames are sent outside the clock: time blocked on a full queue is not work.
    let mut out = Vec::new();
    let mut input = true;
    while input {
        let mut collect = |ff: FaceFrame| {
            out.push(ff);
            true
        };
        match recv(&rx, &mut clock) {
            Some(ff) => {
                clock.time(|| smoother.push(ff, &mut collect));
            }
            None => {
                clock.time(|| smoother.finish(&mut collect));
                input = false;
            }
        }
        for ff in out.drain(..) {
            if tx.send(ff).is_err() {
                return Ok((clock.finish(), smoother.doubted()));
            }
        }
    }
    Ok((clock.finish(), smoother.doubted()))
}

/// Leaves alone the faces the job's selection leaves out (too small, or not the people it
/// names: see [`crate::people::Chooser`]): they travel on in [`FaceFrame::left`] for the record.
pub(crate) fn choose(
    mut chooser: crate::people::Chooser,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<StageStat> {
    let mut clock = Clock::new("choose", DEPTH);
    while let Some(mut ff) = recv(&rx, &mut clock) {
        clock.time(|| chooser.choose(&mut ff))?;
        if tx.send(ff).is_err() {
            break;
        }
    }
    tracing::debug!(
        "choose: {} faces described, {} left alone",
        chooser.described,
        chooser.left
    );
    Ok(clock.finish())
}

/// Measures who each restored face still is and applies the identity guard (see
/// [`crate::people::IdentityMeter`]: a few views of each track, or every face); a warm-up
/// frame's faces count too, so a segment decides its tracks as the whole film would where its
/// warm-up reaches their start. With `rerun` (a model with a fidelity input, the guard backing
/// off), the faces of a track the guard raised the fidelity of are run again at it, a batch per
/// frame and fidelity, on the enhancement workers. Returns the stage's statistics and each
/// track's figures.
pub(crate) fn identity(
    mut meter: crate::people::IdentityMeter,
    rerun: Option<super::dispatch::Rerunner>,
    ctx: &StageCtx,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<(
    StageStat,
    Vec<crate::stats::TrackIdentity>,
    crate::faces::identity::Identifier,
)> {
    let mut clock = Clock::new("identity", DEPTH);
    let model_at_start = meter.model_cpu();
    let crop_pool = &ctx.pools.crop;
    let view = ctx.treatment.view();
    let mut one = |crop: &[u8], fidelity: f32| -> Result<Option<Vec<i16>>> {
        let Some(r) = rerun.as_ref() else {
            anyhow::bail!("the identity guard asked for a fidelity the model has no input for");
        };
        let mut copy = crop_pool.get();
        copy.clear();
        copy.extend_from_slice(crop);
        let (mut changes, crops) = r.run(vec![copy], fidelity)?;
        crops.into_iter().for_each(|c| crop_pool.put(c));
        Ok(changes.pop().flatten())
    };
    while let Some(mut ff) = recv(&rx, &mut clock) {
        let (index, blend) = (ff.frame.index, ff.frame.view.unwrap_or(view).blend);
        clock.time(|| -> Result<()> {
            meter.begin(index);
            if let Some(r) = &rerun {
                rerun_raised(&meter, r, &mut ff.faces, &ctx.pools.restored)?;
            }
            for job in &mut ff.faces {
                // The crop the model was given (kept with its face by the dispatcher).
                let crop = std::mem::take(&mut job.crop);
                let looked = meter.look(job, (&crop, ctx.size), (index, blend), &mut one);
                crop_pool.put_vec(crop);
                looked?;
            }
            Ok(())
        })?;
        if tx.send(ff).is_err() {
            break;
        }
    }
    let model = meter.model_cpu().saturating_sub(model_at_start);
    let tracks = meter.finish();
    let mut stat = clock.finish();
    stat.model_cpu = model;
    Ok((stat, tracks, meter.into_identifier()))
}

/// Runs the restored faces of `faces` whose tracks the guard raised the fidelity of again at
/// it (a batch per fidelity), their old changes back to `restored_pool`.
fn rerun_raised(
    meter: &crate::people::IdentityMeter,
    rerun: &super::dispatch::Rerunner,
    faces: &mut [crate::frame::FaceJob],
    restored_pool: &crate::frame::Pool<Vec<i16>>,
) -> Result<()> {
    let mut raised: Vec<(usize, f32)> = faces
        .iter()
        .enumerate()
        .filter(|(_, j)| j.restored.is_some() && j.fidelity.is_none())
        .filter_map(|(i, j)| meter.raised(j.track).map(|f| (i, f)))
        .collect();
    raised.sort_by(|a, b| a.1.total_cmp(&b.1));
    for group in raised.chunk_by(|a, b| a.1 == b.1) {
        let fidelity = group[0].1;
        let crops = group.iter().map(|&(i, _)| std::mem::take(&mut faces[i].crop)).collect();
        let (changes, crops) = rerun.run(crops, fidelity)?;
        for ((&(i, _), change), crop) in group.iter().zip(changes).zip(crops) {
            let job = &mut faces[i];
            job.crop = crop;
            if let Some(old) = std::mem::replace(&mut job.restored, change) {
                restored_pool.put(old);
            }
            job.fidelity = Some(fidelity);
        }
    }
    Ok(())
}

/// Aligns every face to the model's template and warps its crop (buffers from the crop pool;
/// with the temporal filter, the crop's half-resolution luma too), on the pool stages' threads;
/// frames leave in order.
pub(crate) fn align(ctx: &StageCtx, rx: Receiver<FaceFrame>, tx: Sender<FaceFrame>) -> Result<StageStat> {
    let (tpl, size, crop_pool) = (&ctx.template, ctx.size, &ctx.pools.crop);
    let luma_pool = ctx.temporal.then_some(&ctx.pools.luma);
    let view = ctx.treatment.view();
    let work = |scratch: &mut WarpScratch, ff: &mut FaceFrame| {
        for job in &mut ff.faces {
            let mut crop = crop_pool.get();
            let (to_crop, region) = align_face(&mut ff.frame, &job.face, (tpl, size), &mut crop, scratch);
            if let Some(pool) = luma_pool {
                let mut luma = pool.get();
                crate::kernels::tensor::crop_luma_half(scratch.cpu(), &crop, size, &mut luma);
                job.luma = luma;
            }
            (job.to_crop, job.region, job.crop) = (to_crop, region, crop);
        }
        // A picture kept in its decoded planes takes the paste's changes there, so its RGB copy
        // (read for the crops alone) goes back now rather than after encoding: the frames on
        // their way through the model, the filter and the paste hold no 6 MB copy of a 1080p
        // picture each. A compare view builds on the RGB picture and keeps it.
        if ff.frame.picture.is_planes() && ff.frame.view.unwrap_or(view).compare.is_none() {
            crate::media::color::give_back_rgb(&mut ff.frame, &ctx.pools.rgb);
        }
        Ok(())
    };
    pool::ordered("align", DEPTH, ctx.threads, || WarpScratch::at(ctx.cpu), work, rx, tx)
}

/// Aligns one face of `f` to the template: makes sure the frame's RGB covers the face, warps
/// it into `crop` (an NCHW item of `size`) and returns the frame-to-crop transform with the
/// frame region the crop covers. A face larger than the crop is filtered first (see
/// [`warp_face`]); `scratch` holds the filtered levels between calls.
pub(crate) fn align_face(
    f: &mut Frame,
    face: &Face,
    (tpl, size): (&[[f32; 2]; 5], usize),
    crop: &mut Vec<u8>,
    scratch: &mut WarpScratch,
) -> (Affine, Option<Rect>) {
    let to_crop = fit_similarity(&face.landmarks, tpl);
    let r = crop_footprint(&to_crop, size, f.width, f.height);
    crop.resize(3 * size * size, 0);
    warp_from_frame(f, &to_crop, r, size, &mut crop[..], scratch);
    (to_crop, r)
}

/// Warps the `region` of `f` under `to_crop` into `out` (`size` square). A video made from its
/// decoded planes never reads the frame's RGB but for the crops: the bicubic warp reads the
/// face region converted from the planes straight into texels; a face larger than the crop
/// (filtered first, see [`warp_face`]) or a frame held in RGB is read from the frame's RGB,
/// which is made to cover the region first.
fn warp_from_frame<O: crate::kernels::crop::CropOut + ?Sized>(
    f: &mut Frame,
    to_crop: &Affine,
    region: Option<Rect>,
    size: usize,
    out: &mut O,
    scratch: &mut WarpScratch,
) {
    ready_to_warp(f, to_crop, region);
    warp_ready(f, to_crop, region, size, out, scratch);
}

/// Whether the warp of `region` under `to_crop` reads `f`'s decoded planes (not its RGB): the
/// bicubic warp, and the area filter at full resolution (a face up to twice the crop's size;
/// a larger one reads a halved copy of the RGB).
fn warps_from_planes(f: &Frame, to_crop: &Affine, region: Option<Rect>) -> bool {
    region.is_some()
        && matches!(f.picture, Picture::Planes { partial: true, .. })
        && (!filtered(to_crop) || area_at_full_resolution(to_crop))
}

/// Whether the area filter reads a face aligned by `to_crop` at the frame's own resolution.
fn area_at_full_resolution(to_crop: &Affine) -> bool {
    filtered(to_crop) && mip_level(1.0 / to_crop.scale(), 6) == 0
}

/// Makes `f` ready for [`warp_ready`] of `region` under `to_crop`: its RGB made to cover the
/// region where the warp reads the RGB.
fn ready_to_warp(f: &mut Frame, to_crop: &Affine, region: Option<Rect>) {
    if warps_from_planes(f, to_crop, region) {
        return;
    }
    match region {
        Some(r) => crate::media::color::ensure_rgb(f, r),
        None => crate::media::color::rgb_buffer(f),
    }
}

/// [`warp_from_frame`] on a frame made ready for it by [`ready_to_warp`]: it only reads the
/// frame, so several threads may warp its faces at once.
fn warp_ready<O: crate::kernels::crop::CropOut + ?Sized>(
    f: &Frame,
    to_crop: &Affine,
    region: Option<Rect>,
    size: usize,
    out: &mut O,
    scratch: &mut WarpScratch,
) {
    let (w, h) = (f.width, f.height);
    if let (true, Some(r), Picture::Planes { source, .. }) = (warps_from_planes(f, to_crop, region), region, &f.picture)
    {
        let cpu = scratch.cpu();
        let mut load = |t: Rect, texels: &mut Vec<_>| {
            crate::media::color::yuv420p_texels(cpu, source, (w, h), t, texels);
        };
        if area_at_full_resolution(to_crop) {
            warp_area_loading(&mut load, (w, h), to_crop, r, size, out, scratch);
        } else {
            warp_cubic_loading(&mut load, (w, h), to_crop, r, size, out, scratch);
        }
        return;
    }
    warp_face(&f.rgb, (w, h), to_crop, region, size, out, scratch);
}

/// Blends each frame's restored crops into it through the treatment's mask shape for the
/// model's template (nothing at blend 0; overlapping faces by the larger mask), made the compare
/// view if asked (each frame's own view where it carries one), on the pool stages' threads
/// (frames leave in order); restored crops go back to their pool, the changes' buffers come
/// from theirs (and go back from the encode stage), the faces travel on for the record.
pub(crate) fn paste_back(ctx: &StageCtx, rx: Receiver<FaceFrame>, tx: Sender<FaceFrame>) -> Result<StageStat> {
    let (restored_pool, change_pool) = (&ctx.pools.restored, &ctx.pools.change);
    let kind = ctx.treatment.mask;
    let mask = Mask::build(kind, ctx.size, &ctx.template);
    let view = ctx.treatment.view();
    let fix = (ctx.treatment.color_fix == ColorFix::Wavelet).then_some(ctx.size);
    let work = |(scratch, masks, low): &mut (Scratch, Vec<Mask>, LowBand), ff: &mut FaceFrame| {
        if ff.frame.warm {
            // A warm-up frame is not written: nothing to paste.
            for job in &mut ff.faces {
                if let Some(r) = job.restored.take() {
                    restored_pool.put(r);
                }
            }
            return Ok(());
        }
        let view = ff.frame.view.unwrap_or(view);
        // The colour fix: a face sampled from a level of its change has it taken off there
        // (a quarter of the pixels or fewer); the others' whole change here.
        if let Some(size) = fix {
            for job in ff.faces.iter_mut().filter(|j| !fixed_from_a_level(&j.to_crop, size)) {
                if let Some(change) = job.restored.as_mut() {
                    remove_low_band(change, size, low);
                }
            }
        }
        paste_frame(
            ff,
            (&mask, kind, masks, fix.is_some()),
            (view, ctx.sides),
            scratch,
            (restored_pool, change_pool),
        );
        Ok(())
    };
    let init = || (Scratch::at(ctx.cpu), Vec::new(), LowBand::at(ctx.cpu));
    pool::ordered("paste", DEPTH, ctx.threads, init, work, rx, tx)
}

/// Pastes one frame's restored faces (see [`paste_back`]).
fn paste_frame(
    ff: &mut FaceFrame,
    (mask, kind, masks, fix): (&Mask, MaskKind, &mut Vec<Mask>, bool),
    (View { blend, compare }, sides): (View, crate::media::compare::Sides),
    scratch: &mut Scratch,
    (restored_pool, change_pool): (&Pool<Vec<i16>>, &Pool<Vec<f32>>),
) {
    let frame = &mut ff.frame;
    // Each restored face: its change, where it goes and, with the mesh mask, which of the
    // thread's spare masks (remade in place from its outline) it is pasted through.
    let mut used = 0;
    type Restored = (Vec<i16>, Affine, Option<Rect>, Option<usize>);
    let crops: Vec<Restored> = ff
        .faces
        .iter_mut()
        .filter_map(|job| {
            let restored = job.restored.take()?;
            let mut own = match (kind, &job.outline_crop) {
                (MaskKind::Mesh, Some(outline)) => {
                    if masks.len() == used {
                        masks.push(Mask::polygon(mask.size(), outline));
                    } else {
                        masks[used].set_polygon(mask.size(), outline);
                    }
                    used += 1;
                    Some(used - 1)
                }
                _ => None,
            };
            // A hand in front of the face: its own copy of the mask, the hand held back.
            if !job.occluders.is_empty() {
                let i = own.unwrap_or_else(|| {
                    if masks.len() == used {
                        masks.push(mask.clone());
                    } else {
                        masks[used].clone_from(mask);
                    }
                    used += 1;
                    used - 1
                });
                job.held = Some(masks[i].hold_back(&job.occluders));
                own = Some(i);
            }
            Some((restored, job.to_crop, job.region, own))
        })
        .collect();
    let masks: &[Mask] = masks;
    // Nothing to blend in at 0 (or off the frame): the frame stays as decoded.
    let faces: Vec<Paste> = crops
        .iter()
        .filter(|_| blend > 0.0)
        .filter_map(|(change, to_crop, region, own)| {
            Some(Paste {
                change,
                to_crop: *to_crop,
                region: (*region)?,
                mask: own.map(|i| &masks[i]),
                fix: fix && fixed_from_a_level(to_crop, mask.size()),
            })
        })
        .collect();
    let regions: Vec<Rect> = faces.iter().map(|f| f.region).collect();
    let kept = compare.map(|c| crate::media::compare::before_paste(c, sides, frame, &regions));
    let cpu = scratch.cpu();
    let changed = changes(&faces, mask, blend, scratch, &mut || change_pool.get());
    match &mut frame.picture {
        Picture::Planes { changes, .. } => *changes = changed,
        picture => {
            apply_rgb(&mut frame.rgb, frame.width, &changed);
            if let Picture::RgbOf { dirty, .. } = picture {
                dirty.extend(regions);
            }
            changed.into_iter().for_each(|c| change_pool.put(c.rgb));
        }
    }
    drop(faces);
    if let Some(kept) = kept {
        crate::media::compare::after_paste(frame, kept);
    }
    // A picture no one else holds takes its changes here, on the pool's threads, where the
    // encode stage's one thread would (it adds them itself to a picture the decoder still
    // holds, in a copy).
    if let Picture::Planes { source, changes, .. } = &mut frame.picture {
        if !changes.is_empty() && writable(source) && add_changes(source, changes, cpu) {
            changes.drain(..).for_each(|c| change_pool.put(c.rgb));
        }
    }
    for (crop, _, _, _) in crops {
        restored_pool.put(crop);
    }
}

/// What the encode stage counted.
pub(crate) struct EncodeStat {
    pub(crate) stage: StageStat,
    pub(crate) faces: u64,
    pub(crate) frames_with_faces: u64,
    /// Faces found and left alone (the selection's), by why.
    pub(crate) left: crate::stats::Left,
    /// The faces record, complete but not yet moved into place.
    pub(crate) sink: Option<FacesSink>,
}

/// Encodes frames in order into `encoder`'s file and records their faces in `faces`; frame
/// buffers go back to `rgb_pool`, the paste's change buffers to `change_pool`. `progress` gets
/// the frames written and faces restored so far.
#[allow(clippy::too_many_arguments)]
pub(super) fn encode(
    mut encoder: Writer,
    output: &Path,
    mut faces: Option<FacesSink>,
    (rgb_pool, change_pool): (&Pool<Vec<u8>>, &Pool<Vec<f32>>),
    max_frames: Option<u64>,
    cancel: &CancelToken,
    progress: &(dyn Fn(super::Progress) + Sync),
    rx: Receiver<FaceFrame>,
) -> Result<EncodeStat> {
    let mut clock = Clock::new("encode", DEPTH);
    let (mut n_faces, mut with_faces) = (0u64, 0u64);
    let mut left_alone = crate::stats::Left::default();
    let out = output.display();
    while let Some(FaceFrame {
        mut frame,
        faces: mut jobs,
        left,
    }) = recv(&rx, &mut clock)
    {
        // The faces left alone are recorded with the restored ones, after them.
        let restored = jobs.len() as u64;
        jobs.extend(left);
        if frame.warm {
            // A segment's warm-up frame: it built the state, it is not written.
            if let Some(sink) = &mut faces {
                sink.warm_frame(frame.index, &jobs)?;
            }
            crate::media::color::give_back_rgb(&mut frame, rgb_pool);
            continue;
        }
        if cancel.is_cancelled() {
            return Err(Cancelled {
                frames: frame.index,
                input: out.to_string(),
            })
            .with_context(|| format!("encode stage, output {out}"));
        }
        clock
            .time(|| encoder.write(&mut frame))
            .with_context(|| format!("encode stage, output {out}, frame {}", frame.index))
            .kind(Kind::Io)?;
        clock.count(1);
        n_faces += restored;
        with_faces += u64::from(restored > 0);
        for j in jobs.iter().filter_map(|j| j.left) {
            left_alone.add(j);
        }
        if let Some(sink) = &mut faces {
            sink.frame(frame.index, &jobs)?;
        }
        progress(super::Progress {
            frames: encoder.frames(),
            faces: n_faces,
        });
        crate::media::color::give_back_rgb(&mut frame, rgb_pool);
        if let Picture::Planes { changes, .. } = &mut frame.picture {
            changes.drain(..).for_each(|c| change_pool.put(c.rgb));
        }
    }
    let cut = max_frames.is_some_and(|m| encoder.frames() >= m);
    clock
        .time(|| encoder.finish(cut))
        .with_context(|| format!("encode stage, finishing {out}"))
        .kind(Kind::Io)?;
    Ok(EncodeStat {
        stage: clock.finish(),
        faces: n_faces,
        frames_with_faces: with_faces,
        left: left_alone,
        sink: faces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffmpeg_next::format::Pixel;
    use ffmpeg_next::util::frame::video::Video as VideoFrame;

    /// A `w x h` yuv420p picture of levels 16 to 234 in a pattern.
    fn patterned(w: usize, h: usize) -> VideoFrame {
        crate::init_ffmpeg();
        let mut yuv = VideoFrame::new(Pixel::YUV420P, w as u32, h as u32);
        for plane in 0..3 {
            let n = yuv.data(plane).len();
            for (i, v) in yuv.data_mut(plane)[..n].iter_mut().enumerate() {
                *v = ((i * 7919 + plane * 131) % 219) as u8 + 16;
            }
        }
        yuv
    }

    /// A video frame whose output is made from its planes is warped from texels converted
    /// straight from them: its crops equal the ones warped from the frame's RGB picture, for a
    /// face inside the picture, one cut by its edge and one turned, bicubically and through the
    /// area filter.
    #[test]
    fn crops_from_the_planes_equal_crops_from_the_rgb_picture() {
        // Faces in a small picture, then faces whose regions are large enough for the warp to go
        // tile by tile (each tile's texels made from the planes apart).
        let small: &[(f64, f64, f64, f64)] = &[
            (0.05, 0.8, 100.0, 60.0),
            (0.2, 1.1, 250.0, -30.0),
            (2.0, 0.6, 200.0, 220.0),
            // Faces up to twice the crop: the area filter, at the frame's resolution, also
            // read from the planes (inside, cut by two edges, turned).
            (0.1, 1.6, -40.0, -30.0),
            (-0.3, 1.9, 150.0, 80.0),
            (2.5, 1.7, 230.0, 200.0),
        ];
        let large: &[(f64, f64, f64, f64)] = &[
            (0.2, 1.45, 301.0, 47.0),
            (-0.4, 1.3, -60.0, 151.0),
            (0.1, 1.6, 99.0, 41.0),
            (-0.3, 1.9, 501.0, 101.0),
            (2.5, 1.7, 803.0, 499.0),
        ];
        for (w, h, size, faces) in [(320usize, 240usize, 128usize, small), (960, 540, 256, large)] {
            crops_from_the_planes_in(w, h, size, faces);
        }
    }

    fn crops_from_the_planes_in(w: usize, h: usize, size: usize, faces: &[(f64, f64, f64, f64)]) {
        let yuv = patterned(w, h);
        let frame = |planes: bool| Frame {
            picture: if planes {
                Picture::Planes {
                    source: yuv.clone(),
                    partial: true,
                    changes: Vec::new(),
                }
            } else {
                Picture::RgbOf {
                    source: yuv.clone(),
                    partial: true,
                    dirty: Vec::new(),
                }
            },
            width: w,
            height: h,
            // As decoding leaves a partial picture: no RGB buffer until a region needs one.
            rgb: Vec::new(),
            ..Frame::blank(0)
        };
        let tpl = crate::faces::align::template(size);
        for &(angle, scale, tx, ty) in faces {
            let (s, c) = f64::sin_cos(angle);
            let landmarks = tpl.map(|[x, y]| {
                let (x, y) = (x as f64, y as f64);
                [
                    (scale * (c * x - s * y) + tx) as f32,
                    (scale * (s * x + c * y) + ty) as f32,
                ]
            });
            let face = Face {
                bbox: [0.0, 0.0, 1.0, 1.0],
                score: 1.0,
                landmarks,
                ..Default::default()
            };
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut scratch = WarpScratch::at(crate::kernels::Cpu::detected());
            let (mut planes, mut rgb) = (frame(true), frame(false));
            let ra = align_face(&mut planes, &face, (&tpl, size), &mut a, &mut scratch);
            let rb = align_face(&mut rgb, &face, (&tpl, size), &mut b, &mut scratch);
            // Read from the planes, the picture never made its RGB buffer; read from RGB, it
            // made it whole-sized when the face's region was first converted.
            assert!(planes.rgb.is_empty() && rgb.rgb.len() == w * h * 3);
            assert_eq!(ra.1, rb.1);
            assert!(ra.1.is_some());
            assert_eq!(a, b, "angle {angle}, scale {scale}");
            // The mesh's input, floats, the same way.
            let (mut fa, mut fb) = (vec![0.0f32; 3 * size * size], vec![0.0f32; 3 * size * size]);
            warp_from_frame(&mut planes, &ra.0, ra.1, size, &mut fa[..], &mut scratch);
            warp_from_frame(&mut frame(false), &ra.0, ra.1, size, &mut fb[..], &mut scratch);
            assert_eq!(fa, fb, "mesh input: angle {angle}, scale {scale}");
            assert!(planes.rgb.is_empty(), "the mesh's crop read from the planes too");
        }
    }

    /// A picture no one else holds takes its changes on the paste's threads: its planes are
    /// then what the encode stage would have made of them. One the decoder still holds keeps
    /// its changes for the encode stage, its planes untouched.
    #[test]
    fn the_paste_adds_the_changes_to_a_picture_only_it_holds() {
        let (w, h, size) = (320usize, 240usize, 64usize);
        let yuv = patterned(w, h);
        let tpl = crate::faces::align::template(size);
        let face = Face {
            bbox: [0.0, 0.0, 1.0, 1.0],
            score: 1.0,
            landmarks: tpl.map(|[x, y]| [1.5 * x + 90.0, 1.5 * y + 60.0]),
            ..Default::default()
        };
        let paste = |source: VideoFrame| {
            let mut frame = Frame {
                picture: Picture::Planes {
                    source,
                    partial: true,
                    changes: Vec::new(),
                },
                width: w,
                height: h,
                ..Frame::blank(0)
            };
            let (mut crop, mut scratch) = (Vec::new(), WarpScratch::at(crate::kernels::Cpu::detected()));
            let (to_crop, region) = align_face(&mut frame, &face, (&tpl, size), &mut crop, &mut scratch);
            let mut job = FaceJob::detected(face.clone());
            (job.to_crop, job.region) = (to_crop, region);
            // Twenty levels brighter, less in blue.
            job.restored = Some(
                (0..3 * size * size)
                    .map(|i| crate::kernels::change_steps([20.0, 20.0, 5.0][i % 3]))
                    .collect(),
            );
            let mut ff = FaceFrame {
                frame,
                faces: vec![job],
                left: Vec::new(),
            };
            let mask = Mask::build(MaskKind::Face, size, &tpl);
            let pools = (&Pool::new(2), &Pool::new(2));
            let view = View {
                blend: 1.0,
                compare: None,
            };
            paste_frame(
                &mut ff,
                (&mask, MaskKind::Face, &mut Vec::new(), false),
                (view, Default::default()),
                &mut Scratch::at(crate::kernels::Cpu::detected()),
                pools,
            );
            ff.frame
        };
        let planes = |f: &Frame| {
            let Picture::Planes { source, changes, .. } = &f.picture else {
                unreachable!()
            };
            (
                (0..3).map(|p| source.data(p).to_vec()).collect::<Vec<_>>(),
                changes.clone(),
            )
        };
        // Only the paste holds it: changed, nothing left for the encode stage.
        let (added, left) = planes(&paste(yuv.clone()));
        assert!(left.is_empty());
        assert_ne!(added[0], yuv.data(0), "the luma took the change");
        // The decoder still holds it (a second reference to its buffers): untouched, the changes
        // kept; added as the encode stage adds them to its copy, the same planes as above.
        // SAFETY: `yuv` is a valid frame; the clone is a new reference to the same buffers,
        // owned (and freed) by the wrapper.
        let held = unsafe { VideoFrame::wrap(ffmpeg_next::ffi::av_frame_clone(yuv.as_ptr())) };
        let (untouched, kept) = planes(&paste(held));
        assert_eq!(untouched[0], yuv.data(0));
        assert_eq!(kept.len(), 1);
        let mut copy = yuv.clone();
        assert!(add_changes(&mut copy, &kept, crate::kernels::Cpu::detected()));
        assert_eq!(added, (0..3).map(|p| copy.data(p).to_vec()).collect::<Vec<_>>());
    }
}
