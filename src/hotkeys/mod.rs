//! Hot keys: naming the keys that take most of their server's requests, and
//! taking their load off that server.
//!
//! - **Detection** (always on; `detect.rs`): each worker counts the keys of
//!   its requests in one [`sketch::SpaceSaving`] per server, with no lock
//!   (every request of a quiet worker, a random sample of a busy one's).
//!   Every `hot_key_window_ms` it publishes the window's largest counters and
//!   starts a new window; `stats hotkeys`, the Prometheus gauges and the log
//!   line (`monitor.rs`) merge the workers' last windows ([`top`]).
//! - **Coalescing** (`hot_key_coalesce`, on by default; `coalesce.rs`): a
//!   single-key `get` of a key that was hot in the worker's last window
//!   waits for the same request another client of the worker already sent,
//!   if nothing has written the key since that request was sent.
//! - **Near cache** (`hot_key_cache_ms`, off by default; `near_cache.rs`):
//!   the values of hot keys are kept for at most that long and answer `get`s
//!   without a round trip.
//!
//! # What keeps reads after writes correct (`versions.rs`)
//! Every write through this memring (storage commands, `delete`, `incr`,
//! `decr`, `touch`, `gat`, `gats`, `flush_all`, and the meta commands that
//! change an item) moves a version on its key's stripe (shared by all
//! workers) when it is planned, when it is queued on a connection, and again
//! when its reply has arrived (or, for `noreply`, when the server has
//! answered the request memring sends without `noreply`), and counts as
//! pending from plan to reply.
//! - A `get` may take a cached value only when its key's stripe has no write
//!   pending and still has the version the value was fetched at.
//! - A hot key's stored value (`set`/`add`/`replace`/`cas`, no expiry) is
//!   cached only when no other write moved or was pending on its stripe from
//!   its plan to its reply: memcached then holds exactly that value.
//! - A `get` may join a request in flight only when the stripe still has the
//!   version that request was sent at and the request went on the
//!   connection this client's own requests use, queued after every write of
//!   this client (memcached runs one connection's requests in order).
//! - Neither shortcut is taken while the client waits for an earlier reply
//!   from the key's server (other than the one it joins): its reads then
//!   keep the order memcached keeps on one connection.
//!
//! So a `get` that arrives after a write was planned (by any client of this
//! memring, on any worker) never takes a reply fetched before it, a
//! client's own earlier writes, pipelined or not, are always seen, and no
//! read of a client's is older than one it made before. A `get`
//! that overlaps another client's unanswered write may see the value from
//! before or after it, as with memcached itself. Writes that do not pass
//! through this memring are seen by the near cache after at most
//! `hot_key_cache_ms`.
//!
//! This file is what a session calls: each worker's `HotWorker` and the
//! types a session meets. What all workers share (settings, the published
//! windows) is in `shared.rs`.
//!
//! No I/O here beyond what the session and the monitor task ask for.

mod coalesce;
mod detect;
mod monitor;
mod near_cache;
mod shared;
pub mod sketch;
pub mod top;
mod versions;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::backend::conn::Conn;
use crate::backend::slot::Slot;
use crate::plan::route::{Plan, SubRequest};
use crate::pools::topology::Topology;
use crate::protocol::meta::MetaRequest;
use crate::protocol::{Command, Request};
use coalesce::Flight;
pub(crate) use coalesce::Ticket;
use detect::WorkerState;
pub(crate) use monitor::monitor;
pub(crate) use monitor::run_windows;
use near_cache::{cache_key, stored_value};
pub(crate) use shared::HotShared;
pub(crate) use versions::WriteGuard;
use versions::{is_write, Target, WriteFill, WrittenKeys};

/// Counters of each server's sketch, per worker: any key above 1/128 of its
/// server's requests in a window is sure to be counted.
pub const COUNTERS_PER_SERVER: usize = 128;

