//! Detection: each worker counts the keys of its requests in one sketch per
//! server (`sketch.rs`); at each window's end it publishes the largest
//! counters (merged over the workers by `top.rs`) and takes the keys hot in
//! its last two windows. One worker's state: no lock, no I/O.
//!
//! A worker that took many requests in its last window counts only a random
//! sample of them in the next one ([`Sampler`]), the counts scaled back up:
//! with no key hot, counting every key was the largest cost of the hot-key
//! layer on pipelined loads, and a key that takes a share of a busy server
//! still shows in a sample of thousands.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::coalesce::Flight;
use super::sketch::{BuildKeyHash, Estimate, SpaceSaving};
use super::top::{ServerWindow, WorkerWindow};
use super::{HotWorker, COUNTERS_PER_SERVER};
use crate::pools::topology::Topology;

/// A key is hot (coalesced, near-cached) when, in one of the worker's last
/// two windows, it surely took at least this share of its server's
/// requests, by the margin [`HOT_MARGIN_LOG_ODDS`] asks for...
const HOT_MIN_SHARE: f64 = 0.01;
/// ...and at least this many requests.
const HOT_MIN_REQUESTS: u64 = 16;
/// The share's bar is cleared by a margin luck does not make up: the
/// chance that a key with no more than the bar's share is flagged in one
/// window stays below e^-this (one in a million). A key's count in a
/// window is a sum of chances (which request comes next, which one the
/// sampler takes); for a count expected at the bar `b` (as counted: in a
/// sample, the sample's), Bernstein's inequality bounds the chance of
/// `b + t` or more by e^-L once `t = L/3 + sqrt(L²/9 + 2·L·b)`. Without
/// the margin, an even load over about 100 keys a server (each at the bar)
/// had half of them flagged hot in every window, their reads coalesced,
/// near-cached and spread over replicas for nothing. The cost: near the
/// bar, a key must take more than the bar's share to be flagged (2.7 times
/// at a bar of 16 counted requests; 1.5 times at 125; 1.05 times at
/// 10 000). A key read alone still needs only [`HOT_MIN_REQUESTS`]: its
/// share is far above the bar.
const HOT_MARGIN_LOG_ODDS: f64 = 14.0;

/// The count a key must reach in a window to be hot, when its server's
/// `bar` (in counted requests) is the share it must surely take.
fn with_margin(bar: f64) -> u64 {
    let l = HOT_MARGIN_LOG_ODDS;
    (bar + l / 3.0 + (l * l / 9.0 + 2.0 * l * bar).sqrt()).ceil() as u64
}

/// A worker with fewer keys than this in a window has every request of the
/// next window counted...
const COUNT_ALL_BELOW: u64 = 8192;
/// ...and a busier one one request in at most this many.
const MAX_STRIDE: u64 = 16;

/// Which requests a worker counts this window: one in `stride` (a power of
/// two), picked at random so that no cycle of keys lines up with the
/// sample. A request not picked costs a few cycles.
#[derive(Debug)]
pub(super) struct Sampler {
    stride: u64,
    /// xorshift state, never 0.
    random: u64,
}

impl Sampler {
    pub(super) fn new(seed: u64) -> Sampler {
        Sampler {
            stride: 1,
            random: seed | 1,
        }
    }

    /// Whether the next request is counted.
    #[inline]
    pub(super) fn take(&mut self) -> bool {
        if self.stride == 1 {
            return true;
        }
        // xorshift64: a few cycles, and random enough to pick a sample.
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        x & (self.stride - 1) == 0
    }

    /// Sets the next window's stride by how many keys this one had.
    fn next_window(&mut self, keys: u64) {
        let stride = (keys / COUNT_ALL_BELOW).clamp(1, MAX_STRIDE);
        self.stride = 1 << stride.ilog2();
    }
}

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

impl ServerSketch {
    fn new(backend: u64, name: Arc<str>) -> ServerSketch {
        ServerSketch {
            backend,
            name,
            sketch: SpaceSaving::new(COUNTERS_PER_SERVER),
        }
    }

