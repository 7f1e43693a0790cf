//! `gpen-video models add PATH --name N` and `models remove N`: in, a user's own enhancer file
//! and the name to know it by; out, an entry in the user registry (its checksum, its I/O contract
//! read once with ONNX Runtime, its template, its batch, the checksum of each file beside it its
//! graph reads weights from) and, for a file that fixes its batch at 1, a checked copy whose
//! batch is symbolic (see `rebatch`). The user's file is only read; the list changes under its
//! lock (see `user::update`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{rebatch, registry, sha256_file, user, weights, Batch, Entry, Kind, Source};
use crate::faces::align::Template;
use crate::faces::enhance::{Enhancer, ModelInfo, DEFAULT_FIDELITY};
use crate::runtime::{SessionOptions, Target};

/// What `models add` was asked.
#[derive(Clone, Debug)]
pub(super) struct AddArgs {
    pub(crate) path: PathBuf,
    pub(crate) name: String,
    /// The alignment template, when neither the file nor the registry's entry of that name
    /// gives the right one.
    pub(crate) template: Option<Template>,
    /// Record the file as it is, even when its batch is fixed at 1.
    pub(crate) keep_batch: bool,
    /// ONNX Runtime threads for the check.
    pub(crate) threads: usize,
}

/// The I/O contract of `path`, read as `--model` reads it.
fn contract(path: &Path) -> Result<ModelInfo> {
    let session = crate::runtime::session(path, &SessionOptions::cpu(1), "model")?;
    let e = Enhancer::for_target(session, &Target::Cpu(0), crate::config::cpu_level()?)
        .with_context(|| format!("{} does not fit a face restorer's I/O contract", path.display()))?;
    Ok(e.info)
}

/// The copy of a batch-1 file with a symbolic batch, written under the data folder and checked;
/// `Err` says why the file keeps batch 1 (and leaves no copy behind).
fn batched_copy(a: &AddArgs, original: &Path, info: &ModelInfo, fidelity: f32) -> Result<PathBuf> {
    let dir = user::data_dir()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let copy = dir.join(format!("{}.onnx", a.name.to_ascii_lowercase()));
    if copy == original {
        bail!("{} is already the copy", original.display());
    }
    let bytes = std::fs::read(original).with_context(|| format!("cannot read {}", original.display()))?;
    let mut why = Vec::new();
    for reshapes in [false, true] {
        let (rewritten, changed) = match rebatch::symbolic(&bytes, &info.input, reshapes) {
            Ok(r) => r,
            Err(e) => bail!("{e:#}"),
        };
        if reshapes && changed == 0 {
            break;
        }
        crate::output::write_atomic(&copy, &rewritten)?;
        match rebatch::check(original, &copy, a.threads, fidelity) {
            Ok(()) => return Ok(copy),
            Err(e) => why.push(format!("{e:#}").split_whitespace().collect::<Vec<_>>().join(" ")),
        }
    }
    let _ = std::fs::remove_file(&copy);
    bail!(
        "its graph ties the batch to 1 ({})",
        why.join("; with its reshapes freed: ")
    )
}

/// Records `a.path` under `a.name` in the user registry; returns the entry and what was done.
pub(super) fn add(a: &AddArgs) -> Result<(Entry, String)> {
    let n = &a.name;
    if !super::name_ok(n) {
        bail!(
            "--name `{n}`: a model's name holds {} (it follows --model on command lines and names a file)",
            super::NAME_RULE
        );
    }
    let original = a
        .path
        .canonicalize()
        .with_context(|| format!("cannot read {}", a.path.display()))?;
    if !original.is_file() {
        bail!("{} is not a file", a.path.display());
    }
    let data = data_files(&original)?;
    let info = contract(&original)?;
    let base = registry()?.find(&a.name).cloned();
    if let Some(b) = &base {
        if b.kind != Kind::Enhancer {
            bail!("`{}` is the registry's {:?} model: choose another name", b.name, b.kind);
        }
        if b.input_size != info.size {
            bail!(
                "{} takes {}-pixel crops, but the registry's {} takes {}: choose another name",
                a.path.display(),
                info.size,
                b.name,
                b.input_size
            );
        }
    }
    let template = a
        .template
        .or(info.template_in_file.then_some(info.template))
        .or(base.as_ref().and_then(Entry::template))
        .unwrap_or_default();
    let fidelity = info
        .weight
        .as_ref()
        .map(|_| base.as_ref().and_then(|b| b.fidelity).unwrap_or(DEFAULT_FIDELITY));
    let mut said = String::new();
    let mut entry = Entry {
        name: base.as_ref().map_or(a.name.clone(), |b| b.name.clone()),
        kind: Kind::Enhancer,
        file: original.display().to_string(),
        source: Source::User,
        url: String::new(),
        sha256: sha256_file(&original)?,
        bytes: std::fs::metadata(&original)?.len(),
        input_size: info.size,
        batch: if info.fixed_batch.is_some() {
            Batch::Fixed1
        } else {
            Batch::Dynamic
        },
        template: template.name().to_string(),
        normalisation: if info.bytes {
            "uint8 levels, RGB NCHW"
        } else {
            "[-1,1] RGB NCHW"
        }
        .into(),
        make: String::new(),
        notes: String::new(),
        checkpoint_url: String::new(),
        source_sha256: String::new(),
        source_bytes: 0,
        fidelity,
        blend: base.as_ref().and_then(|b| b.blend),
        licence: base.as_ref().map_or(String::new(), |b| b.licence.clone()),
        origin: String::new(),
        data: weights::record(&data)?,
    };
    if !data.is_empty() {
        let names: Vec<String> = data.iter().map(|p| p.display().to_string()).collect();
        let _ = writeln!(
            said,
            "its weights are read from {} too: recorded with their sha256",
            names.join(", ")
        );
    }
    batch_of(a, &original, &info, &mut entry, &mut said)?;
    let (was, file) = user::update(|reg| {
        let old = reg.models.iter().position(|e| e.name.eq_ignore_ascii_case(&entry.name));
        let was = old.map(|i| reg.models.remove(i));
        reg.models.push(entry.clone());
        Ok(was)
    })?;
    if let Some(was) = was {
        remove_copy(&was, Some(&entry.file));
        let _ = writeln!(said, "replaced your earlier {}", was.name);
    }
    let _ = writeln!(
        said,
        "recorded {} in {}: {}x{} crops, template {}, batch {}{}; use it with --model {}",
        entry.name,
        file.display(),
        entry.input_size,
        entry.input_size,
        entry.template,
        if entry.batch == Batch::Dynamic {
            "symbolic"
        } else {
            "fixed at 1"
        },
        entry
            .fidelity
            .map_or(String::new(), |f| format!(", fidelity input (default {f})")),
        entry.name
    );
    Ok((entry, said))
}

