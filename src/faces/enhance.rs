//! Enhancement: in, batches of aligned face crops; out, restored crops. Holds the model's I/O
//! facts read from the file, the session wrapper with its bound buffers, and a worker (one
//! session on one device).

use crate::faces::align::Template;
use anyhow::{anyhow, bail, Result};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{Tensor, TensorElementType, ValueType};

use crate::runtime::{ort_err, Target};

/// What the enhancer model's file says about its input and output.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub input: String,
    pub output: String,
    /// Square crop side S of the [N,3,S,S] input.
    pub size: usize,
    /// `Some(n)` when the batch dimension is fixed (the official GPEN export: 1).
    pub fixed_batch: Option<usize>,
    /// The file's `gpen_video.weights` metadata, if any (stand-ins and random exports say so).
    pub weights_note: Option<String>,
    /// The file's `gpen_video.precision` metadata (`fp16` for half-precision exports).
    pub precision: Option<String>,
    /// Alignment template the model was trained with: its file's `gpen_video.template`, else
    /// the one its registry entry gives (see `Engine::load`), else ffhq.
    pub template: Template,
    /// Whether the file itself names its template (then no registry entry overrides it).
    pub(crate) template_in_file: bool,
    /// The model takes and gives uint8 levels (its conversions inside the graph: see
    /// `models/byte_io.py`) rather than float32 in [-1, 1].
    pub bytes: bool,
    /// A second input that takes the fidelity (CodeFormer's `weight`: 0 most restored, 1 most
    /// faithful), when the model has one.
    pub weight: Option<WeightInput>,
}

/// A model's fidelity input: its name, whether it takes a double (else a float), its shape
/// (one value: [1], [1,1] or a scalar).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightInput {
    pub name: String,
    pub double: bool,
    pub shape: Vec<usize>,
}

/// The error of a `--fidelity` given to `model` (named `shown`) when it has no fidelity input.
pub(crate) fn fidelity_refused(shown: &str) -> anyhow::Error {
    anyhow!("--fidelity: the model {shown} has no fidelity input (CodeFormer's `weight`); leave --fidelity out")
}

/// The fidelity a model with a weight input gets when none is given (CodeFormer's own default).
pub(crate) const DEFAULT_FIDELITY: f32 = 0.5;

