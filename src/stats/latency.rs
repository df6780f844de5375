//! Latency histograms observed once per request without a lock:
//! `memring_request_duration_seconds` (by command, observed by the session)
//! and `memring_backend_latency_seconds` (by server, observed by each
//! backend connection). prometheus-client's histogram takes a write lock per
//! observation, shared by every worker. Here each writer (a worker, a
//! connection) has a part of its own ([`HistogramWriter`]) that it alone
//! writes, with a plain load and store per figure; `/metrics` sums the parts
//! ([`PartedHistogram`]). A writer that ends folds its counts into the
//! histogram, so what was counted stays and no part is left behind.
//!
//! A leaf like the rest of `stats/`: it imports nothing of memring but the
//! protocol's command index.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::protocol::Command;

/// The smallest upper bound, in nanoseconds: 50 µs.
const FIRST_BOUND_NANOS: u64 = 50_000;
/// Bounds 50 µs, 100 µs, … ~1.6 s (doubling), then `+Inf`.
const BOUNDS: usize = 16;

/// One writer's counts.
#[derive(Debug, Default)]
struct Cells {
    /// Observations per bucket (not cumulative), the last one `+Inf`.
    buckets: [AtomicU64; BOUNDS + 1],
    sum_nanos: AtomicU64,
}

#[derive(Debug, Default)]
struct Parts {
    live: Vec<Arc<Cells>>,
    /// What writers that ended counted.
    ended: [u64; BOUNDS + 1],
    ended_sum_nanos: u64,
}

/// A histogram of latencies with buckets from 50 µs to ~1.6 s, doubling
/// (the bounds `exponential_buckets(0.000_05, 2.0, 16)` gives), as
/// registered with the Prometheus registry.
#[derive(Debug, Clone, Default)]
pub struct PartedHistogram {
    parts: Arc<Mutex<Parts>>,
}

/// One writer's part of a [`PartedHistogram`]. Only its holder writes it,
/// so it is neither `Clone` nor `Send`: it stays with the thread that made
/// it.
#[derive(Debug)]
pub struct HistogramWriter {
    cells: Arc<Cells>,
    parts: Arc<Mutex<Parts>>,
    _one_thread: std::marker::PhantomData<*const ()>,
}

fn lock(parts: &Mutex<Parts>) -> MutexGuard<'_, Parts> {
    parts.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PartedHistogram {
    /// A part for one more writer.
    pub fn writer(&self) -> HistogramWriter {
        let cells = Arc::new(Cells::default());
        lock(&self.parts).live.push(cells.clone());
        HistogramWriter {
            cells,
            parts: self.parts.clone(),
            _one_thread: std::marker::PhantomData,
        }
    }

    /// The sum in nanoseconds and the per-bucket counts, over every part.
    fn totals(&self) -> (u64, [u64; BOUNDS + 1]) {
        let parts = lock(&self.parts);
        let mut counts = parts.ended;
        let mut sum = parts.ended_sum_nanos;
        for cells in &parts.live {
            for (count, cell) in counts.iter_mut().zip(&cells.buckets) {
                *count += cell.load(Ordering::Relaxed);
            }
            sum = sum.wrapping_add(cells.sum_nanos.load(Ordering::Relaxed));
        }
        (sum, counts)
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.totals().1.iter().sum()
    }
}

