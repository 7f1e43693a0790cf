//! The jobs kept in the replicas' database (`serve --jobs-db`), and a replica's share of them:
//! in, the calls of [`super::store::Store`] and the tasks this replica claims (a job to plan,
//! run in one piece or join; a segment of a film); out, the rows read and changed, the tasks'
//! files in the shared jobs folder, made by the segments' scheduler ([`crate::segment::run`])
//! through this replica's lease ([`Lease`], its [`Claims`]), the leases renewed while it works
//! and handed back when it stops. Each step is logged with the replica's name.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::{answer_at, not_found, now, remove_job_dir, valid_id, Jobs, Lane, Record, State};
use crate::config::Settings;
use crate::engine::{CancelToken, Engine};
use crate::pipeline::Progress;
use crate::segment::{Claims, Hold, Record as SegmentRecord, Report, Work};
use crate::serve::shared::{Db, Renewal, SegmentEnd, Task};

/// Whether `e` came from the jobs database (or reaching it), not from the job itself.
fn is_database_error(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.is::<postgres::Error>() || c.is::<r2d2_postgres::r2d2::Error>())
}

/// The jobs kept in the replicas' database: its connection, and what this replica runs of
/// them.
pub(super) struct Shared {
    pub(super) db: Db,
    /// What this replica runs of the shared jobs: each job's stop.
    running: Mutex<BTreeMap<String, CancelToken>>,
}

impl Shared {
    /// Connects to the jobs database at `url` (the folder is the replicas', and the jobs are
    /// rows).
    pub(super) fn open(url: &str, lease: Duration) -> Result<Shared> {
        let db = Db::open(url, lease, Duration::from_secs(30))?;
        tracing::info!(replica = %db.replica, database = %db.shown, "jobs shared through the jobs database");
        Ok(Shared {
            db,
            running: Mutex::new(BTreeMap::new()),
        })
    }

    /// See [`Jobs::list`].
    pub(super) fn list(&self, owner: Option<&str>) -> Result<Vec<serde_json::Value>> {
        Ok(self
            .db
            .list(owner)?
            .iter()
            .map(|(r, place)| answer_at(r, *place))
            .collect())
    }

    pub(super) fn get(&self, id: &str) -> Result<Option<Record>> {
        Ok(self.db.get(id)?.map(|(r, _)| r))
    }

    pub(super) fn answer(&self, id: &str) -> Result<Option<serde_json::Value>> {
        Ok(self.db.get(id)?.map(|(r, place)| answer_at(&r, place)))
    }

    /// See [`Jobs::cancel`]: the row cancelled, the job stopped where this replica runs it
    /// (the others hear of it).
    pub(super) fn cancel(&self, id: &str) -> Result<Record> {
        let rec = self.db.cancel(id)?.ok_or_else(|| not_found(id))?;
        self.stop_local(id);
        Ok(rec)
    }

    /// See [`Jobs::delete`]: the row removed, the files too unless a replica still works on the
    /// job (then once it lets go).
    pub(super) fn delete(&self, jobs: &Jobs, id: &str) -> Result<Record> {
        let rec = self.db.remove(id)?.ok_or_else(|| not_found(id))?;
        self.stop_local(id);
        let gone = self.db.reap(Some(id), &|id| Ok(remove_job_dir(&jobs.dir_of(id))?))?;
        if gone.is_empty() {
            tracing::info!(job = %id, "job removed; its files go once no replica works on it");
        }
        Ok(rec)
    }

    /// Every replica's finished jobs, with when each finished (none, said in the log, when
    /// the database cannot say).
    pub(super) fn finished_jobs(&self) -> BTreeMap<String, f64> {
        self.db
            .finished_jobs()
            .unwrap_or_else(|e| {
                tracing::warn!("{e:#}");
                Vec::new()
            })
            .into_iter()
            .collect()
    }

    /// Stops what this replica runs (each task is handed back).
    pub(super) fn stop(&self) {
        for c in self.running().values() {
            c.cancel();
        }
    }

