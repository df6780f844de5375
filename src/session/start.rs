//! Turning a parsed request into the work its entry holds: the plan from
//! `route`, and what the hot-key state says about it.

use super::shadow::Shadowed;
use super::*;
use crate::hotkeys::{ClassicKeys, MetaKey};
use crate::plan::handoff::cas::CasTakeover;
use crate::plan::lease_retry::LeaseRetry;
use crate::plan::meta_read::MetaRead;
use crate::plan::placement::HealthView;
use crate::plan::replicated_add::ReplicatedAdd;
use crate::plan::replicated_cas::ReplicatedCas;
use crate::plan::route::Split;
use crate::plan::steps::{AddSteps, CasSteps, LeaseSteps, Machine, MovedSteps, ReadSteps};
use crate::pools::planned::Planned;
use crate::protocol::meta::{decode_key, DecodedKey};

impl ClientSession {
    /// Plans one request on the current topology and queues its entry.
    pub(super) fn start(&mut self, request: Request, bytes: Bytes) {
        self.start_split(request, bytes, Split::Whole);
    }

    /// [`ClientSession::start`] for a request that is `split`'s part of the
    /// client's reply: a part of a long get line (see `long_get`) ends the
    /// reply only when it is the last.
    pub(super) fn start_split(&mut self, request: Request, bytes: Bytes, split: Split) {
        self.worker
            .stats
            .request(request.command, request.keys.len());
        if request.keys.len() > 1 && request.command.is_retrieval() {
            // A guard while deciding (no count other cores share), the
            // layout itself only when the keys do split.
            let layout = self.worker.layout.load();
            if let Ok(bound) = layout.bound_index(self.bound.as_ref()) {
                if layout.may_split(bound) {
                    let runs = layout.runs(bound, request.keys.len(), |i| request.key(&bytes, i));
                    if runs.len() > 1 {
                        let layout = arc_swap::Guard::into_inner(layout);
                        self.start_across_pools(&request, &bytes, &layout, runs, split);
                        return;
                    }
                }
            }
        }
        if request.command == Command::FlushAll {
            // Shadows are not flushed: each now lacks this write.
            let layout = self.worker.layout.load();
            if let Ok(bound) = layout.bound_index(self.bound.as_ref()) {
                for pool in layout.reachable(bound) {
                    if let Some(link) = layout.shadow_of(pool) {
                        link.counters.lost_write();
                    }
                }
            }
        }
        if request.command == Command::FlushAll && self.flush_across_pools(&request, &bytes) {
            return;
        }
        self.start_keyed(request, bytes, split);
    }

    /// Plans one meta request and queues its entry: the classic road from
    /// [`ClientSession::start_keyed`] on (a meta request has one key at
    /// most, and no command of all pools).
    pub(super) fn start_meta(&mut self, request: MetaRequest, bytes: Bytes) {
        self.worker
            .stats
            .request(request.command(), request.key_count());
        self.start_keyed(request, bytes, Split::Whole);
    }

    /// Plans `request` (of either dialect) on the topology its routing key
    /// gets, its TTLs capped there when that is a gutter, and queues its
    /// entry.
    fn start_keyed<R: Dialect>(&mut self, request: R, bytes: Bytes, split: Split) {
        // A `b` key decoded once, for the routes and the plan alike (a
        // gutter's TTL cap rewrites no key).
        let decoded = request.decoded(&bytes);
        // One topology per request: it finishes on this ring even if a
        // reload lands meanwhile. `load_full` gives an owned Arc, so no
        // arc-swap guard is held. The key is read only when routes or a
        // gutter ask for it.
        let key = request
            .keyed()
            .then_some(|| request.route_key(&bytes, &decoded));
        let (topology, gutter_ttl) = self.topology_for(key);
        let (request, bytes) = match gutter_ttl {
            Some(ttl) => request.capped(self, bytes, ttl),
            None => (request, bytes),
        };
        self.start_on(request, bytes, &decoded, topology, split);
    }

