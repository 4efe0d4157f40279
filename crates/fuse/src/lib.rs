//! The FUSE mount: the kernel speaks inode numbers, plusfs speaks paths.
//!
//! [`PlusFs`] keeps a table from inode number to the path it was last looked up under
//! (plusfs inode numbers are cluster-unique and `/` is 1, as FUSE wants), updated by
//! renames and dropped by `forget`. Every callback resolves its inode to a path and makes
//! the matching call of the async client ([`plusfs_client::Client`]) on a runtime the
//! adapter owns, as the caller's uid/gid. Directory listings are snapshotted at
//! `opendir`; `readdirplus` fills attributes with one batch stat per storing server.
//! The kernel checks permissions itself (`default_permissions`).
//!
//! Sequential writes are gathered per file into buffers of up to [`WRITE_BUFFER`] bytes
//! and sent when the buffer is full, when a write does not continue it, and before any
//! call that must see the file as written (read, getattr, setattr, flush, fsync, release,
//! rename, unlink): `close` returns only after the data is stored, so another client that
//! opens the file afterwards sees it (close-to-open consistency). A failed deferred write
//! is reported by the next of those calls, as NFS clients do.

mod inodes;
mod open_files;

use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};
use inodes::Inodes;
use open_files::{OpenFiles, ORPHANS};
use plusfs_client::{Client, FsError};
use plusfs_proto::path::join;
use plusfs_proto::{Attr, DirEntry, FileKind, Semantics, SetAttr, TimeSet, Timespec};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Mount settings.
#[derive(Debug, Clone)]
pub struct MountSettings {
    /// How long the kernel may cache attributes and names (default 1 s: safe for several
    /// clients, changes of another client are seen within it).
    pub ttl: Duration,
    /// Let other users than the mounting one use the mount (`-o allow_other`).
    pub allow_other: bool,
    /// Answer directory listings with attributes (`readdirplus`, one batch stat per page
    /// and storing server), so `ls -l` needs no lookup per entry (default on;
    /// `-o noreaddirplus` turns it off).
    pub readdirplus: bool,
}

impl Default for MountSettings {
    fn default() -> Self {
        MountSettings { ttl: Duration::from_secs(1), allow_other: false, readdirplus: true }
    }
}

/// Largest gathered write.
pub const WRITE_BUFFER: usize = 4 << 20;

/// Bytes written to a file and not yet sent.
struct Pending {
    path: String,
    offset: u64,
    data: Vec<u8>,
}

/// A directory listing taken at `opendir`.
struct Listing {
    dir: String,
    entries: Vec<DirEntry>,
}

/// The filesystem the kernel talks to.
pub struct PlusFs {
    client: Client,
    rt: tokio::runtime::Runtime,
    inodes: Mutex<Inodes>,
    listings: Mutex<HashMap<u64, Listing>>,
    pending: Mutex<HashMap<u64, Pending>>,
    open_files: Mutex<OpenFiles>,
    next_fh: AtomicU64,
    ttl: Duration,
    readdirplus: bool,
}

/// The errno an application sees. A server that cannot be reached after the client's
/// bounded retries is an I/O error to a POSIX program (EIO), not a socket error.
fn errno(e: FsError) -> Errno {
    let raw = e.errno.raw();
    let unreachable = [
        libc::ECONNRESET,
        libc::ECONNREFUSED,
        libc::ECONNABORTED,
        libc::ETIMEDOUT,
        libc::EPIPE,
        libc::ENOTCONN,
        libc::EHOSTUNREACH,
    ];
    if unreachable.contains(&raw) {
        tracing::warn!(error = %e, "server unreachable; reporting EIO");
        return Errno::EIO;
    }
    Errno::from_i32(raw)
}

fn time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => {
            let d = st.duration_since(UNIX_EPOCH).unwrap_or_default();
            TimeSet::At(Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() })
        }
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::BlockDev => FileType::BlockDevice,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::Socket => FileType::Socket,
    }
}

