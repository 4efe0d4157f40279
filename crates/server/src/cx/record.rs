//! Cx log records: what a server logs for an operation, checksummed.

use crate::engine::locks::Scope;
use crate::engine::logrec::RecordError;
use plusfs_proto::{CxRole, OpId, ServerId, SubOp, TxId};
use plusfs_store::record::FrameError;
use plusfs_store::StoreError;
use serde::{Deserialize, Serialize};

/// A Cx log record (framed with its version and a checksum).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Record {
    /// A YES execution: what will be applied at commitment and what it locks.
    Result { op: OpId, role: CxRole, peer: ServerId, ops: Vec<SubOp>, locks: Vec<(String, Scope)>, hint: Vec<OpId> },
    /// The coordinator's Commit or Abort record, until the participant ACKs.
    Decided { op: OpId, peer: ServerId, commit: bool },
}

/// The format of Cx records (2: ancestries with ACL elements; 1 is read as before them).
const VERSION: u8 = 3;

/// The stored form of `rec` (framed by the engine's record layer).
pub(super) fn frame(rec: &Record) -> Vec<u8> {
    crate::engine::logrec::encode_framed(VERSION, rec)
}

/// The record stored under `key`, or the store's "corrupt" error naming it.
pub(super) fn unframe(key: TxId, bytes: &[u8]) -> Result<Record, StoreError> {
    use crate::engine::logrec::{decode_framed, older_ancestries};
    // A record of an earlier build starts with its checksum, which may happen to start
    // with the frame's magic: one that is no sound frame is read as such a record if its
    // own checksum holds.
    let upgrade = |v, body: &[u8]| older_ancestries(v, body, VERSION);
    decode_framed(bytes, VERSION, upgrade, legacy)
        .or_else(|e| legacy(bytes).map_err(|_| e))
        .map_err(|e| StoreError::Corrupt { key: format!("Cx record {key}"), reason: e.to_string() })
}

/// A record of an earlier build: a CRC-32C of the encoding, then the encoding.
fn legacy(bytes: &[u8]) -> Result<Record, RecordError> {
    if bytes.len() < 4 {
        return Err(FrameError::Short(bytes.len()).into());
    }
    let (crc, body) = bytes.split_at(4);
    if u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) != crc32c::crc32c(body) {
        return Err(FrameError::Checksum.into());
    }
    Ok(plusfs_proto::record::legacy_ancestry(|| postcard::from_bytes(body))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_checksummed() {
        let rec = Record::Decided { op: OpId { client: 1, process: 2, seq: 3 }, peer: 4, commit: true };
        let mut bytes = frame(&rec);
        assert!(matches!(unframe(9, &bytes), Ok(Record::Decided { peer: 4, commit: true, .. })));
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(unframe(9, &bytes).is_err());
        assert!(unframe(9, &bytes[..3]).is_err());
        assert!(unframe(9, b"\x00\x01\x02\x03\x04\x05\x06").is_err(), "neither framed nor sound");
        let body = postcard::to_allocvec(&rec).unwrap();
        let mut old = crc32c::crc32c(&body).to_be_bytes().to_vec();
        old.extend_from_slice(&body);
        assert!(matches!(unframe(9, &old), Ok(Record::Decided { peer: 4, .. })), "a record of an earlier build");
        // One whose checksum happens to start like a frame is still read as what it is.
        let body = (0u64..)
            .map(|seq| {
                postcard::to_allocvec(&Record::Decided {
                    op: OpId { client: 1, process: 2, seq },
                    peer: 4,
                    commit: true,
                })
                .unwrap()
            })
            .find(|b| crc32c::crc32c(b).to_be_bytes()[..2] == plusfs_store::record::MAGIC)
            .unwrap();
        let mut old = crc32c::crc32c(&body).to_be_bytes().to_vec();
        old.extend_from_slice(&body);
        assert!(matches!(unframe(9, &old), Ok(Record::Decided { peer: 4, .. })), "a legacy record that looks framed");
    }
}
