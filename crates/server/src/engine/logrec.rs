//! The one layer every record a protocol keeps goes through: prepare and coordinator
//! records of two-phase commits, Cx records, delegations, the migration's outbox and
//! receipts, and the index of file-data records. Each is encoded with postcard and framed
//! with its format version and a checksum ([`plusfs_store::record`]); a reader gets a
//! typed value or an error naming the record.

use super::errors::{err, OpResult};
use super::Engine;
use plusfs_proto::{DirObject, Errno, TxId};
use plusfs_store::{record, Batch, LogKind, StoreError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why stored bytes are not a record of the type asked for.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    #[error(transparent)]
    Frame(#[from] record::FrameError),
    #[error("unknown format version {0}")]
    Version(u8),
    #[error("undecodable: {0}")]
    Decode(#[from] postcard::Error),
}

/// The `upgrade` of a type with one format: any other version is unknown.
pub(crate) fn no_upgrade<T>(version: u8, _: &[u8]) -> Result<T, RecordError> {
    Err(RecordError::Version(version))
}

/// The `legacy` of a type whose format 1 is the layout earlier builds wrote unframed
/// (from before ancestries had ACL elements).
pub(crate) fn unframed<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, RecordError> {
    Ok(plusfs_proto::record::legacy_ancestry(|| postcard::from_bytes(bytes))?)
}

/// The `upgrade` of a type holding directory ancestries (directory objects, sub-operations)
/// whose format `current - 1` is its layout before ancestries had quota trees, and format
/// `current - 2` its layout before they had ACL elements.
pub(crate) fn older_ancestries<T: DeserializeOwned>(version: u8, body: &[u8], current: u8) -> Result<T, RecordError> {
    use plusfs_proto::record::{acl_ancestry, legacy_ancestry};
    match current - version {
        1 => Ok(acl_ancestry(|| postcard::from_bytes(body))?),
        2 => Ok(legacy_ancestry(|| postcard::from_bytes(body))?),
        _ => Err(RecordError::Version(version)),
    }
}

/// A record kept in the store's log under `KIND`, in format `VERSION`.
pub(crate) trait Logged: Serialize + DeserializeOwned {
    /// The log it is kept in.
    const KIND: LogKind;
    /// Its format version (raised when its layout changes; readers of older versions
    /// decode them in [`Logged::upgrade`]).
    const VERSION: u8 = 1;
    /// What the record is, for errors.
    const WHAT: &'static str;
    /// A record of an older format `version`, decoded into the current one.
    fn upgrade(version: u8, body: &[u8]) -> Result<Self, RecordError> {
        no_upgrade(version, body)
    }
    /// A record written unframed by an earlier build (by default: postcard of the layout
    /// of format 1).
    fn legacy(bytes: &[u8]) -> Result<Self, RecordError> {
        unframed(bytes)
    }
}

/// `rec` framed as format `version`.
pub(crate) fn encode_framed<T: Serialize>(version: u8, rec: &T) -> Vec<u8> {
    record::frame(version, &super::encode(rec))
}

/// A record of type `T`: framed in the current `version`, in an older one (through
/// `upgrade`), or unframed by an earlier build (through `legacy`).
pub(crate) fn decode_framed<T: DeserializeOwned>(
    bytes: &[u8],
    version: u8,
    upgrade: impl FnOnce(u8, &[u8]) -> Result<T, RecordError>,
    legacy: impl FnOnce(&[u8]) -> Result<T, RecordError>,
) -> Result<T, RecordError> {
    if !record::is_framed(bytes) {
        return legacy(bytes);
    }
    let (v, body) = record::unframe(bytes)?;
    if v == version {
        Ok(postcard::from_bytes(body)?)
    } else {
        upgrade(v, body)
    }
}

/// A log record decoded, or the store's "corrupt" error naming it.
pub(crate) fn decode<R: Logged>(key: TxId, bytes: &[u8]) -> Result<R, StoreError> {
    decode_framed(bytes, R::VERSION, R::upgrade, R::legacy)
        .map_err(|e| StoreError::Corrupt { key: format!("{} {key}", R::WHAT), reason: e.to_string() })
}

/// Adds `rec` under `key` to `b`.
pub(crate) fn put<R: Logged>(b: &mut Batch, key: TxId, rec: &R) {
    b.put_log(R::KIND, key, encode_framed(R::VERSION, rec));
}

impl Engine {
    /// The record of type `R` under `key`, if any.
    pub(crate) fn log_get<R: Logged>(&self, key: TxId) -> OpResult<Option<R>> {
        let corrupt = |e: StoreError| err(Errno::EIO, e.to_string());
        match self.store.get_log(R::KIND, key).map_err(corrupt)? {
            Some(bytes) => decode(key, &bytes).map(Some).map_err(corrupt),
            None => Ok(None),
        }
    }

    /// Every record of type `R`, by key.
    pub(crate) fn log_all<R: Logged>(&self) -> Result<Vec<(TxId, R)>, StoreError> {
        let mut out = Vec::new();
        for (key, bytes) in self.store.log_records(R::KIND)? {
            out.push((key, decode(key, &bytes)?));
        }
        Ok(out)
    }
}

/// A directory object handed to its new home and kept until the new home confirms it
/// (the migration's outbox), keyed by the path's hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Outbox {
    pub(crate) path: String,
    pub(crate) object: DirObject,
}

impl Logged for Outbox {
    const KIND: LogKind = LogKind::Outbox;
    const WHAT: &'static str = "outbox record";
    const VERSION: u8 = 3;
    fn upgrade(version: u8, body: &[u8]) -> Result<Self, RecordError> {
        older_ancestries(version, body, Self::VERSION)
    }
}

/// A directory object taken over from its old home during the migration that started
/// from epoch `of` (so a late hand-over of the same object is not taken twice), keyed by
/// the path's hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Receipt {
    pub(crate) path: String,
    pub(crate) incarnation: u64,
    pub(crate) of: u64,
}

