//! `gpen-video bench --portraits`: in, a folder of portraits (or 1024x1024 portraits generated
//! from the set-up's public-domain one), the settings and the batch sizes to try; out, per batch
//! size, images/s through the image stream (`pipeline::run_images`), ms per batch, host and GPU
//! peak memory, the enhance-only ceiling beside it, the efficiency, the latency of one image on
//! its own and, given a price per hour, the cost per 1,000 images; a table and JSON.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::bench::{ceiling, median};
use crate::config::Settings;
use crate::engine::{CancelToken, Engine, Job};
use crate::frame::{Frame, Pool};
use crate::pipeline;
use crate::stats::{gpu_memory_by_index, peak_rss, Summary};

/// Side of the generated portraits.
pub(crate) const PORTRAIT_SIDE: usize = 1024;
/// Portraits generated when no folder is given.
pub const DEFAULT_IMAGES: usize = 32;
/// Batch sizes tried when none are given.
pub const DEFAULT_BATCHES: [usize; 4] = [1, 4, 8, 16];
/// The portrait the generated ones are made from (NASA, public domain; the set-up installs it).
pub(crate) const SOURCE_PORTRAIT: &str = "samples/astronaut.png";

#[derive(Clone, Debug)]
pub struct PortraitOptions {
    /// Folder of portraits (still images, by extension); `None` generates them.
    pub dir: Option<PathBuf>,
    /// Portraits to generate.
    pub images: usize,
    pub batches: Vec<usize>,
    /// Counted runs per batch size (after one warm-up that is not counted).
    pub repeat: usize,
    /// How long each enhance-only run lasts at least (see [`crate::bench::BenchOptions`]).
    pub ceiling_time: std::time::Duration,
    /// Price of the machine per hour, for the cost per 1,000 images.
    pub price_per_hour: Option<f64>,
    /// Model, devices, encoder settings... (`batch` is set per row).
    pub settings: Settings,
    pub cancel: CancelToken,
}

/// One batch size: medians over the counted runs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PortraitRow {
    pub device: String,
    pub batch: usize,
    pub images: u64,
    pub faces: u64,
    /// Images through the whole stream (decode to the written file) per second.
    pub images_per_s: f64,
    pub ms_per_batch: f64,
    /// Peak resident memory of the process over this batch size's runs.
    pub host_peak_mib: Option<u64>,
    /// GPU memory held on the busiest GPU (ONNX Runtime keeps its arena: its high-water mark).
    pub gpu_peak_mib: Option<u64>,
    /// The model alone on the same crops at the same batch size, in images/s (faces/s over
    /// faces per image).
    pub ceiling_images_per_s: f64,
    /// Median over the pairs of the stream's faces/s over the ceiling's, each pair run one
    /// after the other.
    pub efficiency: f64,
    /// One image streamed on its own through the warm engine, decode to rename.
    pub latency_ms: f64,
    /// `price_per_hour / 3600 / images_per_s * 1000`, when a price is given.
    pub cost_per_1000: Option<f64>,
    pub runs: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PortraitReport {
    /// Written lossily: a model name that is not UTF-8 must not stop the report.
    #[serde(serialize_with = "lossy_path")]
    pub model: PathBuf,
    /// Portrait size, when generated.
    pub side: Option<usize>,
    pub price_per_hour: Option<f64>,
    pub rows: Vec<PortraitRow>,
}

fn lossy_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// Runs the portrait benchmark; `log` gets a line per finished run.
pub fn run(o: &PortraitOptions, log: &dyn Fn(&str)) -> Result<PortraitReport> {
    if o.batches.is_empty() || o.batches.contains(&0) {
        bail!("--batches: give batch sizes of at least 1, e.g. 1,4,8,16");
    }
    if o.price_per_hour.is_some_and(|p| !(p.is_finite() && p >= 0.0)) {
        bail!("--price-per-hour must be a price of 0 or more");
    }
    // Removed when dropped, on error as well.
    let tmp = crate::bench::temp_folder("gpen-video-portraits-")?;
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let inputs = match &o.dir {
        Some(dir) => portraits_in(dir)?,
        None => generate(&tmp.path().join("in"), o.images, log)?,
    };
    let mut report = PortraitReport {
        model: o.settings.recipe.model.0.clone(),
        side: o.dir.is_none().then_some(PORTRAIT_SIDE),
        price_per_hour: o.price_per_hour,
        rows: Vec::new(),
    };
    for &batch in &o.batches {
        report.rows.push(bench_batch(o, batch, &inputs, &out, log)?);
    }
    Ok(report)
}

/// The still images of `dir` (not its subfolders), sorted.
fn portraits_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the portrait folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && crate::media::still::is_still(p))
        .collect();
    found.sort();
    if found.is_empty() {
        bail!("no still image (.png, .jpg, .webp, .tiff, .bmp) in {}", dir.display());
    }
    Ok(found)
}

