//! The plusfs wire protocol.
//!
//! Every message travels in one length-prefixed [frame](frame): a fixed 20-byte header
//! (magic, protocol version, flags, opcode, request id) and a body encoded with
//! [postcard](https://postcard.jamesmunns.com/wire-format). Requests are [`Request`], replies
//! carry a [`Reply`] or a [`WireError`] (an errno plus a message). `docs/protocol.md` is the
//! human description of the same format; the golden-byte tests in `tests/golden.rs` pin it.
#![deny(unsafe_code)]

pub mod acl;
pub mod admin;
pub mod attr;
pub mod batch;
pub mod caps;
pub mod codec;
pub mod cred;
pub mod deleg;
pub mod errno;
pub mod error;
pub mod filedata;
pub mod frame;
pub mod hugedir;
pub mod ids;
pub mod io;
pub mod message;
pub mod migrate;
pub mod path;
pub mod payload;
pub mod peer;
pub mod perm;
pub mod quota;
pub mod record;
pub mod touch;

pub use admin::*;
pub use attr::*;
pub use batch::*;
pub use caps::{Capability, Receipt};
pub use codec::*;
pub use cred::{Cred, MAY_EXEC, MAY_READ, MAY_WRITE, VERIFIER_HANDLE};
pub use deleg::{name_digest, DelegGrant, DelegOp, Flushed};
pub use errno::Errno;
pub use error::WireError;
pub use filedata::{Piece, MAX_FILE_SIZE, MAX_RECORD};
pub use frame::{
    epoch_is_newer, Frame, FrameError, Header, OutFrame, FLAG_PAYLOAD, FLAG_RESPONSE, HEADER_LEN, MAGIC, MAX_FRAME_LEN,
    PROTOCOL_VERSION,
};
pub use hugedir::{DistInfo, DistReport, DistState, Distribution, DistributionWait, Threshold};
pub use ids::*;
pub use message::*;
pub use payload::Payload;
pub use peer::*;
pub use record::*;
pub use touch::Touch;
