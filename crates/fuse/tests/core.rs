//! The mount core driven directly (no kernel, no `/dev/fuse`) against an in-process
//! cluster: the inode table, write gathering, files unlinked while open, listings,
//! attributes, and the errno each failure comes back as.

use plusfs_client::Client;
use plusfs_fuse::core::{
    Caller, DirItem, DirPlusItem, Errno, MountCore, RenameMode, XattrReply, ORPHANS, STATS_FILE, STATS_INO,
};
use plusfs_fuse::WRITE_BUFFER;
use plusfs_proto::{Attr, SetAttr, TimeSet, Timespec};
use plusfs_testcluster::{Options, TestCluster};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const ROOT: u64 = 1;
const ALICE: Caller = Caller { uid: 1000, gid: 100, groups: Vec::new() };
const BOB: Caller = Caller { uid: 2000, gid: 200, groups: Vec::new() };

/// A mount core over a fresh in-process cluster. Fields drop in order: the core's
/// runtime, then the cluster, then the runtime the cluster was started on.
struct Mount {
    core: MountCore,
    cluster: TestCluster,
    rt: tokio::runtime::Runtime,
}

impl Mount {
    fn new() -> Mount {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let cluster = rt.block_on(TestCluster::start(Options { servers: 2, ..Options::default() })).expect("cluster");
        // Everyone may create in `/`, as in a scratch directory; the servers check the rest.
        rt.block_on(cluster.client().chmod("/", 0o777)).expect("chmod /");
        let core = MountCore::new(cluster.client());
        Mount { core, cluster, rt }
    }

    /// Runs a core operation to completion.
    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// Another client of the same cluster (what another mount or program sees).
    fn other(&self) -> Client {
        self.cluster.client()
    }

    /// Names in a directory, as another client lists them.
    fn names(&self, dir: &str) -> Vec<String> {
        let entries = self.rt.block_on(self.other().readdir(dir)).expect("readdir");
        entries.into_iter().map(|e| e.name).collect()
    }

    /// Creates `name` in `parent` as ALICE with `data`, and closes it.
    fn file(&self, parent: u64, name: &str, data: &[u8]) -> Attr {
        let a = self
            .run(self.core.create(&ALICE, parent, n(name), 0o644, 0o022, libc::O_CREAT | libc::O_WRONLY))
            .unwrap()
            .0;
        self.run(self.core.write(a.ino, 0, 0, data, libc::O_WRONLY)).unwrap();
        self.run(self.core.flush(a.ino)).unwrap();
        self.run(self.core.release(a.ino, 0)).unwrap();
        a
    }
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Every item `readdir` gives from `offset`, at most `room` of them.
fn list(m: &Mount, ino: u64, fh: u64, offset: u64, room: usize) -> Result<Vec<(String, u64, u64)>, Errno> {
    let mut out = Vec::new();
    let mut offset = offset;
    loop {
        let before = out.len();
        m.run(m.core.readdir(ino, fh, offset, |i: DirItem<'_>| {
            if out.len() == room {
                return true;
            }
            out.push((i.name.to_string(), i.ino, i.offset));
            false
        }))?;
        // A call hands out part of a listing: go on from the last offset, as the kernel does.
        match out.last() {
            Some(last) if out.len() > before && out.len() < room => offset = last.2,
            _ => return Ok(out),
        }
    }
}

