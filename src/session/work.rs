//! The work a client's requests become: one [`Entry`] per request in the
//! session's FIFO, holding what its kind of work waits for (one-line
//! replies, a retrieval's sub-requests, a hand-off machine, or the steps of
//! a plan machine: see [`StepsWork`]) and how those replies become the
//! client's answer.

use std::rc::Rc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::shadow;
use crate::backend::slot::{Got, Slot};
use crate::error::BackendError;
use crate::hotkeys::{Unanswered, WriteGuard};
use crate::plan::handoff::CopyOutcome;
use crate::plan::route::{CallResult, Retrieval};
use crate::plan::steps::{Answer, Machine};
use crate::pools::planned::Planned;
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::Expect;
use crate::protocol::{Command, ParseError, Request};
use crate::runtime::budget::Reservation;

/// One client request on its way.
pub(super) struct Entry {
    pub(super) command: Command,
    pub(super) noreply: bool,
    pub(super) request: Request,
    pub(super) bytes: Bytes,
    /// The topology the request was planned on; it finishes on it, and
    /// counts in flight on it until then (`pools/in_flight.rs`).
    pub(super) topology: Planned,
    pub(super) work: Work,
    /// The request has been written (for one-line work).
    pub(super) sent: bool,
    /// Reply bytes reserved when it was dispatched.
    pub(super) reserved: Reservation,
    /// When it was parsed (the worker clock's `TurnClock::nanos`), for the
    /// per-command latency histogram.
    pub(super) started: u64,
    /// A write, pending for hot-key coalescing and the near cache until
    /// this entry and its reply slots are done.
    pub(super) hot: Option<Rc<WriteGuard>>,
    /// A sampled get: the pairs its answers go to (see `shadow.rs`).
    pub(super) shadow: Option<Box<shadow::Pairs>>,
    /// The refusal whose reply memring writes in place of the server's once
    /// that came (the delete of a `set` refused as too large answers the
    /// refusal, after the key is gone: see `ClientSession::forget_stale`).
    /// The kind, not its text: one byte rather than a slice keeps the entry
    /// within 256 bytes, where moving it is a short copy.
    pub(super) instead: Option<ParseError>,
    /// What the answer written for it says, once it is finished (for the
    /// request log: never read back from the bytes).
    pub(super) said: Outcome,
}

impl Entry {
    /// A reply memring makes itself.
    pub(super) fn ready(reply: &'static [u8], topology: Planned) -> Entry {
        let bytes = Bytes::new();
        Entry {
            command: Command::Version,
            noreply: false,
            request: Request {
                command: Command::Version,
                keys: SmallVec::new(),
                noreply: false,
                arg: None,
                args_end: 0,
                line_len: 0,
            },
            bytes,
            topology,
            work: Work::Ready(Bytes::from_static(reply)),
            sent: true,
            reserved: Reservation::default(),
            started: 0,
            hot: None,
            shadow: None,
            instead: None,
            said: Outcome::Nothing,
        }
    }
}

pub(super) enum Work {
    /// memring's own reply.
    Ready(Bytes),
    /// memring's `stats`, rendered when it is the client's turn.
    Stats,
    /// `stats reset`, done when it is the client's turn (a `stats` before
    /// it still shows the counts before it).
    StatsReset,
    /// A request forwarded to one or more servers, one reply each, in
    /// either dialect: a classic request sends its own bytes and answers
    /// with a server's line; a meta one says what it sends and how its
    /// answer is counted in `meta`.
    Lines {
        parts: SmallVec<[Part; 1]>,
        finish: Finish,
        meta: Option<Box<MetaLines>>,
    },
    /// A plan machine's steps (see [`StepsWork`]), in either dialect.
    Steps(Box<StepsWork>),
    /// A retrieval (a classic one, or a plain `mg`), streamed.
    Retrieve {
        plan: Box<Retrieval>,
        /// Sub-requests sent (or joined) and not yet absorbed.
        in_flight: InFlight,
        /// Reply bytes reserved for the sub-requests in flight and held
        /// for values the plan keeps until the keys before them are
        /// answered (see [`retrieval_owed`]).
        owed: Reservation,
    },
}

