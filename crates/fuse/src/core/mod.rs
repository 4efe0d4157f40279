//! The mount core: what a plusfs mount does, without the kernel.
//!
//! The kernel speaks inode numbers, plusfs speaks paths. [`MountCore`] keeps a table from
//! inode number to the path it was last looked up under (plusfs inode numbers are
//! cluster-unique and `/` is 1, as FUSE wants), updated by renames and dropped by
//! `forget`. Every operation is an `async fn`: it resolves its inode to a path and awaits
//! the matching call of the async client, as the caller's uid/gid where the call creates
//! something or truncates for `O_TRUNC`. The adapter runs each kernel request as a task of
//! its own, so no request waits for another one's server round trip. Directory listings
//! are read a page at a time in name order; `readdirplus` fills attributes with one batch
//! stat per storing server. Permissions are the servers' business: every call goes as its
//! [`Caller`] (uid, gid, supplementary groups); reads, writes, truncations, flushes and
//! write-backs of an open file go as the caller that opened the handle (credentials
//! captured at open, as NFS does), marked as made through a descriptor
//! (`Cred::through_handle`: a file's owner needs no mode bits for them). The mount's own
//! credential (root, bounded by its identity) is used only for the mount's bookkeeping.
//!
//! Sequential writes are gathered per file into buffers of up to [`WRITE_BUFFER`] bytes
//! and sent when the buffer is full, when a write does not continue it, and before any
//! call that must see the file as written (read, getattr, setattr, flush, fsync, release,
//! rename, unlink, link): `close` returns only after the data is stored, so another client
//! that opens the file afterwards sees it (close-to-open consistency). A failed deferred
//! write is reported by the next of those calls, as NFS clients do. The writes of one file
//! go through one async lock, so they reach the servers in the order they were taken.
//!
//! A file unlinked (or renamed over) while open through this mount is kept under
//! [`ORPHANS`] until its last release (see `open_files.rs`).
//!
//! Every method takes plain values (inode numbers, names, a [`Caller`], open flags) and
//! returns `Result<_, Errno>`: the errno the kernel adapter answers with. Methods that
//! list call a sink per entry, which returns `true` when it is full. [`MountCore::counted`]
//! wraps an operation to count it and the server requests it sent (`stats.rs`); the
//! counts are read through the control file [`STATS_FILE`].

mod attrs;
mod dirs;
mod entries;
mod files;
mod inodes;
mod kernel_cache;
mod listings;
mod open_files;
mod page_cache;
mod stats;
mod types;
mod writes;
mod xattrs;

pub use kernel_cache::{Invalidate, Ttls};
pub use open_files::ORPHANS;
pub use plusfs_proto::Errno;
pub use stats::{render_stats, stats_attr, OpStats, STATS_FILE, STATS_INO};
pub use types::{Caller, DirItem, DirPlusItem, Entry, FsStats, Opened, PlusItem, ReaddirItem, RenameMode, XattrReply};
pub use writes::WRITE_BUFFER;

use attrs::AttrCache;
use inodes::Inodes;
use kernel_cache::KernelCache;
use listings::Listings;
use open_files::OpenFiles;
use page_cache::PageStamps;
use plusfs_client::{Client, FsError};
use plusfs_proto::path::{join, MAX_TREE_PATH_LEN};
use plusfs_proto::Attr;
use stats::Stats;
use std::ffi::OsStr;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use writes::{Gathered, Pending, Sending, Writes, MAX_BEHIND};

/// The state and operations of one mount (see the module documentation).
pub struct MountCore {
    client: Client,
    stats: Stats,
    attrs: AttrCache,
    inodes: Mutex<Inodes>,
    listings: Listings,
    writes: Writes,
    pages: PageStamps,
    open_files: Mutex<OpenFiles>,
    next_fh: AtomicU64,
    /// [`ORPHANS`] exists with its mode (made on first need).
    orphans_ready: std::sync::atomic::AtomicBool,
    /// The mount's identity may not make [`ORPHANS`]: files are kept in their directory.
    orphans_refused: std::sync::atomic::AtomicBool,
    /// FUSE-operation latencies, once a metrics endpoint serves them.
    latencies: std::sync::OnceLock<plusfs_metrics::Latencies>,
    /// What the control file says about the transport the kernel's requests come over.
    transport: std::sync::OnceLock<Transport>,
    /// What the kernel keeps longer under delegations, to be invalidated at their end.
    kcache: std::sync::Arc<KernelCache>,
    /// The kernel checks POSIX ACLs (`FUSE_POSIX_ACL`): they are read from the servers.
    acls: std::sync::atomic::AtomicBool,
}

