//! Faces: in, a frame's pictures; out, the faces found (detect), checked and outlined by the
//! face mesh (mesh), their points steadied over
//! time (smooth), whose they are (identity), the aligned crops (align), what the model changed in each (enhance) and that
//! change warped back into the frame under a mask (paste); the hands near each face, their
//! points and the region they cover, followed over time (hands).

pub mod align;
pub mod detect;
pub mod enhance;
pub mod hands;
pub mod identity;
pub mod mesh;
pub mod paste;
pub mod quality;
pub mod smooth;
pub mod temporal;
