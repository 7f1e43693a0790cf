//! Output files: in, the paths a user named as outputs; out, checks made before any work (never
//! an input, a model or another output of the run; the folder exists and is writable) and the
//! temporary names every file is written under until it is complete, then renamed into place.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// Whether two paths name the same existing file (hard links and `./x` vs `x` included).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The folder a file path is in (`.` for a bare name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Where OUT is written until it is complete: beside it, hidden, with the same extension so the
/// container is chosen the same way.
pub fn partial_path(output: &Path) -> Result<PathBuf> {
    let name = output
        .file_name()
        .ok_or_else(|| anyhow!("output {} is not a file path", output.display()))?;
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    Ok(folder_of(output).join(format!(
        ".{}.partial-{}.{ext}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes the files in `dir` named `PREFIX<pid>SUFFIX` whose process is gone: what a crashed
/// run left half-written. A live process's file (another run on the same folder) is kept.
pub fn remove_stale(dir: &Path, prefix: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => tracing::info!(file = %e.path().display(), "removed a stale partial file"),
            Err(err) => tracing::warn!(file = %e.path().display(), "cannot remove a stale partial file: {err}"),
        }
    }
}

/// Checks that `dir` is an existing folder this process can create files in.
fn check_folder(dir: &Path, what: &str) -> Result<()> {
    let meta = std::fs::metadata(dir)
        .map_err(|_| anyhow!("{what} folder {} does not exist: create it first", dir.display()))?;
    if !meta.is_dir() {
        bail!("{what} folder {} is not a folder", dir.display());
    }
    let probe = dir.join(format!(".gpen-video-probe-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(|e| anyhow!("{what} folder {} is not writable: {e}", dir.display()))?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

/// Checks OUT: not the input, in an existing writable folder, with a container FFmpeg knows.
pub fn check_output(input: &Path, output: &Path) -> Result<()> {
    if output.as_os_str().is_empty() {
        bail!("no output file given");
    }
    if same_file(input, output) || input == output {
        bail!(
            "output {} is the input file: choose another output path (the input is never overwritten)",
            output.display()
        );
    }
    partial_path(output)?;
    check_folder(&folder_of(output), "output")?;
    if output.is_dir() {
        bail!(
            "output {} is a folder: give a file name such as out.mp4",
            output.display()
        );
    }
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext.is_empty() || !crate::encode::container_known(ext) {
        bail!(
            "output {}: cannot tell the container from the extension `.{ext}`; use .mp4, .mkv or .mov",
            output.display()
        );
    }
    Ok(())
}

/// Checks a side output (faces or stats JSON, a report): a file path in an existing writable
/// folder, and none of `taken` (the run's inputs, models and other outputs).
pub fn check_side_output(path: &Path, taken: &[&Path]) -> Result<()> {
    if path.file_name().is_none() || path.is_dir() {
        bail!(
            "{} is a folder, not a file path: give a file name such as stats.json",
            path.display()
        );
    }
    if let Some(t) = taken.iter().find(|t| same_file(t, path) || **t == path) {
        bail!(
            "{} is also {} of this run: choose another path (gpen-video never writes over its inputs or its other outputs)",
            path.display(),
            t.display()
        );
    }
    check_folder(&folder_of(path), "output")
}

/// Writes `bytes` to `path` whole or not at all: a hidden temporary file beside it, flushed,
/// then renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = PendingFile::create(path)?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    f.commit()
}

/// A file being written under a temporary name beside its final path; [`PendingFile::commit`]
/// renames it into place, and dropping it uncommitted removes it.
pub struct PendingFile {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl PendingFile {
    pub fn create(path: &Path) -> Result<Self> {
        let name = path
            .file_name()
            .ok_or_else(|| anyhow!("{} is not a file path", path.display()))?
            .to_string_lossy();
        let tmp = folder_of(path).join(format!(".{name}.partial-{}", std::process::id()));
        let file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file: Some(std::io::BufWriter::new(file)),
        })
    }

    /// Flushes the file and moves it into place.
    pub fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("not committed yet");
        let file = file
            .into_inner()
            .map_err(|e| anyhow!("writing {}: {}", self.path.display(), e.error()))?;
        file.sync_all()
            .with_context(|| format!("writing {}", self.path.display()))?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("cannot move the finished file into place as {}", self.path.display()))
    }
}

impl Write for PendingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.as_mut().expect("not committed").write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().expect("not committed").flush()
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            std::fs::remove_file(&self.tmp).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_path_is_hidden_beside_the_output_with_its_extension() {
        let p = partial_path(Path::new("dir/clip.mp4")).unwrap();
        assert_eq!(p.parent(), Some(Path::new("dir")));
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".clip.mp4.partial-"), "{name}");
        assert!(name.ends_with(".mp4"), "{name}");
        assert_eq!(partial_path(Path::new("o.mkv")).unwrap().parent(), Some(Path::new(".")));
        assert!(partial_path(Path::new("/")).is_err());
    }

    #[test]
    fn side_outputs_never_name_an_input_or_another_output() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.mp4");
        std::fs::write(&input, b"video").unwrap();
        let linked = dir.path().join("link.mp4");
        std::fs::hard_link(&input, &linked).unwrap();
        for bad in [&input, &linked] {
            let e = check_side_output(bad, &[&input]).unwrap_err().to_string();
            assert!(e.contains("is also"), "{e}");
        }
        let out = dir.path().join("out.mp4");
        assert!(
            check_side_output(&out, &[&input, &out]).is_err(),
            "not yet existing, same path"
        );
        assert!(check_side_output(dir.path(), &[]).is_err(), "a folder");
        let missing = dir.path().join("nope/stats.json");
        let e = check_side_output(&missing, &[]).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        check_side_output(&dir.path().join("stats.json"), &[&input]).unwrap();
        assert_eq!(std::fs::read(&input).unwrap(), b"video");
    }

    #[test]
    fn pending_files_appear_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        {
            let mut f = PendingFile::create(&path).unwrap();
            f.write_all(b"half").unwrap();
        }
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
        write_atomic(&path, b"whole").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
