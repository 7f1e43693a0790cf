//! Jobs over HTTP: in, uploads (a video or a photo) streamed to `--jobs-dir` with the CLI's
//! flags as a query; out, each job restored in the background, one at a time (a film in
//! segments, so a service killed mid-job resumes from the finished ones), its state and
//! progress, and its result served with HTTP Range.
//!
//! ```text
//!  POST /v1/jobs?name=clip.mp4&blend=0.8 ─ body streamed to DIR/ID/input.part ─ probed ─> 202
//!  job thread: the oldest queued job ─> DIR/ID/result.EXT (segments in DIR/ID/.result.EXT.segments)
//!  GET /v1/jobs[/ID] state, progress; GET /v1/jobs/ID/result (Range); DELETE /v1/jobs/ID
//! ```
//! Each job is a folder named by its id (128 random bits in hex) holding `job.json` (its record,
//! written whole by rename), its input and, once done, its result. Nothing outside the jobs
//! folder is read or written, and inside it only folders named by an id. At start the folder is
//! read back: a job that was queued or running is queued again (a film resumes from its
//! finished segments), an upload that never finished is removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::engine::{CancelToken, Failure, Kind};
use crate::faces::paste::MaskKind;
use crate::output::write_atomic;
use crate::treatment::Treatment;
use clap::ValueEnum as _;

/// How jobs are kept and limited.
#[derive(Clone, Debug)]
pub struct JobsOptions {
    pub dir: PathBuf,
    /// Largest upload, in bytes.
    pub max_upload: u64,
    /// Most bytes the jobs folder holds (finished jobs expire, oldest first, to make room).
    pub quota: u64,
    /// How long a finished job is kept.
    pub ttl: Duration,
    /// Jobs waiting or running at once; more are refused.
    pub max_jobs: usize,
    /// Segment length of a film, in seconds (what a restart resumes from).
    pub segment: f64,
    /// Largest photo, in pixels (`--max-pixels`).
    pub max_pixels: u64,
    /// Largest photo, in bytes (`--max-body-mb`): a photo is read whole to be checked.
    pub max_photo_bytes: u64,
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl State {
    fn finished(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// The flags a job may set, as its query gives them (the CLI's names and meanings).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct JobQuery {
    /// The upload's file name (its extension says what it is; shown and used for the download).
    pub name: Option<String>,
    /// One of [`offered_models`] by name (never a path).
    pub model: Option<String>,
    pub blend: Option<f32>,
    pub mask: Option<String>,
    pub temporal: Option<f32>,
    pub smooth: Option<f32>,
    pub compare: Option<String>,
}

/// A job's record (`job.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub state: State,
    /// `video` or `photo`.
    pub kind: String,
    /// The upload's name as given (for display and the download's name).
    pub name: String,
    /// File names inside the job's folder.
    pub input: String,
    pub output: String,
    pub query: JobQuery,
    pub created: f64,
    pub started: Option<f64>,
    pub finished: Option<f64>,
    pub frames_done: u64,
    pub frames_total: Option<u64>,
    pub fps: Option<f64>,
    pub error: Option<String>,
    pub result_bytes: Option<u64>,
}

impl Record {
    /// The record as the API answers it: with progress, ETA and links.
    pub fn answer(&self) -> serde_json::Value {
        let progress = match (self.state, self.frames_total) {
            (State::Done, _) => 1.0,
            (_, Some(t)) if t > 0 => (self.frames_done as f64 / t as f64).min(1.0),
            _ => 0.0,
        };
        let eta = match (self.state, self.frames_total, self.fps) {
            (State::Running, Some(t), Some(fps)) if fps > 0.0 => Some(t.saturating_sub(self.frames_done) as f64 / fps),
            _ => None,
        };
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["progress"] = serde_json::json!(progress);
        v["eta_s"] = serde_json::json!(eta);
        v["url"] = serde_json::json!(format!("/v1/jobs/{}", self.id));
        if self.state == State::Done {
            v["result_url"] = serde_json::json!(format!("/v1/jobs/{}/result", self.id));
        }
        v
    }

