//! The reply-byte budget: how many bytes of replies one client may be owed
//! (reserved for requests in flight, held for entries not yet at the head,
//! waiting in its write queue), and the share of its worker's bound all of
//! the worker's clients draw on. Pure arithmetic, no I/O: the session asks
//! before it dispatches and gives bytes back as replies are written.

use std::cell::Cell;

/// One worker's bound on the reply bytes its clients are owed.
#[derive(Debug)]
pub(crate) struct WorkerBudget {
    owed: Cell<usize>,
    limit: usize,
}

impl WorkerBudget {
    /// A worker's budget of `limit` bytes (its share of `max_buffer_bytes`).
    pub(crate) fn new(limit: usize) -> WorkerBudget {
        WorkerBudget {
            owed: Cell::new(0),
            limit,
        }
    }

    /// Bytes every client of the worker is owed now.
    pub(crate) fn owed(&self) -> usize {
        self.owed.get()
    }

    fn room(&self) -> usize {
        self.limit.saturating_sub(self.owed.get())
    }

    fn add(&self, bytes: usize) {
        self.owed.set(self.owed.get() + bytes);
    }

    fn sub(&self, bytes: usize) {
        self.owed.set(self.owed.get().saturating_sub(bytes));
    }
}

/// One client's part of the budget.
#[derive(Debug, Default)]
pub(crate) struct ClientBudget {
    /// Reply bytes reserved for requests in flight and held for entries
    /// not yet at the head.
    owed: usize,
    /// Bytes of the client's write queue counted in the worker's `owed`.
    out_counted: usize,
}

impl ClientBudget {
    /// Bytes reserved and held (the write queue aside).
    pub(crate) fn owed(&self) -> usize {
        self.owed
    }

    /// Nothing reserved, held or queued: such a client may always send one
    /// request, however large, so that every client progresses.
    pub(crate) fn nothing_owed(&self, queued: usize) -> bool {
        self.owed == 0 && queued == 0
    }

    /// Bytes that may still be reserved with `queued` bytes in the write
    /// queue and a client bound of `limit`.
    pub(crate) fn room(&self, worker: &WorkerBudget, limit: usize, queued: usize) -> usize {
        limit.saturating_sub(self.owed + queued).min(worker.room())
    }

    /// Whether `cost` more bytes may be reserved now.
    pub(crate) fn may_reserve(
        &self,
        worker: &WorkerBudget,
        limit: usize,
        queued: usize,
        cost: usize,
    ) -> bool {
        self.nothing_owed(queued)
            || (self.owed + queued + cost <= limit && worker.owed() + cost <= worker.limit)
    }

    pub(crate) fn reserve(&mut self, worker: &WorkerBudget, cost: usize) {
        self.owed += cost;
        worker.add(cost);
    }

    /// Gives `cost` bytes back (never more than is owed).
    pub(crate) fn release(&mut self, worker: &WorkerBudget, cost: usize) {
        let cost = cost.min(self.owed);
        self.owed -= cost;
        worker.sub(cost);
    }

    /// Keeps the worker's count in step with the `queued` bytes waiting in
    /// the client's write queue: they are buffered replies too, and a
    /// client that does not read holds them for as long as it likes.
    pub(crate) fn count_queued(&mut self, worker: &WorkerBudget, queued: usize) {
        worker.add(queued);
        worker.sub(self.out_counted);
        self.out_counted = queued;
    }

    /// Gives back everything the client reserved and queued (it is
    /// ending).
    pub(crate) fn release_all(&mut self, worker: &WorkerBudget) {
        self.release(worker, self.owed);
        worker.sub(self.out_counted);
        self.out_counted = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_owed_nothing_may_always_send_one_request() {
        let worker = WorkerBudget::new(100);
        let client = ClientBudget::default();
        assert!(client.may_reserve(&worker, 10, 0, 1_000));
        assert!(
            !client.may_reserve(&worker, 10, 1, 1_000),
            "with a reply queued it waits"
        );
    }

    #[test]
    fn reservations_stop_at_either_bound_and_released_bytes_let_them_go_on() {
        let worker = WorkerBudget::new(100);
        let mut client = ClientBudget::default();
        client.reserve(&worker, 40);
        assert!(client.may_reserve(&worker, 60, 0, 20));
        assert!(
            !client.may_reserve(&worker, 60, 0, 21),
            "the client's bound"
        );
        assert_eq!(client.room(&worker, 60, 5), 15);
        let mut other = ClientBudget::default();
        other.reserve(&worker, 50);
        assert!(
            !client.may_reserve(&worker, 1_000, 0, 11),
            "the worker's bound"
        );
        assert_eq!(client.room(&worker, 1_000, 0), 10);
        // A reply collected (or a quiet one settled) gives its bytes back:
        // the next request may go at once.
        client.release(&worker, 40);
        assert!(client.may_reserve(&worker, 60, 0, 50));
        assert_eq!(worker.owed(), 50);
    }

    #[test]
    fn releases_never_take_more_than_the_client_was_owed() {
        let worker = WorkerBudget::new(100);
        let (mut client, mut other) = (ClientBudget::default(), ClientBudget::default());
        client.reserve(&worker, 10);
        other.reserve(&worker, 30);
        client.release(&worker, 25);
        assert_eq!((client.owed(), worker.owed()), (0, 30));
    }

    #[test]
    fn the_write_queue_counts_for_the_worker_until_the_client_ends() {
        let worker = WorkerBudget::new(100);
        let mut client = ClientBudget::default();
        client.reserve(&worker, 20);
        client.count_queued(&worker, 30);
        assert_eq!(worker.owed(), 50);
        client.count_queued(&worker, 5);
        assert_eq!(worker.owed(), 25, "written bytes leave the count");
        client.release_all(&worker);
        assert_eq!(worker.owed(), 0);
        assert!(client.nothing_owed(0));
    }
}
