//! One interface for the plan's multi-step machines, so the session drives
//! them all with one loop: a machine says what to send next (each message
//! to its server, with its framing, whether its reply comes back and
//! whether it carries the client's write), takes the replies of what it
//! sent all at once, and ends with the client's answer. A machine that
//! reads over several servers ([`ReadSteps`]) takes each reply as it comes
//! instead, in any order ([`Machine::one_by_one`]), may ask several servers
//! at once beyond those first reserved for ([`Message::grows`]), and may
//! answer before every server asked has: the later replies are dropped.
//!
//! Every machine here wraps a pure one of its own module (its logic and
//! tests stay there) with the bytes its messages need, so the session
//! neither builds a machine's lines nor knows its step type.
//!
//! Pure: replies in, messages out; no I/O, no clock.

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::plan::handoff::{probe_line, Moved, Owner, ReadCopy, Step, Tally};
use crate::plan::lease_retry::{probe_expect, LeaseRetry, LeaseStep};
use crate::plan::meta_read::{MetaRead, ReadStep, ReadTally};
use crate::plan::replicated_add::{AddAnswer, AddStep, ReplicatedAdd};
use crate::plan::replicated_cas::{CasStep, ReplicatedCas};
use crate::plan::route::CallResult;
use crate::protocol::encode::{delete_by_cas, Outbound};
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::Expect;

/// One request a machine sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) server: usize,
    pub(crate) wire: Outbound,
    pub(crate) expect: Expect,
    /// Its reply comes back to the machine; without, no reply is wanted
    /// (a failure there is counted by its backend).
    pub(crate) awaited: bool,
    /// It writes the client's value (or decides whether it is written):
    /// the request's hot-key guard watches it.
    pub(crate) watched: bool,
    /// It asks a server beside those the work's first step reserved reply
    /// bytes for (an `mg` asking every other zone at once): the
    /// reservation grows by one reply.
    pub(crate) grows: bool,
}

/// What one step sends, in order (two to one server go on its connection
/// in this order). Most steps send one message: held inline.
pub(crate) type Messages = SmallVec<[Message; 1]>;

/// What a machine asks for next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send these; the replies of the awaited ones come back together, in
    /// this order (at once when none is awaited).
    Send(Messages),
    /// The client's answer: nothing more is sent.
    Answer(Answer),
}

/// A machine's answer, in terms either dialect writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A reply (or a server's failure), as it is written to the client.
    Reply(CallResult),
    /// Too few replicas stored: the servers that failed.
    NoQuorum(Vec<Arc<str>>),
}

/// Every multi-step machine the session drives.
#[derive(Debug)]
pub(crate) enum Machine {
    /// A compare-and-swap with replicas (see [`CasSteps`]).
    Cas(CasSteps),
    /// An `add` with replicas (see [`AddSteps`]).
    Add(AddSteps),
    /// A command that may meet a hand-off lease (see [`LeaseSteps`]).
    Lease(LeaseSteps),
    /// A command on a moved key (see [`MovedSteps`]).
    Moved(MovedSteps),
    /// An `mg` over replicas, zones or a window's previous owners (see
    /// [`ReadSteps`]).
    Read(ReadSteps),
}

impl Machine {
    /// The first step.
    pub(crate) fn start(&mut self) -> Next {
        match self {
            Machine::Cas(cas) => cas.start(),
            Machine::Add(add) => {
                let step = add.machine.start();
                add.step(step)
            }
            Machine::Lease(retry) => retry.start(),
            Machine::Moved(moved) => {
                let step = moved.machine.start();
                moved.step(step)
            }
            Machine::Read(read) => read.start(),
        }
    }

    /// Whether the machine takes each awaited reply as it comes, in any
    /// order, through [`Machine::on_reply_from`] (else a step's replies
    /// all at once, through [`Machine::on_replies`]). Its `Next::Send`
    /// then adds to the replies still awaited (none: wait for the next),
    /// and its answer may come while some are: they are not waited for.
    pub(crate) fn one_by_one(&self) -> bool {
        matches!(self, Machine::Read(_))
    }

    /// One reply of `server`, for a machine that takes them
    /// [`one_by_one`](Machine::one_by_one); `now`: the Unix time (a copy's
    /// TTL).
    pub(crate) fn on_reply_from(&mut self, server: usize, reply: CallResult, now: u64) -> Next {
        match self {
            Machine::Read(read) => read.on_reply_from(server, reply, now),
            // The others take a step's replies together.
            _ => self.on_replies(&[(server, &reply)], None, now),
        }
    }

