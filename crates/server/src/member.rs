//! A member of a replicated server slot: its replica group, the wait for leadership, the
//! take-over and the step-down.
//!
//! Every member runs the group (its Raft log and its copy of the slot's store) from the
//! start and answers requests with redirects (`front`). When it becomes leader it first
//! waits until it has applied everything committed before its term (a read-index round),
//! then makes its store write through the group and opens the engine over it exactly as a
//! restarting server does: unfinished two-phase commits, Cx operations and redistributions
//! are recovered from the replicated store, on whichever member leads. From then on it
//! serves. When it stops leading (a higher term, or no quorum acknowledged it for twice
//! the longest election timeout: it is cut off) it ends with [`Exit::Deposed`]; the process then starts
//! afresh as a follower, so no in-memory state of its reign (locks, pending Cx operations,
//! delegations) outlives it.

use crate::front::{Front, Member};
use crate::replica_data::{Sink, Source};
use crate::{net, open_data, open_over, open_store, Exit, ServerConfig, StartError};
use plusfs_replica::{Group, Timing};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The group's timing from the map's `[replication]`, and two durations derived from it:
/// the lease (how long after a quorum's acknowledgement a leader serves without
/// confirming again: three quarters of the election timeout's minimum, the margin covering
/// the delay of the acknowledgement's report), and the silence after which a leader no
/// quorum acknowledged stops serving (twice the election timeout's maximum, so a loaded
/// machine's late heartbeats do not depose a healthy one).
fn timing(map: &plusfs_placement::ClusterMap) -> (Timing, Duration, Duration) {
    let r = &map.replication;
    let timing = Timing {
        heartbeat: Duration::from_millis(r.heartbeat_ms),
        election: (Duration::from_millis(r.election_min_ms), Duration::from_millis(r.election_max_ms)),
        snapshot_every: r.snapshot_every,
        keep_behind_snapshot: (r.snapshot_every / 4).max(50),
        fsync_log: r.fsync_log,
    };
    if broken_lease() {
        tracing::warn!("PLUSFS_BROKEN=lease: this leader serves reads after it is cut off (a broken build)");
        return (timing, Duration::from_secs(3600), Duration::from_secs(3600));
    }
    (timing, Duration::from_millis(r.election_min_ms * 3 / 4), Duration::from_millis(r.election_max_ms * 2))
}

/// A deliberately broken build, for the history checker to show it catches one (builds
/// with failpoints only): with `PLUSFS_BROKEN=lease` a leader's lease lasts an hour and
/// it is never deposed for silence, so a leader cut off from its group goes on answering
/// reads from its own store after another member was elected and took writes.
fn broken_lease() -> bool {
    cfg!(feature = "failpoints") && std::env::var("PLUSFS_BROKEN").is_ok_and(|v| v == "lease")
}

