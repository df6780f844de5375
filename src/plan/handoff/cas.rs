//! A compare-and-swap on a moved key that its new owner refused. The
//! client's unique may be the previous owner's (its `gets` read the key
//! through from there), so the `cas` is tried on the previous owner; if it
//! stores there, the value goes to the new owner, but only in a way that
//! cannot replace a write that reached the new owner meanwhile:
//!
//! - refused for want of the key: the copy is an `add`, which a write that
//!   got there first wins;
//! - refused for want of the unique: the new owner holds an item already.
//!   It may be a read-through copy of the value the client saw, or another
//!   client's newer write whose hand-off has not yet removed the previous
//!   owner's value. Both owners are read first; only when the new owner
//!   holds the previous owner's value (data and flags) is the `cas` tried
//!   there, and the copy is a `cas` with the new owner's unique, so the
//!   copy fails if anything replaced that item in between. Otherwise the
//!   refusal stands: the newer write came first.
//!
//! A copy that loses to such a write still answers the `cas`'s success: the
//! two overlapped, and the write is the later one. Pure, in either dialect.

use bytes::{BufMut, Bytes, BytesMut};

use super::{fetch_line, meta_expect, CallResult, Owner, ValueReply};
use crate::protocol::encode::{cas_as_set, forwardable, Outbound};
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::{Expect, LineKind};
use crate::protocol::Request;

/// What to do next.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Send `lines` to `to` and feed the reply back with
    /// [`CasTakeover::on_reply`].
    Send {
        to: Owner,
        lines: Outbound,
        expect: Expect,
    },
    /// The `cas` did not store: this is the client's answer.
    Refused(CallResult),
    /// The previous owner stored the value and the new owner was sent it:
    /// this is the client's answer. The previous owner still holds the
    /// value; the caller decides whether it goes.
    Stored(CallResult),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for the new owner's item (`mg … c`).
    ReadOwner,
    /// Waiting for the previous owner's item.
    ReadPrevious,
    /// Waiting for the previous owner's reply to the `cas`; the copy is a
    /// `cas` with this unique, or an `add` without one.
    CasPrevious { owner_unique: Option<u64> },
    /// Waiting for the new owner's reply to the copy.
    CopyToOwner,
}

/// One refused `cas` of a moved key, in progress.
#[derive(Debug)]
pub(crate) struct CasTakeover {
    /// The key as memring sends it (a meta token for meta), and for meta
    /// whether it is base64.
    key: Bytes,
    meta: Option<bool>,
    /// The client's `cas` as it goes to a server, and how its reply is framed.
    cas: Outbound,
    expect: Expect,
    /// The store without its unique: `set k <flags> <exptime> <bytes>` and
    /// the data (see `encode::cas_as_set`), or for meta the `ms` without `C`
    /// and `q` (see `route::meta_copy`).
    store: Outbound,
    stage: Stage,
    /// The new owner's refusal: answered unless the previous owner stores.
    refusal: Option<CallResult>,
    /// The new owner's item, as read.
    owner_item: Option<Reply>,
    /// The previous owner's reply to the `cas`, once it stored.
    stored: Option<CallResult>,
}

impl CasTakeover {
    /// A takeover for a `cas` (`cas`, `expect`) of `key`; `meta` is
    /// `Some(base64)` for a meta `ms … C`. Nothing is sent before
    /// [`CasTakeover::begin`].
    pub(crate) fn new(
        key: Bytes,
        meta: Option<bool>,
        cas: Outbound,
        expect: Expect,
        store: Outbound,
    ) -> CasTakeover {
        CasTakeover {
            key,
            meta,
            cas,
            expect,
            store,
            stage: Stage::ReadOwner,
            refusal: None,
            owner_item: None,
            stored: None,
        }
    }

    /// A takeover for a classic `cas` request.
    pub(crate) fn classic(request: &Request, bytes: &Bytes) -> CasTakeover {
        CasTakeover::new(
            bytes.slice_ref(request.key(bytes, 0)),
            None,
            forwardable(bytes, request),
            Expect::Line(LineKind::Storage),
            cas_as_set(request, bytes),
        )
    }

    /// Whether the new owner's reply to the `cas` is a refusal that the
    /// previous owner may overturn.
    pub(crate) fn overturnable(&self, reply: &CallResult) -> bool {
        matches!(reply, Ok(r) if r.outcome.cas_refused())
    }

