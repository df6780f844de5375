//! Where a token ends, found eight bytes at a time: a key's bytes are most
//! of a get's request line and of a `VALUE` header, and a byte loop spent
//! about five instructions on each. Pure, no I/O.

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
const ABOVE_SPACE: u64 = u64::from_ne_bytes([b' ' + 1; 8]);
const DEL: u64 = u64::from_ne_bytes([0x7f; 8]);

/// Whether some byte of `word` is a control byte, a space or DEL. Exact as
/// an answer for the whole word: a borrow between bytes only ever follows a
/// byte that qualifies itself.
#[inline]
fn may_stop(word: u64) -> bool {
    let below = word.wrapping_sub(ABOVE_SPACE) & !word & HIGHS;
    let del = word ^ DEL;
    let del = del.wrapping_sub(ONES) & !del & HIGHS;
    below | del != 0
}

/// The first byte of `bytes` that `stops` holds for; `stops` may hold only
/// for control bytes, the space and DEL (eight bytes with none of them are
/// passed over whole).
#[inline]
pub(crate) fn first_stop(bytes: &[u8], stops: impl Fn(u8) -> bool) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let word = u64::from_ne_bytes(chunk.try_into().expect("chunks of eight bytes"));
        if may_stop(word) {
            if let Some(i) = chunk.iter().position(|&b| stops(b)) {
                return Some(at + i);
            }
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| stops(b))
        .map(|i| at + i)
}

/// A byte no key may hold: memring refuses control bytes and DEL in keys,
/// and a space ends one.
#[inline]
pub(crate) fn ends_key(b: u8) -> bool {
    b <= b' ' || b == 0x7f
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(bytes: &[u8], stops: impl Fn(u8) -> bool) -> Option<usize> {
        bytes.iter().position(|&b| stops(b))
    }

    fn ends_line_token(b: u8) -> bool {
        matches!(b, b' ' | b'\r' | b'\n' | 0)
    }

    #[test]
    fn the_first_stop_is_found_at_every_place_among_bytes_close_to_one() {
        // Bytes next to the stops' values without being one.
        let fillers = [b'!', b'~', 0x80, 0xff, b'a', b'\t'];
        for len in 0..20 {
            for at in 0..len {
                for stop in [0u8, b'\t', b'\r', b'\n', b' ', 0x7f] {
                    for filler in fillers {
                        let mut bytes = vec![filler; len];
                        bytes[at] = stop;
                        assert_eq!(first_stop(&bytes, ends_key), naive(&bytes, ends_key));
                        assert_eq!(
                            first_stop(&bytes, ends_line_token),
                            naive(&bytes, ends_line_token),
                            "{bytes:?}"
                        );
                    }
                }
            }
            for filler in fillers {
                let bytes = vec![filler; len];
                assert_eq!(first_stop(&bytes, ends_key), naive(&bytes, ends_key));
            }
        }
        for b in 0..=255u8 {
            let bytes = [b'k', b'k', b'k', b'k', b'k', b'k', b'k', b, b'k', b];
            assert_eq!(first_stop(&bytes, ends_key), naive(&bytes, ends_key), "{b}");
            assert_eq!(
                first_stop(&bytes, ends_line_token),
                naive(&bytes, ends_line_token),
                "{b}"
            );
        }
    }

    proptest! {
        #[test]
        fn first_stop_matches_a_byte_loop(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(first_stop(&bytes, ends_key), naive(&bytes, ends_key));
            prop_assert_eq!(first_stop(&bytes, ends_line_token), naive(&bytes, ends_line_token));
        }

        #[test]
        fn first_stop_matches_a_byte_loop_on_key_like_bytes(
            bytes in proptest::collection::vec(prop_oneof![30 => 0x21u8..0x7f, 1 => any::<u8>()], 0..64),
        ) {
            prop_assert_eq!(first_stop(&bytes, ends_key), naive(&bytes, ends_key));
            prop_assert_eq!(first_stop(&bytes, ends_line_token), naive(&bytes, ends_line_token));
        }
    }
}
