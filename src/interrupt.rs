//! Ctrl-C and termination requests: in, SIGINT and SIGTERM delivered to the process; out, two
//! flags a long-running command polls, so it can stop gently first and at once when asked again.
//!
//! The first signal sets [`Interrupts::soft`]: finish the work in flight, start nothing new.
//! The second sets [`Interrupts::hard`]: stop now. Hand `hard` to a run as its cancel flag
//! (`CancelToken::from_flag(interrupts.hard.clone())`), and the pipeline fails with "cancelled" and removes
//! its partial output. A third signal, should stopping hang, ends the process at once with
//! 128 + the signal number (130 for SIGINT, 143 for SIGTERM), as the shell's default would.
//!
//! The handlers only touch atomics (async-signal-safe); callers print their own messages.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};

/// Exit status for a run stopped by Ctrl-C (128 + SIGINT), the shell convention.
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

/// The two stop requests. Clones share the same flags.
#[derive(Clone, Debug, Default)]
pub struct Interrupts {
    /// Set by the first SIGINT/SIGTERM: finish what is in flight, start nothing new.
    pub soft: Arc<AtomicBool>,
    /// The first signal's number (0 before any).
    pub signal: Arc<AtomicI32>,
    /// Set by the second: stop at once (hand it to a job's `CancelToken`).
    pub(crate) hard: Arc<AtomicBool>,
}

impl Interrupts {
    /// Flags no signal sets (for library use and tests); set them by hand to simulate one.
    pub fn none() -> Self {
        Self::default()
    }

    /// A stop of either kind was asked for.
    pub fn requested(&self) -> bool {
        self.soft.load(Ordering::SeqCst) || self.hard.load(Ordering::SeqCst)
    }

    /// The exit status for a run a signal stopped: 128 + the first signal's number (130 for
    /// Ctrl-C, 143 for SIGTERM), as a shell reports it.
    pub fn exit_code(&self) -> u8 {
        match self.signal.load(Ordering::SeqCst) {
            s @ 1..=127 => 128 + s as u8,
            _ => EXIT_INTERRUPTED,
        }
    }

    /// An immediate stop was asked for.
    pub(crate) fn hard_requested(&self) -> bool {
        self.hard.load(Ordering::SeqCst)
    }
}

static INSTALLED: Mutex<Option<Interrupts>> = Mutex::new(None);

/// The exit status for a command a signal stopped (130 for Ctrl-C, 143 for SIGTERM), if the
/// handlers are installed and a signal came.
pub fn exit_code_if_stopped() -> Option<u8> {
    let installed = INSTALLED.lock();
    installed.as_ref().filter(|i| i.requested()).map(Interrupts::exit_code)
}

/// Installs the SIGINT and SIGTERM handlers (once per process; later calls return the same
/// flags) and returns the flags they set.
pub fn install() -> Result<Interrupts> {
    let mut installed = INSTALLED.lock();
    if let Some(i) = installed.as_ref() {
        return Ok(i.clone());
    }
    let flags = Interrupts::none();
    for sig in [SIGINT, SIGTERM] {
        // Registered first, so it sees `hard` as it was before this signal: only a signal
        // arriving after the hard stop was asked for ends the process here.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, flags.hard.clone())
            .with_context(|| format!("installing the handler for signal {sig}"))?;
        let (soft, hard, first) = (flags.soft.clone(), flags.hard.clone(), flags.signal.clone());
        // SAFETY: the action only performs atomic operations, which are async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                let _ = first.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
                if soft.swap(true, Ordering::SeqCst) {
                    hard.store(true, Ordering::SeqCst);
                }
            })
        }
        .with_context(|| format!("installing the handler for signal {sig}"))?;
    }
    *installed = Some(flags.clone());
    Ok(flags)
}
