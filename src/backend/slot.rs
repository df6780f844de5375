//! A reply slot: where one backend connection puts the reply to one request,
//! piece by piece, for the client session that sent it. The one way every
//! request waits for its reply.
//!
//! Slots live on one worker thread (the session and the connection run on the
//! same current-thread runtime), so they are `Rc` + `RefCell`; the session is
//! woken through its own [`Wake`]: a reply that arrives in pieces, or many
//! replies in one turn, wake it once.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::error::BackendError;
use crate::protocol::outcome::Outcome;
use crate::runtime::wake::Wake;

// The framed pieces are the protocol's: the planner reads them too.
pub use crate::protocol::reply::Got;

#[derive(Debug, Default)]
struct State {
    /// Pieces not yet taken start at `taken`. Inline: a one-key reply is
    /// one or two pieces, and a slot per request must not allocate for them.
    pieces: SmallVec<[Got; 2]>,
    taken: usize,
    /// `Some` once the reply is complete (`Ok`, with what it says, as the
    /// connection framed it) or cannot come (`Err`).
    done: Option<Result<Outcome, BackendError>>,
}

/// Sees a slot's reply as it arrives, besides the session that owns the slot
/// (hot keys: other sessions waiting for the same reply, the near cache, a
/// write's completion).
pub trait Watch: std::fmt::Debug {
    /// A piece arrived.
    fn piece(&self, _piece: &Got) {}
    /// The reply is complete (with what it says) or failed; the slot lets
    /// go of the watcher next.
    fn done(&self, _result: &Result<Outcome, BackendError>) {}
}

/// The reply to one request, filled by a backend connection.
#[derive(Debug)]
pub struct Slot {
    state: RefCell<State>,
    /// The session's wake-up, shared by all its slots.
    owner: Rc<Wake>,
    watch: RefCell<Option<Rc<dyn Watch>>>,
    /// The id of the other request whose reply fills this slot (hot keys:
    /// a coalesced `get` this slot joined), 0 for none: the request tells
    /// its followers by this in O(1) rather than by a search.
    follows: Cell<u64>,
    /// The cas of a hand-off lease the reply showed (and the connection
    /// turned into a miss), for a command that removes it and runs again
    /// (`plan::lease_retry`).
    lease: Cell<Option<u64>>,
}

impl Slot {
    /// Notes the cas of a lease the reply showed.
    pub(crate) fn met_lease(&self, cas: u64) {
        self.lease.set(Some(cas));
    }

    /// The cas of the lease the reply showed, if it showed one with its cas.
    pub(crate) fn lease(&self) -> Option<u64> {
        self.lease.get()
    }

    /// A slot that wakes `owner` whenever something arrives.
    pub(crate) fn new(owner: Rc<Wake>) -> Rc<Slot> {
        Rc::new(Slot {
            state: RefCell::new(State::default()),
            owner,
            watch: RefCell::new(None),
            follows: Cell::new(0),
            lease: Cell::new(None),
        })
    }

    /// Empties `slot` for another request, if nothing else holds it and
    /// its reply is complete.
    pub fn empty_for_reuse(slot: &mut Rc<Slot>) -> bool {
        let Some(slot) = Rc::get_mut(slot) else {
            return false;
        };
        let state = slot.state.get_mut();
        if state.done.is_none() {
            return false;
        }
        state.pieces.clear();
        state.taken = 0;
        state.done = None;
        *slot.watch.get_mut() = None;
        slot.follows.set(0);
        slot.lease.set(None);
        true
    }

    /// Has an emptied `slot` (see [`Slot::empty_for_reuse`]) wake `owner`.
    pub(crate) fn wake_on(slot: &mut Rc<Slot>, owner: &Rc<Wake>) {
        if let Some(slot) = Rc::get_mut(slot) {
            if !Rc::ptr_eq(&slot.owner, owner) {
                slot.owner = owner.clone();
            }
        }
    }

    /// Has `watch` see this reply from now on (replacing any other watcher).
    pub fn watch(&self, watch: Rc<dyn Watch>) {
        *self.watch.borrow_mut() = Some(watch);
    }

