//! Directory delegations: what a server grants a client, and the work the client writes
//! back (`docs/semantics.md`, "Delegations").
//!
//! A *write delegation* on a directory lets one client session answer lookups in it and
//! create, write (small files), change, rename and remove its entries locally. The client
//! writes that work back later as one [`DelegOp`] list per flush, applied by the
//! directory's server atomically and at most once (flushes are numbered). Any other
//! session's request that touches the directory makes the server recall the delegation
//! first. The `touch` module says which directories a request touches, for both sides.

use crate::attr::SetAttr;
use crate::errno::Errno;
use crate::ids::Ino;
use crate::record::{DirObject, FileKind, Inode, Timespec};
use serde::{Deserialize, Serialize};

/// What a server grants with a delegation: the directory as it is (object and every entry,
/// or for a large one the digests of its names) and inode numbers for the entries the
/// client will create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegGrant {
    /// Names this delegation in flushes and recalls.
    pub id: u64,
    /// The directory object (mode, owner, ancestry, counts, times).
    pub dir: DirObject,
    /// Every entry, in name order (empty when `digests` is given).
    pub entries: Vec<(String, Inode)>,
    /// For a directory with more entries than the cluster sends whole (`[delegations]
    /// max_entries`): the [`name_digest`] of every entry's name, sorted. A name whose
    /// digest is missing is not in the directory (the holder answers ENOENT and creates it
    /// locally); one whose digest is present is asked of the server.
    pub digests: Option<Vec<u64>>,
    /// Inode numbers `first .. first + count` for new entries.
    pub first_ino: Ino,
    pub ino_count: u32,
}

/// One change made under a delegation, replayed by the server in order. Times are the
/// client's, so the directory the server ends with is the one the client showed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DelegOp {
    /// A new entry `name` (regular file, symlink, FIFO, socket or device; never a
    /// directory) with inode `ino`, owner and mode as the client computed them for the
    /// caller `by` (an index into the flush's credentials).
    Create {
        name: String,
        ino: Ino,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        target: Option<String>,
        time: Timespec,
        by: u32,
    },
    /// The whole contents of regular file `name` (created under this delegation), and
    /// the file's modification and change times after it was written.
    Contents {
        name: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        mtime: Timespec,
        ctime: Timespec,
    },
    /// `setattr` of entry `name` (no size: sizes travel as contents) at `time`, by `by`.
    SetAttr { name: String, set: SetAttr, time: Timespec, by: u32 },
    /// Removes non-directory entry `name` at `time`, by `by`.
    Unlink { name: String, time: Timespec, by: u32 },
    /// Renames non-directory entry `from` to `to`, replacing a non-directory there.
    Rename { from: String, to: String, time: Timespec, by: u32 },
    /// Sets the directory's modification and change times to `time`: what is left of a
    /// file created and removed again between two flushes.
    Touch { time: Timespec },
    /// `setattr` of the delegated directory itself at `time`, by `by`: only a change that
    /// stays in its own object (`DirObject::change_stays_here`; never of a shard).
    DirAttr { set: SetAttr, time: Timespec, by: u32 },
}

impl DelegOp {
    /// The entries of the directory the operation changes.
    pub fn names(&self) -> Vec<&str> {
        match self {
            DelegOp::Create { name, .. }
            | DelegOp::Contents { name, .. }
            | DelegOp::SetAttr { name, .. }
            | DelegOp::Unlink { name, .. } => vec![name],
            DelegOp::Rename { from, to, .. } => vec![from, to],
            DelegOp::Touch { .. } | DelegOp::DirAttr { .. } => Vec::new(),
        }
    }

    /// Bytes of file data the operation carries.
    pub fn data_len(&self) -> usize {
        match self {
            DelegOp::Contents { data, .. } => data.len(),
            _ => 0,
        }
    }
}

/// The reply to a flush.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Flushed {
    /// Operations the server refused (index in the flush, errno): none unless the client
    /// and the server disagree about the directory, which is a bug worth a log line.
    pub failed: Vec<(u32, Errno)>,
    /// The delegation ended with this flush: asked for, or the directory grew past its
    /// huge-directory threshold and is being distributed.
    pub ended: bool,
}

/// The 64-bit digest of an entry name sent in place of the name by a [`DelegGrant`] of a
/// large directory (two names may share one: the holder then asks the server).
pub fn name_digest(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), 0x6465_6c65_6700_0001)
}
