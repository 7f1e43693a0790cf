//! Which clips a batch runs: in, an input folder, `--glob` patterns and a `--shard K/N` (or the
//! scheduler's environment); out, the sorted relative paths of the videos and still images
//! this process owns, and the files it left out as neither.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use walkdir::WalkDir;

/// Extensions (lower case) taken as videos; any other file is listed as skipped.
pub(crate) const VIDEO_EXTENSIONS: [&str; 14] = [
    "mp4", "mkv", "mov", "avi", "webm", "m4v", "mpg", "mpeg", "ts", "mts", "m2ts", "wmv", "flv", "3gp",
];

/// A file under the input folder.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Clip {
    /// Relative path with `/` separators: the manifest key and the sort and shard key.
    pub(crate) key: String,
    /// The same relative path, as the file system spells it.
    pub(crate) rel: PathBuf,
}

/// What a scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Videos and stills, sorted by key.
    pub(crate) clips: Vec<Clip>,
    /// Files matching the patterns whose extension is neither a video's nor a still's, sorted.
    pub(crate) not_video: Vec<String>,
}

pub(crate) fn is_video(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| VIDEO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Whether a batch runs `path`: a video, or a still image (written as the same kind of image).
pub(crate) fn is_clip(path: &Path) -> bool {
    is_video(path) || crate::media::still::is_still(path)
}

/// Lists the files under `dir` (and its subfolders with `recursive`), leaving out hidden files
/// and folders (names starting with `.`, such as partial outputs and manifests) and the folder
/// `exclude` (the output folder, when it lies inside the input). A pattern without `/` is
/// matched against the file name, one with `/` against the relative path; a file matching none
/// of `globs` (when some are given) is left out silently. A symbolic link to a file outside
/// `dir` is left out with a warning unless `follow_out` (on a shared upload folder a link can
/// name anyone's file).
pub(crate) fn scan(
    dir: &Path,
    (recursive, follow_out): (bool, bool),
    globs: &[String],
    exclude: Option<&Path>,
) -> Result<Scan> {
    let exclude = exclude.and_then(|p| p.canonicalize().ok());
    let root = dir.canonicalize().ok();
    let (by_name, by_path) = patterns(globs)?;
    let mut scan = Scan::default();
    // Symbolic links count as what they point to, but linked folders are not entered.
    let walk = WalkDir::new(dir)
        .min_depth(1)
        .max_depth(if recursive { usize::MAX } else { 1 })
        .follow_links(false)
        .into_iter()
        .filter_entry(|e| {
            let hidden = e.file_name().to_string_lossy().starts_with('.');
            let excluded = e.file_type().is_dir() && exclude.is_some() && e.path().canonicalize().ok() == exclude;
            !hidden && !excluded
        });
    for entry in walk {
        let entry = entry.map_err(|e| {
            let at = e.path().unwrap_or(dir).display().to_string();
            anyhow!("reading folder {at}: {e}")
        })?;
        let is_file = if entry.path_is_symlink() {
            std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file())
        } else {
            entry.file_type().is_file()
        };
        if !is_file {
            continue;
        }
        if entry.path_is_symlink() && !follow_out {
            let target = entry.path().canonicalize().ok();
            let inside = matches!((&target, &root), (Some(t), Some(r)) if t.starts_with(r));
            if !inside {
                tracing::warn!(
                    "skipping {}: a link to a file outside the input folder (--follow-links-out takes it)",
                    entry.path().display().to_string().escape_debug()
                );
                continue;
            }
        }
        let rel = entry.path().strip_prefix(dir).unwrap_or(entry.path()).to_path_buf();
        let key = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        let wanted = globs.is_empty() || by_name.is_match(entry.file_name()) || by_path.is_match(&key);
        if !wanted {
            continue;
        }
        if is_clip(&rel) {
            scan.clips.push(Clip { key, rel });
        } else {
            scan.not_video.push(key);
        }
    }
    scan.clips.sort();
    scan.not_video.sort();
    Ok(scan)
}

/// `--glob` patterns as two sets: those without `/` (matched against a file's name) and those
/// with (matched against its relative path). Shell-style: `*` any run of characters but `/`,
/// `?` one character, `[abc]`, `[a-z]` and `[!a]` one of a set. An invalid pattern is an error
/// that names it.
fn patterns(globs: &[String]) -> Result<(GlobSet, GlobSet)> {
    let (mut by_name, mut by_path) = (GlobSetBuilder::new(), GlobSetBuilder::new());
    for g in globs {
        let glob = GlobBuilder::new(g)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| anyhow!("--glob `{g}` is not a valid pattern: {}", e.kind()))?;
        if g.contains('/') { &mut by_path } else { &mut by_name }.add(glob);
    }
    Ok((by_name.build()?, by_path.build()?))
}

/// Whether `text` matches the shell-style `pattern` (see [`patterns`]).
#[cfg(test)]
fn glob_match(pattern: &str, text: &str) -> bool {
    let (by_name, by_path) = patterns(&[pattern.to_string()]).expect("valid pattern");
    by_name.is_match(text) || by_path.is_match(text)
}