    /// `flush_all` for a client whose keys can be read from several pools
    /// (its routes' pools, gutters: `Layout::reachable`): one entry per
    /// pool, the last answering for all (see `work::Joined`). False when
    /// one pool is all it reaches.
    fn flush_across_pools(&mut self, request: &Request, bytes: &Bytes) -> bool {
        let layout = self.worker.layout.load();
        let Ok(bound) = layout.bound_index(self.bound.as_ref()) else {
            return false;
        };
        let pools = layout.reachable(bound);
        if pools.len() < 2 {
            return false;
        }
        let topologies: SmallVec<[Planned; 4]> = pools
            .iter()
            .map(|&pool| {
                let topology = layout.pools()[pool].topology.load_full();
                Planned::checked(topology, |old| layout.now_of(old))
            })
            .collect();
        drop(layout);
        let failed = Rc::new(std::cell::RefCell::new(Vec::new()));
        let refused = Rc::new(std::cell::RefCell::new(None));
        let count = topologies.len();
        for (n, topology) in topologies.into_iter().enumerate() {
            let queued = self.entries.len();
            self.start_on(request.clone(), bytes.clone(), &(), topology, Split::Whole);
            if self.entries.len() == queued {
                continue;
            }
            if let Some(Entry {
                work:
                    Work::Lines {
                        finish: Finish::AllOk(joined),
                        ..
                    },
                ..
            }) = self.entries.get_mut(queued)
            {
                *joined = Some(Box::new(work::Joined {
                    failed: failed.clone(),
                    refused: refused.clone(),
                    last: n + 1 == count,
                }));
            }
        }
        true
    }

    /// `request` with its exptime capped at `ttl` seconds, for a gutter
    /// pool.
    fn capped(&self, request: Request, bytes: Bytes, ttl: u64) -> (Request, Bytes) {
        let rewritten = crate::pools::failover::cap_classic(
            request.command,
            &bytes,
            request.line_len as usize,
            ttl,
            self.worker.clock.unix_seconds(),
        );
        reparsed((request, bytes), rewritten, |b| {
            parse_request(b, &self.limits)
        })
    }

    /// The meta request with its TTLs capped at `ttl` seconds, for a gutter
    /// pool.
    fn meta_capped(&self, request: MetaRequest, bytes: Bytes, ttl: u64) -> (MetaRequest, Bytes) {
        let rewritten = crate::pools::failover::cap_meta(
            Command::of_meta(request.command),
            &bytes,
            request.line_len as usize,
            ttl,
            self.worker.clock.unix_seconds(),
        );
        reparsed((request, bytes), rewritten, |b| parse_meta(b, &self.limits))
    }

    /// A multi-key retrieval whose keys go to more than one pool (by routes,
    /// or to a gutter): one retrieval per run of keys of the same pool, in
    /// key order, so that their values, written one run after the other,
    /// come in the client's key order; only the last run ends the reply.
    fn start_across_pools(
        &mut self,
        request: &Request,
        bytes: &Bytes,
        layout: &crate::pools::layout::Layout,
        runs: crate::pools::layout::Runs,
        split: Split,
    ) {
        // The command and its arguments before the keys (`gat 60 `).
        let head = &bytes[..request.keys[0].start as usize];
        let count = runs.len();
        for (n, (serving, range)) in runs.into_iter().enumerate() {
            let mut line = BytesMut::with_capacity(request.line_len as usize);
            line.extend_from_slice(head);
            let mut keys = crate::protocol::request::Keys::new();
            for i in range {
                if line.len() > head.len() {
                    line.extend_from_slice(b" ");
                }
                let start = line.len();
                line.extend_from_slice(request.key(bytes, i));
                keys.push(crate::protocol::request::Span {
                    start: start as u32,
                    end: line.len() as u32,
                });
            }
            let args_end = line.len() as u32;
            line.extend_from_slice(b"\r\n");
            let sub = Request {
                command: request.command,
                keys,
                noreply: false,
                // The exptime of `gat` comes before the keys: same place.
                arg: request.arg,
                args_end,
                line_len: line.len() as u32,
            };
            let (sub, line) = match serving.gutter_ttl {
                // `gat` to a gutter: its new exptime is capped too.
                Some(ttl) => self.capped(sub, line.freeze(), ttl),
                None => (sub, line.freeze()),
            };
            let topology = layout.pools()[serving.pool].topology.load_full();
            let topology = Planned::checked(topology, |old| layout.now_of(old));
            // Only the last run of a reply's last part ends the reply.
            let run_split = if n + 1 == count && split != Split::Part {
                Split::Last
            } else {
                Split::Part
            };
            self.start_on(sub, line, &(), topology, run_split);
        }
    }