    /// The download's file name: the upload's stem, `-restored`, the result's extension.
    pub fn download_name(&self) -> String {
        let stem = Path::new(&self.name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("job");
        let clean: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(80)
            .collect();
        let ext = Path::new(&self.output)
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("bin");
        format!("{clean}-restored.{ext}")
    }
}

/// One job in memory: its record and what stops it.
struct Entry {
    rec: Record,
    cancel: CancelToken,
}

/// The jobs of a service: the table, the folder, and the thread that runs them.
pub struct Jobs {
    pub opts: JobsOptions,
    settings: Settings,
    table: Mutex<BTreeMap<String, Entry>>,
    /// Signalled when a job is queued or the service stops.
    wake: Condvar,
    stopping: AtomicBool,
    /// Seconds each finished job ran, for the metrics' histogram.
    pub seconds: Mutex<Vec<f64>>,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A new job id: 128 bits from the kernel's random source, in hex.
pub fn new_id() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("cannot read /dev/urandom for a job id")?;
    Ok(hex::encode(b))
}

/// Whether `id` has the form of a job id (32 lower-case hex digits): nothing else names a
/// folder, so no request can reach outside the jobs folder.
pub fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The default jobs folder: under the user's state folder, beside nothing a user names.
pub fn default_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("gpen-video/jobs"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".local/state/gpen-video/jobs")),
        None => bail!("no HOME or XDG_STATE_HOME to keep jobs under: pass --jobs-dir DIR"),
    }
}

/// Video containers kept as they are for the result; any other video is written as Matroska,
/// which holds every stream FFmpeg decodes.
const KEPT_CONTAINERS: [&str; 3] = ["mp4", "mkv", "mov"];

