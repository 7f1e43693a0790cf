//! The pipeline: in, a resolved `Plan`; out, the finished output file and a `Summary`.
//!
//! ```text
//!  decode ──> detect ──> align ──> enhance ──> paste ──> encode ──> OUT (renamed when complete)
//!    ^  RGB frames  faces    crops  (batches       restored   in order,       │
//!    │                               across frames) frames    source pts      │
//!    └──────────────────────── frame buffers recycled ────────────────────────┘
//! ```
//! Each stage is a scoped thread joined to the next by a bounded channel, so memory stays
//! bounded however long the video. End of stream is a dropped sender. A stage whose downstream
//! has gone simply stops; the stage that failed reports the error, and the partial output is
//! removed.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::bounded;

use crate::align::{fit_similarity, template, tensor_to_rgb, warp_to_tensor};
use crate::decode::Decoder;
use crate::encode::Encoder;
use crate::enhance::Batcher;
use crate::frame::{Face, FaceFrame, FaceJob, Frame};
use crate::paste::{paste, region, Mask};
use crate::plan::Plan;
use crate::stats::{Clock, StageStat, Summary};

/// Frames in flight between two stages.
const DEPTH: usize = 4;

/// Face regions of one frame, for `--faces-json`.
struct FrameFaces {
    index: u64,
    regions: Vec<(usize, usize, usize, usize)>,
    faces: Vec<Face>,
}

/// Runs the plan to completion. `progress` is called with the number of frames encoded so far.
pub fn run(plan: Plan, progress: &(dyn Fn(u64) + Sync)) -> Result<Summary> {
    let partial = plan.partial.clone();
    let result = run_inner(plan, progress);
    if result.is_err() {
        std::fs::remove_file(&partial).ok();
    }
    result
}

