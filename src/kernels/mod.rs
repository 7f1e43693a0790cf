//! The kernels: in, slices and planes of pixels, crops and changes with a [`Cpu`] level; out,
//! the same data warped, converted, halved, averaged or added. Pure functions with a plain body
//! and, where it pays, vector forms chosen by the `Cpu` value (found once, in `cpu.rs`); they know
//! nothing of faces, frames or FFmpeg. faces/ and media/ hold the policy (which face, which crop,
//! which mask, which picture) and call down here.

pub(crate) mod bands;
pub(crate) mod cpu;
pub(crate) mod crop;
pub(crate) mod halve;
pub(crate) mod lowband;
pub(crate) mod sample;
pub(crate) mod steps;
pub(crate) mod tensor;
pub(crate) mod twopass;
pub(crate) mod warp;
pub(crate) mod yuv;

pub use cpu::Cpu;
pub use steps::change_steps;
pub(crate) use steps::{change_levels, round_steps, round_steps_within, CHANGE_STEPS};
