//! Every default of the tool, written once: in, nothing; out, the values the CLI shows in its
//! help, `config` fills in for what was not typed and the encoders use for what was left open.
//! It imports nothing, so every part may read it.

/// Crops per model call.
pub(crate) const BATCH: usize = 4;
/// Long side of the detection copy.
pub(crate) const DET_SIZE: usize = 640;
/// Minimum detector score.
pub(crate) const DET_THRESHOLD: f32 = 0.5;
/// Overlap above which two detections are one face.
pub(crate) const NMS_IOU: f32 = 0.3;
/// At most this many faces per frame (the best-scoring ones).
pub(crate) const MAX_FACES: usize = 32;
/// Full detection every this many frames (tracking in between).
pub(crate) const DETECT_EVERY: u32 = 5;
/// A tracked video's whole-frame passes run ahead of detection's chain (see
/// `pipeline::stages::pass_ahead`) on machines of at least this many pool threads: below, every
/// core is busy anyway, so taking the passes off the chain gains nothing.
pub(crate) const PASS_AHEAD_CORES: usize = 4;
/// At most this many sessions run the passes ahead: a pass costs about ten frames' worth of
/// the chain's own work (74 against 8 core-ms on the 2-core machine) and falls on one frame in
/// `DETECT_EVERY`, so three keep ahead of the chain with room to spare, and each session that
/// runs a pass holds about 45 MiB of arena.
pub(crate) const PASS_AHEAD_MAX: usize = 3;
/// Threads the decode stage's conversions through swscale (the detection copy: the picture
/// shrunk to the detector's size, every frame; the whole picture's RGB for a source not
/// converted region by region) are shared among on a machine of `pool_threads`: its one thread
/// alone below [`PASS_AHEAD_CORES`] (every core is busy anyway), else one for every four cores,
/// two to four. The detection copy is most of that stage's work (about 80 % on the 720p
/// sample): on its one thread it would cap a 16-core GPU host near 1,500 faces/s of a two-face
/// 720p clip.
pub(crate) fn convert_threads(pool_threads: usize) -> usize {
    if pool_threads >= PASS_AHEAD_CORES {
        (pool_threads / 4).clamp(2, 4)
    } else {
        1
    }
}

