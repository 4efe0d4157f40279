//! FUSE over io_uring: the kernel hands requests to per-CPU io_uring queues instead of
//! `read` on `/dev/fuse`, and takes answers with the command that fetches the next request,
//! so a request costs no `read`/`write` system call pair and wakes a thread on the
//! caller's CPU. Linux 6.14 and later offer it when root sets
//! `/sys/module/fuse/parameters/enable_uring` to `Y`; the mount then asks for it at `INIT`
//! and, once every queue has registered its entries, the kernel sends every request but
//! `FORGET` and `INTERRUPT` over the queues (those stay on `/dev/fuse`, where the `fuser`
//! session keeps reading).
//!
//! [`abi`] decodes requests and encodes answers, [`ring`] runs the queues, [`dispatch`]
//! serves requests through the same [`Runner`] as the `/dev/fuse` adapter.

pub mod abi;
mod dispatch;
mod ring;

use crate::runner::Runner;
use ring::{Queue, Stopped};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

/// The running io_uring transport: its queues, for their counters.
pub struct Transport {
    queues: Vec<Arc<Queue>>,
    depth: usize,
    /// Keeps the `/dev/fuse` clone the queues registered open.
    _fuse: OwnedFd,
}

impl Transport {
    /// Requests served over io_uring so far.
    pub fn served(&self) -> u64 {
        self.queues.iter().map(|q| q.served.load(Ordering::Relaxed)).sum()
    }

    /// The number of queues (one per possible CPU).
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// One line for the mount's control file.
    pub fn describe(&self) -> String {
        format!(
            "transport io_uring: {} queues x {} entries, {} requests served over them\n",
            self.queues.len(),
            self.depth,
            self.served()
        )
    }
}

/// The number of CPUs the kernel may run callers on (`/sys/devices/system/cpu/possible`,
/// e.g. `0-1`): the kernel wants one queue for each.
fn possible_cpus() -> std::io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = text.trim().split(',').filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok()).max();
    last.map(|n| n + 1).ok_or_else(|| std::io::Error::other(format!("cannot read the possible CPUs from '{text}'")))
}

/// Starts one queue per possible CPU of `depth` entries with payload buffers of `payload`
/// bytes on the session's `/dev/fuse` descriptor `fuse`, served by `runner`. `Err` when
/// the ring cannot be built or the kernel refuses the registrations within a short grace.
pub(crate) fn start(
    fuse: BorrowedFd<'_>,
    runner: Arc<Runner>,
    depth: usize,
    payload: usize,
) -> std::io::Result<Transport> {
    let fuse = fuse.try_clone_to_owned()?;
    let cpus = possible_cpus()?;
    let queues = (0..cpus)
        .map(|qid| Queue::new(qid as u16, depth, payload, fuse.as_raw_fd()).map(Arc::new))
        .collect::<std::io::Result<Vec<_>>>()?;
    let (started_tx, started_rx) = mpsc::channel();
    for q in &queues {
        let (q, runner, started) = (q.clone(), runner.clone(), started_tx.clone());
        let name = format!("plusfs-ring-{}", q.qid());
        std::thread::Builder::new().name(name).spawn(move || {
            let serve = |h, op, slot| dispatch::serve(&runner, h, op, slot);
            match q.run(&serve, |r| drop(started.send(r))) {
                Stopped::Unmounted => tracing::debug!(qid = q.qid(), "FUSE ring queue ended: unmounted"),
                // The kernel would go on queueing this CPU's requests on the queue, which
                // nobody serves any more: end the mount (its callers get ENOTCONN, unsynced
                // delegated work is lost as after kill -9) rather than hang them.
                Stopped::Failed(e) => {
                    tracing::error!(qid = q.qid(), error = %e, "FUSE ring queue failed: the mount ends");
                    std::process::exit(2);
                }
            }
        })?;
    }
    drop(started_tx);
    // Every queue says whether the kernel took its entries.
    for _ in &queues {
        started_rx.recv().map_err(|_| std::io::Error::other("a FUSE ring thread ended before it started"))??;
    }
    Ok(Transport { queues, depth, _fuse: fuse })
}
