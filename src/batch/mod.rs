//! `gpen-video batch`: in, a folder of videos and still images (IN_DIR), the run options and
//! this process's shard; out, the restored clips mirrored under OUT_DIR, a manifest there of
//! finished clips, a summary on stderr, an optional JSON report and an exit code (0 all done, 1
//! some failed, 130 interrupted).
//!
//! Clips are run by `jobs` job threads (one per GPU on CUDA; `batch_job`), each with its own
//! `Engine`, reused from clip to clip while it fits; a job streams its still images through
//! its engine as one pipeline run before its videos. The jobs only send events (started,
//! progress, done, failed, cancelled); this module's coordinator alone owns the report, the
//! manifest and the progress bars. A clip's output appears under its final name only when
//! complete (the pipeline renames its partial file), and the manifest is replaced atomically
//! after each clip, so a crash at any moment leaves every output either complete and vouched
//! for, or redone by the next run. Ctrl-C once: the clips in flight finish and no new one
//! starts; twice: they are cancelled. Before a clip starts, its job takes the clip's claim (a
//! locked file beside the output, `output::Claim`) and looks again whether another process
//! finished it meanwhile, so batches started together on the same folders without shards share
//! the clips instead of each doing all (a clip another process holds is waited for at the end and
//! restored here if that process lets go of it unfinished). See `clips` for which files are clips and how shards
//! split them, `manifest` for what "finished" means.

pub(crate) mod clips;
mod job;
pub(crate) mod manifest;
pub(crate) mod report;

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::{Options, Settings};
use crate::interrupt::Interrupts;
use crate::runtime::Target;
use clips::{Clip, Shard};
use job::{job_loop, Event, JobContext, Queues};
use manifest::{Manifest, Stamp};
pub(crate) use report::{ClipNote, Report};

/// After a hard stop, how long to wait for cancelled clips to wind down before leaving them.
const HARD_STOP_GRACE: Duration = Duration::from_secs(10);

/// What a batch run was asked to do.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub in_dir: PathBuf,
    pub out_dir: PathBuf,
    pub recursive: bool,
    /// Take files that links inside `in_dir` point to outside it (skipped with a warning
    /// otherwise).
    pub follow_links_out: bool,
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
    /// No progress bars, and only failures and stops said.
    pub quiet: bool,
    /// Length of a long video's segments in seconds (0: never cut). With a shard, the segments
    /// of a long video are shared out to every shard, and the one that finishes the last joins.
    pub segment: f64,
    /// Settings for every clip; `input` and `output` are set per clip.
    pub base: Options,
}

/// One job's progress bar and the clip it runs.
struct JobBar {
    bar: ProgressBar,
    clip: Option<String>,
    frames: u64,
}

