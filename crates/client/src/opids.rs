//! Operation ids (client, process, sequence) of the cross-server operations a client
//! starts, and the inode numbers it leases for them.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// Operation ids and leased inode numbers of one client.
pub(crate) struct CxIds {
    pub(crate) client: u64,
    pub(crate) seq: AtomicU64,
    /// Inode numbers leased from each server (the home of the directories made with
    /// them): next, end.
    pub(crate) inos: Mutex<std::collections::HashMap<plusfs_proto::ServerId, (u64, u64)>>,
}

impl Default for CxIds {
    fn default() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        CxIds { client: h.finish(), seq: AtomicU64::new(1), inos: Mutex::default() }
    }
}