    /// Plans `request` (of either dialect; its key `decoded` as
    /// [`Dialect::decoded`] says) on `topology` and queues its entry;
    /// `split` says whether it is one run of a retrieval across pools. The
    /// one road of every request placed on servers: figures, health, plan,
    /// shadow, hot keys, work.
    fn start_on<R: Dialect>(
        &mut self,
        request: R,
        bytes: Bytes,
        decoded: &R::Decoded,
        topology: Planned,
        split: Split,
    ) {
        topology.figures.request(request.command());
        // The key the ring places (a meta `b` key as decoded already) for
        // the plan, the shadow and the hot-key count.
        let keys = request.keys(&bytes, decoded);
        let health = self
            .health
            .of(&topology, self.worker.clock.turn(), &self.worker);
        let mut plan = request.plan(&keys, &topology, health);
        plan.split(split);
        let shadow = self.shadow(&keys, &mut plan);
        let hot = self.worker.hot.on_request(&keys, &plan, &topology);
        drop(keys);
        request.queue(self, bytes, topology, plan, (hot, shadow));
    }

    /// The work of a classic request's `plan`; `None` when there is nothing
    /// to queue.
    fn classic_work(
        &mut self,
        request: &Request,
        bytes: &Bytes,
        topology: &Planned,
        plan: Plan,
    ) -> Option<Work> {
        let work = match plan {
            own @ (Plan::Quit
            | Plan::Reply(_)
            | Plan::Stats
            | Plan::StatsReset
            | Plan::HotKeys
            | Plan::ShadowStats) => self.own_work(own, request.noreply)?,
            Plan::Key(Placement::NoServers) if request.noreply => return None,
            Plan::Key(Placement::NoServers) => Work::Ready(Bytes::from_static(route::NO_SERVERS)),
            // A classic request is never placed as a read (`KeyOp::classic`
            // is a write or a cas); were one, its first server would answer.
            Plan::Key(Placement::ReadThrough { servers, .. }) => Work::Lines {
                parts: servers.into_iter().take(1).map(Part::new).collect(),
                finish: Finish::Forward,
                meta: None,
            },
            Plan::Lease { server, retry, .. } => leased_work(*retry, server, request, bytes),
            // One that may meet a lease the planner made a `Plan::Lease`.
            Plan::Key(Placement::Owner { server, .. }) => Work::Lines {
                parts: smallvec::smallvec![Part::new(server)],
                finish: Finish::Forward,
                meta: None,
            },
            Plan::Key(Placement::Quorum {
                servers,
                quorum,
                forget: 0,
                older: None,
                ..
            }) if request.command == Command::Add && servers.len() > 1 => {
                let first = servers[0];
                let machine = ReplicatedAdd::new(servers, quorum);
                let wire = crate::protocol::encode::add_with_cas(request, bytes);
                let key = bytes.slice_ref(request.key(bytes, 0));
                let lines = 2 * topology.config.replicas;
                let add = AddSteps::new(machine, first, wire, (key.clone(), false), None);
                StepsWork::work(Machine::Add(add), None, (key, None), lines, None)
            }
            Plan::Key(Placement::Quorum {
                servers,
                quorum,
                forget,
                warm,
                older,
                forget_last,
            }) => {
                let (parts, finish) =
                    quorum_lines(&servers, (quorum, forget, warm), older, forget_last);
                Work::Lines {
                    parts,
                    finish,
                    meta: None,
                }
            }
            Plan::Broadcast { servers } => Work::Lines {
                parts: servers.into_iter().map(Part::new).collect(),
                finish: Finish::AllOk(None),
                meta: None,
            },
            Plan::Key(Placement::CasThenCopy {
                owner,
                copies,
                previous,
                older,
            }) => {
                // A moved key's cas the owner refuses is taken over as
                // without replicas.
                let previous =
                    previous.map(|previous| (previous, CasTakeover::classic(request, bytes)));
                let machine = ReplicatedCas::new(false, owner, copies, previous);
                let storage = Expect::Line(LineKind::Storage);
                let sent = (forwardable(bytes, request), storage.clone());
                let copy = (crate::protocol::encode::cas_as_set(request, bytes), storage);
                let key = (bytes.slice_ref(request.key(bytes, 0)), None);
                let machine = Machine::Cas(CasSteps::new(machine, owner, sent, copy));
                StepsWork::work(machine, OlderForget::new(older), key, 1, None)
            }
            // A one-key `gat` that may meet a lease is a `Plan::Lease`.
            Plan::Retrieve(retrieval) => Work::Retrieve {
                in_flight: spares::in_flight(retrieval.most_in_flight()),
                plan: retrieval,
                owed: Reservation::default(),
            },
            Plan::Key(Placement::Moved {
                owner,
                previous,
                steps: mut machine,
                older,
                copies_back,
                ..
            }) => {
                if copies_back {
                    machine.delete_previous_last_too();
                }
                let key = (bytes.slice_ref(request.key(bytes, 0)), None);
                let machine = MovedSteps::new(machine, owner, previous, false);
                StepsWork::work(
                    Machine::Moved(machine),
                    OlderForget::new(older),
                    key,
                    1,
                    None,
                )
            }
        };
        Some(work)
    }

