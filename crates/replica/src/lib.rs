//! Replica groups: one server slot's store kept by R members on different hosts, in step
//! through Raft (the `openraft` library).
//!
//! What is replicated is the store's own write batches, as RocksDB encodes them: the
//! leader's engine hands each batch to [`Group::write`], which appends it to the group's
//! log; once a quorum holds it (fsynced), every member applies it to its copy of the store,
//! together with the log position it came from, in one atomic write. So each member's
//! store is always the state after some prefix of the log, and a member that restarts
//! replays the committed entries after the last one it applied.
//!
//! - [`log`]: the Raft log, vote and commit point in a RocksDB of their own.
//! - [`sm`]: the state machine: the member's store, and snapshots of it for members that
//!   join or fell too far behind.
//! - [`snapfile`]: a snapshot's data on disk, written and read record by record.
//! - [`net`]: Raft's messages between members, over TCP.
//! - [`check`]: members' stores compared (digests at the same log position).
//! - [`replicator`]: the bridge from a leader's store (`plusfs_store::Replicator`) to the
//!   group's log.
//!
//! A group is started with [`Group::start`]; the first start of a new group calls
//! [`Group::initialize`] on one member.

// openraft's storage traits return its `StorageError` (over 200 bytes); our helpers
// return the same type rather than box it and convert back at every trait method.
#![allow(clippy::result_large_err)]

pub mod check;
pub mod log;
pub mod net;
pub mod replicator;
pub mod sm;
pub mod snapfile;

use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
use openraft::{Config, ServerState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A member's id within its group (unique in the group, stable across restarts).
pub type MemberId = u64;

/// One log entry's command: one store write batch (RocksDB's encoding). A leader merges
/// every batch waiting at that moment into one (one log write and fsync on each member,
/// applied atomically).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Command {
    #[serde(with = "serde_bytes")]
    pub batch: Vec<u8>,
    /// The file data the batch refers to, as the leader stored it: the other members
    /// place it in their data stores at the same segments and offsets (see [`DataSink`]).
    #[serde(default)]
    pub data: Vec<plusfs_store::DataPiece>,
}

/// A member's data store as its state machine sees it: where entries' file data is placed
/// and where a snapshot finds the file data of the store it copies.
pub trait DataSink: Send + Sync + 'static {
    /// Writes `pieces`, the file data of an entry that member `proposer` proposed as
    /// leader in `term`, at their segments and offsets (durably if the cluster syncs).
    /// A member that proposed the entry in its current reign has them already and may
    /// skip them; after a restart it must not (its own appends may not have survived).
    /// Snapshots' data comes with `proposer` `None`.
    fn place(&self, pieces: &[plusfs_store::DataPiece], proposer: Option<(MemberId, u64)>) -> Result<(), SinkError>;
    /// Hands `each` the stored bytes of every record the member's store refers to, one
    /// record at a time (for a snapshot taken now, between two applies); stops at the
    /// first error.
    fn gather(&self, each: &mut dyn FnMut(plusfs_store::DataPiece) -> Result<(), SinkError>) -> Result<(), SinkError>;
}

/// A data store's own error, as its [`DataSink`] reports it (the sink's implementation
/// decides its types; the group logs and returns it).
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Why a snapshot's data file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Writing the file failed.
    #[error("cannot write the snapshot {path}: {source}")]
    Write { path: std::path::PathBuf, source: std::io::Error },
    /// Reading the store failed (or making it durable first).
    #[error("cannot read the store for a snapshot: {0}")]
    Store(#[from] rocksdb::Error),
    /// The data store could not hand over its records.
    #[error("cannot gather file data for a snapshot: {0}")]
    Data(SinkError),
    /// The builder was asked for a second snapshot.
    #[error("snapshot already built")]
    Built,
}

/// A member as its group knows it: where its Raft messages go, and where it serves
/// clients once it leads (what a member names in a redirect). Kept in the group's
/// membership, so a member added later is found by clients that never saw it in a map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub raft: String,
    pub client: String,
}

