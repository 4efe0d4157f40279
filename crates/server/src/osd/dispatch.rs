//! Routing: each request to the protocol or operation that serves it.

use super::Osd;
use crate::engine::attrs::NewNode;
use crate::engine::call::Call;
use crate::engine::errors::{eio, err, OpError, OpResult};
use crate::engine::host::Via;
use crate::metrics::Metrics;
use crate::migrate::route::{target_dir, Placed};
use crate::peers::{Answer, LocalPeer};
use plusfs_proto::{Cred, Errno, FileKind, Reply, Request, Response, WireError};
use std::sync::Arc;

/// What `cluster status` shows non-root callers in place of a distributed directory's path.
const HIDDEN_PATH: &str = "(path shown to admins only)";

/// The bytes a `Probe` answers with: zeros, never allocated per request.
static PROBE_ZEROS: [u8; 4 << 20] = [0; 4 << 20];

impl Osd {
    /// Serves one request made by `cred` (no epoch hint: see [`Osd::handle_from`]).
    pub async fn handle(self: &Arc<Self>, cred: Cred, req: Request) -> Response {
        self.handle_from(cred, req, 0).await
    }

    /// Serves one request made by `cred`, whose frame carried the sender's epoch hint
    /// `sender_epoch` (0: none).
    pub async fn handle_from(self: &Arc<Self>, cred: Cred, req: Request, sender_epoch: u16) -> Response {
        self.handle_call(&Call::new(cred), req, sender_epoch).await
    }

    /// Serves one request in the context `call` (an exactly-once request carries its mark
    /// there: `once::handle`).
    pub(crate) async fn handle_call(self: &Arc<Self>, call: &Call, req: Request, sender_epoch: u16) -> Response {
        // The one place where an operation's error becomes the wire's.
        self.serve(call, req, sender_epoch).await.map_err(WireError::from)
    }

    /// [`Osd::handle_call`] with the operation's own error.
    async fn serve(self: &Arc<Self>, cred: &Call, req: Request, sender_epoch: u16) -> OpResult<Reply> {
        self.engine.metrics().count_op(req.opcode());
        match self.migrate.place(&req, sender_epoch).await {
            Ok(Placed::Forward(home)) => return self.migrate.forward_to_home(home, cred, req).await,
            Ok(Placed::Here) => {}
            Err(e) => return Err(e),
        }
        // A map adopted while the request runs may move its directory away: an error
        // then may come from the move, and the request is served at the new home.
        let before = self.engine.map().epoch;
        let again = (target_dir(&req).is_some()).then(|| req.clone());
        let own: Vec<String> = crate::migrate::route::subop_dirs(&req).into_iter().map(String::from).collect();
        let resp = self.handle_here(cred, req).await;
        let resp = self.hide_redirect(cred, resp);
        match (resp, again) {
            // A sub-operation's own directory handed to its new home meanwhile: its
            // coordinator plans again (not "no such directory").
            (Err(e), _)
                if e.missing_dir().is_some_and(|d| {
                    own.iter().any(|o| o == d) && self.engine.map().home_of_dir(d) != self.engine.id()
                }) =>
            {
                Err(OpError::Moved(format!("{} (moved to its new home)", e.message())))
            }
            (Err(e), Some(req)) if self.engine.map().epoch != before => {
                let home = target_dir(&req).map(|d| self.engine.map().home_of_dir(d)).unwrap_or(self.engine.id());
                if home != self.engine.id() {
                    return self.migrate.forward_to_home(home, cred, req).await;
                }
                Err(e)
            }
            (resp, _) => resp,
        }
    }

    /// A redirect to a distributed directory's shards names its inode number and the
    /// servers of its entries: it goes only to a caller that may reach those entries
    /// (search permission on every directory down to it). Any other caller gets the
    /// refusal it would get from a shard, and learns nothing of the directory.
    fn hide_redirect(&self, cred: &Call, resp: OpResult<Reply>) -> OpResult<Reply> {
        let Err(e) = &resp else { return resp };
        let Some(info) = e.dist() else { return resp };
        match self.engine.dir_object(&info.path) {
            Ok(d) => plusfs_proto::perm::check_search(cred, &d, &info.path).map_err(OpError::from).and(resp),
            Err(_) => resp,
        }
    }

