//! A server's state of the running migration: its progress counters (`cluster status`)
//! and the pulls under way. Kept apart from the protocol so the server's composition
//! (`osd.rs`) does not depend on it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Counters of the running migration on this server (`cluster status`).
#[derive(Default)]
pub(crate) struct Progress {
    /// Directory objects (and their entries) this server handed over / took over.
    pub objects_out: AtomicU64,
    pub objects_in: AtomicU64,
    pub entries_in: AtomicU64,
    /// Bytes of file data moved to other servers.
    pub bytes_out: AtomicU64,
    /// Objects still to hand over, as the walker last counted them.
    pub objects_left: AtomicU64,
    /// Bytes of file data still to move, as the walker last counted them.
    pub bytes_left: AtomicU64,
    /// Requests forwarded to their directory's home under a newer epoch.
    pub forwarded: AtomicU64,
    /// When the walker started on the running migration (its epoch).
    started: Mutex<Option<(u64, Instant)>>,
}

impl Progress {
    /// The report for `cluster status`.
    pub(crate) fn report(&self, epoch: Option<u64>) -> Option<plusfs_proto::MigrationReport> {
        let from = epoch?;
        let started = self.started.lock().filter(|(e, _)| *e == from).map(|(_, t)| t);
        Some(plusfs_proto::MigrationReport {
            from_epoch: from,
            objects_moved: self.objects_out.load(Ordering::Relaxed),
            objects_taken: self.objects_in.load(Ordering::Relaxed),
            entries_taken: self.entries_in.load(Ordering::Relaxed),
            bytes_moved: self.bytes_out.load(Ordering::Relaxed),
            objects_left: self.objects_left.load(Ordering::Relaxed),
            bytes_left: self.bytes_left.load(Ordering::Relaxed),
            millis: started.map_or(0, |t| t.elapsed().as_millis() as u64),
        })
    }

    pub(crate) fn start(&self, epoch: u64) {
        let mut s = self.started.lock();
        if s.is_none_or(|(e, _)| e != epoch) {
            *s = Some((epoch, Instant::now()));
        }
    }
}

/// Per-path single flight of pulls, so concurrent requests pull a directory once.
#[derive(Default)]
pub(crate) struct Pulls(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Pulls {
    pub(crate) fn gate(&self, path: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.0.lock();
        if m.len() > 4096 {
            m.retain(|_, g| Arc::strong_count(g) > 1);
        }
        m.entry(path.to_string()).or_default().clone()
    }
}
