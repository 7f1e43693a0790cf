//! HDR10 static metadata kept through a re-encode: in, a source's stream side data or, where
//! the metadata travels only in the bitstream (x265's SEI), the side data of its first decoded
//! frame; out, the mastering display and content light levels as x265's and x264's own
//! parameters, so the encoder writes them into the output's bitstream again.

use ffmpeg_next as ffmpeg;

/// A mastering display: its primaries and white point in CIE 1931 xy, units of 0.00002, and
/// its luminance range in units of 0.0001 cd/m² (the units x264 and x265 take).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mastering {
    pub red: (u64, u64),
    pub(crate) green: (u64, u64),
    pub blue: (u64, u64),
    pub white: (u64, u64),
    /// (max, min).
    pub(crate) luminance: (u64, u64),
}

/// A source's HDR10 static metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Hdr10 {
    pub(crate) mastering: Option<Mastering>,
    /// Maximum content light level and maximum frame-average light level, cd/m².
    pub light: Option<(u32, u32)>,
}

/// `AVMasteringDisplayMetadata` of libavutil/mastering_display_metadata.h (its bindings are
/// not generated), field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct AvMastering {
    display_primaries: [[ffmpeg::ffi::AVRational; 2]; 3],
    white_point: [ffmpeg::ffi::AVRational; 2],
    min_luminance: ffmpeg::ffi::AVRational,
    max_luminance: ffmpeg::ffi::AVRational,
    has_primaries: i32,
    has_luminance: i32,
}

/// `AVContentLightMetadata` of the same header.
#[repr(C)]
#[derive(Clone, Copy)]
struct AvLight {
    max_cll: u32,
    max_fall: u32,
}

/// A rational scaled to `unit`s, rounded (0 for an empty one).
fn scaled(r: ffmpeg::ffi::AVRational, unit: i64) -> u64 {
    if r.den == 0 || r.num < 0 {
        return 0;
    }
    ((i64::from(r.num) * unit + i64::from(r.den) / 2) / i64::from(r.den)) as u64
}

