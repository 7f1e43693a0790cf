//! The one wiring of the pipeline: in, an `Engine`, the treatment whole and what sets a run
//! apart (`Middle`: a video, or a stream of pictures with its flush), and the two ends a caller
//! brings (a decode stage that sends `Frame`s, an encode stage that receives `FaceFrame`s);
//! out, the run's `Summary` and what the encode stage handed back.
//!
//! ```text
//!  decode ─> [pass] ─> detect ─> [mesh] ─> [smooth] ─> [choose] ─> align ─> enhance (dispatch ═╦═ worker 0 ═╦═) ─> [temporal] ─> paste ─> encode
//!  (caller's)                                                                                  ╚═ worker 1 ═╝                            (caller's)
//! ```
//! In a video with a mesh the detect stage follows the faces by their meshes (no mesh stage),
//! and from four pool threads its whole-frame passes run ahead of it (`pass`).
//! The line is data: [`plan`] lists the stages a run builds (the optional ones each by one
//! line); each stage declares once ([`Step::declared`]) its name, the frames it keeps and those
//! that keep it busy, and how it starts (the parts it takes, the body its thread runs); the pools
//! and a video's budget are sized from that list ([`pools_for`], [`in_flight_for`]), and `wire`
//! walks it, [`Line::then`] spawning each stage on a scoped thread joined to the one before by
//! a bounded channel of `DEPTH` frames. Every stage borrows what it reads from one [`StageCtx`] built here.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use super::ctx::{Pools, StageCtx, DEPTH};
use super::dispatch::{self, held_frames, Batch, Flush, Restored};
use super::stages;
use crate::budget::{opened_on_exit, Budget};
use crate::engine::Engine;
use crate::faces::smooth::Smoother;
use crate::frame::{FaceFrame, Frame};
use crate::runtime::Target;
use crate::stats::Flicker;
use crate::stats::{gpu_memory_by_index, peak_rss, StageStat, Summary, WorkerStat};
use crate::treatment::Treatment;

/// Pools for the stages of `plan`: every queue full, one frame in each stage (and what it
/// holds besides), the decode and encode stages' own, one spare; one crop per face of those
/// frames plus the batches at the workers.
fn pools_for(plan: &[Step], ctx: &Sizes) -> Pools {
    let frames = frames_for(plan, ctx);
    Pools::new(frames, frames + 2 * ctx.batch * ctx.workers)
}

/// Frames a line of `plan` can hold: the decode stage's queue and frame, the detect stage's,
/// every planned stage's, the encode stage's frame and one spare.
fn frames_for(plan: &[Step], ctx: &Sizes) -> usize {
    // The passes run ahead of detection: a pool stage's queue, frames and reorder buffer.
    let ahead = if ctx.pass_threads > 0 {
        DEPTH + 1 + 3 * (ctx.pass_threads - 1)
    } else {
        0
    };
    2 * (DEPTH + 1) + ahead + plan.iter().map(|s| s.holds(ctx)).sum::<usize>() + 1 + 1
}

/// Frames a video's line needs in flight to keep every stage busy (its [`Budget`]): one in
/// hand at each stage of one thread (decode, detect, temporal filter, encode), one per thread
/// of each pool stage (the passes ahead, the mesh, alignment, paste), the smoother's
/// look-ahead and the dispatcher's frames waiting for their faces. More frames would only wait
/// in queues. `GPEN_VIDEO_IN_FLIGHT` sets another budget (a host short of memory; the tests),
/// never under the smoother's look-ahead and one, which it needs to let a frame go.
fn in_flight_for(plan: &[Step], ctx: &Sizes) -> usize {
    let floor = ctx.smooth_held + 1;
    if let Some(n) = std::env::var(IN_FLIGHT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return n.max(floor);
    }
    (2 + ctx.pass_threads + plan.iter().map(|&s| s.declared(ctx).busy).sum::<usize>() + 1).max(floor)
}

/// The variable that sets a video's budget of frames in flight (see [`in_flight_for`]).
pub(crate) const IN_FLIGHT_ENV: &str = "GPEN_VIDEO_IN_FLIGHT";

