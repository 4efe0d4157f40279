//! Cluster map and placement.
//!
//! A [`ClusterMap`] lists the servers (id, address, weight) and has an epoch. The home
//! server of a directory object is `straw2(hash(full path))` (seed 000 §2.3, Eq. 1): every
//! client computes it locally and reaches any directory in one hop. straw2 is CRUSH's bucket
//! choice: each server draws `ln(u) / weight` from a hash of (key, server id) and the
//! longest straw wins, so adding a server moves only the keys it now wins (about 1/N).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

mod change;
pub use change::{MapChange, Migration};

/// One server of the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerEntry {
    /// Stable identifier; never reused for another server.
    pub id: u32,
    /// `host:port` the server listens on.
    pub address: String,
    /// Relative share of directory objects (default 1.0).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// The members of this server slot's replica group (none: one unreplicated server at
    /// `address`). Whichever member leads serves the slot; the others redirect to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberEntry>,
    /// `host:port` where the server serves Prometheus metrics over HTTP (`/metrics`), if
    /// it does (replicated slots: each member's own, in `members`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

/// One member of a replicated server slot (`[[servers.members]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberEntry {
    /// Member id within its group (stable; never reused for another member).
    pub id: u64,
    /// `host:port` where the member serves clients and peers (when it leads).
    pub address: String,
    /// `host:port` where the member exchanges Raft messages with the other members.
    pub raft: String,
    /// `host:port` where the member serves Prometheus metrics, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

impl ServerEntry {
    /// An unreplicated server.
    pub fn new(id: u32, address: String, weight: f64) -> ServerEntry {
        ServerEntry { id, address, weight, members: Vec::new(), metrics: None }
    }

    /// The addresses a client may find this slot at: its members' (the leader among them),
    /// or its one address.
    pub fn addresses(&self) -> Vec<String> {
        if self.members.is_empty() {
            vec![self.address.clone()]
        } else {
            self.members.iter().map(|m| m.address.clone()).collect()
        }
    }

    fn member_address_is_foreign(&self) -> bool {
        !self.members.iter().any(|m| m.address == self.address)
    }

    /// The member with id `id`.
    pub fn member(&self, id: u64) -> Option<&MemberEntry> {
        self.members.iter().find(|m| m.id == id)
    }
}

fn default_weight() -> f64 {
    1.0
}

/// Durability of acknowledged operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// The write-ahead log is written before the reply: survives a process crash (default).
    #[default]
    Os,
    /// The write-ahead log is also fsynced (group commit): survives a machine crash.
    Always,
}

/// A huge-directory threshold as written in the map: a number of entries or `"never"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ThresholdSetting {
    Entries(u64),
    Word(String),
}

/// Huge-directory settings of the cluster (`[hugedirs]`, seed 001 §IV).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugedirSettings {
    /// Entries above which a directory is distributed (default 8,000), `0` to distribute
    /// every directory from its first entry, `"never"` to keep every directory on one
    /// server. Directories can override it.
    #[serde(default = "default_threshold")]
    pub threshold: ThresholdSetting,
    /// Storing servers of a distributed directory (default 0: all servers).
    #[serde(default)]
    pub width: u32,
}

fn default_threshold() -> ThresholdSetting {
    ThresholdSetting::Entries(8000)
}

impl Default for HugedirSettings {
    fn default() -> Self {
        HugedirSettings { threshold: default_threshold(), width: 0 }
    }
}

impl HugedirSettings {
    /// The threshold in entries, `None` for never.
    pub fn threshold_entries(&self) -> Option<u64> {
        match &self.threshold {
            ThresholdSetting::Entries(n) => Some(*n),
            ThresholdSetting::Word(_) => None,
        }
    }
}

