//! Quotas through the library: set and lift them, report usage (the sum of every
//! server's counters) against their limits, and recount (fsck).

use crate::error::FsError;
use crate::fs::Client;
use plusfs_proto::quota::{Limits, Owner, QuotaDef, QuotaOp, QuotaReply, QuotaTarget, Usage, UsageMismatch};
use plusfs_proto::{Errno, Reply, Request, ServerId};
use std::collections::BTreeMap;

/// One owner's usage over the cluster, and its quota if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaLine {
    pub owner: Owner,
    pub used: Usage,
    pub quota: Option<QuotaDef>,
}

impl Client {
    /// Sets the quota of `target` (`None` lifts it) on every server. Admins only. A tree
    /// quota counts what is already in the tree from the moment it is set.
    pub async fn quota_set(&self, target: &QuotaTarget, limits: Option<Limits>) -> Result<(), FsError> {
        let (shown, server, target) = match target {
            QuotaTarget::Tree(raw) => {
                let p = self.norm("set the quota of", raw)?;
                (raw.clone(), self.home(&p), QuotaTarget::Tree(p))
            }
            QuotaTarget::Uid(u) => (format!("uid {u}"), self.home("/"), target.clone()),
            QuotaTarget::Gid(g) => (format!("gid {g}"), self.home("/"), target.clone()),
        };
        let req = Request::Quota { op: QuotaOp::Set { target, limits } };
        match self.rpc("set the quota of", &shown, server, req).await? {
            Reply::Quota(QuotaReply::Done) => Ok(()),
            other => Err(FsError::new("set the quota of", &shown, Errno::EPROTO).with_detail(format!("{other:?}"))),
        }
    }

    /// Every owner with usage or a quota: usage summed over all servers.
    pub async fn quota_report(&self) -> Result<Vec<QuotaLine>, FsError> {
        let mut used: BTreeMap<Owner, Usage> = BTreeMap::new();
        let mut quotas: BTreeMap<Owner, QuotaDef> = BTreeMap::new();
        for s in &self.map().servers {
            match self.call_server(s.id, &Request::Quota { op: QuotaOp::Usage }).await? {
                Reply::Quota(QuotaReply::Usage { counted, quotas: q }) => {
                    for (owner, u) in counted {
                        let e = used.entry(owner).or_default();
                        *e = e.plus(u);
                    }
                    quotas.extend(q.into_iter().map(|d| (d.owner, d)));
                }
                other => return Err(unexpected(&other)),
            }
        }
        let owners: std::collections::BTreeSet<Owner> = used.keys().chain(quotas.keys()).copied().collect();
        Ok(owners
            .into_iter()
            .map(|owner| QuotaLine {
                owner,
                used: used.get(&owner).copied().unwrap_or_default(),
                quota: quotas.get(&owner).cloned(),
            })
            .collect())
    }

    /// The quota and usage of `target`: for a tree, of the quota tree rooted at that path.
    pub async fn quota_of(&self, target: &QuotaTarget) -> Result<QuotaLine, FsError> {
        let owner = match target {
            QuotaTarget::Uid(u) => Owner::Uid(*u),
            QuotaTarget::Gid(g) => Owner::Gid(*g),
            QuotaTarget::Tree(raw) => Owner::Tree(self.stat(raw).await?.ino),
        };
        let line = self.quota_report().await?.into_iter().find(|l| l.owner == owner);
        Ok(line.unwrap_or(QuotaLine { owner, used: Usage::default(), quota: None }))
    }

    /// Recounts every server's usage; with `repair`, sets wrong counters right. Returns the
    /// counters found wrong, by server. Admins only.
    pub async fn quota_check(&self, repair: bool) -> Result<Vec<(ServerId, UsageMismatch)>, FsError> {
        let mut out = Vec::new();
        for s in &self.map().servers {
            match self.call_server(s.id, &Request::Quota { op: QuotaOp::Check { repair } }).await? {
                Reply::Quota(QuotaReply::Mismatches(m)) => out.extend(m.into_iter().map(|m| (s.id, m))),
                other => return Err(unexpected(&other)),
            }
        }
        Ok(out)
    }
}

fn unexpected(r: &Reply) -> FsError {
    FsError::new("report quotas of", "the cluster", Errno::EPROTO).with_detail(format!("{r:?}"))
}
