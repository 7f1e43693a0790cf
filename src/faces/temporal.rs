//! The temporal filter of the model's change: in, each frame's restored faces in order, each
//! with its track (from the smoother), the half-resolution luma of the crop it was given and the
//! model's change; out, the change filtered along the track in crop space, and the run's
//! flicker figures.
//!
//! A GAN restorer invents slightly different detail for each frame of the same face (noise and
//! compression differ), and that shimmers. The crops of one track are aligned to one template
//! by smoothed points, so a crop pixel is the same point of the face from frame to frame: the
//! change there is averaged over time (an exponential average, `memory` frames long), each
//! pixel's history weighted by how alike its input is now and a frame ago. Detail the input
//! does not support averages away; where the input really changed (a mouth opens, an eye
//! blinks, a hand enters) the history's weight is zero and the new change is taken at once. A
//! new track (a cut, a new or lost face) starts afresh, and so does a track whose face's light
//! changed (its mean luma moved by [`RELIT`] levels or more from one frame to the next).
//!
//! The average forgets for good: two averages take turns, each started afresh every `4 span`
//! frames at fixed frame indices, half a cycle apart. An average runs `span` frames before it
//! is used (far longer than the memory, so the switch is not seen: the history it drops weighs
//! under 0.2 %), is used for the next `2 span`, then rests until its restart, so half the frames
//! run one average and half run two. A frame's output thus depends on at most `3 span` frames
//! before it, and a segment that starts that many frames earlier (its warm-up) rebuilds exactly
//! what a run from the first frame has.

use std::collections::HashMap;
use std::ops::Range;

use crate::frame::FaceJob;
use crate::kernels::bands::{Band, Partial, Step};
use crate::kernels::Cpu;
use crate::stats::Flicker;

/// Mean input luma change over the face (levels, half-resolution crop) from one frame to the
/// next that is a change of lighting (a lamp switched on, a flash, a cloud): the track's history
/// starts afresh, as the model's change under the old light no longer fits. Sensor noise
/// averages out of the mean, and an exposure that drifts moves it by a level or so a frame.
const RELIT: f32 = 5.0;

/// Frames each of the two averages runs before it is used (see the module's text): six times
/// the memory's time constant, whose weight then is `(m / (1 + m))^span` (0.12 % at 4).
pub(crate) fn span(memory: f32) -> u64 {
    (6.0 * (memory.max(0.0) + 1.0)).ceil() as u64
}

/// Frames before a frame that its filtered change can depend on: a segment's warm-up needs
/// this many (0 when the filter does not run).
pub(crate) fn reach(memory: f32) -> u64 {
    if memory > 0.0 {
        3 * span(memory)
    } else {
        0
    }
}

/// One track's state: the previous frame's input luma, the two averages of the change, and
/// the luma of its output with and without the filter (for the figures).
#[derive(Default)]
struct Track {
    frame: u64,
    luma: Vec<f32>,
    /// The averages restarted at multiples of `4 span` (`change`) and half a cycle later
    /// (`change_b`).
    change: Vec<i16>,
    change_b: Vec<i16>,
    out: Vec<f32>,
    raw: Vec<f32>,
    /// This frame's output luma with and without the filter, and the history shares.
    next_out: Vec<f32>,
    next_raw: Vec<f32>,
    shares: Vec<f32>,
}

/// The filter of one run.
pub struct Temporal {
    memory: f32,
    span: u64,
    size: usize,
    /// Half-resolution cells inside the face (the template's face ellipse), for the figures.
    face: Vec<bool>,
    tracks: HashMap<u64, Track>,
    spare: Vec<Track>,
    /// Threads a frame's bands are shared out to, and each one's row maxima (see [`shares`]);
    /// the threads, kept for the run (none for one).
    threads: usize,
    scratch: Vec<Vec<f32>>,
    pool: Option<rayon::ThreadPool>,
    helper_cpu: std::time::Duration,
    pub flicker: Flicker,
    /// The CPU level the bands' kernels run at (the detected one unless [`Temporal::at`]).
    cpu: Cpu,
}

