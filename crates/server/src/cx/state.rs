//! The state of the Cx operations pending on one server: each operation's role, phase,
//! locks and hints, the ids of ended and refused operations, and the log's size.

use crate::engine::locks::Scope;
use parking_lot::Mutex;
use plusfs_proto::{Cred, CxRole, OpId, ServerId, SubOp, TxId, WireError};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a VOTE waits for the execution of an operation the participant has not
/// finished executing (it is blocked or still on its way) before voting NO.
pub(crate) const VOTE_WAIT: Duration = Duration::from_secs(2);
/// How long the coordinator waits for a sub-operation it has never seen before it aborts
/// the operation (the client may have died before sending it).
pub(crate) const UNKNOWN_GRACE: Duration = Duration::from_millis(500);
/// How long aborted and refused operation ids are remembered, so a late sub-operation of
/// one is refused (NO) instead of executed.
pub(crate) const TOMBSTONE_LIFE: Duration = Duration::from_secs(600);
/// How long committed operation ids are remembered (a resent request or a late L-COM comes
/// within seconds; a short life keeps the table small at high rates).
pub(crate) const COMMITTED_LIFE: Duration = Duration::from_secs(30);
/// Where an operation stands on this server.
#[derive(Debug, Clone)]
pub(crate) enum Phase {
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
pub(crate) struct Op {
    pub(crate) role: CxRole,
    pub(crate) peer: ServerId,
    pub(crate) txid: TxId,
    pub(crate) ops: Vec<SubOp>,
    /// Who asked (its permissions are checked again if the operation executes again).
    pub(crate) cred: Cred,
    pub(crate) locks: Vec<(String, Scope)>,
    pub(crate) hint: Vec<OpId>,
    pub(crate) phase: Phase,
    pub(crate) bytes: u64,
    pub(crate) since: Instant,
    /// The coordinator asked for an immediate commitment (coordinator role).
    pub(crate) urgent: bool,
    /// A participant already asked its coordinator to commit it.
    pub(crate) urged: bool,
    /// Refused while executing (a VOTE gave up waiting, or an abort came first).
    pub(crate) vetoed: bool,
    /// Operations of other clients waiting here for this one's locks (coordinator: they
    /// go into the VOTE, so the participant follows this order).
    pub(crate) waiters: Vec<OpId>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) ops: HashMap<OpId, Op>,
    pub(crate) by_tx: HashMap<TxId, OpId>,
    /// Ended operations: id → (committed, when). Refuses late sub-operations and answers
    /// late L-COMs.
    pub(crate) ended: HashMap<OpId, (bool, Instant)>,
    /// NO answers given here: id → the error (until the operation ends).
    pub(crate) refused: HashMap<OpId, (WireError, Instant)>,
    pub(crate) live_bytes: u64,
    pub(crate) peak_bytes: u64,
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
pub(crate) struct CxState {
    pub(crate) state: Mutex<State>,
    /// Something ended or was invalidated, or log space came free.
    pub(crate) changed: Notify,
    /// Wakes the commitment loop (threshold reached or an urgent operation).
    pub(crate) kick: Notify,
    pub(crate) counters: CxCounters,
}

impl Default for CxState {
    fn default() -> Self {
        CxState {
            state: Mutex::default(),
            changed: Notify::new(),
            kick: Notify::new(),
            counters: CxCounters::default(),
        }
    }
}

impl CxState {
    pub(crate) fn st(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Operations pending here and live log bytes (now, at most).
    pub(crate) fn gauges(&self) -> (u64, u64, u64) {
        let st = self.st();
        (st.ops.len() as u64, st.live_bytes, st.peak_bytes)
    }

    pub(crate) fn coordinator_ready(&self) -> usize {
        self.st().ops.values().filter(|o| o.role == CxRole::Coordinator && matches!(o.phase, Phase::Yes)).count()
    }

    pub(crate) fn forget_old(st: &mut State) {
        let now = Instant::now();
        st.ended.retain(|_, (committed, at)| {
            now.duration_since(*at) < if *committed { COMMITTED_LIFE } else { TOMBSTONE_LIFE }
        });
        st.refused.retain(|_, (_, at)| now.duration_since(*at) < TOMBSTONE_LIFE);
    }
}