#[test]
fn lookup_create_rename_unlink_and_forget_keep_the_inode_table() {
    let m = Mount::new();
    let d = m.run(m.core.mkdir(&ALICE, ROOT, n("d"), 0o777, 0o022)).unwrap();
    assert_eq!((d.uid, d.gid, d.mode & 0o7777), (1000, 100, 0o755), "owned by the caller, umask applied");
    assert_eq!(m.core.known_path(d.ino).as_deref(), Some("/d"));
    let f = m.file(d.ino, "f", b"x");
    assert_eq!(m.core.known_path(f.ino).as_deref(), Some("/d/f"));
    assert_eq!(m.run(m.core.lookup(&Caller::ROOT, ROOT, n("d"))).unwrap().ino, d.ino);

    m.run(m.core.rename(&Caller::ROOT, d.ino, n("f"), ROOT, n("g"), RenameMode::Replace)).unwrap();
    assert_eq!(m.core.known_path(f.ino).as_deref(), Some("/g"));
    assert_eq!(m.core.known_ino("/d/f"), None);
    assert_eq!(m.run(m.core.lookup(&Caller::ROOT, d.ino, n("f"))).unwrap_err(), Errno::ENOENT);

    let inner = m.file(d.ino, "inner", b"");
    m.run(m.core.rename(&Caller::ROOT, ROOT, n("d"), ROOT, n("e"), RenameMode::Replace)).unwrap();
    assert_eq!(m.core.known_path(d.ino).as_deref(), Some("/e"));
    assert_eq!(m.core.known_path(inner.ino).as_deref(), Some("/e/inner"), "descendants move along");

    m.run(m.core.unlink(&Caller::ROOT, ROOT, n("g"))).unwrap();
    assert_eq!((m.core.known_ino("/g"), m.core.known_path(f.ino)), (None, None));
    assert!(!m.names("/").contains(&"g".to_string()));

    // mkdir and lookup each gave the kernel one reference; forgetting both drops it.
    m.core.forget(d.ino, 2);
    assert_eq!(m.core.known_path(d.ino), None);
    assert_eq!(m.run(m.core.getattr(&Caller::ROOT, d.ino)).unwrap_err(), Errno::ENOENT, "an inode the kernel forgot");
}

#[test]
fn exchange_and_noreplace_renames() {
    let m = Mount::new();
    let a = m.file(ROOT, "a", b"A");
    let b = m.file(ROOT, "b", b"B");
    assert_eq!(
        m.run(m.core.rename(&Caller::ROOT, ROOT, n("a"), ROOT, n("b"), RenameMode::NoReplace)).unwrap_err(),
        Errno::EEXIST
    );
    m.run(m.core.rename(&Caller::ROOT, ROOT, n("a"), ROOT, n("b"), RenameMode::Exchange)).unwrap();
    assert_eq!(m.core.known_path(a.ino).as_deref(), Some("/b"));
    assert_eq!(m.core.known_path(b.ino).as_deref(), Some("/a"));
    assert_eq!(m.run(m.core.read(a.ino, 0, 0, 10)).unwrap(), b"A");
    m.run(m.core.rename(&Caller::ROOT, ROOT, n("a"), ROOT, n("c"), RenameMode::NoReplace)).unwrap();
    assert_eq!(m.core.known_path(b.ino).as_deref(), Some("/c"));
}

#[test]
fn an_open_unlinked_file_lives_until_its_last_release() {
    let m = Mount::new();
    let f = m.run(m.core.create(&ALICE, ROOT, n("tmp"), 0o644, 0, libc::O_CREAT | libc::O_RDWR)).unwrap().0;
    m.run(m.core.open(&ALICE, f.ino, libc::O_RDONLY)).unwrap();
    m.run(m.core.write(f.ino, 0, 0, b"kept", libc::O_RDWR)).unwrap();

    m.run(m.core.unlink(&Caller::ROOT, ROOT, n("tmp"))).unwrap();
    assert_eq!(m.run(m.core.lookup(&Caller::ROOT, ROOT, n("tmp"))).unwrap_err(), Errno::ENOENT);
    assert_eq!(m.names(ORPHANS).len(), 1, "kept under the orphan directory");
    assert!(m.core.known_path(f.ino).unwrap().starts_with(ORPHANS));
    assert_eq!(m.run(m.core.getattr(&Caller::ROOT, f.ino)).unwrap().nlink, 0, "fstat after unlink says 0 links");
    assert_eq!(m.run(m.core.read(f.ino, 0, 0, 100)).unwrap(), b"kept", "gathered bytes written before unlink");
    m.run(m.core.write(f.ino, 0, 4, b", still", libc::O_RDWR)).unwrap();
    assert_eq!(m.run(m.core.read(f.ino, 0, 0, 100)).unwrap(), b"kept, still");

    let fh = m.run(m.core.opendir(&Caller::ROOT, ROOT)).unwrap();
    let listed = list(&m, ROOT, fh, 0, usize::MAX).unwrap();
    assert!(listed.iter().all(|(name, ..)| name != &ORPHANS[1..]), "the orphan directory is hidden: {listed:?}");
    m.core.releasedir(fh);

    m.run(m.core.release(f.ino, 0)).unwrap();
    assert_eq!(m.names(ORPHANS).len(), 1, "one open handle left");
    m.run(m.core.release(f.ino, 0)).unwrap();
    assert!(m.names(ORPHANS).is_empty(), "the last release removes it");
    assert_eq!(m.core.known_path(f.ino), None);
    assert!(!m.core.is_open(f.ino));
}

