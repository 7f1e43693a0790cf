//! `models list` and `models verify`: in, the registry and model files; out, the table of known
//! models, a file's sha256, the registry entry it matches and its I/O contract read with ONNX
//! Runtime, or every present registry file (and every file of the user's own models, the weights
//! files they read included) checked against its sha256.

use std::fmt::{self, Write as _};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::weights::DataCheck;
use super::{registry, Batch, Entry, Kind};
use crate::faces::enhance::ModelInfo;

fn human_bytes(n: u64) -> String {
    match n {
        0 => "?".into(),
        n if n >= 1_000_000_000 => format!("{:.2} GB", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} kB", n as f64 / 1e3),
        n => format!("{n} B"),
    }
}

/// The `models list` table.
pub(crate) fn list_table() -> Result<String> {
    let known = super::known()?;
    let head = [
        "NAME", "KIND", "INPUT", "BATCH", "TEMPLATE", "SIZE", "SHA256", "SOURCE", "PRESENT",
    ];
    let rows: Vec<[String; 9]> = known
        .iter()
        .map(|e| {
            [
                e.name.clone(),
                format!("{:?}", e.kind).to_lowercase(),
                match e.kind {
                    Kind::Enhancer => format!("{0}x{0}", e.input_size),
                    Kind::Detector => "any/32".into(),
                    Kind::Mesh | Kind::Identity | Kind::Palm | Kind::Hand => format!("{0}x{0}", e.input_size),
                },
                match e.batch {
                    Batch::Fixed1 => "fixed 1".into(),
                    Batch::Dynamic => "dynamic".into(),
                },
                if e.template.is_empty() {
                    "-".into()
                } else {
                    e.template.clone()
                },
                human_bytes(e.bytes),
                if e.sha().is_some() { "on record" } else { "none" }.into(),
                match e.source {
                    super::Source::User => "yours".into(),
                    s => format!("{s:?}").to_lowercase(),
                },
                match e.local_path() {
                    Some(_) => "yes".into(),
                    None => "no".into(),
                },
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut out, &head);
    for r in &rows {
        line(&mut out, &r.each_ref().map(String::as_str));
    }
    out.push_str(
        "\nSIZE: published file size (? = unknown). SHA256: whether a checksum is on record. \
         SOURCE: download = `gpen-video models fetch NAME`; export = built here by models/gpen_export.py or models/gfpgan_export.py (the entry's make); \
         setup = made by scripts/setup.sh; yours = recorded by `gpen-video models add PATH --name NAME`.\n",
    );
    if let Ok(f) = super::user::file() {
        if known.iter().any(|e| e.source == super::Source::User) {
            let _ = writeln!(out, "Your models are listed in {}.", f.display());
        }
    }
    Ok(out)
}

/// sha256 of a file, as 64 lowercase hex digits.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// How a file's hash compares with the registry.
#[derive(Clone, Debug, PartialEq)]
pub enum Checksum {
    /// It is the file on record.
    Match,
    /// Same file name as an entry whose recorded hash differs.
    Mismatch { expected: String },
    /// Matches an entry by file name; that entry has no hash on record.
    NotOnRecord,
    /// Not a registry file.
    NoEntry,
}

/// What a model file's graph says.
#[derive(Clone, Debug)]
pub enum ModelFacts {
    Enhancer {
        info: ModelInfo,
        /// Other `gpen_video.*` metadata worth showing (model, template, precision).
        meta: Vec<(String, String)>,
    },
    Detector {
        input: String,
        shape: Vec<i64>,
        outputs: usize,
    },
    /// The face mesh's I/O checks out.
    Mesh,
    /// A face descriptor: [N,3,size,size] in, [N,dims] out.
    Identity { size: i64, dims: i64 },
    /// MediaPipe's palm detector or hand landmarks (`kind` says which); its I/O checks out.
    Hand { kind: Kind },
}

/// The result of `verify PATH`.
#[derive(Clone, Debug)]
pub struct FileReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub sha256: String,
    pub entry: Option<Entry>,
    pub checksum: Checksum,
    /// The files beside it that the entry records it reading its weights from, checked.
    pub data: Vec<DataCheck>,
    pub facts: ModelFacts,
}

impl FileReport {
    /// Whether the file, or a weights file it reads, is not what is on record.
    pub fn mismatch(&self) -> bool {
        matches!(self.checksum, Checksum::Mismatch { .. }) || self.data.iter().any(|d| !d.matches)
    }
}

/// Hashes `path`, matches it to the user's entries (by file) and the registry and checks its
/// I/O contract with ONNX Runtime. Errors when the file cannot be read, is not an ONNX model or
/// does not fit the contract of its kind; a checksum mismatch (the file's, or that of a weights
/// file its entry records) is reported in [`FileReport::checksum`] and [`FileReport::data`].
pub fn verify_path(path: &Path) -> Result<FileReport> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a file", path.display());
    }
    let sha256 = sha256_file(path)?;
    let reg = registry()?;
    let users = super::user::load()?;
    // One's own file (or the file a copy was made of) is checked against its own record.
    let same = |f: &str| !f.is_empty() && crate::output::same_file(Path::new(f), path);
    let mine = users.models.iter().find_map(|e| {
        if same(&e.file) {
            Some((e, e.sha()))
        } else if same(&e.origin) {
            Some((e, (!e.source_sha256.is_empty()).then_some(e.source_sha256.as_str())))
        } else {
            None
        }
    });
    let by_name = path.file_name().and_then(|n| reg.by_file(&n.to_string_lossy()));
    let (entry, checksum) = match (mine, reg.by_sha(&sha256), by_name) {
        (Some((e, Some(x))), _, _) if x == sha256 => (Some(e), Checksum::Match),
        (Some((e, Some(x))), _, _) => (
            Some(e),
            Checksum::Mismatch {
                expected: x.to_string(),
            },
        ),
        (Some((e, None)), _, _) => (Some(e), Checksum::NotOnRecord),
        (None, Some(e), _) => (Some(e), Checksum::Match),
        (None, None, Some(e)) => match e.sha() {
            Some(x) => (
                Some(e),
                Checksum::Mismatch {
                    expected: x.to_string(),
                },
            ),
            None => (Some(e), Checksum::NotOnRecord),
        },
        (None, None, None) => (None, Checksum::NoEntry),
    };
    let data = entry
        .filter(|e| e.source == super::Source::User && same(&e.file))
        .map_or_else(Vec::new, super::weights::check);
    let facts = read_facts(path, entry.map(|e| e.kind))?;
    Ok(FileReport {
        path: path.to_path_buf(),
        bytes: meta.len(),
        sha256,
        entry: entry.cloned(),
        checksum,
        data,
        facts,
    })
}

