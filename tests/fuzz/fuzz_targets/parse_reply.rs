//! Fuzzes backend reply framing (`frame_reply`) and `ValueBlocks` with
//! arbitrary bytes, for both kinds of reply.
//!
//! A framed reply must lie within the input and end with a newline, every
//! strict prefix of it must wait for more bytes, and the `VALUE` blocks found
//! in it must tile its start without leaving it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memring::protocol::{frame_reply, ReplyKind, ValueBlocks};

fuzz_target!(|input: &[u8]| {
    for kind in [ReplyKind::Line, ReplyKind::Values] {
        if let Ok(Some(n)) = frame_reply(input, kind) {
            assert!(n > 0 && n <= input.len());
            assert_eq!(input[n - 1], b'\n');
            for cut in [0, n / 2, n - 1] {
                assert_eq!(frame_reply(&input[..cut], kind), Ok(None), "cut at {cut}");
            }
            blocks_in_bounds(&input[..n]);
        }
    }
    blocks_in_bounds(input);
});

/// `ValueBlocks` yields consecutive blocks from the start, each within `reply`
/// and holding its key.
fn blocks_in_bounds(reply: &[u8]) {
    let mut at = 0;
    for block in ValueBlocks::new(reply) {
        assert_eq!(block.block.start, at);
        assert!(block.block.start < block.block.end && block.block.end <= reply.len());
        assert!(block.block.start < block.key.start);
        assert!(block.key.start < block.key.end && block.key.end < block.block.end);
        assert!(reply[block.block.clone()].starts_with(b"VALUE "));
        assert!(reply[block.block.clone()].ends_with(b"\r\n"));
        at = block.block.end;
    }
}
