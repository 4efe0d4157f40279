//! The exactly-once table of a replicated slot (`Request::Once`).
//!
//! A client sends each request that is not idempotent to a replicated slot with its id and
//! a sequence number. The request runs with a [`Call`] carrying that id, and every batch
//! of its effects (`Engine::apply_for`) also records that it was applied, atomically with
//! them (inode and record number reservations, and work the request hands to other
//! tasks, are applied without it); once it is answered, the answer itself is recorded
//! (not waited for: until it is, the request stays in [`Running`]). A resend — after its connection broke,
//! typically because the leader died — then gets:
//! - the first run's answer, if that run is still going on here (it is waited for);
//! - the recorded answer, if there is one;
//! - if only the mark is there (the leader died between its effects and the record of
//!   its answer): for a create or symlink (also in a shard), and a mkdir, rmdir or link
//!   (over two servers: recovery settles them first), the state decides — done if its
//!   effect is there, else it runs; a directory's attribute change answers the
//!   directory's attributes; an exchange, rename or unlink runs again (its answer
//!   is recorded with its commit: its one local batch or its transaction's decision, so a
//!   mark without it means the new leader's recovery undid it — the state could not tell:
//!   another client may have removed the source meanwhile); a batch of mkdirs answers the
//!   directories that exist as done and makes the others; `EIO` "outcome unknown" for the
//!   rest (create or unlink batches that went entry by entry, as they do for hard links);
//! - otherwise nothing of it was applied, and it runs.
//!
//! Requests whose answer is known before their last batch — writes, commits of
//! client-direct writes, file attribute changes, file write batches, serial Cx
//! executions, appends, xattr changes,
//! create and unlink batches, exchanges, renames, unlinks — record it in that batch
//! ([`Call::answer_with_next_batch`], [`Call::answer_at_commit`]), atomically with their
//! effects, so no window is left for them.
//! A request the server forwards to another slot (an append to a hard-linked file's
//! inode home) goes there under the same id, so that slot's table answers its resend.
//!
//! A member whose replication failed (it lost its lead) answers nothing itself: the
//! client is redirected and resends to the next leader, which knows what was applied.
//! Records expire after [`KEEP`]: a resend comes within seconds.

use crate::engine::call::Call;
use crate::osd::Osd;
use parking_lot::Mutex;
use plusfs_proto::{BatchReply, Cred, Errno, Reply, Request, Response, WireError};
use plusfs_store::{Batch, BatchOp, OnceState, RocksStore};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a request's record is kept.
const KEEP: Duration = Duration::from_secs(600);
/// How often expired records are deleted.
const EXPIRE_EVERY: Duration = Duration::from_secs(60);
/// Records deleted per batch (one log entry each).
const EXPIRE_BATCH: usize = 1000;

fn eio(msg: String) -> WireError {
    WireError::new(Errno::EIO, msg)
}

/// The `Once` requests running on this member, so a resend that arrives while its first
/// run goes on waits for that run's answer instead of running again.
#[derive(Default, Clone)]
pub struct Running(Arc<Mutex<HashMap<(u64, u64), FirstAnswer>>>);

/// Where the answer of a request's first run appears.
type FirstAnswer = watch::Receiver<Option<Response>>;

/// Serves `op`, request `seq` of `client`, at most once, with `table` the member's store.
pub(crate) async fn handle(
    osd: &Arc<Osd>,
    (table, running): (&RocksStore, &Running),
    cred: Cred,
    (client, seq): (u64, u64),
    op: Request,
    hint: u16,
) -> Response {
    let key = (client, seq);
    let first = running.0.lock().get(&key).cloned();
    if let Some(mut rx) = first {
        let answer = match rx.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone().expect("an answer"),
            Err(_) => Err(eio("the first run of this request ended without an answer".into())),
        };
        // As for the first run: a member that lost its lead meanwhile sends the client to
        // the next leader, which knows what was applied.
        if table.replication_failed() {
            return Ok(Reply::Redirect { leader: None });
        }
        return answer;
    }
    let (tx, rx) = watch::channel(None);
    running.0.lock().insert(key, rx);
    let (answer, record) = run(osd, table, cred, key, (op, hint)).await;
    let _ = tx.send(Some(answer.clone()));
    match record {
        // The answer is recorded without waiting; until it is, a resend here gets it from
        // the running table (after a failover, the next leader settles it from the state).
        Some(b) => {
            let (engine, running) = (osd.engine.clone(), running.clone());
            tokio::spawn(async move {
                if let Err(e) = engine.commit(b).await {
                    tracing::debug!(cause = %e, "an answer was not recorded");
                }
                running.0.lock().remove(&key);
            });
        }
        None => {
            running.0.lock().remove(&key);
        }
    }
    if table.replication_failed() {
        // This member lost its lead meanwhile: what it did may or may not commit. The next
        // leader knows; the client resends there.
        return Ok(Reply::Redirect { leader: None });
    }
    answer
}

