//! The treatment: in, the flags that change what a job writes (parsed by clap from this one
//! declaration); out, one checked value, `Treatment`, that jobs and engines hold whole (an
//! `Arc`) and every stage reads its part of.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::defaults;
use crate::faces::detect::DetectSettings;
use crate::faces::paste::MaskKind;
use crate::frame::{Compare, View};
use crate::media::encode::check_encoder;
use crate::media::encode::EncodeSettings;

/// How every frame of a job is treated: all that changes what a job writes, besides its input
/// and the model, detector and mesh files. Each field is its own command-line flag (its help is
/// the doc comment, its default in `defaults.rs`), checked once by [`Treatment::check`], and
/// carried whole (an `Arc`, in every `Job`) to the stages, which read what they need from it;
/// the manifest's hash covers every field by itself. A new option that changes the output is a
/// field here, its default, the stage that acts on it and its line in the hash test's `FLAGS`.
#[derive(Clone, Debug, PartialEq, Serialize, clap::Args)]
pub struct Treatment {
    /// Face crops per model call, gathered across consecutive frames (a model with a fixed
    /// batch dimension runs its own size).
    #[arg(long, value_name = "N", default_value_t = defaults::BATCH,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256), help_heading = "Model")]
    pub batch: usize,
    /// Half precision: TensorRT's fp16 mode with --trt, else the model must be an fp16 export.
    #[arg(long, help_heading = "Model")]
    pub fp16: bool,
    /// Fidelity of a model that takes one (CodeFormer's weight): 0 restores the most (invents
    /// the most detail), 1 keeps the most of the face as it is. Without it such a model gets
    /// 0.5; a model without a fidelity input refuses it.
    #[arg(long, value_name = "0..1", help_heading = "Model")]
    pub fidelity: Option<f32>,
    #[command(flatten)]
    pub detection: DetectSettings,
    #[command(flatten)]
    pub(crate) selection: crate::faces::identity::Selection,
    /// How much of the restored face to blend in: 0 keeps the original, 1 the restored face.
    #[arg(long, default_value_t = defaults::BLEND, value_name = "0..1", help_heading = "Output")]
    pub blend: f32,
    /// Temporal smoothing of each tracked face's points before alignment: the Gaussian's sigma
    /// in frames (the output runs 2 sigma frames behind the detector). 0 turns it off.
    #[arg(long, default_value_t = defaults::SMOOTH, value_name = "FRAMES", help_heading = "Output")]
    pub smooth: f32,
    /// Paste mask: `mesh` (each face's own outline from the face mesh, forehead to chin; the
    /// ellipse without a mesh), `face` (an ellipse over face, forehead and hairline placed by
    /// the template) or `box` (the whole crop). All feathered.
    #[arg(long, default_value = defaults::MASK, value_enum, help_heading = "Output")]
    pub mask: MaskKind,
    /// Colour kept: `wavelet` pastes the restorer's detail over the original's colour and
    /// brightness (the low band of a Haar wavelet pyramid of the crop, 8 x 8 cells, is the
    /// original's), so a restorer that casts colour or relights does not pass it into the
    /// picture; `off` pastes the restorer's change as it gave it.
    #[arg(long, value_name = "METHOD", default_value = defaults::COLOR_FIX, value_enum, help_heading = "Output")]
    pub color_fix: crate::faces::paste::ColorFix,
    /// What happens to a track whose restored faces would no longer be the same person (their
    /// identity descriptors --face-distance or farther from the original's, measured on a few
    /// of its views): `back-off` gives it less of the model's change, step by step, until it is
    /// the same person again (or leaves it as it was), and warns naming it; `warn` only warns;
    /// `off` measures nothing.
    #[arg(long, value_name = "MODE", default_value = defaults::IDENTITY_GUARD, value_enum, help_heading = "Faces")]
    pub identity_guard: crate::faces::identity::Guard,
    /// What the paste keeps in front of a face: `hands` finds the hands near each face
    /// (MediaPipe's palm detector and hand landmarks) and keeps the original picture where they
    /// lie, feathered; `off` pastes the restored face over whatever is in front of it. Without
    /// the hand models (scripts/setup.sh makes them) a run says so once and runs as `off`.
    #[arg(long, value_name = "MODE", default_value = defaults::OCCLUSION, value_enum, help_heading = "Faces")]
    pub occlusion: crate::faces::hands::Occlusion,
    /// Drop a detection when the face mesh's face-presence probability is below this (0 keeps
    /// every detection).
    #[arg(long, value_name = "0..1", default_value_t = defaults::FACE_CHECK, help_heading = "Detection")]
    pub face_check: f32,
    /// Temporal filter of the model's change: how many frames of detail it averages along each
    /// face's track (where the face's own pixels did not change), so restored detail does not
    /// shimmer; a real change (a mouth opening) is followed at once. 0 turns it off. Videos only.
    #[arg(long, value_name = "FRAMES", default_value_t = defaults::TEMPORAL, help_heading = "Output")]
    pub temporal: f32,
    /// Write a before/after view instead of the restored picture alone: `side` (original left,
    /// restored right, twice the width) or `split` (left half original, right half restored).
    #[arg(long, value_enum, value_name = "VIEW", help_heading = "Output")]
    pub compare: Option<Compare>,
    #[command(flatten)]
    pub encode: EncodeSettings,
    /// Stop after this many frames.
    #[arg(long = "frames", id = "frames", value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Input")]
    pub max_frames: Option<u64>,
}

