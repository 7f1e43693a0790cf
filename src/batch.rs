//! `gpen-video batch`: in, a folder of videos (IN_DIR), the run options and this process's
//! shard; out, the restored videos mirrored under OUT_DIR, a manifest there of finished clips,
//! a summary on stderr, an optional JSON report and an exit code (0 all done, 1 some failed,
//! 130 interrupted).
//!
//! Clips are run by `jobs` worker threads (one per GPU on CUDA), each with its own `Plan`
//! (sessions), reused from clip to clip while the detection size stays the same. A clip's output
//! appears under its final name only when complete (the pipeline renames its partial file), and
//! the manifest is replaced atomically after each clip, so a crash at any moment leaves every
//! output either complete and vouched for, or redone by the next run. Ctrl-C once: the clips in
//! flight finish and no new one starts; twice: they are cancelled. See `clips` for which files
//! are clips and how shards split them, `manifest` for what "finished" means.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbeam_channel::{unbounded, RecvTimeoutError};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::batch_job::{file_name, lock, worker, Shared};
pub use crate::batch_report::{ClipDone, ClipNote, Report};
use crate::clips::{self, Shard};
use crate::interrupt::Interrupts;
use crate::manifest::{self, Manifest, Stamp};
use crate::plan::{Device, Options};

/// After a hard stop, how long to wait for cancelled clips to wind down before leaving them.
const HARD_STOP_GRACE: Duration = Duration::from_secs(10);

/// What a batch run was asked to do.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub in_dir: PathBuf,
    pub out_dir: PathBuf,
    pub recursive: bool,
    /// Only files matching one of these (shell wildcards); all files when empty.
    pub globs: Vec<String>,
    /// Clips run at once (default: 1 on CPU, one per GPU on CUDA).
    pub jobs: Option<usize>,
    /// Redo every clip, finished or not.
    pub force: bool,
    pub report: Option<PathBuf>,
    /// `K/N` or `auto`.
    pub shard: Option<String>,
    /// Number of shards for `--shard auto` when the environment does not say.
    pub shard_count: Option<usize>,
    /// No progress bars.
    pub quiet: bool,
    /// Settings for every clip; `input` and `output` are set per clip.
    pub base: Options,
}

