//! What a client keeps of one delegated directory.

use plusfs_proto::{Attr, Cred, DelegOp, DirObject, Request, ServerId};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Most queued operations per directory before a flush.
pub const MAX_OPS: usize = 2048;
/// Most queued file bytes per directory before a flush.
pub const MAX_BYTES: usize = 4 << 20;
/// What this client knows of one entry of a delegated directory.
#[derive(Debug, Clone)]
pub(crate) enum Local {
    /// Its attributes (a subdirectory's are its kind and inode only), symlink target,
    /// and whole contents when known (files created under the delegation).
    Known { attr: Attr, target: Option<String>, content: Option<Vec<u8>>, dirty: bool, link: bool },
    /// Changed by a request sent to the server: ask the server.
    Unknown,
}

/// A delegation this client holds.
pub(crate) struct Held {
    pub id: u64,
    /// A read delegation: lookups, listings and stats are answered here, changes go to
    /// the server (which does not recall this client's own read delegation for them).
    pub read: bool,
    pub server: ServerId,
    /// For a shard of a distributed directory, the directory's incarnation: the entries
    /// known here are those whose names Eq. 2 places on `server`.
    pub shard: Option<u64>,
    /// For a shard: its index in the storing set and the set's size.
    pub slot: Option<(usize, usize)>,
    pub dir: String,
    pub obj: DirObject,
    /// The directory's attributes changed by a request sent to the server.
    pub dir_stale: bool,
    pub entries: BTreeMap<String, Local>,
    /// For a directory granted with name digests (too large to send whole): the sorted
    /// digests of the names it had then. A name neither in `entries` nor here is not in
    /// the directory; one only here is asked of the server.
    pub digests: Option<Box<[u64]>>,
    /// Names of the entries whose contents changed since the last write-back (a write-back
    /// looks at these, not at every entry; a name removed or replaced since is skipped).
    pub dirty: BTreeSet<String>,
    pub pending: Vec<DelegOp>,
    pub creds: Vec<Cred>,
    pub pending_bytes: usize,
    pub since: Option<Instant>,
    pub last_use: Instant,
    pub seq: u64,
    /// A flush sent whose answer was lost: resent as it was (same number) before anything
    /// else.
    pub unacked: Option<Request>,
    pub next_ino: u64,
    pub ino_end: u64,
    /// Returned or revoked: nothing may be done under it any more.
    pub gone: bool,
    /// When the grant was asked for: the server cannot have recalled it before.
    pub asked: Instant,
    /// A write-back that waited its whole patience for the server and failed: later
    /// ones are tried once (no more waiting) until the server answers again, so each
    /// request meeting a lost server fails in one retry's time, not one patience each.
    pub unreachable: bool,
}

/// Where a name stands in a delegated directory as this client knows it.
pub(crate) enum Found<'a> {
    /// Known (or changed through the server: [`Local::Unknown`]).
    Here(&'a Local),
    /// Not in the directory.
    Absent,
    /// Perhaps in the directory (its digest was granted): ask the server.
    AskServer,
}

impl Held {
    /// Where `name` stands.
    pub fn find(&self, name: &str) -> Found<'_> {
        if let Some(l) = self.entries.get(name) {
            return Found::Here(l);
        }
        match &self.digests {
            Some(d) if d.binary_search(&plusfs_proto::name_digest(name)).is_ok() => Found::AskServer,
            _ => Found::Absent,
        }
    }

    /// Whether entry `name` belongs here (always, but for a shard: the names Eq. 2
    /// places on its server).
    pub fn places(&self, name: &str) -> bool {
        self.slot.is_none_or(|(index, len)| plusfs_proto::hugedir::slot_of(name, len) == index)
    }

    /// Whether every entry of the directory is known here (a listing can be answered).
    pub fn whole(&self) -> bool {
        self.digests.is_none()
    }

    /// Changes not written back: queued operations, files with new contents, and a flush
    /// whose answer is awaited.
    pub fn unflushed(&self) -> usize {
        let dirty = self
            .dirty
            .iter()
            .filter(|n| matches!(self.entries.get(*n), Some(Local::Known { dirty: true, .. })))
            .count();
        self.pending.len() + dirty + usize::from(self.unacked.is_some())
    }
}
