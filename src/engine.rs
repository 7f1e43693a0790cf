//! Engine and job: in, an `EngineSpec` (what to load, resolved by `config`); out, an `Engine`
//! (the loaded detector and enhancement sessions, keyed by what they were built for, reusable
//! across any number of jobs). Also the `Job` (one source, one output, its limits, sinks and
//! cancel token) and the typed `Cancelled` error.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::faces::detect::{DetectSettings, Detector};
use crate::faces::enhance::{Enhancer, Fault, ModelInfo, Worker};
use crate::frame::View;
use crate::media::decode::SourceInfo;
use crate::runtime::{SessionOptions, Target};
use crate::treatment::Treatment;

/// What an engine was built for: a job whose key is equal runs on it unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EngineKey {
    pub model: PathBuf,
    pub detector: PathBuf,
    /// The face mesh, if any.
    pub mesh: Option<PathBuf>,
    /// The model's template by its registry entry, for a file that does not name its own.
    pub template: Option<crate::faces::align::Template>,
    pub targets: Vec<Target>,
    /// Size of the detection copy (the detector's input).
    pub det_size: (usize, usize),
    /// Display rotation the detector turns pictures upright for.
    pub rotation: u32,
}

/// Everything an engine is loaded from: its key and how to build the sessions.
#[derive(Clone, Debug)]
pub struct EngineSpec {
    pub key: EngineKey,
    /// Intra-op threads per CPU session, and for the detector.
    pub(crate) threads_per_worker: usize,
    pub(crate) detector_threads: usize,
    /// Detection and the face mesh on the first GPU target (else on the CPU).
    pub detect_gpu: bool,
    /// Scheduler test hooks, one per target.
    pub faults: Vec<Fault>,
    pub trt: bool,
    pub(crate) trt_cache: Option<PathBuf>,
    pub fp16: bool,
    /// Crops per model call asked for.
    pub batch: usize,
    /// How faces are looked for (the copy's size is the key's).
    pub detection: DetectSettings,
    /// CPU cores this engine's pipelines may use: alignment and paste run on pools this wide.
    pub cores: usize,
    /// The CPU level every kernel of the engine's runs takes (see `crate::kernels::cpu`).
    pub cpu: crate::kernels::Cpu,
}

/// The loaded sessions.
pub struct Engine {
    pub key: EngineKey,
    pub detector: Detector,
    /// Face-mesh sessions, one per thread of the mesh stage (none without a mesh).
    pub(crate) meshers: Vec<crate::faces::mesh::Mesher>,
    /// One enhancement worker per device (or per CPU session).
    pub workers: Vec<Worker>,
    pub info: ModelInfo,
    /// Crops per model call (the model's own size when its batch is fixed).
    pub batch: usize,
    /// Threads of each pool stage (alignment, paste).
    pub pool_threads: usize,
    /// Where the face-identity model runs (the choose and identity stages): where detection
    /// and the mesh run, one thread on the CPU.
    pub(crate) identity_opts: SessionOptions,
    /// The CPU level every kernel of its runs takes, decided by the settings.
    pub cpu: crate::kernels::Cpu,
    /// The reference photos described on this engine, kept for its later runs.
    pub references: crate::people::References,
    /// The hand models' sessions, opened by the first run that keeps hands in front of faces
    /// (`--occlusion hands`) and kept for the engine's later runs; never opened by one that
    /// does not.
    pub hands: Option<crate::faces::hands::Hands>,
    /// The face-identity model's session of the identity stage (the guard and the identity
    /// figures), opened by the first run that measures faces and kept for the engine's later
    /// runs of the same model file (a folder's clips, a service's jobs, a benchmark's runs).
    pub(crate) identifier: Option<(std::path::PathBuf, crate::faces::identity::Identifier)>,
}

