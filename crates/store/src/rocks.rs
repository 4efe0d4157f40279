//! The RocksDB engine of [`DirStore`](crate::DirStore).

use crate::usage::{Books, Owner, Usage};
use crate::{Batch, BatchOp, Commit, DataSource, DirStore, LogKind, Replicator, StoreError, StoreRead, StoreStats};
use plusfs_metrics::prometheus::{Histogram, HistogramOpts};
use plusfs_proto::record::{acl_ancestry, legacy_ancestry};
use plusfs_proto::{DirObject, Ino, Inode, TxId};
use rocksdb::{Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// A batch waiting for the committer thread, with the channel that reports its outcome.
/// A batch for the group-commit thread: the batch, who waits for it, its number in the books.
type Queued = (Batch, oneshot::Sender<Result<(), StoreError>>, u64);

/// A raw key-value pair from a scan.
type Kv = (Box<[u8]>, Box<[u8]>);

/// Where a replicated store's batches go, and where the file data they refer to is read.
type Replication = (Arc<dyn Replicator>, Option<Arc<dyn DataSource>>);

/// RocksDB-backed store. With `sync = os` a batch is written to the WAL in the caller's
/// thread before `submit` returns; with `sync = always` batches go to a committer thread
/// that merges every batch waiting into one write and one fsync (group commit). A replica
/// group's member hands its batches to the group instead (`replicate_through`).
pub struct RocksStore {
    db: Arc<DB>,
    /// The committer thread (with `sync = always`): where batches go, and the thread, which
    /// holds the engine too and is joined when the store is dropped.
    committer: Option<(mpsc::Sender<Queued>, std::thread::JoinHandle<()>)>,
    /// Set when the store is one member's copy of a replica group's state (with where the
    /// file data its batches refer to is read).
    replicator: std::sync::OnceLock<Replication>,
    stats: Arc<Counters>,
    format: Format,
    /// The quota books (counters as submitted, ceilings). Held while a batch is counted
    /// and handed on, so batches are counted in the order they are written.
    books: Arc<parking_lot::Mutex<Books>>,
    /// Set when a counted batch failed to commit: the ledger is read again.
    ledger_stale: Arc<AtomicBool>,
}

/// How the stored objects (directory objects, shards, entries, inodes) are framed.
///
/// Format 0 (stores made before record versions existed): the bare postcard encoding.
/// Format 1: one version byte ([`RECORD_VERSION`]), then the postcard encoding; a reader
/// refuses a record of a version it does not know instead of misreading it. A new store is
/// made in the newest format; an older one keeps its format (its records stay readable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format(u8);

/// The version of the stored-object layout this build writes (the layout of
/// `plusfs_proto::record`). Bump it with any change there. Version 2 added
/// `DirObject::ancestry`; records of version 1 are read with `ancestry: None`. Version 3
/// added the ACL elements of ancestries (`Ancestry::acls`); older records are read
/// without (`plusfs_proto::record::legacy_ancestry`). Version 4 added the quota trees of
/// ancestries (`Ancestry::quotas`; `plusfs_proto::record::acl_ancestry` reads version 3).
pub const RECORD_VERSION: u8 = 4;

/// Bytes of a memtable (RocksDB's write buffer), and so of a level-0 table.
///
/// The engine's structures are kept small so its largest compaction is small: the disk's
/// floor holds room for the next compaction (see [`RocksStore::compaction_room`]), and a
/// compaction that runs out of space stops the engine's background work until as much
/// space as it wanted is free, which on a disk full of deleted objects never comes.
const WRITE_BUFFER: u64 = 16 << 20;
/// Target bytes of a table below level 0.
const TABLE_BYTES: u64 = 16 << 20;
/// Bytes of level 1 (each level below holds ten times more).
const LEVEL1_BYTES: u64 = 64 << 20;
/// Level-0 tables that start a compaction into level 1 (RocksDB's default).
const L0_TRIGGER: u64 = 4;
/// Input of a compaction below level 1: one table and about ten of the next level, and a
/// table's worth of margin for uneven overlaps.
const BELOW_L1_COMPACTION: u64 = 12 * TABLE_BYTES;

/// Key of the store's format number.
const FORMAT_KEY: &[u8] = b"M__format";

struct Counters {
    batches: AtomicU64,
    writes: AtomicU64,
    syncs: AtomicU64,
    /// Time of an engine write without fsync, and of one with (group commit).
    write_seconds: Histogram,
    fsync_seconds: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        let hist = |name: &str, help: &str| {
            let opts = HistogramOpts::new(name, help).buckets(plusfs_metrics::latency_buckets());
            Histogram::with_opts(opts).expect("valid histogram")
        };
        Counters {
            batches: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            write_seconds: hist("plusfs_store_write_seconds", "Time of a store write (WAL, no fsync)."),
            fsync_seconds: hist("plusfs_store_fsync_seconds", "Time of a store write with its WAL fsync."),
        }
    }
}

fn engine(e: rocksdb::Error) -> StoreError {
    let text = e.into_string();
    match text.contains("No space left on device") || text.contains("NoSpace") {
        true => StoreError::NoSpace(text),
        false => StoreError::Engine(text),
    }
}

fn dir_key(path: &str) -> Vec<u8> {
    object_key(b'D', path)
}

fn shard_key(path: &str) -> Vec<u8> {
    object_key(b'H', path)
}

fn object_key(prefix: u8, path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + path.len());
    k.push(prefix);
    k.extend_from_slice(path.as_bytes());
    k
}

fn entry_prefix(dir: Ino) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'E');
    k.extend_from_slice(&dir.to_be_bytes());
    k
}

fn entry_key(dir: Ino, name: &str) -> Vec<u8> {
    let mut k = entry_prefix(dir);
    k.extend_from_slice(name.as_bytes());
    k
}

