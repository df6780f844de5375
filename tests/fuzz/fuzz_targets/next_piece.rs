//! Fuzzes the strict reply framer (`next_piece`) with arbitrary bytes against
//! the expectation of every kind of request memring forwards: each one-line
//! kind, retrievals of a few keys with and without cas, `stats settings`, and
//! every meta command, quiet or not.
//!
//! Whatever the bytes, framing never panics, every piece lies within the
//! input, a `VALUE` piece holds one of the keys asked for (in order), its data
//! length is within the limit, and a reply's last piece ends at a newline.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use memring::protocol::meta::MetaCommand;
use memring::protocol::{Expect, LineKind, Piece};

const MAX_VALUE: usize = 64;

fn expectations() -> Vec<Expect> {
    let mut all: Vec<Expect> = [
        LineKind::Storage,
        LineKind::Delete,
        LineKind::Arithmetic,
        LineKind::Touch,
        LineKind::Ok,
        LineKind::Version,
    ]
    .into_iter()
    .map(Expect::Line)
    .collect();
    for line in [
        &b"get a b a\r\n"[..],
        b"gets a\r\n",
        b"gat 10 a b\r\n",
        b"gats 0 k\r\n",
    ] {
        all.push(Expect::values(Bytes::from_static(line)));
    }
    all.push(Expect::Stats);
    for command in [
        MetaCommand::Get,
        MetaCommand::Set,
        MetaCommand::Delete,
        MetaCommand::Arithmetic,
        MetaCommand::Noop,
        MetaCommand::Debug,
    ] {
        for quiet in [false, true] {
            all.push(Expect::meta(command, quiet));
        }
    }
    all
}

fuzz_target!(|input: &[u8]| {
    for mut expect in expectations() {
        let keys: Option<Vec<Vec<u8>>> = match &expect {
            Expect::Values { request, .. } => Some(
                request
                    .split(|&b| b == b' ' || b == b'\r' || b == b'\n')
                    .filter(|t| !t.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect(),
            ),
            _ => None,
        };
        let mut at = 0;
        // Every piece consumes at least one byte, so this ends.
        while at < input.len() {
            let rest = &input[at..];
            let piece = match memring::protocol::reply::next_piece(rest, &mut expect, MAX_VALUE) {
                Ok(Some(piece)) => piece,
                Ok(None) | Err(_) => break,
            };
            let len = match &piece {
                Piece::Value { len, key, data } => {
                    assert!(*data <= MAX_VALUE);
                    if let Some(keys) = &keys {
                        assert!(key.end <= *len);
                        assert!(keys.iter().any(|k| k.as_slice() == &rest[key.clone()]));
                    }
                    *len
                }
                Piece::Last { len } | Piece::Error { len } => *len,
            };
            assert!(len > 0 && len <= rest.len());
            assert_eq!(rest[len - 1], b'\n');
            at += len;
            if !matches!(piece, Piece::Value { .. }) {
                break;
            }
        }
    }
});
