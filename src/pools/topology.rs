//! The topology: the effective ring plus the backends it routes to, with a
//! version, and [`Change`], what a new server list does to the keyspace. A
//! topology is immutable; it is published through one `ArcSwap` (see
//! `control/publisher.rs`), so a session loads it once per request without a lock.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::backend::health::Timing;
use crate::backend::{Backend, BackendSettings, PoolHooks};
use crate::config::{Config, ServerConfig};
use crate::protocol::Limits;
use crate::ring::Ring;

/// `ring_backends` for a ring of `members`: each member's index in
/// `backends`, appending the backend `old` has for a member no longer
/// configured (LEAVING). A member nobody has a backend for any more cannot
/// be asked; its keys read as misses (u32::MAX never matches an owner).
fn map_members(members: &[String], backends: &mut Vec<Arc<Backend>>, old: &Topology) -> Box<[u32]> {
    members
        .iter()
        .map(|name| {
            let at = backends.iter().position(|b| b.name() == name);
            let at = at.or_else(|| {
                let leaving = old.backends.iter().find(|b| b.name() == name)?;
                backends.push(leaving.clone());
                Some(backends.len() - 1)
            });
            at.map_or(u32::MAX, |i| i as u32)
        })
        .collect()
}

/// A pool's cut-off flag (see [`Topology::cut_off`]), shared by all its
/// topologies, and how many times it has gone up.
#[derive(Debug, Default)]
pub struct Fence {
    /// Set while the pool is cut off.
    pub on: std::sync::atomic::AtomicBool,
    /// Times `on` went from unset to set.
    pub cuts: std::sync::atomic::AtomicU64,
}

impl Fence {
    /// Sets the flag (`true`) or clears it; whether it was set.
    pub fn set(&self, on: bool) -> bool {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        // Counted before the flag goes up (one writer: the pool's etcd
        // watchdog).
        if on && !self.on.load(Relaxed) {
            self.cuts.fetch_add(1, Release);
        }
        self.on.swap(on, Release)
    }
}

/// One immutable routing table.
#[derive(Debug)]
pub struct Topology {
    /// Increases by one with every published change (reload or ejection).
    pub version: u64,
    /// Unique in the process (pools count their versions each on their own).
    pub id: u64,
    /// The pool's own request and hit counters (set by its publisher).
    pub figures: Arc<crate::stats::PoolFigures>,
    /// Unique per pool in the process, the same in all its topologies (set
    /// by its publisher; 0 outside one).
    pub pool_id: u64,
    /// Set while this sidecar is cut off from etcd past its lease with
    /// `etcd_cut_off = "miss"`: the same flag in all the pool's topologies
    /// (set by its publisher), see [`Topology::cut_off`].
    pub fence: Arc<Fence>,
    /// The effective ring: the configured servers minus the ejected ones.
    pub ring: Ring,
    /// [`crate::ring::digest::pool_digest`] of `ring` (the ring in force,
    /// also during a hand-off window) with the servers' addresses and
    /// `replicas`.
    pub ring_digest: u64,
    /// `ring_backends[i]` is the index in `backends` of ring member `i`.
    ring_backends: Box<[u32]>,
    /// Every configured server, in config order. Ejected servers keep their
    /// backend, which keeps probing them so they can come back.
    pub backends: Box<[Arc<Backend>]>,
    /// The config this topology was built from.
    pub config: Arc<Config>,
    /// Names of the servers left out of the ring because they are DEAD (with
    /// `failover`: kept in the ring, their keys go to the gutter pool).
    pub ejected: Box<[String]>,
    /// With `failover`, the backend indexes of the `ejected` servers.
    failed_over: Box<[u32]>,
    /// Parser limits from the config (see [`Topology::limits`]).
    limits: Limits,
    /// The ring in force before the last membership change, during its
    /// hand-off window.
    pub previous: Option<Previous>,
    /// The rings before `previous` that chained changes installed since the
    /// last window ended, newest first (at most [`KEPT_RINGS`] - 1, none
    /// equal to `ring` or `previous`). Reads never ask them; writes delete
    /// the key from their owners (see [`Topology::older_owners`]), so that a
    /// change back to one of them finds no value older than the write.
    pub older: Box<[Previous]>,
    /// Backend indexes of the members of rings dropped from a chain of
    /// windows beyond [`KEPT_RINGS`]: a write deletes the key from each of
    /// them too (when in doubt, miss), until the window ends.
    dropped: Box<[u32]>,
    /// An older ring of the chain was the ring in force now (a change
    /// undone within its window), so every moved key may be copied back
    /// (see [`Topology::copies_back`]). That ring is in `older` too while
    /// there is room; this stays when it is dropped.
    undoes: bool,
    /// With warming servers, or a membership change staged (servers
    /// `staged_out`): the ring they are staged to make (see
    /// [`Topology::warming_replicas`]).
    staged: Option<Box<Staged>>,
    /// Per backend, whether it is in this sidecar's zone; empty unless the
    /// sidecar has a zone that some server is in (then reads ask a key's
    /// replicas in the local zone first: `plan::placement::order_read`).
    local: Box<[bool]>,
    /// Per backend, the counters of its zone (`None`: no zone), made at
    /// the first hit counted ([`Topology::count_zone_hits`]).
    zone_figures: std::sync::OnceLock<Box<[Option<Arc<crate::stats::ZoneFigures>>]>>,
    /// The requests planned on this topology and not finished (see
    /// `pools/in_flight.rs`).
    pub(crate) in_flight: crate::pools::in_flight::InFlight,
}

/// The ring as it would be were the warming servers (`warming = true`)
/// members and the `staged_out` ones not: it decides which keys each
/// server is written besides its own, and is never read from. With warming
/// servers only, the keys it gives them; with a change staged for the fleet
/// to switch together (docs/etcd.md), also the keys a removed server's
/// successors will own.
#[derive(Debug)]
struct Staged {
    ring: Ring,
    /// `ring_backends[i]`: index in `backends` of member `i`.
    ring_backends: Box<[u32]>,
    /// Backend indexes of the warming servers (not those staged in: they
    /// get deletes only, see `ServerConfig::staged_in`).
    warming: Box<[u32]>,
}

/// Most rings a hand-off window keeps besides the ring in force: the
/// previous one and the older ones of chained changes. A change beyond that
/// drops the oldest (see docs/handoff.md, "Chained changes").
pub const KEPT_RINGS: usize = 4;

/// Where a write deletes its key in the older rings of chained changes
/// ([`Topology::older_owners`]): groups of servers, oldest ring first, each
/// deleted only once the group before it has answered. A sidecar that lags
/// behind copies a moved key from the owner in the ring before its own to
/// the owner in its own ring; with the older owner's copy gone first, that
/// copy either lands before its newer owner's delete or its check finds
/// the key gone and takes it back (docs/handoff.md, "Limits").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OlderOwners {
    servers: smallvec::SmallVec<[usize; 4]>,
    /// Where each group ends in `servers`: at most the dropped rings' group
    /// and one per older ring.
    ends: smallvec::SmallVec<[u8; KEPT_RINGS]>,
}

