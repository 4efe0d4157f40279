//! Message and byte counters of one client or of a server's peer calls.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

tokio::task_local! {
    /// Requests sent by the task running inside [`counting`].
    static TASK_REQUESTS: Cell<u64>;
}

/// Runs `fut` and counts the requests it sends through any [`Pool`](crate::Pool) on its
/// own task (tasks it spawns are not counted). Returns its output and that count: what a
/// FUSE mount reports as server requests per file operation.
pub async fn counting<F: Future>(fut: F) -> (F::Output, u64) {
    TASK_REQUESTS
        .scope(Cell::new(0), async move {
            let out = fut.await;
            (out, TASK_REQUESTS.with(Cell::get))
        })
        .await
}

/// Counts one request for the surrounding [`counting`] scope, if any.
pub(crate) fn count_task_request() {
    let _ = TASK_REQUESTS.try_with(|c| c.set(c.get() + 1));
}

/// Message and byte counters of one client (or of a server's peer connections).
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub msgs_out: AtomicU64,
    pub msgs_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub retries: AtomicU64,
    /// The map epoch calls carry, and hints of a newer one their answers carried.
    pub epochs: crate::epoch::EpochWatch,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub requests: u64,
    pub msgs_out: u64,
    pub msgs_in: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub retries: u64,
}

impl Counters {
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            msgs_out: self.msgs_out.load(Ordering::Relaxed),
            msgs_in: self.msgs_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

impl std::ops::Sub for CountersSnapshot {
    type Output = CountersSnapshot;
    fn sub(self, o: CountersSnapshot) -> CountersSnapshot {
        CountersSnapshot {
            requests: self.requests - o.requests,
            msgs_out: self.msgs_out - o.msgs_out,
            msgs_in: self.msgs_in - o.msgs_in,
            bytes_out: self.bytes_out - o.bytes_out,
            bytes_in: self.bytes_in - o.bytes_in,
            retries: self.retries - o.retries,
        }
    }
}