/// Makes `n` portraits of 1024x1024 in `dir` from the set-up's portrait: each scaled up with a
/// slightly different zoom and centre (and every other one mirrored), written as JPEG.
fn generate(dir: &Path, n: usize, log: &dyn Fn(&str)) -> Result<Vec<PathBuf>> {
    let src_path = crate::config::find_asset(SOURCE_PORTRAIT)
        .ok_or_else(|| anyhow!("{SOURCE_PORTRAIT} not found: run scripts/setup.sh, or give --portraits DIR"))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let source = crate::media::decode::probe(&src_path)?;
    let (sw, sh) = (source.width, source.height);
    let decoder = crate::media::decode::Decoder::new(source.clone(), (32, 32), false);
    let (rgb_pool, det_pool) = (Pool::new(1), Pool::new(1));
    let mut picture = None;
    decoder.run((&rgb_pool, &det_pool), Some(1), |mut f| {
        let whole = crate::geom::Rect::new(0, 0, f.width, f.height);
        crate::media::color::ensure_rgb(&mut f, whole);
        picture = Some(f.rgb);
        false
    })?;
    let picture = picture.ok_or_else(|| anyhow!("{}: no picture decoded", src_path.display()))?;
    let side = PORTRAIT_SIDE;
    let mut out_info = source;
    (out_info.width, out_info.height) = (side, side);
    let settings = crate::media::encode::EncodeSettings {
        quality: Some(95),
        ..Default::default()
    };
    let mut paths = Vec::new();
    for i in 0..n {
        // Zoom 1 to 1.12 around a centre moved by up to 3% of the picture.
        let zoom = 1.0 + 0.03 * (i % 5) as f32;
        let (cx, cy) = (
            0.5 + 0.015 * ((i % 3) as f32 - 1.0),
            0.5 + 0.015 * ((i % 4) as f32 - 1.5),
        );
        let k = sw.min(sh) as f32 / (side as f32 * zoom);
        let mut rgb = vec![0u8; side * side * 3];
        for y in 0..side {
            for x in 0..side {
                let xo = if i % 2 == 1 { side - 1 - x } else { x };
                let sx = cx * sw as f32 + (xo as f32 + 0.5 - side as f32 / 2.0) * k - 0.5;
                let sy = cy * sh as f32 + (y as f32 + 0.5 - side as f32 / 2.0) * k - 0.5;
                let px = crate::kernels::sample::sample_rgb_f32(&picture, sw, sh, sx, sy);
                let d = (y * side + x) * 3;
                for c in 0..3 {
                    rgb[d + c] = px[c].round().clamp(0.0, 255.0) as u8;
                }
            }
        }
        let path = dir.join(format!("portrait-{i:03}.jpg"));
        let mut frame = Frame::blank(0);
        (frame.width, frame.height, frame.rgb) = (side, side, rgb);
        // The writer fills a file that exists (a run's temporary output).
        std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut writer = crate::media::still::StillWriter::create(&path, &out_info, &settings)?;
        writer.write(&mut frame)?;
        writer.finish()?;
        paths.push(path);
    }
    log(&format!(
        "{n} portraits of {side}x{side} made from {}",
        src_path.display()
    ));
    Ok(paths)
}

/// Streams `jobs` through `engine`; fails if any image fails.
fn stream(engine: &mut Engine, long_side: usize, jobs: &[Job]) -> Result<Summary> {
    let failed: Mutex<Option<String>> = Mutex::new(None);
    // Owned: the stream's decoder takes them on its own thread.
    let rest: Vec<Job> = jobs[1..].to_vec();
    let mut rest = rest.into_iter();
    let mut next = || rest.next().map(|j| (j, ()));
    let done = |(), r: Result<pipeline::ImageDone>| {
        if let Err(e) = r {
            failed
                .lock()
                .expect("no panic holds it")
                .get_or_insert(format!("{e:#}"));
        }
    };
    let summary = pipeline::run_images(engine, (long_side, None), (jobs[0].clone(), ()), &mut next, &done)?;
    if let Some(e) = failed.into_inner().expect("no panic holds it") {
        bail!("{e}");
    }
    Ok(summary)
}

/// Resets the process's peak resident memory (Linux), so each batch size reports its own.
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").ok();
}

