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
//! new track (a cut, a new or lost face) starts afresh.
//!
//! The average forgets for good: two averages run side by side, each started afresh every
//! `2 span` frames at fixed frame indices, half a cycle apart, and a frame takes the one that
//! has run at least `span` frames (far longer than the memory, so the switch is not seen: the
//! history it drops weighs under 0.2 %). A frame's output thus depends on at most `2 span`
//! frames before it, and a segment that starts that many frames earlier (its warm-up) rebuilds
//! exactly what a run from the first frame has.

use std::collections::HashMap;

use crate::frame::FaceJob;

/// Input luma difference (levels, half-resolution crop) up to which a pixel's history keeps its
/// full weight (sensor noise stays below it), and from which it has none (a real change).
const ALIKE: f32 = 10.0;
const CHANGED: f32 = 30.0;

/// The flicker figures of a run: inside faces, in crop space, frame to frame along each track
/// (so neither camera nor face motion counts).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Flicker {
    /// Whether the filter ran (a memory above 0), or only measured.
    pub filtered: bool,
    /// Pairs of consecutive crops of one track, and the face pixels summed over them.
    pub pairs: u64,
    cells: u64,
    /// Sums of squared frame-to-frame changes: of the input, of the output, and of what the
    /// output would be without the filter.
    input_sq: f64,
    output_sq: f64,
    raw_sq: f64,
    /// Sums of the absolute change pasted after the filter and given by the model.
    kept_abs: f64,
    model_abs: f64,
}

impl Flicker {
    fn rms(&self, sq: f64) -> f64 {
        (sq / self.cells.max(1) as f64).sqrt()
    }

    /// Frame-to-frame RMS change of the input inside faces, in levels.
    pub(crate) fn input_rms(&self) -> f64 {
        self.rms(self.input_sq)
    }

    /// The restoration's flicker: the output's frame-to-frame RMS change inside faces minus the
    /// input's, in levels.
    pub fn output(&self) -> f64 {
        self.rms(self.output_sq) - self.input_rms()
    }

    /// The flicker the model's change would have had without the filter.
    pub fn unfiltered(&self) -> f64 {
        self.rms(self.raw_sq) - self.input_rms()
    }

    /// Share of the model's change (mean absolute value of its luma) the filter kept.
    pub fn kept(&self) -> f64 {
        if self.model_abs > 0.0 {
            self.kept_abs / self.model_abs
        } else {
            1.0
        }
    }
}

/// Frames each of the two averages runs before it is used (see the module's text): six times
/// the memory's time constant, whose weight then is `(m / (1 + m))^span` (0.12 % at 4).
pub(crate) fn span(memory: f32) -> u64 {
    (6.0 * (memory.max(0.0) + 1.0)).ceil() as u64
}

/// Frames before a frame that its filtered change can depend on: a segment's warm-up needs
/// this many (0 when the filter does not run).
pub fn reach(memory: f32) -> u64 {
    if memory > 0.0 {
        2 * span(memory)
    } else {
        0
    }
}

/// One track's state: the previous frame's input luma, the two averages of the change, and
/// the luma of its output with and without the filter (for the figures).
struct Track {
    frame: u64,
    luma: Vec<f32>,
    /// The averages restarted at multiples of `2 span` (`change`) and half a cycle later
    /// (`change_b`).
    change: Vec<f32>,
    change_b: Vec<f32>,
    out: Vec<f32>,
    raw: Vec<f32>,
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
    /// This frame's output luma with and without the filter, and the history weights.
    out_now: Vec<f32>,
    raw_now: Vec<f32>,
    weights: Vec<f32>,
    /// The row maxima of the difference (see [`max3x3`]).
    rows: Vec<f32>,
    pub flicker: Flicker,
}

