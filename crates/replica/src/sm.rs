//! The state machine of a member: its copy of the store. Each log entry's batch is applied
//! together with the entry's log position (and, for membership entries, the membership) in
//! one RocksDB write, so the store always is the state after a prefix of the log.
//!
//! An entry's file data (the records its batch starts to use) is placed in the member's
//! data store first, at the segments and offsets the leader gave it, unless this member
//! proposed the entry in its current reign: then its data store has them already (written
//! before the batch was proposed).
//!
//! Snapshots are the store's whole key space and the stored bytes of every record it
//! refers to, taken between two applies (so they are consistent), kept in one file
//! (written to a temporary name, fsynced, renamed) for members that join or fell behind
//! the log's purge point. They are held in memory whole: fine for the slots of test
//! clusters, not for terabytes of file data.

use crate::log::{decode, encode};
use crate::{Applied, DataSink, MemberId, Node, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use plusfs_store::DataPiece;
use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type SErr = StorageError<MemberId>;
type Membership = StoredMembership<MemberId, Node>;

/// Keys of the replica's own state inside the store: they begin with a zero byte, which no
/// key of the store's engine does.
pub(crate) const APPLIED: &[u8] = b"\0replica:applied";
const MEMBERSHIP: &[u8] = b"\0replica:membership";

fn sm_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_state_machine(&std::io::Error::other(e.to_string())).into()
}

fn snap_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_snapshot(None, &std::io::Error::other(e.to_string())).into()
}

/// What a snapshot file holds.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<MemberId, Node>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// The log position of the snapshot file on disk, shared by the state machine and the
/// builders that run beside it: the file is only ever replaced by a newer snapshot.
type Saved = Arc<Mutex<Option<LogId<MemberId>>>>;

/// What a snapshot's data holds: every key and value of the store, and the file data it
/// refers to.
#[derive(Serialize, Deserialize, Default)]
struct Contents {
    kvs: Vec<(Vec<u8>, Vec<u8>)>,
    pieces: Vec<DataPiece>,
}

/// A member's state machine over the store `db`.
pub struct StateMachine {
    db: Arc<DB>,
    data: Option<Arc<dyn DataSink>>,
    dir: PathBuf,
    saved: Saved,
    applied: Option<LogId<MemberId>>,
    membership: Membership,
    builds: u64,
}

impl StateMachine {
    /// Opens the state machine over `db` and its file data `data`, keeping snapshots in
    /// `dir`.
    pub fn open(db: Arc<DB>, data: Option<Arc<dyn DataSink>>, dir: &Path) -> Result<StateMachine, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let get = |k: &[u8]| db.get(k).map_err(|e| format!("cannot read the replica's state: {e}"));
        let applied = match get(APPLIED)? {
            Some(v) => postcard::from_bytes(&v).map_err(|e| format!("bad applied position: {e}"))?,
            None => None,
        };
        let membership = match get(MEMBERSHIP)? {
            Some(v) => postcard::from_bytes(&v).map_err(|e| format!("bad membership: {e}"))?,
            None => Membership::default(),
        };
        let saved = match std::fs::read(dir.join("current")) {
            Ok(b) => {
                postcard::from_bytes::<SnapshotFile>(&b)
                    .map_err(|e| format!("bad snapshot file: {e}"))?
                    .meta
                    .last_log_id
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read the snapshot file: {e}")),
        };
        Ok(StateMachine {
            db,
            data,
            dir: dir.to_path_buf(),
            saved: Arc::new(Mutex::new(saved)),
            applied,
            membership,
            builds: 0,
        })
    }

    /// Every key and value of the store (with the replica's own keys) and the file data
    /// it refers to, as one blob.
    fn dump(&self) -> Result<Vec<u8>, SErr> {
        let mut kvs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for kv in self.db.iterator(IteratorMode::Start) {
            let (k, v) = kv.map_err(snap_err)?;
            kvs.push((k.into_vec(), v.into_vec()));
        }
        let pieces = match &self.data {
            Some(d) => d.gather().map_err(snap_err)?,
            None => Vec::new(),
        };
        encode(&Contents { kvs, pieces })
    }

    /// Places the file data of entry `e` (its sink skips what it wrote itself as leader).
    fn place(&self, e: &Entry<TypeConfig>) -> Result<(), SErr> {
        let (EntryPayload::Normal(cmd), Some(sink)) = (&e.payload, &self.data) else { return Ok(()) };
        if cmd.data.is_empty() {
            return Ok(());
        }
        let proposer = (e.log_id.leader_id.node_id, e.log_id.leader_id.term);
        sink.place(&cmd.data, Some(proposer)).map_err(sm_err)
    }

    fn snapshot_path(&self) -> PathBuf {
        self.dir.join("current")
    }
}

