//! Server health as a pure state machine. No I/O and no clocks here: the
//! caller feeds events with the time they happened (and calls [`Health::tick`]
//! when a retry falls due), and logs the transitions.
//!
//! Two timings, chosen by the `ejection` setting ([`Timing`]):
//! - memring's own ([`Timing::Probe`]): ACTIVE → SUSPECT on a failure, DEAD
//!   after `failure_limit` consecutive failures, SUSPECT again when a probe is
//!   answered (tried, one failure from DEAD), ACTIVE on the first answered
//!   request. Like a member of Loki's ring, a server is never given up on
//!   after one missed beat, and it is back as soon as it answers.
//! - nutcracker 0.5's ([`Timing::Twemproxy`]), so that memring and a
//!   nutcracker side by side eject and return a server at the same moment.
//!   As in its `nc_server.c`: only with `auto_eject` are failures counted at
//!   all; `failure_limit` of them without an answer in between make the
//!   server DEAD (ejected) and reset the count; a DEAD server is not tried and
//!   nothing heard from it counts until `retry_timeout_ms` has passed; then it
//!   is put back untried (SUSPECT, count zero) and judged afresh. An answer
//!   to a request resets the count, as nutcracker's `server_ok` does on every
//!   response; memring's own connection probe does not (nutcracker sends
//!   none).

use std::time::{Duration, Instant};

use crate::error::BackendErrorKind;

/// How a server is doing, as seen by its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// Connected and answering.
    Active,
    /// At least one recent failure; still in the ring and still tried.
    Suspect,
    /// Failed `failure_limit` times in a row; probed with backoff, or (with
    /// twemproxy timing) left alone until its retry is due.
    Dead,
}

impl HealthState {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Active => "ACTIVE",
            HealthState::Suspect => "SUSPECT",
            HealthState::Dead => "DEAD",
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        match self {
            HealthState::Active => 0,
            HealthState::Suspect => 1,
            HealthState::Dead => 2,
        }
    }

    pub(crate) fn from_u8(value: u8) -> HealthState {
        match value {
            0 => HealthState::Active,
            1 => HealthState::Suspect,
            _ => HealthState::Dead,
        }
    }
}

/// Something a connection observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthEvent {
    /// The server answered a client's request.
    Answered,
    /// A new connection's `version` probe was answered: the server is back
    /// enough to be tried, not yet proven.
    Probed,
    /// A connect failed, or a connection broke or timed out.
    Failed(BackendErrorKind),
}

/// How failures are judged and when a DEAD server is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// memring's own: a DEAD server is probed and is back once it answers.
    Probe,
    /// nutcracker 0.5's: failures count only when `eject` (`auto_eject`) is
    /// on, and a DEAD server is left alone for `retry`, then put back untried.
    Twemproxy { eject: bool, retry: Duration },
}

/// The settings a server's health is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Consecutive failures that make a server DEAD (at least one counts).
    pub failure_limit: u32,
    pub timing: Timing,
}

/// The health of one server and the count it is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub state: HealthState,
    pub consecutive_failures: u32,
    /// With twemproxy timing, when a DEAD server goes back into the ring.
    pub retry_at: Option<Instant>,
}

/// A state change, to be logged once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: HealthState,
    pub to: HealthState,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            state: HealthState::Active,
            consecutive_failures: 0,
            retry_at: None,
        }
    }
}

impl Health {
    /// Applies one event that happened at `now`; returns the transition it
    /// caused, if any.
    pub fn on(&mut self, event: HealthEvent, rules: Rules, now: Instant) -> Option<Transition> {
        let from = self.state;
        let limit = rules.failure_limit.max(1);
        match rules.timing {
            Timing::Probe => self.on_probed_timing(event, limit),
            Timing::Twemproxy { eject, retry } => {
                if self.state == HealthState::Dead {
                    if !self.retry_due(now) {
                        // nutcracker sends nothing to an ejected server, so
                        // what memring's own reconnects hear does not count.
                        return None;
                    }
                    self.put_back();
                }
                match event {
                    HealthEvent::Answered => {
                        self.consecutive_failures = 0;
                        self.state = HealthState::Active;
                    }
                    // memring's own probe is no request of a client's:
                    // nutcracker would not have sent it, so it proves
                    // nothing here.
                    HealthEvent::Probed => {}
                    HealthEvent::Failed(_) if !eject => self.state = HealthState::Suspect,
                    HealthEvent::Failed(_) => {
                        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                        if self.consecutive_failures >= limit {
                            self.state = HealthState::Dead;
                            self.consecutive_failures = 0;
                            self.retry_at = Some(now + retry);
                        } else {
                            self.state = HealthState::Suspect;
                        }
                    }
                }
            }
        }
        (from != self.state).then_some(Transition {
            from,
            to: self.state,
        })
    }

