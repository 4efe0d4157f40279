//! Cross-server namespace check (`plusfs fsck`, and the test clusters after every fault
//! schedule): scans every server and lists each broken invariant as a sentence.
//!
//! - every directory object sits on its home server (Eq. 1) and on no other (while a
//!   migration runs, on its home or on its home of the epoch objects move from);
//! - every subdirectory entry has its directory object, with the same inode number;
//! - every directory object but `/` has a subdirectory entry in its parent;
//! - no entry belongs to a directory object that is not on the same server;
//! - a distributed directory has a shard, with its inode and incarnation, on every server
//!   of its storing set and nowhere else, and every entry of a shard is on the server Eq. 2
//!   gives it;
//! - every shared inode (hard-linked file) has exactly as many link entries as its link
//!   count, and every link entry's shared inode exists on the home it names.

use crate::{Client, FsError};
use plusfs_proto::path;
use plusfs_proto::{FsckData, Ino, ServerId};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Scans every server; while transactions are in flight, waits (up to `wait`) for them.
/// The scans' `pending_tx` tell whether they settled.
pub async fn scan_settled(client: &Client, wait: Duration) -> Result<Vec<(ServerId, FsckData)>, FsError> {
    let deadline = Instant::now() + wait;
    loop {
        let mut scans = Vec::new();
        for s in &client.map().servers {
            scans.push((s.id, client.fsck_scan(s.id).await?));
        }
        let pending: u64 = scans.iter().map(|(_, d)| d.pending_tx).sum();
        if pending == 0 || Instant::now() > deadline {
            return Ok(scans);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every broken invariant, as a sentence.
pub fn check(client: &Client, scans: &[(ServerId, FsckData)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut by_path: HashMap<&str, (ServerId, Ino)> = HashMap::new();
    let mut path_of: HashMap<Ino, &str> = HashMap::new();
    for (server, data) in scans {
        let map = client.map();
        for (p, ino) in &data.dirs {
            let home = client.home(p);
            // While a migration runs, an object not yet handed over is at its old home.
            if home != *server && map.previous_home_of_dir(p) != Some(*server) {
                problems.push(format!("directory object '{p}' is on server {server}, its home is server {home}"));
            }
            if let Some((other, _)) = by_path.insert(p, (*server, *ino)) {
                problems.push(format!("directory object '{p}' exists on servers {other} and {server}"));
            }
            path_of.insert(*ino, p);
        }
        for problem in &data.acl_problems {
            problems.push(format!("server {server}: {problem}"));
        }
        for (parent, name) in &data.orphans {
            problems.push(format!(
                "entry '{name}' on server {server} belongs to directory inode {parent}, which is not there"
            ));
        }
    }
    let mut linked: HashSet<String> = HashSet::new();
    for (server, data) in scans {
        for (parent, name, child) in &data.subdirs {
            let Some(parent_path) = path_of.get(parent) else { continue };
            let child_path = path::join(parent_path, name);
            match by_path.get(child_path.as_str()) {
                None => problems
                    .push(format!("subdirectory entry '{child_path}' (server {server}) has no directory object")),
                Some((_, ino)) if ino != child => problems
                    .push(format!("subdirectory entry '{child_path}' names inode {child}, its object is inode {ino}")),
                Some(_) => {}
            }
            linked.insert(child_path);
        }
    }
    for (p, (server, _)) in &by_path {
        if *p != "/" && !linked.contains(*p) {
            problems.push(format!("directory object '{p}' (server {server}) has no entry in its parent"));
        }
    }
    if !by_path.contains_key("/") {
        problems.push("the root directory object is missing".into());
    }
    check_shards(scans, &mut problems);
    check_links(scans, &mut problems);
    check_pieces(scans, &mut problems);
    problems.sort();
    problems
}

/// Huge-directory invariants: shards exactly on the storing set, entries where Eq. 2 puts
/// them.
fn check_shards(scans: &[(ServerId, FsckData)], problems: &mut Vec<String>) {
    let mut shards: HashMap<&str, Vec<(ServerId, Ino, u64)>> = HashMap::new();
    for (server, data) in scans {
        for (p, ino, inc) in &data.shards {
            shards.entry(p).or_default().push((*server, *ino, *inc));
        }
        for (p, name) in &data.misplaced {
            problems.push(format!(
                "entry '{}' of distributed '{p}' is on server {server}, not where Eq. 2 puts it",
                path::join(p, name)
            ));
        }
    }
    for (_, data) in scans {
        for (p, ino, inc, set) in &data.distributed {
            let found = shards.remove(p.as_str()).unwrap_or_default();
            for s in &plusfs_proto::hugedir::distinct(set) {
                match found.iter().find(|f| f.0 == *s) {
                    None => problems.push(format!("distributed '{p}' has no shard on storing server {s}")),
                    Some(f) if (f.1, f.2) != (*ino, *inc) => problems.push(format!(
                        "shard of '{p}' on server {s} is inode {} incarnation {}, the directory is inode {ino} incarnation {inc}",
                        f.1, f.2
                    )),
                    Some(_) => {}
                }
            }
            for f in found.iter().filter(|f| !set.contains(&f.0)) {
                problems.push(format!("server {} holds a shard of '{p}' but is not in its storing set {set:?}", f.0));
            }
        }
    }
    for (p, found) in shards {
        for f in found {
            problems.push(format!("server {} holds a shard of '{p}', which is not a distributed directory", f.0));
        }
    }
}

/// Hard-link invariants: link counts equal link entries, no dangling link entries.
fn check_links(scans: &[(ServerId, FsckData)], problems: &mut Vec<String>) {
    let mut entries: HashMap<(Ino, ServerId), u64> = HashMap::new();
    for (_, data) in scans {
        for link in &data.links {
            *entries.entry(*link).or_default() += 1;
        }
    }
    for (server, data) in scans {
        for (ino, nlink) in &data.shared {
            let found = entries.remove(&(*ino, *server)).unwrap_or(0);
            if found != u64::from(*nlink) {
                problems.push(format!(
                    "shared inode {ino} on server {server} has link count {nlink} but {found} link entries"
                ));
            }
        }
    }
    for ((ino, home), n) in entries {
        problems.push(format!("{n} link entries name inode {ino} on server {home}, which does not hold it"));
    }
}

/// File data: every record a file names exists on the server it names.
fn check_pieces(scans: &[(ServerId, FsckData)], problems: &mut Vec<String>) {
    let held: HashSet<(ServerId, u64)> =
        scans.iter().flat_map(|(server, d)| d.records.iter().map(move |(id, _)| (*server, *id))).collect();
    for (server, data) in scans {
        let missing: HashSet<&(ServerId, u64)> = data.pieces.iter().filter(|q| !held.contains(q)).collect();
        for (at, record) in missing {
            problems.push(format!(
                "a file whose inode is on server {server} names record {record} of server {at}, which it does not hold"
            ));
        }
    }
}

/// The records no file names, per server: (server, [(record, bytes)]).
pub fn unused_record_ids(scans: &[(ServerId, FsckData)]) -> Vec<(ServerId, Vec<(u64, u64)>)> {
    let used: HashSet<(ServerId, u64)> = scans.iter().flat_map(|(_, d)| d.pieces.iter().copied()).collect();
    scans
        .iter()
        .map(|(server, data)| {
            let unused = data.records.iter().filter(|(id, _)| !used.contains(&(*server, *id))).copied().collect();
            (*server, unused)
        })
        .filter(|(_, u): &(ServerId, Vec<(u64, u64)>)| !u.is_empty())
        .collect()
}

/// Of the records unused in scan `first`, those still unused in scan `second`, taken at
/// least as long after as a write's commit may follow the storing of its bytes: no commit
/// can name them any more. Per server: (server, [(record, bytes)]).
pub fn reclaimable(
    first: &[(ServerId, FsckData)],
    second: &[(ServerId, FsckData)],
) -> Vec<(ServerId, Vec<(u64, u64)>)> {
    let before: HashSet<(ServerId, u64)> =
        unused_record_ids(first).into_iter().flat_map(|(s, ids)| ids.into_iter().map(move |(id, _)| (s, id))).collect();
    unused_record_ids(second)
        .into_iter()
        .map(|(s, ids)| (s, ids.into_iter().filter(|(id, _)| before.contains(&(s, *id))).collect::<Vec<_>>()))
        .filter(|(_, ids)| !ids.is_empty())
        .collect()
}

/// Records no file names, per server: (server, records, bytes). A write that a crash cut
/// between storing its bytes and committing them leaves such records; they are unused
/// space, not damage.
pub fn unused_records(scans: &[(ServerId, FsckData)]) -> Vec<(ServerId, u64, u64)> {
    let used: HashSet<(ServerId, u64)> = scans.iter().flat_map(|(_, d)| d.pieces.iter().copied()).collect();
    let mut out = Vec::new();
    for (server, data) in scans {
        let unused: Vec<u64> =
            data.records.iter().filter(|(id, _)| !used.contains(&(*server, *id))).map(|(_, n)| *n).collect();
        if !unused.is_empty() {
            out.push((*server, unused.len() as u64, unused.iter().sum()));
        }
    }
    out
}
