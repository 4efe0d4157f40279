//! Which server a request belongs to under the newest map, and what happens to one that
//! reached another: forwarded (requests about a directory), refused with EBUSY
//! (sub-operations of cross-server operations, whose coordinator plans again), or served
//! after the directories it touches were pulled here.

use super::Migration;
use crate::engine::errors::{err, OpError, OpResult};
use plusfs_proto::peer::SubOp;
use plusfs_proto::Reply;
use plusfs_proto::{Cred, Request};
use std::sync::Arc;

/// Whether a request whose frame carried the epoch hint `hint` (0: none) was sent by a
/// process whose map is older than `mine`.
fn sent_with_older_map(mine: u64, hint: u16) -> bool {
    hint != 0 && plusfs_proto::epoch_is_newer(mine as u16, hint as u64)
}

/// The directory whose home a request is addressed to (see [`Request::target_dir`]).
pub(crate) fn target_dir(req: &Request) -> Option<&str> {
    req.target_dir()
}

/// The directories of sub-operations a participant applies (each must be homed here).
pub(crate) fn subop_dirs(req: &Request) -> Vec<&str> {
    let ops = match req {
        Request::TxPrepare { ops, .. } | Request::CxExec { ops, .. } | Request::SubExec { ops } => ops,
        _ => return Vec::new(),
    };
    ops.iter()
        .filter_map(|o| match o {
            SubOp::InsertEntry { dir, shard: None, .. }
            | SubOp::RemoveEntry { dir, shard: None, .. }
            | SubOp::ShareInode { dir, shard: None, .. }
            | SubOp::ExchangeEntry { dir, shard: None, .. } => Some(dir.as_str()),
            SubOp::CreateDir { path, .. } | SubOp::RemoveDir { path, .. } => Some(path.as_str()),
            _ => None,
        })
        .collect()
}

/// Where a request is served.
pub(crate) enum Placed {
    /// Here (anything the migration brings here that it touches is here now).
    Here,
    /// By server `0`, the home of its directory under the newest map.
    Forward(plusfs_proto::ServerId),
}

impl Migration {
    /// Decides where `req`, sent with the epoch hint `sender_epoch` (0: none), is served,
    /// pulling what it touches here first if the running migration brings it here.
    pub(crate) async fn place(self: &Arc<Self>, req: &Request, sender_epoch: u16) -> OpResult<Placed> {
        self.refresh_if_stale().await;
        let map = self.engine.map();
        if let Some(dir) = target_dir(req) {
            let home = map.home_of_dir(dir);
            // Delegations are served where the directory (or, for a distributed one, the
            // shard) is: a storing server grants and takes back its shard's, and a recall
            // may be what a hand-over of the directory waits for.
            let delegation = matches!(req, Request::DelegFlush { .. } | Request::DelegAcquire { .. });
            let eio = crate::engine::errors::eio;
            let held_here = delegation
                && (self.engine.store().get_dir(dir).map_err(eio)?.is_some()
                    || self.engine.store().get_shard(dir).map_err(eio)?.is_some());
            if home != self.engine.id() && !held_here {
                return Ok(Placed::Forward(home));
            }
        }
        let subs = subop_dirs(req);
        let planned = matches!(req, Request::TxPrepare { .. } | Request::CxExec { .. } | Request::SubExec { .. });
        if planned && sent_with_older_map(map.epoch, sender_epoch) {
            // Planned with an older map: it may miss servers objects moved to, or send
            // objects to old homes. Its coordinator plans again with the new map.
            return Err(OpError::StaleEpoch(format!(
                "the operation was planned with the map of an older epoch; this server is at epoch {}",
                map.epoch
            )));
        }
        if let Some(d) = subs.iter().find(|d| map.home_of_dir(d) != self.engine.id()) {
            return Err(OpError::StaleEpoch(format!(
                "'{d}' is homed on server {} at epoch {}",
                map.home_of_dir(d),
                map.epoch
            )));
        }
        self.pull_expected(req).await?;
        if map.migrating() {
            let mut touched: Vec<String> = plusfs_proto::touch::touched(req).into_iter().map(|t| t.0).collect();
            touched.extend(subs.iter().map(|d| d.to_string()));
            if let Request::Rename { dst, .. } | Request::Link { dst, .. } = req {
                touched.extend(plusfs_proto::path::split(dst).map(|(d, _)| d.to_string()));
                // A directory renamed onto is removed by this server if it is its home.
                touched.push(dst.clone());
            }
            if let Request::Exchange { b, .. } = req {
                touched.extend(plusfs_proto::path::split(b).map(|(d, _)| d.to_string()));
            }
            self.pull_in(&touched).await?;
        }
        Ok(Placed::Here)
    }

    /// Serves `req` at `home`, its directory's home, for `cred`.
    pub(crate) async fn forward_to_home(
        self: &Arc<Self>,
        home: plusfs_proto::ServerId,
        cred: &Cred,
        req: Request,
    ) -> OpResult<Reply> {
        self.migration.forwarded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.peers.pool.call_as(home, cred, &req).await {
            Ok(r) => r.map_err(OpError::from),
            Err(e) => Err(err(e.errno(), format!("forwarding to server {home}: {e}"))),
        }
    }
}
