//! Face alignment's templates: in, the template a model was trained with (by name); out, its
//! five points scaled to the model's crop, which the face's landmarks are fitted to. The warp
//! into the crop is a kernel (`crate::kernels::warp`); the tests here run it over faces.

/// The FFHQ five-point template, normalised to the crop size (x, y): left eye, right eye, nose,
/// left mouth corner, right mouth corner (as facexlib and facefusion use it).
pub(crate) const FFHQ_TEMPLATE: [[f64; 2]; 5] = [
    [0.376_916_76, 0.468_646_64],
    [0.622_856_97, 0.469_128_13],
    [0.501_238_6, 0.613_319_04],
    [0.393_088_22, 0.725_411],
    [0.611_502_05, 0.724_904_65],
];

/// The tighter arcface_128 template facefusion pairs with GPEN-BFR-256.
pub(crate) const ARCFACE_128_TEMPLATE: [[f64; 2]; 5] = [
    [0.361_676_56, 0.403_877_34],
    [0.636_967_19, 0.402_354_69],
    [0.500_196_87, 0.560_442_19],
    [0.387_103_91, 0.721_605_47],
    [0.615_077_34, 0.720_344_53],
];

/// The FFHQ template scaled to a crop of `size` pixels.
pub fn template(size: usize) -> [[f32; 2]; 5] {
    Template::Ffhq.points(size)
}

/// The five-point template a model was trained with: resolved once, from the model file's
/// `gpen_video.template` metadata or the registry, when the model is loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Template {
    /// FFHQ's (GPEN-BFR-512 and 1024, facexlib, facefusion).
    #[default]
    Ffhq,
    /// The tighter arcface_128 facefusion pairs with GPEN-BFR-256.
    Arcface128,
}

impl Template {
    /// Every template by its name, as model files and the registry write it.
    pub(crate) const NAMES: [(&'static str, Template); 2] =
        [("ffhq", Template::Ffhq), ("arcface_128", Template::Arcface128)];

    /// The template's points scaled to a crop of `size` pixels.
    pub fn points(self, size: usize) -> [[f32; 2]; 5] {
        let t = match self {
            Template::Ffhq => FFHQ_TEMPLATE,
            Template::Arcface128 => ARCFACE_128_TEMPLATE,
        };
        t.map(|[x, y]| [(x * size as f64) as f32, (y * size as f64) as f32])
    }

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, t)| *t == self).map_or("ffhq", |(n, _)| n)
    }
}

impl serde::Serialize for Template {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(self.name())
    }
}

