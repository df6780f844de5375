//! Backend reply framing.
//!
//! [`next_piece`] is the strict framer the backend connection uses: each reply
//! is checked against what its request allows ([`Expect`]): a storage command
//! gets one of memcached's storage lines or an error line, a retrieval gets
//! `VALUE` blocks for the keys it asked for, in the order asked, each with its
//! exact data, then `END`. Anything else is a [`ReplyError`], and the
//! connection that sent it can no longer be trusted to be in step.
//!
//! [`frame_reply`] and [`ValueBlocks`] are the lenient framers test clients and
//! benches use to find message boundaries. Pure: no I/O here.

use bytes::Bytes;
use memchr::memchr;

/// One framed part of a reply, as [`next_piece`] cuts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// A whole `VALUE` block (header, data, `\r\n`) of a retrieval.
    Value(Bytes),
    /// The one line of a one-line reply, or an error line that ended a
    /// retrieval.
    Line(Bytes),
}

impl Got {
    /// The bytes this piece holds.
    pub fn len(&self) -> usize {
        match self {
            Got::Value(bytes) | Got::Line(bytes) => bytes.len(),
        }
    }

    /// Never empty; for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a test client finds the end of a reply (see [`frame_reply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// Exactly one line (`STORED`, `DELETED`, a number, an error, ...).
    Line,
    /// Zero or more `VALUE` blocks, then `END` (or a single error line).
    Values,
}

// The reply bounds live in the parent module, which both dialects' framing
// reads: `meta::reply` importing them from here made the two files import
// each other.
pub use super::{MAX_REPLY_LINE_BYTES, MAX_REPLY_VALUE_BYTES};

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
    #[error("reply line not allowed for the request")]
    UnexpectedLine,
    #[error("VALUE for a key that was not asked for")]
    KeyNotRequested,
    #[error("value longer than max_value_bytes")]
    ValueTooLarge,
    #[error("{0}")]
    Meta(#[from] super::meta::reply::MetaReplyError),
}

/// One-line replies a command allows, besides memcached's error lines
/// (`ERROR`, `CLIENT_ERROR <msg>`, `SERVER_ERROR <msg>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// `STORED`, `NOT_STORED`, `EXISTS`, `NOT_FOUND`.
    Storage,
    /// `DELETED`, `NOT_FOUND`.
    Delete,
    /// A decimal number, `NOT_FOUND`.
    Arithmetic,
    /// `TOUCHED`, `NOT_FOUND`.
    Touch,
    /// `OK` (`flush_all`, `verbosity`).
    Ok,
    /// `VERSION <text>`.
    Version,
}

/// What the reply to one request written to a server may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// One line of the given kind, or an error line.
    Line(LineKind),
    /// `VALUE` blocks for keys of `request` (the retrieval line exactly as
    /// sent), in its order, then `END`; or one error line.
    Values {
        request: bytes::Bytes,
        /// Offset in `request` from which the next `VALUE` key is looked for.
        cursor: usize,
        /// `gets`/`gats` replies carry a cas unique; `get`/`gat` ones do not.
        with_cas: bool,
    },
    /// `STAT` lines then `END` (`stats settings`, asked by memring itself).
    Stats,
    /// The reply to one meta command, framed by
    /// [`super::meta::reply::frame_meta_reply`].
    ///
    /// `quiet`: the request carried `q` and memring sent `mn` right after it,
    /// so the reply is whatever memcached did not suppress (nothing, or one
    /// reply, handed on as a [`Piece::Value`]) and then `MN`, which ends it
    /// and is not handed on. This is how a proxy learns that a quiet reply is
    /// absent without guessing what memcached suppresses.
    Meta {
        command: super::meta::MetaCommand,
        quiet: bool,
        /// The one reply before `MN` has been seen (quiet only).
        replied: bool,
        /// An `mg` of memring's own that must see a hand-off lease as the
        /// item it is (`protocol::lease`); to every other reader, and
        /// to every client, a lease is a miss.
        leases_shown: bool,
    },
}

