//! The shadow pool's decisions: which keys are sampled (by a key hash of its
//! own, independent of every ring's, so the same keys every time), how the
//! primary's and the shadow's answers to one get compare, and the bound on
//! one worker's shadow requests in flight. The session sends; this module
//! decides and counts. No I/O, no clock.
//!
//! A shadow request's reply is seen by a [`ShadowReply`] watch on its slot
//! and by nobody else: no client waits for it, and it never reaches the
//! primary's servers or their health.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::slot::{Got, Watch};
use crate::error::BackendError;
use crate::protocol::outcome::{Outcome, Reply};
use crate::stats::ShadowCounters;

/// Seed of the sampling hash: any fixed value other than the rings' seeds,
/// so that the sampled keys are not one ring segment.
const SAMPLE_SEED: u64 = 0x5348_4144_4f57_2d31;
/// Seed of the value digest compared between the two pools.
const DIGEST_SEED: u64 = 0x5641_4c55_452d_3031;
/// Shadow requests one worker keeps in flight at most; past it copies are
/// shed (and counted), so a shadow that falls behind holds bounded memory.
pub(crate) const MAX_IN_FLIGHT: usize = 4096;
/// Request bytes of one worker's shadow requests in flight at most.
pub(crate) const MAX_IN_FLIGHT_BYTES: usize = 8 * 1024 * 1024;

/// Which keys a pool shares with its shadow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sampler {
    fraction: f64,
    /// A key is sampled when its hash is below this; `None`: every key.
    below: Option<u64>,
}

impl Sampler {
    /// Samples `fraction` (0.0..=1.0) of the keys.
    pub(crate) fn new(fraction: f64) -> Sampler {
        let below = if fraction >= 1.0 {
            None
        } else {
            // Exact enough: a share of 2^64 rounded to the nearest f64.
            Some((fraction.max(0.0) * 18_446_744_073_709_551_616.0) as u64)
        };
        Sampler { fraction, below }
    }

    /// The share of keys sampled.
    pub(crate) fn fraction(&self) -> f64 {
        self.fraction
    }

    /// Whether `key` (the routing key: a `b` key decoded) goes to the shadow.
    #[inline]
    pub(crate) fn sampled(&self, key: &[u8]) -> bool {
        match self.below {
            None => true,
            Some(below) => twox_hash::XxHash3_64::oneshot_with_seed(SAMPLE_SEED, key) < below,
        }
    }
}

/// One side's answer to a sampled get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Miss,
    /// A hit, with the digest of the value when the reply carried it (a
    /// meta get without `v` says only that the key is there).
    Hit(Option<u64>),
    /// No answer (the server failed or timed out) or an error line.
    Failed,
}

/// How two answers compare: an index into [`crate::stats::SHADOW_PAIRINGS`]
/// (`hit_hit`, `mismatch`, `hit_miss`, `miss_hit`, `miss_miss`), or `None`
/// when either side failed (nothing to compare).
pub(crate) fn compare(primary: Side, shadow: Side) -> Option<usize> {
    Some(match (primary, shadow) {
        (Side::Failed, _) | (_, Side::Failed) => return None,
        (Side::Hit(Some(a)), Side::Hit(Some(b))) if a != b => 1,
        (Side::Hit(_), Side::Hit(_)) => 0,
        (Side::Hit(_), Side::Miss) => 2,
        (Side::Miss, Side::Hit(_)) => 3,
        (Side::Miss, Side::Miss) => 4,
    })
}

/// The digest of the data of a `VALUE <key> <flags> <bytes> [<cas>]` block
/// or a `VA <size> <flags>*` reply: the bytes between the first line and
/// the closing `\r\n`. The flags and cas are left out: a meta get shows
/// them only when asked, and cas numbers are per server.
pub(crate) fn value_digest(block: &[u8]) -> Option<u64> {
    let line_end = memchr::memchr(b'\n', block)?;
    let data = block.get(line_end + 1..)?;
    let data = data.strip_suffix(b"\r\n").unwrap_or(data);
    Some(twox_hash::XxHash3_64::oneshot_with_seed(DIGEST_SEED, data))
}