    /// Marks this slot as filled by the request with id `leader` (not 0).
    pub fn follow(&self, leader: u64) {
        self.follows.set(leader);
    }

    /// Whether this slot is filled by the request with id `leader`.
    pub fn follows(&self, leader: u64) -> bool {
        leader != 0 && self.follows.get() == leader
    }

    /// Adds a piece of the reply.
    pub fn push(&self, piece: Got) {
        // No borrow is held while the watcher runs: it may fill other slots.
        let watch = self.watch.borrow().clone();
        if let Some(watch) = watch {
            watch.piece(&piece);
        }
        self.state.borrow_mut().pieces.push(piece);
        self.owner.notify();
    }

    /// The reply is complete (saying `outcome`), or failed.
    pub fn finish(&self, result: Result<Outcome, BackendError>) {
        let mut state = self.state.borrow_mut();
        if state.done.is_some() {
            return;
        }
        let watch = self.watch.borrow_mut().take();
        match watch {
            // Copied only for a watcher (an error's server name is a
            // `String`).
            Some(watch) => {
                state.done = Some(result.clone());
                drop(state);
                watch.done(&result);
            }
            None => {
                state.done = Some(result);
                drop(state);
            }
        }
        self.owner.notify();
    }

    /// Takes the next piece that arrived, if any.
    pub fn take(&self) -> Option<Got> {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        let piece = state.pieces.get_mut(state.taken)?;
        // Leaves an empty line behind (no allocation), dropped below.
        let piece = std::mem::replace(piece, Got::Line(Bytes::new()));
        state.taken += 1;
        if state.taken == state.pieces.len() {
            state.pieces.clear();
            state.taken = 0;
        } else if state.taken >= 64 && state.taken * 2 >= state.pieces.len() {
            // A long reply taken as it streams in: drop what was taken.
            state.pieces.drain(..state.taken);
            state.taken = 0;
        }
        Some(piece)
    }

    /// Hands every piece that arrived and is not taken yet to `each`, in
    /// order: one borrow for all of them, where [`Slot::take`] takes one a
    /// call and a last call to find none (a one-key get's reader ran both
    /// per request). `each` must not touch this slot (the plan's `on_piece`
    /// does not): the slot is borrowed while it runs.
    pub fn take_each(&self, mut each: impl FnMut(Got)) {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        if state.taken == state.pieces.len() {
            return;
        }
        let taken = std::mem::take(&mut state.taken);
        state.pieces.drain(taken..).for_each(&mut each);
        // What `take` left behind of the pieces it took (empty lines).
        state.pieces.clear();
    }

    /// Nothing arrived that is not taken yet, and the reply is not complete:
    /// a look at it now would find nothing new.
    pub(crate) fn is_waiting(&self) -> bool {
        let state = self.state.borrow();
        state.taken == state.pieces.len() && state.done.is_none()
    }

