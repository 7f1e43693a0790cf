//! Console output: in, lines meant for a person (logs, summaries, tables); out, writes to
//! stderr or stdout that never panic: a closed pipe (`| head -1`, `| true`) drops the text and
//! the work in flight carries on, and control characters (from file names) are shown escaped,
//! never sent to the terminal.

use std::borrow::Cow;
use std::io::Write;

/// `text` with its control characters (but newlines and tabs) written as `\x1b`-style escapes,
/// so a file name holding ESC or BEL cannot ring, recolour or rewrite the terminal.
pub(crate) fn escape_controls(text: &str) -> Cow<'_, str> {
    let control = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if control(c) {
            let n = c as u32;
            if n < 0x100 {
                out.push_str(&format!("\\x{n:02x}"));
            } else {
                out.push_str(&format!("\\u{{{n:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes `line` and a newline to stderr, control characters escaped; a write error (a closed
/// pipe) is ignored.
pub fn eprint_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", escape_controls(line));
}

/// Writes `text` to stdout (control characters escaped) and flushes; returns false when stdout
/// is closed (the reader has gone), so a listing can stop quietly.
pub fn print_text(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(escape_controls(text).as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

/// The log's field formatter: `name=value` pairs (the message bare), each value's control
/// characters (and in values, newlines) escaped; `log.*` fields left out. The level's colours,
/// written by the event formatter, are kept.
pub fn log_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let v = escape_controls(&format!("{value:?}")).into_owned();
        match field.name() {
            "message" => write!(w, "{v}"),
            // The `log` crate's bookkeeping (events from crates that log), as the default
            // formatter leaves it out.
            name if name.starts_with("log.") => Ok(()),
            // A value (a file name) cannot start a line of its own.
            name => write!(w, "{name}={}", v.replace('\n', "\\n")),
        }
    })
    .delimited(" ")
}

/// `eprintln!` that ignores a closed stderr: `console::eprint!("{x} done")`.
#[macro_export]
macro_rules! __console_eprint {
    ($($arg:tt)*) => {
        $crate::console::eprint_line(&format!($($arg)*))
    };
}
pub(crate) use crate::__console_eprint as eprint;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            escape_controls("bell\u{7}\u{1b}[31mred é.mp4"),
            "bell\\x07\\x1b[31mred é.mp4"
        );
        assert_eq!(escape_controls("two\nlines\tok"), "two\nlines\tok");
        assert_eq!(escape_controls("c1\u{9b}"), "c1\\x9b");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
    }
}
