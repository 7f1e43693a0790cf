//! Jobs shared by service replicas through PostgreSQL (`serve --jobs-db`): in, the jobs' records,
//! their films' segments and each replica's leases on them; out, rows every replica reads (any
//! replica answers for any job), claims with `SELECT ... FOR UPDATE SKIP LOCKED`, renews while it
//! works and hands back when it stops. The files stay in the jobs folder the replicas share.
//!
//! ```text
//!  gpen_video_jobs      one row a job: its record (JSON), state, lease (planning, a run in one
//!                       piece, the join), how many segments it was cut into
//!  gpen_video_segments  one row a segment: pending -> running (holder, lease) -> done
//!  claim: a job to plan or join, else the oldest job's first free segment (pending, or its
//!         holder's lease expired: a replica killed loses its segments when its leases lapse)
//!  done:  the segment's files put in place only while its row is locked and still held; whoever
//!         completes the last segment holds the job and joins it, once
//!  NOTIFY gpen_video 'queued' | 'cancel:ID': idle replicas wake, a cancelled job's holders stop
//! ```
//! The schema is made and migrated by the service at start, under an advisory lock, so replicas
//! starting at once agree; its version is a row of `gpen_video_schema`.

use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use postgres::fallible_iterator::FallibleIterator;
use postgres::NoTls;
use r2d2_postgres::{r2d2, PostgresConnectionManager};

use super::jobs::record::{new_id, now, Record, State};

type Pool = r2d2::Pool<PostgresConnectionManager<NoTls>>;
type Tx<'a> = postgres::Transaction<'a>;

/// The schema this build writes; a database at a newer one is refused.
const SCHEMA: i32 = 1;

/// The advisory lock taken while the schema is made or migrated (any fixed number).
const MIGRATE_LOCK: i64 = 0x6770_656e_7669_6431;

/// Claims of one task (a segment; a job's plan, run in one piece or join) that may end without
/// it done (each replica that took it died, or lost its lease) before its job is failed.
pub(crate) const MAX_TRIES: i32 = 3;

/// The channel replicas notify each other on.
pub(crate) const CHANNEL: &str = "gpen_video";

/// Each migration, from version N to N+1.
const MIGRATIONS: [&str; 1] = [r"
CREATE TABLE gpen_video_jobs (
    id text PRIMARY KEY,
    record text NOT NULL,
    state text NOT NULL,
    kind text NOT NULL,
    owner text NOT NULL DEFAULT '',
    created double precision NOT NULL,
    finished double precision,
    removing boolean NOT NULL DEFAULT false,
    origin text NOT NULL,
    holder text,
    lease_until timestamptz,
    segments integer,
    frames_done bigint NOT NULL DEFAULT 0,
    faces_done bigint NOT NULL DEFAULT 0,
    tries integer NOT NULL DEFAULT 0,
    run_started double precision
);
CREATE INDEX gpen_video_jobs_state ON gpen_video_jobs (state, created);
CREATE TABLE gpen_video_segments (
    job text NOT NULL REFERENCES gpen_video_jobs (id) ON DELETE CASCADE,
    number integer NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    holder text,
    lease_until timestamptz,
    frames bigint NOT NULL,
    frames_done bigint NOT NULL DEFAULT 0,
    faces_done bigint NOT NULL DEFAULT 0,
    tries integer NOT NULL DEFAULT 0,
    started double precision,
    PRIMARY KEY (job, number)
);
"];

/// What a replica claimed.
pub(crate) enum Task {
    /// A job to plan: cut into segments (then left to the segments' claims), or run in one
    /// piece here (a photo, a short film) while holding the job's lease.
    Plan(Record),
    /// A job whose segments are all done, to join while holding its lease.
    Join(Record, usize),
    /// Segment `number` of a job of `of` segments; `was`: the replica whose lease on it lapsed.
    Segment {
        rec: Record,
        number: usize,
        of: usize,
        was: Option<String>,
    },
}

impl Task {
    pub(crate) fn record(&self) -> &Record {
        match self {
            Task::Plan(r) | Task::Join(r, _) | Task::Segment { rec: r, .. } => r,
        }
    }
}

/// What a lease's renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Still held, the job still wanted.
    Held,
    /// Another replica holds it now (this one's lease lapsed).
    Lost,
    /// The job was cancelled, deleted or failed elsewhere.
    Stopped,
}

