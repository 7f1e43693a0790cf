//! An ordered pool of stage threads: in, a channel of items and a function that works on one
//! item with state of its own per thread; out, the same items on the next channel in the order
//! they came, and the pool's statistics (the busy time of all its threads, and how many ran).
//!
//! A stage whose items do not depend on each other (alignment, paste) runs on several cores
//! this way while the stages around it still see frames one after another. Each thread takes
//! the next item and its sequence number under one lock; a finished item waits in a small
//! reorder buffer until every item before it has gone on, and no thread takes a new item while
//! that buffer holds as many items as there are threads (one slow item does not let the others
//! run ahead and fill memory). A panic in `work` fails the stage like an error.

use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{anyhow, Result};
use crossbeam_channel::{Receiver, Sender};

use crate::stats::{Clock, StageStat};

/// The pool's input: the receiver and the sequence number of the next item taken.
struct Input<T> {
    rx: Receiver<T>,
    next: u64,
}

/// The pool's output: the sequence number due next and the items finished ahead of it.
struct Output<T> {
    due: u64,
    held: BTreeMap<u64, T>,
    tx: Option<Sender<T>>,
}

/// Runs `work` on every item of `rx` on `threads` threads (each with its own state made by
/// `init`) and sends the items on to `tx` in the order they came. Returns when the input ends,
/// the receiver of `tx` is gone or `work` fails (the first failure is the error returned).
/// The statistics count every thread's busy time, so `busy / threads` is the pool's share.
pub(super) fn ordered<T: Send, S>(
    name: &'static str,
    queue_cap: usize,
    threads: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, &mut T) -> Result<()> + Sync,
    rx: Receiver<T>,
    tx: Sender<T>,
) -> Result<StageStat> {
    let threads = threads.max(1);
    let input = Mutex::new(Input { rx, next: 0 });
    let output = Mutex::new(Output {
        due: 0,
        held: BTreeMap::new(),
        tx: Some(tx),
    });
    // Signalled whenever items leave the reorder buffer or the pool stops.
    let drained = Condvar::new();
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let fail = |e: anyhow::Error| {
        failure.lock().get_or_insert(e);
        stop.store(true, Ordering::Relaxed);
        // Taken so that no thread is between its check of `stop` and its wait.
        let _o = output.lock();
        drained.notify_all();
    };
    let run = || -> StageStat {
        let mut clock = Clock::new(name, queue_cap);
        let mut state = init();
        loop {
            {
                let mut o = output.lock();
                while o.held.len() >= threads && !stop.load(Ordering::Relaxed) {
                    drained.wait(&mut o);
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let next = {
                let mut i = input.lock();
                clock.queue(i.rx.len());
                match i.rx.recv() {
                    Ok(item) => {
                        i.next += 1;
                        Some((i.next - 1, item))
                    }
                    Err(_) => None,
                }
            };
            let Some((seq, mut item)) = next else { break };
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let done = clock.time(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut state, &mut item)))
                    .unwrap_or_else(|_| Err(anyhow!("internal error: the {name} stage panicked")))
            });
            if let Err(e) = done {
                fail(e);
                break;
            }
            clock.count(1);
            // Sent under the lock, so the items leave in order; a full queue downstream holds
            // every thread here, which is the backpressure a single thread would give.
            let mut o = output.lock();
            o.held.insert(seq, item);
            let mut sent_any = false;
            loop {
                let due = o.due;
                let Some(ready) = o.held.remove(&due) else { break };
                o.due += 1;
                sent_any = true;
                let sent = o.tx.as_ref().is_some_and(|tx| tx.send(ready).is_ok());
                if !sent {
                    o.tx = None;
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
            }
            if sent_any || stop.load(Ordering::Relaxed) {
                drained.notify_all();
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        clock.finish()
    };
    let stats: Vec<std::thread::Result<StageStat>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(run)).collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    let stats = stats
        .into_iter()
        .map(|st| st.map_err(|_| anyhow!("internal error: a thread of the {name} stage panicked")))
        .collect::<Result<Vec<_>>>()?;
    Ok(StageStat::sum(name, queue_cap, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    /// Items that take uneven times leave in the order they came, every one exactly once.
    #[test]
    fn items_leave_in_order_whatever_their_cost() {
        let (in_tx, in_rx) = bounded::<u64>(4);
        let (out_tx, out_rx) = bounded::<u64>(4);
        let out = std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..200u64 {
                    in_tx.send(i).unwrap();
                }
            });
            let pool = s.spawn(move || {
                ordered(
                    "test",
                    4,
                    3,
                    || 0u64,
                    |seen, x: &mut u64| {
                        *seen += 1;
                        // Every seventh item is slow: later ones finish first.
                        if x.is_multiple_of(7) {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        *x *= 10;
                        Ok(())
                    },
                    in_rx,
                    out_tx,
                )
            });
            let got: Vec<u64> = out_rx.iter().collect();
            let stat = pool.join().unwrap().unwrap();
            assert_eq!(stat.items, 200);
            assert_eq!(stat.threads, 3);
            got
        });
        assert_eq!(out, (0..200u64).map(|i| i * 10).collect::<Vec<_>>());
    }

    /// One slow item does not let the other threads run ahead: while it is in work, the
    /// others take only as many items as the reorder buffer may hold (each item is a frame's
    /// buffers), not the rest of the input.
    #[test]
    fn one_slow_item_does_not_let_the_others_run_ahead() {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        let (in_tx, in_rx) = bounded::<u64>(128);
        let (out_tx, out_rx) = bounded::<u64>(256);
        let (slow, started_meanwhile) = (AtomicBool::new(false), AtomicUsize::new(0));
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..100u64 {
                    in_tx.send(i).unwrap();
                }
            });
            ordered(
                "test",
                4,
                3,
                || (),
                |_, x: &mut u64| {
                    if *x == 10 {
                        slow.store(true, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(300));
                        slow.store(false, Ordering::SeqCst);
                    } else if slow.load(Ordering::SeqCst) {
                        started_meanwhile.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(())
                },
                in_rx,
                out_tx,
            )
            .unwrap();
        });
        let got: Vec<u64> = out_rx.try_iter().collect();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        let n = started_meanwhile.load(Ordering::SeqCst);
        assert!(n <= 6, "{n} items taken while one was slow");
    }

    #[test]
    fn a_panic_in_work_fails_the_stage_without_a_hang() {
        let (in_tx, in_rx) = bounded::<u64>(4);
        let (out_tx, out_rx) = bounded::<u64>(256);
        let r = std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..100u64 {
                    if in_tx.send(i).is_err() {
                        break;
                    }
                }
            });
            ordered(
                "test",
                4,
                3,
                || (),
                |_, x: &mut u64| {
                    assert!(*x != 7, "item seven");
                    Ok(())
                },
                in_rx,
                out_tx,
            )
        });
        assert_eq!(r.unwrap_err().to_string(), "internal error: the test stage panicked");
        assert!(out_rx.try_iter().all(|x| x < 7), "nothing after the panic");
    }

    #[test]
    fn a_failure_is_returned_and_stops_the_pool() {
        let (in_tx, in_rx) = bounded::<u64>(4);
        let (out_tx, out_rx) = bounded::<u64>(64);
        let r = std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..100u64 {
                    if in_tx.send(i).is_err() {
                        break;
                    }
                }
            });
            ordered(
                "test",
                4,
                2,
                || (),
                |_, x: &mut u64| if *x == 5 { Err(anyhow!("item five")) } else { Ok(()) },
                in_rx,
                out_tx,
            )
        });
        assert_eq!(r.unwrap_err().to_string(), "item five");
        let got: Vec<u64> = out_rx.try_iter().collect();
        assert!(got.iter().all(|&x| x < 5), "nothing after the failure: {got:?}");
    }
}
