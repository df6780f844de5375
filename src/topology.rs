//! The topology: the ring plus the backends its indexes name, with a version.
//! It is published through one `ArcSwap`, so a session loads it once per
//! request without a lock, and a reload replaces it in one store.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::backend::{Backend, BackendSettings};
use crate::config::{Config, ServerConfig};
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
