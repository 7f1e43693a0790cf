//! `gpen-video bench`: in, sources, a model and devices; out, a table (and JSON) of end-to-end
//! throughput (warm-up excluded, repeated, medians), the enhance-only ceiling on the same crops,
//! the pipeline's efficiency (end-to-end faces/s over ceiling faces/s, run in pairs) and the
//! feeder's ceiling: every stage but the model, in faces/s and core-ms per face per stage.

pub(crate) mod portraits;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use serde::Serialize;

use crate::config::Settings;
use crate::engine::{CancelToken, Engine, Job};
use crate::pipeline;
use crate::stats::{gpu_memory_by_index, peak_rss, StageStat, Summary};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// The whole pipeline and the enhance-only ceiling, with the efficiency.
    All,
    /// The whole pipeline only.
    Pipeline,
    /// The enhancement sessions alone on crops from the source: the ceiling.
    Enhance,
    /// Every stage but the model (its change taken as zero), at the run's encoder settings
    /// and with the fastest preset: how many faces/s the CPU side can feed a GPU.
    Feeder,
}

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub sources: Vec<PathBuf>,
    /// Counted runs per source (after one warm-up run that is not counted).
    pub repeat: usize,
    pub stage: Stage,
    /// How long each enhance-only run lasts at least (after its first four batches a worker).
    pub ceiling_time: Duration,
    /// Model, devices, batch, encoder settings...
    pub settings: Settings,
    /// Stops the benchmark (Ctrl-C).
    pub cancel: CancelToken,
    /// A progress bar for each run (on a terminal, without --quiet).
    pub bar: bool,
}

/// One pipeline run of a benchmark, with a progress bar named `label` when `bar`.
fn timed(engine: &mut Engine, job: &Job, bar: bool, label: &str) -> Result<Summary> {
    let total = job.source.frames_to_run(job.treatment.max_frames).unwrap_or(0);
    let pb = if bar {
        let pb = indicatif::ProgressBar::new(total);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {prefix} {wide_bar} {pos}/{len} frames  {msg}")
                .expect("valid template"),
        );
        pb.set_prefix(label.to_string());
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let r = pipeline::run(engine, job, &|p| {
        pb.set_position(p.frames);
        pb.set_message(format!("{} faces", p.faces));
    });
    pb.finish_and_clear();
    r
}

/// Medians over the counted runs of one source.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchRow {
    pub source: String,
    #[serde(rename = "measure")]
    pub kind: &'static str,
    pub device: String,
    pub batch: usize,
    pub frames: u64,
    pub faces: u64,
    pub fps: Option<f64>,
    pub faces_per_s: f64,
    pub ms_per_batch: f64,
    /// Enhance rows: the batches each enhance-only run ran, all workers together (the median
    /// run): at least four a worker, more while `--ceiling-s` lasts.
    pub ceiling_batches: Option<u64>,
    pub(crate) peak_mib: Option<u64>,
    /// GPU memory held on the busiest GPU at the end, where the driver reports it.
    pub(crate) gpu_mib: Option<u64>,
    pub runs: usize,
    /// The restoration's flicker inside faces (levels of frame-to-frame change beyond the
    /// input's, median over the runs), for pipeline rows.
    pub flicker: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchReport {
    pub rows: Vec<BenchRow>,
    /// Per source: the median over the counted pairs of end-to-end faces/s over the ceiling's,
    /// each pair run one after the other.
    pub efficiency: Vec<Efficiency>,
    /// Per source: what the stages around the model can feed.
    pub feeder: Vec<Feeder>,
}