impl Logged for Receipt {
    const KIND: LogKind = LogKind::Receipt;
    const WHAT: &'static str = "receipt";
}

/// A shard of a distributed directory moving from one storing server to another, on
/// either side, keyed by the path's hash. `set` is the storing set after the move.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ShardMove {
    pub(crate) path: String,
    pub(crate) ino: u64,
    pub(crate) incarnation: u64,
    /// The server giving the shard and the one taking it.
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) set: Vec<u32>,
    pub(crate) stage: MoveStage,
}

/// Where a shard move stands on the server keeping the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum MoveStage {
    /// Taker: the home chose this server; the shard is to be pulled.
    Expected,
    /// Taker: stored here; the giver has not confirmed dropping its copy.
    Taken,
    /// Giver: handed over (no longer served here); its entries stay until `ShardDone`.
    Out(Box<DirObject>),
    /// Giver: gone; requests about it are redirected to `set`.
    Gone,
}

impl Logged for ShardMove {
    const KIND: LogKind = LogKind::ShardMove;
    const WHAT: &'static str = "shard move record";
    const VERSION: u8 = 3;
    fn upgrade(version: u8, body: &[u8]) -> Result<Self, RecordError> {
        older_ancestries(version, body, Self::VERSION)
    }
}

/// A shared inode a drained server handed to its heir `to`, keyed by inode number: the
/// drained server redirects requests about it there until every link names the heir.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct InodeMoved {
    pub(crate) to: u32,
}

impl Logged for InodeMoved {
    const KIND: LogKind = LogKind::InodeMove;
    const WHAT: &'static str = "inode move record";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_its_type_and_a_damaged_one_names_itself() {
        let rec = Receipt { path: "/d".into(), incarnation: 3, of: 7 };
        let mut b = Batch::new();
        put(&mut b, 42, &rec);
        let plusfs_store::BatchOp::PutLog(LogKind::Receipt, 42, bytes) = &b.ops[0] else {
            panic!("a receipt is put in the receipt log: {:?}", b.ops[0]);
        };
        let back: Receipt = decode(42, bytes).unwrap();
        assert_eq!((back.path.as_str(), back.incarnation, back.of), ("/d", 3, 7));
        let mut torn = bytes.clone();
        torn[9] ^= 0x40;
        let e = decode::<Receipt>(42, &torn).unwrap_err().to_string();
        assert!(e.contains("receipt 42") && e.contains("checksum"), "{e}");
    }

    #[test]
    fn a_record_of_an_earlier_build_still_reads() {
        let legacy = postcard::to_allocvec(&("/d".to_string(), 3u64, 7u64)).unwrap();
        let back: Receipt = decode(1, &legacy).unwrap();
        assert_eq!((back.path.as_str(), back.incarnation, back.of), ("/d", 3, 7));
    }

    #[test]
    fn an_unknown_version_is_refused_not_misread() {
        let bytes = encode_framed(9, &Receipt { path: "/d".into(), incarnation: 1, of: 1 });
        let e = decode::<Receipt>(1, &bytes).unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");
    }
}
