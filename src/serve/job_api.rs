//! The jobs' HTTP side: in, `POST/GET/DELETE /v1/jobs...` requests (uploads streamed to disk
//! within `--max-job-mb` and the quota, never held whole in memory); out, JSON records and the
//! result file, whole or the byte range asked for (so a browser's player can seek).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use anyhow::Result;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use super::jobs::{not_found, valid_id, JobQuery, Jobs};
use super::App;
use crate::engine::{Failure, Kind};

/// A JSON answer.
fn json(status: StatusCode, v: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string() + "\n",
    )
        .into_response()
}

/// An error as the API answers it: its status by kind, the message in words, the jobs folder's
/// place on the server never shown.
fn error(app: &App, e: &anyhow::Error) -> Response {
    let words = app.jobs.in_words(&format!("{e:#}"), None);
    let (mut r, _) = super::refuse_in(crate::engine::kind_of(e), &words);
    if r.status() == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

fn jobs_of(app: &App) -> &Arc<Jobs> {
    &app.jobs
}

/// The job id of a path, checked before anything is looked up.
fn id_of(id: &str) -> Result<&str> {
    if valid_id(id) {
        Ok(id)
    } else {
        Err(not_found(id))
    }
}

/// `POST /v1/jobs`: the body streamed into a new job's folder, checked, queued: 202 with the
/// job's record and its `Location`.
pub(super) async fn create(State(app): State<Arc<App>>, RawQuery(query): RawQuery, req: Request) -> Response {
    let start = Instant::now();
    let r = create_job(&app, query.as_deref(), req).await;
    let response = match r {
        Ok(rec) => {
            let mut r = json(StatusCode::ACCEPTED, &rec.answer());
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", rec.id)) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Err(e) => error(&app, &e),
    };
    tracing::info!(
        method = "POST",
        path = "/v1/jobs",
        status = response.status().as_u16(),
        ms = format!("{:.1}", start.elapsed().as_secs_f64() * 1e3),
        "request"
    );
    response
}

/// What a job's query takes, for the errors that say so.
const TAKES: &str = "name=FILE, model=NAME (GET /v1/info lists them), blend=0..1, mask=NAME, temporal=FRAMES, smooth=FRAMES, compare=side|split|none, only-face=NAME,..., skip-face=NAME,... (the faces the service holds: GET /v1/info), face-distance=D, min-face=PX";

async fn create_job(app: &Arc<App>, query: Option<&str>, req: Request) -> Result<super::jobs::Record> {
    let (parts, body) = req.into_parts();
    let checked = (|| -> Result<JobQuery> {
        super::authorize(app, &parts.headers)?;
        if !app.ready.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Failure::error(Kind::Busy, "loading the model; try again shortly"));
        }
        owner_of(&parts.headers)?;
        let q = JobQuery::parse(query.unwrap_or(""))?;
        app.jobs.check_query(&q).map_err(|e| {
            let words = format!("{e:#}");
            match words.split_once("; give ") {
                // An unknown parameter: all that a job's query takes.
                Some((head, _)) if head.ends_with("no such parameter") => {
                    Failure::error(Kind::BadInput, format!("{head}; the query takes {TAKES}"))
                }
                _ => e,
            }
        })?;
        Ok(q)
    })();
    let q = match checked {
        Ok(q) => q,
        Err(e) => {
            super::discard(body, &app.opts).await;
            return Err(e);
        }
    };
    let jobs = jobs_of(app).clone();
    let opts = &jobs.opts;
    let declared: Option<u64> = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    // An upload refused for its size is still read, up to a job's size and a photo's more
    // (`refused_drain`), so a client that sends its whole body before it reads the answer gets
    // the 413 rather than a broken pipe.
    let refused_drain = opts.max_upload + app.opts.max_body as u64;
    if let Some(n) = declared.filter(|&n| n > opts.max_upload) {
        super::discard_up_to(body, refused_drain, &app.opts).await;
        return Err(too_big(opts.max_upload, n));
    }
    // A place under --max-jobs and the quota for what is declared, taken off the async threads
    // (it walks the folder); nothing is removed for bytes that have not arrived.
    let mut upload = match blocking(app, move |jobs| jobs.begin_upload(declared)).await {
        Ok(u) => u,
        Err(e) => {
            super::discard(body, &app.opts).await;
            return Err(e);
        }
    };
    let part = upload.dir.join("input.part");
    receive_to(body, &part, &mut upload, (opts.max_upload, refused_drain), app).await?;
    // Probing opens the upload with FFmpeg: off the async threads.
    let owner = owner_of(&parts.headers)?.filter(|o| !o.is_empty());
    blocking(app, move |jobs| jobs.admit(upload, q, owner)).await
}

