//! The pool set: the pools of a running process, one publisher per pool (each with its own
//! ring, health, ejection and hand-off window, see `control/publisher.rs`) and the layout
//! sessions route by. A reload gives each pool its part by name, starts the
//! pools it adds, stops the ones it removes, then stores the new layout (the
//! routes) in one swap.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, PoolConfig};
use crate::control::fd_budget::FdShortage;
use crate::control::publisher::{eject_on_health_changes, FdAccount, Published, Publisher};
use crate::pools::layout::{Layout, PoolEntry, SharedLayout};
use crate::pools::topology::Topology;
use crate::stats::Stats;

/// Every pool's publisher, and the layout over them.
pub struct Pools {
    layout: SharedLayout,
    members: Mutex<Vec<Member>>,
    stats: Arc<Stats>,
    tls: Option<Arc<crate::tls::Connector>>,
    /// Woken after any pool publishes and after a layout change, so workers
    /// connect to new servers before traffic needs them.
    published: Arc<Notify>,
    shutdown: CancellationToken,
    /// Where every pool's hand-off window is kept across restarts.
    state: Option<Arc<crate::pools::window_state::StateFile>>,
}

struct Member {
    publisher: Arc<Publisher>,
    listen: Option<crate::config::Listen>,
    /// Ends the pool's ejection and discovery tasks.
    stop: CancellationToken,
}

/// What a reload did to the pools.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Applied {
    /// The change of the default pool (every reload publishes it).
    pub default: Published,
    /// One line per other pool that was added, removed or changed.
    pub others: Vec<String>,
}

impl Pools {
    /// Starts a publisher, with its ejection and discovery tasks, for every
    /// pool of `config`. Only the default pool keeps the fd budget `fds`.
    /// Must be called inside a tokio runtime.
    pub(crate) fn start(
        config: &Config,
        stats: Arc<Stats>,
        mut fds: Option<FdAccount>,
        tls: Option<Arc<crate::tls::Connector>>,
        shutdown: CancellationToken,
        state: Option<(
            Arc<crate::pools::window_state::StateFile>,
            crate::pools::window_state::Loaded,
        )>,
    ) -> Arc<Pools> {
        let published = Arc::new(Notify::new());
        let mut members = Vec::new();
        let (state, loaded) = state.unzip();
        for pool in config.pool_list() {
            let account = if pool.name == config.default_pool {
                fds.take()
            } else {
                None
            };
            members.push(Member::start(
                &pool, &stats, account, &tls, &published, &shutdown, &state,
            ));
        }
        if let (Some(file), Some(loaded)) = (&state, loaded) {
            resume_windows(file, loaded, &members, &stats);
        }
        let layout = layout_of(config, &members, &stats);
        Arc::new(Pools {
            layout: Arc::new(ArcSwap::from_pointee(layout)),
            members: Mutex::new(members),
            stats,
            tls,
            published,
            shutdown,
            state,
        })
    }

    /// The layout sessions route by.
    pub fn layout(&self) -> SharedLayout {
        self.layout.clone()
    }

    /// Woken after every publish of any pool.
    pub fn published(&self) -> Arc<Notify> {
        self.published.clone()
    }

    /// The publisher of pool `name`.
    pub fn publisher(&self, name: &str) -> Option<Arc<Publisher>> {
        self.lock()
            .iter()
            .find(|m| m.publisher.name() == name)
            .map(|m| m.publisher.clone())
    }

    /// The publisher of the pool keys matching no route go to.
    pub fn default_publisher(&self) -> Arc<Publisher> {
        let name = self.layout.load().default_name().to_string();
        self.publisher(&name)
            .expect("the layout's default pool has a publisher")
    }

    /// The pools that have a listener of their own, with its address.
    pub fn listeners(&self) -> Vec<(Arc<Publisher>, crate::config::Listen)> {
        self.lock()
            .iter()
            .filter_map(|m| Some((m.publisher.clone(), m.listen.clone()?)))
            .collect()
    }

