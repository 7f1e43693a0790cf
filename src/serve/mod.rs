//! `gpen-video serve`: in, HTTP requests carrying images, or videos and photos as jobs (and the
//! run's settings, loaded once); out, each image restored, answered in its own format or the one
//! asked for, with the faces found and timings; jobs restored in the background and fetched
//! later (`jobs`, `job_api`); a page for browsers (`page`); health and Prometheus metrics.
//!
//! ```text
//!  HTTP (axum on tokio)            engine thread (one Engine, one image stream at a time)
//!  POST /v1/restore ─ limits ─> channel ─> run_images: decode ─> detect ─> ... ─> encode ─> reply
//!   body read with a deadline,   (queue     crops of concurrent requests fill the model's
//!   size and pixels checked      bounded)   batches; a lone one waits at most --max-wait-ms
//! ```
//! Every request's picture goes through the very pipeline `batch` streams a folder's stills
//! through (`pipeline::run_images`), in memory from the body to the answer (FFmpeg reads the
//! body through a custom I/O context and the restored picture is encoded to memory: nothing is
//! written to disk). So the bytes answered are what `gpen-video IN OUT` writes for the same
//! picture and settings. Every route goes through [`guard`] (who may call) first. Limits come before any decoding: the body's
//! size (413), the picture's pixels read from its header (413: a decompression bomb is never
//! allocated), the queue (503 with Retry-After), the time to send the body (408) and to answer
//! (504); an unreadable picture is a 400 that says why. SIGTERM or Ctrl-C: no new connection,
//! the requests in flight are answered, exit 0.

mod face_boxes;
mod job_api;
pub(crate) mod jobs;
pub(crate) mod metrics;
mod page;
pub(crate) mod shared;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use parking_lot::Mutex;

use crate::engine::{kind_of, Failure, Kind};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use crate::config::Settings;
use crate::engine::{CancelToken, Engine, Job};
use crate::faces::enhance::Live;
use crate::interrupt::Interrupts;
use crate::pipeline::ImageDone;
use metrics::{Metrics, Outcome};

/// How the service runs, besides the run settings.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Longest a crop waits for others to fill its batch.
    pub max_wait: Duration,
    /// Requests accepted at once (queued or in the pipeline); more get 503.
    pub queue: usize,
    pub max_body: usize,
    pub max_pixels: u64,
    /// Time a client has to send its whole body.
    pub read_timeout: Duration,
    /// Time from a request's arrival to its answer.
    pub deadline: Duration,
    /// Where and how jobs are kept (`/v1/jobs`).
    pub jobs: jobs::JobsOptions,
    /// Every API call and the page need `Authorization: Bearer TOKEN` when set.
    pub token: Option<String>,
    /// Host names answered besides the listening address and loopback names (`--allow-host`;
    /// without a token every other Host is refused, against DNS rebinding).
    pub allow_hosts: Vec<String>,
    /// Slowest average an upload may come at once `--read-timeout-s` has passed, bytes a second.
    pub min_upload_rate: u64,
}

/// Where a picture's result goes.
type Reply = tokio::sync::oneshot::Sender<Result<ImageDone>>;

/// A picture on its way to the engine, and where its result goes.
struct Submit {
    job: Job,
    reply: Reply,
}

/// What the handlers share.
struct App {
    settings: Settings,
    opts: ServeOptions,
    metrics: Metrics,
    tx: Mutex<Option<crossbeam_channel::Sender<Submit>>>,
    ready: AtomicBool,
    /// The workers' running counts (filled once the engine is loaded).
    workers: Mutex<Vec<(String, Arc<Live>)>>,
    batch: AtomicU64,
    /// The `--queue` places: a request holds one from its admission to its answer.
    places: Arc<tokio::sync::Semaphore>,
    /// Video and photo jobs (`/v1/jobs`), run one at a time on a thread of their own.
    jobs: Arc<jobs::Jobs>,
    /// Set when the service stops: uploads in flight end at once (503) instead of holding it.
    stopping: tokio::sync::watch::Sender<bool>,
}

