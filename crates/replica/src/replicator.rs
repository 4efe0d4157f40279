//! The bridge from a store to its group: a leader's [`RocksStore`](plusfs_store::RocksStore)
//! hands each batch to [`StoreReplicator`], which appends it to the group's log in the
//! order it came and answers once the batch is committed and applied here. Batches are
//! pipelined, and all those waiting when an entry is made are merged into that entry, so
//! they share its log write and fsync on every member and apply atomically.
//!
//! Once an entry fails, the replicator fails every later batch: a later one must never
//! commit without an earlier one. Its failure answers say the outcome is unknown, since an
//! entry a quorum already holds may still commit under the next leader (the owner of the
//! store gives up its role, as a server that loses its group's leadership does).

use crate::{Command, Raft};
use openraft::error::ClientWriteError;
use plusfs_store::{DataPiece, Replicator, StoreError};
use rocksdb::{WriteBatch, WriteBatchIterator};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

type Done = oneshot::Sender<Result<(), StoreError>>;
/// A batch waiting for the log: its raw RocksDB encoding, the file data it refers to, and
/// where to answer.
struct Pending {
    raw: Vec<u8>,
    data: Vec<DataPiece>,
    done: Done,
}

impl Pending {
    fn bytes(&self) -> usize {
        self.raw.len() + self.data.iter().map(|p| p.bytes.len()).sum::<usize>()
    }
}

/// Most bytes of batches (and their file data) merged into one entry (a bigger batch is an
/// entry of its own).
const MAX_ENTRY_BYTES: usize = 1 << 20;

/// Feeds a store's batches into a group's log, in order.
pub struct StoreReplicator {
    tx: mpsc::UnboundedSender<Pending>,
    failed: Arc<AtomicBool>,
}

/// Copies the puts and deletes of raw batches into one batch, counting them.
struct Merge {
    into: WriteBatch,
    copied: usize,
}

impl WriteBatchIterator for Merge {
    fn put(&mut self, key: Box<[u8]>, value: Box<[u8]>) {
        self.into.put(key, value);
        self.copied += 1;
    }
    fn delete(&mut self, key: Box<[u8]>) {
        self.into.delete(key);
        self.copied += 1;
    }
}

/// A store batch with operations other than put and delete (the store never writes one).
#[derive(Debug, thiserror::Error)]
#[error("a store batch holds operations other than put and delete")]
struct UnmergeableBatch;

/// One batch holding `raws` in order, or why not.
fn merge(mut raws: Vec<Vec<u8>>) -> Result<Vec<u8>, UnmergeableBatch> {
    if raws.len() == 1 {
        return Ok(raws.pop().expect("one"));
    }
    let mut m = Merge { into: WriteBatch::default(), copied: 0 };
    for raw in &raws {
        let b = WriteBatch::from_data(raw);
        let before = m.copied;
        b.iterate(&mut m);
        if m.copied - before != b.len() {
            return Err(UnmergeableBatch);
        }
    }
    Ok(m.into.data().to_vec())
}

