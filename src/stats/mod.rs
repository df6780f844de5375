//! Counters, shared by memcached's `stats` reply and the Prometheus endpoint.
//!
//! Every figure is a prometheus-client metric registered once at start; hot
//! paths hold clones of the handles they bump (an atomic add, no lock, no
//! label lookup). Per-server handles live in [`BackendMetrics`].
//!
//! One file per job:
//! - `mod.rs`: the registry and the [`Stats`] type that holds every family;
//! - `families/`: the metric families, one file per feature (clients,
//!   servers, pools, hand-off, hot keys, shadow, discovery), each
//!   registering its own and counting them;
//! - `process.rs`: the process's CPU time from `/proc`;
//! - `exposition.rs`: the Prometheus and OpenMetrics text of `/metrics`;
//! - `latency.rs`: the lock-free latency histograms;
//! - `classify.rs`: the one place a reply's bytes are read to count it.
//!
//! A leaf: nothing of memring is imported but the protocol's command index,
//! so every other module may count without an import loop. The `stats`
//! reply, which reads these counters and the published pools, is the
//! session's (`session/report.rs`).

mod classify;
mod exposition;
mod families;
pub mod latency;
mod process;

use std::time::Instant;

use prometheus_client::registry::Registry;

pub(crate) use exposition::{OPENMETRICS_TEXT_TYPE, PROMETHEUS_TEXT_TYPE};
pub use families::discovery::DiscoveryReport;
pub use families::hotkeys::{HotKeyCounters, HotKeySample};
pub use families::pools::PoolFigures;
pub use families::servers::BackendMetrics;
pub(crate) use families::shadow::{ratio, SHADOW_PAIRINGS};
pub use families::shadow::{ShadowCounters, ShadowFigures};
pub use families::zones::ZoneFigures;
pub(crate) use process::process_cpu;

use families::client::ClientFamilies;
use families::discovery::DiscoveryFigures;
use families::handoff::HandoffFamilies;
use families::hotkeys::HotKeyGauges;
use families::pools::PoolFamilies;
use families::servers::ServerFamilies;
use families::shadow::ShadowFamilies;
use families::zones::ZoneFamilies;
use latency::PartedHistogram;

/// Process-wide figures.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    /// What the counters of the memcached `stats` reply read at the last
    /// `stats reset`, by `STAT` name (see `session::report::reset_stats`): that reply
    /// shows the counts since. `/metrics` is never reset.
    reset_baseline: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    registry: Registry,
    client: ClientFamilies,
    servers: ServerFamilies,
    pools: PoolFamilies,
    handoff: HandoffFamilies,
    zones: ZoneFamilies,
    /// Per-command request latency, indexed as [`crate::protocol::Command::index`]
    /// (each worker writes its own part).
    command_latency: Vec<PartedHistogram>,
    /// Hot keys: what was taken off the servers.
    pub hot: HotKeyCounters,
    /// Hot keys: the top keys of the last window.
    hot_keys: HotKeyGauges,
    shadow: ShadowFamilies,
    /// `[discovery]`: the servers DNS lists now.
    discovery: DiscoveryFigures,
    /// `[request_log]` lines not written for the rate limit.
    pub request_log_dropped: prometheus_client::metrics::counter::Counter,
    /// Reads sent off their first-choice replica by `read_balance` or a
    /// hot key's spreading (`read_balance_moved`).
    pub read_balance_moved: prometheus_client::metrics::counter::Counter,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    /// Registers every family. The order of registration is the order
    /// `/metrics` lists them in (the collectors, read at each scrape, come
    /// after the rest).
    pub fn new() -> Stats {
        let mut registry = Registry::with_prefix("memring");
        registry.register_collector(Box::new(process::ProcessCpu));
        let client = ClientFamilies::register(&mut registry);
        let servers = ServerFamilies::register(&mut registry);
        let pools = PoolFamilies::register(&mut registry);
        let handoff = HandoffFamilies::register(&mut registry);
        let zones = ZoneFamilies::register(&mut registry);
        let command_latency = families::client::register_request_latency(&mut registry);
        let (hot, hot_keys) = families::hotkeys::register(&mut registry);
        let shadow = ShadowFamilies::register(&mut registry);
        let discovery = DiscoveryFigures::register(&mut registry);
        let request_log_dropped = families::counter(
            &mut registry,
            "request_log_dropped",
            "Request log lines not written because a worker reached [request_log] max_lines_per_s",
        );
        let read_balance_moved = families::counter(
            &mut registry,
            "read_balance_moved",
            "Reads sent off their first-choice replica by read_balance or a hot key's spreading",
        );
        Stats {
            read_balance_moved,
            started: Instant::now(),
            reset_baseline: Default::default(),
            registry,
            client,
            servers,
            pools,
            handoff,
            zones,
            command_latency,
            hot,
            hot_keys,
            shadow,
            discovery,
            request_log_dropped,
        }
    }

    /// Seconds since start.
    pub fn uptime_seconds(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The `stats` counters' values at the last `stats reset` (empty
    /// before one).
    pub fn reset_baseline(&self) -> std::collections::HashMap<String, u64> {
        self.reset_baseline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the `stats` counters' values now, as `stats reset` does.
    pub fn set_reset_baseline(&self, baseline: std::collections::HashMap<String, u64>) {
        *self
            .reset_baseline
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = baseline;
    }
}