impl Node {
    pub fn new(raft: impl Into<String>, client: impl Into<String>) -> Node {
        Node { raft: raft.into(), client: client.into() }
    }
}

/// Nodes of members that serve no clients (tests, benchmarks): Raft addresses only.
pub fn raft_nodes(addrs: &BTreeMap<MemberId, String>) -> BTreeMap<MemberId, Node> {
    addrs.iter().map(|(id, a)| (*id, Node::new(a.clone(), ""))).collect()
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (clients at {})", self.raft, self.client)
    }
}

/// What applying an entry answers (nothing: a batch either applies or the member stops).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied;

openraft::declare_raft_types!(
    /// The group's Raft types.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = MemberId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The group's Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;

/// Errors of a group operation.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// A member's stores could not be opened or read.
    #[error("cannot start the replica: {0}")]
    Open(#[from] StoreOpenError),
    /// This member is not the leader; the leader's id and address if known.
    #[error("not the group's leader (leader: {0:?})")]
    NotLeader(Option<(MemberId, String)>),
    /// The member stopped (a storage error, or shut down).
    #[error("the replica stopped: {0}")]
    Stopped(String),
    /// Opening the member's stores or its listener failed.
    #[error("cannot start the replica: {0}")]
    Start(String),
}

/// Why a member's log, state or snapshot directory cannot be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreOpenError {
    #[error("{what}: {source}")]
    Rocks { what: String, source: rocksdb::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("bad {what}: {source}")]
    Decode { what: String, source: postcard::Error },
    #[error("{0}")]
    Snapshot(String),
}

impl StoreOpenError {
    fn rocks(what: impl Into<String>) -> impl FnOnce(rocksdb::Error) -> StoreOpenError {
        let what = what.into();
        move |source| StoreOpenError::Rocks { what, source }
    }

    fn decode(what: impl Into<String>) -> impl FnOnce(postcard::Error) -> StoreOpenError {
        let what = what.into();
        move |source| StoreOpenError::Decode { what, source }
    }
}

/// Bytes of a snapshot sent per message.
const SNAPSHOT_CHUNK: u64 = 4 << 20;

/// Timing of a group (defaults suit a LAN and a loaded two-core test machine).
#[derive(Debug, Clone)]
pub struct Timing {
    /// Leader heartbeat period; also Raft's AppendEntries timeout.
    pub heartbeat: Duration,
    /// A follower that hears nothing for a random time in this range stands for election
    /// (followers refuse to vote for the range's maximum after they last heard a leader).
    pub election: (Duration, Duration),
    /// Log entries after which a snapshot is taken.
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot, for followers only a little behind.
    pub keep_behind_snapshot: u64,
    /// Log appends are fsynced before they count (default); without, an acknowledged
    /// write is in a quorum's page caches only.
    pub fsync_log: bool,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat: Duration::from_millis(100),
            election: (Duration::from_millis(400), Duration::from_millis(800)),
            snapshot_every: 20_000,
            keep_behind_snapshot: 5_000,
            fsync_log: true,
        }
    }
}

impl Timing {
    fn config(&self) -> Result<Config, GroupError> {
        let c = Config {
            cluster_name: "plusfs".into(),
            heartbeat_interval: self.heartbeat.as_millis() as u64,
            election_timeout_min: self.election.0.as_millis() as u64,
            election_timeout_max: self.election.1.as_millis() as u64,
            install_snapshot_timeout: 10_000,
            // Snapshots travel in chunks of this size, read from and written to files.
            snapshot_max_chunk_size: SNAPSHOT_CHUNK,
            // With `net::APPEND_BUDGET`, an AppendEntries fits the heartbeat (its timeout).
            max_payload_entries: 64,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.keep_behind_snapshot,
            ..Default::default()
        };
        c.validate().map_err(|e| GroupError::Start(e.to_string()))
    }
}