    /// Queues the entry of a request planned on `topology` (either
    /// dialect: a meta request's `request` is [`keyless`], its bytes say
    /// the rest), with its hot-key guard and shadow pairs.
    fn queue(
        &mut self,
        request: Request,
        bytes: Bytes,
        topology: Planned,
        work: Work,
        (hot, shadow): Guards,
    ) {
        self.push(Entry {
            command: request.command,
            noreply: request.noreply,
            request,
            bytes,
            topology,
            work,
            sent: false,
            reserved: Reservation::default(),
            started: self.worker.clock.nanos(),
            hot,
            shadow,
            instead: None,
            said: crate::protocol::outcome::Outcome::Nothing,
        });
    }

    /// The work of a plan memring answers itself (in either dialect);
    /// `None` when there is nothing to queue (`quit`, a reply the client
    /// asked not to get).
    fn own_work(&mut self, plan: Plan, noreply: bool) -> Option<Work> {
        Some(match plan {
            Plan::Quit => {
                self.closing = true;
                return None;
            }
            Plan::Reply(_) if noreply => return None,
            Plan::Reply(reply) => Work::Ready(reply),
            Plan::Stats => Work::Stats,
            Plan::StatsReset => Work::StatsReset,
            Plan::HotKeys => Work::Ready(self.worker.hot.report()),
            Plan::ShadowStats => Work::Ready(self.shadow_report()),
            // Plans for servers are the callers' own; were one passed here,
            // it is answered as finding no server rather than dropped.
            Plan::Key(_) | Plan::Broadcast { .. } | Plan::Retrieve(_) | Plan::Lease { .. } => {
                Work::Ready(Bytes::from_static(route::NO_SERVERS))
            }
        })
    }

    /// The entry of a meta request's `plan`, queued (memring's own answers
    /// without the guards: such a plan has none).
    fn queue_meta(
        &mut self,
        request: MetaRequest,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    ) {
        let command = Command::of_meta(request.command);
        let work = match plan {
            Plan::Key(Placement::NoServers) => {
                let mut entry = Entry::ready(route::NO_SERVERS, topology);
                entry.command = command;
                self.push(entry);
                return;
            }
            Plan::Key(placement) => meta_work(&request, &bytes, placement, &topology),
            Plan::Lease { server, retry, .. } => meta_lease_work(&request, &bytes, server, *retry),
            // A plain `mg`: a one-key retrieval, as a `get` is (the planner
            // placed one that may meet a lease as a `Plan::Lease`).
            Plan::Retrieve(retrieval) => Work::Retrieve {
                in_flight: spares::in_flight(retrieval.most_in_flight()),
                plan: retrieval,
                owed: Reservation::default(),
            },
            // `mn`: memring's own answer, as for classic commands.
            own => {
                if let Some(work) = self.own_work(own, false) {
                    let mut entry = Entry::ready(b"", topology);
                    entry.command = command;
                    entry.work = work;
                    self.push(entry);
                }
                return;
            }
        };
        self.queue(keyless(command), bytes, topology, work, guards);
    }
}

/// What keeps a planned request's entry in step with the hot keys and the
/// shadow pool.
type Guards = (Option<Rc<WriteGuard>>, Option<Box<shadow::Pairs>>);

/// A parsed request of either dialect, as the one road
/// ([`ClientSession::start_keyed`], [`ClientSession::start_on`]) takes it:
/// each stop asks it only what its dialect says. Generic, not a trait
/// object: each dialect's road is compiled on its own, so a get's stops
/// cost what they did.
trait Dialect: Sized {
    /// Its key decoded, worked out once for the routes and the plan: a
    /// meta request's `b` key; nothing for other keys, which are read in
    /// the request's bytes.
    type Decoded;
    /// Its keys as the plan, the shadow and the hot-key count read them
    /// (the ring's key: a meta `b` key as decoded).
    type Keys<'b>: Shadowed
    where
        Self: 'b;

