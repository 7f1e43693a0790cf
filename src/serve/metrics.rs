//! The service's metrics: in, each request's outcome and latency, the queue's depth and the
//! enhancement workers' running counts; out, the Prometheus text format for `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::faces::enhance::Live;

/// How a request ended, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
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

/// Counters shared by the request handlers and the metrics page.
#[derive(Default)]
pub(crate) struct Metrics {
    outcomes: [AtomicU64; Outcome::ALL.len()],
    /// Restore requests answered 200, by latency bucket (the last is +Inf).
    buckets: [AtomicU64; BUCKETS.len() + 1],
    latency_us: AtomicU64,
    faces: AtomicU64,
}

impl Metrics {
    /// Counts a request that ended as `outcome`; the latency of answered ones.
    pub fn record(&self, outcome: Outcome, latency: Duration, faces: u64) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).expect("listed");
        self.outcomes[i].fetch_add(1, Relaxed);
        if outcome == Outcome::Ok {
            let s = latency.as_secs_f64();
            let b = BUCKETS.iter().position(|&le| s <= le).unwrap_or(BUCKETS.len());
            self.buckets[b].fetch_add(1, Relaxed);
            self.latency_us.fetch_add(latency.as_micros() as u64, Relaxed);
            self.faces.fetch_add(faces, Relaxed);
        }
    }

    /// The Prometheus text page: requests by outcome, the latency histogram of restored
    /// images, faces restored, the queue's depth, and per enhancement worker its batches,
    /// faces, mean batch fill (of `batch` crops) and faces per busy second.
    /// The page; `queue` is the requests in flight and the most the service takes.
    pub(crate) fn render(&self, workers: &[(String, Arc<Live>)], batch: usize, queue: (u64, u64)) -> String {
        let (in_flight, capacity) = queue;
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(w, "# HELP gpen_requests_total Restore requests by how they ended.");
        let _ = writeln!(w, "# TYPE gpen_requests_total counter");
        for (o, n) in Outcome::ALL.iter().zip(&self.outcomes) {
            let _ = writeln!(w, "gpen_requests_total{{outcome=\"{}\"}} {}", o.name(), n.load(Relaxed));
        }
        let _ = writeln!(
            w,
            "# HELP gpen_request_seconds Latency of restored images, from the request's arrival to its answer."
        );
        let _ = writeln!(w, "# TYPE gpen_request_seconds histogram");
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            let le = BUCKETS.get(i).map_or("+Inf".to_string(), |v| v.to_string());
            let _ = writeln!(w, "gpen_request_seconds_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(
            w,
            "gpen_request_seconds_sum {}",
            self.latency_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(w, "gpen_request_seconds_count {cumulative}");
        let _ = writeln!(w, "# HELP gpen_faces_total Faces restored in answered requests.");
        let _ = writeln!(w, "# TYPE gpen_faces_total counter");
        let _ = writeln!(w, "gpen_faces_total {}", self.faces.load(Relaxed));
        let _ = writeln!(w, "# HELP gpen_queue_depth Requests accepted and not yet answered.");
        let _ = writeln!(w, "# TYPE gpen_queue_depth gauge");
        let _ = writeln!(w, "gpen_queue_depth {in_flight}");
        let _ = writeln!(w, "# HELP gpen_queue_capacity Requests accepted at once before 503.");
        let _ = writeln!(w, "# TYPE gpen_queue_capacity gauge");
        let _ = writeln!(w, "gpen_queue_capacity {capacity}");
        let series: [(&str, &str, &str); 4] = [
            (
                "gpen_worker_batches_total",
                "counter",
                "Model calls per enhancement worker.",
            ),
            (
                "gpen_worker_faces_total",
                "counter",
                "Faces restored per enhancement worker.",
            ),
            (
                "gpen_worker_batch_fill",
                "gauge",
                "Mean share of each batch filled with faces.",
            ),
            (
                "gpen_worker_faces_per_second",
                "gauge",
                "Faces per second of the worker's busy time.",
            ),
        ];
        for (k, (name, kind, help)) in series.iter().enumerate() {
            let _ = writeln!(w, "# HELP {name} {help}");
            let _ = writeln!(w, "# TYPE {name} {kind}");
            for (worker, live) in workers {
                let (batches, faces) = (live.batches.load(Relaxed), live.faces.load(Relaxed));
                let busy = live.busy_us.load(Relaxed) as f64 / 1e6;
                let value = match k {
                    0 => batches as f64,
                    1 => faces as f64,
                    2 if batches > 0 => faces as f64 / (batches as f64 * batch as f64),
                    3 if busy > 0.0 => faces as f64 / busy,
                    _ => 0.0,
                };
                let _ = writeln!(w, "{name}{{worker=\"{worker}\"}} {value}");
            }
        }
        out
    }
}

