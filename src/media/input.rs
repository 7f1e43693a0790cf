//! Opening an input for reading: in, the path a user named, or a whole file's bytes in memory
//! with its name (a service's upload); out, FFmpeg's demuxer reading exactly that file or those
//! bytes ([`Opened`]), or an error naming the other resources the file asked FFmpeg to read.
//!
//! FFmpeg reads far more than the file it is given unless told not to: a name such as
//! `concat:a.mp4` or `http:/host/x` is a protocol, a playlist (HLS, DASH), a concat list or a
//! reference movie names other files or URLs and FFmpeg opens them, and an image name with
//! `%d` in it is a sequence. Here the name is taken literally (`file:` + the path, the file
//! protocol only), an image name is never a pattern, and every other resource the demuxer asks
//! to open, on any thread, while opening or while reading, is refused: only the named file is
//! ever opened, once. A file that needed another resource is refused with a message that says
//! what it asked for. The concat demuxer opens the files its list names through an opener of
//! its own (not the demuxer's), so no hook sees them: it is left off the demuxers FFmpeg may
//! pick, and a concat list is refused before it opens anything.
//!
//! Bytes in memory are read through a reader of their own (a custom `AVIOContext`): the name is
//! only their name (FFmpeg's guess of the format by extension, messages), never opened, every
//! resource the demuxer asks for is refused, and no protocol at all is allowed, so a memory
//! input can open no file and no address.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::ops::{Deref, DerefMut};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

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
pub(crate) struct Refused {
    pub(crate) path: String,
    pub(crate) asked: Vec<String>,
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

/// An open demuxer: FFmpeg's `Input` (which it derefs to), and for a source in memory the
/// reader the demuxer reads the bytes through. Use the `Input` through it and never move it
/// out (`std::mem::swap` or `replace` on `*opened`): a memory input's `Input` reads through
/// the reader, which is freed with the `Opened`.
pub struct Opened {
    // Fields drop in the order they are declared: the demuxer is closed before the reader it
    // reads from is freed.
    input: ffmpeg::format::context::Input,
    _memory: Option<MemoryReader>,
}

impl Deref for Opened {
    type Target = ffmpeg::format::context::Input;

    fn deref(&self) -> &Self::Target {
        &self.input
    }
}

impl DerefMut for Opened {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.input
    }
}

/// Where a memory reader is in its bytes.
struct Cursor {
    bytes: Arc<[u8]>,
    /// May lie past the end (as a file's offset may): reads there find nothing.
    pos: u64,
}

/// FFmpeg's reader over bytes in memory: an `AVIOContext` whose callbacks read and seek a
/// [`Cursor`]; the context, its buffer and the cursor are freed on drop.
struct MemoryReader {
    ctx: *mut ffi::AVIOContext,
    cursor: *mut Cursor,
}

// SAFETY: the reader is used only by the demuxer it was made for, which is used by one thread
// at a time (`Input` is Send), and the cursor's bytes are an `Arc<[u8]>` (Send and Sync).
unsafe impl Send for MemoryReader {}

/// The size of the buffer FFmpeg reads the bytes through.
const READ_BUFFER: usize = 64 * 1024;

