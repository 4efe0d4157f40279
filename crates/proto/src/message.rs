//! Message bodies: requests, replies, errors and the records they carry.
//!
//! The body of a request frame is the postcard encoding of one [`Request`]; the header's
//! opcode is that request's [`Request::opcode`] and must agree with it. The body of a
//! response frame is the postcard encoding of `Result<Reply, WireError>`. Variant order is
//! part of the wire format: new variants go at the end, and a new field means a new
//! protocol version.

use crate::frame::{Frame, FrameError, Header, FLAG_RESPONSE, PROTOCOL_VERSION};
use crate::hugedir::{DistInfo, DistReport, Distribution, Threshold};
use crate::Errno;
use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Cluster-unique inode number. `1` is the root directory.
pub type Ino = u64;
/// Identifies a two-phase-commit transaction: the coordinator's id in the top 16 bits.
pub type TxId = u64;
/// Identifies a server in the cluster map.
pub type ServerId = u32;

/// Inode number of `/`.
pub const ROOT_INO: Ino = 1;

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
        }
    }
}

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

/// A directory object with all its entries, as moved by a directory rename.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirDump {
    pub path: String,
    pub object: DirObject,
    pub entries: Vec<(String, Inode)>,
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
    /// deleted here and re-homed below `new_root` (directory rename).
    ExportSubtree { root: String, new_root: String },
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
    /// New inodes of `ExchangeEntry` entries here: (directory, name, inode).
    pub swap_in: Vec<(String, String, Inode)>,
}

/// A participant's YES vote; a NO vote is an error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Vote {
    /// Objects exported by an `ExportSubtree` sub-operation.
    pub exports: Vec<DirDump>,
    /// Current inodes of `ExchangeEntry` entries: (directory, name, inode).
    pub swap_out: Vec<(String, String, Inode)>,
}

/// Counters of one server, as `plusfs cluster status` prints them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ServerStatus {
    pub id: ServerId,
    pub epoch: u64,
    pub dir_objects: u64,
    pub entries: u64,
    /// Operations served, by operation name.
    pub ops: Vec<(String, u64)>,
    pub msgs_in: u64,
    pub msgs_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Store batches submitted, engine writes, and WAL fsyncs: with group commit one
    /// write and one fsync serve several batches.
    pub store_batches: u64,
    pub store_writes: u64,
    pub store_syncs: u64,
    /// Two-phase-commit transactions started as coordinator, and not yet finished.
    pub tx_started: u64,
    pub tx_pending: u64,
    /// Distributed (or distributing) directories whose primary object is here; the
    /// per-server entry counts are this server's view (see `shards`).
    pub hugedirs: Vec<DistReport>,
    /// Shards held here: directory path and entries.
    pub shards: Vec<(String, u64)>,
    /// File-data records held, data segments and their bytes.
    pub data_records: u64,
    pub data_segments: u64,
    pub data_bytes: u64,
    /// Data-store I/O since start: append calls (one write each), read calls, bytes read
    /// and written, and read calls by size (≤4 KiB, ≤64 KiB, ≤256 KiB, ≤1 MiB, more).
    pub data_appends: u64,
    pub data_reads: u64,
    pub data_bytes_read: u64,
    pub data_bytes_written: u64,
    pub data_read_sizes: Vec<u64>,
    /// Cx: sub-operations executed (YES), operations committed and aborted here as
    /// coordinator, commitment rounds (each one VOTE and one decision message per
    /// participant), operations committed at once (conflict, L-COM, full log), participant
    /// results invalidated, operations pending now, live log bytes now and at most.
    pub cx_executed: u64,
    pub cx_committed: u64,
    pub cx_aborted: u64,
    pub cx_rounds: u64,
    pub cx_immediate: u64,
    pub cx_invalidated: u64,
    pub cx_pending: u64,
    pub cx_log_bytes: u64,
    pub cx_log_peak: u64,
}

/// File-system totals (`statfs`) from one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Statfs {
    pub dir_objects: u64,
    pub entries: u64,
}

