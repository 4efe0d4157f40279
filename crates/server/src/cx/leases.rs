//! Inode numbers leased to client sessions (`AllocInos`), for the directories their Cx
//! mkdirs make here.
//!
//! A client picks the inode number of a new directory itself (so it can send both sides of
//! a mkdir at once), from a block this server leased to its session. A `CxExec` that
//! makes a directory here must use a number of such a block, each once: a client cannot
//! give a directory the number of another file. Leases live in memory only; after a
//! restart (or when the table is full and an old one is forgotten) a client's number is
//! refused with `ESTALE` and the client leases a new block.

use parking_lot::Mutex;
use plusfs_proto::Ino;
use std::collections::{HashMap, VecDeque};

/// Blocks remembered per session (the oldest goes first).
const PER_SESSION: usize = 4;
/// Sessions remembered; beyond, a session's leases are forgotten (it leases again).
const SESSIONS: usize = 65_536;

/// The blocks leased to each session: `(next unused, end)`.
#[derive(Default)]
pub(crate) struct InoLeases(Mutex<HashMap<u64, VecDeque<(Ino, Ino)>>>);

impl InoLeases {
    /// Session `session` leased numbers `first .. first + count`.
    pub(crate) fn grant(&self, session: u64, first: Ino, count: u64) {
        let mut all = self.0.lock();
        if all.len() >= SESSIONS && !all.contains_key(&session) {
            if let Some(old) = all.keys().next().copied() {
                all.remove(&old);
            }
        }
        let blocks = all.entry(session).or_default();
        if blocks.len() >= PER_SESSION {
            blocks.pop_front();
        }
        blocks.push_back((first, first + count));
    }

    /// Takes `ino` from a block of `session`: true when it lies in one, at or after every
    /// number taken from that block before (numbers are used once, in order; skipped
    /// ones are lost).
    pub(crate) fn take(&self, session: u64, ino: Ino) -> bool {
        let mut all = self.0.lock();
        let Some(blocks) = all.get_mut(&session) else { return false };
        match blocks.iter_mut().find(|(next, end)| (*next..*end).contains(&ino)) {
            Some(block) => {
                block.0 = ino + 1;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_taken_once_and_only_by_its_session() {
        let l = InoLeases::default();
        l.grant(7, 100, 10);
        assert!(!l.take(8, 100), "another session");
        assert!(l.take(7, 100));
        assert!(!l.take(7, 100), "twice");
        assert!(l.take(7, 105), "skipping is allowed");
        assert!(!l.take(7, 103), "but not going back");
        assert!(!l.take(7, 110), "past the block");
    }

    #[test]
    fn old_blocks_are_forgotten() {
        let l = InoLeases::default();
        for i in 0..=PER_SESSION as u64 {
            l.grant(1, i * 100, 10);
        }
        assert!(!l.take(1, 0), "the oldest block went");
        assert!(l.take(1, 100));
    }
}
