//! The topology: the ring plus the backends its indexes name, with a version.
//! It is published through one `ArcSwap`, so a session loads it once per
//! request without a lock, and a reload replaces it in one store.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::backend::{Backend, BackendSettings};
use crate::config::{Config, ServerConfig};
use crate::protocol::Limits;
use crate::ring::Ring;

/// One immutable routing table.
#[derive(Debug)]
pub struct Topology {
    /// Increases by one with every applied config.
    pub version: u64,
    pub ring: Ring,
    /// `backends[i]` serves ring member `i`.
    pub backends: Box<[Arc<Backend>]>,
    /// The servers as configured, in ring member order.
    pub servers: Box<[ServerConfig]>,
    /// Parser limits, which a reload may change.
    pub limits: Limits,
}

/// The current topology, shared by every session.
pub type SharedTopology = Arc<ArcSwap<Topology>>;

impl Topology {
    /// Builds a topology for `config`. A server that `previous` already has with
    /// the same identity, address and connection settings keeps its backend (and
    /// its open connections); every other server gets a new one.
    pub fn build(config: &Config, version: u64, previous: Option<&Topology>) -> Topology {
        let settings = BackendSettings::from_config(config);
        let backends = config
            .servers
            .iter()
            .map(|server| {
                previous
                    .and_then(|p| p.backend_for(server, settings))
                    .unwrap_or_else(|| Backend::start(server, settings))
            })
            .collect();
        Topology {
            version,
            ring: Ring::build(config.members()),
            backends,
            servers: config.servers.clone().into_boxed_slice(),
            limits: config.limits,
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

    /// The backend that owns `key`.
    #[inline]
    pub fn owner(&self, key: &[u8]) -> Option<&Arc<Backend>> {
        self.ring.owner(key).map(|i| &self.backends[i])
    }
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
    /// Share of the keyspace whose owner changes, 0..=1.
    pub moved_share: f64,
}

impl Change {
    /// Compares two server lists (by ring identity) and their rings.
    pub fn between(old: &[ServerConfig], new: &[ServerConfig]) -> Change {
        let find =
            |list: &[ServerConfig], name: &str| list.iter().find(|s| s.name == name).cloned();
        let mut change = Change {
            added: Vec::new(),
            removed: Vec::new(),
            reweighted: Vec::new(),
            readdressed: Vec::new(),
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
        let ring =
            |list: &[ServerConfig]| Ring::build(list.iter().map(ServerConfig::member).collect());
        change.moved_share = Ring::moved_share(&ring(old), &ring(new));
        change
    }

    /// True when the server list is the same.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.reweighted.is_empty()
            && self.readdressed.is_empty()
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
        let change = Change::between(&old, &new);
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
        let change = Change::between(&old, &new);
        assert_eq!(change.removed, vec!["c"]);
        assert_eq!(change.reweighted, vec![("a".to_string(), 1, 2)]);
        assert!(change.to_string().contains("a weight 1 -> 2"));
    }

    #[test]
    fn same_list_is_an_empty_change() {
        let list = vec![server("a", 1)];
        let change = Change::between(&list, &list);
        assert!(change.is_empty());
        assert_eq!(change.moved_share, 0.0);
    }
}
