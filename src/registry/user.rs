//! The user's own models: in, `$XDG_CONFIG_HOME/gpen-video/models.toml` (else under
//! `~/.config`), the registry's schema with `source = "user"` and absolute file paths; out, its
//! entries, written back whole or not at all, and the check that a recorded file is still the
//! one recorded. Copies made with a symbolic batch live under `$XDG_DATA_HOME/gpen-video/models`
//! (else `~/.local/share`).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::{Entry, Registry};

/// The user registry's file.
pub fn file() -> Result<PathBuf> {
    crate::defaults::user_dir("XDG_CONFIG_HOME", ".config")
        .map(|d| d.join("models.toml"))
        .ok_or_else(|| anyhow!("no HOME or XDG_CONFIG_HOME to keep your models' list under"))
}

/// Where copies of users' files with a symbolic batch are written.
pub fn data_dir() -> Result<PathBuf> {
    crate::defaults::user_dir("XDG_DATA_HOME", ".local/share")
        .map(|d| d.join("models"))
        .ok_or_else(|| anyhow!("no HOME or XDG_DATA_HOME to keep model copies under"))
}

/// The user's entries (none when there is no file, or no home to look in).
pub fn load() -> Result<Registry> {
    let Ok(path) = file() else {
        return Ok(Registry::default());
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Registry::default()),
        Err(e) => return Err(e).with_context(|| format!("cannot read your models' list {}", path.display())),
    };
    let reg: Registry = toml::from_str(&text)
        .with_context(|| format!("your models' list {} does not parse: fix or delete it", path.display()))?;
    reg.check()
        .with_context(|| format!("your models' list {}: fix or delete it", path.display()))?;
    if let Some(e) = reg.models.iter().find(|e| e.source != super::Source::User) {
        bail!(
            "your models' list {}: {} has source {:?}; entries there are \"user\"",
            path.display(),
            e.name,
            e.source
        );
    }
    Ok(reg)
}

/// Writes the user's entries (creating the folder), whole or not at all.
pub fn save(reg: &Registry) -> Result<PathBuf> {
    reg.check()?;
    let path = file()?;
    let dir = path.parent().expect("a file under a folder");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let text = format!(
        "# Your models, as `gpen-video models add` recorded them (see `gpen-video models list`).\n\n{}",
        toml::to_string(reg).context("the models' list does not serialise")?
    );
    crate::output::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// A recorded file must still be the one recorded: the same size (a cheap check on every use;
/// `gpen-video models verify` checks its sha256).
pub fn check_unchanged(e: &Entry, path: &Path) -> Result<()> {
    let now = std::fs::metadata(path)
        .with_context(|| format!("model {}: cannot read {}", e.name, path.display()))?
        .len();
    if e.bytes != 0 && now != e.bytes {
        bail!(
            "model {}: {} is {now} bytes, {} when it was added: it changed; record it again with `gpen-video models add {} --name {}`",
            e.name,
            path.display(),
            e.bytes,
            if e.origin.is_empty() { &e.file } else { &e.origin },
            e.name
        );
    }
    Ok(())
}
