//! The cluster-map epoch a process routes with, and whether a peer has spoken a newer one.
//!
//! Every frame carries the low 16 bits of its sender's epoch. A process that sees a newer
//! one (a server answering a client, a client or peer calling a server) fetches the map
//! again: that is how an epoch spreads without any broadcast having to reach everyone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;

/// One process's epoch and the hint that a newer one exists.
#[derive(Debug, Default)]
pub struct EpochWatch {
    current: AtomicU64,
    stale: AtomicBool,
    newer: Notify,
}

impl EpochWatch {
    /// The epoch of the map this process routes with (0: not told).
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    /// This process now routes with a map of `epoch`.
    pub fn set_current(&self, epoch: u64) {
        self.current.fetch_max(epoch, Ordering::AcqRel);
        self.stale.store(false, Ordering::Release);
    }

    /// A peer's frame carried the epoch hint `hint`; notes if it is newer than ours.
    pub fn note_hint(&self, hint: u16) {
        if plusfs_proto::epoch_is_newer(hint, self.current()) && !self.stale.swap(true, Ordering::AcqRel) {
            self.newer.notify_one();
        }
    }

    /// Whether a peer has spoken of a newer epoch than ours since we last installed a map.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// Waits until a peer speaks of a newer epoch than ours.
    pub async fn newer(&self) {
        loop {
            let wait = self.newer.notified();
            if self.is_stale() {
                return;
            }
            wait.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_hints_mark_stale_until_a_map_is_installed() {
        let w = EpochWatch::default();
        w.set_current(5);
        w.note_hint(5);
        w.note_hint(4);
        w.note_hint(0);
        assert!(!w.is_stale());
        w.note_hint(6);
        assert!(w.is_stale());
        w.set_current(6);
        assert!(!w.is_stale());
        // Wrapping: epoch 65,535 then hint 1 (epoch 65,537) is newer.
        w.set_current(65_535);
        w.note_hint(1);
        assert!(w.is_stale());
    }
}
