//! The jobs' HTTP side: in, `POST/GET/DELETE /v1/jobs...` requests (uploads streamed to disk
//! within `--max-job-mb` and the quota, never held whole in memory); out, JSON records and the
//! result file, whole or the byte range asked for (so a browser's player can seek).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use anyhow::Result;
use axum::body::{Body, HttpBody};
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use headers::{AcceptRanges, ContentRange, ETag, HeaderMapExt, IfModifiedSince, IfNoneMatch, IfRange, LastModified};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
const TAKES: &str = "name=FILE, model=NAME (GET /v1/info lists them), blend=0..1, mask=NAME, temporal=FRAMES, smooth=FRAMES, compare=side|split|none, only-face=NAME,..., skip-face=NAME,... (the faces the service holds: GET /v1/info), face-distance=D, min-face=PX, occlusion=hands|off";

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
pub(super) const OWNER: &str = "x-gpen-owner";

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

/// A done job's result (or its input), whole or the byte range asked, with the validators a
/// browser keeps its copy by: a strong `ETag` (the file's length and time) and `Last-Modified`.
/// A copy still current (`If-None-Match`, else `If-Modified-Since`) is answered 304 with no
/// body; a `Range` is honoured only while its `If-Range` names this very file (else the whole
/// file, 200), and one that cannot be satisfied is answered 416.
fn serve_file(app: &Arc<App>, id: &str, query: Option<&str>, headers: &HeaderMap, input: bool) -> Response {
    let app = app.clone();
    let found = super::authorize(&app, headers)
        .and_then(|()| super::query_of::<ResultQuery>(query, "download=1"))
        .and_then(|q| Ok((q, id_of(id)?.to_string())))
        .and_then(|(q, id)| {
            let jobs = jobs_of(&app);
            // A query with a jobs database: off the async thread while it waits.
            let file = tokio::task::block_in_place(|| if input { jobs.input(&id) } else { jobs.result(&id) })?;
            let meta = file
                .1
                .metadata()
                .map_err(|e| Failure::error(Kind::Io, format!("cannot read job {id}'s file ({e})")))?;
            Ok((q, file, meta))
        });
    let (q, (rec, file), meta) = match found {
        Ok(f) => f,
        Err(e) => return error(&app, &e),
    };
    let len = meta.len();
    let modified = meta.modified().ok();
    let nanos = modified
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    // Strong: a job's file is written once, under a new name, and renamed into place.
    let etag = format!("\"{len:x}-{nanos:x}\"").parse::<ETag>().ok();
    let mut r = Response::new(Body::empty());
    let h = r.headers_mut();
    if let Some(t) = &etag {
        h.typed_insert(t.clone());
    }
    if let Some(t) = modified {
        h.typed_insert(LastModified::from(t));
    }
    h.typed_insert(AcceptRanges::bytes());
    let span = match answer_to(headers, len, etag.as_ref(), modified) {
        Answer::NotModified => {
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            return r;
        }
        Answer::Unsatisfiable => {
            *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            r.headers_mut().typed_insert(ContentRange::unsatisfied_bytes(len));
            *r.body_mut() = Body::from(format!("range not satisfiable: the file has {len} bytes\n"));
            return r;
        }
        Answer::Whole => None,
        Answer::Part(s) => Some(s),
    };
    let (start, count) = span
        .as_ref()
        .map_or((0, len), |s| (*s.start(), s.end() - s.start() + 1));
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
    let bytes = tokio::fs::File::from_std(file).take(count);
    *r.body_mut() = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(bytes, 1 << 16));
    if let Some(s) = span {
        *r.status_mut() = StatusCode::PARTIAL_CONTENT;
        if let Ok(c) = ContentRange::bytes(s, len) {
            r.headers_mut().typed_insert(c);
        }
    }
    let h = r.headers_mut();
    let ext = std::path::Path::new(if input { &rec.input } else { &rec.output })
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(super::mime_of(ext)));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    let disposition = if q.download == Some(1) { "attachment" } else { "inline" };
    let name = if input { rec.input.clone() } else { rec.download_name() };
    if let Ok(v) = HeaderValue::from_str(&format!("{disposition}; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// How a request for a file is answered.
#[derive(Debug, PartialEq)]
enum Answer {
    /// 304: the client's copy is current.
    NotModified,
    /// 200: the whole file.
    Whole,
    /// 206: these bytes of it.
    Part(std::ops::RangeInclusive<u64>),
    /// 416: a range past its end.
    Unsatisfiable,
}

/// How the request with `headers` for a file of `len` bytes, of strong tag `etag` and time
/// `modified`, is answered, as RFC 9110 says: a copy current by `If-None-Match` (else by
/// `If-Modified-Since`) is not sent again; one `bytes` range is sent while `If-Range`, if any,
/// names this very file; other units, several ranges and a stale `If-Range` get the whole file.
fn answer_to(headers: &HeaderMap, len: u64, etag: Option<&ETag>, modified: Option<SystemTime>) -> Answer {
    let current = match (
        headers.typed_get::<IfNoneMatch>(),
        headers.typed_get::<IfModifiedSince>(),
    ) {
        (Some(tags), _) => etag.is_some_and(|t| !tags.precondition_passes(t)),
        (None, Some(since)) => modified.is_some_and(|t| !since.is_modified(t)),
        (None, None) => false,
    };
    if current {
        return Answer::NotModified;
    }
    // An If-Range that cannot be read names no file.
    let same_file = !headers.contains_key(header::IF_RANGE)
        || headers
            .typed_get::<IfRange>()
            .is_some_and(|c| !c.is_modified(etag, modified.map(LastModified::from).as_ref()));
    let asked = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| same_file && v.starts_with("bytes="))
        // A suffix longer than the file is the whole file (RFC 9110, 14.1.2), which the crate
        // would refuse.
        .map(
            |v| match v.strip_prefix("bytes=-").and_then(|n| n.trim().parse::<u64>().ok()) {
                Some(n) if n > len && len > 0 => format!("bytes=-{len}"),
                _ => v.to_string(),
            },
        );
    match asked.map(|v| http_range_header::parse_range_header(&v).and_then(|p| p.validate(len))) {
        None => Answer::Whole,
        Some(Ok(spans)) if len > 0 => match <[_; 1]>::try_from(spans) {
            Ok([span]) => Answer::Part(span),
            Err(_) => Answer::Whole,
        },
        Some(_) => Answer::Unsatisfiable,
    }
}

/// The query of `GET /v1/jobs/{id}/result`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultQuery {
    /// 1: as an attachment (a download), else inline.
    download: Option<u8>,
}

