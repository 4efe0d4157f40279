//! Concurrency control of one server's directory objects.
//!
//! Two kinds of lock, both per directory path:
//! - *busy*: held by one operation while it reads, checks and commits changes to the
//!   directory (microseconds). Operations that change several directories take their busy
//!   locks in path order, so they cannot deadlock.
//! - *transaction locks*: set by a prepared two-phase-commit sub-operation on one entry name
//!   or on the whole directory, until the transaction commits or aborts. Single-server
//!   operations wait for them; a prepare that meets another transaction's lock votes NO
//!   (the coordinator retries), so transactions never wait on each other.
//!
//! Reads take no locks: they see the last committed state. A Cx operation (see `cx`) holds
//! transaction locks from its execution until its lazy commitment; a request that meets
//! one *urges* it (the hook set with [`LockTable::set_urge`] starts its commitment at once)
//! and reads [`settle`](LockTable::settle) first, so nobody waits for a commitment timer.

use parking_lot::Mutex;
use plusfs_proto::TxId;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a lock or a settling request waits before it logs what is in its way (and
/// again after each further such period): a wait this long means something is stuck.
const SLOW_WAIT: Duration = Duration::from_secs(10);

/// What a lock covers inside a directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Scope {
    Name(String),
    Whole,
}

impl Scope {
    /// What waits for a directory object itself, not its entries: the empty name, which no
    /// lock holds, meets only locks of the whole directory (its creation, removal, move,
    /// re-ancestry).
    pub fn object_only() -> Scope {
        Scope::Name(String::new())
    }
}

#[derive(Default)]
struct DirState {
    busy: bool,
    whole: Option<TxId>,
    names: HashMap<String, TxId>,
}

impl DirState {
    fn is_idle(&self) -> bool {
        !self.busy && self.whole.is_none() && self.names.is_empty()
    }

    /// Every transaction (other than the `owners`) whose lock conflicts with `scope`.
    fn tx_conflicts(&self, scope: &Scope, owners: &[TxId]) -> Vec<TxId> {
        let foreign = |t: &TxId| !owners.contains(t);
        let mut out: Vec<TxId> = self.whole.filter(foreign).into_iter().collect();
        match scope {
            Scope::Name(n) => out.extend(self.names.get(n).copied().filter(foreign)),
            Scope::Whole => out.extend(self.names.values().copied().filter(foreign)),
        }
        out
    }

    /// The transaction (other than the `owners`) whose lock conflicts with `scope`.
    fn tx_conflict(&self, scope: &Scope, owners: &[TxId]) -> Option<TxId> {
        let foreign = |t: &TxId| !owners.contains(t);
        if let Some(t) = self.whole.filter(foreign) {
            return Some(t);
        }
        match scope {
            Scope::Name(n) => self.names.get(n).copied().filter(foreign),
            Scope::Whole => self.names.values().copied().find(foreign),
        }
    }
}

#[derive(Default)]
struct Inner {
    dirs: HashMap<String, DirState>,
    by_tx: HashMap<TxId, Vec<(String, Scope)>>,
}

/// Called with a transaction whose lock another request met, and the transaction of that
/// request if it has one; answers whether the first is a Cx operation (whose commitment it
/// has just hurried).
pub type UrgeHook = Box<dyn Fn(TxId, Option<TxId>) -> bool + Send + Sync>;

/// The lock table of one server.
#[derive(Default)]
pub struct LockTable {
    inner: Mutex<Inner>,
    changed: Notify,
    urge: std::sync::OnceLock<UrgeHook>,
}

/// Held busy locks; dropping releases them.
pub struct Guard {
    table: Arc<LockTable>,
    dirs: Vec<String>,
}

/// A prepare met another transaction's lock.
#[derive(Debug)]
pub struct Conflict(pub TxId);

impl LockTable {
    /// Takes the busy locks of `wanted` (directory, scope) pairs, waiting while another
    /// operation is busy on one of them. Transaction locks of transactions other than
    /// `owner` are waited for when `wait_tx`, else reported as a [`Conflict`].
    pub async fn lock(
        self: &Arc<Self>,
        wanted: &[(String, Scope)],
        owner: Option<TxId>,
        wait_tx: bool,
    ) -> Result<Guard, Conflict> {
        self.lock_noting(wanted, owner, wait_tx, &mut Vec::new()).await
    }

    /// Takes the busy locks of `wanted` for applying the transactions `owners` (their own
    /// transaction locks do not block; others' are waited for).
    pub async fn lock_owned(self: &Arc<Self>, wanted: &[(String, Scope)], owners: &[TxId]) -> Guard {
        self.lock_inner(wanted, owners, true, &mut Vec::new()).await.expect("waiting never conflicts")
    }

