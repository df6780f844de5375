//! Frames and checks one reply of the memcached text protocol (protocol.txt,
//! "Storage commands" and "Retrieval command") against the request it
//! answers. Pure: no I/O, no tokio.
//!
//! Three kinds of failure are kept apart, because they need different
//! handling by the caller:
//! - an error line (`ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`) is a
//!   complete reply: counted, and the connection stays in step;
//! - a well-framed but wrong reply (a value of the wrong key, length or
//!   content, keys out of order, `NOT_STORED`) is counted, and the
//!   connection stays in step;
//! - bytes that cannot be framed (`Desync`) leave the stream position
//!   unknown: the caller must drop the connection.

use crate::workload::{Expect, Key, ValueShape};

/// Longest reply line accepted before the stream is taken as out of step.
/// A `VALUE` header is at most ~300 bytes (250-byte key and three numbers).
const MAX_LINE_BYTES: usize = 4096;

/// The verdict on one complete reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `STORED` for a set.
    Stored,
    /// A get ended with `END`; `hits` values were returned and all were right.
    Got { hits: usize },
    /// `ERROR`, `CLIENT_ERROR ...` or `SERVER_ERROR ...`.
    ErrorReply,
    /// Well framed, but not the right answer.
    Wrong(Wrong),
}

/// Why a well-framed reply is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrong {
    /// A set answered `NOT_STORED`, `EXISTS` or `NOT_FOUND`.
    NotStored,
    /// A `VALUE` for a key not requested, or out of the request's key order.
    UnexpectedKey,
    /// A `VALUE` whose length or bytes are not those the key was set to.
    BadValue,
}

/// The reply cannot be framed: the connection is out of step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desync;

/// Frames the reply at the start of `buf` for `expect`; `keys` is the batch's
/// key list that `Expect::Get` indexes.
///
/// Returns `Ok(None)` when `buf` holds only part of the reply, else the
/// outcome and the number of bytes the reply took.
///
/// # Errors
/// `Desync` when the bytes are not a reply to `expect`.
pub fn parse_reply(
    buf: &[u8],
    expect: &Expect,
    keys: &[Key],
    value: &ValueShape,
) -> Result<Option<(Outcome, usize)>, Desync> {
    match expect {
        Expect::Set => {
            let Some((line, consumed)) = line_at(buf, 0)? else {
                return Ok(None);
            };
            let outcome = match line {
                b"STORED" => Outcome::Stored,
                b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND" => Outcome::Wrong(Wrong::NotStored),
                _ if is_error_line(line) => Outcome::ErrorReply,
                _ => return Err(Desync),
            };
            Ok(Some((outcome, consumed)))
        }
        Expect::Get { first, count } => {
            let wanted = keys.get(*first..*first + *count).ok_or(Desync)?;
            parse_get(buf, wanted, value)
        }
    }
}

fn parse_get(
    buf: &[u8],
    wanted: &[Key],
    value: &ValueShape,
) -> Result<Option<(Outcome, usize)>, Desync> {
    let mut pos = 0;
    let mut hits = 0;
    let mut next_key = 0;
    let mut wrong = None;
    loop {
        let Some((line, after_line)) = line_at(buf, pos)? else {
            return Ok(None);
        };
        if line == b"END" {
            let outcome = wrong.map_or(Outcome::Got { hits }, Outcome::Wrong);
            return Ok(Some((outcome, after_line)));
        }
        if is_error_line(line) {
            return Ok(Some((Outcome::ErrorReply, after_line)));
        }
        let header = line.strip_prefix(b"VALUE ").ok_or(Desync)?;
        let mut fields = header.split(|&b| b == b' ');
        let key = fields.next().filter(|k| !k.is_empty()).ok_or(Desync)?;
        let _flags = fields.next().and_then(parse_u64).ok_or(Desync)?;
        let bytes = fields.next().and_then(parse_u64).ok_or(Desync)?;
        let bytes = usize::try_from(bytes).map_err(|_| Desync)?;
        let data_end = after_line.checked_add(bytes).ok_or(Desync)?;
        if buf.len() < data_end + 2 {
            return Ok(None);
        }
        if &buf[data_end..data_end + 2] != b"\r\n" {
            return Err(Desync);
        }
        // Values must come in the request's key order (a subsequence of it:
        // misses are simply absent).
        match wanted[next_key..].iter().position(|k| k[..] == *key) {
            Some(offset) => {
                next_key += offset + 1;
                if value.matches(key, &buf[after_line..data_end]) {
                    hits += 1;
                } else {
                    wrong.get_or_insert(Wrong::BadValue);
                }
            }
            None => {
                wrong.get_or_insert(Wrong::UnexpectedKey);
            }
        }
        pos = data_end + 2;
    }
}

