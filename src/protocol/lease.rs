//! Hand-off leases: how one is placed, and how a reader knows one.
//!
//! A hand-off copy (docs/handoff.md) can race a write of another sidecar: a
//! value read from the previous owner may land on the new owner just after
//! another sidecar deleted or overwrote the key there. The cure is a lease:
//! a short-lived placeholder item added to the new owner first, which the
//! copy then replaces only by the lease's cas, so any write in between makes
//! the copy fail instead of undoing the write. memcached has no invisible
//! item, so every reader must know a lease when it sees one: to a reader a
//! lease is a miss.
//!
//! This file is that recognition, and the wire form of a lease: client flags
//! [`LEASE_FLAGS`] and data [`LEASE_MARKER`], placed by [`lease_request`]
//! (the copy itself is `plan::handoff::LeaseCopy`'s). A lease is an item with
//! exactly those flags whose data starts or ends with the marker (an
//! `append` or `prepend` that reached a lease extends it at one end); any
//! other item, however alike, is a value.
//!
//! Pure: bytes in, answers out.

use bytes::{BufMut, Bytes, BytesMut};

/// The client flags of a lease: "mlk1" in ASCII.
pub const LEASE_FLAGS: u32 = 0x6d6c_6b31;

/// [`LEASE_FLAGS`] as memcached prints it.
const LEASE_FLAGS_DECIMAL: &[u8] = b"1835821873";

/// The data of a lease. A NUL at each end: no text value a client stores
/// looks like it.
pub const LEASE_MARKER: &[u8] = b"\0memring hand-off lease\0";

/// How long a lease lives, in seconds: far longer than the copy's round
/// trips that replace it, and short enough that a lease its copier never
/// replaced (a connection lost meanwhile) keeps the key a miss only briefly.
pub const LEASE_TTL_SECONDS: u32 = 5;

/// The `ms` that places a lease for `key_token` (base64 when `base64`):
/// only where the key is absent (`ME`, so it never hides a value), and
/// answering the lease's cas (`c`), by which the copy replaces it.
pub fn lease_request(key_token: &[u8], base64: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 64);
    line.put_slice(b"ms ");
    line.put_slice(key_token);
    line.put_slice(
        format!(
            " {} F{LEASE_FLAGS} T{LEASE_TTL_SECONDS} ME c",
            LEASE_MARKER.len()
        )
        .as_bytes(),
    );
    if base64 {
        line.put_slice(b" b");
    }
    line.put_slice(b"\r\n");
    line.put_slice(LEASE_MARKER);
    line.put_slice(b"\r\n");
    line.freeze()
}

/// Whether an item with client flags `flags` (as memcached prints them;
/// `None` when the reply does not show them), `size` bytes of data (`None`
/// when unknown) and `data` (`None` when the reply carries none) is a lease.
///
/// Exact where the reply shows the data: the lease's flags, and the marker
/// at one end (an `append` or a `prepend` that reached a lease extends it at
/// one end). A value with other flags, or with the lease's flags and the
/// marker elsewhere, is a value. Without the data, the flags and a size the
/// marker fits in; without the flags, never (memring adds `f` to the `mg`
/// requests of its clients, so this only happens to the few it cannot tag).
fn is_lease(flags: Option<&[u8]>, size: Option<usize>, data: Option<&[u8]>) -> bool {
    if flags != Some(LEASE_FLAGS_DECIMAL) {
        return false;
    }
    match data {
        Some(data) => data.starts_with(LEASE_MARKER) || data.ends_with(LEASE_MARKER),
        None => size.map_or(true, |size| size >= LEASE_MARKER.len()),
    }
}

/// Whether a classic `VALUE` block (header, data, `\r\n`) holds a lease.
/// `key_end` is where the key ends in the header (the flags follow it).
pub fn classic_value_is_lease(block: &[u8], key_end: usize) -> bool {
    let Some(after_key) = block.get(key_end + 1..) else {
        return false;
    };
    // Nearly every value stops here: its flags are not the lease's.
    if !after_key.starts_with(LEASE_FLAGS_DECIMAL)
        || after_key.get(LEASE_FLAGS_DECIMAL.len()) != Some(&b' ')
    {
        return false;
    }
    let Some(header_end) = memchr::memchr(b'\n', block) else {
        return false;
    };
    let data = &block[header_end + 1..block.len().saturating_sub(2).max(header_end + 1)];
    is_lease(Some(LEASE_FLAGS_DECIMAL), None, Some(data))
}

