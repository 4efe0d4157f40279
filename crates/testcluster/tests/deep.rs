//! Trees deeper than `PATH_MAX`: every call limits the path it is given (4096 bytes), not
//! the depth of the tree, as on ext4. Walked with short relative paths from a working
//! directory (`Client::chdir`), on an in-process cluster of several servers so that the
//! directory objects of the deep levels live on different servers.

use plusfs_proto::path::MAX_PATH_LEN;
use plusfs_proto::{Errno, FileKind};
use plusfs_testcluster::{Options, TestCluster};

/// A component of 100 bytes: 50 levels make a path of 5,050 bytes.
fn level(i: usize) -> String {
    format!("{i:03}{}", "d".repeat(97))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_deeper_than_path_max_is_walked_with_relative_paths() {
    let cluster = TestCluster::start(Options { servers: 3, ..Options::default() }).await.expect("cluster starts");
    let mut c = cluster.client();
    for i in 0..50 {
        c.mkdir(&level(i), 0o755).await.unwrap_or_else(|e| panic!("mkdir at level {i}: {e}"));
        c = c.chdir(&level(i)).await.unwrap();
    }
    let deep = c.cwd().to_string();
    assert!(deep.len() > 5000, "the working directory is {} bytes from the root", deep.len());

    // Files, links, renames and listings with short relative paths at the bottom.
    c.create("f", 0o644, true).await.unwrap();
    c.write("f", 0, b"deep data").await.unwrap();
    assert_eq!(c.read("f", 0, 100).await.unwrap(), b"deep data");
    c.symlink("f", "s").await.unwrap();
    assert_eq!(c.stat("s").await.unwrap().size, 9, "a relative symlink resolves at depth");
    c.link("f", "h").await.unwrap();
    c.rename("h", "../h2").await.unwrap();
    let names: Vec<String> = c.readdir(".").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["f", "s"]);
    let up = c.chdir("..").await.unwrap();
    assert_eq!(up.lstat("h2").await.unwrap().nlink, 2);
    assert_eq!(up.lstat(&level(49)).await.unwrap().kind, FileKind::Dir);

    // The same files under their absolute path: longer than PATH_MAX, refused as given...
    let abs = format!("{deep}/f");
    assert_eq!(c.lstat(&abs).await.unwrap_err().errno, Errno::ENAMETOOLONG);
    let long_relative = "./".repeat(MAX_PATH_LEN / 2 + 1) + "f";
    assert_eq!(c.lstat(&long_relative).await.unwrap_err().errno, Errno::ENAMETOOLONG);
    // ...and served to a caller that may give long paths (a FUSE mount).
    let unlimited = cluster.client().with_path_max(plusfs_proto::path::MAX_TREE_PATH_LEN);
    assert_eq!(unlimited.read(&abs, 0, 4).await.unwrap(), b"deep");

    // A directory rename moves the deep levels along; the walk still works below it.
    let top = cluster.client();
    top.rename(&format!("/{}", level(0)), "/moved").await.unwrap();
    let mut w = top.chdir("/moved").await.unwrap();
    for i in 1..50 {
        w = w.chdir(&level(i)).await.unwrap_or_else(|e| panic!("chdir at level {i} after the move: {e}"));
    }
    assert_eq!(w.read("f", 0, 100).await.unwrap(), b"deep data");
    assert_eq!(w.chdir("f").await.err().map(|e| e.errno), Some(Errno::ENOTDIR));
}
