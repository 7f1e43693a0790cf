//! A batch-1 model made to take batches: in, an ONNX file whose declared image input and outputs
//! fix the batch at 1; out, the bytes of a copy whose batch dimension is a symbol, and the check
//! that the copy, given four crops in one call, gives to the bit what the file gives them one by
//! one. Many published restorers declare batch 1 although nothing in their graph depends on it;
//! the copy lets the pipeline gather crops into batches on a GPU as it does for its own exports.
//!
//! Two tries, each checked: the declared shapes alone (the image input's first dimension, and
//! every output of rank 2 or more whose first dimension is 1, become `N`; the intermediate
//! shapes a file may record are dropped, ONNX Runtime infers them again), then also the
//! constant shapes of `Reshape` nodes whose first entry is 1, which become 0 ("as the input's").
//! A graph that still ties its batch (a grouped convolution whose groups are the batch, a
//! reshape that folds the batch into channels) fails the check and keeps batch 1.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use onnx_rs::ast::{DataLocation, Dimension, OpType, StringStringEntry, TensorProto, TypeValue, ValueInfo};

use crate::faces::enhance::{Enhancer, Restored};
use crate::runtime::{SessionOptions, Target};

/// The name the batch dimension gets.
pub const SYMBOL: &str = "N";

/// Crops the check runs in one call against as many single calls.
pub const CHECK_BATCH: usize = 4;

/// Sets a value's first dimension to [`SYMBOL`] when it is 1 (and the value has `min_rank`
/// dimensions or more); whether it did.
fn free_first_dim(v: &mut ValueInfo<'_>, min_rank: usize) -> bool {
    let Some(TypeValue::Tensor(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) else {
        return false;
    };
    let Some(shape) = t.shape.as_mut() else { return false };
    if shape.dim.len() < min_rank || shape.dim[0].value != Dimension::Value(1) {
        return false;
    }
    shape.dim[0].value = Dimension::Param(SYMBOL);
    true
}

/// A shape constant whose first entry is 1, with that entry made 0 (a Reshape's "as the input").
fn freed_shape<'a>(t: &TensorProto<'a>) -> Option<TensorProto<'a>> {
    let v = t.as_i64()?;
    if t.dims().len() != 1 || v.first() != Some(&1) {
        return None;
    }
    let mut v = v.into_owned();
    v[0] = 0;
    Some(TensorProto::from_i64(t.name(), t.dims().to_vec(), v))
}

/// The bytes of `onnx` with its batch made symbolic (see the module's note): `input` is the
/// image input's name; `reshapes` also frees the first entry of constant Reshape shapes.
/// Returns the new bytes and how many reshape constants changed.
pub fn symbolic(onnx: &[u8], input: &str, reshapes: bool) -> Result<(Vec<u8>, usize)> {
    let mut model = onnx_rs::parse(onnx).map_err(|e| anyhow!("not a readable ONNX file: {e}"))?;
    let graph = model.graph.as_mut().ok_or_else(|| anyhow!("the file has no graph"))?;
    if graph
        .initializer
        .iter()
        .any(|t| t.data_location() == DataLocation::External)
    {
        bail!("its weights are kept in external files; only a self-contained file can be copied");
    }
    let Some(at) = graph.input.iter().position(|v| v.name == input) else {
        bail!("it has no input `{input}`");
    };
    if !free_first_dim(&mut graph.input[at], 4) {
        bail!("its input `{input}` does not declare a batch of 1");
    }
    for o in &mut graph.output {
        free_first_dim(o, 2);
    }
    graph.value_info.clear();
    let mut changed = 0;
    if reshapes {
        let shapes: Vec<&str> = graph
            .node
            .iter()
            .filter(|n| n.op_type == OpType::Reshape && !n.attribute.iter().any(|a| a.name == "allowzero" && a.i != 0))
            .filter_map(|n| n.input.get(1).copied())
            .collect();
        for t in graph.initializer.iter_mut().filter(|t| shapes.contains(&t.name())) {
            if let Some(f) = freed_shape(t) {
                *t = f;
                changed += 1;
            }
        }
        for n in graph.node.iter_mut().filter(|n| n.op_type == OpType::Constant) {
            if !n.output.first().is_some_and(|o| shapes.contains(o)) {
                continue;
            }
            for a in n.attribute.iter_mut().filter(|a| a.name == "value") {
                if let Some(f) = a.t.as_ref().and_then(freed_shape) {
                    a.t = Some(f);
                    changed += 1;
                }
            }
        }
    }
    model.metadata_props.retain(|p| p.key != "gpen_video.batch");
    model.metadata_props.push(StringStringEntry {
        key: "gpen_video.batch",
        value: "symbolic: a copy of a batch-1 file (gpen-video models add), checked against it",
    });
    Ok((onnx_rs::encode(&model), changed))
}

/// Four crops of `size` pixels, different from each other and full of detail (a fixed
/// pseudo-random sequence), as planar RGB24.
fn check_crops(size: usize) -> Vec<Vec<u8>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..CHECK_BATCH)
        .map(|_| {
            (0..3 * size * size)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 56) as u8
                })
                .collect()
        })
        .collect()
}

/// Every output value of one call, as bits (floats) or levels (bytes).
fn outputs_of(e: &mut Enhancer, crops: &[&[u8]]) -> Result<Vec<Vec<u32>>> {
    let mut out = vec![Vec::new(); crops.len()];
    e.run(crops, |i, r| {
        out[i] = match r {
            Restored::Floats(v) => v.iter().map(|f| f.to_bits()).collect(),
            Restored::Bytes(v) => v.iter().map(|&b| u32::from(b)).collect(),
        }
    })?;
    Ok(out)
}

/// A model on the CPU, as the pipeline loads it.
fn load(path: &Path, threads: usize, fidelity: f32) -> Result<Enhancer> {
    let session = crate::runtime::session(path, &SessionOptions::cpu(threads), "model")?;
    let mut e = Enhancer::for_target(session, &Target::Cpu(0))?;
    e.set_fidelity(fidelity);
    Ok(e)
}

/// Checks that `copy` run on [`CHECK_BATCH`] crops in one call gives, to the bit, what
/// `original` gives them one call each (on the CPU, at `fidelity` for a model with a weight).
pub fn check(original: &Path, copy: &Path, threads: usize, fidelity: f32) -> Result<()> {
    let mut one = load(original, threads, fidelity)?;
    let mut many = load(copy, threads, fidelity).context("the copy does not load")?;
    if many.info.fixed_batch.is_some() {
        bail!("the copy still declares a fixed batch");
    }
    many.set_batch(CHECK_BATCH);
    let crops = check_crops(one.info.size);
    let mut singles = Vec::new();
    for c in &crops {
        singles.extend(outputs_of(&mut one, &[c])?);
    }
    let refs: Vec<&[u8]> = crops.iter().map(Vec::as_slice).collect();
    let batched = outputs_of(&mut many, &refs).context("a batch of four fails to run")?;
    for (i, (a, b)) in singles.iter().zip(&batched).enumerate() {
        let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
        if differ > 0 || a.len() != b.len() {
            bail!(
                "crop {i} of a batch of {CHECK_BATCH} differs from its single call in {differ} of {} values",
                a.len()
            );
        }
    }
    Ok(())
}
