//! The hot-key figures (see `src/hotkeys/`): what coalescing and the near
//! cache took off the servers, and the hottest keys of the last window.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{counter, FloatGauge, Text};
use crate::stats::Stats;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HotKeyLabels {
    server: Text,
    key: Text,
}

/// Counters of the hot-key machinery (see `src/hotkeys/`).
#[derive(Debug, Clone, Default)]
pub struct HotKeyCounters {
    /// `get`s that waited for another client's identical request.
    pub coalesced: Counter,
    /// Hot-key `get`s answered from the near cache.
    pub cache_hits: Counter,
    /// Hot-key `get`s the near cache could not answer.
    pub cache_misses: Counter,
    /// Near-cache entries dropped to stay within `hot_key_cache_bytes`.
    pub cache_evictions: Counter,
}

/// One key of the hot-key gauges.
#[derive(Debug, Clone)]
pub struct HotKeySample {
    pub server: String,
    /// The key, or a hash of it.
    pub key: String,
    pub rate: f64,
    pub share: f64,
}

/// The gauges of the hottest keys, replaced each window.
#[derive(Debug)]
pub(in crate::stats) struct HotKeyGauges {
    rate: Family<HotKeyLabels, FloatGauge>,
    share: Family<HotKeyLabels, FloatGauge>,
}

/// Registers the hot-key families: the counters (which sessions hold) and
/// the gauges of the hottest keys.
pub(in crate::stats) fn register(registry: &mut Registry) -> (HotKeyCounters, HotKeyGauges) {
    let counters = HotKeyCounters {
        coalesced: counter(
            registry,
            "hot_key_coalesced_gets",
            "Gets answered by another client's identical request already on its way to the server",
        ),
        cache_hits: counter(
            registry,
            "near_cache_hits",
            "Hot-key gets answered from memring's near cache",
        ),
        cache_misses: counter(
            registry,
            "near_cache_misses",
            "Hot-key gets the near cache could not answer",
        ),
        cache_evictions: counter(
            registry,
            "near_cache_evictions",
            "Near-cache entries evicted to stay within hot_key_cache_bytes",
        ),
    };
    let gauges = HotKeyGauges {
        rate: Family::default(),
        share: Family::default(),
    };
    registry.register(
        "hot_key_requests_per_second",
        "Estimated requests per second of the hottest keys in the last window",
        gauges.rate.clone(),
    );
    registry.register(
        "hot_key_server_share",
        "Share of its server's requests that each of the hottest keys took in the last window",
        gauges.share.clone(),
    );
    (counters, gauges)
}

impl Stats {
    /// Replaces the hot-key gauges with `top`.
    pub fn hot_keys(&self, top: &[HotKeySample]) {
        let gauges = &self.hot_keys;
        gauges.rate.clear();
        gauges.share.clear();
        for sample in top {
            let labels = HotKeyLabels {
                server: Text(sample.server.clone()),
                key: Text(sample.key.clone()),
            };
            gauges.rate.get_or_create(&labels).set(sample.rate);
            gauges.share.get_or_create(&labels).set(sample.share);
        }
    }
}
