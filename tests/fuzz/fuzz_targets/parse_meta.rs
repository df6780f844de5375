//! Fuzzes `parse_meta` with arbitrary bytes, request after request as a session
//! feeds them, and `frame_meta_reply` with the same bytes for every command.
//!
//! A parsed request must lie within the input and within the limits, its key
//! must be valid (and decode when `b` is set), its spans must stay inside its
//! line, and every strict prefix of it must wait for more bytes. A rejection
//! consumes 1..=input bytes and only an `ms` swallows more. A framed reply must
//! end with `\r\n` and its strict prefixes must wait.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memring::protocol::meta::reply::frame_meta_reply;
use memring::protocol::meta::{decode_key, parse_meta, MetaCommand};
use memring::protocol::ParseError;
use memring::protocol::request::is_valid_key;
use memring::protocol::{Limits, MAX_KEY_BYTES};

const SMALL: Limits = Limits {
    max_line_bytes: 64,
    max_get_line_bytes: 256,
    max_value_bytes: 64,
};

const COMMANDS: [MetaCommand; 6] = [
    MetaCommand::Get,
    MetaCommand::Set,
    MetaCommand::Delete,
    MetaCommand::Arithmetic,
    MetaCommand::Noop,
    MetaCommand::Debug,
];

fuzz_target!(|input: &[u8]| {
    session(input, &Limits::default());
    session(input, &SMALL);
    for command in COMMANDS {
        replies(input, command);
    }
});

/// Parses `input` to its end as a session would, checking every step.
fn session(input: &[u8], limits: &Limits) {
    let mut at = 0;
    while at < input.len() {
        let dropped = step(&input[at..], limits);
        if dropped == 0 {
            break;
        }
        at += dropped;
    }
}

/// Checks one parse and returns the bytes a session drops after it (0 for
/// "need more bytes").
fn step(input: &[u8], limits: &Limits) -> usize {
    match parse_meta(input, limits) {
        Ok(Some((request, n))) => {
            assert!(n > 0 && n <= input.len());
            assert_eq!(n, request.total_len as usize);
            let line_len = request.line_len as usize;
            assert!(line_len <= n && line_len <= limits.max_line_bytes + 1);
            assert_eq!(input[line_len - 1], b'\n');
            let spans = request
                .key
                .iter()
                .chain(&request.opaque)
                .chain([&request.flags]);
            for span in spans {
                assert!(span.start <= span.end && (span.end as usize) < line_len);
            }
            if let Some(key) = request.key {
                let token = key.of(input);
                assert!(is_valid_key(token) && token.len() <= MAX_KEY_BYTES);
                let routed = request.routing_key(input);
                if request.base64 {
                    assert_eq!(decode_key(token).as_deref(), Some(&*routed));
                } else {
                    assert_eq!(&*routed, token);
                }
            } else {
                assert_eq!(request.command, MetaCommand::Noop);
            }
            match request.data_len {
                Some(len) => {
                    assert_eq!(request.command, MetaCommand::Set);
                    assert!(len as usize <= limits.max_value_bytes);
                    assert_eq!(n, line_len + len as usize + 2);
                }
                None => assert_eq!(n, line_len),
            }
            if let Some(opaque) = request.opaque {
                assert_eq!(opaque.of(input)[0], b'O');
            }
            for cut in [1, n / 2, n - 1] {
                if cut < n {
                    assert_eq!(parse_meta(&input[..cut], limits), Ok(None), "cut at {cut}");
                }
            }
            n
        }
        Ok(None) => {
            // Only a line without its newline yet, or an `ms` whose data block
            // has not all arrived.
            let window = &input[..input.len().min(limits.max_line_bytes + 1)];
            if let Some(newline) = window.iter().position(|&b| b == b'\n') {
                let line = &input[..newline];
                let command = line.split(|&b| b == b' ').find(|t| !t.is_empty());
                assert_eq!(command, Some(&b"ms"[..]));
            } else {
                assert!(input.len() <= limits.max_line_bytes);
            }
            0
        }
        Err(rejection) => {
            assert!(rejection.consumed > 0 && rejection.consumed <= input.len());
            if rejection.discard > 0 {
                let command = input.split(|&b| b == b' ').find(|t| !t.is_empty());
                assert_eq!(command, Some(&b"ms"[..]));
                assert!(rejection.discard >= 2);
            }
            if rejection.error == ParseError::LineTooLong {
                assert!(input.len() > limits.max_line_bytes);
                assert!(!rejection.keeps_connection());
            }
            let reply = rejection.reply();
            assert!(reply.ends_with(b"\r\n"));
            rejection
                .consumed
                .saturating_add(rejection.discard)
                .min(input.len())
        }
    }
}

fn replies(input: &[u8], command: MetaCommand) {
    if let Ok(Some(reply)) = frame_meta_reply(input, command) {
        let n = reply.len;
        assert!(n >= 4 && n <= input.len());
        assert_eq!(&input[n - 2..n], b"\r\n");
        for cut in [0, n / 2, n - 1] {
            assert_eq!(
                frame_meta_reply(&input[..cut], command),
                Ok(None),
                "cut at {cut}"
            );
        }
    }
}