/// The control file's line about the transport, made when it is read.
pub type Transport = Box<dyn Fn() -> String + Send + Sync>;

/// The errno an application sees. A server that cannot be reached after the client's
/// bounded retries is an I/O error to a POSIX program (EIO), not a socket error.
fn errno(e: FsError) -> Errno {
    let unreachable = [
        libc::ECONNRESET,
        libc::ECONNREFUSED,
        libc::ECONNABORTED,
        libc::ETIMEDOUT,
        libc::EPIPE,
        libc::ENOTCONN,
        libc::EHOSTUNREACH,
    ];
    if unreachable.contains(&e.errno.raw()) {
        tracing::warn!(error = %e, "server unreachable; reporting EIO");
        return Errno::EIO;
    }
    e.errno
}

/// Whether `name` in `parent` is the control file.
fn is_control(parent: u64, name: &str) -> bool {
    parent == 1 && name == STATS_FILE
}

impl MountCore {
    /// A mount over `client` (of the mount's owner). Paths inside the mount may be as long
    /// as the cluster allows: the kernel limits what applications give it to `PATH_MAX`.
    pub fn new(client: Client) -> MountCore {
        MountCore::with_ttl(client, std::time::Duration::from_secs(1))
    }

    /// A mount that answers attributes it learnt itself for `ttl` (the kernel's TTL).
    pub fn with_ttl(client: Client, ttl: std::time::Duration) -> MountCore {
        MountCore::with_ttls(client, ttl, std::time::Duration::ZERO)
    }