impl ModelInfo {
    /// Reads and checks the I/O contract: one float32 [N,3,S,S] input (beside it, at most a
    /// fidelity input of one value: CodeFormer's `weight`) and an output of the same shape (the
    /// first that has it: CodeFormer's other outputs are its codebook's logits and features), or
    /// uint8 both, a model with byte I/O.
    pub fn read(session: &Session) -> Result<Self> {
        let (ins, outs) = (session.inputs(), session.outputs());
        let image = |v: &ValueType| matches!(v, ValueType::Tensor { shape, .. } if shape.len() == 4);
        let Some(at) = ins.iter().position(|i| image(i.dtype())) else {
            bail!(
                "expected an image input [N,3,S,S], found {} inputs ({})",
                ins.len(),
                ins.iter().map(|i| i.name().to_string()).collect::<Vec<_>>().join(", ")
            );
        };
        if ins.len() > 2 || outs.is_empty() {
            bail!(
                "expected one image input (and at most a fidelity input) and at least one output, found {} inputs and {} outputs",
                ins.len(),
                outs.len()
            );
        }
        let weight = match ins.iter().enumerate().find(|(i, _)| *i != at) {
            None => None,
            Some((_, w)) => Some(WeightInput::read(w.name(), w.dtype())?),
        };
        let input = ins[at].name().to_string();
        let ValueType::Tensor { ty, shape, .. } = ins[at].dtype() else {
            bail!("input `{input}` is not a tensor");
        };
        let bytes = match ty {
            TensorElementType::Float32 => false,
            TensorElementType::Uint8 => true,
            _ => bail!("input `{input}` is {ty:?}, expected float32 (or uint8 levels, see models/byte_io.py)"),
        };
        let dims: Vec<i64> = shape.iter().copied().collect();
        if dims.len() != 4 || dims[1] != 3 || dims[2] <= 0 || dims[2] != dims[3] {
            bail!("input `{input}` has shape {dims:?}; a GPEN model takes [N,3,S,S] with a fixed square size S");
        }
        // The image output: the first shaped like the input (a model of one output: that one).
        let shaped = |v: &ValueType| match v {
            ValueType::Tensor { shape, .. } => {
                let o: Vec<i64> = shape.iter().copied().collect();
                o.len() == 4
                    && (o[1] == 3 || o[1] < 0)
                    && (o[2] == dims[2] || o[2] < 0)
                    && (o[3] == dims[3] || o[3] < 0)
            }
            _ => false,
        };
        let out_at = outs.iter().position(|o| shaped(o.dtype())).unwrap_or(0);
        let output = outs[out_at].name().to_string();
        if let ValueType::Tensor { ty, .. } = outs[out_at].dtype() {
            match (bytes, ty) {
                (false, TensorElementType::Float32) | (true, TensorElementType::Uint8) => {}
                (false, _) => {
                    bail!("output `{output}` is {ty:?}, expected float32 (export the model with float32 outputs)")
                }
                (true, _) => bail!("output `{output}` is {ty:?}: a model with uint8 input must give uint8 output"),
            }
        }
        if let ValueType::Tensor { shape: oshape, .. } = outs[out_at].dtype() {
            let o: Vec<i64> = oshape.iter().copied().collect();
            let fits = o.len() == 4
                && (o[1] == 3 || o[1] < 0)
                && (o[2] == dims[2] || o[2] < 0)
                && (o[3] == dims[3] || o[3] < 0);
            if !fits {
                bail!("output `{output}` has shape {o:?}; expected [N,3,{0},{0}]", dims[2]);
            }
        }
        let meta = session.metadata().ok();
        let weights_note = meta.as_ref().and_then(|m| m.custom("gpen_video.weights"));
        let precision = meta.as_ref().and_then(|m| m.custom("gpen_video.precision"));
        let named = meta.as_ref().and_then(|m| m.custom("gpen_video.template"));
        let template = named
            .as_deref()
            .map_or(Ok(Template::Ffhq), str::parse::<Template>)
            .map_err(|e| anyhow!("its gpen_video.template metadata: {e}"))?;
        Ok(Self {
            input,
            output,
            size: dims[2] as usize,
            fixed_batch: (dims[0] > 0).then_some(dims[0] as usize),
            weights_note,
            precision,
            template,
            template_in_file: named.is_some(),
            bytes,
            weight,
        })
    }
}

impl WeightInput {
    /// A fidelity input `name` of type `v`: one float or double value.
    fn read(name: &str, v: &ValueType) -> Result<WeightInput> {
        let ValueType::Tensor { ty, shape, .. } = v else {
            bail!("input `{name}` is not a tensor");
        };
        let double = match ty {
            TensorElementType::Float64 => true,
            TensorElementType::Float32 => false,
            _ => bail!("input `{name}` is {ty:?}: a second input must be a fidelity weight (float or double)"),
        };
        let dims: Vec<i64> = shape.iter().copied().collect();
        if dims.len() > 2 || dims.iter().any(|&d| d > 1) {
            bail!("input `{name}` has shape {dims:?}: a second input must be a fidelity weight of one value ([1] or [1,1])");
        }
        Ok(WeightInput {
            name: name.to_string(),
            double,
            shape: dims.iter().map(|_| 1).collect(),
        })
    }
}

/// Input and output tensors of one batch size, bound to the session once (IO binding): the hot
/// path writes crops straight into the bound input and reads the bound output, with no
/// allocation per batch. On CUDA the tensors live in pinned host memory, so the transfers to
/// and from the GPU are single DMA copies.
struct Bound {
    binding: IoBinding,
    tensors: Tensors,
    /// The fidelity input, when the model has one (its value written before each run).
    weight: Option<Weight>,
}