/// A meta get's reply as one side of a pair: `EN` (or nothing, when `q`
/// left the miss out) a miss, `VA` a hit with its value, `HD` a hit.
pub(crate) fn meta_side(reply: &Reply) -> Side {
    match reply.outcome {
        Outcome::Nothing | Outcome::En => Side::Miss,
        Outcome::Va => Side::Hit(value_digest(reply)),
        Outcome::Hd => Side::Hit(None),
        _ => Side::Failed,
    }
}

/// The two answers to one sampled get, counted once both are in. Shared by
/// the client's entry (the primary's answer) and the shadow's reply watch.
#[derive(Debug)]
pub(crate) struct Pair {
    counters: Arc<ShadowCounters>,
    primary: Cell<Option<Side>>,
    shadow: Cell<Option<Side>>,
    /// Counted already: a side that comes again is ignored.
    settled: Cell<bool>,
}

impl Pair {
    pub(crate) fn new(counters: Arc<ShadowCounters>) -> Rc<Pair> {
        Rc::new(Pair {
            counters,
            primary: Cell::new(None),
            shadow: Cell::new(None),
            settled: Cell::new(false),
        })
    }

    /// The primary's answer, as the client got it.
    pub(crate) fn primary(&self, side: Side) {
        self.primary.set(Some(side));
        self.settle();
    }

    /// The shadow's answer.
    pub(crate) fn shadow(&self, side: Side) {
        if side == Side::Failed && !self.settled.get() {
            self.counters.failed();
        }
        self.shadow.set(Some(side));
        self.settle();
    }

    fn settle(&self) {
        if self.settled.get() {
            return;
        }
        if let (Some(primary), Some(shadow)) = (self.primary.get(), self.shadow.get()) {
            self.settled.set(true);
            if let Some(pairing) = compare(primary, shadow) {
                self.counters.pair(pairing);
            }
        }
    }
}

/// One worker's shadow requests in flight, bounded by [`MAX_IN_FLIGHT`]
/// and [`MAX_IN_FLIGHT_BYTES`].
#[derive(Debug)]
pub(crate) struct InFlight {
    requests: Cell<usize>,
    bytes: Cell<usize>,
    /// The owner of every shadow slot: nobody waits on it.
    nobody: Rc<crate::runtime::wake::Wake>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            requests: Cell::new(0),
            bytes: Cell::new(0),
            nobody: Rc::new(crate::runtime::wake::Wake::new()),
        }
    }
}

impl InFlight {
    /// A place for a shadow request of `bytes`, or `None` (shed it) when the
    /// worker has too many in flight.
    pub(crate) fn admit(self: &Rc<Self>, bytes: usize) -> Option<Ticket> {
        let requests = self.requests.get();
        let held = self.bytes.get();
        if requests >= MAX_IN_FLIGHT || (requests > 0 && held + bytes > MAX_IN_FLIGHT_BYTES) {
            return None;
        }
        self.requests.set(requests + 1);
        self.bytes.set(held + bytes);
        Some(Ticket {
            in_flight: self.clone(),
            bytes,
        })
    }

    /// Shadow requests in flight now.
    #[cfg(test)]
    pub(crate) fn requests(&self) -> usize {
        self.requests.get()
    }

    /// What shadow slots wake: nothing listens.
    pub(crate) fn nobody(&self) -> Rc<crate::runtime::wake::Wake> {
        self.nobody.clone()
    }
}

/// A shadow request's place in [`InFlight`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    in_flight: Rc<InFlight>,
    bytes: usize,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let f = &self.in_flight;
        f.requests.set(f.requests.get().saturating_sub(1));
        f.bytes.set(f.bytes.get().saturating_sub(self.bytes));
    }
}