    /// The first step after the new owner's refusal (see
    /// [`CasTakeover::overturnable`]).
    pub(crate) fn begin(&mut self, refusal: CallResult) -> Turn {
        let for_want_of_the_key = match &refusal {
            Ok(reply) => reply.outcome.not_found(),
            Err(_) => false,
        };
        self.refusal = Some(refusal);
        if for_want_of_the_key {
            return self.try_previous(None);
        }
        self.stage = Stage::ReadOwner;
        self.read(Owner::New, true)
    }

    /// The reply to the last [`Turn::Send`].
    pub(crate) fn on_reply(&mut self, result: CallResult) -> Turn {
        match self.stage {
            Stage::ReadOwner => match result {
                Ok(reply) if reply.outcome == Outcome::Va => {
                    self.owner_item = Some(reply);
                    self.stage = Stage::ReadPrevious;
                    self.read(Owner::Previous, false)
                }
                // Gone from the new owner since it refused: as if it had
                // refused for want of the key.
                Ok(reply) if reply.outcome == Outcome::En => self.try_previous(None),
                _ => self.refused(),
            },
            Stage::ReadPrevious => {
                let owner = self.owner_item.take();
                let owner = owner.as_ref().and_then(ValueReply::parse);
                let previous = result.as_ref().ok().and_then(ValueReply::parse);
                // Only the new owner holding the previous owner's value may
                // take the copy; anything else there is a newer write.
                let unique = match (owner, previous) {
                    (Some(owner), Some(previous)) if same_item(&owner, &previous) => {
                        owner.number::<u64>(b'c')
                    }
                    _ => None,
                };
                match unique {
                    Some(unique) => self.try_previous(Some(unique)),
                    None => self.refused(),
                }
            }
            Stage::CasPrevious { owner_unique } => {
                if !matches!(&result, Ok(r) if r.outcome.stored_in(self.meta.is_some())) {
                    // With nothing on the new owner (or a lease, a miss),
                    // the previous owner's refusal says what the key is.
                    if owner_unique.is_none() && result.is_ok() {
                        return Turn::Refused(result);
                    }
                    return self.refused();
                }
                self.stored = Some(result);
                self.stage = Stage::CopyToOwner;
                let expect = match self.meta {
                    None => Expect::Line(LineKind::Storage),
                    Some(_) => meta_expect(MetaCommand::Set),
                };
                Turn::Send {
                    to: Owner::New,
                    lines: self.copy(owner_unique),
                    expect,
                }
            }
            Stage::CopyToOwner => {
                let stored = self.stored.take().unwrap_or_else(|| result.clone());
                let meta = self.meta.is_some();
                let taken_or_overtaken =
                    matches!(&result, Ok(r) if stored_or_lost_to_a_write(meta, r));
                Turn::Stored(if taken_or_overtaken { stored } else { result })
            }
        }
    }

    fn refused(&mut self) -> Turn {
        let refusal = self.refusal.take();
        Turn::Refused(refusal.unwrap_or_else(|| Ok(Reply::nothing())))
    }

    fn read(&self, to: Owner, with_cas: bool) -> Turn {
        Turn::Send {
            to,
            lines: smallvec::smallvec![fetch_line(&self.key, self.meta == Some(true), with_cas)],
            expect: meta_expect(MetaCommand::Get),
        }
    }

    fn try_previous(&mut self, owner_unique: Option<u64>) -> Turn {
        self.stage = Stage::CasPrevious { owner_unique };
        Turn::Send {
            to: Owner::Previous,
            lines: self.cas.clone(),
            expect: self.expect.clone(),
        }
    }

