//! Feeds arbitrary bytes to the frame checker and message decoders, as a server's or a
//! client's reader would. Run with `cargo +nightly fuzz run decode_frame` from `fuzz/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plusfs_proto::{decode_request, decode_response, Frame};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    // A stream may hold several frames back to back.
    while let Ok(Some(n)) = Frame::check(rest) {
        if let Ok(frame) = Frame::parse(bytes::Bytes::copy_from_slice(&rest[..n])) {
            let _ = decode_request(&frame);
            let _ = decode_response(&frame);
        }
        rest = &rest[n..];
    }
});
