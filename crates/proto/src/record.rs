//! The objects a server stores: directory objects and inodes (with their kinds and times).
//! They travel inside some messages too, but their layout is the store's: the store
//! frames each with a format version (`plusfs_store`), and a change here needs a new
//! version there.

use crate::hugedir::Distribution;
use crate::ids::{Ino, ServerId};
use serde::{Deserialize, Serialize};

/// Type of a file-system object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    /// Device special files and sockets: stored names, attributes and device numbers.
    BlockDev,
    CharDev,
    Socket,
}

impl FileKind {
    /// The `S_IF*` type bits of `st_mode`.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::BlockDev => libc::S_IFBLK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::Socket => libc::S_IFSOCK,
        }
    }

    /// The `DT_*` type of a directory entry.
    pub fn dirent_type(self) -> u8 {
        match self {
            FileKind::File => libc::DT_REG,
            FileKind::Dir => libc::DT_DIR,
            FileKind::Symlink => libc::DT_LNK,
            FileKind::Fifo => libc::DT_FIFO,
            FileKind::BlockDev => libc::DT_BLK,
            FileKind::CharDev => libc::DT_CHR,
            FileKind::Socket => libc::DT_SOCK,
        }
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    /// The current wall-clock time.
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
    }
}

/// The embedded inode stored with a directory entry (seed 000 §2.4). For a subdirectory
/// entry ("h" entry) only `ino` and `kind` are meaningful: the directory's own attributes
/// live in its directory object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits (`0o7777` mask); the type is in `kind`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Target of a symbolic link.
    pub target: Option<String>,
    /// Where a regular file's contents are (sorted, non-overlapping; holes read as zeros).
    pub pieces: Vec<crate::filedata::Piece>,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// Device number of a block or character device.
    pub rdev: u32,
    /// Set on the entries of a hard-linked file: its inode is a shared inode object on
    /// this server, and the entry's other fields (but `ino` and `kind`) mean nothing.
    pub link_home: Option<ServerId>,
}

impl Inode {
    /// A new file, FIFO or symlink with one link, size 0 and all times now.
    pub fn new(ino: Ino, kind: FileKind, mode: u32, uid: u32, gid: u32) -> Inode {
        let now = Timespec::now();
        Inode {
            ino,
            kind,
            mode: mode & 0o7777,
            uid,
            gid,
            size: 0,
            nlink: 1,
            atime: now,
            mtime: now,
            ctime: now,
            target: None,
            pieces: Vec::new(),
            xattrs: Vec::new(),
            rdev: 0,
            link_home: None,
        }
    }

    /// Its access ACL, if it has one beyond its mode bits.
    pub fn access_acl(&self) -> Option<crate::acl::Acl> {
        crate::acl::Acl::in_xattrs(&self.xattrs, crate::acl::ACCESS_XATTR)
    }

    /// A subdirectory ("h") entry pointing at directory `ino`.
    pub fn subdir(ino: Ino) -> Inode {
        Inode {
            ino,
            kind: FileKind::Dir,
            mode: 0,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            target: None,
            pieces: Vec::new(),
            xattrs: Vec::new(),
            rdev: 0,
            link_home: None,
        }
    }

    /// The entry of a hard link to inode `ino` of kind `kind`, kept on server `home`.
    pub fn link(ino: Ino, kind: FileKind, home: ServerId) -> Inode {
        Inode { kind, link_home: Some(home), ..Inode::subdir(ino) }
    }
}

/// A directory object: the directory's own attributes plus bookkeeping (seed 001 §III.C).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirObject {
    pub ino: Ino,
    /// Creation stamp; differs between a directory and a later one at the same path.
    pub incarnation: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Entries of every kind, subdirectories included.
    pub entries: u64,
    /// Subdirectory entries (gives the link count `2 + subdirs`).
    pub subdirs: u64,
    /// Huge-directory policy and state (primary objects); unused in shards.
    pub dist: Distribution,
    /// Extended attributes of the directory, sorted by name.
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// Owner, group and search bits of every directory on the path to this one, itself
    /// included (see [`Ancestry`]). `None` in records written before ancestries existed
    /// (record version 1): no restriction from the ancestors. Shards carry their
    /// directory's ancestry. Must stay the last field (old records are read as if they
    /// ended in `None`).
    pub ancestry: Option<Ancestry>,
}

