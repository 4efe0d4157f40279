//! Which object holds a directory's entries on this server: its home object, or this
//! server's shard of a distributed (huge) directory.

use super::errors::{eio, err, OpResult};
use super::Engine;
use crate::engine::errors::OpError;
use plusfs_proto::{DirObject, DistInfo, DistState, Errno, Threshold};
use plusfs_store::Batch;

/// Where an entry request was addressed: the directory's home (Eq. 1) or this server's
/// shard of a distributed directory (Eq. 2, with the incarnation the client cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Home,
    Shard(u64),
    /// Forwarded by an entry's server to the home of its shared inode (`links.rs`).
    Inode(plusfs_proto::Ino),
}

impl Via {
    /// The incarnation a sub-operation must find in the shard (`None`: the home object).
    pub(crate) fn shard(self) -> Option<u64> {
        match self {
            Via::Home | Via::Inode(_) => None,
            Via::Shard(i) => Some(i),
        }
    }
}

/// The object that holds a directory's entries on this server.
pub(crate) struct Host {
    pub obj: DirObject,
    pub shard: bool,
}

impl Host {
    /// Adds the write of the (changed) object to `b`.
    pub(crate) fn save(&self, b: &mut Batch, path: &str) {
        if self.shard {
            b.put_shard(path, &self.obj);
        } else {
            b.put_dir(path, &self.obj);
        }
    }
}

impl Engine {
    /// Directories homed here that `ops` made huge: their redistribution is asked for (it
    /// runs in the background).
    pub(crate) fn check_thresholds(&self, ops: &[plusfs_proto::SubOp]) {
        for op in ops {
            if let plusfs_proto::SubOp::InsertEntry { dir, shard: None, .. } = op {
                if self.store.get_dir(dir).ok().flatten().is_some_and(|d| self.over_threshold(&d)) {
                    self.want_distribution(dir);
                }
            }
        }
    }

    /// The object holding the entries of `dir` here, as addressed by `via`. A request to
    /// the home of a distributed directory gets a redirect with the distribution; a request
    /// to a shard this server does not hold gets "missing directory", and one carrying
    /// another incarnation ESTALE (the two staleness cases of seed 001 §IV.C).
    pub(crate) fn host(&self, dir: &str, via: Via) -> OpResult<Host> {
        match via {
            Via::Home => {
                let obj = self.dir_object(dir)?;
                match obj.dist.state {
                    DistState::Nondistributed => Ok(Host { obj, shard: false }),
                    DistState::Distributed => Err(OpError::Redirect(Box::new(self.dist_info(dir, &obj)))),
                    DistState::Distributing => {
                        self.want_distribution(dir);
                        Err(OpError::Redirect(Box::new(self.dist_info(dir, &obj))))
                    }
                }
            }
            Via::Shard(incarnation) => {
                let Some(obj) = self.store.get_shard(dir).map_err(eio)? else {
                    return Err(self
                        .moved_shard(dir, incarnation)?
                        .unwrap_or_else(|| OpError::MissingDir(dir.to_string())));
                };
                if obj.incarnation != incarnation {
                    return Err(err(
                        Errno::ESTALE,
                        format!("'{dir}' was re-created (incarnation {} here, {incarnation} cached)", obj.incarnation),
                    ));
                }
                Ok(Host { obj, shard: true })
            }
            Via::Inode(ino) => Err(err(Errno::EINVAL, format!("'{dir}': only file requests apply to inode {ino}"))),
        }
    }

    /// For a shard of `dir` (of `incarnation`) that this server handed to another storing
    /// server: the redirect to the storing set after the move.
    fn moved_shard(&self, dir: &str, incarnation: u64) -> OpResult<Option<OpError>> {
        use super::logrec::{MoveStage, ShardMove};
        let rec = self.log_get::<ShardMove>(plusfs_placement::path_hash(dir))?;
        Ok(rec
            .filter(|r| {
                r.path == dir && r.incarnation == incarnation && matches!(r.stage, MoveStage::Out(_) | MoveStage::Gone)
            })
            .map(|r| {
                OpError::Redirect(Box::new(DistInfo {
                    path: dir.to_string(),
                    ino: r.ino,
                    incarnation,
                    state: DistState::Distributed,
                    set: r.set,
                }))
            }))
    }

    /// What clients need to route to the entries of `dir` (a primary or shard object).
    pub(crate) fn dist_info(&self, dir: &str, d: &DirObject) -> DistInfo {
        DistInfo {
            path: dir.to_string(),
            ino: d.ino,
            incarnation: d.incarnation,
            state: d.dist.state,
            set: d.dist.set.clone(),
        }
    }

    /// A sub-operation that would remove, move or re-ancestry the directory `dir` (object
    /// `d`) or change its entries while it is being distributed: EBUSY carrying the
    /// `Distributing` distribution, so that coordinators and clients wait for its end and
    /// try again, as for a redirect, instead of counting a lost race.
    pub(crate) fn being_distributed(&self, dir: &str, d: &DirObject) -> OpError {
        OpError::Distributing(Box::new(self.dist_info(dir, d)))
    }

    /// The cluster's threshold (`[hugedirs] threshold`).
    pub(crate) fn cluster_threshold(&self) -> Threshold {
        match self.map().hugedirs.threshold_entries() {
            Some(n) => Threshold::Entries(n),
            None => Threshold::Never,
        }
    }

    /// True when the nondistributed directory `d` should be distributed now.
    pub(crate) fn over_threshold(&self, d: &DirObject) -> bool {
        d.dist.state == DistState::Nondistributed
            && match d.dist.threshold.resolve(self.cluster_threshold()) {
                Threshold::Entries(0) => true,
                Threshold::Entries(n) => d.entries > n,
                Threshold::Never | Threshold::Cluster => false,
            }
    }
}
