//! Reading a moved key from its previous owner: the `mg` that fetches it
//! with what a copy needs, the client's answer made from that hit, and the
//! copy for the new owner with the item's remaining TTL.

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::protocol::encode::{value_block, Outbound};
use crate::protocol::outcome::{Outcome, Reply};

/// A read-through hit: the `VALUE` block the client gets (with the cas when
/// asked), and the exptime its copy is stored with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadThrough {
    pub block: Bytes,
    /// `None` when the item expires within the second: no copy then (an
    /// exptime of 0 would keep it forever).
    pub exptime: Option<Bytes>,
}

/// Longest relative exptime memcached takes; larger ones are Unix times.
const MAX_RELATIVE_EXPTIME: i64 = 60 * 60 * 24 * 30;

/// Reads the reply to a [`fetch_line`] asked with `with_cas` (`VA <len>
/// f<flags> t<ttl> [c<cas>]`, then the data) for a classic `get`/`gets`:
/// `Some` for a hit, `None` for anything else. `now` is the Unix time, for a
/// remaining TTL beyond 30 days.
pub(crate) fn read_through_hit(
    key: &[u8],
    reply: &Reply,
    with_cas: bool,
    now: u64,
) -> Option<ReadThrough> {
    let value = ValueReply::parse(reply)?;
    let flags = value.number::<u32>(b'f')?;
    let ttl = value.number::<i64>(b't')?;
    let cas = if with_cas {
        Some(value.number::<u64>(b'c')?)
    } else {
        None
    };
    Some(ReadThrough {
        block: value_block(key, flags, value.data, cas),
        exptime: copy_exptime(ttl, now).map(Bytes::from),
    })
}

/// A meta `VA` reply: its length token, its return flags, and its data (with
/// the `\r\n` after it).
pub(super) struct ValueReply<'a> {
    pub(super) length: &'a [u8],
    pub(super) flags: SmallVec<[&'a [u8]; 8]>,
    pub(super) data: &'a [u8],
}

impl<'a> ValueReply<'a> {
    /// `None` unless `reply` is one whole `VA` reply.
    pub(super) fn parse(reply: &'a Reply) -> Option<ValueReply<'a>> {
        let header_end = memchr::memmem::find(reply, b"\r\n")?;
        if reply.outcome != Outcome::Va {
            return None;
        }
        let mut tokens = reply[..header_end].split(|&b| b == b' ').skip(1);
        let length = tokens.next()?;
        let data_len: usize = std::str::from_utf8(length).ok()?.parse().ok()?;
        let data = reply.get(header_end + 2..)?;
        if data.len() != data_len + 2 || !data.ends_with(b"\r\n") {
            return None;
        }
        Some(ValueReply {
            length,
            flags: tokens.collect(),
            data,
        })
    }

    /// The value of the last return flag `flag` (asked last, so memring's
    /// own when it added it).
    pub(super) fn number<T: std::str::FromStr>(&self, flag: u8) -> Option<T> {
        let token = self.flags.iter().rev().find(|t| t.first() == Some(&flag))?;
        std::str::from_utf8(&token[1..]).ok()?.parse().ok()
    }
}

/// The `mg` that fetches a moved key from its previous owner for a copy:
/// value, client flags and remaining TTL (see [`meta_read_through_hit`] with
/// [`AddedFlags::FETCH`]), and with `with_cas` its cas (for a classic `gets`,
/// [`read_through_hit`]).
pub(crate) fn fetch_line(key_token: &[u8], base64: bool, with_cas: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 10);
    line.put_slice(b"mg ");
    line.put_slice(key_token);
    if base64 {
        line.put_slice(b" b");
    }
    if with_cas {
        line.put_slice(b" c");
    }
    line.put_slice(b"\r\n");
    meta_read_through_line(&line, |_| false).0
}

/// The cas of the item a [`fetch_line`] asked with the cas read.
pub(super) fn fetched_cas(reply: &Reply) -> Option<u64> {
    ValueReply::parse(reply)?.number::<u64>(b'c')
}

/// Which flags memring appended to a client's `mg` for its read-through from
/// the previous owner: what a copy needs (`v`, `f`, `t`) and the client did
/// not ask for. Their return tokens come last, in this order (memcached
/// answers flags in the order they were asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AddedFlags {
    pub value: bool,
    pub flags: bool,
    pub ttl: bool,
}

impl AddedFlags {
    /// What [`fetch_line`] adds: all three.
    pub(crate) const FETCH: AddedFlags = AddedFlags {
        value: true,
        flags: true,
        ttl: true,
    };
}

