//! The delegation table of one server: delegations by directory (one write delegation,
//! or read delegations of any number of sessions), their records, the requests in flight
//! per directory, and the recalls waiting for their holders.

use parking_lot::{Mutex, MutexGuard};
use plusfs_proto::path::is_within;
use plusfs_proto::Touch;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// What the store keeps about a delegation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stored {
    pub dir: String,
    pub session: u64,
    pub applied_seq: u64,
    /// Unix seconds at which it ended (0: live); ended records answer resent flushes.
    pub ended_at: u64,
    /// A read delegation (no changes may be written back under it).
    pub read: bool,
    /// The incarnation of the distributed directory whose shard here is delegated (`None`:
    /// the directory's home object).
    pub shard: Option<u64>,
    /// The inode numbers leased with it (`docs/protocol.md`, "Delegations").
    pub lease: Lease,
}

/// The inode numbers a write delegation hands its holder: `[first, end)`, of which
/// those below `next` were used by flushes already applied. A flush may create entries
/// only with numbers of its lease, each above the last one used (the holder hands them
/// out in order), and may write contents only to files created under it, so no two
/// files share a number and a holder never writes another file's bytes by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub first: u64,
    pub next: u64,
    pub end: u64,
}

impl Lease {
    /// The lease of `count` numbers from `first`.
    pub fn new(first: u64, count: u32) -> Lease {
        Lease { first, next: first, end: first + count as u64 }
    }

    /// Whether `ino` was leased (a file created under the delegation).
    pub fn holds(&self, ino: u64) -> bool {
        self.first <= ino && ino < self.end
    }

    /// Takes `ino` for a new entry: it must be leased and not used yet (above the last).
    pub fn take(&mut self, ino: u64) -> bool {
        let ok = self.next <= ino && ino < self.end;
        if ok {
            self.next = ino + 1;
        }
        ok
    }
}

/// The record layout before inode leases were recorded (a lease of nothing).
#[derive(Deserialize)]
struct StoredV2 {
    dir: String,
    session: u64,
    applied_seq: u64,
    ended_at: u64,
    read: bool,
    shard: Option<u64>,
}

/// The record layout before read delegations (decoded as a write delegation).
#[derive(Deserialize)]
struct StoredV1 {
    dir: String,
    session: u64,
    applied_seq: u64,
    ended_at: u64,
}

impl Stored {
    /// Format version of the framed record.
    const VERSION: u8 = 3;

    /// The stored form of the record (framed by the engine's record layer).
    pub fn encode(&self) -> Vec<u8> {
        crate::engine::logrec::encode_framed(Stored::VERSION, self)
    }

    /// Decodes a stored record: a framed one, or an unframed one of an older build
    /// (also one written before leases or read delegations existed).
    pub fn decode(bytes: &[u8]) -> Result<Stored, crate::engine::logrec::RecordError> {
        use crate::engine::logrec::{decode_framed, no_upgrade};
        let legacy = |b: &[u8]| Ok(Stored::decode_unframed(b)?);
        decode_framed(bytes, Stored::VERSION, no_upgrade, legacy)
    }

