//! Parse, then resolve: in, the options a user typed (`Options`, with every default written
//! here once); out, the resolved `Settings` (model and detector files found, devices expanded,
//! threads split, the CPU level decided, output paths checked) from which `Job`s and `Engine`s
//! are built.
//!
//! Jobs and engines read the file system, the environment and the GPUs through what this module
//! resolved (the commands read what is theirs: `main` the registry for `--model NAME`, `batch`
//! the shard variables). The split follows ripgrep's LowArgs -> HiArgs: what the user typed,
//! then the resolved state, carried whole.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::defaults;
use crate::engine::{CancelToken, Engine, EngineKey, EngineSpec, Job, Kind, KindExt};
use crate::faces::align::Template;
use crate::faces::detect::det_size;
use crate::faces::enhance::Fault;
use crate::faces::hands::Occlusion;
use crate::faces::paste::MaskKind;
use crate::kernels::Cpu;
use crate::media::decode::probe;
use crate::output::{accept_output, check_side_output, partial_pattern, remove_stale};
use crate::runtime::Target;
pub use crate::treatment::Treatment;

/// A model or detector file as a recipe names it. Serialised as its absolute path, size and
/// modification time, so a file replaced under the same name changes the recipe's hash.
#[derive(Clone, Debug, PartialEq)]
pub struct Asset(pub PathBuf);

impl Asset {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Serialize for Asset {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        use std::os::unix::fs::MetadataExt;
        let abs = self.0.canonicalize().unwrap_or_else(|_| self.0.clone());
        let meta = std::fs::metadata(&self.0).ok();
        let mut st = ser.serialize_struct("Asset", 3)?;
        // Lossy, as a name that is not UTF-8 must still hash (serde refuses such a path).
        st.serialize_field("path", &abs.to_string_lossy())?;
        st.serialize_field("size", &meta.as_ref().map(|m| m.len()))?;
        st.serialize_field(
            "mtime_ns",
            &meta.map(|m| m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec())),
        )?;
        st.end()
    }
}

/// Everything that decides a job's output besides its input: the model and detector files and
/// the treatment. The batch manifest hashes this one value whole.
#[derive(Clone, Debug, Serialize)]
pub struct Recipe {
    pub model: Asset,
    pub detector: Asset,
    /// The face mesh, when there is one (MediaPipe's face landmark model).
    pub mesh: Option<Asset>,
    /// The face-identity model (dlib's, converted), when the set-up made it: the identity
    /// guard, the identity figures and the face selection by photo run on it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<Asset>,
    /// BRISQUE's parameters for the faces' quality figure, when the set-up made them (measured
    /// with the identity, on the same faces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<Asset>,
    /// The hand models (palm detector, hand landmarks), when hands are kept in front of faces
    /// (`--occlusion hands`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hands: Option<[Asset; 2]>,
    /// The model's template as its registry entry gives it (`None`: the file's own, else ffhq).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
    #[serde(flatten)]
    pub treatment: std::sync::Arc<Treatment>,
}

/// Where the model runs, as typed.
#[derive(Clone, Debug, PartialEq)]
pub enum Device {
    /// This many CPU sessions (1 unless `cpu:N`), sharing the cores.
    Cpu(usize),
    /// CUDA device ordinals; empty means every visible GPU.
    Cuda(Vec<u32>),
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu(1)),
            "cuda" | "cuda:all" => Ok(Device::Cuda(Vec::new())),
            _ if s.starts_with("cpu:") => match s[4..].parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => Ok(Device::Cpu(n)),
                _ => Err(format!("bad CPU worker count in `{s}`: use cpu:N with N from 1 to 64")),
            },
            _ => {
                let ids = s
                    .strip_prefix("cuda:")
                    .ok_or_else(|| format!("unknown device `{s}`: use cpu, cpu:N, cuda:N, cuda:N,M or cuda:all"))?;
                ids.split(',')
                    .map(|i| {
                        i.trim()
                            .parse::<u32>()
                            .map_err(|_| format!("bad GPU number `{i}` in `{s}`"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Device::Cuda)
            }
        }
    }
}

