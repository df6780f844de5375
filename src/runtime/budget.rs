//! The reply-byte budget: how many bytes of replies one client may be owed
//! (reserved for requests in flight, held for values not yet at the head,
//! waiting in its write queue), and the share of its worker's bound all of
//! the worker's clients draw on. Pure arithmetic, no I/O.
//!
//! Bytes are taken as a [`Reservation`], which gives them back to both the
//! client's and the worker's count when it is dropped. So whatever ends a
//! request (its reply written, a quiet reply settled, a server that failed,
//! the client gone) releases exactly what it reserved, and no path can
//! leave a client waiting on bytes nobody holds.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One worker's bound on the reply bytes its clients are owed.
#[derive(Debug)]
pub(crate) struct WorkerBudget {
    /// Written only by the worker's thread (a plain load and store, no
    /// read-modify-write); read by `stats` and `/metrics` from any thread.
    owed: Arc<AtomicUsize>,
    limit: usize,
}

impl WorkerBudget {
    /// A worker's budget of `limit` bytes (its share of `max_buffer_bytes`).
    pub(crate) fn new(limit: usize) -> WorkerBudget {
        WorkerBudget {
            owed: Arc::default(),
            limit,
        }
    }

    /// Bytes every client of the worker is owed now.
    pub(crate) fn owed(&self) -> usize {
        self.owed.load(Ordering::Relaxed)
    }

    /// The count [`owed`](Self::owed) reads, for the process's figures.
    pub(crate) fn published(&self) -> &Arc<AtomicUsize> {
        &self.owed
    }

    fn room(&self) -> usize {
        self.limit.saturating_sub(self.owed())
    }

    fn add(&self, bytes: usize) {
        self.owed.store(self.owed() + bytes, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        // Every byte subtracted was added by the same reservation or queue
        // count: going below zero would be a bookkeeping bug.
        debug_assert!(bytes <= self.owed(), "worker budget underflow");
        self.owed
            .store(self.owed().saturating_sub(bytes), Ordering::Relaxed);
    }
}

/// What one client's reservations hold, shared by them and the session.
#[derive(Debug)]
struct Held {
    /// Sum of the client's live reservations.
    owed: Cell<usize>,
    worker: Rc<WorkerBudget>,
}

impl Held {
    fn add(&self, bytes: usize) {
        self.owed.set(self.owed.get() + bytes);
        self.worker.add(bytes);
    }

    fn sub(&self, bytes: usize) {
        debug_assert!(bytes <= self.owed.get(), "client budget underflow");
        self.owed.set(self.owed.get().saturating_sub(bytes));
        self.worker.sub(bytes);
    }
}

/// One client's part of the budget. Dropping it (the session ends) takes
/// its write queue out of the worker's count; its reservations give their
/// bytes back as they are dropped.
#[derive(Debug)]
pub(crate) struct ClientBudget {
    held: Rc<Held>,
    /// Bytes of the client's write queue counted in the worker's `owed`.
    queued: usize,
}

impl ClientBudget {
    /// A client's budget, drawing on `worker`.
    pub(crate) fn new(worker: Rc<WorkerBudget>) -> ClientBudget {
        ClientBudget {
            held: Rc::new(Held {
                owed: Cell::new(0),
                worker,
            }),
            queued: 0,
        }
    }

    /// Bytes the client's live reservations hold (the write queue aside).
    pub(crate) fn owed(&self) -> usize {
        self.held.owed.get()
    }

    /// Nothing reserved, held or queued: such a client may always send one
    /// request, however large, so that every client progresses.
    pub(crate) fn nothing_owed(&self, queued: usize) -> bool {
        self.owed() == 0 && queued == 0
    }

    /// Bytes that may still be reserved with `queued` bytes in the write
    /// queue and a client bound of `limit`.
    pub(crate) fn room(&self, limit: usize, queued: usize) -> usize {
        limit
            .saturating_sub(self.owed() + queued)
            .min(self.held.worker.room())
    }

    /// `cost` bytes, if they fit the client's bound `limit` (with `queued`
    /// bytes in its write queue) and the worker's, or if the client is owed
    /// nothing at all.
    pub(crate) fn try_reserve(
        &self,
        limit: usize,
        queued: usize,
        cost: usize,
    ) -> Option<Reservation> {
        let worker = &self.held.worker;
        let fits = self.owed() + queued + cost <= limit && worker.owed() + cost <= worker.limit;
        (fits || self.nothing_owed(queued)).then(|| self.reserve(cost))
    }

    /// `cost` bytes whether or not they fit: for what the caller sized to
    /// the [`room`](Self::room) it asked for, and for value bytes already
    /// received, which are in memory whatever the bound says.
    pub(crate) fn reserve(&self, cost: usize) -> Reservation {
        self.held.add(cost);
        Reservation {
            held: Some(self.held.clone()),
            bytes: cost,
        }
    }

