//! The `gpen-video` command line: in, arguments and environment; out, a restored video (or a
//! benchmark table, or model-registry work), a summary on stderr and an exit code (0 done,
//! 1 failed, 2 bad usage).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};
use gpen_video::api::bench::portraits;
use gpen_video::api::bench::{self, BenchOptions, Stage};
use gpen_video::api::config::{find_asset, Device, Options, Settings, Treatment};
use gpen_video::api::console::{eprint_line, print_text};
use gpen_video::api::engine::CancelToken;
use gpen_video::api::pipeline;
use gpen_video::api::registry::{self, ModelsCmd};
use gpen_video::defaults;
use indicatif::{ProgressBar, ProgressStyle};

/// Restore every face in a video or photo with GPEN, keeping audio, subtitles, timing and metadata.
///
/// Decodes IN (a video, or a still image: .png, .jpg, .webp, .tiff, .bmp) with FFmpeg, finds
/// faces with CenterFace, smooths their points over time, aligns each to the FFHQ template, runs
/// the GPEN model on ONNX Runtime in batches gathered across frames, pastes the restored faces
/// back through a feathered face-shaped mask and encodes OUT. OUT is written beside itself under
/// a temporary name and appears only when complete.
#[derive(Parser, Debug)]
#[command(
    name = "gpen-video",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    // `--blend -1` is a value out of range (said by the range check), not an unknown flag.
    allow_negative_numbers = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Input video (any format FFmpeg reads), or a still image (.png, .jpg, .webp, .tiff, .bmp).
    #[arg(value_name = "IN", required = true)]
    input: Option<PathBuf>,
    /// Output video; the container follows the extension (.mp4, .mkv, .mov, ...). For a still
    /// IN, an image: .png (lossless), .jpg or .webp (--quality), .tiff or .bmp.
    #[arg(value_name = "OUT", required = true)]
    output: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
    /// Write each frame's detected faces and pasted regions as JSON to PATH.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    faces_json: Option<PathBuf>,
    /// Write the run's statistics (stages, workers) as JSON to PATH.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    stats_json: Option<PathBuf>,
    /// Measure how much of who each face is the restoration keeps (the cosine similarity of its
    /// identity descriptors before and after, 1 for an unchanged face) on a few faces of each
    /// track: each track's median and the worst in the summary and --stats-json. --faces-json
    /// measures every face and records each figure.
    #[arg(long, help_heading = "Output")]
    identity: bool,
    #[command(flatten)]
    segment: SegmentArg,
    /// Segments of a long video restored at once, each its own pipeline (on CUDA one GPU each,
    /// round robin; on the CPU the cores are split). A video of one segment runs as one.
    #[arg(long, value_name = "N", default_value_t = defaults::SEGMENT_JOBS, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Long videos")]
    jobs: u16,
    /// Start a long video afresh: drop the segments an earlier run of this OUT finished.
    #[arg(long, help_heading = "Long videos")]
    force: bool,
    /// Replace OUT if it exists (by default an existing OUT is refused, and kept).
    #[arg(short = 'y', long = "overwrite", help_heading = "Output", conflicts_with = "keep")]
    overwrite: bool,
    /// Never replace OUT: if it exists, say so and end at once with exit code 0.
    #[arg(short = 'n', long = "no-overwrite", id = "keep", help_heading = "Output")]
    keep: bool,
}