/// Sees one shadow request's reply: a get's answer goes to its pair, a
/// write's failure is counted. Holds the request's ticket until the reply is
/// in (or failed), when the slot lets go of it.
#[derive(Debug)]
pub(crate) struct ShadowReply {
    counters: Arc<ShadowCounters>,
    pair: Option<Rc<Pair>>,
    last: std::cell::RefCell<Option<Bytes>>,
    _ticket: Ticket,
}

impl ShadowReply {
    /// The watch of a shadow write (`pair: None`) or get.
    pub(crate) fn new(
        counters: Arc<ShadowCounters>,
        pair: Option<Rc<Pair>>,
        ticket: Ticket,
    ) -> ShadowReply {
        ShadowReply {
            counters,
            pair,
            last: std::cell::RefCell::new(None),
            _ticket: ticket,
        }
    }
}

impl Watch for ShadowReply {
    fn piece(&self, piece: &Got) {
        let (Got::Line(reply) | Got::Value(reply)) = piece;
        *self.last.borrow_mut() = Some(reply.clone());
    }

    fn done(&self, result: &Result<Outcome, BackendError>) {
        let reply = self.last.take().unwrap_or_default();
        match &self.pair {
            Some(pair) => pair.shadow(match result {
                Ok(said) => meta_side(&Reply::new(*said, reply)),
                Err(_) => Side::Failed,
            }),
            None if result.as_ref().map_or(true, |said| said.is_error()) => {
                self.counters.failed();
                self.counters.lost_write();
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_keys_are_sampled_every_time_and_about_the_fraction() {
        let sampler = Sampler::new(0.1);
        let keys: Vec<String> = (0..20_000).map(|i| format!("key:{i}")).collect();
        let first: Vec<bool> = keys.iter().map(|k| sampler.sampled(k.as_bytes())).collect();
        let again: Vec<bool> = keys
            .iter()
            .map(|k| Sampler::new(0.1).sampled(k.as_bytes()))
            .collect();
        assert_eq!(first, again);
        let share = first.iter().filter(|&&s| s).count() as f64 / keys.len() as f64;
        assert!((0.09..0.11).contains(&share), "{share}");
        assert!(keys.iter().all(|k| Sampler::new(1.0).sampled(k.as_bytes())));
        assert!(!keys.iter().any(|k| Sampler::new(0.0).sampled(k.as_bytes())));
        // A larger fraction keeps the keys a smaller one took.
        let wider = Sampler::new(0.5);
        assert!(keys
            .iter()
            .zip(&first)
            .all(|(k, &s)| !s || wider.sampled(k.as_bytes())));
    }

    #[test]
    fn the_sampling_hash_is_pinned() {
        // A change of the seed or the hash would change which keys an
        // operator's shadow grades: this must fail first.
        let sampler = Sampler::new(0.5);
        let picked: Vec<bool> = ["a", "b", "c", "user:1", "user:2", "sess:9"]
            .iter()
            .map(|k| sampler.sampled(k.as_bytes()))
            .collect();
        assert_eq!(picked, PINNED);
    }

    const PINNED: [bool; 6] = [false, false, true, true, false, true];

    #[test]
    fn pairs_compare_as_the_table_says() {
        let hit = |d| Side::Hit(Some(d));
        assert_eq!(compare(hit(1), hit(1)), Some(0));
        assert_eq!(compare(hit(1), hit(2)), Some(1));
        assert_eq!(
            compare(Side::Hit(None), hit(2)),
            Some(0),
            "no value to compare"
        );
        assert_eq!(compare(hit(1), Side::Miss), Some(2));
        assert_eq!(compare(Side::Miss, hit(1)), Some(3));
        assert_eq!(compare(Side::Miss, Side::Miss), Some(4));
        assert_eq!(compare(Side::Failed, hit(1)), None);
        assert_eq!(compare(hit(1), Side::Failed), None);
    }

    #[test]
    fn classic_and_meta_values_digest_alike() {
        let classic = value_digest(b"VALUE k 5 3 99\r\nabc\r\n");
        let meta = value_digest(b"VA 3 f5\r\nabc\r\n");
        assert_eq!(classic, meta);
        assert_ne!(classic, value_digest(b"VA 3\r\nabd\r\n"));
        assert_eq!(meta_side(&Reply::from_static(b"EN\r\n")), Side::Miss);
        assert_eq!(meta_side(&Reply::from_static(b"")), Side::Miss);
        assert_eq!(meta_side(&Reply::from_static(b"HD\r\n")), Side::Hit(None));
        assert_eq!(
            meta_side(&Reply::from_static(b"VA 3\r\nabc\r\n")),
            Side::Hit(classic)
        );
        assert_eq!(
            meta_side(&Reply::from_static(b"SERVER_ERROR out of memory\r\n")),
            Side::Failed
        );
    }

    fn counters() -> (crate::stats::Stats, Arc<ShadowCounters>) {
        let stats = crate::stats::Stats::new();
        let counters = Arc::new(stats.shadow_counters("main", "candidate"));
        (stats, counters)
    }

    #[test]
    fn a_pair_counts_once_whichever_side_comes_first() {
        let (_stats, counters) = counters();
        let pair = Pair::new(counters.clone());
        pair.shadow(Side::Miss);
        assert_eq!(counters.figures().compared(), 0);
        pair.primary(Side::Hit(Some(7)));
        pair.primary(Side::Hit(Some(7)));
        let other = Pair::new(counters.clone());
        other.primary(Side::Hit(Some(7)));
        other.shadow(Side::Hit(Some(8)));
        let failed = Pair::new(counters.clone());
        failed.primary(Side::Miss);
        failed.shadow(Side::Failed);
        let figures = counters.figures();
        assert_eq!(figures.pairs, [0, 1, 1, 0, 0]);
        assert_eq!((figures.primary_hits(), figures.shadow_hits()), (2, 1));
        assert_eq!(figures.failed, 1);
    }

    #[test]
    fn in_flight_is_bounded_and_given_back() {
        let in_flight = Rc::new(InFlight::default());
        let tickets: Vec<Ticket> = (0..MAX_IN_FLIGHT)
            .map(|_| in_flight.admit(10).expect("room"))
            .collect();
        assert!(in_flight.admit(10).is_none(), "full: shed");
        drop(tickets);
        assert_eq!(in_flight.requests(), 0);
        let big = in_flight.admit(MAX_IN_FLIGHT_BYTES * 2);
        assert!(big.is_some(), "one request always fits");
        assert!(in_flight.admit(1).is_none(), "no bytes left");
        drop(big);
        assert!(in_flight.admit(1).is_some());
    }

    #[test]
    fn a_watch_gives_the_shadow_side_and_its_ticket_back() {
        let (_stats, counters) = counters();
        let in_flight = Rc::new(InFlight::default());
        let pair = Pair::new(counters.clone());
        pair.primary(Side::Miss);
        let slot = crate::backend::slot::Slot::new(in_flight.nobody());
        let ticket = in_flight.admit(20).unwrap();
        slot.watch(Rc::new(ShadowReply::new(
            counters.clone(),
            Some(pair),
            ticket,
        )));
        assert_eq!(in_flight.requests(), 1);
        slot.push(Got::Line(Bytes::from_static(b"VA 1\r\nx\r\n")));
        slot.finish(Ok(Outcome::Va));
        assert_eq!(in_flight.requests(), 0);
        assert_eq!(counters.figures().pairs, [0, 0, 0, 1, 0]);
        let write = crate::backend::slot::Slot::new(in_flight.nobody());
        let ticket = in_flight.admit(20).unwrap();
        write.watch(Rc::new(ShadowReply::new(counters.clone(), None, ticket)));
        write.push(Got::Line(Bytes::from_static(
            b"SERVER_ERROR out of memory\r\n",
        )));
        write.finish(Ok(Outcome::ServerError));
        assert_eq!(counters.figures().failed, 1);
    }
}
