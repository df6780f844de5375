//! The client side: connections, requests by command, the keys retrievals
//! asked for, hits and misses by command, compare-and-swap results, bytes
//! read and written, reply bytes owed, and how long requests took.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use super::{add_some, counter, gauge, CommandLabels, ResultLabels};
use crate::protocol::Command;
use crate::stats::latency::{LatencyWriter, PartedHistogram};
use crate::stats::Stats;

/// Hit and miss counters of one kind of command.
#[derive(Debug, Default, Clone)]
pub(in crate::stats) struct HitMiss {
    pub(in crate::stats) hits: Counter,
    pub(in crate::stats) misses: Counter,
}

/// Replies to compare-and-swap writes, as memcached's `cas_*` stats count
/// them: the cas matched (stored), the key was missing, the cas was stale.
#[derive(Debug, Clone)]
pub(in crate::stats) struct CasCounters {
    pub(in crate::stats) hits: Counter,
    pub(in crate::stats) misses: Counter,
    pub(in crate::stats) badval: Counter,
}

/// The client figures' handles.
#[derive(Debug)]
pub(in crate::stats) struct ClientFamilies {
    /// Each worker's reply bytes owed to its clients.
    reply_owed: Arc<OwedParts>,
    curr_connections: Gauge,
    total_connections: Counter,
    commands: Vec<Counter>,
    /// Keys asked for by retrieval commands (memcached's `cmd_get`).
    keys_requested: Counter,
    get: HitMiss,
    pub(in crate::stats) touch: HitMiss,
    pub(in crate::stats) delete: HitMiss,
    pub(in crate::stats) incr: HitMiss,
    pub(in crate::stats) decr: HitMiss,
    pub(in crate::stats) cas: CasCounters,
    bytes_read: Counter,
    bytes_written: Counter,
}

impl ClientFamilies {
    pub(in crate::stats) fn register(registry: &mut Registry) -> ClientFamilies {
        let curr_connections = gauge(
            registry,
            "client_connections",
            "Client connections open now",
        );
        let total_connections = counter(
            registry,
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
            registry,
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
        let reply_owed = Arc::new(OwedParts::default());
        registry.register_collector(Box::new(ReplyBytesOwed(reply_owed.clone())));
        let bytes_read = counter(registry, "client_read_bytes", "Bytes read from clients");
        let bytes_written = counter(registry, "client_written_bytes", "Bytes written to clients");
        ClientFamilies {
            reply_owed,
            curr_connections,
            total_connections,
            commands,
            keys_requested,
            get: hit_miss("get"),
            touch: hit_miss("touch"),
            delete: hit_miss("delete"),
            incr: hit_miss("incr"),
            decr: hit_miss("decr"),
            cas,
            bytes_read,
            bytes_written,
        }
    }
}

/// Registers `memring_request_duration_seconds`, and returns each command's
/// histogram, indexed as [`Command::index`] (each worker writes its own part).
pub(in crate::stats) fn register_request_latency(registry: &mut Registry) -> Vec<PartedHistogram> {
    let latency_family: Family<CommandLabels, PartedHistogram> = Family::default();
    registry.register(
        "request_duration_seconds",
        "Time from reading a client request to having its whole reply, by command",
        latency_family.clone(),
    );
    Command::ALL
        .iter()
        .map(|c| {
            latency_family
                .get_or_create(&CommandLabels { command: c.name() })
                .clone()
        })
        .collect()
}

impl Stats {
    /// A client connected.
    pub fn client_connected(&self) {
        self.client.total_connections.inc();
        self.client.curr_connections.inc();
    }

    /// Counts `part` (one worker's reply bytes owed, which only that worker
    /// writes) in [`Stats::reply_bytes_owed`] for as long as the worker
    /// keeps it.
    pub fn publish_reply_owed(&self, part: &Arc<AtomicUsize>) {
        self.client.reply_owed.add(part);
    }

    /// Reply bytes memring's clients are owed now, over every worker:
    /// reserved for requests in flight, held for values not yet at a
    /// client's head, and queued to write (what `max_buffer_bytes` bounds).
    pub fn reply_bytes_owed(&self) -> u64 {
        self.client.reply_owed.sum()
    }

    /// A client disconnected.
    pub fn client_disconnected(&self) {
        self.client.curr_connections.dec();
    }

    /// Client connections open now.
    pub fn curr_connections(&self) -> u64 {
        self.client.curr_connections.get().max(0) as u64
    }

    /// One request of `command`, asking for `keys` keys.
    #[inline]
    pub fn request(&self, command: Command, keys: usize) {
        self.client.commands[command.index()].inc();
        if command.is_retrieval() {
            self.client.keys_requested.inc_by(keys as u64);
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
        self.client.bytes_read.inc_by(n as u64);
    }

    #[inline]
    pub fn written_bytes(&self, n: usize) {
        self.client.bytes_written.inc_by(n as u64);
    }

    /// Counts a retrieval of `keys` keys of which `hits` were found.
    pub fn retrieval(&self, keys: usize, hits: usize) {
        add_some(&self.client.get.hits, hits);
        add_some(&self.client.get.misses, keys.saturating_sub(hits));
    }

    /// Requests of `command` since start.
    pub fn command_count(&self, command: Command) -> u64 {
        self.client.commands[command.index()].get()
    }

    /// Keys asked for by retrievals (memcached's `cmd_get`).
    pub fn keys_requested(&self) -> u64 {
        self.client.keys_requested.get()
    }

    /// (name, hits, misses) for get, delete, incr, decr and touch.
    pub fn hits_and_misses(&self) -> [(&'static str, u64, u64); 5] {
        let of = |name, c: &HitMiss| (name, c.hits.get(), c.misses.get());
        let client = &self.client;
        [
            of("get", &client.get),
            of("delete", &client.delete),
            of("incr", &client.incr),
            of("decr", &client.decr),
            of("touch", &client.touch),
        ]
    }

    /// Compare-and-swap replies: (hits, misses, badval).
    pub fn cas_counts(&self) -> (u64, u64, u64) {
        let cas = &self.client.cas;
        (cas.hits.get(), cas.misses.get(), cas.badval.get())
    }

    /// Client connections accepted since start.
    pub fn total_connections(&self) -> u64 {
        self.client.total_connections.get()
    }

    /// Bytes read from and written to clients.
    pub fn client_bytes(&self) -> (u64, u64) {
        (
            self.client.bytes_read.get(),
            self.client.bytes_written.get(),
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_a_counter() {
        let stats = Stats::new();
        for command in Command::ALL {
            stats.request(command, 1);
            assert_eq!(stats.command_count(command), 1);
        }
    }
}
