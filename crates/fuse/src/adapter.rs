//! The `fuser` adapter: each kernel callback turns its arguments into plain values and
//! polls the [`MountCore`] operation once on the reading thread; an operation answered
//! from what the mount knows replies there, one that has to wait continues as a task on
//! the mount's runtime and answers the kernel when done (fuser replies are `Send`). So no
//! request waits for another one's server round trip, and the kernel may keep many in
//! flight (`max_background`). Nothing else happens here.

use crate::core::STATS_INO;
use crate::core::{Caller, Entry, Errno, MountCore, RenameMode, XattrReply};
use crate::runner::Runner;
use crate::{MountSettings, UringMode};
use fuser::{
    AccessFlags, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use plusfs_client::Client;
use plusfs_proto::{Attr, FileKind, SetAttr, TimeSet, Timespec};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The filesystem the kernel talks to: a [`MountCore`], the runtime its operations run
/// on, and the kernel settings.
pub struct PlusFs {
    core: Arc<MountCore>,
    rt: tokio::runtime::Runtime,
    settings: MountSettings,
    runner: Arc<Runner>,
    /// Set at `init` when the kernel agreed to take requests over io_uring.
    uring_agreed: Arc<AtomicBool>,
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

fn fuse_errno(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.raw())
}

fn rename_mode(flags: RenameFlags) -> RenameMode {
    if flags.contains(RenameFlags::RENAME_EXCHANGE) {
        RenameMode::Exchange
    } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
        RenameMode::NoReplace
    } else {
        RenameMode::Replace
    }
}

fn empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(fuse_errno(e)),
    }
}

fn xattr(r: Result<XattrReply, Errno>, reply: ReplyXattr) {
    match r {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(v)) => reply.data(&v),
        Err(e) => reply.error(fuse_errno(e)),
    }
}

fn data(r: Result<Vec<u8>, Errno>, reply: ReplyData) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(fuse_errno(e)),
    }
}

fn attr(r: Result<(Attr, Duration), Errno>, reply: ReplyAttr) {
    match r {
        Ok((a, ttl)) => reply.attr(&ttl, &file_attr(&a)),
        Err(e) => reply.error(fuse_errno(e)),
    }
}

/// The answer naming an entry; a missing one is kept by the kernel as a negative entry
/// (inode 0) for its entry TTL, so a second miss needs no request.
fn entry(r: Result<Entry, Errno>, reply: ReplyEntry) {
    match r {
        Ok(Entry { attr: Some(a), ttls }) => {
            reply.entry_with_ttls(&ttls.attr, &ttls.entry, &file_attr(&a), Generation(0))
        }
        Ok(Entry { attr: None, ttls }) => {
            let mut none = file_attr(&crate::core::stats_attr());
            none.ino = INodeNo(0);
            reply.entry_with_ttls(&Duration::ZERO, &ttls.entry, &none, Generation(0))
        }
        Err(e) => reply.error(fuse_errno(e)),
    }
}

