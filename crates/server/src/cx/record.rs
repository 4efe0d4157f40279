//! Cx log records: what a server logs for an operation, checksummed.

use crate::engine::locks::Scope;
use plusfs_proto::{CxRole, OpId, ServerId, SubOp, TxId};
use plusfs_store::StoreError;
use serde::{Deserialize, Serialize};

/// A Cx log record. Stored as a CRC-32C of the encoding followed by the encoding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Record {
    /// A YES execution: what will be applied at commitment and what it locks.
    Result { op: OpId, role: CxRole, peer: ServerId, ops: Vec<SubOp>, locks: Vec<(String, Scope)>, hint: Vec<OpId> },
    /// The coordinator's Commit or Abort record, until the participant ACKs.
    Decided { op: OpId, peer: ServerId, commit: bool },
}

pub(super) fn frame(rec: &Record) -> Vec<u8> {
    let body = postcard::to_allocvec(rec).expect("in-memory encoding cannot fail");
    let mut out = crc32c::crc32c(&body).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

pub(super) fn unframe(key: TxId, bytes: &[u8]) -> Result<Record, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { key: format!("X{key}"), reason };
    if bytes.len() < 4 {
        return Err(corrupt("record shorter than its checksum".into()));
    }
    let (crc, body) = bytes.split_at(4);
    if u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) != crc32c::crc32c(body) {
        return Err(corrupt("checksum mismatch".into()));
    }
    postcard::from_bytes(body).map_err(|e| corrupt(e.to_string()))
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
    }
}