/// The template the model's entry gives, on workers whose file names none of its own.
fn registered_template(workers: &mut [Worker], template: Option<crate::faces::align::Template>) {
    for w in workers {
        let info = &mut w.enhancer.info;
        if let (false, Some(t)) = (info.template_in_file, template) {
            info.template = t;
        }
    }
}

/// A stop request shared with whoever may set it (Ctrl-C, a batch coordinator).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token nothing sets but [`CancelToken::cancel`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A token set whenever `flag` is (an interrupt flag).
    pub fn from_flag(flag: Arc<AtomicBool>) -> Self {
        Self(flag)
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The flag itself, for what travels with a frame (`Frame::dropped`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// The error of a job stopped by its cancel token (not a failure of the job itself).
#[derive(Debug, thiserror::Error)]
#[error("cancelled after {frames} frames of {input}; no output written")]
pub(crate) struct Cancelled {
    pub(crate) frames: u64,
    pub(crate) input: String,
}

/// Whether `e` (or any error it wraps) is a [`Cancelled`].
pub(crate) fn is_cancelled(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Cancelled>())
}

/// What kind of failure an error is, whatever its words: a service answers by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The input cannot be read (not a picture or video, damaged, refused).
    BadInput,
    /// The input or what was asked of it is larger than allowed.
    TooLarge,
    /// Stopped on purpose (Ctrl-C, a stop, a request no longer wanted).
    Cancelled,
    /// Not done within its deadline.
    Deadline,
    /// No room for more work now; try again later.
    Busy,
    /// The client did not send its input in time.
    Slow,
    /// The model or the machine failed (what an error without a kind is).
    Engine,
    /// Writing an output failed.
    Io,
    /// What was asked for does not exist (a service's job id).
    NotFound,
    /// Not possible in the state it is in (a job's result before it is done).
    Conflict,
    /// Too many waiting already (a service's `--max-jobs`).
    TooMany,
    /// Not allowed: a service's token missing or wrong.
    Unauthorized,
    /// Refused whoever asks: a request from another site, or for a host name the service is not.
    Forbidden,
}

/// An error marked with its [`Kind`]; it reads as the error it wraps.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: Kind,
    inner: anyhow::Error,
}

impl Failure {
    /// A new error of `kind` saying `message`.
    pub(crate) fn error(kind: Kind, message: impl Into<String>) -> anyhow::Error {
        Failure {
            kind,
            inner: anyhow::Error::msg(message.into()),
        }
        .into()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.chain().nth(1)
    }
}

/// Marks an error with its kind.
pub(crate) trait KindExt<T> {
    fn kind(self, kind: Kind) -> Result<T>;
}

impl<T> KindExt<T> for Result<T> {
    fn kind(self, kind: Kind) -> Result<T> {
        self.map_err(|inner| Failure { kind, inner }.into())
    }
}

/// The kind of `e`: the first mark in its chain, a [`Cancelled`], an input refused for naming
/// other resources (bad input), else an engine failure.
pub(crate) fn kind_of(e: &anyhow::Error) -> Kind {
    e.chain()
        .find_map(|c| {
            if let Some(f) = c.downcast_ref::<Failure>() {
                Some(f.kind)
            } else if c.is::<Cancelled>() {
                Some(Kind::Cancelled)
            } else if c.is::<crate::media::input::Refused>() {
                Some(Kind::BadInput)
            } else {
                None
            }
        })
        .unwrap_or(Kind::Engine)
}

