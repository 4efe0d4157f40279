//! The directory-object store of one OSD+ server.
//!
//! [`DirStore`] is what the server needs from a store: directory objects by path, entries
//! by (directory inode, name), small metadata counters, and the two-phase-commit logs, all
//! changed through atomic [`Batch`]es. [`RocksStore`] is the RocksDB engine (the default).
//!
//! Key layout (one RocksDB column family; the first byte says what a key is):
//! ```text
//! D <path>                      -> DirObject   directory objects homed here
//! H <path>                      -> DirObject   shards of distributed directories stored here
//! E <dir ino: u64 BE> <name>    -> Inode       entries (embedded inodes, "h" entries)
//! M <name>                      -> u64 BE      counters (next inode, next txid)
//! C <txid: u64 BE>              -> bytes       coordinator log records
//! P <txid: u64 BE>              -> bytes       participant log records
//! X <id: u64 BE>                 -> bytes       Cx log records
//! L <id: u64 BE>                 -> bytes       directory delegations granted here
//! O <path hash: u64 BE>         -> bytes       migration outbox: objects handed to their new home
//! Y <path hash: u64 BE>         -> bytes       migration receipts: objects taken over here
//! K <id: u64 BE>                -> bytes       map service records (0: the cluster map)
//! R <record: u64 BE>            -> bytes       file-data records here (their extent, owner)
//! G <segment: u32 BE> <off: u64 BE> -> u64 BE  record at that place (compaction's index)
//! U <kind: u8> <id: u64 BE>     -> usage       quota usage counted here (see `usage`)
//! T <dir ino: u64 BE>           -> [u64]       quota trees of a directory with entries here
//! Z <0: u64 BE>                 -> bytes       the quotas (limits) of the cluster
//! ```
//! Entries are keyed by the directory's inode number, not its path, so listing a
//! directory is one prefix scan in name order and renaming a directory whose object stays
//! on this server rewrites one key. The same holds for the entries of a shard (a server's
//! part of a distributed directory): renaming a huge directory re-keys each shard record
//! and moves no entry.

pub mod mem;
pub mod record;
mod rocks;
pub mod usage;

pub use rocks::RocksStore;

use plusfs_proto::{DirObject, Ino, Inode, TxId};
use thiserror::Error;
use tokio::sync::oneshot;

/// A store failure. The server answers `EIO` and logs it.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store engine error: {0}")]
    Engine(String),
    /// The disk holding the store is full: the write was not made (the engine takes
    /// writes again once space returns).
    #[error("no space left on the store's disk: {0}")]
    NoSpace(String),
    #[error("corrupt record under key {key}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("store is shutting down")]
    Closed,
    /// The batch would take `owner`'s usage here `need` past its ceiling; `batch` is the
    /// batch, unapplied, to submit again once the ceiling is raised.
    #[error("the quota of {owner} needs {} more files and {} more bytes here", need.files, need.bytes)]
    OverQuota { owner: usage::Owner, need: usage::Usage, batch: Box<Batch> },
    /// A replicated store's group did not take the batch (this member does not lead it,
    /// or lost its quorum).
    #[error("replication: {0}")]
    Replica(String),
}

/// Which two-phase-commit log a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKind {
    Coordinator,
    Participant,
    /// Cx records (Result and coordinator decisions), keyed by a local id.
    Cx,
    /// Directory delegations granted here, keyed by delegation id.
    Deleg,
    /// Directory objects handed to their new home and not yet confirmed stored there,
    /// keyed by the path's hash (migration outbox).
    Outbox,
    /// Directory objects taken over from their old home during the running migration,
    /// keyed by the path's hash (so a late hand-over of the same object is not taken twice).
    Receipt,
    /// Cluster-wide records kept by the map service (id 0: the cluster map).
    Meta,
    /// Shards of distributed directories moving between storing servers (the giver's
    /// and the taker's side), keyed by the path's hash.
    ShardMove,
    /// Shared inodes a drained server moved to their heir, keyed by inode number.
    InodeMove,
    /// The quotas every server keeps (one record, id 0).
    Quota,
}

