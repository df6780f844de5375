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
//! item (`mg <key> c f s`, seeing leases as items). A command that would
//! act on a lease and leave nothing to see afterwards (`delete`, `md`,
//! `replace`, `ms … MR`, `ms … C`, `gat`, `append`, `prepend`) probes
//! first: a lease found is removed before the command runs.
//!
//! Pure: replies in, lines out; no I/O, no clock.

use bytes::{BufMut, Bytes, BytesMut};

// `handoff`'s `CallResult` (the same as `route`'s): `route` asks the
// `leased_*` functions while planning, so this module must not import it.
use super::handoff::{
    delete_line, not_a_number, probe_hand_back, probe_line, probed_lease, CallResult,
};
use crate::pools::topology::Topology;
use crate::protocol::meta::{MetaCommand, MetaRequest};
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::Expect;
use crate::protocol::{Command, Request};

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
    /// `append`, `prepend`, `ms` in those modes: stored, onto the lease
    /// (which then still is one, its marker at one end).
    Stored,
    /// Only a reply that shows the lease (an `mg`, or a `touch` sent as
    /// one).
    Shown,
    /// Nothing after the command shows a lease it acted on (a `delete`
    /// removed it, a `replace` or `gat` replaced or stretched it): the
    /// probe goes first.
    Hidden,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The probe before the command is under way ([`Suspect::Hidden`],
    /// and appends, which may meet a lease before and after).
    Opening,
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
    /// The opening probe found no lease: send the command.
    Send,
    /// Send `line` (its reply not wanted: the probe's recache token given
    /// back, see `handoff::probe_hand_back`), then answer.
    AnswerAfter { line: Bytes, answer: CallResult },
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
    /// A one-key `gat`/`gats`: its reply is framed as `VALUE` blocks and
    /// the client's answer ends with the `END` memring writes.
    retrieval: bool,
    /// Such a `gat` as one run of a retrieval across pools: `Some(last)`.
    /// Its answer then is its value alone (a failure a miss: no error line
    /// may follow values another run wrote), and only the last run's ends
    /// with `END`.
    run: Option<bool>,
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
            MetaCommand::Delete => Suspect::Hidden,
            // A lease's cas is never the client's: `EX` where an absent key
            // gets `NF`.
            MetaCommand::Set if flag(b'C') => Suspect::Hidden,
            MetaCommand::Set => match mode {
                Some(b'E' | b'e') => Suspect::NotStored,
                Some(b'A' | b'a' | b'P' | b'p') => Suspect::Stored,
                Some(b'R' | b'r') => Suspect::Hidden,
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
            Command::Append | Command::Prepend => Suspect::Stored,
            // A `cas` whose number happens to be the lease's (another
            // server's cas, from before the key moved) would store.
            Command::Delete | Command::Replace | Command::Cas => Suspect::Hidden,
            Command::Gat | Command::Gats => {
                let mut retry = LeaseRetry::new(key, false, Suspect::Hidden, None);
                retry.retrieval = true;
                return Some(retry);
            }
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
                // The cas, to give back a recache token the `mg` took (a
                // classic `touch` takes none).
                line.put_slice(b" c\r\n");
                let mut retry = LeaseRetry::new(key, false, Suspect::Shown, None);
                retry.touch = Some(line.freeze());
                return Some(retry);
            }
            _ => return None,
        };
        Some(LeaseRetry::new(key, false, suspect, None))
    }

    fn new(key: Bytes, base64: bool, suspect: Suspect, touch: Option<Bytes>) -> LeaseRetry {
        // An append onto a lease keeps it one (its marker at one end) and is
        // seen after; two, at both ends, would make it a value: so appends
        // look before too.
        let stage = match suspect {
            Suspect::Hidden | Suspect::Stored => Stage::Opening,
            _ => Stage::Command,
        };
        LeaseRetry {
            key,
            base64,
            suspect,
            stage,
            first: None,
            reruns: 0,
            touch,
            retrieval: false,
            run: None,
        }
    }

    /// What goes to the server before the command: the probe of a command
    /// that looks for a lease first.
    pub(crate) fn opening(&self) -> Option<(Bytes, Expect)> {
        (self.stage == Stage::Opening).then(|| (probe_line(&self.key, self.base64), probe_expect()))
    }

    /// Whether the command's reply is framed as a retrieval's `VALUE`
    /// blocks (a one-key `gat`/`gats`).
    pub(crate) fn is_retrieval(&self) -> bool {
        self.retrieval
    }

    /// Makes a one-key `gat`'s answer one run of a retrieval across pools
    /// (`last`: the run that ends the reply); a no-op for other commands.
    pub(crate) fn run_of_reply(&mut self, last: bool) {
        if self.retrieval {
            self.run = Some(last);
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
        if let (true, Some(last)) = (self.retrieval, self.run) {
            return LeaseStep::Answer(Ok(run_answer(result, last)));
        }
        if self.retrieval {
            // The connection hands on the `VALUE` block (or nothing, for a
            // miss: `End`) without the `END`, which is memring's to write.
            return LeaseStep::Answer(result.map(|reply| {
                if matches!(reply.outcome, Outcome::End | Outcome::Value) {
                    // A hit stays a hit with its `END`; a miss is the `END`.
                    let said = match reply.outcome {
                        Outcome::Value => Outcome::Value,
                        _ => Outcome::End,
                    };
                    Reply::new(said, with_end(&reply))
                } else {
                    reply
                }
            }));
        }
        if self.touch.is_none() {
            return LeaseStep::Answer(result);
        }
        LeaseStep::Answer(result.map(|reply| match reply.outcome {
            Outcome::Hd => Reply::new(Outcome::Touched, Bytes::from_static(b"TOUCHED\r\n")),
            Outcome::En => Reply::new(Outcome::NotFound, Bytes::from_static(b"NOT_FOUND\r\n")),
            _ => reply,
        }))
    }

    /// The reply to what was sent last; `lease`: the cas of the lease the
    /// connection saw in it (an `mg`'s reply).
    pub(crate) fn on_reply(&mut self, result: CallResult, lease: Option<u64>) -> LeaseStep {
        match self.stage {
            Stage::Opening => {
                self.stage = Stage::Command;
                match result.as_ref().ok().and_then(probed_lease) {
                    Some(cas) => self.rerun(cas),
                    // No lease, or the probe failed: the command goes as it
                    // would have without one (after the token the probe
                    // took, if it took one).
                    None => match self.hand_back(&result) {
                        Some(line) => LeaseStep::Rerun { delete: line },
                        None => LeaseStep::Send,
                    },
                }
            }
            Stage::Command => {
                if self.reruns >= MAX_RERUNS {
                    return self.answer(result);
                }
                if let Some(cas) = lease {
                    return self.rerun(cas);
                }
                let outcome = result.as_ref().map(|reply| reply.outcome).ok();
                let refused = match self.suspect {
                    Suspect::NotANumber => not_a_number(&result),
                    Suspect::NotStored => outcome.is_some_and(Outcome::not_stored),
                    // Quiet: an `ms` that stored says nothing.
                    Suspect::Stored => matches!(
                        outcome,
                        Some(Outcome::Nothing | Outcome::Hd | Outcome::Stored)
                    ),
                    Suspect::Shown | Suspect::Hidden => false,
                };
                if !refused {
                    let hand_back = self.touch.as_ref().and_then(|_| self.hand_back(&result));
                    return match (hand_back, self.answer(result)) {
                        (Some(line), LeaseStep::Answer(answer)) => {
                            LeaseStep::AnswerAfter { line, answer }
                        }
                        (_, step) => step,
                    };
                }
                self.stage = Stage::Probe;
                self.first = Some(result);
                LeaseStep::Probe {
                    line: probe_line(&self.key, self.base64),
                    expect: probe_expect(),
                }
            }
            Stage::Probe => {
                let first = self.first.take().unwrap_or(result.clone());
                self.stage = Stage::Command;
                match result.as_ref().ok().and_then(probed_lease) {
                    Some(cas) => self.rerun(cas),
                    None => match (self.hand_back(&result), self.answer(first)) {
                        (Some(line), LeaseStep::Answer(answer)) => {
                            LeaseStep::AnswerAfter { line, answer }
                        }
                        (_, step) => step,
                    },
                }
            }
        }
    }

    /// The line that gives back a recache token the probe took.
    fn hand_back(&self, probed: &CallResult) -> Option<Bytes> {
        let reply = probed.as_ref().ok()?;
        probe_hand_back(reply, &self.key, self.base64)
    }

    fn rerun(&mut self, cas: u64) -> LeaseStep {
        self.reruns += 1;
        LeaseStep::Rerun {
            delete: delete_line(&self.key, self.base64, Some(cas)),
        }
    }
}

