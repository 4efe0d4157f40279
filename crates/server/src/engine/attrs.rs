//! Attribute bookkeeping shared by every operation that changes an inode or a directory.

use plusfs_proto::{DirObject, FileKind, SetAttr, Timespec};

/// Applies a `SetAttr` to the attribute fields of an inode or directory object, now.
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
    plusfs_proto::apply_set_at(set, Timespec::now(), (mode, uid, gid), (atime, mtime, ctime));
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

/// Records an entry added to (`delta` = 1) or removed from (-1) a directory object, now.
pub(crate) fn count_entry(d: &mut DirObject, kind: FileKind, delta: i64) {
    d.count_entry(kind, delta, Timespec::now());
}
