//! The ordered reply FIFO: a client's requests as entries in the order they
//! arrived. Entries are dispatched (sent to servers) in that order, up to a
//! cursor, and leave only from the head, so replies reach the client in
//! request order whatever order the servers answer in. Pure: it holds the
//! entries and the cursor, the session decides what dispatching and
//! finishing an entry mean.

use std::collections::VecDeque;

pub(super) struct Fifo<E> {
    /// `None` only for the one entry taken out to be dispatched: taking it
    /// leaves its place, so the entries around it never move (removing it
    /// from the deque shifted up to half the pipeline, twice per request).
    entries: VecDeque<Option<E>>,
    /// Entries before this index have sent everything they will send.
    dispatched: usize,
}

impl<E> Default for Fifo<E> {
    fn default() -> Fifo<E> {
        Fifo {
            entries: VecDeque::new(),
            dispatched: 0,
        }
    }
}

impl<E> Fifo<E> {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A new request, behind every other.
    pub(super) fn push(&mut self, entry: E) {
        self.entries.push_back(Some(entry));
    }

    /// Whether every entry has sent everything it will send.
    pub(super) fn all_dispatched(&self) -> bool {
        self.dispatched == self.entries.len()
    }

    /// The index of the first entry still to dispatch.
    pub(super) fn next_to_dispatch(&self) -> Option<usize> {
        (self.dispatched < self.entries.len()).then_some(self.dispatched)
    }

    /// The entry at [`Fifo::next_to_dispatch`] has sent everything.
    pub(super) fn dispatched_one(&mut self) {
        debug_assert!(self.dispatched < self.entries.len());
        self.dispatched = (self.dispatched + 1).min(self.entries.len());
    }

    /// The dispatched entries (those before the one being dispatched).
    pub(super) fn dispatched(&self) -> impl Iterator<Item = &E> {
        self.entries.range(..self.dispatched).flatten()
    }

    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut E> {
        self.entries.get_mut(index)?.as_mut()
    }

    /// Takes entry `index` out to work on it while the others stay readable;
    /// [`Fifo::put_back`] returns it to its place. One at a time.
    pub(super) fn take(&mut self, index: usize) -> Option<E> {
        self.entries.get_mut(index)?.take()
    }

    pub(super) fn put_back(&mut self, index: usize, entry: E) {
        let place = &mut self.entries[index];
        debug_assert!(place.is_none(), "put back where it was taken");
        *place = Some(entry);
    }

    /// Takes the head to finish it, with whether it was dispatched (only a
    /// dispatched entry can be finished). Put it back with
    /// [`Fifo::unpop_head`] if it is not done.
    pub(super) fn pop_head(&mut self) -> Option<(E, bool)> {
        // Never the entry taken out: nothing finishes while one is.
        let entry = self.entries.pop_front()??;
        let dispatched = self.dispatched > 0;
        if dispatched {
            self.dispatched -= 1;
        }
        Some((entry, dispatched))
    }

    pub(super) fn unpop_head(&mut self, entry: E, dispatched: bool) {
        self.entries.push_front(Some(entry));
        if dispatched {
            self.dispatched += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dispatches up to `count` entries in order; returns those dispatched.
    fn dispatch(fifo: &mut Fifo<u32>, count: usize) -> Vec<u32> {
        let mut sent = Vec::new();
        while sent.len() < count {
            let Some(index) = fifo.next_to_dispatch() else {
                break;
            };
            let entry = fifo.take(index).unwrap();
            sent.push(entry);
            fifo.put_back(index, entry);
            fifo.dispatched_one();
        }
        sent
    }

    #[test]
    fn entries_are_dispatched_and_leave_in_arrival_order() {
        let mut fifo = Fifo::default();
        (1..=5).for_each(|i| fifo.push(i));
        assert_eq!(dispatch(&mut fifo, 2), vec![1, 2]);
        // More arrive while the first are out: behind them.
        fifo.push(6);
        assert_eq!(dispatch(&mut fifo, 10), vec![3, 4, 5, 6]);
        assert!(fifo.all_dispatched());
        let mut answered = Vec::new();
        while let Some((entry, dispatched)) = fifo.pop_head() {
            assert!(dispatched);
            answered.push(entry);
        }
        assert_eq!(answered, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_head_not_done_goes_back_and_the_cursor_stays_on_the_next_to_send() {
        let mut fifo = Fifo::default();
        (1..=3).for_each(|i| fifo.push(i));
        dispatch(&mut fifo, 2);
        // The head is answered and leaves: entry 3 is still the next to send.
        assert_eq!(fifo.pop_head(), Some((1, true)));
        assert_eq!(fifo.next_to_dispatch(), Some(1));
        let next = fifo.take(1);
        assert_eq!(next, Some(3));
        fifo.put_back(1, 3);
        // The new head is not answered yet: back it goes, still dispatched.
        let (head, dispatched) = fifo.pop_head().unwrap();
        fifo.unpop_head(head, dispatched);
        assert_eq!(fifo.next_to_dispatch(), Some(1));
        assert_eq!(fifo.dispatched().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn an_entry_taken_out_keeps_its_place_and_the_others_theirs() {
        let mut fifo = Fifo::default();
        (1..=4).for_each(|i| fifo.push(i));
        dispatch(&mut fifo, 2);
        let third = fifo.take(2).unwrap();
        assert_eq!(third, 3);
        // The others are where they were while it is out.
        assert_eq!(fifo.dispatched().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(fifo.get_mut(3).copied(), Some(4));
        assert_eq!(fifo.get_mut(2), None);
        assert_eq!(fifo.len(), 4);
        fifo.put_back(2, third);
        fifo.dispatched_one();
        assert_eq!(dispatch(&mut fifo, 10), vec![4]);
        let order: Vec<u32> = std::iter::from_fn(|| fifo.pop_head().map(|(e, _)| e)).collect();
        assert_eq!(order, vec![1, 2, 3, 4]);
    }

    #[test]
    fn an_entry_never_dispatched_reads_so_at_the_head() {
        let mut fifo = Fifo::default();
        fifo.push(7);
        assert_eq!(fifo.pop_head(), Some((7, false)));
        fifo.unpop_head(7, false);
        assert_eq!(fifo.next_to_dispatch(), Some(0));
        assert!(!fifo.all_dispatched());
    }
}