#[test]
fn a_file_renamed_over_while_open_keeps_its_contents_until_release() {
    let m = Mount::new();
    let old = m.file(ROOT, "target", b"old");
    m.run(m.core.open(&BOB, old.ino, libc::O_RDONLY)).unwrap();
    m.file(ROOT, "new", b"new");
    m.run(m.core.rename(&Caller::ROOT, ROOT, n("new"), ROOT, n("target"), RenameMode::Replace)).unwrap();
    assert_eq!(m.run(m.core.read(old.ino, 0, 0, 10)).unwrap(), b"old");
    assert_eq!(m.rt.block_on(m.other().read("/target", 0, 10)).unwrap(), b"new");
    assert_eq!(m.names(ORPHANS).len(), 1);
    m.run(m.core.release(old.ino, 0)).unwrap();
    assert!(m.names(ORPHANS).is_empty());
}

#[test]
fn o_trunc_empties_the_file_for_the_caller() {
    let m = Mount::new();
    let f = m.file(ROOT, "f", b"data");
    let trunc = libc::O_WRONLY | libc::O_TRUNC;
    assert_eq!(m.run(m.core.open(&BOB, f.ino, trunc)).unwrap_err(), Errno::EACCES, "not writable by others");
    assert_eq!(m.run(m.core.getattr(&Caller::ROOT, f.ino)).unwrap().size, 4, "a refused O_TRUNC truncates nothing");
    let others_write = SetAttr { mode: Some(0o666), ..Default::default() };
    m.run(m.core.setattr(&ALICE, f.ino, others_write, None)).unwrap();
    m.run(m.core.open(&BOB, f.ino, libc::O_WRONLY)).unwrap();
    assert_eq!(m.run(m.core.getattr(&Caller::ROOT, f.ino)).unwrap().size, 4, "no O_TRUNC, no truncation");
    m.run(m.core.release(f.ino, 0)).unwrap();

    m.run(m.core.open(&BOB, f.ino, libc::O_WRONLY | libc::O_TRUNC)).unwrap();
    let a = m.run(m.core.getattr(&Caller::ROOT, f.ino)).unwrap();
    assert_eq!((a.size, a.uid), (0, ALICE.uid), "truncated; the owner is unchanged");
    m.run(m.core.release(f.ino, 0)).unwrap();

    m.run(m.core.write(f.ino, 0, 0, b"again", libc::O_WRONLY)).unwrap();
    m.run(m.core.flush(f.ino)).unwrap();
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    let a = m.run(m.core.create(&BOB, ROOT, n("f"), 0o600, 0, flags)).unwrap().0;
    assert_eq!((a.ino, a.size, a.uid), (f.ino, 0, ALICE.uid), "create of an existing file truncates it");
    m.run(m.core.release(f.ino, 0)).unwrap();

    let mine = m.run(m.core.create(&BOB, ROOT, n("bobs"), 0o640, 0, flags)).unwrap().0;
    assert_eq!((mine.uid, mine.gid, mine.mode & 0o7777), (BOB.uid, BOB.gid, 0o640), "created for the caller");
    assert_eq!(m.run(m.core.create(&BOB, ROOT, n("bobs"), 0o640, 0, flags | libc::O_EXCL)).unwrap_err(), Errno::EEXIST);
}

