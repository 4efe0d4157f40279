//! Cx: concurrent execution and lazy, batched commitment of two-server operations
//! (seed 004 §III).
//!
//! The client sends both sub-operations at once (`CxExec`). Each server checks its part,
//! takes transaction locks on what it touches, logs a *Result* record and answers YES or
//! NO with a conflict hint. Nothing is applied yet: the store changes only at commitment,
//! so no reader can see a state that an abort would take back. The coordinator (the
//! server of the parent directory's entry) commits later, many operations at once: one
//! `CxVote` per participant, one store write holding its effects and its Commit/Abort
//! records, one `CxDecide` per participant (which applies and prunes its Result records in
//! one write and ACKs), then one write that prunes (the Complete record). Triggers: a timer
//! (`commit_timeout_ms`) and a count (`commit_threshold`).
//!
//! A request that meets a pending operation's lock *urges* it: committed at once by its
//! coordinator (a participant asks with `CxUrge`), then the request goes on. Disagreeing
//! answers make the client send L-COM (`CxLaunch`); the coordinator aborts both sides and
//! answers ALL-NO. When the coordinator ordered B after A but the participant executed B
//! first, the VOTE for A lists B: the participant invalidates B, executes A, and executes B
//! again; B's client saw unequal hints and launches B's commitment itself.
//!
//! Records live in the store under their own key space (checksummed here; RocksDB's WAL
//! frames them and recovers torn tails). After a restart the server takes its locks back,
//! re-sends decisions, commits what it coordinates at once and urges the coordinators of
//! what it took part in; requests on those objects wait until that is done.

mod coordinator;
pub(crate) mod leases;
mod record;
mod recovery;
mod requests;
mod scopes;
pub(crate) mod state;

pub(crate) use scopes::request_scopes;

use crate::dirperms::DirPerms;
use crate::engine::call::Call;
use crate::engine::errors::{err, OpError, OpResult};
use crate::engine::subops::Prepared;
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use crate::filedata::FileData;
use crate::peers::Peers;
use futures::future::join_all;
use plusfs_proto::{
    CommitPayload, Cred, CxAnswer, CxRole, DirSide, Errno, OpId, Reply, Request, ServerId, SubOp, TxId, WireError,
};
use plusfs_store::{Batch, LogKind, StoreError};
use record::{frame, unframe, Record};
use state::*;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Cx protocol's server side: executions, commitment rounds, recovery.
pub(crate) struct Cx {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    failpoints: Arc<Failpoints>,
    dirperms: Arc<DirPerms>,
    filedata: Arc<FileData>,
    /// Pending Cx operations and their commitment.
    pub(crate) cx: state::CxState,
    /// Inode numbers leased to client sessions for their Cx mkdirs.
    pub(crate) ino_leases: leases::InoLeases,
}

impl Cx {
    pub(crate) fn new(
        engine: Arc<Engine>,
        peers: Arc<Peers>,
        failpoints: Arc<Failpoints>,
        dirperms: Arc<DirPerms>,
        filedata: Arc<FileData>,
    ) -> Cx {
        Cx { engine, peers, failpoints, dirperms, filedata, cx: Default::default(), ino_leases: Default::default() }
    }
}

impl Cx {
    /// Installs the lock-conflict hook and starts the commitment loop.
    pub(crate) fn start_cx(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.engine
            .locks()
            .set_urge(Box::new(move |txid, waiter| weak.upgrade().is_some_and(|osd| osd.urge_tx(txid, waiter))));
        tokio::spawn(self.clone().commit_loop());
    }

