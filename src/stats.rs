//! Run statistics: in, per-stage busy times and queue samples, per-worker batch timings recorded
//! by the pipeline; out, the end-of-run summary as a table for people and JSON for machines.

use std::fmt;

use serde::Serialize;
use std::time::{Duration, Instant};

/// Busy time, item count and input-queue occupancy of one stage.
#[derive(Clone, Debug, Default)]
pub struct StageStat {
    pub name: &'static str,
    pub busy: Duration,
    pub items: u64,
    /// Sum of the input queue's length sampled at each receive, and the number of samples.
    pub(crate) queue_sum: u64,
    pub(crate) queue_samples: u64,
    pub(crate) queue_cap: usize,
    /// Threads the stage ran on (a pool stage has several; 0 is read as 1).
    pub threads: usize,
    /// CPU time its threads spent working (their own clocks, not the wall): core-seconds, so
    /// a stage's cost per face does not count the time it waited for a core on a busy machine.
    pub cpu: Duration,
    /// The part of `cpu` spent inside a model session's run (detection, the face mesh): what a
    /// GPU takes over; the rest (crops, maps decoded, points) stays on the host.
    pub model_cpu: Duration,
    /// The part of `cpu` outside the model runs that is shared out over threads wherever the
    /// stage runs, though the rest of it keeps to one thread on a GPU host (the face mesh's
    /// crops in detection's chain): a GPU host runs it at its pool's width.
    pub(crate) spread_cpu: Duration,
    /// Frames go through the stage one after another on one thread, which shares each frame's
    /// work out to helpers and waits for them (detection's windows, the temporal filter's
    /// bands): `busy` is that thread's, and the stage can take no more than it.
    pub chain: bool,
}

impl StageStat {
    /// The stage `name` run by several threads: their statistics added up.
    pub fn sum(name: &'static str, queue_cap: usize, parts: impl IntoIterator<Item = StageStat>) -> StageStat {
        let mut total = StageStat {
            name,
            queue_cap,
            ..Default::default()
        };
        for st in parts {
            total.threads += st.threads.max(1);
            total.busy += st.busy;
            total.cpu += st.cpu;
            total.model_cpu += st.model_cpu;
            total.spread_cpu += st.spread_cpu;
            total.items += st.items;
            total.queue_sum += st.queue_sum;
            total.queue_samples += st.queue_samples;
        }
        total
    }

    /// Mean input-queue occupancy as a share of its capacity.
    pub fn queue_fill(&self) -> f64 {
        if self.queue_samples == 0 || self.queue_cap == 0 {
            return 0.0;
        }
        self.queue_sum as f64 / self.queue_samples as f64 / self.queue_cap as f64
    }

    /// Share of the wall time `wall` (seconds) its threads were busy, over all of them; for a
    /// [`StageStat::chain`], its one thread's (at 100 % it holds the run back, whatever its
    /// helpers do).
    pub fn busy_share(&self, wall: f64) -> f64 {
        let threads = if self.chain { 1 } else { self.threads.max(1) };
        self.busy.as_secs_f64() / wall.max(1e-9) / threads as f64
    }
}

/// CPU time this thread has used so far (Linux: its own clock; elsewhere zero).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux kernel this runs on provides.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    if ok {
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    } else {
        Duration::ZERO
    }
}

/// Measures the time a stage spends working (not waiting on its channels).
pub(crate) struct Clock {
    stat: StageStat,
}

impl Clock {
    pub(crate) fn new(name: &'static str, queue_cap: usize) -> Self {
        Self {
            stat: StageStat {
                name,
                queue_cap,
                threads: 1,
                ..Default::default()
            },
        }
    }

    /// Runs `f`, counting its time as busy (wall and this thread's CPU time).
    pub(crate) fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (t, c) = (Instant::now(), thread_cpu_time());
        let r = f();
        self.stat.busy += t.elapsed();
        self.stat.cpu += thread_cpu_time().saturating_sub(c);
        r
    }

    /// Adds time measured by the caller: wall time and this thread's CPU time.
    pub(crate) fn add(&mut self, wall: Duration, cpu: Duration) {
        self.stat.busy += wall;
        self.stat.cpu += cpu;
    }

    pub(crate) fn count(&mut self, n: u64) {
        self.stat.items += n;
    }

    /// Records the input queue's length seen at a receive.
    pub(crate) fn queue(&mut self, len: usize) {
        self.stat.queue_sum += len as u64;
        self.stat.queue_samples += 1;
    }

    pub(crate) fn finish(self) -> StageStat {
        self.stat
    }
}

