//! The one bridge from synchronous callers to the async [`Client`]: the FUSE mount, the C
//! library and the Python module all call through a [`BlockingClient`].
//!
//! # Fork
//!
//! A tokio runtime does not survive `fork(2)`: the child has a copy of the parent's memory
//! but only the thread that forked, so the runtime's workers, timers and I/O driver are
//! gone, and its sockets (and its epoll instance) are shared with the parent. Python's
//! `multiprocessing` (fork start method) and MPI launchers fork processes that already
//! hold a client, and a C or Python user expects the handle to keep working there.
//!
//! So a [`BlockingClient`] notes the process that built its runtime, and when it is used
//! in another process (a forked child) it transparently builds a **fresh runtime and a
//! fresh client** there, from the same cluster map and options: new connections, an empty
//! directory-distribution cache, operation ids and inode leases of its own. The table of
//! descriptors (`open_fd`, `openv`) is kept, as a forked process keeps its file
//! descriptors (servers keep no per-descriptor state). A client built over another
//! transport (the in-process test cluster) is rebuilt over TCP from its map. The parent's
//! runtime and client are never dropped in the child: that would wait for worker threads
//! that do not exist there and unregister sockets from an epoll instance the parent still
//! uses. The check is one `getpid` per call and takes no lock, so it cannot deadlock on a
//! lock held by a thread of the parent at the time of the fork.

use crate::error::FsError;
use crate::fs::Client;
use crate::types::{ClientOptions, FileHandle};
use plusfs_placement::ClusterMap;
use plusfs_proto::{Attr, DirEntry, SetAttr, Statfs};
use plusfs_rpc::{CountersSnapshot, Pool};
use std::future::Future;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;
use tokio::runtime::Runtime;

/// A runtime and the client whose connections live on it, built in process `pid`.
struct Engine {
    pid: u32,
    rt: Runtime,
    client: Client,
}

/// `Engine` is shared between threads by reference and moved with its owner.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<Engine>();
};

impl Engine {
    /// A runtime of `workers` threads and the client `make` builds inside it.
    fn build(workers: usize, make: impl FnOnce() -> Client) -> std::io::Result<Engine> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name("plusfs-bridge")
            .enable_all()
            .build()?;
        let client = {
            let _g = rt.enter();
            make()
        };
        Ok(Engine { pid: std::process::id(), rt, client })
    }

    /// The engine of a forked child: same map, options and descriptors as `parent`'s
    /// client, fresh runtime and connections.
    fn forked_from(parent: &Engine, workers: usize) -> std::io::Result<Engine> {
        let old = &parent.client;
        Engine::build(workers, || {
            let (map, opts) = (ClusterMap::clone(&old.map()), old.opts.clone());
            let pool = Arc::new(Pool::new(&map, opts.conns_per_server, opts.retries));
            let mut client = Client::with_pool(map, opts, pool);
            client.fds = old.fds.clone();
            client
        })
    }
}

/// A blocking client: owns a runtime and a [`Client`] on it, runs each call to completion
/// on the calling thread, and starts afresh in a forked child (see the module
/// documentation). Shareable between threads; every method takes `&self`.
pub struct BlockingClient {
    /// The engine of this process. Replaced only in a forked child, where the replaced
    /// one (the parent's) is leaked on purpose; freed only by `drop`.
    engine: AtomicPtr<Engine>,
    workers: usize,
}

impl BlockingClient {
    /// A blocking client for `map` on a runtime of one worker thread.
    pub fn new(map: ClusterMap, opts: ClientOptions) -> std::io::Result<BlockingClient> {
        BlockingClient::with_workers(map, opts, 1)
    }

    /// A blocking client for `map` on a runtime of `workers` threads.
    pub fn with_workers(map: ClusterMap, opts: ClientOptions, workers: usize) -> std::io::Result<BlockingClient> {
        BlockingClient::build(workers, || Client::new(map, opts))
    }

    /// A blocking client over `client` (built anywhere) on a runtime of `workers` threads.
    pub fn from_client(client: Client, workers: usize) -> std::io::Result<BlockingClient> {
        BlockingClient::build(workers, || client)
    }

    fn build(workers: usize, make: impl FnOnce() -> Client) -> std::io::Result<BlockingClient> {
        let engine = Box::new(Engine::build(workers, make)?);
        Ok(BlockingClient { engine: AtomicPtr::new(Box::into_raw(engine)), workers })
    }

