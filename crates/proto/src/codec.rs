//! Encoding requests and replies into frames and back.

use crate::cred::Cred;
use crate::frame::{Frame, FrameError, Header, OutFrame, FLAG_PAYLOAD, FLAG_RESPONSE, PROTOCOL_VERSION};
use crate::message::Call;
use crate::message::OPCODE_NAMES;
use crate::message::{Reply, Request, Response};
use crate::payload::Payload;
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

/// Encodes a request frame: `req` made by `cred` (the body is a [`Call`]), with no epoch hint.
pub fn encode_request(request_id: u64, cred: &Cred, req: &Request) -> Result<OutFrame, FrameError> {
    encode_request_at(request_id, 0, cred, req)
}

/// Encodes a request frame from a sender whose cluster map is at `epoch`.
pub fn encode_request_at(request_id: u64, epoch: u64, cred: &Cred, req: &Request) -> Result<OutFrame, FrameError> {
    let body = postcard::to_allocvec(&(cred, req)).expect("in-memory encoding cannot fail");
    let header = Header { version: PROTOCOL_VERSION, flags: 0, opcode: req.opcode(), epoch: epoch as u16, request_id };
    out_frame(header, &body, req.payload())
}

/// Encodes a response frame for the request with `request_id` and `opcode`, with no epoch hint.
pub fn encode_response(request_id: u64, opcode: u16, resp: &Response) -> Result<OutFrame, FrameError> {
    encode_response_at(request_id, 0, opcode, resp)
}

/// Encodes a response frame from a server whose cluster map is at `epoch`.
pub fn encode_response_at(request_id: u64, epoch: u64, opcode: u16, resp: &Response) -> Result<OutFrame, FrameError> {
    let body = postcard::to_allocvec(resp).expect("in-memory encoding cannot fail");
    let header = Header { version: PROTOCOL_VERSION, flags: FLAG_RESPONSE, opcode, epoch: epoch as u16, request_id };
    out_frame(header, &body, response_payload(resp))
}

fn out_frame(mut header: Header, body: &[u8], payload: Option<&Payload>) -> Result<OutFrame, FrameError> {
    let payload_len = payload.map_or(0, Payload::len);
    if payload.is_some() {
        header.flags |= FLAG_PAYLOAD;
    }
    let mut head = BytesMut::new();
    Frame::encode_head(&header, body, payload_len, &mut head)?;
    Ok(OutFrame { head: head.freeze(), payload: payload.map(|p| p.chunks().to_vec()).unwrap_or_default() })
}

fn response_payload(resp: &Response) -> Option<&Payload> {
    match resp {
        Ok(Reply::Data(p)) => Some(p),
        _ => None,
    }
}

/// Puts the bytes after a decoded body (`used` bytes long) into the message's payload
/// field `slot`. A message without one must end with its body; the header's payload flag
/// must agree with the message.
fn attach(frame: &Frame, used: usize, slot: Option<&mut Payload>) -> Result<(), DecodeError> {
    let rest = frame.body.len() - used;
    match slot {
        Some(p) if frame.has_payload() => {
            *p = Payload::from(frame.body.slice(used..));
            Ok(())
        }
        None if !frame.has_payload() && rest == 0 => Ok(()),
        None if rest > 0 => Err(DecodeError::Body(format!("{rest} trailing bytes"))),
        _ => Err(DecodeError::Body("payload flag disagrees with the message".into())),
    }
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
    let (mut call, rest): (Call, &[u8]) =
        postcard::take_from_bytes(&frame.body).map_err(|e| DecodeError::Body(e.to_string()))?;
    if call.request.opcode() != op {
        return Err(DecodeError::OpcodeMismatch { header: op, body: call.request.opcode() });
    }
    attach(frame, frame.body.len() - rest.len(), call.request.payload_mut())?;
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
    let (mut resp, rest): (Response, &[u8]) =
        postcard::take_from_bytes(&frame.body).map_err(|e| DecodeError::Body(e.to_string()))?;
    let used = frame.body.len() - rest.len();
    let slot = match &mut resp {
        Ok(Reply::Data(p)) => Some(p),
        _ => None,
    };
    attach(frame, used, slot)?;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Frame, FLAG_PAYLOAD};

    fn roundtrip(req: &Request) -> (Frame, Call) {
        let frame = Frame::parse(encode_request(1, &Cred::server(), req).unwrap().to_bytes().freeze()).unwrap();
        let call = decode_request(&frame).unwrap();
        (frame, call)
    }

    #[test]
    fn payloads_travel_after_the_body_also_when_nested() {
        let write = Request::Write { path: "/h/f".into(), offset: 3, data: vec![7u8; 5000].into(), append: false };
        for req in [
            write.clone(),
            Request::Shard { incarnation: 2, op: Box::new(write.clone()) },
            Request::OnInode { ino: 9, op: Box::new(write.clone()) },
        ] {
            let (frame, call) = roundtrip(&req);
            assert!(frame.has_payload());
            assert_eq!(call.request, req);
            assert!(frame.body.len() >= 5000 && frame.body.len() < 5100, "the data is sent once");
        }
        let (frame, call) = roundtrip(&Request::Stat { path: "/x".into() });
        assert_eq!(frame.header.flags & FLAG_PAYLOAD, 0);
        assert_eq!(call.request, Request::Stat { path: "/x".into() });
    }

    #[test]
    fn a_payload_flag_that_disagrees_with_the_message_is_refused() {
        let mut bytes = encode_request(1, &Cred::server(), &Request::Stat { path: "/x".into() }).unwrap().to_bytes();
        bytes[7] |= FLAG_PAYLOAD;
        let frame = Frame::parse(bytes.freeze()).unwrap();
        assert!(matches!(decode_request(&frame), Err(DecodeError::Body(_))));
        let probe = Request::Probe { data: vec![1, 2].into(), reply_len: 0 };
        let mut bytes = encode_request(1, &Cred::server(), &probe).unwrap().to_bytes();
        bytes[7] &= !FLAG_PAYLOAD;
        let frame = Frame::parse(bytes.freeze()).unwrap();
        assert!(matches!(decode_request(&frame), Err(DecodeError::Body(_))));
    }

    #[test]
    fn a_reply_payload_is_a_slice_of_the_frame() {
        let resp: Response = Ok(Reply::Data(vec![4u8; 70_000].into()));
        let out = encode_response(5, 29, &resp).unwrap();
        assert_eq!(out.payload.len(), 1, "the data is not copied into the head");
        let frame = Frame::parse(out.to_bytes().freeze()).unwrap();
        let Ok(Reply::Data(p)) = decode_response(&frame).unwrap() else { panic!("a data reply") };
        let b = p.into_bytes();
        assert_eq!(b.len(), 70_000);
        let body = frame.body.as_ptr() as usize;
        assert!((b.as_ptr() as usize) >= body && (b.as_ptr() as usize) < body + frame.body.len());
    }
}
