//! The pipeline: in, an `Engine` (loaded sessions) and a `Job` (one source, one output); out,
//! the finished output file, its side outputs and a `Summary`.
//!
//! ```text
//!  decode ─> [pass] ─> detect ─> [mesh] ─> [smooth] ─> align ─> dispatch ═╦═> worker 0 (cpu / cuda:0) ═╦═> dispatch ─> [temporal] ─> paste ─> encode ─> OUT
//!   frames   whole-    faces     468 pts,   points     crops    gathers   ╚═> worker 1 (cuda:1) ...   ═╝   frames in    the change    blend    source pts,
//!            frame     (or       face       over time           batches       whichever is free            order        along each    (mask)   audio copied
//!            passes    followed) check                                                                                  track
//!            ahead
//! ```
//! Stages in brackets run where the job needs them (`wire::plan`).
//! Each stage (`stages.rs`, `dispatch.rs`) is a scoped thread joined to the next by a bounded
//! channel, so memory stays bounded however long the video; buffers travel back through pools
//! instead of being reallocated. From detection on, every stage passes the same envelope, a
//! `FaceFrame`. End of stream is a dropped sender. A stage whose downstream has gone simply
//! stops; the stage that failed reports the error, and the partial output is removed.

mod ctx;
mod dispatch;
mod hands;
mod pool;
mod sink;
mod stages;
mod stream;
mod wire;

use std::time::Instant;

use anyhow::{Context, Result};
use crossbeam_channel::bounded;

pub(crate) use stream::{run_images, ImageDone};

use crate::engine::{Engine, Job};
use crate::frame::{FaceFrame, Frame};
use crate::media::compare::Compare;
use crate::media::decode::Decoder;
use crate::media::still::Writer;
use crate::output::Partial;
use crate::stats::Summary;
pub(crate) use ctx::DEPTH;
use wire::{joined, wire, Encoded, Middle};

/// How far a run is: frames written and faces restored in them so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub frames: u64,
    pub faces: u64,
}

/// Runs `job` on `engine` to completion, writing `job.output` (and its faces JSON). `progress`
/// is called with the frames written and faces restored so far. The engine stays usable for another
/// job; on any error nothing is left under the output names.
pub fn run(engine: &mut Engine, job: &Job, progress: &(dyn Fn(Progress) + Sync)) -> Result<Summary> {
    let partial = Partial::beside(&job.output)?;
    match run_inner(engine, job, partial.path(), progress) {
        Ok((summary, faces)) => {
            if summary.faces_not_finite() > 0 {
                tracing::warn!(
                    "{} of {} faces kept their original pixels: the model returned NaN or infinity for them (a broken or overflowing model; an fp16 export may overflow where fp32 does not)",
                    summary.faces_not_finite(),
                    summary.faces
                );
            }
            partial.rename_to(&job.output)?;
            if let Some(sink) = faces {
                sink.commit()?;
            }
            Ok(summary)
        }
        Err(e) => {
            partial.discard();
            Err(e)
        }
    }
}

fn run_inner(
    engine: &mut Engine,
    job: &Job,
    partial: &std::path::Path,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<(Summary, Option<sink::FacesSink>)> {
    let start = Instant::now();
    let out_name = job.output.display().to_string();
    // Built before any thread starts: an output that cannot be created fails here.
    let out_src = output_source(job);
    let encoder = Writer::create(partial, &out_src, &job.treatment.encode, engine.cpu)
        .with_context(|| format!("output {out_name}"))?;
    let faces_sink = job.faces_json.as_deref().map(sink::FacesSink::create).transpose()?;
    // An image stream may have left the detector at another picture's size.
    engine.detector.start(engine.key.det_size);
    let (decoder, turn) = decoder_for(job, engine.detector.size, engine.pool_threads);
    run_wired(
        engine,
        job,
        (decoder, turn, job.treatment.max_frames),
        (encoder, faces_sink),
        start,
        progress,
    )
}

/// The source as the output shows it: a side-by-side view is twice the source's width.
fn output_source(job: &Job) -> crate::media::decode::SourceInfo {
    let mut out_src = job.source.clone();
    (out_src.width, out_src.height) = Compare::output_size(job.view().compare, &job.source);
    out_src
}

/// Where one segment of a long video is written (see [`crate::segment`]).
pub(crate) struct SegmentOut<'a> {
    /// The packet file being written (a temporary name the caller renames).
    pub(crate) packets: &'a std::path::Path,
    /// The segment's faces record (moved into place when it succeeds).
    pub(crate) faces: &'a std::path::Path,
    /// What of the source the segment decodes.
    pub(crate) span: crate::media::decode::Span,
    /// OUT's extension: the segment is encoded as that container wants it.
    pub(crate) ext: &'a str,
}

/// What a segment's run hands back: its summary and its faces record, not yet in place, with
/// the record of the warm-up frame just before the segment (to link tracks across the join).
pub(crate) struct SegmentDone {
    pub(crate) summary: Summary,
    pub(crate) faces: FacesRecord,
}

/// A segment's faces record on its way into place.
pub(crate) struct FacesRecord(sink::FacesSink);

impl FacesRecord {
    /// The record line of the frame just before the segment (a warm-up frame), if it ran.
    pub(crate) fn tail(&self) -> Option<&str> {
        self.0.tail()
    }

    /// Moves the record into place.
    pub(crate) fn commit(self) -> Result<()> {
        self.0.commit()
    }
}

