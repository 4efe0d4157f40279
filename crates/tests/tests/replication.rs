//! Replicated server slots (`cluster up --replicas 3`): every server slot is a Raft group of
//! three member processes. Kill -9 of the leader of the busiest group in the middle of a
//! workload loses no acknowledged operation and the workload goes on; a member whose data
//! is lost is rebuilt by the others; members compare equal (`fsck --replicas`).

mod common;
mod mounts;

use common::{leader, ProcCluster};
use plusfs_localcluster::ClusterSettings;
use plusfs_proto::Errno;
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn replicated(servers: usize) -> ProcCluster {
    ProcCluster::start_settings(servers, &ClusterSettings { replicas: 3, ..Default::default() })
}

fn replicated_with(servers: usize, settings: ClusterSettings) -> ProcCluster {
    ProcCluster::start_settings(servers, &ClusterSettings { replicas: 3, ..settings })
}

/// The term of replicated server `id`'s group as its serving member sees it.
fn term(tc: &ProcCluster, id: u32) -> u64 {
    let views = tc.cluster.group_views(id).unwrap();
    views.into_iter().filter_map(|(_, g)| g).filter(|g| g.serving).map(|g| g.term).max().unwrap_or(0)
}

fn content(i: usize) -> Vec<u8> {
    format!("file {i} ").repeat(1 + i % 50).into_bytes()
}

/// Creates the file `path` with `data`.
async fn write_new(c: &plusfs_client::Client, path: &str, data: &[u8]) -> Result<(), Errno> {
    let shown = |e: plusfs_client::FsError| {
        eprintln!("{e}");
        e.errno
    };
    c.create(path, 0o644, true).await.map_err(shown)?;
    c.write(path, 0, data).await.map(|_| ()).map_err(shown)
}

#[derive(Default, Debug, Clone)]
struct Acks {
    mkdir: Option<Result<(), Errno>>,
    file: Option<Result<(), Errno>>,
    rename: Option<Result<(), Errno>>,
}

