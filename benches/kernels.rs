//! Per-face cost of the CPU kernels around the model: in, synthetic 1080p pictures and faces
//! at the sizes of the samples (a face smaller than a 512 crop, and a close-up larger than it);
//! out, the median time of each kernel per face, beside the plain clamped sampler the fast
//! paths replaced (which still serves the picture's border), measured in the same run.
//!
//! `cargo bench --bench kernels` (a plain timing loop: medians of repeated runs, no harness).

use std::hint::black_box;
use std::time::Instant;

use gpen_video::api::faces::align::template;
use gpen_video::api::faces::paste::{changes, Mask, Paste, Scratch};
use gpen_video::api::geom::{crop_footprint, fit_similarity, Affine};
use gpen_video::api::kernels::change_steps;
use gpen_video::api::kernels::tensor::crop_to_tensor;
use gpen_video::api::kernels::warp::{warp_face, warp_to_tensor, WarpScratch};
use gpen_video::api::kernels::Cpu;

/// Median milliseconds of `runs` calls of `f`.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// A face `eye` pixels between the eyes at (cx, cy), turned by `angle`: its frame -> crop map.
fn face(size: usize, eye: f64, cx: f64, cy: f64, angle: f64) -> Affine {
    let tpl = template(size);
    let s = eye / (tpl[1][0] - tpl[0][0]) as f64;
    let (sn, cs) = angle.sin_cos();
    let lm = tpl.map(|[x, y]| {
        let (x, y) = (x as f64 - size as f64 / 2.0, y as f64 - size as f64 / 2.0);
        [(cx + s * (cs * x - sn * y)) as f32, (cy + s * (sn * x + cs * y)) as f32]
    });
    fit_similarity(&lm, &tpl)
}

/// The temporal filter per face and frame: four faces (as in a group shot: their histories
/// outgrow the caches, as in the pipeline) over 120 frames (a whole cycle of the two averages
/// at the default memory of 4), still (every cell's history at full weight) and with inputs
/// that move (weights between), alternating two frames.
fn temporal(size: usize, runs: usize) {
    use gpen_video::api::faces::temporal::Temporal;
    use gpen_video::api::frame::{Face, FaceJob};
    let (h, faces, frames) = (size / 2, 4u64, 120u64);
    let change: Vec<i16> = (0..size * size * 3)
        .map(|i| change_steps(((i * 31) % 17) as f32 / 64.0 - 0.1))
        .collect();
    for (what, step) in [("still faces", 0.0f32), ("moving faces", 12.0)] {
        let mut filter = Temporal::new(4.0, size, &template(size), Cpu::detected());
        let mut index = 0u64;
        let mut jobs: Vec<FaceJob> = Vec::new();
        let ms = median_ms(runs, || {
            for _ in 0..frames {
                // The frame's jobs made outside the filter's own time as far as a loop allows:
                // their change copied in (the worker's write), their luma set.
                jobs.clear();
                for track in 0..faces {
                    let mut job = FaceJob::detected(Face::default());
                    job.track = Some(track);
                    job.luma = (0..h * h)
                        .map(|i| ((i * 13 + track as usize) % 200) as f32 + step * (index % 2) as f32)
                        .collect();
                    job.restored = Some(change.clone());
                    jobs.push(job);
                }
                filter.filter(index, &mut jobs, false);
                index += 1;
                black_box(&jobs);
            }
        }) / (frames * faces) as f64;
        println!("temporal filter, per face, {what:<24} {ms:>8.3}");
    }
}