/// Mean luma (levels) of each 2x2 block of packed RGB `rgb` (`size` square), offset by `base`
/// (a luma plane of the same half size) when given.
fn half_luma(rgb: &[f32], size: usize, base: Option<&[f32]>, out: &mut Vec<f32>) {
    let h = size / 2;
    out.clear();
    out.resize(h * h, 0.0);
    let luma = |p: &[f32]| 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2];
    // Two rows of the crop make one row of cells, two pixels (six values) of each a cell; the
    // sum in the same order as pixel by pixel, so the values are the same to the bit.
    for (y, o) in out.chunks_exact_mut(h).enumerate() {
        let (top, bottom) = (
            &rgb[2 * y * size * 3..][..size * 3],
            &rgb[(2 * y + 1) * size * 3..][..size * 3],
        );
        for ((o, a), b) in o.iter_mut().zip(top.chunks_exact(6)).zip(bottom.chunks_exact(6)) {
            let mut s = 0.0;
            s += luma(&a[..3]);
            s += luma(&a[3..]);
            s += luma(&b[..3]);
            s += luma(&b[3..]);
            *o = s / 4.0;
        }
        if let Some(base) = base {
            for (o, b) in o.iter_mut().zip(&base[y * h..][..h]) {
                *o += b;
            }
        }
    }
}

/// The largest of each cell's value and its eight neighbours' (`h` square, clipped at the
/// border), in two passes: along the rows, then down the columns.
fn max3x3(v: &[f32], h: usize, rows: &mut Vec<f32>, out: &mut Vec<f32>) {
    rows.clear();
    rows.resize(h * h, 0.0);
    for (r, o) in v.chunks_exact(h).zip(rows.chunks_exact_mut(h)) {
        for x in 0..h {
            o[x] = r[x.saturating_sub(1)].max(r[x]).max(r[(x + 1).min(h - 1)]);
        }
    }
    out.clear();
    out.resize(h * h, 0.0);
    for y in 0..h {
        let (up, here, down) = (y.saturating_sub(1), y, (y + 1).min(h - 1));
        let o = &mut out[y * h..][..h];
        let (a, b, c) = (&rows[up * h..][..h], &rows[here * h..][..h], &rows[down * h..][..h]);
        for (((o, a), b), c) in o.iter_mut().zip(a).zip(b).zip(c) {
            *o = a.max(*b).max(*c);
        }
    }
}

/// One average's step over a crop of `size` (packed RGB, half-resolution `shares`): history =
/// now + share * (history - now), two pixels (six values) a cell per row; with `WRITE` the
/// result is also the frame's change (`now`).
fn average<const WRITE: bool>(now: &mut [f32], history: &mut [f32], shares: &[f32], size: usize) {
    let h = size / 2;
    for y in 0..size {
        let srow = &shares[(y / 2) * h..][..h];
        let row = y * size * 3..(y + 1) * size * 3;
        let (now, past) = (&mut now[row.clone()], &mut history[row]);
        for ((n6, p6), &share) in now.chunks_exact_mut(6).zip(past.chunks_exact_mut(6)).zip(srow) {
            if share > 0.0 {
                for (n, p) in n6.iter_mut().zip(p6) {
                    *p = *n + share * (*p - *n);
                    if WRITE {
                        *n = *p;
                    }
                }
            } else {
                p6.copy_from_slice(n6);
            }
        }
    }
}

/// Both averages' steps in one pass over the crop (what [`average`] does to `other`, then to
/// `used` writing the frame's change): the model's change is read and written once.
fn average_both(now: &mut [f32], other: &mut [f32], used: &mut [f32], shares: &[f32], size: usize) {
    let h = size / 2;
    for y in 0..size {
        let srow = &shares[(y / 2) * h..][..h];
        let row = y * size * 3..(y + 1) * size * 3;
        let (now, a, b) = (&mut now[row.clone()], &mut other[row.clone()], &mut used[row]);
        let cells = now
            .chunks_exact_mut(6)
            .zip(a.chunks_exact_mut(6))
            .zip(b.chunks_exact_mut(6));
        for (((n6, a6), b6), &share) in cells.zip(srow) {
            if share > 0.0 {
                for ((n, a), b) in n6.iter_mut().zip(a6).zip(b6) {
                    *a = *n + share * (*a - *n);
                    *b = *n + share * (*b - *n);
                    *n = *b;
                }
            } else {
                a6.copy_from_slice(n6);
                b6.copy_from_slice(n6);
            }
        }
    }
}

