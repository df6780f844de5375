//! Client request parsing: bytes in, a [`Request`] (with key ranges into those
//! bytes) or a [`Rejection`] carrying memcached's own reply out.
//!
//! Pure and incremental: `Ok(None)` means "wait for more bytes", and every limit
//! (line length, key length, declared value size) is checked from the command line
//! alone, before any data block is buffered. No I/O here.

use memchr::{memchr, memchr2};
use nom::bytes::streaming::take;
use nom::character::complete::{char as one_char, i64 as decimal_i64, u64 as decimal_u64};
use nom::combinator::{all_consuming, opt};
use nom::sequence::preceded;
use nom::Parser;
use smallvec::SmallVec;

use super::{Command, Limits, ParseError, MAX_DECLARED_VALUE_BYTES, MAX_KEY_BYTES};

/// A byte range inside one request's bytes (line and data block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    fn new(start: usize, end: usize) -> Span {
        // Lines are bounded by `Limits` far below 4 GiB, so offsets fit in u32.
        Span {
            start: start as u32,
            end: end as u32,
        }
    }

    /// The bytes this span covers.
    pub fn of<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.start as usize..self.end as usize]
    }
}

/// Key ranges of one request; four inline before a multi-get allocates.
pub type Keys = SmallVec<[Span; 4]>;

/// One well-formed request. All spans index the request's own bytes, which the
/// caller splits off its read buffer (`consumed` bytes) after a successful parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    /// Keys in the client's order (duplicates kept, as memcached keeps them).
    pub keys: Keys,
    /// The client asked for no reply (trailing `noreply`).
    pub noreply: bool,
    /// The extra argument some commands carry: the exptime of `gat`/`gats`, the
    /// delay of `flush_all`.
    pub arg: Option<Span>,
    /// End of the last token before a trailing `noreply` (or of the last token).
    /// `bytes[..args_end] + "\r\n" + data_block` is the request without `noreply`.
    pub args_end: u32,
    /// Length of the command line including its line ending.
    pub line_len: u32,
}

impl Request {
    /// The `i`th key of this request.
    pub fn key<'a>(&self, bytes: &'a [u8], i: usize) -> &'a [u8] {
        self.keys[i].of(bytes)
    }
}

/// A request the parser refused, in either dialect (classic or meta), with
/// everything the session needs to stay in step with the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    pub error: ParseError,
    /// Input bytes the rejected request occupies and that must be dropped now.
    pub consumed: usize,
    /// Further bytes to throw away after `consumed`, possibly not received yet:
    /// the data block of a value that is too large, read and discarded unbuffered.
    pub discard: usize,
    /// memcached sends no error either when the line ended in `noreply`.
    /// Never for a meta request: memcached clears its noreply state before
    /// sending a meta error, so `q` does not silence it.
    pub silent: bool,
    /// The key whose stored value memcached removes along with this refusal:
    /// a `set` (or `ms`) of a value too large for the cache deletes the key,
    /// so the value the client meant to replace is not read again
    /// (memcached's t/getset.t). Spans the rejected line.
    pub stale_key: Option<StaleKey>,
}

/// The key of a refused write that memcached deletes (see
/// [`Rejection::stale_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleKey {
    /// The key token as sent.
    pub token: Span,
    /// The token is base64 (meta `b`): the key is its decoding.
    pub base64: bool,
}

impl StaleKey {
    /// The key memcached deletes, from the rejected request's bytes.
    pub fn key(&self, bytes: &[u8]) -> Vec<u8> {
        let token = self.token.of(bytes);
        if self.base64 {
            super::base64_key::decode_key(token).map_or_else(Vec::new, |key| key.to_vec())
        } else {
            token.to_vec()
        }
    }
}

impl Rejection {
    /// memcached's reply, including `\r\n`; `None` when it sends none.
    pub fn reply(&self) -> Option<&'static [u8]> {
        (!self.silent).then(|| self.error.reply())
    }

    /// Whether the client connection stays usable.
    pub fn keeps_connection(&self) -> bool {
        self.error.keeps_connection()
    }

    pub(super) fn line(error: ParseError, line_len: usize, silent: bool) -> Rejection {
        Rejection {
            error,
            consumed: line_len,
            discard: 0,
            silent,
            stale_key: None,
        }
    }
}

/// The outcome of one parse step.
pub type ParseResult = Result<Option<(Request, usize)>, Rejection>;

const MAX_TOKENS: usize = 8;

/// The first byte of every memcached binary-protocol request.
const BINARY_REQUEST_MAGIC: u8 = 0x80;

/// Parses the request at the start of `buf`.
///
/// Returns `Ok(Some((request, consumed)))` for a complete request,
/// `Ok(None)` when more bytes are needed, and `Err(rejection)` for input that
/// memcached would refuse; the rejection says how many bytes to drop.
pub fn parse_request(buf: &[u8], limits: &Limits) -> ParseResult {
    parse_request_reusing(buf, limits, &mut Keys::new())
}

