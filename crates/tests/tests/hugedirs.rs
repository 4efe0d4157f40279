//! Huge directories on real multi-process clusters: crossing the threshold under
//! concurrent creators, stale client caches after rename and re-creation, rmdir, and
//! crashes during redistribution (seed 001 §IV).

mod common;

use common::ProcCluster;
use plusfs_client::Client;
use plusfs_proto::{DistState, Errno, Semantics, Threshold};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The listing of `dir` as a set, failing on duplicates.
async fn listing(c: &Client, dir: &str) -> BTreeSet<String> {
    let entries = c.readdir(dir).await.unwrap();
    let set: BTreeSet<String> = entries.iter().map(|e| e.name.clone()).collect();
    assert_eq!(set.len(), entries.len(), "readdir of {dir} returned an entry twice");
    set
}

/// Paged listing with small pages, to exercise the merge of storing servers' pages.
async fn paged_listing(c: &Client, dir: &str, page: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let p = c.readdir_page(dir, after.take(), page).await.unwrap();
        after = p.entries.last().map(|e| e.name.clone());
        out.extend(p.entries.into_iter().map(|e| e.name));
        if !p.more || after.is_none() {
            return out;
        }
    }
}

async fn wait_distributed(c: &Client, dir: &str) -> plusfs_proto::DistReport {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = c.distribution(dir).await.unwrap();
        if d.state == DistState::Distributed || Instant::now() > deadline {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creator_processes_cross_the_threshold() {
    let cluster = ProcCluster::start_hugedirs(4, Some(300));
    let c = cluster.client();
    c.mkdir("/h", 0o755).await.unwrap();
    // Four creator processes, each running `plusfs touch` over chunks of 40 names, while
    // the directory crosses 300 entries.
    let procs = 4;
    let per = 400;
    std::thread::scope(|s| {
        for p in 0..procs {
            let cluster = &cluster;
            s.spawn(move || {
                for chunk in names(&format!("p{p}_"), per).chunks(40) {
                    let paths: Vec<String> = chunk.iter().map(|n| format!("/h/{n}")).collect();
                    let mut args = vec!["touch"];
                    args.extend(paths.iter().map(String::as_str));
                    let (code, out, err) = cluster.cli(&args);
                    assert_eq!(code, 0, "touch failed: {out}{err}");
                }
            });
        }
    });
    let expected: BTreeSet<String> = (0..procs).flat_map(|p| names(&format!("p{p}_"), per)).collect();
    assert_eq!(listing(&c, "/h").await, expected);
    let fresh = cluster.client();
    assert_eq!(listing(&fresh, "/h").await, expected, "a client without a cached distribution");
    let paged = paged_listing(&fresh, "/h", 37).await;
    assert_eq!(paged.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(paged.len(), expected.len(), "paged listing repeats entries");
    assert!(paged.windows(2).all(|w| w[0] < w[1]), "pages come in name order");

    let d = c.distribution("/h").await.unwrap();
    assert_eq!(d.state, DistState::Distributed);
    assert_eq!(d.set.len(), 4);
    assert_eq!(d.entries.iter().map(|e| e.1).sum::<u64>(), expected.len() as u64);
    let attr = c.lstat("/h").await.unwrap();
    assert_eq!(attr.size, expected.len() as u64, "size sums the shards");
    assert_eq!(attr.nlink, 2);
    // Batch stat per storing server, results in the caller's order.
    let all: Vec<String> = expected.iter().cloned().collect();
    let st = c.statv("/h", &all, Semantics::PerformAll).await.unwrap();
    assert!(st.iter().all(|r| r.is_ok()));
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_creates_and_subdirectories_in_a_huge_directory() {
    let cluster = ProcCluster::start_hugedirs(3, Some(50));
    let c = cluster.client();
    c.mkdir("/h", 0o755).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..4 {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                c.create(&format!("/h/t{t}_{i}"), 0o644, true).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(wait_distributed(&c, "/h").await.state, DistState::Distributed);
    // Subdirectories, symlinks and renames inside and out of the huge directory.
    c.mkdir("/h/sub", 0o700).await.unwrap();
    c.create("/h/sub/inner", 0o644, true).await.unwrap();
    c.symlink("/target", "/h/link").await.unwrap();
    assert_eq!(c.readlink("/h/link").await.unwrap(), "/target");
    c.rename("/h/t0_0", "/h/renamed").await.unwrap();
    c.mkdir("/small", 0o755).await.unwrap();
    c.rename("/h/t0_1", "/small/moved").await.unwrap();
    c.rename("/small/moved", "/h/back").await.unwrap();
    c.rename("/h/sub", "/small/sub").await.unwrap();
    assert!(c.lstat("/small/sub/inner").await.is_ok());
    let attr = c.lstat("/h").await.unwrap();
    assert_eq!(attr.size, 160 + 1, "160 files - 2 moved out + 2 back + link");
    assert_eq!(c.unlink("/h/nothing").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(c.create("/h/renamed", 0o644, true).await.unwrap_err().errno, Errno::EEXIST);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_distribution_after_rename_and_recreate() {
    let cluster = ProcCluster::start_hugedirs(4, Some(8000));
    let a = cluster.client();
    let b = cluster.client();
    // Distributed from creation (threshold 0).
    a.mkdir_with("/h", 0o755, Threshold::Entries(0), 0).await.unwrap();
    a.batch(plusfs_proto::BatchOp::Create { exclusive: true }, "/h", &names("f", 200), 0o644, Semantics::PerformAll)
        .await
        .unwrap();
    assert!(a.cached_distribution("/h").is_some(), "client a learnt the distribution");

    // Case 1 (seed 001 §IV.C): b renames the huge directory; a's cache points at shards
    // that no longer hold '/h'. Only the primary object moves; entries stay.
    b.rename("/h", "/g").await.unwrap();
    assert_eq!(a.lstat("/h/f1").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(a.create("/h/new", 0o644, true).await.unwrap_err().errno, Errno::ENOENT);
    assert!(a.lstat("/g/f1").await.is_ok());
    assert_eq!(listing(&a, "/g").await.len(), 200);
    assert_eq!(b.distribution("/g").await.unwrap().state, DistState::Distributed);

    // Case 2: a caches '/g'; b removes it and makes a new '/g' (another incarnation).
    assert!(a.cached_distribution("/g").is_some());
    let old = a.cached_distribution("/g").unwrap();
    b.unlinkv("/g", &names("f", 200), Semantics::PerformAll).await.unwrap();
    b.rmdir("/g").await.unwrap();
    b.mkdir_with("/g", 0o755, Threshold::Entries(0), 0).await.unwrap();
    b.create("/g/fresh", 0o644, true).await.unwrap();
    assert_eq!(a.lstat("/g/f1").await.unwrap_err().errno, Errno::ENOENT);
    assert!(a.lstat("/g/fresh").await.is_ok());
    let now = a.cached_distribution("/g").unwrap();
    assert_ne!(now.incarnation, old.incarnation, "a re-learnt the new directory");
    assert_eq!(listing(&a, "/g").await.into_iter().collect::<Vec<_>>(), vec!["fresh".to_string()]);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmdir_of_a_huge_directory_is_atomic() {
    let cluster = ProcCluster::start_hugedirs(3, Some(20));
    let c = cluster.client();
    c.mkdir("/h", 0o755).await.unwrap();
    let files = names("f", 100);
    c.batch(plusfs_proto::BatchOp::Create { exclusive: true }, "/h", &files, 0o644, Semantics::PerformAll)
        .await
        .unwrap();
    assert_eq!(c.distribution("/h").await.unwrap().state, DistState::Distributed);
    assert_eq!(c.rmdir("/h").await.unwrap_err().errno, Errno::ENOTEMPTY);
    // Empty on all servers but one: still not empty.
    c.unlinkv("/h", &files[1..], Semantics::PerformAll).await.unwrap();
    assert_eq!(c.rmdir("/h").await.unwrap_err().errno, Errno::ENOTEMPTY);
    c.unlink("/h/f0").await.unwrap();
    c.rmdir("/h").await.unwrap();
    assert_eq!(c.lstat("/h").await.unwrap_err().errno, Errno::ENOENT);
    for id in cluster.cluster.ids() {
        assert!(c.server_status(id).await.unwrap().shards.is_empty(), "server {id} kept a shard");
    }
    // The name is usable again, as a small directory.
    c.mkdir("/h", 0o755).await.unwrap();
    c.create("/h/x", 0o644, true).await.unwrap();
    assert_eq!(c.distribution("/h").await.unwrap().state, DistState::Nondistributed);
    cluster.assert_fsck_clean();
}

/// Kills (failpoint abort, like kill -9) the primary or a storing server at each step of a
/// redistribution, restarts it, and checks the directory ends distributed with every
/// acknowledged entry exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_redistribution_recovers() {
    for point in [
        "distribute_after_intent",
        "distribute_after_entries",
        "distribute_after_shards",
        "storing_before_shard_object",
    ] {
        let mut cluster = ProcCluster::start_hugedirs(3, Some(200));
        let c = cluster.client();
        let dir = "/h";
        c.mkdir(dir, 0o755).await.unwrap();
        let primary = c.home(dir);
        let victim = if point.starts_with("storing") {
            cluster.cluster.ids().into_iter().find(|&s| s != primary).unwrap()
        } else {
            primary
        };
        cluster.cluster.stop(victim).unwrap();
        cluster.cluster.start_with_env(victim, &[("PLUSFS_FAILPOINT", point)]).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();

        // Creators run until the victim dies; a crashed storing server makes the primary
        // (and the create that crossed the threshold) wait until it is back.
        let creator = {
            let c = cluster.client();
            tokio::spawn(async move {
                let mut acked = BTreeSet::new();
                for n in names("f", 260) {
                    match c.create(&format!("{dir}/{n}"), 0o644, true).await {
                        Ok(_) => acked.insert(n),
                        Err(_) => break,
                    };
                }
                acked
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.call_server(victim, &plusfs_proto::Request::Ping).await.is_ok() {
            assert!(Instant::now() < deadline, "{point}: the failpoint was not reached");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cluster.cluster.kill(victim).unwrap();
        cluster.cluster.start(victim).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
        let acked = creator.await.unwrap();

        let d = wait_distributed(&c, dir).await;
        assert_eq!(d.state, DistState::Distributed, "{point}: redistribution resumed");
        let fresh = cluster.client();
        let got = listing(&fresh, dir).await;
        // The create that crossed the threshold was written before the crash; it may or
        // may not have been acknowledged.
        assert!(acked.is_subset(&got), "{point}: acknowledged entries lost");
        assert!(got.len() <= acked.len() + 1, "{point}: unexpected entries {got:?}");
        assert_eq!(d.entries.iter().map(|e| e.1).sum::<u64>(), got.len() as u64, "{point}: shard counts");
        // Still fully usable.
        fresh.create(&format!("{dir}/after"), 0o644, true).await.unwrap();
        cluster.assert_fsck_clean();
    }
}

/// Real kill -9 (not a failpoint) of a storing server, then of the primary, while a
/// directory of 60,000 entries is being distributed; after restarts the directory is
/// distributed with every entry exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_during_a_large_redistribution() {
    for kill_primary in [false, true] {
        let mut cluster = ProcCluster::start_hugedirs(3, None);
        let c = cluster.client();
        c.mkdir("/big", 0o755).await.unwrap();
        let files = names("f", 60_000);
        let made = c
            .batch(plusfs_proto::BatchOp::Create { exclusive: true }, "/big", &files, 0o644, Semantics::PerformAll)
            .await
            .unwrap();
        assert!(made.iter().all(|o| matches!(o, plusfs_client::Outcome::Done(_))));
        let primary = c.home("/big");
        let victim =
            if kill_primary { primary } else { cluster.cluster.ids().into_iter().find(|&s| s != primary).unwrap() };
        let distributing = {
            let c = cluster.client();
            tokio::spawn(async move { c.set_policy("/big", Some(Threshold::Entries(0)), None).await })
        };
        // Kill as soon as the primary has recorded `Distributing`.
        let deadline = Instant::now() + Duration::from_secs(20);
        while c.distribution("/big").await.map(|d| d.state) != Ok(DistState::Distributing) {
            assert!(Instant::now() < deadline, "the distribution never started");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        cluster.cluster.kill(victim).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.cluster.start(victim).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
        let answered = distributing.await.unwrap();
        if !kill_primary {
            // The primary retried the dead storing server until it came back.
            assert_eq!(answered.unwrap().state, DistState::Distributed);
        }
        let d = wait_distributed(&c, "/big").await;
        assert_eq!(d.state, DistState::Distributed, "primary killed: {kill_primary}");
        assert_eq!(d.entries.iter().map(|e| e.1).sum::<u64>(), 60_000);
        let got = listing(&cluster.client(), "/big").await;
        assert_eq!(got, files.iter().cloned().collect::<BTreeSet<_>>(), "primary killed: {kill_primary}");
        cluster.assert_fsck_clean();
        let log = std::fs::read_to_string(cluster.cluster.data().join(format!("server-{primary}.log"))).unwrap();
        let sign = if kill_primary { "resuming an interrupted redistribution" } else { "retrying" };
        assert!(log.contains(sign), "the kill did not land during the redistribution:\n{log}");
    }
}
