//! Space reclamation: copy the live records out of mostly-dead segments, switch their
//! owners to the copies atomically, then delete the segments.

use crate::record::HEADER_LEN;
use crate::{DataError, DataStore, Extent};

/// What the metadata side provides to compaction: which extents are live, and an atomic,
/// durable switch of owners to new extents.
pub trait LiveIndex {
    /// The live records of `segment`.
    fn live_in(&self, segment: u32) -> Result<Vec<Live>, DataError>;
    /// Replaces every `from` by its `to` in the owners' layouts, all or nothing, durably.
    /// A move whose `from` is no longer in its owner's layout (the file was rewritten or
    /// removed meanwhile) must be skipped: its copy is garbage for a later pass.
    fn relocate(&mut self, moves: &[Move]) -> Result<(), DataError>;
}

/// A live record: the index's key for it, the owner written in its header, its extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    pub key: u64,
    pub owner: u64,
    pub extent: Extent,
}

/// One live record moved by compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub key: u64,
    pub from: Extent,
    pub to: Extent,
}

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactStats {
    pub segments_compacted: u32,
    pub records_moved: u64,
    pub bytes_moved: u64,
    pub bytes_reclaimed: u64,
}

/// Compacts every sealed segment whose live bytes are at most `max_live_ratio` of its
/// size ([`candidates`] then [`compact_segments`]). For a store nothing else writes to.
pub fn compact(store: &DataStore, index: &mut dyn LiveIndex, max_live_ratio: f64) -> Result<CompactStats, DataError> {
    let ids = candidates(store, index, max_live_ratio)?;
    compact_segments(store, index, &ids)
}

/// Sealed segments whose live bytes are at most `max_live_ratio` of their size. With
/// concurrent writers, call it while no append is between its write and its index entry
/// (the index must know every record of a sealed segment).
pub fn candidates(store: &DataStore, index: &dyn LiveIndex, max_live_ratio: f64) -> Result<Vec<u32>, DataError> {
    let mut out = Vec::new();
    for seg in store.segments().into_iter().filter(|s| !s.active) {
        let live_bytes = live_bytes(&index.live_in(seg.id)?);
        if seg.bytes == 0 || live_bytes as f64 <= max_live_ratio * seg.bytes as f64 {
            out.push(seg.id);
        }
    }
    Ok(out)
}

/// Live bytes (records with headers) of a segment.
pub fn live_bytes(live: &[Live]) -> u64 {
    live.iter().map(|l| HEADER_LEN as u64 + l.extent.len as u64).sum()
}

/// Compacts the sealed segments `ids`: live records are copied to the active segment (and
/// synced), the owners switched with one [`LiveIndex::relocate`] per segment, then the
/// segment is deleted. An error stops the pass with the segment being compacted still
/// intact and referenced.
pub fn compact_segments(store: &DataStore, index: &mut dyn LiveIndex, ids: &[u32]) -> Result<CompactStats, DataError> {
    let mut stats = CompactStats::default();
    let sizes: std::collections::HashMap<u32, u64> = store.segments().iter().map(|s| (s.id, s.bytes)).collect();
    for &id in ids {
        let Some(&bytes) = sizes.get(&id) else { continue };
        let live = index.live_in(id)?;
        let live_total = live_bytes(&live);
        if !live.is_empty() {
            let extents: Vec<Extent> = live.iter().map(|l| l.extent).collect();
            let data = store.read_many(&extents, 1 << 20)?;
            let records: Vec<(u64, &[u8])> = live.iter().zip(&data).map(|(l, d)| (l.owner, &d[..])).collect();
            let copies = store.append_unreserved(&records)?;
            store.sync()?;
            let moves: Vec<Move> =
                live.iter().zip(&copies).map(|(l, to)| Move { key: l.key, from: l.extent, to: *to }).collect();
            index.relocate(&moves)?;
            stats.records_moved += moves.len() as u64;
            stats.bytes_moved += live_total;
        }
        store.delete_segment(id)?;
        stats.segments_compacted += 1;
        stats.bytes_reclaimed += bytes.saturating_sub(live_total);
    }
    Ok(stats)
}

/// Deletes sealed segments nothing references (left by a crash between a relocation and
/// the deletion of the old segment). Returns how many were deleted.
pub fn collect_garbage(store: &DataStore, index: &dyn LiveIndex) -> Result<u32, DataError> {
    let mut deleted = 0;
    for seg in store.segments().into_iter().filter(|s| !s.active) {
        if index.live_in(seg.id)?.is_empty() {
            store.delete_segment(seg.id)?;
            deleted += 1;
        }
    }
    Ok(deleted)
}
