//! twemproxy's key hash functions, by the names its `hash:` setting uses, each
//! returning the same 32-bit value twemproxy 0.5 computes.
//!
//! Several of them are not the textbook algorithm, and the differences decide
//! where keys live, so they are kept on purpose:
//! - `fnv1a_64` is a 32-bit computation (the 64-bit offset basis and prime
//!   truncated to 32 bits), and `fnv1_64` keeps only the low 32 bits;
//! - twemproxy reads key bytes as C `char`, which is signed on x86-64, so in
//!   `fnv1_64`, `fnv1a_64`, `fnv1_32`, `fnv1a_32`, `one_at_a_time` and the
//!   last byte of a 3-byte tail in `hsieh` a byte ≥ 0x80 is sign-extended
//!   (0x80 becomes 0xFFFF_FF80) before it is mixed in;
//! - `crc16` never truncates its register to 16 bits, and `crc32` is
//!   libmemcached's 15-bit variant (`crc32a` is the standard CRC-32).
//!
//! No I/O here.

use super::md5;

/// A twemproxy key hash, by its configuration name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashFunction {
    OneAtATime,
    Md5,
    Crc16,
    Crc32,
    Crc32a,
    Fnv1_64,
    Fnv1a64,
    Fnv1_32,
    Fnv1a32,
    Hsieh,
    Murmur,
    Jenkins,
}

impl HashFunction {
    /// Every function, for listing the accepted names.
    pub const ALL: [HashFunction; 12] = [
        HashFunction::OneAtATime,
        HashFunction::Md5,
        HashFunction::Crc16,
        HashFunction::Crc32,
        HashFunction::Crc32a,
        HashFunction::Fnv1_64,
        HashFunction::Fnv1a64,
        HashFunction::Fnv1_32,
        HashFunction::Fnv1a32,
        HashFunction::Hsieh,
        HashFunction::Murmur,
        HashFunction::Jenkins,
    ];

    /// The name twemproxy's `hash:` and memring's `hash =` use.
    pub fn name(self) -> &'static str {
        match self {
            HashFunction::OneAtATime => "one_at_a_time",
            HashFunction::Md5 => "md5",
            HashFunction::Crc16 => "crc16",
            HashFunction::Crc32 => "crc32",
            HashFunction::Crc32a => "crc32a",
            HashFunction::Fnv1_64 => "fnv1_64",
            HashFunction::Fnv1a64 => "fnv1a_64",
            HashFunction::Fnv1_32 => "fnv1_32",
            HashFunction::Fnv1a32 => "fnv1a_32",
            HashFunction::Hsieh => "hsieh",
            HashFunction::Murmur => "murmur",
            HashFunction::Jenkins => "jenkins",
        }
    }

    /// The function called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<HashFunction> {
        HashFunction::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The 32-bit hash of `key`.
    #[inline]
    pub fn hash(self, key: &[u8]) -> u32 {
        match self {
            HashFunction::OneAtATime => one_at_a_time(key),
            HashFunction::Md5 => md5_hash(key),
            HashFunction::Crc16 => crc16(key),
            HashFunction::Crc32 => crc32(key),
            HashFunction::Crc32a => crc32a(key),
            HashFunction::Fnv1_64 => fnv1_64(key),
            HashFunction::Fnv1a64 => fnv1a_64(key),
            HashFunction::Fnv1_32 => fnv1_32(key),
            HashFunction::Fnv1a32 => fnv1a_32(key),
            HashFunction::Hsieh => hsieh(key),
            HashFunction::Murmur => murmur(key),
            HashFunction::Jenkins => jenkins(key),
        }
    }
}

/// A key byte as C reads it through a signed `char`, widened to 32 bits.
#[inline]
fn signed(byte: u8) -> u32 {
    byte as i8 as i32 as u32
}

/// The `index`-th little-endian 32-bit word of a digest: ketama takes four
/// points, or one key hash, from each MD5 digest this way.
#[inline]
pub fn digest_word(digest: &[u8; 16], index: usize) -> u32 {
    let at = index * 4;
    u32::from_le_bytes([digest[at], digest[at + 1], digest[at + 2], digest[at + 3]])
}

fn md5_hash(key: &[u8]) -> u32 {
    digest_word(&md5::digest(key), 0)
}