/// What sets a run's middle apart.
pub(crate) struct Middle {
    /// Everything that changes the output, whole.
    pub(crate) treatment: Arc<Treatment>,
    /// A video: its faces' points smoothed over time and its change filtered along their
    /// tracks. A stream of pictures has neither: every picture is a scene of its own.
    pub(crate) video: bool,
    /// When the dispatcher sends a partial batch (see [`dispatch::dispatch`]).
    pub(crate) flush: Flush,
    /// Where a side-by-side view puts its pictures (see [`crate::media::compare::Sides`]).
    pub(crate) sides: crate::media::compare::Sides,
    /// Measure who each restored face still is even without the identity guard (`--identity`;
    /// with the identity model: see [`crate::people::IdentityMeter`]), and on every face
    /// (`each_face`: the faces are recorded) or a few views of each track.
    pub(crate) identity: bool,
    pub(crate) each_face: bool,
    /// The face-identity model the settings resolved (see `config::Recipe::identity`).
    pub(crate) identity_model: Option<std::path::PathBuf>,
    /// BRISQUE's parameters (see `config::Recipe::quality`).
    pub(crate) quality_model: Option<std::path::PathBuf>,
    /// The hand models the settings found (see `config::Settings::hand_models`).
    pub hand_models: Option<[std::path::PathBuf; 2]>,
}

/// What an encode stage reports: its clock, the faces it wrote, the frames with faces, and
/// whatever else the caller needs back (`extra`).
pub(crate) struct Encoded<T> {
    pub(crate) stage: StageStat,
    pub(crate) faces: u64,
    pub(crate) frames_with_faces: u64,
    /// Faces found and left alone, by why.
    pub(crate) left: crate::stats::Left,
    pub(crate) extra: T,
}

/// A stage between detection (which every run has, and which turns frames into face frames)
/// and encoding, in pipeline order.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Mesh,
    Smooth,
    Choose,
    Hands,
    Align,
    Enhance,
    Temporal,
    Identity,
    Paste,
}

/// What the frame count of a stage depends on.
struct Sizes {
    threads: usize,
    /// Threads running the detector's passes ahead of detection (0: none).
    pass_threads: usize,
    mesh_threads: usize,
    smooth_held: usize,
    batch: usize,
    workers: usize,
}

/// What a stage does with a run's frames, declared once for each stage (see [`Step::declared`]).
struct Decl {
    /// Its thread's name in the stage table.
    name: &'static str,
    /// Frames it keeps besides its input queue and the frame it works on (a pool stage's other
    /// threads and their reorder buffer, the smoother's look-ahead, the dispatcher's frames
    /// waiting for their faces): what the pools are sized from.
    kept: usize,
    /// Frames in hand that keep it busy: its share of a video's budget of frames in flight.
    busy: usize,
    /// How it starts: takes its parts and gives the body its thread runs.
    start: Start,
}

/// What the middle stages take to run, each part taken by the one stage that runs it (the
/// detect stage takes the meshers when it follows the faces by their meshes).
struct Parts<'e> {
    meshers: Option<&'e mut Vec<crate::faces::mesh::Mesher>>,
    smoother: Option<Smoother>,
    workers: Option<&'e mut Vec<crate::faces::enhance::Worker>>,
    chooser: Option<crate::people::Chooser>,
    hands: Option<&'e mut crate::faces::hands::Hands>,
    meter: Option<crate::people::IdentityMeter>,
    /// Where the identity stage gives the identity model's session back at its end.
    identifier_back: Option<Sender<crate::faces::identity::Identifier>>,
    /// The enhancement workers' queue of batches: the dispatcher's, and the identity guard's
    /// re-runs where it may raise the fidelity.
    batches: Option<(Sender<Batch>, Receiver<Batch>)>,
    rerun: Option<dispatch::Rerunner>,
    batch: usize,
    flush: Flush,
}

/// A middle stage's body: from the line's end into its own queue.
type Body<'e> = Box<dyn FnOnce(Receiver<FaceFrame>, Sender<FaceFrame>) -> Result<Out> + Send + 'e>;

/// How a stage starts (see [`Decl::start`]).
type Start = for<'e> fn(&mut Parts<'e>, &'e StageCtx<'e>) -> Body<'e>;

fn start_mesh<'e>(p: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    let meshers = p.meshers.take().expect("one mesh stage");
    Box::new(move |rx, tx| stages::mesh(meshers, ctx, rx, tx).map(|(st, n)| Out::Mesh(st, n)))
}

fn start_smooth<'e>(p: &mut Parts<'e>, _: &'e StageCtx<'e>) -> Body<'e> {
    let smoother = p.smoother.take().expect("planned with a smoother");
    Box::new(move |rx, tx| stages::smooth(smoother, rx, tx).map(|(st, n)| Out::Smooth(st, n)))
}

