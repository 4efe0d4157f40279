//! The test kit's shared scenarios on real server processes (the same scenarios run on the
//! in-process cluster in `plusfs-testcluster`'s `kit.rs`).

mod common;

use common::ProcCluster;
use plusfs_testcluster::kit::scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_crash_and_restart_keep_what_was_acknowledged() {
    let mut cluster = ProcCluster::start(3);
    let n = scenarios::crash_and_restart_keep_what_was_acknowledged(&mut cluster).await.unwrap();
    assert!(n >= 48, "{n} operations acknowledged");
    cluster.assert_fsck_clean();
}