/// Everything `fsck` needs from one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FsckData {
    /// Directory objects held: path, inode number.
    pub dirs: Vec<(String, Ino)>,
    /// Subdirectory entries held: parent inode, name, child inode.
    pub subdirs: Vec<(Ino, String, Ino)>,
    /// Entries whose directory object is not on this server: parent inode, name.
    pub orphans: Vec<(Ino, String)>,
    /// Transactions not yet finished (they may explain transient differences).
    pub pending_tx: u64,
    /// Shards held: path, directory inode, incarnation.
    pub shards: Vec<(String, Ino, u64)>,
    /// Entries of a shard that Eq. 2 places on another server: directory path, name.
    pub misplaced: Vec<(String, String)>,
    /// Distributed directories homed here: path, inode, incarnation, storing set.
    pub distributed: Vec<(String, Ino, u64, Vec<ServerId>)>,
    /// Hard-link entries held here: shared inode, its home.
    pub links: Vec<(Ino, ServerId)>,
    /// Shared inode objects held here: inode, link count.
    pub shared: Vec<(Ino, u32)>,
}

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
        data: Vec<u8>,
    },
    Failed(Errno),
    /// Its bytes are not all on this server (a hard-linked or large file): read it alone.
    Alone,
    /// Not reached: the reply held as many bytes as asked for; ask again.
    NotRead,
}

/// Identifies one Cx operation (seed 004 §III.A): the client, the process (thread) in it
/// that issued the operation, and that process's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId {
    pub client: u64,
    pub process: u32,
    pub seq: u64,
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}.{}.{}", self.client, self.process, self.seq)
    }
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
}

