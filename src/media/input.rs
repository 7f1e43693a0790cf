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

/// Opens `path` for reading, exactly that file (see the module's notes). A file that asked for
/// other resources fails with [`Refused`]; anything else FFmpeg reports fails with its
/// `ffmpeg::Error`.
pub fn open_input(path: &Path) -> Result<ffmpeg::format::context::Input> {
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
        let mut ps = ffi::avformat_alloc_context();
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
