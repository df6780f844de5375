//! Meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`): bytes in, a [`MetaRequest`]
//! (spans into those bytes plus what routing needs) or a [`Rejection`] (one type
//! for both dialects) carrying memcached's own reply out. Replies are framed in [`reply`].
//!
//! Pure and incremental like [`super::request`]: `Ok(None)` means "wait for more
//! bytes", and the line, key and declared data length are checked from the
//! command line alone, before any data block is buffered. No I/O here.
//!
//! # What memring answers itself, and what it leaves to the backend
//! memring must parse far enough to *route* (find the key, decode it when `b`
//! is set) and to *frame* (find where the request ends, `ms` data block
//! included). Whatever stops either is answered here, with the exact bytes
//! memcached 1.6.18 sends and the exact number of bytes it consumes:
//! - an unknown two-letter command, or `mg`/`ms`/`md`/`ma` without a key:
//!   `ERROR`; `me` without a key, a key token over 250 bytes: `CLIENT_ERROR bad
//!   command line format`;
//! - more than 19 tokens on a `mg`/`ms`/`md`/`ma` line: `CLIENT_ERROR options
//!   flags too long` (`... flags are too long` for `mg`). memcached checks this
//!   before reading an `ms` length and swallows no data block, so memring must
//!   answer it for `ms` to stay in step, and answers it for all four alike;
//! - `ms` without a length or with one that is not a number in
//!   0..=2^31-3: `CLIENT_ERROR bad command line format`, and like memcached the
//!   data block is *not* swallowed (its bytes are read as the next command);
//! - a `b` key that is not base64 (see [`decode_key`]): the error memcached's
//!   flag scan ends with (`CLIENT_ERROR error decoding key` for `mg`/`ms` unless a
//!   later flag failed too, `CLIENT_ERROR invalid or duplicate flag` for
//!   `md`/`ma`, `CLIENT_ERROR bad command line format` for `me`); a rejected `ms`
//!   then swallows its data block, as memcached does after every flag error;
//! - an `ms` length above [`Limits::max_value_bytes`]: `SERVER_ERROR object too
//!   large for cache` (or the flag error memcached would report first), and the
//!   data block is swallowed unbuffered;
//! - no newline within [`Limits::max_line_bytes`]: `CLIENT_ERROR line too long`,
//!   then the connection closes (memcached closes it without a word).
//!
//! Every other error is memcached's to give: bad flag tokens (`T`, `N`, `R`, `C`,
//! `F`, `J`, `D`), unknown or duplicate flags, an `M` mode it does not know, an
//! opaque over 32 bytes, an `ms` data block not ending in `\r\n`. Such requests
//! still route and frame, so memring forwards them unchanged and the backend's
//! reply is memcached's reply by construction (for `ms`, memcached swallows the
//! data block memring forwarded with the line). Doing so also keeps flags that
//! newer memcacheds accept (`E`, `x`, `S`) working. [`MetaRequest::backend_error`]
//! still predicts the error 1.6.18 will answer, so that code that would rewrite
//! a request (drop `q`, add a flag) can leave a doomed one untouched.
//!
//! memcached's quirks are kept where they decide framing or routing: an `ms`
//! length is read with `strtol` and cut to 32 bits (`ms k 4294967298` carries 2
//! bytes), a `b` key skips bytes outside the base64 alphabet, and a NUL ends the
//! line for the tokenizer (the bytes after it are forwarded and ignored).
//!
//! # Deliberate differences from memcached
//! - Keys (the token as sent, also with `b`) with control bytes or DEL are
//!   refused with `CLIENT_ERROR bad command line format`, as for the classic
//!   commands, and like a too-long key the `ms` data block is not swallowed.
//! - An endless line gets `CLIENT_ERROR line too long` before the close.

pub mod reply;
pub mod tag;

use memchr::memchr;

pub use super::base64_key::{decode_key, encode_key, DecodedKey};
use super::request::{frame_line, is_valid_key, FramedLine, Rejection, Span, StaleKey};
use super::{Limits, ParseError, MAX_DECLARED_VALUE_BYTES, MAX_KEY_BYTES};

/// The six meta commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaCommand {
    /// `mg`: meta get.
    Get,
    /// `ms`: meta set (with a data block).
    Set,
    /// `md`: meta delete.
    Delete,
    /// `ma`: meta arithmetic.
    Arithmetic,
    /// `mn`: meta no-op, the end-of-batch marker.
    Noop,
    /// `me`: meta debug.
    Debug,
}

impl MetaCommand {
    /// The command's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            MetaCommand::Get => "mg",
            MetaCommand::Set => "ms",
            MetaCommand::Delete => "md",
            MetaCommand::Arithmetic => "ma",
            MetaCommand::Noop => "mn",
            MetaCommand::Debug => "me",
        }
    }

    fn from_token(token: &[u8]) -> Option<MetaCommand> {
        Some(match token {
            b"mg" => MetaCommand::Get,
            b"ms" => MetaCommand::Set,
            b"md" => MetaCommand::Delete,
            b"ma" => MetaCommand::Arithmetic,
            b"mn" => MetaCommand::Noop,
            b"me" => MetaCommand::Debug,
            _ => return None,
        })
    }

    /// Commands whose flags memcached scans (`mn` and `me` take none).
    fn has_flags(self) -> bool {
        !matches!(self, MetaCommand::Noop | MetaCommand::Debug)
    }
}

/// One meta request that memring can route and frame. All spans index the
/// request's own bytes (`total_len` of them, from the start of the buffer given
/// to [`parse_meta`]); forward `bytes[..total_len]` unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub command: MetaCommand,
    /// The key token as sent (base64 text when `base64`); `None` for `mn`.
    pub key: Option<Span>,
    /// `b`: the key token is base64; route by [`MetaRequest::routing_key`].
    pub base64: bool,
    /// `q`: memcached leaves out the nominal reply (see [`reply::suppressed_by_quiet`]).
    pub quiet: bool,
    /// The `O` token as sent, `O` included: memcached echoes exactly these bytes.
    pub opaque: Option<Span>,
    /// `k`: the reply carries the key.
    pub return_key: bool,
    /// `v`: an `mg`/`ma` hit answers `VA <size>` with the value.
    pub value: bool,
    /// `N`: vivify on miss, which hands out a recache lease (owner-only).
    pub vivify: bool,
    /// `R`: win a recache lease when the TTL is below the token (owner-only).
    pub recache: bool,
    /// `C`: compare-and-swap against the given cas.
    pub compare_cas: bool,
    /// The byte after `M` (`ms`: E A P R S, `ma`: I + D -), if given.
    pub mode: Option<u8>,
    /// `ms` only: the declared data length (the block is `data_len + 2` bytes).
    pub data_len: Option<u32>,
    /// The flag tokens: from the first flag to the end of the line's content
    /// (empty when there are none). See [`MetaRequest::flags`].
    pub flags: Span,
    /// The error memcached 1.6.18 will answer instead of executing the request,
    /// when memring forwards it anyway (see the module doc). Such a request
    /// must be forwarded exactly as received.
    pub backend_error: Option<ParseError>,
    /// Length of the command line including its line ending.
    pub line_len: u32,
    /// Length of the whole request: the line plus, for `ms`, the data block and
    /// its `\r\n`.
    pub total_len: u32,
}

