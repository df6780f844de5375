//! The requests in flight on one topology, so that the control plane can
//! tell when every request planned on a topology it replaced has finished
//! (the fleet's staged change waits for that: `control/fleet.rs`).
//!
//! A request holds its topology as a `Planned` (`pools/planned.rs`): counted in flight on it
//! from the moment it is planned until its work is dropped. The count is
//! kept in one cache line per thread (a worker counts on its own line, the
//! control plane only reads them), so counting adds no cache line shared
//! hot between cores to the request path.
//!
//! Only a topology a staged change can wait on is counted (etcd with the
//! fleet gate on: `fleet_switch_ms > 0`, read only at start); elsewhere
//! (a file, DNS, or etcd without gating) no gate ever reads the count, and
//! a request pays nothing for it: [`InFlight::counted`] is false.
//!
//! A topology loaded from its pool is counted, then checked not to have
//! been replaced meanwhile (`Planned::checked`): the publisher marks the
//! one it replaces as retired before it reads the counts, so a request
//! either shows in the count the control plane reads or is planned on the
//! new topology, never neither.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

/// Lines per topology; threads beyond this share one (still counted).
const SHARDS: usize = 16;

/// One thread's count, alone on its cache line.
#[repr(align(128))]
#[derive(Default)]
struct Shard(AtomicUsize);

/// A topology's count of requests planned on it and not finished.
#[derive(Default)]
pub(crate) struct InFlight {
    shards: [Shard; SHARDS],
    /// A newer topology of the pool replaced this one.
    retired: AtomicBool,
    /// Whether requests are counted at all (a fleet gate reads the count).
    counted: bool,
}

thread_local! {
    /// This thread's shard, given out in turn.
    static SHARD: Cell<Option<u8>> = const { Cell::new(None) };
}

fn my_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    SHARD.with(|shard| match shard.get() {
        Some(n) => n as usize,
        None => {
            let n = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            shard.set(Some(n as u8));
            n
        }
    })
}

impl InFlight {
    /// A count that requests keep when `counted` (a fleet gate reads it),
    /// and that stays 0 otherwise.
    pub(crate) fn new(counted: bool) -> InFlight {
        InFlight {
            counted,
            ..InFlight::default()
        }
    }

    /// Whether requests on this topology count themselves in flight.
    #[inline]
    pub(super) fn counted(&self) -> bool {
        self.counted
    }

    pub(super) fn enter(&self) -> u8 {
        let shard = my_shard();
        self.shards[shard].0.fetch_add(1, Ordering::Relaxed);
        shard as u8
    }

    pub(super) fn leave(&self, shard: u8) {
        self.shards[shard as usize]
            .0
            .fetch_sub(1, Ordering::Release);
    }

    /// The requests planned on this topology and not finished. Read after
    /// [`InFlight::retire`], 0 means none is left and none comes.
    pub(crate) fn count(&self) -> usize {
        fence(Ordering::SeqCst);
        self.shards
            .iter()
            .map(|s| s.0.load(Ordering::Acquire))
            .fold(0, usize::wrapping_add)
    }

    /// A newer topology of the pool is stored: from now on a request that
    /// loaded this one plans on the newer one instead (see
    /// [`Planned::checked`]).
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    pub(super) fn retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("count", &self.count())
            .field("retired", &self.retired())
            .field("counted", &self.counted)
            .finish()
    }
}
