//! The TCP transport: `per_server` pipelined connections to each server of a cluster map,
//! opened lazily and reopened after a failure.
//!
//! A replicated server slot has several members, one of which leads and serves; the
//! others answer `Redirect` with the leader's address (or none while an election runs).
//! The transport keeps, per slot, the member it believes leads, follows redirects, and
//! moves on to the next member when one cannot be reached — a request that never reached
//! a member, or that a member refused with a redirect, was not applied, so resending it is
//! always safe. It gives up after [`FAILOVER_WAIT`] without a leader.

use crate::conn::{CallError, Connection};
use crate::counters::Counters;
use crate::transport::Transport;
use futures::future::BoxFuture;
use plusfs_placement::ClusterMap;
use plusfs_proto::{Cred, Reply, Request, Response, ServerId};
use plusfs_tls::ClientTls;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How long a call waits for a replicated slot to present a leader (a new leader serves
/// about 1.5 s after the old one's loss: the followers keep its lease, then elect, then the
/// new one takes over) before it fails with EIO.
pub const FAILOVER_WAIT: Duration = Duration::from_secs(10);

/// How long a member may leave a request that can be resent unanswered before it is
/// resent to another member (a leader cut off from its group stops leading within 1.6 s).
const MEMBER_SILENCE: Duration = Duration::from_secs(5);

/// Pause before asking the members again once each was tried and none leads.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(50);

struct Slot {
    /// The member addresses (one for an unreplicated server); a redirect to a member the
    /// map did not list (one added since) adds it.
    addrs: std::sync::RwLock<Vec<String>>,
    /// Whether the slot is replicated (redirects and member failover apply).
    replicated: bool,
    /// The address of an unreplicated server (its only one).
    fixed: String,
    /// Index in `addrs` of the member believed to lead.
    leader: AtomicUsize,
    conns: Vec<Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
}

impl Slot {
    fn leader_addr(&self) -> (usize, String) {
        let addrs = self.addrs.read().expect("member addresses");
        let i = self.leader.load(Ordering::Relaxed) % addrs.len();
        (i, addrs[i].clone())
    }

    fn len(&self) -> usize {
        self.addrs.read().expect("member addresses").len()
    }

    /// After member `from` failed or redirected: believe `to` (an address) leads, or the
    /// next member if `to` is unknown. Returns whether a leader was named.
    fn move_on(&self, from: usize, to: Option<&str>) -> bool {
        let mut addrs = self.addrs.write().expect("member addresses");
        let named = to.map(|a| match addrs.iter().position(|x| x == a) {
            Some(i) => i,
            None => {
                addrs.push(a.to_string());
                addrs.len() - 1
            }
        });
        let next = named.unwrap_or((from + 1) % addrs.len());
        // Only the first caller to see `from` fail moves the slot on.
        let _ = self.leader.compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed);
        named.is_some()
    }
}

fn new_slot(s: &plusfs_placement::ServerEntry, per_server: usize) -> Slot {
    let conns = (0..per_server.max(1)).map(|_| Mutex::new(None)).collect();
    let addrs = s.addresses();
    let first = addrs.iter().position(|a| *a == s.address).unwrap_or(0);
    Slot {
        addrs: std::sync::RwLock::new(addrs),
        replicated: !s.members.is_empty(),
        fixed: s.address.clone(),
        leader: AtomicUsize::new(first),
        conns,
        next: AtomicUsize::new(0),
    }
}

/// Connections to every server of a cluster map.
pub struct TcpTransport {
    /// Per server slot; servers a newer map adds join ([`Transport::learn_map`]).
    slots: std::sync::RwLock<HashMap<ServerId, Arc<Slot>>>,
    per_server: usize,
    counters: Arc<Counters>,
    /// The TLS client end (none: plain TCP), or why it could not be loaded.
    tls: Result<Option<Arc<ClientTls>>, crate::secure::ClientTlsError>,
    /// A connection idle this long is reopened before its next call: half the time after
    /// which servers close idle client connections, so a call never races that close.
    reuse_within: std::time::Duration,
}

impl TcpTransport {
    /// Connections to the servers of `map`, `per_server` each, counted in `counters`.
    pub fn new(map: &ClusterMap, per_server: usize, counters: Arc<Counters>) -> TcpTransport {
        let slots = map.servers.iter().map(|s| (s.id, Arc::new(new_slot(s, per_server)))).collect();
        counters.epochs.set_current(map.epoch);
        TcpTransport {
            slots: std::sync::RwLock::new(slots),
            per_server,
            counters,
            tls: crate::secure::client_tls(&map.tls),
            reuse_within: map.tls.idle_limit() / 2,
        }
    }