impl Device {
    /// The sessions this device stands for: `cuda:all` becomes every GPU in `visible`.
    pub(crate) fn targets(&self, visible: &[u32]) -> Result<Vec<Target>> {
        let targets: Vec<Target> = match self {
            Device::Cpu(n) => (0..*n).map(Target::Cpu).collect(),
            Device::Cuda(ids) if ids.is_empty() => {
                if visible.is_empty() {
                    bail!("--device cuda:all: no NVIDIA GPU is visible (no /proc/driver/nvidia/gpus); check the driver or use --device cpu");
                }
                visible.iter().copied().map(Target::Cuda).collect()
            }
            Device::Cuda(ids) => ids.iter().copied().map(Target::Cuda).collect(),
        };
        if targets.is_empty() {
            bail!("no device to run the model on: use --device cpu, cpu:N or cuda:N");
        }
        Ok(targets)
    }
}

/// Everything a run was asked for, as typed (paths not yet checked).
#[derive(Clone, Debug)]
pub struct Options {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Enhancer model; `None` picks the default the set-up provides.
    pub model: Option<PathBuf>,
    /// The template the model's registry entry gives (a file's own metadata wins).
    pub model_template: Option<Template>,
    pub detector: Option<PathBuf>,
    /// The face mesh: `None` picks the set-up's if present; `Some("none")` runs without one.
    pub mesh: Option<PathBuf>,
    pub device: Device,
    /// What changes the output (every default in [`Treatment::default`]).
    pub treatment: Treatment,
    /// CPU threads for ONNX Runtime (default: all cores, shared by the CPU workers).
    pub threads: Option<usize>,
    /// TensorRT before CUDA, with its engine cache.
    pub trt: bool,
    /// Decode with FFmpeg's CUDA hwaccel.
    pub hwaccel_cuda: bool,
    /// Detection and the face mesh on the model's first GPU instead of the CPU.
    pub detect_gpu: bool,
    /// Where to write each frame's face regions as JSON (for inspection and tests).
    pub faces_json: Option<PathBuf>,
    /// Where to write the run's statistics as JSON.
    pub stats_json: Option<PathBuf>,
    /// Measure the identity each face keeps (see `people::IdentityMeter`).
    pub identity: bool,
}

impl Options {
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        Self {
            input: input.into(),
            output: output.into(),
            model: None,
            model_template: None,
            detector: None,
            mesh: None,
            device: Device::Cpu(1),
            treatment: Treatment::default(),
            threads: None,
            trt: false,
            hwaccel_cuda: false,
            detect_gpu: false,
            faces_json: None,
            stats_json: None,
            identity: false,
        }
    }
}

/// The resolved state every job and engine is built from: files found, devices expanded,
/// threads split, environment read. Cheap to clone; loads nothing.
#[derive(Clone, Debug)]
pub struct Settings {
    /// What decides every job's output.
    pub recipe: Recipe,
    /// One enhancement session per target.
    pub targets: Vec<Target>,
    /// Intra-op threads per CPU session, and for the detector.
    pub(crate) threads_per_worker: usize,
    pub(crate) detector_threads: usize,
    /// Scheduler test hooks, one per target (`GPEN_VIDEO_FAULTS`).
    pub faults: Vec<Fault>,
    pub trt: bool,
    pub(crate) trt_cache: Option<PathBuf>,
    pub hwaccel_cuda: bool,
    /// Detection and the face mesh on the first GPU target, if any (else on the CPU).
    pub detect_gpu: bool,
    pub faces_json: Option<PathBuf>,
    pub stats_json: Option<PathBuf>,
    pub identity: bool,
    /// The faces record without identity figures (see `Job::boxes_only`).
    pub(crate) boxes_only: bool,
    /// The hand models the set-up made, if it did (a job may ask for `occlusion=hands` where
    /// the settings' own treatment is `off`).
    pub hand_models: Option<[PathBuf; 2]>,
    /// The CPU level every kernel of the run takes ([`cpu_level`]): not in the recipe, as every
    /// level gives the same output to the bit and changes only how fast.
    pub cpu: Cpu,
    /// All cores ONNX Runtime may use (the split above divides them).
    cores: usize,
}

pub use crate::defaults::find_asset;

/// The hand models (palm detector, hand landmarks), if the set-up made both.
fn find_hand_models() -> Option<[PathBuf; 2]> {
    let [palm, marks] = defaults::HAND_MODELS.map(find_asset);
    Some([palm?, marks?])
}

/// Says once per process that the hand models are missing and what that means.
fn say_no_hands_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "no hand models ({} and {} are missing): hands in front of faces are painted over, as with --occlusion off; run scripts/setup.sh to make them",
            defaults::HAND_MODELS[0],
            defaults::HAND_MODELS[1]
        );
    });
}

