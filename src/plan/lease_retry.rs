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

use bytes::{BufMut, Bytes, BytesMut};

use super::handoff::{delete_line, not_a_number, probe_line, probed_lease};
use super::route::CallResult;
use crate::protocol::meta::MetaCommand;
use crate::protocol::reply::Expect;
use crate::protocol::Command;

/// How many times a command removes a lease and runs again: another
/// copy may place a new lease right after one was removed, but not for
/// ever; after these, the last answer stands (a lease is a miss to reads).
const MAX_RERUNS: u8 = 3;

/// What reply suggests a lease behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suspect {
    /// `ma`, `incr`, `decr`: `CLIENT_ERROR` not a number.
    NotANumber,
    /// `ms` in add mode, `add`: `NS`, `NOT_STORED`.
    NotStored,
    /// `cas`: `EXISTS` (a lease's cas is not the client's).
    Exists,
    /// `append`, `prepend`, `ms` in those modes: stored, onto the lease
    /// (which then still is one, its marker at one end).
    Stored,
    /// Only a reply that shows the lease (an `mg`, or a `touch` sent as
    /// one).
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
    /// A classic `touch`, sent as [`LeaseRetry::wire`] (an `mg … T`, whose
    /// reply shows a lease) and answered in its own words.
    touch: Option<Bytes>,
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
            MetaCommand::Set => match mode {
                Some(b'E' | b'e') => Suspect::NotStored,
                Some(b'A' | b'a' | b'P' | b'p') => Suspect::Stored,
                _ => return None,
            },
            _ => return None,
        };
        Some(LeaseRetry::new(key, base64, suspect, None))
    }

    /// For a classic command on `key`; `exptime` is a `touch`'s.
    pub(crate) fn for_classic(
        command: Command,
        key: Bytes,
        exptime: Option<&[u8]>,
    ) -> Option<LeaseRetry> {
        let suspect = match command {
            Command::Add => Suspect::NotStored,
            Command::Incr | Command::Decr => Suspect::NotANumber,
            Command::Cas => Suspect::Exists,
            Command::Append | Command::Prepend => Suspect::Stored,
            Command::Touch => {
                let exptime = exptime.filter(|e| {
                    let digits = e.strip_prefix(b"-").unwrap_or(e);
                    !digits.is_empty()
                        && digits.len() <= 11
                        && digits.iter().all(u8::is_ascii_digit)
                })?;
                let mut line = BytesMut::with_capacity(key.len() + exptime.len() + 8);
                line.put_slice(b"mg ");
                line.put_slice(&key);
                line.put_slice(b" T");
                line.put_slice(exptime);
                line.put_slice(b"\r\n");
                let mut retry = LeaseRetry::new(key, false, Suspect::Shown, None);
                retry.touch = Some(line.freeze());
                return Some(retry);
            }
            _ => return None,
        };
        Some(LeaseRetry::new(key, false, suspect, None))
    }

    fn new(key: Bytes, base64: bool, suspect: Suspect, touch: Option<Bytes>) -> LeaseRetry {
        LeaseRetry {
            key,
            base64,
            suspect,
            stage: Stage::Command,
            first: None,
            reruns: 0,
            touch,
        }
    }

    /// What goes to the server instead of the client's request, and how
    /// its reply is framed (a classic `touch`), or `None`: the request.
    pub(crate) fn wire(&self) -> Option<(Bytes, Expect)> {
        let line = self.touch.clone()?;
        Some((line, Expect::meta(MetaCommand::Get, false)))
    }

    /// The client's answer: a `touch` sent as an `mg` in classic words.
    fn answer(&self, result: CallResult) -> LeaseStep {
        if self.touch.is_none() {
            return LeaseStep::Answer(result);
        }
        LeaseStep::Answer(result.map(|reply| {
            if reply.starts_with(b"HD") {
                Bytes::from_static(b"TOUCHED\r\n")
            } else if reply.starts_with(b"EN") {
                Bytes::from_static(b"NOT_FOUND\r\n")
            } else {
                reply
            }
        }))
    }

    /// The reply to what was sent last; `lease`: the cas of the lease the
    /// connection saw in it (an `mg`'s reply).
    pub(crate) fn on_reply(&mut self, result: CallResult, lease: Option<u64>) -> LeaseStep {
        match self.stage {
            Stage::Command => {
                if self.reruns >= MAX_RERUNS {
                    return self.answer(result);
                }
                if let Some(cas) = lease {
                    return self.rerun(cas);
                }
                let reply = result.as_deref().unwrap_or_default();
                let refused = match self.suspect {
                    Suspect::NotANumber => not_a_number(&result),
                    Suspect::NotStored => {
                        reply.starts_with(b"NS") || reply.starts_with(b"NOT_STORED")
                    }
                    Suspect::Exists => reply.starts_with(b"EXISTS"),
                    // Quiet: an `ms` that stored says nothing.
                    Suspect::Stored => {
                        result.is_ok()
                            && (reply.is_empty()
                                || reply.starts_with(b"HD")
                                || reply.starts_with(b"STORED"))
                    }
                    Suspect::Shown => false,
                };
                if !refused {
                    return self.answer(result);
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
                    None => self.answer(first),
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
    fn a_touch_goes_as_an_mg_that_shows_a_lease_and_answers_in_its_words() {
        let mut touch =
            LeaseRetry::for_classic(Command::Touch, Bytes::from_static(b"k"), Some(b"-1")).unwrap();
        assert_eq!(&touch.wire().unwrap().0[..], b"mg k T-1\r\n");
        assert!(matches!(
            touch.on_reply(ok(b"EN\r\n"), Some(3)),
            LeaseStep::Rerun { .. }
        ));
        let LeaseStep::Answer(answer) = touch.on_reply(ok(b"EN\r\n"), None) else {
            panic!("the answer")
        };
        assert_eq!(answer.unwrap(), &b"NOT_FOUND\r\n"[..]);
        let mut touch =
            LeaseRetry::for_classic(Command::Touch, Bytes::from_static(b"k"), Some(b"9")).unwrap();
        let LeaseStep::Answer(answer) = touch.on_reply(ok(b"HD\r\n"), None) else {
            panic!("the answer")
        };
        assert_eq!(answer.unwrap(), &b"TOUCHED\r\n"[..]);
        // An exptime memcached would refuse: the touch goes as it is.
        assert!(
            LeaseRetry::for_classic(Command::Touch, Bytes::from_static(b"k"), Some(b"x")).is_none()
        );
    }

    #[test]
    fn an_append_that_stored_is_probed_for_a_lease_it_extended() {
        let mut append =
            LeaseRetry::for_classic(Command::Append, Bytes::from_static(b"k"), None).unwrap();
        assert!(matches!(
            append.on_reply(ok(b"STORED\r\n"), None),
            LeaseStep::Probe { .. }
        ));
        let probe = format!("HD c4 f{} s27\r\n", crate::protocol::lease::LEASE_FLAGS);
        assert!(matches!(
            append.on_reply(Ok(Bytes::from(probe)), None),
            LeaseStep::Rerun { .. }
        ));
        let LeaseStep::Answer(answer) = append.on_reply(ok(b"NOT_STORED\r\n"), None) else {
            panic!("the answer")
        };
        assert_eq!(answer.unwrap(), &b"NOT_STORED\r\n"[..]);
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