/// How a segment's end went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentEnd {
    /// Recorded done; others remain.
    Done,
    /// Recorded done and the last: this replica now holds the job to join it.
    Last,
    /// Not this replica's any more (its files were not put in place).
    Lost,
    /// The job was cancelled or deleted meanwhile (its files were not put in place).
    Stopped,
}

/// The jobs database of the replicas.
pub(crate) struct Db {
    pool: Pool,
    config: postgres::Config,
    /// This replica's name in the rows it holds and in its log.
    pub(crate) replica: String,
    /// How long a claim holds without renewal.
    pub(crate) lease: Duration,
    /// The database as the log and errors name it (never its password).
    pub(crate) shown: String,
}

/// `url` said without its password: user@host:port/dbname.
fn shown(config: &postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            postgres::config::Host::Tcp(s) => s.clone(),
            postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// This replica's name: the host's (a pod's name on Kubernetes), the process and 4 random bytes.
fn replica_name() -> Result<String> {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| "replica".into());
    Ok(format!("{host}-{}-{}", std::process::id(), &new_id()?[..8]))
}

impl Db {
    /// Connects to `url` (waiting up to `wait` for it to answer: a database starting beside
    /// the service), makes or migrates the schema, and names this replica.
    pub(crate) fn open(url: &str, lease: Duration, wait: Duration) -> Result<Db> {
        let config = postgres::Config::from_str(url).map_err(|e| {
            anyhow::anyhow!(
                "--jobs-db: {:#}: give postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME",
                anyhow::Error::from(e)
            )
        })?;
        let shown = shown(&config);
        // Reached once before the pool is made, so an error says why (the pool's says only
        // that it timed out); a database still starting is waited for.
        let deadline = std::time::Instant::now() + wait;
        let mut said = false;
        loop {
            match config.connect(NoTls) {
                Ok(c) => {
                    drop(c);
                    break;
                }
                Err(e) if std::time::Instant::now() < deadline => {
                    if !std::mem::replace(&mut said, true) {
                        tracing::info!("waiting for the jobs database {shown}: {:#}", anyhow::Error::from(e));
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(e) => bail!(
                    "cannot reach the jobs database {shown} (--jobs-db) within {} s: {:#}",
                    wait.as_secs(),
                    anyhow::Error::from(e)
                ),
            }
        }
        let manager = PostgresConnectionManager::new(config.clone(), NoTls);
        let pool = r2d2::Pool::builder()
            .max_size(12)
            .min_idle(Some(1))
            // Reached just now: a request waits at most this long for a connection (a database
            // gone away fails the request instead of holding a thread).
            .connection_timeout(Duration::from_secs(5))
            .error_handler(Box::new(r2d2::NopErrorHandler))
            .build(manager)
            .map_err(|e| anyhow::anyhow!("cannot reach the jobs database {shown} (--jobs-db): {e}"))?;
        let db = Db {
            pool,
            config,
            replica: replica_name()?,
            lease,
            shown,
        };
        db.migrate()?;
        Ok(db)
    }

    fn client(&self) -> Result<r2d2::PooledConnection<PostgresConnectionManager<NoTls>>> {
        self.pool
            .get()
            .map_err(|e| anyhow::Error::new(e).context(format!("cannot reach the jobs database {}", self.shown)))
    }

    /// Runs `f` in a transaction, committed when it returns `Ok`.
    fn tx<T>(&self, f: impl FnOnce(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        let mut c = self.client()?;
        let mut tx = c.transaction()?;
        let v = f(&mut tx)?;
        tx.commit()?;
        Ok(v)
    }

    /// Makes the schema, or brings it to [`SCHEMA`], under an advisory lock.
    fn migrate(&self) -> Result<()> {
        self.tx(|tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])?;
            tx.batch_execute("CREATE TABLE IF NOT EXISTS gpen_video_schema (version integer NOT NULL)")?;
            let row = tx.query_opt("SELECT version FROM gpen_video_schema", &[])?;
            let have: i32 = row.as_ref().map_or(0, |r| r.get(0));
            if have > SCHEMA {
                bail!(
                    "the jobs database {} has schema version {have}, newer than this gpen-video's ({SCHEMA}): run the newer gpen-video",
                    self.shown
                );
            }
            for (i, m) in MIGRATIONS.iter().enumerate().skip(have as usize) {
                tx.batch_execute(m)
                    .with_context(|| format!("migrating the jobs database to version {}", i + 1))?;
                tracing::info!(version = i + 1, "jobs database migrated");
            }
            if row.is_none() {
                tx.execute("INSERT INTO gpen_video_schema (version) VALUES ($1)", &[&SCHEMA])?;
            } else if have < SCHEMA {
                tx.execute("UPDATE gpen_video_schema SET version = $1", &[&SCHEMA])?;
            }
            Ok(())
        })
        .with_context(|| format!("the jobs database {}", self.shown))
    }