impl OlderOwners {
    /// Every server, in the order the groups go.
    pub fn servers(&self) -> &[usize] {
        &self.servers
    }

    /// Group `index` (oldest first), `None` past the last.
    pub fn group(&self, index: usize) -> Option<&[usize]> {
        let end = usize::from(*self.ends.get(index)?);
        let start = index
            .checked_sub(1)
            .map_or(0, |i| usize::from(self.ends[i]));
        Some(&self.servers[start..end])
    }

    /// `older` (oldest rings first) with one more group after them:
    /// `servers`, deleted last.
    pub fn then(older: Option<Box<OlderOwners>>, servers: &[usize]) -> Box<OlderOwners> {
        let mut out = older.unwrap_or_default();
        for &server in servers {
            out.push(server);
        }
        out.end_group();
        out
    }

    /// Adds `server` to the group being built, once. A server may be in
    /// several groups: each delete has to come after the group before it.
    fn push(&mut self, server: usize) {
        let start = self.ends.last().map_or(0, |&e| usize::from(e));
        if !self.servers[start..].contains(&server) {
            self.servers.push(server);
        }
    }

    /// Closes the group being built; an empty one is no group.
    fn end_group(&mut self) {
        let start = self.ends.last().map_or(0, |&e| usize::from(e));
        if self.servers.len() > start {
            self.ends.push(self.servers.len() as u8);
        }
    }
}

/// The previous ring of a hand-off window. Its members are mapped onto this
/// topology's `backends`; members no longer configured (LEAVING) have their
/// backends appended after the configured ones.
#[derive(Debug)]
pub struct Previous {
    pub ring: Ring,
    /// Member names of `ring`, in member order.
    pub members: Box<[String]>,
    /// `ring_backends[i]`: index in `backends` of member `i`.
    ring_backends: Box<[u32]>,
    /// When the window ends.
    pub until: std::time::Instant,
    /// The same, in seconds since the epoch (for logs and `stats`).
    pub until_unix: u64,
    /// The ring's flavour and servers with their addresses, as the state
    /// file keeps them (`pools/window_state.rs`); `None` for a ring built
    /// without them (unit tests), which is then not saved.
    pub source: Option<Arc<crate::pools::window_state::SavedRing>>,
}

impl Previous {
    /// A window over `ring` (members `members`) ending after `window`.
    pub fn new(ring: Ring, members: Box<[String]>, window: std::time::Duration) -> Previous {
        let now_unix = crate::runtime::clock::unix_now();
        Previous {
            ring,
            members,
            ring_backends: Box::new([]),
            until: std::time::Instant::now() + window,
            until_unix: now_unix + window.as_secs(),
            source: None,
        }
    }

    /// A window saved by an earlier run of memring, ending at `until_unix`
    /// (already past: its sweep is due at once).
    pub fn resumed(
        ring: Ring,
        members: Box<[String]>,
        until_unix: u64,
        source: Arc<crate::pools::window_state::SavedRing>,
    ) -> Previous {
        let left = until_unix.saturating_sub(crate::runtime::clock::unix_now());
        Previous {
            ring,
            members,
            ring_backends: Box::new([]),
            until: std::time::Instant::now() + std::time::Duration::from_secs(left),
            until_unix,
            source: Some(source),
        }
    }

    /// The same window, with the ring's servers as the state file keeps
    /// them.
    pub fn with_source(mut self, source: crate::pools::window_state::SavedRing) -> Previous {
        self.source = Some(Arc::new(source));
        self
    }

    /// The same window, for another topology.
    pub fn carried(&self) -> Previous {
        Previous {
            ring: self.ring.clone(),
            members: self.members.clone(),
            ring_backends: Box::new([]),
            until: self.until,
            until_unix: self.until_unix,
            source: self.source.clone(),
        }
    }
}

/// The current topology, shared by every session.
pub type SharedTopology = Arc<ArcSwap<Topology>>;

/// Whether requests on a topology of `config` count themselves in flight:
/// only where a staged change waits on that count (etcd membership with the
/// fleet gate on; `control/fleet.rs`). etcd settings are read at start only,
/// so every topology of a pool agrees.
fn counts_in_flight(config: &Config) -> bool {
    config
        .discovery
        .etcd
        .as_ref()
        .is_some_and(|etcd| !etcd.fleet_switch.is_zero())
}

impl Topology {
    /// The window this topology is in, as the state file keeps it; `None`
    /// without one (or when its rings do not say where their servers are:
    /// unit tests build such rings).
    pub fn saved_window(&self) -> Option<crate::pools::window_state::SavedWindow> {
        let previous = self.previous.as_ref()?;
        let older = self
            .older
            .iter()
            .map(|p| p.source.as_deref().cloned())
            .collect::<Option<Vec<_>>>()?;
        Some(crate::pools::window_state::SavedWindow {
            until_unix: previous.until_unix,
            swept: false,
            undoes: self.undoes(),
            ring: crate::pools::window_state::SavedRing::of(
                &self.config.ring,
                &self.ring_servers(),
            ),
            previous: previous.source.as_deref()?.clone(),
            older,
            dropped: self
                .dropped_servers()
                .iter()
                .map(|b| crate::pools::window_state::SavedServer {
                    name: b.name().to_string(),
                    addr: b.addr().to_string(),
                    weight: 1,
                    tls: b.tls(),
                    zone: None,
                })
                .collect(),
        })
    }

    /// The backends for `config`: a server that `previous` already has with the
    /// same identity, address and connection settings keeps its backend (and
    /// its open connections), unless DNS moved its host name elsewhere; every
    /// other server gets a new one.
    pub(crate) fn backends_for(
        config: &Config,
        previous: Option<&Topology>,
        hooks: &PoolHooks,
    ) -> Box<[Arc<Backend>]> {
        let settings = BackendSettings::from_config(config);
        let timing = crate::backend::timing_for(config);
        config
            .servers
            .iter()
            .map(|server| {
                previous
                    .and_then(|p| p.backend_for(server, settings, timing))
                    .unwrap_or_else(|| Backend::with_timing(server, settings, timing, hooks))
            })
            .collect()
    }

