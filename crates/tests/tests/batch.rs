//! Batch operations end to end on a real cluster: per-entry results in the caller's order,
//! request counts, semantics, and bad input.

mod common;

use common::ProcCluster;
use plusfs_client::{OpenFlags, Outcome};
use plusfs_proto::{BatchOp, Errno, FileKind, Semantics};

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

const CREATE: OpenFlags = OpenFlags { create: true, exclusive: true, truncate: false, append: false, access: 0 };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_creates_travel_in_few_requests() {
    // Never distributed, so every entry stays on the directory's home (huge directories
    // are covered by tests/hugedirs.rs).
    let cluster = ProcCluster::start_hugedirs(4, None);
    let c = cluster.client();
    c.mkdir("/d", 0o755).await.unwrap();
    let files = names("f", 20_000);
    let before = c.counters();
    let fds = c.openv("/d", &files, CREATE, 0o640, Semantics::PerformAll).await.unwrap();
    let used = c.counters() - before;
    assert!(fds.iter().all(|r| r.is_ok()));
    // max_batch 4096: 20,000 entries are cut into 5 requests, one reply each.
    assert_eq!((used.requests, used.msgs_out, used.msgs_in), (5, 5, 5), "{used:?}");
    let fds: Vec<i32> = fds.into_iter().map(|r| r.unwrap()).collect();
    assert!(c.closev(&fds, Semantics::PerformAll).await.iter().all(|r| r.is_ok()));

    let st = c.statv("/d", &files, Semantics::PerformAll).await.unwrap();
    assert!(st.iter().all(|a| matches!(a, Ok(a) if a.kind == FileKind::File && a.mode == 0o640)));
    let inos: std::collections::HashSet<u64> = st.iter().map(|a| a.as_ref().unwrap().ino).collect();
    assert_eq!(inos.len(), files.len(), "inode numbers are unique");
    assert_eq!(c.lstat("/d").await.unwrap().size, 20_000);

    let gone = c.unlinkv("/d", &files, Semantics::PerformAll).await.unwrap();
    assert!(gone.iter().all(|r| r.is_ok()));
    assert_eq!(c.lstat("/d").await.unwrap().size, 0);
    let status = c.server_status(c.home("/d")).await.unwrap();
    // One store batch per request, not per entry.
    assert!(status.store_batches < 100, "{status:?}");
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_entry_results_in_caller_order() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.mkdir("/d", 0o755).await.unwrap();
    c.mkdir("/d/sub", 0o700).await.unwrap();
    c.create("/d/existing", 0o644, true).await.unwrap();
    let batch: Vec<String> =
        ["a", "existing", "a", "bad/name", "", "b", "sub", &"x".repeat(256)].iter().map(|s| s.to_string()).collect();
    let out = c.batch(BatchOp::Create { exclusive: true }, "/d", &batch, 0o644, Semantics::PerformAll).await.unwrap();
    let errs: Vec<Option<Errno>> =
        out.iter().map(|o| if let Outcome::Failed(e) = o { Some(*e) } else { None }).collect();
    assert_eq!(
        errs,
        vec![
            None,
            Some(Errno::EEXIST),
            Some(Errno::EEXIST), // duplicate within the batch
            Some(Errno::EINVAL),
            Some(Errno::EINVAL),
            None,
            Some(Errno::EEXIST),
            Some(Errno::ENAMETOOLONG),
        ]
    );

    // statv of files and a subdirectory (whose attributes come from its own object).
    let st = c.statv("/d", &["sub".into(), "a".into(), "nope".into()], Semantics::PerformAll).await.unwrap();
    assert_eq!(st[0].as_ref().unwrap().mode, 0o700);
    assert_eq!(st[0].as_ref().unwrap().kind, FileKind::Dir);
    assert_eq!(st[1].as_ref().unwrap().kind, FileKind::File);
    assert_eq!(st[2], Err(Errno::ENOENT));

    // stop-on-failure: entries after the first failure are not performed.
    let list: Vec<String> = ["c", "existing", "d"].iter().map(|s| s.to_string()).collect();
    let out = c.openv("/d", &list, CREATE, 0o644, Semantics::StopOnFailure).await.unwrap();
    assert!(out[0].is_ok());
    assert_eq!(out[1], Err(Errno::EEXIST));
    assert_eq!(out[2], Err(Errno::ECANCELED));
    assert_eq!(c.lstat("/d/d").await.unwrap_err().errno, Errno::ENOENT);

    // unlinkv: a directory and a missing name fail, the rest go.
    let out = c
        .unlinkv("/d", &["a".into(), "sub".into(), "zz".into(), "b".into(), "a".into()], Semantics::PerformAll)
        .await
        .unwrap();
    assert_eq!(out, vec![Ok(()), Err(Errno::EISDIR), Err(Errno::ENOENT), Ok(()), Err(Errno::ENOENT)]);

    // Empty batches are fine and cost nothing.
    let before = c.counters();
    assert!(c.statv("/d", &[], Semantics::PerformAll).await.unwrap().is_empty());
    assert_eq!((c.counters() - before).requests, 0);

    // closev: unknown descriptors get EBADF, known ones close once.
    let fd = c.open_fd("/d/existing", OpenFlags::default(), 0).await.unwrap();
    assert_eq!(c.closev(&[fd, 999, fd], Semantics::PerformAll).await, vec![Ok(()), Err(Errno::EBADF), Ok(())]);
    assert_eq!(c.closev(&[fd], Semantics::PerformAll).await, vec![Err(Errno::EBADF)]);

    // The directory itself: missing, or not a directory.
    assert_eq!(c.statv("/nope", &["a".into()], Semantics::PerformAll).await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(c.statv("/d/existing", &["a".into()], Semantics::PerformAll).await.unwrap_err().errno, Errno::ENOTDIR);

    // mkdirv: objects land on their home servers; fsck agrees.
    let dirs = names("m", 40);
    let before = c.server_status(c.home("/d")).await.unwrap().tx_started;
    let out = c.mkdirv("/d", &dirs, 0o755, Semantics::PerformAll).await.unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    let after = c.server_status(c.home("/d")).await.unwrap().tx_started;
    assert_eq!(after - before, 1, "a perform-all mkdirv is one transaction");
    let again = c.mkdirv("/d", &dirs[..2], 0o755, Semantics::PerformAll).await.unwrap();
    assert!(again.iter().all(|r| *r == Err(Errno::EEXIST)));
    assert_eq!(c.lstat("/d").await.unwrap().nlink, 2 + 41);
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_the_maximum_are_cut_not_rejected() {
    let cluster = ProcCluster::start(2);
    let c = plusfs_client::Client::new(
        cluster.cluster.map().clone(),
        plusfs_client::ClientOptions { max_batch: 100, ..Default::default() },
    );
    c.mkdir("/d", 0o755).await.unwrap();
    let files = names("f", 1050);
    let before = c.counters();
    let out = c.openv("/d", &files, CREATE, 0o644, Semantics::StopOnFailure).await.unwrap();
    assert!(out.iter().all(|r| r.is_ok()));
    assert_eq!((c.counters() - before).requests, 11);
    // stop-on-failure across cut requests: a failure in the 3rd request stops the rest.
    c.unlink("/d/f250").await.unwrap();
    let out = c.unlinkv("/d", &files, Semantics::StopOnFailure).await.unwrap();
    assert!(out[..250].iter().all(|r| r.is_ok()));
    assert_eq!(out[250], Err(Errno::ENOENT));
    assert!(out[251..].iter().all(|r| *r == Err(Errno::ECANCELED)));
    assert_eq!(c.lstat("/d").await.unwrap().size, 1050 - 251);
}
