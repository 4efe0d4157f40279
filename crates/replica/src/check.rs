//! Comparing the members of a group (`fsck --replicas`): each member's store is summed up
//! as its applied log position and a digest of every key and value (the replica's own
//! keys aside), read from one RocksDB snapshot, so the two belong together. Members at the
//! same position must have the same digest; a difference is divergence.

use crate::StoreOpenError;
use rocksdb::{IteratorMode, ReadOptions, DB};
use std::collections::BTreeMap;
use xxhash_rust::xxh3::Xxh3;

/// One member's store, summed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    /// The log index the store reflects (0 before any entry).
    pub applied: u64,
    /// xxh3 of the store's keys and values, in key order.
    pub digest: u64,
    /// Keys counted.
    pub keys: u64,
}

/// The log index the store `db` reflects now (0 before any entry).
pub fn applied(db: &DB) -> Result<u64, StoreOpenError> {
    let applied: Option<openraft::LogId<u64>> =
        match db.get(crate::sm::APPLIED).map_err(StoreOpenError::rocks("cannot read the applied position"))? {
            Some(v) => postcard::from_bytes(&v).map_err(StoreOpenError::decode("applied position"))?,
            None => None,
        };
    Ok(applied.map_or(0, |l| l.index))
}

/// Sums up the store `db` as of one snapshot.
pub fn digest(db: &DB) -> Result<Digest, StoreOpenError> {
    let snap = db.snapshot();
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snap);
    let applied: Option<openraft::LogId<u64>> =
        match snap.get(crate::sm::APPLIED).map_err(StoreOpenError::rocks("cannot read the applied position"))? {
            Some(v) => postcard::from_bytes(&v).map_err(StoreOpenError::decode("applied position"))?,
            None => None,
        };
    let mut h = Xxh3::new();
    let mut keys = 0;
    for kv in db.iterator_opt(IteratorMode::Start, opts) {
        let (k, v) = kv.map_err(StoreOpenError::rocks("cannot read the store"))?;
        if k.first() == Some(&0) {
            continue;
        }
        h.update(&(k.len() as u32).to_le_bytes());
        h.update(&k);
        h.update(&(v.len() as u32).to_le_bytes());
        h.update(&v);
        keys += 1;
    }
    Ok(Digest { applied: applied.map_or(0, |l| l.index), digest: h.digest(), keys })
}

/// What a comparison of members found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every member at the same position, with the same contents.
    Same(Digest),
    /// Members at the same position whose contents differ: member → its digest.
    Diverged(BTreeMap<u64, Digest>),
    /// Members at different positions (writes still arriving): compare again when quiet.
    Moving(BTreeMap<u64, Digest>),
}

/// Compares members' digests (member id → digest).
pub fn compare(digests: &BTreeMap<u64, Digest>) -> Verdict {
    let mut by_pos: BTreeMap<u64, Vec<&Digest>> = BTreeMap::new();
    for d in digests.values() {
        by_pos.entry(d.applied).or_default().push(d);
    }
    if by_pos.values().any(|ds| ds.iter().any(|d| d.digest != ds[0].digest)) {
        return Verdict::Diverged(digests.clone());
    }
    match by_pos.len() {
        1 => Verdict::Same(*digests.values().next().expect("a member")),
        _ => Verdict::Moving(digests.clone()),
    }
}
