//! One long video in segments: in, a job (source, OUT, settings) and how to cut and share it;
//! out, OUT joined from segments restored by this process's jobs, or by other processes sharing
//! the folder, resumable after a crash.
//!
//! ```text
//!  plan (packets read once: frame timestamps, keyframes) -> segments cut at keyframes
//!  each segment: seek to a keyframe before it, warm-up frames through the pipeline (not
//!                written), its own frames encoded into a packet file (`media::packets`)
//!  join: every segment done -> their packets muxed into OUT with the source's audio,
//!        subtitles, metadata and chapters (`media::encode::Muxer`), the faces records joined
//! ```
//! The work lives in a hidden folder beside OUT (`.NAME.segments/`): `plan.json` (the settings
//! hash, the input's size and time, the plan), and per finished segment its packet file, its
//! faces record and its record `NNNNN.json`, written last: a segment is done when its record
//! vouches for its packet file. A segment being made is held through [`Claims`]: by a claim
//! file (`output::Claim`, [`FileClaims`]) for the CLI, batch and a service alone, or by a lease
//! its caller keeps (the service's replicas), so jobs and processes sharing the folder each make
//! it once; the join is held too, and runs only from a whole set, once: the folder goes when
//! OUT is in place. [`run`] is the one scheduler all of them go through.

pub(crate) mod plan;

use crate::pipeline::Progress;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::engine::{Engine, Job};
use crate::media::decode::Span;
use crate::output::{write_atomic, Claim, Partial, PendingFile, Stamp};
use crate::stats::Summary;
use plan::{Scan, Segment};

/// Version of the work folder's files.
const VERSION: u32 = 1;

/// `plan.json`: what the segments were planned for, and the plan.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct PlanFile {
    version: u32,
    /// Hash of everything that decides the output (`config::settings_hash`).
    settings: String,
    input: Stamp,
    /// OUT's extension: the segments are encoded for its container.
    ext: String,
    segments: Vec<Segment>,
    scan: Scan,
}

/// A finished segment's record (`NNNNN.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub number: usize,
    /// The plan it was made for: the settings hash and the frames it covers.
    pub settings: String,
    pub start: u64,
    pub end: u64,
    pub frames: u64,
    pub faces: u64,
    pub frames_with_faces: u64,
    pub warm_frames: u64,
    /// Frames on which a hand was kept in front of a face (`None` with `--occlusion off`, and
    /// in a record written before hands were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hands_frames: Option<u64>,
    /// Size of the packet file it vouches for.
    pub bytes: u64,
    pub wall_s: f64,
    /// The faces record line of the warm-up frame just before the segment.
    pub tail: Option<String>,
}

/// A long video's work folder and plan.
pub struct Work {
    dir: PathBuf,
    plan: PlanFile,
    pts: Arc<Vec<i64>>,
}

/// A segment restored into files not yet in place (see [`Work::make`]).
pub struct Made {
    partial: Partial,
    seg_path: PathBuf,
    record_path: PathBuf,
    faces: crate::pipeline::FacesRecord,
    pub summary: Summary,
    pub record: Record,
}

impl Made {
    /// Puts the segment's packet file and faces record in place, then its record (last: a
    /// segment is done when its record vouches for its packet file).
    pub fn commit(self) -> Result<Record> {
        self.partial.rename_to(&self.seg_path)?;
        self.faces.commit()?;
        write_atomic(&self.record_path, &serde_json::to_vec(&self.record)?)?;
        Ok(self.record)
    }

    /// Removes the segment's files (another holder made it).
    pub(crate) fn discard(self) {
        self.partial.discard();
    }
}

/// The hidden work folder of `output`'s segments.
pub fn work_dir(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    crate::output::folder_of(output).join(format!(".{name}.segments"))
}

