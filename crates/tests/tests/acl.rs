//! POSIX ACLs, checked by the servers: named users and groups, the mask, default ACLs
//! inherited by creates and mkdirs (the umask giving way to them), chmod moving the mask,
//! ACLs of ancestors deciding search permission on every server; through the library
//! (no kernel involved) and through the mount with `setfacl`/`getfacl`, `cp -a`,
//! `rsync -A` and `tar --acls`.

mod common;
mod mounts;

use common::ProcCluster;
use mounts::{as_user, fuse_available, sh, Mount};
use plusfs_client::{Acl, AclKind, Client};
use plusfs_proto::{Cred, Errno};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const CAROL: u32 = 1002;
/// A member of group 2000 (a named group of the ACLs below).
const DAVE: u32 = 1003;
const TEAM: u32 = 2000;

fn user(c: &Client, uid: u32, groups: &[u32]) -> Client {
    c.as_caller(Cred { umask: 0o022, ..Cred::new(uid, uid, groups.to_vec()) })
}

fn acl(text: &str) -> Acl {
    Acl::from_text(text).expect("valid ACL text")
}

/// Creates (or opens) `path` and writes `data` at its start.
async fn put(c: &Client, path: &str, data: &[u8]) -> Result<(), plusfs_client::FsError> {
    c.create(path, 0o644, false).await?;
    c.write(path, 0, data).await.map(drop)
}

