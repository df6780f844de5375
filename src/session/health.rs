//! The health view the planner goes by, taken once per turn and per
//! topology: the one place the request path reads the servers' live health
//! atomics and, where reads are balanced (`read_balance`, hot keys), this
//! worker's requests in flight to each server. Without replicas no plan
//! consults health, and nothing is read.

use std::rc::Rc;
use std::sync::{Arc, Weak};

use crate::backend::health::HealthState;
use crate::config::ReadBalanceMode;
use crate::plan::placement::{HealthView, HotKeys};
use crate::pools::topology::Topology;

use super::shard::WorkerCtx;

/// A session's view, with the turn and topology it was taken for.
#[derive(Debug, Default)]
pub(super) struct TurnHealth {
    turn: u64,
    /// Held weakly: an old topology is not kept alive for its view, and its
    /// address cannot be reused by a new one while this is held.
    topology: Weak<Topology>,
    view: HealthView,
    /// The view of a topology without replicas: never consulted.
    unused: HealthView,
}

impl TurnHealth {
    /// The view of `topology`'s servers in turn `turn`, taken now unless
    /// this turn already took it; `worker` tells the loads.
    pub(super) fn of(
        &mut self,
        topology: &Arc<Topology>,
        turn: u64,
        worker: &WorkerCtx,
    ) -> &HealthView {
        if topology.config.replicas <= 1 {
            return &self.unused;
        }
        let taken =
            self.turn == turn && std::ptr::eq(self.topology.as_ptr(), Arc::as_ptr(topology));
        if !taken {
            self.view.refill(
                topology
                    .backends
                    .iter()
                    .enumerate()
                    .filter(|(_, backend)| backend.state() == HealthState::Dead)
                    .map(|(server, _)| server),
            );
            // Loads are read only where some read is balanced by them.
            let hot = worker.hot.any_hot();
            if hot || topology.config.read_balance.mode == ReadBalanceMode::LeastLoaded {
                let hot: Option<Rc<dyn HotKeys>> = hot.then(|| worker.hot.clone() as _);
                self.view.balance(
                    topology
                        .backends
                        .iter()
                        .map(|backend| worker.in_flight(backend)),
                    hot,
                    worker.stats.read_balance_moved.clone(),
                );
            }
            self.turn = turn;
            self.topology = Arc::downgrade(topology);
        }
        &self.view
    }
}