/// The xxh3 hash the sketches, stripes and flights know a key by: the
/// memring ring's own key hash, so that the planner's hash of a key (see
/// `Topology::owner_index_hashed`) is counted without hashing it again.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    crate::ring::key_hash(key)
}

/// A request's keys as the hot keys count them, in either dialect.
pub(crate) trait CountedKeys {
    /// How many keys it has.
    fn len(&self) -> usize;
    /// Key `i` as the ring placed it (a meta `b` key decoded).
    fn key(&self, i: usize) -> &[u8];
    /// Whether it may change what its keys hold (it is then a write).
    fn writes(&self) -> bool;
    /// Whether it empties every server (`flush_all`).
    fn flushes(&self) -> bool;
    /// What a `get` of the key would answer once it is stored, for the
    /// near cache: a storage command's `VALUE` block.
    fn stored_block(&self) -> Option<Bytes>;
}

/// A classic request's keys, read in its bytes.
pub(crate) struct ClassicKeys<'r> {
    pub request: &'r Request,
    pub bytes: &'r Bytes,
}

impl CountedKeys for ClassicKeys<'_> {
    fn len(&self) -> usize {
        self.request.keys.len()
    }

    fn key(&self, i: usize) -> &[u8] {
        self.request.key(self.bytes, i)
    }

    fn writes(&self) -> bool {
        is_write(self.request.command)
    }

    fn flushes(&self) -> bool {
        self.request.command == Command::FlushAll
    }

    fn stored_block(&self) -> Option<Bytes> {
        stored_value(self.request, self.bytes)
    }
}

/// A meta request's one key (its routing key: a `b` key decoded); a
/// request that may change the item is a write. The near cache takes no
/// value from it.
pub(crate) struct MetaKey<'r> {
    pub request: &'r MetaRequest,
    pub bytes: &'r Bytes,
    pub key: &'r [u8],
}

impl CountedKeys for MetaKey<'_> {
    fn len(&self) -> usize {
        usize::from(self.request.key.is_some())
    }

    fn key(&self, _: usize) -> &[u8] {
        self.key
    }

    fn writes(&self) -> bool {
        self.request.changes_item(self.bytes)
    }

    fn flushes(&self) -> bool {
        false
    }

    fn stored_block(&self) -> Option<Bytes> {
        None
    }
}

/// A worker's handle on the shared state.
type Local = Rc<Arc<HotShared>>;

/// What the session does with one sub-request of a retrieval.
pub(crate) enum GetShortcut {
    /// Send it; then call [`HotWorker::sent`] with the ticket, if any.
    Send(Option<Ticket>),
    /// Its slot will be filled with another session's reply.
    Joined,
    /// Answered from the near cache with this `VALUE` block.
    Cached(Bytes),
}

/// A session's own requests to one server, as [`HotWorker::before_send`]
/// needs to see them: memcached answers one connection's requests in order,
/// and a shortcut may not break that order for the session's client.
pub(crate) trait Unanswered {
    /// Whether every request the session sent (or joined) for `server`
    /// before the one being decided, and whose reply has not fully arrived,
    /// has its reply going to a slot `ours` accepts. With `ours` always
    /// false: whether the session waits for nothing from `server`.
    fn all_to(&self, server: usize, ours: &mut dyn FnMut(&Rc<Slot>) -> bool) -> bool;
}

/// One worker's hot-key state. Lives on the worker thread only.
pub(crate) struct HotWorker {
    shared: Local,
    index: usize,
    state: RefCell<WorkerState>,
    /// Ended write guards kept for the next writes (see
    /// [`HotWorker::write_done`]): a write allocates none in steady state.
    kept_guards: RefCell<Vec<Rc<WriteGuard>>>,
}

/// Most ended write guards a worker keeps.
const KEEP_GUARDS: usize = 1024;

impl crate::plan::placement::HotKeys for HotWorker {
    fn any_hot(&self) -> bool {
        !self.state.borrow().hot.is_empty()
    }