/// How long videos are cut.
#[derive(Args, Debug)]
struct SegmentArg {
    /// A video longer than one and a half times this many seconds is cut at keyframes into
    /// segments of about this length, restored one by one (or N at once with --jobs, or across machines with batch
    /// --shard) and joined into OUT; finished segments are kept beside OUT in
    /// `.OUT.segments/`, so a rerun after a crash or Ctrl-C redoes only the unfinished ones.
    /// Each segment starts with about a hundred warm-up frames (decoded, not written), so its
    /// faces are those one run finds. 0: never cut.
    #[arg(long = "segment", value_name = "SECONDS", default_value_t = defaults::SEGMENT_SECONDS, value_parser = parse_segment, help_heading = "Long videos")]
    seconds: f64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Measure frames/s and faces/s on 1080p sources: the whole pipeline (warm-up excluded,
    /// repeated, medians), the enhancement sessions alone (the ceiling) and every stage but the
    /// model (the feeder: core-ms per face per stage, what N cores feed); with --portraits,
    /// images/s of still images streamed as `batch` streams them, per batch size.
    #[command(allow_negative_numbers = true)]
    Bench(BenchArgs),
    /// The model registry: list known models, verify files, fetch downloads.
    Models {
        #[command(subcommand)]
        cmd: ModelsCmd,
    },
    /// Restore every video and still image in a folder into OUT_DIR (same relative paths; the
    /// images streamed through one engine, so their faces fill the batches), resuming where an
    /// earlier run stopped; `--shard` splits one folder across machines. Exit code 0 all done,
    /// 1 some clip failed, 130 interrupted by Ctrl-C and 143 by SIGTERM (once: finish the clips
    /// in flight; twice: stop).
    #[command(allow_negative_numbers = true)]
    Batch(BatchArgs),
    /// Restore photos and videos over HTTP, with a page to use it from a browser: open
    /// http://ADDRESS/ (the address it prints) to drop files, watch them restore, compare and
    /// download. POST an image to /v1/restore and get it back restored (in its own format, or
    /// ?format=png|jpg|webp|tiff|bmp; ?blend=0..1, ?compare=side|split, ?json=1 for a JSON record
    /// of faces and timings); POST a video to /v1/jobs for a job restored in the background. One engine is loaded at start; the faces of
    /// concurrent requests fill the model's batches. GET /healthz (200 once the model is loaded)
    /// and GET /metrics (Prometheus). SIGTERM or Ctrl-C: stop accepting, answer the requests in
    /// flight, exit 0.
    #[command(allow_negative_numbers = true)]
    Serve(ServeArgs),
    /// Print this command line's flag reference as Markdown (docs/flags.md is made by it).
    #[command(name = "help-markdown", hide = true)]
    HelpMarkdown,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address and port to listen on (0.0.0.0:8080 for every interface; port 0 picks a free one).
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = defaults::LISTEN,
        help_heading = "Service"
    )]
    listen: std::net::SocketAddr,
    /// Longest a face waits for others to fill its batch, in milliseconds (a lone request is
    /// sent on after it).
    #[arg(long, value_name = "MS", default_value_t = defaults::MAX_WAIT_MS, help_heading = "Service")]
    max_wait_ms: u64,
    /// Requests accepted at once (waiting or being restored); more are answered 503 with
    /// Retry-After.
    #[arg(long, value_name = "N", default_value_t = defaults::QUEUE, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100000), help_heading = "Service")]
    queue: usize,
    /// Largest request body, in megabytes (413 above it).
    #[arg(long, value_name = "MB", default_value_t = defaults::MAX_BODY_MB, value_parser = clap::value_parser!(u64).range(1..=4096), help_heading = "Service")]
    max_body_mb: u64,
    /// Largest picture, in pixels, an upload may be: read from its header before anything is
    /// decoded, and its decoder held to it (413 above it: a decompression bomb is never
    /// allocated).
    #[arg(long, value_name = "PIXELS", default_value_t = defaults::MAX_PIXELS, help_heading = "Service")]
    max_pixels: u64,
    /// Seconds a client has to send its headers (the connection is closed after) and then its
    /// whole image (408 after): slow clients are cut off.
    #[arg(long, value_name = "S", default_value_t = defaults::READ_TIMEOUT_S, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Service")]
    read_timeout_s: u64,
    /// Seconds from a request's arrival to its answer (504 after).
    #[arg(long, value_name = "S", default_value_t = defaults::DEADLINE_S, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Service")]
    deadline_s: u64,
    /// Folder where jobs (`/v1/jobs`: uploads, results, a film's finished segments) are kept;
    /// nothing outside it is read or written for them. Default: $XDG_STATE_HOME/gpen-video/jobs,
    /// else ~/.local/state/gpen-video/jobs.
    #[arg(long, value_name = "DIR", help_heading = "Jobs")]
    jobs_dir: Option<PathBuf>,
    /// Largest job upload, in megabytes (413 above it).
    #[arg(long, value_name = "MB", default_value_t = defaults::MAX_JOB_MB, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Jobs")]
    max_job_mb: u64,
    /// Most the jobs folder holds, in gigabytes: finished jobs are removed, oldest first, to
    /// make room; an upload that still does not fit gets 413.
    #[arg(long, value_name = "GB", default_value_t = defaults::JOBS_QUOTA_GB, help_heading = "Jobs")]
    jobs_quota_gb: f64,
    /// Hours a finished job (its result) is kept.
    #[arg(long, value_name = "H", default_value_t = defaults::JOB_TTL_H, help_heading = "Jobs")]
    job_ttl_h: f64,
    /// Jobs waiting or running at once; more get 429.
    #[arg(long, value_name = "N", default_value_t = defaults::MAX_JOBS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100000), help_heading = "Jobs")]
    max_jobs: usize,
    /// A job's film is restored in segments of about this many seconds: a service killed
    /// mid-job resumes from the finished ones.
    #[arg(long, value_name = "SECONDS", default_value_t = defaults::JOB_SEGMENT_S, value_parser = parse_segment, help_heading = "Jobs")]
    job_segment_s: f64,
    /// Share jobs with the other replicas of this service through this PostgreSQL database
    /// (postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME; also read from GPEN_VIDEO_JOBS_DB, which
    /// keeps a password out of the process list): any replica answers for any job and a film's
    /// segments spread over them. --jobs-dir must then be a folder every replica shares. The
    /// schema is made at start. Without it, jobs live in this service alone.
    #[arg(
        long,
        value_name = "URL",
        env = "GPEN_VIDEO_JOBS_DB",
        hide_env_values = true,
        help_heading = "Jobs"
    )]
    jobs_db: Option<String>,
    /// With --jobs-db: seconds a replica's claim on a job or segment holds without renewal; a
    /// replica that dies loses its work to the others this long after.
    #[arg(long, value_name = "S", default_value_t = defaults::JOB_LEASE_S, help_heading = "Jobs")]
    job_lease_s: f64,
    /// Require `Authorization: Bearer TOKEN` on every API call and the page (also read from
    /// GPEN_VIDEO_TOKEN, which keeps it out of the process list). /healthz and /metrics stay open.
    /// An empty token is refused.
    #[arg(long, value_name = "TOKEN", help_heading = "Service")]
    token: Option<String>,
    /// A host name to answer for without a token, besides the listening address and loopback
    /// names (localhost): the name a proxy or a LAN reaches this service by. Repeatable. Any
    /// other Host is refused (403), so no web site can reach the service by DNS rebinding.
    #[arg(long, value_name = "NAME", help_heading = "Service")]
    allow_host: Vec<String>,
    /// Slowest average a job's upload may come at, in kilobytes a second, once
    /// --read-timeout-s has passed (408 below it): an upload trickling in is cut off.
    #[arg(long, value_name = "KB/S", default_value_t = defaults::MIN_UPLOAD_KBS, help_heading = "Jobs")]
    min_upload_kbs: u64,
    /// A person a job may name by NAME (`only-face=NAME`, `skip-face=NAME`), from the reference
    /// photo PHOTO (its largest face). Repeatable. Jobs name people only by these names.
    #[arg(long = "face", value_name = "NAME=PHOTO", value_parser = face_of, help_heading = "Jobs")]
    faces: Vec<(String, std::path::PathBuf)>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct BatchArgs {
    /// Folder of input videos (by extension: mp4 mkv mov avi webm m4v mpg mpeg ts mts m2ts wmv flv 3gp)
    /// and still images (png jpg jpeg webp tif tiff bmp).
    #[arg(value_name = "IN_DIR")]
    in_dir: PathBuf,
    /// Output folder (created if missing); each output keeps its input's relative path.
    #[arg(value_name = "OUT_DIR")]
    out_dir: PathBuf,
    /// Include videos in subfolders.
    #[arg(long, short = 'r', help_heading = "Batch")]
    recursive: bool,
    /// Take files that symbolic links inside IN_DIR point to outside it (by default they are
    /// skipped with a warning: on a shared upload folder a link can name anyone's file).
    #[arg(long, help_heading = "Batch")]
    follow_links_out: bool,
    /// Only files matching PATTERN (`*`, `?`, `[..]`; matched against the file name, or the
    /// relative path if it has a `/`). Repeatable.
    #[arg(long = "glob", value_name = "PATTERN", help_heading = "Batch")]
    globs: Vec<String>,
    /// Clips run at once (default: 1 on CPU, one per GPU with --device cuda:..., each on one GPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Batch")]
    jobs: Option<u16>,
    /// Redo every clip, even those the manifest records as finished.
    #[arg(long, help_heading = "Batch")]
    force: bool,
    /// Write what was done, skipped and failed (and why) as JSON to PATH.
    #[arg(long, value_name = "PATH", help_heading = "Batch")]
    report: Option<PathBuf>,
    /// Take only shard K of N (0-based) of the clips, for N machines on shared storage; `auto`
    /// reads JOB_COMPLETION_INDEX (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm array).
    #[arg(long, value_name = "K/N|auto", help_heading = "Batch")]
    shard: Option<String>,
    /// Number of shards for `--shard auto` (default: JOB_COMPLETIONS or SLURM_ARRAY_TASK_COUNT).
    #[arg(long, value_name = "N", help_heading = "Batch")]
    shard_count: Option<usize>,
    #[command(flatten)]
    segment: SegmentArg,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Videos to run (default: the 1080p samples the set-up makes).
    #[arg(value_name = "SOURCES")]
    sources: Vec<PathBuf>,
    /// Counted runs per source, after one warm-up run. Each run restores --frames frames
    /// (default 250: 10 s of the samples); a line is printed as each finishes.
    #[arg(long, default_value_t = defaults::BENCH_REPEAT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    repeat: usize,
    /// What to time: all (pipeline, enhance-only ceiling and feeder), pipeline, enhance, or
    /// feeder (every stage but the model: what the CPU side can feed a GPU).
    #[arg(long, value_enum, default_value = "all")]
    stage: Stage,
    /// Write the results as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// How long each enhance-only run (the ceiling) lasts at least, in seconds, after its first
    /// four batches a worker: a fast model is timed long enough to be steady.
    #[arg(long, value_name = "SECONDS", default_value_t = defaults::BENCH_CEILING_S, value_parser = parse_ceiling_s)]
    ceiling_s: f64,
    /// Time still images instead of videos: the pictures of DIR, or without DIR 1024x1024
    /// portraits made from the set-up's portrait, streamed as `batch` streams them; a row per
    /// batch size (images/s, ms per batch, memory, ceiling, efficiency, latency of one image).
    #[arg(long, value_name = "DIR", num_args = 0..=1, help_heading = "Portraits")]
    portraits: Option<Option<PathBuf>>,
    /// Batch sizes to time with --portraits, comma-separated.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', default_values_t = portraits::DEFAULT_BATCHES, help_heading = "Portraits")]
    batches: Vec<usize>,
    /// Portraits to make with --portraits and no DIR.
    #[arg(long, value_name = "N", default_value_t = portraits::DEFAULT_IMAGES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10000), help_heading = "Portraits")]
    images: usize,
    /// The machine's price per hour: adds the cost of 1,000 images to the --portraits table.
    #[arg(long, value_name = "PRICE", help_heading = "Portraits")]
    price_per_hour: Option<f64>,
    #[command(flatten)]
    run: RunArgs,
}

