//! Permission checks (POSIX, as Linux does them): pure functions of the caller's
//! credential and the attributes a server holds. Root (uid 0) passes every check as
//! Linux's `CAP_DAC_OVERRIDE`, `CAP_FOWNER` and `CAP_CHOWN` let it; it may search any
//! directory. Errors are `EACCES` (permission bits) or `EPERM` (ownership), naming the path.
//! Servers check every request with them; a client holding a directory delegation checks
//! the operations it answers itself with the same functions, so both decide alike.

use crate::acl::{Acl, DEFAULT_XATTR};
use crate::attr::{SetAttr, TimeSet, XattrOp};
use crate::cred::{Cred, MAY_EXEC, MAY_READ, MAY_WRITE};
use crate::errno::Errno;
use crate::error::WireError;
use crate::record::{Ancestry, DirObject};

/// The result of a check: an error names the path and says why.
pub type OpResult<T> = Result<T, WireError>;

fn err(errno: Errno, what: impl Into<String>) -> WireError {
    WireError::new(errno, what)
}

/// True when `cred` has every permission of `want` (`MAY_*` bits) on an object of `mode`
/// owned by `uid`:`gid`: the owner's bits for its owner, the group's for members, the
/// others' for everyone else.
pub fn may(cred: &Cred, mode: u32, uid: u32, gid: u32, want: u32) -> bool {
    cred.may(mode, uid, gid, want)
}

fn what(want: u32) -> &'static str {
    match want {
        MAY_READ => "read",
        MAY_WRITE => "write",
        MAY_EXEC => "search",
        _ => "access",
    }
}

/// `EACCES` unless `cred` has `want` on the object at `path`.
pub fn check(cred: &Cred, mode: u32, uid: u32, gid: u32, want: u32, path: &str) -> OpResult<()> {
    check_acl(cred, mode, uid, gid, None, want, path)
}

/// True when `cred` has every permission of `want` on an object of `mode` owned by
/// `uid`:`gid` with access ACL `acl` (`None`: its mode bits say everything). Root passes.
pub fn may_acl(cred: &Cred, mode: u32, uid: u32, gid: u32, acl: Option<&Acl>, want: u32) -> bool {
    match acl {
        Some(a) => cred.is_root() || a.permits(cred, uid, gid, want),
        None => may(cred, mode, uid, gid, want),
    }
}

/// `EACCES` unless `cred` has `want` on the object at `path`, whose access ACL is `acl`.
pub fn check_acl(cred: &Cred, mode: u32, uid: u32, gid: u32, acl: Option<&Acl>, want: u32, path: &str) -> OpResult<()> {
    match may_acl(cred, mode, uid, gid, acl, want) {
        true => Ok(()),
        false => Err(denied(format!("{} permission denied on '{path}'", what(want)))),
    }
}

/// `EACCES` unless `cred` has `want` on directory `dir` itself (its object `d`, mode bits
/// and access ACL).
pub fn check_dir(cred: &Cred, d: &DirObject, want: u32, dir: &str) -> OpResult<()> {
    check_acl(cred, d.mode, d.uid, d.gid, d.access_acl().as_ref(), want, dir)
}

fn denied(msg: String) -> WireError {
    err(Errno::EACCES, msg)
}

/// True when `cred` may search every directory an ancestry describes (`None`: an object
/// from before ancestries, no restriction).
pub fn may_search_all(cred: &Cred, anc: Option<&Ancestry>) -> bool {
    anc.is_none_or(|a| a.permits(cred))
}

/// Search permission on every directory from `/` to `dir` included (its object `d`): what
/// reaching an entry of `dir` takes.
pub fn check_search(cred: &Cred, d: &DirObject, dir: &str) -> OpResult<()> {
    match may_search_all(cred, d.ancestry.as_ref()) {
        true => Ok(()),
        false => Err(denied(format!("search permission denied on a directory of '{dir}'"))),
    }
}

/// Search permission on the directories above `dir` (its object `d`): what reaching the
/// directory itself takes.
pub fn check_search_above(cred: &Cred, d: &DirObject, dir: &str) -> OpResult<()> {
    let above = d.ancestry.clone().map(|a| a.without(d.search_elem()));
    match may_search_all(cred, above.as_ref()) {
        true => Ok(()),
        false => Err(denied(format!("search permission denied on a directory above '{dir}'"))),
    }
}

/// Search and write permission on directory `dir`: what adding or removing its entries
/// takes.
pub fn check_dir_write(cred: &Cred, d: &DirObject, dir: &str) -> OpResult<()> {
    check_search(cred, d, dir)?;
    check_dir(cred, d, MAY_WRITE, dir)
}

