//! Answers of exactly-once requests recorded with their effects: the request's answer
//! goes into the batch that commits it, so a resend after a failover gets it.

use plusfs_proto::Response;

/// Records `answer` with the next batch the current exactly-once request (if any)
/// submits: for a request whose next batch is its last.
pub(crate) fn answer_with_next_batch(answer: &Response) {
    plusfs_store::answer_with_next_batch(|| postcard::to_allocvec(answer).ok());
}

/// Records `answer` at the current exactly-once request's commit point (see
/// [`plusfs_store::commit_point`]).
pub(crate) fn answer_at_commit(answer: &Response) {
    plusfs_store::answer_at_commit(|| postcard::to_allocvec(answer).ok());
}