/// A request a plan machine answers in steps (see `plan::steps`): the
/// session sends each step's messages and feeds their replies back until
/// the machine answers.
pub(super) struct StepsWork {
    pub(super) machine: Machine,
    /// Owners in older rings of chained changes: they lose the key before
    /// the machine's first step.
    pub(super) older: Option<OlderForget>,
    /// The key as they lose it: its token, and for a meta request whether
    /// it is base64 (an `md`; a classic request's is a `delete`).
    pub(super) key: (Bytes, Option<bool>),
    /// How many servers the first step asks at most: one line each is
    /// reserved for.
    pub(super) lines: usize,
    /// The replies the step under way waits for.
    pub(super) parts: SmallVec<[Part; 2]>,
    pub(super) answer: Option<Answer>,
    /// How the client asked: classic (`None`), or meta.
    pub(super) meta: Option<MetaAnswer>,
}

impl StepsWork {
    /// Work for `machine`, its older owners `older` losing `key` first.
    pub(super) fn work(
        machine: Machine,
        older: Option<OlderForget>,
        key: (Bytes, Option<bool>),
        lines: usize,
        meta: Option<MetaAnswer>,
    ) -> Work {
        Work::Steps(super::spares::steps(StepsWork {
            machine,
            older,
            key,
            lines,
            parts: SmallVec::new(),
            answer: None,
            meta,
        }))
    }
}

/// What a meta command answered in steps (a moved key's, a replicated
/// `ms … C`, an `mg` over replicas or zones) adds to its work: how its
/// answer is counted and reserved for. The older owners lose the key by
/// `md` (by `delete` for classic), and the answer is written only when not
/// empty (`q` hid it).
#[derive(Clone, Copy)]
pub(super) struct MetaAnswer {
    /// As [`MetaLines::counts_cas`].
    pub(super) counts_cas: bool,
    /// The reply may carry a stored value (`mg … v`): budgeted like a
    /// get's key.
    pub(super) value: bool,
}

/// A write's deletes of its key from its owners in the older rings of
/// chained changes, one group at a time, oldest ring first (see
/// `topology::OlderOwners`); the write goes out once they are answered.
pub(super) struct OlderForget {
    owners: Box<crate::pools::topology::OlderOwners>,
    /// How many groups are sent.
    sent: usize,
    parts: SmallVec<[Part; 2]>,
}

impl OlderForget {
    pub(super) fn new(
        owners: Option<Box<crate::pools::topology::OlderOwners>>,
    ) -> Option<OlderForget> {
        Some(OlderForget {
            owners: owners?,
            sent: 0,
            parts: SmallVec::new(),
        })
    }

    /// How many deletes there are in all.
    pub(super) fn len(older: Option<&OlderForget>) -> usize {
        older.map_or(0, |o| o.owners.servers().len())
    }

    /// The deletes sent so far.
    pub(super) fn parts(older: Option<&OlderForget>) -> &[Part] {
        older.map_or(&[], |o| &o.parts)
    }

    /// Takes in the replies, and sends the next group with `send` once the
    /// one before is answered; true when every group is.
    pub(super) fn advance(
        older: Option<&mut OlderForget>,
        mut send: impl FnMut(usize) -> Part,
    ) -> bool {
        let Some(older) = older else {
            return true;
        };
        loop {
            older.parts.iter_mut().for_each(Part::absorb);
            if older.parts.iter().any(|p| p.result.is_none()) {
                return false;
            }
            let Some(group) = older.owners.group(older.sent) else {
                return true;
            };
            older.sent += 1;
            older.parts.extend(group.iter().map(|&server| send(server)));
        }
    }

    /// Whether a delete is still to be sent or answered.
    pub(super) fn pending(older: Option<&OlderForget>) -> bool {
        older.is_some_and(|o| {
            o.owners.group(o.sent).is_some() || o.parts.iter().any(|p| p.result.is_none())
        })
    }

