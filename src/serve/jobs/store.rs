//! Where the jobs are kept, the one place that knows: in, each operation of [`super::Jobs`]
//! that differs by store (list, read, cancel, delete, count, keep a new job, run a lane, stop);
//! out, its answer from the jobs folder alone ([`Folder`]: each job's `job.json`) or from the
//! replicas' database ([`Shared`]: PostgreSQL rows). Lanes, admission, quotas, expiry and the
//! HTTP handlers go through here and never ask which store holds the jobs.

use std::collections::BTreeMap;

use anyhow::Result;

use super::folder::Folder;
use super::replica::Shared;
use super::{Jobs, JobsOptions, Lane, Record};

/// The jobs' store: one match an operation.
pub(super) enum Store {
    /// This service's own jobs, kept in its folder (one service a folder).
    Folder(Folder),
    /// The replicas' jobs, kept in their database (`--jobs-db`); the folder holds their files.
    Shared(Box<Shared>),
}

impl Store {
    /// The store `opts` names: its database (`--jobs-db`), else the folder, locked and read
    /// back.
    pub(super) fn open(opts: &JobsOptions) -> Result<Store> {
        Ok(match &opts.db {
            Some(url) => Store::Shared(Box::new(Shared::open(url, opts.lease)?)),
            None => Store::Folder(Folder::open(&opts.dir)?),
        })
    }

    /// The jobs `owner` may see (see [`Jobs::list`]), each as the API answers it.
    pub(super) fn list(&self, owner: Option<&str>) -> Result<Vec<serde_json::Value>> {
        match self {
            Store::Folder(f) => Ok(f.list(owner)),
            Store::Shared(s) => s.list(owner),
        }
    }

    /// Job `id`'s record.
    pub(super) fn get(&self, id: &str) -> Result<Option<Record>> {
        match self {
            Store::Folder(f) => Ok(f.get(id)),
            Store::Shared(s) => s.get(id),
        }
    }

    /// Job `id` as the API answers it, with its place in line.
    pub(super) fn answer(&self, id: &str) -> Result<Option<serde_json::Value>> {
        match self {
            Store::Folder(f) => Ok(f.answer(id)),
            Store::Shared(s) => s.answer(id),
        }
    }

    /// Cancels job `id` (see [`Jobs::cancel`]).
    pub(super) fn cancel(&self, jobs: &Jobs, id: &str) -> Result<Record> {
        match self {
            Store::Folder(f) => f.cancel(jobs, id),
            Store::Shared(s) => s.cancel(id),
        }
    }

    /// Removes job `id` (see [`Jobs::delete`]).
    pub(super) fn delete(&self, jobs: &Jobs, id: &str) -> Result<Record> {
        match self {
            Store::Folder(f) => f.delete(jobs, id),
            Store::Shared(s) => s.delete(jobs, id),
        }
    }

    /// Jobs queued, running, done and failed.
    pub(super) fn counts(&self) -> Result<(usize, usize, usize, usize)> {
        match self {
            Store::Folder(f) => Ok(f.counts()),
            Store::Shared(s) => s.db.counts(),
        }
    }

    /// The finished jobs that may be removed (for room, or past their time), with when each
    /// finished.
    pub(super) fn finished_jobs(&self) -> BTreeMap<String, f64> {
        match self {
            Store::Folder(f) => f.finished_jobs(),
            Store::Shared(s) => s.finished_jobs(),
        }
    }

    /// Jobs waiting or running (every replica's, with a jobs database).
    pub(super) fn unfinished(&self) -> Result<usize> {
        match self {
            Store::Folder(f) => Ok(f.unfinished()),
            Store::Shared(s) => s.db.unfinished(),
        }
    }

    /// Keeps a job just admitted, queued.
    pub(super) fn insert(&self, jobs: &Jobs, rec: &Record) -> Result<()> {
        match self {
            Store::Folder(f) => f.insert(jobs, rec),
            Store::Shared(s) => s.db.insert(rec),
        }
    }

    /// A lane's thread: runs the store's jobs of `lane` until [`Jobs::stop`].
    pub(super) fn run(&self, jobs: &Jobs, lane: Lane) {
        match self {
            Store::Folder(f) => f.run(jobs, lane),
            Store::Shared(s) => s.run(jobs, lane),
        }
    }

    /// Stops the jobs running here (each resumes later, here or on another replica).
    pub(super) fn stop(&self) {
        match self {
            Store::Folder(f) => f.stop(),
            Store::Shared(s) => s.stop(),
        }
    }

    /// What the replicas hold of the shared jobs, for the metrics (`None` without a database).
    pub(super) fn holdings(&self) -> Result<Option<(u64, u64, u64)>> {
        match self {
            Store::Folder(_) => Ok(None),
            Store::Shared(s) => s.db.holdings().map(Some),
        }
    }

    /// Where the jobs are shared and as which replica, in words (`None` without a database).
    pub(super) fn shared_as(&self) -> Option<(String, String)> {
        match self {
            Store::Folder(_) => None,
            Store::Shared(s) => Some((s.db.shown.clone(), s.db.replica.clone())),
        }
    }
}
