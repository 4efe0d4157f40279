//! Calls to the servers of a cluster: one attempt through a [`Transport`], resends of
//! idempotent requests after a transport failure.

use crate::conn::CallError;
use crate::counters::Counters;
use crate::tcp::TcpTransport;
use crate::transport::Transport;
use plusfs_placement::ClusterMap;
use plusfs_proto::{Cred, Request, Response, ServerId};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Calls to every server in a cluster map, with counters and resends.
pub struct Pool {
    transport: Arc<dyn Transport>,
    counters: Arc<Counters>,
    retries: u32,
    backoff: Duration,
    /// This pool's id and next sequence number in replicated slots' exactly-once tables.
    once_id: u64,
    once_seq: std::sync::atomic::AtomicU64,
}

/// A random id for a pool's exactly-once requests (no two pools of a cluster share one,
/// in practice: 64 bits from the process, the time and a per-process counter).
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// First wait before a resend (doubled for each further one).
const BACKOFF: Duration = Duration::from_millis(100);

impl Pool {
    /// A TCP pool for `map` with `per_server` connections per server and `retries` resends
    /// of idempotent requests after a transport failure.
    pub fn new(map: &ClusterMap, per_server: usize, retries: u32) -> Pool {
        let counters = Arc::<Counters>::default();
        let tcp = TcpTransport::new(map, per_server, counters.clone());
        Pool::with_transport(Arc::new(tcp), counters, retries)
    }

    /// A pool over another transport (an in-process test cluster's links), counting in
    /// `counters` what the transport counts there.
    pub fn with_transport(transport: Arc<dyn Transport>, counters: Arc<Counters>, retries: u32) -> Pool {
        Pool { transport, counters, retries, backoff: BACKOFF, once_id: random_id(), once_seq: Default::default() }
    }

    /// Sets the first wait before a resend (100 ms unless set; a simulated network's
    /// failures need no time to clear).
    pub fn with_backoff(mut self, backoff: Duration) -> Pool {
        self.backoff = backoff;
        self
    }

    /// The counters of every call made through this pool.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Routes with `map` from now on (servers it adds are reachable).
    pub fn learn_map(&self, map: &ClusterMap) {
        self.transport.learn_map(map);
    }

    /// True when `server` is a replicated slot (a group whose leader may change).
    pub fn replicated(&self, server: ServerId) -> bool {
        self.transport.replicated(server)
    }

    /// Sends `req` to `server` as a server ([`Cred::server`], which peers trust): what
    /// servers send each other when no caller's permissions are to be checked.
    pub async fn call(&self, server: ServerId, req: &Request) -> Result<Response, CallError> {
        self.call_as(server, &Cred::server(), req).await
    }

    /// Sends `req` to `server` as a server, once: a transport failure is answered at once
    /// (a caller that has other servers to ask).
    pub async fn call_no_resend(&self, server: ServerId, req: &Request) -> Result<Response, CallError> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        crate::counters::count_task_request();
        self.transport.send(server, &Cred::server(), req).await
    }

    /// Sends `req`, made by `cred`, to `server`. Idempotent requests are resent after a
    /// transport failure (with a short back-off); others report the failure, since they
    /// may have been applied.
    ///
    /// To a replicated slot, a request that is not idempotent, or that changes state
    /// through a path ([`Request::needs_once`]), goes as `Once` (this pool's id and a new
    /// sequence number, kept by every resend of this call; not from a pool that never
    /// resends): the slot answers a resend with the first answer, so it is resent like an
    /// idempotent one, also after its leader died — and an overwrite whose first attempt
    /// took effect is not run again on a file another client renamed meanwhile.
    pub async fn call_as(&self, server: ServerId, cred: &Cred, req: &Request) -> Result<Response, CallError> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        crate::counters::count_task_request();
        let once;
        // Without resends (servers' calls to their peers), the table would only cost.
        let req = if self.retries > 0 && req.needs_once() && self.transport.replicated(server) {
            let seq = self.once_seq.fetch_add(1, Ordering::Relaxed);
            once = Request::Once { client: self.once_id, seq, op: Box::new(req.clone()) };
            &once
        } else {
            req
        };
        let mut attempt = 0;
        loop {
            match self.transport.send(server, cred, req).await {
                Err(e) if e.is_transport() && attempt < self.retries && retry_allowed(req, &e) => {
                    attempt += 1;
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.backoff * (1 << (attempt - 1).min(5))).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::BoxFuture;
    use plusfs_proto::Reply;
    use std::sync::Mutex as StdMutex;

    /// A replicated slot whose first `fail` attempts break the connection after the
    /// request was sent; it keeps every request it is given.
    struct Flaky {
        fail: StdMutex<u32>,
        seen: StdMutex<Vec<Request>>,
    }

    impl Transport for Flaky {
        fn send<'a>(
            &'a self,
            _: ServerId,
            _: &'a Cred,
            req: &'a Request,
        ) -> BoxFuture<'a, Result<Response, CallError>> {
            self.seen.lock().unwrap().push(req.clone());
            let mut fail = self.fail.lock().unwrap();
            let r = match *fail {
                0 => Ok(Ok(Reply::Done)),
                _ => {
                    *fail -= 1;
                    Err(CallError::Broken { addr: "m1".into(), reason: "reset".into() })
                }
            };
            Box::pin(async move { r })
        }

        fn replicated(&self, _: ServerId) -> bool {
            true
        }
    }

    fn once_ids(seen: &[Request]) -> Vec<(u64, u64)> {
        seen.iter()
            .map(|r| match r {
                Request::Once { client, seq, .. } => (*client, *seq),
                other => panic!("sent without Once: {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn an_overwrite_keeps_one_exactly_once_id_across_resends() {
        let flaky = Arc::new(Flaky { fail: StdMutex::new(2), seen: StdMutex::default() });
        let pool = Pool::with_transport(flaky.clone(), Default::default(), 3).with_backoff(Duration::ZERO);
        let write = Request::Write { path: "/d/f".into(), offset: 0, data: b"v".to_vec().into(), append: false };
        assert_eq!(pool.call(0, &write).await.unwrap(), Ok(Reply::Done));
        let ids = once_ids(&flaky.seen.lock().unwrap());
        assert_eq!(ids.len(), 3, "two resends after broken connections");
        assert!(ids.iter().all(|&id| id == ids[0]), "one id for every attempt: {ids:?}");
        // The next call is another request.
        pool.call(0, &write).await.unwrap().unwrap();
        assert_ne!(once_ids(&flaky.seen.lock().unwrap())[3], ids[0]);
        // A read stays as it is.
        flaky.seen.lock().unwrap().clear();
        pool.call(0, &Request::Stat { path: "/d/f".into() }).await.unwrap().unwrap();
        assert!(matches!(flaky.seen.lock().unwrap()[0], Request::Stat { .. }));
    }
}
