//! Opening an input for reading: in, the path a user named; out, FFmpeg's demuxer reading
//! exactly that file, or an error naming the other resources the file asked FFmpeg to read.
//!
//! FFmpeg reads far more than the file it is given unless told not to: a name such as
//! `concat:a.mp4` or `http:/host/x` is a protocol, a playlist (HLS, DASH), a concat list or a
//! reference movie names other files or URLs and FFmpeg opens them, and an image name with
//! `%d` in it is a sequence. Here the name is taken literally (`file:` + the path, the file
//! protocol only), an image name is never a pattern, and every other resource the demuxer asks
//! to open, on any thread, while opening or while reading, is refused: only the named file is
//! ever opened, once. A file that needed another resource is refused with a message that says
//! what it asked for.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use ffmpeg_next as ffmpeg;
use ffmpeg_next::ffi;

/// FFmpeg's opener of a demuxer's resources.
type IoOpen = unsafe extern "C" fn(
    *mut ffi::AVFormatContext,
    *mut *mut ffi::AVIOContext,
    *const libc::c_char,
    libc::c_int,
    *mut *mut ffi::AVDictionary,
) -> libc::c_int;

thread_local! {
    /// The URL this thread's input being opened may open (once), with FFmpeg's own opener.
    static ALLOWED: RefCell<Option<(CString, IoOpen)>> = const { RefCell::new(None) };
    /// What it asked to open besides, refused.
    static REFUSED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// A file that asked FFmpeg to read other resources (a playlist, a concat list, a reference
/// movie), refused.
#[derive(Debug)]
pub struct Refused {
    pub path: String,
    pub asked: Vec<String>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<String> = self.asked.iter().take(3).map(|u| escaped(u)).collect();
        write!(
            f,
            "input {} refers to other files or addresses ({}{}): it is a playlist, a list or a reference file, and gpen-video reads only the file it is given; make one self-contained file from the sources you trust (for example `ffmpeg -i LIST -c copy one.mp4`) and give that",
            self.path,
            shown.join(", "),
            if self.asked.len() > 3 { ", ..." } else { "" }
        )
    }
}

impl std::error::Error for Refused {}

/// `text` with control characters written as escapes (a name or URL from a stranger's file can
/// hold ESC or BEL bytes, which must not reach a terminal raw).
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The opener every demuxer opened here gets: the named file once, nothing else.
///
/// # Safety
/// Called by FFmpeg with its own valid arguments (a live context, a place for the I/O context,
/// a NUL-terminated URL).
unsafe extern "C" fn open_only_the_named_file(
    s: *mut ffi::AVFormatContext,
    pb: *mut *mut ffi::AVIOContext,
    url: *const libc::c_char,
    flags: libc::c_int,
    options: *mut *mut ffi::AVDictionary,
) -> libc::c_int {
    // SAFETY: FFmpeg passes a valid NUL-terminated string.
    let asked = unsafe { CStr::from_ptr(url) };
    let open = ALLOWED
        .try_with(|a| {
            let mut a = a.borrow_mut();
            let matches = a.as_ref().is_some_and(|(u, _)| u.as_c_str() == asked);
            if matches {
                a.take().map(|(_, open)| open)
            } else {
                None
            }
        })
        .ok()
        .flatten();
    match open {
        // SAFETY: FFmpeg's own opener, called with the arguments FFmpeg gave this one.
        Some(open) => unsafe { open(s, pb, url, flags, options) },
        None => {
            let _ = REFUSED.try_with(|r| r.borrow_mut().push(asked.to_string_lossy().into_owned()));
            -libc::EPERM
        }
    }
}

/// A demuxer opened here: over a file, or over bytes in memory with the I/O context that
/// reads them (freed after the demuxer is closed).
pub(crate) struct Opened {
    // Declared first: dropped (closed) before the memory it reads.
    input: ffmpeg::format::context::Input,
    _memory: Option<MemoryIo>,
}

impl std::ops::Deref for Opened {
    type Target = ffmpeg::format::context::Input;
    fn deref(&self) -> &Self::Target {
        &self.input
    }
}

impl std::ops::DerefMut for Opened {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.input
    }
}

/// Bytes read by an FFmpeg I/O context: what it has read up to.
struct Cursor {
    data: Arc<[u8]>,
    pos: usize,
}

/// An FFmpeg I/O context reading a [`Cursor`], both freed when dropped.
struct MemoryIo {
    ctx: *mut ffi::AVIOContext,
    cursor: *mut Cursor,
}

// SAFETY: the context and the cursor are owned by this value alone and used only by the demuxer
// that reads them, on whichever one thread holds it.
unsafe impl Send for MemoryIo {}

