//! A request's context as it goes through the protocols: who makes it (its credential)
//! and, for an exactly-once request of a replicated slot (`Request::Once`), its id and
//! what the batches of its effects record in the slot's exactly-once table.
//!
//! Each batch that is an effect of the request is applied with [`Engine::apply_for`]
//! (`crate::engine::Engine::apply_for`), which adds the request's mark, and at its commit
//! point its answer, to that batch: atomically with the effect. Writes that are not its
//! effect (reservations of inode or record numbers, a redistribution the request set
//! off, work handed to another task) are applied without it and so never mark it. A
//! `Call` is not `Clone`: what a request hands to another task is its `Cred`.

use parking_lot::Mutex;
use plusfs_proto::{Cred, Response};
use plusfs_store::{Batch, BatchOp};
use std::ops::Deref;
use std::sync::Arc;

/// A request's context: its caller and, for an exactly-once request, its mark.
#[derive(Debug)]
pub(crate) struct Call {
    cred: Cred,
    once: Option<Arc<OnceMark>>,
}

/// The exactly-once state of one request.
#[derive(Debug)]
struct OnceMark {
    client: u64,
    seq: u64,
    progress: Mutex<Progress>,
}

#[derive(Debug, Default)]
struct Progress {
    /// The answer to record at the commit point (see [`Call::answer_at_commit`]).
    pending: Option<Vec<u8>>,
    /// The answer the next batch records (see [`Call::commit_point`]).
    armed: Option<Vec<u8>>,
    /// A batch of the request was applied with its mark.
    marked: bool,
    /// A batch recorded the request's answer along with its effects.
    answered: bool,
}

impl Call {
    /// A request made by `cred`, not exactly-once.
    pub(crate) fn new(cred: Cred) -> Call {
        Call { cred, once: None }
    }

    /// A request of this server (or of a peer on its behalf).
    pub(crate) fn server() -> Call {
        Call::new(Cred::server())
    }

    /// Request `seq` of client `client` under the slot's exactly-once table.
    pub(crate) fn once(cred: Cred, client: u64, seq: u64) -> Call {
        let mark = OnceMark { client, seq, progress: Mutex::new(Progress::default()) };
        Call { cred, once: Some(Arc::new(mark)) }
    }

    /// The caller.
    pub(crate) fn cred(&self) -> &Cred {
        &self.cred
    }

    /// The (client, sequence) of the exactly-once request, if it is one.
    pub(crate) fn once_id(&self) -> Option<(u64, u64)> {
        self.once.as_ref().map(|m| (m.client, m.seq))
    }

    /// Whether a batch was applied with the mark, and whether one recorded the answer.
    pub(crate) fn progress(&self) -> (bool, bool) {
        self.once.as_ref().map_or((false, false), |m| {
            let p = m.progress.lock();
            (p.marked, p.answered)
        })
    }

    /// Has the request (if exactly-once) record `answer` at its commit point: the batch
    /// applied after [`Call::commit_point`]. A resend then gets this answer even if the
    /// leader dies right after that batch.
    pub(crate) fn answer_at_commit(&self, answer: &Response) {
        if let Some(m) = &self.once {
            m.progress.lock().pending = postcard::to_allocvec(answer).ok();
        }
    }

    /// The next batch applied for the request is its commit point: it records the
    /// answer given to [`Call::answer_at_commit`], if any.
    pub(crate) fn commit_point(&self) {
        if let Some(m) = &self.once {
            let mut p = m.progress.lock();
            if let Some(answer) = p.pending.take() {
                p.armed = Some(answer);
            }
        }
    }

    /// Forgets an answer armed for the next batch (that batch failed and the request goes
    /// on another way).
    pub(crate) fn disarm(&self) {
        if let Some(m) = &self.once {
            let mut p = m.progress.lock();
            (p.pending, p.armed) = (None, None);
        }
    }

    /// [`Call::answer_at_commit`] and [`Call::commit_point`] at once, for a request whose
    /// next batch is its only one.
    pub(crate) fn answer_with_next_batch(&self, answer: &Response) {
        self.answer_at_commit(answer);
        self.commit_point();
    }

    /// Adds the request's mark to `batch`, a batch of its effects: that it was applied,
    /// and its answer if this batch is its commit point. Once the answer is recorded,
    /// later batches (delivering a decision) leave the record as it is.
    pub(crate) fn mark(&self, batch: &mut Batch) {
        let Some(m) = &self.once else { return };
        let mut p = m.progress.lock();
        if p.answered {
            return;
        }
        let answer = p.armed.take();
        p.answered = answer.is_some();
        p.marked = true;
        batch.ops.push(BatchOp::PutOnce(m.client, m.seq, plusfs_store::once_value(answer.as_deref())));
    }
}

impl Deref for Call {
    type Target = Cred;

    fn deref(&self) -> &Cred {
        &self.cred
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plusfs_proto::Reply;

    /// The exactly-once records `b` writes for request (1, 7): whether each has an answer.
    fn marks(b: &Batch) -> Vec<bool> {
        let answered = |v: &Vec<u8>| match plusfs_store::decode_once(v).expect("a sound record").0 {
            plusfs_store::OnceState::Answered(_) => true,
            plusfs_store::OnceState::Applied => false,
        };
        b.ops
            .iter()
            .filter_map(|op| if let BatchOp::PutOnce(1, 7, v) = op { Some(answered(v)) } else { None })
            .collect()
    }

    #[test]
    fn every_effect_marks_until_the_commit_point_records_the_answer() {
        let call = Call::once(Cred::server(), 1, 7);
        let mut first = Batch::new();
        call.mark(&mut first);
        assert_eq!(marks(&first), [false], "applied, no answer yet");
        call.answer_at_commit(&Ok(Reply::Done));
        let mut second = Batch::new();
        call.mark(&mut second);
        assert_eq!(marks(&second), [false], "the answer waits for the commit point");
        call.commit_point();
        let mut third = Batch::new();
        call.mark(&mut third);
        assert_eq!(marks(&third), [true], "the commit point records the answer");
        let mut after = Batch::new();
        call.mark(&mut after);
        assert!(marks(&after).is_empty(), "later batches leave the record as it is");
        assert_eq!(call.progress(), (true, true));
    }

    #[test]
    fn a_plain_call_marks_nothing_and_a_clone_is_its_credential_only() {
        let mut b = Batch::new();
        Call::new(Cred::server()).mark(&mut b);
        assert!(b.ops.is_empty());
        // What a request hands to another task is its credential: `Call` is not `Clone`,
        // so `clone()` through `Deref` gives the `Cred`, which marks nothing.
        let call = Call::once(Cred::server(), 1, 7);
        let handed: Cred = (*call).clone();
        Call::new(handed).mark(&mut b);
        assert!(b.ops.is_empty());
    }
}
