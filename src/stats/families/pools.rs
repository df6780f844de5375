//! Each pool's figures: its ring's version, its servers configured and in
//! the ring, the requests planned on it and its retrievals' hits and misses
//! ([`PoolFigures`]); and the config reloads that change the pools.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{add_some, ResultLabels, Text};
use crate::protocol::Command;
use crate::stats::Stats;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: Text,
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

/// The per-pool families and the reloads.
#[derive(Debug)]
pub(in crate::stats) struct PoolFamilies {
    ring_version: Family<PoolLabels, Gauge>,
    servers_configured: Family<PoolLabels, Gauge>,
    servers_effective: Family<PoolLabels, Gauge>,
    requests: Family<PoolCommandLabels, Counter>,
    get_keys: Family<PoolResultLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
}

impl PoolFamilies {
    pub(in crate::stats) fn register(registry: &mut Registry) -> PoolFamilies {
        let pool_gauge = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<PoolLabels, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let ring_version = pool_gauge(
            registry,
            "ring_version",
            "Version of each pool's published ring",
        );
        let servers_configured = pool_gauge(
            registry,
            "servers_configured",
            "Servers in each pool's config",
        );
        let servers_effective = pool_gauge(
            registry,
            "servers_effective",
            "Servers in each pool's ring (configured minus ejected)",
        );
        let requests = Family::<PoolCommandLabels, Counter>::default();
        registry.register(
            "pool_requests",
            "Client requests by the pool they were planned on, and command",
            requests.clone(),
        );
        let get_keys = Family::<PoolResultLabels, Counter>::default();
        registry.register(
            "pool_get_keys",
            "Keys asked by retrievals (get, gets, gat, gats) by pool: hit or miss",
            get_keys.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register("reloads", "Config reloads by result", reloads.clone());
        for result in ["applied", "rejected"] {
            let _ = reloads.get_or_create(&ResultLabels { result });
        }
        PoolFamilies {
            ring_version,
            servers_configured,
            servers_effective,
            requests,
            get_keys,
            reloads,
        }
    }
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

impl Stats {
    /// Config reloads applied (`true`) or rejected (`false`) since start.
    pub fn reload_count(&self, applied: bool) -> u64 {
        let result = if applied { "applied" } else { "rejected" };
        self.pools
            .reloads
            .get(&ResultLabels { result })
            .map_or(0, |counter| counter.get())
    }

    /// A config reload was applied or rejected.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "rejected" };
        self.pools
            .reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// A topology of pool `pool` was published.
    pub fn topology(&self, pool: &str, version: u64, configured: usize, effective: usize) {
        let labels = PoolLabels { pool: pool.into() };
        let families = &self.pools;
        families
            .ring_version
            .get_or_create(&labels)
            .set(version as i64);
        families
            .servers_configured
            .get_or_create(&labels)
            .set(configured as i64);
        families
            .servers_effective
            .get_or_create(&labels)
            .set(effective as i64);
    }

    /// The figures of pool `pool`, registered under its name.
    pub fn pool_figures(&self, pool: &str) -> std::sync::Arc<PoolFigures> {
        let requests = Command::ALL
            .iter()
            .map(|c| {
                self.pools
                    .requests
                    .get_or_create(&PoolCommandLabels {
                        pool: pool.into(),
                        command: c.name(),
                    })
                    .clone()
            })
            .collect();
        let keys = |result| {
            self.pools
                .get_keys
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
        let families = &self.pools;
        families.ring_version.remove(&labels);
        families.servers_configured.remove(&labels);
        families.servers_effective.remove(&labels);
    }
}