/// One member of a replica group, running.
pub struct Group {
    /// The member's id.
    pub id: MemberId,
    raft: Raft,
    sm_db: Arc<rocksdb::DB>,
    server: tokio::task::JoinHandle<()>,
    /// When a quorum last acknowledged this member as leader (see [`Group::quorum_acked_within`]).
    acked: Arc<AckClock>,
    watcher: tokio::task::JoinHandle<()>,
    /// Whether the member's disk has room for entries (see [`Group::set_room`]).
    room: Arc<std::sync::atomic::AtomicBool>,
}

/// The instant of the last quorum acknowledgement of this member as leader, as openraft's
/// metrics report it (nanoseconds after `base`; 0: none, or not leading).
struct AckClock {
    base: std::time::Instant,
    at: std::sync::atomic::AtomicU64,
}

impl AckClock {
    /// Follows the metrics: every report gives the time since the acknowledgement; the
    /// instant computed from it is, if anything, later than the true one by the delay of
    /// this task's wake-up, which the lease's margin (see `quorum_acked_within`) covers.
    ///
    /// While the member leads, reports come at least every heartbeat. A longer gap since
    /// the last one means this process (or its Raft core) was paused, and the report that
    /// ends it may be stale: it is not trusted, and the lease waits for the next.
    async fn follow(
        self: Arc<Self>,
        mut rx: tokio::sync::watch::Receiver<openraft::metrics::RaftDataMetrics<MemberId>>,
        pause: Duration,
    ) {
        use std::sync::atomic::Ordering;
        let mut last_wake = self.base.elapsed();
        while rx.changed().await.is_ok() {
            let now = self.base.elapsed();
            let paused = now.saturating_sub(last_wake) > pause;
            last_wake = now;
            let since = rx.borrow().millis_since_quorum_ack.filter(|_| !paused);
            let at =
                since.and_then(|ms| now.checked_sub(Duration::from_millis(ms))).map_or(0, |d| d.as_nanos() as u64 + 1);
            self.at.store(at, Ordering::Release);
        }
        self.at.store(0, Ordering::Release);
    }
}

impl Group {
    /// Starts member `id`: its log under `dir/log`, its store `store` (the state machine)
    /// and its file data `data` (if the store refers to any), serving Raft messages on
    /// `listener`.
    pub async fn start(
        id: MemberId,
        dir: &Path,
        store: Arc<rocksdb::DB>,
        data: Option<Arc<dyn DataSink>>,
        listener: tokio::net::TcpListener,
        timing: &Timing,
    ) -> Result<Group, GroupError> {
        Group::start_with(id, dir, (store, data), listener, timing, None).await
    }

    /// [`Group::start`], its Raft messages over TLS with `tls` (none: plain TCP).
    pub async fn start_with(
        id: MemberId,
        dir: &Path,
        (store, data): (Arc<rocksdb::DB>, Option<Arc<dyn DataSink>>),
        listener: tokio::net::TcpListener,
        timing: &Timing,
        tls: Option<net::RaftTls>,
    ) -> Result<Group, GroupError> {
        let config = Arc::new(timing.config()?);
        let log = log::LogStore::open(&dir.join("log"), timing.fsync_log)?;
        let sm = sm::StateMachine::open(store.clone(), data, &dir.join("snapshot"))?;
        let server_tls = tls.as_ref().map(|t| t.server.clone());
        let raft = Raft::new(id, config, net::Network::new(tls), log, sm)
            .await
            .map_err(|e| GroupError::Start(e.to_string()))?;
        let room = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let server = tokio::spawn(net::serve(listener, raft.clone(), server_tls, room.clone()));
        let acked = Arc::new(AckClock { base: std::time::Instant::now(), at: Default::default() });
        // Three heartbeats without a report: a pause.
        let watcher = tokio::spawn(acked.clone().follow(raft.data_metrics(), timing.heartbeat * 3));
        Ok(Group { id, raft, sm_db: store, server, acked, watcher, room })
    }