/// Checks the request's `Authorization: Bearer` against `--token` (when one is set), in time
/// that does not depend on how much of it matches.
fn authorize(app: &App, headers: &axum::http::HeaderMap) -> Result<()> {
    let Some(token) = &app.opts.token else { return Ok(()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::to_string)
        .or_else(|| page::cookie_token(headers))
        .unwrap_or_default();
    if same(given.as_bytes(), token.as_bytes()) {
        Ok(())
    } else if given.is_empty() {
        Err(Failure::error(
            Kind::Unauthorized,
            "this service needs its token: send Authorization: Bearer TOKEN",
        ))
    } else {
        Err(Failure::error(Kind::Unauthorized, "wrong token"))
    }
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme in any case, RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `host` (a Host header: a name or an address, maybe with a port) may be answered
/// by a service listening on `listen` without a token: a loopback name or address, the address
/// it listens on (any address where it listens on all of them), or one of `allowed`. A name a
/// web site controls (DNS rebinding) is none of these.
fn host_allowed(host: &str, listen: SocketAddr, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(h, _)| h),
    };
    if name.is_empty() {
        return false;
    }
    if allowed
        .iter()
        .any(|a| a.eq_ignore_ascii_case(name) || a.eq_ignore_ascii_case(host))
    {
        return true;
    }
    let lower = name.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip == listen.ip() || listen.ip().is_unspecified(),
        Err(_) => false,
    }
}

/// Who may call (every route): without a token, only requests for a Host this service is
/// ([`host_allowed`]); with or without one, a request that changes something (POST, DELETE...)
/// only from the service's own origin when a browser says where it comes from (`Origin`, else
/// `Sec-Fetch-Site`): another site, or another port of this host (the same site to a cookie),
/// is refused. Every answer forbids framing.
async fn guard(State(app): State<Arc<App>>, req: Request, next: axum::middleware::Next) -> Response {
    let checked = caller_checked(&app.opts, req.method(), req.headers());
    let mut response = match checked {
        Ok(()) => next.run(req).await,
        Err(e) => {
            tracing::info!(method = %req.method(), path = %req.uri().path(), "refused: {e:#}");
            discard(req.into_body(), &app.opts).await;
            refuse(&e).0
        }
    };
    let h = response.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("frame-ancestors 'none'"),
        );
    }
    response
}

/// The checks of [`guard`].
fn caller_checked(opts: &ServeOptions, method: &axum::http::Method, headers: &axum::http::HeaderMap) -> Result<()> {
    use axum::http::Method;
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if opts.token.is_none() && !host_allowed(host, opts.listen, &opts.allow_hosts) {
        return Err(Failure::error(
            Kind::Forbidden,
            format!(
                "this service does not answer for the host {host:?}: open it by its address or as localhost, or start it with --allow-host NAME (or --token)"
            ),
        ));
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let own = |origin: &str| {
        ["http://", "https://"].iter().any(|s| {
            origin
                .strip_prefix(s)
                .is_some_and(|o| !host.is_empty() && o.eq_ignore_ascii_case(host))
        })
    };
    let foreign = match (header("origin"), header("sec-fetch-site")) {
        (Some(origin), _) => !own(origin),
        (None, Some(site)) => matches!(site, "cross-site" | "same-site"),
        (None, None) => false,
    };
    if foreign {
        return Err(Failure::error(
            Kind::Forbidden,
            format!(
                "a request from another site ({}) may not change anything here: use this service's own page or a client of your own",
                header("origin").unwrap_or("another origin")
            ),
        ));
    }
    Ok(())
}

/// A request's query as `T`, each parameter checked by its name first, so that a misspelt or
/// unknown one is refused by name (400) instead of ignored, and a bad value names its
/// parameter; `takes` says what the query takes.
fn query_of<T: serde::de::DeserializeOwned>(raw: Option<&str>, takes: &str) -> Result<T> {
    let bad = |m: String| Failure::error(Kind::BadInput, m);
    let raw = raw.unwrap_or("");
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
        .map_err(|e| bad(format!("the query cannot be read ({e}): it takes {takes}")))?;
    for (k, v) in &pairs {
        let one = serde_urlencoded::to_string([(k, v)]).unwrap_or_default();
        if let Err(e) = serde_urlencoded::from_str::<T>(&one) {
            let e = e.to_string();
            return Err(bad(if e.starts_with("unknown field") {
                format!("{k}: no such parameter; the query takes {takes}")
            } else {
                format!("{k}={v}: {e}; the query takes {takes}")
            }));
        }
    }
    serde_urlencoded::from_str(raw).map_err(|e| bad(format!("{e}: the query takes {takes}")))
}

/// Whether `a` equals `b`, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// The query of `POST /v1/restore`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreQuery {
    format: Option<String>,
    /// The treatment's flags a photo may set ([`PHOTO_FLAGS`]), parsed by the treatment as a
    /// job's are.
    blend: Option<String>,
    compare: Option<String>,
    json: Option<u8>,
}