/// Where file data goes (`[data]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSettings {
    /// File bytes below this offset stay with the file's directory entry (default 1 MiB).
    #[serde(default = "default_small_file")]
    pub small_file_bytes: u64,
    /// Bytes beyond it go in chunks of this size, each placed by CRUSH over (inode, chunk
    /// index) (default 4 MiB).
    #[serde(default = "default_chunk")]
    pub chunk_bytes: u64,
    /// Free space each server keeps on its data file system: writes that would use it get
    /// ENOSPC, so the metadata store never runs out and compaction, which may use it,
    /// can always copy a segment's live data out (default 64 MiB; at least `segment_bytes`).
    #[serde(default = "default_reserve")]
    pub reserve_bytes: u64,
    /// Size at which a server's active data segment is sealed (default 64 MiB): the unit
    /// compaction copies and frees.
    #[serde(default = "default_segment")]
    pub segment_bytes: u64,
    /// Records of one segment at most this far apart are read with one system call by
    /// batch and range reads (seed 002's merged ORDER_LIST reads; default 256 KiB).
    #[serde(default = "default_merge_gap")]
    pub merge_gap_bytes: u64,
}

fn default_merge_gap() -> u64 {
    256 << 10
}

fn default_segment() -> u64 {
    64 << 20
}

fn default_reserve() -> u64 {
    64 << 20
}

fn default_small_file() -> u64 {
    1 << 20
}

fn default_chunk() -> u64 {
    4 << 20
}

impl Default for DataSettings {
    fn default() -> Self {
        DataSettings {
            small_file_bytes: default_small_file(),
            chunk_bytes: default_chunk(),
            reserve_bytes: default_reserve(),
            segment_bytes: default_segment(),
            merge_gap_bytes: default_merge_gap(),
        }
    }
}

/// How operations that change two servers are made atomic (`[txn] protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TxnProtocol {
    /// Cx (seed 004 §III): the client sends both sub-operations at once, each server
    /// executes and logs a Result record and answers; commitment comes later, in batches
    /// (default).
    #[default]
    Cx,
    /// Logged two-phase commit run by the server that receives the request.
    #[serde(rename = "2pc")]
    TwoPhase,
    /// OrangeFS-style serial execution (seed 004 Fig. 1(b)): the participant's
    /// sub-operation, then the coordinator's, a CLEAR if the second fails; no log, so a
    /// client crash in between leaves an orphan.
    Serial,
}

impl TxnProtocol {
    /// The name used in the map and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TxnProtocol::Cx => "cx",
            TxnProtocol::TwoPhase => "2pc",
            TxnProtocol::Serial => "serial",
        }
    }
}

/// A protocol name that is none of `cx`, `2pc` and `serial`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown protocol '{0}': give cx, 2pc or serial")]
pub struct UnknownProtocol(pub String);

impl std::str::FromStr for TxnProtocol {
    type Err = UnknownProtocol;
    fn from_str(s: &str) -> Result<Self, UnknownProtocol> {
        match s {
            "cx" => Ok(TxnProtocol::Cx),
            "2pc" => Ok(TxnProtocol::TwoPhase),
            "serial" => Ok(TxnProtocol::Serial),
            other => Err(UnknownProtocol(other.to_string())),
        }
    }
}

/// Cross-server operation settings (`[txn]`, seed 004 §III–§IV).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnSettings {
    /// Protocol of mkdir and rmdir (default `cx`); other cross-server operations use
    /// two-phase commit.
    #[serde(default)]
    pub protocol: TxnProtocol,
    /// Cx timeout trigger: a coordinator commits its pending operations at least this
    /// often (default 1000 ms).
    #[serde(default = "default_commit_timeout")]
    pub commit_timeout_ms: u64,
    /// Cx threshold trigger: ... or as soon as this many are pending (default 512).
    #[serde(default = "default_commit_threshold")]
    pub commit_threshold: u32,
    /// Cx log limit per server: live Result and decision records at most this many bytes;
    /// new sub-operations wait (and pending ones are committed at once) when it is full
    /// (default 16 MiB).
    #[serde(default = "default_max_log")]
    pub max_log_bytes: u64,
}

fn default_commit_timeout() -> u64 {
    1000
}

fn default_commit_threshold() -> u32 {
    512
}

fn default_max_log() -> u64 {
    16 << 20
}

