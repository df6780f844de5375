//! Writes sent to a gutter pool (`failover`) keep at most `failover_ttl_s`:
//! the exptime of a request is rewritten before it goes there, so the
//! gutter's copies of a DEAD server's keys expire on their own soon after
//! the server is back. Pure: bytes in, bytes out; the caller parses the
//! result again, so the rewritten request passes every parser check.

use bytes::{Bytes, BytesMut};

use crate::protocol::Command;

/// memcached reads an exptime above this as a Unix time (protocol.txt,
/// "Expiration times").
const RELATIVE_EXPTIME_MAX_S: i64 = 60 * 60 * 24 * 30;

/// `exptime` with at most `ttl` seconds left, at Unix time `now`. Negative
/// (already expired) stays as it is; 0 (never) becomes `ttl`.
pub(crate) fn capped(exptime: i64, ttl: u64, now: u64) -> i64 {
    let ttl = ttl as i64;
    if exptime < 0 {
        return exptime;
    }
    if exptime == 0 {
        return ttl;
    }
    if exptime > RELATIVE_EXPTIME_MAX_S {
        let left = exptime - now as i64;
        return if left <= 0 { -1 } else { left.min(ttl) };
    }
    exptime.min(ttl)
}

/// The index of the exptime token of a classic command, if it has one.
fn exptime_token(command: Command) -> Option<usize> {
    match command {
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => Some(3),
        Command::Touch => Some(2),
        Command::Gat | Command::Gats => Some(1),
        _ => None,
    }
}

/// `bytes` (a command line of `line_len` bytes, then any data block) with
/// each token of the line passed through `token` (its index, its bytes,
/// where to write it) and `tail` written after the last; `None` when
/// `token` gives up on one, or the line has no line ending.
fn rewrite_line(
    bytes: &[u8],
    line_len: usize,
    mut token: impl FnMut(usize, &[u8], &mut BytesMut) -> Option<()>,
    tail: impl FnOnce(&mut BytesMut),
) -> Option<Bytes> {
    let (line, rest) = bytes.split_at(line_len.min(bytes.len()));
    let text = line
        .strip_suffix(b"\r\n")
        .or_else(|| line.strip_suffix(b"\n"))?;
    let mut out = BytesMut::with_capacity(bytes.len() + 12);
    for (i, t) in text
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .enumerate()
    {
        if i > 0 {
            out.extend_from_slice(b" ");
        }
        token(i, t, &mut out)?;
    }
    tail(&mut out);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(rest);
    Some(out.freeze())
}

/// The classic request `bytes` (command line of `line_len` bytes, then any
/// data block) with its exptime capped; `None` when it has none to cap.
pub(crate) fn cap_classic(
    command: Command,
    bytes: &[u8],
    line_len: usize,
    ttl: u64,
    now: u64,
) -> Option<Bytes> {
    let at = exptime_token(command)?;
    rewrite_line(
        bytes,
        line_len,
        |i, token, out| {
            if i == at {
                let exptime = std::str::from_utf8(token).ok()?.parse::<i64>().ok()?;
                out.extend_from_slice(capped(exptime, ttl, now).to_string().as_bytes());
            } else {
                out.extend_from_slice(token);
            }
            Some(())
        },
        |_| {},
    )
}