fn too_big(max: u64, sent: u64) -> anyhow::Error {
    Failure::error(
        Kind::TooLarge,
        format!(
            "the upload is larger than {} MB (--max-job-mb){}",
            max / 1_000_000,
            if sent > 0 {
                format!(": {} MB sent", sent / 1_000_000)
            } else {
                String::new()
            }
        ),
    )
}

/// Streams `body` into `path`, at most `limit` bytes, each piece taking its room under the
/// quota as it arrives; a body over `limit` is read on and dropped up to `drain` bytes in all
/// (see [`super::discard`]). Cut off when nothing arrives for `--read-timeout-s`, when after
/// that long it has come slower than `--min-upload-kbs` on average, or when the service stops.
async fn receive_to(
    body: Body,
    path: &std::path::Path,
    upload: &mut super::jobs::Upload,
    (limit, drain): (u64, u64),
    app: &App,
) -> Result<()> {
    let opts = &app.opts;
    let mut stop = app.stopping.subscribe();
    let mut body = body;
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| Failure::error(Kind::Io, format!("cannot store the upload ({e})")))?;
    let (started, mut last) = (Instant::now(), Instant::now());
    let mut seen = 0u64;
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        let frame = tokio::select! {
            f = next => Pace::Frame(f),
            () = tokio::time::sleep(std::time::Duration::from_millis(500)) => Pace::Wait,
            _ = stop.wait_for(|s| *s) => {
                return Err(Failure::error(
                    Kind::Busy,
                    "the service is stopping: send the upload again once it is back",
                ))
            }
        };
        check_pace(opts, started, last, seen)?;
        let frame = match frame {
            Pace::Wait => continue,
            Pace::Frame(None) => break,
            Pace::Frame(Some(Err(e))) => {
                return Err(Failure::error(
                    Kind::BadInput,
                    format!("the upload was not received whole ({e})"),
                ))
            }
            Pace::Frame(Some(Ok(f))) => f,
        };
        let Some(data) = frame.data_ref() else { continue };
        last = Instant::now();
        let n = data.len() as u64;
        seen += n;
        if seen > limit {
            drop(file);
            super::discard_up_to(body, drain.saturating_sub(seen), opts).await;
            return Err(too_big(limit, 0));
        }
        if upload.fits(n) {
            upload.take(n)?;
        } else {
            // The room grows: it walks the folder and may remove an old result.
            tokio::task::block_in_place(|| upload.take(n))?;
        }
        file.write_all(data)
            .await
            .map_err(|e| Failure::error(Kind::Io, format!("cannot store the upload ({e})")))?;
    }
    file.flush().await?;
    if seen == 0 {
        return Err(Failure::error(Kind::BadInput, "empty body: send a video or a photo"));
    }
    Ok(())
}

/// What waiting for an upload's next piece gave: a piece (or its end), or a tick to check the
/// pace.
enum Pace<F> {
    Frame(Option<F>),
    Wait,
}

/// Whether an upload `seen` bytes in is keeping pace: something arrived within
/// `--read-timeout-s`, and past that long its average is at least `--min-upload-kbs`.
fn check_pace(opts: &super::ServeOptions, started: Instant, last: Instant, seen: u64) -> Result<()> {
    if last.elapsed() > opts.read_timeout {
        return Err(Failure::error(
            Kind::Slow,
            format!(
                "the upload stalled: nothing arrived for {} s (--read-timeout-s)",
                opts.read_timeout.as_secs()
            ),
        ));
    }
    let grace = opts.read_timeout.as_secs_f64();
    let secs = started.elapsed().as_secs_f64();
    let min = opts.min_upload_rate as f64;
    if secs > grace && (seen as f64) < min * (secs - grace) {
        return Err(Failure::error(
            Kind::Slow,
            format!(
                "the upload is too slow: {:.1} KB in {secs:.0} s, under {:.0} KB/s (--min-upload-kbs)",
                seen as f64 / 1e3,
                min / 1e3
            ),
        ));
    }
    Ok(())
}

/// The header that carries a browser's own key: an opaque string the page makes once and keeps,
/// so that a list answers each visitor the jobs it made.
pub const OWNER: &str = "x-gpen-owner";