/// Splits `data` into whole-piece groups of at most [`MAX_ENTRY_BYTES`] (a piece larger
/// than that alone): all groups but the last, and the last (to travel with the batch).
fn split_data(data: Vec<DataPiece>) -> (Vec<Vec<DataPiece>>, Vec<DataPiece>) {
    let mut groups: Vec<Vec<DataPiece>> = vec![Vec::new()];
    let mut bytes = 0;
    for p in data {
        let last = groups.last_mut().expect("a group");
        if !last.is_empty() && bytes + p.bytes.len() > MAX_ENTRY_BYTES {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += p.bytes.len();
        groups.last_mut().expect("a group").push(p);
    }
    let last = groups.pop().expect("a group");
    (groups, last)
}

fn unknown(cause: &str) -> StoreError {
    StoreError::Replica(format!("outcome unknown, this member no longer writes: {cause}"))
}

fn answer_all(dones: Vec<Done>, r: impl Fn() -> Result<(), StoreError>) {
    for d in dones {
        let _ = d.send(r());
    }
}

impl StoreReplicator {
    /// Starts the task that appends batches to `raft`'s log.
    pub fn new(raft: Raft) -> StoreReplicator {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        let failed = Arc::new(AtomicBool::new(false));
        let flag = failed.clone();
        tokio::spawn(async move {
            let mut next: Option<Pending> = None;
            loop {
                let Some(first) = next.take().or(rx.recv().await) else { return };
                let mut bytes = first.bytes();
                let (mut raws, mut data, mut dones) = (vec![first.raw], first.data, vec![first.done]);
                while bytes < MAX_ENTRY_BYTES {
                    match rx.try_recv() {
                        Ok(p) if bytes + p.bytes() > MAX_ENTRY_BYTES => {
                            next = Some(p);
                            break;
                        }
                        Ok(p) => {
                            bytes += p.bytes();
                            raws.push(p.raw);
                            data.extend(p.data);
                            dones.push(p.done);
                        }
                        Err(_) => break,
                    }
                }
                if flag.load(Ordering::Acquire) {
                    answer_all(dones, || Err(unknown("an earlier batch failed")));
                    continue;
                }
                let batch = match merge(raws) {
                    Ok(b) => b,
                    Err(e) => {
                        answer_all(dones, || Err(StoreError::Replica(e.to_string())));
                        continue;
                    }
                };
                // File data beyond one entry's worth goes first, in entries of its own (a
                // member must store and acknowledge an entry within one heartbeat); placing
                // data is idempotent and records nothing refers to are collected.
                let (head, data) = split_data(data);
                let mut entries: Vec<Command> =
                    head.into_iter().map(|d| Command { batch: Vec::new(), data: d }).collect();
                entries.push(Command { batch, data });
                // Awaited one by one: entries enter the log in commit order. Only the last
                // one's answer matters: it commits after the others.
                let mut answer = None;
                for cmd in entries {
                    match raft.client_write_ff(cmd).await {
                        Ok(a) => answer = Some(a),
                        Err(e) => {
                            flag.store(true, Ordering::Release);
                            answer = None;
                            answer_all(std::mem::take(&mut dones), || Err(unknown(&e.to_string())));
                            break;
                        }
                    }
                }
                let Some(answer) = answer else { continue };
                let flag = flag.clone();
                tokio::spawn(async move {
                    let r = match answer.await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                            Err(Some(format!("leadership lost (leader: {:?})", f.leader_id)))
                        }
                        Ok(Err(e)) => Err(Some(e.to_string())),
                        // The answer was dropped: this member's Raft was halted (the member
                        // stops, and fails the requests still waiting for a commit).
                        Err(_) => Err(None),
                    };
                    if r.is_err() {
                        flag.store(true, Ordering::Release);
                    }
                    answer_all(dones, || match &r {
                        Ok(()) => Ok(()),
                        Err(Some(e)) => Err(unknown(e)),
                        Err(None) => Err(StoreError::Closed),
                    });
                });
            }
        });
        StoreReplicator { tx, failed }
    }

    /// Whether a batch failed: the store behind this replicator writes no more.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

impl Replicator for StoreReplicator {
    fn has_failed(&self) -> bool {
        StoreReplicator::has_failed(self)
    }

    fn replicate(&self, raw: Vec<u8>, data: Vec<DataPiece>, done: Done) {
        if let Err(mpsc::error::SendError(p)) = self.tx.send(Pending { raw, data, done }) {
            let _ = p.done.send(Err(StoreError::Closed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(f: impl FnOnce(&mut WriteBatch)) -> Vec<u8> {
        let mut b = WriteBatch::default();
        f(&mut b);
        b.data().to_vec()
    }

    #[test]
    fn merged_batches_apply_as_the_batches_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let db = rocksdb::DB::open_default(dir.path()).unwrap();
        let one = raw(|b| {
            b.put(b"a", b"1");
            b.put(b"b", b"1");
        });
        let two = raw(|b| {
            b.delete(b"a");
            b.put(b"b", b"2");
            b.put(b"c", b"2");
        });
        let merged = merge(vec![one, two]).unwrap();
        assert_eq!(WriteBatch::from_data(&merged).len(), 5);
        db.write(WriteBatch::from_data(&merged)).unwrap();
        assert_eq!(db.get(b"a").unwrap(), None);
        assert_eq!(db.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(db.get(b"c").unwrap().as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn large_file_data_is_split_into_entries_of_at_most_a_mib() {
        let piece = |n: usize| DataPiece { segment: 1, offset: 0, bytes: vec![0; n] };
        let (head, last) = split_data(vec![piece(600 << 10), piece(600 << 10), piece(2 << 20), piece(10)]);
        let sizes: Vec<Vec<usize>> = head.iter().map(|g| g.iter().map(|p| p.bytes.len()).collect()).collect();
        assert_eq!(sizes, vec![vec![600 << 10], vec![600 << 10], vec![2 << 20]]);
        assert_eq!(last.len(), 1);
        let (head, last) = split_data(Vec::new());
        assert!(head.is_empty() && last.is_empty());
    }

    #[test]
    fn a_batch_with_other_operations_is_refused_not_cut_short() {
        let ranged = raw(|b| b.delete_range(b"a", b"z"));
        let plain = raw(|b| b.put(b"k", b"v"));
        assert!(merge(vec![plain, ranged]).is_err());
    }
}