impl LogKind {
    fn prefix(self) -> u8 {
        match self {
            LogKind::Coordinator => b'C',
            LogKind::Participant => b'P',
            LogKind::Cx => b'X',
            LogKind::Deleg => b'L',
            LogKind::Outbox => b'O',
            LogKind::Receipt => b'Y',
            LogKind::Meta => b'K',
            LogKind::ShardMove => b'V',
            LogKind::InodeMove => b'W',
            LogKind::Quota => b'Z',
        }
    }
}

/// What the exactly-once table holds for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnceState {
    /// A batch of the request committed; its answer was not recorded (its leader died).
    Applied,
    /// Its answer (an encoded `Response`).
    Answered(Vec<u8>),
}

/// The value of an exactly-once record: a tag, the time in seconds since the epoch (for
/// expiry), and the encoded answer if any.
/// Framed as a record of format [`ONCE_VERSION`] (`record::frame`).
pub fn once_value(answer: Option<&[u8]>) -> Vec<u8> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut v = vec![u8::from(answer.is_some())];
    v.extend_from_slice(&now.to_be_bytes());
    v.extend_from_slice(answer.unwrap_or_default());
    record::frame(ONCE_VERSION, &v)
}

/// The format version of exactly-once records.
pub const ONCE_VERSION: u8 = 1;

/// An exactly-once record read back: what it holds and when it was written (seconds since
/// the epoch). Records of earlier builds (unframed, the same layout) are read as well.
pub fn decode_once(value: &[u8]) -> Result<(OnceState, u64), StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { key: "exactly-once record".into(), reason };
    let body = if record::is_framed(value) {
        match record::unframe(value).map_err(|e| corrupt(e.to_string()))? {
            (ONCE_VERSION, body) => body,
            (v, _) => return Err(corrupt(format!("format {v}: this plusfs reads format {ONCE_VERSION}"))),
        }
    } else {
        value
    };
    let time = body.get(1..9).map(|t| u64::from_be_bytes(t.try_into().expect("8 bytes")));
    match (body.first(), time) {
        (Some(0), Some(t)) => Ok((OnceState::Applied, t)),
        (Some(1), Some(t)) => Ok((OnceState::Answered(body[9..].to_vec()), t)),
        _ => Err(corrupt("bad tag or length".into())),
    }
}

