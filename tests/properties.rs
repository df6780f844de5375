//! Property tests of the pure protocol and ring code (proptest).
//!
//! The encoder side here is a small model of each command: a model is written
//! out as protocol bytes and the parser must hand back exactly the model, in one
//! read or split across several. Arbitrary bytes must never panic the parser
//! nor yield results outside the input. Reply framing and the ring are checked
//! the same way. No I/O and no processes: this runs in plain `cargo test`.
//!
//! `PROPTEST_CASES=N` overrides every case count below, for a longer run:
//! `PROPTEST_CASES=20000 cargo test --release --test properties`.

use bytes::{Bytes, BytesMut};
use memring::protocol::encode::{forwardable, write_merged_values, write_sub_get};
use memring::protocol::reply::{MAX_REPLY_LINE_BYTES, MAX_REPLY_VALUE_BYTES};
use memring::protocol::request::is_valid_key;
use memring::protocol::{
    frame_reply, parse_request, Command, Limits, ParseError, Rejection, ReplyKind, Request,
    ValueBlocks, MAX_KEY_BYTES,
};
use memring::ring::{key_hash, Member, Ring, POINTS_PER_WEIGHT};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

/// `cases` unless `PROPTEST_CASES` is set, which then wins.
fn config(cases: u32) -> ProptestConfig {
    let default = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_some() {
        default
    } else {
        ProptestConfig { cases, ..default }
    }
}

// ---------------------------------------------------------------------------
// The command model and its serialiser.

/// One valid client command, as the fields a client chose.
#[derive(Debug, Clone)]
enum Model {
    /// `get|gets <key>+` and `gat|gats <exptime> <key>+`.
    Retrieval {
        command: Command,
        exptime: Option<i64>,
        keys: Vec<Vec<u8>>,
    },
    /// `set|add|replace|append|prepend|cas`.
    Storage {
        command: Command,
        key: Vec<u8>,
        flags: u32,
        exptime: i64,
        cas: Option<u64>,
        value: Vec<u8>,
        noreply: bool,
    },
    Delete {
        key: Vec<u8>,
        /// The legacy zero hold time memcached still accepts.
        hold_zero: bool,
        noreply: bool,
    },
    Arithmetic {
        command: Command,
        key: Vec<u8>,
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: Vec<u8>,
        exptime: i64,
        noreply: bool,
    },
    Verbosity {
        level: u64,
        noreply: bool,
    },
    FlushAll {
        delay: Option<i64>,
        noreply: bool,
    },
    /// `version`, `stats`, `quit`: no arguments.
    Bare(Command),
}

/// How a client spaced and ended its line; all of these are accepted by
/// memcached's tokenizer.
#[derive(Debug, Clone, Copy)]
struct Style {
    leading_spaces: usize,
    separator_spaces: usize,
    bare_newline: bool,
}

impl Default for Style {
    fn default() -> Self {
        Style {
            leading_spaces: 0,
            separator_spaces: 1,
            bare_newline: false,
        }
    }
}

/// A model written out, with where the parser must say its parts are.
#[derive(Debug, Clone)]
struct Wire {
    bytes: Vec<u8>,
    line_len: usize,
    args_end: usize,
}

