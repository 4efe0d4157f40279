//! The network side of a server: accept loop, per-connection reader and writer.
//!
//! Each request is served in its own task, so one connection carries many requests in
//! flight; replies are queued to the connection's writer, which sends every queued reply
//! in one vectored write (file data from the buffers it was read into). What a connection
//! may hold in the server is bounded: requests and replies take shares of memory budgets
//! ([`crate::budget`]) and a connection over budget is not read any further; a TLS handshake
//! must finish within [`HANDSHAKE_LIMIT`], with at most [`PENDING_PER_ADDRESS`] under way per
//! peer address; a client connection idle for `[tls] idle_secs`, or that reads no reply
//! for as long (at most [`STALL_LIMIT`]), is closed. A malformed frame or a wrong protocol version ends
//! only its connection (after an `EPROTO` reply where a reply can be addressed).

use crate::budget::{self, Budgets, Holder, Meter, Share};
use crate::front::Front;
use crate::security::{self, Security};
use parking_lot::Mutex;
use plusfs_proto::io::{send_queued, FrameReader, ReadError};
use plusfs_proto::{
    decode_request, encode_response_at, DecodeError, Errno, OutFrame, Request, Response, WireError, HEADER_LEN,
};
use plusfs_tls::Identity;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Longest a TLS handshake may take before its connection is closed.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Handshakes under way at once from one peer address (more are closed at once).
pub const PENDING_PER_ADDRESS: u32 = 64;
/// Handshakes under way at once in all.
pub const PENDING_IN_ALL: u32 = 512;
/// Longest a reply may wait on a client that reads nothing before its connection is closed
/// (shorter when `[tls] idle_secs` is).
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// Serves connections from `listener` (over TLS with `security`) until `shutdown` turns
/// true, then waits for the requests in flight.
pub async fn serve(
    listener: TcpListener,
    osd: Arc<Front>,
    security: Option<Arc<Security>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let shared = Arc::new(Shared::default());
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    let Some(pending) = Pending::enter(&shared, peer.ip()) else {
                        osd.net().tls_refusals.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, "connection refused: too many handshakes under way from its address");
                        continue;
                    };
                    conns.spawn(admit(stream, pending, osd.clone(), security.clone(), shutdown.clone()));
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

/// What the connections of one server process share: their memory budgets and the count
/// of handshakes under way per peer address.
#[derive(Default)]
struct Shared {
    budgets: Budgets,
    pending: Mutex<HashMap<IpAddr, u32>>,
}

/// A connection whose TLS handshake is under way (counted per address while it lives).
struct Pending {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Pending {
    /// Counts a new connection from `ip`; `None` when its address, or all addresses
    /// together, have as many handshakes under way as allowed.
    fn enter(shared: &Arc<Shared>, ip: IpAddr) -> Option<Pending> {
        let mut pending = shared.pending.lock();
        let all: u32 = pending.values().sum();
        let n = pending.entry(ip).or_default();
        if *n >= PENDING_PER_ADDRESS || all >= PENDING_IN_ALL {
            return None;
        }
        *n += 1;
        Some(Pending { shared: shared.clone(), ip })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = self.shared.pending.lock();
        if let Some(n) = pending.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.ip);
            }
        }
    }
}

/// Runs the TLS handshake of a new connection (if the cluster uses TLS), then serves it.
async fn admit(
    stream: TcpStream,
    pending: Pending,
    osd: Arc<Front>,
    security: Option<Arc<Security>>,
    mut shutdown: watch::Receiver<bool>,
) {
    stream.set_nodelay(true).ok();
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let shared = pending.shared.clone();
    let Some(security) = security else {
        drop(pending);
        let meter = shared.budgets.meter(Holder::Plain);
        let who = Peer { addr: peer, identity: None, meter: Some(meter), idle: None };
        return connection(stream, who, osd, shutdown).await;
    };
    let accepted = tokio::select! {
        a = tokio::time::timeout(HANDSHAKE_LIMIT, security.accept(stream)) => a,
        _ = shutdown.changed() => return,
    };
    drop(pending);
    match accepted {
        Ok(Ok((tls, identity, serial))) => {
            osd.net().tls_handshakes.fetch_add(1, Ordering::Relaxed);
            let Some(_slot) = security.open_slot(&identity, &serial) else {
                osd.net().tls_refusals.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, %identity, "connection refused: the identity holds as many connections as allowed");
                return;
            };
            tracing::debug!(%peer, %identity, "TLS connection admitted");
            let not_after = plusfs_tls::peer_not_after(&tls).unwrap_or(0);
            // The cluster's own servers are neither budgeted nor closed when idle.
            let client = !identity.is_server();
            let meter = client.then(|| {
                let bounded = !identity.is_admin();
                shared.budgets.meter(Holder::Cert { serial: &serial, bounded })
            });
            let idle = client.then(|| security.idle_limit());
            let cert = Cert { identity, serial, not_after, security };
            let peer = Peer { addr: peer, identity: Some(cert), meter, idle };
            connection(tls, peer, osd, shutdown).await
        }
        Ok(Err(e)) => {
            osd.net().tls_refusals.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, cause = %e, "connection refused");
        }
        Err(_) => {
            osd.net().closed_idle.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "connection closed: no TLS handshake within {} s", HANDSHAKE_LIMIT.as_secs());
        }
    }
}