/// The treatment's flags `POST /v1/restore` takes, by their command-line names: each parsed
/// and checked as a job's flags are ([`crate::treatment::Treatment::with_query`]).
const PHOTO_FLAGS: [&str; 2] = ["blend", "compare"];

/// Image formats the service takes and answers, by the extension its writer goes by.
const FORMATS: [&str; 5] = ["png", "jpg", "webp", "tiff", "bmp"];

/// The video containers a job's result is kept in, by extension (see [`FORMATS`]).
const VIDEO_FORMATS: [&str; 3] = ["mp4", "mov", "mkv"];

/// The content type of a file the service answers, by its extension.
fn mime_of(ext: &str) -> &'static str {
    mime_guess::from_ext(ext)
        .first_raw()
        .unwrap_or("application/octet-stream")
}

/// The picture format of `bytes` by their first bytes, as the extension of [`FORMATS`] its
/// writer goes by; `None` for anything else (a video, garbage, a picture of a format the
/// service does not take).
pub(crate) fn picture_type(bytes: &[u8]) -> Option<&'static str> {
    use image::ImageFormat;
    match crate::media::still_in::format_of(bytes)? {
        ImageFormat::Png => Some("png"),
        ImageFormat::Jpeg => Some("jpg"),
        ImageFormat::WebP => Some("webp"),
        ImageFormat::Tiff => Some("tiff"),
        ImageFormat::Bmp => Some("bmp"),
        _ => None,
    }
}

/// Serves until SIGTERM or Ctrl-C, then answers the requests in flight and returns.
pub fn run(settings: Settings, opts: ServeOptions, ints: &Interrupts) -> Result<()> {
    // A service runs for weeks with threads that come and go (the async runtime's blocking
    // pool): glibc's default of an allocation arena per thread, up to eight per core, let its
    // memory creep by fragmentation (+90 MiB over 10,000 requests; flat with two arenas, see
    // scripts/bench-serve.sh).
    // SAFETY: mallopt only sets an allocator parameter; called before this command starts any
    // thread of its own.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    // Every request waiting for the engine holds a place, so the channel never holds more.
    let (tx, rx) = crossbeam_channel::bounded::<Submit>(opts.queue);
    let jobs = jobs::Jobs::open(settings.clone(), opts.jobs.clone())?;
    let app = Arc::new(App {
        jobs: jobs.clone(),
        stopping: tokio::sync::watch::Sender::new(false),
        settings,
        opts: opts.clone(),
        metrics: Metrics::default(),
        tx: Mutex::new(Some(tx)),
        ready: AtomicBool::new(false),
        workers: Mutex::new(Vec::new()),
        batch: AtomicU64::new(0),
        places: Arc::new(tokio::sync::Semaphore::new(opts.queue)),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(opts.listen))
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let local = listener.local_addr()?;
    // Set by the engine thread when the model cannot load: the service stops as on a signal
    // (but exits with the reason, not as interrupted).
    let failed = Arc::new(AtomicBool::new(false));
    let (engine_app, engine_stop) = (app.clone(), failed.clone());
    let engine = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || engine_loop(&engine_app, &rx, &engine_stop))
        .context("cannot start the engine thread")?;
    let mut job_threads = Vec::new();
    for (name, lane) in [("jobs", jobs::Lane::Films), ("photo-jobs", jobs::Lane::Photos)] {
        let jobs = jobs.clone();
        job_threads.push(
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || jobs.run(lane))
                .context("cannot start the jobs thread")?,
        );
    }
    say_where(&opts, local);
    if let Some((shown, replica)) = jobs.shared_as() {
        crate::console::eprint!(
            "gpen-video serve: jobs shared with the other replicas through {shown} (--jobs-db), as replica {replica}"
        );
    }
    let router = Router::new()
        .route("/v1/restore", post(restore))
        .route("/v1/jobs", post(job_api::create).get(job_api::list))
        .route("/v1/jobs/{id}", get(job_api::show).delete(job_api::delete))
        .route("/v1/jobs/{id}/result", get(job_api::result))
        .route("/v1/jobs/{id}/cancel", post(job_api::cancel))
        .route("/v1/jobs/{id}/input", get(job_api::input))
        .route("/v1/jobs/{id}/faces", get(job_api::faces))
        .route("/v1/info", get(page::info))
        .route("/", get(page::page))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_page))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .layer(DefaultBodyLimit::disable())
        .with_state(app.clone());
    let (soft, hard, signal) = (ints.soft.clone(), ints.hard.clone(), ints.signal.clone());
    // A second signal: stop at once, as a run does.
    runtime.spawn(async move {
        while !hard.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        crate::console::eprint!(
            "gpen-video serve: stopped at once (second signal); requests in flight were not answered"
        );
        std::process::exit(128 + signal.load(Ordering::SeqCst));
    });
    let header_timeout = opts.read_timeout;
    // Requests accepted are answered within --deadline-s; what still holds a connection after
    // that and a little more (a long download) is cut off.
    let bound = opts.deadline + Duration::from_secs(5);
    let stop_app = app.clone();
    let served = runtime.block_on(serve_connections(
        listener,
        router,
        (header_timeout, bound),
        async move {
            while !soft.load(Ordering::SeqCst) && !failed.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stop_app.stopping.send_replace(true);
            tracing::info!("stopping: no new connections; answering the requests in flight, uploads in flight refused");
        },
    ));
    // Every handler has answered: the engine's stream ends with its channel; the running job
    // stops where it is (queued again: it resumes at the next start).
    app.tx.lock().take();
    jobs.stop();
    for t in job_threads {
        t.join()
            .map_err(|_| anyhow!("internal error: a jobs thread panicked"))?;
    }
    let engine = engine
        .join()
        .map_err(|_| anyhow!("internal error: the engine thread panicked"))?;
    served.context("the HTTP server failed")?;
    engine.context("the service could not load its model")?;
    crate::console::eprint!("gpen-video serve: stopped");
    Ok(())
}