/// [`parse_request`], with `spare` (empty) as the storage of a retrieval's
/// keys when they outgrow the request's own room: a caller that hands back
/// the keys of finished requests parses multi-key gets without allocating.
/// `spare` is taken only then.
pub fn parse_request_reusing(buf: &[u8], limits: &Limits, spare: &mut Keys) -> ParseResult {
    if buf.first() == Some(&BINARY_REQUEST_MAGIC) {
        // A binary-protocol client would wait forever for a text reply it
        // cannot read: say so once and close.
        return Err(Rejection::line(
            ParseError::BinaryProtocol,
            buf.len(),
            false,
        ));
    }
    let Some(FramedLine {
        content_end,
        line_len,
    }) = frame_line(buf, limits)?
    else {
        return Ok(None);
    };
    let line = &buf[..content_end];

    let mut tokens = Tokens { line, at: 0 };
    let Some(command_token) = tokens.next() else {
        return Err(Rejection::line(ParseError::UnknownCommand, line_len, false));
    };
    let Some(command) = command_named(command_token.of(line)) else {
        let error = if looks_like_http(command_token.of(line), line) {
            ParseError::HttpRequest
        } else {
            ParseError::UnknownCommand
        };
        return Err(Rejection::line(
            error,
            line_len,
            error == ParseError::HttpRequest,
        ));
    };
    let line_end = LineEnd {
        line_len,
        args_end: content_end,
        command_end: command_token.end as usize,
    };
    if command.is_retrieval() {
        return parse_retrieval(
            command,
            line,
            tokens,
            line_end,
            limits.max_keys_per_get,
            spare,
        );
    }

    // Every other command has a handful of tokens; more means `ERROR`, as in
    // memcached's fixed-size tokenizer.
    let mut args: SmallVec<[Span; MAX_TOKENS]> = SmallVec::new();
    for token in tokens {
        if args.len() == MAX_TOKENS {
            return Err(Rejection::line(ParseError::UnknownCommand, line_len, false));
        }
        args.push(token);
    }
    let parsed = ArgLine {
        line,
        args: &args,
        line_end,
    };
    match command {
        Command::Set | Command::Add | Command::Replace | Command::Append | Command::Prepend => {
            parse_storage(command, &parsed, buf, limits, false)
        }
        Command::Cas => parse_storage(command, &parsed, buf, limits, true),
        Command::Delete => parse_delete(&parsed),
        Command::Incr | Command::Decr => parse_key_and_number(
            command,
            &parsed,
            |delta| parse_unsigned(delta).is_some(),
            ParseError::InvalidDelta,
        ),
        Command::Touch => parse_key_and_number(
            command,
            &parsed,
            |exptime| parse_signed(exptime).is_some(),
            ParseError::InvalidExptime,
        ),
        Command::Verbosity => parse_verbosity(&parsed),
        Command::FlushAll => parse_flush_all(&parsed),
        // `stats` keeps its first argument so that `stats <group>` can be refused.
        Command::Stats => Ok(Some(parsed.request(
            command,
            Keys::new(),
            false,
            args.first().copied(),
            line_len,
        ))),
        Command::Version | Command::Quit => Ok(Some(parsed.request(
            command,
            Keys::new(),
            false,
            None,
            line_len,
        ))),
        Command::Get | Command::Gets | Command::Gat | Command::Gats => {
            unreachable!("retrieval commands return above")
        }
        // Meta commands are parsed by `meta::parse_meta`; their names never
        // map to a command here.
        Command::MetaGet
        | Command::MetaSet
        | Command::MetaDelete
        | Command::MetaArithmetic
        | Command::MetaNoop
        | Command::MetaDebug => Err(Rejection::line(ParseError::UnknownCommand, line_len, false)),
    }
}

/// Where the request line at the start of `buf` ends.
pub(crate) struct FramedLine {
    /// The end of its content: before `\r\n` or `\n`, or at a NUL.
    pub(crate) content_end: usize,
    /// Its length with the newline.
    pub(crate) line_len: usize,
}

/// Finds the request line at the start of `buf`: `None` until its newline
/// arrives, a rejection past the line bound (a retrieval's is longer). Both
/// dialects frame their lines here.
#[inline]
pub(crate) fn frame_line(buf: &[u8], limits: &Limits) -> Result<Option<FramedLine>, Rejection> {
    // Input within both bounds is framed alike under either: what the
    // command is matters only past the shorter one.
    let line_bound = if buf.len() <= limits.max_line_bytes.min(limits.max_get_line_bytes) {
        limits.max_line_bytes
    } else if starts_like_retrieval(buf, limits.max_line_bytes) {
        limits.max_get_line_bytes
    } else {
        limits.max_line_bytes
    };
    // memcached reads the line as a C string: a NUL ends its content there,
    // and the line still ends at its newline. One pass finds whichever comes
    // first; only a line with a NUL needs a second.
    let window = &buf[..buf.len().min(line_bound + 1)];
    let (newline, nul) = match memchr2(b'\n', 0, window) {
        Some(at) if window[at] == b'\n' => (Some(at), None),
        Some(at) => (memchr(b'\n', &window[at..]).map(|n| at + n), Some(at)),
        None => (None, None),
    };
    let newline = match newline {
        Some(position) => position,
        None if buf.len() > line_bound => {
            return Err(Rejection::line(ParseError::LineTooLong, buf.len(), false))
        }
        None => return Ok(None),
    };
    let line_len = newline + 1;
    // memcached accepts a bare `\n` as well as `\r\n`.
    let content_end = if newline > 0 && buf[newline - 1] == b'\r' {
        newline - 1
    } else {
        newline
    };
    let content_end = nul.map_or(content_end, |nul| nul.min(content_end));
    Ok(Some(FramedLine {
        content_end,
        line_len,
    }))
}

/// The classic command a request line names, if any.
#[inline]
fn command_named(name: &[u8]) -> Option<Command> {
    Some(match name {
        b"get" => Command::Get,
        b"gets" => Command::Gets,
        b"gat" => Command::Gat,
        b"gats" => Command::Gats,
        b"set" => Command::Set,
        b"add" => Command::Add,
        b"replace" => Command::Replace,
        b"append" => Command::Append,
        b"prepend" => Command::Prepend,
        b"cas" => Command::Cas,
        b"delete" => Command::Delete,
        b"incr" => Command::Incr,
        b"decr" => Command::Decr,
        b"touch" => Command::Touch,
        b"version" => Command::Version,
        b"verbosity" => Command::Verbosity,
        b"flush_all" => Command::FlushAll,
        b"stats" => Command::Stats,
        b"quit" => Command::Quit,
        _ => return None,
    })
}

/// One part of a retrieval line longer than [`Limits::max_get_line_bytes`]:
/// memcached serves multi-gets of any length, so such a line is served in
/// parts as it arrives rather than buffered whole. Each part is a request
/// line of its own (the line's head, `get ` or `gat <exptime> `, then the
/// keys of this part) for [`parse_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LongGetPart {
    /// Not the start of a long retrieval line: parse it as usual.
    Not,
    /// More bytes are needed for the next part.
    Wait,
    /// The next part: `line` to parse, `consumed` input bytes it takes,
    /// `head` (the command and its arguments before the keys, with the
    /// space after them) for the parts after it, and whether it ends the
    /// client's line.
    Part {
        line: Vec<u8>,
        consumed: usize,
        head: Vec<u8>,
        last: bool,
    },
}