    /// The replies of the last step's awaited messages, each with its
    /// server, in the order they were sent; `lease`: the cas of a hand-off
    /// lease the connection saw in the first (an `mg`'s reply shows one);
    /// `now`: the Unix time (a hand-off copy's TTL).
    pub(crate) fn on_replies(
        &mut self,
        replies: &[(usize, &CallResult)],
        lease: Option<u64>,
        now: u64,
    ) -> Next {
        match self {
            Machine::Moved(moved) => match replies.first() {
                Some(&(_, result)) => {
                    let step = moved.machine.on_reply(result.clone(), now);
                    moved.step(step)
                }
                // Never: every step awaits its one reply.
                None => Next::Answer(Answer::Reply(Ok(Default::default()))),
            },
            Machine::Cas(cas) => cas.on_replies(replies),
            Machine::Add(add) => {
                let step = add.machine.on_replies(replies);
                add.step(step)
            }
            Machine::Read(read) => match replies.first() {
                Some(&(server, result)) => read.on_reply_from(server, result.clone(), now),
                None => Next::Send(Messages::new()),
            },
            Machine::Lease(retry) => match replies.first() {
                Some(&(_, result)) => {
                    let step = retry.retry.on_reply(result.clone(), lease);
                    retry.step(step)
                }
                // After a line sent without a reply wanted: the answer.
                None => Next::Answer(Answer::Reply(
                    retry
                        .answer
                        .take()
                        .unwrap_or_else(|| Ok(Default::default())),
                )),
            },
        }
    }

    /// Whether the client's later requests may go out before the answer:
    /// what is still to come changes nothing they would see.
    pub(crate) fn settled(&self) -> bool {
        match self {
            Machine::Cas(cas) => !cas.machine.deciding(),
            // Every step changes what a later request of the client sees.
            Machine::Add(_) | Machine::Lease(_) | Machine::Moved(_) | Machine::Read(_) => false,
        }
    }

    /// The server the request was planned on (for the request log).
    pub(crate) fn first_server(&self) -> usize {
        match self {
            Machine::Cas(cas) => cas.owner,
            Machine::Add(add) => add.first,
            Machine::Lease(retry) => retry.server,
            Machine::Moved(moved) => moved.owner,
            Machine::Read(read) => read.read.logged_server(),
        }
    }

    /// What a read over several servers counted (read-throughs, zone
    /// hits), once it has answered.
    pub(crate) fn read_tally(&self) -> Option<ReadTally> {
        match self {
            Machine::Read(read) if read.read.answered() => Some(read.read.tally()),
            _ => None,
        }
    }

    /// What the steps so far did that the hand-off counters count (taken
    /// once).
    pub(crate) fn take_tally(&mut self) -> Tally {
        match self {
            Machine::Moved(moved) => moved.machine.take_tally(),
            _ => Tally::default(),
        }
    }

    /// A read-through's copy of the value for the new owner, once the
    /// machine has answered (taken once).
    pub(crate) fn take_read_copy(&mut self) -> Option<ReadCopy> {
        let moved = match self {
            Machine::Moved(moved) => moved,
            Machine::Read(read) => return read.read.take_copy(),
            _ => return None,
        };
        let wire = moved.machine.take_read_copy()?;
        let (key, base64) = moved.machine.key_token();
        Some(ReadCopy {
            owner: moved.owner,
            wire,
            source: moved.previous,
            key,
            base64,
            touch: None,
        })
    }

    /// Whether its first step waits until the client's read-through copies
    /// under way have replaced their leases (a moved key's steps would see
    /// them).
    pub(crate) fn after_copies(&self) -> bool {
        matches!(self, Machine::Moved(_))
    }
}

/// A replicated `cas` (classic `cas`, meta `ms … C`) in steps: the client's
/// request to the owner, the takeover's steps, then the value to the other
/// replicas as a plain store (see `replicated_cas`).
#[derive(Debug)]
pub(crate) struct CasSteps {
    machine: ReplicatedCas,
    owner: usize,
    /// The client's request and its framing.
    request: (Outbound, Expect),
    /// The plain store the other replicas get, and its framing.
    copy: (Outbound, Expect),
    /// The last reply to the `cas` (or a takeover step): the answer, unless
    /// the takeover has its own.
    last: Option<CallResult>,
}

impl CasSteps {
    /// `machine`, deciding on `owner`, which is sent `request`; the copies
    /// go as `copy`.
    pub(crate) fn new(
        machine: ReplicatedCas,
        owner: usize,
        request: (Outbound, Expect),
        copy: (Outbound, Expect),
    ) -> CasSteps {
        CasSteps {
            machine,
            owner,
            request,
            copy,
            last: None,
        }
    }