/// Every request a client or a peer server can send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Ping,
    Mkdir {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
        /// Huge-directory threshold of the new directory.
        threshold: Threshold,
        /// Storing servers if it is distributed (0: the cluster's setting).
        width: u32,
    },
    Rmdir {
        path: String,
    },
    /// Create a regular file, FIFO, device or socket; `exclusive` gives `O_EXCL`
    /// semantics; `rdev` is a device's number.
    Create {
        path: String,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        exclusive: bool,
        rdev: u32,
    },
    /// Open an existing entry; the file handle is its inode number.
    Open {
        path: String,
    },
    Close {
        ino: Ino,
    },
    /// `lstat` of an entry, answered by its parent's server (`IsDir` for directories).
    Stat {
        path: String,
    },
    /// Attributes of a directory, answered by the directory's own server.
    DirStat {
        path: String,
    },
    Unlink {
        path: String,
    },
    /// One page of entries whose names sort after `after`.
    Readdir {
        path: String,
        after: Option<String>,
        limit: u32,
    },
    Rename {
        src: String,
        dst: String,
    },
    /// Change attributes of an entry (`IsDir` for directories).
    SetAttr {
        path: String,
        set: SetAttr,
    },
    /// Change attributes of a directory, on the directory's own server.
    DirSetAttr {
        path: String,
        set: SetAttr,
    },
    Symlink {
        path: String,
        target: String,
        uid: u32,
        gid: u32,
    },
    Readlink {
        path: String,
    },
    Statfs,
    Status,
    FsckScan,
    TxPrepare {
        txid: TxId,
        ops: Vec<SubOp>,
    },
    TxCommit {
        txid: TxId,
        payload: CommitPayload,
    },
    TxAbort {
        txid: TxId,
    },
    /// One operation on many entries of directory `dir`; `mode`, `uid`, `gid` apply to
    /// created entries.
    Batch {
        op: BatchOp,
        dir: String,
        names: Vec<String>,
        mode: u32,
        uid: u32,
        gid: u32,
        semantics: Semantics,
    },
    /// `closev`: closes open files (their inode numbers).
    CloseBatch {
        inos: Vec<Ino>,
        semantics: Semantics,
    },
    /// A request about entries of a distributed directory, addressed to this server's shard
    /// of it (Eq. 2); refused with ESTALE when the directory's incarnation differs.
    Shard {
        incarnation: u64,
        op: Box<Request>,
    },
    /// From a primary while it distributes: entries for this server's shard of `path`; the
    /// last request of a distribution carries the shard object itself. Repeatable.
    ShardImport {
        path: String,
        ino: Ino,
        entries: Vec<(String, Inode)>,
        shard: Option<DirObject>,
    },
    /// Changes a directory's huge-directory policy (on its home); distributes it now if it
    /// is already over the new threshold.
    SetPolicy {
        path: String,
        threshold: Option<Threshold>,
        width: Option<u32>,
    },
    /// A directory's distribution and entries per storing server.
    DistStatus {
        path: String,
    },
    /// Writes `data` at `offset` of a regular file (at its end with `append`).
    Write {
        path: String,
        offset: u64,
        data: Vec<u8>,
        append: bool,
    },
    /// Reads up to `len` bytes at `offset` of a regular file (fewer at its end).
    Read {
        path: String,
        offset: u64,
        len: u32,
    },
    /// Makes a file's data and metadata durable.
    Fsync {
        path: String,
    },
    /// From a file's entry server: store `data` as a record of `owner` (a chunk of a large
    /// file, or a file renamed away from its data); answers `Record`.
    DataPut {
        owner: Ino,
        data: Vec<u8>,
    },
    /// From a file's entry server: bytes `[skip, skip + len)` of each record.
    DataGet {
        ranges: Vec<(u64, u64, u64)>,
    },
    /// From a file's entry server: records no file uses any more.
    DataDrop {
        records: Vec<u64>,
    },
    /// Compacts this server's data segments whose live share is at most `live_percent`.
    Compact {
        live_percent: u32,
    },
    /// Extended attributes of an entry (`IsDir` for a directory: ask `DirXattr`).
    Xattr {
        path: String,
        op: XattrOp,
    },
    /// Extended attributes of a directory, on the directory's own server.
    DirXattr {
        path: String,
        op: XattrOp,
    },
    /// `link`: a new entry `dst` for the non-directory `src`, sent to `src`'s server.
    Link {
        src: String,
        dst: String,
    },
    /// `rename` with `RENAME_EXCHANGE`: entries `a` and `b` (non-directories) swap
    /// atomically; sent to `a`'s server.
    Exchange {
        a: String,
        b: String,
    },
    /// From an entry's server to the home of its shared inode: `op` (an entry request
    /// such as `Stat`, `Write`, `SetAttr`; its path only names the file in errors)
    /// applies to shared inode `ino`.
    OnInode {
        ino: Ino,
        op: Box<Request>,
    },
    /// BFOw: creates or replaces the files of `dir` held by this server with the given
    /// contents, all data in one append (one fsync) and all inodes in one store write.
    BatchWrite {
        dir: String,
        files: Vec<FileWrite>,
        semantics: Semantics,
    },
    /// BFOr: the whole contents of files of `dir` held by this server, read in the order
    /// of their extents with near ones merged; at most about `max_bytes` per reply.
    BatchRead {
        dir: String,
        names: Vec<String>,
        max_bytes: u64,
    },
    /// Cx execution phase, from the client to both servers at once: execute `ops` (check,
    /// lock what they touch, log a Result record) as `role` of operation `op`, whose other
    /// server is `peer`; answers `CxAnswer`. Nothing becomes visible before commitment.
    CxExec {
        op: OpId,
        role: CxRole,
        peer: ServerId,
        ops: Vec<SubOp>,
    },
    /// Cx VOTE, coordinator to participant, for many operations at once: each with the
    /// operations the coordinator ordered after it (the participant invalidates those it
    /// executed first). Answers `CxVotes`.
    CxVote {
        coordinator: ServerId,
        ops: Vec<(OpId, Vec<OpId>)>,
    },
    /// Cx COMMIT-REQ / ABORT-REQ for many operations; the reply is the ACK.
    CxDecide {
        commits: Vec<OpId>,
        aborts: Vec<OpId>,
    },
    /// From a participant whose pending operations another request needs (a conflict) or
    /// whose log is full: commit them now. Answers once they are decided.
    CxUrge {
        participant: ServerId,
        ops: Vec<OpId>,
    },
    /// Cx L-COM, from the client after disagreeing answers: commit `op` now and say how it
    /// ended (`CxOutcome`; not committed is ALL-NO).
    CxLaunch {
        op: OpId,
        participant: ServerId,
    },
    /// Serial execution (and its CLEAR): apply `ops` here at once, as one store write;
    /// answers `Undo` with the sub-operations that take them back.
    SubExec {
        ops: Vec<SubOp>,
    },
    /// Leases `count` inode numbers to a client (it names directories it makes with Cx).
    AllocInos {
        count: u32,
    },
}

