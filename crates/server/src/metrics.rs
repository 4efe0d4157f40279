//! Server counters: operations by type, messages and bytes. Names are the opcode names of
//! `plusfs_proto::OPCODE_NAMES`, the single list `plusfs cluster status` prints.

use plusfs_proto::OPCODE_NAMES;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one server process since it started.
pub struct Metrics {
    ops: [AtomicU64; OPCODE_NAMES.len()],
    pub msgs_in: AtomicU64,
    pub msgs_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub tx_started: AtomicU64,
}

/// Counters of a server process's connections (kept by its network side, whether or not
/// it serves yet).
#[derive(Default)]
pub struct NetCounters {
    /// Connections open now.
    pub connections: AtomicU64,
    /// TLS handshakes that admitted a peer, and connections refused (handshake failed,
    /// timed out, revoked certificate).
    pub tls_handshakes: AtomicU64,
    pub tls_refusals: AtomicU64,
    /// Requests refused because the peer's identity does not allow them.
    pub refused_requests: AtomicU64,
    /// Connections closed for want of traffic: idle past the limit, a handshake not done
    /// in time, a peer not reading its replies.
    pub closed_idle: AtomicU64,
    /// Times a connection stopped being read until its identity's (or the server's)
    /// memory budget had room for its next request.
    pub budget_waits: AtomicU64,
    /// Requests refused with ENOSPC because the server's disk is down to its floor.
    pub space_refusals: AtomicU64,
}

impl NetCounters {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
            msgs_in: AtomicU64::new(0),
            msgs_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            tx_started: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts one served operation.
    pub fn count_op(&self, opcode: u16) {
        if let Some(c) = self.ops.get(opcode as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Non-zero operation counters as (name, count).
    pub fn ops(&self) -> Vec<(String, u64)> {
        self.ops
            .iter()
            .enumerate()
            .map(|(i, c)| (OPCODE_NAMES[i].to_string(), c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
