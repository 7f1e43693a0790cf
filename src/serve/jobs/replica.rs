//! A replica's share of the jobs in the replicas' database (`serve --jobs-db`): in, the tasks it
//! claims (a job to plan, run in one piece or join; a segment of a film), out, their files in the
//! shared jobs folder and their rows ended, its leases renewed while it works and handed back
//! when it stops. Each step is logged with the replica's name.

use std::sync::atomic::AtomicU64;
use std::sync::MutexGuard;

use super::*;
use crate::engine::Engine;
use crate::pipeline::Progress;
use crate::serve::shared::{Db, Renewal, SegmentEnd, Task};

impl Jobs {
    /// What this replica runs of the shared jobs, by job.
    pub(super) fn running(&self) -> MutexGuard<'_, BTreeMap<String, CancelToken>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops job `id` where this replica runs it (cancelled, deleted or failed elsewhere).
    pub(super) fn stop_local(&self, id: &str) {
        if let Some(c) = self.running().get(id) {
            c.cancel();
        }
    }

    /// A lane's thread with a jobs database: claims and runs tasks until [`Jobs::stop`]. The
    /// films' lane also listens for the replicas' notices and removes what is due.
    pub(super) fn run_shared(self: &Arc<Self>, db: &Db, lane: Lane) {
        let listener = (lane == Lane::Films).then(|| {
            let me = self.clone();
            std::thread::spawn(move || {
                let Some(db) = &me.db else { return };
                db.listen(
                    &|| me.stopping.load(Ordering::SeqCst),
                    &|what| match what.strip_prefix("cancel:") {
                        Some(id) => me.stop_local(id),
                        None => me.wake.notify_all(),
                    },
                );
            })
        });
        let mut engine: Option<Engine> = None;
        let mut tidied: Option<Instant> = None;
        while !self.stopping.load(Ordering::SeqCst) {
            if lane == Lane::Films && tidied.is_none_or(|t| t.elapsed() > Duration::from_secs(2)) {
                self.tidy(db);
                tidied = Some(Instant::now());
            }
            match db.claim(lane == Lane::Photos, db.lease * 2) {
                Ok(Some(task)) => self.run_task(db, &task, &mut engine),
                Ok(None) => {
                    // Woken by a notice (a job queued, a segment handed back), else looks again.
                    let t = self.lock();
                    drop(self.wake.wait_timeout(t, Duration::from_millis(1000)));
                }
                Err(e) => {
                    tracing::warn!("cannot claim work from the jobs database: {e:#}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        if let Some(l) = listener {
            let _ = l.join();
        }
    }

    /// Removes the deleted jobs no replica works on any more, and the finished ones past their
    /// time.
    fn tidy(&self, db: &Db) {
        if let Err(e) = db.reap(None, &|id| Ok(remove_job_dir(&self.dir_of(id))?)) {
            tracing::warn!("cannot remove deleted jobs: {e:#}");
        }
        self.expire();
    }

    /// Runs one claimed task; what it ends in goes to the database (a failure fails the job; a
    /// stop hands the task back).
    fn run_task(&self, db: &Db, task: &Task, engine: &mut Option<Engine>) {
        let rec = task.record();
        let id = rec.id.clone();
        let cancel = CancelToken::new();
        self.running().insert(id.clone(), cancel.clone());
        let r = self.task(db, task, &cancel, engine);
        self.running().remove(&id);
        match r {
            Ok(()) => {}
            Err(_) if self.stopping.load(Ordering::SeqCst) => {
                tracing::info!(job = %id, replica = %db.replica, "handed back: this replica is stopping");
                if let Err(e) = db.release(&id) {
                    tracing::warn!(job = %id, "cannot hand it back ({e:#}): another replica takes it when the lease lapses");
                }
            }
            Err(_) if cancel.is_cancelled() => {
                tracing::info!(job = %id, replica = %db.replica, "stopped here: cancelled, deleted, failed elsewhere, or its lease lapsed");
                // What it still held of the job is let go (a lease lapsed is another's now).
                if let Err(e) = db.release(&id) {
                    tracing::warn!(job = %id, "cannot let go of it ({e:#}): its lease lapses");
                }
            }
            Err(e) => {
                let why = self.in_words(&format!("{e:#}"), Some(rec));
                tracing::warn!(job = %id, replica = %db.replica, "job failed: {why}");
                if let Err(e) = db.fail(&id, &why).and_then(|()| db.release(&id)) {
                    tracing::warn!(job = %id, "cannot record the failure: {e:#}");
                }
            }
        }
        // A job deleted while it ran here goes now that nothing here writes in its folder.
        if let Err(e) = db.reap(Some(&id), &|id| Ok(remove_job_dir(&self.dir_of(id))?)) {
            tracing::warn!(job = %id, "cannot remove the deleted job: {e:#}");
        }
    }

    fn task(&self, db: &Db, task: &Task, cancel: &CancelToken, engine: &mut Option<Engine>) -> Result<()> {
        let rec = task.record();
        let (settings, job) = self.prepared(rec, cancel)?;
        match task {
            Task::Plan(_) => self.plan(db, rec, &settings, &job, engine),
            Task::Join(_, of) => {
                tracing::info!(job = %rec.id, replica = %db.replica, "joining the film's {of} segments (its join was left by another replica)");
                self.join_shared(db, rec, &settings, &job)
            }
            Task::Segment { number, of, was, .. } => {
                if let Some(w) = was.as_deref().filter(|w| *w != db.replica) {
                    tracing::info!(job = %rec.id, replica = %db.replica, "segment {} of {of} taken over from replica {w} (its lease lapsed)", number + 1);
                }
                self.segment(db, rec, (*number, *of), &settings, &job, engine)
            }
        }
    }

    /// Runs `f` while a thread renews this replica's lease on job `id` (on its `segment`) every
    /// quarter lease with the progress `f` reports; a lease lost, or the job stopped elsewhere,
    /// cancels it.
    fn leased<T>(
        &self,
        db: &Db,
        (id, segment): (&str, Option<usize>),
        cancel: &CancelToken,
        f: impl FnOnce(&(dyn Fn(Progress) + Sync)) -> Result<T>,
    ) -> Result<T> {
        let (frames, faces) = (AtomicU64::new(0), AtomicU64::new(0));
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        std::thread::scope(|s| {
            s.spawn(|| loop {
                match rx.recv_timeout(db.lease / 4) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let (n, k) = (frames.load(Ordering::Relaxed), faces.load(Ordering::Relaxed));
                match db.renew(id, segment, n, k) {
                    Ok(Renewal::Held) => {}
                    Ok(Renewal::Lost) => {
                        tracing::warn!(job = %id, replica = %db.replica, "its lease lapsed and another replica holds it: stopping here");
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
        db: &Db,
        rec: &Record,
        settings: &Settings,
        job: &crate::engine::Job,
        engine: &mut Option<Engine>,
    ) -> Result<()> {
        let id = &rec.id;
        if rec.kind != "photo" {
            if let Some(work) = crate::segment::Work::open(settings, job, self.opts.segment, false)? {
                let frames: Vec<u64> = work.segments().iter().map(|s| s.frames()).collect();
                if db.planned(id, Some(&frames), Some(work.frames()))? {
                    tracing::info!(job = %id, replica = %db.replica, "film planned: {} segments of about {} s, for any replica to claim", frames.len(), self.opts.segment);
                }
                return Ok(());
            }
        }
        if !db.planned(id, None, rec.frames_total)? {
            return Ok(());
        }
        tracing::info!(job = %id, replica = %db.replica, name = %rec.name, "job started here, in one piece");
        let start = Instant::now();
        let summary = self.leased(db, (id, None), &job.cancel, |progress| {
            let engine = settings.engine_for(engine, job)?;
            crate::pipeline::run(engine, job, progress)
        })?;
        self.finish_shared(db, rec, job, Some((summary.frames, summary.faces)), start)
    }

    /// Restores segment `n` of `of` of a claimed film here; the last one done is joined here.
    fn segment(
        &self,
        db: &Db,
        rec: &Record,
        (n, of): (usize, usize),
        settings: &Settings,
        job: &crate::engine::Job,
        engine: &mut Option<Engine>,
    ) -> Result<()> {
        let id = &rec.id;
        let start = Instant::now();
        let work = crate::segment::Work::open(settings, job, self.opts.segment, false)?
            .filter(|w| w.segments().len() == of)
            .ok_or_else(|| anyhow::anyhow!("the film's plan changed since it was cut into {of} segments"))?;
        let seg = work.segments()[n].clone();
        let made = self.leased(db, (id, Some(n)), &job.cancel, |progress| {
            let engine = settings.engine_for(engine, job)?;
            work.make(engine, job, &seg, progress)
        })?;
        let (frames, faces) = (made.record.frames, made.record.faces);
        let mut made = Some(made);
        let end = db.segment_done(id, n, faces, || {
            let made = made.take().expect("committed once");
            Ok(made.commit()?.frames)
        })?;
        if let Some(m) = made {
            m.discard();
        }
        let secs = start.elapsed().as_secs_f64();
        let what = format!("segment {} of {of} (frames {}..{})", n + 1, seg.start, seg.end);
        match end {
            SegmentEnd::Done | SegmentEnd::Last => {
                tracing::info!(job = %id, replica = %db.replica, "{what} restored here in {secs:.1} s: {frames} frames, {faces} faces");
            }
            SegmentEnd::Lost => {
                tracing::warn!(job = %id, replica = %db.replica, "{what}: another replica holds it now; this one's copy is discarded");
            }
            SegmentEnd::Stopped => {
                tracing::info!(job = %id, replica = %db.replica, "{what}: the job was stopped meanwhile; discarded");
            }
        }
        if end == SegmentEnd::Last {
            return self.join_shared(db, rec, settings, job);
        }
        Ok(())
    }

    /// Joins a film whose segments are all done (this replica holds the job), then ends it.
    fn join_shared(&self, db: &Db, rec: &Record, settings: &Settings, job: &crate::engine::Job) -> Result<()> {
        let start = Instant::now();
        let id = &rec.id;
        let joined = self.leased(db, (id, None), &job.cancel, |_| {
            let dir = crate::segment::work_dir(&job.output);
            if !dir.join("plan.json").exists() && job.output.exists() {
                // Joined by a replica that stopped before it recorded so.
                return Ok(None);
            }
            let work = crate::segment::Work::open(settings, job, self.opts.segment, false)?
                .ok_or_else(|| anyhow::anyhow!("the film's segments are gone"))?;
            let joined = work.join(job)?;
            if joined.is_none() && !(work.finished() && job.output.exists()) {
                bail!("the film's segments were not all there to join");
            }
            Ok(joined)
        })?;
        let progress = joined.as_ref().map(|j| (j.frames, j.faces));
        if let Some(j) = &joined {
            tracing::info!(job = %id, replica = %db.replica, "film joined here: {} segments, {} frames, {} faces, in {:.2} s", j.segments, j.frames, j.faces, j.join.as_secs_f64());
        }
        self.finish_shared(db, rec, job, progress, start)
    }

    /// Ends a job this replica holds as done: where its faces are kept for the page, the
    /// result's size recorded.
    fn finish_shared(
        &self,
        db: &Db,
        rec: &Record,
        job: &crate::engine::Job,
        progress: Option<(u64, u64)>,
        start: Instant,
    ) -> Result<()> {
        let dir = self.dir_of(&rec.id);
        if let Err(e) = crate::serve::face_boxes::keep(&dir, &job.source, rec.kind == "photo") {
            tracing::warn!(job = %rec.id, "no faces record: {e:#}");
        }
        let bytes = std::fs::metadata(dir.join(&rec.output)).map(|m| m.len()).ok();
        let ended = db.finish(&rec.id, progress, |r| {
            r.state = State::Done;
            r.finished = Some(now());
            r.result_bytes = bytes;
            r.fps = None;
        })?;
        if ended {
            let secs = rec.started.map_or(start.elapsed().as_secs_f64(), |s| now() - s);
            self.seconds.lock().unwrap_or_else(|e| e.into_inner()).push(secs);
            tracing::info!(job = %rec.id, replica = %db.replica, seconds = format!("{secs:.1}"), "job done");
        }
        Ok(())
    }
}