fn inode_key(ino: Ino) -> Vec<u8> {
    let mut k = vec![b'I'];
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

fn record_key(id: u64) -> Vec<u8> {
    let mut k = vec![b'R'];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn seg_ref_key(segment: u32, offset: u64) -> Vec<u8> {
    let mut k = vec![b'G'];
    k.extend_from_slice(&segment.to_be_bytes());
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

fn once_key(client: u64, seq: u64) -> Vec<u8> {
    let mut k = vec![b'Q'];
    k.extend_from_slice(&client.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn usage_key(owner: Owner) -> Vec<u8> {
    let (kind, id) = owner.key_parts();
    let mut k = vec![b'U', kind];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn trees_key(dir: Ino) -> Vec<u8> {
    let mut k = vec![b'T'];
    k.extend_from_slice(&dir.to_be_bytes());
    k
}

fn counter_key(name: &str) -> Vec<u8> {
    let mut k = vec![b'M'];
    k.extend_from_slice(name.as_bytes());
    k
}

fn log_key(kind: LogKind, txid: TxId) -> Vec<u8> {
    let mut k = vec![kind.prefix()];
    k.extend_from_slice(&txid.to_be_bytes());
    k
}

fn encode<T: Serialize>(format: Format, v: &T) -> Vec<u8> {
    let out = if format.0 >= 1 { vec![RECORD_VERSION] } else { Vec::new() };
    postcard::to_extend(v, out).expect("in-memory encoding cannot fail")
}

fn decode<T: DeserializeOwned>(format: Format, key: &[u8], v: &[u8]) -> Result<T, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { key: String::from_utf8_lossy(key).into_owned(), reason };
    let body = match (format.0, v.split_first()) {
        // Bare records of any layout: the older layouts of a directory object are
        // prefixes of the newest, so it reads the newest whole or is of an older one.
        (0, _) => {
            return postcard::from_bytes(v)
                .or_else(|_| acl_ancestry(|| postcard::from_bytes(v)))
                .or_else(|_| legacy_ancestry(|| decode_v1(v)))
                .map_err(|e| corrupt(e.to_string()))
        }
        (_, Some((1, body))) => return legacy_ancestry(|| decode_v1(body)).map_err(|e| corrupt(e.to_string())),
        (_, Some((2, body))) => {
            return legacy_ancestry(|| postcard::from_bytes(body)).map_err(|e| corrupt(e.to_string()))
        }
        (_, Some((3, body))) => return acl_ancestry(|| postcard::from_bytes(body)).map_err(|e| corrupt(e.to_string())),
        (_, Some((&RECORD_VERSION, body))) => body,
        (_, Some((version, _))) => {
            return Err(corrupt(format!(
                "record version {version}: this plusfs reads version {RECORD_VERSION} (a newer build wrote it?)"
            )))
        }
        (_, None) => return Err(corrupt("empty record".into())),
    };
    postcard::from_bytes(body).map_err(|e| corrupt(e.to_string()))
}

/// A record of version 1 (or of a format-0 store, which may hold both layouts): version 2
/// appended `ancestry: Option<Ancestry>` to directory objects, so the body is read as if
/// it ended in `None` (postcard ignores the byte after records of other types, and after
/// a version-2 directory object that a format-0 store wrote).
fn decode_v1<T: DeserializeOwned>(body: &[u8]) -> Result<T, postcard::Error> {
    let mut padded = Vec::with_capacity(body.len() + 1);
    padded.extend_from_slice(body);
    padded.push(0);
    postcard::from_bytes(&padded)
}

/// The format of the store in `db`: the recorded one, 0 for a store from before formats
/// existed, the newest for an empty store (which is then recorded).
fn store_format(db: &DB) -> Result<Format, StoreError> {
    if let Some(v) = db.get(FORMAT_KEY).map_err(engine)? {
        return match v.as_slice() {
            [n] if *n <= RECORD_VERSION => Ok(Format(*n)),
            other => Err(StoreError::Corrupt {
                key: "M__format".into(),
                reason: format!("store format {other:?} is not one this plusfs reads (up to {RECORD_VERSION})"),
            }),
        };
    }
    let empty = db.iterator(rocksdb::IteratorMode::Start).next().is_none();
    if !empty {
        return Ok(Format(0));
    }
    db.put(FORMAT_KEY, [RECORD_VERSION]).map_err(engine)?;
    Ok(Format(RECORD_VERSION))
}

fn utf8(key: &[u8], bytes: &[u8]) -> Result<String, StoreError> {
    utf8_str(key, bytes).map(str::to_string)
}

/// [`utf8`] without a copy.
fn utf8_str<'a>(key: &[u8], bytes: &'a [u8]) -> Result<&'a str, StoreError> {
    std::str::from_utf8(bytes).map_err(|_| StoreError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: "name is not UTF-8".into(),
    })
}

fn to_write_batch(format: Format, batch: &Batch, wb: &mut WriteBatch) {
    for op in &batch.ops {
        match op {
            BatchOp::PutDir(p, o) => wb.put(dir_key(p), encode(format, o)),
            BatchOp::DelDir(p) => wb.delete(dir_key(p)),
            BatchOp::PutShard(p, o) => wb.put(shard_key(p), encode(format, o)),
            BatchOp::DelShard(p) => wb.delete(shard_key(p)),
            BatchOp::PutEntry(d, n, i) => wb.put(entry_key(*d, n), encode(format, i)),
            BatchOp::DelEntry(d, n) => wb.delete(entry_key(*d, n)),
            BatchOp::PutInode(i) => wb.put(inode_key(i.ino), encode(format, i)),
            BatchOp::DelInode(ino) => wb.delete(inode_key(*ino)),
            BatchOp::PutCounter(n, v) => wb.put(counter_key(n), v.to_be_bytes()),
            BatchOp::PutLog(k, t, r) => wb.put(log_key(*k, *t), r),
            BatchOp::DelLog(k, t) => wb.delete(log_key(*k, *t)),
            BatchOp::PutRecord(id, v) => wb.put(record_key(*id), v),
            BatchOp::DelRecord(id) => wb.delete(record_key(*id)),
            BatchOp::PutSegRef(seg, off, id) => wb.put(seg_ref_key(*seg, *off), id.to_be_bytes()),
            BatchOp::DelSegRef(seg, off) => wb.delete(seg_ref_key(*seg, *off)),
            BatchOp::PutOnce(c, s, v) => wb.put(once_key(*c, *s), v),
            BatchOp::DelOnce(c, s) => wb.delete(once_key(*c, *s)),
            BatchOp::PutUsage(o, u) => wb.put(usage_key(*o), u.encode()),
            BatchOp::DelUsage(o) => wb.delete(usage_key(*o)),
            BatchOp::PutTrees(d, t) => wb.put(trees_key(*d), postcard::to_allocvec(t).expect("in-memory encoding")),
            BatchOp::DelTrees(d) => wb.delete(trees_key(*d)),
        }
    }
}

impl RocksStore {
    /// Opens (creating if needed) the store in `dir`. `sync_always` selects fsync per
    /// commit group.
    pub fn open(dir: &Path, sync_always: bool) -> Result<RocksStore, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.increase_parallelism(2);
        opts.set_write_buffer_size(WRITE_BUFFER as usize);
        opts.set_target_file_size_base(TABLE_BYTES);
        opts.set_max_bytes_for_level_base(LEVEL1_BYTES);
        opts.set_max_background_jobs(2);
        // Creates look up names that do not exist yet: bloom filters answer those without
        // reading data blocks.
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_block_cache(&rocksdb::Cache::new_lru_cache(64 << 20).map_err(engine)?);
        opts.set_block_based_table_factory(&table);
        let db = Arc::new(DB::open(&opts, dir).map_err(engine)?);
        let format = store_format(&db)?;
        let stats = Arc::new(Counters::default());
        let stale = Arc::new(AtomicBool::new(false));
        let books: Arc<parking_lot::Mutex<Books>> = Arc::default();
        let committer =
            sync_always.then(|| spawn_committer(db.clone(), stats.clone(), format, (stale.clone(), books.clone())));
        Ok(RocksStore { db, committer, stats, format, replicator: Default::default(), books, ledger_stale: stale })
    }

    /// An integer property of the engine (`None` if it has no such property).
    fn property(&self, name: &str) -> Option<u64> {
        self.db.property_int_value(name).ok().flatten()
    }

    /// Bytes of disk the next flush of the memtables may need: the table it writes (their
    /// bytes, and a quarter more for its index and filter) and the next write-ahead log,
    /// preallocated 1.1 write buffers long.
    fn flush_needs(&self) -> u64 {
        let unflushed = self.property("rocksdb.cur-size-all-mem-tables").unwrap_or(0);
        unflushed + unflushed / 4 + WRITE_BUFFER + WRITE_BUFFER / 10
    }

    /// Bytes of disk the engine's next compaction may need, its output being at most its
    /// input: the larger of level 0 (with the table the next flush adds) merged into
    /// level 1, and a compaction below level 1 (once there are levels below); plus the
    /// preallocated tail of the table it writes. Kept free, a compaction never runs out
    /// of space (one that does stops the engine's background work until as much space as
    /// it wanted is free: with the disk full of deleted objects, never).
    pub fn compaction_room(&self) -> u64 {
        // While the engine keeps up, level 0 is compacted once it holds four tables, and
        // level 1 stays near its target: counting at least that keeps the room (and the
        // floor) from swinging with every cycle of level 0.
        let steady = L0_TRIGGER * WRITE_BUFFER + WRITE_BUFFER + LEVEL1_BYTES;
        let Ok(files) = self.db.live_files() else {
            return steady.max(BELOW_L1_COMPACTION) + TABLE_BYTES + TABLE_BYTES / 10;
        };
        let level = |l: i32| files.iter().filter(|f| f.level == l).map(|f| f.size as u64).sum::<u64>();
        let memtables = self.property("rocksdb.cur-size-all-mem-tables").unwrap_or(0);
        let into_level1 = (level(0) + memtables + level(1)).max(steady);
        // Below level 1, a compaction takes one table and the tables of the next level it
        // overlaps (about ten: each level holds ten times the one above).
        let below = if files.iter().any(|f| f.level >= 2) { BELOW_L1_COMPACTION } else { 0 };
        into_level1.max(below) + TABLE_BYTES + TABLE_BYTES / 10
    }

    /// Whether the engine takes writes: an empty batch, past no log, meets the error of an
    /// engine stopped by a failed write (whose log may end in a torn record).
    fn takes_writes(&self) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        wo.disable_wal(true);
        self.db.write_opt(WriteBatch::default(), &wo).map_err(engine)
    }

    /// The RocksDB under the store (a replica group's state machine applies to it).
    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    /// From now on, batches go to `r` (the replica group this store is a copy of) instead
    /// of being written here, with the file data they refer to read from `data`; the group
    /// writes them when they commit. Set once.
    pub fn replicate_through(
        &self,
        r: Arc<dyn Replicator>,
        data: Option<Arc<dyn DataSource>>,
    ) -> Result<(), StoreError> {
        self.replicator.set((r, data)).map_err(|_| StoreError::Replica("the store already has a replicator".into()))?;
        // While this member followed, the group's entries changed the engine under any
        // ledger read then (a segment collector's batch reads one): read it again now
        // that every committed entry is applied and only this store's batches follow.
        self.books.lock().forget();
        Ok(())
    }

    /// Whether this store writes through a replica group whose replication failed (its
    /// member lost its lead).
    pub fn replication_failed(&self) -> bool {
        self.replicator.get().is_some_and(|(r, _)| r.has_failed())
    }

    /// What the exactly-once table holds for request `seq` of `client`.
    pub fn get_once(&self, client: u64, seq: u64) -> Result<Option<crate::OnceState>, StoreError> {
        let Some(v) = self.db.get(once_key(client, seq)).map_err(engine)? else { return Ok(None) };
        crate::decode_once(&v).map(|(state, _)| Some(state))
    }

    /// The exactly-once records written before `secs` (seconds since the epoch).
    pub fn once_older_than(&self, secs: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        let mut out = Vec::new();
        for item in self.scan_prefix(b"Q") {
            let (k, v) = item?;
            let (Ok(c), Ok(s), Ok((_, t))) =
                (<[u8; 8]>::try_from(&k[1..9]), <[u8; 8]>::try_from(&k[9..]), crate::decode_once(&v))
            else {
                continue;
            };
            if t < secs {
                out.push((u64::from_be_bytes(c), u64::from_be_bytes(s)));
            }
        }
        Ok(out)
    }

    /// Every file-data record's place: (segment, offset, record id), by place (a replica's
    /// snapshot copies their bytes).
    pub fn all_seg_refs(&self) -> Result<Vec<(u32, u64, u64)>, StoreError> {
        let mut out = Vec::new();
        for item in self.scan_prefix(b"G") {
            let (k, v) = item?;
            let bad = || StoreError::Corrupt { key: format!("{k:?}"), reason: "bad segment reference".into() };
            let seg = <[u8; 4]>::try_from(k.get(1..5).ok_or_else(bad)?).map_err(|_| bad())?;
            let off = <[u8; 8]>::try_from(k.get(5..).ok_or_else(bad)?).map_err(|_| bad())?;
            let id = <[u8; 8]>::try_from(&v[..]).map_err(|_| bad())?;
            out.push((u32::from_be_bytes(seg), u64::from_be_bytes(off), u64::from_be_bytes(id)));
        }
        Ok(out)
    }

    /// Counts `batch`'s quota usage into `books` (read from the engine again if a counted
    /// batch failed), appending the counter changes to it.
    fn account(&self, books: &mut Books, batch: &mut Batch) -> Result<u64, StoreError> {
        let stale = self.ledger_stale.swap(false, Ordering::AcqRel) || self.replication_failed();
        books.account(batch, self, stale)
    }

    /// `done`, but first settling batch `seq` in the books (it is applied here once the
    /// group answers), and marking the ledger stale if the batch failed.
    fn settle_when_done(
        &self,
        done: oneshot::Sender<Result<(), StoreError>>,
        seq: u64,
    ) -> oneshot::Sender<Result<(), StoreError>> {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return done };
        let (tx, rx) = oneshot::channel();
        let (stale, books) = (self.ledger_stale.clone(), self.books.clone());
        rt.spawn(async move {
            let result = rx.await.unwrap_or(Err(StoreError::Closed));
            if result.is_err() {
                stale.store(true, Ordering::Release);
            }
            books.lock().settle(seq);
            let _ = done.send(result);
        });
        tx
    }

    fn write_now(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut wb = WriteBatch::default();
        to_write_batch(self.format, batch, &mut wb);
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        let _timer = self.stats.write_seconds.start_timer();
        self.db.write_opt(wb, &wo).map_err(engine)
    }

    fn get_object(&self, key: &[u8]) -> Result<Option<DirObject>, StoreError> {
        match self.db.get_pinned(key).map_err(engine)? {
            Some(v) => Ok(Some(decode(self.format, key, &v)?)),
            None => Ok(None),
        }
    }

    /// Directory objects (`D`) or shards (`H`) at or below `root`, in path order.
    fn objects_within(&self, prefix: u8, root: &str) -> Result<Vec<(String, DirObject)>, StoreError> {
        let mut out = Vec::new();
        for item in self.scan_prefix(&object_key(prefix, root)) {
            let (k, v) = item?;
            let path = utf8(&k, &k[1..])?;
            if plusfs_proto::path::is_within(&path, root) {
                out.push((path, decode(self.format, &k, &v)?));
            }
        }
        Ok(out)
    }

    fn scan_prefix(&self, prefix: &[u8]) -> impl Iterator<Item = Result<Kv, StoreError>> + '_ {
        let prefix = prefix.to_vec();
        self.iter_within(&prefix.clone(), &prefix).map(|r| r.map_err(engine)).take_while(move |r| match r {
            Ok((k, _)) => k.starts_with(&prefix),
            Err(_) => true,
        })
    }

    /// Keys from `start` on that begin with `prefix`. The iterator is bounded at the end of
    /// the prefix: without a bound, RocksDB would step over every deleted key after the
    /// prefix (the tombstones of an `rm -rf`, until compaction) to find the first live
    /// one, and scans grew slower with every deleted tree.
    fn iter_within(&self, start: &[u8], prefix: &[u8]) -> rocksdb::DBIterator<'_> {
        self.db.iterator_opt(IteratorMode::From(start, Direction::Forward), within(prefix))
    }
}

