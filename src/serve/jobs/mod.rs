//! Jobs over HTTP: in, uploads (a video or a photo) streamed to `--jobs-dir` with the CLI's
//! flags as a query; out, each job restored in the background, one at a time in each lane (a film in
//! segments, so a service killed mid-job resumes from the finished ones), its state and
//! progress, and its result served with HTTP Range.
//!
//! ```text
//!  POST /v1/jobs?name=clip.mp4&blend=0.8 ─ body streamed to DIR/ID/input.part ─ probed ─> 202
//!  job threads (films; photos): the oldest queued job of each lane ─> DIR/ID/result.EXT
//!      (a film's segments in DIR/ID/.result.EXT.segments)
//!  GET /v1/jobs[/ID] state, progress, place; GET /v1/jobs/ID/result|input (Range);
//!  POST /v1/jobs/ID/cancel (kept, cancelled); DELETE /v1/jobs/ID (removed)
//! ```
//! Each job is a folder named by its id (128 random bits in hex) holding `job.json` (its record,
//! written whole by rename), its input and, once done, its result. Nothing outside the jobs
//! folder is read or written, and inside it only folders named by an id. At start the folder is
//! read back: a job that was queued or running is queued again (a film resumes from its
//! finished segments), an upload that never finished is removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use parking_lot::{Condvar, Mutex};

use crate::config::Settings;
use crate::engine::{CancelToken, Failure, Kind};
use crate::faces::paste::MaskKind;
use crate::treatment::Treatment;

mod folder;
pub(crate) mod record;
mod replica;
mod store;

pub(crate) use record::{new_id, now, valid_ext, valid_id, JobQuery, Record, State};

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
    /// The people a job may name (`only-face=NAME`, `skip-face=NAME`): each name's reference
    /// photo (`--face NAME=PHOTO`). A job names people only by these names, never by a path.
    pub faces: BTreeMap<String, PathBuf>,
    /// The PostgreSQL database the replicas share (`--jobs-db`): jobs and their films'
    /// segments are its rows, any replica answers for any job and works on any film; `None`,
    /// the jobs live in this service alone.
    pub db: Option<String>,
    /// How long a replica's claim on a job or segment holds without renewal (`--job-lease-s`):
    /// a replica killed loses its work to the others this long after.
    pub lease: Duration,
}

/// The room an upload being received holds under the quota: what it claims in all (its declared
/// length; a chunked one's grows with what arrives) and what it may write now.
#[derive(Clone, Copy, Debug, Default)]
struct Room {
    claim: u64,
    granted: u64,
}

/// The jobs of a service: their store, the uploads under way, and what the lanes' threads
/// share.
pub(crate) struct Jobs {
    pub(crate) opts: JobsOptions,
    settings: Settings,
    /// Where the jobs are kept: the folder alone, or the replicas' database.
    store: store::Store,
    /// Uploads being received, by id: each holds a place under `--max-jobs` and its room under
    /// the quota. Taken before `table` wherever both are held.
    uploads: Mutex<BTreeMap<String, Room>>,
    /// Signalled when a job is queued or the service stops.
    wake: Condvar,
    stopping: AtomicBool,
    /// Seconds each finished job ran, for the metrics' histogram.
    pub(crate) seconds: Mutex<Vec<f64>>,
}

/// Checks an upload's given `name` (shown, and its extension names a video's container): at
/// most 255 bytes of printable text, its extension 1 to 16 letters and digits.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let bad = |why: &str| Failure::error(Kind::BadInput, format!("name: {why}"));
    if name.len() > 255 {
        return Err(bad("give at most 255 bytes (the upload's file name)"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("give the upload's file name, without control characters"));
    }
    if let Some(ext) = Path::new(name).extension() {
        let ext = ext.to_string_lossy();
        if !valid_ext(&ext) {
            let shown: String = ext.chars().take(20).collect();
            return Err(bad(&format!(
                "the extension \".{shown}{}\" is not a video's or photo's: give 1 to 16 letters and digits (clip.mp4, photo.jpg)",
                if ext.chars().count() > 20 { "..." } else { "" }
            )));
        }
    }
    Ok(())
}

