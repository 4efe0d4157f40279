//! Cx commitment rounds, run by the coordinator: VOTE, decision write, COMMIT-REQ /
//! ABORT-REQ until ACKed, Complete.

use super::Cx;
use super::*;
use crate::backoff::Backoff;

impl Cx {
    // ----- commitment (coordinator) ---------------------------------------------------

    pub(super) async fn commit_loop(self: Arc<Self>) {
        let timeout = Duration::from_millis(self.engine.map().txn.commit_timeout_ms);
        let threshold = self.engine.map().txn.commit_threshold as usize;
        let mut last = Instant::now();
        loop {
            let _ = tokio::time::timeout_at((last + timeout).into(), self.cx.kick.notified()).await;
            let lazy = last.elapsed() >= timeout || self.cx.coordinator_ready() >= threshold;
            let batch = self.take_for_commit(lazy);
            if lazy {
                last = Instant::now();
                self.urge_stale_participations(timeout * 2);
                let mut st = self.cx.st();
                crate::cx::state::CxState::forget_old(&mut st);
            }
            for (peer, ops) in batch {
                tokio::spawn(self.clone().commit_round(peer, ops));
            }
        }
    }

    /// Coordinator operations to commit now, by participant: every executed one (`lazy`)
    /// or only the urgent ones.
    pub(super) fn take_for_commit(&self, lazy: bool) -> BTreeMap<ServerId, Vec<OpId>> {
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
    pub(super) fn urge_stale_participations(self: &Arc<Self>, age: Duration) {
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
    pub(super) async fn commit_round(self: Arc<Self>, peer: ServerId, ids: Vec<OpId>) {
        self.cx.counters.rounds.fetch_add(1, Ordering::Relaxed);
        let ballot: Vec<(OpId, Vec<OpId>)> = {
            let st = self.cx.st();
            ids.iter().map(|id| (*id, st.ops.get(id).map(|o| o.waiters.clone()).unwrap_or_default())).collect()
        };
        self.failpoints.hit(crate::failpoint::FailStep::CxBeforeVote).await;
        let votes = match self.peer_call_cx(peer, Request::CxVote { coordinator: self.engine.id(), ops: ballot }).await
        {
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
            votes.into_iter().filter(|(id, e, side)| e.is_none() && self.sides_agree(id, side)).map(|v| v.0).collect();
        let (commits, aborts): (Vec<OpId>, Vec<OpId>) = ids.iter().partition(|id| yes.contains(id));
        tracing::debug!(peer, ?commits, ?aborts, "Cx decisions");
        if let Err(e) = self.decide(peer, &commits, &aborts).await {
            tracing::error!(cause = %e.message(), "cannot write Cx decisions; the operations stay pending");
            self.back_to_pending(&ids);
            return;
        }
        self.deliver_decisions(peer, commits, aborts).await;
    }

    /// Whether the participant's side of `id` names the directory this side names (a
    /// mkdir's entry and object, an rmdir's entry and object): the client built both, so
    /// sides that disagree are aborted, whatever both voted.
    fn sides_agree(&self, id: &OpId, theirs: &Option<DirSide>) -> bool {
        let ours = self.cx.st().ops.get(id).and_then(|o| DirSide::of(&o.ops));
        let agree = ours.is_none() || ours == *theirs;
        if !agree {
            tracing::warn!(op = %id, ?ours, ?theirs, "the two sides of a Cx operation name different directories: aborted");
        }
        agree
    }

    pub(super) fn back_to_pending(&self, ids: &[OpId]) {
        let mut st = self.cx.st();
        for id in ids {
            if let Some(op) = st.ops.get_mut(id) {
                op.phase = Phase::Yes;
            }
        }
    }

    pub(super) async fn peer_call_cx(self: &Arc<Self>, peer: ServerId, req: Request) -> OpResult<Reply> {
        if peer == self.engine.id() {
            return Box::pin(self.handle_cx(req, &Call::server())).await;
        }
        match self.peers.pool.call(peer, &req).await {
            Ok(r) => r.map_err(OpError::from),
            Err(e) => Err(err(e.errno(), format!("server {peer}: {e}"))),
        }
    }

    /// The coordinator's decision write: effects of `commits`, Commit/Abort records
    /// replacing the Result records; then the locks go.
    pub(super) async fn decide(self: &Arc<Self>, peer: ServerId, commits: &[OpId], aborts: &[OpId]) -> OpResult<()> {
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
        let guard = self.engine.locks().lock_owned(&applied.locks, &released).await;
        let (effects, remote) = self.engine.commit_batch(&applied, &CommitPayload::default())?;
        let mut all = effects;
        all.extend(b);
        self.engine.apply(all).await?;
        self.failpoints.hit(crate::failpoint::FailStep::CxAfterCommitRecord).await;
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
            self.engine.locks().release_tx(t);
        }
        drop(guard);
        self.filedata.drop_remote(remote).await;
        self.engine.check_thresholds(&applied.ops);
        self.cx.counters.committed.fetch_add(commits.len() as u64, Ordering::Relaxed);
        self.cx.counters.aborted.fetch_add(aborts.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Sends the decisions until the participant ACKs, then prunes them (Complete).
    pub(super) async fn deliver_decisions(self: Arc<Self>, peer: ServerId, commits: Vec<OpId>, aborts: Vec<OpId>) {
        let req = Request::CxDecide { commits: commits.clone(), aborts: aborts.clone() };
        let mut backoff = Backoff::delivery(&self.engine.map());
        while let Err(e) = self.peer_call_cx(peer, req.clone()).await {
            tracing::warn!(peer, cause = %e.message(), "Cx decision not delivered; retrying");
            backoff.wait().await;
        }
        let ended: Vec<(OpId, bool)> =
            commits.iter().map(|i| (*i, true)).chain(aborts.iter().map(|i| (*i, false))).collect();
        self.complete(&ended).await;
    }

    /// Prunes the records of ended operations and forgets them.
    pub(super) async fn complete(&self, ended: &[(OpId, bool)]) {
        let mut b = Batch::new();
        {
            let st = self.cx.st();
            for (id, _) in ended {
                if let Some(op) = st.ops.get(id) {
                    b.del_log(LogKind::Cx, op.txid);
                }
            }
        }
        if let Err(e) = self.engine.apply(b).await {
            tracing::error!(cause = %e.message(), "cannot prune Cx records (they are pruned at the next start)");
        }
        self.forget_ended(ended);
    }

    pub(super) fn forget_ended(&self, ended: &[(OpId, bool)]) {
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
}
