//! Backend reply framing for meta commands: how many bytes of a buffer form one
//! complete reply to a given [`MetaCommand`], which status it carries, and
//! which statuses the `q` flag makes memcached leave out.
//!
//! Pure: no I/O. Anything memcached 1.6.18 would not send to that command is an
//! error, so a connection that fell out of step is noticed and dropped.

use memchr::memchr;

use super::MetaCommand;
use crate::protocol::outcome::Outcome;
use crate::protocol::{MAX_REPLY_LINE_BYTES, MAX_REPLY_VALUE_BYTES};

/// The status code a meta reply starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaStatus {
    /// `HD`: success without a value.
    Hd,
    /// `VA <size>`: success with a value block.
    Va,
    /// `EN`: miss (`mg`, `me`).
    En,
    /// `NS`: not stored.
    Ns,
    /// `EX`: cas mismatch.
    Ex,
    /// `NF`: not found.
    Nf,
    /// `MN`: the answer to `mn`.
    Mn,
    /// `ME <key> <details>`: the answer to `me` on a hit.
    Me,
    /// `ERROR`.
    Error,
    /// `CLIENT_ERROR <message>`.
    ClientError,
    /// `SERVER_ERROR <message>`.
    ServerError,
}

impl MetaStatus {
    /// An error line, which `q` never suppresses.
    pub fn is_error(self) -> bool {
        matches!(
            self,
            MetaStatus::Error | MetaStatus::ClientError | MetaStatus::ServerError
        )
    }
}

/// One complete reply at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaReply {
    pub status: MetaStatus,
    /// Bytes of the reply: its line, plus for `VA` the value and its `\r\n`.
    pub len: usize,
}

/// A backend sent something that is not a memcached reply to this command. The
/// connection can no longer be trusted to be in step and must be dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MetaReplyError {
    #[error("meta reply line longer than {MAX_REPLY_LINE_BYTES} bytes")]
    LineTooLong,
    #[error("meta reply line not ending in CRLF")]
    BadLineEnd,
    #[error("malformed VA line")]
    BadValueLine,
    #[error("meta value block not followed by CRLF")]
    BadDataChunk,
    #[error("reply memcached does not send to this meta command")]
    Unexpected,
    /// The reply does not carry the opaque memring tagged its request with:
    /// it answers some other request (see [`super::tag`]).
    #[error("meta reply without its request's opaque (another request's reply)")]
    Foreign,
}

/// Frames the reply to a `command` at the start of `buf`: `Ok(Some(reply))`
/// when complete, `Ok(None)` when more bytes are needed.
///
/// # Errors
/// A reply that cannot be framed or that memcached never sends to `command`
/// (see [`MetaReplyError`]).
pub fn frame_meta_reply(
    buf: &[u8],
    command: MetaCommand,
) -> Result<Option<MetaReply>, MetaReplyError> {
    let window = &buf[..buf.len().min(MAX_REPLY_LINE_BYTES)];
    let Some(newline) = memchr(b'\n', window) else {
        return if buf.len() >= MAX_REPLY_LINE_BYTES {
            Err(MetaReplyError::LineTooLong)
        } else {
            Ok(None)
        };
    };
    let line_len = newline + 1;
    let line = buf[..line_len]
        .strip_suffix(b"\r\n")
        .ok_or(MetaReplyError::BadLineEnd)?;
    let status = status_of(line).ok_or(MetaReplyError::Unexpected)?;
    if !expected(command, status) {
        return Err(MetaReplyError::Unexpected);
    }
    if status != MetaStatus::Va {
        return Ok(Some(MetaReply {
            status,
            len: line_len,
        }));
    }
    let size = value_size(line).ok_or(MetaReplyError::BadValueLine)?;
    let total = line_len + size + 2;
    if buf.len() < total {
        return Ok(None);
    }
    if &buf[total - 2..total] != b"\r\n" {
        return Err(MetaReplyError::BadDataChunk);
    }
    Ok(Some(MetaReply { status, len: total }))
}

