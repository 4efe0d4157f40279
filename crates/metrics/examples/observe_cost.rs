//! What timing a request costs a server: the time of one `Instant::now()`, one elapsed and
//! one histogram observation by operation name, as the request path does with an endpoint
//! on, averaged over many observations from two threads.
//!
//!     cargo run --release -p plusfs-metrics --example observe_cost

use plusfs_metrics::prometheus::Registry;
use plusfs_metrics::Latencies;
use std::sync::Arc;
use std::time::Instant;

fn main() {
    const N: u64 = 5_000_000;
    let registry = Registry::new();
    let lat = Arc::new(Latencies::new(&registry, "x_seconds", "test"));
    let ops = ["stat", "create", "unlink", "mkdir"];
    let t = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|k| {
            let lat = lat.clone();
            std::thread::spawn(move || {
                for i in 0..N {
                    let started = Instant::now();
                    lat.observe(ops[((i + k) % 4) as usize], started.elapsed());
                }
            })
        })
        .collect();
    for th in threads {
        th.join().expect("thread");
    }
    let per = t.elapsed().as_nanos() as f64 / N as f64;
    println!("{{\"case\": \"observe\", \"threads\": 2, \"ns_per_observation_per_thread\": {per:.1}}}");
}