/// Runs the batch. Fails only for problems with the batch as a whole (folders, options); a clip
/// that fails is listed in the report and the others go on.
pub fn run(o: &BatchOptions, ints: &Interrupts) -> Result<Report> {
    let base = Settings::resolve(&o.base)?;
    // What no file could run with is said once, before the output folder is touched.
    crate::ready::check(&base)?;
    let shard = check_folders(o)?;
    let scan = clips::scan(&o.in_dir, (o.recursive, o.follow_links_out), &o.globs, Some(&o.out_dir))?;
    check_layout(o, &scan.clips)?;
    let settings_hash = manifest::settings_hash(&base.recipe);
    let (own_path, mut own, all) = open_manifests(o, shard)?;
    if let Some(path) = &o.report {
        check_report_path(path, o, &base, &own_path, &all, &scan)?;
    }

    let mut report = Report {
        in_dir: o.in_dir.clone(),
        out_dir: o.out_dir.clone(),
        shard: shard.map(|s| s.to_string()),
        manifest: own_path.clone(),
        settings: settings_hash.clone(),
        not_video: scan.not_video.clone(),
        ..Default::default()
    };
    let (todo, long) = select(o, shard, scan.clips, &all, &settings_hash, &mut report);
    let per_job = base.per_job(o.jobs, todo.len(), o.base.threads.is_some());
    report.jobs = per_job.len();
    if !o.quiet {
        say_plan(&report, shard, todo.len(), per_job.len());
    }

    let visible = !o.quiet && std::io::stderr().is_terminal();
    let mut view = View::new(visible, &todo, o, &base);
    let n_todo = todo.len();
    let queues = queue(todo);
    let (event_tx, event_rx) = unbounded::<Event>();
    let ctx = JobContext {
        in_dir: o.in_dir.clone(),
        out_dir: o.out_dir.clone(),
        ints: ints.clone(),
        settings_hash: settings_hash.clone(),
        force: o.force,
        started_unix_ms: manifest::now_unix_ms(),
        segment: o.segment,
        shard,
        long: std::sync::Arc::new(long),
    };
    for (i, settings) in per_job.into_iter().enumerate() {
        let name = match settings.targets.first() {
            Some(t @ Target::Cuda(_)) => t.to_string(),
            _ => format!("job {i}"),
        };
        view.add_job(&name);
        let (ctx, clips, events) = (ctx.clone(), queues.clone(), event_tx.clone());
        std::thread::Builder::new()
            .name(format!("batch-job-{i}"))
            .spawn(move || job_loop(i, &ctx, settings, &clips, &events))
            .context("starting a batch job thread")?;
    }
    drop(event_tx);

    let in_flight = coordinate(&event_rx, &mut view, &mut own, &own_path, &mut report, ints, n_todo);
    view.clear();
    finish(o, report, in_flight, &queues, ints)
}

/// Checks IN_DIR and OUT_DIR (creating OUT_DIR) and reads the shard this process takes.
fn check_folders(o: &BatchOptions) -> Result<Option<Shard>> {
    if !o.in_dir.is_dir() {
        bail!("input folder {} does not exist or is not a folder", o.in_dir.display());
    }
    std::fs::create_dir_all(&o.out_dir)
        .with_context(|| format!("cannot create output folder {}", o.out_dir.display()))?;
    if o.in_dir.canonicalize()? == o.out_dir.canonicalize()? {
        bail!("OUT_DIR is IN_DIR: choose another output folder (inputs are never overwritten)");
    }
    Ok(match &o.shard {
        Some(spec) => Some(Shard::parse(spec, o.shard_count, |v| std::env::var(v).ok())?),
        None if o.shard_count.is_some() => bail!("--shard-count goes with --shard auto"),
        None => None,
    })
}

/// Refuses, before any work, a layout in which an output would be written where the scan finds
/// inputs: OUT_DIR above IN_DIR, so that a clip's mirrored path lands inside IN_DIR (`batch raw .
/// --recursive` with a folder `raw/raw`: the output of `raw/raw/x.mp4` is `./raw/x.mp4`, an
/// input). An OUT_DIR inside IN_DIR is never scanned, so it is fine.
fn check_layout(o: &BatchOptions, clips: &[clips::Clip]) -> Result<()> {
    let (input, output) = (o.in_dir.canonicalize()?, o.out_dir.canonicalize()?);
    if output.starts_with(&input) {
        return Ok(());
    }
    for c in clips {
        let out = output.join(&c.rel);
        if out.starts_with(&input) {
            let over = if out.exists() { ", over an input" } else { "" };
            bail!(
                "OUT_DIR {} holds IN_DIR {}: the output of {} would be written at {}, inside the input folder{over}; nothing was done. Choose an OUT_DIR outside IN_DIR (or one inside it, which is never scanned)",
                o.out_dir.display(),
                o.in_dir.display(),
                c.key.escape_debug(),
                out.display()
            );
        }
    }
    Ok(())
}

/// Every manifest in OUT_DIR, and this process's own: its path and what it holds (a new one
/// if unreadable); what a killed save left is removed.
type Manifests = (PathBuf, Manifest, Vec<(PathBuf, Manifest)>);

