//! The network side of a server: accept loop, per-connection reader and writer.
//!
//! Each request is served in its own task, so one connection carries many requests in
//! flight; replies are queued to the connection's writer, which sends every queued reply
//! in one vectored write (file data from the buffers it was read into). A connection
//! holds at most [`CONN_BUDGET_KIB`] of requests and replies in the server: each request
//! takes a share of it (its bytes and the most its reply may hold) until its reply is
//! written, and a connection over budget is not read any further, so a client that sends
//! without reading its replies stops itself, not the server (connections of the cluster's
//! own servers are exempt). A malformed frame or a wrong protocol version ends only its connection
//! (after an `EPROTO` reply where a reply can be addressed).

use crate::front::Front;
use crate::security::{self, Security};
use plusfs_proto::io::{send_queued, FrameReader, ReadError};
use plusfs_proto::{
    decode_request, encode_response_at, DecodeError, Errno, OutFrame, Request, Response, WireError, HEADER_LEN,
};
use plusfs_tls::Identity;
use std::borrow::Borrow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Serves connections from `listener` (over TLS with `security`) until `shutdown` turns
/// true, then waits for the requests in flight.
pub async fn serve(
    listener: TcpListener,
    osd: Arc<Front>,
    security: Option<Arc<Security>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    conns.spawn(admit(stream, osd.clone(), security.clone(), shutdown.clone()));
                }
                Err(e) => {
                    tracing::warn!(cause = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// Runs the TLS handshake of a new connection (if the cluster uses TLS), then serves it.
async fn admit(
    stream: TcpStream,
    osd: Arc<Front>,
    security: Option<Arc<Security>>,
    mut shutdown: watch::Receiver<bool>,
) {
    stream.set_nodelay(true).ok();
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let Some(security) = security else {
        return connection(stream, Peer { addr: peer, identity: None }, osd, shutdown).await;
    };
    let accepted = tokio::select! {
        a = security.accept(stream) => a,
        _ = shutdown.changed() => return,
    };
    match accepted {
        Ok((tls, identity, serial)) => {
            osd.net().tls_handshakes.fetch_add(1, Ordering::Relaxed);
            let Some(_slot) = security.open_slot(&identity, &serial) else {
                osd.net().tls_refusals.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, %identity, "connection refused: the identity holds as many connections as allowed");
                return;
            };
            tracing::debug!(%peer, %identity, "TLS connection admitted");
            let not_after = plusfs_tls::peer_not_after(&tls).unwrap_or(0);
            let cert = Cert { identity, serial, not_after, security };
            let peer = Peer { addr: peer, identity: Some(cert) };
            connection(tls, peer, osd, shutdown).await
        }
        Err(e) => {
            osd.net().tls_refusals.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, cause = %e, "connection refused");
        }
    }
}

/// Who is at the other end of a connection: its address and, over TLS, its certificate.
struct Peer {
    addr: String,
    identity: Option<Cert>,
}

/// The certificate a TLS peer presented: its identity, serial number and end of validity
/// (seconds since the Unix epoch), and the server's TLS end (which knows revocations).
struct Cert {
    identity: Identity,
    serial: String,
    not_after: u64,
    security: Arc<Security>,
}

impl Cert {
    /// Why the connection must close before serving another request: its certificate was
    /// revoked or expired since the handshake.
    fn lapsed(&self) -> Option<&'static str> {
        if self.security.is_revoked(&self.serial) {
            return Some("certificate revoked");
        }
        (plusfs_tls::now_secs() > self.not_after).then_some("certificate expired")
    }
}