/// The stages around the model without it (medians over the counted runs): what they cost
/// per face and how many faces per second they can feed a model.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Feeder {
    pub source: String,
    /// Faces/s and fps with the model's change taken as zero, at the run's encoder settings.
    pub faces_per_s: f64,
    pub fps: f64,
    /// The same with the encoder's fastest preset (x264/x265 `ultrafast`; other encoders as set).
    pub fast_faces_per_s: f64,
    pub(crate) fast_fps: f64,
    /// CPU time of each stage's own threads per face, in ms (decode and encode count their
    /// calling thread, not FFmpeg's own threads), from the runs at the run's encoder settings.
    pub stage_core_ms: Vec<(String, f64)>,
    /// Threads each of those stages ran on (1: a stage of one thread, which no core count
    /// speeds up; a pool stage runs on one thread per core, up to `defaults::POOL_THREADS_MAX`).
    pub(crate) stage_threads: Vec<usize>,
    /// Each stage's core-ms per face in the runs with the fastest preset, which the host
    /// projections use (beside the whole process's CPU at that preset).
    pub fast_stage_core_ms: Vec<(String, f64)>,
    /// The part of each of those inside model sessions (detection's and the mesh's runs): what
    /// a GPU takes over.
    pub fast_stage_model_ms: Vec<(String, f64)>,
    /// The part of each of those outside the model runs that a GPU host still spreads over its
    /// pool (the face mesh's crops in detection's chain; see `StageStat::spread_cpu`).
    pub fast_stage_spread_ms: Vec<(String, f64)>,
    /// Measured, not projected, in the runs with the fastest preset (medians): each stage's
    /// threads' busy time as a share of the run's wall time and of its threads (1.0: every
    /// thread of it busy all along), and its input queue's mean fill (1.0: always full, so the
    /// stage, or one after it, held the run back).
    pub(crate) fast_stage_busy: Vec<(String, f64, f64)>,
    /// The whole process's CPU time over the wall time in those runs: the cores it kept busy.
    pub(crate) fast_cores_busy: f64,
    /// What a host of 16 cores would feed (faces/s) and the stage that would limit it (see
    /// [`Feeder::host`]).
    pub host_16: (f64, String),
    /// The same for a host of 16 cores whose GPU runs detection and the face mesh: their CPU
    /// here left out of the whole process's and their stages out of the limits (see
    /// [`Feeder::host`]).
    pub gpu_host_16: (f64, String),
    /// The whole process's CPU time per face (every thread, FFmpeg's included), in ms, at the
    /// run's encoder settings and with the fastest preset.
    pub process_core_ms: f64,
    pub fast_process_core_ms: f64,
    /// Faces/s one core feeds at `fast_process_core_ms`: a machine of N cores feeds about N
    /// times this, up to `detect_limit` per job.
    pub per_core_faces_per_s: f64,
    /// Detection is one thread per job: at most this many faces/s per job.
    pub detect_limit: f64,
    /// The model's own ceiling (enhance-only faces/s), when it was timed.
    pub model_faces_per_s: Option<f64>,
    /// Cores of this machine the run could use.
    pub cores: usize,
}

