//! A topology a request was planned on, counted in flight on it (see
//! `pools/in_flight.rs`) for as long as the request's work lives; a send
//! that wants no reply until its server answered ([`UntilAnswered`]); and
//! a worker's own handles on the topologies in force ([`HeldTopologies`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use super::topology::{SharedTopology, Topology};
use crate::backend::slot::Watch;

/// A worker's handle on a topology: its own count (an `Rc`) over the one
/// every worker shares (the `Arc`), so that taking and dropping it per
/// request writes nothing another core writes too.
#[allow(clippy::redundant_allocation)] // the second count is the point
pub(crate) type Handle = Rc<Arc<Topology>>;

/// A topology a request was planned on, counted in flight on it while this
/// lives (when the topology counts: `InFlight::counted`). Derefs to the
/// topology.
///
/// It holds the topology through its worker's handle (an `Rc` over the
/// shared `Arc`, see [`HeldTopologies`]): a request taking and dropping it
/// counts on its own core, where an `Arc` reference would be two atomic
/// writes to a count every worker writes.
pub(crate) struct Planned {
    topology: Handle,
    /// The shard counted on; [`UNCOUNTED`] when the topology counts nothing.
    shard: u8,
}

/// The shard of a `Planned` that was not counted.
const UNCOUNTED: u8 = u8::MAX;

impl Planned {
    /// `topology`, counted, through a handle of its own (one allocation:
    /// for work outside a worker's request path). A request takes its
    /// worker's handle, with [`Planned::checked`], which also sees a
    /// replacement.
    pub(crate) fn on(topology: Arc<Topology>) -> Planned {
        Planned::held(Rc::new(topology))
    }

    /// The topology behind `topology`, a worker's handle, counted.
    #[inline]
    fn held(topology: Handle) -> Planned {
        let shard = if topology.in_flight.counted() {
            topology.in_flight.enter()
        } else {
            UNCOUNTED
        };
        Planned { topology, shard }
    }

    /// `topology`, just loaded from its pool, counted; when it was
    /// replaced before it was counted, its pool's topology now (`now`)
    /// instead (a few times at most: a storm of publishes cannot hold a
    /// request up).
    pub(crate) fn checked(
        topology: Handle,
        mut now: impl FnMut(&Arc<Topology>) -> Handle,
    ) -> Planned {
        let mut planned = Planned::held(topology);
        if planned.shard == UNCOUNTED {
            // No gate waits on this topology: which one the request plans
            // on is as it was before counting.
            return planned;
        }
        for _ in 0..4 {
            fence(Ordering::SeqCst);
            if !planned.topology.in_flight.retired() {
                break;
            }
            planned = Planned::held(now(&planned.topology));
        }
        planned
    }

    /// The same topology, counted once more (another request on it).
    pub(crate) fn again(&self) -> Planned {
        Planned::held(self.topology.clone())
    }

    /// [`Planned::again`] where the topology counts; `None`, and no
    /// reference taken, where it does not (work left behind that only a
    /// fleet gate needs to know of).
    pub(crate) fn again_if_counted(&self) -> Option<Planned> {
        (self.shard != UNCOUNTED).then(|| self.again())
    }
}

/// A send that wants no reply (a replicated `cas`'s copy, a hand-off
/// lease's `md` removal), counted in flight on the topology it was planned
/// on until its server answered: it watches the send's reply slot, which
/// lets go of it once the reply is in or has failed (or is dropped with
/// its connection).
pub(crate) struct UntilAnswered {
    _counted: Planned,
}

impl UntilAnswered {
    /// A watcher that counts a send on `topology` until it is answered;
    /// `None`, and nothing to wait for, where the topology counts nothing.
    pub(crate) fn on(topology: &Arc<Topology>) -> Option<std::rc::Rc<dyn Watch>> {
        if !topology.in_flight.counted() {
            return None;
        }
        let counted = Planned::on(topology.clone());
        Some(std::rc::Rc::new(UntilAnswered { _counted: counted }))
    }
}

impl Watch for UntilAnswered {}

