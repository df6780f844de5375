//! A pool's publisher: the one writer of its published topology. Config
//! reloads and health ejections both build their new topology here, one at a time, and
//! publish it with one arc-swap store; [`eject_on_health_changes`] is the
//! task that turns DEAD servers into ejections.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::backend::health::HealthState;
use crate::backend::{Backend, PoolHooks};
use crate::config::{Config, Ejection, ServerConfig};
use crate::control::client_slots::ClientSlots;
use crate::control::fd_budget::{FdBudget, FdShortage};
use crate::pools::topology::{Change, Previous, SharedTopology, Topology};
use crate::stats::Stats;

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
    /// The open file limit every ring must fit in, next to the clients.
    fds: Option<FdAccount>,
    /// The pool's request and hit counters, given to every topology.
    figures: Arc<crate::stats::PoolFigures>,
    /// The pool's cut-off flag, in every topology (`Topology::cut_off`).
    fence: Arc<crate::pools::topology::Fence>,
    /// The pool's identity in every topology it publishes.
    pool_id: u64,
    /// With `failover`: when each server last came back from the gutter.
    restored_at: Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Where the sweep that closes the hand-off window stands.
    window_sweep: Mutex<WindowSweep>,
    /// Where the window in force is kept across restarts (`state_file`).
    state: Option<Arc<crate::pools::window_state::StateFile>>,
    /// The servers that etcd's members add to the file's (see
    /// `control/etcd/`): a reload of the file keeps them.
    from_store: Mutex<Vec<ServerConfig>>,
    /// The topologies this one replaced that something may still hold
    /// (requests planned on them among others): see [`Publisher::in_flight_before`].
    retired: Mutex<Vec<std::sync::Weak<Topology>>>,
}

/// A hand-off window ends only once its sweep has run (see
/// [`close_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum WindowSweep {
    /// No window is closing.
    #[default]
    Idle,
    /// The window's time is up and its sweep is deleting the previous
    /// owners' copies.
    Running,
    /// The sweep is over: the window ends at the next look.
    Done,
}

/// What the publisher needs to keep every ring within the open file limit.
pub(crate) struct FdAccount {
    pub(crate) budget: FdBudget,
    pub(crate) clients: Arc<ClientSlots>,
    /// `max_client_connections` as started (it is read only at start).
    pub(crate) max_clients: usize,
}

/// One published change.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub version: u64,
    pub change: Change,
}

impl Publisher {
    /// Builds the first topology (version 1) and starts its backends. Must be
    /// called inside a tokio runtime. With `fds`, reloads that do not fit in
    /// the open file limit are refused.
    pub(crate) fn new(
        name: &str,
        config: Config,
        stats: Arc<Stats>,
        fds: Option<FdAccount>,
        tls: Option<Arc<crate::tls::Connector>>,
        published: Arc<Notify>,
        state: Option<Arc<crate::pools::window_state::StateFile>>,
    ) -> Arc<Publisher> {
        let hooks = PoolHooks {
            health_changed: Arc::new(Notify::new()),
            stats,
            tls,
            pool: name.into(),
        };
        let backends = Topology::backends_for(&config, None, &hooks);
        let figures = hooks.stats.pool_figures(name);
        static NEXT_POOL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let pool_id = NEXT_POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut first = Topology::assemble(Arc::new(config), 1, backends, Vec::new());
        first.figures = figures.clone();
        let fence = first.fence.clone();
        first.pool_id = pool_id;
        record(&hooks, &first);
        Arc::new(Publisher {
            topology: Arc::new(ArcSwap::from_pointee(first)),
            lock: Mutex::new(()),
            hooks,
            published,
            fds,
            figures,
            fence,
            pool_id,
            restored_at: Mutex::new(std::collections::HashMap::new()),
            window_sweep: Mutex::new(WindowSweep::Idle),
            state,
            from_store: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
        })
    }

