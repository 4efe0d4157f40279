//! kill -9 of a mount in the middle of a `tar x` (run by `fuse_delegations.rs` over
//! `/dev/fuse` and by `fuse_uring.rs` over io_uring).

use super::{fuse_available, mounted, sh, Mount};
use crate::common::ProcCluster;
use plusfs_placement::DelegSettings;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `plusfs mount --sync` on `m`; whether it succeeded, and its error output.
pub fn sync_mount(cluster: &ProcCluster, m: &Mount) -> (bool, String) {
    let (code, _, err) = cluster.cli(&["mount", "--sync", m.path().to_str().unwrap()]);
    (code == 0, err)
}

/// A tree of `files` random files (up to `max_size` bytes) in `dirs` directories under
/// `base/top`, and its tar archive.
pub fn make_tree(
    base: &Path,
    top: &str,
    (dirs, files, max_size): (usize, usize, usize),
    seed: u64,
) -> (BTreeMap<String, Vec<u8>>, String) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tree = BTreeMap::new();
    for i in 0..files {
        let rel = format!("{top}/dir{}/file{i}", i % dirs);
        let data: Vec<u8> = (0..rng.gen_range(0..max_size)).map(|_| rng.gen()).collect();
        fs::create_dir_all(base.join(&rel).parent().unwrap()).unwrap();
        fs::write(base.join(&rel), &data).unwrap();
        tree.insert(rel, data);
    }
    let tar = base.join(format!("{top}.tar")).display().to_string();
    sh(&format!("tar cf {tar} -C {} {top}", base.display()));
    (tree, tar)
}

/// kill -9 of a mount in the middle of a `tar x`: after a new mount, fsck is clean, every
/// file a sync or fsync covered is complete, every other file is absent or holds a prefix
/// of what was written, never other bytes.
/// The mounts are made with `options` (`-o`).
pub fn killed_during_tar_x_loses_only_unsynced_work(options: &[&str]) {
    if !fuse_available() {
        return;
    }
    // Queues written back every 300 ms: the tar below sees several write-backs before the kill.
    let settings = DelegSettings { writeback_ms: 300, ..Default::default() };
    let cluster = ProcCluster::start_delegations(3, settings);
    let src = tempfile::tempdir().unwrap();
    let (first, first_tar) = make_tree(src.path(), "first", (4, 60, 40_000), 1);
    let (second, second_tar) = make_tree(src.path(), "second", (8, 4000, 15_000), 2);
    let m = Mount::with_options(&cluster, options);
    let mnt = m.path().display().to_string();
    sh(&format!("tar xf {first_tar} -C {mnt}"));
    let (ok, err) = sync_mount(&cluster, &m);
    assert!(ok, "{err}");
    let written_before = m.delegated_written();

    let mut tar = Command::new("tar")
        .args(["xf", &second_tar, "-C", &mnt])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Let the tar run until part of its work was written back (the servers applied at
    // least 100 of its operations) and more is queued under delegations.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    while m.delegated_written() < written_before + 100 || m.delegations().1 < 20 {
        assert!(Instant::now() < deadline, "the tar's work was not written back in time");
        assert!(tar.try_wait().unwrap().is_none(), "the tar ended before part of it was written back");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A file fsync'd in a directory of our own, which the mount holds with work queued.
    let fsynced = b"covered by fsync".repeat(100);
    fs::create_dir(m.path().join("own")).unwrap();
    fs::write(m.path().join("own/first"), b"queued").unwrap();
    {
        use std::io::Write;
        let mut f = fs::File::create(m.path().join("own/fsynced")).unwrap();
        f.write_all(&fsynced).unwrap();
        let (held, queued) = m.delegations();
        assert!(held >= 1 && queued >= 2, "own/ is delegated with work queued: {held} held, {queued} queued");
        f.sync_all().unwrap();
    }
    // Kill at a moment when work is queued (a flush may just have emptied the queues):
    // 20 operations are more than one extracted file makes, so files created since the
    // last write-back are among them.
    let queued = loop {
        let (_, queued) = m.delegations();
        assert!(Instant::now() < deadline, "no queued work seen while the tar ran");
        assert!(tar.try_wait().unwrap().is_none(), "the tar ended before the kill");
        if queued >= 20 {
            break queued;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    m.signal(libc::SIGKILL);
    let status = tar.wait().unwrap();
    assert!(!status.success(), "the tar saw its file system go away");
    let _ = Command::new("umount").arg("-l").arg(m.path()).status();
    assert!(!mounted(m.path()));

    cluster.assert_fsck_clean();
    let again = Mount::with_options(&cluster, options);
    let root = again.path();
    assert_eq!(fs::read(root.join("own/fsynced")).unwrap(), fsynced, "the fsync'd file is complete");
    for (rel, data) in &first {
        assert!(fs::read(root.join(rel)).unwrap() == *data, "{rel}, covered by a sync, is complete");
    }
    let (mut whole, mut partial, mut absent) = (0, 0, 0);
    for (rel, data) in &second {
        match fs::read(root.join(rel)) {
            Ok(got) if got == *data => whole += 1,
            Ok(got) => {
                assert!(
                    data.starts_with(&got),
                    "{rel} holds {} bytes that are not a prefix of its contents",
                    got.len()
                );
                partial += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{rel}: {e}");
                absent += 1;
            }
        }
    }
    println!(
        "after the kill: {whole} files whole, {partial} a prefix, {absent} absent, {queued} ops queued at the kill"
    );
    assert!(whole > 0 && absent > 0, "the kill hit mid-way: some files were written back, queued ones lost");
    // Nothing that was not in the tars.
    let listed = sh(&format!("cd {} && find . -type f | sort", root.display()));
    for l in listed.lines() {
        let rel = l.trim_start_matches("./");
        assert!(
            rel.starts_with("own/") || first.contains_key(rel) || second.contains_key(rel),
            "unexpected file {rel}"
        );
    }
}
