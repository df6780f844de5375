//! What the load generator sends: keys, values, the set:get mix and the
//! encoded requests. Pure: no I/O, no tokio.
//!
//! Every key is `key:` plus 12 decimal digits, so all keys are `KEY_BYTES`
//! long. A value is its key followed by a fixed filler pattern, cut to the
//! value size, so a reply can be checked byte for byte against the key it
//! claims to answer: a proxy that mixes up replies cannot pass.

/// Length of every key: `key:` + `KEY_DIGITS` digits.
pub const KEY_BYTES: usize = 4 + KEY_DIGITS;
const KEY_DIGITS: usize = 12;
/// Keys are numbered `0..key_range`; the 12 digits bound the range.
pub const MAX_KEY_RANGE: u64 = 1_000_000_000_000;
const FILLER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// A key as sent on the wire.
pub type Key = [u8; KEY_BYTES];

/// The wire form of key number `id`.
///
/// # Panics
/// If `id >= MAX_KEY_RANGE` (the CLI rejects such ranges).
pub fn key_of(id: u64) -> Key {
    assert!(id < MAX_KEY_RANGE, "key id {id} has more than 12 digits");
    let mut key = [b'0'; KEY_BYTES];
    key[..4].copy_from_slice(b"key:");
    let mut n = id;
    for slot in key[4..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    key
}

/// The value every key is set to: the key, then filler, `size` bytes in all.
#[derive(Debug, Clone)]
pub struct ValueShape {
    template: Vec<u8>,
}

impl ValueShape {
    pub fn new(size: usize) -> ValueShape {
        let template = FILLER.iter().copied().cycle().take(size).collect();
        ValueShape { template }
    }

    pub fn size(&self) -> usize {
        self.template.len()
    }

    /// Appends the value of `key` to `out`.
    pub fn write_value(&self, key: &Key, out: &mut Vec<u8>) {
        let head = KEY_BYTES.min(self.template.len());
        out.extend_from_slice(&key[..head]);
        out.extend_from_slice(&self.template[head..]);
    }

    /// True when `data` is exactly the value of `key`.
    pub fn matches(&self, key: &[u8], data: &[u8]) -> bool {
        let head = KEY_BYTES.min(self.template.len());
        data.len() == self.template.len()
            && key.len() == KEY_BYTES
            && data[..head] == key[..head]
            && data[head..] == self.template[head..]
    }
}

/// xorshift64*: fast, deterministic per seed, and plenty for picking keys.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 step so that nearby seeds give unrelated streams; never 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..bound` (Lemire's multiply-shift; the bias is < 2^-40
    /// for any range this tool allows).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// The set:get mix as a repeating cycle: `sets` sets, then `gets` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio {
    pub sets: u32,
    pub gets: u32,
}

impl Ratio {
    /// Parses `SETS:GETS`, e.g. `1:10`. At least one side must be non-zero.
    ///
    /// # Errors
    /// Not two integers separated by `:`, or both zero.
    pub fn parse(text: &str) -> Result<Ratio, String> {
        let (s, g) = text
            .split_once(':')
            .ok_or_else(|| format!("ratio `{text}`: expected SETS:GETS such as 1:10"))?;
        let sets = s
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("ratio `{text}`: `{s}` is not a count"))?;
        let gets = g
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("ratio `{text}`: `{g}` is not a count"))?;
        if sets == 0 && gets == 0 {
            return Err(format!("ratio `{text}`: both sides are zero"));
        }
        Ok(Ratio { sets, gets })
    }

    /// True when operation number `n` of a connection is a set.
    pub fn is_set(&self, n: u64) -> bool {
        n % u64::from(self.sets + self.gets) < u64::from(self.sets)
    }
}

/// One request waiting for its reply, in send order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// A `set` of this key: the reply must be `STORED`.
    Set,
    /// A `get` of `keys[first..first + count]` of the batch's key list.
    Get { first: usize, count: usize },
}

/// Appends `set KEY 0 0 LEN\r\nVALUE\r\n`.
pub fn encode_set(key: &Key, value: &ValueShape, out: &mut Vec<u8>) {
    out.extend_from_slice(b"set ");
    out.extend_from_slice(key);
    out.extend_from_slice(b" 0 0 ");
    push_decimal(value.size() as u64, out);
    out.extend_from_slice(b"\r\n");
    value.write_value(key, out);
    out.extend_from_slice(b"\r\n");
}

/// Appends `get K1 K2 ...\r\n`.
pub fn encode_get(keys: &[Key], out: &mut Vec<u8>) {
    out.extend_from_slice(b"get");
    for key in keys {
        out.push(b' ');
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b"\r\n");
}

fn push_decimal(mut n: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Picks `count` distinct key ids below `range` (distinct so that every proxy
/// answers the same way: duplicate keys in one `get` are a corner case that
/// proxies treat differently, and not what this benchmark is about).
pub fn distinct_ids(rng: &mut Rng, range: u64, count: usize, out: &mut Vec<u64>) {
    out.clear();
    while out.len() < count {
        let id = rng.below(range);
        if !out.contains(&id) {
            out.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width_and_zero_padded() {
        assert_eq!(&key_of(0), b"key:000000000000");
        assert_eq!(&key_of(12_345), b"key:000000012345");
        assert_eq!(&key_of(MAX_KEY_RANGE - 1), b"key:999999999999");
    }

    #[test]
    fn value_starts_with_its_key_and_has_the_size() {
        let shape = ValueShape::new(32);
        let key = key_of(7);
        let mut out = Vec::new();
        shape.write_value(&key, &mut out);
        assert_eq!(out.len(), 32);
        assert_eq!(&out[..KEY_BYTES], &key);
        assert!(shape.matches(&key, &out));
        assert!(!shape.matches(&key_of(8), &out));
        assert!(!shape.matches(&key, &out[..31]));
    }

    #[test]
    fn values_shorter_than_a_key_are_a_key_prefix() {
        let shape = ValueShape::new(3);
        let mut out = Vec::new();
        shape.write_value(&key_of(1), &mut out);
        assert_eq!(out, b"key");
        assert!(shape.matches(&key_of(1), &out));
    }

    #[test]
    fn set_and_get_encode_as_memcached_expects() {
        let shape = ValueShape::new(20);
        let mut out = Vec::new();
        encode_set(&key_of(1), &shape, &mut out);
        assert_eq!(
            out,
            b"set key:000000000001 0 0 20\r\nkey:000000000001qrst\r\n"
        );
        out.clear();
        encode_get(&[key_of(1), key_of(2)], &mut out);
        assert_eq!(out, b"get key:000000000001 key:000000000002\r\n");
    }

    #[test]
    fn ratio_one_to_ten_is_one_set_in_eleven() {
        let ratio = Ratio::parse("1:10").unwrap();
        let sets = (0..1100).filter(|&n| ratio.is_set(n)).count();
        assert_eq!(sets, 100);
        assert!(Ratio::parse("0:0").is_err());
        assert!(Ratio::parse("1-10").is_err());
        assert!(!Ratio::parse("0:1").unwrap().is_set(0));
    }

    #[test]
    fn below_stays_in_range_and_distinct_ids_are_distinct() {
        let mut rng = Rng::new(1);
        let mut ids = Vec::new();
        for _ in 0..1000 {
            assert!(rng.below(10) < 10);
            distinct_ids(&mut rng, 12, 10, &mut ids);
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 10);
        }
    }
}