impl DirObject {
    /// Records an entry of `kind` added (`delta` = 1) or removed (-1) at time `now`: the
    /// entry and subdirectory counts and the directory's mtime and ctime.
    pub fn count_entry(&mut self, kind: FileKind, delta: i64, now: Timespec) {
        self.entries = self.entries.saturating_add_signed(delta);
        if kind == FileKind::Dir {
            self.subdirs = self.subdirs.saturating_add_signed(delta);
        }
        self.mtime = now;
        self.ctime = now;
    }
}

impl DirObject {
    /// A new, empty directory object with all times now and its creation time as
    /// incarnation.
    pub fn new(ino: Ino, mode: u32, uid: u32, gid: u32) -> DirObject {
        let now = Timespec::now();
        DirObject {
            ino,
            incarnation: (now.sec as u64) * 1_000_000_000 + now.nsec as u64,
            mode: mode & 0o7777,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            entries: 0,
            subdirs: 0,
            dist: Distribution::default(),
            xattrs: Vec::new(),
            ancestry: None,
        }
    }

    /// What this directory contributes to the ancestries of its descendants: its owner,
    /// group and search bits, or with an access ACL, that ACL's search rule.
    pub fn search_elem(&self) -> SearchElem {
        match self.access_acl() {
            Some(acl) => SearchElem::Acl(SearchAcl { uid: self.uid, gid: self.gid, acl: acl.search_part().to_xattr() }),
            None => SearchElem::Mode(SearchPerm::of(self.mode, self.uid, self.gid)),
        }
    }

    /// Its access ACL, if it has one beyond its mode bits.
    pub fn access_acl(&self) -> Option<crate::acl::Acl> {
        crate::acl::Acl::in_xattrs(&self.xattrs, crate::acl::ACCESS_XATTR)
    }

    /// Its default ACL (what is created in it inherits), if it has one.
    pub fn default_acl(&self) -> Option<crate::acl::Acl> {
        crate::acl::Acl::in_xattrs(&self.xattrs, crate::acl::DEFAULT_XATTR)
    }
}

/// Owner, group and search (`x`) bits of one directory: all a caller's search permission
/// on it depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SearchPerm {
    pub uid: u32,
    pub gid: u32,
    /// `mode & 0o111`.
    pub xbits: u16,
}

impl SearchPerm {
    /// The search-relevant part of a directory's mode and owner.
    pub fn of(mode: u32, uid: u32, gid: u32) -> SearchPerm {
        SearchPerm { uid, gid, xbits: (mode & 0o111) as u16 }
    }
}

/// The search rule of a directory with an access ACL: its owner and group, and the ACL
/// reduced to its search (`x`) bits, in the extended attribute's binary form.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SearchAcl {
    pub uid: u32,
    pub gid: u32,
    pub acl: Vec<u8>,
}

impl SearchAcl {
    /// Whether `cred` may search the directory (a rule that does not parse lets nobody
    /// but root through).
    pub fn permits(&self, cred: &crate::cred::Cred) -> bool {
        match crate::acl::Acl::from_xattr(&self.acl) {
            Ok(Some(a)) => a.permits(cred, self.uid, self.gid, crate::cred::MAY_EXEC),
            _ => false,
        }
    }
}

/// What one directory contributes to an ancestry: mode bits, or an access ACL's rule;
/// and, for the root of a quota tree, its inode number (every directory at or below it
/// carries it, so each server knows which trees an entry it stores counts in).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SearchElem {
    Mode(SearchPerm),
    Acl(SearchAcl),
    Quota(Ino),
}

impl From<SearchPerm> for SearchElem {
    fn from(p: SearchPerm) -> SearchElem {
        SearchElem::Mode(p)
    }
}

