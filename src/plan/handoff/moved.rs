//! [`Moved`]: one command on a moved key, step by step, in either dialect.

use bytes::{BufMut, Bytes, BytesMut};

use super::cas::{CasTakeover, Turn};
use super::copy::{copy_block, CopyCheck, CopyEnd, CopyOutcome, CopyStep, LeaseCopy};
use super::lines::{forget_line, probe_hand_back, probe_line, probed_lease};
use super::read_through::{
    fetch_line, fetched_cas, meta_read_through_hit, read_through_hit, AddedFlags,
};
use super::{meta_expect, CallResult, Copies, Owner, Step};
use crate::protocol::encode::{forwardable, Outbound};
use crate::protocol::meta::reply::meta_absent;
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::{Expect, LineKind};
use crate::protocol::{Command, Request};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A meta read: the new owner; after a miss the previous owner, whose
    /// hit is answered and copied.
    Read,
    /// Removed from the previous owner, then from the new one.
    Delete,
    /// Run on the new owner; if the key is absent there, copy it from the
    /// previous owner and run again (`incr`, `decr`, `append`, `prepend`,
    /// `touch`, `replace`).
    RetryAfterCopy,
    /// Copy from the previous owner first, then run (`add`: it must not
    /// store over a value the previous owner still holds).
    CopyFirst,
    /// `cas` on the new owner; if it did not store there (the unique came
    /// from the previous owner, or the key is not on the new owner yet),
    /// taken over by [`CasTakeover`].
    Cas,
    /// `set` on the new owner.
    Overwrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Start,
    /// Waiting for the first reply (new owner, or the previous owner for
    /// `delete`).
    First,
    /// Waiting for the previous owner's `get`.
    Fetch,
    /// The fetched item's copy under way through its lease (see
    /// [`LeaseCopy`]): the lease, added on the new owner only where the key
    /// is absent; the check, which deletes the fetched item from the
    /// previous owner by its cas (if it is gone or changed there, a write
    /// of the key, which removes it from the previous owner first, may
    /// have reached the new owner before the lease did); then the copy
    /// replacing the lease, or the lease taken back, by its cas. Also a
    /// lease taken over with nothing to copy, taken back by its cas.
    Copy,
    /// An `incr`, `decr` or `ma` found a value that is not a number on the
    /// new owner; waiting for what it is (`mg … c f s`): another copy's
    /// lease is taken over (see [`Moved::take_over_lease`]).
    Probe,
    /// Waiting for the final reply.
    Last,
    /// Waiting for the new owner to take back the recache token a probe
    /// took (see [`probe_hand_back`]).
    HandBack,
    /// A refused `cas` taken over (see [`CasTakeover`]).
    TakeOver,
    /// The command changed the key on its new owner; waiting for the
    /// previous owner to `delete` its now older copy before answering.
    Forget,
}

/// The steps a classic command on a moved key takes; `None` when it needs
/// only the new owner.
///
/// Every command that changes the key on its new owner is answered only once
/// the previous owner has deleted its copy: the previous owner's value is now
/// older than an acknowledged write, and a sidecar still on the old ring, or
/// this one after the change is undone, would read it there. A miss is
/// always allowed; a value older than an acknowledged write never is.
fn kind_of(command: Command) -> Option<Kind> {
    match command {
        Command::Delete => Some(Kind::Delete),
        Command::Incr
        | Command::Decr
        | Command::Append
        | Command::Prepend
        | Command::Touch
        | Command::Replace => Some(Kind::RetryAfterCopy),
        Command::Add => Some(Kind::CopyFirst),
        Command::Cas => Some(Kind::Cas),
        Command::Set => Some(Kind::Overwrite),
        _ => None,
    }
}

/// One command on a moved key, in progress, in either dialect: the steps
/// are the same, and the dialect only says what a reply means and how the
/// machine's own requests (fetch, forget, copy) are written.
#[derive(Debug)]
pub(crate) struct Moved {
    kind: Kind,
    stage: Stage,
    /// The client's request as it goes to a server, and how its reply is
    /// framed.
    request: Outbound,
    expect: Expect,
    /// The key: classic, or a meta token (base64 with `b`).
    key: Bytes,
    meta: Option<Meta>,
    /// The first reply, answered if nothing better comes.
    first: Option<CallResult>,
    /// What a `cas` the new owner refuses goes on with.
    takeover: Option<CasTakeover>,
    /// A meta read-through's copy for the new owner, once answered.
    read_copy: Option<Outbound>,
    /// What the counters are told, once (see [`Moved::take_tally`]).
    tally: Tally,
    /// The fetched item's copy, while under way.
    copy: Option<LeaseCopy>,
    /// The cas of another copy's lease taken over on the new owner, until
    /// this command's copy replaces it or takes it back.
    lease_cas: Option<u64>,
    /// The check deleted the previous owner's item: no other delete there.
    forgotten: bool,
    /// The new owner was probed for a lease once: never again.
    probed: bool,
    /// That probe followed this command's own copy finding the key held.
    probed_after_copy: bool,
    /// A delete reaches the previous owner once more, last (see
    /// [`Moved::delete_previous_last_too`]).
    delete_again: bool,
    /// A delete found another sidecar's lease on the new owner.
    new_held_lease: bool,
    /// The new owner was looked at before the command ran (`replace`).
    looked_first: bool,
    /// A `replace` (classic or `ms … MR`) or an `ms` compared by cas: on a
    /// lease the one would store, the other answer `EX` (its cas is not
    /// the lease's), where an absent key answers `NS`. Set by the planner,
    /// as the kind is.
    replaces: bool,
    /// A probe's reply, kept while the token it took goes back.
    probe_seen: Option<CallResult>,
    /// Whether the previous owner's value may be copied to the new owner.
    copies: Copies,
}

/// What a step of [`Moved`] did that the hand-off counters count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// The previous owner was read for the key: whether it had it.
    pub read_through: Option<bool>,
    /// A copy went to the new owner, and how it answered.
    pub copy: Option<CopyOutcome>,
    /// A copy was deleted again from the new owner.
    pub taken_back: bool,
}

/// What a meta command adds to the machine.
#[derive(Debug)]
struct Meta {
    command: MetaCommand,
    base64: bool,
    /// For `mg` (a read-through): the request asked of the previous owner
    /// after a miss, with what a copy needs added, and which flags those
    /// are (left out of the client's answer).
    read: Option<(Outbound, AddedFlags)>,
}

impl Moved {
    /// A classic command on a moved key; `None` when the command needs
    /// only the new owner (see [`kind_of`]).
    pub(crate) fn new(request: &Request, bytes: &Bytes, copies: Copies) -> Option<Moved> {
        let kind = kind_of(request.command)?;
        let key = bytes.slice_ref(request.key(bytes, 0));
        let takeover = (kind == Kind::Cas).then(|| CasTakeover::classic(request, bytes));
        Some(Moved {
            kind,
            stage: Stage::Start,
            request: forwardable(bytes, request),
            expect: Expect::Line(request.command.reply_line().unwrap_or(LineKind::Storage)),
            key,
            meta: None,
            first: None,
            takeover,
            read_copy: None,
            tally: Tally::default(),
            copy: None,
            lease_cas: None,
            forgotten: false,
            probed: false,
            probed_after_copy: false,
            delete_again: false,
            new_held_lease: false,
            looked_first: false,
            replaces: request.command == Command::Replace,
            probe_seen: None,
            copies,
        })
    }