/// Read options that stop an iterator at the last key beginning with `prefix`.
fn within(prefix: &[u8]) -> rocksdb::ReadOptions {
    let mut opts = rocksdb::ReadOptions::default();
    if let Some(end) = prefix_end(prefix) {
        opts.set_iterate_upper_bound(end);
    }
    opts
}

/// The smallest key greater than every key that begins with `prefix` (`None`: no such
/// key, the prefix is all 0xff).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The group-commit thread: takes every batch waiting, writes them as one WriteBatch with
/// one fsync, then completes them all.
fn spawn_committer(
    db: Arc<DB>,
    stats: Arc<Counters>,
    format: Format,
    (ledger_stale, books): (Arc<AtomicBool>, Arc<parking_lot::Mutex<Books>>),
) -> (mpsc::Sender<Queued>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Queued>();
    let thread = std::thread::Builder::new()
        .name("plusfs-commit".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut group = vec![first];
                while let Ok(more) = rx.try_recv() {
                    group.push(more);
                }
                let mut wb = WriteBatch::default();
                for (b, _, _) in &group {
                    to_write_batch(format, b, &mut wb);
                }
                let mut wo = WriteOptions::default();
                wo.set_sync(true);
                let timer = stats.fsync_seconds.start_timer();
                let result = db.write_opt(wb, &wo).map_err(engine);
                timer.observe_duration();
                stats.writes.fetch_add(1, Ordering::Relaxed);
                stats.syncs.fetch_add(1, Ordering::Relaxed);
                if result.is_err() {
                    ledger_stale.store(true, Ordering::Release);
                }
                let mut b = books.lock();
                for (_, _, seq) in &group {
                    b.settle(*seq);
                }
                drop(b);
                for (_, done, _) in group {
                    let _ = done.send(result.as_ref().map(|_| ()).map_err(|e| StoreError::Engine(e.to_string())));
                }
            }
        })
        .expect("spawn committer thread");
    (tx, thread)
}

