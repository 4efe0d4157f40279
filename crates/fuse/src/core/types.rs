//! Plain values the mount core takes and gives (no kernel types).

use plusfs_proto::{Attr, Cred, Errno, FileKind};

/// Who makes a call: the uid and gid the kernel reports for the calling process, and its
/// supplementary groups. The servers check the call's permissions against them, and what
/// it creates is recorded as theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// User id of the caller.
    pub uid: u32,
    /// Group id of the caller.
    pub gid: u32,
    /// Supplementary groups of the caller.
    pub groups: Vec<u32>,
}

impl Caller {
    /// The superuser.
    pub const ROOT: Caller = Caller { uid: 0, gid: 0, groups: Vec::new() };

    /// The credential the caller's requests carry.
    pub fn cred(&self) -> Cred {
        Cred::new(self.uid, self.gid, self.groups.clone())
    }
}

/// How a rename treats its destination (the flags of `renameat2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenameMode {
    /// Replaces an existing destination (plain `rename`).
    #[default]
    Replace,
    /// Fails with EEXIST when the destination exists (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swaps source and destination atomically (`RENAME_EXCHANGE`).
    Exchange,
}

/// One entry of a directory listing as `readdir` hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirItem<'a> {
    /// Inode number.
    pub ino: u64,
    /// Offset of the next entry (what the kernel passes back to continue after this one).
    pub offset: u64,
    /// File type.
    pub kind: FileKind,
    /// Entry name (`.` and `..` included).
    pub name: &'a str,
}

/// One entry of a directory listing with its attributes (`readdirplus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirPlusItem<'a> {
    /// Inode number the entry is given under.
    pub ino: u64,
    /// Offset of the next entry.
    pub offset: u64,
    /// Entry name (`.` and `..` included).
    pub name: &'a str,
    /// Its attributes.
    pub attr: &'a Attr,
}

/// One entry a `readdir` call hands out, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaddirItem {
    /// Inode number.
    pub ino: u64,
    /// Offset of the next entry.
    pub offset: u64,
    /// File type.
    pub kind: FileKind,
    /// Entry name (`.` and `..` included).
    pub name: String,
}

impl ReaddirItem {
    /// The item as the kernel adapter hands it out.
    pub fn as_dir_item(&self) -> DirItem<'_> {
        DirItem { ino: self.ino, offset: self.offset, kind: self.kind, name: &self.name }
    }
}

/// One entry `readdirplus` hands out, owned (`MountCore::readdirplus_items`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlusItem {
    /// Inode number the entry is given under.
    pub ino: u64,
    /// Offset of the next entry.
    pub offset: u64,
    /// Entry name (`.` and `..` included).
    pub name: String,
    /// Its attributes.
    pub attr: Attr,
    /// Its path (`None` for `.` and `..`, which the kernel does not count as lookups).
    pub(crate) path: Option<String>,
}

impl PlusItem {
    /// The item as the kernel adapter hands it out.
    pub fn as_dir_plus(&self) -> DirPlusItem<'_> {
        DirPlusItem { ino: self.ino, offset: self.offset, name: &self.name, attr: &self.attr }
    }
}

/// The answer to an extended-attribute read or listing, sized as the caller asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrReply {
    /// The size of the value (asked with a buffer size of 0).
    Size(u32),
    /// The value itself.
    Data(Vec<u8>),
}

impl XattrReply {
    /// `value` for a caller whose buffer holds `size` bytes: its size when `size` is 0,
    /// ERANGE when it does not fit.
    pub fn fit(value: Vec<u8>, size: u32) -> Result<XattrReply, Errno> {
        if size == 0 {
            Ok(XattrReply::Size(value.len() as u32))
        } else if value.len() > size as usize {
            Err(Errno::ERANGE)
        } else {
            Ok(XattrReply::Data(value))
        }
    }
}

/// What `statfs` reports for the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Size of the file system in `frsize` units.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Preferred I/O size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattr_values_are_sized_as_asked() {
        assert_eq!(XattrReply::fit(b"abc".to_vec(), 0), Ok(XattrReply::Size(3)));
        assert_eq!(XattrReply::fit(b"abc".to_vec(), 3), Ok(XattrReply::Data(b"abc".to_vec())));
        assert_eq!(XattrReply::fit(b"abc".to_vec(), 2), Err(Errno::ERANGE));
    }
}

/// An answer naming an entry: its attributes (`None`: the name is missing), and how long
/// the kernel may keep the name and the attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub attr: Option<Attr>,
    pub ttls: super::kernel_cache::Ttls,
}

/// What an `open` hands the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The file handle (0, or a fresh one for the control file).
    pub fh: u64,
    /// The kernel may keep the file's cached pages (`FOPEN_KEEP_CACHE`): the file is
    /// unchanged since its previous open here.
    pub keep_cache: bool,
}
