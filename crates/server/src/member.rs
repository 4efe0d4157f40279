//! A member of a replicated server slot: its replica group, the wait for leadership, the
//! take-over and the step-down.
//!
//! Every member runs the group (its Raft log and its copy of the slot's store) from the
//! start and answers requests with redirects (`front`). When it becomes leader it first
//! waits until it has applied everything committed before its term (a read-index round),
//! then makes its store write through the group and opens the engine over it exactly as a
//! restarting server does: unfinished two-phase commits, Cx operations and redistributions
//! are recovered from the replicated store, on whichever member leads. From then on it
//! serves. When it stops leading (a higher term, or no quorum acknowledged it for
//! [`SILENCE`]: it is cut off) it ends with [`Exit::Deposed`]; the process then starts
//! afresh as a follower, so no in-memory state of its reign (locks, pending Cx operations,
//! delegations) outlives it.

use crate::front::{Front, Member};
use crate::{net, open_over, open_store, Exit, ServerConfig, StartError};
use plusfs_replica::{Group, Timing};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long after a quorum's acknowledgement a leader serves without confirming again:
/// well under the election timeout's minimum (400 ms), the margin covering the delay of
/// the acknowledgement's report.
const LEASE: Duration = Duration::from_millis(300);

/// A leader that no quorum acknowledged for this long stops serving: twice the election
/// timeout's maximum, so a loaded machine's late heartbeats do not depose a healthy one.
const SILENCE: Duration = Duration::from_millis(1600);

/// Runs member `config.member` of replicated server `config.id`: serves `listener` (as
/// leader, or with redirects) until `shutdown`, or until it is deposed.
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Result<Exit, StartError> {
    let server = config.id;
    let entry = config.map.server(server).ok_or(StartError::UnknownId(server))?;
    let id = config.member.ok_or(StartError::MemberNeeded(server))?;
    let me = entry.member(id).ok_or(StartError::UnknownMember { server, member: id })?;
    let store = open_store(&config)?;
    let raft_listener =
        TcpListener::bind(&me.raft).await.map_err(|source| StartError::Listen { addr: me.raft.clone(), source })?;
    let group_err = |source| StartError::Group { server, source };
    let group =
        Group::start(id, &config.data_dir.join("replica"), store.db().clone(), raft_listener, &Timing::default())
            .await
            .map_err(group_err)?;
    // A new group is made once, by its lowest member, when the cluster is created.
    if config.bootstrap && entry.members.iter().map(|m| m.id).min() == Some(id) {
        let members: BTreeMap<u64, String> = entry.members.iter().map(|m| (m.id, m.raft.clone())).collect();
        group.initialize(&members).await.map_err(group_err)?;
    }
    let member = Arc::new(Member { server, group, map: config.map.clone(), lease: LEASE });
    let front = Front::member(member.clone());
    tracing::info!(server, member = id, addr = %me.address, raft = %me.raft, "member ready; serving once it leads");
    let serving = tokio::spawn(net::serve(listener, front.clone(), shutdown.clone()));
    let exit = lead(&config, store, &member, &front, shutdown).await;
    match &exit {
        Ok(Exit::Deposed(why)) => tracing::warn!(server, member = id, why, "no longer leads; restarting as a follower"),
        Ok(Exit::Stopped) => {
            let _ = serving.await;
        }
        Err(e) => tracing::error!(server, member = id, cause = %e, "member failed"),
    }
    if let Ok(m) = Arc::try_unwrap(member) {
        m.group.stop().await;
    }
    exit
}

/// Waits until this member leads, takes over, serves until deposed or stopped.
async fn lead(
    config: &ServerConfig,
    store: Arc<plusfs_store::RocksStore>,
    member: &Member,
    front: &Front,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Exit, StartError> {
    let group = &member.group;
    let term = loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(Exit::Stopped),
            _ = group.until_leader() => {}
        }
        let term = group.status().term;
        // Everything committed before this term is applied here before anything is served.
        match group.read_barrier().await {
            Ok(()) => break term,
            Err(e) => tracing::debug!(cause = %e, "lead lost before the take-over"),
        }
    };
    let store_err = |source| StartError::Store { path: config.data_dir.display().to_string(), source };
    store.replicate_through(Arc::new(group.replicator())).map_err(store_err)?;
    let peers = crate::Pool::new(&config.map, 2, 0);
    let osd = match open_over(config, store, peers, Arc::default()).await {
        Ok(osd) => osd,
        Err(e) => return Ok(Exit::Deposed(format!("the take-over failed: {e}"))),
    };
    front.take_over(osd);
    tracing::info!(server = config.id, member = group.id, term, "leads its replica group: serving");
    tokio::select! {
        _ = shutdown.changed() => Ok(Exit::Stopped),
        why = group.deposed(term, SILENCE) => Ok(Exit::Deposed(why)),
    }
}