/// One source's pipeline efficiency.
#[derive(Clone, Debug, Serialize)]
pub struct Efficiency {
    pub source: String,
    pub efficiency: f64,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Runs the benchmark; `log` gets a line per finished run.
pub fn run(o: &BenchOptions, log: &dyn Fn(&str)) -> Result<BenchReport> {
    if o.sources.is_empty() {
        bail!("no sources to benchmark: give video files, or run scripts/setup.sh for the 1080p samples");
    }
    // Pictures are timed by --portraits, as a stream of stills: said before any work.
    if let Some(still) = o.sources.iter().find(|s| crate::media::kind::is_still_input(s)) {
        bail!(
            "{} is a still image: `gpen-video bench SOURCE` times videos; time pictures with `gpen-video bench --portraits DIR` (the pictures in DIR, a folder holding just this one works too), or `--portraits` alone on portraits made from the set-up's",
            still.display()
        );
    }
    // Removed when dropped, on error as well.
    let tmp = temp_folder("gpen-video-bench-")?;
    let mut report = BenchReport::default();
    for src in &o.sources {
        bench_source(o, src, tmp.path(), &mut report, log)?;
    }
    Ok(report)
}

/// A temporary folder for a benchmark's outputs, removed when dropped.
pub(crate) fn temp_folder(prefix: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary folder for the benchmark's outputs")
}

fn bench_source(o: &BenchOptions, src: &Path, tmp: &Path, report: &mut BenchReport, log: &dyn Fn(&str)) -> Result<()> {
    let name = src
        .file_name()
        .map_or_else(|| src.display().to_string(), |n| n.to_string_lossy().into_owned());
    let mut settings = o.settings.clone();
    settings.faces_json = None;
    settings.stats_json = None;
    let job = settings.job(src, &tmp.join("bench-out.mkv"), o.cancel.clone())?;
    let mut engine = settings.engine(&job)?;
    let device = engine.devices();
    let batch = engine.batch;
    let (with_pipeline, with_ceiling) = (
        matches!(o.stage, Stage::All | Stage::Pipeline),
        matches!(o.stage, Stage::All | Stage::Enhance),
    );
    let crops = if with_ceiling {
        let want = 4 * batch * engine.workers.len();
        let crops = pipeline::collect_crops(&mut engine, &job, want, 600)?;
        if crops.is_empty() {
            bail!("{name}: no face found to time the enhancer on");
        }
        crops
    } else {
        Vec::new()
    };

    // Warm-up, not counted: sessions allocate their memory and pick kernels on the first
    // batches.
    if with_pipeline {
        let warm_up = job.with_treatment(|t| t.max_frames = Some((4 * batch * engine.workers.len()).max(8) as u64));
        log(&format!(
            "{name}: warm-up, then {} counted run(s) of {} frames",
            o.repeat.max(1),
            job.source
                .frames_to_run(job.treatment.max_frames)
                .map_or("all".into(), |n| n.to_string())
        ));
        timed(&mut engine, &warm_up, o.bar, &format!("{name} warm-up"))?;
    }
    if with_ceiling {
        ceiling(&mut engine, &crops, 4, o.ceiling_time)?;
    }
    // Counted runs, pipeline and ceiling in turn: the efficiency of each pair is measured
    // minutes apart at most, so a machine whose speed drifts skews both sides alike.
    let (mut runs, mut rates, mut ms, mut ratios) = (Vec::<Summary>::new(), Vec::new(), Vec::new(), Vec::new());
    let mut ceiling_batches = Vec::new();
    for i in 1..=o.repeat.max(1) {
        if with_pipeline {
            let s = timed(&mut engine, &job, o.bar, &format!("{name} run {i}/{}", o.repeat.max(1)))?;
            log(&format!(
                "{name}: run {i}: {:.2} fps, {:.2} faces/s",
                s.fps(),
                s.faces_per_s()
            ));
            runs.push(s);
        }
        if with_ceiling {
            let (faces_per_s, ms_per_batch, batches) = ceiling(&mut engine, &crops, 4, o.ceiling_time)?;
            log(&format!("{name}: enhance-only run {i}: {faces_per_s:.2} faces/s"));
            if let Some(s) = runs.last() {
                ratios.push(s.faces_per_s() / faces_per_s.max(1e-9));
            }
            rates.push(faces_per_s);
            ms.push(ms_per_batch);
            ceiling_batches.push(batches as f64);
        }
    }

    report.rows.extend(pipeline_row(&name, &device, batch, &runs));
    if with_ceiling {
        report.rows.push(BenchRow {
            source: name.clone(),
            kind: "enhance",
            device,
            batch,
            frames: 0,
            faces: crops.len() as u64,
            fps: None,
            faces_per_s: median(rates),
            ms_per_batch: median(ms),
            ceiling_batches: Some(median(ceiling_batches) as u64),
            peak_mib: peak_rss().map(|b| b >> 20),
            gpu_mib: gpu_memory_by_index().iter().map(|(_, m)| *m).max().filter(|m| *m > 0),
            runs: o.repeat.max(1),
            flicker: None,
        });
    }
    let model_ceiling = report
        .rows
        .last()
        .filter(|r| r.kind == "enhance")
        .map(|r| r.faces_per_s);
    if !ratios.is_empty() {
        report.efficiency.push(Efficiency {
            source: name.clone(),
            efficiency: median(ratios),
        });
    }
    if matches!(o.stage, Stage::All | Stage::Feeder) {
        let feeder = feed(&mut engine, &job, (o.repeat.max(1), o.bar), &name, log)?;
        report.feeder.push(Feeder {
            model_faces_per_s: model_ceiling,
            cores: o.settings.cores(),
            ..feeder
        });
    }
    Ok(())
}

/// The pipeline's row of a source: medians over its counted `runs` (none without runs).
fn pipeline_row(name: &str, device: &str, batch: usize, runs: &[Summary]) -> Option<BenchRow> {
    let last = runs.last()?;
    let flicker: Vec<f64> = runs
        .iter()
        .filter_map(|s| s.flicker)
        .filter(|f| f.pairs > 0)
        .map(|f| f.output())
        .collect();
    Some(BenchRow {
        source: name.to_string(),
        kind: "pipeline",
        device: device.to_string(),
        batch,
        frames: last.frames,
        faces: last.faces,
        fps: Some(median(runs.iter().map(Summary::fps).collect())),
        faces_per_s: median(runs.iter().map(Summary::faces_per_s).collect()),
        ms_per_batch: median(
            runs.iter()
                .flat_map(|s| s.workers.iter().map(|w| w.ms_per_batch()))
                .collect(),
        ),
        ceiling_batches: None,
        peak_mib: peak_rss().map(|b| b >> 20),
        gpu_mib: last.workers.iter().filter_map(|w| w.device_mib).max(),
        runs: runs.len(),
        flicker: (!flicker.is_empty()).then(|| median(flicker)),
    })
}

/// CPU time of the whole process so far (every thread's user and system time).
fn process_cpu() -> Duration {
    // SAFETY: `usage` is a valid, writable rusage for the duration of the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always a valid target.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Times the pipeline with the model skipped (see [`Feeder`]), `repeat` runs at the job's
/// encoder settings and as many with the fastest preset, in turn.
fn feed(
    engine: &mut Engine,
    job: &Job,
    (repeat, bar): (usize, bool),
    name: &str,
    log: &dyn Fn(&str),
) -> Result<Feeder> {
    let fast = job.with_treatment(|t| t.encode.preset = Some("ultrafast".into()));
    for w in &mut engine.workers {
        w.skip_model = true;
    }
    let result = (|| -> Result<Feeder> {
        let (mut runs, mut fast_runs) = (Vec::new(), Vec::new());
        for i in 1..=repeat {
            for (j, out) in [(job, &mut runs), (&fast, &mut fast_runs)] {
                let c = process_cpu();
                let s = timed(engine, j, bar, &format!("{name} without the model {i}/{repeat}"))?;
                let cpu = process_cpu().saturating_sub(c);
                out.push((s, cpu));
            }
            let (s, f) = (&runs[i - 1].0, &fast_runs[i - 1].0);
            log(&format!(
                "{name}: without the model, run {i}: {:.2} faces/s, {:.2} with the fastest preset",
                s.faces_per_s(),
                f.faces_per_s()
            ));
        }
        let per_face = |(s, cpu): &(Summary, Duration)| 1000.0 * cpu.as_secs_f64() / s.faces.max(1) as f64;
        // The median over `runs` of stage `n`'s `time` (its CPU, or the part in model runs)
        // per face, in ms.
        let ms_of = |runs: &[(Summary, Duration)], n: &str, time: fn(&StageStat) -> Duration| {
            median(
                runs.iter()
                    .filter_map(|(s, _)| s.stages.iter().find(|st| st.name == n).map(|st| (st, s.faces)))
                    .map(|(st, faces)| 1000.0 * time(st).as_secs_f64() / faces.max(1) as f64)
                    .collect(),
            )
        };
        let stage_ms_of = |runs: &[(Summary, Duration)], n: &str| ms_of(runs, n, |st| st.cpu);
        let names: Vec<&'static str> = runs[0]
            .0
            .stages
            .iter()
            .map(|s| s.name)
            .filter(|n| *n != "dispatch")
            .collect();
        let stage_ms = |n: &str| stage_ms_of(&runs, n);
        let fast_ms = median(fast_runs.iter().map(per_face).collect());
        let detect = stage_ms("detect");
        Ok(Feeder {
            source: name.to_string(),
            faces_per_s: median(runs.iter().map(|(s, _)| s.faces_per_s()).collect()),
            fps: median(runs.iter().map(|(s, _)| s.fps()).collect()),
            fast_faces_per_s: median(fast_runs.iter().map(|(s, _)| s.faces_per_s()).collect()),
            fast_fps: median(fast_runs.iter().map(|(s, _)| s.fps()).collect()),
            stage_core_ms: names.iter().map(|n| (n.to_string(), stage_ms(n))).collect(),
            fast_stage_core_ms: names
                .iter()
                .map(|n| (n.to_string(), stage_ms_of(&fast_runs, n)))
                .collect(),
            // Those of the run's stages whose model runs a GPU host takes over.
            fast_stage_model_ms: ON_GPU
                .iter()
                .filter(|(n, _)| names.contains(n))
                .map(|(n, _)| (n.to_string(), ms_of(&fast_runs, n, |st| st.model_cpu)))
                .collect(),
            // And the decode stage's detection copies, shared out on a host of more cores.
            fast_stage_spread_ms: ON_GPU
                .iter()
                .map(|(n, _)| *n)
                .chain(["decode"])
                .filter(|n| names.contains(n))
                .map(|n| (n.to_string(), ms_of(&fast_runs, n, |st| st.spread_cpu)))
                .collect(),
            fast_stage_busy: busy_figures(&fast_runs, &names),
            fast_cores_busy: median(
                fast_runs
                    .iter()
                    .map(|(s, cpu)| cpu.as_secs_f64() / s.wall.as_secs_f64().max(1e-9))
                    .collect(),
            ),
            stage_threads: names
                .iter()
                .map(|n| {
                    runs[0]
                        .0
                        .stages
                        .iter()
                        .find(|st| st.name == *n)
                        .map_or(1, |st| st.threads.max(1))
                })
                .collect(),
            host_16: (0.0, String::new()),
            gpu_host_16: (0.0, String::new()),
            process_core_ms: median(runs.iter().map(per_face).collect()),
            fast_process_core_ms: fast_ms,
            per_core_faces_per_s: 1000.0 / fast_ms.max(1e-9),
            detect_limit: 1000.0 / detect.max(1e-9),
            model_faces_per_s: None,
            cores: 0,
        }
        .with_host_16())
    })();
    for w in &mut engine.workers {
        w.skip_model = false;
    }
    result
}

/// Each of stage `names`' median busy share and queue fill over `runs`.
fn busy_figures(runs: &[(Summary, Duration)], names: &[&str]) -> Vec<(String, f64, f64)> {
    names
        .iter()
        .map(|n| {
            let of = |f: fn(&StageStat, f64) -> f64| {
                median(
                    runs.iter()
                        .filter_map(|(s, _)| {
                            let st = s.stages.iter().find(|st| st.name == *n)?;
                            Some(f(st, s.wall.as_secs_f64()))
                        })
                        .collect(),
                )
            };
            (
                n.to_string(),
                of(|st, wall| st.busy_share(wall)),
                of(|st, _| st.queue_fill()),
            )
        })
        .collect()
}

/// Every worker runs full batches of the crops at once, at least `min_batches` each and for at
/// least `min_time`, so fast models are timed long enough to be steady; returns faces/s over
/// all workers, the median ms per batch and the batches run, all workers together.
pub(crate) fn ceiling(
    engine: &mut Engine,
    crops: &[Vec<u8>],
    min_batches: usize,
    min_time: Duration,
) -> Result<(f64, f64, usize)> {
    let batch = engine.batch;
    let start = Instant::now();
    let results: Vec<Result<(usize, usize, Duration)>> = std::thread::scope(|s| {
        let handles: Vec<_> = engine
            .workers
            .iter_mut()
            .map(|w| {
                s.spawn(move || -> Result<(usize, usize, Duration)> {
                    let mut faces = 0;
                    let t = Instant::now();
                    let mut i = 0;
                    while i < min_batches || t.elapsed() < min_time {
                        let slice: Vec<&[u8]> = (0..batch)
                            .map(|k| crops[(i * batch + k) % crops.len()].as_slice())
                            .collect();
                        w.enhancer.run(&slice, |_, _| ())?;
                        faces += slice.len();
                        i += 1;
                    }
                    Ok((faces, i, t.elapsed()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("an enhance worker panicked")))
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let (mut faces, mut all) = (0, 0);
    let mut ms = Vec::new();
    for r in results {
        let (f, batches, d) = r?;
        faces += f;
        all += batches;
        ms.push(1000.0 * d.as_secs_f64() / batches.max(1) as f64);
    }
    Ok((faces as f64 / wall.max(1e-9), median(ms), all))
}

impl BenchReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<24} {:<9} {:<12} {:>5} {:>6} {:>6} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8}\n",
            "source",
            "measure",
            "device",
            "batch",
            "frames",
            "faces",
            "fps",
            "faces/s",
            "ms/batch",
            "peak MiB",
            "GPU MiB",
            "flicker"
        );
        for r in &self.rows {
            out += &format!(
                "{:<24} {:<9} {:<12} {:>5} {:>6} {:>6} {:>8} {:>8.2} {:>9.1} {:>9} {:>8} {:>8}\n",
                r.source,
                r.kind,
                r.device,
                r.batch,
                if r.frames > 0 { r.frames.to_string() } else { "-".into() },
                r.faces,
                r.fps.map_or("-".into(), |f| format!("{f:.2}")),
                r.faces_per_s,
                r.ms_per_batch,
                r.peak_mib.map_or("-".into(), |m| m.to_string()),
                r.gpu_mib.map_or("-".into(), |m| m.to_string()),
                r.flicker.map_or("-".into(), |f| format!("{f:+.2}"))
            );
        }
        if self.rows.iter().any(|r| r.flicker.is_some()) {
            out += "flicker: how many levels more the restored faces change from frame to frame than the input's faces (inside faces, along each track; 0 is none added)\n";
        }
        for e in &self.efficiency {
            out += &format!(
                "pipeline efficiency ({}): {:.2} (end-to-end faces/s over enhance-only faces/s)\n",
                e.source, e.efficiency
            );
        }
        for f in &self.feeder {
            out += &f.text();
        }
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain numbers and strings serialise") + "\n"
    }
}

/// The stages whose model runs a GPU host takes over besides GPEN's: CenterFace (the detect
/// stage, which in a video with a mesh also meshes the faces it follows, and the passes run
/// ahead of it on the CPU), the face mesh, and the hands and identity models (their sessions are
/// made as detection's, `Engine::identity_opts`: on its GPU with `--detect-device gpu`). What
/// is left of them on the host (crops, maps decoded, points, the quality figure), and whether
/// that part runs on one thread there (detection has one session on a GPU, where on the CPU it
/// shares a frame's work among several).
pub(crate) const ON_GPU: &[(&str, bool)] = &[
    ("detect", true),
    ("pass", true),
    ("mesh", false),
    ("hands", false),
    ("identity", false),
];

impl Feeder {
    /// Faces/s a host of `cores` cores would feed, and what limits it: all cores at this run's
    /// whole-process CPU per face (fastest preset), or a stage that cannot use them all (a stage
    /// of one thread at 1000 / its core-ms, a pool stage at that times its threads, one per
    /// core up to `defaults::POOL_THREADS_MAX`).
    /// `on_gpu` names the stages whose model runs a GPU takes over (see [`ON_GPU`]): those
    /// runs' core-ms leave the whole process's and the stage's own, and what is left of such a
    /// stage limits as the host runs it.
    pub fn host(&self, cores: usize, on_gpu: &[(&str, bool)]) -> (f64, String) {
        let stages = if self.fast_stage_core_ms.is_empty() {
            &self.stage_core_ms
        } else {
            &self.fast_stage_core_ms
        };
        let model_ms = |name: &str| {
            self.fast_stage_model_ms
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, ms)| *ms)
        };
        let spread_ms = |name: &str| {
            self.fast_stage_spread_ms
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, ms)| *ms)
        };
        let gpu = |name: &str| on_gpu.iter().find(|(n, _)| *n == name).map(|(_, one)| *one);
        let moved: f64 = stages
            .iter()
            .filter(|(n, _)| gpu(n).is_some())
            .map(|(n, _)| model_ms(n))
            .sum();
        let per_core = if moved > 0.0 {
            1000.0 / (self.fast_process_core_ms - moved).max(1e-9)
        } else {
            self.per_core_faces_per_s
        };
        let mut best = (per_core * cores as f64, format!("all {cores} cores"));
        let pool = cores.min(crate::defaults::POOL_THREADS_MAX);
        for ((name, ms), &threads) in stages.iter().zip(&self.stage_threads) {
            let width = if threads > 1 { pool } else { 1 };
            // (core-ms, threads) parts of the stage, each a cap of its own.
            let parts = match gpu(name) {
                // On one thread but for the part it still spreads over the pool.
                Some(true) => {
                    let spread = spread_ms(name);
                    vec![(ms - model_ms(name) - spread, 1), (spread, pool)]
                }
                Some(false) => vec![(ms - model_ms(name), width)],
                // The decode stage's detection copies, made on this machine's one thread
                // alone, on the threads such a host shares them among.
                None if name == "decode" => {
                    let spread = spread_ms(name);
                    vec![(ms - spread, width), (spread, crate::defaults::convert_threads(cores))]
                }
                None => vec![(*ms, width)],
            };
            for (ms, width) in parts {
                let cap = 1000.0 / ms.max(1e-9) * width as f64;
                if cap < best.0 {
                    let how = if width == 1 { "one thread" } else { "its pool" };
                    best = (cap, format!("{name} ({how})"));
                }
            }
        }
        best
    }

    fn with_host_16(mut self) -> Self {
        self.host_16 = self.host(16, &[]);
        self.gpu_host_16 = self.host(16, ON_GPU);
        self
    }

    /// The feeder's lines of the bench table: its ceiling beside the model's, which side limits
    /// the run, what each stage costs per face and what a machine of N cores feeds.
    pub fn text(&self) -> String {
        let mut out = format!(
            "feeder ({}): without the model {:.1} faces/s ({:.1} fps) at the run's encoder settings, {:.1} faces/s ({:.1} fps) with the fastest preset",
            self.source, self.faces_per_s, self.fps, self.fast_faces_per_s, self.fast_fps
        );
        if let Some(m) = self.model_faces_per_s {
            let limit = if m < self.faces_per_s {
                "the model limits this run"
            } else {
                "the stages around the model limit this run"
            };
            out += &format!("; the model alone {m:.1} faces/s: {limit}");
        }
        out += "\n  core-ms per face:";
        for (n, ms) in &self.stage_core_ms {
            out += &format!(" {n} {ms:.2},");
        }
        out += &format!(
            " whole process {:.1} ({:.1} with the fastest preset)\n  one core feeds about {:.0} faces/s: a machine of N cores about N x {:.0} (this one, {} cores: {:.0}), detection at most {:.0} faces/s per job\n",
            self.process_core_ms,
            self.fast_process_core_ms,
            self.per_core_faces_per_s,
            self.per_core_faces_per_s,
            self.cores,
            self.per_core_faces_per_s * self.cores as f64,
            self.detect_limit
        );
        if !self.fast_stage_busy.is_empty() {
            out += "  measured with the fastest preset, each stage's threads busy / its input queue full:";
            for (n, busy, fill) in &self.fast_stage_busy {
                out += &format!(" {n} {:.0}/{:.0} %,", 100.0 * busy, 100.0 * fill);
            }
            out += &format!(
                " the process kept {:.1} of {} cores busy\n",
                self.fast_cores_busy, self.cores
            );
        }
        let (here, here_limit) = self.host(self.cores.max(1), &[]);
        out += &format!(
            "  a host of 16 cores would feed about {:.0} faces/s, limited by {}; this one, {:.0}, limited by {here_limit}\n",
            self.host_16.0, self.host_16.1, here
        );
        out += &format!(
            "  with its models on its GPU (detection, the mesh, hands, identity: their runs, {:.1} core-ms a face here, left to it), a host of 16 cores would feed about {:.0} faces/s, limited by {}\n",
            self.fast_stage_model_ms.iter().map(|(_, ms)| ms).sum::<f64>(),
            self.gpu_host_16.0,
            self.gpu_host_16.1
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{median, Feeder};

    #[test]
    fn a_host_is_limited_by_its_cores_or_by_a_stage_that_cannot_use_them() {
        let f = Feeder {
            stage_core_ms: vec![("detect".into(), 2.0), ("align".into(), 8.0), ("temporal".into(), 4.0)],
            stage_threads: vec![1, 2, 1],
            per_core_faces_per_s: 100.0,
            ..Feeder::default()
        };
        // 2 cores: 200 faces/s from the cores, under every stage's cap.
        assert_eq!(f.host(2, &[]), (200.0, "all 2 cores".to_string()));
        // 16 cores: the temporal filter, one thread at 4 ms, caps it at 250.
        assert_eq!(f.host(16, &[]), (250.0, "temporal (one thread)".to_string()));
    }

    #[test]
    fn a_gpu_host_leaves_detection_and_the_mesh_to_its_gpu_and_the_fast_preset_sets_the_caps() {
        let mut f = Feeder {
            // At the run's preset the encode thread would cap 16 cores at 250; at the fastest,
            // 1000 / 0.5 = 2000.
            stage_core_ms: vec![("detect".into(), 4.0), ("mesh".into(), 6.0), ("encode".into(), 4.0)],
            fast_stage_core_ms: vec![("detect".into(), 4.0), ("mesh".into(), 6.0), ("encode".into(), 0.5)],
            // Their model runs: 3.5 of detection's 4 core-ms, 5 of the mesh's 6.
            fast_stage_model_ms: vec![("detect".into(), 3.5), ("mesh".into(), 5.0)],
            stage_threads: vec![1, 4, 1],
            fast_process_core_ms: 20.0,
            per_core_faces_per_s: 50.0,
            ..Feeder::default()
        };
        // Detection on one thread at 4 ms caps a CPU host at 250.
        assert_eq!(f.host(16, &[]), (250.0, "detect (one thread)".to_string()));
        // With the model runs on the GPU: 11.5 core-ms a face left, 1391 faces/s on 16 cores;
        // detection's 0.5 ms left on one thread caps at 2000, the mesh's 1 ms on 16 at 16000.
        let (faces, limit) = f.host(16, super::ON_GPU);
        assert!((faces - 16000.0 / 11.5).abs() < 1e-6, "{faces}");
        assert_eq!(limit, "all 16 cores");
        // What is left of detection on the host, on one thread, caps it when it is large.
        f.fast_stage_core_ms[0].1 = 4.5;
        assert_eq!(f.host(16, super::ON_GPU), (1000.0, "detect (one thread)".to_string()));
        // Unless it spreads that part over the pool (the mesh's crops): 0.2 of its 1 ms left
        // on one thread, 0.8 on 16.
        f.fast_stage_spread_ms = vec![("detect".into(), 0.8)];
        let (faces, limit) = f.host(16, super::ON_GPU);
        assert!((faces - 16000.0 / 11.5).abs() < 1e-6, "{faces} {limit}");
        assert_eq!(limit, "all 16 cores");
    }

    #[test]
    fn a_gpu_host_leaves_the_hands_and_identity_models_to_its_gpu_too() {
        let f = Feeder {
            fast_stage_core_ms: vec![("hands".into(), 0.3), ("identity".into(), 0.25), ("encode".into(), 0.5)],
            // Their model runs: 0.2 of the hands' 0.3 core-ms, 0.1 of identity's 0.25.
            fast_stage_model_ms: vec![("hands".into(), 0.2), ("identity".into(), 0.1)],
            stage_threads: vec![1, 1, 1],
            fast_process_core_ms: 10.3,
            per_core_faces_per_s: 1000.0 / 10.3,
            ..Feeder::default()
        };
        // 10 core-ms a face left on the host: 1600 faces/s on 16 cores.
        let (faces, limit) = f.host(16, super::ON_GPU);
        assert!((faces - 1600.0).abs() < 1e-6, "{faces} {limit}");
        assert_eq!(limit, "all 16 cores");
        assert!(f.host(16, &[]).0 < faces);
    }

    #[test]
    fn a_host_of_more_cores_shares_out_the_detection_copies() {
        let mut f = Feeder {
            // The decode stage's thread at 0.8 ms a face, 0.6 of it the detection copies.
            fast_stage_core_ms: vec![("decode".into(), 0.8), ("encode".into(), 0.3)],
            fast_stage_spread_ms: vec![("decode".into(), 0.6)],
            stage_threads: vec![1, 1],
            fast_process_core_ms: 5.0,
            per_core_faces_per_s: 200.0,
            ..Feeder::default()
        };
        // 16 cores: the copies on four threads (0.15 ms a thread), 0.2 ms left on the stage's
        // own: neither caps the 3200 faces/s all cores feed.
        assert_eq!(f.host(16, &[]), (3200.0, "all 16 cores".to_string()));
        // All of it on the thread (a build that made the copies there whatever the cores): 1250.
        f.fast_stage_spread_ms.clear();
        assert_eq!(f.host(16, &[]), (1250.0, "decode (one thread)".to_string()));
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}
