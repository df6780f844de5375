//! Backend reply framing: how many bytes of a buffer form one complete reply to
//! a given kind of command, and the `VALUE` blocks inside a retrieval reply.
//!
//! Pure: no I/O. The backend connection uses [`frame_reply`] to cut replies off
//! its read buffer in order; the session uses [`ValueBlocks`] to merge the
//! replies of a multi-get that was split across servers.

use memchr::memchr;
use nom::bytes::complete::{tag, take_till1};
use nom::character::complete::{char as one_char, u32 as decimal_u32, u64 as decimal_u64};
use nom::combinator::{all_consuming, opt};
use nom::sequence::preceded;
use nom::Parser;

use super::ReplyKind;

/// Longest reply line memring accepts from a backend. memcached's longest lines
/// are `VALUE` headers (a 250-byte key plus three numbers) and error messages.
pub const MAX_REPLY_LINE_BYTES: usize = 8 * 1024;

/// Largest value a backend may return: memcached's own hard item size limit
/// (`-I` accepts at most 1 GiB).
pub const MAX_REPLY_VALUE_BYTES: usize = 1024 * 1024 * 1024;

/// A backend sent something that is not a memcached reply. The connection can
/// no longer be trusted to be in step and must be dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("reply line longer than {MAX_REPLY_LINE_BYTES} bytes")]
    LineTooLong,
    #[error("malformed VALUE line")]
    BadValueLine,
    #[error("value block not followed by CRLF")]
    BadDataChunk,
    #[error("reply with no request waiting for it")]
    Unsolicited,
}

/// Length of the complete reply at the start of `buf`, or `Ok(None)` if more
/// bytes are needed.
///
/// # Errors
/// A reply that cannot be framed (see [`ReplyError`]).
pub fn frame_reply(buf: &[u8], kind: ReplyKind) -> Result<Option<usize>, ReplyError> {
    match kind {
        ReplyKind::Line => Ok(line_len(buf)?),
        ReplyKind::Values => {
            let mut at = 0;
            loop {
                match next_block(&buf[at..])? {
                    Step::Incomplete => return Ok(None),
                    Step::Value { len, .. } => at += len,
                    Step::End { len } => return Ok(Some(at + len)),
                }
            }
        }
    }
}

/// One `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n` block, as ranges into
/// the reply it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueBlock {
    /// Where the key is, inside the reply.
    pub key: std::ops::Range<usize>,
    /// The whole block, header to trailing `\r\n`.
    pub block: std::ops::Range<usize>,
}

/// Iterates the `VALUE` blocks of one complete retrieval reply; stops at `END`
/// or at any other line (an error that replaced the rest of the reply).
pub struct ValueBlocks<'a> {
    reply: &'a [u8],
    at: usize,
}

impl<'a> ValueBlocks<'a> {
    pub fn new(reply: &'a [u8]) -> Self {
        ValueBlocks { reply, at: 0 }
    }
}

impl Iterator for ValueBlocks<'_> {
    type Item = ValueBlock;

    fn next(&mut self) -> Option<ValueBlock> {
        match next_block(&self.reply[self.at..]) {
            Ok(Step::Value { len, key }) => {
                let start = self.at;
                self.at += len;
                Some(ValueBlock {
                    key: start + key.start..start + key.end,
                    block: start..self.at,
                })
            }
            _ => None,
        }
    }
}

/// Whether a reply is a bare `END` or a `VALUE` list (as opposed to an error).
pub fn is_error_reply(reply: &[u8]) -> bool {
    reply.starts_with(b"ERROR")
        || reply.starts_with(b"CLIENT_ERROR")
        || reply.starts_with(b"SERVER_ERROR")
}

enum Step {
    Incomplete,
    Value {
        len: usize,
        key: std::ops::Range<usize>,
    },
    End {
        len: usize,
    },
}

fn line_len(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    let window = &buf[..buf.len().min(MAX_REPLY_LINE_BYTES)];
    match memchr(b'\n', window) {
        Some(newline) => Ok(Some(newline + 1)),
        None if buf.len() >= MAX_REPLY_LINE_BYTES => Err(ReplyError::LineTooLong),
        None => Ok(None),
    }
}

