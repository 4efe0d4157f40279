//! Per-operation counters of a mount, and the control file that shows them.
//!
//! Every kernel request the adapter serves is counted under its FUSE operation name with
//! the server requests it sent (counted on its task, `plusfs_client::counting`), so a
//! benchmark can report server requests per file operation. The counts are read from the
//! read-only file [`STATS_FILE`] in the mount's root, which is not listed and cannot be
//! changed; `plusfs mount --stats MOUNTPOINT` prints it. After the table it shows the
//! directory delegations the mount holds and the operations queued under them.

use plusfs_proto::{Attr, FileKind, Timespec};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::{Mutex, MutexGuard};

/// Name of the control file in the mount's root (reserved: a cluster entry of that name
/// in `/` is hidden by the mount).
pub const STATS_FILE: &str = ".plusfs-stats";
/// Inode number of the control file. Cluster inode numbers are `(server + 1) << 48 |
/// sequence` and never reach it.
pub const STATS_INO: u64 = u64::MAX - 1;

/// Counts of one FUSE operation since the mount started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpStats {
    /// FUSE operation (`lookup`, `create`, ...).
    pub op: &'static str,
    /// Requests the kernel sent.
    pub calls: u64,
    /// Of them, answered with an error.
    pub errors: u64,
    /// Server requests they sent.
    pub requests: u64,
    /// Time the mount spent on them, from the request's arrival to its answer, in
    /// microseconds.
    pub micros: u64,
}

/// The counters, by operation, and the snapshots open readers of the control file hold.
#[derive(Default)]
pub(crate) struct Stats {
    ops: Mutex<BTreeMap<&'static str, OpStats>>,
    readers: Mutex<HashMap<u64, Vec<u8>>>,
}

impl Stats {
    fn ops(&self) -> MutexGuard<'_, BTreeMap<&'static str, OpStats>> {
        self.ops.lock().expect("mount stats")
    }

    fn readers(&self) -> MutexGuard<'_, HashMap<u64, Vec<u8>>> {
        self.readers.lock().expect("stats readers")
    }

    /// Counts one `op` that sent `requests` server requests and took `micros`.
    pub fn record(&self, op: &'static str, requests: u64, micros: u64, ok: bool) {
        let mut ops = self.ops();
        let s = ops.entry(op).or_insert(OpStats { op, calls: 0, errors: 0, requests: 0, micros: 0 });
        s.calls += 1;
        s.errors += u64::from(!ok);
        s.requests += requests;
        s.micros += micros;
    }

    /// The counts now, by operation name.
    pub fn snapshot(&self) -> Vec<OpStats> {
        self.ops().values().copied().collect()
    }

    /// A reader opened the control file under handle `fh`: it reads the counts of now,
    /// followed by `extra` lines.
    pub fn open(&self, fh: u64, extra: &str) {
        let text = (render_stats(&self.snapshot()) + extra).into_bytes();
        self.readers().insert(fh, text);
    }

    /// Up to `size` bytes at `offset` of what reader `fh` reads.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let readers = self.readers();
        let text = readers.get(&fh).map(Vec::as_slice).unwrap_or_default();
        let start = (offset as usize).min(text.len());
        let end = start.saturating_add(size as usize).min(text.len());
        text[start..end].to_vec()
    }

    /// Reader `fh` closed the control file.
    pub fn release(&self, fh: u64) {
        self.readers().remove(&fh);
    }
}

/// The control file's text: a header, one line per operation (`op calls errors requests
/// requests/call µs/call`, the last the mean time the mount took to answer), and a total
/// line.
pub fn render_stats(stats: &[OpStats]) -> String {
    let mut out = format!(
        "{:<12} {:>12} {:>10} {:>14} {:>10} {:>10}\n",
        "op", "calls", "errors", "requests", "req/call", "us/call"
    );
    let mut total = OpStats { op: "total", calls: 0, errors: 0, requests: 0, micros: 0 };
    for s in stats {
        total.calls += s.calls;
        total.errors += s.errors;
        total.requests += s.requests;
        total.micros += s.micros;
    }
    for s in stats.iter().chain([&total]) {
        let calls = s.calls.max(1) as f64;
        let (per, us) = (s.requests as f64 / calls, s.micros as f64 / calls);
        let _ = writeln!(
            out,
            "{:<12} {:>12} {:>10} {:>14} {:>10.2} {:>10.1}",
            s.op, s.calls, s.errors, s.requests, per, us
        );
    }
    out
}

/// Attributes of the control file: read-only for everyone, size 0 (it is read with
/// direct I/O, to its end).
pub fn stats_attr() -> Attr {
    let now = Timespec::now();
    Attr {
        ino: STATS_INO,
        kind: FileKind::File,
        mode: 0o444,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        incarnation: 0,
        rdev: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_and_read_in_pieces() {
        let s = Stats::default();
        s.record("lookup", 1, 30, true);
        s.record("lookup", 0, 10, false);
        s.record("create", 2, 50, true);
        let snap = s.snapshot();
        assert_eq!(snap[1], OpStats { op: "lookup", calls: 2, errors: 1, requests: 1, micros: 40 });
        s.open(7, "");
        let all = s.read(7, 0, 1 << 20);
        let text = String::from_utf8(all.clone()).unwrap();
        assert!(text
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["total", "3", "1", "3", "1.00", "30.0"]));
        assert_eq!([s.read(7, 0, 10), s.read(7, 10, 1 << 20)].concat(), all);
        assert!(s.read(7, all.len() as u64 + 5, 10).is_empty());
        s.release(7);
        assert!(s.read(7, 0, 10).is_empty());
    }
}