/// Upper bounds (seconds) of the job-duration histogram's buckets.
const JOB_BUCKETS: [f64; 8] = [1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0];

/// The jobs' series: how many jobs are in each state now, and how long the finished ones ran
/// (from their start to done or failed).
pub(crate) fn render_jobs(counts: (usize, usize, usize, usize), seconds: &[f64]) -> String {
    let mut out = String::new();
    let w = &mut out;
    let (queued, running, done, failed) = counts;
    let _ = writeln!(w, "# HELP gpen_jobs Jobs (/v1/jobs) by state, now.");
    let _ = writeln!(w, "# TYPE gpen_jobs gauge");
    for (state, n) in [
        ("queued", queued),
        ("running", running),
        ("done", done),
        ("failed", failed),
    ] {
        let _ = writeln!(w, "gpen_jobs{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(w, "# HELP gpen_job_seconds Time each finished job ran.");
    let _ = writeln!(w, "# TYPE gpen_job_seconds histogram");
    for le in JOB_BUCKETS {
        let n = seconds.iter().filter(|&&s| s <= le).count();
        let _ = writeln!(w, "gpen_job_seconds_bucket{{le=\"{le}\"}} {n}");
    }
    let _ = writeln!(w, "gpen_job_seconds_bucket{{le=\"+Inf\"}} {}", seconds.len());
    let _ = writeln!(w, "gpen_job_seconds_sum {}", seconds.iter().sum::<f64>());
    let _ = writeln!(w, "gpen_job_seconds_count {}", seconds.len());
    out
}

/// What this replica holds of the jobs shared through the database, and the backlog every
/// replica sees (what an autoscaler scales on): (jobs held, segments held, backlog).
pub(crate) fn render_shared((jobs, segments, backlog): (u64, u64, u64)) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "# HELP gpen_replica_jobs_held Jobs this replica holds now (planning, running in one piece, joining)."
    );
    let _ = writeln!(w, "# TYPE gpen_replica_jobs_held gauge");
    let _ = writeln!(w, "gpen_replica_jobs_held {jobs}");
    let _ = writeln!(
        w,
        "# HELP gpen_replica_segments_held Film segments this replica restores now."
    );
    let _ = writeln!(w, "# TYPE gpen_replica_segments_held gauge");
    let _ = writeln!(w, "gpen_replica_segments_held {segments}");
    let _ = writeln!(
        w,
        "# HELP gpen_jobs_backlog Jobs queued and film segments waiting for a replica, every replica's."
    );
    let _ = writeln!(w, "# TYPE gpen_jobs_backlog gauge");
    let _ = writeln!(w, "gpen_jobs_backlog {backlog}");
    out
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
        let page = m.render(&[("cpu0".into(), live)], 4, (0, 64));
        assert!(page.contains("gpen_requests_total{outcome=\"ok\"} 2"), "{page}");
        assert!(page.contains("gpen_requests_total{outcome=\"busy\"} 1"));
        assert!(page.contains("gpen_request_seconds_bucket{le=\"0.05\"} 1"));
        assert!(page.contains("gpen_request_seconds_bucket{le=\"0.5\"} 2"));
        assert!(page.contains("gpen_request_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(page.contains("gpen_faces_total 3"));
        assert!(page.contains("gpen_worker_batch_fill{worker=\"cpu0\"} 0.75"));
        assert!(page.contains("gpen_worker_faces_per_second{worker=\"cpu0\"} 30"));
    }
}