fn next_block(buf: &[u8]) -> Result<Step, ReplyError> {
    let Some(len) = line_len(buf)? else {
        return Ok(Step::Incomplete);
    };
    if !buf.starts_with(b"VALUE ") {
        // `END`, or an error line that ends the reply.
        return Ok(Step::End { len });
    }
    let header = buf[..len]
        .strip_suffix(b"\r\n")
        .ok_or(ReplyError::BadValueLine)?;
    let (key, value_len) = parse_value_header(header).ok_or(ReplyError::BadValueLine)?;
    if value_len > MAX_REPLY_VALUE_BYTES {
        return Err(ReplyError::BadValueLine);
    }
    let total = len + value_len + 2;
    if buf.len() < total {
        return Ok(Step::Incomplete);
    }
    if &buf[total - 2..total] != b"\r\n" {
        return Err(ReplyError::BadDataChunk);
    }
    Ok(Step::Value { len: total, key })
}

/// Parses `VALUE <key> <flags> <bytes> [<cas>]` (without the line ending) and
/// returns the key's range and the value length.
fn parse_value_header(header: &[u8]) -> Option<(std::ops::Range<usize>, usize)> {
    type E<'a> = nom::error::Error<&'a [u8]>;
    let space = || one_char::<_, E<'_>>(' ');
    let mut parser = all_consuming((
        tag::<_, _, E<'_>>("VALUE "),
        take_till1(|b| b == b' '),
        preceded(space(), decimal_u32),
        preceded(space(), decimal_u64),
        opt(preceded(space(), decimal_u64)),
    ));
    let (_, (_, key, _flags, value_len, _cas)) = parser.parse(header).ok()?;
    let key_start = "VALUE ".len();
    Some((
        key_start..key_start + key.len(),
        usize::try_from(value_len).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_line_replies_end_at_their_newline() {
        assert_eq!(frame_reply(b"STORED\r\nDEL", ReplyKind::Line), Ok(Some(8)));
        assert_eq!(frame_reply(b"STOR", ReplyKind::Line), Ok(None));
    }

    #[test]
    fn retrieval_reply_ends_after_end() {
        let reply = b"VALUE a 0 3\r\nx\r\n\r\nVALUE b 5 1 99\r\nz\r\nEND\r\nSTORED\r\n";
        assert_eq!(
            frame_reply(reply, ReplyKind::Values),
            Ok(Some(reply.len() - 8))
        );
    }

    #[test]
    fn every_prefix_of_a_retrieval_reply_is_incomplete() {
        let reply = b"VALUE a 0 3\r\nx\r\n\r\nEND\r\n";
        for cut in 0..reply.len() {
            assert_eq!(
                frame_reply(&reply[..cut], ReplyKind::Values),
                Ok(None),
                "{cut}"
            );
        }
    }

    #[test]
    fn error_line_ends_a_retrieval_reply() {
        let reply = b"SERVER_ERROR out of memory\r\n";
        assert_eq!(frame_reply(reply, ReplyKind::Values), Ok(Some(reply.len())));
        assert!(is_error_reply(reply));
        assert!(!is_error_reply(b"END\r\n"));
    }

    #[test]
    fn malformed_value_blocks_are_errors() {
        assert_eq!(
            frame_reply(b"VALUE a 0 x\r\n", ReplyKind::Values),
            Err(ReplyError::BadValueLine)
        );
        assert_eq!(
            frame_reply(b"VALUE a 0 1\r\nxyz\r\n", ReplyKind::Values),
            Err(ReplyError::BadDataChunk)
        );
        assert_eq!(
            frame_reply(&[b'x'; MAX_REPLY_LINE_BYTES], ReplyKind::Line),
            Err(ReplyError::LineTooLong)
        );
    }

    #[test]
    fn value_blocks_yield_keys_and_whole_blocks() {
        let reply = b"VALUE ka 0 1\r\nx\r\nVALUE kb 0 2 7\r\nyz\r\nEND\r\n";
        let blocks: Vec<_> = ValueBlocks::new(reply).collect();
        assert_eq!(blocks.len(), 2);
        assert_eq!(&reply[blocks[0].key.clone()], b"ka");
        assert_eq!(&reply[blocks[1].key.clone()], b"kb");
        assert_eq!(&reply[blocks[1].block.clone()], b"VALUE kb 0 2 7\r\nyz\r\n");
    }
}