    /// Every transaction holding locks now (prepared two-phase commits, pending Cx
    /// operations).
    pub fn transactions(&self) -> Vec<TxId> {
        self.inner.lock().by_tx.keys().copied().collect()
    }

    /// Whether any of `txs` still holds locks.
    pub fn any_held(&self, txs: &[TxId]) -> bool {
        let inner = self.inner.lock();
        txs.iter().any(|t| inner.by_tx.contains_key(t))
    }

    /// Hurries the commitment of transaction `txid` if it is a pending Cx operation.
    pub fn hurry(&self, txid: TxId) {
        self.urge(txid, None);
    }

    /// Sets the hook that hurries a conflicting Cx operation (once, at server start).
    pub fn set_urge(&self, hook: UrgeHook) {
        let _ = self.urge.set(hook);
    }

    fn urge(&self, txid: TxId, waiter: Option<TxId>) -> bool {
        self.urge.get().is_some_and(|h| h(txid, waiter))
    }

    /// [`lock`](Self::lock), also recording in `blockers` every transaction it waited for.
    pub async fn lock_noting(
        self: &Arc<Self>,
        wanted: &[(String, Scope)],
        owner: Option<TxId>,
        wait_tx: bool,
        blockers: &mut Vec<TxId>,
    ) -> Result<Guard, Conflict> {
        let owners: Vec<TxId> = owner.into_iter().collect();
        self.lock_inner(wanted, &owners, wait_tx, blockers).await
    }

