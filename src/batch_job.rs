//! One batch job: in, the clips left in the shared queue and a device; out, each clip restored
//! (its output moved into place complete, then recorded in this process's manifest) or its
//! failure noted, until the queue is empty or a stop is asked for.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use anyhow::{Context, Result};
use crossbeam_channel::Sender;
use indicatif::{MultiProgress, ProgressBar};

use crate::batch_report::{ClipDone, ClipNote};
use crate::clips::Clip;
use crate::detect::det_size;

/// What a cached plan was built for: its detection size and the display rotation.
type PlanKey = ((usize, usize), u32);
use crate::interrupt::Interrupts;
use crate::manifest::{self, Entry, Manifest, Stamp};
use crate::plan::{check_output, Device, Options, Plan};

/// State the worker threads share.
pub(crate) struct Shared {
    pub(crate) in_dir: PathBuf,
    pub(crate) out_dir: PathBuf,
    pub(crate) base: Options,
    pub(crate) settings: String,
    pub(crate) ints: Interrupts,
    pub(crate) queue: Mutex<VecDeque<Clip>>,
    pub(crate) own: Mutex<Manifest>,
    pub(crate) own_path: PathBuf,
    pub(crate) in_flight: Mutex<BTreeSet<String>>,
    pub(crate) done: Mutex<Vec<ClipDone>>,
    pub(crate) failed: Mutex<Vec<ClipNote>>,
    pub(crate) cancelled: Mutex<Vec<String>>,
    pub(crate) finished: AtomicUsize,
    pub(crate) todo: usize,
    pub(crate) overall: ProgressBar,
    pub(crate) mp: MultiProgress,
    pub(crate) visible: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(crate) fn log(&self, line: String) {
        if self.visible {
            let _ = self.mp.println(line);
        } else {
            eprintln!("{line}");
        }
    }
}

pub(crate) fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One job: takes clips until none is left or a stop is asked for.
pub(crate) fn worker(sh: &Shared, device: Device, bar: ProgressBar, _alive: Sender<()>) {
    let mut cached: Option<(Plan, PlanKey)> = None;
    loop {
        // Checked under the queue's lock, so a stop seen here leaves the rest queued.
        let clip = {
            let mut queue = lock(&sh.queue);
            if sh.ints.requested() {
                break;
            }
            let Some(clip) = queue.pop_front() else { break };
            lock(&sh.in_flight).insert(clip.key.clone());
            clip
        };
        let counted = AtomicU64::new(0);
        match run_clip(sh, &clip, &device, &mut cached, &bar, &counted) {
            Ok(done) => {
                sh.log(format!(
                    "done     {} ({} frames, {} faces, {:.1} s)",
                    done.clip, done.frames, done.faces, done.seconds
                ));
                lock(&sh.done).push(done);
            }
            Err(e) => {
                sh.overall
                    .set_position(sh.overall.position().saturating_sub(counted.load(Ordering::Relaxed)));
                if sh.ints.hard_requested() {
                    sh.log(format!("stopped  {}", clip.key));
                    lock(&sh.cancelled).push(clip.key.clone());
                } else {
                    sh.log(format!("failed   {}: {e:#}", clip.key));
                    lock(&sh.failed).push(ClipNote::new(&clip.key, format!("{e:#}")));
                }
            }
        }
        lock(&sh.in_flight).remove(&clip.key);
        let n = sh.finished.fetch_add(1, Ordering::Relaxed) + 1;
        sh.overall.set_message(format!("{n}/{} clips", sh.todo));
    }
    bar.finish_and_clear();
}

/// Restores one clip and records it in this process's manifest.
fn run_clip(
    sh: &Shared,
    clip: &Clip,
    device: &Device,
    cached: &mut Option<(Plan, PlanKey)>,
    bar: &ProgressBar,
    counted: &AtomicU64,
) -> Result<ClipDone> {
    let mut o = sh.base.clone();
    o.input = sh.in_dir.join(&clip.rel);
    o.output = sh.out_dir.join(&clip.rel);
    o.device = device.clone();
    let stamp = Stamp::of(&o.input)?;
    if let Some(dir) = o.output.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
        // A partial file of this clip left by a process that died.
        let ext = o
            .output
            .extension()
            .map_or(String::new(), |e| format!(".{}", e.to_string_lossy()));
        crate::plan::remove_stale(dir, &format!(".{}.partial-", file_name(&o.output)), &ext);
    }
    let source = crate::decode::probe(&o.input)?;
    // The detector is built for one detection size and one display rotation.
    let key = (det_size(source.width, source.height, o.det_size), source.rotation);
    match cached {
        // Same detection size: the sessions carry over, only the source and output change.
        Some((plan, k)) if *k == key => {
            check_output(&o.input, &o.output)?;
            plan.source = source;
            plan.output = o.output.clone();
        }
        _ => {
            *cached = None;
            *cached = Some((Plan::resolve(&o)?, key));
        }
    }
    let plan = &mut cached.as_mut().expect("plan just set").0;
    plan.cancel = sh.ints.hard.clone();
    let total = plan.source.frames_to_run(o.max_frames);
    bar.reset();
    bar.set_length(total.unwrap_or(0));
    bar.set_message(clip.key.clone());
    let run = crate::pipeline::run(plan, &|n| {
        bar.set_position(n);
        sh.overall.inc(n.saturating_sub(counted.swap(n, Ordering::Relaxed)));
    });
    // A failed run may leave a session in a bad state: the next clip loads fresh ones.
    let summary = run.inspect_err(|_| *cached = None)?;
    // Flushed to disk before the manifest vouches for it.
    std::fs::File::open(&o.output)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("flushing {}", o.output.display()))?;
    let entry = Entry {
        input_size: stamp.size,
        input_mtime_ns: stamp.mtime_ns,
        settings: sh.settings.clone(),
        output_size: std::fs::metadata(&o.output)?.len(),
        finished_unix_ms: manifest::now_unix_ms(),
    };
    {
        let mut own = lock(&sh.own);
        own.clips.insert(clip.key.clone(), entry);
        own.save(&sh.own_path)?;
    }
    Ok(ClipDone {
        clip: clip.key.clone(),
        frames: summary.frames,
        faces: summary.faces,
        seconds: summary.wall.as_secs_f64(),
    })
}
