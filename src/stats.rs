//! Counters, shared by memcached's `stats` reply and the Prometheus endpoint.
//!
//! Every figure is a prometheus-client metric registered once at start; hot
//! paths hold clones of the handles they bump (an atomic add, no lock, no
//! label lookup). Per-server handles live in [`BackendMetrics`].
//!
//! A leaf: it imports nothing of memring but the protocol's command index, so
//! every other module may count without an import loop. The `stats` reply is
//! rendered in `report.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::latency::{LatencyWriter, PartedHistogram};
use crate::protocol::Command;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    pool: Text,
    server: Text,
}

/// A server discovery lists (always of the top-level pool).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiscoveredLabels {
    server: Text,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: Text,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerErrorLabels {
    pool: Text,
    server: Text,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerStateLabels {
    pool: Text,
    server: Text,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HotKeyLabels {
    server: Text,
    key: Text,
}

/// A label value that can hold any text: server names come from the config
/// and hot-key names from clients. prometheus-client writes `String` label
/// values verbatim, so a `"`, `\` or newline in one would end the value early
/// or split the sample line; this writes them as the text formats (classic
/// 0.0.4 and OpenMetrics alike) require: `\\`, `\"` and `\n`.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Text(String);

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
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

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
struct ShadowFamilies {
    gets: Family<ShadowLabels, Counter>,
    requests: Family<ShadowLabels, Counter>,
    hit_ratio: Family<ShadowSideLabels, FloatGauge>,
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolCommandLabels {
    pool: Text,
    command: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolResultLabels {
    pool: Text,
    result: &'static str,
}

/// One pool's own figures: the client requests planned on it, and the keys
/// its retrievals found or missed. Handles made once per pool, so counting
/// is an atomic add with no label lookup.
#[derive(Debug)]
pub struct PoolFigures {
    requests: Box<[Counter]>,
    hits: Counter,
    misses: Counter,
}

impl PoolFigures {
    /// Figures that no registry exposes (a topology built outside a pool).
    pub fn detached() -> PoolFigures {
        PoolFigures {
            requests: Command::ALL.iter().map(|_| Counter::default()).collect(),
            hits: Counter::default(),
            misses: Counter::default(),
        }
    }

    /// One client request of `command` was planned on this pool.
    #[inline]
    pub fn request(&self, command: Command) {
        self.requests[command.index()].inc();
    }

    /// A retrieval on this pool asked `keys` keys and found `hits`.
    #[inline]
    pub fn retrieval(&self, keys: usize, hits: usize) {
        add_some(&self.hits, hits);
        add_some(&self.misses, keys.saturating_sub(hits));
    }

    /// Requests of every command so far.
    pub fn requests(&self) -> u64 {
        self.requests.iter().map(Counter::get).sum()
    }

    /// (keys found, keys missed) by retrievals so far.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits.get(), self.misses.get())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: &'static str,
}

/// A counter registered under `name`.
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let metric = Counter::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Adds `n` to `counter` unless it is 0: every retrieval either hits or
/// misses, and an atomic add of nothing still takes the cache line.
#[inline]
fn add_some(counter: &Counter, n: usize) {
    if n > 0 {
        counter.inc_by(n as u64);
    }
}

/// A gauge registered under `name`.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let metric = Gauge::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Hit and miss counters of one kind of command.
#[derive(Debug, Default, Clone)]
struct HitMiss {
    hits: Counter,
    misses: Counter,
}

/// Replies to compare-and-swap writes, as memcached's `cas_*` stats count
/// them: the cas matched (stored), the key was missing, the cas was stale.
#[derive(Debug, Clone)]
struct CasCounters {
    hits: Counter,
    misses: Counter,
    badval: Counter,
}

/// Process-wide figures.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    /// What the counters of the memcached `stats` reply read at the last
    /// `stats reset`, by `STAT` name (see `report::reset_stats`): that reply
    /// shows the counts since. `/metrics` is never reset.
    reset_baseline: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    registry: Registry,
    /// Each worker's reply bytes owed to its clients.
    reply_owed: Arc<OwedParts>,
    curr_connections: Gauge,
    total_connections: Counter,
    commands: Vec<Counter>,
    /// Keys asked for by retrieval commands (memcached's `cmd_get`).
    keys_requested: Counter,
    get: HitMiss,
    touch: HitMiss,
    delete: HitMiss,
    incr: HitMiss,
    decr: HitMiss,
    cas: CasCounters,
    bytes_read: Counter,
    bytes_written: Counter,
    backend_requests: Family<ServerLabels, Counter>,
    backend_writes: Family<ServerLabels, Counter>,
    backend_coalesced_gets: Family<ServerLabels, Counter>,
    backend_errors: Family<ServerErrorLabels, Counter>,
    backend_latency: Family<ServerLabels, PartedHistogram>,
    backend_connections: Family<ServerLabels, Gauge>,
    server_state: Family<ServerStateLabels, Gauge>,
    /// 1 for each server's part in a hand-off window (ACTIVE, JOINING, LEAVING).
    server_membership: Family<ServerStateLabels, Gauge>,
    ring_version: Family<PoolLabels, Gauge>,
    servers_configured: Family<PoolLabels, Gauge>,
    servers_effective: Family<PoolLabels, Gauge>,
    reloads: Family<ResultLabels, Counter>,
    pool_requests: Family<PoolCommandLabels, Counter>,
    pool_get_keys: Family<PoolResultLabels, Counter>,
    replica_background: Counter,
    /// Hand-off: keys asked of their previous owner, values found there,
    /// and copies to new owners stored, skipped (newer value there), failed.
    handoff_reads: Counter,
    handoff_hits: Counter,
    handoff_copies: Counter,
    handoff_copies_skipped: Counter,
    handoff_copy_failures: Counter,
    handoff_copies_taken_back: Counter,
    handoff_copies_checked: Counter,
    handoff_leftovers_deleted: Counter,
    handoff_sweeps: Counter,
    handoff_windows_resumed: Counter,
    handoff_state_errors: Counter,
    /// Per-command request latency, indexed like `commands` (each worker
    /// writes its own part).
    command_latency: Vec<PartedHistogram>,
    /// Hot keys: what was taken off the servers, and the top keys.
    pub hot: HotKeyCounters,
    hot_key_rate: Family<HotKeyLabels, FloatGauge>,
    hot_key_share: Family<HotKeyLabels, FloatGauge>,
    shadow: ShadowFamilies,
    /// `[discovery]`: the servers DNS lists now.
    discovery: DiscoveryFigures,
}

/// What discovery found, for `stats` and `/metrics`.
#[derive(Debug)]
struct DiscoveryFigures {
    servers: Gauge,
    /// 1 for each server DNS lists now.
    server: Family<DiscoveredLabels, Gauge>,
    changes: Counter,
    failures: Counter,
    /// 1 while the records cannot be read (the last good list is kept).
    failing: Gauge,
    /// Seconds since the epoch of the last change of the list (0: none yet).
    last_change: Gauge,
    /// The source and the names, for `stats`; `None` without discovery.
    listed: std::sync::Mutex<Option<(String, Vec<String>)>>,
}

/// Discovery's figures as `stats discovery` and the general `stats` show
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryReport {
    /// `srv _memcache._tcp.cache` or `a cache:11211`.
    pub source: String,
    pub servers: Vec<String>,
    pub changes: u64,
    pub lookup_failures: u64,
    pub failing: bool,
    pub last_change: u64,
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

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    pub fn new() -> Stats {
        let mut registry = Registry::with_prefix("memring");
        let curr_connections = gauge(
            &mut registry,
            "client_connections",
            "Client connections open now",
        );
        let total_connections = counter(
            &mut registry,
            "client_connections_accepted",
            "Client connections accepted since start",
        );
        let command_family = Family::<CommandLabels, Counter>::default();
        registry.register(
            "client_requests",
            "Client requests by command",
            command_family.clone(),
        );
        let commands = Command::ALL
            .iter()
            .map(|c| {
                command_family
                    .get_or_create(&CommandLabels { command: c.name() })
                    .clone()
            })
            .collect();
        let keys_requested = counter(
            &mut registry,
            "get_keys",
            "Keys asked for by get, gets, gat and gats",
        );
        let hits = Family::<CommandLabels, Counter>::default();
        let misses = Family::<CommandLabels, Counter>::default();
        registry.register(
            "hits",
            "Replies that found their key, by command",
            hits.clone(),
        );
        registry.register(
            "misses",
            "Replies that did not find their key, by command",
            misses.clone(),
        );
        let hit_miss = |command: &'static str| HitMiss {
            hits: hits.get_or_create(&CommandLabels { command }).clone(),
            misses: misses.get_or_create(&CommandLabels { command }).clone(),
        };
        let get = hit_miss("get");
        let touch = hit_miss("touch");
        let delete = hit_miss("delete");
        let incr = hit_miss("incr");
        let decr = hit_miss("decr");
        let cas_family = Family::<ResultLabels, Counter>::default();
        registry.register(
            "cas",
            "Replies to compare-and-swap writes (cas, ms with C): hit stored, miss found no key, badval found a newer cas",
            cas_family.clone(),
        );
        let cas_result = |result| cas_family.get_or_create(&ResultLabels { result }).clone();
        let cas = CasCounters {
            hits: cas_result("hit"),
            misses: cas_result("miss"),
            badval: cas_result("badval"),
        };
        registry.register_collector(Box::new(ProcessCpu));
        let reply_owed = Arc::new(OwedParts::default());
        registry.register_collector(Box::new(ReplyBytesOwed(reply_owed.clone())));
        let bytes_read = counter(
            &mut registry,
            "client_read_bytes",
            "Bytes read from clients",
        );
        let bytes_written = counter(
            &mut registry,
            "client_written_bytes",
            "Bytes written to clients",
        );
        let backend_requests = Family::<ServerLabels, Counter>::default();
        registry.register(
            "backend_requests",
            "Requests sent to each server",
            backend_requests.clone(),
        );
        let backend_writes = Family::<ServerLabels, Counter>::default();
        registry.register(
            "backend_writes",
            "Socket writes to each server: backend_requests over this is how many requests share a write",
            backend_writes.clone(),
        );
        let backend_coalesced_gets = Family::<ServerLabels, Counter>::default();
        registry.register(
            "backend_coalesced_gets",
            "Gets of a hot key not sent to its server: they shared a request already on its way",
            backend_coalesced_gets.clone(),
        );
        let backend_errors = Family::<ServerErrorLabels, Counter>::default();
        registry.register(
            "backend_errors",
            "Failed requests by server and kind",
            backend_errors.clone(),
        );
        let backend_latency: Family<ServerLabels, PartedHistogram> = Family::default();
        registry.register(
            "backend_latency_seconds",
            "Time from writing a request to a server to its complete reply",
            backend_latency.clone(),
        );
        let backend_connections = Family::<ServerLabels, Gauge>::default();
        registry.register(
            "backend_connections",
            "Open connections to each server",
            backend_connections.clone(),
        );
        let server_state = Family::<ServerStateLabels, Gauge>::default();
        registry.register(
            "server_state",
            "1 for each server's current health state (ACTIVE, SUSPECT, DEAD)",
            server_state.clone(),
        );
        let server_membership = Family::<ServerStateLabels, Gauge>::default();
        registry.register(
            "server_membership",
            "1 for each server's part in a hand-off window (ACTIVE, JOINING, LEAVING)",
            server_membership.clone(),
        );
        let pool_gauge = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<PoolLabels, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let ring_version = pool_gauge(
            &mut registry,
            "ring_version",
            "Version of each pool's published ring",
        );
        let servers_configured = pool_gauge(
            &mut registry,
            "servers_configured",
            "Servers in each pool's config",
        );
        let servers_effective = pool_gauge(
            &mut registry,
            "servers_effective",
            "Servers in each pool's ring (configured minus ejected)",
        );
        let pool_requests = Family::<PoolCommandLabels, Counter>::default();
        registry.register(
            "pool_requests",
            "Client requests by the pool they were planned on, and command",
            pool_requests.clone(),
        );
        let pool_get_keys = Family::<PoolResultLabels, Counter>::default();
        registry.register(
            "pool_get_keys",
            "Keys asked by retrievals (get, gets, gat, gats) by pool: hit or miss",
            pool_get_keys.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register("reloads", "Config reloads by result", reloads.clone());
        for result in ["applied", "rejected"] {
            let _ = reloads.get_or_create(&ResultLabels { result });
        }
        let replica_background = counter(
            &mut registry,
            "replica_writes_background",
            "Replica writes still running when the client was answered on a quorum",
        );
        let handoff_reads = counter(
            &mut registry,
            "handoff_read_through",
            "Keys read from their previous owner after a miss on the new one (hand-off)",
        );
        let handoff_hits = counter(
            &mut registry,
            "handoff_read_through_hits",
            "Read-through keys found on their previous owner",
        );
        let handoff_copies = counter(
            &mut registry,
            "handoff_copies",
            "Values copied to their new owner during a hand-off window",
        );
        let handoff_copies_skipped = counter(
            &mut registry,
            "handoff_copies_skipped",
            "Copies not stored because the new owner already had a value, or a write reached their lease first",
        );
        let handoff_copy_failures = counter(
            &mut registry,
            "handoff_copy_failures",
            "Copies to a new owner that failed",
        );
        let handoff_copies_checked = counter(
            &mut registry,
            "handoff_copies_checked",
            "Read-through copies whose lease was placed, then replaced by the copy or taken back",
        );
        let handoff_copies_taken_back = counter(
            &mut registry,
            "handoff_copies_taken_back",
            "Leases and copies deleted again: the key changed where it was copied from",
        );
        let handoff_leftovers_deleted = counter(
            &mut registry,
            "handoff_leftovers_deleted",
            "Keys deleted from servers that no longer own them, as a hand-off window closes",
        );
        let handoff_sweeps = counter(
            &mut registry,
            "handoff_sweeps",
            "Servers swept of keys they no longer own as a hand-off window closes",
        );
        let handoff_windows_resumed = counter(
            &mut registry,
            "handoff_windows_resumed",
            "Hand-off windows taken up again from the state file at start",
        );
        let handoff_state_errors = counter(
            &mut registry,
            "handoff_state_errors",
            "Hand-off state files that could not be read at start or written since",
        );
        let latency_family: Family<CommandLabels, PartedHistogram> = Family::default();
        registry.register(
            "request_duration_seconds",
            "Time from reading a client request to having its whole reply, by command",
            latency_family.clone(),
        );
        let command_latency = Command::ALL
            .iter()
            .map(|c| {
                latency_family
                    .get_or_create(&CommandLabels { command: c.name() })
                    .clone()
            })
            .collect();
        let hot = HotKeyCounters {
            coalesced: counter(
                &mut registry,
                "hot_key_coalesced_gets",
                "Gets answered by another client's identical request already on its way to the server",
            ),
            cache_hits: counter(
                &mut registry,
                "near_cache_hits",
                "Hot-key gets answered from memring's near cache",
            ),
            cache_misses: counter(
                &mut registry,
                "near_cache_misses",
                "Hot-key gets the near cache could not answer",
            ),
            cache_evictions: counter(
                &mut registry,
                "near_cache_evictions",
                "Near-cache entries evicted to stay within hot_key_cache_bytes",
            ),
        };
        let hot_key_rate = Family::<HotKeyLabels, FloatGauge>::default();
        registry.register(
            "hot_key_requests_per_second",
            "Estimated requests per second of the hottest keys in the last window",
            hot_key_rate.clone(),
        );
        let hot_key_share = Family::<HotKeyLabels, FloatGauge>::default();
        registry.register(
            "hot_key_server_share",
            "Share of its server's requests that each of the hottest keys took in the last window",
            hot_key_share.clone(),
        );
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
        let discovery_server = Family::<DiscoveredLabels, Gauge>::default();
        registry.register(
            "discovery_server",
            "1 for each server that [discovery]'s DNS records list now",
            discovery_server.clone(),
        );
        let discovery = DiscoveryFigures {
            servers: gauge(
                &mut registry,
                "discovery_servers",
                "Servers that [discovery]'s DNS records list now (the last good answer)",
            ),
            server: discovery_server,
            changes: counter(
                &mut registry,
                "discovery_changes",
                "Changes of the discovered server list, each published as a membership change",
            ),
            failures: counter(
                &mut registry,
                "discovery_lookup_failures",
                "Discovery rounds whose DNS lookup failed or listed no server (the last good list stayed)",
            ),
            failing: gauge(
                &mut registry,
                "discovery_failing",
                "1 while the discovery records cannot be read",
            ),
            last_change: gauge(
                &mut registry,
                "discovery_last_change_seconds",
                "Seconds since the epoch when the discovered server list last changed (0: not since start)",
            ),
            listed: std::sync::Mutex::new(None),
        };
        Stats {
            discovery,
            shadow,
            hot,
            hot_key_rate,
            hot_key_share,
            started: Instant::now(),
            reset_baseline: Default::default(),
            reply_owed,
            replica_background,
            handoff_reads,
            handoff_hits,
            handoff_copies,
            handoff_leftovers_deleted,
            handoff_sweeps,
            handoff_windows_resumed,
            handoff_state_errors,
            handoff_copies_skipped,
            handoff_copy_failures,
            handoff_copies_taken_back,
            handoff_copies_checked,
            command_latency,
            registry,
            curr_connections,
            total_connections,
            commands,
            keys_requested,
            get,
            touch,
            delete,
            incr,
            decr,
            cas,
            bytes_read,
            bytes_written,
            backend_requests,
            backend_writes,
            backend_coalesced_gets,
            backend_errors,
            backend_latency,
            backend_connections,
            server_state,
            server_membership,
            ring_version,
            servers_configured,
            servers_effective,
            reloads,
            pool_requests,
            pool_get_keys,
        }
    }

    /// A client connected.
    pub fn client_connected(&self) {
        self.total_connections.inc();
        self.curr_connections.inc();
    }

    /// Counts `part` (one worker's reply bytes owed, which only that worker
    /// writes) in [`Stats::reply_bytes_owed`] for as long as the worker
    /// keeps it.
    pub fn publish_reply_owed(&self, part: &Arc<AtomicUsize>) {
        self.reply_owed.add(part);
    }

    /// Reply bytes memring's clients are owed now, over every worker:
    /// reserved for requests in flight, held for values not yet at a
    /// client's head, and queued to write (what `max_buffer_bytes` bounds).
    pub fn reply_bytes_owed(&self) -> u64 {
        self.reply_owed.sum()
    }

    /// A client disconnected.
    pub fn client_disconnected(&self) {
        self.curr_connections.dec();
    }

    /// Client connections open now.
    pub fn curr_connections(&self) -> u64 {
        self.curr_connections.get().max(0) as u64
    }

    /// One request of `command`, asking for `keys` keys.
    #[inline]
    pub fn request(&self, command: Command, keys: usize) {
        self.commands[command.index()].inc();
        if command.is_retrieval() {
            self.keys_requested.inc_by(keys as u64);
        }
    }

    /// A worker's part of `memring_request_duration_seconds` (how long a
    /// request took from being read to having its whole reply), which only
    /// that worker writes.
    pub fn latency_writer(&self) -> LatencyWriter {
        LatencyWriter::new(&self.command_latency)
    }

    #[inline]
    pub fn read_bytes(&self, n: usize) {
        self.bytes_read.inc_by(n as u64);
    }

    #[inline]
    pub fn written_bytes(&self, n: usize) {
        self.bytes_written.inc_by(n as u64);
    }

    /// Counts hits and misses from a one-line backend reply to `command`
    /// (retrievals are counted by [`Stats::retrieval`]).
    pub fn reply(&self, command: Command, reply: &[u8]) {
        let found = |counters: &HitMiss, hit: &[u8], miss: &[u8]| {
            if reply.starts_with(hit) {
                counters.hits.inc();
            } else if reply.starts_with(miss) {
                counters.misses.inc();
            }
        };
        match command {
            Command::Touch => found(&self.touch, b"TOUCHED", b"NOT_FOUND"),
            Command::Cas => {
                if reply.starts_with(b"STORED") {
                    self.cas.hits.inc();
                } else if reply.starts_with(b"NOT_FOUND") {
                    self.cas.misses.inc();
                } else if reply.starts_with(b"EXISTS") {
                    self.cas.badval.inc();
                }
            }
            Command::Delete => found(&self.delete, b"DELETED", b"NOT_FOUND"),
            Command::Incr | Command::Decr => {
                let counters = if command == Command::Incr {
                    &self.incr
                } else {
                    &self.decr
                };
                if reply.first().is_some_and(u8::is_ascii_digit) {
                    counters.hits.inc();
                } else if reply.starts_with(b"NOT_FOUND") {
                    counters.misses.inc();
                }
            }
            _ => {}
        }
    }

    /// Counts the reply to an `ms` with `C` in set mode, the meta writes
    /// memcached counts in its `cas_*` stats. Empty is an `HD` that `q`
    /// suppressed (`q` never hides `NF` or `EX`).
    pub fn meta_cas(&self, reply: &[u8]) {
        let code = reply.get(..2).unwrap_or(reply);
        let ends = matches!(reply.get(2), None | Some(b' ' | b'\r'));
        match code {
            b"" => self.cas.hits.inc(),
            b"HD" if ends => self.cas.hits.inc(),
            b"NF" if ends => self.cas.misses.inc(),
            b"EX" if ends => self.cas.badval.inc(),
            _ => 0,
        };
    }

    /// Counts a retrieval of `keys` keys of which `hits` were found.
    pub fn retrieval(&self, keys: usize, hits: usize) {
        add_some(&self.get.hits, hits);
        add_some(&self.get.misses, keys.saturating_sub(hits));
    }

    /// Keys read through from their previous owner, and hits there.
    pub fn read_through(&self, reads: usize, hits: usize) {
        if reads > 0 {
            self.handoff_reads.inc_by(reads as u64);
            self.handoff_hits.inc_by(hits as u64);
        }
    }

    /// Hand-off copies: stored, skipped, failed.
    pub fn copies(&self, made: usize, skipped: usize, failed: usize) {
        if made + skipped + failed > 0 {
            self.handoff_copies.inc_by(made as u64);
            self.handoff_copies_skipped.inc_by(skipped as u64);
            self.handoff_copy_failures.inc_by(failed as u64);
        }
    }

    /// A read-through copy's lease, or a command's copy, taken back: a write
    /// changed the key where it was copied from.
    pub fn copy_taken_back(&self) {
        self.handoff_copies_taken_back.inc();
    }

    /// A read-through copy whose lease was placed, then replaced by the
    /// copy or taken back.
    pub fn copy_checked(&self) {
        self.handoff_copies_checked.inc();
    }

    /// One server swept of `deleted` keys it no longer owns.
    pub fn swept(&self, deleted: u64) {
        self.handoff_sweeps.inc();
        self.handoff_leftovers_deleted.inc_by(deleted);
    }

    /// A pool's hand-off window taken up again from the state file.
    pub fn window_resumed(&self) {
        self.handoff_windows_resumed.inc();
    }

    /// The hand-off state file could not be read at start, or written.
    pub fn state_error(&self) {
        self.handoff_state_errors.inc();
    }

    /// Hand-off counters for `stats`: read-through keys, hits there, copies
    /// made, skipped and failed, servers swept and leftovers deleted,
    /// windows resumed at start and state file errors.
    pub fn handoff(&self) -> [(&'static str, u64); 11] {
        [
            ("handoff_read_through", self.handoff_reads.get()),
            ("handoff_read_through_hits", self.handoff_hits.get()),
            ("handoff_copies", self.handoff_copies.get()),
            ("handoff_copies_skipped", self.handoff_copies_skipped.get()),
            ("handoff_copy_failures", self.handoff_copy_failures.get()),
            ("handoff_copies_checked", self.handoff_copies_checked.get()),
            (
                "handoff_copies_taken_back",
                self.handoff_copies_taken_back.get(),
            ),
            ("handoff_sweeps", self.handoff_sweeps.get()),
            (
                "handoff_leftovers_deleted",
                self.handoff_leftovers_deleted.get(),
            ),
            (
                "handoff_windows_resumed",
                self.handoff_windows_resumed.get(),
            ),
            ("handoff_state_errors", self.handoff_state_errors.get()),
        ]
    }

    /// Replica writes left to finish after a quorum answered.
    pub fn replica_background(&self, outstanding: usize) {
        self.replica_background.inc_by(outstanding as u64);
    }

    /// Config reloads applied (`true`) or rejected (`false`) since start.
    pub fn reload_count(&self, applied: bool) -> u64 {
        let result = if applied { "applied" } else { "rejected" };
        self.reloads
            .get(&ResultLabels { result })
            .map_or(0, |counter| counter.get())
    }

    /// Replaces the hot-key gauges with `top`.
    pub fn hot_keys(&self, top: &[HotKeySample]) {
        self.hot_key_rate.clear();
        self.hot_key_share.clear();
        for sample in top {
            let labels = HotKeyLabels {
                server: Text(sample.server.clone()),
                key: Text(sample.key.clone()),
            };
            self.hot_key_rate.get_or_create(&labels).set(sample.rate);
            self.hot_key_share.get_or_create(&labels).set(sample.share);
        }
    }

    /// The servers discovery lists now, from `source`; `changed`: the list
    /// just changed (counted, and its time kept).
    pub fn discovered(&self, source: &str, servers: &[String], changed: bool) {
        let figures = &self.discovery;
        figures.servers.set(servers.len() as i64);
        figures.server.clear();
        for name in servers {
            figures
                .server
                .get_or_create(&DiscoveredLabels {
                    server: name.as_str().into(),
                })
                .set(1);
        }
        if changed {
            figures.changes.inc();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            figures.last_change.set(now as i64);
        }
        *figures.listed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((source.to_string(), servers.to_vec()));
    }

    /// A discovery round could (`false`) or could not (`true`) read its
    /// records.
    pub fn discovery_failed(&self, failing: bool) {
        if failing {
            self.discovery.failures.inc();
        }
        self.discovery.failing.set(i64::from(failing));
    }

    /// Discovery's figures; `None` when the pool does not come from DNS.
    pub fn discovery(&self) -> Option<DiscoveryReport> {
        let figures = &self.discovery;
        let listed = figures
            .listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        listed.map(|(source, servers)| DiscoveryReport {
            source,
            servers,
            changes: figures.changes.get(),
            lookup_failures: figures.failures.get(),
            failing: figures.failing.get() > 0,
            last_change: figures.last_change.get().max(0) as u64,
        })
    }

    /// A config reload was applied or rejected.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "rejected" };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// A topology was published.
    /// The hand-off memberships a server can have; the first is the usual.
    pub const MEMBERSHIPS: [&'static str; 3] = ["ACTIVE", "JOINING", "LEAVING"];

    /// A server's part in the hand-off window now (one of [`Self::MEMBERSHIPS`]).
    pub fn membership(&self, pool: &str, server: &str, current: &str) {
        for state in Self::MEMBERSHIPS {
            self.server_membership
                .get_or_create(&ServerStateLabels {
                    pool: pool.into(),
                    server: server.into(),
                    state,
                })
                .set(i64::from(state == current));
        }
    }

    /// A server left the topology: its membership lines go.
    pub fn membership_gone(&self, pool: &str, server: &str) {
        for state in Self::MEMBERSHIPS {
            self.server_membership.remove(&ServerStateLabels {
                pool: pool.into(),
                server: server.into(),
                state,
            });
        }
    }

    pub fn topology(&self, pool: &str, version: u64, configured: usize, effective: usize) {
        let labels = PoolLabels { pool: pool.into() };
        self.ring_version.get_or_create(&labels).set(version as i64);
        self.servers_configured
            .get_or_create(&labels)
            .set(configured as i64);
        self.servers_effective
            .get_or_create(&labels)
            .set(effective as i64);
    }

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

    /// The figures of pool `pool`, registered under its name.
    pub fn pool_figures(&self, pool: &str) -> std::sync::Arc<PoolFigures> {
        let requests = Command::ALL
            .iter()
            .map(|c| {
                self.pool_requests
                    .get_or_create(&PoolCommandLabels {
                        pool: pool.into(),
                        command: c.name(),
                    })
                    .clone()
            })
            .collect();
        let keys = |result| {
            self.pool_get_keys
                .get_or_create(&PoolResultLabels {
                    pool: pool.into(),
                    result,
                })
                .clone()
        };
        std::sync::Arc::new(PoolFigures {
            requests,
            hits: keys("hit"),
            misses: keys("miss"),
        })
    }

    /// A pool was removed by a reload: its figures go.
    pub fn pool_gone(&self, pool: &str) {
        let labels = PoolLabels { pool: pool.into() };
        self.ring_version.remove(&labels);
        self.servers_configured.remove(&labels);
        self.servers_effective.remove(&labels);
    }

    /// Handles for one server's figures. `error_kinds` are the labels of the
    /// ways a request can fail, indexed as [`BackendMetrics::error`] is
    /// called; `states` the health state labels, the first one current.
    pub fn backend(
        &self,
        pool: &str,
        server: &str,
        error_kinds: &[&'static str],
        states: &'static [&'static str],
    ) -> BackendMetrics {
        let labels = ServerLabels {
            pool: pool.into(),
            server: server.into(),
        };
        let metrics = BackendMetrics {
            pool: pool.to_string(),
            server: server.to_string(),
            requests: self.backend_requests.get_or_create(&labels).clone(),
            writes: self.backend_writes.get_or_create(&labels).clone(),
            coalesced: self.backend_coalesced_gets.get_or_create(&labels).clone(),
            latency: self.backend_latency.get_or_create(&labels).clone(),
            connections: self.backend_connections.get_or_create(&labels).clone(),
            error_kinds: error_kinds.to_vec().into_boxed_slice(),
            errors: self.backend_errors.clone(),
            error_counts: error_kinds
                .iter()
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            states,
            state: self.server_state.clone(),
        };
        if let Some(first) = states.first() {
            metrics.set_state(first);
        }
        metrics
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

    /// Requests of `command` since start.
    pub fn command_count(&self, command: Command) -> u64 {
        self.commands[command.index()].get()
    }

    /// Keys asked for by retrievals (memcached's `cmd_get`).
    pub fn keys_requested(&self) -> u64 {
        self.keys_requested.get()
    }

    /// (name, hits, misses) for get, delete, incr, decr and touch.
    pub fn hits_and_misses(&self) -> [(&'static str, u64, u64); 5] {
        let of = |name, c: &HitMiss| (name, c.hits.get(), c.misses.get());
        [
            of("get", &self.get),
            of("delete", &self.delete),
            of("incr", &self.incr),
            of("decr", &self.decr),
            of("touch", &self.touch),
        ]
    }

    /// Compare-and-swap replies: (hits, misses, badval).
    pub fn cas_counts(&self) -> (u64, u64, u64) {
        (
            self.cas.hits.get(),
            self.cas.misses.get(),
            self.cas.badval.get(),
        )
    }

    /// Client connections accepted since start.
    pub fn total_connections(&self) -> u64 {
        self.total_connections.get()
    }

    /// Bytes read from and written to clients.
    pub fn client_bytes(&self) -> (u64, u64) {
        (self.bytes_read.get(), self.bytes_written.get())
    }

    /// Seconds since start.
    pub fn uptime_seconds(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Total failed backend requests, all servers and kinds.
    pub fn backend_errors(&self) -> u64 {
        let mut text = String::new();
        // Families cannot be iterated; the encoded text is the one view of all
        // label sets. Only used by `stats` and tests, never per request.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text.lines()
            .filter(|l| l.starts_with("memring_backend_errors_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Every metric in the classic Prometheus text format (version 0.0.4),
    /// served as [`PROMETHEUS_TEXT_TYPE`]: what every Prometheus version and
    /// `promtool check metrics` read.
    pub fn prometheus_text(&self) -> String {
        classic_from_openmetrics(&self.openmetrics_text())
    }

    /// Every metric in OpenMetrics 1.0 text, served as
    /// [`OPENMETRICS_TEXT_TYPE`] to scrapers that ask for it.
    pub fn openmetrics_text(&self) -> String {
        let mut text = String::with_capacity(16384);
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// CPU time the process has used, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CpuTime {
    pub user_micros: u64,
    pub system_micros: u64,
}

/// The kernel reports `/proc` times in `USER_HZ` ticks, which Linux fixes at
/// 100 per second for user space on every architecture memring builds for
/// (`sysconf(_SC_CLK_TCK)` would need `unsafe` or another dependency).
const USER_HZ: u64 = 100;

/// This process's user and system CPU time from `/proc/self/stat` (all zero
/// where there is none). Read per `stats` and per scrape, never per request.
pub(crate) fn process_cpu() -> CpuTime {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| cpu_of_proc_stat(&stat))
        .unwrap_or_default()
}

/// `utime` and `stime`, fields 14 and 15 of `proc_pid_stat(5)`, counted after
/// the command name, which is in parentheses and may hold spaces or `)`.
fn cpu_of_proc_stat(stat: &str) -> Option<CpuTime> {
    let (_, after_name) = stat.rsplit_once(") ")?;
    // `after_name` starts at field 3 (the state).
    let mut fields = after_name.split_ascii_whitespace().skip(11);
    let mut micros = || -> Option<u64> {
        let ticks: u64 = fields.next()?.parse().ok()?;
        Some(ticks * (1_000_000 / USER_HZ))
    };
    Some(CpuTime {
        user_micros: micros()?,
        system_micros: micros()?,
    })
}

/// The workers' counts of reply bytes owed, summed when read (per `stats`
/// and per scrape), so that a request only writes its own worker's count.
#[derive(Debug, Default)]
struct OwedParts(Mutex<Vec<Weak<AtomicUsize>>>);

impl OwedParts {
    fn add(&self, part: &Arc<AtomicUsize>) {
        let mut parts = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Workers that ended let go of theirs.
        parts.retain(|part| part.strong_count() > 0);
        parts.push(Arc::downgrade(part));
    }

    fn sum(&self) -> u64 {
        let parts = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        parts
            .iter()
            .filter_map(Weak::upgrade)
            .map(|part| part.load(Ordering::Relaxed) as u64)
            .sum()
    }
}

/// `memring_client_reply_bytes_owed`, summed at each scrape.
#[derive(Debug)]
struct ReplyBytesOwed(Arc<OwedParts>);

impl Collector for ReplyBytesOwed {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let gauge = ConstGauge::new(self.0.sum() as i64);
        let metric = encoder.encode_descriptor(
            "client_reply_bytes_owed",
            "Reply bytes memring's clients are owed now: reserved for requests in flight, held and queued to write (bounded by max_buffer_bytes)",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

/// `memring_cpu_seconds_total{mode}`, read from `/proc` at each scrape.
#[derive(Debug)]
struct ProcessCpu;

impl Collector for ProcessCpu {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let cpu = process_cpu();
        let counter = ConstCounter::new(0.0f64);
        let mut family = encoder.encode_descriptor(
            "cpu_seconds",
            "CPU time memring has used, user and system (memcached's rusage_user and rusage_system)",
            None,
            counter.metric_type(),
        )?;
        for (mode, micros) in [("user", cpu.user_micros), ("system", cpu.system_micros)] {
            let labels = ModeLabels { mode };
            let sample = family.encode_family(&labels)?;
            ConstCounter::new(micros as f64 / 1e6).encode(sample)?;
        }
        Ok(())
    }
}

/// Content type of [`Stats::prometheus_text`].
pub(crate) const PROMETHEUS_TEXT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of [`Stats::openmetrics_text`].
pub(crate) const OPENMETRICS_TEXT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Rewrites prometheus-client's OpenMetrics output as classic Prometheus text.
/// The two differ, for what memring registers, in two places: a counter's
/// family (its `# HELP`/`# TYPE` name) has no `_total` in OpenMetrics but must
/// carry it in the classic format, where HELP and TYPE name the sample; and
/// the classic format has no `# EOF` (nor `# UNIT`) line.
fn classic_from_openmetrics(openmetrics: &str) -> String {
    let mut counters: Vec<&str> = Vec::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, "counter")) = rest.split_once(' ') {
                counters.push(name);
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|prefix| line.starts_with(prefix));
        match meta {
            Some(prefix) => {
                let rest = &line[prefix.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(&name) && !name.ends_with("_total") {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// One server's metric handles, held by its backend.
#[derive(Debug, Clone)]
pub struct BackendMetrics {
    pool: String,
    server: String,
    pub requests: Counter,
    /// Socket writes (`writev` calls) to this server.
    pub writes: Counter,
    /// Gets of hot keys that joined a request already on its way here.
    pub coalesced: Counter,
    /// Each connection observes with a writer of its own
    /// ([`PartedHistogram::writer`]).
    pub latency: PartedHistogram,
    pub connections: Gauge,
    error_kinds: Box<[&'static str]>,
    errors: Family<ServerErrorLabels, Counter>,
    /// Each kind's counter, created the first time that kind happens: no
    /// series for kinds that never happened, no label lookup after that.
    error_counts: Box<[std::sync::OnceLock<Counter>]>,
    states: &'static [&'static str],
    state: Family<ServerStateLabels, Gauge>,
}

impl BackendMetrics {
    /// A request to this server failed in the way `error_kinds[kind]` names.
    #[inline]
    pub fn error(&self, kind: usize) {
        let Some(slot) = self.error_counts.get(kind) else {
            return;
        };
        slot.get_or_init(|| {
            self.errors
                .get_or_create(&ServerErrorLabels {
                    pool: self.pool.as_str().into(),
                    server: self.server.as_str().into(),
                    kind: self.error_kinds[kind],
                })
                .clone()
        })
        .inc();
    }

    /// Failed requests of the kinds at these indexes.
    pub fn errors_of(&self, kinds: &[usize]) -> u64 {
        kinds
            .iter()
            .filter_map(|&kind| self.error_counts.get(kind)?.get())
            .map(Counter::get)
            .sum()
    }

    /// Failed requests of every kind.
    pub fn error_count(&self) -> u64 {
        self.error_counts
            .iter()
            .filter_map(std::sync::OnceLock::get)
            .map(Counter::get)
            .sum()
    }

    /// Records the current health state (one-hot over the states).
    pub fn set_state(&self, current: &str) {
        for &state in self.states {
            self.state
                .get_or_create(&ServerStateLabels {
                    pool: self.pool.as_str().into(),
                    server: self.server.as_str().into(),
                    state,
                })
                .set(i64::from(state == current));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_counts_create_series_only_for_kinds_that_happened() {
        let stats = Stats::new();
        let metrics = stats.backend(
            "default",
            "cache-01",
            &["timeout", "closed"],
            &["ACTIVE", "DEAD"],
        );
        assert_eq!(metrics.error_count(), 0);
        assert!(!stats
            .prometheus_text()
            .contains("memring_backend_errors_total{"));
        metrics.error(0);
        metrics.error(0);
        metrics.error(1);
        metrics.error(7);
        assert_eq!(metrics.error_count(), 3);
        assert_eq!(metrics.errors_of(&[0]), 2);
        assert_eq!(stats.backend_errors(), 3);
    }

    #[test]
    fn label_values_are_escaped_as_the_text_formats_require() {
        let stats = Stats::new();
        let metrics = stats.backend("default", "a\"b\\c\nd", &["timeout"], &["ACTIVE"]);
        metrics.requests.inc();
        stats.hot_keys(&[HotKeySample {
            server: "s\"1".into(),
            key: "k\\\"\n".into(),
            rate: 2.0,
            share: 0.5,
        }]);
        for text in [stats.prometheus_text(), stats.openmetrics_text()] {
            assert!(
                text.contains(
                    r#"memring_backend_requests_total{pool="default",server="a\"b\\c\nd"} 1"#
                ),
                "{text}"
            );
            assert!(
                text.contains(
                    r#"memring_hot_key_requests_per_second{server="s\"1",key="k\\\"\n"} 2.0"#
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn cpu_times_are_read_after_the_command_name() {
        let stat = "4242 (mem ring) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    123 45 0 0 20 0 3 0 1000 2000000 300 18446744073709551615";
        assert_eq!(
            cpu_of_proc_stat(stat),
            Some(CpuTime {
                user_micros: 1_230_000,
                system_micros: 450_000,
            })
        );
        assert_eq!(cpu_of_proc_stat("4242 (memring) S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").expect("Linux procfs");
        assert!(cpu_of_proc_stat(&own).is_some(), "{own}");
    }

    #[test]
    fn cas_replies_are_counted_by_result() {
        let stats = Stats::new();
        for reply in [
            &b"STORED\r\n"[..],
            b"EXISTS\r\n",
            b"NOT_FOUND\r\n",
            b"ERROR\r\n",
        ] {
            stats.reply(Command::Cas, reply);
        }
        assert_eq!(stats.cas_counts(), (1, 1, 1));
        for reply in [&b"HD\r\n"[..], b"", b"HD O1 k\r\n", b"EX\r\n", b"NF O2\r\n"] {
            stats.meta_cas(reply);
        }
        stats.meta_cas(b"NS\r\n");
        stats.meta_cas(b"SERVER_ERROR out of memory\r\n");
        assert_eq!(stats.cas_counts(), (4, 2, 2));
        let text = stats.prometheus_text();
        assert!(
            text.contains("memring_cas_total{result=\"badval\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE memring_cpu_seconds_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("memring_cpu_seconds_total{mode=\"user\"} "),
            "{text}"
        );
    }

    #[test]
    fn every_command_has_a_counter() {
        let stats = Stats::new();
        for command in Command::ALL {
            stats.request(command, 1);
            assert_eq!(stats.command_count(command), 1);
        }
    }

    #[test]
    fn classic_text_names_counters_with_total_and_has_no_eof() {
        let stats = Stats::new();
        stats.request(Command::Get, 1);
        stats.latency_writer().observe(Command::Get, 300_000);
        let text = stats.prometheus_text();
        assert!(text.contains("# TYPE memring_client_requests_total counter\n"));
        assert!(text.contains("# HELP memring_client_requests_total "));
        assert!(text.contains("memring_client_requests_total{command=\"get\"} 1\n"));
        assert!(text.contains("# TYPE memring_request_duration_seconds histogram\n"));
        assert!(text.contains("memring_request_duration_seconds_count{command=\"get\"} 1\n"));
        assert!(!text.contains("# EOF"));
        // Every sample belongs to the family named by the TYPE line before it.
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name);
                assert!(name == family || base == family, "{line} under {family}");
            }
        }
        assert!(stats.openmetrics_text().ends_with("# EOF\n"));
    }

    /// Every family with one series of each label set, its values cut off:
    /// what a scraper, a dashboard and promtool read besides the numbers.
    fn exposition_without_values(stats: &Stats) -> String {
        stats.request(Command::Get, 1);
        stats.latency_writer().observe(Command::Get, 300_000);
        let backend = stats.backend("default", "cache-01", &["timeout"], &["ACTIVE", "DEAD"]);
        backend.error(0);
        stats.membership("default", "cache-01", "ACTIVE");
        stats.topology("default", 1, 1, 1);
        let _ = stats.pool_figures("default");
        let _ = stats.shadow_counters("default", "shadow");
        stats.reload(true);
        stats.hot_keys(&[HotKeySample {
            server: "cache-01".into(),
            key: "k".into(),
            rate: 1.0,
            share: 0.5,
        }]);
        stats.discovered("srv _memcache._tcp.cache", &["cache-01".into()], true);
        // A family's series come out in its hash map's order: sorted here.
        let mut out = String::new();
        let mut series: Vec<&str> = Vec::new();
        let text = stats.prometheus_text();
        for line in text.lines() {
            if line.starts_with('#') {
                series.sort_unstable();
                series.drain(..).for_each(|s| out.extend([s, "\n"]));
                out.extend([line, "\n"]);
            } else {
                series.push(line.rsplit_once(' ').map_or(line, |(s, _)| s));
            }
        }
        series.sort_unstable();
        series.drain(..).for_each(|s| out.extend([s, "\n"]));
        out
    }

    #[test]
    fn every_family_keeps_its_name_help_type_and_labels() {
        let text = exposition_without_values(&Stats::new());
        // A new family, or a new label, changes this file on purpose:
        // `MEMRING_WRITE_GOLDEN=1 cargo test --lib every_family` writes it.
        if std::env::var_os("MEMRING_WRITE_GOLDEN").is_some() {
            let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/src/stats/exposition.golden");
            std::fs::write(golden, &text).expect("the golden file is writable");
        }
        assert_eq!(text, include_str!("stats/exposition.golden"));
    }
}