/// The multiset of [`SearchElem`]s of every directory on a path, `/` to the directory
/// itself (Lazy Hybrid: what permission checks need is kept with each directory object,
/// so a server checks a whole path without asking the servers of its ancestors). A caller
/// may search every directory of the path iff it may search each element. Order does not
/// matter and equal elements collapse into a count, so it stays small; counts let a
/// changed ancestor be replaced (one element out, one in) without knowing the others.
/// Mode elements, ACL elements and quota trees are kept apart; each was appended as the
/// last field in its turn (records of version 2 end before `acls`, those of version 3
/// before `quotas`: see [`legacy_ancestry`] and [`acl_ancestry`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Ancestry {
    /// Sorted by element; counts are at least 1.
    pub elems: Vec<(SearchPerm, u32)>,
    /// Directories with access ACLs: sorted, counts at least 1.
    pub acls: Vec<(SearchAcl, u32)>,
    /// Roots of the quota trees the directory lies in (itself included): sorted inode
    /// numbers, counts at least 1.
    pub quotas: Vec<(Ino, u32)>,
}

/// Which fields an ancestry being decoded has (the layout of the build that wrote it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Mode elements only (before ACLs).
    Modes,
    /// Mode and ACL elements (before quota trees).
    Acls,
    /// Every field.
    Current,
}

thread_local! {
    static ANCESTRY_LAYOUT: std::cell::Cell<Layout> = const { std::cell::Cell::new(Layout::Current) };
}

fn with_layout<T>(layout: Layout, decode: impl FnOnce() -> T) -> T {
    let before = ANCESTRY_LAYOUT.with(|f| f.replace(layout));
    let out = decode();
    ANCESTRY_LAYOUT.with(|f| f.set(before));
    out
}

/// Runs `decode` reading ancestries in the layout of builds before ACLs (mode elements
/// only): how records and log records written then are read.
pub fn legacy_ancestry<T>(decode: impl FnOnce() -> T) -> T {
    with_layout(Layout::Modes, decode)
}

/// Runs `decode` reading ancestries in the layout of builds before quota trees (mode and
/// ACL elements).
pub fn acl_ancestry<T>(decode: impl FnOnce() -> T) -> T {
    with_layout(Layout::Acls, decode)
}

impl<'de> Deserialize<'de> for Ancestry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Ancestry, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "Ancestry")]
        struct ModesOnly {
            elems: Vec<(SearchPerm, u32)>,
        }
        #[derive(Deserialize)]
        #[serde(rename = "Ancestry")]
        struct Both {
            elems: Vec<(SearchPerm, u32)>,
            acls: Vec<(SearchAcl, u32)>,
        }
        #[derive(Deserialize)]
        #[serde(rename = "Ancestry")]
        struct All {
            elems: Vec<(SearchPerm, u32)>,
            acls: Vec<(SearchAcl, u32)>,
            quotas: Vec<(Ino, u32)>,
        }
        match ANCESTRY_LAYOUT.with(|f| f.get()) {
            Layout::Modes => ModesOnly::deserialize(d).map(|a| Ancestry { elems: a.elems, ..Ancestry::default() }),
            Layout::Acls => Both::deserialize(d).map(|a| Ancestry { elems: a.elems, acls: a.acls, quotas: Vec::new() }),
            Layout::Current => All::deserialize(d).map(|a| Ancestry { elems: a.elems, acls: a.acls, quotas: a.quotas }),
        }
    }
}

/// One occurrence more of `e` in a counted, sorted multiset.
fn add<T: Ord>(set: &mut Vec<(T, u32)>, e: T) {
    match set.binary_search_by(|(x, _)| x.cmp(&e)) {
        Ok(i) => set[i].1 += 1,
        Err(i) => set.insert(i, (e, 1)),
    }
}

/// One occurrence less of `e` (none if it is not there).
fn remove<T: Ord>(set: &mut Vec<(T, u32)>, e: &T) {
    if let Ok(i) = set.binary_search_by(|(x, _)| x.cmp(e)) {
        set[i].1 -= 1;
        if set[i].1 == 0 {
            set.remove(i);
        }
    }
}

impl Ancestry {
    /// The ancestry of `/`, whose only element is itself.
    pub fn root(own: impl Into<SearchElem>) -> Ancestry {
        Ancestry::default().with(own)
    }

