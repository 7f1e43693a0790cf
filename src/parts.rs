//! Threads kept for a run for the work one frame shares out (the face mesh's crops, the temporal
//! filter's bands): in, a thread count and a name; out, a rayon pool of that many threads, or
//! none for one thread.
//!
//! Threads started for each frame cost about 40 us a frame for one and 0.4 ms for fifteen (on
//! the 2-core machine), on the stage's own thread: on a many-core host that alone capped a
//! stage's frames per second. The pool's threads wait between frames.

/// A pool of `threads` threads named `name-N`; none for one thread, or where the system refuses
/// threads (the work then runs on the calling thread, the same values).
pub(crate) fn pool(threads: usize, name: &'static str) -> Option<rayon::ThreadPool> {
    if threads <= 1 {
        return None;
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map_err(|e| tracing::warn!("{name} on one thread: {e}"))
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_thread_has_no_pool_and_more_have_theirs() {
        assert!(super::pool(1, "t").is_none());
        assert!(super::pool(0, "t").is_none());
        let p = super::pool(3, "t").expect("a pool of three");
        assert_eq!(p.current_num_threads(), 3);
        let name = p.install(|| std::thread::current().name().map(str::to_owned));
        assert!(name.is_some_and(|n| n.starts_with("t-")));
    }
}
