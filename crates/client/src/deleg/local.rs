//! Operations answered under a delegation: each checks what the server would check (the
//! same `plusfs_proto::perm` functions), changes this client's copy of the directory and
//! queues the operation (changes only under a write delegation). `None` means "not answerable here": the caller sends the request
//! to the server (after the queue, see `before`).

use super::held::{Found, Held, Local, MAX_BYTES, MAX_OPS};
use plusfs_proto::acl::{Acl, ACCESS_XATTR};
use plusfs_proto::perm::{self, Owned};
use plusfs_proto::{apply_set_at, Attr, Cred, DelegOp, DirEntry, Errno, FileKind, SetAttr, Timespec};
use plusfs_proto::{MAY_READ, MAY_WRITE};
use std::time::Instant;

/// A regular file, symlink or special file this client may change here (`Some(None)`: no
/// such entry; `None`: ask the server).
fn plain(f: Found<'_>) -> Option<Option<&Attr>> {
    match f {
        Found::Absent => Some(None),
        Found::Here(Local::Known { attr, link: false, .. }) if attr.kind != FileKind::Dir => Some(Some(attr)),
        _ => None,
    }
}

/// What a new entry needs besides its name and mode.
pub(crate) struct NewEntry<'a> {
    pub kind: FileKind,
    pub exclusive: bool,
    /// `MAY_*` the opener will use if the file exists.
    pub access: u32,
    pub target: Option<&'a str>,
    pub rdev: u32,
    /// Owner asked for (honoured for root, as by the server).
    pub asked: (u32, u32),
}

impl Held {
    fn queue(&mut self, op: DelegOp) {
        self.pending_bytes += op.data_len() + 64;
        self.since.get_or_insert_with(Instant::now);
        self.pending.push(op);
    }

    fn touch(&mut self) {
        self.last_use = Instant::now();
    }

    /// A call of `c` here: marks the delegation used and checks that `c` may reach the
    /// directory's entries (search permission on it and its ancestors).
    fn enter(&mut self, c: &Cred) -> Result<(), Errno> {
        self.touch();
        perm::check_search(c, &self.obj, &self.dir).map_err(|e| e.errno)
    }

    /// Whether the queue is big enough to be written back now.
    pub fn full(&self) -> bool {
        self.pending.len() >= MAX_OPS || self.pending_bytes >= MAX_BYTES
    }

    /// `lstat` of entry `name`: its attributes or ENOENT (`None`: a subdirectory, a hard
    /// link or an entry changed through the server).
    pub fn lookup(&mut self, name: &str, c: &Cred) -> Option<Result<Attr, Errno>> {
        if let Err(e) = self.enter(c) {
            return Some(Err(e));
        }
        match plain(self.find(name))? {
            None => Some(Err(Errno::ENOENT)),
            Some(a) => Some(Ok(a.clone())),
        }
    }

    /// A batch stat (`statv`) of `names`: what the server's batch stat would answer for
    /// each — a subdirectory's kind and inode only, ENOENT for a missing name — or `None`
    /// for a hard link or an entry changed through the server (ask the server). Err when
    /// `c` may not search the directory (the whole batch fails, as on the server).
    #[allow(clippy::type_complexity)]
    pub fn stat_entries(&mut self, names: &[String], c: &Cred) -> Result<Vec<Option<Result<Attr, Errno>>>, Errno> {
        self.enter(c)?;
        let one = |name: &String| match self.find(name) {
            _ if plusfs_proto::path::check_name(name).is_err() => None, // the server says why
            Found::Absent => Some(Err(Errno::ENOENT)),
            Found::Here(Local::Known { attr, link: false, .. }) => Some(Ok(attr.clone())),
            _ => None,
        };
        Ok(names.iter().map(one).collect())
    }

