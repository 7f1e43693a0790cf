//! Parse, then resolve: in, the options a user gave; out, a checked `Plan` (source facts, loaded
//! sessions, output paths) built before any thread starts, so bad input fails fast and clearly.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};

use crate::decode::{probe, SourceInfo};
use crate::detect::{det_size, Detector};
use crate::encode::{check_settings, EncodeSettings};
use crate::enhance::{Enhancer, Fault, ModelInfo, Worker};
use crate::runtime::{SessionOptions, Target};

/// Where the model runs.
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

/// Everything a run needs, as given (paths not yet checked).
#[derive(Clone, Debug)]
pub struct Options {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Enhancer model; `None` picks the default the set-up provides.
    pub model: Option<PathBuf>,
    pub detector: Option<PathBuf>,
    pub device: Device,
    pub batch: usize,
    /// Long side of the detection copy.
    pub det_size: usize,
    pub det_threshold: f32,
    pub nms_iou: f32,
    /// Full detection every this many frames; faces are tracked in between (1: every frame).
    pub detect_every: u32,
    pub blend: f32,
    pub encode: EncodeSettings,
    /// CPU threads for ONNX Runtime (default: all cores, shared by the CPU workers).
    pub threads: Option<usize>,
    /// TensorRT before CUDA, with its engine cache.
    pub trt: bool,
    /// Half precision: TensorRT's fp16 mode, or an fp16-exported model on CUDA.
    pub fp16: bool,
    /// Decode with FFmpeg's CUDA hwaccel.
    pub hwaccel_cuda: bool,
    /// Stop after this many frames.
    pub max_frames: Option<u64>,
    /// Where to write each frame's face regions as JSON (for inspection and tests).
    pub faces_json: Option<PathBuf>,
}

impl Options {
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        Self {
            input: input.into(),
            output: output.into(),
            model: None,
            detector: None,
            device: Device::Cpu(1),
            batch: 4,
            det_size: 640,
            det_threshold: 0.5,
            nms_iou: 0.3,
            detect_every: DEFAULT_DETECT_EVERY,
            blend: 1.0,
            encode: EncodeSettings::default(),
            threads: None,
            trt: false,
            fp16: false,
            hwaccel_cuda: false,
            max_frames: None,
            faces_json: None,
        }
    }
}

/// A checked run: the source is readable, the models load and fit, the output can be written.
pub struct Plan {
    pub source: SourceInfo,
    pub detector: Detector,
    /// One enhancement worker per device (or per CPU session).
    pub workers: Vec<Worker>,
    pub info: ModelInfo,
    pub model_path: PathBuf,
    pub batch: usize,
    pub blend: f32,
    pub encode: EncodeSettings,
    pub output: PathBuf,
    pub max_frames: Option<u64>,
    pub faces_json: Option<PathBuf>,
    pub hwaccel_cuda: bool,
    /// Set from another thread (Ctrl-C) to stop the run: it then fails with "cancelled" and
    /// leaves no output.
    pub cancel: Arc<AtomicBool>,
}