impl Default for TxnSettings {
    fn default() -> Self {
        TxnSettings {
            protocol: TxnProtocol::default(),
            commit_timeout_ms: default_commit_timeout(),
            commit_threshold: default_commit_threshold(),
            max_log_bytes: default_max_log(),
        }
    }
}

/// Mutual TLS (`[tls]`). Without `ca` connections are plain TCP and any peer may claim
/// any uid (`cluster up --insecure`). Relative paths are relative to the map's directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsSettings {
    /// The cluster CA's certificate (PEM), which every end checks its peer's against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The identity directory (`cert.pem`, `key.pem`) a client presents unless
    /// `PLUSFS_IDENTITY` names another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<PathBuf>,
    /// The identity directory servers present (to clients and to each other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_identity: Option<PathBuf>,
    /// Serial numbers (hex) of revoked certificates: servers refuse them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revoked: Vec<String>,
    /// Seconds a capability of client-direct I/O stays valid (default
    /// [`DEFAULT_CAPABILITY_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_secs: Option<u64>,
    /// Connections one user or node certificate may hold open to one server process at
    /// once (default [`DEFAULT_CONNS_PER_IDENTITY`]); admins and servers are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conns_per_identity: Option<u32>,
    /// Seconds a user, node or admin connection may stay without a request before the
    /// server closes it (default [`DEFAULT_IDLE_SECS`]); clients reopen a connection idle
    /// half as long before they use it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<u64>,
}

/// Seconds an idle client connection stays open unless `[tls] idle_secs` says otherwise.
pub const DEFAULT_IDLE_SECS: u64 = 600;

/// Connections one bounded certificate may hold to one server unless `[tls]
/// conns_per_identity` says otherwise: a machine's mount and its tools use a few per
/// server; a client that opens more is refused before it exhausts the server's descriptors.
pub const DEFAULT_CONNS_PER_IDENTITY: u32 = 256;

/// Seconds a capability of client-direct I/O stays valid unless `[tls] capability_secs`
/// says otherwise: long enough for any one request, short enough that a stolen one soon
/// stops working.
pub const DEFAULT_CAPABILITY_SECS: u64 = 60;

impl TlsSettings {
    /// Connections one bounded certificate may hold to one server.
    pub fn conns_per_identity(&self) -> u32 {
        self.conns_per_identity.unwrap_or(DEFAULT_CONNS_PER_IDENTITY).max(1)
    }

    /// How long a client connection may stay idle before the server closes it.
    pub fn idle_limit(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.idle_secs.unwrap_or(DEFAULT_IDLE_SECS).max(2))
    }

    /// Seconds a capability of client-direct I/O stays valid.
    pub fn capability_secs(&self) -> u64 {
        self.capability_secs.unwrap_or(DEFAULT_CAPABILITY_SECS).max(1)
    }

    /// True when connections are plain TCP.
    pub fn is_insecure(&self) -> bool {
        self.ca.is_none()
    }

    /// Makes relative paths relative to `base` (the map file's directory).
    fn resolve(&mut self, base: &Path) {
        for p in [&mut self.ca, &mut self.identity, &mut self.server_identity].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

/// Replica group settings (`[replication]`; only servers with `members` use them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationSettings {
    /// Leader heartbeat period in ms (default 100).
    #[serde(default = "default_heartbeat")]
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time between these (ms) stands for
    /// election (default 400–800). A leader serves reads without asking its followers
    /// for three quarters of the minimum after they last acknowledged it.
    #[serde(default = "default_election_min")]
    pub election_min_ms: u64,
    #[serde(default = "default_election_max")]
    pub election_max_ms: u64,
    /// Log entries after which a member snapshots its store (default 20,000); a member
    /// further behind than the log kept catches up from a snapshot.
    #[serde(default = "default_snapshot_every")]
    pub snapshot_every: u64,
    /// Members fsync their log before an entry counts (default true): an acknowledged
    /// change is on the disks of a majority. `false` keeps it in a majority's page caches
    /// only: it survives the crash or loss of a minority of machines, not a power loss of
    /// a majority at once.
    #[serde(default = "default_true")]
    pub fsync_log: bool,
}

fn default_heartbeat() -> u64 {
    100
}

