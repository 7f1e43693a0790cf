//! Model registry: in, the embedded models/models.toml, the files under models/ and a model name
//! or path; out, a table of known models, checksum and I/O-contract reports, downloads that
//! appear under their final name only when complete and verified, and `--model NAME` resolved
//! to a file.
//!
//! `gpen-video models list | verify [PATH] | fetch NAME [--to DIR] [--url URL]` is [`run`] on a
//! [`ModelsCmd`]. A download streams to `DIR/.FILE.partial-TAG.EXT` (unique and locked, see `output::Partial`) and is renamed to `DIR/FILE` only
//! once it verifies: its sha256 where one is on record, otherwise its recorded size and the I/O
//! contract `--model` checks; any failure (a stall of $GPEN_VIDEO_FETCH_STALL_S included)
//! removes the partial file.
//! `GPEN_VIDEO_MODEL_URL_BASE=BASE` makes `fetch NAME` get `BASE/FILE` instead of the entry's
//! URL (a mirror; tests point it at 127.0.0.1).
//!
//! The registry types, their loading and `--model` resolution are here; `models list` and
//! `models verify` are in `report`, downloads in `fetch`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::find_asset;
use crate::faces::align::Template;

mod add;
mod fetch;
pub(crate) mod rebatch;
pub(crate) mod report;
#[cfg(test)]
mod tests;
pub(crate) mod user;
pub(crate) mod weights;

pub use fetch::{fetch, fetch_entry, fetch_url, STALL_ENV};
use report::verify_all;
pub(crate) use report::{list_table, sha256_file};
pub use report::{verify_path, Checksum, ModelFacts};

/// The registry as shipped: compiled into the binary so it works from any folder.
pub(crate) const EMBEDDED: &str = include_str!("../../models/models.toml");

/// Environment variable naming a mirror: `fetch NAME` downloads `BASE/FILE`.
pub(crate) const URL_BASE_ENV: &str = "GPEN_VIDEO_MODEL_URL_BASE";

/// What a model does in the pipeline.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// GPEN-BFR: float32 [N,3,S,S] in, same out.
    Enhancer,
    /// CenterFace: [N,3,H,W] in, four maps out.
    Detector,
    /// The face mesh: [N,3,192,192] in, 468 points and a presence logit out.
    Mesh,
    /// A face descriptor (dlib's face recognition ResNet): [N,3,S,S] in, [N,D] out.
    Identity,
    /// MediaPipe's palm detector: [N,3,192,192] in; raw boxes, scores and the anchors out.
    Palm,
    /// MediaPipe's hand landmarks: [N,3,224,224] in; 21 points, presence, handedness out.
    Hand,
}

/// Whether the batch dimension is fixed in the graph.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum Batch {
    #[serde(rename = "fixed-1")]
    Fixed1,
    #[serde(rename = "dynamic")]
    Dynamic,
}

/// Where a model file comes from.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Published at `url`.
    Download,
    /// Built locally by models/gpen_export.py (`make`).
    Export,
    /// Made by scripts/setup.sh (`make`).
    Setup,
    /// A user's own file, recorded by `gpen-video models add` in the user registry; `file` is
    /// its absolute path.
    User,
}

/// One `[[model]]` of models.toml; the file's header documents every field.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub file: String,
    pub source: Source,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// File size in bytes; 0 when unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes: u64,
    /// Square crop side of an enhancer; 0 for a detector.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub input_size: usize,
    pub batch: Batch,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template: String,
    pub normalisation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub make: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) checkpoint_url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) source_sha256: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) source_bytes: u64,
    /// The fidelity a model with a weight input is given by default (CodeFormer's 0.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<f32>,
    /// The blend its users usually restore at (facefusion's default: 0.8), for reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blend: Option<f32>,
    /// The licence of the weights, as their authors publish it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) licence: String,
    /// A user entry whose `file` is a copy made with a symbolic batch: the file the user added.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub origin: String,
    /// A user entry's files beside `file` that its graph reads its weights from (ONNX external
    /// data), each with its checksum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<weights::DataFile>,
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// What a model's name may hold, as error messages say it.
pub(crate) const NAME_RULE: &str =
    "1 to 64 letters, digits, `.`, `_`, `-` and `+`, and begins with neither `-` nor `.`";