    /// A meta command on a moved key. `key` is its token as sent (and
    /// whether it is base64); `wire` and `expect` the request as it goes to
    /// a server. `read` is an `mg`'s read-through request (see
    /// [`meta_read_through_line`]); `as_set` a `ms … C`'s store without
    /// `C` (see `route::meta_copy`).
    pub(crate) fn meta(
        what: MetaMove,
        copies: Copies,
        command: MetaCommand,
        key: (Bytes, bool),
        wire: Outbound,
        expect: Expect,
    ) -> Moved {
        let replaces = matches!(what, MetaMove::RetryAfterCopy { replaces: true });
        let (kind, read, takeover) = match what {
            MetaMove::Read { wire, added } => (Kind::Read, Some((wire, added)), None),
            MetaMove::RetryAfterCopy { .. } => (Kind::RetryAfterCopy, None, None),
            MetaMove::CopyFirst => (Kind::CopyFirst, None, None),
            MetaMove::Overwrite => (Kind::Overwrite, None, None),
            MetaMove::Cas { as_set } => {
                let takeover = CasTakeover::new(
                    key.0.clone(),
                    Some(key.1),
                    wire.clone(),
                    expect.clone(),
                    smallvec::smallvec![as_set],
                );
                (Kind::Cas, None, Some(takeover))
            }
            MetaMove::Delete => (Kind::Delete, None, None),
        };
        Moved {
            kind,
            stage: Stage::Start,
            request: wire,
            expect,
            key: key.0,
            meta: Some(Meta {
                command,
                base64: key.1,
                read,
            }),
            first: None,
            takeover,
            read_copy: None,
            tally: Tally::default(),
            copy: None,
            lease_cas: None,
            forgotten: false,
            probed: false,
            probed_after_copy: false,
            delete_again: false,
            new_held_lease: false,
            looked_first: false,
            replaces,
            probe_seen: None,
            copies,
        }
    }

    /// What the machine may do with the previous owner's value.
    #[cfg(test)]
    pub(crate) fn copies(&self) -> Copies {
        self.copies
    }

    /// A sidecar still on an older ring may be copying the key from its new
    /// owner to its previous one (a change undone within its window): a
    /// delete, which reaches the previous owner first for the hand-off's
    /// own copies, then reaches it again after the new owner, so that
    /// copy's source loses the key before its destination does too.
    pub(crate) fn delete_previous_last_too(&mut self) {
        self.delete_again = self.kind == Kind::Delete;
    }

    /// The first step.
    pub(crate) fn start(&mut self) -> Step {
        match self.kind {
            Kind::Delete => {
                self.stage = Stage::First;
                self.send(Owner::Previous)
            }
            // A `replace` would replace a lease and leave no trace of it:
            // the new owner is looked at first.
            Kind::RetryAfterCopy if self.replaces && self.copies != Copies::Never => {
                self.probed = true;
                self.looked_first = true;
                self.probe()
            }
            Kind::Read | Kind::RetryAfterCopy | Kind::Cas | Kind::Overwrite => {
                self.stage = Stage::First;
                self.send(Owner::New)
            }
            Kind::CopyFirst if self.copies == Copies::Never => {
                self.stage = Stage::First;
                self.send(Owner::New)
            }
            Kind::CopyFirst => self.fetch(),
        }
    }

    /// What the last step did for the hand-off counters; once.
    pub(crate) fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    /// The key as the machine sends it, and whether that token is base64.
    pub(crate) fn key_token(&self) -> (Bytes, bool) {
        (
            self.key.clone(),
            self.meta.as_ref().is_some_and(|m| m.base64),
        )
    }

    /// A meta read-through's copy of the value for the new owner (`ms … ME`),
    /// once the machine has answered.
    pub(crate) fn take_read_copy(&mut self) -> Option<Outbound> {
        self.read_copy.take()
    }

    /// The reply to the last step's `lines`. `now` is the Unix time, for the
    /// remaining TTL of a copy beyond 30 days.
    pub(crate) fn on_reply(&mut self, result: CallResult, now: u64) -> Step {
        // The arms are tried in order: a guard further up wins.
        match (self.kind, self.stage) {
            // The probe's recache token is back: on as the probe said.
            (Kind::Delete, Stage::HandBack) => self.run_on_new(),
            (_, Stage::HandBack) => {
                let probe = self.probe_seen.take().unwrap_or(result);
                self.no_lease_found(probe)
            }
            // Answered whatever the previous owner said: if it failed,
            // readers of the old ring cannot reach it either.
            (_, Stage::Forget) => Step::Answer(self.first.take().unwrap_or(result)),
            // The new owner is looked at first: a delete that removes
            // another sidecar's lease there removed nothing of the client's.
            (Kind::Delete, Stage::First) => {
                self.first = Some(result);
                self.probe()
            }
            (Kind::Delete, Stage::Probe) => self.delete_probed(result),
            (Kind::Delete, _) => self.delete_answered(result),
            // Nothing is copied: whatever the new owner answered, the
            // previous owner's copy goes before the answer (the key is
            // absent to this command, so it must be to every later read).
            (
                Kind::RetryAfterCopy | Kind::CopyFirst | Kind::Cas | Kind::Overwrite,
                Stage::First,
            ) if self.copies == Copies::Never => self.forget_previous(result),
            (Kind::Read, Stage::First) => self.read_new_answered(result),
            (Kind::Read, _) => self.read_previous_answered(result, now),
            (
                kind @ (Kind::RetryAfterCopy | Kind::CopyFirst),
                stage @ (Stage::First | Stage::Last),
            ) if !self.probed && self.may_be_on_a_lease(kind, stage, &result) => {
                self.probed = true;
                self.first = Some(result);
                self.probe()
            }
            (_, Stage::Probe) => self.take_over_lease(result),
            (Kind::RetryAfterCopy, Stage::First) => {
                if self.absent(&result) {
                    self.first = Some(result);
                    self.fetch()
                } else {
                    self.answer_changed(result)
                }
            }
            (Kind::Overwrite, Stage::First) => self.answer_changed(result),
            (Kind::RetryAfterCopy | Kind::CopyFirst, Stage::Fetch) => self.fetched(result, now),
            (_, Stage::Copy) => self.copy_answered(result),
            (Kind::RetryAfterCopy | Kind::CopyFirst, _) if self.forgotten => Step::Answer(result),
            (Kind::Cas, Stage::First) => match self.takeover.as_mut() {
                Some(takeover) if takeover.overturnable(&result) => {
                    self.stage = Stage::TakeOver;
                    let turn = takeover.begin(result);
                    self.take_turn(turn)
                }
                _ => self.answer_changed(result),
            },
            (Kind::Cas, _) => match self.takeover.as_mut() {
                Some(takeover) => {
                    let turn = takeover.on_reply(result);
                    self.take_turn(turn)
                }
                None => Step::Answer(result),
            },
            // Changed on the new owner after the copy: the previous owner's
            // value is older now (an `ma … N` continued its count).
            (Kind::RetryAfterCopy | Kind::CopyFirst, _) => self.answer_changed(result),
            (_, _) => Step::Answer(result),
        }
    }

    /// A delete's probe of the new owner answered: its recache token goes
    /// back if the probe took it, then the delete runs there.
    fn delete_probed(&mut self, result: CallResult) -> Step {
        let reply = result.as_ref().ok();
        self.new_held_lease = reply.and_then(probed_lease).is_some();
        let (key, base64) = self.key_token();
        match reply.and_then(|reply| probe_hand_back(reply, &key, base64)) {
            Some(line) => self.hand_back(line, result),
            None => self.run_on_new(),
        }
    }

    /// A delete answered by both owners (`result` is the new owner's).
    fn delete_answered(&mut self, result: CallResult) -> Step {
        let previous = self.first.take().unwrap_or_else(|| result.clone());
        // What the new owner held was a lease: the previous owner's
        // answer alone says whether the key was there (also for a
        // quiet `md`, whose success says nothing).
        let answer = match self.new_held_lease {
            true => previous,
            false => self.merge_delete(result, previous),
        };
        if self.delete_again {
            return self.forget_previous(answer);
        }
        Step::Answer(answer)
    }

