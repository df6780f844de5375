//! Turning a parsed request's plan into the entry it queues, apart from the
//! session: the one road's questions to each dialect ([`Dialect`]), the
//! work each plan becomes, memring's own answers, and a gutter's TTL cap.

use super::shadow::Shadowed;
use super::*;
use crate::hotkeys::{ClassicKeys, MetaKey};
use crate::plan::handoff::cas::CasTakeover;
use crate::plan::lease_retry::LeaseRetry;
use crate::plan::meta_read::MetaRead;
use crate::plan::placement::{HealthView, QuorumWrite};
use crate::plan::replicated_add::ReplicatedAdd;
use crate::plan::replicated_cas::ReplicatedCas;
use crate::plan::steps::{AddSteps, CasSteps, LeaseSteps, Machine, MovedSteps, ReadSteps};
use crate::pools::planned::Planned;
use crate::protocol::meta::{decode_key, DecodedKey};

/// The work of a classic request's `plan`; `None` when there is nothing
/// to queue.
fn classic_work(
    worker: &WorkerCtx,
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
        | Plan::ShadowStats) => own_work(worker, own, request.noreply)?,
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
        Plan::Key(Placement::Quorum(write))
            if request.command == Command::Add && write.is_replicated_add() =>
        {
            let first = write.servers[0];
            let machine = ReplicatedAdd::new(write.servers, write.quorum);
            let wire = crate::protocol::encode::add_with_cas(request, bytes);
            let key = bytes.slice_ref(request.key(bytes, 0));
            let lines = 2 * topology.config.replicas;
            let add = AddSteps::new(machine, first, wire, (key.clone(), false), None);
            StepsWork::work(Machine::Add(add), None, (key, None), lines, None)
        }
        Plan::Key(Placement::Quorum(write)) => {
            let (parts, finish) = quorum_lines(write);
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

/// The work of a plan memring answers itself (in either dialect);
/// `None` when there is nothing to queue (`quit`, a reply the client
/// asked not to get).
pub(super) fn own_work(worker: &WorkerCtx, plan: Plan, noreply: bool) -> Option<Work> {
    Some(match plan {
        // The session stops reading (see `ClientSession::start_on`).
        Plan::Quit => return None,
        Plan::Reply(_) if noreply => return None,
        Plan::Reply(reply) => Work::Ready(reply),
        Plan::Stats => Work::Stats,
        Plan::StatsReset => Work::StatsReset,
        Plan::HotKeys => Work::Ready(worker.hot.report()),
        Plan::ShadowStats => Work::Ready(shadow::shadow_report(worker)),
        // Plans for servers are the callers' own; were one passed here,
        // it is answered as finding no server rather than dropped.
        Plan::Key(_) | Plan::Broadcast { .. } | Plan::Retrieve(_) | Plan::Lease { .. } => {
            Work::Ready(Bytes::from_static(route::NO_SERVERS))
        }
    })
}

/// The entry of a request planned on `topology` (either dialect: a meta
/// request's `request` is [`keyless`], its bytes say the rest), with its
/// hot-key guard and shadow pairs.
fn entry(
    worker: &WorkerCtx,
    request: Request,
    bytes: Bytes,
    topology: Planned,
    work: Work,
    (hot, shadow): Guards,
) -> Entry {
    Entry {
        command: request.command,
        noreply: request.noreply,
        request,
        bytes,
        topology,
        work,
        sent: false,
        reserved: Reservation::default(),
        started: worker.clock.nanos(),
        hot,
        shadow,
        instead: None,
        said: crate::protocol::outcome::Outcome::Nothing,
    }
}

/// The entry of a meta request's `plan` (memring's own answers without the
/// guards: such a plan has none); `None` when there is nothing to queue.
fn meta_entry(
    worker: &WorkerCtx,
    request: MetaRequest,
    bytes: Bytes,
    topology: Planned,
    plan: Plan,
    guards: Guards,
) -> Option<Entry> {
    let command = Command::of_meta(request.command);
    let work = match plan {
        Plan::Key(Placement::NoServers) => {
            let mut entry = Entry::ready(route::NO_SERVERS, topology);
            entry.command = command;
            return Some(entry);
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
            let mut entry = Entry::ready(b"", topology);
            entry.command = command;
            entry.work = own_work(worker, own, false)?;
            return Some(entry);
        }
    };
    Some(entry(
        worker,
        keyless(command),
        bytes,
        topology,
        work,
        guards,
    ))
}

/// `request` with its exptime capped at `ttl` seconds, for a gutter
/// pool.
pub(super) fn capped(
    (worker, limits): (&WorkerCtx, &Limits),
    request: Request,
    bytes: Bytes,
    ttl: u64,
) -> (Request, Bytes) {
    let rewritten = crate::pools::failover::cap_classic(
        request.command,
        &bytes,
        request.line_len as usize,
        ttl,
        worker.clock.unix_seconds(),
    );
    reparsed((request, bytes), rewritten, |b| parse_request(b, limits))
}

/// The meta request with its TTLs capped at `ttl` seconds, for a gutter
/// pool.
fn meta_capped(
    (worker, limits): (&WorkerCtx, &Limits),
    request: MetaRequest,
    bytes: Bytes,
    ttl: u64,
) -> (MetaRequest, Bytes) {
    let rewritten = crate::pools::failover::cap_meta(
        Command::of_meta(request.command),
        &bytes,
        request.line_len as usize,
        ttl,
        worker.clock.unix_seconds(),
    );
    reparsed((request, bytes), rewritten, |b| parse_meta(b, limits))
}

/// What keeps a planned request's entry in step with the hot keys and the
/// shadow pool.
pub(super) type Guards = (Option<Rc<WriteGuard>>, Option<Box<shadow::Pairs>>);

/// A parsed request of either dialect, as the one road
/// ([`ClientSession::start_keyed`], [`ClientSession::start_on`]) takes it:
/// each stop asks it only what its dialect says. Generic, not a trait
/// object: each dialect's road is compiled on its own, so a get's stops
/// cost what they did.
pub(super) trait Dialect: Sized {
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
    /// The request with its TTLs capped at `ttl` seconds, for a gutter
    /// (parsed again within `limits`).
    fn capped(self, at: (&WorkerCtx, &Limits), bytes: Bytes, ttl: u64) -> (Self, Bytes);
    /// Its plan (see `route::plan`, `route::plan_meta`).
    fn plan(&self, keys: &Self::Keys<'_>, topology: &Topology, health: &HealthView) -> Plan;
    /// The entry of its `plan` on `topology` (or nothing to queue, as the
    /// plan says).
    fn entry(
        self,
        worker: &WorkerCtx,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    ) -> Option<Entry>;
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

    fn capped(self, at: (&WorkerCtx, &Limits), bytes: Bytes, ttl: u64) -> (Request, Bytes) {
        capped(at, self, bytes, ttl)
    }

    fn plan(&self, keys: &ClassicKeys<'_>, topology: &Topology, health: &HealthView) -> Plan {
        spares::plan(self, keys.bytes, topology, health)
    }

    fn entry(
        self,
        worker: &WorkerCtx,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    ) -> Option<Entry> {
        let work = classic_work(worker, &self, &bytes, &topology, plan)?;
        Some(entry(worker, self, bytes, topology, work, guards))
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

    fn capped(self, at: (&WorkerCtx, &Limits), bytes: Bytes, ttl: u64) -> (MetaRequest, Bytes) {
        meta_capped(at, self, bytes, ttl)
    }

    fn plan(&self, key: &MetaKey<'_>, topology: &Topology, health: &HealthView) -> Plan {
        spares::plan_meta(self, key.bytes, key.key, topology, health)
    }

    fn entry(
        self,
        worker: &WorkerCtx,
        bytes: Bytes,
        topology: Planned,
        plan: Plan,
        guards: Guards,
    ) -> Option<Entry> {
        meta_entry(worker, self, bytes, topology, plan, guards)
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
        Placement::Quorum(write) if adds && write.is_replicated_add() => {
            let asked_cas = request.flags(bytes).any(|(flag, _)| flag == b'c');
            let first = write.servers[0];
            let machine = ReplicatedAdd::new(write.servers, write.quorum);
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
        Placement::Quorum(write) => quorum_lines(write),
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
/// either dialect.
fn quorum_lines(write: QuorumWrite) -> (SmallVec<[Part; 1]>, Finish) {
    let parts = write
        .servers
        .iter()
        .map(|&server| Part::new(server))
        .collect();
    // A key's replicas: few enough for 4 bytes.
    let finish = Finish::Quorum {
        quorum: write.quorum as u32,
        forget: write.forget as u32,
        warm: write.warm as u32,
        older: OlderForget::new(write.older).map(Box::new),
        forget_last: write.forget_last,
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
