//! SHA-1 (FIPS 180-4, from the `sha1` crate), only as the point hash of the
//! Dalli ring: Dalli names its points by SHA-1 digests, so a compatible ring
//! needs the same digest. Not for anything security related. No I/O here.

/// The 20-byte SHA-1 digest of `data` (the `sha1` crate's).
pub fn digest(data: &[u8]) -> [u8; 20] {
    use ::sha1::Digest as _;
    ::sha1::Sha1::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn digests_match_the_fips_180_examples() {
        assert_eq!(
            hex(&digest(b"")),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        assert_eq!(
            hex(&digest(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex(&digest(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        // One million 'a': many blocks.
        assert_eq!(
            hex(&digest(&vec![b'a'; 1_000_000])),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
    }
}