    /// The command the figures count.
    fn command(&self) -> Command;
    /// How many keys the stats count.
    fn key_count(&self) -> usize;
    /// Whether it has a key for the routes to read.
    fn keyed(&self) -> bool;
    /// Its key decoded, when the ring hashes other bytes than it carries
    /// (a meta `b` key).
    fn decoded(&self, bytes: &Bytes) -> Self::Decoded;
    /// Its (first) key, as the routes read it; only asked when
    /// [`Dialect::keyed`].
    fn route_key<'b>(&'b self, bytes: &'b Bytes, decoded: &'b Self::Decoded) -> &'b [u8];
    /// Its keys for the plan, the shadow and the hot-key count.
    fn keys<'b>(&'b self, bytes: &'b Bytes, decoded: &'b Self::Decoded) -> Self::Keys<'b>;
    /// The request with its TTLs capped at `ttl` seconds, for a gutter.
    fn capped(self, session: &ClientSession, bytes: Bytes, ttl: u64) -> (Self, Bytes);
    /// Its plan (see `route::plan`, `route::plan_meta`).
    fn plan(&self, keys: &Self::Keys<'_>, topology: &Topology, health: &HealthView) -> Plan;
    /// Queues the entry of its `plan` on `topology` (or nothing, as the
    /// plan says).
    fn queue(
        self,
        session: &mut ClientSession,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    );
}

impl Dialect for Request {
    type Decoded = ();
    type Keys<'b> = ClassicKeys<'b>;

    fn command(&self) -> Command {
        self.command
    }

    fn key_count(&self) -> usize {
        self.keys.len()
    }

    fn keyed(&self) -> bool {
        !self.keys.is_empty()
    }

    fn decoded(&self, _: &Bytes) {}

    fn route_key<'b>(&'b self, bytes: &'b Bytes, _: &()) -> &'b [u8] {
        self.key(bytes, 0)
    }

    fn keys<'b>(&'b self, bytes: &'b Bytes, _: &()) -> ClassicKeys<'b> {
        ClassicKeys {
            request: self,
            bytes,
        }
    }

    fn capped(self, session: &ClientSession, bytes: Bytes, ttl: u64) -> (Request, Bytes) {
        session.capped(self, bytes, ttl)
    }

    fn plan(&self, keys: &ClassicKeys<'_>, topology: &Topology, health: &HealthView) -> Plan {
        spares::plan(self, keys.bytes, topology, health)
    }

    fn queue(
        self,
        session: &mut ClientSession,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    ) {
        if let Some(work) = session.classic_work(&self, &bytes, &topology, plan) {
            session.queue(self, bytes, topology, work, guards);
        }
    }
}

impl Dialect for MetaRequest {
    type Decoded = Option<DecodedKey>;
    type Keys<'b> = MetaKey<'b>;

    fn command(&self) -> Command {
        Command::of_meta(self.command)
    }

    fn key_count(&self) -> usize {
        usize::from(self.key.is_some())
    }

    fn keyed(&self) -> bool {
        self.key.is_some()
    }

    /// As [`MetaRequest::routing_key`] decodes it (a key that does not
    /// decode is empty).
    fn decoded(&self, bytes: &Bytes) -> Option<DecodedKey> {
        self.base64
            .then(|| decode_key(self.key_token(bytes)).unwrap_or_default())
    }

    fn route_key<'b>(&'b self, bytes: &'b Bytes, decoded: &'b Option<DecodedKey>) -> &'b [u8] {
        match decoded {
            Some(key) => key,
            None => self.key_token(bytes),
        }
    }

    fn keys<'b>(&'b self, bytes: &'b Bytes, decoded: &'b Option<DecodedKey>) -> MetaKey<'b> {
        MetaKey {
            request: self,
            bytes,
            key: self.route_key(bytes, decoded),
        }
    }

    fn capped(self, session: &ClientSession, bytes: Bytes, ttl: u64) -> (MetaRequest, Bytes) {
        session.meta_capped(self, bytes, ttl)
    }

    fn plan(&self, key: &MetaKey<'_>, topology: &Topology, health: &HealthView) -> Plan {
        spares::plan_meta(self, key.bytes, key.key, topology, health)
    }

    fn queue(
        self,
        session: &mut ClientSession,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    ) {
        session.queue_meta(self, bytes, topology, plan, guards);
    }
}

