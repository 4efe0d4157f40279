//! The exactly-once table of a replicated slot (`Request::Once`).
//!
//! A client sends each request that is not idempotent to a replicated slot with its id and
//! a sequence number. While the request runs, every store batch it submits also records
//! that it was applied (`ONCE` in `plusfs_store`), atomically with its effects; once it is
//! answered, the answer itself is recorded (not waited for). A resend — after its
//! connection broke, typically because the leader died — then gets:
//! - the recorded answer, if there is one;
//! - if only the mark is there (the leader died between its effects and the record of
//!   its answer): an answer rebuilt from the state for operations on one server (create,
//!   symlink, unlink: what succeeding would have answered), and `EIO` "outcome unknown"
//!   for the others;
//! - otherwise nothing of it was applied, and it runs.
//!
//! Records expire after [`KEEP`]: a resend comes within seconds.

use crate::osd::Osd;
use plusfs_proto::{Cred, Errno, Reply, Request, Response, WireError};
use plusfs_store::{commit, Batch, BatchOp, OnceId, OnceState, ONCE};
use std::sync::Arc;
use std::time::Duration;

/// How long a request's record is kept.
const KEEP: Duration = Duration::from_secs(600);
/// How often expired records are deleted.
const EXPIRE_EVERY: Duration = Duration::from_secs(60);

fn eio(msg: String) -> WireError {
    WireError::new(Errno::EIO, msg)
}

/// Serves `op`, request `seq` of `client`, at most once.
pub(crate) async fn handle(
    osd: &Arc<Osd>,
    table: &plusfs_store::RocksStore,
    cred: Cred,
    (client, seq): (u64, u64),
    op: Request,
) -> Response {
    match table.get_once(client, seq) {
        Ok(Some(OnceState::Answered(bytes))) => {
            return postcard::from_bytes(&bytes).map_err(|e| eio(format!("bad recorded answer: {e}")))?;
        }
        Ok(Some(OnceState::Applied)) => return rebuilt(osd, cred, op).await,
        Ok(None) => {}
        Err(e) => return Err(eio(format!("cannot read the exactly-once table: {e}"))),
    }
    let id = OnceId { client, seq, marked: Default::default() };
    let (answer, marked) = ONCE
        .scope(id, async {
            let answer = osd.handle(cred, op).await;
            (answer, ONCE.with(|id| id.marked.get()))
        })
        .await;
    // Nothing applied: a resend may run it again. Otherwise the answer is recorded,
    // without waiting (if it is lost with the leader, a resend rebuilds it).
    if marked {
        if let Ok(bytes) = postcard::to_allocvec(&answer) {
            let mut b = Batch::new();
            b.ops.push(BatchOp::PutOnce(client, seq, plusfs_store::once_value(Some(&bytes))));
            let store = osd.store.clone();
            tokio::spawn(async move {
                if let Err(e) = commit(store.as_ref(), b).await {
                    tracing::debug!(cause = %e, "an answer was not recorded");
                }
            });
        }
    }
    answer
}

/// The answer to a request that was applied but whose answer was lost.
async fn rebuilt(osd: &Arc<Osd>, cred: Cred, op: Request) -> Response {
    let unknown = |what: &str| {
        Err(eio(format!("{what}: applied by a leader that died before answering; its outcome is not known here")))
    };
    match op {
        Request::Create { path, .. } | Request::Symlink { path, .. } => {
            match osd.handle(cred, Request::Stat { path: path.clone() }).await {
                Ok(a @ Reply::Attr(_)) => Ok(a),
                _ => unknown(&path),
            }
        }
        Request::Unlink { .. } => Ok(Reply::Done),
        other => unknown(other.name()),
    }
}

/// Deletes the records older than [`KEEP`], every [`EXPIRE_EVERY`], while this member
/// leads.
pub(crate) async fn expire(osd: Arc<Osd>, store: Arc<plusfs_store::RocksStore>) {
    loop {
        tokio::time::sleep(EXPIRE_EVERY).await;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let old = match store.once_older_than(now.saturating_sub(KEEP.as_secs())) {
            Ok(old) => old,
            Err(e) => {
                tracing::warn!(cause = %e, "cannot list expired exactly-once records");
                continue;
            }
        };
        if old.is_empty() {
            continue;
        }
        let mut b = Batch::new();
        b.ops.extend(old.iter().map(|&(c, s)| BatchOp::DelOnce(c, s)));
        if let Err(e) = commit(osd.store.as_ref(), b).await {
            tracing::warn!(cause = %e, "cannot delete expired exactly-once records");
        }
    }
}