    /// Says whether this member's disk has room for the group's entries. While it has
    /// not, the member refuses entries and snapshot chunks (their connection closes and
    /// the leader tries again later), still answers heartbeats, and does not stand for
    /// election: no write of its log or store fails part way (a store that runs out stops,
    /// and some RocksDB builds abort on the next sync), and the group goes on with the
    /// others. A leader that loses its room is to step down as well (its caller's part).
    pub fn set_room(&self, room: bool) {
        let was = self.room.swap(room, std::sync::atomic::Ordering::AcqRel);
        self.raft.runtime_config().elect(room);
        if was != room {
            match room {
                true => {
                    tracing::info!(member = self.id, "disk has room again: taking entries and standing for election")
                }
                false => tracing::warn!(member = self.id, "disk full: refusing entries and not standing for election"),
            }
        }
    }

    /// Makes a new group of `members`. Call once, on one member, when the group is first
    /// created; a group that already has members answers `Ok` and stays as it is.
    pub async fn initialize(&self, members: &BTreeMap<MemberId, Node>) -> Result<(), GroupError> {
        match self.raft.initialize(members.clone()).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(GroupError::Start(e.to_string())),
        }
    }

    /// Appends `batch` to the group's log and returns once this member (the leader) has
    /// applied it: a quorum holds it durably.
    pub async fn write(&self, batch: Vec<u8>) -> Result<(), GroupError> {
        match self.raft.client_write(Command { batch, data: Vec::new() }).await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(not_leader(f)),
            Err(e) => Err(GroupError::Stopped(e.to_string())),
        }
    }

    /// Waits until this member may serve a linearizable read: it is the leader, a quorum
    /// still says so, and it has applied everything committed before the call.
    pub async fn read_barrier(&self) -> Result<(), GroupError> {
        use openraft::error::CheckIsLeaderError;
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => Err(not_leader(f)),
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q))) => {
                Err(GroupError::NotLeader(None)).inspect_err(|_| tracing::debug!(?q, "no quorum for a read"))
            }
            Err(e) => Err(GroupError::Stopped(e.to_string())),
        }
    }

    /// Waits up to `limit` for this member to have applied the log up to `index`.
    pub async fn wait_applied(&self, index: u64, limit: Duration) -> bool {
        self.raft.wait(Some(limit)).applied_index_at_least(Some(index), "applied").await.is_ok()
    }

    /// The member's view of its group.
    pub fn status(&self) -> GroupStatus {
        let m = self.raft.metrics().borrow().clone();
        let last_log = m.last_log_index;
        let lag = m.replication.as_ref().map(|r| {
            r.iter()
                .map(|(id, matched)| (*id, last_log.unwrap_or(0).saturating_sub(matched.map_or(0, |l| l.index))))
                .collect()
        });
        GroupStatus {
            id: m.id,
            state: format!("{:?}", m.state).to_lowercase(),
            leader: m.current_leader,
            term: m.current_term,
            last_log,
            applied: m.last_applied.map(|l| l.index),
            voters: m.membership_config.membership().voter_ids().collect(),
            learners: m.membership_config.membership().learner_ids().collect(),
            lag,
        }
    }

    /// Whether this member leads and a quorum acknowledged it less than `d` ago. With `d`
    /// below the election timeout's minimum, no other member can have been elected since
    /// (a follower refuses votes for the maximum election timeout after it last heard from
    /// its leader), so the member may serve reads from its own store: a leader lease.
    pub fn quorum_acked_within(&self, d: Duration) -> bool {
        let at = self.acked.at.load(std::sync::atomic::Ordering::Acquire);
        if at == 0 {
            return false;
        }
        let now = self.acked.base.elapsed().as_nanos() as u64;
        now.saturating_sub(at - 1) < d.as_nanos() as u64 && self.is_leader()
    }

    /// Waits until this member no longer leads in `term`: it stepped down, saw a higher
    /// term, or no quorum acknowledged it for `silence` (it may be cut off from the
    /// others: it can no longer commit, so it stops serving). Returns why.
    pub async fn deposed(&self, term: u64, silence: Duration) -> String {
        let mut rx = self.raft.metrics();
        loop {
            {
                let m = rx.borrow_and_update();
                if m.state != ServerState::Leader || m.current_term != term {
                    return format!("now {:?} in term {}", m.state, m.current_term).to_lowercase();
                }
            }
            if !self.quorum_acked_within(silence) && self.acked.at.load(std::sync::atomic::Ordering::Acquire) != 0 {
                return format!("no quorum acknowledged it for {} ms", silence.as_millis());
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return "the replica stopped".into() },
                _ = tokio::time::sleep(silence / 4) => {}
            }
        }
    }

    /// The client address of the leader this member knows of, from the group's
    /// membership (empty if the member was added without one).
    pub fn leader_client(&self) -> Option<(MemberId, String)> {
        let rx = self.raft.metrics();
        let m = rx.borrow();
        let leader = m.current_leader?;
        let client = m.membership_config.membership().get_node(&leader)?.client.clone();
        Some((leader, client))
    }

    /// Replaces member `remove` by the new member `add` (`node`): `add` joins as a
    /// learner and catches up (from a snapshot if the log it needs is gone), then the
    /// voters become the old ones without `remove` and with `add`. Call on the leader.
    /// A learner that has not caught up within `wait` is removed again and the call fails.
    /// Asking again once it happened (`remove` gone, `add` a voter) is harmless; asking to
    /// remove a member that is not a voter otherwise fails.
    pub async fn replace(&self, remove: MemberId, add: MemberId, node: Node, wait: Duration) -> Result<(), GroupError> {
        let fail = |e: String| GroupError::Stopped(e);
        let voters = || -> std::collections::BTreeSet<MemberId> {
            self.raft.metrics().borrow().membership_config.membership().voter_ids().collect()
        };
        let now = voters();
        if !now.contains(&remove) {
            return match now.contains(&add) {
                true => Ok(()),
                false => Err(fail(format!("member {remove} is not a voter of the group"))),
            };
        }
        match tokio::time::timeout(wait, self.raft.add_learner(add, node, true)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(fail(format!("adding member {add}: {e}"))),
            Err(_) => {
                let gone = openraft::ChangeMembers::RemoveNodes([add].into());
                let _ = self.raft.change_membership(gone, false).await;
                return Err(fail(format!(
                    "member {add} did not catch up within {} s; it was removed again",
                    wait.as_secs()
                )));
            }
        }
        let mut target = voters();
        target.remove(&remove);
        target.insert(add);
        self.raft.change_membership(target, false).await.map_err(|e| fail(format!("changing the voters: {e}")))?;
        Ok(())
    }

    /// Returns once this member leads its group.
    pub async fn until_leader(&self) {
        let mut rx = self.raft.metrics();
        while rx.borrow_and_update().state != ServerState::Leader {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether this member leads its group now.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// The store this member applies to.
    pub fn store(&self) -> &Arc<rocksdb::DB> {
        &self.sm_db
    }

    /// A bridge that makes a store (this member's, when it leads) write through the group.
    pub fn replicator(&self) -> replicator::StoreReplicator {
        replicator::StoreReplicator::new(self.raft.clone())
    }

    /// The Raft handle (membership changes, snapshots, metrics).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Stops the member in place (also while others hold it): no more messages served or
    /// sent, and writes waiting for a commit fail. Its stores stay as they are.
    pub async fn halt(&self) {
        self.server.abort();
        self.watcher.abort();
        let _ = self.raft.shutdown().await;
    }

    /// Stops the member: no more messages served or sent. Its stores stay as they are.
    pub async fn stop(self) {
        self.server.abort();
        self.watcher.abort();
        let _ = self.raft.shutdown().await;
    }
}

fn not_leader(f: ForwardToLeader<MemberId, Node>) -> GroupError {
    GroupError::NotLeader(f.leader_id.zip(f.leader_node.map(|n| n.raft)))
}

/// A member's view of its group (`cluster status`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupStatus {
    pub id: MemberId,
    /// leader, follower, candidate, learner or shutdown.
    pub state: String,
    pub leader: Option<MemberId>,
    pub term: u64,
    pub last_log: Option<u64>,
    pub applied: Option<u64>,
    pub voters: Vec<MemberId>,
    pub learners: Vec<MemberId>,
    /// On the leader: entries each other member is behind.
    pub lag: Option<BTreeMap<MemberId, u64>>,
}