/// Says where the jobs are kept, where the service listens and where its page is.
fn say_where(opts: &ServeOptions, local: std::net::SocketAddr) {
    crate::console::eprint!(
        "gpen-video serve: jobs kept in {} (--jobs-dir)",
        opts.jobs.dir.display()
    );
    crate::console::eprint!(
        "gpen-video serve: listening on http://{local} (POST /v1/restore, /v1/jobs, GET /healthz, GET /metrics)"
    );
    crate::console::eprint!(
        "gpen-video serve: the page: open http://{local}/{} in a browser",
        if opts.token.is_some() {
            "?token=TOKEN (your --token)"
        } else {
            ""
        }
    );
}

/// Accepts connections until `stop` resolves, each served by hyper's HTTP/1 with a deadline
/// on its headers (`header_timeout`: a client that never finishes them is cut off), then waits
/// for the connections in flight to answer what they accepted, at most `bound`.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: Router,
    (header_timeout, bound): (Duration, Duration),
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    // Out of file descriptors and the like: wait and go on.
                    Err(e) => {
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let service = hyper_util::service::TowerToHyperService::new(router.clone());
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(TokioTimer::new()).header_read_timeout(header_timeout);
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(bound, graceful.shutdown()).await.is_err() {
        tracing::warn!(
            "connections still open {} s after the stop were cut off",
            bound.as_secs()
        );
    }
    Ok(())
}

/// Loads the engine, then runs image streams of the submitted pictures until the channel
/// closes; a stream the model broke is followed by one on fresh sessions.
fn engine_loop(app: &App, rx: &crossbeam_channel::Receiver<Submit>, stop: &AtomicBool) -> Result<()> {
    let mut engine = match app.settings.engine_for_images() {
        Ok(e) => e,
        Err(e) => {
            // Nothing can be served: the service stops (and exits non-zero with the reason, so
            // a health check or an orchestrator sees it fail instead of waiting on "loading"),
            // every request that came meanwhile answered with the reason.
            let why = format!("{e:#}");
            tracing::error!("cannot load the engine, stopping: {why}");
            stop.store(true, Ordering::SeqCst);
            for s in rx {
                let _ = s
                    .reply
                    .send(Err(anyhow!("the service could not load its model: {why}")));
            }
            return Err(e);
        }
    };
    publish_workers(app, &engine);
    app.ready.store(true, Ordering::SeqCst);
    tracing::info!(model = %app.settings.recipe.model.path().display(), batch = engine.batch, workers = engine.workers.len(), "ready");
    let long_side = app.settings.recipe.treatment.detection.det_size;
    while let Ok(first) = rx.recv() {
        // Each picture carries its reply: the stream answers it when the picture is done.
        let mut next = || rx.recv().ok().map(|s| (s.job, s.reply));
        let done = |reply: Reply, r: Result<ImageDone>| {
            let _ = reply.send(r);
        };
        let r = crate::pipeline::run_images(
            &mut engine,
            (long_side, Some(app.opts.max_wait)),
            (first.job, first.reply),
            &mut next,
            &done,
        );
        if let Err(e) = r {
            tracing::warn!("the image stream broke ({e:#}); loading fresh sessions");
            engine = app.settings.engine_for_images()?;
            publish_workers(app, &engine);
        }
    }
    Ok(())
}