impl MemoryReader {
    fn new(bytes: &Arc<[u8]>) -> Result<Self> {
        let cursor = Box::into_raw(Box::new(Cursor {
            bytes: bytes.clone(),
            pos: 0,
        }));
        // SAFETY: the buffer comes from av_malloc as avio_alloc_context wants (it may replace
        // it; the one it holds at the end is freed on drop); the opaque pointer is the cursor,
        // which lives until the context is freed. On failure whatever was made is freed here.
        unsafe {
            let buffer = ffi::av_malloc(READ_BUFFER) as *mut u8;
            if buffer.is_null() {
                drop(Box::from_raw(cursor));
                return Err(ffmpeg::Error::Other { errno: libc::ENOMEM }.into());
            }
            let ctx = ffi::avio_alloc_context(
                buffer,
                READ_BUFFER as libc::c_int,
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
            Ok(Self { ctx, cursor })
        }
    }
}

impl Drop for MemoryReader {
    fn drop(&mut self) {
        // SAFETY: the context was made by avio_alloc_context and the demuxer that read through
        // it is closed (it does not free a custom context); its current buffer is FFmpeg's
        // (av_malloc'd), freed once; then the context, then the cursor nothing points to now.
        unsafe {
            if !self.ctx.is_null() {
                ffi::av_freep(&mut (*self.ctx).buffer as *mut *mut u8 as *mut libc::c_void);
                ffi::avio_context_free(&mut self.ctx);
            }
            drop(Box::from_raw(self.cursor));
        }
    }
}

/// FFmpeg's read callback: up to `size` bytes from the cursor into `buf`, or end of file.
///
/// # Safety
/// `opaque` is the [`Cursor`] the reader was made with, `buf` holds `size` bytes.
unsafe extern "C" fn read_memory(opaque: *mut libc::c_void, buf: *mut u8, size: libc::c_int) -> libc::c_int {
    // SAFETY: as the function's contract says; FFmpeg calls one callback at a time.
    let cursor = unsafe { &mut *(opaque as *mut Cursor) };
    let len = cursor.bytes.len() as u64;
    let left = len.saturating_sub(cursor.pos);
    if left == 0 {
        return ffi::AVERROR_EOF;
    }
    let n = left.min(size.max(0) as u64) as usize;
    let at = cursor.pos as usize;
    // SAFETY: `at + n` is within the bytes (n <= len - at) and within `buf` (n <= size).
    unsafe { std::ptr::copy_nonoverlapping(cursor.bytes.as_ptr().add(at), buf, n) };
    cursor.pos += n as u64;
    n as libc::c_int
}

/// FFmpeg's seek callback: moves the cursor (SEEK_SET, SEEK_CUR, SEEK_END) and returns the new
/// offset, or tells the size (AVSEEK_SIZE); a place before the start is an error.
///
/// # Safety
/// `opaque` is the [`Cursor`] the reader was made with.
unsafe extern "C" fn seek_memory(opaque: *mut libc::c_void, offset: i64, whence: libc::c_int) -> i64 {
    // SAFETY: as the function's contract says; FFmpeg calls one callback at a time.
    let cursor = unsafe { &mut *(opaque as *mut Cursor) };
    let len = cursor.bytes.len() as i64;
    let from = match whence & !ffi::AVSEEK_FORCE {
        ffi::AVSEEK_SIZE => return len,
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => cursor.pos as i64,
        libc::SEEK_END => len,
        _ => return i64::from(ffi::AVERROR(libc::EINVAL)),
    };
    match from.checked_add(offset) {
        Some(to) if to >= 0 => {
            cursor.pos = to as u64;
            to
        }
        _ => i64::from(ffi::AVERROR(libc::EINVAL)),
    }
}

/// Every demuxer this FFmpeg has but the concat list's, comma-separated (a format whitelist:
/// FFmpeg has no format blacklist). The concat demuxer opens each file its list names with a
/// context of its own that does not inherit the demuxer's opener, so the hook never sees them.
fn demuxers_but_concat() -> &'static str {
    static LIST: OnceLock<String> = OnceLock::new();
    LIST.get_or_init(|| {
        crate::init_ffmpeg();
        let mut names = Vec::new();
        let mut at = std::ptr::null_mut();
        loop {
            // SAFETY: av_demuxer_iterate walks FFmpeg's static table of demuxers with its own
            // cursor; each entry and its name are static.
            let name = unsafe {
                let f = ffi::av_demuxer_iterate(&mut at);
                if f.is_null() {
                    break;
                }
                CStr::from_ptr((*f).name).to_string_lossy().into_owned()
            };
            if name != "concat" {
                names.push(name);
            }
        }
        names.join(",")
    })
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
    opts.set("format_whitelist", demuxers_but_concat());
    // The image demuxer: the name as it is, never a sequence pattern or a glob.
    opts.set("pattern_type", "none");
    open_with(path, &url, opts, None)
}

/// Opens the source `path` names: the file itself, or, given its `bytes`, those bytes in
/// memory (`path` then only names them and is never opened). Errors as [`open_input`]'s.
pub fn open_source(path: &Path, bytes: Option<&Arc<[u8]>>) -> Result<Opened> {
    let Some(bytes) = bytes else {
        return Ok(Opened {
            input: open_input(path)?,
            _memory: None,
        });
    };
    crate::init_ffmpeg();
    // The name, for FFmpeg's guess by extension; a NUL in it ends it early (harmless: it is
    // never opened).
    let name = path.as_os_str().as_bytes();
    let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
    let url = CString::new(name).expect("no NUL byte left");
    let mut opts = ffmpeg::Dictionary::new();
    // No protocol at all: a demuxer that opens inputs of its own with FFmpeg's opener, past
    // the hook (as the concat list's, also left off the demuxers, does), inherits this list
    // and so opens nothing.
    opts.set("protocol_whitelist", "");
    opts.set("format_whitelist", demuxers_but_concat());
    opts.set("pattern_type", "none");
    let memory = MemoryReader::new(bytes)?;
    let input = open_with(path, &url, opts, Some(&memory))?;
    Ok(Opened {
        input,
        _memory: Some(memory),
    })
}

