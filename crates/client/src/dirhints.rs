//! Paths this client has seen to be directories. A directory's attributes live in its own
//! object on its home server, but `lstat` learns that a name is a directory only from the
//! entry's server (`IsDir`), then asks the home: two round trips one after the other. For a
//! path hinted here `lstat` asks both at once and keeps the home's answer when the entry's
//! server says `IsDir`, so a directory costs one round trip. The entry's server stays the
//! authority on what the name is: a stale hint costs one unused request, never a wrong
//! answer.

use std::collections::HashSet;
use std::sync::Mutex;

/// Most paths remembered; the set starts afresh beyond it.
const MAX_HINTS: usize = 8192;

#[derive(Default)]
pub(crate) struct DirHints {
    paths: Mutex<HashSet<String>>,
}

impl DirHints {
    /// `path` names a directory (it was made, or a server said so).
    pub(crate) fn note(&self, path: &str) {
        let mut set = self.paths.lock().expect("dir hints");
        if set.len() >= MAX_HINTS {
            set.clear();
        }
        set.insert(path.to_string());
    }

    /// `path` no longer names a directory, as far as this client knows.
    pub(crate) fn forget(&self, path: &str) {
        self.paths.lock().expect("dir hints").remove(path);
    }

    /// True when `path` was last seen to be a directory.
    pub(crate) fn likely(&self, path: &str) -> bool {
        self.paths.lock().expect("dir hints").contains(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_noted_forgotten_and_bounded() {
        let h = DirHints::default();
        h.note("/a");
        assert!(h.likely("/a") && !h.likely("/b"));
        h.forget("/a");
        assert!(!h.likely("/a"));
        for i in 0..MAX_HINTS + 10 {
            h.note(&format!("/d{i}"));
        }
        assert!(h.paths.lock().unwrap().len() <= MAX_HINTS);
    }
}
