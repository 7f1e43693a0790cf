//! The jobs kept in the jobs folder alone (a service without `--jobs-db`): in, the folder
//! (each job a folder holding its record `job.json`, read back at start) and the calls of
//! [`super::store::Store`]; out, the jobs' table in memory, each change written to its record,
//! and the lanes' threads that run each job whole (a film in segments claimed by files).

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{job_end_delay, not_found, now, open_plain, remove_job_dir, valid_id, Jobs, Lane, Record, State};
use crate::engine::{CancelToken, Failure, Kind};
use crate::output::write_atomic;

/// One job in memory: its record and what stops it.
struct Entry {
    rec: Record,
    cancel: CancelToken,
    /// Why its folder did not check out (a record naming files outside it, a symbolic link, a
    /// damaged record): such a job is listed as failed and never run, served, expired or
    /// removed; its files are left on disk for whoever put them there.
    foreign: Option<String>,
}

impl Entry {
    /// A folder named like job `id` that did not check out (`why`): listed as failed.
    fn foreign(id: &str, why: String) -> Entry {
        let rec = Record {
            id: id.to_string(),
            kind: "unknown".into(),
            name: id.to_string(),
            state: State::Failed,
            error: Some(format!("the job's folder {why}: left on disk as it is")),
            ..Record::default()
        };
        Entry {
            rec,
            cancel: CancelToken::new(),
            foreign: Some(why),
        }
    }
}

/// The lock file in the jobs folder (its name is no job id, so it is never taken for a job).
const LOCK_FILE: &str = ".lock";

/// Takes the jobs folder's advisory lock (a second service on the folder is refused, naming the
/// process that holds it); the lock file holds this process's id.
fn lock_folder(dir: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(LOCK_FILE);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("cannot open {} (the jobs folder's lock)", path.display()))?;
    if f.try_lock().is_err() {
        let mut pid = String::new();
        let _ = f.read_to_string(&mut pid);
        let pid = pid.trim();
        bail!(
            "the jobs folder {} is in use by another gpen-video serve{}: give this one its own --jobs-dir, or stop that one first",
            dir.display(),
            if pid.is_empty() { String::new() } else { format!(" (process {pid})") }
        );
    }
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())?;
    Ok(f)
}

/// What a folder named like a job id holds, read at start.
enum Loaded {
    /// A job of this service's, its record checked.
    Job(Box<Record>),
    /// An upload that never finished (its part alone): nothing to resume.
    Unfinished,
    /// A job deleted whose files were not all removed yet.
    Deleted,
    /// Something that did not check out, and why: left as it is.
    Foreign(String),
}

/// Reads back the folder `dir` of job `id` (see [`Loaded`]), following no symbolic link.
fn load(dir: &Path, id: &str, kind: std::fs::FileType) -> Loaded {
    if kind.is_symlink() {
        return Loaded::Foreign("is a symbolic link, which the service never follows".into());
    }
    if !kind.is_dir() {
        return Loaded::Foreign("is not a folder".into());
    }
    if let Some(why) = odd_entry(dir) {
        return Loaded::Foreign(why);
    }
    let bytes = match open_plain(&dir.join("job.json")).and_then(|mut f| {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
    }) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let only_part = std::fs::read_dir(dir).is_ok_and(|d| d.flatten().all(|e| e.file_name() == "input.part"));
            return if only_part {
                Loaded::Unfinished
            } else {
                Loaded::Foreign("holds files but no record (job.json)".into())
            };
        }
        Err(e) => return Loaded::Foreign(format!("has a record (job.json) that cannot be read ({e})")),
    };
    let rec: Record = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => return Loaded::Foreign(format!("has a damaged record (job.json: {e})")),
    };
    if rec.id != id {
        return Loaded::Foreign("has a record (job.json) of another job".into());
    }
    if let Err(why) = rec.check_names() {
        return Loaded::Foreign(why);
    }
    if rec.removing {
        return Loaded::Deleted;
    }
    Loaded::Job(Box::new(rec))
}