fn run_inner(plan: Plan, progress: &(dyn Fn(u64) + Sync)) -> Result<Summary> {
    let start = Instant::now();
    let Plan {
        source,
        mut detector,
        mut enhancer,
        batch,
        blend,
        encode,
        output,
        partial,
        faces_json,
        ..
    } = plan;
    let out_name = output.display().to_string();
    let in_name = source.path.display().to_string();
    let size = enhancer.info.size;
    // Built before any thread starts: an output that cannot be created fails here.
    let mut encoder = Encoder::create(&partial, &source, &encode).with_context(|| format!("output {out_name}"))?;
    let decoder = Decoder::new(source.clone(), detector.size);
    let (w, h) = (source.width, source.height);

    let (recycle_tx, recycle_rx) = bounded::<Vec<u8>>(2 * DEPTH);
    let (dec_tx, dec_rx) = bounded::<Frame>(DEPTH);
    let (det_tx, det_rx) = bounded::<(Frame, Vec<Face>)>(DEPTH);
    let (align_tx, align_rx) = bounded::<FaceFrame>(DEPTH);
    let (enh_tx, enh_rx) = bounded::<FaceFrame>(DEPTH);
    let (paste_tx, paste_rx) = bounded::<(Frame, FrameFaces)>(DEPTH);

    let results = std::thread::scope(|s| {
        let decode = s.spawn(move || -> Result<StageStat> {
            let mut clock = Clock::new("decode");
            let mut t = Instant::now();
            let report = decoder.run(&recycle_rx, |f| {
                let busy = t.elapsed();
                let ok = dec_tx.send(f).is_ok();
                t = Instant::now();
                clock.add(busy);
                clock.count(1);
                ok
            });
            report.with_context(|| format!("decode stage, input {in_name}"))?;
            Ok(clock.finish())
        });

        let detect = s.spawn(move || -> Result<StageStat> {
            let mut clock = Clock::new("detect");
            for f in dec_rx {
                let faces = clock
                    .time(|| detector.detect(&f.det, f.width, f.height))
                    .with_context(|| format!("detect stage, frame {}", f.index))?;
                clock.count(1);
                if det_tx.send((f, faces)).is_err() {
                    break;
                }
            }
            Ok(clock.finish())
        });

        let align = s.spawn(move || -> Result<StageStat> {
            let mut clock = Clock::new("align");
            let tpl = template(size);
            for (f, faces) in det_rx {
                let jobs = clock.time(|| {
                    faces
                        .into_iter()
                        .map(|face| {
                            let to_crop = fit_similarity(&face.landmarks, &tpl);
                            let mut crop = vec![0.0; 3 * size * size];
                            warp_to_tensor(&f.rgb, f.width, f.height, &to_crop, size, &mut crop);
                            FaceJob {
                                face,
                                to_crop,
                                crop,
                                restored: None,
                            }
                        })
                        .collect::<Vec<_>>()
                });
                clock.count(1);
                if align_tx.send(FaceFrame { frame: f, faces: jobs }).is_err() {
                    break;
                }
            }
            Ok(clock.finish())
        });

        let enhance = s.spawn(move || -> Result<(StageStat, u64)> {
            let mut clock = Clock::new("enhance");
            let mut batcher = Batcher::new(batch, 2 * batch.max(DEPTH));
            let mut batches = 0u64;
            let mut end = false;
            let mut rx = align_rx.iter();
            loop {
                match rx.next() {
                    Some(f) => batcher.push(f),
                    None => end = true,
                }
                while let Some(jobs) = batcher.due(end) {
                    let first = batcher.frame_mut(jobs[0].0).frame.index;
                    clock
                        .time(|| -> Result<()> {
                            let item = 3 * size * size;
                            let input = enhancer.input_mut(jobs.len());
                            for (slot, &(seq, face)) in jobs.iter().enumerate() {
                                let crop = std::mem::take(&mut batcher.frame_mut(seq).faces[face].crop);
                                input[slot * item..(slot + 1) * item].copy_from_slice(&crop);
                            }
                            enhancer.run(jobs.len(), |slot, out| {
                                let (seq, face) = jobs[slot];
                                let mut rgb = Vec::new();
                                tensor_to_rgb(out, size, &mut rgb);
                                batcher.frame_mut(seq).faces[face].restored = Some(rgb);
                                batcher.done(seq);
                            })
                        })
                        .with_context(|| format!("enhance stage, batch of {} crops from frame {first}", jobs.len()))?;
                    batches += 1;
                    clock.count(jobs.len() as u64);
                }
                while let Some(f) = batcher.pop_ready() {
                    if enh_tx.send(f).is_err() {
                        return Ok((clock.finish(), batches));
                    }
                }
                if end {
                    break;
                }
            }
            Ok((clock.finish(), batches))
        });

        let paste_stage = s.spawn(move || -> Result<StageStat> {
            let mut clock = Clock::new("paste");
            let mask = Mask::new(size);
            for FaceFrame { mut frame, faces } in enh_rx {
                let info = clock.time(|| {
                    let mut info = FrameFaces {
                        index: frame.index,
                        regions: Vec::new(),
                        faces: Vec::new(),
                    };
                    for job in faces {
                        if let Some(crop) = &job.restored {
                            paste(&mut frame.rgb, w, h, crop, &job.to_crop, &mask, blend);
                        }
                        if let Some(r) = region(&job.to_crop, size, w, h) {
                            info.regions.push(r);
                            if job.restored.is_some() && blend > 0.0 {
                                frame.dirty.push(r);
                            }
                        }
                        info.faces.push(job.face);
                    }
                    info
                });
                clock.count(1);
                if paste_tx.send((frame, info)).is_err() {
                    break;
                }
            }
            Ok(clock.finish())
        });

        let (out_name, keep_log) = (&out_name, faces_json.is_some());
        let encode_stage = s.spawn(move || -> Result<(StageStat, Vec<FrameFaces>, u64, u64)> {
            let mut clock = Clock::new("encode");
            let (mut faces, mut with_faces) = (0u64, 0u64);
            let mut log = Vec::new();
            for (mut frame, info) in paste_rx {
                clock
                    .time(|| encoder.write(&mut frame))
                    .with_context(|| format!("encode stage, output {out_name}, frame {}", frame.index))?;
                clock.count(1);
                faces += info.faces.len() as u64;
                with_faces += u64::from(!info.faces.is_empty());
                progress(encoder.frames);
                let _ = recycle_tx.try_send(frame.rgb);
                if keep_log {
                    log.push(info);
                }
            }
            clock
                .time(|| encoder.finish())
                .with_context(|| format!("encode stage, finishing {out_name}"))?;
            Ok((clock.finish(), log, faces, with_faces))
        });

        let join = |name: &str, r: std::thread::Result<Result<StageStat>>| -> Result<StageStat> {
            r.map_err(|_| anyhow!("internal error: the {name} stage panicked"))?
        };
        (
            join("decode", decode.join()),
            join("detect", detect.join()),
            join("align", align.join()),
            enhance
                .join()
                .map_err(|_| anyhow!("internal error: the enhance stage panicked"))
                .and_then(|r| r),
            join("paste", paste_stage.join()),
            encode_stage
                .join()
                .map_err(|_| anyhow!("internal error: the encode stage panicked"))
                .and_then(|r| r),
        )
    });

    // The first failing stage in pipeline order is the cause; later ones only saw it stop.
    let (decode, detect, align, enhance, paste_stat, encode_r) = results;
    let (decode, detect, align) = (decode?, detect?, align?);
    let (enhance, batches) = enhance?;
    let paste_stat = paste_stat?;
    let (encode, log, faces, frames_with_faces) = encode_r?;

    if let Some(path) = &faces_json {
        write_faces_json(path, &log).with_context(|| format!("writing {}", path.display()))?;
    }
    std::fs::rename(&partial, &output)
        .with_context(|| format!("cannot move the finished file into place as {out_name}"))?;
    Ok(Summary {
        frames: encode.items,
        faces,
        frames_with_faces,
        batches,
        wall: start.elapsed(),
        stages: vec![decode, detect, align, enhance, paste_stat, encode],
    })
}

fn write_faces_json(path: &Path, log: &[FrameFaces]) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "[")?;
    for (i, f) in log.iter().enumerate() {
        let regions: Vec<String> = f
            .regions
            .iter()
            .map(|r| format!("[{},{},{},{}]", r.0, r.1, r.2, r.3))
            .collect();
        let boxes: Vec<String> = f
            .faces
            .iter()
            .map(|x| {
                format!(
                    "{{\"bbox\":[{:.1},{:.1},{:.1},{:.1}],\"score\":{:.3}}}",
                    x.bbox[0], x.bbox[1], x.bbox[2], x.bbox[3], x.score
                )
            })
            .collect();
        let comma = if i + 1 < log.len() { "," } else { "" };
        writeln!(
            out,
            "{{\"frame\":{},\"regions\":[{}],\"faces\":[{}]}}{comma}",
            f.index,
            regions.join(","),
            boxes.join(",")
        )?;
    }
    writeln!(out, "]")?;
    out.flush()?;
    Ok(())
}
