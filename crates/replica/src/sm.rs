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
//! refers to, taken between two applies (so they are consistent), for members that join
//! or fell behind the log's purge point. They are streamed, never held in memory whole: a
//! build writes them record by record to a data file ([`crate::snapfile`]), Raft sends
//! that file in chunks, the receiver writes the chunks to a file of its own and installs
//! from it record by record. The snapshot directory holds the data files and `current.meta`
//! (written to a temporary name, fsynced, renamed), which names the current one.
//!
//! An install replaces the whole store in several writes: the first wipes it and leaves a
//! marker, the last writes the snapshot's position and removes the marker. A member that
//! finds the marker at start-up was cut off mid-install and installs its current snapshot
//! again before anything reads the store.

use crate::log::{encode, synced};
use crate::snapfile::{self, Item};
use crate::{Applied, DataSink, MemberId, Node, TypeConfig};
use crate::{SinkError, SnapshotError, StoreOpenError};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use plusfs_store::DataPiece;
use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type SErr = StorageError<MemberId>;
type Membership = StoredMembership<MemberId, Node>;
type Meta = SnapshotMeta<MemberId, Node>;

/// Keys of the replica's own state inside the store: they begin with a zero byte, which no
/// key of the store's engine does.
pub(crate) const APPLIED: &[u8] = b"\0replica:applied";
const MEMBERSHIP: &[u8] = b"\0replica:membership";
/// Present while an install is replacing the store (see the module's documentation).
const INSTALLING: &[u8] = b"\0replica:installing";
/// The file naming the current snapshot.
const CURRENT: &str = "current.meta";
/// File data placed per call of the data sink during an install, and store bytes per write.
const INSTALL_CHUNK: usize = 8 << 20;

fn sm_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_state_machine(&std::io::Error::other(e.to_string())).into()
}

fn snap_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_snapshot(None, &std::io::Error::other(e.to_string())).into()
}

/// What `current.meta` holds: the current snapshot's position and membership, and the name
/// of its data file in the snapshot directory.
#[derive(Serialize, Deserialize, Clone)]
struct Current {
    meta: Meta,
    data: String,
}

/// The current snapshot as on disk, shared by the state machine and the builders that run
/// beside it: it is only ever replaced by a newer snapshot.
type Saved = Arc<Mutex<Option<Current>>>;

/// A member's state machine over the store `db`.
pub struct StateMachine {
    db: Arc<DB>,
    data: Option<Arc<dyn DataSink>>,
    dir: PathBuf,
    saved: Saved,
    applied: Option<LogId<MemberId>>,
    membership: Membership,
    /// Names data files uniquely within this process's life (with the time it started).
    names: Names,
    /// Files snapshots are being received into (inode number, path), oldest first: the
    /// install finds its own by the inode of the handle it is given.
    receiving: Vec<(u64, PathBuf)>,
}

/// Unique names for data files: the process's start time and a counter.
#[derive(Clone)]
struct Names {
    epoch: u128,
    next: Arc<AtomicU64>,
}

impl Names {
    fn new() -> Names {
        let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Names { epoch, next: Arc::default() }
    }

