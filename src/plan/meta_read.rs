//! An `mg` over several servers, asked one at a time in the order a
//! one-key retrieval asks them (`Placement::ReadThrough`: replicas, the
//! local zone's first, DEAD last, then a window's previous owners): a
//! server that fails, or with `on_miss` misses, hands the read to the next.
//! With `zone_fallback = "all_at_once"` (zones, outside a window) a local
//! replica that missed or failed hands it to every other replica at once
//! instead, and the first hit answers, as a get's keys are (`route::Retrieval`).
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
    /// `zone_fallback = "all_at_once"` applies (zones, outside a window).
    all_at_once: bool,
    /// Once the servers after the first are asked at once: how many of
    /// them have not answered yet (`None` while asked one at a time).
    fanned: Option<u8>,
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
    /// Ask every server of [`MetaRead::fanned_servers`] at once, each with
    /// what [`MetaRead::fetches`] says; feed each reply back with
    /// [`MetaRead::on_reply_from`], in any order.
    Fan,
    /// Wait for another reply of the servers asked at once.
    Wait,
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
        let all_at_once = first_local.is_some()
            && topology.config.replicas.max(1) > 1
            && topology.config.zone_fallback == crate::config::ZoneFallback::AllAtOnce;
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
            on_miss,
            copy_from: from.map_or(NEVER, |from| from as u8),
            fetch,
            added,
            key,
            handoff,
            first_local,
            all_at_once,
            ..MetaRead::idle()
        }
    }

    /// A read of no server, holding no bytes (see `steps::ReadSteps::idle`).
    pub(crate) fn idle() -> MetaRead {
        MetaRead {
            servers: Servers::new(),
            round: 0,
            on_miss: false,
            copy_from: NEVER,
            fetch: Outbound::new(),
            added: AddedFlags::FETCH,
            key: (Bytes::new(), false),
            handoff: false,
            first_local: None,
            all_at_once: false,
            fanned: None,
            plain: None,
            answered: false,
            copy: None,
            tally: ReadTally::default(),
        }
    }

    /// The server the request log names: the one asked last one at a time,
    /// the first when the others were asked at once.
    pub(crate) fn logged_server(&self) -> usize {
        let at = match self.fanned {
            Some(_) => 0,
            None => self.round as usize,
        };
        self.servers.get(at).copied().unwrap_or(0)
    }

    /// The server asked first, with the client's own request.
    pub(crate) fn first(&self) -> usize {
        self.servers[0]
    }

    /// What a server from `copy_from` on is sent.
    pub(crate) fn fetch_wire(&self) -> &Outbound {
        &self.fetch
    }

    /// Whether `server` is sent [`MetaRead::fetch_wire`] (else the
    /// client's own request).
    pub(crate) fn fetches(&self, server: usize) -> bool {
        self.position(server) >= self.copy_from
    }

    /// The servers asked at once after [`ReadStep::Fan`]: every one after
    /// the first.
    pub(crate) fn fanned_servers(&self) -> &[usize] {
        match self.fanned {
            Some(_) => &self.servers[1..],
            None => &[],
        }
    }

    /// The read has its answer.
    pub(crate) fn answered(&self) -> bool {
        self.answered
    }

    /// Where `server` is in the order asked.
    fn position(&self, server: usize) -> u8 {
        let at = self.servers.iter().position(|&s| s == server);
        at.map_or(NEVER, |at| at as u8)
    }

    /// The reply of the server being asked (one at a time).
    #[cfg(test)]
    fn on_reply(&mut self, result: CallResult, now: u64) -> ReadStep {
        let server = self.servers[self.round as usize];
        self.on_reply_from(server, result, now)
    }

    /// The reply of `server`: the one being asked, or, after
    /// [`ReadStep::Fan`], any of those asked at once. A reply that comes
    /// after the answer (a slower zone's) changes nothing.
    /// `now` is the Unix time, for a copy's remaining TTL beyond 30 days.
    pub(crate) fn on_reply_from(
        &mut self,
        server: usize,
        result: CallResult,
        now: u64,
    ) -> ReadStep {
        if self.answered {
            return ReadStep::Wait;
        }
        if self.fanned.is_some() {
            let at = self.position(server);
            if at == NEVER || at == 0 {
                return ReadStep::Wait;
            }
            // The server a hit is counted on and copied from.
            self.round = at;
        }
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
                self.keep_plain(result);
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
            self.keep_plain(result);
        }
        if let Some(left) = &mut self.fanned {
            *left = left.saturating_sub(1);
            if *left > 0 {
                return ReadStep::Wait;
            }
        } else if self.all_at_once && self.round == 0 && self.servers.len() > 2 {
            // Every other zone's replica at once (with one left, asking it
            // is the same either way).
            self.fanned = Some(self.servers.len() as u8 - 1);
            return ReadStep::Fan;
        }
        let next = self.round as usize + 1;
        if self.fanned.is_none() && next < self.servers.len() {
            self.round = next as u8;
            return ReadStep::Send {
                server: self.servers[next],
                fetch: self.round >= self.copy_from,
            };
        }
        let last = self.plain.take();
        self.answer(last.unwrap_or_else(|| Ok(crate::protocol::outcome::Reply::nothing())))
    }

    /// Keeps a reply without a value as the answer should nothing better
    /// come: one at a time the last one; asked at once, a miss before a
    /// failure (`SERVER_ERROR` only when no replica answered, as for a get).
    fn keep_plain(&mut self, result: CallResult) {
        let keeps_miss = self.fanned.is_some()
            && result.as_ref().map_or(true, |r| r.outcome.is_error())
            && matches!(&self.plain, Some(Ok(r)) if !r.outcome.is_error());
        if !keeps_miss {
            self.plain = Some(result);
        }
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
pub(crate) mod tests {
    use super::*;
    use crate::protocol::outcome::{Outcome, Reply};

    /// Whether `outcome` is an `mg` hit (`VA`, `HD`).
    fn is_hit(outcome: Outcome) -> bool {
        !outcome.meta_miss() && !outcome.is_error()
    }

    fn read(servers: &[usize], on_miss: bool, copy_from: Option<u8>) -> MetaRead {
        read_of(b"mg key v k\r\n", servers, on_miss, copy_from)
    }

    pub(crate) fn read_of(
        line: &'static [u8],
        servers: &[usize],
        on_miss: bool,
        copy_from: Option<u8>,
    ) -> MetaRead {
        let line = Bytes::from_static(line);
        let (request, _) = crate::protocol::meta::parse_meta(&line, &Default::default())
            .unwrap()
            .unwrap();
        let (fetch, added) = meta_fetch_wire(&request, &line);
        MetaRead {
            servers: servers.iter().copied().collect(),
            on_miss,
            copy_from: copy_from.unwrap_or(NEVER),
            fetch,
            added,
            key: (Bytes::from_static(b"key"), false),
            first_local: Some(true),
            ..MetaRead::idle()
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

    /// As `read`, with the other zones asked at once.
    pub(crate) fn fanned(line: &'static [u8], servers: &[usize]) -> MetaRead {
        let mut read = read_of(line, servers, true, Some(1));
        read.all_at_once = true;
        read
    }

    #[test]
    fn all_at_once_a_local_miss_asks_every_other_replica_and_the_first_hit_answers() {
        let mut read = fanned(b"mg key v k\r\n", &[4, 1, 2]);
        assert!(matches!(read.on_reply(reply(b"EN\r\n"), 0), ReadStep::Fan));
        assert_eq!(read.fanned_servers(), [1, 2]);
        assert!(read.fetches(1) && read.fetches(2) && !read.fetches(4));
        // The third zone answers first: its hit answers as asked, and is
        // the one copied and counted.
        match read.on_reply_from(2, reply(b"VA 1 kkey f5 t-1\r\nx\r\n"), 0) {
            ReadStep::Answer(Ok(answer)) => assert_eq!(&answer.bytes[..], b"VA 1 kkey\r\nx\r\n"),
            other => panic!("{other:?}"),
        }
        let copy = read.take_copy().expect("copied");
        assert_eq!((copy.owner, copy.source), (4, 2));
        let tally = read.tally();
        assert_eq!((tally.zone_hits, tally.written_back), ((0, 1), 1));
        assert_eq!(tally.served.map(|hit| hit.server), Some(2));
        // The slower zone's reply comes after the answer: dropped.
        let late = read.on_reply_from(1, reply(b"VA 1 kkey f5 t-1\r\nx\r\n"), 0);
        assert!(matches!(late, ReadStep::Wait));
        assert!(read.take_copy().is_none());
        assert_eq!(read.tally(), tally);
    }

    #[test]
    fn all_at_once_answers_a_miss_once_every_replica_missed_or_failed() {
        // A miss everywhere: the miss, once the last one came.
        let mut read = fanned(b"mg key v k\r\n", &[4, 1, 2]);
        assert!(matches!(read.on_reply(reply(b"EN\r\n"), 0), ReadStep::Fan));
        assert!(matches!(
            read.on_reply_from(1, reply(b"EN\r\n"), 0),
            ReadStep::Wait
        ));
        assert!(!read.answered());
        match read.on_reply_from(2, reply(b"EN\r\n"), 0) {
            ReadStep::Answer(Ok(answer)) => assert_eq!(&answer.bytes[..], b"EN\r\n"),
            other => panic!("{other:?}"),
        }
        // A failed local replica, a miss and a failure: a miss (some
        // replica answered), whatever the order.
        for order in [[1, 2], [2, 1]] {
            let mut read = fanned(b"mg key v k\r\n", &[4, 1, 2]);
            assert!(matches!(read.on_reply(failed(), 0), ReadStep::Fan));
            let mut last = ReadStep::Wait;
            for server in order {
                let result = if server == 1 {
                    reply(b"EN\r\n")
                } else {
                    failed()
                };
                last = read.on_reply_from(server, result, 0);
            }
            match last {
                ReadStep::Answer(Ok(answer)) => assert_eq!(&answer.bytes[..], b"EN\r\n"),
                other => panic!("{order:?}: {other:?}"),
            }
        }
        // Every replica failed: the failure.
        let mut read = fanned(b"mg key v k\r\n", &[4, 1, 2]);
        assert!(matches!(read.on_reply(failed(), 0), ReadStep::Fan));
        assert!(matches!(read.on_reply_from(2, failed(), 0), ReadStep::Wait));
        assert!(matches!(
            read.on_reply_from(1, failed(), 0),
            ReadStep::Answer(Err(_))
        ));
        assert_eq!(read.tally(), ReadTally::default());
    }

    #[test]
    fn all_at_once_answers_quiet_and_valueless_hits_as_memcached_would() {
        // Quiet: a miss everywhere is nothing, as memcached says nothing.
        let mut read = fanned(b"mg key v q\r\n", &[4, 1, 2]);
        assert_eq!(&read.fetch_wire()[1][..], b"mn\r\n");
        let nothing = || Ok(Reply::nothing());
        assert!(matches!(read.on_reply(nothing(), 0), ReadStep::Fan));
        assert!(matches!(
            read.on_reply_from(2, nothing(), 0),
            ReadStep::Wait
        ));
        match read.on_reply_from(1, nothing(), 0) {
            ReadStep::Answer(Ok(answer)) => assert!(answer.is_empty()),
            other => panic!("{other:?}"),
        }
        // A hit without the value asked for: `HD` with the client's flags.
        let mut read = fanned(b"mg key s\r\n", &[4, 1, 2]);
        assert_eq!(&read.fetch_wire()[0][..], b"mg key s v f t\r\n");
        assert!(matches!(read.on_reply(reply(b"EN\r\n"), 0), ReadStep::Fan));
        match read.on_reply_from(1, reply(b"VA 1 s1 f0 t-1\r\nx\r\n"), 0) {
            ReadStep::Answer(Ok(answer)) => assert_eq!(&answer.bytes[..], b"HD s1\r\n"),
            other => panic!("{other:?}"),
        }
        assert!(read.take_copy().is_some());
    }

    #[test]
    fn all_at_once_with_one_other_replica_asks_it_as_in_order() {
        let mut read = fanned(b"mg key v k\r\n", &[4, 1]);
        assert!(matches!(
            read.on_reply(reply(b"EN\r\n"), 0),
            ReadStep::Send {
                server: 1,
                fetch: true
            }
        ));
        assert!(read.fanned_servers().is_empty());
    }
}
