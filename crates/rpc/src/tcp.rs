//! The TCP transport: `per_server` pipelined connections to each server of a cluster map,
//! opened lazily and reopened after a failure.

use crate::conn::{CallError, Connection};
use crate::counters::Counters;
use crate::transport::Transport;
use futures::future::BoxFuture;
use plusfs_placement::ClusterMap;
use plusfs_proto::{Cred, Request, Response, ServerId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex;

struct Slot {
    addr: String,
    conns: Vec<Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
}

/// Connections to every server of a cluster map.
pub struct TcpTransport {
    slots: HashMap<ServerId, Slot>,
    counters: Arc<Counters>,
}

impl TcpTransport {
    /// Connections to the servers of `map`, `per_server` each, counted in `counters`.
    pub fn new(map: &ClusterMap, per_server: usize, counters: Arc<Counters>) -> TcpTransport {
        let slots = map
            .servers
            .iter()
            .map(|s| {
                let conns = (0..per_server.max(1)).map(|_| Mutex::new(None)).collect();
                (s.id, Slot { addr: s.address.clone(), conns, next: AtomicUsize::new(0) })
            })
            .collect();
        TcpTransport { slots, counters }
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
}

impl Transport for TcpTransport {
    fn send<'a>(
        &'a self,
        server: ServerId,
        cred: &'a Cred,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<Response, CallError>> {
        Box::pin(async move { self.connection(server).await?.call(cred, req).await })
    }
}
