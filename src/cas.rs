//! A compare-and-swap with replicas, in either dialect (classic `cas`, meta
//! `ms … C`): each replica has its own cas numbers, so the `cas` is decided
//! on the owner alone, and once it stores there the same value goes to the
//! other replicas as a plain store. In a hand-off window the unique may have
//! come from the key's previous owner: when the owner refuses it for want of
//! the key or of the unique, the `cas` is tried there, and if it stores, the
//! value goes to the owner and the other replicas before the answer.
//!
//! Pure: the session sends what a [`CasStep`] says and feeds replies back.

use crate::protocol::meta::reply::{cas_refused, stored};
use crate::route::{CallResult, Servers};

/// What to do after a reply to the `cas`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CasStep {
    /// Send the `cas` again, to `server` (the previous owner), and feed its
    /// reply back.
    TryPrevious(usize),
    /// Send the value as a plain store to `servers`. With `awaited`, the
    /// answer waits for their replies, the owner's first (see
    /// [`ReplicatedCas::answer`]); without, nothing waits for them.
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
    /// The previous ring's owner of a moved key, not tried yet.
    previous: Option<usize>,
    /// The owner's refusal while the previous owner is tried.
    first: Option<CallResult>,
    /// The previous owner stored: the copies' replies are awaited.
    copied: bool,
}

impl ReplicatedCas {
    /// A `cas` on `owner` (meta when `meta`), then its value to `copies`;
    /// `previous` is tried when the owner refuses it.
    pub(crate) fn new(
        meta: bool,
        owner: usize,
        copies: Servers,
        previous: Option<usize>,
    ) -> ReplicatedCas {
        ReplicatedCas {
            meta,
            owner,
            copies: Some(copies),
            previous,
            first: None,
            copied: false,
        }
    }

    /// Whether a step is still to come (the copies are not yet sent).
    pub(crate) fn deciding(&self) -> bool {
        self.copies.is_some()
    }

    /// The reply of `server` to the `cas`.
    pub(crate) fn on_reply(&mut self, result: &CallResult, server: usize) -> CasStep {
        if self.copies.is_none() {
            return CasStep::Done;
        }
        if self.first.is_none() && matches!(result, Ok(reply) if cas_refused(self.meta, reply)) {
            if let Some(previous) = self.previous.take() {
                self.first = Some(result.clone());
                return CasStep::TryPrevious(previous);
            }
        }
        let stored = matches!(result, Ok(reply) if stored(self.meta, reply));
        let mut copies = self.copies.take().unwrap_or_default();
        if !stored {
            return CasStep::Done;
        }
        if self.first.is_none() {
            return CasStep::Copy {
                servers: copies,
                awaited: false,
            };
        }
        // Stored on the previous owner: the owner and the other replicas
        // take the value before the answer.
        self.copied = true;
        copies.insert(0, self.owner);
        copies.retain(|s| *s != server);
        CasStep::Copy {
            servers: copies,
            awaited: true,
        }
    }

    /// The client's answer, given the last `cas` reply and, when the
    /// previous owner stored, the owner's reply to its copy (every copy's
    /// reply is in by then). `None` while the `cas` is being decided.
    pub(crate) fn answer(
        &self,
        result: &CallResult,
        owner_copy: Option<&CallResult>,
    ) -> Option<CallResult> {
        if self.deciding() {
            return None;
        }
        Some(match (&self.first, self.copied) {
            // Not stored on the previous owner either: the owner's refusal.
            (Some(first), false) => first.clone(),
            // The owner did not take the value: a reader would still find
            // the older value there, so its reply answers.
            (Some(_), true) => match owner_copy {
                Some(owner) if !matches!(owner, Ok(r) if stored(self.meta, r)) => owner.clone(),
                _ => result.clone(),
            },
            (None, _) => result.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Bytes::from_static(reply))
    }

    fn servers(list: &[usize]) -> Servers {
        list.iter().copied().collect()
    }

    #[test]
    fn a_cas_the_owner_stores_is_copied_without_waiting() {
        for (meta, stored) in [(false, &b"STORED\r\n"[..]), (true, &b"HD\r\n"[..])] {
            let mut cas = ReplicatedCas::new(meta, 0, servers(&[1, 2]), None);
            let stored = Ok(Bytes::from_static(stored));
            let step = cas.on_reply(&stored, 0);
            assert_eq!(
                step,
                CasStep::Copy {
                    servers: servers(&[1, 2]),
                    awaited: false
                }
            );
            assert_eq!(cas.answer(&stored, None), Some(stored.clone()));
        }
    }

    #[test]
    fn a_refused_cas_is_not_copied() {
        let mut cas = ReplicatedCas::new(false, 0, servers(&[1]), None);
        assert_eq!(cas.on_reply(&ok(b"EXISTS\r\n"), 0), CasStep::Done);
        assert_eq!(
            cas.answer(&ok(b"EXISTS\r\n"), None),
            Some(ok(b"EXISTS\r\n"))
        );
    }

    #[test]
    fn a_moved_keys_cas_is_tried_on_the_previous_owner_and_copied_before_the_answer() {
        let mut cas = ReplicatedCas::new(true, 0, servers(&[1]), Some(3));
        assert_eq!(cas.on_reply(&ok(b"EX\r\n"), 0), CasStep::TryPrevious(3));
        assert!(cas.deciding());
        let stored = ok(b"HD c9\r\n");
        assert_eq!(
            cas.on_reply(&stored, 3),
            CasStep::Copy {
                servers: servers(&[0, 1]),
                awaited: true
            }
        );
        let taken = ok(b"HD\r\n");
        assert_eq!(cas.answer(&stored, Some(&taken)), Some(stored.clone()));
        // The owner did not take the value: its reply answers.
        let full = ok(b"SERVER_ERROR out of memory\r\n");
        assert_eq!(cas.answer(&stored, Some(&full)), Some(full.clone()));
    }

    #[test]
    fn a_cas_refused_on_both_owners_answers_the_new_owners_refusal() {
        let mut cas = ReplicatedCas::new(false, 0, servers(&[]), Some(1));
        assert_eq!(
            cas.on_reply(&ok(b"NOT_FOUND\r\n"), 0),
            CasStep::TryPrevious(1)
        );
        assert_eq!(cas.on_reply(&ok(b"EXISTS\r\n"), 1), CasStep::Done);
        assert_eq!(
            cas.answer(&ok(b"EXISTS\r\n"), None),
            Some(ok(b"NOT_FOUND\r\n"))
        );
    }
}
