//! Operations that change two or more servers, and the logged two-phase commit under them.
//!
//! The server that receives the client's request coordinates. It writes a coordinator log
//! record (`Preparing`), sends each participant (itself included, without a message) its
//! sub-operations in one `TxPrepare`; a participant checks them, locks what they touch,
//! writes a participant record and votes. All YES: the coordinator logs `Committing` with
//! the commit payloads, sends `TxCommit`, and answers the client once every participant has
//! applied its part. Any NO: `Aborting`, `TxAbort` to all, the first NO's error goes to the
//! client (a NO caused by another transaction's lock is retried after a random back-off).
//! A record is deleted once every participant acknowledged. After a crash the coordinator
//! aborts `Preparing` transactions and re-sends the decision of the others until
//! acknowledged; participants keep their locks until they hear it.

use crate::backoff::Backoff;
use crate::engine::call::Call;
use crate::engine::errors::{eio, err, split_entry, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::logrec::{self, Logged};
use crate::engine::perm;
use crate::engine::subops::{rebase_ancestry, Prepared};
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use crate::filedata::FileData;
use crate::links::Links;
use crate::migrate::Migration;
use crate::peers::Peers;
use futures::future::join_all;
use plusfs_proto::path::{is_within, rebase};
use plusfs_proto::{
    Ancestry, Attr, CommitPayload, Cred, DirDump, DirObject, DistState, DistributionWait, Errno, FileKind, Ino, Inode,
    Replace, Reply, Request, ServerId, SubOp, Threshold, Timespec, TxId, Vote,
};
use plusfs_store::{Batch, LogKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often a transaction that met another's lock is retried before giving up (EBUSY).
const MAX_ATTEMPTS: u32 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum CoordState {
    Preparing,
    Committing,
    Aborting,
}

/// The coordinator's log record of one transaction.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CoordRecord {
    state: CoordState,
    participants: Vec<ServerId>,
    payloads: Vec<(ServerId, CommitPayload)>,
}

impl Logged for CoordRecord {
    const KIND: LogKind = LogKind::Coordinator;
    const WHAT: &'static str = "coordinator record";
    const VERSION: u8 = 3;
    fn upgrade(version: u8, body: &[u8]) -> Result<Self, crate::engine::logrec::RecordError> {
        crate::engine::logrec::older_ancestries(version, body, Self::VERSION)
    }
}

/// Where a rename puts the destination entry.
struct DstAt {
    server: ServerId,
    /// Incarnation of the destination directory when the entry goes into a shard.
    shard: Option<u64>,
    /// Storing set of a distributed directory the rename replaces (its shards go too).
    replaced_shards: Vec<ServerId>,
    /// The hard link the rename replaces: shared inode and its home (it loses a link).
    replaced_link: Option<(Ino, ServerId)>,
}

/// Sub-operations per participant, in the order their errors take precedence.
pub(crate) type Parts = Vec<(ServerId, Vec<SubOp>)>;

pub(crate) fn add_part(parts: &mut Parts, server: ServerId, op: SubOp) {
    match parts.iter_mut().find(|(s, _)| *s == server) {
        Some((_, ops)) => ops.push(op),
        None => parts.push((server, vec![op])),
    }
}

/// Routes the inodes voted out by the two `ExchangeEntry` sub-operations of `parts` to
/// the payload of the other side's server, and the inode of a file a rename moves (as its
/// old entry held it at the vote) to the server of its new entry.
fn swap_payloads(
    parts: &Parts,
    swapped: Vec<(String, String, Inode)>,
    payloads: &mut HashMap<ServerId, CommitPayload>,
) {
    let removed: Vec<(&String, &String, Ino)> = parts
        .iter()
        .flat_map(|(_, ops)| ops.iter())
        .filter_map(|o| match o {
            SubOp::RemoveEntry { dir, name, ino, .. } if *ino != 0 => Some((dir, name, *ino)),
            _ => None,
        })
        .collect();
    for (server, ops) in parts {
        for op in ops {
            let SubOp::InsertEntry { dir, name, inode, .. } = op else { continue };
            let Some((sd, sn, _)) = removed.iter().find(|r| r.2 == inode.ino) else { continue };
            if let Some((_, _, now)) = swapped.iter().find(|(d, n, i)| d == *sd && n == *sn && i.ino == inode.ino) {
                payloads.entry(*server).or_default().swap_in.push((dir.clone(), name.clone(), now.clone()));
            }
        }
    }
    exchange_payloads(parts, swapped, payloads);
}

/// The `ExchangeEntry` half of [`swap_payloads`].
fn exchange_payloads(
    parts: &Parts,
    swapped: Vec<(String, String, Inode)>,
    payloads: &mut HashMap<ServerId, CommitPayload>,
) {
    let sides: Vec<(ServerId, &String, &String)> = parts
        .iter()
        .flat_map(|(s, ops)| {
            ops.iter().filter_map(move |o| match o {
                SubOp::ExchangeEntry { dir, name, .. } => Some((*s, dir, name)),
                _ => None,
            })
        })
        .collect();
    let [(sa, da, na), (sb, db, nb)] = sides[..] else { return };
    let inode_of = |d: &String, n: &String| swapped.iter().find(|(sd, sn, _)| sd == d && sn == n).map(|x| x.2.clone());
    if let (Some(ia), Some(ib)) = (inode_of(da, na), inode_of(db, nb)) {
        payloads.entry(sa).or_default().swap_in.push((da.clone(), na.clone(), ib));
        payloads.entry(sb).or_default().swap_in.push((db.clone(), nb.clone(), ia));
    }
}

/// How long a rename or link waits for its destination directory to be distributed.
pub(crate) const DISTRIBUTING_WAIT: Duration = Duration::from_secs(60);

/// EAGAIN for a directory that stayed `Distributing` longer than [`DISTRIBUTING_WAIT`].
pub(crate) fn still_distributing(dir: &str) -> OpError {
    err(Errno::EAGAIN, format!("'{dir}' is still being distributed"))
}

/// One attempt of an operation that may span servers: the epoch of the map it plans
/// with, which its transaction carries (a participant at a newer epoch refuses it, and
/// the operation plans again).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    epoch: u64,
}

