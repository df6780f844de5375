//! The topology: the effective ring plus the backends it routes to, with a
//! version. It is published through one `ArcSwap`, so a session loads it once
//! per request without a lock; a reload or an ejection replaces it in one store.
//! The [`Publisher`] is the one place that builds and stores topologies.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::backend::health::HealthState;
use crate::backend::{Backend, BackendSettings, PoolHooks};
use crate::config::{Config, ServerConfig};
use crate::protocol::Limits;
use crate::ring::Ring;
use crate::stats::Stats;

/// One immutable routing table.
#[derive(Debug)]
pub struct Topology {
    /// Increases by one with every published change (reload or ejection).
    pub version: u64,
    /// The effective ring: the configured servers minus the ejected ones.
    pub ring: Ring,
    /// `ring_backends[i]` is the index in `backends` of ring member `i`.
    ring_backends: Box<[u32]>,
    /// Every configured server, in config order. Ejected servers keep their
    /// backend, which keeps probing them so they can come back.
    pub backends: Box<[Arc<Backend>]>,
    /// The config this topology was built from.
    pub config: Arc<Config>,
    /// Names of the servers left out of the ring because they are DEAD.
    pub ejected: Box<[String]>,
    /// Parser limits, which a reload may change.
    pub limits: Limits,
}

/// The current topology, shared by every session.
pub type SharedTopology = Arc<ArcSwap<Topology>>;

impl Topology {
    /// The backends for `config`: a server that `previous` already has with the
    /// same identity, address and connection settings keeps its backend (and
    /// its open connections); every other server gets a new one.
    fn backends_for(
        config: &Config,
        previous: Option<&Topology>,
        hooks: &PoolHooks,
    ) -> Box<[Arc<Backend>]> {
        let settings = BackendSettings::from_config(config);
        config
            .servers
            .iter()
            .map(|server| {
                previous
                    .and_then(|p| p.backend_for(server, settings))
                    .unwrap_or_else(|| Backend::start(server, settings, hooks))
            })
            .collect()
    }

    /// A topology over `backends` (one per configured server, in config order)
    /// with the servers named in `ejected` left out of the ring.
    fn assemble(
        config: Arc<Config>,
        version: u64,
        backends: Box<[Arc<Backend>]>,
        ejected: Vec<String>,
    ) -> Topology {
        let mut nodes = Vec::with_capacity(backends.len());
        let mut ring_backends = Vec::with_capacity(backends.len());
        for (i, server) in config.servers.iter().enumerate() {
            if !ejected.contains(&server.name) {
                nodes.push(server.node());
                ring_backends.push(i as u32);
            }
        }
        Topology {
            version,
            ring: Ring::build_with(&config.ring, nodes),
            ring_backends: ring_backends.into_boxed_slice(),
            backends,
            limits: config.limits,
            config,
            ejected: ejected.into_boxed_slice(),
        }
    }

    fn backend_for(
        &self,
        server: &ServerConfig,
        settings: BackendSettings,
    ) -> Option<Arc<Backend>> {
        self.backends
            .iter()
            .find(|b| {
                b.name() == server.name && b.addr() == server.addr && b.settings() == settings
            })
            .cloned()
    }

    /// Index in `backends` of the server that owns `key`.
    #[inline]
    pub fn owner_index(&self, key: &[u8]) -> Option<usize> {
        self.ring
            .owner(key)
            .map(|member| self.ring_backends[member] as usize)
    }

    /// Backend indexes of `key`'s replica set (owner first), `config.replicas`
    /// long at most; the ring walk skips ejected servers, which are not on it.
    pub fn replicas(&self, key: &[u8], out: &mut smallvec::SmallVec<[usize; 4]>) {
        self.ring.replicas(key, self.config.replicas, out);
        for member in out.iter_mut() {
            *member = self.ring_backends[*member] as usize;
        }
    }

    /// The backend that owns `key`.
    #[inline]
    pub fn owner(&self, key: &[u8]) -> Option<&Arc<Backend>> {
        self.owner_index(key).map(|i| &self.backends[i])
    }

    /// Each backend's share of the keyspace (0 for ejected servers).
    pub fn shares(&self) -> Vec<f64> {
        let mut shares = vec![0.0; self.backends.len()];
        for (member, share) in self.ring.shares().into_iter().enumerate() {
            shares[self.ring_backends[member] as usize] = share;
        }
        shares
    }
}