/// The classic request an entry of a meta request holds: no keys and no
/// arguments (the meta request stays in the entry's bytes; a key list is
/// read only for classic work).
fn keyless(command: Command) -> Request {
    Request {
        command,
        keys: SmallVec::new(),
        noreply: false,
        arg: None,
        args_end: 0,
        line_len: 0,
    }
}

/// The work a meta request placed on servers becomes (a plain `mg` is
/// planned as a retrieval instead, one that may meet a lease as a
/// `Plan::Lease`): a replicated add, a moved key's hand-off steps (as for
/// classic, see [`StepsWork`]), an `mg` read over several servers (steps
/// too), or the request forwarded as its placement says (see [`Finish`]).
fn meta_work(
    request: &MetaRequest,
    bytes: &Bytes,
    placement: Placement<Box<Moved>>,
    topology: &Topology,
) -> Work {
    // A quiet request goes on with `q` and an `mn` behind it (see
    // `route::meta_wire`).
    let quiet = request.may_be_silent();
    let wire = route::meta_wire(request, bytes);
    let parts = |servers: &[usize]| servers.iter().map(|&s| Part::new(s)).collect();
    let expect = Expect::meta(request.command, quiet);
    let adds = request.command == MetaCommand::Set
        && !request.compare_cas
        && request.mode.map(|m| m.to_ascii_uppercase()) == Some(b'E');
    let meta = MetaAnswer {
        counts_cas: counts_cas(request),
        value: brings_value(request),
    };
    let (parts, finish) = match placement {
        // `start_meta` answers it first; were it here, the same reply.
        Placement::NoServers => return Work::Ready(Bytes::from_static(route::NO_SERVERS)),
        Placement::Quorum {
            servers,
            quorum,
            forget: 0,
            older: None,
            ..
        } if adds && servers.len() > 1 => {
            let asked_cas = request.flags(bytes).any(|(flag, _)| flag == b'c');
            let first = servers[0];
            let machine = ReplicatedAdd::new(servers, quorum);
            let wire =
                smallvec::smallvec![crate::protocol::encode::meta_add_with_cas(request, bytes)];
            let key = (bytes.slice_ref(request.key_token(bytes)), request.base64);
            let asked = Some((asked_cas, request.quiet));
            let add = AddSteps::new(machine, first, wire, key.clone(), asked);
            let (key, lines) = ((key.0, Some(key.1)), topology.config.replicas);
            return StepsWork::work(Machine::Add(add), None, key, 2 * lines, Some(meta));
        }
        // One that may meet a lease the planner made a `Plan::Lease`.
        Placement::Owner { server, .. } => (parts(&[server]), Finish::Forward),
        Placement::Quorum {
            servers,
            quorum,
            forget,
            warm,
            older,
            forget_last,
        } => quorum_lines(&servers, (quorum, forget, warm), older, forget_last),
        Placement::CasThenCopy {
            owner,
            copies,
            previous,
            older,
        } => {
            let copy = route::meta_copy(request, bytes);
            let key = bytes.slice_ref(request.key_token(bytes));
            let previous = previous.map(|previous| {
                let takeover = CasTakeover::new(
                    key.clone(),
                    Some(request.base64),
                    wire.clone(),
                    expect.clone(),
                    smallvec::smallvec![copy.clone()],
                );
                (previous, takeover)
            });
            let machine = ReplicatedCas::new(true, owner, copies, previous);
            let copy = (
                smallvec::smallvec![copy],
                Expect::meta(request.command, false),
            );
            let machine = Machine::Cas(CasSteps::new(machine, owner, (wire, expect), copy));
            let key = (key, Some(request.base64));
            return StepsWork::work(machine, OlderForget::new(older), key, 1, Some(meta));
        }
        Placement::Moved {
            owner,
            previous,
            steps: mut machine,
            older: owners,
            copies_back,
            ..
        } => {
            if copies_back {
                machine.delete_previous_last_too();
            }
            let (key, base64) = machine.key_token();
            let machine = Machine::Moved(MovedSteps::new(machine, owner, previous, true));
            let (older, key) = (OlderForget::new(owners), (key, Some(base64)));
            return StepsWork::work(machine, older, key, 1, Some(meta));
        }
        Placement::ReadThrough {
            servers,
            current,
            on_miss,
        } => {
            let read = MetaRead::plan(request, bytes, servers, current, on_miss, topology);
            let machine = Machine::Read(ReadSteps::new(read, (wire, expect)));
            let key = (Bytes::new(), Some(request.base64));
            return StepsWork::work(machine, None, key, 1, Some(meta));
        }
    };
    // Only a replicated write's older owners and former replicas lose the
    // key.
    let key = match &finish {
        Finish::Quorum { .. } => (bytes.slice_ref(request.key_token(bytes)), request.base64),
        _ => (Bytes::new(), false),
    };
    let meta = spares::meta_lines(MetaLines {
        counts_cas: meta.counts_cas,
        wire,
        expect,
        key,
    });
    Work::Lines {
        parts,
        finish,
        meta: Some(meta),
    }
}