/// Whether `name` follows [`NAME_RULE`]: a word a shell passes on as it is, that no command
/// takes for an option, and a file name that is not hidden.
pub(crate) fn name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with(['-', '.'])
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-+".contains(c))
}

impl Entry {
    /// The sha256 on record, if any.
    pub(crate) fn sha(&self) -> Option<&str> {
        (!self.sha256.is_empty()).then_some(self.sha256.as_str())
    }

    /// `models/FILE`, as the set-up lays it out.
    pub(crate) fn rel_path(&self) -> String {
        format!("models/{}", self.file)
    }

    /// The file under models/ if present (working directory first, then the checkout the
    /// executable was built in, as [`find_asset`] searches).
    pub fn local_path(&self) -> Option<PathBuf> {
        if self.source == Source::User {
            return Some(PathBuf::from(&self.file)).filter(|p| p.is_file());
        }
        find_asset(&self.rel_path()).filter(|p| p.is_file())
    }

    /// The alignment template the entry names, if it names one a model can use.
    pub fn template(&self) -> Option<Template> {
        self.template.parse().ok()
    }

    /// What to do when the file here is not the one on record: get it again from where it came
    /// from (one's own model is recorded again from the file that was added, as nothing can
    /// fetch it).
    pub(crate) fn mend(&self) -> String {
        match self.source {
            Source::Download => format!(
                "delete it and download it again with `gpen-video models fetch {}`",
                self.name
            ),
            Source::Export => format!("delete it and build it again with `{}`", self.make),
            Source::Setup => format!("delete it and make it again with {}", self.make),
            Source::User => format!(
                "it is your own model: if you changed it on purpose, record it again with `gpen-video models add {} --name {}`; otherwise put back the file you added",
                if self.origin.is_empty() { &self.file } else { &self.origin },
                self.name
            ),
        }
    }

    /// What to do to get this model onto this machine.
    pub(crate) fn how_to_get(&self) -> String {
        match self.source {
            Source::Download => format!("run `gpen-video models fetch {}`", self.name),
            Source::Export => format!("build it with `{}`", self.make),
            Source::Setup => format!("make it with {}", self.make),
            Source::User => format!(
                "put it back at {}, or record it again with `gpen-video models add PATH --name {}`",
                self.file, self.name
            ),
        }
    }
}

