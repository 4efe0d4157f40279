//! Messages between servers: the sub-operations of cross-server operations (two-phase
//! commit, Cx, serial), their votes and commit payloads, Cx answers.

use crate::attr::Attr;
use crate::error::WireError;
use crate::ids::{Ino, OpId, ServerId};
use crate::record::{Ancestry, DirObject, Inode, SearchElem, SearchPerm};
use serde::{Deserialize, Serialize};

/// A directory object with all its entries, as moved by a directory rename.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirDump {
    pub path: String,
    pub object: DirObject,
    pub entries: Vec<(String, Inode)>,
}

/// What a new subdirectory takes from its parent: the parent's mode (its setgid bit),
/// group, ancestry and default ACL (`CxPerms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentPerms {
    pub mode: u32,
    pub gid: u32,
    pub ancestry: Option<Ancestry>,
    /// The parent's default ACL (`system.posix_acl_default`'s value), if it has one.
    pub default_acl: Option<Vec<u8>>,
}

impl ParentPerms {
    /// The permissions a new subdirectory of `d` takes from it.
    pub fn of(d: DirObject) -> ParentPerms {
        let default_acl = d.xattrs.iter().find(|(n, _)| n == crate::acl::DEFAULT_XATTR).map(|(_, v)| v.clone());
        ParentPerms { mode: d.mode, gid: d.gid, ancestry: d.ancestry, default_acl }
    }
}

/// A participant's part of a two-phase-commit transaction (seed 004 Table I lists the
/// sub-operations of each cross-server operation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubOp {
    /// Insert entry `name` (any kind) into directory `dir`; what an existing entry of that
    /// name may be is said by `replace`.
    /// `shard` is the directory's incarnation when the entry belongs in this server's
    /// shard of a distributed directory, `None` when it belongs with the directory object.
    InsertEntry { dir: String, name: String, inode: Inode, replace: Replace, shard: Option<u64> },
    /// Remove entry `name`, which must have inode number `ino`, from directory `dir`
    /// (`shard` as for `InsertEntry`).
    RemoveEntry { dir: String, name: String, ino: Ino, shard: Option<u64> },
    /// Create the directory object at `path`.
    CreateDir { path: String, object: DirObject },
    /// Remove the directory object at `path`, which must be `ino` and empty; when it is
    /// distributed, `shards` must be its storing set (the same transaction removes them).
    RemoveDir { path: String, ino: Ino, shards: Vec<ServerId> },
    /// Lock and export every directory object at or below `root`; at commit they are
    /// deleted here and re-homed below `new_root` (directory rename). `rebase` is (old
    /// parent's ancestry, new parent's ancestry): each moved object's and shard's
    /// ancestry loses the first and gains the second (`None`: a parent without ancestry,
    /// and the moved objects get none either).
    ExportSubtree { root: String, new_root: String, rebase: Option<(Ancestry, Ancestry)> },
    /// Remove this server's shard of the distributed directory `path` (inode `ino`), which
    /// must be empty (rmdir of a huge directory).
    RemoveShard { path: String, ino: Ino },
    /// Make the file at entry `name` of `dir` (inode `ino`) shared: its inode moves to a
    /// shared inode object here with one more link and the entry becomes a link to it; if
    /// it is already shared here, only the link count grows (first step of `link`).
    ShareInode { dir: String, name: String, ino: Ino, shard: Option<u64> },
    /// Add `delta` to the link count of shared inode `ino` held here; at zero the inode and
    /// its data go.
    AdjustLinks { ino: Ino, delta: i32 },
    /// One side of `RENAME_EXCHANGE`: entry `name` of `dir` (a non-directory) is voted
    /// out with its inode, and at commit takes the inode of the other side.
    ExchangeEntry { dir: String, name: String, shard: Option<u64> },
    /// Directory `root` gets `mode`, `uid` and `gid` (chmod/chown, sent to every server):
    /// its object and shards held here take them; they and every directory object and
    /// shard strictly below `root` held here replace one `old` by `new` in their
    /// ancestry; the entry of `root` in its parent, if held here, records `uid` (for the
    /// sticky-directory check).
    Reancestry { root: String, old: SearchPerm, new: SearchPerm, mode: u32, uid: u32, gid: u32 },
    /// `Reancestry` with search elements that may be ACL rules, and the ACL attributes
    /// (`system.posix_acl_*`) `root`'s object and shards take (chmod, chown or an ACL
    /// change of a directory). `was` is what the change was decided from: `root`'s mode,
    /// owner, group and ACL attributes, which its home must still have when it votes (a
    /// change made meanwhile would otherwise be overwritten). Builds since ACLs send only
    /// this form.
    ReancestryAcl {
        root: String,
        old: SearchElem,
        new: SearchElem,
        mode: u32,
        uid: u32,
        gid: u32,
        acls: Vec<(String, Vec<u8>)>,
        was: DirAttrs,
    },
    /// Sets (`remove`: lifts) quota `def` here; a tree quota also adds (removes) its
    /// quota element to the ancestry of every directory object and shard at or below its
    /// root here.
    SetQuota { def: crate::quota::QuotaDef, remove: bool },
}

