//! The shadow figures (see docs/shadow.md): how a primary's and its shadow's
//! answers to sampled gets compared, the requests for the shadow, and each
//! side's hit ratio. A primary pool's handles are [`ShadowCounters`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{FloatGauge, Text};
use crate::stats::Stats;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabels {
    pool: Text,
    shadow: Text,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowSideLabels {
    pool: Text,
    shadow: Text,
    side: &'static str,
}

/// The families of the shadow figures (see [`ShadowCounters`]).
#[derive(Debug, Default)]
pub(in crate::stats) struct ShadowFamilies {
    gets: Family<ShadowLabels, Counter>,
    requests: Family<ShadowLabels, Counter>,
    hit_ratio: Family<ShadowSideLabels, FloatGauge>,
}

impl ShadowFamilies {
    pub(in crate::stats) fn register(registry: &mut Registry) -> ShadowFamilies {
        let shadow = ShadowFamilies::default();
        registry.register(
            "shadow_gets",
            "Sampled gets answered by the primary and asked of its shadow, by how the two answers compared",
            shadow.gets.clone(),
        );
        registry.register(
            "shadow_requests",
            "Requests for a pool's shadow, by result: sent, failed, or shed because the worker had too many in flight",
            shadow.requests.clone(),
        );
        registry.register(
            "shadow_hit_ratio",
            "Hit ratio of the compared gets, on the primary and on its shadow",
            shadow.hit_ratio.clone(),
        );
        shadow
    }
}

/// How a primary's and its shadow's answers to one sampled get compared:
/// the `outcome` labels of `memring_shadow_gets_total`, in the order of
/// [`ShadowCounters::pair`]'s index.
pub(crate) const SHADOW_PAIRINGS: [&str; 5] =
    ["hit_hit", "mismatch", "hit_miss", "miss_hit", "miss_miss"];

/// One primary pool's shadow figures, handles into the registry: kept by
/// the layout, so sessions count without a lookup.
#[derive(Debug)]
pub struct ShadowCounters {
    /// Indexed as [`SHADOW_PAIRINGS`].
    pairs: [Counter; 5],
    sent: Counter,
    failed: Counter,
    shed: Counter,
    /// Writes the shadow lacks: its copy was shed or failed, or a
    /// `flush_all` reached the primary only.
    lost_writes: Counter,
    primary_ratio: FloatGauge,
    shadow_ratio: FloatGauge,
}

/// A copy of one pool's shadow figures, for `stats shadow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShadowFigures {
    /// Indexed as [`SHADOW_PAIRINGS`].
    pub pairs: [u64; 5],
    pub sent: u64,
    pub failed: u64,
    pub shed: u64,
    /// Writes the shadow lacks (see [`ShadowCounters::lost_write`]).
    pub lost_writes: u64,
}

impl ShadowFigures {
    /// Gets compared.
    pub fn compared(&self) -> u64 {
        self.pairs.iter().sum()
    }

    /// Of them, hits on the primary (a mismatch is a hit on both).
    pub fn primary_hits(&self) -> u64 {
        self.pairs[0] + self.pairs[1] + self.pairs[2]
    }

    /// Of them, hits on the shadow.
    pub fn shadow_hits(&self) -> u64 {
        self.pairs[0] + self.pairs[1] + self.pairs[3]
    }
}

/// `hits / compared`, 0 before anything was compared.
pub(crate) fn ratio(hits: u64, compared: u64) -> f64 {
    if compared == 0 {
        0.0
    } else {
        hits as f64 / compared as f64
    }
}

impl ShadowCounters {
    /// One compared get, `pairing` an index into [`SHADOW_PAIRINGS`].
    pub fn pair(&self, pairing: usize) {
        if let Some(counter) = self.pairs.get(pairing) {
            counter.inc();
        }
        let figures = self.figures();
        let compared = figures.compared();
        self.primary_ratio
            .set(ratio(figures.primary_hits(), compared));
        self.shadow_ratio
            .set(ratio(figures.shadow_hits(), compared));
    }

    /// A request was sent to the shadow.
    pub fn sent(&self) {
        self.sent.inc();
    }

    /// A shadow request failed (the server failed, timed out, or refused).
    pub fn failed(&self) {
        self.failed.inc();
    }

    /// A copy was not sent: the worker had too many shadow requests in
    /// flight.
    pub fn shed(&self) {
        self.shed.inc();
    }

    /// A write the primary took is not on the shadow: its copy was shed or
    /// failed, or it was a `flush_all`. A shadow with one may hold a value
    /// older than the primary's, or a key the primary deleted.
    pub fn lost_write(&self) {
        self.lost_writes.inc();
    }

    /// The figures now.
    pub fn figures(&self) -> ShadowFigures {
        ShadowFigures {
            pairs: std::array::from_fn(|i| self.pairs[i].get()),
            sent: self.sent.get(),
            failed: self.failed.get(),
            shed: self.shed.get(),
            lost_writes: self.lost_writes.get(),
        }
    }
}

impl Stats {
    /// Handles for the shadow figures of pool `pool` shadowed by `shadow`:
    /// the same counters every time for the same two names, so figures go
    /// on across reloads that keep the pair.
    pub fn shadow_counters(&self, pool: &str, shadow: &str) -> ShadowCounters {
        let families = &self.shadow;
        let labels = |outcome| ShadowLabels {
            pool: pool.into(),
            shadow: shadow.into(),
            outcome,
        };
        let side = |side| ShadowSideLabels {
            pool: pool.into(),
            shadow: shadow.into(),
            side,
        };
        // One statement each: `get_or_create` holds the family's read lock
        // until its guard goes, and the next one may need the write lock.
        let request = |outcome| -> Counter {
            let counter = families.requests.get_or_create(&labels(outcome));
            counter.clone()
        };
        let ratio = |name| -> FloatGauge {
            let gauge = families.hit_ratio.get_or_create(&side(name));
            gauge.clone()
        };
        let pairs = SHADOW_PAIRINGS.map(|outcome| {
            let counter = families.gets.get_or_create(&labels(outcome));
            counter.clone()
        });
        let (sent, failed, shed) = (request("sent"), request("failed"), request("shed"));
        let lost_writes = request("lost_writes");
        let (primary_ratio, shadow_ratio) = (ratio("primary"), ratio("shadow"));
        ShadowCounters {
            pairs,
            sent,
            failed,
            shed,
            lost_writes,
            primary_ratio,
            shadow_ratio,
        }
    }

    /// Forgets the shadow figures of `pool` shadowed by `shadow` (a reload
    /// took the shadow away or pointed it elsewhere).
    pub fn shadow_gone(&self, pool: &str, shadow: &str) {
        let families = &self.shadow;
        for outcome in SHADOW_PAIRINGS {
            families.gets.remove(&ShadowLabels {
                pool: pool.into(),
                shadow: shadow.into(),
                outcome,
            });
        }
        for outcome in ["sent", "failed", "shed", "lost_writes"] {
            families.requests.remove(&ShadowLabels {
                pool: pool.into(),
                shadow: shadow.into(),
                outcome,
            });
        }
        for side in ["primary", "shadow"] {
            families.hit_ratio.remove(&ShadowSideLabels {
                pool: pool.into(),
                shadow: shadow.into(),
                side,
            });
        }
    }
}