/// Runs the request unless its table says it ran: its answer, and the batch that records
/// that answer if it is still to be recorded.
async fn run(
    osd: &Arc<Osd>,
    table: &RocksStore,
    cred: Cred,
    (client, seq): (u64, u64),
    (op, hint): (Request, u16),
) -> (Response, Option<Batch>) {
    match table.get_once(client, seq) {
        Ok(Some(OnceState::Answered(bytes))) => {
            let answer = postcard::from_bytes(&bytes).map_err(|e| eio(format!("bad recorded answer: {e}")));
            return (answer.and_then(|a| a), None);
        }
        Ok(Some(OnceState::Applied)) => {
            if let Some(answer) = settled(osd, &cred, &op).await {
                return (answer, None);
            }
        }
        Ok(None) => {}
        Err(e) => return (Err(eio(format!("cannot read the exactly-once table: {e}"))), None),
    }
    let call = Call::once(cred, client, seq);
    let answer = osd.handle_call(&call, op, hint).await;
    let (marked, answered) = call.progress();
    if marked {
        osd.failpoints.hit(crate::failpoint::FailStep::OnceBeforeAnswerRecord).await;
    }
    // Nothing applied: a resend may run it again. Recorded with its effects: done.
    // Otherwise the answer is to be recorded (if it is lost with the leader, a resend
    // settles it from the state).
    let record = match (marked && !answered, postcard::to_allocvec(&answer)) {
        (true, Ok(bytes)) => {
            let mut b = Batch::new();
            b.ops.push(BatchOp::PutOnce(client, seq, plusfs_store::once_value(Some(&bytes))));
            Some(b)
        }
        _ => None,
    };
    (answer, record)
}

/// The answer to a request that was applied (at least in part) but whose answer was lost,
/// or `None` if the state shows its effect is not there, so it is to run.
async fn settled(osd: &Arc<Osd>, cred: &Cred, op: &Request) -> Option<Response> {
    let unknown = |what: &str| {
        Some(Err(eio(format!("{what}: applied by a leader that died before answering; its outcome is not known here"))))
    };
    // A request for a distributed directory's shard is settled in the same shard.
    let (inner, incarnation) = match op {
        Request::Shard { incarnation, op } => (op.as_ref(), Some(*incarnation)),
        other => (other, None),
    };
    let stat = |path: &str| {
        let stat = Request::Stat { path: path.to_string() };
        match incarnation {
            Some(incarnation) => Request::Shard { incarnation, op: Box::new(stat) },
            None => stat,
        }
    };
    match inner {
        Request::Create { path, .. } | Request::Symlink { path, .. } => {
            match osd.handle(cred.clone(), stat(path)).await {
                Ok(a @ Reply::Attr(_)) => Some(Ok(a)),
                Err(e) if e.errno == Errno::ENOENT && e.missing_dir.is_none() => None,
                _ => unknown(path),
            }
        }
        // Their answer goes with their commit (the one local batch, or the decision of
        // their transaction): marked without it, they were not applied (the new leader's
        // recovery aborted the transaction). Their source being gone now says nothing: a
        // concurrent request may have removed it.
        Request::Unlink { .. } | Request::Rename { .. } => None,
        // Operations over two servers (2PC): the new leader's recovery finishes or undoes
        // them, and a look at an object they hold waits for that outcome; then the state
        // tells whether they were applied.
        Request::Mkdir { path, .. } if incarnation.is_none() => match dir_stat(osd, path).await {
            Ok(a @ Reply::Attr(_)) => Some(Ok(a)),
            Err(e) if e.errno == Errno::ENOENT => None,
            _ => unknown(path),
        },
        Request::Rmdir { path } if incarnation.is_none() => match dir_stat(osd, path).await {
            Err(e) if e.errno == Errno::ENOENT => Some(Ok(Reply::Done)),
            Ok(_) => None,
            _ => unknown(path),
        },
        // A link is done once its new entry exists (asked here: its parent's home may be
        // another server, which answers it as unknown).
        Request::Link { dst, .. } if incarnation.is_none() => match osd.handle(cred.clone(), stat(dst)).await {
            Ok(_) => Some(Ok(Reply::Done)),
            Err(e) if e.errno == Errno::ENOENT && e.missing_dir.is_none() => None,
            _ => unknown(dst),
        },
        // Its answer goes with its commit decision (or its one local batch): marked
        // without it, the new leader's recovery aborted it.
        Request::Exchange { .. } => None,
        // Marked only by its last batch (the ancestry transaction below it runs as the
        // servers, unmarked): applied, so the directory's attributes now are its answer.
        Request::DirSetAttr { path, .. } if incarnation.is_none() => match dir_stat(osd, path).await {
            Ok(a @ Reply::Attr(_)) => Some(Ok(a)),
            _ => unknown(path),
        },
        Request::Batch { op: plusfs_proto::BatchOp::Mkdir, dir, names, .. } if incarnation.is_none() => {
            settle_mkdirs(osd, cred, inner, (dir, names)).await
        }
        other => unknown(other.name()),
    }
}