/// How much of the restored face is blended in.
pub(crate) const BLEND: f32 = 1.0;
/// The paste mask (`--mask`): the face's own outline from the mesh.
pub(crate) const MASK: &str = "mesh";
/// The colour fix (`--color-fix`): the original's low band kept.
pub(crate) const COLOR_FIX: &str = "wavelet";
/// The identity guard (`--identity-guard`): a track that would become someone else gets less
/// of the model's change.
pub(crate) const IDENTITY_GUARD: &str = "back-off";
/// The face mesh's presence probability below which a detection is dropped (MediaPipe's own
/// threshold).
pub(crate) const FACE_CHECK: f32 = 0.5;
/// Identity distance under which two faces are one person (`--face-distance`): dlib's usual
/// threshold for its 128-D descriptors (same person below it on 99.4 % of LFW's pairs).
pub(crate) const FACE_DISTANCE: f32 = 0.6;
/// What the paste keeps in front of faces (`--occlusion`): hands.
pub(crate) const OCCLUSION: &str = "hands";
/// The hand models (made by scripts/setup.sh from MediaPipe's palm detector and hand
/// landmarks): the palm detector first.
pub(crate) const HAND_MODELS: [&str; 2] = ["models/palm-detect.onnx", "models/hand-landmarks.onnx"];
/// The face-identity model (made by scripts/setup.sh from dlib's model).
pub(crate) const FACE_ID_MODEL: &str = "models/face-id.onnx";
/// BRISQUE's parameters for the quality figure (made by scripts/setup.sh from image-quality's).
pub(crate) const QUALITY_MODEL: &str = "models/brisque.json";
/// A detection scoring at least this is kept whatever the face mesh's presence: the mesh was
/// made for clear faces, and doubts the blurred, blocky and noisy ones a restorer exists for.
pub(crate) const CONFIDENT: f32 = 0.75;
/// A detection the mesh doubts (and the detector is not confident in) is kept in a video when it
/// scores at least this and at least [`SUPPORT_FRAMES`] detections that support it (itself
/// included if it can) lie where it lies within [`SUPPORT_REACH`] frames either side: a face
/// found again and again where it was is a face; texture the detector takes for one now and
/// then is not, and a detection under this score (a lowered `--det-threshold`) needs the mesh's
/// word. A detection supports when it scores at least this and the mesh took it for a face or
/// its five points are spread as a face's are ([`SUPPORT_EYES`], [`SUPPORT_MOUTH`]).
pub(crate) const SUPPORT_SCORE: f32 = 0.5;
/// A detection the mesh doubts supports the faces where it lies (see [`SUPPORT_SCORE`]) only
/// when its eyes lie at least this share of its box's width apart and its mouth corners at
/// least [`SUPPORT_MOUTH`]: the detector's five points on a face, however blurred, blocky,
/// noisy or turned, are spread as the face's are (eyes 0.35 to 0.52 of the box apart, mouth
/// corners 0.29 to 0.43, on 605 of 609 detections of real faces: the degraded clips of
/// `tests/suite/mesh.rs`, the portrait turned up to 75 degrees, the sample clips; the other four are
/// two frames of the 4 KB clip, which the frames around them keep, and a face rolled 60 degrees
/// that was dropped before as now), while on texture it huddles them in the box's middle (at
/// most 0.25 and 0.16 on 92 doubted detections of 13 Mandelbrot clips of several sizes,
/// colourings and zooms), whatever its score.
pub(crate) const SUPPORT_EYES: f32 = 0.3;
/// See [`SUPPORT_EYES`].
pub(crate) const SUPPORT_MOUTH: f32 = 0.22;
/// See [`SUPPORT_SCORE`].
pub(crate) const SUPPORT_FRAMES: usize = 2;
/// See [`SUPPORT_SCORE`].
pub(crate) const SUPPORT_REACH: u64 = 12;
/// Memory of the temporal filter of the model's change, in frames (0: off).
pub(crate) const TEMPORAL: f32 = 4.0;
/// Longest memory the temporal filter takes, in frames.
pub(crate) const TEMPORAL_MAX: f32 = 30.0;
/// Largest smoothing sigma, in frames.
pub(crate) const SMOOTH_MAX: f32 = 15.0;
/// Temporal smoothing of each tracked face's points: the Gaussian's sigma, in frames (0: off).
pub(crate) const SMOOTH: f32 = 6.0;
/// Length of a long video's segments, in seconds (`--segment`): each is restored on its own
/// (in parallel with `--jobs`, across machines with `batch --shard`) and kept when a run stops,
/// at the cost of a warm-up of about a hundred frames each (3 % at 25 frames/s).
pub const SEGMENT_SECONDS: f64 = 180.0;
/// Long videos: segments restored at once by one process (`--jobs`).
pub const SEGMENT_JOBS: u16 = 1;
/// The video encoder when none is given (a .webm output takes the first of `WEBM_CODECS`).
pub(crate) const CODEC: &str = "libx264";
/// x264/x265 constant rate factor.
pub(crate) const CRF: u32 = 18;
/// VP9's constant rate factor (its scale differs from x264's).
pub(crate) const CRF_VP9: u32 = 31;
/// x264/x265 preset.
pub(crate) const PRESET: &str = "medium";
/// `--quality` for JPEG and WebP outputs (1 to 100, higher is better).
pub(crate) const QUALITY: u32 = 92;
/// The default restorer: the official GPEN-BFR-512 if the user put it in models/ (nothing else:
/// a stand-in that restores nothing runs only when named).
pub(crate) const MODELS: [&str; 1] = ["models/GPEN-BFR-512.onnx"];
/// The CenterFace detector the set-up installs.
pub(crate) const DETECTOR: &str = "models/centerface.onnx";
/// The face mesh the set-up makes (MediaPipe's face landmark model as ONNX).
pub(crate) const MESH: &str = "models/face-mesh.onnx";

/// Most threads of a pool stage (alignment, paste): one per core up to this many. Past it the
/// stages around the model are no longer what limits a run, and each thread holds a frame.
pub(crate) const POOL_THREADS_MAX: usize = 16;

/// Allocations of at least this many bytes get pages of their own from the kernel (glibc's
/// `M_MMAP_THRESHOLD`, fixed so that it does not rise with the first large free): a partial
/// frame's whole-picture RGB buffer (6 MB at 1080p, made per frame) is then zero pages of which
/// only those under its faces are ever touched, and freeing it gives them back. Below it: the
/// crops, the model's changes and everything the pools keep.
pub const MMAP_THRESHOLD: usize = 4 << 20;

/// `bench`: counted runs per source, after one warm-up run.
pub const BENCH_REPEAT: usize = 2;
/// `bench`: frames a run restores when `--frames` is not given (10 s of the 25 fps samples).
pub const BENCH_FRAMES: u64 = 250;
/// `bench --ceiling-s`: how long each enhance-only run lasts at least, in seconds (a fast
/// model is timed long enough to be steady).
pub const BENCH_CEILING_S: f64 = 3.0;
/// `bench`: the sources timed when none are given (the set-up makes them).
pub const BENCH_SOURCES: [&str; 2] = ["samples/astronaut-1080p.mp4", "samples/group-1080p.mp4"];