    fn decode_unframed(bytes: &[u8]) -> Result<Stored, postcard::Error> {
        let e = match postcard::from_bytes::<Stored>(bytes) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        if let Ok(v) = postcard::from_bytes::<StoredV2>(bytes) {
            let (dir, session, applied_seq, ended_at) = (v.dir, v.session, v.applied_seq, v.ended_at);
            return Ok(Stored {
                dir,
                session,
                applied_seq,
                ended_at,
                read: v.read,
                shard: v.shard,
                lease: Lease::default(),
            });
        }
        match postcard::from_bytes::<StoredV1>(bytes) {
            Ok(v) => Ok(Stored {
                dir: v.dir,
                session: v.session,
                applied_seq: v.applied_seq,
                ended_at: v.ended_at,
                read: false,
                shard: None,
                lease: Lease::default(),
            }),
            Err(_) => Err(e),
        }
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// What the store says about a delegation (live or ended).
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub dir: String,
    pub session: u64,
    pub applied_seq: u64,
    pub live: bool,
    pub ended_at: u64,
    pub read: bool,
    pub shard: Option<u64>,
    pub lease: Lease,
}

/// A live (or being granted) delegation.
#[derive(Debug)]
struct Deleg {
    id: u64,
    session: u64,
    read: bool,
    shard: Option<u64>,
    /// Being granted: waiting for the requests in flight on its directory.
    granting: bool,
    /// When a recall was first asked for.
    recalled: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    /// Per directory: one write delegation, or read delegations of distinct sessions.
    dirs: HashMap<String, Vec<Deleg>>,
    ids: HashMap<u64, String>,
    records: HashMap<u64, Record>,
    inflight: HashMap<String, usize>,
    recalls: HashMap<u64, Vec<u64>>,
}

/// Counts shown by `cluster status`.
#[derive(Default)]
pub(crate) struct Counters {
    pub recalls: AtomicU64,
    pub revoked: AtomicU64,
    pub flushes: AtomicU64,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct DelegTable {
    inner: Mutex<Inner>,
    changed: Notify,
    pub counters: Counters,
}

/// What a request must do about the delegations on what it touches.
pub(crate) enum Recall {
    /// Nothing delegated to another session: go on.
    Clear,
    /// Recalls are out: wait for a change, at most until then.
    Wait(Instant),
    /// These holders did not answer in time: revoke, then look again.
    Revoke(Vec<u64>),
}

/// A request in flight on some directories; dropping it ends that.
pub(crate) struct InFlight {
    table: Option<Arc<DelegTable>>,
    dirs: Vec<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(t) = self.table.take() else { return };
        let mut idle = false;
        {
            let mut g = t.lock();
            for d in &self.dirs {
                if let Some(n) = g.inflight.get_mut(d) {
                    *n -= 1;
                    if *n == 0 {
                        g.inflight.remove(d);
                        idle |= g.dirs.get(d).is_some_and(|l| l.iter().any(|x| x.granting));
                    }
                }
            }
        }
        if idle {
            t.changed.notify_waiters();
        }
    }
}

impl DelegTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// A future that completes at the next change (enable it before looking).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Adds a delegation read from the store.
    pub fn load(&self, id: u64, s: Stored) {
        let mut g = self.lock();
        let live = s.ended_at == 0;
        if live {
            let d = Deleg { id, session: s.session, read: s.read, shard: s.shard, granting: false, recalled: None };
            g.dirs.entry(s.dir.clone()).or_default().push(d);
            g.ids.insert(id, s.dir.clone());
        }
        let rec = Record {
            dir: s.dir,
            session: s.session,
            applied_seq: s.applied_seq,
            live,
            ended_at: s.ended_at,
            read: s.read,
            shard: s.shard,
            lease: s.lease,
        };
        g.records.insert(id, rec);
    }

    /// Registers a request in flight on the directories of `touched`.
    pub fn enter(self: &Arc<Self>, touched: &[(String, Touch, bool)]) -> InFlight {
        if touched.is_empty() {
            return InFlight { table: None, dirs: Vec::new() };
        }
        let mut dirs: Vec<String> = touched.iter().map(|t| t.0.clone()).collect();
        dirs.sort();
        dirs.dedup();
        let mut g = self.lock();
        for d in &dirs {
            *g.inflight.entry(d.clone()).or_default() += 1;
        }
        InFlight { table: Some(self.clone()), dirs }
    }

    /// Recalls the delegations that sessions other than `session` hold on what `touched`
    /// names (a subtree touch names every directory at or below it): write delegations
    /// for any touch, read delegations for a change.
    pub fn recall_conflicts(&self, touched: &[(String, Touch, bool)], session: u64, timeout: Duration) -> Recall {
        let mut g = self.lock();
        if g.dirs.is_empty() {
            return Recall::Clear;
        }
        let mut hit: Vec<(String, u64)> = Vec::new();
        for (dir, touch, subtree) in touched {
            let change = !matches!(touch, Touch::Read(_));
            let conflicts = |d: &Deleg| d.session != session && (change || !d.read);
            let mut add = |path: &String, list: &Vec<Deleg>| {
                hit.extend(list.iter().filter(|d| conflicts(d)).map(|d| (path.clone(), d.id)))
            };
            if *subtree {
                g.dirs.iter().filter(|(d, _)| is_within(d, dir)).for_each(|(d, l)| add(d, l));
            } else if let Some(l) = g.dirs.get(dir) {
                add(dir, l);
            }
        }
        if hit.is_empty() {
            return Recall::Clear;
        }
        hit.sort_unstable();
        hit.dedup();
        let now = Instant::now();
        let (mut deadline, mut revoke, mut asked) = (now + timeout, Vec::new(), false);
        for (dir, id) in hit {
            let (holder, first) = {
                let x = g.dirs.get_mut(&dir).and_then(|l| l.iter_mut().find(|d| d.id == id)).expect("listed above");
                let first = x.recalled.is_none() && !x.granting;
                let since = *x.recalled.get_or_insert(now);
                if now >= since + timeout && !x.granting {
                    revoke.push(x.id);
                }
                deadline = deadline.min(since + timeout);
                (x.session, first)
            };
            if first {
                g.recalls.entry(holder).or_default().push(id);
                self.counters.recalls.fetch_add(1, Ordering::Relaxed);
                asked = true;
            }
        }
        drop(g);
        if asked {
            self.changed.notify_waiters();
        }
        match revoke.is_empty() {
            true => Recall::Wait(deadline),
            false => Recall::Revoke(revoke),
        }
    }