/// Splits `s` into the parts of `bands` (ranges of rows, in order, covering it from its
/// start), `per_row` values a row; an empty `s` gives empty parts.
fn split_rows<'a, T>(mut s: &'a mut [T], per_row: usize, bands: &[Range<usize>]) -> Vec<&'a mut [T]> {
    bands
        .iter()
        .map(|r| {
            let n = (r.len() * per_row).min(s.len());
            let (part, rest) = std::mem::take(&mut s).split_at_mut(n);
            s = rest;
            part
        })
        .collect()
}

/// The rows of `s` in `r` (`per_row` values a row), or nothing when `s` is empty.
fn rows_of<'a, T>(s: &'a [T], per_row: usize, r: &Range<usize>) -> &'a [T] {
    s.get(r.start * per_row..r.end * per_row).unwrap_or(&[])
}

/// Runs `bands`, each taking the next band, on this thread alone, or on up to one thread of
/// `pool` (kept for the run, see [`crate::parts`]) per scratch buffer of `scratches` (each with
/// its own buffer, kept between frames); returns their sums and the CPU time spent on the pool.
fn run_bands(
    bands: Vec<Band<'_>>,
    scratches: &mut [Vec<f32>],
    pool: Option<&rayon::ThreadPool>,
) -> (Vec<Partial>, std::time::Duration) {
    let parts = scratches.len().min(bands.len());
    let Some(pool) = pool.filter(|_| parts > 1) else {
        let scratch = scratches.first_mut().expect("one scratch buffer at least");
        return (
            bands.into_iter().map(|b| b.run(scratch)).collect(),
            std::time::Duration::ZERO,
        );
    };
    let queue = parking_lot::Mutex::new(bands);
    let take = || queue.lock().pop();
    let mut slots: Vec<(Vec<Partial>, std::time::Duration, Option<std::thread::ThreadId>)> = (0..parts)
        .map(|_| (Vec::new(), std::time::Duration::ZERO, None))
        .collect();
    // The pool's threads run every part (this thread waits in the scope), each timing its own
    // clock over its part.
    pool.scope(|s| {
        for (own, slot) in scratches.iter_mut().zip(slots.iter_mut()) {
            let take = &take;
            s.spawn(move |_| {
                let start = crate::stats::thread_cpu_time();
                while let Some(b) = take() {
                    slot.0.push(b.run(own));
                }
                slot.1 = crate::stats::thread_cpu_time().saturating_sub(start);
                slot.2 = Some(std::thread::current().id());
            });
        }
    });
    #[cfg(test)]
    tests::BAND_THREADS.with(|t| t.borrow_mut().extend(slots.iter().filter_map(|s| s.2)));
    let cpu = slots.iter().map(|s| s.1).sum();
    (slots.into_iter().flat_map(|s| s.0).collect(), cpu)
}

/// Whether the mean of `now - before` over the face's cells (`inside`) is a change of lighting
/// ([`RELIT`] levels or more either way).
fn relit(now: &[f32], before: &[f32], inside: &[bool]) -> bool {
    let (mut sum, mut n) = (0.0f64, 0usize);
    for ((a, b), _) in now.iter().zip(before).zip(inside).filter(|(_, &i)| i) {
        sum += f64::from(a - b);
        n += 1;
    }
    n > 0 && (sum / n as f64).abs() >= f64::from(RELIT)
}

/// One face's part of a frame: its job, its track's state (taken out of the map for the frame)
/// and what its averages do.
struct FaceWork<'a> {
    job: &'a mut FaceJob,
    id: u64,
    track: Track,
    step: Step,
    filtering: bool,
    /// The face counts in the frame-to-frame figures (its track goes on, the frame is written).
    counts: bool,
}