/// Whether a meta `mg` reply (line, and for `VA` its data and `\r\n`)
/// shows a lease: a `VA` or an `HD` whose `f` token is the lease's flags.
pub fn meta_reply_is_lease(reply: &[u8]) -> bool {
    let is_value = reply.starts_with(b"VA ");
    if !is_value && !reply.starts_with(b"HD") {
        return false;
    }
    let Some(line_end) = memchr::memchr(b'\n', reply) else {
        return false;
    };
    let line = reply[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&reply[..line_end]);
    let mut tokens = line.split(|&b| b == b' ').skip(1);
    let mut size = None;
    if is_value {
        size = tokens
            .next()
            .and_then(|len| std::str::from_utf8(len).ok()?.parse().ok());
    }
    let mut flags = None;
    for token in tokens {
        match token.split_first() {
            Some((b'f', number)) => flags = Some(number),
            Some((b's', number)) if size.is_none() => {
                size = std::str::from_utf8(number)
                    .ok()
                    .and_then(|n| n.parse().ok());
            }
            _ => {}
        }
    }
    // Nearly every reply stops here.
    if flags != Some(LEASE_FLAGS_DECIMAL) {
        return false;
    }
    let data =
        is_value.then(|| &reply[line_end + 1..reply.len().saturating_sub(2).max(line_end + 1)]);
    is_lease(flags, size, data)
}

