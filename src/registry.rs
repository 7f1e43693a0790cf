//! Model registry: in, the embedded models/models.toml, the files under models/ and a model name
//! or path; out, a table of known models, checksum and I/O-contract reports, downloads that
//! appear under their final name only when complete and verified, and `--model NAME` resolved
//! to a file.
//!
//! `gpen-video models list | verify [PATH] | fetch NAME [--to DIR] [--url URL]` is [`run`] on a
//! [`ModelsCmd`]. A download streams to `DIR/.FILE.part-PID` and is renamed to `DIR/FILE` once
//! its sha256 (when on record) matches; any failure removes the partial file.
//! `GPEN_VIDEO_MODEL_URL_BASE=BASE` makes `fetch NAME` get `BASE/FILE` instead of the entry's
//! URL (a mirror; tests point it at 127.0.0.1).

use std::fmt::{self, Write as _};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::enhance::ModelInfo;
use crate::plan::find_asset;

/// The registry as shipped: compiled into the binary so it works from any folder.
pub const EMBEDDED: &str = include_str!("../models/models.toml");

/// Environment variable naming a mirror: `fetch NAME` downloads `BASE/FILE`.
pub const URL_BASE_ENV: &str = "GPEN_VIDEO_MODEL_URL_BASE";

/// What a model does in the pipeline.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// GPEN-BFR: float32 [N,3,S,S] in, same out.
    Enhancer,
    /// CenterFace: [N,3,H,W] in, four maps out.
    Detector,
}

/// Whether the batch dimension is fixed in the graph.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum Batch {
    #[serde(rename = "fixed-1")]
    Fixed1,
    #[serde(rename = "dynamic")]
    Dynamic,
}

/// Where a model file comes from.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Published at `url`.
    Download,
    /// Built locally by models/gpen_export.py (`make`).
    Export,
    /// Made by scripts/setup.sh (`make`).
    Setup,
}

/// One `[[model]]` of models.toml; the file's header documents every field.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub file: String,
    pub source: Source,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub sha256: String,
    /// File size in bytes; 0 when unknown.
    #[serde(default)]
    pub bytes: u64,
    /// Square crop side of an enhancer; 0 for a detector.
    #[serde(default)]
    pub input_size: usize,
    pub batch: Batch,
    #[serde(default)]
    pub template: String,
    pub normalisation: String,
    #[serde(default)]
    pub make: String,
    #[serde(default)]
    pub notes: String,
    #[serde(default)]
    pub checkpoint_url: String,
    #[serde(default)]
    pub source_sha256: String,
    #[serde(default)]
    pub source_bytes: u64,
}

impl Entry {
    /// The sha256 on record, if any.
    pub fn sha(&self) -> Option<&str> {
        (!self.sha256.is_empty()).then_some(self.sha256.as_str())
    }

    /// `models/FILE`, as the set-up lays it out.
    pub fn rel_path(&self) -> String {
        format!("models/{}", self.file)
    }

    /// The file under models/ if present (working directory first, then the checkout the
    /// executable was built in, as [`find_asset`] searches).
    pub fn local_path(&self) -> Option<PathBuf> {
        find_asset(&self.rel_path()).filter(|p| p.is_file())
    }

    /// What to do to get this model onto this machine.
    pub fn how_to_get(&self) -> String {
        match self.source {
            Source::Download => format!("run `gpen-video models fetch {}`", self.name),
            Source::Export => format!("build it with `{}`", self.make),
            Source::Setup => format!("make it with {}", self.make),
        }
    }
}