    fn start(&mut self) -> Next {
        let (wire, expect) = self.request.clone();
        Next::Send(smallvec::smallvec![Message {
            server: self.owner,
            wire,
            expect,
            awaited: true,
            watched: true,
            grows: false,
        }])
    }

    fn on_replies(&mut self, replies: &[(usize, &CallResult)]) -> Next {
        let reply = match replies.first() {
            Some(&(_, reply)) if self.machine.deciding() => reply,
            // The awaited copies' replies (or none): the answer.
            _ => return self.answer(),
        };
        let step = self.machine.on_reply(reply);
        self.last = Some(reply.clone());
        let copies = |servers: crate::plan::placement::Servers, awaited: bool| {
            let (wire, expect) = &self.copy;
            servers
                .into_iter()
                .map(|server| Message {
                    server,
                    wire: wire.clone(),
                    expect: expect.clone(),
                    awaited,
                    // A copy nobody waits for is not watched either: it
                    // goes to other replicas, where no hot-key shortcut is
                    // taken.
                    watched: awaited,
                    grows: false,
                })
                .collect()
        };
        match step {
            CasStep::Send {
                server,
                lines,
                expect,
            } => Next::Send(smallvec::smallvec![Message {
                server,
                wire: lines,
                expect,
                awaited: true,
                watched: true,
                grows: false,
            }]),
            CasStep::Copy { servers, awaited } => Next::Send(copies(servers, awaited)),
            CasStep::Done => self.answer(),
        }
    }

    fn answer(&self) -> Next {
        // Never without a reply: a machine answers only after one.
        let last = self.last.clone().unwrap_or_else(|| Ok(Default::default()));
        Next::Answer(Answer::Reply(self.machine.answer(&last).unwrap_or(last)))
    }
}

/// A replicated `add` (classic `add`, meta `ms … ME`) in steps (see
/// `replicated_add`): every store goes as `ms … ME c`, and the answer is
/// written in the dialect the client asked in.
#[derive(Debug)]
pub(crate) struct AddSteps {
    machine: ReplicatedAdd,
    /// The key's first replica.
    first: usize,
    /// The add as every replica gets it.
    wire: Outbound,
    /// The key token and whether it is base64, for the take-backs and
    /// probes.
    key: (Bytes, bool),
    /// How the client asked: classic (`None`), or meta with whether it
    /// asked for the cas (`c`) and is quiet (`q`).
    meta: Option<(bool, bool)>,
}

impl AddSteps {
    /// `machine`, whose key's first replica is `first`, sending `wire`.
    pub(crate) fn new(
        machine: ReplicatedAdd,
        first: usize,
        wire: Outbound,
        key: (Bytes, bool),
        meta: Option<(bool, bool)>,
    ) -> AddSteps {
        AddSteps {
            machine,
            first,
            wire,
            key,
            meta,
        }
    }

    fn step(&self, step: AddStep) -> Next {
        let add = |server| Message {
            server,
            wire: self.wire.clone(),
            expect: Expect::meta(MetaCommand::Set, false),
            awaited: true,
            watched: true,
            grows: false,
        };
        let take_back = |(server, cas), awaited| Message {
            server,
            wire: smallvec::smallvec![delete_by_cas(&self.key.0, self.key.1, cas)],
            expect: Expect::meta(MetaCommand::Delete, false),
            awaited,
            watched: false,
            grows: false,
        };
        Next::Send(match step {
            AddStep::Add(servers) => servers.into_iter().map(add).collect(),
            AddStep::TakeBack(made) => made.into_iter().map(|m| take_back(m, true)).collect(),
            AddStep::Probe(servers) => servers
                .into_iter()
                .map(|server| Message {
                    server,
                    wire: smallvec::smallvec![probe_line(&self.key.0, self.key.1)],
                    expect: probe_expect(),
                    awaited: true,
                    watched: false,
                    grows: false,
                })
                .collect(),
            // The lease goes, then the add, on the same connection.
            AddStep::ClearAndAdd(leases) => leases
                .into_iter()
                .flat_map(|lease| [take_back(lease, false), add(lease.0)])
                .collect(),
            AddStep::Done => return Next::Answer(self.answer()),
        })
    }