    /// The whole listing, in name order as the server lists it. `None` when an entry
    /// changed through the server is not known here.
    pub fn listing(&mut self, c: &Cred) -> Option<Result<Vec<DirEntry>, Errno>> {
        self.touch();
        if !self.whole() {
            return None;
        }
        let o = &self.obj;
        let allowed =
            perm::check_search_above(c, o, &self.dir).and_then(|()| perm::check_dir(c, o, MAY_READ, &self.dir));
        if let Err(e) = allowed {
            return Some(Err(e.errno));
        }
        let mut out = Vec::with_capacity(self.entries.len());
        for (name, l) in &self.entries {
            let Local::Known { attr, .. } = l else { return None };
            out.push(DirEntry { name: name.clone(), ino: attr.ino, kind: attr.kind });
        }
        Some(Ok(out))
    }

    /// The directory's own attributes for `c`, unless a request sent to the server changed
    /// them (or `c` may not reach the directory: the server answers why).
    pub fn dir_attr(&self, c: &Cred) -> Option<Attr> {
        perm::check_search_above(c, &self.obj, &self.dir).ok()?;
        (!self.dir_stale).then(|| Attr::of_dir(&self.obj))
    }

    /// Learns the attributes the server gave for the directory itself. (Entries changed
    /// through the server are not learnt back: their attributes do not tell whether they
    /// are in hard-link form, which only their server may change.)
    pub fn learn_dir(&mut self, a: &Attr) {
        if a.kind != FileKind::Dir {
            return;
        }
        let o = &mut self.obj;
        (o.mode, o.uid, o.gid) = (a.mode, a.uid, a.gid);
        (o.atime, o.mtime, o.ctime) = (a.atime, a.mtime, a.ctime);
        o.entries = a.size;
        o.subdirs = (a.nlink as u64).saturating_sub(2);
        self.dir_stale = false;
    }

    /// `setattr` of the delegated directory itself (`chmod`, `chown`, `utimens`), when the
    /// change stays in its own object (`DirObject::change_stays_here`); `None` (ask the
    /// server) for a read delegation, a shard, a directory whose object changed through
    /// the server, or a change other servers must see.
    pub fn set_dir_attr(&mut self, set: &SetAttr, c: &Cred) -> Option<Result<Attr, Errno>> {
        if self.read || self.shard.is_some() || self.dir_stale || set.size.is_some() {
            return None;
        }
        self.touch();
        if let Err(e) = perm::check_search_above(c, &self.obj, &self.dir) {
            return Some(Err(e.errno));
        }
        let set = match perm::check_setattr(c, &Owned::of_dir(&self.obj), set, &self.dir) {
            Ok(s) => s,
            Err(e) => return Some(Err(e.errno)),
        };
        let now = Timespec::now();
        let n = self.obj.with_set(&set, now);
        if !self.obj.change_stays_here(&n) {
            return None;
        }
        self.obj = n;
        let by = Cred::index_in(&mut self.creds, c);
        self.queue(DelegOp::DirAttr { set, time: now, by });
        Some(Ok(Attr::of_dir(&self.obj)))
    }

