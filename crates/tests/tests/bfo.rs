//! Batch-file I/O (seed 002 §3) on real multi-process clusters: round trips of file sets,
//! replacement of existing files, distributed directories, files that must go alone, the
//! message count, errors, and kill -9 of a server during batch writes (every file old or
//! new, whole).

mod common;

use common::ProcCluster;
use plusfs_client::{Client, NewFile, DEFAULT_READ_BUFFER};
use plusfs_proto::{Errno, Timespec};
use std::time::Duration;

/// Contents that say which file and which version they are, with a checksum at the end.
fn contents(file: usize, version: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| ((i * 31 + file * 7 + version as usize) % 251) as u8).collect();
    if len >= 16 {
        v[..4].copy_from_slice(&version.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&v[..len - 8]);
        v[len - 8..].copy_from_slice(&sum.to_le_bytes());
    }
    v
}

/// The version a file's bytes are, if they are one whole version.
fn version_of(v: &[u8]) -> Option<u32> {
    let len = v.len();
    let sum = u64::from_le_bytes(v[len - 8..].try_into().unwrap());
    (xxhash_rust::xxh3::xxh3_64(&v[..len - 8]) == sum).then(|| u32::from_le_bytes(v[..4].try_into().unwrap()))
}

fn sizes(i: usize) -> usize {
    match i % 7 {
        0 => 0,
        1 => 1,
        2 => 4096,
        3 => 10_000 + i,
        4 => 65_536,
        5 => 300_000,
        _ => 1 << 20,
    }
}