    /// Starts granting delegation `id` (`read`, or a write delegation; of the shard of
    /// incarnation `shard`, or of the home object) on `dir` to `session`. A write
    /// delegation replaces the session's own read delegation there (returned in `Ok` with
    /// the new id, to end its record). `Err` with a conflicting holder's delegation id: a
    /// write delegation excludes every other delegation.
    pub fn start_grant(
        &self,
        dir: &str,
        id: u64,
        session: u64,
        (read, shard): (bool, Option<u64>),
    ) -> Result<(u64, Option<u64>), u64> {
        let mut g = self.lock();
        let list = g.dirs.entry(dir.to_string()).or_default();
        let clash = list.iter().find(|d| match read {
            true => !d.read || d.session == session,
            false => !(d.read && d.session == session && !d.granting),
        });
        if let Some(d) = clash {
            return Err(d.id);
        }
        let replaced = match read {
            true => None,
            false => list.pop().map(|d| d.id),
        };
        list.push(Deleg { id, session, read, shard, granting: true, recalled: None });
        if let Some(old) = replaced {
            g.ids.remove(&old);
            g.records.remove(&old);
        }
        g.ids.insert(id, dir.to_string());
        Ok((id, replaced))
    }

    /// Whether grant `id` may read its directory now (`Some(true)`), must wait for the
    /// requests in flight on it (`Some(false)`), or was recalled meanwhile (`None`).
    pub fn grant_ready(&self, id: u64) -> Option<bool> {
        let g = self.lock();
        let (dir, x) = g.find(id)?;
        if x.recalled.is_some() {
            return None;
        }
        Some(!g.inflight.contains_key(dir))
    }

    /// Grant `id` is recorded in the store: it is live, unless it was recalled meanwhile
    /// (then `false`, and the caller takes the record back).
    pub fn granted(&self, id: u64, lease: Lease) -> bool {
        let mut g = self.lock();
        let Some(dir) = g.ids.get(&id).cloned() else { return false };
        let Some(x) = g.dirs.get_mut(&dir).and_then(|l| l.iter_mut().find(|d| d.id == id)) else { return false };
        if x.recalled.is_some() {
            return false;
        }
        x.granting = false;
        let (session, read, shard) = (x.session, x.read, x.shard);
        g.records.insert(id, Record { dir, session, applied_seq: 0, live: true, ended_at: 0, read, shard, lease });
        true
    }

    /// Forgets grant `id` (it failed or was recalled before it was given).
    pub fn abandon(&self, id: u64) {
        self.remove(&[id], true);
    }

    /// The record of delegation `id`.
    pub fn record(&self, id: u64) -> Option<Record> {
        self.lock().records.get(&id).cloned()
    }

    /// Flush `seq` of delegation `id` is applied; with `ended` the delegation is over.
    pub fn flushed(&self, id: u64, seq: u64, ended: bool, lease: Lease) {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        {
            let mut g = self.lock();
            if let Some(r) = g.records.get_mut(&id) {
                r.applied_seq = seq;
                r.lease = lease;
                if ended {
                    r.live = false;
                    r.ended_at = unix_now();
                }
            }
        }
        if ended {
            self.remove(&[id], false);
        }
    }

    /// Delegations `ids` were revoked: they and their records go.
    pub fn revoked(&self, ids: &[u64]) {
        self.counters.revoked.fetch_add(ids.len() as u64, Ordering::Relaxed);
        self.remove(ids, true);
    }

