//! Quota usage, counted by the store in the same batch as each change.
//!
//! Every server counts what it stores: files and bytes per user, per group and per quota
//! tree (a directory whose subtree is limited, named by its inode number). The counts are
//! kept in the store itself (`U` keys) and written in the very batch that changes what
//! they count, so they are exact after any crash, and the cluster's usage is the sum over
//! its servers. A batch's changes are read against the records it replaces; the engine's
//! locks keep two batches that change the same record from being in flight at once.
//!
//! What counts (a file is counted where its inode is, a directory where its object is):
//! - an entry holding its inode (a file, symbolic link or special file): one file and its
//!   size, for its owner, its group and every quota tree its directory lies in;
//! - a hard-linked file's shared inode object: one file and its size for owner and group;
//!   each of its names counts one file (no bytes) in the trees of its directory;
//! - a directory object (not a distributed directory's shards): one file for owner and
//!   group, and one in every quota tree above it (a tree's root is not in its own count);
//! - subdirectory entries count nothing (their directory's object does).
//!
//! Which trees a directory lies in is its ancestry's quota elements; each server keeps
//! them per directory inode (`T` keys) for the entries it stores, from the objects and
//! shards it holds. When they change (a quota set on a populated tree, a directory moved
//! into or out of one) the directory's entries here are charged again in the same batch.

use crate::{Batch, BatchOp, StoreError, StoreRead};
pub use plusfs_proto::quota::{Owner, Usage, UsageMismatch};
use plusfs_proto::{DirObject, FileKind, Ino, Inode};
use std::collections::{BTreeMap, HashMap};

/// The ceilings of the owners whose usage is limited here.
pub type Ceilings = HashMap<Owner, Usage>;

/// An owner's usage and ceiling on one server (see [`crate::DirStore::allowance`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    pub used: Usage,
    pub ceiling: Usage,
    /// How many times the ceiling was shrunk (given back to the master).
    pub shrinks: u64,
}

/// How far `delta` more takes usage `used` past `ceiling`, in the dimensions `delta` grows.
fn past(used: Usage, delta: Usage, ceiling: Usage) -> Usage {
    let now = used.plus(delta);
    let short = |d: i64, now: i64, c: i64| if d > 0 && now > c { now - c } else { 0 };
    Usage { files: short(delta.files, now.files, ceiling.files), bytes: short(delta.bytes, now.bytes, ceiling.bytes) }
}

/// A store's quota books: its ledger (read from the store when first needed, and again
/// after a counted batch failed) and the ceilings of its limited owners.
#[derive(Debug, Default)]
pub struct Books {
    ledger: Option<Ledger>,
    /// Records of batches counted and not yet in the engine.
    flight: InFlight,
    /// The number of the last batch counted.
    seq: u64,
    ceilings: Ceilings,
    shrinks: HashMap<Owner, u64>,
    /// Limited owners a batch that may not be refused took past their ceiling here (the
    /// ceiling is raised to the usage; the master is to learn of it).
    overdrawn: Vec<Owner>,
}

impl Books {
    /// The ledger, read from `store` if it is not loaded (or `stale`).
    fn ledger(&mut self, store: &dyn StoreRead, stale: bool) -> Result<&mut Ledger, StoreError> {
        if stale {
            self.ledger = None;
        }
        if self.ledger.is_none() {
            self.ledger = Some(Ledger::new(store.usage()?, store.tree_records()?));
        }
        Ok(self.ledger.as_mut().expect("loaded"))
    }

