//! A compare-and-swap with replicas, in either dialect (classic `cas`, meta
//! `ms … C`): each replica has its own cas numbers, so the `cas` is decided
//! on the owner alone, and once it stores there the same value goes to the
//! other replicas as a plain store. In a hand-off window the unique may have
//! come from the key's previous owner: when the owner refuses it, the
//! hand-off's [`CasTakeover`] decides (the same as without replicas), and
//! if it stores, the value goes to the other replicas before the answer.
//!
//! Pure: the session sends what a [`CasStep`] says and feeds replies back.

use crate::plan::handoff::cas::{CasTakeover, Turn};
use crate::plan::handoff::Owner;
use crate::plan::placement::Servers;
use crate::plan::route::CallResult;
use crate::protocol::encode::Outbound;
use crate::protocol::reply::Expect;

/// What to do after a reply to the `cas`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CasStep {
    /// Send `lines` to `server` (the owner or the previous owner, for the
    /// takeover) and feed its reply back.
    Send {
        server: usize,
        lines: Outbound,
        expect: Expect,
    },
    /// Send the value as a plain store to `servers`. With `awaited`, the
    /// answer waits for their replies; without, nothing waits for them.
    Copy { servers: Servers, awaited: bool },
    /// Nothing more to send.
    Done,
}

/// One replicated `cas` in progress.
#[derive(Debug)]
pub(crate) struct ReplicatedCas {
    meta: bool,
    owner: usize,
    /// The other replicas, sent the value once a `cas` stored (taken then).
    copies: Option<Servers>,
    /// The previous ring's owner of a moved key, and what a refusal of the
    /// owner goes on with (boxed: only a moved key's `cas` has one).
    previous: Option<(usize, Box<CasTakeover>)>,
    /// The owner refused and the takeover is under way.
    taking_over: bool,
    /// The takeover's answer.
    answer: Option<CallResult>,
}

impl ReplicatedCas {
    /// A `cas` on `owner` (meta when `meta`), then its value to `copies`;
    /// `previous` takes over when the owner refuses it.
    pub(crate) fn new(
        meta: bool,
        owner: usize,
        copies: Servers,
        previous: Option<(usize, CasTakeover)>,
    ) -> ReplicatedCas {
        ReplicatedCas {
            meta,
            owner,
            copies: Some(copies),
            previous: previous.map(|(server, takeover)| (server, Box::new(takeover))),
            taking_over: false,
            answer: None,
        }
    }

    /// Whether a step is still to come (the copies are not yet sent).
    pub(crate) fn deciding(&self) -> bool {
        self.copies.is_some()
    }

    /// The reply to the last `cas` or [`CasStep::Send`].
    pub(crate) fn on_reply(&mut self, result: &CallResult) -> CasStep {
        if self.copies.is_none() {
            return CasStep::Done;
        }
        let turn = match &mut self.previous {
            Some((_, takeover)) if self.taking_over => takeover.on_reply(result.clone()),
            Some((_, takeover)) if takeover.overturnable(result) => {
                self.taking_over = true;
                takeover.begin(result.clone())
            }
            _ => {
                let copies = self.copies.take().unwrap_or_default();
                return if matches!(result, Ok(reply) if reply.outcome.stored_in(self.meta)) {
                    CasStep::Copy {
                        servers: copies,
                        awaited: false,
                    }
                } else {
                    CasStep::Done
                };
            }
        };
        let previous = self.previous.as_ref().map_or(self.owner, |(p, _)| *p);
        match turn {
            Turn::Send { to, lines, expect } => CasStep::Send {
                server: match to {
                    Owner::New => self.owner,
                    Owner::Previous => previous,
                },
                lines,
                expect,
            },
            Turn::Refused(answer) => {
                self.answer = Some(answer);
                self.copies = None;
                CasStep::Done
            }
            // Stored on the previous owner, and the owner has its copy:
            // the other replicas take the value before the answer.
            Turn::Stored(answer) => {
                self.answer = Some(answer);
                let mut copies = self.copies.take().unwrap_or_default();
                copies.retain(|s| *s != previous && *s != self.owner);
                CasStep::Copy {
                    servers: copies,
                    awaited: true,
                }
            }
        }
    }

