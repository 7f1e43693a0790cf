//! The user's own models: in, `$XDG_CONFIG_HOME/gpen-video/models.toml` (else under
//! `~/.config`), the registry's schema with `source = "user"` and absolute file paths; out, its
//! entries, changed one process at a time under `models.toml.lock` and written back whole or
//! not at all, and the check that a recorded file (and the weights it reads) is still the one
//! recorded. Copies made with a symbolic batch live under `$XDG_DATA_HOME/gpen-video/models`
//! (else `~/.local/share`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::{Entry, Registry};

/// The user registry's file.
pub(crate) fn file() -> Result<PathBuf> {
    crate::defaults::user_dir("XDG_CONFIG_HOME", ".config")
        .map(|d| d.join("models.toml"))
        .ok_or_else(|| anyhow!("no HOME or XDG_CONFIG_HOME to keep your models' list under"))
}

/// Where copies of users' files with a symbolic batch are written.
pub(crate) fn data_dir() -> Result<PathBuf> {
    crate::defaults::user_dir("XDG_DATA_HOME", ".local/share")
        .map(|d| d.join("models"))
        .ok_or_else(|| anyhow!("no HOME or XDG_DATA_HOME to keep model copies under"))
}

/// The user's entries (none when there is no file, or no home to look in).
pub(crate) fn load() -> Result<Registry> {
    match file() {
        Ok(path) => read(&path),
        Err(_) => Ok(Registry::default()),
    }
}

/// The entries in `path` (none when there is no such file).
fn read(path: &Path) -> Result<Registry> {
    let text = match std::fs::read_to_string(path) {
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

/// How long a change waits for another process's change to the list before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// Takes the exclusive lock on the list at `path`: `models.toml.lock` beside it, an advisory
/// lock the system lets go of when its holder exits, however it exits. Waits (up to
/// [`LOCK_WAIT`]) while another `gpen-video models add` or `remove` holds it.
fn lock(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().map_or("models.toml".into(), |n| n.to_string_lossy());
    let lock = path.with_file_name(format!("{name}.lock"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock)
        .with_context(|| {
            format!(
                "cannot open {} (the lock on your models' list): check that the folder is writable",
                lock.display()
            )
        })?;
    let start = Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < LOCK_WAIT => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(std::fs::TryLockError::WouldBlock) => bail!(
                "another gpen-video has held {} for {} s while changing your models' list: let it finish (or stop it) and try again",
                lock.display(),
                LOCK_WAIT.as_secs()
            ),
            Err(std::fs::TryLockError::Error(e)) => bail!("cannot lock {} ({e})", lock.display()),
        }
    }
}

/// Changes the user's list, one process at a time: under the list's lock, reads it afresh,
/// applies `change` and writes the result whole (a temporary file in the same folder, synced,
/// then renamed over the list), so a concurrent `models add` or `remove` of another name is
/// never lost. Returns what `change` returned and the list's path; when `change` fails, the
/// list is left as it was.
pub(crate) fn update<T>(change: impl FnOnce(&mut Registry) -> Result<T>) -> Result<(T, PathBuf)> {
    let path = file()?;
    let dir = path.parent().expect("a file under a folder");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let _held = lock(&path)?;
    let mut reg = read(&path)?;
    let out = change(&mut reg)?;
    reg.check()?;
    let text = format!(
        "# Your models, as `gpen-video models add` recorded them (see `gpen-video models list`).\n\n{}",
        toml::to_string(&reg).context("the models' list does not serialise")?
    );
    crate::output::write_atomic(&path, text.as_bytes())?;
    // The rename itself reaches the disk with the folder.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok((out, path))
}

/// A recorded file must still be the one recorded: the same size, and so must each file it
/// reads its weights from (a cheap check on every use; `gpen-video models verify` checks their
/// sha256).
pub(crate) fn check_unchanged(e: &Entry, path: &Path) -> Result<()> {
    let again = format!(
        "record it again with `gpen-video models add {} --name {}`",
        if e.origin.is_empty() { &e.file } else { &e.origin },
        e.name
    );
    let now = std::fs::metadata(path)
        .with_context(|| format!("model {}: cannot read {}", e.name, path.display()))?
        .len();
    if e.bytes != 0 && now != e.bytes {
        bail!(
            "model {}: {} is {now} bytes, {} when it was added: it changed; {again}",
            e.name,
            path.display(),
            e.bytes,
        );
    }
    for d in &e.data {
        let now = std::fs::metadata(&d.file)
            .with_context(|| {
                format!(
                    "model {}: cannot read its weights {}: put them back, or {again}",
                    e.name, d.file
                )
            })?
            .len();
        if now != d.bytes {
            bail!(
                "model {}: its weights {} are {now} bytes, {} when it was added: they changed; {again}",
                e.name,
                d.file,
                d.bytes,
            );
        }
    }
    Ok(())
}
