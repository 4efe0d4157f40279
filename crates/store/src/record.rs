//! The framing of the records a server's protocols keep in the store (log records, record
//! locations): two magic bytes, the record's format version, a CRC-32C of the body, then
//! the body. A reader learns the version before it decodes, and a torn or flipped record
//! is refused instead of decoded into nonsense.
//!
//! Records written by earlier builds are unframed postcard. The magic `A7 00` never starts
//! one: their first field is a varint (a number, a length or an enum's variant), and
//! postcard never follows a byte with the continuation bit set by a zero byte. So a reader
//! tells the two apart without guessing.

/// First bytes of every framed record.
pub const MAGIC: [u8; 2] = [0xA7, 0x00];
const HEADER: usize = 7;

/// `body` framed as a record of format `version`.
pub fn frame(version: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&MAGIC);
    out.push(version);
    out.extend_from_slice(&crc32c::crc32c(body).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Why bytes are not a sound framed record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a framed record (written by an earlier build)")]
    NotFramed,
    #[error("record of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("checksum mismatch")]
    Checksum,
}

/// Whether `bytes` is a framed record (else: an unframed one of an earlier build).
pub fn is_framed(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// The version and body of a framed record, or why it is not a sound one.
pub fn unframe(bytes: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    if !is_framed(bytes) {
        return Err(FrameError::NotFramed);
    }
    if bytes.len() < HEADER {
        return Err(FrameError::Short(bytes.len()));
    }
    let (crc, body) = (&bytes[3..HEADER], &bytes[HEADER..]);
    if u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) != crc32c::crc32c(body) {
        return Err(FrameError::Checksum);
    }
    Ok((bytes[2], body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_version_and_checksum() {
        let framed = frame(3, b"hello");
        assert_eq!(unframe(&framed).unwrap(), (3, &b"hello"[..]));
        let mut flipped = framed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(unframe(&flipped).unwrap_err(), FrameError::Checksum);
        assert!(unframe(&framed[..4]).is_err());
        assert!(!is_framed(b"\x00legacy bytes"));
        // A legacy record whose first varint starts with A7 goes on with a non-zero byte.
        assert!(!is_framed(&[0xA7, 0x01, 5]));
    }
}
