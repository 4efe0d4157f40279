//! What the network side of a server hands each request to.
//!
//! An unreplicated server serves every request at once. A member of a replicated server
//! slot serves only while it leads its replica group and has taken over (its engine opened
//! over the replicated store, unfinished cross-server operations recovered); until then,
//! and on followers, every request is answered with `Redirect` to the leader the member
//! knows of, which the transport follows. Group requests (`GroupStatus`, `GroupDigest`)
//! are answered by every member.
//!
//! Reads on the leader are linearizable by a leader lease: a quorum acknowledged this
//! leader less than [`Member::lease`] ago, and followers refuse to elect anyone else for
//! the election timeout after they last heard from it, so no other leader can have
//! committed anything since. Once the lease has run out, a request first waits for a
//! read-index round (`Group::read_barrier`): a quorum confirms the leader again.

use crate::exporter::Exporter;
use crate::metrics::{Metrics, NetCounters};
use crate::osd::Osd;
use crate::space::Space;
use plusfs_placement::ClusterMap;
use plusfs_proto::{Cred, GroupInfo, Reply, Request, Response, ServerId, StoreDigest, WireError};
use plusfs_replica::Group;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Longest wait for a new member to catch up in `cluster replace`.
const REPLACE_WAIT: Duration = Duration::from_secs(600);

/// Longest wait for a read-index round before a member gives up and redirects.
const BARRIER_WAIT: Duration = Duration::from_secs(1);

/// The member side of a replicated server slot.
pub struct Member {
    /// The slot the group keeps.
    pub server: ServerId,
    /// The group, as this member runs it.
    pub group: Group,
    /// The cluster map (members' client addresses).
    pub map: ClusterMap,
    /// How long after a quorum's acknowledgement the leader serves without asking again.
    pub lease: Duration,
    /// The member's file data, as the group's state machine sees it.
    pub data: Arc<dyn plusfs_replica::DataSink>,
    /// The member's store (the exactly-once table is read from it).
    pub store: Arc<plusfs_store::RocksStore>,
    /// The exactly-once requests running here.
    pub running: crate::once::Running,
}

impl Member {
    /// The client address of the leader this member knows of, if it is another member
    /// (a member that leads but does not serve yet names none: asking it again soon is
    /// all a client can do).
    fn leader_address(&self) -> Option<String> {
        let (leader, client) = self.group.leader_client().filter(|(l, _)| *l != self.group.id)?;
        if !client.is_empty() {
            return Some(client);
        }
        Some(self.map.server(self.server)?.member(leader)?.address.clone())
    }

    fn info(&self, serving: bool) -> GroupInfo {
        let s = self.group.status();
        GroupInfo {
            server: self.server,
            member: s.id,
            state: s.state,
            leader: s.leader,
            term: s.term,
            last_log: s.last_log,
            applied: s.applied,
            voters: s.voters,
            learners: s.learners,
            lag: s.lag.map(|l| l.into_iter().collect()).unwrap_or_default(),
            serving,
        }
    }

    async fn digest(&self) -> Response {
        let (db, data, member) = (self.group.store().clone(), self.data.clone(), self.group.id);
        let eio = |what: &str, e: String| WireError::new(plusfs_proto::Errno::EIO, format!("{what}: {e}"));
        let summed = tokio::task::spawn_blocking(move || {
            // The store is summed from a snapshot, the file data live: both belong to the
            // same log position only if nothing was applied meanwhile (else: again).
            for _ in 0..5 {
                let store =
                    plusfs_replica::check::digest(&db).map_err(|e| eio("cannot sum up the store", e.to_string()))?;
                // Summed as gathered: bounded memory for file data of any size.
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                let (mut records, mut bytes) = (0u64, 0u64);
                data.gather(&mut |p| {
                    h.update(&p.segment.to_le_bytes());
                    h.update(&p.offset.to_le_bytes());
                    h.update(&p.bytes);
                    records += 1;
                    bytes += p.bytes.len() as u64;
                    Ok(())
                })
                .map_err(|e| eio("cannot sum up the file data", e.to_string()))?;
                if plusfs_replica::check::applied(&db)
                    .map_err(|e| eio("cannot read the log position", e.to_string()))?
                    != store.applied
                {
                    continue;
                }
                return Ok(StoreDigest {
                    member,
                    applied: store.applied,
                    digest: store.digest,
                    keys: store.keys,
                    data_digest: h.digest(),
                    data_records: records,
                    data_bytes: bytes,
                });
            }
            Err(eio("cannot sum up the member", "it kept applying entries; try again when it is quiet".into()))
        });
        let d = summed.await.map_err(|e| eio("digest task failed", e.to_string()))??;
        Ok(Reply::Digest(d))
    }

    /// Whether a quorum acknowledged this member as leader within the lease.
    fn lease_holds(&self) -> bool {
        self.group.quorum_acked_within(self.lease)
    }
}

/// The receiver of a server's requests.
pub struct Front {
    osd: OnceLock<Arc<Osd>>,
    member: Option<Arc<Member>>,
    /// Counters of messages and bytes (the engine's once it serves).
    idle_metrics: Metrics,
    /// Connection and TLS counters.
    net: NetCounters,
    /// The process's Prometheus registry (request latencies are observed into it).
    exporter: Exporter,
    /// The free-space floor of the server's disk.
    space: Arc<Space>,
}

impl Front {
    /// A front that serves `osd` (an unreplicated server).
    pub fn serving(osd: Arc<Osd>, space: Arc<Space>) -> Arc<Front> {
        let f = Front::new(None, space);
        f.take_over(osd);
        Arc::new(f)
    }