/// What an `Xattr` request does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrOp {
    /// The value (`Data`), or ENODATA.
    Get { name: String },
    /// Every name (`Names`).
    List,
    /// Sets a value; `create` fails with EEXIST if it exists, `replace` with ENODATA if not.
    Set { name: String, value: Vec<u8>, create: bool, replace: bool },
    /// Removes a name (ENODATA if absent).
    Remove { name: String },
}

impl Request {
    /// The opcode carried in the frame header (variant index + 1).
    pub fn opcode(&self) -> u16 {
        use Request::*;
        match self {
            Ping => 1,
            Mkdir { .. } => 2,
            Rmdir { .. } => 3,
            Create { .. } => 4,
            Open { .. } => 5,
            Close { .. } => 6,
            Stat { .. } => 7,
            DirStat { .. } => 8,
            Unlink { .. } => 9,
            Readdir { .. } => 10,
            Rename { .. } => 11,
            SetAttr { .. } => 12,
            DirSetAttr { .. } => 13,
            Symlink { .. } => 14,
            Readlink { .. } => 15,
            Statfs => 16,
            Status => 17,
            FsckScan => 18,
            TxPrepare { .. } => 19,
            TxCommit { .. } => 20,
            TxAbort { .. } => 21,
            Batch { .. } => 22,
            CloseBatch { .. } => 23,
            Shard { .. } => 24,
            ShardImport { .. } => 25,
            SetPolicy { .. } => 26,
            DistStatus { .. } => 27,
            Write { .. } => 28,
            Read { .. } => 29,
            Fsync { .. } => 30,
            DataPut { .. } => 31,
            DataGet { .. } => 32,
            DataDrop { .. } => 33,
            Compact { .. } => 34,
            Xattr { .. } => 35,
            DirXattr { .. } => 36,
            Link { .. } => 37,
            Exchange { .. } => 38,
            OnInode { .. } => 39,
            BatchWrite { .. } => 40,
            BatchRead { .. } => 41,
            CxExec { .. } => 42,
            CxVote { .. } => 43,
            CxDecide { .. } => 44,
            CxUrge { .. } => 45,
            CxLaunch { .. } => 46,
            SubExec { .. } => 47,
            AllocInos { .. } => 48,
        }
    }

    /// Short lower-case name of the operation, used by counters and logs.
    pub fn name(&self) -> &'static str {
        opcode_name(self.opcode())
    }

    /// True when sending the request twice has the same effect as once, so a client may
    /// resend it after a broken connection.
    pub fn is_idempotent(&self) -> bool {
        use Request::*;
        matches!(
            self,
            Ping | Open { .. }
                | Close { .. }
                | Stat { .. }
                | DirStat { .. }
                | Readdir { .. }
                | SetAttr { .. }
                | DirSetAttr { .. }
                | Readlink { .. }
                | Statfs
                | Status
                | FsckScan
                | CloseBatch { .. }
                | Batch { op: BatchOp::Stat | BatchOp::Open, .. }
                | ShardImport { .. }
                | SetPolicy { .. }
                | DistStatus { .. }
                | Write { append: false, .. }
                | Read { .. }
                | Fsync { .. }
                | BatchWrite { .. }
                | BatchRead { .. }
                | DataGet { .. }
                | DataDrop { .. }
                | CxExec { .. }
                | CxVote { .. }
                | CxDecide { .. }
                | CxUrge { .. }
                | CxLaunch { .. }
                | AllocInos { .. }
                | Xattr { op: XattrOp::Get { .. } | XattrOp::List | XattrOp::Set { create: false, .. }, .. }
                | DirXattr { op: XattrOp::Get { .. } | XattrOp::List | XattrOp::Set { create: false, .. }, .. }
        ) || matches!(self, Shard { op, .. } | OnInode { op, .. } if op.is_idempotent())
    }
}