    /// A topology over `backends` (one per configured server, in config order)
    /// with the servers named in `ejected` left out of the ring.
    pub(crate) fn assemble(
        config: Arc<Config>,
        version: u64,
        backends: Box<[Arc<Backend>]>,
        ejected: Vec<String>,
    ) -> Topology {
        let mut nodes = Vec::with_capacity(backends.len());
        let mut ring_backends = Vec::with_capacity(backends.len());
        let mut failed_over = Vec::new();
        // With a gutter pool a DEAD server keeps its place: its keys go to
        // the gutter instead of to the other servers, and come back to it.
        let keeps_place = config.failover.is_some();
        let counted = counts_in_flight(&config);
        let mut warming = Vec::new();
        // Warming servers and those staged in: on the staged ring only.
        let mut staged_only = Vec::new();
        for (i, server) in config.servers.iter().enumerate() {
            // Not on the ring, DEAD or not: a warming server serves nothing,
            // and is written to (see `staged`) even while DEAD, so that no
            // write goes past it unnoticed while its state is unknown.
            if server.warming {
                staged_only.push(i as u32);
                if !server.staged_in {
                    warming.push(i as u32);
                }
                continue;
            }
            let out = ejected.contains(&server.name);
            if out && keeps_place {
                failed_over.push(i as u32);
            }
            if !out || keeps_place {
                nodes.push(server.node());
                ring_backends.push(i as u32);
            }
        }
        let staged_out = |i: u32| config.servers[i as usize].staged_out;
        let reweighted = |i: u32| config.servers[i as usize].staged_weight;
        let stages = !staged_only.is_empty()
            || ring_backends
                .iter()
                .any(|&i| staged_out(i) || reweighted(i).is_some());
        let staged = stages.then(|| {
            let mut staged_nodes = Vec::with_capacity(nodes.len() + warming.len());
            let mut staged_backends = Vec::with_capacity(nodes.len() + warming.len());
            for (node, &i) in nodes.iter().zip(&ring_backends) {
                if !staged_out(i) {
                    let mut node = node.clone();
                    if let Some(weight) = reweighted(i) {
                        node.member.weight = weight;
                    }
                    staged_nodes.push(node);
                    staged_backends.push(i);
                }
            }
            for &i in &staged_only {
                staged_nodes.push(config.servers[i as usize].node());
                staged_backends.push(i);
            }
            Box::new(Staged {
                ring: Ring::build_with(&config.ring, staged_nodes),
                ring_backends: staged_backends.into_boxed_slice(),
                warming: warming.into_boxed_slice(),
            })
        });
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
        let ring = Ring::build_with(&config.ring, nodes);
        let ring_digest = crate::ring::digest::pool_digest(&ring, &addrs, config.replicas);
        let local: Box<[bool]> = config
            .servers
            .iter()
            .map(|s| s.zone.is_some() && s.zone == config.zone)
            .collect();
        let local = if local.contains(&true) {
            local
        } else {
            Box::default()
        };
        Topology {
            local,
            zone_figures: std::sync::OnceLock::new(),
            version,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            figures: Arc::new(crate::stats::PoolFigures::detached()),
            fence: Arc::default(),
            pool_id: 0,
            ring,
            ring_digest,
            ring_backends: ring_backends.into_boxed_slice(),
            backends,
            limits: config.limits,
            config,
            ejected: ejected.into_boxed_slice(),
            failed_over: failed_over.into_boxed_slice(),
            previous: None,
            older: Box::new([]),
            dropped: Box::new([]),
            undoes: false,
            staged,
            in_flight: crate::pools::in_flight::InFlight::new(counted),
        }
    }

    /// Whether backend `index` is DEAD and its keys go to the gutter pool.
    #[inline]
    pub fn failed_over(&self, index: usize) -> bool {
        self.failed_over.contains(&(index as u32))
    }

    /// Member names of the ring, in member order.
    pub fn members(&self) -> Box<[String]> {
        self.ring_backends
            .iter()
            .map(|&i| self.backends[i as usize].name().to_string())
            .collect()
    }

    /// Starts (or carries on) a hand-off window from `previous`, keeping
    /// `older` (the rings of the windows it chains onto, newest first) for
    /// writes to forget on; `old` holds the backends of members that are no
    /// longer configured (LEAVING), which are kept for the window. Members
    /// without a backend are left out. Older rings equal to a newer older
    /// one are left out (one equal to the ring in force is noted in
    /// `undoes`), and at most
    /// [`KEPT_RINGS`] - 1 are kept: the members of the rest join `old`'s
    /// dropped servers (see [`Topology::older_owners`]).
    pub(crate) fn set_previous(
        &mut self,
        mut previous: Previous,
        older: Vec<Previous>,
        old: &Topology,
    ) {
        let mut backends: Vec<Arc<Backend>> = self.backends.to_vec();
        previous.ring_backends = map_members(&previous.members, &mut backends, old);
        let mut kept: Vec<Previous> = Vec::new();
        let mut dropped: Vec<String> = old
            .dropped
            .iter()
            .filter_map(|&i| Some(old.backends.get(i as usize)?.name().to_string()))
            .collect();
        for mut ring in older {
            self.undoes |= ring.ring == self.ring;
            // A ring equal to the one in force or to the previous one stays:
            // where it sits in the chain says which server a lagging sidecar
            // copies from (see `older_owners`), also after further changes.
            if kept.iter().any(|k| k.ring == ring.ring) {
                continue;
            }
            if kept.len() + 1 >= KEPT_RINGS {
                dropped.extend(ring.members.iter().cloned());
                continue;
            }
            ring.ring_backends = map_members(&ring.members, &mut backends, old);
            kept.push(ring);
        }
        dropped.sort();
        dropped.dedup();
        let dropped = map_members(&dropped, &mut backends, old);
        self.backends = backends.into_boxed_slice();
        self.previous = Some(previous);
        self.older = kept.into_boxed_slice();
        self.dropped = dropped.iter().copied().filter(|&b| b != u32::MAX).collect();
    }

    /// The servers of the ring in force, in member order (each a
    /// configured server: ejected ones are not members).
    pub fn ring_servers(&self) -> Vec<ServerConfig> {
        self.ring_backends
            .iter()
            .filter_map(|&i| self.config.servers.get(i as usize).cloned())
            .collect()
    }

    /// The servers of rings dropped from the chain (see `dropped`).
    pub fn dropped_servers(&self) -> Vec<Arc<Backend>> {
        self.dropped
            .iter()
            .filter_map(|&i| self.backends.get(i as usize).cloned())
            .collect()
    }

    /// Whether an older ring of the chain was the ring in force (see
    /// `undoes`).
    pub fn undoes(&self) -> bool {
        self.undoes
    }

    /// Notes that a change of the chain was undone (a saved window said so).
    pub(crate) fn set_undoes(&mut self) {
        self.undoes = true;
    }

    /// Makes the servers named `names` (those this topology has a backend
    /// for) the servers of dropped rings, for a window that chains onto this
    /// topology: a resumed window's, or one started when the windows in
    /// force are not known (see `pools/window_state.rs`).
    pub(crate) fn drop_servers(&mut self, names: &[String]) {
        self.dropped = self
            .backends
            .iter()
            .enumerate()
            .filter(|(_, b)| names.iter().any(|n| n == b.name()))
            .map(|(i, _)| i as u32)
            .collect();
    }

