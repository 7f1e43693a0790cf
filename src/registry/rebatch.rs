//! A batch-1 model made to take batches: in, an ONNX file whose declared image input and outputs
//! fix the batch at 1; out, the bytes of a copy whose batch dimension is a symbol, and the check
//! that the copy computes what the file computes and that, given four crops in one call, it gives
//! to the bit what it gives them one by one. Many published restorers declare batch 1 although nothing in their graph depends on it;
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
pub(crate) const SYMBOL: &str = "N";

/// Crops the check runs in one call against as many single calls.
pub(crate) const CHECK_BATCH: usize = 4;

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
pub(crate) fn symbolic(onnx: &[u8], input: &str, reshapes: bool) -> Result<(Vec<u8>, usize)> {
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

/// A model on the CPU, as the pipeline loads it (`portable`: without the layout optimizations,
/// see `runtime::session_portable`).
fn load(path: &Path, threads: usize, fidelity: f32, portable: bool) -> Result<Enhancer> {
    let o = SessionOptions::cpu(threads);
    let session = if portable {
        crate::runtime::session_portable(path, &o, "model")?
    } else {
        crate::runtime::session(path, &o, "model")?
    };
    let mut e = Enhancer::for_target(session, &Target::Cpu(0), crate::config::cpu_level()?)?;
    e.set_fidelity(fidelity);
    Ok(e)
}

/// Where two lists of outputs differ: `Err` names the first crop that does and by how much.
fn same(a: &[Vec<u32>], b: &[Vec<u32>], what: &str) -> Result<()> {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let differ = x.iter().zip(y).filter(|(p, q)| p != q).count();
        if differ > 0 || x.len() != y.len() {
            bail!("crop {i} {what} in {differ} of {} values", x.len());
        }
    }
    Ok(())
}

/// Checks `copy` against `original` (on the CPU, at `fidelity` for a model with a weight), to
/// the bit, on [`CHECK_BATCH`] crops: the copy's single calls give what the file's give (both
/// without the layout optimizations, which pick other kernels for a file's fixed shapes than for
/// a symbolic batch), and the copy's one call on all of them gives what its single calls give
/// (as the pipeline runs it).
pub(crate) fn check(original: &Path, copy: &Path, threads: usize, fidelity: f32) -> Result<()> {
    let mut file = load(original, threads, fidelity, true)?;
    let crops = check_crops(file.info.size);
    let singles = |e: &mut Enhancer| -> Result<Vec<Vec<u32>>> {
        let mut all = Vec::new();
        for c in &crops {
            all.extend(outputs_of(e, &[c])?);
        }
        Ok(all)
    };
    let want = singles(&mut file)?;
    let mut same_kernels = load(copy, threads, fidelity, true).context("the copy does not load")?;
    same(
        &want,
        &singles(&mut same_kernels)?,
        "of the copy differs from the file's",
    )?;
    let mut many = load(copy, threads, fidelity, false)?;
    if many.info.fixed_batch.is_some() {
        bail!("the copy still declares a fixed batch");
    }
    let one_by_one = singles(&mut many)?;
    many.set_batch(CHECK_BATCH);
    let refs: Vec<&[u8]> = crops.iter().map(Vec::as_slice).collect();
    let batched = outputs_of(&mut many, &refs).context("a batch of four fails to run")?;
    same(
        &one_by_one,
        &batched,
        &format!("of a batch of {CHECK_BATCH} differs from its single call"),
    )
}
