//! Tensor packing: in, a crop in planar bytes and the model's output; out, the model's input
//! (an NCHW item in [-1, 1]), the model's change as packed steps, and the crop's half-size luma.

use crate::kernels::change_steps;
use crate::kernels::Cpu;

/// The model's input (an NCHW item in [-1, 1]) from a crop in bytes: each level `b` as
/// `b / 127.5 - 1` (the value the float warp gives a whole level), eight at a time on a CPU
/// with AVX2.
pub fn crop_to_tensor(cpu: Cpu, crop: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { crop_to_tensor_avx2(crop, out) };
    }
    crop_to_tensor_body(crop, out);
}

/// [`crop_to_tensor_body`] compiled for AVX2 (the same values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn crop_to_tensor_avx2(crop: &[u8], out: &mut [f32]) {
    crop_to_tensor_body(crop, out);
}

/// The body of [`crop_to_tensor`].
#[inline(always)]
pub(crate) fn crop_to_tensor_body(crop: &[u8], out: &mut [f32]) {
    const K: f32 = 1.0 / 127.5;
    for (o, &b) in out.iter_mut().zip(crop) {
        *o = f32::from(b) * K - 1.0;
    }
}

/// Maps one NCHW item in [-1, 1] back to packed RGB24 with clamping and rounding (the tests'
/// view of a crop; the pipeline passes on [`tensor_change`]).
#[cfg(test)]
pub(crate) fn tensor_to_rgb(t: &[f32], size: usize, out: &mut Vec<u8>) {
    let plane = size * size;
    out.clear();
    out.reserve(plane * 3);
    let (r, g, b) = (&t[..plane], &t[plane..2 * plane], &t[2 * plane..3 * plane]);
    // Clamped to [0.5, 255.5) then truncated: round half up, without a libm call.
    let px = |v: f32| ((v + 1.0) * 127.5 + 0.5).clamp(0.0, 255.0) as u8;
    for i in 0..plane {
        out.extend_from_slice(&[px(r[i]), px(g[i]), px(b[i])]);
    }
}

/// What the model changed in one crop: `restored` (its output, an NCHW item in [-1, 1]) minus
/// `given` (its input, the crop in planar bytes), as packed RGB in steps of
/// [`CHANGE_STEPS`](crate::kernels::CHANGE_STEPS) (levels x 128), the output clamped to the
/// picture's range first. Zero where the model gave its input back. False when an output
/// value is not finite (a broken model, an overflow in fp16): `out` is then not a change.
pub(crate) fn tensor_change(cpu: Cpu, restored: &[f32], given: &[u8], size: usize, out: &mut Vec<i16>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { tensor_change_avx2(restored, given, size, out) };
    }
    tensor_change_body(restored, given, size, out)
}

/// [`tensor_change_body`] compiled for AVX2 (eight values a vector; the same values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tensor_change_avx2(restored: &[f32], given: &[u8], size: usize, out: &mut Vec<i16>) -> bool {
    tensor_change_body(restored, given, size, out)
}

/// The body of [`tensor_change`]: a run of 64 pixels at a time, each plane's values to steps
/// (loops the compiler turns into vector code, the finiteness check among them), then the
/// three planes' steps interleaved into pixels.
#[inline(always)]
pub(crate) fn tensor_change_body(restored: &[f32], given: &[u8], size: usize, out: &mut Vec<i16>) -> bool {
    const RUN: usize = 64;
    let plane = size * size;
    // Every value is written below: a buffer back from the pool at this size is not zeroed first.
    out.resize(plane * 3, 0);
    let (restored, given) = (&restored[..3 * plane], &given[..3 * plane]);
    let mut steps = [[0i16; RUN]; 3];
    let mut finite = true;
    for (start, dst) in (0..plane).step_by(RUN).zip(out.chunks_mut(RUN * 3)) {
        let n = (plane - start).min(RUN);
        for (c, s) in steps.iter_mut().enumerate() {
            let (r, g) = (&restored[c * plane + start..][..n], &given[c * plane + start..][..n]);
            for ((s, &v), &g) in s[..n].iter_mut().zip(r).zip(g) {
                finite &= v.is_finite();
                *s = change_steps(((v + 1.0) * 127.5).clamp(0.0, 255.0) - f32::from(g));
            }
        }
        for (k, p) in dst.chunks_exact_mut(3).enumerate() {
            p.copy_from_slice(&[steps[0][k], steps[1][k], steps[2][k]]);
        }
    }
    finite
}