fn number(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

impl Model {
    fn command(&self) -> Command {
        match self {
            Model::Retrieval { command, .. }
            | Model::Storage { command, .. }
            | Model::Arithmetic { command, .. } => *command,
            Model::Delete { .. } => Command::Delete,
            Model::Touch { .. } => Command::Touch,
            Model::Verbosity { .. } => Command::Verbosity,
            Model::FlushAll { .. } => Command::FlushAll,
            Model::Bare(command) => *command,
        }
    }

    fn keys(&self) -> Vec<Vec<u8>> {
        match self {
            Model::Retrieval { keys, .. } => keys.clone(),
            Model::Storage { key, .. }
            | Model::Delete { key, .. }
            | Model::Arithmetic { key, .. }
            | Model::Touch { key, .. } => vec![key.clone()],
            Model::Verbosity { .. } | Model::FlushAll { .. } | Model::Bare(_) => Vec::new(),
        }
    }

    fn noreply(&self) -> bool {
        match self {
            Model::Storage { noreply, .. }
            | Model::Delete { noreply, .. }
            | Model::Arithmetic { noreply, .. }
            | Model::Touch { noreply, .. }
            | Model::Verbosity { noreply, .. }
            | Model::FlushAll { noreply, .. } => *noreply,
            Model::Retrieval { .. } | Model::Bare(_) => false,
        }
    }

    /// The token the parser reports in `Request::arg`.
    fn arg(&self) -> Option<Vec<u8>> {
        match self {
            Model::Retrieval { exptime, .. } => exptime.map(number),
            Model::Verbosity { level, .. } => Some(number(level)),
            Model::FlushAll { delay, .. } => delay.map(number),
            _ => None,
        }
    }

    fn value(&self) -> Option<&[u8]> {
        match self {
            Model::Storage { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The line's tokens, without a trailing `noreply`.
    fn tokens(&self) -> Vec<Vec<u8>> {
        let mut tokens = vec![self.command().name().as_bytes().to_vec()];
        match self {
            Model::Retrieval { exptime, keys, .. } => {
                tokens.extend(exptime.map(number));
                tokens.extend(keys.iter().cloned());
            }
            Model::Storage {
                key,
                flags,
                exptime,
                cas,
                value,
                ..
            } => {
                tokens.extend([key.clone(), number(flags), number(exptime)]);
                tokens.push(number(value.len()));
                tokens.extend(cas.map(number));
            }
            Model::Delete { key, hold_zero, .. } => {
                tokens.push(key.clone());
                if *hold_zero {
                    tokens.push(b"0".to_vec());
                }
            }
            Model::Arithmetic { key, delta, .. } => tokens.extend([key.clone(), number(delta)]),
            Model::Touch { key, exptime, .. } => tokens.extend([key.clone(), number(exptime)]),
            Model::Verbosity { level, .. } => tokens.push(number(level)),
            Model::FlushAll { delay, .. } => tokens.extend(delay.map(number)),
            Model::Bare(_) => {}
        }
        tokens
    }

    fn serialise(&self, style: Style) -> Wire {
        let separator = vec![b' '; style.separator_spaces];
        let mut bytes = vec![b' '; style.leading_spaces];
        for (i, token) in self.tokens().iter().enumerate() {
            if i > 0 {
                bytes.extend(&separator);
            }
            bytes.extend(token);
        }
        let args_end = bytes.len();
        if self.noreply() {
            bytes.extend(&separator);
            bytes.extend(b"noreply");
        }
        bytes.extend(if style.bare_newline {
            &b"\n"[..]
        } else {
            b"\r\n"
        });
        let line_len = bytes.len();
        if let Some(value) = self.value() {
            bytes.extend(value);
            bytes.extend(b"\r\n");
        }
        Wire {
            bytes,
            line_len,
            args_end,
        }
    }
}

/// A byte memring accepts in a key: printable, not a space, not DEL.
fn key_byte() -> impl Strategy<Value = u8> {
    prop_oneof![0x21u8..=0x7e, 0x80u8..=0xff]
}

/// Mostly short keys, some at the 250-byte limit, and a few that look like
/// the `noreply` keyword or a number.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(key_byte(), 1..=12),
        2 => vec(key_byte(), (MAX_KEY_BYTES - 10)..=MAX_KEY_BYTES),
        1 => Just(b"noreply".to_vec()),
        1 => Just(b"0".to_vec()),
    ]
}

/// memcached's exptime is an `int32`-ish signed number; the parser takes any i64.
fn exptime() -> impl Strategy<Value = i64> {
    prop_oneof![4 => any::<i32>().prop_map(i64::from), 1 => any::<i64>()]
}

/// Binary values, often full of `\r` and `\n`, which must not end the block.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..200),
        vec(prop::sample::select(&b"\r\n\0 xEND"[..]), 0..40),
    ]
}

fn retrieval_command() -> impl Strategy<Value = Command> {
    prop::sample::select(vec![
        Command::Get,
        Command::Gets,
        Command::Gat,
        Command::Gats,
    ])
}