/// The demuxer for `url`, read through `memory` when given (else opened by FFmpeg's opener,
/// `url` alone), every other resource refused (see the module's notes).
fn open_with(
    path: &Path,
    url: &CString,
    opts: ffmpeg::Dictionary,
    memory: Option<&MemoryReader>,
) -> Result<ffmpeg::format::context::Input> {
    // SAFETY: the context is allocated here and handed to avformat_open_input, which frees it
    // on failure; on success it is closed here or owned by the returned `Input`. The opener
    // set is a plain function; the URL and the options outlive the calls that read them. A
    // memory reader outlives the context (the caller keeps it, and drops it after the Input).
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
        // From memory, nothing may be opened: not even the name.
        let allowed = memory.is_none().then(|| (url.clone(), default));
        if let Some(m) = memory {
            (*ps).pb = m.ctx;
            (*ps).flags |= ffi::AVFMT_FLAG_CUSTOM_IO;
        }
        ALLOWED.with(|a| *a.borrow_mut() = allowed);
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
            // Bytes whose only request was their own name went to a demuxer that opens its
            // file itself (the image sequence one, which FFmpeg picks by extension for bytes
            // it recognises no other way): unreadable from memory, not a list of others.
            if memory.is_some() && asked.iter().all(|a| a.as_bytes() == url.as_bytes()) {
                return Err(ffmpeg::Error::InvalidData.into());
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
    fn the_memory_reader_reads_and_seeks_as_a_file_does() {
        let bytes: Arc<[u8]> = (0..100u8).collect::<Vec<u8>>().into();
        let m = MemoryReader::new(&bytes).unwrap();
        let op = m.cursor as *mut libc::c_void;
        let mut buf = [0u8; 200];
        // SAFETY: the callbacks get the reader's own cursor and a buffer of the size given.
        unsafe {
            assert_eq!(seek_memory(op, 0, ffi::AVSEEK_SIZE), 100);
            assert_eq!(read_memory(op, buf.as_mut_ptr(), 30), 30);
            assert_eq!(buf[..30], bytes[..30]);
            assert_eq!(seek_memory(op, 10, libc::SEEK_CUR), 40);
            assert_eq!(read_memory(op, buf.as_mut_ptr(), 200), 60);
            assert_eq!(buf[..60], bytes[40..]);
            assert_eq!(read_memory(op, buf.as_mut_ptr(), 200), ffi::AVERROR_EOF);
            assert_eq!(seek_memory(op, -1, libc::SEEK_END | ffi::AVSEEK_FORCE), 99);
            assert_eq!(read_memory(op, buf.as_mut_ptr(), 200), 1);
            assert_eq!(buf[0], 99);
            let einval = i64::from(ffi::AVERROR(libc::EINVAL));
            assert_eq!(seek_memory(op, -1, libc::SEEK_SET), einval, "before the start");
            assert_eq!(seek_memory(op, i64::MAX, libc::SEEK_END), einval, "overflow");
            assert_eq!(seek_memory(op, 0, 77), einval, "an unknown whence");
            // Past the end, as a file allows: reads find its end.
            assert_eq!(seek_memory(op, 500, libc::SEEK_SET), 500);
            assert_eq!(read_memory(op, buf.as_mut_ptr(), 200), ffi::AVERROR_EOF);
            // Through FFmpeg's own reader over the callbacks (which believes it is at 0).
            assert_eq!(seek_memory(op, 0, libc::SEEK_SET), 0);
            assert_eq!(ffi::avio_size(m.ctx), 100);
            assert_eq!(ffi::avio_seek(m.ctx, 90, libc::SEEK_SET), 90);
            assert_eq!(ffi::avio_read(m.ctx, buf.as_mut_ptr(), 200), 10);
            assert_eq!(buf[..10], bytes[90..]);
        }
        drop(m);
        assert_eq!(Arc::strong_count(&bytes), 1, "the reader let its bytes go");
    }

    #[test]
    fn an_empty_upload_is_an_error() {
        let bytes: Arc<[u8]> = Vec::new().into();
        assert!(open_source(Path::new("x.png"), Some(&bytes)).is_err());
        assert!(open_source(Path::new("x.mp4"), Some(&bytes)).is_err());
        assert_eq!(Arc::strong_count(&bytes), 1);
    }
}
