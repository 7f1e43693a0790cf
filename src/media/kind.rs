//! Which kind of media a path names: in, a file path; out, whether it is a still image
//! gpen-video reads and writes, another image format, or else a video, by extension. Kept
//! apart from the still writer so the decoder and encoder can ask without depending on it.

use std::path::Path;

/// Extensions of the still images gpen-video reads and writes.
pub(crate) const STILL_EXTENSIONS: [&str; 7] = ["png", "jpg", "jpeg", "webp", "tif", "tiff", "bmp"];

/// Extensions of still-image formats it does not write (GIF is read as a video).
pub(crate) const OTHER_IMAGE_EXTENSIONS: [&str; 6] = ["gif", "jxl", "avif", "heic", "heif", "qoi"];

/// Extensions of pictures read as stills (into a still output) but not written: QOI (read by
/// `image`), AVIF, and HEIC/HEIF, which FFmpeg builds without HEIF support refuse with a
/// message saying so.
pub(crate) const STILL_INPUT_ONLY_EXTENSIONS: [&str; 4] = ["avif", "heic", "heif", "qoi"];

/// The extension of `path`, lower case ("" for none).
pub(crate) fn ext_of(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Whether `path` names a still image gpen-video handles (by its extension).
pub fn is_still(path: &Path) -> bool {
    STILL_EXTENSIONS.contains(&ext_of(path).as_str())
}

/// Whether input `path` is a still picture (one gpen-video writes, or QOI, AVIF or HEIC).
pub(crate) fn is_still_input(path: &Path) -> bool {
    is_still(path) || STILL_INPUT_ONLY_EXTENSIONS.contains(&ext_of(path).as_str())
}

/// Whether `path` names a still-image format gpen-video does not write (GIF, JPEG XL, AVIF,
/// HEIC, QOI).
pub(crate) fn is_other_image(path: &Path) -> bool {
    OTHER_IMAGE_EXTENSIONS.contains(&ext_of(path).as_str())
}
