//! ONNX Runtime set-up: in, where the shared library may be and a model file; out, a loaded
//! runtime and CPU sessions, with errors that say what is missing and how to get it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use ort::environment::Environment;
use ort::ep;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

/// Where to look for libonnxruntime.so, in order: $ORT_DYLIB_PATH, for an installed package the
/// `onnxruntime` (or `onnxruntime-gpu`) wheel's library in the same site-packages, next to the
/// executable, the set-up's `.deps/lib` of the checkout the executable was built in, then the
/// system loader.
fn candidates() -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        c.push(PathBuf::from(p));
        return c;
    }
    if let Some(site) = crate::defaults::package_root().and_then(|r| r.parent().map(Path::to_path_buf)) {
        c.push(wheel_library(&site.join("onnxruntime").join("capi")));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        c.push(dir.join("libonnxruntime.so"));
        // target/{release,debug}[/deps]/gpen-video -> checkout root
        for up in dir.ancestors().skip(1).take(3) {
            c.push(up.join(".deps/lib/libonnxruntime.so"));
        }
    }
    c.push(PathBuf::from("libonnxruntime.so"));
    c
}

/// The library in an `onnxruntime` wheel's `capi` folder: `libonnxruntime.so` if there is one,
/// else the versioned file the wheels ship (`libonnxruntime.so.1.31.1`), the newest by name.
fn wheel_library(capi: &Path) -> PathBuf {
    let plain = capi.join("libonnxruntime.so");
    if plain.exists() {
        return plain;
    }
    let mut versioned: Vec<PathBuf> = std::fs::read_dir(capi)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
        .collect();
    versioned.sort();
    versioned.pop().unwrap_or(plain)
}

/// Loads ONNX Runtime once per process and returns its environment.
pub(crate) fn init() -> Result<&'static Environment> {
    static LOADED: OnceLock<Result<(PathBuf, Environment), String>> = OnceLock::new();
    let r = LOADED.get_or_init(|| {
        let mut tried = Vec::new();
        for path in candidates() {
            let exists = path.components().count() == 1 || path.exists();
            if !exists {
                tried.push(format!("{} (missing)", path.display()));
                continue;
            }
            match ort::init_from(&path) {
                Ok(builder) => match builder.with_name("gpen-video").build() {
                    Ok(env) => return Ok((path, env)),
                    Err(e) => tried.push(format!("{}: {e}", path.display())),
                },
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(format!(
            "ONNX Runtime shared library not found; tried: {}. Run scripts/setup.sh, or set ORT_DYLIB_PATH to a libonnxruntime.so (the `onnxruntime` PyPI wheel ships one under onnxruntime/capi/)",
            tried.join("; ")
        ))
    });
    match r {
        Ok((p, env)) => {
            tracing::debug!(path = %p.display(), "ONNX Runtime loaded");
            Ok(env)
        }
        Err(e) => Err(anyhow!(e.clone())),
    }
}

/// Turns an ort error (whose builder variants are not `Send`) into an anyhow error.
pub(crate) fn ort_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

/// Where one session runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// CPU worker number (several CPU sessions can share a machine).
    Cpu(usize),
    /// CUDA device ordinal.
    Cuda(u32),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Cpu(i) => write!(f, "cpu{i}"),
            Target::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// How a session is built.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    pub target: Target,
    /// Intra-op threads (CPU execution).
    pub threads: usize,
    /// Use TensorRT (with an engine cache in `trt_cache`) before CUDA.
    pub trt: bool,
    pub(crate) trt_cache: Option<PathBuf>,
    pub fp16: bool,
    /// Inputs of many shapes (the detector's windows, batched per size): on CUDA, cuDNN picks
    /// each convolution's algorithm by its heuristic instead of timing every algorithm again
    /// for each new shape, which would stall the first frames that bring one.
    pub(crate) varied_shapes: bool,
}

impl SessionOptions {
    pub fn cpu(threads: usize) -> Self {
        Self {
            target: Target::Cpu(0),
            threads,
            trt: false,
            trt_cache: None,
            fp16: false,
            varied_shapes: false,
        }
    }
}

/// Opens `path` as a CPU session with `threads` intra-op threads.
pub fn cpu_session(path: &Path, threads: usize, what: &str) -> Result<Session> {
    session(path, &SessionOptions::cpu(threads), what)
}

/// Opens `path` on the options' target. A GPU provider that fails to register is an error that
/// says what is missing; there is never a silent fallback to the CPU.
pub fn session(path: &Path, o: &SessionOptions, what: &str) -> Result<Session> {
    session_at(path, o, what, GraphOptimizationLevel::Level3)
}

/// [`session`] without the layout optimizations (level 2): a file's fixed shapes and the same
/// graph with a symbolic batch then run the same kernels, so their results can be compared to
/// the bit (at level 3 the fixed shapes get blocked-layout convolutions, which differ from the
/// plain ones in the last bit).
pub(crate) fn session_portable(path: &Path, o: &SessionOptions, what: &str) -> Result<Session> {
    session_at(path, o, what, GraphOptimizationLevel::Level2)
}

fn session_at(path: &Path, o: &SessionOptions, what: &str, level: GraphOptimizationLevel) -> Result<Session> {
    let env = init()?;
    tracing::debug!(model = %path.display(), "opening the {what}");
    match std::fs::metadata(path) {
        Err(e) => bail!("cannot read {what} {}: {e}", path.display()),
        Ok(m) if !m.is_file() => bail!("{what} {} is not a file", path.display()),
        Ok(_) => {}
    }
    let mut b = Session::builder(env)
        .map_err(ort_err)?
        .with_optimization_level(level)
        .map_err(ort_err)?
        .with_intra_threads(o.threads.max(1))
        .map_err(ort_err)?
        // Idle ONNX Runtime threads would otherwise spin, taking cores from decoding, detection
        // and encoding, which run beside the model in this pipeline.
        .with_intra_op_spinning(false)
        .map_err(ort_err)?
        // Batch sizes vary (partial batches): a memory pattern per shape only grows the arena.
        .with_memory_pattern(false)
        .map_err(ort_err)?;
    if let Target::Cuda(id) = o.target {
        let mut eps = Vec::new();
        if o.trt {
            let mut trt = ep::TensorRT::default().with_device_id(id as i32).with_fp16(o.fp16);
            if let Some(dir) = &o.trt_cache {
                trt = trt.with_engine_cache(true).with_engine_cache_path(dir.display());
            }
            eps.push(trt.build().error_on_failure());
        }
        let mut cuda = ep::CUDA::default().with_device_id(id as i32);
        if o.varied_shapes {
            cuda = cuda.with_conv_algorithm_search(ep::cuda::ConvAlgorithmSearch::Heuristic);
        }
        eps.push(cuda.build().error_on_failure());
        b = b.with_execution_providers(eps).map_err(|e| {
            anyhow!(
                "{} execution provider could not start on cuda:{id} ({e}). It needs an NVIDIA driver, the CUDA and cuDNN libraries{}, and the GPU build of ONNX Runtime (the onnxruntime-gpu wheel: point ORT_DYLIB_PATH at its libonnxruntime.so)",
                if o.trt { "TensorRT/CUDA" } else { "CUDA" },
                if o.trt { ", TensorRT" } else { "" }
            )
        })?;
    }
    b.commit_from_file(path).map_err(ort_err).with_context(|| {
        format!(
            "cannot load {what} {} on {} (is it an ONNX model?)",
            path.display(),
            o.target
        )
    })
}