    /// Counts `batch` (see [`Ledger::account`]), refusing it if it has `quota` set and
    /// takes a limited owner past its ceiling. A failure other than that leaves the
    /// ledger to be read again.
    /// On success, returns the batch's number, to [`Books::settle`] once it is in the
    /// engine (or failed).
    pub fn account(&mut self, batch: &mut Batch, store: &dyn StoreRead, stale: bool) -> Result<u64, StoreError> {
        let ceilings = std::mem::take(&mut self.ceilings);
        let flight = std::mem::take(&mut self.flight);
        let counted = self.ledger(store, stale).and_then(|l| l.account(batch, (store, &flight), &ceilings));
        self.ceilings = ceilings;
        self.flight = flight;
        match counted {
            Err(StoreError::OverQuota { owner, need, .. }) => {
                Err(StoreError::OverQuota { owner, need, batch: Box::new(std::mem::take(batch)) })
            }
            Err(e) => {
                self.forget();
                Err(e)
            }
            Ok(()) => {
                self.note_overdrawn();
                self.seq += 1;
                self.flight.add(self.seq, batch);
                Ok(self.seq)
            }
        }
    }

    /// Batch `seq` is in the engine (or failed): its records are read from there again.
    pub fn settle(&mut self, seq: u64) {
        self.flight.settle(seq);
    }

    /// Raises every ceiling the usage passed (by a batch that may not be refused: a
    /// decided transaction's commit) to the usage, noting its owner.
    fn note_overdrawn(&mut self) {
        let Some(ledger) = self.ledger.as_ref() else { return };
        let over: Vec<(Owner, Usage)> = self
            .ceilings
            .iter()
            .filter_map(|(o, c)| {
                let u = ledger.used(*o);
                (u.files > c.files || u.bytes > c.bytes)
                    .then(|| (*o, Usage { files: c.files.max(u.files), bytes: c.bytes.max(u.bytes) }))
            })
            .collect();
        for (o, c) in over {
            self.ceilings.insert(o, c);
            if !self.overdrawn.contains(&o) {
                self.overdrawn.push(o);
            }
        }
    }

    /// See [`crate::DirStore::take_overdrawn`].
    pub fn take_overdrawn(&mut self) -> Vec<Owner> {
        std::mem::take(&mut self.overdrawn)
    }

    /// Makes the ledger be read again (a counted batch failed to commit).
    pub fn forget(&mut self) {
        self.ledger = None;
    }

    /// See [`crate::DirStore::limit`].
    pub fn limit(&mut self, owners: &[Owner], store: &dyn StoreRead) -> Result<(), StoreError> {
        let ledger = self.ledger(store, false)?;
        let used: Vec<(Owner, Usage)> = owners.iter().map(|o| (*o, ledger.used(*o))).collect();
        self.ceilings.retain(|o, _| owners.contains(o));
        for (o, u) in used {
            self.ceilings.entry(o).or_insert(u);
        }
        Ok(())
    }

    /// See [`crate::DirStore::shrink`].
    pub fn shrink(&mut self, owner: Owner, store: &dyn StoreRead) -> Result<Usage, StoreError> {
        let used = self.ledger(store, false)?.used(owner);
        if let Some(c) = self.ceilings.get_mut(&owner) {
            *c = used;
            *self.shrinks.entry(owner).or_default() += 1;
        }
        Ok(used)
    }

    /// See [`crate::DirStore::shortfall`].
    pub fn shortfall(&mut self, owner: Owner, delta: Usage, store: &dyn StoreRead) -> Result<Usage, StoreError> {
        let Some(ceiling) = self.ceilings.get(&owner).copied() else { return Ok(Usage::default()) };
        Ok(past(self.ledger(store, false)?.used(owner), delta, ceiling))
    }

    /// See [`crate::DirStore::allowance`].
    pub fn allowance(&mut self, owner: Owner, store: &dyn StoreRead) -> Result<Option<Allowance>, StoreError> {
        let Some(ceiling) = self.ceilings.get(&owner).copied() else { return Ok(None) };
        let used = self.ledger(store, false)?.used(owner);
        Ok(Some(Allowance { used, ceiling, shrinks: self.shrinks.get(&owner).copied().unwrap_or(0) }))
    }