    /// Publishes `new` in place of the topology in force, which is marked
    /// retired (a request that loads it from now on plans on `new`) and
    /// kept, weakly, for [`Publisher::in_flight_before`].
    fn store(&self, new: Topology) {
        let old = self.topology.swap(Arc::new(new));
        old.in_flight.retire();
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|t| t.strong_count() > 0);
        retired.push(Arc::downgrade(&old));
    }

    /// Fences the pool's requests off (`true`: cut off from etcd, see
    /// `Topology::cut_off`) or lets them through again; whether it was fenced.
    pub(crate) fn fence(&self, on: bool) -> bool {
        self.fence.set(on)
    }

    /// The requests still in flight that were planned on a topology of this
    /// pool older than version `version` (0 when every one has finished:
    /// none is planned on them any more).
    pub(crate) fn in_flight_before(&self, version: u64) -> usize {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|t| t.strong_count() > 0);
        retired
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|t| t.version < version)
            .map(|t| t.in_flight.count())
            .sum()
    }

    /// Writes the window `topology` is in (or that there is none) to the
    /// state file, before `topology` is published.
    fn save(&self, topology: &Topology) {
        if let Some(state) = &self.state {
            let window = topology.saved_window();
            state.record(&self.hooks.pool, window);
        }
    }

    /// The topology after `first` on the same config and servers, before a
    /// resumed window is set on it.
    fn successor(&self, first: &Topology) -> Topology {
        let mut new = Topology::assemble(
            first.config.clone(),
            first.version + 1,
            first.backends.clone(),
            Vec::new(),
        );
        new.figures = self.figures.clone();
        new.fence = self.fence.clone();
        new.pool_id = self.pool_id;
        new
    }

    /// Takes up the window an earlier run saved (before any request): the
    /// same previous rings and deadline when the config's ring is the ring
    /// that was in force; otherwise the config is a change from that ring,
    /// chained onto its window as a reload would chain it, and only servers
    /// that window does not know are flushed. A window whose time is up
    /// and whose sweep has not run is taken up too: its sweep runs at once,
    /// then it ends.
    pub(crate) fn resume(&self, saved: &crate::pools::window_state::SavedWindow) {
        let from = self
            .state
            .as_ref()
            .map_or_else(String::new, |s| s.path().display().to_string());
        let prefix = self.log_prefix();
        let now = crate::runtime::clock::unix_now();
        if saved.swept && saved.until_unix <= now {
            tracing::info!(
                "{prefix}the hand-off window saved in {from} was over (swept, until {}); starting without one",
                utc(saved.until_unix)
            );
            self.save(&self.topology.load());
            return;
        }
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let first = self.topology.load_full();
        let rebuilt = (|| -> Result<_, String> {
            let spec = saved.ring.spec()?;
            let ring = saved.ring.build()?;
            let previous = Previous::resumed(
                saved.previous.build()?,
                saved.previous.members(),
                saved.until_unix,
                Arc::new(saved.previous.clone()),
            );
            let mut older = Vec::new();
            for r in &saved.older {
                older.push(Previous::resumed(
                    r.build()?,
                    r.members(),
                    saved.until_unix,
                    Arc::new(r.clone()),
                ));
            }
            Ok((spec, ring, previous, older))
        })();
        let (spec, ring, previous, older) = match rebuilt {
            Ok(parts) => parts,
            Err(e) => {
                drop(guard);
                tracing::warn!("{prefix}hand-off state file {from}: {e}");
                self.hooks.stats.state_error();
                self.blind_window(&from);
                return;
            }
        };
        // Every server the window names gets a backend (the configured ones
        // keep theirs): the previous owners that left the config stay
        // LEAVING for the window, as after a reload.
        let mut known = (*first.config).clone();
        known.servers = saved.servers();
        known.ring = spec.clone();
        let backends = Topology::backends_for(&known, Some(&first), &self.hooks);
        let mut scaffold = Topology::assemble(Arc::new(known.clone()), 0, backends, Vec::new());
        let dropped: Vec<String> = saved.dropped.iter().map(|s| s.name.clone()).collect();
        scaffold.drop_servers(&dropped);
        let over = saved.until_unix <= now;
        if ring == first.ring && first.config.ring == spec {
            let mut new = self.successor(&first);
            new.set_previous(previous, older, &scaffold);
            if saved.undoes {
                new.set_undoes();
            }
            record(&self.hooks, &new);
            self.save(&new);
            let rings = 1 + new.older.len();
            self.store(new);
            self.published.notify_waiters();
            self.hooks.stats.window_resumed();
            if over {
                tracing::info!(
                    "{prefix}resumed hand-off window from {from}: its time was up at {} while memring was down, so its sweep runs now, then it ends",
                    utc(saved.until_unix)
                );
            } else {
                tracing::info!(
                    "{prefix}resumed hand-off window from {from} until {} ({rings} earlier ring{} kept, same ring in force)",
                    utc(saved.until_unix),
                    if rings == 1 { "" } else { "s" }
                );
            }
            return;
        }
        // The config changed while memring was down: the saved ring in
        // force is the ring a reload would change from.
        known.servers = saved.ring.server_configs();
        let backends = Topology::backends_for(&known, Some(&scaffold), &self.hooks);
        let mut before = Topology::assemble(Arc::new(known), first.version, backends, Vec::new());
        before.set_previous(previous, older, &scaffold);
        if saved.undoes {
            before.set_undoes();
        }
        let config = first.config.clone();
        std::thread::scope(|scope| {
            // Blocking, and the control plane's runtime may be the
            // caller's: on a thread of its own.
            scope.spawn(|| crate::control::newcomers::flush_newcomers(&before, &config));
        });
        let backends = Topology::backends_for(&config, Some(&before), &self.hooks);
        let Published { version, change } =
            self.publish(&before, config.clone(), backends, Vec::new());
        self.hooks.stats.window_resumed();
        tracing::info!(
            "{prefix}resumed hand-off window from {from} (until {}); the config changed while memring was down: ring v{version}: {change}",
            utc(saved.until_unix)
        );
    }

    /// Starts a window that knows no earlier ring, when the state file
    /// could not be read: a window may be in force on the other sidecars
    /// (and was on this one), with previous owners still holding older
    /// values that they read through. For `handoff_ms` every write of a key
    /// also deletes it from every other configured server (as for rings
    /// dropped from a chain: when in doubt, miss), reads ask the owner only,
    /// and the window ends with its sweep, which deletes from each server
    /// the keys it does not own.
    pub(crate) fn blind_window(&self, from: &str) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let first = self.topology.load_full();
        let window = first.config.handoff;
        let prefix = self.log_prefix();
        if window.is_zero() {
            tracing::warn!(
                "{prefix}handoff_ms = 0: no window to guard the unknown state of {from}"
            );
            return;
        }
        let mut scaffold =
            Topology::assemble(first.config.clone(), 0, first.backends.clone(), Vec::new());
        let everyone: Vec<String> = first
            .config
            .servers
            .iter()
            .map(|s| s.name.clone())
            .collect();
        scaffold.drop_servers(&everyone);
        let mut new = self.successor(&first);
        let previous = Previous::new(first.ring.clone(), first.members(), window).with_source(
            crate::pools::window_state::SavedRing::of(&first.config.ring, &first.ring_servers()),
        );
        let until = previous.until_unix;
        new.set_previous(previous, Vec::new(), &scaffold);
        record(&self.hooks, &new);
        self.save(&new);
        self.store(new);
        self.published.notify_waiters();
        tracing::warn!(
            "{prefix}hand-off windows in force unknown: until {} every write also deletes its key from every other server, reads ask the owner only, then a sweep",
            utc(until)
        );
    }

    /// The servers etcd's members add to the file's now.
    pub(crate) fn store_servers(&self) -> Vec<ServerConfig> {
        self.from_store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the servers etcd's members add to the file's.
    pub(crate) fn set_store_servers(&self, servers: Vec<ServerConfig>) {
        *self.from_store.lock().unwrap_or_else(|e| e.into_inner()) = servers;
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

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.hooks.pool
    }

    /// What this pool's log lines start with: nothing for the top-level
    /// pool, so one-pool logs read as before.
    pub fn log_prefix(&self) -> String {
        if &*self.hooks.pool == crate::config::DEFAULT_POOL {
            String::new()
        } else {
            format!("pool {}: ", self.hooks.pool)
        }
    }

    /// Forgets the pool's figures (a reload removed it).
    pub(crate) fn retire(&self) {
        let topology = self.topology.load();
        for backend in topology.backends.iter() {
            self.hooks
                .stats
                .membership_gone(&self.hooks.pool, backend.name());
        }
        self.hooks.stats.pool_gone(&self.hooks.pool);
        self.hooks.stats.pool_zones(&self.hooks.pool, []);
        if let Some(state) = &self.state {
            state.record(&self.hooks.pool, None);
        }
    }

    /// Resolves when a server's health crossed DEAD (either way).
    pub async fn health_changed(&self) {
        self.hooks.health_changed.notified().await;
    }

    /// Publishes a new config. Servers that are DEAD stay ejected if ejection
    /// is on.
    ///
    /// # Errors
    /// The new ring's backend connections do not fit in the open file limit
    /// next to the clients connected: nothing changed.
    pub fn apply_config(&self, config: Config) -> Result<Published, FdShortage> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.topology.load_full();
        let config = Arc::new(config);
        // Ejection is judged on the backends the new topology will have: a
        // server whose address or settings changed gets a fresh backend.
        let backends = Topology::backends_for(&config, Some(&old), &self.hooks);
        if let Some(fds) = &self.fds {
            // New clients lose their slots before the new ring connects, so
            // that its connects find descriptors. A client accepted between
            // the count and the new limit is covered by the fixed margin.
            let peak = fds_while_switching(&fds.budget, &old.backends, &backends);
            let clients =
                fds.budget
                    .client_limit_for_ring(fds.max_clients, fds.clients.in_use(), peak)?;
            fds.clients.set_limit(clients);
        }
        let ejected = self.to_eject(&config, &backends);
        Ok(self.publish(&old, config, backends, ejected))
    }

    /// Clients served at once now, when memring keeps an fd budget.
    pub fn client_limit(&self) -> Option<usize> {
        self.fds.as_ref().map(|fds| fds.clients.limit())
    }

    /// Servers out of the ring that are no longer DEAD: they would come back
    /// on the next [`Publisher::apply_health_holding`].
    pub fn returning(&self) -> Vec<Arc<Backend>> {
        let old = self.topology.load_full();
        let ejected = self.to_eject(&old.config, &old.backends);
        old.backends
            .iter()
            .filter(|b| old.ejected.iter().any(|n| n == b.name()))
            .filter(|b| !ejected.iter().any(|n| n == b.name()))
            .cloned()
            .collect()
    }

    /// Re-evaluates ejection after health changes, except that the servers
    /// named in `hold` stay ejected (their flush on return failed); publishes
    /// only if the set of ejected servers changed.
    pub fn apply_health_holding(&self, hold: &[String]) -> Option<Published> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.topology.load_full();
        let mut ejected = self.to_eject(&old.config, &old.backends);
        for name in hold {
            if old.ejected.contains(name) && !ejected.contains(name) {
                ejected.push(name.clone());
            }
        }
        ejected.sort_by_key(|n| old.config.servers.iter().position(|s| &s.name == n));
        if ejected.as_slice() == &old.ejected[..] {
            return None;
        }
        let configured = old.backends[..old.config.servers.len()].to_vec();
        Some(self.publish(&old, old.config.clone(), configured.into(), ejected))
    }

    /// Ends the hand-off window if it is over: publishes the same ring
    /// without the previous one, which lets LEAVING servers go.
    pub fn end_window(&self) -> Option<Published> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.topology.load_full();
        let previous = old.previous.as_ref()?;
        if previous.until > std::time::Instant::now() {
            return None;
        }
        let configured = old.backends[..old.config.servers.len()].to_vec();
        let mut new = Topology::assemble(
            old.config.clone(),
            old.version + 1,
            configured.into(),
            old.ejected.to_vec(),
        );
        new.figures = self.figures.clone();
        new.fence = self.fence.clone();
        new.pool_id = self.pool_id;
        let version = new.version;
        record(&self.hooks, &new);
        forget_gone(&self.hooks, &old, &new);
        // LEAVING servers' connections close now: new clients may have
        // their descriptors.
        if let Some(fds) = &self.fds {
            let backend_fds = fds
                .budget
                .backend_fds(new.backends.iter().map(|b| b.settings().connections));
            if let Ok(clients) =
                fds.budget
                    .client_limit_for_ring(fds.max_clients, fds.clients.in_use(), backend_fds)
            {
                fds.clients.set_limit(clients);
            }
        }
        self.save(&new);
        self.store(new);
        self.published.notify_waiters();
        Some(Published {
            version,
            change: Change::between(&[], &old.ring, &[], &old.ring),
        })
    }

    /// The earliest moment a DEAD server is due back in the ring
    /// (`ejection = "twemproxy"`), if one is waiting for it.
    pub fn next_retry(&self) -> Option<std::time::Instant> {
        self.topology
            .load()
            .backends
            .iter()
            .filter_map(|b| b.retry_at())
            .min()
    }

    /// Puts back every DEAD server whose retry is due; true if any was.
    pub fn retry_due(&self) -> bool {
        let now = std::time::Instant::now();
        let topology = self.topology.load();
        // Every backend is ticked: no short cut after the first one due.
        let due: Vec<bool> = topology.backends.iter().map(|b| b.tick(now)).collect();
        due.contains(&true)
    }

    /// When the current hand-off window ends, if there is one.
    pub fn window_end(&self) -> Option<std::time::Instant> {
        self.topology.load().previous.as_ref().map(|p| p.until)
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
        if config.failover.is_some() && !restored.is_empty() {
            let now = std::time::Instant::now();
            let mut restored_at = self.restored_at.lock().unwrap_or_else(|e| e.into_inner());
            for name in &restored {
                restored_at.insert(name.clone(), now);
            }
        }
        // Built off the request path; requests in flight finish on `old`.
        let mut new = Topology::assemble(config, old.version + 1, backends, ejected);
        new.figures = self.figures.clone();
        new.fence = self.fence.clone();
        new.pool_id = self.pool_id;
        let mut change = Change::between(&servers_before, &old.ring, &servers_after, &new.ring);
        // Ejections and restorations are reported as such, not as adds/removes.
        change.added.retain(|n| !restored.contains(n));
        change.removed.retain(|n| !newly_ejected.contains(n));
        change.ejected = newly_ejected;
        change.restored = restored;
        // A change that gives keys new owners (other than an ejection, whose
        // previous owner is DEAD) starts a hand-off window from the ring in
        // force. The rings of a window it chains onto are kept (up to
        // KEPT_RINGS) for writes to delete the key on their owners, since
        // a later change may go back to one of them. Otherwise a running
        // window carries on unchanged.
        // With twemproxy timing a returning server was not flushed and
        // nutcracker reads its keys from it at once, so memring does too.
        let window = new.config.handoff;
        let restore_hands_off = new.config.ejection == Ejection::Memring;
        // With replicas, a server moved to another zone moves copies (not
        // owners): a window then reads them through and forgets them by the
        // previous ring's zone-aware replicas.
        let rezoned = !change.rezoned.is_empty() && new.config.replicas > 1;
        let starts = !window.is_zero()
            && (rezoned
                || change.moved_share > 0.0
                    && (!change.added.is_empty()
                        || !change.removed.is_empty()
                        || !change.reweighted.is_empty()
                        || (restore_hands_off && !change.restored.is_empty())));
        if starts {
            let previous = Previous::new(old.ring.clone(), old.members(), window).with_source(
                crate::pools::window_state::SavedRing::of(&old.config.ring, &old.ring_servers()),
            );
            change.handoff = Some(Box::new((
                window.as_millis() as u64,
                previous.until_unix,
                new.config.shared_with.reads_through(),
            )));
            new.set_previous(previous, old.kept_rings(), old);
        } else if let Some(running) = &old.previous {
            if !window.is_zero() && running.until > std::time::Instant::now() {
                let older = old.older.iter().map(Previous::carried).collect();
                new.set_previous(running.carried(), older, old);
            }
        }
        let version = new.version;
        record(&self.hooks, &new);
        forget_gone(&self.hooks, old, &new);
        self.save(&new);
        self.store(new);
        self.published.notify_waiters();
        Published { version, change }
    }

    /// DEAD servers to leave out of the ring: none when ejection is off, and
    /// never all of them (an empty ring would fail every key instead of some).
    /// With `failover`, the DEAD servers whose keys go to the gutter: every
    /// one, except a server back from the gutter less than `failover_ttl_s`
    /// ago, whose keys fail instead until the gutter's copies of its last
    /// outage have expired (they may be older than writes made since).
    fn to_eject(&self, config: &Config, backends: &[Arc<Backend>]) -> Vec<String> {
        if !config.auto_eject && config.failover.is_none() {
            return Vec::new();
        }
        let dead = config.servers.iter().filter(|server| {
            backends
                .iter()
                .any(|b| b.name() == server.name && b.state() == HealthState::Dead)
        });
        if let Some(failover) = &config.failover {
            let restored = self.restored_at.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            return dead
                .filter(|s| {
                    restored
                        .get(&s.name)
                        .map_or(true, |at| now.duration_since(*at) >= failover.ttl)
                })
                .map(|s| s.name.clone())
                .collect();
        }
        let dead: Vec<String> = dead.map(|server| server.name.clone()).collect();
        if dead.len() == config.servers.len() {
            Vec::new()
        } else {
            dead
        }
    }
}

