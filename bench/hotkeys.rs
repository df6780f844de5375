//! Hot-key detection benches: the per-request cost of counting one key (its
//! xxh3 hash plus one space-saving update), which every keyed request pays.
//!
//! Two key streams bound the cost: W1's uniform choice over 100 000 keys (the
//! worst case: almost every key is new to the sketch, takes over its smallest
//! counter and copies its name) and a Zipf(0.99) choice over 10 000 keys (the
//! skewed traffic the sketch is for: mostly increments of counted keys).
//! `key_hash` alone is the part that is not the sketch.
//!
//! Run: `cargo bench --bench hotkeys -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memring::hotkeys::sketch::SpaceSaving;
use memring::hotkeys::{key_hash, COUNTERS_PER_SERVER};

/// Keys cycled through, generated once outside the timed loop; a power of
/// two so the cycle index is a mask.
const STREAM: usize = 1 << 16;

/// A deterministic xorshift stream of numbers in [0, 1).
fn units() -> impl Iterator<Item = f64> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    std::iter::repeat_with(move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    })
}

fn uniform_keys() -> Vec<Vec<u8>> {
    units()
        .take(STREAM)
        .map(|u| format!("memtier-{}", (u * 100_000.0) as u64 + 1).into_bytes())
        .collect()
}

fn zipf_keys() -> Vec<Vec<u8>> {
    let n = 10_000;
    let mut cdf: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(0.99)).collect();
    let mut total = 0.0;
    for c in cdf.iter_mut() {
        total += *c;
        *c = total;
    }
    units()
        .take(STREAM)
        .map(|u| {
            let rank = cdf.partition_point(|&c| c < u * total);
            format!("user:{rank}:profile").into_bytes()
        })
        .collect()
}

fn sketch_add(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key_count");
    group.throughput(Throughput::Elements(1));
    for (name, keys) in [("uniform_100k", uniform_keys()), ("zipf_0.99", zipf_keys())] {
        group.bench_function(name, |b| {
            let mut sketch = SpaceSaving::new(COUNTERS_PER_SERVER);
            let mut next = 0usize;
            b.iter(|| {
                let key = &keys[next & (STREAM - 1)];
                next = next.wrapping_add(1);
                sketch.add(key_hash(black_box(key)), key);
            })
        });
    }
    let keys = uniform_keys();
    group.bench_function("key_hash", |b| {
        let mut next = 0usize;
        b.iter(|| {
            let key = &keys[next & (STREAM - 1)];
            next = next.wrapping_add(1);
            key_hash(black_box(key))
        })
    });
    group.finish();
}

criterion_group!(benches, sketch_add);
criterion_main!(benches);
