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

use crate::locks::Scope;
use crate::osd::{eio, err, OpResult, Osd};
use crate::txn::Prepared;
use futures::future::join_all;
use plusfs_proto::{
    CommitPayload, CxAnswer, CxRole, Errno, OpId, Reply, Request, Response, ServerId, SubOp, TxId, WireError,
};
use plusfs_store::{Batch, LogKind, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a VOTE waits for the execution of an operation the participant has not
/// finished executing (it is blocked or still on its way) before voting NO.
const VOTE_WAIT: Duration = Duration::from_secs(2);
/// How long the coordinator waits for a sub-operation it has never seen before it aborts
/// the operation (the client may have died before sending it).
const UNKNOWN_GRACE: Duration = Duration::from_millis(500);
/// How long aborted and refused operation ids are remembered, so a late sub-operation of
/// one is refused (NO) instead of executed.
const TOMBSTONE_LIFE: Duration = Duration::from_secs(600);
/// How long committed operation ids are remembered (a resent request or a late L-COM comes
/// within seconds; a short life keeps the table small at high rates).
const COMMITTED_LIFE: Duration = Duration::from_secs(30);

/// A Cx log record. Stored as a CRC-32C of the encoding followed by the encoding.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Record {
    /// A YES execution: what will be applied at commitment and what it locks.
    Result { op: OpId, role: CxRole, peer: ServerId, ops: Vec<SubOp>, locks: Vec<(String, Scope)>, hint: Vec<OpId> },
    /// The coordinator's Commit or Abort record, until the participant ACKs.
    Decided { op: OpId, peer: ServerId, commit: bool },
}

fn frame(rec: &Record) -> Vec<u8> {
    let body = postcard::to_allocvec(rec).expect("in-memory encoding cannot fail");
    let mut out = crc32c::crc32c(&body).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn unframe(key: TxId, bytes: &[u8]) -> Result<Record, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { key: format!("X{key}"), reason };
    if bytes.len() < 4 {
        return Err(corrupt("record shorter than its checksum".into()));
    }
    let (crc, body) = bytes.split_at(4);
    if u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) != crc32c::crc32c(body) {
        return Err(corrupt("checksum mismatch".into()));
    }
    postcard::from_bytes(body).map_err(|e| corrupt(e.to_string()))
}

/// Where an operation stands on this server.
#[derive(Debug, Clone)]
enum Phase {
    /// Being checked (possibly waiting for another operation's locks).
    Executing,
    /// Executed with YES: Result record written, locks held.
    Yes,
    /// In a commitment round (coordinator), or its decision is being applied.
    Committing,
    /// The coordinator ordered another operation first: result dropped, executed again.
    Invalidated,
}

#[derive(Debug)]
struct Op {
    role: CxRole,
    peer: ServerId,
    txid: TxId,
    ops: Vec<SubOp>,
    locks: Vec<(String, Scope)>,
    hint: Vec<OpId>,
    phase: Phase,
    bytes: u64,
    since: Instant,
    /// The coordinator asked for an immediate commitment (coordinator role).
    urgent: bool,
    /// A participant already asked its coordinator to commit it.
    urged: bool,
    /// Refused while executing (a VOTE gave up waiting, or an abort came first).
    vetoed: bool,
    /// Operations of other clients waiting here for this one's locks (coordinator: they
    /// go into the VOTE, so the participant follows this order).
    waiters: Vec<OpId>,
}

#[derive(Default)]
struct State {
    ops: HashMap<OpId, Op>,
    by_tx: HashMap<TxId, OpId>,
    /// Ended operations: id → (committed, when). Refuses late sub-operations and answers
    /// late L-COMs.
    ended: HashMap<OpId, (bool, Instant)>,
    /// NO answers given here: id → the error (until the operation ends).
    refused: HashMap<OpId, (WireError, Instant)>,
    live_bytes: u64,
    peak_bytes: u64,
}

/// Cx counters (shown by `plusfs cluster status`).
#[derive(Default)]
pub(crate) struct CxCounters {
    pub executed: AtomicU64,
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub rounds: AtomicU64,
    pub immediate: AtomicU64,
    pub invalidated: AtomicU64,
}

/// The Cx engine of one server.
pub(crate) struct Cx {
    state: Mutex<State>,
    /// Something ended or was invalidated, or log space came free.
    changed: Notify,
    /// Wakes the commitment loop (threshold reached or an urgent operation).
    kick: Notify,
    pub(crate) counters: CxCounters,
}

impl Default for Cx {
    fn default() -> Self {
        Cx { state: Mutex::default(), changed: Notify::new(), kick: Notify::new(), counters: CxCounters::default() }
    }
}