/// Whether memcached 1.6.18 leaves out a reply with this status when the
/// request carried `q`: `EN` for `mg`, `HD` for `ms` and `md`, a success (`HD`
/// or `VA`) for `ma`. `NF`, `NS`, `EX`, errors, `MN` and `me`'s replies always
/// come.
///
/// One quirk: an `ma` with `N` that creates the missing counter answers `HD`
/// (or `VA`) even with `q`; only an update of an existing counter is silent. A
/// proxy that removes `q` and suppresses replies itself cannot tell the two
/// apart from the reply, so it should leave `q` on such requests.
pub fn suppressed_by_quiet(command: MetaCommand, status: MetaStatus) -> bool {
    match command {
        MetaCommand::Get => status == MetaStatus::En,
        MetaCommand::Set | MetaCommand::Delete => status == MetaStatus::Hd,
        MetaCommand::Arithmetic => matches!(status, MetaStatus::Hd | MetaStatus::Va),
        MetaCommand::Noop | MetaCommand::Debug => false,
    }
}

/// The status a reply line starts with: a two-letter code alone or followed by
/// a space, `ERROR` alone, or an error word followed by a message.
fn status_of(line: &[u8]) -> Option<MetaStatus> {
    let code_end = memchr(b' ', line).unwrap_or(line.len());
    let has_rest = code_end < line.len();
    let status = match &line[..code_end] {
        b"HD" => MetaStatus::Hd,
        b"VA" => MetaStatus::Va,
        b"EN" => MetaStatus::En,
        b"NS" => MetaStatus::Ns,
        b"EX" => MetaStatus::Ex,
        b"NF" => MetaStatus::Nf,
        b"MN" if !has_rest => MetaStatus::Mn,
        b"ME" if has_rest => MetaStatus::Me,
        b"ERROR" if !has_rest => MetaStatus::Error,
        b"CLIENT_ERROR" if has_rest => MetaStatus::ClientError,
        b"SERVER_ERROR" if has_rest => MetaStatus::ServerError,
        _ => return None,
    };
    Some(status)
}

/// Which statuses memcached 1.6.18 sends to each command (errors to all).
fn expected(command: MetaCommand, status: MetaStatus) -> bool {
    use MetaStatus::*;
    if status.is_error() {
        return true;
    }
    match command {
        MetaCommand::Get => matches!(status, Hd | Va | En),
        MetaCommand::Set => matches!(status, Hd | Ns | Ex | Nf),
        MetaCommand::Delete => matches!(status, Hd | Nf | Ex),
        MetaCommand::Arithmetic => matches!(status, Hd | Va | Nf | Ns | Ex),
        MetaCommand::Noop => status == Mn,
        MetaCommand::Debug => matches!(status, Me | En),
    }
}

/// The `<size>` of `VA <size> <flags>*`: decimal digits, at most the largest
/// value memcached can hold.
pub(crate) fn value_size(line: &[u8]) -> Option<usize> {
    let rest = line.strip_prefix(b"VA ")?;
    let digits = &rest[..memchr(b' ', rest).unwrap_or(rest.len())];
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let size = digits
        .iter()
        .fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
    (size <= MAX_REPLY_VALUE_BYTES).then_some(size)
}

/// Whether a meta reply (as the session got it) says the key is not on the
/// server: `NF` for `ma`, `NS` for `ms`, a miss for `mg`.
pub(crate) fn meta_absent(command: MetaCommand, reply: &[u8]) -> bool {
    match command {
        MetaCommand::Arithmetic => Outcome::of(reply) == Outcome::Nf,
        MetaCommand::Set => Outcome::of(reply) == Outcome::Ns,
        MetaCommand::Get => Outcome::of(reply).meta_miss(),
        _ => false,
    }
}

/// Whether an `mg` reply carries `W`: it won a stale (or vivified) item's
/// recache token.
pub(crate) fn won_recache_token(reply: &[u8]) -> bool {
    let line = reply.strip_suffix(b"\r\n").unwrap_or(reply);
    let header = &line[..memchr(b'\r', line).unwrap_or(line.len())];
    header
        .split(|&b| b == b' ')
        .skip(1)
        .any(|token| token == b"W")
}

/// The number of the `c` (cas) flag of a meta reply line (`HD c123 …`).
pub(crate) fn returned_cas(reply: &[u8]) -> Option<u64> {
    let line = reply.strip_suffix(b"\r\n").unwrap_or(reply);
    let token = line
        .split(|&b| b == b' ')
        .skip(1)
        .find(|t| t.first() == Some(&b'c'))?;
    std::str::from_utf8(&token[1..]).ok()?.parse().ok()
}

