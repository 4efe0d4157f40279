//! Many users on one cluster through one mount: a mount presenting a bounded identity acts
//! for each calling process (its uid, gid and groups), also for reads and writes of open
//! files, flushes and write-backs; the identity bounds what it may claim.

mod common;
mod mounts;

use common::{issue, ProcCluster};
use mounts::{as_user, fuse_available, sh, Mount};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `sha256sum` of `path` run as `uid` (the hex digest).
fn sha256_as(uid: u32, path: &Path) -> String {
    let (ok, out, err) = as_user(uid, &[], &format!("sha256sum '{}'", path.display()));
    assert!(ok, "sha256sum {} as {uid}: {err}", path.display());
    out.split_whitespace().next().unwrap_or_default().to_string()
}

/// Sets up, through an admin mount, a home directory per user and a sticky scratch
/// directory; returns the admin mount.
fn homes(tc: &ProcCluster, users: &[u32]) -> Mount {
    let admin = Mount::new(tc);
    let a = admin.path().display().to_string();
    sh(&format!("mkdir -p {a}/home && mkdir -m 1777 {a}/scratch"));
    for u in users {
        sh(&format!("mkdir {a}/home/u{u} && chown {u}:{u} {a}/home/u{u}"));
    }
    admin
}

/// Issues a node identity (uids and gids 1000-1999, root squashed) below `base` (made
/// reachable by other users), sets up the homes of 1000 and 1001 through an admin mount,
/// and mounts the cluster with the node identity: (identity, admin mount, node mount).
fn node_mount(tc: &ProcCluster, base: &Path) -> (PathBuf, Mount, Mount) {
    std::fs::set_permissions(base, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let flags = ["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"];
    let id = issue(tc, base, "machine1", &flags);
    let admin = homes(tc, &[1000, 1001]);
    let m = Mount::with_identity(tc, &["allow_other"], Some(&id));
    (id, admin, m)
}

/// Cx sub-operations executed by all servers so far (`cluster status`).
fn cx_executed(tc: &ProcCluster) -> u64 {
    cx_counter(tc, "cx_executed")
}

/// The sum over all servers of `cluster status` counter `name`.
fn cx_counter(tc: &ProcCluster, name: &str) -> u64 {
    let (code, out, err) = tc.cli(&["cluster", "status", "--json"]);
    assert_eq!(code, 0, "{err}");
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get(name).and_then(|x| x.as_u64()))
        .sum()
}

