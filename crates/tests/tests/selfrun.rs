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

/// A base port whose next one is free too, on 127.0.0.1 to 127.0.0.3.
fn two_free_ports() -> u16 {
    for _ in 0..100 {
        let base = plusfs_localcluster::free_ports(1).unwrap()[0];
        let free = (1..=3u8).all(|h| {
            (0..2u16).all(|k| std::net::TcpListener::bind((std::net::Ipv4Addr::new(127, 0, 0, h), base + k)).is_ok())
        });
        if free && base < 65000 {
            return base;
        }
    }
    panic!("no two consecutive free ports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_init_writes_what_three_machines_start_a_replicated_cluster_from() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // The three "machines" are three loopback addresses sharing this file system, so the
    // first host's bundle stands for /etc/plusfs on all of them.
    let etc = out.join("hosts").join("127.0.0.1");
    let (port, raft) = (two_free_ports(), two_free_ports());
    let (code, report, err) = plusfs(&[
        "cluster",
        "init",
        "--hosts",
        "127.0.0.1,127.0.0.2,127.0.0.3",
        "--servers",
        "2",
        "--replicas",
        "3",
        "--port",
        &port.to_string(),
        "--raft-port",
        &raft.to_string(),
        "--etc",
        etc.to_str().unwrap(),
        "--data-root",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{report}{err}");
    assert!(report.contains("host 127.0.0.2:"), "{report}");
    // Run what each host's env files say, as systemd would.
    let mut procs = Vec::new();
    for host in ["127.0.0.1", "127.0.0.2", "127.0.0.3"] {
        let bundle = out.join("hosts").join(host);
        assert!(bundle.join("server").join("key.pem").exists(), "{host} has its server identity");
        let mut envs: Vec<_> = std::fs::read_dir(&bundle)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "env"))
            .collect();
        envs.sort();
        assert_eq!(envs.len(), 2, "{host} runs one member of each of the 2 slots");
        for env in envs {
            let text = std::fs::read_to_string(&env).unwrap();
            let args = text.trim().strip_prefix("PLUSFS_ARGS=").expect("PLUSFS_ARGS");
            let name = env.file_stem().unwrap().to_str().unwrap().to_string();
            let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
            let child = Command::new(exe())
                .arg("server")
                .args(args.split_whitespace())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            procs.push(child);
        }
    }
    // The admin machine's map reaches the cluster with the admin identity.
    let map = plusfs_placement::ClusterMap::load(&out.join("admin").join("cluster.toml")).unwrap();
    assert_eq!(map.servers.len(), 2);
    let client = plusfs_client::Client::new(map, plusfs_client::ClientOptions { retries: 5, ..Default::default() });
    let deadline = Instant::now() + Duration::from_secs(30);
    let made = loop {
        match client.mkdir("/from-init", 0o755).await {
            Ok(_) => break Ok(()),
            Err(e) if Instant::now() > deadline => break Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let stat = client.lstat("/from-init").await;
    for mut p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    made.unwrap_or_else(|e| panic!("mkdir on the cluster cluster init set up: {e}"));
    stat.unwrap();
}