/// The default jobs folder: under the user's state folder, beside nothing a user names.
pub fn default_dir() -> Result<PathBuf> {
    match crate::defaults::user_dir("XDG_STATE_HOME", ".local/state") {
        Some(d) => Ok(d.join("jobs")),
        None => bail!("no HOME or XDG_STATE_HOME to keep jobs under: pass --jobs-dir DIR"),
    }
}

/// An upload's room grows by at most this much ahead of the bytes that arrived, taken only from
/// free room (a finished result is removed only for bytes that are here).
const ROOM_AHEAD: u64 = 8 << 20;

/// Opens `path` for reading without following a symbolic link (or blocking on a pipe), and only
/// if it is a plain file.
pub(crate) fn open_plain(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a plain file"));
    }
    Ok(f)
}

/// Removes a job's folder without following a symbolic link, its record last: a service
/// stopped midway finds the record (cancelled) and finishes the removal at its next start.
fn remove_job_dir(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name() == "job.json" {
            continue;
        }
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    match std::fs::remove_file(dir.join("job.json")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::remove_dir(dir)
}

/// The bytes in the jobs folder outside the uploads being received: (those of finished jobs,
/// which may be removed for room, oldest first, with their ids; all the others).
struct Usage {
    finished: Vec<(f64, String, u64)>,
    fixed: u64,
}

impl Usage {
    fn total(&self) -> u64 {
        self.fixed + self.finished.iter().map(|f| f.2).sum::<u64>()
    }
}

/// An upload being received into its job's folder: its place under `--max-jobs` and its room
/// under the quota. Dropped before [`Jobs::admit`] takes it, it gives both back and its folder
/// goes.
pub(crate) struct Upload {
    jobs: Arc<Jobs>,
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    declared: Option<u64>,
    written: u64,
    granted: u64,
    admitted: bool,
}

impl Upload {
    /// Whether `n` more bytes fit in the room already held.
    pub(crate) fn fits(&self, n: u64) -> bool {
        self.written + n <= self.granted
    }

    /// Room for `n` more bytes that arrived (see [`Jobs::grow`]; blocking when the room must
    /// grow: it walks the folder), counted as written.
    pub(crate) fn take(&mut self, n: u64) -> Result<()> {
        if !self.fits(n) {
            self.granted = self.jobs.grow(&self.id, self.declared, self.written, n)?;
        }
        self.written += n;
        Ok(())
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.admitted {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        self.jobs.uploads().remove(&self.id);
    }
}

impl Jobs {
    /// Opens (creating) the jobs folder and its store: the folder's own (locked and read back),
    /// or the replicas' database (the folder is theirs, and the jobs are rows).
    pub(crate) fn open(settings: Settings, opts: JobsOptions) -> Result<Arc<Jobs>> {
        std::fs::create_dir_all(&opts.dir)
            .with_context(|| format!("cannot create the jobs folder {} (--jobs-dir)", opts.dir.display()))?;
        let store = store::Store::open(&opts)?;
        Ok(Arc::new(Jobs {
            opts,
            settings,
            store,
            uploads: Mutex::new(BTreeMap::new()),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            seconds: Mutex::new(Vec::new()),
        }))
    }

    fn uploads(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Room>> {
        self.uploads.lock()
    }

    fn dir_of(&self, id: &str) -> PathBuf {
        self.opts.dir.join(id)
    }

    /// The jobs `owner` may see, oldest first, each as the API answers it (with its place in
    /// line): `None` sees every job (the token's holder), `Some(key)` those made with that key
    /// (`Some("")`: those made without one).
    pub(crate) fn list(&self, owner: Option<&str>) -> Result<Vec<serde_json::Value>> {
        self.store.list(owner)
    }

    /// Job `id`'s record (this service's table, or the replicas' database).
    pub(crate) fn get(&self, id: &str) -> Result<Option<Record>> {
        self.store.get(id)
    }

    /// Job `id`'s record, or the error that there is none.
    fn find(&self, id: &str) -> Result<Record> {
        self.get(id)?.ok_or_else(|| not_found(id))
    }

    /// Job `id` as the API answers it, with its place in line.
    pub(crate) fn answer(&self, id: &str) -> Result<Option<serde_json::Value>> {
        self.store.answer(id)
    }

    /// Cancels job `id`: a queued one never runs, a running one stops; it stays listed as
    /// cancelled (its result never made) until it is removed or expires. A finished job is
    /// left as it is.
    pub(crate) fn cancel(&self, id: &str) -> Result<Record> {
        self.store.cancel(self, id)
    }

    /// Jobs queued, running, done and failed; the database's error where it cannot say (never
    /// zeros in its place).
    pub(crate) fn counts(&self) -> Result<(usize, usize, usize, usize)> {
        self.store.counts()
    }

    /// What the replicas hold of the shared jobs, for the metrics (`None` without a jobs
    /// database).
    pub(crate) fn holdings(&self) -> Result<Option<(u64, u64, u64)>> {
        self.store.holdings()
    }

    /// Where the jobs are shared and as which replica, in words (`None` without a jobs
    /// database).
    pub(crate) fn shared_as(&self) -> Option<(String, String)> {
        self.store.shared_as()
    }

    /// The result file of a done job, opened (a plain file of its folder, no link followed).
    pub(crate) fn result(&self, id: &str) -> Result<(Record, std::fs::File)> {
        let rec = self.find(id)?;
        if rec.state != State::Done {
            return Err(Failure::error(
                Kind::Conflict,
                format!("job {id} is {}: its result is there once it is done", rec.state.word()),
            ));
        }
        let file = open_plain(&self.dir_of(id).join(&rec.output))
            .map_err(|e| Failure::error(Kind::Io, format!("cannot read job {id}'s result ({e})")))?;
        Ok((rec, file))
    }

    /// The input file of a done job (for a before/after comparison), opened as [`Jobs::result`]
    /// opens the result.
    pub(crate) fn input(&self, id: &str) -> Result<(Record, std::fs::File)> {
        let (rec, _) = self.result(id)?;
        let file = open_plain(&self.dir_of(id).join(&rec.input))
            .map_err(|e| Failure::error(Kind::Io, format!("cannot read job {id}'s input ({e})")))?;
        Ok((rec, file))
    }

    /// Cancels a job and removes it with its files (a running one's files once it has stopped).
    /// The deletion is on disk (the record says cancelled) before this returns, so a service
    /// killed after its answer removes the job at its next start instead of running it again.
    pub(crate) fn delete(&self, id: &str) -> Result<Record> {
        self.store.delete(self, id)
    }

    /// The bytes in the folder outside `uploads` (see [`Usage`]).
    fn usage(&self, uploads: &BTreeMap<String, Room>) -> Usage {
        let mut u = Usage {
            finished: Vec::new(),
            fixed: 0,
        };
        let Ok(dir) = std::fs::read_dir(&self.opts.dir) else {
            return u;
        };
        let finished = self.finished_jobs();
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if uploads.contains_key(&name) {
                continue;
            }
            let bytes = crate::output::bytes_under(&e.path());
            match finished.get(&name) {
                Some(&when) => u.finished.push((when, name, bytes)),
                None => u.fixed += bytes,
            }
        }
        u.finished.sort_by(|a, b| a.0.total_cmp(&b.0));
        u
    }

    /// The finished jobs that may be removed (for room, or past their time), with when each
    /// finished.
    fn finished_jobs(&self) -> BTreeMap<String, f64> {
        self.store.finished_jobs()
    }

    /// Jobs waiting or running (every replica's, with a jobs database).
    fn unfinished(&self) -> Result<usize> {
        self.store.unfinished()
    }

    /// The quota as a number of bytes, said in words for an error.
    fn quota_words(&self) -> String {
        format!("{:.3} GB, --jobs-quota-gb", self.opts.quota as f64 / 1e9)
    }

    /// A place for an upload of `declared` bytes (or a chunked one), or why not: too many jobs
    /// waiting, running or being uploaded (`--max-jobs`), or no room under the quota for what it
    /// declares once every finished job is gone. Nothing is removed here: room is made as the
    /// bytes arrive ([`Upload::room_for`]).
    pub(crate) fn begin_upload(self: &Arc<Self>, declared: Option<u64>) -> Result<Upload> {
        self.expire();
        let mut ups = self.uploads();
        let waiting = self.unfinished()? + ups.len();
        if waiting >= self.opts.max_jobs {
            return Err(Failure::error(
                Kind::TooMany,
                format!(
                    "{waiting} jobs are waiting, running or being uploaded (--max-jobs {}): send this one when one is done",
                    self.opts.max_jobs
                ),
            ));
        }
        let claim = declared.unwrap_or(0);
        if claim > self.opts.quota {
            return Err(Failure::error(
                Kind::TooLarge,
                format!(
                    "the upload is larger than the jobs folder holds ({})",
                    self.quota_words()
                ),
            ));
        }
        let usage = self.usage(&ups);
        let claimed: u64 = ups.values().map(|r| r.claim.max(r.granted)).sum();
        if usage.fixed + claimed + claim > self.opts.quota {
            return Err(self.no_room(usage.fixed + claimed));
        }
        let id = new_id()?;
        let dir = self.dir_of(&id);
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        ups.insert(id.clone(), Room { claim, granted: 0 });
        Ok(Upload {
            jobs: self.clone(),
            id,
            dir,
            declared,
            written: 0,
            granted: 0,
            admitted: false,
        })
    }

    fn no_room(&self, held: u64) -> anyhow::Error {
        Failure::error(
            Kind::TooLarge,
            format!(
                "the jobs folder holds {:.3} GB of its {} in jobs not finished and uploads under way: try again once they are done, or delete some",
                held as f64 / 1e9,
                self.quota_words()
            ),
        )
    }

    /// Room for upload `id`, `written` bytes in, to write `n` more that arrived: finished jobs are
    /// removed, oldest first, only as far as these bytes need; room ahead (up to
    /// [`ROOM_AHEAD`]) is taken only where it is free. The bytes it may write in all.
    fn grow(&self, id: &str, declared: Option<u64>, written: u64, n: u64) -> Result<u64> {
        let mut ups = self.uploads();
        let need = written + n;
        let mine = ups.get(id).copied().unwrap_or_default();
        let others: Vec<Room> = ups.iter().filter(|(k, _)| k.as_str() != id).map(|(_, r)| *r).collect();
        let claim = declared.unwrap_or(mine.claim.max(need));
        let others_claimed: u64 = others.iter().map(|r| r.claim.max(r.granted)).sum();
        let others_granted: u64 = others.iter().map(|r| r.granted).sum();
        let mut usage = self.usage(&ups);
        if usage.fixed + others_claimed + claim > self.opts.quota {
            return Err(self.no_room(usage.fixed + others_claimed));
        }
        while usage.total() + others_granted + need > self.opts.quota {
            let Some((_, old, _)) = usage.finished.first().cloned() else {
                return Err(self.no_room(usage.total() + others_granted));
            };
            tracing::info!(job = %old, "removing a finished job to make room (--jobs-quota-gb)");
            if let Err(e) = self.delete(&old) {
                tracing::warn!(job = %old, "cannot remove it: {e:#}");
                return Err(self.no_room(usage.total() + others_granted));
            }
            usage = self.usage(&ups);
        }
        let free = self.opts.quota - (usage.total() + others_granted);
        let ahead = (free - need).min(ROOM_AHEAD);
        let granted = declared.map_or(need + ahead, |d| d.min(need + ahead).max(need));
        ups.insert(
            id.to_string(),
            Room {
                claim: claim.max(granted),
                granted,
            },
        );
        Ok(granted)
    }

    /// Removes finished jobs older than `--job-ttl-h`.
    pub(crate) fn expire(&self) {
        let cutoff = now() - self.opts.ttl.as_secs_f64();
        let old: Vec<String> = self
            .finished_jobs()
            .into_iter()
            .filter(|(_, when)| *when < cutoff)
            .map(|(id, _)| id)
            .collect();
        for id in old {
            tracing::info!(job = %id, "removing a finished job past --job-ttl-h");
            if let Err(e) = self.delete(&id) {
                tracing::warn!(job = %id, "cannot remove the finished job past --job-ttl-h: {e:#}");
            }
        }
    }

    /// Checks a finished upload (`dir/input.part`), names it by what it is and queues its job;
    /// its record. On error the folder is removed (with the upload).
    pub(crate) fn admit(&self, mut up: Upload, query: JobQuery, owner: Option<String>) -> Result<Record> {
        let dir = up.dir.clone();
        let r = self.admit_in(&up.id, &dir, query, owner);
        up.admitted = r.is_ok();
        r
    }

    /// Checks a job's query (its model offered, its flags in range) before its upload is read.
    pub(crate) fn check_query(&self, query: &JobQuery) -> Result<()> {
        check_name(query.name.as_deref().unwrap_or(""))?;
        let settings = settings_of(&self.settings, &self.opts.faces, query)?;
        // The model by the name the job gave, or the service's by its file's name: never by
        // where the service keeps it.
        let shown = match query.model.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => m.to_string(),
            None => self
                .settings
                .recipe
                .model
                .path()
                .file_name()
                .map_or_else(|| "of this service".to_string(), |f| f.to_string_lossy().into_owned()),
        };
        crate::ready::check_fidelity(&settings, &shown).map_err(|e| Failure::error(Kind::BadInput, format!("{e:#}")))
    }

    /// `message` with the server's paths in it said in words: the upload by the name it was
    /// given, the job's files by what they are (a client never sees where the service keeps
    /// them).
    pub(crate) fn in_words(&self, message: &str, rec: Option<&Record>) -> String {
        let mut m = message.to_string();
        if let Some(r) = rec {
            let dir = self.dir_of(&r.id);
            m = m
                .replace(
                    &dir.join(&r.input).display().to_string(),
                    &format!("the upload {:?}", r.name),
                )
                .replace(
                    &dir.join("input.part").display().to_string(),
                    &format!("the upload {:?}", r.name),
                )
                .replace(&dir.join(&r.output).display().to_string(), "the result")
                .replace(&dir.display().to_string(), "the job's folder");
        }
        m = m.replace(&self.opts.dir.display().to_string(), "the jobs folder");
        // The service's own files: its models by their files' names, the faces it holds by
        // their names; the folders they sit in never.
        let r = &self.settings.recipe;
        let mut files: Vec<(String, String)> = [
            Some(&r.model),
            Some(&r.detector),
            r.mesh.as_ref(),
            r.identity.as_ref(),
            r.quality.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|a| {
            let shown = a
                .path()
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
            (a.path().display().to_string(), format!("the model file {shown}"))
        })
        .collect();
        files.extend(
            offered_models(&self.settings)
                .into_iter()
                .map(|o| (o.path.display().to_string(), format!("the model {}", o.name))),
        );
        files.extend(
            self.opts
                .faces
                .iter()
                .map(|(name, photo)| (photo.display().to_string(), format!("the face {name}"))),
        );
        named(&m, files)
    }

    fn admit_in(&self, id: &str, dir: &Path, query: JobQuery, owner: Option<String>) -> Result<Record> {
        let settings = settings_of(&self.settings, &self.opts.faces, &query)?;
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
        check_name(&name)?;
        let named_ext = crate::media::kind::ext_of(Path::new(&name));
        let photo = super::picture_type(&head);
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
                // Containers the service answers are kept; any other video is written as
                // Matroska, which holds every stream FFmpeg decodes.
                let out = if super::VIDEO_FORMATS.contains(&ext.as_str()) {
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
        let named = Record {
            id: id.to_string(),
            name: if name.is_empty() {
                format!("upload.{in_ext}")
            } else {
                name.clone()
            },
            input: input.clone(),
            output: output.clone(),
            ..Record::default()
        };
        let job = settings
            .job(&dir.join(&input), &dir.join(&output), CancelToken::new())
            .map_err(|e| {
                Failure::error(
                    Kind::BadInput,
                    format!(
                        "the upload cannot be read: {}",
                        self.in_words(&format!("{e:#}"), Some(&named))
                    ),
                )
            })?;
        let rec = Record {
            state: State::Queued,
            kind: kind.to_string(),
            query,
            created: now(),
            frames_total: job.source.frames_to_run(job.treatment.max_frames),
            owner,
            ..named
        };
        self.store.insert(self, &rec)?;
        self.wake.notify_all();
        Ok(rec)
    }

    /// Stops the job thread: the running job is cancelled and stays queued (it resumes at the
    /// next start).
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.store.stop();
        self.wake.notify_all();
    }

    /// A jobs thread: runs the jobs of its lane, one at a time, until [`Jobs::stop`]. Films run
    /// in [`Lane::Films`]; photos in [`Lane::Photos`], so a photo never waits behind a film. The
    /// films' lane also expires old results.
    pub(crate) fn run(&self, lane: Lane) {
        self.store.run(self, lane);
    }

    /// Restores a job's input into its result: a film long enough in segments (resumed from
    /// those already done), anything else in one run.
    fn restore(
        &self,
        rec: &Record,
        cancel: &CancelToken,
        progress: &(dyn Fn(crate::pipeline::Progress) + Sync),
    ) -> Result<Option<super::face_boxes::Faithful>> {
        let dir = self.dir_of(&rec.id);
        let (settings, job) = self.prepared(rec, cancel)?;
        if let Some(work) = crate::segment::Work::open(&settings, &job, self.opts.segment, false)? {
            let all = |_: &crate::segment::plan::Segment| true;
            let stop = || self.stopping.load(Ordering::SeqCst);
            let share = crate::segment::Share {
                jobs: 1,
                threads_given: false,
                mine: &all,
                wait: true,
                stop: &stop,
                claims: &crate::segment::FileClaims,
                engine: None,
            };
            let done = crate::segment::run(&settings, &job, &work, &share, &|p, _| progress(p))?;
            tracing::info!(job = %rec.id, "{}", crate::segment::describe(&done, work.segments().len()));
            if done.joined.is_none() && !done.joined_elsewhere {
                bail!("the film's segments were not joined");
            }
        } else {
            let mut engine = settings.engine(&job)?;
            crate::pipeline::run(&mut engine, &job, progress)?;
        }
        // Where the faces are is for the page: a record that cannot be made costs no result.
        Ok(
            super::face_boxes::keep(&dir, &job.source, rec.kind == "photo", job.view().blend)
                .map_err(|e| tracing::warn!(job = %rec.id, "no faces record: {e:#}"))
                .ok(),
        )
    }

    /// The settings and the job of `rec`, run from its folder, stopped by `cancel`.
    fn prepared(&self, rec: &Record, cancel: &CancelToken) -> Result<(Settings, crate::engine::Job)> {
        let dir = self.dir_of(&rec.id);
        let mut settings = settings_of(&self.settings, &self.opts.faces, &rec.query)?;
        settings.stats_json = None;
        // The run's faces record stays in the job's folder, made small once the run is done.
        settings.faces_json = Some(dir.join(super::face_boxes::RAW));
        // Where the faces are, for the page, with the figures the identity guard measures on a
        // few views of each track (not every face's).
        settings.boxes_only = true;
        let job = settings.job(&dir.join(&rec.input), &dir.join(&rec.output), cancel.clone())?;
        Ok((settings, job))
    }

    /// Where done job `id` found its faces (see [`super::face_boxes`]): the record's JSON.
    pub(crate) fn faces(&self, id: &str) -> Result<Vec<u8>> {
        let rec = self.find(id)?;
        if rec.state != State::Done {
            return Err(not_found(id));
        }
        let mut file = open_plain(&self.dir_of(id).join(super::face_boxes::FILE))
            .map_err(|_| Failure::error(Kind::NotFound, format!("job {id} has no record of its faces")))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(|e| Failure::error(Kind::Io, format!("cannot read job {id}'s faces ({e})")))?;
        Ok(bytes)
    }
}

/// A jobs thread's share of the jobs (see [`Jobs::run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Every job but photos.
    Films,
    /// Photos only.
    Photos,
}

