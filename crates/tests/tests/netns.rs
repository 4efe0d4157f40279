//! Clusters on a private network (`cluster up --netns`): servers and client hosts in their
//! own network namespaces, delayed and lossy links, partitions. Needs root; without it these
//! tests fail unless PLUSFS_ALLOW_SKIP=1.

mod common;

use common::{exe, run, skip_allowed, ProcCluster};
use plusfs_client::{Client, ClientOptions};
use plusfs_localcluster::{ClusterSettings, NetSettings};
use plusfs_netns::shape::LinkShape;
use plusfs_netns::NsHandle;
use plusfs_proto::Errno;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

/// The transport timeout of every process of these tests (servers inherit it): a peer that
/// stops answering is given up after 2 s instead of 15.
const TRANSPORT_TIMEOUT_MS: &str = "2000";

fn root_or_skip() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Every test sets the same value, so threads racing here agree.
        std::env::set_var("PLUSFS_TRANSPORT_TIMEOUT_MS", TRANSPORT_TIMEOUT_MS);
        return true;
    }
    assert!(skip_allowed(), "network namespaces need root (set PLUSFS_ALLOW_SKIP=1 to skip)");
    false
}

fn start(servers: usize, shape: LinkShape) -> ProcCluster {
    let netns = Some(NetSettings { clients: 2, shape });
    ProcCluster::start_settings(servers, &ClusterSettings { netns, ..Default::default() })
}

/// Runs `plusfs ARGS` on host `host` of the cluster's network; (exit code, stdout, stderr).
fn on_host(tc: &ProcCluster, host: &str, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(exe());
    cmd.args(["netns", "exec", "--data"]).arg(tc.cluster.data()).arg(host).arg("--").arg(exe()).args(args);
    run(&mut cmd)
}

/// Runs `work` with a client of the cluster on a thread moved into host `host`'s namespace.
fn with_client<T: Send + 'static>(
    tc: &ProcCluster,
    host: &str,
    work: impl FnOnce(Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>> + Send + 'static,
) -> T {
    let ns = NsHandle::open(&tc.cluster.net().expect("a private network").member(host).expect("a host").ns).unwrap();
    let map = tc.cluster.map().clone();
    std::thread::spawn(move || {
        ns.enter().expect("enter the host's namespace");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = Client::new(map, ClientOptions { retries: 1, ..Default::default() });
        rt.block_on(work(client))
    })
    .join()
    .expect("client thread")
}

fn plusfs_cli(args: &[&str]) -> (i32, String, String) {
    run(Command::new(exe()).args(args))
}

/// TCP segments retransmitted so far in host `host`'s namespace.
fn retransmits(tc: &ProcCluster, host: &str) -> u64 {
    let ns = &tc.cluster.net().unwrap().member(host).unwrap().ns;
    let out = Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]).output().expect("ip netns exec");
    let text = String::from_utf8_lossy(&out.stdout);
    let tcp: Vec<Vec<&str>> =
        text.lines().filter(|l| l.starts_with("Tcp:")).map(|l| l.split_whitespace().collect()).collect();
    let at = tcp[0].iter().position(|k| *k == "RetransSegs").expect("RetransSegs");
    tcp[1][at].parse().unwrap()
}

