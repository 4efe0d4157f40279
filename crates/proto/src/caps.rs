//! Capabilities: what a file's server lets one client do on the data servers directly.
//!
//! A client reading or writing a large file talks to the data servers itself (client-direct
//! I/O). Data servers know records by number and owning inode, not who may read or write
//! which file, so the file's server — which checks permissions — hands the client a
//! [`Capability`] with the layout (`Layout`, read or write): which inode, read or write,
//! which byte range, until when, for which certificate. It is signed with a key every
//! server of the cluster derives from the shared server identity (HMAC-SHA256), so any data
//! server checks it without asking anyone. A data server that stores a record under a
//! write capability answers with a signed [`Receipt`]; the file's server lays only
//! receipted records into the file (`CommitWrite`), so a client cannot splice another
//! file's record into its own. Admin identities and servers need neither.
//!
//! The bytes signed are fixed by [`Capability::signed`] and [`Receipt::signed`] (a
//! domain label, then the fields in postcard); the signature is not part of them.

use crate::filedata::Piece;
use crate::ids::{Ino, ServerId};
use serde::{Deserialize, Serialize};

/// What a capability lets its holder do with one file's records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The file whose records it covers (a record's owning inode).
    pub ino: Ino,
    /// Read (`DataGet`) or write (`DataPut` of records for bytes in the range).
    pub write: bool,
    /// First byte of the file it covers.
    pub offset: u64,
    /// Bytes it covers from `offset`.
    pub len: u64,
    /// Seconds since the Unix epoch after which no server accepts it.
    pub expires: u64,
    /// Serial number (hex) of the certificate whose connections may use it.
    pub holder: String,
    /// HMAC-SHA256 of [`Capability::signed`].
    pub mac: Vec<u8>,
}

impl Capability {
    /// The bytes the signature covers.
    pub fn signed(&self) -> Vec<u8> {
        let fields = (self.ino, self.write, self.offset, self.len, self.expires, &self.holder);
        labelled(b"plusfs capability v1\0", &fields)
    }

    /// True when bytes `[off, off + len)` of the file lie within the capability's range.
    pub fn covers(&self, off: u64, len: u64) -> bool {
        let end = off as u128 + len as u128;
        off >= self.offset && end <= self.offset as u128 + self.len as u128
    }
}

/// A data server's signed word that it stored `record` for bytes `[file_off, file_off +
/// len)` of file `owner`, under a capability of `holder` valid until `expires`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub server: ServerId,
    pub record: u64,
    pub owner: Ino,
    pub file_off: u64,
    pub len: u64,
    pub expires: u64,
    pub holder: String,
    /// HMAC-SHA256 of [`Receipt::signed`].
    pub mac: Vec<u8>,
}

impl Receipt {
    /// The bytes the signature covers.
    pub fn signed(&self) -> Vec<u8> {
        let fields = (self.server, self.record, self.owner, self.file_off, self.len, self.expires, &self.holder);
        labelled(b"plusfs receipt v1\0", &fields)
    }

    /// True when the receipt vouches for `piece` (a whole record) of file `ino`.
    pub fn vouches(&self, piece: &Piece, ino: Ino) -> bool {
        self.owner == ino
            && self.server == piece.server
            && self.record == piece.record
            && self.file_off == piece.file_off
            && self.len == piece.len
            && piece.skip == 0
    }
}

/// `label` followed by `fields` in postcard.
fn labelled<T: Serialize>(label: &[u8], fields: &T) -> Vec<u8> {
    let mut out = label.to_vec();
    out.extend(postcard::to_allocvec(fields).expect("plain fields encode"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(offset: u64, len: u64) -> Capability {
        Capability { ino: 7, write: true, offset, len, expires: 9, holder: "ab".into(), mac: vec![] }
    }

    #[test]
    fn a_capability_covers_its_range_only() {
        let c = cap(100, 50);
        assert!(c.covers(100, 50) && c.covers(120, 0) && c.covers(149, 1));
        assert!(!c.covers(99, 2) && !c.covers(140, 11) && !c.covers(u64::MAX, 2));
        let all = cap(0, u64::MAX);
        assert!(all.covers(0, 1 << 40) && all.covers(u64::MAX - 1, 1));
    }

    #[test]
    fn signed_bytes_change_with_every_field() {
        let base = cap(0, 10);
        let mut other = base.clone();
        other.holder = "ac".into();
        assert_ne!(base.signed(), other.signed());
        let mut other = base.clone();
        other.write = false;
        assert_ne!(base.signed(), other.signed());
        let mut with_mac = base.clone();
        with_mac.mac = vec![1, 2, 3];
        assert_eq!(base.signed(), with_mac.signed(), "the signature is not signed");
    }

    #[test]
    fn a_receipt_vouches_for_its_own_piece() {
        let r = Receipt {
            server: 2,
            record: 5,
            owner: 7,
            file_off: 0,
            len: 10,
            expires: 1,
            holder: "x".into(),
            mac: vec![],
        };
        let p = Piece { file_off: 0, len: 10, server: 2, record: 5, skip: 0 };
        assert!(r.vouches(&p, 7));
        assert!(!r.vouches(&p, 8));
        assert!(!r.vouches(&Piece { record: 6, ..p }, 7));
        assert!(!r.vouches(&Piece { len: 9, ..p }, 7));
    }
}