/// Every known model, in file order.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    #[serde(rename = "model")]
    pub models: Vec<Entry>,
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Registry {
    /// Parses and checks a registry text.
    pub fn parse(text: &str) -> Result<Self> {
        let reg: Registry = toml::from_str(text).context("models.toml does not parse")?;
        reg.check()?;
        Ok(reg)
    }

    /// The rules every entry follows (names and files unique, hashes well formed, a way to get
    /// each file, the facts an enhancer needs).
    pub fn check(&self) -> Result<()> {
        let mut names = std::collections::HashSet::new();
        let mut files = std::collections::HashSet::new();
        for e in &self.models {
            let n = &e.name;
            if n.is_empty() || n.chars().any(|c| c.is_whitespace() || c == '/') {
                bail!("model name `{n}` is empty or has spaces or slashes");
            }
            if !names.insert(n.to_ascii_lowercase()) {
                bail!("model name `{n}` appears twice (names are case-insensitive)");
            }
            if e.file.is_empty() || e.file.contains('/') || !e.file.ends_with(".onnx") {
                bail!("{n}: file `{}` must be a plain *.onnx file name", e.file);
            }
            if !files.insert(e.file.to_ascii_lowercase()) {
                bail!("{n}: file `{}` is used by another entry", e.file);
            }
            for (what, h) in [("sha256", &e.sha256), ("source_sha256", &e.source_sha256)] {
                if !h.is_empty() && !is_sha256(h) {
                    bail!("{n}: {what} `{h}` is not 64 lowercase hex digits");
                }
            }
            for u in [&e.url, &e.checkpoint_url] {
                if !(u.is_empty() || u.starts_with("https://") || u.starts_with("http://")) {
                    bail!("{n}: `{u}` is not an http(s) URL");
                }
            }
            match e.source {
                Source::Download if e.url.is_empty() => bail!("{n}: source \"download\" needs a url"),
                Source::Export | Source::Setup if e.make.is_empty() => {
                    bail!("{n}: a locally made file needs `make` (the command that builds it)")
                }
                Source::Export | Source::Setup if !e.url.is_empty() => {
                    bail!("{n}: a locally made file has no url")
                }
                _ => {}
            }
            if e.normalisation.is_empty() {
                bail!("{n}: normalisation is empty");
            }
            match e.kind {
                Kind::Enhancer => {
                    if e.input_size == 0 || e.template.is_empty() {
                        bail!("{n}: an enhancer needs input_size and template");
                    }
                    if !matches!(e.template.as_str(), "ffhq" | "arcface_128") {
                        bail!("{n}: unknown template `{}` (ffhq or arcface_128)", e.template);
                    }
                }
                Kind::Detector => {
                    if e.input_size != 0 || !e.template.is_empty() {
                        bail!("{n}: a detector has no input_size or template");
                    }
                }
            }
        }
        Ok(())
    }

    /// The entry called `name` (case-insensitive).
    pub fn find(&self, name: &str) -> Option<&Entry> {
        self.models.iter().find(|e| e.name.eq_ignore_ascii_case(name))
    }

    /// The entry whose file has this sha256 on record.
    pub fn by_sha(&self, sha: &str) -> Option<&Entry> {
        self.models.iter().find(|e| e.sha() == Some(sha))
    }

    /// The entry whose file name is `file` (case-insensitive).
    pub fn by_file(&self, file: &str) -> Option<&Entry> {
        self.models.iter().find(|e| e.file.eq_ignore_ascii_case(file))
    }

    /// The names, for error messages.
    pub fn names(&self) -> String {
        self.models
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The embedded registry, parsed once.
pub fn registry() -> Result<&'static Registry> {
    static REG: OnceLock<Result<Registry, String>> = OnceLock::new();
    REG.get_or_init(|| Registry::parse(EMBEDDED).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("embedded model registry: {e}"))
}

/// Resolves `--model ARG`: a registry name gives its file under models/ (an error says how to
/// get it when absent); anything else is a path.
pub fn resolve_model(arg: &str) -> Result<PathBuf> {
    let path = PathBuf::from(arg);
    let looks_like_path = arg.contains(std::path::MAIN_SEPARATOR) || arg.contains('/') || arg.ends_with(".onnx");
    if looks_like_path || path.is_file() {
        return Ok(path);
    }
    let reg = registry()?;
    match reg.find(arg) {
        Some(e) => e.local_path().ok_or_else(|| match e.source {
            Source::Download => anyhow!(
                "model {} is not downloaded: run `gpen-video models fetch {}`",
                e.name,
                e.name
            ),
            _ => anyhow!("model {} is not in models/: {}", e.name, e.how_to_get()),
        }),
        None if path.exists() => Ok(path),
        None => bail!(
            "model `{arg}` is neither a file nor a known model name; known names: {} (`gpen-video models list`)",
            reg.names()
        ),
    }
}

/// The `gpen-video models` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum ModelsCmd {
    /// Show every known model: kind, input size, batch, template, file size, whether a
    /// checksum is on record and whether the file is present under models/.
    List,
    /// Check model files. Without PATH: every registry file present under models/ against its
    /// sha256. With PATH: its sha256, the registry entry it matches, and its I/O contract read
    /// with ONNX Runtime (input, size, batch fixed or dynamic, weights note).
    Verify {
        /// An ONNX file to check.
        path: Option<PathBuf>,
    },
    /// Download a model into models/ (or DIR), checking its sha256 when on record. Models
    /// built locally (exports) say how to build them instead. GPEN_VIDEO_MODEL_URL_BASE=BASE
    /// downloads BASE/FILE instead of the published URL.
    Fetch {
        /// Registry name (see `gpen-video models list`).
        name: String,
        /// Folder to put the file in (default: models/).
        #[arg(long, value_name = "DIR")]
        to: Option<PathBuf>,
        /// Download from this URL instead of the registry's.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
}

/// Runs a `gpen-video models` subcommand; report on stdout, progress on stderr.
pub fn run(cmd: ModelsCmd) -> Result<()> {
    match cmd {
        ModelsCmd::List => {
            print!("{}", list_table()?);
            Ok(())
        }
        ModelsCmd::Verify { path: Some(p) } => {
            let report = verify_path(&p)?;
            print!("{report}");
            if let Checksum::Mismatch { expected } = &report.checksum {
                bail!(
                    "{}: sha256 {} differs from {expected} on record for {}",
                    p.display(),
                    report.sha256,
                    report.entry.as_ref().map_or("?", |e| e.name.as_str())
                );
            }
            Ok(())
        }
        ModelsCmd::Verify { path: None } => verify_all(),
        ModelsCmd::Fetch { name, to, url } => {
            let progress = std::io::stderr().is_terminal();
            let path = fetch(&name, to.as_deref(), url.as_deref(), progress)?;
            println!("{}", path.display());
            Ok(())
        }
    }
}

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
pub fn list_table() -> Result<String> {
    let reg = registry()?;
    let head = [
        "NAME", "KIND", "INPUT", "BATCH", "TEMPLATE", "SIZE", "SHA256", "SOURCE", "PRESENT",
    ];
    let rows: Vec<[String; 9]> = reg
        .models
        .iter()
        .map(|e| {
            [
                e.name.clone(),
                format!("{:?}", e.kind).to_lowercase(),
                match e.kind {
                    Kind::Enhancer => format!("{0}x{0}", e.input_size),
                    Kind::Detector => "any/32".into(),
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
                format!("{:?}", e.source).to_lowercase(),
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
         SOURCE: download = `gpen-video models fetch NAME`; export = built by models/gpen_export.py; \
         setup = made by scripts/setup.sh.\n",
    );
    Ok(out)
}

/// sha256 of a file, as 64 lowercase hex digits.
pub fn sha256_file(path: &Path) -> Result<String> {
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
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
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
}

/// The result of `verify PATH`.
#[derive(Clone, Debug)]
pub struct FileReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub sha256: String,
    pub entry: Option<Entry>,
    pub checksum: Checksum,
    pub facts: ModelFacts,
}

/// Hashes `path`, matches it to the registry and checks its I/O contract with ONNX Runtime.
/// Errors when the file cannot be read, is not an ONNX model or does not fit the contract of
/// its kind; a checksum mismatch is reported in [`FileReport::checksum`].
pub fn verify_path(path: &Path) -> Result<FileReport> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a file", path.display());
    }
    let sha256 = sha256_file(path)?;
    let reg = registry()?;
    let by_name = path.file_name().and_then(|n| reg.by_file(&n.to_string_lossy()));
    let (entry, checksum) = match (reg.by_sha(&sha256), by_name) {
        (Some(e), _) => (Some(e), Checksum::Match),
        (None, Some(e)) => match e.sha() {
            Some(x) => (
                Some(e),
                Checksum::Mismatch {
                    expected: x.to_string(),
                },
            ),
            None => (Some(e), Checksum::NotOnRecord),
        },
        (None, None) => (None, Checksum::NoEntry),
    };
    let session = crate::runtime::cpu_session(path, 1, "model")?;
    let detector = match entry {
        Some(e) => e.kind == Kind::Detector,
        None => {
            let md = session.metadata().ok();
            md.and_then(|m| m.custom("gpen_video.detector")).is_some()
                || (session.inputs().len() == 1 && session.outputs().len() == 4)
        }
    };
    let facts = if detector {
        let inputs = session.inputs();
        let (input, shape) = match inputs.first().map(|i| (i.name().to_string(), i.dtype())) {
            Some((n, ort::value::ValueType::Tensor { shape, .. })) => (n, shape.iter().copied().collect()),
            _ => (String::new(), Vec::new()),
        };
        let outputs = session.outputs().len();
        crate::detect::Detector::new(session, (640, 640), 0.5, 0.3)
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
    };
    Ok(FileReport {
        path: path.to_path_buf(),
        bytes: meta.len(),
        sha256,
        entry: entry.cloned(),
        checksum,
        facts,
    })
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
                "  registry   {name}: MISMATCH, {expected} on record (not the published file, or damaged)"
            )?,
            Checksum::NotOnRecord => writeln!(f, "  registry   {name} (by file name): no checksum on record")?,
            Checksum::NoEntry => writeln!(f, "  registry   no entry (not a known model file)")?,
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

/// `verify` without a path: every registry file present under models/.
fn verify_all() -> Result<()> {
    let reg = registry()?;
    let (mut seen, mut bad) = (0, Vec::new());
    for e in &reg.models {
        let Some(p) = e.local_path() else { continue };
        seen += 1;
        let sha = sha256_file(&p)?;
        let bytes = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        let status = match e.sha() {
            Some(x) if x == sha => "ok: sha256 matches".to_string(),
            Some(x) => {
                bad.push(e.name.clone());
                format!("MISMATCH: sha256 {sha}, {x} on record")
            }
            None => format!("no checksum on record (sha256 {sha})"),
        };
        let size = if e.bytes != 0 && e.bytes != bytes {
            format!("; {bytes} bytes, {} on record", e.bytes)
        } else {
            String::new()
        };
        println!("{:<26} {}  {status}{size}", e.name, p.display());
    }
    if seen == 0 {
        println!("no registry model found under models/ (`gpen-video models list` shows what is known)");
    }
    if !bad.is_empty() {
        bail!(
            "{} do(es) not match the checksum on record: delete and fetch again",
            bad.join(", ")
        );
    }
    Ok(())
}

/// Where `fetch` puts files by default: the checkout's models/ if found, else ./models.
fn default_dir() -> PathBuf {
    find_asset("models")
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// Where `fetch` downloads `e` from: the `--url` flag, else `BASE/FILE` for a mirror base
/// ($GPEN_VIDEO_MODEL_URL_BASE), else the entry's URL; a locally made entry without either
/// says how to make it.
pub fn download_url(e: &Entry, flag: Option<&str>, base: Option<&str>) -> Result<String> {
    match (flag, base.filter(|b| !b.is_empty())) {
        (Some(u), _) => Ok(u.to_string()),
        (None, Some(b)) => Ok(format!("{}/{}", b.trim_end_matches('/'), e.file)),
        (None, None) if e.url.is_empty() => bail!(
            "{} is not published for download: {} (it goes to models/{})",
            e.name,
            e.how_to_get(),
            e.file
        ),
        (None, None) => Ok(e.url.clone()),
    }
}

/// `fetch NAME`: downloads a registry model into `to` (default models/) and returns its path.
/// `url` (else $GPEN_VIDEO_MODEL_URL_BASE/FILE, else the entry's URL) says where from.
pub fn fetch(name: &str, to: Option<&Path>, url: Option<&str>, progress: bool) -> Result<PathBuf> {
    let reg = registry()?;
    let e = reg
        .find(name)
        .ok_or_else(|| anyhow!("no model called `{name}`; known: {}", reg.names()))?;
    let base = std::env::var(URL_BASE_ENV).ok();
    let url = download_url(e, url, base.as_deref())?;
    let dir = to.map(Path::to_path_buf).unwrap_or_else(default_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    let dest = dir.join(&e.file);
    if dest.exists() {
        let sha = sha256_file(&dest)?;
        return match e.sha() {
            Some(x) if x == sha => {
                eprintln!("{} is already present and its sha256 matches", dest.display());
                Ok(dest)
            }
            Some(x) => bail!(
                "{} exists but its sha256 is {sha}, not {x} as on record: delete it and fetch again",
                dest.display()
            ),
            None => {
                eprintln!(
                    "{} is already present (no checksum on record; sha256 {sha}): delete it to download again",
                    dest.display()
                );
                Ok(dest)
            }
        };
    }
    eprintln!("fetching {} from {url}", e.name);
    let path = fetch_url(&url, &dest, e.sha(), progress)?;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if e.sha().is_none() {
        let sha = sha256_file(&path)?;
        eprintln!("no checksum on record for {}; sha256 of the download: {sha}", e.name);
    }
    if e.bytes != 0 && e.bytes != bytes {
        eprintln!(
            "warning: {} is {bytes} bytes; the published file on record is {} bytes (a different export?)",
            path.display(),
            e.bytes
        );
    }
    Ok(path)
}

/// `scheme://host[:port]` of a URL, for messages.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

/// Removes the partial file unless the download completed.
struct PartFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Removes `.FILE.part-PID` files in `dir` left by processes that are gone.
fn remove_stale_parts(dir: &Path, file: &str) {
    let prefix = format!(".{file}.part-");
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for d in rd.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(d.path());
        }
    }
}

fn is_unreachable(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        kind,
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::AddrNotAvailable
            | K::NetworkUnreachable
            | K::HostUnreachable
            | K::NetworkDown
            | K::TimedOut
    )
}

