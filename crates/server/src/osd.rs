//! The OSD+ core: one server's directory objects and the operations on them.
//!
//! Every request arrives at the server that homes the directory it concerns (the client
//! routes with Eq. 1). Single-server operations read, check and write one atomic store
//! batch under the directory's busy lock. Operations that touch another server (mkdir and
//! rmdir when the child object lives elsewhere, renames across servers, every directory
//! rename) run a logged two-phase commit coordinated from here (`txn.rs`).

use crate::hugedir::Via;
use crate::ids::IdAllocator;
use crate::links::Found;
use crate::locks::{LockTable, Scope};
use crate::failpoint::Failpoints;
use crate::metrics::Metrics;
use plusfs_rpc::Pool;
use plusfs_placement::ClusterMap;
use plusfs_proto::path::{self, check_name, check_wire_path};
use plusfs_proto::{
    Attr, DirEntry, DirObject, Dirents, DistState, Errno, FileKind, FsckData, Inode, Reply, Request, Response,
    ServerId, ServerStatus, SetAttr, Statfs, TimeSet, Timespec, WireError, ROOT_INO,
};
use plusfs_store::{commit, Batch, DirStore, StoreError};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Largest readdir page a server returns.
pub const MAX_READDIR_PAGE: u32 = 4096;

/// One OSD+ server's state.
pub struct Osd {
    pub id: ServerId,
    pub map: Arc<ClusterMap>,
    pub store: Arc<dyn DirStore>,
    pub locks: Arc<LockTable>,
    /// Connections to the other servers (two-phase commit).
    pub peers: Pool,
    pub metrics: Metrics,
    inos: IdAllocator,
    pub(crate) txids: IdAllocator,
    /// Directories whose redistribution runs in a background task.
    pub(crate) distributing: Mutex<HashSet<String>>,
    /// File data stored on this server.
    pub(crate) data: Arc<plusfs_data::DataStore>,
    /// Record ids of the data store.
    pub(crate) records: IdAllocator,
    /// Held (shared) by changes of the record index, (exclusively) by compaction's switch.
    pub(crate) data_gate: tokio::sync::RwLock<()>,
    /// Pending Cx operations and their commitment.
    pub(crate) cx: crate::cx::Cx,
    /// Steps where a fault-injection test may crash or pause this server.
    pub failpoints: Arc<Failpoints>,
}

pub(crate) type OpResult<T> = Result<T, WireError>;

pub(crate) fn eio(e: StoreError) -> WireError {
    tracing::error!(cause = %e, "store failure");
    WireError::new(Errno::EIO, format!("store failure: {e}"))
}

pub(crate) fn err(errno: Errno, what: impl Into<String>) -> WireError {
    WireError::new(errno, what)
}

/// Checks a path from the wire and splits it into (parent, name).
pub(crate) fn split_entry(p: &str) -> OpResult<(&str, &str)> {
    check_wire_path(p).map_err(|e| err(e.errno, format!("{}: '{p}'", e.reason)))?;
    let (dir, name) = path::split(p).ok_or_else(|| err(Errno::EINVAL, "'/' has no parent"))?;
    check_name(name).map_err(|e| err(e.errno, format!("{}: '{p}'", e.reason)))?;
    Ok((dir, name))
}

pub(crate) fn check_dir_path(p: &str) -> OpResult<()> {
    check_wire_path(p).map_err(|e| err(e.errno, format!("{}: '{p}'", e.reason)))
}

fn resolve(t: TimeSet, now: Timespec) -> Timespec {
    match t {
        TimeSet::Now => now,
        TimeSet::At(ts) => ts,
    }
}

/// Applies a `SetAttr` to the attribute fields of an inode or directory object.
#[allow(clippy::too_many_arguments)]
fn apply_set(
    set: &SetAttr,
    mode: &mut u32,
    uid: &mut u32,
    gid: &mut u32,
    atime: &mut Timespec,
    mtime: &mut Timespec,
    ctime: &mut Timespec,
) {
    let now = Timespec::now();
    if let Some(m) = set.mode {
        *mode = m & 0o7777;
    }
    if let Some(u) = set.uid {
        *uid = u;
    }
    if let Some(g) = set.gid {
        *gid = g;
    }
    if let Some(a) = set.atime {
        *atime = resolve(a, now);
    }
    if let Some(m) = set.mtime {
        *mtime = resolve(m, now);
    }
    *ctime = now;
}