impl FaceWork<'_> {
    /// Cuts the face into bands of the cell rows `ranges` (crops of `size`, a memory of `w_max`,
    /// the first average the other one when `a_first`), each with its part of every buffer;
    /// `inside` marks the cells inside the face.
    fn cut<'b>(
        &'b mut self,
        ranges: &[Range<usize>],
        (cpu, size, w_max, a_first): (Cpu, usize, f32, bool),
        inside: &'b [bool],
        out: &mut Vec<Band<'b>>,
    ) {
        let h = size / 2;
        let t = &mut self.track;
        let change = self.job.restored.as_mut().expect("a face at work has its change");
        let (a, b) = (&mut t.change, &mut t.change_b);
        let (other, used) = if a_first { (a, b) } else { (b, a) };
        let row = size * 3 * 2;
        let mut nows = split_rows(change, row, ranges).into_iter();
        let mut others = split_rows(other, row, ranges).into_iter();
        let mut useds = split_rows(used, row, ranges).into_iter();
        let mut shares = split_rows(&mut t.shares, h, ranges).into_iter();
        let mut raws = split_rows(&mut t.next_raw, h, ranges).into_iter();
        let mut outs = split_rows(&mut t.next_out, h, ranges).into_iter();
        fn next<'b, T>(parts: &mut std::vec::IntoIter<&'b mut [T]>) -> &'b mut [T] {
            parts.next().expect("a part per band")
        }
        for r in ranges {
            out.push(Band {
                cpu,
                rows: r.clone(),
                size,
                step: self.step,
                filtering: self.filtering,
                counts: self.counts,
                w_max,
                now: next(&mut nows),
                histories: [next(&mut others), next(&mut useds)],
                luma: &self.job.luma,
                past: &t.luma,
                shares: next(&mut shares),
                raw: next(&mut raws),
                out: next(&mut outs),
                prev_raw: rows_of(&t.raw, h, r),
                prev_out: rows_of(&t.out, h, r),
                inside: rows_of(inside, h, r),
            });
        }
    }
}

impl Temporal {
    /// A filter of `memory` frames for crops of `size` aligned to `template` (crop pixels),
    /// on this thread alone (see [`Temporal::threads`]), its bands summed at the CPU level `cpu`.
    pub fn new(memory: f32, size: usize, template: &[[f32; 2]; 5], cpu: Cpu) -> Self {
        let mask = crate::faces::paste::Mask::face(size, template);
        let h = size / 2;
        let face = (0..h * h)
            .map(|i| mask.at((2 * (i % h)) as f64 + 0.5, (2 * (i / h)) as f64 + 0.5) >= 0.5)
            .collect();
        Self {
            memory: memory.max(0.0),
            span: span(memory),
            size,
            face,
            tracks: HashMap::new(),
            spare: Vec::new(),
            threads: 1,
            scratch: vec![Vec::new()],
            pool: None,
            helper_cpu: std::time::Duration::ZERO,
            cpu,
            flicker: Flicker {
                filtered: memory > 0.0,
                ..Flicker::default()
            },
        }
    }

