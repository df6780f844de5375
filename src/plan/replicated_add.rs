//! An `add` with replicas, in either dialect (classic `add`, meta `ms … ME`),
//! answered the way later reads see it: stored only when every replica that
//! answered stored it (at least a quorum), not stored otherwise, and then no
//! replica keeps this add's value. A read asks the first replica and, with
//! `read_miss_fallthrough`, the next on a miss: a value the add left on one
//! replica while answering "not stored" would be read later.
//!
//! One replica decides first, alone: the key's first replica (the next one
//! when it fails). memcached's `add` is atomic on one server, so of two
//! concurrent adds exactly one stores there, and only that one goes on to
//! the other replicas. If every one of them stores too, the add is stored.
//! If one refuses (it holds the key), or too few stored for a quorum, each
//! copy this add made is taken back by its cas (`md … C<cas>`: a newer write
//! there stays) before the client is answered. Every add goes as
//! `ms … ME c`, so each store returns the cas to take it back by.
//!
//! A refusal may come from another sidecar's hand-off lease (which reads as
//! a missing key, and may outlive this sidecar's window by its 5 seconds):
//! each refusing replica is then looked at (`mg … c f s u`), and when every
//! refusal was a lease, the leases are removed by their cas and the add
//! goes to those replicas again (a few times at most).
//!
//! Pure: the session sends what an [`AddStep`] says and feeds the replies
//! back; the classic or meta answer is written from [`AddAnswer`].

use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::BackendError;
use crate::plan::handoff::probed_lease;
use crate::plan::placement::Servers;
use crate::plan::route::CallResult;
use crate::protocol::meta::reply::returned_cas;
use crate::protocol::outcome::{Outcome, Reply as ServerReply};

/// How many times refusals that were all leases are cleared and the add
/// sent again; after that the refusal stands (as a lease is placed again
/// only by a read-through copy, this is rare).
const MAX_LEASE_CLEARS: u8 = 3;

/// Copies an add made: (server, the cas of its item there).
pub(crate) type Made = SmallVec<[(usize, u64); 3]>;

/// What to send next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AddStep {
    /// The add to each of these servers; every reply comes back in one call.
    Add(Servers),
    /// `md <key> C<cas>` to each (server, cas); the replies are only awaited.
    TakeBack(Made),
    /// Look at the item on each of these servers, leases shown
    /// (`handoff::probe_line`); every reply comes back in one call.
    Probe(Servers),
    /// On each server, `md <key> C<cas>` (reply not wanted) and then the
    /// add again; the adds' replies come back in one call.
    ClearAndAdd(Made),
    /// The answer is ready.
    Done,
}

/// The client's answer, in terms both dialects write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AddAnswer {
    /// Stored on every replica that answered: the deciding replica's reply.
    Stored(ServerReply),
    /// A replica holds the key: its reply (`NS …`).
    Refused(ServerReply),
    /// The request itself was refused (an error line every server would
    /// send alike, such as `CLIENT_ERROR`): that reply.
    Rejected(ServerReply),
    /// Too few replicas stored: the servers that failed.
    NoQuorum(Vec<Arc<str>>),
}

/// One replicated add in progress.
#[derive(Debug)]
pub(crate) struct ReplicatedAdd {
    servers: Servers,
    quorum: usize,
    /// Index in `servers` of the next replica to try as the decider.
    next: usize,
    /// The decider's reply, once one stored.
    decided: Option<ServerReply>,
    made: Made,
    failed: Vec<Arc<str>>,
    answer: Option<AddAnswer>,
    /// The refusal the probes under way look behind.
    refusal: Option<ServerReply>,
    lease_clears: u8,
}

/// How one reply to `ms … ME c` reads.
enum Reply<'a> {
    Stored(u64),
    Refused,
    Failed(Option<&'a BackendError>),
    Rejected,
}