impl Lane {
    fn of(rec: &Record) -> Lane {
        if rec.kind == "photo" {
            Lane::Photos
        } else {
            Lane::Films
        }
    }
}

/// `rec` as the API answers it ([`Record::answer`]), with its `place` in line when it has one.
fn answer_at(rec: &Record, place: Option<u64>) -> serde_json::Value {
    let mut v = rec.answer();
    if let Some(p) = place {
        v["place"] = serde_json::json!(p);
    }
    v
}

pub(crate) fn not_found(id: &str) -> anyhow::Error {
    Failure::error(
        Kind::NotFound,
        format!("no job {id}: it was never made, was deleted, or expired (--job-ttl-h)"),
    )
}

/// A restorer a job may ask for by name, with the facts the page shows.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Offered {
    pub(crate) name: String,
    #[serde(skip)]
    pub(crate) path: PathBuf,
    /// Its template by its entry (`None`: the file's own).
    #[serde(skip)]
    pub(crate) template: Option<crate::faces::align::Template>,
    /// The fidelity it takes by default, for a model with a weight input (CodeFormer's).
    pub(crate) fidelity: Option<f32>,
    /// Square crop side, where the entry says.
    pub(crate) size: Option<usize>,
    /// The blend its users usually restore at, where the entry says.
    pub(crate) blend: Option<f32>,
    /// "service" (the service's own model), "registry" or "yours" (`models add`).
    pub(crate) source: &'static str,
}