#[test]
fn writes_are_gathered_until_a_call_must_see_them() {
    let m = Mount::new();
    let f = m.file(ROOT, "f", b"");
    m.run(m.core.open(&ALICE, f.ino, libc::O_WRONLY)).unwrap();
    m.run(m.core.write(f.ino, 0, 0, b"ab", libc::O_WRONLY)).unwrap();
    m.run(m.core.write(f.ino, 0, 2, b"cd", libc::O_WRONLY)).unwrap();
    assert_eq!(m.rt.block_on(m.other().read("/f", 0, 10)).unwrap(), b"", "still gathered");
    let looked_up = m.run(m.core.lookup(&ALICE, ROOT, n("f"))).unwrap();
    assert_eq!(looked_up.size, 4, "a lookup shows the gathered bytes, not the servers' size");
    m.run(m.core.flush(f.ino)).unwrap();
    assert_eq!(m.rt.block_on(m.other().read("/f", 0, 10)).unwrap(), b"abcd", "sent by close");

    m.run(m.core.write(f.ino, 0, 10, b"z", libc::O_WRONLY)).unwrap();
    m.run(m.core.write(f.ino, 0, 0, b"A", libc::O_WRONLY)).unwrap(); // does not continue: sends "z"
                                                                     // ... in the background (write-behind), without waiting for a flush.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while m.rt.block_on(m.other().stat("/f")).unwrap().size != 11 {
        assert!(std::time::Instant::now() < deadline, "the earlier buffer was not sent");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    m.run(m.core.write(f.ino, 0, 0, b"+", libc::O_WRONLY | libc::O_APPEND)).unwrap();
    assert_eq!(m.rt.block_on(m.other().read("/f", 0, 20)).unwrap(), b"Abcd\0\0\0\0\0\0z+", "append sends at once");
    m.run(m.core.release(f.ino, 0)).unwrap();
}

/// A full buffer is sent in the background while the next fills; a send that fails
/// (here: the file was removed by another client meanwhile) fails the file's next flush.
#[test]
fn a_failed_background_write_fails_the_next_flush() {
    let m = Mount::new();
    let f = m.file(ROOT, "f", b"");
    m.run(m.core.open(&ALICE, f.ino, libc::O_WRONLY)).unwrap();
    let block = vec![7u8; 1 << 20];
    let blocks = WRITE_BUFFER / block.len();
    for i in 0..blocks {
        m.run(m.core.write(f.ino, 0, (i * block.len()) as u64, &block, libc::O_WRONLY)).unwrap();
    }
    m.rt.block_on(m.other().unlink("/f")).unwrap();
    // This write does not fit: the full buffer goes out in the background, and fails.
    m.run(m.core.write(f.ino, 0, WRITE_BUFFER as u64, &block, libc::O_WRONLY)).unwrap();
    // A read waits for it (and fails to store the last block) without taking the error
    // the close must report.
    assert!(m.run(m.core.read(f.ino, 0, 0, 10)).is_err());
    assert_eq!(m.run(m.core.flush(f.ino)).unwrap_err(), Errno::ENOENT, "the background send's error");
    m.run(m.core.release(f.ino, 0)).ok();
}

