//! The service's page in a browser: in, `GET /` (and `/v1/info` for its controls' defaults and
//! the models a job may ask for);
//! out, one HTML file with its CSS and JavaScript built into the binary (nothing fetched from
//! elsewhere, so it works offline), which uploads photos and clips as jobs, shows each one's
//! progress, a before/after comparison and a download link.
//!
//! With `--token` the page needs it too: `Authorization: Bearer`, or opened once as
//! `/?token=TOKEN`, which keeps it in a cookie (HttpOnly, SameSite=Strict) the page's own calls
//! send, and takes it out of the address bar.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::App;
use crate::faces::paste::MaskKind;

const PAGE: &str = include_str!("page.html");

/// The cookie that carries the token for the page's own calls.
const COOKIE: &str = "gpen_token";

/// The token a request's cookie carries (hex, as [`page`] sets it).
pub(super) fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .and_then(|(_, v)| hex::decode(v).ok())
        .and_then(|b| String::from_utf8(b).ok())
}

/// `GET /`: the page (see the module's note on the token).
pub(super) async fn page(
    State(app): State<Arc<App>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let (Some(given), Some(token)) = (q.get("token"), &app.opts.token) {
        if !super::same(given.as_bytes(), token.as_bytes()) {
            return (StatusCode::UNAUTHORIZED, "wrong token\n").into_response();
        }
        let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
        let cookie = format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", hex::encode(given));
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    if super::authorize(&app, &headers).is_err() {
        return (
            StatusCode::UNAUTHORIZED,
            "this service needs its token: open /?token=TOKEN once, or send Authorization: Bearer TOKEN\n",
        )
            .into_response();
    }
    let mut r = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
    r
}

/// `GET /v1/info`: the model and the defaults of the flags the page sets.
pub(super) async fn info(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = super::authorize(&app, &headers) {
        return super::refuse(&e).0;
    }
    let t = &app.settings.recipe.treatment;
    let restorers = super::jobs::offered_models(&app.settings);
    let models: Vec<&str> = restorers.iter().map(|o| o.name.as_str()).collect();
    let masks: Vec<String> = [MaskKind::Mesh, MaskKind::Face, MaskKind::Box]
        .iter()
        .filter(|m| **m != MaskKind::Mesh || app.settings.recipe.mesh.is_some())
        .map(|m| m.to_string())
        .collect();
    let v = serde_json::json!({
        "model": models.first(),
        "models": models,
        "restorers": restorers,
        "blend": t.blend,
        "mask": t.mask.to_string(),
        "masks": masks,
        "temporal": t.temporal,
        "smooth": t.smooth,
        "compare": t.compare.map(|c| c.to_string()),
        "color_fix": t.color_fix,
        "identity_guard": t.identity_guard,
        "occlusion": t.occlusion,
        "max_job_mb": app.jobs.opts.max_upload / 1_000_000,
        "faces": app.jobs.opts.faces.keys().collect::<Vec<_>>(),
    });
    ([(header::CONTENT_TYPE, "application/json")], v.to_string() + "\n").into_response()
}