impl MemoryIo {
    /// An I/O context over `data` (read and seek; no write).
    fn new(data: Arc<[u8]>) -> Result<MemoryIo> {
        const BUFFER: usize = 64 * 1024;
        let cursor = Box::into_raw(Box::new(Cursor { data, pos: 0 }));
        // SAFETY: the buffer is av_malloc'd as avio_alloc_context requires (it may replace it;
        // the context's own `buffer` is what is freed); the callbacks get `cursor`, alive until
        // the context is freed in `drop`.
        unsafe {
            let buffer = ffi::av_malloc(BUFFER) as *mut u8;
            if buffer.is_null() {
                drop(Box::from_raw(cursor));
                return Err(ffmpeg::Error::Other { errno: libc::ENOMEM }.into());
            }
            let ctx = ffi::avio_alloc_context(
                buffer,
                BUFFER as libc::c_int,
                0,
                cursor as *mut libc::c_void,
                Some(read_memory),
                None,
                Some(seek_memory),
            );
            if ctx.is_null() {
                ffi::av_free(buffer as *mut libc::c_void);
                drop(Box::from_raw(cursor));
                return Err(ffmpeg::Error::Other { errno: libc::ENOMEM }.into());
            }
            Ok(MemoryIo { ctx, cursor })
        }
    }
}

impl Drop for MemoryIo {
    fn drop(&mut self) {
        // SAFETY: the context was made by avio_alloc_context and the demuxer reading it is
        // closed (it never frees a custom context); its buffer is av_malloc'd; the cursor is
        // the box made in `new`, no longer read by anything.
        unsafe {
            ffi::av_freep(&mut (*self.ctx).buffer as *mut *mut u8 as *mut libc::c_void);
            ffi::avio_context_free(&mut self.ctx);
            drop(Box::from_raw(self.cursor));
        }
    }
}

/// FFmpeg's read callback over a [`Cursor`].
///
/// # Safety
/// `opaque` is the cursor the context was made with; `buf` has room for `size` bytes.
unsafe extern "C" fn read_memory(opaque: *mut libc::c_void, buf: *mut u8, size: libc::c_int) -> libc::c_int {
    // SAFETY: see the function's contract.
    let c = unsafe { &mut *(opaque as *mut Cursor) };
    let left = c.data.len().saturating_sub(c.pos);
    if left == 0 {
        return ffi::AVERROR_EOF;
    }
    let n = left.min(size.max(0) as usize);
    // SAFETY: `n` bytes are left at `pos` and `buf` holds at least `n`.
    unsafe { std::ptr::copy_nonoverlapping(c.data.as_ptr().add(c.pos), buf, n) };
    c.pos += n;
    n as libc::c_int
}

/// FFmpeg's seek callback over a [`Cursor`] (`AVSEEK_SIZE` answers the length).
///
/// # Safety
/// `opaque` is the cursor the context was made with.
unsafe extern "C" fn seek_memory(opaque: *mut libc::c_void, offset: i64, whence: libc::c_int) -> i64 {
    // SAFETY: see the function's contract.
    let c = unsafe { &mut *(opaque as *mut Cursor) };
    let len = c.data.len() as i64;
    if whence & ffi::AVSEEK_SIZE != 0 {
        return len;
    }
    let base = match whence & !ffi::AVSEEK_FORCE {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => c.pos as i64,
        libc::SEEK_END => len,
        _ => return -i64::from(libc::EINVAL),
    };
    match base.checked_add(offset) {
        Some(to) if (0..=len).contains(&to) => {
            c.pos = to as usize;
            to
        }
        _ => -i64::from(libc::EINVAL),
    }
}

/// Opens a source: the file `path`, exactly that file, or when `bytes` is given, those bytes
/// (`path` then only names them in messages); either way no other resource is ever opened.
pub(crate) fn open_source(path: &Path, bytes: Option<&Arc<[u8]>>) -> Result<Opened> {
    match bytes {
        None => open_input(path).map(|input| Opened { input, _memory: None }),
        Some(b) => open_memory(path, b.clone()),
    }
}

/// Opens `data` in memory (named `name` in messages): FFmpeg reads it through a custom I/O
/// context, finds its format by its content, and may open nothing else.
fn open_memory(name: &Path, data: Arc<[u8]>) -> Result<Opened> {
    crate::init_ffmpeg();
    let memory = MemoryIo::new(data)?;
    let mut opts = ffmpeg::Dictionary::new();
    opts.set("pattern_type", "none");
    // SAFETY: as in `open_input`; the format context reads `memory`'s I/O context, which it does
    // not own (AVFMT_FLAG_CUSTOM_IO) and which outlives it in the returned `Opened` (or is
    // freed below on failure, after avformat_open_input freed the format context).
    unsafe {
        let ps = ffi::avformat_alloc_context();
        if ps.is_null() {
            return Err(ffmpeg::Error::Other { errno: libc::ENOMEM }.into());
        }
        (*ps).pb = memory.ctx;
        (*ps).flags |= ffi::AVFMT_FLAG_CUSTOM_IO;
        // Nothing but the bytes: every other resource is refused.
        (*ps).io_open = Some(open_only_the_named_file);
        ALLOWED.with(|a| *a.borrow_mut() = None);
        REFUSED.with(|r| r.borrow_mut().clear());
        let url = CString::default();
        let input = finish_open(ps, &url, opts, name)?;
        Ok(Opened {
            input,
            _memory: Some(memory),
        })
    }
}

