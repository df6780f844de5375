//! Tagging forwarded meta requests, so that every reply provably belongs to
//! its request.
//!
//! Meta replies carry no key unless asked for one, so a server that sends one
//! reply too many (a doubled `HD`, a stray `VA`) would shift every later reply
//! on its connection onto the wrong request, unnoticed. memcached echoes the
//! opaque token `O<value>` of `mg`, `ms`, `md` and `ma` in every reply except
//! error lines (checked on 1.6.18). So memring gives each request it forwards
//! an opaque of its own: it replaces the client's `O` token, or appends one
//! after the last flag, and on the way back checks that the reply carries
//! exactly that token and puts the client's token back (or removes memring's).
//!
//! Pure: bytes in, bytes out. Requests whose tagging would change memcached's
//! answer are left untagged: a NUL in the line (memcached stops reading the line
//! there), an opaque over 32 bytes or two `O` tokens (errors memcached must
//! still give), a line already at memcached's token limit.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use memchr::memchr;

use super::reply::MetaReplyError;
use super::MetaCommand;

/// memcached refuses a meta line with more tokens than this.
const MAX_TOKENS: usize = 19;
/// memcached refuses a longer opaque (`CLIENT_ERROR opaque token too long`).
const MAX_OPAQUE_BYTES: usize = 32;
/// Lines longer than this are left untagged, far below memcached's own bound.
const MAX_TAGGED_LINE_BYTES: usize = 1024;

/// A request as it goes to the server, and what its reply must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged {
    /// The request line with memring's opaque, `\r\n` included.
    pub line: Bytes,
    /// The rest of the client's bytes (an `ms` data block), unchanged.
    pub rest: Bytes,
    /// What the reply is checked and rewritten against.
    pub tag: Tag,
}

/// memring's opaque on one request, and the client's own if it sent one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    value: u32,
    /// The client's `O` token, `O` included.
    client: Option<Bytes>,
    /// Return flags memring added to a client's `mg` to know a hand-off
    /// lease by (see [`tag_revealing`]), removed again from the reply.
    added: Revealed,
    /// A revealing `mg`'s key token when the key is base64 (`b`): a miss
    /// echoes it encoded, where a hit echoes it decoded.
    base64_key: Option<Bytes>,
}

impl Tag {
    /// The key token of a client's `mg` with a base64 key (see
    /// [`tag_revealing`]), as memcached echoes it on a miss.
    pub fn base64_key(&self) -> Option<&[u8]> {
        self.base64_key.as_deref()
    }
}

/// Which of the flags that show a lease (`f`: client flags, `s`: size)
/// memring added to an `mg`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Revealed {
    flags: bool,
    size: bool,
    /// `c`, for an `mg` that changes the item (`T`, `N`): a lease it meets
    /// is removed by its cas (`plan::lease_retry`).
    cas: bool,
}

impl Revealed {
    fn any(self) -> bool {
        self.flags || self.size || self.cas
    }

    /// Whether `token`, a return flag of the reply, is one memring added
    /// (the client asked for neither, so every such token is memring's).
    fn added(self, token: &[u8]) -> bool {
        match token.first() {
            Some(b'f') => self.flags,
            Some(b's') => self.size,
            Some(b'c') => self.cas,
            _ => false,
        }
    }
}

/// Whether memcached echoes an opaque in this command's replies.
pub fn echoes_opaque(command: MetaCommand) -> bool {
    matches!(
        command,
        MetaCommand::Get | MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arithmetic
    )
}

/// Space for tagged lines is taken from `lines` this much at a time, so that
/// tagging a request allocates once per few hundred requests.
const LINES_BLOCK_BYTES: usize = 16 * 1024;

/// Tags the request at the start of `request` with opaque `value`, or `None`
/// when it is to go untagged (see the module doc). The tagged line is
/// written in `lines`, a buffer the caller keeps from request to request.
pub fn tag_request(request: &Bytes, value: u32, lines: &mut BytesMut) -> Option<Tagged> {
    tag_with(request, value, lines, false)
}