/// Runs member `config.member` of replicated server `config.id`: serves `listener` (as
/// leader, or with redirects) until `shutdown`, or until it is deposed.
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    security: Option<Arc<crate::security::Security>>,
    shutdown: watch::Receiver<bool>,
) -> Result<Exit, StartError> {
    let server = config.id;
    let entry = config.map.server(server).ok_or(StartError::UnknownId(server))?;
    let id = config.member.ok_or(StartError::MemberNeeded(server))?;
    let me = entry.member(id).ok_or(StartError::UnknownMember { server, member: id })?;
    let store = open_store(&config)?;
    let raft_addr = config.raft_listen.clone().unwrap_or_else(|| me.raft.clone());
    let raft_listener =
        TcpListener::bind(&raft_addr).await.map_err(|source| StartError::Listen { addr: raft_addr.clone(), source })?;
    let group_err = |source| StartError::Group { server, source };
    let sink = Arc::new(Sink {
        turn: Default::default(),
        member: id,
        leading: Default::default(),
        dir: config.data_dir.join("data"),
        store: store.clone(),
        // Placed records are made durable before their entry counts as applied, whatever
        // `sync` says (see `open_data`).
        sync: true,
    });
    let dir = config.data_dir.join("replica");
    let (timing, lease, silence) = timing(&config.map);
    let raft_tls = match &security {
        None => None,
        Some(s) => {
            let client = plusfs_rpc::client_tls(&config.map.tls)
                .map_err(|e| plusfs_tls::CertError::Bad { path: dir.clone(), reason: e.to_string() })?
                .expect("a cluster with TLS");
            Some(plusfs_replica::net::RaftTls { client, server: s.server_tls() })
        }
    };
    let sink_dyn: Arc<dyn plusfs_replica::DataSink> = sink.clone();
    let group = Group::start_with(id, &dir, (store.db().clone(), Some(sink_dyn)), raft_listener, &timing, raft_tls)
        .await
        .map_err(group_err)?;
    let unflushed = {
        let store = store.clone();
        Box::new(move || plusfs_store::DirStore::upkeep_room(&*store))
    };
    let space = Arc::new(crate::space::Space::new(config.data_dir.clone(), config.map.data.reserve_bytes, unflushed));
    // Before it can stand for election (its timeout is hundreds of milliseconds).
    group.set_room(space.member_room(0));
    // A new group is made once, by its lowest member, when the cluster is created.
    if config.bootstrap && entry.members.iter().map(|m| m.id).min() == Some(id) {
        let members: BTreeMap<u64, plusfs_replica::Node> =
            entry.members.iter().map(|m| (m.id, plusfs_replica::Node::new(&m.raft, &m.address))).collect();
        group.initialize(&members).await.map_err(group_err)?;
    }
    let member = Arc::new(Member {
        server,
        group,
        map: config.map.clone(),
        lease,
        data: sink.clone(),
        store: store.clone(),
        running: Default::default(),
    });
    let front = Front::member(member.clone(), space.clone());
    front.keep_space(store.clone());
    tracing::info!(server, member = id, addr = %me.address, raft = %me.raft, "member ready; serving once it leads");
    let metrics = crate::endpoint::start(me.metrics.as_deref(), &front).await;
    let serving = tokio::spawn(net::serve(listener, front.clone(), security, shutdown.clone()));
    let collector = tokio::spawn(collect_while_following(sink.clone()));
    let (full_tx, full) = watch::channel(false);
    let room_watch = tokio::spawn(watch_room(member.clone(), space.clone(), full_tx));
    let exit =
        lead(&config, store, &member, (&sink, collector), &front, (shutdown.clone(), silence, full.clone())).await;
    room_watch.abort();
    match &exit {
        Ok(Exit::Deposed(why)) => tracing::warn!(server, member = id, why, "no longer leads; restarting as a follower"),
        Ok(Exit::Stopped) => {}
        Err(e) => tracing::error!(server, member = id, cause = %e, "member failed"),
    }
    // Raft first: requests waiting for a commit that will not come fail, so the requests
    // in flight end.
    member.group.halt().await;
    if exit.as_ref().is_ok_and(|e| *e == Exit::Stopped) {
        let _ = serving.await;
    }
    if *full.borrow() && exit.as_ref().is_ok_and(|e| *e != Exit::Stopped) {
        // A restart opens the stores again, which writes files: not on a full disk.
        if !wait_for_room(&space, shutdown).await {
            return Ok(Exit::Stopped);
        }
    }
    if let Some(m) = metrics {
        m.abort();
    }
    exit
}