fn main() {
    let (w, h, size) = (1920usize, 1080usize, 512usize);
    // `KERNELS=temporal` times only the temporal filter.
    if std::env::var("KERNELS").as_deref() == Ok("temporal") {
        temporal(size, 7);
        return;
    }
    // `KERNELS=tensor` times only the model's float input made from four crops in bytes, a
    // batch as the worker fills it (12 MB: more than the caches hold, as in the pipeline).
    if std::env::var("KERNELS").as_deref() == Ok("tensor") {
        let crops: Vec<Vec<u8>> = (0..4)
            .map(|k| (0..3 * size * size).map(|i| ((i * 7919 + k) % 256) as u8).collect())
            .collect();
        let mut tensor = vec![0.0f32; 4 * 3 * size * size];
        for cpu in Cpu::available() {
            let ms = median_ms(41, || {
                for (crop, item) in crops.iter().zip(tensor.chunks_exact_mut(3 * size * size)) {
                    crop_to_tensor(cpu, crop, item);
                }
                black_box(&tensor);
            });
            println!(
                "the model's input from four crops, per face, {:<9} {:>8.3}",
                cpu.name(),
                ms / 4.0
            );
        }
        return;
    }
    let frame: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
    // `KERNELS=warp` times only the warp of a face smaller than the crop, in bytes as the
    // pipeline writes it, at every CPU level this machine runs (`EYE=175` sets another distance
    // between the eyes, in frame pixels, 60 by default; `TURN=0.05` another turn of the face in
    // radians, 0.12 by default: five degrees (0.087) or less takes the two-pass warp).
    if std::env::var("KERNELS").as_deref() == Ok("warp") {
        let eye = std::env::var("EYE").ok().and_then(|v| v.parse().ok()).unwrap_or(60.0);
        let turn: f64 = std::env::var("TURN").ok().and_then(|v| v.parse().ok()).unwrap_or(0.12);
        let to_crop = face(size, eye, 900.0, 520.0, turn);
        let region = crop_footprint(&to_crop, size, w, h);
        for cpu in Cpu::available() {
            let (mut out, mut scratch) = (vec![0u8; 3 * size * size], WarpScratch::at(cpu));
            let ms = median_ms(41, || {
                warp_face(&frame, (w, h), &to_crop, region, size, &mut out[..], &mut scratch);
                black_box(&out);
            });
            println!(
                "warp into the crop in bytes, face {eye} px between the eyes, {:<9} {ms:>8.2}",
                cpu.name()
            );
        }
        return;
    }
    temporal(size, 3);
    let runs = 15;
    println!("kernel, per face (median of {runs} runs)        fast ms   clamped ms   ratio");
    for (what, eye) in [
        ("face 80 px between the eyes", 80.0),
        ("close-up 240 px", 240.0),
        ("close-up 400 px", 400.0),
    ] {
        let to_crop = face(size, eye, 900.0, 520.0, 0.12);
        let region = crop_footprint(&to_crop, size, w, h);
        let mut out = vec![0.0f32; 3 * size * size];
        let mut scratch = WarpScratch::at(Cpu::detected());
        let fast = median_ms(runs, || {
            warp_face(&frame, (w, h), &to_crop, region, size, &mut out, &mut scratch);
            black_box(&out);
        });
        let plain = median_ms(runs, || {
            warp_to_tensor(&frame, w, h, &to_crop, size, &mut out);
            black_box(&out);
        });
        println!(
            "warp into the crop, {what:<28} {fast:>8.2} {plain:>12.2} {:>7.2}",
            plain / fast
        );
        let change: Vec<i16> = (0..size * size * 3)
            .map(|i| change_steps(((i * 31) % 17) as f32 - 8.0))
            .collect();
        let mask = Mask::face(size, &template(size));
        let faces = [Paste {
            change: &change,
            to_crop,
            region: region.expect("on the frame"),
            mask: None,
            fix: false,
        }];
        // The changes' buffers come back for the next call, as the paste stage's pool gives
        // them back (a fresh buffer each call would time its page faults, not the paste).
        let (mut scratch, mut spare) = (Scratch::at(Cpu::detected()), Vec::new());
        let mut paste_with = |faces: &[Paste]| {
            median_ms(runs, || {
                let out = changes(faces, &mask, 1.0, &mut scratch, &mut || spare.pop().unwrap_or_default());
                spare.extend(black_box(out).into_iter().map(|c| c.rgb));
            })
        };
        let paste = paste_with(&faces);
        println!("paste's change,     {what:<28} {paste:>8.2}");
        // The mesh mask: a face outline of 36 points (an oval round the template's face), made
        // per face, then the paste through it.
        let outline: Vec<[f32; 2]> = (0..36)
            .map(|k| {
                let a = k as f32 / 36.0 * std::f32::consts::TAU;
                let s = size as f32;
                [s * (0.5 + 0.3 * a.sin()), s * (0.55 - 0.38 * a.cos())]
            })
            .collect();
        let mut own = Mask::polygon(size, &outline);
        let build = median_ms(runs, || {
            own.set_polygon(size, &outline);
            black_box(&own);
        });
        let faces = [Paste {
            mask: Some(&own),
            ..faces[0]
        }];
        let paste_mesh = paste_with(&faces);
        println!("mesh mask: make {build:>8.2}, paste through it {paste_mesh:>8.2}  ({what})");
    }
    // The colour fix: the change's low band taken off, per face, at each crop size.
    for size in [256usize, 512] {
        let mut change: Vec<i16> = (0..3 * size * size)
            .map(|i| ((i * 7919) % 4001) as i16 - 2000)
            .collect();
        let mut low = gpen_video::api::kernels::lowband::LowBand::at(Cpu::detected());
        let ms = median_ms(runs, || {
            gpen_video::api::kernels::lowband::remove_low_band(&mut change, size, &mut low);
            black_box(&change);
        });
        println!("colour fix (low band off),   crop {size:<15} {ms:>8.2}");
    }
}