fn read(result: &CallResult) -> Reply<'_> {
    match result {
        Err(error) => Reply::Failed(Some(error)),
        Ok(reply) => match reply.outcome {
            Outcome::Ns => Reply::Refused,
            Outcome::Hd => match returned_cas(reply) {
                Some(cas) => Reply::Stored(cas),
                // Asked with `c`, memcached always returns it.
                None => Reply::Failed(None),
            },
            Outcome::ServerError => Reply::Failed(None),
            outcome if outcome.is_error() => Reply::Rejected,
            _ => Reply::Failed(None),
        },
    }
}

impl ReplicatedAdd {
    /// An add to `servers` (the key's replicas, first replica first),
    /// stored with at least `quorum` of them.
    pub(crate) fn new(servers: Servers, quorum: usize) -> ReplicatedAdd {
        ReplicatedAdd {
            servers,
            quorum: quorum.max(1),
            next: 0,
            decided: None,
            made: Made::new(),
            failed: Vec::new(),
            answer: None,
            refusal: None,
            lease_clears: 0,
        }
    }

    /// The first step: the add to the first replica.
    pub(crate) fn start(&mut self) -> AddStep {
        self.next_decider()
    }

    fn next_decider(&mut self) -> AddStep {
        let left = self.servers.len() - self.next;
        if left < self.quorum {
            self.answer = Some(AddAnswer::NoQuorum(std::mem::take(&mut self.failed)));
            return AddStep::Done;
        }
        let server = self.servers[self.next];
        self.next += 1;
        AddStep::Add(smallvec::smallvec![server])
    }

    /// The replies to the last step, each with its server.
    pub(crate) fn on_replies(&mut self, replies: &[(usize, &CallResult)]) -> AddStep {
        if self.answer.is_some() {
            return AddStep::Done;
        }
        if let Some(refusal) = self.refusal.take() {
            return self.on_probes(refusal, replies);
        }
        if self.decided.is_none() {
            let Some(&(server, result)) = replies.first() else {
                return AddStep::Done;
            };
            return match read(result) {
                Reply::Stored(cas) => {
                    self.made.push((server, cas));
                    self.decided = Some(result.clone().unwrap_or_default());
                    let rest: Servers = self.servers[self.next..].iter().copied().collect();
                    if rest.is_empty() {
                        return self.settle(None);
                    }
                    AddStep::Add(rest)
                }
                Reply::Refused => self.look_behind(
                    result.clone().unwrap_or_default(),
                    smallvec::smallvec![server],
                ),
                Reply::Rejected => {
                    self.answer = Some(AddAnswer::Rejected(result.clone().unwrap_or_default()));
                    AddStep::Done
                }
                Reply::Failed(error) => {
                    self.failed.extend(error.map(|e| e.server.clone()));
                    self.next_decider()
                }
            };
        }
        let mut refusal = None;
        let mut refused = Servers::new();
        let mut rejected = false;
        for &(server, result) in replies {
            match read(result) {
                Reply::Stored(cas) => self.made.push((server, cas)),
                Reply::Refused | Reply::Rejected => {
                    refusal.get_or_insert_with(|| result.clone().unwrap_or_default());
                    refused.push(server);
                    rejected |= matches!(read(result), Reply::Rejected);
                }
                Reply::Failed(error) => self.failed.extend(error.map(|e| e.server.clone())),
            }
        }
        match refusal {
            Some(refusal) if !rejected => self.look_behind(refusal, refused),
            refusal => self.settle(refusal),
        }
    }

    /// A refusal from `servers`: looked behind for leases, while there are
    /// clears left; otherwise it stands.
    fn look_behind(&mut self, refusal: ServerReply, servers: Servers) -> AddStep {
        if self.lease_clears >= MAX_LEASE_CLEARS {
            return self.refused(refusal);
        }
        self.refusal = Some(refusal);
        AddStep::Probe(servers)
    }

    /// The probes of the refusing replicas: all leases, cleared and the add
    /// sent again; anything else, the refusal stands.
    fn on_probes(&mut self, refusal: ServerReply, probes: &[(usize, &CallResult)]) -> AddStep {
        let leases: Option<Made> = probes
            .iter()
            .map(|&(server, probe)| {
                let cas = probe.as_ref().ok().and_then(probed_lease)?;
                Some((server, cas))
            })
            .collect();
        match leases {
            Some(leases) if !leases.is_empty() => {
                self.lease_clears += 1;
                AddStep::ClearAndAdd(leases)
            }
            _ => self.refused(refusal),
        }
    }