/// A meta reply line without its `c` flag (the cas memring asked for
/// itself, which the client did not).
pub(crate) fn without_cas(reply: &bytes::Bytes) -> bytes::Bytes {
    let line = reply.strip_suffix(b"\r\n").unwrap_or(reply);
    let mut tokens = line.split(|&b| b == b' ');
    let mut out = bytes::BytesMut::with_capacity(reply.len());
    out.extend_from_slice(tokens.next().unwrap_or_default());
    for token in tokens.filter(|t| t.first() != Some(&b'c')) {
        out.extend_from_slice(b" ");
        out.extend_from_slice(token);
    }
    out.extend_from_slice(b"\r\n");
    out.freeze()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cas_memring_asked_for_is_read_and_left_out() {
        assert_eq!(super::returned_cas(b"HD c12 O5 kk\r\n"), Some(12));
        assert_eq!(super::returned_cas(b"NS O5\r\n"), None);
        let reply = bytes::Bytes::from_static(b"NS c0 O6 kk\r\n");
        assert_eq!(&super::without_cas(&reply)[..], b"NS O6 kk\r\n");
        let reply = bytes::Bytes::from_static(b"HD c3\r\n");
        assert_eq!(&super::without_cas(&reply)[..], b"HD\r\n");
    }

    #[test]
    fn meta_absence_is_per_command() {
        use MetaCommand::{Arithmetic, Delete, Get, Set};
        assert!(meta_absent(Arithmetic, b"NF\r\n"));
        assert!(!meta_absent(Arithmetic, b"HD\r\n"));
        assert!(meta_absent(Set, b"NS\r\n"));
        assert!(!meta_absent(Set, b"HD\r\n"));
        assert!(meta_absent(Get, b"EN\r\n"));
        assert!(meta_absent(Get, b""), "a miss q suppressed");
        assert!(!meta_absent(Get, b"VA 1\r\nx\r\n"));
        assert!(
            !meta_absent(Delete, b"NF\r\n"),
            "md is handed off on its own"
        );
    }
    use super::*;

    fn frame(buf: &[u8], command: MetaCommand) -> Result<Option<MetaReply>, MetaReplyError> {
        frame_meta_reply(buf, command)
    }

    fn framed(buf: &[u8], command: MetaCommand) -> (MetaStatus, usize) {
        let reply = frame(buf, command).unwrap().unwrap();
        (reply.status, reply.len)
    }

    #[test]
    fn status_lines_frame_at_their_newline_with_or_without_flags() {
        // Replies as memcached 1.6.18 sent them in the probes of the request
        // tests (see ../meta.rs) and of tests/integration/meta_protocol.rs.
        for (reply, command, status) in [
            (&b"HD\r\n"[..], MetaCommand::Set, MetaStatus::Hd),
            (b"HD c20 t30 W\r\n", MetaCommand::Get, MetaStatus::Hd),
            (b"EN\r\n", MetaCommand::Get, MetaStatus::En),
            (b"EN Oabc kZm9v b\r\n", MetaCommand::Get, MetaStatus::En),
            (b"NS\r\n", MetaCommand::Set, MetaStatus::Ns),
            (b"EX\r\n", MetaCommand::Delete, MetaStatus::Ex),
            (b"NF O1\r\n", MetaCommand::Arithmetic, MetaStatus::Nf),
            (b"MN\r\n", MetaCommand::Noop, MetaStatus::Mn),
            (
                b"ME foo exp=-1 la=0 cas=2 fetch=yes cls=1 size=64\r\n",
                MetaCommand::Debug,
                MetaStatus::Me,
            ),
            (b"EN\r\n", MetaCommand::Debug, MetaStatus::En),
            (b"ERROR\r\n", MetaCommand::Get, MetaStatus::Error),
            (
                b"CLIENT_ERROR invalid flag\r\n",
                MetaCommand::Delete,
                MetaStatus::ClientError,
            ),
            (
                b"SERVER_ERROR out of memory\r\n",
                MetaCommand::Noop,
                MetaStatus::ServerError,
            ),
        ] {
            let mut buf = reply.to_vec();
            buf.extend(b"HD\r\n");
            assert_eq!(framed(&buf, command), (status, reply.len()), "{reply:?}");
        }
    }

    #[test]
    fn va_frames_its_value_by_size_even_with_crlf_inside() {
        let reply = b"VA 4 c2 s4\r\na\r\nb\r\nMN\r\n";
        assert_eq!(framed(reply, MetaCommand::Get), (MetaStatus::Va, 18));
        // memcached's `ma ... v` answers the number as a value.
        let reply = b"VA 20\r\n18446744073709551615\r\n";
        assert_eq!(
            framed(reply, MetaCommand::Arithmetic),
            (MetaStatus::Va, reply.len())
        );
        assert_eq!(framed(b"VA 0 W\r\n\r\n", MetaCommand::Get).1, 10);
    }

    #[test]
    fn every_prefix_of_a_reply_is_incomplete() {
        for (reply, command) in [
            (&b"VA 3 kfoo\r\nx\r\n\r\n"[..], MetaCommand::Get),
            (b"HD c5\r\n", MetaCommand::Set),
            (b"MN\r\n", MetaCommand::Noop),
        ] {
            for cut in 0..reply.len() {
                assert_eq!(frame(&reply[..cut], command), Ok(None), "{reply:?} {cut}");
            }
            assert_eq!(frame(reply, command).unwrap().unwrap().len, reply.len());
        }
    }

    #[test]
    fn replies_memcached_never_sends_to_the_command_are_errors() {
        for (reply, command) in [
            (&b"VA 1\r\nx\r\n"[..], MetaCommand::Delete),
            (b"VA 1\r\nx\r\n", MetaCommand::Set),
            (b"EN\r\n", MetaCommand::Set),
            (b"NS\r\n", MetaCommand::Get),
            (b"MN\r\n", MetaCommand::Get),
            (b"HD\r\n", MetaCommand::Noop),
            (b"HD\r\n", MetaCommand::Debug),
            (b"ME foo exp=-1\r\n", MetaCommand::Get),
            (b"STORED\r\n", MetaCommand::Set),
            (b"END\r\n", MetaCommand::Get),
            (b"VALUE a 0 1\r\n", MetaCommand::Get),
            (b"MN extra\r\n", MetaCommand::Noop),
            (b"ERROR extra\r\n", MetaCommand::Get),
            (b"CLIENT_ERROR\r\n", MetaCommand::Get),
        ] {
            assert_eq!(
                frame(reply, command),
                Err(MetaReplyError::Unexpected),
                "{reply:?} to {command:?}"
            );
        }
    }

    #[test]
    fn malformed_replies_are_errors() {
        assert_eq!(
            frame(b"HD\n", MetaCommand::Set),
            Err(MetaReplyError::BadLineEnd)
        );
        for line in [
            &b"VA x\r\n"[..],
            b"VA\r\n",
            b"VA -1\r\n",
            b"VA 99999999999\r\n",
        ] {
            assert_eq!(
                frame(line, MetaCommand::Get),
                Err(MetaReplyError::BadValueLine),
                "{line:?}"
            );
        }
        assert_eq!(
            frame(b"VA 1\r\nxyz\r\n", MetaCommand::Get),
            Err(MetaReplyError::BadDataChunk)
        );
        assert_eq!(
            frame(&[b'H'; MAX_REPLY_LINE_BYTES], MetaCommand::Get),
            Err(MetaReplyError::LineTooLong)
        );
    }

    #[test]
    fn quiet_suppresses_only_the_nominal_reply() {
        use MetaCommand::*;
        use MetaStatus::*;
        // memcached 1.6.18: `mg k q` miss -> nothing, hit -> `HD`; `md k q` ->
        // nothing when deleted, `NF` when missing; `ma k q` -> nothing on update,
        // `NF` on a miss; errors always.
        assert!(suppressed_by_quiet(Get, En));
        assert!(!suppressed_by_quiet(Get, Hd));
        assert!(!suppressed_by_quiet(Get, Va));
        assert!(suppressed_by_quiet(Set, Hd));
        assert!(!suppressed_by_quiet(Set, Ns));
        assert!(!suppressed_by_quiet(Set, Ex));
        assert!(suppressed_by_quiet(Delete, Hd));
        assert!(!suppressed_by_quiet(Delete, Nf));
        assert!(suppressed_by_quiet(Arithmetic, Hd));
        assert!(suppressed_by_quiet(Arithmetic, Va));
        assert!(!suppressed_by_quiet(Arithmetic, Nf));
        assert!(!suppressed_by_quiet(Noop, Mn));
        assert!(!suppressed_by_quiet(Debug, En));
        for command in [Get, Set, Delete, Arithmetic, Noop, Debug] {
            for error in [Error, ClientError, ServerError] {
                assert!(!suppressed_by_quiet(command, error));
            }
        }
    }
}
