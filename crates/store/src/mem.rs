//! An in-memory store: the whole [`DirStore`] contract on ordered maps, so the engine and
//! each protocol of a server can be unit-tested without RocksDB or processes, and
//! [`Faults`] a test can inject: failing writes (an I/O error or a full disk), from a
//! given batch on, and a crash that keeps only what was committed (what a restarted
//! server would find).

use crate::usage::{Books, Owner, Usage};
use crate::{Batch, BatchOp, Commit, DirStore, LogKind, StoreError, StoreRead, StoreStats};
use parking_lot::Mutex;
use plusfs_proto::{DirObject, Ino, Inode, TxId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::oneshot;

/// Everything the store holds.
#[derive(Debug, Clone, Default)]
struct State {
    dirs: BTreeMap<String, DirObject>,
    shards: BTreeMap<String, DirObject>,
    entries: BTreeMap<(Ino, String), Inode>,
    inodes: BTreeMap<Ino, Inode>,
    counters: BTreeMap<String, u64>,
    logs: BTreeMap<(u8, TxId), Vec<u8>>,
    records: BTreeMap<u64, Vec<u8>>,
    seg_refs: BTreeMap<(u32, u64), u64>,
    once: BTreeMap<(u64, u64), Vec<u8>>,
    usage: BTreeMap<Owner, Usage>,
    trees: BTreeMap<Ino, Vec<Ino>>,
}

/// What a test makes the store do wrong.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Batches submitted from the `n`th on (counting from 0) fail, applying nothing.
    pub fail_from: Option<u64>,
    /// How they fail: a full disk (`true`) or an I/O error.
    pub no_space: bool,
}

/// A [`DirStore`] in memory.
#[derive(Debug, Default)]
pub struct MemStore {
    state: Mutex<State>,
    faults: Mutex<Faults>,
    /// The quota books (counters as committed, ceilings).
    books: Mutex<Books>,
    batches: AtomicU64,
    writes: AtomicU64,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Makes writes fail as `faults` says (replacing earlier faults).
    pub fn inject(&self, faults: Faults) {
        *self.faults.lock() = faults;
    }

    /// What a server restarted after a crash finds: a new store holding exactly the
    /// batches committed here (a failed batch applied nothing).
    pub fn crashed(&self) -> MemStore {
        MemStore { state: Mutex::new(self.state.lock().clone()), ..MemStore::default() }
    }