    async fn lock_inner(
        self: &Arc<Self>,
        wanted: &[(String, Scope)],
        owners: &[TxId],
        wait_tx: bool,
        blockers: &mut Vec<TxId>,
    ) -> Result<Guard, Conflict> {
        let owner = owners.first().copied();
        let dirs: BTreeSet<String> = wanted.iter().map(|(d, _)| d.clone()).collect();
        let since = Instant::now();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.inner.lock();
                let busy = dirs.iter().any(|d| inner.dirs.get(d).is_some_and(|s| s.busy));
                let conflict =
                    wanted.iter().find_map(|(d, sc)| inner.dirs.get(d).and_then(|s| s.tx_conflict(sc, owners)));
                match (busy, conflict) {
                    (false, None) => {
                        for d in &dirs {
                            inner.dirs.entry(d.clone()).or_default().busy = true;
                        }
                        return Ok(Guard { table: self.clone(), dirs: dirs.into_iter().collect() });
                    }
                    (false, Some(t)) if !wait_tx => {
                        drop(inner);
                        self.urge(t, owner);
                        return Err(Conflict(t));
                    }
                    (_, Some(_)) => {
                        // Hurry every operation in the way at once, not one per wake-up.
                        let all: Vec<TxId> = wanted
                            .iter()
                            .flat_map(|(d, sc)| {
                                inner.dirs.get(d).map(|s| s.tx_conflicts(sc, owners)).unwrap_or_default()
                            })
                            .collect();
                        drop(inner);
                        for t in all {
                            if !blockers.contains(&t) {
                                blockers.push(t);
                            }
                            self.urge(t, owner);
                        }
                    }
                    _ => {}
                }
            }
            if tokio::time::timeout(SLOW_WAIT, notified).await.is_err() {
                let held = self.describe(dirs.iter());
                tracing::warn!(?wanted, ?owner, secs = since.elapsed().as_secs(), %held, "a lock waits long");
            }
        }
    }

    /// Waits until no transaction (Cx operation or two-phase commit) holds a lock
    /// conflicting with `wanted`, hurrying the Cx operations among them. Client requests
    /// call this first: they must not see a state before an operation whose client already
    /// got its answer, nor one an in-doubt transaction is about to change.
    ///
    /// With `all` false only Cx operations are waited for: a request another server
    /// forwards while holding busy locks there (`OnInode`) must not wait for a two-phase
    /// commit whose decision needs those very locks.
    pub async fn settle(&self, wanted: &[(String, Scope)], all: bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let conflicts: Vec<TxId> = {
                let inner = self.inner.lock();
                if inner.by_tx.is_empty() {
                    return;
                }
                wanted
                    .iter()
                    .flat_map(|(d, sc)| inner.dirs.get(d).map(|s| s.tx_conflicts(sc, &[])).unwrap_or_default())
                    .collect()
            };
            let mut cx = false;
            for &t in &conflicts {
                cx |= self.urge(t, None);
            }
            if conflicts.is_empty() || !(all || cx) {
                return;
            }
            tracing::debug!(?wanted, ?conflicts, "a request waits for pending transactions");
            if tokio::time::timeout(SLOW_WAIT, notified).await.is_err() {
                let held = self.describe(wanted.iter().map(|(d, _)| d));
                tracing::warn!(?wanted, %held, "a request waits long for pending transactions");
            }
        }
    }

    /// What holds locks on `dirs`, for the logs: `'/a': busy, tx 7 whole, tx 9 'x'`.
    fn describe<'a>(&self, dirs: impl Iterator<Item = &'a String>) -> String {
        let inner = self.inner.lock();
        let mut out = Vec::new();
        for d in dirs {
            let Some(st) = inner.dirs.get(d) else { continue };
            let mut parts = Vec::new();
            if st.busy {
                parts.push("busy".to_string());
            }
            parts.extend(st.whole.map(|t| format!("tx {t} whole")));
            let mut names: Vec<_> = st.names.iter().map(|(n, t)| format!("tx {t} '{n}'")).collect();
            names.sort();
            parts.extend(names);
            out.push(format!("'{d}': {}", parts.join(", ")));
        }
        out.join("; ")
    }

    /// Records transaction locks for `txid` (the caller holds the busy locks).
    pub fn add_tx_locks(&self, txid: TxId, locks: &[(String, Scope)]) {
        let mut inner = self.inner.lock();
        for (d, sc) in locks {
            let st = inner.dirs.entry(d.clone()).or_default();
            match sc {
                Scope::Whole => st.whole = Some(txid),
                Scope::Name(n) => {
                    st.names.insert(n.clone(), txid);
                }
            }
            inner.by_tx.entry(txid).or_default().push((d.clone(), sc.clone()));
        }
    }

    /// Drops every transaction lock of `txid` and wakes waiters.
    pub fn release_tx(&self, txid: TxId) {
        let mut inner = self.inner.lock();
        for (d, sc) in inner.by_tx.remove(&txid).unwrap_or_default() {
            if let Some(st) = inner.dirs.get_mut(&d) {
                match sc {
                    Scope::Whole if st.whole == Some(txid) => st.whole = None,
                    Scope::Name(n) if st.names.get(&n) == Some(&txid) => {
                        st.names.remove(&n);
                    }
                    _ => {}
                }
                if st.is_idle() {
                    inner.dirs.remove(&d);
                }
            }
        }
        drop(inner);
        self.changed.notify_waiters();
    }

    /// A transaction other than `owner` holding any lock on a directory at or below `root`.
    pub fn tx_locked_within(&self, root: &str, owner: TxId) -> Option<TxId> {
        let inner = self.inner.lock();
        inner
            .by_tx
            .iter()
            .filter(|(t, _)| **t != owner)
            .find(|(_, locks)| locks.iter().any(|(d, _)| plusfs_proto::path::is_within(d, root)))
            .map(|(t, _)| *t)
    }

    /// Number of transactions holding locks here.
    pub fn tx_count(&self) -> usize {
        self.inner.lock().by_tx.len()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut inner = self.table.inner.lock();
        for d in &self.dirs {
            if let Some(st) = inner.dirs.get_mut(d) {
                st.busy = false;
                if st.is_idle() {
                    inner.dirs.remove(d);
                }
            }
        }
        drop(inner);
        self.table.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn w(d: &str, sc: Scope) -> Vec<(String, Scope)> {
        vec![(d.to_string(), sc)]
    }

    #[tokio::test]
    async fn busy_serialises_and_tx_locks_conflict() {
        let t = Arc::new(LockTable::default());
        let g = t.lock(&w("/a", Scope::Whole), None, true).await.unwrap();
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.lock(&w("/a", Scope::Name("x".into())), None, true).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        t.add_tx_locks(9, &w("/a", Scope::Name("x".into())));
        drop(g);
        // Still blocked by the transaction lock on "x".
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        // Another name is free; the whole directory conflicts for a non-waiting prepare.
        drop(t.lock(&w("/a", Scope::Name("y".into())), None, true).await.unwrap());
        assert!(t.lock(&w("/a", Scope::Whole), Some(10), false).await.is_err());
        // The owner itself passes.
        drop(t.lock(&w("/a", Scope::Whole), Some(9), false).await.unwrap());
        t.release_tx(9);
        assert!(waiter.await.unwrap());
        assert_eq!(t.tx_count(), 0);
    }
}
