//! Directory delegations on the client side (`docs/semantics.md`, "Delegations").
//!
//! When a client that asked for them ([`ClientOptions::delegations`](crate::ClientOptions))
//! changes a directory a second time within a short while, or a first time right after
//! making it, it asks the directory's home for a write delegation. While it holds one
//! ([`Held`]) it knows the directory's whole entry set: `lookup`s of names (present or
//! missing), creates, small-file writes, `setattr`s, unlinks and renames inside the
//! directory are answered here (`local.rs`) and queued as [`DelegOp`]s. The queue is
//! written back as one `DelegFlush` per directory: within the cluster's `[delegations]
//! writeback_ms` (1 s), when it grows past `MAX_OPS` or `MAX_BYTES` (`held.rs`), before
//! any request of this client that touches the directory another way (so the servers see
//! this client's operations in order), on `fsync` and [`Client::sync`](crate::Client::sync),
//! and when the server recalls the delegation because another client needs the directory
//! (answered through a `DelegWait` long poll per server, which also renews the lease
//! under which it answers locally). A flush that fails in transit is resent with the same
//! number, so the server applies it once. Work the server refused (the delegation was
//! revoked because this client did not answer a recall in time) is reported as EIO by the
//! next `fsync` or `sync`.
//!
//! A directory this client reads often (`READ_BURST_OPS` reads sent to its server within
//! `BURST`) gets a *read delegation* instead, shared with other readers: lookups, listings,
//! stats and opens are answered from it, changes go to the server (and a second change
//! asks for a write delegation, which replaces it).

mod held;
mod local;

pub(crate) use held::Held;
pub(crate) use held::{Found, Local};
pub(crate) use local::NewEntry;

use crate::error::FsError;
use plusfs_placement::ClusterMap;
use plusfs_proto::{
    Attr, Cred, DelegGrant, DelegOp, Errno, FileKind, Flushed, Reply, Request, ServerId, Touch, WireError,
};
use plusfs_rpc::Pool;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// A delegation unused this long is returned.
const IDLE: Duration = Duration::from_secs(3);
/// Most delegations held at once.
const MAX_HELD: usize = 512;
/// A directory whose delegation was refused is not asked for again before this.
const REFUSED_FOR: Duration = Duration::from_secs(2);
/// Changes of a directory within [`BURST`] after which a write delegation is asked for.
const BURST_OPS: u32 = 2;
/// Reads of a directory sent to its server within [`BURST`] after which a read
/// delegation is asked for.
const READ_BURST_OPS: u32 = 4;
const BURST: Duration = Duration::from_secs(2);
/// Directories whose recent changes are counted (older ones are forgotten beyond this).
const MAX_ACTIVITY: usize = 4096;
/// How long the attributes of a distributed directory its home gave are combined with
/// the counts of its delegated shards (about the kernel's attribute timeout).
const DIST_ATTR_TTL: Duration = Duration::from_secs(1);
/// How long a flush is resent while its server cannot be reached.
const FLUSH_PATIENCE: Duration = Duration::from_secs(30);
/// How long the write-back ahead of another request is resent while its server cannot be
/// reached: about as long as a replica group takes to fail over under load (the request
/// itself would wait for the next leader as long).
const BEFORE_PATIENCE: Duration = Duration::from_secs(10);

type Slot = Arc<tokio::sync::Mutex<Held>>;

/// Told the directory of a delegation ending (about to be returned, revoked, its lease
/// lapsed) under which a mount let the kernel keep names or attributes longer than its
/// usual TTL (`Client::on_delegation_end`). It must not block: the kernel may need a lock
/// that a request waiting for this delegation holds.
pub type EndWatcher = Arc<dyn Fn(&str) + Send + Sync>;

/// Directories whose last batch stat through the servers is remembered.
const MAX_UNLEARNT_DIRS: usize = 16;

/// What the home of a distributed directory last said of it: its attributes, when, and
/// (server, delegation, entries, subdirectories) of each shard this client held then.
struct DistAttr {
    attr: Attr,
    at: Instant,
    shards: Vec<(ServerId, u64, u64, u64)>,
}

/// What a delegation is of: a directory's home object, or one storing server's shard of a
/// distributed directory (the entries whose names Eq. 2 places there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// The server that grants it.
    pub server: ServerId,
    /// The distributed directory's incarnation, for a shard.
    pub shard: Option<u64>,
    /// For a shard: its index in the storing set and the set's size (which names Eq. 2
    /// places there). Not part of what the delegation is found by.
    pub slot: Option<(usize, usize)>,
}

/// How delegations are found: the directory, and the storing server for a shard.
type Key = (String, Option<ServerId>);

