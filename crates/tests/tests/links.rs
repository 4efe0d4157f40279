//! Hard links on real multi-process clusters: link counts across directories and servers,
//! one file seen through every name, renames over links, concurrent link/unlink, the
//! errors POSIX gives, and a server killed in the middle of a link transaction.

mod common;

use common::ProcCluster;
use plusfs_client::Client;
use plusfs_proto::{Errno, Semantics, ServerId};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Two directories under `/` whose homes are different servers, both made.
async fn dirs_on_two_servers(c: &Client) -> (String, String) {
    let first = "/d0".to_string();
    let second = (1..).map(|i| format!("/d{i}")).find(|p| c.home(p) != c.home(&first)).expect("another home");
    c.mkdir(&first, 0o755).await.unwrap();
    c.mkdir(&second, 0o755).await.unwrap();
    (first, second)
}

async fn nlink(c: &Client, p: &str) -> u32 {
    c.lstat(p).await.unwrap().nlink
}

async fn errno(r: Result<plusfs_proto::Attr, plusfs_client::FsError>) -> Errno {
    r.expect_err("must fail").errno
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_file_under_names_in_directories_on_different_servers() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    let (a, b) = dirs_on_two_servers(&c).await;
    let f = format!("{a}/f");
    let g = format!("{b}/g");
    c.create(&f, 0o640, true).await.unwrap();
    c.write(&f, 0, b"first contents").await.unwrap();
    let attr = c.link(&f, &g).await.unwrap();
    assert_eq!(attr.nlink, 2);
    assert_eq!(c.lstat(&f).await.unwrap().ino, c.lstat(&g).await.unwrap().ino);
    assert_eq!(nlink(&c, &f).await, 2);

    // Contents, attributes and extended attributes are the file's, whichever name is used.
    c.write(&g, 6, b"CONTENTS").await.unwrap();
    assert_eq!(c.read_all(&f).await.unwrap(), b"first CONTENTS");
    c.chmod(&f, 0o600).await.unwrap();
    assert_eq!(c.lstat(&g).await.unwrap().mode & 0o7777, 0o600);
    c.setxattr(&g, "user.k", b"v", false, false).await.unwrap();
    assert_eq!(c.getxattr(&f, "user.k").await.unwrap(), b"v");
    c.truncate(&f, 5).await.unwrap();
    assert_eq!(c.lstat(&g).await.unwrap().size, 5);

    // A third name in the same directory as the second; batch stat sees the shared inode.
    let h = format!("{b}/h");
    c.link(&g, &h).await.unwrap();
    assert_eq!(nlink(&c, &f).await, 3);
    let names = vec!["g".to_string(), "h".to_string()];
    let listed = c.statv(&b, &names, Semantics::PerformAll).await.unwrap();
    assert!(listed.iter().all(|a| a.as_ref().is_ok_and(|a| a.nlink == 3 && a.size == 5)), "statv: {listed:?}");

    // Names go one by one; the file stays whole until the last.
    c.unlink(&f).await.unwrap();
    assert_eq!(nlink(&c, &g).await, 2);
    assert_eq!(c.read_all(&h).await.unwrap(), b"first");
    c.rename(&g, &format!("{a}/moved")).await.unwrap();
    assert_eq!(c.read_all(&format!("{a}/moved")).await.unwrap(), b"first");
    assert_eq!(nlink(&c, &h).await, 2);
    cluster.assert_fsck_clean();
    let records_before: u64 = records(&c, &cluster.cluster.ids()).await;
    c.unlink(&format!("{a}/moved")).await.unwrap();
    c.unlink(&h).await.unwrap();
    assert_eq!(c.lstat(&h).await.unwrap_err().errno, Errno::ENOENT);
    assert!(records(&c, &cluster.cluster.ids()).await < records_before, "the last unlink drops the data");
    cluster.assert_fsck_clean();
}

