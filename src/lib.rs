//! gpen-video: restores faces in video with GPEN. In, a video file and ONNX models; out, the
//! same video with its faces restored. The binary (`main.rs`) parses the command line, holds
//! each command's run policy (progress, segments, stats files) and drives `config` (resolve),
//! `engine` (loaded sessions, one job) and `pipeline` (run); see ARCHITECTURE.md. What is
//! public is `api` (the names `main.rs`, the tests and the benches use), `defaults` and
//! `init_ffmpeg`; every other module is the crate's own.
#![warn(unreachable_pub)]

pub mod api;
mod batch;
mod bench;
mod budget;
mod config;
mod console;
pub mod defaults;
mod engine;
mod faces;
mod frame;
mod geom;
mod interrupt;
mod kernels;
mod media;
mod output;
mod parts;
mod people;
mod pipeline;
mod ready;
mod registry;
mod runtime;
mod segment;
mod serve;
mod stats;
mod treatment;

/// Initialises FFmpeg once and keeps its own logging to errors.
pub fn init_ffmpeg() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ffmpeg_next::init();
        ffmpeg_next::util::log::set_level(ffmpeg_next::util::log::Level::Error);
    });
}
