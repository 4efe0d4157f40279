//! The FUSE mount with ordinary tools: coreutils and tar on a real tree, two mounts of one
//! cluster, data integrity, and a random operation sequence compared with a local
//! directory. Skipped, with a line saying so, where /dev/fuse is missing.

mod common;
mod mounts;

use common::ProcCluster;
use mounts::{fuse_available, sh, Mount};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The source tree of this crate family: a real tree of directories and files.
fn source_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("proto").canonicalize().unwrap()
}

#[test]
fn coreutils_and_tar_on_the_mount() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(3);
    let m = Mount::new(&cluster);
    let mnt = m.path().display().to_string();
    let src = source_tree().display().to_string();
    sh(&format!("cp -r {src} {mnt}/tree && diff -r {src} {mnt}/tree"));
    sh(&format!("mkdir -p {mnt}/a/b/c && mv {mnt}/tree {mnt}/a/b/c/moved && diff -r {src} {mnt}/a/b/c/moved"));
    let listing = sh(&format!("ls -l {mnt}/a/b/c/moved/src"));
    assert!(listing.contains("lib.rs") && listing.contains("-rw"), "{listing}");
    let found = sh(&format!("find {mnt}/a | wc -l")).trim().parse::<usize>().unwrap();
    let expected = sh(&format!("find {src} | wc -l")).trim().parse::<usize>().unwrap() + 3;
    assert_eq!(found, expected);
    sh(&format!("du -s {mnt}/a"));
    // tar out of the mount into a local directory, and back into the mount.
    let local = tempfile::tempdir().unwrap();
    let l = local.path().display();
    sh(&format!("tar c -C {mnt}/a/b/c moved | tar x -C {l} && diff -r {src} {l}/moved"));
    sh(&format!("tar c -C {l} moved | tar x -C {mnt} && diff -r {src} {mnt}/moved"));
    sh(&format!("rm -rf {mnt}/a {mnt}/moved"));
    assert_eq!(fs::read_dir(m.path()).unwrap().count(), 0);
    // Symlinks, FIFOs, chmod, truncate, hard-link refusal.
    sh(&format!("ln -s target {mnt}/l && test \"$(readlink {mnt}/l)\" = target"));
    sh(&format!("mkfifo {mnt}/fifo && test -p {mnt}/fifo"));
    sh(&format!("echo hello > {mnt}/f && chmod 600 {mnt}/f && test \"$(stat -c %a {mnt}/f)\" = 600"));
    sh(&format!("truncate -s 3 {mnt}/f && test \"$(cat {mnt}/f)\" = hel"));
    sh(&format!("echo more >> {mnt}/f && test \"$(cat {mnt}/f)\" = helmore"));
    // Hard links: ln, and tar keeping them.
    sh(&format!("ln {mnt}/f {mnt}/f2 && test \"$(stat -c %h {mnt}/f)\" = 2 && test \"$(cat {mnt}/f2)\" = helmore"));
    sh(&format!(
        "mkdir {mnt}/lt && cd {mnt} && tar cf - f f2 | (cd lt && tar xf -) && test \"$(stat -c %h lt/f2)\" = 2"
    ));
    sh(&format!(
        "rm {mnt}/f2 {mnt}/lt/f && test \"$(stat -c %h {mnt}/f)\" = 1 && test \"$(cat {mnt}/lt/f2)\" = helmore"
    ));
    // renameat2(RENAME_EXCHANGE) and RENAME_NOREPLACE.
    let (f, g) =
        (std::ffi::CString::new(format!("{mnt}/f")).unwrap(), std::ffi::CString::new(format!("{mnt}/lt/f2")).unwrap());
    fs::write(format!("{mnt}/f"), b"one").unwrap();
    fs::write(format!("{mnt}/lt/f2"), b"two").unwrap();
    // SAFETY: valid C strings.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, g.as_ptr(), libc::RENAME_EXCHANGE) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(fs::read(format!("{mnt}/f")).unwrap(), b"two");
    assert_eq!(fs::read(format!("{mnt}/lt/f2")).unwrap(), b"one");
    // SAFETY: valid C strings.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, g.as_ptr(), libc::RENAME_NOREPLACE) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EEXIST)));
    mounts::xattr_round_trip(&format!("{mnt}/f"));
    cluster.assert_fsck_clean();
}

#[test]
fn two_mounts_see_each_others_changes_after_close() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(2);
    let a = Mount::new(&cluster);
    let b = Mount::new(&cluster);
    fs::write(a.path().join("shared"), b"from a").unwrap();
    assert_eq!(fs::read(b.path().join("shared")).unwrap(), b"from a");
    fs::write(b.path().join("shared"), b"from b, longer").unwrap();
    // Attributes may be cached for up to the ttl (1 s); an open after it sees the change.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::read(a.path().join("shared")).unwrap(), b"from b, longer");
    fs::create_dir(b.path().join("dir")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(a.path().join("dir").is_dir());
}

