//! Directory handles: listings read a page at a time (in name order, so a page follows
//! the name the one before ended with, whatever the servers do meanwhile), handed out by
//! `readdir` and `readdirplus`. A handle holds one page, not the directory.

use super::listings::{Listing, PlusPage};
use super::open_files::ORPHANS;
use super::stats::STATS_FILE;
use super::types::{PlusItem, ReaddirItem};
use super::{Caller, DirItem, DirPlusItem, Errno, MountCore};
use plusfs_proto::path::join;
use plusfs_proto::{Attr, DirEntry, FileKind, Semantics};
use std::sync::Arc;

/// Most entries `readdirplus` stats in one batch (kept for the following calls).
const PLUS_PAGE: usize = 1024;
/// Entries a handle reads from the servers at once.
const WINDOW: u32 = 4096;
/// Most entries one `readdir` call hands out (the kernel's page-sized buffer takes about
/// a hundred short names).
const MAX_ITEMS: usize = 256;
/// Most entries one `readdirplus` call hands out (a buffer takes a few dozen with their
/// attributes): building more only to have them refused costs per call, not per entry.
const MAX_PLUS_ITEMS: usize = 64;

impl MountCore {
    /// `opendir`: reads the first page of the listing of `ino` and returns its handle.
    pub async fn opendir(&self, caller: &Caller, ino: u64) -> Result<u64, Errno> {
        let dir = self.path(ino)?;
        let first = Listing { dir, caller: caller.clone(), base: 0, entries: Arc::default(), next: None };
        let listing = self.next_window(&first, None).await?;
        let fh = self.next_id();
        self.listings.insert(fh, listing);
        Ok(fh)
    }

    /// The page of `l`'s directory after name `after` (from the start for `None`), as the
    /// window following `l`'s. The directory keeping open-unlinked files and the control
    /// file's name are not listed in `/`.
    async fn next_window(&self, l: &Listing, after: Option<String>) -> Result<Listing, Errno> {
        let client = self.as_caller(&l.caller);
        let page = self.run(client.readdir_page(&l.dir, after.clone(), WINDOW)).await?;
        let next = if page.more { page.entries.last().map(|e| e.name.clone()) } else { None };
        let mut entries = page.entries;
        if l.dir == "/" {
            entries.retain(|e| e.name != ORPHANS[1..] && e.name != STATS_FILE);
        }
        self.listings.listed(&l.dir, &entries, after.is_none());
        let base = if after.is_some() { l.end() } else { 0 };
        Ok(Listing { dir: l.dir.clone(), caller: l.caller.clone(), base, entries: Arc::new(entries), next })
    }

