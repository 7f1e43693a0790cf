//! gpen-video: restores faces in video with GPEN. In, a video file and ONNX models; out, the
//! same video with its faces restored. The binary (`main.rs`) is a thin CLI over `config`
//! (resolve), `engine` (loaded sessions, one job) and `pipeline` (run); see ARCHITECTURE.md.

pub mod align;
pub mod batch;
mod batch_job;
pub mod batch_report;
pub mod bench;
pub mod bench_images;
pub mod clips;
pub mod color;
pub mod compare;
pub mod config;
pub mod console;
pub mod decode;
pub mod detect;
pub mod encode;
pub mod engine;
pub mod enhance;
pub mod frame;
pub mod geom;
pub mod interrupt;
pub mod kind;
pub mod manifest;
pub mod orient;
pub mod output;
pub mod paste;
pub mod pipeline;
pub mod registry;
pub mod runtime;
pub mod smooth;
pub mod stats;
pub mod still;

/// Initialises FFmpeg once and keeps its own logging to errors.
pub fn init_ffmpeg() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ffmpeg_next::init();
        ffmpeg_next::util::log::set_level(ffmpeg_next::util::log::Level::Error);
    });
}