/// The parts and finish of a write to a key's replicas by quorum, in
/// either dialect (`counts`: the quorum, the former replicas that lose the
/// key and the warming servers; see `Placement::Quorum`).
fn quorum_lines(
    servers: &[usize],
    (quorum, forget, warm): (usize, usize, usize),
    older: Option<Box<crate::pools::topology::OlderOwners>>,
    forget_last: bool,
) -> (SmallVec<[Part; 1]>, Finish) {
    let parts = servers.iter().map(|&server| Part::new(server)).collect();
    // A key's replicas: few enough for 4 bytes.
    let finish = Finish::Quorum {
        quorum: quorum as u32,
        forget: forget as u32,
        warm: warm as u32,
        older: OlderForget::new(older).map(Box::new),
        forget_last,
    };
    (parts, finish)
}

/// The work of a meta request on its owner `server` that may meet a lease
/// there: the lease retry's steps (see `lease_retry`).
fn meta_lease_work(request: &MetaRequest, bytes: &Bytes, server: usize, retry: LeaseRetry) -> Work {
    let sent = (
        route::meta_wire(request, bytes),
        Expect::meta(request.command, request.may_be_silent()),
    );
    let meta = MetaAnswer {
        counts_cas: counts_cas(request),
        value: brings_value(request),
    };
    let machine = Machine::Lease(LeaseSteps::new(retry, server, sent));
    StepsWork::work(machine, None, (Bytes::new(), Some(false)), 1, Some(meta))
}

/// An `ms` with `C` in set mode: its reply feeds the `cas_*` stats, as
/// memcached counts it (other modes with `C` it does not count).
fn counts_cas(request: &MetaRequest) -> bool {
    request.command == MetaCommand::Set
        && request.compare_cas
        && matches!(
            request.mode.map(|m| m.to_ascii_uppercase()),
            None | Some(b'S')
        )
}

/// Whether the reply may carry a stored value: only `mg` with `v` can bring
/// a large value back.
fn brings_value(request: &MetaRequest) -> bool {
    request.command == MetaCommand::Get && request.value
}

/// The work of a classic command on `server` that may meet a lease (a
/// `Plan::Lease`): the client's request (without `noreply`; a one-key
/// `gat`'s as it came, framed as `VALUE` blocks), or what the plan sends
/// instead (a `touch` as an `mg`).
fn leased_work(retry: LeaseRetry, server: usize, request: &Request, bytes: &Bytes) -> Work {
    let sent = match retry.wire() {
        Some((line, expect)) => (smallvec::smallvec![line], expect),
        None if retry.is_retrieval() => (
            smallvec::smallvec![bytes.clone()],
            Expect::values(bytes.clone()),
        ),
        None => {
            let expect = request.command.reply_line().unwrap_or(LineKind::Ok);
            (forwardable(bytes, request), Expect::Line(expect))
        }
    };
    let machine = Machine::Lease(LeaseSteps::new(retry, server, sent));
    StepsWork::work(machine, None, (Bytes::new(), None), 1, None)
}

/// A request's `rewritten` bytes parsed again (so they pass every check of
/// the parser), or the request as it was when nothing was rewritten or the
/// rewrite does not parse.
fn reparsed<R, E>(
    original: (R, Bytes),
    rewritten: Option<Bytes>,
    parse: impl FnOnce(&[u8]) -> Result<Option<(R, usize)>, E>,
) -> (R, Bytes) {
    let Some(rewritten) = rewritten else {
        return original;
    };
    match parse(&rewritten) {
        Ok(Some((request, _))) => (request, rewritten),
        _ => original,
    }
}