/// Descriptors the backends of two rings hold together: the old ring's
/// connections stay open while the new ring's are made, and for the
/// hand-off window LEAVING servers keep theirs.
fn fds_while_switching(budget: &FdBudget, old: &[Arc<Backend>], new: &[Arc<Backend>]) -> u64 {
    let fresh = new
        .iter()
        .filter(|b| !old.iter().any(|kept| Arc::ptr_eq(kept, b)));
    budget.backend_fds(old.iter().chain(fresh).map(|b| b.settings().connections))
}

/// The servers on the ring: neither ejected nor warming (a server that stops
/// warming is added to the ring then, and opens a hand-off window).
fn effective(servers: &[ServerConfig], ejected: &[String]) -> Vec<ServerConfig> {
    servers
        .iter()
        .filter(|s| !ejected.contains(&s.name) && !s.warming)
        .cloned()
        .collect()
}

fn record(hooks: &PoolHooks, topology: &Topology) {
    hooks.stats.topology(
        &hooks.pool,
        topology.version,
        topology.backends.len(),
        topology.effective_servers(),
    );
    for (i, backend) in topology.backends.iter().enumerate() {
        hooks
            .stats
            .membership(&hooks.pool, backend.name(), topology.membership(i).as_str());
    }
    let config = &topology.config;
    let zones = config.servers.iter().filter_map(|s| s.zone.as_deref());
    let warming = |zone: &str| config.warming_zones.iter().any(|z| z == zone);
    hooks
        .stats
        .pool_zones(&hooks.pool, zones.map(|zone| (zone, warming(zone))));
}