    /// Filters each frame's faces on up to `threads` threads: each face cut into bands of rows,
    /// the bands of all the frame's faces shared out (the same values as on one thread).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self.scratch.resize_with(self.threads, Vec::new);
        self.pool = crate::parts::pool(self.threads, "temporal");
        self
    }

    /// Runs the bands' kernels at `cpu` (a test's or a benchmark's choice).
    pub fn at(mut self, cpu: Cpu) -> Self {
        self.cpu = cpu;
        self
    }

    /// CPU time the helper threads spent so far (the calling thread's own is not in it).
    pub(crate) fn helper_cpu(&self) -> std::time::Duration {
        self.helper_cpu
    }

    /// Filters the changes of frame `index`'s faces in place. Faces without a track, a
    /// change or an input luma pass unchanged; tracks not seen in this frame end. A frame
    /// that is only `warming` (a segment's warm-up, not written) builds the state but does not
    /// count in the figures.
    pub fn filter(&mut self, index: u64, faces: &mut [FaceJob], warming: bool) {
        let (size, h) = (self.size, self.size / 2);
        // Each filtered face with its track's state, taken out of the map for the frame.
        let mut work: Vec<FaceWork> = Vec::new();
        for job in faces.iter_mut() {
            let (Some(id), Some(change)) = (job.track, job.restored.as_ref()) else {
                continue;
            };
            if job.luma.len() != h * h || change.len() != size * size * 3 {
                continue;
            }
            let prev = self.tracks.remove(&id).filter(|t| t.frame + 1 == index);
            let mut track = prev.unwrap_or_else(|| self.spare.pop().unwrap_or_default());
            let continues = track.frame + 1 == index && track.luma.len() == h * h;
            let relit = continues && relit(&job.luma, &track.luma, &self.face);
            let (step, filtering) = self.plan(index, continues && !relit, &mut track, change.len());
            for v in [&mut track.next_raw, &mut track.next_out, &mut track.shares] {
                v.resize(h * h, 0.0);
            }
            let counts = continues && !warming;
            work.push(FaceWork {
                job,
                id,
                track,
                step,
                filtering,
                counts,
            });
        }
        // Bands of at least 16 cell rows, enough of them for every thread.
        let per_face = self.threads.div_ceil(work.len().max(1)).clamp(1, (h / 16).max(1));
        let band_rows = h.div_ceil(per_face);
        let ranges: Vec<Range<usize>> = (0..h).step_by(band_rows).map(|y| y..(y + band_rows).min(h)).collect();
        // The other average first, the used one (which writes the frame's change) last.
        let a_first = !Turns::at(index, self.span).a_used;
        let mut bands = Vec::new();
        for w in work.iter_mut() {
            w.cut(&ranges, (self.cpu, size, self.memory, a_first), &self.face, &mut bands);
        }
        let (partials, cpu) = run_bands(bands, &mut self.scratch, self.pool.as_ref());
        self.helper_cpu += cpu;
        let f = &mut self.flicker;
        for p in &partials {
            if !warming {
                f.kept_abs += p.kept_abs;
                f.model_abs += p.model_abs;
            }
            f.input_sq += p.input_sq;
            f.output_sq += p.output_sq;
            f.raw_sq += p.raw_sq;
            f.cells += p.cells;
        }
        for FaceWork {
            job,
            id,
            mut track,
            counts,
            ..
        } in work
        {
            f.pairs += u64::from(counts);
            std::mem::swap(&mut track.out, &mut track.next_out);
            std::mem::swap(&mut track.raw, &mut track.next_raw);
            std::mem::swap(&mut track.luma, &mut job.luma);
            track.frame = index;
            self.tracks.insert(id, track);
        }
        // Tracks not continued in this frame are over (a track seen now was stamped `index`).
        self.spare
            .extend(self.tracks.extract_if(|_, t| t.frame != index).map(|(_, t)| t));
    }

    /// What a face's averages do at frame `index` (see [`Step`]), and whether its shares are
    /// made; the histories the step writes are sized for a change of `len` values.
    fn plan(&self, index: u64, continues: bool, t: &mut Track, len: usize) -> (Step, bool) {
        let filtering = continues && self.memory > 0.0;
        if self.memory <= 0.0 {
            // Without a memory there is no history to keep.
            return (Step::None, false);
        }
        // Each average: afresh at its restart (or a new track), else now + share *
        // (history - now); the frame takes the one that has run at least `span` frames, and
        // the other one, between its use and its restart, rests.
        let turns = Turns::at(index, self.span);
        let ((other, other_restarts), used) = if turns.a_used {
            ((&mut t.change_b, turns.b_restarts), &mut t.change)
        } else {
            ((&mut t.change, turns.a_restarts), &mut t.change_b)
        };
        let used_afresh = !filtering || used.len() != len;
        used.resize(len, 0);
        if turns.other_rests {
            return (Step::Used(used_afresh), filtering);
        }
        let other_afresh = !filtering || other_restarts || other.len() != len;
        other.resize(len, 0);
        match [other_afresh, used_afresh] {
            [false, false] => (Step::Both, filtering),
            afresh => (Step::Each(afresh), filtering),
        }
    }
}

