//! Which kind of media a path names: in, a file path; out, whether it is a still image
//! gpen-video reads and writes, another image format, or else a video, by extension. Kept
//! apart from the still writer so the decoder and encoder can ask without depending on it.

use std::path::Path;

/// Extensions of the still images gpen-video reads and writes.
pub const STILL_EXTENSIONS: [&str; 7] = ["png", "jpg", "jpeg", "webp", "tif", "tiff", "bmp"];

/// Extensions of still-image formats it neither reads nor writes as stills.
pub const OTHER_IMAGE_EXTENSIONS: [&str; 3] = ["gif", "jxl", "avif"];

/// The extension of `path`, lower case ("" for none).
pub fn ext_of(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Whether `path` names a still image gpen-video handles (by its extension).
pub fn is_still(path: &Path) -> bool {
    STILL_EXTENSIONS.contains(&ext_of(path).as_str())
}

/// Whether `path` names another still-image format (GIF, JPEG XL, AVIF).
pub fn is_other_image(path: &Path) -> bool {
    OTHER_IMAGE_EXTENSIONS.contains(&ext_of(path).as_str())
}
