//! Latency histograms by operation name.

use prometheus::{Histogram, HistogramOpts, HistogramVec, Registry};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

/// Exponential bucket bounds in seconds: 10 µs, 20 µs, … about 42 s (23 buckets).
pub fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1e-5, 2.0, 23).expect("valid buckets")
}

/// One latency histogram per operation, labelled `op`, registered in a registry.
pub struct Latencies {
    vec: HistogramVec,
    /// The per-operation handles, so an observation takes a read lock, not a label lookup.
    by_op: RwLock<HashMap<&'static str, Histogram>>,
}

impl Latencies {
    /// A histogram family `name` (seconds) registered in `registry`.
    pub fn new(registry: &Registry, name: &str, help: &str) -> Latencies {
        let opts = HistogramOpts::new(name, help).buckets(latency_buckets());
        let vec = HistogramVec::new(opts, &["op"]).expect("valid histogram");
        registry.register(Box::new(vec.clone())).expect("a new metric name");
        Latencies { vec, by_op: RwLock::default() }
    }

    /// Records that one `op` took `took`.
    pub fn observe(&self, op: &'static str, took: Duration) {
        if let Some(h) = self.by_op.read().expect("histograms").get(op) {
            h.observe(took.as_secs_f64());
            return;
        }
        let h = self.vec.with_label_values(&[op]);
        h.observe(took.as_secs_f64());
        self.by_op.write().expect("histograms").insert(op, h);
    }
}
