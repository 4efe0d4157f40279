//! Raft's messages between the members of a group, over TCP (mutual TLS when the cluster
//! uses it: both ends present the server identity, and a member only answers servers): a
//! request is a length, a kind byte and the postcard-encoded message; the reply is a length
//! and the encoded `Result` of the receiving member's Raft. Connections are pooled per
//! address and opened on first use (Raft asks for a client on every linearizable read).

use crate::Node;
use crate::{MemberId, Raft, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const APPEND: u8 = 1;
const VOTE: u8 = 2;
const SNAPSHOT: u8 = 3;
/// Largest message accepted (snapshot chunks are a few MiB).
const MAX_FRAME: usize = 256 << 20;
/// Most bytes of entries sent in one AppendEntries when there is more than one: Raft
/// allows it one heartbeat period, and a follower that is behind must still catch up.
pub const APPEND_BUDGET: usize = 4 << 20;
/// How long connecting to a member may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A byte stream between members: plain TCP or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Stream for S {}

type Pool = Arc<Mutex<HashMap<String, Vec<Box<dyn Stream>>>>>;

/// Both TLS ends of a member (its server identity).
#[derive(Clone)]
pub struct RaftTls {
    pub client: Arc<plusfs_tls::ClientTls>,
    pub server: Arc<plusfs_tls::ServerTls>,
}

/// Opens clients to the other members (one pool of connections for all).
#[derive(Clone, Default)]
pub struct Network {
    pool: Pool,
    tls: Option<RaftTls>,
}

impl Network {
    /// A network over TLS with `tls` (none: plain TCP).
    pub fn new(tls: Option<RaftTls>) -> Network {
        Network { pool: Pool::default(), tls }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: MemberId, node: &Node) -> Peer {
        let tls = self.tls.as_ref().map(|t| t.client.clone());
        Peer { target, addr: node.raft.clone(), pool: self.pool.clone(), tls }
    }
}

/// A client of one member.
pub struct Peer {
    target: MemberId,
    addr: String,
    pool: Pool,
    tls: Option<Arc<plusfs_tls::ClientTls>>,
}

/// Why a call failed before the member answered.
enum CallError {
    Connect(std::io::Error),
    Io(std::io::Error),
}

impl Peer {
    async fn connection(&self) -> Result<Box<dyn Stream>, CallError> {
        if let Some(s) = self.pool.lock().get_mut(&self.addr).and_then(Vec::pop) {
            return Ok(s);
        }
        let timed_out = || CallError::Connect(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"));
        let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| timed_out())?
            .map_err(CallError::Connect)?;
        let _ = s.set_nodelay(true);
        match &self.tls {
            None => Ok(Box::new(s)),
            Some(tls) => {
                let s = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(s))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(CallError::Connect)?;
                Ok(Box::new(s))
            }
        }
    }

    /// Sends one message and reads the answer. A connection goes back to the pool only
    /// after a whole exchange (a call cut short by Raft's timeout drops it).
    async fn call<Resp: DeserializeOwned>(&self, kind: u8, body: &[u8]) -> Result<Resp, CallError> {
        let mut s = self.connection().await?;
        let mut frame = Vec::with_capacity(5 + body.len());
        frame.extend_from_slice(&((body.len() + 1) as u32).to_be_bytes());
        frame.push(kind);
        frame.extend_from_slice(body);
        s.write_all(&frame).await.map_err(CallError::Io)?;
        // TLS may hold back records until flushed.
        s.flush().await.map_err(CallError::Io)?;
        let reply = read_frame(&mut s).await.map_err(CallError::Io)?;
        let out = postcard::from_bytes(&reply).map_err(|e| CallError::Io(std::io::Error::other(e)))?;
        self.pool.lock().entry(self.addr.clone()).or_default().push(s);
        Ok(out)
    }

    async fn rpc<Resp: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        kind: u8,
        body: &[u8],
    ) -> Result<Resp, RPCError<MemberId, Node, RaftError<MemberId, E>>> {
        match self.call::<Result<Resp, RaftError<MemberId, E>>>(kind, body).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(CallError::Connect(e)) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(CallError::Io(e)) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<MemberId>, RPCError<MemberId, Node, RaftError<MemberId>>> {
        let body = encode_rpc(&rpc)?;
        let n = rpc.entries.len();
        if n > 1 && body.len() > APPEND_BUDGET {
            // Too much for one message: Raft sends fewer entries at a time.
            let hint = (n as u64 * APPEND_BUDGET as u64 / body.len() as u64).max(1);
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint)));
        }
        self.rpc(APPEND, &body).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<MemberId>, RPCError<MemberId, Node, RaftError<MemberId, InstallSnapshotError>>>
    {
        self.rpc(SNAPSHOT, &encode_rpc(&rpc)?).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<MemberId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<MemberId>, RPCError<MemberId, Node, RaftError<MemberId>>> {
        self.rpc(VOTE, &encode_rpc(&rpc)?).await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // After `Unreachable`: try again soon, so a restarted member rejoins quickly.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

/// A message's encoding (a failure is a local one, reported as a network error).
fn encode_rpc<T: Serialize, E: std::error::Error>(v: &T) -> Result<Vec<u8>, RPCError<MemberId, Node, E>> {
    postcard::to_allocvec(v).map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))
}