/// [`tag_request`] for a client's `mg`, whose reply must show whether the
/// item is a hand-off lease (`protocol::lease`): `f` is added where the
/// client did not ask for the client flags, `s` where it asked for
/// neither the value nor the size, and `c` where it changes the item (`T`,
/// `N`) without asking for the cas, by which a lease it meets is removed
/// (`plan::lease_retry`). [`untag`] removes what was added, so the
/// client gets exactly memcached's reply to its own request. A line that
/// has no room for them under memcached's token limit gets none.
pub fn tag_revealing(request: &Bytes, value: u32, lines: &mut BytesMut) -> Option<Tagged> {
    tag_with(request, value, lines, true)
}

fn tag_with(request: &Bytes, value: u32, lines: &mut BytesMut, reveal: bool) -> Option<Tagged> {
    let newline = memchr(b'\n', request)?;
    let content_end = if newline > 0 && request[newline - 1] == b'\r' {
        newline - 1
    } else {
        newline
    };
    let content = &request[..content_end];
    if content.len() > MAX_TAGGED_LINE_BYTES || memchr(0, content).is_some() {
        return None;
    }
    let mut tokens = 0;
    let mut opaque: Option<(usize, usize)> = None;
    let (mut has_flags, mut has_size, mut has_value) = (false, false, false);
    let (mut has_cas, mut changes) = (false, false);
    let (mut key, mut base64) = (0..0, false);
    for (start, token) in tokens_of(content) {
        tokens += 1;
        // The command and key are never flags.
        if tokens <= 2 {
            key = start..start + token.len();
            continue;
        }
        base64 |= token == b"b";
        match token.first() {
            Some(b'O') => {
                if opaque.is_some() || token.len() - 1 > MAX_OPAQUE_BYTES {
                    return None;
                }
                opaque = Some((start, start + token.len()));
            }
            Some(b'f') => has_flags = true,
            Some(b's') => has_size = true,
            Some(b'v') => has_value = true,
            Some(b'c') => has_cas = true,
            Some(b'T' | b'N') => changes = true,
            _ => {}
        }
    }
    let mut added = Revealed {
        flags: reveal && !has_flags,
        size: reveal && !has_value && !has_size,
        cas: reveal && changes && !has_cas,
    };
    let total = tokens
        + usize::from(opaque.is_none())
        + usize::from(added.flags)
        + usize::from(added.size)
        + usize::from(added.cas);
    if total > MAX_TOKENS {
        added = Revealed::default();
    }
    let needed = content_end + OPAQUE_TOKEN_BYTES + 9;
    lines.clear();
    if lines.capacity() < needed {
        lines.reserve(needed.max(LINES_BLOCK_BYTES));
    }
    let line = &mut *lines;
    let client = match opaque {
        Some((start, end)) => {
            line.put_slice(&request[..start]);
            put_opaque(line, value);
            line.put_slice(&request[end..content_end]);
            Some(request.slice(start..end))
        }
        None => {
            if tokens >= MAX_TOKENS {
                return None;
            }
            line.put_slice(content);
            line.put_u8(b' ');
            put_opaque(line, value);
            None
        }
    };
    if added.flags {
        line.put_slice(b" f");
    }
    if added.size {
        line.put_slice(b" s");
    }
    if added.cas {
        line.put_slice(b" c");
    }
    line.put_slice(b"\r\n");
    // The line leaves; the block's remaining space stays for the next.
    let line = lines.split().freeze();
    Some(Tagged {
        line,
        rest: request.slice(newline + 1..),
        tag: Tag {
            value,
            client,
            added,
            base64_key: (reveal && base64).then(|| request.slice(key)),
        },
    })
}