fn default_election_min() -> u64 {
    400
}

fn default_election_max() -> u64 {
    800
}

fn default_snapshot_every() -> u64 {
    20_000
}

impl Default for ReplicationSettings {
    fn default() -> Self {
        ReplicationSettings {
            heartbeat_ms: default_heartbeat(),
            election_min_ms: default_election_min(),
            election_max_ms: default_election_max(),
            snapshot_every: default_snapshot_every(),
            fsync_log: true,
        }
    }
}

/// Directory delegation settings (`[delegations]`, `docs/semantics.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegSettings {
    /// Whether servers grant delegations at all (default true; clients ask only when
    /// configured to, as the mount does unless `-o nodeleg`).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// How long a recall waits for the holder before the delegation is revoked and its
    /// unflushed work refused (default 1000 ms).
    #[serde(default = "default_recall_timeout")]
    pub recall_timeout_ms: u64,
    /// Directories (or shards) with at most this many entries are granted with their
    /// whole entry set; larger ones with a 64-bit digest of each name, their entries
    /// learnt from the server when used (default 4096).
    #[serde(default = "default_deleg_entries")]
    pub max_entries: u64,
    /// Directories (or shards) with more entries are not delegated at all (default
    /// 1,500,000: the digests of a grant fit in one frame).
    #[serde(default = "default_deleg_names")]
    pub max_names: u64,
    /// A holder writes its queued changes back at most this long after the first of them
    /// (default 1000 ms).
    #[serde(default = "default_writeback")]
    pub writeback_ms: u64,
}

fn default_true() -> bool {
    true
}

fn default_recall_timeout() -> u64 {
    1000
}

fn default_deleg_entries() -> u64 {
    4096
}

fn default_deleg_names() -> u64 {
    1_500_000
}

fn default_writeback() -> u64 {
    1000
}

impl DelegSettings {
    /// How long a recall waits for the holder (at least 1 ms).
    pub fn recall_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.recall_timeout_ms.max(1))
    }

    /// How long queued changes may wait before they are written back.
    pub fn writeback(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.writeback_ms)
    }
}

impl Default for DelegSettings {
    fn default() -> Self {
        DelegSettings {
            enabled: true,
            recall_timeout_ms: default_recall_timeout(),
            max_entries: default_deleg_entries(),
            max_names: default_deleg_names(),
            writeback_ms: default_writeback(),
        }
    }
}

/// The pauses of one kind of server retry loop: the first, doubling up to the longest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffSetting {
    /// The first pause, in milliseconds.
    pub first_ms: u64,
    /// The longest pause, in milliseconds.
    pub max_ms: u64,
}

/// The pauses of the servers' retry loops (`[retry]`): each loop doubles its pause from
/// `first_ms` up to `max_ms`; when to give up stays each loop's own (its attempts, or a
/// deadline such as `txn.commit_timeout_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Deliveries that must get through: Cx decisions, aborts and urges, a shard handed to
    /// its storing server (default 50 ms up to 2 s).
    #[serde(default = "default_delivery")]
    pub delivery: BackoffSetting,
    /// A cross-server operation that lost to a conflicting one, tried again; each pause a
    /// random one up to the doubling one, so the two spread apart (default 4 ms up to 128 ms).
    #[serde(default = "default_conflict")]
    pub conflict: BackoffSetting,
    /// Asking a parent directory's home for its permissions while it is unreachable (a
    /// failover; default 50 ms up to 500 ms).
    #[serde(default = "default_parent")]
    pub parent: BackoffSetting,
}

fn default_delivery() -> BackoffSetting {
    BackoffSetting { first_ms: 50, max_ms: 2000 }
}
fn default_conflict() -> BackoffSetting {
    BackoffSetting { first_ms: 4, max_ms: 128 }
}
fn default_parent() -> BackoffSetting {
    BackoffSetting { first_ms: 50, max_ms: 500 }
}

impl Default for RetrySettings {
    fn default() -> RetrySettings {
        RetrySettings { delivery: default_delivery(), conflict: default_conflict(), parent: default_parent() }
    }
}