/// Says once per process that there is no face mesh and what that means.
fn say_no_mesh_once() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "no face mesh ({} is missing): faces are aligned by the detector's five points and pasted through the ellipse mask, and no detection is checked; run scripts/setup.sh to make it",
            defaults::MESH
        );
    });
}

/// The face-identity model, found once with the run's other models: `None` where nothing asks
/// for it and the set-up did not make it; asked for (the identity guard, `--identity`, a face
/// named by photo) and missing, an error naming the file and what to do.
fn resolve_identity(t: &Treatment, measured: bool) -> Result<Option<PathBuf>> {
    let found = find_asset(defaults::FACE_ID_MODEL);
    let asked = if t.identity_guard != crate::faces::identity::Guard::Off {
        Some(format!(
            "--identity-guard {} (the default; --identity-guard off runs without it)",
            if t.identity_guard == crate::faces::identity::Guard::Warn {
                "warn"
            } else {
                "back-off"
            }
        ))
    } else if t.selection.names_people() {
        Some("--only-face and --skip-face".to_string())
    } else if measured {
        Some("--identity".to_string())
    } else {
        None
    };
    match (found, asked) {
        (None, Some(what)) => bail!(
            "{what} needs the face-identity model {}, which is missing: run scripts/setup.sh (it makes it from dlib's model)",
            defaults::FACE_ID_MODEL
        ),
        (found, _) => Ok(found),
    }
}

/// The variable that forces a run's CPU level ([`cpu_level`]).
pub(crate) const CPU_VAR: &str = "GPEN_VIDEO_CPU";

/// The CPU level a run's kernels take, decided here once: the highest this CPU runs, or the lower
/// one `GPEN_VIDEO_CPU` names (`plain`, `avx2` or `avx2+fma`), as rav1e's `CpuFeatureLevel` lets
/// a whole run be held to a lower level. A level above what this CPU runs, or a name not known,
/// is an error saying which levels it runs.
pub(crate) fn cpu_level() -> Result<Cpu> {
    match std::env::var(CPU_VAR) {
        Ok(name) if !name.trim().is_empty() => name.parse().map_err(|e| anyhow!("{CPU_VAR}={name}: {e}")),
        Err(std::env::VarError::NotUnicode(_)) => {
            bail!("{CPU_VAR} is not UTF-8: use plain, avx2 or avx2+fma, or leave it unset")
        }
        _ => Ok(Cpu::detected()),
    }
}

/// GPUs the NVIDIA driver exposes, for `cuda:all`.
pub(crate) fn visible_gpus() -> Vec<u32> {
    let n = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| d.count())
        .unwrap_or(0);
    (0..n as u32).collect()
}