    /// Serves a request that belongs to this server.
    async fn handle_here(self: &Arc<Self>, cred: &Call, req: Request) -> OpResult<Reply> {
        if self.engine.locks().tx_count() > 0 {
            // A client must not see objects a pending Cx operation changes before it commits.
            let scopes = crate::cx::request_scopes(&req);
            tracing::trace!(?req, ?scopes, "settling");
            // Forwarded requests (their sender holds busy locks) wait for Cx operations only.
            self.engine.locks().settle(&scopes, !matches!(req, Request::OnInode { .. })).await;
        }
        // Other sessions' delegations on what the request touches are recalled first.
        let _inflight = self.deleg.enter_delegated(cred, &req).await;
        match req {
            Request::Shard { incarnation, op } => {
                self.engine.metrics().count_op(op.opcode());
                self.dispatch(*op, Via::Shard(incarnation), cred).await
            }
            Request::OnInode { ino, op } => {
                self.engine.metrics().count_op(op.opcode());
                use Request::*;
                match *op {
                    op @ (Stat { .. }
                    | Open { .. }
                    | SetAttr { .. }
                    | Write { .. }
                    | CommitWrite { .. }
                    | Read { .. }
                    | Layout { .. }
                    | Fsync { .. }
                    | Xattr { .. }
                    | Readlink { .. }) => self.dispatch(op, Via::Inode(ino), cred).await,
                    other => Err(err(Errno::EINVAL, format!("{} does not apply to a shared inode", other.name()))),
                }
            }
            req => self.dispatch(req, Via::Home, cred).await,
        }
    }