impl Jobs {
    /// Opens (creating) the jobs folder and reads back the jobs in it.
    pub fn open(settings: Settings, opts: JobsOptions) -> Result<Arc<Jobs>> {
        std::fs::create_dir_all(&opts.dir)
            .with_context(|| format!("cannot create the jobs folder {} (--jobs-dir)", opts.dir.display()))?;
        let mut table = BTreeMap::new();
        for entry in std::fs::read_dir(&opts.dir).with_context(|| format!("cannot read {}", opts.dir.display()))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if !valid_id(&name) || !entry.path().is_dir() {
                continue;
            }
            let dir = entry.path();
            let rec: Option<Record> = std::fs::read(dir.join("job.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let Some(mut rec) = rec.filter(|r: &Record| r.id == name) else {
                // An upload that never finished (or a record beyond reading): nothing to resume.
                tracing::info!(job = %name, "removing an unfinished upload");
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            };
            match rec.state {
                State::Running | State::Queued => {
                    rec.state = State::Queued;
                    rec.fps = None;
                    tracing::info!(job = %name, "queued again after a restart (a film resumes from its finished segments)");
                }
                State::Done if !dir.join(&rec.output).is_file() => {
                    rec.state = State::Failed;
                    rec.error = Some("the result is missing from the jobs folder".into());
                }
                _ => {}
            }
            let _ = write_atomic(&dir.join("job.json"), &serde_json::to_vec_pretty(&rec)?);
            table.insert(
                name,
                Entry {
                    rec,
                    cancel: CancelToken::new(),
                },
            );
        }
        Ok(Arc::new(Jobs {
            opts,
            settings,
            table: Mutex::new(table),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            seconds: Mutex::new(Vec::new()),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dir_of(&self, id: &str) -> PathBuf {
        self.opts.dir.join(id)
    }

    /// Every job's record, oldest first.
    pub fn list(&self) -> Vec<Record> {
        let mut v: Vec<Record> = self.lock().values().map(|e| e.rec.clone()).collect();
        v.sort_by(|a, b| a.created.total_cmp(&b.created));
        v
    }

    pub fn get(&self, id: &str) -> Option<Record> {
        self.lock().get(id).map(|e| e.rec.clone())
    }

    /// Jobs by state: (queued, running, done, failed).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let t = self.lock();
        let n = |s: State| t.values().filter(|e| e.rec.state == s).count();
        (n(State::Queued), n(State::Running), n(State::Done), n(State::Failed))
    }

    /// The result file of a done job.
    pub fn result(&self, id: &str) -> Result<(Record, PathBuf)> {
        let rec = self.get(id).ok_or_else(|| not_found(id))?;
        if rec.state != State::Done {
            return Err(Failure::error(
                Kind::Conflict,
                format!(
                    "job {id} is {}: its result is there once it is done",
                    state_name(rec.state)
                ),
            ));
        }
        let path = self.dir_of(id).join(&rec.output);
        Ok((rec, path))
    }

    /// Cancels a job and removes it with its files (a running one's files once it has stopped).
    pub fn delete(&self, id: &str) -> Result<Record> {
        let mut t = self.lock();
        let mut e = t.remove(id).ok_or_else(|| not_found(id))?;
        e.cancel.cancel();
        let running = e.rec.state == State::Running;
        if !e.rec.state.finished() {
            e.rec.state = State::Cancelled;
        }
        drop(t);
        if !running {
            std::fs::remove_dir_all(self.dir_of(id))
                .with_context(|| format!("cannot remove job {id}'s files"))
                .map_err(|e| Failure::error(Kind::Io, format!("{e:#}")))?;
        }
        // A running job's folder goes when its thread sees the job gone (`run_one`).
        Ok(e.rec)
    }

    /// Room for `incoming` more bytes under the quota, made by removing finished jobs, oldest
    /// first; the bytes that may still come in, or why none.
    pub fn make_room(&self, incoming: u64) -> Result<u64> {
        self.expire();
        let quota_full = || {
            Failure::error(
                Kind::TooLarge,
                format!(
                    "the upload is larger than the jobs folder holds ({:.3} GB, --jobs-quota-gb)",
                    self.opts.quota as f64 / 1e9
                ),
            )
        };
        if incoming > self.opts.quota {
            return Err(quota_full());
        }
        let mut used = crate::output::bytes_under(&self.opts.dir);
        while used.saturating_add(incoming) > self.opts.quota {
            let oldest = {
                let t = self.lock();
                t.values()
                    .filter(|e| e.rec.state.finished())
                    .min_by(|a, b| a.rec.finished.unwrap_or(0.0).total_cmp(&b.rec.finished.unwrap_or(0.0)))
                    .map(|e| e.rec.id.clone())
            };
            let Some(id) = oldest else { break };
            tracing::info!(job = %id, "removing a finished job to make room (--jobs-quota-gb)");
            let _ = self.delete(&id);
            used = crate::output::bytes_under(&self.opts.dir);
        }
        let left = self.opts.quota.saturating_sub(used);
        if left < incoming.max(1) {
            return Err(Failure::error(
                Kind::TooLarge,
                format!(
                    "the jobs folder holds {:.2} GB of its {:.2} GB (--jobs-quota-gb) in jobs not finished: try again once they are done, or delete some",
                    used as f64 / 1e9,
                    self.opts.quota as f64 / 1e9
                ),
            ));
        }
        Ok(left)
    }

    /// Removes finished jobs older than `--job-ttl-h`.
    pub fn expire(&self) {
        let cutoff = now() - self.opts.ttl.as_secs_f64();
        let old: Vec<String> = self
            .lock()
            .values()
            .filter(|e| e.rec.state.finished() && e.rec.finished.unwrap_or(0.0) < cutoff)
            .map(|e| e.rec.id.clone())
            .collect();
        for id in old {
            tracing::info!(job = %id, "removing a finished job past --job-ttl-h");
            let _ = self.delete(&id);
        }
    }

    /// A place for a new job: its id and folder, or why not (too many jobs waiting).
    pub fn reserve(&self) -> Result<(String, PathBuf)> {
        let waiting = self.lock().values().filter(|e| !e.rec.state.finished()).count();
        if waiting >= self.opts.max_jobs {
            return Err(Failure::error(
                Kind::TooMany,
                format!(
                    "{waiting} jobs are waiting or running (--max-jobs {}): send this one when one is done",
                    self.opts.max_jobs
                ),
            ));
        }
        let id = new_id()?;
        let dir = self.dir_of(&id);
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok((id, dir))
    }

    /// Checks a finished upload (`dir/input.part`), names it by what it is and queues its job;
    /// its record. On error the folder is removed.
    pub fn admit(&self, id: &str, query: JobQuery) -> Result<Record> {
        let dir = self.dir_of(id);
        let r = self.admit_in(id, &dir, query);
        if r.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        r
    }

    fn admit_in(&self, id: &str, dir: &Path, query: JobQuery) -> Result<Record> {
        let settings = settings_of(&self.settings, &query)?;
        let part = dir.join("input.part");
        let head = {
            use std::io::Read;
            let mut head = vec![0u8; 1 << 16];
            let mut f = std::fs::File::open(&part)?;
            let n = f.read(&mut head)?;
            head.truncate(n);
            head
        };
        if head.is_empty() {
            return Err(Failure::error(Kind::BadInput, "empty body: send a video or a photo"));
        }
        let name = query.name.clone().unwrap_or_default();
        let named_ext = crate::media::kind::ext_of(Path::new(&name));
        let photo = match imagesize::image_type(&head) {
            Ok(imagesize::ImageType::Png) => Some("png"),
            Ok(imagesize::ImageType::Jpeg) => Some("jpg"),
            Ok(imagesize::ImageType::Webp) => Some("webp"),
            Ok(imagesize::ImageType::Tiff) => Some("tiff"),
            Ok(imagesize::ImageType::Bmp) => Some("bmp"),
            _ => None,
        };
        let (kind, in_ext, out_ext) = match photo {
            Some(ext) => {
                let len = std::fs::metadata(&part)?.len();
                if len > self.opts.max_photo_bytes {
                    return Err(Failure::error(
                        Kind::TooLarge,
                        format!(
                            "a photo of {:.1} MB is larger than this service takes ({} MB, --max-body-mb)",
                            len as f64 / 1e6,
                            self.opts.max_photo_bytes >> 20
                        ),
                    ));
                }
                let bytes = std::fs::read(&part)?;
                super::check_picture(&bytes, self.opts.max_pixels)?;
                ("photo", ext.to_string(), ext.to_string())
            }
            None => {
                let ext = if named_ext.is_empty() || crate::media::kind::is_still(Path::new(&name)) {
                    "mkv".to_string()
                } else {
                    named_ext.clone()
                };
                let out = if KEPT_CONTAINERS.contains(&ext.as_str()) {
                    ext.clone()
                } else {
                    "mkv".into()
                };
                ("video", ext, out)
            }
        };
        let input = format!("input.{in_ext}");
        let output = format!("result.{out_ext}");
        std::fs::rename(&part, dir.join(&input))?;
        let job = settings
            .job(&dir.join(&input), &dir.join(&output), CancelToken::new())
            .map_err(|e| Failure::error(Kind::BadInput, format!("the upload cannot be read: {e:#}")))?;
        let rec = Record {
            id: id.to_string(),
            state: State::Queued,
            kind: kind.to_string(),
            name: if name.is_empty() {
                format!("upload.{in_ext}")
            } else {
                name
            },
            input,
            output,
            query,
            created: now(),
            started: None,
            finished: None,
            frames_done: 0,
            frames_total: job.source.frames_to_run(job.treatment.max_frames),
            fps: None,
            error: None,
            result_bytes: None,
        };
        write_atomic(&dir.join("job.json"), &serde_json::to_vec_pretty(&rec)?)?;
        self.lock().insert(
            id.to_string(),
            Entry {
                rec: rec.clone(),
                cancel: CancelToken::new(),
            },
        );
        self.wake.notify_all();
        Ok(rec)
    }

    /// Stops the job thread: the running job is cancelled and stays queued (it resumes at the
    /// next start).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for e in self.lock().values() {
            if e.rec.state == State::Running {
                e.cancel.cancel();
            }
        }
        self.wake.notify_all();
    }

    /// The job thread: runs the oldest queued job, one at a time, until [`Jobs::stop`].
    pub fn run(self: &Arc<Self>) {
        while !self.stopping.load(Ordering::SeqCst) {
            let t = self.lock();
            let next = t
                .values()
                .filter(|e| e.rec.state == State::Queued)
                .min_by(|a, b| a.rec.created.total_cmp(&b.rec.created))
                .map(|e| e.rec.id.clone());
            match next {
                Some(id) => {
                    drop(t);
                    self.run_one(&id);
                }
                None => {
                    // Wakes for a new job, the stop, or now and then to expire old results.
                    drop(self.wake.wait_timeout(t, Duration::from_secs(5)));
                    self.expire();
                }
            }
        }
    }

    /// Updates job `id`'s record (if it is still there) and writes it.
    fn update(&self, id: &str, f: impl FnOnce(&mut Record)) {
        let rec = {
            let mut t = self.lock();
            let Some(e) = t.get_mut(id) else { return };
            f(&mut e.rec);
            e.rec.clone()
        };
        if let Ok(bytes) = serde_json::to_vec_pretty(&rec) {
            if let Err(e) = write_atomic(&self.dir_of(id).join("job.json"), &bytes) {
                tracing::warn!(job = %id, "cannot write the job's record: {e:#}");
            }
        }
    }

    fn run_one(&self, id: &str) {
        let Some((rec, cancel)) = self.lock().get(id).map(|e| (e.rec.clone(), e.cancel.clone())) else {
            return;
        };
        let start = Instant::now();
        let frames_before = rec.frames_done;
        self.update(id, |r| {
            r.state = State::Running;
            r.started = Some(now());
        });
        tracing::info!(job = %id, name = %rec.name, "job started");
        let progress = |frames: u64| {
            let mut t = self.lock();
            if let Some(e) = t.get_mut(id) {
                e.rec.frames_done = frames;
                let secs = start.elapsed().as_secs_f64();
                if secs > 0.5 {
                    e.rec.fps = Some(frames.saturating_sub(frames_before) as f64 / secs);
                }
            }
        };
        let r = self.restore(&rec, &cancel, &progress);
        let secs = start.elapsed().as_secs_f64();
        let gone = !self.lock().contains_key(id);
        if gone {
            // Deleted while it ran: its folder goes now that nothing writes in it.
            let _ = std::fs::remove_dir_all(self.dir_of(id));
            tracing::info!(job = %id, "job cancelled and removed");
            return;
        }
        match r {
            Ok(()) => {
                let bytes = std::fs::metadata(self.dir_of(id).join(&rec.output))
                    .map(|m| m.len())
                    .ok();
                self.update(id, |r| {
                    r.state = State::Done;
                    r.finished = Some(now());
                    r.result_bytes = bytes;
                    if let Some(t) = r.frames_total {
                        r.frames_done = r.frames_done.max(t);
                    }
                });
                self.seconds.lock().unwrap_or_else(|e| e.into_inner()).push(secs);
                tracing::info!(job = %id, seconds = format!("{secs:.1}"), "job done");
            }
            Err(_) if self.stopping.load(Ordering::SeqCst) => {
                // The service is stopping: the job waits for the next start.
                self.update(id, |r| {
                    r.state = State::Queued;
                    r.fps = None;
                });
            }
            Err(e) => {
                let why = format!("{e:#}");
                self.update(id, |r| {
                    r.state = State::Failed;
                    r.finished = Some(now());
                    r.error = Some(why.clone());
                });
                self.seconds.lock().unwrap_or_else(|e| e.into_inner()).push(secs);
                tracing::warn!(job = %id, "job failed: {why}");
            }
        }
    }

    /// Restores a job's input into its result: a film long enough in segments (resumed from
    /// those already done), anything else in one run.
    fn restore(&self, rec: &Record, cancel: &CancelToken, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
        let dir = self.dir_of(&rec.id);
        let mut settings = settings_of(&self.settings, &rec.query)?;
        settings.stats_json = None;
        settings.faces_json = None;
        let job = settings.job(&dir.join(&rec.input), &dir.join(&rec.output), cancel.clone())?;
        if let Some(work) = crate::segment::Work::open(&settings, &job, self.opts.segment, false)? {
            let all = |_: &crate::segment::plan::Segment| true;
            let stop = || self.stopping.load(Ordering::SeqCst);
            let share = crate::segment::Share {
                jobs: 1,
                threads_given: false,
                mine: &all,
                wait: true,
                stop: &stop,
            };
            let done = crate::segment::run(&settings, &job, &work, &share, &|frames, _| progress(frames))?;
            tracing::info!(job = %rec.id, "{}", crate::segment::describe(&done, work.segments().len()));
            if done.joined.is_none() && !done.joined_elsewhere {
                bail!("the film's segments were not joined");
            }
            return Ok(());
        }
        let mut engine = settings.engine(&job)?;
        crate::pipeline::run(&mut engine, &job, progress)?;
        Ok(())
    }
}

fn state_name(s: State) -> &'static str {
    match s {
        State::Queued => "queued",
        State::Running => "running",
        State::Done => "done",
        State::Failed => "failed",
        State::Cancelled => "cancelled",
    }
}