impl Expect {
    /// A meta command's reply, framed for a client: a lease is a miss.
    pub fn meta(command: super::meta::MetaCommand, quiet: bool) -> Expect {
        Expect::Meta {
            command,
            quiet,
            replied: false,
            leases_shown: false,
        }
    }

    /// Whether a hand-off lease in the reply reads as a miss.
    pub fn hides_leases(&self) -> bool {
        !matches!(
            self,
            Expect::Meta {
                leases_shown: true,
                ..
            }
        )
    }

    /// The expectation for a retrieval line `request` (`get k1 k2\r\n`,
    /// `gat 10 k1\r\n`, ...) as it is written to the server.
    pub fn values(request: bytes::Bytes) -> Expect {
        // The command is a few bytes long: a byte loop finds its end for
        // less than a `memchr` call costs to set up.
        let command_end = request
            .iter()
            .position(|&b| b == b' ')
            .unwrap_or(request.len());
        let command = &request[..command_end];
        let mut cursor = command_end;
        if command == b"gat" || command == b"gats" {
            // Skip the exptime: it is not a key.
            let rest = &request[cursor..];
            let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
            let end = memchr(b' ', &rest[start..]).map_or(rest.len(), |i| start + i);
            cursor += end;
        }
        Expect::Values {
            with_cas: command == b"gets" || command == b"gats",
            request,
            cursor,
        }
    }
}

/// [`next_piece`] for a meta command (see [`Expect::Meta`]).
fn next_meta_piece(
    buf: &[u8],
    command: super::meta::MetaCommand,
    quiet: bool,
    replied: &mut bool,
) -> Result<Option<Piece>, ReplyError> {
    use super::meta::reply::{frame_meta_reply, MetaReplyError};
    if !quiet {
        return Ok(frame_meta_reply(buf, command)?.map(|reply| {
            if reply.status.is_error() {
                Piece::Error { len: reply.len }
            } else {
                Piece::Last { len: reply.len }
            }
        }));
    }
    if buf.starts_with(b"MN\r\n") {
        return Ok(Some(Piece::Last { len: 4 }));
    }
    if *replied {
        // One reply at most before the `mn` memring appended.
        return if buf.len() < 4 && b"MN\r\n".starts_with(buf) {
            Ok(None)
        } else {
            Err(MetaReplyError::Unexpected.into())
        };
    }
    if buf.len() < 4 && b"MN\r\n".starts_with(buf) {
        return Ok(None);
    }
    Ok(frame_meta_reply(buf, command)?.map(|reply| {
        *replied = true;
        Piece::Value {
            len: reply.len,
            key: 0..0,
            data: 0,
        }
    }))
}

/// One framed part of a reply, as a length from the start of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A `VALUE` block (header, data, `\r\n`); the reply goes on.
    Value {
        len: usize,
        /// The key's range inside the block.
        key: std::ops::Range<usize>,
        /// The data's length.
        data: usize,
    },
    /// The reply's last line: `END` of a retrieval, or the one line of a
    /// one-line reply.
    Last { len: usize },
    /// An error line (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`) ending the reply.
    Error { len: usize },
}

