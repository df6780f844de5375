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
//! (the copy itself is `session::copy_check`'s). An `append` or `prepend`
//! that reaches a lease extends its data; such an item is still a lease
//! (the marker at one end), and still a miss.
//!
//! Pure: bytes in, answers out.

use bytes::{BufMut, Bytes, BytesMut};
use memchr::memmem;

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

/// Whether `data` with client flags `flags` (as memcached prints them;
/// `None` when the reply does not show them) is a lease.
fn is_lease(flags: Option<&[u8]>, data: &[u8]) -> bool {
    match flags {
        Some(flags) if flags != LEASE_FLAGS_DECIMAL => false,
        // The flags say lease: the marker anywhere (an append and a
        // prepend may both have reached it).
        Some(_) => memmem::find(data, LEASE_MARKER).is_some(),
        // Without the flags, the marker at one end.
        None => data.starts_with(LEASE_MARKER) || data.ends_with(LEASE_MARKER),
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
    is_lease(Some(LEASE_FLAGS_DECIMAL), data)
}

/// Whether a meta reply (line, data and `\r\n`) is a `VA` holding a lease.
pub fn meta_value_is_lease(reply: &[u8]) -> bool {
    if !reply.starts_with(b"VA ") {
        return false;
    }
    let Some(line_end) = memchr::memchr(b'\n', reply) else {
        return false;
    };
    let line = reply[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&reply[..line_end]);
    let data = &reply[line_end + 1..reply.len().saturating_sub(2).max(line_end + 1)];
    if data.len() < LEASE_MARKER.len() {
        return false;
    }
    let flags = line
        .split(|&b| b == b' ')
        .skip(2)
        .find_map(|token| token.strip_prefix(b"f"));
    is_lease(flags, data)
}

/// For a meta `VA` reply holding a lease, the `EN` line memcached sends for
/// a miss: it keeps the reply's `k`, `b` and `O` tokens, in their order,
/// and drops the rest (memcached 1.6.18 echoes just those on a miss).
pub fn meta_miss_for_lease(reply: &[u8]) -> Option<Bytes> {
    if !meta_value_is_lease(reply) {
        return None;
    }
    let line_end = memchr::memchr(b'\n', reply)?;
    let line = reply[..line_end].strip_suffix(b"\r")?;
    let mut miss = BytesMut::with_capacity(line.len() + 2);
    miss.put_slice(b"EN");
    for token in line.split(|&b| b == b' ').skip(2) {
        if token.starts_with(b"k") || token.starts_with(b"O") || token == b"b" {
            miss.put_u8(b' ');
            miss.put_slice(token);
        }
    }
    miss.put_slice(b"\r\n");
    Some(miss.freeze())
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

    #[test]
    fn a_lease_an_append_or_prepend_reached_is_still_a_lease() {
        let mut both = b"front".to_vec();
        both.extend_from_slice(LEASE_MARKER);
        both.extend_from_slice(b".v7");
        assert!(classic_value_is_lease(
            &classic_block("k", &both, LEASE_FLAGS),
            7
        ));
        // Without flags (a meta reply that did not ask for them) the marker
        // must be at one end.
        let mut appended = LEASE_MARKER.to_vec();
        appended.extend_from_slice(b".v7");
        let va = |data: &[u8], flags: &str| {
            let mut reply = format!("VA {}{flags}\r\n", data.len()).into_bytes();
            reply.extend_from_slice(data);
            reply.extend_from_slice(b"\r\n");
            reply
        };
        assert!(meta_value_is_lease(&va(&appended, "")));
        assert!(!meta_value_is_lease(&va(&both, "")));
        assert!(meta_value_is_lease(&va(&both, &format!(" f{LEASE_FLAGS}"))));
        assert!(!meta_value_is_lease(&va(&both, " f0")));
        assert!(!meta_value_is_lease(&va(b"plain", "")));
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
        assert!(meta_value_is_lease(&stored));
    }

    #[test]
    fn a_meta_lease_reads_as_memcacheds_miss_line() {
        let mut reply = format!("VA 24 t30 kmy:key b O77 f{LEASE_FLAGS} c5\r\n").into_bytes();
        reply.extend_from_slice(LEASE_MARKER);
        reply.extend_from_slice(b"\r\n");
        assert_eq!(
            meta_miss_for_lease(&reply).as_deref(),
            Some(&b"EN kmy:key b O77\r\n"[..])
        );
        let mut bare = b"VA 24\r\n".to_vec();
        bare.extend_from_slice(LEASE_MARKER);
        bare.extend_from_slice(b"\r\n");
        assert_eq!(meta_miss_for_lease(&bare).as_deref(), Some(&b"EN\r\n"[..]));
        assert_eq!(meta_miss_for_lease(b"VA 1 f0\r\nx\r\n"), None);
        assert_eq!(meta_miss_for_lease(b"HD\r\n"), None);
    }
}