    /// The refusal stands: before any replica stored, the answer; after,
    /// the copies made go back.
    fn refused(&mut self, refusal: ServerReply) -> AddStep {
        if self.decided.is_none() {
            self.answer = Some(AddAnswer::Refused(refusal));
            return AddStep::Done;
        }
        self.settle(Some(refusal))
    }

    /// Every replica has answered: stored, or the copies go back.
    fn settle(&mut self, refusal: Option<ServerReply>) -> AddStep {
        if refusal.is_none() && self.made.len() >= self.quorum {
            self.answer = Some(AddAnswer::Stored(self.decided.clone().unwrap_or_default()));
            return AddStep::Done;
        }
        self.answer = Some(match refusal {
            Some(reply) => AddAnswer::Refused(reply),
            None => AddAnswer::NoQuorum(std::mem::take(&mut self.failed)),
        });
        AddStep::TakeBack(std::mem::take(&mut self.made))
    }

    /// The answer, once the last step's replies are in (take-backs
    /// included: the session waits for them before writing it).
    pub(crate) fn answer(&self) -> Option<&AddAnswer> {
        self.answer.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BackendErrorKind;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(crate::protocol::outcome::Reply::from_static(reply))
    }

    fn servers(list: &[usize]) -> Servers {
        list.iter().copied().collect()
    }

    #[test]
    fn stored_on_every_replica_is_stored() {
        let mut add = ReplicatedAdd::new(servers(&[3, 1]), 2);
        assert_eq!(add.start(), AddStep::Add(servers(&[3])));
        let hd = ok(b"HD c7\r\n");
        assert_eq!(add.on_replies(&[(3, &hd)]), AddStep::Add(servers(&[1])));
        assert!(add.answer().is_none());
        let hd2 = ok(b"HD c9\r\n");
        assert_eq!(add.on_replies(&[(1, &hd2)]), AddStep::Done);
        assert_eq!(
            add.answer(),
            Some(&AddAnswer::Stored(ServerReply::from_static(b"HD c7\r\n")))
        );
    }

    #[test]
    fn a_refusal_on_the_first_replica_sends_nothing_else() {
        let mut add = ReplicatedAdd::new(servers(&[0, 1]), 2);
        add.start();
        let ns = ok(b"NS c0\r\n");
        assert_eq!(add.on_replies(&[(0, &ns)]), AddStep::Probe(servers(&[0])));
        // A value there, not a lease: the refusal stands.
        let value = ok(b"HD c3 f0 s1\r\n");
        assert_eq!(add.on_replies(&[(0, &value)]), AddStep::Done);
        assert_eq!(
            add.answer(),
            Some(&AddAnswer::Refused(ServerReply::from_static(b"NS c0\r\n")))
        );
    }

    fn lease(cas: u64) -> CallResult {
        let flags = crate::protocol::lease::LEASE_FLAGS;
        Ok(ServerReply::made(bytes::Bytes::from(format!(
            "HD c{cas} f{flags} s24\r\n"
        ))))
    }

    #[test]
    fn a_lease_behind_a_refusal_is_cleared_and_the_add_goes_again() {
        let mut add = ReplicatedAdd::new(servers(&[0, 1]), 2);
        add.start();
        let ns = ok(b"NS\r\n");
        assert_eq!(add.on_replies(&[(0, &ns)]), AddStep::Probe(servers(&[0])));
        let step = add.on_replies(&[(0, &lease(7))]);
        assert_eq!(step, AddStep::ClearAndAdd(smallvec::smallvec![(0, 7)]));
        let hd = ok(b"HD c9\r\n");
        assert_eq!(add.on_replies(&[(0, &hd)]), AddStep::Add(servers(&[1])));
        // The other replica holds a lease too.
        assert_eq!(add.on_replies(&[(1, &ns)]), AddStep::Probe(servers(&[1])));
        let step = add.on_replies(&[(1, &lease(4))]);
        assert_eq!(step, AddStep::ClearAndAdd(smallvec::smallvec![(1, 4)]));
        let hd2 = ok(b"HD c5\r\n");
        assert_eq!(add.on_replies(&[(1, &hd2)]), AddStep::Done);
        assert!(matches!(add.answer(), Some(AddAnswer::Stored(_))));
    }

