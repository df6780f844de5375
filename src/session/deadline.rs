//! When a session is closed for want of progress: the client stopped
//! reading its replies (`write_timeout`), sent nothing for `idle_timeout`
//! while owed nothing, or has sat on an incomplete request that long. Pure:
//! the loop says what happened and when, and asks for the next deadline.
//! Times and timeouts are nanoseconds of the worker's clock
//! (`runtime::clock`): each turn's deadline is integer arithmetic.

use std::time::Duration;

use crate::runtime::clock::nanos_of;

/// What the session's loop knows of the client's progress.
#[derive(Debug, Clone, Copy)]
pub(super) struct Progress {
    last_read: u64,
    last_write: u64,
    /// When the incomplete request at the head of the input began. The
    /// idle timeout runs from here, not from the last read: a client
    /// trickling a request byte by byte reads as busy but never completes
    /// it.
    partial_since: u64,
    /// The session's timeouts, in nanoseconds.
    idle_timeout: Option<u64>,
    write_timeout: u64,
}

/// The session's state when it is about to wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    /// Reply bytes wait to be written to the client.
    pub(super) writing: bool,
    /// No request is in progress and no reply is queued.
    pub(super) owed_nothing: bool,
    /// Part of a request has been read.
    pub(super) partial_input: bool,
}

impl Progress {
    pub(super) fn new(
        now: u64,
        idle_timeout: Option<Duration>,
        write_timeout: Duration,
    ) -> Progress {
        Progress {
            last_read: now,
            last_write: now,
            partial_since: now,
            idle_timeout: idle_timeout.map(nanos_of),
            write_timeout: nanos_of(write_timeout),
        }
    }

    /// Bytes were read; `first` when they began a request.
    pub(super) fn read(&mut self, now: u64, first: bool) {
        self.last_read = now;
        if first {
            self.partial_since = now;
        }
    }

    /// A complete request was taken from the input: what is left began now.
    pub(super) fn parsed(&mut self, now: u64) {
        self.partial_since = now;
    }

    /// Bytes were written, or nothing is left to write.
    pub(super) fn wrote(&mut self, now: u64) {
        self.last_write = now;
    }

    /// When the session closes unless something happens first: `None`
    /// while it waits for servers (that is not the client's idleness).
    pub(super) fn deadline(&self, waiting: Waiting) -> Option<u64> {
        if waiting.writing {
            return Some(self.last_write.saturating_add(self.write_timeout));
        }
        let idle = self.idle_timeout?;
        if waiting.partial_input {
            Some(self.partial_since.saturating_add(idle))
        } else if waiting.owed_nothing {
            Some(self.last_read.saturating_add(idle))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Option<Duration> = Some(Duration::from_secs(10));
    const WRITE: Duration = Duration::from_secs(3);
    /// Any time on the clock.
    const T0: u64 = 7 * 86_400 * 1_000_000_000;

    const fn secs(n: u64) -> u64 {
        n * 1_000_000_000
    }

    fn state(writing: bool, owed_nothing: bool, partial_input: bool) -> Waiting {
        Waiting {
            writing,
            owed_nothing,
            partial_input,
        }
    }

    #[test]
    fn a_client_not_reading_its_replies_has_the_write_timeout() {
        let t0 = T0;
        let mut progress = Progress::new(t0, IDLE, WRITE);
        progress.wrote(t0 + secs(5));
        for waiting in [state(true, false, false), state(true, true, true)] {
            assert_eq!(progress.deadline(waiting), Some(t0 + secs(8)));
            assert_eq!(
                Progress {
                    idle_timeout: None,
                    ..progress
                }
                .deadline(waiting),
                Some(t0 + secs(8)),
                "with no idle timeout too"
            );
        }
    }

    #[test]
    fn an_idle_client_owed_nothing_has_the_idle_timeout_from_its_last_read() {
        let t0 = T0;
        let mut progress = Progress::new(t0, IDLE, WRITE);
        progress.read(t0 + secs(2), true);
        assert_eq!(
            progress.deadline(state(false, true, false)),
            Some(t0 + secs(12))
        );
        assert_eq!(
            Progress {
                idle_timeout: None,
                ..progress
            }
            .deadline(state(false, true, false)),
            None
        );
    }

    #[test]
    fn waiting_for_servers_is_not_idleness() {
        let progress = Progress::new(T0, IDLE, WRITE);
        assert_eq!(progress.deadline(state(false, false, false)), None);
    }

    #[test]
    fn a_request_trickled_byte_by_byte_times_out_from_its_first_byte() {
        let t0 = T0;
        let mut progress = Progress::new(t0, IDLE, WRITE);
        progress.read(t0 + secs(1), true);
        for s in 2..9 {
            progress.read(t0 + secs(s), false);
        }
        assert_eq!(
            progress.deadline(state(false, true, true)),
            Some(t0 + secs(11))
        );
        // Owed replies do not shelter it either.
        assert_eq!(
            progress.deadline(state(false, false, true)),
            Some(t0 + secs(11))
        );
        // Once a request completes, the rest of the input starts anew.
        progress.parsed(t0 + secs(9));
        assert_eq!(
            progress.deadline(state(false, false, true)),
            Some(t0 + secs(19))
        );
    }
}
