//! The change's levels: in, a packed three-channel picture of `w x h` (floats, or a change in
//! 16-bit steps); out, its half-size level in floats by 2x2 box averages, the form the paste
//! samples a face much smaller than its crop from.

use crate::kernels::Cpu;

/// Halves a packed three-channel picture of `w x h` (floats, or a change in steps) into floats
/// by 2x2 box averages (odd edges repeat the last pixel).
pub(crate) fn halve<T: Copy + Into<f32>>(src: &[T], w: usize, h: usize, out: &mut Vec<f32>) -> (usize, usize) {
    let (hw, hh) = (w.div_ceil(2).max(1), h.div_ceil(2).max(1));
    out.clear();
    if w.is_multiple_of(2) && h.is_multiple_of(2) {
        // Even sides (a crop's levels): each block's two rows side by side, no edge to repeat;
        // the same sums in the same order (0.90 against 1.01 core-ms a face for the group
        // sample's paste without it, paired).
        out.resize(hw * hh * 3, 0.0);
        for (o, rows) in out.chunks_exact_mut(hw * 3).zip(src.chunks_exact(2 * w * 3)) {
            let (top, bottom) = rows.split_at(w * 3);
            for ((o, t), b) in o
                .chunks_exact_mut(3)
                .zip(top.chunks_exact(6))
                .zip(bottom.chunks_exact(6))
            {
                for c in 0..3 {
                    let [tl, tr, bl, br]: [f32; 4] = [t[c], t[3 + c], b[c], b[3 + c]].map(Into::into);
                    o[c] = (((tl + tr) + bl) + br) * 0.25;
                }
            }
        }
        return (hw, hh);
    }
    out.reserve(hw * hh * 3);
    for y in 0..hh {
        let (ya, yb) = ((2 * y).min(h - 1), (2 * y + 1).min(h - 1));
        for x in 0..hw {
            let (xa, xb) = ((2 * x).min(w - 1), (2 * x + 1).min(w - 1));
            for c in 0..3 {
                let at = |y: usize, x: usize| -> f32 { src[(y * w + x) * 3 + c].into() };
                let s = at(ya, xa) + at(ya, xb) + at(yb, xa) + at(yb, xb);
                out.push(s * 0.25);
            }
        }
    }
    (hw, hh)
}

/// [`halve`] of a change in steps: the same values (a block's four steps sum exactly in any
/// order, in integers as in floats, so the sum is the one [`halve`] makes), each pair of rows
/// summed in integers first and each block from its two columns' sums, loops the compiler
/// turns into vector code (compiled for AVX2 where the CPU has it); odd sides go to [`halve`].
/// `sums` holds a row pair's sums (reused from face to face).
pub(crate) fn halve_steps(
    cpu: Cpu,
    src: &[i16],
    w: usize,
    h: usize,
    out: &mut Vec<f32>,
    sums: &mut Vec<i32>,
) -> (usize, usize) {
    if !(w.is_multiple_of(2) && h.is_multiple_of(2)) || w == 0 || h == 0 {
        return halve(src, w, h, out);
    }
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { halve_steps_avx2(src, w, h, out, sums) };
    }
    halve_steps_body(src, w, h, out, sums)
}

/// [`halve_steps_body`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn halve_steps_avx2(src: &[i16], w: usize, h: usize, out: &mut Vec<f32>, sums: &mut Vec<i32>) -> (usize, usize) {
    halve_steps_body(src, w, h, out, sums)
}

/// The body of [`halve_steps`], for even sides.
#[inline(always)]
pub(crate) fn halve_steps_body(
    src: &[i16],
    w: usize,
    h: usize,
    out: &mut Vec<f32>,
    cols: &mut Vec<i32>,
) -> (usize, usize) {
    let (hw, hh) = (w / 2, h / 2);
    out.clear();
    out.resize(hw * hh * 3, 0.0);
    // Every value is written before it is read, row pair by row pair.
    cols.resize(w * 3, 0);
    for (o, rows) in out.chunks_exact_mut(hw * 3).zip(src.chunks_exact(2 * w * 3)) {
        let (top, bottom) = rows.split_at(w * 3);
        for ((c, &t), &b) in cols.iter_mut().zip(top).zip(bottom) {
            *c = i32::from(t) + i32::from(b);
        }
        // A block's value c: its left column's c plus its right column's (three values on).
        for (o, pair) in o.chunks_exact_mut(3).zip(cols.chunks_exact(6)) {
            for c in 0..3 {
                o[c] = (pair[c] + pair[3 + c]) as f32 * 0.25;
            }
        }
    }
    (hw, hh)
}
