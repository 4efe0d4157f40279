//! Huge directories through a real mount: the work per create stays the same as the
//! directory grows past its distribution, a listing of hundreds of thousands of entries
//! matches the native one with the mount's memory bounded, and removing a huge directory
//! made elsewhere (`rm -rf`, Python's `shutil.rmtree`) costs few server requests.

mod common;
mod mounts;

use common::{rss_mib, ProcCluster};
use mounts::{fuse_available, Mount};
use plusfs_localcluster::ClusterSettings;
use plusfs_placement::{DelegSettings, HugedirSettings, ThresholdSetting};
use plusfs_proto::{BatchOp, DistState, Semantics};
use std::collections::BTreeSet;
use std::fs;
use std::time::Instant;

/// What the mount's control file says at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    /// Requests sent to the servers, all operations.
    requests: u64,
    /// Entries its write-backs looked at, delegations granted, entries and name
    /// digests the grants carried.
    visited: u64,
    grants: u64,
    granted: u64,
    written: u64,
}

fn sample(m: &Mount) -> Sample {
    let stats = m.stats();
    let words = |prefix: &str| -> Vec<String> {
        let line = stats.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no '{prefix}' in {stats}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    let total = words("total ");
    let work = words("delegation work ");
    assert_eq!((work[2].as_str(), work[4].as_str(), work[6].as_str()), ("visited", "grants", "granted"));
    Sample {
        requests: total[3].parse().unwrap(),
        visited: work[3].parse().unwrap(),
        grants: work[5].parse().unwrap(),
        granted: work[7].parse().unwrap(),
        written: m.delegated_written(),
    }
}

/// A cluster of 4 servers whose directories distribute past 8,000 entries and whose
/// delegations carry whole entry sets only up to 1,000 entries (larger shards are granted
/// with name digests).
fn cluster() -> ProcCluster {
    let hugedirs = HugedirSettings { threshold: ThresholdSetting::Entries(8_000), width: 0 };
    let delegations = DelegSettings { max_entries: 1_000, ..Default::default() };
    ProcCluster::start_settings(4, &ClusterSettings { hugedirs, delegations, ..Default::default() })
}

/// 50,000 creates in one directory through the mount, in windows of 10,000: once the
/// directory is distributed (past 8,000 entries), each window costs the same server
/// requests, grants and write-back work as the one before: nothing grows with the
/// directory.
#[test]
fn creates_cost_the_same_as_a_directory_grows_through_the_mount() {
    if !fuse_available() {
        return;
    }
    const WINDOW: usize = 10_000;
    let cluster = cluster();
    let m = Mount::new(&cluster);
    let dir = m.path().join("big");
    fs::create_dir(&dir).unwrap();
    let mut windows = Vec::new();
    let mut before = sample(&m);
    for w in 0..5 {
        let started = Instant::now();
        for i in w * WINDOW..(w + 1) * WINDOW {
            fs::File::create(dir.join(format!("file.{i}"))).unwrap();
        }
        let now = sample(&m);
        let d = Sample {
            requests: now.requests - before.requests,
            visited: now.visited - before.visited,
            grants: now.grants - before.grants,
            granted: now.granted - before.granted,
            written: now.written - before.written,
        };
        eprintln!("window {w}: {d:?}, {:.0} creates/s", WINDOW as f64 / started.elapsed().as_secs_f64());
        windows.push(d);
        before = now;
    }
    // The directory did distribute, over every server.
    let c = cluster.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dist = rt.block_on(c.distribution("/big")).unwrap();
    assert_eq!(dist.state, DistState::Distributed);
    assert_eq!(dist.set.len(), 4);
    // Shards grew past what a grant sends whole: later grants carried name digests.
    let total: u64 = windows.iter().map(|w| w.grants).sum();
    assert!(total >= 4, "the shards were delegated: {windows:?}");
    for (w, d) in windows.iter().enumerate().skip(1) {
        // A shard is granted once (a few times at most: a grant ends when idle), not
        // again and again: each grant of a large shard carries all its names.
        assert!(d.grants <= 8, "window {w}: {} grants: {windows:?}", d.grants);
        // Creates are answered by the mount and written back in batches.
        assert!(d.requests <= (WINDOW / 20) as u64, "window {w}: {} server requests", d.requests);
        // Write-backs look only at what changed.
        assert!(d.visited <= d.written + WINDOW as u64, "window {w}: visited {}", d.visited);
    }
    let (first, last) = (windows[1], windows[4]);
    assert!(last.requests <= first.requests * 2 + 50, "server requests grew: {windows:?}");
    // Every file is on the servers once the mount has written its work back.
    m.sync();
    let listed = rt.block_on(c.readdir("/big")).unwrap();
    assert_eq!(listed.len(), 5 * WINDOW);
    drop(m);
    cluster.assert_fsck_clean();
}

/// Creates files `{prefix}-000000`... (`n` of them) in `dir` through the native API, in
/// batches of 5,000.
async fn fill(c: &plusfs_client::Client, dir: &str, n: usize, prefix: &str) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(5_000) {
        let names: Vec<String> = chunk.iter().map(|i| format!("{prefix}-{i:06}")).collect();
        let done =
            c.batch(BatchOp::Create { exclusive: true }, dir, &names, 0o644, Semantics::PerformAll).await.unwrap();
        assert!(done.iter().all(|o| matches!(o, plusfs_client::Outcome::Done(_))), "{dir}");
    }
}