    /// An `mg` answered by the new owner: a miss asks the previous owner.
    fn read_new_answered(&mut self, result: CallResult) -> Step {
        let Some((wire, _)) = self.meta.as_ref().and_then(|m| m.read.as_ref()) else {
            return Step::Answer(result);
        };
        if !matches!(&result, Ok(reply) if reply.outcome.meta_miss()) {
            return Step::Answer(result);
        }
        let lines = wire.clone();
        self.first = Some(result);
        self.stage = Stage::Fetch;
        Step::Send {
            to: Owner::Previous,
            lines,
            expect: self.expect.clone(),
        }
    }

    /// An `mg` answered by the previous owner: its hit is the answer, and
    /// its copy goes to the new owner once answered.
    fn read_previous_answered(&mut self, result: CallResult, now: u64) -> Step {
        let hit = match (&result, &self.meta) {
            (
                Ok(reply),
                Some(Meta {
                    base64,
                    read: Some((_, added)),
                    ..
                }),
            ) => meta_read_through_hit(reply, *added, &self.key, *base64, now),
            _ => None,
        };
        self.tally.read_through = Some(hit.is_some());
        match hit {
            Some((answer, copy)) => {
                self.read_copy = copy.filter(|_| self.copies == Copies::ThroughLease);
                Step::Answer(Ok(answer))
            }
            // A miss (or a failure) there too: the owner's miss, as
            // the client asked.
            None => Step::Answer(self.first.take().unwrap_or(result)),
        }
    }

    /// Whether the first (or last) answer of a command that copies may have
    /// come from another copy's lease rather than the key's value, so the
    /// new owner is probed.
    fn may_be_on_a_lease(&self, kind: Kind, stage: Stage, result: &CallResult) -> bool {
        match kind {
            // Its own copy, if made, is what refused it.
            Kind::CopyFirst => !self.forgotten && (not_a_number(result) || not_stored(result)),
            _ => {
                not_a_number(result) || (stage == Stage::First && self.may_have_met_a_lease(result))
            }
        }
    }

    /// The previous owner's item for a copy: the copy's lease goes to the
    /// new owner (or the check, over a lease taken over). The copy keeps the
    /// remaining TTL; an item that expires within the second is not copied
    /// (0 would keep it forever).
    fn fetched(&mut self, result: CallResult, now: u64) -> Step {
        let copy = match &result {
            Ok(reply) => self.copy_of(reply, now).zip(fetched_cas(reply)),
            Err(_) => None,
        };
        self.tally.read_through = Some(copy.is_some());
        match (copy, self.first.take()) {
            (Some((copy, cas)), first) => {
                self.first = first;
                self.stage = Stage::Copy;
                let (key, base64) = self.key_token();
                let mut machine = LeaseCopy::new(key, base64, copy, CopyCheck::Forget(cas));
                let step = match self.lease_cas.take() {
                    // Another copy's lease taken over: it is in place.
                    Some(lease) => machine.start_over(lease),
                    None => machine.start(),
                };
                self.copy = Some(machine);
                self.copy_step(step)
            }
            // Nothing to copy over the lease taken over: it goes
            // (by its cas), and the command then finds the key
            // absent, as memcached would answer it.
            (None, _) if self.lease_cas.is_some() => self.take_back(),
            // Not on the previous owner either: the first answer
            // stands (or, for `add`, run it now).
            (None, Some(first)) => Step::Answer(first),
            (None, None) => self.run_on_new(),
        }
    }

    /// The reply to the copy's last message.
    fn copy_answered(&mut self, result: CallResult) -> Step {
        let step = match self.copy.as_mut() {
            Some(machine) => machine.on_reply(result),
            None => return self.run_on_new(),
        };
        self.copy_step(step)
    }

    /// The copy's next message as a step, or once it ended, the command
    /// run on the new owner.
    fn copy_step(&mut self, step: CopyStep) -> Step {
        let end = match step {
            CopyStep::Send { to, wire, expect } => {
                return Step::Send {
                    to,
                    lines: wire,
                    expect,
                }
            }
            CopyStep::Done(end) => end,
        };
        self.copy = None;
        match end {
            // The new owner had the key already (a write, or another
            // copy's lease, reached it first): held by another sidecar's
            // lease, maybe. A command that needs the value takes that
            // lease over, as an `incr` does, rather than run on it (an
            // `mg … T` would stretch it and miss).
            CopyEnd::NotLeased(CopyOutcome::Skipped)
                if matches!(self.kind, Kind::RetryAfterCopy | Kind::CopyFirst) && !self.probed =>
            {
                self.probed = true;
                self.probed_after_copy = true;
                return self.probe();
            }
            // Nothing copied.
            CopyEnd::NotLeased(outcome) => self.tally.copy = Some(outcome),
            // The fetched item was still there once the lease was in
            // place (a later delete reaches the new owner after the lease,
            // and the fill then fails); the check deleted it.
            CopyEnd::Filled(outcome) => {
                self.forgotten = true;
                self.tally.copy = Some(outcome);
            }
            // Gone or changed (or no answer), or nothing to copy over a
            // lease taken over: when in doubt, no copy; the lease went, by
            // its cas, so something newer that replaced it stays.
            CopyEnd::TakenBack(removed) => self.tally.taken_back = removed,
        }
        // The command now finds the copy, or what a write left.
        self.run_on_new()
    }

    /// A takeover's turn as a step. A `cas` it stored leaves the previous
    /// owner's value behind, which a write that beat the copy to the new
    /// owner has made older: it goes before the answer.
    fn take_turn(&mut self, turn: Turn) -> Step {
        match turn {
            Turn::Send { to, lines, expect } => Step::Send { to, lines, expect },
            Turn::Refused(answer) => Step::Answer(answer),
            Turn::Stored(answer) => self.forget_previous(answer),
        }
    }

    /// Answers `result`, first deleting the previous owner's copy when the
    /// command changed the key on the new owner.
    fn answer_changed(&mut self, result: CallResult) -> Step {
        if !self.changed(&result) {
            return Step::Answer(result);
        }
        self.forget_previous(result)
    }

    /// Deletes the key from its previous owner, then answers `answer`.
    fn forget_previous(&mut self, answer: CallResult) -> Step {
        self.first = Some(answer);
        self.stage = Stage::Forget;
        let (lines, expect) = match &self.meta {
            None => {
                let mut line = BytesMut::with_capacity(self.key.len() + 9);
                line.put_slice(b"delete ");
                line.put_slice(&self.key);
                line.put_slice(b"\r\n");
                (line.freeze(), Expect::Line(LineKind::Delete))
            }
            Some(meta) => (
                forget_line(&self.key, meta.base64),
                meta_expect(MetaCommand::Delete),
            ),
        };
        Step::Send {
            to: Owner::Previous,
            lines: smallvec::smallvec![lines],
            expect,
        }
    }

    /// Deletes a lease taken over from the new owner by its cas, so a write
    /// that replaced it stays (through the copy machine, which ends there).
    fn take_back(&mut self) -> Step {
        let Some(lease) = self.lease_cas.take() else {
            return self.run_on_new();
        };
        self.stage = Stage::Copy;
        let (key, base64) = self.key_token();
        let (machine, step) = LeaseCopy::taking_back(key, base64, lease);
        self.copy = Some(machine);
        self.copy_step(step)
    }