/// Forgets the membership lines of servers `old` had and `new` has not.
fn forget_gone(hooks: &PoolHooks, old: &Topology, new: &Topology) {
    for backend in old.backends.iter() {
        if !new.backends.iter().any(|b| b.name() == backend.name()) {
            hooks.stats.membership_gone(&hooks.pool, backend.name());
        }
    }
}

/// Closes the hand-off window whose time is up, in two steps: first the
/// sweep deletes, from every server of the ring, the keys the ring places
/// elsewhere (the previous owners' copies), and only then is the window
/// ended. Until it ends, writes of moved keys still delete them from their
/// previous owners: a sidecar whose window ended while another's still
/// reads through (they reload seconds apart) would otherwise delete a key
/// on its new owner only, and the other would read the previous owner's
/// value back and copy it over. Whether a window is closing now.
fn close_window(publisher: &Arc<Publisher>) -> bool {
    let mut state = publisher
        .window_sweep
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    match *state {
        WindowSweep::Running => return true,
        WindowSweep::Done => {
            *state = WindowSweep::Idle;
            if let Some(Published { version, .. }) = publisher.end_window() {
                tracing::info!(
                    "{}ring v{version}: hand-off window over; leaving servers closed",
                    publisher.log_prefix()
                );
            }
            // Otherwise a change during the sweep started a later window:
            // its own sweep closes it.
        }
        WindowSweep::Idle => {}
    }
    let over = publisher
        .window_end()
        .is_some_and(|end| end <= std::time::Instant::now());
    if !over {
        return false;
    }
    *state = WindowSweep::Running;
    let topology = publisher.topology.load_full();
    let version = topology.version;
    let swept_until = topology.previous.as_ref().map(|p| p.until_unix);
    let (shared, stats) = (publisher.topology.clone(), publisher.hooks.stats.clone());
    let prefix = publisher.log_prefix();
    let publisher = publisher.clone();
    tokio::spawn(async move {
        let swept = crate::control::sweep::sweep(shared, topology, stats).await;
        let deleted: u64 = swept.iter().map(|(_, n)| n).sum();
        tracing::info!(
            "{prefix}ring v{version}: deleted {deleted} keys from {} servers that no longer own them",
            swept.len()
        );
        // Marked only while the swept window is still the one in force
        // (a change meanwhile started another, which has its own sweep).
        let current = publisher.topology.load();
        let still = current.previous.as_ref().map(|p| p.until_unix) == swept_until;
        if let (Some(state), true) = (&publisher.state, still) {
            state.swept(&publisher.hooks.pool);
        }
        *publisher
            .window_sweep
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = WindowSweep::Done;
        publisher.hooks.health_changed.notify_one();
    });
    true
}