fn root_links() -> usize {
    let out = Command::new("ip").args(["-o", "link"]).output().expect("ip link");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

fn count_processes(pattern: &str) -> usize {
    let out = Command::new("pgrep").args(["-f", pattern]).output().expect("pgrep");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn hosts_have_their_own_addresses_links_are_delayed_and_down_leaves_nothing() {
    if !root_or_skip() {
        return;
    }
    let links_before = root_links();
    let tc = start(3, LinkShape { delay_us: 2000, ..Default::default() });
    let data = tc.cluster.data().to_path_buf();
    let addrs: BTreeSet<String> = tc.cluster.map().servers.iter().map(|s| s.address.clone()).collect();
    assert_eq!(addrs, BTreeSet::from(["10.213.1.1:7000".into(), "10.213.1.2:7000".into(), "10.213.1.3:7000".into()]));
    assert_eq!(plusfs_netns::existing(&data).unwrap().len(), 6, "hub, 3 servers, 2 client hosts");
    assert_eq!(root_links(), links_before, "nothing is linked to the machine's own namespace");

    // The machine's own namespace cannot reach the servers: no route into the network.
    let (code, _, err) = plusfs_cli(&["--cluster", tc.cluster.map_file().to_str().unwrap(), "stat", "/"]);
    assert_ne!(code, 0, "reached a server from outside the network: {err}");

    // 40 unbatched creates each wait a round trip of two 2 ms link crossings; a batch
    // of 1000 needs one round trip per server.
    let (code, out, err) = on_host(&tc, "c0", &["bench", "create", "-n", "40", "-b", "1", "--dir", "/one", "--json"]);
    assert_eq!(code, 0, "{err}");
    let one: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let secs = one["seconds"].as_f64().unwrap();
    assert!(secs >= 40.0 * 0.0036, "40 creates took {secs} s: the 2 ms delay was not applied");
    let (code, out, err) =
        on_host(&tc, "c1", &["bench", "create", "-n", "2000", "-b", "1000", "--dir", "/many", "--json"]);
    assert_eq!(code, 0, "{err}");
    let many: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let ratio = many["ops_per_sec"].as_f64().unwrap() / one["ops_per_sec"].as_f64().unwrap();
    assert!(ratio > 20.0, "batch 1000 over batch 1: only {ratio:.1}x");

    drop(tc);
    assert!(plusfs_netns::existing(&data).unwrap().is_empty(), "namespaces left behind");
    assert_eq!(root_links(), links_before);
    assert_eq!(count_processes(&format!("netns proxy --server .* --data {}", data.display())), 0);
}

#[test]
fn a_delay_on_one_server_s_link_slows_only_its_objects_and_can_be_changed_mid_run() {
    if !root_or_skip() {
        return;
    }
    let tc = start(3, LinkShape::default());
    let map = tc.cluster.map().clone();
    let dirs: Vec<String> = (0..12).map(|i| format!("/t{i}")).collect();
    let slow = map.home_of_dir(&dirs[0]);
    let data = tc.cluster.data().to_str().unwrap().to_string();
    let timed = |tc: &ProcCluster, dirs: Vec<String>| {
        with_client(tc, "c0", move |c| {
            Box::pin(async move {
                let mut out = Vec::new();
                for d in &dirs {
                    let _ = c.mkdir(d, 0o755).await;
                    let t = Instant::now();
                    for _ in 0..5 {
                        c.lstat(&format!("{d}/missing")).await.unwrap_err();
                    }
                    out.push((d.clone(), t.elapsed() / 5));
                }
                out
            })
        })
    };
    let (code, _, err) =
        plusfs_cli(&["netns", "shape", "--data", &data, "--host", &format!("s{slow}"), "--delay", "15ms"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_millis(500)); // the proxy re-reads within 200 ms
    for (d, per_op) in timed(&tc, dirs.clone()) {
        match map.home_of_dir(&d) == slow {
            true => assert!(per_op >= Duration::from_millis(28), "{d} on the delayed server: {per_op:?}"),
            false => assert!(per_op < Duration::from_millis(10), "{d} on another server: {per_op:?}"),
        }
    }
    // A client host's link has no proxy: a delay there is refused.
    let (code, _, err) = plusfs_cli(&["netns", "shape", "--data", &data, "--host", "c0", "--delay", "1ms"]);
    assert_ne!(code, 0);
    assert!(err.contains("client host"), "{err}");
    // Back to no delay for everyone.
    let (code, _, err) = plusfs_cli(&["netns", "shape", "--data", &data, "--delay", "0us"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_millis(500));
    for (d, per_op) in timed(&tc, dirs) {
        assert!(per_op < Duration::from_millis(10), "{d} after the delay was removed: {per_op:?}");
    }
}

#[test]
fn down_removes_the_network_a_crash_left_behind() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("c");
    let (code, _, err) = plusfs_cli(&[
        "cluster",
        "up",
        "--data",
        data.to_str().unwrap(),
        "--servers",
        "2",
        "--netns",
        "--delay",
        "100us",
        "--detach",
    ]);
    assert_eq!(code, 0, "{err}");
    let data = data.canonicalize().unwrap();
    assert_eq!(plusfs_netns::existing(&data).unwrap().len(), 5);
    // A crash: every server and proxy killed, their pid files gone, the state file too.
    for f in std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().path()) {
        if f.extension().is_some_and(|e| e == "pid") {
            let pid: i32 = std::fs::read_to_string(&f).unwrap().trim().parse().unwrap();
            #[allow(unsafe_code)]
            // SAFETY: kill(2) of a process this test started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            std::fs::remove_file(&f).unwrap();
        }
    }
    std::fs::remove_file(data.join("netns.toml")).unwrap();
    let (code, _, err) = plusfs_cli(&["cluster", "down", "--data", data.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(plusfs_netns::existing(&data).unwrap().is_empty(), "namespaces left behind after a crash");
}

#[test]
fn a_client_cut_from_one_server_gets_bounded_eio_for_its_objects_only() {
    if !root_or_skip() {
        return;
    }
    let tc = start(3, LinkShape::default());
    let map = tc.cluster.map().clone();
    let dirs: Vec<String> = (0..12).map(|i| format!("/d{i}")).collect();
    let cut = map.home_of_dir(&dirs[0]);
    let setup = dirs.clone();
    with_client(&tc, "c0", move |c| {
        Box::pin(async move {
            for d in &setup {
                c.mkdir(d, 0o755).await.unwrap();
                c.create(&format!("{d}/f"), 0o644, true).await.unwrap();
            }
        })
    });
    let data = tc.cluster.data().to_str().unwrap().to_string();
    let (code, _, err) = plusfs_cli(&["netns", "partition", "--data", &data, "c0", &format!("s{cut}")]);
    assert_eq!(code, 0, "{err}");

    let probe = dirs.clone();
    let results = with_client(&tc, "c0", move |c| {
        Box::pin(async move {
            let mut out = Vec::new();
            for d in &probe {
                let t = Instant::now();
                let r = c.lstat(&format!("{d}/f")).await.map(drop).map_err(|e| e.errno);
                out.push((d.clone(), r, t.elapsed()));
            }
            out
        })
    });
    for (d, r, took) in &results {
        match map.home_of_dir(d) == cut {
            true => assert_eq!(*r, Err(Errno::EIO), "{d} is on the server cut off"),
            false => assert_eq!(*r, Ok(()), "{d} is on a reachable server"),
        }
        assert!(*took < Duration::from_secs(15), "{d}: {took:?} is not a bounded failure");
    }
    assert!(results.iter().any(|r| r.1.is_err()) && results.iter().any(|r| r.1.is_ok()));

    // Another host still reaches everything; after the heal so does c0.
    let all = dirs.clone();
    with_client(&tc, "c1", move |c| {
        Box::pin(async move {
            for d in &all {
                c.lstat(&format!("{d}/f")).await.unwrap();
            }
        })
    });
    let (code, _, err) = plusfs_cli(&["netns", "heal", "--data", &data]);
    assert_eq!(code, 0, "{err}");
    with_client(&tc, "c0", move |c| {
        Box::pin(async move {
            for d in &dirs {
                c.lstat(&format!("{d}/f")).await.unwrap();
            }
        })
    });
}

#[test]
fn a_server_cut_from_its_peers_mid_cx_loses_no_acknowledged_directory() {
    if root_or_skip() {
        cut_mid_mkdirs(plusfs_placement::TxnProtocol::Cx);
    }
}

#[test]
fn a_server_cut_from_its_peers_mid_2pc_loses_no_acknowledged_directory() {
    if root_or_skip() {
        cut_mid_mkdirs(plusfs_placement::TxnProtocol::TwoPhase);
    }
}

/// Runs `work` (paths to act on, each an operation that may fail) from host c0 while, from
/// 300 ms to 3.3 s into it, s0 is cut from s1 and s2 (not from the client); returns the
/// paths acknowledged and how many operations started while the cut was in force.
fn under_a_cut<F>(tc: &ProcCluster, paths: Vec<String>, op: F) -> (Vec<String>, usize)
where
    F: Fn(Client, String) -> std::pin::Pin<Box<dyn std::future::Future<Output = (Client, bool)> + Send>>
        + Send
        + 'static,
{
    let data = tc.cluster.data().to_str().unwrap().to_string();
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let cut = plusfs_cli(&["netns", "partition", "--data", &data, "s0", "s1,s2"]);
        std::thread::sleep(Duration::from_secs(3));
        let healed = plusfs_cli(&["netns", "heal", "--data", &data]);
        (cut.0, healed.0)
    });
    let (acked, during) = with_client(tc, "c0", move |mut c| {
        Box::pin(async move {
            let (mut acked, mut during) = (Vec::new(), 0);
            let start = Instant::now();
            let window = Duration::from_millis(300)..Duration::from_millis(3300);
            for p in paths {
                during += usize::from(window.contains(&start.elapsed()));
                let (back, ok) = op(c, p.clone()).await;
                c = back;
                if ok {
                    acked.push(p);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (acked, during)
        })
    });
    assert_eq!(cutter.join().unwrap(), (0, 0), "partition and heal");
    assert!(during > 0, "no operation started while the partition was in force");
    (acked, during)
}

/// Checks from host c1 that every path in `acked` exists, then that fsck is clean.
fn all_present_and_fsck_clean(tc: &ProcCluster, acked: Vec<String>) {
    assert!(!acked.is_empty(), "nothing was acknowledged");
    with_client(tc, "c1", move |c| {
        Box::pin(async move {
            for p in &acked {
                c.lstat(p).await.unwrap_or_else(|e| panic!("acknowledged {p} is gone: {e}"));
            }
        })
    });
    let (code, out, err) = on_host(tc, "c1", &["fsck"]);
    assert_eq!(code, 0, "fsck after the partition:\n{out}\n{err}");
}

fn cut_mid_mkdirs(protocol: plusfs_placement::TxnProtocol) {
    let txn = plusfs_placement::TxnSettings { protocol, ..Default::default() };
    let netns = Some(NetSettings { clients: 2, shape: LinkShape::default() });
    let tc = ProcCluster::start_settings(3, &ClusterSettings { netns, txn, ..Default::default() });
    // Directories whose parent's and own homes differ: each mkdir spans two servers.
    let map = tc.cluster.map().clone();
    with_client(&tc, "c0", |c| Box::pin(async move { c.mkdir("/x", 0o755).await.unwrap() }));
    let paths: Vec<String> = (0..400)
        .map(|i| format!("/x/d{i}"))
        .filter(|p| map.home_of_dir(p) != map.home_of_dir("/x"))
        .take(120)
        .collect();
    let (acked, _) = under_a_cut(&tc, paths, |c, p| {
        Box::pin(async move {
            let ok = c.mkdir(&p, 0o755).await.is_ok();
            (c, ok)
        })
    });
    all_present_and_fsck_clean(&tc, acked);
}

#[test]
fn a_huge_directory_spreading_while_its_home_is_cut_off_loses_no_entry() {
    if !root_or_skip() {
        return;
    }
    use plusfs_placement::{HugedirSettings, ThresholdSetting};
    let hugedirs = HugedirSettings { threshold: ThresholdSetting::Entries(30), width: 0 };
    let netns = Some(NetSettings { clients: 2, shape: LinkShape::default() });
    let tc = ProcCluster::start_settings(3, &ClusterSettings { netns, hugedirs, ..Default::default() });
    // A directory whose home is s0, so its spreading to s1 and s2 is what the cut breaks.
    let map = tc.cluster.map().clone();
    let dir = (0..100).map(|i| format!("/h{i}")).find(|p| map.home_of_dir(p) == 0).expect("a directory on s0");
    let d = dir.clone();
    with_client(&tc, "c0", move |c| Box::pin(async move { c.mkdir(&d, 0o755).await.unwrap() }));
    // The 30th entry (about a second in) starts the spreading, while s0 is cut off. From
    // host c1, 2.5 s in (the cut lasts from 0.3 s to 3.3 s), the directory must be caught
    // mid-spreading: its entries half moved, or the answer held until the spreading ends.
    let paths: Vec<String> = (0..200).map(|i| format!("{dir}/f{i}")).collect();
    let probe = {
        let ns = NsHandle::open(&tc.cluster.net().unwrap().member("c1").unwrap().ns).unwrap();
        let (map, d) = (tc.cluster.map().clone(), dir.clone());
        std::thread::spawn(move || {
            ns.enter().unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let c = Client::new(map, ClientOptions { retries: 0, ..Default::default() });
                tokio::time::sleep(Duration::from_millis(2500)).await;
                match tokio::time::timeout(Duration::from_millis(300), c.distribution(&d)).await {
                    Ok(Ok(r)) => format!("{:?}", r.state),
                    Ok(Err(e)) => format!("error {e}"),
                    Err(_) => "held".to_string(),
                }
            })
        })
    };
    let (acked, _) = under_a_cut(&tc, paths, |c, p| {
        Box::pin(async move {
            let ok = c.create(&p, 0o644, true).await.is_ok();
            (c, ok)
        })
    });
    let mid = probe.join().unwrap();
    eprintln!("directory state mid-cut: {mid}");
    assert!(mid == "Distributing" || mid == "held", "the cut did not catch the spreading: {mid}");
    // Once healed, the directory lists exactly what was acknowledged (plus any create
    // whose answer was lost).
    let listed = {
        let d = dir.clone();
        with_client(&tc, "c1", move |c| {
            Box::pin(async move {
                let names: BTreeSet<String> = c.readdir(&d).await.unwrap().into_iter().map(|e| e.name).collect();
                let dist = c.distribution(&d).await.unwrap();
                assert_eq!(dist.state, plusfs_proto::DistState::Distributed, "{d} spread once healed");
                names
            })
        })
    };
    for p in &acked {
        assert!(listed.contains(p.rsplit('/').next().unwrap()), "{p} is not listed");
    }
    all_present_and_fsck_clean(&tc, acked);
}

#[test]
fn five_percent_loss_under_a_mixed_workload_loses_nothing_acknowledged() {
    if !root_or_skip() {
        return;
    }
    let tc = start(3, LinkShape { loss_ppm: 50_000, ..Default::default() });
    let done = with_client(&tc, "c0", move |c| {
        Box::pin(async move {
            let mut files = Vec::new();
            for d in 0..6 {
                let dir = format!("/m{d}");
                c.mkdir(&dir, 0o755).await.unwrap();
                for f in 0..25 {
                    let p = format!("{dir}/f{f}");
                    c.create(&p, 0o644, true).await.unwrap();
                    let body = format!("{p} {}", "x".repeat(f * 97)).into_bytes();
                    c.write(&p, 0, &body).await.unwrap();
                    files.push((p, body));
                }
                c.rename(&format!("{dir}/f0"), &format!("{dir}/renamed")).await.unwrap();
                files.retain(|(p, _)| *p != format!("{dir}/f0"));
                c.unlink(&format!("{dir}/f1")).await.unwrap();
                files.retain(|(p, _)| *p != format!("{dir}/f1"));
            }
            files
        })
    });
    // The loss hit the workload: its hosts retransmitted.
    let lost: u64 = ["c0", "s0", "s1", "s2"].iter().map(|h| retransmits(&tc, h)).sum();
    assert!(lost > 0, "no TCP retransmission: the 5% loss did not apply");
    // Every acknowledged file is there with its bytes, read from another host.
    let (code, _, err) = plusfs_cli(&["netns", "shape", "--data", tc.cluster.data().to_str().unwrap(), "--loss", "0%"]);
    assert_eq!(code, 0, "{err}");
    with_client(&tc, "c1", move |c| {
        Box::pin(async move {
            for (p, body) in &done {
                assert_eq!(&c.read_all(p).await.unwrap(), body, "{p}");
            }
        })
    });
    let (code, out, err) = on_host(&tc, "c1", &["fsck"]);
    assert_eq!(code, 0, "{out}\n{err}");
}

#[test]
fn a_leader_cut_off_from_its_group_stops_serving_and_clients_follow_the_new_one() {
    if !root_or_skip() {
        return;
    }
    let netns = Some(NetSettings { clients: 1, shape: LinkShape::default() });
    let tc = ProcCluster::start_settings(1, &ClusterSettings { netns, replicas: 3, ..Default::default() });
    let serving = |tc: &ProcCluster| tc.cluster.serving_member(0).unwrap();
    let old = serving(&tc).expect("a member serves");
    with_client(&tc, "c0", |c| Box::pin(async move { c.mkdir("/before", 0o755).await.unwrap() }));
    // The serving member is cut off from its group and from the client.
    let cut = format!("s0m{old}");
    let rest: Vec<String> = tc.cluster.net().unwrap().names().into_iter().filter(|n| *n != cut).collect();
    let (code, out, err) = on_host(
        &tc,
        "c0",
        &["netns", "partition", "--data", tc.cluster.data().to_str().unwrap(), &cut, "|", &rest.join(",")],
    );
    assert_eq!(code, 0, "partition: {out}{err}");
    let started = Instant::now();
    let results = with_client(&tc, "c0", |c| {
        Box::pin(async move {
            let mut out = Vec::new();
            for i in 0..10 {
                out.push(c.mkdir(&format!("/after{i}"), 0o755).await.map(|_| ()).map_err(|e| e.to_string()));
            }
            out
        })
    });
    let took = started.elapsed();
    assert!(results.iter().all(Result::is_ok), "operations failed while a new leader took over: {results:?}");
    assert!(took < Duration::from_secs(15), "the client took {took:?} to follow the new leader");
    eprintln!("the client followed the new leader in {took:?}");
    let new = serving(&tc).expect("a new member serves");
    assert_ne!(new, old, "another member leads");
    // The old leader can no longer acknowledge anything: it stopped serving on its own.
    let log = std::fs::read_to_string(tc.cluster.data().join(format!("server-0-m{old}.log"))).unwrap();
    assert!(log.contains("no longer leads"), "the cut-off leader did not step down");
    let (code, out, err) = on_host(&tc, "c0", &["netns", "heal", "--data", tc.cluster.data().to_str().unwrap()]);
    assert_eq!(code, 0, "heal: {out}{err}");
    // After the heal the old leader catches up: the members agree and every directory is there.
    let map = tc.cluster.map_file();
    let (code, out, err) = on_host(&tc, "c0", &["--cluster", map.to_str().unwrap(), "fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas: {out}{err}");
    with_client(&tc, "c0", |c| {
        Box::pin(async move {
            for p in ["/before".to_string()].into_iter().chain((0..10).map(|i| format!("/after{i}"))) {
                c.lstat(&p).await.unwrap_or_else(|e| panic!("{p}: {e}"));
            }
        })
    });
}