    /// The windows this topology keeps (its previous ring, then the older
    /// ones), carried over for a topology that chains onto them.
    pub(crate) fn kept_rings(&self) -> Vec<Previous> {
        self.previous
            .iter()
            .chain(self.older.iter())
            .map(Previous::carried)
            .collect()
    }

    /// The servers a write of `key` deletes it from in the older rings of
    /// chained changes, oldest ring first (see [`OlderOwners`]): the
    /// servers of the rings dropped beyond [`KEPT_RINGS`], then each older
    /// ring's replicas of `key`, leaving out `current` (the replica set
    /// now) and the previous ring's replicas, unless the next older ring
    /// gives the key to another server (see below). `None` when there are
    /// none (always outside chained windows).
    pub fn older_owners(&self, key: &[u8], current: &[usize]) -> Option<Box<OlderOwners>> {
        if self.older.is_empty() && self.dropped.is_empty() {
            return None;
        }
        let mut before = smallvec::SmallVec::<[usize; 4]>::new();
        self.previous_replicas(key, &mut before);
        let wanted = |backend: usize| {
            backend < self.backends.len()
                && !current.contains(&backend)
                && !before.contains(&backend)
        };
        let mut out = Box::<OlderOwners>::default();
        for &backend in self.dropped.iter() {
            if wanted(backend as usize) {
                out.push(backend as usize);
            }
        }
        out.end_group();
        // Each older ring's replicas of the key, oldest ring first.
        let mut rings = smallvec::SmallVec::<[smallvec::SmallVec<[usize; 4]>; KEPT_RINGS]>::new();
        let mut members = smallvec::SmallVec::<[usize; 4]>::new();
        for ring in self.older.iter().rev() {
            ring.ring
                .replicas(key, self.config.replicas.max(1), &mut members);
            rings.push(
                members
                    .iter()
                    .filter_map(|member| ring.ring_backends.get(*member))
                    .map(|&backend| backend as usize)
                    .collect(),
            );
        }
        for (i, replicas) in rings.iter().enumerate() {
            // A previous replica is left to the hand-off steps, which may
            // need its value, unless the next older ring has an owner of
            // its own: a sidecar still on that ring may be copying the key
            // from this one to it, and a copy's source must lose the key
            // before its destination. Then it goes here, in its ring's
            // turn (a command that needed its value then finds a miss).
            let copied_on = rings
                .get(i + 1)
                .is_some_and(|next| next.iter().any(|&backend| wanted(backend)));
            for &backend in replicas {
                let previous = copied_on
                    && backend < self.backends.len()
                    && !current.contains(&backend)
                    && before.contains(&backend);
                if wanted(backend) || previous {
                    out.push(backend);
                }
            }
            out.end_group();
        }
        (!out.servers.is_empty()).then_some(out)
    }

    /// Whether a sidecar still on an older ring of this chain may be copying
    /// `key` from one of `current` (its replicas now, owner first) to the
    /// previous ring's: an older ring gave it to one of them (a change
    /// undone, or flipped back). Then a delete must reach the previous
    /// ring's replicas after `current` too, since a copy's source has to
    /// lose the key before its destination, and the hand-off's own copies
    /// go the other way.
    pub fn copies_back(&self, key: &[u8], current: &[usize]) -> bool {
        if self.previous.is_none() {
            return false;
        }
        let mut members = smallvec::SmallVec::<[usize; 4]>::new();
        self.undoes
            || self.older.iter().any(|ring| {
                ring.ring
                    .replicas(key, self.config.replicas.max(1), &mut members);
                members.iter().any(|&member| {
                    ring.ring_backends
                        .get(member)
                        .is_some_and(|&backend| current.contains(&(backend as usize)))
                })
            })
    }

    /// During a hand-off window, the backend index of `key`'s previous owner
    /// when it differs from `owner` (its owner now).
    #[inline]
    pub fn previous_owner(&self, key: &[u8], owner: usize) -> Option<usize> {
        let previous = self.previous.as_ref()?;
        let member = previous.ring.owner(key)?;
        let before = *previous.ring_backends.get(member)? as usize;
        (before != owner && before < self.backends.len()).then_some(before)
    }

    /// Backend indexes of `key`'s replica set in the previous ring of a
    /// hand-off window (nothing outside a window), owner first.
    pub fn previous_replicas(&self, key: &[u8], out: &mut smallvec::SmallVec<[usize; 4]>) {
        out.clear();
        let Some(previous) = &self.previous else {
            return;
        };
        previous.ring.replicas(key, self.config.replicas, out);
        out.retain(|member| {
            previous
                .ring_backends
                .get(*member)
                .is_some_and(|&b| (b as usize) < self.backends.len())
        });
        for member in out.iter_mut() {
            *member = previous.ring_backends[*member] as usize;
        }
    }

    /// Appends to `servers` (a replica set of the ring in force) the
    /// previous ring's replicas of `key` that are not in it; how many.
    pub fn push_previous_only_replicas(
        &self,
        key: &[u8],
        servers: &mut smallvec::SmallVec<[usize; 4]>,
    ) -> usize {
        let current = servers.len();
        let mut before = smallvec::SmallVec::<[usize; 4]>::new();
        self.previous_replicas(key, &mut before);
        for server in before {
            if !servers[..current].contains(&server) {
                servers.push(server);
            }
        }
        servers.len() - current
    }

    /// Servers being taken over (in the ring, owning keys they did not own
    /// in the previous ring) and leaving (only in the previous ring).
    /// A server only in an older ring of chained changes is LEAVING too: it
    /// is kept, and asked only to delete keys written since.
    pub fn membership(&self, index: usize) -> Membership {
        if self.is_warming(index) {
            return Membership::Warming;
        }
        let Some(previous) = &self.previous else {
            return Membership::Active;
        };
        let member = |p: &Previous| p.ring_backends.contains(&(index as u32));
        let in_ring = self.ring_backends.contains(&(index as u32));
        let was = member(previous);
        match (was, in_ring) {
            (false, true) => Membership::Joining,
            (true, false) => Membership::Leaving,
            (false, false)
                if self.older.iter().any(member) || self.dropped.contains(&(index as u32)) =>
            {
                Membership::Leaving
            }
            _ => Membership::Active,
        }
    }

    fn backend_for(
        &self,
        server: &ServerConfig,
        settings: BackendSettings,
        timing: Timing,
    ) -> Option<Arc<Backend>> {
        self.backends
            .iter()
            .find(|b| {
                b.name() == server.name
                    && b.addr() == server.addr
                    && b.settings() == settings
                    && b.tls() == server.tls
                    && !b.target().is_readdressed()
                    && b.timing() == timing
            })
            .cloned()
    }

