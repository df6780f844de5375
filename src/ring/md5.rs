//! MD5 (RFC 1321), only as the point and key hash of ketama rings: libketama,
//! libmemcached and twemproxy all name their points by MD5 digests, so a
//! compatible ring needs the same digest. Not for anything security related.
//! No I/O here.

/// Per-round left-rotation amounts (RFC 1321, section 3.4).
const SHIFTS: [u32; 64] = [
    7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, //
    5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, //
    4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, //
    6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
];

/// `floor(|sin(i + 1)| × 2^32)` for i in 0..64 (RFC 1321, section 3.4),
/// generated from that formula; the test below recomputes it.
const SINES: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, //
    0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501, //
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, //
    0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821, //
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, //
    0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8, //
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, //
    0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, //
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, //
    0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, //
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, //
    0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, //
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, //
    0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1, //
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, //
    0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

/// The 16-byte MD5 digest of `data`.
pub fn digest(data: &[u8]) -> [u8; 16] {
    let mut state: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    let mut chunks = data.chunks_exact(64);
    for block in &mut chunks {
        compress(&mut state, block);
    }
    // Padding: 0x80, zeros up to 56 mod 64, then the bit length (little
    // endian). The tail plus padding is one or two blocks.
    let rest = chunks.remainder();
    let mut tail = [0u8; 128];
    tail[..rest.len()].copy_from_slice(rest);
    tail[rest.len()] = 0x80;
    let tail_len = if rest.len() < 56 { 64 } else { 128 };
    let bits = (data.len() as u64).wrapping_mul(8);
    tail[tail_len - 8..tail_len].copy_from_slice(&bits.to_le_bytes());
    for block in tail[..tail_len].chunks_exact(64) {
        compress(&mut state, block);
    }
    let mut out = [0u8; 16];
    for (bytes, word) in out.chunks_exact_mut(4).zip(state) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    out
}

fn compress(state: &mut [u32; 4], block: &[u8]) {
    let mut words = [0u32; 16];
    for (word, bytes) in words.iter_mut().zip(block.chunks_exact(4)) {
        *word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
    let [mut a, mut b, mut c, mut d] = *state;
    // One step: a = b + ((a + f + sine + word) <<< shift), then rotate the
    // four registers. Written as four loops of 16 so each round's function is
    // fixed and the compiler can unroll them.
    macro_rules! round {
        ($range:expr, $f:expr, $g:expr) => {
            for i in $range {
                let f: u32 = $f(b, c, d);
                let g: usize = $g(i);
                let rotated = a
                    .wrapping_add(f)
                    .wrapping_add(SINES[i])
                    .wrapping_add(words[g])
                    .rotate_left(SHIFTS[i]);
                a = d;
                d = c;
                c = b;
                b = b.wrapping_add(rotated);
            }
        };
    }
    round!(0..16, |b: u32, c: u32, d: u32| (b & c) | (!b & d), |i| i);
    round!(16..32, |b: u32, c: u32, d: u32| (d & b) | (!d & c), |i| (5
        * i
        + 1)
        % 16);
    round!(32..48, |b: u32, c: u32, d: u32| b ^ c ^ d, |i| (3 * i + 5)
        % 16);
    round!(48..64, |b: u32, c: u32, d: u32| c ^ (b | !d), |i| (7 * i)
        % 16);
    state[0] = state[0].wrapping_add(a);
    state[1] = state[1].wrapping_add(b);
    state[2] = state[2].wrapping_add(c);
    state[3] = state[3].wrapping_add(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(data: &[u8]) -> String {
        digest(data).iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sine_table_is_the_formula() {
        for (i, &value) in SINES.iter().enumerate() {
            let expected = ((i as f64 + 1.0).sin().abs() * 4_294_967_296.0) as u32;
            assert_eq!(value, expected, "entry {i}");
        }
    }

    #[test]
    fn rfc_1321_test_suite() {
        assert_eq!(hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(hex(b"a"), "0cc175b9c0f1b6a831c399e269772661");
        assert_eq!(hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(hex(b"message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
        assert_eq!(
            hex(b"abcdefghijklmnopqrstuvwxyz"),
            "c3fcd3d76192e4007dfb496cca67e13b"
        );
        assert_eq!(
            hex(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "d174ab98d277d9f5a5611c2c9f419d9f"
        );
        assert_eq!(
            hex(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "57edf4a22be3c955ac49da2e2107b67a"
        );
    }

    #[test]
    fn lengths_around_the_padding_boundary_and_high_bytes_match_md5sum() {
        // 55, 56 and 64 bytes need one or two padding blocks; values from md5sum.
        assert_eq!(hex(&[b'x'; 55]), "04364420e25c512fd958a70738aa8f72");
        assert_eq!(hex(&[0u8; 56]), "e3c4dd21a9171fd39d208efa09bf7883");
        assert_eq!(hex(&[0u8; 64]), "3b5d3c7d207e37dceeedd301e35e2e58");
        assert_eq!(hex(&[0x80, 0xff, 0xfe]), "8863ba4be8d270433ae4579b131106fe");
    }
}