impl Settings {
    /// Checks the options and resolves everything that does not depend on a source.
    pub fn resolve(o: &Options) -> Result<Settings> {
        let t = &o.treatment;
        t.check()?;
        let cpu = cpu_level()?;
        if cpu != Cpu::detected() {
            tracing::info!("the kernels run at the {} level ({CPU_VAR})", cpu.name());
        }
        if o.hwaccel_cuda {
            crate::media::decode::check_cuda_hwaccel()?;
        }
        let targets = o.device.targets(&visible_gpus())?;
        let cores = o
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        let model = match &o.model {
            Some(p) => p.clone(),
            None => defaults::MODELS.iter().find_map(|m| find_asset(m)).ok_or_else(|| {
                anyhow!(
                    "no restorer: models/GPEN-BFR-512.onnx is not here and no --model was given. Get one with `gpen-video models fetch GPEN-BFR-512`, record a file you have with `gpen-video models add PATH --name NAME`, build one from a checkpoint with models/gpen_export.py, or name a file with --model PATH (or GPEN_VIDEO_MODEL); the set-up's stand-ins (models/standin/, which restore nothing) run only when named"
                )
            })?,
        };
        let detector = match &o.detector {
            Some(p) => p.clone(),
            None => find_asset(defaults::DETECTOR).ok_or_else(|| {
                anyhow!(
                    "detector {} not found: run scripts/setup.sh or pass --detector PATH",
                    defaults::DETECTOR
                )
            })?,
        };
        let mesh = match &o.mesh {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) if p.is_file() => Some(p.clone()),
            Some(p) => bail!(
                "face mesh {} not found: run scripts/setup.sh (it makes models/face-mesh.onnx), or pass --mesh none",
                p.display()
            ),
            None => find_asset(defaults::MESH),
        };
        let identity = resolve_identity(t, o.identity)?;
        let mut t = t.clone();
        if mesh.is_none() && t.mask == MaskKind::Mesh {
            if o.mesh.is_none() {
                say_no_mesh_once();
            }
            // The ellipse is what a mesh mask gives a face without a mesh.
            t.mask = MaskKind::Face;
        }
        let hand_models = find_hand_models();
        if hand_models.is_none() && t.occlusion == Occlusion::Hands {
            say_no_hands_once();
            t.occlusion = Occlusion::Off;
        }
        let hands = hand_models
            .clone()
            .filter(|_| t.occlusion == Occlusion::Hands)
            .map(|m| m.map(Asset));
        let trt_cache = o.trt.then(|| model.with_extension("trt-cache"));
        if let Some(dir) = &trt_cache {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the TensorRT engine cache {}", dir.display()))?;
        }
        let mut s = Settings {
            recipe: Recipe {
                model: Asset(model),
                detector: Asset(detector),
                mesh: mesh.map(Asset),
                quality: identity
                    .as_ref()
                    .and_then(|_| find_asset(defaults::QUALITY_MODEL))
                    .map(Asset),
                identity: identity.map(Asset),
                hands,
                template: o.model_template,
                treatment: std::sync::Arc::new(t),
            },
            faults: Vec::new(),
            targets: Vec::new(),
            threads_per_worker: 1,
            detector_threads: (cores / 2).max(1),
            trt: o.trt,
            trt_cache,
            hwaccel_cuda: o.hwaccel_cuda,
            detect_gpu: o.detect_gpu,
            faces_json: o.faces_json.clone(),
            stats_json: o.stats_json.clone(),
            identity: o.identity,
            boxes_only: false,
            hand_models,
            cpu,
            cores,
        };
        s.set_targets(targets, cores);
        Ok(s)
    }

    /// Runs on `targets`, sharing `cores` CPU threads among the CPU sessions.
    fn set_targets(&mut self, targets: Vec<Target>, cores: usize) {
        let cpu_workers = targets.iter().filter(|t| matches!(t, Target::Cpu(_))).count().max(1);
        self.threads_per_worker = (cores / cpu_workers).max(1);
        self.detector_threads = (cores / 2).max(1);
        self.faults = (0..targets.len()).map(Fault::from_env).collect();
        self.targets = targets;
    }

    /// The settings of each of `jobs` clips run at once (at most `clips`): one job on the CPU
    /// unless asked, the cores split between CPU jobs; on CUDA one job per GPU, each on one GPU
    /// (round robin when there are more jobs than GPUs).
    pub(crate) fn per_job(&self, jobs: Option<usize>, clips: usize, threads_given: bool) -> Vec<Settings> {
        let gpus: Vec<Target> = self
            .targets
            .iter()
            .filter(|t| matches!(t, Target::Cuda(_)))
            .cloned()
            .collect();
        let n = if gpus.is_empty() {
            jobs.unwrap_or(1)
        } else {
            jobs.unwrap_or(gpus.len())
        }
        .min(clips);
        (0..n)
            .map(|i| {
                let mut s = self.clone();
                if gpus.is_empty() {
                    let cores = if threads_given || n == 1 {
                        self.cores
                    } else {
                        (self.cores / n).max(1)
                    };
                    s.cores = cores;
                    s.set_targets(self.targets.clone(), cores);
                } else {
                    s.set_targets(vec![gpus[i % gpus.len()].clone()], self.cores);
                }
                s
            })
            .collect()
    }

    /// One clip's work: the source probed, OUT and the side outputs checked, nothing loaded.
    pub fn job(&self, input: &Path, output: &Path, cancel: CancelToken) -> Result<Job> {
        crate::output::check_not_pattern(input, "input")?;
        let source = probe(input).kind(Kind::BadInput)?;
        let t = &self.recipe.treatment;
        accept_output(input, output, &t.encode)?;
        // What an earlier run of this output left when it was killed (a live run's is kept).
        let (prefix, suffix) = partial_pattern(output);
        remove_stale(
            output
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
            &prefix,
            &suffix,
        );
        let mut taken: Vec<&Path> = vec![input, output, self.recipe.model.path(), self.recipe.detector.path()];
        for side in [&self.faces_json, &self.stats_json].into_iter().flatten() {
            check_side_output(side, &taken)?;
            taken.push(side);
        }
        Ok(Job {
            source,
            output: output.to_path_buf(),
            to_memory: false,
            treatment: self.recipe.treatment.clone(),
            view: None,
            hwaccel_cuda: self.hwaccel_cuda,
            faces_json: self.faces_json.clone(),
            identity: self.identity,
            identity_model: self.recipe.identity.as_ref().map(|a| a.0.clone()),
            quality_model: self.recipe.quality.as_ref().map(|a| a.0.clone()),
            hand_models: self.hand_models.clone(),
            boxes_only: self.boxes_only,
            cancel,
        })
    }

    /// A picture that lives in memory (a service's upload, `in_ext` its format) restored into
    /// memory as `out_ext`: nothing is read from or written to the file system.
    pub(crate) fn job_in_memory(
        &self,
        (bytes, max_pixels): (std::sync::Arc<[u8]>, u64),
        in_ext: &str,
        out_ext: &str,
        cancel: CancelToken,
    ) -> Result<Job> {
        let mut source =
            crate::media::decode::probe_memory(Path::new(&format!("upload.{in_ext}")), bytes).kind(Kind::BadInput)?;
        // Its decoders refuse a picture over the limit themselves, whatever its header said.
        source.max_pixels = Some(max_pixels);
        Ok(Job {
            source,
            output: PathBuf::from(format!("restored.{out_ext}")),
            to_memory: true,
            treatment: self.recipe.treatment.clone(),
            view: None,
            hwaccel_cuda: false,
            faces_json: None,
            identity: false,
            identity_model: self.recipe.identity.as_ref().map(|a| a.0.clone()),
            quality_model: self.recipe.quality.as_ref().map(|a| a.0.clone()),
            hand_models: self.hand_models.clone(),
            boxes_only: false,
            cancel,
        })
    }

    /// CPU cores a job of these settings may use.
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// What an engine for `job` is built for.
    pub(crate) fn engine_key(&self, job: &Job) -> EngineKey {
        EngineKey {
            model: self.recipe.model.0.clone(),
            detector: self.recipe.detector.0.clone(),
            mesh: self.recipe.mesh.as_ref().map(|m| m.0.clone()),
            template: self.recipe.template,
            targets: self.targets.clone(),
            det_size: {
                let (w, h) = job.source.upright_size();
                det_size(w, h, self.recipe.treatment.detection.det_size)
            },
            rotation: job.source.rotation,
        }
    }

    /// What to load for an engine with `key`.
    fn engine_spec(&self, key: EngineKey) -> EngineSpec {
        EngineSpec {
            key,
            threads_per_worker: self.threads_per_worker,
            detector_threads: self.detector_threads,
            detect_gpu: self.detect_gpu,
            faults: self.faults.clone(),
            trt: self.trt,
            trt_cache: self.trt_cache.clone(),
            fp16: self.recipe.treatment.fp16,
            batch: self.recipe.treatment.batch,
            detection: self.recipe.treatment.detection.clone(),
            cores: self.cores,
            cpu: self.cpu,
        }
    }

    /// Loads an engine for streams of still images that are not known yet (a service): the
    /// detector is sized for each picture as it comes (`pipeline::run_images`).
    pub(crate) fn engine_for_images(&self) -> Result<Engine> {
        let d = self.recipe.treatment.detection.det_size;
        let key = EngineKey {
            model: self.recipe.model.0.clone(),
            detector: self.recipe.detector.0.clone(),
            mesh: self.recipe.mesh.as_ref().map(|m| m.0.clone()),
            template: self.recipe.template,
            targets: self.targets.clone(),
            det_size: det_size(d, d, d),
            rotation: 0,
        };
        Engine::load(self.engine_spec(key))
    }

    /// Loads the sessions `job` needs.
    pub fn engine(&self, job: &Job) -> Result<Engine> {
        Engine::load(self.engine_spec(self.engine_key(job)))
    }

    /// The engine in `cache` if it was built for what `job` needs, else a new one put there.
    pub(crate) fn engine_for<'a>(&self, cache: &'a mut Option<Engine>, job: &Job) -> Result<&'a mut Engine> {
        let key = self.engine_key(job);
        if cache.as_ref().is_some_and(|e| e.key == key) {
            return Ok(cache.as_mut().expect("checked"));
        }
        // Free the old sessions before loading new ones.
        *cache = None;
        Ok(cache.insert(Engine::load(self.engine_spec(key))?))
    }
}