/// The `c` token of an `mg` reply (the item's cas), if it has one.
pub fn meta_reply_cas(reply: &[u8]) -> Option<u64> {
    let line_end = memchr::memchr(b'\n', reply)?;
    let line = &reply[..line_end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let skip = if reply.starts_with(b"VA ") { 2 } else { 1 };
    let token = line
        .split(|&b| b == b' ')
        .skip(skip)
        .find(|token| token.first() == Some(&b'c'))?;
    std::str::from_utf8(&token[1..]).ok()?.parse().ok()
}

/// For an `mg` reply that [`meta_reply_is_lease`], the `EN` line memcached
/// sends for a miss: the reply's `O` and `k` tokens in their order, and
/// nothing else. `base64_key` is the request's key token when it carried
/// `b`: a hit echoes the key decoded, a miss (memcached 1.6.18) echoes the
/// token as sent, followed by `b`.
pub fn meta_miss(reply: &[u8], base64_key: Option<&[u8]>) -> Bytes {
    let line_end = memchr::memchr(b'\n', reply).unwrap_or(reply.len());
    let line = &reply[..line_end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut miss = BytesMut::with_capacity(line.len().min(300) + 2);
    miss.put_slice(b"EN");
    let skip = if reply.starts_with(b"VA ") { 2 } else { 1 };
    for token in line.split(|&b| b == b' ').skip(skip) {
        match (token.first(), base64_key) {
            (Some(b'k'), Some(key)) => {
                miss.put_slice(b" k");
                miss.put_slice(key);
                miss.put_slice(b" b");
            }
            (Some(b'k' | b'O'), _) => {
                miss.put_u8(b' ');
                miss.put_slice(token);
            }
            _ => {}
        }
    }
    miss.put_slice(b"\r\n");
    miss.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classic_block(key: &str, data: &[u8], flags: u32) -> Vec<u8> {
        let mut block = format!("VALUE {key} {flags} {}\r\n", data.len()).into_bytes();
        block.extend_from_slice(data);
        block.extend_from_slice(b"\r\n");
        block
    }

    #[test]
    fn a_value_is_a_lease_only_with_the_leases_flags_and_marker() {
        let lease = classic_block("k", LEASE_MARKER, LEASE_FLAGS);
        assert!(classic_value_is_lease(&lease, 7));
        // The marker with other flags, and other data with the lease's
        // flags, are values.
        assert!(!classic_value_is_lease(
            &classic_block("k", LEASE_MARKER, 0),
            7
        ));
        assert!(!classic_value_is_lease(
            &classic_block("k", b"x", LEASE_FLAGS),
            7
        ));
        // Flags that merely start with the lease's digits.
        let longer = format!("VALUE k {}0 24\r\n", LEASE_FLAGS).into_bytes();
        assert!(!classic_value_is_lease(&longer, 7));
        // A gets reply carries a cas after the length.
        let mut with_cas = format!("VALUE key {LEASE_FLAGS} 24 99\r\n").into_bytes();
        with_cas.extend_from_slice(LEASE_MARKER);
        with_cas.extend_from_slice(b"\r\n");
        assert!(classic_value_is_lease(&with_cas, 9));
    }

    fn va(data: &[u8], flags: &str) -> Vec<u8> {
        let mut reply = format!("VA {}{flags}\r\n", data.len()).into_bytes();
        reply.extend_from_slice(data);
        reply.extend_from_slice(b"\r\n");
        reply
    }

    #[test]
    fn a_lease_an_append_or_prepend_reached_is_still_a_lease() {
        let mut appended = LEASE_MARKER.to_vec();
        appended.extend_from_slice(b".v7");
        let mut prepended = b"v6".to_vec();
        prepended.extend_from_slice(LEASE_MARKER);
        for data in [&appended, &prepended] {
            assert!(classic_value_is_lease(
                &classic_block("k", data, LEASE_FLAGS),
                7
            ));
            assert!(meta_reply_is_lease(&va(data, &format!(" f{LEASE_FLAGS}"))));
        }
    }

    #[test]
    fn values_that_merely_look_like_leases_are_values() {
        // The marker in the middle, under the lease's flags.
        let mut middle = b"front".to_vec();
        middle.extend_from_slice(LEASE_MARKER);
        middle.extend_from_slice(b".v7");
        assert!(!classic_value_is_lease(
            &classic_block("k", &middle, LEASE_FLAGS),
            7
        ));
        assert!(!meta_reply_is_lease(&va(
            &middle,
            &format!(" f{LEASE_FLAGS}")
        )));
        // The marker at an end, under other flags or none shown.
        let mut appended = LEASE_MARKER.to_vec();
        appended.extend_from_slice(b".v7");
        assert!(!meta_reply_is_lease(&va(&appended, "")));
        assert!(!meta_reply_is_lease(&va(&appended, " f0")));
        assert!(!meta_reply_is_lease(&va(b"plain", "")));
        // Without data: the flags and a size the marker fits in.
        assert!(meta_reply_is_lease(
            format!("HD s24 f{LEASE_FLAGS} t3\r\n").as_bytes()
        ));
        assert!(!meta_reply_is_lease(
            format!("HD s23 f{LEASE_FLAGS}\r\n").as_bytes()
        ));
        assert!(!meta_reply_is_lease(b"HD s24 f0\r\n"));
        assert!(!meta_reply_is_lease(b"HD s24\r\n"));
        assert!(!meta_reply_is_lease(b"EN\r\n"));
    }

    #[test]
    fn a_lease_request_stores_what_readers_take_for_a_lease() {
        let request = lease_request(b"a2V5", true);
        let line_end = memchr::memchr(b'\n', &request).unwrap();
        assert_eq!(
            &request[..=line_end],
            format!("ms a2V5 24 F{LEASE_FLAGS} T{LEASE_TTL_SECONDS} ME c b\r\n").as_bytes()
        );
        // What memcached answers an `mg … v f` for the stored lease.
        let mut stored = format!("VA 24 f{LEASE_FLAGS}\r\n").into_bytes();
        stored.extend_from_slice(&request[line_end + 1..]);
        assert!(meta_reply_is_lease(&stored));
    }

    #[test]
    fn a_meta_lease_reads_as_memcacheds_miss_line() {
        let mut reply = format!("VA 24 t30 kmy:key O77 f{LEASE_FLAGS} c5\r\n").into_bytes();
        reply.extend_from_slice(LEASE_MARKER);
        reply.extend_from_slice(b"\r\n");
        assert_eq!(&meta_miss(&reply, None)[..], b"EN kmy:key O77\r\n");
        assert_eq!(&meta_miss(b"HD O1 s24 kk\r\n", None)[..], b"EN O1 kk\r\n");
        // A base64 key: a hit echoes it decoded, a miss as sent, with `b`.
        assert_eq!(
            &meta_miss(b"HD O5 klease0 s24\r\n", Some(b"bGVhc2Uw"))[..],
            b"EN O5 kbGVhc2Uw b\r\n"
        );
        assert_eq!(
            &meta_miss(b"HD O5\r\n", Some(b"bGVhc2Uw"))[..],
            b"EN O5\r\n"
        );
        let mut bare = b"VA 24\r\n".to_vec();
        bare.extend_from_slice(LEASE_MARKER);
        bare.extend_from_slice(b"\r\n");
        assert_eq!(&meta_miss(&bare, None)[..], b"EN\r\n");
        assert_eq!(meta_reply_cas(b"HD s24 c77 f1\r\n"), Some(77));
        assert_eq!(meta_reply_cas(&bare), None);
    }
}