impl Cx {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("cx state")
    }

    /// Operations pending here and live log bytes (now, at most).
    pub(crate) fn gauges(&self) -> (u64, u64, u64) {
        let st = self.st();
        (st.ops.len() as u64, st.live_bytes, st.peak_bytes)
    }

    fn coordinator_ready(&self) -> usize {
        self.st().ops.values().filter(|o| o.role == CxRole::Coordinator && matches!(o.phase, Phase::Yes)).count()
    }

    fn forget_old(st: &mut State) {
        let now = Instant::now();
        st.ended.retain(|_, (committed, at)| {
            now.duration_since(*at) < if *committed { COMMITTED_LIFE } else { TOMBSTONE_LIFE }
        });
        st.refused.retain(|_, (_, at)| now.duration_since(*at) < TOMBSTONE_LIFE);
    }
}

impl Osd {
    /// Installs the lock-conflict hook and starts the commitment loop.
    pub(crate) fn start_cx(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.locks.set_urge(Box::new(move |txid, waiter| weak.upgrade().is_some_and(|osd| osd.urge_tx(txid, waiter))));
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
        let req = Request::CxUrge { participant: self.id, ops: ops.clone() };
        if let Err(e) =
            self.peers.call(coordinator, &req).await.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.message))
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
    pub(crate) async fn cx_exec(self: &Arc<Self>, id: OpId, role: CxRole, peer: ServerId, ops: Vec<SubOp>) -> Response {
        if peer == self.id {
            return Err(err(Errno::EINVAL, format!("operation {id}: both sides are on this server (use SubExec)")));
        }
        if self.cx.st().ops.get(&id).is_some_and(|o| o.role != role) {
            return Err(err(Errno::EINVAL, format!("operation {id} already executes here in the other role")));
        }
        {
            let st = self.cx.st();
            if let Some(answer) = self.known_answer(&st, &id) {
                return Ok(Reply::CxAnswer(answer));
            }
        }
        if self.cx.st().ops.contains_key(&id) {
            // A resent request while the first is still executing: wait for its answer.
            return Ok(Reply::CxAnswer(self.wait_answer(id, None).await));
        }
        let txid = self.txids.next(self.store.as_ref()).await.map_err(eio)?;
        {
            let mut st = self.cx.st();
            st.by_tx.insert(txid, id);
            st.ops.insert(id, new_op(role, peer, txid, ops));
        }
        Ok(Reply::CxAnswer(self.execute(id).await))
    }

    /// The answer already given for `id`, if it is no longer executing.
    fn known_answer(&self, st: &State, id: &OpId) -> Option<CxAnswer> {
        if let Some((e, _)) = st.refused.get(id) {
            return Some(CxAnswer { error: Some(e.clone()), hint: Vec::new() });
        }
        if let Some((committed, _)) = st.ended.get(id) {
            return Some(match committed {
                true => CxAnswer::default(),
                false => {
                    CxAnswer { error: Some(err(Errno::EBUSY, format!("operation {id} was aborted"))), hint: Vec::new() }
                }
            });
        }
        match st.ops.get(id) {
            Some(op) if matches!(op.phase, Phase::Yes | Phase::Committing) => {
                Some(CxAnswer { error: None, hint: op.hint.clone() })
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
                    let e = err(Errno::EBUSY, format!("operation {id} is unknown here"));
                    return CxAnswer { error: Some(e), hint: Vec::new() };
                }
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d.into(), notified).await.is_err() {
                        let e = err(Errno::EBUSY, format!("operation {id} did not execute in time"));
                        return CxAnswer { error: Some(e), hint: Vec::new() };
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Runs the execution of known operation `id` (first time or after invalidation).
    async fn execute(self: &Arc<Self>, id: OpId) -> CxAnswer {
        let Some((txid, ops)) = self.cx.st().ops.get(&id).map(|o| (o.txid, o.ops.clone())) else {
            return CxAnswer { error: Some(err(Errno::EBUSY, format!("operation {id} was dropped"))), hint: vec![] };
        };
        let estimate = 64 + postcard::to_allocvec(&ops).map(|v| v.len() as u64).unwrap_or(0) * 2;
        self.wait_for_log_space(estimate).await;
        let checked = self.check_subops(txid, &ops, true, &mut Vec::new()).await;
        let hint = self.cx.st().ops.get(&id).map(|o| o.hint.clone()).unwrap_or_default();
        let (guard, prepared) = match checked {
            Ok(x) => x,
            Err(e) => return self.refuse(id, e, hint),
        };
        if self.cx.st().ops.get(&id).is_none_or(|o| o.vetoed) {
            drop(guard);
            return self.refuse(id, err(Errno::EBUSY, format!("operation {id} was aborted")), hint);
        }
        let Some((role, peer)) = self.cx.st().ops.get(&id).map(|o| (o.role, o.peer)) else {
            return self.refuse(id, err(Errno::EBUSY, format!("operation {id} was dropped")), hint);
        };
        let rec = Record::Result { op: id, role, peer, ops, locks: prepared.locks.clone(), hint: hint.clone() };
        let bytes = frame(&rec);
        let mut b = Batch::new();
        let size = bytes.len() as u64;
        b.put_log(LogKind::Cx, txid, bytes);
        if let Err(e) = self.write(b).await {
            return self.refuse(id, e, hint);
        }
        crate::failpoint::hit("cx_after_result");
        self.locks.add_tx_locks(txid, &prepared.locks);
        drop(guard);
        // YES only if no VOTE or abort refused the operation meanwhile (checked under the
        // same lock that refusals take, so a participant never votes NO and answers YES).
        let ready = {
            let mut st = self.cx.st();
            let accepted = match st.ops.get_mut(&id) {
                Some(op) if !op.vetoed => {
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
            if let Err(e) = self.write(b).await {
                tracing::error!(cause = %e.message, "cannot drop a refused Cx result; after a restart its coordinator aborts it");
            }
            self.locks.release_tx(txid);
            return self.refuse(id, err(Errno::EBUSY, format!("operation {id} was aborted")), hint);
        };
        self.cx.counters.executed.fetch_add(1, Ordering::Relaxed);
        self.cx.changed.notify_waiters();
        if role == CxRole::Coordinator
            && (ready || self.cx.coordinator_ready() >= self.map.txn.commit_threshold as usize)
        {
            self.cx.kick.notify_one();
        }
        tracing::debug!(op = %id, ?role, ?hint, "Cx YES");
        CxAnswer { error: None, hint }
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
        CxAnswer { error: Some(e), hint }
    }

    /// Blocks while the log holds `more` bytes too many, committing what is pending.
    async fn wait_for_log_space(self: &Arc<Self>, more: u64) {
        let max = self.map.txn.max_log_bytes;
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

    // ----- commitment (coordinator) ---------------------------------------------------

    async fn commit_loop(self: Arc<Self>) {
        let timeout = Duration::from_millis(self.map.txn.commit_timeout_ms);
        let threshold = self.map.txn.commit_threshold as usize;
        let mut last = Instant::now();
        loop {
            let _ = tokio::time::timeout_at((last + timeout).into(), self.cx.kick.notified()).await;
            let lazy = last.elapsed() >= timeout || self.cx.coordinator_ready() >= threshold;
            let batch = self.take_for_commit(lazy);
            if lazy {
                last = Instant::now();
                self.urge_stale_participations(timeout * 2);
                let mut st = self.cx.st();
                Cx::forget_old(&mut st);
            }
            for (peer, ops) in batch {
                tokio::spawn(self.clone().commit_round(peer, ops));
            }
        }
    }

    /// Coordinator operations to commit now, by participant: every executed one (`lazy`)
    /// or only the urgent ones.
    fn take_for_commit(&self, lazy: bool) -> BTreeMap<ServerId, Vec<OpId>> {
        let mut st = self.cx.st();
        let mut out: BTreeMap<ServerId, Vec<OpId>> = BTreeMap::new();
        for (id, op) in st.ops.iter_mut() {
            if op.role == CxRole::Coordinator && matches!(op.phase, Phase::Yes) && (lazy || op.urgent) {
                op.phase = Phase::Committing;
                out.entry(op.peer).or_default().push(*id);
            }
        }
        out
    }

    /// Participations older than `age`: their coordinators are asked to decide them (their
    /// client may have died before reaching the coordinator, or a decision was lost).
    fn urge_stale_participations(self: &Arc<Self>, age: Duration) {
        let mut by_coord: BTreeMap<ServerId, Vec<OpId>> = BTreeMap::new();
        {
            let mut st = self.cx.st();
            for (id, op) in st.ops.iter_mut() {
                if op.role == CxRole::Participant && matches!(op.phase, Phase::Yes) && op.since.elapsed() >= age {
                    op.urged = true;
                    by_coord.entry(op.peer).or_default().push(*id);
                }
            }
        }
        for (coord, ops) in by_coord {
            tokio::spawn(self.clone().urge_coordinator(coord, ops));
        }
    }

    /// One commitment round with one participant: VOTE, decision records and effects in
    /// one write, COMMIT-REQ/ABORT-REQ, then the Complete (prune) write.
    async fn commit_round(self: Arc<Self>, peer: ServerId, ids: Vec<OpId>) {
        self.cx.counters.rounds.fetch_add(1, Ordering::Relaxed);
        let ballot: Vec<(OpId, Vec<OpId>)> = {
            let st = self.cx.st();
            ids.iter().map(|id| (*id, st.ops.get(id).map(|o| o.waiters.clone()).unwrap_or_default())).collect()
        };
        crate::failpoint::hit("cx_before_vote");
        let votes = match self.peer_call_cx(peer, Request::CxVote { coordinator: self.id, ops: ballot }).await {
            Ok(Reply::CxVotes(v)) => v,
            other => {
                tracing::warn!(peer, result = ?other.err(), "Cx vote failed; the operations stay pending");
                self.back_to_pending(&ids);
                tokio::time::sleep(Duration::from_millis(200)).await;
                self.cx.kick.notify_one();
                return;
            }
        };
        let yes: std::collections::HashSet<OpId> =
            votes.into_iter().filter(|(_, e)| e.is_none()).map(|(id, _)| id).collect();
        let (commits, aborts): (Vec<OpId>, Vec<OpId>) = ids.iter().partition(|id| yes.contains(id));
        tracing::debug!(peer, ?commits, ?aborts, "Cx decisions");
        if let Err(e) = self.decide(peer, &commits, &aborts).await {
            tracing::error!(cause = %e.message, "cannot write Cx decisions; the operations stay pending");
            self.back_to_pending(&ids);
            return;
        }
        self.deliver_decisions(peer, commits, aborts).await;
    }

    fn back_to_pending(&self, ids: &[OpId]) {
        let mut st = self.cx.st();
        for id in ids {
            if let Some(op) = st.ops.get_mut(id) {
                op.phase = Phase::Yes;
            }
        }
    }

    async fn peer_call_cx(self: &Arc<Self>, peer: ServerId, req: Request) -> Response {
        if peer == self.id {
            return Box::pin(self.handle_cx(req)).await;
        }
        match self.peers.call(peer, &req).await {
            Ok(r) => r,
            Err(e) => Err(err(e.errno(), format!("server {peer}: {e}"))),
        }
    }

    /// The coordinator's decision write: effects of `commits`, Commit/Abort records
    /// replacing the Result records; then the locks go.
    async fn decide(self: &Arc<Self>, peer: ServerId, commits: &[OpId], aborts: &[OpId]) -> OpResult<()> {
        let mut b = Batch::new();
        let mut applied = Prepared::default();
        let mut released = Vec::new();
        let mut sizes = Vec::new();
        {
            let st = self.cx.st();
            for (id, commit) in commits.iter().map(|i| (i, true)).chain(aborts.iter().map(|i| (i, false))) {
                let Some(op) = st.ops.get(id) else { continue };
                if commit {
                    applied.ops.extend(op.ops.iter().cloned());
                    applied.locks.extend(op.locks.iter().cloned());
                }
                let rec = frame(&Record::Decided { op: *id, peer, commit });
                sizes.push((*id, rec.len() as u64));
                b.put_log(LogKind::Cx, op.txid, rec);
                released.push(op.txid);
            }
        }
        // Busy locks: another commit or a single-server change of the same directory
        // (its counts) cannot interleave with this read-modify-write.
        let guard = self.locks.lock_owned(&applied.locks, &released).await;
        let (effects, remote) = self.commit_batch(&applied, &CommitPayload::default())?;
        let mut all = effects;
        all.extend(b);
        self.write(all).await?;
        crate::failpoint::hit("cx_after_commit_record");
        {
            let mut st = self.cx.st();
            for (id, size) in sizes {
                let old = st.ops.get_mut(&id).map(|op| std::mem::replace(&mut op.bytes, size));
                if let Some(old) = old {
                    st.live_bytes = st.live_bytes.saturating_sub(old) + size;
                }
            }
            st.peak_bytes = st.peak_bytes.max(st.live_bytes);
        }
        for t in released {
            self.locks.release_tx(t);
        }
        drop(guard);
        self.drop_remote(remote).await;
        self.check_thresholds(&applied.ops);
        self.cx.counters.committed.fetch_add(commits.len() as u64, Ordering::Relaxed);
        self.cx.counters.aborted.fetch_add(aborts.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Sends the decisions until the participant ACKs, then prunes them (Complete).
    async fn deliver_decisions(self: Arc<Self>, peer: ServerId, commits: Vec<OpId>, aborts: Vec<OpId>) {
        let req = Request::CxDecide { commits: commits.clone(), aborts: aborts.clone() };
        let mut delay = Duration::from_millis(50);
        loop {
            match self.peer_call_cx(peer, req.clone()).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(peer, cause = %e.message, "Cx decision not delivered; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
        let ended: Vec<(OpId, bool)> =
            commits.iter().map(|i| (*i, true)).chain(aborts.iter().map(|i| (*i, false))).collect();
        self.complete(&ended).await;
    }

    /// Prunes the records of ended operations and forgets them.
    async fn complete(&self, ended: &[(OpId, bool)]) {
        let mut b = Batch::new();
        {
            let st = self.cx.st();
            for (id, _) in ended {
                if let Some(op) = st.ops.get(id) {
                    b.del_log(LogKind::Cx, op.txid);
                }
            }
        }
        if let Err(e) = self.write(b).await {
            tracing::error!(cause = %e.message, "cannot prune Cx records (they are pruned at the next start)");
        }
        self.forget_ended(ended);
    }

    fn forget_ended(&self, ended: &[(OpId, bool)]) {
        let mut st = self.cx.st();
        let now = Instant::now();
        for (id, committed) in ended {
            if let Some(op) = st.ops.remove(id) {
                st.live_bytes = st.live_bytes.saturating_sub(op.bytes);
                st.by_tx.remove(&op.txid);
            }
            st.refused.remove(id);
            st.ended.insert(*id, (*committed, now));
        }
        drop(st);
        self.cx.changed.notify_waiters();
    }

    // ----- requests -------------------------------------------------------------------

    /// Serves the Cx requests.
    pub(crate) async fn handle_cx(self: &Arc<Self>, req: Request) -> Response {
        match req {
            Request::CxExec { op, role, peer, ops } => self.cx_exec(op, role, peer, ops).await,
            Request::CxVote { coordinator, ops } => self.cx_vote(coordinator, ops).await,
            Request::CxDecide { commits, aborts } => self.cx_decide(&commits, &aborts).await,
            Request::CxUrge { participant, ops } => self.cx_urge(participant, ops),
            Request::CxLaunch { op, participant } => self.cx_launch(op, participant).await,
            other => Err(err(Errno::EINVAL, format!("{} is not a Cx request", other.name()))),
        }
    }

    /// Participant: votes on each operation from its Result record, first invalidating
    /// operations it executed that the coordinator ordered after it.
    async fn cx_vote(self: &Arc<Self>, coordinator: ServerId, ballot: Vec<(OpId, Vec<OpId>)>) -> Response {
        for (first, after) in &ballot {
            for b in after {
                self.invalidate(*b, *first, coordinator).await;
            }
        }
        let votes = join_all(ballot.iter().map(|(id, _)| async move {
            let known = self.cx.st().ops.contains_key(id);
            let answer = if known {
                self.wait_answer(*id, Some(VOTE_WAIT)).await
            } else {
                let st = self.cx.st();
                self.known_answer(&st, id).unwrap_or_else(|| CxAnswer {
                    error: Some(err(Errno::EBUSY, format!("operation {id} never reached server"))),
                    hint: vec![],
                })
            };
            (*id, self.final_vote(*id, answer.error))
        }))
        .await;
        crate::failpoint::hit("cx_after_vote");
        Ok(Reply::CxVotes(votes))
    }

    /// The vote on `id` after waiting gave `error`: a NO marks the operation refused here,
    /// so its execution (running or later) answers NO too — unless that execution has
    /// meanwhile answered YES, which its client may hold: then the vote is YES. Decided
    /// under the state lock, like the execution's own YES.
    fn final_vote(&self, id: OpId, error: Option<WireError>) -> Option<WireError> {
        let e = error?;
        let mut st = self.cx.st();
        match st.ops.get_mut(&id) {
            Some(op) if matches!(op.phase, Phase::Yes | Phase::Committing) => None,
            Some(op) => {
                op.vetoed = true;
                Some(e)
            }
            None => {
                st.refused.entry(id).or_insert_with(|| (e.clone(), Instant::now()));
                Some(e)
            }
        }
    }

    /// Drops participant `id`'s executed result (the coordinator ordered `first` before
    /// it) and executes it again in the background once `first` has ended here.
    async fn invalidate(self: &Arc<Self>, id: OpId, first: OpId, coordinator: ServerId) {
        tracing::debug!(op = %id, %first, "Cx invalidation requested");
        let txid = {
            let mut st = self.cx.st();
            let Some(op) = st.ops.get_mut(&id) else { return };
            if op.role != CxRole::Participant || op.peer != coordinator || !matches!(op.phase, Phase::Yes) {
                return;
            }
            op.phase = Phase::Invalidated;
            if !op.hint.contains(&first) {
                op.hint.push(first);
                op.hint.sort();
            }
            op.txid
        };
        let mut b = Batch::new();
        b.del_log(LogKind::Cx, txid);
        if let Err(e) = self.write(b).await {
            tracing::error!(cause = %e.message, "cannot invalidate a Cx result");
        }
        {
            let mut st = self.cx.st();
            if let Some(op) = st.ops.get_mut(&id) {
                let bytes = std::mem::take(&mut op.bytes);
                st.live_bytes = st.live_bytes.saturating_sub(bytes);
            }
        }
        self.locks.release_tx(txid);
        self.cx.counters.invalidated.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(op = %id, "Cx result invalidated; executing again");
        self.cx.changed.notify_waiters();
        let osd = self.clone();
        tokio::spawn(async move {
            // Bounded: a `first` that never comes must not hold `id` back for ever.
            let _ = tokio::time::timeout(VOTE_WAIT * 2, osd.wait_ended(first)).await;
            osd.execute(id).await;
        });
    }

    /// Waits until operation `id` is no longer pending here.
    async fn wait_ended(&self, id: OpId) {
        loop {
            let notified = self.cx.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.cx.st().ops.get(&id).is_none_or(|o| matches!(o.phase, Phase::Executing) && o.vetoed) {
                return;
            }
            notified.await;
        }
    }

    /// Participant: applies commits and drops aborts, in one write; the reply is the ACK.
    async fn cx_decide(self: &Arc<Self>, commits: &[OpId], aborts: &[OpId]) -> Response {
        let mut applied = Prepared::default();
        let mut b = Batch::new();
        let mut txids = Vec::new();
        let mut ended = Vec::new();
        {
            let mut st = self.cx.st();
            for (id, commit) in commits.iter().map(|i| (i, true)).chain(aborts.iter().map(|i| (i, false))) {
                match st.ops.get_mut(id) {
                    // Another delivery of the same decision is applying it.
                    Some(op) if matches!(op.phase, Phase::Committing) => {}
                    Some(op) if matches!(op.phase, Phase::Yes) => {
                        if commit {
                            applied.ops.extend(op.ops.iter().cloned());
                        }
                        applied.locks.extend(op.locks.iter().cloned());
                        op.phase = Phase::Committing;
                        b.del_log(LogKind::Cx, op.txid);
                        txids.push(op.txid);
                        ended.push((*id, commit));
                    }
                    Some(op) => {
                        // Not executed (yet): it must never be, now.
                        op.vetoed = true;
                        st.ended.insert(*id, (false, Instant::now()));
                    }
                    None => {
                        st.ended.entry(*id).or_insert((commit, Instant::now()));
                    }
                }
            }
        }
        if !b.is_empty() {
            let guard = self.locks.lock_owned(&applied.locks, &txids).await;
            let (mut all, remote) = self.commit_batch(&applied, &CommitPayload::default())?;
            all.extend(b);
            self.write(all).await?;
            for t in txids {
                self.locks.release_tx(t);
            }
            drop(guard);
            self.drop_remote(remote).await;
            self.check_thresholds(&applied.ops);
        }
        self.forget_ended(&ended);
        Ok(Reply::Done)
    }

    /// Coordinator: a participant needs these operations decided now.
    fn cx_urge(self: &Arc<Self>, participant: ServerId, ids: Vec<OpId>) -> Response {
        for id in ids {
            let osd = self.clone();
            tokio::spawn(async move {
                osd.commit_now(id, participant).await;
            });
        }
        Ok(Reply::Done)
    }

    /// Coordinator: L-COM. Commits or aborts `id` now and says which.
    async fn cx_launch(self: &Arc<Self>, id: OpId, participant: ServerId) -> Response {
        Ok(Reply::CxOutcome { committed: self.commit_now(id, participant).await })
    }

    /// Decides `id` at once: an executed operation goes through an immediate round; one
    /// refused or unknown here is aborted at the participant. Returns whether it committed.
    async fn commit_now(self: &Arc<Self>, id: OpId, participant: ServerId) -> bool {
        enum Next {
            Ended(bool),
            Wait { kick: bool },
            AbortHere,
            GraceForUnknown,
        }
        let mut waited_unknown = false;
        loop {
            let notified = self.cx.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let mut st = self.cx.st();
                let refused = st.refused.contains_key(&id);
                let ended = st.ended.get(&id).map(|e| e.0);
                let next = match (ended, st.ops.get_mut(&id)) {
                    (Some(committed), _) => Next::Ended(committed),
                    (None, Some(op)) if op.role == CxRole::Coordinator => {
                        if !op.urgent {
                            op.urgent = true;
                            self.cx.counters.immediate.fetch_add(1, Ordering::Relaxed);
                        }
                        Next::Wait { kick: matches!(op.phase, Phase::Yes) }
                    }
                    (None, Some(_)) => Next::Wait { kick: false },
                    (None, None) if refused || waited_unknown => Next::AbortHere,
                    (None, None) => Next::GraceForUnknown,
                };
                if matches!(next, Next::AbortHere) {
                    // NO here (or never seen): the operation is aborted.
                    st.refused.remove(&id);
                    st.ended.insert(id, (false, Instant::now()));
                }
                next
            };
            match next {
                Next::Ended(true) => return true,
                Next::Ended(false) => {
                    // Already aborted here; the participant may not know yet (its abort
                    // was lost, or it restarted with a record its vote had refused).
                    self.send_abort(participant, id).await;
                    return false;
                }
                Next::AbortHere => {
                    self.abort_at(participant, id).await;
                    return false;
                }
                Next::GraceForUnknown => {
                    waited_unknown = true;
                    let _ = tokio::time::timeout(UNKNOWN_GRACE, notified).await;
                }
                Next::Wait { kick } => {
                    if kick {
                        self.cx.kick.notify_one();
                    }
                    notified.await;
                }
            }
        }
    }

    /// Tells the participant that `id` is aborted (the coordinator answered NO or never
    /// executed it), until it ACKs. A late execution of `id` here is refused.
    async fn abort_at(self: &Arc<Self>, participant: ServerId, id: OpId) {
        self.cx.counters.aborted.fetch_add(1, Ordering::Relaxed);
        self.send_abort(participant, id).await;
    }

    async fn send_abort(self: &Arc<Self>, participant: ServerId, id: OpId) {
        let req = Request::CxDecide { commits: vec![], aborts: vec![id] };
        let mut delay = Duration::from_millis(50);
        while let Err(e) = self.peer_call_cx(participant, req.clone()).await {
            tracing::warn!(participant, cause = %e.message, "Cx abort not delivered; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
        self.cx.changed.notify_waiters();
    }

    // ----- recovery -------------------------------------------------------------------

    /// Loads the Cx log after a restart: locks are taken back before any request is
    /// served; decisions are re-sent, coordinated operations committed at once and the
    /// coordinators of participations urged.
    pub(crate) fn recover_cx(self: &Arc<Self>) -> Result<(), StoreError> {
        let mut resend: BTreeMap<ServerId, (Vec<OpId>, Vec<OpId>)> = BTreeMap::new();
        let mut urge: BTreeMap<ServerId, Vec<OpId>> = BTreeMap::new();
        let records = self.store.log_records(LogKind::Cx)?;
        let n = records.len();
        {
            let mut st = self.cx.st();
            for (txid, bytes) in records {
                let size = bytes.len() as u64;
                let (id, op) = match unframe(txid, &bytes)? {
                    Record::Result { op: id, role, peer, ops, locks, hint } => {
                        self.locks.add_tx_locks(txid, &locks);
                        if role == CxRole::Participant {
                            urge.entry(peer).or_default().push(id);
                        }
                        let mut op = new_op(role, peer, txid, ops);
                        op.phase = Phase::Yes;
                        op.locks = locks;
                        op.hint = hint;
                        op.urgent = role == CxRole::Coordinator;
                        (id, op)
                    }
                    Record::Decided { op: id, peer, commit } => {
                        let e = resend.entry(peer).or_default();
                        if commit { &mut e.0 } else { &mut e.1 }.push(id);
                        let mut op = new_op(CxRole::Coordinator, peer, txid, vec![]);
                        op.phase = Phase::Committing;
                        (id, op)
                    }
                };
                st.by_tx.insert(txid, id);
                st.live_bytes += size;
                st.ops.insert(id, Op { bytes: size, ..op });
            }
            st.peak_bytes = st.live_bytes;
        }
        if n > 0 {
            tracing::info!(records = n, "resuming Cx operations from the log");
        }
        crate::failpoint::hit("cx_during_recovery");
        for (peer, (commits, aborts)) in resend {
            tokio::spawn(self.clone().deliver_decisions(peer, commits, aborts));
        }
        for (coord, ops) in urge {
            tokio::spawn(self.clone().urge_until_decided(coord, ops));
        }
        self.cx.kick.notify_one();
        Ok(())
    }

    /// Urges `coord` about `ops` until it answers (it may be restarting too).
    async fn urge_until_decided(self: Arc<Self>, coord: ServerId, ops: Vec<OpId>) {
        let req = Request::CxUrge { participant: self.id, ops };
        let mut delay = Duration::from_millis(50);
        while self.peer_call_cx(coord, req.clone()).await.is_err() {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    // ----- serial execution -------------------------------------------------------------

    /// `SubExec`: applies `ops` here at once (serial protocol and its CLEAR) and returns
    /// the sub-operations that take them back.
    pub(crate) async fn sub_exec(self: &Arc<Self>, ops: Vec<SubOp>) -> Response {
        let txid = self.txids.next(self.store.as_ref()).await.map_err(eio)?;
        let (guard, prepared) = self.check_subops(txid, &ops, true, &mut Vec::new()).await?;
        let undo = self.undo_of(&ops)?;
        let (batch, remote) = self.commit_batch(&prepared, &CommitPayload::default())?;
        self.write(batch).await?;
        drop(guard);
        self.drop_remote(remote).await;
        self.check_thresholds(&prepared.ops);
        Ok(Reply::Undo(undo))
    }

    /// Sub-operations undoing `ops` (checked, not yet applied): the CLEAR of serial
    /// execution.
    fn undo_of(self: &Arc<Self>, ops: &[SubOp]) -> OpResult<Vec<SubOp>> {
        let mut undo = Vec::new();
        for op in ops.iter().rev() {
            undo.push(match op {
                SubOp::CreateDir { path, object } => {
                    SubOp::RemoveDir { path: path.clone(), ino: object.ino, shards: vec![] }
                }
                SubOp::RemoveDir { path, .. } => {
                    SubOp::CreateDir { path: path.clone(), object: self.dir_object(path)? }
                }
                SubOp::InsertEntry { dir, name, inode, replace: plusfs_proto::Replace::Never, shard } => {
                    SubOp::RemoveEntry { dir: dir.clone(), name: name.clone(), ino: inode.ino, shard: *shard }
                }
                SubOp::RemoveEntry { dir, name, shard, .. } => {
                    let host = self.host(dir, shard.map_or(crate::hugedir::Via::Home, crate::hugedir::Via::Shard))?;
                    let p = plusfs_proto::path::join(dir, name);
                    let inode = self.entry(&host.obj, &p, name)?;
                    SubOp::InsertEntry {
                        dir: dir.clone(),
                        name: name.clone(),
                        inode,
                        replace: plusfs_proto::Replace::Never,
                        shard: *shard,
                    }
                }
                other => {
                    return Err(err(Errno::EINVAL, format!("{other:?} cannot be executed serially")));
                }
            });
        }
        Ok(undo)
    }
}

fn new_op(role: CxRole, peer: ServerId, txid: TxId, ops: Vec<SubOp>) -> Op {
    Op {
        role,
        peer,
        txid,
        ops,
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

/// The (directory, scope) pairs a client request reads or changes, for
/// [`LockTable::settle`](crate::locks::LockTable::settle): its entry in the parent and the
/// path itself as a directory.
pub(crate) fn request_scopes(req: &Request) -> Vec<(String, Scope)> {
    use Request::*;
    let of_path = |p: &str, out: &mut Vec<(String, Scope)>| {
        if let Some((dir, name)) = plusfs_proto::path::split(p) {
            out.push((dir.to_string(), Scope::Name(name.to_string())));
        }
        out.push((p.to_string(), Scope::Whole));
    };
    let mut out = Vec::new();
    match req {
        Shard { op, .. } | OnInode { op, .. } => return request_scopes(op),
        Mkdir { path, .. }
        | Rmdir { path }
        | Create { path, .. }
        | Open { path }
        | Stat { path }
        | DirStat { path }
        | Unlink { path }
        | Readdir { path, .. }
        | SetAttr { path, .. }
        | DirSetAttr { path, .. }
        | Symlink { path, .. }
        | Readlink { path }
        | SetPolicy { path, .. }
        | DistStatus { path }
        | Write { path, .. }
        | Read { path, .. }
        | Xattr { path, .. }
        | DirXattr { path, .. } => of_path(path, &mut out),
        Fsync { path } if !path.is_empty() => of_path(path, &mut out),
        Rename { src, dst } | Link { src, dst } => {
            of_path(src, &mut out);
            of_path(dst, &mut out);
        }
        Exchange { a, b } => {
            of_path(a, &mut out);
            of_path(b, &mut out);
        }
        Batch { dir, names, .. } | BatchRead { dir, names, .. } => {
            out.extend(names.iter().map(|n| (dir.clone(), Scope::Name(n.clone()))));
        }
        BatchWrite { dir, files, .. } => {
            out.extend(files.iter().map(|f| (dir.clone(), Scope::Name(f.name.clone()))));
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_checksummed() {
        let rec = Record::Decided { op: OpId { client: 1, process: 2, seq: 3 }, peer: 4, commit: true };
        let mut bytes = frame(&rec);
        assert!(matches!(unframe(9, &bytes), Ok(Record::Decided { peer: 4, commit: true, .. })));
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(unframe(9, &bytes).is_err());
        assert!(unframe(9, &bytes[..3]).is_err());
    }

    #[test]
    fn scopes_cover_entry_and_directory() {
        let s = request_scopes(&Request::Stat { path: "/a/b".into() });
        assert_eq!(s, vec![("/a".into(), Scope::Name("b".into())), ("/a/b".into(), Scope::Whole)]);
        let s = request_scopes(&Request::Shard {
            incarnation: 3,
            op: Box::new(Request::Readdir { path: "/a".into(), after: None, limit: 10 }),
        });
        assert_eq!(s, vec![("/".into(), Scope::Name("a".into())), ("/a".into(), Scope::Whole)]);
    }
}
