//! Two-phase commit recovery at its critical points: a server process aborts (failpoint,
//! like kill -9) at a chosen step of a cross-server mkdir, is restarted, and the cluster
//! must finish or undo the operation by itself: fsck clean, the name usable again. These
//! clusters run mkdir with two-phase commit; `cx.rs` has the Cx failpoints.

mod common;

use common::ProcCluster;
use plusfs_client::Client;
use plusfs_placement::TxnProtocol;
use plusfs_proto::Errno;
use plusfs_testcluster::cross_server_name;
use std::time::{Duration, Instant};

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

async fn eventually_exists(c: &Client, p: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if c.lstat(p).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_dies_after_logging_commit_and_finishes_on_restart() {
    let mut cluster = ProcCluster::start_protocol(3, TxnProtocol::TwoPhase);
    let c = cluster.client();
    let (p, coordinator, _) = cross_server_name(&c, "a");
    crash_with(&mut cluster, coordinator, "coordinator_after_commit_record");
    assert!(c.mkdir(&p, 0o755).await.is_err(), "the coordinator died before answering");
    restart(&mut cluster, coordinator);
    assert!(eventually_exists(&c, &p).await, "the logged decision is carried out after restart");
    c.create(&format!("{p}/f"), 0o644, true).await.unwrap();
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_dies_before_deciding_and_aborts_on_restart() {
    let mut cluster = ProcCluster::start_protocol(3, TxnProtocol::TwoPhase);
    let c = cluster.client();
    let (p, coordinator, _) = cross_server_name(&c, "b");
    crash_with(&mut cluster, coordinator, "coordinator_after_votes");
    assert!(c.mkdir(&p, 0o755).await.is_err());
    restart(&mut cluster, coordinator);
    // Presumed abort: the participant's prepared object is dropped and its lock released,
    // so the same mkdir succeeds now (it would wait or fail while the lock was held).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match c.mkdir(&p, 0o755).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline && e.errno != Errno::EEXIST => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("mkdir after recovery: {e}"),
        }
    }
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_dies_after_preparing_and_releases_on_restart() {
    let mut cluster = ProcCluster::start_protocol(3, TxnProtocol::TwoPhase);
    let c = cluster.client();
    let (p, _, participant) = cross_server_name(&c, "c");
    crash_with(&mut cluster, participant, "participant_after_prepare_record");
    assert!(c.mkdir(&p, 0o755).await.is_err(), "a participant that vanished is a NO");
    assert_eq!(c.lstat(&p).await.unwrap_err().errno, Errno::ENOENT, "nothing half-done is visible");
    restart(&mut cluster, participant);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match c.mkdir(&p, 0o755).await {
            Ok(_) => break,
            // Until the participant is back and the abort delivered, its lock holds the name.
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("mkdir after recovery: {e}"),
        }
    }
    cluster.assert_fsck_clean();
}