async fn connection<S>(stream: S, who: Peer, osd: Arc<Front>, mut shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
    let _open = OpenConnection::count(&osd);
    let peer = who.addr;
    let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
    let budget = Arc::new(Semaphore::new(CONN_BUDGET_KIB as usize));
    // Other servers are not held to a budget: their requests to each other may wait on
    // one another in cycles (a forwarded request's handler calling back), which a full
    // budget could turn into a deadlock; they are the cluster's own, not a user's.
    let budgeted = who.identity.as_ref().is_none_or(|c| !c.identity.is_server());
    let m = osd.clone();
    let writer = tokio::spawn(async move {
        // A write error ends the writer; replies queued after it are dropped.
        let _ = send_queued(&mut rx, &mut wr, |n| {
            m.metrics().bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        })
        .await;
    });

    let mut reader = FrameReader::new(rd);
    let mut inflight = JoinSet::new();
    loop {
        let frame = tokio::select! {
            f = reader.read_frame() => f,
            _ = shutdown.changed() => break,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(ReadError::Io(e)) => {
                tracing::debug!(%peer, cause = %e, "connection error");
                break;
            }
            Err(e) => {
                tracing::warn!(%peer, cause = %e, "malformed frame; closing connection");
                break;
            }
        };
        osd.metrics().msgs_in.fetch_add(1, Ordering::Relaxed);
        osd.metrics().bytes_in.fetch_add((frame.body.len() + HEADER_LEN) as u64, Ordering::Relaxed);
        let (id, opcode, hint) = (frame.header.request_id, frame.header.opcode, frame.header.epoch);
        osd.note_epoch(hint);
        match decode_request(&frame) {
            Ok(mut call) => {
                let cost = cost_kib(frame.body.len(), &call.request);
                let share = match budgeted {
                    true => tokio::select! {
                        s = budget.clone().acquire_many_owned(cost) => s.ok(),
                        _ = shutdown.changed() => break,
                    },
                    false => None,
                };
                let cred = match &who.identity {
                    None => call.cred,
                    Some(cert) => {
                        if let Some(why) = cert.lapsed() {
                            osd.net().tls_refusals.fetch_add(1, Ordering::Relaxed);
                            let (identity, serial) = (&cert.identity, &cert.serial);
                            tracing::warn!(%peer, %identity, serial, "{why}: closing its connection");
                            break;
                        }
                        let who = security::Claimant {
                            identity: &cert.identity,
                            serial: &cert.serial,
                            caps: cert.security.caps(),
                        };
                        match security::admit(&who, call.cred, &mut call.request) {
                            Ok(cred) => cred,
                            Err(e) => {
                                osd.net().refused_requests.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(%peer, cause = %e.message, "request refused");
                                send(&osd, &tx, (id, opcode, share), &Err(e));
                                continue;
                            }
                        }
                    }
                };
                let (osd, tx) = (osd.clone(), tx.clone());
                inflight.spawn(async move {
                    // Timed only while an endpoint serves the metrics.
                    let timed =
                        osd.exporter().timing().then(|| (call.request.inner().name(), std::time::Instant::now()));
                    let op = call.request.inner().name();
                    let handled = std::panic::AssertUnwindSafe(osd.handle_hinted(cred, call.request, hint));
                    // A bug that panics fails its request (EIO), not the connection or the server.
                    let resp = futures::FutureExt::catch_unwind(handled).await.unwrap_or_else(|panic| {
                        let what = panic_text(panic.as_ref());
                        tracing::error!(%op, cause = %what, "request handler panicked");
                        Err(WireError::new(Errno::EIO, format!("{op}: the server failed serving it: {what}")))
                    });
                    // A follower's redirect is not a served request.
                    if let Some((op, started)) =
                        timed.filter(|_| !matches!(resp, Ok(plusfs_proto::Reply::Redirect { .. })))
                    {
                        osd.exporter().observe(op, started.elapsed());
                    }
                    send(&osd, &tx, (id, opcode, share), &resp);
                });
            }
            Err(e) => {
                tracing::warn!(%peer, cause = %e, "undecodable request; closing connection");
                let errno = if matches!(e, DecodeError::Version { .. }) { Errno::EPROTO } else { e.errno() };
                send(&osd, &tx, (id, opcode, None), &Err(WireError::new(errno, e.to_string())));
                break;
            }
        }
        while inflight.try_join_next().is_some() {}
    }
    while inflight.join_next().await.is_some() {}
    drop(tx);
    let _ = writer.await;
}

/// Counts a connection as open while it lives.
struct OpenConnection(Arc<Front>);

impl OpenConnection {
    fn count(osd: &Arc<Front>) -> OpenConnection {
        osd.net().connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(osd.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.net().connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The message of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Bytes of requests and replies one connection may hold in the server at once, in KiB
/// (the units of its budget semaphore).
const CONN_BUDGET_KIB: u32 = 64 << 10;
/// The least share a request takes (so many tiny requests are bounded too).
const MIN_COST_KIB: u32 = 16;

/// A reply frame and the share of its connection's budget it holds until written.
struct Queued {
    frame: OutFrame,
    _share: Option<OwnedSemaphorePermit>,
}

impl Borrow<OutFrame> for Queued {
    fn borrow(&self) -> &OutFrame {
        &self.frame
    }
}

/// The share of its connection's budget request `req`, a frame body of `body` bytes,
/// takes: its bytes and the most its reply may hold (for replies that carry data or
/// many entries), at least [`MIN_COST_KIB`], at most the whole budget.
fn cost_kib(body: usize, req: &Request) -> u32 {
    const PER_ENTRY: u64 = 512;
    let reply = match req.inner() {
        Request::Read { len, .. } => u64::from(*len),
        Request::Probe { reply_len, .. } => u64::from(*reply_len),
        Request::DataGet { ranges, .. } => ranges.iter().fold(0u64, |a, r| a.saturating_add(r.2)),
        Request::BatchRead { max_bytes, names, .. } => (*max_bytes).max(names.len() as u64 * PER_ENTRY),
        Request::Readdir { limit, .. } => u64::from(*limit).saturating_mul(PER_ENTRY),
        Request::Batch { names, .. } => names.len() as u64 * PER_ENTRY,
        _ => 0,
    };
    let kib = (body as u64).saturating_add(reply).div_ceil(1024);
    kib.clamp(u64::from(MIN_COST_KIB), u64::from(CONN_BUDGET_KIB)) as u32
}

fn send(
    osd: &Front,
    tx: &mpsc::UnboundedSender<Queued>,
    (id, opcode, share): (u64, u16, Option<OwnedSemaphorePermit>),
    resp: &Response,
) {
    let epoch = osd.epoch();
    let result = encode_response_at(id, epoch, opcode, resp).or_else(|e| {
        let too_big = Err(WireError::new(Errno::EMSGSIZE, format!("reply too large: {e}")));
        encode_response_at(id, epoch, opcode, &too_big)
    });
    if let Ok(frame) = result {
        osd.metrics().msgs_out.fetch_add(1, Ordering::Relaxed);
        let _ = tx.send(Queued { frame, _share: share });
    }
}