    /// See [`crate::DirStore::raise`].
    pub fn raise(&mut self, owner: Owner, shrinks: u64, to: Usage) -> bool {
        let now = self.shrinks.get(&owner).copied().unwrap_or(0);
        match self.ceilings.get_mut(&owner) {
            Some(c) if now == shrinks => {
                *c = to;
                true
            }
            _ => false,
        }
    }
}

/// A server's counters and the quota trees of the directories it stores entries of.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    usage: HashMap<Owner, Usage>,
    trees: HashMap<Ino, Vec<Ino>>,
}

/// The quota trees of a directory object, as its ancestry says (sorted).
fn trees_of(obj: &DirObject) -> Vec<Ino> {
    obj.ancestry.as_ref().map(|a| a.quota_trees().collect()).unwrap_or_default()
}

/// The records written by batches counted but not yet in the engine (queued for group
/// commit, or replicating), each with the number of the last batch that wrote it: a batch
/// is counted against them, not against the engine's older copy, also when no lock keeps
/// two batches on one record apart.
#[derive(Debug, Default)]
pub struct InFlight {
    entries: HashMap<(Ino, String), (u64, Option<Inode>)>,
    inodes: HashMap<Ino, (u64, Option<Inode>)>,
    dirs: HashMap<String, (u64, Option<DirObject>)>,
}

impl InFlight {
    /// Records what batch `seq` writes.
    fn add(&mut self, seq: u64, batch: &Batch) {
        for op in &batch.ops {
            match op {
                BatchOp::PutEntry(d, n, i) => drop(self.entries.insert((*d, n.clone()), (seq, Some(i.clone())))),
                BatchOp::DelEntry(d, n) => drop(self.entries.insert((*d, n.clone()), (seq, None))),
                BatchOp::PutInode(i) => drop(self.inodes.insert(i.ino, (seq, Some(i.clone())))),
                BatchOp::DelInode(ino) => drop(self.inodes.insert(*ino, (seq, None))),
                BatchOp::PutDir(p, o) => drop(self.dirs.insert(p.clone(), (seq, Some(o.clone())))),
                BatchOp::DelDir(p) => drop(self.dirs.insert(p.clone(), (seq, None))),
                _ => {}
            }
        }
    }

    /// Forgets what batch `seq` wrote (it is in the engine now, or failed) unless a later
    /// batch wrote it again.
    fn settle(&mut self, seq: u64) {
        self.entries.retain(|_, (s, _)| *s != seq);
        self.inodes.retain(|_, (s, _)| *s != seq);
        self.dirs.retain(|_, (s, _)| *s != seq);
    }
}

/// A batch's view of the store: the records as the batch's earlier operations, and the
/// batches in flight before it, left them.
struct Overlay<'a> {
    before: &'a dyn StoreRead,
    flight: &'a InFlight,
    entries: HashMap<(Ino, String), Option<Inode>>,
    inodes: HashMap<Ino, Option<Inode>>,
    dirs: HashMap<String, Option<DirObject>>,
}

impl Overlay<'_> {
    fn entry(&self, dir: Ino, name: &str) -> Result<Option<Inode>, StoreError> {
        let key = (dir, name.to_string());
        match (self.entries.get(&key), self.flight.entries.get(&key)) {
            (Some(e), _) | (None, Some((_, e))) => Ok(e.clone()),
            (None, None) => self.before.get_entry(dir, name),
        }
    }

    fn inode(&self, ino: Ino) -> Result<Option<Inode>, StoreError> {
        match (self.inodes.get(&ino), self.flight.inodes.get(&ino)) {
            (Some(i), _) | (None, Some((_, i))) => Ok(i.clone()),
            (None, None) => self.before.get_inode(ino),
        }
    }

    fn dir(&self, path: &str) -> Result<Option<DirObject>, StoreError> {
        match (self.dirs.get(path), self.flight.dirs.get(path)) {
            (Some(d), _) | (None, Some((_, d))) => Ok(d.clone()),
            (None, None) => self.before.get_dir(path),
        }
    }

    /// Every entry of `dir` as the batch has left them so far.
    fn all_entries(&self, dir: Ino) -> Result<BTreeMap<String, Inode>, StoreError> {
        let mut out: BTreeMap<String, Inode> = self.before.list_entries(dir, None, usize::MAX)?.into_iter().collect();
        let flying = self.flight.entries.iter().map(|(k, (_, e))| (k, e));
        for ((d, name), e) in flying.chain(self.entries.iter()) {
            if *d == dir {
                match e {
                    Some(i) => out.insert(name.clone(), i.clone()),
                    None => out.remove(name),
                };
            }
        }
        Ok(out)
    }
}