/// The caller's key (`X-Gpen-Owner`): 1 to 128 letters, digits, `-` and `_`; `None` without one.
fn owner_of(headers: &HeaderMap) -> Result<Option<String>> {
    let Some(v) = headers.get(OWNER) else { return Ok(None) };
    let v = v.to_str().unwrap_or("\u{1}");
    if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(Failure::error(
            Kind::BadInput,
            "X-Gpen-Owner: give 1 to 128 letters, digits, - and _ (a key of your own)",
        ));
    }
    Ok(Some(v.to_string()))
}

/// `GET /v1/jobs`: the caller's jobs, oldest first: those made with its `X-Gpen-Owner` key, or
/// without one those made without one; with `--token` and no key, every job.
pub(super) async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let owner = match super::authorize(&app, &headers).and_then(|()| owner_of(&headers)) {
        Ok(o) => o,
        Err(e) => return error(&app, &e),
    };
    let owner = match (owner, app.opts.token.is_some()) {
        (Some(o), _) => Some(o),
        (None, true) => None,
        (None, false) => Some(String::new()),
    };
    let listed = blocking(&app, move |jobs| jobs.list(owner.as_deref())).await;
    match listed {
        Ok(jobs) => json(StatusCode::OK, &serde_json::json!({ "jobs": jobs })),
        Err(e) => error(&app, &e),
    }
}

/// `f` on the jobs, off the async threads: it walks the folder, probes an upload with FFmpeg,
/// and with a jobs database each call is a query.
async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&Arc<Jobs>) -> Result<T> + Send + 'static,
) -> Result<T> {
    let jobs = jobs_of(app).clone();
    tokio::task::spawn_blocking(move || f(&jobs))
        .await
        .unwrap_or_else(|_| Err(Failure::error(Kind::Engine, "internal error")))
}

/// `f` on job `id` (the caller authorized, the id checked first), off the async threads.
async fn on_job<T: Send + 'static>(
    app: &Arc<App>,
    headers: &HeaderMap,
    id: &str,
    f: impl FnOnce(&Jobs, &str) -> Result<T> + Send + 'static,
) -> Result<T> {
    super::authorize(app, headers)?;
    let id = id_of(id)?.to_string();
    blocking(app, move |jobs| f(jobs, &id)).await
}

/// `GET /v1/jobs/{id}`: the job's record with its progress (and a queued job's `place`).
pub(super) async fn show(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    match on_job(&app, &headers, &id, |jobs, id| {
        jobs.answer(id)?.ok_or_else(|| not_found(id))
    })
    .await
    {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => error(&app, &e),
    }
}

/// `GET /v1/jobs/{id}/faces`: where a done job found its faces: the picture's `width` and
/// `height`, a clip's `fps`, and the `frames` kept (every `every`-th), each its `frame` index, a
/// clip's time `t` in seconds and its `boxes` (`[x0, y0, x1, y1]` in the picture's pixels,
/// largest first). 404 until the job is done, and for a job without the record.
pub(super) async fn faces(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    match on_job(&app, &headers, &id, |jobs, id| jobs.faces(id)).await {
        Ok(bytes) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => error(&app, &e),
    }
}

/// `POST /v1/jobs/{id}/cancel`: stops a queued or running job; it stays listed as `cancelled`
/// (a finished job is left as it is). Its record.
pub(super) async fn cancel(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    let answered = on_job(&app, &headers, &id, |jobs, id| {
        jobs.cancel(id)?;
        jobs.answer(id)?.ok_or_else(|| not_found(id))
    });
    match answered.await {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => error(&app, &e),
    }
}

/// `DELETE /v1/jobs/{id}`: cancels the job and removes it with its files.
pub(super) async fn delete(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    match on_job(&app, &headers, &id, |jobs, id| jobs.delete(id)).await {
        Ok(rec) => json(
            StatusCode::OK,
            &serde_json::json!({"id": rec.id, "state": "cancelled", "removed": true}),
        ),
        Err(e) => error(&app, &e),
    }
}

