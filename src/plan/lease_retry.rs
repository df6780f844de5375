//! A client's meta command that met another sidecar's hand-off lease
//! (`protocol::lease`) on the key's owner: to memcached a lease is an item,
//! so an `mg … T` would stretch it to the client's TTL, an `mg … N` would
//! not vivify, an `ma` would find it not a number and an `ms … ME` would not
//! store. To the client a lease is a missing key, so the command removes
//! the lease by its cas (`md <key> C<cas>`) and runs again: it then meets
//! an absent key, as one memcached would show it, or the copy that replaced
//! the lease meanwhile (the `md` then fails on the changed cas), which is
//! the key's value. The lease's own copy, stored by the lease's cas, then
//! fails: a later read misses and reads through again, never a stale value.
//!
//! How a lease is seen: an `mg` reply shows it (the connection asks for the
//! flags, size and cas it needs, and hands the lease's cas over); for `ma`
//! and `ms … ME`, whose replies do not, a refusal an absent key would not
//! get (`CLIENT_ERROR` not a number, `NS`) is followed by a probe of the
//! item (`mg <key> c f s`, seeing leases as items).
//!
//! Pure: replies in, lines out; no I/O, no clock.

use bytes::Bytes;

use super::handoff::{delete_line, not_a_number, probe_line, probed_lease};
use super::route::CallResult;
use crate::protocol::meta::MetaCommand;
use crate::protocol::reply::Expect;

/// How many times a command removes a lease and runs again: another
/// copy may place a new lease right after one was removed, but not for
/// ever; after these, the last answer stands (a lease is a miss to reads).
const MAX_RERUNS: u8 = 3;

/// What a command's refusal suggests a lease behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suspect {
    /// `ma`: `CLIENT_ERROR` not a number.
    NotANumber,
    /// `ms` in add mode: `NS`.
    NotStored,
    /// Only a reply that shows the lease (an `mg`).
    Shown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The command is under way.
    Command,
    /// The probe is under way; the command's refusal is kept.
    Probe,
}

/// The next thing to do for a command that may meet a lease.
#[derive(Debug)]
pub(crate) enum LeaseStep {
    /// The client's answer.
    Answer(CallResult),
    /// Ask the owner for the item, leases shown (`expect`).
    Probe { line: Bytes, expect: Expect },
    /// Remove the lease (`delete`, its reply not wanted), then send the
    /// command again, in that order on the same connection.
    Rerun { delete: Bytes },
}

/// One meta command on one key that may meet a lease (see the module doc).
#[derive(Debug)]
pub(crate) struct LeaseRetry {
    key: Bytes,
    base64: bool,
    suspect: Suspect,
    stage: Stage,
    /// The command's refusal while the probe looks behind it.
    first: Option<CallResult>,
    reruns: u8,
}

impl LeaseRetry {
    /// For a meta command with its flags (`flag(b'T')`: whether it carries
    /// that flag, `mode`: the `ms` mode), or `None` when it cannot meet a
    /// lease in a way its reply would not say as a miss.
    pub(crate) fn for_meta(
        command: MetaCommand,
        key: Bytes,
        base64: bool,
        flag: impl Fn(u8) -> bool,
        mode: Option<u8>,
    ) -> Option<LeaseRetry> {
        let suspect = match command {
            MetaCommand::Get if flag(b'T') || flag(b'N') => Suspect::Shown,
            MetaCommand::Arithmetic => Suspect::NotANumber,
            MetaCommand::Set if matches!(mode, Some(b'E' | b'e')) => Suspect::NotStored,
            _ => return None,
        };
        Some(LeaseRetry {
            key,
            base64,
            suspect,
            stage: Stage::Command,
            first: None,
            reruns: 0,
        })
    }

