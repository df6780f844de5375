//! Meta `b` keys: base64 as memcached 1.6.18 reads and writes it, with
//! the `base64` crate. A file of its own, not part of `meta`: `request`
//! decodes a rejected request's key too (the key memcached deletes), and
//! `meta` imports `request`.

use super::MAX_KEY_BYTES;

/// A decoded `b` key: inline up to the longest a valid token decodes to
/// (250 base64 bytes), so decoding allocates nothing.
pub type DecodedKey = smallvec::SmallVec<[u8; 192]>;

/// The `base64` engine for `b` keys: the standard alphabet and padding, and
/// like memcached it keeps the key when the last symbol before the padding
/// has bits RFC 4648 wants zero (`Zh==` is `f`, as `Zg==` is).
const KEY_ENGINE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// Decodes a `b` key the way memcached 1.6.18 does, which is more lenient than
/// RFC 4648: bytes outside the base64 alphabet are skipped, the alphabet bytes
/// (`=` included) must come in groups of four, and decoding stops after the
/// first group holding `=` (one or two of them, anywhere in the group; three or
/// four fail). Returns `None` where memcached fails. The key memcached stores,
/// and so the key the ring must hash, is exactly this result.
///
/// A token in RFC 4648's form (what clients send) goes to [`KEY_ENGINE`] as it
/// is; any other is first brought to that form by [`lenient_groups`].
pub fn decode_key(token: &[u8]) -> Option<DecodedKey> {
    use base64::Engine as _;
    let alphabet = token.iter().filter(|&&b| in_key_alphabet(b)).count();
    if alphabet == 0 || alphabet % 4 != 0 {
        return None;
    }
    let unpadded = token.strip_suffix(b"=").unwrap_or(token);
    let unpadded = unpadded.strip_suffix(b"=").unwrap_or(unpadded);
    let mut out = DecodedKey::from_elem(0, alphabet / 4 * 3);
    if alphabet == token.len() && !unpadded.contains(&b'=') {
        let decoded = KEY_ENGINE.decode_slice(token, &mut out).ok()?;
        out.truncate(decoded);
        return Some(out);
    }
    let (groups, padding) = lenient_groups(token)?;
    let decoded = KEY_ENGINE.decode_slice(&groups[..], &mut out).ok()?;
    out.truncate(decoded - padding);
    Some(out)
}

/// A base64 symbol or `=`, the bytes memcached's decoder does not skip.
fn in_key_alphabet(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')
}

/// What memcached decodes of a token not in RFC 4648's form, as groups of four
/// symbols the engine decodes the same way, and the bytes to cut off after:
/// the alphabet bytes up to the end of the first group holding `=`, each `=`
/// read as `A` (a zero sextet, as memcached reads it); one byte is cut per
/// `=`, and three or four of them fail (`None`).
fn lenient_groups(token: &[u8]) -> Option<(smallvec::SmallVec<[u8; MAX_KEY_BYTES + 2]>, usize)> {
    let mut groups = smallvec::SmallVec::new();
    let mut padding = 0;
    for &b in token.iter().filter(|&&b| in_key_alphabet(b)) {
        if b == b'=' {
            padding += 1;
        }
        groups.push(if b == b'=' { b'A' } else { b });
        if padding > 0 && groups.len() % 4 == 0 {
            break;
        }
    }
    (padding <= 2).then_some((groups, padding))
}

/// Encodes `key` as the standard, padded base64 that [`decode_key`] (and so
/// memcached's `b` flag) reads back to exactly `key`.
pub fn encode_key(key: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(key)
}