fn start_choose<'e>(p: &mut Parts<'e>, _: &'e StageCtx<'e>) -> Body<'e> {
    let chooser = p.chooser.take().expect("planned with a chooser");
    Box::new(move |rx, tx| stages::choose(chooser, rx, tx).map(Out::Stage))
}

fn start_hands<'e>(p: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    let hands = p.hands.take().expect("planned with the hand models open");
    Box::new(move |rx, tx| super::hands::hands(hands, ctx, rx, tx).map(|(st, n)| Out::Hands(st, n)))
}

fn start_align<'e>(_: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    Box::new(move |rx, tx| stages::align(ctx, rx, tx).map(Out::Stage))
}

fn start_enhance<'e>(p: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    let workers = p.workers.take().expect("one enhance stage");
    let batches = p.batches.take().expect("one enhance stage");
    let (batch, flush) = (p.batch, p.flush);
    Box::new(move |rx, tx| enhance(workers, batches, (batch, flush), ctx, rx, tx))
}

fn start_temporal<'e>(_: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    Box::new(move |rx, tx| stages::temporal(ctx, rx, tx).map(|(st, f)| Out::Temporal(st, f)))
}

fn start_identity<'e>(p: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    let meter = p.meter.take().expect("planned with a meter");
    let (rerun, back) = (p.rerun.take(), p.identifier_back.take());
    Box::new(move |rx, tx| {
        stages::identity(meter, rerun, ctx, rx, tx).map(|(st, t, identifier)| {
            if let Some(back) = back {
                back.send(identifier).ok();
            }
            Out::Identity(st, t)
        })
    })
}

fn start_paste<'e>(_: &mut Parts<'e>, ctx: &'e StageCtx<'e>) -> Body<'e> {
    Box::new(move |rx, tx| stages::paste_back(ctx, rx, tx).map(Out::Stage))
}

impl Step {
    /// The stage's declaration at the run's `s` sizes: where a new stage states its frames.
    fn declared(self, s: &Sizes) -> Decl {
        let (name, kept, busy, start): (_, _, _, Start) = match self {
            Step::Mesh => ("mesh", 3 * (s.mesh_threads - 1), s.mesh_threads, start_mesh),
            Step::Smooth => ("smooth", s.smooth_held, s.smooth_held, start_smooth),
            Step::Choose => ("choose", 0, 1, start_choose),
            Step::Hands => ("hands", 0, 1, start_hands),
            Step::Align => ("align", 3 * (s.threads - 1), s.threads, start_align),
            Step::Enhance => {
                let held = held_frames(s.batch, s.workers);
                ("dispatch", held, held, start_enhance)
            }
            Step::Temporal => ("temporal", 0, 1, start_temporal),
            Step::Identity => ("identity", 0, 1, start_identity),
            Step::Paste => ("paste", 3 * (s.threads - 1), s.threads, start_paste),
        };
        Decl {
            name,
            kept,
            busy,
            start,
        }
    }

    /// Frames the stage may hold: its input queue, the one it works on, and what it keeps.
    fn holds(self, s: &Sizes) -> usize {
        DEPTH + 1 + self.declared(s).kept
    }
}

/// The stages a run builds after detection: the optional ones each by one line.
fn plan(engine: &Engine, middle: &Middle) -> Vec<Step> {
    let mut steps = Vec::new();
    steps.extend((!engine.meshers.is_empty() && !follows(engine, middle)).then_some(Step::Mesh));
    steps.extend(middle.video.then_some(Step::Smooth));
    steps.extend(middle.treatment.selection.active().then_some(Step::Choose));
    // Before alignment, which gives a planar picture's RGB back.
    steps.extend((middle.treatment.occlusion == crate::faces::hands::Occlusion::Hands).then_some(Step::Hands));
    steps.extend([Step::Align, Step::Enhance]);
    // Before the temporal filter, which then smooths what the guard changes along a track.
    let guarded = middle.treatment.identity_guard != crate::faces::identity::Guard::Off;
    steps.extend(
        middle
            .identity_model
            .as_ref()
            .filter(|_| middle.identity || guarded)
            .map(|_| Step::Identity),
    );
    // Always measured in a video; filtered when its memory is above 0.
    steps.extend(middle.video.then_some(Step::Temporal));
    steps.push(Step::Paste);
    steps
}

