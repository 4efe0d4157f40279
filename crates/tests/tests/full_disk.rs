//! A full disk is an error, never a wedge: a user floods a server's small file system with
//! metadata (large xattrs) and with file data; the writes that do not fit fail with ENOSPC,
//! reads, stats and deletes go on for everyone, and once the flood is deleted writes
//! succeed again without a restart. A replica member whose own disk fills steps aside (as
//! a follower and as the leader) and catches up once space returns. Needs root (a tmpfs of
//! a fixed size).

mod common;

use common::{exe, skip_allowed};
use plusfs_client::{Client, ClientOptions};
use plusfs_localcluster::{ClusterSettings, LocalCluster};
use plusfs_proto::Errno;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs of `mib` MiB mounted at `dir/mnt` while it lives.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, mib: u64) -> SmallDisk {
        let mnt = dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0700"), "tmpfs"])
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(st.success(), "mount a tmpfs");
        SmallDisk(mnt)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(skip_allowed(), "full-disk tests need root to mount a small tmpfs (PLUSFS_ALLOW_SKIP=1 skips them)");
    false
}

/// Bytes that do not compress (a store compresses what it keeps).
fn noise(seed: usize, len: usize) -> Vec<u8> {
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sets xattrs of `size` bytes on new files in `dir` until they fail three times in a
/// row, 200 ms apart (a store's flush ending in between frees its log); returns how many
/// files were made and the error that ended it.
async fn flood_xattrs(c: &Client, dir: &str, size: usize) -> (usize, Errno) {
    let (mut made, mut misses) = (0, 0);
    for i in 0..100_000 {
        let path = format!("{dir}/f{i}");
        let r = match c.create(&path, 0o644, true).await {
            Ok(_) => {
                made += 1;
                c.setxattr(&path, "user.fill", &noise(i, size), false, false).await
            }
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => misses = 0,
            Err(e) if e.errno != Errno::ENOSPC || misses == 2 => return (made, e.errno),
            Err(_) => {
                misses += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    panic!("the disk never filled");
}

/// Writes 4 MiB files into `dir` until one fails.
async fn flood_data(c: &Client, dir: &str) -> (usize, Errno) {
    for i in 0..10_000 {
        let path = format!("{dir}/d{i}");
        let r = match c.create(&path, 0o644, true).await {
            Ok(_) => c.write(&path, 0, &noise(i, 4 << 20)).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            return (i, e.errno);
        }
    }
    panic!("the disk never filled");
}

async fn remove_all(c: &Client, dir: &str, log: &Path) -> usize {
    let entries = c.readdir(dir).await.unwrap();
    for e in &entries {
        if let Err(err) = c.unlink(&format!("{dir}/{}", e.name)).await {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            panic!("delete on a full disk: {err}\n{}", tail.join("\n"));
        }
    }
    entries.len()
}

/// Waits until a create succeeds again (no restart): how long it took.
async fn writable_again(c: &Client, path: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        match c.mkdir(path, 0o755).await {
            Ok(_) => return t0.elapsed(),
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(30), "still failing 30 s after space was freed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The disk's use and the server log's end, for a failure message.
fn diagnose(cluster: &LocalCluster, mnt: &Path) -> String {
    let log = std::fs::read_to_string(&cluster.logs()[0]).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(10).collect();
    let df = Command::new("df").arg("-B1").arg(mnt).output().unwrap();
    let du = Command::new("du").arg("-b").arg("-d3").arg(mnt).output().unwrap();
    let ls = Command::new("ls").arg("-la").arg(mnt.join("cluster/server-0/store")).output().unwrap();
    // The store engine's own account of its failures (a background error stops it).
    let engine_log = std::fs::read_to_string(mnt.join("cluster/server-0/store/LOG")).unwrap_or_default();
    let errors: Vec<&str> = engine_log.lines().filter(|l| l.contains("rror") || l.contains("space")).take(20).collect();
    format!(
        "{}{}{}{}\nstore engine log:\n{}",
        String::from_utf8_lossy(&df.stdout),
        String::from_utf8_lossy(&du.stdout),
        String::from_utf8_lossy(&ls.stdout),
        tail.join("\n"),
        errors.join("\n")
    )
}

/// A user certificate (uids and gids 1000-1999) of `cluster`'s CA, and a client with it.
fn user_client(cluster: &LocalCluster, dir: &Path, name: &str) -> Client {
    use plusfs_tls::{Authority, Identity, Ranges, Role, RootClaim, Validity};
    let ca = Authority::load(&cluster.data().join("certs/ca")).unwrap();
    let ids = Ranges::parse("1000-1999").unwrap();
    let role = Role::User { uids: ids.clone(), gids: ids, root: RootClaim::Squash };
    ca.issue(&Identity { name: name.into(), role }, Validity::days(1), &dir.join(name)).unwrap();
    let mut map = cluster.map().clone();
    map.tls.identity = Some(dir.join(name));
    Client::new(map, ClientOptions { retries: 2, delegations: false, ..Default::default() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_enospc_and_recovers_without_a_restart() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(dir.path(), 512);
    let settings = ClusterSettings::default();
    let mut cluster = LocalCluster::up(&exe(), &disk.0.join("cluster"), Some(1), &settings).expect("cluster up");
    let admin =
        Client::new(cluster.map().clone(), ClientOptions { retries: 2, delegations: false, ..Default::default() });
    for d in ["/meta", "/data", "/keep"] {
        admin.mkdir(d, 0o755).await.unwrap();
        admin.chmod(d, 0o1777).await.unwrap();
    }
    let (hog, other) = (user_client(&cluster, dir.path(), "hog"), user_client(&cluster, dir.path(), "other"));
    other.create("/keep/a", 0o644, true).await.unwrap();
    other.write("/keep/a", 0, b"kept").await.unwrap();
    let pid = cluster.pid(0).unwrap();

    // A user floods the disk with metadata: ENOSPC for every user's creates, before the
    // store runs out; reads go on; deleting the flood makes room at once.
    let (n, errno) = flood_xattrs(&hog, "/meta", 60_000).await;
    eprintln!("metadata flood: {n} files with 60 KB xattrs, then {errno:?}");
    if errno != Errno::ENOSPC {
        let log = std::fs::read_to_string(&cluster.logs()[0]).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let df = Command::new("df").arg(&disk.0).output().unwrap();
        panic!(
            "a full disk answers {errno:?}, not ENOSPC\n{}\n{}",
            String::from_utf8_lossy(&df.stdout),
            tail.join("\n")
        );
    }
    assert!(n > 100, "the flood ended early ({n})");
    let e = other.mkdir("/keep/new", 0o755).await.unwrap_err();
    assert_eq!(e.errno, Errno::ENOSPC, "{e}");
    assert_eq!(other.read_all("/keep/a").await.unwrap(), b"kept", "reads go on");
    other.lstat("/meta/f0").await.expect("stats go on");
    assert_eq!(remove_all(&hog, "/meta", &cluster.logs()[0]).await, n);
    let took = writable_again(&other, "/keep/after-meta").await;
    eprintln!("writable again {took:?} after the metadata flood was deleted");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // A data flood stops at the data reserve; reads go on; once it is deleted the server
    // compacts its data by itself and file data fits again.
    let t0 = Instant::now();
    while let Err(e) =
        hog.create("/data/first", 0o644, false).await.and(hog.write("/data/first", 0, &noise(1, 4 << 20)).await)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no file data fits 10 s after the metadata flood was deleted: {e}\n{}",
            diagnose(&cluster, &disk.0)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("file data fits {:?} after the metadata flood was deleted", t0.elapsed());
    let (n, errno) = flood_data(&hog, "/data").await;
    eprintln!("data flood: {n} files of 4 MiB, then {errno:?}");
    assert_eq!(errno, Errno::ENOSPC);
    assert_eq!(other.read_all("/keep/a").await.unwrap(), b"kept", "reads go on");
    remove_all(&hog, "/data", &cluster.logs()[0]).await;
    let t0 = Instant::now();
    let put = || async {
        other.create("/keep/b", 0o644, false).await?;
        other.write("/keep/b", 0, &noise(7, 4 << 20)).await
    };
    while let Err(e) = put().await {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "file data still refused 30 s after the flood was deleted: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("file data fits again {:?} after the data flood was deleted", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}\n{}", t0.elapsed(), diagnose(&cluster, &disk.0));

    // Something else fills the disk to the last byte: every write, an admin's too, is
    // refused with ENOSPC before the store runs out (the store itself is never let fail);
    // reads go on; the server takes writes again once space returns.
    let filler = disk.0.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![0u8; 1 << 20];
    while std::io::Write::write_all(&mut f, &block).is_ok() {}
    drop(f);
    // The server measures its free space at most every 50 ms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let df = Command::new("df").arg("-B1").arg(&disk.0).output().unwrap();
    eprintln!("{}", String::from_utf8_lossy(&df.stdout));
    for (who, c) in [("an admin", &admin), ("a user", &other)] {
        let e = c.mkdir("/keep/full", 0o755).await.expect_err("a create on a full disk");
        assert_eq!(e.errno, Errno::ENOSPC, "{who}: {e}");
        let e = c.create("/keep/full-file", 0o644, true).await.expect_err("a create on a full disk");
        assert_eq!(e.errno, Errno::ENOSPC, "{who}: {e}");
    }
    assert_eq!(other.read_all("/keep/a").await.unwrap(), b"kept", "reads go on");
    assert!(!cluster.has_exited(0).unwrap(), "the server is alive on a full disk");
    std::fs::remove_file(&filler).unwrap();
    let took = writable_again(&admin, "/keep/after-filler").await;
    eprintln!("writable again {took:?} after the other process's file was deleted");
    assert!(took < Duration::from_secs(5), "{took:?}");

    assert_eq!(cluster.pid(0), Some(pid), "the server never restarted");
    assert!(!cluster.has_exited(0).unwrap(), "the server is alive");
    let fsck = Command::new(exe()).arg("fsck").env("PLUSFS_CLUSTER", cluster.map_file()).output().unwrap();
    assert!(fsck.status.success(), "fsck: {}", String::from_utf8_lossy(&fsck.stdout));
    cluster.shutdown().unwrap();
}

/// Free bytes of the file system holding `dir` (for an unprivileged user).
fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a writable statvfs.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0);
    st.f_bavail as u64 * st.f_frsize as u64
}

/// Fills the file system of `dir` with a file `dir/filler` until `leave` bytes are free.
fn fill(dir: &Path, leave: u64) -> PathBuf {
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![0u8; 1 << 20];
    while free_bytes(dir) > leave + (1 << 20) {
        std::io::Write::write_all(&mut f, &block).unwrap();
    }
    filler
}

/// Waits until member `m` of server 0 has applied as much as the serving member.
fn caught_up(cluster: &LocalCluster, m: u64, within: Duration, log: &Path) -> Duration {
    let t0 = Instant::now();
    loop {
        let views = cluster.group_views(0).unwrap();
        let applied = |id: u64| views.iter().find(|(v, _)| *v == id).and_then(|(_, g)| g.as_ref()?.applied);
        let lead = views.iter().find(|(_, g)| g.as_ref().is_some_and(|g| g.serving)).map(|(id, _)| *id);
        if lead.is_some_and(|l| applied(l).is_some() && applied(m) >= applied(l)) {
            return t0.elapsed();
        }
        if t0.elapsed() > within {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!("member {m} did not catch up in {within:?}: {views:?}\n{}", tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the other process leaves free on a member's disk: below the floor the member
/// keeps for its store (8 MiB and the room of the store's upkeep), above nothing.
const LEFT_FREE: u64 = 16 << 20;

/// A replica member whose own disk fills (another process's file) neither aborts nor holds
/// its group up: as a follower it refuses entries while the others go on; as the leader
/// it steps down and another member leads; once space returns it catches up, without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_member_with_a_full_disk_steps_aside_and_catches_up() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let settings = ClusterSettings { replicas: 3, ..Default::default() };
    let root = dir.path().join("cluster");
    let mut cluster = LocalCluster::up(&exe(), &root, Some(1), &settings).expect("cluster up");
    let admin =
        Client::new(cluster.map().clone(), ClientOptions { retries: 5, delegations: false, ..Default::default() });
    admin.mkdir("/w", 0o755).await.unwrap();
    let lead = cluster.serving_member(0).unwrap().expect("a serving member");
    let small = (0..3u64).find(|&m| m != lead).unwrap();
    // The member's data directory moves to a small disk of its own.
    cluster.kill_member(0, small).unwrap();
    let member_dir = root.join(format!("server-0-m{small}"));
    let saved = dir.path().join("saved");
    assert!(Command::new("cp").arg("-a").arg(&member_dir).arg(&saved).status().unwrap().success());
    let disk = SmallDisk::mount(dir.path(), 400);
    assert!(Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", saved.display()))
        .arg(&disk.0)
        .status()
        .unwrap()
        .success());
    std::fs::remove_dir_all(&member_dir).unwrap();
    std::os::unix::fs::symlink(&disk.0, &member_dir).unwrap();
    cluster.start_member(0, small).unwrap();
    let pid = cluster.member_pid(0, small).unwrap();
    let log = root.join(format!("server-0-m{small}.log"));
    let mut n = 0;
    let mut work = async |count: usize| {
        for _ in 0..count {
            admin.mkdir(&format!("/w/d{n}"), 0o755).await.unwrap();
            admin.create(&format!("/w/f{n}"), 0o644, true).await.unwrap();
            admin.write(&format!("/w/f{n}"), 0, &noise(n, 256 << 10)).await.unwrap();
            n += 1;
        }
    };
    work(20).await;
    caught_up(&cluster, small, Duration::from_secs(30), &log);

    // As a follower: the others go on.
    let filler = fill(&disk.0, LEFT_FREE);
    tokio::time::sleep(Duration::from_millis(600)).await;
    work(40).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("disk full: refusing entries"), "{text}");
    std::fs::remove_file(&filler).unwrap();
    let took = caught_up(&cluster, small, Duration::from_secs(30), &log);
    eprintln!("a follower whose disk was full caught up {took:?} after space returned");

    // As the leader: it steps down, another member serves, clients go on. Each round kills
    // whoever leads, so some election soon picks it (30 rounds: a CI run once saw 12
    // elections in a row go to the others).
    for _ in 0..30 {
        let now = cluster.serving_member(0).unwrap();
        if now == Some(small) {
            break;
        }
        if let Some(now) = now {
            cluster.kill_member(0, now).unwrap();
            let t0 = Instant::now();
            while cluster.serving_member(0).unwrap().is_none_or(|m| m == now) && t0.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            cluster.start_member(0, now).unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(cluster.serving_member(0).unwrap(), Some(small), "member {small} leads");
    work(5).await;
    let filler = fill(&disk.0, LEFT_FREE);
    let t0 = Instant::now();
    while cluster.serving_member(0).unwrap().is_none_or(|m| m == small) {
        if t0.elapsed() > Duration::from_secs(20) {
            let text = std::fs::read_to_string(&log).unwrap();
            let tail: Vec<&str> = text.lines().rev().filter(|l| !l.contains("openraft")).take(30).collect();
            panic!("no other member serves: {:?}\n{}", cluster.group_views(0).unwrap(), tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the leader whose disk filled stepped down; another serves after {:?}", t0.elapsed());
    work(20).await;
    std::fs::remove_file(&filler).unwrap();
    let took = caught_up(&cluster, small, Duration::from_secs(30), &log);
    eprintln!("the former leader caught up {took:?} after space returned");
    assert_eq!(cluster.member_pid(0, small), Some(pid), "the same process: it never aborted");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "alive");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("its disk is full"), "{text}");
    for i in 0..n {
        assert_eq!(admin.read_all(&format!("/w/f{i}")).await.unwrap(), noise(i, 256 << 10), "/w/f{i}");
    }
    let fsck = Command::new(exe()).args(["fsck", "--replicas"]).env("PLUSFS_CLUSTER", cluster.map_file()).output();
    let fsck = fsck.unwrap();
    let out = String::from_utf8_lossy(&fsck.stdout);
    assert!(fsck.status.success() && out.contains("3 members agree"), "{out}");
    drop(cluster);
}