impl RetrySettings {
    fn validate(&self) -> Result<(), MapError> {
        for (name, b) in [("delivery", self.delivery), ("conflict", self.conflict), ("parent", self.parent)] {
            if b.first_ms == 0 || b.max_ms < b.first_ms || b.max_ms > 60_000 {
                return Err(MapError::Invalid(format!(
                    "retry.{name}: first_ms must be positive and max_ms between first_ms and 60000 (got {} and {})",
                    b.first_ms, b.max_ms
                )));
            }
        }
        Ok(())
    }
}

/// The pace of migration (`[rebalance]`): each server moves at most `objects_per_sec`
/// directory objects and `mib_per_sec` MiB of file data a second to their new homes, in
/// hand-overs of `batch` objects, so client work keeps most of the capacity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceSettings {
    #[serde(default = "default_objects_per_sec")]
    pub objects_per_sec: u32,
    #[serde(default = "default_mib_per_sec")]
    pub mib_per_sec: u32,
    #[serde(default = "default_rebalance_batch")]
    pub batch: u32,
}

fn default_objects_per_sec() -> u32 {
    1000
}
fn default_mib_per_sec() -> u32 {
    50
}
fn default_rebalance_batch() -> u32 {
    64
}

impl Default for RebalanceSettings {
    fn default() -> RebalanceSettings {
        RebalanceSettings {
            objects_per_sec: default_objects_per_sec(),
            mib_per_sec: default_mib_per_sec(),
            batch: default_rebalance_batch(),
        }
    }
}

/// The cluster map file (`cluster.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Incremented whenever the server list changes.
    pub epoch: u64,
    /// Durability setting every server of the cluster uses (default `os`).
    #[serde(default)]
    pub sync: SyncMode,
    /// Huge-directory settings.
    #[serde(default)]
    pub hugedirs: HugedirSettings,
    /// File-data placement settings.
    #[serde(default)]
    pub data: DataSettings,
    /// Cross-server operation settings.
    #[serde(default)]
    pub txn: TxnSettings,
    /// Directory delegation settings.
    #[serde(default)]
    pub delegations: DelegSettings,
    /// Replica group settings.
    #[serde(default)]
    pub replication: ReplicationSettings,
    /// Mutual TLS settings (none: plain TCP, an `--insecure` cluster).
    #[serde(default, skip_serializing_if = "TlsSettings::is_insecure")]
    pub tls: TlsSettings,
    /// How fast objects move to new homes after a change of the server set.
    #[serde(default)]
    pub rebalance: RebalanceSettings,
    /// The pauses of the servers' retry loops.
    #[serde(default)]
    pub retry: RetrySettings,
    pub servers: Vec<ServerEntry>,
    /// The move of objects to the homes this epoch gives them, while it lasts (none: every
    /// object is at its home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<Migration>,
    /// Ids of servers removed from the cluster (never given to another server).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<u32>,
    /// The server that keeps this map (the map service): server 0 until it is drained,
    /// then the lowest server of weight above 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keeper: u32,
}

fn is_zero(id: &u32) -> bool {
    *id == 0
}

/// Why a cluster map is unusable.
#[derive(Debug, Error)]
pub enum MapError {
    #[error("cannot read cluster map {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("cannot parse cluster map {path}: {source}")]
    Parse { path: String, source: toml::de::Error },
    #[error("cluster map is invalid: {0}")]
    Invalid(String),
}

impl ClusterMap {
    /// A map of `servers` at epoch 1 with every cluster setting at its default.
    pub fn with_servers(servers: Vec<ServerEntry>) -> ClusterMap {
        ClusterMap {
            epoch: 1,
            sync: SyncMode::default(),
            hugedirs: HugedirSettings::default(),
            data: DataSettings::default(),
            txn: TxnSettings::default(),
            delegations: DelegSettings::default(),
            replication: ReplicationSettings::default(),
            tls: TlsSettings::default(),
            rebalance: RebalanceSettings::default(),
            retry: RetrySettings::default(),
            keeper: servers.iter().map(|s| s.id).min().unwrap_or(0),
            servers,
            migration: None,
            retired: Vec::new(),
        }
    }