/// FNV-1a, 64 bits: a hash that is the same on every machine and every run.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// This process's share of the clips: those whose key hashes to `index` modulo `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shard {
    pub(crate) index: usize,
    pub(crate) count: usize,
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    pub(crate) fn owns(&self, clip: &Clip) -> bool {
        fnv1a64(clip.key.as_bytes()) % self.count as u64 == self.index as u64
    }

    /// Whether segment `number` of a long clip is this shard's: a long clip's segments are
    /// dealt out to every shard in turn, starting with the shard that owns the clip.
    pub(crate) fn owns_segment(&self, clip_key: &str, number: usize) -> bool {
        (fnv1a64(clip_key.as_bytes()) + number as u64) % self.count as u64 == self.index as u64
    }

    /// Parses `K/N` (0-based K), or `auto`: K from `JOB_COMPLETION_INDEX` (Kubernetes Indexed
    /// Jobs) or `SLURM_ARRAY_TASK_ID` (Slurm job arrays numbered from 0), N from `count`
    /// (`--shard-count`), else `JOB_COMPLETIONS` or `SLURM_ARRAY_TASK_COUNT`. `env` reads a
    /// variable (`std::env::var` outside tests).
    pub(crate) fn parse(spec: &str, count: Option<usize>, env: impl Fn(&str) -> Option<String>) -> Result<Shard> {
        let num = |name: &str, v: &str| -> Result<usize> {
            v.trim()
                .parse::<usize>()
                .with_context(|| format!("{name}=`{v}` is not a whole number"))
        };
        // Per scheduler: the task's index variable, its count variable, and where that comes from.
        const SCHEDULERS: [(&str, &str, &str); 2] = [
            ("JOB_COMPLETION_INDEX", "JOB_COMPLETIONS", "the Job's .spec.completions"),
            (
                "SLURM_ARRAY_TASK_ID",
                "SLURM_ARRAY_TASK_COUNT",
                "set by Slurm for job arrays",
            ),
        ];
        let (index, count) = if spec == "auto" {
            let Some((var, i, count_var, hint)) = SCHEDULERS
                .iter()
                .find_map(|&(var, count_var, hint)| env(var).map(|i| (var, i, count_var, hint)))
            else {
                bail!(
                    "--shard auto: neither JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) nor SLURM_ARRAY_TASK_ID (a Slurm job array) is set; give --shard K/N instead"
                );
            };
            let n = match (count, env(count_var)) {
                (Some(n), _) => n,
                (None, Some(v)) => num(count_var, &v)?,
                (None, None) => bail!(
                    "--shard auto: {var} is set but not the number of shards: pass --shard-count N or set {count_var} ({hint})"
                ),
            };
            (num(var, &i)?, n)
        } else {
            let (k, n) = spec
                .split_once('/')
                .with_context(|| format!("--shard `{spec}`: use K/N (0-based, e.g. 0/4) or auto"))?;
            if count.is_some() {
                bail!("--shard-count goes with --shard auto; --shard K/N already gives the count");
            }
            (num("--shard K", k)?, num("--shard N", n)?)
        };
        if count == 0 || index >= count {
            bail!(
                "shard {index}/{count}: need N >= 1 and 0 <= K < N (K counts from 0; a job array must be numbered 0..N-1, and one task rerun alone needs --shard-count N)"
            );
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*.mp4", "a.mp4"));
        assert!(!glob_match("*.mp4", "a.mkv"));
        assert!(!glob_match("*.mp4", "d/a.mp4"));
        assert!(glob_match("d/*.mp4", "d/a.mp4"));
        assert!(glob_match("clip-??.m[kp][v4]", "clip-07.mp4"));
        assert!(glob_match("[!x]*", "a"));
        assert!(!glob_match("[!x]*", "x"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        let e = patterns(&["[a-".to_string()]).unwrap_err().to_string();
        assert!(e.contains("--glob `[a-` is not a valid pattern"), "{e}");
    }

    #[test]
    fn shards() {
        let none = |_: &str| None;
        assert_eq!(Shard::parse("1/3", None, none).unwrap(), Shard { index: 1, count: 3 });
        assert!(Shard::parse("3/3", None, none).is_err());
        assert!(Shard::parse("0/0", None, none).is_err());
        assert!(Shard::parse("auto", None, none).is_err());
        let k8s = |v: &str| (v == "JOB_COMPLETION_INDEX").then(|| "2".to_string());
        assert!(Shard::parse("auto", None, k8s).is_err());
        assert_eq!(
            Shard::parse("auto", Some(4), k8s).unwrap(),
            Shard { index: 2, count: 4 }
        );
        let slurm = |v: &str| match v {
            "SLURM_ARRAY_TASK_ID" => Some("5".to_string()),
            "SLURM_ARRAY_TASK_COUNT" => Some("6".to_string()),
            _ => None,
        };
        assert_eq!(Shard::parse("auto", None, slurm).unwrap(), Shard { index: 5, count: 6 });
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        // Every clip lands in exactly one shard.
        let clips: Vec<Clip> = (0..50)
            .map(|i| Clip {
                key: format!("d/c{i}.mp4"),
                rel: PathBuf::from(format!("d/c{i}.mp4")),
            })
            .collect();
        for c in &clips {
            let owners = (0..3).filter(|&k| Shard { index: k, count: 3 }.owns(c)).count();
            assert_eq!(owners, 1);
        }
    }
}