    /// `None` while more may come; then whether the reply completed, and
    /// what it says. Pieces may still be waiting to be taken.
    pub fn outcome(&self) -> Option<Result<Outcome, BackendError>> {
        self.state.borrow().done.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_come_out_in_order_and_finish_once() {
        let slot = Slot::new(Rc::new(Wake::new()));
        slot.push(Got::Value(Bytes::from_static(b"VALUE a 0 1\r\nx\r\n")));
        slot.push(Got::Line(Bytes::from_static(b"END\r\n")));
        assert!(slot.outcome().is_none());
        slot.finish(Ok(Outcome::End));
        slot.finish(Err(BackendError {
            server: "a".into(),
            kind: crate::error::BackendErrorKind::Timeout,
        }));
        assert_eq!(slot.outcome(), Some(Ok(Outcome::End)));
        assert!(matches!(slot.take(), Some(Got::Value(_))));
        assert!(matches!(slot.take(), Some(Got::Line(_))));
        assert_eq!(slot.take(), None);
    }

    #[test]
    fn pieces_taken_together_come_out_in_order_after_those_taken_one_by_one() {
        let slot = Slot::new(Rc::new(Wake::new()));
        let piece = |i: usize| Got::Value(Bytes::from(format!("VALUE k{i} 0 0\r\n\r\n")));
        for i in 0..5 {
            slot.push(piece(i));
        }
        assert_eq!(slot.take(), Some(piece(0)));
        let mut got = Vec::new();
        slot.take_each(|p| got.push(p));
        assert_eq!(got, (1..5).map(piece).collect::<Vec<_>>());
        slot.take_each(|_| panic!("nothing is left to take"));
        assert_eq!(slot.take(), None);
        slot.push(piece(5));
        slot.take_each(|p| got.push(p));
        assert_eq!(got.last(), Some(&piece(5)));
        assert!(slot.is_waiting());
    }

    #[test]
    fn a_long_reply_taken_while_it_streams_in_keeps_its_order() {
        let slot = Slot::new(Rc::new(Wake::new()));
        let piece = |i: usize| Got::Value(Bytes::from(format!("VALUE k{i} 0 0\r\n\r\n")));
        let mut next_taken = 0;
        let mut take_some = |n: usize| {
            for _ in 0..n {
                assert_eq!(slot.take(), Some(piece(next_taken)));
                next_taken += 1;
            }
        };
        for i in 0..300 {
            slot.push(piece(i));
        }
        take_some(150);
        for i in 300..400 {
            slot.push(piece(i));
        }
        // The 150 taken went; 150 + 100 wait.
        assert_eq!(slot.state.borrow().pieces.len(), 250);
        take_some(250);
        assert_eq!(slot.take(), None);
    }

    #[derive(Debug, Default)]
    struct Seen(RefCell<Vec<String>>);

    impl Watch for Seen {
        fn piece(&self, piece: &Got) {
            self.0.borrow_mut().push(format!("{} bytes", piece.len()));
        }
        fn done(&self, result: &Result<Outcome, BackendError>) {
            self.0.borrow_mut().push(format!("done {}", result.is_ok()));
        }
    }

    #[test]
    fn a_watcher_sees_every_piece_and_the_end_once_then_is_let_go() {
        let slot = Slot::new(Rc::new(Wake::new()));
        let seen = Rc::new(Seen::default());
        slot.watch(seen.clone());
        slot.push(Got::Value(Bytes::from_static(b"VALUE a 0 1\r\nx\r\n")));
        slot.finish(Ok(Outcome::End));
        slot.finish(Ok(Outcome::End));
        assert_eq!(*seen.0.borrow(), vec!["16 bytes", "done true"]);
        assert_eq!(Rc::strong_count(&seen), 1, "the slot let go of it");
        // The owner still gets everything.
        assert!(matches!(slot.take(), Some(Got::Value(_))));
    }

    #[test]
    fn only_a_finished_slot_nothing_else_holds_is_reused() {
        let (first, second) = (Rc::new(Wake::new()), Rc::new(Wake::new()));
        let mut slot = Slot::new(first.clone());
        slot.push(Got::Line(Bytes::from_static(b"STORED\r\n")));
        assert!(
            !Slot::empty_for_reuse(&mut slot),
            "its reply is not complete"
        );
        slot.finish(Ok(Outcome::End));
        let held = slot.clone();
        assert!(
            !Slot::empty_for_reuse(&mut slot),
            "a connection still holds it"
        );
        drop(held);
        assert!(Slot::empty_for_reuse(&mut slot));
        assert_eq!(slot.outcome(), None);
        assert_eq!(slot.take(), None);
        Slot::wake_on(&mut slot, &second);
        assert!(Rc::ptr_eq(&slot.owner, &second));
        slot.push(Got::Line(Bytes::from_static(b"END\r\n")));
        assert_eq!(slot.take(), Some(Got::Line(Bytes::from_static(b"END\r\n"))));
    }

    /// A slot reused for another request follows nothing: a flight that
    /// ended must not count a later request in the same slot as its own.
    #[test]
    fn a_slot_follows_only_the_request_it_joined_until_reused() {
        let mut slot = Slot::new(Rc::new(Wake::new()));
        assert!(!slot.follows(0), "0 is nobody's id");
        assert!(!slot.follows(7));
        slot.follow(7);
        assert!(slot.follows(7));
        assert!(!slot.follows(8));
        slot.finish(Ok(Outcome::End));
        assert!(Slot::empty_for_reuse(&mut slot));
        assert!(!slot.follows(7));
    }
}