/// The meta request `bytes` with every `T` (TTL) and `N` (vivify TTL) flag
/// capped, and `ms` given a `T` when it has none; `None` when nothing
/// changes (`md`, or `mg`/`ma` that neither touch nor create).
pub(crate) fn cap_meta(
    command: Command,
    bytes: &[u8],
    line_len: usize,
    ttl: u64,
    now: u64,
) -> Option<Bytes> {
    if !matches!(
        command,
        Command::MetaSet | Command::MetaGet | Command::MetaArithmetic
    ) {
        return None;
    }
    // Both closures below read and set these.
    let changed = std::cell::Cell::new(false);
    let has_ttl = std::cell::Cell::new(false);
    // Flags follow the key (and, for `ms`, the data length).
    let first_flag = if command == Command::MetaSet { 3 } else { 2 };
    let rewritten = rewrite_line(
        bytes,
        line_len,
        |i, token, out| {
            let flag = token.first().copied();
            let value = std::str::from_utf8(&token[1.min(token.len())..])
                .ok()
                .and_then(|v| v.parse::<i64>().ok());
            match (i >= first_flag, flag, value) {
                (true, Some(flag @ (b'T' | b'N')), Some(value)) => {
                    has_ttl.set(has_ttl.get() || flag == b'T');
                    out.extend_from_slice(&[flag]);
                    out.extend_from_slice(capped(value, ttl, now).to_string().as_bytes());
                    changed.set(true);
                }
                _ => out.extend_from_slice(token),
            }
            Some(())
        },
        |out| {
            if command == Command::MetaSet && !has_ttl.get() {
                out.extend_from_slice(format!(" T{ttl}").as_bytes());
                changed.set(true);
            }
        },
    )?;
    changed.get().then_some(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn an_exptime_keeps_at_most_the_gutter_ttl() {
        assert_eq!(capped(0, 10, NOW), 10, "never expires: the gutter's ttl");
        assert_eq!(capped(5, 10, NOW), 5);
        assert_eq!(capped(3600, 10, NOW), 10);
        assert_eq!(capped(-1, 10, NOW), -1, "already expired stays so");
        assert_eq!(
            capped(NOW as i64 + 4, 10, NOW),
            4,
            "a Unix time is read as one"
        );
        assert_eq!(capped(NOW as i64 + 400, 10, NOW), 10);
        assert_eq!(capped(NOW as i64 - 4, 10, NOW), -1);
    }

    type Cap = fn(Command, &[u8], usize, u64, u64) -> Option<Bytes>;

    /// `request` through `cap` with a 10 s gutter; "" when it is left alone.
    fn rewritten(cap: Cap, command: Command, request: &[u8]) -> String {
        let line_len = memchr::memchr(b'\n', request).unwrap() + 1;
        cap(command, request, line_len, 10, NOW)
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .unwrap_or_default()
    }

    fn classic(command: Command, request: &[u8]) -> String {
        rewritten(cap_classic, command, request)
    }

    #[test]
    fn classic_writes_touches_and_gats_are_capped_and_keep_the_rest() {
        assert_eq!(
            classic(Command::Set, b"set k 5 0 2 noreply\r\nhi\r\n"),
            "set k 5 10 2 noreply\r\nhi\r\n"
        );
        assert_eq!(
            classic(Command::Cas, b"cas k 0 3600 2 77\r\nhi\r\n"),
            "cas k 0 10 2 77\r\nhi\r\n"
        );
        assert_eq!(classic(Command::Touch, b"touch k 0\r\n"), "touch k 10\r\n");
        assert_eq!(classic(Command::Gat, b"gat 60 a b\r\n"), "gat 10 a b\r\n");
        assert_eq!(classic(Command::Get, b"get a\r\n"), "");
        assert_eq!(classic(Command::Incr, b"incr a 1\r\n"), "");
    }

    fn meta(command: Command, request: &[u8]) -> String {
        rewritten(cap_meta, command, request)
    }

    #[test]
    fn meta_ttls_are_capped_and_a_set_without_one_gets_one() {
        assert_eq!(
            meta(Command::MetaSet, b"ms k 2 T0 F5\r\nhi\r\n"),
            "ms k 2 T10 F5\r\nhi\r\n"
        );
        assert_eq!(
            meta(Command::MetaSet, b"ms k 2 q\r\nhi\r\n"),
            "ms k 2 q T10\r\nhi\r\n"
        );
        assert_eq!(
            meta(Command::MetaGet, b"mg k v T90 N30\r\n"),
            "mg k v T10 N10\r\n"
        );
        assert_eq!(
            meta(Command::MetaGet, b"mg k v\r\n"),
            "",
            "a plain read is left alone"
        );
        assert_eq!(
            meta(Command::MetaArithmetic, b"ma k N0 J13\r\n"),
            "ma k N10 J13\r\n"
        );
        assert_eq!(meta(Command::MetaDelete, b"md k q\r\n"), "");
        // A key starting with T or N is not a flag.
        assert_eq!(
            meta(Command::MetaGet, b"mg T123 v T5\r\n"),
            "mg T123 v T5\r\n"
        );
    }
}
