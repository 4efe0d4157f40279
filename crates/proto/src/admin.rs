//! Administration: a server's status counters and its fsck scan.

use crate::hugedir::DistReport;
use crate::ids::{Ino, ServerId};
use serde::{Deserialize, Serialize};

/// Counters of one server, as `plusfs cluster status` prints them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ServerStatus {
    pub id: ServerId,
    pub epoch: u64,
    pub dir_objects: u64,
    pub entries: u64,
    /// Operations served, by operation name.
    pub ops: Vec<(String, u64)>,
    pub msgs_in: u64,
    pub msgs_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Store batches submitted, engine writes, and WAL fsyncs: with group commit one
    /// write and one fsync serve several batches.
    pub store_batches: u64,
    pub store_writes: u64,
    pub store_syncs: u64,
    /// Two-phase-commit transactions started as coordinator, and not yet finished.
    pub tx_started: u64,
    pub tx_pending: u64,
    /// Distributed (or distributing) directories whose primary object is here; the
    /// per-server entry counts are this server's view (see `shards`).
    pub hugedirs: Vec<DistReport>,
    /// Shards held here: directory path and entries.
    pub shards: Vec<(String, u64)>,
    /// File-data records held, data segments and their bytes.
    pub data_records: u64,
    pub data_segments: u64,
    pub data_bytes: u64,
    /// Data-store I/O since start: append calls (one write each), read calls, bytes read
    /// and written, and read calls by size (≤4 KiB, ≤64 KiB, ≤256 KiB, ≤1 MiB, more).
    pub data_appends: u64,
    pub data_reads: u64,
    pub data_bytes_read: u64,
    pub data_bytes_written: u64,
    pub data_read_sizes: Vec<u64>,
    /// Cx: sub-operations executed (YES), operations committed and aborted here as
    /// coordinator, commitment rounds (each one VOTE and one decision message per
    /// participant), operations committed at once (conflict, L-COM, full log), participant
    /// results invalidated, operations pending now, live log bytes now and at most.
    pub cx_executed: u64,
    pub cx_committed: u64,
    pub cx_aborted: u64,
    pub cx_rounds: u64,
    pub cx_immediate: u64,
    pub cx_invalidated: u64,
    pub cx_pending: u64,
    pub cx_log_bytes: u64,
    pub cx_log_peak: u64,
    /// Directory delegations granted and live now; recalls asked for, delegations revoked
    /// (holder did not answer in time), flushes applied.
    pub delegations: u64,
    pub deleg_recalls: u64,
    pub deleg_revoked: u64,
    pub deleg_flushes: u64,
    /// Shared inodes (of hard-linked files) held here.
    pub inodes: u64,
    /// Bytes of the file-data records files use here (`data_bytes` less what compaction
    /// would reclaim).
    pub data_live_bytes: u64,
    /// The server's weight in the map it works with, in thousandths.
    pub weight_milli: u64,
    /// Whether the map it works with moves objects to new homes.
    pub migrating: bool,
    /// This server's part of the running migration, if one runs.
    pub migration: Option<MigrationReport>,
    /// Requests this server forwarded to their directory's home under a newer epoch.
    pub forwarded: u64,
    /// The quotas kept, each with this server's share of its owner's usage.
    pub quotas: Vec<(crate::quota::QuotaDef, crate::quota::Usage)>,
}

/// One server's part of a migration (`cluster status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MigrationReport {
    /// The epoch objects move away from.
    pub from_epoch: u64,
    /// Directory objects handed over to new homes, and taken over from old homes.
    pub objects_moved: u64,
    pub objects_taken: u64,
    /// Entries that came with the objects taken over.
    pub entries_taken: u64,
    /// File-data bytes moved to other servers.
    pub bytes_moved: u64,
    /// Objects and file-data bytes still to move away from here (last count).
    pub objects_left: u64,
    pub bytes_left: u64,
    /// Milliseconds since this server's walker started on the migration.
    pub millis: u64,
}

/// Everything `fsck` needs from one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FsckData {
    /// Directory objects held: path, inode number.
    pub dirs: Vec<(String, Ino)>,
    /// Subdirectory entries held: parent inode, name, child inode.
    pub subdirs: Vec<(Ino, String, Ino)>,
    /// Entries whose directory object is not on this server: parent inode, name.
    pub orphans: Vec<(Ino, String)>,
    /// Transactions not yet finished, and directory objects being handed to their new
    /// home (they may explain transient differences).
    pub pending_tx: u64,
    /// Shards held: path, directory inode, incarnation.
    pub shards: Vec<(String, Ino, u64)>,
    /// Entries of a shard that Eq. 2 places on another server: directory path, name.
    pub misplaced: Vec<(String, String)>,
    /// Distributed directories homed here: path, inode, incarnation, storing set.
    pub distributed: Vec<(String, Ino, u64, Vec<ServerId>)>,
    /// Hard-link entries held here: shared inode, its home.
    pub links: Vec<(Ino, ServerId)>,
    /// Shared inode objects held here: inode, link count.
    pub shared: Vec<(Ino, u32)>,
    /// Data records in this server's store: id, bytes.
    pub records: Vec<(u64, u64)>,
    /// Records the files whose inodes live here use: server, record id.
    pub pieces: Vec<(ServerId, u64)>,
    /// Broken ACL attributes and directory ancestries that miss their own directory's
    /// search element (after an ACL or mode change): one sentence each, naming the path.
    pub acl_problems: Vec<String>,
}

/// A replica-group member's view of its group (`cluster status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GroupInfo {
    /// The server slot the group keeps.
    pub server: ServerId,
    /// The answering member.
    pub member: u64,
    /// leader, follower, candidate, learner or shutdown.
    pub state: String,
    /// The leader this member knows of.
    pub leader: Option<u64>,
    pub term: u64,
    /// Index of the member's last log entry, and of the last one it applied.
    pub last_log: Option<u64>,
    pub applied: Option<u64>,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// On the leader: entries each other member is behind.
    pub lag: Vec<(u64, u64)>,
    /// Whether the member serves the slot now (it leads and has taken over).
    pub serving: bool,
}

/// A member's store summed up at its applied log position (`fsck --replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StoreDigest {
    pub member: u64,
    /// The log index the store reflects.
    pub applied: u64,
    /// xxh3 of the store's keys and values in key order.
    pub digest: u64,
    pub keys: u64,
    /// xxh3 of the stored bytes of every file-data record the store refers to, in place
    /// order, and how many records and bytes.
    pub data_digest: u64,
    pub data_records: u64,
    pub data_bytes: u64,
}