    /// Reads and validates a cluster map file.
    pub fn load(path: &Path) -> Result<ClusterMap, MapError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| MapError::Read { path: path.display().to_string(), source })?;
        let mut map: ClusterMap =
            toml::from_str(&text).map_err(|source| MapError::Parse { path: path.display().to_string(), source })?;
        map.validate()?;
        map.tls.resolve(path.parent().unwrap_or(Path::new(".")));
        Ok(map)
    }

    /// Parses and validates a map sent as TOML text (certificate paths left as given).
    pub fn from_toml(text: &str) -> Result<ClusterMap, MapError> {
        let map: ClusterMap =
            toml::from_str(text).map_err(|source| MapError::Parse { path: "(received map)".into(), source })?;
        map.validate()?;
        Ok(map)
    }

    /// The map as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("cluster map serialises")
    }

    /// Checks ids are unique, weights positive and the list non-empty.
    pub fn validate(&self) -> Result<(), MapError> {
        if self.servers.is_empty() {
            return Err(MapError::Invalid("no servers".into()));
        }
        let mut ids: Vec<u32> = self.servers.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(MapError::Invalid("duplicate server id".into()));
        }
        let mut addrs: Vec<&str> = self
            .servers
            .iter()
            .flat_map(|s| {
                let own = s.members.is_empty().then_some(s.address.as_str());
                let members = s.members.iter().flat_map(|m| [m.address.as_str(), m.raft.as_str()]);
                own.into_iter().chain(members)
            })
            .collect();
        addrs.sort_unstable();
        if let Some(w) = addrs.windows(2).find(|w| w[0] == w[1]) {
            return Err(MapError::Invalid(format!("two servers have the address {}", w[0])));
        }
        if ids.iter().any(|&id| id >= u16::MAX as u32) {
            return Err(MapError::Invalid("server ids must be below 65535".into()));
        }
        for s in &self.servers {
            let mut ids: Vec<u64> = s.members.iter().map(|m| m.id).collect();
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                return Err(MapError::Invalid(format!("server {} has two members with the same id", s.id)));
            }
            if !s.members.is_empty() && s.member_address_is_foreign() {
                return Err(MapError::Invalid(format!(
                    "server {}'s address {} is not one of its members' addresses",
                    s.id, s.address
                )));
            }
        }
        if let Some(s) = self.servers.iter().find(|s| !(s.weight >= 0.0 && s.weight.is_finite())) {
            return Err(MapError::Invalid(format!("server {} has weight {}", s.id, s.weight)));
        }
        if self.server(self.keeper).is_none() {
            return Err(MapError::Invalid(format!("the map service's server {} is not in the map", self.keeper)));
        }
        if !self.servers.iter().any(|s| s.weight > 0.0) {
            return Err(MapError::Invalid("every server has weight 0: nothing could be placed".into()));
        }
        if self.data.chunk_bytes == 0 || self.data.chunk_bytes > 64 << 20 {
            return Err(MapError::Invalid("data.chunk_bytes must be between 1 and 64 MiB".into()));
        }
        if self.data.segment_bytes < 1 << 20 || self.data.reserve_bytes < self.data.segment_bytes {
            return Err(MapError::Invalid(
                "data.segment_bytes must be at least 1 MiB and data.reserve_bytes at least data.segment_bytes \
                 (compaction on a full disk needs room for one segment's live data)"
                    .into(),
            ));
        }
        self.retry.validate()?;
        if self.txn.commit_timeout_ms == 0 || self.txn.commit_threshold == 0 {
            return Err(MapError::Invalid("txn.commit_timeout_ms and txn.commit_threshold must be positive".into()));
        }
        let r = &self.replication;
        if r.heartbeat_ms == 0 || r.election_min_ms <= r.heartbeat_ms * 2 || r.election_max_ms <= r.election_min_ms {
            return Err(MapError::Invalid(
                "replication: heartbeat_ms must be positive, election_min_ms above twice it, election_max_ms above \
                 election_min_ms"
                    .into(),
            ));
        }
        if r.snapshot_every < 100 {
            return Err(MapError::Invalid("replication.snapshot_every must be at least 100".into()));
        }
        let rb = &self.rebalance;
        if rb.objects_per_sec == 0 || rb.mib_per_sec == 0 || rb.batch == 0 || rb.batch > 1024 {
            return Err(MapError::Invalid(
                "rebalance: objects_per_sec and mib_per_sec must be positive, batch between 1 and 1024".into(),
            ));
        }
        if self.txn.max_log_bytes < 64 << 10 {
            return Err(MapError::Invalid("txn.max_log_bytes must be at least 64 KiB".into()));
        }
        if let ThresholdSetting::Word(w) = &self.hugedirs.threshold {
            if w != "never" {
                return Err(MapError::Invalid(format!(
                    "hugedirs.threshold is '{w}': give a number of entries or \"never\""
                )));
            }
        }
        Ok(())
    }

    /// The server entry with `id`.
    pub fn server(&self, id: u32) -> Option<&ServerEntry> {
        self.servers.iter().find(|s| s.id == id)
    }

    /// Home server of the directory object at `path` (Eq. 1).
    pub fn home_of_dir(&self, path: &str) -> u32 {
        straw2(&self.servers, path_hash(path))
    }

    /// While a migration runs: the home `path` had before this epoch, if it was another
    /// server than now (the server a new home takes the object from).
    pub fn previous_home_of_dir(&self, path: &str) -> Option<u32> {
        let m = self.migration.as_ref()?;
        let before = straw2(&m.before, path_hash(path));
        (before != self.home_of_dir(path)).then_some(before)
    }

    /// The server holding chunk `chunk` of the file with inode `ino` (CRUSH over the pair).
    pub fn chunk_server(&self, ino: u64, chunk: u64) -> u32 {
        straw2(&self.servers, chunk_key(ino, chunk))
    }

    /// While a migration runs: where chunk `chunk` of `ino` was placed before this epoch.
    pub fn previous_chunk_server(&self, ino: u64, chunk: u64) -> Option<u32> {
        self.migration.as_ref().map(|m| straw2(&m.before, chunk_key(ino, chunk)))
    }

    /// The storing set of a directory distributed while at `path`: the `width` servers
    /// (0 or more than the cluster has: all) with the longest straw2 straws for the path, in
    /// straw order, so different directories get different sets and orders.
    pub fn storing_set(&self, path: &str, width: u32) -> Vec<u32> {
        let key = path_hash(path);
        let mut ranked: Vec<(f64, u32)> =
            self.servers.iter().filter(|s| s.weight > 0.0).map(|s| (straw2_draw(key, s.id, s.weight), s.id)).collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let n = if width == 0 { ranked.len() } else { (width as usize).min(ranked.len()) };
        ranked.into_iter().take(n).map(|(_, id)| id).collect()
    }
}

