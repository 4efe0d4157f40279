//! Failpoints on the in-process cluster: a server paused in the middle of a step, and a
//! server crashed at each step of the cross-server protocols. Each test checks that the
//! fault landed while the operation was in flight.

use plusfs_client::{fsck, Client};
use plusfs_placement::TxnProtocol;
use plusfs_proto::Errno;
use plusfs_testcluster::cross_server_name;
use plusfs_testcluster::{FailAction, FailStep, Options, TestCluster};
use std::time::Duration;

async fn start(protocol: TxnProtocol) -> TestCluster {
    TestCluster::start(Options { servers: 3, protocol, ..Options::default() }).await.expect("cluster starts")
}

async fn assert_consistent(cluster: &TestCluster, c: &Client) {
    assert!(cluster.settle(Duration::from_secs(20)).await, "operations still pending");
    let scans = fsck::scan_settled(c, Duration::from_secs(10)).await.unwrap();
    let problems = fsck::check(c, &scans);
    assert!(problems.is_empty(), "fsck: {problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cx_participant_holds_its_operation_until_released() {
    let cluster = start(TxnProtocol::Cx).await;
    let (a, b) = (cluster.client(), cluster.client());
    let (p, _, participant) = cross_server_name(&a, "d");
    let fp = cluster.failpoint(participant, FailStep::CxAfterResult, FailAction::Pause);
    let mkdir = {
        let (a, p) = (a.clone(), p.clone());
        tokio::spawn(async move { a.mkdir(&p, 0o755).await })
    };
    tokio::time::timeout(Duration::from_secs(10), fp.reached()).await.expect("the participant reached the step");
    // Paused after logging its Result record, before answering: the mkdir is in flight.
    assert_eq!(fp.hits(), 1);
    assert!(!mkdir.is_finished(), "the mkdir answered while its participant was paused");
    // Another client's listing of `/` does not wait for it and does not show a directory
    // whose creation nobody has acknowledged yet without its object.
    let listed = b.readdir("/").await.unwrap();
    if listed.iter().any(|e| format!("/{}", e.name) == p) {
        b.lstat(&p).await.expect("a listed directory has its object");
    }
    fp.release();
    mkdir.await.unwrap().expect("the mkdir succeeds once released");
    assert!(b.lstat(&p).await.is_ok(), "visible to another client after the answer");
    assert_consistent(&cluster, &b).await;
}

/// A coordinator's VOTE that reaches the participant before the operation's `CxExec` is
/// entered there (the participant votes NO: never reached) makes that `CxExec` answer NO,
/// never YES: the operation is aborted, so its client must not be told it succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_that_overtakes_a_cx_exec_makes_it_answer_no() {
    let cluster = start(TxnProtocol::Cx).await;
    let a = cluster.client();
    let (p, coordinator, participant) = cross_server_name(&a, "v");
    let fp = cluster.failpoint(participant, FailStep::CxExecBeforeInsert, FailAction::Pause);
    let mkdir = {
        let (a, p) = (a.clone(), p.clone());
        tokio::spawn(async move { a.mkdir(&p, 0o755).await })
    };
    tokio::time::timeout(Duration::from_secs(10), fp.reached()).await.expect("the participant reached the step");
    // The coordinator answered YES and commits on its timer: its VOTE finds nothing at the
    // participant, which votes NO, and the coordinator aborts.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a.server_status(coordinator).await.unwrap().cx_aborted == 0 {
        assert!(std::time::Instant::now() < deadline, "the coordinator never aborted the paused operation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!mkdir.is_finished(), "the mkdir answered while its participant was paused");
    fp.release();
    let answer = tokio::time::timeout(Duration::from_secs(30), mkdir).await.expect("an answer").unwrap();
    assert_consistent(&cluster, &a).await;
    let exists = a.lstat(&p).await.is_ok();
    match answer {
        Ok(_) => assert!(exists, "mkdir answered OK but {p} does not exist"),
        Err(e) => assert!(!exists, "mkdir failed ({e}) but {p} exists"),
    }
}

/// Crashes the server of `point` while a cross-server mkdir (`mkdir`) or rename runs under
/// `protocol`, restarts it, and checks the operation is all-or-nothing, and done if it was
/// acknowledged.
async fn crash_at(protocol: TxnProtocol, point: FailStep, on_participant: bool) {
    let cluster = start(protocol).await;
    let c = cluster.client();
    let (p, coordinator, participant) = cross_server_name(&c, "x");
    let victim = if on_participant { participant } else { coordinator };
    let fp = cluster.failpoint(victim, point, FailAction::Crash);
    let cluster = std::sync::Arc::new(cluster);
    // A supervisor: restarts the server once it has crashed (the operation may wait for it;
    // steps of the lazy commitment come after the answer).
    let supervisor = {
        let (cluster, fp) = (cluster.clone(), fp.clone());
        tokio::spawn(async move {
            fp.reached().await;
            cluster.disarm(victim, fp.step());
            tokio::time::sleep(Duration::from_millis(50)).await;
            cluster.restart(victim).await.unwrap();
        })
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), c.mkdir(&p, 0o755))
        .await
        .unwrap_or_else(|_| panic!("{point}: no answer"));
    tokio::time::timeout(Duration::from_secs(30), supervisor)
        .await
        .unwrap_or_else(|_| panic!("{point} was never reached"))
        .unwrap();
    assert_eq!(fp.hits(), 1, "{point} was reached once");
    assert_eq!(cluster.crashes(victim), 1, "server {victim} crashed at {point}");
    assert_consistent(&cluster, &c).await;
    let exists = match c.lstat(&p).await {
        Ok(_) => true,
        Err(e) if e.errno == Errno::ENOENT => false,
        Err(e) => panic!("stat {p}: {e}"),
    };
    if answer.is_ok() {
        assert!(exists, "{point}: an acknowledged mkdir was lost");
    }
    // Whatever happened, the name can be used again.
    if exists {
        c.rmdir(&p).await.unwrap();
    } else {
        c.mkdir(&p, 0o755).await.unwrap();
    }
    assert_consistent(&cluster, &c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_two_phase_commit_step_is_all_or_nothing() {
    crash_at(TxnProtocol::TwoPhase, FailStep::CoordinatorAfterVotes, false).await;
    crash_at(TxnProtocol::TwoPhase, FailStep::CoordinatorAfterCommitRecord, false).await;
    crash_at(TxnProtocol::TwoPhase, FailStep::ParticipantAfterPrepareRecord, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_cx_step_is_all_or_nothing() {
    crash_at(TxnProtocol::Cx, FailStep::CxAfterResult, true).await;
    crash_at(TxnProtocol::Cx, FailStep::CxAfterResult, false).await;
    crash_at(TxnProtocol::Cx, FailStep::CxBeforeVote, false).await;
    crash_at(TxnProtocol::Cx, FailStep::CxAfterVote, true).await;
    crash_at(TxnProtocol::Cx, FailStep::CxAfterCommitRecord, false).await;
}

/// A rename onto a directory whose redistribution is under way: the rename prepares on
/// every server, and a storing server's `ShardImport` waits for the transaction lock it
/// takes there. The primary must not hold the directory's busy lock meanwhile (the
/// rename's prepare on the primary would wait for it, and the redistribution for the
/// rename: a deadlock). The rename waits for the distribution instead, then replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_onto_a_directory_being_distributed_waits_for_it() {
    let cluster = start(TxnProtocol::TwoPhase).await;
    let (a, b) = (cluster.client(), cluster.client());
    a.mkdir("/src", 0o755).await.unwrap();
    let big = "/big";
    let fp = cluster.failpoint(a.home(big), FailStep::DistributeAfterIntent, FailAction::Pause);
    // Distributed from creation: the mkdir answers once its home has distributed it.
    let mkdir = {
        let a = a.clone();
        tokio::spawn(async move { a.mkdir_with(big, 0o755, plusfs_proto::Threshold::Entries(0), 0).await })
    };
    tokio::time::timeout(Duration::from_secs(10), fp.reached()).await.expect("the primary reached the step");
    let rename = tokio::spawn(async move { b.rename("/src", big).await });
    // Time for the rename to prepare on the storing servers (locking the path there).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!rename.is_finished(), "the rename did not wait for the distribution");
    fp.release();
    let limit = Duration::from_secs(20);
    tokio::time::timeout(limit, mkdir).await.expect("the distribution finishes").unwrap().unwrap();
    tokio::time::timeout(limit, rename).await.expect("the rename finishes").unwrap().unwrap();
    assert_eq!(a.lstat("/src").await.unwrap_err().errno, Errno::ENOENT);
    a.lstat(big).await.unwrap();
    assert_consistent(&cluster, &a).await;
}

/// A rename of a file that a write is committing: the rename reads the source entry before
/// it locks anything, then waits for the write. The moved entry must be the file as the
/// write left it — not the copy read before, which names the data record the write dropped
/// (fsck: a file naming a record its server does not hold; the write lost). Within one
/// directory (one server, one batch) and across servers (two-phase commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_racing_a_write_moves_the_file_as_written() {
    for protocol in [TxnProtocol::TwoPhase, TxnProtocol::Cx, TxnProtocol::Serial] {
        rename_racing_a_write(protocol).await;
    }
}

async fn rename_racing_a_write(protocol: TxnProtocol) {
    let cluster = start(protocol).await;
    let opts = || plusfs_client::ClientOptions { delegations: false, ..Default::default() };
    let (w, r) = (cluster.client_with(opts()), cluster.client_with(opts()));
    let (other, _, elsewhere) = cross_server_name(&w, "o");
    w.mkdir(&other, 0o755).await.unwrap();
    let dir = (0..).map(|i| format!("/d{i}")).find(|d| w.home(d) != elsewhere).unwrap();
    w.mkdir(&dir, 0o755).await.unwrap();
    let home = w.home(&dir);
    for (i, dst) in [format!("{dir}/b"), format!("{other}/b")].into_iter().enumerate() {
        let src = format!("{dir}/a{i}");
        w.create(&src, 0o644, true).await.unwrap();
        w.write(&src, 0, b"before").await.unwrap();
        let fp = cluster.failpoint(home, FailStep::DataAfterAppend, FailAction::Pause);
        let write = {
            let (w, src) = (w.clone(), src.clone());
            tokio::spawn(async move { w.write(&src, 0, b"after!").await })
        };
        tokio::time::timeout(Duration::from_secs(10), fp.reached()).await.expect("the write reached its commit");
        let rename = {
            let (r, src, dst) = (r.clone(), src.clone(), dst.clone());
            tokio::spawn(async move { r.rename(&src, &dst).await })
        };
        // The rename has read the source and waits for the write's lock.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!rename.is_finished(), "the rename did not wait for the write");
        cluster.disarm(home, FailStep::DataAfterAppend);
        write.await.unwrap().expect("the write");
        rename.await.unwrap().expect("the rename");
        assert_eq!(r.read_all(&dst).await.expect("the moved file reads"), b"after!", "{protocol:?}: {src} -> {dst}");
        assert_consistent(&cluster, &r).await;
    }
}