/// The sticky-directory rule: an entry (owned by `owner`) of a sticky directory `d` may
/// be removed or renamed only by its owner, the directory's owner or root (`EPERM`).
pub fn check_sticky(cred: &Cred, d: &DirObject, owner: u32, path: &str) -> OpResult<()> {
    if d.mode & libc::S_ISVTX == 0 || cred.is_root() || cred.uid == owner || cred.uid == d.uid {
        return Ok(());
    }
    Err(err(Errno::EPERM, format!("'{path}' is in a sticky directory and not the caller's")))
}

/// Linux's `CAP_MKNOD` rule: only root makes character and block device nodes (`EPERM`);
/// FIFOs, sockets and regular files anyone may.
pub fn check_mknod(cred: &Cred, kind: crate::FileKind, path: &str) -> OpResult<()> {
    let device = matches!(kind, crate::FileKind::CharDev | crate::FileKind::BlockDev);
    match device && !cred.is_root() {
        true => Err(err(Errno::EPERM, format!("mknod '{path}': only root makes device nodes"))),
        false => Ok(()),
    }
}

/// The attributes a file or directory has now, as a `setattr` check needs them.
#[derive(Debug, Clone)]
pub struct Owned {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub dir: bool,
    /// Its access ACL, when it has one beyond its mode bits.
    pub acl: Option<Acl>,
}

impl Owned {
    /// A directory's.
    pub fn of_dir(d: &DirObject) -> Owned {
        Owned { mode: d.mode, uid: d.uid, gid: d.gid, dir: true, acl: d.access_acl() }
    }

    /// A file's (any inode but a directory's).
    pub fn of_inode(i: &crate::record::Inode) -> Owned {
        Owned { mode: i.mode, uid: i.uid, gid: i.gid, dir: false, acl: i.access_acl() }
    }

    fn may(&self, cred: &Cred, want: u32) -> bool {
        may_acl(cred, self.mode, self.uid, self.gid, self.acl.as_ref(), want)
    }
}

/// Checks `set` against `cur` for `cred` (chmod, chown, utimes, truncate) and returns the
/// `SetAttr` to apply: the mode with the bits Linux clears (`S_ISGID` set by a non-member,
/// `S_ISUID`/`S_ISGID` of a file whose owner changes).
pub fn check_setattr(cred: &Cred, cur: &Owned, set: &SetAttr, path: &str) -> OpResult<SetAttr> {
    let owner = cred.is_root() || cred.uid == cur.uid;
    let eperm = |what: &str| err(Errno::EPERM, format!("{what} of '{path}': operation not permitted"));
    let mut out = set.clone();
    if let Some(u) = set.uid {
        // Root gives files away; an owner may only "change" the owner to itself.
        let keeps = cred.uid == cur.uid && u == cur.uid;
        if !(cred.is_root() || keeps) {
            return Err(eperm("chown"));
        }
    }
    if let Some(g) = set.gid {
        let member = cred.uid == cur.uid && (g == cur.gid || cred.in_group(g));
        if !(cred.is_root() || member) {
            return Err(eperm("chgrp"));
        }
    }
    if let Some(m) = set.mode {
        if !owner {
            return Err(eperm("chmod"));
        }
        let gid = set.gid.unwrap_or(cur.gid);
        if !cred.is_root() && !cred.in_group(gid) {
            out.mode = Some(m & !libc::S_ISGID);
        }
    }
    let explicit = [set.atime, set.mtime].iter().any(|t| matches!(t, Some(TimeSet::At(_))));
    if explicit && !owner {
        return Err(eperm("setting the times"));
    }
    if set.atime.is_some() || set.mtime.is_some() {
        check_owner_or(cred, cur, owner, path)?;
    }
    if set.size.is_some() && !cur.dir && !cred.owner_through_handle(cur.uid) {
        check_acl(cred, cur.mode, cur.uid, cur.gid, cur.acl.as_ref(), MAY_WRITE, path)?;
    }
    if (set.uid.is_some() || set.gid.is_some()) && !cur.dir {
        let mode = out.mode.unwrap_or(cur.mode);
        let cleared = kill_suid(mode);
        if cleared != mode {
            out.mode = Some(cleared);
        }
    }
    Ok(out)
}

