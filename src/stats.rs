//! Counters, shared by memcached's `stats` reply and the Prometheus endpoint.
//!
//! Every figure is a prometheus-client metric registered once at start; hot
//! paths hold clones of the handles they bump (an atomic add, no lock, no
//! label lookup). Per-server handles live in [`BackendMetrics`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::backend::health::HealthState;
use crate::error::BackendErrorKind;
use crate::protocol::encode::write_stat;
use crate::protocol::reply::ValueBlocks;
use crate::protocol::Command;
use crate::topology::Topology;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerErrorLabels {
    server: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerStateLabels {
    server: String,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

const COMMANDS: [Command; 19] = [
    Command::Get,
    Command::Gets,
    Command::Gat,
    Command::Gats,
    Command::Set,
    Command::Add,
    Command::Replace,
    Command::Append,
    Command::Prepend,
    Command::Cas,
    Command::Delete,
    Command::Incr,
    Command::Decr,
    Command::Touch,
    Command::Version,
    Command::Verbosity,
    Command::FlushAll,
    Command::Stats,
    Command::Quit,
];

fn command_index(command: Command) -> usize {
    COMMANDS
        .iter()
        .position(|&c| c == command)
        .expect("every command is listed")
}

const STATES: [HealthState; 3] = [HealthState::Active, HealthState::Suspect, HealthState::Dead];

/// A counter registered under `name`.
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let metric = Counter::default();
    registry.register(name, help, metric.clone());
    metric
}

/// A gauge registered under `name`.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let metric = Gauge::default();
    registry.register(name, help, metric.clone());
    metric
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s, doubling.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Hit and miss counters of one kind of command.
#[derive(Debug, Default, Clone)]
struct HitMiss {
    hits: Counter,
    misses: Counter,
}

/// Process-wide figures.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    registry: Registry,
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
    bytes_read: Counter,
    bytes_written: Counter,
    backend_requests: Family<ServerLabels, Counter>,
    backend_errors: Family<ServerErrorLabels, Counter>,
    backend_latency: Family<ServerLabels, Histogram, fn() -> Histogram>,
    backend_connections: Family<ServerLabels, Gauge>,
    server_state: Family<ServerStateLabels, Gauge>,
    ring_version: Gauge,
    servers_configured: Gauge,
    servers_effective: Gauge,
    reloads: Family<ResultLabels, Counter>,
    replica_background: Counter,
    /// Per-command request latency, indexed like `commands`.
    command_latency: Vec<Histogram>,
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
        let commands = COMMANDS
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
        let backend_errors = Family::<ServerErrorLabels, Counter>::default();
        registry.register(
            "backend_errors",
            "Failed requests by server and kind",
            backend_errors.clone(),
        );
        let backend_latency: Family<ServerLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
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
        let ring_version = gauge(
            &mut registry,
            "ring_version",
            "Version of the published ring",
        );
        let servers_configured =
            gauge(&mut registry, "servers_configured", "Servers in the config");
        let servers_effective = gauge(
            &mut registry,
            "servers_effective",
            "Servers in the ring (configured minus ejected)",
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
        let latency_family: Family<CommandLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from reading a client request to having its whole reply, by command",
            latency_family.clone(),
        );
        let command_latency = COMMANDS
            .iter()
            .map(|c| {
                latency_family
                    .get_or_create(&CommandLabels { command: c.name() })
                    .clone()
            })
            .collect();
        Stats {
            started: Instant::now(),
            replica_background,
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
            bytes_read,
            bytes_written,
            backend_requests,
            backend_errors,
            backend_latency,
            backend_connections,
            server_state,
            ring_version,
            servers_configured,
            servers_effective,
            reloads,
        }
    }

    /// A client connected.
    pub fn client_connected(&self) {
        self.total_connections.inc();
        self.curr_connections.inc();
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
        self.commands[command_index(command)].inc();
        if command.is_retrieval() {
            self.keys_requested.inc_by(keys as u64);
        }
    }

    /// One request of `command` took `seconds` from being read to having its
    /// whole reply (feeds `memring_request_duration_seconds`).
    #[inline]
    pub fn command_latency(&self, command: Command, seconds: f64) {
        self.command_latency[command_index(command)].observe(seconds);
    }

    #[inline]
    pub fn read_bytes(&self, n: usize) {
        self.bytes_read.inc_by(n as u64);
    }

    #[inline]
    pub fn written_bytes(&self, n: usize) {
        self.bytes_written.inc_by(n as u64);
    }

    /// Counts hits and misses from a backend reply to `command` for `keys` keys.
    pub fn reply(&self, command: Command, keys: usize, reply: &[u8]) {
        let found = |counters: &HitMiss, hit: &[u8], miss: &[u8]| {
            if reply.starts_with(hit) {
                counters.hits.inc();
            } else if reply.starts_with(miss) {
                counters.misses.inc();
            }
        };
        match command {
            Command::Get | Command::Gets | Command::Gat | Command::Gats => {
                let hits = ValueBlocks::new(reply).count();
                self.retrieval(keys, hits);
            }
            Command::Touch => found(&self.touch, b"TOUCHED", b"NOT_FOUND"),
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

    /// Counts a retrieval of `keys` keys of which `hits` were found.
    pub fn retrieval(&self, keys: usize, hits: usize) {
        self.get.hits.inc_by(hits as u64);
        self.get.misses.inc_by(keys.saturating_sub(hits) as u64);
    }

    /// Replica writes left to finish after a quorum answered.
    pub fn replica_background(&self, outstanding: usize) {
        self.replica_background.inc_by(outstanding as u64);
    }

    /// A config reload was applied or rejected.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "rejected" };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// A topology was published.
    pub fn topology(&self, topology: &Topology) {
        self.ring_version.set(topology.version as i64);
        self.servers_configured.set(topology.backends.len() as i64);
        self.servers_effective
            .set((topology.backends.len() - topology.ejected.len()) as i64);
    }

    /// Handles for one server's figures.
    pub fn backend(&self, server: &str) -> BackendMetrics {
        let labels = ServerLabels {
            server: server.to_string(),
        };
        let metrics = BackendMetrics {
            server: server.to_string(),
            requests: self.backend_requests.get_or_create(&labels).clone(),
            latency: self.backend_latency.get_or_create(&labels).clone(),
            connections: self.backend_connections.get_or_create(&labels).clone(),
            errors: self.backend_errors.clone(),
            state: self.server_state.clone(),
        };
        metrics.set_state(HealthState::Active);
        metrics
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

    /// The `stats` reply: memring's own figures in memcached's format, then
    /// per-server lines, then `END`.
    pub fn write_report(&self, out: &mut BytesMut, topology: &Topology) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let count = |command: Command| self.commands[command_index(command)].get();
        write_stat(out, "pid", &std::process::id());
        write_stat(out, "uptime", &self.started.elapsed().as_secs());
        write_stat(out, "time", &now);
        write_stat(out, "version", &crate::VERSION_STRING);
        write_stat(out, "curr_connections", &self.curr_connections());
        write_stat(out, "total_connections", &self.total_connections.get());
        write_stat(out, "cmd_get", &self.keys_requested.get());
        let sets = [
            Command::Set,
            Command::Add,
            Command::Replace,
            Command::Append,
            Command::Prepend,
            Command::Cas,
        ];
        write_stat(out, "cmd_set", &sets.iter().map(|&c| count(c)).sum::<u64>());
        write_stat(out, "cmd_touch", &count(Command::Touch));
        write_stat(out, "cmd_flush", &count(Command::FlushAll));
        for (name, counters) in [
            ("get", &self.get),
            ("delete", &self.delete),
            ("incr", &self.incr),
            ("decr", &self.decr),
            ("touch", &self.touch),
        ] {
            write_stat(out, &format!("{name}_hits"), &counters.hits.get());
            write_stat(out, &format!("{name}_misses"), &counters.misses.get());
        }
        write_stat(out, "bytes_read", &self.bytes_read.get());
        write_stat(out, "bytes_written", &self.bytes_written.get());
        write_stat(out, "ring_version", &topology.version);
        write_stat(out, "ring_servers", &topology.backends.len());
        write_stat(out, "ring_ejected", &topology.ejected.len());
        let shares = topology.shares();
        for (i, backend) in topology.backends.iter().enumerate() {
            let name = backend.name();
            let metrics = backend.metrics();
            write_stat(out, &format!("server:{name}:addr"), &backend.addr());
            write_stat(
                out,
                &format!("server:{name}:state"),
                &backend.state().as_str(),
            );
            write_stat(
                out,
                &format!("server:{name}:requests"),
                &metrics.requests.get(),
            );
            write_stat(
                out,
                &format!("server:{name}:errors"),
                &metrics.error_count(),
            );
            write_stat(
                out,
                &format!("server:{name}:timeouts"),
                &metrics.timeout_count(),
            );
            write_stat(
                out,
                &format!("server:{name}:connections"),
                &metrics.connections.get(),
            );
            let share = shares.get(i).copied().unwrap_or(0.0);
            write_stat(
                out,
                &format!("server:{name}:ring_share"),
                &format_args!("{share:.4}"),
            );
        }
        out.extend_from_slice(b"END\r\n");
    }
}

/// Content type of [`Stats::prometheus_text`].
pub const PROMETHEUS_TEXT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of [`Stats::openmetrics_text`].
pub const OPENMETRICS_TEXT_TYPE: &str =
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
    server: String,
    pub requests: Counter,
    pub latency: Histogram,
    pub connections: Gauge,
    errors: Family<ServerErrorLabels, Counter>,
    state: Family<ServerStateLabels, Gauge>,
}

