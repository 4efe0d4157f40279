//! Operations on files: attributes, open and create, reads, gathered writes, close.

use super::attrs::{applied, deferrable, fixed, merged};
use super::stats::{stats_attr, STATS_INO};
use super::writes::gather;
use super::{Caller, Errno, MountCore, Opened};
use plusfs_proto::{Attr, FileKind, SetAttr, Timespec, MAY_EXEC, MAY_READ, MAY_WRITE};
use std::ffi::OsStr;

/// What `open(2)` `flags` ask to do with a file (`MAY_READ`/`MAY_WRITE`; `O_TRUNC`
/// writes).
fn access_of(flags: i32) -> u32 {
    let access = match flags & libc::O_ACCMODE {
        libc::O_WRONLY => MAY_WRITE,
        libc::O_RDWR => MAY_READ | MAY_WRITE,
        _ => MAY_READ,
    };
    if flags & libc::O_TRUNC != 0 {
        access | MAY_WRITE
    } else {
        access
    }
}

/// `mode` without its set-user-id bit and, when group-executable, its set-group-id bit;
/// `None` when neither is to be cleared.
fn killed_suidgid(mode: u32) -> Option<u32> {
    let mut kill = libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kill |= libc::S_ISGID;
    }
    (mode & kill != 0).then_some(mode & !kill)
}

impl MountCore {
    /// `getattr`: the mount's own copy when it holds back changes of the file or learnt
    /// it within the TTL (`attrs.rs`), else the servers' (after sending gathered writes).
    pub async fn getattr(&self, caller: &Caller, ino: u64) -> Result<Attr, Errno> {
        if ino == STATS_INO {
            return Ok(stats_attr());
        }
        if let Some(a) = self.held_back_view(ino).await.or_else(|| self.attrs.fresh(ino)) {
            return Ok(self.shown(a));
        }
        self.flush_ino(ino).await?;
        let p = self.path(ino)?;
        let client = self.as_caller(caller);
        let a = match self.attrs.kind(ino) == Some(FileKind::Dir) {
            true => self.run(client.lstat_dir(&p)).await?,
            false => self.run(client.lstat(&p)).await?,
        };
        self.attrs.learnt(&a);
        Ok(self.shown(a))
    }

    /// The attributes of `ino` as this mount shows them while it holds back changes: the
    /// copy they apply to, grown by the gathered bytes. `None` when nothing is held back
    /// or no copy is known.
    pub(super) async fn held_back_view(&self, ino: u64) -> Option<Attr> {
        let slot = self.writes.get(ino)?;
        let held = slot.lock().await;
        if held.is_empty() {
            return None;
        }
        Some(held.grown(self.attrs.any(ino)?))
    }

    /// `setattr` (`chmod`, `chown`, `utimens`, `truncate`) for `caller`. On a file open
    /// here, a change the servers accept anyway is held back and sent with the file's next
    /// flush (`attrs.rs`); anything else is sent now, after the gathered writes. A size
    /// change through an open descriptor (`ftruncate`, handle `fh`) goes as the handle's
    /// opener, through the handle (`Cred::through_handle`): the kernel allows it on
    /// descriptors open for writing, whose rights `open` checked.
    pub async fn setattr(&self, caller: &Caller, ino: u64, set: SetAttr, fh: Option<u64>) -> Result<Attr, Errno> {
        let size_only = SetAttr { size: set.size, ..Default::default() } == set;
        let opener = fh.filter(|_| set.size.is_some() && size_only).map(|fh| self.opener(fh));
        let caller = opener.as_ref().unwrap_or(caller);
        if let Some(a) = self.hold_back(caller, ino, &set).await? {
            return Ok(self.shown(a));
        }
        self.flush_ino(ino).await?;
        let path = self.path(ino)?;
        let set = self.with_suidgid_killed(ino, &path, set).await?;
        let client = match opener {
            Some(_) => self.through(caller),
            None => self.as_caller(caller),
        };
        let a = match self.attrs.kind(ino) == Some(FileKind::Dir) {
            true => self.run(client.setattr_dir(&path, set)).await?,
            false => self.run(client.setattr(&path, set)).await?,
        };
        self.attrs.learnt(&a);
        Ok(self.shown(a))
    }

    /// `chown` of a regular file clears its set-user-id bit, and its set-group-id bit
    /// when it is group-executable, as on Linux (the kernel leaves this to the mount,
    /// `FUSE_HANDLE_KILLPRIV_V2`): `set` with that mode change added when it applies.
    async fn with_suidgid_killed(&self, ino: u64, path: &str, mut set: SetAttr) -> Result<SetAttr, Errno> {
        if set.mode.is_some() || (set.uid.is_none() && set.gid.is_none()) {
            return Ok(set);
        }
        let cur = self.current_attr(ino, path).await?;
        if cur.kind == FileKind::File {
            set.mode = killed_suidgid(cur.mode).map(|m| m & 0o7777);
        }
        Ok(set)
    }