/// Runs the batch. Fails only for problems with the batch as a whole (folders, options); a clip
/// that fails is listed in the report and the others go on.
pub fn run(o: &BatchOptions, ints: &Interrupts) -> Result<Report> {
    if !o.in_dir.is_dir() {
        bail!("input folder {} does not exist or is not a folder", o.in_dir.display());
    }
    std::fs::create_dir_all(&o.out_dir)
        .with_context(|| format!("cannot create output folder {}", o.out_dir.display()))?;
    if o.in_dir.canonicalize()? == o.out_dir.canonicalize()? {
        bail!("OUT_DIR is IN_DIR: choose another output folder (inputs are never overwritten)");
    }
    let shard = match &o.shard {
        Some(spec) => Some(Shard::parse(spec, o.shard_count, |v| std::env::var(v).ok())?),
        None if o.shard_count.is_some() => bail!("--shard-count goes with --shard auto"),
        None => None,
    };
    let scan = clips::scan(&o.in_dir, o.recursive, &o.globs, Some(&o.out_dir))?;
    let settings = manifest::settings_hash(&o.base);
    let own_path = manifest::path_for(&o.out_dir, shard);
    crate::plan::remove_stale(&o.out_dir, &format!("{}.tmp-", file_name(&own_path)), "");
    let own = match Manifest::load(&own_path) {
        Ok(m) => m.unwrap_or_else(|| Manifest::new(shard)),
        Err(e) => {
            tracing::warn!("{e:#}; starting a new one");
            Manifest::new(shard)
        }
    };
    let all = Manifest::load_all(&o.out_dir)?;

    let mut report = Report {
        in_dir: o.in_dir.clone(),
        out_dir: o.out_dir.clone(),
        shard: shard.map(|s| s.to_string()),
        manifest: own_path.clone(),
        settings: settings.clone(),
        not_video: scan.not_video,
        ..Default::default()
    };
    let mut todo = VecDeque::new();
    for clip in scan.clips {
        if shard.is_some_and(|s| !s.owns(&clip)) {
            report.other_shards += 1;
            continue;
        }
        let stamp = match Stamp::of(&o.in_dir.join(&clip.rel)) {
            Ok(s) => s,
            Err(e) => {
                report.failed.push(ClipNote::new(&clip.key, format!("{e:#}")));
                continue;
            }
        };
        if !o.force && manifest::vouched(&all, &clip.key, stamp, &settings, &o.out_dir.join(&clip.rel)) {
            report
                .skipped
                .push(ClipNote::new(&clip.key, "finished earlier (manifest)".into()));
        } else {
            todo.push_back(clip);
        }
    }
    let devices = job_devices(&o.base.device, o.jobs, todo.len())?;
    report.jobs = devices.len();
    let mut base = o.base.clone();
    if matches!(base.device, Device::Cpu(_)) && base.threads.is_none() && devices.len() > 1 {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        base.threads = Some((cores / devices.len()).max(1));
    }
    if !report.not_video.is_empty() {
        eprintln!(
            "skipping {} file(s) that are not videos by extension: {}",
            report.not_video.len(),
            report.not_video.join(", ")
        );
    }
    eprintln!(
        "batch{}: {} clip(s) to do, {} finished earlier{}; {} job(s)",
        shard.map_or(String::new(), |s| format!(" shard {s}")),
        todo.len(),
        report.skipped.len(),
        if shard.is_some() {
            format!(", {} for other shards", report.other_shards)
        } else {
            String::new()
        },
        devices.len()
    );

    let visible = !o.quiet && std::io::stderr().is_terminal();
    let mp = MultiProgress::with_draw_target(if visible {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let frames: u64 = if visible {
        todo.iter().map(|c| estimate(&o.in_dir.join(&c.rel), &base)).sum()
    } else {
        0
    };
    let overall = mp.add(ProgressBar::new(frames));
    overall.set_style(
        ProgressStyle::with_template(
            "{prefix:>8} [{elapsed_precise}] {wide_bar} {pos}/{len} frames {per_sec} ETA {eta} {msg}",
        )
        .expect("valid template"),
    );
    overall.set_prefix("all");
    overall.set_message(format!("0/{} clips", todo.len()));

    let shared = Arc::new(Shared {
        in_dir: o.in_dir.clone(),
        out_dir: o.out_dir.clone(),
        base,
        settings,
        ints: ints.clone(),
        todo: todo.len(),
        queue: Mutex::new(todo),
        own: Mutex::new(own),
        own_path,
        in_flight: Mutex::default(),
        done: Mutex::default(),
        failed: Mutex::default(),
        cancelled: Mutex::default(),
        finished: AtomicUsize::new(0),
        overall,
        mp,
        visible,
    });
    let (alive_tx, alive_rx) = unbounded::<()>();
    for (i, device) in devices.into_iter().enumerate() {
        let bar = shared.mp.add(ProgressBar::new(0));
        bar.set_style(ProgressStyle::with_template("{prefix:>8} {bar:40} {pos}/{len} {msg}").expect("valid template"));
        bar.set_prefix(match &device {
            Device::Cuda(ids) => format!("cuda:{}", ids[0]),
            Device::Cpu(_) => format!("job {i}"),
        });
        let (shared, alive) = (shared.clone(), alive_tx.clone());
        std::thread::Builder::new()
            .name(format!("batch-job-{i}"))
            .spawn(move || worker(&shared, device, bar, alive))
            .context("starting a batch job thread")?;
    }
    drop(alive_tx);

    // Wait for the jobs, telling the user what an interrupt does.
    let (mut soft_seen, mut hard_at) = (false, None::<Instant>);
    loop {
        if let Err(RecvTimeoutError::Disconnected) = alive_rx.recv_timeout(Duration::from_millis(100)) {
            break;
        }
        if !soft_seen && ints.requested() {
            soft_seen = true;
            let n = lock(&shared.in_flight).len();
            shared.log(format!(
                "interrupted: finishing {n} clip(s) in flight and starting no new one; press Ctrl-C again to stop at once"
            ));
        }
        if hard_at.is_none() && ints.hard_requested() {
            hard_at = Some(Instant::now());
            shared.log("stopping now: cancelling the clips in flight".into());
        }
        if hard_at.is_some_and(|t| t.elapsed() > HARD_STOP_GRACE) {
            shared.log("clips still stopping; leaving them (their partial files are removed by the next run)".into());
            break;
        }
    }
    shared.overall.finish_and_clear();

    report.interrupted = ints.requested();
    report.done = std::mem::take(&mut *lock(&shared.done));
    report.failed.append(&mut lock(&shared.failed));
    report.cancelled = std::mem::take(&mut *lock(&shared.cancelled));
    for key in std::mem::take(&mut *lock(&shared.in_flight)) {
        if ints.hard_requested() {
            report.cancelled.push(key);
        } else {
            report
                .failed
                .push(ClipNote::new(&key, "its job stopped unexpectedly".into()));
        }
    }
    report.not_started = lock(&shared.queue).drain(..).map(|c| c.key).collect();
    report.print_summary();
    if let Some(path) = &o.report {
        let json = serde_json::to_string_pretty(&report)? + "\n";
        std::fs::write(path, json).with_context(|| format!("writing report {}", path.display()))?;
    }
    Ok(report)
}

/// One job per CPU run unless asked; on CUDA one per GPU, each job on one GPU (round robin when
/// there are more jobs than GPUs). Never more jobs than clips (none when there is nothing to do).
fn job_devices(device: &Device, jobs: Option<usize>, clips: usize) -> Result<Vec<Device>> {
    if clips == 0 {
        return Ok(Vec::new());
    }
    let list = match device {
        Device::Cpu(n) => vec![Device::Cpu(*n); jobs.unwrap_or(1)],
        Device::Cuda(ids) => {
            let gpus = if ids.is_empty() {
                crate::plan::visible_gpus()
            } else {
                ids.clone()
            };
            if gpus.is_empty() {
                bail!("--device cuda:all: no NVIDIA GPU is visible; check the driver or use --device cpu");
            }
            let n = jobs.unwrap_or(gpus.len());
            (0..n).map(|i| Device::Cuda(vec![gpus[i % gpus.len()]])).collect()
        }
    };
    Ok(list.into_iter().take(clips).collect())
}

/// Frames a clip will have, for the overall progress bar (0 when unknown).
fn estimate(input: &Path, o: &Options) -> u64 {
    crate::decode::probe(input)
        .ok()
        .and_then(|s| s.frames_to_run(o.max_frames))
        .unwrap_or(0)
}
