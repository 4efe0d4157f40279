//! Failpoints: named steps where a fault-injection test stops a server.
//!
//! Two ways to arm one:
//! - `PLUSFS_FAILPOINT=<name>` in a server process's environment makes the process abort
//!   (like kill -9: nothing is flushed or cleaned up) when it reaches that step. Used by
//!   the multi-process tests.
//! - [`Failpoints::arm`] on an in-process server (the test cluster) makes the step either
//!   *crash* the server (its runtime is torn down by the test cluster; the task that hit the
//!   step never runs another instruction) or *pause* it until the test releases it.
//!
//! Names: `coordinator_after_votes`, `coordinator_after_commit_record`,
//! `participant_after_prepare_record` (two-phase commit); `distribute_after_intent`,
//! `distribute_after_entries`, `distribute_after_shards` (a primary redistributing a huge
//! directory), `storing_before_shard_object` (a storing server receiving its shard);
//! `cx_exec_before_insert` (a server received `CxExec`, before it looks the operation up),
//! `cx_after_result` (a server logged its Result record, before answering), `cx_before_vote`
//! (a coordinator about to send VOTE), `cx_after_vote` (a participant voted, before
//! replying), `cx_after_commit_record` (a coordinator logged its decisions, before
//! COMMIT-REQ); `data_after_append` (file data appended, before its index is committed);
//! `once_before_answer_record` (an exactly-once request took effect on a replicated slot,
//! before its answer is recorded on its own or sent).
//! `statfs_handler` (a server serving `Statfs`; with `PLUSFS_FAILPOINT=panic:statfs_handler` the
//! request's task panics, which the server answers with EIO).
//! Process-only (reached in synchronous code): `compaction_before_switch`,
//! `compaction_after_switch` (data compaction), `cx_during_recovery` (a restarted server
//! loaded its Cx log, before resuming). Unarmed, checking costs two loads.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::Notify;

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
    name: String,
    action: FailAction,
    hits: AtomicU64,
    reached: Notify,
    released: AtomicBool,
    release: Notify,
}

impl Failpoint {
    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
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
    armed: Mutex<HashMap<String, Arc<Failpoint>>>,
    crash_hook: OnceLock<CrashHook>,
}

fn process_failpoint() -> Option<&'static str> {
    static NAME: OnceLock<Option<String>> = OnceLock::new();
    NAME.get_or_init(|| std::env::var("PLUSFS_FAILPOINT").ok().filter(|s| !s.is_empty())).as_deref()
}

/// Aborts the process if `PLUSFS_FAILPOINT` names `name` (for steps in synchronous code);
/// panics (the reaching task only) if it names `panic:NAME`.
pub fn hit_process(name: &str) {
    match process_failpoint() {
        Some(n) if n == name => {
            eprintln!("plusfs: failpoint {name} reached: aborting");
            std::process::abort();
        }
        Some(n) if n.strip_prefix("panic:") == Some(name) => panic!("failpoint {name}: a forced panic"),
        _ => {}
    }
}

impl Failpoints {
    /// Sets what a [`FailAction::Crash`] does (the test cluster tears the server down).
    /// Only the first hook set counts.
    pub fn on_crash(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.crash_hook.set(Box::new(hook));
    }

    /// Arms `name` with `action`, replacing an earlier arming of it.
    pub fn arm(&self, name: &str, action: FailAction) -> Arc<Failpoint> {
        let fp = Arc::new(Failpoint {
            name: name.to_string(),
            action,
            hits: AtomicU64::new(0),
            reached: Notify::new(),
            released: AtomicBool::new(false),
            release: Notify::new(),
        });
        self.armed.lock().insert(name.to_string(), fp.clone());
        self.any.store(true, Ordering::Release);
        fp
    }

    /// Disarms `name` (a paused arrival is released).
    pub fn disarm(&self, name: &str) {
        if let Some(fp) = self.armed.lock().remove(name) {
            fp.release();
        }
    }

    /// Called by the server at step `name`.
    pub async fn hit(&self, name: &str) {
        hit_process(name);
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let fp = {
            let armed = self.armed.lock();
            if armed.is_empty() {
                return;
            }
            match armed.get(name) {
                Some(fp) => fp.clone(),
                None => return,
            }
        };
        fp.hits.fetch_add(1, Ordering::AcqRel);
        fp.reached.notify_waiters();
        match fp.action {
            FailAction::Pause => {
                tracing::info!(failpoint = name, "paused at failpoint");
                fp.wait_release().await;
            }
            FailAction::Crash => {
                tracing::info!(failpoint = name, "crashing at failpoint");
                if let Some(hook) = self.crash_hook.get() {
                    hook(name);
                }
                std::future::pending::<()>().await;
            }
        }
    }
}
