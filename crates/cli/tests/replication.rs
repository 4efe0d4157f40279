//! Replicated server slots (`cluster up --replicas 3`): every server slot is a Raft group of
//! three member processes. Kill -9 of the leader of the busiest group in the middle of a
//! workload loses no acknowledged operation and the workload goes on; a member whose data
//! is lost is rebuilt by the others; members compare equal (`fsck --replicas`).

mod common;

use common::TestCluster;
use plusfs_localcluster::ClusterSettings;
use plusfs_proto::{Errno, FileKind};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn replicated(servers: usize) -> TestCluster {
    TestCluster::start_settings(servers, &ClusterSettings { replicas: 3, ..Default::default() })
}

/// True when the error leaves the outcome unknown (the request may have been applied by
/// a leader that died before answering).
fn unknown(e: Errno) -> bool {
    matches!(e, Errno::EIO | Errno::ECONNRESET | Errno::EPROTO)
}

/// The member serving replicated server `id`, waiting up to 10 s for one.
fn leader(tc: &TestCluster, id: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(m) = tc.cluster.serving_member(id).unwrap() {
            return m;
        }
        assert!(Instant::now() < deadline, "no member of server {id} serves");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The term of replicated server `id`'s group as its serving member sees it.
fn term(tc: &TestCluster, id: u32) -> u64 {
    let views = tc.cluster.group_views(id).unwrap();
    views.into_iter().filter_map(|(_, g)| g).filter(|g| g.serving).map(|g| g.term).max().unwrap_or(0)
}

fn content(i: usize) -> Vec<u8> {
    format!("file {i} ").repeat(1 + i % 50).into_bytes()
}

/// Creates the file `path` with `data`.
async fn write_new(c: &plusfs_client::Client, path: &str, data: &[u8]) -> Result<(), Errno> {
    c.create(path, 0o644, true).await.map_err(|e| e.errno)?;
    c.write(path, 0, data).await.map(|_| ()).map_err(|e| e.errno)
}

#[derive(Default, Debug, Clone)]
struct Acks {
    mkdir: Option<Result<(), Errno>>,
    file: Option<Result<(), Errno>>,
    rename: Option<Result<(), Errno>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_leaders_mid_workload_loses_nothing_acknowledged() {
    let mut tc = replicated(2);
    let c = tc.client();
    // `/` and everything directly below it live on its home: the busiest group.
    let busiest = tc.cluster.map().home_of_dir("/");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let workload = tokio::spawn(async move {
        let mut acks: HashMap<usize, Acks> = HashMap::new();
        let mut spans: Vec<(Instant, Instant, bool)> = Vec::new();
        let mut i = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) && i < 5000 {
            let a = acks.entry(i).or_default();
            let t = Instant::now();
            a.mkdir = Some(c.mkdir(&format!("/d{i}"), 0o755).await.map(|_| ()).map_err(|e| e.errno));
            spans.push((t, Instant::now(), matches!(a.mkdir, Some(Ok(())))));
            let t = Instant::now();
            let path = format!("/d{i}/f");
            a.file = Some(write_new(&c, &path, &content(i)).await);
            spans.push((t, Instant::now(), matches!(a.file, Some(Ok(())))));
            let t = Instant::now();
            a.rename = Some(c.rename(&format!("/d{i}"), &format!("/r{i}")).await.map_err(|e| e.errno));
            spans.push((t, Instant::now(), matches!(a.rename, Some(Ok(())))));
            i += 1;
        }
        (acks, spans)
    });
    let mut kills = Vec::new();
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let victim = leader(&tc, busiest);
        let before = term(&tc, busiest);
        let killed = Instant::now();
        tc.cluster.kill_member(busiest, victim).unwrap();
        let next = leader(&tc, busiest);
        assert_ne!(next, victim, "round {round}: a new member leads");
        assert!(term(&tc, busiest) > before, "round {round}: the new leader is in a later term");
        let took_over = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        tc.cluster.start_member(busiest, victim).unwrap();
        kills.push((killed, took_over));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acks, spans) = workload.await.unwrap();
    assert!(acks.len() > 20, "the workload made too little progress: {}", acks.len());
    for &(killed, took_over) in &kills {
        // The kill hit the workload: an operation was in flight across it.
        let met = spans.iter().any(|&(start, end, _)| start <= took_over && end > killed);
        assert!(met, "no operation met the kill: the test did not test a failover");
        eprintln!("failover: {:?} from kill to a serving new leader", took_over - killed);
    }
    // Operations went on after the last failover.
    let after = spans.iter().filter(|&&(start, _, ok)| ok && start > kills[1].1).count();
    assert!(after > 5, "only {after} operations succeeded after the last failover");
    let failed =
        acks.values().filter(|a| [&a.mkdir, &a.file, &a.rename].iter().any(|r| matches!(r, Some(Err(_))))).count();
    eprintln!("{} iterations, {failed} with a failed step", acks.len());

    tc.assert_fsck_clean();
    let c = tc.client();
    let kind = |p: String| {
        let c = c.clone();
        async move {
            match c.lstat(&p).await {
                Ok(a) => Some(a.kind),
                Err(e) if e.errno == Errno::ENOENT => None,
                Err(e) => panic!("stat {p}: {e}"),
            }
        }
    };
    let mut files_checked = 0;
    for (i, a) in &acks {
        let (d, r) = (kind(format!("/d{i}")).await, kind(format!("/r{i}")).await);
        let home = match (&a.mkdir, &a.rename) {
            (_, Some(Ok(()))) => {
                assert_eq!((d, r), (None, Some(FileKind::Dir)), "/d{i} acknowledged renamed to /r{i}");
                Some("r")
            }
            (Some(Ok(())), Some(Err(e))) if !unknown(*e) => {
                assert_eq!((d, r), (Some(FileKind::Dir), None), "/d{i}: rename refused with {e:?}");
                Some("d")
            }
            (Some(Ok(())), _) => {
                assert!(d.is_some() != r.is_some(), "/d{i} acknowledged: exactly one of d/r must exist");
                Some(if d.is_some() { "d" } else { "r" })
            }
            _ => None,
        };
        if let (Some(h), Some(Ok(()))) = (home, &a.file) {
            let got = c.read_all(&format!("/{h}{i}/f")).await.unwrap_or_else(|e| panic!("/{h}{i}/f: {e}"));
            assert_eq!(got, content(*i), "/{h}{i}/f holds what was acknowledged");
            files_checked += 1;
        }
    }
    assert!(files_checked > 10, "too few acknowledged files checked: {files_checked}");
    // The restarted members caught up: every group's members hold the same store and data.
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
    tc.assert_no_errors_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_data_is_lost_is_rebuilt_by_the_others() {
    // Snapshots every 100 entries, so the lost member's catch-up needs one.
    let replication = plusfs_placement::ReplicationSettings { snapshot_every: 100, ..Default::default() };
    let mut tc = TestCluster::start_settings(1, &ClusterSettings { replicas: 3, replication, ..Default::default() });
    let c = tc.client();
    for i in 0..40 {
        c.mkdir(&format!("/m{i}"), 0o755).await.unwrap();
        write_new(&c, &format!("/m{i}/f"), &content(i)).await.unwrap();
    }
    let lead = leader(&tc, 0);
    let victim = (0..3u64).find(|&m| m != lead).unwrap();
    tc.cluster.kill_member(0, victim).unwrap();
    let dir = tc.cluster.data().join(format!("server-0-m{victim}"));
    std::fs::remove_dir_all(&dir).unwrap();
    // Writes go on with two members, past a snapshot and the log it lets go.
    for i in 40..160 {
        c.mkdir(&format!("/m{i}"), 0o755).await.unwrap();
        write_new(&c, &format!("/m{i}/f"), &content(i)).await.unwrap();
    }
    tc.cluster.start_member(0, victim).unwrap();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
    assert!(out.contains("3 members agree"), "{out}");
    let log = std::fs::read_to_string(tc.cluster.data().join(format!("server-0-m{victim}.log"))).unwrap();
    assert!(log.contains("snapshot installed"), "the rebuilt member caught up without a snapshot:\n{log}");
    // The rebuilt member can lead: the others are stopped in turn until it does.
    for other in (0..3u64).filter(|&m| m != victim) {
        if leader(&tc, 0) == victim {
            break;
        }
        tc.cluster.kill_member(0, other).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while leader(&tc, 0) == other && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        tc.cluster.start_member(0, other).unwrap();
    }
    for i in 0..160 {
        assert_eq!(c.read_all(&format!("/m{i}/f")).await.unwrap(), content(i), "/m{i}/f");
    }
    tc.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_member_store_shows_as_divergence() {
    let mut tc = replicated(1);
    let c = tc.client();
    c.mkdir("/x", 0o755).await.unwrap();
    let (code, out, _) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "{out}");
    // A follower's copy changed behind the group's back.
    let lead = leader(&tc, 0);
    let victim = (0..3u64).find(|&m| m != lead).unwrap();
    tc.cluster.kill_member(0, victim).unwrap();
    let store = tc.cluster.data().join(format!("server-0-m{victim}/store"));
    let db = rocksdb::DB::open_default(&store).unwrap();
    db.put(b"Mstray", b"1").unwrap();
    drop(db);
    tc.cluster.start_member(0, victim).unwrap();
    let (code, out, _) = tc.cli(&["fsck", "--replicas"]);
    assert_ne!(code, 0, "divergence must fail fsck --replicas:\n{out}");
    assert!(out.contains("DIVERGED"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_files_larger_than_a_log_entry_survives_a_failover() {
    let mut tc = replicated(1);
    let c = tc.client();
    c.mkdir("/bfo", 0o755).await.unwrap();
    // 48 files of 64 KiB in one batch: 3 MiB of file data, more than one log entry holds.
    let files: Vec<plusfs_client::NewFile> =
        (0..48).map(|i| plusfs_client::NewFile::new(format!("/bfo/f{i}"), common::bytes(i, 64 << 10))).collect();
    for r in c.batch_write(files).await {
        r.unwrap();
    }
    let victim = leader(&tc, 0);
    tc.cluster.kill_member(0, victim).unwrap();
    assert_ne!(leader(&tc, 0), victim);
    for i in 0..48u64 {
        let got = c.read_all(&format!("/bfo/f{i}")).await.unwrap();
        assert_eq!(common::digest(&got), common::digest(&common::bytes(i, 64 << 10)), "/bfo/f{i}");
    }
    tc.cluster.start_member(0, victim).unwrap();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
}