    pub(super) fn into_parts(self) -> SmallVec<[Part; 2]> {
        self.parts
    }
}

pub(super) fn count_copy(stats: &crate::stats::Stats, outcome: CopyOutcome) {
    match outcome {
        CopyOutcome::Made => stats.copies(1, 0, 0),
        CopyOutcome::Skipped => stats.copies(0, 1, 0),
        CopyOutcome::Failed => stats.copies(0, 0, 1),
    }
}

/// What a meta request forwarded as [`Work::Lines`] adds to the classic
/// road: its own wire, its reply's kind, its key as the older owners and
/// the previous ring's replicas lose it (by `md`), and how its answer is
/// counted.
pub(super) struct MetaLines {
    /// An `ms` with `C` in set mode: its reply feeds the `cas_*` stats, as
    /// memcached counts it (other modes with `C` it does not count).
    pub(super) counts_cas: bool,
    /// What each server is sent: the client's bytes, plus `mn` when quiet.
    pub(super) wire: SmallVec<[Bytes; 3]>,
    pub(super) expect: Expect,
    /// The key token and whether it is base64; empty unless someone is to
    /// lose the key.
    pub(super) key: (Bytes, bool),
}

/// How the parts' one-line replies become the client's reply.
pub(super) enum Finish {
    Forward,
    /// A replicated write: the quorum, and how many of the last parts are
    /// `delete`s (`md`s) to the previous ring's replicas (see
    /// `placement::Placement::Quorum`; with `forget_last`, sent once the
    /// others answered); `older`: the deletes that go before it in chained
    /// windows.
    /// The counts (of a key's replicas) in 4 bytes each keep every entry
    /// within 256 bytes, where moving one is a short copy.
    Quorum {
        quorum: u32,
        forget: u32,
        /// The `warm` parts before the `forget` ones: warming servers, sent
        /// the request itself, awaited and not counted.
        warm: u32,
        older: Option<Box<OlderForget>>,
        forget_last: bool,
    },
    /// A broadcast (`flush_all`): `OK` only if every server said `OK`;
    /// with [`Joined`], one of several entries of one request (boxed: a
    /// rare request, and entries stay within 256 bytes).
    AllOk(Option<Box<Joined>>),
}

impl Finish {
    /// The deletes that go before a replicated write in chained windows.
    pub(super) fn older(&self) -> Option<&OlderForget> {
        match self {
            Finish::Quorum { older, .. } => older.as_deref(),
            _ => None,
        }
    }

    pub(super) fn older_mut(&mut self) -> Option<&mut OlderForget> {
        match self {
            Finish::Quorum { older, .. } => older.as_deref_mut(),
            _ => None,
        }
    }
}

/// A `flush_all` that reaches several pools: one entry per pool, each
/// planned on its pool's topology and consecutive in the FIFO. Each but the
/// last writes nothing and hands the servers that did not say `OK` to the
/// next; the last answers for them all.
pub(super) struct Joined {
    pub(super) failed: Rc<std::cell::RefCell<Vec<String>>>,
    /// The first pool's refusal in a server's own words (see
    /// `plan::route::Broadcast::Refused`), which answers for all.
    pub(super) refused: Rc<std::cell::RefCell<Option<Reply>>>,
    pub(super) last: bool,
}

impl Work {
    /// Whether `ours` accepts the server and slot of every reply this work
    /// waits for that has not fully arrived (copies sent wanting no reply
    /// have no slot: they go to other replicas, where no hot-key shortcut is
    /// taken).
    pub(super) fn all_unanswered(&self, ours: &mut dyn FnMut(usize, &Rc<Slot>) -> bool) -> bool {
        match self {
            Work::Ready(_) | Work::Stats | Work::StatsReset => true,
            Work::Lines { parts, finish, .. } => parts
                .iter()
                .chain(OlderForget::parts(finish.older()))
                .all(|p| p.all_unanswered(ours)),
            Work::Steps(steps) => steps
                .parts
                .iter()
                .chain(OlderForget::parts(steps.older.as_ref()))
                .all(|p| p.all_unanswered(ours)),
            Work::Retrieve { in_flight, .. } => in_flight
                .iter()
                .filter(|sub| sub.slot.outcome().is_none())
                .all(|sub| ours(sub.server as usize, &sub.slot)),
        }
    }
}

