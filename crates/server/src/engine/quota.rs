//! The engine's part of quotas: the table of quotas every server keeps (one log record),
//! the sub-operation that sets one, and the commit loop that asks for more allowance when
//! a batch would take a limited owner past its ceiling here (the quota protocol, behind
//! [`Allowances`]).

use super::errors::{eio, err, OpResult};
use super::logrec::{self, Logged};
use super::Engine;
use plusfs_proto::quota::{Owner, QuotaDef, Usage};
use plusfs_proto::{Errno, SearchElem};
use plusfs_store::{Batch, LogKind, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

/// The quotas of the cluster as each server keeps them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct QuotaTable {
    pub(crate) defs: Vec<QuotaDef>,
}

impl Logged for QuotaTable {
    const KIND: LogKind = LogKind::Quota;
    const WHAT: &'static str = "quota table";
}

/// The one key of the quota table.
const TABLE: u64 = 0;

/// How many times a batch over quota is retried after more allowance came.
const GRANT_ROUNDS: usize = 8;

/// Where the engine gets more allowance for an owner (the quota protocol).
pub(crate) trait Allowances: Send + Sync {
    /// Raises this server's ceiling of `owner` by at least `need`, or fails with `EDQUOT`.
    fn more(&self, owner: Owner, need: Usage) -> Pin<Box<dyn Future<Output = OpResult<()>> + Send + '_>>;
}

impl Engine {
    /// The quotas kept here, by owner.
    pub(crate) fn quotas(&self) -> Arc<BTreeMap<Owner, QuotaDef>> {
        self.quotas.read().clone()
    }

    /// Reads the quota table from the store and limits its owners in the store's books.
    pub(crate) fn load_quotas(&self) -> Result<(), StoreError> {
        let table = match self.store.get_log(LogKind::Quota, TABLE)? {
            Some(raw) => logrec::decode::<QuotaTable>(TABLE, &raw)?,
            None => QuotaTable::default(),
        };
        let defs: BTreeMap<Owner, QuotaDef> = table.defs.into_iter().map(|d| (d.owner, d)).collect();
        let owners: Vec<Owner> = defs.keys().copied().collect();
        self.store.limit(&owners);
        // A changed limit: the allowance held here goes back (the master learns anew).
        let before = self.quotas();
        for (owner, def) in &defs {
            if before.get(owner).is_some_and(|b| b.limits != def.limits) {
                self.store.shrink(*owner)?;
            }
        }
        *self.quotas.write() = Arc::new(defs);
        Ok(())
    }

    /// Adds to `b` the quota table holding `defs` (a server that joined takes another's).
    pub(crate) fn put_quota_table(&self, defs: Vec<QuotaDef>, b: &mut Batch) {
        logrec::put(b, TABLE, &QuotaTable { defs });
    }

    /// Installs the quota protocol the commit loop asks for allowance.
    pub(crate) fn set_allowances(&self, a: Weak<dyn Allowances>) {
        let _ = self.allowances.set(a);
    }

    /// Commits `b`; when it is refused for a limited owner's ceiling, asks for more
    /// allowance and submits it again (`EDQUOT` when none is left).
    pub(crate) async fn commit_counted(&self, mut b: Batch) -> OpResult<()> {
        let touches_table = b.ops.iter().any(|op| matches!(op, plusfs_store::BatchOp::PutLog(LogKind::Quota, ..)));
        for _ in 0..GRANT_ROUNDS {
            match plusfs_store::commit(self.store.as_ref(), b).await {
                Err(StoreError::OverQuota { owner, need, batch }) => {
                    let Some(a) = self.allowances.get().and_then(Weak::upgrade) else {
                        return Err(err(Errno::EDQUOT, format!("the quota of {owner} is exhausted")));
                    };
                    a.more(owner, need).await?;
                    b = *batch;
                }
                Err(e) => return Err(eio(e)),
                Ok(()) => {
                    if touches_table {
                        self.load_quotas().map_err(eio)?;
                    }
                    self.report_overdrawn();
                    return Ok(());
                }
            }
        }
        Err(err(Errno::EDQUOT, "the quota allowance kept running out while it was raised".to_string()))
    }