impl Drop for RocksStore {
    /// Stops the committer thread and waits for it: it holds the engine too, so once the
    /// store is gone the engine is closed (its lock released) and may be opened again.
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.committer.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

impl StoreRead for RocksStore {
    fn get_dir(&self, path: &str) -> Result<Option<DirObject>, StoreError> {
        self.get_object(&dir_key(path))
    }

    fn get_shard(&self, path: &str) -> Result<Option<DirObject>, StoreError> {
        self.get_object(&shard_key(path))
    }

    fn shards_within(&self, root: &str) -> Result<Vec<(String, DirObject)>, StoreError> {
        self.objects_within(b'H', root)
    }

    fn get_entry(&self, dir: Ino, name: &str) -> Result<Option<Inode>, StoreError> {
        let key = entry_key(dir, name);
        match self.db.get_pinned(&key).map_err(engine)? {
            Some(v) => Ok(Some(decode(self.format, &key, &v)?)),
            None => Ok(None),
        }
    }

    fn get_entries(&self, dir: Ino, names: &[&str]) -> Result<Vec<Option<Inode>>, StoreError> {
        let keys: Vec<Vec<u8>> = names.iter().map(|n| entry_key(dir, n)).collect();
        self.db
            .multi_get(&keys)
            .into_iter()
            .zip(&keys)
            .map(|(r, k)| match r.map_err(engine)? {
                Some(v) => Ok(Some(decode(self.format, k, &v)?)),
                None => Ok(None),
            })
            .collect()
    }

