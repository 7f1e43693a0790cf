//! Downloads: in, a registry name or URL, a destination folder and what the file must be (its
//! sha256 when on record, else the recorded size and the I/O contract of its kind); out, the
//! file under its final name, only once complete and verified (streamed to `.FILE.partial-TAG` (locked)
//! beside it, renamed into place), or an error saying what to do with nothing left behind. A
//! server that stops sending for the stall timeout ($GPEN_VIDEO_FETCH_STALL_S, default 60 s)
//! ends the download.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::report::read_facts;
use super::{registry, sha256_file, Entry, ModelFacts, URL_BASE_ENV};
use crate::config::find_asset;

/// Environment variable: seconds a download may go without receiving a byte before it is given
/// up (default [`DEFAULT_STALL_S`]).
pub const STALL_ENV: &str = "GPEN_VIDEO_FETCH_STALL_S";

/// Default stall timeout, seconds.
pub(crate) const DEFAULT_STALL_S: f64 = 60.0;

/// The stall timeout: $GPEN_VIDEO_FETCH_STALL_S (seconds, > 0) or [`DEFAULT_STALL_S`].
fn stall_timeout() -> Result<Duration> {
    let Ok(v) = std::env::var(STALL_ENV) else {
        return Ok(Duration::from_secs_f64(DEFAULT_STALL_S));
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        _ => {
            bail!("{STALL_ENV}=`{v}` is not a number of seconds between 0 and 86400 (unset it for {DEFAULT_STALL_S} s)")
        }
    }
}