    /// The new owner's item after an `incr`, `decr` or `ma` found it not a
    /// number. Another sidecar's (or worker's) read-through may have put
    /// its copy's lease there a moment ago: then this command makes the
    /// copy itself, over that lease (by its cas, which the other copy then
    /// fails on), as it would for an absent key, and runs again on it, so
    /// it continues the count rather than answering `CLIENT_ERROR`. Any
    /// other item: the new owner's answer stands.
    fn take_over_lease(&mut self, probe: CallResult) -> Step {
        let lease = match &probe {
            Ok(reply) => probed_lease(reply),
            Err(_) => None,
        };
        if let Some(lease) = lease {
            self.lease_cas = Some(lease);
            self.first = None;
            return self.fetch();
        }
        // The probe took a stale item's recache token: given back before
        // anything else (see `probe_hand_back`).
        let hand_back = probe.as_ref().ok().and_then(|reply| {
            let (key, base64) = self.key_token();
            probe_hand_back(reply, &key, base64)
        });
        match hand_back {
            Some(line) => self.hand_back(line, probe),
            None => self.no_lease_found(probe),
        }
    }

    /// Sends the `md` that gives back the recache token `probe` took; the
    /// probe's reply is kept for what comes after.
    fn hand_back(&mut self, line: Bytes, probe: CallResult) -> Step {
        self.probe_seen = Some(probe);
        self.stage = Stage::HandBack;
        Step::Send {
            to: Owner::New,
            lines: smallvec::smallvec![line],
            expect: meta_expect(MetaCommand::Delete),
        }
    }

    /// [`Moved::take_over_lease`] when the probe found no lease.
    fn no_lease_found(&mut self, probe: CallResult) -> Step {
        // No lease before a `replace`: it runs as it would have.
        if self.looked_first && self.first.is_none() {
            self.looked_first = false;
            self.stage = Stage::First;
            return self.send(Owner::New);
        }
        // The copy found a value there (a write got in first): the command
        // runs on it, as before the probe.
        if self.probed_after_copy {
            self.tally.copy = Some(CopyOutcome::Skipped);
            return self.run_on_new();
        }
        let first = self.first.take().unwrap_or(probe);
        if not_a_number(&first) {
            return Step::Answer(first);
        }
        if self.touches() {
            // The touch may have reached a lease that another copy then
            // replaced (a touch keeps the cas): once more, on what is there
            // now.
            self.stage = Stage::First;
            return self.send(Owner::New);
        }
        self.answer_changed(first)
    }

    /// Looks at the new owner's item, seeing a lease as the item it is.
    fn probe(&mut self) -> Step {
        self.stage = Stage::Probe;
        let (key, base64) = self.key_token();
        Step::Send {
            to: Owner::New,
            lines: smallvec::smallvec![probe_line(&key, base64)],
            // The probe is what sees the lease as a lease.
            expect: Expect::Meta {
                command: MetaCommand::Get,
                quiet: false,
                replied: false,
                leases_shown: true,
            },
        }
    }

    /// Whether the new owner's success may have been on another sidecar's
    /// lease: to memcached a lease is an item, which a `touch` touches and
    /// an `append`, `prepend` or `replace` (and their `ms` modes) stores
    /// onto. The lease is then taken over as for `incr`
    /// ([`Moved::take_over_lease`]), so the command acts on the key's
    /// value, never on the lease (which would stretch it, or lose the
    /// command with it when its copy replaced it).
    fn may_have_met_a_lease(&self, result: &CallResult) -> bool {
        let Ok(reply) = result else {
            return false;
        };
        match &self.meta {
            None => match self.expect {
                Expect::Line(LineKind::Touch) => reply.outcome == Outcome::Touched,
                Expect::Line(LineKind::Storage) => reply.outcome == Outcome::Stored,
                _ => false,
            },
            // Quiet: an `ms` that stored says nothing.
            Some(meta) => {
                meta.command == MetaCommand::Set
                    && matches!(reply.outcome, Outcome::Nothing | Outcome::Hd)
            }
        }
    }

    /// A classic `touch`: its change keeps the item's cas.
    fn touches(&self) -> bool {
        self.meta.is_none() && self.expect == Expect::Line(LineKind::Touch)
    }

    /// Asks the previous owner for the key with what a copy needs: value,
    /// client flags and remaining TTL.
    fn fetch(&mut self) -> Step {
        self.stage = Stage::Fetch;
        let base64 = self.meta.as_ref().is_some_and(|m| m.base64);
        Step::Send {
            to: Owner::Previous,
            expect: meta_expect(MetaCommand::Get),
            // With the cas: the check after the copy compares by it.
            lines: smallvec::smallvec![fetch_line(&self.key, base64, true)],
        }
    }

    /// Runs the command on the new owner, as its last step.
    fn run_on_new(&mut self) -> Step {
        self.stage = Stage::Last;
        self.send(Owner::New)
    }

    fn send(&self, to: Owner) -> Step {
        Step::Send {
            to,
            lines: self.request.clone(),
            expect: self.expect.clone(),
        }
    }

    /// The copy for the new owner made from the previous owner's reply to a
    /// [`fetch_line`]: `add` for classic, `ms … ME` for meta.
    fn copy_of(&self, reply: &Reply, now: u64) -> Option<Outbound> {
        match &self.meta {
            None => read_through_hit(&self.key, reply, false, now)
                .and_then(|hit| copy_block(&hit.block, hit.exptime.as_deref()?)),
            Some(meta) => {
                meta_read_through_hit(reply, AddedFlags::FETCH, &self.key, meta.base64, now)
                    .and_then(|(_, copy)| copy)
            }
        }
    }

    /// The key is not on the server asked (`NOT_FOUND`/`NOT_STORED`; meta:
    /// per command, see `meta_absent`).
    fn absent(&self, result: &CallResult) -> bool {
        match (&self.meta, result) {
            (None, _) => is_absent(result),
            (Some(meta), Ok(reply)) => meta_absent(meta.command, reply),
            (Some(_), Err(_)) => false,
        }
    }

    /// The command changed the key on the server that answered.
    fn changed(&self, result: &CallResult) -> bool {
        match (&self.meta, result) {
            (None, _) => changed(result),
            (Some(_), Ok(reply)) => reply.outcome.meta_succeeded(),
            (Some(_), Err(_)) => false,
        }
    }

    /// A delete on both owners: see [`merge_delete`]; meta answers the
    /// previous owner's success when the new owner never had the key.
    fn merge_delete(&self, new: CallResult, previous: CallResult) -> CallResult {
        match (&self.meta, &new, &previous) {
            (None, _, _) => merge_delete(new, previous),
            (Some(_), Ok(reply), Ok(before))
                if !reply.outcome.meta_succeeded() && before.outcome.meta_succeeded() =>
            {
                previous
            }
            (Some(_), _, _) => new,
        }
    }
}

/// Which meta command on a moved key [`Moved::meta`] runs.
#[derive(Debug)]
pub(crate) enum MetaMove {
    /// `mg`: the new owner, then after a miss the previous owner asked
    /// `wire` (the request with `added` flags); a hit there is answered
    /// as the client asked and copied.
    Read { wire: Outbound, added: AddedFlags },
    /// Run on the new owner; if absent there, copied and run again.
    /// `replaces`: an `ms` in replace mode or compared by cas, which looks
    /// at the new owner first (see [`Moved::start`]).
    RetryAfterCopy { replaces: bool },
    /// Copied first, then run (`ms` in add mode, `ma … N`).
    CopyFirst,
    /// `ms`: stored on the new owner, then deleted from the previous one.
    Overwrite,
    /// `ms … C`; `as_set` is the store without `C` and `q`.
    Cas { as_set: Bytes },
    /// `md`: the previous owner, then the new one.
    Delete,
}

/// The reply says the command changed the key: stored, a new number,
/// touched. Misses, `EXISTS`, errors and failures changed nothing.
fn changed(result: &CallResult) -> bool {
    match result {
        Ok(reply) => {
            let outcome = reply.outcome;
            !(outcome.not_found() || outcome.not_stored() || outcome.exists() || outcome.is_error())
        }
        Err(_) => false,
    }
}