/// A directory's mode, owner, group and ACL attributes (`SubOp::ReancestryAcl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirAttrs {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub acls: Vec<(String, Vec<u8>)>,
}

impl DirAttrs {
    /// Those of `d`.
    pub fn of(d: &DirObject) -> DirAttrs {
        DirAttrs { mode: d.mode, uid: d.uid, gid: d.gid, acls: crate::acl::acl_xattrs(&d.xattrs) }
    }
}

/// The directory one side of a Cx mkdir or rmdir names: made (`create`) or removed, at
/// `path`, with inode number `ino`. The participant's vote carries its side's, and the
/// coordinator commits only when both sides name the same directory (a client builds the
/// sides; a client that is no admin is not trusted to make them agree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirSide {
    pub create: bool,
    pub path: String,
    pub ino: Ino,
}

impl DirSide {
    /// The directory `ops` make or remove, when they are one side of a mkdir (`CreateDir`,
    /// or `InsertEntry` of a directory) or of an rmdir (`RemoveDir`, `RemoveEntry`).
    pub fn of(ops: &[SubOp]) -> Option<DirSide> {
        let [op] = ops else { return None };
        let side = |create, path: String, ino| Some(DirSide { create, path, ino });
        match op {
            SubOp::CreateDir { path, object } => side(true, path.clone(), object.ino),
            SubOp::RemoveDir { path, ino, .. } => side(false, path.clone(), *ino),
            SubOp::InsertEntry { dir, name, inode, .. } if inode.kind == crate::record::FileKind::Dir => {
                side(true, crate::path::join(dir, name), inode.ino)
            }
            SubOp::RemoveEntry { dir, name, ino, .. } => side(false, crate::path::join(dir, name), *ino),
            _ => None,
        }
    }
}

/// What an [`SubOp::InsertEntry`] may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Replace {
    /// The name must be free.
    Never,
    /// Any non-directory entry is replaced (file rename); a directory gives EISDIR.
    NonDir,
    /// Exactly the (empty) directory with this inode is replaced (directory rename).
    Dir(Ino),
    /// Exactly a hard link to this shared inode is replaced; the same transaction drops
    /// one of its links (file rename over a hard link).
    Link(Ino),
}

/// Data a participant needs at commit time that it could not know at prepare time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CommitPayload {
    /// Directory objects this server becomes the home of (directory rename).
    pub imports: Vec<DirDump>,
    /// New inodes of `ExchangeEntry` entries here, and the current inode of a file an
    /// `InsertEntry` here moves by rename: (directory, name, inode).
    pub swap_in: Vec<(String, String, Inode)>,
}

/// A participant's YES vote; a NO vote is an error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Vote {
    /// Objects exported by an `ExportSubtree` sub-operation.
    pub exports: Vec<DirDump>,
    /// Current inodes of `ExchangeEntry` entries and of non-directory entries a
    /// `RemoveEntry` takes away: (directory, name, inode).
    pub swap_out: Vec<(String, String, Inode)>,
}

/// A server's part in a Cx operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CxRole {
    /// Holds the entry in the parent directory; decides the commitment.
    Coordinator,
    /// Holds the other object (the directory object of mkdir/rmdir).
    Participant,
}

/// A server's answer to a Cx sub-operation: YES (`error` is `None`) or NO, and the
/// conflict hint: the pending operations it had to wait for (committed first), sorted.
/// A client accepts a pair of answers only when their hints are equal (seed 004 §III.C).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CxAnswer {
    pub error: Option<WireError>,
    pub hint: Vec<OpId>,
    /// With a YES for a sub-operation list that creates a directory object: its attributes
    /// as the server made them (owner, group and setgid inheritance are the server's).
    pub made: Option<Attr>,
}