/// What only some kinds of new entries have.
pub(crate) struct NewNode {
    /// Target of a symbolic link.
    pub target: Option<String>,
    /// Device number of a device.
    pub rdev: u32,
}

/// Records an entry added to (`delta` = 1) or removed from (-1) a directory object.
pub(crate) fn count_entry(d: &mut DirObject, kind: FileKind, delta: i64) {
    d.entries = d.entries.saturating_add_signed(delta);
    if kind == FileKind::Dir {
        d.subdirs = d.subdirs.saturating_add_signed(delta);
    }
    let now = Timespec::now();
    d.mtime = now;
    d.ctime = now;
}

impl Osd {
    /// Opens the server's state over `store`, calling other servers through `peers`;
    /// creates `/` if this server is its home.
    pub async fn open(
        id: ServerId,
        map: ClusterMap,
        store: Arc<dyn DirStore>,
        data: Arc<plusfs_data::DataStore>,
        peers: Pool,
        failpoints: Arc<Failpoints>,
    ) -> Result<Arc<Osd>, StoreError> {
        let inos = IdAllocator::load(store.as_ref(), "next_ino", id)?;
        let txids = IdAllocator::load(store.as_ref(), "next_txid", id)?;
        let records = IdAllocator::load(store.as_ref(), "next_record", id)?;
        let osd = Arc::new(Osd {
            id,
            map: Arc::new(map),
            store,
            locks: Arc::default(),
            peers,
            metrics: Metrics::default(),
            inos,
            txids,
            distributing: Mutex::default(),
            data,
            records,
            data_gate: tokio::sync::RwLock::new(()),
            cx: crate::cx::Cx::default(),
            failpoints,
        });
        if osd.map.home_of_dir("/") == id && osd.store.get_dir("/")?.is_none() {
            let root = DirObject { incarnation: 1, ..DirObject::new(ROOT_INO, 0o755, 0, 0) };
            let mut b = Batch::new();
            b.put_dir("/", &root);
            commit(osd.store.as_ref(), b).await?;
            tracing::info!("created the root directory");
        }
        Ok(osd)
    }

    /// Cross-server operations this server has not finished: open two-phase commits and
    /// pending Cx operations (zero once the cluster has settled).
    pub fn pending_ops(&self) -> usize {
        self.locks.tx_count() + self.cx.gauges().0 as usize
    }

    /// Serves one request.
    pub async fn handle(self: &Arc<Self>, req: Request) -> Response {
        self.metrics.count_op(req.opcode());
        if self.locks.tx_count() > 0 {
            // A client must not see objects a pending Cx operation changes before it commits.
            let scopes = crate::cx::request_scopes(&req);
            tracing::trace!(?req, ?scopes, "settling");
            self.locks.settle(&scopes).await;
        }
        match req {
            Request::Shard { incarnation, op } => {
                self.metrics.count_op(op.opcode());
                self.dispatch(*op, Via::Shard(incarnation)).await
            }
            Request::OnInode { ino, op } => {
                self.metrics.count_op(op.opcode());
                use Request::*;
                match *op {
                    op @ (Stat { .. }
                    | Open { .. }
                    | SetAttr { .. }
                    | Write { .. }
                    | Read { .. }
                    | Fsync { .. }
                    | Xattr { .. }
                    | Readlink { .. }) => self.dispatch(op, Via::Inode(ino)).await,
                    other => Err(err(Errno::EINVAL, format!("{} does not apply to a shared inode", other.name()))),
                }
            }
            req => self.dispatch(req, Via::Home).await,
        }
    }