/// Usage changes being gathered for one batch.
#[derive(Default)]
struct Deltas(BTreeMap<Owner, Usage>);

impl Deltas {
    fn add(&mut self, owner: Owner, files: i64, bytes: i64) {
        self.0.entry(owner).or_default().add(files, bytes);
    }

    /// `sign` (1 or -1) times what entry `inode` counts, in directory trees `trees`.
    fn entry(&mut self, inode: &Inode, trees: &[Ino], sign: i64) {
        if inode.kind == FileKind::Dir {
            return;
        }
        let bytes = if inode.link_home.is_some() { 0 } else { inode.size as i64 };
        if inode.link_home.is_none() {
            self.owner(inode.uid, inode.gid, sign, sign * bytes);
        }
        for t in trees {
            self.add(Owner::Tree(*t), sign, sign * bytes);
        }
    }

    /// `sign` times what a shared inode object counts.
    fn inode(&mut self, inode: &Inode, sign: i64) {
        self.owner(inode.uid, inode.gid, sign, sign * inode.size as i64);
    }

    /// `sign` times what a directory object counts.
    fn dir(&mut self, obj: &DirObject, sign: i64) {
        self.owner(obj.uid, obj.gid, sign, 0);
        for t in trees_of(obj).into_iter().filter(|t| *t != obj.ino) {
            self.add(Owner::Tree(t), sign, 0);
        }
    }

    fn owner(&mut self, uid: u32, gid: u32, files: i64, bytes: i64) {
        self.add(Owner::Uid(uid), files, bytes);
        self.add(Owner::Gid(gid), files, bytes);
    }
}

impl Ledger {
    /// A ledger holding `usage` and `trees` (as read from a store).
    pub fn new(
        usage: impl IntoIterator<Item = (Owner, Usage)>,
        trees: impl IntoIterator<Item = (Ino, Vec<Ino>)>,
    ) -> Ledger {
        Ledger { usage: usage.into_iter().collect(), trees: trees.into_iter().collect() }
    }

    /// Every counter, by owner.
    pub fn usage(&self) -> BTreeMap<Owner, Usage> {
        self.usage.iter().filter(|(_, u)| !u.is_zero()).map(|(o, u)| (*o, *u)).collect()
    }

    /// The quota trees of directory `dir` as this ledger knows them.
    fn trees(&self, overlay: &HashMap<Ino, Vec<Ino>>, dir: Ino) -> Vec<Ino> {
        overlay.get(&dir).or_else(|| self.trees.get(&dir)).cloned().unwrap_or_default()
    }

