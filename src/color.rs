//! Colour conversion: in, decoded pictures (FFmpeg frames) or packed RGB24 buffers; out, the
//! other form: whole pictures through swscale, and single face regions of yuv420p pictures by
//! hand in both directions, so pixels outside faces are never converted at all.

use anyhow::Result;
use ffmpeg::format::Pixel;
use ffmpeg::software::scaling::{Context as Scaler, Flags};
use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg_next as ffmpeg;

use crate::geom::Rect;

/// The YCbCr matrix of a picture (limited range): what its stream says, else the usual
/// default by size (BT.709 for HD and larger, BT.601 below), the same both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matrix {
    Bt601,
    Bt709,
    Bt2020,
}

impl Matrix {
    /// The matrix a stream tagged `space` (maybe unspecified) of `width x height` uses.
    pub fn from_tag(space: ffmpeg::color::Space, width: usize, height: usize) -> Self {
        use ffmpeg::color::Space;
        match space {
            Space::BT709 | Space::SMPTE240M => Matrix::Bt709,
            Space::BT2020NCL | Space::BT2020CL => Matrix::Bt2020,
            Space::BT470BG | Space::SMPTE170M | Space::FCC => Matrix::Bt601,
            _ if width >= 1280 || height > 576 => Matrix::Bt709,
            _ => Matrix::Bt601,
        }
    }

    /// The matrix of a decoded picture (its own tag and size).
    pub fn of(frame: &VideoFrame) -> Self {
        Self::from_tag(frame.color_space(), frame.width() as usize, frame.height() as usize)
    }

    /// Kr and Kb, the red and blue luma weights.
    fn weights(self) -> (f32, f32) {
        match self {
            Matrix::Bt601 => (0.299, 0.114),
            Matrix::Bt709 => (0.2126, 0.0722),
            Matrix::Bt2020 => (0.2627, 0.0593),
        }
    }

    /// Integer RGB -> YCbCr coefficients (x256) for limited range: Y, Cb and Cr rows.
    fn forward(self) -> [[i32; 3]; 3] {
        let (kr, kb) = self.weights();
        let kg = 1.0 - kr - kb;
        let (y, c) = (219.0 / 255.0 * 256.0, 224.0 / 255.0 * 256.0);
        let (cb, cr) = (c / (2.0 * (1.0 - kb)), c / (2.0 * (1.0 - kr)));
        let r = |v: f32| v.round() as i32;
        [
            [r(y * kr), r(y * kg), r(y * kb)],
            [r(-cb * kr), r(-cb * kg), r(cb * (1.0 - kb))],
            [r(cr * (1.0 - kr)), r(-cr * kg), r(-cr * kb)],
        ]
    }

    /// YCbCr -> RGB factors for limited range: luma scale, Cr->R, Cb->G, Cr->G, Cb->B.
    fn inverse(self) -> [f32; 5] {
        let (kr, kb) = self.weights();
        let kg = 1.0 - kr - kb;
        let c = 255.0 / 224.0;
        [
            255.0 / 219.0,
            2.0 * (1.0 - kr) * c,
            2.0 * kb * (1.0 - kb) / kg * c,
            2.0 * kr * (1.0 - kr) / kg * c,
            2.0 * (1.0 - kb) * c,
        ]
    }
}

/// Converts `src` to packed RGB24 of `width x height` in `dst` (no row padding). swscale writes
/// into `tmp`, an FFmpeg frame with the aligned and padded rows its SIMD code may write past the
/// line end, and the rows are copied out: writing straight into a tight buffer corrupts memory
/// for widths whose rows are not a multiple of the vector size.
pub fn scale_packed(
    scaler: &mut Scaler,
    src: &VideoFrame,
    tmp: &mut VideoFrame,
    size: (usize, usize),
    dst: &mut Vec<u8>,
) -> Result<()> {
    let (width, height) = size;
    scaler.run(src, tmp)?;
    let (stride, data, row) = (tmp.stride(0), tmp.data(0), width * 3);
    dst.clear();
    dst.reserve(height * row);
    for y in 0..height {
        dst.extend_from_slice(&data[y * stride..y * stride + row]);
    }
    Ok(())
}