/// A batch of mkdirs applied at least in part: the directories that exist are done (their
/// attributes; one that existed before the batch, which its first run answered `EEXIST`,
/// is answered as made, as for a single mkdir), the others are made now by the same batch
/// for just them; the answers merge in the names' order. `None` (run it whole) if none
/// exists.
async fn settle_mkdirs(
    osd: &Arc<Osd>,
    cred: &Cred,
    req: &Request,
    (dir, names): (&str, &[String]),
) -> Option<Response> {
    let mut found = Vec::with_capacity(names.len());
    for name in names {
        let path = plusfs_proto::path::join(dir, name);
        found.push(match dir_stat(osd, &path).await {
            Ok(Reply::Attr(a)) => Some(a),
            Err(e) if e.errno == Errno::ENOENT => None,
            _ => {
                return Some(Err(eio(format!(
                    "{path}: a batch of mkdirs applied by a leader that died; its outcome is not known here"
                ))))
            }
        });
    }
    if found.iter().all(Option::is_none) {
        return None;
    }
    let missing: Vec<String> = names.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(n, _)| n.clone()).collect();
    let mut rest = match missing.is_empty() {
        true => BatchReply { errnos: Vec::new(), attrs: Vec::new(), dist: None },
        false => {
            let Request::Batch { op, dir, mode, uid, gid, semantics, .. } = req.clone() else { return None };
            let again = Request::Batch { op, dir, names: missing, mode, uid, gid, semantics };
            match osd.handle(cred.clone(), again).await {
                Ok(Reply::Batch(b)) => b,
                other => return Some(other),
            }
        }
    };
    let mut merged = BatchReply { errnos: Vec::new(), attrs: Vec::new(), dist: None };
    let (mut rest_errnos, mut rest_attrs) = (rest.errnos.drain(..), rest.attrs.drain(..));
    for f in found {
        match f {
            Some(a) => {
                merged.errnos.push(Errno::OK);
                merged.attrs.push(a);
            }
            None => match rest_errnos.next() {
                Some(e) => {
                    merged.errnos.push(e);
                    if e == Errno::OK {
                        merged.attrs.extend(rest_attrs.next());
                    }
                }
                // Not performed (an earlier entry failed under stop-on-failure).
                None => break,
            },
        }
    }
    Some(Ok(Reply::Batch(merged)))
}

/// The attributes of the directory object at `path`, from its home (here or a peer).
async fn dir_stat(osd: &Arc<Osd>, path: &str) -> Response {
    let req = Request::DirStat { path: path.to_string() };
    let home = osd.engine.map().home_of_dir(path);
    if home == osd.engine.id() {
        return osd.handle(Cred::server(), req).await;
    }
    osd.peers.pool.call(home, &req).await.map_err(|e| eio(format!("cannot ask the home of '{path}': {e}")))?
}

/// Deletes the records older than [`KEEP`], every [`EXPIRE_EVERY`], while this member
/// leads.
pub(crate) async fn expire(osd: Arc<Osd>, store: Arc<RocksStore>) {
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
        for chunk in old.chunks(EXPIRE_BATCH) {
            let mut b = Batch::new();
            b.ops.extend(chunk.iter().map(|&(c, s)| BatchOp::DelOnce(c, s)));
            if let Err(e) = osd.engine.commit(b).await {
                tracing::warn!(cause = %e, "cannot delete expired exactly-once records");
                break;
            }
        }
    }
}
