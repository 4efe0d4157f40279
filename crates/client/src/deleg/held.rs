//! What a client keeps of one delegated directory.

use plusfs_proto::acl::Acl;
use plusfs_proto::{Attr, Cred, DelegOp, DirObject, Request, ServerId};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Most queued operations per directory before a flush.
pub const MAX_OPS: usize = 2048;
/// Most queued file bytes per directory before a flush.
pub const MAX_BYTES: usize = 4 << 20;
/// Most entries a delegation granted with digests keeps (learnt from the server, created
/// or removed here): past it the ones the server has as they are known here are
/// forgotten after a write-back (asked again when needed), and if that is not enough
/// (mostly removals) the delegation is returned, so the next grant's digests leave out
/// what was removed. Memory per delegation stays bounded whatever the directory's size.
pub const MAX_KEPT: usize = 65_536;
/// What this client knows of one entry of a delegated directory.
#[derive(Debug, Clone)]
pub(crate) enum Local {
    /// Its attributes (a subdirectory's are its kind and inode only), symlink target,
    /// and whole contents when known (files created under the delegation).
    /// `acl` is its access ACL (checked here as the server would), `link` says it is a
    /// hard link (its inode is the server's to check and change).
    Known { attr: Attr, target: Option<String>, content: Option<Vec<u8>>, dirty: bool, link: bool, acl: Option<Acl> },
    /// Changed by a request sent to the server: ask the server.
    Unknown,
    /// Removed here (or found missing on the server) while its name's digest, granted
    /// with the delegation, still says it may be in the directory.
    Removed,
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
        match self.entries.get(name) {
            Some(Local::Removed) => Found::Absent,
            Some(l) => Found::Here(l),
            None if self.digested(name) => Found::AskServer,
            None => Found::Absent,
        }
    }

    /// Whether `name` is known here only by its digest (the server is asked about it).
    pub fn asks(&self, name: &str) -> bool {
        matches!(self.find(name), Found::AskServer)
    }

    /// Whether `name`'s digest was granted (the server may have it without this client
    /// knowing the entry).
    fn digested(&self, name: &str) -> bool {
        self.digests.as_ref().is_some_and(|d| d.binary_search(&plusfs_proto::name_digest(name)).is_ok())
    }

    /// Forgets entry `name`, removed here: a name whose digest was granted stays known as
    /// removed.
    pub fn drop_entry(&mut self, name: &str) {
        match self.digested(name) {
            true => _ = self.entries.insert(name.to_string(), Local::Removed),
            false => _ = self.entries.remove(name),
        }
    }

    /// Takes in the server's stored entries of `names` (`DelegEntries`), for those not
    /// known here yet: answered here from now on.
    pub fn learn(&mut self, names: &[String], found: Vec<Option<plusfs_proto::Inode>>) {
        for (name, inode) in names.iter().zip(found) {
            if self.entries.contains_key(name) || !self.places(name) {
                continue;
            }
            let l = match inode {
                Some(i) => {
                    let (link, acl) = (i.link_home.is_some(), i.access_acl());
                    Local::Known { attr: Attr::of_inode(&i), target: i.target, content: None, dirty: false, link, acl }
                }
                None => Local::Removed,
            };
            self.entries.insert(name.clone(), l);
        }
    }

    /// Whether a flush returning the delegation awaits its answer: nothing more may be
    /// done under it (what was queued after it would be dropped when it ends).
    pub fn releasing(&self) -> bool {
        matches!(self.unacked, Some(Request::DelegFlush { release: true, .. }))
    }

    /// Whether more entries are kept than [`MAX_KEPT`].
    pub fn over_kept(&self) -> bool {
        self.digests.is_some() && self.entries.len() > MAX_KEPT
    }

    /// After a write-back (nothing queued): forgets the entries the server has as they
    /// are known here (clean, not changed through the server) and that their digests
    /// still find there. Whether too many are
    /// still kept (the delegation should be returned).
    pub fn trim(&mut self) -> bool {
        if !self.over_kept() || !self.pending.is_empty() || self.unacked.is_some() {
            return self.over_kept();
        }
        let Some(d) = self.digests.take() else { return false };
        let granted = |n: &str| d.binary_search(&plusfs_proto::name_digest(n)).is_ok();
        // Only entries known as the server has them: an `Unknown` one may be changing on
        // the server by a request still in flight (asked again, it could come back stale).
        self.entries.retain(|n, l| !(matches!(l, Local::Known { dirty: false, .. }) && granted(n)));
        self.digests = Some(d);
        self.over_kept()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deleg::Target;
    use plusfs_proto::{DelegGrant, FileKind, Inode};

    /// A write delegation of a shard (slot 0 of 1) granted with the digests of `names`.
    fn digested(names: &[String]) -> Held {
        let mut digests: Vec<u64> = names.iter().map(|n| plusfs_proto::name_digest(n)).collect();
        digests.sort_unstable();
        let g = DelegGrant {
            id: 1,
            dir: DirObject::new(10, 0o755, 0, 0),
            entries: Vec::new(),
            digests: Some(digests),
            first_ino: 1000,
            ino_count: 10,
        };
        let t = Target { server: 0, shard: Some(7), slot: Some((0, 1)) };
        crate::deleg::held_of(g, t, "/d", Instant::now(), false)
    }

    fn file(ino: u64) -> Option<Inode> {
        Some(Inode::new(ino, FileKind::File, 0o644, 0, 0))
    }

    #[test]
    fn entries_learnt_then_removed_stay_removed_while_their_digest_says_otherwise() {
        let names: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
        let mut h = digested(&names);
        assert!(h.asks("f0") && h.asks("f1"));
        assert!(matches!(h.find("other"), Found::Absent));
        h.learn(&names[..2], vec![file(1), None]);
        assert!(matches!(h.find("f0"), Found::Here(Local::Known { .. })));
        assert!(matches!(h.find("f1"), Found::Absent), "the server said it is not there");
        assert!(h.asks("f2"));
        let root = Cred::new(0, 0, Vec::new());
        assert_eq!(h.unlink("f0", &root), Some(Ok(())));
        assert!(matches!(h.find("f0"), Found::Absent), "removed here: no longer asked of the server");
        assert_eq!(h.pending.len(), 1);
        // Learning again does not bring back what was removed here.
        h.learn(&names[..1], vec![file(1)]);
        assert!(matches!(h.find("f0"), Found::Absent));
    }

    #[test]
    fn a_delegation_keeping_too_many_entries_forgets_those_the_server_has() {
        let names: Vec<String> = (0..MAX_KEPT + 10).map(|i| format!("n{i}")).collect();
        let mut h = digested(&names);
        let found = (0..names.len() as u64).map(file).collect();
        h.learn(&names, found);
        assert!(h.over_kept());
        let root = Cred::new(0, 0, Vec::new());
        assert_eq!(h.unlink("n0", &root), Some(Ok(())));
        // Nothing is forgotten while work is queued.
        assert!(h.trim());
        assert_eq!(h.entries.len(), names.len());
        h.pending.clear();
        assert!(!h.trim(), "learnt entries forgotten, the removal kept");
        assert_eq!(h.entries.len(), 1);
        assert!(matches!(h.find("n0"), Found::Absent));
        assert!(h.asks("n1"));
    }
}