    /// Serves a request addressed to a directory's home (`Via::Home`) or to this server's
    /// shard of a distributed directory (only requests about entries).
    async fn dispatch(self: &Arc<Self>, req: Request, via: Via) -> Response {
        use Request::*;
        match req {
            Mkdir { path, mode, uid, gid, threshold, width } => {
                self.retrying(|| self.mkdir(&path, mode, uid, gid, (threshold, width), via)).await
            }
            Rmdir { path } => self.retrying(|| self.rmdir(&path, via)).await,
            Create { path, kind, mode, uid, gid, exclusive, rdev } => {
                let node = NewNode { target: None, rdev };
                self.create(&path, kind, mode, uid, gid, exclusive, node, via).await
            }
            Open { path } | Stat { path } => self.stat(&path, via).await,
            Close { .. } => Ok(Reply::Done),
            DirStat { path } => self.dir_stat(&path, via).await,
            Unlink { path } => self.unlink(&path, via).await,
            Readdir { path, after, limit } => self.readdir(&path, after, limit, via),
            Rename { src, dst } => self.retrying(|| self.rename(&src, &dst, via)).await,
            SetAttr { path, set } => self.set_attr(&path, &set, via).await,
            Symlink { path, target, uid, gid } => {
                let node = NewNode { target: Some(target), rdev: 0 };
                self.create(&path, FileKind::Symlink, 0o777, uid, gid, true, node, via).await
            }
            Readlink { path } => self.readlink(&path, via).await,
            Link { src, dst } => self.link(&src, &dst, via).await,
            Exchange { a, b } => self.exchange(&a, &b, via).await,
            BatchWrite { dir, files, semantics } => self.batch_write(&dir, files, semantics, via).await,
            BatchRead { dir, names, max_bytes } => self.batch_read(&dir, &names, max_bytes, via).await,
            Write { path, offset, data, append } => self.write_file(&path, offset, data, append, via).await,
            Read { path, offset, len } => self.read_file(&path, offset, len, via).await,
            Fsync { path } if !path.is_empty() => self.fsync_file(&path, via).await,
            Xattr { path, op } => self.xattr(&path, &op, via).await,
            Batch { op, dir, names, mode, uid, gid, semantics } => {
                self.batch(op, &dir, &names, mode, uid, gid, semantics, via).await
            }
            other if via != Via::Home => {
                Err(err(Errno::EINVAL, format!("{} cannot be addressed to a shard or inode", other.name())))
            }
            Ping => Ok(Reply::Pong { server: self.id, epoch: self.map.epoch }),
            DirSetAttr { path, set } => self.dir_set_attr(&path, &set).await,
            Statfs => self.statfs(),
            Status => self.status().await,
            FsckScan => self.fsck_scan(),
            TxPrepare { txid, ops } => self.tx_prepare(txid, ops).await,
            TxCommit { txid, payload } => self.tx_commit(txid, payload).await,
            TxAbort { txid } => self.tx_abort(txid).await,
            req @ (CxExec { .. } | CxVote { .. } | CxDecide { .. } | CxUrge { .. } | CxLaunch { .. }) => {
                self.handle_cx(req).await
            }
            SubExec { ops } => self.sub_exec(ops).await,
            AllocInos { count } => {
                let count = count.clamp(1, 4096);
                let first = self.inos.next_block(self.store.as_ref(), count as u64).await.map_err(eio)?;
                Ok(Reply::Inos { first, count })
            }
            CloseBatch { inos, .. } => self.closev(&inos),
            Shard { .. } | OnInode { .. } => Err(err(Errno::EINVAL, "a shard or inode request cannot be nested")),
            ShardImport { path, ino, entries, shard } => self.shard_import(&path, ino, entries, shard).await,
            SetPolicy { path, threshold, width } => self.set_policy(&path, threshold, width).await,
            DistStatus { path } => self.dist_status(&path).await,
            DataPut { owner, data } => self.data_put(owner, data).await,
            DataGet { ranges } => self.data_get(&ranges).await,
            DataDrop { records } => self.data_drop(&records).await,
            DirXattr { path, op } => self.dir_xattr(&path, &op).await,
            Compact { live_percent } => {
                self.compact_now(live_percent.min(100) as f64 / 100.0).await?;
                Ok(Reply::Done)
            }
            // An empty path (from a peer): this server's data store.
            Fsync { .. } => self.fsync_data().await,
        }
    }

    /// The directory object at `dir`, or the "missing directory" error.
    pub(crate) fn dir_object(&self, dir: &str) -> OpResult<DirObject> {
        self.store.get_dir(dir).map_err(eio)?.ok_or_else(|| WireError::missing_dir(dir))
    }

    pub(crate) async fn new_ino(&self) -> OpResult<u64> {
        self.inos.next(self.store.as_ref()).await.map_err(eio)
    }

