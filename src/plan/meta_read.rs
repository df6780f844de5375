//! An `mg` over several servers, asked one at a time in the order a
//! one-key retrieval asks them (`Placement::ReadThrough`: replicas, the
//! local zone's first, DEAD last, then a window's previous owners): a
//! server that fails, or with `on_miss` misses, hands the read to the next.
//!
//! From `copy_from` on, a server is asked what a copy needs too (`v f t`
//! added where missing, see `handoff::meta_read_through_line`), and a hit
//! there is answered as the client's own `mg` would have been and copied to
//! the key's first server through the hand-off's lease copy (`ReadCopy`),
//! as a get's is (`route::Retrieval`): in a hand-off window from a previous
//! ring's replica to the new owner, outside one from another zone's replica
//! to the local one (`zone_write_back`). Pure: the session sends what it
//! says and feeds the replies back.

use bytes::Bytes;

use crate::plan::handoff::{meta_read_through_hit, AddedFlags, ReadCopy};
use crate::plan::placement::Servers;
use crate::plan::route::{meta_fetch_wire, zone_writes_back, CallResult};
use crate::pools::topology::{Topology, ZoneHit};
use crate::protocol::encode::Outbound;
use crate::protocol::meta::MetaRequest;

/// [`MetaRead::copy_from`] of a read that copies nothing.
const NEVER: u8 = u8::MAX;

/// One `mg` read over its servers (see the module doc).
#[derive(Debug)]
pub(crate) struct MetaRead {
    servers: Servers,
    /// The server being asked.
    round: u8,
    on_miss: bool,
    /// From this server on, hits are fetched and copied to the first.
    copy_from: u8,
    /// What those servers are sent, and the flags it adds to the client's.
    fetch: Outbound,
    added: AddedFlags,
    /// The key as a meta token, and whether it is base64 (for the copy).
    key: (Bytes, bool),
    /// The copies are a window's read-through (counted as such), not a
    /// zone's write-back.
    handoff: bool,
    /// With local-first reads (zones, outside a window): whether the first
    /// server is in this sidecar's zone.
    first_local: Option<bool>,
    /// The last reply that may go to the client as it came.
    plain: Option<CallResult>,
    answered: bool,
    copy: Option<ReadCopy>,
    tally: ReadTally,
}

/// What a read counts once answered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadTally {
    /// Reads of a window's previous owners, and hits there.
    pub read_through: (usize, usize),
    /// With zones: a hit on the local replica, and on another zone's.
    pub zone_hits: (usize, usize),
    /// Hits found in another zone after the local replica missed or
    /// failed, copied back to it.
    pub written_back: usize,
    /// With zones: the replica whose hit answered, for the per-zone
    /// counters (as a get's hits are counted).
    pub served: Option<ZoneHit>,
}

/// What the session does next for a [`MetaRead`].
#[derive(Debug)]
pub(crate) enum ReadStep {
    /// Ask `server`: with the client's own request, or (`fetch`) with
    /// [`MetaRead::fetch_wire`].
    Send { server: usize, fetch: bool },
    /// The client's answer.
    Answer(CallResult),
}

impl MetaRead {
    /// The read of `request` (bytes `bytes`) over `servers`, the first
    /// `current` of which are the key's replicas in `topology`'s ring (the
    /// rest its previous ring's); `on_miss` as the placement says. Only a
    /// read that neither takes a lease nor changes the item is copied (the
    /// same `mg`s a moved key's hand-off reads through: see
    /// `route::meta_move`).
    pub(crate) fn plan(
        request: &MetaRequest,
        bytes: &Bytes,
        servers: Servers,
        current: usize,
        on_miss: bool,
        topology: &Topology,
    ) -> MetaRead {
        let handoff = topology.previous.is_some();
        let first_local = (!handoff && topology.reads_local_first())
            .then(|| servers.first().is_some_and(|&s| topology.is_local(s)));
        let from = if handoff {
            Some(current).filter(|_| topology.config.shared_with.copies())
        } else if first_local == Some(true) && zone_writes_back(topology) {
            Some(1)
        } else {
            None
        };
        let plain = !request.takes_lease() && !request.changes_item(bytes);
        let from = from.filter(|&from| plain && from >= 1 && from < servers.len());
        let (fetch, added) = match from {
            Some(_) => meta_fetch_wire(request, bytes),
            None => (Outbound::new(), AddedFlags::FETCH),
        };
        let key = match from {
            Some(_) => (bytes.slice_ref(request.key_token(bytes)), request.base64),
            None => (Bytes::new(), false),
        };
        MetaRead {
            servers,
            round: 0,
            on_miss,
            copy_from: from.map_or(NEVER, |from| from as u8),
            fetch,
            added,
            key,
            handoff,
            first_local,
            plain: None,
            answered: false,
            copy: None,
            tally: ReadTally::default(),
        }
    }

    /// The server asked first, with the client's own request.
    pub(crate) fn first(&self) -> usize {
        self.servers[0]
    }