    /// A request met the lock of `txid`: if it belongs to a pending Cx operation, start its
    /// commitment now. Returns whether it does. When the request is itself a Cx execution
    /// (`waiter`), the two are ordered here: the waiter's hint names the operation, and the
    /// operation's VOTE will name the waiter.
    fn urge_tx(self: &Arc<Self>, txid: TxId, waiter: Option<TxId>) -> bool {
        let mut st = self.cx.st();
        let Some(id) = st.by_tx.get(&txid).copied() else { return false };
        if let Some(w) = waiter.and_then(|w| st.by_tx.get(&w).copied()).filter(|w| *w != id) {
            if let Some(wop) = st.ops.get_mut(&w) {
                if !wop.hint.contains(&id) {
                    wop.hint.push(id);
                    wop.hint.sort();
                }
            }
            if let Some(op) = st.ops.get_mut(&id) {
                if !op.waiters.contains(&w) {
                    op.waiters.push(w);
                }
            }
        }
        let Some(op) = st.ops.get_mut(&id) else { return false };
        tracing::debug!(op = %id, role = ?op.role, phase = ?op.phase, ?waiter, "a request met a pending Cx operation");
        match op.role {
            CxRole::Coordinator => {
                if !op.urgent {
                    op.urgent = true;
                    self.cx.counters.immediate.fetch_add(1, Ordering::Relaxed);
                }
                drop(st);
                self.cx.kick.notify_one();
            }
            CxRole::Participant if !op.urged && matches!(op.phase, Phase::Yes) => {
                op.urged = true;
                let peer = op.peer;
                drop(st);
                let osd = self.clone();
                tokio::spawn(async move { osd.urge_coordinator(peer, vec![id]).await });
            }
            CxRole::Participant => {}
        }
        true
    }

