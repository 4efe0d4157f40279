//! Turns of huge-directory redistribution: one redistribution of a directory at a time
//! on this server.

use parking_lot::Mutex;
use std::collections::HashSet;
use tokio::sync::Notify;

/// The directories being distributed by this server now (whoever asked): one
/// redistribution of a directory at a time.
#[derive(Default)]
pub(crate) struct Turns {
    dirs: Mutex<HashSet<String>>,
    ended: Notify,
}

/// A directory's turn to be distributed; it ends when dropped.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    dir: String,
}

impl Turns {
    /// Waits until no redistribution of `dir` runs, then takes the turn.
    pub(crate) async fn take(&self, dir: &str) -> Turn<'_> {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.dirs.lock().insert(dir.to_string()) {
                return Turn { turns: self, dir: dir.to_string() };
            }
            ended.await;
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.dirs.lock().remove(&self.dir);
        self.turns.ended.notify_waiters();
    }
}