/// mkdirs (cross-server: under Cx or 2PC), creates with contents and renames, while the
/// serving member of the busiest group is killed twice.
async fn kill_leaders_mid_workload(protocol: plusfs_placement::TxnProtocol) {
    let txn = plusfs_placement::TxnSettings { protocol, ..Default::default() };
    let mut tc = replicated_with(2, ClusterSettings { txn, ..Default::default() });
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
    // Long enough after the last failover for the workload to show progress also on a
    // loaded machine (CI saw 19 iterations in all with 700 ms here).
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
    eprintln!("{protocol:?}: {after} operations after the last failover");
    assert!(after > 5, "only {after} operations succeeded after the last failover");
    let failed =
        acks.values().filter(|a| [&a.mkdir, &a.file, &a.rename].iter().any(|r| matches!(r, Some(Err(_))))).count();
    eprintln!("{} iterations, {failed} with a failed step", acks.len());
    // Creates (exactly-once across failover) and writes (idempotent) in a directory that
    // exists never fail: a request in flight at the kill is resent to the next leader and
    // gets its first answer. (A 2PC mkdir whose answer died with its leader reports EIO,
    // outcome unknown; then its directory may be missing.)
    let file_failures: Vec<_> =
        acks.iter().filter(|(_, a)| matches!(a.mkdir, Some(Ok(()))) && matches!(a.file, Some(Err(_)))).collect();
    assert!(file_failures.is_empty(), "creates or writes failed across a failover: {file_failures:?}");

    tc.assert_fsck_clean();
    let c = tc.client();
    let mut files_checked = 0;
    for (i, a) in &acks {
        let home = common::renamed_dir_home(&c, *i, matches!(a.mkdir, Some(Ok(()))), a.rename).await;
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
async fn killing_leaders_mid_cx_workload_loses_nothing_acknowledged() {
    kill_leaders_mid_workload(plusfs_placement::TxnProtocol::Cx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_leaders_mid_2pc_workload_loses_nothing_acknowledged() {
    kill_leaders_mid_workload(plusfs_placement::TxnProtocol::TwoPhase).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_during_batch_creates_and_a_redistribution_loses_nothing() {
    use plusfs_proto::{BatchOp, Semantics, Threshold};
    let threshold = plusfs_placement::ThresholdSetting::Entries(300);
    let hugedirs = plusfs_placement::HugedirSettings { threshold, width: 0 };
    let mut tc = replicated_with(2, ClusterSettings { hugedirs, ..Default::default() });
    let c = tc.client();
    c.mkdir_with("/h", 0o755, Threshold::Cluster, 0).await.unwrap();
    let home = tc.cluster.map().home_of_dir("/h");
    let c2 = c.clone();
    let workload = tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut spans = Vec::new();
        for k in 0..60 {
            let names: Vec<String> = (0..25).map(|j| format!("f{k}-{j}")).collect();
            let t = Instant::now();
            let r = c2.batch(BatchOp::Create { exclusive: true }, "/h", &names, 0o644, Semantics::PerformAll).await;
            spans.push((t, Instant::now()));
            if let Ok(outcomes) = r {
                for (n, o) in names.iter().zip(outcomes) {
                    if o.into_result().is_ok() {
                        acked.push(n.clone());
                    }
                }
            }
        }
        (acked, spans)
    });
    // The directory crosses its threshold after 12 batches; the kill comes around then.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = leader(&tc, home);
    let killed = Instant::now();
    tc.cluster.kill_member(home, victim).unwrap();
    let next = leader(&tc, home);
    assert_ne!(next, victim);
    let took_over = Instant::now();
    let (acked, spans) = workload.await.unwrap();
    assert!(spans.iter().any(|&(s, e)| s <= took_over && e > killed), "no batch met the kill");
    assert!(acked.len() > 1000, "only {} creates acknowledged", acked.len());
    let st = c.statv("/h", &acked, Semantics::PerformAll).await.unwrap();
    let missing: Vec<(&String, &Result<plusfs_proto::Attr, Errno>)> =
        acked.iter().zip(&st).filter(|(_, o)| o.is_err()).collect();
    assert!(missing.is_empty(), "acknowledged creates missing: {missing:?}");
    let dist = c.distribution("/h").await.unwrap();
    assert_eq!(dist.state, plusfs_proto::DistState::Distributed, "the redistribution finished");
    tc.cluster.start_member(home, victim).unwrap();
    tc.assert_fsck_clean();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_data_is_lost_is_replaced_by_a_new_one() {
    // Snapshots every 100 entries, so the new member's catch-up needs one.
    let replication = plusfs_placement::ReplicationSettings { snapshot_every: 100, ..Default::default() };
    let mut tc = replicated_with(1, ClusterSettings { replication, ..Default::default() });
    let c = tc.client();
    for i in 0..40 {
        c.mkdir(&format!("/m{i}"), 0o755).await.unwrap();
        write_new(&c, &format!("/m{i}/f"), &content(i)).await.unwrap();
    }
    let lead = leader(&tc, 0);
    let lost = (0..3u64).find(|&m| m != lead).unwrap();
    tc.cluster.kill_member(0, lost).unwrap();
    std::fs::remove_dir_all(tc.cluster.data().join(format!("server-0-m{lost}"))).unwrap();
    // Writes go on with two members, past a snapshot and the log it lets go.
    for i in 40..160 {
        c.mkdir(&format!("/m{i}"), 0o755).await.unwrap();
        write_new(&c, &format!("/m{i}/f"), &content(i)).await.unwrap();
    }
    let data = tc.cluster.data().to_str().unwrap().to_string();
    let (code, out, err) =
        tc.cli(&["cluster", "replace", "--group", "0", "--member", &lost.to_string(), "--data", &data]);
    assert_eq!(code, 0, "cluster replace:\n{out}\n{err}");
    // The new member's process was started by the command, not by this test: it is
    // stopped when the test ends, also if it fails.
    let _new_member = KillOnDrop(std::fs::read_to_string(tc.cluster.data().join("server-0-m3.pid")).unwrap());
    tc.cluster.reload_map().unwrap();
    let members: Vec<u64> = tc.cluster.map().server(0).unwrap().members.iter().map(|m| m.id).collect();
    // Asking for the same replacement again changes nothing.
    let node = tc.cluster.map().server(0).unwrap().member(3).cloned().unwrap();
    let again = plusfs_proto::Request::GroupReplace { remove: lost, add: 3, raft: node.raft, client: node.address };
    assert_eq!(c.call_server(0, &again).await.unwrap(), plusfs_proto::Reply::Done);
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(!members.contains(&lost) && members.contains(&3), "member 3 replaced member {lost}: {members:?}");
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
    assert!(out.contains("3 members agree"), "{out}");
    // The new member can lead: whoever else leads is killed (and restarted) until it does.
    for _ in 0..12 {
        let now = leader(&tc, 0);
        if now == 3 {
            break;
        }
        tc.cluster.kill_member(0, now).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tc.cluster.serving_member(0).unwrap().is_none_or(|m| m == now) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        tc.cluster.start_member(0, now).unwrap();
    }
    assert_eq!(leader(&tc, 0), 3);
    // A client that knows only the old map finds the new leader by redirects.
    for i in 0..160 {
        assert_eq!(c.read_all(&format!("/m{i}/f")).await.unwrap(), content(i), "/m{i}/f");
    }
    tc.assert_fsck_clean();
    // Its log is written by a background thread: read once it has had time.
    let log = std::fs::read_to_string(tc.cluster.data().join("server-0-m3.log")).unwrap();
    assert!(log.contains("snapshot installed"), "the new member caught up without a snapshot:\n{log}");
}

/// File data in the slot when the lagging member comes back, and the data segment memory
/// limit it runs under (RLIMIT_DATA: its heap and every writable private mapping).
const SNAPSHOT_DATA_MIB: usize = 320;
const MEMBER_LIMIT_MIB: u64 = 256;

/// Process `pid`'s memory limit on its data segment, set now (it applies to what the
/// process maps from now on: what a catch-up needs).
fn limit_data(pid: u32, mib: u64) {
    let lim = libc::rlimit { rlim_cur: mib << 20, rlim_max: mib << 20 };
    #[allow(unsafe_code)]
    // SAFETY: prlimit(2) on a process this test started; `lim` outlives the call.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_DATA, &lim, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_catches_up_from_a_snapshot_larger_than_its_memory_limit() {
    // Few snapshots (each holds all the file data): one in the middle of the writes, one
    // after.
    let replication = plusfs_placement::ReplicationSettings { snapshot_every: 300, ..Default::default() };
    let mut tc = replicated_with(1, ClusterSettings { replication, ..Default::default() });
    let c = tc.client();
    c.mkdir("/big", 0o755).await.unwrap();
    let lead = leader(&tc, 0);
    let lagging = (0..3u64).find(|&m| m != lead).unwrap();
    tc.cluster.kill_member(0, lagging).unwrap();
    // Distinct contents (a snapshot of repeated bytes would not show a copy held whole).
    let chunk = 4 << 20;
    let file = |i: usize| -> Vec<u8> { (0..chunk).map(|j| ((j * 31 + i * 7) % 251) as u8).collect() };
    let files = SNAPSHOT_DATA_MIB / 4;
    for i in 0..files {
        write_new(&c, &format!("/big/f{i}"), &file(i)).await.unwrap();
    }
    // Past a snapshot of everything and the log it lets go.
    for i in 0..150 {
        c.mkdir(&format!("/big/d{i}"), 0o755).await.unwrap();
    }
    let term_before = term(&tc, 0);
    tc.cluster.start_member(0, lagging).unwrap();
    let pid_file = tc.cluster.data().join(format!("server-0-m{lagging}.pid"));
    let pid: u32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
    limit_data(pid, MEMBER_LIMIT_MIB);
    let log_path = tc.cluster.data().join(format!("server-0-m{lagging}.log"));
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("snapshot installed") {
            break;
        }
        let tail = &log[log.len().saturating_sub(6000)..];
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "member {lagging} died:\n{tail}");
        assert!(Instant::now() < deadline, "member {lagging} installed no snapshot in time:\n{tail}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let peak = common::vm_mib(pid, "VmHWM");
    eprintln!("member {lagging}: peak RSS {peak} MiB catching up from {SNAPSHOT_DATA_MIB} MiB of file data");
    assert!(peak < MEMBER_LIMIT_MIB, "peak RSS {peak} MiB");
    // The transfer did not make it stand for election (its higher term would have deposed
    // the leader sending it the snapshot).
    assert_eq!(term(&tc, 0), term_before, "the group changed leaders during the catch-up");
    // It leads with what it installed.
    tc.cluster.kill_member(0, lead).unwrap();
    for i in [0, files / 2, files - 1] {
        assert!(c.read_all(&format!("/big/f{i}")).await.unwrap() == file(i), "/big/f{i}");
    }
    tc.cluster.start_member(0, lead).unwrap();
    tc.assert_fsck_clean();
}

/// Kills the process whose pid it holds (as text) when dropped.
struct KillOnDrop(String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = self.0.trim().parse::<i32>() {
            #[allow(unsafe_code)]
            // SAFETY: kill(2) of a process this test's command started; no memory is touched.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
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

/// Sends `req` straight to the member serving server 0 (no resends, no redirects).
async fn to_leader(tc: &ProcCluster, req: &plusfs_proto::Request) -> plusfs_proto::Response {
    let m = leader(tc, 0);
    let addr = tc.cluster.map().server(0).unwrap().member(m).unwrap().address.clone();
    let conn = plusfs_rpc::Connection::connect_to(&addr, Default::default(), &tc.cluster.map().tls).await.unwrap();
    conn.call(&plusfs_proto::Cred::server(), req).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_request_gets_its_first_answer_also_from_the_next_leader() {
    use plusfs_proto::{FileKind, Reply, Request};
    let mut tc = replicated(1);
    let c = tc.client();
    c.mkdir("/once", 0o755).await.unwrap();
    let create = |seq| Request::Once {
        client: 42,
        seq,
        op: Box::new(Request::Create {
            path: "/once/f".into(),
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            exclusive: true,
            rdev: 0,
            access: 0,
        }),
    };
    let first = to_leader(&tc, &create(1)).await;
    assert!(matches!(first, Ok(Reply::Attr(_))), "{first:?}");
    // The same request again: its first answer, not EEXIST.
    assert_eq!(to_leader(&tc, &create(1)).await, first);
    // A new request (another sequence number) runs: EEXIST.
    let again = to_leader(&tc, &create(2)).await;
    assert_eq!(again.unwrap_err().errno, Errno::EEXIST);
    let unlink = Request::Once { client: 42, seq: 3, op: Box::new(Request::Unlink { path: "/once/f".into() }) };
    assert_eq!(to_leader(&tc, &unlink).await, Ok(Reply::Done));
    // An overwrite took effect, another client renamed the file, then the overwrite's
    // resend came: its first answer, not ENOENT, and no second write.
    c.create("/once/w", 0o644, true).await.unwrap();
    c.write("/once/w", 0, b"old").await.unwrap();
    let write = |data: &[u8]| Request::Once {
        client: 42,
        seq: 4,
        op: Box::new(Request::Write { path: "/once/w".into(), offset: 0, data: data.to_vec().into(), append: false }),
    };
    let written = to_leader(&tc, &write(b"new")).await;
    assert!(matches!(&written, Ok(Reply::Attr(a)) if a.size == 3), "{written:?}");
    c.rename("/once/w", "/once/v").await.unwrap();
    c.create("/once/w", 0o644, true).await.unwrap();
    assert_eq!(to_leader(&tc, &write(b"new")).await, written, "the resent overwrite after a rename");
    // The leader dies; the next one has the answers in its table.
    let victim = leader(&tc, 0);
    tc.cluster.kill_member(0, victim).unwrap();
    assert_ne!(leader(&tc, 0), victim);
    assert_eq!(to_leader(&tc, &create(1)).await, first, "the create's first answer, from the new leader");
    assert_eq!(to_leader(&tc, &unlink).await, Ok(Reply::Done), "not ENOENT");
    assert_eq!(to_leader(&tc, &write(b"new")).await, written, "the overwrite's first answer, from the new leader");
    assert_eq!(c.lstat("/once/f").await.unwrap_err().errno, Errno::ENOENT, "the unlink ran once, the create once");
    assert_eq!(c.read_all("/once/v").await.unwrap(), b"new", "the renamed file has the write");
    assert_eq!(c.read_all("/once/w").await.unwrap(), b"", "the file now at the path was not written");
    tc.cluster.start_member(0, victim).unwrap();
}

/// A tree of `dirs` directories of `files` small files each, under `root`.
fn make_tree(root: &std::path::Path, dirs: usize, files: usize) {
    for d in 0..dirs {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..files {
            std::fs::write(dir.join(format!("f{f}")), content(d * files + f)).unwrap();
        }
    }
}

#[test]
fn tar_x_through_the_mount_goes_on_across_leader_kills() {
    if !mounts::fuse_available() {
        return;
    }
    let mut tc = replicated(2);
    let m = mounts::Mount::new(&tc);
    let local = tempfile::tempdir().unwrap();
    make_tree(&local.path().join("tree"), 40, 60);
    let archive = local.path().join("tree.tar");
    mounts::sh(&format!("tar cf {} -C {} tree", archive.display(), local.path().display()));
    // Both groups hold parts of the tree; one group's serving member dies while tar runs.
    let home = tc.cluster.map().home_of_dir("/x");
    std::fs::create_dir(m.path().join("x")).unwrap();
    let mut tar = std::process::Command::new("tar")
        .arg("xf")
        .arg(&archive)
        .arg("-C")
        .arg(m.path().join("x"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut kills = 0;
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(600));
        if tar.try_wait().unwrap().is_some() {
            break;
        }
        let victim = leader(&tc, home);
        tc.cluster.kill_member(home, victim).unwrap();
        assert_ne!(leader(&tc, home), victim);
        tc.cluster.start_member(home, victim).unwrap();
        kills += 1;
    }
    assert!(kills >= 1, "tar finished before any kill: the test did not test a failover");
    let out = tar.wait_with_output().unwrap();
    if !out.status.success() {
        // What the servers said, for a failure seen only under CI's load.
        let mut said = Vec::new();
        for log in tc.cluster.logs() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let name = log.file_name().unwrap().to_string_lossy().to_string();
            let noisy = ["openraft::", "connection error", "vote changed"];
            let lines = text
                .lines()
                .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && !noisy.iter().any(|n| l.contains(n)));
            said.extend(lines.map(|l| format!("{name}: {l}")));
        }
        let tail = &said[said.len().saturating_sub(40)..];
        panic!(
            "tar x failed across {kills} failovers: {}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            m.stats(),
            tail.join("\n")
        );
    }
    mounts::sh(&format!("diff -r {} {}", local.path().join("tree").display(), m.path().join("x/tree").display()));
    drop(m);
    tc.assert_fsck_clean();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_during_bfo_batch_writes_loses_no_acknowledged_file() {
    let mut tc = replicated(1);
    let c = tc.client();
    c.mkdir("/w", 0o755).await.unwrap();
    let c2 = c.clone();
    let workload = tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut spans = Vec::new();
        for k in 0..40u64 {
            let files: Vec<plusfs_client::NewFile> = (0..16)
                .map(|j| plusfs_client::NewFile::new(format!("/w/b{k}-{j}"), common::bytes(k * 100 + j, 32 << 10)))
                .collect();
            let t = Instant::now();
            let results = c2.batch_write(files).await;
            spans.push((t, Instant::now()));
            for (j, r) in results.into_iter().enumerate() {
                match r {
                    Ok(_) => acked.push((k, j as u64)),
                    Err(e) => panic!("batch {k} file {j} failed across the failover: {e}"),
                }
            }
        }
        (acked, spans)
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let victim = leader(&tc, 0);
    let killed = Instant::now();
    tc.cluster.kill_member(0, victim).unwrap();
    assert_ne!(leader(&tc, 0), victim);
    let took_over = Instant::now();
    let (acked, spans) = workload.await.unwrap();
    assert!(spans.iter().any(|&(s, e)| s <= took_over && e > killed), "no batch met the kill");
    assert_eq!(acked.len(), 40 * 16, "every file of every batch acknowledged");
    for (k, j) in acked {
        let got = c.read_all(&format!("/w/b{k}-{j}")).await.unwrap();
        assert_eq!(common::digest(&got), common::digest(&common::bytes(k * 100 + j, 32 << 10)), "/w/b{k}-{j}");
    }
    tc.cluster.start_member(0, victim).unwrap();
    tc.assert_fsck_clean();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
}

/// Writes an exactly-once mark without an answer for request `seq` of `client` into every
/// member's store of server 0 (all stopped), as a leader that died between a request's
/// effects and the record of its answer leaves it.
fn mark_applied(tc: &mut ProcCluster, client: u64, seq: u64) {
    let members: Vec<u64> = tc.cluster.map().server(0).unwrap().members.iter().map(|m| m.id).collect();
    tc.cluster.stop(0).unwrap();
    for m in &members {
        let db = rocksdb::DB::open_default(tc.cluster.data().join(format!("server-0-m{m}/store"))).unwrap();
        let mut key = vec![b'Q'];
        key.extend_from_slice(&client.to_be_bytes());
        key.extend_from_slice(&seq.to_be_bytes());
        db.put(key, plusfs_store::once_value(None)).unwrap();
    }
    tc.cluster.start(0).unwrap();
    tc.cluster.wait_ready(Duration::from_secs(20)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_whose_answer_was_lost_is_settled_from_the_state() {
    use plusfs_proto::{Reply, Request};
    let mut tc = replicated(1);
    let c = tc.client();
    c.mkdir("/done", 0o755).await.unwrap();
    c.mkdir("/gone", 0o755).await.unwrap();
    for path in ["/ex1", "/ex2"] {
        c.create(path, 0o644, true).await.unwrap();
        c.write(path, 0, path.as_bytes()).await.unwrap();
    }
    c.mkdir("/done/pre", 0o755).await.unwrap();
    for seq in 1..=8 {
        mark_applied(&mut tc, 7, seq);
    }
    let once = |seq, op| Request::Once { client: 7, seq, op: Box::new(op) };
    let mkdir = |path: &str| Request::Mkdir {
        path: path.into(),
        mode: 0o755,
        uid: 0,
        gid: 0,
        threshold: plusfs_proto::Threshold::Cluster,
        width: 0,
    };
    // Applied (the directory is there): its attributes, not EEXIST.
    let made = to_leader(&tc, &once(1, mkdir("/done"))).await;
    assert!(matches!(made, Ok(Reply::Attr(_))), "mkdir of an existing directory, marked applied: {made:?}");
    // Marked, but its effect is not there (undone by recovery): it runs.
    let fresh = to_leader(&tc, &once(2, mkdir("/fresh"))).await;
    assert!(matches!(fresh, Ok(Reply::Attr(_))), "{fresh:?}");
    c.lstat("/fresh").await.expect("the marked mkdir ran");
    // An rmdir whose directory is gone was applied: done, not ENOENT.
    c.rmdir("/gone").await.unwrap();
    assert_eq!(to_leader(&tc, &once(3, Request::Rmdir { path: "/gone".into() })).await, Ok(Reply::Done));
    // An exchange records its answer with its commit decision: marked without one, the
    // recovery undid it, and it runs.
    let ex = to_leader(&tc, &once(4, Request::Exchange { a: "/ex1".into(), b: "/ex2".into() })).await;
    assert_eq!(ex, Ok(Reply::Done));
    assert_eq!(c.read_all("/ex1").await.unwrap(), b"/ex2", "the marked exchange ran");
    // A batch of mkdirs: the directory that exists is done, the missing one is made.
    let mkdirs = Request::Batch {
        op: plusfs_proto::BatchOp::Mkdir,
        dir: "/done".into(),
        names: vec!["pre".into(), "new".into()],
        mode: 0o755,
        uid: 0,
        gid: 0,
        semantics: plusfs_proto::Semantics::StopOnFailure,
    };
    match to_leader(&tc, &once(5, mkdirs)).await {
        Ok(Reply::Batch(b)) => assert_eq!((b.errnos, b.attrs.len()), (vec![Errno::OK, Errno::OK], 2)),
        other => panic!("marked batch of mkdirs: {other:?}"),
    }
    c.lstat("/done/new").await.expect("the missing directory was made");
    // What the state cannot tell (an exclusive xattr set) is reported as unknown.
    let set = plusfs_proto::XattrOp::Set { name: "user.x".into(), value: b"1".to_vec(), create: true, replace: false };
    let xattr = Request::Xattr { path: "/ex1".into(), op: set };
    assert_eq!(to_leader(&tc, &once(6, xattr)).await.unwrap_err().errno, Errno::EIO);
    // A rename or an unlink records its answer with its commit too: marked without one,
    // it runs. Its source being gone says nothing (another client may have removed it):
    // ENOENT, not "done".
    let rename = Request::Rename { src: "/never".into(), dst: "/ex3".into() };
    assert_eq!(to_leader(&tc, &once(7, rename)).await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(
        to_leader(&tc, &once(8, Request::Unlink { path: "/never".into() })).await.unwrap_err().errno,
        Errno::ENOENT
    );
    tc.assert_fsck_clean();
}

/// How many times members of server `id` aborted at failpoint `point` (their logs).
fn failpoint_hits(tc: &ProcCluster, id: u32, point: &str) -> usize {
    let line = format!("failpoint {point} reached");
    tc.cluster
        .logs()
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("server-{id}-m"))))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default().matches(&line).count())
        .sum()
}

/// Restarts every member of server `id`, each set to abort once it applied an
/// exactly-once request, before the answer is recorded on its own or sent.
fn arm_answer_failpoint(tc: &mut ProcCluster, id: u32) {
    tc.cluster.stop(id).unwrap();
    tc.cluster.start_with_env(id, &[("PLUSFS_FAILPOINT", "once_before_answer_record")]).unwrap();
    tc.cluster.wait_ready(Duration::from_secs(20)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_leader_died_right_after_applying_them_take_effect_once() {
    use plusfs_proto::{BatchOp, Semantics};
    let mut tc = replicated(2);
    let c = tc.client();
    let map = tc.cluster.map().clone();
    let on = |prefix: &str, id| (0..).map(|i| format!("/{prefix}{i}")).find(|p| map.home_of_dir(p) == id).unwrap();
    let (a, b) = (on("a", 0), on("b", 1));
    c.mkdir(&a, 0o755).await.unwrap();
    c.mkdir(&b, 0o755).await.unwrap();
    for (path, body) in
        [(format!("{a}/f"), "base"), (format!("{a}/x"), "x"), (format!("{a}/y"), "y"), (format!("{b}/z"), "z")]
    {
        c.create(&path, 0o644, true).await.unwrap();
        c.write(&path, 0, body.as_bytes()).await.unwrap();
    }
    // A hard link in b's server to a's file: appends through it go to a's server.
    c.link(&format!("{a}/f"), &format!("{b}/g")).await.unwrap();
    let names: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
    let mut hits = 0;
    for step in 0..10 {
        arm_answer_failpoint(&mut tc, 0);
        let r = match step {
            // Through the hard link: b's server forwards it to the inode's home, a's.
            9 => c.write(&format!("{b}/g"), 0, b"B").await.map(|at| assert_eq!(at.size, 8)),
            8 => c.chmod(&a, 0o775).await.map(|at| assert_eq!(at.mode & 0o7777, 0o775)),
            6 => c.write(&format!("{a}/x"), 1, b"Z").await.map(|at| assert_eq!(at.size, 2)),
            7 => c.truncate(&format!("{a}/x"), 1).await.map(|at| assert_eq!(at.size, 1)),
            0 => c.append(&format!("{a}/f"), b"+1").await.map(|at| assert_eq!(at.size, 6)),
            1 => c.setxattr(&format!("{a}/f"), "user.k", b"v", true, false).await,
            2 => c.exchange(&format!("{a}/x"), &format!("{a}/y")).await,
            3 => c.exchange(&format!("{a}/x"), &format!("{b}/z")).await,
            4 => c
                .batch(BatchOp::Create { exclusive: true }, &a, &names, 0o644, Semantics::PerformAll)
                .await
                .map(|outs| assert!(outs.iter().all(|o| matches!(o, plusfs_client::Outcome::Done(_))), "{outs:?}")),
            _ => c.append(&format!("{b}/g"), b"+2").await.map(|at| assert_eq!(at.size, 8)),
        };
        r.unwrap_or_else(|e| panic!("step {step} across the failover: {e}"));
        hits += 1;
        assert_eq!(failpoint_hits(&tc, 0, "once_before_answer_record"), hits, "step {step}: the leader died");
    }
    tc.cluster.stop(0).unwrap();
    tc.cluster.start(0).unwrap();
    tc.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    // Each took effect exactly once.
    assert_eq!(c.read_all(&format!("{a}/f")).await.unwrap(), b"Base+1+2");
    assert_eq!(c.getxattr(&format!("{a}/f"), "user.k").await.unwrap(), b"v");
    assert_eq!(c.read_all(&format!("{a}/y")).await.unwrap(), b"x");
    assert_eq!(c.read_all(&format!("{a}/x")).await.unwrap(), b"z", "written to zZ, truncated to z");
    assert_eq!(c.stat(&a).await.unwrap().mode & 0o7777, 0o775);
    assert_eq!(c.read_all(&format!("{b}/z")).await.unwrap(), b"y");
    for n in &names {
        c.lstat(&format!("{a}/{n}")).await.unwrap();
    }
    tc.assert_fsck_clean();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "fsck --replicas:\n{out}\n{err}");
}
