//! One pipelined connection: many requests in flight, replies matched by request id.

use crate::counters::Counters;
use plusfs_proto::io::{send_queued, FrameReader};
use plusfs_proto::{decode_response, encode_request_at, Cred, Errno, OutFrame, Request, Response};
use plusfs_tls::ClientTls;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// A request that got no reply: the connection failed or the reply was unreadable.
#[derive(Debug, Clone, Error)]
pub enum CallError {
    #[error("cannot reach server {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("connection to {addr} lost: {reason}")]
    Broken { addr: String, reason: String },
    #[error("protocol error talking to {addr}: {reason}")]
    Protocol { addr: String, reason: String, errno: Errno },
}

impl CallError {
    /// The errno a caller sees.
    pub fn errno(&self) -> Errno {
        match self {
            // A server that cannot be reached is an I/O error to a POSIX program; the
            // message keeps the cause.
            CallError::Connect { .. } => Errno::EIO,
            CallError::Broken { .. } => Errno::EIO,
            CallError::Protocol { errno, .. } => *errno,
        }
    }

    /// True when the request may not have reached the server and can be resent.
    pub fn is_transport(&self) -> bool {
        !matches!(self, CallError::Protocol { .. })
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Response, CallError>>>>>;

/// A connection to one server. Cheap to share; calls from many tasks are pipelined.
pub struct Connection {
    addr: String,
    next_id: AtomicU64,
    pending: Pending,
    outbox: mpsc::UnboundedSender<OutFrame>,
    alive: Arc<AtomicBool>,
    counters: Arc<Counters>,
    /// When the connection was opened, and the milliseconds since then at its last
    /// request or reply (how long it has been idle).
    opened: std::time::Instant,
    active_ms: Arc<AtomicU64>,
}

impl Connection {
    /// Connects to `addr` of a cluster whose map has `tls` settings (over TLS, presenting
    /// this process's identity, if they ask for it).
    pub async fn connect_to(
        addr: &str,
        counters: Arc<Counters>,
        tls: &plusfs_placement::TlsSettings,
    ) -> Result<Connection, CallError> {
        let end = crate::secure::client_tls(tls)
            .map_err(|e| CallError::Connect { addr: addr.into(), reason: e.to_string() })?;
        Connection::connect_with(addr, counters, end.as_deref()).await
    }

    /// Connects to `addr`, over TLS with `tls` (mutual: `tls` presents this process's
    /// identity), and starts the reader and writer tasks.
    pub async fn connect_with(
        addr: &str,
        counters: Arc<Counters>,
        tls: Option<&ClientTls>,
    ) -> Result<Connection, CallError> {
        let limit = transport_timeout();
        let stream = match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(CallError::Connect { addr: addr.to_string(), reason: e.to_string() }),
            Err(_) => {
                let reason = format!("no answer within {} ms", limit.as_millis());
                return Err(CallError::Connect { addr: addr.to_string(), reason });
            }
        };
        stream.set_nodelay(true).ok();
        detect_dead_peers(&stream, limit);
        let (rd, mut wr) = match tls {
            None => split(stream),
            Some(tls) => match tokio::time::timeout(limit, tls.connect(stream)).await {
                Ok(Ok(s)) => split(s),
                Ok(Err(e)) => {
                    return Err(CallError::Connect { addr: addr.to_string(), reason: format!("TLS handshake: {e}") })
                }
                Err(_) => {
                    let reason = format!("no TLS handshake within {} ms", limit.as_millis());
                    return Err(CallError::Connect { addr: addr.to_string(), reason });
                }
            },
        };
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (outbox, mut rx) = mpsc::unbounded_channel::<OutFrame>();

        // Writer: every queued frame goes out in one vectored write.
        let walive = alive.clone();
        let wpending = pending.clone();
        let waddr = addr.to_string();
        tokio::spawn(async move {
            match send_queued(&mut rx, &mut wr, |_| {}).await {
                Err(e) => fail_all(&walive, &wpending, &waddr, &e.to_string()),
                // The connection was dropped: say so to the server (TLS close and FIN), which
                // closes its end, so the socket does not outlive the handle.
                Ok(()) => {
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
                }
            }
        });

        // Reader: route each reply to its caller.
        let ralive = alive.clone();
        let rpending = pending.clone();
        let raddr = addr.to_string();
        let rcounters = counters.clone();
        let opened = std::time::Instant::now();
        let active_ms = Arc::new(AtomicU64::new(0));
        let ractive = active_ms.clone();
        tokio::spawn(async move {
            let mut reader = FrameReader::new(rd);
            loop {
                match reader.read_frame().await {
                    Ok(Some(frame)) => {
                        rcounters.msgs_in.fetch_add(1, Ordering::Relaxed);
                        ractive.store(opened.elapsed().as_millis() as u64, Ordering::Relaxed);
                        rcounters.bytes_in.fetch_add((frame.body.len() + 20) as u64, Ordering::Relaxed);
                        rcounters.epochs.note_hint(frame.header.epoch);
                        let id = frame.header.request_id;
                        let result = decode_response(&frame).map_err(|e| CallError::Protocol {
                            addr: raddr.clone(),
                            reason: e.to_string(),
                            errno: e.errno(),
                        });
                        let waiter = rpending.lock().expect("pending lock").remove(&id);
                        match (waiter, result) {
                            (Some(w), r) => {
                                let fatal = r.is_err();
                                let _ = w.send(r);
                                if fatal {
                                    fail_all(&ralive, &rpending, &raddr, "protocol error");
                                    return;
                                }
                            }
                            (None, Err(e)) => {
                                // An unsolicited error frame (e.g. a version refusal).
                                fail_all(&ralive, &rpending, &raddr, &e.to_string());
                                return;
                            }
                            (None, Ok(_)) => {}
                        }
                    }
                    Ok(None) => {
                        fail_all(&ralive, &rpending, &raddr, "closed by server");
                        return;
                    }
                    Err(e) => {
                        fail_all(&ralive, &rpending, &raddr, &e.to_string());
                        return;
                    }
                }
            }
        });

        Ok(Connection {
            addr: addr.to_string(),
            next_id: AtomicU64::new(1),
            pending,
            outbox,
            alive,
            counters,
            opened,
            active_ms,
        })
    }

    /// True until the connection has failed.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// How long no request has been waiting on the connection and none sent (servers
    /// close a client connection idle for `[tls] idle_secs`).
    pub fn idle_for(&self) -> std::time::Duration {
        if !self.pending.lock().expect("pending lock").is_empty() {
            return std::time::Duration::ZERO;
        }
        let active = std::time::Duration::from_millis(self.active_ms.load(Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(active)
    }

    /// The server address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `req`, made by `cred`, and waits for its reply.
    pub async fn call(&self, cred: &Cred, req: &Request) -> Result<Response, CallError> {
        let broken = || CallError::Broken { addr: self.addr.clone(), reason: "connection closed".into() };
        if !self.is_alive() {
            return Err(broken());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_request_at(id, self.counters.epochs.current(), cred, req).map_err(|e| {
            CallError::Protocol { addr: self.addr.clone(), reason: e.to_string(), errno: Errno::EMSGSIZE }
        })?;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        self.active_ms.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.counters.msgs_out.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_out.fetch_add(frame.len() as u64, Ordering::Relaxed);
        if self.outbox.send(frame).is_err() {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(broken());
        }
        // The connection may have died between the alive check and the insert.
        if !self.is_alive() {
            if let Some(w) = self.pending.lock().expect("pending lock").remove(&id) {
                drop(w);
                return Err(broken());
            }
        }
        rx.await.unwrap_or_else(|_| Err(broken()))
    }
}

/// How long a peer may leave sent bytes unacknowledged, or fail to answer keep-alive
/// probes on an idle connection, before the connection is declared broken (its calls fail
/// with EIO and the next call reconnects); also the limit of a connect. 15 s unless
/// `PLUSFS_TRANSPORT_TIMEOUT_MS` says otherwise (tests of partitions use less).
pub fn transport_timeout() -> Duration {
    static LIMIT: OnceLock<Duration> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let ms = std::env::var("PLUSFS_TRANSPORT_TIMEOUT_MS").ok().and_then(|v| v.parse::<u64>().ok());
        Duration::from_millis(ms.unwrap_or(15_000).max(100))
    })
}

/// Makes the kernel end a connection to a peer that stopped answering: `TCP_USER_TIMEOUT`
/// for unacknowledged data, keep-alive probes for an idle connection whose reply is
/// awaited. Without them a partitioned peer holds calls for the kernel's ~15 minutes of
/// retransmissions. A request the peer has received but takes long to answer is not
/// affected (its bytes were acknowledged and the peer's kernel answers the probes).
fn detect_dead_peers(stream: &TcpStream, limit: Duration) {
    let sock = socket2::SockRef::from(stream);
    let probe_every = (limit / 4).max(Duration::from_millis(100));
    let keepalive = socket2::TcpKeepalive::new().with_time(probe_every).with_interval(probe_every).with_retries(3);
    if let Err(e) = sock.set_tcp_keepalive(&keepalive).and_then(|_| sock.set_tcp_user_timeout(Some(limit))) {
        tracing::debug!(cause = %e, "cannot set TCP keep-alive and user timeout");
    }
}

/// The two halves of a connection's byte stream, boxed so plain and TLS streams look alike.
fn split<S: AsyncRead + AsyncWrite + Send + 'static>(s: S) -> (BoxRead, BoxWrite) {
    let (rd, wr) = tokio::io::split(s);
    (Box::new(rd), Box::new(wr))
}

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

fn fail_all(alive: &AtomicBool, pending: &Pending, addr: &str, reason: &str) {
    alive.store(false, Ordering::Release);
    let waiters: Vec<_> = pending.lock().expect("pending lock").drain().collect();
    for (_, w) in waiters {
        let _ = w.send(Err(CallError::Broken { addr: addr.to_string(), reason: reason.to_string() }));
    }
}