pub fn not_found(id: &str) -> anyhow::Error {
    Failure::error(
        Kind::NotFound,
        format!("no job {id}: it was never made, was deleted, or expired (--job-ttl-h)"),
    )
}

/// The models a job may ask for by name: the service's own (by its file name), then every
/// enhancer of the registry whose file is present under models/. (name, file).
pub fn offered_models(settings: &Settings) -> Vec<(String, PathBuf)> {
    let own = settings.recipe.model.path().to_path_buf();
    let own_name = own
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut v = vec![(own_name, own)];
    if let Ok(reg) = crate::registry::registry() {
        for e in reg.models.iter().filter(|e| e.kind == crate::registry::Kind::Enhancer) {
            if let Some(p) = e.local_path() {
                if !v.iter().any(|(_, q)| same_file(q, &p)) {
                    v.push((e.name.clone(), p));
                }
            }
        }
    }
    v
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The service's settings with a job's model and flags on them, checked as the CLI checks them.
fn settings_of(settings: &Settings, q: &JobQuery) -> Result<Settings> {
    let mut s = settings.clone();
    if let Some(name) = q.model.as_deref().filter(|m| !m.is_empty()) {
        let offered = offered_models(settings);
        let (_, path) = offered
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = offered.iter().map(|(n, _)| n.as_str()).collect();
                Failure::error(
                    Kind::BadInput,
                    format!("model={name}: this service offers {}", names.join(", ")),
                )
            })?;
        s.recipe.model = crate::config::Asset(path.clone());
    }
    s.recipe.treatment = Arc::new(treatment_of(settings, q)?);
    Ok(s)
}

