//! Writing protocol bytes: sub-gets for a subset of keys, the merged reply of a
//! multi-get, requests with `noreply` stripped, and memring's own reply lines.
//!
//! Pure: everything writes into a `BytesMut` or slices a `Bytes`; no I/O.

use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use super::reply::ValueBlocks;
use super::{Command, Request};

/// Where a reply to the client is rendered: the planner writes into it
/// without knowing what holds the bytes (the session's output queue).
pub(crate) trait ReplyWriter {
    /// Appends a piece as it arrived from a server (a value block).
    fn piece(&mut self, piece: Bytes);
    /// Where memring's own bytes are written (copied).
    fn text(&mut self) -> &mut BytesMut;
}

/// A request on its way to a backend, as slices of the client's bytes (values are
/// never copied to build it).
pub type Outbound = SmallVec<[Bytes; 3]>;

/// The request as the backend should receive it: unchanged, or with a trailing
/// `noreply` removed so that the backend answers and the proxy can stay in step
/// with it (the answer is then swallowed).
pub fn forwardable(bytes: &Bytes, request: &Request) -> Outbound {
    let mut out = Outbound::new();
    if request.noreply {
        out.push(bytes.slice(..request.args_end as usize));
        out.push(Bytes::from_static(b"\r\n"));
        let line_len = request.line_len as usize;
        if bytes.len() > line_len {
            out.push(bytes.slice(line_len..));
        }
    } else {
        out.push(bytes.clone());
    }
    out
}

/// Writes `<command> [<exptime>] <key> <key> ...\r\n` for one server's share of
/// a multi-key retrieval.
pub fn write_sub_get<'a>(
    out: &mut BytesMut,
    command: Command,
    exptime: Option<&[u8]>,
    keys: impl Iterator<Item = &'a [u8]>,
) {
    out.put_slice(command.name().as_bytes());
    if let Some(exptime) = exptime {
        out.put_u8(b' ');
        out.put_slice(exptime);
    }
    for key in keys {
        out.put_u8(b' ');
        out.put_slice(key);
    }
    out.put_slice(b"\r\n");
}

/// Merges the replies of a split multi-get into one reply in the client's key
/// order, ending with a single `END`.
///
/// `keys` yields each client key with the index of the part (server reply) that
/// holds it. Each part lists its hits in the order its keys were sent, so one
/// cursor per part suffices; a key that is not next in its part is a miss. A
/// part that is `None` (its server failed) contributes only misses.
/// Returns the number of hits written.
pub fn write_merged_values<'k>(
    out: &mut BytesMut,
    keys: impl Iterator<Item = (&'k [u8], usize)>,
    parts: &[Option<Bytes>],
) -> usize {
    let mut hits = 0;
    let mut cursors: SmallVec<[_; 8]> = parts
        .iter()
        .map(|part| {
            part.as_ref()
                .map(|reply| ValueBlocks::new(reply).peekable())
        })
        .collect();
    for (key, part) in keys {
        let (Some(reply), Some(Some(cursor))) = (&parts[part], cursors.get_mut(part)) else {
            continue;
        };
        if let Some(block) = cursor.next_if(|block| &reply[block.key.clone()] == key) {
            out.put_slice(&reply[block.block]);
            hits += 1;
        }
    }
    out.put_slice(b"END\r\n");
    hits
}

/// The `VALUE <key> <flags> <length>[ <cas>]\r\n<data>\r\n` block of a
/// retrieval reply; `data` ends with its `\r\n`.
pub fn value_block(key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) -> Bytes {
    let length = data.len().saturating_sub(2);
    let header = match cas {
        Some(cas) => format!(" {flags} {length} {cas}\r\n"),
        None => format!(" {flags} {length}\r\n"),
    };
    let mut block = BytesMut::with_capacity(6 + key.len() + header.len() + data.len());
    block.put_slice(b"VALUE ");
    block.put_slice(key);
    block.put_slice(header.as_bytes());
    block.put_slice(data);
    block.freeze()
}

/// Writes `SERVER_ERROR <reason>\r\n`.
pub fn write_server_error(out: &mut BytesMut, reason: &dyn std::fmt::Display) {
    let mut line = String::with_capacity(64);
    // Writing to a String cannot fail.
    let _ = write!(line, "SERVER_ERROR {reason}");
    // A reason must not break the line framing.
    line.retain(|c| c != '\r' && c != '\n');
    out.put_slice(line.as_bytes());
    out.put_slice(b"\r\n");
}

