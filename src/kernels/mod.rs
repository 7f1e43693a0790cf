//! The kernels: in, slices and planes of pixels, crops and changes with a [`Cpu`] level; out,
//! the same data warped, converted, halved, averaged or added. Pure functions with a plain body
//! and, where it pays, vector forms chosen by the `Cpu` value (found once, in `cpu.rs`); they know
//! nothing of faces, frames or FFmpeg. faces/ and media/ hold the policy (which face, which crop,
//! which mask, which picture) and call down here.

pub mod bands;
pub mod cpu;
pub mod halve;
pub mod lowband;
pub mod sample;
pub mod steps;
pub mod tensor;
pub mod warp;
pub mod yuv;

pub use cpu::Cpu;
pub use steps::{change_levels, change_steps, round_steps, CHANGE_STEPS};