impl Work {
    /// Opens the work folder of `job` (made with settings hashed as `settings`), planning its
    /// segments of about `seconds` (the scan is kept in the folder and read again on a rerun).
    /// `None` when the video is one segment: it runs as a whole, with no folder. A folder
    /// planned for other settings, another input or another cut is emptied and planned anew;
    /// so is any with `force`.
    pub fn open(settings: &Settings, job: &Job, seconds: f64, force: bool) -> Result<Option<Work>> {
        let src = &job.source;
        if seconds <= 0.0 || crate::media::kind::is_still(&job.output) || crate::media::kind::is_still_input(&src.path)
        {
            return Ok(None);
        }
        // Too short to cut, by what the header says (no scan needed).
        if src.duration_s.is_some_and(|d| d < 1.5 * seconds) && !work_dir(&job.output).exists() {
            return Ok(None);
        }
        let hash = crate::config::settings_hash(&settings.recipe);
        let input = Stamp::of(&src.path)?;
        let ext = job
            .output
            .extension()
            .map_or_else(String::new, |e| e.to_string_lossy().into_owned());
        let dir = work_dir(&job.output);
        let plan_path = dir.join("plan.json");
        let old: Option<PlanFile> = std::fs::read(&plan_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        // The scan depends only on the input: a rerun reads it back.
        let scan = match old.as_ref().filter(|p| p.version == VERSION && p.input == input) {
            Some(p) => p.scan.clone(),
            None => match plan::scan(src, &job.cancel)? {
                Some(s) => s,
                None => {
                    tracing::info!(
                        input = %src.path.display(),
                        "the video's frames have no timestamps to cut by: it runs as one segment"
                    );
                    return Ok(None);
                }
            },
        };
        let t = &settings.recipe.treatment;
        let warm = (plan::warm_up(t), plan::look_ahead(t), plan::guard_stretch(t));
        let frames = job.treatment.max_frames.unwrap_or(u64::MAX);
        let segments = plan::cut(&scan, f64::from(src.time_base), seconds, frames, warm);
        if segments.len() < 2 {
            if dir.exists() {
                remove_work(&dir);
            }
            return Ok(None);
        }
        let plan = PlanFile {
            version: VERSION,
            settings: hash,
            input,
            ext,
            segments,
            scan,
        };
        // A folder with no plan yet may be another process's, planning the same: only a plan
        // that differs is stale.
        let stale = old.as_ref().is_some_and(|o| o != &plan);
        if force || old.is_none() || stale {
            if dir.exists() && (force || stale) {
                if !force {
                    tracing::info!(
                        dir = %dir.display(),
                        "the finished segments there were made for other settings, another input or another cut: starting afresh"
                    );
                }
                clear_segments(&dir);
            }
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create the work folder {}", dir.display()))?;
            write_atomic(&plan_path, &serde_json::to_vec(&plan)?)?;
        }
        // What a killed run left half-written.
        for ext in [".seg", ".json", ".faces"] {
            crate::output::remove_stale(&dir, ".", ext);
        }
        let pts = Arc::new(plan.scan.pts.clone());
        Ok(Some(Work { dir, plan, pts }))
    }

    /// Opens the plan another process made for `job` (made with `settings`) as it is: nothing
    /// is scanned, planned or cleared. `Ok(None)` when there is no plan (the work is over, or
    /// was never cut); an error when the plan was made for other settings, another input or
    /// another container, saying which.
    pub(crate) fn open_planned(settings: &Settings, job: &Job) -> Result<Option<Work>> {
        let dir = work_dir(&job.output);
        let bytes = match std::fs::read(dir.join("plan.json")) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading the plan in {}", dir.display())),
        };
        let plan: PlanFile =
            serde_json::from_slice(&bytes).with_context(|| format!("reading the plan in {}", dir.display()))?;
        let ext = job
            .output
            .extension()
            .map_or_else(String::new, |e| e.to_string_lossy().into_owned());
        if plan.version != VERSION {
            bail!(
                "the segments' plan is of another version ({}, this build {VERSION})",
                plan.version
            );
        }
        if plan.settings != crate::config::settings_hash(&settings.recipe) {
            bail!("the segments were planned with other settings (another model file, version or default)");
        }
        if plan.input != Stamp::of(&job.source.path)? || plan.ext != ext {
            bail!("the segments were planned for another input or container");
        }
        let pts = Arc::new(plan.scan.pts.clone());
        Ok(Some(Work { dir, plan, pts }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the work is over: its plan is gone, which a join removes first, before the
    /// folder (another process joined OUT, or is removing the folder). No segment is made and
    /// no join tried once it is.
    pub fn finished(&self) -> bool {
        !self.dir.join("plan.json").exists()
    }

    /// [`Claim::take`] on `path` in the folder, `None` also when the folder went with a join
    /// while the claim was being taken (the claim's file cannot be made there).
    fn claim(&self, path: &Path) -> Result<Option<Claim>> {
        match Claim::take(path) {
            Err(_) if self.finished() => Ok(None),
            other => other,
        }
    }

    pub fn segments(&self) -> &[Segment] {
        &self.plan.segments
    }

    /// Frames the segments write in all.
    pub fn frames(&self) -> u64 {
        self.plan.segments.last().map_or(0, |s| s.end)
    }

    fn seg_path(&self, n: usize) -> PathBuf {
        self.dir.join(plan::file_name(n))
    }

    fn record_path(&self, n: usize) -> PathBuf {
        self.dir.join(format!("{n:05}.json"))
    }

    fn faces_path(&self, n: usize) -> PathBuf {
        self.dir.join(format!("{n:05}.faces"))
    }

    /// The record of segment `n` if it is done: written, and its packet file as it vouches.
    pub fn record(&self, n: usize) -> Option<Record> {
        let r: Record = serde_json::from_slice(&std::fs::read(self.record_path(n)).ok()?).ok()?;
        let bytes = std::fs::metadata(self.seg_path(n)).ok()?.len();
        let seg = self.plan.segments.get(n)?;
        let planned = r.settings == self.plan.settings && (r.start, r.end) == (seg.start, seg.end);
        (r.number == n && planned && r.bytes == bytes && self.faces_path(n).exists()).then_some(r)
    }

    /// Restores segment `seg` of `job` on `engine` into files not yet in place: [`Made::commit`]
    /// puts them there and records the segment (dropped, they are discarded). A caller that
    /// holds the segment by a lease commits only while it still holds it.
    pub fn make(
        &self,
        engine: &mut Engine,
        job: &Job,
        seg: &Segment,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Made> {
        let start = Instant::now();
        let n = seg.number;
        let seg_path = self.seg_path(n);
        let partial = Partial::beside(&seg_path)?;
        let span = Span {
            seek: seg.seek,
            warm_from: seg.warm_from,
            start: seg.start,
            end: seg.end,
            until: seg.until,
            pts: self.pts.clone(),
        };
        let faces_path = self.faces_path(n);
        let out = crate::pipeline::SegmentOut {
            packets: partial.path(),
            faces: &faces_path,
            span,
            ext: &self.plan.ext,
        };
        let done = match crate::pipeline::run_segment(engine, job, out, progress) {
            Ok(d) => d,
            Err(e) => {
                partial.discard();
                return Err(e.context(format!(
                    "segment {} of {} (frames {}..{})",
                    n + 1,
                    self.plan.segments.len(),
                    seg.start,
                    seg.end
                )));
            }
        };
        if done.summary.frames != seg.frames() {
            partial.discard();
            bail!(
                "segment {} wrote {} frames where the plan has {}: the file changed since it was planned; run again with --force",
                n + 1,
                done.summary.frames,
                seg.frames()
            );
        }
        let record = Record {
            number: n,
            settings: self.plan.settings.clone(),
            start: seg.start,
            end: seg.end,
            frames: done.summary.frames,
            faces: done.summary.faces,
            frames_with_faces: done.summary.frames_with_faces,
            warm_frames: seg.warm_frames(),
            hands_frames: done.summary.hands_frames,
            bytes: std::fs::metadata(partial.path())?.len(),
            wall_s: start.elapsed().as_secs_f64(),
            tail: done.faces.tail().map(str::to_string),
        };
        Ok(Made {
            partial,
            seg_path,
            record_path: self.record_path(n),
            faces: done.faces,
            summary: done.summary,
            record,
        })
    }

    /// Joins the segments into `job`'s OUT when every one is done and no one else is joining:
    /// `Ok(None)` when the set is not whole, another process holds the join, or OUT was joined
    /// already (the folder is gone).
    pub fn join(&self, job: &Job) -> Result<Option<Joined>> {
        let start = Instant::now();
        if self.finished() {
            return Ok(None);
        }
        let Some(_claim) = self.claim(&self.dir.join("join"))? else {
            return Ok(None);
        };
        // Another process may have joined while this one waited for the claim.
        if self.finished() {
            return Ok(None);
        }
        let Some(records) = self
            .segments()
            .iter()
            .map(|s| self.record(s.number))
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        let src = &job.source;
        let mut out_src = src.clone();
        (out_src.width, out_src.height) = crate::media::compare::Compare::output_size(job.view().compare, src);
        let partial = Partial::beside(&job.output)?;
        let result = (|| -> Result<u64> {
            let first = crate::media::packets::PacketReader::open(&self.seg_path(0))?;
            let mut muxer = crate::media::encode::Muxer::for_join(
                partial.path(),
                &out_src,
                &job.treatment.encode,
                &first.extradata,
            )
            .with_context(|| format!("output {}", job.output.display()))?;
            drop(first);
            let mut packets = 0u64;
            let mut last_dts: Option<i64> = None;
            for seg in self.segments() {
                let mut r = crate::media::packets::PacketReader::open(&self.seg_path(seg.number))?;
                while let Some(mut p) = r.next_packet()? {
                    // Each segment's encoder starts its decode times a reorder delay before its
                    // first picture; with a variable frame rate that can reach back past the
                    // previous segment's last: such a packet is decoded just after it.
                    if let (Some(d), Some(l)) = (p.dts(), last_dts) {
                        if d <= l {
                            p.set_dts(Some(l + 1));
                        }
                    }
                    last_dts = p.dts().or(last_dts);
                    muxer.write_video(p, src.time_base)?;
                    packets += 1;
                }
            }
            let cut = job.treatment.max_frames.is_some_and(|m| m <= self.frames());
            muxer.finish(cut)?;
            Ok(packets)
        })();
        if let Err(e) = result {
            partial.discard();
            return Err(e);
        }
        let faces = match &job.faces_json {
            Some(path) => Some(self.join_faces(path, &records)?),
            None => None,
        };
        partial.rename_to(&job.output)?;
        if let Some(f) = faces {
            f.commit()?;
        }
        let joined = Joined {
            frames: records.iter().map(|r| r.frames).sum(),
            faces: records.iter().map(|r| r.faces).sum(),
            warm_frames: records.iter().map(|r| r.warm_frames).sum(),
            hands_frames: records.iter().filter_map(|r| r.hands_frames).reduce(|a, b| a + b),
            segments: records.len(),
            join: start.elapsed(),
        };
        // The plan goes first, in one step: a process sharing the folder sees the work over
        // before any record goes, and makes no segment again (see `next_segment`).
        std::fs::remove_file(self.dir.join("plan.json")).ok();
        remove_work(&self.dir);
        Ok(Some(joined))
    }

    /// Joins the segments' faces records into `path` (pending until committed), numbering
    /// tracks as one run does: a track alive at a segment's start keeps the number the
    /// previous segment gave it (found by its face on the frame before), and new tracks take
    /// the next numbers in order.
    fn join_faces(&self, path: &Path, records: &[Record]) -> Result<PendingFile> {
        use std::io::Write;
        let mut out = PendingFile::create(path)?;
        out.write_all(b"[")?;
        let mut next = 0u64;
        let mut last_line: Option<String> = None;
        let mut wrote = false;
        for (seg, record) in self.segments().iter().zip(records) {
            let text = std::fs::read_to_string(self.faces_path(seg.number))
                .with_context(|| format!("reading the faces record of segment {}", seg.number + 1))?;
            let mut map: HashMap<u64, u64> = HashMap::new();
            if let (Some(tail), Some(prev)) = (&record.tail, &last_line) {
                link_tracks(tail, prev, &mut map)?;
            }
            for line in text.lines() {
                let line = line.strip_suffix(',').unwrap_or(line);
                if !line.starts_with('{') {
                    continue;
                }
                let line = renumber(line, |local| {
                    *map.entry(local).or_insert_with(|| {
                        next += 1;
                        next - 1
                    })
                });
                out.write_all(if wrote { b",\n" } else { b"\n" })?;
                out.write_all(line.as_bytes())?;
                wrote = true;
                last_line = Some(line);
            }
            // Numbers already given stay taken (a track linked from before keeps its own).
            next = next.max(map.values().max().map_or(0, |m| m + 1));
        }
        out.write_all(b"\n]\n")?;
        Ok(out)
    }
}

/// Links the tracks of a segment's warm-up frame `tail` (its own numbers) to the numbers the
/// previous segment's record gave the same faces on that frame (`prev`, already renumbered).
fn link_tracks(tail: &str, prev: &str, map: &mut HashMap<u64, u64>) -> Result<()> {
    let (tail, prev): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(tail)?, serde_json::from_str(prev)?);
    if tail["frame"] != prev["frame"] {
        return Ok(());
    }
    let faces = |v: &serde_json::Value| v["faces"].as_array().cloned().unwrap_or_default();
    let prev_faces = faces(&prev);
    for f in faces(&tail) {
        let Some(local) = f["track"].as_u64() else { continue };
        if let Some(global) = prev_faces
            .iter()
            .find(|g| g["bbox"] == f["bbox"])
            .and_then(|g| g["track"].as_u64())
        {
            map.insert(local, global);
        } else {
            tracing::debug!(track = local, "a track at a segment's start has no match before it");
        }
    }
    Ok(())
}

/// `line` with every `"track":N` renumbered by `f`.
fn renumber(line: &str, mut f: impl FnMut(u64) -> u64) -> String {
    const KEY: &str = "\"track\":";
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find(KEY) {
        out.push_str(&rest[..i + KEY.len()]);
        rest = &rest[i + KEY.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits].parse::<u64>() {
            Ok(n) => out.push_str(&f(n).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// Removes the segments' files from a work folder (a new plan starts).
fn clear_segments(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".claim") {
                std::fs::remove_file(e.path()).ok();
            }
        }
    }
}

/// Removes a work folder once OUT is joined. A process sharing the folder may put a claim's
/// file in it while it goes (and removes it at once, seeing the plan gone): the removal is
/// tried again a few times before it is given up with a warning.
fn remove_work(dir: &Path) {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) if tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot remove the segments' work folder ({e}); it can be deleted");
                return;
            }
        }
    }
}

