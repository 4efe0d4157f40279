//! Resuming Cx operations from the log after a restart.

use super::Cx;
use super::*;
use crate::backoff::Backoff;

impl Cx {
    // ----- recovery -------------------------------------------------------------------

    /// Loads the Cx log after a restart: locks are taken back before any request is
    /// served; decisions are re-sent, coordinated operations committed at once and the
    /// coordinators of participations urged.
    pub(crate) fn recover_cx(self: &Arc<Self>) -> Result<(), StoreError> {
        let mut resend: BTreeMap<ServerId, (Vec<OpId>, Vec<OpId>)> = BTreeMap::new();
        let mut urge: BTreeMap<ServerId, Vec<OpId>> = BTreeMap::new();
        let records = self.engine.store().log_records(LogKind::Cx)?;
        let n = records.len();
        {
            let mut st = self.cx.st();
            for (txid, bytes) in records {
                let size = bytes.len() as u64;
                let (id, op) = match unframe(txid, &bytes)? {
                    Record::Result { op: id, role, peer, ops, locks, hint } => {
                        self.engine.locks().add_tx_locks(txid, &locks);
                        if role == CxRole::Participant {
                            urge.entry(peer).or_default().push(id);
                        }
                        let mut op = new_op(role, peer, txid, ops, Cred::server());
                        op.phase = Phase::Yes;
                        op.locks = locks;
                        op.hint = hint;
                        op.urgent = role == CxRole::Coordinator;
                        (id, op)
                    }
                    Record::Decided { op: id, peer, commit } => {
                        let e = resend.entry(peer).or_default();
                        if commit { &mut e.0 } else { &mut e.1 }.push(id);
                        let mut op = new_op(CxRole::Coordinator, peer, txid, vec![], Cred::server());
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
        crate::failpoint::hit_process(crate::failpoint::FailStep::CxDuringRecovery);
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
    pub(super) async fn urge_until_decided(self: Arc<Self>, coord: ServerId, ops: Vec<OpId>) {
        let req = Request::CxUrge { participant: self.engine.id(), ops };
        let mut backoff = Backoff::delivery(&self.engine.map());
        while self.peer_call_cx(coord, req.clone()).await.is_err() {
            backoff.wait().await;
        }
    }
}