/// Runs one segment of `job`'s source: its warm-up frames and its own, the own ones encoded
/// into the packet file `out.packets`. The engine stays usable for another segment.
pub(crate) fn run_segment(
    engine: &mut Engine,
    job: &Job,
    out: SegmentOut<'_>,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<SegmentDone> {
    let start = Instant::now();
    let out_src = output_source(job);
    let encoder =
        crate::media::encode::Encoder::for_segment(out.packets, &out_src, (&job.treatment.encode, out.ext), engine.cpu)
            .with_context(|| format!("segment file {}", out.packets.display()))?;
    let faces_sink = sink::FacesSink::create(out.faces)?;
    engine.detector.start(engine.key.det_size);
    let (decoder, turn) = decoder_for(job, engine.detector.size, engine.pool_threads);
    let decoder = decoder.with_span(out.span);
    let (summary, faces) = run_wired(
        engine,
        job,
        (decoder, turn, None),
        (Writer::Video(Box::new(encoder)), Some(faces_sink)),
        start,
        progress,
    )?;
    Ok(SegmentDone {
        summary,
        faces: FacesRecord(faces.expect("a segment always records its faces")),
    })
}

/// Runs the wired pipeline from `decoder` to `encoder` (and the faces record).
fn run_wired(
    engine: &mut Engine,
    job: &Job,
    (decoder, turn, max_frames): (Decoder, Option<stages::Turn>, Option<u64>),
    (encoder, faces_sink): (Writer, Option<sink::FacesSink>),
    start: Instant,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<(Summary, Option<sink::FacesSink>)> {
    let middle = Middle {
        treatment: job.treatment.clone(),
        video: true,
        flush: dispatch::Flush::Idle,
        sides: crate::media::compare::Sides::of(&job.source),
        identity: job.identity,
        each_face: job.faces_json.is_some() && !job.boxes_only,
        identity_model: job.identity_model.clone(),
        quality_model: job.quality_model.clone(),
        hand_models: job.hand_models.clone(),
    };
    let (cancel, output) = (&job.cancel, job.output.as_path());
    wire(
        engine,
        middle,
        start,
        move |p, tx| {
            stages::decode(
                decoder,
                turn,
                (&p.rgb, &p.det),
                p.budget.as_ref(),
                max_frames,
                cancel,
                tx,
            )
        },
        move |p, rx| {
            let e = stages::encode(
                encoder,
                output,
                faces_sink,
                (&p.rgb, &p.change),
                max_frames,
                cancel,
                progress,
                rx,
            )?;
            Ok(Encoded {
                stage: e.stage,
                faces: e.faces,
                frames_with_faces: e.frames_with_faces,
                left: e.left,
                extra: e.sink,
            })
        },
    )
}

/// The decoder for `job`'s source with the detector's input size `det` (upright), and for a
/// still stored sideways or mirrored, its EXIF orientation with the detection copy's stored
/// size (the decode stage turns both upright).
fn decoder_for(job: &Job, det: (usize, usize), threads: usize) -> (Decoder, Option<stages::Turn>) {
    let o = job.source.orientation;
    let stored = if crate::media::orient::swaps(o) {
        (det.1, det.0)
    } else {
        det
    };
    // A video's output is made from its source's own planes; a still's is written from RGB.
    let planes = !crate::media::kind::is_still(&job.output);
    let decoder = Decoder::new(job.source.clone(), stored, job.hwaccel_cuda)
        .with_planes(planes)
        .with_convert_threads(crate::defaults::convert_threads(threads));
    (decoder, (o > 1).then_some((o, stored)))
}

/// The aligned crops of the first faces of `job`'s source, at most `want` of them from at most
/// `max_frames` frames, made by the pipeline's own decode, detect and align stages (what bench
/// times the enhancer alone on).
pub(crate) fn collect_crops(engine: &mut Engine, job: &Job, want: usize, max_frames: u64) -> Result<Vec<Vec<u8>>> {
    let size = engine.info.size;
    // An image stream may have left the detector at another picture's size.
    engine.detector.start(engine.key.det_size);
    let (decoder, turn) = decoder_for(job, engine.detector.size, engine.pool_threads);
    let detector = &mut engine.detector;
    let pools = ctx::Pools::new(DEPTH, 0);
    let ctx = ctx::StageCtx {
        treatment: &job.treatment,
        size,
        template: engine.info.template.points(size),
        pools: &pools,
        threads: 1,
        temporal: false,
        keep_crops: false,
        tracked: false,
        sides: Default::default(),
        cpu: engine.cpu,
    };
    let (rgb, det, ctx) = (&pools.rgb, &pools.det, &ctx);
    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let (det_tx, det_rx) = bounded::<FaceFrame>(DEPTH);
    let (align_tx, align_rx) = bounded::<FaceFrame>(DEPTH);
    let cancel = &job.cancel;
    std::thread::scope(|s| {
        let decode = s.spawn(|| stages::decode(decoder, turn, (rgb, det), None, Some(max_frames), cancel, dec_tx));
        let detect = s.spawn(|| stages::detect(detector, det, dec_rx, det_tx));
        let align = s.spawn(|| stages::align(ctx, det_rx, align_tx));
        let mut crops = Vec::new();
        for ff in &align_rx {
            crops.extend(ff.faces.into_iter().map(|f| f.crop));
            if crops.len() >= want {
                break;
            }
        }
        drop(align_rx);
        crops.truncate(want);
        // Stopping early is not an error of the stages.
        joined("decode", decode.join())?;
        joined("detect", detect.join())?;
        joined("align", align.join())?;
        Ok(crops)
    })
}