impl MetaRequest {
    /// The key token as sent, or an empty slice for `mn`.
    pub fn key_token<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        self.key.map_or(&[][..], |key| key.of(bytes))
    }

    /// The bytes the ring hashes: the key itself, or the decoded bytes when
    /// `b` is set, which is the key memcached stores (so `ms Zm9v 2 b` and
    /// `get foo` land on the same server). Empty for `mn`.
    ///
    /// [`parse_meta`] accepts a `b` key only when it decodes; were `bytes`
    /// another buffer than the one parsed, an undecodable key would read as
    /// empty.
    pub fn routing_key<'a>(&self, bytes: &'a [u8]) -> RoutingKey<'a> {
        let token = self.key_token(bytes);
        if self.base64 {
            RoutingKey::Decoded(decode_key(token).unwrap_or_default())
        } else {
            RoutingKey::Plain(token)
        }
    }

    /// The flag tokens as `(flag byte, whole token)`, in the client's order.
    pub fn flags<'a>(&self, bytes: &'a [u8]) -> impl Iterator<Item = (u8, &'a [u8])> {
        self.flags
            .of(bytes)
            .split(|&b| b == b' ')
            .filter(|token| !token.is_empty())
            .map(|token| (token[0], token))
    }

    /// `N` or `R`: the request may hand out a recache lease, so it must go to
    /// the key's owner only, or two clients could both win.
    pub fn takes_lease(&self) -> bool {
        self.vivify || self.recache
    }

    /// Whether the request may change its item: `ms`, `md`, `ma`, and an
    /// `mg` that touches (`T`) or creates (`N`) it.
    pub fn changes_item(&self, bytes: &[u8]) -> bool {
        match self.command {
            MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arithmetic => true,
            MetaCommand::Get => self.vivify || self.flags(bytes).any(|(flag, _)| flag == b'T'),
            MetaCommand::Noop | MetaCommand::Debug => false,
        }
    }

    /// Whether the backend may send nothing back for this request (`q`).
    /// Errors always come; `mn` and `me` always answer.
    pub fn may_be_silent(&self) -> bool {
        self.quiet && self.command.has_flags()
    }
}

/// The outcome of one parse step.
pub type MetaParseResult = Result<Option<(MetaRequest, usize)>, Rejection>;

/// memcached's tokenizer keeps at most 23 tokens (`MAX_TOKENS` 24 minus the end
/// marker), the rest of the line being one unsplit remainder.
const MAX_LINE_TOKENS: usize = 23;

/// memcached refuses a `mg`/`ms`/`md`/`ma` line whose token count plus its end
/// marker exceeds `MFLAG_MAX_OPT_LENGTH` (20): at most 19 real tokens.
const MAX_META_TOKENS: usize = 19;

/// Longest `O` token memcached echoes, `O` included (`MFLAG_MAX_OPAQUE_LENGTH`).
const MAX_OPAQUE_BYTES: usize = 32;

/// Whether `buf` starts (after leading spaces) with one of the six meta command
/// names followed by a space or a line ending, i.e. whether the session should
/// hand it to [`parse_meta`] rather than to the classic parser. A buffer that
/// holds only part of the name answers `false`; the classic parser then waits
/// for the rest of the line, so the next call decides.
pub fn is_meta_request(buf: &[u8]) -> bool {
    let start = buf.iter().position(|&b| b != b' ').unwrap_or(buf.len());
    let rest = &buf[start..];
    rest.len() >= 3
        && MetaCommand::from_token(&rest[..2]).is_some()
        && matches!(rest[2], b' ' | b'\r' | b'\n')
}

/// Parses the meta request at the start of `buf`.
///
/// Returns `Ok(Some((request, consumed)))` for a request memring can forward
/// (`consumed == request.total_len`), `Ok(None)` when more bytes are needed,
/// and `Err(rejection)` for a request memring answers itself (see the module
/// doc); the rejection says how many bytes to drop. A line that is not a meta
/// command is rejected with `ERROR`, as memcached answers an unknown command.
///
/// # Errors
/// See [`Rejection`] and the module doc.
pub fn parse_meta(buf: &[u8], limits: &Limits) -> MetaParseResult {
    let Some(FramedLine {
        content_end,
        line_len,
    }) = frame_line(buf, limits)?
    else {
        return Ok(None);
    };
    let line = &buf[..content_end];
    let reject = |error| Err(Rejection::line(error, line_len, false));

    let tokens = Tokenized::new(line);
    let Some(command) = tokens
        .get(0)
        .and_then(|t| MetaCommand::from_token(t.of(line)))
    else {
        return reject(ParseError::UnknownCommand);
    };
    let mut request = MetaRequest {
        command,
        key: None,
        base64: false,
        quiet: false,
        opaque: None,
        return_key: false,
        value: false,
        vivify: false,
        recache: false,
        compare_cas: false,
        mode: None,
        data_len: None,
        flags: Span { start: 0, end: 0 },
        backend_error: None,
        line_len: line_len as u32,
        total_len: line_len as u32,
    };
    if command == MetaCommand::Noop {
        // `mn` ignores anything after its name.
        return Ok(Some((request, line_len)));
    }

    let Some(key) = tokens.get(1) else {
        return reject(if command == MetaCommand::Debug {
            ParseError::BadCommandLine
        } else {
            ParseError::UnknownCommand
        });
    };
    let key_token = key.of(line);
    if key_token.len() > MAX_KEY_BYTES || !is_valid_key(key_token) {
        return reject(ParseError::BadCommandLine);
    }
    request.key = Some(key);

    if command == MetaCommand::Debug {
        // `me <key> [b]`: only a `b` right after the key counts, nothing else
        // is looked at.
        if tokens.get(2).is_some_and(|t| t.of(line) == b"b") {
            if decode_key(key_token).is_none() {
                return reject(ParseError::BadCommandLine);
            }
            request.base64 = true;
        }
        return Ok(Some((request, line_len)));
    }

    if tokens.count > MAX_META_TOKENS {
        return reject(if command == MetaCommand::Get {
            ParseError::GetFlagsTooLong
        } else {
            ParseError::FlagsTooLong
        });
    }

    let first_flag = if command == MetaCommand::Set {
        let Some(length) = tokens.get(2) else {
            return reject(ParseError::BadCommandLine);
        };
        // memcached reads the length with `strtol` into an int32 (so it
        // truncates) and then wants 0..=INT_MAX-2.
        let declared = c_strtol(length.of(line)).map(|value| value as i32);
        match declared {
            Some(len) if (0..=MAX_DECLARED_VALUE_BYTES).contains(&i64::from(len)) => {
                request.data_len = Some(len as u32);
            }
            _ => return reject(ParseError::BadCommandLine),
        }
        3
    } else {
        2
    };
    let flag_tokens = &tokens.spans[first_flag.min(tokens.spans.len())..];
    request.flags = Span {
        start: flag_tokens
            .first()
            .map_or(content_end as u32, |first| first.start),
        end: content_end as u32,
    };

    let scan = scan_flags(command, line, flag_tokens, key_token);
    request.base64 = scan.base64;
    request.quiet = scan.seen(b'q');
    request.return_key = scan.seen(b'k');
    request.value = scan.seen(b'v');
    request.vivify = scan.seen(b'N');
    request.recache = scan.seen(b'R');
    request.compare_cas = scan.seen(b'C');
    request.opaque = scan.opaque;
    request.mode = scan.mode;
    request.backend_error = scan.error;

    if request.data_len.is_none() {
        if scan.undecodable {
            return reject(scan.error.unwrap_or(ParseError::KeyDecode));
        }
        return Ok(Some((request, line_len)));
    }
    with_value(request, key, &scan, buf, limits)
}