    /// The store for the new owner: a `cas` with its unique, or an `add`.
    fn copy(&self, owner_unique: Option<u64>) -> Outbound {
        let Some(first) = self.store.first() else {
            return Outbound::new();
        };
        let line_end = memchr::memmem::find(first, b"\r\n").unwrap_or(first.len());
        let line = &first[..line_end];
        let mut out = BytesMut::with_capacity(line.len() + 24);
        match self.meta {
            None => {
                // `set k <flags> <exptime> <bytes>`: only the verb changes,
                // and a `cas` takes its unique last.
                let rest = line.strip_prefix(b"set").unwrap_or(line);
                out.put_slice(if owner_unique.is_some() {
                    b"cas"
                } else {
                    b"add"
                });
                out.put_slice(rest);
                if let Some(unique) = owner_unique {
                    out.put_slice(format!(" {unique}").as_bytes());
                }
            }
            Some(_) => {
                // `ms k <bytes> <flags>`: a mode flag would fight the one
                // added (a `cas` is only taken over in set mode).
                for (i, token) in line.split(|&b| b == b' ').enumerate() {
                    if i >= 3 && token.first() == Some(&b'M') {
                        continue;
                    }
                    if i > 0 {
                        out.put_u8(b' ');
                    }
                    out.put_slice(token);
                }
                match owner_unique {
                    Some(unique) => out.put_slice(format!(" C{unique}").as_bytes()),
                    None => out.put_slice(b" ME"),
                }
            }
        }
        out.put_slice(b"\r\n");
        let mut copy: Outbound = smallvec::smallvec![out.freeze()];
        let data = first.slice((line_end + 2).min(first.len())..);
        if !data.is_empty() {
            copy.push(data);
        }
        copy.extend(self.store[1..].iter().cloned());
        copy
    }
}

/// The same data and client flags: what a reader of either could tell apart.
fn same_item(a: &ValueReply<'_>, b: &ValueReply<'_>) -> bool {
    a.data == b.data && a.number::<u32>(b'f') == b.number::<u32>(b'f')
}