    /// The mount's copy of the attributes of `ino` (at `path`), or the servers'.
    async fn current_attr(&self, ino: u64, path: &str) -> Result<Attr, Errno> {
        match self.attrs.any(ino) {
            Some(a) => Ok(a),
            None => self.run(self.client().lstat(path)).await,
        }
    }

    /// A `write` by a caller without `CAP_FSETID` (the kernel's `FUSE_WRITE_KILL_SUIDGID`)
    /// through handle `fh` clears the file's set-user-id and set-group-id bits first, as
    /// on Linux. The servers clear them with every write of a caller other than root, so
    /// only a root opener's write needs the change sent here.
    pub async fn kill_suidgid(&self, ino: u64, fh: u64) -> Result<(), Errno> {
        if self.opener(fh).uid != 0 {
            // The servers clear the bits when the write reaches them (it is made by its
            // opener); the mount's copy shows it at once, as `fstat` after `write` must.
            if let Some(mut a) = self.attrs.any(ino) {
                if let Some(mode) = killed_suidgid(a.mode) {
                    a.mode = mode;
                    self.attrs.learnt(&a);
                }
            }
            return Ok(());
        }
        let path = self.path(ino)?;
        let cur = self.current_attr(ino, &path).await?;
        let Some(mode) = killed_suidgid(cur.mode) else { return Ok(()) };
        self.flush_ino(ino).await?;
        let set = SetAttr { mode: Some(mode & 0o7777), ..Default::default() };
        let a = self.run(self.client().setattr(&path, set)).await?;
        self.attrs.learnt(&a);
        Ok(())
    }

    /// Holds `set` back if it may be (see [`deferrable`]); returns the attributes the
    /// file shows with it, or `None` when it must be sent now.
    async fn hold_back(&self, caller: &Caller, ino: u64, set: &SetAttr) -> Result<Option<Attr>, Errno> {
        if !self.open_files().is_open(ino) {
            return Ok(None);
        }
        let Some(cur) = self.attrs.any(ino).filter(|a| deferrable(caller, a, set)) else {
            return Ok(None);
        };
        let path = self.path(ino)?;
        let slot = self.writes.slot(ino);
        let mut held = slot.lock().await;
        let now = Timespec::now();
        let set = fixed(set.clone(), now);
        let combined = match held.set.take() {
            Some((c, earlier)) if c == *caller => merged(earlier, set.clone()),
            Some(_) => return Ok(None), // another caller's change is held: keep them apart
            None => set.clone(),
        };
        held.set = Some((caller.clone(), combined));
        held.set_path = path;
        let after = applied(cur, &set, now);
        self.attrs.learnt(&after);
        Ok(Some(held.grown(after)))
    }

    /// `readlink`.
    pub async fn readlink(&self, caller: &Caller, ino: u64) -> Result<String, Errno> {
        let p = self.path(ino)?;
        self.run(self.as_caller(caller).readlink(&p)).await
    }

    /// `access(2)` with `mask` (`R_OK | W_OK | X_OK`, or `F_OK`): the entry is looked at as
    /// the caller (the servers check search permission on its path), then its permission
    /// bits are compared with the caller's. Root may read and write anything, and execute
    /// a directory or a file with some execute bit.
    pub async fn access(&self, caller: &Caller, ino: u64, mask: i32) -> Result<(), Errno> {
        let p = self.path(ino)?;
        let a = self.run(self.as_caller(caller).lstat(&p)).await?;
        let want = (mask & 7) as u32;
        let root_exec = want & MAY_EXEC == 0 || a.kind == FileKind::Dir || a.mode & 0o111 != 0;
        match caller.cred().may(a.mode, a.uid, a.gid, want) && (caller.uid != 0 || root_exec) {
            true => Ok(()),
            false => Err(Errno::EACCES),
        }
    }

    /// `open` with the `open(2)` `flags`: `O_TRUNC` empties a regular file on behalf of
    /// `caller`. Cached pages survive the open only when the file is unchanged since its
    /// previous open here (close-to-open consistency, `page_cache.rs`).
    pub async fn open(&self, caller: &Caller, ino: u64, flags: i32) -> Result<Opened, Errno> {
        if ino == STATS_INO {
            return Ok(Opened { fh: self.open_control(flags)?, keep_cache: false });
        }
        let p = self.path(ino)?;
        let truncate = flags & libc::O_TRUNC != 0;
        if truncate {
            self.flush_ino(ino).await?;
        }
        let mut a = self.run(self.as_caller(caller).open_with(&p, access_of(flags))).await?.attr;
        self.attrs.learnt(&a);
        if truncate && a.kind == FileKind::File && a.size > 0 {
            a = self.run(self.as_caller(caller).truncate(&p, 0)).await?;
            self.attrs.learnt(&a);
        }
        let keep_cache = a.kind == FileKind::File && self.pages.keep(&a);
        let fh = self.next_id();
        self.open_files().opened(ino, fh, caller);
        Ok(Opened { fh, keep_cache })
    }

