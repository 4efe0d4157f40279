//! Connections to every server of the cluster, with counters and reconnects.

use crate::conn::{CallError, Connection};
use plusfs_placement::ClusterMap;
use plusfs_proto::{Request, Response, ServerId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// Message and byte counters of one client (or of a server's peer connections).
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub msgs_out: AtomicU64,
    pub msgs_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub retries: AtomicU64,
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

struct Slot {
    addr: String,
    conns: Vec<Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
}

/// Connections to every server in a cluster map: `per_server` pipelined connections each,
/// opened lazily and reopened after a failure.
pub struct Pool {
    slots: HashMap<ServerId, Slot>,
    counters: Arc<Counters>,
    retries: u32,
}

impl Pool {
    /// A pool for `map` with `per_server` connections per server and `retries` resends of
    /// idempotent requests after a transport failure.
    pub fn new(map: &ClusterMap, per_server: usize, retries: u32) -> Pool {
        let slots = map
            .servers
            .iter()
            .map(|s| {
                let conns = (0..per_server.max(1)).map(|_| Mutex::new(None)).collect();
                (s.id, Slot { addr: s.address.clone(), conns, next: AtomicUsize::new(0) })
            })
            .collect();
        Pool { slots, counters: Arc::default(), retries }
    }

    /// The counters of every call made through this pool.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    async fn connection(&self, server: ServerId) -> Result<Arc<Connection>, CallError> {
        let slot = self.slots.get(&server).ok_or_else(|| CallError::Connect {
            addr: format!("server {server}"),
            reason: "not in the cluster map".into(),
        })?;
        let i = slot.next.fetch_add(1, Ordering::Relaxed) % slot.conns.len();
        let mut guard = slot.conns[i].lock().await;
        if let Some(c) = guard.as_ref() {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(Connection::connect(&slot.addr, self.counters.clone()).await?);
        *guard = Some(c.clone());
        Ok(c)
    }

    /// Sends `req` to `server`. Idempotent requests are resent after a transport failure
    /// (with a short back-off); others report the failure, since they may have been applied.
    pub async fn call(&self, server: ServerId, req: &Request) -> Result<Response, CallError> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut attempt = 0;
        loop {
            let result = match self.connection(server).await {
                Ok(c) => c.call(req).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.is_transport() && attempt < self.retries && retry_allowed(req, &e) => {
                    attempt += 1;
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50 << attempt.min(5))).await;
                }
                other => return other,
            }
        }
    }
}

/// A request that never reached the server (connect failed) can always be resent.
fn retry_allowed(req: &Request, e: &CallError) -> bool {
    matches!(e, CallError::Connect { .. }) || req.is_idempotent()
}
