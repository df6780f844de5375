//! A space-saving heavy-hitters sketch (Metwally, Agrawal, El Abbadi, 2005)
//! over key hashes, with the key bytes kept for reporting. Pure: no I/O, no
//! clock, no threads.
//!
//! With `capacity` counters over a stream of `N` keys:
//! - every key whose true count exceeds `N / capacity` holds a counter;
//! - a counter's `count` is never below its key's true count, and
//!   `count - error` never above it.
//!
//! One update is a hash-map probe plus a sift in a min-heap of at most
//! `capacity` counters, and copies the key only when it takes over the
//! smallest counter (into a buffer that keeps its allocation).
//!
//! Keys are told apart by a 64-bit hash the caller computes: two keys with the
//! same hash share one counter, a chance of about 2^-64 per pair.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a `u64` that is already a good hash (xxh3 of the key) to itself,
/// so the maps keyed by it do not hash twice.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHashHasher(u64);

impl Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed with this; fold anything else anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Builds [`KeyHashHasher`]s.
pub type BuildKeyHash = BuildHasherDefault<KeyHashHasher>;

/// One counter of the sketch.
#[derive(Debug, Clone)]
struct Counter {
    hash: u64,
    key: Vec<u8>,
    count: u64,
    error: u64,
}

/// One key of [`SpaceSaving::top`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    pub hash: u64,
    pub key: Box<[u8]>,
    /// Never below the key's true count.
    pub count: u64,
    /// `count - error` is never above the key's true count.
    pub error: u64,
}

/// The sketch (see the module doc).
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    counters: Vec<Counter>,
    /// Counter indexes as a min-heap on `count`.
    heap: Vec<u32>,
    /// `position[c]` is counter `c`'s index in `heap`.
    position: Vec<u32>,
    index: HashMap<u64, u32, BuildKeyHash>,
    total: u64,
}