/// One change inside a [`Batch`].
#[derive(Debug, Clone)]
pub enum BatchOp {
    PutDir(String, DirObject),
    DelDir(String),
    PutShard(String, DirObject),
    DelShard(String),
    PutEntry(Ino, String, Inode),
    DelEntry(Ino, String),
    PutInode(Inode),
    DelInode(Ino),
    PutCounter(&'static str, u64),
    PutLog(LogKind, TxId, Vec<u8>),
    DelLog(LogKind, TxId),
    PutRecord(u64, Vec<u8>),
    DelRecord(u64),
    PutSegRef(u32, u64, u64),
    DelSegRef(u32, u64),
    /// An exactly-once record (client, sequence, [`once_value`]).
    PutOnce(u64, u64, Vec<u8>),
    DelOnce(u64, u64),
    /// A quota usage counter (written by the store's accounting, see [`usage`]).
    PutUsage(usage::Owner, usage::Usage),
    DelUsage(usage::Owner),
    /// The quota trees of a directory whose entries are stored here (see [`usage`]).
    PutTrees(Ino, Vec<Ino>),
    DelTrees(Ino),
}

/// Changes applied atomically, in order (a later change of the same key wins).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub ops: Vec<BatchOp>,
    /// Refused (`StoreError::OverQuota`, nothing applied) if it would take a limited
    /// owner's usage here past its ceiling. Set by the operations a quota may refuse;
    /// the commit of a decided transaction never is.
    pub quota: bool,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }
    /// An empty batch that a quota may refuse (see [`Batch::quota`]).
    pub fn counted() -> Batch {
        Batch { quota: true, ..Batch::default() }
    }
    /// Appends the operations of `other` (applied after those already here).
    pub fn extend(&mut self, other: Batch) {
        self.ops.extend(other.ops);
    }
    pub fn put_dir(&mut self, path: &str, obj: &DirObject) {
        self.ops.push(BatchOp::PutDir(path.to_string(), obj.clone()));
    }
    pub fn del_dir(&mut self, path: &str) {
        self.ops.push(BatchOp::DelDir(path.to_string()));
    }
    pub fn put_shard(&mut self, path: &str, obj: &DirObject) {
        self.ops.push(BatchOp::PutShard(path.to_string(), obj.clone()));
    }
    pub fn del_shard(&mut self, path: &str) {
        self.ops.push(BatchOp::DelShard(path.to_string()));
    }
    pub fn put_entry(&mut self, dir: Ino, name: &str, inode: &Inode) {
        self.ops.push(BatchOp::PutEntry(dir, name.to_string(), inode.clone()));
    }
    pub fn del_entry(&mut self, dir: Ino, name: &str) {
        self.ops.push(BatchOp::DelEntry(dir, name.to_string()));
    }
    /// Writes the shared inode object of a hard-linked file (key: its inode number).
    pub fn put_inode(&mut self, inode: &Inode) {
        self.ops.push(BatchOp::PutInode(inode.clone()));
    }
    pub fn del_inode(&mut self, ino: Ino) {
        self.ops.push(BatchOp::DelInode(ino));
    }
    pub fn put_counter(&mut self, name: &'static str, value: u64) {
        self.ops.push(BatchOp::PutCounter(name, value));
    }
    pub fn put_log(&mut self, kind: LogKind, txid: TxId, record: Vec<u8>) {
        self.ops.push(BatchOp::PutLog(kind, txid, record));
    }
    pub fn del_log(&mut self, kind: LogKind, txid: TxId) {
        self.ops.push(BatchOp::DelLog(kind, txid));
    }
    pub fn put_record(&mut self, id: u64, value: Vec<u8>) {
        self.ops.push(BatchOp::PutRecord(id, value));
    }
    pub fn del_record(&mut self, id: u64) {
        self.ops.push(BatchOp::DelRecord(id));
    }
    pub fn put_seg_ref(&mut self, segment: u32, offset: u64, id: u64) {
        self.ops.push(BatchOp::PutSegRef(segment, offset, id));
    }
    pub fn del_seg_ref(&mut self, segment: u32, offset: u64) {
        self.ops.push(BatchOp::DelSegRef(segment, offset));
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Counters of store activity.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    /// Batches submitted (one per operation or transaction step).
    pub batches: u64,
    /// Engine write calls (one per group of batches).
    pub writes: u64,
    /// Write-ahead-log fsyncs.
    pub syncs: u64,
}

/// Completion of a submitted batch: resolves once the batch is durable per the sync mode.
pub type Commit = oneshot::Receiver<Result<(), StoreError>>;

/// Where a replicated store sends its write batches instead of writing them itself: the
/// batch in RocksDB's encoding, and the channel to answer once it is applied to this
/// store (by the replica group's state machine). Calls come in commit order, and a
/// replicator keeps it.
pub trait Replicator: Send + Sync + 'static {
    fn replicate(&self, batch: Vec<u8>, data: Vec<DataPiece>, done: oneshot::Sender<Result<(), StoreError>>);
    /// Whether a batch failed, so this store writes no more (its member lost its lead).
    fn has_failed(&self) -> bool {
        false
    }
}

/// Stored file data a replicated batch refers to: the bytes at `offset` of data segment
/// `segment`, exactly as the leader's data store holds them (record headers included), so
/// every member has them at the same place.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataPiece {
    pub segment: u32,
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// Where a replicated store finds the file data its batches refer to (the server's data
/// store): for every record a batch starts using (`PutSegRef`), its stored bytes.
pub trait DataSource: Send + Sync + 'static {
    fn pieces(&self, batch: &Batch) -> Result<Vec<DataPiece>, StoreError>;
}