fn model_with(max_keys: usize, value: BoxedStrategy<Vec<u8>>) -> impl Strategy<Value = Model> {
    let storage_command = prop::sample::select(vec![
        Command::Set,
        Command::Add,
        Command::Replace,
        Command::Append,
        Command::Prepend,
        Command::Cas,
    ]);
    prop_oneof![
        3 => (retrieval_command(), exptime(), vec(key(), 1..=max_keys)).prop_map(
            |(command, exptime, keys)| Model::Retrieval {
                command,
                exptime: matches!(command, Command::Gat | Command::Gats).then_some(exptime),
                keys,
            }
        ),
        3 => (
            storage_command,
            key(),
            any::<u32>(),
            exptime(),
            any::<u64>(),
            value,
            any::<bool>()
        )
            .prop_map(|(command, key, flags, exptime, cas, value, noreply)| Model::Storage {
                command,
                key,
                flags,
                exptime,
                cas: (command == Command::Cas).then_some(cas),
                value,
                noreply,
            }),
        1 => (key(), any::<bool>(), any::<bool>()).prop_map(|(key, hold_zero, noreply)| {
            Model::Delete {
                key,
                hold_zero,
                noreply,
            }
        }),
        1 => (
            prop::sample::select(vec![Command::Incr, Command::Decr]),
            key(),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(|(command, key, delta, noreply)| Model::Arithmetic {
                command,
                key,
                delta,
                noreply,
            }),
        1 => (key(), exptime(), any::<bool>()).prop_map(|(key, exptime, noreply)| Model::Touch {
            key,
            exptime,
            noreply
        }),
        1 => (any::<u64>(), any::<bool>())
            .prop_map(|(level, noreply)| Model::Verbosity { level, noreply }),
        1 => (proptest::option::of(exptime()), any::<bool>())
            .prop_map(|(delay, noreply)| Model::FlushAll { delay, noreply }),
        1 => prop::sample::select(vec![Command::Version, Command::Stats, Command::Quit])
            .prop_map(Model::Bare),
    ]
}

fn model() -> impl Strategy<Value = Model> {
    model_with(20, value().boxed())
}

/// A model small enough to parse at every split point.
fn small_model() -> impl Strategy<Value = Model> {
    model_with(4, vec(any::<u8>(), 0..24).boxed())
}

fn style() -> impl Strategy<Value = Style> {
    prop_oneof![
        3 => Just(Style::default()),
        1 => (0usize..=2, 1usize..=3, any::<bool>()).prop_map(
            |(leading_spaces, separator_spaces, bare_newline)| Style {
                leading_spaces,
                separator_spaces,
                bare_newline,
            }
        ),
    ]
}

// ---------------------------------------------------------------------------
// Requests: round trips and splits.

fn parse(bytes: &[u8]) -> Result<Option<(Request, usize)>, Rejection> {
    parse_request(bytes, &Limits::default())
}

fn keys_of(request: &Request, bytes: &[u8]) -> Vec<Vec<u8>> {
    request.keys.iter().map(|k| k.of(bytes).to_vec()).collect()
}

/// Checks that `request`, parsed from `wire`, is exactly `model`.
fn assert_parsed_as(model: &Model, wire: &Wire, request: &Request, consumed: usize) {
    let bytes = &wire.bytes[..];
    assert_eq!(consumed, bytes.len(), "consumed the whole request");
    assert_eq!(request.command, model.command());
    assert_eq!(keys_of(request, bytes), model.keys());
    assert_eq!(request.noreply, model.noreply());
    assert_eq!(request.arg.map(|a| a.of(bytes).to_vec()), model.arg());
    assert_eq!(request.line_len as usize, wire.line_len);
    assert_eq!(
        &bytes[..request.args_end as usize],
        &bytes[..wire.args_end],
        "args_end stops before `noreply`"
    );
    if let Some(value) = model.value() {
        assert_eq!(&bytes[wire.line_len..consumed - 2], value, "data block");
    }
}

/// What a session records of one parsed request.
type Parsed = (Command, Vec<Vec<u8>>, usize);

/// Parses a buffer that holds only complete, valid requests, in one read.
fn parse_all(bytes: &[u8]) -> Vec<Parsed> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (request, n) = parse(&bytes[at..])
            .expect("valid request")
            .expect("complete request");
        out.push((request.command, keys_of(&request, &bytes[at..]), n));
        at += n;
    }
    out
}

/// Parses like a session: the read buffer grows by one piece at a time, and
/// `Ok(None)` means "read the next piece".
fn parse_in_pieces(pieces: &[&[u8]]) -> Vec<Parsed> {
    let mut out = Vec::new();
    let mut buffer = Vec::new();
    let mut pieces = pieces.iter();
    loop {
        match parse(&buffer).expect("valid request") {
            Some((request, n)) => {
                out.push((request.command, keys_of(&request, &buffer), n));
                buffer.drain(..n);
            }
            None => match pieces.next() {
                Some(piece) => buffer.extend_from_slice(piece),
                None => break,
            },
        }
    }
    assert!(buffer.is_empty(), "left over: {buffer:?}");
    out
}

