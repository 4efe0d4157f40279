//! The Cx requests a server serves: execution, VOTE (with invalidation), decisions,
//! urges and L-COM.

use super::Cx;
use super::*;
use crate::backoff::Backoff;
use crate::engine::call::Call;
use crate::engine::errors::OpError;

impl Cx {
    // ----- requests -------------------------------------------------------------------

    /// Serves the Cx requests.
    /// Serves the Cx requests (`c`: the caller of a `CxExec`, whose permissions its
    /// execution checks).
    pub(crate) async fn handle_cx(self: &Arc<Self>, req: Request, c: &Call) -> OpResult<Reply> {
        match req {
            Request::CxExec { op, role, peer, ops, leased } => self.cx_exec(op, (role, peer), ops, leased, c).await,
            Request::CxVote { coordinator, ops } => self.cx_vote(coordinator, ops).await,
            Request::CxDecide { commits, aborts } => self.cx_decide(&commits, &aborts).await,
            Request::CxUrge { participant, ops } => self.cx_urge(participant, ops),
            Request::CxLaunch { op, participant } => self.cx_launch(op, participant).await,
            other => Err(err(Errno::EINVAL, format!("{} is not a Cx request", other.name()))),
        }
    }

    /// Participant: votes on each operation from its Result record, first invalidating
    /// operations it executed that the coordinator ordered after it.
    pub(super) async fn cx_vote(
        self: &Arc<Self>,
        coordinator: ServerId,
        ballot: Vec<(OpId, Vec<OpId>)>,
    ) -> OpResult<Reply> {
        for (first, after) in &ballot {
            for b in after {
                self.invalidate(*b, *first, coordinator).await;
            }
        }
        let votes = join_all(ballot.iter().map(|(id, _)| async move {
            let side = self.cx.st().ops.get(id).and_then(|o| DirSide::of(&o.ops));
            let known = self.cx.st().ops.contains_key(id);
            let answer = if known {
                self.wait_answer(*id, Some(VOTE_WAIT)).await
            } else {
                let st = self.cx.st();
                self.known_answer(&st, id).unwrap_or_else(|| CxAnswer {
                    error: Some(OpError::Conflict(format!("operation {id} never reached server")).into()),
                    hint: vec![],
                    made: None,
                })
            };
            (*id, self.final_vote(*id, answer.error), side)
        }))
        .await;
        self.failpoints.hit(crate::failpoint::FailStep::CxAfterVote).await;
        Ok(Reply::CxVotes(votes))
    }

