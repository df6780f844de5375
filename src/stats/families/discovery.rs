//! `[discovery]`'s figures: the servers DNS lists now, the changes of that
//! list, and the rounds whose lookup failed.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{counter, gauge, Text};
use crate::stats::Stats;

/// A server discovery lists (always of the top-level pool).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DiscoveredLabels {
    server: Text,
}

/// What discovery found, for `stats` and `/metrics`.
#[derive(Debug)]
pub(in crate::stats) struct DiscoveryFigures {
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
    /// The etcd revision of the membership applied (0: not from etcd).
    revision: Gauge,
    /// Each etcd member's state (ACTIVE, JOINING, LEAVING, SUSPECT), by
    /// name; `None` without etcd.
    members: std::sync::Mutex<Option<std::collections::BTreeMap<String, &'static str>>>,
    /// The etcd revision of a membership change staged and not switched to
    /// yet (0: none).
    staged: Gauge,
    /// Live sidecars the staged change waits for.
    waiting: Gauge,
    /// Staged changes switched to after `fleet_switch_ms` without every
    /// live sidecar having staged them.
    forced: Counter,
    /// 1 while this sidecar is cut off from etcd past its lease.
    cut_off: Gauge,
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

impl DiscoveryFigures {
    pub(in crate::stats) fn register(registry: &mut Registry) -> DiscoveryFigures {
        let server = Family::<DiscoveredLabels, Gauge>::default();
        registry.register(
            "discovery_server",
            "1 for each server that [discovery]'s DNS records list now",
            server.clone(),
        );
        DiscoveryFigures {
            servers: gauge(
                registry,
                "discovery_servers",
                "Servers that [discovery]'s DNS records list now (the last good answer)",
            ),
            server,
            changes: counter(
                registry,
                "discovery_changes",
                "Changes of the discovered server list, each published as a membership change",
            ),
            failures: counter(
                registry,
                "discovery_lookup_failures",
                "Discovery rounds whose DNS lookup failed or listed no server (the last good list stayed)",
            ),
            failing: gauge(
                registry,
                "discovery_failing",
                "1 while the discovery records cannot be read",
            ),
            last_change: gauge(
                registry,
                "discovery_last_change_seconds",
                "Seconds since the epoch when the discovered server list last changed (0: not since start)",
            ),
            listed: std::sync::Mutex::new(None),
            revision: gauge(
                registry,
                "membership_revision",
                "The etcd revision of the membership this memring applied (0: membership not from etcd)",
            ),
            members: std::sync::Mutex::new(None),
            staged: gauge(
                registry,
                "membership_staged_revision",
                "The etcd revision of a membership change this memring staged (writes reach the old and the new owners) and has not switched reads to yet, until every live sidecar has staged it (0: none)",
            ),
            waiting: gauge(
                registry,
                "fleet_sidecars_waited_on",
                "Live sidecars under the etcd prefix that have not staged the change this memring staged",
            ),
            forced: counter(
                registry,
                "fleet_forced_switches",
                "Staged membership changes switched to after fleet_switch_ms without every live sidecar having staged them",
            ),
            cut_off: gauge(
                registry,
                "fleet_cut_off",
                "1 while no keep-alive of this memring's etcd registration has been answered for the lease's length (the other sidecars may no longer wait for it; see etcd_cut_off)",
            ),
        }
    }
}

impl Stats {
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

    /// The membership from etcd applied now: its revision and each
    /// member's state by name.
    pub fn membership_applied(
        &self,
        revision: i64,
        members: std::collections::BTreeMap<String, &'static str>,
    ) {
        self.discovery.revision.set(revision);
        *self
            .discovery
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(members);
    }

    /// A membership change staged at `revision` (0: none) waits for
    /// `waiting` live sidecars.
    pub fn membership_staged(&self, revision: i64, waiting: usize) {
        self.discovery.staged.set(revision);
        self.discovery.waiting.set(waiting as i64);
    }

    /// A staged change was switched to without every sidecar.
    pub fn fleet_switch_forced(&self) {
        self.discovery.forced.inc();
    }

    /// The staged revision, the sidecars waited on and the forced switches.
    pub fn fleet(&self) -> (i64, i64, u64) {
        let d = &self.discovery;
        (d.staged.get(), d.waiting.get(), d.forced.get())
    }

    /// This sidecar is cut off from etcd past its lease, or no longer.
    pub fn fleet_cut_off(&self, cut: bool) {
        self.discovery.cut_off.set(i64::from(cut));
    }

    /// Whether this sidecar is cut off from etcd past its lease.
    pub fn is_fleet_cut_off(&self) -> bool {
        self.discovery.cut_off.get() > 0
    }

    /// The etcd revision of the membership applied (0: none).
    pub fn membership_revision(&self) -> i64 {
        self.discovery.revision.get()
    }

    /// An etcd member's state, if `name` is one.
    pub fn member_state(&self, name: &str) -> Option<&'static str> {
        self.discovery
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|m| m.get(name).copied())
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
}
