//! Odd but valid files from strangers: in, files FFmpeg makes the way people make them
//! (stream-copied trims with edit lists, pictures with alpha, chapters, interlaced video, audio
//! with cover art) and damaged or unusual pictures; out, assertions that each valid file is
//! restored with what it holds kept (or a warning naming what is not), and that each bad one
//! gets a message naming its real cause.

mod common;

use std::path::Path;

use common::*;

fn ffmpeg(args: &[&str]) {
    let mut all = vec!["-v", "error", "-y"];
    all.extend_from_slice(args);
    tool("ffmpeg", &all);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A stream-copied trim (`-ss 0.37 -t 1.2 -c copy`, which writes an edit list whose start is
/// not a keyframe) restores: the frames FFmpeg shows, with their timestamps, and the audio.
/// A file genuinely cut short is still called truncated (bad_inputs_fail_clearly_... in e2e).
#[test]
fn a_stream_copied_trim_with_an_edit_list_restores_as_ffmpeg_decodes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (trim, out) = (dir.path().join("trim.mp4"), dir.path().join("out.mp4"));
    let src = asset("samples/test/astronaut.mp4");
    ffmpeg(&["-ss", "0.37", "-i", s(&src), "-t", "1.2", "-c", "copy", s(&trim)]);
    let err = ok(&gpen(&[
        &trim,
        &out,
        &"--model",
        &asset("models/standin/identity-256.onnx"),
    ]));
    assert!(!err.contains("truncated"), "{err}");
    let (pin, pout) = (video_pts(&trim), video_pts(&out));
    assert!(pin.len() > 20, "{pin:?}");
    assert_eq!(pin.len(), pout.len(), "frame count as FFmpeg decodes the trim");
    assert_eq!(time_base(&trim), time_base(&out));
    assert_eq!(pin, pout, "timestamps");
    assert_eq!(packet_md5(&trim, "0:a"), packet_md5(&out, "0:a"), "audio");
}