impl BackendMetrics {
    /// A request to this server failed. Rare, so the label lookup is fine.
    pub fn error(&self, kind: BackendErrorKind) {
        self.errors
            .get_or_create(&ServerErrorLabels {
                server: self.server.clone(),
                kind: error_kind_label(kind),
            })
            .inc();
    }

    /// Failed requests of the given kinds (labels). Reads only: no series is
    /// created for a kind that never happened.
    fn errors_of(&self, kinds: &[&'static str]) -> u64 {
        kinds
            .iter()
            .filter_map(|&kind| {
                self.errors
                    .get(&ServerErrorLabels {
                        server: self.server.clone(),
                        kind,
                    })
                    .map(|counter| counter.get())
            })
            .sum()
    }

    /// Failed requests of every kind.
    pub fn error_count(&self) -> u64 {
        self.errors_of(&ERROR_KIND_LABELS)
    }

    /// Requests that timed out.
    pub fn timeout_count(&self) -> u64 {
        self.errors_of(&[error_kind_label(BackendErrorKind::Timeout)])
    }

    /// Records the current health state (one-hot over the three states).
    pub fn set_state(&self, current: HealthState) {
        for state in STATES {
            self.state
                .get_or_create(&ServerStateLabels {
                    server: self.server.clone(),
                    state: state.as_str(),
                })
                .set(i64::from(state == current));
        }
    }
}

/// Every value `error_kind_label` can return.
const ERROR_KIND_LABELS: [&str; 8] = [
    "connect",
    "connect_timeout",
    "timeout",
    "closed",
    "io",
    "protocol",
    "gone",
    "dead",
];

fn error_kind_label(kind: BackendErrorKind) -> &'static str {
    match kind {
        BackendErrorKind::Connect(_) => "connect",
        BackendErrorKind::ConnectTimeout => "connect_timeout",
        BackendErrorKind::Timeout => "timeout",
        BackendErrorKind::Closed => "closed",
        BackendErrorKind::Io(_) => "io",
        BackendErrorKind::Protocol(_) => "protocol",
        BackendErrorKind::Gone => "gone",
        BackendErrorKind::Dead => "dead",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_counts_cover_every_kind_and_create_no_series() {
        let stats = Stats::new();
        let metrics = stats.backend("cache-01");
        assert_eq!(metrics.error_count(), 0);
        assert!(!stats
            .prometheus_text()
            .contains("memring_backend_errors_total{"));
        let kinds = [
            BackendErrorKind::Connect(std::io::ErrorKind::ConnectionRefused),
            BackendErrorKind::ConnectTimeout,
            BackendErrorKind::Timeout,
            BackendErrorKind::Closed,
            BackendErrorKind::Io(std::io::ErrorKind::BrokenPipe),
            BackendErrorKind::Protocol(crate::protocol::ReplyError::Unsolicited),
            BackendErrorKind::Gone,
            BackendErrorKind::Dead,
        ];
        for kind in kinds {
            assert!(
                ERROR_KIND_LABELS.contains(&error_kind_label(kind)),
                "{kind:?}"
            );
            metrics.error(kind);
        }
        assert_eq!(metrics.error_count(), kinds.len() as u64);
        assert_eq!(metrics.timeout_count(), 1);
        assert_eq!(stats.backend_errors(), kinds.len() as u64);
    }

    #[test]
    fn classic_text_names_counters_with_total_and_has_no_eof() {
        let stats = Stats::new();
        stats.request(Command::Get, 1);
        stats.command_latency(Command::Get, 0.000_3);
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
}
