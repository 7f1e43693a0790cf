//! How many decoded frames a video's line holds at once: in, the count its stages need to stay
//! busy (`Budget::new`); out, a `Ticket` the decode stage waits for before it sends each frame
//! on, which the frame gives back when it is dropped (written, or let go anywhere on the way).
//!
//! Each stage's queue alone bounds the frames between two stages, but where every queue of the
//! line fills (a slow detector and a slow encoder on the same cores) the frames in flight, each
//! its decoded planes and its faces' crops and changes, were two or three times what keeps every
//! stage busy. The budget holds the decoder back instead, so the peak memory is the budget's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Frames out (with a ticket) and whether the budget still holds the decoder back.
#[derive(Default)]
struct Out {
    frames: usize,
    open: bool,
}

/// The frames a line may hold at once (see the module's doc).
pub(crate) struct Budget {
    cap: usize,
    out: Mutex<Out>,
    back: Condvar,
    most: AtomicUsize,
}

/// One frame's place in a [`Budget`], given back when dropped.
pub(crate) struct Ticket(Arc<Budget>);

impl Budget {
    /// A budget of `cap` frames (at least one).
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            out: Mutex::new(Out { frames: 0, open: true }),
            back: Condvar::new(),
            most: AtomicUsize::new(0),
        })
    }

    /// The budget in frames.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// A ticket for the next frame: waits while `cap` frames are out, unless the budget has been
    /// opened (a stage has stopped: the frames it held may never come back).
    pub(crate) fn take(self: &Arc<Self>) -> Ticket {
        let mut out = self.out.lock();
        while out.open && out.frames >= self.cap {
            self.back.wait(&mut out);
        }
        out.frames += 1;
        self.most.fetch_max(out.frames, Ordering::Relaxed);
        Ticket(Arc::clone(self))
    }

    /// Stops holding the decoder back: from now on [`Budget::take`] never waits. Called when a
    /// stage of the line returns, so a line that stops early (an error, a cut, a receiver gone)
    /// never leaves the decoder waiting for frames stuck in a queue nobody reads.
    pub(crate) fn open(&self) {
        let mut out = self.out.lock();
        out.open = false;
        self.back.notify_all();
    }

    /// The most frames that were out at once.
    pub(crate) fn most(&self) -> usize {
        self.most.load(Ordering::Relaxed)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut out = self.0.out.lock();
        out.frames -= 1;
        self.0.back.notify_one();
    }
}

/// Opens `budget` when dropped: held by each stage's thread of a line, so the budget opens when
/// any stage returns or panics.
struct OpenOnExit(Arc<Budget>);

/// `f` (a stage's body, to run on its thread) holding `budget` open on its exit: the budget
/// opens when `f` returns or panics. Without a budget, `f` as it is.
pub(crate) fn opened_on_exit<T>(budget: Option<&Arc<Budget>>, f: impl FnOnce() -> T) -> impl FnOnce() -> T {
    let guard = budget.cloned().map(OpenOnExit);
    move || {
        let _open = guard;
        f()
    }
}

impl Drop for OpenOnExit {
    fn drop(&mut self) {
        self.0.open();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_decoder_waits_for_a_ticket_until_a_frame_goes_or_the_budget_opens() {
        let budget = Budget::new(2);
        let held = [budget.take(), budget.take()];
        // A third waits for one of the two.
        let (tx, rx) = crossbeam_channel::bounded(1);
        let b = Arc::clone(&budget);
        let waiter = std::thread::spawn(move || {
            let t = b.take();
            tx.send(()).expect("the test waits for it");
            t
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "took a third of two"
        );
        let [first, second] = held;
        drop(first);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a ticket given back lets the next go");
        let third = waiter.join().expect("the waiter took its ticket");
        assert_eq!(budget.most(), 2);
        // Opened (a stage stopped), it never waits again.
        budget.open();
        let more: Vec<_> = (0..5).map(|_| budget.take()).collect();
        assert_eq!(budget.most(), 7);
        drop((second, third, more));
        assert_eq!(budget.out.lock().frames, 0, "every ticket came back");
    }
}