/// Waits until this member leads, takes over, serves until deposed or stopped.
async fn lead(
    config: &ServerConfig,
    store: Arc<plusfs_store::RocksStore>,
    member: &Member,
    (sink, collector): (&Arc<Sink>, tokio::task::JoinHandle<()>),
    front: &Front,
    (mut shutdown, silence, mut full): (watch::Receiver<bool>, Duration, watch::Receiver<bool>),
) -> Result<Exit, StartError> {
    let group = &member.group;
    let term = loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(Exit::Stopped),
            _ = group.until_leader() => {}
        }
        let term = group.status().term;
        // Everything committed before this take-over is applied here before anything is
        // served (the take-over reads the store: Cx and 2PC records, id counters). A
        // read barrier alone does not promise it to a member that leads again in the same
        // term after a restart (its committed index on disk may lag what clients were
        // told); an entry of its own, once applied, does.
        let settled = async {
            group.read_barrier().await?;
            group.write(Vec::new()).await
        };
        match tokio::time::timeout(silence, settled).await {
            Ok(Ok(())) if group.is_leader() && group.status().term == term => break term,
            Ok(Ok(())) => tracing::debug!("lead lost before the take-over"),
            Ok(Err(e)) => tracing::debug!(cause = %e, "lead lost before the take-over"),
            Err(_) => tracing::debug!("no quorum confirmed the lead before the take-over"),
        }
        tokio::time::sleep(silence / 8).await;
    };
    // No more collection of this member's segments: its compaction takes over. One that
    // runs now is waited for.
    collector.abort();
    let s = sink.clone();
    let _ = tokio::task::spawn_blocking(move || drop(s.turn.lock())).await;
    let store_err = |source| StartError::Store { path: config.data_dir.display().to_string(), source };
    // Every record placed so far is in place: the data store opens over them and appends
    // from a new segment.
    let data = open_data(config, true)?;
    // From now on, entries of this term carry records this data store appended.
    sink.leading.store(term, std::sync::atomic::Ordering::Release);
    let source = Arc::new(Source(data.clone()));
    store.replicate_through(Arc::new(group.replicator()), Some(source)).map_err(store_err)?;
    let peers = crate::Pool::new(&config.map, 2, 0);
    let osd = match open_over(config, store, data, peers, Arc::default()).await {
        Ok(osd) => osd,
        Err(e) => return Ok(Exit::Deposed(format!("the take-over failed: {e}"))),
    };
    front.take_over(osd.clone());
    let expiry = tokio::spawn(crate::once::expire(osd, member.store.clone()));
    tracing::info!(server = config.id, member = group.id, term, "leads its replica group: serving");
    let exit = tokio::select! {
        _ = shutdown.changed() => Ok(Exit::Stopped),
        why = group.deposed(term, silence) => Ok(Exit::Deposed(why)),
        // Another member takes over (this one does not stand while its disk is full).
        _ = full.wait_for(|full| *full) => Ok(Exit::Deposed("its disk is full".into())),
    };
    expiry.abort();
    exit
}

/// How often a member looks whether its disk still has room for the group's entries.
const ROOM_EVERY: Duration = Duration::from_millis(250);
/// Room past the floor a member that lost it must see before it takes entries again.
const ROOM_AGAIN: u64 = 32 << 20;

/// Keeps the group told whether this member's disk has room for its entries (see
/// `Group::set_room`), and `full` whether it has none.
async fn watch_room(member: Arc<Member>, space: Arc<crate::space::Space>, full: watch::Sender<bool>) {
    let mut room = space.member_room(0);
    // This reading, not the one taken at start-up, is what the group goes by from now on.
    member.group.set_room(room);
    loop {
        full.send_if_modified(|f| std::mem::replace(f, !room) == room);
        tokio::time::sleep(ROOM_EVERY).await;
        let now = space.member_room(if room { 0 } else { ROOM_AGAIN });
        if now != room {
            room = now;
            member.group.set_room(room);
        }
    }
}

/// Waits (not serving, not in its group) until the disk has room again; false if the
/// member is stopped meanwhile.
async fn wait_for_room(space: &crate::space::Space, mut shutdown: watch::Receiver<bool>) -> bool {
    tracing::warn!("waiting for room on the disk before rejoining the group");
    while !space.member_room(ROOM_AGAIN) {
        tokio::select! {
            _ = shutdown.changed() => return false,
            _ = tokio::time::sleep(ROOM_EVERY) => {}
        }
    }
    true
}

/// How often a member that does not lead deletes the data segments nothing refers to.
const COLLECT_EVERY: Duration = Duration::from_secs(30);

/// Deletes unreferenced data segments while this member follows (a leader's compaction
/// deletes its own); aborted at the take-over.
async fn collect_while_following(sink: Arc<Sink>) {
    loop {
        tokio::time::sleep(COLLECT_EVERY).await;
        let s = sink.clone();
        match tokio::task::spawn_blocking(move || s.collect()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::debug!(segments = n, "deleted data segments nothing refers to"),
            Ok(Err(e)) => tracing::warn!(cause = %e, "cannot collect data segments"),
            Err(_) => return,
        }
    }
}