/// The next part of a long retrieval line at the start of `buf`: its first
/// part when `head` is `None` (the line starts in `buf`), else a later one.
/// A line is long when it has no newline within `max_get_line_bytes` bytes,
/// or more than `max_keys_per_get` keys. A part ends at the line's newline,
/// or at a space after at most `max_get_line_bytes` bytes and
/// `max_keys_per_get` keys. `Err` for a line with a token longer than that
/// bound, which no part can hold (too long a line, as before).
pub fn long_get_part(
    buf: &[u8],
    head: Option<&[u8]>,
    limits: &Limits,
) -> Result<LongGetPart, ParseError> {
    // Every request is looked at here first: most are not gets.
    if head.is_none() && !matches!(buf.first(), Some(b'g' | b' ')) {
        return Ok(LongGetPart::Not);
    }
    let bound = limits.max_get_line_bytes;
    // A line of more keys than allowed is at least two bytes a key long.
    let many_keys = |line_len: usize| line_len > 2 * limits.max_keys_per_get;
    // Input too short to hold a long line, wherever its newline is: not
    // one, without a scan the parser makes again (the usual one-line get).
    if head.is_none() && buf.len() <= bound && !many_keys(buf.len()) {
        return Ok(LongGetPart::Not);
    }
    let window = &buf[..buf.len().min(bound + 1)];
    let newline = memchr(b'\n', window);
    let first = head.is_none();
    let (head, keys_from) = match head {
        Some(head) => (head.to_vec(), 0),
        None => {
            let long = match newline {
                Some(at) => many_keys(at),
                None => buf.len() > bound,
            };
            if !long || !starts_like_retrieval(buf, limits.max_line_bytes) {
                return Ok(LongGetPart::Not);
            }
            let mut tokens = Tokens {
                line: window,
                at: 0,
            };
            let command = tokens.next().map(|t| t.of(window));
            if matches!(command, Some(b"gat" | b"gats")) {
                tokens.next();
            }
            let mut from = tokens.at;
            while window.get(from) == Some(&b' ') {
                from += 1;
            }
            (window[..from].to_vec(), from)
        }
    };
    // A part is a line of its own within the bound: the head, its keys,
    // and a line ending.
    let mut line = head.clone();
    if !line.ends_with(b" ") {
        line.push(b' ');
    }
    let room = bound.saturating_sub(line.len() + 2) + keys_from;
    let fits = newline.filter(|&at| at <= room + 1);
    if fits.is_none() && buf.len() <= room {
        return Ok(LongGetPart::Wait);
    }
    // The keys this part may take end at the newline or at the room left;
    // it stops early after `max_keys_per_get` keys.
    let end = fits.unwrap_or(room.min(window.len()));
    let mut cut = None;
    let mut keys = 0;
    let mut in_key = false;
    for (i, &b) in window[..end].iter().enumerate().skip(keys_from) {
        if b == b' ' {
            if in_key {
                keys += 1;
                in_key = false;
            }
            cut = Some(i);
            if keys == limits.max_keys_per_get {
                break;
            }
        } else {
            in_key = true;
        }
    }
    match fits {
        Some(at) if keys < limits.max_keys_per_get => {
            if first {
                // Not so many keys after all: an ordinary line.
                return Ok(LongGetPart::Not);
            }
            line.extend_from_slice(&buf[keys_from..=at]);
            Ok(LongGetPart::Part {
                line,
                consumed: at + 1,
                head,
                last: true,
            })
        }
        _ => {
            let Some(cut) = cut else {
                return Err(ParseError::LineTooLong);
            };
            line.extend_from_slice(&buf[keys_from..cut]);
            line.extend_from_slice(b"\r\n");
            Ok(LongGetPart::Part {
                line,
                consumed: cut + 1,
                head,
                last: false,
            })
        }
    }
}

/// Most tokens memcached's tokenizer splits a line into (`MAX_TOKENS` less
/// its terminator); past them the last token is the rest of the line.
const MEMCACHED_TOKENS: usize = 23;

/// Whether memcached 1.6.18 would close the connection, without a reply, on
/// this line of an unknown command `name`: its last token starts with
/// `HTTP/`, so it is an HTTP request line (a browser or an HTTP client made
/// to post to the cache port) and nothing after it may run as a command.
/// Probed on 1.6.18, the check sits only where memcached's dispatch gives up
/// on a name: a name of one byte, or one whose first byte starts a family
/// memcached tells apart itself (`a`, `c`, `d`, `g`, `i`, `s`, `t`), or a
/// command memcached knows and memring does not, answers `ERROR` instead, as
/// does a line of more tokens than memcached's tokenizer splits.
fn looks_like_http(name: &[u8], line: &[u8]) -> bool {
    const ANSWERED_BY_NAME: [&[u8]; 5] = [
        b"lru",
        b"lru_crawler",
        b"extstore",
        b"refresh_certs",
        b"watch",
    ];
    if name.len() < 2 || b"acdgist".contains(&name[0]) || ANSWERED_BY_NAME.contains(&name) {
        return false;
    }
    let mut tokens = Tokens { line, at: 0 };
    let mut last = None;
    for count in 1..=MEMCACHED_TOKENS + 1 {
        match tokens.next() {
            Some(token) if count <= MEMCACHED_TOKENS => last = Some(token),
            Some(_) => return false,
            None => break,
        }
    }
    last.is_some_and(|token| token.of(line).starts_with(b"HTTP/"))
}

/// Whether the buffer starts with a retrieval command, whose lines may be longer.
/// Only the first `max_line_bytes` bytes are looked at, so the answer (and the
/// line limit) is the same however the line is split across reads.
fn starts_like_retrieval(buf: &[u8], max_line_bytes: usize) -> bool {
    let window = &buf[..buf.len().min(max_line_bytes)];
    let start = window
        .iter()
        .position(|&b| b != b' ')
        .unwrap_or(window.len());
    let rest = &window[start..];
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|prefix| rest.starts_with(prefix))
}

/// Where the command line ends, and where its arguments end.
#[derive(Clone, Copy)]
struct LineEnd {
    line_len: usize,
    args_end: usize,
    command_end: usize,
}

/// Space-separated tokens of one line; runs of spaces count as one separator,
/// leading spaces are skipped, as memcached's tokenizer does.
struct Tokens<'a> {
    line: &'a [u8],
    at: usize,
}

