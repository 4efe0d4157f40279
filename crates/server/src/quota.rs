//! The quota protocol: setting quotas on every server, the usage report, and allowances.
//!
//! Each server counts what it stores (the store's books) and may take a limited owner's
//! usage there up to its *ceiling*. A batch that would go past it is held while this
//! server asks the owner's *master* (`Owner::master` over the map's servers) for more,
//! reporting its ceiling; the master records it as this server's share and grants from
//! what the limit leaves after every server's share. The master
//! learns the others' ceilings by asking each to give its unused allowance back
//! (`Shrink`): once when it starts serving an owner, and again whenever what is left
//! would not cover a request. So the sum of the ceilings never exceeds the limit, and the
//! create that would cross it is refused with `EDQUOT` wherever it lands.
//!
//! Nothing of this is kept on disk: the counters are (in the same batch as the change),
//! and a restarted server starts with no allowance above its usage; a restarted master
//! asks every server again.

use crate::engine::call::Call;
use crate::engine::errors::{eio, err, OpResult};
use crate::engine::quota::Allowances;
use crate::engine::Engine;
use crate::peers::Peers;
use crate::twopc::{add_part, Parts, Plan, TwoPhase};
use plusfs_proto::quota::{Limit, Limits, Owner, QuotaDef, QuotaOp, QuotaReply, QuotaTarget, Usage};
use plusfs_proto::{Cred, Errno, Reply, Request, ServerId, SubOp};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a master knows of one owner's allowances.
#[derive(Debug, Default)]
struct Granted {
    /// The map epoch it was learnt under (a new map: asked again).
    epoch: u64,
    /// The limits it was learnt for (new limits: asked again).
    limits: Limits,
    /// Each server's ceiling as granted (or as it reported when it gave back).
    ceilings: HashMap<ServerId, Usage>,
    /// Each server's usage as last reported.
    used: HashMap<ServerId, Usage>,
    /// Since when (seconds since the epoch) usage is above the soft limit of files, bytes.
    over_soft: [Option<u64>; 2],
}

/// The quota protocol of one server.
pub(crate) struct Quotas {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    twopc: Arc<TwoPhase>,
    /// The owners this server is master of (one grant at a time).
    master: tokio::sync::Mutex<HashMap<Owner, Granted>>,
    /// One request for more allowance at a time from this server.
    asking: tokio::sync::Mutex<()>,
}

/// A ceiling that no usage reaches (a dimension without a limit).
const UNLIMITED: i64 = i64::MAX / 4;

/// Share of a limit a grant hands out beyond what was asked (1 / `CHUNK` of it per
/// server), so most operations need no round trip to the master.
const CHUNK: i64 = 8;

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn edquot(owner: Owner) -> crate::engine::errors::OpError {
    err(Errno::EDQUOT, format!("the quota of {owner} is exhausted"))
}

impl Quotas {
    pub(crate) fn new(engine: Arc<Engine>, peers: Arc<Peers>, twopc: Arc<TwoPhase>) -> Quotas {
        Quotas { engine, peers, twopc, master: Default::default(), asking: Default::default() }
    }

    /// Serves a quota request.
    pub(crate) async fn handle(self: &Arc<Self>, op: QuotaOp, c: &Call) -> OpResult<Reply> {
        if matches!(op, QuotaOp::Set { .. } | QuotaOp::Check { .. }) && !c.is_root() {
            return Err(err(Errno::EPERM, "only root sets quotas and recounts their usage".to_string()));
        }
        let reply = match op {
            QuotaOp::Set { target, limits } => {
                let t = self.clone();
                self.twopc.retrying(|plan| t.set(plan, target.clone(), limits)).await?;
                QuotaReply::Done
            }
            QuotaOp::Usage => self.usage()?,
            QuotaOp::Check { repair } => {
                let (wrong, fix) = self.engine.store_handle().check_usage().map_err(eio)?;
                if repair && !fix.is_empty() {
                    self.engine.apply(fix).await?;
                }
                QuotaReply::Mismatches(wrong)
            }
            QuotaOp::Grant { owner, from, used, ceiling, want, limits } => {
                QuotaReply::Ceiling(self.grant(owner, from, (used, ceiling), want, limits).await?)
            }
            QuotaOp::Shrink { owner } => QuotaReply::Used(self.engine.store_handle().shrink(owner).map_err(eio)?),
        };
        Ok(Reply::Quota(reply))
    }

