//! The record format of segment files.
//!
//! ```text
//! offset size field
//!      0    4 magic "PFDR"
//!      4    4 data length (u32, little-endian)
//!      8    4 CRC-32C of the data
//!     12    4 CRC-32C of bytes 0..12 and 16..24 (the header itself)
//!     16    8 owner inode number (u64, little-endian)
//!     24    - data
//! ```

use crate::{DataError, Extent};
use bytes::Bytes;
use std::fs::File;
use std::os::unix::fs::FileExt;

pub(crate) const HEADER_LEN: usize = 24;
const MAGIC: &[u8; 4] = b"PFDR";

pub(crate) struct RecordHeader {
    pub len: u32,
    pub data_crc: u32,
    pub owner: u64,
}

impl RecordHeader {
    pub fn for_data(owner: u64, data: &[u8]) -> RecordHeader {
        RecordHeader { len: data.len() as u32, data_crc: crc32c::crc32c(data), owner }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(MAGIC);
        h[4..8].copy_from_slice(&self.len.to_le_bytes());
        h[8..12].copy_from_slice(&self.data_crc.to_le_bytes());
        h[16..24].copy_from_slice(&self.owner.to_le_bytes());
        let hc = header_crc(&h);
        h[12..16].copy_from_slice(&hc.to_le_bytes());
        h
    }

    /// Decodes a header, or says why the bytes are not one.
    pub fn decode(h: &[u8]) -> Result<RecordHeader, HeaderError> {
        if h.len() < HEADER_LEN || &h[0..4] != MAGIC {
            return Err(HeaderError::Missing);
        }
        let stored = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        if stored != header_crc(h) {
            return Err(HeaderError::Checksum);
        }
        Ok(RecordHeader {
            len: u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")),
            data_crc: u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")),
            owner: u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// Why bytes are not a record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Too short, or no magic.
    #[error("no record header")]
    Missing,
    /// The header's checksum does not match its bytes.
    #[error("record header checksum mismatch")]
    Checksum,
}

fn header_crc(h: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&h[0..12]), &h[16..24])
}

/// Checks a record (header + data) read for extent `e`; returns its data, a slice of `rec`.
pub(crate) fn check(rec: Bytes, e: Extent) -> Result<Bytes, DataError> {
    let corrupt = |reason: String| DataError::Corrupt { segment: e.segment, offset: e.offset, reason };
    let h = RecordHeader::decode(&rec).map_err(|e| corrupt(e.to_string()))?;
    if h.len != e.len {
        return Err(corrupt(format!("record holds {} bytes, the extent says {}", h.len, e.len)));
    }
    let data = rec.slice(HEADER_LEN..);
    if crc32c::crc32c(&data) != h.data_crc {
        return Err(corrupt("data checksum mismatch".into()));
    }
    Ok(data)
}

/// One record found by scanning a segment: its extent and owner.
pub(crate) struct Scanned {
    pub extent: Extent,
    pub owner: u64,
}

/// Walks the records of a segment from its start; stops at the first that is not whole
/// and valid. Returns the records and the length of the valid prefix.
pub(crate) fn scan(file: &File, segment: u32) -> std::io::Result<(Vec<Scanned>, u64)> {
    let size = file.metadata()?.len();
    let mut at = 0u64;
    let mut out = Vec::new();
    let mut header = [0u8; HEADER_LEN];
    while at + HEADER_LEN as u64 <= size {
        file.read_exact_at(&mut header, at)?;
        let Ok(h) = RecordHeader::decode(&header) else { break };
        let end = at + HEADER_LEN as u64 + h.len as u64;
        if end > size {
            break;
        }
        let mut data = vec![0u8; h.len as usize];
        file.read_exact_at(&mut data, at + HEADER_LEN as u64)?;
        if crc32c::crc32c(&data) != h.data_crc {
            break;
        }
        out.push(Scanned { extent: Extent { segment, offset: at + HEADER_LEN as u64, len: h.len }, owner: h.owner });
        at = end;
    }
    Ok((out, at))
}

/// Length of the valid prefix of a segment (whole records with good checksums).
pub(crate) fn valid_length(file: &File, segment: u32) -> std::io::Result<u64> {
    Ok(scan(file, segment)?.1)
}
