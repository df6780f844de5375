//! The time of a worker's current turn: read from the OS once when a task of
//! the worker wakes, then read from here by everything that runs for it in
//! that turn (request start times, the time a request was queued on a
//! connection). A clock read per request was a few percent of memring's CPU
//! on pipelined loads; within one turn the difference is microseconds.

use std::cell::Cell;
use tokio::time::Instant;

/// One worker's turn time (not `Sync`: each worker has its own).
#[derive(Debug)]
pub(crate) struct TurnClock(Cell<Instant>);

impl TurnClock {
    pub(crate) fn new() -> TurnClock {
        TurnClock(Cell::new(Instant::now()))
    }

    /// Reads the OS clock: call once when a task wakes.
    pub(crate) fn tick(&self) -> Instant {
        let now = Instant::now();
        self.0.set(now);
        now
    }

    /// The time of the last [`TurnClock::tick`].
    pub(crate) fn now(&self) -> Instant {
        self.0.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_the_last_tick_until_the_next() {
        let clock = TurnClock::new();
        let first = clock.tick();
        assert_eq!(clock.now(), first);
        let second = clock.tick();
        assert!(second >= first);
        assert_eq!(clock.now(), second);
    }
}
