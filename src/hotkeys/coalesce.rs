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

/// Largest list of followers a done flight keeps for the next (8 KiB).
const KEEP_FOLLOWERS_ROOM: usize = 1024;

/// A hot key's `get` on its way to the server: other sessions of the worker
/// may wait for its reply, which may fill the near cache.
#[derive(Debug)]
pub(super) struct Flight {
    /// Its followers' slots carry it (see [`Slot::follows`]); never 0.
    pub(super) id: u64,
    /// The connection it was queued on.
    pub(super) conn: Rc<Conn>,
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
    pub(super) fn answers(&self, state: &FlightState, slot: &Rc<Slot>) -> bool {
        std::ptr::eq(state.origin.as_ptr(), Rc::as_ptr(slot)) || slot.follows(self.id)
    }

    /// `slot` takes this flight's reply too.
    pub(super) fn join(&self, slot: &Rc<Slot>, state: &mut FlightState) {
        slot.follow(self.id);
        state.followers.push(slot.clone());
    }
}

#[derive(Debug, Default)]
pub(super) struct FlightState {
    /// The slot of the session that sent it (weak: the slot owns the
    /// flight), until the reply is done: then it is let go, so that the
    /// slot is free to be kept for another request.
    origin: Weak<Slot>,
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
            state.origin = Weak::new();
            let value = match (&state.values[..], state.other) {
                ([block], false) => Some(block.clone()),
                _ => None,
            };
            (std::mem::take(&mut state.followers), value)
        };
        let mut followers = followers;
        for follower in followers.drain(..) {
            follower.finish(result.clone());
        }
        // The list's room is kept for the flight that reuses this one (see
        // `Flight::reuse`), unless a long pipeline made it large; a done
        // flight is joined by nobody.
        if followers.capacity() <= KEEP_FOLLOWERS_ROOM {
            self.state.borrow_mut().followers = followers;
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

impl Flight {
    /// A new flight for `ticket`, sent with its reply going to `origin`: in
    /// the ticket's spent flight when it has one, whose storage (and its
    /// followers' list's room) it takes, so that a hot key's flights
    /// allocate nothing in steady state.
    pub(super) fn reuse(mut ticket: Ticket, origin: &Rc<Slot>, shared: &Local) -> Rc<Flight> {
        let id = next_flight_id();
        if let Some(mut spent) = ticket.spent.take() {
            if let Some(flight) = Rc::get_mut(&mut spent) {
                let state = flight.state.get_mut();
                // Done, so its followers were answered and the list is empty.
                debug_assert!(state.done && state.followers.is_empty());
                state.followers.clear();
                state.origin = Rc::downgrade(origin);
                state.started = false;
                state.done = false;
                state.values.clear();
                state.other = false;
                flight.id = id;
                flight.conn = ticket.conn;
                flight.line = ticket.line;
                flight.hash = ticket.hash;
                flight.version = ticket.version;
                flight.fill = ticket.fill;
                return spent;
            }
        }
        Rc::new(Flight {
            id,
            conn: ticket.conn,
            line: ticket.line,
            hash: ticket.hash,
            version: ticket.version,
            fill: ticket.fill,
            shared: shared.clone(),
            state: RefCell::new(FlightState {
                origin: Rc::downgrade(origin),
                ..FlightState::default()
            }),
        })
    }
}

/// A hot key's `get` about to be sent.
pub(crate) struct Ticket {
    pub(super) conn: Rc<Conn>,
    pub(super) line: Bytes,
    pub(super) hash: u64,
    pub(super) version: u64,
    pub(super) fill: Option<Box<[u8]>>,
    /// The key's last flight, done and held by nothing else: its storage
    /// serves this one (dropped with the ticket if it is never sent).
    pub(super) spent: Option<Rc<Flight>>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::backend::{Backend, BackendSettings, PoolHooks};
    use crate::config::{HotKeySettings, ServerConfig};
    use crate::hotkeys::HotShared;
    use crate::runtime::wake::Wake;
    use crate::stats::Stats;

    /// A connection that is never run: the flights only hold it.
    fn idle_conn() -> (Arc<Backend>, Rc<Conn>) {
        let stats = Arc::new(Stats::new());
        let hooks = PoolHooks {
            health_changed: Arc::new(tokio::sync::Notify::new()),
            stats,
            tls: None,
            pool: "default".into(),
        };
        let server = ServerConfig::plain("idle", "127.0.0.1:11211");
        let settings = BackendSettings {
            connections: 1,
            connect_timeout: Duration::from_millis(2000),
            request_timeout: Duration::from_millis(1000),
            failure_limit: 100,
            max_value_bytes: None,
            dns: crate::inputs::resolve::Dns::default(),
            max_inflight: 0,
        };
        let backend = Backend::new(&server, settings, &hooks);
        let conn = Conn::new(
            backend.shared().clone(),
            Rc::new(crate::runtime::clock::TurnClock::new()),
        );
        (backend, conn)
    }

    fn ticket(conn: &Rc<Conn>, spent: Option<Rc<Flight>>) -> Ticket {
        Ticket {
            conn: conn.clone(),
            line: Bytes::from_static(b"get k\r\n"),
            hash: 7,
            version: 1,
            fill: None,
            spent,
        }
    }

    /// A hot key's gets coalesce into one flight after another: each new
    /// flight takes the storage of the key's last one, followers' list
    /// included, and the sender's slot is free for another request as soon
    /// as the reply is done, so that steady state allocates none of them.
    #[test]
    fn a_done_flight_lends_its_storage_to_the_next_and_lets_go_of_its_sender() {
        let (_backend, conn) = idle_conn();
        let shared: Local = Rc::new(HotShared::new(
            HotKeySettings::default(),
            1,
            Arc::new(Stats::new()),
        ));
        let wake = Rc::new(Wake::new());
        let mut origin = Slot::new(wake.clone());
        let first = Flight::reuse(ticket(&conn, None), &origin, &shared);
        origin.watch(first.clone());
        let followers: Vec<Rc<Slot>> = (0..5).map(|_| Slot::new(wake.clone())).collect();
        for follower in &followers {
            assert!(first.answers(&first.state.borrow(), &origin));
            first.join(follower, &mut first.state.borrow_mut());
        }
        let value = Got::Value(Bytes::from_static(b"VALUE k 0 1\r\nx\r\n"));
        origin.push(value.clone());
        origin.finish(Ok(Outcome::End));
        for follower in &followers {
            assert_eq!(follower.take(), Some(value.clone()));
            assert!(follower.outcome().is_some(), "every follower answered");
        }
        // Only the worker's map holds the done flight now; its sender's
        // slot can be kept for the next request.
        assert_eq!(Rc::strong_count(&first), 1);
        assert!(origin.take().is_some());
        assert!(
            Slot::empty_for_reuse(&mut origin),
            "the flight let go of it"
        );
        let room = first.state.borrow().followers.capacity();
        assert!(room >= 5, "the followers' list keeps its room");
        let storage = Rc::as_ptr(&first);
        let first_id = first.id;
        // The next flight of the key, from another slot.
        let sender = Slot::new(wake.clone());
        let second = Flight::reuse(ticket(&conn, Some(first)), &sender, &shared);
        assert_eq!(Rc::as_ptr(&second), storage, "the same storage");
        assert_ne!(
            second.id, first_id,
            "a new id: the old followers follow it not"
        );
        let state = second.state.borrow();
        assert!(!state.started && !state.done && state.followers.is_empty());
        assert_eq!(state.followers.capacity(), room);
        assert!(second.answers(&state, &sender));
        assert!(!second.answers(&state, &origin));
        assert!(!second.answers(&state, &followers[0]));
        drop(state);
        // A spent flight something else still holds is not reused.
        let held = second.clone();
        let third = Flight::reuse(ticket(&conn, Some(second)), &sender, &shared);
        assert_ne!(Rc::as_ptr(&third), Rc::as_ptr(&held));
    }
}
