//! Directory handles: listings snapshotted at `opendir`, handed out by `readdir` and
//! `readdirplus`.

use super::listings::{Listing, PlusPage};
use super::open_files::ORPHANS;
use super::stats::STATS_FILE;
use super::types::PlusItem;
use super::{Caller, DirItem, DirPlusItem, Errno, MountCore};
use plusfs_proto::path::join;
use plusfs_proto::{FileKind, Semantics};
use std::sync::Arc;

/// Most entries `readdirplus` stats in one batch (kept for the following calls).
const PLUS_PAGE: usize = 1024;

impl MountCore {
    /// `opendir`: snapshots the listing of `ino` and returns its handle. The directory
    /// keeping open-unlinked files and the control file's name are not listed in `/`.
    pub async fn opendir(&self, caller: &Caller, ino: u64) -> Result<u64, Errno> {
        let dir = self.path(ino)?;
        let mut entries = self.run(self.as_caller(caller).readdir(&dir)).await?;
        if dir == "/" {
            entries.retain(|e| e.name != ORPHANS[1..] && e.name != STATS_FILE);
        }
        let fh = self.next_id();
        self.listings.insert(fh, Listing { dir, entries: Arc::new(entries), caller: caller.clone() });
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
        let Listing { dir, entries, .. } = self.listing(fh)?;
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

    /// `readdirplus`: as [`MountCore::readdir`], with attributes. Each entry `add` takes
    /// counts as a lookup; the one it refuses (full) and those after it do not.
    pub async fn readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(DirPlusItem<'_>) -> bool,
    ) -> Result<(), Errno> {
        for item in self.readdirplus_items(ino, fh, offset).await? {
            if add(item.as_dir_plus()) {
                break;
            }
            self.handed_out(&item);
        }
        Ok(())
    }

    /// The entries of handle `fh` from `offset` on with their attributes: up to the end of
    /// the page fetched for them (one batch stat per storing server for [`PLUS_PAGE`]
    /// entries, kept for the calls that follow). Call [`MountCore::handed_out`] for each
    /// item given to the kernel.
    pub async fn readdirplus_items(&self, ino: u64, fh: u64, offset: u64) -> Result<Vec<PlusItem>, Errno> {
        let listing = self.listing(fh)?;
        let start = (offset as usize).saturating_sub(2);
        let page = match self.listings.page(fh, start) {
            Some(p) => p,
            None => self.fetch_page(fh, &listing, start).await?,
        };
        let mut out = Vec::new();
        let dot = |name: &str, ino, offset| PlusItem {
            ino,
            offset,
            name: name.into(),
            attr: page.dir_attr.clone(),
            path: None,
        };
        if offset == 0 {
            out.push(dot(".", ino, 1));
        }
        if offset <= 1 {
            let mut parent = dot("..", self.inodes().parent_ino(&listing.dir), 2);
            parent.attr.ino = parent.ino;
            out.push(parent);
        }
        for k in start..page.start + page.attrs.len() {
            let Some(attr) = page.attrs[k - page.start].clone() else { continue }; // removed since opendir
            let name = listing.entries[k].name.clone();
            let path = Some(join(&listing.dir, &name));
            out.push(PlusItem { ino: attr.ino, offset: k as u64 + 3, name, attr, path });
        }
        Ok(out)
    }

    /// Fetches the attributes of up to [`PLUS_PAGE`] entries of `listing` from `start`,
    /// and the directory's own, at once.
    async fn fetch_page(&self, fh: u64, listing: &Listing, start: usize) -> Result<PlusPage, Errno> {
        let names: Vec<String> = listing.entries.iter().skip(start).take(PLUS_PAGE).map(|e| e.name.clone()).collect();
        let client = self.as_caller(&listing.caller);
        let (attrs, dir_attr) =
            tokio::join!(client.statv(&listing.dir, &names, Semantics::PerformAll), client.lstat_dir(&listing.dir));
        let attrs = self.run(async { attrs }).await?.into_iter().map(Result::ok).collect();
        let page = PlusPage { start, attrs: Arc::new(attrs), dir_attr: self.run(async { dir_attr }).await? };
        self.listings.set_page(fh, page.clone());
        Ok(page)
    }

    /// The kernel was given `item` (one more lookup of its inode).
    pub fn handed_out(&self, item: &PlusItem) {
        if let Some(path) = &item.path {
            self.remember(path, &item.attr);
        }
    }
}