#[test]
fn a_node_identity_mount_stores_what_each_user_writes() {
    if !fuse_available() {
        return;
    }
    let tc = ProcCluster::start(3);
    let t = tempfile::tempdir().unwrap();
    let (id, admin, m) = node_mount(&tc, t.path());
    let mnt = m.path();

    // Files of 0 B to 64 MiB, written, fsynced and closed by uid 1000, read back through
    // this mount and through the admin mount (another client: from the servers).
    let mib = 1 << 20;
    for (i, len) in [0usize, 1, 4096, mib + 7, 5 * mib, 64 * mib].into_iter().enumerate() {
        let src = t.path().join(format!("src{i}"));
        std::fs::write(&src, common::bytes(i as u64, len)).unwrap();
        std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let dst = mnt.join(format!("home/u1000/f{i}"));
        let cmd = format!("dd if='{}' of='{}' bs=1M conv=fsync status=none", src.display(), dst.display());
        let (ok, _, err) = as_user(1000, &[], &cmd);
        assert!(ok, "writing {len} bytes as 1000: {err}");
        let want = sha256_as(1000, &src);
        assert_eq!(sha256_as(1000, &dst), want, "{len} bytes read back through the same mount");
        let elsewhere = admin.path().join(format!("home/u1000/f{i}"));
        assert_eq!(sha256_as(0, &elsewhere), want, "{len} bytes read back through another mount");
        let meta = std::fs::metadata(&elsewhere).unwrap();
        assert_eq!((meta.len(), std::os::unix::fs::MetadataExt::uid(&meta)), (len as u64, 1000));
    }
    // The shell's `echo > file`, which lost its bytes before (they went as the mount's
    // root, squashed to nobody).
    let (ok, _, err) = as_user(1000, &[], &format!("echo hello-data > {}/home/u1000/echoed", mnt.display()));
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(admin.path().join("home/u1000/echoed")).unwrap(), b"hello-data\n");
    // A file its creator made read-only stays writable through the creating descriptor.
    let py = format!(
        "import os; fd = os.open('{}/home/u1000/ro', os.O_CREAT | os.O_WRONLY, 0o444); \
         os.write(fd, b'read-only'); os.fsync(fd); os.close(fd)",
        mnt.display()
    );
    let (ok, _, err) = as_user(1000, &[], &format!("python3 -c \"{py}\""));
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(admin.path().join("home/u1000/ro")).unwrap(), b"read-only");

    // The fast path of small files: the mount held delegations and wrote back under them.
    assert!(m.delegated_written() > 0, "no delegated work through a node mount: {}", m.stats());
    // The fast path of large files: client-direct I/O under capabilities.
    let (put, got, caps) = m.direct_io();
    assert!(put >= 64 << 20 && got > 0 && caps > 0, "no client-direct I/O through a node mount: {}", m.stats());
    // Directories by Cx: the node mount's mkdir and rmdir go to both servers at once.
    let before = cx_executed(&tc);
    let tree = mnt.join("home/u1000/tree");
    let (ok, _, err) = as_user(
        1000,
        &[],
        &format!("mkdir -p {0}/a {0}/b {0}/c {0}/d {0}/e {0}/f && rmdir {0}/a {0}/b", tree.display()),
    );
    assert!(ok, "{err}");
    assert!(cx_executed(&tc) > before, "no Cx operation from a node mount");
    let meta = std::fs::metadata(admin.path().join("home/u1000/tree/c")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    // chown and chgrp from the CLI, as the admin; as a squashed root, refused.
    let (code, out, err) = tc.cli(&["chown", "1001:1001", "/home/u1000/f1"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = tc.cli(&["chgrp", "1000", "/home/u1000/f1"]);
    assert_eq!(code, 0, "{err}");
    let meta = std::fs::metadata(admin.path().join("home/u1000/f1")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1001, 1000));
    let mut cmd = std::process::Command::new(common::exe());
    cmd.args(["chown", "0", "/home/u1000/f2"]).env("PLUSFS_CLUSTER", tc.cluster.map_file()).env("PLUSFS_IDENTITY", &id);
    let (code, _, err) = common::run(&mut cmd);
    assert!(code != 0 && err.contains("not permitted"), "a squashed root gave a file away: {err}");
    // Another user's private file is refused; the owner reads it.
    let secret = mnt.join("home/u1000/secret");
    let (ok, _, err) = as_user(1000, &[], &format!("echo s > '{0}' && chmod 600 '{0}'", secret.display()));
    assert!(ok, "{err}");
    let (ok, _, err) = as_user(1001, &[], &format!("cat '{}'", secret.display()));
    assert!(!ok && err.contains("ermission denied"), "1001 read 1000's 0600 file: {err}");
    let (ok, _, err) = as_user(1001, &[], &format!("echo x >> '{}'", mnt.join("home/u1000/f2").display()));
    assert!(!ok, "1001 appended to 1000's file: {err}");
    // The squashed root acts as nobody: what it makes is nobody's.
    sh(&format!("echo r > {}/scratch/by-root", mnt.display()));
    let meta = std::fs::metadata(admin.path().join("scratch/by-root")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65534, "root squashed to nobody");
    assert_eq!(std::fs::read(admin.path().join("scratch/by-root")).unwrap(), b"r\n");
    // A file unlinked while open lives on until closed (the squashed root may not make
    // the orphan directory: the file is kept in its own directory).
    let keep = mnt.join("home/u1000/kept");
    let script = format!(
        "exec 3<>'{0}' && echo still-here >&3 && rm '{0}' && test ! -e '{0}' && cat /proc/self/fd/3 >/dev/null && \
         exec 3>&- && ls -a '{1}'",
        keep.display(),
        mnt.join("home/u1000").display()
    );
    let (ok, out, err) = as_user(1000, &[], &script);
    assert!(ok, "{err}");
    assert!(!out.contains("kept") && !out.contains(".plusfs-orphan."), "nothing left after the close: {out}");
    // A uid outside the identity's ranges gets nothing.
    let (ok, _, _) = as_user(3000, &[], &format!("ls {}/scratch", mnt.display()));
    assert!(!ok, "uid 3000 is outside the identity's ranges");
    drop(m);
    drop(admin);
    tc.assert_fsck_clean();
}

/// The combination a site runs: one node mount on a replicated cluster (3 members per
/// slot), an honest user writing large files (client-direct, under capabilities) and
/// filling a directory with 3,000 files while another user of the same mount attacks
/// their files at the same time; the attacks all fail and nothing of the honest work is
/// lost, on the replicas too.
#[test]
fn a_node_mount_on_a_replicated_cluster_serves_honest_users_beside_a_hostile_one() {
    if !fuse_available() {
        return;
    }
    let settings = plusfs_localcluster::ClusterSettings { replicas: 3, ..Default::default() };
    let tc = ProcCluster::start_settings(2, &settings);
    let t = tempfile::tempdir().unwrap();
    let (_, admin, m) = node_mount(&tc, t.path());
    let home = m.path().join("home/u1000");
    let (ok, _, err) =
        as_user(1000, &[], &format!("echo private > '{0}/secret' && chmod 600 '{0}/secret'", home.display()));
    assert!(ok, "{err}");

    let mib = 1 << 20;
    let honest = {
        let (home, t) = (home.clone(), t.path().to_path_buf());
        std::thread::spawn(move || {
            let mut sums = Vec::new();
            for i in 0..3u64 {
                let src = t.join(format!("big{i}"));
                std::fs::write(&src, common::bytes(100 + i, 8 * mib + i as usize)).unwrap();
                std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
                let cmd =
                    format!("dd if='{}' of='{}/big{i}' bs=1M conv=fsync status=none", src.display(), home.display());
                let (ok, _, err) = as_user(1000, &[], &cmd);
                assert!(ok, "honest write {i}: {err}");
                sums.push(sha256_as(1000, &src));
            }
            let fill = format!(
                "mkdir '{0}/many' && cd '{0}/many' && i=0; while [ $i -lt 3000 ]; do : > f$i; i=$((i+1)); done",
                home.display()
            );
            let (ok, _, err) = as_user(1000, &[], &fill);
            assert!(ok, "honest fill: {err}");
            sums
        })
    };
    // Meanwhile uid 1001 on the same mount goes after 1000's files, again and again.
    let mut attacks = 0;
    while !honest.is_finished() {
        for (what, cmd) in [
            ("read", format!("cat '{}/secret'", home.display())),
            ("overwrite", format!("echo x > '{}/secret'", home.display())),
            ("chmod", format!("chmod 666 '{}/secret'", home.display())),
            ("remove", format!("rm -f '{}/secret'", home.display())),
            ("create", format!("touch '{}/planted'", home.display())),
            ("device", format!("mknod '{}/../u1001/dev' c 1 3", home.display())),
        ] {
            let (ok, _, _) = as_user(1001, &[], &cmd);
            assert!(!ok, "uid 1001 could {what} in 1000's home");
            attacks += 1;
        }
    }
    let sums = honest.join().expect("the honest user's work");
    assert!(attacks >= 6, "the attacks ran during the honest work");
    // Everything of the honest user is there, read through another (admin) mount.
    let seen = admin.path().join("home/u1000");
    for (i, want) in sums.iter().enumerate() {
        assert_eq!(&sha256_as(0, &seen.join(format!("big{i}"))), want, "big{i}");
    }
    assert_eq!(std::fs::read_dir(seen.join("many")).unwrap().count(), 3000);
    assert_eq!(std::fs::read(seen.join("secret")).unwrap(), b"private\n");
    assert!(!seen.join("planted").exists() && !admin.path().join("home/u1001/dev").exists());
    let meta = std::fs::metadata(seen.join("secret")).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    let (put, _, caps) = m.direct_io();
    // Bytes past the first MiB (`small_file_bytes`) of each file are stored directly.
    assert!(put >= 3 * 7 * mib as u64 && caps >= 3, "large writes went direct: {}", m.stats());
    drop(m);
    drop(admin);
    tc.assert_fsck_clean();
    let (code, out, err) = tc.cli(&["fsck", "--replicas"]);
    assert_eq!(code, 0, "replicas differ: {out}{err}");
}

mod forged {
    //! Requests a client with a bounded identity builds by hand (not through the library):
    //! each is refused or applied only as far as the same request sent alone would be.

    use super::*;
    use plusfs_proto::{Cred, DelegOp, Errno, FileKind, Reply, Request, SetAttr, Timespec};
    use plusfs_rpc::{Connection, Counters};
    use plusfs_tls::{ClientTls, TlsFiles};
    use std::sync::Arc;

    /// A connection to the server at `addr` presenting the identity in `id`.
    async fn connect(tc: &ProcCluster, id: &Path, addr: &str) -> Connection {
        let ca = tc.cluster.map().tls.ca.clone().expect("TLS");
        let tls = ClientTls::load(&TlsFiles { ca, identity: id.to_path_buf() }).unwrap();
        Connection::connect_with(addr, Arc::new(Counters::default()), Some(&tls)).await.unwrap()
    }

    fn create(name: &str, ino: u64, mode: u32, uid: u32) -> DelegOp {
        DelegOp::Create {
            name: name.into(),
            ino,
            kind: FileKind::File,
            mode,
            uid,
            gid: 0,
            rdev: 0,
            target: None,
            time: Timespec::now(),
            by: 0,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_delegation_work_is_refused_and_nothing_applied() {
        let tc = ProcCluster::start(2);
        let t = tempfile::tempdir().unwrap();
        let flags = ["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"];
        let id = issue(&tc, t.path(), "machine1", &flags);
        let admin = tc.client();
        admin.mkdir("/shared", 0o1777).await.unwrap();
        admin.create("/shared/bobs", 0o644, true).await.unwrap();
        admin.chown("/shared/bobs", Some(1001), Some(1001)).await.unwrap();
        let home = admin.home("/shared");
        let addr = tc.cluster.map().servers.iter().find(|s| s.id == home).unwrap().address.clone();
        let conn = connect(&tc, &id, &addr).await;
        let alice = Cred { session: 0xa11ce, ..Cred::new(1000, 1000, vec![]) };
        let grant = match conn.call(&alice, &Request::DelegAcquire { dir: "/shared".into(), read: false }).await {
            Ok(Ok(Reply::Deleg(g))) => g,
            other => panic!("a node identity may hold a delegation: {other:?}"),
        };
        let flush = |seq, creds: Vec<Cred>, ops| Request::DelegFlush {
            dir: "/shared".into(),
            id: grant.id,
            seq,
            creds,
            ops,
            release: false,
        };
        // Another session may not flush (or poll) this delegation.
        let mallory = Cred { session: 0xbad, ..alice.clone() };
        let theirs = flush(1, vec![alice.clone()], vec![create("m", grant.first_ino, 0o644, 1000)]);
        let r = conn.call(&mallory, &theirs).await.unwrap();
        assert_eq!(r.unwrap_err().errno, Errno::EPERM, "another session's flush");
        let r = conn.call(&mallory, &Request::DelegWait { session: alice.session }).await.unwrap();
        assert_eq!(r.unwrap_err().errno, Errno::EPERM, "another session's recalls");
        // A claimed credential outside the identity's ranges refuses the whole flush.
        let r = conn.call(&alice, &flush(1, vec![Cred::new(3000, 3000, vec![])], vec![])).await.unwrap();
        assert_eq!(r.unwrap_err().errno, Errno::EACCES, "a flush replaying as uid 3000");
        // Operations a single request could not do are refused one by one.
        let ops = vec![
            // chmod of another user's file
            DelegOp::SetAttr {
                name: "bobs".into(),
                set: SetAttr { mode: Some(0o666), ..Default::default() },
                time: Timespec::now(),
                by: 0,
            },
            // overwrite another user's file's contents
            DelegOp::Contents {
                name: "bobs".into(),
                data: b"forged".to_vec(),
                mtime: Timespec::now(),
                ctime: Timespec::now(),
            },
            // an inode number the delegation was not given
            create("stolen-ino", grant.first_ino + grant.ino_count as u64, 0o644, 1000),
            // a setuid-root file: owned by the caller, not root
            create("suid", grant.first_ino, 0o4755, 0),
            // the same number again
            create("again", grant.first_ino, 0o644, 1000),
            // a device node
            DelegOp::Create {
                name: "dev".into(),
                ino: grant.first_ino + 1,
                kind: FileKind::CharDev,
                mode: 0o666,
                uid: 1000,
                gid: 1000,
                rdev: 0x0501,
                target: None,
                time: Timespec::now(),
                by: 0,
            },
        ];
        let failed = match conn.call(&alice, &flush(1, vec![alice.clone()], ops)).await.unwrap() {
            Ok(Reply::Flushed(f)) => f.failed,
            other => panic!("{other:?}"),
        };
        let errnos: Vec<(u32, Errno)> = failed;
        assert_eq!(
            errnos,
            vec![(0, Errno::EPERM), (1, Errno::EPERM), (2, Errno::EINVAL), (4, Errno::EINVAL), (5, Errno::EPERM)],
            "refused one by one"
        );
        let bobs = admin.stat("/shared/bobs").await.unwrap();
        assert_eq!((bobs.mode & 0o7777, bobs.size, bobs.uid), (0o644, 0, 1001), "bob's file untouched");
        let suid = admin.stat("/shared/suid").await.unwrap();
        assert_eq!(suid.uid, 1000, "made as the caller, not as the uid the flush asked for");
        assert!(admin.stat("/shared/again").await.is_err() && admin.stat("/shared/dev").await.is_err());
        assert!(admin.stat("/shared/stolen-ino").await.is_err());
        // Records by number need a capability.
        let r = conn.call(&alice, &Request::DataGet { ranges: vec![(1, 0, 10)], cap: None }).await.unwrap();
        assert_eq!(r.unwrap_err().errno, Errno::EACCES, "records by number without a capability");
        tc.assert_fsck_clean();
    }

    /// Cx with a node identity: a side is rebuilt from what the client may decide (no
    /// forged owner, ancestry, attributes or policy), inode numbers come only from the
    /// session's own lease, each once, sides naming different directories are aborted,
    /// other sub-operations are refused, and a parent the caller cannot write refuses.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_cx_sides_are_rebuilt_checked_or_refused() {
        use plusfs_proto::{CxRole, DirObject, Inode, OpId, Replace, SubOp, Threshold};
        let tc = ProcCluster::start(3);
        let t = tempfile::tempdir().unwrap();
        let flags = ["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"];
        let id = issue(&tc, t.path(), "machine1", &flags);
        let admin = tc.client();
        admin.mkdir("/shared", 0o1777).await.unwrap();
        admin.mkdir("/private", 0o755).await.unwrap();
        let conns = Conns::open(&tc, &id).await;
        let alice = Cred { session: 0xa11ce, ..Cred::new(1000, 1000, vec![]) };
        // A name in `dir` whose object's home is not the server of `dir`'s entries.
        let name_in = |dir: &str, stem: &str| {
            let coord = admin.home(dir);
            let name =
                (0..).map(|i| format!("{stem}{i}")).find(|n| admin.home(&format!("{dir}/{n}")) != coord).unwrap();
            let part = admin.home(&format!("{dir}/{name}"));
            (name, coord, part)
        };
        let mut seq = 0;
        let mut op = || {
            seq += 1;
            OpId { client: 0xbad, process: 1, seq }
        };
        let exec = |op, role, peer, ops| Request::CxExec { op, role, peer, ops, leased: false };
        let insert = |dir: &str, name: &str, ino| SubOp::InsertEntry {
            dir: dir.into(),
            name: name.into(),
            inode: Inode::subdir(ino),
            replace: Replace::Never,
            shard: None,
        };
        let create = |path: String, ino| {
            let mut object = DirObject::new(ino, 0o4777, 0, 0);
            object.xattrs = vec![("trusted.forged".into(), b"x".to_vec())];
            object.dist.threshold = Threshold::Entries(0);
            object.ancestry = Some(plusfs_proto::Ancestry::root(object.search_elem()));
            SubOp::CreateDir { path, object }
        };
        let yes = |r: Result<Reply, plusfs_proto::WireError>| match r {
            Ok(Reply::CxAnswer(a)) => a.error.is_none(),
            other => panic!("{other:?}"),
        };
        let launch = |op, participant| Request::CxLaunch { op, participant };
        let committed = |r: Result<Reply, plusfs_proto::WireError>| match r {
            Ok(Reply::CxOutcome { committed }) => committed,
            other => panic!("{other:?}"),
        };
        let lease = |r: Result<Reply, plusfs_proto::WireError>| match r {
            Ok(Reply::Inos { first, count }) => (first, count),
            other => panic!("{other:?}"),
        };

        // A mkdir by Cx whose participant side claims root's object, a trusted xattr, a
        // distribution policy and an ancestry: it commits as alice's plain directory.
        let (name, coord, part) = name_in("/shared", "ok");
        let (first, _) = lease(conns.call(part, &alice, Request::AllocInos { count: 16 }).await);
        let path = format!("/shared/{name}");
        let x = op();
        assert!(yes(conns
            .call(coord, &alice, exec(x, CxRole::Coordinator, part, vec![insert("/shared", &name, first)]))
            .await));
        assert!(yes(conns
            .call(part, &alice, exec(x, CxRole::Participant, coord, vec![create(path.clone(), first)]))
            .await));
        assert!(committed(conns.call(coord, &alice, launch(x, part)).await));
        let a = admin.stat(&path).await.unwrap();
        assert_eq!((a.ino, a.uid, a.gid, a.mode & 0o7777), (first, 1000, 1000, 0o777), "rebuilt from the claim");
        assert!(admin.listxattr(&path).await.unwrap().is_empty(), "no forged attributes");
        // The same inode number again, and one never leased: ESTALE before anything runs.
        let (name2, coord2, part2) = name_in("/shared", "again");
        for ino in [first, 77_777] {
            let r = conns
                .call(
                    part2,
                    &alice,
                    exec(op(), CxRole::Participant, coord2, vec![create(format!("/shared/{name2}"), ino)]),
                )
                .await;
            assert_eq!(r.unwrap_err().errno, Errno::ESTALE, "inode {ino}");
        }
        // Sides that name different directories: each side alone is fine, both abort.
        let (b, coord3, part3) = name_in("/shared", "b");
        let y = op();
        let (ino, _) = lease(conns.call(part3, &alice, Request::AllocInos { count: 4 }).await);
        assert!(yes(conns
            .call(coord3, &alice, exec(y, CxRole::Coordinator, part3, vec![insert("/shared", "elsewhere", ino)]))
            .await));
        assert!(yes(conns
            .call(part3, &alice, exec(y, CxRole::Participant, coord3, vec![create(format!("/shared/{b}"), ino)]))
            .await));
        assert!(!committed(conns.call(coord3, &alice, launch(y, part3)).await), "mismatched sides committed");
        let logs: String = tc.cluster.logs().iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
        assert!(logs.contains("name different directories"), "aborted for naming different directories");
        assert!(admin.lstat("/shared/elsewhere").await.is_err() && admin.lstat(&format!("/shared/{b}")).await.is_err());
        // Sub-operations of no mkdir or rmdir, and a replacing insert: refused at admission.
        let refused_kinds = [
            (
                CxRole::Coordinator,
                vec![SubOp::ExportSubtree { root: "/shared".into(), new_root: "/x".into(), rebase: None }],
            ),
            (
                CxRole::Coordinator,
                vec![SubOp::InsertEntry {
                    dir: "/shared".into(),
                    name: "r".into(),
                    inode: Inode::subdir(first + 2),
                    replace: Replace::NonDir,
                    shard: None,
                }],
            ),
            (CxRole::Participant, vec![create("/shared/t".into(), first + 3), create("/shared/u".into(), first + 4)]),
            (CxRole::Participant, vec![SubOp::AdjustLinks { ino: 5, delta: 1 }]),
        ];
        for (role, ops) in refused_kinds {
            let r = conns.call(coord, &alice, exec(op(), role, part, ops.clone())).await;
            assert_eq!(r.unwrap_err().errno, Errno::EPERM, "{ops:?}");
        }
        // A parent she cannot write: the coordinator says NO, nothing is made.
        let (p, coord4, part4) = name_in("/private", "x");
        let z = op();
        let (first, _) = lease(conns.call(part4, &alice, Request::AllocInos { count: 8 }).await);
        let c = conns
            .call(coord4, &alice, exec(z, CxRole::Coordinator, part4, vec![insert("/private", &p, first + 5)]))
            .await;
        assert!(!yes(c), "an entry in a directory she cannot write");
        let _ = conns
            .call(part4, &alice, exec(z, CxRole::Participant, coord4, vec![create(format!("/private/{p}"), first + 5)]))
            .await;
        assert!(!committed(conns.call(coord4, &alice, launch(z, part4)).await));
        assert!(admin.lstat(&format!("/private/{p}")).await.is_err());

        // Through the library with the node identity: after the home of its new
        // directories restarts (its leases gone), the next mkdir still succeeds.
        let mut map = tc.cluster.map().clone();
        map.tls.identity = Some(id.clone());
        let node = plusfs_client::Client::new(map, plusfs_client::ClientOptions { retries: 5, ..Default::default() })
            .as_caller(Cred::new(1000, 1000, vec![]));
        let (n1, _, home) = name_in("/shared", "lib");
        let n2 = (0..).map(|i| format!("lib2-{i}")).find(|n| admin.home(&format!("/shared/{n}")) == home).unwrap();
        node.mkdir(&format!("/shared/{n1}"), 0o755).await.unwrap();
        let mut tc = tc;
        tc.cluster.kill(home).unwrap();
        tc.cluster.start(home).unwrap();
        tc.cluster.wait_ready(std::time::Duration::from_secs(20)).unwrap();
        let aborted = super::cx_counter(&tc, "cx_aborted");
        node.mkdir(&format!("/shared/{n2}"), 0o755).await.expect("a mkdir after the home forgot the lease");
        assert!(super::cx_counter(&tc, "cx_aborted") > aborted, "the forgotten lease made the Cx attempt abort");
        for n in [&n1, &n2] {
            assert_eq!(admin.stat(&format!("/shared/{n}")).await.unwrap().uid, 1000);
        }
        tc.assert_fsck_clean();
    }

    /// A node identity's mkdir in a distributed directory it has not learnt yet: planned
    /// as a Cx over two servers, it learns from the first answer that the entry's shard is
    /// on the new directory's own server, where only an admin may send the serial
    /// sub-operations; it then goes to the parent's server as one request (it was refused
    /// EPERM, found by the replica-group test during a group add).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_mkdir_whose_sides_meet_on_one_server_goes_through_the_parent() {
        let tc = ProcCluster::start(2);
        assert_eq!(tc.cluster.map().txn.protocol, plusfs_placement::TxnProtocol::Cx);
        let t = tempfile::tempdir().unwrap();
        let flags = ["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"];
        let id = issue(&tc, t.path(), "machine1", &flags);
        let admin = tc.client();
        admin.mkdir_with("/big", 0o777, plusfs_proto::Threshold::Entries(0), 0).await.unwrap();
        admin.create("/big/probe", 0o644, true).await.unwrap();
        let info = admin.cached_distribution("/big").expect("distributed from birth");
        assert!(info.servers().len() > 1, "{info:?}");
        let parent_home = admin.home("/big");
        // Names whose new directory is homed away from the parent's home (a Cx, planned
        // before the client knows the distribution) but on the server of the name's shard.
        let names: Vec<String> = (0..)
            .map(|i| format!("m{i}"))
            .filter(|n| {
                let home = admin.home(&format!("/big/{n}"));
                home != parent_home && info.server_of(n) == home
            })
            .take(4)
            .collect();
        let mut map = tc.cluster.map().clone();
        map.tls.identity = Some(id.clone());
        for n in &names {
            // A fresh client each time: none has learnt the distribution.
            let node = plusfs_client::Client::new(
                map.clone(),
                plusfs_client::ClientOptions { retries: 5, ..Default::default() },
            )
            .as_caller(Cred::new(1000, 1000, vec![]));
            assert!(node.cached_distribution("/big").is_none());
            node.mkdir(&format!("/big/{n}"), 0o755).await.unwrap_or_else(|e| panic!("mkdir /big/{n}: {e}"));
            assert!(node.cached_distribution("/big").is_some(), "the client learnt the distribution on the way");
            node.rmdir(&format!("/big/{n}")).await.unwrap();
            node.mkdir(&format!("/big/{n}"), 0o755).await.unwrap();
            assert_eq!(admin.stat(&format!("/big/{n}")).await.unwrap().uid, 1000);
        }
        tc.assert_fsck_clean();
    }

    /// Connections of one identity to every server, by server id.
    struct Conns(std::collections::BTreeMap<u32, Connection>);

    impl Conns {
        async fn open(tc: &ProcCluster, id: &Path) -> Conns {
            let mut out = std::collections::BTreeMap::new();
            for s in &tc.cluster.map().servers {
                out.insert(s.id, connect(tc, id, &s.address).await);
            }
            Conns(out)
        }

        async fn call(&self, server: u32, cred: &Cred, req: Request) -> Result<Reply, plusfs_proto::WireError> {
            self.0[&server].call(cred, &req).await.expect("transport")
        }
    }

    fn refused(r: Result<Reply, plusfs_proto::WireError>, what: &str) {
        match r {
            Err(e) => assert_eq!(e.errno, Errno::EACCES, "{what}: {}", e.message),
            Ok(reply) => panic!("{what} was served: {reply:?}"),
        }
    }

    /// Client-direct I/O with a node identity: capabilities from the file's server let it
    /// read and write only the records of files it may, only within the granted bytes, only
    /// on its own connections and only until they expire; records it did not store cannot
    /// be committed into a file or dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_direct_io_is_refused_and_nothing_applied() {
        const CAP_SECS: u64 = 3;
        let settings = plusfs_localcluster::ClusterSettings { capability_secs: Some(CAP_SECS), ..Default::default() };
        let tc = ProcCluster::start_settings(3, &settings);
        let t = tempfile::tempdir().unwrap();
        let flags = ["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"];
        let id = issue(&tc, t.path(), "machine1", &flags);
        let other_id = issue(&tc, t.path(), "machine2", &flags);
        let admin = tc.client();
        admin.mkdir("/shared", 0o1777).await.unwrap();
        let mib = 1usize << 20;
        let (bob_data, alice_data) = (common::bytes(1, 6 * mib), common::bytes(2, 6 * mib));
        for (path, data, mode, uid) in [
            ("/shared/bob", &bob_data, 0o600, 1001),
            ("/shared/alice", &alice_data, 0o644, 1000),
            ("/shared/carol", &alice_data, 0o666, 1002),
        ] {
            admin.create(path, mode, true).await.unwrap();
            admin.write(path, 0, data).await.unwrap();
            admin.chown(path, Some(uid), Some(uid)).await.unwrap();
        }
        let entry = admin.home("/shared");
        let conns = Conns::open(&tc, &id).await;
        let alice = Cred::new(1000, 1000, vec![]);
        let layout = |path: &str, offset: u64, len: u64, write: bool| Request::Layout {
            path: path.into(),
            offset,
            len,
            write,
            holder: "forged-holder".into(),
        };
        let as_layout = |r: Result<Reply, plusfs_proto::WireError>| match r {
            Ok(Reply::Layout { attr, pieces, cap }) => (attr, pieces, cap.expect("a capability for a node")),
            other => panic!("{other:?}"),
        };

        // Reading her own file: a read capability for her certificate (not the holder the
        // request named), and records of that file only.
        let (a_attr, a_pieces, read_cap) =
            as_layout(conns.call(entry, &alice, layout("/shared/alice", 0, 6 << 20, false)).await);
        assert_ne!(read_cap.holder, "forged-holder");
        let q = a_pieces.iter().find(|q| q.file_off >= mib as u64).copied().expect("a chunk on a data server");
        let get = |ranges, cap| Request::DataGet { ranges, cap };
        match conns.call(q.server, &alice, get(vec![(q.record, 0, 4096)], Some(read_cap.clone()))).await {
            Ok(Reply::Data(d)) => assert_eq!(d.to_vec(), alice_data[q.file_off as usize..][..4096]),
            other => panic!("her own record: {other:?}"),
        }
        // Bob's 0600 file: no layout; his records with her capability, or none: refused.
        refused(conns.call(entry, &alice, layout("/shared/bob", 0, 1, false)).await, "layout of bob's file");
        let (b_attr, b_pieces, _) =
            match admin.call_server(entry, &layout("/shared/bob", 0, 6 << 20, false)).await.unwrap() {
                Reply::Layout { attr, pieces, cap } => (attr, pieces, cap),
                other => panic!("{other:?}"),
            };
        let bq = b_pieces.iter().find(|q| q.file_off >= mib as u64).copied().unwrap();
        // A capability is good on any data server, but only for records of its own file.
        let bobs_with_hers = get(vec![(bq.record, 0, 10)], Some(read_cap.clone()));
        refused(conns.call(bq.server, &alice, bobs_with_hers).await, "bob's record with her capability");
        refused(
            conns.call(bq.server, &alice, get(vec![(bq.record, 0, 10)], None)).await,
            "bob's record without capability",
        );
        let mut forged = read_cap.clone();
        forged.ino = b_attr.ino;
        refused(
            conns.call(bq.server, &alice, get(vec![(bq.record, 0, 10)], Some(forged))).await,
            "a capability re-aimed at bob's file",
        );
        // A stolen capability on another certificate's connection.
        let thief = Conns::open(&tc, &other_id).await;
        refused(
            thief.call(q.server, &alice, get(vec![(q.record, 0, 10)], Some(read_cap.clone()))).await,
            "a capability on another certificate",
        );

        // Writing: a write capability over [2 MiB, 3 MiB) of her file.
        let (_, _, write_cap) =
            as_layout(conns.call(entry, &alice, layout("/shared/alice", 2 << 20, 1 << 20, true)).await);
        refused(conns.call(entry, &alice, layout("/shared/bob", 0, 1, true)).await, "write capability for bob's file");
        let server = plusfs_proto::ServerId::from(q.server);
        let put = |owner, file_off, cap| Request::DataPut { owner, data: vec![0x5a; 4096].into(), file_off, cap };
        refused(
            conns.call(server, &alice, put(a_attr.ino, 4 << 20, Some(write_cap.clone()))).await,
            "a put outside the granted bytes",
        );
        refused(
            conns.call(server, &alice, put(b_attr.ino, 2 << 20, Some(write_cap.clone()))).await,
            "a put for bob's file",
        );
        refused(conns.call(server, &alice, put(a_attr.ino, 2 << 20, None)).await, "a put without capability");
        refused(
            conns.call(server, &alice, get(vec![(q.record, 0, 10)], Some(write_cap.clone()))).await,
            "a read with a write capability",
        );
        let receipt = match conns.call(server, &alice, put(a_attr.ino, 2 << 20, Some(write_cap.clone()))).await {
            Ok(Reply::Receipt(r)) => r,
            other => panic!("a put within the grant: {other:?}"),
        };
        let piece = plusfs_proto::Piece { file_off: 2 << 20, len: 4096, server, record: receipt.record, skip: 0 };
        let commit = |path: &str, ino, pieces: Vec<plusfs_proto::Piece>, receipts| Request::CommitWrite {
            path: path.into(),
            ino,
            offset: pieces.first().map_or(0, |q| q.file_off),
            len: pieces.iter().map(|q| q.len).sum(),
            pieces,
            receipts,
        };
        // Bob's record spliced into her file; her receipted record into carol's file.
        let stolen = plusfs_proto::Piece { file_off: bq.file_off, len: bq.len, ..bq };
        refused(
            conns.call(entry, &alice, commit("/shared/alice", a_attr.ino, vec![stolen], vec![])).await,
            "committing bob's record",
        );
        let carol = admin.stat("/shared/carol").await.unwrap();
        refused(
            conns.call(entry, &alice, commit("/shared/carol", carol.ino, vec![piece], vec![receipt.clone()])).await,
            "a receipt of another file",
        );
        // Dropping bob's record.
        refused(
            conns
                .call(
                    bq.server,
                    &alice,
                    Request::DataDrop { records: vec![bq.record], receipts: vec![receipt.clone()] },
                )
                .await,
            "dropping bob's record",
        );
        // Her own receipted record commits.
        match conns.call(entry, &alice, commit("/shared/alice", a_attr.ino, vec![piece], vec![receipt.clone()])).await {
            Ok(Reply::Attr(a)) => assert_eq!(a.size, 6 << 20),
            other => panic!("her commit: {other:?}"),
        }

        // After expiry, neither the capabilities nor the receipt work any more.
        tokio::time::sleep(std::time::Duration::from_secs(CAP_SECS + 2)).await;
        refused(
            conns.call(q.server, &alice, get(vec![(q.record, 0, 10)], Some(read_cap.clone()))).await,
            "an expired read capability",
        );
        refused(
            conns.call(server, &alice, put(a_attr.ino, 2 << 20, Some(write_cap.clone()))).await,
            "an expired write capability",
        );
        refused(
            conns.call(entry, &alice, commit("/shared/alice", a_attr.ino, vec![piece], vec![receipt])).await,
            "an expired receipt",
        );

        // Nothing of the refused requests was applied.
        assert_eq!(admin.read("/shared/bob", 0, 6 * mib).await.unwrap(), bob_data, "bob's file");
        let mut expect = alice_data.clone();
        expect[2 * mib..2 * mib + 4096].fill(0x5a);
        assert_eq!(admin.read("/shared/alice", 0, 6 * mib).await.unwrap(), expect, "her file: her one commit");
        assert_eq!(admin.read("/shared/carol", 0, 6 * mib).await.unwrap(), alice_data, "carol's file");
        tc.assert_fsck_clean();
    }
}