impl PlusFs {
    /// An adapter over `client`, with a runtime of its own for the operations.
    pub fn new(client: Client, settings: &MountSettings) -> std::io::Result<PlusFs> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(settings.workers.max(1))
            .thread_name("plusfs-mount")
            .enable_all()
            .build()?;
        let core = {
            let _in_runtime = rt.enter();
            Arc::new(MountCore::with_ttls(client, settings.ttl, settings.deleg_ttl))
        };
        if let Some(addr) = &settings.metrics {
            let registry = plusfs_metrics::prometheus::Registry::new();
            core.observe_into(&registry);
            let listener = rt.block_on(tokio::net::TcpListener::bind(addr))?;
            let refresh: plusfs_metrics::Refresh = Arc::new(|| Box::pin(async {}));
            rt.spawn(plusfs_metrics::serve(listener, registry, refresh));
            tracing::info!(addr, "mount metrics endpoint ready");
        }
        let runner = Arc::new(Runner::new(core.clone(), rt.handle().clone(), settings.xattrs));
        let uring_agreed = Arc::new(AtomicBool::new(false));
        Ok(PlusFs { core, rt, settings: settings.clone(), runner, uring_agreed })
    }

    /// Who makes request `req` (uid, gid and supplementary groups).
    fn caller(&self, req: &Request) -> Caller {
        self.runner.caller(req.uid(), req.gid(), req.pid())
    }

    /// The core behind the adapter.
    pub fn core(&self) -> &MountCore {
        &self.core
    }

    /// Whether extended attributes are served (`-o noxattr`: not); a refused request is
    /// counted as a failed call of `op`.
    fn xattrs_served(&self, op: &'static str) -> bool {
        let served = self.runner.xattrs();
        if !served {
            self.core.count_local(op, false);
        }
        served
    }

    /// The runner the io_uring transport serves requests with.
    pub(crate) fn runner(&self) -> Arc<Runner> {
        self.runner.clone()
    }

    /// Set once the kernel agreed (at `init`) to take requests over io_uring.
    pub(crate) fn uring_agreed(&self) -> Arc<AtomicBool> {
        self.uring_agreed.clone()
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
        // Many requests in flight: they are served concurrently.
        if let Err(max) = config.set_max_background(self.settings.max_background) {
            let _ = config.set_max_background(max);
        }
        let congestion = self.settings.max_background.saturating_mul(3) / 4;
        if let Err(max) = config.set_congestion_threshold(congestion) {
            let _ = config.set_congestion_threshold(max);
        }
        // Set-id bits are cleared by the mount (on write, chown), so the kernel neither
        // probes `security.capability` before each write nor re-reads attributes before
        // each chown.
        let mut wanted = fuser::InitFlags::FUSE_ASYNC_READ | fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.settings.parallel_dirops {
            wanted |= fuser::InitFlags::FUSE_PARALLEL_DIROPS;
        }
        if self.settings.readdirplus {
            // Adaptive: the kernel asks for attributes with the first page and then only
            // while the program looks the entries up (`ls -l`), not for a bare listing
            // (`ls -f`, `find -name`), whose entries the mount then need not remember.
            wanted |= fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        if self.settings.writeback_cache {
            wanted |= fuser::InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::warn!(?missing, "the kernel does not offer these FUSE capabilities; mounting without them");
            let _ = config.add_capabilities(wanted - missing);
        }
        // POSIX ACLs: the kernel checks them, and sends modes unmasked with the umask so
        // the servers can let a parent's default ACL replace it.
        if self.settings.acl && self.settings.xattrs {
            let acl = fuser::InitFlags::FUSE_POSIX_ACL | fuser::InitFlags::FUSE_DONT_MASK;
            match config.add_capabilities(acl) {
                Ok(()) => self.core.serve_acls(),
                Err(missing) => tracing::warn!(?missing, "the kernel does not offer POSIX ACLs over FUSE"),
            }
        }
        // Requests over io_uring queues: offered by the kernel only where root switched it
        // on (`/sys/module/fuse/parameters/enable_uring`).
        if self.settings.uring != UringMode::Off {
            let agreed = config.add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING).is_ok();
            self.uring_agreed.store(agreed, Ordering::SeqCst);
        }
        Ok(())
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.xattrs_served("getxattr") {
            return reply.error(fuser::Errno::ENOSYS);
        }
        let who = self.caller(req);
        let name = name.to_owned();
        self.runner.spawn(
            "getxattr",
            move |c| async move { c.getxattr(&who, ino.0, &name, size).await },
            |r| xattr(r, reply),
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if !self.xattrs_served("listxattr") {
            return reply.error(fuser::Errno::ENOSYS);
        }
        let who = self.caller(req);
        self.runner.spawn(
            "listxattr",
            move |c| async move { c.listxattr(&who, ino.0, size).await },
            |r| xattr(r, reply),
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if !self.xattrs_served("setxattr") {
            return reply.error(fuser::Errno::ENOSYS);
        }
        let who = self.caller(req);
        let (name, value) = (name.to_owned(), value.to_vec());
        let call = move |c: Arc<MountCore>| async move { c.setxattr(&who, ino.0, &name, &value, flags).await };
        self.runner.spawn("setxattr", call, |r| empty(r, reply));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if !self.xattrs_served("removexattr") {
            return reply.error(fuser::Errno::ENOSYS);
        }
        let who = self.caller(req);
        let name = name.to_owned();
        self.runner.spawn(
            "removexattr",
            move |c| async move { c.removexattr(&who, ino.0, &name).await },
            |r| empty(r, reply),
        );
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let who = self.caller(req);
        let (name, core) = (name.to_owned(), self.core.clone());
        let looked_up = name.clone();
        self.runner.spawn(
            "lookup",
            move |c| async move { c.lookup(&who, parent.0, &looked_up).await },
            // A missing name is counted as a failed lookup, then answered as a negative entry.
            move |r| entry(core.lookup_answer(parent.0, &name, r), reply),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
        self.core.count_local("forget", true);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let who = self.caller(req);
        self.runner.spawn(
            "getattr",
            move |c| async move {
                let r = c.getattr(&who, ino.0).await;
                c.attr_answer(ino.0, r)
            },
            move |r| attr(r, reply),
        );
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let who = self.caller(req);
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            size,
        };
        self.runner.spawn(
            "setattr",
            move |c| async move {
                let r = c.setattr(&who, ino.0, set, fh.map(|h| h.0)).await;
                c.attr_answer(ino.0, r)
            },
            move |r| attr(r, reply),
        );
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let who = self.caller(req);
        let call = move |c: Arc<MountCore>| async move { c.readlink(&who, ino.0).await.map(String::into_bytes) };
        self.runner.spawn("readlink", call, |r| data(r, reply));
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let who = self.caller(req);
        let name = name.to_owned();
        let call = move |c: Arc<MountCore>| async move {
            let r = c.mknod(&who, parent.0, &name, mode, umask, rdev).await;
            c.entry_answer(parent.0, &name, r)
        };
        self.runner.spawn("mknod", call, move |r| entry(r, reply));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let who = self.caller(req);
        let name = name.to_owned();
        let call = move |c: Arc<MountCore>| async move {
            let r = c.mkdir(&who, parent.0, &name, mode, umask).await;
            c.entry_answer(parent.0, &name, r)
        };
        self.runner.spawn("mkdir", call, move |r| entry(r, reply));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let who = self.caller(req);
        let name = name.to_owned();
        self.runner.spawn("unlink", move |c| async move { c.unlink(&who, parent.0, &name).await }, |r| empty(r, reply));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let who = self.caller(req);
        let name = name.to_owned();
        self.runner.spawn("rmdir", move |c| async move { c.rmdir(&who, parent.0, &name).await }, |r| empty(r, reply));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let who = self.caller(req);
        let (name, target) = (link_name.to_owned(), target.to_owned());
        let call = move |c: Arc<MountCore>| async move {
            let r = c.symlink(&who, parent.0, &name, &target).await;
            c.entry_answer(parent.0, &name, r)
        };
        self.runner.spawn("symlink", call, move |r| entry(r, reply));
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let who = self.caller(req);
        let name = newname.to_owned();
        let call = move |c: Arc<MountCore>| async move {
            let r = c.link(&who, ino.0, newparent.0, &name).await;
            c.entry_answer(newparent.0, &name, r)
        };
        self.runner.spawn("link", call, move |r| entry(r, reply));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let who = self.caller(req);
        let (name, newname, mode) = (name.to_owned(), newname.to_owned(), rename_mode(flags));
        let call =
            move |c: Arc<MountCore>| async move { c.rename(&who, parent.0, &name, newparent.0, &newname, mode).await };
        self.runner.spawn("rename", call, |r| empty(r, reply));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let who = self.caller(req);
        let open_flags = if ino.0 == STATS_INO {
            FopenFlags::FOPEN_DIRECT_IO
        } else if flags.0 & libc::O_ACCMODE == libc::O_RDONLY {
            // Nothing to send at close: the kernel need not wait for a FLUSH.
            FopenFlags::FOPEN_NOFLUSH
        } else {
            FopenFlags::empty()
        };
        self.runner.spawn(
            "open",
            move |c| async move { c.open(&who, ino.0, flags.0).await },
            move |r| match r {
                Ok(o) if o.keep_cache => reply.opened(FileHandle(o.fh), open_flags | FopenFlags::FOPEN_KEEP_CACHE),
                Ok(o) => reply.opened(FileHandle(o.fh), open_flags),
                Err(e) => reply.error(fuse_errno(e)),
            },
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let call = move |c: Arc<MountCore>| async move { c.read(ino.0, fh.0, offset, size).await };
        self.runner.spawn("read", call, |r| data(r, reply));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let call = move |c: Arc<MountCore>| async move {
            if kill {
                c.kill_suidgid(ino.0, fh.0).await?;
            }
            c.write(ino.0, fh.0, offset, &data, flags.0).await
        };
        self.runner.spawn("write", call, move |r| match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fuse_errno(e)),
        });
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.runner.spawn("flush", move |c| async move { c.flush(ino.0).await }, |r| empty(r, reply));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.runner.spawn("release", move |c| async move { c.release(ino.0, fh.0).await }, |r| empty(r, reply));
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.runner.spawn("fsync", move |c| async move { c.fsync(ino.0, fh.0).await }, |r| empty(r, reply));
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.runner.spawn("fsyncdir", move |c| async move { c.sync().await }, |r| empty(r, reply));
    }

    fn destroy(&mut self) {
        // Unmounting: queued delegated work goes to the servers, delegations go back.
        if let Err(e) = self.rt.block_on(self.core.unmounting()) {
            tracing::error!(error = ?e, "delegated work could not be written back at unmount");
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let who = self.caller(req);
        self.runner.spawn(
            "opendir",
            move |c| async move { c.opendir(&who, ino.0).await },
            |r| match r {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(fuse_errno(e)),
            },
        );
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let call = move |c: Arc<MountCore>| async move { c.readdir_items(ino.0, fh.0, offset).await };
        self.runner.spawn("readdir", call, move |r| match r {
            Ok(items) => {
                for i in items.iter().map(|i| i.as_dir_item()) {
                    if reply.add(INodeNo(i.ino), i.offset, file_type(i.kind), i.name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(fuse_errno(e)),
        });
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let core = self.core.clone();
        let call = move |c: Arc<MountCore>| async move { c.readdirplus_items(ino.0, fh.0, offset).await };
        self.runner.spawn("readdirplus", call, move |r| match r {
            Ok(items) => {
                for item in &items {
                    let i = item.as_dir_plus();
                    let ttl = core.plus_ttl(ino.0, i.name, i.attr);
                    if reply.add(INodeNo(i.ino), i.offset, i.name, &ttl, &file_attr(i.attr), Generation(0)) {
                        break;
                    }
                    core.handed_out(item);
                }
                reply.ok()
            }
            Err(e) => reply.error(fuse_errno(e)),
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.core.releasedir(fh.0);
        self.core.count_local("releasedir", true);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.runner.spawn(
            "statfs",
            |c| async move { c.statfs().await },
            |r| match r {
                Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize),
                Err(e) => reply.error(fuse_errno(e)),
            },
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let who = self.caller(req);
        self.runner.spawn(
            "access",
            move |c| async move { c.access(&who, ino.0, mask.bits()).await },
            |r| empty(r, reply),
        );
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
        let who = self.caller(req);
        let name = name.to_owned();
        let call = move |c: Arc<MountCore>| async move {
            let (a, fh) = c.create(&who, parent.0, &name, mode, umask, flags).await?;
            let ttl = c.plus_ttl(parent.0, &name, &a);
            Ok((a, fh, ttl))
        };
        self.runner.spawn("create", call, move |r| match r {
            Ok((a, fh, ttl)) => reply.created(&ttl, &file_attr(&a), Generation(0), FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(fuse_errno(e)),
        });
    }
}