/// What one enhancement worker (a CPU session or a GPU) did.
#[derive(Clone, Debug, Default)]
pub struct WorkerStat {
    pub name: String,
    pub batches: u64,
    pub faces: u64,
    /// Time spent in model calls (input copy, run, output conversion).
    pub busy: Duration,
    /// Batch size asked for, to compute the mean fill.
    pub batch: usize,
    /// GPU memory this process holds on the worker's GPU at the end of the run, in MiB, as the
    /// NVIDIA driver reports it (ONNX Runtime keeps its arena, so this is its high-water mark).
    pub(crate) device_mib: Option<u64>,
    /// Faces whose restored crop held NaN or infinity, left as they were.
    pub(crate) nonfinite: u64,
}

/// GPU memory used by this process on each GPU index, from `nvidia-smi` (empty without one).
pub(crate) fn gpu_memory_by_index() -> Vec<(u32, u64)> {
    let query = |args: &[&str]| {
        std::process::Command::new("nvidia-smi")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (Some(gpus), Some(apps)) = (
        query(&["--query-gpu=index,uuid", "--format=csv,noheader,nounits"]),
        query(&[
            "--query-compute-apps=pid,gpu_uuid,used_memory",
            "--format=csv,noheader,nounits",
        ]),
    ) else {
        return Vec::new();
    };
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for g in gpus.lines() {
        let mut f = g.split(',').map(str::trim);
        let (Some(Ok(index)), Some(uuid)) = (f.next().map(str::parse::<u32>), f.next()) else {
            continue;
        };
        let used: u64 = apps
            .lines()
            .map(|l| l.split(',').map(str::trim).collect::<Vec<_>>())
            .filter(|c| c.len() == 3 && c[0] == me && c[1] == uuid)
            .filter_map(|c| c[2].parse::<u64>().ok())
            .sum();
        out.push((index, used));
    }
    out
}

impl WorkerStat {
    pub fn ms_per_batch(&self) -> f64 {
        1000.0 * self.busy.as_secs_f64() / self.batches.max(1) as f64
    }

    pub fn mean_fill(&self) -> f64 {
        self.faces as f64 / (self.batches.max(1) * self.batch.max(1) as u64) as f64
    }
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub frames: u64,
    pub faces: u64,
    /// Frames with at least one face.
    pub frames_with_faces: u64,
    pub batches: u64,
    /// Most frames the dispatcher held at once, waiting for their faces.
    pub(crate) held_max: usize,
    /// A video's budget of decoded frames in flight, and the most that were out at once.
    pub(crate) in_flight: Option<(usize, usize)>,
    /// Detector passes: over whole frames, and over windows around tracked faces.
    pub detect: DetectCounts,
    pub wall: Duration,
    pub stages: Vec<StageStat>,
    pub workers: Vec<WorkerStat>,
    /// Peak resident memory of the process so far, in bytes (Linux).
    pub(crate) peak_rss: Option<u64>,
    /// The restoration's flicker inside faces, when the temporal filter ran.
    pub flicker: Option<Flicker>,
    /// How much of who each face is the restoration kept, per track (with the identity model).
    pub identity: Vec<TrackIdentity>,
    /// Faces found and left alone, by why (the job's selection).
    pub left: Left,
    /// Frames on which hands in front of faces were kept (`--occlusion hands`; `None` where no
    /// hands stage ran).
    pub hands_frames: Option<u64>,
}

/// Faces found and deliberately left alone, by why: under `--min-face`, not one of the people
/// `--only-face` names, one `--skip-face` names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Left {
    pub small: u64,
    pub not_named: u64,
    pub skipped: u64,
}

