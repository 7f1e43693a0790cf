//! The end-to-end tests, one test binary: each module is what was once a file of its own under
//! `tests/` (its doc comment says what it proves), and `common` the helpers they share. One
//! binary links the crate once instead of once per file, and its tests run side by side across
//! modules (each test's clips, folders and loopback ports are its own). `tests/alloc.rs` stays a
//! binary apart: it counts the whole process's heap under its own allocator.
//!
//! One module's tests: `cargo test --release --test suite -- e2e::`; one test:
//! `cargo test --release --test suite -- --exact e2e::NAME`.

mod common;

mod batch;
mod cli;
mod colour;
mod docs;
mod e2e;
mod faithful;
mod hands;
mod identity;
mod inputs;
mod jobs;
mod jobs_hostile;
mod jobs_ux;
mod memory_io;
mod mesh;
mod models_add;
mod occlusion;
mod odd_files;
mod packets;
mod people;
mod quality;
mod refused;
mod registry;
mod replicas;
mod restorers;
mod segments;
mod serve;
mod steady;
mod stills;
mod temporal;
mod wheel;
mod workers;