fn concatenated(commands: &[(Model, Style)]) -> Vec<u8> {
    commands
        .iter()
        .flat_map(|(model, style)| model.serialise(*style).bytes)
        .collect()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn every_valid_command_survives_serialise_then_parse(model in model(), style in style()) {
        let wire = model.serialise(style);
        let (request, consumed) = parse(&wire.bytes).expect("valid").expect("complete");
        assert_parsed_as(&model, &wire, &request, consumed);
        for key in &model.keys() {
            prop_assert!(is_valid_key(key));
        }
    }

    #[test]
    fn bytes_after_a_request_do_not_change_its_parse(
        model in model(),
        style in style(),
        tail in vec(any::<u8>(), 0..64),
    ) {
        let wire = model.serialise(style);
        let mut bytes = wire.bytes.clone();
        bytes.extend(&tail);
        let (request, consumed) = parse(&bytes).expect("valid").expect("complete");
        assert_parsed_as(&model, &wire, &request, consumed);
    }

    #[test]
    fn forwardable_strips_only_noreply(model in model(), style in style()) {
        let wire = model.serialise(style);
        let bytes = Bytes::from(wire.bytes.clone());
        let (request, _) = parse(&bytes).expect("valid").expect("complete");
        let forwarded: Vec<u8> = forwardable(&bytes, &request).concat();
        if model.noreply() {
            let (again, consumed) = parse(&forwarded).expect("valid").expect("complete");
            prop_assert_eq!(consumed, forwarded.len());
            prop_assert!(!again.noreply);
            prop_assert_eq!(again.command, request.command);
            prop_assert_eq!(keys_of(&again, &forwarded), model.keys());
            if let Some(value) = model.value() {
                prop_assert_eq!(&forwarded[again.line_len as usize..consumed - 2], value);
            }
        } else {
            prop_assert_eq!(&forwarded[..], &wire.bytes[..]);
        }
    }

    #[test]
    fn every_strict_prefix_waits_and_every_split_parses_alike(
        model in small_model(),
        style in style(),
    ) {
        let wire = model.serialise(style);
        let bytes = &wire.bytes[..];
        for cut in 0..bytes.len() {
            prop_assert_eq!(parse(&bytes[..cut]), Ok(None), "prefix of {} bytes", cut);
        }
        let whole = parse_all(bytes);
        for cut in 0..=bytes.len() {
            prop_assert_eq!(&parse_in_pieces(&[&bytes[..cut], &bytes[cut..]]), &whole);
        }
    }

    #[test]
    fn two_way_split_of_a_pipeline_parses_like_one_read(
        commands in vec((model(), style()), 1..=8),
        split in any::<Index>(),
    ) {
        let bytes = concatenated(&commands);
        let whole = parse_all(&bytes);
        prop_assert_eq!(whole.len(), commands.len());
        for ((command, keys, _), (model, _)) in whole.iter().zip(&commands) {
            prop_assert_eq!(*command, model.command());
            prop_assert_eq!(keys, &model.keys());
        }
        let cut = split.index(bytes.len() + 1);
        prop_assert_eq!(parse_in_pieces(&[&bytes[..cut], &bytes[cut..]]), whole);
    }

    #[test]
    fn three_way_split_of_a_pipeline_parses_like_one_read(
        commands in vec((model(), style()), 1..=8),
        first in any::<Index>(),
        second in any::<Index>(),
    ) {
        let bytes = concatenated(&commands);
        let whole = parse_all(&bytes);
        let (mut a, mut b) = (first.index(bytes.len() + 1), second.index(bytes.len() + 1));
        if a > b {
            std::mem::swap(&mut a, &mut b);
        }
        let pieces = [&bytes[..a], &bytes[a..b], &bytes[b..]];
        prop_assert_eq!(parse_in_pieces(&pieces), whole);
    }

    #[test]
    fn sub_get_of_any_key_subset_parses_back_to_that_subset(
        command in retrieval_command(),
        exptime in exptime(),
        keys in vec(key(), 1..=20),
        picks in vec(any::<bool>(), 20),
    ) {
        let subset: Vec<&[u8]> = keys
            .iter()
            .zip(&picks)
            .filter(|(_, pick)| **pick)
            .map(|(key, _)| &key[..])
            .collect();
        prop_assume!(!subset.is_empty());
        let exptime = matches!(command, Command::Gat | Command::Gats)
            .then(|| number(exptime));
        let mut out = BytesMut::new();
        write_sub_get(&mut out, command, exptime.as_deref(), subset.iter().copied());
        let (request, consumed) = parse(&out).expect("valid").expect("complete");
        prop_assert_eq!(consumed, out.len());
        prop_assert_eq!(request.command, command);
        prop_assert_eq!(request.arg.map(|a| a.of(&out).to_vec()), exptime);
        let parsed: Vec<&[u8]> = request.keys.iter().map(|k| k.of(&out)).collect();
        prop_assert_eq!(parsed, subset);
    }
}

