//! An elastic cluster: servers added, drained and removed while clients work. Real server
//! processes; the changes are made with the `plusfs cluster` commands an operator uses.
//! Each test checks that every acknowledged operation is there afterwards, that fsck finds
//! every directory object at its home under the final map, and that the change really
//! happened while the workload ran (or the fault really hit a migration under way).

mod common;
mod mounts;

use common::{issue, ProcCluster};
use plusfs_client::{Client, ClientOptions, NewFile};
use plusfs_localcluster::ClusterSettings;
use plusfs_placement::{ClusterMap, RebalanceSettings};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stops every server of the cluster in a data directory when dropped, those the
/// `cluster add` command started included (the test cluster knows only its own).
struct DownOnDrop(PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = plusfs_localcluster::down(&self.0, Duration::from_secs(5));
    }
}

fn data_dir(c: &ProcCluster) -> String {
    c.cluster.data().display().to_string()
}

/// Every server's `cluster status --json` object, by id.
fn statuses(c: &ProcCluster) -> Vec<Value> {
    let (_, out, err) = c.cli(&["cluster", "status", "--json", "--data", &data_dir(c)]);
    let all: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).expect("a JSON status line")).collect();
    assert!(!all.is_empty(), "status failed: {out}{err}");
    // Servers that do not answer are reported as down; the others' statuses are wanted.
    all.into_iter().filter(|s| s.get("down").is_none()).collect()
}

fn status_of(c: &ProcCluster, id: u64) -> Value {
    statuses(c).into_iter().find(|s| s["id"] == id).unwrap_or_else(|| panic!("no status of server {id}"))
}

/// The map the map service holds now (the file, which every command brings up to date).
fn current_map(c: &ProcCluster) -> ClusterMap {
    let (code, out, err) = c.cli(&["cluster", "status", "--data", &data_dir(c)]);
    assert!(code == 0 || out.contains("epoch"), "status failed: {out}{err}");
    ClusterMap::load(&c.cluster.map_file()).unwrap()
}

