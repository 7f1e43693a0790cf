//! What can be judged before any work: in, a run's settings (its model, its treatment, the
//! photos it names); out, the first reason no run of them could ever go, said as the run itself
//! would say it, so a service, a batch or a segmented run refuses at its start instead of
//! failing each file, job or segment later.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use crate::config::Settings;

/// Whether the ONNX file at `model` takes a fidelity (a second input beside the image, as
/// CodeFormer's `weight`), read from its graph; `None` when the file cannot be read so (the run
/// judges it then). A file already read is not read again while its size and time stay.
pub(crate) fn fidelity_input(model: &Path) -> Option<bool> {
    type Seen = std::collections::HashMap<std::path::PathBuf, (u64, Option<std::time::SystemTime>, Option<bool>)>;
    static SEEN: parking_lot::Mutex<Option<Seen>> = parking_lot::Mutex::new(None);
    let meta = std::fs::metadata(model).ok()?;
    let stamp = (meta.len(), meta.modified().ok());
    let mut seen = SEEN.lock();
    let seen = seen.get_or_insert_with(Default::default);
    if let Some(&(len, time, known)) = seen.get(model) {
        if (len, time) == stamp {
            return known;
        }
    }
    let known = std::fs::read(model).ok().and_then(|bytes| {
        let m = onnx_rs::parse(&bytes).ok()?;
        let g = m.graph.as_ref()?;
        let inits: std::collections::HashSet<&str> = g.initializer.iter().map(|t| t.name()).collect();
        Some(g.input.iter().filter(|v| !inits.contains(v.name)).count() == 2)
    });
    seen.insert(model.to_path_buf(), (stamp.0, stamp.1, known));
    known
}

/// Judges `settings` before any work: a `--fidelity` its model has no input for, and each
/// photo of `--only-face` / `--skip-face` described (a photo that is not a picture or holds no
/// face is named). The same errors as a run gives, before any file is opened for writing.
pub fn check(settings: &Settings) -> Result<()> {
    let t = &settings.recipe.treatment;
    let model = settings.recipe.model.path();
    if t.fidelity.is_some() && fidelity_input(model) == Some(false) {
        return Err(crate::faces::enhance::fidelity_refused(&model.display().to_string()));
    }
    let s = &t.selection;
    let photos: Vec<&Path> = s.only_face.iter().chain(&s.skip_face).map(|p| p.as_path()).collect();
    describe_photos(settings, &photos)
}

/// Describes each of `photos` as a reference of who to restore (the detector and the
/// identity model of `settings`): an error naming the first that is not a picture of a face.
pub fn describe_photos(settings: &Settings, photos: &[&Path]) -> Result<()> {
    if photos.is_empty() {
        return Ok(());
    }
    let identity = settings.recipe.identity.as_ref().ok_or_else(|| {
        anyhow!("--only-face and --skip-face need the face-identity model models/face-id.onnx: run scripts/setup.sh")
    })?;
    let opts = crate::runtime::SessionOptions::cpu(1);
    let detector = settings.recipe.detector.path();
    let session = crate::runtime::session(detector, &opts, "face detector")?;
    let d = &settings.recipe.treatment.detection;
    let mut detector =
        crate::faces::detect::Detector::new(session, (d.det_size, d.det_size), d.threshold, d.nms_iou, 0)
            .with_context(|| format!("face detector {}", detector.display()))?;
    let mut identifier = crate::faces::identity::Identifier::open(identity.path(), &opts)?;
    for p in photos {
        crate::people::reference(p, &mut detector, &mut identifier, settings.cpu)?;
    }
    Ok(())
}

/// Refuses a fidelity for a model without one in words a client of the service may read: the
/// model by `shown` (its offered name), never by where the service keeps it.
pub(crate) fn check_fidelity(settings: &Settings, shown: &str) -> Result<()> {
    if let Some(w) = settings.recipe.treatment.fidelity {
        if fidelity_input(settings.recipe.model.path()) == Some(false) {
            bail!("fidelity={w}: the model {shown} has no fidelity input (CodeFormer's `weight`); leave fidelity out");
        }
    }
    Ok(())
}
