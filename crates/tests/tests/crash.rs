//! Crash safety: kill -9 servers in the middle of a mkdir/rename workload, restart them,
//! then every acknowledged operation must be there and fsck must find the namespace clean.

mod common;

use common::ProcCluster;
use plusfs_proto::{Errno, FileKind};
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Default, Debug, Clone, Copy)]
struct Acks {
    mkdir: Option<bool>,
    sub: Option<bool>,
    rename: Option<Result<(), Errno>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_loses_nothing_acknowledged() {
    let mut cluster = ProcCluster::start(4);
    let c = cluster.client();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let workload = tokio::spawn(async move {
        let mut acks: HashMap<usize, Acks> = HashMap::new();
        // When each operation started and ended, and whether it succeeded.
        let mut spans: Vec<(Instant, Instant, bool)> = Vec::new();
        let mut i = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) && i < 5000 {
            let a = acks.entry(i).or_default();
            let t = Instant::now();
            a.mkdir = Some(c.mkdir(&format!("/d{i}"), 0o755).await.is_ok());
            spans.push((t, Instant::now(), a.mkdir == Some(true)));
            let t = Instant::now();
            a.sub = Some(c.mkdir(&format!("/d{i}/s"), 0o755).await.is_ok());
            spans.push((t, Instant::now(), a.sub == Some(true)));
            let t = Instant::now();
            a.rename = Some(c.rename(&format!("/d{i}"), &format!("/r{i}")).await.map_err(|e| e.errno));
            spans.push((t, Instant::now(), matches!(a.rename, Some(Ok(())))));
            i += 1;
        }
        (acks, spans)
    });
    // When each victim was killed and when its new process was started.
    let mut downtimes = Vec::new();
    for victim in [1u32, 2, 0] {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let killed = Instant::now();
        cluster.cluster.kill(victim).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let restarted = Instant::now();
        cluster.cluster.start(victim).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
        downtimes.push((victim, killed, restarted));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acks, spans) = workload.await.unwrap();
    assert!(acks.len() > 20, "workload made too little progress: {}", acks.len());
    let failed = acks.values().filter(|a| a.mkdir == Some(false) || matches!(a.rename, Some(Err(_)))).count();
    eprintln!("{} iterations, {failed} with a failed step (servers were down)", acks.len());
    // Each kill hit the workload: an operation in flight while the victim was down failed,
    // or waited at least half the downtime (the client resends to a restarted server);
    // operations on live servers take milliseconds.
    for (victim, killed, restarted) in downtimes {
        let met = spans.iter().any(|&(start, end, ok)| {
            start <= restarted && end > killed && (!ok || end - start >= Duration::from_millis(150))
        });
        assert!(met, "no operation met killed server {victim}: the test did not test crashes");
    }
    cluster.assert_fsck_clean();
    let c = cluster.client();
    let mut checked = 0;
    for (i, a) in &acks {
        let home = common::renamed_dir_home(&c, *i, a.mkdir == Some(true), a.rename).await;
        if let (Some(h), Some(true)) = (home, a.sub) {
            assert_eq!(common::kind_of(&c, &format!("/{h}{i}/s")).await, Some(FileKind::Dir), "/{h}{i}/s acknowledged");
            checked += 1;
        }
    }
    assert!(checked > 10, "too few acknowledged subdirectories checked: {checked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_restart_keeps_everything() {
    let mut cluster = ProcCluster::start(4);
    let c = cluster.client();
    for i in 0..50 {
        c.mkdir(&format!("/k{i}"), 0o700).await.unwrap();
        c.create(&format!("/k{i}/f"), 0o600, true).await.unwrap();
    }
    cluster.cluster.shutdown().unwrap();
    for id in cluster.cluster.ids() {
        cluster.cluster.start(id).unwrap();
    }
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let c = cluster.client();
    for i in 0..50 {
        assert_eq!(c.lstat(&format!("/k{i}")).await.unwrap().mode, 0o700);
        assert_eq!(c.lstat(&format!("/k{i}/f")).await.unwrap().kind, FileKind::File);
    }
    // New inode numbers never reuse old ones after a restart.
    let old = c.lstat("/k0/f").await.unwrap().ino;
    let new = c.create("/k0/g", 0o600, true).await.unwrap().ino;
    assert_ne!(old, new);
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_always_shares_fsyncs_between_concurrent_requests() {
    let cluster = ProcCluster::start_with(1, plusfs_placement::SyncMode::Always);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            c.mkdir(&format!("/g{t}"), 0o755).await.unwrap();
            for i in 0..100 {
                c.create(&format!("/g{t}/f{i}"), 0o644, true).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = cluster.client().server_status(0).await.unwrap();
    eprintln!("batches {} writes {} fsyncs {}", st.store_batches, st.store_writes, st.store_syncs);
    assert!(st.store_batches >= 808, "{st:?}");
    assert!(st.store_syncs < st.store_batches, "no fsync was shared: {st:?}");
    assert_eq!(st.store_syncs, st.store_writes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnects_and_resends_idempotent_requests() {
    let mut cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.mkdir("/r", 0o755).await.unwrap();
    c.create("/r/f", 0o644, true).await.unwrap();
    let home = c.home("/r");
    cluster.cluster.kill(home).unwrap();
    // A stat while the server is down is retried with back-off until it is back.
    let c2 = c.clone();
    let stat = tokio::spawn(async move { c2.lstat("/r/f").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.cluster.start(home).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    assert_eq!(stat.await.unwrap().unwrap().kind, FileKind::File);
    assert!(c.counters().retries > 0);
    // The same client keeps working on its new connection.
    c.create("/r/g", 0o644, true).await.unwrap();
    assert_eq!(c.readdir("/r").await.unwrap().len(), 2);
}
