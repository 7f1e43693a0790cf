//! Media files: in, a source path (video or still) and encoder settings; out, decoded frames
//! with their pictures, and encoded output files (videos with their side streams, stills).
//! Everything that touches pictures and colour lives here: FFmpeg's, and the stills `image`
//! reads (`still_in`).

pub(crate) mod color;
pub(crate) mod compare;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod hdr;
pub(crate) mod input;
pub(crate) mod kind;
pub(crate) mod orient;
pub(crate) mod packets;
pub(crate) mod read;
pub(crate) mod sniff;
pub(crate) mod still;
pub(crate) mod still_in;