/// Whether the detect stage follows a video's faces by their meshes
/// ([`stages::detect_follow`]), the mesh then no stage of its own.
fn follows(engine: &Engine, middle: &Middle) -> bool {
    middle.video && engine.detector.tracks() && !engine.meshers.is_empty()
}

/// The detector's helper sessions that run a tracked video's passes ahead of detection: they
/// fall on frame numbers, so on a machine of several cores they run ahead (on the CPU) and the
/// chain only follows and meshes. Where the cores are all busy anyway (2), that gains nothing
/// and a session's pass costs memory (about 45 MiB of ONNX Runtime's arena each): none.
fn passers_for(engine: &mut Engine, follow: bool) -> Vec<crate::faces::detect::Passer> {
    if follow && engine.pool_threads >= crate::defaults::PASS_AHEAD_CORES {
        engine.detector.passers(crate::defaults::PASS_AHEAD_MAX)
    } else {
        Vec::new()
    }
}

/// What a middle stage hands back when joined.
enum Out {
    Stage(StageStat),
    /// The mesh stage and the detections it dropped.
    Mesh(StageStat, (u64, u64)),
    /// The smooth stage and the doubted faces it dropped and kept.
    Smooth(StageStat, (u64, u64)),
    Temporal(StageStat, Flicker),
    Identity(StageStat, Vec<crate::stats::TrackIdentity>),
    /// The hands stage and the frames on which it kept hands in front of faces.
    Hands(StageStat, u64),
    Enhance(dispatch::DispatchStat, Vec<WorkerStat>),
}

/// The line of stages being built inside one thread scope: the receiving end of the last
/// stage's queue, and each stage's thread in pipeline order.
struct Line<'s> {
    rx: Receiver<FaceFrame>,
    /// The budget each stage opens when it returns.
    budget: Option<std::sync::Arc<Budget>>,
    joins: Vec<(&'static str, std::thread::ScopedJoinHandle<'s, Result<Out>>)>,
}

impl<'s> Line<'s> {
    /// Adds the stage `name`, run by `f` from the line's end into a new queue.
    fn then<'e>(
        &mut self,
        s: &'s std::thread::Scope<'s, 'e>,
        name: &'static str,
        f: impl FnOnce(Receiver<FaceFrame>, Sender<FaceFrame>) -> Result<Out> + Send + 's,
    ) {
        let (tx, rx) = bounded::<FaceFrame>(DEPTH);
        let input = std::mem::replace(&mut self.rx, rx);
        let body = opened_on_exit(self.budget.as_ref(), move || f(input, tx));
        self.joins.push((name, s.spawn(body)));
    }
}

/// What a run sets up before any frame is decoded: the model's fidelity (a model without a
/// fidelity input refuses one), the people named described (once per engine: a photo without a
/// face fails the job here) and the identity meter, for the choose and identity stages `steps`
/// plans.
fn prepare(
    engine: &mut Engine,
    middle: &Middle,
    steps: &[Step],
) -> Result<(Option<crate::people::Chooser>, Option<crate::people::IdentityMeter>)> {
    let fidelity = middle.treatment.fidelity;
    if fidelity.is_some() && engine.info.weight.is_none() {
        return Err(crate::faces::enhance::fidelity_refused(
            &engine.key.model.display().to_string(),
        ));
    }
    let fidelity = fidelity.unwrap_or(crate::faces::enhance::DEFAULT_FIDELITY);
    for w in &mut engine.workers {
        w.enhancer.set_fidelity(fidelity);
    }
    if steps.contains(&Step::Hands) && engine.hands.is_none() {
        let [palm, marks] = middle.hand_models.as_ref().ok_or_else(crate::faces::hands::missing)?;
        engine.hands = Some(crate::faces::hands::Hands::open(
            palm,
            marks,
            &engine.identity_opts,
            engine.cpu,
        )?);
    }
    let model = middle.identity_model.clone();
    let chooser = if steps.contains(&Step::Choose) {
        let size = engine.detector.size;
        let c = crate::people::Chooser::new(
            &middle.treatment.selection,
            (&mut engine.detector, &mut engine.references),
            model.as_deref().map(|m| (m, &engine.identity_opts)),
            (engine.key.rotation, engine.cpu),
        );
        // The references' pictures set the detector to their size: back to the run's.
        engine.detector.start(size);
        Some(c?)
    } else {
        None
    };
    let meter = match model {
        Some(m) if steps.contains(&Step::Identity) => Some(crate::people::IdentityMeter::new(
            // The engine's session where an earlier run opened this model's.
            match engine.identifier.take() {
                Some((path, identifier)) if path == m => identifier,
                _ => crate::faces::identity::Identifier::open(&m, &engine.identity_opts)?,
            },
            (
                middle.treatment.identity_guard,
                middle.treatment.selection.face_distance,
                middle.treatment.color_fix == crate::faces::paste::ColorFix::Wavelet,
            ),
            middle.quality_model.as_deref(),
            (middle.each_face, engine.key.rotation, engine.cpu),
        )?)
        .map(|m| {
            if engine.info.weight.is_some() {
                m.raising(fidelity)
            } else {
                m
            }
        }),
        _ => None,
    };
    Ok((chooser, meter))
}

