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

    /// What this directory contributes to the ancestries of its descendants.
    pub fn search_perm(&self) -> SearchPerm {
        SearchPerm::of(self.mode, self.uid, self.gid)
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

/// The multiset of [`SearchPerm`]s of every directory on a path, `/` to the directory
/// itself (Lazy Hybrid: what permission checks need is kept with each directory object,
/// so a server checks a whole path without asking the servers of its ancestors). A caller
/// may search every directory of the path iff it may search each element. Order does not
/// matter and equal elements collapse into a count, so it stays small; counts let a
/// changed ancestor be replaced (one element out, one in) without knowing the others.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ancestry {
    /// Sorted by element; counts are at least 1.
    pub elems: Vec<(SearchPerm, u32)>,
}

impl Ancestry {
    /// The ancestry of `/`, whose only element is itself.
    pub fn root(own: SearchPerm) -> Ancestry {
        Ancestry::default().with(own)
    }

    /// This ancestry plus one occurrence of `e` (a child's: the parent's ancestry with
    /// the child's own element).
    pub fn with(mut self, e: SearchPerm) -> Ancestry {
        match self.elems.binary_search_by(|(x, _)| x.cmp(&e)) {
            Ok(i) => self.elems[i].1 += 1,
            Err(i) => self.elems.insert(i, (e, 1)),
        }
        self
    }

    /// This ancestry less one occurrence of `e` (unchanged if `e` is not in it).
    pub fn without(mut self, e: SearchPerm) -> Ancestry {
        if let Ok(i) = self.elems.binary_search_by(|(x, _)| x.cmp(&e)) {
            self.elems[i].1 -= 1;
            if self.elems[i].1 == 0 {
                self.elems.remove(i);
            }
        }
        self
    }

    /// Replaces one occurrence of `old` by `new` (an ancestor's owner or mode changed).
    pub fn replace(self, old: SearchPerm, new: SearchPerm) -> Ancestry {
        self.without(old).with(new)
    }

    /// Removes every element of `other` (counted) and adds those of `add`: moves a
    /// subtree from under one parent to another.
    pub fn rebase(mut self, remove: &Ancestry, add: &Ancestry) -> Ancestry {
        for (e, n) in &remove.elems {
            for _ in 0..*n {
                self = self.without(*e);
            }
        }
        for (e, n) in &add.elems {
            for _ in 0..*n {
                self = self.with(*e);
            }
        }
        self
    }

    /// The distinct elements.
    pub fn iter(&self) -> impl Iterator<Item = &SearchPerm> {
        self.elems.iter().map(|(e, _)| e)
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
