//! Shared inodes (hard links) as stored state: the inode an entry request acts on, and the
//! check and application of the link sub-operations.

use super::errors::{eio, err, OpResult};
use super::host::Via;
use super::locks::{Guard, Scope};
use super::Engine;
use crate::engine::errors::OpError;
use plusfs_proto::{Errno, Ino, Inode, ServerId};
use plusfs_store::Batch;

/// Most links a file may have (EMLINK beyond), as ext4.
pub const MAX_LINKS: u32 = 65_000;

/// Where the inode an entry request acts on is stored here.
pub(crate) enum Slot {
    /// Embedded in entry `name` of the directory with inode `dir`.
    Entry { dir: Ino, name: String },
    /// A shared inode object.
    Shared,
}

/// The inode an entry request acts on, with the busy lock taken for a change.
pub(crate) struct Target {
    pub inode: Inode,
    pub slot: Slot,
    pub(crate) _guard: Option<Guard>,
}

impl Target {
    /// Adds the write of the (changed) inode to `b`.
    pub(crate) fn save(&self, b: &mut Batch) {
        match &self.slot {
            Slot::Entry { dir, name } => b.put_entry(*dir, name, &self.inode),
            Slot::Shared => b.put_inode(&self.inode),
        }
    }
}

/// The busy-lock key of shared inode `ino` (not a path, so no directory lock covers it).
pub(crate) fn inode_lock(ino: Ino) -> (String, Scope) {
    (format!("#inode/{ino}"), Scope::Whole)
}

impl Engine {
    /// Checks a `ShareInode` sub-operation.
    pub(crate) fn check_share(&self, dir: &str, name: &str, ino: Ino, shard: Option<u64>) -> OpResult<()> {
        let p = plusfs_proto::path::join(dir, name);
        let e = self.entry(&self.host(dir, shard.map_or(Via::Home, Via::Shard))?.obj, &p, name)?;
        match e.link_home {
            _ if e.ino != ino => Err(OpError::Conflict(format!("'{p}' changed during the operation"))),
            Some(_) => Err(OpError::Conflict(format!("'{p}' was linked during the operation"))),
            None => Ok(()),
        }
    }

    /// `InodeHome`: where shared inode `ino` is, asked of the server its links name: here,
    /// or the heir this drained server moved it to.
    pub(crate) fn inode_home(&self, ino: Ino) -> OpResult<ServerId> {
        if self.store.get_inode(ino).map_err(eio)?.is_some() {
            return Ok(self.id);
        }
        match self.moved_inode(ino)? {
            Some(heir) => Ok(heir),
            None => Err(err(Errno::ENOENT, format!("inode {ino} is not on server {}", self.id))),
        }
    }

    /// The heir this server moved shared inode `ino` to (kept until every link names the
    /// heir; an heir drops its own old record of an inode that comes back to it, so the
    /// records never send a request round in a circle).
    pub(crate) fn moved_inode(&self, ino: Ino) -> OpResult<Option<ServerId>> {
        Ok(self.log_get::<super::logrec::InodeMoved>(ino)?.map(|m| m.to))
    }

    /// Checks an `AdjustLinks` sub-operation.
    pub(crate) fn check_adjust(&self, ino: Ino, delta: i32) -> OpResult<()> {
        let inode = self.store.get_inode(ino).map_err(eio)?;
        match inode {
            // Moved off this drained server: the transaction is planned again with its heir.
            None if self.moved_inode(ino)?.is_some() => {
                Err(OpError::Conflict(format!("inode {ino} moved to another server")))
            }
            None => Err(err(Errno::ENOENT, format!("inode {ino} has no links left"))),
            Some(i) if delta > 0 && i.nlink.saturating_add(delta as u32) > MAX_LINKS => {
                Err(err(Errno::EMLINK, format!("inode {ino} has {} links already", i.nlink)))
            }
            Some(_) => Ok(()),
        }
    }

    /// Applies a prepared `ShareInode` to `b` (the entry was checked and is locked).
    pub(crate) fn commit_share(&self, dir: &str, name: &str, shard: Option<u64>, b: &mut Batch) -> OpResult<()> {
        let p = plusfs_proto::path::join(dir, name);
        let d = self.host(dir, shard.map_or(Via::Home, Via::Shard))?.obj;
        let mut inode = self.entry(&d, &p, name)?;
        if inode.link_home.is_some() {
            return Ok(()); // applied already (a re-sent decision)
        }
        b.put_entry(d.ino, name, &Inode::link(inode.ino, inode.kind, self.id));
        inode.nlink += 1;
        inode.ctime = plusfs_proto::Timespec::now();
        b.put_inode(&inode);
        Ok(())
    }

    /// Applies a prepared `AdjustLinks` to `b`; returns the other servers' records of an
    /// inode that lost its last link, to drop once `b` is written.
    pub(crate) fn commit_adjust(&self, ino: Ino, delta: i32, b: &mut Batch) -> OpResult<Vec<(ServerId, u64)>> {
        let Some(mut inode) = self.store.get_inode(ino).map_err(eio)? else {
            return Ok(Vec::new());
        };
        inode.nlink = inode.nlink.saturating_add_signed(delta);
        inode.ctime = plusfs_proto::Timespec::now();
        if inode.nlink > 0 {
            b.put_inode(&inode);
            return Ok(Vec::new());
        }
        b.del_inode(ino);
        self.drop_unused(&plusfs_proto::filedata::records(&inode.pieces), &Default::default(), b)
    }
}