/// Where frame `index` falls in the averages' cycle of `4 span` frames (see the module's text):
/// average `a` restarts at its start, runs `span` frames, is used for `2 span` and rests for the
/// last `span`; average `b` does the same half a cycle later.
struct Turns {
    /// The frame takes average `a` (else `b`).
    a_used: bool,
    a_restarts: bool,
    b_restarts: bool,
    /// The average the frame does not take is between its use and its restart: it is not run.
    other_rests: bool,
}

impl Turns {
    fn at(index: u64, span: u64) -> Turns {
        let phase = index % (4 * span);
        Turns {
            a_used: (span..3 * span).contains(&phase),
            a_restarts: phase == 0,
            b_restarts: phase == 2 * span,
            other_rests: (span..2 * span).contains(&phase) || phase >= 3 * span,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::bands::*;
    use crate::kernels::CHANGE_STEPS;

    thread_local! {
        /// The threads that ran bands for filters called on this (test's) thread.
        pub(super) static BAND_THREADS: std::cell::RefCell<std::collections::HashSet<std::thread::ThreadId>> =
            Default::default();
    }

    #[test]
    fn the_neighbourhood_maximum_is_the_cell_by_cell_one() {
        for h in [1usize, 2, 5, 16] {
            let v: Vec<f32> = (0..h * h).map(|i| ((i * 7919) % 101) as f32).collect();
            let (mut rows, mut fast) = (Vec::new(), Vec::new());
            max3x3(&v, h, &mut rows, &mut fast);
            for (i, got) in fast.iter().enumerate() {
                let (x, y) = (i % h, i / h);
                let mut d: f32 = 0.0;
                for yy in y.saturating_sub(1)..(y + 2).min(h) {
                    for xx in x.saturating_sub(1)..(x + 2).min(h) {
                        d = d.max(v[yy * h + xx]);
                    }
                }
                assert_eq!(*got, d, "h {h}, cell {i}");
            }
        }
    }

    /// The fused pass gives, to the bit, the luma sums and averages of the three passes.
    #[test]
    fn averages_and_luma_in_one_pass_are_the_three_passes() {
        let (size, rows) = (16usize, 6usize);
        let h = size / 2;
        let field = |k: usize| -> Vec<i16> {
            (0..rows * 2 * size * 3)
                .map(|i| change_steps(((i * 31 + k * 7) % 23) as f32 * 0.61 - 6.0))
                .collect()
        };
        let shares: Vec<f32> = (0..rows * h).map(|i| [0.0, 0.3, 0.8, 0.5][i % 4]).collect();
        let base: Vec<f32> = (0..rows * h).map(|i| i as f32 * 0.25).collect();
        let (mut now, mut a, mut b) = (field(0), field(1), field(2));
        let (mut raw, mut out) = (vec![0.0; rows * h], vec![0.0; rows * h]);
        let (mut now2, mut a2, mut b2) = (now.clone(), a.clone(), b.clone());
        let (mut raw2, mut out2) = (raw.clone(), out.clone());
        half_luma(&now2, size, Some(&base), &mut raw2);
        average_both(&mut now2, &mut a2, &mut b2, &shares, size);
        half_luma(&now2, size, Some(&base), &mut out2);
        average_both_luma(&mut now, [&mut a, &mut b], &shares, size, &base, [&mut raw, &mut out]);
        assert_eq!((&now, &a, &b), (&now2, &a2, &b2));
        assert_eq!((&raw, &out), (&raw2, &out2));
        // The used average alone, the same way.
        let (mut now, mut b) = (field(3), field(4));
        let (mut now2, mut b2) = (now.clone(), b.clone());
        half_luma(&now2, size, Some(&base), &mut raw2);
        average::<true>(&mut now2, &mut b2, &shares, size);
        half_luma(&now2, size, Some(&base), &mut out2);
        average_used_luma(&mut now, &mut b, &shares, size, &base, [&mut raw, &mut out]);
        assert_eq!((now, b), (now2, b2));
        assert_eq!((raw, out), (raw2, out2));
    }

    /// Each average rests from the end of its use to its restart: over a cycle of `4 span`
    /// frames, half the frames leave the average they do not take as it was (one average's
    /// reads and writes a frame, not two), and the frame's change is the average it takes.
    #[test]
    fn the_average_a_frame_does_not_take_rests_for_half_the_cycle() {
        let (size, memory) = (16, 2.0);
        let tpl = crate::faces::align::template(size);
        let mut filter = Temporal::new(memory, size, &tpl, Cpu::detected());
        let s = span(memory);
        let change = |n: u64| move |i: usize| ((n as usize * 7919 + i * 104_729) % 2001) as f32 / 10.0 - 100.0;
        let mut rested = 0;
        for n in 0..3 * 4 * s {
            let before = filter.tracks.get(&1).map(|t| (t.change.clone(), t.change_b.clone()));
            let mut a = [job(1, 100.0, change(n), size)];
            filter.filter(n, &mut a, false);
            let t = &filter.tracks[&1];
            let turns = Turns::at(n, s);
            let (used, other, other_before) = match (turns.a_used, &before) {
                (true, Some((_, b))) => (&t.change, &t.change_b, Some(b)),
                (false, Some((a, _))) => (&t.change_b, &t.change, Some(a)),
                (true, None) => (&t.change, &t.change_b, None),
                (false, None) => (&t.change_b, &t.change, None),
            };
            assert!(
                a[0].restored.as_ref() == Some(used),
                "frame {n}: the change is the used average"
            );
            if n >= 4 * s {
                let unchanged = other_before.is_some_and(|b| b == other);
                assert_eq!(unchanged, turns.other_rests, "frame {n}");
                rested += u64::from(unchanged);
            }
        }
        assert_eq!(rested, 2 * 2 * s, "half of two whole cycles");
    }

    #[test]
    fn half_luma_is_the_pixel_by_pixel_sum() {
        let size = 8;
        let rgb: Vec<i16> = (0..size * size * 3)
            .map(|i| change_steps(((i * 31) % 17) as f32 * 0.37 - 2.0))
            .collect();
        let base: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let mut out = vec![0.0; 16];
        half_luma(&rgb, size, Some(&base), &mut out);
        let h = size / 2;
        for y in 0..h {
            for x in 0..h {
                let mut s = 0.0;
                for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                    let p = &rgb[((2 * y + dy) * size + 2 * x + dx) * 3..][..3];
                    let [r, g, b] = [p[0], p[1], p[2]].map(f32::from);
                    s += 0.299 * r + 0.587 * g + 0.114 * b;
                }
                assert_eq!(out[y * h + x], s / 4.0 / CHANGE_STEPS + base[y * h + x]);
            }
        }
    }
    use crate::frame::Face;
    use crate::kernels::{change_levels, change_steps};

    /// The averages in steps stay within what rounding each step can add up to (half a step
    /// over 1 - share) of the same averages in floats, over many frames of changing detail:
    /// at the largest share here, under 1/25 of a level.
    #[test]
    fn an_average_in_steps_stays_within_its_rounding_of_the_float_average() {
        let size = 16;
        let h = size / 2;
        let shares: Vec<f32> = (0..h * h).map(|i| [0.0, 0.3, 0.8, 0.5, 0.83][i % 5]).collect();
        let n = size * size * 3;
        let mut hi: Vec<i16> = vec![0; n];
        let mut hf: Vec<f32> = vec![0.0; n];
        for frame in 0..300usize {
            let levels: Vec<f32> = (0..n)
                .map(|i| ((frame * 7919 + i * 104_729) % 4001) as f32 / 20.0 - 100.0)
                .collect();
            let mut now: Vec<i16> = levels.iter().map(|&v| change_steps(v)).collect();
            average::<true>(&mut now, &mut hi, &shares, size);
            for (i, (p, &v)) in hf.iter_mut().zip(&levels).enumerate() {
                let share = shares[((i / 3) / size / 2) * h + (i / 3) % size / 2];
                *p = v + share * (*p - v);
            }
            assert_eq!(now, hi, "the frame's change is the used average");
            for (i, (&a, &b)) in hi.iter().zip(&hf).enumerate() {
                let off = (change_levels(a) - b).abs();
                assert!(
                    off <= 0.5 / (1.0 - 0.83) / CHANGE_STEPS + 1e-4,
                    "frame {frame}, value {i}: {off}"
                );
            }
        }
    }

    fn job(track: u64, luma: f32, change: impl Fn(usize) -> f32, size: usize) -> FaceJob {
        let mut j = FaceJob::detected(Face::default());
        j.track = Some(track);
        j.luma = vec![luma; (size / 2) * (size / 2)];
        j.restored = Some((0..size * size * 3).map(|i| change_steps(change(i))).collect());
        j
    }

    /// What a segment's warm-up relies on: a filter that starts `reach` frames before a frame
    /// gives that frame bit for bit what a filter running from the first frame gives, even at the
    /// longest memory on a still face (every history at its full weight), where a single
    /// exponential average would still carry 6 parts in a million of the frames before.
    #[test]
    fn a_filter_started_its_reach_early_matches_one_started_at_the_first_frame() {
        let (size, memory) = (16, crate::defaults::TEMPORAL_MAX);
        let tpl = crate::faces::align::template(size);
        let (mut from_start, mut late) = (
            Temporal::new(memory, size, &tpl, Cpu::detected()),
            Temporal::new(memory, size, &tpl, Cpu::detected()),
        );
        let reach = reach(memory);
        let begin = 3 * reach + 5;
        // Detail that changes every frame (a hash of frame and value), on an input that does not.
        let change = |n: u64| move |i: usize| ((n as usize * 7919 + i * 104_729) % 2001) as f32 / 10.0 - 100.0;
        for n in 0..begin + 2 * reach + 50 {
            let mut a = [job(1, 100.0, change(n), size)];
            from_start.filter(n, &mut a, false);
            if n >= begin {
                let mut b = [job(1, 100.0, change(n), size)];
                late.filter(n, &mut b, n < begin + reach);
                if n >= begin + reach {
                    assert!(a[0].restored == b[0].restored, "frame {n} differs");
                }
            }
        }
    }

    #[test]
    fn detail_the_input_does_not_support_averages_away_and_a_real_change_is_taken_at_once() {
        let size = 16;
        let tpl = crate::faces::align::template(size);
        let mut t = Temporal::new(4.0, size, &tpl, Cpu::detected());
        // Alternating detail on a still input: the filtered change swings far less.
        let mut swings = Vec::new();
        let mut last: Option<f32> = None;
        for n in 0..20u64 {
            let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
            let mut faces = [job(7, 100.0, |_| 10.0 * sign, size)];
            t.filter(n, &mut faces, false);
            let v = change_levels(faces[0].restored.as_ref().unwrap()[0]);
            if let Some(l) = last {
                swings.push((v - l).abs());
            }
            last = Some(v);
        }
        assert!(*swings.last().unwrap() < 20.0 / 3.0, "{swings:?}");
        assert!(t.flicker.output() < t.flicker.unfiltered() / 3.0, "{:?}", t.flicker);
        // The input changes for real: the new change is taken as it is.
        let mut faces = [job(7, 200.0, |_| 30.0, size)];
        t.filter(20, &mut faces, false);
        assert_eq!(change_levels(faces[0].restored.as_ref().unwrap()[0]), 30.0);
        // A new track starts afresh, and zero stays zero.
        let mut faces = [job(8, 200.0, |_| 0.0, size)];
        t.filter(21, &mut faces, false);
        assert!(faces[0].restored.as_ref().unwrap().iter().all(|v| *v == 0));
    }

    /// The filter on several threads (each face cut into bands of rows, the bands of all faces
    /// shared out) gives every frame's changes and the figures of the filter on one thread,
    /// with faces moving (their input luma varies by row, so shares differ across band edges),
    /// tracks ending and starting, and both averages restarting.
    #[test]
    fn bands_on_many_threads_give_what_one_thread_gives() {
        let (size, memory) = (64, 2.0);
        let tpl = crate::faces::align::template(size);
        let mut one = Temporal::new(memory, size, &tpl, Cpu::detected());
        let mut many = Temporal::new(memory, size, &tpl, Cpu::detected()).threads(5);
        let h = size / 2;
        let frame = |n: u64| -> Vec<FaceJob> {
            // Track 1 throughout, track 2 from frame 10, track 3 until frame 30.
            let mut faces = Vec::new();
            for (track, from, to) in [(1u64, 0u64, 80u64), (2, 10, 80), (3, 0, 30)] {
                if (from..to).contains(&n) {
                    let mut j = job(
                        track,
                        0.0,
                        |i| ((n as usize * 31 + i * 7 + track as usize) % 41) as f32 - 20.0,
                        size,
                    );
                    j.luma = (0..h * h)
                        .map(|i| 100.0 + ((i / h + n as usize * track as usize) % 9) as f32 * 6.0)
                        .collect();
                    faces.push(j);
                }
            }
            faces
        };
        for n in 0..80u64 {
            let (mut a, mut b) = (frame(n), frame(n));
            one.filter(n, &mut a, n < 3);
            many.filter(n, &mut b, n < 3);
            for (x, y) in a.iter().zip(&b) {
                assert!(x.restored == y.restored, "frame {n}, track {:?} differs", x.track);
            }
        }
        let (f, g) = (one.flicker, many.flicker);
        assert_eq!((f.pairs, f.cells), (g.pairs, g.cells));
        for (x, y) in [
            (f.output(), g.output()),
            (f.unfiltered(), g.unfiltered()),
            (f.kept(), g.kept()),
        ] {
            assert!((x - y).abs() < 1e-9, "{f:?} vs {g:?}");
        }
        assert!(many.helper_cpu() > std::time::Duration::ZERO);
        // 77 frames shared out, on the run's own five threads: none started for a frame.
        let ran_on = BAND_THREADS.with(|t| t.borrow().len());
        assert!((2..=5).contains(&ran_on), "bands ran on {ran_on} threads");
    }

    #[test]
    fn the_shares_of_a_band_are_those_of_the_whole_neighbourhood_maximum() {
        let h = 20;
        let now: Vec<f32> = (0..h * h).map(|i| ((i * 7919) % 61) as f32).collect();
        let past: Vec<f32> = (0..h * h).map(|i| ((i * 104_729) % 53) as f32).collect();
        let diff: Vec<f32> = now.iter().zip(&past).map(|(a, b)| (a - b).abs()).collect();
        let (mut rows, mut max) = (Vec::new(), Vec::new());
        max3x3(&diff, h, &mut rows, &mut max);
        let mut scratch = Vec::new();
        for band in [0..h, 0..1, 3..9, 19..20] {
            let mut out = vec![0.0; band.len() * h];
            shares(&now, &past, h, band.clone(), 4.0, &mut out, &mut scratch);
            for (i, got) in out.iter().enumerate() {
                let w = max[band.start * h + i];
                let g = ((CHANGED - w) / (CHANGED - ALIKE)).clamp(0.0, 1.0);
                let w1 = 4.0 * g * g * (3.0 - 2.0 * g);
                assert_eq!(*got, w1 / (1.0 + w1), "band {band:?}, cell {i}");
            }
        }
    }
}