impl Tokens<'_> {
    /// The next token, read as a key: `Some(None)` when it is not a valid
    /// one (see [`is_valid_key`]). One pass over its bytes finds both its
    /// end and whether it is valid: a multi-key `get` spends most of its
    /// parse here.
    fn next_key(&mut self) -> Option<Option<Span>> {
        while self.at < self.line.len() && self.line[self.at] == b' ' {
            self.at += 1;
        }
        if self.at == self.line.len() {
            return None;
        }
        let start = self.at;
        let rest = &self.line[start..];
        // The first byte no key may hold; a space ends the token.
        let stop = super::scan::first_stop(rest, super::scan::ends_key);
        let end = match stop {
            Some(i) if rest[i] != b' ' => {
                self.at = self.line.len();
                return Some(None);
            }
            Some(i) => start + i,
            None => self.line.len(),
        };
        self.at = end;
        Some((end - start <= MAX_KEY_BYTES).then(|| Span::new(start, end)))
    }
}

impl Iterator for Tokens<'_> {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        while self.at < self.line.len() && self.line[self.at] == b' ' {
            self.at += 1;
        }
        if self.at == self.line.len() {
            return None;
        }
        let start = self.at;
        // Tokens are short (a command, a key, a number): a byte loop costs
        // less than setting up a `memchr` for each.
        let end = self.line[start..]
            .iter()
            .position(|&b| b == b' ')
            .map_or(self.line.len(), |i| start + i);
        self.at = end;
        Some(Span::new(start, end))
    }
}

/// The tokens after the command name of a non-retrieval command (`args[0]` is
/// the first argument, not the command).
struct ArgLine<'a> {
    line: &'a [u8],
    args: &'a [Span],
    line_end: LineEnd,
}

impl ArgLine<'_> {
    fn arg(&self, i: usize) -> &[u8] {
        self.args[i].of(self.line)
    }

    /// True when the last argument is `noreply` and the argument count says it
    /// is in the `noreply` position.
    fn noreply_at(&self, count_with_noreply: usize) -> bool {
        self.args.len() == count_with_noreply && self.arg(count_with_noreply - 1) == b"noreply"
    }

    fn reject(&self, error: ParseError, silent: bool) -> ParseResult {
        Err(Rejection::line(error, self.line_end.line_len, silent))
    }

    fn request(
        &self,
        command: Command,
        keys: Keys,
        noreply: bool,
        arg: Option<Span>,
        consumed: usize,
    ) -> (Request, usize) {
        let args_end = if noreply {
            // The end of the token before `noreply`: an argument, or the
            // command name itself (`flush_all noreply`).
            self.args
                .len()
                .checked_sub(2)
                .map_or(self.line_end.command_end, |i| self.args[i].end as usize)
        } else {
            self.line_end.args_end
        };
        let request = Request {
            command,
            keys,
            noreply,
            arg,
            args_end: args_end as u32,
            line_len: self.line_end.line_len as u32,
        };
        (request, consumed)
    }
}

fn parse_retrieval(
    command: Command,
    line: &[u8],
    mut tokens: Tokens<'_>,
    line_end: LineEnd,
    max_keys: usize,
    spare: &mut Keys,
) -> ParseResult {
    let reject = |error| Err(Rejection::line(error, line_end.line_len, false));
    let mut arg = None;
    if matches!(command, Command::Gat | Command::Gats) {
        let Some(exptime) = tokens.next() else {
            return reject(ParseError::UnknownCommand);
        };
        if parse_signed(exptime.of(line)).is_none() {
            return reject(ParseError::InvalidExptime);
        }
        arg = Some(exptime);
    }
    let mut keys = Keys::new();
    while let Some(token) = tokens.next_key() {
        let Some(token) = token else {
            return reject(ParseError::BadCommandLine);
        };
        if keys.len() == max_keys {
            return reject(ParseError::TooManyKeys);
        }
        if keys.len() == keys.inline_size() {
            // Grown once: at most one key per space left on the line.
            let rest = &line[token.start as usize..line_end.args_end];
            let more = memchr::memchr_iter(b' ', rest).count() + 1;
            let more = more.min(max_keys - keys.len());
            if spare.capacity() >= keys.len() + more && spare.spilled() {
                let mut grown = std::mem::take(spare);
                grown.clear();
                grown.extend_from_slice(&keys);
                keys = grown;
            } else {
                keys.reserve_exact(more);
            }
        }
        keys.push(token);
    }
    // `get` needs a key; `gat <exptime>` without keys answers a bare `END`.
    if keys.is_empty() && arg.is_none() {
        return reject(ParseError::UnknownCommand);
    }
    let request = Request {
        command,
        keys,
        noreply: false,
        arg,
        args_end: line_end.args_end as u32,
        line_len: line_end.line_len as u32,
    };
    Ok(Some((request, line_end.line_len)))
}

/// `set|add|replace|append|prepend <key> <flags> <exptime> <bytes> [noreply]`
/// and `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`.
fn parse_storage(
    command: Command,
    parsed: &ArgLine<'_>,
    buf: &[u8],
    limits: &Limits,
    has_cas: bool,
) -> ParseResult {
    let required = if has_cas { 5 } else { 4 };
    if parsed.args.len() != required && parsed.args.len() != required + 1 {
        return parsed.reject(ParseError::UnknownCommand, false);
    }
    let noreply = parsed.noreply_at(required + 1);
    let key = parsed.args[0];
    let numbers_ok = parse_unsigned(parsed.arg(1)).is_some()
        && parse_signed(parsed.arg(2)).is_some()
        && (!has_cas || parse_unsigned(parsed.arg(4)).is_some());
    // memcached stores the parsed length in a 32-bit int: larger numbers
    // wrap (4294967298 declares 2 bytes), and the result must be 0..=INT_MAX-2.
    let declared = parse_signed(parsed.arg(3)).map(|len| i64::from(len as i32));
    let value_len = match declared {
        Some(len) if numbers_ok && (0..=MAX_DECLARED_VALUE_BYTES).contains(&len) => len as usize,
        _ => return parsed.reject(ParseError::BadCommandLine, noreply),
    };
    if !is_valid_key(key.of(parsed.line)) {
        return parsed.reject(ParseError::BadCommandLine, noreply);
    }
    let line_len = parsed.line_end.line_len;
    if value_len > limits.max_value_bytes {
        // memcached 1.6.18 deletes the key for `set` only (probed: `add`,
        // `replace`, `append`, `prepend` and `cas` leave it).
        let stale_key = (command == Command::Set).then_some(StaleKey {
            token: key,
            base64: false,
        });
        return Err(Rejection {
            error: ParseError::ValueTooLarge,
            consumed: line_len,
            discard: value_len + 2,
            silent: noreply,
            stale_key,
        });
    }
    // The data block is framed by its declared length (values may contain
    // `\r\n`), then must end with `\r\n`.
    let block = match take::<_, _, nom::error::Error<&[u8]>>(value_len + 2).parse(&buf[line_len..])
    {
        Ok((_, block)) => block,
        Err(_) => return Ok(None),
    };
    let total = line_len + value_len + 2;
    if &block[value_len..] != b"\r\n" {
        return Err(Rejection {
            error: ParseError::BadDataChunk,
            consumed: total,
            discard: 0,
            silent: noreply,
            stale_key: None,
        });
    }
    let keys = smallvec::smallvec![key];
    Ok(Some(parsed.request(command, keys, noreply, None, total)))
}