/// Writes one `STAT <name> <value>\r\n` line.
pub fn write_stat(out: &mut BytesMut, name: &str, value: &dyn std::fmt::Display) {
    let mut line = String::with_capacity(48);
    let _ = write!(line, "STAT {name} {value}\r\n");
    out.put_slice(line.as_bytes());
}

/// How memring prints a key in what it reports itself (`stats hotkeys`,
/// metric labels, log lines): a key made only of the bytes a classic text
/// key may hold (printable ASCII, 0x21..=0x7e) as it is; any other key (meta
/// `b` keys can hold any byte) as its base64 followed by ` b`, the way the
/// meta protocol marks a returned key as base64 (`protocol.txt`, meta get,
/// flag `b`). Either form is one line without control bytes, and the space
/// before `b` cannot occur in a printable key, so the two never collide.
pub fn printable_key(key: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(key) {
        Ok(text) if !key.is_empty() && key.iter().all(|b| (0x21..=0x7e).contains(b)) => {
            Cow::Borrowed(text)
        }
        _ => Cow::Owned(format!("{} b", super::meta::encode_key(key))),
    }
}

/// `cas <key> <flags> <exptime> <bytes> <unique> [noreply]` + data, rewritten
/// as `set <key> <flags> <exptime> <bytes>` + the same data, to copy a value
/// the owner stored to the other replicas.
pub(crate) fn cas_as_set(request: &Request, bytes: &Bytes) -> Outbound {
    let line = &bytes[..request.args_end as usize];
    let fields: SmallVec<[&[u8]; 8]> = line
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .collect();
    let mut head = BytesMut::with_capacity(line.len());
    head.put_slice(b"set");
    for field in fields.iter().skip(1).take(4) {
        head.put_u8(b' ');
        head.put_slice(field);
    }
    head.put_slice(b"\r\n");
    smallvec::smallvec![head.freeze(), bytes.slice(request.line_len as usize..)]
}

/// The request that deletes `key`, quietly (`noreply`, `q`) or not: classic
/// for a key the classic protocol can carry, meta with the key in base64 for
/// any other bytes.
pub fn write_delete(key: &[u8], quiet: bool, out: &mut BytesMut) {
    if super::request::is_valid_key(key) {
        out.put_slice(b"delete ");
        out.put_slice(key);
        out.put_slice(if quiet { b" noreply\r\n" } else { b"\r\n" });
    } else {
        out.put_slice(b"md ");
        out.put_slice(super::meta::encode_key(key).as_bytes());
        out.put_slice(if quiet { b" b q\r\n" } else { b" b\r\n" });
    }
}

/// `add <key> <flags> <exptime> <bytes> [noreply]` + data, rewritten as
/// `ms <key> <bytes> ME c F<flags> T<exptime>` + the same data: an `add`
/// that answers (no `noreply`) with the cas of the item it stored, so a
/// replicated `add` can take back exactly its own copies.
pub(crate) fn add_with_cas(request: &Request, bytes: &Bytes) -> Outbound {
    let line = &bytes[..request.args_end as usize];
    let fields: SmallVec<[&[u8]; 8]> = line
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .collect();
    let field = |i: usize| fields.get(i).copied().unwrap_or(b"0");
    let mut head = BytesMut::with_capacity(line.len() + 16);
    head.put_slice(b"ms ");
    head.put_slice(field(1));
    head.put_u8(b' ');
    head.put_slice(field(4));
    head.put_slice(b" ME c F");
    head.put_slice(field(2));
    head.put_slice(b" T");
    head.put_slice(field(3));
    head.put_slice(b"\r\n");
    smallvec::smallvec![head.freeze(), bytes.slice(request.line_len as usize..)]
}

/// A meta `ms … ME` as a replicated `add` sends it: the client's flags
/// without `q` (every replica answers) and with `c` (each store returns its
/// cas), then the data.
pub(crate) fn meta_add_with_cas(request: &super::meta::MetaRequest, bytes: &Bytes) -> Bytes {
    let flags_start = request.flags.start as usize;
    let line_end = request.flags.end as usize;
    let mut out = BytesMut::with_capacity(request.total_len as usize + 2);
    let head = &bytes[..flags_start.min(line_end)];
    out.put_slice(head.strip_suffix(b" ").unwrap_or(head));
    let mut has_cas = false;
    for (flag, token) in request.flags(bytes) {
        has_cas |= flag == b'c';
        if flag != b'q' {
            out.put_u8(b' ');
            out.put_slice(token);
        }
    }
    if !has_cas {
        out.put_slice(b" c");
    }
    out.put_slice(b"\r\n");
    out.put_slice(&bytes[request.line_len as usize..request.total_len as usize]);
    out.freeze()
}