/// The models a job may ask for by name: the service's own (by its name, else its file name),
/// then every enhancer of the user's and the registry's whose file is here.
pub(crate) fn offered_models(settings: &Settings) -> Vec<Offered> {
    let own = settings.recipe.model.path().to_path_buf();
    let known = crate::registry::known().unwrap_or_default();
    let enhancers = || known.iter().filter(|e| e.kind == crate::registry::Kind::Enhancer);
    let own_entry = enhancers().find(|e| e.local_path().is_some_and(|p| same_file(&p, &own)));
    let offered = |e: &crate::registry::Entry, path: PathBuf, source| Offered {
        name: e.name.clone(),
        path,
        template: e.template(),
        fidelity: e.fidelity,
        size: Some(e.input_size),
        blend: e.blend,
        source,
    };
    let mut v = vec![match own_entry {
        Some(e) => offered(e, own.clone(), "service"),
        None => Offered {
            name: own
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
            path: own.clone(),
            template: settings.recipe.template,
            fidelity: settings.recipe.treatment.fidelity,
            size: None,
            blend: None,
            source: "service",
        },
    }];
    for e in enhancers() {
        let Some(p) = e.local_path() else { continue };
        let taken = v
            .iter()
            .any(|o| same_file(&o.path, &p) || o.name.eq_ignore_ascii_case(&e.name));
        if !taken {
            let source = if e.source == crate::registry::Source::User {
                "yours"
            } else {
                "registry"
            };
            v.push(offered(e, p, source));
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
/// A job that picks another model starts from that model's own default fidelity.
fn settings_of(settings: &Settings, faces: &BTreeMap<String, PathBuf>, q: &JobQuery) -> Result<Settings> {
    let mut s = settings.clone();
    if let Some(name) = q.model.as_deref().filter(|m| !m.is_empty()) {
        let offered = offered_models(settings);
        let m = offered
            .iter()
            .find(|o| o.name.eq_ignore_ascii_case(name))
            .or_else(|| offered.iter().find(|o| o.path.file_name().is_some_and(|f| f == name)))
            .ok_or_else(|| {
                let names: Vec<&str> = offered.iter().map(|o| o.name.as_str()).collect();
                Failure::error(
                    Kind::BadInput,
                    format!("model={name}: this service offers {}", names.join(", ")),
                )
            })?;
        if m.source != "service" {
            let mut t = (*s.recipe.treatment).clone();
            t.fidelity = m.fidelity;
            s.recipe.treatment = Arc::new(t);
            s.recipe.model = crate::config::Asset(m.path.clone());
            s.recipe.template = m.template;
        }
    }
    s.recipe.treatment = Arc::new(treatment_of(&s, faces, q)?);
    Ok(s)
}

/// The service's treatment with a job's flags on it, parsed and checked by the command line's
/// own declaration; a mesh mask asked of a service without the mesh is the face ellipse.
fn treatment_of(settings: &Settings, faces: &BTreeMap<String, PathBuf>, q: &JobQuery) -> Result<Treatment> {
    let mut pairs = Vec::new();
    for (k, v) in q.flag_pairs() {
        if k != "only-face" && k != "skip-face" {
            pairs.push((k, v));
            continue;
        }
        // People by the names the service holds (comma-separated), never by a path.
        for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(photo) = faces.get(name) else {
                let held: Vec<&str> = faces.keys().map(String::as_str).collect();
                let held = if held.is_empty() {
                    "this service holds none (start it with --face NAME=PHOTO)".to_string()
                } else {
                    format!("this service holds {}", held.join(", "))
                };
                return Err(Failure::error(
                    Kind::BadInput,
                    format!("{k}={name}: no such face; {held}"),
                ));
            };
            pairs.push((k.clone(), photo.display().to_string()));
        }
    }
    let mut t = settings
        .recipe
        .treatment
        .with_query(&pairs, &crate::treatment::JOB_FLAGS)
        .map_err(|e| Failure::error(Kind::BadInput, format!("{e:#}")))?;
    if t.mask == MaskKind::Mesh && settings.recipe.mesh.is_none() {
        t.mask = MaskKind::Face;
    }
    Ok(t)
}

/// `message` with each of `files`' paths said in its words, the longest path first (so a path
/// is never cut by a shorter one inside it).
fn named(message: &str, mut files: Vec<(String, String)>) -> String {
    files.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    let mut m = message.to_string();
    for (path, words) in files.into_iter().filter(|(p, _)| !p.is_empty()) {
        m = m.replace(&path, &words);
    }
    m
}

/// `GPEN_VIDEO_FAULTS=job-end=MS`: a pause before a local job's end is decided (the tests'
/// way to land a cancel there).
fn job_end_delay() -> Option<u64> {
    std::env::var("GPEN_VIDEO_FAULTS")
        .ok()?
        .split(',')
        .find_map(|p| p.trim().strip_prefix("job-end=")?.parse().ok())
}

#[cfg(test)]
mod tests {
    /// The service's files are said by name in a client's message, a longer path before a
    /// shorter one inside it.
    #[test]
    fn the_services_files_are_named_not_shown() {
        let files = vec![
            ("/srv/models".to_string(), "the models folder".to_string()),
            (
                "/srv/models/gpen-512.onnx".to_string(),
                "the model gpen-512".to_string(),
            ),
            ("/srv/faces/ann.jpg".to_string(), "the face ann".to_string()),
        ];
        let said = super::named(
            "cannot load /srv/models/gpen-512.onnx; reference photo /srv/faces/ann.jpg: no face",
            files,
        );
        assert_eq!(
            said,
            "cannot load the model gpen-512; reference photo the face ann: no face"
        );
    }

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
            frames_done: 10,
            frames_total: Some(10),
            ..Record::default()
        };
        assert_eq!(rec.download_name(), "my_clip__1_-restored.mp4");
        assert_eq!(rec.answer()["progress"], 1.0);
        assert_eq!(rec.answer()["state"], "done");
    }
}
