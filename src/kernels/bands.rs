//! The temporal filter's bands: in, rows of one face's change in steps (now and its two
//! histories), the input's half-size luma now and a frame ago; out, the change averaged over
//! time where the input is alike (the shares), the output's luma with and without the filter,
//! and a band's sums for the figures. A band runs its plain body or its AVX2 form by [`Cpu`].

use std::ops::Range;

use crate::kernels::{round_steps_within, Cpu, CHANGE_STEPS};

/// Input luma difference (levels, half-resolution crop) up to which a pixel's history keeps its
/// full weight (sensor noise stays below it), and from which it has none (a real change).
pub(crate) const ALIKE: f32 = 10.0;
pub(crate) const CHANGED: f32 = 30.0;
/// Mean luma (levels) of each 2x2 block of rows of packed RGB `rgb` in steps (`size` wide, see
/// [`CHANGE_STEPS`]), offset by `base` (the same cells of a luma plane of half the size) when
/// given, into `out` (as many rows of `size / 2` cells as it holds).
#[inline(always)]
pub(crate) fn half_luma(rgb: &[i16], size: usize, base: Option<&[f32]>, out: &mut [f32]) {
    let h = size / 2;
    // Two rows of the crop make one row of cells, two pixels of each a cell: the pixels' luma
    // a run of 64 at a time (loops the compiler turns into vector code), then each cell's sum
    // in the same order as pixel by pixel, so the values are the same to the bit.
    const RUN: usize = 64;
    let (mut lt, mut lb) = ([0.0f32; RUN], [0.0f32; RUN]);
    for (y, o) in out.chunks_exact_mut(h).enumerate() {
        let (top, bottom) = (
            &rgb[2 * y * size * 3..][..size * 3],
            &rgb[(2 * y + 1) * size * 3..][..size * 3],
        );
        let runs = top.chunks(RUN * 3).zip(bottom.chunks(RUN * 3));
        for ((t, b), o) in runs.zip(o.chunks_mut(RUN / 2)) {
            luma_run(t, &mut lt);
            luma_run(b, &mut lb);
            for ((o, a), b) in o.iter_mut().zip(lt.chunks_exact(2)).zip(lb.chunks_exact(2)) {
                *o = (((a[0] + a[1]) + b[0]) + b[1]) * (0.25 / CHANGE_STEPS);
            }
        }
        if let Some(base) = base {
            for (o, b) in o.iter_mut().zip(&base[y * h..][..h]) {
                *o += b;
            }
        }
    }
}

/// The luma (in steps) of each pixel of a run of packed RGB in steps, into `out`'s first ones.
#[inline(always)]
pub(crate) fn luma_run(rgb: &[i16], out: &mut [f32]) {
    for (o, p) in out.iter_mut().zip(rgb.chunks_exact(3)) {
        let [r, g, b] = [p[0], p[1], p[2]].map(f32::from);
        *o = 0.299 * r + 0.587 * g + 0.114 * b;
    }
}