/// Resolves a single run: its settings, its job and the engine it runs on.
pub fn resolve(o: &Options, cancel: CancelToken) -> Result<(Settings, Job, Engine)> {
    let settings = Settings::resolve(o)?;
    let job = settings.job(&o.input, &o.output, cancel)?;
    let engine = settings.engine(&job)?;
    Ok((settings, job, engine))
}

/// Version of [`settings_hash`]'s input: raised when what is hashed changes shape.
const HASH_VERSION: u32 = 2;

/// Hash of everything that decides an output: the [`Recipe`] (the model and detector files by
/// path, size and mtime, and every setting that changes pixels or streams), hashed whole as
/// JSON. Not the device or the number of jobs, which change only how fast. Batch's manifests
/// and a long video's segments are vouched for by it.
pub fn settings_hash(recipe: &Recipe) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(&(HASH_VERSION, recipe)).expect("a recipe always serialises");
    let digest = sha2::Sha256::digest(&json);
    hex::encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu(1)));
        assert_eq!("cpu:3".parse::<Device>(), Ok(Device::Cpu(3)));
        assert!("cpu:0".parse::<Device>().is_err());
        assert_eq!("cuda:0".parse::<Device>(), Ok(Device::Cuda(vec![0])));
        assert_eq!("cuda:0,2".parse::<Device>(), Ok(Device::Cuda(vec![0, 2])));
        assert_eq!("cuda:all".parse::<Device>(), Ok(Device::Cuda(vec![])));
        assert!("gpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
    }

    #[test]
    fn devices_resolve_to_targets() {
        assert_eq!(
            Device::Cpu(2).targets(&[]).unwrap(),
            vec![Target::Cpu(0), Target::Cpu(1)]
        );
        assert_eq!(
            Device::Cuda(vec![]).targets(&[0, 1]).unwrap(),
            vec![Target::Cuda(0), Target::Cuda(1)]
        );
        assert_eq!(Device::Cuda(vec![3]).targets(&[]).unwrap(), vec![Target::Cuda(3)]);
        let err = Device::Cuda(vec![]).targets(&[]).unwrap_err().to_string();
        assert!(err.contains("no NVIDIA GPU is visible"), "{err}");
        assert!(Device::Cpu(0).targets(&[]).is_err());
    }

    fn settings(targets: Vec<Target>, cores: usize) -> Settings {
        let mut s = Settings {
            recipe: Recipe {
                model: Asset("m.onnx".into()),
                detector: Asset("d.onnx".into()),
                mesh: None,
                identity: None,
                quality: None,
                hands: None,
                template: None,
                treatment: Default::default(),
            },
            targets: Vec::new(),
            threads_per_worker: 1,
            detector_threads: 1,
            faults: Vec::new(),
            trt: false,
            trt_cache: None,
            hwaccel_cuda: false,
            detect_gpu: false,
            faces_json: None,
            stats_json: None,
            identity: false,
            boxes_only: false,
            hand_models: None,
            cpu: Cpu::detected(),
            cores,
        };
        s.set_targets(targets, cores);
        s
    }

    #[test]
    fn cpu_threads_are_split_between_sessions_and_jobs() {
        let s = settings(vec![Target::Cpu(0), Target::Cpu(1)], 8);
        assert_eq!(s.threads_per_worker, 4);
        assert_eq!(s.detector_threads, 4);
        let jobs = s.per_job(Some(2), 10, false);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].threads_per_worker, 2, "two jobs of two sessions on 8 cores");
        assert_eq!(
            s.per_job(Some(2), 10, true)[0].threads_per_worker,
            4,
            "--threads is per job"
        );
        assert_eq!(s.per_job(None, 10, false).len(), 1);
        assert_eq!(s.per_job(Some(4), 1, false).len(), 1, "never more jobs than clips");
        assert!(s.per_job(None, 0, false).is_empty());
    }

    #[test]
    fn gpu_jobs_take_one_gpu_each_round_robin() {
        let s = settings(vec![Target::Cuda(0), Target::Cuda(2)], 8);
        let jobs = s.per_job(None, 10, false);
        assert_eq!(
            jobs.iter().map(|j| j.targets.clone()).collect::<Vec<_>>(),
            vec![vec![Target::Cuda(0)], vec![Target::Cuda(2)]]
        );
        let jobs = s.per_job(Some(3), 10, false);
        assert_eq!(jobs[2].targets, vec![Target::Cuda(0)]);
        assert_eq!(jobs[0].faults.len(), 1);
    }
}