    /// A server whose quota table is empty (one that joined the cluster after quotas were
    /// set) takes the table of the first other server that answers, in the background:
    /// until then what lands on it is counted but not limited.
    pub(crate) fn fetch_table(self: &Arc<Self>) {
        // A new cluster (epoch 1) has no server that joined later.
        let map = self.engine.map();
        if !self.engine.quotas().is_empty() || map.servers.len() < 2 || map.epoch <= 1 {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            for _ in 0..60 {
                let Some(q) = weak.upgrade() else { return };
                match q.table_from_peers().await {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(cause = %e, "the quota table could not be stored"),
                }
                drop(q);
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
    }

    /// Asks the other servers for their quota table; stores the first one answered (and
    /// not empty). True when done (or nothing to take).
    async fn table_from_peers(&self) -> OpResult<bool> {
        let me = self.engine.id();
        let mut answered = false;
        for s in self.engine.map().servers.iter().map(|s| s.id).filter(|s| *s != me) {
            let req = Request::Quota { op: QuotaOp::Usage };
            let Ok(Reply::Quota(QuotaReply::Usage { quotas, .. })) = self.peers.call(s, req, &Cred::server()).await
            else {
                continue;
            };
            answered = true;
            if quotas.is_empty() {
                continue;
            }
            if !self.engine.quotas().is_empty() {
                return Ok(true);
            }
            let mut b = plusfs_store::Batch::new();
            self.engine.put_quota_table(quotas, &mut b);
            self.engine.apply(b).await?;
            tracing::info!(from = s, "took the quota table");
            return Ok(true);
        }
        Ok(answered)
    }

    /// The counters here and the quotas kept.
    fn usage(&self) -> OpResult<QuotaReply> {
        let counted = self.engine.store().usage().map_err(eio)?.into_iter().collect();
        let quotas = self.engine.quotas().values().cloned().collect();
        Ok(QuotaReply::Usage { counted, quotas })
    }

    /// Sets (or lifts) the quota of `target` on every server, in one transaction.
    async fn set(self: &Arc<Self>, plan: Plan, target: QuotaTarget, limits: Option<Limits>) -> OpResult<Reply> {
        if let Some(l) = &limits {
            check_limits(l)?;
        }
        let (owner, path) = match target {
            QuotaTarget::Uid(u) => (Owner::Uid(u), None),
            QuotaTarget::Gid(g) => (Owner::Gid(g), None),
            QuotaTarget::Tree(p) => {
                crate::engine::errors::check_dir_path(&p)?;
                let d = self.engine.dir_object(&p)?;
                (Owner::Tree(d.ino), Some(p))
            }
        };
        let def = QuotaDef { owner, limits: limits.unwrap_or_default(), path };
        let mut parts = Parts::new();
        for s in &self.engine.map().servers {
            add_part(&mut parts, s.id, SubOp::SetQuota { def: def.clone(), remove: limits.is_none() });
        }
        self.twopc.run(plan, parts, &Call::server()).await?;
        Ok(Reply::Quota(QuotaReply::Done))
    }

    /// The master's side of a grant: `from` uses `used` under its ceiling `held` and needs
    /// at least `want` more (nothing: it went past its ceiling by a transaction's commit,
    /// and every server's share is learnt again). `limits` are the quota's as the asker
    /// keeps them, used if this server does not know the quota (yet). Answers its new
    /// ceiling.
    async fn grant(
        &self,
        owner: Owner,
        from: ServerId,
        (used, held): (Usage, Usage),
        want: Usage,
        limits: Limits,
    ) -> OpResult<Usage> {
        let limits = self.engine.quotas().get(&owner).map_or(limits, |d| d.limits);
        let mut master = self.master.lock().await;
        let epoch = self.engine.map().epoch;
        let g = master.entry(owner).or_default();
        if g.epoch != epoch || g.limits != limits || want.is_zero() {
            // Installed only once every server answered (or kept its known share).
            let mut fresh = Granted { epoch, limits, ..Granted::default() };
            if g.epoch == epoch {
                fresh.ceilings = g.ceilings.clone();
                fresh.used = g.used.clone();
            }
            self.learn(owner, from, &mut fresh).await?;
            *g = fresh;
        }
        g.ceilings.insert(from, held);
        g.used.insert(from, used);
        let mut limit = self.limit_now(&limits, g);
        let mut free = free(limit, g);
        if short(want, free) {
            self.learn(owner, from, g).await?;
            limit = self.limit_now(&limits, g);
            free = self::free(limit, g);
            if short(want, free) {
                return Err(edquot(owner));
            }
        }
        // A share of the limit beyond what was asked, but not past a soft limit: above it,
        // or with only a soft limit, each step asks, so the end of the grace period is seen.
        let total = g.used.values().fold(Usage::default(), |a, u| a.plus(*u));
        let give = |want: i64, free: i64, limit: Option<u64>, soft: Option<u64>, total: i64| match (limit, soft) {
            (None, None) => UNLIMITED,
            (None, Some(_)) => want,
            (Some(l), soft) => {
                let more = want.max(l as i64 / CHUNK);
                let more = if soft.is_some_and(|s| total + more > s as i64) { want } else { more };
                more.min(free).max(0)
            }
        };
        let (lf, lb) = (&limits.files, &limits.bytes);
        let ceiling = Usage {
            files: held
                .files
                .saturating_add(give(want.files, free.files, limit.0, lf.soft, total.files))
                .min(UNLIMITED),
            bytes: held
                .bytes
                .saturating_add(give(want.bytes, free.bytes, limit.1, lb.soft, total.bytes))
                .min(UNLIMITED),
        };
        g.ceilings.insert(from, ceiling);
        Ok(ceiling)
    }

    /// The limits in force for files and bytes, starting or ending a grace period as the
    /// usage known now says.
    fn limit_now(&self, l: &Limits, g: &mut Granted) -> (Option<u64>, Option<u64>) {
        let total = g.used.values().fold(Usage::default(), |a, u| a.plus(*u));
        let now = now_secs();
        let in_force = |limit: Limit, used: i64, since: &mut Option<u64>| {
            match limit.soft {
                Some(s) if used > s as i64 => {
                    since.get_or_insert(now);
                }
                _ => *since = None,
            }
            limit.in_force(since.is_some_and(|t| now.saturating_sub(t) >= l.grace_secs))
        };
        let [files_since, bytes_since] = &mut g.over_soft;
        (in_force(l.files, total.files, files_since), in_force(l.bytes, total.bytes, bytes_since))
    }

    /// Asks every server but `from` to give back its unused allowance of `owner`, taking
    /// their usage as their ceilings. A server that cannot be reached keeps the ceiling
    /// known for it; one never heard of fails the request.
    async fn learn(&self, owner: Owner, from: ServerId, g: &mut Granted) -> OpResult<()> {
        for s in self.engine.map().servers.iter().map(|s| s.id).filter(|s| *s != from) {
            let used = match s == self.engine.id() {
                true => self.engine.store_handle().shrink(owner).map_err(eio),
                false => {
                    let req = Request::Quota { op: QuotaOp::Shrink { owner } };
                    match self.peers.call(s, req, &Cred::server()).await {
                        Ok(Reply::Quota(QuotaReply::Used(u))) => Ok(u),
                        Ok(other) => Err(err(Errno::EIO, format!("server {s} answered a quota shrink with {other:?}"))),
                        Err(e) => Err(e.into()),
                    }
                }
            };
            match used {
                Ok(u) => {
                    g.ceilings.insert(s, u);
                    g.used.insert(s, u);
                }
                Err(_) if g.ceilings.contains_key(&s) => {}
                Err(e) => {
                    return Err(err(Errno::EIO, format!("the quota of {owner} cannot be granted: server {s}: {e}")))
                }
            }
        }
        Ok(())
    }

    /// The holder's side: raises this server's ceiling of `owner` by at least `need`.
    async fn ask(&self, owner: Owner, need: Usage) -> OpResult<()> {
        let _one = self.asking.lock().await;
        let store = self.engine.store_handle();
        // The master takes the ceiling reported as this server's grant and adds to it.
        let Some(now) = store.allowance(owner).map_err(eio)? else { return Ok(()) };
        let Some(limits) = self.engine.quotas().get(&owner).map(|d| d.limits) else { return Ok(()) };
        let (used, ceiling) = (now.used, now.ceiling);
        let want = Usage { files: need.files.max(0), bytes: need.bytes.max(0) };
        let servers: Vec<ServerId> = self.engine.map().servers.iter().map(|s| s.id).collect();
        let master = owner.master(&servers).unwrap_or(self.engine.id());
        let ceiling = match master == self.engine.id() {
            true => self.grant(owner, master, (used, ceiling), want, limits).await?,
            false => {
                let from = self.engine.id();
                let req = Request::Quota { op: QuotaOp::Grant { owner, from, used, ceiling, want, limits } };
                match self.peers.call(master, req, &Cred::server()).await {
                    Ok(Reply::Quota(QuotaReply::Ceiling(c))) => c,
                    Ok(other) => return Err(err(Errno::EIO, format!("quota master {master} answered {other:?}"))),
                    Err(e) => return Err(e.into()),
                }
            }
        };
        // Lowered meanwhile by the master taking allowance back: the master's record is
        // that lower ceiling; the batch will ask again.
        store.raise(owner, now.shrinks, ceiling);
        Ok(())
    }
}

/// Whether `free` does not cover what is wanted (only dimensions something is wanted of:
/// a write needs no files, even when usage is above a files limit).
fn short(want: Usage, free: Usage) -> bool {
    (want.files > 0 && want.files > free.files) || (want.bytes > 0 && want.bytes > free.bytes)
}

/// What `limit` leaves after every server's share in `g`: its ceiling, or its usage where
/// that is higher (unlimited dimensions: all).
fn free(limit: (Option<u64>, Option<u64>), g: &Granted) -> Usage {
    let share = |s: &ServerId, c: &Usage| {
        let u = g.used.get(s).copied().unwrap_or_default();
        Usage { files: c.files.max(u.files), bytes: c.bytes.max(u.bytes) }
    };
    let sum = g.ceilings.iter().fold(Usage::default(), |a, (s, c)| a.plus(share(s, c)));
    let left = |l: Option<u64>, used: i64| l.map_or(UNLIMITED, |l| (l as i64).saturating_sub(used));
    Usage { files: left(limit.0, sum.files), bytes: left(limit.1, sum.bytes) }
}

/// Refuses limits that cannot hold (a soft limit above the hard one).
fn check_limits(l: &Limits) -> OpResult<()> {
    for (what, lim) in [("files", l.files), ("bytes", l.bytes)] {
        if let (Some(h), Some(s)) = (lim.hard, lim.soft) {
            if s > h {
                return Err(err(Errno::EINVAL, format!("the soft limit of {what} ({s}) is above the hard one ({h})")));
            }
        }
        if i64::try_from(lim.hard.unwrap_or(0)).is_err() || i64::try_from(lim.soft.unwrap_or(0)).is_err() {
            return Err(err(Errno::EINVAL, format!("the limit of {what} is too large")));
        }
    }
    Ok(())
}

impl Allowances for Quotas {
    fn more(&self, owner: Owner, need: Usage) -> Pin<Box<dyn Future<Output = OpResult<()>> + Send + '_>> {
        Box::pin(self.ask(owner, need))
    }
}