async fn records(c: &Client, ids: &[ServerId]) -> u64 {
    let mut n = 0;
    for id in ids {
        n += c.server_status(*id).await.unwrap().data_records;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_errors_are_the_posix_ones() {
    let cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.mkdir("/dir", 0o755).await.unwrap();
    c.create("/f", 0o644, true).await.unwrap();
    c.create("/other", 0o644, true).await.unwrap();
    assert_eq!(errno(c.link("/dir", "/dir2").await).await, Errno::EPERM);
    assert_eq!(errno(c.link("/f", "/other").await).await, Errno::EEXIST);
    assert_eq!(errno(c.link("/f", "/dir").await).await, Errno::EEXIST);
    assert_eq!(errno(c.link("/missing", "/x").await).await, Errno::ENOENT);
    assert_eq!(errno(c.link("/f", "/nodir/x").await).await, Errno::ENOENT);
    assert_eq!(errno(c.link("/f", "/f/x").await).await, Errno::ENOTDIR);
    assert_eq!(errno(c.link("/f", &format!("/{}", "n".repeat(300))).await).await, Errno::ENAMETOOLONG);
    // Symlinks are linked themselves, not followed.
    c.symlink("/f", "/sl").await.unwrap();
    c.link("/sl", "/sl2").await.unwrap();
    assert_eq!(c.readlink("/sl2").await.unwrap(), "/f");
    assert_eq!(nlink(&c, "/sl").await, 2);
    assert_eq!(nlink(&c, "/f").await, 1, "failed links changed nothing");
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_over_links_keep_counts_right() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    let (a, b) = dirs_on_two_servers(&c).await;
    let f = format!("{a}/f");
    let g = format!("{b}/g");
    c.create(&f, 0o644, true).await.unwrap();
    c.write(&f, 0, b"data").await.unwrap();
    c.link(&f, &g).await.unwrap();
    // Renaming one name over another name of the same file does nothing.
    c.rename(&f, &g).await.unwrap();
    assert_eq!(nlink(&c, &f).await, 2);
    assert_eq!(nlink(&c, &g).await, 2);
    // A plain file renamed over a link: the link's file loses a name.
    let h = format!("{a}/h");
    c.create(&h, 0o644, true).await.unwrap();
    c.write(&h, 0, b"other").await.unwrap();
    c.rename(&h, &g).await.unwrap();
    assert_eq!(c.read_all(&g).await.unwrap(), b"other");
    assert_eq!(nlink(&c, &f).await, 1);
    assert_eq!(nlink(&c, &g).await, 1);
    // A link renamed over a plain file: the plain file's data goes.
    let k = format!("{b}/k");
    c.link(&f, &k).await.unwrap();
    c.rename(&k, &g).await.unwrap();
    assert_eq!(c.read_all(&g).await.unwrap(), b"data");
    assert_eq!(nlink(&c, &f).await, 2);
    // A directory cannot replace a link, nor a link a directory.
    c.mkdir(&format!("{a}/sub"), 0o755).await.unwrap();
    assert_eq!(c.rename(&format!("{a}/sub"), &g).await.unwrap_err().errno, Errno::ENOTDIR);
    assert_eq!(c.rename(&g, &format!("{a}/sub")).await.unwrap_err().errno, Errno::EISDIR);
    // Batch unlink of a directory with links in it.
    c.link(&f, &format!("{b}/l1")).await.unwrap();
    let names: Vec<String> = c.readdir(&b).await.unwrap().into_iter().map(|e| e.name).collect();
    let r = c.unlinkv(&b, &names, Semantics::PerformAll).await.unwrap();
    assert!(r.iter().all(|e| e.is_ok()), "unlinkv: {r:?}");
    assert_eq!(nlink(&c, &f).await, 1);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_links_and_unlinks_from_several_clients() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    let (a, b) = dirs_on_two_servers(&c).await;
    let f = format!("{a}/f");
    c.create(&f, 0o644, true).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..4 {
        let c = cluster.client();
        let (f, a, b) = (f.clone(), a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let dir = if i % 2 == 0 { &a } else { &b };
                let name = format!("{dir}/l{t}_{i}");
                c.link(&f, &name).await.unwrap();
                if i % 3 == 0 {
                    c.unlink(&name).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 4 clients × 25 links, 9 of each client's removed again, plus the original name.
    let expected = 1 + 4 * (25 - 9);
    assert_eq!(nlink(&c, &f).await, expected);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_during_links_loses_nothing() {
    let mut cluster = ProcCluster::start(3);
    let c = cluster.client();
    let (a, b) = dirs_on_two_servers(&c).await;
    let f = format!("{a}/f");
    c.create(&f, 0o644, true).await.unwrap();
    c.write(&f, 0, b"kept").await.unwrap();
    c.link(&f, &format!("{b}/first")).await.unwrap();
    // The coordinator (the server of `f`'s entry) dies after the votes of a link.
    let coordinator = c.home(&a);
    cluster.cluster.stop(coordinator).unwrap();
    cluster.cluster.start_with_env(coordinator, &[("PLUSFS_FAILPOINT", "coordinator_after_votes")]).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    assert!(c.link(&f, &format!("{b}/second")).await.is_err(), "the coordinator died");
    cluster.cluster.kill(coordinator).unwrap();
    cluster.cluster.start(coordinator).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    // The participant released its locks once the restarted coordinator aborted.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while c.link(&f, &format!("{b}/third")).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "links work again after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.lstat(&format!("{b}/second")).await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(nlink(&c, &f).await, 3);
    assert_eq!(c.read_all(&format!("{b}/third")).await.unwrap(), b"kept");
    // kill -9 of the participant holding the new entries, during a stream of links.
    let participant = c.home(&b);
    let c2 = cluster.client();
    let (f2, b2) = (f.clone(), b.clone());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let made = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop2, made2) = (stop.clone(), made.clone());
    let storm = tokio::spawn(async move {
        let mut i = 0;
        while !stop2.load(Relaxed) {
            // Links in flight when the server dies fail (or wait for it); none may half-happen.
            if c2.link(&f2, &format!("{b2}/s{i}")).await.is_ok() {
                made2.fetch_add(1, Relaxed);
            }
            i += 1;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.cluster.kill(participant).unwrap();
    let at_kill = made.load(Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.cluster.start(participant).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Relaxed);
    storm.await.unwrap();
    assert!(at_kill > 0 && made.load(Relaxed) > at_kill, "links before and after the kill");
    cluster.assert_fsck_clean();
    let names = c.readdir(&b).await.unwrap().len() as u32;
    assert_eq!(nlink(&c, &f).await, names + 1, "one link per name, none lost or doubled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_exchange_swaps_files_atomically() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    let (a, b) = dirs_on_two_servers(&c).await;
    let (x, y) = (format!("{a}/x"), format!("{b}/y"));
    c.create(&x, 0o600, true).await.unwrap();
    c.write(&x, 0, b"from x").await.unwrap();
    c.create(&y, 0o644, true).await.unwrap();
    c.write(&y, 0, b"from y, longer").await.unwrap();
    let (ix, iy) = (c.lstat(&x).await.unwrap().ino, c.lstat(&y).await.unwrap().ino);
    c.exchange(&x, &y).await.unwrap();
    assert_eq!(c.read_all(&x).await.unwrap(), b"from y, longer");
    assert_eq!(c.read_all(&y).await.unwrap(), b"from x");
    assert_eq!((c.lstat(&x).await.unwrap().ino, c.lstat(&y).await.unwrap().ino), (iy, ix));
    assert_eq!(c.lstat(&y).await.unwrap().mode & 0o7777, 0o600, "attributes travel with the inode");
    // A hard link and a symlink in the same directory: counts unchanged.
    let (l, s) = (format!("{a}/l"), format!("{a}/s"));
    c.link(&y, &l).await.unwrap();
    c.symlink("target", &s).await.unwrap();
    c.exchange(&l, &s).await.unwrap();
    assert_eq!(c.readlink(&l).await.unwrap(), "target");
    assert_eq!(c.read_all(&s).await.unwrap(), b"from x");
    assert_eq!(nlink(&c, &y).await, 2);
    // Errors: a missing side, a directory.
    assert_eq!(c.exchange(&x, &format!("{b}/missing")).await.unwrap_err().errno, Errno::ENOENT);
    c.mkdir(&format!("{b}/dir"), 0o755).await.unwrap();
    assert_eq!(c.exchange(&x, &format!("{b}/dir")).await.unwrap_err().errno, Errno::EINVAL);
    assert_eq!(c.read_all(&x).await.unwrap(), b"from y, longer", "failed exchanges change nothing");
    cluster.assert_fsck_clean();
}
