//! The free-space floor of a server's disk: requests that would add metadata are refused
//! with `ENOSPC` while the file system holding the server's store has less free space than
//! the floor plus the room the store's own upkeep may need next (its next memtable flush
//! and its next compaction), before the store itself runs out (a store whose flush fails
//! stops until its space returns; one whose compaction fails stops reclaiming until as
//! much space as that compaction wanted is free). Deletes, renames, reads and what admins
//! and the cluster's own servers send still run in the floor, so users can free space and
//! operations already under way finish. Admins and servers may fill the floor up to the
//! store's upkeep room, which nobody's growth may take. File data appends have their own,
//! larger reserve (`[data] reserve_bytes`); the floor is half of it.

use parking_lot::Mutex;
use plusfs_proto::{BatchOp, DelegOp, Errno, Request, SubOp, WireError, XattrOp};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a measured free-space figure is trusted.
const FRESH: Duration = Duration::from_millis(50);
/// How often the keeper looks whether deleted space is to be reclaimed.
const KEEP_EVERY: Duration = Duration::from_millis(250);
/// Room past the data reserve under which the disk already counts as low (a write of a
/// few MiB would be refused there).
const LOW_MARGIN: u64 = 16 << 20;
/// A pause in deletes after which their space is reclaimed.
const DELETES_PAUSE: Duration = Duration::from_millis(400);
/// The longest deletes go on before their space is reclaimed.
const RECLAIM_LATEST: Duration = Duration::from_secs(5);
/// How often a disk that stays at its floor is reclaimed with no delete seen (a replica
/// group's follower, whose deletes arrive through the group).
const RECLAIM_IDLE: Duration = Duration::from_secs(30);
/// The least floor, whatever the data reserve.
const MIN_FLOOR: u64 = 8 << 20;

/// The free-space floor of one server's disk.
pub struct Space {
    dir: PathBuf,
    floor: u64,
    /// The data reserve: file data stops this far above the floor, so metadata still has
    /// room once file data fills the disk.
    data_reserve: u64,
    /// Bytes of disk the store's upkeep (next flush, next compaction) may need: the floor
    /// grows by them.
    upkeep_room: Box<dyn Fn() -> u64 + Send + Sync>,
    /// Free bytes at the last measure, and when it was taken.
    free: AtomicU64,
    /// The store's upkeep room at the last measure (taken with the free space: a property
    /// read of the store is not for every request).
    room: AtomicU64,
    measured: Mutex<Option<Instant>>,
    /// Set when something was deleted while the disk was at its floor: its space is to be
    /// reclaimed now.
    reclaim_wanted: AtomicBool,
}

impl Space {
    /// The floor of the file system holding `dir`: half of `data_reserve` (at least 8 MiB)
    /// plus what the store's upkeep may need next (`upkeep_room`).
    pub fn new(dir: PathBuf, data_reserve: u64, upkeep_room: Box<dyn Fn() -> u64 + Send + Sync>) -> Space {
        Space {
            dir,
            upkeep_room,
            floor: (data_reserve / 2).max(MIN_FLOOR),
            data_reserve,
            free: AtomicU64::new(u64::MAX),
            room: AtomicU64::new(0),
            measured: Mutex::new(None),
            reclaim_wanted: AtomicBool::new(false),
        }
    }

    /// Refuses `req` with ENOSPC when it would add metadata and the disk is down to its
    /// floor: the users' floor, or for a `privileged` sender (an admin, a server) only the
    /// room the store's upkeep needs (a store that runs out is not to be risked: it
    /// stops taking writes, and some builds of RocksDB abort on a later sync).
    pub fn admit(&self, req: &Request, privileged: bool) -> Result<(), WireError> {
        if !grows(req) {
            if !matches!(req.inner(), Request::Stat { .. } | Request::Read { .. } | Request::Readdir { .. })
                && self.low()
            {
                self.reclaim_wanted.store(true, Ordering::Relaxed);
            }
            return Ok(());
        }
        let free = self.free_bytes();
        let floor = match privileged {
            true => MIN_FLOOR.saturating_add(self.room.load(Ordering::Relaxed)),
            false => self.floor(),
        };
        // File data stops a data reserve above the floor (and must fit itself).
        let data = data_bytes(req);
        let floor = match data {
            0 => floor,
            n => floor.saturating_add(self.data_reserve).saturating_add(n),
        };
        if free >= floor {
            return Ok(());
        }
        Err(WireError::new(
            Errno::ENOSPC,
            format!(
                "{}: no space left on the server's disk ({} MiB free, {} MiB kept for deletes and the store's upkeep)",
                req.inner().name(),
                free >> 20,
                floor >> 20
            ),
        ))
    }

    /// The free space below which growth is refused now.
    fn floor(&self) -> u64 {
        self.free_bytes();
        self.floor.saturating_add(self.room.load(Ordering::Relaxed))
    }

    /// True while the disk is down to where file data is refused (a data reserve above
    /// the floor).
    pub fn low(&self) -> bool {
        self.free_bytes() < self.floor().saturating_add(self.data_reserve).saturating_add(LOW_MARGIN)
    }

    /// Whether the disk has room for a replica member's log, store and data store to take
    /// the group's entries: more free space than the store's upkeep needs and 8 MiB,
    /// plus the data reserve (entries carry file data), plus `margin` (the gap a member
    /// that lost its room must see before it takes entries again).
    pub fn member_room(&self, margin: u64) -> bool {
        let free = self.free_bytes();
        let need = MIN_FLOOR.saturating_add(self.room.load(Ordering::Relaxed)).saturating_add(self.data_reserve);
        free >= need.saturating_add(margin)
    }