impl Hdr10 {
    /// The mastering display in an `AVMasteringDisplayMetadata`'s bytes; `None` when they are
    /// too few or say it has no primaries or no luminance.
    fn mastering_of(bytes: &[u8]) -> Option<Mastering> {
        if bytes.len() < std::mem::size_of::<AvMastering>() {
            return None;
        }
        // SAFETY: the bytes hold a whole AVMasteringDisplayMetadata (length checked), a plain
        // struct of integers, read unaligned.
        let m = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const AvMastering) };
        if m.has_primaries == 0 || m.has_luminance == 0 {
            return None;
        }
        let xy = |p: [ffmpeg::ffi::AVRational; 2]| (scaled(p[0], 50_000), scaled(p[1], 50_000));
        // FFmpeg keeps the primaries in red, green, blue order.
        Some(Mastering {
            red: xy(m.display_primaries[0]),
            green: xy(m.display_primaries[1]),
            blue: xy(m.display_primaries[2]),
            white: xy(m.white_point),
            luminance: (scaled(m.max_luminance, 10_000), scaled(m.min_luminance, 10_000)),
        })
    }

    /// The light levels in an `AVContentLightMetadata`'s bytes.
    fn light_of(bytes: &[u8]) -> Option<(u32, u32)> {
        if bytes.len() < std::mem::size_of::<AvLight>() {
            return None;
        }
        // SAFETY: as above, a whole AVContentLightMetadata of two unsigned integers.
        let l = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const AvLight) };
        Some((l.max_cll, l.max_fall))
    }

    fn is_empty(&self) -> bool {
        self.mastering.is_none() && self.light.is_none()
    }

    /// The metadata of stream `index` of `ictx` (whose parameters are `params`): its stream
    /// side data, else, for a PQ or HLG video, its first frame's (decoded from the first
    /// packets; `ictx` is left read). `None` for a source without any.
    pub(crate) fn probe(
        ictx: &mut ffmpeg::format::context::Input,
        index: usize,
        params: &ffmpeg::codec::Parameters,
    ) -> Option<Hdr10> {
        use ffmpeg::codec::packet::side_data::Type;
        let mut hdr = Hdr10::default();
        for sd in ictx.stream(index)?.side_data() {
            match sd.kind() {
                Type::MasteringDisplayMetadata => hdr.mastering = Self::mastering_of(sd.data()),
                Type::ContentLightLevel => hdr.light = Self::light_of(sd.data()),
                _ => {}
            }
        }
        if !hdr.is_empty() {
            return Some(hdr);
        }
        // SAFETY: `params` holds valid codec parameters; `color_trc` is a plain field.
        let trc = unsafe { (*params.as_ptr()).color_trc };
        use ffmpeg::ffi::AVColorTransferCharacteristic::{AVCOL_TRC_ARIB_STD_B67, AVCOL_TRC_SMPTE2084};
        if !matches!(trc, AVCOL_TRC_SMPTE2084 | AVCOL_TRC_ARIB_STD_B67) {
            return None;
        }
        let frame = first_frame(ictx, index, params)?;
        if let Some(sd) = frame.side_data(ffmpeg::frame::side_data::Type::MasteringDisplayMetadata) {
            hdr.mastering = Self::mastering_of(sd.data());
        }
        if let Some(sd) = frame.side_data(ffmpeg::frame::side_data::Type::ContentLightLevel) {
            hdr.light = Self::light_of(sd.data());
        }
        (!hdr.is_empty()).then_some(hdr)
    }

    /// The mastering display as x264 and x265 write it: `G(x,y)B(x,y)R(x,y)WP(x,y)L(max,min)`.
    fn display(m: &Mastering) -> String {
        format!(
            "G({},{})B({},{})R({},{})WP({},{})L({},{})",
            m.green.0,
            m.green.1,
            m.blue.0,
            m.blue.1,
            m.red.0,
            m.red.1,
            m.white.0,
            m.white.1,
            m.luminance.0,
            m.luminance.1
        )
    }

    /// The encoder option and its value that make `codec` write this metadata into its
    /// bitstream (x265's `master-display` and `max-cll`, x264's `mastering-display` and
    /// `cll`); `None` for an encoder that takes neither.
    pub(crate) fn encoder_params(&self, codec: &str) -> Option<(&'static str, String)> {
        let (key, display, light) = match codec {
            "libx265" => ("x265-params", "master-display", "max-cll"),
            "libx264" | "libx264rgb" => ("x264-params", "mastering-display", "cll"),
            _ => return None,
        };
        let mut parts = Vec::new();
        if let Some(m) = &self.mastering {
            parts.push(format!("{display}={}", Self::display(m)));
        }
        if let Some((cll, fall)) = self.light {
            parts.push(format!("{light}={cll},{fall}"));
        }
        Some((key, parts.join(":")))
    }
}

/// The first frame decoded from stream `index` of `ictx`, within its first 64 packets.
fn first_frame(
    ictx: &mut ffmpeg::format::context::Input,
    index: usize,
    params: &ffmpeg::codec::Parameters,
) -> Option<ffmpeg::frame::Video> {
    let mut dec = ffmpeg::codec::context::Context::from_parameters(params.clone())
        .ok()?
        .decoder()
        .video()
        .ok()?;
    crate::media::read::first_picture(ictx, index, &mut dec, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_written_in_each_encoders_words() {
        let hdr = Hdr10 {
            mastering: Some(Mastering {
                red: (34000, 16000),
                green: (13250, 34500),
                blue: (7500, 3000),
                white: (15635, 16450),
                luminance: (10_000_000, 1),
            }),
            light: Some((1000, 400)),
        };
        let display = "G(13250,34500)B(7500,3000)R(34000,16000)WP(15635,16450)L(10000000,1)";
        assert_eq!(
            hdr.encoder_params("libx265"),
            Some(("x265-params", format!("master-display={display}:max-cll=1000,400")))
        );
        assert_eq!(
            hdr.encoder_params("libx264"),
            Some(("x264-params", format!("mastering-display={display}:cll=1000,400")))
        );
        assert_eq!(hdr.encoder_params("libvpx-vp9"), None);
        let r = |num, den| ffmpeg::ffi::AVRational { num, den };
        assert_eq!(scaled(r(34000, 50000), 50_000), 34000);
        assert_eq!(scaled(r(1, 10000), 10_000), 1);
        assert_eq!(scaled(r(1, 0), 10_000), 0);
    }
}