/// The largest of each cell's value and its eight neighbours' (`h` square, clipped at the
/// border), in two passes: along the rows, then down the columns.
#[cfg(test)]
pub(crate) fn max3x3(v: &[f32], h: usize, rows: &mut Vec<f32>, out: &mut Vec<f32>) {
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

/// One average's step over rows of a crop `size` wide (packed RGB in steps, half-resolution
/// `shares` for those rows' cells): history = now + share * (history - now), rounded to the
/// step, two pixels (six values) a cell per row; with `WRITE` the result is also the frame's
/// change (`now`). A share of 0 gives `now` itself.
#[inline(always)]
pub(crate) fn average<const WRITE: bool>(now: &mut [i16], history: &mut [i16], shares: &[f32], size: usize) {
    let h = size / 2;
    let mut s48 = [0.0f32; 48];
    for (y, (now, past)) in now
        .chunks_exact_mut(size * 3)
        .zip(history.chunks_exact_mut(size * 3))
        .enumerate()
    {
        let srow = &shares[(y / 2) * h..][..h];
        // Eight cells (48 values) at a time, each value with its cell's share: a loop the
        // compiler turns into vector code.
        for ((n48, p48), s8) in now.chunks_mut(48).zip(past.chunks_mut(48)).zip(srow.chunks(8)) {
            spread(s8, &mut s48);
            for ((n, p), &share) in n48.iter_mut().zip(p48.iter_mut()).zip(&s48) {
                *p = step(*n, *p, share);
                if WRITE {
                    *n = *p;
                }
            }
        }
    }
}

/// Each of up to eight cells' shares six times (a cell's two pixels' three values) into `out`.
#[inline(always)]
pub(crate) fn spread(shares: &[f32], out: &mut [f32; 48]) {
    for (o, &s) in out.chunks_exact_mut(6).zip(shares) {
        o.fill(s);
    }
}

/// One value of an average's step: `now + share * (history - now)`, in steps, rounded.
#[inline(always)]
pub(crate) fn step(now: i16, history: i16, share: f32) -> i16 {
    let n = f32::from(now);
    round_steps_within(n + share * (f32::from(history) - n))
}

/// Both averages' steps in one pass over the rows (what [`average`] does to `other`, then to
/// `used` writing the frame's change): the model's change is read and written once. What
/// [`average_both_luma`] does between its luma sums.
#[inline(always)]
pub(crate) fn average_both(now: &mut [i16], other: &mut [i16], used: &mut [i16], shares: &[f32], size: usize) {
    let h = size / 2;
    let mut s48 = [0.0f32; 48];
    let rows = now
        .chunks_exact_mut(size * 3)
        .zip(other.chunks_exact_mut(size * 3))
        .zip(used.chunks_exact_mut(size * 3));
    for (y, ((now, a), b)) in rows.enumerate() {
        let srow = &shares[(y / 2) * h..][..h];
        let cells = now.chunks_mut(48).zip(a.chunks_mut(48)).zip(b.chunks_mut(48));
        for (((n48, a48), b48), s8) in cells.zip(srow.chunks(8)) {
            spread(s8, &mut s48);
            for (((n, a), b), &share) in n48.iter_mut().zip(a48.iter_mut()).zip(b48.iter_mut()).zip(&s48) {
                *a = step(*n, *a, share);
                *b = step(*n, *b, share);
                *n = *b;
            }
        }
    }
}

/// [`half_luma`] of `now` into `raw`, [`average_both`]'s step, then [`half_luma`] of the
/// result into `out`, a pair of rows at a time (the rows stay in the cache between the three,
/// where whole passes read the change three times from memory; the same operations in the same
/// order, so the same values).
#[inline(always)]
pub(crate) fn average_both_luma(
    now: &mut [i16],
    [other, used]: [&mut [i16]; 2],
    shares: &[f32],
    size: usize,
    base: &[f32],
    [raw, out]: [&mut [f32]; 2],
) {
    let h = size / 2;
    let pairs = now
        .chunks_exact_mut(size * 6)
        .zip(other.chunks_exact_mut(size * 6))
        .zip(used.chunks_exact_mut(size * 6))
        .zip(raw.chunks_exact_mut(h).zip(out.chunks_exact_mut(h)))
        .zip(shares.chunks_exact(h).zip(base.chunks_exact(h)));
    for ((((now, a), b), (raw, out)), (srow, brow)) in pairs {
        half_luma(now, size, Some(brow), raw);
        average_both(now, a, b, srow, size);
        half_luma(now, size, Some(brow), out);
    }
}

/// [`half_luma`] of `now` into `raw`, [`average`]'s step of the used average writing the
/// frame's change, then [`half_luma`] of the result into `out`, a pair of rows at a time (as
/// [`average_both_luma`], for a frame whose other average rests). Written out as that one is:
/// the two as one loop calling a closure per pair of rows ran the bands 1.2 times slower (the
/// closure's body compiled without the AVX2 form's features).
#[inline(always)]
pub(crate) fn average_used_luma(
    now: &mut [i16],
    used: &mut [i16],
    shares: &[f32],
    size: usize,
    base: &[f32],
    [raw, out]: [&mut [f32]; 2],
) {
    let h = size / 2;
    let pairs = now
        .chunks_exact_mut(size * 6)
        .zip(used.chunks_exact_mut(size * 6))
        .zip(raw.chunks_exact_mut(h).zip(out.chunks_exact_mut(h)))
        .zip(shares.chunks_exact(h).zip(base.chunks_exact(h)));
    for (((now, b), (raw, out)), (srow, brow)) in pairs {
        half_luma(now, size, Some(brow), raw);
        average::<true>(now, b, srow, size);
        half_luma(now, size, Some(brow), out);
    }
}

/// The history shares of cell rows `rows` (`h` cells square): each cell's history weight from
/// how alike its input is now and a frame ago (the largest difference over the cell and its
/// eight neighbours, so the edge of a changed region, where the paste's resampling reaches, is
/// not half-kept), then its share w / (1 + w). `scratch` holds the row maxima of the rows around
/// (the same maxima as [`max3x3`], so the same shares).
#[inline(always)]
pub(crate) fn shares(
    now: &[f32],
    past: &[f32],
    h: usize,
    rows: Range<usize>,
    w_max: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let (lo, hi) = (rows.start.saturating_sub(1), (rows.end + 1).min(h));
    scratch.clear();
    scratch.resize((hi - lo + 1) * h, 0.0);
    let (maxima, d) = scratch.split_at_mut((hi - lo) * h);
    for (y, o) in (lo..hi).zip(maxima.chunks_exact_mut(h)) {
        for ((d, a), b) in d.iter_mut().zip(&now[y * h..][..h]).zip(&past[y * h..][..h]) {
            *d = (a - b).abs();
        }
        for x in 0..h {
            o[x] = d[x.saturating_sub(1)].max(d[x]).max(d[(x + 1).min(h - 1)]);
        }
    }
    let scratch = &scratch[..];
    for (y, o) in rows.clone().zip(out.chunks_exact_mut(h)) {
        let (up, here, down) = (y.saturating_sub(1), y, (y + 1).min(h - 1));
        let row = |r: usize| &scratch[(r - lo) * h..][..h];
        for (((o, a), b), c) in o.iter_mut().zip(row(up)).zip(row(here)).zip(row(down)) {
            let w = a.max(*b).max(*c);
            let g = ((CHANGED - w) / (CHANGED - ALIKE)).clamp(0.0, 1.0);
            let w1 = w_max * g * g * (3.0 - 2.0 * g);
            *o = w1 / (1.0 + w1);
        }
    }
}

/// What a face's averages do this frame (decided per face, done band by band).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Step {
    /// No memory: no history is kept.
    None,
    /// Both averages go on (neither restarts): one pass.
    Both,
    /// Each average (the other, then the used one) afresh (a copy of the change) or going on.
    Each([bool; 2]),
    /// The used average alone, afresh or going on (one pass); the other one rests.
    Used(bool),
}

