//! Routing: each request to the protocol or operation that serves it.

use crate::engine::attrs::NewNode;
use crate::engine::errors::{eio, err};
use crate::engine::host::Via;
use crate::migrate::{target_dir, Placed};
use crate::osd::Osd;
use plusfs_proto::{Cred, Errno, FileKind, Reply, Request, Response};
use std::sync::Arc;

/// What `cluster status` shows non-root callers in place of a distributed directory's path.
const HIDDEN_PATH: &str = "(path shown to admins only)";

/// The bytes a `Probe` answers with: zeros, never allocated per request.
static PROBE_ZEROS: [u8; 4 << 20] = [0; 4 << 20];

impl Osd {
    /// Serves one request made by `cred`.
    pub async fn handle(self: &Arc<Self>, cred: Cred, req: Request) -> Response {
        self.engine.metrics.count_op(req.opcode());
        match self.place(&req).await {
            Ok(Placed::Forward(home)) => return self.forward_to_home(home, &cred, req).await,
            Ok(Placed::Here) => {}
            Err(e) => return Err(e),
        }
        // A map adopted while the request runs may move its directory away: an error
        // then may come from the move, and the request is served at the new home.
        let before = self.engine.map().epoch;
        let again = (target_dir(&req).is_some()).then(|| req.clone());
        let own: Vec<String> = crate::migrate::subop_dirs(&req).into_iter().map(String::from).collect();
        let resp = self.handle_here(cred.clone(), req).await;
        let resp = self.hide_redirect(&cred, resp);
        match (resp, again) {
            // A sub-operation's own directory handed to its new home meanwhile: its
            // coordinator plans again (not "no such directory").
            (Err(e), _)
                if e.missing_dir
                    .as_ref()
                    .is_some_and(|d| own.contains(d) && self.engine.map().home_of_dir(d) != self.engine.id) =>
            {
                Err(crate::engine::errors::err(Errno::EBUSY, format!("{} (moved to its new home)", e.message)))
            }
            (Err(e), Some(req)) if self.engine.map().epoch != before => {
                let home = target_dir(&req).map(|d| self.engine.map().home_of_dir(d)).unwrap_or(self.engine.id);
                if home != self.engine.id {
                    return self.forward_to_home(home, &cred, req).await;
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
    fn hide_redirect(&self, cred: &Cred, resp: Response) -> Response {
        let Err(e) = &resp else { return resp };
        let Some(info) = &e.redirect else { return resp };
        match self.engine.dir_object(&info.path) {
            Ok(d) => plusfs_proto::perm::check_search(cred, &d, &info.path).and(resp),
            Err(_) => resp,
        }
    }

    /// Serves a request that belongs to this server.
    async fn handle_here(self: &Arc<Self>, cred: Cred, req: Request) -> Response {
        if self.engine.locks.tx_count() > 0 {
            // A client must not see objects a pending Cx operation changes before it commits.
            let scopes = crate::cx::request_scopes(&req);
            tracing::trace!(?req, ?scopes, "settling");
            // Forwarded requests (their sender holds busy locks) wait for Cx operations only.
            self.engine.locks.settle(&scopes, !matches!(req, Request::OnInode { .. })).await;
        }
        // Other sessions' delegations on what the request touches are recalled first.
        let _inflight = self.enter_delegated(&cred, &req).await;
        match req {
            Request::Shard { incarnation, op } => {
                self.engine.metrics.count_op(op.opcode());
                self.dispatch(*op, Via::Shard(incarnation), &cred).await
            }
            Request::OnInode { ino, op } => {
                self.engine.metrics.count_op(op.opcode());
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
                    | Readlink { .. }) => self.dispatch(op, Via::Inode(ino), &cred).await,
                    other => Err(err(Errno::EINVAL, format!("{} does not apply to a shared inode", other.name()))),
                }
            }
            req => self.dispatch(req, Via::Home, &cred).await,
        }
    }

    /// Serves a request addressed to a directory's home (`Via::Home`) or to this server's
    /// shard of a distributed directory (only requests about entries), made by `c`.
    async fn dispatch(self: &Arc<Self>, req: Request, via: Via, c: &Cred) -> Response {
        use Request::*;
        match req {
            Mkdir { path, mode, uid, gid, threshold, width } => {
                self.retrying(|| self.mkdir(&path, mode, (uid, gid), (threshold, width), via, c)).await
            }
            Rmdir { path } => self.retrying(|| self.rmdir(&path, via, c)).await,
            Create { path, kind, mode, uid, gid, exclusive, rdev, access } => {
                let node = NewNode { target: None, rdev, access };
                self.create(&path, kind, mode, (uid, gid), exclusive, node, via, c).await
            }
            Open { path, access } => self.open_entry(&path, access, via, c).await,
            Stat { path } => self.stat(&path, via, c).await,
            Close { .. } => Ok(Reply::Done),
            DirStat { path } => self.dir_stat(&path, via, c).await,
            Unlink { path } => self.unlink(&path, via, c).await,
            Readdir { path, after, limit } => self.readdir(&path, after, limit, via, c),
            Rename { src, dst } => self.retrying(|| self.rename(&src, &dst, via, c)).await,
            SetAttr { path, set } => self.set_attr(&path, &set, via, c).await,
            Symlink { path, target, uid, gid } => {
                let node = NewNode { target: Some(target), rdev: 0, access: 0 };
                self.create(&path, FileKind::Symlink, 0o777, (uid, gid), true, node, via, c).await
            }
            Readlink { path } => self.readlink(&path, via, c).await,
            Link { src, dst } => self.link(&src, &dst, via, c).await,
            Exchange { a, b } => self.exchange(&a, &b, via, c).await,
            BatchWrite { dir, files, semantics } => self.batch_write(&dir, files, semantics, via, c).await,
            BatchRead { dir, names, max_bytes } => self.batch_read(&dir, &names, max_bytes, via, c).await,
            Write { path, offset, data, append } => {
                self.write_file(&path, offset, data.into_bytes(), append, via, c).await
            }
            Read { path, offset, len } => self.read_file(&path, offset, len, via, c).await,
            Layout { path, offset, len, write, holder } => {
                self.layout(&path, (offset, len, write), holder, via, c).await
            }
            CommitWrite { path, ino, offset, len, pieces, receipts } => {
                self.commit_write(&path, ino, (offset, len), (pieces, receipts), via, c).await
            }
            Fsync { path } if !path.is_empty() => self.fsync_file(&path, via, c).await,
            Xattr { path, op } => self.xattr(&path, &op, via, c).await,
            Batch { op, dir, names, mode, uid, gid, semantics } => {
                self.batch(op, &dir, &names, mode, (uid, gid), semantics, via, c).await
            }
            DelegAcquire { dir, read } => self.deleg_acquire(&dir, read, via, c).await,
            other if via != Via::Home => {
                Err(err(Errno::EINVAL, format!("{} cannot be addressed to a shard or inode", other.name())))
            }
            Ping => Ok(Reply::Pong { server: self.engine.id, epoch: self.engine.map().epoch }),
            DirSetAttr { path, set } => self.dir_set_attr(&path, &set, c).await,
            Statfs => {
                self.failpoints.hit("statfs_handler").await;
                self.statfs()
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
            FsckScan => self.fsck_scan(),
            TxPrepare { txid, ops, epoch } => self.tx_prepare(txid, ops, epoch, c).await,
            TxCommit { txid, payload } => self.tx_commit(txid, payload).await,
            TxAbort { txid } => self.tx_abort(txid).await,
            req @ (CxExec { .. } | CxVote { .. } | CxDecide { .. } | CxUrge { .. } | CxLaunch { .. }) => {
                self.handle_cx(req, c).await
            }
            SubExec { ops } => self.sub_exec(ops, c).await,
            AllocInos { count } => {
                let count = count.clamp(1, 4096);
                let first = self.engine.inos.next_block(self.engine.store.as_ref(), count as u64).await.map_err(eio)?;
                self.ino_leases.grant(c.session, first, count as u64);
                Ok(Reply::Inos { first, count })
            }
            CloseBatch { inos, .. } => self.closev(&inos),
            Shard { .. } | OnInode { .. } => Err(err(Errno::EINVAL, "a shard or inode request cannot be nested")),
            ShardImport { path, ino, entries, shard } => self.shard_import(&path, ino, entries, shard).await,
            SetPolicy { path, threshold, width } => self.set_policy(&path, threshold, width).await,
            DistStatus { path } => self.dist_status(&path).await,
            DataPut { owner, data, file_off, cap } => self.data_put(owner, data.into_bytes(), file_off, cap).await,
            DataGet { ranges, cap } => self.data_get(&ranges, cap.as_ref()).await,
            DataDrop { records, receipts } => self.data_drop(&records, &receipts).await,
            Probe { data, reply_len } => {
                drop(data);
                Ok(Reply::Data(bytes::Bytes::from_static(&PROBE_ZEROS[..reply_len.min(4 << 20) as usize]).into()))
            }
            DirXattr { path, op } => self.dir_xattr(&path, &op, c).await,
            DirPerms { path } => self.dir_perms(&path),
            CxPerms { op, path, answer } => {
                self.pushed_perms.put(op, path, answer);
                Ok(Reply::Done)
            }
            DelegFlush { dir, id, seq, creds, ops, release } => {
                self.deleg_flush(&dir, id, seq, creds, ops, release, c).await
            }
            DelegWait { session } => self.deleg_wait(session, c).await,
            DelegEntries { dir, id, names } => self.deleg_entries(&dir, id, &names, c),
            Compact { live_percent } => {
                self.compact_now(live_percent.min(100) as f64 / 100.0).await?;
                Ok(Reply::Done)
            }
            Once { .. } => Err(err(Errno::EINVAL, "an exactly-once request cannot be nested")),
            GroupStatus | GroupDigest | GroupReplace { .. } => {
                Err(err(Errno::EINVAL, format!("server {} is not replicated: it has no replica group", self.engine.id)))
            }
            MapGet => Ok(Reply::Map(self.engine.map().to_toml())),
            MapChange { change } => self.change_map(&change).await,
            MapPush { map } => self.pushed_map(&map),
            MigrateIn { paths, from } => self.migrate_in(&paths, from).await,
            MigrateOut { paths } => self.migrate_out(&paths).await,
            MigrateEntries { path, ino, after, limit } => self.migrate_entries(&path, ino, after.as_deref(), limit),
            MigrateDone { paths } => self.migrate_done(&paths).await,
            // An empty path (from a peer): this server's data store.
            Fsync { .. } => self.fsync_data().await,
        }
    }
}