/// A one-key `gat`'s answer as one run of a retrieval across pools: its
/// `VALUE` block if it hit, a miss otherwise (a failure too, as a
/// retrieval's run reads it), and the `END` when it is the `last` run.
fn run_answer(result: CallResult, last: bool) -> Reply {
    match result {
        Ok(reply) if reply.outcome == Outcome::Value => {
            let bytes = if last { with_end(&reply) } else { reply.bytes };
            Reply::new(Outcome::Value, bytes)
        }
        _ => {
            let end: &'static [u8] = if last { b"END\r\n" } else { b"" };
            Reply::new(Outcome::End, Bytes::from_static(end))
        }
    }
}

/// `block` (a `VALUE` block, or nothing for a miss) closed by the `END`
/// memring writes after a retrieval's values.
fn with_end(block: &[u8]) -> Bytes {
    let mut answer = BytesMut::with_capacity(block.len() + 5);
    answer.put_slice(block);
    answer.put_slice(b"END\r\n");
    answer.freeze()
}

/// How a meta request on its key's owner is answered: as the owner answers,
/// or, during a hand-off window (when other sidecars' copies may have left
/// leases) for a command a lease would mislead, with the lease removed and
/// the command run again (see the module doc). Such a command waits for its
/// answer before the client's next request goes out, so only inside a
/// window. The planner asks it of every meta request its placement put on
/// the owner alone (an `mg` that may meet a lease is not planned as a
/// retrieval), and asks [`leased_classic`] and [`leased_gat`] of classic
/// ones.
pub(crate) fn leased_meta(
    request: &MetaRequest,
    bytes: &Bytes,
    topology: &Topology,
) -> Option<LeaseRetry> {
    topology.previous.as_ref()?;
    let key = bytes.slice_ref(request.key_token(bytes));
    let has = |flag| request.flags(bytes).any(|(f, _)| f == flag);
    LeaseRetry::for_meta(request.command, key, request.base64, has, request.mode)
}