/// Checks that `reply` (one framed meta reply: its line, and for `VA` its
/// value block) answers the request tagged `tag`, and returns it as the
/// client would have had it untagged.
///
/// # Errors
/// [`MetaReplyError::Foreign`] when the reply carries no opaque or another
/// one: it belongs to some other request, and the connection is out of step.
/// A bare `ERROR`, which memcached sends only to a line it cannot parse as a
/// meta command (memring has parsed this one), is foreign too.
///
/// The reply is rewritten in place: the line up to memring's token moves
/// right over it, and the value block after it stays where it is (no copy,
/// no allocation), unless the client's own opaque is longer than memring's.
pub fn untag(mut reply: BytesMut, tag: &Tag) -> Result<Bytes, MetaReplyError> {
    let newline = memchr(b'\n', &reply).ok_or(MetaReplyError::BadLineEnd)?;
    let content_end = newline.saturating_sub(1);
    let content = &reply[..content_end];
    if content == b"ERROR" {
        return Err(MetaReplyError::Foreign);
    }
    if content.starts_with(b"CLIENT_ERROR ") || content.starts_with(b"SERVER_ERROR ") {
        // Error lines carry no opaque; they are the request's own reply.
        return Ok(reply.freeze());
    }
    let mut digits = [0u8; OPAQUE_TOKEN_BYTES];
    let wanted = opaque_token(tag.value, &mut digits);
    let (start, end) = tokens_of(content)
        .skip(1)
        .find(|(_, token)| *token == wanted)
        .map(|(start, token)| (start, start + token.len()))
        .ok_or(MetaReplyError::Foreign)?;
    let client: &[u8] = tag.client.as_deref().unwrap_or_default();
    if tag.added.any() {
        return Ok(untag_revealed(reply, tag, (start, end), newline));
    }
    // What replaces `reply[..end]`: the line before the token, then the
    // client's opaque in its place, or nothing (dropping the space before).
    let kept = if client.is_empty() { start - 1 } else { start };
    let Some(offset) = end.checked_sub(kept + client.len()) else {
        let mut out = BytesMut::with_capacity(reply.len() + client.len());
        out.put_slice(&reply[..kept]);
        out.put_slice(client);
        out.put_slice(&reply[end..]);
        return Ok(out.freeze());
    };
    reply.copy_within(..kept, offset);
    reply[offset + kept..end].copy_from_slice(client);
    reply.advance(offset);
    Ok(reply.freeze())
}

/// [`untag`] of a reply to a request [`tag_revealing`] added flags to:
/// the line is rebuilt without memring's tokens (memring's opaque at
/// `opaque` replaced by the client's), and the data after it stays where it
/// is unless the line grew.
fn untag_revealed(mut reply: BytesMut, tag: &Tag, opaque: (usize, usize), newline: usize) -> Bytes {
    let content = &reply[..newline.saturating_sub(1)];
    let mut line: smallvec::SmallVec<[u8; 128]> = smallvec::SmallVec::new();
    // The reply's code (and a `VA`'s length) are not flags.
    let fixed = if content.starts_with(b"VA ") { 2 } else { 1 };
    for (index, (start, token)) in tokens_of(content).enumerate() {
        let token: &[u8] = if start == opaque.0 {
            match &tag.client {
                Some(client) => client,
                None => continue,
            }
        } else if index >= fixed && tag.added.added(token) {
            continue;
        } else {
            token
        };
        if !line.is_empty() {
            line.push(b' ');
        }
        line.extend_from_slice(token);
    }
    line.extend_from_slice(b"\r\n");
    let old = newline + 1;
    match old.checked_sub(line.len()) {
        Some(offset) => {
            reply[offset..old].copy_from_slice(&line);
            reply.advance(offset);
            reply.freeze()
        }
        None => {
            let mut out = BytesMut::with_capacity(reply.len() + line.len() - old);
            out.put_slice(&line);
            out.put_slice(&reply[old..]);
            out.freeze()
        }
    }
}

/// `O` and the ten digits of the largest `u32`.
const OPAQUE_TOKEN_BYTES: usize = 11;

fn put_opaque(out: &mut BytesMut, value: u32) {
    let mut token = [0u8; OPAQUE_TOKEN_BYTES];
    out.put_slice(opaque_token(value, &mut token));
}

