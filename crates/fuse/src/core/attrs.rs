//! What the mount knows of attributes: the copies its own calls returned, and the
//! attribute changes it holds back for an open file.
//!
//! Every call that returns attributes (lookup, create, mkdir, setattr, readdirplus, a
//! write) leaves a copy here, and calls that change an entry without returning its new
//! attributes (unlink, rename, link, a create in a directory) drop the copies they made
//! stale. `getattr` is answered from a copy younger than the TTL, so the kernel's
//! requests after the mount's own changes need no server round trip; another mount's
//! changes still appear within the TTL, as with the kernel's own cache.
//!
//! The `chown`/`chmod`/`utimens` that `tar`, `cp -a` and `rsync` send after writing a
//! file they hold open are *deferred* when the mount can tell the servers will accept
//! them (see [`deferrable`]): answered from the copy at once and sent, merged into one
//! request, with the file's gathered writes at its next flush (at the latest, `close`).

use super::types::Caller;
use plusfs_proto::{Attr, FileKind, SetAttr, TimeSet, Timespec};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Attribute copies by inode number, with the time they were learnt; and the kind of
/// each inode seen (which does not change, so it outlives a stale copy).
pub(crate) struct AttrCache {
    ttl: Duration,
    known: Mutex<HashMap<u64, (Attr, Instant)>>,
    kinds: Mutex<HashMap<u64, FileKind>>,
}