/// [`leased_meta`] for a classic one-line command on its key's owner (a
/// `touch` is sent as an `mg … T`, see [`LeaseRetry::wire`]). The planner
/// asks it of a request its placement put on the owner alone.
pub(crate) fn leased_classic(
    request: &Request,
    bytes: &Bytes,
    topology: &Topology,
) -> Option<LeaseRetry> {
    // A `set` never meets a lease: the common write in a window skips the
    // key and the line below.
    if topology.previous.is_none() || request.keys.len() != 1 || request.command == Command::Set {
        return None;
    }
    let key = bytes.slice_ref(request.key(bytes, 0));
    // Only a `touch` sends its exptime on (as an `mg`'s `T`).
    let exptime = (request.command == Command::Touch)
        .then(|| {
            let line = &bytes[..(request.args_end as usize).min(bytes.len())];
            line.split(|&b| b == b' ')
                .filter(|token| !token.is_empty())
                .nth(2)
        })
        .flatten();
    LeaseRetry::for_classic(request.command, key, exptime)
}

/// [`leased_meta`] for a one-key `gat`/`gats` of a key that did not move:
/// a lease there would be stretched to the client's TTL, so it is looked
/// for and removed first (a moved key's read-through takes a lease over).
/// The planner asks it of a retrieval asked of its key's owner alone
/// (`Retrieval::lone_owner`).
pub(crate) fn leased_gat(
    request: &Request,
    bytes: &Bytes,
    topology: &Topology,
) -> Option<LeaseRetry> {
    if topology.previous.is_none()
        || request.keys.len() != 1
        || !matches!(request.command, Command::Gat | Command::Gats)
    {
        return None;
    }
    let key = bytes.slice_ref(request.key(bytes, 0));
    LeaseRetry::for_classic(request.command, key, None)
}