/// Removes a copy this tool made for `e` (never a user's own file), unless it is `keep`.
fn remove_copy(e: &Entry, keep: Option<&str>) {
    let ours = user::data_dir().is_ok_and(|d| Path::new(&e.file).starts_with(d));
    if !e.origin.is_empty() && ours && keep != Some(e.file.as_str()) {
        let _ = std::fs::remove_file(&e.file);
    }
}

/// Forgets the user's model `name` (and deletes the copy this tool made of it, if any; the
/// user's own file is left alone).
pub(super) fn remove(name: &str) -> Result<String> {
    let (e, file) = user::update(|reg| {
        let Some(i) = reg.models.iter().position(|e| e.name.eq_ignore_ascii_case(name)) else {
            let names: Vec<&str> = reg.models.iter().map(|e| e.name.as_str()).collect();
            bail!(
                "no model of yours is called `{name}` (yours: {})",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            );
        };
        Ok(reg.models.remove(i))
    })?;
    remove_copy(&e, None);
    Ok(format!("removed {} from {}\n", e.name, file.display()))
}

/// The files beside `original` its graph reads its weights from (see [`weights::files`]). A
/// file this cannot parse is left to ONNX Runtime to refuse; one it reads is refused too, as its
/// checksum could not cover the files it reads.
fn data_files(original: &Path) -> Result<Vec<PathBuf>> {
    let bytes = std::fs::read(original).with_context(|| format!("cannot read {}", original.display()))?;
    match onnx_rs::parse(&bytes) {
        Ok(m) => weights::files(original, &m),
        Err(why) => {
            contract(original)?;
            bail!(
                "{}: cannot tell which files its graph reads ({why}), so its checksum could not cover them: save it again with the onnx package (onnx.save) and add that file",
                original.display()
            )
        }
    }
}

/// Makes `entry` the checked copy with a symbolic batch of a file whose batch is fixed at 1
/// (unless `--keep-batch`), or says why it stays at 1.
fn batch_of(a: &AddArgs, original: &Path, info: &ModelInfo, entry: &mut Entry, said: &mut String) -> Result<()> {
    let fidelity = entry.fidelity;
    match info.fixed_batch {
        Some(1) if !a.keep_batch => {
            let w = fidelity.unwrap_or(DEFAULT_FIDELITY);
            match batched_copy(a, original, info, w) {
                Ok(copy) => {
                    let _ = writeln!(
                        said,
                        "its batch is fixed at 1: wrote {} with a symbolic batch (checked to the bit: its single calls give the file's results, and a batch of {} what {} single calls give)",
                        copy.display(),
                        rebatch::CHECK_BATCH,
                        rebatch::CHECK_BATCH
                    );
                    entry.origin = std::mem::replace(&mut entry.file, copy.display().to_string());
                    entry.source_sha256 = std::mem::take(&mut entry.sha256);
                    entry.source_bytes = entry.bytes;
                    entry.sha256 = sha256_file(&copy)?;
                    entry.bytes = std::fs::metadata(&copy)?.len();
                    entry.batch = Batch::Dynamic;
                    entry.notes = format!("a copy of {} with a symbolic batch", entry.origin);
                }
                Err(why) => {
                    let _ = writeln!(said, "its batch stays at 1: {why:#}");
                    entry.notes = format!("batch fixed at 1: {why:#}");
                }
            }
        }
        Some(1) => {
            let _ = writeln!(said, "its batch stays at 1 (--keep-batch)");
        }
        _ => {}
    }
    Ok(())
}
