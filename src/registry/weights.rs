//! Weights beside a graph: in, an ONNX model whose tensors may keep their data in other files
//! (ONNX external data: each tensor names a `location` relative to the model's folder); out, the
//! files it reads, refused when a location leaves the model's folder (as ONNX Runtime refuses
//! it), recorded with their checksums in a user entry, and checked against that record.

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use onnx_rs::ast::{Attribute, DataLocation, Graph, Model, Node, SparseTensor, TensorProto};
use serde::{Deserialize, Serialize};

use super::{sha256_file, Entry};

/// A file a model reads its weights from, as its entry records it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DataFile {
    /// Its absolute path.
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
}

/// How a recorded weights file compares with its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataCheck {
    pub file: String,
    /// Whether it is the file on record.
    pub matches: bool,
    /// What was found, for a report line.
    pub status: String,
}

/// The external data tensors in `m`: (tensor name, location; empty when it names none).
fn external<'a>(m: &Model<'a>) -> Vec<(&'a str, &'a str)> {
    fn tensor<'a>(t: &TensorProto<'a>, out: &mut Vec<(&'a str, &'a str)>) {
        let location = t.external_data().iter().find(|e| e.key == "location").map(|e| e.value);
        if t.data_location() == DataLocation::External || location.is_some() {
            out.push((t.name(), location.unwrap_or("")));
        }
    }
    fn sparse<'a>(s: &SparseTensor<'a>, out: &mut Vec<(&'a str, &'a str)>) {
        for t in s.values.iter().chain(&s.indices) {
            tensor(t, out);
        }
    }
    fn attributes<'a>(attrs: &[Attribute<'a>], out: &mut Vec<(&'a str, &'a str)>) {
        for a in attrs {
            for t in a.t.iter().chain(&a.tensors) {
                tensor(t, out);
            }
            for s in a.sparse_tensor.iter().chain(&a.sparse_tensors) {
                sparse(s, out);
            }
            for g in a.g.iter().map(|g| &**g).chain(&a.graphs) {
                graph(g, out);
            }
        }
    }
    fn nodes<'a>(ns: &[Node<'a>], out: &mut Vec<(&'a str, &'a str)>) {
        for n in ns {
            attributes(&n.attribute, out);
        }
    }
    fn graph<'a>(g: &Graph<'a>, out: &mut Vec<(&'a str, &'a str)>) {
        for t in &g.initializer {
            tensor(t, out);
        }
        for s in &g.sparse_initializer {
            sparse(s, out);
        }
        nodes(&g.node, out);
    }
    let mut out = Vec::new();
    if let Some(g) = &m.graph {
        graph(g, &mut out);
    }
    for f in &m.functions {
        attributes(&f.attribute_proto, &mut out);
        nodes(&f.node, &mut out);
    }
    for t in &m.training_info {
        for g in t.initialization.iter().chain(&t.algorithm) {
            graph(g, &mut out);
        }
    }
    out
}

/// The files beside `model` (an absolute path) that its graph `m` reads its weights from, each
/// once, in the order the graph names them. A location that is absolute, climbs out of the
/// model's folder or leads out of it through a link is refused, and so is a missing file.
pub(crate) fn files(model: &Path, m: &Model<'_>) -> Result<Vec<PathBuf>> {
    let dir = model.parent().unwrap_or(Path::new("/"));
    let real_dir = dir
        .canonicalize()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    let mut found: Vec<PathBuf> = Vec::new();
    for (tensor, location) in external(m) {
        if location.is_empty() {
            bail!(
                "{}: tensor `{tensor}` keeps its data in another file but names none: the file is damaged; save the model again",
                model.display()
            );
        }
        let rel = Path::new(location);
        let inside = rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        let path = dir.join(rel);
        let real = path.canonicalize();
        if !inside || real.as_ref().is_ok_and(|r| !r.starts_with(&real_dir)) {
            bail!(
                "{}: tensor `{tensor}` reads its weights from `{location}`, outside the model's folder {}: only files in that folder (or below it) are read; keep the weights beside the model",
                model.display(),
                dir.display()
            );
        }
        if !real.is_ok_and(|r| r.is_file()) {
            bail!(
                "{}: tensor `{tensor}` reads its weights from {}, which is missing or not a file: put it back beside the model",
                model.display(),
                path.display()
            );
        }
        if !found.contains(&path) {
            found.push(path);
        }
    }
    Ok(found)
}

/// The record of each file: its path, sha256 and size.
pub(crate) fn record(files: &[PathBuf]) -> Result<Vec<DataFile>> {
    files
        .iter()
        .map(|p| {
            Ok(DataFile {
                file: p.display().to_string(),
                sha256: sha256_file(p)?,
                bytes: std::fs::metadata(p)
                    .with_context(|| format!("cannot read {}", p.display()))?
                    .len(),
            })
        })
        .collect()
}

/// Each weights file `e` records, checked against its sha256 and size.
pub(crate) fn check(e: &Entry) -> Vec<DataCheck> {
    e.data
        .iter()
        .map(|d| {
            let path = Path::new(&d.file);
            let (matches, status) = match sha256_file(path) {
                Err(why) => (false, format!("MISSING: {why:#}")),
                Ok(sha) if sha == d.sha256 => (true, "ok: sha256 matches".to_string()),
                Ok(sha) => {
                    let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
                    let size = if bytes == d.bytes {
                        String::new()
                    } else {
                        format!("; {bytes} bytes, {} on record", d.bytes)
                    };
                    (false, format!("MISMATCH: sha256 {sha}, {} on record{size}", d.sha256))
                }
            };
            DataCheck {
                file: d.file.clone(),
                matches,
                status,
            }
        })
        .collect()
}