/// The reads of a directory-object store: what every protocol of a server may use. Only
/// the server's engine holds the whole [`DirStore`] and so can write.
pub trait StoreRead: Send + Sync + 'static {
    /// The directory object at `path`, if it is homed here.
    fn get_dir(&self, path: &str) -> Result<Option<DirObject>, StoreError>;
    /// This server's shard of the distributed directory at `path`, if it stores one.
    fn get_shard(&self, path: &str) -> Result<Option<DirObject>, StoreError>;
    /// Every shard at or below `root`, in path order.
    fn shards_within(&self, root: &str) -> Result<Vec<(String, DirObject)>, StoreError>;
    /// Entry `name` of the directory with inode `dir`.
    fn get_entry(&self, dir: Ino, name: &str) -> Result<Option<Inode>, StoreError>;
    /// Entries `names` of the directory with inode `dir`, looked up together (one batched
    /// engine call), in the order of `names`.
    fn get_entries(&self, dir: Ino, names: &[&str]) -> Result<Vec<Option<Inode>>, StoreError>;
    /// Up to `limit` entries of `dir` whose names sort after `after`, in name order.
    fn list_entries(&self, dir: Ino, after: Option<&str>, limit: usize) -> Result<Vec<(String, Inode)>, StoreError>;
    /// Calls `f` with the name of every entry of `dir`, in name order, without decoding
    /// the entries (a delegation grant's name digests).
    fn entry_names(&self, dir: Ino, f: &mut dyn FnMut(&str)) -> Result<(), StoreError>;
    /// Every directory object at or below `root`, in path order.
    fn dirs_within(&self, root: &str) -> Result<Vec<(String, DirObject)>, StoreError>;
    /// Every entry held here, as (directory inode, name, inode); used by fsck.
    fn all_entries(&self) -> Result<Vec<(Ino, String, Inode)>, StoreError>;
    /// A counter stored with [`Batch::put_counter`].
    /// The shared inode object `ino` (a hard-linked file) held here.
    fn get_inode(&self, ino: Ino) -> Result<Option<Inode>, StoreError>;
    /// Every shared inode object held here.
    fn all_inodes(&self) -> Result<Vec<Inode>, StoreError>;
    fn get_counter(&self, name: &str) -> Result<Option<u64>, StoreError>;
    /// One log record.
    fn get_log(&self, kind: LogKind, txid: TxId) -> Result<Option<Vec<u8>>, StoreError>;
    /// Every record of one log, in txid order.
    fn log_records(&self, kind: LogKind) -> Result<Vec<(TxId, Vec<u8>)>, StoreError>;
    /// File-data records by id, looked up together, in the order of `ids`.
    fn get_records(&self, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
    /// The records stored in data segment `segment`: (offset, record id), by offset.
    fn seg_refs(&self, segment: u32) -> Result<Vec<(u64, u64)>, StoreError>;
    /// Number of file-data records held.
    fn record_count(&self) -> Result<u64, StoreError>;
    /// The quota usage counted here, by owner (see [`usage`]).
    fn usage(&self) -> Result<std::collections::BTreeMap<usage::Owner, usage::Usage>, StoreError>;
    /// The quota trees recorded for each directory whose entries are stored here.
    fn tree_records(&self) -> Result<std::collections::HashMap<Ino, Vec<Ino>>, StoreError>;
}

pub use usage::UsageMismatch;