/// One clip's work: its source, its output and the treatment it runs under, held whole.
#[derive(Clone)]
pub struct Job {
    pub source: SourceInfo,
    pub output: PathBuf,
    /// The restored picture is kept in memory instead of written to `output` (a service's
    /// request; `output` then only names its format).
    pub(crate) to_memory: bool,
    /// Everything that changes what the job writes, shared with the run's other jobs.
    pub treatment: Arc<Treatment>,
    /// This picture's own view, where a request asked for one (else the treatment's).
    pub(crate) view: Option<View>,
    pub hwaccel_cuda: bool,
    /// Where each frame's faces are streamed as JSON.
    pub faces_json: Option<PathBuf>,
    /// Measure who each restored face still is even without the identity guard (`--identity`);
    /// with `faces_json` every face is measured, unless `boxes_only`.
    pub identity: bool,
    /// The face-identity model the settings resolved, if any (the guard and the figures run on
    /// it; the people named by photo too).
    pub(crate) identity_model: Option<PathBuf>,
    /// BRISQUE's parameters the settings resolved, if any (the faces' quality figure).
    pub(crate) quality_model: Option<PathBuf>,
    /// The hand models the settings found (palm detector, hand landmarks), if any.
    pub hand_models: Option<[PathBuf; 2]>,
    /// The faces record says where the faces are, not how much identity each kept (a
    /// service's jobs: their page draws the boxes; no identity model runs for them).
    pub(crate) boxes_only: bool,
    pub cancel: CancelToken,
}

/// WebP's largest side in pixels: libwebp refuses a picture beyond it.
pub(crate) const WEBP_MAX_SIDE: usize = 16383;

impl Job {
    /// Refuses, before any work, a WebP output larger than WebP holds: the picture's sides
    /// turned upright, a side-by-side view's doubled width.
    pub fn check_webp_size(&self) -> anyhow::Result<()> {
        if !crate::media::kind::ext_of(&self.output).eq_ignore_ascii_case("webp") {
            return Ok(());
        }
        let (w, h) = (self.source.width, self.source.height);
        // Turned upright (EXIF orientations 5 to 8, a quarter turn), the sides swap.
        let (uw, uh) = if (5..=8).contains(&self.source.orientation) || self.source.rotation % 180 == 90 {
            (h, w)
        } else {
            (w, h)
        };
        let side = self.view().compare == Some(crate::frame::Compare::Side);
        let widest = if side { (2 * uw).max(uh) } else { uw.max(uh) };
        if widest > WEBP_MAX_SIDE {
            anyhow::bail!(
                "a WebP picture holds at most {WEBP_MAX_SIDE} pixels a side, and this {w}x{h} picture{} would be {widest}: choose PNG, JPEG, TIFF or BMP",
                if side { " side by side with its original" } else { "" }
            );
        }
        Ok(())
    }

    /// How the job's pictures are shown: its own view, else the treatment's.
    pub(crate) fn view(&self) -> View {
        self.view.unwrap_or_else(|| self.treatment.view())
    }

    /// The same job under a treatment `change` makes of this one's (a benchmark's warm-up run,
    /// its fastest encoder preset).
    pub fn with_treatment(&self, change: impl FnOnce(&mut Treatment)) -> Job {
        let mut t = (*self.treatment).clone();
        change(&mut t);
        Job {
            treatment: Arc::new(t),
            ..self.clone()
        }
    }
}

impl Engine {
    /// The enhancement workers of `s` (one session per target), their model's facts and the
    /// crops per call they run (the model's own where its batch is fixed).
    fn load_workers(s: &EngineSpec) -> Result<(Vec<Worker>, ModelInfo, usize)> {
        let mut workers = Vec::new();
        for (i, target) in s.key.targets.iter().enumerate() {
            let so = SessionOptions {
                target: target.clone(),
                threads: s.threads_per_worker,
                trt: s.trt,
                trt_cache: s.trt_cache.clone(),
                fp16: s.fp16,
                varied_shapes: false,
            };
            let session = crate::runtime::session(&s.key.model, &so, "model")?;
            let enhancer = Enhancer::for_target(session, target, s.cpu)
                .with_context(|| format!("model {} does not fit GPEN's I/O contract", s.key.model.display()))?;
            workers.push(Worker {
                target: target.clone(),
                model: s.key.model.clone(),
                enhancer,
                fault: s.faults.get(i).cloned().unwrap_or_default(),
                skip_model: false,
                live: Default::default(),
            });
        }
        registered_template(&mut workers, s.key.template);
        let info = workers[0].enhancer.info.clone();
        if s.fp16 && !s.trt && info.precision.as_deref() != Some("fp16") {
            bail!(
                "--fp16: model {} is not an fp16 export; make one with `models/gpen_export.py --fp16`, or add --trt for TensorRT's fp16 mode",
                s.key.model.display()
            );
        }
        if let Some(note) = &info.weights_note {
            tracing::warn!(model = %s.key.model.display(), "{note}");
        }
        let batch = workers[0].enhancer.max_batch(s.batch);
        for w in &mut workers {
            w.enhancer.set_batch(batch);
        }
        if batch != s.batch {
            tracing::info!(batch, "model has a fixed batch size; running {batch} crop(s) per call");
        }
        Ok((workers, info, batch))
    }