/// A file read again unchanged comes from the kernel's page cache (no FUSE read); a
/// change by another mount is seen at the next open after the TTL, its pages dropped.
#[test]
fn re_reads_of_an_unchanged_file_come_from_the_page_cache() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(2);
    let a = Mount::new(&cluster);
    let b = Mount::new(&cluster);
    let data: Vec<u8> = (0..(6 << 20)).map(|i| (i % 251) as u8).collect();
    fs::write(b.path().join("f"), &data).unwrap();
    // What b still holds back (times, under its delegation) reaches the servers now, so
    // the file does not change under a's reads later (which would rightly drop a's pages).
    b.sync();
    // Server requests sent for reads (the control file's own reads send none).
    let reads = |m: &Mount| -> u64 {
        let stats = m.stats();
        let line = stats.lines().find(|l| l.starts_with("read ")).unwrap_or("read 0 0 0");
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    assert!(fs::read(a.path().join("f")).unwrap() == data, "first read");
    let after_first = reads(&a);
    assert!(after_first > 0, "the first read went to the servers");
    for _ in 0..3 {
        assert!(fs::read(a.path().join("f")).unwrap() == data, "re-read");
    }
    assert_eq!(reads(&a), after_first, "re-reads of the unchanged file were served from the page cache");
    // Another mount rewrites the file with the same size: the next open drops the pages.
    let other: Vec<u8> = data.iter().map(|b| b.wrapping_add(1)).collect();
    fs::write(b.path().join("f"), &other).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(fs::read(a.path().join("f")).unwrap() == other, "the other mount's contents after reopening");
    assert!(reads(&a) > after_first, "read from the servers again");
}

#[test]
fn data_integrity_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(3);
    let m = Mount::new(&cluster);
    let mut rng = StdRng::seed_from_u64(3);
    for (i, size) in [0usize, 1, 4096, 131_073, 3 << 20, 20 << 20].into_iter().enumerate() {
        let mut data = vec![0u8; size];
        rng.fill(&mut data[..]);
        let p = m.path().join(format!("f{i}"));
        fs::write(&p, &data).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), size as u64);
        assert!(fs::read(&p).unwrap() == data, "contents of the {size}-byte file");
    }
    // Overwrite in the middle through a file handle.
    use std::io::{Seek, SeekFrom, Write};
    let p = m.path().join("f4");
    let mut f = fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(SeekFrom::Start(1_000_000)).unwrap();
    f.write_all(b"MIDDLE").unwrap();
    drop(f);
    let back = fs::read(&p).unwrap();
    assert_eq!(&back[1_000_000..1_000_006], b"MIDDLE");
    assert_eq!(back.len(), 3 << 20);
}

/// Random operations (hard links included) applied to the mount and to a local directory:
/// same results (errno by errno) and the same tree, contents and link counts at the end.
#[test]
fn random_operations_match_a_local_directory() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(3);
    let m = Mount::new(&cluster);
    let local = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(21);
    let names = ["a", "b", "c"];
    let pick = |rng: &mut StdRng| -> String {
        (0..rng.gen_range(1..=3)).map(|_| names[rng.gen_range(0..3)]).collect::<Vec<_>>().join("/")
    };
    for step in 0..400 {
        let (p, q) = (pick(&mut rng), pick(&mut rng));
        let data: Vec<u8> = (0..rng.gen_range(0..3000)).map(|_| rng.gen()).collect();
        let op = rng.gen_range(0..8);
        let run = |root: &Path| -> Result<(), i32> {
            let r = match op {
                0 => fs::create_dir(root.join(&p)),
                1 => fs::write(root.join(&p), &data),
                2 => fs::remove_file(root.join(&p)),
                3 => fs::remove_dir(root.join(&p)),
                4 => fs::rename(root.join(&p), root.join(&q)),
                5 => fs::read(root.join(&p)).map(drop),
                6 => fs::hard_link(root.join(&p), root.join(&q)),
                _ => fs::OpenOptions::new().append(true).open(root.join(&p)).and_then(|mut f| {
                    use std::io::Write;
                    f.write_all(&data)
                }),
            };
            r.map_err(|e| e.raw_os_error().unwrap_or(-1))
        };
        let (got, want) = (run(m.path()), run(local.path()));
        assert_eq!(got, want, "step {step}: op {op} on {p} -> {q}");
    }
    assert_eq!(tree(m.path()), tree(local.path()));
    let (flushes, _, _) = mounts::deleg_counters(&cluster);
    assert!(flushes > 0, "the mount worked under delegations (its default)");
}

