//! Cx (seed 004 §III) on real clusters: answers, conflicts, a full log, and a server
//! process aborted (failpoint, like kill -9) at each step of an operation, restarted, and
//! the cluster left to finish by itself — every operation all-or-nothing (fsck), nothing
//! acknowledged lost.

mod common;

use common::ProcCluster;
use plusfs_client::Client;
use plusfs_localcluster::ClusterSettings;
use plusfs_placement::{TxnProtocol, TxnSettings};
use plusfs_proto::{CxRole, DirObject, Errno, Inode, OpId, Replace, Reply, Request, ServerId, SubOp, Threshold};
use plusfs_testcluster::cross_server_name;
use std::time::{Duration, Instant};

fn cx_cluster(n: usize, timeout_ms: u64, threshold: u32, max_log_bytes: u64) -> ProcCluster {
    let txn = TxnSettings {
        protocol: TxnProtocol::Cx,
        commit_timeout_ms: timeout_ms,
        commit_threshold: threshold,
        max_log_bytes,
    };
    ProcCluster::start_settings(n, &ClusterSettings { txn, ..Default::default() })
}

/// Waits until no server has a pending Cx operation.
async fn settled(c: &Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut pending = 0;
        let mut reachable = true;
        for s in &c.map().servers {
            match c.server_status(s.id).await {
                Ok(st) => pending += st.cx_pending,
                Err(_) => reachable = false,
            }
        }
        if reachable && pending == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "Cx operations still pending after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn exists(c: &Client, p: &str) -> bool {
    match c.lstat(p).await {
        Ok(_) => true,
        Err(e) if e.errno == Errno::ENOENT => false,
        Err(e) => panic!("stat {p}: {e}"),
    }
}

fn crash_with(cluster: &mut ProcCluster, id: u32, point: &str) {
    cluster.cluster.stop(id).unwrap();
    cluster.cluster.start_with_env(id, &[("PLUSFS_FAILPOINT", point)]).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
}

fn restart(cluster: &mut ProcCluster, id: u32) {
    cluster.cluster.kill(id).unwrap(); // reaps the aborted process
    cluster.cluster.start(id).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
}

