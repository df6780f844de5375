//! A space-saving heavy-hitters sketch (Metwally, Agrawal, El Abbadi, 2005)
//! over key hashes, with the key bytes kept for reporting. Pure: no I/O, no
//! clock, no threads.
//!
//! With `capacity` counters over a stream of `N` keys:
//! - every key whose true count exceeds `N / capacity` holds a counter;
//! - a counter's `count` is never below its key's true count, and
//!   `count - error` never above it.
//!
//! One update is a hash-map probe plus, for a counted key above the
//! smallest count, a binary search over the counts of at most `capacity`
//! counters kept in order (see [`SpaceSaving`]); it copies the key only
//! when it takes over the smallest counter (into a buffer that keeps its
//! allocation).
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

/// One counter of the sketch; unused while its count is 0.
#[derive(Debug, Clone, Default)]
struct Counter {
    hash: u64,
    key: Vec<u8>,
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
///
/// The counters are kept in ascending order of count (`order`, with the
/// counts beside it in `counts`), all `capacity` of them from the start,
/// unused ones counting 0. Counting a key adds one to its counter, which
/// then swaps with the last counter of its old count: the order holds, and
/// the only search is for that run's end, over a short array of numbers
/// (none for the smallest count, whose run's end is kept). A
/// key without a counter takes the first in the order, the smallest (an
/// unused one while there are any), so the sketch needs no other case.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    counters: Vec<Counter>,
    /// Counter indexes, ascending by count.
    order: Vec<u32>,
    /// `counts[i]` is the count of counter `order[i]`.
    counts: Vec<u64>,
    /// `rank[c]` is counter `c`'s index in `order`.
    rank: Vec<u32>,
    /// The last index in `order` whose count is the smallest, `counts[0]`:
    /// where an increment of the smallest counters goes without a search.
    /// Every key new to the sketch increments the smallest, so without
    /// hot keys nearly every count takes this way.
    floor_end: usize,
    index: HashMap<u64, u32, BuildKeyHash>,
    total: u64,
}

impl SpaceSaving {
    /// A sketch of `capacity` counters (at least one).
    pub fn new(capacity: usize) -> SpaceSaving {
        let capacity = capacity.max(1);
        SpaceSaving {
            counters: vec![Counter::default(); capacity],
            order: (0..capacity as u32).collect(),
            counts: vec![0; capacity],
            rank: (0..capacity as u32).collect(),
            floor_end: capacity - 1,
            index: HashMap::with_capacity_and_hasher(capacity, BuildKeyHash::default()),
            total: 0,
        }
    }

    /// Counters it keeps.
    pub fn capacity(&self) -> usize {
        self.counters.len()
    }

    /// Keys counted since the last [`SpaceSaving::clear`].
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Any key without a counter was seen at most this often: the smallest
    /// count once every counter is taken, 0 before.
    pub fn floor(&self) -> u64 {
        self.counts[0]
    }

    /// Counts one occurrence of `key`, whose hash is `hash`.
    #[inline]
    pub fn add(&mut self, hash: u64, key: &[u8]) {
        self.total += 1;
        let at = match self.index.get(&hash) {
            Some(&c) => self.rank[c as usize] as usize,
            None => {
                // The new key takes over the smallest counter, inheriting its
                // count as its possible overestimate.
                let c = self.order[0];
                let smallest = self.counts[0];
                let counter = &mut self.counters[c as usize];
                if smallest > 0 {
                    self.index.remove(&counter.hash);
                }
                counter.hash = hash;
                counter.key.clear();
                counter.key.extend_from_slice(key);
                counter.error = smallest;
                self.index.insert(hash, c);
                0
            }
        };
        self.increment(at);
    }

    /// Adds one to the count at `at` in the order, keeping the order.
    #[inline]
    fn increment(&mut self, at: usize) {
        let count = self.counts[at];
        let floor = count == self.counts[0];
        // The last counter with the same count: everything after it counts
        // more, so the incremented counter belongs there.
        let last = if floor {
            self.floor_end
        } else {
            at + self.counts[at..].partition_point(|&c| c == count) - 1
        };
        if last != at {
            self.order.swap(at, last);
            self.rank[self.order[at] as usize] = at as u32;
            self.rank[self.order[last] as usize] = last as u32;
        }
        self.counts[last] = count + 1;
        if floor {
            self.floor_end = match last.checked_sub(1) {
                Some(end) => end,
                // The smallest count was this counter's alone: the next
                // one up is the smallest now.
                None => self.counts.partition_point(|&c| c == count + 1) - 1,
            };
        }
    }

    /// The `n` largest counters, largest first.
    pub fn top(&self, n: usize) -> Vec<Estimate> {
        // Descending count; among equal counts the smaller error first.
        let mut used: Vec<(u64, &Counter)> = self
            .order
            .iter()
            .zip(&self.counts)
            .filter(|(_, &count)| count > 0)
            .map(|(&c, &count)| (count, &self.counters[c as usize]))
            .collect();
        used.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.error.cmp(&b.1.error)));
        used.into_iter()
            .take(n)
            .map(|(count, c)| Estimate {
                hash: c.hash,
                key: c.key.clone().into_boxed_slice(),
                count,
                error: c.error,
            })
            .collect()
    }

    /// Forgets every key (a new window).
    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.floor_end = self.counts.len() - 1;
        self.index.clear();
        self.total = 0;
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

        #[test]
        fn the_counters_stay_in_order_and_sum_to_the_total(
            keys in stream(),
            capacity in 1usize..40,
        ) {
            let mut sketch = SpaceSaving::new(capacity);
            for (i, key) in keys.iter().enumerate() {
                let name = format!("key:{key}");
                sketch.add(hash(name.as_bytes()), name.as_bytes());
                // Where the smallest counts end, after every count.
                let floor_run = sketch.counts.iter().take_while(|&&c| c == sketch.counts[0]);
                prop_assert_eq!(sketch.floor_end, floor_run.count() - 1);
                if i % 250 == 0 {
                    sketch.clear();
                }
                if i % 97 == 0 {
                    prop_assert!(sketch.counts.windows(2).all(|w| w[0] <= w[1]));
                    for (at, &c) in sketch.order.iter().enumerate() {
                        prop_assert_eq!(sketch.rank[c as usize] as usize, at);
                    }
                    // Each occurrence lands on one counter: counts sum to
                    // the total plus the errors inherited at take-overs.
                    let counts: u64 = sketch.counts.iter().sum();
                    let errors: u64 = sketch.top(capacity).iter().map(|e| e.error).sum();
                    prop_assert!(counts >= sketch.total() && counts - errors <= sketch.total());
                    prop_assert_eq!(sketch.index.len(), sketch.counts.iter().filter(|&&c| c > 0).count());
                }
            }
        }
    }
}