/// Waits until no migration runs.
fn wait_balanced(c: &ProcCluster, limit: Duration) -> ClusterMap {
    let started = Instant::now();
    loop {
        let map = current_map(c);
        if !map.migrating() {
            return map;
        }
        assert!(started.elapsed() < limit, "the migration did not end within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn content(i: usize, len: usize) -> Vec<u8> {
    common::bytes(i as u64 * 7919 + 1, len)
}

/// When the change under test started, and ended (none: still running).
type Window = Arc<std::sync::Mutex<Option<(Instant, Option<Instant>)>>>;

/// What the workload was told succeeded.
#[derive(Default)]
struct Acked {
    files: Vec<(String, Vec<u8>)>,
    dirs: Vec<String>,
    /// Acknowledged operations that ended while the migration ran.
    during: usize,
    /// Acknowledged operations that ended before it began.
    before: usize,
}

/// Creates files (some with a chunk beyond the small-file part), makes directories with
/// Cx and renames some, and writes BFO batches, until `stop`; notes what succeeded and how
/// many acknowledgements fell inside `window` (set by the test while the change runs).
async fn workload(c: Client, stop: Arc<AtomicBool>, window: Window) -> Acked {
    let mut a = Acked::default();
    let in_window = |w: &Window| matches!(*w.lock().unwrap(), Some((_, None)));
    let before = |w: &Window| w.lock().unwrap().is_none();
    for i in 0..4000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let len = if i % 97 == 5 { (1 << 20) + 300_000 } else { 200 + (i * 37) % 3000 };
        let f = format!("/w/a{}/f{i}", i % 40);
        let data = content(i, len);
        if c.create(&f, 0o644, true).await.is_ok() && c.write(&f, 0, &data).await.is_ok() {
            a.files.push((f, data));
            a.during += in_window(&window) as usize;
            a.before += before(&window) as usize;
        }
        let d = format!("/m/d{i}");
        if c.mkdir(&d, 0o755).await.is_ok() {
            let sub = format!("{d}/s");
            let sub_ok = c.mkdir(&sub, 0o755).await.is_ok();
            if i % 3 == 0 {
                let r = format!("/m/r{i}");
                if c.rename(&d, &r).await.is_ok() {
                    a.dirs.push(r.clone());
                    if sub_ok {
                        a.dirs.push(format!("{r}/s"));
                    }
                } else {
                    // Unacknowledged: either name may hold it; not checked.
                }
            } else {
                a.dirs.push(d.clone());
                if sub_ok {
                    a.dirs.push(sub);
                }
            }
            a.during += in_window(&window) as usize;
            a.before += before(&window) as usize;
        }
        if i % 10 == 0 {
            let files: Vec<NewFile> = (0..20)
                .map(|k| {
                    NewFile::new(format!("/b/g{}/x{i}_{k}", (i / 10) % 10), content(100_000 + i * 20 + k, 500 + k * 50))
                })
                .collect();
            let expect: Vec<(String, Vec<u8>)> = files.iter().map(|f| (f.path.clone(), f.data.clone())).collect();
            for (r, e) in c.batch_write(files).await.into_iter().zip(expect) {
                if r.is_ok() {
                    a.files.push(e);
                }
            }
        }
    }
    a
}

async fn check_acked(c: &Client, a: &Acked) {
    for (p, data) in &a.files {
        let got = c.read_all(p).await.unwrap_or_else(|e| panic!("acknowledged file {p}: {e}"));
        assert!(got == *data, "{p}: contents differ ({} bytes, {} expected)", got.len(), data.len());
    }
    for d in &a.dirs {
        let st = c.lstat(d).await.unwrap_or_else(|e| panic!("acknowledged directory {d}: {e}"));
        assert_eq!(st.kind, plusfs_proto::FileKind::Dir, "{d}");
    }
}

async fn make_tree(c: &Client) {
    for p in ["/w", "/m", "/b"] {
        c.mkdir(p, 0o755).await.unwrap();
    }
    for k in 0..40 {
        c.mkdir(&format!("/w/a{k}"), 0o755).await.unwrap();
    }
    for k in 0..10 {
        c.mkdir(&format!("/b/g{k}"), 0o755).await.unwrap();
    }
}

/// Objects the fsck of the final map finds at their homes, and the new server holds some.
fn assert_placed(c: &ProcCluster, new_id: u64) {
    c.assert_fsck_clean();
    let st = status_of(c, new_id);
    assert!(st["dir_objects"].as_u64().unwrap() > 0, "the new server holds no directory object: {st}");
}

/// The tree `tar_loop` copies, and the copies it made.
type Trees = (PathBuf, Vec<PathBuf>);

/// A mount extracting a tree with tar, again and again (each copy compared with `diff -r`),
/// in its own thread until `stop`.
fn tar_loop(m: &mounts::Mount, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Trees> {
    let mnt = m.path().to_path_buf();
    std::thread::spawn(move || {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("proto").canonicalize().unwrap();
        let mut done = Vec::new();
        for k in 0..50 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let dst = mnt.join(format!("t{k}"));
            mounts::sh(&format!(
                "mkdir {dst} && tar -C {src} -cf - . | tar -C {dst} -xf - && diff -r {src} {dst}",
                dst = dst.display(),
                src = src.display()
            ));
            done.push(dst);
        }
        (src, done)
    })
}

/// `tar_loop` as user 1000 through `m` (a mount presenting a node identity): the tree is a
/// copy of the source others may read, the copies go below `/u` (owned by 1000).
fn user_tar_loop(m: &mounts::Mount, base: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Trees> {
    let mnt = m.path().join("u");
    let src = base.join("src");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("proto").canonicalize().unwrap();
    mounts::sh(&format!("cp -r {} {} && chmod -R a+rX {}", proto.display(), src.display(), src.display()));
    std::thread::spawn(move || {
        let mut done = Vec::new();
        for k in 0..50 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let dst = mnt.join(format!("t{k}"));
            let cmd = format!(
                "mkdir {dst} && tar -C {src} -cf - . | tar -C {dst} -xf - && diff -r {src} {dst}",
                dst = dst.display(),
                src = src.display()
            );
            let (ok, out, err) = mounts::as_user(1000, &[], &cmd);
            assert!(ok, "as uid 1000 through the node mount: `{cmd}` failed: {out}{err}");
            done.push(dst);
        }
        (src, done)
    })
}

/// A hostile user next to the others: `tasks` clients with `map` (which names the user's
/// identity) create, look up and remove files in `/hog` as fast as the servers take them,
/// until `stop` (at most 20,000 rounds each); answers the operations the servers answered.
async fn hog(map: ClusterMap, tasks: usize, stop: Arc<AtomicBool>) -> usize {
    let mut all = Vec::new();
    for t in 0..tasks {
        let opts = ClientOptions { retries: 1, uid: 2000, gid: 2000, groups: Vec::new(), ..Default::default() };
        let hc = Client::new(map.clone(), opts);
        let stop = stop.clone();
        all.push(tokio::spawn(async move {
            let mut answered = 0;
            for i in 0..20_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let f = format!("/hog/t{t}-{}", i % 500);
                answered += hc.create(&f, 0o644, false).await.is_ok() as usize;
                answered += hc.lstat(&f).await.is_ok() as usize;
                if i % 2 == 1 {
                    answered += hc.unlink(&f).await.is_ok() as usize;
                }
            }
            answered
        }));
    }
    let mut n = 0;
    for t in all {
        n += t.await.unwrap();
    }
    n
}

/// Every copy `tar_loop` made is still equal to its source.
fn check_trees((src, done): &Trees) {
    assert!(!done.is_empty(), "tar made no tree through the mount");
    for dst in done {
        mounts::sh(&format!("diff -r {} {}", src.display(), dst.display()));
    }
}

