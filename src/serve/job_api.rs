//! The jobs' HTTP side: in, `POST/GET/DELETE /v1/jobs...` requests (uploads streamed to disk
//! within `--max-job-mb` and the quota, never held whole in memory); out, JSON records and the
//! result file, whole or the byte range asked for (so a browser's player can seek).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path as UrlPath, Query, Request, State};
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

/// An error as the API answers it: its status by kind, the message in words (and in JSON when
/// the client asked for JSON).
fn error(e: &anyhow::Error) -> Response {
    let (mut r, _) = super::refuse(e);
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
pub(super) async fn create(
    State(app): State<Arc<App>>,
    query: Result<Query<JobQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let start = Instant::now();
    let r = create_job(&app, query, req).await;
    let response = match r {
        Ok(rec) => {
            let mut r = json(StatusCode::ACCEPTED, &rec.answer());
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", rec.id)) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Err(e) => error(&e),
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

async fn create_job(
    app: &Arc<App>,
    query: Result<Query<JobQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Result<super::jobs::Record> {
    let (parts, body) = req.into_parts();
    let checked = (|| -> Result<JobQuery> {
        super::authorize(app, &parts.headers)?;
        if !app.ready.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Failure::error(Kind::Busy, "loading the model; try again shortly"));
        }
        let Query(q) = query.map_err(|e| {
            Failure::error(
                Kind::BadInput,
                format!("{e}: the query takes name=FILE, model=NAME (GET /v1/info lists them), blend=0..1, mask=NAME, temporal=FRAMES, smooth=FRAMES, compare=side|split|none"),
            )
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
    let too_big = |n: u64| {
        Failure::error(
            Kind::TooLarge,
            format!(
                "the upload is larger than {} MB (--max-job-mb){}",
                opts.max_upload / 1_000_000,
                if n > 0 {
                    format!(": {} MB sent", n / 1_000_000)
                } else {
                    String::new()
                }
            ),
        )
    };
    // An upload refused for its size is still read, up to a job's size and a photo's more
    // (`refused_drain`), so a client that sends its whole body before it reads the answer gets
    // the 413 rather than a broken pipe.
    let refused_drain = opts.max_upload + app.opts.max_body as u64;
    if let Some(n) = declared.filter(|&n| n > opts.max_upload) {
        super::discard_up_to(body, refused_drain, &app.opts).await;
        return Err(too_big(n));
    }
    // Room under the quota for what is declared (or the largest upload), made off the async
    // threads (it walks the folder and may remove old results).
    let want = declared.unwrap_or(opts.max_upload.min(opts.quota));
    let prep = {
        let jobs = jobs.clone();
        tokio::task::spawn_blocking(move || -> Result<(u64, (String, std::path::PathBuf))> {
            let room = jobs.make_room(want.min(jobs.opts.max_upload).max(1))?;
            Ok((room, jobs.reserve()?))
        })
        .await
        .map_err(|_| Failure::error(Kind::Engine, "internal error"))?
    };
    let (room, (id, dir)) = match prep {
        Ok(p) => p,
        Err(e) => {
            super::discard(body, &app.opts).await;
            return Err(e);
        }
    };
    let limit = opts.max_upload.min(room);
    let received = receive_to(body, &dir.join("input.part"), (limit, refused_drain), &app.opts).await;
    if let Err(e) = received {
        let _ = tokio::fs::remove_dir_all(&dir).await;
        let e = if matches!(crate::engine::kind_of(&e), Kind::TooLarge) && limit < opts.max_upload {
            Failure::error(
                Kind::TooLarge,
                format!(
                    "the jobs folder has room for {} MB more (--jobs-quota-gb): delete finished jobs or try later",
                    limit / 1_000_000
                ),
            )
        } else if matches!(crate::engine::kind_of(&e), Kind::TooLarge) {
            too_big(0)
        } else {
            e
        };
        return Err(e);
    }
    // Probing opens the upload with FFmpeg: off the async threads.
    tokio::task::spawn_blocking(move || jobs.admit(&id, q))
        .await
        .map_err(|_| Failure::error(Kind::Engine, "internal error"))?
}

/// Streams `body` into `path`, at most `limit` bytes, each piece within `--read-timeout-s`; a
/// body over `limit` is read on and dropped up to `drain` bytes in all (see [`super::discard`]).
async fn receive_to(
    body: Body,
    path: &std::path::Path,
    (limit, drain): (u64, u64),
    opts: &super::ServeOptions,
) -> Result<()> {
    let mut body = body;
    let mut file = tokio::fs::File::create(path)
        .await
        .with_context(|| format!("cannot create {}", path.display()))?;
    let mut seen = 0u64;
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        let frame = match tokio::time::timeout(opts.read_timeout, next).await {
            Err(_) => {
                return Err(Failure::error(
                    Kind::Slow,
                    format!(
                        "the upload stalled: nothing arrived for {} s (--read-timeout-s)",
                        opts.read_timeout.as_secs()
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(Failure::error(
                    Kind::BadInput,
                    format!("the upload was not received whole ({e})"),
                ))
            }
            Ok(Some(Ok(f))) => f,
        };
        let Some(data) = frame.data_ref() else { continue };
        seen += data.len() as u64;
        if seen > limit {
            drop(file);
            super::discard_up_to(body, drain.saturating_sub(seen), opts).await;
            return Err(Failure::error(Kind::TooLarge, "the upload is too large"));
        }
        file.write_all(data)
            .await
            .map_err(|e| Failure::error(Kind::Io, format!("cannot write the upload: {e}")))?;
    }
    file.flush().await?;
    if seen == 0 {
        return Err(Failure::error(Kind::BadInput, "empty body: send a video or a photo"));
    }
    Ok(())
}

/// `GET /v1/jobs`: every job, oldest first.
pub(super) async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = super::authorize(&app, &headers) {
        return error(&e);
    }
    let jobs: Vec<serde_json::Value> = jobs_of(&app).list().iter().map(|r| r.answer()).collect();
    json(StatusCode::OK, &serde_json::json!({ "jobs": jobs }))
}

/// `GET /v1/jobs/{id}`: the job's record with its progress.
pub(super) async fn show(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    let r = super::authorize(&app, &headers)
        .and_then(|()| id_of(&id).map(str::to_string))
        .and_then(|id| jobs_of(&app).get(&id).ok_or_else(|| not_found(&id)));
    match r {
        Ok(rec) => json(StatusCode::OK, &rec.answer()),
        Err(e) => error(&e),
    }
}

/// `DELETE /v1/jobs/{id}`: cancels the job and removes it with its files.
pub(super) async fn delete(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>, headers: HeaderMap) -> Response {
    let r = match super::authorize(&app, &headers).and_then(|()| id_of(&id).map(str::to_string)) {
        Ok(id) => {
            let jobs = jobs_of(&app).clone();
            tokio::task::spawn_blocking(move || jobs.delete(&id))
                .await
                .unwrap_or_else(|_| Err(Failure::error(Kind::Engine, "internal error")))
        }
        Err(e) => Err(e),
    };
    match r {
        Ok(rec) => json(
            StatusCode::OK,
            &serde_json::json!({"id": rec.id, "state": "cancelled", "removed": true}),
        ),
        Err(e) => error(&e),
    }
}

/// Content types of the results a job writes, by extension.
fn mime_of(ext: &str) -> &'static str {
    match ext {
        "mp4" => "video/mp4",
        "mov" => "video/quicktime",
        "mkv" => "video/x-matroska",
        "png" => "image/png",
        "jpg" => "image/jpeg",
        "webp" => "image/webp",
        "tiff" => "image/tiff",
        "bmp" => "image/bmp",
        _ => "application/octet-stream",
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
    Query(q): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let found = super::authorize(&app, &headers)
        .and_then(|()| id_of(&id).map(str::to_string))
        .and_then(|id| jobs_of(&app).result(&id));
    let (rec, path) = match found {
        Ok(f) => f,
        Err(e) => return error(&e),
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            return error(&Failure::error(
                Kind::Io,
                format!("cannot read job {}'s result: {e}", rec.id),
            ))
        }
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
            return error(&Failure::error(
                Kind::Io,
                format!("cannot read job {}'s result: {e}", rec.id),
            ));
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
    let ext = std::path::Path::new(&rec.output)
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime_of(ext)));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{len}")) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    let disposition = if q.get("download").is_some_and(|v| v == "1") {
        "attachment"
    } else {
        "inline"
    };
    if let Ok(v) = HeaderValue::from_str(&format!("{disposition}; filename=\"{}\"", rec.download_name())) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
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