/// What a model with byte I/O changed in one crop: `restored` minus `given`, both planar bytes
/// (levels), as packed RGB in steps (see [`tensor_change`]; whole levels are exact).
pub(crate) fn bytes_change(restored: &[u8], given: &[u8], size: usize, out: &mut Vec<i16>) {
    let plane = size * size;
    let unit = crate::kernels::CHANGE_STEPS as i16;
    // Every value is written below: a buffer back from the pool at this size is not zeroed first.
    out.resize(plane * 3, 0);
    for c in 0..3 {
        let (r, g) = (&restored[c * plane..][..plane], &given[c * plane..][..plane]);
        for ((o, &r), &g) in out[c..].iter_mut().step_by(3).zip(r).zip(g) {
            *o = (i16::from(r) - i16::from(g)) * unit;
        }
    }
}

/// Luma (levels) of each 2x2 block of a crop in planar bytes of `size`, for the temporal
/// filter's likeness test.
pub(crate) fn crop_luma_half(cpu: Cpu, crop: &[u8], size: usize, out: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if cpu.avx2() {
        // SAFETY: a `Cpu` says AVX2 only where this CPU has it (see `crate::kernels::cpu`).
        return unsafe { crop_luma_half_avx2(crop, size, out) };
    }
    crop_luma_half_body(crop, size, out);
}

/// [`crop_luma_half_body`] compiled for AVX2 (the same values).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn crop_luma_half_avx2(crop: &[u8], size: usize, out: &mut Vec<f32>) {
    crop_luma_half_body(crop, size, out);
}

/// The body of [`crop_luma_half`]: each row pair's pixels' luma a run of 64 at a time (loops
/// the compiler turns into vector code), then each cell's sum in the pixel-by-pixel order.
#[inline(always)]
pub(crate) fn crop_luma_half_body(crop: &[u8], size: usize, out: &mut Vec<f32>) {
    const RUN: usize = 64;
    let (h, plane) = (size / 2, size * size);
    out.clear();
    out.resize(h * h, 0.0);
    let (r, g, b) = (&crop[..plane], &crop[plane..2 * plane], &crop[2 * plane..3 * plane]);
    let luma_run = |at: usize, n: usize, l: &mut [f32; RUN]| {
        let rows = r[at..at + n].iter().zip(&g[at..at + n]).zip(&b[at..at + n]);
        for (l, ((&r, &g), &b)) in l.iter_mut().zip(rows) {
            *l = 0.299 * f32::from(r) + 0.587 * f32::from(g) + 0.114 * f32::from(b);
        }
    };
    let (mut lt, mut lb) = ([0.0f32; RUN], [0.0f32; RUN]);
    for (y, o) in out.chunks_exact_mut(h).enumerate() {
        let (top, bottom) = (2 * y * size, (2 * y + 1) * size);
        for (start, o) in (0..2 * h).step_by(RUN).zip(o.chunks_mut(RUN / 2)) {
            let n = (2 * h - start).min(RUN);
            luma_run(top + start, n, &mut lt);
            luma_run(bottom + start, n, &mut lb);
            for ((o, t), b) in o.iter_mut().zip(lt.chunks_exact(2)).zip(lb.chunks_exact(2)) {
                *o = (((t[0] + t[1]) + b[0]) + b[1]) * 0.25;
            }
        }
    }
}