impl std::fmt::Debug for UntilAnswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UntilAnswered")
    }
}

/// A worker's handles on the topology in force of each pool its requests
/// were planned on: a request clones the handle (an `Rc`), not the shared
/// `Arc`. A handle is replaced the first time a request finds its pool's
/// topology replaced, and let go of after each publish
/// ([`HeldTopologies::forget_replaced`]), so a worker keeps no ring alive
/// that a reload replaced for longer than its requests need it.
#[derive(Default)]
pub(crate) struct HeldTopologies {
    held: RefCell<SmallVec<[Held; 4]>>,
}

/// A worker's handle on one pool's topology.
struct Held {
    pool: SharedTopology,
    /// The pool's topology as last seen: sees a publish with one atomic
    /// load, where a load from the pool takes and gives back a guard.
    seen: arc_swap::Cache<SharedTopology, Arc<Topology>>,
    /// The handle requests take, on the topology `seen` holds.
    handle: Handle,
}

impl HeldTopologies {
    /// A handle on `pool`'s topology now.
    #[inline]
    pub(crate) fn now(&self, pool: &SharedTopology) -> Handle {
        let mut held = self.held.borrow_mut();
        match held.iter_mut().find(|held| Arc::ptr_eq(&held.pool, pool)) {
            Some(held) => {
                let current = held.seen.load();
                if !Arc::ptr_eq(&held.handle, current) {
                    held.handle = Rc::new(current.clone());
                }
                held.handle.clone()
            }
            None => {
                let mut seen = arc_swap::Cache::new(pool.clone());
                let handle = Rc::new(seen.load().clone());
                held.push(Held {
                    pool: pool.clone(),
                    seen,
                    handle: handle.clone(),
                });
                handle
            }
        }
    }

    /// After a publish: lets go of the handles on replaced topologies and
    /// of pools no one else holds any more (they left every layout, and
    /// no client of their own listener is left).
    pub(crate) fn forget_replaced(&self) {
        self.held.borrow_mut().retain(|held| {
            // `pool` and the one `seen` keeps are this worker's.
            Arc::strong_count(&held.pool) > 2 && Arc::ptr_eq(&held.handle, held.seen.load())
        });
    }

    /// How many pools it holds a handle for.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.borrow().len()
    }
}

impl std::ops::Deref for Planned {
    type Target = Arc<Topology>;

    fn deref(&self) -> &Arc<Topology> {
        &self.topology
    }
}

