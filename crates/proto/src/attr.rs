//! What clients see of objects: attributes, changes to them, directory listings,
//! file-system totals, extended-attribute operations.

use crate::hugedir::DistState;
use crate::ids::Ino;
use crate::record::{DirObject, FileKind, Inode, Timespec};
use serde::{Deserialize, Serialize};

/// Attributes returned by `stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Incarnation of the directory object (directories only, else 0).
    pub incarnation: u64,
    /// Device number (block and character devices).
    pub rdev: u32,
}

impl Attr {
    /// Attributes of a file, symlink or FIFO from its embedded inode.
    pub fn of_inode(i: &Inode) -> Attr {
        Attr {
            ino: i.ino,
            kind: i.kind,
            mode: i.mode,
            uid: i.uid,
            gid: i.gid,
            size: i.size,
            nlink: i.nlink,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            incarnation: 0,
            rdev: i.rdev,
        }
    }

    /// Attributes of a directory from its object; size is the number of entries.
    pub fn of_dir(d: &DirObject) -> Attr {
        Attr {
            ino: d.ino,
            kind: FileKind::Dir,
            mode: d.mode,
            uid: d.uid,
            gid: d.gid,
            size: d.entries,
            nlink: (2 + d.subdirs).min(u32::MAX as u64) as u32,
            atime: d.atime,
            mtime: d.mtime,
            ctime: d.ctime,
            incarnation: d.incarnation,
            rdev: 0,
        }
    }
}

/// How `utimens` sets a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

/// The attributes a `setattr` changes (`None` leaves one as it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// New size of a regular file (`truncate`).
    pub size: Option<u64>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: FileKind,
}

/// One page of a directory listing. Pages continue after the last name returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dirents {
    pub incarnation: u64,
    pub entries: Vec<DirEntry>,
    /// True when entries after the last one returned may exist.
    pub more: bool,
}

/// File-system totals (`statfs`) from one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Statfs {
    pub dir_objects: u64,
    pub entries: u64,
}

/// What an `Xattr` request does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrOp {
    /// The value (`Data`), or ENODATA.
    Get { name: String },
    /// Every name (`Names`).
    List,
    /// Sets a value; `create` fails with EEXIST if it exists, `replace` with ENODATA if not.
    Set {
        name: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        create: bool,
        replace: bool,
    },
    /// Removes a name (ENODATA if absent).
    Remove { name: String },
}

impl XattrOp {
    /// Whether the operation only reads (get, list).
    pub fn is_read(&self) -> bool {
        matches!(self, XattrOp::Get { .. } | XattrOp::List)
    }

    /// Whether the operation sets or removes a POSIX ACL.
    pub fn changes_acl(&self) -> bool {
        match self {
            XattrOp::Set { name, .. } | XattrOp::Remove { name } => crate::acl::is_acl_name(name),
            _ => false,
        }
    }
}

/// Applies `set` at time `now` to an object's (mode, uid, gid) and (atime, mtime, ctime):
/// what servers do for `setattr`, and what a client holding a delegation does to its copy.
pub fn apply_set_at(
    set: &SetAttr,
    now: Timespec,
    owner: (&mut u32, &mut u32, &mut u32),
    times: (&mut Timespec, &mut Timespec, &mut Timespec),
) {
    let (mode, uid, gid) = owner;
    let (atime, mtime, ctime) = times;
    let at = |t: TimeSet| match t {
        TimeSet::Now => now,
        TimeSet::At(ts) => ts,
    };
    if let Some(m) = set.mode {
        *mode = m & 0o7777;
    }
    if let Some(u) = set.uid {
        *uid = u;
    }
    if let Some(g) = set.gid {
        *gid = g;
    }
    if let Some(a) = set.atime {
        *atime = at(a);
    }
    if let Some(m) = set.mtime {
        *mtime = at(m);
    }
    *ctime = now;
}

/// Attribute changes of a directory object (`DirSetAttr`, and its delegated form).
impl DirObject {
    /// This directory with attribute change `set` (already checked; no size) applied at
    /// `now`, its own ancestry element following its new search bits. Whether the change
    /// may be stored in this object alone is [`Self::change_stays_here`].
    pub fn with_set(&self, set: &SetAttr, now: Timespec) -> DirObject {
        let mut n = self.clone();
        apply_set_at(set, now, (&mut n.mode, &mut n.uid, &mut n.gid), (&mut n.atime, &mut n.mtime, &mut n.ctime));
        if let Some(m) = set.mode {
            crate::acl::chmod_xattrs(&mut n.xattrs, m);
        }
        n.ancestry = n.ancestry.take().map(|a| a.replace(self.search_elem(), n.search_elem()));
        n
    }

    /// Whether going from `self` to `n` changes this directory object only: nothing the
    /// ancestries of other directories hold (owner, group, search bits), the owner its
    /// entry in the parent records, or anything the shards of a distributed directory
    /// check. A directory without subdirectories may change its group and search bits
    /// here: no ancestry below it holds them.
    pub fn change_stays_here(&self, n: &DirObject) -> bool {
        let acls = crate::acl::acl_xattrs(&self.xattrs) != crate::acl::acl_xattrs(&n.xattrs);
        let attrs = (self.mode, self.uid, self.gid) != (n.mode, n.uid, n.gid) || acls;
        let everyone = self.search_elem() != n.search_elem()
            || self.uid != n.uid
            || (attrs && self.dist.state != DistState::Nondistributed);
        let leaf = self.subdirs == 0 && self.dist.state == DistState::Nondistributed && self.uid == n.uid;
        !everyone || leaf
    }
}