/// The treatment's flags alone, parsed from nothing: every default, from `defaults.rs`.
#[derive(clap::Parser)]
struct DefaultTreatment {
    #[command(flatten)]
    treatment: Treatment,
}

/// The flags a service's job may set (`?blend=0.8&mask=face`), by their command-line names:
/// each is parsed and checked by its declaration above, as on the command line
/// ([`Treatment::with_flags`]). A new job flag is its name here and its line in
/// [`Treatment::take`]; the test of this file fails for a name without one.
pub(crate) const JOB_FLAGS: [&str; 13] = [
    "blend",
    "mask",
    "temporal",
    "smooth",
    "compare",
    "only-face",
    "skip-face",
    "face-distance",
    "min-face",
    "fidelity",
    "color-fix",
    "identity-guard",
    "occlusion",
];

impl Default for Treatment {
    fn default() -> Self {
        <DefaultTreatment as clap::Parser>::parse_from(["gpen-video"]).treatment
    }
}

impl Treatment {
    /// How each picture is shown: the blend and the compare view (a request may override it,
    /// see `engine::Job::view`).
    pub(crate) fn view(&self) -> View {
        View {
            blend: self.blend,
            compare: self.compare,
        }
    }

    /// This treatment with `flags` (a flag's name of `allowed`, without its dashes, and its
    /// value) set as the command line sets them: each parsed by its own declaration (clap) and
    /// the whole checked ([`Treatment::check`]). A name outside `allowed`, a value the flag does
    /// not take or one out of its range is an error naming the flag (the words use the
    /// command line's `--name`). `compare=none` (or empty) asks for no view.
    pub(crate) fn with_flags(&self, flags: &[(String, String)], allowed: &[&str]) -> Result<Treatment> {
        let parse = |args: &[String]| {
            <DefaultTreatment as clap::Parser>::try_parse_from(
                std::iter::once("gpen-video".to_string()).chain(args.iter().cloned()),
            )
            .map(|d| d.treatment)
        };
        let mut args = Vec::new();
        for (k, v) in flags {
            if !allowed.contains(&k.as_str()) {
                bail!("{k}: no such parameter; give {}", allowed.join(", "));
            }
            if k == "compare" && matches!(v.as_str(), "" | "none" | "off") {
                continue;
            }
            let arg = format!("--{k}={v}");
            // Each alone first, so an error names the flag it is about.
            if let Err(e) = parse(std::slice::from_ref(&arg)) {
                let words = e.to_string();
                let first = words.lines().next().unwrap_or_default().trim_start_matches("error: ");
                bail!("{k}={v}: {first}");
            }
            args.push(arg);
        }
        let parsed =
            parse(&args).map_err(|e| anyhow::anyhow!("{}", e.to_string().lines().next().unwrap_or_default()))?;
        let mut t = self.clone();
        for (k, _) in flags {
            t.take(&parsed, k);
        }
        t.check()?;
        Ok(t)
    }

    /// [`Treatment::with_flags`] for a request's query: its errors name the parameters as a
    /// query gives them (`blend=2: ...`, never `--blend`). The one parser of a job's and a
    /// photo's flags.
    pub(crate) fn with_query(&self, flags: &[(String, String)], allowed: &[&str]) -> Result<Treatment> {
        self.with_flags(flags, allowed)
            .map_err(|e| anyhow::anyhow!("{}", format!("{e:#}").replace("'--", "'").replacen("--", "", 1)))
    }

