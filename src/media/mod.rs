//! Media files: in, a source path (video or still) and encoder settings; out, decoded frames
//! with their pictures, and encoded output files (videos with their side streams, stills).
//! Everything that touches pictures and colour lives here: FFmpeg's, and the stills `image`
//! reads (`still_in`).

pub mod color;
pub mod compare;
pub mod decode;
pub mod encode;
pub mod hdr;
pub mod input;
pub mod kind;
pub mod orient;
pub mod packets;
pub mod read;
pub mod sniff;
pub mod still;
pub mod still_in;