/// Writes `file` as the member's current snapshot, durably, unless the one on disk is
/// newer (a build and an install may finish in either order). Returns whether it did.
fn save_snapshot(path: &Path, saved: &Saved, file: &SnapshotFile) -> Result<bool, SErr> {
    use std::io::Write;
    let mut on_disk = saved.lock();
    if on_disk.is_some() && *on_disk > file.meta.last_log_id {
        return Ok(false);
    }
    let bytes = encode(file)?;
    let tmp = path.with_extension(format!("{}.tmp", file.meta.snapshot_id));
    let mut f = std::fs::File::create(&tmp).map_err(snap_err)?;
    f.write_all(&bytes).map_err(snap_err)?;
    f.sync_all().map_err(snap_err)?;
    std::fs::rename(&tmp, path).map_err(snap_err)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(snap_err)?;
    }
    *on_disk = file.meta.last_log_id;
    Ok(true)
}

/// Builds a snapshot from a dump taken between two applies.
pub struct Builder {
    meta: SnapshotMeta<MemberId, Node>,
    data: Result<Vec<u8>, String>,
    path: PathBuf,
    saved: Saved,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let data = std::mem::replace(&mut self.data, Err("snapshot already built".into())).map_err(snap_err)?;
        let file = SnapshotFile { meta: self.meta.clone(), data };
        if save_snapshot(&self.path, &self.saved, &file)? {
            tracing::info!(snapshot = %file.meta.snapshot_id, bytes = file.data.len(), "snapshot taken");
        }
        Ok(Snapshot { meta: file.meta, snapshot: Box::new(Cursor::new(file.data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<MemberId>>, Membership), SErr> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for e in entries {
            self.place(&e)?;
            let mut b = match &e.payload {
                // A data-only entry (file data ahead of its batch) has no batch.
                EntryPayload::Normal(cmd) if !cmd.batch.is_empty() => WriteBatch::from_data(&cmd.batch),
                _ => WriteBatch::default(),
            };
            if let EntryPayload::Membership(m) = &e.payload {
                self.membership = StoredMembership::new(Some(e.log_id), m.clone());
                b.put(MEMBERSHIP, encode(&self.membership)?);
            }
            // The entry and its position in one write: the store is always the state after
            // a prefix of the log.
            b.put(APPLIED, encode(&Some(e.log_id))?);
            // Not synced: the log is the durable record, replayed from here after a crash
            // (and the store is flushed before any snapshot lets the log be purged).
            self.db.write_opt(b, &WriteOptions::default()).map_err(sm_err)?;
            self.applied = Some(e.log_id);
            out.push(Applied);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        self.builds += 1;
        let last = self.applied;
        let id = format!("{}-{}-{}", last.map_or(0, |l| l.leader_id.term), last.map_or(0, |l| l.index), self.builds);
        let meta = SnapshotMeta { last_log_id: last, last_membership: self.membership.clone(), snapshot_id: id };
        // The store is made durable first: the log up to this position may be purged once
        // the snapshot exists, and applies are not synced.
        let data = match self.db.flush_wal(true) {
            // Taken here, between applies: consistent. An error fails the build.
            Ok(()) => self.dump().map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot flush the store before a snapshot: {e}")),
        };
        Builder { meta, data, path: self.snapshot_path(), saved: self.saved.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<MemberId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let Contents { kvs, pieces } = decode(&data)?;
        // File data before the store that refers to it.
        if let Some(sink) = &self.data {
            sink.place(&pieces, None).map_err(sm_err)?;
        }
        // The file first: once the store says it is at this position, the snapshot behind
        // it must exist for members that will need it.
        let file = SnapshotFile { meta: meta.clone(), data };
        save_snapshot(&self.snapshot_path(), &self.saved, &file)?;
        let mut b = WriteBatch::default();
        for kv in self.db.iterator(IteratorMode::Start) {
            let (k, _) = kv.map_err(sm_err)?;
            b.delete(k);
        }
        for (k, v) in &kvs {
            b.put(k, v);
        }
        b.put(APPLIED, encode(&meta.last_log_id)?);
        b.put(MEMBERSHIP, encode(&meta.last_membership)?);
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        self.db.write_opt(b, &sync).map_err(sm_err)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        tracing::info!(snapshot = %meta.snapshot_id, keys = kvs.len(), "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let path = self.snapshot_path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(snap_err(e)),
        };
        let file: SnapshotFile = decode(&bytes)?;
        Ok(Some(Snapshot { meta: file.meta, snapshot: Box::new(Cursor::new(file.data)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn file(index: u64, data: &[u8]) -> SnapshotFile {
        let last = Some(LogId::new(CommittedLeaderId::new(1, 1), index));
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: Membership::default(),
            snapshot_id: format!("s{index}"),
        };
        SnapshotFile { meta, data: data.to_vec() }
    }

    #[test]
    fn the_snapshot_file_is_only_replaced_by_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("current");
        let saved: Saved = Arc::default();
        assert!(save_snapshot(&path, &saved, &file(10, b"ten")).unwrap());
        // A build that finished after an install of a newer snapshot does not win.
        assert!(save_snapshot(&path, &saved, &file(20, b"twenty")).unwrap());
        assert!(!save_snapshot(&path, &saved, &file(15, b"fifteen")).unwrap());
        let on_disk: SnapshotFile = decode(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!((on_disk.meta.last_log_id.unwrap().index, on_disk.data.as_slice()), (20, &b"twenty"[..]));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }
}