impl Drop for Planned {
    #[inline]
    fn drop(&mut self) {
        if self.shard != UNCOUNTED {
            self.topology.in_flight.leave(self.shard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The servers of a file, and (`etcd`) a membership from etcd with
    /// these `[discovery]` lines.
    fn topology_of(etcd: Option<&str>) -> Arc<Topology> {
        let mut text =
            "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"127.0.0.1:1\"\n".to_string();
        if let Some(lines) = etcd {
            text += "[discovery]\netcd_endpoints = [\"127.0.0.1:2379\"]\netcd_prefix = \"/t/\"\n";
            text += lines;
        }
        let config = crate::config::Config::parse(&text, "t.toml").expect("a config");
        Arc::new(Topology::assemble(
            Arc::new(config),
            1,
            Box::new([]),
            Vec::new(),
        ))
    }

    /// A topology a fleet gate waits on: etcd, gating on (the default).
    fn topology() -> Arc<Topology> {
        topology_of(Some(""))
    }

    #[test]
    fn nothing_is_counted_where_no_fleet_gate_reads_the_count() {
        for (what, t) in [
            ("a file", topology_of(None)),
            (
                "etcd, gating off",
                topology_of(Some("fleet_switch_ms = 0\n")),
            ),
        ] {
            let a = Planned::on(t.clone());
            let b = a.again();
            assert!(a.again_if_counted().is_none(), "{what}");
            assert_eq!(t.in_flight.count(), 0, "{what}");
            // A replaced topology is planned on as it was before counting.
            t.in_flight.retire();
            let other = topology_of(None);
            let c = Planned::checked(Rc::new(t.clone()), |_| Rc::new(other.clone()));
            assert!(Arc::ptr_eq(&c, &t), "{what}");
            drop((a, b, c));
            assert_eq!(t.in_flight.count(), 0, "{what}");
        }
        let gated = topology();
        let a = Planned::on(gated.clone());
        assert_eq!(gated.in_flight.count(), 1, "etcd with the fleet gate");
        let b = a.again_if_counted();
        assert_eq!(gated.in_flight.count(), 2, "and what it leaves behind");
        drop((a, b));
        assert_eq!(gated.in_flight.count(), 0);
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
    fn a_send_wanting_no_reply_counts_until_its_slot_lets_go_of_it() {
        assert!(UntilAnswered::on(&topology_of(None)).is_none(), "a file");
        let t = topology();
        let wake = std::rc::Rc::new(crate::runtime::wake::Wake::default());
        let slot = crate::backend::slot::Slot::new(wake);
        slot.watch(UntilAnswered::on(&t).expect("counted with the gate"));
        assert_eq!(t.in_flight.count(), 1, "unanswered");
        slot.finish(Ok(crate::protocol::outcome::Outcome::Stored));
        assert_eq!(t.in_flight.count(), 0, "answered");
        // A slot dropped unanswered (its connection went) lets go too.
        let wake = std::rc::Rc::new(crate::runtime::wake::Wake::default());
        let dropped = crate::backend::slot::Slot::new(wake);
        dropped.watch(UntilAnswered::on(&t).expect("counted"));
        assert_eq!(t.in_flight.count(), 1);
        drop(dropped);
        assert_eq!(t.in_flight.count(), 0);
    }

    #[test]
    fn a_topology_found_retired_once_counted_is_loaded_again() {
        let (old, new) = (topology(), topology());
        old.in_flight.retire();
        let planned = Planned::checked(Rc::new(old.clone()), |_| Rc::new(new.clone()));
        assert!(Arc::ptr_eq(&planned, &new));
        assert_eq!((old.in_flight.count(), new.in_flight.count()), (0, 1));
    }

    #[test]
    fn a_worker_hands_out_its_handle_until_the_pool_is_replaced_or_gone() {
        let held = HeldTopologies::default();
        let (first, second) = (topology_of(None), topology_of(None));
        let pool: SharedTopology = Arc::new(arc_swap::ArcSwap::new(first.clone()));
        let other: SharedTopology = Arc::new(arc_swap::ArcSwap::new(topology_of(None)));
        let a = held.now(&pool);
        let b = held.now(&pool);
        assert!(Rc::ptr_eq(&a, &b), "one handle for the requests of a pool");
        assert!(Arc::ptr_eq(&a, &first));
        assert_eq!(
            Arc::strong_count(&first),
            4,
            "first, the pool's, the worker's cache's and its handle's"
        );
        assert!(!Rc::ptr_eq(&held.now(&other), &a), "each pool its own");
        assert_eq!(held.len(), 2);
        // A publish replaces the pool's topology: the next request sees it
        // at once, before the worker lets go of what it held.
        pool.store(second.clone());
        let c = held.now(&pool);
        assert!(Arc::ptr_eq(&c, &second), "never planned on a replaced one");
        assert!(
            Arc::ptr_eq(&a, &first),
            "a request planned before keeps its own"
        );
        drop((a, b));
        assert_eq!(
            Arc::strong_count(&first),
            1,
            "no one holds the replaced ring"
        );
        // Pool `other` leaves every layout; after the publish the worker
        // holds only the pools still in use, as they are now.
        drop(other);
        held.forget_replaced();
        assert_eq!(held.len(), 1);
        assert!(Rc::ptr_eq(&held.now(&pool), &c));
        pool.store(first.clone());
        held.forget_replaced();
        assert_eq!(held.len(), 0, "a replaced topology is not held");
        assert_eq!(Arc::strong_count(&second), 2, "second and c");
        assert_eq!(Arc::strong_count(&first), 2, "first and the pool's");
    }
}