/// Opens `path` for reading, exactly that file (see the module's notes). A file that asked for
/// other resources fails with [`Refused`]; anything else FFmpeg reports fails with its
/// `ffmpeg::Error`.
pub(crate) fn open_input(path: &Path) -> Result<ffmpeg::format::context::Input> {
    crate::init_ffmpeg();
    let mut bytes = b"file:".to_vec();
    bytes.extend_from_slice(path.as_os_str().as_bytes());
    let url = CString::new(bytes).map_err(|_| anyhow!("input {}: a file name with a NUL byte", path.display()))?;
    let mut opts = ffmpeg::Dictionary::new();
    opts.set("protocol_whitelist", "file");
    // The image demuxer: the name as it is, never a sequence pattern or a glob.
    opts.set("pattern_type", "none");
    // SAFETY: the context is allocated here and handed to avformat_open_input, which frees it
    // on failure; on success it is closed here or owned by the returned `Input`. The opener
    // set is a plain function; the URL and the options outlive the calls that read them.
    unsafe {
        let ps = ffi::avformat_alloc_context();
        if ps.is_null() {
            return Err(ffmpeg::Error::Other { errno: libc::ENOMEM }.into());
        }
        let Some(default) = (*ps).io_open else {
            ffi::avformat_free_context(ps);
            return Err(anyhow!("FFmpeg gave the demuxer no opener"));
        };
        (*ps).io_open = Some(open_only_the_named_file);
        ALLOWED.with(|a| *a.borrow_mut() = Some((url.clone(), default)));
        REFUSED.with(|r| r.borrow_mut().clear());
        finish_open(ps, &url, opts, path)
    }
}

/// Opens the format context `ps` (its opener already set) on `url` with `opts`, finds its
/// streams, and checks it asked for no other resource (then it fails with [`Refused`], naming
/// `path`).
///
/// # Safety
/// `ps` is a freshly allocated format context, handed over: freed here on any failure.
unsafe fn finish_open(
    mut ps: *mut ffi::AVFormatContext,
    url: &CString,
    opts: ffmpeg::Dictionary,
    path: &Path,
) -> Result<ffmpeg::format::context::Input> {
    // SAFETY: see the function's contract; the options are owned again after the call.
    unsafe {
        let mut o = opts.disown();
        let mut r = ffi::avformat_open_input(&mut ps, url.as_ptr(), std::ptr::null_mut(), &mut o);
        ffmpeg::Dictionary::own(o);
        if r == 0 {
            r = ffi::avformat_find_stream_info(ps, std::ptr::null_mut()).min(0);
            if r < 0 {
                ffi::avformat_close_input(&mut ps);
            }
        }
        ALLOWED.with(|a| *a.borrow_mut() = None);
        let asked = REFUSED.with(|r| std::mem::take(&mut *r.borrow_mut()));
        if !asked.is_empty() {
            if r == 0 {
                ffi::avformat_close_input(&mut ps);
            }
            return Err(Refused {
                path: escaped(&path.display().to_string()),
                asked,
            }
            .into());
        }
        if r < 0 {
            return Err(ffmpeg::Error::from(r).into());
        }
        Ok(ffmpeg::format::context::Input::wrap(ps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_memory_open_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.mp4");
        std::fs::write(&secret, b"not for strangers").unwrap();
        let name = Path::new("upload.png");
        for list in [
            format!("ffconcat version 1.0\nfile '{}'\n", secret.display()),
            format!(
                "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:{}\n#EXT-X-ENDLIST\n",
                secret.display()
            ),
        ] {
            let bytes: Arc<[u8]> = Arc::from(list.as_bytes());
            let err = open_source(name, Some(&bytes))
                .err()
                .expect("a list in memory is refused");
            if let Some(r) = err.downcast_ref::<Refused>() {
                assert!(r.asked.iter().any(|a| a.contains("secret.mp4")), "{r}");
            }
        }
        // Garbage is an error when probed, never a panic.
        for garbage in [&b""[..], b"\x89PNG\r\n\x1a\n", &[0u8; 4096]] {
            let bytes: Arc<[u8]> = Arc::from(garbage);
            assert!(crate::media::decode::probe_memory(name, bytes).is_err(), "{garbage:?}");
        }
    }
}