/// `serve`: where it listens.
pub const LISTEN: &str = "127.0.0.1:8080";
/// `serve`: longest a face waits for others to fill its batch, in milliseconds.
pub const MAX_WAIT_MS: u64 = 5;
/// `serve`: requests accepted at once (waiting or being restored).
pub const QUEUE: usize = 64;
/// `serve`: largest request body, in megabytes.
pub const MAX_BODY_MB: u64 = 50;
/// `serve`: largest picture, in pixels, an upload's header may declare; its decoder is held to
/// it (`media::still_in`).
pub const MAX_PIXELS: u64 = 40_000_000;
/// Most bytes a still's decoder may allocate besides its picture, a row and a TIFF's strips
/// (`media::still_in`): a PNG's inflated ICC profile, left out past it. Real ICC profiles stay
/// far below it; PNG text is never inflated.
pub const MAX_METADATA_BYTES: u64 = 8 << 20;
/// `serve`: seconds a client has to send its headers and then its body.
pub const READ_TIMEOUT_S: u64 = 10;
/// `serve`: seconds from a request's arrival to its answer.
pub const DEADLINE_S: u64 = 30;

/// Largest job upload (`serve --max-job-mb`), in megabytes.
pub const MAX_JOB_MB: u64 = 4000;
/// Most the jobs folder holds (`serve --jobs-quota-gb`), in gigabytes.
pub const JOBS_QUOTA_GB: f64 = 50.0;
/// Hours a finished job is kept (`serve --job-ttl-h`).
pub const JOB_TTL_H: f64 = 24.0;
/// Jobs waiting or running at once (`serve --max-jobs`).
pub const MAX_JOBS: usize = 16;
/// Slowest average a job's upload may come at once `--read-timeout-s` has passed, KB a second
/// (256 kbit/s: a phone on a poor connection still uploads; a trickle is cut off).
pub const MIN_UPLOAD_KBS: u64 = 32;
/// Segment length of a job's film, in seconds (`serve --job-segment-s`): what a restart
/// resumes from, short enough that little is redone.
pub const JOB_SEGMENT_S: f64 = 30.0;

/// Seconds a replica's claim on a shared job or segment holds without renewal (`--job-lease-s`):
/// renewed every quarter of it, and a replica killed loses its work to the others this long after.
pub const JOB_LEASE_S: f64 = 30.0;

/// Finds a file the set-up installs (`models/...`): relative to the working directory, then to
/// the checkout the executable was built in (or the installed package it came in), then, for an
/// installed package, under the user's data folder (where `models fetch` puts downloads there).
pub fn find_asset(rel: &str) -> Option<std::path::PathBuf> {
    let here = std::path::PathBuf::from(rel);
    if here.exists() {
        return Some(here);
    }
    let exe = std::env::current_exe().ok()?;
    let beside = exe
        .ancestors()
        .skip(1)
        .take(4)
        .map(|d| d.join(rel))
        .find(|p| p.exists());
    beside.or_else(|| {
        package_root()?;
        user_dir("XDG_DATA_HOME", ".local/share")
            .map(|d| d.join(rel))
            .filter(|p| p.exists())
    })
}

/// The marker file of an installed package: the Python wheel's `gpen_video/PACKAGED`, one
/// folder above the executable's `bin/`.
pub const PACKAGE_MARKER: &str = "PACKAGED";

/// The folder of the installed package this executable runs from (`gpen_video/` in the Python
/// wheel, holding `bin/gpen-video`, the bundled models and [`PACKAGE_MARKER`]); `None` for a
/// build in a checkout. An installed package's own folders are not written to: downloads and
/// the user's models go to the XDG folders.
pub fn package_root() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let root = exe.parent()?.parent()?;
    root.join(PACKAGE_MARKER).is_file().then(|| root.to_path_buf())
}

/// A folder of the user's by the XDG base directories: `$VAR/gpen-video` (when `VAR` is set and
/// not empty), else `$HOME/HOME_REL/gpen-video`; `None` with neither. `var`: XDG_CONFIG_HOME
/// (`.config`), XDG_DATA_HOME (`.local/share`), XDG_STATE_HOME (`.local/state`).
pub fn user_dir(var: &str, home_rel: &str) -> Option<std::path::PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|d| !d.is_empty());
    match (nonempty(var), nonempty("HOME")) {
        (Some(d), _) => Some(std::path::PathBuf::from(d).join("gpen-video")),
        (None, Some(h)) => Some(std::path::PathBuf::from(h).join(home_rel).join("gpen-video")),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_detection_copy_is_shared_out_from_four_cores() {
        let threads = [2, 3, 4, 8, 12, 16, 64].map(super::convert_threads);
        assert_eq!(threads, [1, 1, 2, 2, 3, 4, 4]);
    }
}