    /// The limits requests are parsed with. Unless the config sets
    /// `max_value_bytes`, values may be as large as the smallest
    /// `item_size_max` the servers reported.
    pub fn limits(&self) -> Limits {
        let mut limits = self.limits;
        if self.config.max_value_from_servers {
            if let Some(smallest) = self.backends.iter().filter_map(|b| b.item_size_max()).min() {
                limits.max_value_bytes = smallest;
            }
        }
        limits
    }

    /// Servers in the ring (configured minus ejected).
    pub fn effective_servers(&self) -> usize {
        self.ring_backends.len()
    }

    /// Index in `backends` of the server that owns `key`.
    #[inline]
    pub fn owner_index(&self, key: &[u8]) -> Option<usize> {
        self.ring
            .owner(key)
            .map(|member| self.ring_backends[member] as usize)
    }

    /// [`Topology::owner_index`], and the key's xxh3 hash when the ring
    /// placed it by that hash (see [`Ring::hashes_whole_key_with_xxh3`]):
    /// hot-key counting then does not hash the key again.
    #[inline]
    pub fn owner_index_hashed(&self, key: &[u8]) -> (Option<usize>, Option<u64>) {
        let (owner, hash) = self.ring.owner_hashed(key);
        (
            owner.map(|member| self.ring_backends[member] as usize),
            hash,
        )
    }

    /// Whether backend `index` has points on the ring (it is configured and
    /// not ejected).
    pub fn ring_holds(&self, index: usize) -> bool {
        self.ring_backends.contains(&(index as u32))
    }

    /// Backend indexes of `key`'s replica set (owner first), `config.replicas`
    /// long at most; the ring walk skips ejected servers, which are not on it.
    pub fn replicas(&self, key: &[u8], out: &mut smallvec::SmallVec<[usize; 4]>) {
        self.ring.replicas(key, self.config.replicas, out);
        for member in out.iter_mut() {
            *member = self.ring_backends[*member] as usize;
        }
    }

    /// Backend indexes of the servers that would be among `key`'s replicas
    /// (owner first, `config.replicas` long at most) on the staged ring and
    /// are not among them now: where a write of `key` goes besides its
    /// replicas now. The warming servers that would hold it had they
    /// joined, and, with a membership change staged, the owners it gives
    /// the key. Nothing without a staged ring, and nothing is read from
    /// them until the ring is in force.
    pub fn warming_replicas(&self, key: &[u8], out: &mut smallvec::SmallVec<[usize; 4]>) {
        out.clear();
        let Some(staged) = &self.staged else {
            return;
        };
        staged.ring.replicas(key, self.config.replicas.max(1), out);
        for member in out.iter_mut() {
            *member = staged.ring_backends[*member] as usize;
        }
        let mut now = smallvec::SmallVec::<[usize; 4]>::new();
        self.replicas(key, &mut now);
        out.retain(|member| !now.contains(member));
    }

    /// Whether reads go to the local zone first: the sidecar has a zone and
    /// some server is in it.
    #[inline]
    pub fn reads_local_first(&self) -> bool {
        !self.local.is_empty()
    }

    /// Whether backend `index` is in this sidecar's zone (false without
    /// local-first reads).
    #[inline]
    pub fn is_local(&self, index: usize) -> bool {
        self.local.get(index).copied().unwrap_or(false)
    }

    /// Counts a retrieval's hits with local-first reads in the counters of
    /// the zone of the replica that served each (docs/zones.md, "Counters").
    pub(crate) fn count_zone_hits(&self, stats: &crate::stats::Stats, hits: &[ZoneHit]) {
        if hits.is_empty() {
            return;
        }
        let figures = self.zone_figures.get_or_init(|| {
            self.backends
                .iter()
                .map(|backend| {
                    let server = self
                        .config
                        .servers
                        .iter()
                        .find(|s| s.name == backend.name());
                    let zone = server.and_then(|s| s.zone.as_deref())?;
                    Some(stats.zone_figures(zone))
                })
                .collect()
        });
        for hit in hits {
            if let Some(Some(zone)) = figures.get(hit.server as usize) {
                zone.hit(hit.local, hit.written_back);
            }
        }
    }

