//! The health view the planner goes by, taken once per turn and per
//! topology: the one place the request path reads the servers' live health
//! atomics. Without replicas no plan consults health, and nothing is read.

use std::sync::{Arc, Weak};

use crate::backend::health::HealthState;
use crate::plan::placement::HealthView;
use crate::pools::topology::Topology;

/// The view of a topology without replicas: never consulted.
static UNUSED: HealthView = HealthView::NONE;

/// A session's view, with the turn and topology it was taken for.
#[derive(Debug, Default)]
pub(super) struct TurnHealth {
    turn: u64,
    /// Held weakly: an old topology is not kept alive for its view, and its
    /// address cannot be reused by a new one while this is held.
    topology: Weak<Topology>,
    view: HealthView,
}

impl TurnHealth {
    /// The view of `topology`'s servers in turn `turn`, taken now unless
    /// this turn already took it.
    pub(super) fn of(&mut self, topology: &Arc<Topology>, turn: u64) -> &HealthView {
        if topology.config.replicas <= 1 {
            return &UNUSED;
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
            self.turn = turn;
            self.topology = Arc::downgrade(topology);
        }
        &self.view
    }
}