/// `delete <key> [0] [noreply]`: memcached still accepts the legacy hold time
/// if it is zero.
fn parse_delete(parsed: &ArgLine<'_>) -> ParseResult {
    let count = parsed.args.len();
    if !(1..=3).contains(&count) {
        return parsed.reject(ParseError::UnknownCommand, false);
    }
    let noreply = count > 1 && parsed.arg(count - 1) == b"noreply";
    if count > 1 {
        let hold_is_zero = parsed.arg(1) == b"0";
        let valid =
            (count == 2 && (hold_is_zero || noreply)) || (count == 3 && hold_is_zero && noreply);
        if !valid {
            return parsed.reject(ParseError::BadDeleteLine, noreply);
        }
    }
    let key = parsed.args[0];
    if !is_valid_key(key.of(parsed.line)) {
        return parsed.reject(ParseError::BadCommandLine, noreply);
    }
    let len = parsed.line_end.line_len;
    Ok(Some(parsed.request(
        Command::Delete,
        smallvec::smallvec![key],
        noreply,
        None,
        len,
    )))
}

/// `incr|decr <key> <delta> [noreply]` and `touch <key> <exptime> [noreply]`:
/// a key and one number, each command with its own error for a bad number.
fn parse_key_and_number(
    command: Command,
    parsed: &ArgLine<'_>,
    number_ok: fn(&[u8]) -> bool,
    bad_number: ParseError,
) -> ParseResult {
    if parsed.args.len() != 2 && parsed.args.len() != 3 {
        return parsed.reject(ParseError::UnknownCommand, false);
    }
    let noreply = parsed.noreply_at(3);
    let key = parsed.args[0];
    if !is_valid_key(key.of(parsed.line)) {
        return parsed.reject(ParseError::BadCommandLine, noreply);
    }
    if !number_ok(parsed.arg(1)) {
        return parsed.reject(bad_number, noreply);
    }
    let len = parsed.line_end.line_len;
    Ok(Some(parsed.request(
        command,
        smallvec::smallvec![key],
        noreply,
        None,
        len,
    )))
}

/// `verbosity <level> [noreply]`.
fn parse_verbosity(parsed: &ArgLine<'_>) -> ParseResult {
    if parsed.args.len() != 1 && parsed.args.len() != 2 {
        return parsed.reject(ParseError::UnknownCommand, false);
    }
    let noreply = parsed.noreply_at(2);
    if parse_unsigned(parsed.arg(0)).is_none() {
        return parsed.reject(ParseError::BadCommandLine, noreply);
    }
    let len = parsed.line_end.line_len;
    Ok(Some(parsed.request(
        Command::Verbosity,
        Keys::new(),
        noreply,
        Some(parsed.args[0]),
        len,
    )))
}

/// `flush_all [delay] [noreply]`. Like memcached, with two arguments the
/// first is the delay and the second counts only if it is `noreply`.
fn parse_flush_all(parsed: &ArgLine<'_>) -> ParseResult {
    let count = parsed.args.len();
    if count > 2 {
        return parsed.reject(ParseError::UnknownCommand, false);
    }
    let noreply = count > 0 && parsed.arg(count - 1) == b"noreply";
    let delay = match count {
        0 => None,
        1 if noreply => None,
        _ => Some(parsed.args[0]),
    };
    if let Some(delay) = delay {
        if parse_signed(delay.of(parsed.line)).is_none() {
            return parsed.reject(ParseError::InvalidExptime, noreply);
        }
    }
    let len = parsed.line_end.line_len;
    Ok(Some(parsed.request(
        Command::FlushAll,
        Keys::new(),
        noreply,
        delay,
        len,
    )))
}

/// A key memring forwards: 1..=250 bytes, no spaces and no control bytes.
/// (memcached itself only checks the length; control bytes in keys break
/// text-protocol clients and logs, so memring refuses them.)
pub fn is_valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_BYTES && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// An unsigned field as memcached's `strtoul`-based checks accept it: decimal
/// digits with an optional `+`, within 64 bits.
pub fn parse_unsigned(token: &[u8]) -> Option<u64> {
    all_consuming(preceded(
        opt(one_char::<_, nom::error::Error<&[u8]>>('+')),
        decimal_u64,
    ))
    .parse(token)
    .ok()
    .map(|(_, value)| value)
}

