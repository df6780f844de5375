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
//!
//! Times are nanoseconds on the monotonic clock, one integer: a latency is
//! one subtraction, a deadline one addition. Only a timer takes an
//! `Instant`, made where the timer is set ([`TurnClock::instant_at`]).

use std::cell::Cell;
use std::time::Duration;
use tokio::time::Instant;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Seconds since the Unix epoch (0 if the clock is before it), as memcached's
/// `time` and its absolute exptimes count them; read from the OS now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The monotonic clock in nanoseconds, read from the OS now: the clock
/// `Instant` reads (`CLOCK_MONOTONIC` on Linux), but as one integer, so
/// times and latencies are integer arithmetic. An `Instant` is opaque: each
/// conversion of one to a number took a checked `timespec` subtraction and
/// a 128-bit multiplication (about 45 instructions, twice a request).
pub(crate) fn monotonic_nanos() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // Never negative on this clock.
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(NANOS_PER_SEC).saturating_add(nanos)
}

/// `duration` in nanoseconds (`u64::MAX` past 584 years).
pub(crate) fn nanos_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// One worker's turn time (not `Sync`: each worker has its own).
#[derive(Debug)]
pub(crate) struct TurnClock {
    /// The turn's time: [`monotonic_nanos`] at the last tick.
    now: Cell<u64>,
    turn: Cell<u64>,
    /// The turn's Unix time, once something asked for it.
    unix: Cell<Option<u64>>,
    /// One moment read on both clocks, to turn a time in nanoseconds into
    /// the `Instant` a timer takes, and an `Instant` into nanoseconds (the
    /// two reads a few dozen nanoseconds apart).
    began: Instant,
    began_nanos: u64,
}

impl TurnClock {
    pub(crate) fn new() -> TurnClock {
        let began = Instant::now();
        let began_nanos = monotonic_nanos();
        TurnClock {
            now: Cell::new(began_nanos),
            turn: Cell::new(0),
            unix: Cell::new(None),
            began,
            began_nanos,
        }
    }

    /// Reads the OS clock: call once when a task wakes. Returns the turn's
    /// time ([`TurnClock::nanos`]).
    pub(crate) fn tick(&self) -> u64 {
        let now = monotonic_nanos();
        self.now.set(now);
        self.turn.set(self.turn.get().wrapping_add(1));
        self.unix.set(None);
        now
    }

    /// The time of the last [`TurnClock::tick`] in nanoseconds: a
    /// request's latency is the difference of two of these.
    pub(crate) fn nanos(&self) -> u64 {
        self.now.get()
    }

    /// Which turn this is: changes with every [`TurnClock::tick`].
    pub(crate) fn turn(&self) -> u64 {
        self.turn.get()
    }

    /// `at` in this clock's nanoseconds (the clock's start, before it).
    pub(crate) fn nanos_at(&self, at: Instant) -> u64 {
        self.began_nanos
            .saturating_add(nanos_of(at.saturating_duration_since(self.began)))
    }

    /// The `Instant` of `nanos` (a timer's deadline): only where a timer
    /// is set, not per request.
    pub(crate) fn instant_at(&self, nanos: u64) -> Instant {
        self.began + Duration::from_nanos(nanos.saturating_sub(self.began_nanos))
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
        assert_eq!(clock.nanos(), first);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(clock.nanos(), first, "the turn's time, not the OS's");
        let second = clock.tick();
        assert!(second >= first + 2_000_000);
        assert_eq!(clock.nanos(), second);
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

    /// The nanoseconds are the clock `Instant` reads: an `Instant` and its
    /// nanoseconds convert into each other, and their differences agree.
    #[test]
    fn the_nanoseconds_and_instants_are_one_clock() {
        let clock = TurnClock::new();
        let (before, at, after) = (Instant::now(), clock.tick(), Instant::now());
        let slack = 100_000; // 0.1 ms: the two clock reads and a preemption
        assert!(clock.nanos_at(before) <= at + slack);
        assert!(clock.nanos_at(after) + slack >= at);
        let later = at + 5_000_000;
        let instant = clock.instant_at(later);
        assert_eq!(clock.nanos_at(instant), later, "a round trip");
        let gap = clock.instant_at(later) - clock.instant_at(at);
        assert_eq!(nanos_of(gap), 5_000_000);
        // Before the clock was made: its start, never a wrap.
        if let Some(earlier) = clock.began.checked_sub(Duration::from_millis(1)) {
            assert_eq!(clock.nanos_at(earlier), clock.began_nanos);
        }
        assert_eq!(clock.instant_at(0), clock.began);
    }
}
