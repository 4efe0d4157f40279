//! Failpoints: the steps ([`FailStep`]) where a fault-injection test stops a server.
//!
//! Two ways to arm one:
//! - `PLUSFS_FAILPOINT=<name>` in a server process's environment makes the process abort
//!   (like kill -9: nothing is flushed or cleaned up) when it reaches that step. Used by
//!   the multi-process tests.
//! - [`Failpoints::arm`] on an in-process server (the test cluster) makes the step either
//!   *crash* the server (its runtime is torn down by the test cluster; the task that hit the
//!   step never runs another instruction) or *pause* it until the test releases it.
//!
//! Steps, by name: `coordinator_after_votes`, `coordinator_after_commit_record`,
//! `participant_after_prepare_record` (two-phase commit); `distribute_after_intent`,
//! `distribute_after_entries`, `distribute_after_shards` (a primary redistributing a huge
//! directory), `storing_before_shard_object` (a storing server receiving its shard);
//! `cx_exec_before_insert` (a server received `CxExec`, before it looks the operation up),
//! `cx_after_result` (a server logged its Result record, before answering), `cx_before_vote`
//! (a coordinator about to send VOTE), `cx_after_vote` (a participant voted, before
//! replying), `cx_after_commit_record` (a coordinator logged its decisions, before
//! COMMIT-REQ); `data_after_append` (file data appended, before its index is committed);
//! `once_before_answer_record` (an exactly-once request took effect on a replicated slot,
//! before its answer is recorded on its own or sent); `migrate_after_outbox`,
//! `migrate_before_import` (a directory object's hand-over, on the old and the new home);
//! `shard_after_out` (a drained server handed a shard over, before answering),
//! `shard_before_take` (the taker stored a shard's entries, before its object).
//! `statfs_handler` (a server serving `Statfs`; with `PLUSFS_FAILPOINT=panic:statfs_handler` the
//! request's task panics, which the server answers with EIO).
//! Process-only (reached in synchronous code): `compaction_before_switch`,
//! `compaction_after_switch` (data compaction), `cx_during_recovery` (a restarted server
//! loaded its Cx log, before resuming). Unarmed, checking costs two loads.
//!
//! Failpoints exist only in builds with the `failpoints` feature (test builds: the test
//! cluster and the integration tests' `plusfs-tested` binary turn it on; `make build`
//! leaves both out). In other builds reaching a step does nothing,
//! arming is not there, and a server started with `PLUSFS_FAILPOINT` set refuses to start.

#![cfg_attr(not(any(test, feature = "failpoints")), allow(dead_code))]

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::Notify;

/// A step where a fault-injection test may stop a server. Names (`FailStep::name`) are what
/// `PLUSFS_FAILPOINT` takes; a name that is none of these stops the server at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailStep {
    CoordinatorAfterVotes,
    CoordinatorAfterCommitRecord,
    ParticipantAfterPrepareRecord,
    DistributeAfterIntent,
    DistributeAfterEntries,
    DistributeAfterShards,
    StoringBeforeShardObject,
    CxExecBeforeInsert,
    CxAfterResult,
    CxBeforeVote,
    CxAfterVote,
    CxAfterCommitRecord,
    DataAfterAppend,
    OnceBeforeAnswerRecord,
    MigrateAfterOutbox,
    MigrateBeforeImport,
    ShardAfterOut,
    ShardBeforeTake,
    StatfsHandler,
    CompactionBeforeSwitch,
    CompactionAfterSwitch,
    CxDuringRecovery,
}

impl FailStep {
    /// Every step.
    pub const ALL: [FailStep; 22] = [
        FailStep::CoordinatorAfterVotes,
        FailStep::CoordinatorAfterCommitRecord,
        FailStep::ParticipantAfterPrepareRecord,
        FailStep::DistributeAfterIntent,
        FailStep::DistributeAfterEntries,
        FailStep::DistributeAfterShards,
        FailStep::StoringBeforeShardObject,
        FailStep::CxExecBeforeInsert,
        FailStep::CxAfterResult,
        FailStep::CxBeforeVote,
        FailStep::CxAfterVote,
        FailStep::CxAfterCommitRecord,
        FailStep::DataAfterAppend,
        FailStep::OnceBeforeAnswerRecord,
        FailStep::MigrateAfterOutbox,
        FailStep::MigrateBeforeImport,
        FailStep::ShardAfterOut,
        FailStep::ShardBeforeTake,
        FailStep::StatfsHandler,
        FailStep::CompactionBeforeSwitch,
        FailStep::CompactionAfterSwitch,
        FailStep::CxDuringRecovery,
    ];