const FNV_64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV_32_OFFSET: u32 = 0x811c_9dc5;
const FNV_32_PRIME: u32 = 0x0100_0193;

fn fnv1_64(key: &[u8]) -> u32 {
    let mut hash = FNV_64_OFFSET;
    for &byte in key {
        hash = hash.wrapping_mul(FNV_64_PRIME);
        hash ^= byte as i8 as i64 as u64;
    }
    hash as u32
}

fn fnv1a_64(key: &[u8]) -> u32 {
    let mut hash = FNV_64_OFFSET as u32;
    for &byte in key {
        hash ^= signed(byte);
        hash = hash.wrapping_mul(FNV_64_PRIME as u32);
    }
    hash
}

fn fnv1_32(key: &[u8]) -> u32 {
    let mut hash = FNV_32_OFFSET;
    for &byte in key {
        hash = hash.wrapping_mul(FNV_32_PRIME);
        hash ^= signed(byte);
    }
    hash
}

fn fnv1a_32(key: &[u8]) -> u32 {
    let mut hash = FNV_32_OFFSET;
    for &byte in key {
        hash ^= signed(byte);
        hash = hash.wrapping_mul(FNV_32_PRIME);
    }
    hash
}

fn one_at_a_time(key: &[u8]) -> u32 {
    let mut value: u32 = 0;
    for &byte in key {
        value = value.wrapping_add(signed(byte));
        value = value.wrapping_add(value << 10);
        value ^= value >> 6;
    }
    value = value.wrapping_add(value << 3);
    value ^= value >> 11;
    value.wrapping_add(value << 15)
}

/// CRC-16/XMODEM table (polynomial 0x1021, not reflected).
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

fn crc16(key: &[u8]) -> u32 {
    // The register is 32 bits wide and never masked, so bits above 16
    // survive: twemproxy's crc16("apple") is 3662830516.
    let mut crc: u32 = 0;
    for &byte in key {
        let index = ((crc >> 8) ^ u32::from(byte)) & 0xff;
        crc = (crc << 8) ^ u32::from(CRC16_TABLE[index as usize]);
    }
    crc
}

/// CRC-32 table (reflected polynomial 0xEDB88320).
const CRC32_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

fn crc32_register(key: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for &byte in key {
        crc = (crc >> 8) ^ CRC32_TABLE[((crc ^ u32::from(byte)) & 0xff) as usize];
    }
    crc
}

fn crc32(key: &[u8]) -> u32 {
    // libmemcached's variant: 15 bits taken from the middle of the CRC.
    ((!crc32_register(key)) >> 16) & 0x7fff
}

fn crc32a(key: &[u8]) -> u32 {
    !crc32_register(key)
}

fn hsieh(key: &[u8]) -> u32 {
    if key.is_empty() {
        return 0;
    }
    let sixteen = |at: usize| u32::from(key[at]) | (u32::from(key[at + 1]) << 8);
    let mut hash: u32 = 0;
    let mut at = 0;
    for _ in 0..key.len() / 4 {
        hash = hash.wrapping_add(sixteen(at));
        let tmp = (sixteen(at + 2) << 11) ^ hash;
        hash = (hash << 16) ^ tmp;
        at += 4;
        hash = hash.wrapping_add(hash >> 11);
    }
    match key.len() % 4 {
        3 => {
            hash = hash.wrapping_add(sixteen(at));
            hash ^= hash << 16;
            hash ^= signed(key[at + 2]) << 18;
            hash = hash.wrapping_add(hash >> 11);
        }
        2 => {
            hash = hash.wrapping_add(sixteen(at));
            hash ^= hash << 11;
            hash = hash.wrapping_add(hash >> 17);
        }
        1 => {
            hash = hash.wrapping_add(u32::from(key[at]));
            hash ^= hash << 10;
            hash = hash.wrapping_add(hash >> 1);
        }
        _ => {}
    }
    hash ^= hash << 3;
    hash = hash.wrapping_add(hash >> 5);
    hash ^= hash << 4;
    hash = hash.wrapping_add(hash >> 17);
    hash ^= hash << 25;
    hash.wrapping_add(hash >> 6)
}

