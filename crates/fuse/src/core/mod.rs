//! The mount core: what a plusfs mount does, without the kernel.
//!
//! The kernel speaks inode numbers, plusfs speaks paths. [`MountCore`] keeps a table from
//! inode number to the path it was last looked up under (plusfs inode numbers are
//! cluster-unique and `/` is 1, as FUSE wants), updated by renames and dropped by
//! `forget`. Every operation resolves its inode to a path and makes the matching call of
//! the async client through a [`BlockingClient`], as the caller's uid/gid where the call
//! creates something or truncates for `O_TRUNC`. Directory listings are snapshotted at
//! `opendir`; `readdirplus` fills attributes with one batch stat per storing server.
//! Permissions are the kernel's business (`default_permissions`).
//!
//! Sequential writes are gathered per file into buffers of up to [`WRITE_BUFFER`] bytes
//! and sent when the buffer is full, when a write does not continue it, and before any
//! call that must see the file as written (read, getattr, setattr, flush, fsync, release,
//! rename, unlink, link): `close` returns only after the data is stored, so another client
//! that opens the file afterwards sees it (close-to-open consistency). A failed deferred
//! write is reported by the next of those calls, as NFS clients do.
//!
//! A file unlinked (or renamed over) while open through this mount is kept under
//! [`ORPHANS`] until its last release (see `open_files.rs`).
//!
//! Every method takes plain values (inode numbers, names, a [`Caller`], open flags) and
//! returns `Result<_, Errno>`: the errno the kernel adapter answers with. Methods that
//! list call a sink per entry, which returns `true` when it is full.

mod dirs;
mod entries;
mod files;
mod inodes;
mod listings;
mod open_files;
mod types;
mod writes;
mod xattrs;

pub use open_files::ORPHANS;
pub use plusfs_proto::Errno;
pub use types::{Caller, DirItem, DirPlusItem, FsStats, RenameMode, XattrReply};
pub use writes::WRITE_BUFFER;

use inodes::Inodes;
use listings::Listings;
use open_files::OpenFiles;
use plusfs_client::{BlockingClient, Client, FsError};
use plusfs_proto::path::join;
use plusfs_proto::Attr;
use std::ffi::OsStr;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use writes::Writes;

/// Worker threads of the runtime a mount's calls run on.
const WORKERS: usize = 2;

/// The state and operations of one mount (see the module documentation).
pub struct MountCore {
    bridge: BlockingClient,
    inodes: Mutex<Inodes>,
    listings: Listings,
    writes: Writes,
    open_files: Mutex<OpenFiles>,
    next_fh: AtomicU64,
}

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

impl MountCore {
    /// A mount over `client` (of the mount's owner); calls run on a runtime of its own.
    pub fn new(client: Client) -> std::io::Result<MountCore> {
        Ok(MountCore::with_bridge(BlockingClient::from_client(client, WORKERS)?))
    }

    /// A mount whose calls go through `bridge`.
    pub fn with_bridge(bridge: BlockingClient) -> MountCore {
        MountCore {
            bridge,
            inodes: Mutex::new(Inodes::new()),
            listings: Listings::default(),
            writes: Writes::default(),
            open_files: Mutex::default(),
            next_fh: AtomicU64::new(1),
        }
    }

    /// The client of the mount's owner.
    pub fn client(&self) -> &Client {
        self.bridge.client()
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
    pub fn statfs(&self) -> Result<FsStats, Errno> {
        let s = self.run(self.client().statfs())?;
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

    /// The path of a known inode (ENOENT for an unknown one).
    fn path(&self, ino: u64) -> Result<String, Errno> {
        self.inodes().path(ino).ok_or(Errno::ENOENT)
    }

    /// The path of `name` in directory `parent` (EINVAL for a name that is not UTF-8).
    fn child(&self, parent: u64, name: &OsStr) -> Result<String, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        Ok(join(&self.path(parent)?, name))
    }

    /// Runs a client call to completion.
    fn run<T>(&self, f: impl Future<Output = Result<T, FsError>>) -> Result<T, Errno> {
        self.bridge.block_on(f).map_err(errno)
    }

    /// The client acting for `caller`.
    fn as_caller(&self, caller: Caller) -> Client {
        self.client().as_owner(caller.uid, caller.gid)
    }

    /// Records that the kernel now knows `a` under `path` (one more lookup).
    fn remember(&self, path: &str, a: &Attr) {
        self.inodes().remember(a.ino, path);
    }

    /// Sends the gathered writes of `ino`, if any.
    fn flush_ino(&self, ino: u64) -> Result<(), Errno> {
        match self.writes.take(ino) {
            Some(p) => self.run(self.client().write(&p.path, p.offset, &p.data)).map(drop),
            None => Ok(()),
        }
    }

    /// Sends the gathered writes of every file at or below `path` (rename, unlink).
    fn flush_within(&self, path: &str) -> Result<(), Errno> {
        self.writes.within(path).into_iter().try_for_each(|i| self.flush_ino(i))
    }

    /// Attributes as this mount shows them: an orphan's hidden name is not counted.
    fn shown(&self, mut a: Attr) -> Attr {
        if self.open_files().is_orphan(a.ino) {
            a.nlink = a.nlink.saturating_sub(1);
        }
        a
    }
}
