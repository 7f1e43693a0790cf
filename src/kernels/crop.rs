//! Where a warp writes its crop: in, crop pixels' levels one or four at a time (from
//! `warp.rs`, `twopass.rs`); out, a model input item in floats or a crop in bytes, planar RGB.

use wide::f32x4;

/// Where a warp writes its crop: planar RGB, one plane after another (`size * size` values
/// each), a pixel `i` at a time as levels (0..=255).
pub trait CropOut {
    fn put(&mut self, i: usize, p: [f32; 3]);

    /// Four pixels `i .. i + 4` at once, levels already in 0..=255, one vector per channel:
    /// what four calls of [`CropOut::put`] write.
    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        let [r, g, b] = rgb.map(|v| v.to_array());
        for k in 0..4 {
            self.put(i + k, [r[k], g[k], b[k]]);
        }
    }
}

/// A model input item: planar RGB in [-1, 1] (one NCHW item of floats).
impl CropOut for [f32] {
    #[inline(always)]
    fn put(&mut self, i: usize, p: [f32; 3]) {
        const K: f32 = 1.0 / 127.5;
        let plane = self.len() / 3;
        self[i] = p[0] * K - 1.0;
        self[plane + i] = p[1] * K - 1.0;
        self[2 * plane + i] = p[2] * K - 1.0;
    }

    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        let (k, one) = (f32x4::splat(1.0 / 127.5), f32x4::splat(1.0));
        let plane = self.len() / 3;
        for (c, v) in rgb.into_iter().enumerate() {
            let at: &mut [f32; 4] = (&mut self[c * plane + i..][..4]).try_into().expect("4 values");
            *at = (v * k - one).to_array();
        }
    }
}

/// A crop in bytes: planar RGB24, each level rounded (half up) and clamped, what travels to the
/// model's worker (a quarter of the floats' size); [`crop_to_tensor`] makes the model's input.
impl CropOut for [u8] {
    #[inline(always)]
    fn put(&mut self, i: usize, p: [f32; 3]) {
        let plane = self.len() / 3;
        // Saturating casts: below zero gives 0, above 255 gives 255.
        self[i] = (p[0] + 0.5) as u8;
        self[plane + i] = (p[1] + 0.5) as u8;
        self[2 * plane + i] = (p[2] + 0.5) as u8;
    }

    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        let half = f32x4::splat(0.5);
        let plane = self.len() / 3;
        for (c, v) in rgb.into_iter().enumerate() {
            // In 0..=255.5 after the half, so truncation rounds half up as `put` does.
            let n = (v + half).fast_trunc_int();
            let at: &mut [u8; 4] = (&mut self[c * plane + i..][..4]).try_into().expect("4 bytes");
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::*;
                // SAFETY: SSE2 is part of x86-64; i32x4 is four i32 lanes like __m128i (both
                // plain data of 16 bytes). The lanes are 0..=255, so both packs keep them.
                let word = unsafe {
                    let n = std::mem::transmute::<wide::i32x4, __m128i>(n);
                    let bytes = _mm_packus_epi16(_mm_packs_epi32(n, n), _mm_setzero_si128());
                    _mm_cvtsi128_si32(bytes)
                };
                *at = word.to_le_bytes();
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                *at = n.to_array().map(|v| v as u8);
            }
        }
    }
}

/// A vector of either, as its slice.
impl<T> CropOut for Vec<T>
where
    [T]: CropOut,
{
    #[inline(always)]
    fn put(&mut self, i: usize, p: [f32; 3]) {
        self.as_mut_slice().put(i, p);
    }

    #[inline(always)]
    fn put4(&mut self, i: usize, rgb: [f32x4; 3]) {
        self.as_mut_slice().put4(i, rgb);
    }
}