/// Waits until server `id` has died at its failpoint.
async fn died(c: &Client, id: ServerId) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.server_status(id).await.is_ok() {
        assert!(Instant::now() < deadline, "server {id} did not reach its failpoint");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_errors_and_visibility() {
    let cluster = cx_cluster(3, 60_000, 100_000, 16 << 20);
    let (a, b) = (cluster.client(), cluster.client());
    let (p, _, _) = cross_server_name(&a, "d");
    a.mkdir(&p, 0o750).await.unwrap();
    // Pending (the timer is a minute away) yet visible to another client at once: its
    // stat and listing commit the operation first.
    let st = a.server_status(a.home("/")).await.unwrap();
    assert!(st.cx_pending >= 1, "the mkdir waits for a lazy commitment");
    assert_eq!(b.lstat(&p).await.unwrap().mode & 0o7777, 0o750);
    assert!(b.readdir("/").await.unwrap().iter().any(|e| format!("/{}", e.name) == p));
    // Errors as POSIX has them, each on the path.
    assert_eq!(a.mkdir(&p, 0o755).await.unwrap_err().errno, Errno::EEXIST);
    a.create("/file", 0o644, true).await.unwrap();
    assert_eq!(a.mkdir("/file", 0o755).await.unwrap_err().errno, Errno::EEXIST);
    assert_eq!(a.mkdir("/missing/x", 0o755).await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(a.mkdir("/file/x", 0o755).await.unwrap_err().errno, Errno::ENOTDIR);
    a.mkdir(&format!("{p}/inner"), 0o755).await.unwrap();
    assert_eq!(a.rmdir(&p).await.unwrap_err().errno, Errno::ENOTEMPTY);
    assert_eq!(a.rmdir("/file").await.unwrap_err().errno, Errno::ENOTDIR);
    assert_eq!(a.rmdir("/nothing").await.unwrap_err().errno, Errno::ENOENT);
    a.rmdir(&format!("{p}/inner")).await.unwrap();
    a.rmdir(&p).await.unwrap();
    assert!(!exists(&b, &p).await);
    // mkdir -p through many levels, each level pending while the next is made.
    a.mkdir_all("/t/u/v/w/x", 0o755).await.unwrap();
    b.create("/t/u/v/w/x/f", 0o644, true).await.unwrap();
    settled(&a).await;
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_record_then_crash_on_either_side() {
    let mut cluster = cx_cluster(3, 200, 100_000, 16 << 20);
    let c = cluster.client();
    // Coordinator dies after logging its Result: the client gets an error, the restarted
    // coordinator finishes the operation from its log (all of it, not half).
    let (p, coord, part) = cross_server_name(&c, "a");
    crash_with(&mut cluster, coord, "cx_after_result");
    assert!(c.mkdir(&p, 0o755).await.is_err(), "the coordinator died before answering");
    restart(&mut cluster, coord);
    settled(&c).await;
    assert!(exists(&c, &p).await, "both Results were logged: the operation commits");
    cluster.assert_fsck_clean();

    // Participant dies after logging its Result: the client's L-COM waits for it; once it
    // is back it votes from its log and the mkdir succeeds.
    let (q, _, part2) = cross_server_name(&c, "b");
    assert_eq!(part, c.home(&p));
    crash_with(&mut cluster, part2, "cx_after_result");
    let c2 = c.clone();
    let q2 = q.clone();
    let call = tokio::spawn(async move { c2.mkdir(&q2, 0o755).await });
    died(&c, part2).await;
    restart(&mut cluster, part2);
    call.await.unwrap().expect("acknowledged after the participant came back");
    settled(&c).await;
    assert!(exists(&c, &q).await);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_around_vote_and_decision_lose_nothing() {
    let mut cluster = cx_cluster(3, 200, 100_000, 16 << 20);
    let c = cluster.client();
    let (_, coord, _) = cross_server_name(&c, "x");
    for (i, point) in ["cx_before_vote", "cx_after_vote", "cx_after_commit_record"].iter().enumerate() {
        let (p, _, part) = cross_server_name(&c, &format!("v{i}-"));
        let victim = if *point == "cx_after_vote" { part } else { coord };
        crash_with(&mut cluster, victim, point);
        // Both YES: acknowledged now, committed by the timer, which hits the failpoint.
        c.mkdir(&p, 0o755).await.unwrap_or_else(|e| panic!("{point}: {e}"));
        died(&c, victim).await;
        restart(&mut cluster, victim);
        settled(&c).await;
        assert!(exists(&c, &p).await, "{point}: an acknowledged mkdir was lost");
        c.rmdir(&p).await.unwrap();
        settled(&c).await;
        assert!(!exists(&c, &p).await, "{point}: rmdir after recovery");
        cluster.assert_fsck_clean();
    }
    // A crash during recovery: the second restart still finishes the work.
    let (p, _, _) = cross_server_name(&c, "r");
    crash_with(&mut cluster, coord, "cx_before_vote");
    c.mkdir(&p, 0o755).await.unwrap();
    died(&c, coord).await;
    cluster.cluster.kill(coord).unwrap();
    cluster.cluster.start_with_env(coord, &[("PLUSFS_FAILPOINT", "cx_during_recovery")]).unwrap();
    died(&c, coord).await;
    restart(&mut cluster, coord);
    settled(&c).await;
    assert!(exists(&c, &p).await, "the operation survives a crash during recovery");
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_during_a_stream_of_mkdirs() {
    let mut cluster = cx_cluster(3, 100, 64, 16 << 20);
    let c = cluster.client();
    c.mkdir("/s", 0o755).await.unwrap();
    let victim = c.home("/s");
    let c2 = c.clone();
    // The stream reports each answer, so the kill lands after a known number of acknowledged
    // mkdirs, and the restart after the stream has felt the outage.
    let (progress_tx, mut progress) = tokio::sync::watch::channel((0usize, 0usize));
    let stream = tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut failed = 0;
        for i in 0..400 {
            if c2.mkdir(&format!("/s/d{i}"), 0o755).await.is_ok() {
                acked.push(i);
            } else {
                failed += 1;
            }
            progress_tx.send_replace((acked.len(), failed));
        }
        acked
    });
    progress.wait_for(|&(acked, _)| acked >= 50).await.expect("the stream ran");
    cluster.cluster.kill(victim).unwrap();
    let at_kill = progress.borrow().0;
    progress.wait_for(|&(_, failed)| failed > 0).await.expect("the stream met the dead server");
    cluster.cluster.start(victim).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let acked = stream.await.unwrap();
    settled(&c).await;
    let listed: std::collections::HashSet<String> =
        c.readdir("/s").await.unwrap().into_iter().map(|e| e.name).collect();
    for i in &acked {
        assert!(listed.contains(&format!("d{i}")), "acknowledged /s/d{i} lost");
    }
    for name in &listed {
        c.lstat(&format!("/s/{name}")).await.unwrap_or_else(|e| panic!("entry without its object: {e}"));
    }
    // Mid-workload: mkdirs were acknowledged before the kill and after the restart.
    assert!((50..400).contains(&at_kill), "killed after {at_kill} acknowledged mkdirs");
    assert!(acked.len() > at_kill, "no mkdir acknowledged after the restart ({} in all)", acked.len());
    cluster.assert_fsck_clean();
}

fn op_id(seq: u64) -> OpId {
    OpId { client: 0xc1, process: 1, seq }
}

/// One side (`role`) of operation `op`: mkdir of `/name` = `q` with inode `ino`, the
/// entry in `/` at `coord`, the object at `part`.
fn mkdir_side(q: &str, (coord, part): (ServerId, ServerId), op: OpId, role: CxRole, ino: u64) -> Request {
    let (peer, ops) = match role {
        CxRole::Coordinator => (
            part,
            vec![SubOp::InsertEntry {
                dir: "/".into(),
                name: q[1..].to_string(),
                inode: Inode::subdir(ino),
                replace: Replace::Never,
                shard: None,
            }],
        ),
        CxRole::Participant => {
            (coord, vec![SubOp::CreateDir { path: q.to_string(), object: DirObject::new(ino, 0o755, 0, 0) }])
        }
    };
    Request::CxExec { op, role, peer, ops, leased: false }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreement_and_a_client_that_dies_before_l_com() {
    let cluster = cx_cluster(3, 200, 100_000, 16 << 20);
    let c = cluster.client();
    // The coordinator says NO (a file has the name), the participant YES: L-COM, ALL-NO,
    // and the participant's half is gone.
    let (p, coord, _) = cross_server_name(&c, "f");
    c.create(&p, 0o644, true).await.unwrap();
    assert_eq!(c.mkdir(&p, 0o755).await.unwrap_err().errno, Errno::EEXIST);
    settled(&c).await;
    cluster.assert_fsck_clean();

    // A client that sends both sub-operations and dies before L-COM (the coordinator
    // refused), and one that dies after reaching only the participant: the participant's
    // YES ages, it asks the coordinator, which aborts both.
    let (q, coord2, part2) = cross_server_name(&c, "g");
    assert_eq!((coord, part2 != coord2), (coord2, true));
    let object = |ino| DirObject::new(ino, 0o755, 0, 0);
    let exec = |seq: u64, role: CxRole, peer: ServerId, ops: Vec<SubOp>| Request::CxExec {
        op: op_id(seq),
        role,
        peer,
        ops,
        leased: false,
    };
    let create_dir = |path: &str, ino| vec![SubOp::CreateDir { path: path.into(), object: object(ino) }];
    let insert = |name: &str, ino| {
        vec![SubOp::InsertEntry {
            dir: "/".into(),
            name: name.into(),
            inode: Inode::subdir(ino),
            replace: Replace::Never,
            shard: None,
        }]
    };
    let yes = |r: Reply| matches!(r, Reply::CxAnswer(a) if a.error.is_none());
    // Only the participant is reached.
    assert!(yes(c.call_server(part2, &exec(1, CxRole::Participant, coord2, create_dir(&q, 900_001))).await.unwrap()));
    // Both reached, the coordinator refuses (the entry exists), no L-COM follows.
    c.create("/taken", 0o644, true).await.unwrap();
    let (r, part3) = ("/taken", c.home("/taken"));
    if part3 != coord {
        assert!(yes(c.call_server(part3, &exec(2, CxRole::Participant, coord, create_dir(r, 900_002))).await.unwrap()));
        let no = c.call_server(coord, &exec(2, CxRole::Coordinator, part3, insert("taken", 900_002))).await.unwrap();
        assert!(!yes(no));
    }
    settled(&c).await;
    assert!(!exists(&c, &q).await, "the half-executed mkdir was aborted");
    c.mkdir(&q, 0o755).await.expect("the name is free again");
    // A late sub-operation of an aborted operation is refused.
    let late = c.call_server(coord2, &exec(1, CxRole::Coordinator, part2, insert(&q[1..], 900_001))).await.unwrap();
    assert!(!yes(late));
    settled(&c).await;
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_race_on_one_directory() {
    let cluster = cx_cluster(4, 50, 32, 16 << 20);
    let admin = cluster.client();
    admin.mkdir_with("/race", 0o755, Threshold::Entries(0), 0).await.unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("/race/n{i}")).collect();
    let t0 = Instant::now();
    let run = move |c: Client, seed: u64, names: Vec<String>| async move {
        // (successful mkdirs, successful rmdirs) per name, and a trace to explain failures
        let mut tally = vec![(0i64, 0i64); names.len()];
        let mut trace = Vec::new();
        let mut x = seed;
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % names.len() as u64) as usize;
            let start = t0.elapsed().as_micros();
            match (x >> 8) % 3 {
                0 => match c.mkdir(&names[i], 0o755).await {
                    Ok(_) => {
                        tally[i].0 += 1;
                        trace.push((i, start, t0.elapsed().as_micros(), "mkdir ok"));
                    }
                    Err(e) => assert_eq!(e.errno, Errno::EEXIST, "mkdir {}: {e}", names[i]),
                },
                1 => match c.rmdir(&names[i]).await {
                    Ok(_) => {
                        tally[i].1 += 1;
                        trace.push((i, start, t0.elapsed().as_micros(), "rmdir ok"));
                    }
                    Err(e) => {
                        assert_eq!(e.errno, Errno::ENOENT, "rmdir {}: {e}", names[i]);
                        trace.push((i, start, t0.elapsed().as_micros(), "rmdir ENOENT"));
                    }
                },
                _ => match c.lstat(&names[i]).await {
                    Ok(a) => assert_eq!(a.kind, plusfs_proto::FileKind::Dir),
                    Err(e) => assert_eq!(e.errno, Errno::ENOENT),
                },
            }
        }
        (tally, trace)
    };
    let (t1, t2) = tokio::join!(
        tokio::spawn(run(cluster.client(), 0x1234_5678, names.clone())),
        tokio::spawn(run(cluster.client(), 0x9abc_def1, names.clone()))
    );
    let ((t1, trace1), (t2, trace2)) = (t1.unwrap(), t2.unwrap());
    settled(&admin).await;
    for (i, name) in names.iter().enumerate() {
        let made = t1[i].0 + t2[i].0;
        let removed = t1[i].1 + t2[i].1;
        let present = exists(&admin, name).await;
        if made - removed != i64::from(present) {
            let mut events: Vec<_> = trace1
                .iter()
                .map(|e| (1, e))
                .chain(trace2.iter().map(|e| (2, e)))
                .filter(|(_, e)| e.0 == i)
                .map(|(c, e)| format!("{:>9}-{:>9} client {c} {}", e.1, e.2, e.3))
                .collect();
            events.sort();
            panic!("{name}: {made} mkdirs, {removed} rmdirs, present={present}\n{}", events.join("\n"));
        }
    }
    let mut invalidated = 0;
    for s in &admin.map().servers {
        invalidated += admin.server_status(s.id).await.unwrap().cx_invalidated;
    }
    eprintln!("participant results invalidated during the race: {invalidated}");
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_log_blocks_and_commits_instead_of_losing() {
    // A 64 KiB log, a timer that never fires during the test, a huge threshold: only the
    // full log makes commitments happen.
    let cluster = cx_cluster(3, 600_000, 1_000_000, 64 << 10);
    let c = cluster.client();
    c.mkdir("/full", 0o755).await.unwrap();
    for i in 0..1500 {
        c.mkdir(&format!("/full/d{i}"), 0o755).await.unwrap();
    }
    let mut peak = 0;
    let mut executed = 0;
    for s in &c.map().servers {
        let st = c.server_status(s.id).await.unwrap();
        peak = peak.max(st.cx_log_peak);
        executed += st.cx_executed;
    }
    assert!(executed > 1000, "the mkdirs ran as Cx operations ({executed})");
    assert!(peak <= (64 << 10) + 1024, "log peak {peak} B stays at the 64 KiB limit");
    assert_eq!(c.readdir("/full").await.unwrap().len(), 1500);
    settled(&c).await;
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_three_protocols_give_the_same_namespace() {
    for protocol in [TxnProtocol::Cx, TxnProtocol::TwoPhase, TxnProtocol::Serial] {
        let cluster = ProcCluster::start_protocol(3, protocol);
        let c = cluster.client();
        for i in 0..40 {
            c.mkdir(&format!("/p{i}"), 0o755).await.unwrap();
            c.mkdir(&format!("/p{i}/q"), 0o700).await.unwrap();
        }
        assert_eq!(c.mkdir("/p3", 0o755).await.unwrap_err().errno, Errno::EEXIST, "{protocol:?}");
        assert_eq!(c.rmdir("/p3").await.unwrap_err().errno, Errno::ENOTEMPTY, "{protocol:?}");
        for i in 0..40 {
            c.rmdir(&format!("/p{i}/q")).await.unwrap();
            if i % 2 == 0 {
                c.rmdir(&format!("/p{i}")).await.unwrap();
            }
        }
        let mut left: Vec<String> = c.readdir("/").await.unwrap().into_iter().map(|e| e.name).collect();
        left.sort();
        let mut want: Vec<String> = (0..40).filter(|i| i % 2 == 1).map(|i| format!("p{i}")).collect();
        want.sort();
        assert_eq!(left, want, "{protocol:?}");
        settled(&c).await;
        cluster.assert_fsck_clean();
    }
}

/// Property: random sequences of mkdir, rmdir, create, unlink, stat and readdir from one
/// writer, with a second client reading after every step, give exactly the results of a
/// sequential model of the namespace, whatever mix of lazy, immediate (conflict) and
/// threshold commitments the servers chose underneath. Several seeds, small triggers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn property_random_operations_match_a_model() {
    use std::collections::BTreeMap;
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Kind {
        Dir,
        File,
    }
    let cluster = cx_cluster(4, 30, 8, 16 << 20);
    let (w, r) = (cluster.client(), cluster.client());
    for seed in [1u64, 7, 42, 1234] {
        let root = format!("/m{seed}");
        w.mkdir(&root, 0o755).await.unwrap();
        let mut model: BTreeMap<String, Kind> = BTreeMap::new();
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Paths two levels deep over a few names, so parents are often missing or files.
        let paths: Vec<String> = (0..4)
            .flat_map(|a| {
                let r = root.clone();
                std::iter::once(format!("{r}/a{a}")).chain((0..3).map(move |b| format!("{r}/a{a}/b{b}")))
            })
            .collect();
        for step in 0..250 {
            let p = paths[(next() % paths.len() as u64) as usize].clone();
            let parent = plusfs_proto::path::split(&p).unwrap().0.to_string();
            let parent_ok = parent == root || model.get(&parent) == Some(&Kind::Dir);
            let children = |m: &BTreeMap<String, Kind>| m.keys().any(|k| k.starts_with(&format!("{p}/")));
            let op = next() % 4;
            let (name, got, want) = match op {
                0 => {
                    let want = match (parent_ok, model.get(&p)) {
                        (false, _) if model.contains_key(&parent) => Err(Errno::ENOTDIR),
                        (false, _) => Err(Errno::ENOENT),
                        (true, Some(_)) => Err(Errno::EEXIST),
                        (true, None) => Ok(()),
                    };
                    if want.is_ok() {
                        model.insert(p.clone(), Kind::Dir);
                    }
                    ("mkdir", w.mkdir(&p, 0o755).await.map(drop).map_err(|e| e.errno), want)
                }
                1 => {
                    let want = match model.get(&p) {
                        None if !parent_ok && model.contains_key(&parent) => Err(Errno::ENOTDIR),
                        None => Err(Errno::ENOENT),
                        Some(Kind::File) => Err(Errno::ENOTDIR),
                        Some(Kind::Dir) if children(&model) => Err(Errno::ENOTEMPTY),
                        Some(Kind::Dir) => Ok(()),
                    };
                    if want.is_ok() {
                        model.remove(&p);
                    }
                    ("rmdir", w.rmdir(&p).await.map_err(|e| e.errno), want)
                }
                2 => {
                    let want = match (parent_ok, model.get(&p)) {
                        (false, _) if model.contains_key(&parent) => Err(Errno::ENOTDIR),
                        (false, _) => Err(Errno::ENOENT),
                        (true, Some(_)) => Err(Errno::EEXIST),
                        (true, None) => Ok(()),
                    };
                    if want.is_ok() {
                        model.insert(p.clone(), Kind::File);
                    }
                    ("create", w.create(&p, 0o644, true).await.map(drop).map_err(|e| e.errno), want)
                }
                _ => {
                    let want = match model.get(&p) {
                        None if !parent_ok && model.contains_key(&parent) => Err(Errno::ENOTDIR),
                        None => Err(Errno::ENOENT),
                        Some(Kind::Dir) => Err(Errno::EISDIR),
                        Some(Kind::File) => Ok(()),
                    };
                    if want.is_ok() {
                        model.remove(&p);
                    }
                    ("unlink", w.unlink(&p).await.map_err(|e| e.errno), want)
                }
            };
            assert_eq!(got, want, "seed {seed} step {step}: {name} {p}");
            // The other client sees the state the writer's answers imply, at once.
            let seen = match r.lstat(&p).await {
                Ok(a) if a.kind == plusfs_proto::FileKind::Dir => Some(Kind::Dir),
                Ok(_) => Some(Kind::File),
                Err(_) => None,
            };
            if seen != model.get(&p).copied() {
                let keep = std::env::temp_dir().join("plusfs-cx-property-failure");
                let _ = std::fs::create_dir_all(&keep);
                for id in cluster.cluster.ids() {
                    let log = cluster.cluster.data().join(format!("server-{id}.log"));
                    let _ = std::fs::copy(&log, keep.join(format!("server-{id}.log")));
                }
                panic!(
                    "seed {seed} step {step}: reader's view of {p} after {name}: {seen:?}, model {:?} (logs in {})",
                    model.get(&p),
                    keep.display()
                );
            }
            if step % 50 == 49 {
                let mut listed: Vec<String> =
                    r.readdir(&root).await.unwrap().into_iter().map(|e| format!("{root}/{}", e.name)).collect();
                listed.sort();
                let want: Vec<String> =
                    model.keys().filter(|k| plusfs_proto::path::split(k).unwrap().0 == root).cloned().collect();
                assert_eq!(listed, want, "seed {seed} step {step}: listing");
            }
        }
    }
    settled(&w).await;
    cluster.assert_fsck_clean();
}

/// A disordered conflict (seed 004 Fig. 3(b)), made by hand with raw sub-operations: two
/// mkdirs of one name reach the participant in one order (B, A) and the coordinator in the
/// other (A, B). The coordinator's order wins: the participant invalidates B, executes A,
/// and the answers' hints tell both clients not to trust what they first got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disordered_arrivals_follow_the_coordinators_order() {
    let cluster = cx_cluster(3, 600_000, 1_000_000, 16 << 20);
    let c = cluster.client();
    let (q, coord, part) = cross_server_name(&c, "o");
    let (a, b) = (op_id(20), op_id(21));
    let exec = |op: OpId, role: CxRole, ino: u64| mkdir_side(&q, (coord, part), op, role, ino);
    let answer = |r: Reply| match r {
        Reply::CxAnswer(a) => a,
        other => panic!("unexpected {other:?}"),
    };
    // Participant: B first. Coordinator: A first.
    let pb = answer(c.call_server(part, &exec(b, CxRole::Participant, 901)).await.unwrap());
    let ca = answer(c.call_server(coord, &exec(a, CxRole::Coordinator, 900)).await.unwrap());
    assert!(pb.error.is_none() && ca.error.is_none() && pb.hint.is_empty() && ca.hint.is_empty());
    // A reaches the participant (waits behind B), B the coordinator (waits behind A).
    let (c1, c2) = (c.clone(), c.clone());
    let pa_req = exec(a, CxRole::Participant, 900);
    let pa = tokio::spawn(async move { c1.call_server(part, &pa_req).await.unwrap() });
    // A must be waiting at the participant before B reaches the coordinator: the
    // participant counts it as pending (executing) as soon as it has arrived.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.server_status(part).await.unwrap().cx_pending < 2 {
        assert!(Instant::now() < deadline, "A never reached the participant");
        tokio::task::yield_now().await;
    }
    let cb_req = exec(b, CxRole::Coordinator, 901);
    let cb = tokio::spawn(async move { c2.call_server(coord, &cb_req).await.unwrap() });
    let (pa, cb) = (answer(pa.await.unwrap()), answer(cb.await.unwrap()));
    // A: YES on both sides, but the participant's hint names B, so its client launches
    // the commitment (L-COM) and learns it committed.
    assert!(pa.error.is_none(), "A executes at the participant after B is invalidated: {pa:?}");
    assert_eq!(pa.hint, vec![b]);
    assert_ne!(pa.hint, ca.hint);
    let launch = |op| Request::CxLaunch { op, participant: part };
    assert_eq!(c.call_server(coord, &launch(a)).await.unwrap(), Reply::CxOutcome { committed: true });
    // B: the coordinator ordered it after A (hint [A]) and refuses it (A made the name);
    // its first YES from the participant carried another hint, so its client launches
    // the commitment and gets ALL-NO.
    assert_eq!(cb.hint, vec![a]);
    assert_eq!(cb.error.as_ref().map(|e| e.errno), Some(Errno::EEXIST));
    assert_eq!(c.call_server(coord, &launch(b)).await.unwrap(), Reply::CxOutcome { committed: false });
    settled(&c).await;
    let st = c.server_status(part).await.unwrap();
    assert_eq!(st.cx_invalidated, 1, "the participant invalidated B's execution");
    assert_eq!(c.lstat(&q).await.unwrap().ino, 900, "A's directory, with A's inode on both sides");
    cluster.assert_fsck_clean();
}

/// A coordinator asked to decide an operation it has not seen yet (its `CxExec` still on its
/// way) waits the whole grace for it, however busy it is meanwhile: the operation arriving
/// within the grace is committed, not aborted by the first unrelated state change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_before_the_exec_waits_the_whole_grace_while_the_coordinator_is_busy() {
    let cluster = cx_cluster(3, 200, 1_000_000, 16 << 20);
    let c = cluster.client();
    let (q, coord, part) = cross_server_name(&c, "g");
    let x = op_id(30);
    // Unrelated operations the same coordinator decides, changing its state all along.
    let busy = {
        let c = cluster.client();
        tokio::spawn(async move {
            for i in 0..400 {
                c.mkdir(&format!("/busy{i}"), 0o755).await.unwrap();
            }
        })
    };
    let launch = {
        let c = c.clone();
        tokio::spawn(async move { c.call_server(coord, &Request::CxLaunch { op: x, participant: part }).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!launch.is_finished(), "the launch of an unknown operation answered before its grace");
    // The participant's side first: the coordinator's, once executed, is decided at once.
    let sides = [(part, CxRole::Participant), (coord, CxRole::Coordinator)];
    for (server, role) in sides {
        let r = c.call_server(server, &mkdir_side(&q, (coord, part), x, role, 950)).await.unwrap();
        assert!(matches!(&r, Reply::CxAnswer(a) if a.error.is_none()), "{role:?} side: {r:?}");
    }
    let outcome = tokio::time::timeout(Duration::from_secs(30), launch).await.expect("an outcome").unwrap();
    assert_eq!(outcome.unwrap(), Reply::CxOutcome { committed: true });
    busy.await.unwrap();
    settled(&c).await;
    assert_eq!(c.lstat(&q).await.unwrap().ino, 950);
    cluster.assert_fsck_clean();
}
