//! Paged readdir stays correct while other clients insert: every entry that exists for the
//! whole listing is returned exactly once, in name order, and nothing twice.

mod common;

use common::ProcCluster;
use std::collections::HashSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_readdir_is_stable_under_concurrent_inserts() {
    let cluster = ProcCluster::start(4);
    let c = cluster.client();
    c.mkdir("/big", 0o755).await.unwrap();
    for i in 0..1500 {
        c.create(&format!("/big/old{i:05}"), 0o644, true).await.unwrap();
    }
    let writer = {
        let c = cluster.client();
        tokio::spawn(async move {
            for i in 0..1500 {
                // Names that sort before, between and after the existing ones.
                let name = match i % 3 {
                    0 => format!("/big/a{i}"),
                    1 => format!("/big/old{:05}x", i),
                    _ => format!("/big/z{i}"),
                };
                c.create(&name, 0o644, true).await.unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = c.readdir_page("/big", after.take(), 50).await.unwrap();
        after = page.entries.last().map(|e| e.name.clone());
        seen.extend(page.entries.into_iter().map(|e| e.name));
        if !page.more {
            break;
        }
    }
    writer.await.unwrap();
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "an entry was returned twice");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "not in name order");
    for i in 0..1500 {
        assert!(unique.contains(&format!("old{i:05}")), "old{i:05} missing");
    }
    assert_eq!(c.readdir("/big").await.unwrap().len(), 3000);
    assert_eq!(c.lstat("/big").await.unwrap().size, 3000);
}