    /// A front for a member of a replicated slot that does not serve yet.
    pub fn member(member: Arc<Member>, space: Arc<Space>) -> Arc<Front> {
        Arc::new(Front::new(Some(member), space))
    }

    fn new(member: Option<Arc<Member>>, space: Arc<Space>) -> Front {
        Front {
            space,
            osd: OnceLock::new(),
            member,
            idle_metrics: Metrics::default(),
            net: NetCounters::default(),
            exporter: Exporter::new(),
        }
    }

    /// Whether requests are answered here rather than redirected: an unreplicated server
    /// always, a member while it leads and has taken over (its disk's floor is the one
    /// that counts then).
    pub fn answers(&self) -> bool {
        self.member.as_ref().is_none_or(|m| self.osd.get().is_some() && m.group.is_leader())
    }

    /// The free-space floor of the server's disk.
    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Reclaims the space of deleted metadata and file data whenever the disk is at its
    /// floor (while this front lives and, for the file data, while it serves).
    pub fn keep_space(self: &Arc<Self>, store: Arc<dyn plusfs_store::DirStore>) {
        let (alive, me) = (Arc::downgrade(self), Arc::downgrade(self));
        let space = self.space.clone();
        self.space.clone().keep(
            move || alive.strong_count() > 0,
            move || {
                let (store, space) = (store.clone(), space.clone());
                let osd = me.upgrade().and_then(|f| f.osd.get().cloned());
                async move {
                    // File data first: compaction may use the reserve, and what it frees
                    // gives the store room to flush and compact.
                    if let Some(osd) = osd {
                        if let Err(e) = osd.filedata.compact_now(crate::filedata::COMPACT_LIVE_RATIO).await {
                            tracing::warn!(cause = %e.message(), "cannot compact file data on a full disk");
                        }
                    }
                    let free = space.free_now();
                    match tokio::task::spawn_blocking(move || store.reclaim(free)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(cause = %e, "cannot reclaim the store's deleted space"),
                        Err(e) => tracing::warn!(cause = %e, "store reclaim task failed"),
                    }
                }
            },
        );
    }

    /// Connection and TLS counters.
    pub fn net(&self) -> &NetCounters {
        &self.net
    }

    /// The process's metrics registry.
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }

    /// Starts serving `osd` (this member took over its slot).
    pub fn take_over(&self, osd: Arc<Osd>) {
        self.exporter.take_store(osd.engine.store_handle().latency_histograms());
        let _ = self.osd.set(osd);
    }

    /// The server, once it serves.
    pub fn osd(&self) -> Option<&Arc<Osd>> {
        self.osd.get()
    }

    /// Message and byte counters.
    /// The epoch of the map the server works with (0 while it does not serve).
    pub fn epoch(&self) -> u64 {
        self.osd.get().map_or(0, |o| o.peers.pool.counters().epochs.current())
    }

    /// Serves `req` made by `cred` (no epoch hint).
    pub async fn handle(&self, cred: Cred, req: Request) -> Response {
        self.handle_hinted(cred, req, 0).await
    }

    /// A frame carried the epoch hint `hint`: a newer one makes the server fetch the map
    /// before its next request.
    pub fn note_epoch(&self, hint: u16) {
        if let Some(o) = self.osd.get() {
            o.peers.pool.counters().epochs.note_hint(hint);
        }
    }

    pub fn metrics(&self) -> &Metrics {
        self.osd.get().map_or(&self.idle_metrics, |o| o.engine.metrics())
    }

    /// Answers one request made by `cred`, from a frame that carried the epoch hint `hint`
    /// (0: none).
    pub async fn handle_hinted(&self, cred: Cred, req: Request, hint: u16) -> Response {
        if let Some(m) = &self.member {
            match req {
                Request::GroupStatus => {
                    return Ok(Reply::Group(m.info(self.osd.get().is_some() && m.group.is_leader())))
                }
                Request::GroupDigest => return m.digest().await,
                _ => {}
            }
            if self.osd.get().is_none() || !self.confirmed(m).await {
                return Ok(Reply::Redirect { leader: m.leader_address() });
            }
            if let Request::GroupReplace { remove, add, raft, client } = req {
                tracing::info!(remove, add, %raft, %client, "replacing a member");
                let node = plusfs_replica::Node::new(raft, client);
                return match m.group.replace(remove, add, node, REPLACE_WAIT).await {
                    Ok(()) => Ok(Reply::Done),
                    Err(e) => {
                        Err(WireError::new(plusfs_proto::Errno::EIO, format!("cannot replace member {remove}: {e}")))
                    }
                };
            }
        }
        match (self.osd.get(), req) {
            (Some(osd), Request::Once { client, seq, op }) => match &self.member {
                Some(m) => crate::once::handle(osd, (&m.store, &m.running), cred, (client, seq), *op, hint).await,
                None => osd.handle_from(cred, *op, hint).await,
            },
            (Some(osd), req) => osd.handle_from(cred, req, hint).await,
            (None, _) => Ok(Reply::Redirect { leader: None }),
        }
    }

    /// Whether this member may serve now: its lease holds, or a read-index round confirms
    /// it still leads.
    async fn confirmed(&self, m: &Member) -> bool {
        if m.lease_holds() {
            return true;
        }
        matches!(tokio::time::timeout(BARRIER_WAIT, m.group.read_barrier()).await, Ok(Ok(())))
    }
}
