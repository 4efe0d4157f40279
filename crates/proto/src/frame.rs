//! Framing: a 4-byte length prefix, a fixed header, a body.
//!
//! ```text
//! offset size field
//!      0    4 length     u32 big-endian: bytes after this field (header rest + body)
//!      4    2 magic      0x50 0x46 ("PF")
//!      6    1 version    PROTOCOL_VERSION
//!      7    1 flags      bit 0: response; bit 1: a payload follows the body
//!      8    2 opcode     u16 big-endian
//!     10    2 epoch      u16 big-endian: the low 16 bits of the sender's map epoch
//!     12    8 request id u64 big-endian, echoed in the response
//!     20    … body       postcard-encoded message
//!      …    … payload    the message's bulk bytes (with flag bit 1), up to the frame's end
//! ```
//! A reader first [checks](Frame::check) that a whole frame is buffered (cheap, never
//! allocates), then parses it. Frames longer than [`MAX_FRAME_LEN`] are refused before
//! any body byte is read.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

/// Identifies plusfs frames; anything else on the socket is refused at once.
pub const MAGIC: u16 = 0x5046;
/// The protocol version this build speaks. Peers with another version get `EPROTO`.
pub const PROTOCOL_VERSION: u8 = 20;
/// Bytes from the start of a frame to its body.
pub const HEADER_LEN: usize = 20;
/// Hard upper bound of one frame, length prefix included (16 MiB).
pub const MAX_FRAME_LEN: usize = 16 << 20;
/// Flag bit set on every response frame.
pub const FLAG_RESPONSE: u8 = 0x01;
/// Flag bit set when the message's [`Payload`](crate::Payload) follows its body.
pub const FLAG_PAYLOAD: u8 = 0x02;

/// The fixed part of every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub flags: u8,
    pub opcode: u16,
    /// The low 16 bits of the sender's cluster-map epoch: a receiver that sees a newer one
    /// fetches the map (see [`epoch_is_newer`]).
    pub epoch: u16,
    pub request_id: u64,
}

/// Whether the epoch hint `hint` is newer than the epoch `mine` (serial-number arithmetic
/// on 16 bits, RFC 1982: newer if at most 32,767 ahead). Hint 0 says nothing.
pub fn epoch_is_newer(hint: u16, mine: u64) -> bool {
    let ahead = hint.wrapping_sub(mine as u16);
    hint != 0 && ahead != 0 && ahead < 0x8000
}

/// One decoded frame: header and still-encoded body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: Header,
    pub body: Bytes,
}

/// Why bytes on a socket are not a valid frame. Any of these closes the connection.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad magic {0:#06x}: peer does not speak the plusfs protocol")]
    BadMagic(u16),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_LEN}-byte maximum")]
    TooLarge(usize),
    #[error("frame length {0} is shorter than the header")]
    TooShort(usize),
}

impl Frame {
    /// Checks whether `buf` starts with a complete frame. `Ok(Some(n))`: the first `n`
    /// bytes are one frame; `Ok(None)`: more bytes are needed; `Err`: not a valid frame.
    pub fn check(buf: &[u8]) -> Result<Option<usize>, FrameError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let total = len + 4;
        if total > MAX_FRAME_LEN {
            return Err(FrameError::TooLarge(total));
        }
        if total < HEADER_LEN {
            return Err(FrameError::TooShort(len));
        }
        if buf.len() >= 6 {
            let magic = u16::from_be_bytes([buf[4], buf[5]]);
            if magic != MAGIC {
                return Err(FrameError::BadMagic(magic));
            }
        }
        Ok(if buf.len() >= total { Some(total) } else { None })
    }

    /// Parses the frame that [`Frame::check`] found complete; `src` holds exactly it.
    pub fn parse(mut src: Bytes) -> Result<Frame, FrameError> {
        if src.len() < HEADER_LEN {
            return Err(FrameError::TooShort(src.len()));
        }
        let _len = src.get_u32();
        let magic = src.get_u16();
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let version = src.get_u8();
        let flags = src.get_u8();
        let opcode = src.get_u16();
        let epoch = src.get_u16();
        let request_id = src.get_u64();
        Ok(Frame { header: Header { version, flags, opcode, epoch, request_id }, body: src })
    }

    /// Appends the encoded frame to `dst`.
    pub fn encode_into(header: &Header, body: &[u8], dst: &mut BytesMut) -> Result<(), FrameError> {
        Frame::encode_head(header, body, 0, dst)
    }

    /// Appends the length, header and body of a frame whose `payload_len` bytes of payload
    /// the caller sends right after them.
    pub fn encode_head(header: &Header, body: &[u8], payload_len: usize, dst: &mut BytesMut) -> Result<(), FrameError> {
        let total = HEADER_LEN + body.len() + payload_len;
        if total > MAX_FRAME_LEN {
            return Err(FrameError::TooLarge(total));
        }
        dst.reserve(HEADER_LEN + body.len());
        dst.put_u32((total - 4) as u32);
        dst.put_u16(MAGIC);
        dst.put_u8(header.version);
        dst.put_u8(header.flags);
        dst.put_u16(header.opcode);
        dst.put_u16(header.epoch);
        dst.put_u64(header.request_id);
        dst.put_slice(body);
        Ok(())
    }

    /// True when this frame is a response.
    pub fn is_response(&self) -> bool {
        self.header.flags & FLAG_RESPONSE != 0
    }

    /// True when a payload follows the body.
    pub fn has_payload(&self) -> bool {
        self.header.flags & FLAG_PAYLOAD != 0
    }
}

/// An encoded frame ready to send: its head (length, header, body) and the payload chunks
/// that follow it, sent from where they are by one vectored write.
#[derive(Debug, Clone, Default)]
pub struct OutFrame {
    pub head: Bytes,
    pub payload: Vec<Bytes>,
}

impl OutFrame {
    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.iter().map(Bytes::len).sum::<usize>()
    }

    /// True for a frame of no bytes (never produced by the codec).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame's parts in wire order.
    pub fn parts(&self) -> impl Iterator<Item = &Bytes> {
        std::iter::once(&self.head).chain(self.payload.iter())
    }

    /// The whole frame in one buffer (tests and tools; the connections send the parts).
    pub fn to_bytes(&self) -> BytesMut {
        let mut out = BytesMut::with_capacity(self.len());
        for p in self.parts() {
            out.extend_from_slice(p);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_check() {
        let h = Header { version: 1, flags: 1, opcode: 7, epoch: 3, request_id: 42 };
        let mut buf = BytesMut::new();
        Frame::encode_into(&h, b"xyz", &mut buf).unwrap();
        assert_eq!(buf.len(), HEADER_LEN + 3);
        for cut in 0..buf.len() {
            assert_eq!(Frame::check(&buf[..cut]).ok().flatten(), None);
        }
        assert_eq!(Frame::check(&buf).unwrap(), Some(buf.len()));
        let f = Frame::parse(buf.freeze()).unwrap();
        assert_eq!(f.header, h);
        assert_eq!(&f.body[..], b"xyz");
    }

    #[test]
    fn refuses_garbage() {
        assert_eq!(Frame::check(b"\x7f\xff\xff\xff"), Err(FrameError::TooLarge(0x7fff_ffff + 4)));
        assert_eq!(Frame::check(b"\x00\x00\x00\x01"), Err(FrameError::TooShort(1)));
        assert_eq!(Frame::check(b"\x00\x00\x00\x20GE"), Err(FrameError::BadMagic(0x4745)));
    }
}
