//! How long the kernel may keep what the mount tells it, and taking it back.
//!
//! By default the kernel keeps names and attributes for the mount's TTL (1 s), so another
//! mount's changes show within it. While this mount holds a delegation of a directory,
//! nobody else can change its entries before the delegation ends, and the client tells
//! the mount when it does (about to be returned, recalled, revoked, or its lease lapsed).
//! So the entries of a delegated directory, present or missing, and the attributes of its
//! files are given to the kernel for the longer *delegation TTL* (`-o deleg_ttl`, 60 s),
//! each one recorded here under its directory; when the delegation ends, the recorded
//! names are expired and the recorded inodes' attributes invalidated (`notify.rs`), from
//! the moment its return is sent.
//!
//! The kernel takes a directory's lock to expire a name in it. A request of that
//! directory may hold the lock while the mount serves it, and that request may be waiting
//! for the very delegation being returned (it is what returns it, or it waits for the
//! recalled delegation's lock): so invalidations go to a thread of their own and nothing
//! waits for them. Without such a request they take microseconds, well before another
//! client's change can reach the servers after the return; with one, the names expire as
//! soon as it is answered. What a request answers is recorded *before* the mount asks the
//! client whether a delegation covers it; an end told meanwhile therefore finds the
//! record, or the client already says no. A reply the kernel had not taken in when its
//! invalidation came is mostly still dropped: a new dentry is made under the same
//! directory lock, and attributes carry an older attribute version than the
//! invalidation's. The exception is the kernel's revalidation of a name it has, sent
//! without the directory's lock: its answer can land after the first invalidation, so
//! every invalidation is sent a second time [`SECOND_PASS`] later. Each directory's
//! record has a generation, so an answer taken back after the directory's delegation
//! ended does not touch the next delegation's record.
//!
//! Records are bounded ([`MAX_NAMES_PER_DIR`], [`MAX_NAMES`]): past them, answers get
//! the usual TTL.

use plusfs_client::{Client, KernelCacheable};
use plusfs_proto::path::split;
use plusfs_proto::Attr;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Most names recorded per directory.
pub const MAX_NAMES_PER_DIR: usize = 16_384;
/// Most names recorded in all.
pub const MAX_NAMES: usize = 131_072;

/// What the kernel is told to drop (the mount's transport implements it).
pub trait Invalidate: Send {
    /// Drops entry `name` of directory `parent` (present or missing).
    fn entry(&self, parent: u64, name: &str);
    /// Drops the attributes of inode `ino` (not its cached data).
    fn attributes(&self, ino: u64);
}

/// What the kernel keeps beyond its usual TTL in one directory.
#[derive(Default)]
struct DirRecord {
    /// Which record of the directory this is (a new one after each end).
    generation: u64,
    ino: u64,
    /// Names, with the answers about each not taken back yet.
    names: HashMap<String, u32>,
    /// Inodes whose attributes were answered, the same way.
    inodes: HashMap<u64, u32>,
}

#[derive(Default)]
struct Records {
    dirs: HashMap<String, DirRecord>,
    names: usize,
    next_generation: u64,
}

/// The kernel-cache records of a mount (see the module documentation).
pub struct KernelCache {
    /// The TTL of what a delegation covers (zero: never longer than usual).
    long: Duration,
    records: Mutex<Records>,
    jobs: OnceLock<Mutex<mpsc::Sender<Arc<DirRecord>>>>,
    /// Answers given the long TTL, and names and inodes invalidated.
    given: AtomicU64,
    dropped: AtomicU64,
}

/// How long after a directory's invalidations they are sent a second time: a lookup the
/// kernel sent to revalidate a name (without the directory's lock) may have been answered
/// with the long TTL just before the delegation ended, and the kernel applies that answer
/// after the first invalidation.
const SECOND_PASS: Duration = Duration::from_millis(50);