    /// What a server from `copy_from` on is sent.
    pub(crate) fn fetch_wire(&self) -> &Outbound {
        &self.fetch
    }

    /// The read has its answer.
    pub(crate) fn answered(&self) -> bool {
        self.answered
    }

    /// The reply of the server being asked. `now` is the Unix time, for a
    /// copy's remaining TTL beyond 30 days.
    pub(crate) fn on_reply(&mut self, result: CallResult, now: u64) -> ReadStep {
        let server = self.servers[self.round as usize];
        if self.round >= self.copy_from {
            if self.handoff {
                self.tally.read_through.0 += 1;
            }
            let hit = result.as_ref().ok().and_then(|reply| {
                meta_read_through_hit(reply, self.added, &self.key.0, self.key.1, now)
            });
            if let Some((answer, copy)) = hit {
                if self.handoff {
                    self.tally.read_through.1 += 1;
                } else {
                    self.tally.written_back += 1;
                }
                self.count_hit(!self.handoff);
                self.copy = copy.map(|wire| ReadCopy {
                    owner: self.servers[0],
                    wire,
                    source: server,
                    key: self.key.0.clone(),
                    base64: self.key.1,
                    touch: None,
                });
                return self.answer(Ok(answer));
            }
            // A miss or a failure goes to the client as it came, as the
            // client's own request would have had it; a hit memring could
            // not read (added flags in it) never does.
            if result.as_ref().map_or(true, |reply| {
                reply.outcome.meta_miss() || reply.outcome.is_error()
            }) {
                self.plain = Some(result);
            }
        } else {
            let falls = match &result {
                Ok(reply) => {
                    reply.outcome.is_error() || (self.on_miss && reply.outcome.meta_miss())
                }
                Err(_) => true,
            };
            if !falls {
                if matches!(&result, Ok(reply) if !reply.outcome.meta_miss()) {
                    self.count_hit(false);
                }
                return self.answer(result);
            }
            self.plain = Some(result);
        }
        let next = self.round as usize + 1;
        if next < self.servers.len() {
            self.round = next as u8;
            return ReadStep::Send {
                server: self.servers[next],
                fetch: self.round >= self.copy_from,
            };
        }
        let last = self.plain.take();
        self.answer(last.unwrap_or_else(|| Ok(crate::protocol::outcome::Reply::nothing())))
    }

    fn answer(&mut self, result: CallResult) -> ReadStep {
        self.answered = true;
        self.plain = None;
        ReadStep::Answer(result)
    }

    /// Counts a hit on the server asked now (`written_back`: copied to the
    /// local replica).
    fn count_hit(&mut self, written_back: bool) {
        if let Some(local) = self.first_local {
            let local = local && self.round == 0;
            if local {
                self.tally.zone_hits.0 += 1;
            } else {
                self.tally.zone_hits.1 += 1;
            }
            self.tally.served = Some(ZoneHit {
                server: self.servers[self.round as usize] as u32,
                local,
                written_back,
            });
        }
    }

    /// The copy of a hit to the key's first server, once answered.
    pub(crate) fn take_copy(&mut self) -> Option<ReadCopy> {
        self.copy.take()
    }