/// The kernel's view of plusfs attributes.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

impl PlusFs {
    /// An adapter over `client` (its own runtime runs the calls).
    pub fn new(client: Client, settings: &MountSettings) -> std::io::Result<PlusFs> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        Ok(PlusFs {
            client,
            rt,
            inodes: Mutex::new(Inodes::new()),
            listings: Mutex::default(),
            pending: Mutex::default(),
            open_files: Mutex::default(),
            next_fh: AtomicU64::new(1),
            ttl: settings.ttl,
            readdirplus: settings.readdirplus,
        })
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        self.inodes.lock().expect("inode table").path(ino.0).ok_or(Errno::ENOENT)
    }

    /// Sends the gathered writes of `ino`, if any.
    fn flush_ino(&self, ino: u64) -> Result<(), Errno> {
        let p = self.pending.lock().expect("pending writes").remove(&ino);
        match p {
            Some(p) => self.run(self.client.write(&p.path, p.offset, &p.data)).map(drop),
            None => Ok(()),
        }
    }

    /// Sends the gathered writes of every file at or below `path` (rename, unlink).
    fn flush_within(&self, path: &str) -> Result<(), Errno> {
        let inos: Vec<u64> = self
            .pending
            .lock()
            .expect("pending writes")
            .iter()
            .filter(|(_, p)| plusfs_proto::path::is_within(&p.path, path))
            .map(|(i, _)| *i)
            .collect();
        inos.into_iter().try_for_each(|i| self.flush_ino(i))
    }

    /// Gathers a write; sends what it cannot be gathered with.
    fn gather(&self, ino: u64, path: &str, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let mut pending = self.pending.lock().expect("pending writes");
        if let Some(p) = pending.get_mut(&ino) {
            if p.path == path && p.offset + p.data.len() as u64 == offset && p.data.len() + data.len() <= WRITE_BUFFER {
                p.data.extend_from_slice(data);
                return Ok(());
            }
        }
        let previous = pending.insert(ino, Pending { path: path.to_string(), offset, data: data.to_vec() });
        drop(pending);
        match previous {
            Some(p) => self.run(self.client.write(&p.path, p.offset, &p.data)).map(drop),
            None => Ok(()),
        }
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        Ok(join(&self.path(parent)?, name))
    }

    fn as_caller(&self, req: &Request) -> Client {
        self.client.as_owner(req.uid(), req.gid())
    }

    /// Records that the kernel now knows `a` under `path`, and answers with it.
    fn entry(&self, path: &str, a: &Attr, reply: ReplyEntry) {
        self.inodes.lock().expect("inode table").remember(a.ino, path);
        reply.entry(&self.ttl, &file_attr(a), Generation(0));
    }

    fn run<T>(&self, f: impl std::future::Future<Output = Result<T, FsError>>) -> Result<T, Errno> {
        self.rt.block_on(f).map_err(errno)
    }

    fn make_node(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<(String, Attr), Errno> {
        let path = self.child(parent, name)?;
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFBLK => FileKind::BlockDev,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFSOCK => FileKind::Socket,
            _ => return Err(Errno::EINVAL),
        };
        let c = self.as_caller(req);
        let fh = self.run(c.mknod(&path, kind, mode & !umask & 0o7777, rdev))?;
        Ok((path, fh.attr))
    }

    fn setattr_inner(&self, ino: INodeNo, set: SetAttr) -> Result<Attr, Errno> {
        self.flush_ino(ino.0)?;
        let path = self.path(ino)?;
        self.run(self.client.setattr(&path, set))
    }

    fn rename_inner(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let src = self.child(parent, name)?;
        let dst = self.child(newparent, newname)?;
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            self.flush_within(&src)?;
            self.flush_within(&dst)?;
            self.run(self.client.exchange(&src, &dst))?;
            self.inodes.lock().expect("inode table").exchanged(&src, &dst);
            return Ok(());
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && self.rt.block_on(self.client.lstat(&dst)).is_ok() {
            return Err(Errno::EEXIST);
        }
        self.flush_within(&src)?;
        self.flush_within(&dst)?;
        if src != dst {
            self.keep_if_open(&dst, false)?;
        }
        self.run(self.client.rename(&src, &dst))?;
        self.inodes.lock().expect("inode table").renamed(&src, &dst);
        Ok(())
    }

    /// If the file at `path` is open through this mount, keeps it under a name in
    /// [`ORPHANS`] until its last close: moved there (`unlink`) or linked there (`rename`
    /// over it, which must stay atomic). Returns whether it was moved.
    fn keep_if_open(&self, path: &str, move_it: bool) -> Result<bool, Errno> {
        let ino = self.inodes.lock().expect("inode table").ino_of(path);
        let Some(ino) = ino.filter(|i| self.open_files.lock().expect("open files").is_open(*i)) else {
            return Ok(false);
        };
        match self.rt.block_on(self.client.mkdir(ORPHANS, 0o700)) {
            Err(e) if e.errno != plusfs_proto::Errno::EEXIST => return Err(errno(e)),
            _ => {}
        }
        let n = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let hidden = format!("{ORPHANS}/{ino}.{}.{n}", std::process::id());
        match move_it {
            true => self.run(self.client.rename(path, &hidden))?,
            false => match self.rt.block_on(self.client.link(path, &hidden)) {
                Ok(_) => {}
                // Not a file (a directory is never kept): replace it as usual.
                Err(e) if e.errno == plusfs_proto::Errno::EPERM => return Ok(false),
                Err(e) => return Err(errno(e)),
            },
        }
        let mut inodes = self.inodes.lock().expect("inode table");
        match move_it {
            true => inodes.renamed(path, &hidden),
            false => inodes.remember(ino, &hidden),
        }
        self.open_files.lock().expect("open files").orphaned(ino, hidden);
        Ok(move_it)
    }

    /// Attributes as this mount shows them: an orphan's hidden name is not counted.
    fn shown(&self, mut a: Attr) -> Attr {
        if self.open_files.lock().expect("open files").is_orphan(a.ino) {
            a.nlink = a.nlink.saturating_sub(1);
        }
        a
    }

    /// The snapshot of a directory listing for `fh` (taken at `opendir`).
    fn listing(&self, fh: FileHandle) -> Result<(String, Vec<DirEntry>), Errno> {
        let l = self.listings.lock().expect("listings");
        let l = l.get(&fh.0).ok_or(Errno::EBADF)?;
        Ok((l.dir.clone(), l.entries.clone()))
    }
}