/// A bound fidelity value.
enum Weight {
    Float(Tensor<f32>),
    Double(Tensor<f64>),
}

/// A bound input and output: floats, or bytes for a model with byte I/O.
enum Tensors {
    Floats(Tensor<f32>, Tensor<f32>),
    Bytes(Tensor<u8>, Tensor<u8>),
}

/// One restored crop as the model gave it: NCHW floats in [-1, 1], or planar bytes (levels).
#[derive(Clone, Copy)]
pub enum Restored<'a> {
    Floats(&'a [f32]),
    Bytes(&'a [u8]),
}

/// A model session with its bound buffers, one set per batch size it runs.
pub struct Enhancer {
    session: Session,
    pub info: ModelInfo,
    allocator: Allocator,
    bound: Vec<Option<Bound>>,
    /// The full batch size: a partial batch runs padded to the next power of two (at most
    /// this), so buffers exist for at most log2(batch) + 1 sizes, under twice a full batch in
    /// all, however batches split.
    batch: usize,
    /// The fidelity a model with a weight input is given (see [`ModelInfo::weight`]).
    fidelity: f32,
    /// The CPU level the crops are converted at, into the model's input and back out of it.
    cpu: crate::kernels::Cpu,
}

/// Where the bound crops live on `target`: host memory the pipeline writes and reads directly,
/// on a GPU too, where ONNX Runtime copies them to and from the device around each run. CUDA's
/// page-locked memory (`CudaPinned`) failed on the first H200 lent (ONNX Runtime 1.31): ort
/// refused to hand it out for writing under API 22 ("not CPU accessible"), and under API 23 the
/// run itself failed in the CUDA provider's copy of the bound input.
fn buffer_memory(target: &Target) -> Result<MemoryInfo<'static>> {
    match target {
        Target::Cpu(_) | Target::Cuda(_) => {
            MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default).map_err(ort_err)
        }
    }
}

impl Enhancer {
    /// Wraps a session on `target`, its bound crops in host memory ([`buffer_memory`]) and
    /// converted at the CPU level `cpu` (the run's: see `crate::kernels::cpu`).
    pub fn for_target(session: Session, target: &Target, cpu: crate::kernels::Cpu) -> Result<Self> {
        let allocator = match target {
            // The default CPU allocator, as before the GPU fix: the CPU path is unchanged.
            Target::Cpu(_) => Allocator::default(),
            Target::Cuda(_) => Allocator::new(&session, buffer_memory(target)?).map_err(ort_err)?,
        };
        Self::with_allocator(session, allocator, cpu)
    }

    fn with_allocator(session: Session, allocator: Allocator, cpu: crate::kernels::Cpu) -> Result<Self> {
        let info = ModelInfo::read(&session)?;
        Ok(Self {
            session,
            info,
            allocator,
            bound: Vec::new(),
            batch: 1,
            fidelity: DEFAULT_FIDELITY,
            cpu,
        })
    }

    /// The CPU level the crops are converted at.
    pub fn cpu(&self) -> crate::kernels::Cpu {
        self.cpu
    }

    /// Sets the fidelity a model with a weight input is given (0 most restored, 1 most faithful).
    pub(crate) fn set_fidelity(&mut self, w: f32) {
        self.fidelity = w;
    }

    /// The fidelity a model with a weight input is given.
    pub fn fidelity(&self) -> f32 {
        self.fidelity
    }

    /// Batch sizes that have buffers bound so far.
    pub fn bound_sizes(&self) -> Vec<usize> {
        (0..self.bound.len()).filter(|&i| self.bound[i].is_some()).collect()
    }

    /// Sets the full batch size the pipeline gathers (see [`Enhancer::run`]).
    pub fn set_batch(&mut self, batch: usize) {
        self.batch = batch.max(1);
    }