/// Frames the next piece of the reply at the start of `buf` against what
/// the request allows; `Ok(None)` when more bytes are needed. `expect` is
/// advanced past each `VALUE` key it accepts.
///
/// # Errors
/// Anything memcached would not send in reply to that request.
pub fn next_piece(
    buf: &[u8],
    expect: &mut Expect,
    max_value_bytes: usize,
) -> Result<Option<Piece>, ReplyError> {
    if let Expect::Meta {
        command,
        quiet,
        replied,
        ..
    } = expect
    {
        return next_meta_piece(buf, *command, *quiet, replied);
    }
    let Some(len) = line_len(buf)? else {
        return Ok(None);
    };
    let Some(line) = buf[..len].strip_suffix(b"\r\n") else {
        return Err(ReplyError::UnexpectedLine);
    };
    if line == b"ERROR" && answers_only_parsed_lines(expect) {
        // memcached says a bare `ERROR` only to a command it cannot parse;
        // memring parsed and validated this one, so the line answers some
        // other request: the connection is out of step.
        return Err(ReplyError::UnexpectedLine);
    }
    if is_error_line(line) {
        // memcached answers memring's own `stats settings` with its settings,
        // never with an error.
        if matches!(expect, Expect::Stats) {
            return Err(ReplyError::UnexpectedLine);
        }
        return Ok(Some(Piece::Error { len }));
    }
    match expect {
        // Framed by `next_meta_piece` above.
        Expect::Meta { .. } => Err(ReplyError::UnexpectedLine),
        Expect::Line(kind) => {
            if line_allowed(*kind, line) {
                Ok(Some(Piece::Last { len }))
            } else {
                Err(ReplyError::UnexpectedLine)
            }
        }
        Expect::Stats => {
            if line == b"END" {
                Ok(Some(Piece::Last { len }))
            } else if line.starts_with(b"STAT ") {
                Ok(Some(Piece::Value {
                    len,
                    key: 0..0,
                    data: 0,
                }))
            } else {
                Err(ReplyError::UnexpectedLine)
            }
        }
        Expect::Values {
            request,
            cursor,
            with_cas,
        } => {
            if line == b"END" {
                return Ok(Some(Piece::Last { len }));
            }
            let (key, value_len, cas) = parse_value_header(line).ok_or(ReplyError::BadValueLine)?;
            if cas != *with_cas {
                return Err(ReplyError::BadValueLine);
            }
            if value_len > max_value_bytes {
                return Err(ReplyError::ValueTooLarge);
            }
            let total = len + value_len + 2;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[total - 2..total] != b"\r\n" {
                return Err(ReplyError::BadDataChunk);
            }
            *cursor = find_key(request, *cursor, &line[key.clone()])
                .ok_or(ReplyError::KeyNotRequested)?;
            Ok(Some(Piece::Value {
                len: total,
                key,
                data: value_len,
            }))
        }
    }
}

/// The offset just past the first token at or after `from` in `request`'s
/// line that equals `key`.
fn find_key(request: &[u8], from: usize, key: &[u8]) -> Option<usize> {
    // The line ends at its CR, LF or NUL (memcached reads it as a C string).
    // `from` is within the line (just past an earlier key) or at its start,
    // and memcached answers keys in the order asked, so the key is nearly
    // always the next token: one scan over that token (`scan::first_stop`)
    // costs less than a memchr set up for the line's end and then for each.
    let ends_token = |b: u8| matches!(b, b' ' | b'\r' | b'\n' | 0);
    let mut at = from.min(request.len());
    loop {
        while request.get(at) == Some(&b' ') {
            at += 1;
        }
        let start = at;
        at = super::scan::first_stop(&request[start..], ends_token)
            .map_or(request.len(), |i| start + i);
        if at == start {
            // The end of the line (or of the request).
            return None;
        }
        if &request[start..at] == key {
            return Some(at);
        }
    }
}

/// Requests memring forwards only after parsing them as memcached would, so
/// that a bare `ERROR` cannot be their reply (for memring's own probe, see
/// [`next_piece`]: no error line at all).
fn answers_only_parsed_lines(expect: &Expect) -> bool {
    match expect {
        Expect::Values { .. } => true,
        Expect::Line(kind) => matches!(
            kind,
            LineKind::Storage | LineKind::Delete | LineKind::Arithmetic | LineKind::Touch
        ),
        Expect::Stats | Expect::Meta { .. } => false,
    }
}

fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR"
        || line.starts_with(b"ERROR ")
        || line.starts_with(b"CLIENT_ERROR ")
        || line.starts_with(b"SERVER_ERROR ")
}

fn line_allowed(kind: LineKind, line: &[u8]) -> bool {
    match kind {
        LineKind::Storage => matches!(line, b"STORED" | b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND"),
        LineKind::Delete => matches!(line, b"DELETED" | b"NOT_FOUND"),
        // 2^64 - 1 has 20 digits.
        LineKind::Arithmetic => {
            line == b"NOT_FOUND"
                || (!line.is_empty() && line.len() <= 20 && line.iter().all(u8::is_ascii_digit))
        }
        LineKind::Touch => matches!(line, b"TOUCHED" | b"NOT_FOUND"),
        LineKind::Ok => line == b"OK",
        LineKind::Version => line.starts_with(b"VERSION "),
    }
}

/// `item_size_max` from a `stats settings` reply, if present.
pub fn item_size_max(reply: &[u8]) -> Option<usize> {
    reply
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"STAT item_size_max "))
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|rest| rest.trim_end().parse().ok())
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

