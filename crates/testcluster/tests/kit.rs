//! The test kit's shared scenarios on the in-process cluster (the same scenarios run on
//! server processes in the integration tests' `kit.rs`).

use plusfs_testcluster::kit::scenarios;
use plusfs_testcluster::{Options, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_crash_and_restart_keep_what_was_acknowledged() {
    let mut cluster = TestCluster::start(Options { servers: 3, ..Default::default() }).await.expect("cluster");
    let n = scenarios::crash_and_restart_keep_what_was_acknowledged(&mut cluster).await.unwrap();
    assert_eq!(cluster.crashes(2), 1, "the kit crashed server 2 once");
    assert!(n >= 48, "{n} operations acknowledged");
}