    fn list_entries(&self, dir: Ino, after: Option<&str>, limit: usize) -> Result<Vec<(String, Inode)>, StoreError> {
        let prefix = entry_prefix(dir);
        let start = match after {
            // The smallest key strictly greater than (dir, after).
            Some(a) => {
                let mut k = entry_key(dir, a);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut out = Vec::new();
        for item in self.iter_within(&start, &prefix) {
            let (k, v) = item.map_err(engine)?;
            if !k.starts_with(&prefix) || out.len() >= limit {
                break;
            }
            out.push((utf8(&k, &k[9..])?, decode(self.format, &k, &v)?));
        }
        Ok(out)
    }

    fn entry_names(&self, dir: Ino, f: &mut dyn FnMut(&str)) -> Result<(), StoreError> {
        let prefix = entry_prefix(dir);
        let mut it = self.db.raw_iterator_opt(within(&prefix));
        it.seek(&prefix);
        while let Some(k) = it.key() {
            f(utf8_str(k, &k[9..])?);
            it.next();
        }
        it.status().map_err(engine)
    }

    fn dirs_within(&self, root: &str) -> Result<Vec<(String, DirObject)>, StoreError> {
        self.objects_within(b'D', root)
    }

    fn all_entries(&self) -> Result<Vec<(Ino, String, Inode)>, StoreError> {
        let mut out = Vec::new();
        for item in self.scan_prefix(b"E") {
            let (k, v) = item?;
            if k.len() < 9 {
                return Err(StoreError::Corrupt { key: format!("{k:?}"), reason: "short entry key".into() });
            }
            let dir = u64::from_be_bytes(k[1..9].try_into().expect("8 bytes"));
            out.push((dir, utf8(&k, &k[9..])?, decode(self.format, &k, &v)?));
        }
        Ok(out)
    }

    fn get_records(&self, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|&id| record_key(id)).collect();
        self.db.multi_get(&keys).into_iter().map(|r| r.map_err(engine)).collect()
    }

    fn seg_refs(&self, segment: u32) -> Result<Vec<(u64, u64)>, StoreError> {
        let mut prefix = vec![b'G'];
        prefix.extend_from_slice(&segment.to_be_bytes());
        let mut out = Vec::new();
        for item in self.scan_prefix(&prefix) {
            let (k, v) = item?;
            let (Ok(off), Ok(id)) = (<[u8; 8]>::try_from(&k[5..]), <[u8; 8]>::try_from(&v[..])) else {
                return Err(StoreError::Corrupt { key: format!("{k:?}"), reason: "bad segment reference".into() });
            };
            out.push((u64::from_be_bytes(off), u64::from_be_bytes(id)));
        }
        Ok(out)
    }

    fn record_count(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for item in self.scan_prefix(b"R") {
            item?;
            n += 1;
        }
        Ok(n)
    }

    fn usage(&self) -> Result<BTreeMap<Owner, Usage>, StoreError> {
        let mut out = BTreeMap::new();
        for item in self.scan_prefix(b"U") {
            let (k, v) = item?;
            let corrupt = || StoreError::Corrupt { key: format!("{k:?}"), reason: "bad usage counter".into() };
            let id = k.get(2..10).ok_or_else(corrupt)?;
            let owner = Owner::from_key_parts(k[1], u64::from_be_bytes(id.try_into().expect("8 bytes")));
            out.insert(owner.ok_or_else(corrupt)?, Usage::decode(&v).ok_or_else(corrupt)?);
        }
        Ok(out)
    }

    fn tree_records(&self) -> Result<HashMap<Ino, Vec<Ino>>, StoreError> {
        let mut out = HashMap::new();
        for item in self.scan_prefix(b"T") {
            let (k, v) = item?;
            let corrupt = |reason: String| StoreError::Corrupt { key: format!("{k:?}"), reason };
            let ino = k.get(1..9).ok_or_else(|| corrupt("short key".into()))?;
            let trees = postcard::from_bytes(&v).map_err(|e| corrupt(e.to_string()))?;
            out.insert(u64::from_be_bytes(ino.try_into().expect("8 bytes")), trees);
        }
        Ok(out)
    }

    fn get_inode(&self, ino: Ino) -> Result<Option<Inode>, StoreError> {
        let key = inode_key(ino);
        match self.db.get_pinned(&key).map_err(engine)? {
            Some(v) => Ok(Some(decode(self.format, &key, &v)?)),
            None => Ok(None),
        }
    }

    fn all_inodes(&self) -> Result<Vec<Inode>, StoreError> {
        let mut out = Vec::new();
        for item in self.scan_prefix(b"I") {
            let (k, v) = item?;
            out.push(decode(self.format, &k, &v)?);
        }
        Ok(out)
    }

    fn get_counter(&self, name: &str) -> Result<Option<u64>, StoreError> {
        let key = counter_key(name);
        match self.db.get_pinned(&key).map_err(engine)? {
            Some(v) if v.len() == 8 => Ok(Some(u64::from_be_bytes(v[..8].try_into().expect("8 bytes")))),
            Some(_) => Err(StoreError::Corrupt { key: name.into(), reason: "counter is not 8 bytes".into() }),
            None => Ok(None),
        }
    }

    fn get_log(&self, kind: LogKind, txid: TxId) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(log_key(kind, txid)).map_err(engine)
    }