/// A failed name lookup (std reports it as an uncategorised I/O error).
fn is_dns_failure(e: &std::io::Error) -> bool {
    let m = e.to_string().to_ascii_lowercase();
    [
        "lookup address",
        "name or service not known",
        "name resolution",
        "nodename nor servname",
    ]
    .iter()
    .any(|k| m.contains(k))
}

/// Downloads `url` to `dest`: streams to `.FILE.part-PID` beside it (with a progress bar on a
/// terminal when `progress`), checks the length against Content-Length and the sha256 when
/// given, then renames into place. On any failure nothing is left under either name.
pub fn fetch_url(url: &str, dest: &Path, sha256: Option<&str>, progress: bool) -> Result<PathBuf> {
    let file = dest
        .file_name()
        .ok_or_else(|| anyhow!("{} is not a file path", dest.display()))?
        .to_string_lossy()
        .into_owned();
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!("folder {} does not exist", dir.display());
    }
    remove_stale_parts(&dir, &file);
    let host = host_of(url);
    let mirror_hint =
        format!("or put the file there by hand, or point --url / {URL_BASE_ENV} at a mirror you can reach");

    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(120)))
        .user_agent(concat!("gpen-video/", env!("CARGO_PKG_VERSION")))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let resp = agent.get(url).call().map_err(|err| match err {
        ureq::Error::Io(e) if is_unreachable(e.kind()) => anyhow!(
            "cannot reach {host} to download {url}: {e}. There is no network here or the host is unreachable: connect and try again, {mirror_hint}"
        ),
        ureq::Error::Io(e) if is_dns_failure(&e) => anyhow!(
            "cannot reach {host} to download {url}: the host name does not resolve ({e}); there is no network here or no DNS: connect and try again, {mirror_hint}"
        ),
        ureq::Error::HostNotFound => anyhow!(
            "cannot reach {host} to download {url}: the host name does not resolve (no network or no DNS): connect and try again, {mirror_hint}"
        ),
        ureq::Error::ConnectionFailed => anyhow!(
            "cannot reach {host} to download {url}: the connection failed (no network, or the host is unreachable): connect and try again, {mirror_hint}"
        ),
        ureq::Error::Timeout(t) => anyhow!(
            "cannot reach {host} to download {url}: timed out ({t}); the network is down or too slow: try again, {mirror_hint}"
        ),
        ureq::Error::BadUri(u) => anyhow!("bad download URL `{u}`: give a full http(s)://host/path URL"),
        other => anyhow!("download of {url} failed: {other}; try again, {mirror_hint}"),
    })?;
    let status = resp.status();
    if !status.is_success() {
        bail!(
            "download of {url} failed: HTTP {} {}: {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            if status.as_u16() == 404 {
                format!("the file is not at that address (moved or renamed?): check the URL, {mirror_hint}")
            } else {
                format!("the server refused; try again later, {mirror_hint}")
            }
        );
    }
    let body = resp.into_body();
    let expected = body.content_length();
    let mut reader = body.into_reader();

    let part_path = dir.join(format!(".{file}.part-{}", std::process::id()));
    let mut part = PartFile {
        path: part_path.clone(),
        keep: false,
    };
    let mut out = std::fs::File::create(&part_path)
        .with_context(|| format!("cannot write into {} (is the folder writable?)", dir.display()))?;
    let bar = if progress && std::io::stderr().is_terminal() {
        let b = match expected {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::new_spinner(),
        };
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(file.clone());
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got: u64 = 0;
    let total = expected.map_or("?".to_string(), |n| n.to_string());
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.abandon();
                bail!(
                    "download of {url} broke off after {got} of {total} bytes ({e}): nothing was kept; run the command again"
                );
            }
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("cannot write {} (disk full?)", part_path.display()))?;
        got += n as u64;
        bar.set_position(got);
    }
    bar.finish_and_clear();
    if let Some(n) = expected {
        if got != n {
            bail!(
                "download of {url} is truncated: {got} of {n} bytes arrived: nothing was kept; run the command again"
            );
        }
    }
    out.sync_all()
        .with_context(|| format!("cannot write {}", part_path.display()))?;
    drop(out);
    let sha = hex(&hasher.finalize());
    if let Some(want) = sha256 {
        if !want.eq_ignore_ascii_case(&sha) {
            bail!(
                "download of {url} has sha256 {sha}, but {want} is on record: it is not the expected file (changed upstream, or damaged in transit); nothing was kept. Check the URL, or download it by hand and compare with `gpen-video models verify PATH`"
            );
        }
    }
    std::fs::rename(&part_path, dest)
        .with_context(|| format!("cannot move the download into place as {}", dest.display()))?;
    part.keep = true;
    Ok(dest.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_registry_parses_and_passes_its_rules() {
        let reg = registry().expect("embedded registry");
        assert!(reg.models.len() >= 8, "only {} models", reg.models.len());
    }

    #[test]
    fn known_models_are_there_with_their_facts() {
        let reg = registry().unwrap();
        for size in [256, 512, 1024, 2048] {
            let e = reg.find(&format!("GPEN-BFR-{size}")).expect("official entry");
            assert_eq!(e.input_size, size);
            assert_eq!(e.batch, Batch::Fixed1);
            assert_eq!(e.source, Source::Download);
            assert!(e.url.starts_with("https://"), "{}", e.url);
            assert_eq!(e.normalisation, "[-1,1] RGB NCHW");
        }
        assert_eq!(reg.find("GPEN-BFR-512").unwrap().bytes, 284_244_491);
        assert_eq!(reg.find("GPEN-BFR-256").unwrap().bytes, 75_715_262);
        assert_eq!(reg.find("GPEN-BFR-256").unwrap().template, "arcface_128");
        assert_eq!(reg.find("GPEN-BFR-512").unwrap().template, "ffhq");
        let r = reg.find("gpen-bfr-512-random").unwrap();
        assert_eq!((r.batch, r.source), (Batch::Dynamic, Source::Export));
        assert!(r.url.is_empty() && r.make.contains("gpen_export.py"));
        let c = reg.find("centerface").unwrap();
        assert_eq!(c.kind, Kind::Detector);
        assert!(is_sha256(&c.source_sha256));
        // Lookups ignore case.
        assert_eq!(reg.find("gpen-bfr-512").unwrap().name, "GPEN-BFR-512");
    }

    #[test]
    fn every_entry_has_the_required_fields() {
        for e in &registry().unwrap().models {
            assert!(!e.name.is_empty() && e.file.ends_with(".onnx"), "{e:?}");
            assert!(!e.normalisation.is_empty(), "{}", e.name);
            assert!(e.sha256.is_empty() || is_sha256(&e.sha256), "{}: {}", e.name, e.sha256);
            match e.source {
                Source::Download => assert!(!e.url.is_empty(), "{}", e.name),
                _ => assert!(e.url.is_empty() && !e.make.is_empty(), "{}", e.name),
            }
            if e.kind == Kind::Enhancer {
                assert!(e.input_size > 0 && !e.template.is_empty(), "{}", e.name);
            }
        }
    }

    #[test]
    fn names_and_files_are_unique() {
        let reg = registry().unwrap();
        let mut names: Vec<String> = reg.models.iter().map(|e| e.name.to_lowercase()).collect();
        let mut files: Vec<String> = reg.models.iter().map(|e| e.file.to_lowercase()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        files.sort();
        files.dedup();
        assert_eq!((names.len(), files.len()), (n, n));
    }

    fn one(extra: &str) -> String {
        format!(
            "[[model]]\nname = \"x\"\nkind = \"enhancer\"\nfile = \"x.onnx\"\nsource = \"download\"\n\
             url = \"https://example.invalid/x.onnx\"\nbatch = \"dynamic\"\ninput_size = 512\n\
             template = \"ffhq\"\nnormalisation = \"[-1,1] RGB NCHW\"\n{extra}"
        )
    }

    #[test]
    fn the_rules_refuse_bad_entries() {
        assert!(Registry::parse(&one("sha256 = \"\"\n")).is_ok());
        // Hashes: empty or 64 lowercase hex digits.
        assert!(Registry::parse(&one("sha256 = \"abc\"\n")).is_err());
        assert!(Registry::parse(&one(&format!("sha256 = \"{}\"\n", "A".repeat(64)))).is_err());
        assert!(Registry::parse(&one(&format!("sha256 = \"{}\"\n", "a".repeat(64)))).is_ok());
        // Unknown fields (typos) and duplicate names.
        assert!(Registry::parse(&one("sha = \"\"\n")).is_err());
        let twice = format!(
            "{}\n{}",
            one(""),
            one("").replace("x.onnx", "y.onnx").replace("\"x\"", "\"X\"")
        );
        assert!(Registry::parse(&twice).is_err());
        // A download needs a URL.
        assert!(Registry::parse(&one("").replace("url = \"https://example.invalid/x.onnx\"\n", "")).is_err());
        assert!(Registry::parse(&one("").replace("\"ffhq\"", "\"square\"")).is_err());
    }

    #[test]
    fn download_url_prefers_flag_then_mirror_base_then_registry() {
        let reg = registry().unwrap();
        let e = reg.find("GPEN-BFR-1024").unwrap();
        assert_eq!(download_url(e, None, None).unwrap(), e.url);
        assert_eq!(
            download_url(e, None, Some("http://127.0.0.1:9/m/")).unwrap(),
            "http://127.0.0.1:9/m/GPEN-BFR-1024.onnx"
        );
        assert_eq!(
            download_url(e, None, Some("")).unwrap(),
            e.url,
            "an empty base is ignored"
        );
        assert_eq!(
            download_url(e, Some("http://h/x.onnx"), Some("http://127.0.0.1:9")).unwrap(),
            "http://h/x.onnx"
        );
        let x = reg.find("gpen-bfr-256-random").unwrap();
        let err = download_url(x, None, None).unwrap_err().to_string();
        assert!(err.contains(&x.make) && err.contains("not published"), "{err}");
        assert_eq!(
            download_url(x, None, Some("http://127.0.0.1:9")).unwrap(),
            "http://127.0.0.1:9/gpen-bfr-256-random.onnx"
        );
    }

    #[test]
    fn host_is_taken_from_the_url() {
        assert_eq!(host_of("http://127.0.0.1:8080/a/b.onnx"), "127.0.0.1:8080");
        assert_eq!(host_of("https://example.org"), "example.org");
    }

    #[test]
    fn list_shows_every_model() {
        let t = list_table().unwrap();
        for e in &registry().unwrap().models {
            assert!(t.contains(&e.name), "{} missing from\n{t}", e.name);
        }
        assert!(t.lines().next().unwrap().starts_with("NAME"));
    }

    #[test]
    fn resolve_model_refuses_an_unknown_name_and_passes_paths() {
        let err = resolve_model("no-such-model").unwrap_err().to_string();
        assert!(err.contains("neither a file nor a known model name"), "{err}");
        assert_eq!(
            resolve_model("some/dir/m.onnx").unwrap(),
            PathBuf::from("some/dir/m.onnx")
        );
    }
}