/// Options shared by a run and a benchmark: the files and devices, and the treatment (every
/// flag that changes the output, `config::Treatment`).
#[derive(Args, Debug)]
struct RunArgs {
    /// Restorer: a name (`gpen-video models list`: the registry's and your own, `models add`) or
    /// an ONNX file with input [N,3,S,S] in [-1,1] (GPEN-BFR, GFPGAN, RestoreFormer++, CodeFormer).
    /// Default: models/GPEN-BFR-512.onnx; without it the run is refused (a stand-in that restores
    /// nothing runs only when named here).
    #[arg(long, value_name = "NAME|PATH", env = "GPEN_VIDEO_MODEL", help_heading = "Model")]
    model: Option<String>,
    /// Where the model runs: cpu, cpu:N (N CPU sessions), cuda:N, cuda:N,M or cuda:all. One
    /// enhancement worker per GPU; batches go to whichever is free.
    #[arg(long, default_value = "cpu", value_parser = parse_device, help_heading = "Model")]
    device: Device,
    /// CPU threads for ONNX Runtime (default: all cores).
    #[arg(long, value_name = "N", help_heading = "Model")]
    threads: Option<usize>,
    /// Use ONNX Runtime's TensorRT provider (engine cache beside the model) before CUDA.
    #[arg(long, help_heading = "Model")]
    trt: bool,
    /// Decode on the GPU with FFmpeg's hwaccel (only `cuda`).
    #[arg(long, value_name = "KIND", value_parser = ["cuda"], help_heading = "Input")]
    hwaccel: Option<String>,
    /// Where detection and the face mesh run: `cpu` (a pool of CPU threads, beside a model on
    /// the GPU too) or `gpu` (the first GPU of --device; slow while their input shapes vary).
    #[arg(long, value_name = "WHERE", default_value = "cpu", value_parser = ["cpu", "gpu"], help_heading = "Detection")]
    detect_device: String,
    /// Face detector: a CenterFace ONNX file with dynamic input size (default: models/centerface.onnx).
    #[arg(long, value_name = "PATH", help_heading = "Detection")]
    detector: Option<PathBuf>,
    /// Face mesh: MediaPipe's face landmark model as ONNX (default: models/face-mesh.onnx, which
    /// the set-up makes), or `none`. With it, detections it does not take for faces are dropped,
    /// faces are aligned by points from the mesh and pasted through their own outline.
    #[arg(long, value_name = "PATH|none", help_heading = "Detection")]
    mesh: Option<PathBuf>,
    #[command(flatten)]
    treatment: Treatment,
    /// Nothing on the terminal when all goes well: no progress bar, no summary, no information
    /// lines (warnings and errors still show).
    #[arg(long, short, help_heading = "Output")]
    quiet: bool,
    /// The whole summary when done: flicker and identity figures, each stage's threads, busy
    /// share and core-ms per face, each worker's batches (by default one line).
    #[arg(long, short = 'v', visible_alias = "verbose", help_heading = "Output")]
    stats: bool,
}