/// What a join made.
#[derive(Clone, Debug)]
pub struct Joined {
    pub frames: u64,
    pub faces: u64,
    pub warm_frames: u64,
    /// Frames on which a hand was kept in front of a face, over the segments that keep hands.
    pub hands_frames: Option<u64>,
    pub segments: usize,
    pub join: Duration,
}

/// How segments are shared out to the jobs of one process.
pub struct Share<'a> {
    /// Segments run at once, each its own pipeline and engine.
    pub jobs: usize,
    /// Whether `--threads` was given (then it is per job).
    pub threads_given: bool,
    /// Which segments this process takes (a shard's share; all for a single run).
    pub mine: &'a (dyn Fn(&Segment) -> bool + Sync),
    /// Wait for segments of `mine` that another process holds (a single run), or leave them
    /// (a shard: the other process joins).
    pub wait: bool,
    /// Asked to stop softly (batch's first Ctrl-C): the segments in flight finish, no new one
    /// starts.
    pub stop: &'a (dyn Fn() -> bool + Sync),
    /// How a segment and the join are held ([`FileClaims`], or a lease the caller keeps).
    pub claims: &'a dyn Claims,
    /// An engine kept between calls (a replica's, for its next task), used by the first of the
    /// jobs; `None`: each job loads its own.
    pub engine: Option<&'a Mutex<Option<Engine>>>,
}

