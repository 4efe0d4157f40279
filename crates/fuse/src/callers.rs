//! Who calls: the kernel gives the uid, gid and pid of the process behind each request;
//! its supplementary groups are read from `/proc/PID/status` (as other FUSE file systems
//! do) and kept for a second per process, since a process makes many calls in a row.

use crate::core::Caller;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the groups read for a process are used.
const KEEP: Duration = Duration::from_secs(1);
/// Processes remembered at most (the table is emptied when it grows past this).
const MAX_PROCESSES: usize = 4096;

/// Supplementary groups by process, read recently.
#[derive(Default)]
pub(crate) struct Callers {
    recent: Mutex<HashMap<u32, (Caller, Instant)>>,
}

impl Callers {
    /// The caller of a request from process `pid` running as `uid`:`gid`.
    pub fn get(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        let mut recent = self.recent.lock().expect("callers");
        if let Some((c, at)) = recent.get(&pid) {
            if c.uid == uid && c.gid == gid && at.elapsed() < KEEP {
                return c.clone();
            }
        }
        let caller = Caller { uid, gid, groups: groups_of(pid) };
        if recent.len() >= MAX_PROCESSES {
            recent.clear();
        }
        recent.insert(pid, (caller.clone(), Instant::now()));
        caller
    }
}

/// The supplementary groups of process `pid` (none if it is gone or unreadable).
fn groups_of(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    parse_groups(&status)
}

/// The `Groups:` line of a `/proc/PID/status` text.
fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_from_the_status_file() {
        assert_eq!(parse_groups("Name:\tx\nGroups:\t4 24 27 \nNgid:\t0\n"), [4, 24, 27]);
        assert!(parse_groups("Groups:\t\n").is_empty());
        let me = Callers::default().get(0, 0, std::process::id());
        let expected = parse_groups(&std::fs::read_to_string("/proc/self/status").unwrap());
        assert_eq!(me.groups, expected);
    }
}
