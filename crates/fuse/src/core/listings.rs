//! Directory listings snapshotted at `opendir`, by directory handle.

use plusfs_proto::DirEntry;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A directory listing taken at `opendir`.
#[derive(Clone)]
pub(crate) struct Listing {
    /// The directory's path.
    pub dir: String,
    /// Its entries at `opendir`.
    pub entries: Vec<DirEntry>,
}

/// The open directory handles.
#[derive(Default)]
pub(crate) struct Listings {
    open: Mutex<HashMap<u64, Listing>>,
}

impl Listings {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Listing>> {
        self.open.lock().expect("listings")
    }

    /// Keeps `listing` under handle `fh`.
    pub fn insert(&self, fh: u64, listing: Listing) {
        self.lock().insert(fh, listing);
    }

    /// A copy of the listing of `fh`.
    pub fn get(&self, fh: u64) -> Option<Listing> {
        self.lock().get(&fh).cloned()
    }

    /// Drops the listing of `fh`.
    pub fn remove(&self, fh: u64) {
        self.lock().remove(&fh);
    }
}