    fn remove(&self, ids: &[u64], records: bool) {
        {
            let mut g = self.lock();
            for id in ids {
                if let Some(dir) = g.ids.remove(id) {
                    if let Some(l) = g.dirs.get_mut(&dir) {
                        l.retain(|x| x.id != *id);
                        if l.is_empty() {
                            g.dirs.remove(&dir);
                        }
                    }
                }
                if records {
                    g.records.remove(id);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Ended delegations whose end is before `t` (unix seconds).
    pub fn ended_before(&self, t: u64) -> Vec<u64> {
        self.lock().records.iter().filter(|(_, r)| !r.live && r.ended_at < t).map(|(id, _)| *id).collect()
    }

    /// Drops the records of `ids`.
    pub fn forget(&self, ids: &[u64]) {
        let mut g = self.lock();
        ids.iter().for_each(|id| {
            g.records.remove(id);
        });
    }

    /// The recalls waiting for `session`'s next `DelegWait`.
    pub fn take_recalls(&self, session: u64) -> Vec<u64> {
        self.lock().recalls.remove(&session).unwrap_or_default()
    }

    /// Live delegations.
    pub fn live_count(&self) -> usize {
        self.lock().dirs.values().flatten().filter(|x| !x.granting).count()
    }
}

impl Inner {
    /// Delegation `id` and its directory.
    fn find(&self, id: u64) -> Option<(&String, &Deleg)> {
        let dir = self.ids.get(&id)?;
        let x = self.dirs.get(dir)?.iter().find(|d| d.id == id)?;
        Some((dir, x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write and a read delegation of a home object.
    const W: (bool, Option<u64>) = (false, None);
    const R: (bool, Option<u64>) = (true, None);

    fn touch(dir: &str) -> Vec<(String, Touch, bool)> {
        vec![(dir.to_string(), Touch::Read(None), false)]
    }

    #[test]
    fn a_grant_waits_for_requests_in_flight_and_yields_to_a_recall() {
        let t = Arc::new(DelegTable::default());
        let req = t.enter(&touch("/d"));
        assert_eq!(t.start_grant("/d", 7, 1, W), Ok((7, None)));
        assert_eq!(t.grant_ready(7), Some(false), "a request is in flight on /d");
        drop(req);
        assert_eq!(t.grant_ready(7), Some(true));
        assert!(t.granted(7, Lease::default()));
        assert_eq!(t.start_grant("/d", 8, 2, W), Err(7));
        assert_eq!(t.start_grant("/d", 8, 2, R), Err(7), "a write delegation excludes readers");
        // The holder's own requests pass; another session's recall it.
        assert!(matches!(t.recall_conflicts(&touch("/d"), 1, Duration::from_secs(1)), Recall::Clear));
        assert!(matches!(t.recall_conflicts(&touch("/d"), 2, Duration::from_secs(1)), Recall::Wait(_)));
        assert_eq!(t.take_recalls(1), vec![7]);
        assert!(matches!(t.recall_conflicts(&touch("/d"), 2, Duration::ZERO), Recall::Revoke(ids) if ids == [7]));
        t.revoked(&[7]);
        assert!(t.record(7).is_none());
        assert!(matches!(t.recall_conflicts(&touch("/d"), 2, Duration::from_secs(1)), Recall::Clear));
    }

    #[test]
    fn a_subtree_touch_recalls_everything_below() {
        let t = Arc::new(DelegTable::default());
        t.start_grant("/a/b/c", 1, 1, W).unwrap();
        assert!(t.granted(1, Lease::default()));
        let moved = vec![("/a".to_string(), Touch::Object, true)];
        assert!(matches!(t.recall_conflicts(&moved, 2, Duration::from_secs(1)), Recall::Wait(_)));
        let other = vec![("/ab".to_string(), Touch::Object, true)];
        t.take_recalls(1);
        assert!(matches!(t.recall_conflicts(&other, 2, Duration::from_secs(1)), Recall::Clear));
    }

    #[test]
    fn an_ended_delegation_keeps_answering_its_last_flush() {
        let t = Arc::new(DelegTable::default());
        t.start_grant("/d", 3, 1, W).unwrap();
        assert!(t.granted(3, Lease::default()));
        t.flushed(3, 4, true, Lease::default());
        let r = t.record(3).expect("kept");
        assert!(!r.live && r.applied_seq == 4);
        assert_eq!(t.live_count(), 0);
        assert_eq!(t.start_grant("/d", 5, 2, W), Ok((5, None)));
    }

    fn change(dir: &str) -> Vec<(String, Touch, bool)> {
        vec![(dir.to_string(), Touch::Entry("f".into()), false)]
    }

    #[test]
    fn readers_share_a_directory_until_someone_changes_it() {
        let t = Arc::new(DelegTable::default());
        for (id, session) in [(1, 1), (2, 2)] {
            assert_eq!(t.start_grant("/d", id, session, R), Ok((id, None)));
            assert!(t.granted(id, Lease::default()));
        }
        assert_eq!(t.start_grant("/d", 9, 2, R), Err(2), "one read delegation per session");
        assert_eq!(t.live_count(), 2);
        // Reads of anyone pass; a holder's own change passes (its client knows of it).
        assert!(matches!(t.recall_conflicts(&touch("/d"), 3, Duration::from_secs(1)), Recall::Clear));
        assert!(matches!(t.recall_conflicts(&change("/d"), 1, Duration::from_secs(1)), Recall::Wait(_)));
        assert_eq!(t.take_recalls(2), vec![2], "only the other reader is recalled");
        assert!(t.take_recalls(1).is_empty());
        assert!(matches!(t.recall_conflicts(&change("/d"), 3, Duration::from_secs(1)), Recall::Wait(_)));
        assert_eq!(t.take_recalls(1), vec![1]);
        assert!(t.take_recalls(2).is_empty(), "a recall is asked for once");
        t.flushed(1, 1, true, Lease::default());
        t.flushed(2, 1, true, Lease::default());
        assert!(matches!(t.recall_conflicts(&change("/d"), 3, Duration::from_secs(1)), Recall::Clear));
    }

    #[test]
    fn a_reader_alone_is_upgraded_to_a_writer_and_others_block_it() {
        let t = Arc::new(DelegTable::default());
        t.start_grant("/d", 1, 1, R).unwrap();
        assert!(t.granted(1, Lease::default()));
        assert_eq!(t.start_grant("/d", 2, 1, W), Ok((2, Some(1))), "replaces its own read delegation");
        assert!(t.record(1).is_none());
        assert!(t.granted(2, Lease::default()));
        assert_eq!(t.live_count(), 1);
        t.flushed(2, 1, true, Lease::default());
        for (id, session) in [(3, 1), (4, 2)] {
            t.start_grant("/d", id, session, R).unwrap();
            assert!(t.granted(id, Lease::default()));
        }
        assert_eq!(t.start_grant("/d", 5, 1, W), Err(4), "another session reads it");
    }
}

#[cfg(test)]
mod lease_tests {
    use super::{Lease, Stored};

    #[test]
    fn a_lease_hands_out_each_number_once_in_order() {
        let mut l = Lease::new(100, 3);
        assert!(l.take(100) && l.take(102));
        assert!(!l.take(101), "below the last one used");
        assert!(!l.take(102) && !l.take(103) && !l.take(99), "used, or not leased");
        assert!(l.holds(101) && !l.holds(103));
    }

    #[test]
    fn records_of_every_layout_decode() {
        let s = Stored {
            dir: "/d".into(),
            session: 9,
            applied_seq: 2,
            ended_at: 0,
            read: true,
            shard: Some(4),
            lease: Lease::new(7, 5),
        };
        let round = Stored::decode(&s.encode()).unwrap();
        assert_eq!((round.lease, round.read, round.shard), (s.lease, true, Some(4)));
        let mut torn = s.encode();
        *torn.last_mut().unwrap() ^= 1;
        assert!(Stored::decode(&torn).is_err(), "a flipped bit is refused");
        let round = Stored::decode(&postcard::to_allocvec(&s).unwrap()).unwrap();
        assert_eq!((round.lease, round.read, round.shard), (s.lease, true, Some(4)));
        let v2 = postcard::to_allocvec(&("/d", 9u64, 2u64, 0u64, true, Some(4u64))).unwrap();
        let old = Stored::decode(&v2).unwrap();
        assert_eq!((old.read, old.shard, old.lease), (true, Some(4), Lease::default()), "before leases");
    }
}