/// An swscale context owned by one thread at a time. ffmpeg-next marks it `!Send` because it
/// holds a raw pointer, but libswscale keeps no thread-local state: moving it is sound as long as
/// it is never used from two threads at once, which ownership here guarantees.
pub struct SendScaler(pub Scaler);
// SAFETY: see above; the context is only ever used through `&mut self` of its single owner.
unsafe impl Send for SendScaler {}

/// Converts `input` into `output` (same size) with the scaler in `slot`, made on first use.
pub fn convert(
    slot: &mut Option<SendScaler>,
    from: Pixel,
    to: Pixel,
    input: &VideoFrame,
    output: &mut VideoFrame,
) -> Result<()> {
    let (w, h) = (input.width(), input.height());
    let scaler = match slot {
        Some(s) => s,
        None => slot.insert(SendScaler(Scaler::get(
            from,
            w,
            h,
            to,
            w,
            h,
            Flags::BILINEAR | Flags::ACCURATE_RND,
        )?)),
    };
    scaler.0.run(input, output)?;
    Ok(())
}

/// Converts one region of packed RGB24 back into a yuv420p picture (limited range, the picture's
/// [`Matrix`]: the inverse of [`yuv420p_to_rgb_region`]). The region is widened to even bounds so
/// every chroma sample it touches is recomputed from its four pixels.
pub fn rgb_to_yuv420p_region(rgb: &[u8], width: usize, height: usize, yuv: &mut VideoFrame, r: Rect) {
    let Rect { x0, y0, x1, y1 } = r.even(width, height);
    let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
    let px = |x: usize, y: usize| {
        let i = (y * width + x) * 3;
        (rgb[i] as i32, rgb[i + 1] as i32, rgb[i + 2] as i32)
    };
    let [ly, lu, lv] = Matrix::of(yuv).forward();
    let luma = |(r, g, b): (i32, i32, i32)| (((ly[0] * r + ly[1] * g + ly[2] * b + 128) >> 8) + 16).clamp(0, 255) as u8;
    {
        let plane = yuv.data_mut(0);
        for y in y0..y1 {
            for x in x0..x1 {
                plane[y * ys + x] = luma(px(x, y));
            }
        }
    }
    for cy in (y0 / 2)..y1.div_ceil(2) {
        for cx in (x0 / 2)..x1.div_ceil(2) {
            let (mut sr, mut sg, mut sb, mut n) = (0, 0, 0, 0);
            for (x, y) in [
                (2 * cx, 2 * cy),
                (2 * cx + 1, 2 * cy),
                (2 * cx, 2 * cy + 1),
                (2 * cx + 1, 2 * cy + 1),
            ] {
                if x < width && y < height {
                    let (r, g, b) = px(x, y);
                    (sr, sg, sb, n) = (sr + r, sg + g, sb + b, n + 1);
                }
            }
            let (r, g, b) = ((sr + n / 2) / n, (sg + n / 2) / n, (sb + n / 2) / n);
            let u = (((lu[0] * r + lu[1] * g + lu[2] * b + 128) >> 8) + 128).clamp(0, 255) as u8;
            let v = (((lv[0] * r + lv[1] * g + lv[2] * b + 128) >> 8) + 128).clamp(0, 255) as u8;
            yuv.data_mut(1)[cy * us + cx] = u;
            yuv.data_mut(2)[cy * vs + cx] = v;
        }
    }
}