    async fn urge_coordinator(self: Arc<Self>, coordinator: ServerId, ops: Vec<OpId>) {
        let req = Request::CxUrge { participant: self.engine.id(), ops: ops.clone() };
        if let Err(e) = self
            .peers
            .pool
            .call(coordinator, &req)
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.message))
        {
            tracing::warn!(coordinator, cause = %e, "cannot urge a Cx commitment; retrying later");
            let mut st = self.cx.st();
            for id in ops {
                if let Some(op) = st.ops.get_mut(&id) {
                    op.urged = false;
                }
            }
        }
    }

    // ----- execution phase ------------------------------------------------------------

    /// `CxExec`: executes one side of operation `id` and answers YES/NO with a hint.
    pub(crate) async fn cx_exec(
        self: &Arc<Self>,
        id: OpId,
        (role, peer): (CxRole, ServerId),
        mut ops: Vec<SubOp>,
        leased: bool,
        c: &Call,
    ) -> OpResult<Reply> {
        if peer == self.engine.id() {
            return Err(err(Errno::EINVAL, format!("operation {id}: both sides are on this server (use SubExec)")));
        }
        // Before looking the operation up: what follows up to its insertion must not wait,
        // or a duplicated request would execute it twice. A parent's home that does not
        // answer at once (the coordinator) leaves the new object's ancestry to commitment.
        self.dirperms.push_parent_perms(id, role, peer, &ops);
        let side = (role == CxRole::Participant).then_some((id, peer));
        self.dirperms.fill_new_dirs(&mut ops, c, crate::dirperms::CX_PARENT_WAIT, true, side).await?;
        // The number is taken first (a duplicate wastes one): the look-up of what is known
        // of `id` and its insertion happen under one lock, so a vote or an abort that
        // refuses an operation not yet here is either seen now or sees it inserted.
        let txid = self.engine.new_txid().await?;
        self.failpoints.hit(crate::failpoint::FailStep::CxExecBeforeInsert).await;
        let resent = {
            let mut st = self.cx.st();
            if st.ops.get(&id).is_some_and(|o| o.role != role) {
                return Err(err(Errno::EINVAL, format!("operation {id} already executes here in the other role")));
            }
            if let Some(answer) = self.known_answer(&st, &id) {
                return Ok(Reply::CxAnswer(answer));
            }
            let resent = st.ops.contains_key(&id);
            if !resent {
                let unleased = |ino: &plusfs_proto::Ino| leased && !self.ino_leases.take(c.session, *ino);
                if let Some(ino) = new_dir_ino(&ops).filter(unleased) {
                    let why = format!("operation {id}: inode number {ino} was not leased to this session here");
                    return Err(err(Errno::ESTALE, why));
                }
                st.by_tx.insert(txid, id);
                st.ops.insert(id, new_op(role, peer, txid, ops, c.cred().clone()));
            }
            resent
        };
        if resent {
            // A resent request while the first is still executing: wait for its answer.
            return Ok(Reply::CxAnswer(self.wait_answer(id, None).await));
        }
        Ok(Reply::CxAnswer(self.execute(id, c).await))
    }

    /// The answer already given for `id`, if it is no longer executing.
    fn known_answer(&self, st: &State, id: &OpId) -> Option<CxAnswer> {
        if let Some((e, _)) = st.refused.get(id) {
            return Some(CxAnswer { error: Some(e.clone()), hint: Vec::new(), made: None });
        }
        if let Some((committed, _)) = st.ended.get(id) {
            return Some(match committed {
                true => CxAnswer::default(),
                false => CxAnswer {
                    error: Some(OpError::Conflict(format!("operation {id} was aborted")).into()),
                    hint: Vec::new(),
                    made: None,
                },
            });
        }
        match st.ops.get(id) {
            Some(op) if matches!(op.phase, Phase::Yes | Phase::Committing) => {
                Some(CxAnswer { error: None, hint: op.hint.clone(), made: made(&op.ops) })
            }
            _ => None,
        }
    }

    /// Waits until `id` has an answer here (at most `limit`).
    async fn wait_answer(&self, id: OpId, limit: Option<Duration>) -> CxAnswer {
        let deadline = limit.map(|l| Instant::now() + l);
        loop {
            let notified = self.cx.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.cx.st();
                if let Some(a) = self.known_answer(&st, &id) {
                    return a;
                }
                if !st.ops.contains_key(&id) {
                    let e = OpError::Conflict(format!("operation {id} is unknown here"));
                    return CxAnswer { error: Some(e.into()), hint: Vec::new(), made: None };
                }
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d.into(), notified).await.is_err() {
                        let e = OpError::Conflict(format!("operation {id} did not execute in time"));
                        return CxAnswer { error: Some(e.into()), hint: Vec::new(), made: None };
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Runs the execution of known operation `id` (first time or after invalidation).
    async fn execute(self: &Arc<Self>, id: OpId, call: &Call) -> CxAnswer {
        let Some((txid, ops, cred)) = self.cx.st().ops.get(&id).map(|o| (o.txid, o.ops.clone(), o.cred.clone())) else {
            return CxAnswer {
                error: Some(OpError::Conflict(format!("operation {id} was dropped")).into()),
                hint: vec![],
                made: None,
            };
        };
        let estimate = 64 + postcard::to_allocvec(&ops).map(|v| v.len() as u64).unwrap_or(0) * 2;
        self.wait_for_log_space(estimate).await;
        let checked = match self.engine.room_for(&ops).await {
            Ok(()) => self.engine.check_subops(txid, &ops, true, &mut Vec::new(), &cred).await,
            Err(e) => Err(e),
        };
        let hint = self.cx.st().ops.get(&id).map(|o| o.hint.clone()).unwrap_or_default();
        let (guard, prepared) = match checked {
            Ok(x) => x,
            Err(e) => return self.refuse(id, e.into(), hint),
        };
        if self.cx.st().ops.get(&id).is_none_or(|o| o.vetoed) {
            drop(guard);
            return self.refuse(id, OpError::Conflict(format!("operation {id} was aborted")).into(), hint);
        }
        let Some((role, peer)) = self.cx.st().ops.get(&id).map(|o| (o.role, o.peer)) else {
            return self.refuse(id, OpError::Conflict(format!("operation {id} was dropped")).into(), hint);
        };
        let made_attr = made(&ops);
        let rec = Record::Result { op: id, role, peer, ops, locks: prepared.locks.clone(), hint: hint.clone() };
        let bytes = frame(&rec);
        let mut b = Batch::new();
        let size = bytes.len() as u64;
        b.put_log(LogKind::Cx, txid, bytes);
        if let Err(e) = self.engine.apply_for(call, b).await {
            return self.refuse(id, e.into(), hint);
        }
        self.failpoints.hit(crate::failpoint::FailStep::CxAfterResult).await;
        self.engine.locks().add_tx_locks(txid, &prepared.locks);
        drop(guard);
        // YES only if no VOTE or abort refused the operation meanwhile (checked under the
        // same lock that refusals take, so a participant never votes NO and answers YES).
        let ready = {
            let mut st = self.cx.st();
            // A refusal recorded for the id also vetoes it (whatever its order with the
            // insertion, the participant never answers YES after voting NO).
            let refused = st.refused.contains_key(&id) || st.ended.contains_key(&id);
            let accepted = match st.ops.get_mut(&id) {
                Some(op) if !op.vetoed && !refused => {
                    op.locks = prepared.locks;
                    op.hint = hint.clone();
                    op.phase = Phase::Yes;
                    op.bytes = size;
                    op.since = Instant::now();
                    Some(op.urgent)
                }
                _ => None,
            };
            if accepted.is_some() {
                st.live_bytes += size;
                st.peak_bytes = st.peak_bytes.max(st.live_bytes);
            }
            accepted
        };
        let Some(ready) = ready else {
            let mut b = Batch::new();
            b.del_log(LogKind::Cx, txid);
            if let Err(e) = self.engine.apply(b).await {
                tracing::error!(cause = %e.message(), "cannot drop a refused Cx result; after a restart its coordinator aborts it");
            }
            self.engine.locks().release_tx(txid);
            return self.refuse(id, OpError::Conflict(format!("operation {id} was aborted")).into(), hint);
        };
        self.cx.counters.executed.fetch_add(1, Ordering::Relaxed);
        self.cx.changed.notify_waiters();
        if role == CxRole::Coordinator
            && (ready || self.cx.coordinator_ready() >= self.engine.map().txn.commit_threshold as usize)
        {
            self.cx.kick.notify_one();
        }
        tracing::debug!(op = %id, ?role, ?hint, "Cx YES");
        CxAnswer { error: None, hint, made: made_attr }
    }

    /// Records a NO answer for `id` (nothing was logged or locked).
    fn refuse(&self, id: OpId, e: WireError, hint: Vec<OpId>) -> CxAnswer {
        tracing::debug!(op = %id, ?hint, cause = %e.message, "Cx NO");
        let mut st = self.cx.st();
        if let Some(op) = st.ops.remove(&id) {
            st.by_tx.remove(&op.txid);
        }
        st.refused.insert(id, (e.clone(), Instant::now()));
        drop(st);
        self.cx.changed.notify_waiters();
        CxAnswer { error: Some(e), hint, made: None }
    }

    /// Blocks while the log holds `more` bytes too many, committing what is pending.
    async fn wait_for_log_space(self: &Arc<Self>, more: u64) {
        let max = self.engine.map().txn.max_log_bytes;
        loop {
            let notified = self.cx.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let txids: Vec<TxId> = {
                let st = self.cx.st();
                if st.live_bytes + more <= max || st.ops.values().all(|o| o.bytes == 0) {
                    return;
                }
                st.ops.values().filter(|o| o.bytes > 0).map(|o| o.txid).collect()
            };
            for t in txids {
                self.urge_tx(t, None);
            }
            notified.await;
        }
    }
}

/// The attributes of the directory object `ops` create, if any (for the client's answer).
fn made(ops: &[SubOp]) -> Option<plusfs_proto::Attr> {
    ops.iter().find_map(|o| match o {
        SubOp::CreateDir { object, .. } => Some(plusfs_proto::Attr::of_dir(object)),
        _ => None,
    })
}

/// The inode number of the directory object `ops` make, if any.
fn new_dir_ino(ops: &[SubOp]) -> Option<plusfs_proto::Ino> {
    ops.iter().find_map(|o| match o {
        SubOp::CreateDir { object, .. } => Some(object.ino),
        _ => None,
    })
}

fn new_op(role: CxRole, peer: ServerId, txid: TxId, ops: Vec<SubOp>, cred: Cred) -> Op {
    Op {
        role,
        peer,
        txid,
        ops,
        cred,
        locks: Vec::new(),
        hint: Vec::new(),
        phase: Phase::Executing,
        bytes: 0,
        since: Instant::now(),
        urgent: false,
        urged: false,
        vetoed: false,
        waiters: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::{root, Mesh};
    use plusfs_proto::{CxRole, DirObject, Inode, OpId, Replace, Reply, Request, Response, SubOp};
    use std::time::Duration;

    /// A Cx mkdir of `/NAME` (homed off the root's server) sent as a client sends it: both
    /// sides at once, the participant's object with inode number `ino + skew` (0: the
    /// entry's). Returns the two servers, the name, the entry's inode number and the answers.
    async fn cx_mkdir(mesh: &Mesh, seq: u64, skew: u64) -> ((u32, u32), String, u64, [Response; 2]) {
        let coord = mesh.home("/");
        let name = mesh.name_away_from_root("d");
        let path = format!("/{name}");
        let part = mesh.home(&path);
        let ino = mesh.server(coord).engine.new_inos(2).await.unwrap();
        let op = OpId { client: 1, process: 1, seq };
        let inode = Inode::subdir(ino);
        let entry =
            SubOp::InsertEntry { dir: "/".into(), name: name.clone(), inode, replace: Replace::Never, shard: None };
        let object = DirObject::new(ino + skew, 0o755, 0, 0);
        let exec = |role, peer, ops| Request::CxExec { op, role, peer, ops, leased: false };
        let to_coord = exec(CxRole::Coordinator, part, vec![entry]);
        let to_part = exec(CxRole::Participant, coord, vec![SubOp::CreateDir { path, object }]);
        let (c, p) = tokio::join!(
            mesh.server(coord).handle(root().cred().clone(), to_coord),
            mesh.server(part).handle(root().cred().clone(), to_part)
        );
        ((coord, part), name, ino, [c, p])
    }

    /// Waits until neither server has the operation pending (committed or aborted).
    async fn until_ended(mesh: &Mesh, (coord, part): (u32, u32)) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while mesh.server(coord).pending_ops() + mesh.server(part).pending_ops() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "the operation never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_cx_mkdir_executes_on_both_servers_and_commits_later() {
        let mesh = Mesh::new(2).await;
        let ((coord, part), name, ino, answers) = cx_mkdir(&mesh, 1, 0).await;
        for answer in answers {
            assert!(matches!(answer, Ok(Reply::CxAnswer(ref a)) if a.error.is_none()), "{answer:?}");
        }
        // Committed in the background (a commitment round), with no client message.
        until_ended(&mesh, (coord, part)).await;
        let root_dir = mesh.server(coord).engine.dir_object("/").unwrap();
        let entry = mesh.server(coord).engine.store().get_entry(root_dir.ino, &name).unwrap();
        assert_eq!(entry.map(|e| e.ino), Some(ino), "the parent's entry");
        let made = mesh.server(part).engine.dir_object(&format!("/{name}")).unwrap();
        assert_eq!(made.ino, ino, "the directory object on its home");
        assert!(made.ancestry.is_some(), "its ancestry came from the parent's home");
    }

    #[tokio::test]
    async fn sides_that_name_different_directories_are_aborted_on_both_and_leave_nothing() {
        let mesh = Mesh::new(2).await;
        // The participant is told to make a directory with another inode number than the
        // entry names: a client bug or a forged request.
        let ((coord, part), name, _, _) = cx_mkdir(&mesh, 2, 1).await;
        until_ended(&mesh, (coord, part)).await;
        let root_dir = mesh.server(coord).engine.dir_object("/").unwrap();
        assert!(mesh.server(coord).engine.store().get_entry(root_dir.ino, &name).unwrap().is_none(), "no entry");
        assert!(
            mesh.server(part).engine.store().get_dir(&format!("/{name}")).unwrap().is_none(),
            "no directory object"
        );
        for id in [coord, part] {
            let s = mesh.server(id);
            assert!(s.engine.store().log_records(plusfs_store::LogKind::Cx).unwrap().is_empty(), "no Cx record left");
            assert_eq!(s.engine.locks().tx_count(), 0, "no lock left");
        }
    }
}