    /// Makes `reservation` hold exactly `bytes`, growing or giving back;
    /// one not taken yet is taken from this client once it holds bytes.
    pub(crate) fn resize(&self, reservation: &mut Reservation, bytes: usize) {
        match &reservation.held {
            Some(_) => reservation.resize(bytes),
            None if bytes > 0 => *reservation = self.reserve(bytes),
            None => {}
        }
    }

    /// Keeps the worker's count in step with the `queued` bytes waiting in
    /// the client's write queue: they are buffered replies too, and a
    /// client that does not read holds them for as long as it likes.
    pub(crate) fn count_queued(&mut self, queued: usize) {
        let worker = &self.held.worker;
        worker.add(queued);
        worker.sub(self.queued);
        self.queued = queued;
    }
}

impl Drop for ClientBudget {
    fn drop(&mut self) {
        self.held.worker.sub(self.queued);
    }
}

/// Reply bytes taken from one client's budget (and its worker's) for one
/// request, one sub-request or the values a retrieval holds. Given back
/// when dropped. The default holds nothing and belongs to no client.
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    held: Option<Rc<Held>>,
    bytes: usize,
}

impl Reservation {
    /// Whether it was ever taken from a client (a reservation of 0 bytes
    /// was).
    pub(crate) fn is_taken(&self) -> bool {
        self.held.is_some()
    }

    /// Bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` from now on (taking more or giving some back). Does
    /// nothing on a reservation not taken, so callers outside this module
    /// go through [`ClientBudget::resize`], which takes it first.
    fn resize(&mut self, bytes: usize) {
        if bytes == self.bytes {
            return;
        }
        if let Some(held) = &self.held {
            if bytes > self.bytes {
                held.add(bytes - self.bytes);
            } else {
                held.sub(self.bytes - bytes);
            }
            self.bytes = bytes;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.resize(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(limit: usize) -> Rc<WorkerBudget> {
        Rc::new(WorkerBudget::new(limit))
    }

    #[test]
    fn a_client_owed_nothing_may_always_send_one_request() {
        let worker = worker(100);
        let client = ClientBudget::new(worker.clone());
        let big = client.try_reserve(10, 0, 1_000);
        assert_eq!(big.as_ref().map(Reservation::bytes), Some(1_000));
        drop(big);
        assert!(
            client.try_reserve(10, 1, 1_000).is_none(),
            "with a reply queued it waits"
        );
        assert_eq!(worker.owed(), 0);
    }

    #[test]
    fn reservations_stop_at_either_bound_and_dropped_ones_let_them_go_on() {
        let worker = worker(100);
        let client = ClientBudget::new(worker.clone());
        let first = client.reserve(40);
        assert!(client.try_reserve(60, 0, 20).is_some());
        assert!(
            client.try_reserve(60, 0, 21).is_none(),
            "the client's bound"
        );
        assert_eq!(client.room(60, 5), 15);
        let other = ClientBudget::new(worker.clone());
        let _others = other.reserve(50);
        assert!(
            client.try_reserve(1_000, 0, 11).is_none(),
            "the worker's bound"
        );
        assert_eq!(client.room(1_000, 0), 10);
        // A reply collected (or a quiet one settled) drops its reservation:
        // the next request may go at once.
        drop(first);
        assert!(client.try_reserve(60, 0, 50).is_some());
        assert_eq!(worker.owed(), 50);
    }

    #[test]
    fn a_resized_reservation_gives_back_only_what_it_held() {
        let worker = worker(100);
        let client = ClientBudget::new(worker.clone());
        let mut held = Reservation::default();
        assert!(!held.is_taken());
        held.resize(30);
        assert_eq!(worker.owed(), 0, "one not taken holds nothing");
        client.resize(&mut held, 0);
        assert!(!held.is_taken(), "nothing to hold: nothing taken");
        client.resize(&mut held, 30);
        assert_eq!((client.owed(), worker.owed()), (30, 30));
        held.resize(45);
        held.resize(10);
        assert_eq!((client.owed(), worker.owed()), (10, 10));
        let zero = client.reserve(0);
        assert!(zero.is_taken(), "0 bytes is still a reservation");
        drop(held);
        assert_eq!((client.owed(), worker.owed()), (0, 0));
    }

    #[test]
    fn a_client_that_ends_gives_back_its_queue_and_every_reservation() {
        let worker = worker(100);
        let mut client = ClientBudget::new(worker.clone());
        let kept = client.reserve(20);
        client.count_queued(30);
        assert_eq!(worker.owed(), 50);
        client.count_queued(5);
        assert_eq!(worker.owed(), 25, "written bytes leave the count");
        drop(client);
        assert_eq!(worker.owed(), 20, "the queue left with the client");
        drop(kept);
        assert_eq!(worker.owed(), 0);
    }
}