    /// Serves a request addressed to a directory's home (`Via::Home`) or to this server's
    /// shard of a distributed directory (only requests about entries), made by `c`.
    async fn dispatch(self: &Arc<Self>, req: Request, via: Via, c: &Call) -> OpResult<Reply> {
        use Request::*;
        match req {
            Mkdir { path, mode, uid, gid, threshold, width } => {
                self.twopc
                    .retrying(|plan| self.twopc.mkdir(plan, &path, mode, (uid, gid), (threshold, width), via, c))
                    .await
            }
            Rmdir { path } => self.twopc.retrying(|plan| self.twopc.rmdir(plan, &path, via, c)).await,
            Create { path, kind, mode, uid, gid, exclusive, rdev, access } => {
                let node = NewNode { target: None, rdev, access };
                self.namespace.create(&path, kind, mode, (uid, gid), exclusive, node, via, c).await
            }
            Open { path, access } => self.namespace.open_entry(&path, access, via, c).await,
            Stat { path } => self.namespace.stat(&path, via, c).await,
            Close { .. } => Ok(Reply::Done),
            DirStat { path } => self.namespace.dir_stat(&path, via, c).await,
            Unlink { path } => self.namespace.unlink(&path, via, c).await,
            Readdir { path, after, limit } => self.namespace.readdir(&path, after, limit, via, c),
            Rename { src, dst } => self.twopc.retrying(|plan| self.twopc.rename(plan, &src, &dst, via, c)).await,
            SetAttr { path, set } => self.namespace.set_attr(&path, &set, via, c).await,
            Symlink { path, target, uid, gid } => {
                let node = NewNode { target: Some(target), rdev: 0, access: 0 };
                self.namespace.create(&path, FileKind::Symlink, 0o777, (uid, gid), true, node, via, c).await
            }
            Readlink { path } => self.namespace.readlink(&path, via, c).await,
            Link { src, dst } => self.namespace.link(&src, &dst, via, c).await,
            Exchange { a, b } => self.twopc.exchange(&a, &b, via, c).await,
            BatchWrite { dir, files, semantics } => self.bfo.batch_write(&dir, files, semantics, via, c).await,
            BatchRead { dir, names, max_bytes } => self.bfo.batch_read(&dir, &names, max_bytes, via, c).await,
            Write { path, offset, data, append } => {
                self.filedata.write_file(&path, offset, data.into_bytes(), append, via, c).await
            }
            Read { path, offset, len } => self.filedata.read_file(&path, offset, len, via, c).await,
            Layout { path, offset, len, write, holder } => {
                self.filedata.layout(&path, (offset, len, write), holder, via, c).await
            }
            CommitWrite { path, ino, offset, len, pieces, receipts } => {
                self.filedata.commit_write(&path, ino, (offset, len), (pieces, receipts), via, c).await
            }
            Fsync { path } if !path.is_empty() => self.filedata.fsync_file(&path, via, c).await,
            Xattr { path, op } => self.namespace.xattr(&path, &op, via, c).await,
            Batch { op, dir, names, mode, uid, gid, semantics } => {
                self.batches.batch(op, &dir, &names, mode, (uid, gid), semantics, via, c).await
            }
            DelegAcquire { dir, read } => self.deleg.deleg_acquire(&dir, read, via, c).await,
            other if via != Via::Home => {
                Err(err(Errno::EINVAL, format!("{} cannot be addressed to a shard or inode", other.name())))
            }
            Ping => Ok(Reply::Pong { server: self.engine.id(), epoch: self.engine.map().epoch }),
            DirSetAttr { path, set } => self.dirperms.dir_set_attr(&path, &set, c).await,
            Statfs => {
                self.failpoints.hit(crate::failpoint::FailStep::StatfsHandler).await;
                self.namespace.statfs()
            }
            Status => {
                // Distributed directories may lie inside directories the caller cannot
                // search: their paths are shown to root (admins, servers) only.
                let mut status = self.status().await;
                if c.uid != 0 {
                    if let Ok(Reply::Status(s)) = status.as_mut() {
                        for h in s.hugedirs.iter_mut() {
                            h.path = HIDDEN_PATH.into();
                        }
                    }
                }
                status
            }
            FsckScan => self.namespace.fsck_scan().await,
            TxPrepare { txid, ops, epoch } => self.twopc.tx_prepare(txid, ops, epoch, c).await,
            TxCommit { txid, payload } => self.twopc.tx_commit(txid, payload).await,
            TxAbort { txid } => self.twopc.tx_abort(txid).await,
            req @ (CxExec { .. } | CxVote { .. } | CxDecide { .. } | CxUrge { .. } | CxLaunch { .. }) => {
                self.cx.handle_cx(req, c).await
            }
            SubExec { ops } => self.serial.sub_exec(ops, c).await,
            AllocInos { count } => {
                let count = count.clamp(1, 4096);
                let first = self.engine.new_inos(count as u64).await?;
                self.cx.ino_leases.grant(c.session, first, count as u64);
                Ok(Reply::Inos { first, count })
            }
            CloseBatch { inos, .. } => self.batches.closev(&inos),
            Shard { .. } | OnInode { .. } => Err(err(Errno::EINVAL, "a shard or inode request cannot be nested")),
            ShardImport { path, ino, entries, shard } => self.hugedirs.shard_import(&path, ino, entries, shard).await,
            SetPolicy { path, threshold, width } => self.hugedirs.set_policy(&path, threshold, width).await,
            DistStatus { path } => self.hugedirs.dist_status(&path).await,
            DataPut { owner, data, file_off, cap } => {
                self.filedata.data_put(owner, data.into_bytes(), file_off, cap, c).await
            }
            DataGet { ranges, cap } => self.filedata.data_get(&ranges, cap.as_ref()).await,
            DataDrop { records, receipts } => self.filedata.data_drop(&records, &receipts).await,
            Probe { data, reply_len } => {
                drop(data);
                Ok(Reply::Data(bytes::Bytes::from_static(&PROBE_ZEROS[..reply_len.min(4 << 20) as usize]).into()))
            }
            DirXattr { path, op } if op.changes_acl() => self.dirperms.dir_acl(&path, &op, c).await,
            DirXattr { path, op } => self.namespace.dir_xattr(&path, &op, c).await,
            DirPerms { path } => self.namespace.dir_perms(&path),
            CxPerms { op, path, answer } => {
                self.dirperms.pushed_perms.put(op, path, answer);
                Ok(Reply::Done)
            }
            DelegFlush { dir, id, seq, creds, ops, release } => {
                self.deleg.deleg_flush(&dir, id, seq, creds, ops, release, c).await
            }
            DelegWait { session } => self.deleg.deleg_wait(session, c).await,
            DelegEntries { dir, id, names } => self.deleg.deleg_entries(&dir, id, &names, c),
            Compact { live_percent } => {
                self.filedata.compact_now(live_percent.min(100) as f64 / 100.0).await?;
                Ok(Reply::Done)
            }
            Once { .. } => Err(err(Errno::EINVAL, "an exactly-once request cannot be nested")),
            GroupStatus | GroupDigest | GroupReplace { .. } => Err(err(
                Errno::EINVAL,
                format!("server {} is not replicated: it has no replica group", self.engine.id()),
            )),
            MapGet => Ok(Reply::Map(self.engine.map().to_toml())),
            MapChange { change } => self.migrate.change_map(&change, c).await,
            MapPush { map } => self.migrate.pushed_map(&map).await,
            MigrateIn { paths, from } => self.migrate.migrate_in(&paths, from).await,
            MigrateOut { paths } => self.migrate.migrate_out(&paths).await,
            MigrateEntries { path, ino, after, limit } => {
                self.migrate.migrate_entries(&path, ino, after.as_deref(), limit)
            }
            MigrateDone { paths } => self.migrate.migrate_done(&paths).await,
            ShardEvict { path, from } => self.hugedirs.evict_shard(&path, from).await,
            ShardExpect { path, ino, incarnation, from, set } => {
                self.migrate.shard_expect(&path, ino, incarnation, from, set).await
            }
            ShardPull { path } => self.migrate.shard_pull(&path).await,
            ShardOut { path, ino, incarnation, set } => self.migrate.shard_out(&path, ino, incarnation, set).await,
            ShardEntries { path, ino, after, limit } => self.migrate.shard_entries(&path, ino, after.as_deref(), limit),
            ShardDone { path, ino } => self.migrate.shard_done(&path, ino).await,
            ShardSet { path } => self.hugedirs.shard_set(&path),
            InodeIn { inode, from } => self.migrate.inode_in(inode, from).await,
            InodeHome { ino } => self.engine.inode_home(ino).map(Reply::Home),
            Relink { from, moved } => self.migrate.relink(from, moved).await.map(Reply::Count),
            Quota { op } => self.quotas.handle(op, c).await,
            // An empty path (from a peer): this server's data store.
            Fsync { .. } => self.filedata.fsync_data().await,
        }
    }