    /// A mount with kernel TTL `ttl` that, once [`Self::start_invalidations`] is called,
    /// lets the kernel keep what a delegation covers for `deleg_ttl` (`kernel_cache.rs`).
    pub fn with_ttls(client: Client, ttl: std::time::Duration, deleg_ttl: std::time::Duration) -> MountCore {
        MountCore {
            client: client.with_path_max(MAX_TREE_PATH_LEN),
            stats: Stats::default(),
            attrs: AttrCache::new(ttl),
            inodes: Mutex::new(Inodes::new()),
            listings: Listings::default(),
            writes: Writes::default(),
            pages: PageStamps::default(),
            open_files: Mutex::default(),
            next_fh: AtomicU64::new(1),
            orphans_ready: std::sync::atomic::AtomicBool::new(false),
            orphans_refused: std::sync::atomic::AtomicBool::new(false),
            latencies: std::sync::OnceLock::new(),
            transport: std::sync::OnceLock::new(),
            kcache: std::sync::Arc::new(KernelCache::new(deleg_ttl)),
            acls: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The kernel agreed to check POSIX ACLs: `system.posix_acl_*` are served from the
    /// servers from now on (before, and on mounts without ACLs, they are answered
    /// `ENODATA` here).
    pub fn serve_acls(&self) {
        self.acls.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The client acting for `caller`, with the umask of its create (the servers apply it
    /// unless the parent has a default ACL).
    fn as_creator(&self, caller: &Caller, umask: u32) -> Client {
        let mut cred = caller.cred();
        cred.umask = umask & 0o777;
        self.client().as_caller(cred)
    }

    /// Invalidates what the kernel keeps under a delegation through `kernel` when the
    /// delegation ends; from now on delegated entries get the delegation TTL.
    pub fn start_invalidations(&self, kernel: Box<dyn Invalidate>) {
        self.kcache.start(&self.client, kernel);
    }

    /// The answer about entry `name` of `parent` that `r` found (`Ok` only).
    pub fn entry_answer(&self, parent: u64, name: &OsStr, r: Result<Attr, Errno>) -> Result<Entry, Errno> {
        let a = r?;
        let ttls = self.entry_ttls(parent, name, Some(&a));
        Ok(Entry { attr: Some(a), ttls })
    }

    /// The answer to a lookup of `name` in `parent` that found `r`: a missing name is an
    /// entry the kernel keeps as missing (a negative entry) unless its TTL is zero.
    pub fn lookup_answer(&self, parent: u64, name: &OsStr, r: Result<Attr, Errno>) -> Result<Entry, Errno> {
        match r {
            Err(Errno::ENOENT) => match self.entry_ttls(parent, name, None) {
                ttls if ttls.entry.is_zero() => Err(Errno::ENOENT),
                ttls => Ok(Entry { attr: None, ttls }),
            },
            r => self.entry_answer(parent, name, r),
        }
    }

    /// The answer to a `getattr` or `setattr` of `ino` that found `r`, with its TTL.
    pub fn attr_answer(&self, ino: u64, r: Result<Attr, Errno>) -> Result<(Attr, std::time::Duration), Errno> {
        let a = r?;
        let usual = self.attrs.ttl();
        if usual.is_zero() || ino == STATS_INO || !self.kcache.may_keep_longer(&self.client) {
            return Ok((a, usual));
        }
        let Some((path, dir_ino)) = ({
            let inodes = self.inodes();
            inodes.path(ino).map(|p| {
                let parent = inodes.parent_ino(&p);
                (p, parent)
            })
        }) else {
            return Ok((a, usual));
        };
        let ttl = self.kcache.attr_ttl(&self.client, dir_ino, &path, &a, usual);
        Ok((a, ttl))
    }

    /// The TTLs of an answer about entry `name` of `parent` (found to be `answer`, or
    /// missing).
    fn entry_ttls(&self, parent: u64, name: &OsStr, answer: Option<&Attr>) -> Ttls {
        let usual = self.attrs.ttl();
        let short = Ttls { entry: usual, attr: usual };
        // `ttl=0` asks for no kernel cache at all: nothing is kept longer either.
        if usual.is_zero() || !self.kcache.may_keep_longer(&self.client) {
            return short;
        }
        let (Some(name), Ok(dir)) = (name.to_str(), self.path(parent)) else { return short };
        if is_control(parent, name) {
            return short;
        }
        self.kcache.entry_ttls(&self.client, parent, (&dir, name), answer, usual)
    }

    /// The one TTL of an answer that gives the kernel entry `name` of `parent` and its
    /// attributes `a` together (a create, a `readdirplus` entry).
    pub fn plus_ttl(&self, parent: u64, name: impl AsRef<OsStr>, a: &Attr) -> std::time::Duration {
        let t = self.entry_ttls(parent, name.as_ref(), Some(a));
        t.entry.min(t.attr)
    }

    /// The control file's line about the kernel's longer caches.
    fn kernel_cache_line(&self) -> String {
        self.kcache.stats_line()
    }

    /// Names the transport the kernel's requests come over in the control file (set once,
    /// by the mount once it is decided; until then the file says `transport starting`).
    pub fn set_transport(&self, describe: Transport) {
        let _ = self.transport.set(describe);
    }

    /// The control file's line about the transport.
    fn transport_line(&self) -> String {
        match self.transport.get() {
            Some(describe) => describe(),
            None => "transport starting\n".to_string(),
        }
    }

    /// Observes the latency of every operation into `registry`
    /// (`plusfs_fuse_request_duration_seconds{op}`), from now on.
    pub fn observe_into(&self, registry: &plusfs_metrics::prometheus::Registry) {
        let _ = self.latencies.set(plusfs_metrics::Latencies::new(
            registry,
            "plusfs_fuse_request_duration_seconds",
            "Time to answer a FUSE request that reached the mount's core, by operation.",
        ));
    }

    /// The client of the mount's owner.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs operation `op` (`fut`), counting it, its errors and the server requests it
    /// sent.
    pub async fn counted<T>(&self, op: &'static str, fut: impl Future<Output = Result<T, Errno>>) -> Result<T, Errno> {
        let start = std::time::Instant::now();
        let (r, requests) = plusfs_client::counting(fut).await;
        let took = start.elapsed();
        self.stats.record(op, requests, took.as_micros() as u64, r.is_ok());
        if let Some(l) = self.latencies.get() {
            l.observe(op, took);
        }
        r
    }

    /// Counts operation `op` served without server requests.
    pub fn count_local(&self, op: &'static str, ok: bool) {
        self.stats.record(op, 0, 0, ok);
    }

    /// Per-operation counts since the mount started.
    pub fn op_stats(&self) -> Vec<OpStats> {
        self.stats.snapshot()
    }

    /// The path inode `ino` is known under, if the kernel knows it.
    pub fn known_path(&self, ino: u64) -> Option<String> {
        self.inodes().path(ino)
    }

    /// The inode known under `path`, if any.
    pub fn known_ino(&self, path: &str) -> Option<u64> {
        self.inodes().ino_of(path)
    }

    /// Whether `ino` is open through this mount.
    pub fn is_open(&self, ino: u64) -> bool {
        self.open_files().is_open(ino)
    }

    /// `statfs`. Capacity is not accounted yet: a large, mostly free device.
    pub async fn statfs(&self) -> Result<FsStats, Errno> {
        let s = self.run(self.client().statfs()).await?;
        let files = s.entries + s.dir_objects;
        let (big, inodes) = (1 << 40, 1 << 32);
        Ok(FsStats {
            blocks: big,
            bfree: big,
            bavail: big,
            files: files + inodes,
            ffree: inodes,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }

    fn inodes(&self) -> MutexGuard<'_, Inodes> {
        self.inodes.lock().expect("inode table")
    }

    fn open_files(&self) -> MutexGuard<'_, OpenFiles> {
        self.open_files.lock().expect("open files")
    }

    /// A fresh number (directory handles, orphan names).
    fn next_id(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// The path of a known inode (ENOENT for an unknown one; EPERM for the control file,
    /// which has none).
    fn path(&self, ino: u64) -> Result<String, Errno> {
        if ino == STATS_INO {
            return Err(Errno::EPERM);
        }
        self.inodes().path(ino).ok_or(Errno::ENOENT)
    }

    /// The path of `name` in directory `parent` (EINVAL for a name that is not UTF-8,
    /// EPERM for the control file's name in `/`).
    fn child(&self, parent: u64, name: &OsStr) -> Result<String, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        if is_control(parent, name) {
            return Err(Errno::EPERM);
        }
        Ok(join(&self.path(parent)?, name))
    }

    /// Awaits a client call, its error as the errno an application sees.
    async fn run<T>(&self, f: impl Future<Output = Result<T, FsError>>) -> Result<T, Errno> {
        f.await.map_err(errno)
    }

    /// The client acting for `caller`: the servers check its permissions.
    fn as_caller(&self, caller: &Caller) -> Client {
        self.client().as_caller(caller.cred())
    }

    /// The client acting for `caller` through a descriptor it opened (reads, writes,
    /// truncations and write-backs of an open file; `Cred::through_handle`).
    fn through(&self, caller: &Caller) -> Client {
        self.client().as_caller(caller.cred().through_handle())
    }

    /// The caller that opened handle `fh`; the mount's owner for a handle this mount
    /// did not hand out (the kernel only passes back handles `open` and `create` gave).
    fn opener(&self, fh: u64) -> Caller {
        self.open_files().opener(fh).unwrap_or(Caller::ROOT)
    }

    /// Records that the kernel now knows `a` under `path` (one more lookup).
    /// Directory `ino` changed through this mount: its attribute copy and the attributes
    /// fetched for its open listings are stale.
    fn dir_changed(&self, ino: u64) {
        self.attrs.stale(ino);
        if let Some(p) = self.inodes().path(ino) {
            self.listings.drop_pages(&p);
        }
    }

    /// Entry `name` of directory `ino` was removed through this mount: the directory's
    /// attribute copy is stale, and so is what its open listings fetched for that entry.
    fn entry_removed(&self, ino: u64, name: &str) {
        self.attrs.stale(ino);
        if let Some(p) = self.inodes().path(ino) {
            self.listings.entry_removed(&p, name);
        }
    }

    fn remember(&self, path: &str, a: &Attr) {
        self.inodes().remember(a.ino, path);
        self.attrs.learnt(a);
    }

    /// Sends the gathered writes of `ino` and then its held-back attribute changes, if
    /// any, and returns once they are stored (or with their error). Holds the file's write
    /// lock meanwhile. The error of an earlier background send is kept for the file's next
    /// flush or fsync ([`Self::flush_reporting`]), not returned to the call that waits here.
    async fn flush_ino(&self, ino: u64) -> Result<(), Errno> {
        self.flush_slot(ino, false).await
    }

    /// [`Self::flush_ino`] for `close` and `fsync`: an error of any background send since
    /// the last report is returned too.
    async fn flush_reporting(&self, ino: u64) -> Result<(), Errno> {
        self.flush_slot(ino, true).await
    }

    async fn flush_slot(&self, ino: u64, report: bool) -> Result<(), Errno> {
        let Some(slot) = self.writes.get(ino) else {
            return Ok(()); // nothing was ever gathered for it
        };
        let mut held = slot.lock().await;
        self.sent(&mut held).await;
        if let Some(p) = held.data.take() {
            match self.run(self.through(&p.caller).write_bytes(&p.path, p.offset, p.data.into())).await {
                Ok(a) => self.learn_sent(&a),
                Err(e) => {
                    self.pages.forget(ino);
                    // Returned now, and kept for the flush that reports (unless this is it).
                    let first = *held.failed.get_or_insert(e);
                    return Err(if report { held.failed.take().unwrap_or(first) } else { e });
                }
            }
        }
        if let Some((caller, set)) = held.set.take() {
            let path = std::mem::take(&mut held.set_path);
            let a = self.run(self.as_caller(&caller).setattr(&path, set)).await?;
            self.attrs.learnt(&a);
        }
        match report.then(|| held.failed.take()).flatten() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for every background send of `held`; the first error is kept in
    /// `held.failed` (unless one is kept already).
    async fn sent(&self, held: &mut Gathered) {
        for s in std::mem::take(&mut held.sending) {
            if let Err(e) = self.joined(s).await {
                held.failed.get_or_insert(e);
            }
        }
    }

    /// Waits for background send `s`; learns the attributes it returned. A failed send
    /// also drops the kernel's right to keep the file's cached pages (they may hold bytes
    /// the servers never stored).
    async fn joined(&self, s: Sending) -> Result<(), Errno> {
        let r = match s.task.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(path = s.path, error = %e, "a background write failed to run");
                Err(Errno::EIO)
            }
        };
        match r {
            Ok(a) => {
                self.learn_sent(&a);
                Ok(())
            }
            Err(e) => {
                self.pages.forget(s.ino);
                Err(e)
            }
        }
    }

    /// Learns the attributes a write returned, unless a copy from a later write is kept
    /// (sends finish in any order).
    fn learn_sent(&self, a: &Attr) {
        match self.attrs.any(a.ino) {
            Some(c) if (c.mtime, c.size) > (a.mtime, a.size) => {}
            _ => self.attrs.learnt(a),
        }
    }

    /// Sends gathered bytes `p` in the background, after the sends under way that it
    /// overlaps (and the oldest, when [`MAX_BEHIND`] are). Their first error is returned
    /// here and kept for the file's next flush or fsync; `p` is sent all the same (its
    /// writes were acknowledged).
    async fn write_behind(&self, held: &mut Gathered, ino: u64, p: Pending) -> Result<(), Errno> {
        let (offset, end) = (p.offset, p.end());
        let mut first = Ok(());
        let mut kept = Vec::new();
        for s in std::mem::take(&mut held.sending) {
            match s.offset < end && offset < s.end {
                true => first = first.and(self.joined(s).await),
                false => kept.push(s),
            }
        }
        while kept.len() >= MAX_BEHIND {
            first = first.and(self.joined(kept.remove(0)).await);
        }
        held.sending = kept;
        let client = self.through(&p.caller);
        let path = p.path.clone();
        let task =
            tokio::spawn(async move { client.write_bytes(&p.path, p.offset, p.data.into()).await.map_err(errno) });
        held.sending.push(Sending { ino, path, offset, end, task });
        if let Err(e) = first {
            held.failed.get_or_insert(e);
            return Err(e);
        }
        Ok(())
    }

    /// Sends the gathered writes of every file at or below `path` (rename, unlink).
    async fn flush_within(&self, path: &str) -> Result<(), Errno> {
        for ino in self.writes.within(path).await {
            self.flush_ino(ino).await?;
        }
        Ok(())
    }

    /// Attributes as this mount shows them: an orphan's hidden name is not counted.
    fn shown(&self, mut a: Attr) -> Attr {
        if self.open_files().is_orphan(a.ino) {
            a.nlink = a.nlink.saturating_sub(1);
        }
        a
    }
}