async fn total_ops(c: &Client, name: &str) -> u64 {
    let mut n = 0;
    for s in &c.map().servers {
        let st = c.server_status(s.id).await.unwrap();
        n += st.ops.iter().filter(|(o, _)| o == name).map(|(_, c)| c).sum::<u64>();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sets_round_trip_in_few_requests() {
    let cluster = ProcCluster::start_hugedirs(3, Some(100));
    let c = cluster.client();
    for d in ["/a", "/b", "/b/deep"] {
        c.mkdir(d, 0o755).await.unwrap();
    }
    // 150 files in /a (over the threshold: distributed midway), 40 in /b, 10 in /b/deep,
    // and two files over the small-file size that go alone.
    let mut files = Vec::new();
    let mut paths = Vec::new();
    for i in 0..200 {
        let dir = match i {
            0..=149 => "/a",
            150..=189 => "/b",
            _ => "/b/deep",
        };
        let p = format!("{dir}/f{i}");
        let mut f = NewFile::new(p.clone(), contents(i, 1, sizes(i)));
        f.mode = 0o600 + (i as u32 % 8);
        f.mtime = Some(Timespec { sec: 1_600_000_000 + i as i64, nsec: 0 });
        files.push(f);
        paths.push(p);
    }
    for (i, big) in [(200, 3 << 20), (201, (1 << 20) + 1), (202, 20 << 20)] {
        let p = format!("/b/big{i}");
        files.push(NewFile::new(p.clone(), contents(i, 1, big)));
        paths.push(p);
    }
    let before = total_ops(&c, "batch_write").await;
    for r in c.batch_write(files.clone()).await {
        r.unwrap();
    }
    let requests = total_ops(&c, "batch_write").await - before;
    assert!(requests <= 12, "200 small files took {requests} batch writes");
    let back = c.batch_read(&paths, DEFAULT_READ_BUFFER).await;
    for ((f, r), i) in files.iter().zip(back).zip(0..) {
        let (attr, data) = r.unwrap_or_else(|e| panic!("{}: {e}", f.path));
        assert!(data == f.data, "contents of {} ({} bytes)", f.path, f.data.len());
        assert_eq!(attr.size, f.data.len() as u64);
        if i < 200 {
            assert_eq!(attr.mode & 0o7777, f.mode);
            assert_eq!(attr.mtime, f.mtime.unwrap());
        }
        // The ordinary read path agrees.
        assert!(c.read_all(&f.path).await.unwrap() == f.data);
    }
    assert!(c.lstat("/a").await.unwrap().size == 150);
    // A small reply budget: the same files come back in several replies.
    let small = c.batch_read(&paths[..150], 1 << 20).await;
    assert!(small.iter().zip(&files).all(|(r, f)| r.as_ref().unwrap().1 == f.data));
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewriting_replaces_contents_and_frees_the_old_data() {
    let cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.mkdir("/r", 0o755).await.unwrap();
    let files: Vec<NewFile> = (0..50).map(|i| NewFile::new(format!("/r/f{i}"), contents(i, 1, 5000))).collect();
    c.batch_write(files).await.into_iter().for_each(|r| assert!(r.is_ok(), "{r:?}"));
    let records = |c: Client| async move {
        let mut n = 0;
        for s in &c.map().servers {
            n += c.server_status(s.id).await.unwrap().data_records;
        }
        n
    };
    let first = records(c.clone()).await;
    // A hard link among them: written alone, seen through both names.
    c.link("/r/f3", "/r/link3").await.unwrap();
    let files: Vec<NewFile> = (0..50).map(|i| NewFile::new(format!("/r/f{i}"), contents(i, 2, 700))).collect();
    c.batch_write(files).await.into_iter().for_each(|r| assert!(r.is_ok(), "{r:?}"));
    assert_eq!(records(c.clone()).await, first, "old records dropped");
    let paths: Vec<String> = (0..50).map(|i| format!("/r/f{i}")).collect();
    for (i, r) in c.batch_read(&paths, DEFAULT_READ_BUFFER).await.into_iter().enumerate() {
        assert_eq!(r.unwrap().1, contents(i, 2, 700));
    }
    assert_eq!(c.read_all("/r/link3").await.unwrap(), contents(3, 2, 700));
    // Errors are per file.
    c.mkdir("/r/sub", 0o755).await.unwrap();
    let bad =
        vec![NewFile::new("/r/sub", vec![1]), NewFile::new("/missing/x", vec![1]), NewFile::new("/r/ok", vec![1, 2])];
    let r = c.batch_write(bad).await;
    assert_eq!(r[0].as_ref().unwrap_err().errno, Errno::EISDIR);
    assert_eq!(r[1].as_ref().unwrap_err().errno, Errno::ENOENT);
    assert!(r[2].is_ok());
    let r = c.batch_read(&["/r/nope".to_string(), "/r/sub".to_string(), "/r/ok".to_string()], 1 << 20).await;
    assert_eq!(r[0].as_ref().unwrap_err().errno, Errno::ENOENT);
    assert_eq!(r[1].as_ref().unwrap_err().errno, Errno::EISDIR);
    assert_eq!(r[2].as_ref().unwrap().1, vec![1, 2]);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_batch_writes_leaves_every_file_old_or_new() {
    let mut cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.mkdir("/k", 0o755).await.unwrap();
    let n = 300;
    let paths: Vec<String> = (0..n).map(|i| format!("/k/f{i}")).collect();
    let first: Vec<NewFile> =
        (0..n).map(|i| NewFile::new(paths[i].clone(), contents(i, 1, 2000 + (i * 37) % 9000))).collect();
    c.batch_write(first).await.into_iter().for_each(|r| assert!(r.is_ok(), "{r:?}"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let c = cluster.client();
        let (stop, paths) = (stop.clone(), paths.clone());
        tokio::spawn(async move {
            let mut v = 2;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let files = (0..n).map(|i| NewFile::new(paths[i].clone(), contents(i, v, 2000 + (i * 37) % 9000)));
                let _ = c.batch_write(files.collect()).await;
                v += 1;
            }
        })
    };
    // Kill the server holding the files once batches are landing.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while version_of(&c.read_all(&paths[0]).await.unwrap()) < Some(3) {
        assert!(std::time::Instant::now() < deadline, "batch writes do not land");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = c.home("/k");
    cluster.cluster.kill(victim).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.cluster.start(victim).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let mut versions = std::collections::BTreeSet::new();
    for (i, r) in c.batch_read(&paths, DEFAULT_READ_BUFFER).await.into_iter().enumerate() {
        let (_, data) = r.unwrap();
        let v = version_of(&data).unwrap_or_else(|| panic!("{} is torn", paths[i]));
        assert_eq!(data, contents(i, v, 2000 + (i * 37) % 9000), "{} is one whole version", paths[i]);
        versions.insert(v);
    }
    assert!(versions.iter().all(|v| *v > 1), "batches landed before the kill: {versions:?}");
    cluster.assert_fsck_clean();
}
