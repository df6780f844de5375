//! The per-request cost of timing a request: memring's per-writer histogram
//! (`stats::latency::HistogramWriter`, a load and a store per figure) against
//! prometheus-client's `Histogram::observe` (a write lock per observation),
//! over the same spread of latencies (10 µs to ~2 ms), single-threaded, so
//! the lock is never contended here: between workers it would be.
//!
//! Run: `cargo bench --bench latency -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memring::stats::latency::PartedHistogram;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// Latencies in nanoseconds, as the request path measures them.
fn latencies() -> Vec<u64> {
    (0..1024u64)
        .map(|i| 10_000 + (i * 2_000_017) % 2_000_000)
        .collect()
}

fn observe(c: &mut Criterion) {
    let mut group = c.benchmark_group("latency_observe");
    group.throughput(Throughput::Elements(1));
    let spread = latencies();
    let histogram = PartedHistogram::default();
    let writer = histogram.writer();
    let mut next = 0usize;
    group.bench_function("parted_writer", |b| {
        b.iter(|| {
            next = next.wrapping_add(1);
            writer.observe_nanos(black_box(spread[next & 1023]));
        })
    });
    let locked = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
    group.bench_function("prometheus_client", |b| {
        b.iter(|| {
            next = next.wrapping_add(1);
            locked.observe(black_box(spread[next & 1023]) as f64 / 1e9);
        })
    });
    group.finish();
}

criterion_group!(benches, observe);
criterion_main!(benches);