impl RunArgs {
    /// The log level when RUST_LOG does not set one: warnings only for --quiet.
    fn log_filter(&self) -> &'static str {
        if self.quiet {
            "warn"
        } else {
            "gpen_video=info,warn"
        }
    }
}

fn parse_device(s: &str) -> Result<Device, String> {
    s.parse()
}

/// `s` as seconds from 0 to `most`, or `None`.
fn seconds_up_to(s: &str, most: f64) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| (0.0..=most).contains(v))
}

fn parse_segment(s: &str) -> Result<f64, String> {
    seconds_up_to(s, f64::MAX).ok_or_else(|| format!("`{s}` is not a length in seconds: give 0 (never cut) or more"))
}

fn parse_ceiling_s(s: &str) -> Result<f64, String> {
    seconds_up_to(s, 3600.0).ok_or_else(|| format!("`{s}` is not a time in seconds from 0 to 3600"))
}

impl RunArgs {
    fn options(self, input: PathBuf, output: PathBuf) -> anyhow::Result<Options> {
        let mut o = Options::new(input, output);
        let model = self.model.as_deref().map(registry::resolve).transpose()?;
        o.model = model.as_ref().map(|m| m.path.clone());
        o.model_template = model.as_ref().and_then(|m| m.template);
        o.detector = self.detector;
        o.mesh = self.mesh;
        o.device = self.device;
        o.threads = self.threads;
        o.trt = self.trt;
        o.hwaccel_cuda = self.hwaccel.is_some();
        o.detect_gpu = self.detect_device == "gpu";
        o.treatment = self.treatment;
        // A registered model's own default fidelity, where --fidelity is not given.
        if o.treatment.fidelity.is_none() {
            o.treatment.fidelity = model.and_then(|m| m.fidelity);
        }
        Ok(o)
    }
}

fn main() -> ExitCode {
    // SAFETY: mallopt only sets an allocator parameter, here before any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, gpen_video::defaults::MMAP_THRESHOLD as i32);
    }
    let cli = Cli::parse();
    let level = match &cli.cmd {
        None => cli.run.log_filter(),
        Some(Cmd::Bench(b)) => b.run.log_filter(),
        Some(Cmd::Batch(b)) => b.run.log_filter(),
        Some(Cmd::Serve(s)) => s.run.log_filter(),
        Some(Cmd::Models { .. } | Cmd::HelpMarkdown) => "gpen_video=info,warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()))
        .with_writer(|| gpen_video::api::console::LogWriter)
        .fmt_fields(gpen_video::api::console::log_fields())
        // Colour codes only for a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let result = match cli.cmd {
        Some(Cmd::Models { cmd }) => registry::run(cmd),
        Some(Cmd::Bench(b)) => run_bench(b),
        Some(Cmd::Batch(b)) => return run_batch(b),
        Some(Cmd::Serve(s)) => run_serve(s),
        Some(Cmd::HelpMarkdown) => {
            print_text(&flags_markdown());
            Ok(())
        }
        None => run(cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint_line(&format!("error: {e:#}"));
            // A command a signal stopped exits as the shell reports it (130, 143).
            gpen_video::api::interrupt::exit_code_if_stopped().map_or(ExitCode::FAILURE, ExitCode::from)
        }
    }
}