/// Opens `path` with ONNX Runtime on the CPU and checks the I/O contract of its kind (`kind`,
/// else guessed from the graph): GPEN's through [`ModelInfo::read`], as `--model` does, or
/// CenterFace's through the detector's own check, as `--detector` does. Errors name the file.
pub(crate) fn read_facts(path: &Path, kind: Option<Kind>) -> Result<ModelFacts> {
    let session = crate::runtime::cpu_session(path, 1, "model")?;
    let identity = match kind {
        Some(k) => k == Kind::Identity,
        None => session
            .metadata()
            .ok()
            .and_then(|m| m.custom("gpen_video.kind"))
            .is_some_and(|k| k == "face identity"),
    };
    if identity {
        return identity_facts(&session)
            .with_context(|| format!("{} does not fit a face descriptor's I/O", path.display()));
    }
    let hand = kind.filter(|k| matches!(k, Kind::Palm | Kind::Hand)).or_else(|| {
        let md = session.metadata().ok()?;
        match md.custom("gpen_video.kind")?.as_str() {
            "palm detector" => Some(Kind::Palm),
            "hand landmarks" => Some(Kind::Hand),
            _ => None,
        }
    });
    if let Some(kind) = hand {
        return hand_facts(&session, kind).with_context(|| {
            format!(
                "{} does not fit the {}'s I/O (models/hand_export.py writes it)",
                path.display(),
                if kind == Kind::Palm {
                    "palm detector"
                } else {
                    "hand landmark model"
                }
            )
        });
    }
    let mesh = match kind {
        Some(k) => k == Kind::Mesh,
        None => session
            .metadata()
            .ok()
            .and_then(|m| m.custom("gpen_video.kind"))
            .is_some_and(|k| k == "face mesh"),
    };
    if mesh {
        crate::faces::mesh::Mesher::new(session)
            .with_context(|| format!("{} does not fit the face mesh's I/O", path.display()))?;
        return Ok(ModelFacts::Mesh);
    }
    let detector = match kind {
        Some(k) => k == Kind::Detector,
        None => {
            let md = session.metadata().ok();
            md.and_then(|m| m.custom("gpen_video.detector")).is_some()
                || (session.inputs().len() == 1 && session.outputs().len() == 4)
        }
    };
    Ok(if detector {
        let inputs = session.inputs();
        let (input, shape) = match inputs.first().map(|i| (i.name().to_string(), i.dtype())) {
            Some((n, ort::value::ValueType::Tensor { shape, .. })) => (n, shape.iter().copied().collect()),
            _ => (String::new(), Vec::new()),
        };
        let outputs = session.outputs().len();
        let d = crate::faces::detect::DetectSettings::default();
        crate::faces::detect::Detector::new(session, (d.det_size, d.det_size), d.threshold, d.nms_iou, 0)
            .with_context(|| format!("{} does not fit the CenterFace detector's I/O", path.display()))?;
        ModelFacts::Detector { input, shape, outputs }
    } else {
        let info = ModelInfo::read(&session)
            .with_context(|| format!("{} does not fit GPEN's I/O contract", path.display()))?;
        let md = session.metadata().ok();
        let meta = ["model", "template", "precision", "parameters"]
            .iter()
            .filter_map(|k| {
                let v = md.as_ref()?.custom(&format!("gpen_video.{k}"))?;
                Some((k.to_string(), v))
            })
            .collect();
        ModelFacts::Enhancer { info, meta }
    })
}