    fn next(&self, kind: &str) -> String {
        format!("{kind}-{:x}-{}.data", self.epoch, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

impl StateMachine {
    /// Opens the state machine over `db` and its file data `data`, keeping snapshots in
    /// `dir`. An install cut off by a crash is finished first.
    pub fn open(db: Arc<DB>, data: Option<Arc<dyn DataSink>>, dir: &Path) -> Result<StateMachine, StoreOpenError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| StoreOpenError::Io { what: format!("cannot create {}", dir.display()), source })?;
        let get = |k: &[u8]| db.get(k).map_err(StoreOpenError::rocks("cannot read the replica's state"));
        let applied = match get(APPLIED)? {
            Some(v) => postcard::from_bytes(&v).map_err(StoreOpenError::decode("applied position"))?,
            None => None,
        };
        let membership = match get(MEMBERSHIP)? {
            Some(v) => postcard::from_bytes(&v).map_err(StoreOpenError::decode("membership"))?,
            None => Membership::default(),
        };
        let installing = get(INSTALLING)?.is_some();
        let current = read_current(dir)?;
        remove_strays(dir, current.as_ref().map(|c| c.data.as_str()));
        let mut sm = StateMachine {
            db,
            data,
            dir: dir.to_path_buf(),
            saved: Arc::new(Mutex::new(current.clone())),
            applied,
            membership,
            names: Names::new(),
            receiving: Vec::new(),
        };
        // Cut off mid-install (the marker), or after the snapshot was made current but
        // before the store was touched (the store is behind its own snapshot): install it.
        let behind = current.as_ref().is_some_and(|c| c.meta.last_log_id > sm.applied);
        if installing || behind {
            let c = current.ok_or_else(|| {
                StoreOpenError::Snapshot("the store was being replaced by a snapshot that is not on disk".into())
            })?;
            tracing::warn!(snapshot = %c.meta.snapshot_id, "finishing a snapshot install cut off by a crash");
            sm.load(&dir.join(&c.data), &c.meta).map_err(|e| StoreOpenError::Snapshot(e.to_string()))?;
        }
        Ok(sm)
    }

    /// Writes every key and value of the store (with the replica's own keys) and the file
    /// data it refers to into a new data file; returns its name.
    fn dump(&self) -> Result<String, SnapshotError> {
        let name = self.names.next("snap");
        let path = self.dir.join(&name);
        let res = self.dump_to(&path);
        if res.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        res.map(|bytes| {
            tracing::debug!(file = %name, bytes, "snapshot data written");
            name
        })
    }

    fn dump_to(&self, path: &Path) -> Result<u64, SnapshotError> {
        let io = |source: std::io::Error| SnapshotError::Write { path: path.to_path_buf(), source };
        let mut w = snapfile::Writer::create(path).map_err(io)?;
        if let Some(d) = &self.data {
            // A failed write stops the gathering; its error is the one reported.
            let mut failed = None;
            let gathered = d.gather(&mut |p| {
                w.piece(&p).map_err(|e| {
                    let message = e.to_string();
                    failed = Some(e);
                    SinkError::from(message)
                })
            });
            if let Some(e) = failed {
                return Err(io(e));
            }
            gathered.map_err(SnapshotError::Data)?;
        }
        for kv in self.db.iterator(IteratorMode::Start) {
            let (k, v) = kv?;
            w.kv(&k, &v).map_err(io)?;
        }
        w.finish().map_err(io)
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

    /// Replaces the store by the snapshot in data file `path` (see the module's
    /// documentation for how a crash part way is recovered).
    fn load(&mut self, path: &Path, meta: &Meta) -> Result<(), SErr> {
        let mut wipe = WriteBatch::default();
        let first = self.db.iterator(IteratorMode::Start).next().transpose().map_err(sm_err)?;
        let last = self.db.iterator(IteratorMode::End).next().transpose().map_err(sm_err)?;
        if let (Some((first, _)), Some((last, _))) = (first, last) {
            wipe.delete_range(&first, &last);
            wipe.delete(&last);
        }
        // After the range delete in the same batch: the marker outlives it.
        wipe.put(INSTALLING, encode(&meta.last_log_id)?);
        self.db.write_opt(wipe, &synced()).map_err(sm_err)?;
        let mut r = snapfile::Reader::open(path).map_err(sm_err)?;
        let (mut pieces, mut piece_bytes) = (Vec::new(), 0usize);
        let (mut b, mut keys) = (WriteBatch::default(), 0u64);
        while let Some(item) = r.next_item().map_err(sm_err)? {
            match item {
                Item::Piece(p) => {
                    piece_bytes += p.bytes.len();
                    pieces.push(p);
                    if piece_bytes >= INSTALL_CHUNK {
                        self.place_pieces(&mut pieces)?;
                        piece_bytes = 0;
                    }
                }
                Item::Kv(k, v) => {
                    // File data before the store that refers to it.
                    self.place_pieces(&mut pieces)?;
                    if k != INSTALLING {
                        b.put(&k, &v);
                        keys += 1;
                    }
                    if b.size_in_bytes() >= INSTALL_CHUNK {
                        let full = std::mem::take(&mut b);
                        self.db.write_opt(full, &WriteOptions::default()).map_err(sm_err)?;
                    }
                }
            }
        }
        self.place_pieces(&mut pieces)?;
        b.put(APPLIED, encode(&meta.last_log_id)?);
        b.put(MEMBERSHIP, encode(&meta.last_membership)?);
        b.delete(INSTALLING);
        // Synced: the writes before it are made durable with it (one WAL).
        self.db.write_opt(b, &synced()).map_err(sm_err)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        tracing::info!(snapshot = %meta.snapshot_id, keys, "snapshot installed");
        Ok(())
    }

    fn place_pieces(&self, pieces: &mut Vec<DataPiece>) -> Result<(), SErr> {
        if let (Some(sink), false) = (&self.data, pieces.is_empty()) {
            sink.place(pieces, None).map_err(sm_err)?;
        }
        pieces.clear();
        Ok(())
    }
}

/// The current snapshot named by `dir`'s `current.meta`, if any.
fn read_current(dir: &Path) -> Result<Option<Current>, StoreOpenError> {
    let path = dir.join(CURRENT);
    match std::fs::read(&path) {
        Ok(b) => postcard::from_bytes(&b)
            .map(Some)
            .map_err(StoreOpenError::decode(format!("snapshot file {}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreOpenError::Io { what: format!("cannot read {}", path.display()), source }),
    }
}

/// Removes what earlier runs left in the snapshot directory: data files other than the
/// current one's (superseded, or a build or transfer cut off) and temporary files.
fn remove_strays(dir: &Path, keep: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let stray = name.ends_with(".tmp") || (name.ends_with(".data") && Some(name.as_ref()) != keep);
        if stray || name == "current" {
            // `current`: a snapshot in the whole-file format of earlier versions, superseded
            // by the first snapshot taken or received (the log still holds what it covers
            // until then only if it was never purged; otherwise a leader sends one).
            if let Err(err) = std::fs::remove_file(e.path()) {
                tracing::warn!(file = %e.path().display(), %err, "cannot remove a stale snapshot file");
            }
        }
    }
}

/// Makes the snapshot in data file `name` the current one, durably, unless the one on disk
/// is newer (a build and an install may finish in either order); then removes the data
/// file it replaced. Returns whether it did.
fn save_current(dir: &Path, saved: &Saved, meta: &Meta, name: &str) -> Result<bool, SErr> {
    use std::io::Write;
    let mut on_disk = saved.lock();
    if on_disk.as_ref().is_some_and(|c| c.meta.last_log_id > meta.last_log_id) {
        return Ok(false);
    }
    let current = Current { meta: meta.clone(), data: name.to_string() };
    let tmp = dir.join(format!("{CURRENT}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(snap_err)?;
    f.write_all(&encode(&current)?).map_err(snap_err)?;
    f.sync_all().map_err(snap_err)?;
    std::fs::rename(&tmp, dir.join(CURRENT)).map_err(snap_err)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(snap_err)?;
    if let Some(old) = on_disk.replace(current) {
        if old.data != name {
            // A transfer still reading it keeps its open handle.
            let _ = std::fs::remove_file(dir.join(old.data));
        }
    }
    Ok(true)
}

/// Opens a snapshot's data file for Raft to send.
async fn open_data(path: &Path) -> Result<Box<tokio::fs::File>, SErr> {
    tokio::fs::File::open(path).await.map(Box::new).map_err(snap_err)
}

/// Builds a snapshot from a data file written between two applies.
pub struct Builder {
    meta: Meta,
    data: Result<String, SnapshotError>,
    dir: PathBuf,
    saved: Saved,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let name = std::mem::replace(&mut self.data, Err(SnapshotError::Built)).map_err(snap_err)?;
        let path = self.dir.join(&name);
        // Opened before it can be replaced (and removed) by a newer snapshot.
        let file = open_data(&path).await?;
        if save_current(&self.dir, &self.saved, &self.meta, &name)? {
            tracing::info!(snapshot = %self.meta.snapshot_id, file = %name, "snapshot taken");
        } else {
            let _ = std::fs::remove_file(&path);
        }
        Ok(Snapshot { meta: self.meta.clone(), snapshot: file })
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
        let last = self.applied;
        let seq = self.names.next.load(Ordering::Relaxed);
        let id = format!("{}-{}-{seq}", last.map_or(0, |l| l.leader_id.term), last.map_or(0, |l| l.index));
        let meta = SnapshotMeta { last_log_id: last, last_membership: self.membership.clone(), snapshot_id: id };
        // The store is made durable first: the log up to this position may be purged once
        // the snapshot exists, and applies are not synced.
        let data = match self.db.flush_wal(true) {
            // Written here, between applies: consistent. An error fails the build.
            Ok(()) => self.dump(),
            Err(e) => Err(SnapshotError::Store(e)),
        };
        Builder { meta, data, dir: self.dir.clone(), saved: self.saved.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, SErr> {
        // A transfer given up for a newer one leaves its file. The one before the newest
        // may still be waiting for its install: older ones go.
        while self.receiving.len() > 1 {
            let (_, old) = self.receiving.remove(0);
            let _ = std::fs::remove_file(old);
        }
        let path = self.dir.join(self.names.next("recv").replace(".data", ".tmp"));
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).map_err(snap_err)?;
        let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().map_err(snap_err)?);
        self.receiving.push((ino, path));
        Ok(Box::new(tokio::fs::File::from_std(f)))
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<tokio::fs::File>) -> Result<(), SErr> {
        let ino = std::os::unix::fs::MetadataExt::ino(&snapshot.metadata().await.map_err(snap_err)?);
        let at = self.receiving.iter().position(|(i, _)| *i == ino);
        let (_, received) = at
            .map(|k| self.receiving.remove(k))
            .ok_or_else(|| snap_err(format!("snapshot {} was not received here", meta.snapshot_id)))?;
        snapshot.sync_all().await.map_err(snap_err)?;
        drop(snapshot);
        // Checked whole before the store is touched: a broken transfer changes nothing.
        let checked = snapfile::Reader::open(&received).and_then(|mut r| {
            while r.next_item()?.is_some() {}
            Ok(())
        });
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&received);
            return Err(snap_err(format!("snapshot {} refused: {e}", meta.snapshot_id)));
        }
        let name = self.names.next("snap");
        let path = self.dir.join(&name);
        std::fs::rename(&received, &path).map_err(snap_err)?;
        // The file first: once the store says it is at this position, the snapshot behind
        // it must exist for members that will need it (and for finishing a cut-off install).
        if !save_current(&self.dir, &self.saved, meta, &name)? {
            // openraft installs only snapshots newer than what this member has: a newer
            // current one here means the two disagree.
            let _ = std::fs::remove_file(&path);
            return Err(snap_err(format!("snapshot {} is older than the current one", meta.snapshot_id)));
        }
        self.load(&path, meta)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        // Opened under the lock: a build that makes a newer snapshot current meanwhile
        // removes this one's file (an open handle keeps it readable).
        let (meta, file) = {
            let saved = self.saved.lock();
            let Some(c) = saved.as_ref() else { return Ok(None) };
            (c.meta.clone(), std::fs::File::open(self.dir.join(&c.data)).map_err(snap_err)?)
        };
        Ok(Some(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(file)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn meta(index: u64) -> Meta {
        let last = Some(LogId::new(CommittedLeaderId::new(1, 1), index));
        SnapshotMeta { last_log_id: last, last_membership: Membership::default(), snapshot_id: format!("s{index}") }
    }

    #[test]
    fn the_current_snapshot_is_only_replaced_by_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let saved: Saved = Arc::default();
        for n in ["a.data", "b.data", "c.data"] {
            std::fs::write(dir.path().join(n), n).unwrap();
        }
        assert!(save_current(dir.path(), &saved, &meta(10), "a.data").unwrap());
        assert!(save_current(dir.path(), &saved, &meta(20), "b.data").unwrap());
        // A build that finished after an install of a newer snapshot does not win.
        assert!(!save_current(dir.path(), &saved, &meta(15), "c.data").unwrap());
        let on_disk = read_current(dir.path()).unwrap().unwrap();
        assert_eq!((on_disk.meta.last_log_id.unwrap().index, on_disk.data.as_str()), (20, "b.data"));
        assert!(!dir.path().join("a.data").exists(), "the replaced data file is removed");
        remove_strays(dir.path(), Some("b.data"));
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["b.data", CURRENT]);
    }

    fn store(dir: &Path, keys: &[&str]) -> Arc<DB> {
        let db = Arc::new(DB::open_default(dir.join("store")).unwrap());
        for k in keys {
            db.put(k.as_bytes(), b"old").unwrap();
        }
        db
    }

    fn user_keys(db: &DB) -> Vec<String> {
        let all = db.iterator(IteratorMode::Start).map(|kv| kv.unwrap().0.into_vec());
        all.filter(|k| k[0] != 0).map(|k| String::from_utf8(k).unwrap()).collect()
    }

    /// A snapshot data file of keys `keys` (value "new").
    fn data_file(path: &Path, keys: &[&str]) {
        let mut w = snapfile::Writer::create(path).unwrap();
        for k in keys {
            w.kv(k.as_bytes(), b"new").unwrap();
        }
        w.finish().unwrap();
    }

    #[tokio::test]
    async fn a_received_snapshot_replaces_the_store_and_is_served_as_received() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let db = store(dir.path(), &["a", "b", "z"]);
        let mut sm = StateMachine::open(db.clone(), None, &dir.path().join("snap")).unwrap();
        let src = dir.path().join("src.data");
        data_file(&src, &["x", "y"]);
        let bytes = std::fs::read(&src).unwrap();
        let mut f = sm.begin_receiving_snapshot().await.unwrap();
        // In two chunks, as Raft sends them.
        f.write_all(&bytes[..10]).await.unwrap();
        f.write_all(&bytes[10..]).await.unwrap();
        f.flush().await.unwrap();
        sm.install_snapshot(&meta(30), f).await.unwrap();
        assert_eq!(user_keys(&db), ["x", "y"]);
        assert_eq!(db.get(b"x").unwrap().unwrap(), b"new");
        assert_eq!(sm.applied_state().await.unwrap().0.unwrap().index, 30);
        let mut current = sm.get_current_snapshot().await.unwrap().unwrap();
        let mut sent = Vec::new();
        current.snapshot.read_to_end(&mut sent).await.unwrap();
        assert_eq!(sent, bytes, "what it sends on is what it received");
        // A transfer cut short is refused before the store is touched.
        let mut f = sm.begin_receiving_snapshot().await.unwrap();
        f.write_all(&bytes[..bytes.len() - 3]).await.unwrap();
        f.flush().await.unwrap();
        assert!(sm.install_snapshot(&meta(40), f).await.is_err());
        assert_eq!(user_keys(&db), ["x", "y"]);
        assert_eq!(sm.applied_state().await.unwrap().0.unwrap().index, 30);
    }

    #[test]
    fn an_install_cut_off_by_a_crash_is_finished_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("snap");
        let db = store(dir.path(), &["a", "b"]);
        drop(StateMachine::open(db.clone(), None, &snap).unwrap());
        data_file(&snap.join("s.data"), &["x", "y"]);
        assert!(save_current(&snap, &Saved::default(), &meta(30), "s.data").unwrap());
        // What a crash after the wipe and the first of the keys leaves.
        db.delete(b"a").unwrap();
        db.delete(b"b").unwrap();
        db.put(INSTALLING, encode(&meta(30).last_log_id).unwrap()).unwrap();
        db.put(b"x", b"new").unwrap();
        let sm = StateMachine::open(db.clone(), None, &snap).unwrap();
        assert_eq!(user_keys(&db), ["x", "y"]);
        assert!(db.get(INSTALLING).unwrap().is_none());
        assert_eq!(sm.applied.map(|l| l.index), Some(30));
    }

    #[test]
    fn a_store_behind_its_current_snapshot_installs_it_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("snap");
        let db = store(dir.path(), &["a"]);
        drop(StateMachine::open(db.clone(), None, &snap).unwrap());
        // A crash after the received snapshot was made current, before the store changed.
        data_file(&snap.join("s.data"), &["x"]);
        assert!(save_current(&snap, &Saved::default(), &meta(30), "s.data").unwrap());
        let sm = StateMachine::open(db.clone(), None, &snap).unwrap();
        assert_eq!(user_keys(&db), ["x"]);
        assert_eq!(sm.applied.map(|l| l.index), Some(30));
    }
}