    fn lease_s(&self) -> f64 {
        self.lease.as_secs_f64()
    }

    /// Tells the replicas `what` (`queued`, `cancel:ID`).
    pub(crate) fn notify(&self, what: &str) {
        if let Err(e) = self
            .client()
            .and_then(|mut c| Ok(c.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &what])?))
        {
            tracing::warn!("cannot notify the other replicas: {e:#}");
        }
    }

    /// Records a job just admitted by this replica.
    pub(crate) fn insert(&self, rec: &Record) -> Result<()> {
        let text = serde_json::to_string(rec)?;
        self.client()?.execute(
            "INSERT INTO gpen_video_jobs (id, record, state, kind, owner, created, origin) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &rec.id,
                &text,
                &rec.state.word(),
                &rec.kind,
                &rec.owner.clone().unwrap_or_default(),
                &rec.created,
                &self.replica,
            ],
        )?;
        self.notify("queued");
        Ok(())
    }

    /// Job `id`'s record as it stands (progress summed over its segments), with its place in
    /// its lane's line when queued.
    pub(crate) fn get(&self, id: &str) -> Result<Option<(Record, Option<u64>)>> {
        let rows = self.client()?.query(&select_jobs("j.id = $1"), &[&id])?;
        rows.first().map(record_of).transpose()
    }

    /// The jobs `owner` may see (see `Jobs::list`), oldest first, with their places.
    pub(crate) fn list(&self, owner: Option<&str>) -> Result<Vec<(Record, Option<u64>)>> {
        let rows = match owner {
            Some(o) => self.client()?.query(&select_jobs("j.owner = $1"), &[&o])?,
            None => self.client()?.query(&select_jobs("true"), &[])?,
        };
        rows.iter().map(record_of).collect()
    }

    /// Every job's id, those being removed included.
    pub(crate) fn ids(&self) -> Result<std::collections::HashSet<String>> {
        let rows = self.client()?.query("SELECT id FROM gpen_video_jobs", &[])?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Jobs by state: (queued, running, done, failed).
    pub(crate) fn counts(&self) -> Result<(usize, usize, usize, usize)> {
        let rows = self.client()?.query(
            "SELECT state, count(*) FROM gpen_video_jobs WHERE NOT removing GROUP BY state",
            &[],
        )?;
        let n = |s: &str| {
            rows.iter()
                .find(|r| r.get::<_, &str>(0) == s)
                .map_or(0, |r| r.get::<_, i64>(1) as usize)
        };
        Ok((n("queued"), n("running"), n("done"), n("failed")))
    }

    /// Jobs waiting or running, every replica's.
    pub(crate) fn unfinished(&self) -> Result<usize> {
        let row = self.client()?.query_one(
            "SELECT count(*) FROM gpen_video_jobs WHERE NOT removing AND state IN ('queued', 'running')",
            &[],
        )?;
        Ok(row.get::<_, i64>(0) as usize)
    }

    /// The finished jobs (not being removed): (id, when it finished).
    pub(crate) fn finished_jobs(&self) -> Result<Vec<(String, f64)>> {
        let rows = self.client()?.query(
            "SELECT id, coalesce(finished, 0) FROM gpen_video_jobs WHERE NOT removing AND state IN ('done', 'failed', 'cancelled')",
            &[],
        )?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// What the metrics show of the shared jobs: (jobs this replica holds, segments it holds,
    /// the backlog: jobs queued and segments waiting for a replica, every replica's).
    pub(crate) fn holdings(&self) -> Result<(u64, u64, u64)> {
        let row = self.client()?.query_one(
            "SELECT
               (SELECT count(*) FROM gpen_video_jobs WHERE holder = $1 AND lease_until > now()),
               (SELECT count(*) FROM gpen_video_segments WHERE holder = $1 AND state = 'running' AND lease_until > now()),
               (SELECT count(*) FROM gpen_video_jobs WHERE state = 'queued' AND NOT removing)
             + (SELECT count(*) FROM gpen_video_segments s JOIN gpen_video_jobs j ON j.id = s.job
                WHERE j.state = 'running' AND NOT j.removing
                  AND (s.state = 'pending' OR (s.state = 'running' AND s.lease_until < now())))",
            &[&self.replica],
        )?;
        Ok((
            row.get::<_, i64>(0) as u64,
            row.get::<_, i64>(1) as u64,
            row.get::<_, i64>(2) as u64,
        ))
    }

    /// Changes job `id`'s record by `f` (its `state` column follows the record's); the record
    /// after, `None` when there is no such job. `only_held`: only while this replica holds it.
    fn change(tx: &mut Tx<'_>, id: &str, holder: Option<&str>, f: impl FnOnce(&mut Record)) -> Result<Option<Record>> {
        let Some(row) = tx.query_opt(
            "SELECT record, state FROM gpen_video_jobs WHERE id = $1 AND ($2::text IS NULL OR holder = $2) FOR UPDATE",
            &[&id, &holder],
        )?
        else {
            return Ok(None);
        };
        let mut rec: Record = serde_json::from_str(row.get(0))?;
        rec.state = State::of_word(row.get(1));
        f(&mut rec);
        tx.execute(
            "UPDATE gpen_video_jobs SET record = $2, state = $3, finished = $4 WHERE id = $1",
            &[&id, &serde_json::to_string(&rec)?, &rec.state.word(), &rec.finished],
        )?;
        Ok(Some(rec))
    }

    /// Cancels job `id` (a finished one is left as it is); its record, `None` when there is no
    /// such job. The replicas running its segments are told.
    pub(crate) fn cancel(&self, id: &str) -> Result<Option<Record>> {
        let rec = self.tx(|tx| {
            Self::change(tx, id, None, |r| {
                if !r.state.finished() {
                    r.state = State::Cancelled;
                    r.finished = Some(now());
                    r.fps = None;
                }
            })
        })?;
        if rec.is_some() {
            self.notify(&format!("cancel:{id}"));
        }
        Ok(rec)
    }

    /// Marks job `id` for removal (cancelled, no longer listed); its record before. Its files go
    /// with [`Db::reap`] once no replica works on it.
    pub(crate) fn remove(&self, id: &str) -> Result<Option<Record>> {
        let rec = self.tx(|tx| {
            let Some(row) = tx.query_opt(
                "SELECT record, state FROM gpen_video_jobs WHERE id = $1 AND NOT removing FOR UPDATE",
                &[&id],
            )?
            else {
                return Ok(None);
            };
            let mut rec: Record = serde_json::from_str(row.get(0))?;
            rec.state = State::of_word(row.get(1));
            tx.execute(
                "UPDATE gpen_video_jobs SET removing = true, state = 'cancelled' WHERE id = $1",
                &[&id],
            )?;
            Ok(Some(rec))
        })?;
        if rec.is_some() {
            self.notify(&format!("cancel:{id}"));
        }
        Ok(rec)
    }

    /// Removes, with `remove_files`, the jobs marked for removal that no replica works on (its
    /// leases lapsed or handed back): job `id`, or every such job. The ids removed.
    pub(crate) fn reap(&self, id: Option<&str>, remove_files: &dyn Fn(&str) -> Result<()>) -> Result<Vec<String>> {
        self.tx(|tx| {
            let rows = tx.query(
                "SELECT j.id FROM gpen_video_jobs j
                 WHERE j.removing AND ($1::text IS NULL OR j.id = $1)
                   AND (j.lease_until IS NULL OR j.lease_until < now())
                   AND NOT EXISTS (SELECT 1 FROM gpen_video_segments s
                                   WHERE s.job = j.id AND s.state = 'running' AND s.lease_until > now())
                 FOR UPDATE SKIP LOCKED",
                &[&id],
            )?;
            let mut gone = Vec::new();
            for r in rows {
                let id: String = r.get(0);
                if let Err(e) = remove_files(&id) {
                    tracing::warn!(job = %id, "cannot remove the deleted job's files ({e:#}); tried again later");
                    continue;
                }
                tx.execute("DELETE FROM gpen_video_jobs WHERE id = $1", &[&id])?;
                gone.push(id);
            }
            Ok(gone)
        })
    }

    /// Claims the next task of `photos`' lane for this replica (see [`Task`]). Films: a join
    /// first, then the oldest film's next free segment, and only then a queued film to plan (so
    /// a film stays queued, in line, until a replica is free for it). A photo is claimed by the
    /// replica that took it, or by any once it has waited `photo_grace`.
    pub(crate) fn claim(&self, photos: bool, photo_grace: Duration) -> Result<Option<Task>> {
        if photos {
            return self.claim_job(false, Some(photo_grace));
        }
        if let Some(t) = self.claim_job(true, None)? {
            return Ok(Some(t));
        }
        if let Some(t) = self.claim_segment()? {
            return Ok(Some(t));
        }
        self.claim_job(false, None)
    }

    /// Claims a job whose segments are all done, to join (`join`), else one to plan or run in
    /// one piece (a photo with `photo_grace`).
    fn claim_job(&self, join: bool, photo_grace: Option<Duration>) -> Result<Option<Task>> {
        let before = now() - photo_grace.unwrap_or_default().as_secs_f64();
        let row = self.client()?.query_opt(
            "UPDATE gpen_video_jobs j SET holder = $1, lease_until = now() + make_interval(secs => $2),
               tries = j.tries + 1
             WHERE j.id = (
               SELECT c.id FROM gpen_video_jobs c
               WHERE NOT c.removing AND (c.lease_until IS NULL OR c.lease_until < now()) AND c.tries < $6
                 AND CASE WHEN $3 THEN c.state = 'running' AND c.segments IS NOT NULL AND NOT EXISTS (
                            SELECT 1 FROM gpen_video_segments s WHERE s.job = c.id AND s.state <> 'done')
                     ELSE c.state = 'queued' OR (c.state = 'running' AND c.segments IS NULL) END
                 AND (c.kind = 'photo') = $4
                 AND (NOT $4 OR c.origin = $1 OR c.created < $5)
               ORDER BY c.created, c.id LIMIT 1 FOR UPDATE SKIP LOCKED)
             RETURNING j.record, j.state, j.segments",
            &[
                &self.replica,
                &self.lease_s(),
                &join,
                &photo_grace.is_some(),
                &before,
                &MAX_TRIES,
            ],
        )?;
        let Some(row) = row else { return Ok(None) };
        let mut rec: Record = serde_json::from_str(row.get(0))?;
        rec.state = State::of_word(row.get(1));
        Ok(Some(match row.get::<_, Option<i32>>(2) {
            Some(n) if join => Task::Join(rec, n as usize),
            _ => Task::Plan(rec),
        }))
    }

    /// Claims the oldest running film's first free segment: pending, or its holder's lease
    /// lapsed (and tried fewer than [`MAX_TRIES`] times).
    fn claim_segment(&self) -> Result<Option<Task>> {
        let row = self.client()?.query_opt(
            "WITH pick AS (
               SELECT c.job, c.number, c.holder AS was FROM gpen_video_segments c
               JOIN gpen_video_jobs k ON k.id = c.job
               WHERE k.state = 'running' AND NOT k.removing AND c.tries < $3
                 AND (c.state = 'pending' OR (c.state = 'running' AND c.lease_until < now()))
               ORDER BY k.created, k.id, c.number LIMIT 1 FOR UPDATE OF c SKIP LOCKED FOR SHARE OF k SKIP LOCKED)
             UPDATE gpen_video_segments s SET state = 'running', holder = $1,
               lease_until = now() + make_interval(secs => $2), tries = s.tries + 1, frames_done = 0,
               faces_done = 0, started = extract(epoch FROM clock_timestamp())::float8
             FROM pick, gpen_video_jobs j
             WHERE s.job = pick.job AND s.number = pick.number AND j.id = s.job
             RETURNING j.record, s.number, j.segments, pick.was",
            &[&self.replica, &self.lease_s(), &MAX_TRIES],
        )?;
        let Some(row) = row else { return Ok(None) };
        let mut rec: Record = serde_json::from_str(row.get(0))?;
        rec.state = State::Running;
        let number: i32 = row.get(1);
        let of: Option<i32> = row.get(2);
        Ok(Some(Task::Segment {
            rec,
            number: number as usize,
            of: of.unwrap_or(0) as usize,
            was: row.get(3),
        }))
    }

    /// Fails the jobs with a task claimed [`MAX_TRIES`] times and never finished (each replica
    /// that took it died or lost it): they are not claimed again. The ids failed.
    pub(crate) fn give_up(&self) -> Result<Vec<String>> {
        let rows = self.client()?.query(
            "SELECT j.id, (SELECT min(s.number) FROM gpen_video_segments s
                           WHERE s.job = j.id AND s.state <> 'done' AND s.tries >= $1
                             AND (s.state = 'pending' OR s.lease_until < now()))
             FROM gpen_video_jobs j
             WHERE NOT j.removing AND j.state IN ('queued', 'running')
               AND ((j.tries >= $1 AND (j.lease_until IS NULL OR j.lease_until < now()))
                    OR EXISTS (SELECT 1 FROM gpen_video_segments s
                               WHERE s.job = j.id AND s.state <> 'done' AND s.tries >= $1
                                 AND (s.state = 'pending' OR s.lease_until < now())))",
            &[&MAX_TRIES],
        )?;
        let mut failed = Vec::new();
        for r in rows {
            let id: String = r.get(0);
            let what = match r.get::<_, Option<i32>>(1) {
                Some(n) => format!("segment {}", n + 1),
                None => "the job".to_string(),
            };
            self.fail(
                &id,
                &format!("{what} was started {MAX_TRIES} times and never finished: each replica that took it stopped (killed, out of memory, or cut off from the database)"),
            )?;
            failed.push(id);
        }
        Ok(failed)
    }

    /// Records job `id` planned by this replica: cut into segments of `frames` each (their rows
    /// made, its lease handed back for them to be claimed), or (`None`) to run in one piece here
    /// under its lease. `false` when the job is no longer this replica's or no longer wanted.
    pub(crate) fn planned(&self, id: &str, segments: Option<&[u64]>, frames_total: Option<u64>) -> Result<bool> {
        let me = self.replica.clone();
        let held = self.tx(|tx| {
            let Some(rec) = Self::change(tx, id, Some(&me), |r| {
                if matches!(r.state, State::Queued | State::Running) {
                    r.state = State::Running;
                    r.started = r.started.or(Some(now()));
                    r.frames_total = frames_total.or(r.frames_total);
                    r.fps = None;
                }
            })?
            else {
                return Ok(false);
            };
            if rec.state != State::Running {
                return Ok(false);
            }
            if let Some(frames) = segments {
                for (n, f) in frames.iter().enumerate() {
                    tx.execute(
                        "INSERT INTO gpen_video_segments (job, number, frames) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                        &[&id, &(n as i32), &(*f as i64)],
                    )?;
                }
                tx.execute(
                    "UPDATE gpen_video_jobs SET segments = $2, holder = NULL, lease_until = NULL, tries = 0 WHERE id = $1",
                    &[&id, &(frames.len() as i32)],
                )?;
            } else {
                tx.execute(
                    "UPDATE gpen_video_jobs SET run_started = extract(epoch FROM clock_timestamp())::float8, frames_done = 0, faces_done = 0 WHERE id = $1",
                    &[&id],
                )?;
            }
            Ok(true)
        })?;
        if held && segments.is_some() {
            self.notify("queued");
        }
        Ok(held)
    }

    /// Renews this replica's lease on job `id` (`segment`: on that segment of it) and records its
    /// progress.
    pub(crate) fn renew(&self, id: &str, segment: Option<usize>, frames: u64, faces: u64) -> Result<Renewal> {
        let lease = self.lease_s();
        let (frames, faces) = (frames as i64, faces as i64);
        let mut c = self.client()?;
        let row = match segment {
            Some(n) => c.query_opt(
                "UPDATE gpen_video_segments s SET lease_until = now() + make_interval(secs => $4),
                   frames_done = $5, faces_done = $6
                 FROM gpen_video_jobs j
                 WHERE j.id = s.job AND s.job = $1 AND s.number = $2 AND s.holder = $3 AND s.state = 'running'
                 RETURNING j.state, j.removing",
                &[&id, &(n as i32), &self.replica, &lease, &frames, &faces],
            )?,
            None => c.query_opt(
                "UPDATE gpen_video_jobs SET lease_until = now() + make_interval(secs => $3),
                   frames_done = $4, faces_done = $5
                 WHERE id = $1 AND holder = $2
                 RETURNING state, removing",
                &[&id, &self.replica, &lease, &frames, &faces],
            )?,
        };
        Ok(match row {
            None => Renewal::Lost,
            Some(r) if r.get::<_, bool>(1) => Renewal::Stopped,
            Some(r) if matches!(r.get::<_, &str>(0), "queued" | "running") => Renewal::Held,
            Some(_) => Renewal::Stopped,
        })
    }

    /// Records segment `n` of job `id` done by this replica, `commit` putting its files in place
    /// while its row is locked and still held (so a segment is never put in place twice); when it
    /// is the last, this replica holds the job to join it.
    pub(crate) fn segment_done(
        &self,
        id: &str,
        n: usize,
        faces: u64,
        commit: impl FnOnce() -> Result<u64>,
    ) -> Result<SegmentEnd> {
        let (me, lease) = (self.replica.clone(), self.lease_s());
        self.tx(|tx| {
            // The job's row first (every replica locks job, then segment): the last segment's
            // end is decided once.
            let job = tx.query_opt(
                "SELECT state, removing FROM gpen_video_jobs WHERE id = $1 FOR UPDATE",
                &[&id],
            )?;
            match job {
                Some(r) if !r.get::<_, bool>(1) && r.get::<_, &str>(0) == "running" => {}
                _ => return Ok(SegmentEnd::Stopped),
            }
            let held = tx
                .query_opt(
                    "SELECT 1 FROM gpen_video_segments WHERE job = $1 AND number = $2 AND holder = $3 AND state = 'running' FOR UPDATE",
                    &[&id, &(n as i32), &me],
                )?
                .is_some();
            if !held {
                return Ok(SegmentEnd::Lost);
            }
            let frames = commit()? as i64;
            tx.execute(
                "UPDATE gpen_video_segments SET state = 'done', frames_done = $3, faces_done = $4, lease_until = NULL
                 WHERE job = $1 AND number = $2",
                &[&id, &(n as i32), &frames, &(faces as i64)],
            )?;
            let left: i64 = tx
                .query_one(
                    "SELECT count(*) FROM gpen_video_segments WHERE job = $1 AND state <> 'done'",
                    &[&id],
                )?
                .get(0);
            if left > 0 {
                return Ok(SegmentEnd::Done);
            }
            tx.execute(
                "UPDATE gpen_video_jobs SET holder = $2, lease_until = now() + make_interval(secs => $3) WHERE id = $1",
                &[&id, &me, &lease],
            )?;
            Ok(SegmentEnd::Last)
        })
    }

    /// Ends job `id`, held by this replica, by `f` (done, failed); its lease goes. `false` when
    /// it is not this replica's any more, or was cancelled meanwhile (then left as it is).
    pub(crate) fn finish(&self, id: &str, progress: Option<(u64, u64)>, f: impl FnOnce(&mut Record)) -> Result<bool> {
        let me = self.replica.clone();
        self.tx(|tx| {
            let mut ended = false;
            let rec = Self::change(tx, id, Some(&me), |r| {
                if !r.state.finished() {
                    f(r);
                    ended = true;
                }
            })?;
            if rec.is_some() {
                tx.execute(
                    "UPDATE gpen_video_jobs SET holder = NULL, lease_until = NULL WHERE id = $1",
                    &[&id],
                )?;
            }
            if let (true, Some((frames, faces))) = (ended, progress) {
                tx.execute(
                    "UPDATE gpen_video_jobs SET frames_done = $2, faces_done = $3 WHERE id = $1",
                    &[&id, &(frames as i64), &(faces as i64)],
                )?;
            }
            Ok(ended)
        })
    }

    /// Marks job `id` failed for `why` if this replica still holds what failed (its `segment`,
    /// else the job): a failure of work another replica has taken over is not the job's.
    /// Whether it was failed.
    pub(crate) fn fail_held(&self, id: &str, segment: Option<usize>, why: &str) -> Result<bool> {
        let held = match segment {
            Some(n) => self.client()?.query_opt(
                "SELECT 1 FROM gpen_video_segments WHERE job = $1 AND number = $2 AND holder = $3 AND state = 'running'",
                &[&id, &(n as i32), &self.replica],
            )?,
            None => self.client()?.query_opt(
                "SELECT 1 FROM gpen_video_jobs WHERE id = $1 AND holder = $2",
                &[&id, &self.replica],
            )?,
        };
        if held.is_some() {
            self.fail(id, why)?;
        }
        Ok(held.is_some())
    }

    /// Marks job `id` failed for `why` wherever it is.
    pub(crate) fn fail(&self, id: &str, why: &str) -> Result<()> {
        self.tx(|tx| {
            Self::change(tx, id, None, |r| {
                if !r.state.finished() {
                    r.state = State::Failed;
                    r.finished = Some(now());
                    r.error = Some(why.to_string());
                    r.fps = None;
                }
            })
        })?;
        self.notify(&format!("cancel:{id}"));
        Ok(())
    }

    /// Hands back what this replica holds of job `id` (it is stopping): its segment waits for
    /// another replica, the job (to plan, run or join) is claimed afresh.
    /// `stopping`: the replica stops on purpose, and the claim does not count as a try.
    pub(crate) fn release(&self, id: &str, stopping: bool) -> Result<()> {
        let back = i32::from(stopping);
        let mut c = self.client()?;
        c.execute(
            "UPDATE gpen_video_segments SET state = 'pending', holder = NULL, lease_until = NULL,
               tries = greatest(tries - $3, 0)
             WHERE job = $1 AND holder = $2 AND state = 'running'",
            &[&id, &self.replica, &back],
        )?;
        c.execute(
            "UPDATE gpen_video_jobs SET holder = NULL, lease_until = NULL, tries = greatest(tries - $3, 0)
             WHERE id = $1 AND holder = $2",
            &[&id, &self.replica, &back],
        )?;
        drop(c);
        self.notify("queued");
        Ok(())
    }

    /// Listens for the replicas' notices until `stop`, calling `heard` with each payload (and
    /// with `queued` after a reconnection, whatever was missed). Reconnects when the database
    /// goes away.
    pub(crate) fn listen(&self, stop: &dyn Fn() -> bool, heard: &dyn Fn(&str)) {
        while !stop() {
            let mut client = match self.config.connect(NoTls) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("cannot listen to the jobs database {} ({e}); trying again", self.shown);
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")) {
                tracing::warn!("cannot listen to the jobs database {} ({e})", self.shown);
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            heard("queued");
            while !stop() && !client.is_closed() {
                let mut notices = client.notifications();
                let mut it = notices.timeout_iter(Duration::from_millis(500));
                let lost = loop {
                    match it.next() {
                        Ok(Some(n)) => heard(n.payload()),
                        Ok(None) => break false,
                        Err(e) => {
                            tracing::warn!("the jobs database's notices stopped ({e}); listening again");
                            break true;
                        }
                    }
                };
                if lost {
                    break;
                }
            }
        }
    }
}