    fn is_hot(&self, hash: u64) -> bool {
        self.state.borrow().hot.contains(&hash)
    }
}

impl HotWorker {
    /// Whether some key is hot on this worker now.
    pub(crate) fn any_hot(&self) -> bool {
        !self.state.borrow().hot.is_empty()
    }

    pub(crate) fn new(shared: Arc<HotShared>, index: usize) -> HotWorker {
        HotWorker {
            shared: Rc::new(shared),
            index,
            state: RefCell::new(WorkerState {
                maps: Vec::new(),
                current: 0,
                sketches: Vec::new(),
                window_started: Instant::now(),
                hot: HashSet::default(),
                hot_last: HashSet::default(),
                flights: HashMap::default(),
                sampler: detect::Sampler::new(0x9e37_79b9_7f4a_7c15 ^ (index as u64 + 1)),
            }),
            kept_guards: RefCell::new(Vec::new()),
        }
    }

    /// A write guard, in kept storage when there is some.
    fn guard(&self, target: Target, fill: Option<WriteFill>) -> Rc<WriteGuard> {
        let kept = self.kept_guards.borrow_mut().pop();
        WriteGuard::begin_in(kept, &self.shared, target, fill)
    }

    /// The entry of `guard`'s write is finished: the write ends now if
    /// nothing else holds the guard (a `noreply` write's slot may), and its
    /// storage is kept for a later write.
    pub(crate) fn write_done(&self, mut guard: Rc<WriteGuard>) {
        let Some(ended) = Rc::get_mut(&mut guard) else {
            return;
        };
        ended.end();
        // What it held of the write goes now.
        ended.fill = None;
        ended.target = Target::Keys(WrittenKeys::new());
        let mut kept = self.kept_guards.borrow_mut();
        if kept.len() < KEEP_GUARDS {
            kept.push(guard);
        }
    }

    /// The `stats hotkeys` reply.
    pub(crate) fn report(&self) -> Bytes {
        self.shared.report()
    }

    /// Counts the keys of a request (either dialect) against the servers
    /// its `plan` sends them to; for a write, returns what keeps it pending
    /// until it is complete.
    pub(crate) fn on_request(
        &self,
        request: &impl CountedKeys,
        plan: &Plan,
        topology: &Topology,
    ) -> Option<Rc<WriteGuard>> {
        // Writes are tracked whenever keys are counted, so that coalescing or
        // a near cache turned on by a reload never meets a write it did not
        // see planned.
        if !self.shared.started.detect {
            return None;
        }
        let write = request.writes();
        let caching = write && self.shared.caching();
        let mut hashes = WrittenKeys::new();
        {
            let mut state = self.state.borrow_mut();
            // A read the sample leaves out has nothing more to do here.
            let counted = state.sampler.take();
            if !counted && !write {
                return None;
            }
            if counted {
                state.map(topology);
            }
            for i in 0..request.len() {
                let Some((server, planned)) = plan.key_target(i) else {
                    continue;
                };
                let key = request.key(i);
                // The planner's hash of the key when it took this one.
                let hash = planned.unwrap_or_else(|| key_hash(key));
                if counted {
                    state.count(server, hash, key);
                }
                if write {
                    let key = caching.then(|| cache_key(topology, key));
                    hashes.push((hash, key));
                }
            }
        }
        if write && request.flushes() {
            return Some(self.guard(Target::All, None));
        }
        if hashes.is_empty() {
            return None;
        }
        // A hot key's stored value can answer the next `get`s at once: when
        // the write goes to the owner alone and the key is hot here.
        let fill = match (caching && plan.owner_alone(), &hashes[..]) {
            (true, [(hash, Some(key))]) if self.state.borrow().hot.contains(hash) => {
                request.stored_block().map(|block| WriteFill {
                    key: key.clone(),
                    hash: *hash,
                    block,
                })
            }
            _ => None,
        };
        Some(self.guard(Target::Keys(hashes), fill))
    }