/// The flag reference in docs/flags.md: every command, argument and flag with its help text,
/// written by clap-markdown from the declarations above, so it cannot drift from `--help`.
fn flags_markdown() -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("Flag reference".to_string())
        .show_footer(false);
    let body = clap_markdown::help_markdown_custom::<Cli>(&options);
    format!(
        "<!-- Made by `gpen-video help-markdown` from the command line's clap declarations: \
         refresh with `cargo run --release -- help-markdown > docs/flags.md`. -->\n\n{body}"
    )
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (Some(input), Some(output)) = (cli.input, cli.output) else {
        bail!("give IN and OUT (see --help)")
    };
    let (quiet, stats) = (cli.run.quiet, cli.run.stats);
    if output.exists() {
        if cli.keep {
            if !quiet {
                eprint_line(&format!("{} exists: kept as it is (-n)", output.display()));
            }
            return Ok(());
        }
        if !cli.overwrite {
            bail!(
                "{} exists: pass -y to replace it (or -n to keep it and end at once)",
                output.display()
            );
        }
    }
    let mut o = cli.run.options(input, output)?;
    o.faces_json = cli.faces_json;
    o.identity = cli.identity;
    o.stats_json = cli.stats_json;
    // Ctrl-C stops the run (also while models load); the partial output is removed and the
    // exit code is 130.
    let interrupts = gpen_video::api::interrupt::install()?;
    let settings = Settings::resolve(&o)?;
    let job = settings.job(&o.input, &o.output, CancelToken::from_flag(interrupts.soft.clone()))?;
    anyhow::Context::with_context(job.check_webp_size(), || format!("output {}", o.output.display()))?;
    // A segmented run judges what it can before its folder is made (a run in one piece refuses
    // the same before its first frame).
    if cli.segment.seconds > 0.0 {
        gpen_video::api::ready::check(&settings)?;
    }
    if let Some(work) = gpen_video::api::segment::Work::open(&settings, &job, cli.segment.seconds, cli.force)? {
        return run_segmented(
            &settings,
            &job,
            &work,
            cli.jobs as usize,
            o.threads.is_some(),
            (quiet, stats),
            &interrupts,
        );
    }
    if cli.jobs > 1 && !gpen_video::api::media::kind::is_still(&o.output) {
        tracing::info!(
            "the video is one segment (under 1.5 x --segment): --jobs {} has nothing to share out",
            cli.jobs
        );
    }
    let mut engine = settings.engine(&job)?;
    tracing::info!(
        input = %o.input.display(),
        size = %format!("{}x{}", job.source.width, job.source.height),
        model = %settings.recipe.model.path().display(),
        crop = engine.info.size,
        batch = engine.batch,
        workers = engine.workers.len(),
        "starting"
    );
    let total = job.source.frames_to_run(job.treatment.max_frames);
    let bar = progress_bar(total.unwrap_or(0), quiet);
    let summary = pipeline::run(&mut engine, &job, &|p| show_progress(&bar, p, ""));
    if summary.is_ok() {
        hold_after_output();
    }
    // A run that finished has renamed OUT into place, complete: a signal that came after that
    // changes nothing, and the status says so.
    if interrupts.requested() && summary.is_err() {
        bar.abandon();
        eprint_line(&format!("interrupted: {} not written", o.output.display()));
        std::process::exit(i32::from(interrupts.exit_code()));
    }
    if interrupts.requested() {
        eprint_line(&format!(
            "{} is complete and in place: the interrupt came after it was finished",
            o.output.display()
        ));
    }
    let summary = summary?;
    bar.finish_and_clear();
    if stats {
        eprint_line(&format!("{}: {summary}", o.output.display()));
    } else if !quiet {
        eprint_line(&format!("{}: {}", o.output.display(), summary.headline()));
        if let Some(line) = summary.identity_line() {
            eprint_line(&format!("  {line}"));
        }
    }
    if summary.faces == 0 && summary.left.total() > 0 {
        tracing::info!(
            "no face was restored in {}: every face found was {}",
            o.input.display(),
            summary.left.words().unwrap_or_default()
        );
    } else if summary.faces == 0 {
        tracing::warn!(
            "no face was found in {}: {} is the input re-encoded, unchanged (--det-threshold lower finds fainter faces)",
            o.input.display(),
            o.output.display()
        );
    }
    stale_segments_note(&o.output);
    if let Some(path) = &settings.stats_json {
        write_stats(path, &summary.to_json())?;
    }
    Ok(())
}

/// Writes a run's statistics to PATH, or to standard output for `-`.
fn write_stats(path: &std::path::Path, json: &str) -> anyhow::Result<()> {
    if path.as_os_str() == "-" {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{json}").and_then(|()| out.flush())?;
        return Ok(());
    }
    gpen_video::api::output::write_atomic(path, (json.to_string() + "\n").as_bytes())
}

/// The progress bar of a run on a terminal (hidden for --quiet or when stderr is not one):
/// frames against the total, the faces restored, frames a second and the time left.
fn progress_bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} frames  {msg}  ETA {eta}")
            .expect("valid template"),
    );
    bar
}

/// Shows `p` on `bar`: faces restored and frames a second (one decimal), then `extra`.
fn show_progress(bar: &ProgressBar, p: pipeline::Progress, extra: &str) {
    bar.set_position(p.frames);
    let secs = bar.elapsed().as_secs_f64();
    let fps = if secs > 0.5 { p.frames as f64 / secs } else { 0.0 };
    bar.set_message(format!("{} faces  {fps:.1} fps{extra}", p.faces));
}

/// Names the work folder an earlier segmented run of `output` left beside it (killed, or run
/// with another `--segment`), which this whole run did not use: it is kept (a rerun with
/// `--segment` resumes from it) and said, with its size, so it is not forgotten.
fn stale_segments_note(output: &std::path::Path) {
    let dir = gpen_video::api::segment::work_dir(output);
    if !dir.is_dir() {
        return;
    }
    let bytes = gpen_video::api::output::bytes_under(&dir);
    eprint_line(&format!(
        "note: {} ({:.1} MB) holds the segments of an earlier segmented run of {}; this run did not use them: remove the folder, or rerun with --segment to resume from it",
        dir.display(),
        bytes as f64 / 1e6,
        output.display()
    ));
}

