//! Enhancement: in, aligned face crops gathered across frames; out, restored crops. Holds the
//! model's I/O facts read from the file, the session wrapper, and the cross-frame batcher that
//! fills batches and releases frames in order.

use std::collections::VecDeque;

use anyhow::{bail, Result};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, Session};
use ort::value::{Tensor, TensorElementType, ValueType};

use crate::frame::FaceFrame;
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
    /// Alignment template the model was trained with (`gpen_video.template`; default ffhq).
    pub template: String,
}

impl ModelInfo {
    /// Reads and checks the I/O contract: one float32 [N,3,S,S] input and a same-shaped output.
    pub fn read(session: &Session) -> Result<Self> {
        let (ins, outs) = (session.inputs(), session.outputs());
        if ins.len() != 1 || outs.is_empty() {
            bail!(
                "expected one input and at least one output, found {} inputs and {} outputs",
                ins.len(),
                outs.len()
            );
        }
        let input = ins[0].name().to_string();
        let ValueType::Tensor { ty, shape, .. } = ins[0].dtype() else {
            bail!("input `{input}` is not a tensor");
        };
        if *ty != TensorElementType::Float32 {
            bail!("input `{input}` is {ty:?}, expected float32");
        }
        let dims: Vec<i64> = shape.iter().copied().collect();
        if dims.len() != 4 || dims[1] != 3 || dims[2] <= 0 || dims[2] != dims[3] {
            bail!("input `{input}` has shape {dims:?}; a GPEN model takes [N,3,S,S] with a fixed square size S");
        }
        let output = outs[0].name().to_string();
        if let ValueType::Tensor { shape: oshape, .. } = outs[0].dtype() {
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
        let template = meta
            .as_ref()
            .and_then(|m| m.custom("gpen_video.template"))
            .unwrap_or_else(|| "ffhq".into());
        Ok(Self {
            input,
            output,
            size: dims[2] as usize,
            fixed_batch: (dims[0] > 0).then_some(dims[0] as usize),
            weights_note,
            precision,
            template,
        })
    }
}

/// Input and output tensors of one batch size, bound to the session once (IO binding): the hot
/// path writes crops straight into the bound input and reads the bound output, with no
/// allocation per batch. On CUDA the tensors live in pinned host memory, so the transfers to
/// and from the GPU are single DMA copies.
struct Bound {
    binding: IoBinding,
    input: Tensor<f32>,
    output: Tensor<f32>,
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
}

impl Enhancer {
    /// Wraps a session on `target`: host buffers come from CUDA pinned memory on a GPU.
    pub fn for_target(session: Session, target: &Target) -> Result<Self> {
        let allocator = match target {
            Target::Cpu(_) => Allocator::default(),
            Target::Cuda(id) => {
                let info = MemoryInfo::new(
                    AllocationDevice::CUDA_PINNED,
                    *id as i32,
                    AllocatorType::Device,
                    MemoryType::CPUInput,
                )
                .map_err(ort_err)?;
                Allocator::new(&session, info).map_err(ort_err)?
            }
        };
        Self::with_allocator(session, allocator)
    }

    fn with_allocator(session: Session, allocator: Allocator) -> Result<Self> {
        let info = ModelInfo::read(&session)?;
        Ok(Self {
            session,
            info,
            allocator,
            bound: Vec::new(),
            batch: 1,
        })
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
    pub fn max_batch(&self, wanted: usize) -> usize {
        self.info.fixed_batch.unwrap_or(wanted.max(1))
    }

    /// Runs the model on `crops` (each one NCHW item of 3*S*S floats in [-1, 1]); `each` gets
    /// every output crop in order.
    pub fn run(&mut self, crops: &[&[f32]], mut each: impl FnMut(usize, &[f32])) -> Result<()> {
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
            let input = Tensor::<f32>::new(&self.allocator, [feed, 3, s, s]).map_err(ort_err)?;
            let mut output = Tensor::<f32>::new(&self.allocator, [feed, 3, s, s]).map_err(ort_err)?;
            let mut binding = self.session.create_binding().map_err(ort_err)?;
            binding.bind_input(self.info.input.as_str(), &input).map_err(ort_err)?;
            binding
                .bind_output(self.info.output.as_str(), &mut output)
                .map_err(ort_err)?;
            self.bound[feed] = Some(Bound { binding, input, output });
        }
        let bound = self.bound[feed].as_mut().expect("bound above");
        {
            let (_, data) = bound.input.extract_tensor_mut();
            for (slot, crop) in crops.iter().enumerate() {
                if crop.len() != item {
                    bail!("crop {slot} has {} values, expected {item}", crop.len());
                }
                data[slot * item..(slot + 1) * item].copy_from_slice(crop);
            }
        }
        self.session.run_binding(&bound.binding).map_err(ort_err)?;
        let (_, data) = bound.output.extract_tensor();
        for (i, out) in data.chunks_exact(item).take(n).enumerate() {
            each(i, out);
        }
        Ok(())
    }
}

/// Test hooks for the scheduler: a delay per batch and a failure at a given batch, for one
/// worker. Read from `GPEN_VIDEO_FAULTS` (e.g. `slow=1:40,fail=0:3`: worker 1 sleeps 40 ms per
/// batch, worker 0 fails its third batch). Not a user feature; the tests drive it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fault {
    pub delay_ms: u64,
    pub fail_at: Option<u64>,
}