/// Builds and publishes topologies, one at a time: config reloads and health
/// ejections both come through here, so neither can overwrite the other.
pub struct Publisher {
    topology: SharedTopology,
    /// Serialises build-and-store; never taken on the request path.
    lock: Mutex<()>,
    /// What backends report to (health changes, metrics).
    hooks: PoolHooks,
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
            connections: tokio_util::task::TaskTracker::new(),
        };
        let backends = Topology::backends_for(&config, None, &hooks);
        let first = Topology::assemble(Arc::new(config), 1, backends, Vec::new());
        hooks.stats.topology(&first);
        Arc::new(Publisher {
            topology: Arc::new(ArcSwap::from_pointee(first)),
            lock: Mutex::new(()),
            hooks,
        })
    }

    /// The published topology, for sessions.
    pub fn shared(&self) -> SharedTopology {
        self.topology.clone()
    }

    /// For shutdown, once no session is left: publishes a topology without
    /// backends, so that every backend connection finishes the requests
    /// already queued on it and closes, and waits for that up to `grace`.
    /// Returns false if the time ran out.
    pub async fn drain_backends(&self, grace: std::time::Duration) -> bool {
        {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let old = self.topology.load_full();
            // Every server left out: the ring is empty too, so a session
            // still open past the grace period gets `SERVER_ERROR`, not a
            // lookup into a backend list that no longer exists.
            let all = old.config.servers.iter().map(|s| s.name.clone()).collect();
            let empty = Topology::assemble(old.config.clone(), old.version + 1, Box::new([]), all);
            self.topology.store(Arc::new(empty));
        }
        self.hooks.connections.close();
        tokio::time::timeout(grace, self.hooks.connections.wait())
            .await
            .is_ok()
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
        self.hooks.stats.topology(&new);
        self.topology.store(Arc::new(new));
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

/// What a config change does to the pool, for logs and `memring plan`.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// (name, old weight, new weight)
    pub reweighted: Vec<(String, u32, u32)>,
    /// Same name, new address: keys stay, connections move.
    pub readdressed: Vec<String>,
    /// Left out of the ring because DEAD (ejection on).
    pub ejected: Vec<String>,
    /// Back in the ring after an ejection.
    pub restored: Vec<String>,
    /// Share of the keyspace whose owner changes, 0..=1.
    pub moved_share: f64,
}

impl Change {
    /// Compares two server lists (by ring identity) and the rings built from
    /// them.
    pub fn between(
        old: &[ServerConfig],
        old_ring: &Ring,
        new: &[ServerConfig],
        new_ring: &Ring,
    ) -> Change {
        let find =
            |list: &[ServerConfig], name: &str| list.iter().find(|s| s.name == name).cloned();
        let mut change = Change {
            added: Vec::new(),
            removed: Vec::new(),
            reweighted: Vec::new(),
            readdressed: Vec::new(),
            ejected: Vec::new(),
            restored: Vec::new(),
            moved_share: 0.0,
        };
        for server in new {
            match find(old, &server.name) {
                None => change.added.push(server.name.clone()),
                Some(before) => {
                    if before.weight != server.weight {
                        change
                            .reweighted
                            .push((server.name.clone(), before.weight, server.weight));
                    }
                    if before.addr != server.addr {
                        change.readdressed.push(server.name.clone());
                    }
                }
            }
        }
        for server in old {
            if find(new, &server.name).is_none() {
                change.removed.push(server.name.clone());
            }
        }
        change.moved_share = Ring::moved_share(old_ring, new_ring);
        change
    }

    /// True when the server list is the same.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.reweighted.is_empty()
            && self.readdressed.is_empty()
            && self.ejected.is_empty()
            && self.restored.is_empty()
    }
}

impl std::fmt::Display for Change {
    /// `+1 server (cache-05), 19.8% of keyspace moves`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: usize| if n == 1 { "server" } else { "servers" };
        let mut parts = Vec::new();
        if !self.added.is_empty() {
            let n = self.added.len();
            parts.push(format!("+{n} {} ({})", plural(n), self.added.join(", ")));
        }
        if !self.removed.is_empty() {
            let n = self.removed.len();
            parts.push(format!("-{n} {} ({})", plural(n), self.removed.join(", ")));
        }
        for (name, from, to) in &self.reweighted {
            parts.push(format!("{name} weight {from} -> {to}"));
        }
        for name in &self.readdressed {
            parts.push(format!("{name} new address"));
        }
        if !self.ejected.is_empty() {
            parts.push(format!("ejected {} (DEAD)", self.ejected.join(", ")));
        }
        if !self.restored.is_empty() {
            parts.push(format!("restored {}", self.restored.join(", ")));
        }
        if parts.is_empty() {
            parts.push("servers unchanged".to_string());
        }
        write!(
            f,
            "{}, {:.1}% of keyspace moves",
            parts.join(", "),
            self.moved_share * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_of(servers: &[ServerConfig]) -> Ring {
        Ring::build(servers.iter().map(ServerConfig::member).collect())
    }

    fn server(name: &str, weight: u32) -> ServerConfig {
        ServerConfig {
            addr: format!("{name}:11211"),
            name: name.to_string(),
            weight,
        }
    }

    #[test]
    fn adding_a_server_is_described_with_its_moved_share() {
        let old: Vec<_> = (1..=4).map(|i| server(&format!("cache-0{i}"), 1)).collect();
        let mut new = old.clone();
        new.push(server("cache-05", 1));
        let change = Change::between(&old, &ring_of(&old), &new, &ring_of(&new));
        assert_eq!(change.added, vec!["cache-05"]);
        assert!(change.removed.is_empty());
        let text = change.to_string();
        assert!(text.starts_with("+1 server (cache-05), "), "{text}");
        assert!((0.15..0.25).contains(&change.moved_share), "{text}");
    }

    #[test]
    fn reweight_and_removal_are_described() {
        let old = vec![server("a", 1), server("b", 1), server("c", 1)];
        let new = vec![server("a", 2), server("b", 1)];
        let change = Change::between(&old, &ring_of(&old), &new, &ring_of(&new));
        assert_eq!(change.removed, vec!["c"]);
        assert_eq!(change.reweighted, vec![("a".to_string(), 1, 2)]);
        assert!(change.to_string().contains("a weight 1 -> 2"));
    }

    #[test]
    fn same_list_is_an_empty_change() {
        let list = vec![server("a", 1)];
        let change = Change::between(&list, &ring_of(&list), &list, &ring_of(&list));
        assert!(change.is_empty());
        assert_eq!(change.moved_share, 0.0);
    }
}