impl HistogramWriter {
    /// One latency of `nanos` nanoseconds (callers take differences of
    /// `TurnClock::nanos`, so no `Duration` is made per request).
    #[inline]
    pub fn observe_nanos(&self, nanos: u64) {
        let bucket = &self.cells.buckets[bucket_of(nanos)];
        // One writer: no other thread changes these between load and store.
        bucket.store(bucket.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let sum = self.cells.sum_nanos.load(Ordering::Relaxed);
        self.cells
            .sum_nanos
            .store(sum.wrapping_add(nanos), Ordering::Relaxed);
    }
}

impl Drop for HistogramWriter {
    fn drop(&mut self) {
        let mut parts = lock(&self.parts);
        for (ended, cell) in parts.ended.iter_mut().zip(&self.cells.buckets) {
            *ended += cell.load(Ordering::Relaxed);
        }
        parts.ended_sum_nanos = parts
            .ended_sum_nanos
            .wrapping_add(self.cells.sum_nanos.load(Ordering::Relaxed));
        parts.live.retain(|c| !Arc::ptr_eq(c, &self.cells));
    }
}

/// The bucket a latency of `nanos` falls in: the first whose upper bound
/// (50 µs × 2^i) it does not exceed, else `+Inf`.
fn bucket_of(nanos: u64) -> usize {
    // How many 50 µs steps, rounded up; bucket i holds up to 2^i of them.
    let steps = nanos.div_ceil(FIRST_BOUND_NANOS);
    if steps <= 1 {
        return 0;
    }
    let bucket = (u64::BITS - (steps - 1).leading_zeros()) as usize;
    bucket.min(BOUNDS)
}

impl TypedMetric for PartedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for PartedHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (sum, counts) = self.totals();
        // The bounds prometheus-client's own histogram prints, then `+Inf`
        // (which it writes for `f64::MAX`).
        let buckets: Vec<(f64, u64)> =
            exponential_buckets(FIRST_BOUND_NANOS as f64 / 1e9, 2.0, BOUNDS as u16)
                .chain(std::iter::once(f64::MAX))
                .zip(counts)
                .collect();
        let count = counts.iter().sum();
        encoder.encode_histogram::<NoLabelSet>(sum as f64 / 1e9, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A worker's parts of the per-command request histograms, indexed like
/// [`Command::ALL`].
#[derive(Debug)]
pub struct LatencyWriter {
    by_command: Box<[HistogramWriter]>,
}

impl LatencyWriter {
    /// Parts of `histograms`, one per command in [`Command::ALL`]'s order.
    pub fn new(histograms: &[PartedHistogram]) -> LatencyWriter {
        LatencyWriter {
            by_command: histograms.iter().map(PartedHistogram::writer).collect(),
        }
    }

    /// One request of `command` took `nanos` nanoseconds.
    #[inline]
    pub fn observe(&self, command: Command, nanos: u64) {
        self.by_command[command.index()].observe_nanos(nanos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;

    #[test]
    fn a_latency_falls_in_the_first_bucket_it_does_not_exceed() {
        let us = |n: u64| n * 1_000;
        for (nanos, bucket) in [
            (0, 0),
            (1, 0),
            (us(50), 0),
            (us(50) + 1, 1),
            (us(100), 1),
            (us(100) + 1, 2),
            (us(200), 2),
            (us(800), 4),
            (us(801), 5),
            (FIRST_BOUND_NANOS << 15, 15),
            ((FIRST_BOUND_NANOS << 15) + 1, BOUNDS),
            (u64::MAX, BOUNDS),
        ] {
            assert_eq!(bucket_of(nanos), bucket, "{nanos} ns");
        }
    }

    #[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
    struct Labels {
        command: &'static str,
    }

    #[test]
    fn every_part_is_summed_and_an_ended_writers_counts_stay() {
        let family: Family<Labels, PartedHistogram> = Family::default();
        let mut registry = Registry::default();
        registry.register("request_duration_seconds", "help", family.clone());
        let get = family.get_or_create(&Labels { command: "get" }).clone();
        let set = family.get_or_create(&Labels { command: "set" }).clone();
        let (one, two) = (get.writer(), get.writer());
        one.observe_nanos(30_000);
        one.observe_nanos(150_000);
        two.observe_nanos(150_000);
        drop(two);
        set.writer().observe_nanos(5_000_000_000);
        assert_eq!(get.count(), 3);
        assert_eq!(
            lock(&get.parts).live.len(),
            1,
            "the ended part is folded in"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let sample = |name: &str, labels: &str| -> String {
            let prefix = format!("{name}{{{labels}}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("{prefix} in {text}"))
                .to_string()
        };
        let get_labels = "command=\"get\"";
        assert_eq!(sample("request_duration_seconds_count", get_labels), "3");
        assert_eq!(
            sample("request_duration_seconds_sum", get_labels),
            "0.00033"
        );
        // Cumulative, in order of bound: 1 within 50 µs, all 3 from 200 µs.
        let buckets = |command: &str| -> Vec<u64> {
            let label = format!("command=\"{command}\"");
            text.lines()
                .filter(|l| l.starts_with("request_duration_seconds_bucket{") && l.contains(&label))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect()
        };
        let mut expected = vec![1, 1];
        expected.resize(BOUNDS + 1, 3);
        assert_eq!(buckets("get"), expected);
        let mut set_expected = vec![0; BOUNDS];
        set_expected.push(1);
        assert_eq!(buckets("set"), set_expected);
        assert!(text.contains("request_duration_seconds_bucket{le=\"+Inf\",command=\"set\"} 1\n"));
    }
}
