//! Server health as a pure state machine: ACTIVE → SUSPECT on a failure, DEAD
//! after enough consecutive failures, SUSPECT again when a probe is answered
//! (tried, one failure from DEAD), ACTIVE on the first answered request. Like a
//! member of Loki's ring, a server is never given up on after one missed beat.
//! No I/O and no clocks here: the caller feeds events and logs transitions.

use crate::error::BackendErrorKind;

/// How a server is doing, as seen by its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// Connected and answering.
    Active,
    /// At least one recent failure; still in the ring and still tried.
    Suspect,
    /// Failed `failure_limit` times in a row; probed with backoff.
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

/// The health of one server and the count it is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub state: HealthState,
    pub consecutive_failures: u32,
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
        }
    }
}

impl Health {
    /// Applies one event; returns the transition it caused, if any.
    /// `failure_limit` consecutive failures make a server DEAD.
    pub fn on(&mut self, event: HealthEvent, failure_limit: u32) -> Option<Transition> {
        let from = self.state;
        match event {
            HealthEvent::Answered => {
                self.consecutive_failures = 0;
                self.state = HealthState::Active;
            }
            HealthEvent::Probed => {
                if self.state == HealthState::Dead {
                    // One more failure makes it DEAD again.
                    self.consecutive_failures = failure_limit.max(1) - 1;
                    self.state = HealthState::Suspect;
                }
            }
            HealthEvent::Failed(_) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.state = if self.consecutive_failures >= failure_limit.max(1) {
                    HealthState::Dead
                } else {
                    HealthState::Suspect
                };
            }
        }
        (from != self.state).then_some(Transition {
            from,
            to: self.state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAIL: HealthEvent = HealthEvent::Failed(BackendErrorKind::Timeout);

    #[test]
    fn one_failure_makes_a_server_suspect_not_dead() {
        let mut health = Health::default();
        assert_eq!(
            health.on(FAIL, 3),
            Some(Transition {
                from: HealthState::Active,
                to: HealthState::Suspect
            })
        );
    }

    #[test]
    fn consecutive_failures_reach_dead_once() {
        let mut health = Health::default();
        health.on(FAIL, 3);
        assert_eq!(health.on(FAIL, 3), None);
        assert_eq!(health.on(FAIL, 3).map(|t| t.to), Some(HealthState::Dead));
        assert_eq!(health.on(FAIL, 3), None, "logged once, not per failure");
    }

    #[test]
    fn an_answered_probe_lets_a_dead_server_be_tried_but_not_trusted() {
        let mut health = Health::default();
        for _ in 0..3 {
            health.on(FAIL, 3);
        }
        assert_eq!(
            health.on(HealthEvent::Probed, 3).map(|t| t.to),
            Some(HealthState::Suspect)
        );
        assert_eq!(
            health.on(FAIL, 3).map(|t| t.to),
            Some(HealthState::Dead),
            "one failure away"
        );
        let mut active = Health::default();
        assert_eq!(active.on(HealthEvent::Probed, 3), None);
    }

    #[test]
    fn first_success_makes_a_dead_server_active() {
        let mut health = Health::default();
        for _ in 0..5 {
            health.on(FAIL, 3);
        }
        let transition = health.on(HealthEvent::Answered, 3).unwrap();
        assert_eq!(transition.to, HealthState::Active);
        assert_eq!(health.consecutive_failures, 0);
        assert_eq!(health.on(HealthEvent::Answered, 3), None);
    }
}