    /// Counts `batch` against the store as `before` holds it: appends to it the counter
    /// and tree records it changes, and takes them into this ledger. If the batch then
    /// fails to commit, the ledger must be read from the store again.
    pub fn account(
        &mut self,
        batch: &mut Batch,
        (before, flight): (&dyn StoreRead, &InFlight),
        ceilings: &Ceilings,
    ) -> Result<(), StoreError> {
        let mut view =
            Overlay { before, flight, entries: HashMap::new(), inodes: HashMap::new(), dirs: HashMap::new() };
        let mut trees: HashMap<Ino, Vec<Ino>> = HashMap::new();
        let mut d = Deltas::default();
        for op in &batch.ops {
            match op {
                BatchOp::PutEntry(dir, name, inode) => {
                    let t = self.trees(&trees, *dir);
                    if let Some(old) = view.entry(*dir, name)? {
                        d.entry(&old, &t, -1);
                    }
                    d.entry(inode, &t, 1);
                    view.entries.insert((*dir, name.clone()), Some(inode.clone()));
                }
                BatchOp::DelEntry(dir, name) => {
                    if let Some(old) = view.entry(*dir, name)? {
                        d.entry(&old, &self.trees(&trees, *dir), -1);
                    }
                    view.entries.insert((*dir, name.clone()), None);
                }
                BatchOp::PutInode(inode) => {
                    if let Some(old) = view.inode(inode.ino)? {
                        d.inode(&old, -1);
                    }
                    d.inode(inode, 1);
                    view.inodes.insert(inode.ino, Some(inode.clone()));
                }
                BatchOp::DelInode(ino) => {
                    if let Some(old) = view.inode(*ino)? {
                        d.inode(&old, -1);
                    }
                    view.inodes.insert(*ino, None);
                }
                BatchOp::PutDir(path, obj) => {
                    if let Some(old) = view.dir(path)? {
                        d.dir(&old, -1);
                    }
                    d.dir(obj, 1);
                    view.dirs.insert(path.clone(), Some(obj.clone()));
                    self.retree(obj, &mut trees, &view, &mut d)?;
                }
                BatchOp::DelDir(path) => {
                    if let Some(old) = view.dir(path)? {
                        d.dir(&old, -1);
                    }
                    view.dirs.insert(path.clone(), None);
                }
                BatchOp::PutShard(_, obj) => self.retree(obj, &mut trees, &view, &mut d)?,
                // A repair's counters and tree records are taken as they are.
                BatchOp::PutUsage(owner, u) => drop(self.usage.insert(*owner, *u)),
                BatchOp::DelUsage(owner) => drop(self.usage.remove(owner)),
                BatchOp::PutTrees(ino, t) => drop(self.trees.insert(*ino, t.clone())),
                BatchOp::DelTrees(ino) => drop(self.trees.remove(ino)),
                _ => {}
            }
        }
        if batch.quota {
            self.check(&d, ceilings)?;
        }
        for (ino, t) in trees {
            batch.ops.push(match t.is_empty() {
                true => BatchOp::DelTrees(ino),
                false => BatchOp::PutTrees(ino, t.clone()),
            });
            match t.is_empty() {
                true => self.trees.remove(&ino),
                false => self.trees.insert(ino, t),
            };
        }
        for (owner, delta) in d.0.into_iter().filter(|(_, u)| !u.is_zero()) {
            let u = self.usage.entry(owner).or_default();
            u.add(delta.files, delta.bytes);
            batch.ops.push(match u.is_zero() {
                true => BatchOp::DelUsage(owner),
                false => BatchOp::PutUsage(owner, *u),
            });
        }
        Ok(())
    }

    /// Refuses deltas `d` if they take a limited owner past its ceiling (with an empty
    /// batch in the error, for the caller to fill in).
    fn check(&self, d: &Deltas, ceilings: &Ceilings) -> Result<(), StoreError> {
        for (owner, delta) in &d.0 {
            let Some(ceiling) = ceilings.get(owner) else { continue };
            let need = past(self.used(*owner), *delta, *ceiling);
            if !need.is_zero() {
                return Err(StoreError::OverQuota { owner: *owner, need, batch: Box::default() });
            }
        }
        Ok(())
    }

    /// The usage counted for `owner`.
    pub fn used(&self, owner: Owner) -> Usage {
        self.usage.get(&owner).copied().unwrap_or_default()
    }

