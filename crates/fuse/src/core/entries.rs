//! Operations on names: lookup, creating and removing entries, links and renames.

use super::open_files::ORPHANS;
use super::stats::{stats_attr, STATS_FILE};
use super::{errno, Caller, Errno, MountCore, RenameMode};
use plusfs_client::FsError;
use plusfs_proto::{Attr, FileKind};
use std::ffi::OsStr;
use std::path::Path;

/// The name prefix of a file unlinked while open, kept in its own directory when the
/// mount cannot use [`ORPHANS`].
pub const SILLY_PREFIX: &str = ".plusfs-orphan.";

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
    pub async fn lookup(&self, caller: &Caller, parent: u64, name: &OsStr) -> Result<Attr, Errno> {
        if parent == 1 && name == STATS_FILE {
            return Ok(stats_attr());
        }
        let p = self.child(parent, name)?;
        let listed = match plusfs_proto::path::split(&p) {
            Some((dir, entry)) => match self.listed_attr(caller, dir, entry).await {
                Some(a) => Some(a),
                None => self.looked_ahead(caller, dir, entry).await,
            },
            None => None,
        };
        let a = match listed {
            Some(a) => a,
            None => self.run(self.as_caller(caller).lstat(&p)).await?,
        };
        // While the mount holds back writes or attribute changes of the file, its own view
        // (grown by them) is the one the kernel must keep, not the servers' older one.
        let a = self.held_back_view(a.ino).await.unwrap_or(a);
        self.remember(&p, &a);
        Ok(a)
    }

    /// `forget`: the kernel dropped `nlookup` lookups of `ino`.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes().forget(ino, nlookup);
        self.attrs.forget(ino);
        self.pages.forget(ino);
    }

    /// `mknod`: a regular file, FIFO, device or socket, owned by `caller`.
    pub async fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr, Errno> {
        let path = self.child(parent, name)?;
        let kind = node_kind(mode)?;
        let fh = self.run(self.as_creator(caller, umask).mknod(&path, kind, mode & 0o7777, rdev)).await?;
        self.dir_changed(parent);
        self.remember(&path, &fh.attr);
        Ok(fh.attr)
    }

    /// `mkdir`, owned by `caller`.
    pub async fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<Attr, Errno> {
        let p = self.child(parent, name)?;
        let a = self.run(self.as_creator(caller, umask).mkdir(&p, mode & 0o7777)).await?;
        self.dir_changed(parent);
        self.remember(&p, &a);
        Ok(a)
    }

    /// `symlink`: `name` in `parent` pointing at `target`, owned by `caller`.
    pub async fn symlink(&self, caller: &Caller, parent: u64, name: &OsStr, target: &Path) -> Result<Attr, Errno> {
        let p = self.child(parent, name)?;
        let target = target.to_str().ok_or(Errno::EINVAL)?;
        let a = self.run(self.as_caller(caller).symlink(target, &p)).await?;
        self.dir_changed(parent);
        self.remember(&p, &a);
        Ok(a)
    }

    /// `link`: a new name `newname` in `newparent` for the file `ino`.
    pub async fn link(&self, caller: &Caller, ino: u64, newparent: u64, newname: &OsStr) -> Result<Attr, Errno> {
        let src = self.path(ino)?;
        let dst = self.child(newparent, newname)?;
        self.flush_ino(ino).await?;
        let a = self.run(self.as_caller(caller).link(&src, &dst)).await?;
        self.dir_changed(newparent);
        self.remember(&dst, &a);
        Ok(a)
    }

    /// `unlink`: a file open through this mount is kept under [`ORPHANS`] until its last
    /// release.
    pub async fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let p = self.child(parent, name)?;
        let ino = self.inodes().ino_of(&p);
        match ino {
            Some(ino) => self.flush_ino(ino).await?, // what the file holds back, under any of its names
            None => self.flush_within(&p).await?,
        }
        if !self.keep_if_open(caller, &p, true).await? {
            self.run(self.as_caller(caller).unlink(&p)).await?;
            self.inodes().unlinked(&p);
        }
        self.entry_removed(parent, &name.to_string_lossy());
        if let Some(i) = ino {
            self.attrs.stale(i);
            self.writes.drop_idle(i);
        }
        Ok(())
    }

    /// `rmdir`.
    pub async fn rmdir(&self, caller: &Caller, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let p = self.child(parent, name)?;
        self.run(self.as_caller(caller).rmdir(&p)).await?;
        self.inodes().unlinked(&p);
        self.entry_removed(parent, &name.to_string_lossy());
        Ok(())
    }

    /// `rename` (`renameat2` with `mode`): a file open through this mount that the rename
    /// replaces is kept under [`ORPHANS`] until its last release.
    pub async fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        mode: RenameMode,
    ) -> Result<(), Errno> {
        let src = self.child(parent, name)?;
        let dst = self.child(newparent, newname)?;
        if mode == RenameMode::Exchange {
            let r = self.exchange(caller, &src, &dst).await;
            self.dir_changed(parent);
            self.dir_changed(newparent);
            [&src, &dst].iter().for_each(|p| self.listings.path_changed(p));
            return r;
        }
        if mode == RenameMode::NoReplace && self.as_caller(caller).lstat(&dst).await.is_ok() {
            return Err(Errno::EEXIST);
        }
        self.flush_within(&src).await?;
        self.flush_within(&dst).await?;
        if src != dst {
            self.keep_if_open(caller, &dst, false).await?;
        }
        let moved = {
            let inodes = self.inodes();
            [inodes.ino_of(&src), inodes.ino_of(&dst)]
        };
        if let Err(e) = self.run(self.as_caller(caller).rename(&src, &dst)).await {
            self.unkeep(caller, &dst).await;
            return Err(e);
        }
        self.inodes().renamed(&src, &dst);
        for ino in [Some(parent), Some(newparent)].into_iter().chain(moved).flatten() {
            self.attrs.stale(ino);
        }
        [&src, &dst].iter().for_each(|p| self.listings.path_changed(p));
        Ok(())
    }

    /// `RENAME_EXCHANGE` of `a` and `b`.
    async fn exchange(&self, caller: &Caller, a: &str, b: &str) -> Result<(), Errno> {
        self.flush_within(a).await?;
        self.flush_within(b).await?;
        let swapped = {
            let inodes = self.inodes();
            [inodes.ino_of(a), inodes.ino_of(b)]
        };
        self.run(self.as_caller(caller).exchange(a, b)).await?;
        self.inodes().exchanged(a, b);
        swapped.into_iter().flatten().for_each(|i| self.attrs.stale(i));
        Ok(())
    }

    /// If the file at `path` is open through this mount, keeps it under a name in
    /// [`ORPHANS`] until its last close: moved there by `caller` (`unlink`: the servers
    /// check the caller may remove it) or linked there (`rename` over it, which must stay
    /// atomic; undone by [`MountCore::unkeep`] if the rename fails). Returns whether it was
    /// moved.
    async fn keep_if_open(&self, caller: &Caller, path: &str, move_it: bool) -> Result<bool, Errno> {
        let ino = self.inodes().ino_of(path);
        let Some(ino) = ino.filter(|i| self.open_files().is_open(*i)) else {
            return Ok(false);
        };
        let unique = format!("{ino}.{}.{}", std::process::id(), self.next_id());
        let hidden = match self.orphans_dir().await {
            Ok(()) => format!("{ORPHANS}/{unique}"),
            // A mount that may not make it (its root is squashed) keeps the file next to
            // itself, as NFS clients do.
            Err(e) => {
                tracing::debug!(error = ?e, "no orphan directory: keeping the file in its own directory");
                let (dir, _) = plusfs_proto::path::split(path).ok_or(Errno::EINVAL)?;
                plusfs_proto::path::join(dir, &format!("{SILLY_PREFIX}{unique}"))
            }
        };
        if move_it {
            self.run(self.as_caller(caller).rename(path, &hidden)).await?;
        } else {
            match self.as_caller(caller).link(path, &hidden).await {
                Ok(_) => {}
                // Not a file (a directory is never kept): replace it as usual.
                Err(e) if e.errno == Errno::EPERM => return Ok(false),
                Err(e) => return Err(errno(e)),
            }
        }
        self.hidden(ino, path, hidden, move_it);
        Ok(move_it)
    }

    /// Makes [`ORPHANS`] once per mount: sticky and writable by everyone (as `/tmp`), so
    /// each caller's unlink moves the file there under their own permissions. A mount
    /// whose identity may not act as root finds it made by `plusfs cluster up` (or an
    /// admin's mount) and uses it as it is.
    async fn orphans_dir(&self) -> Result<(), Errno> {
        if self.orphans_ready.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let sticky_for_all = |a: &Attr| a.kind == FileKind::Dir && a.mode & 0o7777 == 0o1777;
        if self.client().lstat(ORPHANS).await.is_ok_and(|a| sticky_for_all(&a)) {
            self.orphans_ready.store(true, std::sync::atomic::Ordering::Release);
            return Ok(());
        }
        if self.orphans_refused.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Errno::EACCES);
        }
        match self.client().mkdir(ORPHANS, 0o1777).await {
            Err(e) if e.errno == Errno::EACCES || e.errno == Errno::EPERM => {
                self.orphans_refused.store(true, std::sync::atomic::Ordering::Release);
                return Err(e.errno);
            }
            Err(e) if e.errno != Errno::EEXIST => return Err(errno(e)),
            _ => {}
        }
        self.run(self.client().chmod(ORPHANS, 0o1777)).await?;
        self.orphans_ready.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Undoes [`MountCore::keep_if_open`]'s link of the file at `path` by `caller` after
    /// the rename over it failed: the hidden name goes, the file is no orphan.
    async fn unkeep(&self, caller: &Caller, path: &str) {
        let Some(ino) = self.inodes().ino_of(path) else { return };
        let Some(hidden) = self.open_files().unorphaned(ino) else { return };
        match self.remove_orphan(caller, &hidden).await {
            Ok(()) => self.inodes().unlinked(&hidden),
            Err(e) => tracing::warn!(path = hidden, error = %e, "cannot remove a kept name"),
        }
    }

    /// Removes the kept name `hidden` as `caller` (who closed the file or made the name),
    /// or, where the sticky directory forbids that (the caller does not own the file), as
    /// the mount's owner, which its identity may or may not allow.
    pub(super) async fn remove_orphan(&self, caller: &Caller, hidden: &str) -> Result<(), FsError> {
        match self.as_caller(caller).unlink(hidden).await {
            Err(e) if e.errno == Errno::EPERM || e.errno == Errno::EACCES => self.client().unlink(hidden).await,
            r => r,
        }
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
