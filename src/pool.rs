//! The pool: the one writer of the published topology. Config reloads and
//! health ejections both build their new topology here, one at a time, and
//! publish it with one arc-swap store; [`eject_on_health_changes`] is the
//! task that turns DEAD servers into ejections.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::backend::health::HealthState;
use crate::backend::{Backend, PoolHooks};
use crate::config::{Config, ServerConfig};
use crate::stats::Stats;
use crate::topology::{Change, SharedTopology, Topology};

/// Builds and publishes topologies, one at a time: config reloads and health
/// ejections both come through here, so neither can overwrite the other.
pub struct Publisher {
    topology: SharedTopology,
    /// Serialises build-and-store; never taken on the request path.
    lock: Mutex<()>,
    /// What backends report to (health changes, metrics).
    hooks: PoolHooks,
    /// Woken (all waiters) after every publish, so workers connect to new
    /// servers before traffic needs them.
    published: Arc<Notify>,
}

/// One published change.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub version: u64,
    pub change: Change,
}

impl Publisher {
    /// Builds the first topology (version 1) and starts its backends. Must be
    /// called inside a tokio runtime.
    pub fn new(config: Config, stats: Arc<Stats>) -> Arc<Publisher> {
        let hooks = PoolHooks {
            health_changed: Arc::new(Notify::new()),
            stats,
        };
        let backends = Topology::backends_for(&config, None, &hooks);
        let first = Topology::assemble(Arc::new(config), 1, backends, Vec::new());
        record(&hooks.stats, &first);
        Arc::new(Publisher {
            topology: Arc::new(ArcSwap::from_pointee(first)),
            lock: Mutex::new(()),
            hooks,
            published: Arc::new(Notify::new()),
        })
    }

    /// The published topology, for sessions.
    pub fn shared(&self) -> SharedTopology {
        self.topology.clone()
    }

    /// Woken after every publish.
    pub fn published(&self) -> Arc<Notify> {
        self.published.clone()
    }

    /// The counters every backend reports to.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.hooks.stats
    }

    /// Resolves when a server's health crossed DEAD (either way).
    pub async fn health_changed(&self) {
        self.hooks.health_changed.notified().await;
    }

    /// Publishes a new config. Servers that are DEAD stay ejected if ejection
    /// is on.
    pub fn apply_config(&self, config: Config) -> Published {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.topology.load_full();
        let config = Arc::new(config);
        // Ejection is judged on the backends the new topology will have: a
        // server whose address or settings changed gets a fresh backend.
        let backends = Topology::backends_for(&config, Some(&old), &self.hooks);
        let ejected = Self::to_eject(&config, &backends);
        self.publish(&old, config, backends, ejected)
    }

    /// Re-evaluates ejection after health changes; publishes only if the set of
    /// ejected servers changed.
    pub fn apply_health(&self) -> Option<Published> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.topology.load_full();
        let ejected = Self::to_eject(&old.config, &old.backends);
        if ejected.as_slice() == &old.ejected[..] {
            return None;
        }
        Some(self.publish(&old, old.config.clone(), old.backends.clone(), ejected))
    }

    fn publish(
        &self,
        old: &Topology,
        config: Arc<Config>,
        backends: Box<[Arc<Backend>]>,
        ejected: Vec<String>,
    ) -> Published {
        let servers_before: Vec<ServerConfig> = effective(&old.config.servers, &old.ejected);
        let servers_after: Vec<ServerConfig> = effective(&config.servers, &ejected);
        let newly_ejected: Vec<String> = ejected
            .iter()
            .filter(|n| !old.ejected.contains(n))
            .cloned()
            .collect();
        let restored: Vec<String> = old
            .ejected
            .iter()
            .filter(|n| !ejected.contains(n) && config.servers.iter().any(|s| &s.name == *n))
            .cloned()
            .collect();
        // Built off the request path; requests in flight finish on `old`.
        let new = Topology::assemble(config, old.version + 1, backends, ejected);
        let mut change = Change::between(&servers_before, &old.ring, &servers_after, &new.ring);
        // Ejections and restorations are reported as such, not as adds/removes.
        change.added.retain(|n| !restored.contains(n));
        change.removed.retain(|n| !newly_ejected.contains(n));
        change.ejected = newly_ejected;
        change.restored = restored;
        let version = new.version;
        record(&self.hooks.stats, &new);
        self.topology.store(Arc::new(new));
        self.published.notify_waiters();
        Published { version, change }
    }

    /// DEAD servers to leave out of the ring: none when ejection is off, and
    /// never all of them (an empty ring would fail every key instead of some).
    fn to_eject(config: &Config, backends: &[Arc<Backend>]) -> Vec<String> {
        if !config.auto_eject {
            return Vec::new();
        }
        let dead: Vec<String> = config
            .servers
            .iter()
            .filter(|server| {
                backends
                    .iter()
                    .any(|b| b.name() == server.name && b.state() == HealthState::Dead)
            })
            .map(|server| server.name.clone())
            .collect();
        if dead.len() == config.servers.len() {
            Vec::new()
        } else {
            dead
        }
    }
}

fn effective(servers: &[ServerConfig], ejected: &[String]) -> Vec<ServerConfig> {
    servers
        .iter()
        .filter(|s| !ejected.contains(&s.name))
        .cloned()
        .collect()
}

fn record(stats: &Stats, topology: &Topology) {
    stats.topology(
        topology.version,
        topology.backends.len(),
        topology.effective_servers(),
    );
}

/// Leaves DEAD servers out of the ring (when `auto_eject` is on) and puts them
/// back when they recover, each as one published topology change.
pub async fn eject_on_health_changes(publisher: Arc<Publisher>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = publisher.health_changed() => {}
            () = shutdown.cancelled() => return,
        }
        if let Some(Published { version, change }) = publisher.apply_health() {
            tracing::warn!("ring v{version}: {change}");
        }
    }
}