    /// Batches this store has committed.
    pub fn committed(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn write(&self, mut batch: Batch) -> Result<(), StoreError> {
        let mut books = self.books.lock();
        let seq = books.account(&mut batch, self, false)?;
        let applied = self.apply(&batch);
        books.settle(seq);
        if applied.is_err() {
            books.forget();
        }
        applied
    }

    fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let n = self.batches.fetch_add(1, Ordering::Relaxed);
        let faults = self.faults.lock().clone();
        if faults.fail_from.is_some_and(|from| n >= from) {
            return Err(match faults.no_space {
                true => StoreError::NoSpace(format!("batch {n}: injected full disk")),
                false => StoreError::Engine(format!("batch {n}: injected I/O error")),
            });
        }
        let mut st = self.state.lock();
        for op in &batch.ops {
            st.apply(op);
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl State {
    fn apply(&mut self, op: &BatchOp) {
        match op {
            BatchOp::PutDir(p, d) => drop(self.dirs.insert(p.clone(), d.clone())),
            BatchOp::DelDir(p) => drop(self.dirs.remove(p)),
            BatchOp::PutShard(p, d) => drop(self.shards.insert(p.clone(), d.clone())),
            BatchOp::DelShard(p) => drop(self.shards.remove(p)),
            BatchOp::PutEntry(dir, name, i) => drop(self.entries.insert((*dir, name.clone()), i.clone())),
            BatchOp::DelEntry(dir, name) => drop(self.entries.remove(&(*dir, name.clone()))),
            BatchOp::PutInode(i) => drop(self.inodes.insert(i.ino, i.clone())),
            BatchOp::DelInode(ino) => drop(self.inodes.remove(ino)),
            BatchOp::PutCounter(name, v) => drop(self.counters.insert(name.to_string(), *v)),
            BatchOp::PutLog(kind, id, v) => drop(self.logs.insert((kind.prefix(), *id), v.clone())),
            BatchOp::DelLog(kind, id) => drop(self.logs.remove(&(kind.prefix(), *id))),
            BatchOp::PutRecord(id, v) => drop(self.records.insert(*id, v.clone())),
            BatchOp::DelRecord(id) => drop(self.records.remove(id)),
            BatchOp::PutSegRef(seg, off, id) => drop(self.seg_refs.insert((*seg, *off), *id)),
            BatchOp::DelSegRef(seg, off) => drop(self.seg_refs.remove(&(*seg, *off))),
            BatchOp::PutOnce(c, s, v) => drop(self.once.insert((*c, *s), v.clone())),
            BatchOp::DelOnce(c, s) => drop(self.once.remove(&(*c, *s))),
            BatchOp::PutUsage(o, u) => drop(self.usage.insert(*o, *u)),
            BatchOp::DelUsage(o) => drop(self.usage.remove(o)),
            BatchOp::PutTrees(ino, t) => drop(self.trees.insert(*ino, t.clone())),
            BatchOp::DelTrees(ino) => drop(self.trees.remove(ino)),
        }
    }
}

fn within<'a>(map: &'a BTreeMap<String, DirObject>, root: &'a str) -> impl Iterator<Item = (String, DirObject)> + 'a {
    map.iter().filter(move |(p, _)| plusfs_proto::path::is_within(p, root)).map(|(p, d)| (p.clone(), d.clone()))
}

impl StoreRead for MemStore {
    fn get_dir(&self, path: &str) -> Result<Option<DirObject>, StoreError> {
        Ok(self.state.lock().dirs.get(path).cloned())
    }
    fn get_shard(&self, path: &str) -> Result<Option<DirObject>, StoreError> {
        Ok(self.state.lock().shards.get(path).cloned())
    }
    fn shards_within(&self, root: &str) -> Result<Vec<(String, DirObject)>, StoreError> {
        Ok(within(&self.state.lock().shards, root).collect())
    }
    fn get_entry(&self, dir: Ino, name: &str) -> Result<Option<Inode>, StoreError> {
        Ok(self.state.lock().entries.get(&(dir, name.to_string())).cloned())
    }
    fn get_entries(&self, dir: Ino, names: &[&str]) -> Result<Vec<Option<Inode>>, StoreError> {
        let st = self.state.lock();
        Ok(names.iter().map(|n| st.entries.get(&(dir, n.to_string())).cloned()).collect())
    }
    fn list_entries(&self, dir: Ino, after: Option<&str>, limit: usize) -> Result<Vec<(String, Inode)>, StoreError> {
        let st = self.state.lock();
        let from = (dir, after.unwrap_or_default().to_string());
        Ok(st
            .entries
            .range(from..)
            .take_while(|((d, _), _)| *d == dir)
            .filter(|((_, n), _)| after.is_none_or(|a| n.as_str() > a))
            .take(limit)
            .map(|((_, n), i)| (n.clone(), i.clone()))
            .collect())
    }
    fn entry_names(&self, dir: Ino, f: &mut dyn FnMut(&str)) -> Result<(), StoreError> {
        let st = self.state.lock();
        for ((_, n), _) in st.entries.range((dir, String::new())..).take_while(|((d, _), _)| *d == dir) {
            f(n);
        }
        Ok(())
    }
    fn dirs_within(&self, root: &str) -> Result<Vec<(String, DirObject)>, StoreError> {
        Ok(within(&self.state.lock().dirs, root).collect())
    }
    fn all_entries(&self) -> Result<Vec<(Ino, String, Inode)>, StoreError> {
        Ok(self.state.lock().entries.iter().map(|((d, n), i)| (*d, n.clone(), i.clone())).collect())
    }
    fn get_inode(&self, ino: Ino) -> Result<Option<Inode>, StoreError> {
        Ok(self.state.lock().inodes.get(&ino).cloned())
    }
    fn all_inodes(&self) -> Result<Vec<Inode>, StoreError> {
        Ok(self.state.lock().inodes.values().cloned().collect())
    }
    fn get_counter(&self, name: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.state.lock().counters.get(name).copied())
    }
    fn get_log(&self, kind: LogKind, txid: TxId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.state.lock().logs.get(&(kind.prefix(), txid)).cloned())
    }
    fn log_records(&self, kind: LogKind) -> Result<Vec<(TxId, Vec<u8>)>, StoreError> {
        let st = self.state.lock();
        let p = kind.prefix();
        Ok(st.logs.range((p, 0)..=(p, TxId::MAX)).map(|((_, id), v)| (*id, v.clone())).collect())
    }
    fn get_records(&self, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let st = self.state.lock();
        Ok(ids.iter().map(|id| st.records.get(id).cloned()).collect())
    }
    fn seg_refs(&self, segment: u32) -> Result<Vec<(u64, u64)>, StoreError> {
        let st = self.state.lock();
        Ok(st.seg_refs.range((segment, 0)..=(segment, u64::MAX)).map(|((_, off), id)| (*off, *id)).collect())
    }
    fn record_count(&self) -> Result<u64, StoreError> {
        Ok(self.state.lock().records.len() as u64)
    }
    fn usage(&self) -> Result<BTreeMap<Owner, Usage>, StoreError> {
        Ok(self.state.lock().usage.clone())
    }
    fn tree_records(&self) -> Result<std::collections::HashMap<Ino, Vec<Ino>>, StoreError> {
        Ok(self.state.lock().trees.iter().map(|(k, v)| (*k, v.clone())).collect())
    }
}

impl DirStore for MemStore {
    fn submit(&self, batch: Batch) -> Commit {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(self.write(batch));
        rx
    }
    fn books(&self) -> &parking_lot::Mutex<Books> {
        &self.books
    }