/// A signed field (exptime, declared length) as memcached's `strtol` accepts
/// it: an optional sign and decimal digits within 64 bits.
pub fn parse_signed(token: &[u8]) -> Option<i64> {
    all_consuming(decimal_i64::<_, nom::error::Error<&[u8]>>)
        .parse(token)
        .ok()
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    fn parse(input: &[u8]) -> ParseResult {
        parse_request(input, &limits())
    }

    fn keys_of(input: &[u8]) -> Vec<Vec<u8>> {
        let (request, _) = parse(input).unwrap().unwrap();
        (0..request.keys.len())
            .map(|i| request.key(input, i).to_vec())
            .collect()
    }

    fn rejection(input: &[u8]) -> Rejection {
        parse(input).unwrap_err()
    }

    #[test]
    fn a_spare_key_list_is_taken_only_by_keys_that_outgrow_the_requests_own_room() {
        let limits = Limits::default();
        let mut spare = Keys::new();
        spare.reserve_exact(16);
        let spare_at = spare.as_ptr();
        let few = b"get a b c d\r\n";
        let (request, _) = parse_request_reusing(few, &limits, &mut spare)
            .unwrap()
            .unwrap();
        assert!(!request.keys.spilled());
        assert_eq!(spare.as_ptr(), spare_at, "a get of four keys left it");
        let many = b"get a b c d e f g h i j\r\n";
        let (request, consumed) = parse_request_reusing(many, &limits, &mut spare)
            .unwrap()
            .unwrap();
        assert_eq!(request.keys.as_ptr(), spare_at, "ten keys took it");
        assert!(!spare.spilled());
        assert_eq!(
            parse_request(many, &limits).unwrap().unwrap(),
            (request, consumed),
            "parsed as without a spare"
        );
    }

    #[test]
    fn single_get_parses_with_its_key_and_length() {
        let input = b"get foo\r\nget bar\r\n";
        let (request, consumed) = parse(input).unwrap().unwrap();
        assert_eq!(request.command, Command::Get);
        assert_eq!(consumed, 9);
        assert_eq!(request.key(input, 0), b"foo");
        assert!(!request.noreply);
    }

    #[test]
    fn multi_get_keeps_key_order_and_duplicates() {
        assert_eq!(
            keys_of(b"gets  a b   a c\r\n"),
            vec![b"a".to_vec(), b"b".to_vec(), b"a".to_vec(), b"c".to_vec()]
        );
    }

    #[test]
    fn bare_newline_and_leading_spaces_are_accepted_like_memcached() {
        assert_eq!(keys_of(b"  get a\n"), vec![b"a".to_vec()]);
    }

    #[test]
    fn partial_line_waits_for_more_bytes() {
        assert_eq!(parse(b"get fo"), Ok(None));
        assert_eq!(parse(b"set foo 0 0 5\r\nhel"), Ok(None));
        assert_eq!(parse(b"set foo 0 0 5\r\nhello\r"), Ok(None));
    }

    #[test]
    fn set_frames_value_by_declared_length_even_with_crlf_inside() {
        let input = b"set k 1 2 4\r\na\r\nb\r\nget k\r\n";
        let (request, consumed) = parse(input).unwrap().unwrap();
        assert_eq!(request.command, Command::Set);
        assert_eq!(consumed, 19);
        assert_eq!(request.line_len, 13);
    }

    #[test]
    fn noreply_is_detected_and_args_end_strips_it() {
        let input = b"set k 0 0 1 noreply\r\nx\r\n";
        let (request, _) = parse(input).unwrap().unwrap();
        assert!(request.noreply);
        assert_eq!(&input[..request.args_end as usize], b"set k 0 0 1");
        let input = b"delete k 0 noreply\r\n";
        let (request, _) = parse(input).unwrap().unwrap();
        assert_eq!(&input[..request.args_end as usize], b"delete k 0");
    }

    #[test]
    fn a_seventh_token_that_is_not_noreply_is_ignored_like_memcached() {
        let (request, _) = parse(b"set k 0 0 1 foo\r\nx\r\n").unwrap().unwrap();
        assert!(!request.noreply);
    }

    #[test]
    fn key_of_251_bytes_is_rejected() {
        let mut input = b"get ".to_vec();
        input.extend(std::iter::repeat_n(b'k', 251));
        input.extend(b"\r\n");
        assert_eq!(rejection(&input).error, ParseError::BadCommandLine);
        let mut ok = b"get ".to_vec();
        ok.extend(std::iter::repeat_n(b'k', 250));
        ok.extend(b"\r\n");
        assert!(parse(&ok).unwrap().is_some());
    }

    #[test]
    fn control_bytes_in_keys_are_rejected() {
        assert_eq!(rejection(b"get a\tb\r\n").error, ParseError::BadCommandLine);
        assert_eq!(
            rejection(b"get a\x7fb\r\n").error,
            ParseError::BadCommandLine
        );
        // In any key of a multi-get, at its start or its end.
        for input in [
            &b"get ok \x01b\r\n"[..],
            b"get ok b\x7f\r\n",
            b"get a b\x01 c\r\n",
        ] {
            assert_eq!(
                rejection(input).error,
                ParseError::BadCommandLine,
                "{input:?}"
            );
        }
        let (request, _) = parse(b"get a  bc   d  \r\n").unwrap().unwrap();
        let keys: Vec<&[u8]> = (0..request.keys.len())
            .map(|i| request.key(b"get a  bc   d  \r\n", i))
            .collect();
        assert_eq!(keys, [&b"a"[..], b"bc", b"d"]);
    }

    #[test]
    fn bad_declared_lengths_get_bad_command_line_and_consume_only_the_line() {
        for input in [
            &b"set a 0 0 -1\r\nxx\r\n"[..],
            b"set a 0 0 4294967295\r\nxx\r\n",
            b"set a 0 0 6442450943\r\nxx\r\n",
            b"set a 0 0 2147483646\r\nxx\r\n",
            b"set a 0 0 abc\r\nxx\r\n",
            b"set a -1 0 1\r\nx\r\n",
            b"cas a 0 0 1 -1\r\nx\r\n",
        ] {
            let rejected = rejection(input);
            assert_eq!(rejected.error, ParseError::BadCommandLine, "{input:?}");
            assert_eq!(rejected.discard, 0);
            // Like memcached, the data line is then read as the next command.
            assert_eq!(input[rejected.consumed], b'x');
        }
    }

    #[test]
    fn oversized_value_is_refused_from_the_header_and_its_block_discarded() {
        let input = b"set big 0 0 2000000\r\n";
        let rejected = rejection(input);
        assert_eq!(rejected.error, ParseError::ValueTooLarge);
        assert_eq!(rejected.consumed, input.len());
        assert_eq!(rejected.discard, 2_000_002);
        assert!(!rejected.silent);
        let rejected = rejection(b"set big 0 0 2000000 noreply\r\n");
        assert!(rejected.silent);
    }

    #[test]
    fn largest_declared_length_waits_without_allocating() {
        let limits = Limits {
            max_value_bytes: usize::MAX,
            ..Limits::default()
        };
        assert_eq!(
            parse_request(b"set a 0 0 2147483645\r\nxx", &limits),
            Ok(None)
        );
    }

    #[test]
    fn data_block_without_crlf_is_a_bad_data_chunk() {
        let input = b"set a 0 0 1\r\nzz\r\n";
        let rejected = rejection(input);
        assert_eq!(rejected.error, ParseError::BadDataChunk);
        // memcached reads exactly <bytes> + 2, leaving the `\n` as an empty line.
        assert_eq!(rejected.consumed, input.len() - 1);
    }

    #[test]
    fn memcached_number_quirks_are_accepted() {
        for input in [
            &b"set a +5 0 1\r\nz\r\n"[..],
            b"set a 4294967296 0 1\r\nz\r\n",
            b"set a 0 -5 1\r\nz\r\n",
            b"set a 0 99999999999 1\r\nz\r\n",
            b"incr a +1\r\n",
            b"touch a -1\r\n",
            b"gat +1 a\r\n",
        ] {
            assert!(parse(input).unwrap().is_some(), "{input:?}");
        }
    }

    #[test]
    fn wrong_token_counts_are_unknown_commands() {
        for input in [
            &b"get\r\n"[..],
            b"set a 0 0\r\n",
            b"set a 0 0 1 noreply extra\r\n",
            b"cas a 0 0 1\r\n",
            b"incr\r\n",
            b"touch a\r\n",
            b"delete\r\n",
            b"verbosity\r\n",
            b"\r\n",
            b"GET a\r\n",
            b"mg a v\r\n",
        ] {
            assert_eq!(
                rejection(input).error,
                ParseError::UnknownCommand,
                "{input:?}"
            );
        }
    }

    #[test]
    fn command_specific_errors_match_memcached() {
        for (input, error) in [
            (&b"incr a abc\r\n"[..], ParseError::InvalidDelta),
            (b"incr a -1\r\n", ParseError::InvalidDelta),
            (b"incr a 18446744073709551616\r\n", ParseError::InvalidDelta),
            (b"touch a abc\r\n", ParseError::InvalidExptime),
            (b"gat abc a\r\n", ParseError::InvalidExptime),
            (b"delete a 1\r\n", ParseError::BadDeleteLine),
            (b"delete a x y\r\n", ParseError::BadDeleteLine),
            (b"verbosity x\r\n", ParseError::BadCommandLine),
            (b"flush_all x\r\n", ParseError::InvalidExptime),
        ] {
            assert_eq!(rejection(input).error, error, "{input:?}");
        }
    }

    #[test]
    fn noreply_silences_errors_after_noreply_is_known() {
        assert!(rejection(b"incr a abc noreply\r\n").silent);
        assert!(rejection(b"delete a 1 noreply\r\n").silent);
        assert!(rejection(b"set a 0 0 -1 noreply\r\n").silent);
        assert!(!rejection(b"set a 0 0 1 noreply extra\r\n").silent);
    }

    #[test]
    fn delete_accepts_a_zero_hold_time() {
        assert!(parse(b"delete a 0\r\n").unwrap().is_some());
        let (request, _) = parse(b"delete a noreply\r\n").unwrap().unwrap();
        assert!(request.noreply);
    }

    #[test]
    fn gat_without_keys_parses_to_an_empty_key_list() {
        let (request, _) = parse(b"gat 0\r\n").unwrap().unwrap();
        assert!(request.keys.is_empty());
        assert_eq!(request.command, Command::Gat);
    }

    #[test]
    fn line_without_newline_past_the_bound_is_too_long() {
        let input = vec![b'x'; 3000];
        let rejected = rejection(&input);
        assert_eq!(rejected.error, ParseError::LineTooLong);
        assert!(!rejected.error.keeps_connection());
        let mut get = b"get ".to_vec();
        for _ in 0..1000 {
            get.extend(b"k ");
        }
        assert_eq!(parse(&get), Ok(None), "long multi-get lines may continue");
        get.extend(b"\r\n");
        assert_eq!(keys_of(&get).len(), 1000);
    }

    #[test]
    fn the_line_limit_does_not_depend_on_how_the_line_is_split() {
        let mut line = vec![b' '; 3000];
        line.extend(b"get a\r\n");
        let whole = parse(&line).map(|r| r.map(|(req, n)| (req.command, n)));
        let first_part = parse(&line[..2100]);
        assert_eq!(whole.unwrap_err().error, ParseError::LineTooLong);
        assert_eq!(first_part.unwrap_err().error, ParseError::LineTooLong);
    }

    #[test]
    fn memcached_line_quirks_are_matched() {
        // Probed on memcached 1.6.18: each answered as commented.
        // `flush_all 1 2` -> OK: the second argument is ignored.
        let (request, _) = parse(b"flush_all 1 2\r\n").unwrap().unwrap();
        assert_eq!(request.arg.map(|a| a.of(b"flush_all 1 2")), Some(&b"1"[..]));
        assert!(!request.noreply);
        // `flush_all noreply 2` -> CLIENT_ERROR invalid exptime argument.
        assert_eq!(
            rejection(b"flush_all noreply 2\r\n").error,
            ParseError::InvalidExptime
        );
        // A NUL ends the line: `set k 0 0 1\0junk` stores 1 byte.
        let input = b"set k 0 0 1\0junk\r\nx\r\n";
        let (request, consumed) = parse(input).unwrap().unwrap();
        assert_eq!((request.command, consumed), (Command::Set, input.len()));
        assert_eq!(request.key(input, 0), b"k");
        // Lengths wrap at 32 bits: 4294967296 declares 0 bytes, ...298 two.
        let (_, consumed) = parse(b"set k 0 0 4294967296\r\n\r\n").unwrap().unwrap();
        assert_eq!(consumed, 24);
        let (_, consumed) = parse(b"set k 0 0 4294967298\r\nab\r\n").unwrap().unwrap();
        assert_eq!(consumed, 26);
    }

    #[test]
    fn a_nul_ends_a_lines_content_and_the_newline_still_ends_the_line() {
        let input = b"get a\0b c\r\nget d\r\n";
        let (request, consumed) = parse(input).unwrap().unwrap();
        assert_eq!(consumed, 11, "up to and with the newline after the NUL");
        assert_eq!(request.keys.len(), 1);
        assert_eq!(request.key(input, 0), b"a");
        // A NUL just before the CR, and a bare LF after a NUL.
        for input in [&b"get a\0\r\n"[..], b"get a\0\n"] {
            let (request, consumed) = parse(input).unwrap().unwrap();
            assert_eq!((request.keys.len(), consumed), (1, input.len()));
        }
        // A NUL with no newline yet: more bytes are needed.
        assert!(parse(b"get a\0b").unwrap().is_none());
        // A NUL at the start leaves no command.
        assert_eq!(rejection(b"\0get a\r\n").error, ParseError::UnknownCommand);
    }

    #[test]
    fn too_many_keys_are_refused_and_the_connection_kept() {
        let limits = Limits {
            max_keys_per_get: 3,
            ..Limits::default()
        };
        assert!(parse_request(b"get a b c\r\n", &limits).unwrap().is_some());
        let rejected = parse_request(b"get a b c d\r\n", &limits).unwrap_err();
        assert_eq!(rejected.error, ParseError::TooManyKeys);
        assert!(rejected.error.keeps_connection());
    }

    /// Every part of `line` fed whole, as the session takes them.
    fn long_get_parts(line: &[u8], limits: &Limits) -> Vec<(Vec<u8>, bool)> {
        let (mut at, mut head, mut parts) = (0, None::<Vec<u8>>, Vec::new());
        loop {
            match long_get_part(&line[at..], head.as_deref(), limits).unwrap() {
                LongGetPart::Part {
                    line: part,
                    consumed,
                    head: next,
                    last,
                } => {
                    parts.push((part, last));
                    at += consumed;
                    if last {
                        return parts;
                    }
                    head = Some(next);
                }
                other => panic!("{other:?} after {parts:?}"),
            }
        }
    }

    #[test]
    fn a_get_line_past_the_bound_is_cut_into_parts_at_whole_keys() {
        let limits = Limits {
            max_get_line_bytes: 16,
            max_keys_per_get: 3,
            ..Limits::default()
        };
        assert_eq!(
            long_get_part(b"get a b c\r\n", None, &limits),
            Ok(LongGetPart::Not)
        );
        assert_eq!(
            long_get_part(b"get aa bb cc dd", None, &limits),
            Ok(LongGetPart::Not),
            "not past the bound yet"
        );
        let parts = long_get_parts(b"gat 10 aa bb cc dd ee ff gg\r\n", &limits);
        let expected: Vec<(Vec<u8>, bool)> = vec![
            (b"gat 10 aa bb\r\n".to_vec(), false),
            (b"gat 10 cc dd\r\n".to_vec(), false),
            (b"gat 10 ee ff\r\n".to_vec(), false),
            (b"gat 10 gg\r\n".to_vec(), true),
        ];
        assert_eq!(parts, expected);
        // Each part is a line within the bound.
        assert!(parts.iter().all(|(part, _)| part.len() <= 16));
        // More keys than allowed on a short line: parts of at most 3 keys.
        let limits = Limits {
            max_keys_per_get: 3,
            ..Limits::default()
        };
        let parts = long_get_parts(b"get a b c d e f g\r\n", &limits);
        let expected: Vec<(Vec<u8>, bool)> = vec![
            (b"get a b c\r\n".to_vec(), false),
            (b"get d e f\r\n".to_vec(), false),
            (b"get g\r\n".to_vec(), true),
        ];
        assert_eq!(parts, expected);
        // A token no part can hold.
        let limits = Limits {
            max_get_line_bytes: 16,
            ..Limits::default()
        };
        assert_eq!(
            long_get_part(b"get aaaaaaaaaaaaaaaaaaaaaaa", None, &limits),
            Err(ParseError::LineTooLong)
        );
        // A line that is not a retrieval keeps its own bound.
        assert_eq!(
            long_get_part(&[b'x'; 100_000], None, &Limits::default()),
            Ok(LongGetPart::Not)
        );
    }

    #[test]
    fn an_unknown_command_ending_in_an_http_token_closes_without_a_reply() {
        // Probed on memcached 1.6.18: each of these closes without a word.
        for input in [
            &b"POST / HTTP/1.1\r\n"[..],
            b"GET / HTTP/1.1\n",
            b"HTTP/1.1\r\n",
            b"xx HTTP/\r\n",
            b"mget HTTP/1.1\r\n",
            b"x0 x1 x2 x3 x4 x5 x6 x7 x8 x9 x10 x11 x12 x13 x14 x15 x16 x17 x18 x19 x20 x21 HTTP/1.1\r\n",
        ] {
            let rejected = rejection(input);
            assert_eq!(rejected.error, ParseError::HttpRequest, "{input:?}");
            assert!(rejected.silent, "{input:?}");
            assert!(!rejected.error.keeps_connection());
        }
        // And each of these answers `ERROR` and reads on.
        for input in [
            &b"axx HTTP/1.1\r\n"[..],
            b"sxx HTTP/1.1\r\n",
            b"x HTTP/1.1\r\n",
            b"xx HTTP/1.1 noreply\r\n",
            b"xx http/1.1\r\n",
            b"lru_crawler HTTP/1.1\r\n",
            b"x0 x1 x2 x3 x4 x5 x6 x7 x8 x9 x10 x11 x12 x13 x14 x15 x16 x17 x18 x19 x20 x21 x22 HTTP/1.1\r\n",
        ] {
            let rejected = rejection(input);
            assert_eq!(rejected.error, ParseError::UnknownCommand, "{input:?}");
            assert!(!rejected.silent);
        }
        // A known command reads an `HTTP/` token as memcached does: a key.
        assert_eq!(
            keys_of(b"get k HTTP/1.1\r\n"),
            vec![b"k".to_vec(), b"HTTP/1.1".to_vec()]
        );
    }

    #[test]
    fn binary_protocol_is_refused_and_closes() {
        let rejected = rejection(b"\x80\x00\x00\x05\x00\x00\x00\x00");
        assert_eq!(rejected.error, ParseError::BinaryProtocol);
        assert!(!rejected.error.keeps_connection());
    }

    #[test]
    fn local_commands_parse() {
        for (input, command) in [
            (&b"version\r\n"[..], Command::Version),
            (b"version extra\r\n", Command::Version),
            (b"quit\r\n", Command::Quit),
            (b"stats\r\n", Command::Stats),
            (b"flush_all\r\n", Command::FlushAll),
            (b"flush_all 10 noreply\r\n", Command::FlushAll),
            (b"verbosity 1\r\n", Command::Verbosity),
        ] {
            assert_eq!(parse(input).unwrap().unwrap().0.command, command);
        }
    }
}
