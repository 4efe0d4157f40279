//! Directory delegations (`docs/semantics.md`, "Delegations"): a server grants one client
//! session a write delegation on a directory it is the home of (or any number of
//! sessions a read delegation), recalls it before serving any other session's request
//! that touches the directory (a read delegation: that changes it), and applies the work
//! the holder of a write delegation writes back (`apply.rs`).
//!
//! The model is Cx's "a request on an object with pending work settles that work first":
//! every request registers the directories it touches ([`DelegTable`]'s in-flight counts)
//! and, if another session holds a delegation on one of them, queues a recall for the
//! holder (answered through its `DelegWait`) and waits until the holder has flushed and
//! returned it, at most the cluster's recall timeout; a holder that does not answer in
//! time loses the delegation and its later flushes are refused (ESTALE). A grant waits for
//! the requests in flight on its directory, so none of them can change it unseen.
//!
//! Delegation records (directory, session, last applied flush) are in the store, so a
//! server restarted under a delegation still honours it and answers a resent flush once.

mod apply;
pub(crate) mod table;

use crate::engine::call::Call;
use crate::engine::encode;
use crate::engine::errors::{check_dir_path, eio, err, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::engine::Engine;
use crate::filedata::FileData;
use plusfs_proto::{Cred, DelegGrant, DelegOp, Errno, Flushed, Reply, Request, MAY_READ, MAY_WRITE};
use plusfs_store::{Batch, LogKind};
use std::sync::Arc;
use std::time::Duration;
use table::{unix_now, Lease, Record, Stored};

/// How a delegation's directory is addressed here: its home object, or this server's
/// shard of the distributed directory of that incarnation.
fn via_of(shard: Option<u64>) -> Via {
    shard.map_or(Via::Home, Via::Shard)
}

/// Inode numbers handed out with a write delegation: creates past them go to the server
/// (a client filling a huge directory keeps its delegation of a shard for ~16,000 creates;
/// numbers are 48-bit sequences per server, so unused ones cost nothing).
const INO_BLOCK: u32 = 16_384;

/// Longest a `DelegWait` waits for a recall before answering empty (it answers within a
/// quarter of the recall timeout when that is shorter: each answer renews the holder's
/// lease, which must not lapse between two polls, `docs/protocol.md`).
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Most entries one `DelegEntries` asks for.
const MAX_ENTRIES_ASKED: usize = 4096;
/// About the most bytes of entries one `DelegEntries` answer carries (the answer stops
/// short past it, well within a frame).
const MAX_ENTRIES_BYTES: usize = 4 << 20;

/// How long an ended delegation's record stays to answer a resent last flush.
const KEEP_ENDED_SECS: u64 = 600;

/// The delegation protocol's server side: grants, recalls, write-backs.
pub(crate) struct Delegations {
    engine: Arc<Engine>,
    filedata: Arc<FileData>,
    /// Directory delegations granted here.
    pub(crate) delegs: Arc<table::DelegTable>,
}

impl Delegations {
    pub(crate) fn new(engine: Arc<Engine>, filedata: Arc<FileData>) -> Delegations {
        Delegations { engine, filedata, delegs: Arc::default() }
    }
}

impl Delegations {
    /// Loads the delegations recorded in the store (at start).
    pub(crate) fn load_delegations(&self) -> Result<(), plusfs_store::StoreError> {
        for (id, bytes) in self.engine.store().log_records(LogKind::Deleg)? {
            match Stored::decode(&bytes) {
                Ok(s) => self.delegs.load(id, s),
                Err(e) => tracing::error!(id, error = %e, "unreadable delegation record; ignored"),
            }
        }
        Ok(())
    }

    /// Registers `req` (made by `cred`) as in flight on the directories it touches and
    /// recalls the delegations other sessions hold on them; returns when none is left.
    /// Delegations whose holder did not answer within the recall timeout are revoked.
    pub(crate) async fn enter_delegated(self: &Arc<Self>, cred: &Call, req: &Request) -> table::InFlight {
        self.enter_touched(cred.session, plusfs_proto::touch::touched(req)).await
    }

    /// Recalls every delegation of directory `dir`'s home object here, whoever holds it,
    /// and keeps new ones from being granted while the returned guard lives: a directory
    /// about to be distributed must have no queued work left outside it (its holder's own
    /// requests do not recall it).
    pub(crate) async fn recall_all(self: &Arc<Self>, dir: &str) -> table::InFlight {
        self.enter_touched(0, vec![(dir.to_string(), plusfs_proto::Touch::Object, false)]).await
    }

    /// [`Self::enter_delegated`] for what a request of `session` touches.
    async fn enter_touched(
        self: &Arc<Self>,
        session: u64,
        touched: Vec<(String, plusfs_proto::Touch, bool)>,
    ) -> table::InFlight {
        let guard = self.delegs.enter(&touched);
        loop {
            let wait = self.delegs.changed();
            tokio::pin!(wait);
            wait.as_mut().enable();
            let outcome = self.delegs.recall_conflicts(&touched, session, self.recall_timeout());
            match outcome {
                table::Recall::Clear => return guard,
                table::Recall::Revoke(ids) => self.revoke(ids).await,
                table::Recall::Wait(deadline) => {
                    let _ = tokio::time::timeout_at(deadline.into(), wait).await;
                }
            }
        }
    }

    fn recall_timeout(&self) -> Duration {
        self.engine.map().delegations.recall_timeout()
    }

    /// Ends delegations whose holders did not answer a recall in time.
    async fn revoke(&self, ids: Vec<u64>) {
        let mut b = Batch::new();
        for id in &ids {
            tracing::warn!(id, "delegation holder did not answer its recall in time; delegation revoked");
            b.del_log(LogKind::Deleg, *id);
        }
        if let Err(e) = self.engine.apply(b).await {
            tracing::error!(error = %e.message(), "cannot record revoked delegations");
        }
        self.delegs.revoked(&ids);
    }

    /// `DelegAcquire`: grants `cred`'s session a write (or `read`) delegation on `dir` (as
    /// `via` addresses it: its home object, or this server's shard of it when distributed).
    pub(crate) async fn deleg_acquire(
        self: &Arc<Self>,
        dir: &str,
        read: bool,
        via: Via,
        cred: &Call,
    ) -> OpResult<Reply> {
        check_dir_path(dir)?;
        if !self.engine.map().delegations.enabled || cred.session == 0 {
            return Err(err(Errno::EAGAIN, format!("delegations are off for '{dir}'")));
        }
        if !read && self.under_quota(dir, via)? {
            return Err(err(Errno::EAGAIN, format!("'{dir}' is under a quota: its changes go to the servers")));
        }
        let id = self.engine.new_txid().await?;
        let shard = match via {
            Via::Home => None,
            Via::Shard(incarnation) => Some(incarnation),
            Via::Inode(_) => return Err(err(Errno::EINVAL, format!("'{dir}': a delegation is of a directory"))),
        };
        let (id, replaced) = self.delegs.start_grant(dir, id, cred.session, (read, shard)).map_err(|holder| {
            OpError::Delegated(format!("'{dir}' is delegated to another client (delegation {holder})"))
        })?;
        match self.grant(dir, id, replaced, (read, shard), cred).await {
            Ok(g) => Ok(Reply::Deleg(Box::new(g))),
            Err(e) => {
                self.delegs.abandon(id);
                Err(e)
            }
        }
    }

    /// Whether a quota may refuse what is created in `dir`: a user or group quota exists,
    /// or `dir` lies in a quota tree. Its writes are then not delegated (a holder's
    /// creates would be acknowledged before any server counted them).
    fn under_quota(&self, dir: &str, via: Via) -> OpResult<bool> {
        let quotas = self.engine.quotas();
        if quotas.is_empty() {
            return Ok(false);
        }
        if quotas.keys().any(|o| !matches!(o, plusfs_proto::quota::Owner::Tree(_))) {
            return Ok(true);
        }
        let host = self.engine.host(dir, via)?;
        Ok(host.obj.ancestry.as_ref().is_some_and(|a| a.quota_trees().next().is_some()))
    }

    /// Waits for the requests in flight on `dir`, then reads it and records the grant (in
    /// place of the `replaced` read delegation of the same session, if any).
    async fn grant(
        self: &Arc<Self>,
        dir: &str,
        id: u64,
        replaced: Option<u64>,
        (read, shard): (bool, Option<u64>),
        cred: &Call,
    ) -> OpResult<DelegGrant> {
        loop {
            let wait = self.delegs.changed();
            tokio::pin!(wait);
            wait.as_mut().enable();
            match self.delegs.grant_ready(id) {
                Some(true) => break,
                Some(false) => {
                    let _ = tokio::time::timeout(self.recall_timeout(), wait).await;
                }
                None => return Err(OpError::Delegated(format!("another client needs '{dir}'"))),
            }
        }
        let _g = self.engine.locks().lock(&[(dir.to_string(), Scope::Whole)], None, true).await;
        let host = self.engine.host(dir, via_of(shard)).map_err(|e| match e.dist() {
            Some(_) => err(Errno::EAGAIN, format!("'{dir}' is distributed: its shards are delegated")),
            None => e,
        })?;
        // A shard holding several slots of the set (taken from a drained server) is not
        // delegated: a holder knows the names of one slot.
        if shard.is_some() && host.obj.dist.set.iter().filter(|&&s| s == self.engine.id()).count() > 1 {
            return Err(err(Errno::EAGAIN, format!("'{dir}': this shard holds several slots and is not delegated")));
        }
        let settings = self.engine.map().delegations.clone();
        // A read delegation of a directory too large to send whole would answer only
        // negative lookups: not worth a scan of every name per grant.
        let most = if read { settings.max_entries } else { settings.max_names };
        if self.engine.over_threshold(&host.obj) || host.obj.entries > most {
            return Err(err(Errno::EAGAIN, format!("'{dir}' has too many entries to delegate")));
        }
        perm::check_search(cred, &host.obj, dir)?;
        perm::check_dir(cred, &host.obj, MAY_READ | MAY_WRITE, dir)?;
        let (entries, digests) = self.grant_contents(&host.obj, settings.max_entries)?;
        let (first_ino, ino_count) = match read {
            true => (0, 0),
            false => (self.engine.new_inos(INO_BLOCK as u64).await?, INO_BLOCK),
        };
        let lease = Lease::new(first_ino, ino_count);
        let stored =
            Stored { dir: dir.to_string(), session: cred.session, applied_seq: 0, ended_at: 0, read, shard, lease };
        let mut b = Batch::new();
        b.put_log(LogKind::Deleg, id, stored.encode());
        if let Some(old) = replaced {
            b.del_log(LogKind::Deleg, old);
        }
        self.engine.apply_for(cred, b).await?;
        if !self.delegs.granted(id, lease) {
            let mut b = Batch::new();
            b.del_log(LogKind::Deleg, id);
            self.engine.apply_for(cred, b).await?;
            return Err(OpError::Delegated(format!("another client needs '{dir}'")));
        }
        tracing::debug!(dir, id, read, session = cred.session, entries = host.obj.entries, "delegation granted");
        Ok(DelegGrant { id, dir: host.obj, entries, digests, first_ino, ino_count })
    }

    /// What a grant of directory object `d` carries: every entry when it has at most
    /// `whole` of them, else the sorted digests of their names (read without decoding the
    /// entries: a grant of a large shard costs a key scan, not a listing).
    #[allow(clippy::type_complexity)]
    fn grant_contents(
        &self,
        d: &plusfs_proto::DirObject,
        whole: u64,
    ) -> OpResult<(Vec<(String, plusfs_proto::Inode)>, Option<Vec<u64>>)> {
        if d.entries <= whole {
            // The count may lag a listing by entries being added: one more than `whole`
            // tells.
            let entries = self.engine.store().list_entries(d.ino, None, whole as usize + 1).map_err(eio)?;
            if entries.len() as u64 <= whole {
                return Ok((entries, None));
            }
        }
        let mut digests = Vec::with_capacity(d.entries as usize);
        self.engine
            .store()
            .entry_names(d.ino, &mut |name| digests.push(plusfs_proto::name_digest(name)))
            .map_err(eio)?;
        digests.sort_unstable();
        Ok((Vec::new(), Some(digests)))
    }

    /// `DelegFlush` from `c`: applies `ops` under delegation `id` of `dir` once, in one
    /// store write. Only the session holding the delegation may flush it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn deleg_flush(
        self: &Arc<Self>,
        dir: &str,
        id: u64,
        seq: u64,
        creds: Vec<Cred>,
        ops: Vec<DelegOp>,
        release: bool,
        c: &Call,
    ) -> OpResult<Reply> {
        let _g = self.engine.locks().lock(&[(dir.to_string(), Scope::Whole)], None, true).await;
        let rec = self.delegs.record(id).filter(|r| r.dir == dir);
        let Some(Record { applied_seq, live, session, read, shard, mut lease, .. }) = rec else {
            return Err(err(Errno::ESTALE, format!("delegation {id} of '{dir}' was revoked")));
        };
        if session != c.session {
            return Err(err(Errno::EPERM, format!("delegation {id} of '{dir}' is another client's")));
        }
        if seq <= applied_seq {
            return Ok(Reply::Flushed(Flushed { failed: Vec::new(), ended: !live }));
        }
        if !live {
            return Err(err(Errno::ESTALE, format!("delegation {id} of '{dir}' has ended")));
        }
        if read && !ops.is_empty() {
            return Err(err(Errno::EINVAL, format!("delegation {id} of '{dir}' is a read delegation")));
        }
        let mut host = self.engine.host(dir, via_of(shard))?;
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::new();
        let (failed, remote) =
            self.apply_deleg_ops(dir, &mut host, (shard.is_some(), &mut lease), &creds, ops, &mut b).await?;
        let ended = release || self.engine.over_threshold(&host.obj);
        let ended_at = if ended { unix_now() } else { 0 };
        let stored = Stored { dir: dir.to_string(), session, applied_seq: seq, ended_at, read, shard, lease };
        b.put_log(LogKind::Deleg, id, stored.encode());
        host.save(&mut b, dir);
        self.engine.apply_for(c, b).await?;
        drop(gate);
        self.delegs.flushed(id, seq, ended, lease);
        drop(_g);
        self.filedata.drop_remote(remote).await;
        if !failed.is_empty() {
            tracing::warn!(dir, id, ?failed, "operations of a delegation flush refused");
        }
        if ended && self.engine.over_threshold(&host.obj) {
            self.engine.want_distribution(dir);
        }
        if ended {
            self.prune_ended().await;
        }
        Ok(Reply::Flushed(Flushed { failed, ended }))
    }

    /// `DelegEntries` from `c`: the stored entries `names` of the directory (or shard) of
    /// live delegation `id`, for its holder (granted digests only) to answer later calls
    /// on them itself. Only the holding session may ask, and only as a caller that may
    /// search the directory.
    pub(crate) fn deleg_entries(&self, dir: &str, id: u64, names: &[String], c: &Call) -> OpResult<Reply> {
        let rec = self.delegs.record(id).filter(|r| r.dir == dir && r.live);
        let Some(Record { session, shard, .. }) = rec else {
            return Err(err(Errno::ESTALE, format!("delegation {id} of '{dir}' was revoked")));
        };
        if session != c.session {
            return Err(err(Errno::EPERM, format!("delegation {id} of '{dir}' is another client's")));
        }
        if names.len() > MAX_ENTRIES_ASKED {
            return Err(err(Errno::EINVAL, format!("'{dir}': at most {MAX_ENTRIES_ASKED} entries per request")));
        }
        let host = self.engine.host(dir, via_of(shard))?;
        perm::check_search(c, &host.obj, dir)?;
        let mut found = Vec::with_capacity(names.len());
        let mut bytes = 0;
        for name in names {
            let e = self.engine.store().get_entry(host.obj.ino, name).map_err(eio)?;
            bytes += name.len() + e.as_ref().map_or(1, |i| encode(i).len());
            if bytes > MAX_ENTRIES_BYTES && !found.is_empty() {
                break; // the holder asks for the rest again
            }
            found.push(e);
        }
        Ok(Reply::Entries(found))
    }

    /// Forgets ended delegations older than [`KEEP_ENDED_SECS`].
    async fn prune_ended(&self) {
        let old = self.delegs.ended_before(unix_now().saturating_sub(KEEP_ENDED_SECS));
        if old.is_empty() {
            return;
        }
        let mut b = Batch::new();
        old.iter().for_each(|id| b.del_log(LogKind::Deleg, *id));
        if self.engine.apply(b).await.is_ok() {
            self.delegs.forget(&old);
        }
    }

    /// `DelegWait` from `c`: the delegations of `session` (its own) recalled here, once
    /// there are any.
    pub(crate) async fn deleg_wait(self: &Arc<Self>, session: u64, c: &Call) -> OpResult<Reply> {
        if session != c.session {
            return Err(err(Errno::EPERM, "a client waits only for its own session's recalls"));
        }
        let wait = (self.recall_timeout() / 4).clamp(Duration::from_millis(10), MAX_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        let out = loop {
            let wait = self.delegs.changed();
            tokio::pin!(wait);
            wait.as_mut().enable();
            let ids = self.delegs.take_recalls(session);
            if !ids.is_empty() || tokio::time::Instant::now() >= deadline {
                break ids;
            }
            let _ = tokio::time::timeout_at(deadline, wait).await;
        };
        Ok(Reply::Recalls(out))
    }

    /// Delegations held on this server (for `cluster status`).
    pub(crate) fn delegations_held(&self) -> u64 {
        self.delegs.live_count() as u64
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::call::Call;
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{DelegOp, FileKind, Reply, Threshold, Timespec};

    async fn flush(kit: &Kit, id: u64, cred: &Call, op: &DelegOp) {
        let deleg = &kit.osd.deleg;
        deleg.deleg_flush("/d", id, 1, vec![cred.cred().clone()], vec![op.clone()], false, cred).await.unwrap();
    }

    #[tokio::test]
    async fn a_write_back_is_applied_once_even_when_resent_after_a_crash() {
        let kit = Kit::new().await;
        let plan = crate::twopc::Plan::now(&kit.osd.engine);
        let policy = (Threshold::Never, 0);
        kit.osd.twopc.mkdir(plan, "/d", 0o755, (0, 0), policy, Via::Home, &root()).await.unwrap();
        let cred = Call::new(plusfs_proto::Cred { session: 7, ..root().cred().clone() });
        let grant = kit.osd.deleg.deleg_acquire("/d", false, Via::Home, &cred).await.unwrap();
        let Reply::Deleg(g) = grant else { panic!("a grant: {grant:?}") };
        assert!(g.ino_count > 0, "a writer gets inode numbers");
        let create = DelegOp::Create {
            name: "f".into(),
            ino: g.first_ino,
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            target: None,
            time: Timespec::now(),
            by: 0,
        };
        flush(&kit, g.id, &cred, &create).await;
        let kit = kit.crash_and_restart().await;
        assert_eq!(kit.osd.deleg.delegations_held(), 1, "the grant is kept across the crash");
        flush(&kit, g.id, &cred, &create).await;
        let d = kit.osd.engine.dir_object("/d").unwrap();
        assert_eq!(d.entries, 1, "applied once");
        assert_eq!(kit.osd.engine.store().get_entry(d.ino, "f").unwrap().map(|e| e.ino), Some(g.first_ino));
    }
}