/// A directory of 200,000 entries (made through the native API) listed through the mount:
/// the same names as the native listing, each once, with the mount's memory bounded.
#[test]
fn a_listing_of_200000_entries_through_the_mount_matches_the_native_one() {
    if !fuse_available() {
        return;
    }
    const N: usize = 200_000;
    let cluster = cluster();
    let c = cluster.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        c.mkdir("/list", 0o755).await.unwrap();
        fill(&c, "/list", N, "entry").await;
    });
    let native: BTreeSet<String> = rt.block_on(c.readdir("/list")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(native.len(), N);
    let m = Mount::new(&cluster);
    let rss_before = rss_mib(m.pid);
    let started = Instant::now();
    let mut seen = BTreeSet::new();
    let mut peak = rss_before;
    for (i, e) in fs::read_dir(m.path().join("list")).unwrap().enumerate() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(seen.insert(name.clone()), "{name} listed twice");
        if i % 20_000 == 0 {
            peak = peak.max(rss_mib(m.pid));
        }
    }
    let took = started.elapsed();
    peak = peak.max(rss_mib(m.pid));
    eprintln!(
        "listed {} entries in {:.2} s ({:.0}/s); mount RSS {rss_before} MiB before, at most {peak} MiB while listing",
        seen.len(),
        took.as_secs_f64(),
        seen.len() as f64 / took.as_secs_f64()
    );
    assert_eq!(seen, native);
    // A listing is streamed in pages: the mount does not hold the whole directory.
    assert!(peak <= rss_before + 64, "mount RSS grew from {rss_before} to {peak} MiB");

    // `ls -l`: each entry listed is looked up; the attributes come in batches with the
    // listing's pages, not in one request per entry.
    let requests = |m: &Mount, op: &str| -> (u64, u64) {
        let stats = m.stats();
        let w: Vec<u64> = stats
            .lines()
            .find(|l| l.split_whitespace().next() == Some(op))
            .map(|l| l.split_whitespace().skip(1).take(3).map(|x| x.parse().unwrap()).collect())
            .unwrap_or_else(|| vec![0, 0, 0]);
        (w[0], w[2])
    };
    let before = requests(&m, "lookup");
    let started = Instant::now();
    let mut sizes = 0u64;
    for e in fs::read_dir(m.path().join("list")).unwrap() {
        sizes += e.unwrap().path().symlink_metadata().unwrap().len();
    }
    let after = requests(&m, "lookup");
    let (looked, sent) = (after.0 - before.0, after.1 - before.1);
    eprintln!(
        "ls -l: {looked} lookups, {sent} server requests, {:.0} entries/s",
        N as f64 / started.elapsed().as_secs_f64()
    );
    assert_eq!(sizes, 0);
    assert!(sent <= (N / 200) as u64, "{sent} server requests for {looked} lookups of {N} entries");
}

