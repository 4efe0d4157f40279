//! Directory listings snapshotted at `opendir`, by directory handle, with the attributes
//! `readdirplus` fetched for them.

use super::types::Caller;
use plusfs_proto::{Attr, DirEntry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// A directory listing taken at `opendir`.
#[derive(Clone)]
pub(crate) struct Listing {
    /// The directory's path.
    pub dir: String,
    /// Its entries at `opendir`.
    pub entries: Arc<Vec<DirEntry>>,
    /// Who opened it (`readdirplus` looks at the entries as them).
    pub caller: Caller,
}

/// Attributes `readdirplus` fetched for entries `start..start + attrs.len()` of a listing
/// (`None`: removed since `opendir`), and the directory's own.
#[derive(Clone)]
pub(crate) struct PlusPage {
    pub start: usize,
    pub attrs: Arc<Vec<Option<Attr>>>,
    pub dir_attr: Attr,
}

struct Open {
    listing: Listing,
    page: Option<PlusPage>,
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

    /// Keeps `listing` under handle `fh`.
    pub fn insert(&self, fh: u64, listing: Listing) {
        self.lock().insert(fh, Open { listing, page: None });
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

    /// Keeps the attributes fetched for `fh`.
    pub fn set_page(&self, fh: u64, page: PlusPage) {
        if let Some(o) = self.lock().get_mut(&fh) {
            o.page = Some(page);
        }
    }

    /// Drops the listing of `fh`.
    pub fn remove(&self, fh: u64) {
        self.lock().remove(&fh);
    }
}