    /// Makes room here for the directories `ops` create (`CreateDir`), asking for more
    /// allowance where their owner, group or trees need it; `EDQUOT` if a limit leaves
    /// none. Checked when a cross-server operation is prepared, whose commit must not
    /// fail; concurrent ones are not reserved for, so each may take the last room.
    pub(crate) async fn room_for(&self, ops: &[plusfs_proto::SubOp]) -> OpResult<()> {
        if self.quotas.read().is_empty() {
            return Ok(());
        }
        let one = Usage { files: 1, bytes: 0 };
        for op in ops {
            let plusfs_proto::SubOp::CreateDir { object, .. } = op else { continue };
            let trees = object.ancestry.iter().flat_map(|a| a.quota_trees()).filter(|t| *t != object.ino);
            let owners: Vec<Owner> =
                [Owner::Uid(object.uid), Owner::Gid(object.gid)].into_iter().chain(trees.map(Owner::Tree)).collect();
            for owner in owners {
                let mut rounds = 0;
                loop {
                    let need = self.store.shortfall(owner, one).map_err(eio)?;
                    if need.is_zero() {
                        break;
                    }
                    rounds += 1;
                    let a = self.allowances.get().and_then(Weak::upgrade).filter(|_| rounds <= GRANT_ROUNDS);
                    let Some(a) = a else {
                        return Err(err(Errno::EDQUOT, format!("the quota of {owner} is exhausted")));
                    };
                    a.more(owner, need).await?;
                }
            }
        }
        Ok(())
    }

    /// Tells the masters of the owners a decided transaction took past their ceiling here
    /// (a file moved in by a rename): they learn every server's share again, taking back
    /// the room the other side was left with.
    fn report_overdrawn(&self) {
        let over = self.store.take_overdrawn();
        let Some(a) = self.allowances.get().and_then(Weak::upgrade).filter(|_| !over.is_empty()) else { return };
        tokio::spawn(async move {
            for owner in over {
                if let Err(e) = a.more(owner, Usage::default()).await {
                    tracing::warn!(%owner, cause = %e, "the quota master could not be told of a ceiling passed");
                }
            }
        });
    }

    /// Applies a `SetQuota` sub-operation into `b`: the quota table changes, and for a tree
    /// quota every directory object and shard at or below its root here takes (or loses)
    /// the tree's element.
    pub(crate) fn commit_set_quota(&self, def: &QuotaDef, remove: bool, b: &mut Batch) -> OpResult<()> {
        let mut table = match self.store.get_log(LogKind::Quota, TABLE).map_err(eio)? {
            Some(raw) => logrec::decode::<QuotaTable>(TABLE, &raw).map_err(eio)?,
            None => QuotaTable::default(),
        };
        table.defs.retain(|d| d.owner != def.owner);
        if !remove {
            table.defs.push(def.clone());
        }
        logrec::put(b, TABLE, &table);
        let (Some(root), Owner::Tree(ino)) = (&def.path, def.owner) else { return Ok(()) };
        let elem = SearchElem::Quota(ino);
        let fix = |d: &mut plusfs_proto::DirObject| -> bool {
            let Some(a) = d.ancestry.take() else { return false };
            let (has, changed) = (a.holds(&elem), a.holds(&elem) == remove);
            d.ancestry = Some(match (has, remove) {
                (false, false) => a.with(elem.clone()),
                (true, true) => a.without(elem.clone()),
                _ => a,
            });
            changed
        };
        for (path, mut d) in self.store.dirs_within(root).map_err(eio)? {
            if fix(&mut d) {
                b.put_dir(&path, &d);
            }
        }
        for (path, mut d) in self.store.shards_within(root).map_err(eio)? {
            if fix(&mut d) {
                b.put_shard(&path, &d);
            }
        }
        Ok(())
    }
}
