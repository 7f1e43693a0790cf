//! The colour fix's kernel: in, a crop's change (packed RGB in steps, `size` square); out, the
//! same change without its low band, so what is pasted keeps the original's colour and
//! brightness at the scale of a face's regions and takes the restorer's detail.
//!
//! The low band is the approximation band of a Haar wavelet pyramid three levels below a crop of
//! 64 (the mean of each of 8 x 8 cells, whatever the crop's size: 64 pixels in a 512 crop, 32 in
//! a 256 one, about a quarter of the face's width), read back between the cells' centres
//! bilinearly (extended linearly past the outer centres) rather than cell by cell, so it has no
//! block edges. A change that is the same everywhere (a colour cast) or a linear
//! ramp of one is its own low band, and goes entirely; detail finer than a cell stays.

use super::steps::round_steps;

/// Cells per side of the low band.
pub(crate) const CELLS: usize = 8;

/// Cells per side of the low band for a crop of `size`: [`CELLS`], fewer in a crop too small to
/// hold two pixels a cell.
pub(crate) fn cells(size: usize) -> usize {
    CELLS.min(size / 2).max(2)
}

/// Buffers reused between faces, and the CPU level the fix runs at.
pub struct LowBand {
    cpu: super::Cpu,
    /// The sums of each column of the crop over one band of cell rows (RGB), `size * 3`: of a
    /// change in steps, and of a change's level in floats.
    columns: Vec<i32>,
    columns_f: Vec<f32>,
    /// Each cell's mean (RGB), `cells * cells * 3`.
    grid: Vec<f32>,
    /// Each row of cells read across the crop's width (RGB), `cells * size * 3`.
    rows: Vec<f32>,
}

impl LowBand {
    /// Buffers for fixes run at `cpu` (the run's level: see `crate::kernels::cpu`).
    pub fn at(cpu: super::Cpu) -> LowBand {
        LowBand {
            cpu,
            columns: Vec::new(),
            columns_f: Vec::new(),
            grid: Vec::new(),
            rows: Vec::new(),
        }
    }
}

/// A change's value as the colour fix reads it: in steps (the crop the model gave back), or in
/// floats (one of its levels, which the paste samples a small face from).
pub(crate) trait Band: Copy {
    /// What a band of cell rows is summed in.
    type Sum: Copy + Default + std::ops::AddAssign + Into<f64>;
    fn widen(self) -> Self::Sum;
    /// The value less `low`.
    fn less(self, low: f32) -> Self;
    /// The column sums' buffer of this kind.
    fn columns(s: &mut LowBand) -> &mut Vec<Self::Sum>;
}

impl Band for i16 {
    // A cell row of a crop up to 2^16 rows tall fits an i32 at 2^15 a value.
    type Sum = i32;
    #[inline(always)]
    fn widen(self) -> i32 {
        i32::from(self)
    }
    #[inline(always)]
    fn less(self, low: f32) -> i16 {
        round_steps(f32::from(self) - low)
    }
    fn columns(s: &mut LowBand) -> &mut Vec<i32> {
        &mut s.columns
    }
}

impl Band for f32 {
    type Sum = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn less(self, low: f32) -> f32 {
        self - low
    }
    fn columns(s: &mut LowBand) -> &mut Vec<f32> {
        &mut s.columns_f
    }
}

/// Where pixel `i` of `size` falls between the centres of `n` cells: the lower cell (so that
/// the pair `(c, c + 1)` exists) and its weight towards the upper one, beyond [0, 1] outside the
/// outer centres (linear extension).
fn between(i: usize, size: usize, n: usize) -> (usize, f32) {
    let g = (i as f32 + 0.5) * n as f32 / size as f32 - 0.5;
    let c = (g.floor().max(0.0) as usize).min(n - 2);
    (c, g - c as f32)
}

/// Removes the low band from `change` (packed RGB of `size * size`, in steps).
pub fn remove_low_band(change: &mut [i16], size: usize, s: &mut LowBand) {
    remove_low_band_of(change, size, cells(size), s);
}

