//! The envelope of every message: [`Request`] (one variant per opcode) and [`Reply`], with
//! [`WireError`]. The payload types live by area: `attr` (what clients see), `batch`,
//! `peer` (server to server), `admin`, and the stored objects in `record`.
//!
//! The body of a request frame is the postcard encoding of one [`Call`](crate::Call): the
//! caller's credential, then one [`Request`]; the header's opcode is that request's
//! [`Request::opcode`] and must agree with it. The body of a
//! response frame is the postcard encoding of `Result<Reply, WireError>`. Variant order is
//! part of the wire format: new variants go at the end, and a new field means a new
//! protocol version.

use crate::admin::{FsckData, GroupInfo, ServerStatus, StoreDigest};
use crate::attr::{Attr, Dirents, SetAttr, Statfs, XattrOp};
use crate::batch::{BatchOp, BatchReply, FileRead, FileWrite, Semantics};
use crate::caps::{Capability, Receipt};
use crate::cred::Cred;
use crate::deleg::{DelegGrant, DelegOp, Flushed};
use crate::error::WireError;
use crate::filedata::Piece;
use crate::hugedir::{DistReport, Threshold};
use crate::ids::{Ino, OpId, ServerId, TxId};
use crate::payload::Payload;
use crate::peer::{CommitPayload, CxAnswer, CxRole, ParentPerms, SubOp, Vote};
use crate::record::{Ancestry, DirObject, FileKind, Inode};
use serde::{Deserialize, Serialize};

