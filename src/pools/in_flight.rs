//! The requests in flight on one topology, so that the control plane can
//! tell when every request planned on a topology it replaced has finished
//! (the fleet's staged change waits for that: `control/fleet.rs`).
//!
//! A request holds its topology as a [`Planned`]: counted in flight on it
//! from the moment it is planned until its work is dropped. The count is
//! kept in one cache line per thread (a worker counts on its own line, the
//! control plane only reads them), so counting adds no cache line shared
//! hot between cores to the request path.
//!
//! A topology loaded from its pool is counted, then checked not to have
//! been replaced meanwhile ([`Planned::checked`]): the publisher marks the
//! one it replaces as retired before it reads the counts, so a request
//! either shows in the count the control plane reads or is planned on the
//! new topology, never neither.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::topology::Topology;

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
    fn enter(&self) -> u8 {
        let shard = my_shard();
        self.shards[shard].0.fetch_add(1, Ordering::Relaxed);
        shard as u8
    }

    fn leave(&self, shard: u8) {
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

    fn retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("count", &self.count())
            .field("retired", &self.retired())
            .finish()
    }
}

/// A topology a request was planned on, counted in flight on it while this
/// lives. Derefs to the topology.
pub(crate) struct Planned {
    topology: Arc<Topology>,
    shard: u8,
}

impl Planned {
    /// `topology`, counted. For a topology just loaded from its pool, use
    /// [`Planned::checked`], which also sees a replacement.
    pub(crate) fn on(topology: Arc<Topology>) -> Planned {
        let shard = topology.in_flight.enter();
        Planned { topology, shard }
    }

    /// `topology`, just loaded from its pool, counted; when it was
    /// replaced before it was counted, its pool's topology now (`now`)
    /// instead (a few times at most: a storm of publishes cannot hold a
    /// request up).
    pub(crate) fn checked(
        topology: Arc<Topology>,
        mut now: impl FnMut(&Arc<Topology>) -> Arc<Topology>,
    ) -> Planned {
        let mut planned = Planned::on(topology);
        for _ in 0..4 {
            fence(Ordering::SeqCst);
            if !planned.topology.in_flight.retired() {
                break;
            }
            planned = Planned::on(now(&planned.topology));
        }
        planned
    }

    /// The same topology, counted once more (another request on it).
    pub(crate) fn again(&self) -> Planned {
        Planned::on(self.topology.clone())
    }
}

impl std::ops::Deref for Planned {
    type Target = Arc<Topology>;

    fn deref(&self) -> &Arc<Topology> {
        &self.topology
    }
}

impl Drop for Planned {
    fn drop(&mut self) {
        self.topology.in_flight.leave(self.shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology() -> Arc<Topology> {
        let text = "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"127.0.0.1:1\"\n";
        let config = crate::config::Config::parse(text, "t.toml").expect("a config");
        Arc::new(Topology::assemble(
            Arc::new(config),
            1,
            Box::new([]),
            Vec::new(),
        ))
    }

    #[test]
    fn a_request_counts_until_its_topology_is_dropped() {
        let t = topology();
        let a = Planned::on(t.clone());
        let b = a.again();
        assert_eq!(t.in_flight.count(), 2);
        drop(a);
        assert_eq!(t.in_flight.count(), 1);
        // Counted on other threads too.
        let c = std::thread::spawn({
            let t = t.clone();
            move || {
                let c = Planned::on(t);
                std::mem::forget(c.again());
                c.topology.in_flight.count()
            }
        })
        .join()
        .expect("the thread");
        assert_eq!(c, 3, "b, the thread's and the one it forgot");
        assert_eq!(t.in_flight.count(), 2, "the thread's is over");
        drop(b);
        assert_eq!(t.in_flight.count(), 1);
    }

    #[test]
    fn a_topology_found_retired_once_counted_is_loaded_again() {
        let (old, new) = (topology(), topology());
        old.in_flight.retire();
        let planned = Planned::checked(old.clone(), |_| new.clone());
        assert!(Arc::ptr_eq(&planned, &new));
        assert_eq!((old.in_flight.count(), new.in_flight.count()), (0, 1));
    }
}
