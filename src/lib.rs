//! gpen-video: restores faces in video with GPEN. In, a video file and ONNX models; out, the
//! same video with its faces restored. The binary (`main.rs`) parses the command line, holds
//! each command's run policy (progress, segments, stats files) and drives `config` (resolve),
//! `engine` (loaded sessions, one job) and `pipeline` (run); see ARCHITECTURE.md.

pub mod batch;
pub mod bench;
pub mod budget;
pub mod config;
pub mod console;
pub mod defaults;
pub mod engine;
pub mod faces;
pub mod frame;
pub mod geom;
pub mod interrupt;
pub mod kernels;
pub mod media;
pub mod output;
pub mod parts;
pub mod people;
pub mod pipeline;
pub mod ready;
pub mod registry;
pub mod runtime;
pub mod segment;
pub mod serve;
pub mod stats;
pub mod treatment;

/// Initialises FFmpeg once and keeps its own logging to errors.
pub fn init_ffmpeg() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ffmpeg_next::init();
        ffmpeg_next::util::log::set_level(ffmpeg_next::util::log::Level::Error);
    });
}