    /// Takes the quota trees of `obj` (an object or shard being written) for its inode:
    /// when they change, its entries here are charged to the new trees instead.
    fn retree(
        &self,
        obj: &DirObject,
        trees: &mut HashMap<Ino, Vec<Ino>>,
        view: &Overlay<'_>,
        d: &mut Deltas,
    ) -> Result<(), StoreError> {
        let (old, new) = (self.trees(trees, obj.ino), trees_of(obj));
        if old == new {
            return Ok(());
        }
        for inode in view.all_entries(obj.ino)?.values() {
            d.entry(inode, &old, -1);
            d.entry(inode, &new, 1);
        }
        // Only the tree counts change: owner and group were counted once each way.
        trees.insert(obj.ino, new);
        Ok(())
    }
}

/// Counts everything `store` holds from scratch, by the rules above (what fsck compares
/// the counters with).
pub fn recount(store: &dyn StoreRead, trees: &dyn Fn(Ino) -> Vec<Ino>) -> Result<BTreeMap<Owner, Usage>, StoreError> {
    let mut d = Deltas::default();
    for (dir, _, inode) in store.all_entries()? {
        d.entry(&inode, &trees(dir), 1);
    }
    for inode in store.all_inodes()? {
        d.inode(&inode, 1);
    }
    for (_, obj) in store.dirs_within("/")? {
        d.dir(&obj, 1);
    }
    Ok(d.0.into_iter().filter(|(_, u)| !u.is_zero()).collect())
}

/// The quota trees of every directory whose objects or shards `store` holds (empty for
/// those in none).
pub fn stored_trees(store: &dyn StoreRead) -> Result<HashMap<Ino, Vec<Ino>>, StoreError> {
    let mut out = HashMap::new();
    for (_, obj) in store.dirs_within("/")?.into_iter().chain(store.shards_within("/")?) {
        out.insert(obj.ino, trees_of(&obj));
    }
    Ok(out)
}