    /// The machine's answer in the client's dialect.
    fn answer(&self) -> Answer {
        let Some(answer) = self.machine.answer() else {
            // Never: `Done` comes with the answer.
            return Answer::NoQuorum(Vec::new());
        };
        Answer::Reply(Ok(match (answer, self.meta) {
            (AddAnswer::NoQuorum(servers), _) => return Answer::NoQuorum(servers.clone()),
            (AddAnswer::Rejected(reply), _) => reply.clone(),
            (AddAnswer::Stored(_), None) => {
                Reply::new(Outcome::Stored, Bytes::from_static(b"STORED\r\n"))
            }
            (AddAnswer::Refused(_), None) => {
                Reply::new(Outcome::NotStored, Bytes::from_static(b"NOT_STORED\r\n"))
            }
            // Quiet: memcached says nothing of a store.
            (AddAnswer::Stored(_), Some((_, true))) => Reply::nothing(),
            (AddAnswer::Stored(reply) | AddAnswer::Refused(reply), Some((cas, _))) => {
                if cas {
                    reply.clone()
                } else {
                    let bytes = crate::protocol::meta::reply::without_cas(&reply.bytes);
                    Reply::new(reply.outcome, bytes)
                }
            }
        }))
    }
}

/// A command on one owner that may meet a hand-off lease (see
/// `lease_retry`): the lease is removed and the command runs again, on the
/// same connection.
#[derive(Debug)]
pub(crate) struct LeaseSteps {
    retry: LeaseRetry,
    server: usize,
    /// The command as the owner gets it, and its framing.
    request: (Outbound, Expect),
    /// The answer, once a last line wanting no reply is sent.
    answer: Option<CallResult>,
}

impl LeaseSteps {
    /// `retry` of the command `request` on `server`.
    pub(crate) fn new(retry: LeaseRetry, server: usize, request: (Outbound, Expect)) -> LeaseSteps {
        LeaseSteps {
            retry,
            server,
            request,
            answer: None,
        }
    }

    /// The command itself (it carries the client's write).
    fn command(&self) -> Message {
        Message {
            server: self.server,
            wire: self.request.0.clone(),
            expect: self.request.1.clone(),
            awaited: true,
            watched: true,
            grows: false,
        }
    }

    /// A line of the machine's own to the owner.
    fn line(&self, line: Bytes, expect: Expect, awaited: bool) -> Message {
        Message {
            server: self.server,
            wire: smallvec::smallvec![line],
            expect,
            awaited,
            watched: false,
            grows: false,
        }
    }

    fn start(&mut self) -> Next {
        Next::Send(smallvec::smallvec![match self.retry.opening() {
            Some((probe, shown)) => self.line(probe, shown, true),
            None => self.command(),
        }])
    }

    fn step(&mut self, step: LeaseStep) -> Next {
        // An `md` by cas: a lease's removal, or a recache token given back.
        let removal = || Expect::meta(MetaCommand::Delete, false);
        Next::Send(match step {
            LeaseStep::Answer(result) => return Next::Answer(Answer::Reply(result)),
            LeaseStep::Probe { line, expect } => smallvec::smallvec![self.line(line, expect, true)],
            LeaseStep::Rerun { delete } => {
                smallvec::smallvec![self.line(delete, removal(), false), self.command()]
            }
            LeaseStep::Send => smallvec::smallvec![self.command()],
            LeaseStep::AnswerAfter { line, answer } => {
                self.answer = Some(answer);
                smallvec::smallvec![self.line(line, removal(), false)]
            }
        })
    }
}

/// A command on a moved key, in either dialect (see `handoff::Moved`): one
/// message a step, to the key's owner or its previous owner.
#[derive(Debug)]
pub(crate) struct MovedSteps {
    /// Boxed as the plan hands it over (the largest machine).
    machine: Box<Moved>,
    owner: usize,
    previous: usize,
    /// A meta command: the request's hot-key guard watches only what goes
    /// to the new owner (a classic write's, what goes to both).
    meta: bool,
}

impl MovedSteps {
    /// `machine` between `owner` and `previous`.
    pub(crate) fn new(
        machine: Box<Moved>,
        owner: usize,
        previous: usize,
        meta: bool,
    ) -> MovedSteps {
        MovedSteps {
            machine,
            owner,
            previous,
            meta,
        }
    }

    fn step(&self, step: Step) -> Next {
        match step {
            Step::Answer(result) => Next::Answer(Answer::Reply(result)),
            Step::Send { to, lines, expect } => Next::Send(smallvec::smallvec![Message {
                server: match to {
                    Owner::New => self.owner,
                    Owner::Previous => self.previous,
                },
                wire: lines,
                expect,
                awaited: true,
                watched: to == Owner::New || !self.meta,
                grows: false,
            }]),
        }
    }
}

/// An `mg` read over several servers (see `meta_read`): one at a time, or
/// after a local miss every other zone's replica at once, each reply taken
/// as it comes; the first hit answers, and replies after the answer are
/// dropped.
#[derive(Debug)]
pub(crate) struct ReadSteps {
    read: MetaRead,
    /// The client's request as a server gets it, and its framing (a server
    /// the read copies from gets `MetaRead::fetch_wire` instead).
    request: (Outbound, Expect),
}