/// An `ms` line parsed: its value is taken (or refused and swallowed) here.
fn with_value(
    mut request: MetaRequest,
    key: Span,
    scan: &FlagScan,
    buf: &[u8],
    limits: &Limits,
) -> MetaParseResult {
    let line_len = request.line_len as usize;
    let data_len = request.data_len.unwrap_or(0) as usize;
    let swallow = |error| {
        // memcached 1.6.18 removes the key of an `ms` too large for the
        // cache, whatever its mode (probed), unless a flag error came first.
        let stale_key = (error == ParseError::ValueTooLarge).then_some(StaleKey {
            token: key,
            base64: request.base64,
        });
        Err(Rejection {
            error,
            consumed: line_len,
            discard: data_len + 2,
            silent: false,
            stale_key,
        })
    };
    if scan.undecodable {
        return swallow(scan.error.unwrap_or(ParseError::KeyDecode));
    }
    if data_len > limits.max_value_bytes {
        // memcached would report a flag error before finding the item too large.
        return swallow(scan.error.unwrap_or(ParseError::ValueTooLarge));
    }
    let total = line_len + data_len + 2;
    if buf.len() < total {
        return Ok(None);
    }
    if request.backend_error.is_none() && &buf[total - 2..total] != b"\r\n" {
        request.backend_error = Some(ParseError::BadDataChunk);
    }
    request.total_len = total as u32;
    Ok(Some((request, total)))
}

/// The line's tokens as memcached's tokenizer sees them: split on single
/// spaces (runs count as one), at most [`MAX_LINE_TOKENS`] kept.
struct Tokenized {
    spans: smallvec::SmallVec<[Span; MAX_LINE_TOKENS]>,
    /// Tokens memcached counts: the kept ones, plus one if a remainder was left.
    count: usize,
}

impl Tokenized {
    fn new(line: &[u8]) -> Tokenized {
        let mut spans = smallvec::SmallVec::new();
        let mut at = 0;
        let mut count = 0;
        loop {
            while at < line.len() && line[at] == b' ' {
                at += 1;
            }
            if at == line.len() {
                break;
            }
            if spans.len() == MAX_LINE_TOKENS {
                count += 1;
                break;
            }
            let end = memchr(b' ', &line[at..]).map_or(line.len(), |i| at + i);
            spans.push(Span {
                start: at as u32,
                end: end as u32,
            });
            count += 1;
            at = end;
        }
        Tokenized { spans, count }
    }

    fn get(&self, i: usize) -> Option<Span> {
        self.spans.get(i).copied()
    }
}

/// What memcached's flag scan (`_meta_flag_preparse` plus each command's own
/// checks) makes of the flag tokens.
struct FlagScan {
    seen: [bool; 128],
    base64: bool,
    /// `b` was given and the key token does not decode.
    undecodable: bool,
    opaque: Option<Span>,
    mode: Option<u8>,
    error: Option<ParseError>,
}

impl FlagScan {
    fn seen(&self, flag: u8) -> bool {
        self.seen[usize::from(flag & 0x7f)]
    }
}

fn scan_flags(command: MetaCommand, line: &[u8], flags: &[Span], key: &[u8]) -> FlagScan {
    let mut scan = FlagScan {
        seen: [false; 128],
        base64: false,
        undecodable: false,
        opaque: None,
        mode: None,
        error: None,
    };
    // The flags memring reads for routing are noted even when memcached would
    // stop early; routing must not depend on memcached's error order.
    for token in flags {
        let bytes = token.of(line);
        let flag = bytes[0];
        if flag < 127 {
            scan.seen[usize::from(flag)] = true;
        }
        match flag {
            b'b' => {
                scan.base64 = true;
                scan.undecodable |= decode_key(key).is_none();
            }
            b'O' if scan.opaque.is_none() => scan.opaque = Some(*token),
            b'M' if scan.mode.is_none() && bytes.len() == 2 => scan.mode = Some(bytes[1]),
            _ => {}
        }
    }
    scan.error = preparse_error(line, flags, key)
        .or_else(|| command_error(command, line, flags, &scan))
        .map(|error| match (command, error) {
            // `md` and `ma` replace every flag-scan error with one message.
            (MetaCommand::Delete | MetaCommand::Arithmetic, e) if is_preparse_error(e) => {
                ParseError::InvalidOrDuplicateFlag
            }
            (_, e) => e,
        });
    scan
}

fn is_preparse_error(error: ParseError) -> bool {
    matches!(
        error,
        ParseError::DuplicateFlag
            | ParseError::InvalidFlag
            | ParseError::KeyDecode
            | ParseError::BadToken
            | ParseError::ModeLength
            | ParseError::InitialValue
            | ParseError::DeltaValue
            | ParseError::BadCommandLine
    )
}

/// memcached 1.6.18's `_meta_flag_preparse`: every token's first byte is a
/// flag, checked in order. A duplicate or unknown flag stops the scan at once;
/// a bad number is remembered and the scan goes on, so the last such error is
/// the one reported (a bad `F` keeps the previous message, by default `bad
/// command line format`). Every command accepts every flag here.
fn preparse_error(line: &[u8], flags: &[Span], key: &[u8]) -> Option<ParseError> {
    let mut seen = [false; 127];
    let mut failed = false;
    let mut message = ParseError::BadCommandLine;
    let mut fail = |error: Option<ParseError>| {
        failed = true;
        if let Some(error) = error {
            message = error;
        }
    };
    for token in flags {
        let bytes = token.of(line);
        let flag = bytes[0];
        if flag >= 127 || seen[usize::from(flag)] {
            return Some(ParseError::DuplicateFlag);
        }
        seen[usize::from(flag)] = true;
        let rest = &bytes[1..];
        match flag {
            b'b' if decode_key(key).is_none() => fail(Some(ParseError::KeyDecode)),
            b'N' | b'T' | b'R' if c_strtol(rest).is_none() => fail(Some(ParseError::BadToken)),
            // `safe_strtoul` (64-bit `unsigned long`, stored into 32 bits)
            // fails like `safe_strtoull`, but sets no message.
            b'F' if c_strtoull(rest).is_none() => fail(None),
            b'C' if c_strtoull(rest).is_none() => fail(Some(ParseError::BadToken)),
            b'M' if bytes.len() != 2 => fail(Some(ParseError::ModeLength)),
            b'J' if c_strtoull(rest).is_none() => fail(Some(ParseError::InitialValue)),
            b'D' if c_strtoull(rest).is_none() => fail(Some(ParseError::DeltaValue)),
            b'b' | b'N' | b'T' | b'R' | b'F' | b'C' | b'M' | b'J' | b'D' => {}
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'v' | b'h' | b'u'
            | b'q' | b'I' => {}
            _ => return Some(ParseError::InvalidFlag),
        }
    }
    failed.then_some(message)
}