/// How a probe's reply is framed: a lease shows as the item it is.
pub(crate) fn probe_expect() -> Expect {
    Expect::Meta {
        command: MetaCommand::Get,
        quiet: false,
        replied: false,
        leases_shown: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(crate::protocol::outcome::Reply::from_static(reply))
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
        assert!(retry(MetaCommand::Delete, b"", None).is_some());
        assert!(retry(MetaCommand::Set, b"", Some(b'R')).is_some());
        assert!(retry(MetaCommand::Set, b"C", Some(b'S')).is_some());
        assert!(retry(MetaCommand::Noop, b"", None).is_none());
    }

    #[test]
    fn a_gat_run_of_a_reply_across_pools_ends_only_when_last_and_never_with_an_error() {
        // `run`: `None` for a whole reply, `Some(last)` for a run of one.
        let answer = |run: Option<bool>, reply: CallResult| {
            let mut gat =
                LeaseRetry::for_classic(Command::Gat, Bytes::from_static(b"k"), None).unwrap();
            if let Some(last) = run {
                gat.run_of_reply(last);
            }
            // The opening probe finds no lease: the `gat` goes.
            assert!(matches!(gat.on_reply(ok(b"EN\r\n"), None), LeaseStep::Send));
            match gat.on_reply(reply, None) {
                LeaseStep::Answer(answer) => answer,
                other => panic!("{other:?}"),
            }
        };
        let hit = || {
            Ok(Reply::new(
                Outcome::Value,
                Bytes::from_static(b"VALUE k 0 1\r\nv\r\n"),
            ))
        };
        let miss = || Ok(Reply::new(Outcome::End, Bytes::new()));
        let failed = || {
            Err(crate::error::BackendError {
                server: "s1".into(),
                kind: crate::error::BackendErrorKind::Timeout,
            })
        };
        let text = |answer: CallResult| String::from_utf8(answer.unwrap().bytes.to_vec()).unwrap();
        assert_eq!(text(answer(None, hit())), "VALUE k 0 1\r\nv\r\nEND\r\n");
        assert_eq!(text(answer(None, miss())), "END\r\n");
        assert!(answer(None, failed()).is_err());
        assert_eq!(text(answer(Some(false), hit())), "VALUE k 0 1\r\nv\r\n");
        assert_eq!(text(answer(Some(false), miss())), "");
        assert_eq!(text(answer(Some(false), failed())), "");
        assert_eq!(
            text(answer(Some(true), hit())),
            "VALUE k 0 1\r\nv\r\nEND\r\n"
        );
        assert_eq!(text(answer(Some(true), miss())), "END\r\n");
        assert_eq!(text(answer(Some(true), failed())), "END\r\n");
        // A run's hit is a hit, its miss or failure a miss.
        assert_eq!(answer(Some(false), hit()).unwrap().outcome, Outcome::Value);
        assert_eq!(answer(Some(true), failed()).unwrap().outcome, Outcome::End);
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
            ma.on_reply(Ok(Reply::from_static(refused)), None),
            LeaseStep::Probe { .. }
        ));
        let probe = format!("HD c9 f{} s24\r\n", crate::protocol::lease::LEASE_FLAGS);
        let LeaseStep::Rerun { delete } = ma.on_reply(Ok(Reply::made(Bytes::from(probe))), None)
        else {
            panic!("a rerun")
        };
        assert_eq!(&delete[..], b"md k C9\r\n");
        // Refused again, and this time a value is behind it.
        assert!(matches!(
            ma.on_reply(Ok(Reply::from_static(refused)), None),
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
        assert_eq!(&touch.wire().unwrap().0[..], b"mg k T-1 c\r\n");
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
        // Looked at first (nothing there), then sent.
        assert_eq!(&append.opening().unwrap().0[..], b"mg k c f s u\r\n");
        assert!(matches!(
            append.on_reply(ok(b"EN\r\n"), None),
            LeaseStep::Send
        ));
        assert!(matches!(
            append.on_reply(ok(b"STORED\r\n"), None),
            LeaseStep::Probe { .. }
        ));
        let probe = format!("HD c4 f{} s27\r\n", crate::protocol::lease::LEASE_FLAGS);
        assert!(matches!(
            append.on_reply(Ok(Reply::made(Bytes::from(probe))), None),
            LeaseStep::Rerun { .. }
        ));
        let LeaseStep::Answer(answer) = append.on_reply(ok(b"NOT_STORED\r\n"), None) else {
            panic!("the answer")
        };
        assert_eq!(answer.unwrap(), &b"NOT_STORED\r\n"[..]);
    }

    #[test]
    fn a_command_that_would_hide_a_lease_looks_first_and_gives_back_a_won_token() {
        for command in [
            Command::Delete,
            Command::Replace,
            Command::Cas,
            Command::Gat,
        ] {
            let mut retry =
                LeaseRetry::for_classic(command, Bytes::from_static(b"k"), None).unwrap();
            assert!(retry.opening().is_some(), "{command:?}");
            let lease = format!("HD c9 f{} s24\r\n", crate::protocol::lease::LEASE_FLAGS);
            let LeaseStep::Rerun { delete } =
                retry.on_reply(Ok(Reply::made(Bytes::from(lease))), None)
            else {
                panic!("{command:?}: the lease removed first")
            };
            assert_eq!(&delete[..], b"md k C9\r\n");
        }
        // A stale item: the look won its recache token, which goes back
        // before the command runs.
        let mut delete =
            LeaseRetry::for_classic(Command::Delete, Bytes::from_static(b"k"), None).unwrap();
        let LeaseStep::Rerun { delete: hand_back } =
            delete.on_reply(ok(b"HD c4 f0 s1 X W\r\n"), None)
        else {
            panic!("the token given back")
        };
        assert_eq!(&hand_back[..], b"md k I C4\r\n");
        let mut gat =
            LeaseRetry::for_classic(Command::Gat, Bytes::from_static(b"k"), None).unwrap();
        assert!(gat.is_retrieval());
        assert!(matches!(
            gat.on_reply(ok(b"HD c4 f0 s1\r\n"), None),
            LeaseStep::Send
        ));
        // A miss, as the connection hands it over: no bytes, `End`.
        let miss = Ok(Reply::new(Outcome::End, Bytes::new()));
        let LeaseStep::Answer(answer) = gat.on_reply(miss, None) else {
            panic!("the answer")
        };
        assert_eq!(answer.unwrap(), &b"END\r\n"[..]);
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
