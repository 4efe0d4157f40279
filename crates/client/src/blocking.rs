//! A synchronous facade over [`Client`].

use crate::error::FsError;
use crate::fs::{Client, ClientOptions, FileHandle};
use plusfs_rpc::CountersSnapshot;
use plusfs_placement::ClusterMap;
use plusfs_proto::{Attr, DirEntry, SetAttr, Statfs};
use tokio::runtime::Runtime;

/// Blocking client: owns a small runtime and runs each call to completion on it.
pub struct BlockingClient {
    rt: Runtime,
    inner: Client,
}

impl BlockingClient {
    /// A blocking client for `map`.
    pub fn new(map: ClusterMap, opts: ClientOptions) -> std::io::Result<BlockingClient> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let inner = {
            let _g = rt.enter();
            Client::new(map, opts)
        };
        Ok(BlockingClient { rt, inner })
    }

    /// The async client inside.
    pub fn inner(&self) -> &Client {
        &self.inner
    }

    pub fn counters(&self) -> CountersSnapshot {
        self.inner.counters()
    }
    pub fn mkdir(&self, p: &str, mode: u32) -> Result<Attr, FsError> {
        self.rt.block_on(self.inner.mkdir(p, mode))
    }
    pub fn rmdir(&self, p: &str) -> Result<(), FsError> {
        self.rt.block_on(self.inner.rmdir(p))
    }
    pub fn create(&self, p: &str, mode: u32, exclusive: bool) -> Result<FileHandle, FsError> {
        self.rt.block_on(self.inner.create(p, mode, exclusive))
    }
    pub fn open(&self, p: &str) -> Result<FileHandle, FsError> {
        self.rt.block_on(self.inner.open(p))
    }
    pub fn close(&self, fh: &FileHandle) -> Result<(), FsError> {
        self.rt.block_on(self.inner.close(fh))
    }
    pub fn stat(&self, p: &str) -> Result<Attr, FsError> {
        self.rt.block_on(self.inner.lstat(p))
    }
    pub fn unlink(&self, p: &str) -> Result<(), FsError> {
        self.rt.block_on(self.inner.unlink(p))
    }
    pub fn readdir(&self, p: &str) -> Result<Vec<DirEntry>, FsError> {
        self.rt.block_on(self.inner.readdir(p))
    }
    pub fn rename(&self, src: &str, dst: &str) -> Result<(), FsError> {
        self.rt.block_on(self.inner.rename(src, dst))
    }
    pub fn setattr(&self, p: &str, set: SetAttr) -> Result<Attr, FsError> {
        self.rt.block_on(self.inner.setattr(p, set))
    }
    pub fn symlink(&self, target: &str, link: &str) -> Result<Attr, FsError> {
        self.rt.block_on(self.inner.symlink(target, link))
    }
    pub fn readlink(&self, p: &str) -> Result<String, FsError> {
        self.rt.block_on(self.inner.readlink(p))
    }
    pub fn statfs(&self) -> Result<Statfs, FsError> {
        self.rt.block_on(self.inner.statfs())
    }
}