    /// The vote on `id` after waiting gave `error`: a NO marks the operation refused here,
    /// so its execution (running or later) answers NO too — unless that execution has
    /// meanwhile answered YES, which its client may hold: then the vote is YES. Decided
    /// under the state lock, like the execution's own YES.
    pub(super) fn final_vote(&self, id: OpId, error: Option<WireError>) -> Option<WireError> {
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
    pub(super) async fn invalidate(self: &Arc<Self>, id: OpId, first: OpId, coordinator: ServerId) {
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
        if let Err(e) = self.engine.apply(b).await {
            tracing::error!(cause = %e.message(), "cannot invalidate a Cx result");
        }
        {
            let mut st = self.cx.st();
            if let Some(op) = st.ops.get_mut(&id) {
                let bytes = std::mem::take(&mut op.bytes);
                st.live_bytes = st.live_bytes.saturating_sub(bytes);
            }
        }
        self.engine.locks().release_tx(txid);
        self.cx.counters.invalidated.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(op = %id, "Cx result invalidated; executing again");
        self.cx.changed.notify_waiters();
        let osd = self.clone();
        tokio::spawn(async move {
            // Bounded: a `first` that never comes must not hold `id` back for ever.
            let _ = tokio::time::timeout(VOTE_WAIT * 2, osd.wait_ended(first)).await;
            osd.execute(id, &Call::server()).await;
        });
    }

    /// Waits until operation `id` is no longer pending here.
    pub(super) async fn wait_ended(&self, id: OpId) {
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
    pub(super) async fn cx_decide(self: &Arc<Self>, commits: &[OpId], aborts: &[OpId]) -> OpResult<Reply> {
        self.fill_committed(commits).await?;
        let mut applied = Prepared::default();
        let mut b = Batch::new();
        let mut txids = Vec::new();
        let mut ended = Vec::new();
        let mut applying = Vec::new();
        {
            let mut st = self.cx.st();
            for (id, commit) in commits.iter().map(|i| (i, true)).chain(aborts.iter().map(|i| (i, false))) {
                match st.ops.get_mut(id) {
                    // Another delivery of the same decision is applying it: acknowledged
                    // once that is durable (the coordinator then forgets its decision).
                    Some(op) if matches!(op.phase, Phase::Committing) => applying.push(*id),
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
            let guard = self.engine.locks().lock_owned(&applied.locks, &txids).await;
            let (mut all, remote) = self.engine.commit_batch(&applied, &CommitPayload::default())?;
            all.extend(b);
            self.engine.apply(all).await?;
            for t in txids {
                self.engine.locks().release_tx(t);
            }
            drop(guard);
            self.filedata.drop_remote(remote).await;
            self.engine.check_thresholds(&applied.ops);
        }
        self.forget_ended(&ended);
        for id in applying {
            if tokio::time::timeout(VOTE_WAIT, self.wait_ended(id)).await.is_err() {
                let why = format!("Cx operation {id}: its decision is still being applied; send it again");
                return Err(WireError::new(Errno::EAGAIN, why).into());
            }
        }
        Ok(Reply::Done)
    }

    /// Participant: new directory objects of committed operations that were executed
    /// without their parent's ancestry (its home did not answer) get it now.
    async fn fill_committed(self: &Arc<Self>, commits: &[OpId]) -> OpResult<()> {
        let unfilled = |ops: &[SubOp]| {
            ops.iter().any(|o| matches!(o, SubOp::CreateDir { object, .. } if object.ancestry.is_none()))
        };
        let todo: Vec<(OpId, Vec<SubOp>)> = {
            let st = self.cx.st();
            commits
                .iter()
                .filter_map(|id| st.ops.get(id).map(|o| (*id, o)))
                .filter(|(_, o)| matches!(o.phase, Phase::Yes) && unfilled(&o.ops))
                .map(|(id, o)| (id, o.ops.clone()))
                .collect()
        };
        for (id, mut ops) in todo {
            self.dirperms.fill_at_commit(&mut ops).await?;
            if let Some(op) = self.cx.st().ops.get_mut(&id) {
                op.ops = ops;
            }
        }
        Ok(())
    }

    /// Coordinator: a participant needs these operations decided now.
    pub(super) fn cx_urge(self: &Arc<Self>, participant: ServerId, ids: Vec<OpId>) -> OpResult<Reply> {
        for id in ids {
            let osd = self.clone();
            tokio::spawn(async move {
                osd.commit_now(id, participant).await;
            });
        }
        Ok(Reply::Done)
    }

    /// Coordinator: L-COM. Commits or aborts `id` now and says which.
    pub(super) async fn cx_launch(self: &Arc<Self>, id: OpId, participant: ServerId) -> OpResult<Reply> {
        Ok(Reply::CxOutcome { committed: self.commit_now(id, participant).await })
    }

    /// Decides `id` at once: an executed operation goes through an immediate round; one
    /// refused or unknown here is aborted at the participant. Returns whether it committed.
    pub(super) async fn commit_now(self: &Arc<Self>, id: OpId, participant: ServerId) -> bool {
        enum Next {
            Ended(bool),
            Wait { kick: bool },
            AbortHere,
            GraceForUnknown,
        }
        // When an operation never seen here may be aborted (its CxExec may still be on
        // its way): UNKNOWN_GRACE after it was first looked for, however often the state
        // changes meanwhile.
        let mut unknown_until: Option<Instant> = None;
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
                    (None, None) if refused || unknown_until.is_some_and(|t| Instant::now() >= t) => Next::AbortHere,
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
                    let until = *unknown_until.get_or_insert_with(|| Instant::now() + UNKNOWN_GRACE);
                    let _ = tokio::time::timeout_at(until.into(), notified).await;
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
    pub(super) async fn abort_at(self: &Arc<Self>, participant: ServerId, id: OpId) {
        self.cx.counters.aborted.fetch_add(1, Ordering::Relaxed);
        self.send_abort(participant, id).await;
    }

    pub(super) async fn send_abort(self: &Arc<Self>, participant: ServerId, id: OpId) {
        let req = Request::CxDecide { commits: vec![], aborts: vec![id] };
        let mut backoff = Backoff::delivery(&self.engine.map());
        while let Err(e) = self.peer_call_cx(participant, req.clone()).await {
            tracing::warn!(participant, cause = %e.message(), "Cx abort not delivered; retrying");
            backoff.wait().await;
        }
        self.cx.changed.notify_waiters();
    }
}
