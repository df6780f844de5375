//! A client's exchange with the servers: what dispatching its entries sends
//! (`dispatch.rs`), how their replies become its answers (`finish.rs`), and
//! its shadow pool's copies (`shadow.rs`), with what all of them share: the
//! connection lane, the wake-up its reply slots ring, the reply bytes it is
//! owed and its write queue. The client session (`client.rs`) owns one
//! beside its FIFO and hands it one entry at a time, so neither borrows the
//! other.

use super::*;
use crate::pools::planned::Planned;

/// First buffer for the sub-request lines a session builds: allocated at its
/// first multi-key get that goes to several servers.
const SUB_LINES_BYTES: usize = 1024;

pub(super) struct Exchange {
    /// Which connection of each server this client uses: always the same
    /// one, so its commands reach each server in the order sent.
    pub(super) lane: usize,
    pub(super) worker: Rc<WorkerCtx>,
    /// Woken by every reply slot of this client.
    pub(super) wake: Rc<Wake>,
    /// The client's answers, in order, not yet written to its socket.
    pub(super) out: OutQueue,
    /// Where sub-request lines of multi-key gets that go to several servers
    /// are built (see `Retrieval::next_chunk`).
    pub(super) lines: RecycledBuf,
    /// Reply bytes reserved for requests in flight, held for entries not
    /// yet at the head and queued to write.
    pub(super) budget: ClientBudget,
    /// Assumed reply size of one key not yet answered: starts at the largest
    /// value allowed and follows what this client's gets return.
    pub(super) estimate: usize,
    /// What this client's requests are parsed within (the default pool's,
    /// taken afresh at each parse); the largest value they allow bounds
    /// what the client may be owed ([`Exchange::client_limit`]).
    pub(super) limits: Limits,
    /// `noreply` requests written to servers and not yet answered, with the
    /// bytes reserved for them: without this, a client could queue writes
    /// on a server connection faster than the server takes them. Each slot
    /// with its server, and the topology the request was planned on where
    /// it counts requests in flight: counted until then (a fleet's staged
    /// change waits for such writes too: `control/fleet.rs`).
    pub(super) unanswered: Vec<(ServerSlots, Reservation, Option<Planned>)>,
    /// This client's read-through copies still replacing their leases.
    pub(super) copies: Rc<CopiesUnderWay>,
}

impl Exchange {
    pub(super) fn new(lane: usize, worker: Rc<WorkerCtx>, limits: Limits) -> Exchange {
        let budget = ClientBudget::new(worker.budget.clone());
        let wake = Rc::new(Wake::new());
        Exchange {
            lane,
            worker,
            copies: CopiesUnderWay::new(wake.clone()),
            wake,
            out: OutQueue::default(),
            lines: RecycledBuf::new(SUB_LINES_BYTES),
            budget,
            estimate: limits.max_value_bytes,
            limits,
            unanswered: Vec::new(),
        }
    }

    /// The most reply bytes this client may be owed.
    pub(super) fn client_limit(&self) -> usize {
        self.worker
            .settings
            .client_buffer_bytes
            .unwrap_or(self.limits.max_value_bytes + crate::config::CLIENT_BUFFER_HEADROOM_BYTES)
    }

    /// Reserves an entry's `cost` the first time it is dispatched (nothing
    /// taken yet); false while the budget has no room for it.
    pub(super) fn reserve_once(
        &self,
        reserved: &mut Reservation,
        cost: impl FnOnce() -> usize,
    ) -> bool {
        if !reserved.is_taken() {
            match self
                .budget
                .try_reserve(self.client_limit(), self.out.len(), cost())
            {
                Some(taken) => *reserved = taken,
                None => return false,
            }
        }
        true
    }

    /// Releases the bytes of `noreply` requests every server has answered
    /// (their reservations drop with them).
    pub(super) fn settle(&mut self) {
        let mut i = 0;
        while i < self.unanswered.len() {
            let (slots, ..) = &self.unanswered[i];
            if slots.iter().all(|(_, slot)| slot.outcome().is_some()) {
                let (slots, _released, _planned) = self.unanswered.remove(i);
                slots
                    .into_iter()
                    .for_each(|(_, slot)| spares::keep_slot(slot));
            } else {
                i += 1;
            }
        }
    }
}