/// The reply memcached (1.6.18) writes for a miss of the `mg` `request`:
/// `EN`, then its `O` token and its key (`k`: the key token as sent, and
/// ` b` after it for a base64 key) in the request's order, and nothing at
/// all when it is quiet (`q`). Meant for an `mg` memcached accepts (no
/// `backend_error`: no duplicate flag) and that creates nothing on a miss
/// (no `N`).
pub(crate) fn meta_get_miss(request: &super::meta::MetaRequest, bytes: &[u8]) -> Bytes {
    if request.quiet {
        return Bytes::new();
    }
    let key = request.key_token(bytes);
    let mut out = BytesMut::with_capacity(8 + key.len() + request.flags.of(bytes).len());
    out.put_slice(b"EN");
    for (flag, token) in request.flags(bytes) {
        match flag {
            b'O' => {
                out.put_u8(b' ');
                out.put_slice(token);
            }
            b'k' => {
                out.put_slice(b" k");
                out.put_slice(key);
                if request.base64 {
                    out.put_slice(b" b");
                }
            }
            _ => {}
        }
    }
    out.put_slice(b"\r\n");
    out.freeze()
}

/// `md <key> [b] C<cas>`: deletes the item only while it is the one with
/// that cas (a newer write stays).
pub(crate) fn delete_by_cas(key: &[u8], base64: bool, cas: u64) -> Bytes {
    let mut line = String::with_capacity(key.len() + 28);
    let _ = write!(line, " C{cas}\r\n");
    let mut out = BytesMut::with_capacity(key.len() + line.len() + 5);
    out.put_slice(b"md ");
    out.put_slice(key);
    if base64 {
        out.put_slice(b" b");
    }
    out.put_slice(line.as_bytes());
    out.freeze()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_delete_is_classic_for_a_text_key_and_meta_for_other_bytes() {
        let line = |key: &[u8], quiet| {
            let mut out = BytesMut::new();
            write_delete(key, quiet, &mut out);
            out
        };
        assert_eq!(&line(b"k", false)[..], b"delete k\r\n");
        assert_eq!(&line(b"k", true)[..], b"delete k noreply\r\n");
        assert_eq!(&line(b"a b", false)[..], b"md YSBi b\r\n");
        assert_eq!(&line(b"a b", true)[..], b"md YSBi b q\r\n");
    }

    use super::*;
    use crate::protocol::{parse_request, Limits};

    #[test]
    fn a_replicated_add_goes_as_a_meta_add_that_returns_its_cas() {
        let bytes = Bytes::from_static(b"add k 5 -1 3 noreply\r\nabc\r\n");
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        let wire: Vec<u8> = add_with_cas(&request, &bytes).concat();
        assert_eq!(wire, b"ms k 3 ME c F5 T-1\r\nabc\r\n");
        let bytes = Bytes::from_static(b"ms aw== 2 b q ME O9\r\nhi\r\n");
        let (request, _) = crate::protocol::meta::parse_meta(&bytes, &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            &meta_add_with_cas(&request, &bytes)[..],
            b"ms aw== 2 b ME O9 c\r\nhi\r\n"
        );
        assert_eq!(&delete_by_cas(b"aw==", true, 42)[..], b"md aw== b C42\r\n");
        assert_eq!(&delete_by_cas(b"k", false, 7)[..], b"md k C7\r\n");
    }

    #[test]
    fn an_mg_miss_echoes_o_and_k_in_order_as_memcached_does() {
        // Each pair as memcached 1.6.18 answers it for a missing key.
        for (request, miss) in [
            (
                &b"mg missingkey v k Oabc\r\n"[..],
                &b"EN kmissingkey Oabc\r\n"[..],
            ),
            (b"mg missingkey Oabc k v\r\n", b"EN Oabc kmissingkey\r\n"),
            (b"mg missingkey s v t f c\r\n", b"EN\r\n"),
            (b"mg missingkey\r\n", b"EN\r\n"),
            (b"mg missingkey O\r\n", b"EN O\r\n"),
            (b"mg missingkey kfoo\r\n", b"EN kmissingkey\r\n"),
            (b"mg missing4 T30 k Oa\r\n", b"EN kmissing4 Oa\r\n"),
            (b"mg missing3 R30 v k\r\n", b"EN kmissing3\r\n"),
            (
                b"mg bWlzc2luZw== b v k Oabc\r\n",
                b"EN kbWlzc2luZw== b Oabc\r\n",
            ),
            (
                b"mg bWlzc2luZw== Oabc k b\r\n",
                b"EN Oabc kbWlzc2luZw== b\r\n",
            ),
            (b"mg bWlzc2luZw== b Oabc\r\n", b"EN Oabc\r\n"),
            (b"mg missingkey v q Oabc\r\n", b""),
            (b"mg missingkey q k\r\n", b""),
        ] {
            let bytes = Bytes::copy_from_slice(request);
            let (parsed, _) = crate::protocol::meta::parse_meta(&bytes, &Limits::default())
                .unwrap()
                .unwrap();
            assert_eq!(
                &meta_get_miss(&parsed, &bytes)[..],
                miss,
                "{}",
                String::from_utf8_lossy(request)
            );
        }
    }

    #[test]
    fn cas_is_copied_to_replicas_as_a_plain_set() {
        let bytes = Bytes::from_static(b"cas k 5 10 3 99 noreply\r\nabc\r\n");
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        let copy: Vec<u8> = cas_as_set(&request, &bytes).concat();
        assert_eq!(copy, b"set k 5 10 3\r\nabc\r\n");
    }

    #[test]
    fn sub_get_round_trips_through_the_parser() {
        let mut out = BytesMut::new();
        write_sub_get(
            &mut out,
            Command::Gat,
            Some(b"30"),
            [&b"a"[..], b"bb"].into_iter(),
        );
        assert_eq!(&out[..], b"gat 30 a bb\r\n");
        let (request, consumed) = parse_request(&out, &Limits::default()).unwrap().unwrap();
        assert_eq!(consumed, out.len());
        assert_eq!(request.key(&out, 1), b"bb");
    }

    #[test]
    fn noreply_is_stripped_and_the_data_block_kept() {
        let bytes = Bytes::from_static(b"set k 0 0 3 noreply\r\na\r\n\r\n");
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        let joined: Vec<u8> = forwardable(&bytes, &request).concat();
        assert_eq!(joined, b"set k 0 0 3\r\na\r\n\r\n");
    }

    #[test]
    fn merged_reply_follows_client_order_with_misses_and_duplicates() {
        let part0 = Bytes::from_static(b"VALUE a 0 1\r\n1\r\nVALUE a 0 1\r\n1\r\nEND\r\n");
        let part1 = Bytes::from_static(b"VALUE c 0 1\r\n3\r\nEND\r\n");
        let keys = [(&b"c"[..], 1), (b"a", 0), (b"b", 1), (b"a", 0), (b"d", 0)];
        let mut out = BytesMut::new();
        write_merged_values(&mut out, keys.into_iter(), &[Some(part0), Some(part1)]);
        assert_eq!(
            &out[..],
            b"VALUE c 0 1\r\n3\r\nVALUE a 0 1\r\n1\r\nVALUE a 0 1\r\n1\r\nEND\r\n"
        );
    }

    #[test]
    fn failed_part_contributes_misses() {
        let part1 = Bytes::from_static(b"VALUE b 0 1\r\n2\r\nEND\r\n");
        let keys = [(&b"a"[..], 0), (b"b", 1)];
        let mut out = BytesMut::new();
        write_merged_values(&mut out, keys.into_iter(), &[None, Some(part1)]);
        assert_eq!(&out[..], b"VALUE b 0 1\r\n2\r\nEND\r\n");
    }

    #[test]
    fn printable_keys_print_as_is_and_others_as_base64() {
        assert_eq!(printable_key(b"user:42\"\\~"), "user:42\"\\~");
        assert_eq!(printable_key(b"a b"), "YSBi b");
        assert_eq!(printable_key(b"\r\nEND\r\n"), "DQpFTkQNCg== b");
        assert_eq!(printable_key(&[0xff, 0xfe]), "//4= b");
        assert_eq!(printable_key("caf\u{e9}".as_bytes()), "Y2Fmw6k= b");
        assert_eq!(printable_key(b"\x7f"), "fw== b");
    }

    #[test]
    fn server_error_reason_cannot_break_framing() {
        let mut out = BytesMut::new();
        write_server_error(&mut out, &"down\r\nSTORED");
        assert_eq!(&out[..], b"SERVER_ERROR downSTORED\r\n");
    }
}