    #[test]
    fn leases_placed_again_and_again_leave_the_refusal_after_a_few_clears() {
        let mut add = ReplicatedAdd::new(servers(&[0]), 1);
        add.start();
        let ns = ok(b"NS\r\n");
        for _ in 0..MAX_LEASE_CLEARS {
            assert_eq!(add.on_replies(&[(0, &ns)]), AddStep::Probe(servers(&[0])));
            assert!(matches!(
                add.on_replies(&[(0, &lease(1))]),
                AddStep::ClearAndAdd(_)
            ));
        }
        assert_eq!(add.on_replies(&[(0, &ns)]), AddStep::Done);
        assert!(matches!(add.answer(), Some(AddAnswer::Refused(_))));
    }

    #[test]
    fn a_refusal_on_another_replica_takes_back_every_copy_made() {
        let mut add = ReplicatedAdd::new(servers(&[0, 1, 2]), 2);
        add.start();
        let hd = ok(b"HD c5\r\n");
        assert_eq!(add.on_replies(&[(0, &hd)]), AddStep::Add(servers(&[1, 2])));
        let (stored, refused) = (ok(b"HD c8\r\n"), ok(b"NS c0 O1\r\n"));
        let step = add.on_replies(&[(1, &stored), (2, &refused)]);
        assert_eq!(step, AddStep::Probe(servers(&[2])));
        let step = add.on_replies(&[(2, &ok(b"HD c2 f0 s1\r\n"))]);
        assert_eq!(step, AddStep::TakeBack(smallvec::smallvec![(0, 5), (1, 8)]));
        assert_eq!(
            add.answer(),
            Some(&AddAnswer::Refused(ServerReply::from_static(
                b"NS c0 O1\r\n"
            )))
        );
    }

    #[test]
    fn a_failed_first_replica_hands_the_decision_to_the_next_while_a_quorum_can_store() {
        let down: CallResult = Err(BackendError {
            server: "a".into(),
            kind: BackendErrorKind::Timeout,
        });
        let mut add = ReplicatedAdd::new(servers(&[0, 1, 2]), 2);
        add.start();
        assert_eq!(add.on_replies(&[(0, &down)]), AddStep::Add(servers(&[1])));
        let hd = ok(b"HD c1\r\n");
        assert_eq!(add.on_replies(&[(1, &hd)]), AddStep::Add(servers(&[2])));
        assert_eq!(add.on_replies(&[(2, &hd)]), AddStep::Done);
        assert!(matches!(add.answer(), Some(AddAnswer::Stored(_))));

        // Two replicas of two, the first down: no quorum, nothing sent.
        let mut add = ReplicatedAdd::new(servers(&[0, 1]), 2);
        add.start();
        assert_eq!(add.on_replies(&[(0, &down)]), AddStep::Done);
        assert_eq!(add.answer(), Some(&AddAnswer::NoQuorum(vec!["a".into()])));

        // The others fail after the first stored: its copy goes back.
        let mut add = ReplicatedAdd::new(servers(&[0, 1]), 2);
        add.start();
        add.on_replies(&[(0, &hd)]);
        let step = add.on_replies(&[(1, &down)]);
        assert_eq!(step, AddStep::TakeBack(smallvec::smallvec![(0, 1)]));
        assert_eq!(add.answer(), Some(&AddAnswer::NoQuorum(vec!["a".into()])));
    }

    #[test]
    fn a_request_error_is_answered_as_the_server_said_it() {
        let mut add = ReplicatedAdd::new(servers(&[0, 1]), 2);
        add.start();
        let error = ok(b"CLIENT_ERROR bad data chunk\r\n");
        assert_eq!(add.on_replies(&[(0, &error)]), AddStep::Done);
        assert!(matches!(add.answer(), Some(AddAnswer::Rejected(_))));
    }
}