    pub(crate) async fn write(&self, b: Batch) -> OpResult<()> {
        commit(self.store.as_ref(), b).await.map_err(eio)
    }

    /// Creates a file, FIFO or symlink entry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create(
        self: &Arc<Self>,
        p: &str,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        exclusive: bool,
        node: NewNode,
        via: Via,
    ) -> Response {
        let NewNode { target, rdev } = node;
        let (dir, name) = split_entry(p)?;
        if kind == FileKind::Dir {
            return Err(err(Errno::EINVAL, "create cannot make directories"));
        }
        let g = self.locks.lock(&[(dir.to_string(), Scope::Name(name.to_string()))], None, true).await;
        let mut host = self.host(dir, via)?;
        if !host.shard && self.over_threshold(&host.obj) {
            // Due for distribution (another writer crossed the threshold): distribute
            // first, so writers cannot keep the directory from ever being distributed.
            drop(g);
            let info = self.distribute(dir).await?;
            return Err(WireError::redirect(info.unwrap_or_else(|| self.dist_info(dir, &host.obj))));
        }
        if let Some(e) = self.store.get_entry(host.obj.ino, name).map_err(eio)? {
            return match e.kind {
                _ if exclusive => Err(err(Errno::EEXIST, format!("'{p}' exists"))),
                FileKind::Dir => Err(err(Errno::EISDIR, format!("'{p}' is a directory"))),
                _ => {
                    drop(g);
                    Ok(Reply::Attr(Attr::of_inode(&self.resolve(p, e).await?)))
                }
            };
        }
        let size = target.as_ref().map_or(0, |t| t.len() as u64);
        let rdev = if matches!(kind, FileKind::BlockDev | FileKind::CharDev) { rdev } else { 0 };
        let inode = Inode { size, target, rdev, ..Inode::new(self.new_ino().await?, kind, mode, uid, gid) };
        count_entry(&mut host.obj, kind, 1);
        let mut b = Batch::new();
        b.put_entry(host.obj.ino, name, &inode);
        host.save(&mut b, dir);
        self.write(b).await?;
        drop(g);
        if !host.shard && self.over_threshold(&host.obj) {
            // The create is done whatever happens to the distribution (a failed one stays
            // `Distributing` and is finished by the next request or restart).
            if let Err(e) = self.distribute(dir).await {
                tracing::error!(dir, cause = %e.message, "redistribution failed");
            }
        }
        Ok(Reply::Attr(Attr::of_inode(&inode)))
    }

    /// The entry `name` of `dir`, or ENOENT.
    pub(crate) fn entry(&self, d: &DirObject, p: &str, name: &str) -> OpResult<Inode> {
        self.store
            .get_entry(d.ino, name)
            .map_err(eio)?
            .ok_or_else(|| err(Errno::ENOENT, format!("'{p}' does not exist")))
    }

    /// `lstat` (and `open`) of an entry: its attributes, or `IsDir` for a subdirectory.
    pub(crate) async fn stat(self: &Arc<Self>, p: &str, via: Via) -> Response {
        let e = match self.find(p, via, false).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => return self.forward(home, ino, Request::Stat { path: p.into() }).await,
        };
        Ok(match e.kind {
            FileKind::Dir => Reply::IsDir { ino: e.ino },
            _ => Reply::Attr(Attr::of_inode(&e)),
        })
    }

    async fn dir_stat(self: &Arc<Self>, p: &str, via: Via) -> Response {
        check_dir_path(p)?;
        match via {
            Via::Home => Ok(Reply::Attr(self.dir_attr(p).await?)),
            Via::Shard(_) | Via::Inode(_) => Ok(Reply::Attr(Attr::of_dir(&self.host(p, via)?.obj))),
        }
    }

    pub(crate) async fn unlink(self: &Arc<Self>, p: &str, via: Via) -> Response {
        let (dir, name) = split_entry(p)?;
        let _g = self.locks.lock(&[(dir.to_string(), Scope::Name(name.to_string()))], None, true).await;
        let mut host = self.host(dir, via)?;
        let e = self.entry(&host.obj, p, name)?;
        if e.kind == FileKind::Dir {
            return Err(err(Errno::EISDIR, format!("'{p}' is a directory")));
        }
        if e.link_home.is_some() {
            drop(_g);
            return self.unlink_link(p, &e, via).await;
        }
        count_entry(&mut host.obj, e.kind, -1);
        let gate = self.data_gate.read().await;
        let mut b = Batch::new();
        let remote = self.drop_unused(&plusfs_proto::filedata::records(&e.pieces), &Default::default(), &mut b)?;
        b.del_entry(host.obj.ino, name);
        host.save(&mut b, dir);
        self.write(b).await?;
        drop(gate);
        self.drop_remote(remote).await;
        Ok(Reply::Done)
    }

    fn readdir(self: &Arc<Self>, p: &str, after: Option<String>, limit: u32, via: Via) -> Response {
        check_dir_path(p)?;
        let d = self.host(p, via)?.obj;
        let limit = if limit == 0 { 1024 } else { limit.min(MAX_READDIR_PAGE) } as usize;
        let mut page = self.store.list_entries(d.ino, after.as_deref(), limit + 1).map_err(eio)?;
        let more = page.len() > limit;
        page.truncate(limit);
        let entries = page.into_iter().map(|(name, i)| DirEntry { name, ino: i.ino, kind: i.kind }).collect();
        Ok(Reply::Dirents(Dirents { incarnation: d.incarnation, entries, more }))
    }

    async fn set_attr(self: &Arc<Self>, p: &str, set: &SetAttr, via: Via) -> Response {
        let mut t = match self.find(p, via, true).await? {
            Found::Here(t) => t,
            Found::Elsewhere { home, ino } => {
                return self.forward(home, ino, Request::SetAttr { path: p.into(), set: set.clone() }).await
            }
        };
        let e = &mut t.inode;
        if e.kind == FileKind::Dir {
            return Ok(Reply::IsDir { ino: e.ino });
        }
        let gate = self.data_gate.read().await;
        let mut b = Batch::new();
        let mut remote = Vec::new();
        if let Some(size) = set.size {
            if e.kind != FileKind::File {
                return Err(err(Errno::EINVAL, format!("'{p}' is not a regular file")));
            }
            remote = self.resize(e, size, &mut b)?;
        }
        apply_set(set, &mut e.mode, &mut e.uid, &mut e.gid, &mut e.atime, &mut e.mtime, &mut e.ctime);
        t.save(&mut b);
        self.write(b).await?;
        drop(gate);
        self.drop_remote(remote).await;
        Ok(Reply::Attr(Attr::of_inode(&t.inode)))
    }

    async fn dir_set_attr(self: &Arc<Self>, p: &str, set: &SetAttr) -> Response {
        check_dir_path(p)?;
        if set.size.is_some() {
            return Err(err(Errno::EISDIR, format!("'{p}' is a directory")));
        }
        {
            let _g = self.locks.lock(&[(p.to_string(), Scope::Whole)], None, true).await;
            let mut d = self.dir_object(p)?;
            apply_set(set, &mut d.mode, &mut d.uid, &mut d.gid, &mut d.atime, &mut d.mtime, &mut d.ctime);
            let mut b = Batch::new();
            b.put_dir(p, &d);
            self.write(b).await?;
        }
        Ok(Reply::Attr(self.dir_attr(p).await?))
    }

    async fn readlink(self: &Arc<Self>, p: &str, via: Via) -> Response {
        let e = match self.find(p, via, false).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => {
                return self.forward(home, ino, Request::Readlink { path: p.into() }).await
            }
        };
        match e.target {
            Some(t) if e.kind == FileKind::Symlink => Ok(Reply::Target(t)),
            _ => Err(err(Errno::EINVAL, format!("'{p}' is not a symbolic link"))),
        }
    }

    /// Directory objects homed here, and entries held here (in objects and shards).
    fn totals(&self) -> OpResult<(u64, u64)> {
        let dirs = self.store.dirs_within("/").map_err(eio)?;
        let shards = self.store.shards_within("/").map_err(eio)?;
        let entries = dirs.iter().chain(&shards).map(|(_, d)| d.entries).sum();
        Ok((dirs.len() as u64, entries))
    }

    fn statfs(&self) -> Response {
        let (dir_objects, entries) = self.totals()?;
        Ok(Reply::Statfs(Statfs { dir_objects, entries }))
    }

    async fn status(self: &Arc<Self>) -> Response {
        let (dir_objects, entries) = self.totals()?;
        let m = &self.metrics;
        let peer = self.peers.counters().snapshot();
        let st = self.store.stats();
        let segments = self.data.segments();
        let io = self.data.stats();
        let (cx_pending, cx_log_bytes, cx_log_peak) = self.cx.gauges();
        Ok(Reply::Status(ServerStatus {
            id: self.id,
            epoch: self.map.epoch,
            dir_objects,
            entries,
            ops: m.ops(),
            msgs_in: Metrics::get(&m.msgs_in) + peer.msgs_in,
            msgs_out: Metrics::get(&m.msgs_out) + peer.msgs_out,
            bytes_in: Metrics::get(&m.bytes_in) + peer.bytes_in,
            bytes_out: Metrics::get(&m.bytes_out) + peer.bytes_out,
            store_batches: st.batches,
            store_writes: st.writes,
            store_syncs: st.syncs,
            tx_started: Metrics::get(&m.tx_started),
            tx_pending: self.locks.tx_count() as u64,
            hugedirs: self.hugedir_reports().await?,
            shards: self.store.shards_within("/").map_err(eio)?.into_iter().map(|(p, d)| (p, d.entries)).collect(),
            data_records: self.store.record_count().map_err(eio)?,
            data_segments: segments.len() as u64,
            data_bytes: segments.iter().map(|s| s.bytes).sum(),
            data_appends: io.appends,
            data_reads: io.reads,
            data_bytes_read: io.bytes_read,
            data_bytes_written: io.bytes_written,
            data_read_sizes: io.read_sizes.to_vec(),
            cx_executed: Metrics::get(&self.cx.counters.executed),
            cx_committed: Metrics::get(&self.cx.counters.committed),
            cx_aborted: Metrics::get(&self.cx.counters.aborted),
            cx_rounds: Metrics::get(&self.cx.counters.rounds),
            cx_immediate: Metrics::get(&self.cx.counters.immediate),
            cx_invalidated: Metrics::get(&self.cx.counters.invalidated),
            cx_pending,
            cx_log_bytes,
            cx_log_peak,
        }))
    }

    fn fsck_scan(&self) -> Response {
        let dirs = self.store.dirs_within("/").map_err(eio)?;
        let shards = self.store.shards_within("/").map_err(eio)?;
        // Entries belong to a nondistributed directory object or to a shard held here.
        let local: HashSet<u64> =
            dirs.iter().filter(|(_, d)| d.dist.state != DistState::Distributed).map(|(_, d)| d.ino).collect();
        let shard_of: std::collections::HashMap<u64, (&String, &DirObject)> =
            shards.iter().map(|(p, d)| (d.ino, (p, d))).collect();
        let mut data = FsckData {
            dirs: dirs.iter().map(|(p, d)| (p.clone(), d.ino)).collect(),
            pending_tx: (self.store.log_records(plusfs_store::LogKind::Participant).map_err(eio)?.len()
                + self.store.log_records(plusfs_store::LogKind::Cx).map_err(eio)?.len()) as u64,
            shards: shards.iter().map(|(p, d)| (p.clone(), d.ino, d.incarnation)).collect(),
            distributed: dirs
                .iter()
                .filter(|(_, d)| d.dist.state == DistState::Distributed)
                .map(|(p, d)| (p.clone(), d.ino, d.incarnation, d.dist.set.clone()))
                .collect(),
            ..Default::default()
        };
        data.shared = self.store.all_inodes().map_err(eio)?.iter().map(|i| (i.ino, i.nlink)).collect();
        for (parent, name, inode) in self.store.all_entries().map_err(eio)? {
            if let Some(home) = inode.link_home {
                data.links.push((inode.ino, home));
            }
            if let Some((path, shard)) = shard_of.get(&parent) {
                let set = &shard.dist.set;
                if set.get(plusfs_proto::hugedir::slot_of(&name, set.len())) != Some(&self.id) {
                    data.misplaced.push(((*path).clone(), name.clone()));
                }
            } else if !local.contains(&parent) {
                data.orphans.push((parent, name));
                continue;
            }
            if inode.kind == FileKind::Dir {
                data.subdirs.push((parent, name, inode.ino));
            }
        }
        Ok(Reply::Fsck(data))
    }
}