/// What a session waits for from its servers while it dispatches one entry:
/// the entries before it, its `noreply` writes, and the entry's own
/// sub-requests already sent.
pub(super) struct Earlier<'a> {
    /// The entries before the one being dispatched.
    pub(super) entries: super::fifo::Before<'a, Entry>,
    pub(super) unanswered: &'a [(ServerSlots, Reservation, Option<Planned>)],
    pub(super) current: &'a [SubInFlight],
}

impl Unanswered for Earlier<'_> {
    fn all_to(&self, server: usize, ours: &mut dyn FnMut(&Rc<Slot>) -> bool) -> bool {
        let mut ours = |to: usize, slot: &Rc<Slot>| to != server || ours(slot);
        self.current
            .iter()
            .filter(|sub| sub.slot.outcome().is_none())
            .all(|sub| ours(sub.server as usize, &sub.slot))
            && self
                .entries
                .iter()
                .all(|entry| entry.work.all_unanswered(&mut ours))
            && self
                .unanswered
                .iter()
                .flat_map(|(slots, ..)| slots)
                .filter(|(_, slot)| slot.outcome().is_none())
                .all(|(to, slot)| ours(*to, slot))
    }
}

/// Reply slots, each with the server it waits for.
/// A retrieval's sub-requests in flight.
pub(super) type InFlight = SmallVec<[SubInFlight; 2]>;

pub(super) type ServerSlots = SmallVec<[(usize, Rc<Slot>); 1]>;

/// What a retrieval is owed now: the estimate for each sub-request still in
/// flight and the values its plan holds. One reservation covers both, so a
/// retrieval over many servers takes one, not one per server.
pub(super) fn retrieval_owed(in_flight: &InFlight, plan: &Retrieval) -> usize {
    in_flight.iter().map(|sub| sub.cost).sum::<usize>() + plan.held_bytes()
}

/// Nothing arrived for a retrieval since it was last looked at, and a look
/// would change nothing (`ClientSession::absorb`): every sub-request in
/// flight still waits, no block sets the client's estimate, and it is not a
/// retrieval sent whole and answered (whose look sets the estimate too). A
/// get finds its entry so in the turn that sends it, and whenever a wake is
/// for another entry.
pub(super) fn nothing_arrived(in_flight: &InFlight, plan: &Retrieval) -> bool {
    plan.largest_block() == 0
        && (!in_flight.is_empty() || plan.has_unsent())
        && in_flight.iter().all(|sub| sub.slot.is_waiting())
}

/// Value bytes a retrieval at the head of the replies holds before it
/// writes them ahead of its slower servers' answers.
const STREAM_FROM_HELD_BYTES: usize = 16 * 1024;

/// What the head of a client's replies can do in this turn, once what
/// arrived for it was looked at (see [`Work::head_now`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeadNow {
    /// It can neither finish nor write anything yet: the replies behind it
    /// wait too. Its slots wake the session when replies come.
    Waits,
    /// It may finish; until it does, it writes nothing.
    Finishes,
    /// Its values go out as they arrive; it may finish too when `finishes`
    /// (every key sent and answered).
    Streams { finishes: bool },
}

impl HeadNow {
    /// Whether the head may finish now: the one answer `finish` acts on.
    pub(super) fn finishes(self) -> bool {
        matches!(
            self,
            HeadNow::Finishes | HeadNow::Streams { finishes: true }
        )
    }
}