/// What an OSD+ server needs from its directory-object store.
pub trait DirStore: StoreRead {
    /// Bytes of disk the store's own upkeep may need next (0 for a store that keeps
    /// nothing in memory and never rewrites its files): flushing what it holds in memory
    /// and its next compaction. Writes must leave that much free, or the upkeep runs out
    /// of space and the store stops taking writes (or stops reclaiming) until space returns.
    fn upkeep_room(&self) -> u64 {
        0
    }
    /// Gives the disk back the space of deleted objects now (flush and compact), instead
    /// of whenever the engine would, as far as `free` bytes of disk allow: called when the
    /// disk is nearly full.
    fn reclaim(&self, free: u64) -> Result<(), StoreError> {
        let _ = free;
        Ok(())
    }
    /// Applies `batch` atomically, with the quota usage it changes (see [`usage`]). The
    /// returned receiver resolves when it is durable.
    fn submit(&self, batch: Batch) -> Commit;
    /// The store's quota books (counters as submitted, ceilings): the methods below work
    /// on them, against this store's reads.
    fn books(&self) -> &parking_lot::Mutex<usage::Books>;
    /// This store as its reads.
    fn reads(&self) -> &dyn StoreRead;
    /// Recounts the quota usage of everything held here: the counters that disagree, and
    /// the batch that sets them (and the tree records) to the recount, to submit for a
    /// repair (its counter values are taken as they are, not counted). Writes wait.
    fn check_usage(&self) -> Result<(Vec<UsageMismatch>, Batch), StoreError> {
        let _writes_wait = self.books().lock();
        usage::check(self.reads())
    }
    /// The owners whose usage here is limited: a batch with `quota` set may take each only
    /// up to its ceiling. An owner new to the list starts with its usage as ceiling.
    fn limit(&self, owners: &[usage::Owner]) {
        if let Err(e) = self.books().lock().limit(owners, self.reads()) {
            tracing::error!(cause = %e, "quota counters cannot be read");
        }
    }
    /// Sets `owner`'s ceiling (if it is limited) to its usage, which it returns: the
    /// allowance above is given back.
    fn shrink(&self, owner: usage::Owner) -> Result<usage::Usage, StoreError> {
        self.books().lock().shrink(owner, self.reads())
    }
    /// Sets `owner`'s ceiling to `to` unless it was shrunk since [`DirStore::allowance`]
    /// answered `shrinks` (a master took allowance back meanwhile); true if it did.
    fn raise(&self, owner: usage::Owner, shrinks: u64, to: usage::Usage) -> bool {
        self.books().lock().raise(owner, shrinks, to)
    }
    /// `owner`'s usage and ceiling here, and how many times it was shrunk (`None`: not
    /// limited).
    fn allowance(&self, owner: usage::Owner) -> Result<Option<usage::Allowance>, StoreError> {
        self.books().lock().allowance(owner, self.reads())
    }
    /// The limited owners whose usage here passed their ceiling by a batch that may not
    /// be refused since the last call (their ceilings are raised to their usage).
    fn take_overdrawn(&self) -> Vec<usage::Owner> {
        self.books().lock().take_overdrawn()
    }
    /// How far `delta` more would take `owner` past its ceiling here (zero: it fits, or
    /// the owner is not limited).
    fn shortfall(&self, owner: usage::Owner, delta: usage::Usage) -> Result<usage::Usage, StoreError> {
        self.books().lock().shortfall(owner, delta, self.reads())
    }
    /// Activity counters.
    fn stats(&self) -> StoreStats;
    /// Latency histograms of the engine's writes, for a metrics registry (none by default).
    fn latency_histograms(&self) -> Vec<plusfs_metrics::prometheus::Histogram> {
        Vec::new()
    }
}

/// Submits `batch` and waits until it is durable.
pub async fn commit(store: &dyn DirStore, batch: Batch) -> Result<(), StoreError> {
    store.submit(batch).await.map_err(|_| StoreError::Closed)?
}

#[cfg(test)]
mod once_tests {
    use super::*;

    #[test]
    fn once_records_are_framed_and_earlier_ones_still_read() {
        let framed = once_value(Some(b"answer"));
        assert!(record::is_framed(&framed));
        assert!(matches!(decode_once(&framed), Ok((OnceState::Answered(a), _)) if a == b"answer"));
        // An earlier build's record: tag, time, answer, unframed.
        let mut legacy = vec![0u8];
        legacy.extend_from_slice(&77u64.to_be_bytes());
        assert!(matches!(decode_once(&legacy), Ok((OnceState::Applied, 77))));
        let mut flipped = framed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(decode_once(&flipped).is_err(), "a flipped byte is refused");
        assert!(decode_once(&[2, 0]).is_err());
    }
}