impl Left {
    /// Counts one face left alone for `why` (the chooser's word: `small`, `not named`,
    /// `skipped`).
    pub fn add(&mut self, why: &str) {
        match why {
            "small" => self.small += 1,
            "not named" => self.not_named += 1,
            _ => self.skipped += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.small + self.not_named + self.skipped
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: Left) {
        self.small += other.small;
        self.not_named += other.not_named;
        self.skipped += other.skipped;
    }

    /// "N left alone (a under --min-face, b not named by --only-face, c by --skip-face)", or
    /// nothing when none was.
    pub fn words(&self) -> Option<String> {
        if self.total() == 0 {
            return None;
        }
        let parts: Vec<String> = [
            (self.small, "under --min-face"),
            (self.not_named, "not named by --only-face"),
            (self.skipped, "named by --skip-face"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        Some(format!("{} left alone ({})", self.total(), parts.join(", ")))
    }
}

/// One track's identity figures: the median calibrated identity (see
/// `people::identity_of`: 1 unchanged, 0.5 at dlib's threshold of one person) of its faces as
/// pasted and as the restorer gave them, over the faces measured, and what the guard did.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TrackIdentity {
    /// The track (absent for faces without one: pictures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub track: Option<u64>,
    /// The identity of what was pasted.
    #[serde(rename = "identity")]
    pub median: f32,
    /// The identity of what the restorer gave.
    #[serde(rename = "identity_restorer")]
    pub own: f32,
    /// Whether the pasted faces are still the same person at the run's --face-distance.
    pub same: bool,
    /// The least share of the model's change the guard gave the track's faces (1 unless it
    /// backed off; it decides each stretch of frames afresh).
    pub share: f32,
    /// The highest fidelity the guard ran its faces at, where it raised the run's (a model with
    /// a fidelity input).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fidelity: Option<f32>,
    /// What the guard did: `backed off`, `left as it was` or `warned`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<&'static str>,
    /// The track's first and last frame.
    pub frames: [u64; 2],
    pub measured: u64,
    /// The median quality of its faces before and after (BRISQUE), when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<Quality>,
}

/// A no-reference quality figure (BRISQUE: lower is better) before and after restoration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Quality {
    pub before: f32,
    pub after: f32,
}

impl Summary {
    pub fn fps(&self) -> f64 {
        self.frames as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn faces_per_s(&self) -> f64 {
        self.faces as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Faces the model returned NaN or infinity for, left as they were.
    pub fn faces_not_finite(&self) -> u64 {
        self.workers.iter().map(|w| w.nonfinite).sum()
    }

    /// The summary as a JSON object.
    pub fn to_json(&self) -> String {
        let wall = self.wall.as_secs_f64().max(1e-9);
        let json = SummaryJson {
            frames: self.frames,
            faces: self.faces,
            faces_found: self.faces + self.left.total(),
            faces_left: self.left,
            frames_with_faces: self.frames_with_faces,
            frames_with_hands: self.hands_frames,
            batches: self.batches,
            frames_held_max: self.held_max,
            frames_in_flight_budget: self.in_flight.map(|f| f.0),
            frames_in_flight_max: self.in_flight.map(|f| f.1),
            detect_full: self.detect.full,
            detect_windows: self.detect.windows,
            detect_followed: self.detect.followed,
            frames_over_max_faces: self.detect.capped,
            detections_not_faces: self.detect.not_faces,
            detections_kept_doubted: self.detect.kept_doubted,
            wall_s: wall,
            fps: self.fps(),
            faces_per_s: self.faces_per_s(),
            peak_rss_bytes: self.peak_rss,
            faces_not_finite: self.faces_not_finite(),
            identity: &self.identity,
            quality_metric: self.identity.iter().any(|t| t.quality.is_some()).then_some("brisque"),
            flicker: self.flicker.map(|f| FlickerJson {
                output_levels: f.output(),
                unfiltered_levels: f.unfiltered(),
                input_levels: f.input_rms(),
                kept: f.kept(),
                pairs: f.pairs,
                filtered: f.filtered,
            }),
            stages: self
                .stages
                .iter()
                .map(|s| StageJson {
                    name: s.name,
                    items: s.items,
                    threads: s.threads.max(1),
                    busy_s: s.busy.as_secs_f64(),
                    busy_share: s.busy_share(wall),
                    cpu_s: s.cpu.as_secs_f64(),
                    model_cpu_s: s.model_cpu.as_secs_f64(),
                    spread_cpu_s: s.spread_cpu.as_secs_f64(),
                    cpu_ms_per_face: 1000.0 * s.cpu.as_secs_f64() / self.faces.max(1) as f64,
                    queue_fill: s.queue_fill(),
                })
                .collect(),
            workers: self
                .workers
                .iter()
                .map(|w| WorkerJson {
                    name: &w.name,
                    batches: w.batches,
                    faces: w.faces,
                    faces_per_s: w.faces as f64 / wall,
                    mean_batch_fill: w.mean_fill(),
                    ms_per_batch: w.ms_per_batch(),
                    busy_share: w.busy.as_secs_f64() / wall,
                    device_mib: w.device_mib,
                    faces_not_finite: w.nonfinite,
                })
                .collect(),
        };
        serde_json::to_string(&json).expect("plain numbers and strings serialise")
    }
}

/// The stats JSON's shape (`--stats-json`).
#[derive(Serialize)]
struct SummaryJson<'a> {
    frames: u64,
    /// Faces restored.
    faces: u64,
    /// Faces found: restored and left alone.
    faces_found: u64,
    /// Faces found and left alone, by why.
    faces_left: Left,
    frames_with_faces: u64,
    /// Frames on which hands in front of faces were kept (with `--occlusion hands`).
    #[serde(skip_serializing_if = "Option::is_none")]
    frames_with_hands: Option<u64>,
    batches: u64,
    frames_held_max: usize,
    /// A video's budget of decoded frames in flight at once (the decoder waits beyond it).
    frames_in_flight_budget: Option<usize>,
    /// The most decoded frames that were in flight at once.
    frames_in_flight_max: Option<usize>,
    detect_full: u64,
    detect_windows: u64,
    /// Faces followed by the face mesh from the frame before (no detector pass for them).
    detect_followed: u64,
    frames_over_max_faces: u64,
    /// Detections the face mesh dropped as not faces.
    detections_not_faces: u64,
    /// Detections the face mesh doubted, kept on the detector's confident score or their
    /// track's support.
    detections_kept_doubted: u64,
    wall_s: f64,
    fps: f64,
    faces_per_s: f64,
    peak_rss_bytes: Option<u64>,
    /// Faces left as they were because the model returned NaN or infinity for them.
    faces_not_finite: u64,
    /// The restoration's flicker inside faces (with the temporal filter).
    #[serde(skip_serializing_if = "Option::is_none")]
    flicker: Option<FlickerJson>,
    /// Each track's identity figure, when measured.
    #[serde(skip_serializing_if = "<[TrackIdentity]>::is_empty")]
    identity: &'a [TrackIdentity],
    /// The no-reference quality measure of the tracks' `quality` (lower is better).
    #[serde(skip_serializing_if = "Option::is_none")]
    quality_metric: Option<&'static str>,
    stages: Vec<StageJson>,
    workers: Vec<WorkerJson<'a>>,
}

/// [`Flicker`] as JSON: levels of frame-to-frame RMS change inside
/// faces, in crop space along each track.
#[derive(Serialize)]
struct FlickerJson {
    /// The output's change beyond the input's: the restoration's own flicker.
    output_levels: f64,
    /// The same without the temporal filter.
    unfiltered_levels: f64,
    /// The input's own frame-to-frame change.
    input_levels: f64,
    /// Share of the model's change the filter kept (mean absolute value).
    kept: f64,
    /// Consecutive crop pairs measured.
    pairs: u64,
    /// Whether the filter ran (`--temporal` above 0) or only measured.
    filtered: bool,
}

#[derive(Serialize)]
struct StageJson {
    name: &'static str,
    items: u64,
    /// Threads the stage ran on.
    threads: usize,
    /// Wall time its threads were busy, summed over them.
    busy_s: f64,
    /// `busy_s` over the wall time and the threads.
    busy_share: f64,
    /// CPU time its threads used while busy (core-seconds).
    cpu_s: f64,
    /// The part of it inside model sessions (detection, the face mesh).
    model_cpu_s: f64,
    /// The part of `cpu_s` a GPU host still spreads over its pool (see `StageStat::spread_cpu`).
    spread_cpu_s: f64,
    cpu_ms_per_face: f64,
    queue_fill: f64,
}

#[derive(Serialize)]
struct WorkerJson<'a> {
    name: &'a str,
    batches: u64,
    faces: u64,
    faces_per_s: f64,
    mean_batch_fill: f64,
    ms_per_batch: f64,
    busy_share: f64,
    device_mib: Option<u64>,
    faces_not_finite: u64,
}

/// Peak resident set size of this process (VmHWM), in bytes.
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Summary {
    /// The summary's first line: frames, faces, batches, time and rates (what a run prints by
    /// default; `--stats` prints the whole [`Display`](fmt::Display)).
    pub fn headline(&self) -> String {
        let wall = self.wall.as_secs_f64().max(1e-9);
        let per_frame = self.faces as f64 / self.frames.max(1) as f64;
        format!(
            "{} frames, {} faces{} ({per_frame:.2} per frame, {} frames with faces{}), {} batches, {wall:.2} s, {:.1} fps, {:.1} faces/s{}",
            self.frames,
            self.faces,
            self.left.words().map_or(String::new(), |w| format!(" restored, {w}")),
            self.frames_with_faces,
            self.hands_frames
                .map_or(String::new(), |n| format!(", hands kept in front on {n}")),
            self.batches,
            self.fps(),
            self.faces_per_s(),
            self.peak_rss.map_or(String::new(), |b| format!(", peak memory {} MiB", b >> 20))
        )
    }
}

impl Summary {
    /// How much identity each track kept (1 unchanged, 0.5 at dlib's threshold of one person),
    /// whether it is still the same person, what the guard did, and its quality before and
    /// after, when measured.
    pub fn identity_line(&self) -> Option<String> {
        let worst = self.identity.iter().min_by(|a, b| a.median.total_cmp(&b.median))?;
        let each: Vec<String> = self
            .identity
            .iter()
            .map(|t| {
                let who = t.track.map_or("pictures".to_string(), |n| format!("track {n}"));
                let mut words = format!("{who} {:.2}{}", t.median, if t.same { "" } else { " (another person)" });
                match t.guard {
                    Some("backed off") => {
                        words += &format!(
                            " backed off to {:.2} of the change (restorer's own {:.2})",
                            t.share, t.own
                        )
                    }
                    Some("left as it was") => words += &format!(" left as it was (restorer's own {:.2})", t.own),
                    _ => {}
                }
                if let Some(q) = t.quality {
                    words += &format!(" quality {:.1} -> {:.1}", q.before, q.after);
                }
                words
            })
            .collect();
        Some(format!(
            "identity (1 is unchanged, below 0.5 another person): {}; worst {:.2}",
            each.join(", "),
            worst.median
        ))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wall = self.wall.as_secs_f64().max(1e-9);
        writeln!(f, "{}", self.headline())?;
        if self.faces_not_finite() > 0 {
            writeln!(
                f,
                "  {} faces kept as they were: the model returned NaN or infinity for them",
                self.faces_not_finite()
            )?;
        }
        if let Some(fl) = self.flicker.filter(|fl| fl.pairs > 0) {
            let filter = if fl.filtered {
                format!(
                    "{:.2} without the temporal filter, which kept {:.0} % of the model's change",
                    fl.unfiltered(),
                    100.0 * fl.kept()
                )
            } else {
                "temporal filter off".into()
            };
            writeln!(
                f,
                "  flicker inside faces: the restored detail changes {:+.2} levels more from frame to frame than the input's {:.2} ({filter})",
                fl.output(),
                fl.input_rms(),
            )?;
        }
        if let Some(line) = self.identity_line() {
            writeln!(f, "  {line}")?;
        }
        writeln!(
            f,
            "  {:<8} {:>7} {:>6} {:>8} {:>12}",
            "stage", "threads", "busy", "queue", "core-ms/face"
        )?;
        for s in &self.stages {
            let busy = 100.0 * s.busy_share(wall);
            let per_face = 1000.0 * s.cpu.as_secs_f64() / self.faces.max(1) as f64;
            write!(
                f,
                "  {:<8} {:>7} {busy:>5.0}% {:>7.0}% {per_face:>12.2}",
                s.name,
                s.threads.max(1),
                100.0 * s.queue_fill()
            )?;
            if let (true, Some((budget, most))) = (s.name == "decode", self.in_flight) {
                write!(f, "   at most {most} frames in flight of a budget of {budget}")?;
            }
            if s.name == "detect" {
                write!(f, "   {} full passes", self.detect.full)?;
                if self.detect.followed > 0 {
                    write!(
                        f,
                        ", {} faces followed by the mesh; {} detections dropped as not faces, {} kept though it doubted them",
                        self.detect.followed, self.detect.not_faces, self.detect.kept_doubted
                    )?;
                } else {
                    write!(f, ", {} windows around tracked faces", self.detect.windows)?;
                }
            }
            if s.name == "mesh" {
                write!(
                    f,
                    "   {} detections dropped as not faces, {} kept though it doubted them (a confident score or a track that confirms them)",
                    self.detect.not_faces, self.detect.kept_doubted
                )?;
            }
            writeln!(f)?;
        }
        write!(
            f,
            "  {:<8} {:>7} {:>6} {:>8} {:>6} {:>9} {:>8}",
            "worker", "batches", "faces", "faces/s", "fill", "ms/batch", "GPU MiB"
        )?;
        for w in &self.workers {
            write!(
                f,
                "\n  {:<8} {:>7} {:>6} {:>8.1} {:>5.0}% {:>9.1} {:>8}",
                w.name,
                w.batches,
                w.faces,
                w.faces as f64 / wall,
                100.0 * w.mean_fill(),
                w.ms_per_batch(),
                w.device_mib.map_or("-".to_string(), |m| m.to_string())
            )?;
        }
        Ok(())
    }
}

/// Counts of detector passes in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectCounts {
    /// Passes over the whole detection copy.
    pub full: u64,
    /// Passes over a window around a tracked face.
    pub windows: u64,
    /// Frames with more faces than `--max-faces` (the rest were left out).
    pub(crate) capped: u64,
    /// Faces followed by the face mesh from their points on the frame before (no detector
    /// pass for them).
    pub followed: u64,
    /// Detections the face mesh did not take for faces (dropped).
    pub(crate) not_faces: u64,
    /// Detections the face mesh doubted, kept on the detector's confident score or their
    /// track's support (see [`crate::defaults::CONFIDENT`]).
    pub(crate) kept_doubted: u64,
}