fn murmur(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let length = key.len() as u32;
    let mut h = 0xdead_beef_u32.wrapping_mul(length) ^ length;
    let mut blocks = key.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// Bob Jenkins' lookup3 (`hashlittle`) with initial value 13, as twemproxy
/// uses it. On a little-endian machine its word-at-a-time and byte-at-a-time
/// paths agree, so reading little-endian words here gives the same value
/// whatever the alignment of the key was in twemproxy's buffer.
fn jenkins(key: &[u8]) -> u32 {
    const INITIAL: u32 = 13;
    let init = 0xdead_beef_u32
        .wrapping_add(key.len() as u32)
        .wrapping_add(INITIAL);
    let (mut a, mut b, mut c) = (init, init, init);
    if key.is_empty() {
        return c;
    }
    let word = |bytes: &[u8]| {
        let mut padded = [0u8; 4];
        padded[..bytes.len()].copy_from_slice(bytes);
        u32::from_le_bytes(padded)
    };
    let mut rest = key;
    while rest.len() > 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        mix(&mut a, &mut b, &mut c);
        rest = &rest[12..];
    }
    // The last 1 to 12 bytes, zero-padded.
    let mut last = [0u8; 12];
    last[..rest.len()].copy_from_slice(rest);
    a = a.wrapping_add(word(&last[0..4]));
    b = b.wrapping_add(word(&last[4..8]));
    c = c.wrapping_add(word(&last[8..12]));
    finish(&mut a, &mut b, &mut c);
    c
}

#[inline]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

#[inline]
fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_matches_twemproxys_published_vector_for_apple() {
        // twemproxy's src/test_all.c (the same values as libmemcached's
        // tests/hash_results.h).
        let expected = [
            ("one_at_a_time", 2_297_466_611),
            ("md5", 3_195_025_439),
            ("crc16", 3_662_830_516),
            ("crc32", 10_542),
            ("crc32a", 2_838_417_488),
            ("fnv1_32", 67_176_023),
            ("fnv1a_32", 280_767_167),
            ("fnv1_64", 473_199_127),
            ("fnv1a_64", 1_488_911_807),
            ("hsieh", 3_738_850_110),
            ("jenkins", 1_442_444_624),
            ("murmur", 4_142_305_122u32),
        ];
        assert_eq!(expected.len(), HashFunction::ALL.len());
        for (name, value) in expected {
            let function = HashFunction::from_name(name).expect(name);
            assert_eq!(function.hash(b"apple"), value, "{name}");
            assert_eq!(function.name(), name);
        }
    }

    #[test]
    fn ketama_point_words_match_twemproxys_published_vectors() {
        let digest = md5::digest(b"server1-8");
        assert_eq!(digest_word(&digest, 0), 3_853_726_576);
        assert_eq!(digest_word(&digest, 3), 2_667_054_752);
    }

    #[test]
    fn unknown_names_are_not_hashes() {
        assert_eq!(HashFunction::from_name("fnv1a"), None);
        assert_eq!(HashFunction::from_name("MD5"), None);
    }

    #[test]
    fn high_bytes_are_sign_extended_where_twemproxy_reads_signed_chars() {
        // One FNV-1a step on 0x80: xor with 0xFFFFFF80, not 0x80.
        let sign_extended = (0x8422_2325u32 ^ 0xffff_ff80).wrapping_mul(0x1b3);
        assert_eq!(HashFunction::Fnv1a64.hash(&[0x80]), sign_extended);
        let zero_extended = (0x8422_2325u32 ^ 0x80).wrapping_mul(0x1b3);
        assert_ne!(HashFunction::Fnv1a64.hash(&[0x80]), zero_extended);
        // murmur and md5 read unsigned bytes: 0x80 and 0x80 + 256 cannot be
        // told apart, but a key with 0x80 differs from one with 0x00.
        assert_ne!(
            HashFunction::Murmur.hash(&[0x80]),
            HashFunction::Murmur.hash(&[0x00])
        );
    }

    #[test]
    fn jenkins_handles_every_tail_length() {
        // Lengths 0..=25 cover an empty key, every tail length and more than
        // one 12-byte block; each must differ from its neighbour.
        let key: Vec<u8> = (0u8..25).collect();
        let hashes: Vec<u32> = (0..=key.len()).map(|n| jenkins(&key[..n])).collect();
        assert_eq!(hashes[0], 0xdead_beef_u32.wrapping_add(13));
        for pair in hashes.windows(2) {
            assert_ne!(pair[0], pair[1]);
        }
    }
}
