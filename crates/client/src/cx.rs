//! The client's side of two-server operations (mkdir, rmdir) under the cluster's
//! `[txn] protocol`:
//!
//! - `cx` (seed 004 §III): both sub-operations go out at once with one operation id; two
//!   YES answers with equal conflict hints end the call (commitment happens later on the
//!   servers); two NO answers with equal hints end it with the error; anything else sends
//!   L-COM (`CxLaunch`) to the coordinator, which commits or aborts both sides at once.
//! - `serial` (OrangeFS, seed 004 Fig. 1(b)): the participant's sub-operation, then the
//!   coordinator's; if that fails, a CLEAR (the undo the participant returned).
//! - `2pc`: one request; the parent's server runs the two-phase commit.

use crate::error::FsError;
use crate::fs::Client;
use plusfs_placement::TxnProtocol;
use plusfs_proto::{
    Attr, CxAnswer, CxRole, DirObject, Errno, Inode, OpId, Replace, Reply, Request, ServerId, SubOp, Threshold,
    WireError,
};
use std::sync::atomic::Ordering;

/// Inode numbers leased per `AllocInos` request.
const INO_LEASE: u32 = 1024;
/// Attempts of a Cx operation that lost a conflict (EBUSY) or met a stale distribution.
const MAX_ATTEMPTS: u32 = 10;

fn process_id() -> u32 {
    std::process::id()
}

/// One side of a two-server operation: its server and sub-operations.
struct Side {
    server: ServerId,
    ops: Vec<SubOp>,
}

/// How a Cx attempt ended.
enum Ended {
    /// Done; the attributes of the directory made, when a server said.
    Done(Option<Attr>),
    Failed(WireError),
}

/// How a two-server operation the client drives ended.
enum Driven {
    /// Done; the attributes of the directory made, when a server said.
    Done(Option<Attr>),
    /// Both sides are now on one server (a newer map, or a shard of a distributed parent),
    /// where only an admin may send the serial sub-operations: the caller sends it to the
    /// parent's server as one request instead.
    ViaParent,
}

impl Client {
    fn next_op_id(&self) -> OpId {
        OpId { client: self.cx.client, process: process_id(), seq: self.cx.seq.fetch_add(1, Ordering::Relaxed) }
    }

    /// A fresh inode number for a directory homed on `server`, from this client's lease
    /// of that server (leasing more when it is used up).
    async fn leased_ino(&self, server: ServerId, shown: &str) -> Result<u64, FsError> {
        {
            let mut all = self.cx.inos.lock().expect("ino lease");
            if let Some(l) = all.get_mut(&server).filter(|l| l.0 < l.1) {
                l.0 += 1;
                return Ok(l.0 - 1);
            }
        }
        let r = self.rpc("create directory", shown, server, Request::AllocInos { count: INO_LEASE }).await?;
        let Reply::Inos { first, count } = r else {
            return Err(FsError::new("create directory", shown, Errno::EIO).with_detail("unexpected reply"));
        };
        self.cx.inos.lock().expect("ino lease").insert(server, (first + 1, first + count as u64));
        Ok(first)
    }

    /// Whether a two-server operation on `p` (in `parent`, as `name`) goes to the parent's
    /// server as one request (`Mkdir`, `Rmdir`), which runs it by two-phase commit: under
    /// that protocol, and for a client that is no admin when its own protocol would need
    /// requests only admins may send (serial sub-operations, both sides on one server).
    fn via_parent(&self, p: &str, (parent, name): (&str, &str)) -> bool {
        match self.map().txn.protocol {
            TxnProtocol::TwoPhase => true,
            _ if self.trusted => false,
            TxnProtocol::Serial => true,
            TxnProtocol::Cx => self.home(p) == self.locate(parent, name).0,
        }
    }

