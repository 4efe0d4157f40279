//! Huge directories (seed 001 §IV, seed 000 §2.5): the records that say whether a
//! directory's entries are spread over several servers, and where.
//!
//! A directory starts *nondistributed*: its home server (Eq. 1) holds the directory object
//! and every entry. When it holds more entries than its threshold, the home (the *primary*)
//! moves the entries to the *storing set* by Eq. 2, `set[hash(name) % set.len()]`; each
//! storing server keeps a *shard* (a secondary directory object) with its part of the
//! entries. The primary keeps the directory's own attributes and the distribution, and
//! answers requests about entries with a redirect carrying [`DistInfo`].

use crate::ids::{Ino, ServerId};
use serde::{Deserialize, Serialize};
use std::fmt;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// When a directory is distributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Threshold {
    /// The cluster's setting (`[hugedirs] threshold` in the cluster map).
    #[default]
    Cluster,
    /// Distributed once it holds more than this many entries (`0`: from its first entry).
    Entries(u64),
    /// Never distributed.
    Never,
}

/// A threshold that is none of `never`, `cluster` and a number of entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("threshold '{0}' is not a number of entries, 'never' or 'cluster'")]
pub struct BadThreshold(pub String);

impl Threshold {
    /// Parses `never`, `cluster` or a number of entries.
    pub fn parse(s: &str) -> Result<Threshold, BadThreshold> {
        match s {
            "never" => Ok(Threshold::Never),
            "cluster" | "default" => Ok(Threshold::Cluster),
            n => n.parse::<u64>().map(Threshold::Entries).map_err(|_| BadThreshold(s.to_string())),
        }
    }

    /// This threshold with `Cluster` replaced by the cluster's setting.
    pub fn resolve(self, cluster: Threshold) -> Threshold {
        match self {
            Threshold::Cluster => cluster,
            t => t,
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Threshold::Cluster => write!(f, "cluster"),
            Threshold::Entries(n) => write!(f, "{n}"),
            Threshold::Never => write!(f, "never"),
        }
    }
}

/// The three states of a directory (seed 001 §IV.A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum DistState {
    /// Every entry is with the directory object on its home server.
    #[default]
    Nondistributed,
    /// The primary is moving entries to the storing set; writers wait.
    Distributing,
    /// Entries live on the storing set by Eq. 2.
    Distributed,
}

impl fmt::Display for DistState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DistState::Nondistributed => "nondistributed",
            DistState::Distributing => "distributing",
            DistState::Distributed => "distributed",
        })
    }
}

/// Distribution policy and state, kept durably in the primary directory object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Distribution {
    pub threshold: Threshold,
    /// Number of storing servers (0: the cluster's setting).
    pub width: u32,
    pub state: DistState,
    /// The storing set, in Eq. 2 order (empty while nondistributed).
    pub set: Vec<ServerId>,
}

/// What a client needs to route requests about entries of a distributed directory: sent
/// with every redirect and cached by clients with the incarnation (seed 001 §IV.C).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistInfo {
    /// The directory's path when the information was sent.
    pub path: String,
    pub ino: Ino,
    /// Incarnation of the directory; shards refuse requests carrying another one.
    pub incarnation: u64,
    pub state: DistState,
    pub set: Vec<ServerId>,
}

impl DistInfo {
    /// The storing server of entry `name` (seed 001 Eq. 2).
    pub fn server_of(&self, name: &str) -> ServerId {
        self.set[slot_of(name, self.set.len())]
    }

    /// The storing servers, each once, in the order of their first slot (a server that
    /// took a drained server's slots holds several).
    pub fn servers(&self) -> Vec<ServerId> {
        distinct(&self.set)
    }
}

/// The servers of storing set `set`, each once, in the order of their first slot.
pub fn distinct(set: &[ServerId]) -> Vec<ServerId> {
    let mut out: Vec<ServerId> = Vec::with_capacity(set.len());
    for &s in set {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Index into a storing set of `len` servers for entry `name` (Eq. 2).
pub fn slot_of(name: &str, len: usize) -> usize {
    (name_hash(name) % len.max(1) as u64) as usize
}

/// The hash of an entry name used by Eq. 2 (seeded differently from the path hash, so
/// entry placement and directory placement are independent).
pub fn name_hash(name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), 0x0068_7567_6564_6972)
}

/// A directory's distribution as `plusfs stat` and `cluster status` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DistReport {
    pub path: String,
    pub state: DistState,
    /// The directory's own threshold setting, and what it resolves to on this cluster.
    pub threshold: Threshold,
    pub effective: Threshold,
    pub width: u32,
    pub set: Vec<ServerId>,
    /// Entries held by each storing server (or the home while nondistributed).
    pub entries: Vec<(ServerId, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse() {
        assert_eq!(Threshold::parse("never"), Ok(Threshold::Never));
        assert_eq!(Threshold::parse("0"), Ok(Threshold::Entries(0)));
        assert_eq!(Threshold::parse("8000"), Ok(Threshold::Entries(8000)));
        assert!(Threshold::parse("-1").is_err());
        assert_eq!(Threshold::Cluster.resolve(Threshold::Entries(5)), Threshold::Entries(5));
        assert_eq!(Threshold::Never.resolve(Threshold::Entries(5)), Threshold::Never);
    }

    #[test]
    fn eq2_spreads_names_evenly() {
        let mut counts = [0u32; 8];
        for i in 0..80_000 {
            counts[slot_of(&format!("file.{i}"), 8)] += 1;
        }
        for c in counts {
            assert!((9_500..=10_500).contains(&c), "{counts:?}");
        }
    }
}

/// Waiting for a directory that is being distributed (`Distributing`): short sleeps first,
/// then at most 200 ms each, until `limit` has passed. Clients and servers that meet such a
/// directory wait the same way.
#[derive(Debug)]
pub struct DistributionWait {
    limit: std::time::Duration,
    waited: std::time::Duration,
    round: u32,
}

impl DistributionWait {
    /// A wait that gives up after `limit`.
    pub fn new(limit: std::time::Duration) -> DistributionWait {
        DistributionWait { limit, waited: std::time::Duration::ZERO, round: 0 }
    }

    /// Sleeps once; false (without sleeping) once `limit` has passed.
    pub async fn wait(&mut self) -> bool {
        if self.waited >= self.limit {
            return false;
        }
        self.round += 1;
        let step = std::time::Duration::from_millis((1u64 << self.round.min(8)).min(200));
        tokio::time::sleep(step).await;
        self.waited += step;
        true
    }
}