/// `gpen-video serve`: the engine's settings resolved once, then the service until a signal.
fn run_serve(s: ServeArgs) -> anyhow::Result<()> {
    let interrupts = gpen_video::api::interrupt::install()?;
    let settings = Settings::resolve(&s.run.options(PathBuf::new(), PathBuf::new())?)?;
    // What can never run is refused before the service listens: a fidelity its model has no
    // input for, a `--face` photo that is not a picture of a face (each described once).
    gpen_video::api::ready::check(&settings)?;
    let photos: Vec<&std::path::Path> = s.faces.iter().map(|(_, p)| p.as_path()).collect();
    anyhow::Context::context(gpen_video::api::ready::describe_photos(&settings, &photos), "--face")?;
    let opts = gpen_video::api::serve::ServeOptions {
        listen: s.listen,
        max_wait: std::time::Duration::from_millis(s.max_wait_ms),
        queue: s.queue,
        max_body: (s.max_body_mb * 1024 * 1024) as usize,
        max_pixels: s.max_pixels,
        read_timeout: std::time::Duration::from_secs(s.read_timeout_s),
        deadline: std::time::Duration::from_secs(s.deadline_s),
        jobs: gpen_video::api::serve::jobs::JobsOptions {
            dir: match s.jobs_dir {
                Some(d) => d,
                None => gpen_video::api::serve::jobs::default_dir()?,
            },
            max_upload: s.max_job_mb.saturating_mul(1_000_000),
            quota: positive("--jobs-quota-gb", s.jobs_quota_gb)?.mul_add(1e9, 0.0) as u64,
            ttl: std::time::Duration::from_secs_f64(positive("--job-ttl-h", s.job_ttl_h)? * 3600.0),
            max_jobs: s.max_jobs,
            segment: s.job_segment_s,
            max_pixels: s.max_pixels,
            max_photo_bytes: s.max_body_mb * 1024 * 1024,
            faces: s.faces.into_iter().collect(),
            db: s.jobs_db.filter(|u| !u.is_empty()),
            lease: std::time::Duration::from_secs_f64(at_least_1("--job-lease-s", s.job_lease_s)?),
        },
        token: token_of(s.token)?,
        allow_hosts: s.allow_host,
        min_upload_rate: s.min_upload_kbs.saturating_mul(1000),
    };
    gpen_video::api::serve::run(settings, opts, &interrupts)
}

/// A `--face NAME=PHOTO`: a name of letters, digits, `-` and `_`, and a photo that is a file.
fn face_of(arg: &str) -> Result<(String, std::path::PathBuf), String> {
    let (name, photo) = arg.split_once('=').ok_or_else(|| format!("`{arg}`: give NAME=PHOTO"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("`{name}`: a face's name is letters, digits, - and _"));
    }
    let photo = std::path::PathBuf::from(photo);
    if !photo.is_file() {
        return Err(format!("{}: no such photo", photo.display()));
    }
    Ok((name.to_string(), photo))
}

/// The service's token, from --token or GPEN_VIDEO_TOKEN: none when neither is given; one that
/// is empty (an unset variable in a template, a typo) is refused rather than left open.
fn token_of(flag: Option<String>) -> anyhow::Result<Option<String>> {
    let (given, from) = match flag {
        Some(t) => (Some(t), "--token"),
        None => (std::env::var("GPEN_VIDEO_TOKEN").ok(), "GPEN_VIDEO_TOKEN"),
    };
    match given {
        Some(t) if t.trim().is_empty() => anyhow::bail!(
            "{from} is empty: give the token the service should require, or leave {from} out to run without one"
        ),
        t => Ok(t),
    }
}

/// `value` when it is a positive finite number, else an error naming `flag`.
fn at_least_1(flag: &str, value: f64) -> anyhow::Result<f64> {
    if value.is_finite() && value >= 1.0 {
        Ok(value)
    } else {
        bail!("{flag} must be at least 1 (seconds), got {value}")
    }
}

fn positive(flag: &str, value: f64) -> anyhow::Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        bail!("{flag} must be above 0, got {value}")
    }
}

/// A long video in segments: restores the unfinished ones (`jobs` at once), joins OUT.
fn run_segmented(
    settings: &Settings,
    job: &gpen_video::api::engine::Job,
    work: &gpen_video::api::segment::Work,
    jobs: usize,
    threads_given: bool,
    (quiet, stats): (bool, bool),
    interrupts: &gpen_video::api::interrupt::Interrupts,
) -> anyhow::Result<()> {
    let total = work.segments().len();
    tracing::info!(
        input = %job.source.path.display(),
        size = %format!("{}x{}", job.source.width, job.source.height),
        model = %settings.recipe.model.path().display(),
        segments = total,
        jobs,
        "starting"
    );
    let bar = progress_bar(work.frames(), quiet);
    let all = |_: &gpen_video::api::segment::plan::Segment| true;
    let share = gpen_video::api::segment::Share {
        jobs,
        threads_given,
        mine: &all,
        wait: true,
        // Ctrl-C cancels the segments in flight (the job's cancel token).
        stop: &|| false,
        claims: &gpen_video::api::segment::FileClaims,
        engine: None,
    };
    let done = gpen_video::api::segment::run(settings, job, work, &share, &|p, segs| {
        show_progress(&bar, p, &format!("  {segs}/{total} segments"));
    });
    if done.as_ref().is_ok_and(|d| d.joined.is_some()) {
        hold_after_output();
    }
    let out = job.output.display();
    if interrupts.requested() && done.is_err() {
        bar.abandon();
        eprint_line(&format!(
            "interrupted: {out} not written; the finished segments are kept in {}: run the same command again to resume",
            work.dir().display()
        ));
        std::process::exit(i32::from(interrupts.exit_code()));
    }
    let done = done.map_err(|e| {
        e.context(format!(
            "{out} not written; the finished segments are kept in {}: run the same command again to resume",
            work.dir().display()
        ))
    })?;
    bar.finish_and_clear();
    if !quiet {
        eprint_line(&format!("{out}: {}", gpen_video::api::segment::describe(&done, total)));
    }
    for (record, summary) in &done.restored {
        if stats {
            eprint_line(&format!("segment {}: {summary}", record.number + 1));
        } else {
            tracing::info!(segment = record.number + 1, "{}", summary.headline());
        }
    }
    if let Some(path) = &settings.stats_json {
        let segments: Vec<serde_json::Value> = done
            .restored
            .iter()
            .map(|(r, s)| {
                serde_json::json!({
                    "segment": r.number,
                    "frames": r.frames,
                    "warm_frames": r.warm_frames,
                    "wall_s": r.wall_s,
                    "summary": serde_json::from_str::<serde_json::Value>(&s.to_json()).unwrap_or_default(),
                })
            })
            .collect();
        let json = serde_json::json!({
            "segments": total,
            "restored_here": segments,
            "kept": done.kept,
            "joined": done.joined.as_ref().map(|j| serde_json::json!({
                "frames": j.frames, "faces": j.faces, "warm_frames": j.warm_frames, "join_s": j.join.as_secs_f64(),
                "frames_with_hands": j.hands_frames,
            })),
        });
        write_stats(path, &json.to_string())?;
    }
    if done.joined.is_none() && !done.joined_elsewhere {
        bail!("{out} not joined: other segments are not done (another process holds them)");
    }
    Ok(())
}

