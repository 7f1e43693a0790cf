//! The `gpen-video` command line: in, arguments and environment; out, a restored video, a
//! summary on stderr and an exit code (0 done, 1 failed, 2 bad usage).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gpen_video::encode::EncodeSettings;
use gpen_video::pipeline;
use gpen_video::plan::{Device, Options, Plan};
use indicatif::{ProgressBar, ProgressStyle};

/// Restore every face in a video with GPEN, keeping audio, subtitles, timing and metadata.
///
/// Decodes IN with FFmpeg, finds faces with CenterFace, aligns each to the FFHQ template, runs
/// the GPEN model on ONNX Runtime in batches gathered across frames, pastes the restored faces
/// back through a feathered mask and encodes OUT. OUT is written beside itself under a temporary
/// name and appears only when complete.
#[derive(Parser, Debug)]
#[command(name = "gpen-video", version, about, long_about)]
struct Cli {
    /// Input video (any format FFmpeg reads).
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// Output video; the container follows the extension (.mp4, .mkv, .mov, ...).
    #[arg(value_name = "OUT")]
    output: PathBuf,

    /// Enhancer model: an ONNX file with input [N,3,S,S] in [-1,1] (GPEN-BFR). Default:
    /// models/GPEN-BFR-512.onnx if present, else the set-up's stand-in (which restores nothing).
    #[arg(long, value_name = "PATH", help_heading = "Model")]
    model: Option<PathBuf>,
    /// Where the model runs: cpu, cuda:N, cuda:N,M or cuda:all.
    #[arg(long, default_value = "cpu", value_parser = parse_device, help_heading = "Model")]
    device: Device,
    /// Face crops per model call, gathered across consecutive frames (a model with a fixed
    /// batch dimension runs its own size).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Model")]
    batch: u16,
    /// CPU threads for ONNX Runtime (default: all cores).
    #[arg(long, value_name = "N", help_heading = "Model")]
    threads: Option<usize>,

    /// Face detector: a CenterFace ONNX file with dynamic input size (default: models/centerface.onnx).
    #[arg(long, value_name = "PATH", help_heading = "Detection")]
    detector: Option<PathBuf>,
    /// Long side, in pixels, of the downscaled copy the detector sees.
    #[arg(long, default_value_t = 640, value_name = "PX", help_heading = "Detection")]
    det_size: usize,
    /// Minimum detector score for a face.
    #[arg(long, default_value_t = 0.5, help_heading = "Detection")]
    det_threshold: f32,

    /// How much of the restored face to blend in: 0 keeps the original, 1 the restored face.
    #[arg(long, default_value_t = 1.0, value_name = "0..1", help_heading = "Output")]
    blend: f32,
    /// FFmpeg video encoder.
    #[arg(long, default_value = "libx264", help_heading = "Output")]
    codec: String,
    /// Constant rate factor for x264/x265 (lower is better quality, larger files).
    #[arg(long, default_value_t = 18, help_heading = "Output")]
    crf: u32,
    /// Encoder preset (x264: ultrafast ... veryslow).
    #[arg(long, default_value = "medium", help_heading = "Output")]
    preset: String,
    /// Write each frame's detected faces and pasted regions as JSON to PATH.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    faces_json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short, help_heading = "Output")]
    quiet: bool,
}

fn parse_device(s: &str) -> Result<Device, String> {
    s.parse()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "gpen_video=info,warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut o = Options::new(&cli.input, &cli.output);
    o.model = cli.model;
    o.detector = cli.detector;
    o.device = cli.device;
    o.batch = cli.batch as usize;
    o.det_size = cli.det_size;
    o.det_threshold = cli.det_threshold;
    o.blend = cli.blend;
    o.threads = cli.threads;
    o.faces_json = cli.faces_json;
    // crf and preset are x264/x265 options; other encoders get FFmpeg's defaults.
    let x26x = matches!(cli.codec.as_str(), "libx264" | "libx265");
    o.encode = EncodeSettings {
        codec: cli.codec,
        crf: x26x.then_some(cli.crf),
        preset: x26x.then_some(cli.preset),
    };
    let plan = Plan::resolve(&o)?;
    tracing::info!(
        input = %o.input.display(),
        size = %format!("{}x{}", plan.source.width, plan.source.height),
        model = %plan.model_path.display(),
        crop = plan.enhancer.info.size,
        batch = plan.batch,
        "starting"
    );
    let total = plan.source.estimated_frames();
    let bar = if !cli.quiet && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total.unwrap_or(0));
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} frames  {per_sec}  ETA {eta}",
            )
            .expect("valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let summary = pipeline::run(plan, &|n| bar.set_position(n))?;
    bar.finish_and_clear();
    eprintln!("{}: {summary}", o.output.display());
    Ok(())
}
