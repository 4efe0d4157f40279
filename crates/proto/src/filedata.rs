//! File contents as the metadata sees them: a file is a sorted list of [`Piece`]s, each a
//! byte range of the file stored as (part of) one record in some server's data store.
//! Ranges no piece covers read as zeros (sparse files). The list lives in the embedded
//! inode, so a file's layout changes in the same store write as its size and times.

use crate::ids::ServerId;
use serde::{Deserialize, Serialize};

/// Largest file size (EFBIG beyond): 2^44 bytes = 16 TiB.
pub const MAX_FILE_SIZE: u64 = 1 << 44;
/// Largest data record a server writes; longer writes are cut into several records.
pub const MAX_RECORD: u64 = 1 << 20;
/// Longest extended-attribute name.
pub const MAX_XATTR_NAME: usize = 255;
/// Largest extended-attribute value (Linux's XATTR_SIZE_MAX).
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Most bytes of names and values one object holds.
pub const MAX_XATTR_TOTAL: usize = 64 << 10;

/// Bytes `[file_off, file_off + len)` of a file are bytes `[skip, skip + len)` of record
/// `record` in the data store of `server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub file_off: u64,
    pub len: u64,
    pub server: ServerId,
    pub record: u64,
    pub skip: u64,
}

impl Piece {
    pub fn end(&self) -> u64 {
        self.file_off + self.len
    }
}

/// Puts `new` over whatever covered its range (splitting pieces it cuts), keeping the list
/// sorted and non-overlapping.
pub fn overlay(pieces: &mut Vec<Piece>, new: Piece) {
    cut_range(pieces, new.file_off, new.end());
    let at = pieces.partition_point(|p| p.file_off < new.file_off);
    pieces.insert(at, new);
}

/// Drops every byte at or beyond `size`.
pub fn truncate(pieces: &mut Vec<Piece>, size: u64) {
    cut_range(pieces, size, u64::MAX);
}

/// Removes the bytes `[start, end)` from the pieces.
fn cut_range(pieces: &mut Vec<Piece>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(pieces.len() + 1);
    for p in pieces.drain(..) {
        if p.end() <= start || p.file_off >= end {
            out.push(p);
            continue;
        }
        if p.file_off < start {
            out.push(Piece { len: start - p.file_off, ..p });
        }
        if p.end() > end {
            let drop = end - p.file_off;
            out.push(Piece { file_off: end, len: p.end() - end, skip: p.skip + drop, ..p });
        }
    }
    *pieces = out;
}

/// The distinct (server, record) pairs the pieces use.
pub fn records(pieces: &[Piece]) -> std::collections::BTreeSet<(ServerId, u64)> {
    pieces.iter().map(|p| (p.server, p.record)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(file_off: u64, len: u64, record: u64) -> Piece {
        Piece { file_off, len, server: 0, record, skip: 0 }
    }

    /// The file as a byte-owner map: which (record, byte-in-record) each offset reads.
    fn flatten(pieces: &[Piece], size: u64) -> Vec<Option<(u64, u64)>> {
        let mut out = vec![None; size as usize];
        for q in pieces {
            for i in 0..q.len {
                out[(q.file_off + i) as usize] = Some((q.record, q.skip + i));
            }
        }
        out
    }

    #[test]
    fn overlay_and_truncate_match_a_byte_model() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut pieces = Vec::new();
        let mut model: Vec<Option<(u64, u64)>> = vec![None; 300];
        for record in 0..400u64 {
            if rng.gen_bool(0.15) {
                let size = rng.gen_range(0..300);
                truncate(&mut pieces, size);
                for b in model.iter_mut().skip(size as usize) {
                    *b = None;
                }
            } else {
                let off = rng.gen_range(0..280);
                let len = rng.gen_range(1..=(300 - off).min(40));
                overlay(&mut pieces, p(off, len, record));
                for i in 0..len {
                    model[(off + i) as usize] = Some((record, i));
                }
            }
            assert!(pieces.windows(2).all(|w| w[0].end() <= w[1].file_off), "sorted, no overlap");
            assert!(pieces.iter().all(|q| q.len > 0));
            assert_eq!(flatten(&pieces, 300), model);
        }
    }

    #[test]
    fn records_in_use() {
        let mut v = vec![p(0, 10, 1)];
        overlay(&mut v, p(3, 2, 2));
        assert_eq!(v.len(), 3);
        assert_eq!(records(&v).into_iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 2]);
        overlay(&mut v, p(0, 10, 3));
        assert_eq!(records(&v).into_iter().map(|r| r.1).collect::<Vec<_>>(), vec![3]);
    }
}
