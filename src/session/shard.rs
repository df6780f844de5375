//! What one worker owns and its client sessions share: its connection to
//! each server, its share of the reply-byte budget, its settings. Lives on
//! the worker's thread only (`Rc`, `RefCell`, `Cell`: no locks), so sessions
//! queue requests on a connection without crossing threads.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::conn::{self, Conn};
use crate::backend::Backend;
use crate::hotkeys::HotWorker;
use crate::pools::layout::{Layout, SharedLayout};
use crate::pools::planned::{HeldTopologies, Planned};
use crate::pools::topology::{SharedTopology, Topology};
use crate::stats::Stats;

/// Settings every session of a worker reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionSettings {
    /// Requests of one client parsed and not yet answered.
    pub max_pending: usize,
    /// Close a client idle (or stuck halfway through a request) this long.
    pub idle_timeout: Option<Duration>,
    /// Close a client owed replies that reads none for this long.
    pub write_timeout: Duration,
    /// Reply bytes one client may be owed; `None` follows `max_value_bytes`.
    pub client_buffer_bytes: Option<usize>,
    /// `[request_log]`, read at start.
    pub request_log: crate::config::RequestLogSettings,
}

/// What a worker's sessions share. Lives on the worker thread only.
pub(crate) struct WorkerCtx {
    /// The pools and routes in force.
    pub(crate) layout: SharedLayout,
    pub(crate) stats: Arc<Stats>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) settings: SessionSettings,
    /// This worker's connections, by (backend id, lane).
    conns: RefCell<HashMap<(u64, usize), Rc<Conn>, BuildConnKeyHash>>,
    /// Cancelled once the worker's sessions are done: connections finish
    /// what they owe, then close.
    pub(crate) drain: CancellationToken,
    pub(crate) conn_tasks: TaskTracker,
    /// Read-through copies being checked after they landed
    /// (`session/copy_check.rs`); waited for at shutdown before the
    /// connections drain.
    pub(crate) checks: TaskTracker,
    /// Reply bytes this worker's clients are owed or have reserved, within
    /// its share of `max_buffer_bytes`.
    pub(crate) budget: Rc<crate::runtime::budget::WorkerBudget>,
    /// This worker's hot-key counts, requests in flight and windows.
    pub(crate) hot: Rc<HotWorker>,
    /// The time of this worker's current turn.
    pub(crate) clock: Rc<crate::runtime::clock::TurnClock>,
    /// This worker's shadow requests in flight (see `pools/shadow.rs`).
    pub(crate) shadow: Rc<crate::pools::shadow::InFlight>,
    /// This worker's part of the request latency histograms.
    pub(crate) latency: crate::stats::latency::LatencyWriter,
    /// This worker's `[request_log]` (see `request_log.rs`).
    pub(crate) request_log: super::request_log::RequestLog,
    /// This worker's handles on the topologies its requests plan on.
    held: HeldTopologies,
    /// The layout as this worker last saw it (see [`WorkerCtx::with_layout`]).
    layout_seen: RefCell<arc_swap::Cache<SharedLayout, Arc<Layout>>>,
}

impl WorkerCtx {
    /// A worker's state, with no connections yet.
    pub(crate) fn new(
        layout: SharedLayout,
        stats: Arc<Stats>,
        shutdown: CancellationToken,
        settings: SessionSettings,
        budget: usize,
        hot: Rc<HotWorker>,
    ) -> WorkerCtx {
        let budget = Rc::new(crate::runtime::budget::WorkerBudget::new(budget));
        stats.publish_reply_owed(budget.published());
        WorkerCtx {
            latency: stats.latency_writer(),
            request_log: super::request_log::RequestLog::new(
                settings.request_log,
                stats.request_log_dropped.clone(),
            ),
            stats,
            shutdown,
            settings,
            conns: RefCell::new(HashMap::default()),
            drain: CancellationToken::new(),
            conn_tasks: TaskTracker::new(),
            checks: TaskTracker::new(),
            budget,
            hot,
            clock: Rc::new(crate::runtime::clock::TurnClock::new()),
            shadow: Rc::default(),
            held: HeldTopologies::default(),
            layout_seen: RefCell::new(arc_swap::Cache::new(layout.clone())),
            layout,
        }
    }

    /// `plan` run on the layout in force, through this worker's cache of it:
    /// one atomic load sees whether it changed, where a load from the
    /// shared layout takes and gives back a guard. `plan` must not ask for
    /// the layout again.
    #[inline]
    pub(crate) fn with_layout<R>(&self, plan: impl FnOnce(&Arc<Layout>) -> R) -> R {
        plan(self.layout_seen.borrow_mut().load())
    }