    /// Decides how one sub-request of a retrieval, about to be queued on
    /// `conn`, is answered: a hot key's single-key `get`/`gets` may join the
    /// same request already in flight on this worker, or (`get` only) take
    /// the near cache's value.
    ///
    /// The near cache answers only when no write to the key is pending, none
    /// was planned since the value was fetched, and the session waits for no
    /// earlier reply from the key's server (`earlier`). Then the value holds
    /// every write through memring planned before now (each was complete
    /// when the value was fetched or stored, or the version would have
    /// moved), and every earlier read of the session ran before now, so it
    /// is never newer. Without the last rule an earlier `gets k`, `get a k`
    /// or `get k` still on its way could be overtaken by another client's
    /// write and then answer newer than this later `get k`: the client
    /// would see the key go back in time.
    ///
    /// A flight may be joined when it was queued on `conn`, the connection
    /// all of this session's requests to the server go on, has no reply
    /// piece yet, no write to the key was planned, queued or completed since
    /// it was sent, and every earlier reply the session waits for from the
    /// server is this flight's. Then the joined `get` is answered as if it
    /// ran where the flight runs on `conn`: after every earlier request of
    /// the session (answered ones ran before a flight with no reply yet, on
    /// one connection), and before every later one. Its own pending writes
    /// were queued before the flight (queuing one moves the version), so
    /// memcached runs them first; another session's pending write has not
    /// been answered, so this `get` is concurrent with it. A flight on
    /// another connection is never joined: this session's later requests
    /// could run before it, and so see an older value after a newer one.
    pub(crate) fn before_send(
        &self,
        sub: &SubRequest,
        conn: &Rc<Conn>,
        topology: &Topology,
        slot: &Rc<Slot>,
        earlier: &dyn Unanswered,
    ) -> GetShortcut {
        // No key is hot while detection is off.
        if topology.config.replicas > 1 || self.state.borrow().hot.is_empty() {
            return GetShortcut::Send(None);
        }
        let Some((command, key)) = single_key(&sub.line) else {
            return GetShortcut::Send(None);
        };
        let hash = key_hash(key);
        let mut state = self.state.borrow_mut();
        // Cut off from etcd (`etcd_cut_off = "miss"`), a retrieval planned
        // before the cut goes on as planned, but the near cache neither
        // answers nor is filled, and no flight is joined.
        if !state.hot.contains(&hash) || topology.cut_off() {
            return GetShortcut::Send(None);
        }
        let (version, quiet) = self.shared.settled(hash);
        let stats = &self.shared.stats.hot;
        let live = self.shared.live.load();
        if let (true, Command::Get, Some(cache)) = (quiet, command, &live.cache) {
            match cache.get(&cache_key(topology, key)) {
                Some(cached)
                    if cached.version == version && earlier.all_to(sub.server, &mut |_| false) =>
                {
                    stats.cache_hits.inc();
                    return GetShortcut::Cached(cached.block);
                }
                _ => {
                    stats.cache_misses.inc();
                }
            }
        }
        if live.settings.coalesce {
            if let Some(flight) = state.flights.get(&hash) {
                let mut flight_state = flight.state.borrow_mut();
                // Joining late would miss pieces already handed on.
                if flight.version == version
                    && Rc::ptr_eq(&flight.conn, conn)
                    && flight.line == sub.line
                    && !flight_state.started
                    && !flight_state.done
                    && earlier.all_to(sub.server, &mut |s| flight.answers(&flight_state, s))
                {
                    flight.join(slot, &mut flight_state);
                    stats.coalesced.inc();
                    topology.backends[sub.server].metrics().coalesced.inc();
                    return GetShortcut::Joined;
                }
            }
        }
        // The key's last flight, when done and held by nothing else, lends
        // its storage to the next.
        let spent = state
            .flights
            .remove(&hash)
            .filter(|f| Rc::strong_count(f) == 1 && f.state.borrow().done);
        // Only a value fetched while no write is pending may be kept.
        let fill = (quiet && command == Command::Get && live.cache.is_some())
            .then(|| cache_key(topology, key));
        GetShortcut::Send(Some(Ticket {
            conn: conn.clone(),
            line: sub.line.clone(),
            hash,
            version,
            fill,
            spent,
        }))
    }