#[cfg(test)]
mod tests {
    use super::{answer_to, Answer};
    use axum::http::HeaderMap;
    use std::time::{Duration, SystemTime};

    /// The answer to a request with `headers` for a file of 100 bytes, tagged "a", of time 1e9 s.
    fn answer(headers: &[(&'static str, &str)]) -> Answer {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, v.parse().unwrap());
        }
        let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        answer_to(&h, 100, Some(&"\"a\"".parse().unwrap()), Some(modified))
    }

    #[test]
    fn ranges_are_read_as_rfc_9110_says() {
        assert_eq!(answer(&[]), Answer::Whole);
        assert_eq!(answer(&[("range", "bytes=0-9")]), Answer::Part(0..=9));
        assert_eq!(answer(&[("range", "bytes=90-")]), Answer::Part(90..=99));
        assert_eq!(answer(&[("range", "bytes=-10")]), Answer::Part(90..=99));
        assert_eq!(
            answer(&[("range", "bytes=-500")]),
            Answer::Part(0..=99),
            "a suffix past the start"
        );
        assert_eq!(answer(&[("range", "bytes=50-500")]), Answer::Part(50..=99));
        assert_eq!(answer(&[("range", "bytes=0-1,5-6")]), Answer::Whole);
        assert_eq!(answer(&[("range", "items=0-1")]), Answer::Whole);
        for bad in ["bytes=100-", "bytes=9-3", "bytes=x-3", "bytes=-0"] {
            assert_eq!(answer(&[("range", bad)]), Answer::Unsatisfiable, "{bad}");
        }
    }

    #[test]
    fn a_current_copy_is_not_sent_again() {
        let (now, old) = ("Sun, 09 Sep 2001 01:46:40 GMT", "Sat, 08 Sep 2001 01:46:40 GMT");
        assert_eq!(answer(&[("if-none-match", "\"a\"")]), Answer::NotModified);
        assert_eq!(answer(&[("if-none-match", "\"b\", W/\"a\"")]), Answer::NotModified);
        assert_eq!(answer(&[("if-none-match", "*")]), Answer::NotModified);
        assert_eq!(answer(&[("if-none-match", "\"b\"")]), Answer::Whole);
        assert_eq!(answer(&[("if-modified-since", now)]), Answer::NotModified);
        assert_eq!(answer(&[("if-modified-since", old)]), Answer::Whole);
        // If-None-Match rules over If-Modified-Since.
        assert_eq!(
            answer(&[("if-none-match", "\"b\""), ("if-modified-since", now)]),
            Answer::Whole
        );
    }

    #[test]
    fn a_range_is_sent_only_of_the_same_file() {
        let part = |if_range: &str| answer(&[("range", "bytes=0-9"), ("if-range", if_range)]);
        assert_eq!(part("\"a\""), Answer::Part(0..=9));
        assert_eq!(part("\"b\""), Answer::Whole);
        // A weak tag is never the same file (RFC 9110 13.1.5).
        assert_eq!(part("W/\"a\""), Answer::Whole);
        assert_eq!(part("Sun, 09 Sep 2001 01:46:40 GMT"), Answer::Part(0..=9));
        assert_eq!(part("Sat, 08 Sep 2001 01:46:40 GMT"), Answer::Whole);
        assert_eq!(part("not a validator"), Answer::Whole);
    }
}