    /// `mkdir` of `p` (in `parent`, as `name`) under the cluster's protocol.
    pub(crate) async fn mkdir_two_server(
        &self,
        raw: &str,
        p: &str,
        (parent, name): (&str, &str),
        mode: u32,
        (threshold, width): (Threshold, u32),
    ) -> Result<Attr, FsError> {
        const OP: &str = "create directory";
        let two_phase = || async {
            let req = Request::Mkdir { path: p.into(), mode, uid: self.opts.uid, gid: self.opts.gid, threshold, width };
            match self.entry_rpc(OP, raw, parent, name, req).await?.0 {
                Reply::Attr(a) => Ok(a),
                other => Err(FsError::new(OP, raw, Errno::EIO).with_detail(format!("unexpected reply {other:?}"))),
            }
        };
        if self.via_parent(p, (parent, name)) {
            return two_phase().await;
        }
        let home = self.home(p);
        let mut object = DirObject::new(self.leased_ino(home, raw).await?, mode, self.opts.uid, self.opts.gid);
        object.dist.threshold = threshold;
        object.dist.width = width;
        let predicted = Attr::of_dir(&object);
        let ino = object.ino;
        let participant = Side { server: home, ops: vec![SubOp::CreateDir { path: p.into(), object }] };
        let made = self
            .two_server(OP, raw, parent, name, participant, |shard| SubOp::InsertEntry {
                dir: parent.into(),
                name: name.into(),
                // The owner, for the sticky-directory check of its parent's server.
                inode: Inode { uid: self.opts.uid, ..Inode::subdir(ino) },
                replace: Replace::Never,
                shard,
            })
            .await;
        let made = match made {
            // The home forgot this client's lease (it restarted): lease anew next time;
            // this one goes through the parent's server. The Cx attempt was aborted.
            Err(e) if e.errno == Errno::ESTALE => {
                self.cx.inos.lock().expect("ino lease").remove(&home);
                return two_phase().await;
            }
            Ok(Driven::ViaParent) => return two_phase().await,
            Ok(Driven::Done(made)) => made,
            Err(e) => return Err(e),
        };
        let cluster = match self.map().hugedirs.threshold_entries() {
            Some(n) => Threshold::Entries(n),
            None => Threshold::Never,
        };
        if threshold.resolve(cluster) == Threshold::Entries(0) {
            // Distributed from creation: its home distributes it now.
            let req = Request::SetPolicy { path: p.into(), threshold: None, width: None };
            if let Err(e) = self.rpc(OP, raw, home, req).await {
                tracing::warn!(path = p, cause = %e, "cannot distribute a new directory yet");
            }
        }
        // The server's word (Cx, serial, one server); what was asked if it gave none.
        Ok(made.unwrap_or(predicted))
    }

    /// `rmdir` of `p` (in `parent`, as `name`) under the cluster's protocol.
    pub(crate) async fn rmdir_two_server(
        &self,
        raw: &str,
        p: &str,
        (parent, name): (&str, &str),
    ) -> Result<(), FsError> {
        const OP: &str = "remove directory";
        let two_phase =
            || async { self.entry_rpc(OP, raw, parent, name, Request::Rmdir { path: p.into() }).await.map(drop) };
        if self.via_parent(p, (parent, name)) {
            return two_phase().await;
        }
        let participant =
            Side { server: self.home(p), ops: vec![SubOp::RemoveDir { path: p.into(), ino: 0, shards: vec![] }] };
        let removed = self
            .two_server(OP, raw, parent, name, participant, |shard| SubOp::RemoveEntry {
                dir: parent.into(),
                name: name.into(),
                ino: 0,
                shard,
            })
            .await;
        match removed {
            // A distributed directory: its shards go too, which takes more than two servers.
            Err(e) if e.errno == Errno::EREMCHG => two_phase().await,
            Ok(Driven::ViaParent) => two_phase().await,
            r => r.map(drop),
        }
    }