    /// Free bytes of the disk now (for a reclaim: what it may use).
    pub fn free_now(&self) -> u64 {
        *self.measured.lock() = None;
        self.free_bytes()
    }

    /// Runs `reclaim` (which gives back the space of deleted objects) whenever the disk is
    /// at its floor and something was deleted since (once the deletes pause), or every
    /// [`RECLAIM_IDLE`] while it stays there; until `alive` returns false.
    pub fn keep<F, Fut>(self: Arc<Self>, alive: impl Fn() -> bool + Send + 'static, reclaim: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        tokio::spawn(async move {
            let mut last = Instant::now();
            // Deletes seen since the last reclaim: when the first and the latest came. A
            // reclaim waits until deletes pause (a mass delete is reclaimed once, after
            // it), or until they have gone on for RECLAIM_LATEST.
            let mut deletes: Option<(Instant, Instant)> = None;
            while alive() {
                tokio::time::sleep(KEEP_EVERY).await;
                if self.reclaim_wanted.swap(false, Ordering::Relaxed) {
                    let now = Instant::now();
                    deletes = Some((deletes.map_or(now, |d| d.0), now));
                }
                let settled = deletes.is_some_and(|(first, latest)| {
                    latest.elapsed() >= DELETES_PAUSE || first.elapsed() >= RECLAIM_LATEST
                });
                if self.low() && (settled || last.elapsed() > RECLAIM_IDLE) {
                    let (free, floor) = (self.free_bytes(), self.floor());
                    tracing::info!(dir = %self.dir.display(), free, floor, "disk at its floor: reclaiming deleted space");
                    reclaim().await;
                    (last, deletes) = (Instant::now(), None);
                    *self.measured.lock() = None;
                }
            }
        });
    }

    /// Free bytes of the disk, measured (with the store's upkeep room) at most every
    /// [`FRESH`].
    fn free_bytes(&self) -> u64 {
        let mut measured = self.measured.lock();
        if measured.is_none_or(|t| t.elapsed() > FRESH) {
            self.room.store((self.upkeep_room)(), Ordering::Relaxed);
            match plusfs_data::free_bytes(&self.dir) {
                Ok(free) => self.free.store(free, Ordering::Relaxed),
                Err(e) => tracing::warn!(dir = %self.dir.display(), cause = %e, "cannot measure free space"),
            }
            *measured = Some(Instant::now());
        }
        self.free.load(Ordering::Relaxed)
    }
}

/// Bytes of file data `req` carries to be stored here.
fn data_bytes(req: &Request) -> u64 {
    match req.inner() {
        Request::Write { data, .. } | Request::DataPut { data, .. } => data.len() as u64,
        Request::BatchWrite { files, .. } => files.iter().map(|f| f.data.len() as u64).sum(),
        _ => 0,
    }
}

/// True when `req` adds entries, inodes, attributes or data to a server's store.
pub fn grows(req: &Request) -> bool {
    match req.inner() {
        Request::Mkdir { .. }
        | Request::Create { .. }
        | Request::Symlink { .. }
        | Request::Link { .. }
        | Request::Write { .. }
        | Request::BatchWrite { .. }
        | Request::DataPut { .. }
        | Request::CommitWrite { .. } => true,
        Request::Batch { op, .. } => matches!(op, BatchOp::Create { .. } | BatchOp::Mkdir),
        Request::Xattr { op, .. } | Request::DirXattr { op, .. } => matches!(op, XattrOp::Set { .. }),
        Request::CxExec { ops, .. } | Request::SubExec { ops, .. } => {
            ops.iter().any(|o| matches!(o, SubOp::InsertEntry { .. } | SubOp::CreateDir { .. }))
        }
        Request::DelegFlush { ops, .. } => {
            ops.iter().any(|o| matches!(o, DelegOp::Create { .. } | DelegOp::Contents { .. }))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_and_reads_do_not_grow_creates_do() {
        let unlink = Request::Unlink { path: "/a".into() };
        let stat = Request::Stat { path: "/a".into() };
        assert!(!grows(&unlink) && !grows(&stat));
        let set = Request::Xattr {
            path: "/a".into(),
            op: XattrOp::Set { name: "user.a".into(), value: vec![1], create: false, replace: false },
        };
        assert!(grows(&set));
        let remove = Request::Xattr { path: "/a".into(), op: XattrOp::Remove { name: "user.a".into() } };
        assert!(!grows(&remove));
    }

    #[test]
    fn a_disk_below_its_floor_refuses_growth_only() {
        let dir = tempfile::tempdir().unwrap();
        // A floor no disk has free: every growing request is refused.
        let s = Space::new(dir.path().to_path_buf(), u64::MAX, Box::new(|| 0));
        let mkdir =
            Request::Mkdir { path: "/d".into(), mode: 0o755, uid: 0, gid: 0, threshold: Default::default(), width: 0 };
        let e = s.admit(&mkdir, false).unwrap_err();
        assert_eq!(e.errno, Errno::ENOSPC);
        assert!(e.message.contains("mkdir"), "{}", e.message);
        assert!(s.admit(&Request::Unlink { path: "/a".into() }, false).is_ok());
        let roomy = Space::new(dir.path().to_path_buf(), 0, Box::new(|| 0));
        // 8 MiB floor: a test machine's temporary directory has that much.
        assert!(roomy.admit(&mkdir, false).is_ok());
    }
}