/// The flicker figures of a run: inside faces, in crop space, frame to frame along each track
/// (so neither camera nor face motion counts).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Flicker {
    /// Whether the filter ran (a memory above 0), or only measured.
    pub filtered: bool,
    /// Pairs of consecutive crops of one track, and the face pixels summed over them.
    pub pairs: u64,
    pub(crate) cells: u64,
    /// Sums of squared frame-to-frame changes: of the input, of the output, and of what the
    /// output would be without the filter.
    pub(crate) input_sq: f64,
    pub(crate) output_sq: f64,
    pub(crate) raw_sq: f64,
    /// Sums of the absolute change pasted after the filter and given by the model.
    pub(crate) kept_abs: f64,
    pub(crate) model_abs: f64,
}

impl Flicker {
    fn rms(&self, sq: f64) -> f64 {
        (sq / self.cells.max(1) as f64).sqrt()
    }

    /// Frame-to-frame RMS change of the input inside faces, in levels.
    pub(crate) fn input_rms(&self) -> f64 {
        self.rms(self.input_sq)
    }

    /// The restoration's flicker: the output's frame-to-frame RMS change inside faces minus the
    /// input's, in levels.
    pub fn output(&self) -> f64 {
        self.rms(self.output_sq) - self.input_rms()
    }