/// Removes the low band of a crop of `crop` pixels from `level`, one of its change's levels
/// (packed RGB of `size * size` floats: 2x2 box averages of the crop's change, halved and
/// halved again). The cells are the crop's, so this is the level of the change without its
/// low band: each cell's mean over the level is its mean over the crop, and the bilinear low
/// band at a level pixel's centre is its mean over the crop pixels that pixel averages (where
/// they lie between the same cell centres).
pub(crate) fn remove_low_band_from_level(level: &mut [f32], size: usize, crop: usize, s: &mut LowBand) {
    remove_low_band_of(level, size, cells(crop).min(size), s);
}

/// Removes the low band of `n` cells a side from `change` (packed RGB of `size * size`),
/// compiled for AVX2 where the buffers' level has it.
fn remove_low_band_of<T: Band>(change: &mut [T], size: usize, n: usize, s: &mut LowBand) {
    #[cfg(target_arch = "x86_64")]
    if s.cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { remove_low_band_avx2(change, size, n, s) };
    }
    low_band_body(change, size, n, s);
}

/// [`low_band_body`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn remove_low_band_avx2<T: Band>(change: &mut [T], size: usize, n: usize, s: &mut LowBand) {
    low_band_body(change, size, n, s);
}

/// The body of [`remove_low_band_of`].
#[inline(always)]
fn low_band_body<T: Band>(change: &mut [T], size: usize, n: usize, s: &mut LowBand) {
    if size < 2 || n < 2 || change.len() < 3 * size * size {
        return;
    }
    let width = 3 * size;
    let bounds: Vec<usize> = (0..=n).map(|k| k * size / n).collect();
    s.grid.clear();
    s.grid.resize(n * n * 3, 0.0);
    let mut columns = std::mem::take(T::columns(s));
    columns.resize(width, T::Sum::default());
    // Each cell's mean: the columns summed over a band of cell rows, then the columns of each
    // cell.
    for cy in 0..n {
        columns.iter_mut().for_each(|v| *v = T::Sum::default());
        for row in change[bounds[cy] * width..bounds[cy + 1] * width].chunks_exact(width) {
            for (c, &v) in columns.iter_mut().zip(row) {
                *c += v.widen();
            }
        }
        for cx in 0..n {
            let area = ((bounds[cy + 1] - bounds[cy]) * (bounds[cx + 1] - bounds[cx])).max(1) as f32;
            let mut sum = [0f64; 3];
            for p in columns[bounds[cx] * 3..bounds[cx + 1] * 3].chunks_exact(3) {
                for (t, &v) in sum.iter_mut().zip(p) {
                    *t += v.into();
                }
            }
            for (g, t) in s.grid[(cy * n + cx) * 3..][..3].iter_mut().zip(sum) {
                *g = t as f32 / area;
            }
        }
    }
    *T::columns(s) = columns;
    // Each row of cells read across the width, once; then each row of the crop is one blend
    // of two of them.
    s.rows.resize(n * width, 0.0);
    for cy in 0..n {
        let cells = &s.grid[cy * n * 3..(cy + 1) * n * 3];
        let row = &mut s.rows[cy * width..(cy + 1) * width];
        for (x, p) in row.chunks_exact_mut(3).enumerate() {
            let (cx, tx) = between(x, size, n);
            for c in 0..3 {
                let (l, r) = (cells[cx * 3 + c], cells[cx * 3 + 3 + c]);
                p[c] = l + (r - l) * tx;
            }
        }
    }
    for (y, row) in change.chunks_exact_mut(width).take(size).enumerate() {
        let (cy, ty) = between(y, size, n);
        let (top, bottom) = (
            &s.rows[cy * width..(cy + 1) * width],
            &s.rows[(cy + 1) * width..(cy + 2) * width],
        );
        for ((p, &a), &b) in row.iter_mut().zip(top).zip(bottom) {
            *p = p.less(a + (b - a) * ty);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{remove_low_band, LowBand};
    use crate::kernels::Cpu;

    fn mean(v: &[i16], c: usize) -> f64 {
        v.iter().skip(c).step_by(3).map(|&x| f64::from(x)).sum::<f64>() / (v.len() / 3) as f64
    }

    /// A cast the same everywhere, and a linear ramp of one, go entirely.
    #[test]
    fn a_cast_and_a_ramp_go() {
        for size in [64usize, 256, 512] {
            let mut s = LowBand::at(Cpu::detected());
            let mut flat = vec![0i16; 3 * size * size];
            for (i, v) in flat.iter_mut().enumerate() {
                *v = [2560, -1280, 640][i % 3];
            }
            remove_low_band(&mut flat, size, &mut s);
            assert!(flat.iter().all(|&v| v.abs() <= 1), "size {size}");
            let mut ramp = vec![0i16; 3 * size * size];
            for y in 0..size {
                for x in 0..size {
                    ramp[(y * size + x) * 3] = (x * 4096 / size) as i16;
                    ramp[(y * size + x) * 3 + 2] = (y * 2048 / size) as i16 - 1000;
                }
            }
            remove_low_band(&mut ramp, size, &mut s);
            let worst = ramp.iter().map(|v| v.abs()).max().unwrap();
            assert!(worst <= 2, "size {size}: {worst} steps left of a ramp");
        }
    }

    /// Taken off a level of the change (2x2 box averages, halved again), the low band leaves what
    /// halving the fixed change gives, to the half step the fixed change is rounded to: the cell
    /// centres lie on the levels' block edges, where the bilinear band has its kinks.
    #[test]
    fn a_levels_fix_is_the_fixed_changes_level() {
        use crate::kernels::halve::halve;
        for size in [256usize, 512] {
            let mut s = LowBand::at(Cpu::detected());
            let change: Vec<i16> = (0..3 * size * size)
                .map(|i| {
                    let (p, c) = (i / 3, i % 3);
                    let (x, y) = ((p % size) as f32, (p / size) as f32);
                    (900.0 * (x / 40.0 + c as f32).sin() + 700.0 * (y / 23.0).cos() + 3.0 * x - 2.0 * y
                        + ((p * 7919 + c * 31) % 200) as f32) as i16
                })
                .collect();
            let mut fixed = change.clone();
            remove_low_band(&mut fixed, size, &mut s);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let (mut fa, mut ca, mut sw) = (Vec::new(), Vec::new(), size);
            halve(&fixed, sw, sw, &mut fa);
            halve(&change, sw, sw, &mut ca);
            sw /= 2;
            for level in 1..=3 {
                if level > 1 {
                    halve(&fa, sw, sw, &mut a);
                    halve(&ca, sw, sw, &mut b);
                    (fa, ca, sw) = (std::mem::take(&mut a), std::mem::take(&mut b), sw / 2);
                }
                let mut taken = ca.clone();
                super::remove_low_band_from_level(&mut taken, sw, size, &mut s);
                let worst = taken.iter().zip(&fa).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                assert!(worst <= 0.51, "crop {size}, level {level}: {worst} steps apart");
            }
        }
    }

    /// Detail finer than a cell stays: a checkerboard of 2 pixels keeps almost all of itself,
    /// and its mean stays 0.
    #[test]
    fn fine_detail_stays() {
        let size = 256;
        let mut s = LowBand::at(Cpu::detected());
        let mut v = vec![0i16; 3 * size * size];
        for y in 0..size {
            for x in 0..size {
                let on = ((x / 2) + (y / 2)) % 2 == 0;
                for c in 0..3 {
                    v[(y * size + x) * 3 + c] = if on { 1280 } else { -1280 } + 640;
                }
            }
        }
        let before = v.clone();
        remove_low_band(&mut v, size, &mut s);
        for c in 0..3 {
            assert!(mean(&v, c).abs() < 1.0, "mean {}", mean(&v, c));
        }
        let kept = v
            .iter()
            .zip(&before)
            .filter(|(a, b)| (i32::from(**a) - (i32::from(**b) - 640)).abs() <= 2)
            .count();
        assert_eq!(kept, v.len());
    }

    /// Each level this CPU runs removes the same low band as the plain body, to the bit.
    #[test]
    fn every_level_gives_the_plain_fix() {
        let size = 256;
        let change: Vec<i16> = (0..3 * size * size)
            .map(|i| ((i * 7919 + i / 3 * 31) % 4001) as i16 - 2000)
            .collect();
        let mut plain = change.clone();
        remove_low_band(&mut plain, size, &mut LowBand::at(Cpu::PLAIN));
        for cpu in Cpu::available() {
            let mut got = change.clone();
            remove_low_band(&mut got, size, &mut LowBand::at(cpu));
            assert_eq!(got, plain, "{}", cpu.name());
        }
    }
}
