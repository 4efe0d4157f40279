//! Parents' permissions pushed by Cx coordinators (`CxPerms`) to the server of a new
//! subdirectory's object, kept until that operation's participant half takes them (see
//! `dirperms`).

use parking_lot::Mutex;
use plusfs_proto::{OpId, ParentPerms, WireError};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a Cx participant waits for the permissions its coordinator pushes before
/// asking the parent's home itself (the push is lost only if the coordinator fails or
/// never received its half). Short: the coordinator may decide the operation once it has
/// executed its half, and a participant that has not executed by then votes NO.
pub(crate) const PUSH_WAIT: Duration = Duration::from_millis(10);
/// How long an unclaimed pushed answer is kept (its operation's request never came, or
/// came after the participant asked for itself).
const PUSH_KEEP: Duration = Duration::from_secs(30);

/// A pushed answer and when it arrived.
type Pushed = (Instant, Result<ParentPerms, WireError>);

/// Most unclaimed answers kept: beyond, a push is dropped (its participant asks instead).
const MAX_KEPT: usize = 65_536;

/// Parents' permissions pushed here by Cx coordinators, by operation and parent path,
/// until the operation's participant half takes them.
#[derive(Default)]
pub(crate) struct PermsInbox {
    slots: Mutex<Slots>,
    arrived: Notify,
}

#[derive(Default)]
struct Slots {
    map: HashMap<(OpId, String), Pushed>,
    /// When unclaimed answers were last forgotten (at most once a second).
    swept: Option<Instant>,
}

impl PermsInbox {
    /// Files a pushed answer (and, once a second, forgets answers nobody claimed in time).
    pub(crate) fn put(&self, op: OpId, path: String, answer: Result<ParentPerms, WireError>) {
        let now = Instant::now();
        let mut slots = self.slots.lock();
        if slots.swept.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            slots.map.retain(|_, (at, _)| now.duration_since(*at) < PUSH_KEEP);
            slots.swept = Some(now);
        }
        if slots.map.len() < MAX_KEPT {
            slots.map.insert((op, path), (now, answer));
        }
        drop(slots);
        self.arrived.notify_waiters();
    }

    /// Takes the answer pushed for `op` about `path`, waiting for it up to `wait`.
    pub(crate) async fn take(&self, op: OpId, path: &str, wait: Duration) -> Option<Result<ParentPerms, WireError>> {
        let deadline = tokio::time::Instant::now() + wait;
        let key = (op, path.to_string());
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some((_, answer)) = self.slots.lock().map.remove(&key) {
                return Some(answer);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}
