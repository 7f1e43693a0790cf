//! Faces: in, a frame's pictures; out, the faces found (detect), checked and outlined by the
//! face mesh (mesh), their points steadied over
//! time (smooth), whose they are (identity), the aligned crops (align), what the model changed in each (enhance) and that
//! change warped back into the frame under a mask (paste); the hands near each face, their
//! points and the region they cover, followed over time (hands).

pub(crate) mod align;
pub(crate) mod detect;
pub(crate) mod enhance;
pub(crate) mod hands;
pub(crate) mod identity;
pub(crate) mod mesh;
pub(crate) mod paste;
pub(crate) mod quality;
pub(crate) mod smooth;
pub(crate) mod temporal;
