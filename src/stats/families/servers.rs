//! Each server's figures: requests, socket writes, coalesced gets, errors by
//! kind, latency, open connections, health state and hand-off membership.
//! A backend holds its own handles ([`BackendMetrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Text;
use crate::stats::latency::PartedHistogram;
use crate::stats::Stats;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    pool: Text,
    server: Text,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerErrorLabels {
    pool: Text,
    server: Text,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerRejectedLabels {
    pool: Text,
    server: Text,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerStateLabels {
    pool: Text,
    server: Text,
    state: &'static str,
}

/// The per-server families, from which [`Stats::backend`] hands out handles.
#[derive(Debug)]
pub(in crate::stats) struct ServerFamilies {
    requests: Family<ServerLabels, Counter>,
    writes: Family<ServerLabels, Counter>,
    coalesced_gets: Family<ServerLabels, Counter>,
    errors: Family<ServerErrorLabels, Counter>,
    rejected: Family<ServerRejectedLabels, Counter>,
    latency: Family<ServerLabels, PartedHistogram>,
    connections: Family<ServerLabels, Gauge>,
    state: Family<ServerStateLabels, Gauge>,
    /// 1 for each server's part in a hand-off window (ACTIVE, JOINING, LEAVING) or WARMING.
    membership: Family<ServerStateLabels, Gauge>,
}

impl ServerFamilies {
    pub(in crate::stats) fn register(registry: &mut Registry) -> ServerFamilies {
        let families = ServerFamilies {
            requests: Family::default(),
            writes: Family::default(),
            coalesced_gets: Family::default(),
            errors: Family::default(),
            rejected: Family::default(),
            latency: Family::default(),
            connections: Family::default(),
            state: Family::default(),
            membership: Family::default(),
        };
        registry.register(
            "backend_requests",
            "Requests sent to each server",
            families.requests.clone(),
        );
        registry.register(
            "backend_writes",
            "Socket writes to each server: backend_requests over this is how many requests share a write",
            families.writes.clone(),
        );
        registry.register(
            "backend_coalesced_gets",
            "Gets of a hot key not sent to its server: they shared a request already on its way",
            families.coalesced_gets.clone(),
        );
        registry.register(
            "backend_errors",
            "Failed requests by server and kind",
            families.errors.clone(),
        );
        registry.register(
            "backend_rejected",
            "Requests memring answered itself instead of sending them to the server, by reason (busy: max_server_inflight reached)",
            families.rejected.clone(),
        );
        registry.register(
            "backend_latency_seconds",
            "Time from writing a request to a server to its complete reply",
            families.latency.clone(),
        );
        registry.register(
            "backend_connections",
            "Open connections to each server",
            families.connections.clone(),
        );
        registry.register(
            "server_state",
            "1 for each server's current health state (ACTIVE, SUSPECT, DEAD)",
            families.state.clone(),
        );
        registry.register(
            "server_membership",
            "1 for each server's part in a hand-off window (ACTIVE, JOINING, LEAVING) or WARMING",
            families.membership.clone(),
        );
        families
    }
}

impl Stats {
    /// The hand-off memberships a server can have; the first is the usual.
    pub const MEMBERSHIPS: [&'static str; 4] = ["ACTIVE", "JOINING", "LEAVING", "WARMING"];

    /// A server's part in the hand-off window now (one of [`Self::MEMBERSHIPS`]).
    pub fn membership(&self, pool: &str, server: &str, current: &str) {
        for state in Self::MEMBERSHIPS {
            self.servers
                .membership
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
            self.servers.membership.remove(&ServerStateLabels {
                pool: pool.into(),
                server: server.into(),
                state,
            });
        }
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
        let families = &self.servers;
        let metrics = BackendMetrics {
            pool: pool.to_string(),
            server: server.to_string(),
            requests: families.requests.get_or_create(&labels).clone(),
            writes: families.writes.get_or_create(&labels).clone(),
            coalesced: families.coalesced_gets.get_or_create(&labels).clone(),
            latency: families.latency.get_or_create(&labels).clone(),
            connections: families.connections.get_or_create(&labels).clone(),
            error_kinds: error_kinds.to_vec().into_boxed_slice(),
            errors: families.errors.clone(),
            rejected_busy: families
                .rejected
                .get_or_create(&ServerRejectedLabels {
                    pool: pool.into(),
                    server: server.into(),
                    reason: "busy",
                })
                .clone(),
            error_counts: error_kinds
                .iter()
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            states,
            state: families.state.clone(),
        };
        if let Some(first) = states.first() {
            metrics.set_state(first);
        }
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
    /// Requests answered `SERVER_ERROR server busy` because this worker
    /// had `max_server_inflight` of them in flight to the server.
    pub rejected_busy: Counter,
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
}