/// The body of a request frame: who calls, and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    pub cred: Cred,
    pub request: Request,
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
    /// semantics; `rdev` is a device's number; `access` is what the opener will do with
    /// the file if it exists already (`MAY_READ | MAY_WRITE`, checked as by `Open`).
    Create {
        path: String,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        exclusive: bool,
        rdev: u32,
        access: u32,
    },
    /// Open an existing entry; the file handle is its inode number. `access` is what the
    /// opener will do (`MAY_READ | MAY_WRITE`; `O_TRUNC` counts as writing), checked
    /// against the file's permission bits.
    Open {
        path: String,
        access: u32,
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
        /// The epoch of the map the coordinator planned with (0: unknown); a participant
        /// with a newer map refuses (EBUSY) and the coordinator plans again.
        epoch: u64,
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
        data: Payload,
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
    /// Stores `data`, bytes at `file_off` of file `owner`, as one record; answers `Record`,
    /// or `Receipt` when sent with a write capability (which a client that is no admin
    /// needs, covering `owner` and the bytes).
    DataPut {
        owner: Ino,
        data: Payload,
        file_off: u64,
        cap: Option<Capability>,
    },
    /// Bytes `[skip, skip + len)` of each record; a client that is no admin sends the read
    /// capability of the file owning every record.
    DataGet {
        ranges: Vec<(u64, u64, u64)>,
        cap: Option<Capability>,
    },
    /// Records no file uses any more; a client that is no admin names only records it
    /// stored itself, each with its receipt.
    DataDrop {
        records: Vec<u64>,
        receipts: Vec<Receipt>,
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
    /// With `leased`, the inode number of a directory `ops` make must come from a block
    /// this server leased to the sender's session (`AllocInos`; `ESTALE` otherwise);
    /// servers set it for clients that are no admin.
    CxExec {
        op: OpId,
        role: CxRole,
        peer: ServerId,
        ops: Vec<SubOp>,
        leased: bool,
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
    /// A directory's mode, owner and ancestry, from its home: what the server of a new
    /// subdirectory's object needs to fill in the child's ancestry and setgid inheritance.
    DirPerms {
        path: String,
    },
    /// Asks for a write delegation on directory `dir` (with `read`: a read delegation,
    /// which other sessions may hold too) on its home; refused with EBUSY while another
    /// session holds a conflicting one or needs the directory, and with EAGAIN for
    /// directories that cannot be delegated (distributed, too large). A write delegation
    /// replaces the session's own read delegation of the directory.
    DelegAcquire {
        dir: String,
        read: bool,
    },
    /// Writes back work done under delegation `id` of `dir`: `ops` in order, at most once
    /// (`seq` numbers the flushes of one delegation from 1); `creds` are their callers.
    /// `release` ends the delegation once they are applied. ESTALE: it was revoked.
    DelegFlush {
        dir: String,
        id: u64,
        seq: u64,
        creds: Vec<Cred>,
        ops: Vec<DelegOp>,
        release: bool,
    },
    /// From a delegation holder: answers with the delegations of `session` this server
    /// recalls, as soon as there are any, or empty after a few seconds.
    DelegWait {
        session: u64,
    },
    /// A regular file's attributes and the pieces holding its bytes `[offset, offset +
    /// len)`, for a client that fetches them from the data servers itself (`Layout`); with
    /// `write`, for a client about to store those bytes there (write permission). The
    /// answer carries a capability for `holder` (a certificate serial number; servers set
    /// it to the sender's own for clients that are no admin), none when it is empty.
    Layout {
        path: String,
        offset: u64,
        len: u64,
        write: bool,
        holder: String,
    },
    /// Makes `pieces` (records the client stored with `DataPut` on the data servers) the
    /// bytes `[offset, offset + len)` of regular file `ino` at `path`: one metadata update
    /// for a large write (`Attr`); ESTALE when `path` names another file by now. A client
    /// that is no admin sends the data servers' receipt of every piece.
    CommitWrite {
        path: String,
        ino: Ino,
        offset: u64,
        len: u64,
        pieces: Vec<Piece>,
        receipts: Vec<Receipt>,
    },
    /// The wire probe of `plusfs bench`: `data` is dropped, `reply_len` zero bytes (at most
    /// 4 MiB) come back; nothing is stored or read.
    Probe {
        data: Payload,
        reply_len: u32,
    },
    /// From a Cx coordinator that is the parent's home to the server of a new
    /// subdirectory's object: the parent's `DirPerms` answer for operation `op`, sent as
    /// the coordinator starts executing, so the participant need not ask for it.
    CxPerms {
        op: OpId,
        path: String,
        answer: Result<ParentPerms, WireError>,
    },
    /// A replica-group member's view of its group (`cluster status`). Every member answers
    /// it, leading or not.
    GroupStatus,
    /// A member's store summed up at its applied log position (`fsck --replicas`). Every
    /// member answers it.
    GroupDigest,
    /// To the leader of a replicated slot (`cluster replace`): member `remove` is replaced
    /// by the new member `add`, reached at `raft` by the other members and at `client` by
    /// clients. Answered once `add` has caught up and the voters changed.
    GroupReplace {
        remove: u64,
        add: u64,
        raft: String,
        client: String,
    },
    /// A request that is not idempotent (`op`), to a replicated slot, with the sender's
    /// id and a sequence number: the slot keeps its answer in a replicated table, so a
    /// resend after a leader change gets the first answer instead of running `op` again.
    Once {
        client: u64,
        seq: u64,
        op: Box<Request>,
    },
    /// The cluster map this server holds (answered as TOML text, `Reply::Map`).
    MapGet,
    /// To the map service (server 0): apply `change` (a `plusfs_placement::MapChange` as
    /// TOML text) and answer the new map.
    MapChange {
        change: String,
    },
    /// From the map service to every server: a new map (TOML text).
    MapPush {
        map: String,
    },
    /// From the server `from` holding directory objects to their home under the newest
    /// map: take them (the home pulls them with `MigrateOut`).
    MigrateIn {
        paths: Vec<String>,
        from: ServerId,
    },
    /// From a new home to the old one: hand over these directory objects. The old home
    /// stops serving each and answers its object with the first entries (`Reply::Moved`).
    MigrateOut {
        paths: Vec<String>,
    },
    /// The next entries of a handed-over directory (its inode `ino`) after `after`.
    MigrateEntries {
        path: String,
        ino: Ino,
        after: Option<String>,
        limit: u32,
    },
    /// From a new home to the old one: these objects are stored at their new home; the
    /// old home drops its copies.
    MigrateDone {
        paths: Vec<String>,
    },
    /// From the holder of delegation `id` of `dir` (granted with name digests: too large
    /// to send whole): the stored entries `names` (at most 4,096) of the directory, or of
    /// the shard the delegation is of, so the holder answers later calls on them itself
    /// (an unlink under its delegation needs the entry's inode record).
    DelegEntries {
        dir: String,
        id: u64,
        names: Vec<String>,
    },
    /// From a storing server being drained to the home of distributed directory `path`:
    /// give this server's slots of the storing set to another server (the home names it,
    /// tells it with `ShardExpect`, then records the new set). Answers the distribution
    /// (`Reply::Dist`), whose set no longer names `from`.
    ShardEvict {
        path: String,
        from: ServerId,
    },
    /// From the home of `path` to the server that takes the slots of `from`: expect the
    /// shard of incarnation `incarnation` (inode `ino`) from `from`; `set` is the new
    /// storing set. Recorded durably before the home records the set.
    ShardExpect {
        path: String,
        ino: Ino,
        incarnation: u64,
        from: ServerId,
        set: Vec<ServerId>,
    },
    /// To a server expecting a shard of `path`: pull it now (answers once it is stored
    /// here, or when nothing is expected any more).
    ShardPull {
        path: String,
    },
    /// From the server taking a shard to the one giving it: stop serving the shard of
    /// `path` and answer it with its first entries (`Reply::Moved`); later requests about
    /// it are redirected with the storing set `set`. Repeatable.
    ShardOut {
        path: String,
        ino: Ino,
        incarnation: u64,
        set: Vec<ServerId>,
    },
    /// The next entries of a shard handed over with `ShardOut`, after `after`.
    ShardEntries {
        path: String,
        ino: Ino,
        after: Option<String>,
        limit: u32,
    },
    /// From the server that took a shard: it is stored; the giver drops its entries.
    ShardDone {
        path: String,
        ino: Ino,
    },
    /// To the home of distributed directory `path`: its storing set now (`Reply::Dist`
    /// without entry counts; no storing server is asked).
    ShardSet {
        path: String,
    },
    /// From a drained server to the heir of one of its shared (hard-linked) inodes: keep
    /// `inode`, copying here the bytes its pieces hold on `from`. Repeatable (a copy taken
    /// before is replaced).
    InodeIn {
        inode: Inode,
        from: ServerId,
    },
    /// To the server a link entry names as inode `ino`'s home: where the inode is now
    /// (`Reply::Home`; a drained server names the heir it moved it to).
    InodeHome {
        ino: Ino,
    },
    /// From a drained server whose shared inodes moved (`moved`: inode, new home): link
    /// entries here that name `from` as their home are rewritten to name the new one.
    /// Answers how many entries naming `from` it found (`Reply::Count`).
    Relink {
        from: ServerId,
        moved: Vec<(Ino, ServerId)>,
    },
    /// Quotas: set, report, recount, and the allowances servers ask each other for.
    Quota {
        op: crate::quota::QuotaOp,
    },
}

impl Request {
    /// The directory whose home a request is addressed to (none: a request addressed to a
    /// server for another reason: a shard, an inode, data records, transactions, status, or
    /// wrapped in `Once`).
    pub fn target_dir(&self) -> Option<&str> {
        use Request::*;
        fn parent(p: &str) -> Option<&str> {
            crate::path::split(p).map(|(d, _)| d)
        }
        match self {
            Mkdir { path, .. }
            | Rmdir { path }
            | Create { path, .. }
            | Open { path, .. }
            | Stat { path }
            | Unlink { path }
            | SetAttr { path, .. }
            | Symlink { path, .. }
            | Readlink { path }
            | Write { path, .. }
            | Read { path, .. }
            | Layout { path, .. }
            | CommitWrite { path, .. }
            | Xattr { path, .. } => parent(path),
            Fsync { path } if !path.is_empty() => parent(path),
            Rename { src, .. } | Link { src, .. } => parent(src),
            Exchange { a, .. } => parent(a),
            DirStat { path }
            | Readdir { path, .. }
            | DirSetAttr { path, .. }
            | DirXattr { path, .. }
            | SetPolicy { path, .. }
            | DistStatus { path }
            | DirPerms { path } => Some(path),
            Batch { dir, .. }
            | BatchWrite { dir, .. }
            | BatchRead { dir, .. }
            | DelegAcquire { dir, .. }
            | DelegFlush { dir, .. } => Some(dir),
            _ => None,
        }
    }

    /// Whether the request is a step of a shard's move off a drained server (`ShardEvict`
    /// to `ShardSet`).
    pub fn is_shard_move(&self) -> bool {
        use Request::*;
        matches!(
            self,
            ShardEvict { .. }
                | ShardExpect { .. }
                | ShardPull { .. }
                | ShardOut { .. }
                | ShardEntries { .. }
                | ShardDone { .. }
                | ShardSet { .. }
        )
    }

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
            DirPerms { .. } => 49,
            DelegAcquire { .. } => 50,
            DelegFlush { .. } => 51,
            DelegWait { .. } => 52,
            Layout { .. } => 53,
            CommitWrite { .. } => 54,
            Probe { .. } => 55,
            CxPerms { .. } => 56,
            GroupStatus => 57,
            GroupDigest => 58,
            GroupReplace { .. } => 59,
            Once { .. } => 60,
            MapGet => 61,
            MapChange { .. } => 62,
            MapPush { .. } => 63,
            MigrateIn { .. } => 64,
            MigrateOut { .. } => 65,
            MigrateEntries { .. } => 66,
            MigrateDone { .. } => 67,
            DelegEntries { .. } => 68,
            ShardEvict { .. } => 69,
            ShardExpect { .. } => 70,
            ShardPull { .. } => 71,
            ShardOut { .. } => 72,
            ShardEntries { .. } => 73,
            ShardDone { .. } => 74,
            ShardSet { .. } => 75,
            InodeIn { .. } => 76,
            InodeHome { .. } => 77,
            Relink { .. } => 78,
            Quota { .. } => 79,
        }
    }

    /// The bulk bytes this request carries after its body, if it is of a kind that does
    /// (also inside a `Shard` or `OnInode` wrapper).
    pub fn payload(&self) -> Option<&Payload> {
        match self {
            Request::Write { data, .. } | Request::DataPut { data, .. } | Request::Probe { data, .. } => Some(data),
            Request::Shard { op, .. } | Request::OnInode { op, .. } | Request::Once { op, .. } => op.payload(),
            _ => None,
        }
    }

    /// The payload field to fill when decoding (see [`Request::payload`]).
    pub fn payload_mut(&mut self) -> Option<&mut Payload> {
        match self {
            Request::Write { data, .. } | Request::DataPut { data, .. } | Request::Probe { data, .. } => Some(data),
            Request::Shard { op, .. } | Request::OnInode { op, .. } | Request::Once { op, .. } => op.payload_mut(),
            _ => None,
        }
    }

    /// The operation inside exactly-once and shard wrappers (the request itself otherwise).
    pub fn inner(&self) -> &Request {
        match self {
            Request::Once { op, .. } | Request::Shard { op, .. } => op.inner(),
            other => other,
        }
    }

    /// The request inside its `Once` and `Shard` wrappers, to change.
    pub fn inner_mut(&mut self) -> &mut Request {
        match self {
            Request::Once { op, .. } | Request::Shard { op, .. } => op.inner_mut(),
            other => other,
        }
    }

    /// Short lower-case name of the operation, used by counters and logs.
    pub fn name(&self) -> &'static str {
        opcode_name(self.opcode())
    }

    /// Who may send the request: anyone whose credential its identity allows, admins
    /// only, or the cluster's servers only (requests they send each other).
    pub fn privilege(&self) -> Privilege {
        use Request::*;
        match self {
            TxPrepare { .. }
            | TxCommit { .. }
            | TxAbort { .. }
            | ShardImport { .. }
            | CxVote { .. }
            | CxDecide { .. }
            | CxUrge { .. }
            | OnInode { .. }
            | DirPerms { .. }
            | CxPerms { .. }
            | MapPush { .. }
            | MigrateIn { .. }
            | MigrateOut { .. }
            | MigrateEntries { .. }
            | MigrateDone { .. }
            | ShardEvict { .. }
            | ShardExpect { .. }
            | ShardPull { .. }
            | ShardOut { .. }
            | ShardEntries { .. }
            | ShardDone { .. }
            | ShardSet { .. }
            | InodeIn { .. }
            | InodeHome { .. }
            | Relink { .. } => Privilege::Server,
            Compact { .. } | FsckScan | GroupReplace { .. } | GroupDigest | MapChange { .. } => Privilege::Admin,
            // Setting and recounting quotas are for admins, allowances for servers, the
            // usage report for anyone.
            Quota { op: crate::quota::QuotaOp::Set { .. } | crate::quota::QuotaOp::Check { .. } } => Privilege::Admin,
            Quota { op: crate::quota::QuotaOp::Grant { .. } | crate::quota::QuotaOp::Shrink { .. } } => {
                Privilege::Server
            }
            // Data records by number (direct I/O) are any identity's: a client that is no
            // admin presents the capability the file's server issued with `Layout` (checked
            // at admission, then against each record's owner) and commits only receipted
            // records.
            // Client-driven Cx is any identity's for mkdir and rmdir: servers rebuild what a
            // client that is no admin sends them from its credential (admission), take
            // inode numbers only from the sender's lease, and commit only when both sides
            // name the same directory. Serial sub-operations (`SubExec`) apply what the
            // client built: trusted clients only.
            SubExec { .. } => Privilege::Admin,
            // Delegations are any identity's: the server replays each operation of a flush
            // with the checks of the same request sent alone, as the credential the flush
            // names (each admitted by the sender's identity), only on the holder's session,
            // with inode numbers of the delegation's own lease.
            Mkdir { threshold, width, .. } if *threshold != crate::Threshold::Cluster || *width != 0 => {
                Privilege::Admin
            }
            // Changing a directory's distribution policy (`plusfs hugedir`); without values
            // it only applies the current policy (a new directory distributed from birth).
            SetPolicy { threshold, width, .. } if threshold.is_some() || width.is_some() => Privilege::Admin,
            Shard { op, .. } | Once { op, .. } => op.privilege(),
            _ => Privilege::Any,
        }
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
                | DirPerms { .. }
                | CxPerms { .. }
                | GroupStatus
                | GroupDigest
                | GroupReplace { .. }
                | Once { .. }
                | MapGet
                | MapPush { .. }
                | MigrateIn { .. }
                | MigrateOut { .. }
                | MigrateEntries { .. }
                | MigrateDone { .. }
                | ShardEvict { .. }
                | ShardExpect { .. }
                | ShardPull { .. }
                | ShardOut { .. }
                | ShardEntries { .. }
                | ShardDone { .. }
                | ShardSet { .. }
                | InodeIn { .. }
                | InodeHome { .. }
                | Relink { .. }
                | Quota { .. }
                | DelegFlush { .. }
                | DelegWait { .. }
                | DelegEntries { .. }
                | Layout { .. }
                | Probe { .. }
                | Xattr { op: XattrOp::Get { .. } | XattrOp::List | XattrOp::Set { create: false, .. }, .. }
                | DirXattr { op: XattrOp::Get { .. } | XattrOp::List | XattrOp::Set { create: false, .. }, .. }
        ) || matches!(self, Shard { op, .. } | OnInode { op, .. } if op.is_idempotent())
    }

    /// Whether the request changes state through a path, so that running it a second time
    /// after another client renamed, removed or replaced what the path named would do
    /// something else: an overwrite, a truncate or other attribute change, a batch of
    /// file writes, an xattr set. Such a request is idempotent only while its path keeps
    /// naming the same object; a replicated slot gets it exactly once (`Once`) like a
    /// request that is not idempotent.
    pub fn changes_by_path(&self) -> bool {
        use Request::*;
        matches!(
            self,
            Write { .. }
                | SetAttr { .. }
                | DirSetAttr { .. }
                | BatchWrite { .. }
                | Xattr { op: XattrOp::Set { .. } | XattrOp::Remove { .. }, .. }
                | DirXattr { op: XattrOp::Set { .. } | XattrOp::Remove { .. }, .. }
        ) || matches!(self, Shard { op, .. } | OnInode { op, .. } if op.changes_by_path())
    }

    /// Whether a resend of the request to a replicated slot must go as `Once`: it is not
    /// idempotent, or it is only while its path names the same object.
    pub fn needs_once(&self) -> bool {
        !self.is_idempotent() || self.changes_by_path()
    }
}