/// The length the value piece at the start of `buf` will have once whole,
/// when its first line (`VALUE …` or `VA <size> …`) has arrived and the
/// rest has not: what a read buffer needs room for. `None` for anything
/// else (including a malformed header, which framing then refuses).
pub fn pending_value_len(buf: &[u8]) -> Option<usize> {
    let newline = memchr(b'\n', &buf[..buf.len().min(MAX_REPLY_LINE_BYTES)])?;
    let line = buf[..newline].strip_suffix(b"\r")?;
    let size = if line.starts_with(b"VALUE ") {
        parse_value_header(line)?.1
    } else {
        super::meta::reply::value_size(line)?
    };
    let total = (newline + 1).checked_add(size)?.checked_add(2)?;
    (buf.len() < total && size <= MAX_REPLY_VALUE_BYTES).then_some(total)
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
    let (key, value_len, _) = parse_value_header(header).ok_or(ReplyError::BadValueLine)?;
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
/// returns the key's range, the value length and whether a cas was present.
fn parse_value_header(header: &[u8]) -> Option<(std::ops::Range<usize>, usize, bool)> {
    // By hand rather than with parser combinators: every value a get
    // returns passes here, and this takes about a third of the instructions.
    // The grammar is `VALUE <key> <flags u32> <bytes u64>[ <cas u64>]`, the
    // whole header and nothing else (a test keeps it equal to a nom parser).
    let key_start = "VALUE ".len();
    let rest = header.strip_prefix(b"VALUE ")?;
    let key_len = memchr(b' ', rest)?;
    if key_len == 0 {
        return None;
    }
    let (_flags, rest) = spaced_decimal(&rest[key_len..], u64::from(u32::MAX))?;
    let (value_len, rest) = spaced_decimal(rest, u64::MAX)?;
    let cas = !rest.is_empty();
    if cas && !spaced_decimal(rest, u64::MAX)?.1.is_empty() {
        return None;
    }
    Some((
        key_start..key_start + key_len,
        usize::try_from(value_len).ok()?,
        cas,
    ))
}

/// A space and then decimal digits at the start of `buf`: their value
/// (`None` when there are none, or past `max`) and what follows them.
fn spaced_decimal(buf: &[u8], max: u64) -> Option<(u64, &[u8])> {
    let digits = buf.strip_prefix(b" ")?;
    let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if len == 0 {
        return None;
    }
    let mut value: u64 = 0;
    for &digit in &digits[..len] {
        value = value
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    (value <= max).then_some((value, &digits[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value header's grammar as parser combinators: what
    /// `parse_value_header` replaced, kept as its oracle.
    fn value_header_by_nom(header: &[u8]) -> Option<(std::ops::Range<usize>, usize, bool)> {
        use nom::bytes::complete::{tag, take_till1};
        use nom::character::complete::{char as one_char, u32 as decimal_u32, u64 as decimal_u64};
        use nom::combinator::{all_consuming, opt};
        use nom::sequence::preceded;
        use nom::Parser;
        type E<'a> = nom::error::Error<&'a [u8]>;
        let space = || one_char::<_, E<'_>>(' ');
        let mut parser = all_consuming((
            tag::<_, _, E<'_>>("VALUE "),
            take_till1(|b| b == b' '),
            preceded(space(), decimal_u32),
            preceded(space(), decimal_u64),
            opt(preceded(space(), decimal_u64)),
        ));
        let (_, (_, key, _flags, value_len, cas)) = parser.parse(header).ok()?;
        let key_start = "VALUE ".len();
        Some((
            key_start..key_start + key.len(),
            usize::try_from(value_len).ok()?,
            cas.is_some(),
        ))
    }

    #[test]
    fn a_value_header_parses_as_its_combinator_grammar_does() {
        let headers: &[&[u8]] = &[
            b"VALUE k 0 32",
            b"VALUE key:123 4294967295 18446744073709551615",
            b"VALUE k 4294967296 1",
            b"VALUE k 0 18446744073709551616",
            b"VALUE k 5 3 99",
            b"VALUE k 5 3 18446744073709551615",
            b"VALUE k 5 3 18446744073709551616",
            b"VALUE k 5 3 99 ",
            b"VALUE k 5 3 99 1",
            b"VALUE k 5 3 ",
            b"VALUE k 5 3 x",
            b"VALUE k 5 3x",
            b"VALUE k 5  3",
            b"VALUE  k 5 3",
            b"VALUE k 5",
            b"VALUE k 5 ",
            b"VALUE k",
            b"VALUE k ",
            b"VALUE ",
            b"VALUE",
            b"",
            b"VALUE k +5 3",
            b"VALUE k -5 3",
            b"VALUE k 0x5 3",
            b"VALUE k 5 3\r",
            b"VALUE k\r 5 3",
            b"VALUE k\t5 3",
            b"VALUE \xff\x00 007 0032",
            b"value k 0 1",
            b"VALUEk 0 1",
        ];
        for header in headers {
            assert_eq!(
                parse_value_header(header),
                value_header_by_nom(header),
                "{:?}",
                String::from_utf8_lossy(header)
            );
        }
        // Every byte in every position of a short header.
        let base = b"VALUE ab 1 2 3".to_vec();
        for at in 0..base.len() {
            for byte in 0..=255u8 {
                let mut header = base.clone();
                header[at] = byte;
                assert_eq!(
                    parse_value_header(&header),
                    value_header_by_nom(&header),
                    "{:?}",
                    String::from_utf8_lossy(&header)
                );
            }
        }
    }

    #[test]
    fn a_pending_value_says_how_long_it_will_be() {
        let classic = b"VALUE big 0 1048576\r\nabc";
        assert_eq!(pending_value_len(classic), Some(21 + 1_048_576 + 2));
        let with_cas = b"VALUE k 5 3 99\r\n";
        assert_eq!(pending_value_len(with_cas), Some(16 + 3 + 2));
        let meta = b"VA 10 t-1 f5\r\n01234";
        assert_eq!(pending_value_len(meta), Some(14 + 10 + 2));
        // Whole already, not a value, no header yet, or malformed: nothing.
        for buf in [
            &b"VALUE k 0 1\r\nx\r\n"[..],
            b"VA 1\r\nx\r\n",
            b"END\r\n",
            b"HD\r\n",
            b"VALUE big 0 10",
            b"",
            b"VALUE k 0 x\r\n",
            b"VA 99999999999\r\n",
        ] {
            assert_eq!(
                pending_value_len(buf),
                None,
                "{:?}",
                String::from_utf8_lossy(buf)
            );
        }
    }

    fn pieces(reply: &[u8], mut expect: Expect) -> Result<Vec<Piece>, ReplyError> {
        let mut at = 0;
        let mut out = Vec::new();
        loop {
            match next_piece(&reply[at..], &mut expect, 1024)? {
                None => return Ok(out),
                Some(piece) => {
                    let len = match &piece {
                        Piece::Value { len, .. } | Piece::Last { len } | Piece::Error { len } => {
                            *len
                        }
                    };
                    at += len;
                    let last = !matches!(piece, Piece::Value { .. });
                    out.push(piece);
                    if last {
                        return Ok(out);
                    }
                }
            }
        }
    }

    fn get(line: &'static [u8]) -> Expect {
        Expect::values(bytes::Bytes::from_static(line))
    }

    #[test]
    fn storage_accepts_only_storage_lines_and_errors() {
        let storage = Expect::Line(LineKind::Storage);
        for ok in [
            &b"STORED\r\n"[..],
            b"NOT_STORED\r\n",
            b"EXISTS\r\n",
            b"NOT_FOUND\r\n",
        ] {
            assert_eq!(
                pieces(ok, storage.clone()),
                Ok(vec![Piece::Last { len: ok.len() }])
            );
        }
        let error = b"SERVER_ERROR out of memory\r\n";
        assert_eq!(
            pieces(error, storage.clone()),
            Ok(vec![Piece::Error { len: error.len() }])
        );
        for bad in [
            &b"HELLO I AM NOT MEMCACHED\r\n"[..],
            b"END\r\n",
            b"DELETED\r\n",
            b"STORED\n",
        ] {
            assert!(pieces(bad, storage.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn arithmetic_accepts_numbers_up_to_twenty_digits() {
        let arith = Expect::Line(LineKind::Arithmetic);
        assert!(pieces(b"18446744073709551615\r\n", arith.clone()).is_ok());
        assert!(pieces(b"184467440737095516150\r\n", arith.clone()).is_err());
        assert!(pieces(b"12a\r\n", arith).is_err());
    }

    #[test]
    fn values_must_be_for_requested_keys_in_order() {
        let reply = b"VALUE a 0 1\r\nx\r\nVALUE c 0 1\r\ny\r\nEND\r\n";
        assert_eq!(pieces(reply, get(b"get a b c\r\n")).unwrap().len(), 3);
        assert_eq!(
            pieces(
                b"VALUE c 0 1\r\ny\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
                get(b"get a b c\r\n")
            ),
            Err(ReplyError::KeyNotRequested)
        );
        assert_eq!(
            pieces(b"VALUE key56 0 1\r\nx\r\nEND\r\n", get(b"get key114\r\n")),
            Err(ReplyError::KeyNotRequested)
        );
        // Duplicates are answered once per occurrence.
        let twice = b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n";
        assert!(pieces(twice, get(b"get a a\r\n")).is_ok());
        assert_eq!(
            pieces(twice, get(b"get a\r\n")),
            Err(ReplyError::KeyNotRequested)
        );
    }

    /// `find_key` as a plain token walk: its oracle.
    fn find_key_by_tokens(request: &[u8], from: usize, key: &[u8]) -> Option<usize> {
        let from = from.min(request.len());
        let line_end = request[from..]
            .iter()
            .position(|b| matches!(b, b'\r' | b'\n' | 0))
            .map_or(request.len(), |end| from + end);
        let mut at = from;
        while at < line_end {
            let start = at
                + request[at..line_end]
                    .iter()
                    .take_while(|&&b| b == b' ')
                    .count();
            let len = request[start..line_end]
                .iter()
                .take_while(|&&b| b != b' ')
                .count();
            if len == 0 {
                return None;
            }
            if &request[start..start + len] == key {
                return Some(start + len);
            }
            at = start + len;
        }
        None
    }

    #[test]
    fn a_key_is_found_as_a_whole_token_from_the_cursor_on() {
        let lines: [&[u8]; 5] = [
            b"get a ab abc b\r\n",
            b"get  a  a\r\n",
            b"get a\0ab c\r\n",
            b"gat 10 k1 k2",
            b"get ab\rc\r\n",
        ];
        let keys: [&[u8]; 9] = [
            b"a", b"ab", b"abc", b"b", b"c", b"k2", b"a\0ab", b"ab\rc", b"",
        ];
        for line in lines {
            for from in 0..=line.len() {
                for key in keys {
                    assert_eq!(
                        find_key(line, from, key),
                        find_key_by_tokens(line, from, key),
                        "{:?} from {from} for {:?}",
                        String::from_utf8_lossy(line),
                        String::from_utf8_lossy(key)
                    );
                }
            }
        }
    }

    #[test]
    fn a_key_past_the_end_of_the_line_is_never_requested() {
        // memcached reads the line as a C string: it ends at a NUL too.
        let request = get(b"get a\0b c\r\n");
        assert_eq!(
            pieces(
                b"VALUE a 0 1\r\nx\r\nVALUE b 0 1\r\ny\r\nEND\r\n",
                request.clone()
            ),
            Err(ReplyError::KeyNotRequested),
            "looked for from just past `a`"
        );
        assert_eq!(
            pieces(b"VALUE c 0 1\r\ny\r\nEND\r\n", request),
            Err(ReplyError::KeyNotRequested)
        );
        let ten = get(b"get k0 k1 k2 k3 k4 k5 k6 k7 k8 k9\r\n");
        let mut reply = Vec::new();
        for i in [0, 3, 4, 9] {
            reply.extend_from_slice(format!("VALUE k{i} 0 1\r\nx\r\n").as_bytes());
        }
        reply.extend_from_slice(b"END\r\n");
        assert_eq!(pieces(&reply, ten).unwrap().len(), 5);
    }

    #[test]
    fn gat_exptime_is_not_a_key_and_gets_needs_a_cas() {
        assert_eq!(
            pieces(b"VALUE 10 0 1\r\nx\r\nEND\r\n", get(b"gat 10 a\r\n")),
            Err(ReplyError::KeyNotRequested)
        );
        assert!(pieces(b"VALUE a 0 1 5\r\nx\r\nEND\r\n", get(b"gats 10 a\r\n")).is_ok());
        assert_eq!(
            pieces(b"VALUE a 0 1\r\nx\r\nEND\r\n", get(b"gets a\r\n")),
            Err(ReplyError::BadValueLine)
        );
    }

    #[test]
    fn a_stalled_value_is_incomplete_not_a_reply() {
        assert_eq!(pieces(b"VALUE k 0 5\r\nabc", get(b"get k\r\n")), Ok(vec![]));
        assert_eq!(
            pieces(b"VALUE k 0 5\r\n", Expect::Line(LineKind::Storage)),
            Err(ReplyError::UnexpectedLine)
        );
    }

    #[test]
    fn oversized_values_are_refused_from_the_header() {
        assert_eq!(
            pieces(b"VALUE k 0 4294967296\r\n", get(b"get k\r\n")),
            Err(ReplyError::ValueTooLarge)
        );
    }

    #[test]
    fn item_size_max_is_read_from_stats_settings() {
        let reply = b"STAT maxbytes 67108864\r\nSTAT item_size_max 2097152\r\nEND\r\n";
        assert_eq!(item_size_max(reply), Some(2 * 1024 * 1024));
        assert_eq!(pieces(reply, Expect::Stats).unwrap().len(), 3);
    }

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

    fn meta(quiet: bool) -> Expect {
        Expect::meta(super::super::meta::MetaCommand::Get, quiet)
    }

    #[test]
    fn a_meta_reply_is_one_piece_value_included() {
        let mut expect = meta(false);
        let reply = b"VA 2 kfoo\r\nhi\r\nHD\r\n";
        assert_eq!(
            next_piece(reply, &mut expect, 1024),
            Ok(Some(Piece::Last { len: 15 }))
        );
        assert_eq!(next_piece(&reply[..12], &mut expect, 1024), Ok(None));
        assert_eq!(
            next_piece(b"CLIENT_ERROR bad token\r\n", &mut expect, 1024),
            Ok(Some(Piece::Error { len: 24 }))
        );
        assert!(next_piece(b"STORED\r\n", &mut expect, 1024).is_err());
    }

    #[test]
    fn a_quiet_meta_reply_ends_at_the_appended_mn() {
        // Suppressed: only the MN comes.
        let mut expect = meta(true);
        assert_eq!(next_piece(b"M", &mut expect, 1024), Ok(None));
        assert_eq!(
            next_piece(b"MN\r\n", &mut expect, 1024),
            Ok(Some(Piece::Last { len: 4 }))
        );
        // A hit, then MN; a second reply before MN is out of step.
        let mut expect = meta(true);
        let hit = b"VA 1\r\nx\r\nMN\r\n";
        assert_eq!(
            next_piece(hit, &mut expect, 1024),
            Ok(Some(Piece::Value {
                len: 9,
                key: 0..0,
                data: 0
            }))
        );
        assert_eq!(
            next_piece(&hit[9..], &mut expect, 1024),
            Ok(Some(Piece::Last { len: 4 }))
        );
        assert!(next_piece(b"EN\r\n", &mut expect, 1024).is_err());
        // Errors are never suppressed and do not end the reply: MN does.
        let mut expect = meta(true);
        assert_eq!(
            next_piece(b"SERVER_ERROR out of memory\r\nMN\r\n", &mut expect, 1024),
            Ok(Some(Piece::Value {
                len: 28,
                key: 0..0,
                data: 0
            }))
        );
    }
}