impl SpaceSaving {
    /// A sketch of `capacity` counters (at least one).
    pub fn new(capacity: usize) -> SpaceSaving {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            counters: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            position: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(capacity, BuildKeyHash::default()),
            total: 0,
        }
    }

    /// Counters it keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys counted since the last [`SpaceSaving::clear`].
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Any key without a counter was seen at most this often: the smallest
    /// count once every counter is taken, 0 before.
    pub fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            0
        } else {
            self.heap
                .first()
                .map_or(0, |&c| self.counters[c as usize].count)
        }
    }

    /// Counts one occurrence of `key`, whose hash is `hash`.
    #[inline]
    pub fn add(&mut self, hash: u64, key: &[u8]) {
        self.total += 1;
        if let Some(&c) = self.index.get(&hash) {
            self.counters[c as usize].count += 1;
            self.sift_down(self.position[c as usize] as usize);
            return;
        }
        if self.counters.len() < self.capacity {
            let c = self.counters.len() as u32;
            self.counters.push(Counter {
                hash,
                key: key.to_vec(),
                count: 1,
                error: 0,
            });
            self.heap.push(c);
            self.position.push(self.heap.len() as u32 - 1);
            self.index.insert(hash, c);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // The new key takes over the smallest counter, inheriting its count
        // as its possible overestimate.
        let c = self.heap[0];
        let counter = &mut self.counters[c as usize];
        self.index.remove(&counter.hash);
        counter.hash = hash;
        counter.key.clear();
        counter.key.extend_from_slice(key);
        counter.error = counter.count;
        counter.count += 1;
        self.index.insert(hash, c);
        self.sift_down(0);
    }

    /// The `n` largest counters, largest first.
    pub fn top(&self, n: usize) -> Vec<Estimate> {
        let mut order: Vec<&Counter> = self.counters.iter().collect();
        order.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.error.cmp(&b.error)));
        order
            .into_iter()
            .take(n)
            .map(|c| Estimate {
                hash: c.hash,
                key: c.key.clone().into_boxed_slice(),
                count: c.count,
                error: c.error,
            })
            .collect()
    }

    /// Forgets every key (a new window).
    pub fn clear(&mut self) {
        self.counters.clear();
        self.heap.clear();
        self.position.clear();
        self.index.clear();
        self.total = 0;
    }

    fn count_at(&self, at: usize) -> u64 {
        self.counters[self.heap[at] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.position[self.heap[a] as usize] = a as u32;
        self.position[self.heap[b] as usize] = b as u32;
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(parent) <= self.count_at(at) {
                break;
            }
            self.swap(parent, at);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        let len = self.heap.len();
        loop {
            let left = 2 * at + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let smaller = if right < len && self.count_at(right) < self.count_at(left) {
                right
            } else {
                left
            };
            if self.count_at(at) <= self.count_at(smaller) {
                break;
            }
            self.swap(at, smaller);
            at = smaller;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap as Exact;

    fn hash(key: &[u8]) -> u64 {
        twox_hash::XxHash3_64::oneshot(key)
    }

    #[test]
    fn counts_exactly_while_counters_are_free() {
        let mut s = SpaceSaving::new(4);
        for key in ["a", "b", "a", "c", "a", "b"] {
            s.add(hash(key.as_bytes()), key.as_bytes());
        }
        let top = s.top(10);
        let got: Vec<(&[u8], u64, u64)> =
            top.iter().map(|e| (&e.key[..], e.count, e.error)).collect();
        assert_eq!(
            got,
            vec![(&b"a"[..], 3, 0), (&b"b"[..], 2, 0), (&b"c"[..], 1, 0)]
        );
        assert_eq!((s.total(), s.floor()), (6, 0));
    }

    #[test]
    fn a_new_key_takes_the_smallest_counter_and_its_count_as_error() {
        let mut s = SpaceSaving::new(2);
        for key in ["a", "a", "a", "b", "c"] {
            s.add(hash(key.as_bytes()), key.as_bytes());
        }
        let top = s.top(2);
        assert_eq!(&top[0].key[..], b"a");
        assert_eq!(&top[1].key[..], b"c");
        assert_eq!((top[1].count, top[1].error), (2, 1));
        assert_eq!(s.floor(), 2);
        s.clear();
        assert_eq!((s.total(), s.top(5).len()), (0, 0));
    }

    /// A stream of keys: a few heavy ones repeated among many light ones.
    fn stream() -> impl Strategy<Value = Vec<u16>> {
        (
            prop::collection::vec((0u16..8, 1usize..400), 1..6),
            prop::collection::vec(8u16..2000, 0..3000),
            any::<u64>(),
        )
            .prop_map(|(heavy, light, seed)| {
                let mut keys: Vec<u16> = light;
                for (key, times) in heavy {
                    keys.extend(std::iter::repeat(key).take(times));
                }
                // A deterministic shuffle so heavy keys are spread out.
                let mut state = seed | 1;
                for i in (1..keys.len()).rev() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    keys.swap(i, (state % (i as u64 + 1)) as usize);
                }
                keys
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn heavy_hitters_above_the_bound_are_always_reported(
            keys in stream(),
            capacity in 4usize..64,
        ) {
            let mut sketch = SpaceSaving::new(capacity);
            let mut exact: Exact<u16, u64> = Exact::new();
            for key in &keys {
                let name = format!("key:{key}");
                sketch.add(hash(name.as_bytes()), name.as_bytes());
                *exact.entry(*key).or_default() += 1;
            }
            let total = keys.len() as u64;
            prop_assert_eq!(sketch.total(), total);
            let top = sketch.top(capacity);
            let reported: Exact<Vec<u8>, (u64, u64)> = top
                .iter()
                .map(|e| (e.key.to_vec(), (e.count, e.error)))
                .collect();
            for (key, &count) in &exact {
                let name = format!("key:{key}").into_bytes();
                // The guarantee: more than N / capacity means a counter.
                if count * capacity as u64 > total {
                    prop_assert!(reported.contains_key(&name), "{} x{} of {}", key, count, total);
                }
                if let Some(&(estimate, error)) = reported.get(&name) {
                    prop_assert!(estimate >= count);
                    prop_assert!(estimate - error <= count);
                } else {
                    prop_assert!(count <= sketch.floor());
                }
            }
            prop_assert!(sketch.floor() * capacity as u64 <= total);
        }
    }
}