/// The client's `mg` line (`line`, with its `\r\n`) with `v f t` added where
/// missing, for asking a moved key's previous owner.
pub(crate) fn meta_read_through_line(line: &[u8], has: impl Fn(u8) -> bool) -> (Bytes, AddedFlags) {
    let added = AddedFlags {
        value: !has(b'v'),
        flags: !has(b'f'),
        ttl: !has(b't'),
    };
    let mut out = BytesMut::with_capacity(line.len() + 6);
    out.put_slice(line.strip_suffix(b"\r\n").unwrap_or(line));
    for (flag, add) in [(b'v', added.value), (b'f', added.flags), (b't', added.ttl)] {
        if add {
            out.put_slice(&[b' ', flag]);
        }
    }
    out.put_slice(b"\r\n");
    (out.freeze(), added)
}

/// The previous owner's hit (`VA`) to a [`meta_read_through_line`]: the reply
/// the client's own `mg` would have had (the added tokens, and the value if
/// it was not asked for, removed), and the `ms … ME` (add) that copies the
/// key to its new owner with its flags and remaining TTL (`None` when it
/// expires within the second). `None` for anything but such a hit.
pub(crate) fn meta_read_through_hit(
    reply: &Reply,
    added: AddedFlags,
    key_token: &[u8],
    base64: bool,
    now: u64,
) -> Option<(Reply, Option<Outbound>)> {
    let value = ValueReply::parse(reply)?;
    // memcached puts its state markers (`W` win, `X` stale, `Z` a win
    // already handed out) after every flag: they stay in the client's reply,
    // and an item in such a state is not copied, since a copy would be a
    // fresh item and lose its invalidation or lease.
    let markers = value
        .flags
        .iter()
        .rev()
        .take_while(|t| matches!(t, [b'W' | b'X' | b'Z']))
        .count();
    let returned = value.flags.len() - markers;
    let ours = usize::from(added.flags) + usize::from(added.ttl);
    let kept = returned.checked_sub(ours)?;
    let (flags, ttl) = (value.number::<u32>(b'f')?, value.number::<i64>(b't')?);
    let mut client = BytesMut::with_capacity(reply.len());
    if added.value {
        client.put_slice(b"HD");
    } else {
        client.put_slice(b"VA ");
        client.put_slice(value.length);
    }
    for token in value.flags[..kept].iter().chain(&value.flags[returned..]) {
        client.put_u8(b' ');
        client.put_slice(token);
    }
    client.put_slice(b"\r\n");
    if !added.value {
        client.put_slice(value.data);
    }
    let exptime = if markers == 0 {
        copy_exptime(ttl, now)
    } else {
        None
    };
    let copy = exptime.map(|exptime| {
        let mut line = BytesMut::with_capacity(key_token.len() + 48);
        line.put_slice(b"ms ");
        line.put_slice(key_token);
        let data_len = value.data.len() - 2;
        line.put_slice(format!(" {data_len} F{flags} ME").as_bytes());
        if exptime != "0" {
            line.put_slice(b" T");
            line.put_slice(exptime.as_bytes());
        }
        if base64 {
            line.put_slice(b" b");
        }
        line.put_slice(b" c\r\n");
        let copy: Outbound = smallvec::smallvec![line.freeze(), Bytes::copy_from_slice(value.data)];
        copy
    });
    // The client's reply is memring's own: `HD`, or the `VA` it got.
    let said = if added.value {
        Outcome::Hd
    } else {
        Outcome::Va
    };
    Some((Reply::new(said, client.freeze()), copy))
}