/// The line starting at `pos` (without its `\r\n`) and the offset after it.
fn line_at(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, Desync> {
    let rest = &buf[pos..];
    match rest.iter().position(|&b| b == b'\n') {
        Some(nl) if nl > MAX_LINE_BYTES => Err(Desync),
        Some(nl) if nl == 0 || rest[nl - 1] != b'\r' => Err(Desync),
        Some(nl) => Ok(Some((&rest[..nl - 1], pos + nl + 1))),
        None if rest.len() > MAX_LINE_BYTES => Err(Desync),
        None => Ok(None),
    }
}

fn is_error_line(line: &[u8]) -> bool {
    line.starts_with(b"ERROR")
        || line.starts_with(b"CLIENT_ERROR")
        || line.starts_with(b"SERVER_ERROR")
}

fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 19 {
        return None;
    }
    field.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::key_of;

    fn value_reply(id: u64, shape: &ValueShape) -> Vec<u8> {
        let key = key_of(id);
        let mut out = Vec::new();
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(&key);
        out.extend_from_slice(format!(" 0 {}\r\n", shape.size()).as_bytes());
        shape.write_value(&key, &mut out);
        out.extend_from_slice(b"\r\n");
        out
    }

    fn get_of(ids: &[u64]) -> (Vec<Key>, Expect) {
        let keys: Vec<Key> = ids.iter().map(|&id| key_of(id)).collect();
        let expect = Expect::Get {
            first: 0,
            count: keys.len(),
        };
        (keys, expect)
    }

    #[test]
    fn stored_and_error_lines_answer_a_set() {
        let shape = ValueShape::new(8);
        let parse = |b: &[u8]| parse_reply(b, &Expect::Set, &[], &shape);
        assert_eq!(parse(b"STORED\r\n"), Ok(Some((Outcome::Stored, 8))));
        assert_eq!(
            parse(b"SERVER_ERROR backend down\r\nSTORED\r\n"),
            Ok(Some((Outcome::ErrorReply, 27)))
        );
        assert_eq!(
            parse(b"NOT_STORED\r\n"),
            Ok(Some((Outcome::Wrong(Wrong::NotStored), 12)))
        );
        assert_eq!(parse(b"STOR"), Ok(None));
        assert_eq!(parse(b"HELLO\r\n"), Err(Desync));
        assert_eq!(parse(b"STORED\n"), Err(Desync));
    }

    #[test]
    fn multi_get_with_a_miss_counts_the_hits() {
        let shape = ValueShape::new(32);
        let (keys, expect) = get_of(&[1, 2, 3]);
        let mut reply = value_reply(1, &shape);
        reply.extend(value_reply(3, &shape));
        reply.extend_from_slice(b"END\r\n");
        assert_eq!(
            parse_reply(&reply, &expect, &keys, &shape),
            Ok(Some((Outcome::Got { hits: 2 }, reply.len())))
        );
    }

    #[test]
    fn every_prefix_of_a_reply_is_incomplete() {
        let shape = ValueShape::new(100);
        let (keys, expect) = get_of(&[5, 6]);
        let mut reply = value_reply(5, &shape);
        reply.extend(value_reply(6, &shape));
        reply.extend_from_slice(b"END\r\n");
        for cut in 0..reply.len() {
            assert_eq!(
                parse_reply(&reply[..cut], &expect, &keys, &shape),
                Ok(None),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn values_out_of_key_order_are_wrong() {
        let shape = ValueShape::new(16);
        let (keys, expect) = get_of(&[1, 2]);
        let mut reply = value_reply(2, &shape);
        reply.extend(value_reply(1, &shape));
        reply.extend_from_slice(b"END\r\n");
        assert_eq!(
            parse_reply(&reply, &expect, &keys, &shape),
            Ok(Some((Outcome::Wrong(Wrong::UnexpectedKey), reply.len())))
        );
    }

    #[test]
    fn a_value_of_another_key_is_a_bad_value() {
        let shape = ValueShape::new(40);
        let (keys, expect) = get_of(&[1]);
        let mut reply = value_reply(9, &shape);
        let at = reply.iter().position(|&b| b == b'\n').unwrap() + 1;
        // Header names key 1, data is key 9's.
        reply.splice(..at, b"VALUE key:000000000001 0 40\r\n".to_vec());
        reply.extend_from_slice(b"END\r\n");
        assert_eq!(
            parse_reply(&reply, &expect, &keys, &shape),
            Ok(Some((Outcome::Wrong(Wrong::BadValue), reply.len())))
        );
    }

    #[test]
    fn a_value_of_the_wrong_length_is_a_bad_value_but_framed() {
        let shape = ValueShape::new(40);
        let (keys, expect) = get_of(&[1]);
        let reply = b"VALUE key:000000000001 0 3\r\nabc\r\nEND\r\nSTORED\r\n";
        assert_eq!(
            parse_reply(reply, &expect, &keys, &shape),
            Ok(Some((Outcome::Wrong(Wrong::BadValue), reply.len() - 8)))
        );
    }

    #[test]
    fn an_error_line_ends_a_get() {
        let shape = ValueShape::new(16);
        let (keys, expect) = get_of(&[1]);
        assert_eq!(
            parse_reply(b"SERVER_ERROR timeout\r\n", &expect, &keys, &shape),
            Ok(Some((Outcome::ErrorReply, 22)))
        );
    }

    #[test]
    fn garbage_after_a_value_is_a_desync() {
        let shape = ValueShape::new(16);
        let (keys, expect) = get_of(&[1]);
        let mut reply = value_reply(1, &shape);
        reply.extend_from_slice(b"STORED\r\n");
        assert_eq!(parse_reply(&reply, &expect, &keys, &shape), Err(Desync));
        let long = vec![b'x'; MAX_LINE_BYTES + 1];
        assert_eq!(parse_reply(&long, &expect, &keys, &shape), Err(Desync));
    }
}