    /// Largest batch a call may take, given the wanted batch size.
    pub(crate) fn max_batch(&self, wanted: usize) -> usize {
        self.info.fixed_batch.unwrap_or(wanted.max(1))
    }

    /// Runs the model on `crops` (each one crop in planar RGB24 of 3*S*S bytes, converted to
    /// the model's NCHW floats in [-1, 1] as it is copied in, or copied as they are for a model
    /// with byte I/O); `each` gets every output crop in order.
    pub fn run(&mut self, crops: &[&[u8]], mut each: impl FnMut(usize, Restored<'_>)) -> Result<()> {
        let s = self.info.size;
        let item = 3 * s * s;
        let n = crops.len();
        // A fixed-batch model is fed its own batch size; a partial batch is padded to the next
        // power of two (or the full batch). Unused slots keep old data; their outputs are not
        // read.
        let feed = self.info.fixed_batch.unwrap_or(if n >= self.batch {
            n
        } else {
            n.next_power_of_two().min(self.batch)
        });
        if feed < n {
            bail!("batch of {n} crops exceeds the model's fixed batch {feed}");
        }
        if self.bound.len() <= feed {
            self.bound.resize_with(feed + 1, || None);
        }
        if self.bound[feed].is_none() {
            let shape = [feed, 3, s, s];
            let mut binding = self.session.create_binding().map_err(ort_err)?;
            let (input, output) = (self.info.input.as_str(), self.info.output.as_str());
            let tensors = if self.info.bytes {
                let i = Tensor::<u8>::new(&self.allocator, shape).map_err(ort_err)?;
                let mut o = Tensor::<u8>::new(&self.allocator, shape).map_err(ort_err)?;
                binding.bind_input(input, &i).map_err(ort_err)?;
                binding.bind_output(output, &mut o).map_err(ort_err)?;
                Tensors::Bytes(i, o)
            } else {
                let i = Tensor::<f32>::new(&self.allocator, shape).map_err(ort_err)?;
                let mut o = Tensor::<f32>::new(&self.allocator, shape).map_err(ort_err)?;
                binding.bind_input(input, &i).map_err(ort_err)?;
                binding.bind_output(output, &mut o).map_err(ort_err)?;
                Tensors::Floats(i, o)
            };
            let weight = match &self.info.weight {
                None => None,
                Some(w) => {
                    let shape = w.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
                    let t = if w.double {
                        let t = Tensor::<f64>::new(&self.allocator, shape).map_err(ort_err)?;
                        binding.bind_input(w.name.as_str(), &t).map_err(ort_err)?;
                        Weight::Double(t)
                    } else {
                        let t = Tensor::<f32>::new(&self.allocator, shape).map_err(ort_err)?;
                        binding.bind_input(w.name.as_str(), &t).map_err(ort_err)?;
                        Weight::Float(t)
                    };
                    Some(t)
                }
            };
            self.bound[feed] = Some(Bound {
                binding,
                tensors,
                weight,
            });
        }
        let bound = self.bound[feed].as_mut().expect("bound above");
        match &mut bound.weight {
            Some(Weight::Double(t)) => t.extract_tensor_mut().1.fill(f64::from(self.fidelity)),
            Some(Weight::Float(t)) => t.extract_tensor_mut().1.fill(self.fidelity),
            None => {}
        }
        for (slot, crop) in crops.iter().enumerate() {
            if crop.len() != item {
                bail!("crop {slot} has {} values, expected {item}", crop.len());
            }
            let at = slot * item..(slot + 1) * item;
            match &mut bound.tensors {
                Tensors::Bytes(i, _) => i.extract_tensor_mut().1[at].copy_from_slice(crop),
                Tensors::Floats(i, _) => {
                    crate::kernels::tensor::crop_to_tensor(self.cpu, crop, &mut i.extract_tensor_mut().1[at])
                }
            }
        }
        self.session.run_binding(&bound.binding).map_err(ort_err)?;
        match &bound.tensors {
            Tensors::Bytes(_, o) => {
                for (i, out) in o.extract_tensor().1.chunks_exact(item).take(n).enumerate() {
                    each(i, Restored::Bytes(out));
                }
            }
            Tensors::Floats(_, o) => {
                for (i, out) in o.extract_tensor().1.chunks_exact(item).take(n).enumerate() {
                    each(i, Restored::Floats(out));
                }
            }
        }
        Ok(())
    }
}

/// Test hooks for the scheduler: a delay per batch and a failure at a given batch, for one
/// worker. Read from `GPEN_VIDEO_FAULTS` (e.g. `slow=1:40,fail=0:3`: worker 1 sleeps 40 ms per
/// batch, worker 0 fails its third batch). Not a user feature; the tests drive it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fault {
    pub(crate) delay_ms: u64,
    pub(crate) fail_at: Option<u64>,
}