/// Where the work held reports its progress (see [`Claims::hold_while`]).
pub(crate) type Report<'a> = &'a (dyn Fn(Progress) + Sync);

/// What holds a segment for this process while it is made (dropped: let go).
pub(crate) type Hold = Box<dyn std::any::Any>;

/// How this process holds a segment, or the join, while it works on it: by claim files in the
/// work folder ([`FileClaims`]: the CLI, batch, a service alone), or by a lease its caller
/// keeps (the replicas' database, passed in by the service). [`run`] schedules through it.
pub trait Claims: Sync {
    /// Segment `n` held for this process to make, or `None` when another holds it (or it is
    /// not this process's to make).
    fn take(&self, work: &Work, n: usize) -> Result<Option<Hold>>;

    /// Runs `f`, the making of segment `Some(n)` or the join (`None`), while the hold on it is
    /// kept: `f` reports its progress (that segment's frames and faces) to the function it is
    /// given. A hold lost meanwhile cancels the job.
    fn hold_while(&self, what: Option<usize>, f: &mut dyn FnMut(Report<'_>) -> Result<()>) -> Result<()>;

    /// Puts segment `made` (one of `of`) in place while it is still held, by calling `put`
    /// (at most once): the record `put` gave, or `None` when the hold was lost (`put` is not
    /// called, and the scheduler discards the segment's files).
    fn commit(&self, made: &Record, of: usize, put: &mut dyn FnMut() -> Result<Record>) -> Result<Option<Record>>;

    /// Whether this process may try the join once its segments are done (the join's own
    /// claim file decides which process makes it).
    fn may_join(&self) -> bool {
        true
    }
}

/// Claims by files in the work folder ([`Claim`]): jobs and processes sharing the folder each
/// make a segment once, and the join once.
pub struct FileClaims;

impl Claims for FileClaims {
    fn take(&self, work: &Work, n: usize) -> Result<Option<Hold>> {
        Ok(work.claim(&work.seg_path(n))?.map(|c| Box::new(c) as Hold))
    }

    fn hold_while(&self, _: Option<usize>, f: &mut dyn FnMut(&(dyn Fn(Progress) + Sync)) -> Result<()>) -> Result<()> {
        f(&|_| {})
    }

    fn commit(&self, _: &Record, _: usize, put: &mut dyn FnMut() -> Result<Record>) -> Result<Option<Record>> {
        put().map(Some)
    }
}

/// What a process did of a long video.
#[derive(Default)]
pub struct Done {
    /// Segments restored here, with their summaries.
    pub restored: Vec<(Record, Summary)>,
    /// Segments of `mine` found done already (an earlier run, another process).
    pub kept: usize,
    /// The join, when this process made it.
    pub joined: Option<Joined>,
    /// Another process joined OUT while this one waited.
    pub joined_elsewhere: bool,
}

/// Joins OUT once every segment is done. A run that waits for the whole set waits for another
/// process's join too (it holds the join's claim): the folder goes when OUT is in place; a join
/// given up is taken over. `frames` done so far, for a cancellation's message.
fn join_when_whole(work: &Work, job: &Job, wait: bool, frames: u64) -> Result<Option<Joined>> {
    let mut joined = work.join(job)?;
    while wait && joined.is_none() && !work.finished() {
        if job.cancel.is_cancelled() {
            return Err(crate::engine::Cancelled {
                frames,
                input: job.source.path.display().to_string(),
            }
            .into());
        }
        if work.segments().iter().any(|s| work.record(s.number).is_none()) {
            // A segment's record vanished (a new plan by another process): nothing to join.
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        joined = work.join(job)?;
    }
    Ok(joined)
}

/// Restores the segments of `work` that `share` gives this process, `share.jobs` at a time
/// (each job its own engine, GPUs shared out as batch does), then joins OUT if the set is
/// whole. `progress` is called with the frames and faces finished so far (segments done
/// before included) and the segments done.
pub fn run(
    settings: &Settings,
    job: &Job,
    work: &Work,
    share: &Share<'_>,
    progress: &(dyn Fn(Progress, usize) + Sync),
) -> Result<Done> {
    // Each segment's record read once: what is done before this run starts.
    let records: Vec<Option<Record>> = work.segments().iter().map(|s| work.record(s.number)).collect();
    let mine: Vec<&Segment> = work.segments().iter().filter(|s| (share.mine)(s)).collect();
    let pending: Vec<&Segment> = mine.iter().copied().filter(|s| records[s.number].is_none()).collect();
    let kept = mine.len() - pending.len();
    let frames_done = AtomicU64::new(records.iter().flatten().map(|r| r.frames).sum());
    let faces_done = AtomicU64::new(records.iter().flatten().map(|r| r.faces).sum());
    let segs_done = AtomicU64::new(records.iter().flatten().count() as u64);
    let so_far = || Progress {
        frames: frames_done.load(Ordering::Relaxed),
        faces: faces_done.load(Ordering::Relaxed),
    };
    progress(so_far(), segs_done.load(Ordering::Relaxed) as usize);
    let restored = Mutex::new(Vec::new());
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let stop = std::sync::atomic::AtomicBool::new(false);
    if !pending.is_empty() {
        let per_job = settings.per_job(Some(share.jobs.max(1)), pending.len(), share.threads_given);
        std::thread::scope(|s| {
            for (i, js) in per_job.iter().enumerate() {
                let own_job = job.clone();
                let (pending, restored, failure, stop) = (&pending, &restored, &failure, &stop);
                let (frames_done, faces_done, segs_done, so_far) = (&frames_done, &faces_done, &segs_done, &so_far);
                s.spawn(move || {
                    let job = &own_job;
                    let mut own: Option<Engine> = None;
                    let mut kept = share.engine.filter(|_| i == 0).map(|m| m.lock());
                    let engine: &mut Option<Engine> = match &mut kept {
                        Some(k) => k,
                        None => &mut own,
                    };
                    let r = (|| -> Result<()> {
                        loop {
                            if stop.load(Ordering::Relaxed) || job.cancel.is_cancelled() || (share.stop)() {
                                return Ok(());
                            }
                            let Some((seg, hold)) = next_segment(work, pending, share.claims)? else {
                                if share.wait
                                    && !work.finished()
                                    && pending.iter().any(|s| work.record(s.number).is_none())
                                {
                                    std::thread::sleep(Duration::from_millis(200));
                                    continue;
                                }
                                return Ok(());
                            };
                            let engine = js.engine_for(engine, job)?;
                            let (last_frames, last_faces) = (AtomicU64::new(0), AtomicU64::new(0));
                            let tick = |p: Progress| {
                                let add = |total: &AtomicU64, last: &AtomicU64, n: u64| {
                                    total.fetch_add(
                                        n.saturating_sub(last.swap(n, Ordering::Relaxed)),
                                        Ordering::Relaxed,
                                    );
                                };
                                add(frames_done, &last_frames, p.frames);
                                add(faces_done, &last_faces, p.faces);
                                progress(so_far(), segs_done.load(Ordering::Relaxed) as usize);
                            };
                            let kept = make_and_commit(work, engine, job, seg, share.claims, &tick)?;
                            drop(hold);
                            let Some((record, summary)) = kept else { continue };
                            let segs = segs_done.fetch_add(1, Ordering::Relaxed) + 1;
                            progress(so_far(), segs as usize);
                            restored.lock().push((record, summary));
                        }
                    })();
                    if let Err(e) = r {
                        stop.store(true, Ordering::Relaxed);
                        let mut f = failure.lock();
                        // A cancelled job's error only when nothing really failed.
                        let cancelled = e.is::<crate::engine::Cancelled>();
                        if f.is_none() || (!cancelled && f.as_ref().is_some_and(|x| x.is::<crate::engine::Cancelled>()))
                        {
                            *f = Some(e);
                        }
                    }
                });
            }
        });
    }
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    let stopped = (share.stop)() && mine.iter().any(|s| work.record(s.number).is_none());
    if job.cancel.is_cancelled() || stopped {
        return Err(crate::engine::Cancelled {
            frames: frames_done.load(Ordering::Relaxed),
            input: job.source.path.display().to_string(),
        }
        .into());
    }
    let mut restored = restored.into_inner();
    restored.sort_by_key(|(r, _)| r.number);
    let mut joined = None;
    if share.claims.may_join() {
        share.claims.hold_while(None, &mut |_| {
            joined = join_when_whole(work, job, share.wait, frames_done.load(Ordering::Relaxed))?;
            Ok(())
        })?;
    }
    // The plan gone and OUT in place: another process joined (before this one looked, or
    // while it waited).
    let joined_elsewhere = joined.is_none() && work.finished() && job.output.exists();
    Ok(Done {
        restored,
        kept,
        joined,
        joined_elsewhere,
    })
}

/// Makes segment `seg` of `work` on `engine` while `claims` holds it (`tick` told its progress),
/// and puts it in place through `claims`: its record and summary, or `None` where the claim
/// was lost (the files made are then discarded).
fn make_and_commit(
    work: &Work,
    engine: &mut Engine,
    job: &Job,
    seg: &Segment,
    claims: &dyn Claims,
    tick: &(dyn Fn(Progress) + Sync),
) -> Result<Option<(Record, Summary)>> {
    let mut made = None;
    claims.hold_while(Some(seg.number), &mut |held| {
        made = Some(work.make(engine, job, seg, &|p| {
            held(p);
            tick(p);
        })?);
        Ok(())
    })?;
    let Some(made) = made else {
        bail!("segment {} was not made", seg.number + 1)
    };
    let (summary, made_record) = (made.summary.clone(), made.record.clone());
    let mut made = Some(made);
    let kept = claims.commit(&made_record, work.segments().len(), &mut || {
        made.take()
            .ok_or_else(|| anyhow::anyhow!("segment {} put in place twice", seg.number + 1))?
            .commit()
    })?;
    if let Some(m) = made {
        m.discard();
    }
    Ok(kept.map(|record| (record, summary)))
}

/// The first pending segment not done and not held by another job or process, with its hold
/// (taken through `claims`).
/// `None` too once the work is over (another process joined): a record missing then is one
/// the join removed, and its segment is never made again. The plan is looked at after the
/// record: a join removes the plan before any record, so a record found missing because a
/// join removed it is always seen with the plan gone.
fn next_segment<'a>(work: &Work, pending: &[&'a Segment], claims: &dyn Claims) -> Result<Option<(&'a Segment, Hold)>> {
    for seg in pending {
        if work.record(seg.number).is_some() {
            continue;
        }
        if let Some(claim) = claims.take(work, seg.number)? {
            // Done while the claim was being taken.
            if work.record(seg.number).is_some() {
                continue;
            }
            if work.finished() {
                return Ok(None);
            }
            return Ok(Some((seg, claim)));
        }
    }
    Ok(None)
}

/// A line for the end of a segmented run.
pub fn describe(done: &Done, total: usize) -> String {
    let here = done.restored.len();
    let mut s = format!("{here} of {total} segments restored here");
    if done.kept > 0 {
        s += &format!(", {} kept from an earlier run or another process", done.kept);
    }
    match &done.joined {
        Some(j) => {
            s += &format!(
                "; joined {} frames ({} faces{}) in {:.2} s; warm-up {} frames",
                j.frames,
                j.faces,
                j.hands_frames
                    .map_or(String::new(), |n| format!(", hands kept in front on {n} frames")),
                j.join.as_secs_f64(),
                j.warm_frames
            )
        }
        None if done.joined_elsewhere => s += "; joined by another process",
        None => s += "; not joined yet (other segments are not done)",
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A work folder with a plan of three segments of ten frames, nothing made.
    fn work(dir: &Path) -> Work {
        let segments: Vec<Segment> = (0..3)
            .map(|n| Segment {
                number: n,
                start: n as u64 * 10,
                end: n as u64 * 10 + 10,
                warm_from: n as u64 * 10,
                until: n as u64 * 10 + 10,
                seek: None,
            })
            .collect();
        let plan = PlanFile {
            version: VERSION,
            settings: "s".into(),
            input: Stamp { size: 1, mtime_ns: 1 },
            ext: "mp4".into(),
            segments,
            scan: Scan {
                pts: (0..30).collect(),
                keys: vec![(0, 0)],
            },
        };
        std::fs::write(dir.join("plan.json"), serde_json::to_vec(&plan).unwrap()).unwrap();
        Work {
            dir: dir.to_path_buf(),
            plan,
            pts: Arc::new((0..30).collect()),
        }
    }

    /// A caller's hold on one segment alone (as a replica's lease is).
    struct Only(usize);

    impl Claims for Only {
        fn take(&self, _: &Work, n: usize) -> Result<Option<Hold>> {
            Ok((n == self.0).then(|| Box::new(()) as Hold))
        }
        fn hold_while(&self, _: Option<usize>, f: &mut dyn FnMut(Report<'_>) -> Result<()>) -> Result<()> {
            f(&|_| {})
        }
        fn commit(&self, _: &Record, _: usize, _: &mut dyn FnMut() -> Result<Record>) -> Result<Option<Record>> {
            Ok(None)
        }
        fn may_join(&self) -> bool {
            false
        }
    }

    /// The scheduler takes each segment through the claims it is given: file claims hand out
    /// each segment to one holder at a time, a caller's hold gives only its own.
    #[test]
    fn segments_are_taken_through_the_claims_given() {
        let dir = tempfile::tempdir().unwrap();
        let work = work(dir.path());
        let all: Vec<&Segment> = work.segments().iter().collect();
        let (first, hold) = next_segment(&work, &all, &FileClaims).unwrap().unwrap();
        assert_eq!(first.number, 0);
        let (second, _hold2) = next_segment(&work, &all, &FileClaims).unwrap().unwrap();
        assert_eq!(second.number, 1, "segment 0 is held by its claim file");
        drop(hold);
        let (again, _) = next_segment(&work, &all, &FileClaims).unwrap().unwrap();
        assert_eq!(again.number, 0, "let go with its hold");
        let (only, _) = next_segment(&work, &all, &Only(2)).unwrap().unwrap();
        assert_eq!(only.number, 2);
        assert!(next_segment(&work, &all[..2], &Only(2)).unwrap().is_none());
    }

    #[test]
    fn tracks_are_renumbered_in_place() {
        let line = r#"{"frame":3,"regions":[],"faces":[{"bbox":[1,2,3,4],"track":7},{"track":12,"x":"\"track\":"}]}"#;
        let got = renumber(line, |n| n * 10);
        assert_eq!(
            got,
            r#"{"frame":3,"regions":[],"faces":[{"bbox":[1,2,3,4],"track":70},{"track":120,"x":"\"track\":"}]}"#
        );
    }

    #[test]
    fn tracks_link_by_their_face_on_the_frame_before() {
        let tail = r#"{"frame":9,"faces":[{"bbox":[1.5,2,3,4],"track":0},{"bbox":[9,9,9,9],"track":1}]}"#;
        let prev = r#"{"frame":9,"faces":[{"bbox":[9,9,9,9],"track":4},{"bbox":[1.5,2,3,4],"track":5}]}"#;
        let mut map = HashMap::new();
        link_tracks(tail, prev, &mut map).unwrap();
        assert_eq!(map, HashMap::from([(0, 5), (1, 4)]));
        let mut map = HashMap::new();
        link_tracks(tail, r#"{"frame":8,"faces":[]}"#, &mut map).unwrap();
        assert!(map.is_empty(), "another frame links nothing");
    }
}
