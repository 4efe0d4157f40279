//! Batch operations (openv/statv/unlinkv/mkdirv) and batch-file I/O payloads.

use crate::attr::Attr;
use crate::errno::Errno;
use crate::hugedir::DistInfo;
use crate::record::Timespec;
use serde::{Deserialize, Serialize};

/// The operation of a batch request (seed 000 §3: `openv`, `statv`, `unlinkv`, and
/// `mkdirv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    /// `openv` with `O_CREAT` (and `O_EXCL` when `exclusive`): creates regular files.
    Create { exclusive: bool },
    /// `openv` without `O_CREAT`: opens existing non-directory entries.
    Open,
    /// `statv`: `lstat` of every entry.
    Stat,
    /// `unlinkv`.
    Unlink,
    /// `mkdirv`.
    Mkdir,
}

/// How a server treats a failed entry of a batch; the decision is local to each server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Semantics {
    /// Every entry is attempted whatever happened to the others.
    #[default]
    PerformAll,
    /// The server stops at its first failed entry; later ones are not performed.
    StopOnFailure,
}

/// The reply to a batch (seed 000 Fig. 4): one result per performed entry, in request
/// order (`errnos.len()` is the number performed; 0 means success), and the attributes of
/// the successful entries, in the same order, for operations that produce them (create,
/// open, stat, mkdir). For a subdirectory entry `statv` returns only its inode number and
/// type (`incarnation` 0): its attributes live in its own directory object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BatchReply {
    pub errnos: Vec<Errno>,
    pub attrs: Vec<Attr>,
    /// Set when the directory became distributed during this batch (seed 000 §3.1): the
    /// entries after the last performed one were not attempted and belong on the storing
    /// servers of this distribution.
    pub dist: Option<DistInfo>,
}

/// One file of a batch write (`BatchWrite`, seed 002 §3.3): its whole new contents and
/// attributes. The file is created, or an existing regular file replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWrite {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification (and access) time to record; `None`: now.
    pub mtime: Option<Timespec>,
}

/// What a batch read (`BatchRead`, seed 002 §3.2) returns for one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileRead {
    /// The whole file.
    Data {
        attr: Attr,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Failed(Errno),
    /// Its bytes are not all on this server (a hard-linked or large file): read it alone.
    Alone,
    /// Not reached: the reply held as many bytes as asked for; ask again.
    NotRead,
}
