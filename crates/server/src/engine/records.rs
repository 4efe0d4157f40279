//! The index of file-data records: which extent of which segment holds a record, and the
//! bookkeeping when records stop being used.

use super::errors::{eio, err, OpResult};
use super::Engine;
use plusfs_data::Extent;
use plusfs_proto::{Errno, Ino, ServerId};
use plusfs_store::Batch;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What `R<id>` holds: where the record is and whose it is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct RecordLoc {
    pub(crate) extent: Extent,
    pub(crate) owner: Ino,
}

impl RecordLoc {
    /// The stored form (framed by the engine's record layer).
    pub(crate) fn encode(&self) -> Vec<u8> {
        super::logrec::encode_framed(1, self)
    }

    /// The index entry stored as `bytes`, or why it cannot be read.
    pub(crate) fn decode(bytes: &[u8]) -> Result<RecordLoc, super::logrec::RecordError> {
        use super::logrec::{decode_framed, no_upgrade, unframed};
        decode_framed(bytes, 1, no_upgrade, unframed)
    }

    /// [`RecordLoc::decode`] of record `id`'s entry, as an EIO naming it.
    pub(crate) fn read(id: u64, bytes: &[u8]) -> OpResult<RecordLoc> {
        RecordLoc::decode(bytes).map_err(|e| err(Errno::EIO, format!("corrupt index entry of record {id}: {e}")))
    }
}

impl Engine {
    /// Records used before a change and not after: local ones are dropped in `b`, the
    /// remote ones returned for [`Osd::drop_remote`] after the change is committed.
    pub(crate) fn drop_unused(
        &self,
        before: &BTreeSet<(ServerId, u64)>,
        after: &BTreeSet<(ServerId, u64)>,
        b: &mut Batch,
    ) -> OpResult<Vec<(ServerId, u64)>> {
        let gone: Vec<(ServerId, u64)> = before.difference(after).copied().collect();
        let local: Vec<u64> = gone.iter().filter(|(s, _)| *s == self.id).map(|(_, r)| *r).collect();
        self.drop_local(&local, b)?;
        Ok(gone.into_iter().filter(|(s, _)| *s != self.id).collect())
    }

    /// Adds the removal of local records `ids` (index entries) to `b`; their bytes become
    /// garbage for compaction.
    pub(crate) fn drop_local(&self, ids: &[u64], b: &mut Batch) -> OpResult<()> {
        for (id, loc) in ids.iter().zip(self.store.get_records(ids).map_err(eio)?) {
            if let Some(bytes) = loc {
                let loc = RecordLoc::read(*id, &bytes)?;
                b.del_seg_ref(loc.extent.segment, loc.extent.offset);
            }
            b.del_record(*id);
        }
        Ok(())
    }

    /// A new record id for `extent` of `owner`, with its index entries added to `b`.
    pub(crate) async fn index_record(&self, extent: Extent, owner: Ino, b: &mut Batch) -> OpResult<u64> {
        let id = self.records.next(self.store.as_ref()).await.map_err(eio)?;
        b.put_record(id, RecordLoc { extent, owner }.encode());
        b.put_seg_ref(extent.segment, extent.offset, id);
        Ok(id)
    }
}