// ---------------------------------------------------------------------------
// Requests: arbitrary bytes.

fn small_limits() -> Limits {
    Limits {
        max_line_bytes: 48,
        max_get_line_bytes: 300,
        max_value_bytes: 16,
        max_keys_per_get: 64,
    }
}

fn starts_like_retrieval(buf: &[u8]) -> bool {
    let rest = &buf[buf.iter().position(|&b| b != b' ').unwrap_or(buf.len())..];
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|prefix| rest.starts_with(prefix))
}

fn line_bound(buf: &[u8], limits: &Limits) -> usize {
    if starts_like_retrieval(buf) {
        limits.max_get_line_bytes
    } else {
        limits.max_line_bytes
    }
}

/// The declared length of a storage command line, if `line` is one.
fn declared_length(line: &[u8]) -> Option<usize> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let tokens: Vec<&[u8]> = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    let storage = [
        &b"set"[..],
        b"add",
        b"replace",
        b"append",
        b"prepend",
        b"cas",
    ];
    if !storage.contains(tokens.first()?) {
        return None;
    }
    let declared: i64 = std::str::from_utf8(tokens.get(4)?).ok()?.parse().ok()?;
    usize::try_from(declared).ok()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Checks one parse step's result against `input`, and returns how many bytes
/// a session drops after it (0 for "need more bytes").
fn check_step(input: &[u8], limits: &Limits) -> usize {
    let bound = line_bound(input, limits);
    match parse_request(input, limits) {
        Ok(Some((request, n))) => {
            assert!(n > 0 && n <= input.len(), "consumed {n} of {}", input.len());
            let line_len = request.line_len as usize;
            assert!(line_len <= n && line_len <= bound + 1);
            assert_eq!(input[line_len - 1], b'\n');
            assert!((request.args_end as usize) < line_len);
            for span in request.keys.iter().chain(&request.arg) {
                assert!(span.start <= span.end && (span.end as usize) < line_len);
            }
            for span in &request.keys {
                let key = span.of(input);
                assert!(is_valid_key(key) && key.len() <= MAX_KEY_BYTES, "{key:?}");
            }
            if request.command.is_storage() {
                assert!(n - line_len - 2 <= limits.max_value_bytes);
                assert_eq!(&input[n - 2..n], b"\r\n");
            } else {
                assert_eq!(n, line_len);
            }
            if request.noreply {
                assert!(contains(&input[..line_len], b"noreply"));
            }
            n
        }
        Ok(None) => {
            match memchr_newline(input, bound) {
                None => assert!(input.len() <= bound, "unbounded line"),
                Some(newline) => {
                    let line = &input[..=newline];
                    let declared = declared_length(line)
                        .unwrap_or_else(|| panic!("Ok(None) after a complete line {line:?}"));
                    assert!(declared <= limits.max_value_bytes);
                    assert!(
                        input.len() < line.len() + declared + 2,
                        "block was complete"
                    );
                }
            }
            0
        }
        Err(rejection) => {
            let Rejection {
                error,
                consumed,
                discard,
                silent,
                stale_key,
            } = rejection;
            if let Some(stale) = stale_key {
                assert_eq!(error, ParseError::ValueTooLarge);
                assert!(stale.token.end as usize <= consumed);
            }
            assert!(consumed > 0 && consumed <= input.len(), "{rejection:?}");
            if error == ParseError::ValueTooLarge {
                assert!(discard > limits.max_value_bytes + 2);
            } else {
                assert_eq!(discard, 0, "{rejection:?}");
            }
            if error == ParseError::LineTooLong {
                assert_eq!(consumed, input.len());
                assert!(input.len() > bound);
                assert!(memchr_newline(input, bound).is_none());
            }
            if silent && error != ParseError::HttpRequest {
                assert!(contains(&input[..consumed], b"noreply"), "{rejection:?}");
            }
            if error == ParseError::HttpRequest {
                assert!(contains(&input[..consumed], b"HTTP/"), "{rejection:?}");
            }
            consumed.saturating_add(discard).min(input.len())
        }
    }
}

