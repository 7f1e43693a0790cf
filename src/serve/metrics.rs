//! The service's metrics: in, each request's outcome and latency, the queue's depth, the
//! enhancement workers' running counts and the jobs' figures; out, the OpenMetrics text for
//! `GET /metrics` (written by `prometheus-client`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::faces::enhance::Live;

/// How a request ended, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    BadRequest,
    TooLarge,
    Busy,
    SlowClient,
    Timeout,
    Error,
    /// The client closed the connection before its answer.
    ClientGone,
}

impl Outcome {
    const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::BadRequest,
        Outcome::TooLarge,
        Outcome::Busy,
        Outcome::SlowClient,
        Outcome::Timeout,
        Outcome::Error,
        Outcome::ClientGone,
    ];

    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLarge => "too_large",
            Outcome::Busy => "busy",
            Outcome::SlowClient => "slow_client",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
            Outcome::ClientGone => "client_gone",
        }
    }
}

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.13, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A series' labels: one name and its value.
type Labels = [(&'static str, String); 1];

/// Counters shared by the request handlers and the metrics page.
pub(crate) struct Metrics {
    /// Restore requests by outcome (every outcome listed, from zero).
    outcomes: Family<Labels, Counter>,
    /// Latency of the restore requests answered 200.
    latency: Histogram,
    faces: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let outcomes = Family::default();
        for o in Outcome::ALL {
            drop(outcomes.get_or_create(&[("outcome", o.name().to_string())]));
        }
        Metrics {
            outcomes,
            latency: Histogram::new(BUCKETS),
            faces: Counter::default(),
        }
    }
}

/// A gauge of `value` (a count).
fn gauge(value: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    g
}

impl Metrics {
    /// Counts a request that ended as `outcome`; the latency of answered ones.
    pub(crate) fn record(&self, outcome: Outcome, latency: Duration, faces: u64) {
        self.outcomes
            .get_or_create(&[("outcome", outcome.name().to_string())])
            .inc();
        if outcome == Outcome::Ok {
            self.latency.observe(latency.as_secs_f64());
            self.faces.inc_by(faces);
        }
    }

    /// Registers the request series in `r`: requests by outcome, the latency histogram of
    /// restored images, faces restored, the queue's depth (`queue`: the requests in flight and
    /// the most the service takes), and per enhancement worker its batches, faces, mean batch
    /// fill (of `batch` crops) and faces per busy second.
    pub(crate) fn register(&self, r: &mut Registry, workers: &[(String, Arc<Live>)], batch: usize, queue: (u64, u64)) {
        let (in_flight, capacity) = queue;
        r.register(
            "gpen_requests",
            "Restore requests by how they ended.",
            self.outcomes.clone(),
        );
        r.register(
            "gpen_request_seconds",
            "Latency of restored images, from the request's arrival to its answer.",
            self.latency.clone(),
        );
        r.register("gpen_faces", "Faces restored in answered requests.", self.faces.clone());
        r.register(
            "gpen_queue_depth",
            "Requests accepted and not yet answered.",
            gauge(in_flight),
        );
        r.register(
            "gpen_queue_capacity",
            "Requests accepted at once before 503.",
            gauge(capacity),
        );
        let (batches, faces) = (
            Family::<Labels, Counter>::default(),
            Family::<Labels, Counter>::default(),
        );
        let (fill, speed) = (
            Family::<Labels, Gauge<f64, AtomicU64>>::default(),
            Family::<Labels, Gauge<f64, AtomicU64>>::default(),
        );
        for (worker, live) in workers {
            let label = [("worker", worker.clone())];
            let (b, f) = (live.batches.load(Relaxed), live.faces.load(Relaxed));
            let busy = live.busy_us.load(Relaxed) as f64 / 1e6;
            batches.get_or_create(&label).inc_by(b);
            faces.get_or_create(&label).inc_by(f);
            let filled = if b > 0 {
                f as f64 / (b as f64 * batch as f64)
            } else {
                0.0
            };
            fill.get_or_create(&label).set(filled);
            speed
                .get_or_create(&label)
                .set(if busy > 0.0 { f as f64 / busy } else { 0.0 });
        }
        r.register("gpen_worker_batches", "Model calls per enhancement worker.", batches);
        r.register("gpen_worker_faces", "Faces restored per enhancement worker.", faces);
        r.register(
            "gpen_worker_batch_fill",
            "Mean share of each batch filled with faces.",
            fill,
        );
        r.register(
            "gpen_worker_faces_per_second",
            "Faces per second of the worker's busy time.",
            speed,
        );
    }
}

/// Upper bounds (seconds) of the job-duration histogram's buckets.
const JOB_BUCKETS: [f64; 8] = [1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0];

/// Registers the jobs' series in `r`: how many jobs are in each state now, and how long the
/// finished ones ran (from their start to done or failed).
pub(crate) fn register_jobs(r: &mut Registry, counts: (usize, usize, usize, usize), seconds: &[f64]) {
    let (queued, running, done, failed) = counts;
    let states = Family::<Labels, Gauge>::default();
    for (state, n) in [
        ("queued", queued),
        ("running", running),
        ("done", done),
        ("failed", failed),
    ] {
        states.get_or_create(&[("state", state.to_string())]).set(n as i64);
    }
    r.register("gpen_jobs", "Jobs (/v1/jobs) by state, now.", states);
    let ran = Histogram::new(JOB_BUCKETS);
    seconds.iter().for_each(|&s| ran.observe(s));
    r.register("gpen_job_seconds", "Time each finished job ran.", ran);
}

/// Registers in `r` what this replica holds of the jobs shared through the database, and the
/// backlog every replica sees (what an autoscaler scales on): (jobs held, segments held,
/// backlog).
pub(crate) fn register_shared(r: &mut Registry, (jobs, segments, backlog): (u64, u64, u64)) {
    r.register(
        "gpen_replica_jobs_held",
        "Jobs this replica holds now (planning, running in one piece, joining).",
        gauge(jobs),
    );
    r.register(
        "gpen_replica_segments_held",
        "Film segments this replica restores now.",
        gauge(segments),
    );
    r.register(
        "gpen_jobs_backlog",
        "Jobs queued and film segments waiting for a replica, every replica's.",
        gauge(backlog),
    );
}

/// The OpenMetrics text of `r`, and its content type.
pub(crate) fn page(r: &Registry) -> (String, &'static str) {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, r);
    (text, "application/openmetrics-text; version=1.0.0; charset=utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_counts_outcomes_and_buckets_latencies() {
        let m = Metrics::default();
        m.record(Outcome::Ok, Duration::from_millis(40), 2);
        m.record(Outcome::Ok, Duration::from_millis(400), 1);
        m.record(Outcome::Busy, Duration::ZERO, 0);
        let live = Arc::new(Live::default());
        live.add(3, Duration::from_millis(100));
        let mut r = Registry::default();
        m.register(&mut r, &[("cpu0".into(), live)], 4, (0, 64));
        let page = page(&r).0;
        assert!(page.contains("gpen_requests_total{outcome=\"ok\"} 2"), "{page}");
        assert!(page.contains("gpen_requests_total{outcome=\"busy\"} 1"));
        assert!(page.contains("gpen_request_seconds_bucket{le=\"0.05\"} 1"));
        assert!(page.contains("gpen_request_seconds_bucket{le=\"0.5\"} 2"));
        assert!(page.contains("gpen_request_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(page.contains("gpen_faces_total 3"));
        assert!(page.contains("gpen_worker_batch_fill{worker=\"cpu0\"} 0.75"));
        assert!(page.contains("gpen_worker_faces_per_second{worker=\"cpu0\"} 30.0"));
        assert!(page.contains("gpen_queue_capacity 64"), "{page}");
        let mut r = Registry::default();
        register_jobs(&mut r, (1, 0, 2, 0), &[3.0, 20.0]);
        register_shared(&mut r, (1, 2, 5));
        let jobs = super::page(&r).0;
        assert!(jobs.contains("gpen_jobs{state=\"done\"} 2"), "{jobs}");
        assert!(jobs.contains("gpen_job_seconds_bucket{le=\"5.0\"} 1"), "{jobs}");
        assert!(
            jobs.contains("gpen_jobs_backlog 5") && jobs.ends_with("# EOF\n"),
            "{jobs}"
        );
    }
}
