//! The mount over FUSE over io_uring: requests travel through per-CPU io_uring queues when
//! the kernel offers it (`/sys/module/fuse/parameters/enable_uring`, switched on here for
//! the test and restored after). A mount asked for io_uring where it is off fails loudly;
//! coreutils, tar, xattrs and a large directory work over it and its control file counts
//! the requests served over the queues; another mount (over `/dev/fuse`) sees its changes
//! within the TTL and it sees theirs; a mount killed mid-`tar x` loses only unsynced work.
//!
//! The whole FUSE suite over io_uring: `scripts/fuse_uring_suite.sh`.

mod common;
mod mounts;

use common::ProcCluster;
use mounts::{fuse_available, sh, Mount};
use std::fs;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// The kernel's switch for FUSE over io_uring.
const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// The switch is global: the tests of this file take turns.
static TURN: Mutex<()> = Mutex::new(());

/// Sets the switch for the life of the value, then puts back what it was.
struct Switch {
    before: String,
}

impl Switch {
    fn set(on: bool) -> Switch {
        let before = fs::read_to_string(SWITCH).expect("read the io_uring switch").trim().to_string();
        fs::write(SWITCH, if on { "Y" } else { "N" }).expect("set the io_uring switch (needs root)");
        Switch { before }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = fs::write(SWITCH, &self.before);
    }
}

/// Whether the io_uring tests can run: FUSE usable, the kernel built with FUSE over
/// io_uring, and root to switch it. Where not, fails unless skipping was allowed.
fn uring_available() -> bool {
    if !fuse_available() {
        return false;
    }
    let ok = Path::new(SWITCH).exists() && unsafe { libc::geteuid() } == 0;
    if !ok {
        assert!(
            common::skip_allowed(),
            "{SWITCH} is missing (kernel without FUSE over io_uring) or this is not root: the io_uring tests \
             cannot run (set PLUSFS_ALLOW_SKIP=1 to skip them)"
        );
        println!("SKIPPED (PLUSFS_ALLOW_SKIP): FUSE over io_uring is not available here");
    }
    ok
}

/// The line of the mount's control file naming its transport.
fn transport(m: &Mount) -> String {
    m.stats().lines().find(|l| l.starts_with("transport")).expect("a transport line").to_string()
}