    fn reads(&self) -> &dyn StoreRead {
        self
    }
    fn stats(&self) -> StoreStats {
        let writes = self.writes.load(Ordering::Relaxed);
        StoreStats { batches: self.batches.load(Ordering::Relaxed), writes, syncs: writes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(ino: Ino) -> DirObject {
        DirObject::new(ino, 0o755, 0, 0)
    }

    #[tokio::test]
    async fn reads_see_committed_batches_in_order() {
        let s = MemStore::new();
        let mut b = Batch::new();
        b.put_dir("/a", &dir(2));
        for n in ["c", "a", "b"] {
            b.put_entry(2, n, &Inode::subdir(10));
        }
        b.del_entry(2, "c");
        crate::commit(&s, b).await.unwrap();
        assert_eq!(s.get_dir("/a").unwrap().unwrap().ino, 2);
        let names: Vec<String> = s.list_entries(2, None, 10).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["a", "b"]);
        let after: Vec<String> = s.list_entries(2, Some("a"), 10).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(after, ["b"]);
    }

    #[tokio::test]
    async fn injected_faults_apply_nothing_and_a_crash_keeps_what_committed() {
        let s = MemStore::new();
        let mut b = Batch::new();
        b.put_counter("next_ino", 5);
        crate::commit(&s, b).await.unwrap();
        s.inject(Faults { fail_from: Some(1), no_space: true });
        let mut b = Batch::new();
        b.put_counter("next_ino", 9);
        b.put_dir("/x", &dir(3));
        assert!(matches!(crate::commit(&s, b).await, Err(StoreError::NoSpace(_))));
        let after = s.crashed();
        assert_eq!(after.get_counter("next_ino").unwrap(), Some(5));
        assert!(after.get_dir("/x").unwrap().is_none());
    }
}