/// Finds a file the set-up installs (`models/...`): relative to the working directory, then to
/// the checkout the executable was built in.
pub fn find_asset(rel: &str) -> Option<PathBuf> {
    let here = PathBuf::from(rel);
    if here.exists() {
        return Some(here);
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(4)
        .map(|d| d.join(rel))
        .find(|p| p.exists())
}

/// The default enhancer: the official GPEN-BFR-512 if the user put it in models/, else the
/// set-up's identity stand-in.
pub const DEFAULT_MODELS: [&str; 2] = ["models/GPEN-BFR-512.onnx", "models/standin/identity-512.onnx"];
pub const DEFAULT_DETECTOR: &str = "models/centerface.onnx";
/// Full detection every this many frames by default (tracking in between).
pub const DEFAULT_DETECT_EVERY: u32 = 5;

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Where OUT is written until it is complete: beside it, hidden, with the same extension so the
/// container is chosen the same way.
pub fn partial_path(output: &Path) -> Result<PathBuf> {
    let name = output
        .file_name()
        .ok_or_else(|| anyhow!("output {} is not a file path", output.display()))?;
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(dir.join(format!(
        ".{}.partial-{}.{ext}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes the files in `dir` named `PREFIX<pid>SUFFIX` whose process is gone: what a crashed
/// run left half-written. A live process's file (another run on the same folder) is kept.
pub fn remove_stale(dir: &Path, prefix: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => tracing::info!(file = %e.path().display(), "removed a stale partial file"),
            Err(err) => tracing::warn!(file = %e.path().display(), "cannot remove a stale partial file: {err}"),
        }
    }
}

/// Checks OUT: not the input, in an existing writable folder, with a container FFmpeg knows.
pub fn check_output(input: &Path, output: &Path) -> Result<()> {
    if output.as_os_str().is_empty() {
        bail!("no output file given");
    }
    if same_file(input, output) || input == output {
        bail!(
            "output {} is the input file: choose another output path (the input is never overwritten)",
            output.display()
        );
    }
    let partial = partial_path(output)?;
    let dir = partial
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let meta = std::fs::metadata(&dir)
        .map_err(|_| anyhow!("output folder {} does not exist: create it first", dir.display()))?;
    if !meta.is_dir() {
        bail!("output folder {} is not a folder", dir.display());
    }
    if output.is_dir() {
        bail!(
            "output {} is a folder: give a file name such as out.mp4",
            output.display()
        );
    }
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    crate::init_ffmpeg();
    let cname = std::ffi::CString::new(format!("x.{ext}")).map_err(|_| anyhow!("bad output name"))?;
    let known =
        unsafe { !ffmpeg_next::ffi::av_guess_format(std::ptr::null(), cname.as_ptr(), std::ptr::null()).is_null() };
    if ext.is_empty() || !known {
        bail!(
            "output {}: cannot tell the container from the extension `.{ext}`; use .mp4, .mkv or .mov",
            output.display()
        );
    }
    std::fs::File::create(&partial).map_err(|e| anyhow!("output folder {} is not writable: {e}", dir.display()))?;
    std::fs::remove_file(&partial).ok();
    Ok(())
}

/// GPUs the NVIDIA driver exposes, for `cuda:all`.
pub(crate) fn visible_gpus() -> Vec<u32> {
    let n = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| d.count())
        .unwrap_or(0);
    (0..n as u32).collect()
}

impl Plan {
    pub fn resolve(o: &Options) -> Result<Plan> {
        if !(0.0..=1.0).contains(&o.blend) {
            bail!("--blend must be between 0 and 1, got {}", o.blend);
        }
        if o.batch == 0 {
            bail!("--batch must be at least 1");
        }
        let source = probe(&o.input)?;
        check_output(&o.input, &o.output)?;
        check_settings(&o.encode)?;
        if o.hwaccel_cuda {
            crate::decode::check_cuda_hwaccel()?;
        }
        let cores = o
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        let targets: Vec<Target> = match &o.device {
            Device::Cpu(n) => (0..*n).map(Target::Cpu).collect(),
            Device::Cuda(ids) if ids.is_empty() => {
                let all = visible_gpus();
                if all.is_empty() {
                    bail!("--device cuda:all: no NVIDIA GPU is visible (no /proc/driver/nvidia/gpus); check the driver or use --device cpu");
                }
                all.into_iter().map(Target::Cuda).collect()
            }
            Device::Cuda(ids) => ids.iter().copied().map(Target::Cuda).collect(),
        };
        if targets.is_empty() {
            bail!("no device to run the model on: use --device cpu, cpu:N or cuda:N");
        }
        let cpu_workers = targets.iter().filter(|t| matches!(t, Target::Cpu(_))).count().max(1);

        let model_path = match &o.model {
            Some(p) => p.clone(),
            None => DEFAULT_MODELS.iter().find_map(|m| find_asset(m)).ok_or_else(|| {
                anyhow!("no model given and none installed: run scripts/setup.sh, put GPEN-BFR-512.onnx in models/, or pass --model PATH")
            })?,
        };
        let trt_cache = o.trt.then(|| model_path.with_extension("trt-cache"));
        if let Some(dir) = &trt_cache {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the TensorRT engine cache {}", dir.display()))?;
        }
        let mut workers = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            let so = SessionOptions {
                target: target.clone(),
                threads: (cores / cpu_workers).max(1),
                trt: o.trt,
                trt_cache: trt_cache.clone(),
                fp16: o.fp16,
            };
            let session = crate::runtime::session(&model_path, &so, "model")?;
            let enhancer = Enhancer::for_target(session, target)
                .with_context(|| format!("model {} does not fit GPEN's I/O contract", model_path.display()))?;
            workers.push(Worker {
                target: target.clone(),
                enhancer,
                fault: Fault::from_env(i),
            });
        }
        let info = workers[0].enhancer.info.clone();
        if o.fp16 && !o.trt && info.precision.as_deref() != Some("fp16") {
            bail!(
                "--fp16: model {} is not an fp16 export; make one with `models/gpen_export.py --fp16`, or add --trt for TensorRT's fp16 mode",
                model_path.display()
            );
        }
        if let Some(note) = &info.weights_note {
            tracing::warn!(model = %model_path.display(), "{note}");
        }
        let batch = workers[0].enhancer.max_batch(o.batch);
        for w in &mut workers {
            w.enhancer.set_batch(batch);
        }
        if batch != o.batch {
            tracing::info!(batch, "model has a fixed batch size; running {batch} crop(s) per call");
        }

        let det_path = match &o.detector {
            Some(p) => p.clone(),
            None => find_asset(DEFAULT_DETECTOR).ok_or_else(|| {
                anyhow!("detector {DEFAULT_DETECTOR} not found: run scripts/setup.sh or pass --detector PATH")
            })?,
        };
        // Detection runs on the first GPU when there is one.
        let det_target = targets
            .iter()
            .find(|t| matches!(t, Target::Cuda(_)))
            .cloned()
            .unwrap_or(Target::Cpu(0));
        let det_opts = SessionOptions {
            target: det_target,
            threads: (cores / 2).max(1),
            trt: false,
            trt_cache: None,
            fp16: false,
        };
        let det_session = crate::runtime::session(&det_path, &det_opts, "detector")?;
        let wanted = det_size(source.width, source.height, o.det_size);
        let detector = Detector::new(det_session, wanted, o.det_threshold, o.nms_iou, source.rotation)
            .with_context(|| format!("detector {}", det_path.display()))?
            .with_tracking(o.detect_every);

        Ok(Plan {
            source,
            detector,
            workers,
            info,
            model_path,
            batch,
            blend: o.blend,
            encode: o.encode.clone(),
            output: o.output.clone(),
            max_frames: o.max_frames,
            faces_json: o.faces_json.clone(),
            hwaccel_cuda: o.hwaccel_cuda,
            cancel: Arc::new(AtomicBool::new(false)),
        })
    }
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
}