impl Fault {
    pub(crate) fn from_env(worker: usize) -> Fault {
        std::env::var("GPEN_VIDEO_FAULTS")
            .map(|v| Self::parse(&v, worker))
            .unwrap_or_default()
    }

    pub fn parse(spec: &str, worker: usize) -> Fault {
        let mut f = Fault::default();
        for part in spec.split(',') {
            let Some((kind, rest)) = part.split_once('=') else {
                continue;
            };
            let Some((w, v)) = rest.split_once(':') else { continue };
            if w.trim().parse::<usize>().ok() != Some(worker) {
                continue;
            }
            match (kind.trim(), v.trim().parse::<u64>()) {
                ("slow", Ok(ms)) => f.delay_ms = ms,
                ("fail", Ok(n)) => f.fail_at = Some(n),
                _ => {}
            }
        }
        f
    }
}

/// One enhancement worker: a session on one device.
pub struct Worker {
    pub target: Target,
    /// The model file the session was loaded from, for messages.
    pub model: std::path::PathBuf,
    pub enhancer: Enhancer,
    pub(crate) fault: Fault,
    /// The model is not run: every crop's change is zero, what a model that returns its input
    /// gives, at no cost. `gpen-video bench` times the stages around the model this way.
    pub(crate) skip_model: bool,
    /// Running counts others may read while the worker runs (a service's metrics).
    pub live: std::sync::Arc<Live>,
}

/// A worker's running counts: batches, faces, time busy.
#[derive(Debug, Default)]
pub struct Live {
    pub batches: std::sync::atomic::AtomicU64,
    pub faces: std::sync::atomic::AtomicU64,
    pub(crate) busy_us: std::sync::atomic::AtomicU64,
}

impl Live {
    /// Counts one batch of `faces` that took `busy`.
    pub(crate) fn add(&self, faces: u64, busy: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.batches.fetch_add(1, Relaxed);
        self.faces.fetch_add(faces, Relaxed);
        self.busy_us.fetch_add(busy.as_micros() as u64, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crops a GPU's session is bound to must be memory the pipeline can write and read:
    /// with CUDA's pinned memory, every CUDA run failed at its first batch.
    #[test]
    fn a_gpu_sessions_buffers_are_readable_from_the_host() {
        crate::runtime::init().unwrap();
        for target in [Target::Cpu(0), Target::Cuda(0), Target::Cuda(3)] {
            let info = buffer_memory(&target).unwrap();
            assert!(info.is_cpu_accessible(), "{target}: {info:?}");
        }
    }

    #[test]
    fn faults_parse_per_worker() {
        assert_eq!(
            Fault::parse("slow=1:40,fail=0:3", 0),
            Fault {
                delay_ms: 0,
                fail_at: Some(3)
            }
        );
        assert_eq!(
            Fault::parse("slow=1:40,fail=0:3", 1),
            Fault {
                delay_ms: 40,
                fail_at: None
            }
        );
        assert_eq!(Fault::parse("", 0), Fault::default());
        assert_eq!(Fault::parse("junk,slow=x:1", 0), Fault::default());
    }
}
