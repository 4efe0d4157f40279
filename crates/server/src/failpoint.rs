//! Crash points for fault-injection tests. `PLUSFS_FAILPOINT=<name>` in a server's
//! environment makes it abort (like kill -9: nothing is flushed or cleaned up) when it
//! reaches that point. Names: `coordinator_after_votes`, `coordinator_after_commit_record`,
//! `participant_after_prepare_record` (two-phase commit); `distribute_after_intent`,
//! `distribute_after_entries`, `distribute_after_shards` (a primary redistributing a huge
//! directory), `storing_before_shard_object` (a storing server receiving its shard);
//! `compaction_before_switch`, `compaction_after_switch` (data compaction); `cx_after_result`
//! (a server logged its Result record, before answering), `cx_before_vote` (a coordinator
//! about to send VOTE), `cx_after_vote` (a participant voted, before replying),
//! `cx_after_commit_record` (a coordinator logged its decisions, before COMMIT-REQ),
//! `cx_during_recovery` (a restarted server loaded its Cx log, before resuming). Unset in production; checking costs one comparison.

use std::sync::OnceLock;

fn configured() -> Option<&'static str> {
    static NAME: OnceLock<Option<String>> = OnceLock::new();
    NAME.get_or_init(|| std::env::var("PLUSFS_FAILPOINT").ok().filter(|s| !s.is_empty())).as_deref()
}

/// Aborts the process if the failpoint `name` is configured.
pub fn hit(name: &str) {
    if configured() == Some(name) {
        eprintln!("plusfs: failpoint {name} reached: aborting");
        std::process::abort();
    }
}