    /// Ends a window in which one request in `stride` was counted: its keys'
    /// total and its largest counters, scaled back to requests (largest
    /// first), and the hashes of the keys that surely took `share` of the
    /// requests and at least `min_requests` of them (as counted: a sample
    /// must have seen the key that often too), by the margin
    /// [`HOT_MARGIN_LOG_ODDS`] asks for.
    fn end_window(
        &mut self,
        stride: u64,
        share: f64,
        min_requests: u64,
    ) -> (u64, Vec<Estimate>, Vec<u64>) {
        let total = self.sketch.total().saturating_mul(stride);
        // The share's bar in counted requests with the margin above it;
        // `min_requests` (no chance to allow for) as counted.
        let bar = with_margin(total as f64 * share / stride as f64).max(min_requests);
        let mut keys = self.sketch.top(COUNTERS_PER_SERVER);
        let hot = keys
            .iter()
            .filter(|e| e.count - e.error >= bar)
            .map(|e| e.hash)
            .collect();
        for estimate in &mut keys {
            estimate.count = estimate.count.saturating_mul(stride);
            estimate.error = estimate.error.saturating_mul(stride);
        }
        self.sketch.clear();
        (total, keys, hot)
    }
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
    /// Which requests this window counts.
    pub(super) sampler: Sampler,
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
                    self.sketches
                        .push(ServerSketch::new(id, backend.name().into()));
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
        let stride = state.sampler.stride;
        let mut keys_seen = 0;
        for server in &mut state.sketches {
            let (total, mut keys, hot_here) =
                server.end_window(stride, HOT_MIN_SHARE, HOT_MIN_REQUESTS);
            keys_seen += total;
            hot.extend(hot_here);
            keys.truncate(published);
            let floor = match keys.last() {
                Some(last) if keys.len() == published => last.count,
                _ => 0,
            };
            servers.push(ServerWindow {
                name: server.name.clone(),
                total,
                keys,
                floor,
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
        state.sampler.next_window(keys_seen);
        let mut both = hot.clone();
        both.extend(state.hot_last.iter().copied());
        state.hot = both;
        state.hot_last = hot;
        // A flight held only here was dropped by its connection.
        state
            .flights
            .retain(|_, f| !f.state.borrow().done && Rc::strong_count(f) > 1);
        drop(state);
        self.shared.publish(
            self.index,
            now,
            WorkerWindow {
                seconds,
                servers,
                sampled_one_in: stride,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts `keys` (one request each) as a worker would.
    fn count<'a>(
        sketch: &mut ServerSketch,
        sampler: &mut Sampler,
        keys: impl Iterator<Item = &'a [u8]>,
    ) {
        for key in keys {
            if sampler.take() {
                sketch.sketch.add(crate::hotkeys::key_hash(key), key);
            }
        }
    }

    /// Ends the window as a worker would.
    fn end(sketch: &mut ServerSketch, sampler: &mut Sampler) -> (u64, Vec<Estimate>, Vec<u64>) {
        let ended = sketch.end_window(sampler.stride, HOT_MIN_SHARE, HOT_MIN_REQUESTS);
        sampler.next_window(ended.0);
        ended
    }

    fn hash(key: &str) -> u64 {
        crate::hotkeys::key_hash(key.as_bytes())
    }

    /// A window of `n` requests: key `hot` every 20th (5 %), the others each
    /// a different key.
    fn busy_window(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| match i % 20 {
                0 => b"hot".to_vec(),
                _ => format!("cold:{i}").into_bytes(),
            })
            .collect()
    }

    #[test]
    fn a_quiet_worker_counts_every_key_exactly() {
        let (mut sketch, mut sampler) = (ServerSketch::new(1, "a".into()), Sampler::new(7));
        let keys = busy_window(8000);
        count(&mut sketch, &mut sampler, keys.iter().map(|k| &k[..]));
        let (total, top, hot) = end(&mut sketch, &mut sampler);
        assert_eq!(total, 8000);
        assert_eq!(
            (top[0].hash, top[0].count, top[0].error),
            (hash("hot"), 400, 0)
        );
        assert_eq!(hot, vec![hash("hot")]);
        assert_eq!(sampler.stride, 1, "the next window counts every key too");
    }

    #[test]
    fn a_busy_worker_samples_and_still_finds_the_hot_key() {
        let (mut sketch, mut sampler) = (ServerSketch::new(1, "a".into()), Sampler::new(7));
        let keys = busy_window(200_000);
        count(&mut sketch, &mut sampler, keys.iter().map(|k| &k[..]));
        end(&mut sketch, &mut sampler);
        // 200 000 keys in the last window: one in 16 counted in this one.
        assert_eq!(sampler.stride, MAX_STRIDE);
        count(&mut sketch, &mut sampler, keys.iter().map(|k| &k[..]));
        assert!(
            sketch.sketch.total() < 200_000 / 12,
            "{}",
            sketch.sketch.total()
        );
        let (total, top, hot) = end(&mut sketch, &mut sampler);
        // The total is estimated too.
        assert!((180_000..220_000).contains(&total), "{total}");
        assert_eq!(hot, vec![hash("hot")], "no cold key is taken for hot");
        // 10 000 true requests, estimated from about 625 samples.
        assert_eq!(top[0].hash, hash("hot"));
        assert!((8_500..11_500).contains(&top[0].count), "{:?}", top[0]);
        // A light window makes the next one count fully again.
        count(
            &mut sketch,
            &mut sampler,
            keys[..1000].iter().map(|k| &k[..]),
        );
        end(&mut sketch, &mut sampler);
        assert_eq!(sampler.stride, 1);
    }

    /// Flags over `windows` windows of `per_window` requests: each of `keys`
    /// keys drawn at random, but every `hot_every`-th request `hot`.
    /// Returns (cold keys flagged, windows in which `hot` was flagged).
    fn flagged(keys: u64, per_window: u64, hot_every: u64, windows: usize) -> (usize, usize) {
        let (mut sketch, mut sampler) = (ServerSketch::new(1, "a".into()), Sampler::new(7));
        // splitmix64: not the sampler's xorshift, whose draws it would
        // otherwise line up with.
        let mut state = 0x1234_5678_9abc_def1u64;
        let (mut cold, mut hot_windows) = (0, 0);
        for _ in 0..windows {
            for i in 0..per_window {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut random = state;
                random = (random ^ (random >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                random = (random ^ (random >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                random ^= random >> 31;
                let key = match hot_every {
                    0 => format!("k{}", random % keys),
                    _ if i % hot_every == 0 => "hot".to_string(),
                    _ => format!("k{}", random % keys),
                };
                if sampler.take() {
                    sketch.sketch.add(hash(&key), key.as_bytes());
                }
            }
            let (_, _, hot) = end(&mut sketch, &mut sampler);
            hot_windows += usize::from(hot.contains(&hash("hot")));
            cold += hot.iter().filter(|&&h| h != hash("hot")).count();
        }
        (cold, hot_windows)
    }

    #[test]
    fn an_even_load_has_no_hot_key_and_a_hot_key_over_it_is_found() {
        // Counting every request (2 000 and 8 000 a window) and a sample
        // (50 000 and 200 000: one in 4 and one in 16).
        for per_window in [2_000, 8_000, 50_000, 200_000] {
            // 10 000 and 1 000 keys take 0.01 % and 0.1 % each; 200 and
            // 100 keys 0.5 % and 1 %, within the counts' noise of the bar
            // (without the margin, at 2 000 a window: 513 of 100 keys'
            // 1 000 counts in 10 windows flagged, 7 of 200 keys'; none of
            // 10 000 or 1 000 keys).
            for keys in [10_000, 1_000, 200, 100] {
                assert_eq!(
                    flagged(keys, per_window, 0, 10),
                    (0, 0),
                    "{keys} keys, {per_window} requests a window"
                );
            }
            // A key with 3 % of the requests over an even load is found
            // in every window (the bar's margin, `with_margin`, is at most
            // 2.45 times the bar here).
            for keys in [10_000, 100] {
                assert_eq!(
                    flagged(keys, per_window, 33, 10),
                    (0, 10),
                    "{keys} keys and a hot one, {per_window} requests a window"
                );
            }
        }
    }

    #[test]
    fn a_cycle_of_keys_as_long_as_the_stride_is_sampled_evenly() {
        // Keys asked in a fixed cycle of 16: a sample of every 16th request
        // would see one of them only, 16 times too often.
        let (mut sketch, mut sampler) = (ServerSketch::new(1, "a".into()), Sampler::new(7));
        let cycle: Vec<Vec<u8>> = (0..16).map(|i| format!("k{i}").into_bytes()).collect();
        let keys: Vec<&[u8]> = (0..400_000).map(|i| &cycle[i % 16][..]).collect();
        count(&mut sketch, &mut sampler, keys.iter().copied());
        end(&mut sketch, &mut sampler);
        assert_eq!(sampler.stride, MAX_STRIDE);
        count(&mut sketch, &mut sampler, keys.iter().copied());
        let (_, top, hot) = end(&mut sketch, &mut sampler);
        assert_eq!((top.len(), hot.len()), (16, 16));
        for estimate in &top {
            // 25 000 true requests each.
            assert!((22_000..28_000).contains(&estimate.count), "{estimate:?}");
        }
    }
}