/// Runs `decode -> detect -> ... -> paste -> encode` on `engine` to the end of `decode`'s
/// frames. `start` is when the run began (for the wall time). The first failing stage in
/// pipeline order is the error reported; later ones only saw it stop.
pub(crate) fn wire<T: Send>(
    engine: &mut Engine,
    middle: Middle,
    start: Instant,
    decode: impl FnOnce(&Pools, Sender<Frame>) -> Result<StageStat> + Send,
    encode: impl FnOnce(&Pools, Receiver<FaceFrame>) -> Result<Encoded<T>> + Send,
) -> Result<(Summary, T)> {
    let steps = plan(engine, &middle);
    let (chooser, meter) = prepare(engine, &middle, &steps)?;
    let follow = follows(engine, &middle);
    let mut passers = passers_for(engine, follow);
    let every = engine.detector.every();
    let smoother = middle.video.then(|| Smoother::new(middle.treatment.smooth));
    let sizes = Sizes {
        threads: engine.pool_threads,
        pass_threads: passers.len(),
        mesh_threads: engine.meshers.len().max(1),
        smooth_held: smoother.as_ref().map_or(0, Smoother::capacity),
        batch: engine.batch,
        workers: engine.workers.len(),
    };
    let mut pools = pools_for(&steps, &sizes);
    if middle.video {
        pools.budget = Some(Budget::new(in_flight_for(&steps, &sizes)));
    }
    let worker_targets: Vec<Target> = engine.workers.iter().map(|w| w.target.clone()).collect();
    let ctx = StageCtx {
        treatment: &middle.treatment,
        size: engine.info.size,
        template: engine.info.template.points(engine.info.size),
        pools: &pools,
        threads: engine.pool_threads,
        temporal: steps.contains(&Step::Temporal),
        keep_crops: steps.contains(&Step::Identity),
        tracked: middle.video,
        sides: middle.sides,
        cpu: engine.cpu,
    };
    let ctx = &ctx;
    // Each stage after decoding opens the budget when it returns, so a line that stops early
    // never leaves the decoder waiting for frames stuck in a queue.
    let budget = ctx.pools.budget.as_ref();
    // Each taken by the one stage that runs it.
    let detector = &mut engine.detector;
    let (batch_tx, batch_rx) = bounded::<Batch>(2 * engine.workers.len());
    let (identifier_tx, identifier_rx) = bounded(1);
    let rerun = meter
        .as_ref()
        .filter(|m| m.raises())
        .map(|_| dispatch::Rerunner::new(batch_tx.clone(), engine.batch));
    let mut parts = Parts {
        meshers: Some(&mut engine.meshers),
        smoother,
        workers: Some(&mut engine.workers),
        chooser,
        hands: engine.hands.as_mut(),
        meter,
        identifier_back: Some(identifier_tx),
        batches: Some((batch_tx, batch_rx)),
        rerun,
        batch: engine.batch,
        flush: middle.flush,
    };
    let passers_ref = &mut passers;
    let run = std::thread::scope(|s| {
        let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
        let decode = s.spawn(move || decode(ctx.pools, dec_tx));
        let (ahead, dec_rx) = if passers_ref.is_empty() {
            (None, dec_rx)
        } else {
            let (tx, rx) = bounded::<Frame>(DEPTH);
            let h = s.spawn(opened_on_exit(budget, move || {
                stages::pass_ahead(passers_ref, every, dec_rx, tx)
            }));
            (Some(h), rx)
        };
        // The detect stage turns frames into face frames: the line starts after it.
        let (det_tx, det_rx) = bounded::<FaceFrame>(DEPTH);
        let detect = if follow {
            let meshers = parts.meshers.take().expect("the detect stage meshes");
            s.spawn(opened_on_exit(budget, move || {
                stages::detect_follow(detector, meshers, ctx, dec_rx, det_tx)
            }))
        } else {
            s.spawn(opened_on_exit(budget, move || {
                stages::detect(detector, &ctx.pools.det, dec_rx, det_tx)
            }))
        };
        let mut line = Line {
            rx: det_rx,
            budget: budget.cloned(),
            joins: Vec::new(),
        };
        for &step in &steps {
            let Decl { name, start, .. } = step.declared(&sizes);
            line.then(s, name, start(&mut parts, ctx));
        }
        let Line { rx, joins, .. } = line;
        let encode = s.spawn(opened_on_exit(budget, move || encode(ctx.pools, rx)));
        let handles = Handles {
            decode,
            ahead,
            detect,
            joins,
            encode,
        };
        handles.gather(&worker_targets, start, ctx.pools.budget.as_deref())
    });
    engine.detector.take_back(passers);
    // The identity stage's session, kept for the engine's next run.
    if let (Ok(identifier), Some(path)) = (identifier_rx.try_recv(), middle.identity_model) {
        engine.identifier = Some((path, identifier));
    }
    run
}