    fn slot(&self, server: ServerId) -> Result<Arc<Slot>, CallError> {
        self.slots.read().expect("slots").get(&server).cloned().ok_or_else(|| CallError::Connect {
            addr: format!("server {server}"),
            reason: "not in the cluster map".into(),
        })
    }

    /// A connection to `addr` from the slot's pool (reopened if it broke or went to
    /// another member).
    async fn connection(&self, slot: &Slot, addr: &str) -> Result<Arc<Connection>, CallError> {
        let i = slot.next.fetch_add(1, Ordering::Relaxed) % slot.conns.len();
        let mut guard = slot.conns[i].lock().await;
        if let Some(c) = guard.as_ref() {
            if c.is_alive() && c.addr() == addr && c.idle_for() < self.reuse_within {
                return Ok(c.clone());
            }
        }
        let tls =
            self.tls.as_ref().map_err(|e| CallError::Connect { addr: addr.to_string(), reason: e.to_string() })?;
        let c = Arc::new(Connection::connect_with(addr, self.counters.clone(), tls.as_deref()).await?);
        *guard = Some(c.clone());
        Ok(c)
    }

    /// One call to a replicated slot: to the member believed to lead, following redirects
    /// and passing over members that cannot be reached, for at most [`FAILOVER_WAIT`].
    async fn send_to_group(&self, server: ServerId, slot: &Slot, cred: &Cred, req: &Request) -> Attempt {
        let deadline = Instant::now() + FAILOVER_WAIT;
        let mut misses = 0;
        loop {
            let (i, addr) = slot.leader_addr();
            let answer = match self.connection(slot, &addr).await {
                // A member cut off from the network answers nothing and refuses nothing:
                // a request that may be resent is given up on it after a while (the member
                // stops leading by then, and another one leads). A resend that reaches the
                // same leader waits for the first run's answer (exactly-once table).
                Ok(c) if req.is_idempotent() => match tokio::time::timeout(MEMBER_SILENCE, c.call(cred, req)).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        slot.move_on(i, None);
                        let reason = format!("no answer within {} s", MEMBER_SILENCE.as_secs());
                        return Err(CallError::Broken { addr, reason });
                    }
                },
                Ok(c) => c.call(cred, req).await,
                Err(e) => Err(e),
            };
            let named = match answer {
                Ok(Ok(Reply::Redirect { leader })) => slot.move_on(i, leader.as_deref()),
                Err(CallError::Connect { .. }) => slot.move_on(i, None),
                Err(e @ CallError::Broken { .. }) => {
                    // It may have been applied: the caller decides on a resend, which goes
                    // to the next member.
                    slot.move_on(i, None);
                    return Err(e);
                }
                other => return other,
            };
            misses += 1;
            if Instant::now() > deadline {
                return Err(CallError::Connect {
                    addr: format!("server {server} ({})", slot.addrs.read().expect("member addresses").join(", ")),
                    reason: format!("no member leads its replica group (waited {} s)", FAILOVER_WAIT.as_secs()),
                });
            }
            if !named && misses % slot.len() == 0 {
                tokio::time::sleep(NO_LEADER_PAUSE).await;
            }
        }
    }
}

type Attempt = Result<Response, CallError>;

impl Transport for TcpTransport {
    fn send<'a>(
        &'a self,
        server: ServerId,
        cred: &'a Cred,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<Response, CallError>> {
        Box::pin(async move {
            let slot = self.slot(server)?;
            if !slot.replicated {
                return self.connection(&slot, &slot.fixed).await?.call(cred, req).await;
            }
            self.send_to_group(server, &slot, cred, req).await
        })
    }

    fn replicated(&self, server: ServerId) -> bool {
        self.slots.read().expect("slots").get(&server).is_some_and(|s| s.replicated)
    }

    fn learn_map(&self, map: &ClusterMap) {
        let mut slots = self.slots.write().expect("slots");
        for s in &map.servers {
            // A slot is rebuilt when its address or a member it does not know changed (a
            // replaced member); addresses a redirect taught it stay until then.
            let known = slots.get(&s.id).is_some_and(|k| {
                let addrs = k.addrs.read().expect("addresses");
                k.fixed == s.address && s.addresses().iter().all(|a| addrs.contains(a))
            });
            if !known {
                slots.insert(s.id, Arc::new(new_slot(s, self.per_server)));
            }
        }
        slots.retain(|id, _| {
            map.server(*id).is_some() || map.migration.as_ref().is_some_and(|m| m.before.iter().any(|b| b.id == *id))
        });
        self.counters.epochs.set_current(map.epoch);
    }
}