fn bench_batch(
    o: &PortraitOptions,
    batch: usize,
    inputs: &[PathBuf],
    out: &Path,
    log: &dyn Fn(&str),
) -> Result<PortraitRow> {
    let mut settings = o.settings.clone();
    std::sync::Arc::make_mut(&mut settings.recipe.treatment).batch = batch;
    (settings.faces_json, settings.stats_json) = (None, None);
    let jobs: Vec<Job> = inputs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ext = p.extension().map_or("png".into(), |e| e.to_string_lossy().into_owned());
            settings.job(p, &out.join(format!("{i:04}.{ext}")), o.cancel.clone())
        })
        .collect::<Result<_>>()?;
    let mut engine = settings.engine(&jobs[0])?;
    let (device, batch) = (engine.devices(), engine.batch);
    let long_side = settings.recipe.treatment.detection.det_size;
    reset_peak_rss();

    // The ceiling's crops: the first face of the first few portraits.
    let mut crops = Vec::new();
    for job in jobs.iter().take(4) {
        crops.extend(pipeline::collect_crops(&mut engine, job, 1, 1)?);
    }
    if crops.is_empty() {
        bail!("no face found in the first portraits to time the enhancer on");
    }
    // Warm-up, not counted: sessions allocate their memory and pick kernels.
    let warm = jobs.len().min((2 * batch * engine.workers.len()).max(8));
    stream(&mut engine, long_side, &jobs[..warm])?;
    ceiling(&mut engine, &crops, 4, o.ceiling_time)?;

    let (mut runs, mut ceilings, mut ratios, mut latencies) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 1..=o.repeat.max(1) {
        let t = Instant::now();
        stream(&mut engine, long_side, &jobs[..1])?;
        latencies.push(1000.0 * t.elapsed().as_secs_f64());
        let s = stream(&mut engine, long_side, &jobs)?;
        let (faces_per_s, _, _) = ceiling(&mut engine, &crops, 4, o.ceiling_time)?;
        log(&format!(
            "batch {batch}: run {i}: {:.2} images/s, enhance-only {faces_per_s:.2} faces/s",
            s.fps()
        ));
        ratios.push(s.faces_per_s() / faces_per_s.max(1e-9));
        ceilings.push(faces_per_s);
        runs.push(s);
    }
    let last = runs.last().expect("at least one run");
    let images_per_s = median(runs.iter().map(Summary::fps).collect());
    let faces_per_image = last.faces as f64 / last.frames.max(1) as f64;
    let gpu = last
        .workers
        .iter()
        .filter_map(|w| w.device_mib)
        .max()
        .or_else(|| gpu_memory_by_index().iter().map(|(_, m)| *m).max())
        .filter(|m| *m > 0);
    Ok(PortraitRow {
        device,
        batch,
        images: last.frames,
        faces: last.faces,
        images_per_s,
        ms_per_batch: median(
            runs.iter()
                .flat_map(|s| s.workers.iter().map(|w| w.ms_per_batch()))
                .collect(),
        ),
        host_peak_mib: peak_rss().map(|b| b >> 20),
        gpu_peak_mib: gpu,
        ceiling_images_per_s: median(ceilings) / faces_per_image.max(1e-9),
        efficiency: median(ratios),
        latency_ms: median(latencies),
        cost_per_1000: o.price_per_hour.map(|p| cost_per_1000(p, images_per_s)),
        runs: runs.len(),
    })
}

/// What 1,000 images cost at `price_per_hour` and `images_per_s`.
pub(crate) fn cost_per_1000(price_per_hour: f64, images_per_s: f64) -> f64 {
    price_per_hour / 3600.0 / images_per_s.max(1e-9) * 1000.0
}

impl PortraitReport {
    pub fn table(&self) -> String {
        let cost = self.price_per_hour.is_some();
        let mut out = format!(
            "{:<12} {:>5} {:>9} {:>9} {:>9} {:>8} {:>12} {:>10} {:>10}{}\n",
            "device",
            "batch",
            "images/s",
            "ms/batch",
            "host MiB",
            "GPU MiB",
            "ceiling i/s",
            "efficiency",
            "latency ms",
            if cost {
                format!(" {:>10}", "per 1000")
            } else {
                String::new()
            }
        );
        for r in &self.rows {
            out += &format!(
                "{:<12} {:>5} {:>9.2} {:>9.1} {:>9} {:>8} {:>12.2} {:>10.3} {:>10.0}{}\n",
                r.device,
                r.batch,
                r.images_per_s,
                r.ms_per_batch,
                r.host_peak_mib.map_or("-".into(), |m| m.to_string()),
                r.gpu_peak_mib.map_or("-".into(), |m| m.to_string()),
                r.ceiling_images_per_s,
                r.efficiency,
                r.latency_ms,
                r.cost_per_1000.map_or(String::new(), |c| format!(" {c:>10.4}"))
            );
        }
        let what = self
            .side
            .map_or("the portraits given".to_string(), |s| format!("{s}x{s} portraits"));
        out += &format!(
            "{what}, model {}; ceiling: the model alone at the same batch size; efficiency: stream faces/s over ceiling faces/s{}\n",
            self.model.display(),
            self.price_per_hour
                .map_or(String::new(), |p| format!("; cost per 1,000 images at {p} per hour"))
        );
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain numbers and strings serialise") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::cost_per_1000;

    #[test]
    fn a_model_name_that_is_not_utf8_is_written_not_a_panic() {
        use std::os::unix::ffi::OsStrExt;
        let report = super::PortraitReport {
            model: std::ffi::OsStr::from_bytes(b"m\xff.onnx").into(),
            ..Default::default()
        };
        assert!(
            report.to_json().contains("\"model\":\"m\u{fffd}.onnx\""),
            "{}",
            report.to_json()
        );
    }

    #[test]
    fn cost_per_1000_images_follows_the_price_and_the_rate() {
        // 3.6 per hour is 0.001 per second: at 10 images/s, 1,000 images take 100 s.
        assert!((cost_per_1000(3.6, 10.0) - 0.1).abs() < 1e-12);
        assert!((cost_per_1000(0.0, 10.0)).abs() < 1e-12);
    }
}
