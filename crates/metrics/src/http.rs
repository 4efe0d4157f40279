//! The `/metrics` endpoint: a minimal HTTP/1.x responder (one request per connection), so a
//! process needs no web framework to be scraped.

use futures::future::BoxFuture;
use prometheus::{Encoder, Registry, TextEncoder};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Brings values kept elsewhere into the registry before each scrape.
pub type Refresh = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Scrapes answered at once (a connection takes a slot only once its request has come:
/// idle connections hold none); one more is answered 503.
const CONCURRENT: usize = 4;
/// A refresh serves the scrapes of this long (a burst of scrapes costs one).
const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// Longest a refresh may take (a slow status answer leaves the values as they were).
const REFRESH_LIMIT: Duration = Duration::from_secs(2);

/// How long a scraper may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
const MAX_HEAD: usize = 8192;

/// Serves `registry` on `listener` until the task is dropped: `GET /metrics` answers the
/// text format (after `refresh`), anything else 404 or 405.
pub async fn serve(listener: TcpListener, registry: Registry, refresh: Refresh) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let last = Arc::new(tokio::sync::Mutex::new(None::<std::time::Instant>));
    loop {
        let (s, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(cause = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (registry, refresh, last, slots) = (registry.clone(), refresh.clone(), last.clone(), slots.clone());
        tokio::spawn(async move {
            let mut s = s;
            let head = match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut s)).await {
                Ok(Ok(head)) => head,
                Ok(Err(e)) => return tracing::debug!(%peer, cause = %e, "metrics request failed"),
                Err(_) => return tracing::debug!(%peer, "no metrics request in time: closed"),
            };
            let Ok(_slot) = slots.try_acquire_owned() else {
                // Busy: say so at once rather than hold the accept loop.
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, busy(s)).await;
                return;
            };
            // One refresh at a time, at most every REFRESH_EVERY, bounded in time; a scrape
            // that finds one running serves the values it has.
            let fresh = async {
                if let Ok(mut last) = last.try_lock() {
                    if last.is_none_or(|t| t.elapsed() >= REFRESH_EVERY) {
                        let _ = tokio::time::timeout(REFRESH_LIMIT, refresh()).await;
                        *last = Some(std::time::Instant::now());
                    }
                }
            };
            match tokio::time::timeout(REQUEST_TIMEOUT * 3, answer(s, &head, &registry, fresh)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, cause = %e, "metrics request failed"),
                Err(_) => tracing::debug!(%peer, "metrics request timed out"),
            }
        });
    }
}

async fn answer(
    mut s: TcpStream,
    head: &str,
    registry: &Registry,
    refresh: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body, kind) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            refresh.await;
            let mut out = Vec::new();
            let encoder = TextEncoder::new();
            encoder.encode(&registry.gather(), &mut out).map_err(std::io::Error::other)?;
            ("200 OK", out, encoder.format_type().to_string())
        }
        ("GET", _) => ("404 Not Found", b"only /metrics is served\n".to_vec(), "text/plain".to_string()),
        _ => ("405 Method Not Allowed", b"GET /metrics\n".to_vec(), "text/plain".to_string()),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(header.as_bytes()).await?;
    s.write_all(&body).await?;
    s.shutdown().await
}

/// Answers a scraper that came while every slot is taken.
async fn busy(mut s: TcpStream) -> std::io::Result<()> {
    let body = b"busy: too many scrapes at once\n";
    let head =
        format!("HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    s.shutdown().await
}

/// The request head (up to the blank line), as text.
async fn read_head(s: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request head too large"));
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
