//! Batch operations (seed 000 §3): one request carries one operation on many entries of a
//! directory. Entries run in request order against the directory object and their changes
//! go to the store as one write batch (one fsync with `sync = always`), so a batch of a
//! thousand creates costs one request, one reply and one store write.

use crate::engine::attrs::count_entry;
use crate::engine::call::Call;
use crate::engine::errors::{check_dir_path, eio, err, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::engine::Engine;
use crate::filedata::FileData;
use crate::hugedir::HugeDirs;
use crate::links::Links;
use crate::namespace::Namespace;
use crate::twopc::TwoPhase;
use plusfs_proto::path::{check_name, join};
use plusfs_proto::{Attr, BatchOp, BatchReply, DirObject, Errno, FileKind, Ino, Inode, Reply, Semantics};
use plusfs_store::Batch;
use std::collections::HashMap;
use std::sync::Arc;

/// What one entry of a batch came to.
type EntryResult = Result<Option<Attr>, Errno>;

/// Collects per-entry results into a [`BatchReply`], honouring the semantics.
struct Results {
    reply: BatchReply,
    stop_on_failure: bool,
}

impl Results {
    fn new(semantics: Semantics, capacity: usize) -> Results {
        Results {
            reply: BatchReply { errnos: Vec::with_capacity(capacity), attrs: Vec::new(), dist: None },
            stop_on_failure: semantics == Semantics::StopOnFailure,
        }
    }

    /// Records a result; false when the batch must stop here.
    fn push(&mut self, r: EntryResult) -> bool {
        match r {
            Ok(attr) => {
                self.reply.errnos.push(Errno::OK);
                self.reply.attrs.extend(attr);
                true
            }
            Err(e) => {
                self.reply.errnos.push(e);
                !self.stop_on_failure
            }
        }
    }
}

/// Batched operations (seed 001 §IV.D): many names of one directory in one request.
pub(crate) struct Batches {
    engine: Arc<Engine>,
    namespace: Arc<Namespace>,
    twopc: Arc<TwoPhase>,
    hugedirs: Arc<HugeDirs>,
    links: Arc<Links>,
    filedata: Arc<FileData>,
}

impl Batches {
    pub(crate) fn new(
        engine: Arc<Engine>,
        namespace: Arc<Namespace>,
        twopc: Arc<TwoPhase>,
        hugedirs: Arc<HugeDirs>,
        links: Arc<Links>,
        filedata: Arc<FileData>,
    ) -> Batches {
        Batches { engine, namespace, twopc, hugedirs, links, filedata }
    }
}

impl Batches {
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn batch(
        self: &Arc<Self>,
        op: BatchOp,
        dir: &str,
        names: &[String],
        mode: u32,
        owner: (u32, u32),
        semantics: Semantics,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        check_dir_path(dir)?;
        let (uid, gid) = owner;
        if matches!(op, BatchOp::Create { .. } | BatchOp::Unlink) && !self.may_batch(dir, via, c) {
            // Permission errors differ per entry: entry by entry, as single operations.
            return Ok(Reply::Batch(self.each(op, dir, names, (mode, uid, gid), semantics, via, c).await));
        }
        let reply = match op {
            BatchOp::Mkdir => self.mkdirv(dir, names, mode, owner, semantics, via, c).await?,
            BatchOp::Stat | BatchOp::Open => self.read_batch(op, dir, names, semantics, via, c).await?,
            BatchOp::Create { exclusive } => match self
                .write_batch(dir, names, semantics, via, c, |d, cur| match cur {
                    Some(_) if exclusive => Err(Errno::EEXIST),
                    Some(e) if e.kind == FileKind::Dir => Err(Errno::EISDIR),
                    Some(e) => Ok(Change::Keep(Attr::of_inode(e))),
                    // Owner, mode and inherited ACL from the directory read under the locks.
                    None => {
                        let new = perm::new_entry(c, d, owner, mode, FileKind::File);
                        let inode = Inode::new(0, FileKind::File, new.mode, new.uid, new.gid);
                        Ok(Change::Create(Inode { xattrs: new.xattrs, ..inode }))
                    }
                })
                .await?
            {
                Some(reply) => reply,
                None => self.each(op, dir, names, (mode, uid, gid), semantics, via, c).await,
            },
            BatchOp::Unlink => match self
                .write_batch(dir, names, semantics, via, c, |_, cur| match cur {
                    None => Err(Errno::ENOENT),
                    Some(e) if e.kind == FileKind::Dir => Err(Errno::EISDIR),
                    Some(e) => Ok(Change::Remove(e.kind)),
                })
                .await?
            {
                Some(reply) => reply,
                None => self.each(op, dir, names, (mode, uid, gid), semantics, via, c).await,
            },
        };
        Ok(Reply::Batch(reply))
    }

    /// True when `c` may create and remove any entry of `dir` here (search and write
    /// permission, and no sticky bit that could refuse some); a missing directory is
    /// left to the batch to report.
    fn may_batch(&self, dir: &str, via: Via, c: &Call) -> bool {
        match self.engine.host(dir, via) {
            Err(_) => true,
            Ok(h) => c.is_root() || (perm::check_dir_write(c, &h.obj, dir).is_ok() && h.obj.mode & libc::S_ISVTX == 0),
        }
    }

    /// A create or unlink batch that meets hard links or a quota's limit: entry by entry,
    /// through the single-entry operations (which handle links and refuse each create
    /// past a limit). A redirect stops it and goes back
    /// in the reply, as in `write_batch`.
    #[allow(clippy::too_many_arguments)]
    async fn each(
        self: &Arc<Self>,
        op: BatchOp,
        dir: &str,
        names: &[String],
        (mode, uid, gid): (u32, u32, u32),
        semantics: Semantics,
        via: Via,
        c: &Call,
    ) -> BatchReply {
        let mut results = Results::new(semantics, names.len());
        for name in names {
            let p = join(dir, name);
            let r = match op {
                BatchOp::Unlink => self.namespace.unlink(&p, via, c).await,
                BatchOp::Create { exclusive } => {
                    let node = crate::engine::attrs::NewNode { target: None, rdev: 0, access: 0 };
                    self.namespace.create(&p, FileKind::File, mode, (uid, gid), exclusive, node, via, c).await
                }
                _ => Err(err(Errno::EINVAL, "not a write batch")),
            };
            let r = match r {
                Ok(Reply::Attr(a)) => Ok(Some(a)),
                Ok(_) => Ok(None),
                Err(e) if e.dist().is_some() => {
                    results.reply.dist = e.dist().cloned();
                    break;
                }
                Err(e) => Err(e.errno()),
            };
            if !results.push(r) {
                break;
            }
        }
        results.reply
    }

    /// The busy locks of the (valid) entry names of `dir` a write batch touches.
    pub(crate) async fn lock_names<'a>(
        self: &Arc<Self>,
        dir: &str,
        names: impl Iterator<Item = &'a str>,
    ) -> Result<crate::engine::locks::Guard, crate::engine::locks::Conflict> {
        let mut wanted: Vec<(String, Scope)> =
            names.filter(|n| check_name(n).is_ok()).map(|n| (dir.to_string(), Scope::Name(n.to_string()))).collect();
        wanted.sort();
        wanted.dedup();
        self.engine.locks().lock(&wanted, None, true).await
    }

    /// `statv` and `openv` without creation: reads only, no lock.
    async fn read_batch(
        self: &Arc<Self>,
        op: BatchOp,
        dir: &str,
        names: &[String],
        semantics: Semantics,
        via: Via,
        c: &Call,
    ) -> OpResult<BatchReply> {
        let d = self.engine.host(dir, via)?.obj;
        perm::check_search(c, &d, dir)?;
        let mut results = Results::new(semantics, names.len());
        // One batched lookup of every valid name (stop-on-failure may leave some unused).
        let valid: Vec<&str> = names.iter().map(String::as_str).filter(|n| check_name(n).is_ok()).collect();
        let mut found = self.engine.store().get_entries(d.ino, &valid).map_err(eio)?.into_iter();
        for name in names {
            let r = match check_name(name) {
                Err(e) => Err(e.errno),
                Ok(()) => match found.next().flatten() {
                    None => Err(Errno::ENOENT),
                    Some(e) if e.kind == FileKind::Dir && op == BatchOp::Open => Err(Errno::EISDIR),
                    Some(e) if e.kind == FileKind::Dir => Ok(Some(Attr { incarnation: 0, ..Attr::of_inode(&e) })),
                    Some(e) if e.link_home.is_some() => match self.links.resolve(&join(dir, name), e).await {
                        Ok(i) => Ok(Some(Attr::of_inode(&i))),
                        Err(e) => Err(e.errno()),
                    },
                    Some(e) => Ok(Some(Attr::of_inode(&e))),
                },
            };
            if !results.push(r) {
                break;
            }
        }
        Ok(results.reply)
    }

    /// Creates or removes entries of `dir` in one store write. `decide` maps an entry's
    /// current inode (as changed by earlier entries of the same batch) to a change. If the
    /// directory (on its home) goes over its threshold, the batch stops there, the
    /// directory is distributed, and the reply carries the distribution so the client
    /// sends the rest to the storing servers (seed 000 §3.1).
    async fn write_batch<F>(
        self: &Arc<Self>,
        dir: &str,
        names: &[String],
        semantics: Semantics,
        via: Via,
        c: &Call,
        decide: F,
    ) -> OpResult<Option<BatchReply>>
    where
        F: Fn(&DirObject, Option<&Inode>) -> Result<Change, Errno>,
    {
        let guard = self.lock_names(dir, names.iter().map(String::as_str)).await;
        let mut host = self.engine.host(dir, via)?;
        if !host.shard && self.engine.over_threshold(&host.obj) {
            // Due for distribution before this batch: distribute, then every entry goes
            // to the storing servers.
            drop(guard);
            let info = self.hugedirs.distribute(dir).await?;
            let mut reply = Results::new(semantics, 0).reply;
            reply.dist = Some(info.unwrap_or_else(|| self.engine.dist_info(dir, &host.obj)));
            return Ok(Some(reply));
        }
        // What every valid name is now, in one batched lookup; then, entry by entry, what
        // the earlier entries of this batch made of it.
        let valid: Vec<&str> = names.iter().map(String::as_str).filter(|n| check_name(n).is_ok()).collect();
        let found = self.engine.store().get_entries(host.obj.ino, &valid).map_err(eio)?;
        if found.iter().flatten().any(|e| e.link_home.is_some()) {
            return Ok(None); // hard links: entry by entry (`each`)
        }
        let mut overlay: HashMap<&str, Option<Inode>> = valid.into_iter().zip(found).collect();
        let mut batch = Batch::counted();
        let mut results = Results::new(semantics, names.len());
        // Data records of removed files.
        let mut gone = std::collections::BTreeSet::new();
        for name in names {
            let r = match check_name(name) {
                Err(e) => Err(e.errno),
                Ok(()) => {
                    let cur = overlay.get(name.as_str()).cloned().flatten();
                    match decide(&host.obj, cur.as_ref()) {
                        Err(e) => Err(e),
                        Ok(Change::Keep(a)) => Ok(Some(a)),
                        Ok(Change::Create(mut inode)) => {
                            inode.ino = self.engine.new_ino().await?;
                            count_entry(&mut host.obj, inode.kind, 1);
                            batch.put_entry(host.obj.ino, name, &inode);
                            let a = Attr::of_inode(&inode);
                            overlay.insert(name, Some(inode));
                            Ok(Some(a))
                        }
                        Ok(Change::Remove(kind)) => {
                            if let Some(inode) = &cur {
                                gone.extend(plusfs_proto::filedata::records(&inode.pieces));
                            }
                            count_entry(&mut host.obj, kind, -1);
                            batch.del_entry(host.obj.ino, name);
                            overlay.insert(name, None);
                            Ok(None)
                        }
                    }
                }
            };
            if !results.push(r) {
                break;
            }
            if !host.shard && self.engine.over_threshold(&host.obj) {
                break;
            }
        }
        let over = !host.shard && self.engine.over_threshold(&host.obj);
        let gate = self.engine.data_gate().read().await;
        let remote = self.engine.drop_unused(&gone, &Default::default(), &mut batch)?;
        if !batch.is_empty() {
            host.save(&mut batch, dir);
            // Recorded with the batch for a resend; when the directory is due for
            // distribution, as being distributed (the client then sends the rest anew).
            let mut recorded = results.reply.clone();
            if over {
                let mut info = self.engine.dist_info(dir, &host.obj);
                info.state = plusfs_proto::DistState::Distributing;
                recorded.dist = Some(info);
            }
            c.answer_with_next_batch(&Ok(Reply::Batch(recorded)));
            match self.engine.apply_for(c, batch).await {
                // A quota refuses the batch: entry by entry, so those that fit are made
                // and the rest get EDQUOT (`each`).
                Err(e) if e.errno() == Errno::EDQUOT => {
                    c.disarm();
                    return Ok(None);
                }
                applied => applied?,
            }
        }
        drop(gate);
        drop(guard);
        self.filedata.drop_remote(remote).await;
        let mut reply = results.reply;
        if over {
            // What was done is done; the rest goes to the storing servers, or, if the
            // distribution failed (it stays `Distributing`), waits for it.
            reply.dist = Some(match self.hugedirs.distribute(dir).await {
                Ok(Some(info)) => info,
                // Not distributed after all (its policy changed meanwhile): send the rest again.
                Ok(None) => self.engine.dist_info(dir, &host.obj),
                Err(e) => {
                    tracing::error!(dir, cause = %e.message(), "redistribution failed");
                    let mut info = self.engine.dist_info(dir, &host.obj);
                    info.state = plusfs_proto::DistState::Distributing;
                    info
                }
            });
        }
        Ok(Some(reply))
    }

    #[allow(clippy::too_many_arguments)]
    /// `mkdirv`: each directory's object may live on another server. Under perform-all the
    /// whole batch is one transaction (see `mkdirv_together`); under stop-on-failure the
    /// entries run one after the other.
    async fn mkdirv(
        self: &Arc<Self>,
        dir: &str,
        names: &[String],
        mode: u32,
        owner: (u32, u32),
        semantics: Semantics,
        via: Via,
        c: &Call,
    ) -> OpResult<BatchReply> {
        // A distributed directory redirects here, before anything is done.
        perm::check_search(c, &self.engine.host(dir, via)?.obj, dir)?;
        let mut results = Results::new(semantics, names.len());
        match semantics {
            Semantics::PerformAll => {
                for r in self.mkdirv_together(dir, names, mode, owner, via, c).await {
                    results.push(r);
                }
            }
            Semantics::StopOnFailure => {
                for name in names {
                    if !results.push(self.mkdir_entry(dir, name, mode, owner, via, c).await) {
                        break;
                    }
                }
            }
        }
        Ok(results.reply)
    }

    /// Perform-all `mkdirv`: entries that can be checked here (bad names, existing or
    /// repeated names) fail at once; the others are made in one transaction, so a batch
    /// costs one message pair per server. If that transaction fails, each remaining entry
    /// is retried on its own to give it its own result.
    async fn mkdirv_together(
        self: &Arc<Self>,
        dir: &str,
        names: &[String],
        mode: u32,
        owner: (u32, u32),
        via: Via,
        c: &Call,
    ) -> Vec<EntryResult> {
        let parent = match self.engine.host(dir, via) {
            Ok(h) => h.obj,
            Err(e) => return vec![Err(e.errno()); names.len()],
        };
        let mut out: Vec<Option<EntryResult>> = vec![None; names.len()];
        let mut seen = std::collections::HashSet::new();
        let mut todo: Vec<usize> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            out[i] = match check_name(name) {
                Err(e) => Some(Err(e.errno)),
                Ok(()) if !seen.insert(name.as_str()) => Some(Err(Errno::EEXIST)),
                Ok(()) => match self.engine.store().get_entry(parent.ino, name) {
                    Err(_) => Some(Err(Errno::EIO)),
                    Ok(Some(_)) => Some(Err(Errno::EEXIST)),
                    Ok(None) => {
                        todo.push(i);
                        None
                    }
                },
            };
        }
        let batch: Vec<&str> = todo.iter().map(|&i| names[i].as_str()).collect();
        let policy = (plusfs_proto::Threshold::Cluster, 0);
        let together = if batch.is_empty() {
            Ok(Vec::new())
        } else {
            let plan = crate::twopc::Plan::now(&self.engine);
            self.twopc.mkdir_many(plan, dir, &batch, mode, owner, policy, via, c).await
        };
        match together {
            Ok(attrs) => {
                for (i, a) in todo.iter().zip(attrs) {
                    out[*i] = Some(Ok(Some(a)));
                }
            }
            Err(_) => {
                let each = todo.iter().map(|&i| self.mkdir_entry(dir, &names[i], mode, owner, via, c));
                for (i, r) in todo.iter().zip(futures::future::join_all(each).await) {
                    out[*i] = Some(r);
                }
            }
        }
        out.into_iter().map(|r| r.expect("every entry decided")).collect()
    }

    #[allow(clippy::too_many_arguments)]
    async fn mkdir_entry(
        self: &Arc<Self>,
        dir: &str,
        name: &str,
        mode: u32,
        owner: (u32, u32),
        via: Via,
        c: &Call,
    ) -> EntryResult {
        check_name(name).map_err(|e| e.errno)?;
        let path = join(dir, name);
        let policy = (plusfs_proto::Threshold::Cluster, 0);
        match self.twopc.retrying(|plan| self.twopc.mkdir(plan, &path, mode, owner, policy, via, c)).await {
            Ok(Reply::Attr(a)) => Ok(Some(a)),
            Ok(_) => Err(Errno::EIO),
            Err(e) => Err(e.errno()),
        }
    }

    /// `closev`: no server state is kept for open files yet, so every handle closes.
    pub(crate) fn closev(&self, inos: &[Ino]) -> OpResult<Reply> {
        Ok(Reply::Batch(BatchReply { errnos: vec![Errno::OK; inos.len()], attrs: Vec::new(), dist: None }))
    }
}