    /// The engine of the calling process, built on first use in a forked child.
    ///
    /// # Panics
    /// When a forked child cannot start the threads of its runtime.
    fn engine(&self) -> &Engine {
        loop {
            let current = self.engine.load(Ordering::Acquire);
            // SAFETY: the pointer comes from `Box::into_raw` and is freed only by `drop`
            // (which has `&mut self`), so it outlives `&self`.
            let engine = unsafe { &*current };
            if engine.pid == std::process::id() {
                return engine;
            }
            let fresh = Engine::forked_from(engine, self.workers)
                .unwrap_or_else(|e| panic!("plusfs: cannot start a runtime in a forked child: {e}"));
            let fresh = Box::into_raw(Box::new(fresh));
            if self.engine.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire).is_err() {
                // Another thread of this child renewed it first; ours never ran anything.
                // SAFETY: `fresh` was never shared.
                drop(unsafe { Box::from_raw(fresh) });
            }
            // On success the parent's engine is leaked: it belongs to the parent.
        }
    }

    /// The async client of this process (a fresh one in a forked child).
    pub fn client(&self) -> &Client {
        &self.engine().client
    }

    /// Runs `f` to completion on this process's runtime. Must not be called from inside
    /// an async task.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.engine().rt.block_on(f)
    }

    /// Runs the future `call` makes of this process's client:
    /// `bridge.run(|c| c.mkdir("/a", 0o755))`.
    pub fn run<'a, F: Future>(&'a self, call: impl FnOnce(&'a Client) -> F) -> F::Output {
        let engine = self.engine();
        engine.rt.block_on(call(&engine.client))
    }

    /// Messages, bytes and requests sent so far by this process's client.
    pub fn counters(&self) -> CountersSnapshot {
        self.client().counters()
    }

    /// `mkdir(2)`.
    pub fn mkdir(&self, p: &str, mode: u32) -> Result<Attr, FsError> {
        self.run(|c| c.mkdir(p, mode))
    }

    /// `rmdir(2)`.
    pub fn rmdir(&self, p: &str) -> Result<(), FsError> {
        self.run(|c| c.rmdir(p))
    }

    /// Creates a file (fails with EEXIST if it exists and `exclusive`).
    pub fn create(&self, p: &str, mode: u32, exclusive: bool) -> Result<FileHandle, FsError> {
        self.run(|c| c.create(p, mode, exclusive))
    }

    /// Opens an existing entry.
    pub fn open(&self, p: &str) -> Result<FileHandle, FsError> {
        self.run(|c| c.open(p))
    }

    /// Closes a handle from `open`/`create`.
    pub fn close(&self, fh: &FileHandle) -> Result<(), FsError> {
        self.run(|c| c.close(fh))
    }

    /// `lstat(2)`.
    pub fn stat(&self, p: &str) -> Result<Attr, FsError> {
        self.run(|c| c.lstat(p))
    }

    /// `unlink(2)`.
    pub fn unlink(&self, p: &str) -> Result<(), FsError> {
        self.run(|c| c.unlink(p))
    }

    /// Every entry of a directory.
    pub fn readdir(&self, p: &str) -> Result<Vec<DirEntry>, FsError> {
        self.run(|c| c.readdir(p))
    }

    /// `rename(2)`.
    pub fn rename(&self, src: &str, dst: &str) -> Result<(), FsError> {
        self.run(|c| c.rename(src, dst))
    }

    /// Changes attributes (`chmod`, `chown`, `utimens`, `truncate`).
    pub fn setattr(&self, p: &str, set: SetAttr) -> Result<Attr, FsError> {
        self.run(|c| c.setattr(p, set))
    }

    /// `symlink(2)`.
    pub fn symlink(&self, target: &str, link: &str) -> Result<Attr, FsError> {
        self.run(|c| c.symlink(target, link))
    }

    /// `readlink(2)`.
    pub fn readlink(&self, p: &str) -> Result<String, FsError> {
        self.run(|c| c.readlink(p))
    }

    /// Entry and directory-object counts of the cluster.
    pub fn statfs(&self) -> Result<Statfs, FsError> {
        self.run(|c| c.statfs())
    }
}

impl Drop for BlockingClient {
    fn drop(&mut self) {
        let engine = *self.engine.get_mut();
        // SAFETY: the pointer comes from `Box::into_raw` and nothing else frees it.
        if unsafe { (*engine).pid } == std::process::id() {
            // SAFETY: as above; `&mut self` means no reference into it is alive.
            drop(unsafe { Box::from_raw(engine) });
        }
        // Otherwise it is the parent's engine, seen in a forked child: leaked on purpose.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plusfs_placement::ServerEntry;
    use std::time::{Duration, Instant};

    /// A map of one server nobody listens on.
    fn unreachable_map() -> ClusterMap {
        ClusterMap::with_servers(vec![ServerEntry::new(0, "127.0.0.1:1".into(), 1.0)])
    }

    /// Runs a task that needs the runtime's workers and timers.
    fn spawn_and_wait(b: &BlockingClient) -> Option<u32> {
        b.block_on(async {
            let task = tokio::spawn(async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                7
            });
            tokio::time::timeout(Duration::from_secs(5), task).await.ok()?.ok()
        })
    }

    /// What the child checks; its exit code.
    fn in_child(b: BlockingClient, parent_pool: *const Pool, parent_fds: *const crate::FdTable) -> i32 {
        if spawn_and_wait(&b) != Some(7) {
            return 2;
        }
        if Arc::as_ptr(&b.client().pool) == parent_pool {
            return 3;
        }
        if Arc::as_ptr(&b.client().fds) != parent_fds {
            return 4;
        }
        // A network call through the fresh client finishes (refused: nobody listens).
        if b.stat("/").is_ok() {
            return 5;
        }
        drop(b); // frees the child's engine only
        0
    }

    /// Waits up to 30 s for `pid`; its exit code, or None if it hung (then killed).
    fn wait_child(pid: libc::pid_t) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut status = 0;
        loop {
            // SAFETY: plain waitpid on our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
            }
            if Instant::now() > deadline {
                // SAFETY: killing and reaping our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_forked_child_gets_a_fresh_runtime_and_client() {
        let opts = ClientOptions { retries: 0, ..ClientOptions::default() };
        let b = BlockingClient::new(unreachable_map(), opts).expect("bridge");
        assert_eq!(spawn_and_wait(&b), Some(7));
        assert!(b.stat("/").is_err(), "nobody listens");
        let (pool, fds) = (Arc::as_ptr(&b.client().pool), Arc::as_ptr(&b.client().fds));
        // SAFETY: the child only runs Rust code of this test and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| in_child(b, pool, fds)));
            // SAFETY: ends the child without running the test harness's exit path.
            unsafe { libc::_exit(code.unwrap_or(101)) };
        }
        assert_eq!(wait_child(pid), Some(0), "the child's calls through the bridge (see `in_child` for codes)");
        // The parent's runtime is untouched by the child.
        assert_eq!(spawn_and_wait(&b), Some(7));
        assert_eq!(Arc::as_ptr(&b.client().pool), pool);
    }
}
