//! Whether the kernel may keep a file's cached pages when it is opened again.
//!
//! Close-to-open consistency asks that an `open` sees every change closed before it. The
//! kernel drops a FUSE file's cached pages at each open unless the open's reply says
//! `FOPEN_KEEP_CACHE`; the mount says so when the file's size, modification and change
//! times the servers return at this open are those they returned at the previous open
//! here. Any write — through this mount or another client — changes the times, so pages
//! cached from an older version never survive.

use plusfs_proto::{Attr, Timespec};
use std::collections::HashMap;
use std::sync::Mutex;

/// Files remembered at most; beyond, the oldest knowledge is dropped all at once (their
/// next open reads from the servers again).
const MAX_FILES: usize = 1 << 16;

/// What the servers said of a file's contents at an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime: Timespec,
    ctime: Timespec,
}

/// The stamp of each file at its last open through this mount.
#[derive(Default)]
pub(crate) struct PageStamps {
    stamps: Mutex<HashMap<u64, Stamp>>,
}

impl PageStamps {
    /// At an open that found `a` on the servers: whether the pages the kernel cached
    /// since the previous open here still hold the file's contents. Remembers `a` for the
    /// next open.
    pub fn keep(&self, a: &Attr) -> bool {
        let stamp = Stamp { size: a.size, mtime: a.mtime, ctime: a.ctime };
        let mut stamps = self.stamps.lock().expect("page stamps");
        if stamps.len() >= MAX_FILES && !stamps.contains_key(&a.ino) {
            stamps.clear();
        }
        stamps.insert(a.ino, stamp) == Some(stamp)
    }

    /// Forgets `ino` (the kernel forgot the inode, or the mount changed the file in a way
    /// its times may not show).
    pub fn forget(&self, ino: u64) {
        self.stamps.lock().expect("page stamps").remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plusfs_proto::FileKind;

    fn attr(size: u64, mtime: i64) -> Attr {
        let t = Timespec { sec: mtime, nsec: 0 };
        Attr {
            ino: 9,
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
            incarnation: 0,
            rdev: 0,
        }
    }

    #[test]
    fn pages_are_kept_only_while_the_file_is_unchanged() {
        let p = PageStamps::default();
        assert!(!p.keep(&attr(10, 1)), "nothing cached at the first open");
        assert!(p.keep(&attr(10, 1)), "unchanged: keep");
        assert!(!p.keep(&attr(10, 2)), "rewritten with the same size: drop");
        assert!(!p.keep(&attr(11, 2)), "grown: drop");
        assert!(p.keep(&attr(11, 2)));
        p.forget(9);
        assert!(!p.keep(&attr(11, 2)), "forgotten: drop");
    }
}
