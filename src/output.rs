//! Output files: in, the paths a user named as outputs and the encoder settings; out, the one
//! decision whether OUT is acceptable ([`accept_output`]: never an input, the folder exists
//! and is writable, a still for a still and a video for a video, an encoder this FFmpeg has
//! that OUT's container holds, settings in range), the same for side outputs, and the
//! temporary names every file is written under until it is complete, then renamed into place.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use ffmpeg_next::encoder;

use crate::media::encode::{codec_for, container_for, container_known, container_takes, EncodeSettings, WEBM_CODECS};
use crate::media::kind::{is_other_image, is_still, is_still_input};
use crate::media::still::encoder_for as still_encoder;

/// Whether two paths name the same existing file (hard links and `./x` vs `x` included).
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The folder a file path is in (`.` for a bare name).
pub(crate) fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A tag unique across processes, PID namespaces (containers are all PID 1) and machines on
/// shared storage: 64 random bits from the system, with the time and PID as a fallback.
fn unique_tag() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = (t ^ (u64::from(std::process::id()) << 40)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file being written under a temporary name beside its final path: created exclusively
/// under a name no other process can pick, and locked (an advisory lock, held until this is
/// dropped) so that [`remove_stale`] in another process, on this machine or another one on the
/// same storage, never takes it for a dead run's leftover.
pub(crate) struct Partial {
    path: PathBuf,
    /// Holds the lock.
    file: std::fs::File,
}

impl Partial {
    /// Creates `.NAME.partial-TAG` (plus `.EXT` of `output`'s extension, so FFmpeg picks the
    /// same container) beside `output`.
    pub(crate) fn beside(output: &Path) -> Result<Partial> {
        let name = output
            .file_name()
            .ok_or_else(|| anyhow!("output {} is not a file path", output.display()))?
            .to_string_lossy()
            .into_owned();
        let ext = output
            .extension()
            .map_or(String::new(), |e| format!(".{}", e.to_string_lossy()));
        let dir = folder_of(output);
        for _ in 0..8 {
            let path = dir.join(format!(".{name}.partial-{}{ext}", unique_tag()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    // Another process's clean-up may have taken the file for stale between its
                    // creation and the lock (it then holds the lock, or has removed the name):
                    // only a locked file still under its name is ours.
                    if file.try_lock().is_ok() && same_inode(&file, &path) {
                        return Ok(Partial { path, file });
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => bail!(
                    "cannot create {} ({e}): check that the folder is writable",
                    path.display()
                ),
            }
        }
        bail!("cannot find a free temporary name beside {}", output.display())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The locked file handle.
    pub(crate) fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Moves the finished file into place as `dest` (the lock is released after).
    pub(crate) fn rename_to(self, dest: &Path) -> Result<()> {
        std::fs::rename(&self.path, dest)
            .with_context(|| format!("cannot move the finished file into place as {}", dest.display()))
    }

    /// Removes the unfinished file.
    pub(crate) fn discard(self) {
        std::fs::remove_file(&self.path).ok();
    }
}

/// A process's claim on an output it is about to make: `.NAME.claim` beside it, locked while
/// held and removed when dropped, so concurrent `batch` processes over the same folders each
/// restore a clip once. Lock files are tied to their process: a crashed holder's claim is
/// free again at once.
#[derive(Debug)]
pub(crate) struct Claim {
    path: PathBuf,
    /// Holds the lock.
    _file: std::fs::File,
}

impl Claim {
    /// Takes the claim on `output` (whose folder exists); `None` when another process holds it.
    pub(crate) fn take(output: &Path) -> Result<Option<Claim>> {
        let name = output
            .file_name()
            .ok_or_else(|| anyhow!("output {} is not a file path", output.display()))?
            .to_string_lossy()
            .into_owned();
        let path = folder_of(output).join(format!(".{name}.claim"));
        for _ in 0..8 {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| format!("cannot create {} (is the folder writable?)", path.display()))?;
            match file.try_lock() {
                // A holder that let go removed the name first: only a locked file still under
                // its name is a claim.
                Ok(()) if same_inode(&file, &path) => return Ok(Some(Claim { path, _file: file })),
                Ok(()) => continue,
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(e)) => {
                    bail!("cannot lock {} ({e})", path.display())
                }
            }
        }
        bail!("cannot take the claim {}: it keeps changing", path.display())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // The name goes first, then the lock (with the file): a process that opens the name
        // afterwards makes a new claim.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `path` still names the file open as `file`.
fn same_inode(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The prefix and suffix of `output`'s partial files, for [`remove_stale`].
pub(crate) fn partial_pattern(output: &Path) -> (String, String) {
    let name = output
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let ext = output
        .extension()
        .map_or(String::new(), |e| format!(".{}", e.to_string_lossy()));
    (format!(".{name}.partial-"), ext)
}

/// Removes the files in `dir` named `PREFIX...SUFFIX` that no live writer holds: what a
/// crashed or killed run left half-written. A file whose lock is held (a run in flight, here or
/// on another machine sharing the folder) is kept.
pub(crate) fn remove_stale(dir: &Path, prefix: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(prefix) && name.ends_with(suffix) && name.len() > prefix.len() + suffix.len()) {
            continue;
        }
        let path = e.path();
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        if file.try_lock().is_err() {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!(file = %path.display(), "removed a stale partial file"),
            Err(err) => tracing::warn!(file = %path.display(), "cannot remove a stale partial file: {err}"),
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

/// Whether a file name holds a printf-style number pattern (`%d`, `%03d`) that FFmpeg's image
/// muxers and demuxers would expand into a sequence of files.
pub(crate) fn has_sequence_pattern(path: &Path) -> bool {
    let name = path
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let mut rest = name.as_str();
    while let Some(i) = rest.find('%') {
        let after = &rest[i + 1..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        if after[digits..].starts_with('d') {
            return true;
        }
        rest = after;
    }
    false
}

/// Refuses a name FFmpeg would read as an image-sequence pattern (`what`: input or output).
pub(crate) fn check_not_pattern(path: &Path, what: &str) -> Result<()> {
    if has_sequence_pattern(path) {
        bail!(
            "{what} {} looks like an image-sequence pattern (`%d`): gpen-video reads and writes single video files; rename it without `%`",
            path.display()
        );
    }
    Ok(())
}

/// Accepts or refuses OUT for a job reading `input` and encoding with `s`: the one place that
/// decides, called by a run, `batch` and `bench` (through `Settings::job`) before any work. The
/// settings themselves (codec, crf, quality) were checked once by [`crate::media::encode::check_encoder`].
pub(crate) fn accept_output(input: &Path, output: &Path, s: &EncodeSettings) -> Result<()> {
    check_path(input, output)?;
    if is_still(output) {
        check_still(output)
    } else {
        check_video(s, output)
    }
}

/// A still output: this FFmpeg has the encoder its extension needs.
fn check_still(path: &Path) -> Result<()> {
    crate::init_ffmpeg();
    let Some(name) = still_encoder(path) else {
        bail!("output {} is not a still image gpen-video writes", path.display());
    };
    if encoder::find_by_name(name).is_none() {
        bail!(
            "output {}: this FFmpeg build has no {name} encoder; choose a .png or .jpg output",
            path.display()
        );
    }
    Ok(())
}

/// A video output: OUT's container can hold the video `s` encodes, naming what to do if not.
fn check_video(s: &EncodeSettings, output: &Path) -> Result<()> {
    if let Some(q) = s.quality {
        // Said once per process: a batch over a folder of stills and videos uses it for the
        // stills.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "--quality {q} applies to JPEG and WebP pictures, not to videos such as {}: a video's quality is set by --crf (and --preset)",
                output.display().to_string().escape_debug()
            );
        });
    }
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    let name = codec_for(s, ext);
    let Some(c) = encoder::find_by_name(&name) else {
        bail!("video encoder `{name}` is not available in this FFmpeg build");
    };
    if container_takes(ext, c.id()) == Some(false) {
        let hint = if ext.eq_ignore_ascii_case("webm") {
            format!("use --codec {} (WebM holds VP8, VP9 and AV1)", WEBM_CODECS[0])
        } else {
            format!(
                "choose another --codec, or a .{} output",
                container_for(c.id()).unwrap_or("mkv")
            )
        };
        bail!(
            "output {}: a .{ext} file cannot hold {name}'s video ({:?}); {hint}",
            output.display(),
            c.id()
        );
    }
    Ok(())
}

/// OUT as a path: not the input, in an existing writable folder, with a container FFmpeg
/// knows; a still image for a still input and a video for a video input.
fn check_path(input: &Path, output: &Path) -> Result<()> {
    if output.as_os_str().is_empty() {
        bail!("no output file given");
    }
    check_not_pattern(output, "output")?;
    if same_file(input, output) || input == output {
        bail!(
            "output {} is the input file: choose another output path (the input is never overwritten)",
            output.display()
        );
    }
    if output.file_name().is_none() {
        bail!("output {} is not a file path", output.display());
    }
    check_folder(&folder_of(output), "output")?;
    if output.is_dir() {
        bail!(
            "output {} is a folder: give a file name such as out.mp4",
            output.display()
        );
    }
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    if is_other_image(output) {
        bail!(
            "output {}: gpen-video does not write .{ext} images; use .png, .jpg, .webp, .tiff or .bmp",
            output.display()
        );
    }
    match (is_still_input(input), is_still(output)) {
        (false, true) => bail!(
            "input {} is a video and output {} a still image: give a video output such as out.mp4 (to restore one frame, extract it first: ffmpeg -i {} -frames:v 1 frame.png)",
            input.display(),
            output.display(),
            input.display()
        ),
        (true, false) => bail!(
            "input {} is a still image and output {} is not: give an image output such as out.png or out.jpg",
            input.display(),
            output.display()
        ),
        (true, true) => return Ok(()),
        (false, false) => {}
    }
    if ext.is_empty() || !container_known(ext) {
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

/// A file being written under a temporary name beside its final path ([`Partial`]);
/// [`PendingFile::commit`] renames it into place, and dropping it uncommitted removes it.
pub(crate) struct PendingFile {
    path: PathBuf,
    partial: Option<Partial>,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl PendingFile {
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let partial = Partial::beside(path)?;
        let file = partial
            .file()
            .try_clone()
            .with_context(|| format!("cannot write {}", partial.path().display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            partial: Some(partial),
            file: Some(std::io::BufWriter::new(file)),
        })
    }

    /// Flushes the file and moves it into place.
    pub(crate) fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("not committed yet");
        let file = file
            .into_inner()
            .map_err(|e| anyhow!("writing {}: {}", self.path.display(), e.error()))?;
        file.sync_all()
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.partial.take().expect("not committed yet").rename_to(&self.path)
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
        self.file.take();
        if let Some(p) = self.partial.take() {
            p.discard();
        }
    }
}

/// What identifies an input file's content cheaply: size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Stamp {
    pub(crate) size: u64,
    pub(crate) mtime_ns: i64,
}

impl Stamp {
    pub(crate) fn of(path: &Path) -> Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).with_context(|| format!("cannot read input {}", path.display()))?;
        Ok(Stamp {
            size: m.len(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec()),
        })
    }
}

/// Bytes of the files under `dir` (none where it cannot be read).
pub fn bytes_under(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_is_accepted_or_refused_in_one_place() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.mp4");
        std::fs::write(&input, b"x").unwrap();
        let (video, still) = (EncodeSettings::default(), dir.path().join("in.png"));
        accept_output(&input, &dir.path().join("out.mkv"), &video).unwrap();
        let refused =
            |out: &str, s: &EncodeSettings| accept_output(&input, &dir.path().join(out), s).unwrap_err().to_string();
        assert!(refused("in.mp4", &video).contains("is the input file"));
        assert!(refused("out.png", &video).contains("is a video and output"));
        assert!(refused("out.gif", &video).contains("does not write .gif"));
        assert!(refused("out.xyz", &video).contains("cannot tell the container"));
        let vp9 = EncodeSettings {
            codec: Some("mpeg4".into()),
            ..Default::default()
        };
        assert!(refused("out.webm", &vp9).contains("cannot hold mpeg4"));
        std::fs::write(&still, b"x").unwrap();
        let q = |quality| EncodeSettings {
            quality: Some(quality),
            ..Default::default()
        };
        accept_output(&still, &dir.path().join("out.jpg"), &q(100)).unwrap();
        crate::media::encode::check_encoder(&q(100)).unwrap();
        for bad in [0, 101] {
            let e = crate::media::encode::check_encoder(&q(bad)).unwrap_err().to_string();
            assert!(e.contains("--quality") && e.contains("out of range"), "{e}");
        }
    }

    #[test]
    fn partials_are_hidden_beside_the_output_unique_and_locked() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("clip.mp4");
        let (a, b) = (Partial::beside(&out).unwrap(), Partial::beside(&out).unwrap());
        assert_ne!(a.path(), b.path(), "two writers never share a name");
        let name = a.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".clip.mp4.partial-") && name.ends_with(".mp4"),
            "{name}"
        );
        assert_eq!(a.path().parent(), Some(dir.path()));
        let other = std::fs::File::open(a.path()).unwrap();
        assert!(other.try_lock().is_err(), "held by its writer");
        a.rename_to(&out).unwrap();
        assert!(out.exists());
        b.discard();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(Partial::beside(Path::new("/")).is_err());
    }

    #[test]
    fn sequence_patterns_are_recognised() {
        for p in ["out%d.mp4", "a%03d.jpg", "x/%5d", "50%%d.mkv"] {
            assert!(has_sequence_pattern(Path::new(p)), "{p}");
        }
        for p in ["out.mp4", "100%.mp4", "a%x.mkv", "%/o.mp4"] {
            assert!(!has_sequence_pattern(Path::new(p)), "{p}");
        }
    }

    #[test]
    fn only_unlocked_old_partials_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("v.mkv");
        let (prefix, suffix) = partial_pattern(&out);
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let dead = dir.path().join(format!("{prefix}0123456789abcdef{suffix}"));
        std::fs::File::create(&dead).unwrap().set_modified(old).unwrap();
        let live = Partial::beside(&out).unwrap();
        live.file().set_modified(old).unwrap();
        let unrelated = dir.path().join(".v.mkv.notes");
        std::fs::File::create(&unrelated).unwrap().set_modified(old).unwrap();
        remove_stale(dir.path(), &prefix, &suffix);
        assert!(!dead.exists(), "a dead run's file is removed");
        assert!(live.path().exists(), "a live run's file is kept");
        assert!(unrelated.exists());
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
