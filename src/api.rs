//! The library's public face: in, nothing; out, the names the command line (`main.rs`), the
//! integration tests and the benches use, re-exported from the crate's own modules (which are
//! private, their items `pub(crate)`). Each submodule keeps its module's name, so
//! `gpen_video::api::faces::hands::Hands` is `crate::faces::hands::Hands` inside. A name used
//! from outside the crate is added here; nothing else is public.

/// Resolving a run's settings from the command line's options.
pub mod config {
    pub use crate::config::{find_asset, resolve, Device, Options, Settings, Treatment};
}

/// The terminal: lines that keep clear of progress bars, and the log's writer.
pub mod console {
    pub use crate::console::{eprint_line, log_fields, print_text, LogWriter};
}

/// A loaded engine's job and its cancel switch.
pub mod engine {
    pub use crate::engine::{CancelToken, Job};
}

/// Ctrl-C and SIGTERM.
pub mod interrupt {
    pub use crate::interrupt::{exit_code_if_stopped, install, Interrupts};
}

/// One job run through the pipeline.
pub mod pipeline {
    pub use crate::pipeline::{run, Progress};
}

/// Output files written whole or not at all.
pub mod output {
    pub use crate::output::{bytes_under, check_side_output, write_atomic};
}

/// The start-up check.
pub mod ready {
    pub use crate::ready::{check, describe_photos};
}

/// Long videos in segments.
pub mod segment {
    pub use crate::segment::{describe, run, work_dir, FileClaims, Share, Work};
    /// Where the segments fall.
    pub mod plan {
        pub use crate::segment::plan::Segment;
    }
}

/// Folders of clips.
pub mod batch {
    pub use crate::batch::{run, BatchOptions};
    /// The batch's manifest.
    pub mod manifest {
        pub use crate::batch::manifest::settings_hash;
    }
}

/// `gpen-video bench`.
pub mod bench {
    pub use crate::bench::{run, BenchOptions, Stage};
    /// Stills in batches.
    pub mod portraits {
        pub use crate::bench::portraits::{run, PortraitOptions, DEFAULT_BATCHES, DEFAULT_IMAGES};
    }
}

/// The service.
pub mod serve {
    pub use crate::serve::{run, ServeOptions};
    /// Video jobs.
    pub mod jobs {
        pub use crate::serve::jobs::{default_dir, JobsOptions};
    }
}

/// The model registry: `gpen-video models`, fetching and verifying.
pub mod registry {
    pub use crate::registry::{
        fetch, fetch_entry, fetch_url, registry, resolve, resolve_model, run, verify_path, Checksum, Entry, ModelFacts,
        ModelsCmd, Registry, Source, STALL_ENV,
    };
}

/// ONNX Runtime sessions.
pub mod runtime {
    pub use crate::runtime::{cpu_session, session, SessionOptions, Target};
}

/// Whose faces: describing people in photos.
pub mod people {
    pub use crate::people::{faces_in_photo, identity_of, reference};
}

/// Frames and the faces found in them.
pub mod frame {
    pub use crate::frame::{Face, FaceJob, Frame, Pool};
}

/// Geometry: rectangles and the face's transform.
pub mod geom {
    pub use crate::geom::{crop_footprint, fit_similarity, Affine, Rect};
}

/// The CPU's kernels.
pub mod kernels {
    pub use crate::kernels::{change_steps, Cpu};
    /// Removing the change's low band.
    pub mod lowband {
        pub use crate::kernels::lowband::{remove_low_band, LowBand};
    }
    /// The crop into the model's tensor.
    pub mod tensor {
        pub use crate::kernels::tensor::crop_to_tensor;
    }
    /// The face's warp.
    pub mod warp {
        pub use crate::kernels::warp::{warp_face, warp_to_tensor, WarpScratch};
    }
}

/// Video and stills in and out.
pub mod media {
    /// Colour conversion.
    pub mod color {
        pub use crate::media::color::{ensure_rgb, into_rgb};
    }
    /// Decoding.
    pub mod decode {
        pub use crate::media::decode::{probe, probe_memory, read_packet, Decoder, SourceInfo};
    }
    /// Encoding.
    pub mod encode {
        pub use crate::media::encode::EncodeSettings;
    }
    /// Opening inputs, from a path or from memory.
    pub mod input {
        pub use crate::media::input::{open_input, open_source};
    }
    /// Which files are stills.
    pub mod kind {
        pub use crate::media::kind::is_still;
    }
    /// Turning frames upright.
    pub mod orient {
        pub use crate::media::orient::turn_frame;
    }
    /// Writing stills.
    pub mod still {
        pub use crate::media::still::{StillWriter, Writer};
    }
}

/// The faces' stages, one by one.
pub mod faces {
    /// The FFHQ template.
    pub mod align {
        pub use crate::faces::align::{template, Template};
    }
    /// CenterFace.
    pub mod detect {
        pub use crate::faces::detect::Detector;
    }
    /// The restorer's sessions.
    pub mod enhance {
        pub use crate::faces::enhance::{Enhancer, Restored};
    }
    /// Hands in front of faces.
    pub mod hands {
        pub use crate::faces::hands::{Hand, HandTracker, Hands, POINTS};
    }
    /// Identity.
    pub mod identity {
        pub use crate::faces::identity::{distance, Identifier};
    }
    /// The paste.
    pub mod paste {
        pub use crate::faces::paste::{changes, Mask, Paste, Scratch};
    }
    /// BRISQUE.
    pub mod quality {
        pub use crate::faces::quality::{Brisque, QualityScratch, BRISQUE_MODEL};
    }
    /// The temporal filter.
    pub mod temporal {
        pub use crate::faces::temporal::Temporal;
    }
}