impl Fault {
    pub fn from_env(worker: usize) -> Fault {
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
    pub enhancer: Enhancer,
    pub fault: Fault,
}

/// Gathers face crops across consecutive frames into batches and releases frames in order once
/// all their faces are back. It holds at most `max_hold` frames: the dispatcher stops taking
/// frames when it is full, so a model slower than decoding holds the decoder back instead of
/// piling frames up in memory. A partial batch runs only when the stream ends or when the
/// batcher is full (long stretches with few faces).
pub struct Batcher {
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
    pub fn new(batch: usize, max_hold: usize) -> Self {
        Self {
            batch: batch.max(1),
            max_hold: max_hold.max(1),
            held: VecDeque::new(),
            pending: VecDeque::new(),
            base: 0,
            waiting: VecDeque::new(),
        }
    }

    pub fn push(&mut self, f: FaceFrame) {
        let seq = self.base + self.held.len() as u64;
        for i in 0..f.faces.len() {
            self.pending.push_back((seq, i));
        }
        self.waiting.push_back(f.faces.len());
        self.held.push_back(f);
    }

    /// The next batch to run, if one is due: full, or partial when `end` or too much is held.
    pub fn due(&mut self, end: bool) -> Option<Vec<(u64, usize)>> {
        let due = self.pending.len() >= self.batch || (!self.pending.is_empty() && (end || self.is_full()));
        due.then(|| {
            let n = self.pending.len().min(self.batch);
            self.pending.drain(..n).collect()
        })
    }

    /// The held frame with sequence `seq`.
    pub fn frame_mut(&mut self, seq: u64) -> &mut FaceFrame {
        &mut self.held[(seq - self.base) as usize]
    }

    /// Marks one face of frame `seq` as restored.
    pub fn done(&mut self, seq: u64) {
        let w = &mut self.waiting[(seq - self.base) as usize];
        *w = w.saturating_sub(1);
    }

    /// The oldest frame, if all its faces are back.
    pub fn pop_ready(&mut self) -> Option<FaceFrame> {
        if *self.waiting.front()? > 0 {
            return None;
        }
        self.waiting.pop_front();
        self.base += 1;
        self.held.pop_front()
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Holds as many frames as it may: take no more until some leave.
    pub fn is_full(&self) -> bool {
        self.held.len() >= self.max_hold
    }

    /// Faces waiting for a batch.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::align::Affine;
    use crate::frame::{Face, FaceJob, Frame};

    fn frame(index: u64, faces: usize) -> FaceFrame {
        let job = || FaceJob {
            face: Face {
                bbox: [0.0; 4],
                score: 1.0,
                landmarks: [[0.0; 2]; 5],
            },
            to_crop: Affine([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
            region: None,
            crop: Vec::new(),
            restored: None,
        };
        FaceFrame {
            frame: Frame {
                index,
                pts: Some(index as i64),
                width: 0,
                height: 0,
                rgb: Vec::new(),
                rgb_partial: false,
                det: Vec::new(),
                source: None,
                dirty: Vec::new(),
            },
            faces: (0..faces).map(|_| job()).collect(),
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
