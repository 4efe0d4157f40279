//! Hard links through the namespace: `link` and `unlink` of a link entry, each one
//! transaction over the entry's server and the shared inode's home (see `links` for the
//! shared inodes themselves).

use super::Namespace;
use crate::engine::call::Call;
use crate::engine::errors::{err, split_entry, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::perm;
use crate::twopc::{add_part, still_distributing, Parts, Plan, DISTRIBUTING_WAIT};
use plusfs_proto::DistributionWait;
use plusfs_proto::{Errno, FileKind, Inode, Replace, Reply, ServerId, SubOp};
use std::sync::Arc;

impl Namespace {
    /// `link`, on the server of `src`'s entry: a new entry `dst` for the same inode.
    pub(crate) async fn link(self: &Arc<Self>, src: &str, dst: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let (sdir, _) = split_entry(src)?;
        let (ddir, dname) = split_entry(dst)?;
        // A source in a distributed directory the client did not address by its shard: the
        // redirect is the client's to follow (the loop below follows the destination's).
        self.engine.host(sdir, via)?;
        // The new entry goes to the home of `ddir`, or where its distribution says.
        let mut at = (self.engine.map().home_of_dir(ddir), None);
        let mut waiting = DistributionWait::new(DISTRIBUTING_WAIT);
        let mut changes = 0;
        while changes < 3 {
            changes += 1;
            match self.twopc.retrying(|plan| self.link_once(plan, src, dst, via, at, c)).await {
                // Being distributed: its storing servers may not hold their shards yet.
                Err(OpError::Redirect(info) | OpError::Distributing(info))
                    if info.path == ddir && info.state == plusfs_proto::DistState::Distributing =>
                {
                    if !waiting.wait().await {
                        return Err(still_distributing(ddir));
                    }
                    changes -= 1;
                }
                Err(OpError::Redirect(info) | OpError::Distributing(info)) if info.path == ddir => {
                    at = (info.server_of(dname), Some(info.incarnation));
                }
                r => return r,
            }
        }
        Err(OpError::Conflict(format!("the distribution of '{ddir}' keeps changing")))
    }

    /// One attempt of `link` with the new entry on `at` (server, shard incarnation).
    async fn link_once(
        self: &Arc<Self>,
        plan: Plan,
        src: &str,
        dst: &str,
        via: Via,
        at: (ServerId, Option<u64>),
        c: &Call,
    ) -> OpResult<Reply> {
        let (sdir, sname) = split_entry(src)?;
        let (ddir, dname) = split_entry(dst)?;
        let host = self.engine.host(sdir, via)?.obj;
        perm::check_search(c, &host, sdir)?;
        let e = self.engine.entry(&host, src, sname)?;
        if e.kind == FileKind::Dir {
            return Err(err(Errno::EPERM, format!("'{src}' is a directory; directories cannot be hard-linked")));
        }
        let (home, grow) = match e.link_home {
            None => (
                self.engine.id(),
                SubOp::ShareInode { dir: sdir.into(), name: sname.into(), ino: e.ino, shard: via.shard() },
            ),
            Some(home) => (self.links.home_now(home, e.ino).await?, SubOp::AdjustLinks { ino: e.ino, delta: 1 }),
        };
        let mut parts = Parts::new();
        add_part(&mut parts, home, grow);
        let inode = Inode::link(e.ino, e.kind, home);
        let insert =
            SubOp::InsertEntry { dir: ddir.into(), name: dname.into(), inode, replace: Replace::Never, shard: at.1 };
        add_part(&mut parts, at.0, insert);
        self.twopc.run(plan, parts, c).await?;
        Ok(Reply::Done)
    }

    /// `unlink` of a link entry: the entry goes and the shared inode loses a link, in one
    /// transaction.
    pub(crate) async fn unlink_link(self: &Arc<Self>, p: &str, e: &Inode, via: Via, c: &Call) -> OpResult<Reply> {
        let (dir, name) = split_entry(p)?;
        let named = e.link_home.expect("a link entry");
        // Recorded with the commit decision (see `TwoPhase::rename`).
        c.answer_at_commit(&Ok(Reply::Done));
        let attempt = |plan| async move {
            // A drained home names the heir it moved the inode to (asked again after a
            // conflict: it may have moved meanwhile).
            let home = self.links.home_now(named, e.ino).await?;
            let mut parts = Parts::new();
            let remove = SubOp::RemoveEntry { dir: dir.into(), name: name.into(), ino: e.ino, shard: via.shard() };
            add_part(&mut parts, self.engine.id(), remove);
            add_part(&mut parts, home, SubOp::AdjustLinks { ino: e.ino, delta: -1 });
            self.twopc.run(plan, parts, c).await.map(|_| Reply::Done)
        };
        self.twopc.retrying(attempt).await
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::attrs::NewNode;
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{FileKind, Reply};

    async fn nlink(kit: &Kit, p: &str) -> u32 {
        match kit.osd.namespace.stat(p, Via::Home, &root()).await.unwrap() {
            Reply::Attr(a) => a.nlink,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_link_shares_the_inode_and_an_unlink_drops_one_name() {
        let kit = Kit::new().await;
        let (ns, c) = (&kit.osd.namespace, root());
        let node = NewNode { target: None, rdev: 0, access: 0 };
        ns.create("/a", FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c).await.unwrap();
        ns.link("/a", "/b", Via::Home, &c).await.unwrap();
        assert_eq!((nlink(&kit, "/a").await, nlink(&kit, "/b").await), (2, 2));
        ns.unlink("/a", Via::Home, &c).await.unwrap();
        let kit = kit.crash_and_restart().await;
        assert_eq!(nlink(&kit, "/b").await, 1, "the count equals the names left");
        assert_eq!(kit.osd.engine.dir_object("/").unwrap().entries, 1);
    }

    #[tokio::test]
    async fn a_link_in_a_directory_of_another_server_shares_one_inode_homed_once() {
        let mesh = crate::testkit::Mesh::new(2).await;
        let (r, c) = (mesh.home("/"), root());
        let d = format!("/{}", mesh.name_away_from_root("d"));
        let (rs, ds) = (mesh.server(r), mesh.server(mesh.home(&d)));
        let plan = crate::twopc::Plan::now(&rs.engine);
        rs.twopc.mkdir(plan, &d, 0o755, (0, 0), (plusfs_proto::Threshold::Cluster, 0), Via::Home, &c).await.unwrap();
        let node = NewNode { target: None, rdev: 0, access: 0 };
        rs.namespace.create("/f", FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c).await.unwrap();
        let g = format!("{d}/g");
        rs.namespace.link("/f", &g, Via::Home, &c).await.unwrap();
        let nlink = |s: &std::sync::Arc<crate::osd::Osd>, p: String| {
            let s = s.clone();
            async move {
                match s.namespace.stat(&p, Via::Home, &root()).await.unwrap() {
                    Reply::Attr(a) => (a.ino, a.nlink),
                    other => panic!("{other:?}"),
                }
            }
        };
        let (ino_f, n_f) = nlink(rs, "/f".into()).await;
        let (ino_g, n_g) = nlink(ds, g.clone()).await;
        assert_eq!((ino_f, n_f), (ino_g, n_g), "both names, on two servers, are one inode with two links");
        assert_eq!(n_f, 2);
        // The inode is kept once, at one home; both entries name that home.
        let homes = [rs, ds].iter().filter(|s| s.engine.store().get_inode(ino_f).unwrap().is_some()).count();
        assert_eq!(homes, 1, "the shared inode has exactly one home");
        rs.namespace.unlink("/f", Via::Home, &c).await.unwrap();
        assert_eq!(nlink(ds, g.clone()).await, (ino_f, 1), "the other server's name keeps the file");
        ds.namespace.unlink(&g, Via::Home, &c).await.unwrap();
        for s in [rs, ds] {
            assert!(s.engine.store().get_inode(ino_f).unwrap().is_none(), "the last unlink frees the inode");
            assert_eq!(s.engine.locks().tx_count(), 0);
        }
    }
}