/// The byte range a `Range` header asks of a file of `len` bytes: `Ok(None)` for the whole file
/// (no header, or one this server does not split: several ranges, other units), `Err` when it
/// cannot be satisfied.
pub fn range_of(header: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        // The last b bytes.
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        (len.saturating_sub(n), len.saturating_sub(1))
    } else {
        let start: u64 = a.parse().map_err(|_| ())?;
        let end = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            b.parse::<u64>().map_err(|_| ())?.min(len.saturating_sub(1))
        };
        (start, end)
    };
    if len == 0 || start >= len || end < start {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// `GET /v1/jobs/{id}/result`: the result file, or the byte range asked (206), inline (a
/// player, an `<img>`) unless `?download=1`.
pub(super) async fn result(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    serve_file(&app, &id, query.as_deref(), &headers, false)
}

/// `GET /v1/jobs/{id}/input`: a done job's input as it was uploaded (the "before" of a
/// comparison), served as the result is.
pub(super) async fn input(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    serve_file(&app, &id, query.as_deref(), &headers, true)
}

/// A done job's result (or its input), whole or the byte range asked.
fn serve_file(app: &Arc<App>, id: &str, query: Option<&str>, headers: &HeaderMap, input: bool) -> Response {
    let app = app.clone();
    let found = super::authorize(&app, headers)
        .and_then(|()| super::query_of::<ResultQuery>(query, "download=1"))
        .and_then(|q| Ok((q, id_of(id)?.to_string())))
        .and_then(|(q, id)| {
            let jobs = jobs_of(&app);
            // A query with a jobs database: off the async thread while it waits.
            let file = tokio::task::block_in_place(|| if input { jobs.input(&id) } else { jobs.result(&id) })?;
            Ok((q, file))
        });
    let (q, (rec, file)) = match found {
        Ok(f) => f,
        Err(e) => return error(&app, &e),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let (status, start, end) = match range_of(range, len) {
        Ok(None) => (StatusCode::OK, 0, len.saturating_sub(1)),
        Ok(Some((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b),
        Err(()) => {
            let mut r = (
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("range not satisfiable: the result has {len} bytes\n"),
            )
                .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    let count = if len == 0 { 0 } else { end - start + 1 };
    let mut file = file;
    if start > 0 {
        use std::io::Seek;
        if let Err(e) = file.seek(std::io::SeekFrom::Start(start)) {
            return error(
                &app,
                &Failure::error(Kind::Io, format!("cannot read job {}'s result: {e}", rec.id)),
            );
        }
    }
    let body = FileBody {
        file: tokio::fs::File::from_std(file),
        left: count,
        buf: Vec::new(),
    };
    let mut r = Response::new(Body::new(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    let ext = std::path::Path::new(if input { &rec.input } else { &rec.output })
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(super::mime_of(ext)));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    let disposition = if q.download == Some(1) { "attachment" } else { "inline" };
    let name = if input { rec.input.clone() } else { rec.download_name() };
    if let Ok(v) = HeaderValue::from_str(&format!("{disposition}; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// The query of `GET /v1/jobs/{id}/result`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultQuery {
    /// 1: as an attachment (a download), else inline.
    download: Option<u8>,
}

/// A file's bytes from where it stands, `left` of them, read as the client takes them.
struct FileBody {
    file: tokio::fs::File,
    left: u64,
    buf: Vec<u8>,
}

impl HttpBody for FileBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let n = this.left.min(1 << 16) as usize;
        this.buf.resize(n, 0);
        let mut rb = ReadBuf::new(&mut this.buf[..n]);
        match Pin::new(&mut this.file).poll_read(cx, &mut rb) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Ok(())) => {
                let got = rb.filled().len();
                if got == 0 {
                    return Poll::Ready(Some(Err(std::io::ErrorKind::UnexpectedEof.into())));
                }
                this.left -= got as u64;
                Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::copy_from_slice(
                    &this.buf[..got],
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

#[cfg(test)]
mod tests {
    use super::range_of;

    #[test]
    fn ranges_are_read_as_rfc_9110_says() {
        assert_eq!(range_of(None, 100), Ok(None));
        assert_eq!(range_of(Some("bytes=0-9"), 100), Ok(Some((0, 9))));
        assert_eq!(range_of(Some("bytes=90-"), 100), Ok(Some((90, 99))));
        assert_eq!(range_of(Some("bytes=-10"), 100), Ok(Some((90, 99))));
        assert_eq!(range_of(Some("bytes=50-500"), 100), Ok(Some((50, 99))));
        assert_eq!(range_of(Some("bytes=0-1,5-6"), 100), Ok(None));
        assert_eq!(range_of(Some("items=0-1"), 100), Ok(None));
        assert_eq!(range_of(Some("bytes=100-"), 100), Err(()));
        assert_eq!(range_of(Some("bytes=9-3"), 100), Err(()));
        assert_eq!(range_of(Some("bytes=x-3"), 100), Err(()));
        assert_eq!(range_of(Some("bytes=-0"), 100), Err(()));
    }
}