/// The first `\n` the parser may look at: within `bound + 1` bytes.
fn memchr_newline(input: &[u8], bound: usize) -> Option<usize> {
    input[..input.len().min(bound + 1)]
        .iter()
        .position(|&b| b == b'\n')
}

/// Runs a whole buffer through the parser as a session would, checking every
/// step; a session that stops making progress would loop here forever.
fn check_session(input: &[u8], limits: &Limits) {
    let mut at = 0;
    while at < input.len() {
        let dropped = check_step(&input[at..], limits);
        if dropped == 0 {
            break;
        }
        at += dropped;
    }
}

/// Bytes that look like a command line more often than random bytes do.
fn commandish() -> impl Strategy<Value = Vec<u8>> {
    let name = prop::sample::select(vec![
        "get",
        "gets",
        "gat",
        "gats",
        "set",
        "add",
        "replace",
        "append",
        "prepend",
        "cas",
        "delete",
        "incr",
        "decr",
        "touch",
        "version",
        "verbosity",
        "flush_all",
        "stats",
        "quit",
    ]);
    let atom = prop_oneof![
        4 => any::<u8>().prop_map(|b| vec![b]),
        3 => Just(b" ".to_vec()),
        2 => Just(b"\r\n".to_vec()),
        1 => Just(b"\n".to_vec()),
        2 => (0u64..40).prop_map(number),
        1 => any::<i64>().prop_map(number),
        1 => Just(b"noreply".to_vec()),
        1 => Just(b"0".to_vec()),
        1 => Just(b"-1".to_vec()),
        1 => Just(b"+".to_vec()),
        2 => vec(key_byte(), 1..12),
    ];
    (name, vec(atom, 0..40)).prop_map(|(name, atoms)| {
        let mut bytes = name.as_bytes().to_vec();
        bytes.push(b' ');
        bytes.extend(atoms.concat());
        bytes
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_bytes_never_panic_and_stay_in_bounds(input in vec(any::<u8>(), 0..600)) {
        check_session(&input, &Limits::default());
        check_session(&input, &small_limits());
    }

    #[test]
    fn command_like_bytes_never_panic_and_stay_in_bounds(
        lines in vec(commandish(), 1..6),
        tail in vec(any::<u8>(), 0..40),
    ) {
        let mut input = lines.concat();
        input.extend(tail);
        check_session(&input, &Limits::default());
        check_session(&input, &small_limits());
    }

    #[test]
    fn long_lines_are_refused_at_the_bound(
        name in prop::sample::select(vec!["get ", "set ", "", "  gets "]),
        filler in vec(key_byte(), 0..700),
    ) {
        let mut input = name.as_bytes().to_vec();
        input.extend(filler);
        check_session(&input, &small_limits());
    }
}

// ---------------------------------------------------------------------------
// Backend replies.

/// One `VALUE` block of a generated reply.
#[derive(Debug, Clone)]
struct Hit {
    key: Vec<u8>,
    flags: u32,
    cas: Option<u64>,
    data: Vec<u8>,
}

impl Hit {
    fn block(&self) -> Vec<u8> {
        let mut block = b"VALUE ".to_vec();
        block.extend(&self.key);
        block.extend(format!(" {} {}", self.flags, self.data.len()).bytes());
        if let Some(cas) = self.cas {
            block.extend(format!(" {cas}").bytes());
        }
        block.extend(b"\r\n");
        block.extend(&self.data);
        block.extend(b"\r\n");
        block
    }
}

fn hit() -> impl Strategy<Value = Hit> {
    let data = prop_oneof![
        vec(any::<u8>(), 0..48),
        vec(prop::sample::select(&b"\r\nEND VALUE"[..]), 0..24),
    ];
    (
        key(),
        any::<u32>(),
        proptest::option::of(any::<u64>()),
        data,
    )
        .prop_map(|(key, flags, cas, data)| Hit {
            key,
            flags,
            cas,
            data,
        })
}

/// How a retrieval reply ends: `END`, or an error line that replaced the rest.
fn reply_end() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => Just(b"END\r\n".to_vec()),
        1 => Just(b"SERVER_ERROR out of memory storing object\r\n".to_vec()),
        1 => Just(b"ERROR\r\n".to_vec()),
    ]
}