/// The threads of a running line, from decoding to encoding, in pipeline order.
struct Handles<'s, T> {
    decode: std::thread::ScopedJoinHandle<'s, Result<StageStat>>,
    /// The passes run ahead of detection, and how many.
    ahead: Option<std::thread::ScopedJoinHandle<'s, Result<(StageStat, u64)>>>,
    detect: std::thread::ScopedJoinHandle<'s, Result<(StageStat, crate::stats::DetectCounts)>>,
    joins: Vec<(&'static str, std::thread::ScopedJoinHandle<'s, Result<Out>>)>,
    encode: std::thread::ScopedJoinHandle<'s, Result<Encoded<T>>>,
}

impl<T> Handles<'_, T> {
    /// Joins every stage in pipeline order (the first that failed is the error) into the run's
    /// summary and what the encode stage gives back.
    fn gather(self, targets: &[Target], start: Instant, budget: Option<&Budget>) -> Result<(Summary, T)> {
        let mut stages = vec![joined("decode", self.decode.join())?];
        let mut passes_ahead = 0;
        if let Some(h) = self.ahead {
            let (stat, runs) = joined("pass", h.join())?;
            stages.push(stat);
            passes_ahead = runs;
        }
        let (detect, mut counts) = joined("detect", self.detect.join())?;
        counts.full += passes_ahead;
        stages.push(detect);
        let mut summary = Summary {
            detect: counts,
            stages,
            ..Summary::default()
        };
        for (name, h) in self.joins {
            summary.add(joined(name, h.join())?, targets);
        }
        let encoded = joined("encode", self.encode.join())?;
        summary.frames = encoded.stage.items;
        summary.faces = encoded.faces;
        summary.frames_with_faces = encoded.frames_with_faces;
        summary.left = encoded.left;
        summary.stages.push(encoded.stage);
        summary.wall = start.elapsed();
        summary.peak_rss = peak_rss();
        summary.in_flight = budget.map(|b| (b.cap(), b.most()));
        Ok((summary, encoded.extra))
    }
}

impl Summary {
    /// Adds a joined middle stage's figures.
    fn add(&mut self, out: Out, targets: &[Target]) {
        match out {
            Out::Stage(st) => self.stages.push(st),
            Out::Mesh(st, (dropped, kept)) | Out::Smooth(st, (dropped, kept)) => {
                self.stages.push(st);
                self.detect.not_faces += dropped;
                self.detect.kept_doubted += kept;
            }
            Out::Temporal(st, flicker) => {
                self.stages.push(st);
                self.flicker = Some(flicker);
            }
            Out::Identity(st, tracks) => {
                self.stages.push(st);
                self.identity = tracks;
            }
            Out::Hands(st, frames) => {
                self.stages.push(st);
                self.hands_frames = Some(frames);
            }
            Out::Enhance(d, mut workers) => {
                self.stages.push(d.stage);
                (self.batches, self.held_max) = (d.batches, d.held_max);
                add_gpu_memory(&mut workers, targets);
                self.workers = workers;
            }
        }
    }
}

