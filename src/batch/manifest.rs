//! The batch manifest: in, each clip a batch finished (its input's size and mtime, the settings
//! hash, the output's size); out, a JSON file in OUT_DIR, replaced atomically after every clip,
//! that a rerun reads to skip finished clips and to redo those whose input or settings changed.
//!
//! Each process writes only its own file (`.gpen-video-manifest.json`, or
//! `.gpen-video-manifest.shard-K-of-N.json` for a shard) and reads them all, so concurrent
//! shards never write the same file and a change of the shard count redoes nothing. Unsharded
//! processes running at once share theirs: each save merges what is on disk first, under a
//! lock ([`Manifest::save_shared`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};

use crate::batch::clips::Shard;

const PREFIX: &str = ".gpen-video-manifest";
const VERSION: u32 = 1;

/// One finished clip.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) input_size: u64,
    /// Input modification time, nanoseconds since the Unix epoch.
    pub(crate) input_mtime_ns: i64,
    /// [`settings_hash`] of the run that made the output.
    pub(crate) settings: String,
    pub(crate) output_size: u64,
    /// The output's modification time when it was recorded, nanoseconds since the Unix epoch:
    /// an output changed in place at the same size (zeroed, overwritten) is no longer vouched
    /// for. Absent in manifests written before it was recorded (their size alone vouches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) output_mtime_ns: Option<i64>,
    /// When the output was moved into place, milliseconds since the Unix epoch.
    pub(crate) finished_unix_ms: u64,
}

/// One process's record of finished clips, by relative path (`/`-separated).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) version: u32,
    /// `K/N` for a shard's manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shard: Option<String>,
    pub(crate) clips: BTreeMap<String, Entry>,
}

pub(crate) use crate::output::Stamp;

/// The manifest file this process writes in `out_dir`.
pub(crate) fn path_for(out_dir: &Path, shard: Option<Shard>) -> PathBuf {
    out_dir.join(match shard {
        None => format!("{PREFIX}.json"),
        Some(s) => format!("{PREFIX}.shard-{}-of-{}.json", s.index, s.count),
    })
}

impl Manifest {
    pub(crate) fn new(shard: Option<Shard>) -> Self {
        Manifest {
            version: VERSION,
            shard: shard.map(|s| s.to_string()),
            clips: BTreeMap::new(),
        }
    }

    /// Reads a manifest; a missing file is an empty one.
    pub(crate) fn load(path: &Path) -> Result<Option<Manifest>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("manifest {} is not valid", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow!("cannot read manifest {}: {e}", path.display())),
        }
    }

    /// Every manifest in `out_dir` (all shards' and the unsharded one). One that cannot be read
    /// is left out with a warning: its clips are redone rather than trusted.
    pub(crate) fn load_all(out_dir: &Path) -> Result<Vec<(PathBuf, Manifest)>> {
        let mut found = Vec::new();
        let entries = match std::fs::read_dir(out_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(anyhow!("cannot read {}: {e}", out_dir.display())),
        };
        for entry in entries {
            let path = entry?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !(name.starts_with(PREFIX) && name.ends_with(".json")) {
                continue;
            }
            match Manifest::load(&path) {
                Ok(Some(m)) => found.push((path, m)),
                Ok(None) => {}
                Err(e) => tracing::warn!("{e:#}; its clips will be redone"),
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }

    /// [`Manifest::save`] for a file other processes may write too (concurrent batches over
    /// the same folders without shards): under a lock beside it, the entries on disk that this
    /// one lacks, or holds older, are taken in first, so no process drops another's clips.
    pub(crate) fn save_shared(&mut self, path: &Path) -> Result<()> {
        let mut lock_name = path.file_name().unwrap_or_default().to_os_string();
        lock_name.push(".lock");
        let lock_path = path.with_file_name(lock_name);
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .with_context(|| format!("cannot write manifest {}", path.display()))?;
        lock.lock()
            .with_context(|| format!("cannot lock {}", lock_path.display()))?;
        if let Ok(Some(disk)) = Manifest::load(path) {
            for (key, theirs) in disk.clips {
                match self.clips.get(&key) {
                    Some(mine) if mine.finished_unix_ms >= theirs.finished_unix_ms => {}
                    _ => {
                        self.clips.insert(key, theirs);
                    }
                }
            }
        }
        self.save(path)
    }

    /// Writes the manifest to `path` atomically: a temporary file beside it, flushed to disk,
    /// renamed over the old one, and the folder flushed, so a crash leaves the old or the new.
    pub(crate) fn save(&self, path: &Path) -> Result<()> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let partial = crate::output::Partial::beside(path)
            .with_context(|| format!("cannot write manifest {}", path.display()))?;
        let write = |f: &std::fs::File| -> std::io::Result<()> {
            let mut f = f;
            f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
            f.write_all(b"\n")?;
            f.sync_all()
        };
        if let Err(e) = write(partial.file()) {
            partial.discard();
            return Err(anyhow!("cannot write manifest {}: {e}", path.display()));
        }
        partial.rename_to(path)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| anyhow!("cannot write manifest {}: {e}", path.display()))
    }
}