    /// Opens the control file (read only): its reader sees the counts of now.
    fn open_control(&self, flags: i32) -> Result<u64, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EACCES);
        }
        let fh = self.next_id();
        let c = &self.client;
        let (put, got, caps) = c.direct_io_stats();
        let w = c.delegation_work();
        let deleg = format!(
            "delegations held {} pending {} written {}\n\
             delegation work visited {} grants {} granted {} learnt {}\n\
             direct io written {put} read {got} capabilities {caps}\n{}{}",
            c.delegations_held(),
            c.delegated_pending(),
            c.delegated_written(),
            w.visited,
            w.grants,
            w.granted,
            w.learnt,
            self.transport_line(),
            self.kernel_cache_line(),
        );
        self.stats.open(fh, &deleg);
        Ok(fh)
    }

    /// `create`: creates (or with `O_EXCL` in `flags`, only creates) and opens `name` in
    /// `parent` for `caller`, emptying an existing file for `O_TRUNC`; the attributes and
    /// the open handle.
    pub async fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, u64), Errno> {
        let p = self.child(parent, name)?;
        let c = self.as_creator(caller, umask);
        let exclusive = flags & libc::O_EXCL != 0;
        let fh = self.run(c.create_with(&p, mode & 0o7777, exclusive, access_of(flags))).await?;
        let mut attr = fh.attr;
        if flags & libc::O_TRUNC != 0 && attr.size > 0 {
            attr = self.run(c.truncate(&p, 0)).await?;
        }
        self.dir_changed(parent);
        self.remember(&p, &attr);
        let fh = self.next_id();
        self.open_files().opened(attr.ino, fh, caller);
        Ok((attr, fh))
    }

    /// `read` through handle `fh`: up to `size` bytes at `offset`, after sending the
    /// file's gathered writes; as the handle's opener.
    pub async fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        if ino == STATS_INO {
            return Ok(self.stats.read(fh, offset, size));
        }
        self.flush_ino(ino).await?;
        let p = self.path(ino)?;
        self.run(self.through(&self.opener(fh)).read(&p, offset, size as usize)).await
    }

    /// `write` of `data` at `offset` through handle `fh`, as its opener; `flags` are the
    /// file's open flags (`O_APPEND` writes at the end, at once). Other writes are
    /// gathered. Returns the bytes taken.
    pub async fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8], flags: i32) -> Result<u32, Errno> {
        let p = self.path(ino)?;
        let opener = self.opener(fh);
        if flags & libc::O_APPEND != 0 {
            self.flush_ino(ino).await?;
            let a = self.run(self.through(&opener).append(&p, data)).await?;
            self.attrs.learnt(&a);
            return Ok(data.len() as u32);
        }
        let slot = self.writes.slot(ino);
        let mut pending = slot.lock().await;
        // Cached pages may now hold bytes the servers do not have yet (or never will).
        self.pages.forget(ino);
        if let Some(earlier) = gather(&mut pending.data, (&opener, &p), offset, data) {
            self.write_behind(&mut pending, ino, earlier).await?;
        }
        Ok(data.len() as u32)
    }

    /// `flush` (each `close`): gathered writes are stored before it returns (each sent as
    /// the caller that wrote it).
    pub async fn flush(&self, ino: u64) -> Result<(), Errno> {
        if ino == STATS_INO {
            return Ok(());
        }
        self.flush_reporting(ino).await
    }

    /// `fsync` through handle `fh`: gathered writes are sent, and the file is durable
    /// when it returns.
    pub async fn fsync(&self, ino: u64, fh: u64) -> Result<(), Errno> {
        self.flush_reporting(ino).await?;
        let p = self.path(ino)?;
        self.run(self.through(&self.opener(fh)).fsync(&p)).await
    }

    /// `fsyncdir` and the mount's `sync`: every delegated directory's queued work is on
    /// the servers when it returns (the kernel does not pass `syncfs(2)` to FUSE file
    /// systems; `plusfs mount --sync` calls this). EIO if a server refused delegated work
    /// since the last sync.
    pub async fn sync(&self) -> Result<(), Errno> {
        self.run(self.client().sync()).await
    }

    /// At unmount: queued delegated work is written back and the delegations returned.
    pub async fn unmounting(&self) -> Result<(), Errno> {
        self.run(self.client().return_delegations()).await
    }

    /// `release` (the last close of one open): sends gathered writes and, after the last
    /// release of a file unlinked while open, removes its kept name. The error is the
    /// gathered writes'; a kept name that cannot be removed is only logged.
    pub async fn release(&self, ino: u64, fh: u64) -> Result<(), Errno> {
        if ino == STATS_INO {
            self.stats.release(fh);
            return Ok(());
        }
        let flushed = self.flush_reporting(ino).await;
        let opener = self.opener(fh);
        let orphan = self.open_files().released(ino, fh);
        self.writes.drop_idle(ino);
        if let Some(hidden) = orphan {
            match self.remove_orphan(&opener, &hidden).await {
                Ok(()) => self.inodes().unlinked(&hidden),
                Err(e) => tracing::warn!(path = hidden, error = %e, "cannot remove a closed orphan"),
            }
        }
        flushed
    }
}
