//! Downloads: in, a registry name or URL, a destination folder and an optional sha256; out, the
//! file under its final name, only once complete and verified (streamed to `.FILE.part-PID`
//! beside it, renamed into place), or an error saying what to do with nothing left behind.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::report::hex;
use super::{registry, sha256_file, Entry, URL_BASE_ENV};
use crate::config::find_asset;

/// Where `fetch` puts files by default: the checkout's models/ if found, else ./models.
fn default_dir() -> PathBuf {
    find_asset("models")
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// Where `fetch` downloads `e` from: the `--url` flag, else `BASE/FILE` for a mirror base
/// ($GPEN_VIDEO_MODEL_URL_BASE), else the entry's URL; a locally made entry without either
/// says how to make it.
pub fn download_url(e: &Entry, flag: Option<&str>, base: Option<&str>) -> Result<String> {
    match (flag, base.filter(|b| !b.is_empty())) {
        (Some(u), _) => Ok(u.to_string()),
        (None, Some(b)) => Ok(format!("{}/{}", b.trim_end_matches('/'), e.file)),
        (None, None) if e.url.is_empty() => bail!(
            "{} is not published for download: {} (it goes to models/{})",
            e.name,
            e.how_to_get(),
            e.file
        ),
        (None, None) => Ok(e.url.clone()),
    }
}

/// `fetch NAME`: downloads a registry model into `to` (default models/) and returns its path.
/// `url` (else $GPEN_VIDEO_MODEL_URL_BASE/FILE, else the entry's URL) says where from.
pub fn fetch(name: &str, to: Option<&Path>, url: Option<&str>, progress: bool) -> Result<PathBuf> {
    let reg = registry()?;
    let e = reg
        .find(name)
        .ok_or_else(|| anyhow!("no model called `{name}`; known: {}", reg.names()))?;
    let base = std::env::var(URL_BASE_ENV).ok();
    let url = download_url(e, url, base.as_deref())?;
    let dir = to.map(Path::to_path_buf).unwrap_or_else(default_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    let dest = dir.join(&e.file);
    if dest.exists() {
        let sha = sha256_file(&dest)?;
        return match e.sha() {
            Some(x) if x == sha => {
                eprintln!("{} is already present and its sha256 matches", dest.display());
                Ok(dest)
            }
            Some(x) => bail!(
                "{} exists but its sha256 is {sha}, not {x} as on record: delete it and fetch again",
                dest.display()
            ),
            None => {
                eprintln!(
                    "{} is already present (no checksum on record; sha256 {sha}): delete it to download again",
                    dest.display()
                );
                Ok(dest)
            }
        };
    }
    eprintln!("fetching {} from {url}", e.name);
    let path = fetch_url(&url, &dest, e.sha(), progress)?;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if e.sha().is_none() {
        let sha = sha256_file(&path)?;
        eprintln!("no checksum on record for {}; sha256 of the download: {sha}", e.name);
    }
    if e.bytes != 0 && e.bytes != bytes {
        eprintln!(
            "warning: {} is {bytes} bytes; the published file on record is {} bytes (a different export?)",
            path.display(),
            e.bytes
        );
    }
    Ok(path)
}

/// `scheme://host[:port]` of a URL, for messages.
pub(super) fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

/// Removes the partial file unless the download completed.
struct PartFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn is_unreachable(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        kind,
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::AddrNotAvailable
            | K::NetworkUnreachable
            | K::HostUnreachable
            | K::NetworkDown
            | K::TimedOut
    )
}

/// A failed name lookup (std reports it as an uncategorised I/O error).
fn is_dns_failure(e: &std::io::Error) -> bool {
    let m = e.to_string().to_ascii_lowercase();
    [
        "lookup address",
        "name or service not known",
        "name resolution",
        "nodename nor servname",
    ]
    .iter()
    .any(|k| m.contains(k))
}

/// Downloads `url` to `dest`: streams to `.FILE.part-PID` beside it (with a progress bar on a
/// terminal when `progress`), checks the length against Content-Length and the sha256 when
/// given, then renames into place. On any failure nothing is left under either name.
pub fn fetch_url(url: &str, dest: &Path, sha256: Option<&str>, progress: bool) -> Result<PathBuf> {
    let file = dest
        .file_name()
        .ok_or_else(|| anyhow!("{} is not a file path", dest.display()))?
        .to_string_lossy()
        .into_owned();
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!("folder {} does not exist", dir.display());
    }
    crate::output::remove_stale(&dir, &format!(".{file}.part-"), "");
    let host = host_of(url);
    let mirror_hint =
        format!("or put the file there by hand, or point --url / {URL_BASE_ENV} at a mirror you can reach");

    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(120)))
        .user_agent(concat!("gpen-video/", env!("CARGO_PKG_VERSION")))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let resp = agent.get(url).call().map_err(|err| match err {
        ureq::Error::Io(e) if is_unreachable(e.kind()) => anyhow!(
            "cannot reach {host} to download {url}: {e}. There is no network here or the host is unreachable: connect and try again, {mirror_hint}"
        ),
        ureq::Error::Io(e) if is_dns_failure(&e) => anyhow!(
            "cannot reach {host} to download {url}: the host name does not resolve ({e}); there is no network here or no DNS: connect and try again, {mirror_hint}"
        ),
        ureq::Error::HostNotFound => anyhow!(
            "cannot reach {host} to download {url}: the host name does not resolve (no network or no DNS): connect and try again, {mirror_hint}"
        ),
        ureq::Error::ConnectionFailed => anyhow!(
            "cannot reach {host} to download {url}: the connection failed (no network, or the host is unreachable): connect and try again, {mirror_hint}"
        ),
        ureq::Error::Timeout(t) => anyhow!(
            "cannot reach {host} to download {url}: timed out ({t}); the network is down or too slow: try again, {mirror_hint}"
        ),
        ureq::Error::BadUri(u) => anyhow!("bad download URL `{u}`: give a full http(s)://host/path URL"),
        other => anyhow!("download of {url} failed: {other}; try again, {mirror_hint}"),
    })?;
    let status = resp.status();
    if !status.is_success() {
        bail!(
            "download of {url} failed: HTTP {} {}: {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            if status.as_u16() == 404 {
                format!("the file is not at that address (moved or renamed?): check the URL, {mirror_hint}")
            } else {
                format!("the server refused; try again later, {mirror_hint}")
            }
        );
    }
    let body = resp.into_body();
    let expected = body.content_length();
    let mut reader = body.into_reader();

    let part_path = dir.join(format!(".{file}.part-{}", std::process::id()));
    let mut part = PartFile {
        path: part_path.clone(),
        keep: false,
    };
    let mut out = std::fs::File::create(&part_path)
        .with_context(|| format!("cannot write into {} (is the folder writable?)", dir.display()))?;
    let bar = if progress && std::io::stderr().is_terminal() {
        let b = match expected {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::new_spinner(),
        };
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(file.clone());
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got: u64 = 0;
    let total = expected.map_or("?".to_string(), |n| n.to_string());
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.abandon();
                bail!(
                    "download of {url} broke off after {got} of {total} bytes ({e}): nothing was kept; run the command again"
                );
            }
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("cannot write {} (disk full?)", part_path.display()))?;
        got += n as u64;
        bar.set_position(got);
    }
    bar.finish_and_clear();
    if let Some(n) = expected {
        if got != n {
            bail!(
                "download of {url} is truncated: {got} of {n} bytes arrived: nothing was kept; run the command again"
            );
        }
    }
    out.sync_all()
        .with_context(|| format!("cannot write {}", part_path.display()))?;
    drop(out);
    let sha = hex(&hasher.finalize());
    if let Some(want) = sha256 {
        if !want.eq_ignore_ascii_case(&sha) {
            bail!(
                "download of {url} has sha256 {sha}, but {want} is on record: it is not the expected file (changed upstream, or damaged in transit); nothing was kept. Check the URL, or download it by hand and compare with `gpen-video models verify PATH`"
            );
        }
    }
    std::fs::rename(&part_path, dest)
        .with_context(|| format!("cannot move the download into place as {}", dest.display()))?;
    part.keep = true;
    Ok(dest.to_path_buf())
}