/// Requests served over io_uring, from the transport line.
fn served(m: &Mount) -> u64 {
    let line = transport(m);
    let n = line.split(", ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok());
    n.unwrap_or_else(|| panic!("no io_uring request count in `{line}`"))
}

#[test]
fn asked_for_io_uring_where_the_kernel_does_not_offer_it_the_mount_fails_loudly() {
    if !uring_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _off = Switch::set(false);
    let cluster = ProcCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = cluster.cli(&["mount", dir.path().to_str().unwrap(), "-o", "uring"]);
    assert_ne!(code, 0, "the mount must fail: {err}");
    assert!(err.contains("enable_uring"), "the error says how to switch it on: {err}");
    assert!(!mounts::mounted(dir.path()));
    // By default the mount uses /dev/fuse then, and says so.
    let m = Mount::new(&cluster);
    fs::write(m.path().join("f"), b"over /dev/fuse").unwrap();
    assert_eq!(transport(&m), "transport /dev/fuse");
}

#[test]
fn coreutils_tar_xattrs_and_a_large_directory_over_io_uring() {
    if !uring_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _on = Switch::set(true);
    let cluster = ProcCluster::start(2);
    // Asked for by default: the kernel offers it.
    let m = Mount::new(&cluster);
    assert!(transport(&m).starts_with("transport io_uring: "), "{}", transport(&m));
    let before = served(&m);
    let mnt = m.path().display().to_string();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto").canonicalize().unwrap();
    let src = src.display();
    sh(&format!("tar c -C {src} . | tar x -C {mnt} && diff -r {src} {mnt}"));
    let listing = sh(&format!("ls -lR {mnt} | wc -l"));
    assert!(listing.trim().parse::<usize>().unwrap() > 10, "{listing}");
    sh(&format!("mkdir -p {mnt}/a/b && mv {mnt}/src {mnt}/a/b/moved && test -f {mnt}/a/b/moved/lib.rs"));
    sh(&format!("ln -s target {mnt}/l && test \"$(readlink {mnt}/l)\" = target"));
    sh(&format!("echo hello > {mnt}/f && chmod 600 {mnt}/f && test \"$(stat -c %a {mnt}/f)\" = 600"));
    sh(&format!("truncate -s 3 {mnt}/f && test \"$(cat {mnt}/f)\" = hel && ln {mnt}/f {mnt}/g"));
    sh(&format!("test \"$(stat -c %h {mnt}/g)\" = 2 && mkfifo {mnt}/fifo && test -p {mnt}/fifo"));
    mounts::xattr_round_trip(&format!("{mnt}/f"));
    // A directory of 3,000 entries listed with and without attributes; then removed.
    sh(&format!("mkdir {mnt}/big && cd {mnt}/big && seq 3000 | xargs touch"));
    assert_eq!(sh(&format!("ls -f {mnt}/big | wc -l")).trim(), "3002");
    assert_eq!(sh(&format!("ls -l {mnt}/big | grep -c '^-rw'")).trim(), "3000");
    // Large reads and writes (1 MiB requests).
    let local = tempfile::tempdir().unwrap();
    let blob = local.path().join("blob").display().to_string();
    sh(&format!("head -c 5000000 /dev/urandom > {blob} && cp {blob} {mnt}/blob && cmp {blob} {mnt}/blob"));
    // Another mount over /dev/fuse sees a name this mount's kernel cached as missing.
    let other = Mount::with_options(&cluster, &["nouring"]);
    assert_eq!(transport(&other), "transport /dev/fuse");
    assert!(!m.path().join("later").exists());
    fs::write(other.path().join("later"), b"made by the other mount").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::read(m.path().join("later")).unwrap(), b"made by the other mount");
    fs::write(m.path().join("back"), b"made over io_uring").unwrap();
    m.sync();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::read(other.path().join("back")).unwrap(), b"made over io_uring");
    sh(&format!("rm -rf {mnt}/big {mnt}/a && test ! -e {mnt}/big"));
    let over_ring = served(&m) - before;
    println!("{} ({over_ring} requests of this test)", transport(&m));
    assert!(over_ring > 6000, "the requests went over io_uring: {over_ring}");
    drop(other);
    drop(m);
    cluster.assert_fsck_clean();
}

#[test]
fn a_mount_over_io_uring_killed_during_tar_x_loses_only_unsynced_work() {
    if !uring_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _on = Switch::set(true);
    // `uring`: the mount fails rather than falling back to /dev/fuse.
    mounts::tar_kill::killed_during_tar_x_loses_only_unsynced_work(&["uring"]);
}

/// Calls of FUSE operation `op` in the mount's control file.
fn calls(m: &Mount, op: &str) -> u64 {
    let stats = m.stats();
    let line = stats.lines().find(|l| l.split_whitespace().next() == Some(op));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

#[test]
fn without_xattrs_the_kernel_stops_asking_before_each_write() {
    if !uring_available() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _on = Switch::set(true);
    let cluster = ProcCluster::start(1);
    let (with, without) =
        (Mount::with_options(&cluster, &["uring"]), Mount::with_options(&cluster, &["uring", "noxattr"]));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto").canonicalize().unwrap();
    let files = sh(&format!("find {} -type f | wc -l", src.display())).trim().parse::<u64>().unwrap();
    for m in [&with, &without] {
        sh(&format!(
            "tar c -C {} . | tar x -C {} && diff -r {} {}",
            src.display(),
            m.path().display(),
            src.display(),
            m.path().display()
        ));
    }
    // With xattrs, the kernel asks for security.capability before writes of the files.
    let (probes, probes_without) = (calls(&with, "getxattr"), calls(&without, "getxattr"));
    println!("tar x of {files} files: {probes} getxattr requests with xattrs, {probes_without} without");
    assert!(probes >= files, "{}", with.stats());
    assert_eq!(probes_without, 1, "one ENOSYS answer, then no more: {}", without.stats());
    fs::write(without.path().join("pieces"), b"x").unwrap();
    let f = std::ffi::CString::new(format!("{}/pieces", without.path().display())).unwrap();
    let name = std::ffi::CString::new("user.k").unwrap();
    // SAFETY: valid C strings.
    let r = unsafe { libc::setxattr(f.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EOPNOTSUPP)));
}