fn publish_workers(app: &App, engine: &Engine) {
    *app.workers.lock() = engine
        .workers
        .iter()
        .map(|w| (w.target.to_string(), w.live.clone()))
        .collect();
    app.batch.store(engine.batch as u64, Ordering::Relaxed);
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    if app.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading the model\n").into_response()
    }
}

async fn metrics_page(State(app): State<Arc<App>>) -> Response {
    let workers = app.workers.lock().clone();
    let in_flight = app.opts.queue.saturating_sub(app.places.available_permits()) as u64;
    let mut registry = prometheus_client::registry::Registry::default();
    app.metrics.register(
        &mut registry,
        &workers,
        app.batch.load(Ordering::Relaxed) as usize,
        (in_flight, app.opts.queue as u64),
    );
    let seconds = app.jobs.seconds.lock().clone();
    let read = tokio::task::block_in_place(|| -> Result<_> {
        let shared = app.jobs.holdings()?;
        Ok((app.jobs.counts()?, shared))
    });
    // The jobs' figures cannot be read (the database is down): the scrape fails and says why,
    // rather than report no jobs.
    let (counts, shared) = match read {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("/metrics: cannot read the jobs' figures: {e:#}");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the jobs' figures: {e:#}\n"),
            )
                .into_response();
        }
    };
    metrics::register_jobs(&mut registry, counts, &seconds);
    if let Some(held) = shared {
        metrics::register_shared(&mut registry, held);
    }
    let (page, kind) = metrics::page(&registry);
    ([(header::CONTENT_TYPE, kind)], page).into_response()
}

/// Takes one of the service's `--queue` places, or fails busy: a full service refuses before
/// reading anything.
fn take_place(app: &App) -> Result<tokio::sync::OwnedSemaphorePermit> {
    app.places.clone().try_acquire_owned().map_err(|_| {
        Failure::error(
            Kind::Busy,
            format!(
                "busy: {} requests are being restored; retry after a second",
                app.opts.queue
            ),
        )
    })
}

/// The HTTP status and the metrics outcome of an error of `kind`: the one place a failure
/// becomes a status.
fn status_of(kind: Kind) -> (StatusCode, Outcome) {
    match kind {
        Kind::BadInput => (StatusCode::BAD_REQUEST, Outcome::BadRequest),
        Kind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, Outcome::TooLarge),
        Kind::Busy | Kind::Cancelled => (StatusCode::SERVICE_UNAVAILABLE, Outcome::Busy),
        Kind::Slow => (StatusCode::REQUEST_TIMEOUT, Outcome::SlowClient),
        Kind::Deadline => (StatusCode::GATEWAY_TIMEOUT, Outcome::Timeout),
        Kind::Engine | Kind::Io => (StatusCode::INTERNAL_SERVER_ERROR, Outcome::Error),
        Kind::NotFound => (StatusCode::NOT_FOUND, Outcome::BadRequest),
        Kind::Conflict => (StatusCode::CONFLICT, Outcome::BadRequest),
        Kind::TooMany => (StatusCode::TOO_MANY_REQUESTS, Outcome::Busy),
        Kind::Unauthorized => (StatusCode::UNAUTHORIZED, Outcome::BadRequest),
        Kind::Forbidden => (StatusCode::FORBIDDEN, Outcome::BadRequest),
    }
}

/// What a request asked for besides its picture, checked.
struct Ask {
    /// The answer's format (its writer's extension); `None`: the upload's own.
    format: Option<&'static str>,
    view: Option<crate::frame::View>,
    json: bool,
}

impl Ask {
    fn of(q: &RestoreQuery, treatment: &crate::treatment::Treatment) -> Result<Ask> {
        let bad = |m: String| Failure::error(Kind::BadInput, m);
        let format = match q.format.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => None,
            Some("jpeg") => Some("jpg"),
            Some("tif") => Some("tiff"),
            Some(f) => Some(
                FORMATS
                    .into_iter()
                    .find(|e| *e == f)
                    .ok_or_else(|| bad(format!("format={f}: give png, jpg, webp, tiff or bmp")))?,
            ),
        };
        let flags: Vec<(String, String)> = PHOTO_FLAGS
            .iter()
            .zip([&q.blend, &q.compare])
            .filter_map(|(k, v)| Some((k.to_string(), v.clone()?)))
            .collect();
        let t = treatment
            .with_query(&flags, &PHOTO_FLAGS)
            .map_err(|e| bad(format!("{e:#}")))?;
        let view = (!flags.is_empty()).then(|| t.view());
        Ok(Ask {
            format,
            view,
            json: q.json == Some(1),
        })
    }
}