    /// This ancestry plus one occurrence of `e` (a child's: the parent's ancestry with
    /// the child's own element).
    pub fn with(mut self, e: impl Into<SearchElem>) -> Ancestry {
        match e.into() {
            SearchElem::Mode(p) => add(&mut self.elems, p),
            SearchElem::Acl(a) => add(&mut self.acls, a),
            SearchElem::Quota(q) => add(&mut self.quotas, q),
        }
        self
    }

    /// This ancestry less one occurrence of `e` (unchanged if `e` is not in it).
    pub fn without(mut self, e: impl Into<SearchElem>) -> Ancestry {
        match e.into() {
            SearchElem::Mode(p) => remove(&mut self.elems, &p),
            SearchElem::Acl(a) => remove(&mut self.acls, &a),
            SearchElem::Quota(q) => remove(&mut self.quotas, &q),
        }
        self
    }

    /// Replaces one occurrence of `old` by `new` (an ancestor's owner, mode or ACL
    /// changed).
    pub fn replace(self, old: impl Into<SearchElem>, new: impl Into<SearchElem>) -> Ancestry {
        self.without(old).with(new)
    }

    /// Removes every element of `other` (counted) and adds those of `add`: moves a
    /// subtree from under one parent to another.
    pub fn rebase(mut self, remove: &Ancestry, add: &Ancestry) -> Ancestry {
        for e in remove.counted() {
            self = self.without(e);
        }
        for e in add.counted() {
            self = self.with(e);
        }
        self
    }

    /// Every element, once per occurrence.
    fn counted(&self) -> impl Iterator<Item = SearchElem> + '_ {
        let modes = self.elems.iter().flat_map(|(e, n)| std::iter::repeat_n(SearchElem::Mode(*e), *n as usize));
        let acls = self.acls.iter().flat_map(|(e, n)| std::iter::repeat_n(SearchElem::Acl(e.clone()), *n as usize));
        let quotas = self.quotas.iter().flat_map(|(q, n)| std::iter::repeat_n(SearchElem::Quota(*q), *n as usize));
        modes.chain(acls).chain(quotas)
    }

    /// The roots of the quota trees the directory lies in (their inode numbers).
    pub fn quota_trees(&self) -> impl Iterator<Item = Ino> + '_ {
        self.quotas.iter().map(|(q, _)| *q)
    }

    /// Whether `e` occurs in this ancestry.
    pub fn holds(&self, e: &SearchElem) -> bool {
        match e {
            SearchElem::Mode(p) => self.elems.iter().any(|(x, _)| x == p),
            SearchElem::Acl(a) => self.acls.iter().any(|(x, _)| x == a),
            SearchElem::Quota(q) => self.quotas.iter().any(|(x, _)| x == q),
        }
    }

    /// The distinct mode elements.
    pub fn iter(&self) -> impl Iterator<Item = &SearchPerm> {
        self.elems.iter().map(|(e, _)| e)
    }

    /// Whether `cred` may search every directory this ancestry describes.
    pub fn permits(&self, cred: &crate::cred::Cred) -> bool {
        self.iter().all(|e| cred.may(e.xbits as u32, e.uid, e.gid, crate::cred::MAY_EXEC))
            && (cred.is_root() || self.acls.iter().all(|(a, _)| a.permits(cred)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestry_is_a_multiset() {
        let a = SearchPerm::of(0o755, 0, 0);
        let b = SearchPerm::of(0o700, 5, 5);
        let anc = Ancestry::root(a).with(b).with(a);
        assert_eq!(anc.elems, vec![(a, 2), (b, 1)]);
        assert_eq!(anc.clone().without(a).elems, vec![(a, 1), (b, 1)]);
        let c = SearchPerm::of(0o711, 5, 5);
        assert_eq!(anc.clone().replace(b, c).iter().copied().collect::<Vec<_>>(), vec![a, c]);
        let moved = anc.rebase(&Ancestry::root(a).with(b), &Ancestry::root(c));
        assert_eq!(moved.elems, vec![(a, 1), (c, 1)]);
    }
}