impl std::str::FromStr for Template {
    type Err = String;
    /// A template by name; an unknown name is an error naming the choices.
    fn from_str(s: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown alignment template `{s}` (the choices are {})",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geom::{Affine, Rect};
    use crate::kernels::sample::*;
    use crate::kernels::tensor::*;
    use crate::kernels::warp::*;
    use crate::kernels::{change_steps, Cpu};
    use wide::f32x4;

    use crate::geom::{crop_footprint, fit_similarity, similarity};

    /// A large face's warp tile by tile (each tile's texels made apart) writes, to the bit, the
    /// crop the warp over all its texels at once writes: bicubically and through the area
    /// filter, inside the picture, cut by its edges and turned (upside down too).
    #[test]
    fn a_warp_tile_by_tile_is_the_warp_over_the_whole_region() {
        let (w, h, size) = (1280usize, 720usize, 512usize);
        let frame: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919 + i / 977) % 251) as u8).collect();
        let tpl = template(size);
        let (mut cubic, mut area) = (0, 0);
        for (eye, cx, cy, angle) in [
            (150.0, 640.0, 360.0, 0.1),
            (170.0, 90.0, 640.0, -0.5),
            (230.0, 1200.0, 90.0, 2.0),
            (200.0, 640.0, 360.0, 0.0),
            (120.0, 40.0, 30.0, 0.7),
            (240.0, 700.0, 420.0, 3.1),
        ] {
            // The face `eye` frame pixels between the eyes at (cx, cy), turned by `angle`.
            let k = eye / (tpl[1][0] - tpl[0][0]) as f64;
            let (sn, cs) = f64::sin_cos(angle);
            let points = tpl.map(|[x, y]| {
                let (x, y) = (x as f64 - size as f64 / 2.0, y as f64 - size as f64 / 2.0);
                [(cx + k * (cs * x - sn * y)) as f32, (cy + k * (sn * x + cs * y)) as f32]
            });
            let to_crop = fit_similarity(&points, &tpl);
            let inv = to_crop.inverse().expect("a similarity");
            let region = crop_footprint(&to_crop, size, w, h).expect("on the frame");
            let r = texel_rect(region, (w, h));
            let by_area = area_at_level_zero(&to_crop);
            let spread = if by_area { 1.0 } else { 0.0 };
            assert!(tiles(&inv, size, r, (w, h), spread).count() > 1, "eye {eye}: one tile");
            let mut load = |t: Rect, tex: &mut Vec<f32x4>| load_texels(&frame, w, t, tex);
            let (mut tiled, mut whole) = (vec![0u8; 3 * size * size], vec![1u8; 3 * size * size]);
            let (mut scratch, mut tex) = (WarpScratch::at(Cpu::detected()), Vec::new());
            load_texels(&frame, w, r, &mut tex);
            if by_area {
                warp_area_loading(&mut load, (w, h), &to_crop, region, size, &mut tiled[..], &mut scratch);
                area_taps(&tex, r, &inv, size, Tile::whole(size), &mut whole[..], |x, y| {
                    bilinear_texels_clamped(&tex, r, (w, h), x, y)
                });
                area += 1;
            } else {
                warp_cubic_loading(&mut load, (w, h), &to_crop, region, size, &mut tiled[..], &mut scratch);
                warp_cubic_plain(
                    scratch.cpu(),
                    (&tex, r),
                    (w, h),
                    &inv,
                    size,
                    Tile::whole(size),
                    &mut whole[..],
                );
                cubic += 1;
            }
            assert!(tiled == whole, "eye {eye}, angle {angle}: the tiles' crop differs");
        }
        assert!(cubic >= 2 && area >= 2, "{cubic} bicubic and {area} area warps");
    }

    /// Whether a face aligned by `to_crop` is read through the area filter at the frame's own
    /// resolution (as the pipeline does for the faces it warps from the planes).
    fn area_at_level_zero(to_crop: &Affine) -> bool {
        filtered(to_crop) && mip_level(1.0 / to_crop.scale(), 6) == 0
    }

    /// Renders a soft blob, warps it into the crop with the fitted transform and back with the
    /// inverse: the blob's centroid must land within half a pixel of where it started.
    #[test]
    fn warp_round_trip_keeps_a_feature_within_half_a_pixel() {
        let (w, h) = (320usize, 240usize);
        let (cx, cy) = (171.3f64, 118.6f64);
        let mut img = vec![0u8; w * h * 3];
        for y in 0..h {
            for x in 0..w {
                let d2 = (x as f64 - cx).powi(2) + (y as f64 - cy).powi(2);
                let v = (255.0 * (-d2 / 50.0).exp()).round() as u8;
                img[(y * w + x) * 3..][..3].copy_from_slice(&[v, v, v]);
            }
        }
        // Landmarks of a face around the blob, slightly rotated.
        let size = 128;
        let truth = similarity(0.2, 0.9, cx - 50.0, cy - 70.0);
        let lm = template(size).map(|[x, y]| {
            let (u, v) = truth.apply(x as f64, y as f64);
            [u as f32, v as f32]
        });
        let to_crop = fit_similarity(&lm, &template(size));
        let mut t = vec![0.0; 3 * size * size];
        warp_to_tensor(&img, w, h, &to_crop, size, &mut t);
        let mut crop = Vec::new();
        tensor_to_rgb(&t, size, &mut crop);
        // Back into the frame: sample the crop at to_crop(frame pixel).
        let (mut sx, mut sy, mut sw) = (0.0, 0.0, 0.0);
        for y in 0..h {
            for x in 0..w {
                let (u, v) = to_crop.apply(x as f64, y as f64);
                if u < 0.0 || v < 0.0 || u > (size - 1) as f64 || v > (size - 1) as f64 {
                    continue;
                }
                let p = sample_rgb(&crop, size, size, u, v)[0] as f64;
                sx += p * x as f64;
                sy += p * y as f64;
                sw += p;
            }
        }
        let (ex, ey) = (sx / sw - cx, sy / sw - cy);
        assert!(ex.hypot(ey) < 0.5, "centroid moved by ({ex:.3}, {ey:.3})");
    }

    /// A one-pixel frame checkerboard under a face `ratio` times larger than the crop, turned a
    /// little: the crop's inner pixels (mean, standard deviation) as the warp reads them.
    fn checkerboard_crop(ratio: f64, filtered: bool) -> (f64, f64) {
        let size = 256;
        let (w, h) = (1600usize, 1500usize);
        let img: Vec<u8> = (0..w * h)
            .flat_map(|i| {
                let v = if (i % w + i / w) % 2 == 0 { 0 } else { 255 };
                [v, v, v]
            })
            .collect();
        let truth = similarity(0.15, ratio, 300.0, 40.0);
        let lm = template(size).map(|[x, y]| {
            let (u, v) = truth.apply(x as f64, y as f64);
            [u as f32, v as f32]
        });
        let to_crop = fit_similarity(&lm, &template(size));
        let region = crate::geom::crop_footprint(&to_crop, size, w, h);
        let mut t = vec![0.0; 3 * size * size];
        if filtered {
            warp_face(
                &img,
                (w, h),
                &to_crop,
                region,
                size,
                &mut t,
                &mut WarpScratch::at(Cpu::detected()),
            );
        } else {
            warp_to_tensor(&img, w, h, &to_crop, size, &mut t);
        }
        let mut crop = Vec::new();
        tensor_to_rgb(&t, size, &mut crop);
        let vals: Vec<f64> = (16..size - 16)
            .flat_map(|y| (16..size - 16).map(move |x| (x, y)))
            .map(|(x, y)| crop[(y * size + x) * 3] as f64)
            .collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn a_fine_checkerboard_under_a_large_face_reaches_the_crop_as_grey() {
        // A 1080p close-up into a 256 crop (about five frame pixels per crop pixel), and faces
        // just past the threshold and between mip levels.
        for ratio in [4.8, 1.6, 2.9, 3.7] {
            let (mean, sd) = checkerboard_crop(ratio, true);
            assert!(
                (mean - 127.5).abs() <= 2.0 && sd < 8.0,
                "ratio {ratio}: mean {mean:.1}, sd {sd:.1}"
            );
        }
        // One bilinear sample per crop pixel aliases: the checkerboard shows as a pattern.
        let (_, sd) = checkerboard_crop(4.8, false);
        assert!(sd > 20.0, "unfiltered sd {sd:.1}");
    }

    /// The fast paths (the region as f32 texels, four-lane taps, four pixels' weights at once;
    /// the four-lane change sampler; the eight-lane AVX2 taps) give exactly what the clamped
    /// per-pixel sampler gives,
    /// for faces inside the picture and across its edges, turned and scaled both ways.
    #[test]
    fn the_fast_samplers_equal_the_clamped_ones_exactly() {
        let (w, h, size) = (333usize, 250usize, 128usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        let cases = [
            // A face near the crop's size (below the area filter's threshold).
            (0.1, 1.0 / 1.3, -20.0, -10.0),
            (0.1, 1.0 / 0.7, -60.0, -40.0),
            (0.3, 1.0 / 1.2, -20.0, 10.0),
            (-0.2, 1.0 / 0.5, 40.0, 30.0),
            (2.9, 1.0 / 0.9, 150.0, 140.0),
        ];
        for (angle, scale, tx, ty) in cases {
            let to_crop = crate::geom::similarity(angle, scale, tx, ty);
            let region = crate::geom::crop_footprint(&to_crop, size, w, h);
            let mut b = vec![0.0; 3 * size * size];
            warp_to_tensor(&img, w, h, &to_crop, size, &mut b);
            // At every level this CPU runs, to the bit.
            for cpu in Cpu::available() {
                let mut a = vec![0.0; 3 * size * size];
                let mut scratch = WarpScratch::at(cpu);
                warp_face(&img, (w, h), &to_crop, region, size, &mut a, &mut scratch);
                let apart = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                assert!(
                    apart == 0.0,
                    "{}: angle {angle}, scale {scale}: {apart} apart",
                    cpu.name()
                );
            }
            // Each sampler on its own.
            let Some(region) = region else { continue };
            let mut a = vec![0.0; 3 * size * size];
            let apart = |a: &[f32]| a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            let r = texel_rect(region, (w, h));
            let mut tex = Vec::new();
            load_texels(&img, w, r, &mut tex);
            let inv = to_crop.inverse().unwrap();
            warp_cubic_body::<[f32], false>(&tex, r, (w, h), &inv, size, Tile::whole(size), &mut a[..]);
            assert_eq!(apart(&a), 0.0, "plain taps: angle {angle}, scale {scale}");
            #[cfg(target_arch = "x86_64")]
            if Cpu::detected().avx2() {
                // SAFETY: a `Cpu` says AVX2 only where this CPU has it.
                unsafe { warp_cubic_avx2(&tex, r, (w, h), &inv, size, Tile::whole(size), &mut a[..]) };
                assert_eq!(apart(&a), 0.0, "eight-lane taps: angle {angle}, scale {scale}");
            }
        }
        let field: Vec<f32> = (0..w * h * 3).map(|i| ((i * 31) % 97) as f32 - 48.5).collect();
        for k in 0..4000 {
            let (x, y) = ((k * 37 % 3400) as f32 * 0.1 - 5.0, (k * 53 % 2600) as f32 * 0.1 - 5.0);
            if !cubic3_inside(w, h, x, y) {
                continue;
            }
            let (x0, y0) = (x as usize, y as usize);
            let wt = cubic_weights4(f32x4::new([x - x0 as f32, y - y0 as f32, 0.0, 0.0])).map(|v| v.to_array());
            let t = cubic3_taps(&field, w, (x0, y0), wt.map(|v| v[0]), wt.map(|v| v[1])).to_array();
            assert_eq!([t[0], t[1], t[2]], sample_cubic3(&field, w, h, x, y), "at ({x}, {y})");
        }
    }

    /// Halving a region row by row gives the 2 x 2 means a pixel-by-pixel loop gives, odd
    /// edges included.
    #[test]
    fn halving_a_region_averages_its_blocks() {
        let (w, h) = (41usize, 30usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        for r in [Rect::new(3, 2, 40, 29), Rect::new(0, 0, 41, 30), Rect::new(5, 5, 6, 6)] {
            let mut out = Vec::new();
            let (hw, hh) = halve_region(&img, w, r, &mut out);
            assert_eq!((hw, hh), (r.width().div_ceil(2), r.height().div_ceil(2)));
            for y in 0..hh {
                for x in 0..hw {
                    let xs = [r.x0 + (2 * x).min(r.width() - 1), r.x0 + (2 * x + 1).min(r.width() - 1)];
                    let ys = [
                        r.y0 + (2 * y).min(r.height() - 1),
                        r.y0 + (2 * y + 1).min(r.height() - 1),
                    ];
                    for c in 0..3 {
                        let mut s = 0u32;
                        for yy in ys {
                            for xx in xs {
                                s += img[(yy * w + xx) * 3 + c] as u32;
                            }
                        }
                        assert_eq!(out[(y * hw + x) * 3 + c] as u32, (s + 2) / 4, "{r:?} ({x}, {y}) {c}");
                    }
                }
            }
        }
    }

    /// The change, four pixels at a time, is what the per-value formula gives, including a
    /// crop whose side is not a multiple of four and values the clamp cuts.
    /// Four values of a change in steps widened in vector registers are the values one by one,
    /// at both ends of the range and around zero.
    #[test]
    fn four_steps_at_once_are_the_steps_one_by_one() {
        let vals: Vec<i16> = [i16::MIN, -32640, -129, -1, 0, 1, 127, 32640, i16::MAX, 5, -7]
            .into_iter()
            .chain((0..200).map(|i| (i * 331 - 33000) as i16))
            .collect();
        for w in vals.windows(4) {
            let v: [i16; 4] = w.try_into().unwrap();
            assert_eq!(<i16 as Tap>::four(&v).to_array(), v.map(f32::from), "{v:?}");
        }
    }

    /// Every kernel of this file at every level the CPU runs gives, to the bit, what its plain
    /// body gives (the warp's taps: see the fast samplers' test).
    #[test]
    fn every_kernel_at_every_level_equals_its_plain_body() {
        let size = 70;
        let n = 3 * size * size;
        let crop: Vec<u8> = (0..n).map(|i| (i * 7919 % 251) as u8).collect();
        let out: Vec<f32> = (0..n).map(|i| ((i * 37) % 1001) as f32 / 480.0 - 1.04).collect();
        for cpu in Cpu::available() {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            assert_eq!(
                tensor_change(cpu, &out, &crop, size, &mut a),
                tensor_change_body(&out, &crop, size, &mut b)
            );
            assert_eq!(a, b, "{}", cpu.name());
            let (mut a, mut b) = (vec![0.0f32; n], vec![0.0f32; n]);
            crop_to_tensor(cpu, &crop, &mut a);
            crop_to_tensor_body(&crop, &mut b);
            assert_eq!(a, b, "{}", cpu.name());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            crop_luma_half(cpu, &crop, size, &mut a);
            crop_luma_half_body(&crop, size, &mut b);
            assert_eq!(a, b, "{}", cpu.name());
        }
    }

    /// The half-resolution luma of a crop is, to the bit, each 2 x 2 block's pixel-by-pixel
    /// sum (crops of a run, of runs and a remainder, and of an odd side).
    #[test]
    fn a_crops_half_luma_is_the_pixel_by_pixel_sum() {
        for size in [8usize, 130, 256, 11] {
            let (h, plane) = (size / 2, size * size);
            let crop: Vec<u8> = (0..3 * plane).map(|i| (i * 7919 % 251) as u8).collect();
            let mut out = Vec::new();
            crop_luma_half(Cpu::detected(), &crop, size, &mut out);
            let luma = |i: usize| {
                0.299 * f32::from(crop[i]) + 0.587 * f32::from(crop[plane + i]) + 0.114 * f32::from(crop[2 * plane + i])
            };
            for y in 0..h {
                for x in 0..h {
                    let (t, b) = (2 * y * size + 2 * x, (2 * y + 1) * size + 2 * x);
                    let s = luma(t) + luma(t + 1) + luma(b) + luma(b + 1);
                    assert_eq!(out[y * h + x], s * 0.25, "size {size}, cell ({x}, {y})");
                }
            }
        }
    }

    /// Every level to the model's input, eight at a time and the remainder, is the level's
    /// value one at a time.
    #[test]
    fn a_crop_to_the_models_input_is_each_levels_value() {
        let crop: Vec<u8> = (0..3 * 7 * 7 + 256).map(|i| (i * 37 % 256) as u8).collect();
        let mut t = vec![0.0f32; crop.len()];
        crop_to_tensor(Cpu::detected(), &crop, &mut t);
        for (&b, &v) in crop.iter().zip(&t) {
            assert_eq!(v, b as f32 * (1.0 / 127.5) - 1.0, "level {b}");
        }
    }

    /// An output value that is not finite, anywhere in the crop (a run's first, its last, the
    /// crop's last), makes the change no change.
    #[test]
    fn a_change_with_a_value_not_finite_is_refused() {
        let size = 9;
        let n = 3 * size * size;
        let given = vec![7u8; n];
        let mut out = Vec::new();
        assert!(tensor_change(
            Cpu::detected(),
            &vec![0.25f32; n],
            &given,
            size,
            &mut out
        ));
        for at in [0, 63, 64, size * size + 5, n - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut restored = vec![0.25f32; n];
                restored[at] = bad;
                assert!(
                    !tensor_change(Cpu::detected(), &restored, &given, size, &mut out),
                    "{bad} at {at}"
                );
            }
        }
    }

    /// A byte model's change and a float model's giving the same levels are the same steps.
    #[test]
    fn a_change_from_bytes_is_the_change_from_the_same_floats() {
        let size = 8;
        let n = 3 * size * size;
        let out: Vec<u8> = (0..n).map(|i| ((i * 97) % 256) as u8).collect();
        let given: Vec<u8> = (0..n).map(|i| ((i * 53) % 256) as u8).collect();
        let floats: Vec<f32> = out.iter().map(|&b| b as f32 / 127.5 - 1.0).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        bytes_change(&out, &given, size, &mut a);
        assert!(tensor_change(Cpu::detected(), &floats, &given, size, &mut b));
        assert_eq!(a, b);
    }

    #[test]
    fn a_change_into_a_used_buffer_is_the_change_into_a_fresh_one() {
        // Pooled buffers come back holding an earlier face's change (and are not zeroed).
        for size in [8usize, 9, 13] {
            let n = 3 * size * size;
            let out: Vec<u8> = (0..n).map(|i| ((i * 97) % 256) as u8).collect();
            let given: Vec<u8> = (0..n).map(|i| ((i * 53) % 256) as u8).collect();
            let floats: Vec<f32> = out.iter().map(|&b| b as f32 / 127.5 - 1.0).collect();
            let (mut fresh_f, mut fresh_b) = (Vec::new(), Vec::new());
            assert!(tensor_change(Cpu::detected(), &floats, &given, size, &mut fresh_f));
            bytes_change(&out, &given, size, &mut fresh_b);
            for used_len in [n, n + 50] {
                let mut used = vec![i16::MIN; used_len];
                assert!(tensor_change(Cpu::detected(), &floats, &given, size, &mut used));
                assert_eq!(used, fresh_f, "floats, size {size}, buffer of {used_len}");
                let mut used = vec![i16::MIN; used_len];
                bytes_change(&out, &given, size, &mut used);
                assert_eq!(used, fresh_b, "bytes, size {size}, buffer of {used_len}");
            }
        }
    }

    #[test]
    fn the_change_is_the_clamped_output_minus_the_input() {
        for size in [8usize, 7] {
            let n = 3 * size * size;
            let restored: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 40.0 - 1.26).collect();
            let given: Vec<u8> = (0..n).map(|i| ((i * 53) % 256) as u8).collect();
            let mut got = Vec::new();
            assert!(tensor_change(Cpu::detected(), &restored, &given, size, &mut got));
            let plane = size * size;
            let level = |v: f32| (v + 1.0) * 127.5;
            for i in 0..plane {
                for c in 0..3 {
                    let j = c * plane + i;
                    let float = level(restored[j]).clamp(0.0, 255.0) - f32::from(given[j]);
                    assert_eq!(got[3 * i + c], change_steps(float), "{i} {c}");
                    // The nearest step: within half of one (1/256 of a level) of the float.
                    let off = crate::kernels::change_levels(got[3 * i + c]) - float;
                    assert!(off.abs() <= 0.5 / crate::kernels::CHANGE_STEPS, "{i} {c}: {off}");
                }
            }
        }
    }

    #[test]
    fn tensor_round_trip_is_exact_for_u8_values() {
        let size = 4;
        let rgb: Vec<u8> = (0..size * size * 3).map(|i| (i * 5 % 256) as u8).collect();
        let mut t = vec![0.0; rgb.len()];
        warp_to_tensor(&rgb, size, size, &Affine::IDENTITY, size, &mut t);
        assert!(t.iter().all(|v| (-1.0..=1.0).contains(v)));
        let mut back = Vec::new();
        tensor_to_rgb(&t, size, &mut back);
        assert_eq!(back, rgb);
    }

    /// The byte path: a crop warped into bytes is the float crop rounded (within half a level,
    /// on every path: bicubic, area-filtered, clamped at the frame's edge), the model's input
    /// made from it is within half a level of the float crop, and a model that gives its input
    /// back changes nothing (within a thousandth of a level).
    #[test]
    fn a_crop_in_bytes_is_the_float_crop_within_half_a_level() {
        let (w, h, size) = (160usize, 120usize, 64usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        let tpl = template(size);
        // A small face (bicubic), a large one (area filter) and one over the frame's corner.
        for (eye, cx, cy) in [(12.0f32, 80.0f32, 60.0f32), (60.0, 80.0, 60.0), (20.0, 4.0, 4.0)] {
            let s = eye / (tpl[1][0] - tpl[0][0]);
            let lm = tpl.map(|[x, y]| [cx + s * (x - size as f32 / 2.0), cy + s * (y - size as f32 / 2.0)]);
            let to_crop = crate::geom::fit_similarity(&lm, &tpl);
            let region = crate::geom::crop_footprint(&to_crop, size, w, h);
            let (mut f, mut b) = (vec![0.0f32; 3 * size * size], vec![0u8; 3 * size * size]);
            let mut scratch = WarpScratch::at(Cpu::detected());
            warp_face(&img, (w, h), &to_crop, region, size, &mut f, &mut scratch);
            warp_face(&img, (w, h), &to_crop, region, size, &mut b, &mut scratch);
            let mut t = vec![0.0f32; f.len()];
            crop_to_tensor(Cpu::detected(), &b, &mut t);
            for ((x, y), z) in f.iter().zip(&b).zip(&t) {
                let level = (x + 1.0) * 127.5;
                assert!((level - f32::from(*y)).abs() <= 0.5 + 1e-3, "eye {eye}: {level} vs {y}");
                assert!(((z + 1.0) * 127.5 - level).abs() <= 0.5 + 1e-3);
            }
            let mut change = Vec::new();
            assert!(tensor_change(Cpu::detected(), &t, &b, size, &mut change));
            assert!(change.iter().all(|&v| v == 0), "eye {eye}");
        }
    }
}