#[test]
fn readdir_and_readdirplus_hand_out_the_opendir_snapshot() {
    let m = Mount::new();
    let d = m.run(m.core.mkdir(&ALICE, ROOT, n("d"), 0o755, 0)).unwrap();
    let inos: Vec<u64> = ["a", "b", "c"].iter().map(|name| m.file(d.ino, name, b"1").ino).collect();
    let fh = m.run(m.core.opendir(&Caller::ROOT, d.ino)).unwrap();
    m.file(d.ino, "late", b"");

    let all = list(&m, d.ino, fh, 0, usize::MAX).unwrap();
    let expected = [(".", d.ino), ("..", ROOT), ("a", inos[0]), ("b", inos[1]), ("c", inos[2])];
    let got: Vec<(&str, u64)> = all.iter().map(|(name, ino, _)| (name.as_str(), *ino)).collect();
    assert_eq!(got, expected, "a snapshot: 'late' came after opendir");
    assert_eq!(all.iter().map(|e| e.2).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    let rest = list(&m, d.ino, fh, 3, 1).unwrap();
    assert_eq!(rest, [("b".to_string(), inos[1], 4)], "continues at an offset, stops when full");

    // readdirplus: attributes, and each entry handed over counts as a lookup.
    let mut plus = Vec::new();
    m.run(m.core.readdirplus(d.ino, fh, 0, |i: DirPlusItem<'_>| {
        plus.push((i.name.to_string(), i.ino, i.attr.size));
        plus.len() == 4 // refuses "b"
    }))
    .unwrap();
    let names: Vec<&str> = plus.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, [".", "..", "a", "b"]);
    assert_eq!((plus[1].1, plus[2].2), (ROOT, 1));
    m.core.forget(inos[0], 2); // create's and readdirplus's references
    assert_eq!(m.core.known_path(inos[0]), None);
    m.core.forget(inos[1], 1); // create's only: the refused entry was not counted
    assert_eq!(m.core.known_path(inos[1]), None);

    m.core.releasedir(fh);
    assert_eq!(list(&m, d.ino, fh, 0, 10).unwrap_err(), Errno::EBADF);
}

#[test]
fn setattr_changes_mode_owner_times_and_size() {
    let m = Mount::new();
    let f = m.file(ROOT, "f", b"");
    m.run(m.core.open(&ALICE, f.ino, libc::O_WRONLY)).unwrap();
    m.run(m.core.write(f.ino, 0, 0, b"0123456789", libc::O_WRONLY)).unwrap();
    let at = Timespec { sec: 1_000_000, nsec: 5 };
    let set = SetAttr {
        mode: Some(0o600),
        uid: Some(3000),
        gid: Some(300),
        atime: Some(TimeSet::At(at)),
        mtime: Some(TimeSet::At(at)),
        size: Some(3),
    };
    assert_eq!(
        m.run(m.core.setattr(&ALICE, f.ino, set.clone(), None)).unwrap_err(),
        Errno::EPERM,
        "only root gives away"
    );
    let a = m.run(m.core.setattr(&Caller::ROOT, f.ino, set, None)).unwrap();
    assert_eq!((a.mode & 0o7777, a.uid, a.gid, a.size), (0o600, 3000, 300, 3));
    assert_eq!((a.atime, a.mtime), (at, at));
    assert_eq!(m.run(m.core.read(f.ino, 0, 0, 10)).unwrap(), b"012", "gathered bytes were sent before the truncation");
    let again = m.run(m.core.getattr(&Caller::ROOT, f.ino)).unwrap();
    assert_eq!((again.mode, again.uid, again.gid, again.size, again.mtime), (a.mode, a.uid, a.gid, a.size, a.mtime));
    m.run(m.core.release(f.ino, 0)).unwrap();
}

#[test]
fn links_nodes_symlinks_and_xattrs() {
    let m = Mount::new();
    let f = m.file(ROOT, "f", b"x");
    let l = m.run(m.core.link(&Caller::ROOT, f.ino, ROOT, n("hard"))).unwrap();
    assert_eq!((l.ino, l.nlink), (f.ino, 2));
    assert_eq!(m.core.known_path(f.ino).as_deref(), Some("/hard"), "the latest name");
    let s = m.run(m.core.symlink(&BOB, ROOT, n("s"), Path::new("f"))).unwrap();
    assert_eq!(s.uid, BOB.uid);
    assert_eq!(m.run(m.core.readlink(&Caller::ROOT, s.ino)).unwrap(), "f");
    let fifo = m.run(m.core.mknod(&ALICE, ROOT, n("p"), libc::S_IFIFO | 0o644, 0, 0)).unwrap();
    assert_eq!(m.core.known_path(fifo.ino).as_deref(), Some("/p"));

    m.run(m.core.setxattr(&Caller::ROOT, f.ino, n("user.k"), b"value", 0)).unwrap();
    assert_eq!(m.run(m.core.getxattr(&Caller::ROOT, f.ino, n("user.k"), 0)).unwrap(), XattrReply::Size(5));
    assert_eq!(
        m.run(m.core.getxattr(&Caller::ROOT, f.ino, n("user.k"), 64)).unwrap(),
        XattrReply::Data(b"value".to_vec())
    );
    assert_eq!(m.run(m.core.getxattr(&Caller::ROOT, f.ino, n("user.k"), 2)).unwrap_err(), Errno::ERANGE);
    assert_eq!(m.run(m.core.listxattr(&Caller::ROOT, f.ino, 64)).unwrap(), XattrReply::Data(b"user.k\0".to_vec()));
    assert_eq!(
        m.run(m.core.setxattr(&Caller::ROOT, f.ino, n("user.k"), b"v", libc::XATTR_CREATE)).unwrap_err(),
        Errno::EEXIST
    );
    m.run(m.core.removexattr(&Caller::ROOT, f.ino, n("user.k"))).unwrap();
    assert_eq!(m.run(m.core.getxattr(&Caller::ROOT, f.ino, n("user.k"), 64)).unwrap_err(), Errno::ENODATA);
    assert_eq!(
        m.run(m.core.getxattr(&Caller::ROOT, f.ino, n("system.posix_acl_access"), 64)).unwrap_err(),
        Errno::ENODATA
    );
    assert!(m.run(m.core.statfs()).unwrap().files >= 1 << 32);
}