/// The checks each command makes after the flag scan: the `M` mode (checked
/// first) and the opaque length.
fn command_error(
    command: MetaCommand,
    line: &[u8],
    flags: &[Span],
    scan: &FlagScan,
) -> Option<ParseError> {
    let mode_error = match (command, scan.mode) {
        (MetaCommand::Set, Some(mode)) if !b"EAPRS".contains(&mode) => Some(ParseError::SetMode),
        (MetaCommand::Arithmetic, Some(mode)) if !b"I+D-".contains(&mode) => {
            Some(ParseError::ArithmeticMode)
        }
        _ => None,
    };
    let opaque_too_long = flags
        .iter()
        .any(|t| t.of(line)[0] == b'O' && t.of(line).len() > MAX_OPAQUE_BYTES);
    mode_error.or(opaque_too_long.then_some(ParseError::OpaqueTooLong))
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Splits what `strtol`/`strtoull` read from `token`: leading white space, an
/// optional sign, then at least one digit. Returns (negative, digits) when the
/// rest of the token is empty or starts with white space, as memcached's
/// `safe_strto*` helpers require.
fn c_number(token: &[u8]) -> Option<(bool, &[u8])> {
    let start = token.iter().position(|&b| !is_c_space(b))?;
    let mut rest = &token[start..];
    let mut negative = false;
    if let Some((&sign, after)) = rest.split_first() {
        if sign == b'+' || sign == b'-' {
            negative = sign == b'-';
            rest = after;
        }
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    match rest.get(digits) {
        None => Some((negative, &rest[..digits])),
        Some(&b) if is_c_space(b) => Some((negative, &rest[..digits])),
        Some(_) => None,
    }
}

/// `safe_strtol`: a 64-bit `strtol` (out of range fails), truncated by the
/// caller where memcached stores into an int32.
fn c_strtol(token: &[u8]) -> Option<i64> {
    let (negative, digits) = c_number(token)?;
    let mut value: i64 = 0;
    for &d in digits {
        let digit = i64::from(d - b'0');
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// `safe_strtoull`: `strtoull` (out of range fails; a negative number wraps),
/// and a result with the top bit set fails if the token has a `-`.
fn c_strtoull(token: &[u8]) -> Option<u64> {
    let (negative, digits) = c_number(token)?;
    let mut value: u64 = 0;
    for &d in digits {
        value = value.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    let value = if negative {
        value.wrapping_neg()
    } else {
        value
    };
    if (value as i64) < 0 && token.contains(&b'-') {
        return None;
    }
    Some(value)
}

/// The bytes the ring hashes for a meta request (see
/// [`MetaRequest::routing_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingKey<'a> {
    /// The key as sent.
    Plain(&'a [u8]),
    /// A `b` key, decoded.
    Decoded(DecodedKey),
}

impl std::ops::Deref for RoutingKey<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            RoutingKey::Plain(key) => key,
            RoutingKey::Decoded(key) => key,
        }
    }
}

impl AsRef<[u8]> for RoutingKey<'_> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(input: &[u8]) -> MetaParseResult {
        parse_meta(input, &Limits::default())
    }

    fn accepted(input: &[u8]) -> MetaRequest {
        let (request, consumed) = parse(input)
            .unwrap_or_else(|e| panic!("{input:?} rejected: {e:?}"))
            .unwrap_or_else(|| panic!("{input:?} incomplete"));
        assert_eq!(consumed, request.total_len as usize);
        request
    }

    fn rejected(input: &[u8]) -> Rejection {
        match parse(input) {
            Err(rejection) => rejection,
            other => panic!("{input:?} not rejected: {other:?}"),
        }
    }

    /// Requests memring answers itself, each with what memcached 1.6.18
    /// answered to the same line and how many bytes it consumed.
    #[test]
    fn requests_memring_must_answer_get_memcacheds_reply() {
        let long_key = format!("mg {} v\r\n", "k".repeat(251));
        let long_set = format!("ms {} 2\r\nab\r\n", "k".repeat(251));
        for (input, error, consumed, discard) in [
            // `mg\r\n` -> `ERROR` (no key: too few tokens).
            (&b"mg\r\n"[..], ParseError::UnknownCommand, 4, 0),
            // `mg \r\n` -> `ERROR`.
            (b"mg \r\n", ParseError::UnknownCommand, 5, 0),
            // `ms\r\n`, `md\r\n`, `ma \r\n` -> `ERROR`.
            (b"ms\r\n", ParseError::UnknownCommand, 4, 0),
            (b"md\r\n", ParseError::UnknownCommand, 4, 0),
            (b"ma \r\n", ParseError::UnknownCommand, 5, 0),
            // `mx foo\r\n` -> `ERROR`.
            (b"mx foo\r\n", ParseError::UnknownCommand, 8, 0),
            // `me\r\n`, `me \r\n` -> `CLIENT_ERROR bad command line format`.
            (b"me\r\n", ParseError::BadCommandLine, 4, 0),
            (b"me \r\n", ParseError::BadCommandLine, 5, 0),
            // `me Zm9 b` -> `CLIENT_ERROR bad command line format`.
            (b"me Zm9 b\r\n", ParseError::BadCommandLine, 10, 0),
            // `ms foo\r\n` -> `CLIENT_ERROR bad command line format`.
            (b"ms foo\r\n", ParseError::BadCommandLine, 8, 0),
            // `ms foo abc\r\nab\r\n` -> `CLIENT_ERROR bad command line format`,
            // then `ERROR` for `ab`: the data block is not swallowed.
            (b"ms foo abc\r\nab\r\n", ParseError::BadCommandLine, 12, 0),
            // `ms foo -1\r\nab\r\n` -> the same.
            (b"ms foo -1\r\nab\r\n", ParseError::BadCommandLine, 11, 0),
            // 19 flags on `mg` -> `CLIENT_ERROR options flags are too long`.
            (
                b"mg foo a b c d e f g h i j k l m n o p q r\r\n",
                ParseError::GetFlagsTooLong,
                44,
                0,
            ),
            // 17 flags on `ms` -> `CLIENT_ERROR options flags too long`, then
            // `ERROR`: checked before the length, so nothing is swallowed.
            (
                b"ms foo 2 a b c d e f g h i j k l m n o p q\r\nab\r\n",
                ParseError::FlagsTooLong,
                44,
                0,
            ),
            (
                b"md foo a b c d e f g h i j k l m n o p q r\r\n",
                ParseError::FlagsTooLong,
                44,
                0,
            ),
            // `mg Zm9 b v` -> `CLIENT_ERROR error decoding key`.
            (b"mg Zm9 b v\r\n", ParseError::KeyDecode, 12, 0),
            // `mg Zm9 b v Tx` -> `CLIENT_ERROR bad token in command line format`:
            // the last failing flag names the error.
            (b"mg Zm9 b v Tx\r\n", ParseError::BadToken, 15, 0),
            // `md Zm9 b`, `ma Zm9 b` -> `CLIENT_ERROR invalid or duplicate flag`.
            (b"md Zm9 b\r\n", ParseError::InvalidOrDuplicateFlag, 10, 0),
            (b"ma Zm9 b\r\n", ParseError::InvalidOrDuplicateFlag, 10, 0),
            // `ms Zm9 2 b` + data -> `CLIENT_ERROR error decoding key`, block swallowed.
            (b"ms Zm9 2 b\r\nab\r\n", ParseError::KeyDecode, 12, 4),
            // `ms Zm9 2 b Tx` -> `CLIENT_ERROR bad token in command line format`.
            (b"ms Zm9 2 b Tx\r\nab\r\n", ParseError::BadToken, 15, 4),
            // `ms Zm9 2 Tx b` -> `CLIENT_ERROR error decoding key` (last wins).
            (b"ms Zm9 2 Tx b\r\nab\r\n", ParseError::KeyDecode, 15, 4),
            // `ms Zm9 2 b Fx` -> `CLIENT_ERROR error decoding key` (`F` sets no text).
            (b"ms Zm9 2 b Fx\r\nab\r\n", ParseError::KeyDecode, 15, 4),
            // `ms Zm9 2 b Z` -> `CLIENT_ERROR invalid flag` (stops the scan).
            (b"ms Zm9 2 b Z\r\nab\r\n", ParseError::InvalidFlag, 14, 4),
            // `mg foo a b ... q` (17 flags) -> `CLIENT_ERROR invalid flag`: its
            // `b` makes `foo` a base64 key, which does not decode, so memring
            // answers; the scan stopped at `a` first.
            (
                b"mg foo a b c d e f g h i j k l m n o p q\r\n",
                ParseError::InvalidFlag,
                42,
                0,
            ),
            // `mg <251 k> v`, `ms <251 k> 2` -> `CLIENT_ERROR bad command line
            // format`; the `ms` block is then read as a command (`ERROR`).
            (long_key.as_bytes(), ParseError::BadCommandLine, 258, 0),
            (long_set.as_bytes(), ParseError::BadCommandLine, 258, 0),
        ] {
            let rejection = rejected(input);
            assert_eq!(
                (rejection.error, rejection.consumed, rejection.discard),
                (error, consumed, discard),
                "{:?}",
                String::from_utf8_lossy(input)
            );
            assert!(rejection.keeps_connection());
        }
    }

    #[test]
    fn oversized_set_is_refused_from_the_header_and_its_block_swallowed() {
        // `ms big 2000000 T0` + 2000000 bytes -> `SERVER_ERROR object too large
        // for cache`, the block swallowed (memcached 1.6.18, 1 MiB items).
        let rejection = rejected(b"ms big 2000000 T0\r\n");
        assert_eq!(rejection.error, ParseError::ValueTooLarge);
        assert_eq!((rejection.consumed, rejection.discard), (19, 2_000_002));
        assert_eq!(
            rejection.reply(),
            Some(&b"SERVER_ERROR object too large for cache\r\n"[..])
        );
        // `ms big 2000000 Z` + block -> `CLIENT_ERROR invalid flag`, swallowed.
        let rejection = rejected(b"ms big 2000000 Z\r\n");
        assert_eq!(rejection.error, ParseError::InvalidFlag);
        assert_eq!(rejection.discard, 2_000_002);
    }

    #[test]
    fn largest_declared_length_waits_without_allocating() {
        let limits = Limits {
            max_value_bytes: usize::MAX,
            ..Limits::default()
        };
        assert_eq!(parse_meta(b"ms a 2147483645\r\nxx", &limits), Ok(None));
        assert_eq!(
            parse_meta(b"ms a 2147483646\r\nxx", &limits)
                .unwrap_err()
                .error,
            ParseError::BadCommandLine
        );
    }

    #[test]
    fn set_length_is_read_as_memcached_reads_it_into_an_int32() {
        // `ms foo 4294967298\r\nab\r\n` -> `HD`: strtol's 64-bit value is cut
        // to 32 bits, so the block is 2 bytes.
        let request = accepted(b"ms foo 4294967298\r\nab\r\n");
        assert_eq!(request.data_len, Some(2));
        assert_eq!(request.total_len, 23);
        // `+2` and a 4294967295 that wraps to -1.
        assert_eq!(accepted(b"ms foo +2\r\nab\r\n").data_len, Some(2));
        assert_eq!(
            rejected(b"ms foo 4294967295\r\nab\r\n").error,
            ParseError::BadCommandLine
        );
    }

    /// Requests memring forwards although memcached refuses them: they still
    /// route and frame, and `backend_error` predicts memcached's answer.
    #[test]
    fn flag_errors_are_forwarded_with_the_predicted_reply() {
        for (input, error) in [
            // `ms foo 2 T` -> `CLIENT_ERROR bad token in command line format`.
            (&b"ms foo 2 T\r\nab\r\n"[..], ParseError::BadToken),
            // `ms foo 2 Z` -> `CLIENT_ERROR invalid flag`.
            (b"ms foo 2 Z\r\nab\r\n", ParseError::InvalidFlag),
            // `ms foo 2 MX` -> `CLIENT_ERROR invalid mode for ms M token`.
            (b"ms foo 2 MX\r\nab\r\n", ParseError::SetMode),
            // `ms foo 2 Ms` -> the same (1.6.18 knows upper case only).
            (b"ms foo 2 Ms\r\nab\r\n", ParseError::SetMode),
            // `ms foo 2 Mxy` -> `CLIENT_ERROR incorrect length for M token`.
            (b"ms foo 2 Mxy\r\nab\r\n", ParseError::ModeLength),
            // `ms foo 2 q q` -> `CLIENT_ERROR duplicate flag`.
            (b"ms foo 2 q q\r\nab\r\n", ParseError::DuplicateFlag),
            // `ms foo 2 E5`, `ms foo 2 S2` -> `CLIENT_ERROR invalid flag` on
            // 1.6.18; newer memcacheds accept them, so memring forwards.
            (b"ms foo 2 E5\r\nab\r\n", ParseError::InvalidFlag),
            (b"ms foo 2 S2\r\nab\r\n", ParseError::InvalidFlag),
            // 37-byte opaque -> `CLIENT_ERROR opaque token too long`.
            (
                b"ms foo 2 Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nab\r\n",
                ParseError::OpaqueTooLong,
            ),
            // `ms foo 2 F-1` -> `CLIENT_ERROR bad command line format`.
            (b"ms foo 2 F-1\r\nab\r\n", ParseError::BadCommandLine),
            // `ms foo 2\r\nabc\r\n` -> `CLIENT_ERROR bad data chunk` (then
            // `ERROR` for the leftover `\n`).
            (b"ms foo 2\r\nabc\r\n", ParseError::BadDataChunk),
            // `mg foo E5` -> `CLIENT_ERROR invalid flag`.
            (b"mg foo E5\r\n", ParseError::InvalidFlag),
            // `mg foo b c f h k l O q s t u v` -> `CLIENT_ERROR error decoding
            // key`... but that one is memring's to answer (see below).
            // `mg foo Oaaaa...` -> `CLIENT_ERROR opaque token too long`.
            (
                b"mg foo Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
                ParseError::OpaqueTooLong,
            ),
            // `md foo x`, `md foo Z`, `ma foo Z` -> `CLIENT_ERROR invalid or
            // duplicate flag`.
            (b"md foo x\r\n", ParseError::InvalidOrDuplicateFlag),
            (b"md foo Z\r\n", ParseError::InvalidOrDuplicateFlag),
            (b"ma foo Z\r\n", ParseError::InvalidOrDuplicateFlag),
            // `ma num D18446744073709551616`, `ma num J-1` -> `CLIENT_ERROR
            // invalid or duplicate flag`.
            (
                b"ma num D18446744073709551616\r\n",
                ParseError::InvalidOrDuplicateFlag,
            ),
            (b"ma num J-1\r\n", ParseError::InvalidOrDuplicateFlag),
            // `ma foo MX`, `ma foo Mi` -> `CLIENT_ERROR invalid mode for ma M token`.
            (b"ma foo MX\r\n", ParseError::ArithmeticMode),
            (b"ma foo Mi\r\n", ParseError::ArithmeticMode),
        ] {
            let request = accepted(input);
            assert_eq!(
                request.backend_error,
                Some(error),
                "{:?}",
                String::from_utf8_lossy(input)
            );
            // The bad chunk case leaves its last `\n` for the next command.
            assert!(input.len() - request.total_len as usize <= 1);
        }
        // `mg foo b ...` with a key that is not base64: memring needs the
        // decoded key to route, so it answers `CLIENT_ERROR error decoding key`.
        assert_eq!(
            rejected(b"mg foo b c f h k l O q s t u v\r\n").error,
            ParseError::KeyDecode
        );
    }

    #[test]
    fn accepted_numbers_follow_memcacheds_strtol_rules() {
        for input in [
            // `ms foo 2 F4294967296` -> `HD` (flags cut to 32 bits).
            &b"ms foo 2 F4294967296\r\nab\r\n"[..],
            // `ms foo 2 T99999999999 F+5` -> `HD`.
            b"ms foo 2 T99999999999 F+5\r\nab\r\n",
            // `ms foo 2 T-1` -> `HD`.
            b"ms foo 2 T-1\r\nab\r\n",
            // `ma num D-0` -> `HD`.
            b"ma num D-0\r\n",
            // `ma num N0 J18446744073709551615 v` -> `VA 20`.
            b"ma num N0 J18446744073709551615 v\r\n",
            b"mg foo T30 N30 R30 v c t\r\n",
            b"md foo I T30 C99 q\r\n",
            b"ma foo MD D5 C7 O1 k t c v q\r\n",
            b"ms Zm9v 2 MA I C5 c k O9 T0 F3 b\r\nab\r\n",
        ] {
            let request = accepted(input);
            assert_eq!(
                request.backend_error,
                None,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn routing_fields_are_read_from_the_flags() {
        let input = b"mg Zm9v b v k q N30 Oab12 C5 MS\r\n";
        let request = accepted(input);
        assert_eq!(request.command, MetaCommand::Get);
        assert_eq!(request.key_token(input), b"Zm9v");
        assert!(request.base64 && request.value && request.return_key && request.quiet);
        assert!(request.vivify && !request.recache && request.takes_lease());
        assert!(request.compare_cas);
        assert_eq!(request.mode, Some(b'S'));
        assert_eq!(request.opaque.unwrap().of(input), b"Oab12");
        assert_eq!(&*request.routing_key(input), b"foo");
        assert_eq!(request.flags.of(input), b"b v k q N30 Oab12 C5 MS");
        let flags: Vec<u8> = request.flags(input).map(|(flag, _)| flag).collect();
        assert_eq!(flags, b"bvkqNOCM");
        assert!(request.may_be_silent());

        let input = b"ms plain 3 R10 T5\r\nabc\r\n";
        let request = accepted(input);
        assert_eq!(request.command, MetaCommand::Set);
        assert_eq!(&*request.routing_key(input), b"plain");
        assert_eq!(request.data_len, Some(3));
        assert_eq!((request.line_len, request.total_len), (19, 24));
        assert!(request.recache && request.takes_lease() && !request.quiet);
        assert_eq!(request.flags.of(input), b"R10 T5");

        let input = b"md k\r\n";
        let request = accepted(input);
        assert_eq!(request.flags.of(input), b"");
        assert_eq!(request.flags(input).count(), 0);
    }

    #[test]
    fn mn_and_me_take_no_flags() {
        // `mn foo bar` -> `MN`; `mn\n` -> `MN`.
        let request = accepted(b"mn foo bar\r\n");
        assert_eq!(request.command, MetaCommand::Noop);
        assert_eq!(request.key, None);
        assert!(!request.may_be_silent());
        assert_eq!(accepted(b"mn\n").line_len, 3);
        // `me foo x y z` -> `EN` (extra tokens ignored); `me Zm9v b junk` -> `EN`.
        let input = b"me Zm9v b junk\r\n";
        let request = accepted(input);
        assert_eq!(request.command, MetaCommand::Debug);
        assert_eq!(&*request.routing_key(input), b"foo");
        let input = b"me foo q\r\n";
        let request = accepted(input);
        assert!(!request.base64 && !request.may_be_silent());
        assert_eq!(&*request.routing_key(input), b"foo");
    }

    #[test]
    fn spacing_and_line_endings_are_tokenized_like_memcached() {
        // `  mg   foo   v  \r\n` -> `EN`; `mg foo v\n` -> `EN`.
        let input = b"  mg   foo   v  \r\n";
        let request = accepted(input);
        assert_eq!(request.key_token(input), b"foo");
        assert!(request.value);
        assert_eq!(accepted(b"mg foo v\n").line_len, 9);
        // memcached stops the line at a NUL, and so does the flag scan.
        let input = b"mg foo v\0 Zjunk\r\n";
        let request = accepted(input);
        assert_eq!(request.backend_error, None);
        assert_eq!(request.total_len as usize, input.len());
    }

    #[test]
    fn keys_with_control_bytes_are_refused_like_classic_keys() {
        // memcached 1.6.18 takes `mg foo\tx v` as key `foo\tx` (`EN`); memring
        // refuses control bytes in every key.
        assert_eq!(
            rejected(b"mg foo\tx v\r\n").error,
            ParseError::BadCommandLine
        );
        assert_eq!(
            rejected(b"ms a\x7fb 1\r\nx\r\n"),
            Rejection {
                error: ParseError::BadCommandLine,
                consumed: 10,
                discard: 0,
                silent: false,
                stale_key: None,
            }
        );
    }

    #[test]
    fn base64_keys_decode_as_memcached_decodes_them() {
        // `ms Zm9v! 2 b` -> `HD`, and `me foo` then shows the item: bytes
        // outside the alphabet are skipped.
        assert_eq!(decode_key(b"Zm9v!").as_deref(), Some(&b"foo"[..]));
        assert_eq!(decode_key(b"Zm9v").as_deref(), Some(&b"foo"[..]));
        assert_eq!(decode_key(b"Zg==").as_deref(), Some(&b"f"[..]));
        assert_eq!(decode_key(b"Zm8=").as_deref(), Some(&b"fo"[..]));
        // Decoding stops after the first padded group.
        assert_eq!(decode_key(b"Zg==Zm9v").as_deref(), Some(&b"f"[..]));
        // Non-canonical trailing bits are kept as memcached keeps them.
        assert_eq!(decode_key(b"Zh==").as_deref(), Some(&b"f"[..]));
        assert_eq!(decode_key(b"AP8A").as_deref(), Some(&[0u8, 0xff, 0][..]));
        for (key, token) in [(&b"f"[..], "Zg=="), (b"fo", "Zm8="), (b"foo", "Zm9v")] {
            assert_eq!(encode_key(key), token);
        }
        for bad in [&b"Zm9"[..], b"!!!!", b"A===", b"====", b"Zm9vZ"] {
            assert_eq!(decode_key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn base64_keys_follow_memcached_where_it_differs_from_rfc_4648() {
        use base64::Engine as _;
        let standard = base64::engine::general_purpose::STANDARD;
        // Each line: the token, what memcached 1.6.18 stored for it (`ms`
        // with `b`, then `me`/`mg` of the key), and that the crate's standard
        // engine alone would not decode it so.
        for (token, key) in [
            // Bytes outside the alphabet are skipped.
            (&b"Zm9v!!"[..], &b"foo"[..]),
            // `=` anywhere in a group counts as padding, and reads as 0.
            (b"Z=g=", b"d"),
            (b"=Zg=", b"\x01"),
            (b"A=A=", b"\0"),
            // Decoding stops after the first padded group...
            (b"Zg==Zm9v", b"f"),
            // ...and keeps bits RFC 4648 wants zero.
            (b"Zh==", b"f"),
        ] {
            assert_eq!(decode_key(token).as_deref(), Some(key), "{token:?}");
            assert_ne!(
                standard.decode(token).ok().as_deref(),
                Some(key),
                "{token:?}"
            );
        }
        // ...but every alphabet byte of the token counts for the groups of four.
        for bad in [&b"Zg==Zm9vZ"[..], b"A="] {
            assert_eq!(decode_key(bad), None, "{bad:?}");
        }
        // Where both decode, they agree.
        for key in [&b""[..], b"f", b"fo", b"foo", &[0xff, 0, 0x80, 7]] {
            let token = encode_key(key);
            assert_eq!(standard.decode(&token).ok().as_deref(), Some(key));
            if !key.is_empty() {
                assert_eq!(decode_key(token.as_bytes()).as_deref(), Some(key));
            }
        }
    }

    #[test]
    fn partial_requests_wait_for_more_bytes() {
        for input in [
            &b"mg fo"[..],
            b"mg foo v\r",
            b"ms foo 5\r\nhel",
            b"ms foo 5\r\nhello\r",
            b"mn",
            b"",
        ] {
            assert_eq!(parse(input), Ok(None), "{input:?}");
        }
    }

    #[test]
    fn line_without_newline_past_the_bound_is_too_long() {
        // memcached closes such a connection without a reply; memring says why.
        let mut input = b"mg ".to_vec();
        input.extend(vec![b'k'; 3000]);
        let rejection = rejected(&input);
        assert_eq!(rejection.error, ParseError::LineTooLong);
        assert!(!rejection.keeps_connection());
    }

    #[test]
    fn only_the_six_meta_commands_go_to_the_meta_parser() {
        for (input, meta) in [
            (&b"mg foo\r\n"[..], true),
            (b"  ms foo 1\r\n", true),
            (b"mn\r\n", true),
            (b"mn\n", true),
            (b"me foo\r\n", true),
            (b"mgx foo\r\n", false),
            (b"mx foo\r\n", false),
            (b"MG foo\r\n", false),
            (b"get foo\r\n", false),
            (b"mn", false),
            (b"m", false),
            (b"mn\tx\r\n", false),
        ] {
            assert_eq!(is_meta_request(input), meta, "{input:?}");
        }
        // Anything else handed to `parse_meta` is an unknown command.
        assert_eq!(rejected(b"get foo\r\n").error, ParseError::UnknownCommand);
        assert_eq!(rejected(b"\r\n").error, ParseError::UnknownCommand);
    }

    #[test]
    fn every_error_reply_is_one_crlf_terminated_line() {
        for error in [
            ParseError::UnknownCommand,
            ParseError::BadCommandLine,
            ParseError::FlagsTooLong,
            ParseError::GetFlagsTooLong,
            ParseError::DuplicateFlag,
            ParseError::InvalidFlag,
            ParseError::InvalidOrDuplicateFlag,
            ParseError::KeyDecode,
            ParseError::BadToken,
            ParseError::ModeLength,
            ParseError::InitialValue,
            ParseError::DeltaValue,
            ParseError::SetMode,
            ParseError::ArithmeticMode,
            ParseError::OpaqueTooLong,
            ParseError::BadDataChunk,
            ParseError::ValueTooLarge,
            ParseError::LineTooLong,
        ] {
            let reply = error.reply();
            assert_eq!(&reply[..reply.len() - 2], error.to_string().as_bytes());
            assert!(reply.ends_with(b"\r\n"));
            assert_eq!(memchr(b'\n', reply), Some(reply.len() - 1));
        }
    }

    /// One meta request built from parts, for the round-trip property.
    #[derive(Debug, Clone)]
    struct Parts {
        command: MetaCommand,
        key: Vec<u8>,
        base64: bool,
        flags: Vec<Vec<u8>>,
        data: Vec<u8>,
    }

    impl Parts {
        fn encode(&self) -> Vec<u8> {
            let mut out = self.command.name().as_bytes().to_vec();
            if self.command == MetaCommand::Noop {
                out.extend(b"\r\n");
                return out;
            }
            out.push(b' ');
            out.extend(&self.key);
            if self.command == MetaCommand::Set {
                out.extend(format!(" {}", self.data.len()).as_bytes());
            }
            if self.base64 {
                out.extend(b" b");
            }
            for flag in &self.flags {
                out.push(b' ');
                out.extend(flag);
            }
            out.extend(b"\r\n");
            if self.command == MetaCommand::Set {
                out.extend(&self.data);
                out.extend(b"\r\n");
            }
            out
        }
    }

    fn command() -> impl Strategy<Value = MetaCommand> {
        prop_oneof![
            Just(MetaCommand::Get),
            Just(MetaCommand::Set),
            Just(MetaCommand::Delete),
            Just(MetaCommand::Arithmetic),
            Just(MetaCommand::Noop),
            Just(MetaCommand::Debug),
        ]
    }

    /// Flags every command accepts on 1.6.18, each at most once.
    fn flags() -> impl Strategy<Value = Vec<Vec<u8>>> {
        let flag = prop_oneof![
            Just(b"q".to_vec()),
            Just(b"k".to_vec()),
            Just(b"v".to_vec()),
            Just(b"c".to_vec()),
            Just(b"t".to_vec()),
            (0u32..100_000).prop_map(|n| format!("T{n}").into_bytes()),
            (0u32..1000).prop_map(|n| format!("N{n}").into_bytes()),
            (0u32..1000).prop_map(|n| format!("R{n}").into_bytes()),
            any::<u64>().prop_map(|n| format!("C{n}").into_bytes()),
            "[a-z0-9]{0,20}".prop_map(|s| format!("O{s}").into_bytes()),
        ];
        proptest::collection::vec(flag, 0..8).prop_map(|flags| {
            let mut seen = Vec::new();
            flags
                .into_iter()
                .filter(|f| {
                    let fresh = !seen.contains(&f[0]);
                    seen.push(f[0]);
                    fresh
                })
                .collect()
        })
    }

    fn parts() -> impl Strategy<Value = Parts> {
        (
            command(),
            proptest::collection::vec(any::<u8>(), 1..40),
            any::<bool>(),
            "[!-~]{1,60}",
            flags(),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(command, raw_key, base64, text_key, flags, data)| {
                let key = if base64 {
                    encode_base64(&raw_key)
                } else {
                    text_key.into_bytes()
                };
                Parts {
                    command,
                    key,
                    base64: base64 && command != MetaCommand::Noop,
                    flags: if command.has_flags() {
                        flags
                    } else {
                        Vec::new()
                    },
                    data,
                }
            })
    }

    fn encode_base64(bytes: &[u8]) -> Vec<u8> {
        encode_key(bytes).into_bytes()
    }

    /// A session's view: the outcome of parsing the stream request by request.
    fn parse_stream(stream: &[u8]) -> Vec<Result<(MetaRequest, usize), Rejection>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            match parse(&stream[at..]) {
                Ok(Some((request, n))) => {
                    at += n;
                    out.push(Ok((request, n)));
                }
                Ok(None) => break,
                Err(rejection) => {
                    at += rejection.consumed + rejection.discard;
                    out.push(Err(rejection));
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn encoded_keys_decode_to_themselves(key in proptest::collection::vec(any::<u8>(), 1..250)) {
            let token = encode_key(&key);
            prop_assert_eq!(token.len() % 4, 0);
            let decoded = decode_key(token.as_bytes()).map(|k| k.to_vec());
            prop_assert_eq!(decoded, Some(key));
        }

        #[test]
        fn encoded_requests_parse_back_to_their_parts(parts in parts()) {
            let bytes = parts.encode();
            let (request, consumed) = parse(&bytes).unwrap().unwrap();
            prop_assert_eq!(consumed, bytes.len());
            prop_assert_eq!(request.command, parts.command);
            prop_assert_eq!(request.backend_error, None);
            if parts.command == MetaCommand::Noop {
                prop_assert_eq!(request.key, None);
                return Ok(());
            }
            prop_assert_eq!(request.key_token(&bytes), &parts.key[..]);
            prop_assert_eq!(request.base64, parts.base64);
            let expected_key = if parts.base64 {
                decode_key(&parts.key).unwrap().to_vec()
            } else {
                parts.key.clone()
            };
            prop_assert_eq!(&*request.routing_key(&bytes), &expected_key[..]);
            let has = |c: u8| parts.flags.iter().any(|f| f[0] == c);
            prop_assert_eq!(request.quiet, has(b'q'));
            prop_assert_eq!(request.return_key, has(b'k'));
            prop_assert_eq!(request.vivify, has(b'N'));
            prop_assert_eq!(request.recache, has(b'R'));
            prop_assert_eq!(request.compare_cas, has(b'C'));
            let opaque = parts.flags.iter().find(|f| f[0] == b'O');
            prop_assert_eq!(request.opaque.map(|o| o.of(&bytes)), opaque.map(|o| &o[..]));
            if parts.command == MetaCommand::Set {
                prop_assert_eq!(request.data_len, Some(parts.data.len() as u32));
                let data_start = request.line_len as usize;
                prop_assert_eq!(&bytes[data_start..data_start + parts.data.len()], &parts.data[..]);
            }
            if parts.command != MetaCommand::Debug {
                let mut expected: Vec<&[u8]> = Vec::new();
                if parts.base64 {
                    expected.push(b"b");
                }
                expected.extend(parts.flags.iter().map(|f| &f[..]));
                let got: Vec<&[u8]> = request.flags(&bytes).map(|(_, t)| t).collect();
                prop_assert_eq!(got, expected);
            }
        }

        #[test]
        fn any_split_across_two_reads_parses_as_one_read(
            requests in proptest::collection::vec(parts(), 1..5),
            junk in proptest::collection::vec(any::<u8>(), 0..24),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut stream: Vec<u8> = requests.iter().flat_map(Parts::encode).collect();
            stream.extend(junk);
            let whole = parse_stream(&stream);
            // A session holding the first `cut` bytes parses what it can, then
            // continues with the rest appended.
            let cut = cut.index(stream.len() + 1);
            let mut pieces = Vec::new();
            let mut buffer = stream[..cut].to_vec();
            let mut rest = &stream[cut..];
            let mut skip = 0usize;
            loop {
                let dropped = skip.min(buffer.len());
                buffer.drain(..dropped);
                skip -= dropped;
                let step = if skip > 0 { Ok(None) } else { parse(&buffer) };
                match step {
                    Ok(Some((request, n))) => {
                        buffer.drain(..n);
                        pieces.push(Ok((request, n)));
                    }
                    Err(rejection) => {
                        skip = rejection.consumed + rejection.discard;
                        pieces.push(Err(rejection));
                    }
                    Ok(None) if rest.is_empty() => break,
                    Ok(None) => {
                        buffer.extend_from_slice(rest);
                        rest = &[];
                    }
                }
                if buffer.is_empty() && rest.is_empty() {
                    break;
                }
            }
            prop_assert_eq!(pieces, whole);
        }
    }
}
