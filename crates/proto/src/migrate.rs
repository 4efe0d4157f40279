//! What crosses the wire when a directory object moves to the home a new map epoch gives
//! it (`MigrateOut`, `MigrateEntries`).

use crate::record::{DirObject, Inode};
use serde::{Deserialize, Serialize};

/// One directory object handed over by its old home, or a page of its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedDir {
    pub path: String,
    /// The object (none: the old home holds no object at this path; for a page of
    /// entries, none as well).
    pub object: Option<DirObject>,
    /// Entries (the first ones, or a page of them), in name order.
    pub entries: Vec<(String, Inode)>,
    /// More entries follow (`MigrateEntries` after the last one here).
    pub more: bool,
    /// CRC-32C of the postcard encoding of `object` and `entries`.
    pub checksum: u32,
}

impl MovedDir {
    /// A hand-over of `object` with `entries`, checksummed.
    pub fn new(path: String, object: Option<DirObject>, entries: Vec<(String, Inode)>, more: bool) -> MovedDir {
        let checksum = content_checksum(&object, &entries);
        MovedDir { path, object, entries, more, checksum }
    }

    /// Whether the content is what the old home sent.
    pub fn is_intact(&self) -> bool {
        content_checksum(&self.object, &self.entries) == self.checksum
    }
}

fn content_checksum(object: &Option<DirObject>, entries: &[(String, Inode)]) -> u32 {
    let bytes = postcard::to_allocvec(&(object, entries)).expect("in-memory encoding cannot fail");
    crc32c::crc32c(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damage_is_detected() {
        let obj = DirObject::new(7, 0o755, 1, 2);
        let mut m = MovedDir::new("/a".into(), Some(obj), Vec::new(), false);
        assert!(m.is_intact());
        m.path = "/b".into();
        assert!(m.is_intact(), "the path is checked by the receiver, not the checksum");
        m.object.as_mut().unwrap().ino = 8;
        assert!(!m.is_intact());
    }
}
