//! The data store of one member of a replicated server slot.
//!
//! The leader appends records as any server does; each store batch that starts using
//! records carries their stored bytes (header and data, [`DataStore::read_stored`]) through
//! the group's log, and the other members write them at the same segment and offset
//! ([`place`]), so an extent means the same bytes on every member. A member places records
//! in log order, which need not be the order of their offsets: a segment may have holes
//! until the entries that fill them are applied, or for good where the leader's append was
//! never committed. Nothing reads a hole: reads go by extent, compaction by the index.
//!
//! Segments that no index entry refers to any more are deleted by the leader's compaction;
//! the others delete them with [`collect`].

use crate::record::HEADER_LEN;
use crate::{io, parse_segment_name, segment_name, DataError, DataStore, Extent};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Writes each `(segment, offset, bytes)` at its place in the segment files under `dir`
/// (creating files as needed), then, with `sync`, makes them durable.
pub fn place(dir: &Path, pieces: &[(u32, u64, &[u8])], sync: bool) -> Result<(), DataError> {
    if pieces.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let mut files: HashMap<u32, File> = HashMap::new();
    for &(segment, offset, bytes) in pieces {
        let path = dir.join(segment_name(segment));
        let file = match files.entry(segment) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(
                OpenOptions::new().write(true).create(true).truncate(false).open(&path).map_err(io("open", &path))?,
            ),
        };
        file.write_all_at(bytes, offset).map_err(io("write", &path))?;
    }
    if sync {
        for (segment, f) in &files {
            f.sync_data().map_err(io("sync", &dir.join(segment_name(*segment))))?;
        }
        File::open(dir).and_then(|d| d.sync_all()).map_err(io("sync", dir))?;
    }
    Ok(())
}

/// The segment ids under `dir`, in order.
pub fn segment_ids(dir: &Path) -> Result<Vec<u32>, DataError> {
    let mut ids: Vec<u32> = match std::fs::read_dir(dir) {
        Ok(entries) => {
            entries.filter_map(|e| e.ok().and_then(|e| parse_segment_name(&e.file_name().to_string_lossy()))).collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io("list", dir)(e)),
    };
    ids.sort_unstable();
    Ok(ids)
}

/// Deletes the segments under `dir` that `referred` says no index entry refers to, except
/// the newest (records may still be placed there) and any written in the last `quiet`
/// (its index entries may be applied just after its bytes). Returns how many it deleted.
pub fn collect(
    dir: &Path,
    quiet: Duration,
    referred: impl Fn(u32) -> Result<bool, DataError>,
) -> Result<u32, DataError> {
    let ids = segment_ids(dir)?;
    let mut deleted = 0;
    for &id in ids.iter().rev().skip(1) {
        let path = dir.join(segment_name(id));
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).map_err(io("stat", &path))?;
        let idle = SystemTime::now().duration_since(modified).unwrap_or_default();
        if idle < quiet || referred(id)? {
            continue;
        }
        std::fs::remove_file(&path).map_err(io("delete", &path))?;
        deleted += 1;
    }
    Ok(deleted)
}

impl DataStore {
    /// The stored bytes of the record holding `e`: its header and data, as [`place`] puts
    /// them on another member (at segment `e.segment`, offset `e.offset - HEADER_LEN`).
    pub fn read_stored(&self, e: &Extent) -> Result<(u64, Vec<u8>), DataError> {
        let start = e.offset.checked_sub(HEADER_LEN as u64).ok_or(DataError::OutOfRange(*e))?;
        let file = self.file(e.segment)?;
        let mut buf = vec![0u8; HEADER_LEN + e.len as usize];
        file.read_exact_at(&mut buf, start).map_err(io("read", &self.dir.join(segment_name(e.segment))))?;
        Ok((start, buf))
    }
}

/// The stored bytes of the record holding `e` in the segment files under `dir` (a member
/// that does not lead, for a snapshot).
pub fn read_stored_at(dir: &Path, e: &Extent) -> Result<(u64, Vec<u8>), DataError> {
    let start = e.offset.checked_sub(HEADER_LEN as u64).ok_or(DataError::OutOfRange(*e))?;
    let path = dir.join(segment_name(e.segment));
    let file = File::open(&path).map_err(io("open", &path))?;
    let mut buf = vec![0u8; HEADER_LEN + e.len as usize];
    file.read_exact_at(&mut buf, start).map_err(io("read", &path))?;
    Ok((start, buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DataOptions;

    /// Records placed out of order on a member read back as on the leader, and the
    /// member's store opens without cutting them.
    #[test]
    fn placed_records_read_as_the_leaders() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let opts = DataOptions { reserve_bytes: 0, ..Default::default() };
        let leader = DataStore::open(a.path(), opts.clone()).unwrap();
        let extents = leader.append(7, &[b"first", b"second", b"third"]).unwrap();
        let stored: Vec<(u64, Vec<u8>)> = extents.iter().map(|e| leader.read_stored(e).unwrap()).collect();
        // The last record arrives first: a hole until the others do.
        let order = [2, 0, 1];
        for i in order {
            place(b.path(), &[(extents[i].segment, stored[i].0, &stored[i].1)], true).unwrap();
        }
        let member = DataStore::open(b.path(), DataOptions { replica: true, ..opts }).unwrap();
        for (e, want) in extents.iter().zip([&b"first"[..], b"second", b"third"]) {
            assert_eq!(&member.read(e).unwrap()[..], want);
        }
        let next = member.append(1, &[b"after"]).unwrap()[0];
        assert!(next.segment > extents[0].segment, "a member's appends start a new segment");
    }

    #[test]
    fn collect_keeps_the_newest_referred_and_recent_segments() {
        let dir = tempfile::tempdir().unwrap();
        for id in 1..=4 {
            place(dir.path(), &[(id, 0, b"x")], false).unwrap();
        }
        let none = collect(dir.path(), Duration::from_secs(60), |_| Ok(false)).unwrap();
        assert_eq!(none, 0, "recently written segments stay");
        let deleted = collect(dir.path(), Duration::ZERO, |id| Ok(id == 2)).unwrap();
        assert_eq!(deleted, 2);
        assert_eq!(segment_ids(dir.path()).unwrap(), vec![2, 4]);
    }
}
