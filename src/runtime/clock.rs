//! The time of a worker's current turn: read from the OS once when a task of
//! the worker wakes, then read from here by everything that runs for it in
//! that turn (request start times, the time a request was queued on a
//! connection). A clock read per request was a few percent of memring's CPU
//! on pipelined loads; within one turn the difference is microseconds.
//!
//! The turn also has a number, so what is taken once per turn (the health
//! view the planner reads) knows when it is out of date, and a Unix time in
//! seconds (what memcached's TTLs count in), read from the OS at most once
//! per turn and only when something asks for it.

use std::cell::Cell;
use tokio::time::Instant;

/// Seconds since the Unix epoch (0 if the clock is before it), as memcached's
/// `time` and its absolute exptimes count them; read from the OS now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One worker's turn time (not `Sync`: each worker has its own).
#[derive(Debug)]
pub(crate) struct TurnClock {
    now: Cell<Instant>,
    turn: Cell<u64>,
    /// The turn's Unix time, once something asked for it.
    unix: Cell<Option<u64>>,
    /// When the clock was made: latencies are differences of nanoseconds
    /// since then (see [`TurnClock::nanos`]).
    began: Instant,
    /// The turn's time in nanoseconds since `began`, once something asked.
    nanos: Cell<Option<u64>>,
}

impl TurnClock {
    pub(crate) fn new() -> TurnClock {
        let now = Instant::now();
        TurnClock {
            now: Cell::new(now),
            turn: Cell::new(0),
            unix: Cell::new(None),
            began: now,
            nanos: Cell::new(None),
        }
    }

    /// Reads the OS clock: call once when a task wakes.
    pub(crate) fn tick(&self) -> Instant {
        let now = Instant::now();
        self.now.set(now);
        self.turn.set(self.turn.get().wrapping_add(1));
        self.unix.set(None);
        self.nanos.set(None);
        now
    }

    /// The time of the last [`TurnClock::tick`].
    pub(crate) fn now(&self) -> Instant {
        self.now.get()
    }

    /// Which turn this is: changes with every [`TurnClock::tick`].
    pub(crate) fn turn(&self) -> u64 {
        self.turn.get()
    }

    /// The turn's time as nanoseconds since the clock was made: a request's
    /// latency is the difference of two of these, one subtraction of
    /// integers where two `Instant`s took a checked `timespec` subtraction
    /// and a 128-bit conversion per request.
    pub(crate) fn nanos(&self) -> u64 {
        if let Some(nanos) = self.nanos.get() {
            return nanos;
        }
        let nanos = self.nanos_at(self.now.get());
        self.nanos.set(Some(nanos));
        nanos
    }

    /// `at` as nanoseconds since the clock was made (0 before it).
    pub(crate) fn nanos_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.began).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Seconds since the Unix epoch in this turn.
    pub(crate) fn unix_seconds(&self) -> u64 {
        if let Some(unix) = self.unix.get() {
            return unix;
        }
        let unix = unix_now();
        self.unix.set(Some(unix));
        unix
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

    #[test]
    fn each_tick_is_a_new_turn_with_its_own_unix_time() {
        let clock = TurnClock::new();
        clock.tick();
        let turn = clock.turn();
        let unix = clock.unix_seconds();
        assert!(unix >= unix_now() - 1);
        assert_eq!(clock.unix_seconds(), unix, "read once per turn");
        assert_eq!(clock.turn(), turn);
        clock.tick();
        assert_ne!(clock.turn(), turn);
        assert!(clock.unix_seconds() >= unix);
    }

    #[test]
    fn a_turns_nanos_are_its_time_and_differences_of_them_are_latencies() {
        let clock = TurnClock::new();
        let first = clock.tick();
        let at_first = clock.nanos();
        assert_eq!(at_first, clock.nanos_at(first));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(clock.nanos(), at_first, "the turn's time, not the OS's");
        let second = clock.tick();
        let took = clock.nanos() - at_first;
        assert_eq!(
            u128::from(took),
            second.duration_since(first).as_nanos(),
            "the same as the Instants' difference"
        );
        assert!(took >= 2_000_000);
        // Before the clock was made: 0, never a wrap.
        if let Some(before) = clock.began.checked_sub(std::time::Duration::from_millis(1)) {
            assert_eq!(clock.nanos_at(before), 0);
        }
    }
}