/// Every known model, in file order.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
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
            if e.source == Source::User {
                if !e.file.starts_with('/') || !e.file.ends_with(".onnx") {
                    bail!("{n}: file `{}` must be an absolute path to an *.onnx file", e.file);
                }
            } else if e.file.is_empty() || e.file.contains('/') || !e.file.ends_with(".onnx") {
                bail!("{n}: file `{}` must be a plain *.onnx file name", e.file);
            }
            // A user's file may be known under several names (with other templates, say).
            if e.source != Source::User && !files.insert(e.file.to_ascii_lowercase()) {
                bail!("{n}: file `{}` is used by another entry", e.file);
            }
            for (what, h) in [("sha256", &e.sha256), ("source_sha256", &e.source_sha256)] {
                if !h.is_empty() && !is_sha256(h) {
                    bail!("{n}: {what} `{h}` is not 64 lowercase hex digits");
                }
            }
            for d in &e.data {
                if e.source != Source::User {
                    bail!("{n}: only your own models record weights files (`data`)");
                }
                if !d.file.starts_with('/') {
                    bail!("{n}: weights file `{}` must be an absolute path", d.file);
                }
                if !is_sha256(&d.sha256) {
                    bail!("{n}: the sha256 of {} is not 64 lowercase hex digits", d.file);
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
            for (what, v) in [("fidelity", e.fidelity), ("blend", e.blend)] {
                if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                    bail!("{n}: {what} must be between 0 and 1");
                }
            }
            match e.kind {
                Kind::Enhancer => {
                    if e.input_size == 0 || e.template.is_empty() {
                        bail!("{n}: an enhancer needs input_size and template");
                    }
                    if let Err(why) = e.template.parse::<crate::faces::align::Template>() {
                        bail!("{n}: {why}");
                    }
                }
                Kind::Detector => {
                    if e.input_size != 0 || !e.template.is_empty() {
                        bail!("{n}: a detector has no input_size or template");
                    }
                }
                Kind::Identity => {
                    if e.input_size == 0 || e.template.is_empty() {
                        bail!("{n}: an identity model needs input_size and template");
                    }
                }
                Kind::Palm | Kind::Hand => {
                    let side = report::hand_model_side(e.kind);
                    if e.input_size != side || !e.template.is_empty() {
                        let what = if e.kind == Kind::Palm {
                            "palm detector"
                        } else {
                            "hand landmark model"
                        };
                        bail!("{n}: a {what} takes {side} pixels and has no template");
                    }
                }
                Kind::Mesh => {
                    if e.input_size != crate::faces::mesh::SIZE || !e.template.is_empty() {
                        bail!(
                            "{n}: a face mesh takes {} pixels and has no template",
                            crate::faces::mesh::SIZE
                        );
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
    pub(crate) fn by_sha(&self, sha: &str) -> Option<&Entry> {
        self.models.iter().find(|e| e.sha() == Some(sha))
    }

    /// The entry whose file name is `file` (case-insensitive).
    pub(crate) fn by_file(&self, file: &str) -> Option<&Entry> {
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

/// Every model known here: the user's own (`gpen-video models add`) first, then the registry's.
pub(crate) fn known() -> Result<Vec<Entry>> {
    let mut all = user::load()?.models;
    all.extend(registry()?.models.iter().cloned());
    Ok(all)
}

/// A model as `--model` names it: its file, and what its entry (if any) says of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    pub path: PathBuf,
    /// The entry's name, when one was found by name or by file.
    pub name: Option<String>,
    /// The template the entry gives (the model's own; a file's metadata overrides it).
    pub template: Option<Template>,
    /// The fidelity the entry gives a model with a weight input.
    pub fidelity: Option<f32>,
}

impl Resolved {
    fn of(path: PathBuf, e: Option<&Entry>) -> Self {
        Resolved {
            path,
            name: e.map(|e| e.name.clone()),
            template: e.and_then(Entry::template),
            fidelity: e.and_then(|e| e.fidelity),
        }
    }
}

/// The entry a path is the file of: a user entry by its file (or the file it was copied from),
/// else a registry entry by file name.
fn entry_of_path<'a>(all: &'a [Entry], path: &std::path::Path) -> Option<&'a Entry> {
    let abs = path.canonicalize().ok();
    let user = all.iter().filter(|e| e.source == Source::User).find(|e| {
        [&e.file, &e.origin]
            .into_iter()
            .any(|f| !f.is_empty() && std::path::Path::new(f).canonicalize().ok() == abs && abs.is_some())
    });
    let name = path.file_name().and_then(|f| f.to_str());
    user.or_else(|| {
        all.iter()
            .filter(|e| e.source != Source::User)
            .find(|e| name.is_some_and(|n| e.file.eq_ignore_ascii_case(n)))
    })
}

/// Resolves `--model ARG`: a known name (the user's own first, then the registry's) gives its
/// file (an error says how to get it when absent); anything else is a path, with the facts of
/// the entry it is the file of.
pub fn resolve(arg: &str) -> Result<Resolved> {
    let path = PathBuf::from(arg);
    let all = known()?;
    let looks_like_path = arg.contains(std::path::MAIN_SEPARATOR) || arg.contains('/') || arg.ends_with(".onnx");
    if looks_like_path || path.is_file() {
        return Ok(Resolved::of(path.clone(), entry_of_path(&all, &path)));
    }
    let named = |user: bool| {
        all.iter()
            .filter(|e| (e.source == Source::User) == user)
            .find(|e| e.name.eq_ignore_ascii_case(arg))
    };
    // A user entry whose file is missing does not hide a registry file that is present.
    let e = match (named(true), named(false)) {
        (Some(u), Some(r)) if u.local_path().is_none() && r.local_path().is_some() => Some(r),
        (Some(u), _) => Some(u),
        (None, r) => r,
    };
    match e {
        Some(e) => {
            let p = e.local_path().ok_or_else(|| match e.source {
                Source::Download => anyhow!(
                    "model {} is not downloaded: run `gpen-video models fetch {}`",
                    e.name,
                    e.name
                ),
                Source::User => anyhow!("model {}: its file {} is gone: {}", e.name, e.file, e.how_to_get()),
                _ => anyhow!("model {} is not in models/: {}", e.name, e.how_to_get()),
            })?;
            if e.source == Source::User {
                user::check_unchanged(e, &p)?;
            }
            Ok(Resolved::of(p, Some(e)))
        }
        None if path.exists() => Ok(Resolved::of(path, None)),
        None => {
            let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
            bail!(
                "model `{arg}` is neither a file nor a known model name; known names: {} (`gpen-video models list`)",
                names.join(", ")
            )
        }
    }
}

/// The file `--model ARG` names (see [`resolve`]).
pub fn resolve_model(arg: &str) -> Result<PathBuf> {
    resolve(arg).map(|r| r.path)
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
    /// Record your own restorer file under a name, so `--model NAME` finds it in every command
    /// (the service, batch and segments too). Its checksum and I/O contract are checked once; a
    /// file whose batch is fixed at 1 gets a copy with a symbolic batch (under
    /// $XDG_DATA_HOME/gpen-video/models), kept only if a batch of four gives, to the bit, what
    /// four single calls give, so it runs batched on a GPU. Your file is only read. The list is
    /// $XDG_CONFIG_HOME/gpen-video/models.toml.
    Add {
        /// The ONNX file (input [1 or N,3,S,S]; CodeFormer's second input `weight` is welcome).
        path: PathBuf,
        /// The name to use with --model (a registry name such as `codeformer` takes its facts:
        /// template, default fidelity, licence): letters, digits, `.`, `_`, `-` and `+`, not
        /// beginning with `-` or `.`.
        #[arg(long, value_name = "NAME")]
        name: String,
        /// The alignment template the model was trained with, when neither the file nor the
        /// registry's entry of that name says: ffhq or arcface_128.
        #[arg(long, value_name = "NAME")]
        template: Option<Template>,
        /// Keep a batch-1 file as it is (no copy with a symbolic batch).
        #[arg(long)]
        keep_batch: bool,
    },
    /// Forget one of your own models (its copy, if one was made, is deleted; your file is not).
    Remove {
        /// The name it was added under.
        name: String,
    },
    /// Download a model into models/ (or DIR). It is kept only if it verifies: its sha256 when
    /// on record, otherwise its recorded size and its I/O contract (as `--model` checks it).
    /// Models built locally (exports) say how to build them instead.
    /// GPEN_VIDEO_MODEL_URL_BASE=BASE downloads BASE/FILE instead of the published URL;
    /// GPEN_VIDEO_FETCH_STALL_S=SECS gives up when nothing arrives for SECS (default 60).
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
            crate::console::print_text(&list_table()?);
            Ok(())
        }
        ModelsCmd::Verify { path: Some(p) } => {
            let report = verify_path(&p)?;
            crate::console::print_text(&report.to_string());
            if report.mismatch() {
                let mut what = Vec::new();
                if let Checksum::Mismatch { expected } = &report.checksum {
                    what.push(format!("sha256 {} differs from {expected}", report.sha256));
                }
                let changed: Vec<&str> = report
                    .data
                    .iter()
                    .filter(|d| !d.matches)
                    .map(|d| d.file.as_str())
                    .collect();
                if !changed.is_empty() {
                    what.push(format!("its weights {} differ from those", changed.join(", ")));
                }
                let e = report.entry.as_ref();
                bail!(
                    "{}: {} on record for {}: {}",
                    p.display(),
                    what.join(", and "),
                    e.map_or("?", |e| e.name.as_str()),
                    e.map_or(String::new(), Entry::mend)
                );
            }
            Ok(())
        }
        ModelsCmd::Verify { path: None } => verify_all(),
        ModelsCmd::Add {
            path,
            name,
            template,
            keep_batch,
        } => {
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
            let args = add::AddArgs {
                path,
                name,
                template,
                keep_batch,
                threads,
            };
            let (_, said) = add::add(&args)?;
            crate::console::print_text(&said);
            Ok(())
        }
        ModelsCmd::Remove { name } => {
            crate::console::print_text(&add::remove(&name)?);
            Ok(())
        }
        ModelsCmd::Fetch { name, to, url } => {
            let progress = std::io::stderr().is_terminal();
            let path = fetch(&name, to.as_deref(), url.as_deref(), progress)?;
            crate::console::print_text(&format!("{}\n", path.display()));
            Ok(())
        }
    }
}
