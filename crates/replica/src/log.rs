//! The Raft log of one member, with its vote, commit point and purge point, in a RocksDB
//! of its own. Keys: `l` + big-endian index → entry; `m:vote`, `m:committed`, `m:purged`.
//! Every write is synced before Raft is told it is durable (appends unless the operator
//! opted out, `Timing::fsync_log`).

use crate::{MemberId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use rocksdb::{Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

type SErr = StorageError<MemberId>;

const VOTE: &[u8] = b"m:vote";
const COMMITTED: &[u8] = b"m:committed";
const PURGED: &[u8] = b"m:purged";

fn log_key(index: u64) -> [u8; 9] {
    let mut k = [b'l'; 9];
    k[1..].copy_from_slice(&index.to_be_bytes());
    k
}

fn read_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::read_logs(&std::io::Error::other(e.to_string())).into()
}

fn write_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_logs(&std::io::Error::other(e.to_string())).into()
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, SErr> {
    postcard::to_allocvec(v).map_err(write_err)
}

pub(crate) fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, SErr> {
    postcard::from_bytes(b).map_err(read_err)
}

pub(crate) fn synced() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

/// A member's log (cheap to clone: replication tasks read it while Raft appends).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    /// Appends are fsynced (unless the operator opted out: then they are written to the
    /// OS only, and survive a process crash but not a power loss of a quorum).
    fsync_appends: bool,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`.
    pub fn open(dir: &Path, fsync_appends: bool) -> Result<LogStore, crate::StoreOpenError> {
        let mut o = Options::default();
        o.create_if_missing(true);
        let db = DB::open(&o, dir)
            .map_err(crate::StoreOpenError::rocks(format!("cannot open the Raft log {}", dir.display())))?;
        Ok(LogStore { db: Arc::new(db), fsync_appends })
    }

    fn meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, SErr> {
        self.db.get(key).map_err(read_err)?.map(|v| decode(&v)).transpose()
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], v: &T) -> Result<(), SErr> {
        self.db.put_opt(key, encode(v)?, &synced()).map_err(write_err)
    }

    fn last_entry(&self) -> Result<Option<Entry<TypeConfig>>, SErr> {
        let end = log_key(u64::MAX);
        let mut it = self.db.iterator(IteratorMode::From(&end, Direction::Reverse));
        match it.next() {
            Some(Ok((k, v))) if k.first() == Some(&b'l') => Ok(Some(decode(&v)?)),
            Some(Err(e)) => Err(read_err(e)),
            _ => Ok(None),
        }
    }

    /// Deletes entries with index in `from..to`.
    fn delete_range(&self, from: u64, to: u64) -> Result<(), SErr> {
        let mut b = WriteBatch::default();
        b.delete_range(log_key(from), log_key(to));
        self.db.write_opt(b, &synced()).map_err(write_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let from = log_key(start);
        let mut out = Vec::new();
        for kv in self.db.iterator(IteratorMode::From(&from, Direction::Forward)) {
            let (k, v) = kv.map_err(read_err)?;
            if k.first() != Some(&b'l') || k.len() != 9 {
                break;
            }
            let index = u64::from_be_bytes(k[1..9].try_into().expect("8 bytes"));
            if !range.contains(&index) {
                break;
            }
            out.push(decode(&v)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let purged: Option<LogId<MemberId>> = self.meta(PURGED)?;
        let last = self.last_entry()?.map(|e| e.log_id).or(purged);
        Ok(LogState { last_purged_log_id: purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<MemberId>) -> Result<(), SErr> {
        self.put_meta(VOTE, vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<MemberId>>, SErr> {
        self.meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<MemberId>>) -> Result<(), SErr> {
        // Not synced: a lost commit point is found again from the leader.
        self.db.put(COMMITTED, encode(&committed)?).map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<MemberId>>, SErr> {
        Ok(self.meta::<Option<LogId<MemberId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut b = WriteBatch::default();
        for e in entries {
            b.put(log_key(e.log_id.index), encode(&e)?);
        }
        let r = match self.fsync_appends {
            true => self.db.write_opt(b, &synced()),
            false => self.db.write(b),
        };
        let io = r.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string()));
        callback.log_io_completed(io);
        r.map_err(write_err)
    }

    async fn truncate(&mut self, log_id: LogId<MemberId>) -> Result<(), SErr> {
        self.delete_range(log_id.index, u64::MAX)
    }

    async fn purge(&mut self, log_id: LogId<MemberId>) -> Result<(), SErr> {
        // The purge point first: a crash between the two leaves entries below it, which
        // are never read again.
        self.put_meta(PURGED, &log_id)?;
        self.delete_range(0, log_id.index + 1)
    }
}
