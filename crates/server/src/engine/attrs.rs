//! Attribute bookkeeping shared by every operation that changes an inode or a directory.

use plusfs_proto::{DirObject, FileKind, SetAttr, TimeSet, Timespec};

pub(crate) fn resolve(t: TimeSet, now: Timespec) -> Timespec {
    match t {
        TimeSet::Now => now,
        TimeSet::At(ts) => ts,
    }
}

/// Applies a `SetAttr` to the attribute fields of an inode or directory object.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply_set(
    set: &SetAttr,
    mode: &mut u32,
    uid: &mut u32,
    gid: &mut u32,
    atime: &mut Timespec,
    mtime: &mut Timespec,
    ctime: &mut Timespec,
) {
    let now = Timespec::now();
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
        *atime = resolve(a, now);
    }
    if let Some(m) = set.mtime {
        *mtime = resolve(m, now);
    }
    *ctime = now;
}

/// What only some kinds of new entries have.
pub(crate) struct NewNode {
    /// Target of a symbolic link.
    pub target: Option<String>,
    /// Device number of a device.
    pub rdev: u32,
    /// What the opener will do with the entry if it exists (`MAY_*` bits; checked).
    pub access: u32,
}

/// Records an entry added to (`delta` = 1) or removed from (-1) a directory object.
pub(crate) fn count_entry(d: &mut DirObject, kind: FileKind, delta: i64) {
    d.entries = d.entries.saturating_add_signed(delta);
    if kind == FileKind::Dir {
        d.subdirs = d.subdirs.saturating_add_signed(delta);
    }
    let now = Timespec::now();
    d.mtime = now;
    d.ctime = now;
}