fn key(dir: &str, t: Target) -> Key {
    (dir.to_string(), t.shard.map(|_| t.server))
}

/// The name under which uses of `dir` through `t` are counted.
fn activity_key(dir: &str, t: Target) -> String {
    match t.shard {
        None => dir.to_string(),
        Some(_) => format!("{dir}\0{}", t.server),
    }
}

/// Recent uses of a directory: (count, first, delegation refused until).
type Activity = (u32, Instant, Option<Instant>);

/// Counts a use of `dir` in `map`; true when `burst` uses came within [`BURST`] and no
/// refusal is recent.
fn bump(map: &mut HashMap<String, Activity>, dir: &str, burst: u32) -> bool {
    let now = Instant::now();
    if map.len() > MAX_ACTIVITY {
        map.retain(|_, (_, first, refused)| now - *first < BURST || refused.is_some_and(|r| r > now));
    }
    let a = map.entry(dir.to_string()).or_insert((0, now, None));
    if a.2.is_some_and(|r| r > now) {
        return false;
    }
    if now - a.1 > BURST {
        *a = (0, now, None);
    }
    a.0 += 1;
    a.0 >= burst
}

#[derive(Default)]
struct State {
    held: HashMap<Key, Slot>,
    /// What each delegation held is of, by id.
    ids: HashMap<u64, Key>,
    /// Recent changes per directory without a write delegation: (count, first, refused
    /// until).
    activity: HashMap<String, Activity>,
    /// Recent reads sent to the servers per directory not delegated, the same way.
    reads: HashMap<String, Activity>,
    /// Servers with a running recall listener.
    listening: HashSet<ServerId>,
    /// Per server, when the last `DelegWait` that was answered was sent: no recall the
    /// server made before answering went unseen, so none of its delegations can be
    /// revoked before that time plus the recall timeout.
    polled: HashMap<ServerId, Instant>,
    /// Recalls of delegations not installed yet (their grant still in transit).
    early: HashSet<u64>,
    /// The attributes the home of a distributed directory last gave, when, and the
    /// counts of the shards this client held then.
    dist_attrs: HashMap<String, DistAttr>,
    /// The names of the last batch stat of a distributed directory that the servers
    /// answered for shards not delegated here, per directory (see `unlearnt`).
    unlearnt: HashMap<String, Vec<String>>,
    /// Delegations under which a mount let the kernel keep names or attributes beyond
    /// its usual TTL (`Client::kernel_cacheable`), by id: (directory, server, asked). Kept
    /// here, not in the delegation, so a lapsed lease is seen without its lock.
    kernel_cached: HashMap<u64, (String, ServerId, Instant)>,
    background: bool,
}

/// The delegations of one client (shared by its clones).
pub(crate) struct Delegations {
    pool: Arc<Pool>,
    map: Arc<ClusterMap>,
    session: u64,
    state: Mutex<State>,
    /// Work refused by a server, reported by the next sync.
    lost: Mutex<Vec<String>>,
    /// Operations the servers have applied from this client's flushes.
    written: AtomicU64,
    /// How much work delegations cost here: see [`DelegWork`].
    work: [AtomicU64; 4],
    /// Told of the end of delegations under which a kernel kept names longer.
    watcher: std::sync::OnceLock<EndWatcher>,
}

/// Counts of the work this client's delegations did, which must follow what changed, not
/// the size of the directories (`plusfs mount --stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelegWork {
    /// Entries write-backs looked at.
    pub visited: u64,
    /// Delegations granted.
    pub grants: u64,
    /// Entries and name digests the grants carried.
    pub granted: u64,
    /// Entries asked of the servers for delegations granted with digests.
    pub learnt: u64,
}

impl Delegations {
    pub fn new(pool: Arc<Pool>, map: Arc<ClusterMap>, session: u64) -> Arc<Delegations> {
        Arc::new(Delegations {
            pool,
            map,
            session,
            state: Mutex::default(),
            lost: Mutex::default(),
            written: AtomicU64::new(0),
            work: Default::default(),
            watcher: std::sync::OnceLock::new(),
        })
    }

    /// Sets who is told of the end of delegations under which a kernel kept names longer
    /// (once per client; false if one was set already).
    pub fn watch_ends(&self, watcher: EndWatcher) -> bool {
        self.watcher.set(watcher).is_ok()
    }

    /// Tells the end watcher that what the kernel kept under `h` must go, if it kept any.
    fn uncache(&self, h: &Held) {
        let cached = self.state().kernel_cached.remove(&h.id).is_some();
        if let (true, Some(w)) = (cached, self.watcher.get()) {
            w(&h.dir);
        }
    }