    /// The shadow pools `config` would make serve keys they do not serve
    /// now (see `Layout::promotions`).
    pub(crate) fn promotions(&self, config: &Config) -> Vec<crate::pools::layout::Promotion> {
        let routes: Vec<(String, String)> = config
            .routes
            .iter()
            .map(|r| (r.prefix.clone(), r.pool.clone()))
            .collect();
        self.layout.load().promotions(&config.default_pool, &routes)
    }

    /// The pools keys move between when `config`'s routing takes over
    /// (see `Layout::moves`).
    pub(crate) fn moves(&self, config: &Config) -> Vec<(Arc<str>, String)> {
        let routes: Vec<(String, String)> = config
            .routes
            .iter()
            .map(|r| (r.prefix.clone(), r.pool.clone()))
            .collect();
        self.layout.load().moves(&config.default_pool, &routes)
    }

    /// Before `config`'s routing takes over: deletes from every server of
    /// the running pool `to` the keys it takes from another pool (other
    /// than those in `exempt`), one `lru_crawler metadump` of each server
    /// (see `sweep::delete_moved`), and flushes the servers `config` gives
    /// it that it does not have yet (they serve nothing so far). Blocking:
    /// reloads run off the request path. Returns the keys deleted.
    ///
    /// # Errors
    /// A server that could not be swept or flushed, named.
    pub(crate) fn delete_moved_into(
        &self,
        to: &str,
        config: &Config,
        exempt: &[Arc<str>],
    ) -> Result<u64, String> {
        let routes: Vec<(String, String)> = config
            .routes
            .iter()
            .map(|r| (r.prefix.clone(), r.pool.clone()))
            .collect();
        let layout = self.layout.load_full();
        let running = self.publisher(to).map(|p| p.shared().load_full());
        let mut deleted = 0;
        if let Some(topology) = &running {
            let moved =
                |key: &[u8]| layout.moves_into(key, &config.default_pool, &routes, to, exempt);
            deleted = crate::inputs::resolve::block_on(|| {
                crate::control::sweep::delete_moved(topology, &moved)
            })?;
        }
        let wanted = config.pool_list().into_iter().find(|p| p.name == to);
        if let Some(pool) = wanted {
            let mut newcomers = (*pool.config).clone();
            newcomers.servers.retain(|server| {
                !running
                    .as_ref()
                    .is_some_and(|r| r.config.servers.iter().any(|s| s.addr == server.addr))
            });
            crate::control::newcomers::flush_every_server(&newcomers)?;
        }
        Ok(deleted)
    }

    /// Flushes every server of the running pool `name`, if it runs, then
    /// every server `config` gives it that it does not have yet.
    ///
    /// # Errors
    /// A server that could not be flushed, named.
    pub(crate) fn flush_for(&self, name: &str, config: &Config) -> Result<(), String> {
        let running = self
            .publisher(name)
            .map(|p| p.shared().load().config.clone());
        if let Some(running) = &running {
            crate::control::newcomers::flush_every_server(running)?;
        }
        let wanted = config.pool_list().into_iter().find(|p| p.name == name);
        if let Some(pool) = wanted {
            let mut newcomers = (*pool.config).clone();
            newcomers.servers.retain(|server| {
                !running
                    .as_ref()
                    .is_some_and(|r| r.servers.iter().any(|s| s.addr == server.addr))
            });
            crate::control::newcomers::flush_every_server(&newcomers)?;
        }
        Ok(())
    }

