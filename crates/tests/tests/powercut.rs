//! Acknowledged means durable, checked with real power cuts: a cluster's data directories
//! live on an ext4 file system (a loop device), a mixed workload runs (Cx mkdirs, file
//! puts, batch creates), and in the middle of it the file system is shut down the way
//! xfstests simulates a power loss (`FS_IOC_SHUTDOWN` without flushing its journal: every
//! byte not fsynced is gone, for every server at the same instant). The servers are
//! stopped just before (SIGSTOP: the instant the power goes, no answer leaves after it)
//! and killed after, the file system mounted again and the cluster restarted: every
//! operation that was acknowledged must be there, and fsck must find the namespace clean.
//!
//! Needs root (loop devices, mount). `PLUSFS_POWERCUT_RUNS` sets the runs per cluster
//! shape (default 2).

mod common;

use common::{exe, skip_allowed};
use plusfs_client::{Client, ClientOptions, NewFile};
use plusfs_localcluster::{ClusterSettings, LocalCluster};
use plusfs_placement::SyncMode;
use plusfs_proto::{BatchOp, Semantics};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An ext4 file system on a loop device over a sparse image, mounted at `mnt`.
struct Disk {
    image: PathBuf,
    mnt: PathBuf,
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Disk {
    fn make(dir: &Path) -> Disk {
        let image = dir.join("disk.img");
        let mnt = dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        sh(Command::new("truncate").args(["-s", "6G"]).arg(&image));
        sh(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let disk = Disk { image, mnt };
        disk.mount();
        disk
    }

    fn mount(&self) {
        sh(Command::new("mount").args(["-o", "loop"]).arg(&self.image).arg(&self.mnt));
    }

    fn unmount(&self) {
        // The servers are dead, but the kernel may hold the mount a moment longer.
        for _ in 0..50 {
            if Command::new("umount").arg(&self.mnt).status().is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("cannot unmount {}", self.mnt.display());
    }

    /// Everything written so far reaches the disk (the cluster's setup: certificates,
    /// map, empty stores; a real site's are on disk long before a power loss).
    fn sync(&self) {
        sh(Command::new("sync").arg("-f").arg(&self.mnt));
    }

    /// The power cut: the file system stops, its journal not flushed; whatever was not
    /// fsynced is lost.
    fn cut(&self) {
        use std::os::fd::AsRawFd;
        // FS_IOC_SHUTDOWN = _IOR('X', 125, __u32); EXT4_GOING_FLAGS_NOLOGFLUSH = 2.
        const FS_IOC_SHUTDOWN: libc::c_ulong = (2 << 30) | (4 << 16) | ((b'X' as libc::c_ulong) << 8) | 125;
        let dir = std::fs::File::open(&self.mnt).unwrap();
        let flags: u32 = 2;
        // SAFETY: the ioctl reads one u32 from a pointer to a live local.
        let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_SHUTDOWN, &flags as *const u32) };
        assert_eq!(rc, 0, "FS_IOC_SHUTDOWN: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// What the workload had acknowledged, each with the instant its answer arrived.
#[derive(Default)]
struct Acked {
    dirs: Vec<(String, Instant)>,
    files: Vec<(String, Vec<u8>, Instant)>,
    batched: Vec<(String, Instant)>,
    /// Operations that failed after the cut (the proof it hit mid-workload).
    failed_after_cut: usize,
}

fn content(i: usize) -> Vec<u8> {
    // Past the small-file size now and then, so data segments are exercised as well.
    let len = if i.is_multiple_of(4) { 70_000 } else { 900 };
    (0..len).map(|k| (i * 31 + k) as u8).collect()
}

/// Runs mkdirs, puts and batch creates until `stop`, recording what was acknowledged.
async fn workload(c: Client, acked: Arc<Mutex<Acked>>, cut_at: Instant, stop: Instant) {
    let note_failure = |acked: &Arc<Mutex<Acked>>| {
        if Instant::now() >= cut_at {
            acked.lock().unwrap().failed_after_cut += 1;
        }
    };
    let mkdirs = async {
        for i in 0.. {
            if Instant::now() > stop {
                break;
            }
            let p = format!("/x/d{i}");
            match tokio::time::timeout(Duration::from_secs(3), c.mkdir(&p, 0o755)).await {
                Ok(Ok(_)) => acked.lock().unwrap().dirs.push((p, Instant::now())),
                _ => note_failure(&acked),
            }
        }
    };
    let puts = async {
        for i in 0.. {
            if Instant::now() > stop {
                break;
            }
            let f = NewFile { path: format!("/f/p{i}"), data: content(i), mode: 0o644, owner: None, mtime: None };
            let data = f.data.clone();
            match tokio::time::timeout(Duration::from_secs(3), c.batch_write(vec![f])).await {
                Ok(r) if r.iter().all(Result::is_ok) => {
                    acked.lock().unwrap().files.push((format!("/f/p{i}"), data, Instant::now()))
                }
                other => {
                    if Instant::now() < cut_at {
                        let why = other.map(|r| format!("{r:?}")).unwrap_or_else(|_| "no answer in 3 s".into());
                        panic!("a put failed before the cut: {why}");
                    }
                    note_failure(&acked)
                }
            }
        }
    };
    let batches = async {
        for round in 0.. {
            if Instant::now() > stop {
                break;
            }
            let names: Vec<String> = (0..20).map(|k| format!("b{round}-{k}")).collect();
            let create = BatchOp::Create { exclusive: true };
            match tokio::time::timeout(
                Duration::from_secs(3),
                c.batch(create, "/b", &names, 0o644, Semantics::PerformAll),
            )
            .await
            {
                Ok(Ok(out)) => {
                    let at = Instant::now();
                    let mut a = acked.lock().unwrap();
                    for (n, o) in names.iter().zip(out) {
                        if o.into_result().is_ok() {
                            a.batched.push((format!("/b/{n}"), at));
                        }
                    }
                }
                _ => note_failure(&acked),
            }
        }
    };
    tokio::join!(mkdirs, puts, batches);
}

/// One power cut of a cluster of `settings` with `servers` slots; returns what was
/// acknowledged and lost.
async fn one_cut(base: &Path, servers: usize, settings: &ClusterSettings, run: usize) -> (usize, Vec<String>) {
    let dir = tempfile::tempdir_in(base).unwrap();
    let disk = Disk::make(dir.path());
    let data = disk.mnt.join("cluster");
    let cluster = LocalCluster::up(&exe(), &data, Some(servers), settings).expect("cluster up");
    // Without delegations: what is checked is what the servers acknowledged (a delegating
    // client answers creates itself and makes them durable at fsync).
    let client =
        || Client::new(cluster.map().clone(), ClientOptions { retries: 2, delegations: false, ..Default::default() });
    let c = client();
    for d in ["/x", "/f", "/b"] {
        c.mkdir(d, 0o755).await.unwrap();
    }
    // The setup is on disk before the workload starts.
    disk.sync();

    let acked = Arc::new(Mutex::new(Acked::default()));
    let started = Instant::now();
    // The cut falls somewhere in the third and fourth seconds of the workload.
    let cut_at = started + Duration::from_millis(2_000 + (run as u64 * 397) % 2_000);
    let stop = cut_at + Duration::from_millis(1_500);
    let work = tokio::spawn(workload(client(), acked.clone(), cut_at, stop));
    tokio::time::sleep_until(cut_at.into()).await;
    let before_cut = {
        let a = acked.lock().unwrap();
        a.dirs.len() + a.files.len() + a.batched.len()
    };
    // A canary written but not fsynced just before the cut: its bytes must be gone after
    // it (the cut really drops what was not fsynced).
    let canary = disk.mnt.join("canary");
    std::fs::write(&canary, vec![7u8; 1 << 20]).unwrap();
    // The instant of the power loss: a real one stops every server at once. Here every
    // server process is stopped first (each thread once its system call returns, so an
    // fsync under way finishes and is either answered before the cut or never), then the
    // file system is shut down, then the processes die. Without the stop, an fsync racing
    // with FS_IOC_SHUTDOWN could report success for a journal commit the shutdown drops,
    // and its answer would reach a client after the "power" was gone.
    let pids: Vec<u32> = cluster_pids(&cluster);
    freeze(&pids);
    let cut_started = Instant::now();
    disk.cut();
    for pid in &pids {
        plusfs_localcluster::kill_pid(*pid);
    }
    work.await.unwrap();
    drop(cluster);
    disk.unmount();
    disk.mount();

    let kept = std::fs::read(&canary).unwrap_or_default();
    assert!(kept != vec![7u8; 1 << 20], "bytes not fsynced survived the cut: it did not simulate a power loss");
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(before_cut > 0, "the workload had acknowledged nothing before the cut");
    assert!(acked.failed_after_cut > 0, "no operation failed after the cut: it did not hit mid-workload");
    let mut restarted = LocalCluster::up(&exe(), &data, None, settings).expect("the cluster restarts after the cut");
    let c = Client::new(restarted.map().clone(), ClientOptions { retries: 5, ..Default::default() });
    // Every acknowledged operation must be there: its answer left a server before the
    // servers stopped, so its fsync returned before the cut. Those whose answer arrived
    // after the cut began (in flight when the servers stopped) are counted apart, to show
    // in the report where a loss falls.
    let (mut lost, mut lost_late) = (Vec::new(), Vec::new());
    let mut note = |what: String, at: Instant| {
        if at < cut_started {
            lost.push(what);
        } else {
            lost_late.push(format!("{what} (answer received after the cut began)"));
        }
    };
    for (d, at) in &acked.dirs {
        if c.lstat(d).await.is_err() {
            note(format!("mkdir {d}"), *at);
        }
    }
    for (f, want, at) in &acked.files {
        match c.read_all(f).await {
            Ok(got) if got == *want => {}
            Ok(got) => note(format!("put {f}: {} bytes back of {}", got.len(), want.len()), *at),
            Err(e) => note(format!("put {f}: {e}"), *at),
        }
    }
    for (f, at) in &acked.batched {
        if c.lstat(f).await.is_err() {
            note(format!("batch create {f}"), *at);
        }
    }
    let n = acked.dirs.len() + acked.files.len() + acked.batched.len();
    let late =
        acked.dirs.iter().map(|d| d.1).chain(acked.files.iter().map(|f| f.2)).chain(acked.batched.iter().map(|b| b.1));
    let late = late.filter(|at| *at >= cut_started).count();
    let fsck = Command::new(exe()).arg("fsck").env("PLUSFS_CLUSTER", restarted.map_file()).output().unwrap();
    if !fsck.status.success() {
        lost.push(format!("fsck: {}", String::from_utf8_lossy(&fsck.stdout)));
    }
    eprintln!(
        "run {run}: {n} acknowledged ({} mkdirs, {} puts, {} batch creates; {late} answers received after the cut \
         began), {} failed after the cut, {} lost before the cut, {} lost of those received after",
        acked.dirs.len(),
        acked.files.len(),
        acked.batched.len(),
        acked.failed_after_cut,
        lost.len(),
        lost_late.len()
    );
    lost.extend(lost_late);
    restarted.shutdown().unwrap();
    drop(restarted);
    (n, lost)
}

/// Stops every process of `pids` (SIGSTOP) and waits until each of their threads is
/// stopped: a thread inside a system call (an fsync) stops when the call returns.
fn freeze(pids: &[u32]) {
    for &pid in pids {
        // SAFETY: kill(2) with a pid this test's cluster started.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let stopped = |pid: u32| {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
            matches!(state, None | Some('T') | Some('t') | Some('Z') | Some('X'))
        })
    };
    while !pids.iter().all(|&p| stopped(p)) {
        assert!(Instant::now() < deadline, "the servers did not stop within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cluster_pids(c: &LocalCluster) -> Vec<u32> {
    let mut pids = Vec::new();
    for s in &c.map().servers {
        if s.members.is_empty() {
            pids.extend(c.pid(s.id));
        }
        for m in &s.members {
            pids.extend(c.member_pid(s.id, m.id));
        }
    }
    pids
}

fn runs() -> usize {
    std::env::var("PLUSFS_POWERCUT_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}

/// Root, loop devices and ext4 are here (else the test fails, unless skipping is allowed).
fn prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["mkfs.ext4", "losetup"]
        .iter()
        .all(|t| Command::new("which").arg(t).output().is_ok_and(|o| o.status.success()));
    if root && tools && Path::new("/dev/loop-control").exists() {
        return true;
    }
    assert!(skip_allowed(), "power-cut tests need root, loop devices and mkfs.ext4 (PLUSFS_ALLOW_SKIP=1 skips them)");
    eprintln!("skipped: power-cut tests need root, loop devices and mkfs.ext4");
    false
}

async fn cuts(servers: usize, settings: ClusterSettings, shape: &str) {
    if !prerequisites() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let (mut acked, mut lost) = (0, Vec::new());
    for run in 0..runs() {
        let (n, l) = one_cut(base.path(), servers, &settings, run).await;
        acked += n;
        lost.extend(l);
    }
    eprintln!("{shape}: {} runs, {acked} acknowledged operations, {} lost", runs(), lost.len());
    assert!(lost.is_empty(), "{shape}: acknowledged operations lost on a power cut:\n{}", lost.join("\n"));
}

/// Replica groups of three: an acknowledgement promises a majority fsynced it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_acknowledged_by_replica_groups() {
    cuts(2, ClusterSettings { replicas: 3, ..Default::default() }, "2 slots x 3 members").await;
}

/// Single servers with `sync = always`: an acknowledgement promises an fsync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_acknowledged_with_sync_always() {
    cuts(3, ClusterSettings { sync: SyncMode::Always, ..Default::default() }, "3 servers, sync = always").await;
}