    /// The step's name.
    pub fn name(self) -> &'static str {
        match self {
            FailStep::CoordinatorAfterVotes => "coordinator_after_votes",
            FailStep::CoordinatorAfterCommitRecord => "coordinator_after_commit_record",
            FailStep::ParticipantAfterPrepareRecord => "participant_after_prepare_record",
            FailStep::DistributeAfterIntent => "distribute_after_intent",
            FailStep::DistributeAfterEntries => "distribute_after_entries",
            FailStep::DistributeAfterShards => "distribute_after_shards",
            FailStep::StoringBeforeShardObject => "storing_before_shard_object",
            FailStep::CxExecBeforeInsert => "cx_exec_before_insert",
            FailStep::CxAfterResult => "cx_after_result",
            FailStep::CxBeforeVote => "cx_before_vote",
            FailStep::CxAfterVote => "cx_after_vote",
            FailStep::CxAfterCommitRecord => "cx_after_commit_record",
            FailStep::DataAfterAppend => "data_after_append",
            FailStep::OnceBeforeAnswerRecord => "once_before_answer_record",
            FailStep::MigrateAfterOutbox => "migrate_after_outbox",
            FailStep::MigrateBeforeImport => "migrate_before_import",
            FailStep::ShardAfterOut => "shard_after_out",
            FailStep::ShardBeforeTake => "shard_before_take",
            FailStep::StatfsHandler => "statfs_handler",
            FailStep::CompactionBeforeSwitch => "compaction_before_switch",
            FailStep::CompactionAfterSwitch => "compaction_after_switch",
            FailStep::CxDuringRecovery => "cx_during_recovery",
        }
    }

    /// The step called `name`.
    pub fn from_name(name: &str) -> Option<FailStep> {
        FailStep::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl std::fmt::Display for FailStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an armed failpoint does when a server reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailAction {
    /// The server crashes: the crash hook runs and the reaching task stops for good.
    Crash,
    /// The reaching task waits until [`Failpoint::release`].
    Pause,
}

/// One armed failpoint, shared by the server and the test that armed it.
#[derive(Debug)]
pub struct Failpoint {
    step: FailStep,
    action: FailAction,
    hits: AtomicU64,
    reached: Notify,
    released: AtomicBool,
    release: Notify,
}

impl Failpoint {
    /// The step's name.
    pub fn name(&self) -> &'static str {
        self.step.name()
    }

    /// The step.
    pub fn step(&self) -> FailStep {
        self.step
    }

    /// How many times a server reached the step while it was armed.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Acquire)
    }

    /// Waits until the step has been reached at least once.
    pub async fn reached(&self) {
        loop {
            let notified = self.reached.notified();
            if self.hits() > 0 {
                return;
            }
            notified.await;
        }
    }

    /// Lets every paused (and every later) arrival go on.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.release.notify_waiters();
    }

    async fn wait_release(&self) {
        loop {
            let notified = self.release.notified();
            if self.released.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

type CrashHook = Box<dyn Fn(&str) + Send + Sync>;

/// The failpoints of one server.
#[derive(Default)]
pub struct Failpoints {
    /// False while nothing is armed: the common case costs one load.
    any: AtomicBool,
    armed: Mutex<HashMap<FailStep, Arc<Failpoint>>>,
    crash_hook: OnceLock<CrashHook>,
}

/// What `PLUSFS_FAILPOINT` arms in this process: a step, and whether it panics (the
/// reaching task only) instead of aborting.
type ProcessArm = Option<(FailStep, bool)>;

/// A `PLUSFS_FAILPOINT` the server cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownFailpoint {
    /// It names no step.
    #[error("PLUSFS_FAILPOINT: no failpoint is called '{0}' (known: {known})", known = FailStep::ALL.map(FailStep::name).join(", "))]
    Name(String),
    /// This build has no failpoints.
    #[error("PLUSFS_FAILPOINT={0}: this build has no failpoints (they are in test builds, feature `failpoints`)")]
    NotBuilt(String),
}

/// `PLUSFS_FAILPOINT` (`NAME` or `panic:NAME`) read and checked.
pub fn process_failpoint() -> Result<ProcessArm, UnknownFailpoint> {
    let Some(value) = std::env::var("PLUSFS_FAILPOINT").ok().filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    if !cfg!(any(test, feature = "failpoints")) {
        return Err(UnknownFailpoint::NotBuilt(value));
    }
    let (name, panics) = match value.strip_prefix("panic:") {
        Some(n) => (n, true),
        None => (value.as_str(), false),
    };
    match FailStep::from_name(name) {
        Some(step) => Ok(Some((step, panics))),
        None => Err(UnknownFailpoint::Name(name.to_string())),
    }
}

fn process_arm() -> ProcessArm {
    static ARM: OnceLock<ProcessArm> = OnceLock::new();
    *ARM.get_or_init(|| process_failpoint().unwrap_or_else(|e| panic!("{e}")))
}

/// Aborts the process if `PLUSFS_FAILPOINT` names `step` (for steps in synchronous code);
/// panics (the reaching task only) if it names `panic:NAME`. Nothing without failpoints.
#[inline]
pub fn hit_process(step: FailStep) {
    if !cfg!(any(test, feature = "failpoints")) {
        return;
    }
    match process_arm() {
        Some((s, false)) if s == step => {
            eprintln!("plusfs: failpoint {step} reached: aborting");
            std::process::abort();
        }
        Some((s, true)) if s == step => panic!("failpoint {step}: a forced panic"),
        _ => {}
    }
}

impl Failpoints {
    #[cfg(any(test, feature = "failpoints"))]
    /// Sets what a [`FailAction::Crash`] does (the test cluster tears the server down).
    /// Only the first hook set counts.
    pub fn on_crash(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.crash_hook.set(Box::new(hook));
    }

    #[cfg(any(test, feature = "failpoints"))]
    /// Arms `step` with `action`, replacing an earlier arming of it.
    pub fn arm(&self, step: FailStep, action: FailAction) -> Arc<Failpoint> {
        let fp = Arc::new(Failpoint {
            step,
            action,
            hits: AtomicU64::new(0),
            reached: Notify::new(),
            released: AtomicBool::new(false),
            release: Notify::new(),
        });
        self.armed.lock().insert(step, fp.clone());
        self.any.store(true, Ordering::Release);
        fp
    }

    #[cfg(any(test, feature = "failpoints"))]
    /// Disarms `step` (a paused arrival is released).
    pub fn disarm(&self, step: FailStep) {
        if let Some(fp) = self.armed.lock().remove(&step) {
            fp.release();
        }
    }

    /// Called by the server at `step` (nothing in a build without failpoints).
    #[inline]
    pub async fn hit(&self, step: FailStep) {
        #[cfg(any(test, feature = "failpoints"))]
        self.hit_armed(step).await;
        #[cfg(not(any(test, feature = "failpoints")))]
        let _ = step;
    }

    #[cfg(any(test, feature = "failpoints"))]
    async fn hit_armed(&self, step: FailStep) {
        hit_process(step);
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let fp = {
            let armed = self.armed.lock();
            if armed.is_empty() {
                return;
            }
            match armed.get(&step) {
                Some(fp) => fp.clone(),
                None => return,
            }
        };
        fp.hits.fetch_add(1, Ordering::AcqRel);
        fp.reached.notify_waiters();
        match fp.action {
            FailAction::Pause => {
                tracing::info!(failpoint = step.name(), "paused at failpoint");
                fp.wait_release().await;
            }
            FailAction::Crash => {
                tracing::info!(failpoint = step.name(), "crashing at failpoint");
                if let Some(hook) = self.crash_hook.get() {
                    hook(step.name());
                }
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_found_by_its_name_and_a_typo_is_named_with_the_known_ones() {
        for step in FailStep::ALL {
            assert_eq!(FailStep::from_name(step.name()), Some(step));
        }
        assert_eq!(FailStep::from_name("cx_after_results"), None);
        let e = UnknownFailpoint::Name("cx_after_results".into()).to_string();
        assert!(e.contains("'cx_after_results'") && e.contains("cx_after_result,"), "{e}");
    }

    #[tokio::test]
    async fn an_armed_pause_holds_the_step_until_released() {
        let fps = Arc::new(Failpoints::default());
        let fp = fps.arm(FailStep::CxAfterVote, FailAction::Pause);
        let f = fps.clone();
        let task = tokio::spawn(async move { f.hit(FailStep::CxAfterVote).await });
        fp.reached().await;
        fps.hit(FailStep::CxBeforeVote).await; // another step: not held
        assert!(!task.is_finished());
        fp.release();
        task.await.unwrap();
        assert_eq!(fp.hits(), 1);
    }
}
