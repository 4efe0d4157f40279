//! The `fuser` adapter: each kernel callback turns its arguments into plain values, calls
//! the [`MountCore`] and answers with the result. Nothing else happens here.

use crate::core::{Caller, DirItem, DirPlusItem, Errno, MountCore, RenameMode, XattrReply};
use crate::MountSettings;
use fuser::{
    AccessFlags, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use plusfs_client::Client;
use plusfs_proto::{Attr, FileKind, SetAttr, TimeSet, Timespec};
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The filesystem the kernel talks to: a [`MountCore`] and the kernel's cache settings.
pub struct PlusFs {
    core: MountCore,
    ttl: Duration,
    readdirplus: bool,
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

fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid() }
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

impl PlusFs {
    /// An adapter over `client` (its own runtime runs the calls).
    pub fn new(client: Client, settings: &MountSettings) -> std::io::Result<PlusFs> {
        Ok(PlusFs { core: MountCore::new(client)?, ttl: settings.ttl, readdirplus: settings.readdirplus })
    }

    /// The core behind the adapter.
    pub fn core(&self) -> &MountCore {
        &self.core
    }

    fn entry(&self, r: Result<Attr, Errno>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&self.ttl, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn attr(&self, r: Result<Attr, Errno>, reply: ReplyAttr) {
        match r {
            Ok(a) => reply.attr(&self.ttl, &file_attr(&a)),
            Err(e) => reply.error(fuse_errno(e)),
        }
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

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr(self.core.getxattr(ino.0, name, size), reply)
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(self.core.listxattr(ino.0, size), reply)
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
        empty(self.core.setxattr(ino.0, name, value, flags), reply)
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.core.removexattr(ino.0, name), reply)
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(self.core.lookup(parent.0, name), reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(self.core.getattr(ino.0), reply)
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
        self.attr(self.core.setattr(ino.0, set), reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.core.readlink(ino.0) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        self.entry(self.core.mknod(caller(req), parent.0, name, mode, umask, rdev), reply)
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.entry(self.core.mkdir(caller(req), parent.0, name, mode, umask), reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.core.unlink(parent.0, name), reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.core.rmdir(parent.0, name), reply)
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.entry(self.core.symlink(caller(req), parent.0, link_name, target), reply)
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.entry(self.core.link(ino.0, newparent.0, newname), reply)
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
        empty(self.core.rename(parent.0, name, newparent.0, newname, rename_mode(flags)), reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.core.open(caller(req), ino.0, flags.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(fuse_errno(e)),
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
        match self.core.read(ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(fuse_errno(e)),
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
        match self.core.write(ino.0, offset, data, flags.0) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        empty(self.core.flush(ino.0), reply)
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
        empty(self.core.release(ino.0), reply)
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty(self.core.fsync(ino.0), reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let add = |i: DirItem<'_>| reply.add(INodeNo(i.ino), i.offset, file_type(i.kind), i.name);
        match self.core.readdir(ino.0, fh.0, offset, add) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let ttl = self.ttl;
        let add =
            |i: DirPlusItem<'_>| reply.add(INodeNo(i.ino), i.offset, i.name, &ttl, &file_attr(i.attr), Generation(0));
        match self.core.readdirplus(ino.0, fh.0, offset, add) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.core.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.core.statfs() {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        empty(self.core.access(ino.0), reply)
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
        match self.core.create(caller(req), parent.0, name, mode, umask, flags) {
            Ok(a) => reply.created(&self.ttl, &file_attr(&a), Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(fuse_errno(e)),
        }
    }
}
