//! What a client knows about where entries are: the distributions of huge directories it
//! has learnt, and what to do when a server says the entries are elsewhere.

use plusfs_proto::{DistInfo, DistributionWait, WireError};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How long a call waits for a directory being distributed before giving up (EAGAIN).
/// A million entries take a few seconds to move.
pub(crate) const MAX_DISTRIBUTING_WAIT: Duration = Duration::from_secs(300);

/// A client's wait for a directory being distributed.
pub(crate) fn distribution_wait() -> DistributionWait {
    DistributionWait::new(MAX_DISTRIBUTING_WAIT)
}

/// Distributions this client has learnt, by directory path.
#[derive(Default)]
pub struct DistCache {
    dirs: Mutex<HashMap<String, DistInfo>>,
}

impl DistCache {
    /// The cached distribution of `dir`.
    pub fn get(&self, dir: &str) -> Option<DistInfo> {
        self.dirs.lock().expect("dist cache").get(dir).cloned()
    }

    pub(crate) fn insert(&self, info: DistInfo) {
        self.dirs.lock().expect("dist cache").insert(info.path.clone(), info);
    }

    pub(crate) fn remove(&self, dir: &str) {
        self.dirs.lock().expect("dist cache").remove(dir);
    }

    /// Number of cached distributions.
    pub fn len(&self) -> usize {
        self.dirs.lock().expect("dist cache").len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What to do after a failed request about entries of a directory.
pub(crate) enum Reroute {
    /// The cache changed (learnt or dropped): send again.
    Retry,
    /// The directory is being distributed: wait, then send again.
    Wait,
    /// A real error for the caller.
    Fail(WireError),
}
