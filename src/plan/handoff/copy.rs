//! A copy of a moved key made through a lease, so it never brings back a
//! value older than a write: the lease, the check where it was read, then
//! the fill that replaces the lease or the take-back that removes it (or,
//! for a `gat` whose key the new owner held already, the touch of what is
//! there); and how the new owner's replies to those count.

use bytes::{BufMut, Bytes, BytesMut};

use super::lines::{delete_line, hd_number, probed_lease};
use super::read_through::ValueReply;
use super::{meta_expect, CallResult, Owner};
use crate::protocol::encode::Outbound;
use crate::protocol::lease;
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::Expect;

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n` as the copy its
/// new owner is sent: `ms <key> <bytes> F<flags> ME [T<exptime>] c`, stored
/// only where the key is absent (a newer value written there meanwhile is
/// never overwritten), answering the copy's cas, by which it can be taken
/// back exactly. The data block is shared with the value (no copy). `None`
/// for anything that is not one well-formed value block (a miss).
pub(crate) fn copy_block(block: &Bytes, exptime: &[u8]) -> Option<Outbound> {
    let header_end = memchr::memmem::find(block, b"\r\n")?;
    let header = &block[..header_end];
    let mut fields = header.split(|&b| b == b' ').filter(|f| !f.is_empty());
    if fields.next()? != b"VALUE" {
        return None;
    }
    let (key, flags, length) = (fields.next()?, fields.next()?, fields.next()?);
    let data_len: usize = std::str::from_utf8(length).ok()?.parse().ok()?;
    if block.len() != header_end + 2 + data_len + 2 {
        return None;
    }
    let mut line = BytesMut::with_capacity(header.len() + exptime.len() + 12);
    line.put_slice(b"ms ");
    line.put_slice(key);
    line.put_u8(b' ');
    line.put_slice(length);
    line.put_slice(b" F");
    line.put_slice(flags);
    line.put_slice(b" ME");
    if exptime != b"0" {
        line.put_slice(b" T");
        line.put_slice(exptime);
    }
    line.put_slice(b" c\r\n");
    Some(smallvec::smallvec![
        line.freeze(),
        block.slice(header_end + 2..)
    ])
}

/// A read-through copy of a moved key, made through a lease: a write of the
/// key (through another worker or sidecar) may reach the new owner before
/// the copy does, and the copy would then bring back a value older than
/// that write. So the new owner first gets a lease (a placeholder every
/// reader takes for a miss, stored only where the key is absent), the key
/// is read again where it was copied from, and only if it still holds the
/// value does the copy replace the lease, by the lease's cas: a write or
/// delete that reached the new owner after the lease makes the copy fail.
/// If the source changed, the lease is taken back (by its cas).
#[derive(Debug, Clone)]
pub(crate) struct ReadCopy {
    /// The new owner, and what it is sent (the last part is the value's data
    /// with its `\r\n`).
    pub owner: usize,
    pub wire: Outbound,
    /// The server the value was read from.
    pub source: usize,
    /// The key as a meta token, and whether that token is base64.
    pub key: Bytes,
    pub base64: bool,
    /// A `gat`'s or `gats`'s exptime: the read changed the key's TTL, which
    /// another sidecar's lease on the new owner must not keep from it (see
    /// [`LeaseCopy`]'s touch).
    pub touch: Option<Bytes>,
}

impl ReadCopy {
    /// The lease → check → fill or take-back of this copy, the source
    /// read again (it keeps the value); a `gat`'s touches what the new
    /// owner held already.
    pub(crate) fn lease_copy(&self) -> LeaseCopy {
        let mut machine = LeaseCopy::new(
            self.key.clone(),
            self.base64,
            self.wire.clone(),
            CopyCheck::Reread,
        );
        machine.touch = self.touch.clone();
        machine
    }
}

/// How a [`LeaseCopy`]'s check finds out, with the lease in place, whether
/// the source still holds what was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyCheck {
    /// Read it again (`mg … v u`) and compare the data: the source keeps
    /// the value (a read-through's copy; readers of the old ring still
    /// find it there).
    Reread,
    /// Delete it by the cas it was fetched with (`md … C<cas>`): the copy
    /// is made only if that delete succeeds, so the source no longer has
    /// it (a moved key's command, which then runs on the new owner alone).
    Forget(u64),
}

/// What a [`LeaseCopy`] sends next, or how it ended.
#[derive(Debug)]
pub(crate) enum CopyStep {
    /// Send `wire` to `to` (the new owner, or the source as the previous
    /// one); feed its reply to [`LeaseCopy::on_reply`].
    Send {
        to: Owner,
        wire: Outbound,
        expect: Expect,
    },
    /// Nothing more to send.
    Done(CopyEnd),
}

/// How a [`LeaseCopy`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyEnd {
    /// No lease to fill: `Skipped` when the new owner held the key already
    /// (a write, or another copy's lease; a `gat`'s copy has touched it
    /// then), `Failed` on an error or when the lease's cas did not come
    /// back (it can be neither filled nor taken back safely, so it is left
    /// to expire: a miss meanwhile).
    NotLeased(CopyOutcome),
    /// The source still held the value: how the fill counts.
    Filled(CopyOutcome),
    /// The source changed, lost it or failed (when in doubt, no copy):
    /// whether the take-back removed the lease.
    TakenBack(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyStage {
    Lease,
    Check,
    Fill,
    TakeBack,
    /// A `gat`'s lease found the key held: what is there is touched.
    Touch,
    /// The touch showed another copy's lease: this copy replaces it.
    TouchFill,
    /// That fill failed: what replaced the lease is touched once more.
    TouchAgain,
    Done,
}

/// A copy of a key to its new owner, made through a lease so it never
/// brings back a value older than a write (see [`ReadCopy`]): the lease
/// (`ms … ME c`, only where the key is absent), the check at the source
/// (see [`CopyCheck`]), then the copy replacing the lease by its cas, or
/// the lease taken back by its cas. Written once, driven by a read-through's
/// task (`session::copy_check`) and by [`super::Moved`]'s copy stage, which
/// also takes back through it a lease it took over and found nothing to
/// copy for ([`LeaseCopy::taking_back`]).
///
/// A `gat` read through changed the key's TTL. If its lease finds the key
/// held on the new owner, that may be another sidecar's lease, an item to
/// memcached whose copy (filled by the lease's cas, which a touch keeps)
/// would put back the TTL the previous owner had before this `gat`. So
/// what is held is touched with the `gat`'s exptime in a way that shows a
/// lease (`mg <key> T<exptime> c f s`); a lease is replaced by this copy
/// (which carries that TTL), by its cas, so the other copy fails; a value
/// is touched. If another copy's fill got in between (this fill then
/// fails), the value it left is touched once more.
///
/// Pure: replies in, messages out.
#[derive(Debug)]
pub(crate) struct LeaseCopy {
    key: Bytes,
    base64: bool,
    /// The copy as an add (`ms … ME … c`, then its data).
    wire: Outbound,
    check: CopyCheck,
    /// A `gat`'s exptime, which what the new owner held is touched with.
    touch: Option<Bytes>,
    stage: CopyStage,
    /// The cas the lease landed with.
    lease: Option<u64>,
}

impl LeaseCopy {
    /// `key` as a meta token (base64 or not) and `wire` the copy as an add
    /// (see [`copy_block`]).
    pub(crate) fn new(key: Bytes, base64: bool, wire: Outbound, check: CopyCheck) -> LeaseCopy {
        LeaseCopy {
            key,
            base64,
            wire,
            check,
            touch: None,
            stage: CopyStage::Lease,
            lease: None,
        }
    }

    /// The lease, to the new owner.
    pub(crate) fn start(&mut self) -> CopyStep {
        self.stage = CopyStage::Lease;
        CopyStep::Send {
            to: Owner::New,
            wire: smallvec::smallvec![lease::lease_request(&self.key, self.base64)],
            expect: meta_expect(MetaCommand::Set),
        }
    }

    /// Over a lease already on the new owner (cas `lease`, another copy's,
    /// taken over): straight to the check.
    pub(crate) fn start_over(&mut self, lease: u64) -> CopyStep {
        self.lease = Some(lease);
        self.check()
    }

    /// A machine that only takes back a lease already on the new owner (cas
    /// `lease`, another copy's, taken over) with nothing to copy for: no
    /// copy and no check; it ends when the delete is answered. The step is
    /// the delete to send.
    pub(crate) fn taking_back(key: Bytes, base64: bool, lease: u64) -> (LeaseCopy, CopyStep) {
        let mut machine = LeaseCopy::new(key, base64, Outbound::new(), CopyCheck::Reread);
        let step = machine.take_back(lease);
        (machine, step)
    }

    /// The lease (cas `lease`) taken back by its cas, so a write that
    /// replaced it stays.
    fn take_back(&mut self, lease: u64) -> CopyStep {
        self.stage = CopyStage::TakeBack;
        CopyStep::Send {
            to: Owner::New,
            wire: smallvec::smallvec![delete_line(&self.key, self.base64, Some(lease))],
            expect: meta_expect(MetaCommand::Delete),
        }
    }

    /// The reply to the last [`CopyStep::Send`].
    pub(crate) fn on_reply(&mut self, result: CallResult) -> CopyStep {
        let held = CopyEnd::NotLeased(CopyOutcome::Skipped);
        match self.stage {
            CopyStage::Lease => match (copy_outcome(&result), landed_cas(&result)) {
                (CopyOutcome::Made, Some(lease)) => self.start_over(lease),
                (CopyOutcome::Made, None) => self.end(CopyEnd::NotLeased(CopyOutcome::Failed)),
                (CopyOutcome::Skipped, _) if self.touch.is_some() => self.touch(CopyStage::Touch),
                (outcome, _) => self.end(CopyEnd::NotLeased(outcome)),
            },
            CopyStage::Check => match (self.lease, self.still_at_source(&result)) {
                (Some(lease), true) => self.fill(CopyStage::Fill, lease),
                (Some(lease), false) => self.take_back(lease),
                (None, _) => self.end(CopyEnd::NotLeased(CopyOutcome::Failed)),
            },
            CopyStage::Fill => self.end(CopyEnd::Filled(fill_outcome(&result))),
            CopyStage::TakeBack => {
                let removed = matches!(&result, Ok(reply) if reply.outcome == Outcome::Hd);
                self.end(CopyEnd::TakenBack(removed))
            }
            CopyStage::Touch => match result.as_ref().ok().and_then(probed_lease) {
                Some(lease) => self.fill(CopyStage::TouchFill, lease),
                None => self.end(held),
            },
            CopyStage::TouchFill => match result {
                Ok(reply) if reply.outcome == Outcome::Hd => self.end(held),
                _ => self.touch(CopyStage::TouchAgain),
            },
            CopyStage::TouchAgain => self.end(held),
            // Nothing was sent: nothing changes.
            CopyStage::Done => CopyStep::Done(CopyEnd::NotLeased(CopyOutcome::Failed)),
        }
    }

    /// The copy replacing the lease (cas `lease`) on the new owner.
    fn fill(&mut self, stage: CopyStage, lease: u64) -> CopyStep {
        self.stage = stage;
        CopyStep::Send {
            to: Owner::New,
            wire: fill_wire(&self.wire, lease),
            expect: meta_expect(MetaCommand::Set),
        }
    }

    /// What the new owner holds touched with the `gat`'s exptime, in a way
    /// that shows a lease: `mg <key> T<exptime> c f s`.
    fn touch(&mut self, stage: CopyStage) -> CopyStep {
        self.stage = stage;
        let exptime = self.touch.as_deref().unwrap_or(b"0");
        let mut line = BytesMut::with_capacity(self.key.len() + exptime.len() + 16);
        line.put_slice(b"mg ");
        line.put_slice(&self.key);
        if self.base64 {
            line.put_slice(b" b");
        }
        line.put_slice(b" T");
        line.put_slice(exptime);
        line.put_slice(b" c f s\r\n");
        CopyStep::Send {
            to: Owner::New,
            wire: smallvec::smallvec![line.freeze()],
            expect: Expect::Meta {
                command: MetaCommand::Get,
                quiet: false,
                replied: false,
                leases_shown: true,
            },
        }
    }

    /// The check, to the source.
    fn check(&mut self) -> CopyStep {
        self.stage = CopyStage::Check;
        let (wire, expect) = match self.check {
            CopyCheck::Reread => (
                check_line(&self.key, self.base64),
                meta_expect(MetaCommand::Get),
            ),
            CopyCheck::Forget(cas) => (
                delete_line(&self.key, self.base64, Some(cas)),
                meta_expect(MetaCommand::Delete),
            ),
        };
        CopyStep::Send {
            to: Owner::Previous,
            wire: smallvec::smallvec![wire],
            expect,
        }
    }

    /// Whether the check's reply says the source still held the value. A
    /// failure there counts as a change.
    fn still_at_source(&self, result: &CallResult) -> bool {
        match self.check {
            CopyCheck::Reread => matches!(result, Ok(reply) if holds(&self.wire, reply)),
            CopyCheck::Forget(_) => {
                matches!(result, Ok(reply) if reply.outcome.meta_succeeded())
            }
        }
    }

    fn end(&mut self, end: CopyEnd) -> CopyStep {
        self.stage = CopyStage::Done;
        CopyStep::Done(end)
    }
}

/// A copy (`ms … ME … c`, then its data) as the `ms` that replaces its lease
/// (cas `lease`).
pub(super) fn fill_wire(copy: &Outbound, lease: u64) -> Outbound {
    let mut wire = copy.clone();
    if let Some(line) = wire.first_mut() {
        *line = cas_instead_of_add(line, lease);
    }
    wire
}

/// A copy's `ms … ME … c` line with `ME` and `c` dropped and `C<cas>` added.
fn cas_instead_of_add(line: &[u8], cas: u64) -> Bytes {
    let line = line.strip_suffix(b"\r\n").unwrap_or(line);
    let mut out = BytesMut::with_capacity(line.len() + 24);
    for (i, token) in line.split(|&b| b == b' ').enumerate() {
        // After `ms <key> <len>`, memring's own flags.
        if i >= 3 && (token == b"ME" || token == b"c") {
            continue;
        }
        if i > 0 {
            out.put_u8(b' ');
        }
        out.put_slice(token);
    }
    out.put_slice(format!(" C{cas}\r\n").as_bytes());
    out.freeze()
}

/// The `mg` that reads a copied key again where it was copied from: its
/// value. `u` leaves the item where it is in the server's LRU: a check is
/// not a use, and an item moving between LRUs could be missed by the
/// window's closing sweep.
fn check_line(key_token: &[u8], base64: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 12);
    line.put_slice(b"mg ");
    line.put_slice(key_token);
    line.put_slice(if base64 { b" b v u\r\n" } else { b" v u\r\n" });
    line.freeze()
}

/// Whether `reply` to a [`check_line`] holds the value `copy` carried (its
/// last part is the data with its `\r\n`).
fn holds(copy: &Outbound, reply: &Reply) -> bool {
    let data = copy.last().map_or(&[][..], |d| &d[..]);
    ValueReply::parse(reply).is_some_and(|value| value.data == data)
}

/// Copies: how many a step sent, and how the new owner answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyOutcome {
    /// `HD`: the new owner now holds the value.
    Made,
    /// `NS`: the new owner already had a (newer) value; nothing lost.
    Skipped,
    /// Error or no answer.
    Failed,
}

/// How the reply to a copy (`ms … ME c`) counts.
pub(crate) fn copy_outcome(result: &CallResult) -> CopyOutcome {
    match result {
        Ok(r) if r.outcome == Outcome::Hd => CopyOutcome::Made,
        Ok(r) if r.outcome == Outcome::Ns => CopyOutcome::Skipped,
        _ => CopyOutcome::Failed,
    }
}

/// How the reply to a lease's fill (`ms … C<lease>`) counts: `EX` or `NF`
/// mean a write or delete reached the lease first, which the copy leaves as
/// it is, as an add that found the key does.
pub(crate) fn fill_outcome(result: &CallResult) -> CopyOutcome {
    match result {
        Ok(r) if matches!(r.outcome, Outcome::Ex | Outcome::Nf) => CopyOutcome::Skipped,
        _ => copy_outcome(result),
    }
}

/// The cas a copy landed with (`HD … c<cas>`).
pub(crate) fn landed_cas(result: &CallResult) -> Option<u64> {
    hd_number(result.as_ref().ok()?, b'c')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Reply::from_static(reply))
    }

    #[test]
    fn value_blocks_become_adds_that_answer_their_cas_and_misses_do_not() {
        let copy_of =
            |block: &'static [u8], exptime| copy_block(&Bytes::from_static(block), exptime);
        let copy = copy_of(b"VALUE key 5 3 99\r\nabc\r\n", b"60").unwrap();
        assert_eq!(copy.concat(), b"ms key 3 F5 ME T60 c\r\nabc\r\n");
        // No expiry: no `T` (`T0` would mean the same).
        let copy = copy_of(b"VALUE key 0 3\r\nabc\r\n", b"0").unwrap();
        assert_eq!(copy.concat(), b"ms key 3 F0 ME c\r\nabc\r\n");
        assert!(copy_of(b"", b"0").is_none());
        assert!(copy_of(b"VALUE key 5 4\r\nabc\r\n", b"0").is_none());
        assert!(copy_of(b"END\r\n", b"0").is_none());
    }

    #[test]
    fn copy_replies_are_counted_by_kind_and_give_the_copys_cas() {
        assert_eq!(copy_outcome(&ok(b"HD c41\r\n")), CopyOutcome::Made);
        assert_eq!(landed_cas(&ok(b"HD c41\r\n")), Some(41));
        assert_eq!(landed_cas(&ok(b"HD O5 c41\r\n")), Some(41));
        assert_eq!(copy_outcome(&ok(b"HD\r\n")), CopyOutcome::Made);
        assert_eq!(landed_cas(&ok(b"HD\r\n")), None);
        assert_eq!(copy_outcome(&ok(b"NS c0\r\n")), CopyOutcome::Skipped);
        assert_eq!(landed_cas(&ok(b"NS c0\r\n")), None);
        assert_eq!(
            copy_outcome(&ok(b"SERVER_ERROR x\r\n")),
            CopyOutcome::Failed
        );
        assert_eq!(copy_outcome(&ok(b"HDX\r\n")), CopyOutcome::Failed);
    }

    fn read_copy() -> ReadCopy {
        ReadCopy {
            owner: 1,
            wire: copy_block(&Bytes::from_static(b"VALUE k 3 2\r\nv1\r\n"), b"60").unwrap(),
            source: 0,
            key: Bytes::from_static(b"k"),
            base64: false,
            touch: None,
        }
    }

    /// The one message a step sends: where, its bytes, what it is.
    fn sent(step: CopyStep) -> (Owner, Vec<u8>, Expect) {
        match step {
            CopyStep::Send { to, wire, expect } => (to, wire.concat(), expect),
            CopyStep::Done(end) => panic!("ended early: {end:?}"),
        }
    }

    fn ended(step: CopyStep) -> CopyEnd {
        match step {
            CopyStep::Done(end) => end,
            CopyStep::Send { wire, .. } => panic!("still sends {:?}", wire.concat()),
        }
    }

    /// A read-through's copy past its lease (cas 41) and its check.
    fn leased_and_checked(check: &'static [u8]) -> (LeaseCopy, CopyStep) {
        let mut machine = read_copy().lease_copy();
        let (to, lease, expect) = sent(machine.start());
        assert_eq!(to, Owner::New);
        assert!(lease.starts_with(b"ms k 24 F1835821873 T5 ME c\r\n"));
        assert_eq!(expect, meta_expect(MetaCommand::Set));
        let (to, line, expect) = sent(machine.on_reply(ok(b"HD c41\r\n")));
        assert_eq!((to, &line[..]), (Owner::Previous, &b"mg k v u\r\n"[..]));
        assert_eq!(expect, meta_expect(MetaCommand::Get));
        let step = machine.on_reply(ok(check));
        (machine, step)
    }

    #[test]
    fn a_copy_still_at_its_source_replaces_its_lease_by_cas() {
        let (mut machine, step) = leased_and_checked(b"VA 2\r\nv1\r\n");
        // The value with its flags and TTL, stored only over the lease.
        let (to, fill, expect) = sent(step);
        assert_eq!(
            (to, &fill[..]),
            (Owner::New, &b"ms k 2 F3 T60 C41\r\nv1\r\n"[..])
        );
        assert_eq!(expect, meta_expect(MetaCommand::Set));
        let end = ended(machine.on_reply(ok(b"HD\r\n")));
        assert_eq!(end, CopyEnd::Filled(CopyOutcome::Made));
        // A write or delete reached the lease first: the copy leaves it.
        for reply in [&b"EX\r\n"[..], b"NF\r\n", b"NS\r\n"] {
            let (mut machine, _) = leased_and_checked(b"VA 2\r\nv1\r\n");
            let end = ended(machine.on_reply(Ok(Reply::from_static(reply))));
            assert_eq!(end, CopyEnd::Filled(CopyOutcome::Skipped));
        }
        let (mut machine, _) = leased_and_checked(b"VA 2\r\nv1\r\n");
        let end = ended(machine.on_reply(ok(b"SERVER_ERROR out of memory\r\n")));
        assert_eq!(end, CopyEnd::Filled(CopyOutcome::Failed));
    }

    #[test]
    fn a_copy_changed_gone_or_failing_at_its_source_takes_its_lease_back_by_cas() {
        for check in [
            &b"VA 2\r\nv2\r\n"[..],
            b"EN\r\n",
            b"SERVER_ERROR out of memory\r\n",
        ] {
            let mut machine = read_copy().lease_copy();
            machine.start();
            machine.on_reply(ok(b"HD c41\r\n"));
            let (to, line, expect) = sent(machine.on_reply(Ok(Reply::from_static(check))));
            assert_eq!((to, &line[..]), (Owner::New, &b"md k C41\r\n"[..]));
            assert_eq!(expect, meta_expect(MetaCommand::Delete));
            // Replaced by a write in between: it stays.
            assert_eq!(
                ended(machine.on_reply(ok(b"EX\r\n"))),
                CopyEnd::TakenBack(false)
            );
        }
        let (mut machine, step) = leased_and_checked(b"EN\r\n");
        sent(step);
        let end = ended(machine.on_reply(ok(b"HD\r\n")));
        assert_eq!(end, CopyEnd::TakenBack(true));
    }

    #[test]
    fn a_lease_not_placed_or_without_its_cas_ends_the_copy() {
        let cases: [(&'static [u8], CopyOutcome); 4] = [
            // The new owner holds the key already.
            (b"NS c0\r\n", CopyOutcome::Skipped),
            // Placed, but its cas lost: it can be neither filled nor taken
            // back safely; it expires.
            (b"HD\r\n", CopyOutcome::Failed),
            (b"SERVER_ERROR out of memory\r\n", CopyOutcome::Failed),
            (b"ERROR\r\n", CopyOutcome::Failed),
        ];
        for (reply, outcome) in cases {
            let mut machine = read_copy().lease_copy();
            machine.start();
            let end = ended(machine.on_reply(Ok(Reply::from_static(reply))));
            assert_eq!(end, CopyEnd::NotLeased(outcome), "{reply:?}");
            // Done: nothing more, whatever comes.
            let again = ended(machine.on_reply(ok(b"HD c1\r\n")));
            assert_eq!(again, CopyEnd::NotLeased(CopyOutcome::Failed));
        }
    }

    #[test]
    fn a_moved_keys_copy_is_checked_by_deleting_the_fetched_item_by_its_cas() {
        let copy = read_copy();
        let forget = || {
            LeaseCopy::new(
                copy.key.clone(),
                false,
                copy.wire.clone(),
                CopyCheck::Forget(9),
            )
        };
        let mut machine = forget();
        machine.start();
        let (to, line, expect) = sent(machine.on_reply(ok(b"HD c41\r\n")));
        assert_eq!((to, &line[..]), (Owner::Previous, &b"md k C9\r\n"[..]));
        assert_eq!(expect, meta_expect(MetaCommand::Delete));
        let (to, fill, _) = sent(machine.on_reply(ok(b"HD\r\n")));
        assert_eq!(
            (to, &fill[..]),
            (Owner::New, &b"ms k 2 F3 T60 C41\r\nv1\r\n"[..])
        );
        // Gone or changed there: the lease goes.
        for check in [&b"NF\r\n"[..], b"EX\r\n", b"SERVER_ERROR busy\r\n"] {
            let mut machine = forget();
            machine.start();
            machine.on_reply(ok(b"HD c41\r\n"));
            let (to, line, _) = sent(machine.on_reply(Ok(Reply::from_static(check))));
            assert_eq!((to, &line[..]), (Owner::New, &b"md k C41\r\n"[..]));
        }
        // Over another copy's lease taken over: straight to the check, then
        // the fill by that lease's cas.
        let mut machine = forget();
        let (to, line, _) = sent(machine.start_over(77));
        assert_eq!((to, &line[..]), (Owner::Previous, &b"md k C9\r\n"[..]));
        let (_, fill, _) = sent(machine.on_reply(ok(b"HD\r\n")));
        assert!(fill.starts_with(b"ms k 2 F3 T60 C77\r\n"));
    }

    /// A `gat`'s copy (new exptime 90) whose lease found the key held: the
    /// touch that shows what is held, and how it ends after `shown`.
    fn touching(shown: &'static [u8]) -> (LeaseCopy, CopyStep) {
        let mut machine = ReadCopy {
            touch: Some(Bytes::from_static(b"90")),
            ..read_copy()
        }
        .lease_copy();
        machine.start();
        let step = machine.on_reply(ok(b"NS c0\r\n"));
        let CopyStep::Send { to, wire, expect } = step else {
            panic!("no touch: {step:?}");
        };
        assert_eq!(
            (to, &wire.concat()[..]),
            (Owner::New, &b"mg k T90 c f s\r\n"[..])
        );
        // A lease must show as the item it is, not as a miss.
        assert_eq!(
            expect,
            Expect::Meta {
                command: MetaCommand::Get,
                quiet: false,
                replied: false,
                leases_shown: true,
            }
        );
        let step = machine.on_reply(Ok(Reply::from_static(shown)));
        (machine, step)
    }

    #[test]
    fn a_gat_copy_that_finds_a_value_held_touches_it_and_ends() {
        let held = CopyEnd::NotLeased(CopyOutcome::Skipped);
        // A value (not a lease's flags and size), a miss, or a failure.
        for shown in [&b"HD c5 f0 s2\r\n"[..], b"EN\r\n", b"SERVER_ERROR busy\r\n"] {
            let (_, step) = touching(shown);
            assert_eq!(ended(step), held, "{shown:?}");
        }
        // Without a new exptime (a `get`'s copy) nothing is touched.
        let mut machine = read_copy().lease_copy();
        machine.start();
        assert_eq!(ended(machine.on_reply(ok(b"NS c0\r\n"))), held);
    }

    #[test]
    fn a_gat_copy_that_finds_another_copys_lease_replaces_it_by_its_cas() {
        let held = CopyEnd::NotLeased(CopyOutcome::Skipped);
        let (mut machine, step) = touching(b"HD c77 f1835821873 s24\r\n");
        let (to, fill, expect) = sent(step);
        // The copy carries the `gat`'s TTL; the other copy's fill then fails.
        assert_eq!(
            (to, &fill[..]),
            (Owner::New, &b"ms k 2 F3 T60 C77\r\nv1\r\n"[..])
        );
        assert_eq!(expect, meta_expect(MetaCommand::Set));
        assert_eq!(ended(machine.on_reply(ok(b"HD\r\n"))), held);
        // The other copy's fill got in first: what it left is touched again.
        for refused in [&b"EX\r\n"[..], b"NF\r\n", b"SERVER_ERROR busy\r\n"] {
            let (mut machine, step) = touching(b"HD c77 f1835821873 s24\r\n");
            sent(step);
            let (to, again, _) = sent(machine.on_reply(Ok(Reply::from_static(refused))));
            assert_eq!((to, &again[..]), (Owner::New, &b"mg k T90 c f s\r\n"[..]));
            assert_eq!(ended(machine.on_reply(ok(b"HD c78 f3 s2\r\n"))), held);
        }
    }

    #[test]
    fn a_lease_taken_over_with_nothing_to_copy_is_taken_back_by_its_cas() {
        for (reply, removed) in [
            (&b"HD\r\n"[..], true),
            // Replaced by a write in between: it stays.
            (b"EX\r\n", false),
            (b"NF\r\n", false),
            (b"SERVER_ERROR busy\r\n", false),
        ] {
            let (mut machine, step) = LeaseCopy::taking_back(Bytes::from_static(b"aw=="), true, 77);
            let (to, line, expect) = sent(step);
            assert_eq!((to, &line[..]), (Owner::New, &b"md aw== b C77\r\n"[..]));
            assert_eq!(expect, meta_expect(MetaCommand::Delete));
            let end = ended(machine.on_reply(Ok(Reply::from_static(reply))));
            assert_eq!(end, CopyEnd::TakenBack(removed), "{reply:?}");
        }
    }

    #[test]
    fn a_copy_replaces_its_lease_by_cas_and_takes_it_back_by_cas_in_both_key_forms() {
        let copy = read_copy();
        // The fill of a lease, by its cas.
        assert_eq!(&fill_wire(&copy.wire, 41)[0][..], b"ms k 2 F3 T60 C41\r\n");
        assert_eq!(&fill_wire(&copy.wire, 41)[1][..], b"v1\r\n");
        let base64 = ReadCopy {
            key: Bytes::from_static(b"aw=="),
            base64: true,
            wire: smallvec::smallvec![
                Bytes::from_static(b"ms aw== 2 F0 ME b c\r\n"),
                Bytes::from_static(b"v1\r\n")
            ],
            ..copy
        };
        assert_eq!(&fill_wire(&base64.wire, 7)[0][..], b"ms aw== 2 F0 b C7\r\n");
        let mut machine = base64.lease_copy();
        let (_, lease, _) = sent(machine.start());
        assert!(lease.starts_with(b"ms aw== 24 F1835821873 T5 ME c b\r\n"));
        let (_, check, _) = sent(machine.on_reply(ok(b"HD c7\r\n")));
        assert_eq!(check, b"mg aw== b v u\r\n");
        let (_, fill, _) = sent(machine.on_reply(ok(b"VA 2\r\nv1\r\n")));
        assert_eq!(fill, b"ms aw== 2 F0 b C7\r\nv1\r\n");
        let mut machine = base64.lease_copy();
        machine.start();
        machine.on_reply(ok(b"HD c7\r\n"));
        let (_, take_back, _) = sent(machine.on_reply(ok(b"EN\r\n")));
        assert_eq!(take_back, b"md aw== b C7\r\n");
    }
}
