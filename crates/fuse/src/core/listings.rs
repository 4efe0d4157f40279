//! Open directory handles: each keeps a window of its listing (read from the servers a page
//! at a time, in name order) and the attributes `readdirplus` fetched for part of it.

use super::types::Caller;
use plusfs_proto::{Attr, DirEntry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The part of a directory listing an open handle holds: entries `base..base +
/// entries.len()` of the listing. Memory per handle is one page whatever the size of the
/// directory.
#[derive(Clone)]
pub(crate) struct Listing {
    /// The directory's path.
    pub dir: String,
    /// Who opened it (pages are read, and `readdirplus` looks at the entries, as them).
    pub caller: Caller,
    /// Index in the listing of the window's first entry.
    pub base: usize,
    /// The window.
    pub entries: Arc<Vec<DirEntry>>,
    /// The name the next page starts after (`None`: the listing ends with the window).
    pub next: Option<String>,
}

impl Listing {
    /// Index just past the window.
    pub fn end(&self) -> usize {
        self.base + self.entries.len()
    }
}

/// Attributes `readdirplus` fetched for entries `start..start + attrs.len()` of a listing
/// (`None`: removed since they were listed), and the directory's own.
#[derive(Clone)]
pub(crate) struct PlusPage {
    pub start: usize,
    pub attrs: Arc<Vec<Option<Attr>>>,
    pub dir_attr: Attr,
    /// When they were fetched.
    pub fetched: Instant,
}

/// An entry of an open listing that a lookup asks about (`Listings::find`).
pub(crate) struct Listed {
    pub fh: u64,
    pub listing: Listing,
    /// The entry's index in the listing.
    pub index: usize,
    /// Its attributes if fetched within the TTL (`Some(None)`: gone when they were).
    pub attr: Option<Option<Attr>>,
}

struct Open {
    listing: Listing,
    page: Option<PlusPage>,
    /// Names removed through this mount since `page` was fetched (its attributes for
    /// them are no longer true).
    removed: std::collections::HashSet<String>,
}

/// The open directory handles.
#[derive(Default)]
pub(crate) struct Listings {
    open: Mutex<HashMap<u64, Open>>,
}

impl Listings {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().expect("listings")
    }

    /// Keeps `listing` under handle `fh` (a new handle, or the next window of one: the
    /// attributes fetched for the window before are dropped).
    pub fn insert(&self, fh: u64, listing: Listing) {
        self.lock().insert(fh, Open { listing, page: None, removed: Default::default() });
    }

    /// Replaces the window of open handle `fh` (nothing if it was closed meanwhile).
    pub fn set_window(&self, fh: u64, listing: Listing) {
        if let Some(o) = self.lock().get_mut(&fh) {
            *o = Open { listing, page: None, removed: Default::default() };
        }
    }

    /// The listing of `fh` (shared, not copied).
    pub fn get(&self, fh: u64) -> Option<Listing> {
        self.lock().get(&fh).map(|o| o.listing.clone())
    }

    /// The attributes fetched for `fh`, if they cover entry `index`.
    pub fn page(&self, fh: u64, index: usize) -> Option<PlusPage> {
        let open = self.lock();
        let page = open.get(&fh)?.page.as_ref()?;
        (index >= page.start && index < page.start + page.attrs.len().max(1)).then(|| page.clone())
    }

    /// Keeps the attributes fetched for `fh` from its window `window` (not if the handle
    /// has moved to another window meanwhile: they would name other entries).
    pub fn set_page(&self, fh: u64, window: &Arc<Vec<DirEntry>>, page: PlusPage) {
        if let Some(o) = self.lock().get_mut(&fh).filter(|o| Arc::ptr_eq(&o.listing.entries, window)) {
            o.page = Some(page);
            o.removed.clear();
        }
    }

    /// The entry `name` of directory `dir` in the window of a handle `caller` opened (a
    /// program listing a directory and looking each entry up, as `ls -l` does), with the
    /// attributes fetched for it within `ttl`, if any.
    pub fn find(&self, dir: &str, caller: &Caller, name: &str, ttl: Duration) -> Option<Listed> {
        let open = self.lock();
        for (fh, o) in open.iter() {
            let l = &o.listing;
            if l.dir != dir || l.caller != *caller {
                continue;
            }
            let Ok(k) = l.entries.binary_search_by(|e| e.name.as_str().cmp(name)) else { continue };
            let index = l.base + k;
            let attr = o.page.as_ref().filter(|p| p.fetched.elapsed() < ttl).and_then(|p| {
                let gone = o.removed.contains(name);
                (index >= p.start && index < p.start + p.attrs.len())
                    .then(|| p.attrs[index - p.start].clone().filter(|_| !gone))
            });
            return Some(Listed { fh: *fh, listing: l.clone(), index, attr });
        }
        None
    }

    /// Directory `dir` changed through this mount: the attributes fetched for its open
    /// listings may be stale (the listings themselves stay, as a snapshot would).
    pub fn drop_pages(&self, dir: &str) {
        for o in self.lock().values_mut().filter(|o| o.listing.dir == dir) {
            o.page = None;
        }
    }

    /// The entry at `path` was renamed or exchanged through this mount: what was fetched
    /// for its directory, and for listings at or below it (a directory moved), is stale.
    pub fn path_changed(&self, path: &str) {
        let parent = plusfs_proto::path::split(path).map(|(d, _)| d);
        for o in self.lock().values_mut() {
            let d = o.listing.dir.as_str();
            if Some(d) == parent || plusfs_proto::path::is_within(d, path) {
                o.page = None;
            }
        }
    }

    /// Entry `name` of `dir` was removed through this mount: the attributes fetched for it
    /// no longer hold (the others do).
    pub fn entry_removed(&self, dir: &str, name: &str) {
        for o in self.lock().values_mut().filter(|o| o.listing.dir == dir && o.page.is_some()) {
            o.removed.insert(name.to_string());
        }
    }

    /// Drops the listing of `fh`.
    pub fn remove(&self, fh: u64) {
        self.lock().remove(&fh);
    }
}
