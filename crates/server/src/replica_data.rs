//! File data of a replicated server slot, between the engine's data store and the replica
//! group (see `plusfs_data::replica`).
//!
//! - [`Source`] (the leader): for each store batch that starts using records (an index
//!   entry `PutSegRef` with its `PutRecord`), the records' stored bytes, which travel in
//!   the batch's log entry.
//! - [`Sink`] (every member): places the records of entries other members proposed, and
//!   gathers every record the store refers to for a snapshot.
//!
//! Carrying the bytes in the log writes them twice on the leader (segment and log) but
//! lets Raft do what a separate data path would have to redo: order, retries, catch-up of
//! a member that was down, and agreement on which records exist.

use crate::engine::logrec::RecordError;
use crate::engine::records::RecordLoc;
use plusfs_data::{replica, DataStore};
use plusfs_replica::SinkError;
use plusfs_store::{Batch, BatchOp, DataPiece, DataSource, RocksStore, StoreError};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A segment written less than this long ago is never collected on a member that does not
/// lead (its index entries may be applied just after its bytes).
const QUIET: Duration = Duration::from_secs(60);

fn bad(e: impl std::fmt::Display) -> StoreError {
    StoreError::Replica(format!("cannot read file data to replicate: {e}"))
}

fn decode_loc(value: &[u8]) -> Result<RecordLoc, RecordError> {
    RecordLoc::decode(value)
}

/// Why a member's data store could not place or hand over file data.
#[derive(Debug, thiserror::Error)]
pub enum SinkFailure {
    /// The data store failed.
    #[error(transparent)]
    Data(#[from] plusfs_data::DataError),
    /// The store of directory objects failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record index entry is unreadable.
    #[error("bad record index entry: {0}")]
    Index(#[from] RecordError),
    /// A reference names a record with no index entry.
    #[error("record {0} is referred to but has no index entry")]
    Unindexed(u64),
}

/// The leader's data store, read for the records each batch starts using.
pub struct Source(pub Arc<DataStore>);

impl DataSource for Source {
    fn pieces(&self, batch: &Batch) -> Result<Vec<DataPiece>, StoreError> {
        let locs: HashMap<u64, &[u8]> = batch
            .ops
            .iter()
            .filter_map(|op| match op {
                BatchOp::PutRecord(id, v) => Some((*id, v.as_slice())),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for op in &batch.ops {
            let BatchOp::PutSegRef(segment, offset, id) = op else { continue };
            let value = locs.get(id).ok_or_else(|| bad(format!("record {id} has no index entry in its batch")))?;
            let loc = decode_loc(value).map_err(bad)?;
            if (loc.extent.segment, loc.extent.offset) != (*segment, *offset) {
                return Err(bad(format!("record {id}'s index entries disagree on its place")));
            }
            let (start, bytes) = self.0.read_stored(&loc.extent).map_err(bad)?;
            out.push(DataPiece { segment: *segment, offset: start, bytes });
        }
        Ok(out)
    }
}

/// One member's data directory as its replica group's state machine sees it.
pub struct Sink {
    /// Held while records are placed and while segments are collected, so a collection
    /// never deletes a segment an apply is writing.
    pub turn: parking_lot::Mutex<()>,
    /// This member's id.
    pub member: u64,
    /// The term in which this process took over as leader (0: it does not lead): entries
    /// it proposed in that term carry records its data store already holds.
    pub leading: std::sync::atomic::AtomicU64,
    /// The member's data directory (`DIR/data`).
    pub dir: PathBuf,
    /// The member's store (the same RocksDB the group applies to).
    pub store: Arc<RocksStore>,
    /// Make placed records durable before the entry counts as applied.
    pub sync: bool,
}

impl Sink {
    /// Deletes the segments no index entry refers to any more (on a member that does not
    /// lead; the leader's compaction deletes its own). Returns how many.
    pub fn collect(&self) -> Result<u32, plusfs_data::DataError> {
        use plusfs_store::StoreRead;
        let referred = |seg| {
            self.store.seg_refs(seg).map(|r| !r.is_empty()).map_err(|e| plusfs_data::DataError::Corrupt {
                segment: seg,
                offset: 0,
                reason: e.to_string(),
            })
        };
        let _turn = self.turn.lock();
        replica::collect(&self.dir, QUIET, referred)
    }
}

impl plusfs_replica::DataSink for Sink {
    fn place(&self, pieces: &[DataPiece], proposer: Option<(u64, u64)>) -> Result<(), SinkError> {
        let leading = self.leading.load(std::sync::atomic::Ordering::Acquire);
        if leading != 0 && proposer == Some((self.member, leading)) {
            return Ok(());
        }
        let _turn = self.turn.lock();
        let tuples: Vec<(u32, u64, &[u8])> = pieces.iter().map(|p| (p.segment, p.offset, p.bytes.as_slice())).collect();
        Ok(replica::place(&self.dir, &tuples, self.sync)?)
    }

    fn gather(&self, each: &mut dyn FnMut(DataPiece) -> Result<(), SinkError>) -> Result<(), SinkError> {
        use plusfs_store::StoreRead;
        let refs = self.store.all_seg_refs().map_err(SinkFailure::from)?;
        // Index entries looked up a few at a time, records read one at a time.
        for chunk in refs.chunks(256) {
            let ids: Vec<u64> = chunk.iter().map(|r| r.2).collect();
            let values = self.store.get_records(&ids).map_err(SinkFailure::from)?;
            for (&(segment, offset, id), value) in chunk.iter().zip(values) {
                let value = value.ok_or(SinkFailure::Unindexed(id))?;
                let loc = decode_loc(&value).map_err(SinkFailure::from)?;
                if (loc.extent.segment, loc.extent.offset) != (segment, offset) {
                    continue; // a stale reference (compaction moved the record): not live here
                }
                let (offset, bytes) = replica::read_stored_at(&self.dir, &loc.extent).map_err(SinkFailure::from)?;
                each(DataPiece { segment, offset, bytes })?;
            }
        }
        Ok(())
    }
}