impl Plan {
    /// An attempt planned with the map `engine` works with now.
    pub(crate) fn now(engine: &Engine) -> Plan {
        Plan { epoch: engine.map().epoch }
    }
}

/// Operations spanning servers and the two-phase commit under them.
pub(crate) struct TwoPhase {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    failpoints: Arc<Failpoints>,
    filedata: Arc<FileData>,
    links: Arc<Links>,
    migrate: Arc<Migration>,
}

impl TwoPhase {
    pub(crate) fn new(
        engine: Arc<Engine>,
        peers: Arc<Peers>,
        failpoints: Arc<Failpoints>,
        filedata: Arc<FileData>,
        links: Arc<Links>,
        migrate: Arc<Migration>,
    ) -> TwoPhase {
        TwoPhase { engine, peers, failpoints, filedata, links, migrate }
    }
}

impl TwoPhase {
    // ----- client-facing operations -------------------------------------------------

    /// `mkdir`; `policy` is the new directory's huge-directory threshold and width.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn mkdir(
        self: &Arc<Self>,
        plan: Plan,
        p: &str,
        mode: u32,
        owner: (u32, u32),
        policy: (Threshold, u32),
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        let (dir, name) = split_entry(p)?;
        let parent = self.engine.host(dir, via)?.obj;
        perm::check_search(c, &parent, dir)?;
        if self.engine.store().get_entry(parent.ino, name).map_err(eio)?.is_some() {
            return Err(err(Errno::EEXIST, format!("'{p}' exists")));
        }
        let attrs = self.mkdir_many(plan, dir, &[name], mode, owner, policy, via, c).await?;
        if policy.0.resolve(self.engine.cluster_threshold()) == Threshold::Entries(0) {
            // Distributed from creation: its home distributes it now.
            let req = Request::SetPolicy { path: p.to_string(), threshold: None, width: None };
            if let Err(e) = self.peers.call(self.engine.map().home_of_dir(p), req, &Cred::server()).await {
                tracing::warn!(path = p, cause = %e.message, "cannot distribute a new directory yet");
            }
        }
        Ok(Reply::Attr(attrs.into_iter().next().expect("one directory made")))
    }

    /// Makes subdirectories `names` of `dir` in one atomic operation: this server inserts
    /// every entry, each child's home creates its objects, one sub-operation list per server.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn mkdir_many(
        self: &Arc<Self>,
        plan: Plan,
        dir: &str,
        names: &[&str],
        mode: u32,
        owner: (u32, u32),
        policy: (Threshold, u32),
        via: Via,
        c: &Call,
    ) -> OpResult<Vec<Attr>> {
        let mut parts = Parts::new();
        let mut attrs = Vec::with_capacity(names.len());
        let parent = self.engine.host(dir, via)?.obj;
        let n = perm::new_entry(c, &parent, owner, mode, FileKind::Dir);
        let (uid, gid) = (n.uid, n.gid);
        for name in names {
            let mut object = DirObject::new(self.engine.new_ino().await?, n.mode, uid, gid);
            object.xattrs = n.xattrs.clone();
            object.dist.threshold = policy.0;
            object.dist.width = policy.1;
            object.ancestry = parent.ancestry.clone().map(|a| a.with(object.search_elem()));
            let path = plusfs_proto::path::join(dir, name);
            let entry = SubOp::InsertEntry {
                dir: dir.to_string(),
                name: name.to_string(),
                inode: Inode { uid, ..Inode::subdir(object.ino) },
                replace: Replace::Never,
                shard: via.shard(),
            };
            add_part(&mut parts, self.engine.id(), entry);
            attrs.push(Attr::of_dir(&object));
            add_part(&mut parts, self.engine.map().home_of_dir(&path), SubOp::CreateDir { path, object });
        }
        self.run(plan, parts, c).await?;
        Ok(attrs)
    }

    /// `rmdir`. A distributed directory's shards are removed in the same transaction;
    /// the first attempt learns them from the home's redirect.
    pub(crate) async fn rmdir(self: &Arc<Self>, plan: Plan, p: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let (dir, name) = split_entry(p)?;
        let host = self.engine.host(dir, via)?.obj;
        perm::check_search(c, &host, dir)?;
        let e = self.engine.entry(&host, p, name)?;
        if e.kind != FileKind::Dir {
            return Err(err(Errno::ENOTDIR, format!("'{p}' is not a directory")));
        }
        let parts = |shards: &[ServerId]| {
            let mut parts = Parts::new();
            let remove = SubOp::RemoveEntry { dir: dir.into(), name: name.into(), ino: e.ino, shard: via.shard() };
            add_part(&mut parts, self.engine.id(), remove);
            let remove_dir = SubOp::RemoveDir { path: p.into(), ino: e.ino, shards: shards.to_vec() };
            add_part(&mut parts, self.engine.map().home_of_dir(p), remove_dir);
            for s in plusfs_proto::hugedir::distinct(shards) {
                add_part(&mut parts, s, SubOp::RemoveShard { path: p.into(), ino: e.ino });
            }
            parts
        };
        match self.run(plan, parts(&[]), c).await {
            Err(OpError::Redirect(info)) if info.path == p && info.state == DistState::Distributed => {
                self.run(plan, parts(&info.set), c).await?
            }
            r => r?,
        }
        Ok(Reply::Done)
    }

    /// The storing server of entry `name` of distributed directory `dir` by `set`, this
    /// shard's copy of the storing set; when that names a server being drained or gone (the
    /// set changed since the copy: a shard moved), by the set the home holds now.
    async fn dst_shard_server(&self, dir: &str, set: &[ServerId], name: &str) -> OpResult<ServerId> {
        let server = set[plusfs_proto::hugedir::slot_of(name, set.len())];
        if self.engine.map().server(server).is_some_and(|s| s.weight > 0.0) {
            return Ok(server);
        }
        let ask = Request::ShardSet { path: dir.to_string() };
        match self.peers.call(self.engine.map().home_of_dir(dir), ask, &plusfs_proto::Cred::server()).await? {
            Reply::Dist(d) if !d.set.is_empty() => Ok(d.set[plusfs_proto::hugedir::slot_of(name, d.set.len())]),
            other => Err(err(Errno::EIO, format!("the home of '{dir}' answered {other:?}"))),
        }
    }

    /// `rename`. The destination entry's server is learnt like a client would: the home of
    /// its parent, or the storing server Eq. 2 gives after a redirect.
    pub(crate) async fn rename(
        self: &Arc<Self>,
        plan: Plan,
        src: &str,
        dst: &str,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        let (sdir, sname) = split_entry(src)?;
        let (ddir, dname) = split_entry(dst)?;
        let src_host = self.engine.host(sdir, via)?;
        perm::check_search(c, &src_host.obj, sdir)?;
        let e = self.engine.entry(&src_host.obj, src, sname)?;
        if e.link_home.is_some() && src_host.obj.mode & libc::S_ISVTX != 0 && !c.is_root() {
            // A hard link's owner is with its inode (the prepare checks other entries).
            let owner = self.links.resolve(src, e.clone()).await?.uid;
            perm::check_sticky(c, &src_host.obj, owner, src)?;
        }
        if src == dst {
            return Ok(Reply::Done);
        }
        // Recorded with its commit (decision or one local batch): a resend after a failover
        // then knows, and one that finds it marked without an answer knows its transaction
        // was aborted.
        c.answer_at_commit(&Ok(Reply::Done));
        let mut at = DstAt {
            server: self.engine.map().home_of_dir(ddir),
            shard: None,
            replaced_shards: Vec::new(),
            replaced_link: None,
        };
        if ddir == sdir {
            at.server = self.engine.id();
            if let Via::Shard(inc) = via {
                let server = self.dst_shard_server(sdir, &src_host.obj.dist.set, dname).await?;
                at = DstAt { server, shard: Some(inc), ..at };
            }
        }
        let mut waiting = DistributionWait::new(DISTRIBUTING_WAIT);
        let mut changes = 0;
        while changes < 4 {
            changes += 1;
            match self.rename_to(plan, src, dst, &e, via, &at, c).await {
                // Two links of one file: POSIX says the rename does nothing.
                Err(OpError::ReplacedLink { ino, .. }) if ino == e.ino => return Ok(Reply::Done),
                Err(OpError::ReplacedLink { ino, home, .. }) => {
                    at.replaced_link = Some((ino, self.links.home_now(home, ino).await?))
                }
                // Being distributed: its storing servers may not hold their shards yet.
                Err(OpError::Redirect(info) | OpError::Distributing(info))
                    if info.path == ddir && info.state == DistState::Distributing =>
                {
                    if !waiting.wait().await {
                        return Err(still_distributing(ddir));
                    }
                    changes -= 1;
                }
                Err(OpError::Redirect(info) | OpError::Distributing(info)) if info.path == ddir => {
                    at.server = info.server_of(dname);
                    at.shard = Some(info.incarnation);
                }
                Err(OpError::Redirect(info)) if info.path == dst && info.state == DistState::Distributed => {
                    at.replaced_shards = info.set.clone()
                }
                r => return r,
            }
        }
        Err(OpError::Conflict(format!("the distribution of '{ddir}' keeps changing")))
    }

    #[allow(clippy::too_many_arguments)]
    async fn rename_to(
        self: &Arc<Self>,
        plan: Plan,
        src: &str,
        dst: &str,
        e: &Inode,
        via: Via,
        at: &DstAt,
        c: &Call,
    ) -> OpResult<Reply> {
        let (sdir, sname) = split_entry(src)?;
        let (ddir, dname) = split_entry(dst)?;
        let mut parts = Parts::new();
        let remove = SubOp::RemoveEntry { dir: sdir.into(), name: sname.into(), ino: e.ino, shard: via.shard() };
        add_part(&mut parts, self.engine.id(), remove);
        let dst_home = at.server;
        if e.kind != FileKind::Dir {
            let mut inode = e.clone();
            inode.ctime = Timespec::now();
            let replace = at.replaced_link.map_or(Replace::NonDir, |(ino, _)| Replace::Link(ino));
            let insert = SubOp::InsertEntry { dir: ddir.into(), name: dname.into(), inode, replace, shard: at.shard };
            add_part(&mut parts, dst_home, insert);
            if let Some((ino, home)) = at.replaced_link {
                add_part(&mut parts, home, SubOp::AdjustLinks { ino, delta: -1 });
            }
        } else {
            // Look the destination up first, as POSIX path resolution would: a missing
            // destination parent is ENOENT even when the move is also into itself.
            let mut stat = Request::Stat { path: dst.into() };
            if let Some(incarnation) = at.shard {
                stat = Request::Shard { incarnation, op: Box::new(stat) };
            }
            let replace = match self.peers.call(dst_home, stat, c).await {
                Ok(Reply::IsDir { ino }) => Replace::Dir(ino),
                Ok(Reply::Attr(_)) => return Err(err(Errno::ENOTDIR, format!("'{dst}' is not a directory"))),
                Ok(other) => return Err(err(Errno::EIO, format!("unexpected reply {other:?}"))),
                Err(e) if e.errno == Errno::ENOENT && e.missing_dir.is_none() => Replace::Never,
                Err(e) => return Err(e.into()),
            };
            if is_within(dst, src) {
                return Err(err(Errno::EINVAL, format!("cannot move '{src}' into itself ('{dst}')")));
            }
            let insert = SubOp::InsertEntry {
                dir: ddir.into(),
                name: dname.into(),
                inode: Inode { uid: e.uid, ..Inode::subdir(e.ino) },
                replace,
                shard: at.shard,
            };
            add_part(&mut parts, dst_home, insert);
            if let Replace::Dir(old) = replace {
                let remove_dir = SubOp::RemoveDir { path: dst.into(), ino: old, shards: at.replaced_shards.clone() };
                add_part(&mut parts, self.engine.map().home_of_dir(dst), remove_dir);
                for s in plusfs_proto::hugedir::distinct(&at.replaced_shards) {
                    add_part(&mut parts, s, SubOp::RemoveShard { path: dst.into(), ino: old });
                }
            }
            let rebase = self.rebase_of(sdir, ddir, c).await?;
            for s in &self.engine.map().servers {
                let export = SubOp::ExportSubtree { root: src.into(), new_root: dst.into(), rebase: rebase.clone() };
                add_part(&mut parts, s.id, export);
            }
        }
        self.run(plan, parts, c).await?;
        Ok(Reply::Done)
    }

    /// The ancestries of a moved directory's old and new parents (`None` when one has
    /// none), read from their homes.
    async fn rebase_of(self: &Arc<Self>, sdir: &str, ddir: &str, c: &Call) -> OpResult<Option<(Ancestry, Ancestry)>> {
        let mut get = Vec::new();
        for d in [sdir, ddir] {
            get.push(
                match self.peers.call(self.engine.map().home_of_dir(d), Request::DirPerms { path: d.into() }, c).await?
                {
                    Reply::DirPerms { ancestry, .. } => ancestry,
                    other => return Err(err(Errno::EIO, format!("unexpected reply {other:?}"))),
                },
            );
        }
        let to = get.pop().flatten();
        Ok(get.pop().flatten().zip(to))
    }

    // ----- coordinator --------------------------------------------------------------

    /// Runs an operation that may span servers, again from the start (re-reading what it
    /// depends on) while it loses against another transaction (EBUSY), with a random
    /// back-off; after [`MAX_ATTEMPTS`] the client gets EBUSY. A refusal because a
    /// directory is being distributed is waited out instead (up to [`DISTRIBUTING_WAIT`]).
    pub(crate) async fn retrying<F, Fut>(self: &Arc<Self>, mut op: F) -> OpResult<Reply>
    where
        F: FnMut(Plan) -> Fut,
        Fut: std::future::Future<Output = OpResult<Reply>>,
    {
        let mut attempt = 0;
        let mut backoff = Backoff::conflict(&self.engine.map());
        let mut waiting = DistributionWait::new(DISTRIBUTING_WAIT);
        loop {
            // Each attempt plans with the map it starts with; its transaction carries that
            // epoch.
            match op(Plan::now(&self.engine)).await {
                Err(e @ OpError::Distributing(_)) => {
                    if !waiting.wait().await {
                        return Err(e);
                    }
                }
                Err(e) if e.is_retryable() && attempt + 1 < MAX_ATTEMPTS => {
                    attempt += 1;
                    // A participant may have refused because a newer map homes a
                    // directory elsewhere: plan the next attempt with that map.
                    self.migrate.refresh_if_stale().await;
                    backoff.wait().await;
                }
                r => return r,
            }
        }
    }

    /// Runs `parts` atomically for caller `c` (whose permissions each participant checks
    /// at prepare): in one local store batch when only this server takes part, else by
    /// two-phase commit.
    pub(crate) async fn run(self: &Arc<Self>, plan: Plan, parts: Parts, c: &Call) -> OpResult<()> {
        if parts.len() == 1 && parts[0].0 == self.engine.id() {
            return self.run_local(parts.into_iter().next().map(|p| p.1).unwrap_or_default(), c).await;
        }
        self.two_phase_commit(plan, &parts, c).await
    }

    /// All sub-operations are local: prepare and commit them as one batch, no log.
    async fn run_local(self: &Arc<Self>, ops: Vec<SubOp>, c: &Call) -> OpResult<()> {
        let txid = self.engine.new_txid().await?;
        self.engine.room_for(&ops).await?;
        let (guard, prepared) = self.engine.check_subops(txid, &ops, true, &mut Vec::new(), c).await?;
        let mut payloads = if prepared.exported.is_empty() {
            HashMap::new()
        } else {
            // A directory rename inside a one-server cluster: re-home locally.
            let exports = self.engine.dump(&prepared.exported)?;
            self.payloads_from_exports(&ops, exports)
        };
        let parts = vec![(self.engine.id(), ops.clone())];
        swap_payloads(&parts, self.swap_out(&ops).await?, &mut payloads);
        let payload = payloads.remove(&self.engine.id()).unwrap_or_default();
        let (batch, remote) = self.engine.commit_batch(&prepared, &payload)?;
        c.commit_point();
        self.engine.apply_for(c, batch).await?;
        drop(guard);
        self.links.relink_landed(&prepared.ops);
        self.filedata.drop_remote(remote).await;
        self.engine.check_thresholds(&prepared.ops);
        Ok(())
    }

    async fn two_phase_commit(self: &Arc<Self>, plan: Plan, parts: &Parts, c: &Call) -> OpResult<()> {
        let epoch = plan.epoch;
        if epoch < self.engine.map().epoch {
            return Err(OpError::StaleEpoch("the map changed while the operation was planned".into()));
        }
        self.engine.metrics().tx_started.fetch_add(1, Ordering::Relaxed);
        let txid = self.engine.new_txid().await?;
        let participants: Vec<ServerId> = parts.iter().map(|p| p.0).collect();
        let mut rec = CoordRecord { state: CoordState::Preparing, participants, payloads: vec![] };
        self.log_coord(txid, &rec, c).await?;

        let votes = join_all(parts.iter().map(|(s, ops)| {
            let ops = ops.clone();
            async move { self.peers.call(*s, Request::TxPrepare { txid, ops, epoch }, c).await }
        }))
        .await;
        let first_no = votes.iter().find_map(|v| v.as_ref().err().cloned());
        if let Some(no) = first_no {
            tracing::debug!(txid, cause = %no.message, "transaction aborted");
            rec.state = CoordState::Aborting;
            self.log_coord(txid, &rec, c).await?;
            self.clone().finish(txid, rec).await;
            return Err(no.into());
        }
        self.failpoints.hit(crate::failpoint::FailStep::CoordinatorAfterVotes).await;
        let (mut exports, mut swapped) = (Vec::new(), Vec::new());
        for v in votes {
            if let Ok(Reply::Vote(Vote { exports: e, swap_out })) = v {
                exports.extend(e);
                swapped.extend(swap_out);
            }
        }
        let ops: Vec<SubOp> = parts.iter().flat_map(|p| p.1.iter().cloned()).collect();
        let mut payloads = self.payloads_from_exports(&ops, exports);
        swap_payloads(parts, swapped, &mut payloads);
        rec.state = CoordState::Committing;
        rec.payloads = parts.iter().map(|(s, _)| (*s, payloads.remove(s).unwrap_or_default())).collect();
        c.commit_point();
        self.log_coord(txid, &rec, c).await?;
        self.failpoints.hit(crate::failpoint::FailStep::CoordinatorAfterCommitRecord).await;
        self.clone().finish(txid, rec).await;
        Ok(())
    }

    /// `rename(a, b)` with `RENAME_EXCHANGE`, on `a`'s entry server: both entries (files,
    /// symlinks, links; not directories) swap their inodes in one transaction.
    pub(crate) async fn exchange(self: &Arc<Self>, a: &str, b: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let (adir, aname) = split_entry(a)?;
        let (bdir, bname) = split_entry(b)?;
        let host = self.engine.host(adir, via)?.obj;
        perm::check_search(c, &host, adir)?;
        self.engine.entry(&host, a, aname)?;
        if a == b {
            return Ok(Reply::Done);
        }
        // Recorded with the commit decision: a resend after a failover then knows.
        c.answer_at_commit(&Ok(Reply::Done));
        let mut at = (self.engine.map().home_of_dir(bdir), None);
        let mut waiting = DistributionWait::new(DISTRIBUTING_WAIT);
        let mut changes = 0;
        while changes < 3 {
            changes += 1;
            let mut parts = Parts::new();
            add_part(
                &mut parts,
                self.engine.id(),
                SubOp::ExchangeEntry { dir: adir.into(), name: aname.into(), shard: via.shard() },
            );
            add_part(&mut parts, at.0, SubOp::ExchangeEntry { dir: bdir.into(), name: bname.into(), shard: at.1 });
            let attempt = |plan| {
                let parts = parts.clone();
                async move { self.run(plan, parts, c).await.map(|_| Reply::Done) }
            };
            match self.retrying(attempt).await {
                // Being distributed: its storing servers may not hold their shards yet.
                Err(OpError::Redirect(info) | OpError::Distributing(info))
                    if info.path == bdir && info.state == DistState::Distributing =>
                {
                    if !waiting.wait().await {
                        return Err(still_distributing(bdir));
                    }
                    changes -= 1;
                }
                Err(OpError::Redirect(info) | OpError::Distributing(info)) if info.path == bdir => {
                    at = (info.server_of(bname), Some(info.incarnation));
                }
                r => return r,
            }
        }
        Err(OpError::Conflict(format!("the distribution of '{bdir}' keeps changing")))
    }

    /// New homes of exported directory objects (directory rename).
    fn payloads_from_exports(&self, ops: &[SubOp], exports: Vec<DirDump>) -> HashMap<ServerId, CommitPayload> {
        let mut out: HashMap<ServerId, CommitPayload> = HashMap::new();
        let Some((root, new_root, anc)) = ops.iter().find_map(|o| match o {
            SubOp::ExportSubtree { root, new_root, rebase } => Some((root.clone(), new_root.clone(), rebase.clone())),
            _ => None,
        }) else {
            return out;
        };
        let now = Timespec::now();
        for mut dump in exports {
            if dump.path == root {
                dump.object.ctime = now;
            }
            dump.object.ancestry = rebase_ancestry(dump.object.ancestry.take(), anc.as_ref());
            dump.path = rebase(&dump.path, &root, &new_root);
            out.entry(self.engine.map().home_of_dir(&dump.path)).or_default().imports.push(dump);
        }
        out
    }

    async fn log_coord(&self, txid: TxId, rec: &CoordRecord, c: &Call) -> OpResult<()> {
        let mut b = Batch::new();
        logrec::put(&mut b, txid, rec);
        self.engine.apply_for(c, b).await
    }

    /// Delivers the decision to every participant. The first round is awaited; if a
    /// participant cannot be reached, delivery goes on in the background until it acks.
    async fn finish(self: Arc<Self>, txid: TxId, rec: CoordRecord) {
        let remaining = self.deliver(txid, &rec, &rec.participants).await;
        if remaining.is_empty() {
            self.forget(txid).await;
        } else {
            tracing::warn!(txid, ?remaining, "participants unreachable; delivering decision in the background");
            tokio::spawn(self.finish_in_background(txid, rec, remaining));
        }
    }

    async fn finish_in_background(self: Arc<Self>, txid: TxId, rec: CoordRecord, mut remaining: Vec<ServerId>) {
        while !remaining.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            remaining = self.deliver(txid, &rec, &remaining).await;
        }
        tracing::info!(txid, "decision delivered to every participant");
        self.forget(txid).await;
    }

    /// Sends the decision to `targets`; returns those that did not acknowledge.
    async fn deliver(self: &Arc<Self>, txid: TxId, rec: &CoordRecord, targets: &[ServerId]) -> Vec<ServerId> {
        let results = join_all(targets.iter().map(|s| {
            let req = match rec.state {
                CoordState::Committing => {
                    let payload = rec.payloads.iter().find(|(p, _)| p == s).map(|p| p.1.clone()).unwrap_or_default();
                    Request::TxCommit { txid, payload }
                }
                _ => Request::TxAbort { txid },
            };
            async move { self.peers.call(*s, req, &Cred::server()).await }
        }))
        .await;
        targets.iter().zip(results).filter(|(_, r)| r.is_err()).map(|(s, _)| *s).collect()
    }

    async fn forget(&self, txid: TxId) {
        let mut b = Batch::new();
        b.del_log(LogKind::Coordinator, txid);
        if let Err(e) = self.engine.apply(b).await {
            tracing::error!(txid, cause = %e.message(), "cannot delete coordinator record");
        }
    }

    /// Resumes every unfinished transaction of the coordinator log (after a restart).
    pub async fn recover(self: &Arc<Self>) -> Result<(), plusfs_store::StoreError> {
        for (txid, p) in self.engine.log_all::<Prepared>()? {
            self.engine.locks().add_tx_locks(txid, &p.locks);
            tracing::info!(txid, "participant waits for the decision of an in-doubt transaction");
        }
        for (txid, mut rec) in self.engine.log_all::<CoordRecord>()? {
            if rec.state == CoordState::Preparing {
                rec.state = CoordState::Aborting;
                let mut b = Batch::new();
                logrec::put(&mut b, txid, &rec);
                self.engine.commit(b).await?;
            }
            tracing::info!(txid, state = ?rec.state, "resuming transaction");
            let targets = rec.participants.clone();
            tokio::spawn(self.clone().finish_in_background(txid, rec, targets));
        }
        Ok(())
    }

    // ----- participant --------------------------------------------------------------

    pub(crate) async fn tx_prepare(
        self: &Arc<Self>,
        txid: TxId,
        ops: Vec<SubOp>,
        epoch: u64,
        c: &Call,
    ) -> OpResult<Reply> {
        let mine = self.engine.map().epoch;
        if epoch != 0 && epoch < mine {
            // A transaction over a subtree planned with an older map could miss a server
            // objects moved to since: its coordinator plans again.
            return Err(OpError::StaleEpoch(format!(
                "planned with the map of epoch {epoch}; this server is at epoch {mine}"
            )));
        }
        self.engine.room_for(&ops).await?;
        let (guard, prepared) = self.engine.check_subops(txid, &ops, false, &mut Vec::new(), c).await?;
        let exports = self.engine.dump(&prepared.exported)?;
        let mut b = Batch::new();
        logrec::put(&mut b, txid, &prepared);
        self.engine.apply(b).await?;
        self.failpoints.hit(crate::failpoint::FailStep::ParticipantAfterPrepareRecord).await;
        self.engine.locks().add_tx_locks(txid, &prepared.locks);
        drop(guard);
        Ok(Reply::Vote(Vote { exports, swap_out: self.swap_out(&prepared.ops).await? }))
    }

    /// [`Engine::swap_out`], with every hard link whose entry names a drained inode home
    /// naming where the inode is now: a link entry a transaction moves after the drained
    /// server's last relink pass looked at its new server must not name it.
    async fn swap_out(self: &Arc<Self>, ops: &[SubOp]) -> OpResult<Vec<(String, String, Inode)>> {
        let mut out = self.engine.swap_out(ops)?;
        for (_, _, inode) in &mut out {
            if let Some(home) = inode.link_home {
                // Best effort (a drained home out of reach keeps its name): the server the
                // entry lands on checks again after its commit (`Links::relink_landed`).
                inode.link_home = Some(self.links.home_now(home, inode.ino).await.unwrap_or(home));
            }
        }
        Ok(out)
    }

    pub(crate) async fn tx_commit(self: &Arc<Self>, txid: TxId, payload: CommitPayload) -> OpResult<Reply> {
        let Some(prepared) = self.engine.log_get::<Prepared>(txid)? else {
            return Ok(Reply::Done); // already committed: the coordinator re-sent its decision
        };
        let mut locks = prepared.locks.clone();
        locks.extend(payload.imports.iter().map(|d| (d.path.clone(), Scope::Whole)));
        let guard = self.engine.locks().lock(&locks, Some(txid), true).await.map_err(|_| err(Errno::EIO, "lock"))?;
        let (mut batch, remote) = self.engine.commit_batch(&prepared, &payload)?;
        batch.del_log(LogKind::Participant, txid);
        self.engine.apply(batch).await?;
        self.engine.locks().release_tx(txid);
        drop(guard);
        self.links.relink_landed(&prepared.ops);
        self.filedata.drop_remote(remote).await;
        self.engine.check_thresholds(&prepared.ops);
        self.migrate.hand_over_strays(payload.imports.iter().map(|d| d.path.clone()).collect());
        Ok(Reply::Done)
    }

    pub(crate) async fn tx_abort(self: &Arc<Self>, txid: TxId) -> OpResult<Reply> {
        if self.engine.store().get_log(LogKind::Participant, txid).map_err(eio)?.is_some() {
            let mut b = Batch::new();
            b.del_log(LogKind::Participant, txid);
            self.engine.apply(b).await?;
        }
        self.engine.locks().release_tx(txid);
        Ok(Reply::Done)
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::{root, Kit};
    use plusfs_proto::{CommitPayload, FileKind, Inode, Replace, Reply, SubOp};
    use plusfs_store::LogKind;

    fn insert(name: &str, ino: u64) -> SubOp {
        let inode = Inode::new(ino, FileKind::File, 0o644, 0, 0);
        SubOp::InsertEntry { dir: "/".into(), name: name.into(), inode, replace: Replace::Never, shard: None }
    }

    #[tokio::test]
    async fn a_prepared_participant_keeps_its_locks_across_a_crash_and_commits_once() {
        let kit = Kit::new().await;
        let txid = kit.osd.engine.new_txid().await.unwrap();
        let vote = kit.osd.twopc.tx_prepare(txid, vec![insert("f", 900)], 0, &root()).await.unwrap();
        assert!(matches!(vote, Reply::Vote(_)), "{vote:?}");
        let root_ino = kit.osd.engine.dir_object("/").unwrap().ino;
        assert!(kit.osd.engine.store().get_entry(root_ino, "f").unwrap().is_none(), "not applied at prepare");

        let kit = kit.crash_and_restart().await;
        assert_eq!(kit.osd.engine.locks().tx_count(), 1, "the in-doubt transaction holds its locks");
        let twopc = &kit.osd.twopc;
        assert_eq!(twopc.tx_commit(txid, CommitPayload::default()).await.unwrap(), Reply::Done);
        assert_eq!(kit.osd.engine.store().get_entry(root_ino, "f").unwrap().map(|e| e.ino), Some(900));
        assert_eq!(kit.osd.engine.locks().tx_count(), 0);
        assert!(kit.osd.engine.store().get_log(LogKind::Participant, txid).unwrap().is_none());
        // The coordinator resends its decision: nothing happens twice.
        assert_eq!(twopc.tx_commit(txid, CommitPayload::default()).await.unwrap(), Reply::Done);
        assert_eq!(kit.osd.engine.dir_object("/").unwrap().entries, 1);
    }

    #[tokio::test]
    async fn an_aborted_prepare_leaves_nothing_behind() {
        let kit = Kit::new().await;
        let txid = kit.osd.engine.new_txid().await.unwrap();
        kit.osd.twopc.tx_prepare(txid, vec![insert("g", 901)], 0, &root()).await.unwrap();
        assert_eq!(kit.osd.twopc.tx_abort(txid).await.unwrap(), Reply::Done);
        let store = kit.osd.engine.store();
        assert!(store.get_log(LogKind::Participant, txid).unwrap().is_none());
        assert!(store.get_entry(kit.osd.engine.dir_object("/").unwrap().ino, "g").unwrap().is_none());
        assert_eq!(kit.osd.engine.locks().tx_count(), 0);
    }

    #[tokio::test]
    async fn a_local_mkdir_runs_in_one_batch_without_a_log() {
        let kit = Kit::new().await;
        let policy = (plusfs_proto::Threshold::Cluster, 0);
        let via = crate::engine::host::Via::Home;
        // Reserve id blocks first, so what is counted below is the mkdir's own writes.
        kit.osd.engine.new_txid().await.unwrap();
        kit.osd.engine.new_inos(1).await.unwrap();
        let before = kit.store.committed();
        let plan = super::Plan::now(&kit.osd.engine);
        let r = kit.osd.twopc.mkdir(plan, "/d", 0o755, (0, 0), policy, via, &root()).await;
        assert!(matches!(r.unwrap(), Reply::Attr(a) if a.kind == FileKind::Dir && a.nlink == 2));
        assert!(kit.osd.engine.store().get_dir("/d").unwrap().is_some());
        assert!(kit.osd.engine.store().log_records(LogKind::Coordinator).unwrap().is_empty());
        assert_eq!(kit.store.committed() - before, 1, "one batch: entry and directory object together");
    }

    #[tokio::test]
    async fn a_mkdir_over_two_servers_commits_on_both_and_leaves_no_record() {
        let mesh = crate::testkit::Mesh::new(2).await;
        let coord = mesh.home("/");
        let name = mesh.name_away_from_root("e");
        let path = format!("/{name}");
        let osd = mesh.server(coord);
        let plan = super::Plan::now(&osd.engine);
        let policy = (plusfs_proto::Threshold::Cluster, 0);
        let via = crate::engine::host::Via::Home;
        let started = osd.engine.metrics().tx_started.load(std::sync::atomic::Ordering::Relaxed);
        osd.twopc.mkdir(plan, &path, 0o755, (0, 0), policy, via, &root()).await.unwrap();
        assert_eq!(osd.engine.metrics().tx_started.load(std::sync::atomic::Ordering::Relaxed), started + 1);
        let other = mesh.server(mesh.home(&path));
        assert!(other.engine.store().get_dir(&path).unwrap().is_some(), "the object on its home");
        let root_ino = osd.engine.dir_object("/").unwrap().ino;
        assert!(osd.engine.store().get_entry(root_ino, &name).unwrap().is_some(), "the entry on the parent's");
        for s in [osd, other] {
            assert!(s.engine.store().log_records(LogKind::Coordinator).unwrap().is_empty());
            assert!(s.engine.store().log_records(LogKind::Participant).unwrap().is_empty());
            assert_eq!(s.engine.locks().tx_count(), 0);
        }
    }

    #[tokio::test]
    async fn a_participant_that_cannot_write_its_prepare_record_aborts_the_whole_mkdir() {
        let mesh = crate::testkit::Mesh::new(2).await;
        let coord = mesh.home("/");
        let name = mesh.name_away_from_root("n");
        let path = format!("/{name}");
        let other = mesh.home(&path);
        mesh.servers[other as usize].store.inject(plusfs_store::mem::Faults { fail_from: Some(0), no_space: true });
        let osd = mesh.server(coord);
        let plan = super::Plan::now(&osd.engine);
        let policy = (plusfs_proto::Threshold::Cluster, 0);
        let via = crate::engine::host::Via::Home;
        let e = osd.twopc.mkdir(plan, &path, 0o755, (0, 0), policy, via, &root()).await.unwrap_err();
        assert_eq!(e.errno(), plusfs_proto::Errno::ENOSPC, "the participant's refusal reaches the caller: {e}");
        let root_dir = osd.engine.dir_object("/").unwrap();
        assert!(osd.engine.store().get_entry(root_dir.ino, &name).unwrap().is_none(), "no entry without its object");
        assert_eq!(root_dir.entries, 0);
        // The decision was delivered: nothing is left locked or logged on the coordinator.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while osd.engine.locks().tx_count() > 0
            || !osd.engine.store().log_records(LogKind::Coordinator).unwrap().is_empty()
        {
            assert!(tokio::time::Instant::now() < deadline, "the abort was not finished");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        mesh.servers[other as usize].store.inject(plusfs_store::mem::Faults::default());
        let plan = super::Plan::now(&osd.engine);
        osd.twopc.mkdir(plan, &path, 0o755, (0, 0), policy, via, &root()).await.expect("works once the disk has room");
    }
}