async fn read_frame<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Serves the Raft messages of other members on `listener`, until the task is aborted;
/// aborting it also closes every connection it accepted (a stopped member must not go on
/// answering through them).
pub async fn serve(
    listener: TcpListener,
    raft: Raft,
    tls: Option<Arc<plusfs_tls::ServerTls>>,
    room: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((s, peer)) = accepted else { continue };
                let (raft, tls, room) = (raft.clone(), tls.clone(), room.clone());
                conns.spawn(async move {
                    let _ = s.set_nodelay(true);
                    let served = match tls {
                        None => serve_conn(s, raft, None, &room).await,
                        Some(tls) => match tls.accept(s).await {
                            Ok((s, id, serial)) if id.is_server() => {
                                serve_conn(s, raft, Some((&tls, &serial)), &room).await
                            }
                            Ok((_, id, _)) => {
                                tracing::warn!(%peer, identity = %id, "Raft connection refused: not a server");
                                Ok(())
                            }
                            Err(e) => {
                                tracing::warn!(%peer, cause = %e, "Raft connection refused");
                                Ok(())
                            }
                        },
                    };
                    if let Err(e) = served {
                        tracing::debug!(%peer, cause = %e, "replica connection closed");
                    }
                });
            }
            Some(_) = conns.join_next() => {}
        }
    }
}

/// Serves one member's connection; over TLS, `cert` is the server end and the peer's
/// certificate serial, checked against the revocation list before each message. While
/// `room` is false (the member's disk is full) entries and snapshot chunks close the
/// connection unanswered.
async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    raft: Raft,
    cert: Option<(&plusfs_tls::ServerTls, &str)>,
    room: &std::sync::atomic::AtomicBool,
) -> std::io::Result<()> {
    loop {
        let frame = match read_frame(&mut s).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        if let Some((tls, serial)) = cert {
            if tls.is_revoked(serial) {
                tracing::warn!(serial, "Raft peer's certificate revoked: closing its connection");
                return Ok(());
            }
        }
        let Some((&kind, body)) = frame.split_first() else {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "empty frame"));
        };
        let bad = |e: postcard::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string());
        let full = || std::io::Error::other("no room on this member's disk for the group's entries");
        let has_room = room.load(std::sync::atomic::Ordering::Acquire);
        let reply = match kind {
            APPEND => {
                let req: AppendEntriesRequest<TypeConfig> = postcard::from_bytes(body).map_err(bad)?;
                if !req.entries.is_empty() && !has_room {
                    return Err(full());
                }
                encode(&raft.append_entries(req).await)
            }
            SNAPSHOT if !has_room => return Err(full()),
            VOTE => encode(&raft.vote(postcard::from_bytes(body).map_err(bad)?).await),
            SNAPSHOT => encode(&install_chunk(&raft, postcard::from_bytes(body).map_err(bad)?, room).await),
            k => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unknown message kind {k}"))),
        }?;
        let mut out = Vec::with_capacity(4 + reply.len());
        out.extend_from_slice(&(reply.len() as u32).to_be_bytes());
        out.extend_from_slice(&reply);
        s.write_all(&out).await?;
        s.flush().await?;
    }
}

/// Hands a snapshot chunk to Raft, counting its arrival as a heartbeat of the leader that
/// sent it, with this member's own elections off while Raft handles it.
///
/// openraft 0.9 sends a follower no heartbeat while it streams it a snapshot and does not
/// count chunks as heartbeats, and the last chunk's reply waits for the whole install. A
/// member catching up from a large snapshot would stand for election part way, and the
/// higher term it answers with deposes the leader sending it the snapshot, again and again
/// (Raft without pre-vote). The heartbeat given here is what the leader would send (an
/// AppendEntries with its vote, nothing to append and no commit point: it renews the
/// election timer); one more after a long install renews the time the install used up.
/// Elections are switched off only while the chunk is handled, so the member still votes
/// for others once the leader's lease ends (should the leader die mid-install); `room`
/// says whether they are on otherwise (see `Group::set_room`).
async fn install_chunk(
    raft: &Raft,
    req: InstallSnapshotRequest<TypeConfig>,
    room: &std::sync::atomic::AtomicBool,
) -> Result<InstallSnapshotResponse<MemberId>, RaftError<MemberId, InstallSnapshotError>> {
    let vote = req.vote;
    let beat = || async move {
        let hb = AppendEntriesRequest { vote, prev_log_id: None, entries: Vec::new(), leader_commit: None };
        if let Err(e) = raft.append_entries(hb).await {
            tracing::debug!(cause = %e, "heartbeat during a snapshot transfer refused");
        }
    };
    beat().await;
    raft.runtime_config().elect(false);
    let started = std::time::Instant::now();
    let out = raft.install_snapshot(req).await;
    if started.elapsed() > Duration::from_millis(raft.config().heartbeat_interval) {
        beat().await;
    }
    raft.runtime_config().elect(room.load(std::sync::atomic::Ordering::Acquire));
    out
}

fn encode<T: Serialize>(v: &T) -> std::io::Result<Vec<u8>> {
    postcard::to_allocvec(v).map_err(std::io::Error::other)
}