/// The dispatcher on this thread and one thread per enhancement worker: crops gathered into
/// batches, each to whichever worker is free, frames out in order once their faces are back.
fn enhance(
    workers: &mut [crate::faces::enhance::Worker],
    (batch_tx, batch_rx): (Sender<Batch>, Receiver<Batch>),
    (batch, flush): (usize, Flush),
    ctx: &StageCtx,
    rx: Receiver<FaceFrame>,
    tx: Sender<FaceFrame>,
) -> Result<Out> {
    let n = workers.len();
    let (done_tx, done_rx) = unbounded::<Result<Restored>>();
    std::thread::scope(|s| {
        let threads: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                let (rx, tx) = (batch_rx.clone(), done_tx.clone());
                s.spawn(move || dispatch::work(w, batch, ctx.size, &rx, &tx, &ctx.pools.restored))
            })
            .collect();
        drop((batch_rx, done_tx));
        let stat = dispatch::dispatch(
            rx,
            &batch_tx,
            &done_rx,
            &tx,
            batch,
            n,
            (&ctx.pools.crop, ctx.keep_crops),
            flush,
        );
        // The line after this stage ends with it: a later stage's re-runs (the identity
        // guard's) keep the workers until then.
        drop((batch_tx, tx));
        let stat = stat?;
        let workers = threads
            .into_iter()
            .map(|t| joined("enhance worker", t.join()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Out::Enhance(stat, workers))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A default video's stages: the mesh in the detect stage (it follows the faces).
    const VIDEO: [Step; 5] = [Step::Smooth, Step::Align, Step::Enhance, Step::Temporal, Step::Paste];

    /// A default video's sizes on `threads` cores: one CPU worker, batch 4, smoothing sigma 6,
    /// `pass_threads` running the passes ahead (none below four cores).
    fn sizes(threads: usize, pass_threads: usize) -> Sizes {
        Sizes {
            threads,
            pass_threads,
            mesh_threads: threads,
            smooth_held: 13,
            batch: 4,
            workers: 1,
        }
    }

    #[test]
    fn the_pools_hold_what_the_planned_stages_can() {
        let steps = VIDEO;
        let frames = |threads, ahead| frames_for(&steps, &sizes(threads, ahead));
        assert_eq!(frames(2, 0), 64, "the seventh round's figure (docs/CHANGELOG.md)");
        assert_eq!(frames(3, 0) - frames(2, 0), 6, "three frames per pool stage and core");
        // Four cores: the passes ahead on three sessions hold their queue, frames and reorder.
        assert_eq!(frames(4, 3) - frames(4, 0), DEPTH + 1 + 6);
        // Without following (a mesh stage of its own), its pool's frames too.
        let with_mesh = [&[Step::Mesh][..], &steps].concat();
        assert_eq!(frames_for(&with_mesh, &sizes(2, 0)) - frames(2, 0), DEPTH + 1 + 3);
        // Pictures: no smoothing and no temporal filter, so fewer frames.
        let pictures = [Step::Align, Step::Enhance, Step::Paste];
        assert!(frames_for(&pictures, &sizes(2, 0)) < 50);
    }

    #[test]
    fn a_videos_budget_is_what_keeps_its_stages_busy() {
        let steps = VIDEO;
        let budget = |threads, ahead| in_flight_for(&steps, &sizes(threads, ahead));
        // decode, detect, temporal, encode 4; alignment and paste 2 each; look-ahead 13;
        // the dispatcher's 8: the seventh round's figure (docs/CHANGELOG.md), under half of what the queues could hold.
        assert_eq!(budget(2, 0), 29);
        assert!(2 * budget(2, 0) < frames_for(&steps, &sizes(2, 0)));
        assert_eq!(budget(3, 0) - budget(2, 0), 2, "a frame per pool stage and core");
        assert_eq!(budget(16, 3) - budget(16, 0), 3, "a frame per pass-ahead thread");
        let with_mesh = [&[Step::Mesh][..], &steps].concat();
        assert_eq!(in_flight_for(&with_mesh, &sizes(2, 0)) - budget(2, 0), 2);
        // A second worker: the dispatcher's frames for its batches too.
        let two = Sizes {
            workers: 2,
            ..sizes(2, 0)
        };
        assert_eq!(in_flight_for(&steps, &two) - budget(2, 0), 8);
    }
}