/// The query of the jobs (not being removed) matching `filter`, oldest first, each with its
/// progress summed over its segments, a queued one's place in its lane's line, and the
/// frames a second of its runs under way.
fn select_jobs(filter: &str) -> String {
    format!(
        "SELECT j.record, j.state, j.segments, j.frames_done, j.faces_done,
           coalesce((SELECT sum(s.frames_done) FROM gpen_video_segments s WHERE s.job = j.id), 0)::int8,
           coalesce((SELECT sum(s.faces_done) FROM gpen_video_segments s WHERE s.job = j.id), 0)::int8,
           CASE WHEN j.state = 'queued' THEN (
             SELECT count(*) FROM gpen_video_jobs q
             WHERE q.state = 'queued' AND NOT q.removing AND (q.kind = 'photo') = (j.kind = 'photo')
               AND (q.created, q.id) <= (j.created, j.id)) END,
           (CASE WHEN j.segments IS NULL THEN j.frames_done / greatest(extract(epoch FROM now())::float8 - j.run_started, 0.5)
            ELSE (SELECT sum(s.frames_done / greatest(extract(epoch FROM now())::float8 - s.started, 0.5))
                  FROM gpen_video_segments s WHERE s.job = j.id AND s.state = 'running' AND s.lease_until > now()) END)::float8
         FROM gpen_video_jobs j WHERE NOT j.removing AND {filter}
         ORDER BY j.created, j.id"
    )
}

/// A row of [`select_jobs`] as a record with its live progress, and its place.
fn record_of(row: &postgres::Row) -> Result<(Record, Option<u64>)> {
    let mut rec: Record = serde_json::from_str(row.get(0))?;
    rec.state = State::of_word(row.get(1));
    let segmented = row.get::<_, Option<i32>>(2).is_some();
    if rec.state != State::Queued {
        let (frames, faces): (i64, i64) = if segmented {
            (row.get(5), row.get(6))
        } else {
            (row.get(3), row.get(4))
        };
        rec.frames_done = frames.max(0) as u64;
        rec.faces_done = faces.max(0) as u64;
        // The frames a second of the runs under way: this job's segments on every replica,
        // or its run in one piece.
        let fps: Option<f64> = row.get(8);
        rec.fps = fps.filter(|&f| rec.state == State::Running && f > 0.0);
    }
    let place: Option<i64> = row.get(7);
    Ok((rec, place.map(|p| p as u64)))
}