/// Names of the opcodes, indexed by opcode.
pub const OPCODE_NAMES: [&str; 49] = [
    "invalid",
    "ping",
    "mkdir",
    "rmdir",
    "create",
    "open",
    "close",
    "stat",
    "dirstat",
    "unlink",
    "readdir",
    "rename",
    "setattr",
    "dirsetattr",
    "symlink",
    "readlink",
    "statfs",
    "status",
    "fsck",
    "tx_prepare",
    "tx_commit",
    "tx_abort",
    "batch",
    "closev",
    "shard",
    "shard_import",
    "set_policy",
    "dist_status",
    "write",
    "read",
    "fsync",
    "data_put",
    "data_get",
    "data_drop",
    "compact",
    "xattr",
    "dir_xattr",
    "link",
    "exchange",
    "on_inode",
    "batch_write",
    "batch_read",
    "cx_exec",
    "cx_vote",
    "cx_decide",
    "cx_urge",
    "cx_launch",
    "sub_exec",
    "alloc_inos",
];

/// Name of an opcode (`"invalid"` for unknown ones).
pub fn opcode_name(op: u16) -> &'static str {
    OPCODE_NAMES.get(op as usize).copied().unwrap_or("invalid")
}

/// Successful results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Pong {
        server: ServerId,
        epoch: u64,
    },
    Done,
    Attr(Attr),
    /// The entry is a directory: ask the directory's own server (`DirStat`, `DirSetAttr`).
    IsDir {
        ino: Ino,
    },
    Dirents(Dirents),
    Target(String),
    Statfs(Statfs),
    Status(ServerStatus),
    Fsck(FsckData),
    Vote(Vote),
    Batch(BatchReply),
    Dist(DistReport),
    /// File contents (`Read`), or record contents (`DataGet`, concatenated in order).
    Data(Vec<u8>),
    /// The id of a stored record (`DataPut`).
    Record(u64),
    /// Extended-attribute names (`Xattr` list).
    Names(Vec<String>),
    /// Per-file results of a `BatchRead`, in request order.
    Files(Vec<FileRead>),
    /// A Cx server's answer to `CxExec`.
    CxAnswer(CxAnswer),
    /// A participant's votes (`None`: YES), in the order of the `CxVote`.
    CxVotes(Vec<(OpId, Option<WireError>)>),
    /// How a Cx operation ended after `CxLaunch`: committed, or ALL-NO.
    CxOutcome {
        committed: bool,
    },
    /// Sub-operations that take back a `SubExec`.
    Undo(Vec<SubOp>),
    /// Leased inode numbers `first .. first + count`.
    Inos {
        first: Ino,
        count: u32,
    },
}

/// A failed request: the errno and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{message}")]
pub struct WireError {
    pub errno: Errno,
    pub message: String,
    /// Set when the error is that the directory object at this path does not exist: the
    /// client then tells ENOENT from ENOTDIR by looking at the ancestors.
    pub missing_dir: Option<String>,
    /// Set when the request concerned entries of a distributed directory and went to the
    /// wrong server: where they are (seed 001 §IV.C). The errno is EREMCHG.
    pub redirect: Option<Box<DistInfo>>,
    /// Set when a rename would replace a hard link without dropping its link: the shared
    /// inode and its home, so the coordinator can retry with both. The errno is EBUSY.
    pub replaced_link: Option<(Ino, ServerId)>,
}

impl WireError {
    pub fn new(errno: Errno, message: impl Into<String>) -> WireError {
        WireError { errno, message: message.into(), missing_dir: None, redirect: None, replaced_link: None }
    }

    /// The directory object at `path` does not exist on its home server.
    pub fn missing_dir(path: &str) -> WireError {
        WireError {
            errno: Errno::ENOENT,
            message: format!("no directory object for '{path}'"),
            missing_dir: Some(path.to_string()),
            redirect: None,
            replaced_link: None,
        }
    }