/// `O<value>`, written at the end of `token`.
fn opaque_token(value: u32, token: &mut [u8; OPAQUE_TOKEN_BYTES]) -> &[u8] {
    let mut at = token.len();
    let mut n = value;
    loop {
        at -= 1;
        token[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    at -= 1;
    token[at] = b'O';
    &token[at..]
}

/// The space-separated tokens of `line` with their start offsets.
fn tokens_of(line: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < line.len() && line[at] == b' ' {
            at += 1;
        }
        if at == line.len() {
            return None;
        }
        let start = at;
        let end = memchr(b' ', &line[at..]).map_or(line.len(), |i| at + i);
        at = end;
        Some((start, &line[start..end]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(request: &'static [u8], value: u32) -> Tagged {
        tag_request(&Bytes::from_static(request), value, &mut BytesMut::new()).expect("tagged")
    }

    #[test]
    fn a_request_without_opaque_gets_memrings_after_its_last_flag() {
        let t = tagged(b"mg foo v t\r\n", 7);
        assert_eq!(&t.line[..], b"mg foo v t O7\r\n");
        assert!(t.rest.is_empty());
        let t = tagged(b"mg foo\n", 4_294_967_295);
        assert_eq!(&t.line[..], b"mg foo O4294967295\r\n");
        let t = tagged(b"ms foo 2 T0\r\nhi\r\n", 0);
        assert_eq!(&t.line[..], b"ms foo 2 T0 O0\r\n");
        assert_eq!(&t.rest[..], b"hi\r\n");
    }

    fn revealing(request: &'static [u8], value: u32) -> Tagged {
        tag_revealing(&Bytes::from_static(request), value, &mut BytesMut::new()).expect("tagged")
    }

    #[test]
    fn a_clients_mg_asks_for_what_shows_a_lease_and_gets_memcacheds_reply() {
        // (request, line sent, reply as memcached 1.6.18 sends it to that
        // line, what the client gets: memcached's reply to its own request)
        for (request, sent, reply, client) in [
            (
                &b"mg k s\r\n"[..],
                &b"mg k s O3 f\r\n"[..],
                &b"HD s3 O3 f5\r\n"[..],
                &b"HD s3\r\n"[..],
            ),
            (
                b"mg k\r\n",
                b"mg k O3 f s\r\n",
                b"HD O3 f5 s3\r\n",
                b"HD\r\n",
            ),
            (
                b"mg k v k O77 t\r\n",
                b"mg k v k O3 t f\r\n",
                b"VA 3 kk O3 t-1 f5\r\nabc\r\n",
                b"VA 3 kk O77 t-1\r\nabc\r\n",
            ),
            (
                b"mg k f t\r\n",
                b"mg k f t O3 s\r\n",
                b"HD f5 t-1 O3 s3\r\n",
                b"HD f5 t-1\r\n",
            ),
            (
                b"mg k N30 c\r\n",
                b"mg k N30 c O3 f s\r\n",
                b"HD c2 O3 f0 s0 W\r\n",
                b"HD c2 W\r\n",
            ),
            (
                b"mg k T30 v\r\n",
                b"mg k T30 v O3 f c\r\n",
                b"VA 1 O3 f0 c9\r\nx\r\n",
                b"VA 1\r\nx\r\n",
            ),
            (
                b"mg k O1234567890abcdefghijklmnopqrstu\r\n",
                b"mg k O3 f s\r\n",
                b"HD O3 f0 s1\r\n",
                b"HD O1234567890abcdefghijklmnopqrstu\r\n",
            ),
            (b"mg k s\r\n", b"mg k s O3 f\r\n", b"EN O3\r\n", b"EN\r\n"),
        ] {
            let t = revealing(request, 3);
            assert_eq!(show(&t.line), show(sent));
            let got = untag(BytesMut::from(reply), &t.tag).unwrap();
            assert_eq!(show(&got), show(client), "{}", show(request));
        }
        // No room under memcached's token limit: nothing added.
        let full = b"mg k a b c d e g h i j l m n o p u\r\n";
        let t = revealing(full, 3);
        assert_eq!(
            show(&t.line),
            show(b"mg k a b c d e g h i j l m n o p u O3\r\n")
        );
    }

    fn show(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    #[test]
    fn the_clients_opaque_is_replaced_in_place_and_put_back_in_the_reply() {
        let t = tagged(b"md foo q Oabc k\r\n", 12);
        assert_eq!(&t.line[..], b"md foo q O12 k\r\n");
        let reply = Bytes::from_static(b"HD O12 kfoo\r\n");
        assert_eq!(
            &untag(BytesMut::from(&reply[..]), &t.tag).unwrap()[..],
            b"HD Oabc kfoo\r\n"
        );
    }

    #[test]
    fn a_clients_opaque_of_any_length_comes_back_with_the_value_intact() {
        for client in ["Oa", "Oab", "O1234567890abcdefghijklmnopqrstu"] {
            let request = format!("mg foo v {client}\r\n");
            let t = tag_request(&Bytes::from(request), 12, &mut BytesMut::new()).expect("tagged");
            let reply = BytesMut::from(&b"VA 5 O12 t-1\r\nhello\r\n"[..]);
            let got = untag(reply, &t.tag).unwrap();
            assert_eq!(got, format!("VA 5 {client} t-1\r\nhello\r\n").as_bytes());
        }
    }

    #[test]
    fn memrings_opaque_is_removed_from_replies_as_memcached_sends_them() {
        // Replies as memcached 1.6.18 sent them to these requests with `O9`
        // appended (markers like W, X and Z come after the flags).
        let t = tagged(b"mg a v c\r\n", 9);
        for (reply, client_sees) in [
            (
                &b"VA 2 c5 O9 X W\r\nhi\r\n"[..],
                &b"VA 2 c5 X W\r\nhi\r\n"[..],
            ),
            (b"EN O9\r\n", b"EN\r\n"),
            (b"HD O9\r\n", b"HD\r\n"),
            (b"NF O9\r\n", b"NF\r\n"),
            (b"VA 4 O9\r\nO9\r\n\r\n", b"VA 4\r\nO9\r\n\r\n"),
        ] {
            let got = untag(BytesMut::from(reply), &t.tag).unwrap();
            assert_eq!(&got[..], client_sees, "{reply:?}");
        }
    }

    #[test]
    fn a_reply_with_another_or_no_opaque_is_foreign() {
        let t = tagged(b"mg a v\r\n", 9);
        for reply in [
            &b"HD\r\n"[..],
            b"EN O8\r\n",
            b"EN O99\r\n",
            b"VA 2\r\nO9\r\n",
            b"HD kO9\r\n",
            b"ERROR\r\n",
        ] {
            assert_eq!(
                untag(BytesMut::from(reply), &t.tag),
                Err(MetaReplyError::Foreign),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn error_lines_are_the_requests_own_reply() {
        let t = tagged(b"ma a\r\n", 3);
        let reply =
            Bytes::from_static(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        assert_eq!(untag(BytesMut::from(&reply[..]), &t.tag).unwrap(), reply);
    }

    #[test]
    fn requests_whose_answer_tagging_would_change_stay_untagged() {
        let long_opaque = b"mg a Oabcdefghijabcdefghijabcdefghijabc\r\n";
        for request in [
            &long_opaque[..],
            b"mg a O1 O2\r\n",
            b"mg a v\0 q\r\n",
            b"mg a 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\r\n",
            b"mg a",
        ] {
            assert_eq!(
                tag_request(&Bytes::copy_from_slice(request), 1, &mut BytesMut::new()),
                None,
                "{request:?}"
            );
        }
        // One token short of the limit: room for the tag.
        assert!(tag_request(
            &Bytes::from_static(b"mg a 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\r\n"),
            1,
            &mut BytesMut::new()
        )
        .is_some());
    }
}