async fn errno_of<T: std::fmt::Debug>(r: Result<T, plusfs_client::FsError>) -> Errno {
    r.expect_err("refused").errno
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_check_acls_of_the_object_and_of_its_ancestors() {
    let tc = ProcCluster::start(3);
    let root = tc.client();
    let (alice, bob, carol, dave) =
        (user(&root, ALICE, &[]), user(&root, BOB, &[]), user(&root, CAROL, &[]), user(&root, DAVE, &[TEAM]));
    root.mkdir("/proj", 0o700).await.unwrap();
    root.chown("/proj", Some(ALICE), Some(ALICE)).await.unwrap();
    // Deep enough that the directories below live on other servers than /proj.
    alice.mkdir("/proj/a", 0o755).await.unwrap();
    alice.mkdir("/proj/a/b", 0o755).await.unwrap();
    put(&alice, "/proj/a/b/f", b"data").await.unwrap();
    assert_eq!(errno_of(bob.stat("/proj/a/b/f").await).await, Errno::EACCES, "0700 keeps bob out");

    // Bob may search /proj through a named-user entry: every server holding a directory
    // below /proj learns it through the ancestry.
    let rule = acl("user::rwx,user:1001:r-x,group::---,group:2000:--x,mask::r-x,other::---");
    assert_eq!(errno_of(bob.set_acl("/proj", AclKind::Access, Some(&rule)).await).await, Errno::EPERM);
    alice.set_acl("/proj", AclKind::Access, Some(&rule)).await.unwrap();
    assert_eq!(root.stat("/proj").await.unwrap().mode & 0o777, 0o750, "the mask is the group class");
    assert_eq!(alice.get_acl("/proj", AclKind::Access).await.unwrap(), Some(rule));
    assert_eq!(bob.read("/proj/a/b/f", 0, 100).await.unwrap(), b"data");
    assert_eq!(errno_of(carol.stat("/proj/a/b/f").await).await, Errno::EACCES, "others get nothing");
    assert_eq!(errno_of(put(&bob, "/proj/new", b"x").await).await, Errno::EACCES, "bob may not write");
    // chmod moves the mask: without x in the group class bob cannot search any more.
    alice.chmod("/proj", 0o740).await.unwrap();
    let masked = alice.get_acl("/proj", AclKind::Access).await.unwrap().unwrap();
    assert_eq!(masked.to_text(), "user::rwx,user:1001:r-x,group::---,group:2000:--x,mask::r--,other::---");
    assert_eq!(errno_of(bob.stat("/proj/a/b/f").await).await, Errno::EACCES);
    alice.chmod("/proj", 0o750).await.unwrap();
    assert!(bob.stat("/proj/a/b/f").await.is_ok());

    // A named group with write permission: its members create; the owning group entry
    // denies a member of the owning group without write.
    let team = acl("user::rwx,group::r-x,group:2000:rwx,mask::rwx,other::r-x");
    alice.set_acl("/proj/a", AclKind::Access, Some(&team)).await.unwrap();
    put(&dave, "/proj/a/by-dave", b"d").await.unwrap();
    assert_eq!(errno_of(put(&bob, "/proj/a/by-bob", b"b").await).await, Errno::EACCES);
    // A file's own ACL: bob reads f only through a named entry, the others bits say no.
    alice.chmod("/proj/a/b/f", 0o600).await.unwrap();
    assert_eq!(errno_of(bob.read("/proj/a/b/f", 0, 100).await).await, Errno::EACCES);
    alice.set_acl("/proj/a/b/f", AclKind::Access, Some(&acl("u::rw-,u:1001:r--,g::---,m::r--,o::---"))).await.unwrap();
    assert_eq!(bob.read("/proj/a/b/f", 0, 100).await.unwrap(), b"data");
    assert_eq!(errno_of(put(&bob, "/proj/a/b/f", b"x").await).await, Errno::EACCES);

    // Default ACLs: inherited by files (their mode meets it; the umask gives way) and by
    // directories (as their own default ACL too), in one directory and through mkdir.
    let shared = "/proj/a/shared";
    alice.mkdir(shared, 0o770).await.unwrap();
    let dflt = acl("user::rwx,group::rwx,group:2000:rwx,mask::rwx,other::---");
    assert_eq!(errno_of(alice.set_acl("/proj/a/b/f", AclKind::Default, Some(&dflt)).await).await, Errno::EACCES);
    alice.set_acl(shared, AclKind::Default, Some(&dflt)).await.unwrap();
    alice.set_acl(shared, AclKind::Access, Some(&dflt)).await.unwrap();
    dave.create(&format!("{shared}/file"), 0o666, true).await.unwrap();
    let f = root.stat(&format!("{shared}/file")).await.unwrap();
    assert_eq!((f.mode & 0o777, f.uid), (0o660, DAVE), "the umask 022 does not apply under a default ACL");
    let inherited = root.get_acl(&format!("{shared}/file"), AclKind::Access).await.unwrap().unwrap();
    assert_eq!(inherited.to_text(), "user::rw-,group::rwx,group:2000:rwx,mask::rw-,other::---");
    dave.mkdir(&format!("{shared}/sub"), 0o777).await.unwrap();
    assert_eq!(root.get_acl(&format!("{shared}/sub"), AclKind::Default).await.unwrap(), Some(dflt.clone()));
    put(&dave, &format!("{shared}/sub/deeper"), b"x").await.unwrap();
    let deeper = root.get_acl(&format!("{shared}/sub/deeper"), AclKind::Access).await.unwrap().unwrap();
    assert_eq!(deeper.to_text(), "user::rw-,group::rwx,group:2000:rwx,mask::r--,other::---");
    // A symbolic link takes no ACL, inherited or set.
    let link = format!("{shared}/link");
    dave.symlink("file", &link).await.unwrap();
    assert_eq!(root.get_acl(&link, AclKind::Access).await.unwrap(), None);
    assert_eq!(errno_of(dave.set_acl(&link, AclKind::Access, Some(&dflt)).await).await, Errno::EOPNOTSUPP);
    // Setting an access ACL clears the set-group-ID bit of a caller outside the group.
    root.chown(&format!("{shared}/sub"), Some(ALICE), Some(ALICE)).await.unwrap();
    alice.chmod(&format!("{shared}/sub"), 0o2770).await.unwrap();
    alice.set_acl(&format!("{shared}/sub"), AclKind::Access, Some(&dflt)).await.unwrap();
    assert_eq!(root.stat(&format!("{shared}/sub")).await.unwrap().mode & 0o7777, 0o2770, "alice is in her group");
    root.chown(&format!("{shared}/sub"), None, Some(TEAM)).await.unwrap();
    alice.set_acl(&format!("{shared}/sub"), AclKind::Access, Some(&dflt)).await.unwrap();
    assert_eq!(root.stat(&format!("{shared}/sub")).await.unwrap().mode & 0o7777, 0o770, "not in group 2000");
    // Without a default ACL the umask applies.
    alice.create("/proj/a/plain", 0o666, true).await.unwrap();
    assert_eq!(root.stat("/proj/a/plain").await.unwrap().mode & 0o777, 0o644);
    assert_eq!(root.get_acl("/proj/a/plain", AclKind::Access).await.unwrap(), None);

    // A file written under the writer's delegation (its contents known to the client)
    // is read through that delegation by another caller of the same client: the client
    // checks the file's ACL as the server would.
    put(&alice, "/proj/a/b/small", b"small").await.unwrap();
    alice
        .set_acl("/proj/a/b/small", AclKind::Access, Some(&acl("u::rw-,u:1001:r--,g::---,m::r--,o::---")))
        .await
        .unwrap();
    put(&alice, "/proj/a/b/small", b"SMALL").await.unwrap();
    assert_eq!(bob.read("/proj/a/b/small", 0, 100).await.unwrap(), b"SMALL");
    assert_eq!(errno_of(carol.read("/proj/a/b/small", 0, 100).await).await, Errno::EACCES);
    assert_eq!(errno_of(put(&bob, "/proj/a/b/small", b"x").await).await, Errno::EACCES);
    // Bad values are refused and change nothing; an ACL the mode says all of is kept as
    // the mode only; removing gives the mode back.
    let bad = alice.setxattr("/proj/a/plain", "system.posix_acl_access", b"\x02\x00\x00\x00\x01", false, false).await;
    assert_eq!(errno_of(bad).await, Errno::EINVAL);
    alice.set_acl("/proj/a/plain", AclKind::Access, Some(&acl("u::rwx,g::r--,o::---"))).await.unwrap();
    assert_eq!(root.stat("/proj/a/plain").await.unwrap().mode & 0o777, 0o740);
    assert_eq!(root.get_acl("/proj/a/plain", AclKind::Access).await.unwrap(), None);
    alice.set_acl("/proj", AclKind::Access, None).await.unwrap();
    assert_eq!(errno_of(bob.stat("/proj/a/b/f").await).await, Errno::EACCES, "0750 without the entry");
    tc.assert_fsck_clean();
}

/// The ACL tools and the programs that copy ACLs, through a mount whose users are the
/// calling processes.
#[test]
fn setfacl_getfacl_cp_rsync_and_tar_work_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let tc = ProcCluster::start(3);
    let m = Mount::with_options(&tc, &["allow_other"]);
    let d = m.path().display().to_string();
    sh(&format!(
        "mkdir -m 700 {d}/proj && mkdir {d}/proj/in && echo secret > {d}/proj/in/f && chmod 644 {d}/proj/in/f"
    ));
    sh(&format!("chown -R {ALICE}:{ALICE} {d}/proj"));
    let (ok, _, _) = as_user(BOB, &[], &format!("cat {d}/proj/in/f"));
    assert!(!ok, "bob cannot reach a file under a 0700 directory");
    sh(&format!("setfacl -m u:{BOB}:rx {d}/proj"));
    let (ok, out, err) = as_user(BOB, &[], &format!("cat {d}/proj/in/f"));
    assert!(ok && out == "secret\n", "bob reads through his ACL entry: {err}");
    let (ok, _, _) = as_user(CAROL, &[], &format!("cat {d}/proj/in/f"));
    assert!(!ok, "carol has no entry");
    let (ok, _, _) = as_user(BOB, &[], &format!("touch {d}/proj/bob-was-here"));
    assert!(!ok, "bob has no write entry");
    let text = sh(&format!("getfacl -n -p {d}/proj"));
    assert!(text.contains(&format!("user:{BOB}:r-x")) && text.contains("mask::r-x"), "{text}");
    // A default ACL: what users create in the directory inherits it, whatever their umask.
    sh(&format!("mkdir {d}/proj/team && chown {ALICE}:{ALICE} {d}/proj/team && chmod 2770 {d}/proj/team"));
    sh(&format!(
        "setfacl -m u:{BOB}:rwx,g:{TEAM}:rwx {d}/proj/team && setfacl -d -m g:{TEAM}:rwx,u:{BOB}:rwx {d}/proj/team"
    ));
    let (ok, _, err) =
        as_user(BOB, &[], &format!("umask 077 && echo hi > {d}/proj/team/note && mkdir {d}/proj/team/sub"));
    assert!(ok, "bob creates in the team directory: {err}");
    let note = sh(&format!("getfacl -n -p {d}/proj/team/note"));
    assert!(note.contains(&format!("group:{TEAM}:rwx\t#effective:rw-")), "the umask gave way: {note}");
    sh(&format!("setfacl -m g:{TEAM}:x {d}/proj"));
    let (ok, out, err) = as_user(DAVE, &[TEAM], &format!("cat {d}/proj/team/note"));
    assert!(ok && out == "hi\n", "a team member reads through the inherited entry: {err}");
    let (ok, _, _) = as_user(CAROL, &[], &format!("cat {d}/proj/team/note"));
    assert!(!ok, "carol is in no entry");
    let sub = sh(&format!("getfacl -n -p {d}/proj/team/sub"));
    assert!(sub.contains(&format!("default:group:{TEAM}:rwx")), "a new directory inherits the default ACL: {sub}");
    // chmod moves the mask, and `ls -l` shows the ACL's `+`.
    sh(&format!("chmod 750 {d}/proj/team"));
    let after = sh(&format!("getfacl -n -p {d}/proj/team"));
    assert!(after.contains("mask::r-x"), "{after}");
    assert!(sh(&format!("ls -ld {d}/proj/team")).starts_with("drwxr-s---+"));
    // cp -a, rsync -A and tar --acls keep ACLs (within the cluster).
    let acls_of = |p: &str| sh(&format!("cd {p} && getfacl -n -R -p . | grep -v '^# owner\\|^# group'"));
    sh(&format!("cp -a {d}/proj {d}/copy"));
    assert_eq!(acls_of(&format!("{d}/copy")), acls_of(&format!("{d}/proj")), "cp -a");
    sh(&format!("rsync -aA {d}/proj/ {d}/synced/"));
    assert_eq!(acls_of(&format!("{d}/synced")), acls_of(&format!("{d}/proj")), "rsync -A");
    sh(&format!("cd {d} && tar --acls -cf {d}/t.tar proj && mkdir {d}/untar && tar --acls -xf {d}/t.tar -C {d}/untar"));
    assert_eq!(acls_of(&format!("{d}/untar/proj")), acls_of(&format!("{d}/proj")), "tar --acls");
    // setfacl -b removes them all.
    sh(&format!("setfacl -b {d}/proj"));
    assert!(!sh(&format!("ls -ld {d}/proj")).starts_with("drwx------+"));
    let (ok, _, _) = as_user(BOB, &[], &format!("cat {d}/proj/in/f"));
    assert!(!ok, "bob's entry is gone");
    drop(m);
    tc.assert_fsck_clean();
}