    fn log_records(&self, kind: LogKind) -> Result<Vec<(TxId, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for item in self.scan_prefix(&[kind.prefix()]) {
            let (k, v) = item?;
            if k.len() != 9 {
                return Err(StoreError::Corrupt { key: format!("{k:?}"), reason: "bad log key".into() });
            }
            out.push((u64::from_be_bytes(k[1..9].try_into().expect("8 bytes")), v.to_vec()));
        }
        Ok(out)
    }
}

impl DirStore for RocksStore {
    fn upkeep_room(&self) -> u64 {
        self.flush_needs() + self.compaction_room()
    }

    fn reclaim(&self, free: u64) -> Result<(), StoreError> {
        if let Err(e) = self.takes_writes() {
            return Err(StoreError::Engine(format!("{e}: not flushing (the engine resumes once space returns)")));
        }
        // A flush drops the versions deletes hid within the memtable (only where it fits:
        // one that does not stops the engine); a whole compaction then drops deleted
        // objects from the files on disk, where there is room to rewrite them all (the
        // engine refuses a compaction it has no room for).
        if free < self.flush_needs() {
            return Ok(());
        }
        self.db.flush().map_err(engine)?;
        // What compactions may write: a compaction's output is at most its input, in
        // tables preallocated a tenth past their target size.
        let budget = free.saturating_sub(self.flush_needs()).saturating_sub(TABLE_BYTES + TABLE_BYTES / 10);
        let tables = self.property("rocksdb.total-sst-files-size").unwrap_or(u64::MAX);
        if budget > tables {
            self.db.compact_range::<&[u8], &[u8]>(None, None);
            return Ok(());
        }
        // Too little room to rewrite every table at once: compact the key space piece by
        // piece, each piece's tables fitting the room (deleted objects leave far less).
        // Each step moves past a table's first key: bounded by the tables there are (and a
        // little more, for tables that writes add meanwhile).
        let mut from: Option<Vec<u8>> = None;
        for _ in 0..self.db.live_files().map_err(engine)?.len() * 2 + 16 {
            match next_piece(&self.db.live_files().map_err(engine)?, from.as_deref(), budget) {
                Some(Piece::Compact(to)) => {
                    self.db.compact_range(from.as_deref(), to.as_deref());
                    match to {
                        Some(to) => from = Some(to),
                        None => break,
                    }
                }
                Some(Piece::Skip(to)) => from = Some(to),
                None => break,
            }
        }
        Ok(())
    }

    fn submit(&self, mut batch: Batch) -> Commit {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut books = self.books.lock();
        let seq = match self.account(&mut books, &mut batch) {
            Ok(seq) => seq,
            Err(e) => {
                let _ = tx.send(Err(e));
                return rx;
            }
        };
        if let Some((r, source)) = self.replicator.get() {
            let pieces = match source {
                Some(s) => match s.pieces(&batch) {
                    Ok(p) => p,
                    Err(e) => {
                        books.settle(seq);
                        books.forget();
                        let _ = tx.send(Err(e));
                        return rx;
                    }
                },
                None => Vec::new(),
            };
            let mut wb = WriteBatch::default();
            to_write_batch(self.format, &batch, &mut wb);
            r.replicate(wb.data().to_vec(), pieces, self.settle_when_done(tx, seq));
            return rx;
        }
        match &self.committer {
            Some((c, _)) => {
                if let Err(mpsc::SendError((_, done, _))) = c.send((batch, tx, seq)) {
                    books.settle(seq);
                    let _ = done.send(Err(StoreError::Closed));
                }
            }
            None => {
                let written = self.write_now(&batch);
                books.settle(seq);
                if written.is_err() {
                    books.forget();
                }
                let _ = tx.send(written);
            }
        }
        rx
    }

    fn books(&self) -> &parking_lot::Mutex<Books> {
        &self.books
    }

    fn reads(&self) -> &dyn StoreRead {
        self
    }

    fn latency_histograms(&self) -> Vec<Histogram> {
        vec![self.stats.write_seconds.clone(), self.stats.fsync_seconds.clone()]
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            batches: self.stats.batches.load(Ordering::Relaxed),
            writes: self.stats.writes.load(Ordering::Relaxed),
            syncs: self.stats.syncs.load(Ordering::Relaxed),
        }
    }
}

/// What a reclaim does next with the key space from where it stands.
#[derive(Debug, PartialEq)]
enum Piece {
    /// Compacts up to this key (inclusive; `None`: to the end of the key space).
    Compact(Option<Vec<u8>>),
    /// Steps over the key space up to this key: its tables alone exceed the room.
    Skip(Vec<u8>),
}