/// Whether some manifest records `key` as finished after `unix_ms`.
pub(crate) fn finished_after(manifests: &[(PathBuf, Manifest)], key: &str, unix_ms: u64) -> bool {
    manifests
        .iter()
        .any(|(_, m)| m.clips.get(key).is_some_and(|e| e.finished_unix_ms > unix_ms))
}

/// Whether some manifest vouches for `output` as the finished result of `key`: an entry with
/// the same input stamp and settings, and the output file there with the recorded size and
/// modification time.
pub(crate) fn vouched(
    manifests: &[(PathBuf, Manifest)],
    key: &str,
    input: Stamp,
    settings: &str,
    output: &Path,
) -> bool {
    let out = match std::fs::metadata(output) {
        Ok(m) if m.is_file() => Stamp {
            size: m.len(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec()),
        },
        _ => return false,
    };
    manifests.iter().filter_map(|(_, m)| m.clips.get(key)).any(|e| {
        e.input_size == input.size
            && e.input_mtime_ns == input.mtime_ns
            && e.settings == settings
            && e.output_size == out.size
            && e.output_mtime_ns.is_none_or(|t| t == out.mtime_ns)
    })
}

/// Version of what [`settings_hash`] hashes: a new version redoes every clip once. 2: the
/// whole [`Recipe`] as JSON (before, a hand-written list that missed `--max-faces`).
pub use crate::config::settings_hash;

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Recipe;

    #[test]
    fn the_settings_hash_covers_the_model_file_and_takes_any_path() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"m\xff.onnx"));
        std::fs::write(&odd, b"1").unwrap();
        let recipe = |model: &Path| Recipe {
            model: crate::config::Asset(model.to_path_buf()),
            detector: crate::config::Asset(dir.path().join("missing.onnx")),
            mesh: None,
            identity: None,
            quality: None,
            hands: None,
            template: None,
            treatment: Default::default(),
        };
        let before = settings_hash(&recipe(&odd));
        assert_eq!(before.len(), 32);
        std::fs::write(&odd, b"12").unwrap();
        assert_ne!(
            before,
            settings_hash(&recipe(&odd)),
            "a replaced model file redoes clips"
        );
    }

    fn entry(stamp: Stamp, settings: &str, output_size: u64) -> Entry {
        Entry {
            input_size: stamp.size,
            input_mtime_ns: stamp.mtime_ns,
            settings: settings.into(),
            output_size,
            output_mtime_ns: None,
            finished_unix_ms: 1,
        }
    }

    #[test]
    fn a_saved_manifest_loads_back_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(dir.path(), None);
        assert!(Manifest::load(&path).unwrap().is_none(), "missing is empty");
        let mut m = Manifest::new(None);
        let stamp = Stamp { size: 10, mtime_ns: 20 };
        m.clips.insert("a/b.mp4".into(), entry(stamp, "s", 5));
        m.save(&path).unwrap();
        let back = Manifest::load(&path).unwrap().unwrap();
        assert_eq!(back.clips, m.clips);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, b"{not json").unwrap();
        let e = Manifest::load(&path).unwrap_err().to_string();
        assert!(e.contains("is not valid"), "{e}");
    }

    #[test]
    fn shards_write_their_own_files_and_every_one_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard { index: 1, count: 3 };
        let own = path_for(dir.path(), Some(shard));
        assert!(own
            .to_string_lossy()
            .ends_with(".gpen-video-manifest.shard-1-of-3.json"));
        Manifest::new(Some(shard)).save(&own).unwrap();
        Manifest::new(None).save(&path_for(dir.path(), None)).unwrap();
        std::fs::write(dir.path().join(".gpen-video-manifest.broken.json"), b"[").unwrap();
        std::fs::write(dir.path().join("other.json"), b"{}").unwrap();
        let all = Manifest::load_all(dir.path()).unwrap();
        assert_eq!(all.len(), 2, "the broken one is left out, other files ignored");
    }

    #[test]
    fn a_clip_is_vouched_for_only_with_the_same_input_settings_and_output() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.mp4");
        std::fs::write(&out, b"12345").unwrap();
        let stamp = Stamp { size: 10, mtime_ns: 20 };
        let mut m = Manifest::new(None);
        m.clips.insert("c.mp4".into(), entry(stamp, "s", 5));
        let all = vec![(PathBuf::from("m"), m)];
        assert!(vouched(&all, "c.mp4", stamp, "s", &out));
        assert!(!vouched(&all, "other.mp4", stamp, "s", &out));
        assert!(
            !vouched(&all, "c.mp4", Stamp { size: 11, ..stamp }, "s", &out),
            "input changed"
        );
        assert!(
            !vouched(&all, "c.mp4", Stamp { mtime_ns: 21, ..stamp }, "s", &out),
            "input touched"
        );
        assert!(!vouched(&all, "c.mp4", stamp, "t", &out), "settings changed");
        std::fs::write(&out, b"1234").unwrap();
        assert!(!vouched(&all, "c.mp4", stamp, "s", &out), "output changed");
        assert!(
            !vouched(&all, "c.mp4", stamp, "s", &dir.path().join("gone.mp4")),
            "output gone"
        );
    }
}
