//! The metric families, one file per feature: each registers its own
//! families with the registry (in [`crate::stats::Stats::new`]'s order, which
//! is the order `/metrics` lists them in) and holds the `impl Stats` methods
//! that count and read them. What several features share is here: the label
//! sets, the label value that escapes any text, and the registering helpers.

pub(super) mod client;
pub(super) mod discovery;
pub(super) mod handoff;
pub(super) mod hotkeys;
pub(super) mod pools;
pub(super) mod servers;
pub(super) mod shadow;
pub(super) mod zones;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CommandLabels {
    pub(super) command: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: &'static str,
}

/// A label value that can hold any text: server names come from the config
/// and hot-key names from clients. prometheus-client writes `String` label
/// values verbatim, so a `"`, `\` or newline in one would end the value early
/// or split the sample line; this writes them as the text formats (classic
/// 0.0.4 and OpenMetrics alike) require: `\\`, `\"` and `\n`.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
pub(super) struct Text(pub(super) String);

impl From<&str> for Text {
    fn from(text: &str) -> Text {
        Text(text.to_string())
    }
}

impl EncodeLabelValue for Text {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        let mut rest = self.0.as_str();
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

/// A gauge of a float value.
pub(super) type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// A counter registered under `name`.
pub(super) fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let metric = Counter::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Adds `n` to `counter` unless it is 0: every retrieval either hits or
/// misses, and an atomic add of nothing still takes the cache line.
#[inline]
pub(super) fn add_some(counter: &Counter, n: usize) {
    if n > 0 {
        counter.inc_by(n as u64);
    }
}

/// A gauge registered under `name`.
pub(super) fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let metric = Gauge::default();
    registry.register(name, help, metric.clone());
    metric
}