    /// The reply to what was sent last; `lease`: the cas of the lease the
    /// connection saw in it (an `mg`'s reply).
    pub(crate) fn on_reply(&mut self, result: CallResult, lease: Option<u64>) -> LeaseStep {
        match self.stage {
            Stage::Command => {
                if self.reruns >= MAX_RERUNS {
                    return LeaseStep::Answer(result);
                }
                if let Some(cas) = lease {
                    return self.rerun(cas);
                }
                let refused = match self.suspect {
                    Suspect::NotANumber => not_a_number(&result),
                    Suspect::NotStored => matches!(&result, Ok(reply) if reply.starts_with(b"NS")),
                    Suspect::Shown => false,
                };
                if !refused {
                    return LeaseStep::Answer(result);
                }
                self.stage = Stage::Probe;
                self.first = Some(result);
                LeaseStep::Probe {
                    line: probe_line(&self.key, self.base64),
                    expect: Expect::Meta {
                        command: MetaCommand::Get,
                        quiet: false,
                        replied: false,
                        leases_shown: true,
                    },
                }
            }
            Stage::Probe => {
                let first = self.first.take().unwrap_or(result.clone());
                self.stage = Stage::Command;
                match result.as_deref().ok().and_then(probed_lease) {
                    Some(cas) => self.rerun(cas),
                    None => LeaseStep::Answer(first),
                }
            }
        }
    }

    fn rerun(&mut self, cas: u64) -> LeaseStep {
        self.reruns += 1;
        LeaseStep::Rerun {
            delete: delete_line(&self.key, self.base64, Some(cas)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Bytes::from_static(reply))
    }

    fn retry(command: MetaCommand, flags: &'static [u8], mode: Option<u8>) -> Option<LeaseRetry> {
        LeaseRetry::for_meta(
            command,
            Bytes::from_static(b"k"),
            false,
            |f| flags.contains(&f),
            mode,
        )
    }

    #[test]
    fn only_commands_a_lease_would_mislead_take_part() {
        assert!(retry(MetaCommand::Get, b"v", None).is_none());
        assert!(retry(MetaCommand::Get, b"vT", None).is_some());
        assert!(retry(MetaCommand::Get, b"N", None).is_some());
        assert!(retry(MetaCommand::Arithmetic, b"", None).is_some());
        assert!(retry(MetaCommand::Set, b"", Some(b'S')).is_none());
        assert!(retry(MetaCommand::Set, b"", Some(b'E')).is_some());
        assert!(retry(MetaCommand::Delete, b"", None).is_none());
    }

    #[test]
    fn a_shown_lease_is_removed_by_its_cas_and_the_command_runs_again() {
        let mut mg = retry(MetaCommand::Get, b"N", None).unwrap();
        let LeaseStep::Rerun { delete } = mg.on_reply(ok(b"EN\r\n"), Some(42)) else {
            panic!("a rerun")
        };
        assert_eq!(&delete[..], b"md k C42\r\n");
        let LeaseStep::Answer(answer) = mg.on_reply(ok(b"HD W\r\n"), None) else {
            panic!("the answer")
        };
        assert_eq!(answer.unwrap(), &b"HD W\r\n"[..]);
    }

    #[test]
    fn a_refusal_is_probed_and_stands_unless_a_lease_is_behind_it() {
        let refused: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
        let mut ma = retry(MetaCommand::Arithmetic, b"N", None).unwrap();
        assert!(matches!(
            ma.on_reply(Ok(Bytes::from_static(refused)), None),
            LeaseStep::Probe { .. }
        ));
        let probe = format!("HD c9 f{} s24\r\n", crate::protocol::lease::LEASE_FLAGS);
        let LeaseStep::Rerun { delete } = ma.on_reply(Ok(Bytes::from(probe)), None) else {
            panic!("a rerun")
        };
        assert_eq!(&delete[..], b"md k C9\r\n");
        // Refused again, and this time a value is behind it.
        assert!(matches!(
            ma.on_reply(Ok(Bytes::from_static(refused)), None),
            LeaseStep::Probe { .. }
        ));
        let LeaseStep::Answer(answer) = ma.on_reply(ok(b"HD c10 f0 s3\r\n"), None) else {
            panic!("the refusal")
        };
        assert_eq!(answer.unwrap(), refused);
    }

    #[test]
    fn a_lease_placed_again_and_again_is_left_after_a_few_reruns() {
        let mut mg = retry(MetaCommand::Get, b"T", None).unwrap();
        for _ in 0..MAX_RERUNS {
            assert!(matches!(
                mg.on_reply(ok(b"EN\r\n"), Some(1)),
                LeaseStep::Rerun { .. }
            ));
        }
        assert!(matches!(
            mg.on_reply(ok(b"EN\r\n"), Some(1)),
            LeaseStep::Answer(_)
        ));
    }
}
