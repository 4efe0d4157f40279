//! Identifiers: inode numbers, server ids, transaction and operation ids.

use serde::{Deserialize, Serialize};

/// Cluster-unique inode number. `1` is the root directory.
pub type Ino = u64;

/// Identifies a two-phase-commit transaction: the coordinator's id in the top 16 bits.
pub type TxId = u64;

/// Identifies a server in the cluster map.
pub type ServerId = u32;

/// Inode number of `/`.
pub const ROOT_INO: Ino = 1;

/// Identifies one Cx operation (seed 004 §III.A): the client, the process (thread) in it
/// that issued the operation, and that process's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId {
    pub client: u64,
    pub process: u32,
    pub seq: u64,
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}.{}.{}", self.client, self.process, self.seq)
    }
}