impl Work {
    /// Can this work, at the head of the replies (`dispatched` or not),
    /// write or finish now? Asked once a look (`ClientSession::absorb`)
    /// took what arrived. Only a retrieval may wait there, or write before
    /// it finishes:
    /// - it streams while some of its keys are unsent, or once it holds
    ///   [`STREAM_FROM_HELD_BYTES`] of values (the `END` only when it is
    ///   complete);
    /// - below that, with every key sent, a reply is written whole, in one
    ///   write rather than one per server's answer (its values stay
    ///   reserved meanwhile), so while a server it waits for has not
    ///   answered it has nothing to do. A W1 get is so in the turn that
    ///   sends it: going on to finish it cost about 3 % of its
    ///   instructions.
    ///
    /// It may finish once every key is sent and answered; `finish` asks
    /// [`HeadNow::finishes`] of this answer, not the retrieval again.
    pub(super) fn head_now(&self, dispatched: bool) -> HeadNow {
        let Work::Retrieve {
            plan, in_flight, ..
        } = self
        else {
            return if dispatched {
                HeadNow::Finishes
            } else {
                HeadNow::Waits
            };
        };
        // It waits while keys are unsent, or in flight and not settled:
        // with zones read all at once, a zone still answering a settled key
        // is not waited for.
        let unsent = plan.has_unsent();
        let finishes = || dispatched && !unsent && (in_flight.is_empty() || plan.settled());
        if unsent || plan.held_bytes() >= STREAM_FROM_HELD_BYTES {
            return HeadNow::Streams {
                finishes: finishes(),
            };
        }
        if finishes() {
            HeadNow::Finishes
        } else {
            HeadNow::Waits
        }
    }
}

/// A retrieval's sub-request in flight.
pub(super) struct SubInFlight {
    pub(super) id: u32,
    /// A backend index, in 4 bytes beside `id`: two of these sit inline in
    /// every retrieval's entry (see [`Finish::Quorum`]'s counts).
    pub(super) server: u32,
    pub(super) slot: Rc<Slot>,
    /// Reply bytes reserved for it, within its retrieval's reservation.
    pub(super) cost: usize,
}

/// One server's one-line reply to wait for.
pub(super) struct Part {
    pub(super) server: usize,
    pub(super) slot: Option<Rc<Slot>>,
    pub(super) result: Option<CallResult>,
}

impl Part {
    pub(super) fn new(server: usize) -> Part {
        Part {
            server,
            slot: None,
            result: None,
        }
    }

    /// Whether `ours` accepts the slot of this part's reply, if it has not
    /// fully arrived (see [`Work::all_unanswered`]).
    pub(super) fn all_unanswered(&self, ours: &mut dyn FnMut(usize, &Rc<Slot>) -> bool) -> bool {
        match &self.slot {
            Some(slot) if slot.outcome().is_none() => ours(self.server, slot),
            _ => true,
        }
    }

