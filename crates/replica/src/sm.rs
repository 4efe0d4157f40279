//! The state machine of a member: its copy of the store. Each log entry's batch is applied
//! together with the entry's log position (and, for membership entries, the membership) in
//! one RocksDB write, so the store always is the state after a prefix of the log.
//!
//! Snapshots are the store's whole key space, taken between two applies (so they are
//! consistent), kept in one file (written to a temporary name, fsynced, renamed) for
//! members that join or fell behind the log's purge point.

use crate::log::{decode, encode};
use crate::{Applied, MemberId, TypeConfig};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type SErr = StorageError<MemberId>;
type Membership = StoredMembership<MemberId, BasicNode>;

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
    meta: SnapshotMeta<MemberId, BasicNode>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// A member's state machine over the store `db`.
pub struct StateMachine {
    db: Arc<DB>,
    dir: PathBuf,
    applied: Option<LogId<MemberId>>,
    membership: Membership,
    builds: u64,
}

impl StateMachine {
    /// Opens the state machine over `db`, keeping snapshots in `dir`.
    pub fn open(db: Arc<DB>, dir: &Path) -> Result<StateMachine, String> {
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
        Ok(StateMachine { db, dir: dir.to_path_buf(), applied, membership, builds: 0 })
    }

    /// Every key and value of the store (with the replica's own keys), as one blob.
    fn dump(&self) -> Result<Vec<u8>, SErr> {
        let mut kvs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for kv in self.db.iterator(IteratorMode::Start) {
            let (k, v) = kv.map_err(snap_err)?;
            kvs.push((k.into_vec(), v.into_vec()));
        }
        encode(&kvs)
    }

    fn snapshot_path(&self) -> PathBuf {
        self.dir.join("current")
    }
}

/// Writes `file` as the member's current snapshot, durably.
fn save_snapshot(path: &Path, file: &SnapshotFile) -> Result<(), SErr> {
    use std::io::Write;
    let bytes = encode(file)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(snap_err)?;
    f.write_all(&bytes).map_err(snap_err)?;
    f.sync_all().map_err(snap_err)?;
    std::fs::rename(&tmp, path).map_err(snap_err)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(snap_err)?;
    }
    Ok(())
}

/// Builds a snapshot from a dump taken between two applies.
pub struct Builder {
    meta: SnapshotMeta<MemberId, BasicNode>,
    data: Result<Vec<u8>, String>,
    path: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let data = std::mem::replace(&mut self.data, Err("snapshot already built".into())).map_err(snap_err)?;
        let file = SnapshotFile { meta: self.meta.clone(), data };
        save_snapshot(&self.path, &file)?;
        tracing::info!(snapshot = %file.meta.snapshot_id, bytes = file.data.len(), "snapshot taken");
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
            let mut writes: Vec<WriteBatch> = match &e.payload {
                EntryPayload::Normal(cmd) => cmd.batches.iter().map(|b| WriteBatch::from_data(b)).collect(),
                _ => Vec::new(),
            };
            if writes.is_empty() {
                writes.push(WriteBatch::default());
            }
            // The entry's position goes with its last batch. A crash before that write
            // replays the whole entry: a batch applied again over its own result changes
            // nothing, so the store still ends as after this entry.
            let last = writes.last_mut().expect("one write");
            if let EntryPayload::Membership(m) = &e.payload {
                self.membership = StoredMembership::new(Some(e.log_id), m.clone());
                last.put(MEMBERSHIP, encode(&self.membership)?);
            }
            last.put(APPLIED, encode(&Some(e.log_id))?);
            for b in writes {
                // Not synced: the log is the durable record, replayed from here after a crash.
                self.db.write_opt(b, &WriteOptions::default()).map_err(sm_err)?;
            }
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
        // Taken here, between applies: consistent. An error fails the build.
        let data = self.dump().map_err(|e| e.to_string());
        Builder { meta, data, path: self.snapshot_path() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<MemberId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let kvs: Vec<(Vec<u8>, Vec<u8>)> = decode(&data)?;
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
        save_snapshot(&self.snapshot_path(), &SnapshotFile { meta: meta.clone(), data })?;
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