/// Where `fetch` puts files by default: for an installed package, the user's data folder
/// (`$XDG_DATA_HOME/gpen-video/models`, never the package's own folder), else the checkout's
/// models/ if found, else ./models.
fn default_dir() -> PathBuf {
    if crate::defaults::package_root().is_some() {
        if let Some(d) = crate::defaults::user_dir("XDG_DATA_HOME", ".local/share") {
            return d.join("models");
        }
    }
    find_asset("models")
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// Where `fetch` downloads `e` from: the `--url` flag, else `BASE/FILE` for a mirror base
/// ($GPEN_VIDEO_MODEL_URL_BASE), else the entry's URL; a locally made entry without either
/// says how to make it.
pub(crate) fn download_url(e: &Entry, flag: Option<&str>, base: Option<&str>) -> Result<String> {
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
    fetch_entry(e, to, url, progress)
}

/// [`fetch`] for a given entry: the file lands as `to/FILE` (default models/) only if it
/// verifies ([`check_entry_file`]); a file already there is checked the same way.
pub fn fetch_entry(e: &Entry, to: Option<&Path>, url: Option<&str>, progress: bool) -> Result<PathBuf> {
    let base = std::env::var(URL_BASE_ENV).ok();
    let url = download_url(e, url, base.as_deref())?;
    let dir = to.map(Path::to_path_buf).unwrap_or_else(default_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    let dest = dir.join(&e.file);
    if dest.exists() {
        let sha = sha256_file(&dest)?;
        check_entry_file(e, &dest, &sha).with_context(|| {
            format!(
                "{} is already there but is not the model on record for {}: delete it and fetch again",
                dest.display(),
                e.name
            )
        })?;
        match e.sha() {
            Some(_) => crate::console::eprint!("{} is already present and its sha256 matches", dest.display()),
            None => crate::console::eprint!(
                "{} is already present (no checksum on record; size and I/O contract check out; sha256 {sha}): delete it to download again",
                dest.display()
            ),
        }
        return Ok(dest);
    }
    if e.sha().is_none() {
        // The contract check needs ONNX Runtime: find out before a long download, not after.
        crate::runtime::init().with_context(|| {
            format!(
                "{} has no checksum on record, so its download is checked with ONNX Runtime, which does not load",
                e.name
            )
        })?;
    }
    crate::console::eprint!("fetching {} from {url}", e.name);
    let dl = download(&url, &dest, progress)?;
    check_entry_file(e, &dl.part.path, &dl.sha).map_err(|err| {
        anyhow!(
            "download of {url} is not the model on record for {}: {err:#}; nothing was kept. Check the URL (a mirror may serve an error page), or download the file by hand and check it with `gpen-video models verify PATH`",
            e.name
        )
    })?;
    if e.sha().is_none() {
        crate::console::eprint!(
            "no checksum on record for {}; size and I/O contract check out; sha256 of the download: {}",
            e.name,
            dl.sha
        );
    }
    dl.keep(&dest)
}

/// Whether the file at `path` (sha256 `sha`) is `e`'s model: its sha256 when one is on record;
/// otherwise its size when recorded and the I/O contract of its kind, read with ONNX Runtime
/// exactly as `--model` / `--detector` check it, with the enhancer's crop size on record.
pub(crate) fn check_entry_file(e: &Entry, path: &Path, sha: &str) -> Result<()> {
    if let Some(want) = e.sha() {
        if !want.eq_ignore_ascii_case(sha) {
            bail!("its sha256 is {sha}, but {want} is on record (changed upstream, or damaged in transit)");
        }
        return Ok(());
    }
    let bytes = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if e.bytes != 0 && bytes != e.bytes {
        bail!(
            "it is {bytes} bytes, but the published file is {} bytes{}",
            e.bytes,
            text_hint(path)
        );
    }
    let facts = read_facts(path, Some(e.kind)).map_err(|err| {
        // The partial file's name means nothing to the user (the caller names the URL).
        let why = format!("{err:#}").replace(&path.display().to_string(), "the file");
        anyhow!(
            "it is not a usable {} model ({why}){}",
            format!("{:?}", e.kind).to_lowercase(),
            text_hint(path)
        )
    })?;
    if let ModelFacts::Enhancer { info, .. } = &facts {
        if info.size != e.input_size {
            bail!(
                "its input is {0}x{0}, but {1} takes {2}x{2} crops",
                info.size,
                e.name,
                e.input_size
            );
        }
    }
    Ok(())
}

/// "; it begins `...`: a web page or text, not a model" when the file starts like text.
fn text_hint(path: &Path) -> String {
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let head = &head[..n];
    let texty = n > 0 && head.iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace());
    if !texty {
        return String::new();
    }
    let first: String = String::from_utf8_lossy(head)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(40)
        .collect();
    format!("; it begins `{first}`: a web page or text, not a model")
}

/// `scheme://host[:port]` of a URL, for messages.
pub(super) fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

/// Removes the partial file unless the download completed; holds its lock meanwhile, so
/// another process's clean-up leaves it alone.
struct PartFile {
    path: PathBuf,
    keep: bool,
    _lock: crate::output::Partial,
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

/// A read that ended on ureq's timeout (it wraps its error in the I/O error) or the socket's.
fn is_timeout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|x| x.downcast_ref::<ureq::Error>())
            .is_some_and(|x| matches!(x, ureq::Error::Timeout(_)))
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

/// Downloads `url` to `dest`: streams to `.FILE.partial-TAG` (locked) beside it (with a progress bar on a
/// terminal when `progress`), checks the length against Content-Length and the sha256 when
/// given, then renames into place. On any failure nothing is left under either name.
pub fn fetch_url(url: &str, dest: &Path, sha256: Option<&str>, progress: bool) -> Result<PathBuf> {
    let dl = download(url, dest, progress)?;
    if let Some(want) = sha256 {
        if !want.eq_ignore_ascii_case(&dl.sha) {
            bail!(
                "download of {url} has sha256 {}, but {want} is on record: it is not the expected file (changed upstream, or damaged in transit); nothing was kept. Check the URL, or download it by hand and compare with `gpen-video models verify PATH`",
                dl.sha
            );
        }
    }
    dl.keep(dest)
}

/// A complete download, still under its partial name (removed on drop unless kept).
struct Download {
    part: PartFile,
    sha: String,
}

impl Download {
    /// Renames the partial file to `dest`.
    fn keep(mut self, dest: &Path) -> Result<PathBuf> {
        std::fs::rename(&self.part.path, dest)
            .with_context(|| format!("cannot move the download into place as {}", dest.display()))?;
        self.part.keep = true;
        Ok(dest.to_path_buf())
    }
}

/// Sends the GET for `url` with the stall timeout `stall`; an unreachable host, a stalled
/// server and an HTTP error each get a message that says what to do (`mirror_hint` included).
fn request(url: &str, stall: Duration, mirror_hint: &str) -> Result<ureq::http::Response<ureq::Body>> {
    let stall_s = stall.as_secs_f64();
    let host = host_of(url);

    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(120)))
        // Restarts with every read: a server that stops sending mid-body ends the download.
        .timeout_per_read(Some(stall))
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
        ureq::Error::Timeout(t @ (ureq::Timeout::Resolve | ureq::Timeout::Connect)) => anyhow!(
            "cannot reach {host} to download {url}: timed out ({t}); the network is down or too slow: try again, {mirror_hint}"
        ),
        // The host took the connection: the network is fine, the server is not answering.
        ureq::Error::Timeout(ureq::Timeout::PerRead) => anyhow!(
            "{host} accepted the connection for {url} but sent nothing for {stall_s} s ({STALL_ENV} sets how long to wait): the server is stalled or overloaded; try again later, {mirror_hint}"
        ),
        ureq::Error::Timeout(t) => anyhow!(
            "{host} accepted the connection for {url} but did not answer in time ({t} timeout): the server is stalled or overloaded; try again later, {mirror_hint}"
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
    Ok(resp)
}