    /// `releasedir`: forgets the listing of `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.listings.remove(fh);
    }

    /// The listing of handle `fh` (EBADF for an unknown handle).
    fn listing(&self, fh: u64) -> Result<Listing, Errno> {
        self.listings.get(fh).ok_or(Errno::EBADF)
    }

    /// The listing of `fh` with a window holding entry `index`, or ending at it when the
    /// listing ends there: pages are read on until it is reached. A rewind (an index
    /// before the window) reads the directory again from its start, as `rewinddir` asks.
    async fn window_at(&self, fh: u64, index: usize) -> Result<Listing, Errno> {
        let mut l = self.listing(fh)?;
        if index < l.base {
            l = self.next_window(&l, None).await?;
            self.listings.set_window(fh, l.clone());
        }
        while index >= l.end() {
            let Some(after) = l.next.clone() else { break };
            l = self.next_window(&l, Some(after)).await?;
            self.listings.set_window(fh, l.clone());
        }
        Ok(l)
    }

    /// `readdir`: the entries of handle `fh` of directory `ino` from `offset` on (`.` and
    /// `..` first), at most [`MAX_ITEMS`] and not past the handle's window.
    pub async fn readdir_items(&self, ino: u64, fh: u64, offset: u64) -> Result<Vec<ReaddirItem>, Errno> {
        let start = (offset as usize).saturating_sub(2);
        let l = self.window_at(fh, start).await?;
        let parent = self.inodes().parent_ino(&l.dir);
        let mut out = Vec::new();
        let dots = [(ino, "."), (parent, "..")];
        for (i, (ino, name)) in dots.into_iter().enumerate().skip(offset as usize) {
            out.push(ReaddirItem { ino, offset: i as u64 + 1, kind: FileKind::Dir, name: name.to_string() });
        }
        let window = &l.entries[start.saturating_sub(l.base).min(l.entries.len())..];
        for (k, e) in window.iter().enumerate().take(MAX_ITEMS) {
            let DirEntry { ino, kind, name } = e;
            let index = start.max(l.base) + k;
            out.push(ReaddirItem { ino: *ino, offset: index as u64 + 3, kind: *kind, name: name.clone() });
        }
        Ok(out)
    }

    /// `readdir` handing the items to `add` until it returns `true` (full).
    pub async fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(DirItem<'_>) -> bool,
    ) -> Result<(), Errno> {
        for item in self.readdir_items(ino, fh, offset).await? {
            if add(item.as_dir_item()) {
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
        let mut start = (offset as usize).saturating_sub(2);
        let mut out = Vec::new();
        // Entries removed since they were listed are skipped; an answer without entries
        // would end the listing for the kernel, so pages are read on until one is left.
        loop {
            let listing = self.window_at(fh, start).await?;
            let page = match self.listings.page(fh, start) {
                Some(p) => p,
                None => self.fetch_page(fh, &listing, start).await?,
            };
            if start == (offset as usize).saturating_sub(2) {
                self.dots(ino, offset, &listing.dir, &page.dir_attr, &mut out);
            }
            let end = (page.start + page.attrs.len()).min(listing.end());
            for k in start..end {
                if out.len() >= MAX_PLUS_ITEMS {
                    break;
                }
                let Some(attr) = page.attrs[k - page.start].clone() else { continue }; // removed since listed
                let name = listing.entries[k - listing.base].name.clone();
                let path = Some(join(&listing.dir, &name));
                out.push(PlusItem { ino: attr.ino, offset: k as u64 + 3, name, attr, path });
            }
            let more = end > start && (end < listing.end() || listing.next.is_some());
            if out.iter().any(|i| i.path.is_some()) || !more {
                return Ok(out);
            }
            start = end;
        }
    }

    /// `.` and `..` for a `readdirplus` from `offset` (those not yet handed out).
    fn dots(&self, ino: u64, offset: u64, dir: &str, dir_attr: &Attr, out: &mut Vec<PlusItem>) {
        let dot =
            |name: &str, ino, offset| PlusItem { ino, offset, name: name.into(), attr: dir_attr.clone(), path: None };
        if offset == 0 {
            out.push(dot(".", ino, 1));
        }
        if offset <= 1 {
            let mut parent = dot("..", self.inodes().parent_ino(dir), 2);
            parent.attr.ino = parent.ino;
            out.push(parent);
        }
    }

    /// The attributes of entry `name` of `dir` when a handle `caller` opened lists it: from
    /// the batch fetched for its window, or fetched now with the [`PLUS_PAGE`] entries that
    /// follow it (one batch stat per storing server), so a program that looks each entry of
    /// a listing up (`ls -l` after the kernel's plain `readdir`) costs one request per page,
    /// not one per entry. `None`: not listed there (ask the servers).
    pub(super) async fn listed_attr(&self, caller: &Caller, dir: &str, name: &str) -> Option<Attr> {
        if let Some(a) = self.listings.find_ahead(dir, caller, name, self.attrs.ttl()) {
            return Some(self.attrs.fresh(a.ino).unwrap_or(a));
        }
        let listed = self.listings.find(dir, caller, name, self.attrs.ttl())?;
        let a = match listed.attr {
            Some(known) => known?,
            None => {
                let page = self.fetch_page(listed.fh, &listed.listing, listed.index).await.ok()?;
                page.attrs.first().cloned().flatten()?
            }
        };
        // What this mount learnt since (a `setattr` of it) is newer.
        Some(self.attrs.fresh(a.ino).unwrap_or(a))
    }

    /// The attributes of entry `name` of `dir` for a lookup by `caller` that follows the
    /// ones before it through a directory listed lately (in name or inode order, see
    /// `listings.rs`): fetched with the [`PLUS_PAGE`] entries that come next in that order
    /// in one batch stat (per storing server), kept for the lookups that follow. `None`:
    /// ask the servers.
    pub(super) async fn looked_ahead(&self, caller: &Caller, dir: &str, name: &str) -> Option<Attr> {
        let names = self.listings.ahead_of(dir, name, PLUS_PAGE)?;
        let since = self.listings.changes(dir);
        let found = self.as_caller(caller).statv(dir, &names, Semantics::PerformAll).await.ok()?;
        let attrs: Vec<Option<Attr>> = found.into_iter().map(Result::ok).collect();
        let mine = attrs[names.binary_search_by(|n| n.as_str().cmp(name)).ok()?].clone()?;
        // A change through this mount during the fetch: the batch may be stale.
        self.listings.set_ahead(dir, caller, names, attrs, since).then_some(())?;
        Some(self.attrs.fresh(mine.ino).unwrap_or(mine))
    }

    /// Fetches the attributes of up to [`PLUS_PAGE`] entries of `listing`'s window from
    /// `start`, and the directory's own, at once.
    async fn fetch_page(&self, fh: u64, listing: &Listing, start: usize) -> Result<PlusPage, Errno> {
        let from = start.saturating_sub(listing.base).min(listing.entries.len());
        let names: Vec<String> = listing.entries[from..].iter().take(PLUS_PAGE).map(|e| e.name.clone()).collect();
        let client = self.as_caller(&listing.caller);
        let since = self.listings.changes(&listing.dir);
        let (attrs, dir_attr) =
            tokio::join!(client.statv(&listing.dir, &names, Semantics::PerformAll), client.lstat_dir(&listing.dir));
        let attrs = self.run(async { attrs }).await?.into_iter().map(Result::ok).collect();
        let dir_attr = self.run(async { dir_attr }).await?;
        let page = PlusPage { start, attrs: Arc::new(attrs), dir_attr, fetched: std::time::Instant::now() };
        self.listings.set_page(fh, &listing.entries, page.clone(), since);
        Ok(page)
    }

    /// The kernel was given `item` (one more lookup of its inode).
    pub fn handed_out(&self, item: &PlusItem) {
        if let Some(path) = &item.path {
            self.remember(path, &item.attr);
        }
    }
}