fn open_manifests(o: &BatchOptions, shard: Option<Shard>) -> Result<Manifests> {
    let own_path = manifest::path_for(&o.out_dir, shard);
    if own_path.is_dir() {
        bail!(
            "the manifest path {} is a folder: remove or rename it (batch keeps its record of finished clips there)",
            own_path.display()
        );
    }
    let (prefix, suffix) = crate::output::partial_pattern(&own_path);
    crate::output::remove_stale(&o.out_dir, &prefix, &suffix);
    let own = match Manifest::load(&own_path) {
        Ok(m) => m.unwrap_or_else(|| Manifest::new(shard)),
        Err(e) => {
            tracing::warn!("{e:#}; starting a new one");
            Manifest::new(shard)
        }
    };
    let all = Manifest::load_all(&o.out_dir)?;
    Ok((own_path, own, all))
}

/// The report's path is never a clip, an output, a manifest or a model.
fn check_report_path(
    path: &Path,
    o: &BatchOptions,
    base: &Settings,
    own_path: &Path,
    all: &[(PathBuf, Manifest)],
    scan: &clips::Scan,
) -> Result<()> {
    let mut taken: Vec<PathBuf> = vec![
        own_path.to_path_buf(),
        base.recipe.model.0.clone(),
        base.recipe.detector.0.clone(),
    ];
    taken.extend(all.iter().map(|(p, _)| p.clone()));
    for c in &scan.clips {
        taken.push(o.in_dir.join(&c.rel));
        taken.push(o.out_dir.join(&c.rel));
    }
    let taken: Vec<&Path> = taken.iter().map(PathBuf::as_path).collect();
    crate::output::check_side_output(path, &taken)
}

/// Says what the batch will do: files skipped for their kind, clips to do, finished, jobs.
fn say_plan(report: &Report, shard: Option<Shard>, todo: usize, jobs: usize) {
    if !report.not_video.is_empty() {
        crate::console::eprint!(
            "skipping {} file(s) that are neither videos nor still images by extension: {}",
            report.not_video.len(),
            report.not_video.join(", ")
        );
    }
    crate::console::eprint!(
        "batch{}: {} clip(s) to do, {} finished earlier{}; {} job(s)",
        shard.map_or(String::new(), |s| format!(" shard {s}")),
        todo,
        report.skipped.len(),
        if shard.is_some() {
            format!(", {} for other shards", report.other_shards)
        } else {
            String::new()
        },
        jobs
    );
}

/// The clips to do as the jobs' queues: still images first (one stream per job), then videos.
fn queue(todo: Vec<Clip>) -> Queues {
    let (image_tx, image_rx) = unbounded::<Clip>();
    let (video_tx, video_rx) = unbounded::<Clip>();
    for clip in todo {
        let queue = if crate::media::still::is_still(Path::new(&clip.rel)) {
            &image_tx
        } else {
            &video_tx
        };
        queue.send(clip).expect("receiver held here");
    }
    Queues {
        images: image_rx,
        videos: video_rx,
    }
}

/// Completes the report once the jobs are done: interruption, clips left in flight, clips not
/// started; prints the summary and writes the JSON report.
fn finish(
    o: &BatchOptions,
    mut report: Report,
    in_flight: BTreeSet<(usize, String)>,
    queues: &Queues,
    ints: &Interrupts,
) -> Result<Report> {
    report.interrupted = ints.requested();
    report.interrupt_code = ints.exit_code();
    for (_, clip) in in_flight {
        if ints.hard_requested() {
            report.cancelled.push(clip);
        } else {
            report
                .failed
                .push(ClipNote::new(&clip, "its job stopped unexpectedly".into()));
        }
    }
    report.not_started = queues
        .images
        .try_iter()
        .chain(queues.videos.try_iter())
        .map(|c| c.key)
        .collect();
    report.not_started.sort();
    report.print_summary();
    if let Some(path) = &o.report {
        let json = serde_json::to_string_pretty(&report)? + "\n";
        crate::output::write_atomic(path, json.as_bytes())
            .with_context(|| format!("writing report {}", path.display()))?;
    }
    Ok(report)
}