/// Sums of one band's cells for the figures.
#[derive(Default)]
pub(crate) struct Partial {
    pub(crate) kept_abs: f64,
    pub(crate) model_abs: f64,
    pub(crate) input_sq: f64,
    pub(crate) output_sq: f64,
    pub(crate) raw_sq: f64,
    pub(crate) cells: u64,
}

/// One band of cell rows of one face: its part of every buffer (the luma planes whole, as
/// the shares read a row on either side), and what to do.
pub(crate) struct Band<'a> {
    /// The CPU level its kernels run at.
    pub(crate) cpu: Cpu,
    pub(crate) rows: Range<usize>,
    pub(crate) size: usize,
    pub(crate) step: Step,
    /// The shares are made (the track goes on and there is a memory).
    pub(crate) filtering: bool,
    /// The band counts in the frame-to-frame figures.
    pub(crate) counts: bool,
    pub(crate) w_max: f32,
    pub(crate) now: &'a mut [i16],
    pub(crate) histories: [&'a mut [i16]; 2],
    pub(crate) luma: &'a [f32],
    pub(crate) past: &'a [f32],
    pub(crate) shares: &'a mut [f32],
    pub(crate) raw: &'a mut [f32],
    pub(crate) out: &'a mut [f32],
    pub(crate) prev_raw: &'a [f32],
    pub(crate) prev_out: &'a [f32],
    pub(crate) inside: &'a [bool],
}