impl Filesystem for PlusFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // Large requests: fewer round trips for big reads and writes.
        if let Err(max) = config.set_max_write(1 << 20) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        if self.readdirplus && config.add_capabilities(fuser::InitFlags::FUSE_DO_READDIRPLUS).is_err() {
            tracing::warn!("the kernel does not offer readdirplus; listings come without attributes");
        }
        Ok(())
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: fuser::ReplyXattr) {
        let r = self.path(ino).and_then(|p| {
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            // plusfs never stores these namespaces (setting them is EOPNOTSUPP), so the
            // ACL and label probes `ls -l` makes per entry are answered here.
            if name.starts_with("system.") || name.starts_with("security.") {
                return Err(Errno::from_i32(libc::ENODATA));
            }
            self.run(self.client.getxattr(&p, name))
        });
        match r {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        match self.path(ino).and_then(|p| self.run(self.client.listxattr(&p))) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(n.as_bytes());
                    buf.push(0);
                }
                xattr_reply(&buf, size, reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self.path(ino).and_then(|p| {
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            let (create, replace) = (flags & libc::XATTR_CREATE != 0, flags & libc::XATTR_REPLACE != 0);
            self.run(self.client.setxattr(&p, name, value, create, replace))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.path(ino).and_then(|p| {
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            self.run(self.client.removexattr(&p, name))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| Ok((p.clone(), self.run(self.client.lstat(&p))?))) {
            Ok((p, a)) => self.entry(&p, &a, reply),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.lock().expect("inode table").forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.flush_ino(ino.0).and_then(|_| self.path(ino)).and_then(|p| self.run(self.client.lstat(&p))) {
            Ok(a) => reply.attr(&self.ttl, &file_attr(&self.shown(a))),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            size,
        };
        match self.setattr_inner(ino, set) {
            Ok(a) => reply.attr(&self.ttl, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.path(ino).and_then(|p| self.run(self.client.readlink(&p))) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        match self.make_node(req, parent, name, mode, umask, rdev) {
            Ok((p, a)) => self.entry(&p, &a, reply),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let r = self.child(parent, name).and_then(|p| {
            let c = self.as_caller(req);
            Ok((p.clone(), self.run(c.mkdir(&p, mode & !umask & 0o7777))?))
        });
        match r {
            Ok((p, a)) => self.entry(&p, &a, reply),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.child(parent, name).and_then(|p| {
            self.flush_within(&p)?;
            if !self.keep_if_open(&p, true)? {
                self.run(self.client.unlink(&p))?;
                self.inodes.lock().expect("inode table").unlinked(&p);
            }
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.child(parent, name).and_then(|p| {
            self.run(self.client.rmdir(&p))?;
            self.inodes.lock().expect("inode table").unlinked(&p);
            Ok(())
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let r = self.child(parent, link_name).and_then(|p| {
            let target = target.to_str().ok_or(Errno::EINVAL)?;
            let c = self.as_caller(req);
            Ok((p.clone(), self.run(c.symlink(target, &p))?))
        });
        match r {
            Ok((p, a)) => self.entry(&p, &a, reply),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let r = self.path(ino).and_then(|src| {
            let dst = self.child(newparent, newname)?;
            self.flush_ino(ino.0)?;
            Ok((dst.clone(), self.run(self.client.link(&src, &dst))?))
        });
        match r {
            Ok((p, a)) => self.entry(&p, &a, reply),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.rename_inner(parent, name, newparent, newname, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = self.path(ino).and_then(|p| {
            let a = self.run(self.client.lstat(&p))?;
            if flags.0 & libc::O_TRUNC != 0 && a.kind == FileKind::File && a.size > 0 {
                // Truncated on behalf of the caller, not of the mount's owner.
                self.run(self.as_caller(req).truncate(&p, 0))?;
            }
            Ok(())
        });
        match r {
            // No cached pages survive an open: close-to-open consistency between clients.
            Ok(()) => {
                self.open_files.lock().expect("open files").opened(ino.0);
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.flush_ino(ino.0).and_then(|_| self.path(ino));
        match r.and_then(|p| self.run(self.client.read(&p, offset, size as usize))) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.path(ino).and_then(|p| {
            if flags.0 & libc::O_APPEND != 0 {
                self.flush_ino(ino.0)?;
                self.run(self.client.append(&p, data)).map(drop)
            } else {
                self.gather(ino.0, &p, offset, data)
            }
        });
        match r {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // `close`: gathered writes are stored before it returns.
        match self.flush_ino(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let flushed = self.flush_ino(ino.0);
        let orphan = self.open_files.lock().expect("open files").released(ino.0);
        if let Some(hidden) = orphan {
            match self.rt.block_on(self.client.unlink(&hidden)) {
                Ok(()) => self.inodes.lock().expect("inode table").unlinked(&hidden),
                Err(e) => tracing::warn!(path = hidden, error = %e, "cannot remove a closed orphan"),
            }
        }
        match flushed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.flush_ino(ino.0).and_then(|_| self.path(ino)).and_then(|p| self.run(self.client.fsync(&p))) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.path(ino).and_then(|p| Ok((p.clone(), self.run(self.client.readdir(&p))?))) {
            Ok((dir, mut entries)) => {
                if dir == "/" {
                    entries.retain(|e| e.name != ORPHANS[1..]);
                }
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.listings.lock().expect("listings").insert(fh, Listing { dir, entries });
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let (dir, entries) = match self.listing(fh) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let parent = self.inodes.lock().expect("inode table").parent_ino(&dir);
        let dots = [(ino.0, FileType::Directory, "."), (parent, FileType::Directory, "..")];
        let all = dots.into_iter().chain(entries.iter().map(|e| (e.ino, file_type(e.kind), e.name.as_str())));
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let (dir, entries) = match self.listing(fh) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        // Attributes of this page's entries with one batch stat (per storing server).
        let start = (offset as usize).saturating_sub(2);
        let page: Vec<&DirEntry> = entries.iter().skip(start).take(1024).collect();
        let names: Vec<String> = page.iter().map(|e| e.name.clone()).collect();
        let attrs = match self.run(self.client.statv(&dir, &names, Semantics::PerformAll)) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        let dir_attr = match self.run(self.client.lstat(&dir)) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        let mut index = offset as usize;
        if index == 0 {
            if reply.add(ino, 1, ".", &self.ttl, &file_attr(&dir_attr), Generation(0)) {
                return reply.ok();
            }
            index = 1;
        }
        if index == 1 {
            let mut parent = dir_attr.clone();
            parent.ino = self.inodes.lock().expect("inode table").parent_ino(&dir);
            if reply.add(INodeNo(parent.ino), 2, "..", &self.ttl, &file_attr(&parent), Generation(0)) {
                return reply.ok();
            }
        }
        for (k, (e, a)) in page.iter().zip(attrs).enumerate() {
            let Ok(a) = a else { continue }; // removed since opendir
            let path = join(&dir, &e.name);
            // The kernel counts a lookup for each entry it is given.
            self.inodes.lock().expect("inode table").remember(a.ino, &path);
            let at = (start + k) as u64 + 3;
            if reply.add(INodeNo(a.ino), at, &e.name, &self.ttl, &file_attr(&a), Generation(0)) {
                self.inodes.lock().expect("inode table").forget(a.ino, 1);
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.listings.lock().expect("listings").remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.run(self.client.statfs()) {
            Ok(s) => {
                // Capacity is not accounted yet: report a large, mostly free device.
                let files = s.entries + s.dir_objects;
                reply.statfs(1 << 40, 1 << 40, 1 << 40, files + (1 << 32), 1 << 32, 4096, 255, 4096)
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions); existence here.
        match self.path(ino).and_then(|p| self.run(self.client.lstat(&p))) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.child(parent, name).and_then(|p| {
            let c = self.as_caller(req);
            let fh = self.run(c.create(&p, mode & !umask & 0o7777, flags & libc::O_EXCL != 0))?;
            let mut attr = fh.attr;
            if flags & libc::O_TRUNC != 0 && attr.size > 0 {
                attr = self.run(c.truncate(&p, 0))?;
            }
            Ok((p, attr))
        });
        match r {
            Ok((p, a)) => {
                self.inodes.lock().expect("inode table").remember(a.ino, &p);
                self.open_files.lock().expect("open files").opened(a.ino);
                reply.created(&self.ttl, &file_attr(&a), Generation(0), FileHandle(0), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }
}

/// Answers an xattr value or name list: its size when asked with `size` 0, ERANGE when it
/// does not fit.
fn xattr_reply(v: &[u8], size: u32, reply: fuser::ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(v);
    }
}

/// The fuser configuration of a plusfs mount.
pub fn config(settings: &MountSettings) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName("plusfs".into()),
        MountOption::Subtype("plusfs".into()),
        MountOption::DefaultPermissions,
    ];
    c.n_threads = Some(4);
    if settings.allow_other {
        c.acl = SessionACL::All;
    }
    c
}

/// Mounts `client`'s cluster at `mountpoint` and serves until it is unmounted.
pub fn mount(client: Client, mountpoint: &Path, settings: &MountSettings) -> std::io::Result<()> {
    let fs = PlusFs::new(client, settings)?;
    fuser::mount(fs, mountpoint, &config(settings))
}