    /// Takes the reply if it has arrived.
    pub(super) fn absorb(&mut self) {
        if self.result.is_some() {
            return;
        }
        let Some(slot) = &self.slot else {
            return;
        };
        let Some(outcome) = slot.outcome() else {
            return;
        };
        // The bytes with what the connection framed them as.
        self.result = Some(match outcome {
            Ok(said) => Ok(Reply::new(
                said,
                match slot.take() {
                    Some(Got::Line(line) | Got::Value(line)) => line,
                    None => Bytes::new(),
                },
            )),
            Err(error) => Err::<Reply, BackendError>(error),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_fits_in_256_bytes() {
        // Entries are moved whole into and out of the FIFO: up to 256 bytes,
        // glibc's `memcpy` copies without its loop.
        let size = std::mem::size_of::<Entry>();
        assert!(size <= 256, "{size}");
    }

    #[test]
    fn a_part_takes_its_one_line_reply_once_it_is_complete() {
        let slot = Slot::new(Rc::new(crate::runtime::wake::Wake::new()));
        let mut part = Part::new(3);
        part.slot = Some(slot.clone());
        let mut waited = Vec::new();
        assert!(!part.all_unanswered(&mut |server, _| {
            waited.push(server);
            false
        }));
        assert_eq!(waited, [3], "an unanswered part names its server");
        slot.push(Got::Line(Bytes::from_static(b"STORED\r\n")));
        part.absorb();
        assert!(part.result.is_none(), "not complete yet");
        // The connection hands over what it framed the reply as.
        slot.finish(Ok(crate::protocol::outcome::Outcome::Stored));
        part.absorb();
        assert_eq!(
            part.result.as_ref().unwrap().as_ref().unwrap(),
            &Reply::from_static(b"STORED\r\n")
        );
        assert!(part.all_unanswered(&mut |_, _| false), "answered");
    }

    /// `get a b` over servers 0 and 1 as a head's retrieval, and its two
    /// sub-requests sent.
    fn head_get() -> (Work, u32, u32) {
        let bytes = Bytes::from_static(b"get a b\r\n");
        let limits = crate::protocol::Limits::default();
        let (request, _) = crate::protocol::parse_request(&bytes, &limits)
            .unwrap()
            .unwrap();
        let candidates = vec![smallvec::smallvec![0], smallvec::smallvec![1]];
        let plan = Retrieval::with_candidates(&request, bytes, candidates, false);
        let mut work = Work::Retrieve {
            plan: Box::new(plan),
            in_flight: InFlight::new(),
            owed: Reservation::default(),
        };
        // Keys unsent: what it holds goes out as it comes.
        assert_eq!(work.head_now(false), HeadNow::Streams { finishes: false });
        let Work::Retrieve {
            plan, in_flight, ..
        } = &mut work
        else {
            unreachable!()
        };
        let mut lines = crate::runtime::recycled::RecycledBuf::new(64);
        for sub in plan.next_chunk(100, &mut lines) {
            in_flight.push(SubInFlight {
                id: sub.id,
                server: sub.server as u32,
                slot: Slot::new(Rc::new(crate::runtime::wake::Wake::new())),
                cost: 0,
            });
        }
        let ids = (in_flight[0].id, in_flight[1].id);
        (work, ids.0, ids.1)
    }

    /// Feeds sub-request `id`'s value block, if any, and its `END` (the
    /// connection frames it and hands on no piece for it), as `absorb` does.
    fn answered(work: &mut Work, id: u32, value: Option<Bytes>) {
        let Work::Retrieve {
            plan, in_flight, ..
        } = work
        else {
            unreachable!()
        };
        if let Some(block) = value {
            plan.on_piece(id, Got::Value(block));
        }
        plan.on_done(id, Ok(Outcome::End), || 0);
        in_flight.retain(|sub| sub.id != id);
    }

    #[test]
    fn a_small_multi_get_at_the_head_waits_for_every_server_then_finishes_whole() {
        let (mut work, a, b) = head_get();
        assert_eq!(work.head_now(true), HeadNow::Waits, "nothing came");
        assert_eq!(work.head_now(false), HeadNow::Waits);
        let value = Bytes::from_static(b"VALUE b 0 1\r\nx\r\n");
        answered(&mut work, b, Some(value));
        assert_eq!(work.head_now(true), HeadNow::Waits, "held, not written");
        answered(&mut work, a, None);
        assert_eq!(work.head_now(true), HeadNow::Finishes);
        assert!(work.head_now(true).finishes());
        // Any other work finishes, or waits to be dispatched.
        assert_eq!(Work::Stats.head_now(true), HeadNow::Finishes);
        assert_eq!(Work::Stats.head_now(false), HeadNow::Waits);
    }

    #[test]
    fn a_multi_get_at_the_head_holding_16_kib_streams_ahead_of_its_slower_server() {
        let (mut work, a, b) = head_get();
        let data = "x".repeat(STREAM_FROM_HELD_BYTES);
        let value = format!("VALUE b 0 {}\r\n{data}\r\n", data.len());
        answered(&mut work, b, Some(Bytes::from(value)));
        assert_eq!(work.head_now(true), HeadNow::Streams { finishes: false });
        assert!(!work.head_now(true).finishes(), "a server has not answered");
        answered(&mut work, a, None);
        let now = work.head_now(true);
        assert_eq!(now, HeadNow::Streams { finishes: true });
        assert!(now.finishes());
        assert!(!work.head_now(false).finishes(), "not dispatched");
    }
}