impl Temporal {
    /// A filter of `memory` frames for crops of `size` aligned to `template` (crop pixels).
    pub fn new(memory: f32, size: usize, template: &[[f32; 2]; 5]) -> Self {
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
            out_now: Vec::new(),
            raw_now: Vec::new(),
            weights: Vec::new(),
            rows: Vec::new(),
            flicker: Flicker {
                filtered: memory > 0.0,
                ..Flicker::default()
            },
        }
    }

    /// Filters the changes of frame `index`'s faces in place. Faces without a track, a
    /// change or an input luma pass unchanged; tracks not seen in this frame end. A frame
    /// that is only `warming` (a segment's warm-up, not written) builds the state but does not
    /// count in the figures.
    pub fn filter(&mut self, index: u64, faces: &mut [FaceJob], warming: bool) {
        let (size, h) = (self.size, self.size / 2);
        let w_max = self.memory;
        for job in faces.iter_mut() {
            let (Some(id), Some(change)) = (job.track, job.restored.as_mut()) else {
                continue;
            };
            if job.luma.len() != h * h || change.len() != size * size * 3 {
                continue;
            }
            let prev = self.tracks.remove(&id).filter(|t| t.frame + 1 == index);
            let mut t = prev.unwrap_or_else(|| {
                self.spare.pop().unwrap_or(Track {
                    frame: 0,
                    luma: Vec::new(),
                    change: Vec::new(),
                    change_b: Vec::new(),
                    out: Vec::new(),
                    raw: Vec::new(),
                })
            });
            let continues = t.frame + 1 == index && t.luma.len() == h * h;
            // The output's luma without the filter, for the figures.
            half_luma(change, size, Some(&job.luma), &mut self.raw_now);
            if continues && w_max > 0.0 {
                // Each cell's history weight from how alike its input is to a frame ago: the
                // largest difference over the cell and its eight neighbours, so the edge of a
                // changed region (where the paste's resampling reaches) is not half-kept.
                let diff = &mut self.out_now;
                diff.clear();
                diff.extend(job.luma.iter().zip(&t.luma).map(|(a, b)| (a - b).abs()));
                let weights = &mut self.weights;
                max3x3(diff, h, &mut self.rows, weights);
                // Per cell, the history's weight from the difference, then its share:
                // w / (1 + w).
                for w in weights.iter_mut() {
                    let g = ((CHANGED - *w) / (CHANGED - ALIKE)).clamp(0.0, 1.0);
                    let w1 = w_max * g * g * (3.0 - 2.0 * g);
                    *w = w1 / (1.0 + w1);
                }
            }
            // Each average: afresh at its restart (or a new track), else now + share *
            // (history - now); the frame takes the one that has run at least `span` frames.
            // That one is updated last and writes the frame's change in the same pass (the other
            // has read the model's change by then): no separate copy of the crop.
            let phase = index % (2 * self.span);
            let filtering = continues && w_max > 0.0;
            let (a, b) = (&mut t.change, &mut t.change_b);
            let (other, used) = if phase < self.span {
                ((a, phase == 0), (b, phase == self.span))
            } else {
                ((b, phase == self.span), (a, phase == 0))
            };
            // Without a memory there is no history to keep.
            let averages = if w_max > 0.0 { 2 } else { 0 };
            // Both averages go on (neither restarts): one pass.
            let len = change.len();
            let goes_on = |h: &Vec<f32>, restart: bool| !restart && h.len() == len;
            let fused = filtering && goes_on(other.0, other.1) && goes_on(used.0, used.1);
            if fused {
                average_both(change, other.0, used.0, &self.weights, size);
            }
            for (k, (history, restart)) in [other, used].into_iter().enumerate().take(averages) {
                if fused {
                    break;
                }
                if !filtering || restart || history.len() != change.len() {
                    history.clear();
                    history.extend_from_slice(change);
                } else if k == 0 {
                    average::<false>(change, history, &self.weights, size);
                } else {
                    average::<true>(change, history, &self.weights, size);
                }
            }
            half_luma(change, size, Some(&job.luma), &mut self.out_now);
            let (out_now, raw_now, prev_out, raw) = (&self.out_now, &self.raw_now, &t.out, &t.raw);
            // The model's change and what is kept of it, in luma at half resolution.
            let (mut kept_abs, mut model_abs) = (0.0f64, 0.0f64);
            for ((o, r), l) in out_now.iter().zip(raw_now).zip(&job.luma) {
                kept_abs += (o - l).abs() as f64;
                model_abs += (r - l).abs() as f64;
            }
            if continues && !warming {
                let f = &mut self.flicker;
                f.pairs += 1;
                for (i, inside) in self.face.iter().enumerate() {
                    if *inside {
                        let d_in = (job.luma[i] - t.luma[i]) as f64;
                        let d_out = (out_now[i] - prev_out[i]) as f64;
                        let d_raw = (raw_now[i] - raw[i]) as f64;
                        f.input_sq += d_in * d_in;
                        f.output_sq += d_out * d_out;
                        f.raw_sq += d_raw * d_raw;
                        f.cells += 1;
                    }
                }
            }
            if !warming {
                self.flicker.kept_abs += kept_abs;
                self.flicker.model_abs += model_abs;
            }
            std::mem::swap(&mut t.out, &mut self.out_now);
            std::mem::swap(&mut t.raw, &mut self.raw_now);
            std::mem::swap(&mut t.luma, &mut job.luma);
            t.frame = index;
            self.tracks.insert(id, t);
        }
        // Tracks not continued in this frame are over (a track seen now was stamped `index`).
        self.spare
            .extend(self.tracks.extract_if(|_, t| t.frame != index).map(|(_, t)| t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn half_luma_is_the_pixel_by_pixel_sum() {
        let size = 8;
        let rgb: Vec<f32> = (0..size * size * 3)
            .map(|i| ((i * 31) % 17) as f32 * 0.37 - 2.0)
            .collect();
        let base: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let mut out = Vec::new();
        half_luma(&rgb, size, Some(&base), &mut out);
        let h = size / 2;
        for y in 0..h {
            for x in 0..h {
                let mut s = 0.0;
                for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                    let p = &rgb[((2 * y + dy) * size + 2 * x + dx) * 3..][..3];
                    s += 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2];
                }
                assert_eq!(out[y * h + x], s / 4.0 + base[y * h + x]);
            }
        }
    }
    use crate::frame::Face;

    fn job(track: u64, luma: f32, change: impl Fn(usize) -> f32, size: usize) -> FaceJob {
        let mut j = FaceJob::detected(Face::default());
        j.track = Some(track);
        j.luma = vec![luma; (size / 2) * (size / 2)];
        j.restored = Some((0..size * size * 3).map(change).collect());
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
        let (mut from_start, mut late) = (Temporal::new(memory, size, &tpl), Temporal::new(memory, size, &tpl));
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
        let mut t = Temporal::new(4.0, size, &tpl);
        // Alternating detail on a still input: the filtered change swings far less.
        let mut swings = Vec::new();
        let mut last: Option<f32> = None;
        for n in 0..20u64 {
            let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
            let mut faces = [job(7, 100.0, |_| 10.0 * sign, size)];
            t.filter(n, &mut faces, false);
            let v = faces[0].restored.as_ref().unwrap()[0];
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
        assert_eq!(faces[0].restored.as_ref().unwrap()[0], 30.0);
        // A new track starts afresh, and zero stays zero.
        let mut faces = [job(8, 200.0, |_| 0.0, size)];
        t.filter(21, &mut faces, false);
        assert!(faces[0].restored.as_ref().unwrap().iter().all(|v| *v == 0.0));
    }
}