/// The clips this process runs: those of its shard that no manifest vouches for (all of them
/// with `--force`); the others are counted or listed in `report`. With a shard, a long video
/// (cut into segments) is every shard's: each takes its share of the segments. Returns the
/// clips and the keys of those long videos.
fn select(
    o: &BatchOptions,
    shard: Option<Shard>,
    clips: Vec<Clip>,
    all: &[(PathBuf, Manifest)],
    settings_hash: &str,
    report: &mut Report,
) -> (Vec<Clip>, BTreeSet<String>) {
    let mut todo = Vec::new();
    let mut long = BTreeSet::new();
    for clip in clips {
        if shard.is_some() && is_long(&o.in_dir.join(&clip.rel), o.segment) {
            long.insert(clip.key.clone());
        } else if shard.is_some_and(|s| !s.owns(&clip)) {
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
        if !o.force && manifest::vouched(all, &clip.key, stamp, settings_hash, &o.out_dir.join(&clip.rel)) {
            report
                .skipped
                .push(ClipNote::new(&clip.key, "finished earlier (manifest)".into()));
        } else {
            todo.push(clip);
        }
    }
    (todo, long)
}

/// Whether `input` is a video long enough to be cut into segments of `seconds` (by what its
/// header says).
fn is_long(input: &Path, seconds: f64) -> bool {
    seconds > 0.0
        && !crate::media::still::is_still(input)
        && crate::media::decode::probe(input)
            .ok()
            .and_then(|s| s.duration_s)
            .is_some_and(|d| d >= 1.5 * seconds)
}

/// The coordinator: the only owner of the report, the manifest and the bars. Takes the jobs'
/// events until every job has ended (or a hard stop has waited long enough); returns the clips
/// still in flight then, by job (a job streaming images has several).
fn coordinate(
    events: &Receiver<Event>,
    view: &mut View,
    own: &mut Manifest,
    own_path: &Path,
    report: &mut Report,
    ints: &Interrupts,
    n_todo: usize,
) -> BTreeSet<(usize, String)> {
    let (mut soft_seen, mut hard_at) = (false, None::<Instant>);
    let mut in_flight: BTreeSet<(usize, String)> = BTreeSet::new();
    let mut finished = 0usize;
    loop {
        match events.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Started { job, clip, frames }) => {
                view.started(job, &clip, frames);
                in_flight.insert((job, clip));
            }
            Ok(Event::Progress { job, frames }) => view.progress(job, frames),
            Ok(Event::Done {
                job,
                done,
                entry,
                claim,
            }) => {
                in_flight.remove(&(job, done.clip.clone()));
                own.clips.insert(done.clip.clone(), entry);
                let saved = own.save_shared(own_path);
                // Let go of the clip only once the manifest vouches for it.
                drop(claim);
                match saved {
                    Ok(()) => {
                        view.log(format!(
                            "done     {} ({} frames, {} faces, {:.1} s)",
                            done.clip, done.frames, done.faces, done.seconds
                        ));
                        view.finished(job, true);
                        report.done.push(done);
                    }
                    Err(e) => {
                        view.log(format!("failed   {}: {e:#}", done.clip));
                        view.finished(job, false);
                        report.failed.push(ClipNote::new(&done.clip, format!("{e:#}")));
                    }
                }
                finished += 1;
            }
            Ok(Event::Failed { job, clip, reason }) => {
                in_flight.remove(&(job, clip.clone()));
                view.log(format!("failed   {clip}: {reason}"));
                view.finished(job, false);
                report.failed.push(ClipNote::new(&clip, reason));
                finished += 1;
            }
            Ok(Event::Skipped { job, clip, reason }) => {
                in_flight.remove(&(job, clip.clone()));
                view.log(format!("skipped  {clip}: {reason}"));
                view.finished(job, false);
                report.skipped.push(ClipNote::new(&clip, reason));
                finished += 1;
            }
            Ok(Event::Cancelled { job, clip }) => {
                in_flight.remove(&(job, clip.clone()));
                view.log(format!("stopped  {clip}"));
                view.finished(job, false);
                report.cancelled.push(clip);
                finished += 1;
            }
            Ok(Event::Images { stat }) => report.add_images(&stat),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        view.overall_message(finished, n_todo);
        if !soft_seen && ints.requested() {
            soft_seen = true;
            view.log(format!(
                "interrupted: finishing {} clip(s) in flight and starting no new one; press Ctrl-C again to stop at once",
                in_flight.len()
            ));
        }
        if hard_at.is_none() && ints.hard_requested() {
            hard_at = Some(Instant::now());
            view.log("stopping now: cancelling the clips in flight".into());
        }
        if hard_at.is_some_and(|t| t.elapsed() > HARD_STOP_GRACE) {
            view.log("clips still stopping; leaving them (their partial files are removed by the next run)".into());
            break;
        }
    }
    in_flight
}