    pub(crate) async fn status(self: &Arc<Self>) -> OpResult<Reply> {
        let (dir_objects, entries) = self.namespace.totals()?;
        let m = self.engine.metrics();
        let peer = self.peers.pool.counters().snapshot();
        let st = self.engine.store_handle().stats();
        let segments = self.engine.data().segments();
        let io = self.engine.data().stats();
        let (cx_pending, cx_log_bytes, cx_log_peak) = self.cx.cx.gauges();
        let map = self.engine.map();
        Ok(Reply::Status(Box::new(plusfs_proto::ServerStatus {
            id: self.engine.id(),
            epoch: map.epoch,
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
            tx_pending: self.engine.locks().tx_count() as u64,
            hugedirs: self.hugedirs.hugedir_reports().await?,
            shards: self
                .engine
                .store()
                .shards_within("/")
                .map_err(eio)?
                .into_iter()
                .map(|(p, d)| (p, d.entries))
                .collect(),
            data_records: self.engine.store().record_count().map_err(eio)?,
            data_segments: segments.len() as u64,
            data_bytes: segments.iter().map(|s| s.bytes).sum(),
            data_appends: io.appends,
            data_reads: io.reads,
            data_bytes_read: io.bytes_read,
            data_bytes_written: io.bytes_written,
            data_read_sizes: io.read_sizes.to_vec(),
            cx_executed: Metrics::get(&self.cx.cx.counters.executed),
            cx_committed: Metrics::get(&self.cx.cx.counters.committed),
            cx_aborted: Metrics::get(&self.cx.cx.counters.aborted),
            cx_rounds: Metrics::get(&self.cx.cx.counters.rounds),
            cx_immediate: Metrics::get(&self.cx.cx.counters.immediate),
            cx_invalidated: Metrics::get(&self.cx.cx.counters.invalidated),
            cx_pending,
            cx_log_bytes,
            cx_log_peak,
            delegations: self.deleg.delegations_held(),
            deleg_recalls: self.deleg.delegs.counters.recalls.load(std::sync::atomic::Ordering::Relaxed),
            deleg_revoked: self.deleg.delegs.counters.revoked.load(std::sync::atomic::Ordering::Relaxed),
            deleg_flushes: self.deleg.delegs.counters.flushes.load(std::sync::atomic::Ordering::Relaxed),
            inodes: self.engine.store().all_inodes().map_err(eio)?.len() as u64,
            data_live_bytes: self.filedata.record_inventory().await?.iter().map(|r| r.1).sum(),
            weight_milli: map.server(self.engine.id()).map_or(0, |s| (s.weight * 1000.0).round() as u64),
            migrating: map.migrating(),
            migration: self.migrate.migration.report(map.migration.as_ref().map(|m| m.from_epoch)),
            forwarded: self.migrate.migration.forwarded.load(std::sync::atomic::Ordering::Relaxed),
            quotas: self.quota_shares()?,
        })))
    }
}