    /// Records that a kernel keeps names or attributes under `h` (locked, leased) beyond
    /// its usual TTL: its end will be told to the end watcher.
    pub fn kernel_caches(&self, h: &Held) {
        self.state().kernel_cached.insert(h.id, (h.dir.clone(), h.server, h.asked));
    }

    /// Tells the end watcher of every delegation the kernel keeps names under whose lease
    /// lapsed (cut off from its server longer than the server waits for a recall: it may
    /// have been revoked, and the directory changed by others since). Needs no
    /// delegation's lock, so a delegation busy with a long write-back is not missed.
    fn uncache_lapsed(&self) {
        let lapsed: Vec<String> = {
            let limit = self.recall_timeout() * 9 / 10;
            let mut st = self.state();
            let State { kernel_cached, polled, .. } = &mut *st;
            let mut out = Vec::new();
            kernel_cached.retain(|_, (dir, server, asked)| {
                let since = polled.get(server).map_or(*asked, |p| (*p).max(*asked));
                let keep = since.elapsed() < limit;
                if !keep {
                    out.push(dir.clone());
                }
                keep
            });
            out
        };
        if let Some(w) = self.watcher.get() {
            lapsed.iter().for_each(|dir| w(dir));
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("delegations")
    }

    /// The credential this client's own delegation requests carry.
    fn cred(&self) -> Cred {
        Cred { session: self.session, ..Cred::server() }
    }

    /// The delegation held on `dir` (through `t`), if any.
    pub fn held(&self, dir: &str, t: Target) -> Option<Slot> {
        let st = self.state();
        if st.held.is_empty() {
            return None;
        }
        st.held.get(&key(dir, t)).cloned()
    }

    /// Whether `h` may still be used here: the server cannot have revoked it yet. A
    /// holder that was stopped (or cut off) longer than the recall timeout stops answering
    /// locally until its recall listener hears from the server again; meanwhile its calls
    /// go to the servers, after writing back (or losing) its queue.
    pub fn leased(&self, h: &Held) -> bool {
        let since = self.state().polled.get(&h.server).map_or(h.asked, |p| (*p).max(h.asked));
        since.elapsed() < self.recall_timeout() * 9 / 10
    }

    fn recall_timeout(&self) -> Duration {
        self.map.delegations.recall_timeout()
    }

    /// Number of delegations held.
    pub fn count(&self) -> usize {
        self.state().held.len()
    }

    /// Changes not yet written back: queued operations, files whose contents changed, and
    /// a flush sent but not answered (a delegation busy this moment counts as none).
    pub fn pending(&self) -> usize {
        let slots: Vec<Slot> = self.state().held.values().cloned().collect();
        slots.iter().filter_map(|s| s.try_lock().ok()).map(|h| h.unflushed()).sum()
    }

    /// Operations written back and applied by the servers since this client started.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// The work this client's delegations did since it started.
    pub fn work(&self) -> DelegWork {
        let [visited, grants, granted, learnt] = self.work.each_ref().map(|c| c.load(Ordering::Relaxed));
        DelegWork { visited, grants, granted, learnt }
    }

    /// The delegation on `dir` for a change about to be made by `caller`: the write
    /// delegation held, or a new one when the directory changes often (see the module
    /// documentation), which replaces a read delegation held.
    pub async fn for_change(self: &Arc<Self>, dir: &str, caller: &Cred, t: Target) -> Option<Slot> {
        let held = self.held(dir, t);
        if let Some(h) = &held {
            if !h.lock().await.read {
                return held;
            }
        }
        let wants = {
            let mut st = self.state();
            // A shard of a directory whose other shards are delegated here: its first
            // change asks too (a client filling a distributed directory needs them all).
            let sibling = t.shard.is_some() && st.held.keys().any(|(d, s)| d == dir && s.is_some());
            let burst = if sibling { 1 } else { BURST_OPS };
            (held.is_some() || st.held.len() < MAX_HELD) && bump(&mut st.activity, &activity_key(dir, t), burst)
        };
        if !wants {
            return None;
        }
        let new = self.acquire(dir, caller, t, false).await;
        if let (Some(old), None) = (held, &new) {
            // The server may have ended the read delegation with the refused upgrade.
            self.release_slot(&old).await;
        }
        new
    }

    /// The delegation on `dir` for a read about to be sent to its server: the one held,
    /// or a new read delegation when this client reads the directory often.
    pub async fn for_read(self: &Arc<Self>, dir: &str, caller: &Cred, t: Target) -> Option<Slot> {
        if let Some(h) = self.held(dir, t) {
            return Some(h);
        }
        let wants = {
            let mut st = self.state();
            st.held.len() < MAX_HELD && bump(&mut st.reads, &activity_key(dir, t), READ_BURST_OPS)
        };
        if !wants {
            return None;
        }
        self.acquire(dir, caller, t, true).await
    }

    /// Keeps the attributes the home of distributed directory `dir` gave (after this
    /// client wrote its shards' queued work back), with the counts of the shards held now.
    pub async fn learn_dist_attr(&self, dir: &str, a: &Attr) {
        let slots: Vec<(ServerId, Slot)> = {
            let st = self.state();
            st.held
                .iter()
                .filter(|((d, s), _)| d == dir && s.is_some())
                .map(|((_, s), h)| (s.unwrap(), h.clone()))
                .collect()
        };
        let mut shards = Vec::with_capacity(slots.len());
        for (server, slot) in slots {
            let mut h = slot.lock().await;
            if h.gone {
                return;
            }
            // The home's counts include what was sent to the shard's server: from here on
            // only this client's changes move them (kept as differences from now).
            h.dir_stale = false;
            shards.push((server, h.id, h.obj.entries, h.obj.subdirs));
        }
        let mut st = self.state();
        if st.dist_attrs.len() >= MAX_ACTIVITY {
            st.dist_attrs.retain(|_, d| d.at.elapsed() < DIST_ATTR_TTL);
        }
        st.dist_attrs.insert(dir.to_string(), DistAttr { attr: a.clone(), at: Instant::now(), shards });
    }

    /// The attributes of distributed directory `dir` (of incarnation `incarnation`) when
    /// its home gave them less than [`DIST_ATTR_TTL`] ago and this client still holds the
    /// same shards as then: those, with the entry and subdirectory counts moved by what
    /// this client changed in those shards since, and the latest change time. A kernel
    /// that checks the directory's permissions before each create or unlink in it (its
    /// copy dropped by the one before) is answered here, not by a round of every storing
    /// server; a shard taken or returned since means asking the home again.
    pub async fn dist_dir_attr(&self, dir: &str, incarnation: u64) -> Option<Attr> {
        let (mut a, shards, held) = {
            let st = self.state();
            let d = st.dist_attrs.get(dir).filter(|d| d.at.elapsed() < DIST_ATTR_TTL)?;
            let held = st.held.keys().filter(|(k, s)| k == dir && s.is_some()).count();
            (d.attr.clone(), d.shards.clone(), held)
        };
        if shards.is_empty() || held != shards.len() {
            return None;
        }
        let (mut size, mut subdirs) = (a.size as i64, (a.nlink as i64 - 2).max(0));
        for (server, id, entries, dirs) in shards {
            let slot = self.held(dir, Target { server, shard: Some(incarnation), slot: None })?;
            let h = slot.lock().await;
            if h.id != id || h.gone || h.dir_stale || !self.leased(&h) {
                return None;
            }
            size += h.obj.entries as i64 - entries as i64;
            subdirs += h.obj.subdirs as i64 - dirs as i64;
            a.mtime = a.mtime.max(h.obj.mtime);
            a.ctime = a.ctime.max(h.obj.ctime);
        }
        a.size = size.max(0) as u64;
        a.nlink = (2 + subdirs.max(0)).min(u32::MAX as i64) as u32;
        Some(a)
    }

    /// This client has just made directory `dir`: its first change asks for a delegation
    /// (a directory being filled by its creator, as in `tar x` or `cp -r`).
    pub fn created(&self, dir: &str) {
        if !self.map.delegations.enabled {
            return;
        }
        let mut st = self.state();
        if st.activity.len() <= MAX_ACTIVITY {
            st.activity.insert(dir.to_string(), (BURST_OPS - 1, Instant::now(), None));
        }
    }

    /// Asks for a write (or `read`) delegation on `dir` and installs it, in place of a
    /// read delegation held there.
    async fn acquire(self: &Arc<Self>, dir: &str, caller: &Cred, t: Target, read: bool) -> Option<Slot> {
        let req = Request::DelegAcquire { dir: dir.to_string(), read };
        let req = match t.shard {
            Some(incarnation) => Request::Shard { incarnation, op: Box::new(req) },
            None => req,
        };
        let cred = Cred { session: self.session, ..caller.clone() };
        let asked = Instant::now();
        let grant = match self.pool.call_as(t.server, &cred, &req).await {
            Ok(Ok(Reply::Deleg(g))) => g,
            other => {
                tracing::debug!(dir, read, ?other, "delegation refused");
                let until = Instant::now() + REFUSED_FOR;
                let mut st = self.state();
                let map = if read { &mut st.reads } else { &mut st.activity };
                map.insert(activity_key(dir, t), (0, Instant::now(), Some(until)));
                return None;
            }
        };
        let carried = grant.entries.len() + grant.digests.as_ref().map_or(0, Vec::len);
        self.work[1].fetch_add(1, Ordering::Relaxed);
        self.work[2].fetch_add(carried as u64, Ordering::Relaxed);
        let slot = Arc::new(tokio::sync::Mutex::new(held_of(*grant, t, dir, asked, read)));
        let (recalled, replaced) = {
            let mut st = self.state();
            let id = slot.try_lock().expect("new").id;
            st.activity.remove(&activity_key(dir, t));
            st.reads.remove(&activity_key(dir, t));
            let replaced = st.held.insert(key(dir, t), slot.clone());
            st.ids.insert(id, key(dir, t));
            (st.early.remove(&id), replaced)
        };
        if let Some(old) = replaced {
            let mut h = old.lock().await;
            h.gone = true;
            // The new grant covers the directory, but what the kernel kept under the old
            // one is no longer known to be: it is dropped now, not at the new one's end.
            self.uncache(&h);
            self.state().ids.remove(&h.id);
        }
        self.start_tasks(t.server);
        if recalled {
            self.release_slot(&slot).await;
            return None;
        }
        Some(slot)
    }

    /// Starts the recall listener of `server` and the background flusher, once.
    fn start_tasks(self: &Arc<Self>, server: ServerId) {
        let (listen, background) = {
            let mut st = self.state();
            let listen = st.listening.insert(server);
            let background = !std::mem::replace(&mut st.background, true);
            (listen, background)
        };
        if listen {
            tokio::spawn(listen_for_recalls(Arc::downgrade(self), server));
        }
        if background {
            tokio::spawn(background_flusher(Arc::downgrade(self)));
        }
    }

    /// Before this client sends `req`: queued work of the delegated directories it
    /// touches goes first; entries it changes are no longer known here; a change of a
    /// delegated directory itself returns the delegation.
    ///
    /// A write-back that could not be delivered (the server unreachable for
    /// [`BEFORE_PATIENCE`], which covers a replica group's failover) fails the request with
    /// EIO: it must not reach the servers before the work it follows.
    pub async fn before(&self, req: &Request) -> Result<(), FsError> {
        if self.state().held.is_empty() {
            return Ok(());
        }
        let fsync = matches!(req, Request::Fsync { .. });
        for (dir, touch, subtree) in plusfs_proto::touch::touched(req) {
            if matches!(touch, Touch::Entry(_) | Touch::Object) && !fsync {
                // A change sent to the servers: the distributed directory's attributes
                // answered from the holder's own changes would miss it.
                self.state().dist_attrs.remove(&dir);
            }
            let slots: Vec<Slot> = {
                let st = self.state();
                match subtree {
                    true => st
                        .held
                        .iter()
                        .filter(|((d, _), _)| plusfs_proto::path::is_within(d, &dir))
                        .map(|(_, s)| s.clone())
                        .collect(),
                    false => st.held.iter().filter(|((d, _), _)| *d == dir).map(|(_, s)| s.clone()).collect(),
                }
            };
            for slot in slots {
                let mut h = slot.lock().await;
                if h.gone {
                    continue;
                }
                // A request about one name of a distributed directory reaches only the shard
                // Eq. 2 places it on: the other shards' queues need not go first.
                if let Touch::Entry(name) | Touch::Read(Some(name)) = &touch {
                    if !h.places(name) {
                        continue;
                    }
                }
                let release = matches!(touch, Touch::Object);
                if let Err(e) = self.write_back(&mut h, release, BEFORE_PATIENCE).await {
                    if h.unacked.is_some() {
                        return Err(e);
                    }
                    tracing::warn!(dir = h.dir, error = %e, "cannot write back delegated work");
                }
                if let (Touch::Entry(name), false) = (&touch, fsync) {
                    if !h.places(name) {
                        continue; // another shard's name: this one does not change
                    }
                    h.entries.insert(name.clone(), Local::Unknown);
                    h.dir_stale = true;
                }
            }
        }
        Ok(())
    }

    /// Writes back `h`'s queued work; with `release`, returns the delegation too. An
    /// unreachable server is retried for up to [`FLUSH_PATIENCE`] (sync, recall, return).
    pub async fn flush_locked(&self, h: &mut Held, release: bool) -> Result<(), FsError> {
        self.write_back(h, release, FLUSH_PATIENCE).await
    }

    /// Remembers `names` of distributed directory `dir`, stat'ed through the servers
    /// because their shards were not delegated here: a program working through them
    /// (`rm -rf`) gets the delegation with its next change, and its next call on one of
    /// them then fetches them all at once instead of one by one.
    pub fn note_unlearnt(&self, dir: &str, names: Vec<String>) {
        let mut st = self.state();
        if st.unlearnt.len() >= MAX_UNLEARNT_DIRS && !st.unlearnt.contains_key(dir) {
            st.unlearnt.clear();
        }
        st.unlearnt.insert(dir.to_string(), names);
    }

    /// The names remembered by [`Self::note_unlearnt`] for `dir` if `name` is among them.
    pub fn unlearnt(&self, dir: &str, name: &str) -> Option<Vec<String>> {
        let st = self.state();
        st.unlearnt.get(dir).filter(|v| v.iter().any(|n| n == name)).cloned()
    }

    /// Fetches the server's stored entries `names` of delegation `h` (granted with
    /// digests; `names` are among those it asks the server about) as `caller`, and keeps
    /// them in `h`, so calls on them are answered here.
    pub async fn learn_entries(&self, h: &mut Held, names: Vec<String>, caller: &Cred) -> Result<(), FsError> {
        self.work[3].fetch_add(names.len() as u64, Ordering::Relaxed);
        let req = Request::DelegEntries { dir: h.dir.clone(), id: h.id, names };
        let reply = self.pool.call_as(h.server, caller, &req).await;
        let Request::DelegEntries { names, .. } = req else { unreachable!("built above") };
        match reply {
            // A reply may stop short (its size is bounded): the rest is asked again.
            Ok(Ok(Reply::Entries(found))) if found.len() <= names.len() => {
                h.learn(&names, found);
                Ok(())
            }
            Ok(Ok(other)) => Err(FsError::new("stat", &h.dir, Errno::EPROTO).with_detail(format!("{other:?}"))),
            Ok(Err(e)) => Err(FsError::new("stat", &h.dir, e.errno).with_detail(e.message)),
            Err(e) => Err(FsError::new("stat", &h.dir, e.errno()).with_detail(e.to_string())),
        }
    }

    /// After a call under `h` (locked): a full queue is written back; a delegation that
    /// keeps too many entries forgets those the server has, and is returned if that is
    /// not enough (`Held::trim`).
    pub async fn settle(&self, h: &mut Held) {
        if !h.full() && !h.over_kept() {
            return;
        }
        if let Err(e) = self.write_back(h, false, Duration::ZERO).await {
            tracing::warn!(dir = h.dir, error = %e, "cannot write back delegated work");
            return;
        }
        if h.trim() {
            tracing::debug!(dir = h.dir, kept = h.entries.len(), "returning a delegation that keeps too many entries");
            if let Err(e) = self.write_back(h, true, Duration::ZERO).await {
                tracing::warn!(dir = h.dir, error = %e, "cannot return a delegation");
            }
        }
    }

    /// [`Self::flush_locked`], resending to an unreachable server for at most `patience`
    /// beyond the connection's own retries (zero: one call; the flush stays kept, to be
    /// resent first).
    pub async fn write_back(&self, h: &mut Held, release: bool, patience: Duration) -> Result<(), FsError> {
        if h.gone {
            return Ok(());
        }
        if release {
            // Before the return is sent. Not waited for: the kernel takes the directory's
            // lock to expire a name, and the request that makes this client return the
            // delegation (or that waits for a recalled one) may hold it.
            self.uncache(h);
        }
        if h.unacked.is_some() {
            self.send_flush(h, patience).await?;
        }
        let mut ops = std::mem::take(&mut h.pending);
        // Only the entries written since the last write-back: its cost follows what
        // changed, not the size of the directory.
        let dirty = std::mem::take(&mut h.dirty);
        self.work[0].fetch_add(dirty.len() as u64, Ordering::Relaxed);
        for name in dirty {
            if let Some(Local::Known { attr, content: Some(c), dirty: d @ true, .. }) = h.entries.get_mut(&name) {
                ops.push(DelegOp::Contents { name, data: c.clone(), mtime: attr.mtime, ctime: attr.ctime });
                *d = false;
            }
        }
        let creds = std::mem::take(&mut h.creds);
        h.pending_bytes = 0;
        h.since = None;
        if ops.is_empty() && !release {
            return Ok(());
        }
        h.seq += 1;
        h.unacked = Some(Request::DelegFlush { dir: h.dir.clone(), id: h.id, seq: h.seq, creds, ops, release });
        self.send_flush(h, patience).await
    }

    /// Sends the flush kept in `h.unacked` until it is answered (resending while the
    /// server cannot be reached, at most `patience`). It stays kept, to be resent first,
    /// until an answer comes: also when the caller's future is dropped meanwhile.
    async fn send_flush(&self, h: &mut Held, patience: Duration) -> Result<(), FsError> {
        let start = Instant::now();
        let patience = if h.unreachable { Duration::ZERO } else { patience };
        let cred = self.cred();
        let reply = loop {
            let Some(req) = h.unacked.as_ref() else { return Ok(()) };
            match self.pool.call_as(h.server, &cred, req).await {
                Ok(r) => break r,
                Err(e) if start.elapsed() < patience => {
                    tracing::debug!(dir = h.dir, error = %e, "resending a delegation flush");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    h.unreachable = true;
                    return Err(FsError::new("write back", &h.dir, e.errno()).with_detail(e.to_string()));
                }
            }
        };
        h.unreachable = false;
        let sent = h.unacked.take();
        self.flushed(h, reply, sent)
    }

    /// Takes in the answer to flush `sent`. Entries a refused operation named are no
    /// longer known here (the server's copy is what counts).
    fn flushed(&self, h: &mut Held, reply: Result<Reply, WireError>, sent: Option<Request>) -> Result<(), FsError> {
        match reply {
            Ok(Reply::Flushed(Flushed { failed, ended })) => {
                if let Some(Request::DelegFlush { ops, .. }) = &sent {
                    let applied = ops.len().saturating_sub(failed.len());
                    self.written.fetch_add(applied as u64, Ordering::Relaxed);
                }
                if !failed.is_empty() {
                    tracing::error!(dir = h.dir, ?failed, "the server refused delegated operations");
                    self.lose(format!("{} delegated operations in '{}' were refused", failed.len(), h.dir));
                    if let Some(Request::DelegFlush { ops, .. }) = &sent {
                        for op in failed.iter().filter_map(|(i, _)| ops.get(*i as usize)) {
                            op.names().into_iter().for_each(|n| _ = h.entries.insert(n.to_string(), Local::Unknown));
                        }
                        h.dir_stale = true;
                    }
                }
                if ended {
                    self.forget(h);
                }
                Ok(())
            }
            Ok(other) => Err(FsError::new("write back", &h.dir, Errno::EIO).with_detail(format!("{other:?}"))),
            // The directory was distributed under a delegation that had nothing queued (its
            // server recalls delegations with work before): nothing is lost.
            Err(e)
                if e.redirect.is_some() && matches!(&sent, Some(Request::DelegFlush { ops, .. }) if ops.is_empty()) =>
            {
                tracing::debug!(dir = h.dir, "delegation of a directory distributed since: dropped");
                self.forget(h);
                Ok(())
            }
            Err(e) if e.errno == Errno::ESTALE => {
                self.forget(h);
                if matches!(&sent, Some(Request::DelegFlush { ops, .. }) if ops.is_empty()) {
                    tracing::debug!(dir = h.dir, "delegation ended by the server while nothing was queued");
                    return Ok(());
                }
                tracing::error!(dir = h.dir, "delegation revoked: its unflushed work is lost");
                self.lose(format!("work in '{}' was refused: {}", h.dir, e.message));
                Err(FsError::new("write back", &h.dir, Errno::EIO).with_detail(e.message))
            }
            Err(e) => Err(FsError::new("write back", &h.dir, e.errno).with_detail(e.message)),
        }
    }

    /// Drops `h` (returned, revoked).
    fn forget(&self, h: &mut Held) {
        h.gone = true;
        self.uncache(h);
        h.pending.clear();
        h.entries.clear();
        h.dirty.clear();
        let mut st = self.state();
        if let Some(k) = st.ids.remove(&h.id) {
            st.held.remove(&k);
        }
    }

    fn lose(&self, what: String) {
        self.lost.lock().expect("lost work").push(what);
    }

    /// EIO naming the work a server refused since the last call, if any.
    pub fn take_lost(&self) -> Result<(), FsError> {
        let lost = std::mem::take(&mut *self.lost.lock().expect("lost work"));
        match lost.is_empty() {
            true => Ok(()),
            false => Err(FsError::new("sync", "/", Errno::EIO).with_detail(lost.join("; "))),
        }
    }

    /// Flushes and returns the delegation in `slot`.
    async fn release_slot(&self, slot: &Slot) {
        let mut h = slot.lock().await;
        if let Err(e) = self.flush_locked(&mut h, true).await {
            tracing::warn!(dir = h.dir, shard = ?h.shard, server = h.server, error = %e, "cannot return a delegation");
        }
    }

    /// Writes back the queued work of every delegated directory (`release`: and returns
    /// the delegations).
    pub async fn sync(&self, release: bool) -> Result<(), FsError> {
        let slots: Vec<Slot> = self.state().held.values().cloned().collect();
        let mut first_err = None;
        for slot in slots {
            let mut h = slot.lock().await;
            if let Err(e) = self.flush_locked(&mut h, release).await {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => self.take_lost(),
        }
    }

    /// The server recalls delegation `id`: returned at once, or as soon as its grant,
    /// still in transit, is installed.
    async fn recalled(&self, id: u64) {
        let slot = {
            let mut st = self.state();
            match st.ids.get(&id).and_then(|d| st.held.get(d)).cloned() {
                Some(s) => s,
                None => {
                    st.early.insert(id);
                    return;
                }
            }
        };
        tracing::debug!(id, "delegation recalled");
        self.release_slot(&slot).await;
    }

    /// One pass of the background flusher: old queues are written back, idle
    /// delegations returned.
    async fn tick(&self) {
        self.uncache_lapsed();
        let slots: Vec<Slot> = self.state().held.values().cloned().collect();
        let now = Instant::now();
        for slot in slots {
            let Ok(mut h) = slot.try_lock() else { continue };
            let due = h.since.is_some_and(|t| now - t >= self.writeback()) || h.unacked.is_some();
            let idle = now - h.last_use >= IDLE;
            if due || idle {
                // One attempt per tick: a server that cannot be reached is tried again at
                // the next one without holding up the calls that need this directory.
                if let Err(e) = self.write_back(&mut h, idle, Duration::ZERO).await {
                    tracing::warn!(dir = h.dir, error = %e, "background write-back failed");
                }
            }
        }
    }

    /// Whether the state still has delegations on `server` (busy slots count as yes).
    fn holds_on(&self, server: ServerId) -> bool {
        let st = self.state();
        st.held.values().any(|s| s.try_lock().map(|h| h.server == server).unwrap_or(true))
    }

    /// How long queued work may wait before it is written back.
    fn writeback(&self) -> Duration {
        self.map.delegations.writeback()
    }

    /// Small-file limit of the cluster.
    pub fn small_file_bytes(&self) -> u64 {
        self.map.data.small_file_bytes
    }
}

/// The state of a new delegation.
fn held_of(g: DelegGrant, t: Target, dir: &str, asked: Instant, read: bool) -> Held {
    let entries = g
        .entries
        .into_iter()
        .map(|(name, i)| {
            let (link, acl) = (i.link_home.is_some(), i.access_acl());
            let attr = Attr::of_inode(&i);
            (name, Local::Known { attr, target: i.target, content: None, dirty: false, link, acl })
        })
        .collect();
    Held {
        id: g.id,
        slot: t.slot,
        digests: g.digests.map(Vec::into_boxed_slice),
        read,
        server: t.server,
        shard: t.shard,
        dir: dir.to_string(),
        obj: g.dir,
        dir_stale: false,
        entries,
        dirty: Default::default(),
        pending: Vec::new(),
        creds: Vec::new(),
        pending_bytes: 0,
        since: None,
        last_use: Instant::now(),
        seq: 0,
        unacked: None,
        next_ino: g.first_ino,
        ino_end: g.first_ino + g.ino_count as u64,
        gone: false,
        asked,
        unreachable: false,
    }
}

/// Answers the recalls of `server` while this client holds delegations there.
async fn listen_for_recalls(d: Weak<Delegations>, server: ServerId) {
    loop {
        let Some(me) = d.upgrade() else { return };
        if !me.holds_on(server) {
            me.state().listening.remove(&server);
            // A delegation installed meanwhile restarts a listener.
            if me.holds_on(server) && me.state().listening.insert(server) {
                continue;
            }
            return;
        }
        let req = Request::DelegWait { session: me.session };
        let pool = me.pool.clone();
        let cred = me.cred();
        drop(me);
        let sent = Instant::now();
        match pool.call_as(server, &cred, &req).await {
            Ok(Ok(Reply::Recalls(ids))) => {
                let Some(me) = d.upgrade() else { return };
                me.state().polled.insert(server, sent);
                for id in ids {
                    let me = me.clone();
                    tokio::spawn(async move { me.recalled(id).await });
                }
            }
            other => {
                tracing::debug!(server, ?other, "recall listener retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Writes back queues older than the cluster's write-back time and returns idle delegations.
async fn background_flusher(d: Weak<Delegations>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(me) = d.upgrade() else { return };
        me.tick().await;
    }
}

/// Whether `kind` may be created under a delegation.
pub(crate) fn delegable(kind: FileKind) -> bool {
    kind != FileKind::Dir
}