/// A progress bar for a download of `expected` bytes (a spinner when unknown), hidden unless
/// `progress` and stderr is a terminal.
fn progress_bar(progress: bool, expected: Option<u64>, file: &str) -> indicatif::ProgressBar {
    if !(progress && std::io::stderr().is_terminal()) {
        return indicatif::ProgressBar::hidden();
    }
    let b = match expected {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    b.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    b.set_message(crate::console::escape_controls(file).into_owned());
    b
}

/// Streams `url` into `.FILE.partial-TAG` (locked) beside `dest`, checking the length against
/// Content-Length; a server that sends nothing for the stall timeout is an error. Nothing is
/// left behind on failure.
fn download(url: &str, dest: &Path, progress: bool) -> Result<Download> {
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
    let (prefix, suffix) = crate::output::partial_pattern(dest);
    crate::output::remove_stale(&dir, &prefix, &suffix);
    let stall = stall_timeout()?;
    let stall_s = stall.as_secs_f64();
    let host = host_of(url);
    let mirror_hint =
        format!("or put the file there by hand, or point --url / {URL_BASE_ENV} at a mirror you can reach");
    // Installed before the request, so a Ctrl-C while it connects is heard once the body flows.
    let interrupts = crate::interrupt::install()?;
    let resp = request(url, stall, &mirror_hint)?;
    let body = resp.into_body();
    let expected = body.content_length();
    let mut reader = body.into_reader();

    let lock = crate::output::Partial::beside(dest)
        .with_context(|| format!("cannot write into {} (is the folder writable?)", dir.display()))?;
    let part_path = lock.path().to_path_buf();
    let mut out = lock
        .file()
        .try_clone()
        .with_context(|| format!("cannot write into {} (is the folder writable?)", dir.display()))?;
    let part = PartFile {
        path: part_path.clone(),
        keep: false,
        _lock: lock,
    };
    let bar = progress_bar(progress, expected, &file);
    let mut hasher = Sha256::new();
    let mut got: u64 = 0;
    let total = expected.map_or("?".to_string(), |n| n.to_string());
    // The body is read on its own thread, so a Ctrl-C or SIGTERM is heard while a read waits
    // on the network: the partial file is removed and the command ends at once.
    let (tx, rx) = crossbeam_channel::bounded::<std::io::Result<Vec<u8>>>(4);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let chunk = match reader.read(&mut buf) {
                Ok(n) => Ok(buf[..n].to_vec()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let last = !matches!(&chunk, Ok(c) if !c.is_empty());
            if tx.send(chunk).is_err() || last {
                return;
            }
        }
    });
    loop {
        if interrupts.requested() {
            bar.abandon();
            bail!("download of {url} interrupted after {got} of {total} bytes: nothing was kept");
        }
        let chunk = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(c) => c,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
            // The reader ends only after sending its last chunk: gone without one, it failed.
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                bar.abandon();
                bail!(
                    "download of {url} broke off after {got} of {total} bytes: nothing was kept; run the command again"
                );
            }
        };
        let chunk = match chunk {
            Ok(c) if c.is_empty() => break,
            Ok(c) => c,
            Err(e) => {
                bar.abandon();
                if is_timeout(&e) {
                    bail!(
                        "download of {url} stalled: {host} answered, then sent nothing for {stall_s} s after {got} of {total} bytes ({STALL_ENV} sets how long to wait); nothing was kept: try again later, {mirror_hint}"
                    );
                }
                bail!(
                    "download of {url} broke off after {got} of {total} bytes ({e}): nothing was kept; run the command again"
                );
            }
        };
        hasher.update(&chunk);
        out.write_all(&chunk)
            .with_context(|| format!("cannot write {} (disk full?)", part_path.display()))?;
        got += chunk.len() as u64;
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
    Ok(Download {
        part,
        sha: hex::encode(hasher.finalize()),
    })
}