impl Osd {
    /// The quotas kept here with this server's usage of each owner.
    fn quota_shares(&self) -> OpResult<Vec<(plusfs_proto::quota::QuotaDef, plusfs_proto::quota::Usage)>> {
        let quotas = self.engine.quotas();
        if quotas.is_empty() {
            return Ok(Vec::new());
        }
        let used = self.engine.store().usage().map_err(eio)?;
        Ok(quotas.values().map(|d| (d.clone(), used.get(&d.owner).copied().unwrap_or_default())).collect())
    }
}

impl LocalPeer for Osd {
    /// Peer requests this server sends itself, served directly and never through
    /// `handle`, so no operation recurses into another.
    fn serve_peer<'a>(self: Arc<Self>, req: Request, c: &'a Cred) -> Answer<'a> {
        Box::pin(async move {
            // A shard a drained server is to hand here is pulled first, as for a request
            // from another server (`Migration::place`).
            if let Err(e) = self.migrate.pull_expected(&req).await {
                return Err(WireError::from(e));
            }
            // Not a client's request: its batches are never a request's effects.
            let call = Call::new(c.clone());
            let c = &call;
            // A transaction's changes recall the delegations on what they touch here too
            // (a re-ancestry's subtree, entries), as they do when another server sends
            // them: a holder must not go on checking with what the change replaces.
            let _inflight = match &req {
                Request::TxPrepare { .. } => Some(self.deleg.enter_delegated(c, &req).await),
                _ => None,
            };
            let answer = match req {
                Request::Stat { path } => self.namespace.stat(&path, Via::Home, c).await,
                Request::DirPerms { path } => self.namespace.dir_perms(&path),
                Request::Shard { incarnation, op } => match *op {
                    Request::Stat { path } => self.namespace.stat(&path, Via::Shard(incarnation), c).await,
                    other => Err(err(Errno::EINVAL, format!("{} is not a peer request", other.name()))),
                },
                Request::SetPolicy { path, threshold, width } => {
                    self.hugedirs.set_policy(&path, threshold, width).await
                }
                Request::TxPrepare { txid, ops, epoch } => self.twopc.tx_prepare(txid, ops, epoch, c).await,
                Request::TxCommit { txid, payload } => self.twopc.tx_commit(txid, payload).await,
                Request::TxAbort { txid } => self.twopc.tx_abort(txid).await,
                // The home of a distributed directory may take a drained server's shard.
                Request::ShardExpect { path, ino, incarnation, from, set } => {
                    self.migrate.shard_expect(&path, ino, incarnation, from, set).await
                }
                Request::ShardSet { path } => self.hugedirs.shard_set(&path),
                other => Err(err(Errno::EINVAL, format!("{} is not a peer request", other.name()))),
            };
            answer.map_err(WireError::from)
        })
    }
}
