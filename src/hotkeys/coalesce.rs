//! Coalescing: a hot key's `get` that another session of the worker already
//! sent, and every slot that joined it and takes its reply. When a `get` may
//! join one is decided in `HotWorker::before_send` (mod.rs). No I/O here.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use bytes::Bytes;
use smallvec::SmallVec;

use super::Local;
use crate::backend::conn::Conn;
use crate::backend::slot::{Got, Slot, Watch};
use crate::error::{BackendError, BackendErrorKind};
use crate::protocol::outcome::Outcome;

thread_local! {
    /// The id of the last flight sent on this thread (a worker's sessions,
    /// connections and slots all live on its thread).
    static LAST_FLIGHT: Cell<u64> = const { Cell::new(0) };
}

/// A new flight id, unique on this thread, never 0.
pub(super) fn next_flight_id() -> u64 {
    LAST_FLIGHT.with(|last| {
        last.set(last.get() + 1);
        last.get()
    })
}

/// A hot key's `get` on its way to the server: other sessions of the worker
/// may wait for its reply, which may fill the near cache.
#[derive(Debug)]
pub(super) struct Flight {
    /// Its followers' slots carry it (see [`Slot::follows`]); never 0.
    pub(super) id: u64,
    /// The connection it was queued on.
    pub(super) conn: Rc<Conn>,
    /// The slot of the session that sent it (weak: the slot owns the flight).
    pub(super) origin: Weak<Slot>,
    pub(super) line: Bytes,
    pub(super) hash: u64,
    /// The stripe version when it was sent.
    pub(super) version: u64,
    /// The key, when the reply may fill the near cache.
    pub(super) fill: Option<Box<[u8]>>,
    pub(super) shared: Local,
    pub(super) state: RefCell<FlightState>,
}

impl Flight {
    /// Whether `slot` gets this flight's reply: the sender's or a follower's.
    /// One comparison each: a pipeline of joined `get`s checks every
    /// earlier one (see `HotWorker::before_send`).
    pub(super) fn answers(&self, slot: &Rc<Slot>) -> bool {
        std::ptr::eq(self.origin.as_ptr(), Rc::as_ptr(slot)) || slot.follows(self.id)
    }

    /// `slot` takes this flight's reply too.
    pub(super) fn join(&self, slot: &Rc<Slot>, state: &mut FlightState) {
        slot.follow(self.id);
        state.followers.push(slot.clone());
    }
}

#[derive(Debug, Default)]
pub(super) struct FlightState {
    pub(super) followers: Vec<Rc<Slot>>,
    pub(super) started: bool,
    pub(super) done: bool,
    /// The reply's value blocks, and whether anything else came.
    values: SmallVec<[Bytes; 1]>,
    other: bool,
}

impl Watch for Flight {
    fn piece(&self, piece: &Got) {
        let mut state = self.state.borrow_mut();
        state.started = true;
        match piece {
            Got::Value(block) if self.fill.is_some() => state.values.push(block.clone()),
            _ => state.other = true,
        }
        // Followers have no watcher of their own: pushing cannot come back here.
        for follower in &state.followers {
            follower.push(piece.clone());
        }
    }

    fn done(&self, result: &Result<Outcome, BackendError>) {
        let (followers, value) = {
            let mut state = self.state.borrow_mut();
            state.done = true;
            let value = match (&state.values[..], state.other) {
                ([block], false) => Some(block.clone()),
                _ => None,
            };
            (std::mem::take(&mut state.followers), value)
        };
        for follower in followers {
            follower.finish(result.clone());
        }
        if let (Ok(_), Some(key), Some(block)) = (result, &self.fill, value) {
            self.shared.fill(key, self.hash, self.version, block);
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        // Dropped unanswered (its connection went away without failing it):
        // followers must not wait forever.
        let state = self.state.get_mut();
        if !state.done && !state.followers.is_empty() {
            // Counted here, once, because clients do see this failure.
            let gone = self.conn.error(BackendErrorKind::Gone);
            for follower in state.followers.drain(..) {
                follower.finish(Err(gone.clone()));
            }
        }
    }
}

/// A hot key's `get` about to be sent.
pub(crate) struct Ticket {
    pub(super) conn: Rc<Conn>,
    pub(super) line: Bytes,
    pub(super) hash: u64,
    pub(super) version: u64,
    pub(super) fill: Option<Box<[u8]>>,
}