/// What a write batch does to one entry.
enum Change {
    /// Leave it; report these attributes (opening an existing file).
    Keep(Attr),
    /// Create this inode (its number is allocated when it is written).
    Create(Inode),
    Remove(FileKind),
}

#[cfg(test)]
mod tests {
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{BatchOp, Errno, Reply, Semantics};

    #[tokio::test]
    async fn a_batch_of_creates_is_one_store_write_with_a_result_per_name() {
        let kit = Kit::new().await;
        kit.osd.engine.new_inos(1).await.unwrap(); // the id block reserved first
        let mut names: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
        let c = root();
        let before = kit.store.committed();
        let op = BatchOp::Create { exclusive: true };
        let r = kit.osd.batches.batch(op, "/", &names, 0o644, (0, 0), Semantics::PerformAll, Via::Home, &c);
        let Reply::Batch(reply) = r.await.unwrap() else { panic!("a batch reply") };
        assert!(reply.errnos.iter().all(|e| *e == Errno::OK), "{:?}", reply.errnos);
        assert_eq!(kit.store.committed() - before, 1, "one store write for 100 creates");
        assert_eq!(kit.osd.engine.dir_object("/").unwrap().entries, 100);
        // Again with one new name: the others exist.
        names.push("new".into());
        let r = kit.osd.batches.batch(op, "/", &names, 0o644, (0, 0), Semantics::PerformAll, Via::Home, &c);
        let Reply::Batch(reply) = r.await.unwrap() else { panic!("a batch reply") };
        assert_eq!(reply.errnos.iter().filter(|e| **e == Errno::EEXIST).count(), 100);
        assert_eq!(reply.errnos.last(), Some(&Errno::OK));
    }
}
