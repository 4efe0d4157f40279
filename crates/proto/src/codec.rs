//! Encoding requests and replies into frames and back.

use crate::cred::Cred;
use crate::frame::{Frame, FrameError, Header, FLAG_RESPONSE, PROTOCOL_VERSION};
use crate::message::Call;
use crate::message::OPCODE_NAMES;
use crate::message::{Request, Response};
use crate::Errno;
use bytes::BytesMut;
use thiserror::Error;

/// Why a frame's body could not be turned into a message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("peer speaks protocol version {peer}, this build speaks {ours}")]
    Version { peer: u8, ours: u8 },
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    #[error("header opcode {header} does not match body opcode {body}")]
    OpcodeMismatch { header: u16, body: u16 },
    #[error("expected a {0} frame")]
    Direction(&'static str),
    #[error("malformed body: {0}")]
    Body(String),
}

impl DecodeError {
    /// The errno a caller sees for this error.
    pub fn errno(&self) -> Errno {
        match self {
            DecodeError::Frame(FrameError::TooLarge(_)) => Errno::EMSGSIZE,
            _ => Errno::EPROTO,
        }
    }
}

/// Encodes a request frame: `req` made by `cred` (the body is a [`Call`]).
pub fn encode_request(request_id: u64, cred: &Cred, req: &Request, dst: &mut BytesMut) -> Result<(), FrameError> {
    let body = postcard::to_allocvec(&(cred, req)).expect("in-memory encoding cannot fail");
    let header = Header { version: PROTOCOL_VERSION, flags: 0, opcode: req.opcode(), request_id };
    Frame::encode_into(&header, &body, dst)
}

/// Encodes a response frame for the request with `request_id` and `opcode`.
pub fn encode_response(request_id: u64, opcode: u16, resp: &Response, dst: &mut BytesMut) -> Result<(), FrameError> {
    let body = postcard::to_allocvec(resp).expect("in-memory encoding cannot fail");
    let header = Header { version: PROTOCOL_VERSION, flags: FLAG_RESPONSE, opcode, request_id };
    Frame::encode_into(&header, &body, dst)
}

fn check_version(h: &Header) -> Result<(), DecodeError> {
    if h.version != PROTOCOL_VERSION {
        return Err(DecodeError::Version { peer: h.version, ours: PROTOCOL_VERSION });
    }
    Ok(())
}

/// Decodes a request frame, checking version, direction and opcode.
pub fn decode_request(frame: &Frame) -> Result<Call, DecodeError> {
    check_version(&frame.header)?;
    if frame.is_response() {
        return Err(DecodeError::Direction("request"));
    }
    let op = frame.header.opcode;
    if op == 0 || op as usize >= OPCODE_NAMES.len() {
        return Err(DecodeError::UnknownOpcode(op));
    }
    let (call, rest): (Call, &[u8]) =
        postcard::take_from_bytes(&frame.body).map_err(|e| DecodeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Body(format!("{} trailing bytes", rest.len())));
    }
    if call.request.opcode() != op {
        return Err(DecodeError::OpcodeMismatch { header: op, body: call.request.opcode() });
    }
    Ok(call)
}

/// Decodes a response frame, checking version and direction.
pub fn decode_response(frame: &Frame) -> Result<Response, DecodeError> {
    if !frame.is_response() {
        return Err(DecodeError::Direction("response"));
    }
    if frame.header.version != PROTOCOL_VERSION {
        // A server that refuses our version says why in its own version's frame; report
        // the mismatch, which is the useful fact.
        return Err(DecodeError::Version { peer: frame.header.version, ours: PROTOCOL_VERSION });
    }
    let (resp, rest): (Response, &[u8]) =
        postcard::take_from_bytes(&frame.body).map_err(|e| DecodeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Body(format!("{} trailing bytes", rest.len())));
    }
    Ok(resp)
}
