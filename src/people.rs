//! The people a user names: in, reference photos (`--only-face`, `--skip-face`), the detector and
//! the identity model; out, each photo's identity descriptor (its largest face), or an error
//! naming the photo and what to do, before any frame of a job is decoded.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use crate::faces::detect::{det_size, Detector};
use crate::faces::identity::{chip, Descriptor, Identifier};
use crate::frame::{Face, Pool};
use crate::geom::Rect;
use crate::kernels::warp::WarpScratch;

/// A reference photo's descriptor, and how many faces it held (the largest is the one taken).
pub struct Reference {
    pub descriptor: Descriptor,
    pub faces: usize,
}

/// Decodes the picture `path` and finds its faces: its packed RGB24, width and height, and the
/// faces, largest first.
pub fn faces_in_photo(path: &Path, detector: &mut Detector) -> Result<(Vec<u8>, usize, usize, Vec<Face>)> {
    let info = crate::media::decode::probe(path)
        .with_context(|| format!("reference photo {}: not a picture FFmpeg reads", path.display()))?;
    let (w, h) = (info.width, info.height);
    let size = det_size(w, h, crate::defaults::DET_SIZE);
    let decoder = crate::media::decode::Decoder::new(info, size, false);
    let (rgb_pool, det_pool) = (Pool::new(1), Pool::new(1));
    let mut picture = None;
    decoder
        .run((&rgb_pool, &det_pool), Some(1), |mut f| {
            let whole = Rect::new(0, 0, f.width, f.height);
            crate::media::color::ensure_rgb(&mut f, whole);
            picture = Some((f.rgb, f.det, f.det_size));
            false
        })
        .with_context(|| format!("reference photo {}", path.display()))?;
    let (rgb, det, det_dims) =
        picture.ok_or_else(|| anyhow!("reference photo {}: no picture in it", path.display()))?;
    detector.start(det_dims);
    let mut faces = detector.detect(&det, w, h, 0)?;
    detector.reset();
    let area = |f: &Face| (f.bbox[2] - f.bbox[0]) * (f.bbox[3] - f.bbox[1]);
    faces.sort_by(|a, b| area(b).total_cmp(&area(a)));
    Ok((rgb, w, h, faces))
}

/// The descriptor of the person in the reference photo `path`: its largest face's. A photo
/// without a face is an error naming it.
pub fn reference(path: &Path, detector: &mut Detector, identifier: &mut Identifier) -> Result<Reference> {
    let (rgb, w, h, faces) = faces_in_photo(path, detector)?;
    let Some(face) = faces.first() else {
        bail!(
            "reference photo {}: no face found in it; give a photo where the person's face is clear and at least 40 pixels tall",
            path.display()
        );
    };
    let mut scratch = WarpScratch::default();
    let c = chip(&rgb, (w, h), &face.landmarks, &mut scratch);
    let descriptor = identifier.describe(&[&c])?[0];
    Ok(Reference {
        descriptor,
        faces: faces.len(),
    })
}