#[test]
fn a_server_added_under_a_mixed_workload_loses_nothing() {
    let cluster = ProcCluster::start(3);
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = cluster.client();
    rt.block_on(make_tree(&c));
    let mount = mounts::fuse_available().then(|| mounts::Mount::new(&cluster));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(std::sync::Mutex::new(None));
    let work = rt.spawn(workload(c.clone(), stop.clone(), window.clone()));
    let tar = mount.as_ref().map(|m| tar_loop(m, stop.clone()));
    std::thread::sleep(Duration::from_millis(1500));
    *window.lock().unwrap() = Some((Instant::now(), None));
    let (code, out, err) = cluster.cli(&["cluster", "add", "--data", &data_dir(&cluster), "--wait"]);
    assert_eq!(code, 0, "cluster add failed:\n{out}\n{err}");
    assert!(out.contains("balanced at epoch"), "{out}");
    window.lock().unwrap().as_mut().unwrap().1 = Some(Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let acked = rt.block_on(work).unwrap();
    let tars = tar.map(|t| t.join().expect("tar through the mount failed"));
    eprintln!(
        "{} files and {} directories acknowledged, {} during the migration",
        acked.files.len(),
        acked.dirs.len(),
        acked.during
    );
    assert!(acked.during > 0, "no operation ran during the migration: the test did not test it");
    let map = wait_balanced(&cluster, Duration::from_secs(60));
    let new_id = map.servers.iter().map(|s| s.id).max().unwrap() as u64;
    assert_eq!(map.servers.len(), 4);
    // A fresh client of the final map, and the old one (which followed the epochs).
    let fresh = Client::new(map.clone(), ClientOptions { retries: 5, ..Default::default() });
    rt.block_on(check_acked(&fresh, &acked));
    assert!(c.map().epoch >= map.epoch - 2, "the workload's client followed the map (epoch {})", c.map().epoch);
    if let Some(t) = tars {
        check_trees(&t);
    }
    drop(mount);
    assert_placed(&cluster, new_id);
    cluster.assert_no_errors_logged();
}

#[test]
fn a_server_is_drained_then_removed() {
    let cluster = ProcCluster::start(3);
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = cluster.client();
    rt.block_on(make_tree(&c));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(std::sync::Mutex::new(None));
    let work = rt.spawn(workload(c.clone(), stop.clone(), window.clone()));
    std::thread::sleep(Duration::from_millis(1500));
    let d = data_dir(&cluster);
    // Not drained yet: refused, and nothing changes.
    let (code, _, err) = cluster.cli(&["cluster", "remove", "--server", "1", "--data", &d]);
    assert_ne!(code, 0, "removing a server that holds objects must be refused");
    assert!(err.contains("drain it first"), "{err}");
    // The map service's server cannot be removed before it is drained (which moves the
    // service).
    let (code, _, err) = cluster.cli(&["cluster", "remove", "--server", "0", "--data", &d]);
    assert_ne!(code, 0);
    assert!(err.contains("drain it first"), "{err}");
    let before = status_of(&cluster, 1);
    assert!(before["dir_objects"].as_u64().unwrap() > 0 && before["data_records"].as_u64().unwrap() > 0, "{before}");
    *window.lock().unwrap() = Some((Instant::now(), None));
    let (code, out, err) = cluster.cli(&["cluster", "drain", "--server", "1", "--data", &d, "--wait"]);
    assert_eq!(code, 0, "drain failed:\n{out}\n{err}");
    window.lock().unwrap().as_mut().unwrap().1 = Some(Instant::now());
    stop.store(true, Ordering::Relaxed);
    let acked = rt.block_on(work).unwrap();
    assert!(acked.during > 0, "no operation ran during the drain");
    let st = status_of(&cluster, 1);
    for field in ["dir_objects", "data_records", "inodes"] {
        assert_eq!(st[field].as_u64(), Some(0), "drained server still holds {field}: {st}");
    }
    assert_eq!(st["shards"].as_array().map(Vec::len), Some(0));
    let (code, out, err) = cluster.cli(&["cluster", "remove", "--server", "1", "--data", &d]);
    assert_eq!(code, 0, "remove failed:\n{out}\n{err}");
    let map = current_map(&cluster);
    assert!(map.server(1).is_none() && map.servers.len() == 2);
    // Its process is gone; the data is all on the others.
    assert!(plusfs_localcluster::stop_server(cluster.cluster.data(), 1, Duration::from_secs(1)).is_ok());
    let fresh = Client::new(map, ClientOptions { retries: 5, ..Default::default() });
    rt.block_on(check_acked(&fresh, &acked));
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

/// Many small directories, each with a file, for a slow migration that tests can interrupt.
async fn fill(c: &Client, dirs: usize) -> Vec<(String, Vec<u8>)> {
    c.mkdir("/k", 0o755).await.unwrap();
    let mut files = Vec::new();
    for i in 0..dirs {
        let d = format!("/k/d{i}");
        c.mkdir(&d, 0o755).await.unwrap();
        let f = format!("{d}/f");
        let data = content(i, 100 + i % 900);
        c.create(&f, 0o644, true).await.unwrap();
        c.write(&f, 0, &data).await.unwrap();
        files.push((f, data));
    }
    files
}

fn slow_cluster() -> ProcCluster {
    let rebalance = RebalanceSettings { objects_per_sec: 40, batch: 4, ..Default::default() };
    ProcCluster::start_settings(3, &ClusterSettings { rebalance, ..Default::default() })
}

#[test]
fn kill_dash_nine_of_source_and_destination_mid_migration() {
    let mut cluster = slow_cluster();
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = cluster.client();
    let files = rt.block_on(fill(&c, 240));
    // Server 1 restarted so that it aborts (like kill -9) the first time it has moved an
    // object into its outbox and before its new home has it.
    cluster.cluster.kill(1).unwrap();
    cluster.cluster.start_with_env(1, &[("PLUSFS_FAILPOINT", "migrate_after_outbox")]).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let (code, out, err) = cluster.cli(&["cluster", "add", "--data", &data_dir(&cluster)]);
    assert_eq!(code, 0, "cluster add failed:\n{out}\n{err}");
    // The source hit its failpoint: it is gone mid-hand-over.
    let started = Instant::now();
    while !cluster.cluster.has_exited(1).unwrap() {
        assert!(started.elapsed() < Duration::from_secs(30), "server 1 never reached its failpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(cluster.cluster.data().join("server-1.log")).unwrap();
    assert!(log.contains("migrate_after_outbox"), "server 1 did not abort at the failpoint");
    // The destination is killed while objects still move to it.
    cluster.cluster.reload_map().unwrap();
    let new_id = cluster.cluster.ids().into_iter().max().unwrap();
    let new_pid = std::fs::read_to_string(cluster.cluster.data().join(format!("server-{new_id}.pid"))).unwrap();
    let new_pid: u32 = new_pid.trim().parse().unwrap();
    let started = Instant::now();
    loop {
        let st = status_of(&cluster, new_id as u64);
        let taken = st["migration"]["objects_taken"].as_u64().unwrap_or(0);
        if taken > 0 && st["migrating"] == true {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the new server took nothing: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    plusfs_localcluster::kill_pid(new_pid);
    assert!(current_map(&cluster).migrating(), "the migration ended before the destination was killed");
    std::thread::sleep(Duration::from_millis(500));
    // Both come back (plain restarts); the migration resumes from what each stored.
    cluster.cluster.start(1).unwrap();
    cluster.cluster.start(new_id).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let map = wait_balanced(&cluster, Duration::from_secs(120));
    let fresh = Client::new(map, ClientOptions { retries: 5, ..Default::default() });
    for (p, data) in &files {
        let got = rt.block_on(fresh.read_all(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(got == *data, "{p}: contents differ");
    }
    assert_placed(&cluster, new_id as u64);
    // Nothing is left half-moved: no server keeps an outbox copy or a stale object.
    for st in statuses(&cluster) {
        assert_eq!(st["migrating"], false, "{st}");
    }
}

#[test]
fn a_client_with_an_old_map_is_redirected_and_learns_the_new_epoch() {
    let cluster = ProcCluster::start(3);
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let old_map = cluster.cluster.map().clone();
    let c = cluster.client();
    let files = rt.block_on(fill(&c, 60));
    let (code, out, err) = cluster.cli(&["cluster", "add", "--data", &data_dir(&cluster), "--wait"]);
    assert_eq!(code, 0, "cluster add failed:\n{out}\n{err}");
    let map = current_map(&cluster);
    let new_id = map.servers.iter().map(|s| s.id).max().unwrap();
    let moved: Vec<&(String, Vec<u8>)> = files
        .iter()
        .filter(|(p, _)| {
            let dir = plusfs_proto::path::split(p).unwrap().0;
            old_map.home_of_dir(dir) != new_id && map.home_of_dir(dir) == new_id
        })
        .collect();
    assert!(!moved.is_empty(), "no directory moved to the new server");
    let forwarded_before: u64 = statuses(&cluster).iter().map(|s| s["forwarded"].as_u64().unwrap()).sum();
    // A client that still holds epoch 1's map: it sends to the old homes.
    let stale = Client::new(old_map.clone(), ClientOptions { retries: 5, ..Default::default() });
    assert_eq!(stale.map().epoch, old_map.epoch);
    let (p, data) = moved[0];
    let got = rt.block_on(stale.read_all(p)).unwrap();
    assert!(got == *data, "{p}: the stale client read wrong data");
    let forwarded_after: u64 = statuses(&cluster).iter().map(|s| s["forwarded"].as_u64().unwrap()).sum();
    assert!(forwarded_after > forwarded_before, "the old home did not redirect the stale request");
    // It learns the new epoch from the answers' frames, then routes with it.
    let started = Instant::now();
    while stale.map().epoch < map.epoch {
        assert!(started.elapsed() < Duration::from_secs(10), "the stale client never learnt the new epoch");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (p, data) in &moved {
        let got = rt.block_on(stale.read_all(p)).unwrap();
        assert!(got == *data, "{p}: contents differ");
        let d = plusfs_proto::path::split(p).unwrap().0;
        assert_eq!(stale.home(d), new_id);
    }
    // Writes too: a new file in a moved directory, through a fresh stale client.
    let stale2 = Client::new(old_map, ClientOptions { retries: 5, ..Default::default() });
    let newf = format!("{}/g", plusfs_proto::path::split(&moved[0].0).unwrap().0);
    rt.block_on(async {
        stale2.create(&newf, 0o644, true).await.unwrap();
        stale2.write(&newf, 0, b"after the change").await.unwrap();
    });
    assert_eq!(rt.block_on(c.read_all(&newf)).unwrap(), b"after the change");
    cluster.assert_fsck_clean();
}

/// Runs `plusfs ARGS`, which must succeed; answers its standard output.
fn cli_ok(c: &ProcCluster, args: &[&str]) -> String {
    let (code, out, err) = c.cli(args);
    assert_eq!(code, 0, "plusfs {args:?} failed:\n{out}\n{err}");
    out
}

/// Waits until server `id`'s migration status shows objects taken (or sent), so a change
/// made now meets a migration under way.
fn wait_moving(c: &ProcCluster, id: u64) {
    let started = Instant::now();
    loop {
        let st = status_of(c, id);
        let m = &st["migration"];
        if m["objects_taken"].as_u64().unwrap_or(0) + m["objects_moved"].as_u64().unwrap_or(0) > 0 {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "server {id} moved nothing: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A drained group leaves the map; its member processes are stopped.
fn remove_group(c: &ProcCluster, id: u32) {
    let st = status_of(c, id as u64);
    for field in ["dir_objects", "data_records", "inodes"] {
        assert_eq!(st[field].as_u64(), Some(0), "drained group {id} still holds {field}: {st}");
    }
    let group = current_map(c).server(id).unwrap().clone();
    let out = cli_ok(c, &["cluster", "remove", "--server", &id.to_string(), "--data", &data_dir(c)]);
    assert!(out.contains("stopped (3 members)"), "{out}");
    for m in &group.members {
        let pid_file = c.cluster.data().join(format!("server-{id}-m{}.pid", m.id));
        assert!(!pid_file.exists(), "member {} of the removed group {id} has a pid file", m.id);
    }
}

/// A replicated cluster (2 groups of 3 members, TLS) grows by a group, and the two others
/// are drained and removed (the map service's group among them, so the service moves),
/// while clients work, user 1000 extracts trees with tar through a mount presenting a node
/// identity (uids 1000-1999, root squashed), and a hostile user floods the servers with
/// requests; a member is replaced while objects move. Every acknowledged operation is
/// there afterwards, every tree equal to its source, every group's members agree.
#[test]
fn replica_groups_join_drain_and_leave_under_load() {
    let rebalance = RebalanceSettings { objects_per_sec: 300, batch: 16, ..Default::default() };
    let cluster = ProcCluster::start_settings(2, &ClusterSettings { replicas: 3, rebalance, ..Default::default() });
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let d = data_dir(&cluster);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = cluster.client();
    rt.block_on(make_tree(&c));
    rt.block_on(fill(&c, 300));
    // A directory spread over both groups: after both are drained its only storing group
    // holds both slots.
    rt.block_on(c.mkdir_with("/h", 0o755, plusfs_proto::Threshold::Entries(0), 0)).unwrap();
    let spread: Vec<NewFile> = (0..3000).map(|k| NewFile::new(format!("/h/e{k}"), content(k, 200))).collect();
    let spread_files: Vec<(String, Vec<u8>)> = spread.iter().map(|f| (f.path.clone(), f.data.clone())).collect();
    for r in rt.block_on(c.batch_write(spread)) {
        r.expect("filling /h");
    }
    assert_eq!(rt.block_on(c.distribution("/h")).unwrap().set.len(), 2);
    // A node identity for the mount, a user identity for the hostile user, each with a
    // directory of its own.
    let ids = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ids.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let node = issue(
        &cluster,
        ids.path(),
        "node1",
        &["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"],
    );
    let hostile = issue(&cluster, ids.path(), "hog", &["--uids", "2000", "--gids", "2000"]);
    rt.block_on(async {
        for (d, id) in [("/u", 1000), ("/hog", 2000)] {
            c.mkdir(d, 0o755).await.unwrap();
            c.chown(d, Some(id), Some(id)).await.unwrap();
        }
    });
    let mount = mounts::fuse_available().then(|| mounts::Mount::with_identity(&cluster, &["allow_other"], Some(&node)));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(std::sync::Mutex::new(None));
    let work_started = Instant::now();
    let work = rt.spawn(workload(c.clone(), stop.clone(), window.clone()));
    let mut hog_map = cluster.cluster.map().clone();
    hog_map.tls.identity = Some(hostile);
    // The hostile user's identity bounds it: it can claim no other uid, and its own uid
    // may not write into another user's directory.
    rt.block_on(async {
        for (uid, path) in [(0, "/hog/as-root"), (1000, "/hog/as-1000"), (2000, "/u/intruder")] {
            let opts = ClientOptions { retries: 1, uid, gid: uid, groups: Vec::new(), ..Default::default() };
            let e = Client::new(hog_map.clone(), opts).create(path, 0o644, true).await.expect_err(path);
            assert!(
                matches!(e.errno, plusfs_proto::Errno::EPERM | plusfs_proto::Errno::EACCES),
                "{path} as {uid}: {e}"
            );
        }
    });
    let hog_ops = rt.spawn(hog(hog_map, 8, stop.clone()));
    let tar = mount.as_ref().map(|m| user_tar_loop(m, ids.path(), stop.clone()));
    std::thread::sleep(Duration::from_millis(3000));

    // A third group joins; objects move to it.
    let held_before: u64 = statuses(&cluster).iter().map(|s| s["dir_objects"].as_u64().unwrap()).sum();
    let change_started = Instant::now();
    *window.lock().unwrap() = Some((change_started, None));
    let out = cli_ok(&cluster, &["cluster", "add", "--data", &d]);
    assert!(out.contains("joins as a replica group of 3 members"), "{out}");
    let map = current_map(&cluster);
    let new_id = map.servers.iter().map(|s| s.id).max().unwrap();
    assert_eq!((new_id, map.server(new_id).unwrap().members.len()), (2, 3));
    // While they move, a member of the new group is replaced.
    wait_moving(&cluster, new_id as u64);
    let out = cli_ok(&cluster, &["cluster", "replace", "--group", "2", "--member", "1", "--data", &d]);
    assert!(out.contains("replaced by member 3"), "{out}");
    let replaced_during = current_map(&cluster).migrating();
    wait_balanced(&cluster, Duration::from_secs(180));
    assert!(replaced_during, "the migration ended before the replacement: it did not test one");
    // What moved, against the ideal 1/(N+1) of what the cluster held.
    let all = statuses(&cluster);
    let held: u64 = all.iter().map(|s| s["dir_objects"].as_u64().unwrap()).sum();
    let taken = all.iter().find(|s| s["id"] == new_id as u64).unwrap()["dir_objects"].as_u64().unwrap();
    eprintln!(
        "group add: the new group holds {taken} of {held} directory objects ({held_before} before): {:.2}x the \
         ideal third",
        taken as f64 / (held as f64 / 3.0)
    );

    // Group 1 is drained and removed.
    let out = cli_ok(&cluster, &["cluster", "drain", "--server", "1", "--data", &d, "--wait"]);
    assert!(out.contains("balanced at epoch"), "{out}");
    remove_group(&cluster, 1);
    // Group 0, which keeps the map, is drained too: the map service moves to group 2.
    assert_eq!(current_map(&cluster).keeper, 0);
    let out = cli_ok(&cluster, &["cluster", "drain", "--server", "0", "--data", &d, "--wait"]);
    assert!(out.contains("balanced at epoch"), "{out}");
    assert_eq!(current_map(&cluster).keeper, 2, "the map service moved to the group that stays");
    remove_group(&cluster, 0);
    window.lock().unwrap().as_mut().unwrap().1 = Some(Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let acked = rt.block_on(work).unwrap();
    let tars = tar.map(|t| t.join().expect("tar through the mount failed"));
    let hog_ops = rt.block_on(hog_ops).unwrap();
    eprintln!(
        "{} files and {} directories acknowledged, {} while groups joined and left; {} trees extracted by \
         uid 1000 through the node mount; the hostile user got {hog_ops} answers",
        acked.files.len(),
        acked.dirs.len(),
        acked.during,
        tars.as_ref().map_or(0, |t| t.1.len())
    );
    assert!(hog_ops > 0, "the hostile user sent nothing: it was not tested");
    assert!(acked.during > 0, "no operation ran while the groups changed");
    let ended = window.lock().unwrap().and_then(|(_, end)| end).expect("the change ended");
    let (before_s, during_s) = ((change_started - work_started).as_secs_f64(), (ended - change_started).as_secs_f64());
    eprintln!(
        "client throughput: {:.0} ops/s before, {:.0} ops/s while groups changed ({:.2}x)",
        acked.before as f64 / before_s,
        acked.during as f64 / during_s,
        (acked.during as f64 / during_s) / (acked.before as f64 / before_s)
    );
    let map = current_map(&cluster);
    assert_eq!(map.servers.iter().map(|s| s.id).collect::<Vec<_>>(), vec![2]);
    assert_eq!(map.server(2).unwrap().members.iter().map(|m| m.id).collect::<Vec<_>>(), vec![0, 2, 3]);
    let fresh = Client::new(map, ClientOptions { retries: 5, ..Default::default() });
    rt.block_on(check_acked(&fresh, &acked));
    assert!(c.map().epoch >= current_map(&cluster).epoch - 2, "the workload's client followed the map");
    let h = rt.block_on(fresh.distribution("/h")).unwrap();
    assert_eq!(h.set, vec![2, 2], "both slots of /h went to the group that stays");
    assert_eq!(rt.block_on(fresh.readdir("/h")).unwrap().len(), spread_files.len());
    for (p, data) in spread_files.iter().step_by(3) {
        assert!(rt.block_on(fresh.read_all(p)).unwrap_or_else(|e| panic!("{p}: {e}")) == *data, "{p}");
    }
    if let (Some(t), Some(m)) = (tars, &mount) {
        check_trees(&t);
        // What uid 1000 extracted through the node mount is its own.
        let foreign = mounts::sh(&format!("find {} ! -uid 1000", m.path().join("u").display()));
        assert!(foreign.is_empty(), "entries uid 1000 made that it does not own:\n{foreign}");
    } else {
        eprintln!("no FUSE here: the mount's part of this test did not run");
    }
    drop(mount);
    assert_placed(&cluster, new_id as u64);
    let out = cli_ok(&cluster, &["fsck", "--replicas"]);
    assert!(out.contains("server 2: 3 members agree"), "{out}");
    cluster.assert_no_errors_logged();
}

/// What the huge-directory workload acknowledged.
#[derive(Default)]
struct BigAcked {
    created: Vec<(String, Vec<u8>)>,
    unlinked: Vec<String>,
    /// Operations whose outcome is unknown (an error that may have come after the change).
    unknown: usize,
    /// Lookups of entries nobody removed that failed.
    lost_lookups: Vec<String>,
    during: usize,
}

/// Creates, unlinks and looks up entries of `/big` (whose first `initial` names `f{k}`
/// exist) until `stop`.
async fn big_workload(c: Client, initial: usize, stop: Arc<AtomicBool>, window: Window) -> BigAcked {
    let mut a = BigAcked::default();
    let in_window = |w: &Window| matches!(*w.lock().unwrap(), Some((_, None)));
    for i in 0..20_000usize {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let f = format!("/big/n{i}");
        let data = content(i, 100 + i % 700);
        match c.create(&f, 0o644, true).await {
            Ok(_) => match c.write(&f, 0, &data).await {
                Ok(_) => {
                    a.created.push((f, data));
                    a.during += in_window(&window) as usize;
                }
                Err(_) => a.unknown += 1,
            },
            Err(_) => a.unknown += 1,
        }
        // Odd initial names are removed; even ones must always be found.
        let gone = format!("/big/f{}", (i * 2 + 1) % initial);
        if i * 2 + 1 < initial {
            match c.unlink(&gone).await {
                Ok(()) => a.unlinked.push(gone),
                Err(_) => a.unknown += 1,
            }
        }
        let kept = format!("/big/f{}", (i * 7919 * 2) % initial);
        if c.lstat(&kept).await.is_err() {
            a.lost_lookups.push(kept);
        }
    }
    a
}

#[test]
fn a_storing_server_of_a_huge_directory_is_drained_and_removed_under_load() {
    drain_a_storing_server_of_a_huge_directory(0, 100_000);
}

/// The same on replica groups of three: a group holding a 30,000-entry directory's shard
/// is drained while the library and the mount work in the directory.
#[test]
#[ignore = "about 2 minutes: `cargo test -p plusfs-tests --test elastic -- --ignored replica_group`"]
fn a_replica_group_storing_a_huge_directory_is_drained_and_removed_under_load() {
    drain_a_storing_server_of_a_huge_directory(3, 30_000);
}

/// Three servers (replica groups of `replicas` members, 0 for none); `/big` is spread
/// over them with `initial` files, hard links make server 1 the home of shared inodes;
/// server 1 is drained and removed while clients create, unlink and look up entries of
/// `/big`, rename link entries, and a mount writes and lists `/big`. Everything
/// acknowledged is there afterwards, fsck clean, no error logged.
fn drain_a_storing_server_of_a_huge_directory(replicas: usize, initial: usize) {
    let cluster = ProcCluster::start_settings(3, &ClusterSettings { replicas, ..Default::default() });
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let d = data_dir(&cluster);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = cluster.client();
    // Distributed from its first entry over the three servers, then filled in batches.
    rt.block_on(c.mkdir_with("/big", 0o755, plusfs_proto::Threshold::Entries(0), 0)).unwrap();
    let filled = Instant::now();
    for chunk in (0..initial).collect::<Vec<_>>().chunks(1000) {
        let files: Vec<NewFile> = chunk.iter().map(|&k| NewFile::new(format!("/big/f{k}"), content(k, 64))).collect();
        for r in rt.block_on(c.batch_write(files)) {
            r.expect("filling /big");
        }
    }
    eprintln!("/big filled with {initial} files in {:.1} s", filled.elapsed().as_secs_f64());
    let before = rt.block_on(c.distribution("/big")).unwrap();
    assert_eq!(before.set.len(), 3, "{before:?}");
    let held = |id: u64| -> u64 {
        let st = status_of(&cluster, id);
        st["shards"].as_array().unwrap().iter().filter(|s| s[0] == "/big").map(|s| s[1].as_u64().unwrap()).sum()
    };
    let on_one = held(1);
    assert!(on_one > initial as u64 / 4, "server 1 holds a third of /big: {on_one}");
    // Hard links: files of /big (a third of them on server 1's shard) and a chunked file of
    // a directory homed on server 1 get a second name in /hl: server 1 becomes the home of
    // their shared inodes, which the drain must move and every link learn.
    let on1 = (0..).map(|i| format!("/o{i}")).find(|p| c.home(p) == 1).unwrap();
    let mut linked: Vec<(String, String, Vec<u8>)> = (0..initial)
        .step_by(initial / 100)
        .map(|k| (format!("/big/f{k}"), format!("/hl/l{k}"), content(k, 64)))
        .collect();
    linked.push((format!("{on1}/g"), "/hl/g".into(), content(7, 3 << 20)));
    rt.block_on(async {
        c.mkdir("/hl", 0o755).await.unwrap();
        c.mkdir(&on1, 0o755).await.unwrap();
        let (g, _, data) = linked.last().unwrap();
        c.create(g, 0o644, true).await.unwrap();
        c.write(g, 0, data).await.unwrap();
        for (a, b, _) in &linked {
            c.link(a, b).await.unwrap_or_else(|e| panic!("link {a} {b}: {e}"));
        }
    });
    let shared_on_one = status_of(&cluster, 1)["inodes"].as_u64().unwrap();
    assert!(shared_on_one > 10, "server 1 is the home of {shared_on_one} shared inodes");
    // During the drain, link entries move back and forth between /hl and a directory of
    // another server (a moved link entry must name where its inode is by the end).
    let hm = (0..).map(|i| format!("/hm{i}")).find(|p| ![1, c.home("/hl")].contains(&c.home(p))).unwrap();
    rt.block_on(c.mkdir(&hm, 0o755)).unwrap();
    let mount = mounts::fuse_available().then(|| mounts::Mount::new(&cluster));

    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(std::sync::Mutex::new(None));
    let work = rt.spawn(big_workload(c.clone(), initial, stop.clone(), window.clone()));
    let renames = {
        let (c, stop, hm) = (c.clone(), stop.clone(), hm.clone());
        let names: Vec<String> = linked.iter().map(|(_, b, _)| b.trim_start_matches("/hl/").to_string()).collect();
        rt.spawn(async move {
            let mut moved = 0;
            for round in 0..1000 {
                for n in &names {
                    if stop.load(Ordering::Relaxed) {
                        return moved;
                    }
                    let (from, to) = if round % 2 == 0 { ("/hl", hm.as_str()) } else { (hm.as_str(), "/hl") };
                    if c.rename(&format!("{from}/{n}"), &format!("{to}/{n}")).await.is_ok() {
                        moved += 1;
                    }
                }
            }
            moved
        })
    };
    // Through the mount: new files in /big and listings of it, while it changes.
    let mounted = mount.as_ref().map(|m| {
        let (big, stop) = (m.path().join("big"), stop.clone());
        std::thread::spawn(move || {
            let mut made = Vec::new();
            for k in 0..5_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let p = big.join(format!("m{k}"));
                std::fs::write(&p, format!("mount file {k}")).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                made.push(p);
                if k % 500 == 0 {
                    let listed = std::fs::read_dir(&big).unwrap().count();
                    assert!(listed >= initial / 2, "listing /big through the mount gave {listed} names");
                }
            }
            made
        })
    });
    std::thread::sleep(Duration::from_millis(1500));
    *window.lock().unwrap() = Some((Instant::now(), None));
    let drain_started = Instant::now();
    let out = cli_ok(&cluster, &["cluster", "drain", "--server", "1", "--data", &d, "--wait"]);
    let drain_s = drain_started.elapsed().as_secs_f64();
    assert!(out.contains("balanced at epoch"), "{out}");
    window.lock().unwrap().as_mut().unwrap().1 = Some(Instant::now());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let acked = rt.block_on(work).unwrap();
    let link_renames = rt.block_on(renames).unwrap();
    let made = mounted.map(|t| t.join().expect("work through the mount failed")).unwrap_or_default();
    eprintln!(
        "drain of a server with a {on_one}-entry shard of /big and {shared_on_one} shared inodes: {drain_s:.1} s; \
         {} creates, {} unlinks, {link_renames} renames of link entries, {} through the mount, {} acknowledged \
         during the drain",
        acked.created.len(),
        acked.unlinked.len(),
        made.len(),
        acked.during
    );
    assert!(acked.during > 0, "no operation ran during the drain");
    assert!(acked.lost_lookups.is_empty(), "entries nobody removed were not found: {:?}", acked.lost_lookups);
    assert_eq!(held(1), 0, "the drained server still holds its shard");
    let after = rt.block_on(c.distribution("/big")).unwrap();
    assert_eq!(after.set.len(), 3, "the set keeps its slots: {after:?}");
    assert!(!after.set.contains(&1), "{after:?}");
    let out = cli_ok(&cluster, &["cluster", "remove", "--server", "1", "--data", &d]);
    assert!(out.contains("removed"), "{out}");

    // Every acknowledged change is there, seen by a client that starts now.
    let fresh = Client::new(current_map(&cluster), ClientOptions { retries: 5, ..Default::default() });
    rt.block_on(async {
        for (p, data) in &acked.created {
            let got = fresh.read_all(p).await.unwrap_or_else(|e| panic!("acknowledged file {p}: {e}"));
            assert!(got == *data, "{p}: contents differ");
        }
        for p in &acked.unlinked {
            let e = fresh.lstat(p).await.expect_err("an unlinked file came back");
            assert_eq!(e.errno, plusfs_proto::Errno::ENOENT, "{p}: {e}");
        }
        for k in (0..initial).step_by(2) {
            fresh.lstat(&format!("/big/f{k}")).await.unwrap_or_else(|e| panic!("/big/f{k}: {e}"));
        }
        // Both names of every linked file reach one inode, its data whole; an unlink
        // through either name reaches the inode at its new home.
        for (a, b, data) in linked.iter_mut() {
            // Wherever the renames left the link entry: in exactly one of the two.
            let elsewhere = b.replace("/hl/", &format!("{hm}/"));
            match (fresh.lstat(b).await.is_ok(), fresh.lstat(&elsewhere).await.is_ok()) {
                (true, false) => {}
                (false, true) => *b = elsewhere,
                other => panic!("{b} and {elsewhere}: {other:?}"),
            }
            let (sa, sb) = (fresh.lstat(a).await.unwrap(), fresh.lstat(b).await.unwrap());
            assert_eq!((sa.ino, sa.nlink), (sb.ino, 2), "{a} and {b}");
            assert!(fresh.read_all(b).await.unwrap() == *data, "{b}: contents differ");
        }
        for (a, b, _) in linked.iter().step_by(2) {
            fresh.unlink(b).await.unwrap_or_else(|e| panic!("unlink {b}: {e}"));
            assert_eq!(fresh.lstat(a).await.unwrap().nlink, 1, "{a}");
        }
    });
    let expected = initial + acked.created.len() + made.len() - acked.unlinked.len();
    let listed = rt.block_on(fresh.readdir("/big")).unwrap().len();
    assert!(
        (expected..=expected + acked.unknown).contains(&listed),
        "/big lists {listed} names, {expected} acknowledged (+{} unknown)",
        acked.unknown
    );
    if let Some(m) = &mount {
        let through = std::fs::read_dir(m.path().join("big")).unwrap().count();
        assert_eq!(through, listed, "the mount lists what the library lists");
    }
    drop(mount);
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

/// Waits until server `id` of `c` has exited at failpoint `step` (its log says so).
fn wait_failpoint(c: &mut ProcCluster, id: u32, step: &str) {
    let started = Instant::now();
    while !c.cluster.has_exited(id).unwrap() {
        assert!(started.elapsed() < Duration::from_secs(60), "server {id} never reached {step}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(c.cluster.data().join(format!("server-{id}.log"))).unwrap();
    assert!(log.contains(step), "server {id} exited, but not at {step}");
}

#[test]
fn kill_dash_nine_of_both_sides_of_a_shard_move() {
    const FILES: usize = 20_000;
    let mut cluster = ProcCluster::start(3);
    let _down = DownOnDrop(cluster.cluster.data().to_path_buf());
    let d = data_dir(&cluster);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = cluster.client();
    rt.block_on(c.mkdir_with("/big", 0o755, plusfs_proto::Threshold::Entries(0), 0)).unwrap();
    let mut files = Vec::new();
    for chunk in (0..FILES).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<NewFile> = chunk.iter().map(|&k| NewFile::new(format!("/big/f{k}"), content(k, 300))).collect();
        files.extend(batch.iter().map(|f| (f.path.clone(), f.data.clone())));
        for r in rt.block_on(c.batch_write(batch)) {
            r.expect("filling /big");
        }
    }
    // Server 1 gives its shard away; the taker is the first server of the directory's
    // straw order that stays (all three are in the set, one slot each).
    let mut drained_map = current_map(&cluster);
    drained_map.servers.iter_mut().filter(|s| s.id == 1).for_each(|s| s.weight = 0.0);
    let taker = drained_map.storing_set("/big", 0)[0];
    assert_ne!(taker, 1);
    // The giver aborts once it has handed the shard over, before answering; the taker
    // aborts once it has stored the entries, before the shard object.
    cluster.cluster.kill(1).unwrap();
    cluster.cluster.start_with_env(1, &[("PLUSFS_FAILPOINT", "shard_after_out")]).unwrap();
    cluster.cluster.kill(taker).unwrap();
    cluster.cluster.start_with_env(taker, &[("PLUSFS_FAILPOINT", "shard_before_take")]).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    cli_ok(&cluster, &["cluster", "drain", "--server", "1", "--data", &d]);
    wait_failpoint(&mut cluster, 1, "shard_after_out");
    cluster.cluster.start(1).unwrap();
    wait_failpoint(&mut cluster, taker, "shard_before_take");
    // A client meanwhile: every name is found (the giver redirects; the taker pulls
    // again once it is back).
    cluster.cluster.start(taker).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let map = wait_balanced(&cluster, Duration::from_secs(120));
    let fresh = Client::new(map, ClientOptions { retries: 5, ..Default::default() });
    for (p, data) in files.iter().step_by(7) {
        let got = rt.block_on(fresh.read_all(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(got == *data, "{p}: contents differ");
    }
    assert_eq!(rt.block_on(fresh.readdir("/big")).unwrap().len(), FILES);
    let dist = rt.block_on(fresh.distribution("/big")).unwrap();
    assert!(!dist.set.contains(&1) && dist.set.contains(&taker), "{dist:?}");
    let st = status_of(&cluster, 1);
    assert_eq!(st["shards"].as_array().map(Vec::len), Some(0), "{st}");
    cli_ok(&cluster, &["cluster", "remove", "--server", "1", "--data", &d]);
    cluster.assert_fsck_clean();
}