/// The next piece of the key space from `from` (inclusive) whose overlapping tables
/// together fit `budget` bytes: as far as the room allows, ending at some table's first
/// key; `None` when nothing is left that may be compacted.
fn next_piece(files: &[rocksdb::LiveFile], from: Option<&[u8]>, budget: u64) -> Option<Piece> {
    // Bytes of the tables a compaction of [from, to] rewrites.
    let bytes = |to: Option<&[u8]>| -> u64 {
        let overlaps = |f: &&rocksdb::LiveFile| {
            let starts_by_end = matches!((to, f.start_key.as_deref()), (Some(to), Some(s)) if s > to);
            let ends_by_start = matches!((from, f.end_key.as_deref()), (Some(from), Some(e)) if e < from);
            !starts_by_end && !ends_by_start
        };
        files.iter().filter(overlaps).map(|f| f.size as u64).sum()
    };
    let rest = bytes(None);
    if rest <= budget {
        return (rest > 0).then_some(Piece::Compact(None));
    }
    let mut bounds: Vec<&[u8]> =
        files.iter().filter_map(|f| f.start_key.as_deref()).filter(|k| from.is_none_or(|f| *k > f)).collect();
    bounds.sort_unstable();
    bounds.dedup();
    match bounds.iter().take_while(|b| bytes(Some(b)) <= budget).last() {
        Some(to) => Some(Piece::Compact(Some(to.to_vec()))),
        None => bounds.first().map(|b| Piece::Skip(b.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit;
    use plusfs_proto::{FileKind, Timespec};

    fn obj(ino: Ino) -> DirObject {
        DirObject {
            ino,
            incarnation: 7,
            mode: 0o755,
            uid: 0,
            gid: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            entries: 0,
            subdirs: 0,
            dist: Default::default(),
            xattrs: Vec::new(),
            ancestry: None,
        }
    }

    fn file(ino: Ino) -> Inode {
        Inode { kind: FileKind::File, mode: 0o644, nlink: 1, ..Inode::subdir(ino) }
    }

    #[test]
    fn a_prefix_ends_at_its_successor() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff]), None);
    }

    /// Listing an empty directory does not step over the deleted entries of directories
    /// after it (RocksDB counts the deleted keys an iterator skips).
    #[tokio::test]
    async fn scans_stop_at_their_prefix_not_past_deleted_keys() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path(), false).unwrap();
        let (mut put, mut del) = (Batch::new(), Batch::new());
        for i in 0..5000 {
            put.put_entry(9, &format!("f{i}"), &file(1000 + i));
            put.put_dir(&format!("/t/d{i}"), &obj(1000 + i));
            del.del_entry(9, &format!("f{i}"));
            del.del_dir(&format!("/t/d{i}"));
        }
        commit(&s, put).await.unwrap();
        commit(&s, del).await.unwrap();
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::EnableCount);
        let mut ctx = rocksdb::perf::PerfContext::default();
        ctx.reset();
        assert!(s.list_entries(8, None, 100).unwrap().is_empty());
        assert!(s.dirs_within("/s").unwrap().is_empty());
        let skipped = ctx.metric(rocksdb::perf::PerfMetric::InternalDeleteSkippedCount);
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
        assert!(skipped < 10, "the scans stepped over {skipped} deleted keys");
    }

    /// A disk with less room than the tables: a reclaim compacts deleted objects away
    /// piece by piece, never rewriting more than the room at once.
    #[tokio::test]
    async fn a_reclaim_without_room_for_every_table_compacts_piece_by_piece() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path(), false).unwrap();
        s.db.set_options(&[("disable_auto_compactions", "true")]).unwrap();
        let tables = |s: &RocksStore| s.db.property_int_value("rocksdb.total-sst-files-size").unwrap().unwrap();
        // Incompressible values (a table may be compressed).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut value = || -> Vec<u8> {
            (0..64 << 10)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        for t in 0..8u64 {
            let mut b = Batch::new();
            for i in 0..32 {
                b.put_record(t * 1000 + i, value());
            }
            commit(&s, b).await.unwrap();
            s.db.flush().unwrap();
        }
        let mut b = Batch::new();
        for t in 0..8u64 {
            for i in 0..32 {
                b.del_record(t * 1000 + i);
            }
        }
        commit(&s, b).await.unwrap();
        let before = tables(&s);
        assert!(before > 16 << 20, "{before} bytes of tables");
        // Room for about three of the eight tables.
        s.reclaim(s.flush_needs() + TABLE_BYTES + TABLE_BYTES / 10 + (7 << 20)).unwrap();
        let after = tables(&s);
        assert!(after < 1 << 20, "{before} bytes of tables before, {after} after");
        assert_eq!(s.get_records(&[3, 7003]).unwrap(), vec![None, None]);
    }

    /// The room kept for compactions does not swing with level 0's cycle while the engine
    /// keeps up, and grows once level 0 holds more than it would then.
    #[tokio::test]
    async fn the_compaction_room_is_steady_and_grows_with_a_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path(), false).unwrap();
        s.db.set_options(&[("disable_auto_compactions", "true")]).unwrap();
        let steady = L0_TRIGGER * WRITE_BUFFER + WRITE_BUFFER + LEVEL1_BYTES + TABLE_BYTES + TABLE_BYTES / 10;
        assert_eq!(s.compaction_room(), steady, "an empty store");
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut put_table = |s: &RocksStore| {
            for i in 0..48u64 {
                let v: Vec<u8> = (0..1 << 20)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                s.db.put(record_key(x ^ i), v).unwrap();
            }
            s.db.flush().unwrap();
        };
        put_table(&s);
        assert_eq!(s.compaction_room(), steady, "one level-0 table");
        for _ in 0..3 {
            put_table(&s);
        }
        assert!(s.compaction_room() > steady, "a backlog of 192 MiB in level 0: {}", s.compaction_room());
        s.takes_writes().unwrap();
    }

    #[tokio::test]
    async fn batches_are_atomic_and_reads_see_them() {
        for always in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let s = RocksStore::open(dir.path(), always).unwrap();
            let mut b = Batch::new();
            b.put_dir("/a", &obj(2));
            b.put_dir("/a/b", &obj(3));
            b.put_dir("/ab", &obj(4));
            for i in 0..10 {
                b.put_entry(2, &format!("f{i}"), &file(100 + i));
            }
            b.put_entry(3, "x", &file(200));
            b.put_counter("next_ino", 42);
            commit(&s, b).await.unwrap();
            assert_eq!(s.get_dir("/a").unwrap().unwrap().ino, 2);
            assert_eq!(s.get_counter("next_ino").unwrap(), Some(42));
            let within: Vec<String> = s.dirs_within("/a").unwrap().into_iter().map(|d| d.0).collect();
            assert_eq!(within, vec!["/a", "/a/b"]);
            let page = s.list_entries(2, None, 4).unwrap();
            assert_eq!(page.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["f0", "f1", "f2", "f3"]);
            let rest = s.list_entries(2, Some("f3"), 100).unwrap();
            assert_eq!(rest.len(), 6);
            assert_eq!(s.all_entries().unwrap().len(), 11);
            let got = s.get_entries(2, &["f9", "nope", "f0"]).unwrap();
            assert_eq!(got.iter().map(|e| e.as_ref().map(|i| i.ino)).collect::<Vec<_>>(), [Some(109), None, Some(100)]);
            assert_eq!(s.stats().syncs, u64::from(always));
        }
    }

    #[tokio::test]
    async fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = RocksStore::open(dir.path(), false).unwrap();
            let mut b = Batch::new();
            b.put_log(LogKind::Coordinator, 5, b"rec".to_vec());
            b.put_entry(1, "f", &file(9));
            commit(&s, b).await.unwrap();
        }
        let s = RocksStore::open(dir.path(), false).unwrap();
        assert_eq!(s.log_records(LogKind::Coordinator).unwrap(), vec![(5, b"rec".to_vec())]);
        assert!(s.log_records(LogKind::Participant).unwrap().is_empty());
        assert_eq!(s.get_entry(1, "f").unwrap(), Some(file(9)));
    }

    #[tokio::test]
    async fn every_log_has_a_key_space_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let s = RocksStore::open(dir.path(), false).unwrap();
        let kinds = [
            LogKind::Coordinator,
            LogKind::Participant,
            LogKind::Cx,
            LogKind::Deleg,
            LogKind::Outbox,
            LogKind::Receipt,
            LogKind::Meta,
            LogKind::ShardMove,
            LogKind::InodeMove,
            LogKind::Quota,
        ];
        let mut b = Batch::new();
        // Objects, shards and entries of every kind of key next to the logs.
        b.put_dir("/a", &DirObject::new(2, 0o755, 0, 0));
        b.put_shard("/a", &DirObject::new(2, 0o755, 0, 0));
        b.put_entry(2, "f", &file(9));
        b.put_inode(&file(10));
        b.put_record(11, b"data".to_vec());
        for (i, k) in kinds.iter().enumerate() {
            b.put_log(*k, i as u64, vec![i as u8]);
        }
        commit(&s, b).await.unwrap();
        for (i, k) in kinds.iter().enumerate() {
            assert_eq!(s.log_records(*k).unwrap(), vec![(i as u64, vec![i as u8])], "{k:?}");
        }
    }

    #[tokio::test]
    async fn records_carry_their_version_and_old_stores_stay_readable() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = RocksStore::open(dir.path(), false).unwrap();
            assert_eq!(s.format, Format(RECORD_VERSION));
            let mut b = Batch::new();
            b.put_dir("/a", &obj(5));
            commit(&s, b).await.unwrap();
            let raw = s.db.get(dir_key("/a")).unwrap().unwrap();
            assert_eq!(raw[0], RECORD_VERSION);
        }
        // A store from before formats: bare records, no format key.
        let old = tempfile::tempdir().unwrap();
        {
            let db = DB::open_default(old.path()).unwrap();
            db.put(dir_key("/b"), postcard::to_allocvec(&obj(9)).unwrap()).unwrap();
        }
        let s = RocksStore::open(old.path(), false).unwrap();
        assert_eq!(s.format, Format(0));
        assert_eq!(s.get_dir("/b").unwrap().unwrap().ino, 9);
        // Bare: a directory object with an ACL element in its ancestry (this layout),
        // and one of the layout before them, both read whole.
        let mut with_acl = obj(13);
        let rule = plusfs_proto::SearchAcl { uid: 5, gid: 5, acl: vec![2, 0, 0, 0] };
        with_acl.ancestry = Some(plusfs_proto::Ancestry::root(plusfs_proto::SearchElem::Acl(rule)));
        s.db.put(dir_key("/acl"), postcard::to_allocvec(&with_acl).unwrap()).unwrap();
        assert_eq!(s.get_dir("/acl").unwrap().unwrap(), with_acl);
        // Bare, of the layout before quota trees (no `quotas` field).
        let body = postcard::to_allocvec(&with_acl).unwrap();
        s.db.put(dir_key("/acl3"), &body[..body.len() - 1]).unwrap();
        assert_eq!(s.get_dir("/acl3").unwrap().unwrap(), with_acl);
        let mut quota = obj(15);
        quota.ancestry = Some(plusfs_proto::Ancestry::root(plusfs_proto::SearchElem::Quota(15)));
        s.db.put(dir_key("/quota"), postcard::to_allocvec(&quota).unwrap()).unwrap();
        assert_eq!(s.get_dir("/quota").unwrap().unwrap(), quota);
        let mut before = obj(14);
        before.ancestry = Some(plusfs_proto::Ancestry::root(plusfs_proto::SearchPerm::of(0o711, 1, 1)));
        let body = postcard::to_allocvec(&before).unwrap();
        s.db.put(dir_key("/before"), &body[..body.len() - 2]).unwrap();
        assert_eq!(s.get_dir("/before").unwrap().unwrap(), before);
        drop(s);
        // A version-1 directory object (no ancestry field) reads with `ancestry: None`.
        let s = RocksStore::open(dir.path(), false).unwrap();
        let mut v1 = vec![1u8];
        let body = postcard::to_allocvec(&obj(11)).unwrap();
        v1.extend_from_slice(&body[..body.len() - 1]);
        s.db.put(dir_key("/v1"), v1).unwrap();
        let read = s.get_dir("/v1").unwrap().unwrap();
        assert_eq!((read.ino, read.ancestry), (11, None));
        // A version-2 directory object (an ancestry without ACL elements) reads whole,
        // in a versioned store and bare in a store from before formats.
        let mut d = obj(12);
        let anc = plusfs_proto::Ancestry::root(plusfs_proto::SearchPerm::of(0o755, 0, 0));
        d.ancestry = Some(anc.with(plusfs_proto::SearchPerm::of(0o700, 5, 5)));
        let body = postcard::to_allocvec(&d).unwrap();
        let v2_body = &body[..body.len() - 2]; // without the empty `acls` and `quotas`
        let mut v2 = vec![2u8];
        v2.extend_from_slice(v2_body);
        s.db.put(dir_key("/v2"), v2).unwrap();
        assert_eq!(s.get_dir("/v2").unwrap().unwrap(), d);
        // A version-3 directory object (no quota trees) reads whole.
        let mut v3 = vec![3u8];
        v3.extend_from_slice(&body[..body.len() - 1]);
        s.db.put(dir_key("/v3"), v3).unwrap();
        assert_eq!(s.get_dir("/v3").unwrap().unwrap(), d);
        // A record of a version this build does not know is refused, not misread.
        s.db.put(dir_key("/c"), [RECORD_VERSION + 1, 0, 0]).unwrap();
        let e = s.get_dir("/c").unwrap_err().to_string();
        assert!(e.contains("record version"), "{e}");
    }
}
