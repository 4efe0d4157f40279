//! Operations on names: lookup, creating and removing entries, links and renames.

use super::open_files::ORPHANS;
use super::{errno, Caller, Errno, MountCore, RenameMode};
use plusfs_proto::{Attr, FileKind};
use std::ffi::OsStr;
use std::path::Path;

/// The kind of node `mknod` makes for the file-type bits of `mode` (0 is a regular file).
fn node_kind(mode: u32) -> Result<FileKind, Errno> {
    match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => Ok(FileKind::File),
        libc::S_IFIFO => Ok(FileKind::Fifo),
        libc::S_IFBLK => Ok(FileKind::BlockDev),
        libc::S_IFCHR => Ok(FileKind::CharDev),
        libc::S_IFSOCK => Ok(FileKind::Socket),
        _ => Err(Errno::EINVAL),
    }
}

impl MountCore {
    /// `lookup`: the attributes of `name` in `parent`, now known to the kernel.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr, Errno> {
        let p = self.child(parent, name)?;
        let a = self.run(self.client().lstat(&p))?;
        self.remember(&p, &a);
        Ok(a)
    }

    /// `forget`: the kernel dropped `nlookup` lookups of `ino`.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes().forget(ino, nlookup);
    }

    /// `mknod`: a regular file, FIFO, device or socket, owned by `caller`.
    pub fn mknod(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr, Errno> {
        let path = self.child(parent, name)?;
        let kind = node_kind(mode)?;
        let fh = self.run(self.as_caller(caller).mknod(&path, kind, mode & !umask & 0o7777, rdev))?;
        self.remember(&path, &fh.attr);
        Ok(fh.attr)
    }

    /// `mkdir`, owned by `caller`.
    pub fn mkdir(&self, caller: Caller, parent: u64, name: &OsStr, mode: u32, umask: u32) -> Result<Attr, Errno> {
        let p = self.child(parent, name)?;
        let a = self.run(self.as_caller(caller).mkdir(&p, mode & !umask & 0o7777))?;
        self.remember(&p, &a);
        Ok(a)
    }

    /// `symlink`: `name` in `parent` pointing at `target`, owned by `caller`.
    pub fn symlink(&self, caller: Caller, parent: u64, name: &OsStr, target: &Path) -> Result<Attr, Errno> {
        let p = self.child(parent, name)?;
        let target = target.to_str().ok_or(Errno::EINVAL)?;
        let a = self.run(self.as_caller(caller).symlink(target, &p))?;
        self.remember(&p, &a);
        Ok(a)
    }

    /// `link`: a new name `newname` in `newparent` for the file `ino`.
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Attr, Errno> {
        let src = self.path(ino)?;
        let dst = self.child(newparent, newname)?;
        self.flush_ino(ino)?;
        let a = self.run(self.client().link(&src, &dst))?;
        self.remember(&dst, &a);
        Ok(a)
    }

    /// `unlink`: a file open through this mount is kept under [`ORPHANS`] until its last
    /// release.
    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let p = self.child(parent, name)?;
        self.flush_within(&p)?;
        if !self.keep_if_open(&p, true)? {
            self.run(self.client().unlink(&p))?;
            self.inodes().unlinked(&p);
        }
        Ok(())
    }

    /// `rmdir`.
    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let p = self.child(parent, name)?;
        self.run(self.client().rmdir(&p))?;
        self.inodes().unlinked(&p);
        Ok(())
    }

    /// `rename` (`renameat2` with `mode`): a file open through this mount that the rename
    /// replaces is kept under [`ORPHANS`] until its last release.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        mode: RenameMode,
    ) -> Result<(), Errno> {
        let src = self.child(parent, name)?;
        let dst = self.child(newparent, newname)?;
        if mode == RenameMode::Exchange {
            return self.exchange(&src, &dst);
        }
        if mode == RenameMode::NoReplace && self.bridge.block_on(self.client().lstat(&dst)).is_ok() {
            return Err(Errno::EEXIST);
        }
        self.flush_within(&src)?;
        self.flush_within(&dst)?;
        if src != dst {
            self.keep_if_open(&dst, false)?;
        }
        self.run(self.client().rename(&src, &dst))?;
        self.inodes().renamed(&src, &dst);
        Ok(())
    }

    /// `RENAME_EXCHANGE` of `a` and `b`.
    fn exchange(&self, a: &str, b: &str) -> Result<(), Errno> {
        self.flush_within(a)?;
        self.flush_within(b)?;
        self.run(self.client().exchange(a, b))?;
        self.inodes().exchanged(a, b);
        Ok(())
    }

    /// If the file at `path` is open through this mount, keeps it under a name in
    /// [`ORPHANS`] until its last close: moved there (`unlink`) or linked there (`rename`
    /// over it, which must stay atomic). Returns whether it was moved.
    fn keep_if_open(&self, path: &str, move_it: bool) -> Result<bool, Errno> {
        let ino = self.inodes().ino_of(path);
        let Some(ino) = ino.filter(|i| self.open_files().is_open(*i)) else {
            return Ok(false);
        };
        match self.bridge.block_on(self.client().mkdir(ORPHANS, 0o700)) {
            Err(e) if e.errno != Errno::EEXIST => return Err(errno(e)),
            _ => {}
        }
        let hidden = format!("{ORPHANS}/{ino}.{}.{}", std::process::id(), self.next_id());
        if move_it {
            self.run(self.client().rename(path, &hidden))?;
        } else {
            match self.bridge.block_on(self.client().link(path, &hidden)) {
                Ok(_) => {}
                // Not a file (a directory is never kept): replace it as usual.
                Err(e) if e.errno == Errno::EPERM => return Ok(false),
                Err(e) => return Err(errno(e)),
            }
        }
        self.hidden(ino, path, hidden, move_it);
        Ok(move_it)
    }

    /// Records that `ino`, open, now lives on under `hidden` (moved from `path`, or
    /// linked there).
    fn hidden(&self, ino: u64, path: &str, hidden: String, moved: bool) {
        let mut inodes = self.inodes();
        match moved {
            true => inodes.renamed(path, &hidden),
            false => inodes.remember(ino, &hidden),
        }
        self.open_files().orphaned(ino, hidden);
    }
}