    /// A request planned on `pool`'s topology now, of `layout`: counted
    /// in flight there, and on the topology that replaced it if it was
    /// replaced meanwhile (see `Planned::checked`).
    #[inline]
    pub(crate) fn planned(&self, layout: &Layout, pool: &SharedTopology) -> Planned {
        Planned::checked(self.held.now(pool), |old| {
            match layout.pool_of_topology(old) {
                Some(pool) => self.held.now(pool),
                None => Rc::new(old.clone()),
            }
        })
    }

    /// The default pool's topology now (limits, requests without a key).
    pub(crate) fn default_topology(&self) -> Arc<Topology> {
        self.layout.load().default_topology()
    }

    /// Requests this worker has in flight to `backend` (queued and
    /// unanswered, over all its connections to it): the load reads are
    /// balanced by.
    pub(crate) fn in_flight(&self, backend: &Backend) -> u32 {
        let shared = backend.shared();
        let conns = self.conns.borrow();
        (0..shared.settings.connections.max(1))
            .filter_map(|lane| conns.get(&(shared.id, lane)))
            .map(|conn| conn.in_flight())
            .sum::<usize>()
            .try_into()
            .unwrap_or(u32::MAX)
    }

    /// The worker's connection `lane` to `backend`, opened on first use.
    pub(crate) fn conn(&self, backend: &Backend, lane: usize) -> Rc<Conn> {
        let shared = backend.shared();
        let key = (shared.id, lane % shared.settings.connections.max(1));
        if let Some(conn) = self.conns.borrow().get(&key) {
            if !conn.is_closed() {
                return conn.clone();
            }
        }
        self.open(shared, key)
    }

    /// Opens the connection `conn` found missing or closed: once per
    /// server and lane, so kept out of the per-request path's code.
    #[cold]
    #[inline(never)]
    fn open(&self, shared: &Arc<crate::backend::Shared>, key: (u64, usize)) -> Rc<Conn> {
        let conn = Conn::new(shared.clone(), self.clock.clone());
        let mut conns = self.conns.borrow_mut();
        // Connections of retired servers end by themselves; forget them here.
        conns.retain(|_, c| !c.is_closed());
        conns.insert(key, conn.clone());
        self.conn_tasks
            .spawn_local(conn::run(conn.clone(), self.drain.clone()));
        conn
    }
}

/// Opens this worker's connections to every server of every pool's
/// topology, at start and after every change, so that a server's failure or
/// return is noticed (and its health known) before traffic needs it, and the
/// first requests do not wait for a connect.
pub(crate) async fn keep_connected(ctx: Rc<WorkerCtx>, published: Arc<tokio::sync::Notify>) {
    loop {
        let changed = published.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        ctx.held.forget_replaced();
        // Lets go of a replaced layout now, not at the next request.
        ctx.with_layout(|_| ());
        let layout = ctx.layout.load_full();
        for pool in layout.pools() {
            let topology = pool.topology.load_full();
            for backend in topology.backends.iter() {
                for lane in 0..backend.settings().connections.max(1) {
                    ctx.conn(backend, lane);
                }
            }
        }
        drop(layout);
        tokio::select! {
            () = changed => {}
            () = ctx.drain.cancelled() => return,
        }
    }
}

/// Hashes a connection's key (backend id, lane): two small integers that
/// need no defence against chosen collisions, looked up once per request.
/// SipHash, the map's default, cost as much as the rest of the lookup.
#[derive(Debug, Default, Clone, Copy)]
struct ConnKeyHasher(u64);

impl std::hash::Hasher for ConnKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }

    fn write_u64(&mut self, n: u64) {
        // A multiply spreads the bits across the word, as FxHash does.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type BuildConnKeyHash = std::hash::BuildHasherDefault<ConnKeyHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn connection_keys_hash_apart() {
        let build = BuildConnKeyHash::default();
        let mut seen = std::collections::HashSet::new();
        for id in 0..256u64 {
            for lane in 0..16usize {
                assert!(seen.insert(build.hash_one((id, lane))), "({id}, {lane})");
            }
        }
        // Spread over the bits the map uses: the low ones pick the bucket,
        // the top seven are its tag.
        let low: std::collections::HashSet<u64> = seen.iter().map(|h| h & 0xfff).collect();
        let top: std::collections::HashSet<u64> = seen.iter().map(|h| h >> 57).collect();
        assert!(
            low.len() > 2048 && top.len() > 100,
            "{} {}",
            low.len(),
            top.len()
        );
    }
}
