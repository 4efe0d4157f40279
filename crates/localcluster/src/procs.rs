//! The server processes of a local cluster, found in the process table: every `plusfs
//! server` whose `--cluster` is this cluster's map, whoever started it (this tool, with a
//! pid file, or an operator by hand). `cluster up` starts only what is missing, and
//! `cluster down` stops all of them.

use std::fs;
use std::path::Path;

/// One server process of the cluster: its slot, its member (replicated slots) and pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerProc {
    /// The slot's id (`--id`).
    pub id: u32,
    /// The member (`--member`), for a replicated slot.
    pub member: Option<u64>,
    /// Its process id.
    pub pid: u32,
}

/// The running `plusfs server` processes whose `--cluster` is `map` (compared after
/// resolving each process's own working directory and symbolic links).
pub fn server_procs(map: &Path) -> Vec<ServerProc> {
    let Ok(want) = map.canonicalize() else { return Vec::new() };
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| parse(pid, &want))
        .collect()
}

/// The server process `pid`, if it is one of the cluster whose map is `want`.
fn parse(pid: u32, want: &Path) -> Option<ServerProc> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&str> = raw.split(|&b| b == 0).filter_map(|a| std::str::from_utf8(a).ok()).collect();
    let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    let (id, member) = server_of(&args, &cwd, want)?;
    // A zombie (exited, not yet reaped) is not running.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()) == Some('Z') {
        return None;
    }
    Some(ServerProc { id, member, pid })
}

/// The slot and member of a `plusfs server` command line `args` run in `cwd`, if its
/// `--cluster` is the map `want` (canonical).
fn server_of(args: &[&str], cwd: &Path, want: &Path) -> Option<(u32, Option<u64>)> {
    if args.get(1) != Some(&"server") {
        return None;
    }
    let value = |flag: &str| args.iter().position(|a| *a == flag).and_then(|i| args.get(i + 1)).copied();
    let cluster = cwd.join(value("--cluster")?);
    if cluster.canonicalize().ok()? != want {
        return None;
    }
    let id = value("--id")?.parse().ok()?;
    let member = match value("--member") {
        Some(m) => Some(m.parse().ok()?),
        None => None,
    };
    Some((id, member))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_of_this_map_is_recognised_also_by_a_relative_path() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("cluster.toml");
        fs::write(&map, "").unwrap();
        let want = map.canonicalize().unwrap();
        let by_hand = ["plusfs", "server", "--cluster", "./cluster.toml", "--id", "4", "--member", "2", "--data", "x"];
        assert_eq!(server_of(&by_hand, dir.path(), &want), Some((4, Some(2))));
        let absolute = ["/usr/bin/plusfs", "server", "--cluster", map.to_str().unwrap(), "--id", "1"];
        assert_eq!(server_of(&absolute, Path::new("/"), &want), Some((1, None)));
        let other = ["plusfs", "server", "--cluster", "/elsewhere/cluster.toml", "--id", "1"];
        assert_eq!(server_of(&other, dir.path(), &want), None, "another cluster's server");
        let not_a_server = ["plusfs", "mount", "--cluster", "./cluster.toml", "--id", "1"];
        assert_eq!(server_of(&not_a_server, dir.path(), &want), None);
    }

    #[test]
    fn no_process_is_a_server_of_a_fresh_map() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("cluster.toml");
        fs::write(&map, "").unwrap();
        assert!(server_procs(&map).is_empty());
    }
}