    /// The flicker the model's change would have had without the filter.
    pub fn unfiltered(&self) -> f64 {
        self.rms(self.raw_sq) - self.input_rms()
    }

    /// Share of the model's change (mean absolute value of its luma) the filter kept.
    pub fn kept(&self) -> f64 {
        if self.model_abs > 0.0 {
            self.kept_abs / self.model_abs
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage whose frames go one after another through one thread (helpers inside each
    /// frame's work) is as busy as that thread: spread over its helpers, detection at 100 %
    /// read as 25 % on four threads and hid the stage that held the run back.
    #[test]
    fn a_chain_stage_is_as_busy_as_its_one_thread() {
        let st = |chain| StageStat {
            busy: Duration::from_millis(900),
            threads: 4,
            chain,
            ..Default::default()
        };
        assert!((st(true).busy_share(1.0) - 0.9).abs() < 1e-9);
        assert!((st(false).busy_share(1.0) - 0.225).abs() < 1e-9);
    }
    /// The run's table says how many decoded frames were in flight against the budget, and
    /// the stats JSON has both figures.
    #[test]
    fn the_run_reports_its_frames_in_flight_against_the_budget() {
        let summary = Summary {
            frames: 10,
            faces: 10,
            stages: vec![StageStat {
                name: "decode",
                ..StageStat::default()
            }],
            in_flight: Some((29, 27)),
            ..Summary::default()
        };
        let text = summary.to_string();
        assert!(text.contains("at most 27 frames in flight of a budget of 29"), "{text}");
        let json = summary.to_json();
        assert!(
            json.contains("\"frames_in_flight_budget\":29,\"frames_in_flight_max\":27"),
            "{json}"
        );
        // A stream of pictures has no budget: neither line nor figures.
        let pictures = Summary {
            in_flight: None,
            ..summary
        };
        assert!(!pictures.to_string().contains("in flight"));
        assert!(pictures.to_json().contains("\"frames_in_flight_budget\":null"));
    }
}
