//! Reading frames from an async byte stream and writing encoded frames to one.

use crate::frame::{Frame, FrameError, OutFrame};
use bytes::BytesMut;
use std::borrow::Borrow;
use std::io::IoSlice;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Buffered frame reader over any async stream (a TCP read half in practice).
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

/// Bytes read ahead when the next frame's length is not known yet.
const READ_AHEAD: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader { inner, buf: BytesMut::with_capacity(READ_AHEAD) }
    }

    /// The length in bytes of the next frame (its header included) once its length field
    /// has arrived, before the rest of it is read (so a caller can make room for it first);
    /// `Ok(None)` at a clean end of stream.
    pub async fn announced(&mut self) -> Result<Option<usize>, ReadError> {
        while self.buf.len() < 4 {
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(READ_AHEAD);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(ReadError::Truncated) };
            }
        }
        Ok(Some(4 + u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize))
    }

    /// The next whole frame, or `Ok(None)` at a clean end of stream. A frame's bytes are
    /// read straight into one buffer that the returned frame (and its payload) shares.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        loop {
            if let Some(n) = Frame::check(&self.buf)? {
                let bytes = self.buf.split_to(n).freeze();
                return Ok(Some(Frame::parse(bytes)?));
            }
            // Room for the rest of a frame whose length is known, so a large frame is
            // read into one allocation instead of being moved as the buffer grows.
            let want = match self.buf.get(..4) {
                Some(len) => 4 + u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize,
                None => 0,
            };
            let room = self.buf.capacity() - self.buf.len();
            if want > self.buf.capacity() {
                self.buf.reserve(want - self.buf.len());
            } else if room < 4096 {
                self.buf.reserve(READ_AHEAD);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(ReadError::Truncated) };
            }
        }
    }
}

/// Most buffers handed to one `writev` (Linux's IOV_MAX is 1,024).
const MAX_SLICES: usize = 512;

/// Writes `frames` in order with vectored writes: heads and payload chunks go to the
/// socket from where they are, without being gathered into one buffer first.
pub async fn write_frames<W: AsyncWrite + Unpin, F: Borrow<OutFrame>>(w: &mut W, frames: &[F]) -> std::io::Result<()> {
    let parts: Vec<&[u8]> =
        frames.iter().flat_map(|f| f.borrow().parts()).filter(|p| !p.is_empty()).map(|p| &p[..]).collect();
    for group in parts.chunks(MAX_SLICES) {
        let mut slices: Vec<IoSlice<'_>> = group.iter().map(|p| IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = w.write_vectored(rest).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
    }
    Ok(())
}

/// A connection's writer: sends the frames queued on `rx` until it closes, every frame
/// queued by the time a write starts in that one write; `sent` learns the bytes of each.
/// A queued item is dropped (with whatever it holds, e.g. a share of a memory budget)
/// once its frame is written.
pub async fn send_queued<W: AsyncWrite + Unpin, F: Borrow<OutFrame>>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<F>,
    w: &mut W,
    mut sent: impl FnMut(usize),
) -> std::io::Result<()> {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        sent(batch.iter().map(|f| f.borrow().len()).sum());
        write_frames(w, &batch).await?;
        // A TLS stream may keep the last records it could not send yet until flushed.
        w.flush().await?;
        batch.clear();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Header;
    use bytes::Bytes;

    fn frame(id: u64, payload: Vec<Bytes>) -> OutFrame {
        let header = Header { version: 1, flags: 2, opcode: 3, epoch: 0, request_id: id };
        let mut head = BytesMut::new();
        let len = payload.iter().map(Bytes::len).sum();
        Frame::encode_head(&header, b"body", len, &mut head).unwrap();
        OutFrame { head: head.freeze(), payload }
    }

    #[tokio::test]
    async fn frames_written_in_parts_read_back_whole() {
        let big = Bytes::from(vec![5u8; 3 << 20]);
        let frames: Vec<OutFrame> = (0..700)
            .map(|i| frame(i, if i % 100 == 0 { vec![big.clone(), Bytes::from_static(b"tail")] } else { vec![] }))
            .collect();
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut wr, rd) = (a, b);
        let expect: Vec<BytesMut> = frames.iter().map(OutFrame::to_bytes).collect();
        let writer = tokio::spawn(async move {
            write_frames(&mut wr, &frames).await.unwrap();
        });
        let mut reader = FrameReader::new(rd);
        for (i, want) in expect.iter().enumerate() {
            let f = reader.read_frame().await.unwrap().expect("a frame");
            assert_eq!(f.header.request_id, i as u64);
            assert_eq!(f.body.len() + crate::frame::HEADER_LEN, want.len());
            assert_eq!(&f.body[..4], b"body");
            assert_eq!(&f.body[..], &want[crate::frame::HEADER_LEN..]);
        }
        writer.await.unwrap();
        assert!(reader.read_frame().await.unwrap().is_none());
    }
}