/// `NOT_FOUND` / `NOT_STORED`: the key is not on the server asked.
fn is_absent(result: &CallResult) -> bool {
    matches!(result, Ok(r) if matches!(r.outcome, Outcome::NotFound | Outcome::NotStored))
}

/// A `delete` on both owners answers `DELETED` if either deleted; an error
/// of the new owner is passed on (the key may still be there); otherwise the
/// new owner's reply.
pub(crate) fn merge_delete(new: CallResult, previous: CallResult) -> CallResult {
    let deleted = |r: &CallResult| matches!(r, Ok(b) if b.outcome == Outcome::Deleted);
    let failed = |r: &CallResult| match r {
        Ok(b) => matches!(b.outcome, Outcome::ServerError | Outcome::Error),
        Err(_) => true,
    };
    if deleted(&new) || failed(&new) || !deleted(&previous) {
        new
    } else {
        previous
    }
}

/// memcached's refusal of `incr`, `decr` or `ma` on a value that is not a
/// number (both dialects say it alike).
pub(crate) fn not_a_number(result: &CallResult) -> bool {
    matches!(result, Ok(reply) if reply.outcome == Outcome::NotANumber)
}

/// An `add` or `ms … ME` that did not store: the key is there (a lease is,
/// to memcached).
fn not_stored(result: &CallResult) -> bool {
    matches!(result, Ok(reply) if reply.outcome.not_stored())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BackendError;
    use crate::protocol::{parse_request, Limits};

    fn moved(line: &'static [u8]) -> Moved {
        moved_with(line, Copies::ThroughLease)
    }

    fn moved_with(line: &'static [u8], copies: Copies) -> Moved {
        let bytes = Bytes::from_static(line);
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        Moved::new(&request, &bytes, copies).unwrap()
    }

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(crate::protocol::outcome::Reply::from_static(reply))
    }

    fn sent(step: &Step) -> (Owner, Vec<u8>) {
        match step {
            Step::Send { to, lines, .. } => (*to, lines.concat()),
            Step::Answer(r) => panic!("answered {r:?}"),
        }
    }

    /// The copy's lease sent as `step`, its landing (cas 30), the `check`
    /// that deletes the fetched item from the previous owner, answered `HD`,
    /// and the `fill` that replaces the lease: the command's step on the new
    /// owner comes back.
    fn copied_and_checked(m: &mut Moved, step: Step, fill: &[u8], check: &[u8]) -> Step {
        let (to, lease) = sent(&step);
        assert_eq!(to, Owner::New);
        assert!(
            lease.ends_with(b" ME c\r\n\0memring hand-off lease\0\r\n"),
            "{}",
            String::from_utf8_lossy(&lease)
        );
        let step = m.on_reply(ok(b"HD c30\r\n"), NOW);
        assert_eq!(sent(&step), (Owner::Previous, check.to_vec()));
        let step = m.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(sent(&step), (Owner::New, fill.to_vec()));
        let step = m.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(m.take_tally().copy, Some(CopyOutcome::Made));
        step
    }

    fn answer(step: Step) -> CallResult {
        match step {
            Step::Answer(r) => r,
            other => panic!("still sending {other:?}"),
        }
    }

    const NOW: u64 = 1_800_000_000;

    /// The step that deletes the previous owner's copy, answered `reply`.
    fn forgets(step: Step, m: &mut Moved, expected: &[u8]) {
        assert_eq!(sent(&step), (Owner::Previous, b"delete k\r\n".to_vec()));
        // Whatever the previous owner says, the new owner's reply answers.
        assert_eq!(
            answer(m.on_reply(ok(b"NOT_FOUND\r\n"), NOW)).unwrap(),
            expected
        );
    }

    #[test]
    fn every_command_but_reads_needs_a_hand_off() {
        assert!(kind_of(Command::Set).is_some());
        assert!(kind_of(Command::Get).is_none());
        assert!(kind_of(Command::Incr).is_some());
    }

    #[test]
    fn set_stores_on_the_new_owner_then_deletes_the_previous_owners_copy() {
        let mut m = moved(b"set k 0 0 1\r\nx\r\n");
        assert_eq!(
            sent(&m.start()),
            (Owner::New, b"set k 0 0 1\r\nx\r\n".to_vec())
        );
        let step = m.on_reply(ok(b"STORED\r\n"), NOW);
        forgets(step, &mut m, b"STORED\r\n");
        // A set that did not store leaves the previous owner alone.
        let mut failed = moved(b"set k 0 0 1\r\nx\r\n");
        failed.start();
        let reply = ok(b"SERVER_ERROR out of memory\r\n");
        assert!(answer(failed.on_reply(reply, NOW)).is_ok());
    }

    #[test]
    fn delete_removes_from_both_and_reports_either() {
        let mut m = moved(b"delete k\r\n");
        assert_eq!(sent(&m.start()).0, Owner::Previous);
        let look = m.on_reply(ok(b"DELETED\r\n"), NOW);
        assert_eq!(sent(&look), (Owner::New, b"mg k c f s u\r\n".to_vec()));
        assert_eq!(sent(&m.on_reply(ok(b"EN\r\n"), NOW)).0, Owner::New);
        assert_eq!(
            answer(m.on_reply(ok(b"NOT_FOUND\r\n"), NOW)).unwrap(),
            &b"DELETED\r\n"[..]
        );
    }

    /// A delete that finds another sidecar's lease on the new owner removes
    /// it, and answers as the previous owner did: the lease was no value.
    #[test]
    fn a_delete_that_removes_a_lease_answers_as_the_previous_owner() {
        let lease = format!("HD c9 f{} s24\r\n", crate::protocol::lease::LEASE_FLAGS);
        for (command, absent) in [
            (&b"delete k\r\n"[..], &b"NOT_FOUND\r\n"[..]),
            (b"md k\r\n", b"NF\r\n"),
        ] {
            let mut m = match command[0] {
                b'm' => meta_moved(MetaMove::Delete, MetaCommand::Delete, command),
                _ => moved(command),
            };
            m.start();
            m.on_reply(Ok(Reply::from_static(absent)), NOW);
            let delete = m.on_reply(Ok(Reply::made(Bytes::from(lease.clone()))), NOW);
            assert_eq!(sent(&delete), (Owner::New, command.to_vec()));
            let success = if command[0] == b'm' {
                "HD\r\n"
            } else {
                "DELETED\r\n"
            };
            let answered = answer(m.on_reply(Ok(Reply::made(Bytes::from(success))), NOW));
            assert_eq!(answered.unwrap(), absent);
        }
    }

    /// With a change undone, a delete reaches the previous owner again
    /// after the new one, and answers as before.
    #[test]
    fn a_delete_that_may_meet_a_copy_back_reaches_the_previous_owner_last_too() {
        let mut m = moved(b"delete k\r\n");
        m.delete_previous_last_too();
        assert_eq!(
            sent(&m.start()),
            (Owner::Previous, b"delete k\r\n".to_vec())
        );
        let look = m.on_reply(ok(b"DELETED\r\n"), NOW);
        assert_eq!(sent(&look), (Owner::New, b"mg k c f s u\r\n".to_vec()));
        let step = m.on_reply(ok(b"EN\r\n"), NOW);
        assert_eq!(sent(&step), (Owner::New, b"delete k\r\n".to_vec()));
        let again = m.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        assert_eq!(sent(&again), (Owner::Previous, b"delete k\r\n".to_vec()));
        assert_eq!(
            answer(m.on_reply(ok(b"NOT_FOUND\r\n"), NOW)).unwrap(),
            &b"DELETED\r\n"[..]
        );
        // Other commands take their usual steps.
        let mut set = moved(b"set k 0 0 1\r\nx\r\n");
        set.delete_previous_last_too();
        assert_eq!(sent(&set.start()).0, Owner::New);
    }

    #[test]
    fn delete_failing_on_the_new_owner_is_an_error() {
        let failed: CallResult = Err(BackendError {
            server: "new".into(),
            kind: crate::error::BackendErrorKind::Timeout,
        });
        assert!(merge_delete(failed, ok(b"DELETED\r\n")).is_err());
        let not_found = merge_delete(ok(b"NOT_FOUND\r\n"), ok(b"NOT_FOUND\r\n"));
        assert_eq!(not_found.unwrap(), &b"NOT_FOUND\r\n"[..]);
    }

    #[test]
    fn incr_copies_from_the_previous_owner_with_its_ttl_then_runs_again() {
        let mut m = moved(b"incr k 1\r\n");
        assert_eq!(sent(&m.start()), (Owner::New, b"incr k 1\r\n".to_vec()));
        let fetch = sent(&m.on_reply(ok(b"NOT_FOUND\r\n"), NOW));
        assert_eq!(fetch, (Owner::Previous, b"mg k c v f t\r\n".to_vec()));
        let step = m.on_reply(ok(b"VA 2 c9 f3 t4\r\n41\r\n"), NOW);
        let copy = b"ms k 2 F3 T4 C30\r\n41\r\n";
        let again = copied_and_checked(&mut m, step, copy, b"md k C9\r\n");
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));
        // The check deleted the previous owner's copy: answered at once.
        assert_eq!(
            answer(m.on_reply(ok(b"42\r\n"), NOW)).unwrap(),
            &b"42\r\n"[..]
        );
    }

    /// A delete of the key (through another connection) reached the new
    /// owner before the copy and the previous owner after the fetch: the
    /// check finds the fetched item gone, the copy is taken back, and the
    /// command runs on what the delete left.
    #[test]
    fn a_copy_whose_source_went_meanwhile_is_taken_back_before_the_command() {
        let mut m = moved(b"incr k 1\r\n");
        m.start();
        m.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        m.on_reply(ok(b"VA 2 c9 f3 t4\r\n41\r\n"), NOW);
        m.on_reply(ok(b"HD c12\r\n"), NOW);
        let undo = m.on_reply(ok(b"NF\r\n"), NOW);
        assert_eq!(sent(&undo), (Owner::New, b"md k C12\r\n".to_vec()));
        let again = m.on_reply(ok(b"HD\r\n"), NOW);
        assert!(m.take_tally().taken_back);
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));
        assert_eq!(
            answer(m.on_reply(ok(b"NOT_FOUND\r\n"), NOW)).unwrap(),
            &b"NOT_FOUND\r\n"[..]
        );

        // A newer value replaced the lease: it stays, and the command runs
        // on it, then forgets the previous owner.
        let mut newer = moved(b"incr k 1\r\n");
        newer.start();
        newer.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        newer.on_reply(ok(b"VA 2 c9 f3 t4\r\n41\r\n"), NOW);
        newer.on_reply(ok(b"HD c12\r\n"), NOW);
        let undo = newer.on_reply(ok(b"EX\r\n"), NOW);
        assert_eq!(sent(&undo), (Owner::New, b"md k C12\r\n".to_vec()));
        let again = newer.on_reply(ok(b"EX\r\n"), NOW);
        assert!(!newer.take_tally().taken_back);
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));
        let step = newer.on_reply(ok(b"71\r\n"), NOW);
        forgets(step, &mut newer, b"71\r\n");

        // The previous owner still had it, but a write reached the lease
        // before the copy: the copy fails and the command runs on the write.
        let mut overtaken = moved(b"incr k 1\r\n");
        overtaken.start();
        overtaken.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        overtaken.on_reply(ok(b"VA 2 c9 f3 t4\r\n41\r\n"), NOW);
        overtaken.on_reply(ok(b"HD c12\r\n"), NOW);
        let fill = overtaken.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(sent(&fill).0, Owner::New);
        let again = overtaken.on_reply(ok(b"EX\r\n"), NOW);
        assert_eq!(overtaken.take_tally().copy, Some(CopyOutcome::Skipped));
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));
        // The check deleted the previous owner's item already.
        assert_eq!(
            answer(overtaken.on_reply(ok(b"81\r\n"), NOW)).unwrap(),
            &b"81\r\n"[..]
        );

        // The new owner had the key already: it is probed for another
        // copy's lease; a value there gets no copy, and the command runs.
        let mut beaten = moved(b"incr k 1\r\n");
        beaten.start();
        beaten.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        beaten.on_reply(ok(b"VA 2 c9 f3 t4\r\n41\r\n"), NOW);
        let probe = beaten.on_reply(ok(b"NS c0\r\n"), NOW);
        assert_eq!(sent(&probe), (Owner::New, b"mg k c f s u\r\n".to_vec()));
        let again = beaten.on_reply(ok(b"HD c5 f0 s2\r\n"), NOW);
        assert_eq!(beaten.take_tally().copy, Some(CopyOutcome::Skipped));
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));

        // Another copy's lease there: taken over, the value copied over it
        // by its cas.
        let mut leased = moved(b"incr k 1\r\n");
        leased.start();
        leased.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        leased.on_reply(ok(b"VA 2 c9 f3 t4\r\n41\r\n"), NOW);
        leased.on_reply(ok(b"NS c0\r\n"), NOW);
        let fetch = leased.on_reply(ok(b"HD c77 f1835821873 s24\r\n"), NOW);
        assert_eq!(
            sent(&fetch),
            (Owner::Previous, b"mg k c v f t\r\n".to_vec())
        );
    }

    /// Another copy's lease on the new owner: `incr` finds it not a number,
    /// takes it over with the previous owner's value and continues the
    /// count; a real non-number stays refused; with nothing to copy, the
    /// lease goes and the command answers as for an absent key.
    #[test]
    fn incr_meeting_another_copys_lease_makes_the_copy_itself() {
        let refused = &b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"[..];
        let lease = &b"HD c77 f1835821873 s24\r\n"[..];

        let mut m = moved(b"incr k 1\r\n");
        m.start();
        let probe = m.on_reply(ok(refused), NOW);
        assert_eq!(sent(&probe), (Owner::New, b"mg k c f s u\r\n".to_vec()));
        let fetch = m.on_reply(ok(lease), NOW);
        assert_eq!(
            sent(&fetch),
            (Owner::Previous, b"mg k c v f t\r\n".to_vec())
        );
        let check = m.on_reply(ok(b"VA 2 c9 f0 t-1\r\n41\r\n"), NOW);
        assert_eq!(sent(&check), (Owner::Previous, b"md k C9\r\n".to_vec()));
        let fill = m.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(
            sent(&fill),
            (Owner::New, b"ms k 2 F0 C77\r\n41\r\n".to_vec())
        );
        let again = m.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));
        assert_eq!(
            answer(m.on_reply(ok(b"42\r\n"), NOW)).unwrap(),
            &b"42\r\n"[..]
        );

        let mut text = moved(b"incr k 1\r\n");
        text.start();
        text.on_reply(ok(refused), NOW);
        let kept = text.on_reply(ok(b"HD c5 f0 s3\r\n"), NOW);
        assert_eq!(answer(kept).unwrap(), refused);
        assert_eq!(
            probed_lease(&Reply::from_static(b"HD c5 f1835821873 s3\r\n")),
            None
        );
        assert_eq!(
            probed_lease(&Reply::from_static(b"HD c5 f1835821873 s40\r\n")),
            Some(5)
        );
        assert_eq!(probed_lease(&Reply::from_static(b"EN\r\n")), None);

        let mut nowhere = moved(b"incr k 1\r\n");
        nowhere.start();
        nowhere.on_reply(ok(refused), NOW);
        nowhere.on_reply(ok(lease), NOW);
        let undo = nowhere.on_reply(ok(b"EN\r\n"), NOW);
        assert_eq!(sent(&undo), (Owner::New, b"md k C77\r\n".to_vec()));
        let again = nowhere.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(sent(&again), (Owner::New, b"incr k 1\r\n".to_vec()));
        assert!(nowhere.take_tally().taken_back, "the lease went");
        // A refusal after that is answered: the new owner is probed once.
        assert_eq!(answer(nowhere.on_reply(ok(refused), NOW)).unwrap(), refused);
    }

    #[test]
    fn a_copy_keeps_no_expiry_and_one_about_to_expire_is_not_made() {
        let mut m = moved(b"append k 0 0 1\r\nx\r\n");
        m.start();
        m.on_reply(ok(b"NOT_STORED\r\n"), NOW);
        let step = m.on_reply(ok(b"VA 1 c5 f0 t-1\r\ny\r\n"), NOW);
        let step = copied_and_checked(&mut m, step, b"ms k 1 F0 C30\r\ny\r\n", b"md k C5\r\n");
        assert_eq!(sent(&step).0, Owner::New);
        let mut expiring = moved(b"append k 0 0 1\r\nx\r\n");
        expiring.start();
        expiring.on_reply(ok(b"NOT_STORED\r\n"), NOW);
        assert_eq!(
            answer(expiring.on_reply(ok(b"VA 1 c5 f0 t0\r\ny\r\n"), NOW)).unwrap(),
            &b"NOT_STORED\r\n"[..]
        );
    }

    #[test]
    fn incr_on_a_key_nowhere_answers_the_new_owners_not_found() {
        let mut m = moved(b"incr k 1\r\n");
        m.start();
        m.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        assert_eq!(
            answer(m.on_reply(ok(b"EN\r\n"), NOW)).unwrap(),
            &b"NOT_FOUND\r\n"[..]
        );
    }

    #[test]
    fn add_checks_the_previous_owner_first() {
        let mut m = moved(b"add k 0 0 1\r\nx\r\n");
        assert_eq!(sent(&m.start()).0, Owner::Previous);
        let step = m.on_reply(ok(b"VA 1 c5 f0 t-1\r\ny\r\n"), NOW);
        let copy = b"ms k 1 F0 C30\r\ny\r\n";
        let add = copied_and_checked(&mut m, step, copy, b"md k C5\r\n");
        assert_eq!(sent(&add), (Owner::New, b"add k 0 0 1\r\nx\r\n".to_vec()));
        let refused = ok(b"NOT_STORED\r\n");
        assert_eq!(
            answer(m.on_reply(refused, NOW)).unwrap(),
            &b"NOT_STORED\r\n"[..]
        );
        let mut fresh = moved(b"add k 0 0 1\r\nx\r\n");
        fresh.start();
        let step = fresh.on_reply(ok(b"EN\r\n"), NOW);
        assert_eq!(sent(&step), (Owner::New, b"add k 0 0 1\r\nx\r\n".to_vec()));
    }

    #[test]
    fn cas_with_a_previous_owners_unique_is_taken_over_then_forgets_the_previous_owner() {
        // The new owner holds a copy of the previous owner's value: the cas
        // stores there, and the copy replaces exactly that item.
        let mut m = moved(b"cas k 0 0 1 7\r\nz\r\n");
        assert_eq!(sent(&m.start()).0, Owner::New);
        let read = m.on_reply(ok(b"EXISTS\r\n"), NOW);
        assert_eq!(sent(&read), (Owner::New, b"mg k c v f t\r\n".to_vec()));
        let read = m.on_reply(ok(b"VA 1 c40 f0 t-1\r\nx\r\n"), NOW);
        assert_eq!(sent(&read).0, Owner::Previous);
        let cas = m.on_reply(ok(b"VA 1 f0 t-1\r\nx\r\n"), NOW);
        assert_eq!(sent(&cas).0, Owner::Previous);
        let (to, lines) = sent(&m.on_reply(ok(b"STORED\r\n"), NOW));
        assert_eq!(
            (to, lines),
            (Owner::New, b"cas k 0 0 1 40\r\nz\r\n".to_vec())
        );
        let step = m.on_reply(ok(b"STORED\r\n"), NOW);
        forgets(step, &mut m, b"STORED\r\n");
        // Another value on the new owner: a newer write, the refusal stands.
        let mut newer = moved(b"cas k 0 0 1 7\r\nz\r\n");
        newer.start();
        newer.on_reply(ok(b"EXISTS\r\n"), NOW);
        newer.on_reply(ok(b"VA 1 c40 f0 t-1\r\nw\r\n"), NOW);
        assert_eq!(
            answer(newer.on_reply(ok(b"VA 1 f0 t-1\r\nx\r\n"), NOW)).unwrap(),
            &b"EXISTS\r\n"[..]
        );
        // Nothing on the new owner, another unique on the previous one: the
        // key is there (a read would find it there), so `EXISTS`.
        let mut other = moved(b"cas k 0 0 1 7\r\nz\r\n");
        other.start();
        other.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        assert_eq!(
            answer(other.on_reply(ok(b"EXISTS\r\n"), NOW)).unwrap(),
            &b"EXISTS\r\n"[..]
        );
    }

    fn meta_moved(what: MetaMove, command: MetaCommand, line: &'static [u8]) -> Moved {
        let expect = Expect::meta(command, false);
        let wire: Outbound = smallvec::smallvec![Bytes::from_static(line)];
        Moved::meta(
            what,
            Copies::ThroughLease,
            command,
            (Bytes::from_static(b"k"), false),
            wire,
            expect,
        )
    }

    /// The meta dialect runs the same steps as classic: the same owners in
    /// the same order, with meta's replies and meta's own requests.
    #[test]
    fn meta_commands_on_moved_keys_take_the_classic_steps_in_meta_words() {
        // md: the previous owner first, then the new one; the previous
        // owner's HD answers when the new owner never had the key.
        let mut delete = meta_moved(MetaMove::Delete, MetaCommand::Delete, b"md k\r\n");
        assert_eq!(
            sent(&delete.start()),
            (Owner::Previous, b"md k\r\n".to_vec())
        );
        let look = delete.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(sent(&look), (Owner::New, b"mg k c f s u\r\n".to_vec()));
        assert_eq!(sent(&delete.on_reply(ok(b"EN\r\n"), NOW)).0, Owner::New);
        assert_eq!(
            answer(delete.on_reply(ok(b"NF\r\n"), NOW)).unwrap(),
            &b"HD\r\n"[..]
        );

        // ms: stored on the new owner, then `md` on the previous one.
        let mut set = meta_moved(MetaMove::Overwrite, MetaCommand::Set, b"ms k 1\r\nx\r\n");
        assert_eq!(sent(&set.start()).0, Owner::New);
        let forget = set.on_reply(ok(b"HD\r\n"), NOW);
        assert_eq!(sent(&forget), (Owner::Previous, b"md k\r\n".to_vec()));
        assert_eq!(
            answer(set.on_reply(ok(b"NF\r\n"), NOW)).unwrap(),
            &b"HD\r\n"[..]
        );

        // ma: NF on the new owner fetches, copies with `ms … ME`, runs again,
        // then forgets the previous owner's older count.
        let mut incr = meta_moved(
            MetaMove::RetryAfterCopy { replaces: false },
            MetaCommand::Arithmetic,
            b"ma k v\r\n",
        );
        incr.start();
        let fetch = incr.on_reply(ok(b"NF\r\n"), NOW);
        assert_eq!(
            sent(&fetch),
            (Owner::Previous, b"mg k c v f t\r\n".to_vec())
        );
        let step = incr.on_reply(ok(b"VA 2 c4 f0 t-1\r\n10\r\n"), NOW);
        let copy = b"ms k 2 F0 C30\r\n10\r\n";
        let again = copied_and_checked(&mut incr, step, copy, b"md k C4\r\n");
        assert_eq!(sent(&again), (Owner::New, b"ma k v\r\n".to_vec()));
        assert_eq!(
            answer(incr.on_reply(ok(b"VA 2\r\n11\r\n"), NOW)).unwrap(),
            &b"VA 2\r\n11\r\n"[..]
        );

        // ms … C: NF on the new owner tries the previous one; stored there,
        // the store goes to the new owner as an add, the previous owner's
        // copy goes, and the previous owner's reply answers.
        let as_set = Bytes::from_static(b"ms k 1 c\r\ny\r\n");
        let mut cas = meta_moved(
            MetaMove::Cas { as_set },
            MetaCommand::Set,
            b"ms k 1 C7 c\r\ny\r\n",
        );
        cas.start();
        assert_eq!(sent(&cas.on_reply(ok(b"NF\r\n"), NOW)).0, Owner::Previous);
        let copied = cas.on_reply(ok(b"HD c8\r\n"), NOW);
        assert_eq!(
            sent(&copied),
            (Owner::New, b"ms k 1 c ME\r\ny\r\n".to_vec())
        );
        assert_eq!(
            sent(&cas.on_reply(ok(b"HD c3\r\n"), NOW)).0,
            Owner::Previous
        );
        assert_eq!(
            answer(cas.on_reply(ok(b"HD\r\n"), NOW)).unwrap(),
            &b"HD c8\r\n"[..]
        );
    }

    #[test]
    fn a_meta_read_of_a_moved_key_answers_the_previous_owners_hit_and_copies_it() {
        let read_wire: Outbound = smallvec::smallvec![Bytes::from_static(b"mg k v f t\r\n")];
        let added = AddedFlags {
            value: false,
            flags: true,
            ttl: true,
        };
        let what = MetaMove::Read {
            wire: read_wire,
            added,
        };
        let mut read = meta_moved(what, MetaCommand::Get, b"mg k v\r\n");
        assert_eq!(sent(&read.start()), (Owner::New, b"mg k v\r\n".to_vec()));
        let through = read.on_reply(ok(b"EN\r\n"), NOW);
        assert_eq!(
            sent(&through),
            (Owner::Previous, b"mg k v f t\r\n".to_vec())
        );
        let hit = read.on_reply(ok(b"VA 2 f0 t100\r\nv1\r\n"), NOW);
        assert_eq!(answer(hit).unwrap(), &b"VA 2\r\nv1\r\n"[..]);
        let copy = read.take_read_copy().unwrap();
        assert_eq!(copy.concat(), b"ms k 2 F0 ME T100 c\r\nv1\r\n");

        // A hit on the new owner answers at once; a miss on both is the
        // new owner's miss.
        let mut there = meta_moved(
            MetaMove::Read {
                wire: smallvec::smallvec![],
                added,
            },
            MetaCommand::Get,
            b"mg k v\r\n",
        );
        there.start();
        assert_eq!(
            answer(there.on_reply(ok(b"VA 1\r\nx\r\n"), NOW)).unwrap(),
            &b"VA 1\r\nx\r\n"[..]
        );
        let mut nowhere = meta_moved(
            MetaMove::Read {
                wire: smallvec::smallvec![],
                added,
            },
            MetaCommand::Get,
            b"mg k v\r\n",
        );
        nowhere.start();
        nowhere.on_reply(ok(b"EN\r\n"), NOW);
        assert_eq!(
            answer(nowhere.on_reply(ok(b"EN\r\n"), NOW)).unwrap(),
            &b"EN\r\n"[..]
        );
        assert!(nowhere.take_read_copy().is_none());
    }

    /// `shared_with` other than memring: nothing is copied. Each command
    /// that would have copied the key first runs on the new owner as on an
    /// absent key, and the previous owner loses its copy before the answer,
    /// whatever the new owner said.
    #[test]
    fn without_copies_a_moved_key_is_absent_to_a_command_and_deleted_from_its_previous_owner() {
        for (line, reply) in [
            (&b"incr k 1\r\n"[..], &b"NOT_FOUND\r\n"[..]),
            (b"decr k 1\r\n", b"NOT_FOUND\r\n"),
            (b"touch k 10\r\n", b"NOT_FOUND\r\n"),
            (b"append k 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
            (b"prepend k 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
            (b"replace k 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
            // `add` is not preceded by a fetch: it stores.
            (b"add k 0 0 1\r\nx\r\n", b"STORED\r\n"),
            (b"cas k 0 0 1 5\r\nx\r\n", b"NOT_FOUND\r\n"),
            (b"cas k 0 0 1 5\r\nx\r\n", b"EXISTS\r\n"),
            (b"set k 0 0 1\r\nx\r\n", b"SERVER_ERROR out of memory\r\n"),
        ] {
            let line: &'static [u8] = Box::leak(line.to_vec().into_boxed_slice());
            let mut m = moved_with(line, Copies::Never);
            assert_eq!(sent(&m.start()), (Owner::New, line.to_vec()), "{line:?}");
            let step = m.on_reply(Ok(Reply::made(Bytes::copy_from_slice(reply))), NOW);
            assert_eq!(sent(&step), (Owner::Previous, b"delete k\r\n".to_vec()));
            let answered = answer(m.on_reply(ok(b"DELETED\r\n"), NOW)).unwrap();
            assert_eq!(&answered[..], reply, "{line:?}");
            assert_eq!(
                m.take_tally(),
                Tally::default(),
                "{line:?}: nothing read or copied"
            );
        }
        // A delete is the same with or without copies.
        let mut delete = moved_with(b"delete k\r\n", Copies::Never);
        assert_eq!(sent(&delete.start()).0, Owner::Previous);
    }

    #[test]
    fn without_copies_a_meta_read_through_answers_and_copies_nothing() {
        let added = AddedFlags {
            value: false,
            flags: true,
            ttl: true,
        };
        let what = MetaMove::Read {
            wire: smallvec::smallvec![Bytes::from_static(b"mg k v f t\r\n")],
            added,
        };
        let expect = meta_expect(MetaCommand::Get);
        let wire: Outbound = smallvec::smallvec![Bytes::from_static(b"mg k v\r\n")];
        let mut read = Moved::meta(
            what,
            Copies::Never,
            MetaCommand::Get,
            (Bytes::from_static(b"k"), false),
            wire,
            expect,
        );
        read.start();
        read.on_reply(ok(b"EN\r\n"), NOW);
        let hit = read.on_reply(ok(b"VA 2 f0 t100\r\nv1\r\n"), NOW);
        assert_eq!(answer(hit).unwrap(), &b"VA 2\r\nv1\r\n"[..]);
        assert!(read.take_read_copy().is_none());
        // `ma` without copies: the new owner's NF, after the previous
        // owner's `md`.
        let wire: Outbound = smallvec::smallvec![Bytes::from_static(b"ma k\r\n")];
        let mut ma = Moved::meta(
            MetaMove::RetryAfterCopy { replaces: false },
            Copies::Never,
            MetaCommand::Arithmetic,
            (Bytes::from_static(b"k"), false),
            wire,
            meta_expect(MetaCommand::Arithmetic),
        );
        assert_eq!(sent(&ma.start()).0, Owner::New);
        let step = ma.on_reply(ok(b"NF\r\n"), NOW);
        assert_eq!(sent(&step), (Owner::Previous, b"md k\r\n".to_vec()));
        assert_eq!(
            answer(ma.on_reply(ok(b"HD\r\n"), NOW)).unwrap(),
            &b"NF\r\n"[..]
        );
    }
}
