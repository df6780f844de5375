//! A topology a request was planned on, counted in flight on it (see
//! `pools/in_flight.rs`) for as long as the request's work lives.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::topology::Topology;

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