/// Extended-attribute permissions (Linux `xattr_permission`): `user.` names need read
/// (get) or write (set, remove) permission on the object, `trusted.` names root
/// (`EPERM` for changes, `ENODATA` for reads); listing needs nothing. ACLs anyone may
/// read; only the owner or root may change them (`EPERM`), and only a directory has a
/// default ACL (`EACCES` elsewhere, as Linux answers).
pub fn check_xattr(cred: &Cred, cur: &Owned, op: &XattrOp, path: &str) -> OpResult<()> {
    let (name, want) = match op {
        XattrOp::List => return Ok(()),
        XattrOp::Get { name } => (name, MAY_READ),
        XattrOp::Set { name, .. } | XattrOp::Remove { name } => (name, MAY_WRITE),
    };
    if crate::acl::is_acl_name(name) {
        if want == MAY_READ {
            return Ok(());
        }
        if name == DEFAULT_XATTR && !cur.dir && matches!(op, XattrOp::Set { .. }) {
            return Err(err(Errno::EACCES, format!("'{path}' is no directory: it has no default ACL")));
        }
        return match cred.is_root() || cred.uid == cur.uid {
            true => Ok(()),
            false => Err(err(Errno::EPERM, format!("'{path}': only its owner or root may change its ACL"))),
        };
    }
    if name.starts_with("trusted.") && !cred.is_root() {
        return Err(match want {
            MAY_WRITE => err(Errno::EPERM, format!("'{path}': only root may change {name}")),
            _ => err(Errno::ENODATA, format!("'{path}' has no attribute {name} visible to the caller")),
        });
    }
    check_acl(cred, cur.mode, cur.uid, cur.gid, cur.acl.as_ref(), want, path)
}

/// Times set to "now" need ownership or write permission (`EACCES`).
fn check_owner_or(cred: &Cred, cur: &Owned, owner: bool, path: &str) -> OpResult<()> {
    match owner || cur.may(cred, MAY_WRITE) {
        true => Ok(()),
        false => Err(denied(format!("write permission denied on '{path}' (setting the times)"))),
    }
}

/// What Linux leaves of a file's mode when its owner changes or a non-root caller writes
/// it: no `S_ISUID`, and no `S_ISGID` when group execution is allowed (otherwise it marks
/// mandatory locking and stays).
pub fn kill_suid(mode: u32) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}

/// Owner of a new entry made by `cred` in directory `d`: root may record the owner it asks
/// for (`uid`, `gid`: the library's `as_owner`), others get their own; in a setgid
/// directory the group is the directory's. Returns (uid, gid, mode): a new subdirectory
/// of a setgid directory is setgid too.
pub fn new_owner(cred: &Cred, d_mode: u32, d_gid: u32, asked: (u32, u32), mode: u32, dir: bool) -> (u32, u32, u32) {
    let (uid, mut gid) = if cred.is_root() { asked } else { (cred.uid, cred.gid) };
    let mut mode = mode;
    if d_mode & libc::S_ISGID != 0 {
        gid = d_gid;
        if dir {
            mode |= libc::S_ISGID;
        } else if !cred.is_root() && mode & libc::S_IXGRP != 0 && !cred.in_group(d_gid) {
            // Linux's `mode_strip_sgid`: no set-group-ID executable of a group the
            // creator is not in.
            mode &= !libc::S_ISGID;
        }
    } else if !dir && !cred.is_root() && !cred.in_group(gid) {
        mode &= !libc::S_ISGID;
    }
    (uid, gid, mode)
}

/// Owner, mode and ACL attributes of an entry of `kind` `cred` creates with `mode` in
/// directory `d` ([`new_owner`], then `d`'s default ACL or else the caller's umask, see
/// [`crate::acl::on_create`]; a symbolic link has neither, as on Linux).
pub fn new_entry(cred: &Cred, d: &DirObject, asked: (u32, u32), mode: u32, kind: crate::FileKind) -> NewEntry {
    let dir = kind == crate::FileKind::Dir;
    let (uid, gid, mode) = new_owner(cred, d.mode, d.gid, asked, mode & 0o7777, dir);
    if kind == crate::FileKind::Symlink {
        return NewEntry { uid, gid, mode, xattrs: Vec::new() };
    }
    let (mode, xattrs) = crate::acl::on_create(d.default_acl().as_ref(), mode, cred.umask, dir);
    NewEntry { uid, gid, mode, xattrs }
}