    /// Sets the field of job flag `name` ([`JOB_FLAGS`]) from `from`.
    fn take(&mut self, from: &Treatment, name: &str) {
        match name {
            "blend" => self.blend = from.blend,
            "mask" => self.mask = from.mask,
            "temporal" => self.temporal = from.temporal,
            "smooth" => self.smooth = from.smooth,
            "compare" => self.compare = from.compare,
            "only-face" => self.selection.only_face = from.selection.only_face.clone(),
            "skip-face" => self.selection.skip_face = from.selection.skip_face.clone(),
            "face-distance" => self.selection.face_distance = from.selection.face_distance,
            "min-face" => self.selection.min_face = from.selection.min_face,
            "fidelity" => self.fidelity = from.fidelity,
            "color-fix" => self.color_fix = from.color_fix,
            "identity-guard" => self.identity_guard = from.identity_guard,
            "occlusion" => self.occlusion = from.occlusion,
            _ => {}
        }
    }

    /// Checks every range (NaN fails every comparison, so each range accepts only good values).
    pub fn check(&self) -> Result<()> {
        self.selection.check()?;
        if let Some(w) = self.fidelity.filter(|w| !(0.0..=1.0).contains(w)) {
            bail!("--fidelity must be between 0 and 1, got {w}");
        }
        let in_range = |v: f32, lo: f32, hi: f32| (lo..=hi).contains(&v);
        if !in_range(self.blend, 0.0, 1.0) {
            bail!("--blend must be between 0 and 1, got {}", self.blend);
        }
        if !in_range(self.smooth, 0.0, defaults::SMOOTH_MAX) {
            bail!(
                "--smooth must be between 0 (off) and {} frames, got {}",
                defaults::SMOOTH_MAX,
                self.smooth
            );
        }
        if !in_range(self.temporal, 0.0, defaults::TEMPORAL_MAX) {
            bail!(
                "--temporal must be between 0 (off) and {} frames, got {}",
                defaults::TEMPORAL_MAX,
                self.temporal
            );
        }
        if !in_range(self.face_check, 0.0, 1.0) {
            bail!(
                "--face-check must be between 0 (keep every detection) and 1, got {}",
                self.face_check
            );
        }
        if self.batch == 0 {
            bail!("--batch must be at least 1");
        }
        let d = &self.detection;
        if !(d.threshold > 0.0 && d.threshold <= 1.0) {
            bail!(
                "--det-threshold must be above 0 and at most 1, got {} (0 would take every detector cell for a face)",
                d.threshold
            );
        }
        if d.det_size < 32 {
            bail!("--det-size must be at least 32 pixels, got {}", d.det_size);
        }
        if d.max_faces == 0 {
            bail!("--max-faces must be at least 1");
        }
        check_encoder(&self.encode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job flag is one of the command line's and takes effect (a name in `JOB_FLAGS`
    /// without its line in `take` fails here); values are parsed and checked as the command
    /// line's, and anything else is refused naming it.
    #[test]
    fn a_jobs_flags_are_the_command_lines() {
        let base = Treatment::default();
        let other = [
            ("blend", "0.25"),
            ("mask", "box"),
            ("temporal", "1"),
            ("smooth", "2"),
            ("compare", "side"),
            ("only-face", "someone.jpg"),
            ("skip-face", "someone-else.jpg"),
            ("face-distance", "0.5"),
            ("min-face", "40"),
            ("fidelity", "0.7"),
            ("color-fix", "off"),
            ("identity-guard", "warn"),
            ("occlusion", "off"),
        ];
        assert_eq!(other.map(|(k, _)| k), JOB_FLAGS);
        for (k, v) in other {
            let t = base.with_flags(&[(k.into(), v.into())], &JOB_FLAGS).unwrap();
            assert_ne!(t, base, "{k}={v} changed nothing");
        }
        let side = base
            .with_flags(&[("compare".into(), "split".into())], &JOB_FLAGS)
            .unwrap();
        assert_eq!(
            side.with_flags(&[("compare".into(), "none".into())], &JOB_FLAGS)
                .unwrap(),
            base
        );
        let err = |k: &str, v: &str| {
            base.with_flags(&[(k.into(), v.into())], &JOB_FLAGS)
                .unwrap_err()
                .to_string()
        };
        assert!(
            err("blend", "lots").starts_with("blend=lots: invalid value"),
            "{}",
            err("blend", "lots")
        );
        assert!(
            err("mask", "oval").starts_with("mask=oval: invalid value"),
            "{}",
            err("mask", "oval")
        );
        assert!(err("blend", "7").contains("--blend must be between 0 and 1"));
        assert!(err("crf", "0").starts_with("crf: no such parameter"));
        assert!(err("blnd", "0.3").starts_with("blnd: no such parameter"));
    }
}