/// Every path below `root` with its kind, and a file's contents and link count.
fn tree(root: &Path) -> BTreeMap<String, Option<(Vec<u8>, u64)>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
                out.insert(rel, None);
            } else {
                out.insert(rel, Some((fs::read(e.path()).unwrap(), e.metadata().unwrap().nlink())));
            }
        }
    }
    out
}

/// A server that disappears under a mount: calls that need it fail with EIO after a
/// bounded retry, others go on, and the mount works again once it is back.
#[test]
fn a_server_lost_under_the_mount_gives_eio_then_recovers() {
    if !fuse_available() {
        return;
    }
    let mut cluster = ProcCluster::start(3);
    let m = Mount::new(&cluster);
    let c = cluster.client();
    // A directory whose home is not the root's server, with a file in it.
    let root_home = c.home("/");
    let dir = (0..50).map(|i| format!("/d{i}")).find(|d| c.home(d) != root_home).unwrap();
    let victim = c.home(&dir);
    fs::create_dir(m.path().join(&dir[1..])).unwrap();
    fs::write(m.path().join(&dir[1..]).join("f"), b"data").unwrap();
    cluster.cluster.kill(victim).unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // past the attribute cache
    let started = Instant::now();
    let err = fs::read(m.path().join(&dir[1..]).join("f")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    eprintln!("EIO after {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(30), "the retry is bounded");
    // The rest of the namespace still answers.
    fs::write(m.path().join("elsewhere"), b"ok").ok();
    cluster.cluster.start(victim).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    assert_eq!(fs::read(m.path().join(&dir[1..]).join("f")).unwrap(), b"data");
}

/// A file unlinked (or renamed over) while open stays usable through its descriptor
/// until the last close, with link count 0; then it is gone for good.
#[test]
fn open_files_outlive_their_names() {
    if !fuse_available() {
        return;
    }
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;
    let cluster = ProcCluster::start(2);
    let m = Mount::new(&cluster);
    let p = m.path().join("tmpfile");
    let mut f = fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    f.write_all(b"kept after unlink").unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0, "fstat after unlink");
    f.write_all(b", and more").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = String::new();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "kept after unlink, and more");
    // Renamed over while open: the reader keeps the old contents.
    fs::write(m.path().join("target"), b"old").unwrap();
    let mut reader = fs::File::open(m.path().join("target")).unwrap();
    fs::write(m.path().join("new"), b"new").unwrap();
    fs::rename(m.path().join("new"), m.path().join("target")).unwrap();
    let mut old = String::new();
    reader.read_to_string(&mut old).unwrap();
    assert_eq!(old, "old");
    assert_eq!(fs::read(m.path().join("target")).unwrap(), b"new");
    drop(f);
    drop(reader);
    // The last closes removed the kept names (the kernel sends release asynchronously).
    let c = cluster.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = rt.block_on(c.readdir("/.plusfs-orphans")).unwrap();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "orphans left after close: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The keeping directory is not listed in the mount.
    assert!(fs::read_dir(m.path()).unwrap().all(|e| e.unwrap().file_name() != ".plusfs-orphans"));
    cluster.assert_fsck_clean();
}

#[test]
fn a_tree_deeper_than_path_max_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(3);
    let m = Mount::new(&cluster);
    let mnt = m.path().display().to_string();
    // 50 levels of 100-byte names: 5,050 bytes below the mount, each call given a short
    // relative path (the shell's cd), as on ext4.
    let name = "d".repeat(100);
    let script = format!(
        "cd {mnt} && for i in $(seq 1 50); do mkdir {name} && cd {name} || exit 1; done && \
         echo deep > f && ln -s f s && test \"$(cat s)\" = deep && mv f g && test \"$(cat g)\" = deep && \
         ls -l > /dev/null && cd .. && test -d {name} && echo ok"
    );
    // bash, whose `cd` falls back to a relative chdir when the logical path is too long.
    let out = Command::new("bash").arg("-c").arg(&script).output().expect("run bash");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{}", String::from_utf8_lossy(&out.stderr));
    let mut c = cluster.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for _ in 0..50 {
        c = rt.block_on(c.chdir(&name)).unwrap();
    }
    assert!(c.cwd().len() > 5000);
    assert_eq!(rt.block_on(c.read("g", 0, 10)).unwrap(), b"deep\n", "the library sees what the mount wrote");
    sh(&format!("rm -rf {mnt}/{name}"));
    assert_eq!(fs::read_dir(m.path()).unwrap().count(), 0);
    cluster.assert_fsck_clean();
}