    /// Gives every pool of `config` its settings: pools that exist apply
    /// theirs (the default pool always, as one reload), new ones start,
    /// removed ones stop; then the routes are stored. A pool's `listen` is
    /// read at start only (see `control/reload.rs`): a pool added by a reload is
    /// reached through routes until a restart.
    ///
    /// # Errors
    /// The default pool's new ring does not fit in the open file limit:
    /// nothing changed.
    pub(crate) fn apply(&self, config: &Config) -> Result<Applied, FdShortage> {
        let mut members = self.lock();
        let wanted = config.pool_list();
        let default = wanted
            .iter()
            .find(|p| p.name == config.default_pool)
            .expect("a config's default pool is one of its pools");
        let unchanged = |topology: &crate::pools::topology::Topology| Published {
            version: topology.version,
            change: crate::pools::topology::Change::between(
                &[],
                &topology.ring,
                &[],
                &topology.ring,
            ),
        };
        let default = match members.iter().find(|m| m.publisher.name() == default.name) {
            // Another pool or the routes changed, not this one.
            Some(member) if *member.publisher.shared().load().config == *default.config => {
                unchanged(&member.publisher.shared().load())
            }
            Some(member) => member.publisher.apply_config((*default.config).clone())?,
            None => {
                // A pool that is new and now the default: it starts below.
                let ring = default.config.build_ring();
                Published {
                    version: 1,
                    change: crate::pools::topology::Change::between(
                        &[],
                        &ring,
                        &default.config.servers,
                        &ring,
                    ),
                }
            }
        };
        let mut others = Vec::new();
        for pool in &wanted {
            let existing = members.iter().find(|m| m.publisher.name() == pool.name);
            match existing {
                Some(_) if pool.name == config.default_pool => {}
                Some(member) => {
                    let running = member.publisher.shared().load().config.clone();
                    if *running == *pool.config {
                        continue;
                    }
                    crate::control::newcomers::flush_newcomers(
                        &member.publisher.shared().load(),
                        &pool.config,
                    );
                    // Only the default pool keeps an fd budget, so this
                    // cannot be refused.
                    if let Ok(Published { version, change }) =
                        member.publisher.apply_config((*pool.config).clone())
                    {
                        others.push(format!("pool {}: ring v{version}: {change}", pool.name));
                    }
                }
                None => {
                    let member = Member::start(
                        pool,
                        &self.stats,
                        None,
                        &self.tls,
                        &self.published,
                        &self.shutdown,
                        &self.state,
                    );
                    others.push(format!(
                        "pool {} added: {} servers{}",
                        pool.name,
                        pool.config.servers.len(),
                        if pool.listen.is_some() {
                            " (its listen starts with the next restart; routes reach it now)"
                        } else {
                            ""
                        }
                    ));
                    members.push(member);
                }
            }
        }
        let mut removed = Vec::new();
        members.retain(|m| {
            let wanted = wanted.iter().any(|p| p.name == m.publisher.name());
            // A pool's listener is bound at start only: its clients keep
            // being served, on the pool's last config, until a restart.
            if !wanted && m.listen.is_some() {
                others.push(format!(
                    "pool {}: removed from the config, but its listen serves it until the next restart",
                    m.publisher.name()
                ));
                return true;
            }
            if !wanted {
                removed.push((m.publisher.clone(), m.stop.clone()));
            }
            wanted
        });
        // Config order, as the layout lists them.
        members.sort_by_key(|m| wanted.iter().position(|p| p.name == m.publisher.name()));
        let layout = layout_of(config, &members, &self.stats);
        let old = self.layout.swap(Arc::new(layout));
        let new = self.layout.load();
        for (pool, shadow) in shadow_pairs(&old) {
            if !shadow_pairs(&new).contains(&(pool.clone(), shadow.clone())) {
                self.stats.shadow_gone(&pool, &shadow);
                others.push(format!("pool {pool}: shadow {shadow} removed"));
            }
        }
        for (pool, shadow) in shadow_pairs(&new) {
            if !shadow_pairs(&old).contains(&(pool.clone(), shadow.clone())) {
                others.push(format!("pool {pool}: shadow {shadow} added"));
            }
        }
        for (publisher, stop) in removed {
            // Requests already planned on its topology finish on it.
            stop.cancel();
            publisher.retire();
            others.push(format!("pool {} removed", publisher.name()));
        }
        self.published.notify_waiters();
        Ok(Applied { default, others })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Member {
    fn start(
        pool: &PoolConfig,
        stats: &Arc<Stats>,
        fds: Option<FdAccount>,
        tls: &Option<Arc<crate::tls::Connector>>,
        published: &Arc<Notify>,
        shutdown: &CancellationToken,
        state: &Option<Arc<crate::pools::window_state::StateFile>>,
    ) -> Member {
        let publisher = Publisher::new(
            &pool.name,
            (*pool.config).clone(),
            stats.clone(),
            fds,
            tls.clone(),
            published.clone(),
            state.clone(),
        );
        let stop = shutdown.child_token();
        tokio::spawn(eject_on_health_changes(publisher.clone(), stop.clone()));
        tokio::spawn(crate::control::discovery::run(
            publisher.clone(),
            stop.clone(),
        ));
        Member {
            publisher,
            listen: pool.listen.clone(),
            stop,
        }
    }
}

/// Takes up the hand-off windows the state file held at start, pool by
/// pool, or, when it could not be read, starts every pool in a window that
/// assumes the worst (see [`Publisher::blind_window`]).
fn resume_windows(
    file: &crate::pools::window_state::StateFile,
    loaded: crate::pools::window_state::Loaded,
    members: &[Member],
    stats: &Stats,
) {
    use crate::pools::window_state::Loaded;
    let path = file.path().display().to_string();
    match loaded {
        Loaded::Missing => tracing::info!(
            "no hand-off state file at {path} (a first start): no hand-off window to resume"
        ),
        Loaded::Windows(windows) => {
            let mut resumed = false;
            for member in members {
                if let Some(window) = windows.get(member.publisher.name()) {
                    member.publisher.resume(window);
                    resumed = true;
                }
            }
            if !resumed {
                tracing::info!("hand-off state file {path}: no window was in force");
            }
        }
        Loaded::Unusable(reason) => {
            stats.state_error();
            tracing::warn!(
                "hand-off state file {path} is unusable ({reason}): the windows in force are unknown, so every pool starts a window in which writes delete their key from every other server"
            );
            for member in members {
                member.publisher.blind_window(&path);
            }
        }
    }
}

/// The (primary, shadow) names of a layout's shadows.
fn shadow_pairs(layout: &Layout) -> Vec<(String, String)> {
    (0..layout.pools().len())
        .filter_map(|i| {
            let link = layout.shadow_of(i)?;
            Some((
                layout.pools()[i].name.to_string(),
                layout.pools()[link.pool].name.to_string(),
            ))
        })
        .collect()
}

fn layout_of(config: &Config, members: &[Member], stats: &Stats) -> Layout {
    let entries = members
        .iter()
        .map(|m| PoolEntry {
            name: m.publisher.name().into(),
            topology: m.publisher.shared(),
        })
        .collect();
    layout_over(config, entries, stats)
}

/// The layout a memring started on `config` would route by, with every
/// server ACTIVE and no hand-off window, and no task started: for `memring
/// where --config`. Must be called inside a tokio runtime (backends are
/// made there), which need not run.
pub(crate) fn offline_layout(config: &Config) -> Layout {
    let stats = Arc::new(Stats::new());
    let entries = config
        .pool_list()
        .into_iter()
        .map(|pool| {
            let hooks = crate::backend::PoolHooks {
                health_changed: Arc::new(Notify::new()),
                stats: stats.clone(),
                tls: None,
                pool: pool.name.as_str().into(),
            };
            let backends = Topology::backends_for(&pool.config, None, &hooks);
            let topology = Topology::assemble(pool.config.clone(), 1, backends, Vec::new());
            PoolEntry {
                name: pool.name.as_str().into(),
                topology: Arc::new(ArcSwap::from_pointee(topology)),
            }
        })
        .collect();
    layout_over(config, entries, &stats)
}

fn layout_over(config: &Config, entries: Vec<PoolEntry>, stats: &Stats) -> Layout {
    let routes: Vec<(String, String)> = config
        .routes
        .iter()
        .map(|r| (r.prefix.clone(), r.pool.clone()))
        .collect();
    let failovers: Vec<(String, String)> = config
        .pool_list()
        .into_iter()
        .filter_map(|p| Some((p.name.clone(), p.config.failover.as_ref()?.pool.clone())))
        .collect();
    let shadows = config.pool_list().into_iter().filter_map(|pool| {
        let shadow = pool.shadow?;
        let counters = stats.shadow_counters(&pool.name, &shadow.pool);
        Some((pool.name, shadow.pool, shadow.fraction, counters))
    });
    Layout::new(entries, &routes, &config.default_pool)
        .with_failovers(&failovers)
        .with_shadows(shadows)
}
