//! The network side of a server: accept loop, per-connection reader and writer.
//!
//! Each request is served in its own task, so one connection carries many requests in
//! flight; replies are queued to the connection's writer, which sends every queued reply
//! in one vectored write (file data from the buffers it was read into). A malformed frame or a wrong protocol version ends only its connection
//! (after an `EPROTO` reply where a reply can be addressed).

use crate::front::Front;
use plusfs_proto::io::{send_queued, FrameReader, ReadError};
use plusfs_proto::{decode_request, encode_response, DecodeError, Errno, OutFrame, Response, WireError, HEADER_LEN};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Serves connections from `listener` until `shutdown` turns true, then waits for the
/// requests in flight.
pub async fn serve(listener: TcpListener, osd: Arc<Front>, mut shutdown: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    conns.spawn(connection(stream, osd.clone(), shutdown.clone()));
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

async fn connection(stream: TcpStream, osd: Arc<Front>, mut shutdown: watch::Receiver<bool>) {
    stream.set_nodelay(true).ok();
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<OutFrame>();
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
        let (id, opcode) = (frame.header.request_id, frame.header.opcode);
        match decode_request(&frame) {
            Ok(call) => {
                let (osd, tx) = (osd.clone(), tx.clone());
                inflight.spawn(async move {
                    let resp = osd.handle(call.cred, call.request).await;
                    send(&osd, &tx, id, opcode, &resp);
                });
            }
            Err(e) => {
                tracing::warn!(%peer, cause = %e, "undecodable request; closing connection");
                let errno = if matches!(e, DecodeError::Version { .. }) { Errno::EPROTO } else { e.errno() };
                send(&osd, &tx, id, opcode, &Err(WireError::new(errno, e.to_string())));
                break;
            }
        }
        while inflight.try_join_next().is_some() {}
    }
    while inflight.join_next().await.is_some() {}
    drop(tx);
    let _ = writer.await;
}

fn send(osd: &Front, tx: &mpsc::UnboundedSender<OutFrame>, id: u64, opcode: u16, resp: &Response) {
    let result = encode_response(id, opcode, resp).or_else(|e| {
        let too_big = Err(WireError::new(Errno::EMSGSIZE, format!("reply too large: {e}")));
        encode_response(id, opcode, &too_big)
    });
    if let Ok(frame) = result {
        osd.metrics().msgs_out.fetch_add(1, Ordering::Relaxed);
        let _ = tx.send(frame);
    }
}
