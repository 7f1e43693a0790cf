//! Demuxed packets are released: in, the test clip (video and audio) read packet by packet
//! through `decode::read_packet`; out, whether FFmpeg still holds each packet once the next one
//! is read (a packet reused without release leaked the whole compressed file over a run, a
//! growth the Rust-heap count of tests/alloc.rs cannot see).

use crate::common;

use ffmpeg::codec::packet::Ref;
use ffmpeg::ffi;
use ffmpeg_next as ffmpeg;
use gpen_video::api::media::decode::read_packet;

#[test]
fn reading_a_packet_releases_the_one_before() {
    gpen_video::init_ffmpeg();
    let path = common::asset("samples/test/astronaut.mp4");
    let mut ictx = ffmpeg::format::input(&path).unwrap();
    let mut packet = ffmpeg::Packet::empty();
    let mut streams = std::collections::BTreeSet::new();
    let mut kept = Vec::new();
    for _ in 0..40 {
        read_packet(&mut ictx, &mut packet).unwrap();
        streams.insert(packet.stream());
        // SAFETY: a demuxed packet is reference-counted, so `buf` is a live buffer reference;
        // we take one of our own and read its count while it is held.
        let (mut held, before) = unsafe {
            let buf = (*packet.as_ptr()).buf;
            assert!(!buf.is_null(), "demuxed packets are reference-counted");
            let held = ffi::av_buffer_ref(buf);
            assert!(!held.is_null());
            (held, ffi::av_buffer_get_ref_count(held))
        };
        read_packet(&mut ictx, &mut packet).unwrap();
        // SAFETY: `held` is our own reference, released exactly once here.
        let after = unsafe {
            let n = ffi::av_buffer_get_ref_count(held);
            ffi::av_buffer_unref(&mut held);
            n
        };
        kept.push(after - (before - 1));
    }
    assert!(
        streams.len() >= 2,
        "the clip's audio and video were both read: {streams:?}"
    );
    // Each count is how many references to a packet were still held after the next read, besides
    // ours: 0 when it was released.
    assert!(
        kept.iter().all(|&k| k == 0),
        "packets still referenced after the next read: {kept:?}"
    );
}