    /// The ticket's request was queued with its reply going to `slot`.
    pub(crate) fn sent(&self, ticket: Ticket, slot: &Rc<Slot>) {
        let hash = ticket.hash;
        let flight = Flight::reuse(ticket, slot, &self.shared);
        slot.watch(flight.clone());
        if self.shared.live.load().settings.coalesce {
            self.state.borrow_mut().flights.insert(hash, flight);
        }
    }
}

/// `get <key>\r\n` or `gets <key>\r\n`: the command and the key.
fn single_key(line: &[u8]) -> Option<(Command, &[u8])> {
    let (command, rest) = if let Some(rest) = line.strip_prefix(b"get ") {
        (Command::Get, rest)
    } else {
        (Command::Gets, line.strip_prefix(b"gets ")?)
    };
    let key = rest.strip_suffix(b"\r\n")?;
    (!key.is_empty() && !key.contains(&b' ')).then_some((command, key))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::config::HotKeySettings;
    use crate::stats::Stats;

    #[test]
    fn the_planners_hash_of_a_key_is_the_one_it_is_counted_by() {
        for key in [&b"k"[..], b"user:{42}", &[b'x'; 250]] {
            assert_eq!(key_hash(key), crate::ring::key_hash(key));
        }
    }

    #[test]
    fn single_key_gets_are_recognised() {
        assert_eq!(single_key(b"get k\r\n"), Some((Command::Get, &b"k"[..])));
        assert_eq!(
            single_key(b"gets k:1\r\n"),
            Some((Command::Gets, &b"k:1"[..]))
        );
        assert_eq!(single_key(b"get a b\r\n"), None);
        assert_eq!(single_key(b"gat 10 k\r\n"), None);
        assert_eq!(single_key(b"get \r\n"), None);
        assert_eq!(single_key(b"get k"), None);
    }

    #[test]
    fn a_kept_guard_ends_its_write_once_and_serves_the_next() {
        let stats = Arc::new(Stats::new());
        let worker = HotWorker::new(HotShared::new(HotKeySettings::default(), 1, stats), 0);
        let (a, b) = (key_hash(b"a"), key_hash(b"b"));
        let keys = |hash| Target::Keys(smallvec::smallvec![(hash, None)]);
        let first = worker.guard(keys(a), None);
        let held = first.clone();
        // Still held elsewhere (a noreply write's slot): not ended, not kept.
        worker.write_done(first);
        assert!(!worker.shared.settled(a).1);
        assert!(worker.kept_guards.borrow().is_empty());
        drop(held);
        assert!(worker.shared.settled(a).1);
        let second = worker.guard(keys(a), None);
        let storage = Rc::as_ptr(&second);
        worker.write_done(second);
        assert!(worker.shared.settled(a).1, "ended when handed back");
        assert_eq!(worker.kept_guards.borrow().len(), 1);
        // The next write takes the kept storage and is pending on its own key.
        let third = worker.guard(keys(b), None);
        assert_eq!(Rc::as_ptr(&third), storage);
        assert!(!worker.shared.settled(b).1);
        assert!(worker.shared.settled(a).1);
        // Its end is accounted once, whichever way it goes.
        drop(third);
        assert!(worker.shared.settled(b).1);
        let pending_after = worker.shared.stripe(b).pending.load(Ordering::SeqCst);
        assert_eq!(pending_after, 0);
    }
}