/// What [`new_entry`] decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    /// ACL attributes it starts with (sorted by name).
    pub xattrs: Vec<(String, Vec<u8>)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{SearchPerm, Timespec};

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred::new(uid, gid, groups.to_vec())
    }

    #[test]
    fn owner_group_other_bits() {
        let (u, g, o) = (user(5, 5, &[]), user(6, 7, &[9]), user(8, 8, &[]));
        assert!(may(&u, 0o600, 5, 9, MAY_READ | MAY_WRITE));
        assert!(!may(&u, 0o077, 5, 9, MAY_READ), "the owner gets the owner's bits only");
        assert!(may(&g, 0o040, 5, 9, MAY_READ) && !may(&g, 0o040, 5, 9, MAY_WRITE));
        assert!(may(&o, 0o004, 5, 9, MAY_READ) && !may(&o, 0o040, 5, 9, MAY_READ));
        assert!(may(&Cred::server(), 0, 5, 9, MAY_READ | MAY_WRITE | MAY_EXEC));
    }

    #[test]
    fn ancestry_search() {
        let mut d = DirObject::new(2, 0o755, 5, 5);
        d.ancestry = Some(Ancestry::root(SearchPerm::of(0o755, 0, 0)).with(SearchPerm::of(0o700, 5, 5)));
        assert!(check_search(&user(5, 5, &[]), &d, "/a").is_ok());
        assert_eq!(check_search(&user(6, 6, &[]), &d, "/a").unwrap_err().errno, Errno::EACCES);
        let own = d.search_elem();
        d.ancestry = d.ancestry.map(|a| a.without(SearchPerm::of(0o700, 5, 5)).with(own));
        assert!(check_search_above(&user(6, 6, &[]), &d, "/a").is_ok());
        d.ancestry = None;
        assert!(check_search(&user(6, 6, &[]), &d, "/a").is_ok(), "no ancestry: no restriction");
    }

    #[test]
    fn sticky() {
        let d = DirObject::new(2, 0o1777, 5, 5);
        assert!(check_sticky(&user(6, 6, &[]), &d, 6, "/t/f").is_ok());
        assert!(check_sticky(&user(5, 5, &[]), &d, 6, "/t/f").is_ok());
        assert_eq!(check_sticky(&user(7, 7, &[]), &d, 6, "/t/f").unwrap_err().errno, Errno::EPERM);
    }

    #[test]
    fn setattr_rules() {
        let f = Owned { mode: 0o6755, uid: 5, gid: 5, dir: false, acl: None };
        let (owner, other) = (user(5, 5, &[7]), user(6, 6, &[]));
        let chmod = |m| SetAttr { mode: Some(m), ..Default::default() };
        assert_eq!(check_setattr(&other, &f, &chmod(0o644), "/f").unwrap_err().errno, Errno::EPERM);
        assert_eq!(check_setattr(&owner, &f, &chmod(0o2755), "/f").unwrap().mode, Some(0o2755));
        let f8 = Owned { gid: 8, ..f.clone() };
        assert_eq!(check_setattr(&owner, &f8, &chmod(0o2755), "/f").unwrap().mode, Some(0o755));
        let chown = |u, g| SetAttr { uid: u, gid: g, ..Default::default() };
        assert_eq!(check_setattr(&owner, &f, &chown(Some(6), None), "/f").unwrap_err().errno, Errno::EPERM);
        assert_eq!(check_setattr(&owner, &f, &chown(None, Some(8)), "/f").unwrap_err().errno, Errno::EPERM);
        assert_eq!(check_setattr(&owner, &f, &chown(None, Some(7)), "/f").unwrap().mode, Some(0o755));
        assert_eq!(check_setattr(&Cred::server(), &f, &chown(Some(9), None), "/f").unwrap().mode, Some(0o755));
        let now = SetAttr { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() };
        let at = SetAttr { mtime: Some(TimeSet::At(Timespec::default())), ..Default::default() };
        let open = Owned { mode: 0o666, ..f.clone() };
        assert!(check_setattr(&other, &open, &now, "/f").is_ok());
        assert_eq!(check_setattr(&other, &f, &now, "/f").unwrap_err().errno, Errno::EACCES);
        assert_eq!(check_setattr(&other, &open, &at, "/f").unwrap_err().errno, Errno::EPERM);
        let trunc = SetAttr { size: Some(0), ..Default::default() };
        assert_eq!(check_setattr(&other, &f, &trunc, "/f").unwrap_err().errno, Errno::EACCES);
    }

    #[test]
    fn setgid_inheritance() {
        assert_eq!(new_owner(&user(6, 6, &[]), 0o2777, 9, (0, 0), 0o755, true), (6, 9, 0o2755));
        assert_eq!(new_owner(&user(6, 6, &[]), 0o777, 9, (0, 0), 0o644, false), (6, 6, 0o644));
        assert_eq!(new_owner(&Cred::server(), 0o777, 9, (3, 4), 0o644, false), (3, 4, 0o644));
        // A set-group-ID executable of the directory's group only for its members.
        assert_eq!(new_owner(&user(6, 6, &[]), 0o2777, 9, (0, 0), 0o2755, false), (6, 9, 0o755));
        assert_eq!(new_owner(&user(6, 6, &[9]), 0o2777, 9, (0, 0), 0o2755, false), (6, 9, 0o2755));
        assert_eq!(new_owner(&user(6, 6, &[]), 0o2777, 9, (0, 0), 0o2644, false), (6, 9, 0o2644));
    }
}
