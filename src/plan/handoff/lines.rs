//! The meta requests the hand-off machines send for themselves (a probe of
//! the new owner, the forget and the delete by cas) and what their replies
//! show.

use bytes::{BufMut, Bytes, BytesMut};

use crate::protocol::lease;
use crate::protocol::meta::reply::won_recache_token;
use crate::protocol::outcome::{Outcome, Reply};

/// The `mg` that reads what the new owner holds for a key an arithmetic
/// command found not a number: its cas, flags and size, to know a lease by.
/// Not its data: every `mg` reply with a lease's data reaches memring as a
/// miss (`backend::conn`). `u`: the look leaves the item as the client's
/// next `mg` expects it (not marked fetched, not bumped in the LRU).
pub(crate) fn probe_line(key_token: &[u8], base64: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 16);
    line.put_slice(b"mg ");
    line.put_slice(key_token);
    line.put_slice(if base64 {
        b" b c f s u\r\n"
    } else {
        b" c f s u\r\n"
    });
    line.freeze()
}

/// The cas of the lease a [`probe_line`]'s reply (`HD c<cas> f<flags>
/// s<size>`) shows: the lease's flags, and a size the marker fits in.
pub(crate) fn probed_lease(reply: &Reply) -> Option<u64> {
    let is_lease = hd_number(reply, b'f') == Some(u64::from(lease::LEASE_FLAGS))
        && hd_number(reply, b's').is_some_and(|size| size >= lease::LEASE_MARKER.len() as u64);
    hd_number(reply, b'c').filter(|_| is_lease)
}

/// The `md` that gives back the recache token a [`probe_line`] took: the
/// first `mg` to see a stale item wins it (`W`), the probe's too, and the
/// client's next `mg` would find it taken (`Z`). Marking the item stale
/// again, by the cas the probe saw, makes it winnable again and keeps its
/// TTL (memcached 1.6.18 has no way to keep the cas as well).
pub(crate) fn probe_hand_back(reply: &Reply, key_token: &[u8], base64: bool) -> Option<Bytes> {
    let cas = hd_number(reply, b'c').filter(|_| won_recache_token(reply))?;
    let mut line = BytesMut::with_capacity(key_token.len() + 32);
    line.put_slice(b"md ");
    line.put_slice(key_token);
    if base64 {
        line.put_slice(b" b");
    }
    line.put_slice(format!(" I C{cas}\r\n").as_bytes());
    Some(line.freeze())
}

/// The number of return flag `flag` in an `HD …` reply line.
pub(super) fn hd_number(reply: &Reply, flag: u8) -> Option<u64> {
    if reply.outcome != Outcome::Hd {
        return None;
    }
    let line = reply.strip_suffix(b"\r\n")?;
    let token = line
        .split(|&b| b == b' ')
        .skip(1)
        .find(|t| t.first() == Some(&flag))?;
    std::str::from_utf8(&token[1..]).ok()?.parse().ok()
}

/// The `md` that removes a moved key from its previous owner before a write
/// replaces it on the new one.
pub(crate) fn forget_line(key_token: &[u8], base64: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 8);
    line.put_slice(b"md ");
    line.put_slice(key_token);
    if base64 {
        line.put_slice(b" b");
    }
    line.put_slice(b"\r\n");
    line.freeze()
}

/// `md <key>`, with `C<cas>` when `cas` is given.
pub(crate) fn delete_line(key_token: &[u8], base64: bool, cas: Option<u64>) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 28);
    line.put_slice(b"md ");
    line.put_slice(key_token);
    if base64 {
        line.put_slice(b" b");
    }
    if let Some(cas) = cas {
        line.put_slice(format!(" C{cas}").as_bytes());
    }
    line.put_slice(b"\r\n");
    line.freeze()
}