/// Server requests the mount sent so far (all operations).
fn requests(m: &Mount) -> u64 {
    sample(m).requests
}

/// Entries the mount fetched for delegations granted with name digests.
fn learnt(m: &Mount) -> u64 {
    let stats = m.stats();
    let line = stats.lines().find(|l| l.starts_with("delegation work ")).expect("delegation work line");
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w[8], "learnt", "{line}");
    w[9].parse().unwrap()
}

/// Directories of 20,000 files made through the native API (so the mount knows the
/// shards it is delegated only by their names' digests), with a few hard links and
/// subdirectories, removed through the mount by `rm -rf` (which sorts entries by inode)
/// and by `shutil.rmtree` (listing order): the attributes come in batches and the unlinks
/// are answered under the shards' delegations, so the servers see a few requests per
/// thousand entries. Each entry is gone on the servers afterwards and fsck is clean.
#[test]
fn removing_a_huge_directory_made_elsewhere_costs_few_server_requests() {
    if !fuse_available() {
        return;
    }
    const N: usize = 20_000;
    let cluster = cluster();
    let c = cluster.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for dir in ["/gone", "/tree"] {
        rt.block_on(async {
            c.mkdir(dir, 0o755).await.unwrap();
            fill(&c, dir, N, "file").await;
            for k in 0..5 {
                c.link(&format!("{dir}/file-{k:06}"), &format!("{dir}/link-{k}")).await.unwrap();
                c.mkdir(&format!("{dir}/sub-{k}"), 0o755).await.unwrap();
                c.create(&format!("{dir}/sub-{k}/inner"), 0o644, true).await.unwrap();
                c.write(&format!("{dir}/sub-{k}/inner"), 0, b"x").await.unwrap();
            }
            while c.distribution(dir).await.unwrap().state != DistState::Distributed {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
    }
    let m = Mount::new(&cluster);
    let total = N + 10;

    // A file known to the mount only by its digest: looked up, removed, made again.
    let one = m.path().join("gone/file-000100");
    assert_eq!(fs::metadata(&one).unwrap().len(), 0);
    fs::remove_file(&one).unwrap();
    assert_eq!(fs::metadata(&one).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    fs::write(&one, b"again").unwrap();
    assert_eq!(fs::read(&one).unwrap(), b"again");

    let (before, learnt_before) = (requests(&m), learnt(&m));
    let started = Instant::now();
    let out = std::process::Command::new("rm").arg("-rf").arg(m.path().join("gone")).output().unwrap();
    assert!(out.status.success(), "rm -rf: {}", String::from_utf8_lossy(&out.stderr));
    let (sent, fetched) = (requests(&m) - before, learnt(&m) - learnt_before);
    eprintln!(
        "rm -rf of {total} entries: {sent} server requests, {fetched} entries fetched, {:.0} entries/s",
        total as f64 / started.elapsed().as_secs_f64()
    );
    assert!(fetched >= N as u64 / 2, "the shards' entries were fetched under their delegations: {fetched}");
    assert!(sent <= (total / 20) as u64, "{sent} server requests to remove {total} entries");

    let before = requests(&m);
    let started = Instant::now();
    let script = format!("import shutil; shutil.rmtree('{}')", m.path().join("tree").display());
    let out = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "shutil.rmtree: {}", String::from_utf8_lossy(&out.stderr));
    let sent = requests(&m) - before;
    eprintln!(
        "shutil.rmtree of {total} entries: {sent} server requests, {:.0} entries/s",
        total as f64 / started.elapsed().as_secs_f64()
    );
    assert!(sent <= (total / 20) as u64, "{sent} server requests to remove {total} entries");

    m.sync();
    for dir in ["/gone", "/tree"] {
        let e = rt.block_on(c.lstat(dir)).unwrap_err();
        assert_eq!(e.errno, plusfs_proto::Errno::ENOENT, "{dir}: {e}");
    }
    drop(m);
    cluster.assert_fsck_clean();
}
