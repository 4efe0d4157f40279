//! Serial execution (OrangeFS, seed 004 Fig. 1(b)): a server applies the sub-operations
//! it is sent at once and returns their undo, which the client sends back as the CLEAR
//! if the other server fails. Also the path of a two-server operation whose halves land
//! on one server.

use crate::dirperms::DirPerms;
use crate::engine::call::Call;
use crate::engine::errors::{err, OpResult};
use crate::engine::Engine;
use crate::filedata::FileData;
use plusfs_proto::{CommitPayload, Errno, Reply, SubOp};
use std::sync::Arc;

/// The serial protocol's server side.
pub(crate) struct Serial {
    engine: Arc<Engine>,
    dirperms: Arc<DirPerms>,
    filedata: Arc<FileData>,
}

impl Serial {
    pub(crate) fn new(engine: Arc<Engine>, dirperms: Arc<DirPerms>, filedata: Arc<FileData>) -> Serial {
        Serial { engine, dirperms, filedata }
    }
}

impl Serial {
    /// `SubExec`: applies `ops` here at once (serial protocol and its CLEAR) and returns
    /// the sub-operations that take them back.
    pub(crate) async fn sub_exec(self: &Arc<Self>, mut ops: Vec<SubOp>, c: &Call) -> OpResult<Reply> {
        self.dirperms.fill_new_dirs(&mut ops, c, crate::dirperms::PARENT_WAIT, false, None).await?;
        let txid = self.engine.new_txid().await?;
        let (guard, prepared) = self.engine.check_subops(txid, &ops, true, &mut Vec::new(), c).await?;
        let undo = self.undo_of(&ops)?;
        let made = ops.iter().find_map(|o| match o {
            SubOp::CreateDir { object, .. } => Some(plusfs_proto::Attr::of_dir(object)),
            _ => None,
        });
        let answer = Reply::Undo { ops: undo, made };
        let (batch, remote) = self.engine.commit_batch(&prepared, &CommitPayload::default())?;
        // Its one batch: a resend after a failover gets this answer.
        c.answer_with_next_batch(&Ok(answer.clone()));
        self.engine.apply_for(c, batch).await?;
        drop(guard);
        self.filedata.drop_remote(remote).await;
        self.engine.check_thresholds(&prepared.ops);
        Ok(answer)
    }

    /// Sub-operations undoing `ops` (checked, not yet applied): the CLEAR of serial
    /// execution.
    fn undo_of(self: &Arc<Self>, ops: &[SubOp]) -> OpResult<Vec<SubOp>> {
        let mut undo = Vec::new();
        for op in ops.iter().rev() {
            undo.push(match op {
                SubOp::CreateDir { path, object } => {
                    SubOp::RemoveDir { path: path.clone(), ino: object.ino, shards: vec![] }
                }
                SubOp::RemoveDir { path, .. } => {
                    SubOp::CreateDir { path: path.clone(), object: self.engine.dir_object(path)? }
                }
                SubOp::InsertEntry { dir, name, inode, replace: plusfs_proto::Replace::Never, shard } => {
                    SubOp::RemoveEntry { dir: dir.clone(), name: name.clone(), ino: inode.ino, shard: *shard }
                }
                SubOp::RemoveEntry { dir, name, shard, .. } => {
                    let host = self
                        .engine
                        .host(dir, shard.map_or(crate::engine::host::Via::Home, crate::engine::host::Via::Shard))?;
                    let p = plusfs_proto::path::join(dir, name);
                    let inode = self.engine.entry(&host.obj, &p, name)?;
                    SubOp::InsertEntry {
                        dir: dir.clone(),
                        name: name.clone(),
                        inode,
                        replace: plusfs_proto::Replace::Never,
                        shard: *shard,
                    }
                }
                other => {
                    return Err(err(Errno::EINVAL, format!("{other:?} cannot be executed serially")));
                }
            });
        }
        Ok(undo)
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::{root, Kit};
    use plusfs_proto::{FileKind, Inode, Replace, Reply, SubOp};

    #[tokio::test]
    async fn a_sub_exec_applies_at_once_and_its_undo_takes_it_back() {
        let kit = Kit::new().await;
        let inode = Inode::new(4242, FileKind::File, 0o644, 0, 0);
        let insert =
            SubOp::InsertEntry { dir: "/".into(), name: "s".into(), inode, replace: Replace::Never, shard: None };
        let Reply::Undo { ops, .. } = kit.osd.serial.sub_exec(vec![insert], &root()).await.unwrap() else {
            panic!("an undo")
        };
        let root_dir = kit.osd.engine.dir_object("/").unwrap();
        assert_eq!(root_dir.entries, 1, "applied at once, no log");
        kit.osd.serial.sub_exec(ops, &root()).await.unwrap();
        assert_eq!(kit.osd.engine.dir_object("/").unwrap().entries, 0, "the undo took it back");
        assert!(kit.osd.engine.store().get_entry(root_dir.ino, "s").unwrap().is_none());
    }
}