/// Who may send a request (see [`Request::privilege`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// Any authenticated client, within its identity's uids and gids.
    Any,
    /// Admin identities (and servers).
    Admin,
    /// The cluster's servers only.
    Server,
}

/// Names of the opcodes, indexed by opcode.
pub const OPCODE_NAMES: [&str; 80] = [
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
    "dir_perms",
    "deleg_acquire",
    "deleg_flush",
    "deleg_wait",
    "layout",
    "commit_write",
    "probe",
    "cx_perms",
    "group_status",
    "group_digest",
    "group_replace",
    "once",
    "map_get",
    "map_change",
    "map_push",
    "migrate_in",
    "migrate_out",
    "migrate_entries",
    "migrate_done",
    "deleg_entries",
    "shard_evict",
    "shard_expect",
    "shard_pull",
    "shard_out",
    "shard_entries",
    "shard_done",
    "shard_set",
    "inode_in",
    "inode_home",
    "relink",
    "quota",
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
    Status(Box<ServerStatus>),
    Fsck(FsckData),
    Vote(Vote),
    Batch(BatchReply),
    Dist(DistReport),
    /// File contents (`Read`), or record contents (`DataGet`, concatenated in order).
    Data(Payload),
    /// The id of a stored record (`DataPut`).
    Record(u64),
    /// A stored record and the data server's signed word for it (`DataPut` with a
    /// capability).
    Receipt(Receipt),
    /// Extended-attribute names (`Xattr` list).
    Names(Vec<String>),
    /// Per-file results of a `BatchRead`, in request order.
    Files(Vec<FileRead>),
    /// A Cx server's answer to `CxExec`.
    CxAnswer(CxAnswer),
    /// A participant's votes (`None`: YES), in the order of the `CxVote`, each with the
    /// directory its side makes or removes (mkdir, rmdir), which the coordinator compares
    /// with its own side's.
    CxVotes(Vec<(OpId, Option<WireError>, Option<crate::peer::DirSide>)>),
    /// How a Cx operation ended after `CxLaunch`: committed, or ALL-NO.
    CxOutcome {
        committed: bool,
    },
    /// Sub-operations that take back a `SubExec`, and the attributes of the directory
    /// object it made, if any (owner and setgid inheritance are the server's).
    Undo {
        ops: Vec<SubOp>,
        made: Option<Attr>,
    },
    /// Leased inode numbers `first .. first + count`.
    Inos {
        first: Ino,
        count: u32,
    },
    /// A directory's mode, owner, ancestry and default ACL (`DirPerms`).
    DirPerms {
        mode: u32,
        uid: u32,
        gid: u32,
        ancestry: Option<Ancestry>,
        default_acl: Option<Vec<u8>>,
    },
    /// A delegation granted (`DelegAcquire`).
    Deleg(Box<DelegGrant>),
    /// How a flush went (`DelegFlush`).
    Flushed(Flushed),
    /// Delegations recalled (`DelegWait`), by id.
    Recalls(Vec<u64>),
    /// A regular file's attributes, the pieces over the range asked and, for a named
    /// holder, the capability to read (or write) them on the data servers (`Layout`).
    Layout {
        attr: Attr,
        pieces: Vec<Piece>,
        cap: Option<Capability>,
    },
    /// This member of a replicated server slot does not lead its group: ask the member at
    /// `leader` (its client address; `None` while no leader is known). Nothing was done.
    /// The transport follows it; callers never see it.
    Redirect {
        leader: Option<String>,
    },
    /// A member's view of its group (`GroupStatus`).
    Group(GroupInfo),
    /// A member's store summed up (`GroupDigest`).
    Digest(StoreDigest),
    /// A cluster map as TOML text (`MapGet`, `MapChange`).
    Map(String),
    /// Directory objects handed over (`MigrateOut`, `MigrateEntries`).
    Moved(Vec<crate::migrate::MovedDir>),
    /// Stored entries (`DelegEntries`), one per name asked, `None` for a name not there.
    Entries(Vec<Option<Inode>>),
    /// Where a shared inode is (`InodeHome`).
    Home(ServerId),
    /// How many objects a request found (`Relink`).
    Count(u64),
    /// Answers to `Quota`.
    Quota(crate::quota::QuotaReply),
}

/// What a response body holds.
pub type Response = Result<Reply, WireError>;

#[cfg(test)]
mod tests {
    use serde::Serialize;

    /// Byte fields are encoded as one slice (`serde_bytes`) instead of element by element;
    /// postcard writes both the same way, so frames and stored records of earlier
    /// versions still decode.
    #[test]
    fn byte_fields_keep_the_element_encoding() {
        #[derive(Serialize)]
        struct Elements {
            data: Vec<u8>,
        }
        #[derive(Serialize)]
        struct Slice {
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        let data: Vec<u8> = (0..=255).chain(0..200).collect();
        let a = postcard::to_allocvec(&Elements { data: data.clone() }).expect("encodes");
        let b = postcard::to_allocvec(&Slice { data }).expect("encodes");
        assert_eq!(a, b);
    }
}