/// Reads the whole body within `--read-timeout-s` and `--max-body-mb`.
async fn receive(body: Body, opts: &ServeOptions) -> Result<axum::body::Bytes> {
    let bytes = match tokio::time::timeout(opts.read_timeout, axum::body::to_bytes(body, opts.max_body)).await {
        Err(_) => {
            return Err(Failure::error(
                Kind::Slow,
                format!("the image did not arrive within {} s", opts.read_timeout.as_secs_f64()),
            ))
        }
        // axum says a body over the limit only in words: its error's source is http-body's
        // `LengthLimitError`.
        Ok(Err(e)) if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) => {
            return Err(Failure::error(
                Kind::TooLarge,
                format!("the body is larger than {} bytes (--max-body-mb)", opts.max_body),
            ))
        }
        Ok(Err(e)) => {
            return Err(Failure::error(
                Kind::BadInput,
                format!("the image was not received whole ({e})"),
            ))
        }
        Ok(Ok(b)) => b,
    };
    if bytes.is_empty() {
        return Err(Failure::error(
            Kind::BadInput,
            "empty body: send the image's bytes (JPEG, PNG, WebP, TIFF or BMP)",
        ));
    }
    Ok(bytes)
}

/// The picture's format (its writer's extension), checked before anything is decoded: its
/// header read by the decoder that will decode it, under that decoder's limits (see
/// [`crate::media::still_in`]), its size within `--max-pixels`. A picture too large is a 413;
/// one whose header cannot be read (damaged, cut short, animated) a 400 that says why.
fn check_picture(bytes: &[u8], max_pixels: u64) -> Result<&'static str> {
    use crate::media::still_in::{header, Unread};
    let Some(ext) = picture_type(bytes) else {
        return Err(Failure::error(
            Kind::BadInput,
            "not a picture this service takes: send JPEG, PNG, WebP, TIFF or BMP bytes",
        ));
    };
    let name = std::path::PathBuf::from(format!("upload.{ext}"));
    match header(&name, Some(bytes), Some(max_pixels)) {
        Ok(Some(_)) => Ok(ext),
        Ok(None) => Err(Failure::error(
            Kind::BadInput,
            "not a picture this service takes: send JPEG, PNG, WebP, TIFF or BMP bytes",
        )),
        Err(Unread::TooLarge(width, height)) => Err(Failure::error(
            Kind::TooLarge,
            format!(
                "a {}x{} picture ({:.1} megapixels) is larger than this service takes ({:.1}, --max-pixels); scale it down first",
                width,
                height,
                width.saturating_mul(height) as f64 / 1e6,
                max_pixels as f64 / 1e6
            ),
        )),
        Err(e) => Err(Failure::error(
            Kind::BadInput,
            format!("{:#}", e.into_error(&name, Some(bytes), Some(max_pixels))),
        )),
    }
}

/// The request's query checked and a place in the queue taken, or why not.
fn admit(
    app: &App,
    headers: &axum::http::HeaderMap,
    query: Option<&str>,
) -> Result<(Ask, tokio::sync::OwnedSemaphorePermit)> {
    authorize(app, headers)?;
    if !app.ready.load(Ordering::SeqCst) {
        return Err(Failure::error(Kind::Busy, "loading the model; try again shortly"));
    }
    let q: RestoreQuery = query_of(
        query,
        "format=png|jpg|webp|tiff|bmp, blend=0..1, compare=side|split|none, json=1",
    )?;
    let ask = Ask::of(&q, &app.settings.recipe.treatment)?;
    Ok((ask, take_place(app)?))
}

