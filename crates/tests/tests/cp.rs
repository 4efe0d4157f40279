//! `plusfs cp` (batch migration): a tree with files from 0 B to 8 MiB, deep directories,
//! symlinks, hard links and odd names goes local → cluster → second cluster → local and
//! comes back identical (contents, modes, times, link counts, owners); an interrupted copy
//! is finished by running it again.

mod common;

use common::{exe, ProcCluster};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn plusfs(cluster: &ProcCluster, args: &[&str]) -> String {
    let out =
        Command::new(exe()).args(args).env("PLUSFS_CLUSTER", cluster.cluster.map_file()).output().expect("run plusfs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "plusfs {args:?} failed:\n{text}");
    text
}

/// Every entry below `root`: kind, mode, mtime, link count, size, contents or target.
fn describe(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let what = if md.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else if md.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&p).unwrap().display())
            } else {
                format!("{:x}", xxhash_rust::xxh3::xxh3_64(&fs::read(&p).unwrap()))
            };
            let mtime = if md.file_type().is_symlink() { 0 } else { md.mtime() };
            out.push(format!("{rel} {:o} {mtime} {} {} {} {what}", md.mode() & 0o7777, md.nlink(), md.uid(), md.len()));
        }
    }
    out.sort();
    out
}

fn make_tree(root: &Path) {
    let mut seed = 7u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    };
    fs::create_dir_all(root.join("deep/a/b/c/d/e")).unwrap();
    fs::create_dir_all(root.join("odd names/ünï côdé")).unwrap();
    for (i, size) in [0usize, 1, 100, 4096, 65_537, 1 << 20, (1 << 20) + 3, 8 << 20].into_iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let p = root.join(format!("f{i}.bin"));
        fs::write(&p, data).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600 + i as u32)).unwrap();
    }
    for i in 0..300 {
        fs::write(root.join(format!("deep/a/b/c/small{i}")), format!("file {i}\n").repeat(i % 50)).unwrap();
    }
    fs::write(root.join("odd names/ünï côdé/with space & $dollar"), b"odd").unwrap();
    fs::write(root.join("deep/a/b/c/d/e/leaf"), b"leaf").unwrap();
    std::os::unix::fs::symlink("../f3.bin", root.join("deep/rel-link")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", root.join("dangling")).unwrap();
    fs::hard_link(root.join("f4.bin"), root.join("deep/a/hard")).unwrap();
    fs::hard_link(root.join("f4.bin"), root.join("odd names/hard2")).unwrap();
    fs::set_permissions(root.join("deep/a"), fs::Permissions::from_mode(0o750)).unwrap();
    // Times: set last, deepest first, so the walk order does not matter.
    Command::new("sh")
        .arg("-c")
        .arg(format!("cd '{}' && find . -depth -exec touch -h -d '2021-02-03 04:05:06' {{}} +", root.display()))
        .status()
        .unwrap();
}

#[test]
fn trees_round_trip_between_local_and_two_clusters() {
    let one = ProcCluster::start(3);
    let two = ProcCluster::start(2);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let second = format!("plusfs@{}:/again", two.cluster.map_file().display());
    let back = tmp.path().join("back");
    plusfs(&one, &["cp", "-r", "--verify", "-q", src.to_str().unwrap(), "plusfs:/copy"]);
    plusfs(&one, &["cp", "-r", "-q", "plusfs:/copy", &second]);
    plusfs(&two, &["cp", "-r", "--verify", "-q", "plusfs:/again", back.to_str().unwrap()]);
    assert_eq!(describe(&src), describe(&back));
    one.assert_fsck_clean();
    two.assert_fsck_clean();
}

#[test]
fn an_interrupted_copy_is_finished_by_running_it_again() {
    let cluster = ProcCluster::start(2);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    plusfs(&cluster, &["cp", "-r", "-q", src.to_str().unwrap(), "plusfs:/c"]);
    // As if interrupted: some files missing, one shorter, one with another time.
    let c = cluster.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for i in 0..100 {
            c.unlink(&format!("/c/deep/a/b/c/small{i}")).await.unwrap();
        }
        c.truncate("/c/f7.bin", 10).await.unwrap();
        c.utimens("/c/f6.bin", None, Some(plusfs_proto::TimeSet::Now)).await.unwrap();
    });
    let out = plusfs(&cluster, &["cp", "-r", "-T", src.to_str().unwrap(), "plusfs:/c"]);
    assert!(out.contains("102 files copied"), "only what was missing or different is copied again:\n{out}");
    let back = tmp.path().join("back");
    plusfs(&cluster, &["cp", "-r", "-q", "plusfs:/c", back.to_str().unwrap()]);
    assert_eq!(describe(&src), describe(&back));
}

#[test]
fn a_single_file_is_copied_in_and_out_like_cp() {
    let cluster = ProcCluster::start(2);
    let t = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..(3u32 << 20) + 17).map(|i| (i % 251) as u8).collect();
    std::fs::write(t.path().join("one"), &body).unwrap();
    plusfs(&cluster, &["cp", "-q", t.path().join("one").to_str().unwrap(), "plusfs:/one"]);
    plusfs(&cluster, &["mkdir", "/d"]);
    // Into an existing directory: the file keeps its name.
    plusfs(&cluster, &["cp", "-q", t.path().join("one").to_str().unwrap(), "plusfs:/d"]);
    plusfs(&cluster, &["cp", "-q", "plusfs:/d/one", t.path().join("back").to_str().unwrap()]);
    assert_eq!(std::fs::read(t.path().join("back")).unwrap(), body);
    plusfs(&cluster, &["cp", "-q", "plusfs:/one", t.path().to_str().unwrap()]);
    assert_eq!(std::fs::read(t.path().join("one")).unwrap(), body);
}