/// Converts one region of a yuv420p picture to packed RGB24 (limited range, the picture's
/// [`Matrix`], chroma interpolated bilinearly with MPEG-2 siting): the inverse of [`rgb_to_yuv420p_region`], used
/// so only face regions are ever converted.
pub fn yuv420p_to_rgb_region(yuv: &VideoFrame, rgb: &mut [u8], width: usize, height: usize, r: Rect) {
    let Rect { x0, y0, x1, y1 } = r.clip(width, height);
    let (ys, us, vs) = (yuv.stride(0), yuv.stride(1), yuv.stride(2));
    let (yp, up, vp) = (yuv.data(0), yuv.data(1), yuv.data(2));
    let (cw, ch) = (width.div_ceil(2), height.div_ceil(2));
    let [ky, kvr, kug, kvg, kub] = Matrix::of(yuv).inverse();
    for y in y0..y1 {
        // Chroma rows sit between luma rows: luma row y is at chroma row (y - 0.5) / 2.
        let cy = (y as f32 - 0.5) * 0.5;
        let cy0 = cy.floor().max(0.0) as usize;
        let cy1 = (cy0 + 1).min(ch - 1);
        let fy = (cy - cy0 as f32).clamp(0.0, 1.0);
        for x in x0..x1 {
            // Chroma columns sit on even luma columns.
            let cx = x as f32 * 0.5;
            let cx0 = cx as usize;
            let cx1 = (cx0 + 1).min(cw - 1);
            let fx = cx - cx0 as f32;
            let bil = |p: &[u8], s: usize| {
                let a = p[cy0 * s + cx0] as f32 + (p[cy0 * s + cx1] as f32 - p[cy0 * s + cx0] as f32) * fx;
                let b = p[cy1 * s + cx0] as f32 + (p[cy1 * s + cx1] as f32 - p[cy1 * s + cx0] as f32) * fx;
                a + (b - a) * fy - 128.0
            };
            let (d, e) = (bil(up, us), bil(vp, vs));
            let c = ky * (yp[y * ys + x] as f32 - 16.0);
            let px = &mut rgb[(y * width + x) * 3..(y * width + x) * 3 + 3];
            px[0] = (c + kvr * e + 0.5).clamp(0.0, 255.0) as u8;
            px[1] = (c - kug * d - kvg * e + 0.5).clamp(0.0, 255.0) as u8;
            px[2] = (c + kub * d + 0.5).clamp(0.0, 255.0) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A yuv420p picture of flat 8x8 patches, luma and chroma constant over each patch, all inside
    /// the RGB gamut (so a round trip through RGB has nothing to clip).
    fn patches(w: usize, h: usize) -> VideoFrame {
        crate::init_ffmpeg();
        let mut f = VideoFrame::new(Pixel::YUV420P, w as u32, h as u32);
        let (ys, us, vs) = (f.stride(0), f.stride(1), f.stride(2));
        let patch = |x: usize, y: usize| (x / 8 + 3 * (y / 8)) as u8;
        for y in 0..h {
            for x in 0..w {
                f.data_mut(0)[y * ys + x] = 80 + patch(x, y).wrapping_mul(37) % 100;
            }
        }
        for y in 0..h / 2 {
            for x in 0..w / 2 {
                let p = patch(2 * x, 2 * y);
                f.data_mut(1)[y * us + x] = 108 + p.wrapping_mul(53) % 40;
                f.data_mut(2)[y * vs + x] = 108 + p.wrapping_mul(29) % 40;
            }
        }
        f
    }

    #[test]
    fn yuv_to_rgb_and_back_keeps_flat_patches_within_a_level() {
        let (w, h) = (64, 48);
        let src = patches(w, h);
        let mut rgb = vec![0u8; w * h * 3];
        yuv420p_to_rgb_region(&src, &mut rgb, w, h, Rect::new(0, 0, w, h));
        let mut back = patches(w, h);
        // Start from a different picture, so only what the conversion writes is compared.
        for p in 0..3 {
            back.data_mut(p).fill(0);
        }
        rgb_to_yuv420p_region(&rgb, w, h, &mut back, Rect::new(0, 0, w, h));
        let mut worst = 0i32;
        for y in 0..h {
            for x in 0..w {
                // Patch interiors: chroma interpolation mixes neighbours at patch edges.
                if x % 8 < 2 || x % 8 > 5 || y % 8 < 2 || y % 8 > 5 {
                    continue;
                }
                let d = src.data(0)[y * src.stride(0) + x] as i32 - back.data(0)[y * back.stride(0) + x] as i32;
                worst = worst.max(d.abs());
                let (cx, cy) = (x / 2, y / 2);
                for p in 1..3 {
                    let d = src.data(p)[cy * src.stride(p) + cx] as i32 - back.data(p)[cy * back.stride(p) + cx] as i32;
                    worst = worst.max(d.abs());
                }
            }
        }
        assert!(worst <= 1, "round trip moved a sample by {worst} levels");
    }

    #[test]
    fn matrices_follow_the_tag_then_the_size_and_bt601_keeps_its_integers() {
        use ffmpeg::color::Space;
        assert_eq!(
            Matrix::Bt601.forward(),
            [[66, 129, 25], [-38, -74, 112], [112, -94, -18]]
        );
        let inv = Matrix::Bt601.inverse();
        assert!((inv[1] - 1.596_026_8).abs() < 1e-4 && (inv[4] - 2.017_232_2).abs() < 1e-4);
        assert_eq!(Matrix::from_tag(Space::Unspecified, 1920, 1080), Matrix::Bt709);
        assert_eq!(Matrix::from_tag(Space::Unspecified, 640, 360), Matrix::Bt601);
        assert_eq!(Matrix::from_tag(Space::BT470BG, 1920, 1080), Matrix::Bt601);
        assert_eq!(Matrix::from_tag(Space::BT709, 640, 360), Matrix::Bt709);
        assert_eq!(Matrix::from_tag(Space::BT2020NCL, 3840, 2160), Matrix::Bt2020);
    }

    #[test]
    fn rgb_to_yuv_and_back_keeps_known_colours() {
        let (w, h) = (16, 16);
        let colours = [
            [0u8, 0, 0],
            [255, 255, 255],
            [128, 128, 128],
            [200, 40, 30],
            [30, 160, 60],
            [40, 60, 210],
        ];
        for c in colours {
            let rgb: Vec<u8> = (0..w * h).flat_map(|_| c).collect();
            let mut yuv = patches(w, h);
            rgb_to_yuv420p_region(&rgb, w, h, &mut yuv, Rect::new(0, 0, w, h));
            let mut back = vec![0u8; w * h * 3];
            yuv420p_to_rgb_region(&yuv, &mut back, w, h, Rect::new(0, 0, w, h));
            for px in back.chunks_exact(3) {
                for k in 0..3 {
                    assert!((px[k] as i32 - c[k] as i32).abs() <= 3, "{c:?} came back as {px:?}");
                }
            }
        }
    }

    #[test]
    fn region_conversions_touch_only_their_region() {
        let (w, h) = (40, 30);
        let mut yuv = patches(w, h);
        let before = (0..3).map(|p| yuv.data(p).to_vec()).collect::<Vec<_>>();
        let rgb = vec![250u8; w * h * 3];
        let r = Rect::new(9, 7, 21, 17);
        rgb_to_yuv420p_region(&rgb, w, h, &mut yuv, r);
        let even = r.even(w, h);
        for y in 0..h {
            for x in 0..w {
                let inside = (even.x0..even.x1).contains(&x) && (even.y0..even.y1).contains(&y);
                let i = y * yuv.stride(0) + x;
                assert_eq!(yuv.data(0)[i] != before[0][i], inside, "luma at ({x}, {y})");
            }
        }
        let mut out = vec![7u8; w * h * 3];
        yuv420p_to_rgb_region(&yuv, &mut out, w, h, r);
        let touched = out
            .chunks_exact(3)
            .filter(|p| p[0] != 7 || p[1] != 7 || p[2] != 7)
            .count();
        assert_eq!(touched, r.width() * r.height());
    }
}