    /// Whether this sidecar is cut off from etcd past its registration's
    /// lease with `etcd_cut_off = "miss"`: the other sidecars may have
    /// moved reads for a change it has not seen, so it reads nothing (every
    /// key misses) and writes nothing until it is registered again and has
    /// read every member (`control/etcd/`). One relaxed load.
    #[inline]
    pub fn cut_off(&self) -> bool {
        self.fence.on.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times the pool has been cut off ([`Topology::cut_off`])
    /// since it started: what a cached value is scoped by (the hot-key near
    /// cache), so that nothing read before a cut answers after it.
    #[inline]
    pub fn cuts(&self) -> u64 {
        self.fence.cuts.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a staged ring is in force: servers warming, or a membership
    /// change staged.
    #[inline]
    pub fn has_warming(&self) -> bool {
        self.staged.is_some()
    }

    /// Whether backend `index` is warming (configured with `warming = true`).
    pub fn is_warming(&self, index: usize) -> bool {
        self.staged
            .as_ref()
            .is_some_and(|s| s.warming.contains(&(index as u32)))
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

/// A server's part in a hand-off window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    Active,
    /// In the ring now, not in the previous ring: its keys are read through.
    Joining,
    /// Only in the previous ring: asked only as a previous owner.
    Leaving,
    /// Configured `warming = true`: on no ring, written the keys it will
    /// own, never read.
    Warming,
}

impl Membership {
    pub fn as_str(self) -> &'static str {
        match self {
            Membership::Active => "ACTIVE",
            Membership::Joining => "JOINING",
            Membership::Leaving => "LEAVING",
            Membership::Warming => "WARMING",
        }
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
    /// Left out of the ring because DEAD (ejection on).
    pub ejected: Vec<String>,
    /// Back in the ring after an ejection.
    pub restored: Vec<String>,
    /// Share of the keyspace whose owner changes, 0..=1.
    pub moved_share: f64,
    /// Servers whose zone changed: with replicas, keys' copies move between
    /// servers though their owners stay.
    pub rezoned: Vec<String>,
    /// The hand-off window this change started: (length in ms, end in
    /// seconds since the epoch, whether moved keys are read through:
    /// `shared_with`). Boxed: a `Change` travels inside enums.
    pub handoff: Option<Box<(u64, u64, bool)>>,
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
            rezoned: Vec::new(),
            handoff: None,
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
                    if before.zone != server.zone {
                        change.rezoned.push(server.name.clone());
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
            && self.rezoned.is_empty()
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
        if !self.rezoned.is_empty() {
            parts.push(format!("new zone for {}", self.rezoned.join(", ")));
        }
        if parts.is_empty() {
            parts.push("servers unchanged".to_string());
        }
        write!(
            f,
            "{}, {:.1}% of keyspace moves",
            parts.join(", "),
            self.moved_share * 100.0
        )?;
        if let Some(&(window_ms, until, reads_through)) = self.handoff.as_deref() {
            let day = until % 86_400;
            write!(
                f,
                "; hand-off window {}s, {} until {:02}:{:02}:{:02} UTC",
                window_ms / 1000,
                if reads_through {
                    "moved keys read through"
                } else {
                    "moved keys miss (shared_with = \"writers\"), their previous owners lose them on writes"
                },
                day / 3600,
                day / 60 % 60,
                day % 60
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Four servers `s1`..`s4`, then `s5` joins within a hand-off window:
    /// the topology before and the one after (backends are built inside the
    /// runtime returned, which must outlive them; nothing connects).
    pub(crate) fn four_then_five() -> (tokio::runtime::Runtime, Topology, Topology) {
        four_then_five_with("")
    }

    /// [`four_then_five`] with `settings` (top-level config lines, such as
    /// `replicas = 2`) in both configs.
    pub(crate) fn four_then_five_with(
        settings: &str,
    ) -> (tokio::runtime::Runtime, Topology, Topology) {
        let four: Vec<ServerConfig> = (1..=4).map(|i| server(&format!("s{i}"), 1)).collect();
        let five: Vec<ServerConfig> = (1..=5).map(|i| server(&format!("s{i}"), 1)).collect();
        let (runtime, hooks) = runtime_and_hooks();
        let (old, new) = {
            let _guard = runtime.enter();
            let c4 = config_with(&four, settings);
            let old = Topology::assemble(
                c4.clone(),
                1,
                Topology::backends_for(&c4, None, &hooks),
                Vec::new(),
            );
            let new = chain_with(&old, &five, settings, &hooks);
            (old, new)
        };
        (runtime, old, new)
    }

    /// Servers `s1`..`s4` on the ring and `s5` warming, with `settings`.
    pub(crate) fn four_and_one_warming(settings: &str) -> (tokio::runtime::Runtime, Topology) {
        let mut servers: Vec<ServerConfig> = (1..=5).map(|i| server(&format!("s{i}"), 1)).collect();
        servers[4].warming = true;
        let (runtime, hooks) = runtime_and_hooks();
        let topology = {
            let _guard = runtime.enter();
            let config = config_with(&servers, settings);
            let backends = Topology::backends_for(&config, None, &hooks);
            Topology::assemble(config, 1, backends, Vec::new())
        };
        (runtime, topology)
    }

    #[test]
    fn a_warming_server_is_off_the_ring_and_staged_for_its_share() {
        let (_runtime, topology) = four_and_one_warming("");
        assert_eq!(topology.effective_servers(), 4);
        assert!(topology.is_warming(4) && !topology.is_warming(0));
        let staged = Ring::build(
            (1..=5)
                .map(|i| server(&format!("s{i}"), 1).member())
                .collect(),
        );
        let mut warming = smallvec::SmallVec::new();
        let mut theirs = 0;
        for i in 0..2000 {
            let key = format!("k{i}");
            assert_ne!(topology.owner_index(key.as_bytes()), Some(4));
            topology.warming_replicas(key.as_bytes(), &mut warming);
            let owner = staged.members()[staged.owner(key.as_bytes()).unwrap()]
                .identity
                .clone();
            assert_eq!(warming.is_empty(), owner != "s5", "{key}");
            theirs += warming.len();
        }
        assert!((300..500).contains(&theirs), "about a fifth: {theirs}");
    }

    #[test]
    fn a_staged_change_writes_each_moved_key_to_its_staged_owner_too() {
        // s4 staged out and s5 staged in: reads stay on s1..s4, and a key
        // the change moves is also written to its owner on s1,s2,s3,s5.
        let mut servers: Vec<ServerConfig> = (1..=5).map(|i| server(&format!("s{i}"), 1)).collect();
        servers[4].warming = true;
        let (runtime, hooks) = runtime_and_hooks();
        let topology = {
            let _guard = runtime.enter();
            // A config file cannot say `staged_out`: set after parsing.
            let mut config = (*config_with(&servers, "")).clone();
            config.servers[3].staged_out = true;
            config.servers[4].staged_in = true;
            let config = Arc::new(config);
            let backends = Topology::backends_for(&config, None, &hooks);
            Topology::assemble(config, 1, backends, Vec::new())
        };
        assert!(topology.has_warming());
        assert!(!topology.is_warming(4), "staged in, it takes deletes only");
        let target = Ring::build(
            ["s1", "s2", "s3", "s5"]
                .iter()
                .map(|n| server(n, 1).member())
                .collect(),
        );
        let mut extra = smallvec::SmallVec::new();
        let (mut moved, mut from_s4) = (0, 0);
        for i in 0..2000 {
            let key = format!("k{i}");
            let now = topology.owner_index(key.as_bytes()).unwrap();
            assert_ne!(now, 4, "s5 serves no reads yet");
            let then = &target.members()[target.owner(key.as_bytes()).unwrap()].identity;
            topology.warming_replicas(key.as_bytes(), &mut extra);
            if *then == topology.backends[now].name() {
                assert!(extra.is_empty(), "{key} does not move");
            } else {
                assert_eq!(extra.len(), 1, "{key}");
                assert_eq!(topology.backends[extra[0]].name(), then, "{key}");
                moved += 1;
                from_s4 += usize::from(now == 3);
            }
        }
        assert!(
            from_s4 > 300 && moved > from_s4,
            "{moved} moved, {from_s4} from s4"
        );
    }

    /// A runtime to build backends in (enter it), and a pool's hooks.
    fn runtime_and_hooks() -> (tokio::runtime::Runtime, PoolHooks) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let hooks = PoolHooks {
            health_changed: Arc::new(tokio::sync::Notify::new()),
            stats: Arc::new(crate::stats::Stats::new()),
            tls: None,
            pool: "default".into(),
        };
        (runtime, hooks)
    }

    fn ring_of(servers: &[ServerConfig]) -> Ring {
        Ring::build(servers.iter().map(ServerConfig::member).collect())
    }

    fn server(name: &str, weight: u32) -> ServerConfig {
        ServerConfig {
            weight,
            ..ServerConfig::plain(name, format!("{name}:11211"))
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
    fn a_change_display_names_the_hand_off_window() {
        let old = vec![server("a", 1)];
        let mut change = Change::between(&old, &ring_of(&old), &old, &ring_of(&old));
        change.handoff = Some(Box::new((300_000, 86_400 + 3_723, true)));
        assert!(change
            .to_string()
            .ends_with("; hand-off window 300s, moved keys read through until 01:02:03 UTC"));
        change.handoff = Some(Box::new((300_000, 86_400 + 3_723, false)));
        assert!(change.to_string().ends_with(
            "; hand-off window 300s, moved keys miss (shared_with = \"writers\"), their previous owners lose them on writes until 01:02:03 UTC"
        ));
    }

    #[test]
    fn previous_owner_is_named_only_for_moved_keys() {
        let four: Vec<ServerConfig> = (1..=4).map(|i| server(&format!("s{i}"), 1)).collect();
        let five: Vec<ServerConfig> = (1..=5).map(|i| server(&format!("s{i}"), 1)).collect();
        let (runtime, hooks) = runtime_and_hooks();
        let _guard = runtime.enter();
        let (c4, c5) = (config_of(&four), config_of(&five));
        let old = Topology::assemble(
            c4.clone(),
            1,
            Topology::backends_for(&c4, None, &hooks),
            Vec::new(),
        );
        let backends = Topology::backends_for(&c5, Some(&old), &hooks);
        let mut new = Topology::assemble(c5, 2, backends, Vec::new());
        let window = std::time::Duration::from_secs(60);
        new.set_previous(
            Previous::new(old.ring.clone(), old.members(), window),
            Vec::new(),
            &old,
        );
        let (mut moved, mut total) = (0, 0);
        for i in 0..2000 {
            let key = format!("k{i}");
            let owner = new.owner_index(key.as_bytes()).unwrap();
            let before = old.owner_index(key.as_bytes()).unwrap();
            match new.previous_owner(key.as_bytes(), owner) {
                Some(previous) => {
                    moved += 1;
                    assert_eq!(new.backends[previous].name(), old.backends[before].name());
                    assert_eq!(new.backends[owner].name(), "s5");
                }
                None => assert_eq!(owner, before),
            }
            total += 1;
        }
        assert!(
            (total / 7..total / 3).contains(&moved),
            "{moved} of {total}"
        );
        assert_eq!(new.membership(4), Membership::Joining);
        assert_eq!(new.membership(0), Membership::Active);
    }

    fn config_of(servers: &[ServerConfig]) -> Arc<Config> {
        config_with(servers, "")
    }

    fn config_with(servers: &[ServerConfig], settings: &str) -> Arc<Config> {
        let mut text = format!("listen = \"127.0.0.1:0\"\n{settings}");
        for s in servers {
            text.push_str(&format!(
                "[[servers]]\naddr = \"{}\"\nname = \"{}\"\nwarming = {}\n",
                s.addr, s.name, s.warming
            ));
        }
        Arc::new(Config::parse(&text, "t.toml").unwrap())
    }

    /// What `Publisher::publish` does on a change within a window: the ring
    /// in force becomes the previous one, and the rings it kept go on.
    fn chain(old: &Topology, servers: &[ServerConfig], hooks: &PoolHooks) -> Topology {
        chain_with(old, servers, "", hooks)
    }

    fn chain_with(
        old: &Topology,
        servers: &[ServerConfig],
        settings: &str,
        hooks: &PoolHooks,
    ) -> Topology {
        let config = config_with(servers, settings);
        let backends = Topology::backends_for(&config, Some(old), hooks);
        let mut new = Topology::assemble(config, old.version + 1, backends, Vec::new());
        let window = std::time::Duration::from_secs(60);
        let previous = Previous::new(old.ring.clone(), old.members(), window);
        new.set_previous(previous, old.kept_rings(), old);
        new
    }

    /// Servers `s1` to `sN`.
    fn servers_named_s(n: usize) -> Vec<ServerConfig> {
        (1..=n).map(|i| server(&format!("s{i}"), 1)).collect()
    }

    /// The first ring of a chain of changes: four servers, `s1` to `s4`.
    fn first_of_chain(hooks: &PoolHooks) -> Topology {
        let config = config_of(&servers_named_s(4));
        let backends = Topology::backends_for(&config, None, hooks);
        Topology::assemble(config, 1, backends, Vec::new())
    }

    #[test]
    fn chained_changes_keep_each_older_ring_once_and_name_its_owners_for_writes() {
        let (runtime, hooks) = runtime_and_hooks();
        let _guard = runtime.enter();
        let list = servers_named_s;
        let r1 = first_of_chain(&hooks);
        let r2 = chain(&r1, &list(5), &hooks);
        assert!(
            r2.older.iter().all(|o| o.ring != r1.ring),
            "R1 is the previous ring, not an older one"
        );
        let r3 = chain(&r2, &list(6), &hooks);
        assert_eq!(r3.older.len(), 1);
        assert_eq!(r3.older[0].ring, r1.ring);
        let name = |t: &Topology, i: usize| t.backends[i].name().to_string();
        let owner_in = |ring: &crate::ring::Ring, key: &[u8]| {
            ring.members()[ring.owner(key).unwrap()].identity.clone()
        };
        let (mut three_owners, mut checked) = (0, 0);
        for i in 0..3000 {
            let key = format!("k{i}");
            let key = key.as_bytes();
            let owner = r3.owner_index(key).unwrap();
            let older = r3.older_owners(key, &[owner]);
            let (before, oldest) = (owner_in(&r2.ring, key), owner_in(&r1.ring, key));
            let expected: Vec<String> = if oldest != name(&r3, owner) && oldest != before {
                vec![oldest]
            } else {
                Vec::new()
            };
            let got: Vec<String> = older
                .iter()
                .flat_map(|o| o.servers())
                .map(|&b| name(&r3, b))
                .collect();
            assert_eq!(got, expected, "k{i}");
            three_owners += usize::from(!got.is_empty() && before != name(&r3, owner));
            checked += 1;
        }
        assert!(
            three_owners > checked / 50,
            "{three_owners} of {checked} keys had three owners"
        );
        // Back to R1: R3 is the previous ring, R2 and R1 older; R1, the ring
        // in force again, is kept for its place in the chain, and noted.
        let back = chain(&r3, &list(4), &hooks);
        assert_eq!(back.ring, r1.ring);
        assert_eq!(back.older.len(), 2);
        assert_eq!(
            (&back.older[0].ring, &back.older[1].ring),
            (&r2.ring, &r1.ring)
        );
        assert!(back.undoes && !r3.undoes);
        // s5 is in R2 only: kept (LEAVING) so that writes can delete there.
        let s5 = back
            .backends
            .iter()
            .position(|b| b.name() == "s5")
            .expect("s5 kept");
        assert_eq!(back.membership(s5), Membership::Leaving);
        // At most KEPT_RINGS besides the ring in force.
        let mut t = back;
        for n in [7, 8, 9, 10, 11] {
            t = chain(&t, &list(n), &hooks);
        }
        assert_eq!(t.older.len(), KEPT_RINGS - 1);
        // Beyond that, when in doubt, a miss: a write deletes the key from
        // every server of the rings dropped (R1 to R3 here), but where it
        // lives now.
        for i in 0..200 {
            let key = format!("k{i}");
            let mut replicas = smallvec::SmallVec::new();
            t.replicas(key.as_bytes(), &mut replicas);
            let older = t.older_owners(key.as_bytes(), &replicas);
            let older = older.as_ref().map_or(&[][..], |o| o.servers());
            for s in ["s1", "s2", "s3", "s4", "s5", "s6"] {
                let at = t.backends.iter().position(|b| b.name() == s).unwrap();
                assert!(
                    older.contains(&at)
                        || replicas.contains(&at)
                        || t.previous_owner(key.as_bytes(), usize::MAX) == Some(at),
                    "k{i}: {s}"
                );
            }
        }
    }

    /// Two changes behind the ring in force, the older owners are grouped
    /// oldest ring first, one group per ring: a write deletes the key from
    /// R1's owner before R2's (see `OlderOwners`).
    #[test]
    fn older_owners_come_oldest_ring_first_one_group_per_ring() {
        let (runtime, hooks) = runtime_and_hooks();
        let _guard = runtime.enter();
        let list = servers_named_s;
        let r1 = first_of_chain(&hooks);
        let r2 = chain(&r1, &list(5), &hooks);
        let r3 = chain(&r2, &list(6), &hooks);
        let r4 = chain(&r3, &list(7), &hooks);
        assert_eq!(r4.older.len(), 2);
        assert_eq!((&r4.older[0].ring, &r4.older[1].ring), (&r2.ring, &r1.ring));
        let at = |name: &str| r4.backends.iter().position(|b| b.name() == name).unwrap();
        let owner_in = |ring: &crate::ring::Ring, key: &[u8]| {
            at(&ring.members()[ring.owner(key).unwrap()].identity)
        };
        let mut two_groups = 0;
        for i in 0..3000 {
            let key = format!("k{i}");
            let key = key.as_bytes();
            let owner = r4.owner_index(key).unwrap();
            let previous = owner_in(&r3.ring, key);
            let expected: Vec<Vec<usize>> = [&r1.ring, &r2.ring]
                .iter()
                .map(|ring| owner_in(ring, key))
                .filter(|&o| o != owner && o != previous)
                .map(|o| vec![o])
                .collect();
            let older = r4.older_owners(key, &[owner]);
            let got: Vec<Vec<usize>> = older
                .iter()
                .flat_map(|o| (0..).map_while(|g| o.group(g).map(<[usize]>::to_vec)))
                .collect();
            assert_eq!(got, expected, "k{i}");
            two_groups += usize::from(got.len() == 2);
        }
        assert!(two_groups > 30, "{two_groups} keys with two older owners");
    }

    /// A key owned by S, then X, then S again, then Z: a sidecar still on
    /// the second ring may be copying it from S to X, so a write through the
    /// fourth deletes it from S before X, though S is also its previous
    /// owner (whose value the hand-off steps would otherwise read first).
    #[test]
    fn a_previous_owner_that_an_older_ring_copies_from_loses_the_key_first() {
        let (runtime, hooks) = runtime_and_hooks();
        let _guard = runtime.enter();
        // s5 joins, is swapped for s6, then s7 joins: a key can go from S
        // to s5, back to S, then to s7.
        let with = |extra: &[&str]| {
            let mut list = servers_named_s(4);
            list.extend(extra.iter().map(|name| server(name, 1)));
            list
        };
        let r1 = first_of_chain(&hooks);
        let r2 = chain(&r1, &with(&["s5"]), &hooks);
        let r3 = chain(&r2, &with(&["s6"]), &hooks);
        let r4 = chain(&r3, &with(&["s6", "s7"]), &hooks);
        assert_eq!(r4.older.len(), 2);
        s_then_x_first(&r4, &r1, &r2, Some(&r3));

        // The same with the third ring the first again (s5 joins and is
        // removed, then s6 joins): that ring is the previous one and also
        // the oldest, where a sidecar two changes behind copies from.
        let back = chain(&r2, &servers_named_s(4), &hooks);
        let then = chain(&back, &with(&["s6"]), &hooks);
        assert_eq!(then.older.len(), 2, "R2, and R1 beside the previous ring");
        s_then_x_first(&then, &r1, &r2, None);
    }

    /// For keys owned by S in `first`, X in `second`, S again in `third`
    /// (when given) and elsewhere in `latest`: `latest`'s older owners are
    /// S, then X.
    fn s_then_x_first(
        latest: &Topology,
        first: &Topology,
        second: &Topology,
        third: Option<&Topology>,
    ) {
        let at = |name: &str| {
            latest
                .backends
                .iter()
                .position(|b| b.name() == name)
                .unwrap()
        };
        let owner_in = |ring: &crate::ring::Ring, key: &[u8]| {
            at(&ring.members()[ring.owner(key).unwrap()].identity)
        };
        let mut found = 0;
        for i in 0..5000 {
            let key = format!("k{i}");
            let key = key.as_bytes();
            let (s, x) = (owner_in(&first.ring, key), owner_in(&second.ring, key));
            let owner = latest.owner_index(key).unwrap();
            if x == s || owner == s || third.is_some_and(|t| owner_in(&t.ring, key) != s) {
                continue;
            }
            let older = latest.older_owners(key, &[owner]).expect("older owners");
            assert_eq!(older.group(0), Some(&[s][..]), "k{i}: S first");
            assert_eq!(older.group(1), Some(&[x][..]), "k{i}: then X");
            found += 1;
        }
        assert!(found > 10, "{found} keys owned by S, X, S, Z");
    }

    /// A change undone within its window: a sidecar that applied only the
    /// change may still copy a moved key from the owner now to the previous
    /// one. After a plain change, no one copies that way.
    #[test]
    fn a_change_undone_in_its_window_may_have_moved_keys_copied_back() {
        let (runtime, hooks) = runtime_and_hooks();
        let _guard = runtime.enter();
        let r1 = first_of_chain(&hooks);
        let r2 = chain(&r1, &servers_named_s(5), &hooks);
        let back = chain(&r2, &servers_named_s(4), &hooks);
        let (mut moved, mut copies_back) = (0, 0);
        for i in 0..2000 {
            let key = format!("k{i}");
            let key = key.as_bytes();
            let owner = back.owner_index(key).unwrap();
            if back.previous_owner(key, owner).is_some() {
                moved += 1;
                copies_back += usize::from(back.copies_back(key, &[owner]));
                let owner_then = r2.owner_index(key).unwrap();
                assert!(!r2.copies_back(key, &[owner_then]), "a plain change");
            }
        }
        assert!(moved > 100, "{moved}");
        assert_eq!(copies_back, moved);
    }

    #[test]
    fn same_list_is_an_empty_change() {
        let list = vec![server("a", 1)];
        let change = Change::between(&list, &ring_of(&list), &list, &ring_of(&list));
        assert!(change.is_empty());
        assert_eq!(change.moved_share, 0.0);
    }
}

/// A hit of a retrieval with local-first reads: the replica that served
/// it (a backend index), whether that was the key's local replica asked
/// first, and whether the hit is copied back to it (`zone_write_back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZoneHit {
    pub(crate) server: u32,
    pub(crate) local: bool,
    pub(crate) written_back: bool,
}