#[test]
fn parallel_processes_in_one_directory() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(3);
    let m = Mount::new(&cluster);
    let dir = m.path().join("shared");
    fs::create_dir(&dir).unwrap();
    let d = dir.display();
    // Four processes create, write, stat, rename and remove files in one directory at once.
    let script = format!(
        "for p in 1 2 3 4; do (for i in $(seq 1 150); do echo $p.$i > {d}/f$p.$i && \
         test \"$(cat {d}/f$p.$i)\" = $p.$i && mv {d}/f$p.$i {d}/g$p.$i || exit 1; done; \
         for i in $(seq 1 150 | grep -v 0$); do rm {d}/g$p.$i || exit 1; done) & pids=\"$pids $!\"; done; \
         fail=0; for pid in $pids; do wait $pid || fail=1; done; exit $fail"
    );
    sh(&script);
    let mut left: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    let mut expected: Vec<String> =
        (1..=4).flat_map(|p| (10..=150).step_by(10).map(move |i| format!("g{p}.{i}"))).collect();
    expected.sort();
    assert_eq!(left, expected);
    let (code, stats, err) = cluster.cli(&["mount", "--stats", m.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let create = stats.lines().find(|l| l.starts_with("create ")).expect("create counted");
    let calls: u64 = create.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(calls, 600, "{stats}");
    cluster.assert_fsck_clean();
}

#[test]
fn another_mounts_changes_appear_within_the_ttl_even_after_a_miss() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(2);
    let (a, b) = (Mount::new(&cluster), Mount::new(&cluster));
    // A miss is cached (negative entry) for the TTL only.
    assert!(!a.path().join("later").exists());
    fs::write(b.path().join("later"), b"made by b").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::read(a.path().join("later")).unwrap(), b"made by b");
    // Attributes a learnt itself (its own write) give way to b's change after the TTL.
    fs::write(a.path().join("own"), b"1").unwrap();
    assert_eq!(fs::metadata(a.path().join("own")).unwrap().len(), 1);
    fs::write(b.path().join("own"), b"22222").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::metadata(a.path().join("own")).unwrap().len(), 5);
    fs::remove_file(b.path().join("own")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(!a.path().join("own").exists());
}

/// Runs `cmd` with `sh` as user `uid`: whether it succeeded and its error output.
fn as_user(uid: u32, groups: &[u32], cmd: &str) -> (bool, String) {
    let (ok, _, err) = mounts::as_user(uid, groups, cmd);
    (ok, err)
}

#[test]
fn the_servers_refuse_what_the_kernel_used_to_refuse() {
    if !fuse_available() {
        return;
    }
    let cluster = ProcCluster::start(3);
    // Without the kernel's checks: what is refused here, the servers refused.
    let m = Mount::with_options(&cluster, &["allow_other", "nodefault_permissions"]);
    let mnt = m.path().display().to_string();
    // Set up as root: a private directory, a group directory, a sticky scratch directory.
    sh(&format!(
        "mkdir -m 700 {mnt}/private && echo secret > {mnt}/private/x && \
         mkdir -m 770 {mnt}/team && chgrp 4321 {mnt}/team && \
         mkdir -m 1777 {mnt}/scratch && echo mine > {mnt}/readonly && chmod 644 {mnt}/readonly"
    ));
    let denied = |uid, groups: &[u32], cmd: &str| {
        let (ok, err) = as_user(uid, groups, cmd);
        assert!(!ok && (err.contains("ermission denied") || err.contains("not permitted")), "`{cmd}` as {uid}: {err}");
    };
    let allowed = |uid, groups: &[u32], cmd: &str| {
        let (ok, err) = as_user(uid, groups, cmd);
        assert!(ok, "`{cmd}` as {uid} failed: {err}");
    };
    denied(1000, &[], &format!("cat {mnt}/private/x"));
    denied(1000, &[], &format!("ls {mnt}/private"));
    denied(1000, &[], &format!("touch {mnt}/newfile"));
    denied(1000, &[], &format!("echo x >> {mnt}/readonly"));
    denied(1000, &[], &format!("chmod 777 {mnt}/readonly"));
    denied(1000, &[], &format!("touch {mnt}/team/f"));
    allowed(1000, &[4321], &format!("touch {mnt}/team/f && ls {mnt}/team"));
    // Sticky: another user may not remove or rename what 1000 made there.
    allowed(1000, &[], &format!("echo 1000 > {mnt}/scratch/f"));
    denied(1001, &[], &format!("rm -f {mnt}/scratch/f"));
    denied(1001, &[], &format!("mv {mnt}/scratch/f {mnt}/scratch/g"));
    allowed(1000, &[], &format!("mv {mnt}/scratch/f {mnt}/scratch/g && rm {mnt}/scratch/g"));
    assert_eq!(fs::read(format!("{mnt}/private/x")).unwrap(), b"secret\n", "root still may");
    cluster.assert_fsck_clean();
}