/// The square input side of MediaPipe's palm detector and hand landmark model.
pub(crate) fn hand_model_side(kind: Kind) -> usize {
    if kind == Kind::Palm {
        192
    } else {
        224
    }
}

/// The I/O of MediaPipe's hand models as models/hand_export.py writes them: one input
/// [N,3,S,S] and these outputs, by name, of these shapes (-1: the free batch dimension).
fn hand_facts(session: &ort::session::Session, kind: Kind) -> Result<ModelFacts> {
    let side = hand_model_side(kind) as i64;
    let want: &[(&str, &[i64])] = if kind == Kind::Palm {
        &[
            ("boxes", &[-1, 2016, 18]),
            ("scores", &[-1, 2016, 1]),
            ("anchors", &[2016, 2]),
        ]
    } else {
        &[
            ("landmarks", &[-1, 63]),
            ("presence", &[-1, 1]),
            ("handedness", &[-1, 1]),
            ("world", &[-1, 63]),
        ]
    };
    let dims = |t: &ort::value::ValueType| -> Vec<i64> {
        match t {
            ort::value::ValueType::Tensor { shape, .. } => shape.iter().copied().collect(),
            _ => Vec::new(),
        }
    };
    let inputs = session.inputs();
    let i: Vec<i64> = inputs.first().map(|i| dims(i.dtype())).unwrap_or_default();
    if inputs.len() != 1 || i != [-1, 3, side, side] {
        bail!(
            "expected one input [N,3,{side},{side}], found {} input(s), the first {i:?}",
            inputs.len()
        );
    }
    let found: Vec<(String, Vec<i64>)> = session
        .outputs()
        .iter()
        .map(|o| (o.name().to_string(), dims(o.dtype())))
        .collect();
    let expected: Vec<(String, Vec<i64>)> = want.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect();
    if found != expected {
        bail!("expected the outputs {expected:?}, found {found:?}");
    }
    Ok(ModelFacts::Hand { kind })
}

/// A face descriptor's I/O: one input [N,3,S,S], one output [N,D].
fn identity_facts(session: &ort::session::Session) -> Result<ModelFacts> {
    let dims = |t: &ort::value::ValueType| match t {
        ort::value::ValueType::Tensor { shape, .. } => shape.iter().copied().collect(),
        _ => Vec::new(),
    };
    let (inputs, outputs) = (session.inputs(), session.outputs());
    if inputs.len() != 1 || outputs.len() != 1 {
        bail!(
            "expected one input and one output, found {} and {}",
            inputs.len(),
            outputs.len()
        );
    }
    let (i, o): (Vec<i64>, Vec<i64>) = (dims(inputs[0].dtype()), dims(outputs[0].dtype()));
    if i.len() != 4 || i[1] != 3 || i[2] <= 0 || i[2] != i[3] || o.len() != 2 || o[1] <= 0 {
        bail!("input {i:?} and output {o:?}, not [N,3,S,S] and [N,D]");
    }
    Ok(ModelFacts::Identity { size: i[2], dims: o[1] })
}