    /// With twemproxy timing, puts a DEAD server whose retry is due at `now`
    /// back into the ring (SUSPECT, untried, count zero). Returns that
    /// transition; `None` when nothing is due.
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        if self.state != HealthState::Dead || !self.retry_due(now) {
            return None;
        }
        self.put_back();
        Some(Transition {
            from: HealthState::Dead,
            to: self.state,
        })
    }

    fn retry_due(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|at| now >= at)
    }

    fn put_back(&mut self) {
        self.state = HealthState::Suspect;
        self.consecutive_failures = 0;
        self.retry_at = None;
    }

    fn on_probed_timing(&mut self, event: HealthEvent, limit: u32) {
        match event {
            HealthEvent::Answered => {
                self.consecutive_failures = 0;
                self.state = HealthState::Active;
            }
            HealthEvent::Probed => {
                if self.state == HealthState::Dead {
                    // One more failure makes it DEAD again.
                    self.consecutive_failures = limit - 1;
                    self.state = HealthState::Suspect;
                }
            }
            HealthEvent::Failed(_) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.state = if self.consecutive_failures >= limit {
                    HealthState::Dead
                } else {
                    HealthState::Suspect
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAIL: HealthEvent = HealthEvent::Failed(BackendErrorKind::Timeout);

    fn probe_rules(failure_limit: u32) -> Rules {
        Rules {
            failure_limit,
            timing: Timing::Probe,
        }
    }

    /// nutcracker's defaults: `server_failure_limit: 2`, and a 30 s
    /// `server_retry_timeout`.
    fn twemproxy_rules(eject: bool) -> Rules {
        Rules {
            failure_limit: 2,
            timing: Timing::Twemproxy {
                eject,
                retry: Duration::from_secs(30),
            },
        }
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn one_failure_makes_a_server_suspect_not_dead() {
        let mut health = Health::default();
        assert_eq!(
            health.on(FAIL, probe_rules(3), Instant::now()),
            Some(Transition {
                from: HealthState::Active,
                to: HealthState::Suspect
            })
        );
    }

    #[test]
    fn consecutive_failures_reach_dead_once() {
        let (mut health, now) = (Health::default(), Instant::now());
        health.on(FAIL, probe_rules(3), now);
        assert_eq!(health.on(FAIL, probe_rules(3), now), None);
        assert_eq!(
            health.on(FAIL, probe_rules(3), now).map(|t| t.to),
            Some(HealthState::Dead)
        );
        assert_eq!(
            health.on(FAIL, probe_rules(3), now),
            None,
            "logged once, not per failure"
        );
    }

    #[test]
    fn an_answered_probe_lets_a_dead_server_be_tried_but_not_trusted() {
        let (mut health, now) = (Health::default(), Instant::now());
        for _ in 0..3 {
            health.on(FAIL, probe_rules(3), now);
        }
        assert_eq!(
            health
                .on(HealthEvent::Probed, probe_rules(3), now)
                .map(|t| t.to),
            Some(HealthState::Suspect)
        );
        assert_eq!(
            health.on(FAIL, probe_rules(3), now).map(|t| t.to),
            Some(HealthState::Dead),
            "one failure away"
        );
        let mut active = Health::default();
        assert_eq!(active.on(HealthEvent::Probed, probe_rules(3), now), None);
    }

    #[test]
    fn first_success_makes_a_dead_server_active() {
        let (mut health, now) = (Health::default(), Instant::now());
        for _ in 0..5 {
            health.on(FAIL, probe_rules(3), now);
        }
        let transition = health
            .on(HealthEvent::Answered, probe_rules(3), now)
            .unwrap();
        assert_eq!(transition.to, HealthState::Active);
        assert_eq!(health.consecutive_failures, 0);
        assert_eq!(health.on(HealthEvent::Answered, probe_rules(3), now), None);
        assert_eq!(health.tick(now), None, "memring's timing has no retry");
    }

    #[test]
    fn twemproxy_timing_ejects_at_the_limit_and_retries_exactly_after_the_timeout() {
        let (mut health, t0) = (Health::default(), Instant::now());
        let rules = twemproxy_rules(true);
        assert_eq!(
            health.on(FAIL, rules, at(t0, 0)).map(|t| t.to),
            Some(HealthState::Suspect)
        );
        assert_eq!(
            health.on(FAIL, rules, at(t0, 5)).map(|t| t.to),
            Some(HealthState::Dead),
            "server_failure_limit: 2"
        );
        assert_eq!(health.retry_at, Some(at(t0, 30_005)), "ejected_at + retry");
        assert_eq!(health.consecutive_failures, 0, "reset on ejection");
        // Ejected: nothing counts, and a probe that is answered does not
        // bring it back early.
        assert_eq!(health.on(HealthEvent::Probed, rules, at(t0, 1_000)), None);
        assert_eq!(health.on(HealthEvent::Answered, rules, at(t0, 2_000)), None);
        assert_eq!(health.on(FAIL, rules, at(t0, 3_000)), None);
        assert_eq!(health.tick(at(t0, 30_004)), None, "one millisecond early");
        assert_eq!(health.state, HealthState::Dead);
        assert_eq!(
            health.tick(at(t0, 30_005)),
            Some(Transition {
                from: HealthState::Dead,
                to: HealthState::Suspect
            })
        );
        assert_eq!(
            (health.consecutive_failures, health.retry_at),
            (0, None),
            "put back untried, judged afresh"
        );
        assert_eq!(health.tick(at(t0, 30_006)), None);
        assert_eq!(
            health
                .on(HealthEvent::Answered, rules, at(t0, 30_010))
                .map(|t| t.to),
            Some(HealthState::Active)
        );
    }

    #[test]
    fn twemproxy_timing_ejects_a_retried_server_again_after_limit_failures() {
        let (mut health, t0) = (Health::default(), Instant::now());
        let rules = twemproxy_rules(true);
        health.on(FAIL, rules, at(t0, 0));
        health.on(FAIL, rules, at(t0, 0));
        // The retry was due but nobody ticked: the next event sees it first,
        // and counts against the server put back.
        assert_eq!(
            health.on(FAIL, rules, at(t0, 30_100)).map(|t| t.to),
            Some(HealthState::Suspect)
        );
        assert_eq!(health.state, HealthState::Suspect);
        assert_eq!(health.consecutive_failures, 1);
        assert_eq!(
            health.on(FAIL, rules, at(t0, 30_200)).map(|t| t.to),
            Some(HealthState::Dead)
        );
        assert_eq!(health.retry_at, Some(at(t0, 60_200)), "a fresh timeout");
    }

    #[test]
    fn twemproxy_timing_forgets_failures_on_an_answer_not_on_a_probe() {
        let (mut health, t0) = (Health::default(), Instant::now());
        let rules = Rules {
            failure_limit: 3,
            ..twemproxy_rules(true)
        };
        for (ms, event) in [
            (0, FAIL),
            (1, FAIL),
            (2, HealthEvent::Answered),
            (3, FAIL),
            (4, HealthEvent::Probed),
            (5, FAIL),
        ] {
            health.on(event, rules, at(t0, ms));
        }
        assert_eq!(
            (health.state, health.consecutive_failures),
            (HealthState::Suspect, 2),
            "server_ok on a response reset the count; memring's probe did not"
        );
        assert_eq!(
            health.on(FAIL, rules, at(t0, 6)).map(|t| t.to),
            Some(HealthState::Dead)
        );
    }

    #[test]
    fn twemproxy_timing_without_auto_eject_never_makes_a_server_dead() {
        let (mut health, t0) = (Health::default(), Instant::now());
        let rules = twemproxy_rules(false);
        for ms in 0..100 {
            health.on(FAIL, rules, at(t0, ms));
        }
        // nutcracker ignores server_failure_limit without auto_eject_hosts:
        // the server's keys are tried on every request.
        assert_eq!(health.state, HealthState::Suspect);
        assert_eq!(health.consecutive_failures, 0);
        assert_eq!(health.tick(at(t0, 1_000_000)), None);
        assert_eq!(
            health
                .on(HealthEvent::Answered, rules, at(t0, 200))
                .map(|t| t.to),
            Some(HealthState::Active)
        );
    }
}
