//! File contents on real multi-process clusters: integrity from 0 bytes to 100 MiB,
//! sparse files, truncate, append, overwrite, files renamed away from their data, space
//! reclaimed by compaction, kill -9 of a server during writes, and bad input.

mod common;

use common::{bytes, digest, ProcCluster};
use plusfs_client::Client;
use plusfs_proto::{Errno, MAX_FILE_SIZE};
use std::time::Duration;

async fn put(c: &Client, p: &str, data: &[u8]) {
    c.create(p, 0o644, false).await.unwrap();
    c.write(p, 0, data).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_from_empty_to_100_mib_read_back_intact() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.mkdir("/d", 0o755).await.unwrap();
    let sizes = [0usize, 1, 4095, 4096, 4097, 1 << 20, (1 << 20) + 1, 5 << 20, 9_999_999, 100 << 20];
    for (i, &n) in sizes.iter().enumerate() {
        let data = bytes(i as u64, n);
        let p = format!("/d/f{i}");
        put(&c, &p, &data).await;
        assert_eq!(c.lstat(&p).await.unwrap().size, n as u64, "size of {n}-byte file");
        let back = c.read_all(&p).await.unwrap();
        assert_eq!(back.len(), n);
        assert_eq!(digest(&back), digest(&data), "contents of the {n}-byte file");
    }
    // The 100 MiB file's chunks are spread over the servers.
    for id in cluster.cluster.ids() {
        assert!(c.server_status(id).await.unwrap().data_bytes > 10 << 20, "server {id} holds chunks");
    }
    // A range in the middle, across a chunk boundary.
    let big = bytes(9, 100 << 20);
    let at = (4 << 20) - 100;
    assert_eq!(c.read("/d/f9", at as u64, 1000).await.unwrap(), big[at..at + 1000]);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_truncate_append_and_overwrite() {
    let cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.create("/s", 0o644, true).await.unwrap();
    // A hole before the data, and a hole across a chunk boundary.
    c.write("/s", 10 << 20, b"tail").await.unwrap();
    c.write("/s", 100, b"head").await.unwrap();
    let all = c.read_all("/s").await.unwrap();
    assert_eq!(all.len(), (10 << 20) + 4);
    assert_eq!(&all[100..104], b"head");
    assert!(all[..100].iter().all(|&b| b == 0) && all[104..10 << 20].iter().all(|&b| b == 0));
    assert_eq!(&all[10 << 20..], b"tail");
    // Overwrite across two earlier writes.
    c.write("/s", 102, b"XXXX").await.unwrap();
    assert_eq!(c.read("/s", 98, 10).await.unwrap(), b"\0\0heXXXX\0\0");
    // Truncate down, then up: the cut bytes come back as zeros.
    c.truncate("/s", 104).await.unwrap();
    assert_eq!(c.lstat("/s").await.unwrap().size, 104);
    c.truncate("/s", 200).await.unwrap();
    let t = c.read_all("/s").await.unwrap();
    assert_eq!(&t[100..106], b"heXX\0\0");
    assert!(t[104..].iter().all(|&b| b == 0));
    // Appends land at the end, also from several clients at once.
    c.truncate("/s", 0).await.unwrap();
    let mut tasks = Vec::new();
    for k in 0..4u8 {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                c.append("/s", &[b'a' + k; 10]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let a = c.read_all("/s").await.unwrap();
    assert_eq!(a.len(), 1000);
    for rec in a.chunks(10) {
        assert!(rec.iter().all(|&b| b == rec[0]), "appends are not interleaved: {rec:?}");
    }
    // Reads past the end are empty; a read at the end of a hole gives zeros.
    assert!(c.read("/s", 5000, 10).await.unwrap().is_empty());
    c.fsync("/s").await.unwrap();
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_files_keep_their_data_and_space_is_reclaimed() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    // Directories on different servers.
    let dirs: Vec<String> = (0..20).map(|i| format!("/dir{i}")).collect();
    let a = dirs.iter().find(|d| c.home(d) == 0).unwrap().clone();
    let b = dirs.iter().find(|d| c.home(d) == 1).unwrap().clone();
    c.mkdir(&a, 0o755).await.unwrap();
    c.mkdir(&b, 0o755).await.unwrap();
    let data = bytes(1, 300_000);
    put(&c, &format!("{a}/f"), &data).await;
    c.rename(&format!("{a}/f"), &format!("{b}/f")).await.unwrap();
    assert_eq!(c.read_all(&format!("{b}/f")).await.unwrap(), data, "data read from the old server");
    c.write(&format!("{b}/f"), 10, b"new").await.unwrap();
    let mut expect = data.clone();
    expect[10..13].copy_from_slice(b"new");
    assert_eq!(c.read_all(&format!("{b}/f")).await.unwrap(), expect);
    // Removing it frees its records on both servers.
    c.unlink(&format!("{b}/f")).await.unwrap();
    for id in [0, 1] {
        assert_eq!(c.server_status(id).await.unwrap().data_records, 0, "server {id}");
    }
    // Rewrites leave dead bytes; compaction gives them back and keeps live data.
    let p = format!("{a}/g");
    for round in 0..40u64 {
        put(&c, &p, &bytes(round, 200_000)).await;
    }
    let (code, out, err) = cluster.cli(&["cluster", "compact", "--live-percent", "60"]);
    assert_eq!(code, 0, "{out}{err}");
    let home = c.home(&a);
    let st = c.server_status(home).await.unwrap();
    assert!(st.data_bytes < 4 << 20, "compaction left {} bytes", st.data_bytes);
    assert_eq!(c.read_all(&p).await.unwrap(), bytes(39, 200_000));
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_during_writes_keeps_every_acknowledged_write() {
    let mut cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.mkdir("/w", 0o755).await.unwrap();
    let victim = c.home("/w");
    // The writer reports each acknowledged file, so the kill lands after a known number of
    // them, while it is still writing.
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0usize);
    let writer = {
        let c = cluster.client();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..400u64 {
                let p = format!("/w/f{i}");
                let data = bytes(i, 20_000 + (i as usize % 7) * 300_000);
                let ok = c.create(&p, 0o644, true).await.is_ok() && c.write(&p, 0, &data).await.is_ok();
                if ok {
                    acked.push((p, digest(&data), data.len()));
                    progress_tx.send_replace(acked.len());
                } else if !acked.is_empty() {
                    break;
                }
            }
            acked
        })
    };
    progress.wait_for(|&n| n >= 10).await.expect("the writer ran");
    cluster.cluster.kill(victim).unwrap();
    let at_kill = *progress.borrow();
    let acked = writer.await.unwrap();
    // Mid-workload: files were acknowledged before the kill and the writer was stopped by
    // it (not by running out of files).
    assert!(at_kill >= 10, "killed after {at_kill} files");
    assert!(acked.len() < 400, "the writer finished before the kill landed");
    cluster.cluster.start(victim).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let fresh = cluster.client();
    for (p, d, n) in &acked {
        let back = fresh.read_all(p).await.unwrap();
        assert_eq!((back.len(), digest(&back)), (*n, *d), "{p} after kill -9");
    }
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_posix_errors() {
    let cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.mkdir("/d", 0o755).await.unwrap();
    c.create("/f", 0o644, true).await.unwrap();
    assert_eq!(c.write("/d", 0, b"x").await.unwrap_err().errno, Errno::EISDIR);
    assert_eq!(c.read("/d", 0, 1).await.unwrap_err().errno, Errno::EISDIR);
    assert_eq!(c.write("/nope", 0, b"x").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(c.write("/f/x", 0, b"x").await.unwrap_err().errno, Errno::ENOTDIR);
    assert_eq!(c.write("/f", MAX_FILE_SIZE, b"x").await.unwrap_err().errno, Errno::EFBIG);
    assert_eq!(c.truncate("/f", MAX_FILE_SIZE + 1).await.unwrap_err().errno, Errno::EFBIG);
    assert_eq!(c.truncate("/d", 0).await.unwrap_err().errno, Errno::EISDIR);
    c.symlink("/f", "/l").await.unwrap();
    assert_eq!(c.write("/l", 0, b"x").await.unwrap_err().errno, Errno::EINVAL);
    // A failed write changed nothing.
    assert_eq!(c.lstat("/f").await.unwrap().size, 0);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_attributes_on_files_and_directories() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.mkdir("/d", 0o755).await.unwrap();
    c.create("/d/f", 0o644, true).await.unwrap();
    for p in ["/d/f", "/d", "/"] {
        c.setxattr(p, "user.color", b"blue", true, false).await.unwrap();
        assert_eq!(c.setxattr(p, "user.color", b"red", true, false).await.unwrap_err().errno, Errno::EEXIST);
        c.setxattr(p, "user.color", b"red", false, true).await.unwrap();
        c.setxattr(p, "user.size", &[0u8; 1000], false, false).await.unwrap();
        assert_eq!(c.getxattr(p, "user.color").await.unwrap(), b"red");
        assert_eq!(c.listxattr(p).await.unwrap(), vec!["user.color".to_string(), "user.size".to_string()]);
        c.removexattr(p, "user.size").await.unwrap();
        assert_eq!(c.getxattr(p, "user.size").await.unwrap_err().errno, Errno::ENODATA);
        assert_eq!(c.setxattr(p, "security.x", b"", false, false).await.unwrap_err().errno, Errno::EOPNOTSUPP);
    }
    // Attributes travel with renames (across servers too) and vanish with the file.
    c.rename("/d/f", "/g").await.unwrap();
    assert_eq!(c.getxattr("/g", "user.color").await.unwrap(), b"red");
    assert_eq!(c.getxattr("/nope", "user.color").await.unwrap_err().errno, Errno::ENOENT);
    cluster.assert_fsck_clean();
}

/// A server aborts (like kill -9) in the middle of a compaction, before and after the switch
/// of its record index; after a restart every live file reads back whole, fsck is clean,
/// and the next compaction reclaims the space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_compaction_loses_nothing() {
    for point in ["compaction_before_switch", "compaction_after_switch"] {
        let mut cluster = ProcCluster::start(1);
        let c = cluster.client();
        c.mkdir("/c", 0o755).await.unwrap();
        let mut live = Vec::new();
        for i in 0..60u64 {
            let p = format!("/c/f{i}");
            let data = bytes(i, 50_000);
            put(&c, &p, &data).await;
            if i % 4 == 0 {
                live.push((p, digest(&data)));
            } else {
                c.unlink(&p).await.unwrap();
            }
        }
        cluster.cluster.stop(0).unwrap();
        cluster.cluster.start_with_env(0, &[("PLUSFS_FAILPOINT", point)]).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
        let (code, _, _) = cluster.cli(&["cluster", "compact", "--live-percent", "60"]);
        assert_ne!(code, 0, "{point}: the server should have aborted");
        cluster.cluster.kill(0).unwrap();
        cluster.cluster.start(0).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
        let fresh = cluster.client();
        for (p, d) in &live {
            assert_eq!(digest(&fresh.read_all(p).await.unwrap()), *d, "{point}: {p}");
        }
        let before = fresh.server_status(0).await.unwrap().data_bytes;
        let (code, out, err) = cluster.cli(&["cluster", "compact", "--live-percent", "60"]);
        assert_eq!(code, 0, "{out}{err}");
        // 3 MB were written, 750 KB are live; copies an interrupted pass left behind are
        // garbage of the active segment, reclaimed when it is compacted in its turn.
        let after = fresh.server_status(0).await.unwrap().data_bytes;
        assert!(after < before && after < 2_000_000, "{point}: {before} -> {after} bytes");
        for (p, d) in &live {
            assert_eq!(digest(&fresh.read_all(p).await.unwrap()), *d, "{point} after the second pass: {p}");
        }
        cluster.assert_fsck_clean();
    }
}

/// A size-limited tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` (with a line saying so) where tmpfs cannot be mounted (not root) and
    /// `PLUSFS_ALLOW_SKIP` is set; a failure where it is not.
    fn mount(mib: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            assert!(
                common::skip_allowed(),
                "cannot mount a small tmpfs here (needs root): the full-disk test cannot run (set PLUSFS_ALLOW_SKIP=1 to skip it)"
            );
            println!("SKIPPED (PLUSFS_ALLOW_SKIP): cannot mount a small tmpfs here; the full-disk test did not run");
            return None;
        }
        Some(SmallDisk { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_disk_gives_enospc_and_loses_nothing() {
    // Room for the metadata store's floor (its next flush and compaction, about 210 MiB)
    // above the data reserve.
    let Some(disk) = SmallDisk::mount(384) else { return };
    let data = plusfs_placement::DataSettings { reserve_bytes: 8 << 20, segment_bytes: 4 << 20, ..Default::default() };
    let settings = plusfs_localcluster::ClusterSettings { data, ..Default::default() };
    let mut cluster = ProcCluster::start_in(disk.dir.path(), 1, &settings);
    let c = cluster.client();
    let mut written = Vec::new();
    let full = loop {
        let i = written.len();
        assert!(i < 400, "a 384 MiB disk cannot take 400 MiB");
        let p = format!("/f{i}");
        c.create(&p, 0o644, true).await.unwrap();
        match c.write(&p, 0, &bytes(i as u64, 1 << 20)).await {
            Ok(_) => written.push(p),
            Err(e) => break e,
        }
    };
    assert_eq!(full.errno, Errno::ENOSPC, "{full}");
    assert!(written.len() >= 20, "only {} MiB fit", written.len());
    // The server keeps serving: metadata changes, reads of everything acknowledged.
    c.mkdir("/still", 0o755).await.unwrap();
    c.create("/still/empty", 0o644, true).await.unwrap();
    for (i, p) in written.iter().enumerate() {
        assert_eq!(digest(&c.read_all(p).await.unwrap()), digest(&bytes(i as u64, 1 << 20)), "{p}");
    }
    // A restart on the full disk: everything acknowledged is still there.
    let id = cluster.cluster.ids()[0];
    cluster.cluster.kill(id).unwrap();
    cluster.cluster.start(id).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    for (i, p) in written.iter().enumerate() {
        assert_eq!(digest(&c.read_all(p).await.unwrap()), digest(&bytes(i as u64, 1 << 20)), "{p} after restart");
    }
    // Freed space is usable again once a mostly dead segment is compacted.
    for p in &written[..written.len() * 3 / 4] {
        c.unlink(p).await.unwrap();
    }
    let (code, out, err) = cluster.cli(&["cluster", "compact"]);
    assert_eq!(code, 0, "{out}{err}");
    c.create("/after", 0o644, true).await.unwrap();
    c.write("/after", 0, &bytes(99, 4 << 20)).await.unwrap();
    assert_eq!(digest(&c.read_all("/after").await.unwrap()), digest(&bytes(99, 4 << 20)));
    cluster.assert_fsck_clean();
    drop(cluster);
}

/// Records a writer stored but never committed (it was killed between the two) are
/// deleted by `fsck --reclaim` once two scans the commit window apart find them unused; a
/// record whose commit comes inside the window is kept and its file reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_records_are_reclaimed_once_no_commit_can_come() {
    use plusfs_proto::{Piece, Reply, Request};
    let tc = ProcCluster::start(1);
    let c = tc.client();
    c.create("/f", 0o644, true).await.unwrap();
    let ino = c.lstat("/f").await.unwrap().ino;
    let put = |fill: u8| Request::DataPut { owner: ino, data: vec![fill; 1 << 20].into(), file_off: 0, cap: None };
    let record = |r| match r {
        Ok(Reply::Record(id)) => id,
        other => panic!("a stored record: {other:?}"),
    };
    let late = record(c.call_server(0, &put(1)).await);
    let lost = record(c.call_server(0, &put(2)).await);
    assert_ne!(late, lost);

    let fsck = std::process::Command::new(common::exe())
        .args(["fsck", "--reclaim", "--reclaim-after", "4"])
        .env("PLUSFS_CLUSTER", tc.cluster.map_file())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first scan sees both unused; `late`'s commit comes inside the window.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let piece = Piece { file_off: 0, len: 1 << 20, server: 0, record: late, skip: 0 };
    let commit =
        Request::CommitWrite { path: "/f".into(), ino, offset: 0, len: 1 << 20, pieces: vec![piece], receipts: vec![] };
    c.call_server(0, &commit).await.expect("the commit inside the window");
    let out = fsck.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("reclaimed 1 unused data records (1048576 bytes)"), "{text}");
    assert_eq!(c.read_all("/f").await.unwrap(), vec![1u8; 1 << 20], "the committed record is kept");
    let (code, out, _) = tc.cli(&["fsck"]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("no file uses"), "the lost record is gone: {out}");
}
