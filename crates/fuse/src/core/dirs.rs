//! Directory handles: listings snapshotted at `opendir`, handed out by `readdir` and
//! `readdirplus`.

use super::listings::Listing;
use super::open_files::ORPHANS;
use super::{DirItem, DirPlusItem, Errno, MountCore};
use plusfs_proto::path::join;
use plusfs_proto::{Attr, DirEntry, FileKind, Semantics};

/// Most entries `readdirplus` stats in one batch.
const PLUS_PAGE: usize = 1024;

impl MountCore {
    /// `opendir`: snapshots the listing of `ino` and returns its handle. The directory
    /// keeping open-unlinked files is not listed in `/`.
    pub fn opendir(&self, ino: u64) -> Result<u64, Errno> {
        let dir = self.path(ino)?;
        let mut entries = self.run(self.client().readdir(&dir))?;
        if dir == "/" {
            entries.retain(|e| e.name != ORPHANS[1..]);
        }
        let fh = self.next_id();
        self.listings.insert(fh, Listing { dir, entries });
        Ok(fh)
    }

    /// `releasedir`: forgets the listing of `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.listings.remove(fh);
    }

    /// The snapshot of handle `fh` (EBADF for an unknown handle).
    fn listing(&self, fh: u64) -> Result<Listing, Errno> {
        self.listings.get(fh).ok_or(Errno::EBADF)
    }

    /// `readdir`: hands the entries of handle `fh` of directory `ino`, from `offset` on
    /// (`.` and `..` first), to `add` until it returns `true` (full).
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(DirItem<'_>) -> bool,
    ) -> Result<(), Errno> {
        let Listing { dir, entries } = self.listing(fh)?;
        let parent = self.inodes().parent_ino(&dir);
        let dots = [(ino, FileKind::Dir, "."), (parent, FileKind::Dir, "..")];
        let all = dots.into_iter().chain(entries.iter().map(|e| (e.ino, e.kind, e.name.as_str())));
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if add(DirItem { ino, offset: i as u64 + 1, kind, name }) {
                break;
            }
        }
        Ok(())
    }

    /// `readdirplus`: as [`MountCore::readdir`], with attributes (one batch stat per
    /// storing server for a page of entries). Each entry handed over counts as a lookup;
    /// the one `add` refuses does not.
    pub fn readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(DirPlusItem<'_>) -> bool,
    ) -> Result<(), Errno> {
        let Listing { dir, entries } = self.listing(fh)?;
        let start = (offset as usize).saturating_sub(2);
        let page: Vec<&DirEntry> = entries.iter().skip(start).take(PLUS_PAGE).collect();
        let names: Vec<String> = page.iter().map(|e| e.name.clone()).collect();
        let attrs = self.run(self.client().statv(&dir, &names, Semantics::PerformAll))?;
        let dir_attr = self.run(self.client().lstat(&dir))?;
        if !self.add_dots(ino, &dir, dir_attr, offset, &mut add) {
            return Ok(());
        }
        for (k, (e, a)) in page.iter().zip(attrs).enumerate() {
            let Ok(a) = a else { continue }; // removed since opendir
                                             // The kernel counts a lookup for each entry it is given.
            self.remember(&join(&dir, &e.name), &a);
            let item = DirPlusItem { ino: a.ino, offset: (start + k) as u64 + 3, name: &e.name, attr: &a };
            if add(item) {
                self.forget(a.ino, 1);
                break;
            }
        }
        Ok(())
    }

    /// Hands `.` and `..` (those at or after `offset`) to `add`; false when it is full.
    fn add_dots(
        &self,
        ino: u64,
        dir: &str,
        dir_attr: Attr,
        offset: u64,
        add: &mut impl FnMut(DirPlusItem<'_>) -> bool,
    ) -> bool {
        if offset == 0 && add(DirPlusItem { ino, offset: 1, name: ".", attr: &dir_attr }) {
            return false;
        }
        if offset <= 1 {
            let mut parent = dir_attr;
            parent.ino = self.inodes().parent_ino(dir);
            if add(DirPlusItem { ino: parent.ino, offset: 2, name: "..", attr: &parent }) {
                return false;
            }
        }
        true
    }
}