fn chunk_key(ino: u64, chunk: u64) -> u64 {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&ino.to_le_bytes());
    key[8..].copy_from_slice(&chunk.to_le_bytes());
    xxh3_64(&key)
}

/// The placement hash of a full path name.
pub fn path_hash(path: &str) -> u64 {
    xxh3_64(path.as_bytes())
}

/// CRUSH straw2 choice of one server for `key`. Panics on an empty list.
pub fn straw2(servers: &[ServerEntry], key: u64) -> u32 {
    let mut best = (f64::NEG_INFINITY, u32::MAX);
    for s in servers {
        let draw = straw2_draw(key, s.id, s.weight);
        // Ties (practically impossible) go to the lower id, so every node agrees.
        if draw > best.0 || (draw == best.0 && s.id < best.1) {
            best = (draw, s.id);
        }
    }
    best.1
}

/// One server's straw: `ln(u) / weight` with `u` uniform in (0, 1] from the hash of
/// (key, id). `libm::log` gives identical bits on every platform, so all nodes agree.
fn straw2_draw(key: u64, id: u32, weight: f64) -> f64 {
    let h = xxh3_64_with_seed(&key.to_le_bytes(), id as u64) >> 11; // 53 bits
    let u = (h as f64 + 1.0) / (1u64 << 53) as f64;
    libm::log(u) / weight
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: u32) -> Vec<ServerEntry> {
        (0..n).map(|id| ServerEntry::new(id, format!("127.0.0.1:{}", 7000 + id), 1.0)).collect()
    }

    fn dirs() -> impl Iterator<Item = String> {
        (0..100_000).map(|i| format!("/proj/run{}/dir{}", i % 97, i))
    }

    #[test]
    fn balanced_within_ten_percent() {
        let s = servers(8);
        let mut count = [0u32; 8];
        for d in dirs() {
            count[straw2(&s, path_hash(&d)) as usize] += 1;
        }
        let mean = 100_000.0 / 8.0;
        for c in count {
            assert!((c as f64 - mean).abs() <= 0.10 * mean, "{count:?}");
        }
    }

    #[test]
    fn adding_a_server_moves_about_one_ninth() {
        let (s8, s9) = (servers(8), servers(9));
        let moved = dirs().filter(|d| straw2(&s8, path_hash(d)) != straw2(&s9, path_hash(d))).count();
        let ideal = 100_000.0 / 9.0;
        assert!(moved as f64 <= 1.25 * ideal, "moved {moved}, ideal {ideal}");
        // Every moved directory moved to the new server.
        assert!(dirs()
            .filter(|d| straw2(&s8, path_hash(d)) != straw2(&s9, path_hash(d)))
            .all(|d| straw2(&s9, path_hash(&d)) == 8));
    }

    #[test]
    fn weights_are_respected() {
        let mut s = servers(2);
        s[1].weight = 3.0;
        let n1 = dirs().filter(|d| straw2(&s, path_hash(d)) == 1).count();
        let share = n1 as f64 / 100_000.0;
        assert!((share - 0.75).abs() < 0.02, "share {share}");
    }

    #[test]
    fn map_roundtrip_and_validation() {
        let m = ClusterMap {
            epoch: 3,
            sync: SyncMode::Always,
            hugedirs: HugedirSettings::default(),
            data: DataSettings::default(),
            txn: TxnSettings::default(),
            delegations: DelegSettings::default(),
            replication: ReplicationSettings::default(),
            tls: TlsSettings::default(),
            rebalance: RebalanceSettings::default(),
            retry: RetrySettings::default(),
            servers: servers(3),
            migration: None,
            retired: Vec::new(),
            keeper: 0,
        };
        let text = m.to_toml();
        let back: ClusterMap = toml::from_str(&text).unwrap();
        assert_eq!(back, m);
        let bad = ClusterMap::with_servers(vec![]);
        assert!(bad.validate().is_err());
        let mut dup = m.clone();
        dup.servers[1].id = 0;
        assert!(dup.validate().is_err());
        let never: ClusterMap =
            toml::from_str("epoch = 1\n[hugedirs]\nthreshold = \"never\"\n[[servers]]\nid = 0\naddress = \"a:1\"\n")
                .unwrap();
        assert_eq!(never.hugedirs.threshold_entries(), None);
        let typo: ClusterMap =
            toml::from_str("epoch = 1\n[hugedirs]\nthreshold = \"nevr\"\n[[servers]]\nid = 0\naddress = \"a:1\"\n")
                .unwrap();
        assert!(typo.validate().is_err());
    }

    #[test]
    fn storing_sets_differ_between_directories() {
        let m = ClusterMap::with_servers(servers(8));
        let a = m.storing_set("/a", 4);
        assert_eq!(a.len(), 4);
        assert_eq!(m.storing_set("/a", 0).len(), 8);
        assert_eq!(m.storing_set("/a", 0)[..4], a[..]);
        let distinct: std::collections::HashSet<Vec<u32>> =
            (0..50).map(|i| m.storing_set(&format!("/d{i}"), 4)).collect();
        assert!(distinct.len() > 30, "{}", distinct.len());
        // The first server of the ranking is the directory's home.
        assert_eq!(m.storing_set("/a", 1)[0], m.home_of_dir("/a"));
    }
}