fn values_reply(hits: &[Hit], end: &[u8]) -> Vec<u8> {
    let mut reply: Vec<u8> = hits.iter().flat_map(Hit::block).collect();
    reply.extend(end);
    reply
}

/// A single-line reply: anything without a newline, then `\r\n`.
fn line_reply() -> impl Strategy<Value = Vec<u8>> {
    let byte = any::<u8>().prop_filter("no newline", |&b| b != b'\n');
    vec(byte, 0..200).prop_map(|mut line| {
        line.extend(b"\r\n");
        line
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn values_reply_frames_to_exactly_its_length(
        hits in vec(hit(), 0..6),
        end in reply_end(),
        tail in vec(any::<u8>(), 0..32),
    ) {
        let reply = values_reply(&hits, &end);
        prop_assert_eq!(frame_reply(&reply, ReplyKind::Values), Ok(Some(reply.len())));
        let mut longer = reply.clone();
        longer.extend(&tail);
        prop_assert_eq!(frame_reply(&longer, ReplyKind::Values), Ok(Some(reply.len())));
        for cut in 0..reply.len() {
            prop_assert_eq!(frame_reply(&reply[..cut], ReplyKind::Values), Ok(None), "cut {}", cut);
        }
    }

    #[test]
    fn value_blocks_yield_the_keys_and_blocks_in_order(
        hits in vec(hit(), 0..6),
        end in reply_end(),
    ) {
        let reply = values_reply(&hits, &end);
        let blocks: Vec<_> = ValueBlocks::new(&reply).collect();
        prop_assert_eq!(blocks.len(), hits.len());
        let mut at = 0;
        for (block, hit) in blocks.iter().zip(&hits) {
            prop_assert_eq!(block.block.start, at);
            prop_assert_eq!(&reply[block.key.clone()], &hit.key[..]);
            prop_assert_eq!(&reply[block.block.clone()], &hit.block()[..]);
            at = block.block.end;
        }
        prop_assert_eq!(&reply[at..], &end[..]);
    }

    #[test]
    fn line_reply_frames_to_exactly_its_length(
        line in line_reply(),
        tail in vec(any::<u8>(), 0..32),
    ) {
        let mut longer = line.clone();
        longer.extend(&tail);
        prop_assert_eq!(frame_reply(&longer, ReplyKind::Line), Ok(Some(line.len())));
        if !line.starts_with(b"VALUE ") {
            // Any line but a `VALUE` header also ends a retrieval reply.
            prop_assert_eq!(frame_reply(&longer, ReplyKind::Values), Ok(Some(line.len())));
        }
        for cut in 0..line.len() {
            prop_assert_eq!(frame_reply(&line[..cut], ReplyKind::Line), Ok(None));
        }
    }

    #[test]
    fn arbitrary_replies_frame_within_bounds(
        input in prop_oneof![
            vec(any::<u8>(), 0..400),
            vec(prop_oneof![
                3 => any::<u8>().prop_map(|b| vec![b]),
                2 => Just(b"VALUE ".to_vec()),
                2 => Just(b" ".to_vec()),
                2 => Just(b"\r\n".to_vec()),
                2 => (0u64..20).prop_map(number),
                1 => Just(b"END\r\n".to_vec()),
            ], 0..60).prop_map(|atoms| atoms.concat()),
        ],
    ) {
        for kind in [ReplyKind::Line, ReplyKind::Values] {
            if let Ok(Some(n)) = frame_reply(&input, kind) {
                prop_assert!(n > 0 && n <= input.len());
                prop_assert_eq!(input[n - 1], b'\n');
                for block in ValueBlocks::new(&input[..n]) {
                    prop_assert!(block.block.end <= n);
                    prop_assert!(block.key.start < block.key.end);
                    prop_assert!(block.key.end <= block.block.end);
                    prop_assert!(block.block.end - block.block.start
                        <= MAX_REPLY_LINE_BYTES + MAX_REPLY_VALUE_BYTES + 2);
                }
            }
        }
    }

    #[test]
    fn merged_reply_lists_the_hits_in_client_key_order(
        distinct in vec((hit(), 0usize..3, any::<bool>()), 1..8),
        order in vec(any::<Index>(), 1..16),
        failed in vec(any::<bool>(), 3),
    ) {
        // Each distinct key lives in one part (server) and is a hit or a miss
        // there, consistently for all its duplicates, as with a real memcached.
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<_> = distinct
            .into_iter()
            .filter(|(hit, _, _)| seen.insert(hit.key.clone()))
            .collect();
        let client: Vec<usize> = order.iter().map(|i| i.index(distinct.len())).collect();
        let mut parts: Vec<Option<Vec<u8>>> = (0..3)
            .map(|part| (!failed[part]).then(Vec::new))
            .collect();
        let mut expected = Vec::new();
        for &k in &client {
            let (hit, part, is_hit) = &distinct[k];
            if let (true, Some(reply)) = (*is_hit, parts[*part].as_mut()) {
                reply.extend(hit.block());
                expected.extend(hit.block());
            }
        }
        expected.extend(b"END\r\n");
        let parts: Vec<Option<Bytes>> = parts
            .into_iter()
            .map(|part| part.map(|mut reply| {
                reply.extend(b"END\r\n");
                Bytes::from(reply)
            }))
            .collect();
        let keys = client.iter().map(|&k| (&distinct[k].0.key[..], distinct[k].1));
        let mut out = BytesMut::new();
        write_merged_values(&mut out, keys, &parts);
        prop_assert_eq!(&out[..], &expected[..]);
    }
}

// ---------------------------------------------------------------------------
// The ring.

/// The ring's documented point naming: xxh3 of `"<identity>-<index>"`.
fn point_hash(identity: &str, index: u32) -> u64 {
    twox_hash::XxHash3_64::oneshot(format!("{identity}-{index}").as_bytes())
}

/// The owner by linear scan: the first point at or after the key's hash
/// (ties to the smaller identity), wrapping to the smallest point.
fn oracle_owner<'m>(members: &'m [Member], key: &[u8]) -> &'m str {
    let hash = key_hash(key);
    let points: Vec<(u64, &str)> = members
        .iter()
        .flat_map(|m| {
            (0..m.weight * POINTS_PER_WEIGHT).map(|i| (point_hash(&m.identity, i), &m.identity[..]))
        })
        .collect();
    let at_or_after = points.iter().filter(|(h, _)| *h >= hash).min();
    at_or_after
        .or_else(|| points.iter().min())
        .expect("a member")
        .1
}