    /// Loads the enhancement sessions (one per target) and the detector for `key`.
    pub fn load(s: EngineSpec) -> Result<Engine> {
        let (workers, info, batch) = Self::load_workers(&s)?;
        let key = s.key;
        // Detection runs on the CPU unless asked to run on the first GPU: on the first H200
        // lent, CenterFace's and the mesh's inputs of changing sizes kept the CUDA provider
        // busy on the host (the GPU under 2 % busy) for seconds a frame.
        let det_target = key
            .targets
            .iter()
            .find(|t| matches!(t, Target::Cuda(_)) && s.detect_gpu)
            .cloned()
            .unwrap_or(Target::Cpu(0));
        let det_opts = SessionOptions {
            target: det_target,
            threads: s.detector_threads,
            trt: false,
            trt_cache: None,
            fp16: false,
            varied_shapes: true,
        };
        let det_session = crate::runtime::session(&key.detector, &det_opts, "detector")?;
        let d = &s.detection;
        let pool_threads = s.cores.clamp(1, crate::defaults::POOL_THREADS_MAX);
        // On the CPU a frame's windows are shared out among sessions of one thread each, one per
        // pool thread (the first session keeps the detector's threads for whole-frame passes).
        let mut extra = Vec::new();
        if matches!(det_opts.target, Target::Cpu(_)) {
            let opts = SessionOptions {
                threads: 1,
                ..det_opts.clone()
            };
            for _ in 1..pool_threads {
                extra.push(crate::runtime::session(&key.detector, &opts, "detector")?);
            }
        }
        let detector = Detector::new(det_session, key.det_size, d.threshold, d.nms_iou, key.rotation)
            .with_context(|| format!("detector {}", key.detector.display()))?
            .with_tracking(d.every)
            .with_max_faces(d.max_faces)
            .with_sessions(extra);
        // The mesh runs where the detector does: one session per stage thread on the CPU, one
        // on a GPU.
        let mut meshers = Vec::new();
        if let Some(path) = &key.mesh {
            let n = if matches!(det_opts.target, Target::Cuda(_)) {
                1
            } else {
                pool_threads
            };
            let opts = SessionOptions {
                threads: 1,
                varied_shapes: true,
                ..det_opts.clone()
            };
            for _ in 0..n {
                let session = crate::runtime::session(path, &opts, "face mesh")?;
                meshers.push(
                    crate::faces::mesh::Mesher::new(session)
                        .with_context(|| format!("face mesh {}", path.display()))?
                        .with_padding(matches!(det_opts.target, Target::Cuda(_))),
                );
            }
        }
        Ok(Engine {
            key,
            detector,
            meshers,
            workers,
            info,
            batch,
            pool_threads,
            identity_opts: SessionOptions {
                threads: 1,
                varied_shapes: true,
                ..det_opts
            },
            cpu: s.cpu,
            references: Default::default(),
            hands: None,
            identifier: None,
        })
    }

    /// The workers' devices, comma-separated (`cpu0,cpu1`, `cuda:0`).
    pub fn devices(&self) -> String {
        self.workers
            .iter()
            .map(|w| w.target.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}
