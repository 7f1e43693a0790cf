//! Reading a media file: in, an opened FFmpeg input; out, its packets one by one (each read
//! releasing the one before) and the first picture a decoder makes of a stream. What decoding,
//! the HDR probe, stills and the segment plan all read with.

use ffmpeg::util::frame::video::Video as VideoFrame;
use ffmpeg_next as ffmpeg;

/// Reads the next packet of `ictx` into `packet`, releasing the one `packet` held first.
///
/// `av_read_frame` leaves releasing the previous packet to the caller, and FFmpeg 5.1's (the
/// one Debian 12 ships) resets the packet without releasing it: a `Packet` reused across reads
/// leaked every packet of the file, audio included, so memory grew by the source's bit rate
/// for the whole run (0.03 MiB/s on the 854x480 clip of `scripts/bench-memory.sh`, 0.6 MiB/s
/// at 5 Mbit/s).
pub fn read_packet(
    ictx: &mut ffmpeg::format::context::Input,
    packet: &mut ffmpeg::Packet,
) -> Result<(), ffmpeg::Error> {
    // Dropping the old packet unreferences its buffer.
    *packet = ffmpeg::Packet::empty();
    packet.read(ictx)
}

/// The first picture `dec` decodes from stream `index` of `ictx`, reading at most `packets`
/// packets (the decoder drained at the end of the file); `None` when it gives none.
pub(crate) fn first_picture(
    ictx: &mut ffmpeg::format::context::Input,
    index: usize,
    dec: &mut ffmpeg::decoder::Video,
    packets: usize,
) -> Option<VideoFrame> {
    let (mut picture, mut packet) = (VideoFrame::empty(), ffmpeg::Packet::empty());
    for _ in 0..packets {
        if read_packet(ictx, &mut packet).is_err() {
            break;
        }
        if packet.stream() == index && dec.send_packet(&packet).is_ok() && dec.receive_frame(&mut picture).is_ok() {
            return Some(picture);
        }
    }
    dec.send_eof().ok()?;
    dec.receive_frame(&mut picture).ok().map(|()| picture)
}