    /// What this replica runs of the shared jobs, by job.
    pub(super) fn running(&self) -> MutexGuard<'_, BTreeMap<String, CancelToken>> {
        self.running.lock()
    }

    /// Stops job `id` where this replica runs it (cancelled, deleted or failed elsewhere).
    pub(super) fn stop_local(&self, id: &str) {
        if let Some(c) = self.running().get(id) {
            c.cancel();
        }
    }

    /// A lane's thread with a jobs database: claims and runs tasks until [`Jobs::stop`]. The
    /// films' lane also listens for the replicas' notices and removes what is due.
    pub(super) fn run(&self, jobs: &Jobs, lane: Lane) {
        std::thread::scope(|s| {
            if lane == Lane::Films {
                s.spawn(|| {
                    self.db.listen(
                        &|| jobs.stopping.load(Ordering::SeqCst),
                        &|what| match what.strip_prefix("cancel:") {
                            Some(id) => self.stop_local(id),
                            None => {
                                jobs.wake.notify_all();
                            }
                        },
                    );
                });
            }
            self.claim_and_run(jobs, lane);
        });
    }

    /// Claims and runs tasks of `lane` until [`Jobs::stop`].
    fn claim_and_run(&self, jobs: &Jobs, lane: Lane) {
        // The engine kept from task to task (the scheduler's first job uses it).
        let engine: Mutex<Option<Engine>> = Mutex::new(None);
        let (mut tidied, mut swept): (Option<Instant>, Option<Instant>) = (None, None);
        while !jobs.stopping.load(Ordering::SeqCst) {
            if lane == Lane::Films && tidied.is_none_or(|t| t.elapsed() > Duration::from_secs(2)) {
                self.tidy(jobs);
                tidied = Some(Instant::now());
            }
            if lane == Lane::Films && swept.is_none_or(|t| t.elapsed() > Duration::from_secs(600)) {
                self.sweep(jobs);
                swept = Some(Instant::now());
            }
            match self.db.claim(lane == Lane::Photos, self.db.lease * 2) {
                Ok(Some(task)) => self.run_task(jobs, &task, &engine),
                Ok(None) => {
                    // Woken by a notice (a job queued, a segment handed back), else looks again.
                    jobs.wake.wait_for(&mut self.running(), Duration::from_millis(1000));
                }
                Err(e) => {
                    tracing::warn!("cannot claim work from the jobs database: {e:#}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// Removes the deleted jobs no replica works on any more, and the finished ones past their
    /// time.
    fn tidy(&self, jobs: &Jobs) {
        if let Err(e) = self.db.reap(None, &|id| Self::remove_files(jobs, id)) {
            tracing::warn!("cannot remove deleted jobs: {e:#}");
        }
        match self.db.give_up() {
            Ok(ids) => {
                for id in ids {
                    tracing::warn!(job = %id, "job failed: a task of it was started too often and never finished");
                }
            }
            Err(e) => tracing::warn!("cannot look for abandoned jobs: {e:#}"),
        }
        jobs.expire();
    }

    /// Removes the folders of the shared jobs folder that no job owns and nothing has touched
    /// for an hour: an upload cut off when its replica was killed, a job whose replica died
    /// between its files and its row. They would hold room under the quota for ever.
    fn sweep(&self, jobs: &Jobs) {
        let ids = match self.db.ids() {
            Ok(ids) => ids,
            Err(e) => return tracing::warn!("cannot list the jobs: {e:#}"),
        };
        let Ok(dir) = std::fs::read_dir(&jobs.opts.dir) else {
            return;
        };
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !valid_id(&name) || ids.contains(&name) || jobs.uploads().contains_key(&name) {
                continue;
            }
            // The newest thing in it: a folder being written is never taken for left over.
            let newest = walkdir::WalkDir::new(e.path())
                .follow_links(false)
                .into_iter()
                .flatten()
                .filter_map(|f| f.metadata().ok()?.modified().ok())
                .max();
            if newest.is_some_and(|t| t < hour_ago) && e.file_type().is_ok_and(|t| t.is_dir()) {
                tracing::info!(job = %name, "removing a folder no job owns (an upload or a job cut off with its replica)");
                if let Err(err) = Self::remove_files(jobs, &name) {
                    tracing::warn!(job = %name, "cannot remove it: {err:#}");
                }
            }
        }
    }

    /// Removes job `id`'s folder (one already gone is removed).
    fn remove_files(jobs: &Jobs, id: &str) -> Result<()> {
        match remove_job_dir(&jobs.dir_of(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Lets go of what this replica holds of job `id` (`stopping`: on purpose, not counted as a
    /// try), saying so when the database cannot be told (the lease then lapses).
    fn let_go(&self, id: &str, stopping: bool) {
        if let Err(e) = self.db.release(id, stopping) {
            tracing::warn!(job = %id, "cannot hand it back ({e:#}): another replica takes it when the lease lapses");
        }
    }

    /// Runs one claimed task; what it ends in goes to the database (a failure fails the job; a
    /// stop hands the task back).
    fn run_task(&self, jobs: &Jobs, task: &Task, engine: &Mutex<Option<Engine>>) {
        let rec = task.record();
        let id = rec.id.clone();
        let cancel = CancelToken::new();
        self.running().insert(id.clone(), cancel.clone());
        let r = self.task(jobs, task, &cancel, engine);
        self.running().remove(&id);
        let segment = match task {
            Task::Segment { number, .. } => Some(*number),
            _ => None,
        };
        match r {
            Ok(()) => {}
            Err(_) if jobs.stopping.load(Ordering::SeqCst) => {
                tracing::info!(job = %id, replica = %self.db.replica, "handed back: this replica is stopping");
                self.let_go(&id, true);
            }
            Err(_) if cancel.is_cancelled() => {
                tracing::info!(job = %id, replica = %self.db.replica, "stopped here: cancelled, deleted, failed elsewhere, or its lease lapsed");
                // What it still held of the job is let go (a lease lapsed is another's now).
                self.let_go(&id, false);
            }
            Err(e) if is_database_error(&e) => {
                // The database, not the job: another replica (or this one) tries it again.
                tracing::warn!(job = %id, replica = %self.db.replica, "handed back after a database error: {e:#}");
                self.let_go(&id, false);
            }
            Err(e) => {
                let why = jobs.in_words(&format!("{e:#}"), Some(rec));
                match self.db.fail_held(&id, segment, &why) {
                    Ok(true) => tracing::warn!(job = %id, replica = %self.db.replica, "job failed: {why}"),
                    Ok(false) => {
                        tracing::info!(job = %id, replica = %self.db.replica, "failed here after another replica took it over ({why}): left to that one")
                    }
                    Err(e) => tracing::warn!(job = %id, "cannot record the failure: {e:#}"),
                }
                self.let_go(&id, false);
            }
        }
        // A job deleted while it ran here goes now that nothing here writes in its folder.
        if let Err(e) = self.db.reap(Some(&id), &|id| Self::remove_files(jobs, id)) {
            tracing::warn!(job = %id, "cannot remove the deleted job: {e:#}");
        }
    }

    fn task(&self, jobs: &Jobs, task: &Task, cancel: &CancelToken, engine: &Mutex<Option<Engine>>) -> Result<()> {
        let rec = task.record();
        let (settings, job) = jobs.prepared(rec, cancel)?;
        match task {
            Task::Plan(_) => self.plan(jobs, rec, &settings, &job, engine),
            Task::Join(_, of) => {
                tracing::info!(job = %rec.id, replica = %self.db.replica, "joining the film's {of} segments (its join was left by another replica)");
                self.join_shared(jobs, rec, &settings, &job, engine)
            }
            Task::Segment { number, of, was, .. } => {
                if let Some(w) = was.as_deref().filter(|w| *w != self.db.replica) {
                    tracing::info!(job = %rec.id, replica = %self.db.replica, "segment {} of {of} taken over from replica {w} (its lease lapsed)", number + 1);
                }
                self.segment(jobs, rec, (*number, *of), &settings, &job, engine)
            }
        }
    }

    /// Runs `f` while a thread renews this replica's lease on job `id` (on its `segment`) every
    /// quarter lease (at most a second) with the progress `f` reports; a lease lost, or the job stopped elsewhere,
    /// cancels it.
    fn leased<T>(
        &self,
        (id, segment): (&str, Option<usize>),
        cancel: &CancelToken,
        f: impl FnOnce(&(dyn Fn(Progress) + Sync)) -> Result<T>,
    ) -> Result<T> {
        let (frames, faces) = (AtomicU64::new(0), AtomicU64::new(0));
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        std::thread::scope(|s| {
            s.spawn(|| loop {
                // A quarter lease, and at least every second: the progress answered is that fresh.
                match rx.recv_timeout((self.db.lease / 4).min(Duration::from_secs(1))) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let (n, k) = (frames.load(Ordering::Relaxed), faces.load(Ordering::Relaxed));
                match self.db.renew(id, segment, n, k) {
                    Ok(Renewal::Held) => {}
                    Ok(Renewal::Lost) => {
                        tracing::warn!(job = %id, replica = %self.db.replica, "its lease lapsed and another replica holds it: stopping here");
                        cancel.cancel();
                        return;
                    }
                    Ok(Renewal::Stopped) => {
                        cancel.cancel();
                        return;
                    }
                    Err(e) => tracing::warn!(job = %id, "cannot renew the lease ({e:#}); trying again"),
                }
            });
            let progress = |p: Progress| {
                frames.store(p.frames, Ordering::Relaxed);
                faces.store(p.faces, Ordering::Relaxed);
            };
            let r = f(&progress);
            drop(tx);
            r
        })
    }

    /// Plans a claimed job: a film long enough is cut into segments for any replica to claim;
    /// a photo or a short film runs here in one piece.
    fn plan(
        &self,
        jobs: &Jobs,
        rec: &Record,
        settings: &Settings,
        job: &crate::engine::Job,
        engine: &Mutex<Option<Engine>>,
    ) -> Result<()> {
        let id = &rec.id;
        if rec.kind != "photo" {
            // The film's packets are read to cut it: under the job's lease, however long.
            let work = self.leased((id, None), &job.cancel, |_| {
                crate::segment::Work::open(settings, job, jobs.opts.segment, false)
            })?;
            if let Some(work) = work {
                let frames: Vec<u64> = work.segments().iter().map(|s| s.frames()).collect();
                if self.db.planned(id, Some(&frames), Some(work.frames()))? {
                    tracing::info!(job = %id, replica = %self.db.replica, "film planned: {} segments of about {} s, for any replica to claim", frames.len(), jobs.opts.segment);
                } else {
                    self.let_go(id, false);
                }
                return Ok(());
            }
        }
        if !self.db.planned(id, None, rec.frames_total)? {
            self.let_go(id, false);
            return Ok(());
        }
        tracing::info!(job = %id, replica = %self.db.replica, name = %rec.name, "job started here, in one piece");
        let start = Instant::now();
        let summary = self.leased((id, None), &job.cancel, |progress| {
            let mut engine = engine.lock();
            let engine = settings.engine_for(&mut engine, job)?;
            crate::pipeline::run(engine, job, progress)
        })?;
        self.finish_shared(jobs, rec, job, Some((summary.frames, summary.faces)), start)
    }

    /// Restores segment `n` of `of` of a claimed film here, through the segments' scheduler
    /// held by this replica's lease; the last one done is joined here.
    fn segment(
        &self,
        jobs: &Jobs,
        rec: &Record,
        (n, of): (usize, usize),
        settings: &Settings,
        job: &crate::engine::Job,
        engine: &Mutex<Option<Engine>>,
    ) -> Result<()> {
        let Some(work) = self.planned_work(&rec.id, settings, job)? else {
            return Ok(());
        };
        if work.segments().len() != of {
            bail!(
                "the film's plan has {} segments where the job was cut into {of}",
                work.segments().len()
            );
        }
        let lease = Lease::new(self, &rec.id, &job.cancel, Some(n));
        self.schedule(jobs, rec, settings, job, &work, &lease, engine)
    }

    /// The film's plan as its planner made it (nothing planned or cleared here): `None` when
    /// this replica cannot work on it (the plan is gone, or was made with settings this replica
    /// does not have, as in a rolling upgrade: the task is handed back for a replica that has
    /// them, and this one pauses a quarter lease before it claims again).
    fn planned_work(
        &self,
        id: &str,
        settings: &Settings,
        job: &crate::engine::Job,
    ) -> Result<Option<crate::segment::Work>> {
        match crate::segment::Work::open_planned(settings, job) {
            Ok(Some(w)) => Ok(Some(w)),
            Ok(None) => {
                self.let_go(id, false);
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(job = %id, replica = %self.db.replica, "handed back: {e:#}; a replica started with the planner's settings takes it");
                self.let_go(id, false);
                std::thread::sleep(self.db.lease / 4);
                Ok(None)
            }
        }
    }

    /// Joins a film whose segments are all done (this replica holds the job), then ends it.
    fn join_shared(
        &self,
        jobs: &Jobs,
        rec: &Record,
        settings: &Settings,
        job: &crate::engine::Job,
        engine: &Mutex<Option<Engine>>,
    ) -> Result<()> {
        if !crate::segment::work_dir(&job.output).join("plan.json").exists() && job.output.exists() {
            // Joined by a replica that stopped before it recorded so.
            return self.finish_shared(jobs, rec, job, None, Instant::now());
        }
        let Some(work) = self.planned_work(&rec.id, settings, job)? else {
            return Ok(());
        };
        let lease = Lease::new(self, &rec.id, &job.cancel, None);
        self.schedule(jobs, rec, settings, job, &work, &lease, engine)
    }

    /// Runs the segments' scheduler on what `lease` holds of the film (a segment, or the
    /// join), then ends the job if this replica joined it.
    #[allow(clippy::too_many_arguments)]
    fn schedule(
        &self,
        jobs: &Jobs,
        rec: &Record,
        settings: &Settings,
        job: &crate::engine::Job,
        work: &crate::segment::Work,
        lease: &Lease<'_>,
        engine: &Mutex<Option<Engine>>,
    ) -> Result<()> {
        let start = Instant::now();
        let id = &rec.id;
        let mine = |s: &crate::segment::plan::Segment| lease.segment == Some(s.number);
        let share = crate::segment::Share {
            jobs: 1,
            threads_given: false,
            mine: &mine,
            wait: false,
            stop: &|| false,
            claims: lease,
            engine: Some(engine),
        };
        let done = crate::segment::run(settings, job, work, &share, &|_, _| {})?;
        if !lease.may_join() {
            return Ok(());
        }
        let Some(j) = done.joined else {
            if work.finished() && job.output.exists() {
                return self.finish_shared(jobs, rec, job, None, start);
            }
            if let Some(s) = work.segments().iter().find(|s| work.record(s.number).is_none()) {
                bail!("segment {} of the film is missing from the jobs folder", s.number + 1);
            }
            // Another process holds the join (a replica whose lease lapsed, still joining).
            tracing::info!(job = %id, replica = %self.db.replica, "another process is joining the film: left to it");
            self.let_go(id, false);
            return Ok(());
        };
        tracing::info!(job = %id, replica = %self.db.replica, "film joined here: {} segments, {} frames, {} faces, in {:.2} s", j.segments, j.frames, j.faces, j.join.as_secs_f64());
        self.finish_shared(jobs, rec, job, Some((j.frames, j.faces)), start)
    }

    /// Ends a job this replica holds as done: where its faces are kept for the page, the
    /// result's size recorded.
    fn finish_shared(
        &self,
        jobs: &Jobs,
        rec: &Record,
        job: &crate::engine::Job,
        progress: Option<(u64, u64)>,
        start: Instant,
    ) -> Result<()> {
        let dir = jobs.dir_of(&rec.id);
        let faithful = crate::serve::face_boxes::keep(&dir, &job.source, rec.kind == "photo", job.view().blend)
            .map_err(|e| tracing::warn!(job = %rec.id, "no faces record: {e:#}"))
            .ok();
        let bytes = std::fs::metadata(dir.join(&rec.output)).map(|m| m.len()).ok();
        let ended = self.db.finish(&rec.id, progress, |r| {
            r.state = State::Done;
            r.faithful = faithful.clone();
            r.finished = Some(now());
            r.result_bytes = bytes;
            r.fps = None;
        })?;
        if ended {
            let secs = rec.started.map_or(start.elapsed().as_secs_f64(), |s| now() - s);
            jobs.seconds.lock().push(secs);
            tracing::info!(job = %rec.id, replica = %self.db.replica, seconds = format!("{secs:.1}"), "job done");
        }
        Ok(())
    }
}

/// A replica's hold on a film's segment, or on its join, by its lease in the jobs database: the
/// segments' scheduler's [`Claims`] for a task this replica claimed.
struct Lease<'a> {
    shared: &'a Shared,
    id: &'a str,
    cancel: &'a CancelToken,
    /// The segment the task is (`None`: the join).
    segment: Option<usize>,
    taken: AtomicBool,
    /// Whether this replica joins: the task is the join, or it put the film's last segment in
    /// place.
    joins: AtomicBool,
    start: Instant,
}

impl<'a> Lease<'a> {
    fn new(shared: &'a Shared, id: &'a str, cancel: &'a CancelToken, segment: Option<usize>) -> Lease<'a> {
        Lease {
            shared,
            id,
            cancel,
            segment,
            taken: AtomicBool::new(false),
            joins: AtomicBool::new(segment.is_none()),
            start: Instant::now(),
        }
    }
}

impl Claims for Lease<'_> {
    /// The one segment the database gave this replica, once.
    fn take(&self, _: &Work, n: usize) -> Result<Option<Hold>> {
        let mine = self.segment == Some(n) && !self.taken.swap(true, Ordering::SeqCst);
        Ok(mine.then(|| Box::new(()) as Hold))
    }

    fn hold_while(&self, what: Option<usize>, f: &mut dyn FnMut(Report<'_>) -> Result<()>) -> Result<()> {
        self.shared.leased((self.id, what), self.cancel, f)
    }

    /// Puts the segment in place only while the lease holds it (the database decides, and
    /// says whether it was the film's last).
    fn commit(
        &self,
        made: &SegmentRecord,
        of: usize,
        put: &mut dyn FnMut() -> Result<SegmentRecord>,
    ) -> Result<Option<SegmentRecord>> {
        let (id, replica) = (self.id, &self.shared.db.replica);
        let (n, frames, faces) = (made.number, made.frames, made.faces);
        let what = format!("segment {} of {of} (frames {}..{})", n + 1, made.start, made.end);
        let mut kept = None;
        let end = self.shared.db.segment_done(id, n, faces, || {
            let record = put()?;
            let frames = record.frames;
            kept = Some(record);
            Ok(frames)
        })?;
        if kept.is_none() {
            self.shared.let_go(id, false);
        }
        let secs = self.start.elapsed().as_secs_f64();
        match end {
            SegmentEnd::Done | SegmentEnd::Last => {
                tracing::info!(job = %id, replica = %replica, "{what} restored here in {secs:.1} s: {frames} frames, {faces} faces");
            }
            SegmentEnd::Lost => {
                tracing::warn!(job = %id, replica = %replica, "{what}: another replica holds it now; this one's copy is discarded");
            }
            SegmentEnd::Stopped => {
                tracing::info!(job = %id, replica = %replica, "{what}: the job was stopped meanwhile; discarded");
            }
        }
        if end == SegmentEnd::Last {
            self.joins.store(true, Ordering::SeqCst);
        }
        Ok(kept)
    }

    fn may_join(&self) -> bool {
        self.joins.load(Ordering::SeqCst)
    }
}