/// Who is at the other end of a connection: its address and, over TLS, its certificate.
struct Peer {
    addr: String,
    identity: Option<Cert>,
    /// The budgets its requests draw on (none for the cluster's own servers).
    meter: Option<Meter>,
    /// How long it may stay idle (forever for the cluster's own servers and on an
    /// insecure cluster).
    idle: Option<Duration>,
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
    let (rd, wr) = tokio::io::split(stream);
    let _open = OpenConnection::count(&osd);
    let peer = who.addr;
    let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
    let m = osd.clone();
    // A client that reads no reply for as long as it may stay idle (at most STALL_LIMIT)
    // is closed; the cluster's own servers are not.
    let stall = who.idle.map_or(Duration::MAX, |i| i.min(STALL_LIMIT));
    let mut writer = tokio::spawn(async move {
        // A write error (or a stalled peer) ends the writer; replies queued after it are
        // dropped.
        let mut wr = Stalling::new(wr, stall);
        send_queued(&mut rx, &mut wr, |n| {
            m.metrics().bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        })
        .await
    });
    let waited = || {
        osd.net().budget_waits.fetch_add(1, Ordering::Relaxed);
    };

    let mut reader = FrameReader::new(rd);
    let mut inflight = JoinSet::new();
    let idle_limit = who.idle.unwrap_or(Duration::MAX);
    loop {
        // Idle: no request for `idle_limit` and none in flight.
        let announced = tokio::select! {
            n = reader.announced() => n,
            _ = shutdown.changed() => break,
            ended = &mut writer => {
                if let Ok(Err(e)) = ended {
                    osd.net().closed_idle.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, cause = %e, "closing connection: its replies cannot be sent");
                }
                return;
            }
            _ = idle_wait(&mut inflight, idle_limit) => {
                osd.net().closed_idle.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%peer, "closing connection idle for {} s", idle_limit.as_secs());
                break;
            }
        };
        let len = match announced {
            Ok(Some(n)) => n.min(plusfs_proto::MAX_FRAME_LEN),
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(%peer, cause = %e, "connection error");
                break;
            }
        };
        // Room for the frame's bytes before they are read.
        let mut share = match &who.meter {
            Some(m) => tokio::select! {
                s = m.take(budget::kib(len as u64), waited) => Some(s),
                _ = shutdown.changed() => break,
            },
            None => None,
        };
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
                if let (Some(m), Some(s)) = (&who.meter, share.as_mut()) {
                    let cost = cost_kib(frame.body.len(), &call.request);
                    tokio::select! {
                        _ = m.grow(s, cost, waited) => {}
                        _ = shutdown.changed() => break,
                    }
                }
                drop(frame);
                // Users (and peers of an insecure cluster) add nothing once the disk is
                // down to its floor; admins and the cluster's own servers a little more. A
                // member that does not lead redirects instead, whatever its own disk holds.
                let privileged = who.identity.as_ref().is_some_and(|c| c.identity.is_admin() || c.identity.is_server());
                if let Some(e) = osd.space().admit(&call.request, privileged).err().filter(|_| osd.answers()) {
                    osd.net().space_refusals.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, cause = %e.message, "request refused");
                    send(&osd, &tx, (id, opcode, share.take()), &Err(e));
                    continue;
                }
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
                                send(&osd, &tx, (id, opcode, share.take()), &Err(e));
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

/// Returns once no request has been in flight for `limit` (never while one is).
async fn idle_wait(inflight: &mut JoinSet<()>, limit: Duration) {
    if limit == Duration::MAX {
        return std::future::pending().await;
    }
    loop {
        while inflight.join_next().await.is_some() {}
        tokio::select! {
            _ = tokio::time::sleep(limit) => return,
            Some(_) = inflight.join_next() => {}
        }
    }
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

/// A reply frame and the share of its connection's budget it holds until written.
struct Queued {
    frame: OutFrame,
    _share: Option<Share>,
}

impl Borrow<OutFrame> for Queued {
    fn borrow(&self) -> &OutFrame {
        &self.frame
    }
}

/// The share of its connection's budget request `req`, a frame body of `body` bytes,
/// takes: its bytes and the most its reply may hold (for replies that carry data or
/// many entries).
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
    budget::kib((body as u64).saturating_add(reply))
}

fn send(
    osd: &Front,
    tx: &mpsc::UnboundedSender<Queued>,
    (id, opcode, share): (u64, u16, Option<Share>),
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

/// A writer that fails with `TimedOut` when one write makes no progress for its limit (a
/// peer that stopped reading), instead of holding its replies forever.
struct Stalling<W> {
    inner: W,
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<W> Stalling<W> {
    fn new(inner: W, limit: Duration) -> Stalling<W> {
        Stalling { inner, limit, timer: None }
    }

    /// `polled` as it is, except that a `Pending` lasting past the limit becomes an error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, polled: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if polled.is_ready() || self.limit == Duration::MAX {
            self.timer = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match std::future::Future::poll(timer.as_mut(), cx) {
            Poll::Ready(()) => {
                let why = format!("the peer read nothing for {} s", limit.as_secs());
                Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Stalling<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}
