//! Reading frames from an async byte stream.

use crate::frame::{Frame, FrameError};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

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

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader { inner, buf: BytesMut::with_capacity(64 * 1024) }
    }

    /// The next whole frame, or `Ok(None)` at a clean end of stream.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        loop {
            if let Some(n) = Frame::check(&self.buf)? {
                let bytes = self.buf.split_to(n).freeze();
                return Ok(Some(Frame::parse(bytes)?));
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(64 * 1024);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(ReadError::Truncated) };
            }
        }
    }
}