/// The progress bars: one for the whole batch, one per job.
struct View {
    mp: MultiProgress,
    overall: ProgressBar,
    jobs: Vec<JobBar>,
    visible: bool,
    /// Only failures and stops are said (--quiet).
    quiet: bool,
    /// Frames of the clips finished so far (done ones count, failed ones do not).
    done_frames: u64,
}

impl View {
    fn new(visible: bool, todo: &[Clip], o: &BatchOptions, base: &Settings) -> Self {
        let mp = MultiProgress::with_draw_target(if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let frames: u64 = if visible {
            todo.iter().map(|c| estimate(&o.in_dir.join(&c.rel), base)).sum()
        } else {
            0
        };
        let overall = mp.add(ProgressBar::new(frames));
        overall.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{elapsed_precise}] {wide_bar} {pos}/{len} frames {fps} ETA {eta} {msg}",
            )
            .expect("valid template")
            // Frames a second with one decimal (indicatif's own rate has four).
            .with_key("fps", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.1} fps", s.per_sec());
            }),
        );
        overall.set_prefix("all");
        overall.set_message(format!("0/{} clips", todo.len()));
        Self {
            mp,
            overall,
            jobs: Vec::new(),
            visible,
            quiet: o.quiet,
            done_frames: 0,
        }
    }

    fn add_job(&mut self, name: &str) {
        let bar = self.mp.add(ProgressBar::new(0));
        bar.set_style(ProgressStyle::with_template("{prefix:>8} {bar:40} {pos}/{len} {msg}").expect("valid template"));
        bar.set_prefix(name.to_string());
        self.jobs.push(JobBar {
            bar,
            clip: None,
            frames: 0,
        });
    }

    /// A line on what happened: with --quiet only failures and stops (what went wrong) show.
    fn log(&self, line: String) {
        if self.quiet && !(line.starts_with("failed") || line.starts_with("stop")) {
            return;
        }
        if self.visible {
            let _ = self.mp.println(crate::console::escape_controls(&line));
        } else {
            crate::console::eprint_line(&line);
        }
    }

    fn started(&mut self, job: usize, clip: &str, frames: Option<u64>) {
        let j = &mut self.jobs[job];
        j.bar.reset();
        j.bar.set_length(frames.unwrap_or(0));
        j.bar.set_message(crate::console::escape_controls(clip).into_owned());
        j.clip = Some(clip.to_string());
        j.frames = 0;
    }

    fn progress(&mut self, job: usize, frames: u64) {
        self.jobs[job].frames = frames;
        self.jobs[job].bar.set_position(frames);
        self.redraw_overall();
    }

    /// The job's clip ended; its frames count towards the whole only if it was done.
    fn finished(&mut self, job: usize, done: bool) {
        let j = &mut self.jobs[job];
        if done {
            self.done_frames += j.frames;
        }
        j.frames = 0;
        j.clip = None;
        self.redraw_overall();
    }

    fn redraw_overall(&self) {
        let running: u64 = self.jobs.iter().map(|j| j.frames).sum();
        self.overall.set_position(self.done_frames + running);
    }

    fn overall_message(&self, finished: usize, todo: usize) {
        self.overall.set_message(format!("{finished}/{todo} clips"));
    }

    fn clear(&self) {
        for j in &self.jobs {
            j.bar.finish_and_clear();
        }
        self.overall.finish_and_clear();
    }
}

/// Frames a clip will have, for the overall progress bar (0 when unknown).
fn estimate(input: &Path, s: &Settings) -> u64 {
    crate::media::decode::probe(input)
        .ok()
        .and_then(|src| src.frames_to_run(s.recipe.treatment.max_frames))
        .unwrap_or(0)
}
