//! Metrics of a plusfs process (a server, a member of a replica group, a FUSE mount): the
//! `prometheus` crate's registry and types, latency histograms by operation, and an HTTP
//! endpoint serving the registry in Prometheus' text format on `GET /metrics`.

mod http;
mod latency;

pub use http::{serve, Refresh};
pub use latency::{latency_buckets, Latencies};
pub use prometheus;

/// Sets counter `c` to `now` (a total kept elsewhere, e.g. by a server's own counters), if
/// it moved forward.
pub fn set_total(c: &prometheus::IntCounter, now: u64) {
    let cur = c.get();
    if now > cur {
        c.inc_by(now - cur);
    }
}
