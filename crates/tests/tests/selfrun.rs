//! A cluster that runs itself on one machine: `cluster up` on a running cluster starts only
//! what is missing, `cluster down` stops every server process of the map (also one an
//! operator started by hand), and server logs are plain text.

mod common;

use common::{exe, run};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn plusfs(args: &[&str]) -> (i32, String, String) {
    run(Command::new(exe()).args(args))
}

fn pid_of(data: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(data.join(format!("{name}.pid"))).ok()?.trim().parse().ok()
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) == 0 };
    exists && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn up_starts_what_is_missing_and_down_stops_what_the_map_lists() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("c");
    let d = data.to_str().unwrap();
    let (code, out, err) = plusfs(&["cluster", "up", "--data", d, "--servers", "2", "--replicas", "3", "--detach"]);
    assert_eq!(code, 0, "{out}{err}");

    // A member dies (kill -9): `cluster up` again starts it, and only it.
    let victim = pid_of(&data, "server-1-m2").expect("member 2 of server 1 runs");
    // SAFETY: kill(2) with the pid of a process this test's cluster started.
    unsafe { libc::kill(victim as libc::pid_t, libc::SIGKILL) };
    assert!(wait_gone(victim), "the member did not die");
    let (code, out, err) = plusfs(&["cluster", "up", "--data", d, "--detach"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("5 of 6 server processes were already running; started the other 1"), "{out}");
    let again = pid_of(&data, "server-1-m2").expect("restarted");
    assert!(again != victim && alive(again), "member 2 of server 1 runs again");
    let (code, out, _) = plusfs(&["cluster", "up", "--data", d, "--detach"]);
    assert_eq!(code, 0);
    assert!(out.contains("all 6 server processes were already running"), "{out}");

    // The member is stopped and started again by hand, from the cluster's directory with
    // a relative map path and no pid file: `cluster down` stops it all the same.
    let (code, _, err) = plusfs(&["cluster", "down", "--data", d]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = plusfs(&["cluster", "up", "--data", d, "--detach"]);
    assert_eq!(code, 0, "{out}{err}");
    let member = pid_of(&data, "server-1-m2").unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(member as libc::pid_t, libc::SIGTERM) };
    assert!(wait_gone(member));
    std::fs::remove_file(data.join("server-1-m2.pid")).ok();
    let log = std::fs::File::create(dir.path().join("by-hand.log")).unwrap();
    let by_hand = Command::new(exe())
        .args(["server", "--cluster", "./cluster.toml", "--id", "1", "--member", "2", "--data", "server-1-m2"])
        .current_dir(&data)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let by_hand_pid = by_hand.id();
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(by_hand_pid), "the member started by hand runs");
    let (code, out, err) = plusfs(&["cluster", "down", "--data", d]);
    assert_eq!(code, 0, "{out}{err}");
    let mut by_hand = by_hand;
    let _ = by_hand.wait();
    assert!(!alive(by_hand_pid), "cluster down stopped the member started by hand");
    for name in ["server-0-m1", "server-1-m1", "server-1-m3"] {
        if let Some(pid) = pid_of(&data, name) {
            assert!(!alive(pid), "{name} still runs after cluster down");
        }
    }

    // Server logs carry no terminal colour codes.
    let text = std::fs::read_to_string(data.join("server-0-m1.log")).unwrap();
    assert!(text.contains(" INFO "), "the log has lines: {text}");
    assert!(!text.contains('\u{1b}'), "no escape sequences in a server's log");
}