/// What a recount of `store` finds: the counters that disagree with what it holds, and
/// the store changes that set them (and the tree records) right.
pub fn check(store: &dyn StoreRead) -> Result<(Vec<UsageMismatch>, Batch), StoreError> {
    let recorded = store.tree_records()?;
    let objects = stored_trees(store)?;
    let trees = |dir: Ino| objects.get(&dir).or_else(|| recorded.get(&dir)).cloned().unwrap_or_default();
    let actual = recount(store, &trees)?;
    let counted = store.usage()?;
    let mut fix = Batch::new();
    let mut out = Vec::new();
    for owner in counted.keys().chain(actual.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (c, a) = (counted.get(owner).copied().unwrap_or_default(), actual.get(owner).copied().unwrap_or_default());
        if c != a {
            out.push(UsageMismatch { owner: *owner, counted: c, actual: a });
            fix.ops.push(match a.is_zero() {
                true => BatchOp::DelUsage(*owner),
                false => BatchOp::PutUsage(*owner, a),
            });
        }
    }
    for (ino, t) in &objects {
        match (t.is_empty(), recorded.get(ino)) {
            (true, Some(_)) => fix.ops.push(BatchOp::DelTrees(*ino)),
            (false, r) if r != Some(t) => fix.ops.push(BatchOp::PutTrees(*ino, t.clone())),
            _ => {}
        }
    }
    Ok((out, fix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStore;
    use crate::{commit, DirStore};
    use plusfs_proto::{Ancestry, SearchElem, SearchPerm};

    fn dir(ino: Ino, uid: u32, trees: &[Ino]) -> DirObject {
        let mut d = DirObject::new(ino, 0o755, uid, uid);
        let mut a = Ancestry::root(SearchPerm::of(0o755, 0, 0));
        for t in trees {
            a = a.with(SearchElem::Quota(*t));
        }
        d.ancestry = Some(a);
        d
    }

    fn file(ino: Ino, uid: u32, size: u64) -> Inode {
        let mut i = Inode::new(ino, FileKind::File, 0o644, uid, uid);
        i.size = size;
        i
    }

    fn used(s: &MemStore, o: Owner) -> (i64, i64) {
        let u = s.usage().unwrap().get(&o).copied().unwrap_or_default();
        (u.files, u.bytes)
    }

    async fn apply(s: &MemStore, f: impl FnOnce(&mut Batch)) {
        let mut b = Batch::new();
        f(&mut b);
        commit(s, b).await.unwrap();
    }

    #[tokio::test]
    async fn counters_follow_creates_resizes_links_removals_and_tree_changes() {
        let s = MemStore::new();
        apply(&s, |b| {
            b.put_dir("/", &dir(1, 0, &[]));
            b.put_dir("/q", &dir(2, 7, &[2]));
            b.put_entry(1, "q", &Inode::subdir(2));
        })
        .await;
        assert_eq!(used(&s, Owner::Uid(7)), (1, 0));
        assert_eq!(used(&s, Owner::Tree(2)), (0, 0), "a tree's root is not in its own count");
        apply(&s, |b| {
            b.put_entry(2, "a", &file(10, 7, 100));
            b.put_entry(2, "b", &file(11, 8, 5));
            b.put_dir("/q/sub", &dir(3, 7, &[2]));
        })
        .await;
        assert_eq!(used(&s, Owner::Tree(2)), (3, 105));
        assert_eq!(used(&s, Owner::Uid(7)), (3, 100));
        assert_eq!(used(&s, Owner::Gid(8)), (1, 5));
        // Grow a file, then replace it by a rename in the same batch.
        apply(&s, |b| b.put_entry(2, "a", &file(10, 7, 300))).await;
        assert_eq!(used(&s, Owner::Uid(7)), (3, 300));
        apply(&s, |b| {
            b.del_entry(2, "b");
            b.put_entry(2, "a", &file(11, 8, 5));
        })
        .await;
        assert_eq!(used(&s, Owner::Uid(7)), (2, 0));
        assert_eq!(used(&s, Owner::Uid(8)), (1, 5));
        assert_eq!(used(&s, Owner::Tree(2)), (2, 5));
        // A hard link: the shared inode counts for its owner, each name one tree file.
        apply(&s, |b| {
            b.put_inode(&file(11, 8, 5));
            b.put_entry(2, "a", &Inode::link(11, FileKind::File, 0));
            b.put_entry(1, "l", &Inode::link(11, FileKind::File, 0));
        })
        .await;
        assert_eq!(used(&s, Owner::Uid(8)), (1, 5));
        assert_eq!(used(&s, Owner::Tree(2)), (2, 0));
        // The quota is lifted from the tree: its entries here leave the tree's count.
        apply(&s, |b| b.put_dir("/q", &dir(2, 7, &[]))).await;
        assert_eq!(used(&s, Owner::Tree(2)), (1, 0), "the subdirectory's object still names the tree");
        apply(&s, |b| b.put_dir("/q/sub", &dir(3, 7, &[]))).await;
        assert_eq!(used(&s, Owner::Tree(2)), (0, 0));
        assert!(s.tree_records().unwrap().is_empty());
        // And set again: the entries already there are counted in the same batch.
        apply(&s, |b| b.put_dir("/q", &dir(2, 7, &[2]))).await;
        assert_eq!(used(&s, Owner::Tree(2)), (1, 0));
        assert!(s.check_usage().unwrap().0.is_empty(), "counters equal a recount");
    }

    #[tokio::test]
    async fn a_recount_finds_and_repairs_a_wrong_counter() {
        let s = MemStore::new();
        apply(&s, |b| {
            b.put_dir("/", &dir(1, 0, &[]));
            b.put_entry(1, "f", &file(5, 3, 42));
        })
        .await;
        apply(&s, |b| b.ops.push(BatchOp::PutUsage(Owner::Uid(3), Usage { files: 9, bytes: 1 }))).await;
        let (found, fix) = s.check_usage().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].actual, Usage { files: 1, bytes: 42 });
        commit(&s, fix).await.unwrap();
        assert!(s.check_usage().unwrap().0.is_empty());
        apply(&s, |b| b.del_entry(1, "f")).await;
        assert_eq!(used(&s, Owner::Uid(3)), (0, 0), "the ledger took the repair's counters");
    }
}