/// Restores one request's picture, in memory from its body to the answer's bytes. A refused
/// request's body is read and dropped first (see [`discard`]).
async fn restore_one(app: &Arc<App>, query: Option<String>, req: Request, start: Instant) -> Result<Restored> {
    let opts = &app.opts;
    let (parts, body) = req.into_parts();
    let (ask, _place) = match admit(app, &parts.headers, query.as_deref()) {
        Ok(a) => a,
        Err(e) => {
            discard(body, opts).await;
            return Err(e);
        }
    };
    let bytes = receive(body, opts).await?;
    let in_ext = check_picture(&bytes, opts.max_pixels)?;
    let format = ask.format.unwrap_or(in_ext);
    // Probing opens the picture with FFmpeg: off the async threads.
    let cancel = CancelToken::new();
    let job = {
        let (app, cancel) = (app.clone(), cancel.clone());
        let bytes: Arc<[u8]> = Arc::from(&bytes[..]);
        tokio::task::spawn_blocking(move || {
            app.settings
                .job_in_memory((bytes, app.opts.max_pixels), in_ext, format, cancel)
        })
        .await
        .map_err(|_| Failure::error(Kind::Engine, "internal error"))?
    };
    let mut job = job.context("the picture cannot be read")?;
    job.view = ask.view;
    // The format is the client's choice: one its picture does not fit is a bad request.
    job.check_webp_size()
        .map_err(|e| Failure::error(Kind::BadInput, format!("{e:#}")))?;
    let (reply, result) = tokio::sync::oneshot::channel();
    let sent = app
        .tx
        .lock()
        .as_ref()
        .is_some_and(|tx| tx.try_send(Submit { job, reply }).is_ok());
    if !sent {
        return Err(Failure::error(Kind::Busy, "the service is stopping"));
    }
    // The picture's request is cancelled when this future is dropped (a client that left) or
    // its deadline passes: it is dropped where the pipeline meets it next.
    let _cancel_on_drop = CancelOnDrop(cancel);
    let left = opts.deadline.saturating_sub(start.elapsed());
    let done = match tokio::time::timeout(left, result).await {
        Err(_) => {
            return Err(Failure::error(
                Kind::Deadline,
                format!("not restored within {} s (--deadline-s)", opts.deadline.as_secs_f64()),
            ))
        }
        Ok(Err(_)) => return Err(Failure::error(Kind::Engine, "the engine stopped")),
        Ok(Ok(r)) => r?,
    };
    Ok(Restored {
        done,
        format,
        json: ask.json,
    })
}

/// Cancels its token when dropped.
struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A restored picture and how to answer it.
struct Restored {
    done: ImageDone,
    format: &'static str,
    json: bool,
}

/// The answer to a restored picture: the picture in its format with the faces and timings in
/// headers, or with `?json=1` a JSON record of them.
fn respond(r: Restored, start: Instant) -> Response {
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let Restored { done, format, json } = r;
    let image = done.bytes.unwrap_or_default();
    if json {
        let record = serde_json::json!({
            "faces": done.boxes.iter().map(|b| serde_json::json!({"bbox": b})).collect::<Vec<_>>(),
            "format": format,
            "bytes": image.len(),
            "pipeline_ms": done.seconds * 1e3,
            "total_ms": ms,
        });
        return ([(header::CONTENT_TYPE, "application/json")], record.to_string() + "\n").into_response();
    }
    let mime = mime_of(format);
    let mut r = ([(header::CONTENT_TYPE, mime)], image).into_response();
    let h = r.headers_mut();
    h.insert("x-faces", HeaderValue::from(done.faces));
    if let Ok(v) = HeaderValue::from_str(&format!("total;dur={ms:.1}, pipeline;dur={:.1}", done.seconds * 1e3)) {
        h.insert("server-timing", v);
    }
    if let Ok(v) = HeaderValue::from_str(&serde_json::to_string(&done.boxes).unwrap_or_default()) {
        h.insert("x-face-boxes", v);
    }
    r
}

async fn restore(State(app): State<Arc<App>>, RawQuery(query): RawQuery, req: Request) -> Response {
    let start = Instant::now();
    // A client that closes the connection drops this future before its answer: the guard
    // logs and counts it then.
    let mut gone = Gone {
        app: app.clone(),
        start,
        answered: false,
    };
    let (response, outcome, faces) = match restore_one(&app, query, req, start).await {
        Ok(r) => {
            let faces = r.done.faces;
            (respond(r, start), Outcome::Ok, faces)
        }
        Err(e) => {
            let (response, outcome) = refuse(&e);
            (response, outcome, 0)
        }
    };
    gone.answered = true;
    log_request(&app, start, &response, outcome, faces);
    response
}

/// Logs and counts a request whose client left before its answer (see [`restore`]).
struct Gone {
    app: Arc<App>,
    start: Instant,
    answered: bool,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.app.metrics.record(Outcome::ClientGone, self.start.elapsed(), 0);
        tracing::info!(
            method = "POST",
            path = "/v1/restore",
            outcome = "client_gone",
            ms = format!("{:.1}", self.start.elapsed().as_secs_f64() * 1e3),
            "request: the client closed the connection before its answer"
        );
    }
}