impl AttrCache {
    /// A cache whose copies are answered for `ttl`.
    pub fn new(ttl: Duration) -> AttrCache {
        AttrCache { ttl, known: Mutex::default(), kinds: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, (Attr, Instant)>> {
        self.known.lock().expect("attribute cache")
    }

    /// Keeps `a` as the attributes of its inode, learnt now.
    pub fn learnt(&self, a: &Attr) {
        self.lock().insert(a.ino, (a.clone(), Instant::now()));
        self.kinds.lock().expect("inode kinds").insert(a.ino, a.kind);
    }

    /// The kind of `ino`, if it was ever seen (also after its copy went stale).
    pub fn kind(&self, ino: u64) -> Option<FileKind> {
        self.kinds.lock().expect("inode kinds").get(&ino).copied()
    }

    /// Drops the copy of `ino` (changed in a way the mount does not know exactly).
    pub fn stale(&self, ino: u64) {
        self.lock().remove(&ino);
    }

    /// How long copies are answered.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The copy of `ino` if it is younger than the TTL.
    pub fn fresh(&self, ino: u64) -> Option<Attr> {
        let known = self.lock();
        let (a, at) = known.get(&ino)?;
        (at.elapsed() < self.ttl).then(|| a.clone())
    }

    /// The copy of `ino`, however old (the base that held-back changes apply to).
    pub fn any(&self, ino: u64) -> Option<Attr> {
        self.lock().get(&ino).map(|(a, _)| a.clone())
    }

    /// Forgets everything (the kernel forgot the inode).
    pub fn forget(&self, ino: u64) {
        self.stale(ino);
        self.kinds.lock().expect("inode kinds").remove(&ino);
    }
}

/// Whether `set`, asked by `caller` on a file with attributes `cur`, may be held back:
/// no size change, a regular file without set-user/group-id bits before or after, and a
/// caller the servers accept it from whatever it is (root, or the owner changing only
/// mode and times). Everything else is sent at once, so its error reaches its caller.
pub(crate) fn deferrable(caller: &Caller, cur: &Attr, set: &SetAttr) -> bool {
    let special = libc::S_ISUID | libc::S_ISGID;
    let owner_only = caller.uid == cur.uid && set.uid.is_none() && set.gid.is_none();
    set.size.is_none()
        && cur.kind == FileKind::File
        && cur.mode & special == 0
        && set.mode.is_none_or(|m| m & special == 0)
        && (caller.uid == 0 || owner_only)
}

/// `set` with times given as "now" fixed to `now` (a held-back change is sent later).
pub(crate) fn fixed(mut set: SetAttr, now: Timespec) -> SetAttr {
    for t in [&mut set.atime, &mut set.mtime] {
        if *t == Some(TimeSet::Now) {
            *t = Some(TimeSet::At(now));
        }
    }
    set
}

/// `later` applied after `earlier`: one change with the fields of both, `later`'s winning.
pub(crate) fn merged(earlier: SetAttr, later: SetAttr) -> SetAttr {
    SetAttr {
        mode: later.mode.or(earlier.mode),
        uid: later.uid.or(earlier.uid),
        gid: later.gid.or(earlier.gid),
        atime: later.atime.or(earlier.atime),
        mtime: later.mtime.or(earlier.mtime),
        size: later.size.or(earlier.size),
    }
}

/// The attributes `cur` takes from `set` (times already fixed), changed at `now`.
pub(crate) fn applied(mut cur: Attr, set: &SetAttr, now: Timespec) -> Attr {
    if let Some(m) = set.mode {
        cur.mode = (cur.mode & !0o7777) | (m & 0o7777);
    }
    cur.uid = set.uid.unwrap_or(cur.uid);
    cur.gid = set.gid.unwrap_or(cur.gid);
    let at = |t: &Option<TimeSet>, old: Timespec| match t {
        Some(TimeSet::At(t)) => *t,
        Some(TimeSet::Now) => now,
        None => old,
    };
    cur.atime = at(&set.atime, cur.atime);
    cur.mtime = at(&set.mtime, cur.mtime);
    cur.ctime = now;
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(uid: u32, mode: u32) -> Attr {
        let t = Timespec { sec: 1, nsec: 0 };
        Attr {
            ino: 9,
            kind: FileKind::File,
            mode,
            uid,
            gid: 100,
            size: 3,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
            incarnation: 0,
            rdev: 0,
        }
    }

    #[test]
    fn only_changes_the_servers_accept_anyway_are_held_back() {
        let (root, alice) = (&Caller::ROOT, &Caller { uid: 1000, gid: 100, groups: vec![] });
        let chown = SetAttr { uid: Some(5), gid: Some(6), ..Default::default() };
        let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
        assert!(deferrable(root, &file(1000, 0o644), &chown));
        assert!(!deferrable(alice, &file(1000, 0o644), &chown), "chown by a user may fail");
        assert!(deferrable(alice, &file(1000, 0o644), &chmod));
        assert!(!deferrable(alice, &file(2000, 0o644), &chmod), "not the owner");
        assert!(!deferrable(root, &file(1000, 0o4755), &chmod), "set-user-id bits change on chown");
        let setgid = SetAttr { mode: Some(0o2755), ..Default::default() };
        assert!(!deferrable(root, &file(1000, 0o755), &setgid));
        let truncate = SetAttr { size: Some(0), ..Default::default() };
        assert!(!deferrable(root, &file(1000, 0o644), &truncate));
    }

    #[test]
    fn held_back_changes_merge_and_apply() {
        let now = Timespec { sec: 50, nsec: 0 };
        let a = fixed(SetAttr { uid: Some(5), mtime: Some(TimeSet::Now), ..Default::default() }, now);
        assert_eq!(a.mtime, Some(TimeSet::At(now)));
        let b = SetAttr { mode: Some(0o600), mtime: Some(TimeSet::At(Timespec { sec: 7, nsec: 0 })), ..a.clone() };
        let m = merged(a, SetAttr { mode: b.mode, mtime: b.mtime, ..Default::default() });
        assert_eq!((m.uid, m.mode, m.mtime), (Some(5), Some(0o600), b.mtime));
        let after = applied(file(1000, 0o100644), &m, now);
        assert_eq!((after.uid, after.mode, after.mtime.sec, after.ctime), (5, 0o100600, 7, now));
    }
}