/// The first thing under `dir` that is neither a plain file nor a folder (a symbolic link, a
/// pipe, a device), said in words; symbolic links are never followed.
fn odd_entry(dir: &Path) -> Option<String> {
    for e in walkdir::WalkDir::new(dir).min_depth(1).follow_links(false) {
        let e = match e {
            Ok(e) => e,
            Err(e) => return Some(format!("cannot be read ({e})")),
        };
        let t = e.file_type();
        let name = e.path().strip_prefix(dir).unwrap_or(e.path()).display().to_string();
        if t.is_symlink() {
            return Some(format!(
                "holds a symbolic link ({name}), which the service never follows"
            ));
        }
        if !t.is_file() && !t.is_dir() {
            return Some(format!("holds {name}, which is neither a file nor a folder"));
        }
    }
    None
}

/// Reads back the jobs in the folder `dir` at start (see [`load`]): queued and running ones
/// queued again, unfinished uploads and deleted jobs' leftovers removed, what does not check out
/// listed as failed.
fn read_back(jobs_dir: &Path) -> Result<BTreeMap<String, Entry>> {
    let mut table = BTreeMap::new();
    for entry in std::fs::read_dir(jobs_dir).with_context(|| format!("cannot read {}", jobs_dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if !valid_id(&name) {
            continue;
        }
        let dir = entry.path();
        // Only a real folder is a job: a link named like one is not answered as one (nor
        // followed, nor removed).
        if entry.file_type()?.is_symlink() {
            tracing::warn!(job = %name, "not a job: a symbolic link in the jobs folder, left as it is");
            continue;
        }
        let mut rec = match load(&dir, &name, entry.file_type()?) {
            Loaded::Job(rec) => *rec,
            Loaded::Unfinished => {
                tracing::info!(job = %name, "removing an unfinished upload");
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            Loaded::Deleted => {
                tracing::info!(job = %name, "removing a job deleted before the service stopped");
                if let Err(e) = remove_job_dir(&dir) {
                    tracing::warn!(job = %name, "cannot remove the deleted job's files: {e}");
                }
                continue;
            }
            Loaded::Foreign(why) => {
                tracing::warn!(job = %name, "left as it is, listed as failed: the folder {why}");
                table.insert(name.clone(), Entry::foreign(&name, why));
                continue;
            }
        };
        match rec.state {
            State::Running | State::Queued => {
                rec.state = State::Queued;
                rec.fps = None;
                tracing::info!(job = %name, "queued again after a restart (a film resumes from its finished segments)");
            }
            State::Done if !std::fs::symlink_metadata(dir.join(&rec.output)).is_ok_and(|m| m.is_file()) => {
                rec.state = State::Failed;
                rec.error = Some("the result is missing from the jobs folder".into());
            }
            _ => {}
        }
        if let Err(e) = write_atomic(&dir.join("job.json"), &serde_json::to_vec_pretty(&rec)?) {
            tracing::warn!(job = %name, "cannot write the record read back at start: {e:#}");
        }
        table.insert(
            name,
            Entry {
                rec,
                cancel: CancelToken::new(),
                foreign: None,
            },
        );
    }
    Ok(table)
}

/// The jobs of one service's folder: their table, and the folder's advisory lock (held while
/// the service runs: one service a folder).
pub(super) struct Folder {
    table: Mutex<BTreeMap<String, Entry>>,
    _lock: std::fs::File,
}

impl Folder {
    /// Takes the folder's lock and reads back the jobs in it.
    pub(super) fn open(dir: &Path) -> Result<Folder> {
        let lock = lock_folder(dir)?;
        Ok(Folder {
            table: Mutex::new(read_back(dir)?),
            _lock: lock,
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        self.table.lock()
    }

    /// See [`Jobs::list`].
    pub(super) fn list(&self, owner: Option<&str>) -> Vec<serde_json::Value> {
        let t = self.lock();
        let mut v: Vec<&Entry> = t
            .values()
            .filter(|e| owner.is_none_or(|o| e.rec.owner.as_deref().unwrap_or("") == o))
            .collect();
        v.sort_by(|a, b| a.rec.created.total_cmp(&b.rec.created));
        v.iter().map(|e| answer_in(&t, &e.rec)).collect()
    }

    pub(super) fn get(&self, id: &str) -> Option<Record> {
        self.lock().get(id).map(|e| e.rec.clone())
    }

    pub(super) fn answer(&self, id: &str) -> Option<serde_json::Value> {
        let t = self.lock();
        t.get(id).map(|e| answer_in(&t, &e.rec))
    }

    /// See [`Jobs::cancel`]: the record written, the job's thread stopped.
    pub(super) fn cancel(&self, jobs: &Jobs, id: &str) -> Result<Record> {
        let mut t = self.lock();
        let e = t.get_mut(id).ok_or_else(|| not_found(id))?;
        if e.foreign.is_some() || e.rec.state.finished() {
            return Ok(e.rec.clone());
        }
        e.cancel.cancel();
        e.rec.state = State::Cancelled;
        e.rec.finished = Some(now());
        e.rec.fps = None;
        let rec = e.rec.clone();
        write_atomic(&jobs.dir_of(id).join("job.json"), &serde_json::to_vec_pretty(&rec)?)
            .map_err(|e| Failure::error(Kind::Io, format!("cannot record job {id}'s cancellation ({e:#})")))?;
        drop(t);
        jobs.wake.notify_all();
        Ok(rec)
    }

    pub(super) fn counts(&self) -> (usize, usize, usize, usize) {
        let t = self.lock();
        let n = |s: State| t.values().filter(|e| e.rec.state == s).count();
        (n(State::Queued), n(State::Running), n(State::Done), n(State::Failed))
    }

    /// See [`Jobs::delete`]: the deletion written in the record first, the files removed now
    /// (a running job's once its thread sees it gone, in [`Folder::run_one`]).
    pub(super) fn delete(&self, jobs: &Jobs, id: &str) -> Result<Record> {
        let mut t = self.lock();
        let e = t.get(id).ok_or_else(|| not_found(id))?;
        if let Some(why) = &e.foreign {
            return Err(Failure::error(
                Kind::Conflict,
                format!("job {id} is left on disk for its owner (its folder {why}): remove the folder {id} from the jobs folder by hand"),
            ));
        }
        let mut rec = e.rec.clone();
        let running = rec.state == State::Running;
        rec.state = State::Cancelled;
        rec.removing = true;
        let dir = jobs.dir_of(id);
        write_atomic(&dir.join("job.json"), &serde_json::to_vec_pretty(&rec)?)
            .map_err(|e| Failure::error(Kind::Io, format!("cannot record job {id}'s deletion ({e:#})")))?;
        if let Some(e) = t.remove(id) {
            e.cancel.cancel();
        }
        drop(t);
        if !running {
            remove_job_dir(&dir).map_err(|e| {
                Failure::error(
                    Kind::Io,
                    format!("cannot remove job {id}'s files ({e}); they go at the next start"),
                )
            })?;
        }
        Ok(rec)
    }

    pub(super) fn finished_jobs(&self) -> BTreeMap<String, f64> {
        self.lock()
            .values()
            .filter(|j| j.rec.state.finished() && j.foreign.is_none())
            .map(|j| (j.rec.id.clone(), j.rec.finished.unwrap_or(0.0)))
            .collect()
    }

    pub(super) fn unfinished(&self) -> usize {
        self.lock().values().filter(|e| !e.rec.state.finished()).count()
    }

    /// Keeps a job just admitted: its record written into its folder, the job in the table.
    pub(super) fn insert(&self, jobs: &Jobs, rec: &Record) -> Result<()> {
        write_atomic(&jobs.dir_of(&rec.id).join("job.json"), &serde_json::to_vec_pretty(rec)?)?;
        self.lock().insert(
            rec.id.clone(),
            Entry {
                rec: rec.clone(),
                cancel: CancelToken::new(),
                foreign: None,
            },
        );
        Ok(())
    }

    /// Cancels the running jobs (they stay queued for the next start).
    pub(super) fn stop(&self) {
        for e in self.lock().values() {
            if e.rec.state == State::Running {
                e.cancel.cancel();
            }
        }
    }

    /// A jobs thread: runs the oldest queued job of its lane, one at a time, until
    /// [`Jobs::stop`] (the folder's share of [`Jobs::run`]). Films run in [`Lane::Films`]; photos in [`Lane::Photos`], so a photo
    /// never waits behind a film. The films' lane also expires old results.
    pub(super) fn run(&self, jobs: &Jobs, lane: Lane) {
        while !jobs.stopping.load(Ordering::SeqCst) {
            let mut t = self.lock();
            let next = queue_of(&t, lane).first().map(|e| e.rec.id.clone());
            match next {
                Some(id) => {
                    drop(t);
                    self.run_one(jobs, &id);
                }
                None => {
                    // Wakes for a new job, the stop, or now and then to expire old results.
                    // The table is let go before the expiry, which takes it again.
                    jobs.wake.wait_for(&mut t, Duration::from_secs(5));
                    drop(t);
                    if lane == Lane::Films {
                        jobs.expire();
                    }
                }
            }
        }
    }

    /// Updates job `id`'s record (if it is still there) and writes it, under the table's lock so
    /// that a deletion's record is never overwritten by an older state.
    fn update(&self, jobs: &Jobs, id: &str, f: impl FnOnce(&mut Record)) {
        let mut t = self.lock();
        let Some(e) = t.get_mut(id) else { return };
        f(&mut e.rec);
        if let Ok(bytes) = serde_json::to_vec_pretty(&e.rec) {
            if let Err(e) = write_atomic(&jobs.dir_of(id).join("job.json"), &bytes) {
                tracing::warn!(job = %id, "cannot write the job's record: {e:#}");
            }
        }
    }

    #[allow(clippy::too_many_lines)]
    fn run_one(&self, jobs: &Jobs, id: &str) {
        let Some((rec, cancel)) = self.lock().get(id).map(|e| (e.rec.clone(), e.cancel.clone())) else {
            return;
        };
        let start = Instant::now();
        let frames_before = rec.frames_done;
        // Changed since the start (a link or a pipe put in its folder): never run, left as it is.
        if let Some(why) = odd_entry(&jobs.dir_of(id)) {
            tracing::warn!(job = %id, "left as it is, listed as failed: the folder {why}");
            if let Some(e) = self.lock().get_mut(id) {
                e.rec.state = State::Failed;
                e.rec.error = Some(format!("the job's folder {why}: left on disk as it is"));
                e.foreign = Some(why);
            }
            return;
        }
        let mut started = false;
        self.update(jobs, id, |r| {
            // Cancelled since it was picked: it never runs.
            if r.state == State::Queued {
                r.state = State::Running;
                r.started = Some(now());
                started = true;
            }
        });
        if !started {
            return;
        }
        tracing::info!(job = %id, name = %rec.name, "job started");
        let progress = |p: crate::pipeline::Progress| {
            let (frames, faces) = (p.frames, p.faces);
            let mut t = self.lock();
            if let Some(e) = t.get_mut(id) {
                e.rec.frames_done = frames;
                e.rec.faces_done = faces;
                let secs = start.elapsed().as_secs_f64();
                if secs > 0.5 {
                    e.rec.fps = Some(frames.saturating_sub(frames_before) as f64 / secs);
                }
            }
        };
        let r = jobs.restore(&rec, &cancel, &progress);
        let secs = start.elapsed().as_secs_f64();
        let gone = !self.lock().contains_key(id);
        if gone {
            // Deleted while it ran: its folder goes now that nothing writes in it.
            if let Err(e) = remove_job_dir(&jobs.dir_of(id)) {
                tracing::warn!(job = %id, "cannot remove the deleted job's files ({e}); they go at the next start");
            }
            tracing::info!(job = %id, "job cancelled and removed");
            return;
        }
        if self.lock().get(id).is_some_and(|e| e.rec.state == State::Cancelled) {
            tracing::info!(job = %id, "job cancelled");
            return;
        }
        // The tests' way to land a cancel between the look above and the end below
        // (`GPEN_VIDEO_FAULTS=job-end=MS`): the end is decided under the table's lock, so a
        // cancel in between holds.
        if let Some(ms) = job_end_delay() {
            tracing::info!(job = %id, "pausing {ms} ms before the job's end (GPEN_VIDEO_FAULTS)");
            std::thread::sleep(Duration::from_millis(ms));
        }
        // Each end only for a job still running: a cancel that landed meanwhile stands.
        let mut ended = false;
        let mut end = |f: &dyn Fn(&mut Record)| {
            self.update(jobs, id, |r| {
                if r.state == State::Running {
                    f(r);
                    ended = true;
                }
            })
        };
        match r {
            Ok(faithful) => {
                let bytes = std::fs::metadata(jobs.dir_of(id).join(&rec.output))
                    .map(|m| m.len())
                    .ok();
                end(&|r| {
                    r.state = State::Done;
                    r.faithful = faithful.clone();
                    r.finished = Some(now());
                    r.result_bytes = bytes;
                    if let Some(t) = r.frames_total {
                        r.frames_done = r.frames_done.max(t);
                    }
                });
                if ended {
                    jobs.seconds.lock().push(secs);
                    tracing::info!(job = %id, seconds = format!("{secs:.1}"), "job done");
                }
            }
            Err(_) if jobs.stopping.load(Ordering::SeqCst) => {
                // The service is stopping: the job waits for the next start.
                end(&|r| {
                    r.state = State::Queued;
                    r.fps = None;
                });
            }
            Err(e) => {
                let why = jobs.in_words(&format!("{e:#}"), Some(&rec));
                end(&|r| {
                    r.state = State::Failed;
                    r.finished = Some(now());
                    r.error = Some(why.clone());
                });
                if ended {
                    jobs.seconds.lock().push(secs);
                    tracing::warn!(job = %id, "job failed: {why}");
                }
            }
        }
        if !ended {
            tracing::info!(job = %id, "job cancelled as it ended");
        }
    }
}

/// `rec` as the API answers it ([`Record::answer`]), a queued job with its `place` in its
/// lane's line (1: the next to run).
fn answer_in(t: &BTreeMap<String, Entry>, rec: &Record) -> serde_json::Value {
    let mut v = rec.answer();
    if rec.state == State::Queued {
        if let Some(i) = queue_of(t, Lane::of(rec)).iter().position(|e| e.rec.id == rec.id) {
            v["place"] = serde_json::json!(i + 1);
        }
    }
    v
}

/// The queued jobs of `lane`, the next first.
fn queue_of(t: &BTreeMap<String, Entry>, lane: Lane) -> Vec<&Entry> {
    let mut v: Vec<&Entry> = t
        .values()
        .filter(|e| e.rec.state == State::Queued && e.foreign.is_none() && Lane::of(&e.rec) == lane)
        .collect();
    v.sort_by(|a, b| a.rec.created.total_cmp(&b.rec.created));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The folder store on its own: a job that was running is queued again at start, a folder
    /// that does not check out is listed as failed, and a second service on the folder is
    /// refused.
    #[test]
    fn the_folder_store_reads_its_jobs_back_and_holds_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let id = super::super::new_id().unwrap();
        let rec = Record {
            id: id.clone(),
            state: State::Running,
            kind: "video".into(),
            name: "clip.mp4".into(),
            input: "input.mp4".into(),
            output: "result.mp4".into(),
            created: 1.0,
            ..Record::default()
        };
        std::fs::create_dir(dir.path().join(&id)).unwrap();
        std::fs::write(dir.path().join(&id).join("job.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
        let odd = super::super::new_id().unwrap();
        std::fs::create_dir(dir.path().join(&odd)).unwrap();
        std::fs::write(dir.path().join(&odd).join("notes.txt"), b"not a job").unwrap();

        let folder = Folder::open(dir.path()).unwrap();
        assert_eq!(folder.get(&id).unwrap().state, State::Queued);
        assert_eq!(folder.answer(&id).unwrap()["place"], 1);
        assert_eq!(folder.get(&odd).unwrap().state, State::Failed);
        assert_eq!(folder.counts(), (1, 0, 0, 1));
        assert_eq!(folder.unfinished(), 1);
        assert!(folder.finished_jobs().is_empty(), "a foreign folder is never expired");
        assert_eq!(folder.list(None).len(), 2);
        assert!(folder.list(Some("someone")).is_empty());
        let second = Folder::open(dir.path()).err().expect("one service a folder");
        assert!(format!("{second:#}").contains("in use"), "{second:#}");
    }
}