/// Leaves DEAD servers out of the ring (when `auto_eject` is on) and puts them
/// back when they recover, each as one published topology change.
///
/// A returning server is flushed before it re-enters the ring: keys written
/// while it was out went to other servers, and its old values must never be
/// read again. Its return is then a join with a hand-off window, so its keys
/// are read through from the servers that held them meanwhile.
///
/// With `ejection = "twemproxy"` a DEAD server returns when its
/// `retry_timeout_ms` has passed, woken here on time, and neither flush nor
/// hand-off happens: nutcracker does neither, and a flush would empty a
/// server whose keys nutcracker reads again at that very moment.
///
/// The same task ends hand-off windows when they are over.
pub(crate) async fn eject_on_health_changes(
    publisher: Arc<Publisher>,
    shutdown: CancellationToken,
) {
    loop {
        let closing = close_window(&publisher);
        // Checked at least every second, so a window started by a reload is
        // ended on time without a wake-up from the reloader.
        let tick = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let tick = match publisher.window_end() {
            Some(end) if !closing => end.min(tick),
            _ => tick,
        };
        let tick = publisher.next_retry().map_or(tick, |at| at.min(tick));
        tokio::select! {
            () = publisher.health_changed() => {}
            () = tokio::time::sleep_until(tick.into()) => {
                // With a gutter, a DEAD server held back after a recent
                // return is failed over once its hold is over: look again.
                let failover = publisher.topology.load().config.failover.is_some();
                if !publisher.retry_due() && !failover {
                    continue;
                }
            }
            () = shutdown.cancelled() => return,
        }
        let mut hold = Vec::new();
        let flushes = publisher.topology.load().config.ejection == Ejection::Memring;
        for backend in publisher.returning().into_iter().filter(|_| flushes) {
            let name = backend.name().to_string();
            let settings = {
                let topology = publisher.topology.load();
                crate::backend::BackendSettings::from_config(&topology.config)
            };
            let timeout = settings.connect_timeout + settings.request_timeout;
            match flush(&backend, timeout).await {
                Ok(()) => tracing::info!("{name} returns: flushed, joins with hand-off"),
                Err(e) => {
                    tracing::warn!("{name} stays ejected: flush before its return failed: {e}");
                    hold.push(name);
                }
            }
        }
        if let Some(Published { version, change }) = publisher.apply_health_holding(&hold) {
            tracing::warn!("{}ring v{version}: {change}", publisher.log_prefix());
        }
        if !hold.is_empty() {
            // Try again shortly: health will not change again by itself.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            publisher.hooks.health_changed.notify_one();
        }
    }
}