impl fmt::Display for FileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.path.display())?;
        writeln!(f, "  bytes      {}", self.bytes)?;
        writeln!(f, "  sha256     {}", self.sha256)?;
        let name = self.entry.as_ref().map_or("", |e| e.name.as_str());
        match &self.checksum {
            Checksum::Match => writeln!(f, "  registry   {name}: sha256 matches the one on record")?,
            Checksum::Mismatch { expected } => writeln!(
                f,
                "  registry   {name}: MISMATCH, {expected} on record ({})",
                if self.entry.as_ref().is_some_and(|e| e.source == super::Source::User) {
                    "changed since `gpen-video models add`"
                } else {
                    "not the published file, or damaged"
                }
            )?,
            Checksum::NotOnRecord => writeln!(f, "  registry   {name} (by file name): no checksum on record")?,
            Checksum::NoEntry => writeln!(f, "  registry   no entry (not a known model file)")?,
        }
        for d in &self.data {
            writeln!(f, "  weights    {}: {}", d.file, d.status)?;
        }
        if let Some(e) = &self.entry {
            if e.bytes != 0 && e.bytes != self.bytes {
                writeln!(
                    f,
                    "  warning    {} bytes on record for {}: this is a different file",
                    e.bytes, e.name
                )?;
            }
        }
        match &self.facts {
            ModelFacts::Enhancer { info, meta } => {
                writeln!(f, "  kind       enhancer (GPEN I/O contract: ok)")?;
                let n = info.fixed_batch.map_or("N".to_string(), |b| b.to_string());
                writeln!(f, "  input      `{}` float32 [{n},3,{1},{1}]", info.input, info.size)?;
                writeln!(f, "  output     `{}`", info.output)?;
                writeln!(f, "  size       {}", info.size)?;
                match info.fixed_batch {
                    Some(n) => writeln!(f, "  batch      fixed {n}")?,
                    None => writeln!(f, "  batch      dynamic")?,
                }
                match &info.weights_note {
                    Some(w) => writeln!(f, "  weights    {w}")?,
                    None => writeln!(f, "  weights    no gpen_video.weights note")?,
                }
                for (k, v) in meta {
                    writeln!(f, "  {k:<10} {v}")?;
                }
            }
            ModelFacts::Mesh => {
                writeln!(f, "  kind       face mesh (I/O: ok)")?;
                writeln!(
                    f,
                    "  input      float32 [N,3,{0},{0}], RGB in [0,1]",
                    crate::faces::mesh::SIZE
                )?;
                writeln!(f, "  outputs    468 points x (x, y, z); face-presence logit")?;
            }
            ModelFacts::Hand { kind: Kind::Palm } => {
                writeln!(f, "  kind       palm detector (I/O: ok)")?;
                writeln!(
                    f,
                    "  input      float32 [N,3,192,192], RGB in [0,1], the frame letterboxed"
                )?;
                writeln!(
                    f,
                    "  outputs    boxes [N,2016,18] and score logits [N,2016,1] per anchor; anchors [2016,2]"
                )?;
            }
            ModelFacts::Hand { .. } => {
                writeln!(f, "  kind       hand landmarks (I/O: ok)")?;
                writeln!(
                    f,
                    "  input      float32 [N,3,224,224], RGB in [0,1], a crop round one hand"
                )?;
                writeln!(
                    f,
                    "  outputs    21 points x (x, y, z); presence; handedness; 21 world points"
                )?;
            }
            ModelFacts::Identity { size, dims } => {
                writeln!(f, "  kind       face identity (I/O: ok)")?;
                writeln!(f, "  input      float32 [N,3,{size},{size}], RGB in [0,255]")?;
                writeln!(f, "  output     float32 [N,{dims}] descriptor")?;
            }
            ModelFacts::Detector { input, shape, outputs } => {
                let dims: Vec<String> = shape
                    .iter()
                    .map(|d| if *d < 0 { "?".into() } else { d.to_string() })
                    .collect();
                writeln!(f, "  kind       detector (CenterFace I/O: ok, {outputs} outputs)")?;
                writeln!(f, "  input      `{input}` [{}]", dims.join(","))?;
                let dynamic = shape.first().is_none_or(|d| *d < 0);
                writeln!(f, "  batch      {}", if dynamic { "dynamic" } else { "fixed" })?;
            }
        }
        Ok(())
    }
}

/// `verify` without a path: every registry file present under models/, and every file of the
/// user's own models (the weights files they read included). A mismatch ends in an error that
/// says, for each model, how to mend it where it came from.
pub(super) fn verify_all() -> Result<()> {
    let known = super::known()?;
    let (mut seen, mut bad) = (0, Vec::new());
    for e in &known {
        let Some(p) = e.local_path() else { continue };
        seen += 1;
        let sha = sha256_file(&p)?;
        let bytes = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        let mut matches = true;
        let status = match e.sha() {
            Some(x) if x == sha => "ok: sha256 matches".to_string(),
            Some(x) => {
                matches = false;
                format!("MISMATCH: sha256 {sha}, {x} on record")
            }
            None => format!("no checksum on record (sha256 {sha})"),
        };
        let size = if e.bytes != 0 && e.bytes != bytes {
            format!("; {bytes} bytes, {} on record", e.bytes)
        } else {
            String::new()
        };
        crate::console::print_text(&format!("{:<26} {}  {status}{size}\n", e.name, p.display()));
        for d in super::weights::check(e) {
            matches &= d.matches;
            crate::console::print_text(&format!("{:<26} {}  {}\n", e.name, d.file, d.status));
        }
        if !matches {
            bad.push(format!("{} ({}): {}", e.name, p.display(), e.mend()));
        }
    }
    if seen == 0 {
        crate::console::print_text(
            "no registry model found under models/ (`gpen-video models list` shows what is known)\n",
        );
    }
    if !bad.is_empty() {
        bail!(
            "{} model(s) do not match what is on record:\n  {}",
            bad.len(),
            bad.join("\n  ")
        );
    }
    Ok(())
}
