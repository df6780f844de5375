//! Fuzzes `parse_request` with arbitrary bytes, as a session would feed them.
//!
//! Every input is parsed request after request, with the default limits and with
//! small ones that make the line and value bounds easy to reach. Each step must
//! stay within the input and within the limits; a complete request must also
//! parse the same when only a prefix of it has arrived (`Ok(None)` then).

#![no_main]

use libfuzzer_sys::fuzz_target;
use memring::protocol::request::is_valid_key;
use memring::protocol::{parse_request, Limits, ParseError, MAX_KEY_BYTES};

const SMALL: Limits = Limits {
    max_line_bytes: 64,
    max_get_line_bytes: 256,
    max_value_bytes: 64,
};

fuzz_target!(|input: &[u8]| {
    session(input, &Limits::default());
    session(input, &SMALL);
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
    let bound = line_bound(input, limits);
    match parse_request(input, limits) {
        Ok(Some((request, n))) => {
            assert!(n > 0 && n <= input.len());
            let line_len = request.line_len as usize;
            assert!(line_len <= n && line_len <= bound + 1);
            assert_eq!(input[line_len - 1], b'\n');
            assert!((request.args_end as usize) < line_len);
            for span in request.keys.iter().chain(&request.arg) {
                assert!(span.start <= span.end && (span.end as usize) < line_len);
            }
            for span in &request.keys {
                let key = span.of(input);
                assert!(is_valid_key(key) && key.len() <= MAX_KEY_BYTES);
            }
            if request.command.is_storage() {
                assert!(n - line_len - 2 <= limits.max_value_bytes);
                assert_eq!(&input[n - 2..n], b"\r\n");
            } else {
                assert_eq!(n, line_len);
            }
            prefixes_wait(input, n, limits);
            n
        }
        Ok(None) => {
            // Only a line without its newline yet, or a storage command whose
            // data block has not all arrived.
            if let Some(newline) = newline_within(input, bound) {
                let line = &input[..=newline];
                let command = line.split(|&b| b == b' ').find(|t| !t.is_empty());
                assert!(matches!(
                    command,
                    Some(b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas")
                ));
            } else {
                assert!(input.len() <= bound);
            }
            0
        }
        Err(rejection) => {
            assert!(rejection.consumed > 0 && rejection.consumed <= input.len());
            if rejection.error == ParseError::ValueTooLarge {
                assert!(rejection.discard > limits.max_value_bytes + 2);
            } else {
                assert_eq!(rejection.discard, 0);
            }
            if rejection.error == ParseError::LineTooLong {
                assert!(input.len() > bound && newline_within(input, bound).is_none());
            }
            rejection
                .consumed
                .saturating_add(rejection.discard)
                .min(input.len())
        }
    }
}

/// A request that parses in full must wait (`Ok(None)`) on any strict prefix,
/// so that how the bytes were split across reads cannot change the result.
fn prefixes_wait(input: &[u8], n: usize, limits: &Limits) {
    for cut in [1, n / 2, n - 1] {
        if cut < n {
            assert_eq!(
                parse_request(&input[..cut], limits),
                Ok(None),
                "cut at {cut}"
            );
        }
    }
}

fn line_bound(input: &[u8], limits: &Limits) -> usize {
    // Only a retrieval prefix within the first `max_line_bytes` bytes counts,
    // so that the limit cannot depend on how the line was split.
    let window = &input[..input.len().min(limits.max_line_bytes)];
    let first = window.iter().position(|&b| b != b' ').unwrap_or(window.len());
    let rest = &window[first..];
    let retrieval = [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|prefix| rest.starts_with(prefix));
    if retrieval {
        limits.max_get_line_bytes
    } else {
        limits.max_line_bytes
    }
}

/// The first `\n` the parser may look at: within `bound + 1` bytes.
fn newline_within(input: &[u8], bound: usize) -> Option<usize> {
    input[..input.len().min(bound + 1)]
        .iter()
        .position(|&b| b == b'\n')
}