/// The exptime a copy of an item with `ttl` seconds left is stored with
/// (`-1`: none): `None` when it expires within the second, since 0 would
/// keep it forever; beyond 30 days a Unix time, as memcached reads it.
fn copy_exptime(ttl: i64, now: u64) -> Option<String> {
    match ttl {
        -1 => Some("0".into()),
        t if t <= 0 => None,
        t if t <= MAX_RELATIVE_EXPTIME => Some(t.to_string()),
        t => Some(now.saturating_add(t.unsigned_abs()).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_through_hits_become_value_blocks_and_keep_their_expiry() {
        let now = 1_800_000_000;
        let hit = |reply: &[u8], with_cas| {
            read_through_hit(
                b"k",
                &Reply::made(Bytes::copy_from_slice(reply)),
                with_cas,
                now,
            )
        };
        let got = hit(b"VA 2 f5 t100\r\n10\r\n", false).unwrap();
        assert_eq!(&got.block[..], b"VALUE k 5 2\r\n10\r\n");
        assert_eq!(got.exptime.as_deref(), Some(&b"100"[..]));
        let got = hit(b"VA 1 f0 t-1 c77\r\nx\r\n", true).unwrap();
        assert_eq!(&got.block[..], b"VALUE k 0 1 77\r\nx\r\n");
        assert_eq!(got.exptime.as_deref(), Some(&b"0"[..]), "no expiry");
        // Expiring within the second: served, not copied.
        assert_eq!(hit(b"VA 1 f0 t0\r\nx\r\n", false).unwrap().exptime, None);
        // Beyond 30 days memcached reads an exptime as a Unix time.
        let far = 60 * 60 * 24 * 40;
        let got = hit(format!("VA 1 f0 t{far}\r\nx\r\n").as_bytes(), false).unwrap();
        assert_eq!(got.exptime, Some(Bytes::from((now + far).to_string())));
        // Misses, errors, and replies that do not add up are not hits.
        for reply in [
            &b"EN\r\n"[..],
            b"SERVER_ERROR out of memory\r\n",
            b"VA 3 f0 t-1\r\nx\r\n",
            b"VA 1 t-1\r\nx\r\n",
            b"VA 1 f0 t-1\r\nx\r\n",
        ] {
            let with_cas = reply == b"VA 1 f0 t-1\r\nx\r\n";
            assert_eq!(
                hit(reply, with_cas),
                None,
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
        assert_eq!(&fetch_line(b"k", false, true)[..], b"mg k c v f t\r\n");
    }

    #[test]
    fn meta_read_throughs_answer_as_the_client_asked_and_copy_with_the_ttl() {
        let now = 1_800_000_000;
        let asked = |line: &[u8], flags: &[u8]| {
            let flags = flags.to_vec();
            meta_read_through_line(line, move |f| flags.contains(&f))
        };
        // Nothing a copy needs was asked for: all three added.
        let (line, added) = asked(b"mg k s O7 k\r\n", b"sOk");
        assert_eq!(&line[..], b"mg k s O7 k v f t\r\n");
        let (reply, copy) = meta_read_through_hit(
            &Reply::from_static(b"VA 2 s2 O7 kk f5 t100\r\nab\r\n"),
            added,
            b"k",
            false,
            now,
        )
        .unwrap();
        assert_eq!(&reply[..], b"HD s2 O7 kk\r\n");
        let copy = copy.unwrap();
        assert_eq!(&copy[0][..], b"ms k 2 F5 ME T100 c\r\n");
        assert_eq!(&copy[1][..], b"ab\r\n");
        // The client's own v, f and t stay; a base64 key is copied as one.
        let (line, added) = asked(b"mg Zm9v t v b f q\r\n", b"tvbfq");
        assert_eq!(&line[..], b"mg Zm9v t v b f q\r\n");
        let (reply, copy) = meta_read_through_hit(
            &Reply::from_static(b"VA 1 t-1 b f0\r\nx\r\n"),
            added,
            b"Zm9v",
            true,
            now,
        )
        .unwrap();
        assert_eq!(&reply[..], b"VA 1 t-1 b f0\r\nx\r\n");
        assert_eq!(&copy.unwrap()[0][..], b"ms Zm9v 1 F0 ME b c\r\n");
        // Expiring within the second: answered, not copied; misses are not hits.
        let (_, added) = asked(b"mg k v\r\n", b"v");
        let (reply, copy) = meta_read_through_hit(
            &Reply::from_static(b"VA 1 f0 t0\r\nx\r\n"),
            added,
            b"k",
            false,
            now,
        )
        .unwrap();
        assert_eq!((&reply[..], copy), (&b"VA 1\r\nx\r\n"[..], None));
        assert_eq!(
            meta_read_through_hit(&Reply::from_static(b"EN\r\n"), added, b"k", false, now),
            None
        );
        assert_eq!(
            &fetch_line(b"Zm9v", true, false)[..],
            b"mg Zm9v b v f t\r\n"
        );
        assert_eq!(asked(b"mg k\r\n", b"").1, AddedFlags::FETCH);
    }

    #[test]
    fn an_invalidated_or_leased_item_keeps_its_markers_and_is_not_copied() {
        let now = 1_800_000_000;
        let (_, added) = meta_read_through_line(b"mg k v c\r\n", |f| b"vc".contains(&f));
        // As memcached 1.6.18 answers `mg k v c f t` after `md k I`.
        for (reply, client) in [
            (
                &b"VA 2 c5 f0 t-1 X W\r\nhi\r\n"[..],
                &b"VA 2 c5 X W\r\nhi\r\n"[..],
            ),
            (b"VA 2 c5 f0 t-1 Z X\r\nhi\r\n", b"VA 2 c5 Z X\r\nhi\r\n"),
            (b"VA 0 c6 f0 t30 W\r\n\r\n", b"VA 0 c6 W\r\n\r\n"),
        ] {
            let framed = Reply::made(Bytes::copy_from_slice(reply));
            let (answer, copy) = meta_read_through_hit(&framed, added, b"k", false, now).unwrap();
            assert_eq!(&answer[..], client, "{reply:?}");
            assert!(copy.is_none(), "{reply:?} copied");
        }
    }
}