    /// What the read counts.
    pub(crate) fn tally(&self) -> ReadTally {
        self.tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::outcome::{Outcome, Reply};

    /// Whether `outcome` is an `mg` hit (`VA`, `HD`).
    fn is_hit(outcome: Outcome) -> bool {
        !outcome.meta_miss() && !outcome.is_error()
    }

    fn read(servers: &[usize], on_miss: bool, copy_from: Option<u8>) -> MetaRead {
        let line = Bytes::from_static(b"mg key v k\r\n");
        let (request, _) = crate::protocol::meta::parse_meta(&line, &Default::default())
            .unwrap()
            .unwrap();
        let (fetch, added) = meta_fetch_wire(&request, &line);
        MetaRead {
            servers: servers.iter().copied().collect(),
            round: 0,
            on_miss,
            copy_from: copy_from.unwrap_or(NEVER),
            fetch,
            added,
            key: (Bytes::from_static(b"key"), false),
            handoff: false,
            first_local: Some(true),
            plain: None,
            answered: false,
            copy: None,
            tally: ReadTally::default(),
        }
    }

    fn reply(bytes: &'static [u8]) -> CallResult {
        Ok(Reply::from_static(bytes))
    }

    fn failed() -> CallResult {
        Err(crate::error::BackendError {
            server: "s".into(),
            kind: crate::error::BackendErrorKind::Timeout,
        })
    }

    /// A key whose replicas changed from 4 to 5 servers with `replicas =
    /// 2` (`settings` on top): its read servers and how many are replicas
    /// now, and the topology.
    fn moved_read(settings: &str) -> (tokio::runtime::Runtime, Topology, String, Servers, usize) {
        use crate::plan::placement::{place, HealthView, KeyOp, Placement};
        let (runtime, _, five) = crate::pools::topology::tests::four_then_five_with(&format!(
            "replicas = 2\n{settings}\n"
        ));
        let (key, servers, current) = (0..2000)
            .find_map(|i| {
                let key = format!("k{i}");
                // Beside other writers, no previous replica is read.
                let any = !five.config.shared_with.reads_through();
                match place(
                    key.as_bytes(),
                    KeyOp::READ,
                    Some(()),
                    &five,
                    &HealthView::NONE,
                ) {
                    Placement::ReadThrough {
                        servers, current, ..
                    } if any || servers.len() > current => Some((key, servers, current)),
                    _ => None,
                }
            })
            .expect("a key whose replicas changed");
        (runtime, five, key, servers, current)
    }

    fn planned(line: &str, settings: &str) -> MetaRead {
        let (_runtime, topology, key, servers, current) = moved_read(settings);
        let bytes = Bytes::from(line.replace("KEY", &key));
        let (request, _) = crate::protocol::meta::parse_meta(&bytes, &Default::default())
            .unwrap()
            .unwrap();
        MetaRead::plan(&request, &bytes, servers, current, true, &topology)
    }

    #[test]
    fn in_a_window_a_plain_mg_copies_from_the_previous_rings_replicas_only() {
        let read = planned("mg KEY v k\r\n", "");
        assert!(read.copy_from >= 1 && (read.copy_from as usize) < read.servers.len());
        assert!(read.handoff && read.first_local.is_none());
        assert!(read.fetch[0].ends_with(b" f t\r\n"));
        // A recache lease, a touch: the servers' own, never copied.
        assert_eq!(planned("mg KEY v N30\r\n", "").copy_from, NEVER);
        assert_eq!(planned("mg KEY v T30\r\n", "").copy_from, NEVER);
        // Others write these servers too: nothing of theirs is copied.
        let shared = planned("mg KEY v\r\n", "shared_with = \"writers\"");
        assert_eq!(shared.copy_from, NEVER);
    }

    #[test]
    fn a_hit_on_the_first_server_answers_as_it_came() {
        let mut read = read(&[4, 1], true, Some(1));
        match read.on_reply(reply(b"VA 1 kkey\r\nx\r\n"), 0) {
            ReadStep::Answer(Ok(answer)) => assert_eq!(&answer.bytes[..], b"VA 1 kkey\r\nx\r\n"),
            other => panic!("{other:?}"),
        }
        assert!(read.answered() && read.take_copy().is_none());
        assert_eq!(read.tally().zone_hits, (1, 0));
    }

    #[test]
    fn a_miss_falls_through_only_when_asked_and_a_failure_always() {
        let mut read_on_miss = read(&[4, 1], false, None);
        assert!(matches!(
            read_on_miss.on_reply(reply(b"EN\r\n"), 0),
            ReadStep::Answer(Ok(r)) if r.outcome == Outcome::En
        ));
        let mut read_failing = read(&[4, 1], false, None);
        assert!(matches!(
            read_failing.on_reply(failed(), 0),
            ReadStep::Send {
                server: 1,
                fetch: false
            }
        ));
        // The last server's failure is the answer.
        assert!(matches!(
            read_failing.on_reply(failed(), 0),
            ReadStep::Answer(Err(_))
        ));
    }

    #[test]
    fn a_hit_past_copy_from_is_answered_as_asked_and_copied_to_the_first() {
        let mut read = read(&[4, 1, 2], true, Some(1));
        match read.on_reply(reply(b"EN\r\n"), 0) {
            ReadStep::Send {
                server: 1,
                fetch: true,
            } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(&read.fetch_wire()[0][..], b"mg key v k f t\r\n");
        // The fetch's reply carries the added `f` and `t`.
        match read.on_reply(reply(b"VA 1 kkey f5 t-1\r\nx\r\n"), 0) {
            ReadStep::Answer(Ok(answer)) => {
                assert_eq!(&answer.bytes[..], b"VA 1 kkey\r\nx\r\n");
                assert!(is_hit(answer.outcome));
            }
            other => panic!("{other:?}"),
        }
        let copy = read.take_copy().expect("copied");
        assert_eq!((copy.owner, copy.source), (4, 1));
        assert_eq!(&copy.wire[0][..], b"ms key 1 F5 ME c\r\n");
        assert_eq!(read.tally().zone_hits, (0, 1));
        assert_eq!(read.tally().written_back, 1);
    }

    #[test]
    fn misses_everywhere_answer_the_miss_as_the_client_asked() {
        let mut read = read(&[4, 1], true, Some(1));
        assert!(matches!(
            read.on_reply(reply(b"EN\r\n"), 0),
            ReadStep::Send {
                server: 1,
                fetch: true
            }
        ));
        match read.on_reply(reply(b"EN\r\n"), 0) {
            ReadStep::Answer(Ok(answer)) => assert_eq!(&answer.bytes[..], b"EN\r\n"),
            other => panic!("{other:?}"),
        }
        assert!(read.take_copy().is_none());
        assert_eq!(read.tally(), ReadTally::default());
    }
}