/// A copy's reply that stored, or that a write which got to the new owner
/// first refused (`NOT_STORED`/`NS` to an `add`, `EXISTS`/`EX` or
/// `NOT_FOUND`/`NF` to a `cas`).
fn stored_or_lost_to_a_write(meta: bool, reply: &Reply) -> bool {
    let outcome = reply.outcome;
    outcome.stored_in(meta)
        || outcome.cas_refused()
        || outcome == Outcome::NotStored
        || (meta && outcome == Outcome::Ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(crate::protocol::outcome::Reply::from_static(reply))
    }

    fn classic() -> CasTakeover {
        CasTakeover::new(
            Bytes::from_static(b"k"),
            None,
            smallvec::smallvec![Bytes::from_static(b"cas k 3 60 1 7\r\nz\r\n")],
            Expect::Line(LineKind::Storage),
            smallvec::smallvec![
                Bytes::from_static(b"set k 3 60 1\r\n"),
                Bytes::from_static(b"z\r\n")
            ],
        )
    }

    fn meta() -> CasTakeover {
        CasTakeover::new(
            Bytes::from_static(b"k"),
            Some(false),
            smallvec::smallvec![Bytes::from_static(b"ms k 1 C7 MS T60\r\ny\r\n")],
            meta_expect(MetaCommand::Set),
            smallvec::smallvec![Bytes::from_static(b"ms k 1 MS T60\r\ny\r\n")],
        )
    }

    fn sent(turn: &Turn) -> (Owner, Vec<u8>) {
        match turn {
            Turn::Send { to, lines, .. } => (*to, lines.concat()),
            other => panic!("not sending: {other:?}"),
        }
    }

    #[test]
    fn a_copy_the_new_owner_holds_is_replaced_by_its_own_unique() {
        let mut cas = classic();
        assert!(cas.overturnable(&ok(b"EXISTS\r\n")));
        let turn = cas.begin(ok(b"EXISTS\r\n"));
        assert_eq!(sent(&turn), (Owner::New, b"mg k c v f t\r\n".to_vec()));
        let turn = cas.on_reply(ok(b"VA 1 c41 f3 t60\r\nx\r\n"));
        assert_eq!(sent(&turn), (Owner::Previous, b"mg k v f t\r\n".to_vec()));
        let turn = cas.on_reply(ok(b"VA 1 f3 t58\r\nx\r\n"));
        assert_eq!(
            sent(&turn),
            (Owner::Previous, b"cas k 3 60 1 7\r\nz\r\n".to_vec())
        );
        let turn = cas.on_reply(ok(b"STORED\r\n"));
        assert_eq!(
            sent(&turn),
            (Owner::New, b"cas k 3 60 1 41\r\nz\r\n".to_vec())
        );
        // Stored, or lost to a write that came later: the cas stored.
        for copy in [&b"STORED\r\n"[..], b"EXISTS\r\n", b"NOT_FOUND\r\n"] {
            let mut again = classic();
            again.begin(ok(b"EXISTS\r\n"));
            again.on_reply(ok(b"VA 1 c41 f3 t60\r\nx\r\n"));
            again.on_reply(ok(b"VA 1 f3 t58\r\nx\r\n"));
            again.on_reply(ok(b"STORED\r\n"));
            match again.on_reply(Ok(Reply::made(Bytes::copy_from_slice(copy)))) {
                Turn::Stored(answer) => assert_eq!(answer.unwrap(), &b"STORED\r\n"[..]),
                other => panic!("{other:?}"),
            }
        }
        // The new owner could not take it: its error answers.
        match cas.on_reply(ok(b"SERVER_ERROR out of memory\r\n")) {
            Turn::Stored(answer) => {
                assert_eq!(answer.unwrap(), &b"SERVER_ERROR out of memory\r\n"[..])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_newer_value_on_the_new_owner_keeps_the_refusal() {
        for (previous, why) in [
            (&b"VA 1 f3 t58\r\nw\r\n"[..], "other data"),
            (b"VA 1 f4 t58\r\nx\r\n", "other flags"),
            (b"EN\r\n", "gone from the previous owner"),
        ] {
            let mut cas = classic();
            cas.begin(ok(b"EXISTS\r\n"));
            cas.on_reply(ok(b"VA 1 c41 f3 t60\r\nx\r\n"));
            match cas.on_reply(Ok(Reply::made(Bytes::copy_from_slice(previous)))) {
                Turn::Refused(answer) => assert_eq!(answer.unwrap(), &b"EXISTS\r\n"[..], "{why}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        // A refusal of the previous owner too keeps the new owner's.
        let mut cas = classic();
        cas.begin(ok(b"EXISTS\r\n"));
        cas.on_reply(ok(b"VA 1 c41 f3 t60\r\nx\r\n"));
        cas.on_reply(ok(b"VA 1 f3 t58\r\nx\r\n"));
        match cas.on_reply(ok(b"EXISTS\r\n")) {
            Turn::Refused(answer) => assert_eq!(answer.unwrap(), &b"EXISTS\r\n"[..]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_key_missing_on_the_new_owner_is_copied_there_as_an_add() {
        let mut cas = classic();
        let turn = cas.begin(ok(b"NOT_FOUND\r\n"));
        assert_eq!(
            sent(&turn),
            (Owner::Previous, b"cas k 3 60 1 7\r\nz\r\n".to_vec())
        );
        let turn = cas.on_reply(ok(b"STORED\r\n"));
        assert_eq!(sent(&turn), (Owner::New, b"add k 3 60 1\r\nz\r\n".to_vec()));
        match cas.on_reply(ok(b"NOT_STORED\r\n")) {
            Turn::Stored(answer) => assert_eq!(answer.unwrap(), &b"STORED\r\n"[..]),
            other => panic!("{other:?}"),
        }
        // Gone between the refusal and the read: the same.
        let mut cas = classic();
        cas.begin(ok(b"EXISTS\r\n"));
        assert_eq!(sent(&cas.on_reply(ok(b"EN\r\n"))).0, Owner::Previous);
        assert_eq!(
            sent(&cas.on_reply(ok(b"STORED\r\n"))).1,
            b"add k 3 60 1\r\nz\r\n"
        );
    }

    #[test]
    fn meta_copies_take_the_mode_and_unique_the_takeover_needs() {
        let mut cas = meta();
        cas.begin(ok(b"EX\r\n"));
        cas.on_reply(ok(b"VA 1 c9 f0 t60\r\nx\r\n"));
        cas.on_reply(ok(b"VA 1 f0 t60\r\nx\r\n"));
        let turn = cas.on_reply(ok(b"HD\r\n"));
        assert_eq!(
            sent(&turn),
            (Owner::New, b"ms k 1 T60 C9\r\ny\r\n".to_vec())
        );
        match cas.on_reply(ok(b"EX\r\n")) {
            Turn::Stored(answer) => assert_eq!(answer.unwrap(), &b"HD\r\n"[..]),
            other => panic!("{other:?}"),
        }
        let mut cas = meta();
        cas.begin(ok(b"NF\r\n"));
        let turn = cas.on_reply(ok(b"HD\r\n"));
        assert_eq!(
            sent(&turn),
            (Owner::New, b"ms k 1 T60 ME\r\ny\r\n".to_vec())
        );
        // Failures and errors of the new owner's read keep the refusal.
        let mut cas = meta();
        cas.begin(ok(b"EX\r\n"));
        match cas.on_reply(ok(b"SERVER_ERROR busy\r\n")) {
            Turn::Refused(answer) => assert_eq!(answer.unwrap(), &b"EX\r\n"[..]),
            other => panic!("{other:?}"),
        }
    }
}