/// `unix` as the time of day in UTC, as the reload log line gives it.
fn utc(unix: u64) -> String {
    let day = unix % 86_400;
    format!("{:02}:{:02}:{:02} UTC", day / 3600, day / 60 % 60, day % 60)
}

/// `flush_all` on a server, over a short-lived connection of its own (TLS
/// for a server with `tls = true`).
async fn flush(backend: &Backend, timeout: std::time::Duration) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = backend.connect_own().await?;
        stream.write_all(b"flush_all\r\n").await?;
        stream.flush().await?;
        let mut reply = [0u8; 64];
        let mut got = 0;
        while !reply[..got].ends_with(b"\r\n") && got < reply.len() {
            let n = stream.read(&mut reply[got..]).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        crate::control::newcomers::flush_answer(&reply[..got])
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("flush_all timed out")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::planned::Planned;

    /// A publisher of one server, and a change that adds a second; with
    /// etcd membership (not contacted here) and the fleet gate on, so that
    /// requests count themselves in flight.
    fn publisher() -> (Arc<Publisher>, Config) {
        let text = "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"127.0.0.1:1\"\n[discovery]\netcd_endpoints = [\"127.0.0.1:2379\"]\netcd_prefix = \"/t/\"\n";
        let config = Config::parse(text, "t.toml").expect("a config");
        let mut second = config.servers[0].clone();
        second.addr = "127.0.0.1:2".into();
        second.name = "127.0.0.1:2".into();
        let servers = vec![config.servers[0].clone(), second];
        let changed = config.with_servers(servers);
        let stats = Arc::new(Stats::new());
        let published = Arc::new(Notify::new());
        let publisher = Publisher::new("default", config, stats, None, None, published, None);
        (publisher, changed)
    }

    #[test]
    fn requests_planned_before_a_publish_count_until_they_end() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _in = runtime.enter();
        let (publisher, changed) = publisher();
        let shared = publisher.shared();
        let handle = || std::rc::Rc::new(shared.load_full());
        let load = || Planned::checked(handle(), |_| handle());
        let before = [load(), load()];
        // Loaded before the publish, counted only after it.
        let late = shared.load_full();
        publisher.apply_config(changed).expect("published");
        let version = shared.load().version;
        assert_eq!(publisher.in_flight_before(version), 2);
        let late = Planned::checked(std::rc::Rc::new(late), |_| handle());
        assert_eq!(late.version, version, "planned on the new topology");
        let after = load();
        assert_eq!(
            publisher.in_flight_before(version),
            2,
            "only the older ones"
        );
        drop(before);
        assert_eq!(publisher.in_flight_before(version), 0);
        drop((late, after));
    }
}