/// The service's treatment with a job's flags on it, checked as the CLI checks them.
fn treatment_of(settings: &Settings, q: &JobQuery) -> Result<Treatment> {
    let bad = |m: String| Failure::error(Kind::BadInput, m);
    let mut t = (*settings.recipe.treatment).clone();
    if let Some(b) = q.blend {
        t.blend = b;
    }
    if let Some(v) = q.temporal {
        t.temporal = v;
    }
    if let Some(v) = q.smooth {
        t.smooth = v;
    }
    if let Some(m) = &q.mask {
        t.mask = <MaskKind as clap::ValueEnum>::from_str(m, true).map_err(|_| {
            let names: Vec<String> = MaskKind::value_variants()
                .iter()
                .filter_map(|v| clap::ValueEnum::to_possible_value(v).map(|p| p.get_name().to_string()))
                .collect();
            bad(format!("mask={m}: give {}", names.join(", ")))
        })?;
        if t.mask == MaskKind::Mesh && settings.recipe.mesh.is_none() {
            t.mask = MaskKind::Face;
        }
    }
    if let Some(c) = &q.compare {
        t.compare = match c.as_str() {
            "" | "none" | "off" => None,
            "side" => Some(crate::media::compare::Compare::Side),
            "split" => Some(crate::media::compare::Compare::Split),
            _ => return Err(bad(format!("compare={c}: give side, split or none"))),
        };
    }
    t.check().map_err(|e| bad(format!("{e:#}")))?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_random_bits_and_nothing_else_is_one() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert!(valid_id(&a) && valid_id(&b) && a != b, "{a} {b}");
        for bad in [
            "",
            "..",
            "../etc",
            &a[..31],
            &format!("{a}0"),
            &a.to_uppercase(),
            "g".repeat(32).as_str(),
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_download_is_named_after_the_upload() {
        let rec = Record {
            id: "0".repeat(32),
            state: State::Done,
            kind: "video".into(),
            name: "../my clip (1).mp4".into(),
            input: "input.mp4".into(),
            output: "result.mp4".into(),
            query: JobQuery::default(),
            created: 0.0,
            started: None,
            finished: None,
            frames_done: 10,
            frames_total: Some(10),
            fps: None,
            error: None,
            result_bytes: None,
        };
        assert_eq!(rec.download_name(), "my_clip__1_-restored.mp4");
        assert_eq!(rec.answer()["progress"], 1.0);
        assert_eq!(rec.answer()["state"], "done");
    }
}
