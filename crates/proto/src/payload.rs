//! Bulk bytes of a message (file data), carried after the frame's encoded body instead
//! of inside it, so neither side copies them to build or take apart a frame.
//!
//! A message has at most one [`Payload`] field. Its postcard encoding is empty (a unit);
//! the bytes follow the body on the wire and the frame header's
//! [`FLAG_PAYLOAD`](crate::frame::FLAG_PAYLOAD) bit says so. The sender keeps the payload
//! as a list of shared chunks and hands them to one vectored write; the receiver's payload
//! is a slice of the buffer the frame was read into.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bulk bytes: one or more shared chunks, read in order.
#[derive(Clone, Default)]
pub struct Payload {
    chunks: Vec<Bytes>,
}

impl Payload {
    /// A payload made of `chunks`, in order (empty chunks are dropped).
    pub fn from_chunks(chunks: Vec<Bytes>) -> Payload {
        Payload { chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect() }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// The bytes as one contiguous buffer: shared, not copied, when there is one chunk.
    pub fn into_bytes(self) -> Bytes {
        match self.chunks.len() {
            0 => Bytes::new(),
            1 => self.chunks.into_iter().next().expect("one chunk"),
            _ => {
                let mut out = BytesMut::with_capacity(self.len());
                for c in &self.chunks {
                    out.extend_from_slice(c);
                }
                out.freeze()
            }
        }
    }

    /// Copies the bytes into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for c in &self.chunks {
            out.extend_from_slice(c);
        }
        out
    }

    /// Copies the bytes into `dst`, which must be exactly [`Payload::len`] long.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len(), "destination length");
        let mut at = 0;
        for c in &self.chunks {
            dst[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Payload {
        Payload::from_chunks(vec![b])
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::from(Bytes::from(v))
    }
}

impl From<&[u8]> for Payload {
    fn from(s: &[u8]) -> Payload {
        Payload::from(Bytes::copy_from_slice(s))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        self.len() == other.len()
            && self.chunks.iter().flat_map(|c| c.iter()).eq(other.chunks.iter().flat_map(|c| c.iter()))
    }
}

impl Eq for Payload {}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.len())
    }
}

/// Encodes as nothing: the bytes travel after the frame's body.
impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

/// Decodes as an empty payload; the codec fills it from the frame.
impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
        <()>::deserialize(d)?;
        Ok(Payload::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_read_as_one() {
        let p = Payload::from_chunks(vec![Bytes::from_static(b"ab"), Bytes::new(), Bytes::from_static(b"cde")]);
        assert_eq!(p.len(), 5);
        assert_eq!(p.chunks().len(), 2);
        assert_eq!(p.to_vec(), b"abcde");
        assert_eq!(p, Payload::from(b"abcde".to_vec()));
        assert_ne!(p, Payload::from(b"abcdf".to_vec()));
        let mut dst = [0u8; 5];
        p.copy_to(&mut dst);
        assert_eq!(&dst, b"abcde");
        assert_eq!(&p.into_bytes()[..], b"abcde");
    }

    #[test]
    fn one_chunk_is_shared_not_copied() {
        let b = Bytes::from(vec![7u8; 1000]);
        let out = Payload::from(b.clone()).into_bytes();
        assert_eq!(out.as_ptr(), b.as_ptr());
    }

    #[test]
    fn encodes_as_nothing() {
        assert!(postcard::to_allocvec(&Payload::from(vec![1, 2, 3])).unwrap().is_empty());
        let p: Payload = postcard::from_bytes(&[]).unwrap();
        assert!(p.is_empty());
    }
}