impl ReadSteps {
    /// `read`, asking with `request`.
    pub(crate) fn new(read: MetaRead, request: (Outbound, Expect)) -> ReadSteps {
        ReadSteps { read, request }
    }

    /// A read asking nothing and holding no bytes (what a kept work box
    /// holds until its next request).
    pub(crate) fn idle() -> ReadSteps {
        ReadSteps {
            read: MetaRead::idle(),
            request: (Outbound::new(), Expect::meta(MetaCommand::Get, false)),
        }
    }

    /// `server` asked with the client's request, or (`fetch`) with what a
    /// copy needs too.
    fn ask(&self, server: usize, fetch: bool, grows: bool) -> Message {
        let wire = match fetch {
            true => self.read.fetch_wire().clone(),
            false => self.request.0.clone(),
        };
        Message {
            server,
            wire,
            expect: self.request.1.clone(),
            awaited: true,
            // A read: no write to watch.
            watched: false,
            grows,
        }
    }

    fn start(&self) -> Next {
        Next::Send(smallvec::smallvec![self.ask(
            self.read.first(),
            false,
            false
        )])
    }

    fn on_reply_from(&mut self, server: usize, reply: CallResult, now: u64) -> Next {
        match self.read.on_reply_from(server, reply, now) {
            ReadStep::Send { server, fetch } => {
                Next::Send(smallvec::smallvec![self.ask(server, fetch, false)])
            }
            ReadStep::Fan => Next::Send(
                self.read
                    .fanned_servers()
                    .iter()
                    .map(|&server| self.ask(server, self.read.fetches(server), true))
                    .collect(),
            ),
            ReadStep::Wait => Next::Send(Messages::new()),
            ReadStep::Answer(result) => Next::Answer(Answer::Reply(result)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::handoff::cas::CasTakeover;
    use crate::protocol::meta::MetaCommand;
    use crate::protocol::outcome::Reply;
    use crate::protocol::reply::LineKind;
    use bytes::Bytes;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Reply::from_static(reply))
    }

    fn wire(line: &'static [u8]) -> Outbound {
        smallvec::smallvec![Bytes::from_static(line)]
    }

    /// Each message as (server, bytes, awaited, watched).
    fn sent(next: Next) -> Vec<(usize, Vec<u8>, bool, bool)> {
        match next {
            Next::Send(messages) => messages
                .into_iter()
                .map(|m| (m.server, m.wire.concat(), m.awaited, m.watched))
                .collect(),
            other => panic!("not sending: {other:?}"),
        }
    }

    fn classic_cas(copies: &[usize], previous: Option<usize>) -> Machine {
        let storage = Expect::Line(LineKind::Storage);
        let takeover = previous.map(|previous| {
            let takeover = CasTakeover::new(
                Bytes::from_static(b"k"),
                None,
                wire(b"cas k 0 0 1 7\r\ny\r\n"),
                storage.clone(),
                wire(b"set k 0 0 1\r\ny\r\n"),
            );
            (previous, takeover)
        });
        let servers = copies.iter().copied().collect();
        let machine = ReplicatedCas::new(false, 0, servers, takeover);
        Machine::Cas(CasSteps::new(
            machine,
            0,
            (wire(b"cas k 0 0 1 7\r\ny\r\n"), storage.clone()),
            (wire(b"set k 0 0 1\r\ny\r\n"), storage),
        ))
    }

    #[test]
    fn a_cas_goes_to_the_owner_and_its_stored_value_to_the_replicas_unawaited() {
        let mut cas = classic_cas(&[1, 2], None);
        assert!(!cas.settled());
        assert_eq!(
            sent(cas.start()),
            [(0, b"cas k 0 0 1 7\r\ny\r\n".to_vec(), true, true)]
        );
        let stored = ok(b"STORED\r\n");
        let copy = b"set k 0 0 1\r\ny\r\n".to_vec();
        assert_eq!(
            sent(cas.on_replies(&[(0, &stored)], None, 0)),
            [(1, copy.clone(), false, false), (2, copy, false, false)]
        );
        // Decided: the client's later requests may go.
        assert!(cas.settled());
        assert_eq!(
            cas.on_replies(&[], None, 0),
            Next::Answer(Answer::Reply(stored))
        );
    }

    #[test]
    fn a_refused_cas_answers_the_refusal_and_copies_nothing() {
        let mut cas = classic_cas(&[1], None);
        cas.start();
        let exists = ok(b"EXISTS\r\n");
        assert_eq!(
            cas.on_replies(&[(0, &exists)], None, 0),
            Next::Answer(Answer::Reply(exists))
        );
    }

    #[test]
    fn a_moved_keys_cas_is_taken_over_and_its_copies_awaited_before_the_answer() {
        // Replicas 0 (owner), 3 (the previous owner) and 1.
        let mut cas = classic_cas(&[3, 1], Some(3));
        cas.start();
        let not_found = ok(b"NOT_FOUND\r\n");
        assert_eq!(
            sent(cas.on_replies(&[(0, &not_found)], None, 0)),
            [(3, b"cas k 0 0 1 7\r\ny\r\n".to_vec(), true, true)]
        );
        let stored = ok(b"STORED\r\n");
        // The owner gets its copy of what the previous owner stored, as an
        // add (a newer write there stays).
        assert_eq!(
            sent(cas.on_replies(&[(3, &stored)], None, 0)),
            [(0, b"add k 0 0 1\r\ny\r\n".to_vec(), true, true)]
        );
        assert!(!cas.settled());
        assert_eq!(
            sent(cas.on_replies(&[(0, &stored)], None, 0)),
            [(1, b"set k 0 0 1\r\ny\r\n".to_vec(), true, true)]
        );
        assert!(cas.settled());
        assert_eq!(
            cas.on_replies(&[(1, &stored)], None, 0),
            Next::Answer(Answer::Reply(stored))
        );
    }

    #[test]
    fn a_meta_cas_copies_its_plain_store() {
        let set = Expect::meta(MetaCommand::Set, false);
        let machine = ReplicatedCas::new(true, 2, [0].into_iter().collect(), None);
        let mut cas = Machine::Cas(CasSteps::new(
            machine,
            2,
            (wire(b"ms k 1 C7\r\ny\r\n"), set.clone()),
            (wire(b"ms k 1 q\r\ny\r\n"), set),
        ));
        assert_eq!(cas.first_server(), 2);
        assert_eq!(sent(cas.start())[0].0, 2);
        let hd = ok(b"HD\r\n");
        assert_eq!(
            sent(cas.on_replies(&[(2, &hd)], None, 0)),
            [(0, b"ms k 1 q\r\ny\r\n".to_vec(), false, false)]
        );
        assert_eq!(
            cas.on_replies(&[], None, 0),
            Next::Answer(Answer::Reply(hd))
        );
    }

    fn add(servers: &[usize], meta: Option<(bool, bool)>) -> Machine {
        let replicas = servers.iter().copied().collect();
        let machine = ReplicatedAdd::new(replicas, servers.len());
        let wire = wire(b"ms k 1 ME c\r\ny\r\n");
        let key = (Bytes::from_static(b"k"), false);
        Machine::Add(AddSteps::new(machine, servers[0], wire, key, meta))
    }

    #[test]
    fn an_add_stored_on_every_replica_answers_in_the_clients_dialect() {
        let add_line = b"ms k 1 ME c\r\ny\r\n".to_vec();
        for (meta, answer) in [
            (None, &b"STORED\r\n"[..]),
            (Some((false, false)), b"HD\r\n"),
            (Some((true, false)), b"HD c7\r\n"),
            (Some((false, true)), b""),
        ] {
            let mut add = add(&[3, 1], meta);
            assert!(!add.settled());
            assert_eq!(add.first_server(), 3);
            assert_eq!(sent(add.start()), [(3, add_line.clone(), true, true)]);
            let hd = ok(b"HD c7\r\n");
            assert_eq!(
                sent(add.on_replies(&[(3, &hd)], None, 0)),
                [(1, add_line.clone(), true, true)]
            );
            let Next::Answer(Answer::Reply(Ok(reply))) =
                add.on_replies(&[(1, &ok(b"HD c9\r\n"))], None, 0)
            else {
                panic!("no answer");
            };
            assert_eq!(&reply.bytes[..], answer, "{meta:?}");
        }
    }

    #[test]
    fn an_add_refused_after_one_replica_stored_takes_its_copy_back_before_answering() {
        let mut add = add(&[0, 1], None);
        add.start();
        add.on_replies(&[(0, &ok(b"HD c5\r\n"))], None, 0);
        // The other replica holds a lease: it goes, then the add again.
        let ns = ok(b"NS\r\n");
        assert_eq!(
            sent(add.on_replies(&[(1, &ns)], None, 0)),
            [(1, b"mg k c f s u\r\n".to_vec(), true, false)]
        );
        let flags = crate::protocol::lease::LEASE_FLAGS;
        let lease = Ok(Reply::made(Bytes::from(format!("HD c4 f{flags} s24\r\n"))));
        assert_eq!(
            sent(add.on_replies(&[(1, &lease)], None, 0)),
            [
                (1, b"md k C4\r\n".to_vec(), false, false),
                (1, b"ms k 1 ME c\r\ny\r\n".to_vec(), true, true)
            ]
        );
        // Refused again, and this time a value is there: the first copy goes.
        assert!(matches!(
            add.on_replies(&[(1, &ns)], None, 0),
            Next::Send(_)
        ));
        let value = ok(b"HD c2 f0 s1\r\n");
        assert_eq!(
            sent(add.on_replies(&[(1, &value)], None, 0)),
            [(0, b"md k C5\r\n".to_vec(), true, false)]
        );
        let Next::Answer(Answer::Reply(Ok(reply))) =
            add.on_replies(&[(0, &ok(b"HD\r\n"))], None, 0)
        else {
            panic!("no answer");
        };
        assert_eq!(&reply.bytes[..], b"NOT_STORED\r\n");
    }

    #[test]
    fn an_add_without_a_quorum_names_the_failed_replicas() {
        let down: CallResult = Err(crate::error::BackendError {
            server: "a".into(),
            kind: crate::error::BackendErrorKind::Timeout,
        });
        let mut add = add(&[0, 1], Some((false, false)));
        add.start();
        assert_eq!(
            add.on_replies(&[(0, &down)], None, 0),
            Next::Answer(Answer::NoQuorum(vec!["a".into()]))
        );
    }

    fn leased(command: MetaCommand, line: &'static [u8]) -> Machine {
        let key = Bytes::from_static(b"k");
        let retry = LeaseRetry::for_meta(command, key, false, |_| false, None).unwrap();
        let expect = Expect::meta(command, false);
        Machine::Lease(LeaseSteps::new(retry, 4, (wire(line), expect)))
    }

    #[test]
    fn a_command_refused_by_a_lease_removes_it_and_runs_again() {
        let mut ma = leased(MetaCommand::Arithmetic, b"ma k\r\n");
        assert_eq!(ma.first_server(), 4);
        assert_eq!(sent(ma.start()), [(4, b"ma k\r\n".to_vec(), true, true)]);
        let not_a_number = ok(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        assert_eq!(
            sent(ma.on_replies(&[(4, &not_a_number)], None, 0)),
            [(4, b"mg k c f s u\r\n".to_vec(), true, false)]
        );
        let flags = crate::protocol::lease::LEASE_FLAGS;
        let lease = Ok(Reply::made(Bytes::from(format!("HD c4 f{flags} s24\r\n"))));
        assert_eq!(
            sent(ma.on_replies(&[(4, &lease)], None, 0)),
            [
                (4, b"md k C4\r\n".to_vec(), false, false),
                (4, b"ma k\r\n".to_vec(), true, true)
            ]
        );
        let not_found = ok(b"NF\r\n");
        assert_eq!(
            ma.on_replies(&[(4, &not_found)], None, 0),
            Next::Answer(Answer::Reply(not_found))
        );
    }

    #[test]
    fn a_command_that_would_hide_a_lease_looks_for_one_first() {
        let mut md = leased(MetaCommand::Delete, b"md k\r\n");
        assert_eq!(
            sent(md.start()),
            [(4, b"mg k c f s u\r\n".to_vec(), true, false)]
        );
        assert_eq!(
            sent(md.on_replies(&[(4, &ok(b"EN\r\n"))], None, 0)),
            [(4, b"md k\r\n".to_vec(), true, true)]
        );
        let hd = ok(b"HD\r\n");
        assert!(!md.settled(), "later requests wait for the answer");
        assert_eq!(
            md.on_replies(&[(4, &hd)], None, 0),
            Next::Answer(Answer::Reply(hd))
        );
    }

    #[test]
    fn a_lease_an_mg_reply_shows_is_removed_and_the_mg_runs_again() {
        let key = Bytes::from_static(b"k");
        let retry = LeaseRetry::for_meta(MetaCommand::Get, key, false, |f| f == b'T', None);
        let expect = Expect::meta(MetaCommand::Get, false);
        let mut mg = Machine::Lease(LeaseSteps::new(
            retry.unwrap(),
            1,
            (wire(b"mg k T30 v\r\n"), expect),
        ));
        mg.start();
        let shown = ok(b"EN\r\n");
        assert_eq!(
            sent(mg.on_replies(&[(1, &shown)], Some(9), 0)),
            [
                (1, b"md k C9\r\n".to_vec(), false, false),
                (1, b"mg k T30 v\r\n".to_vec(), true, true)
            ]
        );
    }

    fn mg(read: MetaRead) -> Machine {
        let expect = Expect::meta(MetaCommand::Get, false);
        Machine::Read(ReadSteps::new(read, (wire(b"mg key v k\r\n"), expect)))
    }

    fn failed() -> CallResult {
        Err(crate::error::BackendError {
            server: "s".into(),
            kind: crate::error::BackendErrorKind::Timeout,
        })
    }

    fn answered(next: Next) -> Vec<u8> {
        match next {
            Next::Answer(Answer::Reply(Ok(reply))) => reply.bytes.to_vec(),
            other => panic!("no answer: {other:?}"),
        }
    }

    #[test]
    fn an_mg_over_replicas_asks_one_at_a_time_each_reply_as_it_comes() {
        use crate::plan::meta_read::tests::read_of;
        let mut read = mg(read_of(b"mg key v k\r\n", &[4, 1, 2], true, None));
        assert!(read.one_by_one() && !read.settled());
        let line = b"mg key v k\r\n".to_vec();
        assert_eq!(sent(read.start()), [(4, line.clone(), true, false)]);
        // A miss, then a failure: each hands the read to the next server.
        assert_eq!(
            sent(read.on_reply_from(4, ok(b"EN\r\n"), 0)),
            [(1, line.clone(), true, false)]
        );
        assert_eq!(
            sent(read.on_reply_from(1, failed(), 0)),
            [(2, line, true, false)]
        );
        assert_eq!(read.read_tally(), None, "counted once answered");
        let hit = b"VA 1 kkey\r\nx\r\n";
        assert_eq!(answered(read.on_reply_from(2, ok(hit), 0)), hit);
        // The request log names the server that answered.
        assert_eq!(read.first_server(), 2);
        let tally = read.read_tally().expect("answered");
        assert_eq!(tally.zone_hits, (0, 1));
        assert_eq!(
            tally.served.map(|hit| (hit.server, hit.local)),
            Some((2, false))
        );
        assert!(read.take_read_copy().is_none());
    }

    #[test]
    fn an_mg_asks_every_other_zone_at_once_and_drops_the_reply_after_the_answer() {
        use crate::plan::meta_read::tests::fanned;
        let mut read = mg(fanned(b"mg key v k\r\n", &[4, 1, 2]));
        let first = sent(read.start());
        assert_eq!(first, [(4, b"mg key v k\r\n".to_vec(), true, false)]);
        // The local miss: both other zones at once, with what a copy
        // needs, each growing the entry's reservation by a reply.
        let Next::Send(fan) = read.on_reply_from(4, ok(b"EN\r\n"), 0) else {
            panic!("no fan-out");
        };
        let asked: Vec<_> = fan
            .iter()
            .map(|m| (m.server, m.wire.concat(), m.grows))
            .collect();
        let fetch = b"mg key v k f t\r\n".to_vec();
        assert_eq!(asked, [(1, fetch.clone(), true), (2, fetch, true)]);
        // The third zone answers first: its hit answers, as asked.
        let hit = ok(b"VA 1 kkey f5 t-1\r\nx\r\n");
        assert_eq!(
            answered(read.on_reply_from(2, hit.clone(), 0)),
            b"VA 1 kkey\r\nx\r\n"
        );
        let copy = read.take_read_copy().expect("copied to the local replica");
        assert_eq!((copy.owner, copy.source), (4, 2));
        let tally = read.read_tally().expect("answered");
        assert_eq!((tally.zone_hits, tally.written_back), ((0, 1), 1));
        // The slower zone's reply, after the answer: nothing sent, nothing
        // copied or counted again.
        assert_eq!(sent(read.on_reply_from(1, hit, 0)), []);
        assert!(read.take_read_copy().is_none());
        assert_eq!(read.read_tally(), Some(tally));
        assert_eq!(read.first_server(), 4);
    }

    #[test]
    fn an_mg_hit_on_the_local_replica_counts_a_local_zone_hit() {
        use crate::plan::meta_read::tests::read_of;
        let mut read = mg(read_of(b"mg key v k\r\n", &[4, 1], true, Some(1)));
        read.start();
        let hit = b"VA 1 kkey\r\nx\r\n";
        assert_eq!(answered(read.on_reply_from(4, ok(hit), 0)), hit);
        let tally = read.read_tally().expect("answered");
        assert_eq!((tally.zone_hits, tally.written_back), ((1, 0), 0));
        assert_eq!(
            tally.served.map(|hit| (hit.server, hit.local)),
            Some((4, true))
        );
    }
}