fn members() -> impl Strategy<Value = Vec<Member>> {
    vec(("[a-z0-9.:-]{1,16}", 1u32..=3), 1..=5).prop_map(|list| {
        let mut seen = std::collections::HashSet::new();
        list.into_iter()
            .filter(|(identity, _)| seen.insert(identity.clone()))
            .map(|(identity, weight)| Member { identity, weight })
            .collect()
    })
}

fn owner_identity<'r>(ring: &'r Ring, key: &[u8]) -> &'r str {
    &ring.members()[ring.owner(key).expect("a non-empty ring")].identity
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn ring_owner_equals_a_linear_scan_oracle(
        members in members(),
        keys in vec(vec(any::<u8>(), 0..20), 1..16),
    ) {
        let ring = Ring::build(members.clone());
        prop_assert_eq!(ring.members(), &members[..]);
        for key in &keys {
            prop_assert_eq!(owner_identity(&ring, key), oracle_owner(&members, key));
        }
    }

    #[test]
    fn ring_owner_ignores_member_order_and_removal_moves_only_that_members_keys(
        members in members(),
        rotate in any::<Index>(),
        removed in any::<Index>(),
        keys in vec(vec(any::<u8>(), 0..20), 1..32),
    ) {
        let ring = Ring::build(members.clone());
        let mut rotated = members.clone();
        rotated.rotate_left(rotate.index(members.len()));
        let rotated = Ring::build(rotated);
        let mut fewer = members.clone();
        let gone = fewer.remove(removed.index(members.len()));
        let fewer = Ring::build(fewer);
        for key in &keys {
            let owner = owner_identity(&ring, key);
            prop_assert_eq!(owner_identity(&rotated, key), owner);
            if owner != gone.identity && !fewer.members().is_empty() {
                prop_assert_eq!(owner_identity(&fewer, key), owner);
            }
        }
    }
}
