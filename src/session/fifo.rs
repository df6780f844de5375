//! The ordered reply FIFO: a client's requests as entries in the order they
//! arrived. Entries are dispatched (sent to servers) in that order, up to a
//! cursor, and leave only from the head, so replies reach the client in
//! request order whatever order the servers answer in. Pure: it holds the
//! entries and the cursor, the session decides what dispatching and
//! finishing an entry mean.
//!
//! Entries are worked on where they are: the session sets the FIFO aside
//! while it dispatches or finishes one ([`Fifo::split_at`], [`Fifo::head`]),
//! so an entry moves only once, when it leaves (moving a few hundred bytes
//! out and back for every dispatch and every look at an unfinished head was
//! about 2 % of a pipelining client's CPU).

use std::collections::VecDeque;

pub(super) struct Fifo<E> {
    entries: VecDeque<E>,
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

/// The entries before the one being dispatched: all of them dispatched.
pub(super) struct Before<'a, E> {
    first: &'a [E],
    second: &'a [E],
}

// Two shared slices: copied whatever `E` is.
impl<E> Clone for Before<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Before<'_, E> {}

impl<'a, E> Before<'a, E> {
    pub(super) fn iter(&self) -> impl Iterator<Item = &'a E> {
        self.first.iter().chain(self.second)
    }
}

impl<E> Fifo<E> {
    /// Its storage, while it holds no entry and has room for 1 to `most`:
    /// an idle client's entries take no memory (a pipelining client's larger
    /// queue stays with it, to take its next burst without growing again).
    pub(super) fn take_storage(&mut self, most: usize) -> Option<VecDeque<E>> {
        let room = self.entries.capacity();
        (self.entries.is_empty() && room > 0 && room <= most).then(|| {
            self.dispatched = 0;
            std::mem::take(&mut self.entries)
        })
    }

    pub(super) fn has_storage(&self) -> bool {
        self.entries.capacity() > 0
    }

    /// Takes `storage` (empty) in place of its own (none).
    pub(super) fn adopt_storage(&mut self, storage: VecDeque<E>) {
        if self.entries.is_empty() && storage.is_empty() {
            self.entries = storage;
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A new request, behind every other.
    pub(super) fn push(&mut self, entry: E) {
        self.entries.push_back(entry);
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

    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut E> {
        self.entries.get_mut(index)
    }

    /// Entry `index`, to work on in place, and the entries before it, to
    /// read meanwhile.
    pub(super) fn split_at(&mut self, index: usize) -> Option<(Before<'_, E>, &mut E)> {
        if index >= self.entries.len() {
            return None;
        }
        let (first, second) = self.entries.as_mut_slices();
        if index < first.len() {
            let (before, from) = first.split_at_mut(index);
            Some((
                Before {
                    first: before,
                    second: &[],
                },
                &mut from[0],
            ))
        } else {
            let (before, from) = second.split_at_mut(index - first.len());
            Some((
                Before {
                    first,
                    second: before,
                },
                &mut from[0],
            ))
        }
    }

    /// The head entry, in place, and whether it was dispatched.
    pub(super) fn head(&mut self) -> Option<(&mut E, bool)> {
        let dispatched = self.dispatched > 0;
        Some((self.entries.front_mut()?, dispatched))
    }

    /// Removes the head entry (finished); whether it was dispatched.
    pub(super) fn pop_head(&mut self) -> Option<(E, bool)> {
        let entry = self.entries.pop_front()?;
        let dispatched = self.dispatched > 0;
        if dispatched {
            self.dispatched -= 1;
        }
        Some((entry, dispatched))
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
            let (_, entry) = fifo.split_at(index).unwrap();
            sent.push(*entry);
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
    fn a_head_not_done_stays_and_the_cursor_stays_on_the_next_to_send() {
        let mut fifo = Fifo::default();
        (1..=3).for_each(|i| fifo.push(i));
        dispatch(&mut fifo, 2);
        // The head is answered and leaves: entry 3 is still the next to send.
        assert_eq!(fifo.pop_head(), Some((1, true)));
        assert_eq!(fifo.next_to_dispatch(), Some(1));
        // The new head is looked at, not answered yet: it stays, dispatched.
        assert_eq!(fifo.head().map(|(e, d)| (*e, d)), Some((2, true)));
        assert_eq!(fifo.next_to_dispatch(), Some(1));
        let (before, next) = fifo.split_at(1).unwrap();
        assert_eq!(before.iter().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(*next, 3);
    }

    #[test]
    fn the_entries_before_one_are_all_of_them_however_the_deque_wraps() {
        let mut fifo = Fifo::default();
        // Pushes and pops until the deque's storage wraps around, checking
        // every split on the way.
        let mut next = 0u32;
        for _ in 0..40 {
            while fifo.len() < 6 {
                fifo.push(next);
                next += 1;
            }
            let head = fifo.head().map(|(e, _)| *e).unwrap();
            for index in 0..fifo.len() {
                let (before, entry) = fifo.split_at(index).unwrap();
                let before: Vec<u32> = before.iter().copied().collect();
                assert_eq!(before, (head..head + index as u32).collect::<Vec<_>>());
                assert_eq!(*entry, head + index as u32);
            }
            assert!(fifo.split_at(fifo.len()).is_none());
            fifo.pop_head();
            fifo.pop_head();
        }
    }

    #[test]
    fn an_entry_never_dispatched_reads_so_at_the_head() {
        let mut fifo = Fifo::default();
        fifo.push(7);
        assert_eq!(fifo.head().map(|(e, d)| (*e, d)), Some((7, false)));
        assert_eq!(fifo.next_to_dispatch(), Some(0));
        assert!(!fifo.all_dispatched());
        assert_eq!(fifo.pop_head(), Some((7, false)));
    }
}