impl Band<'_> {
    /// Filters the band's rows of the change and sums its figures: the output's luma without
    /// the filter, the shares, the averages, the output's luma with it.
    pub(crate) fn run(self, scratch: &mut Vec<f32>) -> Partial {
        #[cfg(target_arch = "x86_64")]
        if self.cpu.avx2() {
            // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
            return unsafe { self.run_avx2(scratch) };
        }
        self.run_body(scratch)
    }

    /// [`Band::run_body`] compiled for AVX2 (wider vectors for the conversions and the
    /// three-channel rows; the same operations on each value, so the same values).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(self, scratch: &mut Vec<f32>) -> Partial {
        self.run_body(scratch)
    }

    /// The body of [`Band::run`].
    #[inline(always)]
    fn run_body(self, scratch: &mut Vec<f32>) -> Partial {
        let (size, h) = (self.size, self.size / 2);
        let cells = self.rows.start * h..self.rows.end * h;
        let luma = &self.luma[cells.clone()];
        if self.filtering {
            shares(
                self.luma,
                self.past,
                h,
                self.rows.clone(),
                self.w_max,
                self.shares,
                scratch,
            );
        }
        let [other, used] = self.histories;
        match self.step {
            Step::None => {
                half_luma(self.now, size, Some(luma), self.raw);
                self.out.copy_from_slice(self.raw);
            }
            Step::Both => average_both_luma(
                self.now,
                [other, used],
                self.shares,
                size,
                luma,
                [&mut *self.raw, &mut *self.out],
            ),
            Step::Used(false) => average_used_luma(
                self.now,
                used,
                self.shares,
                size,
                luma,
                [&mut *self.raw, &mut *self.out],
            ),
            Step::Used(true) => {
                half_luma(self.now, size, Some(luma), self.raw);
                used.copy_from_slice(self.now);
                self.out.copy_from_slice(self.raw);
            }
            Step::Each(afresh) => {
                half_luma(self.now, size, Some(luma), self.raw);
                for (k, history) in [other, used].into_iter().enumerate() {
                    if afresh[k] {
                        history.copy_from_slice(self.now);
                    } else if k == 0 {
                        average::<false>(self.now, history, self.shares, size);
                    } else {
                        average::<true>(self.now, history, self.shares, size);
                    }
                }
                half_luma(self.now, size, Some(luma), self.out);
            }
        }
        let mut p = Partial::default();
        for ((o, r), l) in self.out.iter().zip(self.raw.iter()).zip(luma) {
            p.kept_abs += (o - l).abs() as f64;
            p.model_abs += (r - l).abs() as f64;
        }
        if self.counts {
            let past = &self.past[cells];
            for (i, inside) in self.inside.iter().enumerate() {
                if *inside {
                    let d_in = (luma[i] - past[i]) as f64;
                    let d_out = (self.out[i] - self.prev_out[i]) as f64;
                    let d_raw = (self.raw[i] - self.prev_raw[i]) as f64;
                    p.input_sq += d_in * d_in;
                    p.output_sq += d_out * d_out;
                    p.raw_sq += d_raw * d_raw;
                    p.cells += 1;
                }
            }
        }
        p
    }
}