    /// Runs a two-server operation: the coordinator's sub-operation is built for the
    /// entry's current location (`shard`), the participant's is fixed.
    async fn two_server(
        &self,
        op: &'static str,
        raw: &str,
        dir: &str,
        name: &str,
        mut participant: Side,
        coordinator_op: impl Fn(Option<u64>) -> SubOp,
    ) -> Result<Driven, FsError> {
        let mut waiting = crate::routing::distribution_wait();
        for attempt in 0..MAX_ATTEMPTS {
            // A newer map (learnt from a refusal) may home the directory elsewhere.
            if let Some(SubOp::CreateDir { path, .. } | SubOp::RemoveDir { path, .. }) = participant.ops.first() {
                participant.server = self.home(path);
            }
            let (server, shard) = self.locate(dir, name);
            let coordinator = Side { server, ops: vec![coordinator_op(shard)] };
            let ended = match self.map().txn.protocol {
                // Both objects on one server: one local store write makes it atomic (a
                // client that is no admin asks the parent's server to do it).
                _ if server == participant.server && !self.trusted => return Ok(Driven::ViaParent),
                _ if server == participant.server => self.one_server(&coordinator, &participant).await,
                TxnProtocol::Serial => self.serial(&coordinator, &participant).await,
                _ => self.cx_run(&coordinator, &participant).await,
            };
            let e = match ended {
                Ok(Ended::Done(made)) => return Ok(Driven::Done(made)),
                Ok(Ended::Failed(e)) => e,
                Err(call) => return Err(FsError { op, path: raw.to_string(), ..call }),
            };
            if e.errno == Errno::EREMCHG && e.redirect.as_ref().is_some_and(|i| i.path != dir) {
                // The participant's directory is distributed: the caller decides.
                return Err(FsError::new(op, raw, Errno::EREMCHG).with_detail(e.message));
            }
            match self.reroute(dir, shard, e) {
                crate::routing::Reroute::Retry => {}
                crate::routing::Reroute::Wait if waiting.wait().await => {}
                crate::routing::Reroute::Wait => break,
                crate::routing::Reroute::Fail(e) if e.errno == Errno::EBUSY && attempt + 1 < MAX_ATTEMPTS => {
                    // Lost a conflict to another client's operation: again, after a pause.
                    let pause = (attempt as u64 + 1) * (1 + self.cx.seq.load(Ordering::Relaxed) % 7);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                crate::routing::Reroute::Fail(e) => return Err(self.server_error(op, raw, e).await),
            }
        }
        Err(FsError::new(op, raw, Errno::EAGAIN).with_detail("the operation kept conflicting with others"))
    }

    async fn call(&self, server: ServerId, req: &Request) -> Result<Result<Reply, WireError>, FsError> {
        self.send(server, req)
            .await
            .map_err(|e| FsError::new("reach", format!("server {server}"), e.errno()).with_detail(e.to_string()))
    }

    /// One Cx attempt (seed 004 §III.B–C).
    async fn cx_run(&self, coordinator: &Side, participant: &Side) -> Result<Ended, FsError> {
        let id = self.next_op_id();
        // Servers check a bounded identity's inode numbers against its leases (and set
        // `leased` for it whatever it sends); an admin's numbers are its own business.
        let leased = !self.trusted;
        let exec = |side: &Side, role, peer| Request::CxExec { op: id, role, peer, ops: side.ops.clone(), leased };
        let to_coord = exec(coordinator, CxRole::Coordinator, participant.server);
        let to_part = exec(participant, CxRole::Participant, coordinator.server);
        let (c, p) = tokio::join!(self.call(coordinator.server, &to_coord), self.call(participant.server, &to_part));
        // A participant that refuses the leased inode number refuses before executing.
        let stale = match &p {
            Ok(Err(e)) if e.errno == Errno::ESTALE => Some(e.clone()),
            _ => None,
        };
        let answer = |r: Result<Result<Reply, WireError>, FsError>| match r {
            Ok(Ok(Reply::CxAnswer(a))) => Some(a),
            _ => None,
        };
        let (c, p) = (answer(c), answer(p));
        if let (Some(c), Some(p)) = (&c, &p) {
            if c.hint == p.hint {
                match (&c.error, &p.error) {
                    (None, None) => return Ok(Ended::Done(p.made.clone())),
                    (Some(e), Some(_)) => return Ok(Ended::Failed(e.clone())),
                    _ => {}
                }
            }
        }
        // Disagreement, unequal hints or a lost answer: L-COM, and the coordinator's word.
        let launch = Request::CxLaunch { op: id, participant: participant.server };
        match self.call(coordinator.server, &launch).await? {
            Ok(Reply::CxOutcome { committed: true }) => Ok(Ended::Done(p.and_then(|a| a.made))),
            Ok(Reply::CxOutcome { committed: false }) => {
                let first_no = stale.or_else(|| [c, p].into_iter().flatten().find_map(|a: CxAnswer| a.error));
                Ok(Ended::Failed(
                    first_no.unwrap_or_else(|| {
                        WireError::new(Errno::EBUSY, "the operation was aborted by a conflicting one")
                    }),
                ))
            }
            Ok(other) => Err(FsError::new("reach", "coordinator", Errno::EIO).with_detail(format!("{other:?}"))),
            Err(e) => Err(FsError::new("reach", "coordinator", e.errno).with_detail(e.message)),
        }
    }

    /// Both sides on one server: all sub-operations in one `SubExec`.
    async fn one_server(&self, coordinator: &Side, participant: &Side) -> Result<Ended, FsError> {
        let ops = coordinator.ops.iter().chain(&participant.ops).cloned().collect();
        match self.call(coordinator.server, &Request::SubExec { ops }).await? {
            Ok(Reply::Undo { made, .. }) => Ok(Ended::Done(made)),
            Ok(_) => Ok(Ended::Done(None)),
            Err(e) => Ok(Ended::Failed(e)),
        }
    }

    /// One serial attempt: participant, then coordinator, CLEAR on failure.
    async fn serial(&self, coordinator: &Side, participant: &Side) -> Result<Ended, FsError> {
        let (undo, made) = match self
            .call(participant.server, &Request::SubExec { ops: participant.ops.clone() })
            .await?
        {
            Ok(Reply::Undo { ops, made }) => (ops, made),
            Ok(other) => return Err(FsError::new("reach", "participant", Errno::EIO).with_detail(format!("{other:?}"))),
            Err(e) => return Ok(Ended::Failed(e)),
        };
        match self.call(coordinator.server, &Request::SubExec { ops: coordinator.ops.clone() }).await? {
            Ok(_) => Ok(Ended::Done(made)),
            Err(e) => {
                // CLEAR: take the participant's part back.
                match self.call(participant.server, &Request::SubExec { ops: undo }).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(clear)) => tracing::warn!(cause = %clear.message, "CLEAR failed: an orphan is left"),
                    Err(clear) => tracing::warn!(cause = %clear, "CLEAR not delivered: an orphan is left"),
                }
                Ok(Ended::Failed(e))
            }
        }
    }
}