/// Logs and counts a request's answer.
fn log_request(app: &App, start: Instant, response: &Response, outcome: Outcome, faces: u64) {
    let bytes = axum::body::HttpBody::size_hint(response.body()).exact().unwrap_or(0);
    app.metrics.record(outcome, start.elapsed(), faces);
    tracing::info!(
        method = "POST",
        path = "/v1/restore",
        status = response.status().as_u16(),
        bytes,
        faces,
        ms = format!("{:.1}", start.elapsed().as_secs_f64() * 1e3),
        "request"
    );
}

/// Reads and drops what a refused request still sends (at most `--max-body-mb`, within
/// `--read-timeout-s`), so the client, still writing, gets the answer instead of a broken
/// connection; nothing of it is kept.
async fn discard(body: Body, opts: &ServeOptions) {
    discard_up_to(body, opts.max_body as u64, opts).await;
}

/// [`discard`] of at most `limit` bytes.
async fn discard_up_to(mut body: Body, limit: u64, opts: &ServeOptions) {
    use axum::body::HttpBody;
    let _ = tokio::time::timeout(opts.read_timeout, async {
        let mut seen = 0u64;
        while let Some(Ok(frame)) = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await {
            seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            if seen > limit {
                break;
            }
        }
    })
    .await;
}

/// The answer to a failed request: its status by its kind, the error in words.
fn refuse(e: &anyhow::Error) -> (Response, Outcome) {
    refuse_in(kind_of(e), &format!("{e:#}"))
}

/// [`refuse`] of a failure of `kind` said in `words`.
fn refuse_in(kind: Kind, words: &str) -> (Response, Outcome) {
    let (status, outcome) = status_of(kind);
    let mut response = (status, format!("{words}\n")).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    (response, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_failure_has_its_status() {
        let status = |k| status_of(k).0.as_u16();
        assert_eq!(status(Kind::BadInput), 400);
        assert_eq!(status(Kind::TooLarge), 413);
        assert_eq!(status(Kind::Busy), 503);
        assert_eq!(status(Kind::Slow), 408);
        assert_eq!(status(Kind::Deadline), 504);
        assert_eq!(status(Kind::Engine), 500);
        assert_eq!(status(Kind::NotFound), 404);
        assert_eq!(status(Kind::Conflict), 409);
        assert_eq!(status(Kind::TooMany), 429);
        assert_eq!(status(Kind::Unauthorized), 401);
        assert_eq!(status(Kind::Forbidden), 403);
        let e = Failure::error(Kind::TooLarge, "big").context("the upload");
        assert_eq!(
            refuse(&e).0.status().as_u16(),
            413,
            "a kind survives the context put on it"
        );
    }

    /// A photo's blend and compare are parsed by the treatment as a job's are: the same
    /// range, the same words, and `compare=none` asks for no view here too.
    #[test]
    fn a_photos_flags_are_parsed_as_a_jobs() {
        let base = crate::treatment::Treatment {
            compare: Some(crate::frame::Compare::Side),
            ..Default::default()
        };
        let ask = |blend: Option<&str>, compare: Option<&str>| {
            let q = RestoreQuery {
                blend: blend.map(str::to_string),
                compare: compare.map(str::to_string),
                ..RestoreQuery::default()
            };
            Ask::of(&q, &base)
        };
        assert!(ask(None, None).unwrap().view.is_none());
        let v = ask(None, Some("none")).unwrap().view.unwrap();
        assert_eq!(v.compare, None, "compare=none takes the service's view away");
        let v = ask(Some("0.25"), Some("split")).unwrap().view.unwrap();
        assert_eq!((v.blend, v.compare), (0.25, Some(crate::frame::Compare::Split)));
        for (blend, compare, word) in [
            (Some("2"), None, "blend"),
            (Some("lots"), None, "blend=lots"),
            (None, Some("sideways"), "compare=sideways"),
        ] {
            let e = format!("{:#}", ask(blend, compare).err().unwrap());
            assert!(e.contains(word) && !e.contains("--"), "{e}");
            let job = base.with_query(
                &[(
                    word.split('=').next().unwrap().to_string(),
                    blend.or(compare).unwrap().to_string(),
                )],
                &crate::treatment::JOB_FLAGS,
            );
            assert_eq!(
                format!("{:#}", job.err().unwrap()),
                e,
                "a job is refused in the same words"
            );
        }
    }
}
