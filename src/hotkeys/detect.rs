//! Detection: each worker counts the keys of every request in one sketch per
//! server (`sketch.rs`); at each window's end it publishes the largest
//! counters (merged over the workers by `top.rs`) and takes the keys hot in
//! its last two windows. One worker's state: no lock, no I/O.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::coalesce::Flight;
use super::sketch::{BuildKeyHash, SpaceSaving};
use super::top::{ServerWindow, WorkerWindow};
use super::{HotWorker, COUNTERS_PER_SERVER};
use crate::topology::Topology;

/// A key is hot (coalesced, near-cached) when, in one of the worker's last
/// two windows, it surely took at least this share of its server's
/// requests...
const HOT_MIN_SHARE: f64 = 0.01;
/// ...and at least this many requests.
const HOT_MIN_REQUESTS: u64 = 16;

/// Topologies whose backend map a worker keeps: one per pool its clients
/// use, and the one before a reload.
const MAPS_KEPT: usize = 8;

/// One server's sketch in a worker.
pub(super) struct ServerSketch {
    /// The backend's id (two pools may have servers of the same name).
    backend: u64,
    name: Arc<str>,
    sketch: SpaceSaving,
}

pub(super) struct WorkerState {
    /// Per topology (by its id; one per pool in use), the index in
    /// `sketches` of each of its backends.
    pub(super) maps: Vec<(u64, Vec<usize>)>,
    /// The entry of `maps` the last request used.
    pub(super) current: usize,
    pub(super) sketches: Vec<ServerSketch>,
    pub(super) window_started: Instant,
    /// Hashes of the keys hot in either of the last two windows, so that a
    /// key hot all along does not drop out at a window's edge.
    pub(super) hot: HashSet<u64, BuildKeyHash>,
    /// Hashes of the keys hot in the last window alone.
    pub(super) hot_last: HashSet<u64, BuildKeyHash>,
    /// Hot keys' `get`s in flight, by key hash.
    pub(super) flights: HashMap<u64, Rc<Flight>, BuildKeyHash>,
}

impl WorkerState {
    pub(super) fn map(&mut self, topology: &Topology) {
        if self
            .maps
            .get(self.current)
            .is_some_and(|m| m.0 == topology.id)
        {
            return;
        }
        if let Some(at) = self.maps.iter().position(|m| m.0 == topology.id) {
            self.current = at;
            return;
        }
        let mut by_backend = Vec::with_capacity(topology.backends.len());
        for backend in topology.backends.iter() {
            let id = backend.shared().id;
            let at = match self.sketches.iter().position(|s| s.backend == id) {
                Some(at) => at,
                None => {
                    self.sketches.push(ServerSketch {
                        backend: id,
                        name: backend.name().into(),
                        sketch: SpaceSaving::new(COUNTERS_PER_SERVER),
                    });
                    self.sketches.len() - 1
                }
            };
            by_backend.push(at);
        }
        // Older topologies of the same pools are not asked again.
        if self.maps.len() >= MAPS_KEPT {
            self.maps.remove(0);
        }
        self.maps.push((topology.id, by_backend));
        self.current = self.maps.len() - 1;
    }

    #[inline]
    pub(super) fn count(&mut self, server: Option<usize>, hash: u64, key: &[u8]) {
        let by_backend = self.maps.get(self.current).map(|m| &m.1);
        if let Some(&at) = server.and_then(|s| by_backend?.get(s)) {
            self.sketches[at].sketch.add(hash, key);
        }
    }
}

impl HotWorker {
    /// Ends the window: publishes its largest counters, remembers its hot
    /// keys, starts counting afresh.
    pub(super) fn roll(&self) {
        let now = Instant::now();
        let mut state = self.state.borrow_mut();
        let seconds = now.duration_since(state.window_started).as_secs_f64();
        state.window_started = now;
        let published = self
            .shared
            .live
            .load()
            .settings
            .top
            .clamp(32, COUNTERS_PER_SERVER);
        let mut hot = HashSet::default();
        let mut servers = Vec::with_capacity(state.sketches.len());
        for server in &mut state.sketches {
            let total = server.sketch.total();
            let mut keys = server.sketch.top(COUNTERS_PER_SERVER);
            let bar = HOT_MIN_REQUESTS.max((total as f64 * HOT_MIN_SHARE).ceil() as u64);
            hot.extend(
                keys.iter()
                    .filter(|e| e.count - e.error >= bar)
                    .map(|e| e.hash),
            );
            keys.truncate(published);
            server.sketch.clear();
            servers.push(ServerWindow {
                name: server.name.clone(),
                total,
                keys,
            });
        }
        // Servers gone from the topology are forgotten; the next request
        // maps the current ones again.
        let mapped: Vec<bool> = (0..state.sketches.len())
            .map(|i| state.maps.iter().any(|m| m.1.contains(&i)))
            .collect();
        if mapped.contains(&false) {
            let mut i = 0;
            state.sketches.retain(|_| {
                i += 1;
                mapped[i - 1]
            });
            state.maps.clear();
        }
        let mut both = hot.clone();
        both.extend(state.hot_last.iter().copied());
        state.hot = both;
        state.hot_last = hot;
        // A flight held only here was dropped by its connection.
        state
            .flights
            .retain(|_, f| !f.state.borrow().done && Rc::strong_count(f) > 1);
        drop(state);
        self.shared
            .publish(self.index, now, WorkerWindow { seconds, servers });
    }
}