#[test]
fn failures_come_back_as_the_right_errno() {
    let m = Mount::new();
    let d = m.run(m.core.mkdir(&ALICE, ROOT, n("d"), 0o755, 0)).unwrap();
    m.file(d.ino, "f", b"");
    assert_eq!(m.run(m.core.lookup(&Caller::ROOT, ROOT, n("missing"))).unwrap_err(), Errno::ENOENT);
    assert_eq!(
        m.run(m.core.lookup(&Caller::ROOT, 987_654_321, n("x"))).unwrap_err(),
        Errno::ENOENT,
        "unknown parent inode"
    );
    assert_eq!(
        m.run(m.core.lookup(&Caller::ROOT, ROOT, OsStr::from_bytes(b"\xff"))).unwrap_err(),
        Errno::EINVAL,
        "not UTF-8"
    );
    assert_eq!(m.run(m.core.mkdir(&ALICE, ROOT, n("d"), 0o755, 0)).unwrap_err(), Errno::EEXIST);
    assert_eq!(m.run(m.core.rmdir(&Caller::ROOT, ROOT, n("d"))).unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(m.run(m.core.unlink(&Caller::ROOT, ROOT, n("missing"))).unwrap_err(), Errno::ENOENT);
    assert_eq!(m.run(m.core.mknod(&ALICE, ROOT, n("x"), libc::S_IFDIR | 0o755, 0, 0)).unwrap_err(), Errno::EINVAL);
    assert_eq!(m.run(m.core.opendir(&Caller::ROOT, 987_654_321)).unwrap_err(), Errno::ENOENT);

    // A server that cannot be reached is EIO to a POSIX program, not a socket error.
    for id in m.cluster.ids() {
        m.rt.block_on(m.cluster.crash(id));
    }
    assert_eq!(m.run(m.core.lookup(&Caller::ROOT, ROOT, n("d"))).unwrap_err(), Errno::EIO);
}

#[test]
fn attribute_changes_after_writing_an_open_file_travel_with_its_close() {
    let m = Mount::new();
    let root = Caller::ROOT;
    let f = m.run(m.core.create(&root, ROOT, n("t"), 0o600, 0, libc::O_CREAT | libc::O_WRONLY)).unwrap().0;
    m.run(m.core.write(f.ino, 0, 0, b"tar data", libc::O_WRONLY)).unwrap();
    let at = Timespec { sec: 1_000_000, nsec: 0 };
    let before = m.core.client().counters().requests;
    // What tar does as root after the data: chown, chmod, utimens, each answered at once.
    let chown = SetAttr { uid: Some(1000), gid: Some(100), ..Default::default() };
    let a = m.run(m.core.setattr(&root, f.ino, chown, None)).unwrap();
    assert_eq!((a.uid, a.gid, a.size), (1000, 100, 8), "the reply counts the gathered bytes");
    m.run(m.core.setattr(&root, f.ino, SetAttr { mode: Some(0o644), ..Default::default() }, None)).unwrap();
    let times = SetAttr { atime: Some(TimeSet::At(at)), mtime: Some(TimeSet::At(at)), ..Default::default() };
    m.run(m.core.setattr(&root, f.ino, times, None)).unwrap();
    let shown = m.run(m.core.getattr(&Caller::ROOT, f.ino)).unwrap();
    assert_eq!((shown.uid, shown.mode & 0o7777, shown.mtime, shown.size), (1000, 0o644, at, 8));
    assert_eq!(m.core.client().counters().requests, before, "nothing sent before the flush");
    let server = m.rt.block_on(m.other().lstat("/t")).unwrap();
    assert_eq!((server.uid, server.size), (0, 0), "another client sees the file as last closed");

    m.run(m.core.flush(f.ino)).unwrap();
    assert_eq!(m.core.client().counters().requests - before, 2, "the data and one merged change");
    let server = m.rt.block_on(m.other().lstat("/t")).unwrap();
    assert_eq!((server.uid, server.gid, server.mode & 0o7777, server.size), (1000, 100, 0o644, 8));
    assert_eq!(server.mtime, at, "the explicit time wins over the write's, as it came after it");
    m.run(m.core.release(f.ino, 0)).unwrap();

    // A change the servers may refuse is sent at once, so its caller gets the error.
    let g = m.run(m.core.create(&ALICE, ROOT, n("u"), 0o644, 0, libc::O_CREAT | libc::O_WRONLY)).unwrap().0;
    let before = m.core.client().counters().requests;
    let chown = SetAttr { uid: Some(2000), ..Default::default() };
    let _ = m.run(m.core.setattr(&ALICE, g.ino, chown, None));
    assert!(m.core.client().counters().requests > before, "a user's chown is not held back");
    m.run(m.core.release(g.ino, 0)).unwrap();
}

#[test]
fn the_control_file_counts_operations_and_their_server_requests() {
    let m = Mount::new();
    let r = m.run(m.core.counted("lookup", m.core.lookup(&Caller::ROOT, ROOT, n("missing"))));
    assert_eq!(r.unwrap_err(), Errno::ENOENT);
    let d = m.run(m.core.counted("mkdir", m.core.mkdir(&ALICE, ROOT, n("d"), 0o755, 0))).unwrap();
    let stats = m.core.op_stats();
    let lookup = stats.iter().find(|s| s.op == "lookup").unwrap();
    assert_eq!((lookup.calls, lookup.errors), (1, 1));
    assert!(lookup.requests >= 1, "a lookup asks a server");
    assert!(stats.iter().any(|s| s.op == "mkdir" && s.calls == 1 && s.requests >= 1));
    let control = m.run(m.core.lookup(&Caller::ROOT, ROOT, n(STATS_FILE))).unwrap();
    assert_eq!(control.ino, STATS_INO);
    let fh = m.run(m.core.open(&ALICE, STATS_INO, libc::O_RDONLY)).unwrap().fh;
    let text = String::from_utf8(m.run(m.core.read(STATS_INO, fh, 0, 1 << 16)).unwrap()).unwrap();
    assert!(text.lines().any(|l| l.starts_with("mkdir ")), "{text}");
    m.run(m.core.release(STATS_INO, fh)).unwrap();
    assert_eq!(m.run(m.core.open(&ALICE, STATS_INO, libc::O_WRONLY)).unwrap_err(), Errno::EACCES);
    assert_eq!(m.run(m.core.unlink(&Caller::ROOT, ROOT, n(STATS_FILE))).unwrap_err(), Errno::EPERM);
    let fh = m.run(m.core.opendir(&Caller::ROOT, ROOT)).unwrap();
    let names: Vec<String> = list(&m, ROOT, fh, 0, usize::MAX).unwrap().into_iter().map(|e| e.0).collect();
    assert_eq!(names, [".", "..", "d"], "the control file is not listed");
    let _ = d;
}

/// Reads, writes, truncations and flushes of an open file go to the servers as the
/// caller that opened the handle, whoever the kernel names later: a file its creator made
/// read-only stays writable through the creating handle, and bytes written through a
/// handle whose opener may not write the file are refused at the flush, not stored as the
/// mount's owner.
#[test]
fn io_through_a_handle_is_the_openers() {
    let m = Mount::new();
    let flags = libc::O_CREAT | libc::O_RDWR;
    let (ro, fh) = m.run(m.core.create(&ALICE, ROOT, n("ro"), 0o444, 0, flags)).unwrap();
    m.run(m.core.write(ro.ino, fh, 0, b"mine", libc::O_RDWR)).unwrap();
    m.run(m.core.flush(ro.ino)).unwrap();
    assert_eq!(m.run(m.core.read(ro.ino, fh, 0, 10)).unwrap(), b"mine", "the owner reads through its handle");
    let shrink = SetAttr { size: Some(2), ..Default::default() };
    m.run(m.core.setattr(&Caller::ROOT, ro.ino, shrink.clone(), Some(fh))).expect("ftruncate through the handle");
    m.run(m.core.release(ro.ino, fh)).unwrap();
    let a = m.rt.block_on(m.other().stat("/ro")).unwrap();
    assert_eq!((a.size, a.uid, a.mode & 0o7777), (2, ALICE.uid, 0o444));
    assert_eq!(
        m.run(m.core.setattr(&ALICE, ro.ino, shrink, None)).unwrap_err(),
        Errno::EACCES,
        "truncate(2) by path still needs write permission"
    );

    // BOB's file, which ALICE may read but not write: a handle ALICE opened for reading
    // that the kernel (wrongly) writes through must not write as the mount's owner.
    let (bobs, bob_fh) = m.run(m.core.create(&BOB, ROOT, n("bobs"), 0o644, 0, flags)).unwrap();
    m.run(m.core.release(bobs.ino, bob_fh)).unwrap();
    let alice_fh = m.run(m.core.open(&ALICE, bobs.ino, libc::O_RDONLY)).unwrap().fh;
    m.run(m.core.write(bobs.ino, alice_fh, 0, b"forged", libc::O_RDWR)).unwrap();
    assert_eq!(m.run(m.core.flush(bobs.ino)).unwrap_err(), Errno::EACCES, "sent as ALICE, refused");
    m.run(m.core.release(bobs.ino, alice_fh)).ok();
    assert_eq!(m.rt.block_on(m.other().stat("/bobs")).unwrap().size, 0, "nothing stored");
}

/// Lookups answered from the attributes fetched for an open listing (`ls -l`) follow this
/// mount's own renames and unlinks at once, not after the attribute TTL.
#[test]
fn lookups_from_an_open_listing_follow_this_mounts_changes() {
    let m = Mount::new();
    let d = m.run(m.core.mkdir(&ALICE, ROOT, n("d"), 0o755, 0)).unwrap();
    let a = m.file(d.ino, "a", b"1");
    let b = m.file(d.ino, "b", b"22");
    let c = m.file(d.ino, "c", b"333");
    let fh = m.run(m.core.opendir(&ALICE, d.ino)).unwrap();
    // The first lookup fetches the attributes of the window's entries.
    assert_eq!(m.run(m.core.lookup(&ALICE, d.ino, n("a"))).unwrap().ino, a.ino);
    m.run(m.core.rename(&ALICE, d.ino, n("a"), d.ino, n("b"), RenameMode::Replace)).unwrap();
    assert_eq!(m.run(m.core.lookup(&ALICE, d.ino, n("a"))).unwrap_err(), Errno::ENOENT);
    assert_eq!(m.run(m.core.lookup(&ALICE, d.ino, n("b"))).unwrap().ino, a.ino, "b is a's inode now");
    assert_ne!(b.ino, a.ino);
    assert_eq!(m.run(m.core.lookup(&ALICE, d.ino, n("c"))).unwrap().ino, c.ino);
    m.run(m.core.unlink(&ALICE, d.ino, n("c"))).unwrap();
    assert_eq!(m.run(m.core.lookup(&ALICE, d.ino, n("c"))).unwrap_err(), Errno::ENOENT);
    m.core.releasedir(fh);
}