    /// The entries of a distributed directory are elsewhere: see `info`.
    pub fn redirect(info: DistInfo) -> WireError {
        WireError {
            errno: Errno::EREMCHG,
            message: format!("'{}' is {}; its entries are on servers {:?}", info.path, info.state, info.set),
            missing_dir: None,
            redirect: Some(Box::new(info)),
            replaced_link: None,
        }
    }

    /// `path` is a hard link to shared inode `ino` on `home`, which a rename would replace.
    pub fn replaced_link(path: &str, ino: Ino, home: ServerId) -> WireError {
        WireError {
            replaced_link: Some((ino, home)),
            ..WireError::new(Errno::EBUSY, format!("'{path}' is a hard link to inode {ino} on server {home}"))
        }
    }
}

/// What a response body holds.
pub type Response = Result<Reply, WireError>;

/// Why a frame's body could not be turned into a message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("peer speaks protocol version {peer}, this build speaks {ours}")]
    Version { peer: u8, ours: u8 },
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    #[error("header opcode {header} does not match body opcode {body}")]
    OpcodeMismatch { header: u16, body: u16 },
    #[error("expected a {0} frame")]
    Direction(&'static str),
    #[error("malformed body: {0}")]
    Body(String),
}

impl DecodeError {
    /// The errno a caller sees for this error.
    pub fn errno(&self) -> Errno {
        match self {
            DecodeError::Frame(FrameError::TooLarge(_)) => Errno::EMSGSIZE,
            _ => Errno::EPROTO,
        }
    }
}

/// Encodes a request frame.
pub fn encode_request(request_id: u64, req: &Request, dst: &mut BytesMut) -> Result<(), FrameError> {
    let body = postcard::to_allocvec(req).expect("in-memory encoding cannot fail");
    let header = Header { version: PROTOCOL_VERSION, flags: 0, opcode: req.opcode(), request_id };
    Frame::encode_into(&header, &body, dst)
}

/// Encodes a response frame for the request with `request_id` and `opcode`.
pub fn encode_response(request_id: u64, opcode: u16, resp: &Response, dst: &mut BytesMut) -> Result<(), FrameError> {
    let body = postcard::to_allocvec(resp).expect("in-memory encoding cannot fail");
    let header = Header { version: PROTOCOL_VERSION, flags: FLAG_RESPONSE, opcode, request_id };
    Frame::encode_into(&header, &body, dst)
}

fn check_version(h: &Header) -> Result<(), DecodeError> {
    if h.version != PROTOCOL_VERSION {
        return Err(DecodeError::Version { peer: h.version, ours: PROTOCOL_VERSION });
    }
    Ok(())
}

/// Decodes a request frame, checking version, direction and opcode.
pub fn decode_request(frame: &Frame) -> Result<Request, DecodeError> {
    check_version(&frame.header)?;
    if frame.is_response() {
        return Err(DecodeError::Direction("request"));
    }
    let op = frame.header.opcode;
    if op == 0 || op as usize >= OPCODE_NAMES.len() {
        return Err(DecodeError::UnknownOpcode(op));
    }
    let (req, rest): (Request, &[u8]) =
        postcard::take_from_bytes(&frame.body).map_err(|e| DecodeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Body(format!("{} trailing bytes", rest.len())));
    }
    if req.opcode() != op {
        return Err(DecodeError::OpcodeMismatch { header: op, body: req.opcode() });
    }
    Ok(req)
}

/// Decodes a response frame, checking version and direction.
pub fn decode_response(frame: &Frame) -> Result<Response, DecodeError> {
    if !frame.is_response() {
        return Err(DecodeError::Direction("response"));
    }
    if frame.header.version != PROTOCOL_VERSION {
        // A server that refuses our version says why in its own version's frame; report
        // the mismatch, which is the useful fact.
        return Err(DecodeError::Version { peer: frame.header.version, ours: PROTOCOL_VERSION });
    }
    let (resp, rest): (Response, &[u8]) =
        postcard::take_from_bytes(&frame.body).map_err(|e| DecodeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Body(format!("{} trailing bytes", rest.len())));
    }
    Ok(resp)
}