    /// The client's answer, given the last reply (every awaited copy's
    /// reply is in by then). `None` while the `cas` is being decided.
    pub(crate) fn answer(&self, result: &CallResult) -> Option<CallResult> {
        if self.deciding() {
            return None;
        }
        Some(self.answer.clone().unwrap_or_else(|| result.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::meta::MetaCommand;
    use crate::protocol::outcome::Reply;
    use crate::protocol::reply::LineKind;
    use bytes::Bytes;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(crate::protocol::outcome::Reply::from_static(reply))
    }

    fn servers(list: &[usize]) -> Servers {
        list.iter().copied().collect()
    }

    fn sent(step: CasStep) -> (usize, Vec<u8>) {
        match step {
            CasStep::Send { server, lines, .. } => (server, lines.concat()),
            other => panic!("not sending: {other:?}"),
        }
    }

    /// A meta `ms k 1 C7` whose previous owner is `previous`.
    fn moved_meta(previous: usize) -> Option<(usize, CasTakeover)> {
        let expect = Expect::meta(MetaCommand::Set, false);
        let takeover = CasTakeover::new(
            Bytes::from_static(b"k"),
            Some(false),
            smallvec::smallvec![Bytes::from_static(b"ms k 1 C7\r\ny\r\n")],
            expect,
            smallvec::smallvec![Bytes::from_static(b"ms k 1\r\ny\r\n")],
        );
        Some((previous, takeover))
    }

    #[test]
    fn a_cas_the_owner_stores_is_copied_without_waiting() {
        for (meta, stored) in [(false, &b"STORED\r\n"[..]), (true, &b"HD\r\n"[..])] {
            let mut cas = ReplicatedCas::new(meta, 0, servers(&[1, 2]), None);
            let stored = Ok(Reply::from_static(stored));
            let step = cas.on_reply(&stored);
            assert_eq!(
                step,
                CasStep::Copy {
                    servers: servers(&[1, 2]),
                    awaited: false
                }
            );
            assert_eq!(cas.answer(&stored), Some(stored.clone()));
        }
    }

    #[test]
    fn a_refused_cas_is_not_copied() {
        let mut cas = ReplicatedCas::new(false, 0, servers(&[1]), None);
        assert_eq!(cas.on_reply(&ok(b"EXISTS\r\n")), CasStep::Done);
        assert_eq!(cas.answer(&ok(b"EXISTS\r\n")), Some(ok(b"EXISTS\r\n")));
    }

    #[test]
    fn a_moved_keys_cas_is_taken_over_and_copied_to_the_replicas_before_the_answer() {
        // Replicas 0 (owner) and 3, which was the previous owner, and 1.
        let mut cas = ReplicatedCas::new(true, 0, servers(&[3, 1]), moved_meta(3));
        assert_eq!(
            sent(cas.on_reply(&ok(b"NF\r\n"))),
            (3, b"ms k 1 C7\r\ny\r\n".to_vec())
        );
        assert!(cas.deciding());
        assert_eq!(
            sent(cas.on_reply(&ok(b"HD c9\r\n"))),
            (0, b"ms k 1 ME\r\ny\r\n".to_vec())
        );
        assert_eq!(
            cas.on_reply(&ok(b"HD\r\n")),
            CasStep::Copy {
                servers: servers(&[1]),
                awaited: true
            }
        );
        assert_eq!(cas.answer(&ok(b"HD\r\n")), Some(ok(b"HD c9\r\n")));
    }

    #[test]
    fn a_newer_write_on_the_owner_keeps_the_refusal_and_copies_nothing() {
        let mut cas = ReplicatedCas::new(true, 0, servers(&[1]), moved_meta(2));
        assert_eq!(sent(cas.on_reply(&ok(b"EX\r\n"))).0, 0);
        assert_eq!(sent(cas.on_reply(&ok(b"VA 1 c5 f0 t-1\r\nw\r\n"))).0, 2);
        assert_eq!(cas.on_reply(&ok(b"VA 1 f0 t-1\r\nx\r\n")), CasStep::Done);
        assert!(!cas.deciding());
        assert_eq!(
            cas.answer(&ok(b"VA 1 f0 t-1\r\nx\r\n")),
            Some(ok(b"EX\r\n"))
        );
    }

    #[test]
    fn a_classic_cas_refused_on_both_owners_answers_the_refusal_of_the_one_holding_the_key() {
        let takeover = CasTakeover::new(
            Bytes::from_static(b"k"),
            None,
            smallvec::smallvec![Bytes::from_static(b"cas k 0 0 1 7\r\ny\r\n")],
            Expect::Line(LineKind::Storage),
            smallvec::smallvec![
                Bytes::from_static(b"set k 0 0 1\r\n"),
                Bytes::from_static(b"y\r\n")
            ],
        );
        let mut cas = ReplicatedCas::new(false, 0, servers(&[]), Some((1, takeover)));
        assert_eq!(sent(cas.on_reply(&ok(b"NOT_FOUND\r\n"))).0, 1);
        assert_eq!(cas.on_reply(&ok(b"EXISTS\r\n")), CasStep::Done);
        // The owner lacks the key; the other has it under another unique.
        assert_eq!(cas.answer(&ok(b"EXISTS\r\n")), Some(ok(b"EXISTS\r\n")));
    }
}
