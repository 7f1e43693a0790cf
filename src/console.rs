//! Console output: in, lines meant for a person (logs, summaries, tables); out, writes to
//! stderr or stdout that never panic: a closed pipe (`| head -1`, `| true`) drops the text and
//! the work in flight carries on.

use std::io::Write;

/// Writes `line` and a newline to stderr; a write error (a closed pipe) is ignored.
pub fn eprint_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Writes `text` to stdout and flushes; returns false when stdout is closed (the reader has
/// gone), so a listing can stop quietly.
pub fn print_text(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_ok()
}

/// `eprintln!` that ignores a closed stderr: `console::eprint!("{x} done")`.
#[macro_export]
macro_rules! __console_eprint {
    ($($arg:tt)*) => {
        $crate::console::eprint_line(&format!($($arg)*))
    };
}
pub use crate::__console_eprint as eprint;

/// A stderr writer for the log that swallows write errors, so a closed stderr neither panics
/// the process nor makes the logger report (on that same closed stderr) that it could not
/// write.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}
