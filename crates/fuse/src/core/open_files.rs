//! Files open through this mount, and the ones unlinked while open ("orphans").
//!
//! POSIX keeps an unlinked file alive while a descriptor is open on it. The servers do
//! not know about descriptors, so the mount keeps such a file itself, as NFS clients do:
//! an unlink (or a rename over the file) of a file open here moves (or hard-links) it to
//! [`ORPHANS`] first, and the last `release` removes that name. Its link count is shown
//! one lower, so `fstat` after `unlink` says 0. Other mounts' open files are not seen.
//!
//! Each open handle also keeps the caller that opened it: reads, writes, flushes and
//! write-backs through the handle go to the servers as that caller (as NFS clients keep
//! the opener's credential), whoever the kernel names in the later request.

use super::types::Caller;
use std::collections::HashMap;

/// Directory holding the files unlinked while open through a mount.
pub use plusfs_proto::path::ORPHANS;

/// Open counts and orphan names, by inode number.
#[derive(Default)]
pub(crate) struct OpenFiles {
    opens: HashMap<u64, u32>,
    orphans: HashMap<u64, String>,
    /// The caller each open handle was opened by.
    handles: HashMap<u64, Caller>,
}

impl OpenFiles {
    /// Handle `fh` of `ino` was opened by `caller`.
    pub fn opened(&mut self, ino: u64, fh: u64, caller: &Caller) {
        *self.opens.entry(ino).or_default() += 1;
        self.handles.insert(fh, caller.clone());
    }

    /// The caller that opened handle `fh`, if it is open.
    pub fn opener(&self, fh: u64) -> Option<Caller> {
        self.handles.get(&fh).cloned()
    }

    /// Handle `fh` of `ino` closed; returns its orphan name if that was the last one.
    pub fn released(&mut self, ino: u64, fh: u64) -> Option<String> {
        self.handles.remove(&fh);
        let n = self.opens.get_mut(&ino)?;
        *n = n.saturating_sub(1);
        if *n > 0 {
            return None;
        }
        self.opens.remove(&ino);
        self.orphans.remove(&ino)
    }

    pub fn is_open(&self, ino: u64) -> bool {
        self.opens.get(&ino).is_some_and(|n| *n > 0)
    }

    pub fn orphaned(&mut self, ino: u64, name: String) {
        self.orphans.insert(ino, name);
    }

    /// `ino` is no orphan after all (the rename over it failed); returns its kept name.
    pub fn unorphaned(&mut self, ino: u64) -> Option<String> {
        self.orphans.remove(&ino)
    }

    /// Whether `ino` lives on only under an orphan name.
    pub fn is_orphan(&self, ino: u64) -> bool {
        self.orphans.contains_key(&ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_release_frees_an_orphan() {
        let mut o = OpenFiles::default();
        let (alice, bob) = (Caller { uid: 1000, gid: 1000, groups: vec![] }, Caller::ROOT);
        o.opened(7, 1, &alice);
        o.opened(7, 2, &bob);
        o.orphaned(7, "/.plusfs-orphans/7.1".into());
        assert!(o.is_open(7) && o.is_orphan(7));
        assert_eq!((o.opener(1), o.opener(2)), (Some(alice), Some(bob)), "each handle keeps its opener");
        assert_eq!(o.released(7, 1), None);
        assert_eq!(o.opener(1), None);
        assert_eq!(o.released(7, 2).as_deref(), Some("/.plusfs-orphans/7.1"));
        assert!(!o.is_open(7) && !o.is_orphan(7));
        assert_eq!(o.released(7, 3), None, "an unknown handle is ignored");
    }
}
