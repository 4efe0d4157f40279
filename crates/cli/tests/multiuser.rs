//! Many users on one cluster through one mount: a mount presenting a bounded identity acts
//! for each calling process (its uid, gid and groups), also for reads and writes of open
//! files, flushes and write-backs; the identity bounds what it may claim.

mod common;
mod mounts;

use common::TestCluster;
use mounts::{as_user, fuse_available, sh, Mount};
use std::path::{Path, PathBuf};

/// Issues an identity named `name` with the `plusfs cert issue` flags `flags` into a new
/// directory below `base`; returns the directory.
fn issue(tc: &TestCluster, base: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let out = base.join(name);
    let mut args = vec!["cert", "issue", "--name", name, "--out", out.to_str().unwrap()];
    args.extend_from_slice(flags);
    let (code, stdout, stderr) = tc.cli(&args);
    assert_eq!(code, 0, "cert issue: {stdout}{stderr}");
    out
}

/// `sha256sum` of `path` run as `uid` (the hex digest).
fn sha256_as(uid: u32, path: &Path) -> String {
    let (ok, out, err) = as_user(uid, &[], &format!("sha256sum '{}'", path.display()));
    assert!(ok, "sha256sum {} as {uid}: {err}", path.display());
    out.split_whitespace().next().unwrap_or_default().to_string()
}

/// Sets up, through an admin mount, a home directory per user and a sticky scratch
/// directory; returns the admin mount.
fn homes(tc: &TestCluster, users: &[u32]) -> Mount {
    let admin = Mount::new(tc);
    let a = admin.path().display().to_string();
    sh(&format!("mkdir -p {a}/home && mkdir -m 1777 {a}/scratch"));
    for u in users {
        sh(&format!("mkdir {a}/home/u{u} && chown {u}:{u} {a}/home/u{u}"));
    }
    admin
}

#[test]
fn a_node_identity_mount_stores_what_each_user_writes() {
    if !fuse_available() {
        return;
    }
    let tc = TestCluster::start(3);
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let flags = ["--node", "--uids", "1000-1999", "--gids", "1000-1999", "--root-squash"];
    let id = issue(&tc, t.path(), "machine1", &flags);
    let admin = homes(&tc, &[1000, 1001]);
    let m = Mount::with_identity(&tc, &["allow_other"], Some(&id));
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

    // Another user's private file is refused; the owner reads it.
    let secret = mnt.join("home/u1000/secret");
    let (ok, _, err) = as_user(1000, &[], &format!("echo s > '{0}' && chmod 600 '{0}'", secret.display()));
    assert!(ok, "{err}");
    let (ok, _, err) = as_user(1001, &[], &format!("cat '{}'", secret.display()));
    assert!(!ok && err.contains("ermission denied"), "1001 read 1000's 0600 file: {err}");
    let (ok, _, err) = as_user(1001, &[], &format!("echo x >> '{}'", mnt.join("home/u1000/f1").display()));
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