    /// Creates `name` (or, without `exclusive`, opens the file there).
    pub fn create(&mut self, name: &str, mode: u32, new: NewEntry<'_>, c: &Cred) -> Option<Result<Attr, Errno>> {
        if self.read {
            return None;
        }
        if let Err(e) = self.enter(c) {
            return Some(Err(e));
        }
        match self.find(name) {
            Found::Here(Local::Known { .. }) if new.exclusive => return Some(Err(Errno::EEXIST)),
            Found::Here(Local::Known { attr, link: false, .. }) if attr.kind == FileKind::File => {
                let attr = attr.clone();
                return Some(self.may_open(name, &attr, new.access, c).map(|_| attr));
            }
            Found::Here(_) | Found::AskServer => return None,
            Found::Absent => {}
        }
        let checked = perm::check_dir_write(c, &self.obj, &self.dir).and_then(|_| perm::check_mknod(c, new.kind, name));
        if let Err(e) = checked {
            return Some(Err(e.errno));
        }
        if self.next_ino >= self.ino_end {
            return None;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        // The server derives the same ACL from the directory's default ACL at write-back.
        let perm::NewEntry { uid, gid, mode, xattrs } = perm::new_entry(c, &self.obj, new.asked, mode, new.kind);
        let now = Timespec::now();
        let size = new.target.map_or(0, |t| t.len() as u64);
        let rdev = if matches!(new.kind, FileKind::BlockDev | FileKind::CharDev) { new.rdev } else { 0 };
        let attr = Attr {
            ino,
            kind: new.kind,
            mode,
            uid,
            gid,
            size,
            nlink: 1,
            atime: now,
            mtime: now,
            ctime: now,
            incarnation: 0,
            rdev,
        };
        self.obj.count_entry(new.kind, 1, now);
        let by = Cred::index_in(&mut self.creds, c);
        let target = new.target.map(str::to_string);
        self.queue(DelegOp::Create {
            name: name.to_string(),
            ino,
            kind: new.kind,
            mode,
            uid,
            gid,
            rdev,
            target: target.clone(),
            time: now,
            by,
        });
        let content = (new.kind == FileKind::File).then(Vec::new);
        let acl = Acl::in_xattrs(&xattrs, ACCESS_XATTR);
        let l = Local::Known { attr: attr.clone(), target, content, dirty: false, link: false, acl };
        self.entries.insert(name.to_string(), l);
        Some(Ok(attr))
    }

    /// Whether `c` may open entry `name` (attributes `a`) for `access`.
    fn may_open(&self, name: &str, a: &Attr, access: u32, c: &Cred) -> Result<(), Errno> {
        let acl = self.acl_of(name);
        for want in [MAY_READ, MAY_WRITE].into_iter().filter(|w| access & w != 0) {
            if !perm::may_acl(c, a.mode, a.uid, a.gid, acl, want) {
                return Err(Errno::EACCES);
            }
        }
        Ok(())
    }

    /// The access ACL of entry `name`, if it has one.
    fn acl_of(&self, name: &str) -> Option<&Acl> {
        match self.entries.get(name) {
            Some(Local::Known { acl, .. }) => acl.as_ref(),
            _ => None,
        }
    }

    /// `open` of an existing entry.
    pub fn open(&mut self, name: &str, access: u32, c: &Cred) -> Option<Result<Attr, Errno>> {
        if let Err(e) = self.enter(c) {
            return Some(Err(e));
        }
        match plain(self.find(name))? {
            None => Some(Err(Errno::ENOENT)),
            Some(a) => {
                let a = a.clone();
                Some(self.may_open(name, &a, access, c).map(|_| a))
            }
        }
    }

    /// `unlink` of a non-directory.
    pub fn unlink(&mut self, name: &str, c: &Cred) -> Option<Result<(), Errno>> {
        if self.read {
            return None;
        }
        self.touch();
        let a = match plain(self.find(name))? {
            None => return Some(Err(Errno::ENOENT)),
            Some(a) => a.clone(),
        };
        let checked = perm::check_dir_write(c, &self.obj, &self.dir)
            .and_then(|_| perm::check_sticky(c, &self.obj, a.uid, &self.dir));
        if let Err(e) = checked {
            return Some(Err(e.errno));
        }
        let now = Timespec::now();
        self.obj.count_entry(a.kind, -1, now);
        self.drop_entry(name);
        if self.cancel_create(name) {
            self.queue(DelegOp::Touch { time: now });
        } else {
            let by = Cred::index_in(&mut self.creds, c);
            self.queue(DelegOp::Unlink { name: name.to_string(), time: now, by });
        }
        Some(Ok(()))
    }

    /// Drops the queued creation of `name` and every later queued operation on it, when
    /// the file was created since the last flush and not renamed since: its removal
    /// then leaves nothing of it to write back. Whether it did.
    fn cancel_create(&mut self, name: &str) -> bool {
        let created = |op: &DelegOp| matches!(op, DelegOp::Create { name: n, .. } if n == name);
        let Some(k) = self.pending.iter().rposition(created) else {
            return false;
        };
        let renamed = |op: &DelegOp| matches!(op, DelegOp::Rename { from, to, .. } if from == name || to == name);
        if self.pending[k + 1..].iter().any(renamed) {
            return false;
        }
        let mut i = 0;
        self.pending.retain(|op| {
            i += 1;
            let drop = i > k && op.names().contains(&name);
            if drop {
                self.pending_bytes = self.pending_bytes.saturating_sub(op.data_len() + 64);
            }
            !drop
        });
        true
    }

    /// `rename` of a non-directory within the directory, over a non-directory or nothing.
    pub fn rename(&mut self, from: &str, to: &str, c: &Cred) -> Option<Result<(), Errno>> {
        if self.read {
            return None;
        }
        self.touch();
        let a = match plain(self.find(from))? {
            None => return Some(Err(Errno::ENOENT)),
            Some(a) => a.clone(),
        };
        let old = plain(self.find(to))?.cloned();
        let mut checked = perm::check_dir_write(c, &self.obj, &self.dir)
            .and_then(|_| perm::check_sticky(c, &self.obj, a.uid, &self.dir));
        if let (Ok(()), Some(o)) = (&checked, &old) {
            checked = perm::check_sticky(c, &self.obj, o.uid, &self.dir);
        }
        if let Err(e) = checked {
            return Some(Err(e.errno));
        }
        if from == to {
            return Some(Ok(()));
        }
        let now = Timespec::now();
        if let Some(o) = old {
            self.obj.count_entry(o.kind, -1, now);
        }
        (self.obj.mtime, self.obj.ctime) = (now, now);
        let mut l = self.entries.remove(from).expect("checked above");
        self.drop_entry(from);
        if let Local::Known { attr, .. } = &mut l {
            attr.ctime = now;
        }
        self.entries.insert(to.to_string(), l);
        self.dirty.remove(to);
        if self.dirty.remove(from) {
            self.dirty.insert(to.to_string());
        }
        let by = Cred::index_in(&mut self.creds, c);
        self.queue(DelegOp::Rename { from: from.to_string(), to: to.to_string(), time: now, by });
        Some(Ok(()))
    }

    /// `setattr` of a non-directory; a size change only of a file whose contents are
    /// known here, up to `small` bytes.
    pub fn setattr(&mut self, name: &str, set: &SetAttr, c: &Cred, small: u64) -> Option<Result<Attr, Errno>> {
        if self.read {
            return None;
        }
        if let Err(e) = self.enter(c) {
            return Some(Err(e));
        }
        let a = match plain(self.find(name))? {
            None => return Some(Err(Errno::ENOENT)),
            Some(a) => a.clone(),
        };
        let cur = Owned { mode: a.mode, uid: a.uid, gid: a.gid, dir: false, acl: self.acl_of(name).cloned() };
        let mut set = match perm::check_setattr(c, &cur, set, name) {
            Ok(s) => s,
            Err(e) => return Some(Err(e.errno)),
        };
        let size = set.size.take();
        if let Some(s) = size {
            let known = matches!(self.entries.get(name), Some(Local::Known { content: Some(_), .. }));
            if !known || s > small || a.kind != FileKind::File {
                return None;
            }
        }
        // Times set to "now" stay so in the queued operation: the server replays it at
        // the operation's time, checking what `utimensat(NULL)` needs (write permission),
        // not what explicit times need (ownership).
        let now = Timespec::now();
        let Some(Local::Known { attr, content, dirty, acl, .. }) = self.entries.get_mut(name) else { return None };
        apply_set_at(
            &set,
            now,
            (&mut attr.mode, &mut attr.uid, &mut attr.gid),
            (&mut attr.atime, &mut attr.mtime, &mut attr.ctime),
        );
        if let (Some(m), Some(a)) = (set.mode, acl.as_mut()) {
            a.chmod(m); // as the server does at write-back (`acl::chmod_xattrs`)
        }
        if let (Some(s), Some(c)) = (size, content.as_mut()) {
            c.resize(s as usize, 0);
            attr.size = s;
            (attr.mtime, attr.ctime) = (now, now);
            *dirty = true;
            self.dirty.insert(name.to_string());
        }
        let out = attr.clone();
        if set != SetAttr::default() {
            let by = Cred::index_in(&mut self.creds, c);
            self.queue(DelegOp::SetAttr { name: name.to_string(), set, time: now, by });
        } else {
            self.since.get_or_insert_with(Instant::now);
        }
        Some(Ok(out))
    }

    /// Whether `c` may do `want` (`MAY_READ` or `MAY_WRITE`) to the contents of entry
    /// `name` here, as the server checks a read or write by path (search on the
    /// directory, the entry's bits or ACL; the owner through a descriptor it opened). A
    /// caller who may not is answered by the server.
    fn may_io(&self, name: &str, want: u32, c: &Cred) -> bool {
        let Some(Local::Known { attr, acl, .. }) = self.entries.get(name) else { return false };
        perm::check_search(c, &self.obj, &self.dir).is_ok()
            && (c.owner_through_handle(attr.uid) || perm::may_acl(c, attr.mode, attr.uid, attr.gid, acl.as_ref(), want))
    }

    /// A write of `data` at `offset` of a file whose contents are known here by `c`, if
    /// the file stays within `small` bytes. A write that must clear set-id bits (by anyone
    /// but root) is the server's.
    pub fn write(&mut self, name: &str, offset: u64, data: &[u8], small: u64, c: &Cred) -> Option<Attr> {
        if self.read || !self.may_io(name, MAY_WRITE, c) {
            return None;
        }
        self.touch();
        let Some(Local::Known { attr, content: Some(c_), dirty, link: false, .. }) = self.entries.get_mut(name) else {
            return None;
        };
        if !c.is_root() && perm::kill_suid(attr.mode) != attr.mode {
            return None;
        }
        let c = c_;
        let end = offset.checked_add(data.len() as u64)?;
        if end.max(c.len() as u64) > small {
            return None;
        }
        if c.len() < end as usize {
            c.resize(end as usize, 0);
        }
        c[offset as usize..end as usize].copy_from_slice(data);
        let now = Timespec::now();
        (attr.size, attr.mtime, attr.ctime) = (c.len() as u64, now, now);
        *dirty = true;
        self.dirty.insert(name.to_string());
        let out = attr.clone();
        self.pending_bytes += data.len();
        self.since.get_or_insert_with(Instant::now);
        Some(out)
    }

    /// Bytes `[offset, offset + len)` of a file whose contents are known here, read by `c`.
    pub fn read(&mut self, name: &str, offset: u64, len: usize, c: &Cred) -> Option<Vec<u8>> {
        if !self.may_io(name, MAY_READ, c) {
            return None;
        }
        self.touch();
        let Some(Local::Known { content: Some(c), .. }) = self.entries.get(name) else { return None };
        let start = (offset as usize).min(c.len());
        let end = start.saturating_add(len).min(c.len());
        Some(c[start..end].to_vec())
    }

    /// The target of symlink `name`, when known here.
    pub fn readlink(&mut self, name: &str, c: &Cred) -> Option<String> {
        // A caller without search permission is answered by the server (with EACCES).
        perm::check_search(c, &self.obj, &self.dir).ok()?;
        match self.entries.get(name) {
            Some(Local::Known { target: Some(t), attr, .. }) if attr.kind == FileKind::Symlink => Some(t.clone()),
            _ => None,
        }
    }
}