/// Test hook: waits `GPEN_VIDEO_HOLD_AFTER_OUTPUT_MS` milliseconds once OUT is in place, so a
/// test can send a signal after the rename. Not a user feature.
fn hold_after_output() {
    if let Some(ms) = std::env::var("GPEN_VIDEO_HOLD_AFTER_OUTPUT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

fn run_bench(b: BenchArgs) -> anyhow::Result<()> {
    if b.portraits.is_some() {
        return run_bench_portraits(b);
    }
    if b.price_per_hour.is_some() {
        bail!("--price-per-hour goes with --portraits");
    }
    let sources = if b.sources.is_empty() {
        defaults::BENCH_SOURCES.iter().filter_map(|s| find_asset(s)).collect()
    } else {
        b.sources
    };
    let json = b.json;
    let quiet = b.run.quiet;
    let interrupts = gpen_video::api::interrupt::install()?;
    let settings = Settings::resolve(&b.run.options(PathBuf::new(), PathBuf::new())?)?;
    if let Some(path) = &json {
        let taken: Vec<&std::path::Path> = sources.iter().map(PathBuf::as_path).collect();
        gpen_video::api::output::check_side_output(
            path,
            &[
                taken,
                vec![settings.recipe.model.path(), settings.recipe.detector.path()],
            ]
            .concat(),
        )?;
    }
    let mut settings = settings;
    if settings.recipe.treatment.max_frames.is_none() {
        let mut t = (*settings.recipe.treatment).clone();
        t.max_frames = Some(defaults::BENCH_FRAMES);
        settings.recipe.treatment = std::sync::Arc::new(t);
    }
    let opts = BenchOptions {
        sources,
        repeat: b.repeat,
        stage: b.stage,
        ceiling_time: std::time::Duration::from_secs_f64(b.ceiling_s),
        settings,
        cancel: CancelToken::from_flag(interrupts.soft.clone()),
        bar: !quiet && std::io::stderr().is_terminal(),
    };
    let report = bench::run(&opts, &|line| {
        if !quiet {
            eprint_line(line)
        }
    })?;
    print_text(&report.table());
    if let Some(path) = json {
        gpen_video::api::output::write_atomic(&path, report.to_json().as_bytes())?;
    }
    Ok(())
}

fn run_bench_portraits(b: BenchArgs) -> anyhow::Result<()> {
    if !b.sources.is_empty() {
        bail!("--portraits takes a folder (--portraits DIR), not video sources");
    }
    let interrupts = gpen_video::api::interrupt::install()?;
    let settings = Settings::resolve(&b.run.options(PathBuf::new(), PathBuf::new())?)?;
    if let Some(path) = &b.json {
        gpen_video::api::output::check_side_output(
            path,
            &[settings.recipe.model.path(), settings.recipe.detector.path()],
        )?;
    }
    let opts = portraits::PortraitOptions {
        dir: b.portraits.flatten(),
        images: b.images,
        batches: b.batches,
        repeat: b.repeat,
        ceiling_time: std::time::Duration::from_secs_f64(b.ceiling_s),
        price_per_hour: b.price_per_hour,
        settings,
        cancel: CancelToken::from_flag(interrupts.soft.clone()),
    };
    let report = portraits::run(&opts, &|line| eprint_line(line))?;
    print_text(&report.table());
    if let Some(path) = b.json {
        gpen_video::api::output::write_atomic(&path, report.to_json().as_bytes())?;
    }
    Ok(())
}

fn run_batch(b: BatchArgs) -> ExitCode {
    let result = (|| -> anyhow::Result<u8> {
        let interrupts = gpen_video::api::interrupt::install()?;
        let opts = gpen_video::api::batch::BatchOptions {
            in_dir: b.in_dir,
            out_dir: b.out_dir,
            recursive: b.recursive,
            follow_links_out: b.follow_links_out,
            globs: b.globs,
            jobs: b.jobs.map(usize::from),
            force: b.force,
            report: b.report,
            shard: b.shard,
            shard_count: b.shard_count,
            // --quiet: only what went wrong is said; with --stats, every clip's line too.
            quiet: b.run.quiet && !b.run.stats,
            segment: b.segment.seconds,
            base: b.run.options(PathBuf::new(), PathBuf::new())?,
        };
        Ok(gpen_video::api::batch::run(&opts, &interrupts)?.exit_code())
    })();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprint_line(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use gpen_video::api::batch::manifest::settings_hash;

    use super::*;

    /// Every flag of `RunArgs`: `Some(value)` for a flag that changes what a job writes (the
    /// value to try; "" for a switch), `None` for one that changes only speed or display.
    const FLAGS: &[(&str, Option<&str>)] = &[
        ("model", Some("other-model.onnx")),
        ("detector", Some("other-detector.onnx")),
        ("batch", Some("8")),
        ("fp16", Some("")),
        ("fidelity", Some("0.3")),
        ("frames", Some("10")),
        ("det_size", Some("320")),
        ("det_threshold", Some("0.7")),
        ("detect_every", Some("2")),
        ("max_faces", Some("3")),
        ("blend", Some("0.5")),
        ("smooth", Some("2")),
        ("mask", Some("box")),
        ("mesh", Some("none")),
        ("face_check", Some("0.7")),
        ("color_fix", Some("off")),
        ("identity_guard", Some("warn")),
        ("occlusion", Some("off")),
        ("only_face", Some("someone.jpg")),
        ("skip_face", Some("someone-else.jpg")),
        ("face_distance", Some("0.5")),
        ("min_face", Some("40")),
        ("temporal", Some("2")),
        ("compare", Some("side")),
        ("codec", Some("mpeg4")),
        ("crf", Some("20")),
        ("preset", Some("fast")),
        ("quality", Some("80")),
        ("device", None),
        ("threads", None),
        ("trt", None),
        ("hwaccel", None),
        ("detect_device", None),
        ("quiet", None),
        ("stats", None),
    ];

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        run: RunArgs,
    }

    fn hash(dir: &std::path::Path, extra: &[String]) -> String {
        let mut args = vec!["t".to_string()];
        for (flag, file) in [("--model", "model.onnx"), ("--detector", "detector.onnx")] {
            if !extra.iter().any(|a| a == flag) {
                args.extend([flag.to_string(), file.to_string()]);
            }
        }
        args.extend(extra.iter().cloned());
        let args: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a.ends_with(".onnx") {
                    dir.join(a).display().to_string()
                } else {
                    a
                }
            })
            .collect();
        let run = Run::try_parse_from(&args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .run;
        let o = run.options(PathBuf::new(), PathBuf::new()).unwrap();
        settings_hash(&Settings::resolve(&o).unwrap().recipe)
    }

    #[test]
    fn negative_numbers_reach_the_range_checks() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["model", "detector"] {
            std::fs::write(dir.path().join(format!("{name}.onnx")), b"x").unwrap();
        }
        let at = |f: &str| dir.path().join(f).display().to_string();
        let resolve = |flag: &str, value: &str| -> String {
            let args = [
                "t",
                "--model",
                &at("model.onnx"),
                "--detector",
                &at("detector.onnx"),
                flag,
                value,
            ];
            let cli = Cli::try_parse_from(
                ["gpen-video", "in.mp4", "out.mp4"]
                    .into_iter()
                    .chain(args[1..].iter().copied()),
            );
            let cli = match cli {
                Ok(cli) => cli,
                Err(e) => return e.to_string(),
            };
            let o = cli.run.options(PathBuf::new(), PathBuf::new()).unwrap();
            Settings::resolve(&o)
                .map(|_| "accepted".to_string())
                .unwrap_or_else(|e| e.to_string())
        };
        assert_eq!(resolve("--blend", "-1"), "--blend must be between 0 and 1, got -1");
        assert!(resolve("--smooth", "-2").contains("--smooth must be between 0"));
        assert!(resolve("--det-threshold", "-0.5").contains("--det-threshold must be above 0"));
        let crf = resolve("--crf", "-5");
        assert!(
            crf.contains("-5 is below 0: give 0") && !crf.contains("4294967295"),
            "{crf}"
        );
        let q = resolve("--quality", "-1");
        assert!(q.contains("-1 is below 0: give 1 (smallest file) to 100"), "{q}");
        assert!(resolve("--crf", "x").contains("`x` is not a whole number"));
        assert_eq!(resolve("--crf", "20"), "accepted");
        // A batch takes them too.
        let batch = Cli::try_parse_from(["gpen-video", "batch", "a", "b", "--blend", "-1"]);
        assert!(batch.is_ok(), "{:?}", batch.err().map(|e| e.to_string()));
    }

    #[test]
    fn every_flag_that_changes_the_output_changes_the_settings_hash() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("model", 1), ("other-model", 2), ("detector", 3), ("other-detector", 4)] {
            std::fs::write(dir.path().join(format!("{name}.onnx")), vec![0u8; bytes]).unwrap();
        }
        let cmd = Run::command();
        let ids: Vec<String> = cmd
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .filter(|id| id != "help")
            .collect();
        for id in &ids {
            assert!(
                FLAGS.iter().any(|(f, _)| f == id),
                "--{id} is new: list it in FLAGS as changing the output (with a value to try) or not"
            );
        }
        let plain = hash(dir.path(), &[]);
        assert_eq!(plain, hash(dir.path(), &[]), "the hash is stable");
        for (id, value) in FLAGS {
            assert!(
                ids.iter().any(|i| i == id),
                "FLAGS names --{id}, which RunArgs no longer has"
            );
            let flag = format!("--{}", id.replace('_', "-"));
            let extra: Vec<String> = match value {
                None => continue,
                Some("") => vec![flag.clone()],
                Some(v) => vec![flag.clone(), v.to_string()],
            };
            assert_ne!(
                plain,
                hash(dir.path(), &extra),
                "{flag} changes the output but not the settings hash"
            );
        }
        // Options that change only how fast leave it alone.
        let speed = ["--device", "cpu:2", "--threads", "1", "--quiet"].map(String::from);
        assert_eq!(plain, hash(dir.path(), &speed));
    }
}