/// Sends each directory's invalidations through `kernel` as they come, and once more
/// [`SECOND_PASS`] later; returns when the queue is closed.
fn invalidate_twice(rx: mpsc::Receiver<Arc<DirRecord>>, kernel: &dyn Invalidate) {
    let send = |dir: &DirRecord| {
        for name in dir.names.keys() {
            kernel.entry(dir.ino, name);
        }
        for ino in dir.inodes.keys() {
            kernel.attributes(*ino);
        }
    };
    let mut again: std::collections::VecDeque<(Instant, Arc<DirRecord>)> = Default::default();
    loop {
        let next = match again.front() {
            Some((at, _)) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(dir) => {
                send(&dir);
                again.push_back((Instant::now() + SECOND_PASS, dir));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        while again.front().is_some_and(|(at, _)| *at <= Instant::now()) {
            let (_, dir) = again.pop_front().expect("checked");
            send(&dir);
        }
    }
}

/// The TTLs of an answer naming an entry: of the name, and of its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttls {
    pub entry: Duration,
    pub attr: Duration,
}

impl KernelCache {
    /// Records for a mount whose delegated entries the kernel may keep for `long`.
    pub fn new(long: Duration) -> KernelCache {
        KernelCache {
            long,
            records: Mutex::default(),
            jobs: OnceLock::new(),
            given: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Starts invalidating through `kernel` (once the mount is up) and asks `client` to
    /// tell of delegation ends. Until then, and with a zero delegation TTL, answers get
    /// the usual TTL.
    pub fn start(self: &Arc<Self>, client: &Client, kernel: Box<dyn Invalidate>) {
        if self.long.is_zero() || self.jobs.get().is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel::<Arc<DirRecord>>();
        let me = Arc::downgrade(self);
        let watcher: plusfs_client::EndWatcher = Arc::new(move |dir: &str| {
            if let Some(kc) = me.upgrade() {
                kc.ended(dir);
            }
        });
        if !client.on_delegation_end(watcher) {
            return; // no delegations: nothing is ever kept longer
        }
        let spawned = std::thread::Builder::new()
            .name("plusfs-inval".into())
            .spawn(move || invalidate_twice(rx, kernel.as_ref()));
        match spawned {
            Ok(_) => _ = self.jobs.set(Mutex::new(tx)),
            Err(e) => tracing::warn!(error = %e, "no invalidation thread: the kernel keeps names for the usual TTL"),
        }
    }

    /// Whether any answer may be kept longer now: invalidations are running and `client`
    /// holds a delegation. Cheap, so answers skip the records when nothing is delegated.
    pub fn may_keep_longer(&self, client: &Client) -> bool {
        self.jobs.get().is_some() && client.delegations_held() > 0
    }

    /// The TTLs for entry `name` of directory `dir_ino` at `dir`, found to be `answer`
    /// (`None`: missing): the delegation TTL when a delegation covers it, else `usual`.
    pub fn entry_ttls(
        &self,
        client: &Client,
        dir_ino: u64,
        (dir, name): (&str, &str),
        answer: Option<&Attr>,
        usual: Duration,
    ) -> Ttls {
        let short = Ttls { entry: usual, attr: usual };
        let ino = answer.map(|a| a.ino);
        if self.jobs.get().is_none() {
            return short;
        }
        let Some(generation) = self.record(dir_ino, dir, name, ino) else { return short };
        match client.kernel_cacheable(dir, name, answer) {
            Some(KernelCacheable { attr }) => {
                self.given.fetch_add(1, Ordering::Relaxed);
                Ttls { entry: self.long, attr: if attr { self.long } else { usual } }
            }
            None => {
                self.unrecord(dir, generation, name, ino);
                short
            }
        }
    }

    /// The attribute TTL of `answer`, the attributes of what is known under `path`.
    pub fn attr_ttl(&self, client: &Client, dir_ino: u64, path: &str, answer: &Attr, usual: Duration) -> Duration {
        match split(path) {
            Some(entry) if path != "/" => self.entry_ttls(client, dir_ino, entry, Some(answer), usual).attr,
            _ => usual,
        }
    }

    /// Records one more answer about `name` (and `ino`) of `dir`: the generation of the
    /// directory's record, `None` when the records are full.
    fn record(&self, dir_ino: u64, dir: &str, name: &str, ino: Option<u64>) -> Option<u64> {
        let mut r = self.records.lock().expect("kernel cache records");
        let full = r.names >= MAX_NAMES;
        if full && !r.dirs.get(dir).is_some_and(|d| d.names.contains_key(name)) {
            return None;
        }
        if !r.dirs.contains_key(dir) {
            r.next_generation += 1;
            let generation = r.next_generation;
            r.dirs.insert(dir.to_string(), DirRecord { generation, ..Default::default() });
        }
        let d = r.dirs.get_mut(dir).expect("inserted above");
        if !d.names.contains_key(name) && d.names.len() >= MAX_NAMES_PER_DIR {
            return None;
        }
        let generation = d.generation;
        d.ino = dir_ino;
        if let Some(ino) = ino {
            *d.inodes.entry(ino).or_default() += 1;
        }
        let count = d.names.entry(name.to_string()).or_default();
        *count += 1;
        if *count == 1 {
            r.names += 1;
        }
        Some(generation)
    }

    /// Takes back one answer recorded by [`Self::record`] in the directory's record of
    /// `generation` (given the usual TTL after all); a later record is left alone.
    fn unrecord(&self, dir: &str, generation: u64, name: &str, ino: Option<u64>) {
        let mut r = self.records.lock().expect("kernel cache records");
        let Some(d) = r.dirs.get_mut(dir).filter(|d| d.generation == generation) else { return };
        if let Some(ino) = ino {
            if let Some(c) = d.inodes.get_mut(&ino) {
                *c -= 1;
                if *c == 0 {
                    d.inodes.remove(&ino);
                }
            }
        }
        let Some(c) = d.names.get_mut(name) else { return };
        *c -= 1;
        if *c > 0 {
            return;
        }
        d.names.remove(name);
        let empty = d.names.is_empty() && d.inodes.is_empty();
        r.names -= 1;
        if empty {
            r.dirs.remove(dir);
        }
    }

    /// The delegation of `dir` ends: what the kernel keeps there is dropped, on the
    /// invalidation thread (not waited for: see the module documentation).
    fn ended(&self, dir: &str) {
        let rec = {
            let mut r = self.records.lock().expect("kernel cache records");
            let Some(rec) = r.dirs.remove(dir) else { return };
            r.names -= rec.names.len();
            rec
        };
        self.dropped.fetch_add((rec.names.len() + rec.inodes.len()) as u64, Ordering::Relaxed);
        if let Some(jobs) = self.jobs.get() {
            let _ = jobs.lock().expect("invalidation queue").send(Arc::new(rec));
        }
    }

    /// The control file's line: the delegation TTL, answers given it, names and inodes
    /// invalidated, and names recorded now.
    pub fn stats_line(&self) -> String {
        let recorded = self.records.lock().expect("kernel cache records").names;
        format!(
            "kernel cache deleg_ttl {}s given {} invalidated {} recorded {}\n",
            self.long.as_secs(),
            self.given.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
            recorded
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(kc: &KernelCache, dir: &str) -> Vec<(String, u32)> {
        let r = kc.records.lock().unwrap();
        let mut v: Vec<(String, u32)> =
            r.dirs.get(dir).map(|d| d.names.iter().map(|(n, c)| (n.clone(), *c)).collect()).unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn an_answer_taken_back_after_an_end_leaves_the_next_record_alone() {
        let kc = KernelCache::new(Duration::from_secs(60));
        let old = kc.record(2, "/d", "n", Some(5)).expect("room");
        kc.ended("/d");
        let new = kc.record(2, "/d", "n", Some(5)).expect("room");
        assert_ne!(old, new, "a new record after the end");
        kc.unrecord("/d", old, "n", Some(5));
        assert_eq!(names(&kc, "/d"), [("n".to_string(), 1)], "the new record keeps its answer");
        kc.unrecord("/d", new, "n", Some(5));
        assert!(names(&kc, "/d").is_empty());
        assert_eq!(kc.records.lock().unwrap().names, 0);
    }

    #[test]
    fn records_are_bounded_per_directory() {
        let kc = KernelCache::new(Duration::from_secs(60));
        for i in 0..MAX_NAMES_PER_DIR {
            assert!(kc.record(2, "/d", &format!("f{i}"), None).is_some());
        }
        assert!(kc.record(2, "/d", "one-more", None).is_none(), "past the bound: the usual TTL");
        assert!(kc.record(2, "/d", "f0", None).is_some(), "a name recorded already still counts");
        assert!(kc.record(3, "/e", "x", None).is_some(), "another directory has room");
    }
}
