//! The pure request plan: which servers get which bytes for one client
//! request, and how their replies become the client's reply.
//!
//! - [`plan`] turns a parsed request and a topology snapshot into a [`Plan`],
//!   and [`plan_meta`] a meta request into the same [`Plan`]; both place keys
//!   with the one [`crate::plan::placement::place`].
//! - [`Retrieval`] is every `get`/`gets`/`gat`/`gats`: keys split by server in
//!   chunks, values passed on in the client's key order (the session holds
//!   a small reply until it is whole), keys
//!   that failed (or missed, with fall-through) asked of their next replica.
//!   A plain multi-get is the one-replica case of the replicated read, and
//!   an `mg` on one server the one-key case in the meta dialect.
//! - [`decide`] answers a replicated write on a quorum; [`broadcast_answer`] a broadcast.
//!
//! No I/O and no tokio here: the session dispatches what the plan says and
//! feeds the replies back.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::protocol::outcome::{Outcome, Reply};
use smallvec::SmallVec;

use crate::error::BackendError;
use crate::plan::handoff::{Copies, Moved};
use crate::plan::lease_retry::{leased_classic, leased_gat, leased_meta, LeaseRetry};
use crate::plan::placement::{place, HealthView, KeyKind, KeyOp, Placement, Servers};
use crate::pools::topology::{Topology, ZoneHit};
use crate::protocol::encode::{Outbound, ReplyWriter};
use crate::protocol::meta::{MetaCommand, MetaRequest};
use crate::protocol::reply::{Expect, Got};
use crate::protocol::request::Span;
use crate::protocol::{Command, Request};
use crate::runtime::recycled::RecycledBuf;

mod retrieval;
pub(crate) use retrieval::{Chunk, Retrieval, Split, SubRequest};

/// A reply from one server: its bytes and what they say, or why there are
/// none.
pub(crate) type CallResult = Result<Reply, BackendError>;

/// Longest line memring writes to a server for a retrieval: memcached closes
/// connections on `gat`/`gats` lines past about 16 KB, so sub-requests stay
/// well under that.
pub(crate) const MAX_SUB_LINE_BYTES: usize = 8 * 1024;

/// Most keys asked of the servers at once for one retrieval; larger
/// retrievals go out in chunks as the client takes the values.
pub(crate) const MAX_CHUNK_KEYS: usize = 100;
/// Most key lists of finished subs a kept retrieval holds for its next.
const MAX_SPARE_SUB_KEYS: usize = 4;

/// What to do with one client request.
#[derive(Debug)]
pub(crate) enum Plan {
    /// memring answers itself with these bytes (none: nothing is written).
    Reply(Bytes),
    /// memring's own `stats`.
    Stats,
    /// `stats reset`: memring's own `stats` counters start again from zero.
    StatsReset,
    /// `stats hotkeys`: the hottest keys of the last window.
    HotKeys,
    /// `stats shadow`: each shadow pool's figures beside its primary's.
    ShadowStats,
    /// Close the client once earlier replies are written.
    Quit,
    /// A request on one key, where [`place`] put it: the owner gets the
    /// request as received (`noreply` stripped); replicas a quorum write,
    /// then a delete of the key on the previous ring's replicas only and on
    /// owners in older rings, awaited before the answer (so no older copy
    /// stays where a lagging sidecar, or this one after an undo, would read
    /// it); a `cas` with replicas is decided on the owner and `set` on the
    /// others before any later request of the client (in a window, a refusal
    /// of the owner is taken over by `handoff::cas::CasTakeover`); a moved
    /// key's request is run by the `handoff::Moved` machine the plan holds.
    /// Meta requests are placed alike ([`plan_meta`]).
    Key(Placement<Box<Moved>>),
    /// Every server gets it (`flush_all`); `OK` only if all say `OK`.
    Broadcast { servers: Servers },
    /// A retrieval: a classic one, or an `mg` on one server.
    Retrieve(Box<Retrieval>),
    /// A request on its key's owner that, inside a hand-off window, may
    /// meet another sidecar's lease there (a meta request: [`leased_meta`];
    /// a classic one: [`leased_classic`], and [`leased_gat`] for a one-key
    /// `gat`/`gats` asked of its owner alone): run as `retry`, which
    /// removes a lease it meets and runs the request again.
    /// `hash` as for [`Placement::Owner`]. Boxed, so that a plan (moved on
    /// every get) stays the size of a placement: only a window's requests
    /// that may meet a lease pay for it.
    Lease {
        server: usize,
        hash: Option<u64>,
        retry: Box<LeaseRetry>,
    },
}

impl Plan {
    /// Where the plan sends key `i` (a one-key request's is key 0), as the
    /// hot keys count it: the server first asked (`None`: no server), and
    /// the key's hash when the planner took it by the hash the hot keys
    /// count with. `None` when the plan sends the key nowhere.
    #[inline]
    pub(crate) fn key_target(&self, i: usize) -> Option<(Option<usize>, Option<u64>)> {
        match self {
            Plan::Key(placement) if i == 0 => placement.owner().map(|(s, hash)| (Some(s), hash)),
            Plan::Lease { server, hash, .. } if i == 0 => Some((Some(*server), *hash)),
            Plan::Retrieve(retrieval) => Some((retrieval.owner(i), retrieval.key_hash(i))),
            _ => None,
        }
    }

    /// Whether a write goes to its key's owner alone (in a window, as the
    /// lease retry there), so that what it stores is what the key holds.
    pub(crate) fn owner_alone(&self) -> bool {
        matches!(
            self,
            Plan::Key(Placement::Owner { .. }) | Plan::Lease { .. }
        )
    }

    /// Makes a retrieval's plan one run of a retrieval across pools (see
    /// [`Split`]): a retrieval, or a one-key `gat` planned as the lease
    /// retry.
    pub(crate) fn split(&mut self, split: Split) {
        match self {
            Plan::Retrieve(retrieval) => retrieval.split(split),
            Plan::Lease { retry, .. } if split != Split::Whole => {
                retry.run_of_reply(split == Split::Last);
            }
            _ => {}
        }
    }
}

/// [`Retrieval::previous_from`] of a key with no previous owner to ask.
const NOT_MOVED: u8 = u8::MAX;

/// The reply to a request that found no server.
pub(crate) const NO_SERVERS: &[u8] = b"SERVER_ERROR no servers configured\r\n";

/// The reply to a write (or a meta request other than `mg`, see
/// [`cut_off_meta`]) while this sidecar is cut off from etcd past its lease
/// with `etcd_cut_off = "miss"` (see [`Topology::cut_off`]); a retrieval
/// answers misses.
pub(crate) const CUT_OFF: &[u8] =
    b"SERVER_ERROR memring is cut off from etcd past its lease: it serves again once registered and caught up\r\n";

/// Finished retrievals, kept with their buffers for the next ones: a
/// retrieval in steady state allocates nothing (not even per key).
#[derive(Debug, Default)]
pub(crate) struct Reuse {
    // Boxed, as the plans that take them hold them: kept boxes are reused.
    #[allow(clippy::vec_box)]
    retrievals: Vec<Box<Retrieval>>,
}

impl Reuse {
    /// Nothing kept yet (a worker's thread-local spares start so).
    pub(crate) const EMPTY: Reuse = Reuse {
        retrievals: Vec::new(),
    };

    /// The `mg` `request` on `server` as a one-key retrieval, in kept
    /// storage when there is some.
    #[cfg(test)]
    fn meta_get(
        &mut self,
        request: &MetaRequest,
        bytes: &Bytes,
        server: usize,
        hash: Option<u64>,
    ) -> Box<Retrieval> {
        meta_get(self.take(), request, bytes, server, hash)
    }

    /// Keeps `retrieval`'s storage for a later one (up to `most` are
    /// kept, each with room for at most `keys` keys: a long multi-get's
    /// lists go); what it holds of the request and its replies goes now.
    pub(crate) fn keep(&mut self, mut retrieval: Box<Retrieval>, most: usize, keys: usize) {
        if self.retrievals.len() < most && retrieval.room() <= keys {
            retrieval.clear();
            self.retrievals.push(retrieval);
        }
    }

    /// Lets go of all but `most` kept retrievals.
    pub(crate) fn shed(&mut self, most: usize) {
        self.retrievals.truncate(most);
    }
}

/// Where planning takes a finished retrieval's storage from: a [`Reuse`],
/// or one the caller reaches only when a retrieval is planned (a worker's
/// thread-local spares: the plan is then returned straight to the caller,
/// not through the thread-local's closure, where moving it cost about 50
/// instructions a request).
pub(crate) trait Storage {
    /// A kept retrieval's storage (cleared), if there is one.
    fn take(&mut self) -> Option<Box<Retrieval>>;
    /// Takes back the storage of a retrieval planned and then not used (a
    /// `gat` planned as the lease retry instead).
    fn give_back(&mut self, retrieval: Box<Retrieval>);
}

impl Storage for Reuse {
    fn take(&mut self) -> Option<Box<Retrieval>> {
        self.retrievals.pop()
    }

    fn give_back(&mut self, retrieval: Box<Retrieval>) {
        self.keep(retrieval, usize::MAX, usize::MAX);
    }
}

/// `request` planned as a retrieval, in `kept` storage when there is some.
fn retrieval(
    kept: Option<Box<Retrieval>>,
    request: &Request,
    bytes: &Bytes,
    topology: &Topology,
    health: &HealthView,
) -> Box<Retrieval> {
    let mut retrieval = kept.unwrap_or_default();
    retrieval.plan(request, bytes.clone(), topology, health);
    retrieval
}

/// The `mg` `request` on `server` as a one-key retrieval in the meta
/// dialect, in `kept` storage when there is some.
fn meta_get(
    kept: Option<Box<Retrieval>>,
    request: &MetaRequest,
    bytes: &Bytes,
    server: usize,
    hash: Option<u64>,
) -> Box<Retrieval> {
    let mut retrieval = kept.unwrap_or_default();
    retrieval.plan_meta_get(request, bytes.clone(), server, hash);
    retrieval
}

/// Plans `request` (whose bytes are `bytes`) on `topology`, whose servers'
/// health is `health`; a retrieval is planned into storage `reuse` kept
/// from an earlier one. Inside a window, a command on its key's owner that
/// may meet another sidecar's lease there is a [`Plan::Lease`], as a meta
/// request is in [`plan_meta`].
pub(crate) fn plan(
    request: &Request,
    bytes: &Bytes,
    topology: &Topology,
    health: &HealthView,
    reuse: &mut impl Storage,
) -> Plan {
    match request.command {
        Command::Quit => Plan::Quit,
        Command::Version => Plan::Reply(Bytes::from_static(crate::VERSION_REPLY)),
        // Accepted and not forwarded: memring's log level is its own.
        Command::Verbosity => Plan::Reply(Bytes::from_static(b"OK\r\n")),
        Command::Stats
            if request.arg.is_some_and(|arg| arg.of(bytes) == b"hotkeys".as_slice()) =>
        {
            Plan::HotKeys
        }
        Command::Stats
            if request.arg.is_some_and(|arg| arg.of(bytes) == b"shadow".as_slice()) =>
        {
            Plan::ShadowStats
        }
        // memcached ignores whatever follows `reset`.
        Command::Stats if request.arg.is_some_and(|arg| arg.of(bytes) == b"reset".as_slice()) => {
            Plan::StatsReset
        }
        Command::Stats if request.arg.is_some() => Plan::Reply(Bytes::from_static(
            b"CLIENT_ERROR memring answers plain 'stats', 'stats reset', 'stats hotkeys' and 'stats shadow' only; ask each memcached for the others\r\n",
        )),
        Command::Stats => Plan::Stats,
        Command::FlushAll => Plan::Broadcast {
            servers: (0..topology.backends.len()).collect(),
        },
        // Cut off from etcd: every key misses (`END` ends any retrieval's
        // reply) and nothing is written.
        command if command.is_retrieval() && topology.cut_off() => {
            Plan::Reply(Bytes::from_static(b"END\r\n"))
        }
        command if command.is_retrieval() => {
            let retrieval = retrieval(reuse.take(), request, bytes, topology, health);
            // Only a window has leases (checked first: a get outside one
            // pays for no more).
            if topology.previous.is_some() {
                return leased_or_retrieve(retrieval, request, bytes, topology, reuse);
            }
            Plan::Retrieve(retrieval)
        }
        _ if topology.cut_off() => Plan::Reply(Bytes::from_static(CUT_OFF)),
        _ => {
            let op = KeyOp::classic(
                request.command == Command::Cas,
                request.command == Command::Delete,
            )
            .repeated(matches!(
                request.command,
                Command::Set | Command::Delete | Command::Touch
            ));
            // Every classic write is handed off (see `Moved::new`),
            // copying a moved key only where `shared_with` allows it. Only a
            // window has moved keys: the machine is made only then.
            let steps = topology
                .previous
                .is_some()
                .then(|| {
                    let copies = Copies::of(topology.config.shared_with);
                    Moved::new(request, bytes, copies).map(Box::new)
                })
                .flatten();
            match place(request.key(bytes, 0), op, steps, topology, health) {
                // Inside a window, a command a lease would mislead (an
                // `incr`, a `delete`, a `touch`, ...) is run as the lease
                // retry on its owner.
                Placement::Owner { server, hash } => match leased_classic(request, bytes, topology)
                {
                    Some(retry) => Plan::Lease {
                        server,
                        hash,
                        retry: Box::new(retry),
                    },
                    None => Plan::Key(Placement::Owner { server, hash }),
                },
                placement => Plan::Key(placement),
            }
        }
    }
}

/// A classic `retrieval` planned inside a window: a one-key `gat`/`gats`
/// asked of its owner alone is the lease retry there ([`leased_gat`]; its
/// storage goes back to `reuse`), any other the retrieval.
fn leased_or_retrieve(
    retrieval: Box<Retrieval>,
    request: &Request,
    bytes: &Bytes,
    topology: &Topology,
    reuse: &mut impl Storage,
) -> Plan {
    let Some(server) = retrieval.lone_owner() else {
        return Plan::Retrieve(retrieval);
    };
    match leased_gat(request, bytes, topology) {
        Some(retry) => {
            let hash = retrieval.key_hash(0);
            // The lease retry sends the `gat` itself.
            reuse.give_back(retrieval);
            Plan::Lease {
                server,
                hash,
                retry: Box::new(retry),
            }
        }
        None => Plan::Retrieve(retrieval),
    }
}

/// What to do with a replicated write, given the replies so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Not enough replies yet.
    Wait,
    /// Answer the client with this reply.
    Answer(Reply),
    /// No quorum can be reached; the names of the servers that failed.
    Fail(Vec<Arc<str>>),
}

/// Decides a replicated write. `results[i]` is replica `i`'s reply so far
/// (`None`: still outstanding), replica 0 being the key's owner.
///
/// A reply shared by `quorum` replicas answers at once. Once every replica has
/// answered without such agreement, the owner's reply answers if at least
/// `quorum` replicas succeeded (their copies differ: see README), and the
/// write fails otherwise. It also fails as soon as too few replicas are left
/// to reach a quorum.
pub(crate) fn decide(results: &[Option<&CallResult>], quorum: usize) -> Decision {
    let success = |r: &CallResult| matches!(r, Ok(reply) if !reply.outcome.is_error());
    let mut succeeded = 0;
    let mut outstanding = 0;
    for result in results {
        match result {
            None => outstanding += 1,
            Some(r) if success(r) => {
                succeeded += 1;
                let reply = r.as_ref().expect("success is Ok");
                let alike = results
                    .iter()
                    .filter(|other| matches!(other, Some(Ok(o)) if o == reply))
                    .count();
                if alike >= quorum {
                    return Decision::Answer(reply.clone());
                }
            }
            Some(_) => {}
        }
    }
    if succeeded + outstanding < quorum {
        return refused_or_failed(results);
    }
    if outstanding > 0 {
        return Decision::Wait;
    }
    // Everyone answered, a quorum succeeded, but the replies differ.
    let owner_first = results
        .iter()
        .flatten()
        .find(|r| success(r))
        .and_then(|r| r.as_ref().ok());
    match owner_first {
        Some(reply) => Decision::Answer(reply.clone()),
        None => refused_or_failed(results),
    }
}

/// A replicated write without a quorum: a replica's `CLIENT_ERROR` (the
/// first in replica order) when one refused the request itself, as one
/// memcached words it (`incr` of a value that is not a number), else a
/// failure naming the replicas memring could not reach.
fn refused_or_failed(results: &[Option<&CallResult>]) -> Decision {
    let refused = results.iter().flatten().find_map(|r| match r {
        Ok(reply) if reply.outcome.is_client_error() => Some(reply.clone()),
        _ => None,
    });
    match refused {
        Some(reply) => Decision::Answer(reply),
        None => Decision::Fail(failed_servers(results)),
    }
}

fn failed_servers(results: &[Option<&CallResult>]) -> Vec<Arc<str>> {
    results
        .iter()
        .filter_map(|r| match r {
            Some(Err(BackendError { server, .. })) => Some(server.clone()),
            _ => None,
        })
        .collect()
}

/// What a broadcast (`flush_all`) answers once every server replied.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Broadcast<'a> {
    /// Every server said `OK`.
    AllOk,
    /// A server refused it itself (`CLIENT_ERROR flush_all not allowed` from
    /// a memcached started with `-F`): its words are the client's answer, as
    /// one memcached would give them, with no server named. A refusal is
    /// not transient, so it answers before servers memring could not reach.
    Refused(&'a Reply),
    /// The names of the servers memring could not get an answer from.
    Failed(Vec<&'a str>),
}

/// The answer to a broadcast from each server's `(name, result)`.
pub(crate) fn broadcast_answer<'a>(
    results: impl Iterator<Item = (&'a str, &'a CallResult)>,
) -> Broadcast<'a> {
    let mut failed = Vec::new();
    let mut refused: Option<&Reply> = None;
    for (name, result) in results {
        match result {
            Ok(reply) if reply.outcome == Outcome::Ok => {}
            // memcached's `CLIENT_ERROR` says why; the first such wins over
            // an `ERROR` or `SERVER_ERROR` line from another server.
            Ok(reply) => {
                let client_error = reply.outcome.is_client_error();
                let better = match refused {
                    None => true,
                    Some(r) => client_error && !r.outcome.is_client_error(),
                };
                if better {
                    refused = Some(reply);
                }
            }
            Err(_) => failed.push(name),
        }
    }
    match refused {
        Some(reply) => Broadcast::Refused(reply),
        None if failed.is_empty() => Broadcast::AllOk,
        None => Broadcast::Failed(failed),
    }
}

/// Plans the meta request `request` (whose bytes are `bytes`) on `topology`:
/// `mn` is answered by memring ([`Plan::Reply`]), an `mg` its key's owner
/// alone answers is a one-key [`Retrieval`] in the meta dialect (planned
/// into storage `reuse` kept from an earlier one), unless inside a window
/// it may meet a lease ([`leased_meta`]: then it is a [`Plan::Lease`] on
/// its owner, as is every other meta command on one owner that may); every
/// other meta command
/// is a request on one key ([`Plan::Key`]), placed as classic requests are;
/// the replicas get an `md` where classic requests get a `delete`. With
/// replicas, a mutation with `C` is decided on the owner and then copied
/// without `C` and `q` ([`meta_copy`]) to the other replicas; `mg` asks the
/// replicas in order. A moved key's request is run by the `handoff::Moved`
/// machine in the steps [`meta_move`] names (`mg` reads through, `ma`/`ms`
/// in append, prepend or replace mode and `mg … T` copy when the new owner
/// lacks the key, `ms … ME` and `ma … N` copy first, `ms` stores on the new
/// owner, `ms … C` refused with `EX`/`NF` is taken over as a classic `cas`,
/// `md` deletes from both). See the README's protocol and replication
/// sections for the rules.
///
/// The ring hashes [`MetaRequest::routing_key`]: the decoded bytes of a `b`
/// key, so meta and classic commands for one key meet on one server. With
/// replicas, `mg` reads like a classic get, `ms`/`md`/`ma` write like classic
/// writes (with `C` like `cas`), and what hands out a recache lease (`N`,
/// `R` on `mg`) and `me` go to the owner only, so exactly one client wins.
///
/// In chained hand-off windows the write plans of a moved key
/// ([`Placement::Moved`]) also send an `md` to each of their `forget` servers
/// (owners in older rings) with the first step, and answer once those are
/// done too.
pub(crate) fn plan_meta(
    request: &MetaRequest,
    bytes: &Bytes,
    key: &[u8],
    topology: &Topology,
    health: &HealthView,
    reuse: &mut impl Storage,
) -> Plan {
    if request.command == MetaCommand::Noop {
        return Plan::Reply(Bytes::from_static(b"MN\r\n"));
    }
    if topology.cut_off() {
        return Plan::Reply(cut_off_meta(request, bytes));
    }
    // Which hand-off steps a moved key takes: looked at in a window only.
    let copies = Copies::of(topology.config.shared_with);
    let what = topology
        .previous
        .is_some()
        .then(|| meta_move(request, bytes))
        .flatten()
        .map(|what| {
            let key = (bytes.slice_ref(request.key_token(bytes)), request.base64);
            let expect = Expect::meta(request.command, request.may_be_silent());
            let wire = meta_wire(request, bytes);
            Box::new(Moved::meta(
                what,
                copies,
                request.command,
                key,
                wire,
                expect,
            ))
        });
    let kind = match request.command {
        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arithmetic if request.compare_cas => {
            // Only a set can be tried on the previous owner and copied: the
            // owner lacks the item an `ma` or an append would change.
            let sets = request.command == MetaCommand::Set
                && matches!(
                    request.mode.map(|m| m.to_ascii_uppercase()),
                    None | Some(b'S')
                );
            KeyKind::Cas {
                retry_elsewhere: sets,
            }
        }
        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arithmetic => KeyKind::Write,
        _ => KeyKind::Read,
    };
    let op = KeyOp {
        kind,
        owner_only: request.command == MetaCommand::Debug
            || (request.command == MetaCommand::Get && request.takes_lease())
            // A request memcached refuses is answered by the owner alone.
            || request.backend_error.is_some(),
        hands_off: request.backend_error.is_none(),
        removes: request.command == MetaCommand::Delete,
        // `ms` in set mode and `md` (without `C`: then a cas) leave a server
        // without the owner's item with the same value, or none.
        repeatable: kind == KeyKind::Write
            && (request.command == MetaCommand::Delete
                || (request.command == MetaCommand::Set
                    && matches!(
                        request.mode.map(|m| m.to_ascii_uppercase()),
                        None | Some(b'S')
                    ))),
    };
    match place(key, op, what, topology, health) {
        // Inside a window, a request that may meet another sidecar's lease
        // (an `mg` with `T` or `N`, an `ma`, ...) is run as the lease retry;
        // asked before kept storage is taken, so none goes unused.
        Placement::Owner { server, hash } => match leased_meta(request, bytes, topology) {
            Some(retry) => Plan::Lease {
                server,
                hash,
                retry: Box::new(retry),
            },
            None if request.command == MetaCommand::Get => {
                Plan::Retrieve(meta_get(reuse.take(), request, bytes, server, hash))
            }
            None => Plan::Key(Placement::Owner { server, hash }),
        },
        placement => Plan::Key(placement),
    }
}

/// A cut-off sidecar's answer to the meta request (not `mn`): an `mg`
/// misses, answered as memcached answers a miss of it (`EN` with its `O`
/// and `k` echoed, nothing when quiet), as a classic retrieval answers
/// `END`; every other meta command is refused with [`CUT_OFF`], and so is
/// an `mg` with `N` (memcached answers its miss by creating the item and
/// handing out a recache lease, a write this sidecar must not make) or one
/// memcached refuses (its error is memcached's to give).
fn cut_off_meta(request: &MetaRequest, bytes: &Bytes) -> Bytes {
    if request.command == MetaCommand::Get && !request.vivify && request.backend_error.is_none() {
        crate::protocol::encode::meta_get_miss(request, bytes)
    } else {
        Bytes::from_static(CUT_OFF)
    }
}

/// What a server is sent for the meta request: its bytes, and an `mn`
/// behind them when it is quiet. memcached then sends exactly the replies
/// it would send the client, and `MN` tells the connection that the rest
/// was suppressed. That holds for a request 1.6.18 would refuse too: its
/// error comes before the `MN`, and a newer memcached that accepts the flag
/// stays silent.
pub(crate) fn meta_wire(request: &MetaRequest, bytes: &Bytes) -> Outbound {
    let mut wire: Outbound = smallvec::smallvec![bytes.clone()];
    if request.may_be_silent() {
        wire.push(Bytes::from_static(b"mn\r\n"));
    }
    wire
}

/// The request without its `C` and `q` flags: what a mutation the owner
/// accepted under `C` becomes for the other replicas, which have their own
/// cas numbers. Without `q` they always answer, so the copy can be framed.
pub(crate) fn meta_copy(request: &MetaRequest, bytes: &Bytes) -> Bytes {
    let flags_start = request.flags.start as usize;
    let line_end = request.flags.end as usize;
    let mut out = BytesMut::with_capacity(request.total_len as usize);
    let head = &bytes[..flags_start.min(line_end)];
    out.put_slice(head.strip_suffix(b" ").unwrap_or(head));
    for (flag, token) in request.flags(bytes) {
        if flag != b'C' && flag != b'q' {
            out.put_u8(b' ');
            out.put_slice(token);
        }
    }
    out.put_slice(b"\r\n");
    out.put_slice(&bytes[request.line_len as usize..request.total_len as usize]);
    out.freeze()
}

/// Whether a read with zones copies a hit found past the key's local
/// replica back to it (`zone_write_back`, outside a window), for a get
/// ([`Retrieval`]) and an `mg` (`meta_read::MetaRead`) alike.
pub(crate) fn zone_writes_back(topology: &Topology) -> bool {
    topology.previous.is_none()
        && topology.config.replicas.max(1) > 1
        && topology.config.shared_with.copies()
        && topology.config.zone_write_back
        && topology.reads_local_first()
}

/// What an `mg` asks a server whose hit may be copied (a moved key's
/// previous owner, another zone's replica): the client's line with what a
/// copy needs too (`v f t`, left out of the client's answer again: see
/// `handoff::meta_read_through_hit`), and an `mn` behind it when quiet.
pub(crate) fn meta_fetch_wire(
    request: &MetaRequest,
    bytes: &Bytes,
) -> (Outbound, crate::plan::handoff::AddedFlags) {
    let line = &bytes[..request.line_len as usize];
    let (line, added) = crate::plan::handoff::meta_read_through_line(line, |flag| {
        request.flags(bytes).any(|(f, _)| f == flag)
    });
    let mut wire: Outbound = smallvec::smallvec![line];
    if request.may_be_silent() {
        wire.push(Bytes::from_static(b"mn\r\n"));
    }
    (wire, added)
}

/// Which hand-off steps a meta request on a moved key takes; `None` when
/// the new owner alone answers it (a lease, `me`, `ms` in a mode that needs
/// nothing of the previous owner).
fn meta_move(request: &MetaRequest, bytes: &Bytes) -> Option<crate::plan::handoff::MetaMove> {
    use crate::plan::handoff::MetaMove;
    let set_mode = matches!(
        request.mode.map(|m| m.to_ascii_uppercase()),
        None | Some(b'S')
    );
    Some(match request.command {
        MetaCommand::Get if !request.takes_lease() && !request.changes_item(bytes) => {
            let (wire, added) = meta_fetch_wire(request, bytes);
            MetaMove::Read { wire, added }
        }
        MetaCommand::Set if request.compare_cas && set_mode => MetaMove::Cas {
            as_set: meta_copy(request, bytes),
        },
        MetaCommand::Delete => MetaMove::Delete,
        _ => match meta_copy_when(request, bytes) {
            Some(CopyWhen::First) => MetaMove::CopyFirst,
            Some(CopyWhen::IfAbsent) => MetaMove::RetryAfterCopy {
                replaces: request.command == MetaCommand::Set
                    && (request.compare_cas
                        || request.mode.map(|m| m.to_ascii_uppercase()) == Some(b'R')),
            },
            None if request.command == MetaCommand::Set => MetaMove::Overwrite,
            None => return None,
        },
    })
}

/// When a meta request on a moved key copies the key from its previous owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyWhen {
    /// When the new owner does not have it, then the request runs again.
    IfAbsent,
    /// Before the request runs (an add must not store over it).
    First,
}

/// Whether (and when) a meta request on a moved key needs the key on its new
/// owner: `ma` without `N`, `ms` in mode A/P/R and `mg` with `T` when it is
/// absent there; `ms` in add mode (`E`) and `ma` with `N` first (the new
/// owner would create the key, not find it absent). `None`: the new owner
/// alone.
fn meta_copy_when(request: &MetaRequest, bytes: &[u8]) -> Option<CopyWhen> {
    let needs = match request.command {
        // An `N` creates a missing key at its initial value: the count the
        // previous owner holds must be there first.
        MetaCommand::Arithmetic if request.vivify => return Some(CopyWhen::First),
        MetaCommand::Arithmetic => true,
        MetaCommand::Set => {
            return match request.mode.map(|m| m.to_ascii_uppercase()) {
                Some(b'A' | b'P' | b'R') => Some(CopyWhen::IfAbsent),
                Some(b'E') => Some(CopyWhen::First),
                _ => None,
            }
        }
        MetaCommand::Get => {
            !request.takes_lease() && request.flags(bytes).any(|(flag, _)| flag == b'T')
        }
        _ => false,
    };
    needs.then_some(CopyWhen::IfAbsent)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::error::BackendErrorKind;
    use crate::protocol::meta::parse_meta;
    use crate::protocol::{parse_request, Limits};
    use crate::runtime::outbuf::OutQueue;

    fn request(line: &'static [u8]) -> (Request, Bytes) {
        let bytes = Bytes::from_static(line);
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        (request, bytes)
    }

    fn retrieval(line: &'static [u8], owners: &[&[usize]], fall_through: bool) -> Retrieval {
        let (request, bytes) = request(line);
        let candidates = owners.iter().map(|o| o.iter().copied().collect()).collect();
        Retrieval::with_candidates(&request, bytes, candidates, fall_through)
    }

    fn value(key: &str, data: &str) -> Got {
        Got::Value(Bytes::from(format!(
            "VALUE {key} 0 {}\r\n{data}\r\n",
            data.len()
        )))
    }

    fn drain(out: &mut OutQueue) -> String {
        out.seal();
        let mut text = Vec::new();
        while bytes::Buf::has_remaining(out) {
            let chunk = bytes::Buf::chunk(out).to_vec();
            bytes::Buf::advance(out, chunk.len());
            text.extend(chunk);
        }
        String::from_utf8(text).unwrap()
    }

    fn failed(server: &str) -> BackendError {
        BackendError {
            server: server.into(),
            kind: BackendErrorKind::Timeout,
        }
    }

    #[test]
    fn one_server_gets_the_clients_own_bytes() {
        let mut r = retrieval(b"get a b\r\n", &[&[2], &[2]], false);
        let subs = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(subs.len(), 1);
        assert_eq!(subs[0].server, 2);
        assert_eq!(&subs[0].line[..], b"get a b\r\n");
        assert!(!r.has_unsent());
    }

    #[test]
    fn a_one_key_get_goes_as_its_own_bytes_and_a_retry_to_the_next_replica() {
        let mut r = retrieval(b"gat 10 a\r\n", &[&[3, 1]], false);
        let subs = r.next_chunk(100, &mut RecycledBuf::new(64));
        let sent: Vec<_> = subs.iter().map(|s| (s.id, s.server, &s.line[..])).collect();
        assert_eq!(sent, vec![(0, 3, &b"gat 10 a\r\n"[..])]);
        assert!(!r.has_unsent());
        r.on_done(0, Err(failed("s3")), || 0);
        let retry = r.next_chunk(100, &mut RecycledBuf::new(64));
        let sent: Vec<_> = retry
            .iter()
            .map(|s| (s.id, s.server, &s.line[..]))
            .collect();
        assert_eq!(sent, vec![(1, 1, &b"gat 10 a\r\n"[..])]);
        r.on_piece(1, value("a", "1"));
        r.on_done(1, Ok(Outcome::End), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "VALUE a 0 1\r\n1\r\nEND\r\n");
    }

    #[test]
    fn keys_split_by_server_merge_back_in_client_order() {
        let mut r = retrieval(
            b"gets c a b a d\r\n",
            &[&[1], &[0], &[1], &[0], &[0]],
            false,
        );
        let subs = r.next_chunk(100, &mut RecycledBuf::new(64));
        let lines: Vec<_> = subs.iter().map(|s| (s.server, s.line.clone())).collect();
        assert_eq!(
            lines,
            vec![
                (1, Bytes::from_static(b"gets c b\r\n")),
                (0, Bytes::from_static(b"gets a a d\r\n"))
            ]
        );
        let mut out = OutQueue::default();
        // Server 0 answers first; nothing can go out before `c` is settled.
        r.on_piece(1, value("a", "1"));
        r.on_piece(1, value("a", "1"));
        r.on_done(1, Ok(Outcome::End), || 0);
        assert!(!r.emit(&mut out));
        assert_eq!(drain(&mut out), "");
        r.on_piece(0, value("c", "3"));
        assert!(!r.emit(&mut out));
        assert_eq!(drain(&mut out), "VALUE c 0 1\r\n3\r\nVALUE a 0 1\r\n1\r\n");
        r.on_done(0, Ok(Outcome::End), || 0);
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "VALUE a 0 1\r\n1\r\nEND\r\n");
        assert_eq!(r.counts(), (5, 3));
        assert_eq!(r.held_bytes(), 0);
    }

    /// `line` planned in `reuse`'s kept storage (when it has some), key `i`
    /// owned by `owners[i]`.
    fn planned_in(reuse: &mut Reuse, line: &'static [u8], owners: &[usize]) -> Box<Retrieval> {
        let (request, bytes) = request(line);
        let mut r = reuse.retrievals.pop().unwrap_or_default();
        r.reset(&request, bytes, false);
        r.candidates
            .extend(owners.iter().map(|&s| Servers::from_slice(&[s])));
        r
    }

    #[test]
    fn lines_for_several_servers_are_built_in_the_callers_buffer_and_reuse_it() {
        let mut lines = RecycledBuf::new(64);
        let mut first_line_at = None;
        let mut reuse = Reuse::default();
        for round in 0..6 {
            let mut r = planned_in(&mut reuse, b"gat 10 a b c d\r\n", &[0, 1, 0, 2]);
            let subs = r.next_chunk(100, &mut lines);
            let sent: Vec<_> = subs.iter().map(|s| (s.server, &s.line[..])).collect();
            assert_eq!(
                sent,
                vec![
                    (0, &b"gat 10 a c\r\n"[..]),
                    (1, &b"gat 10 b\r\n"[..]),
                    (2, &b"gat 10 d\r\n"[..]),
                ],
                "round {round}"
            );
            // Sent and dropped, as a connection does once it has copied
            // them: every round's lines go into the first round's 64 bytes.
            let start = *first_line_at.get_or_insert(subs[0].line.as_ptr() as usize);
            for sub in &subs {
                let at = sub.line.as_ptr() as usize;
                assert!((start..start + 64).contains(&at), "round {round}");
            }
            drop(subs);
            reuse.keep(r, 1, 256);
        }
    }

    #[test]
    fn a_kept_retrieval_reuses_the_key_list_of_a_sub_with_many_keys() {
        let mut reuse = Reuse::default();
        let mut seen = None;
        let mut decoys = Vec::new();
        for round in 0..3 {
            let mut r = planned_in(&mut reuse, b"get a b c d e f g h i j\r\n", &[0; 10]);
            assert_eq!(r.next_chunk(100, &mut RecycledBuf::new(64)).len(), 1);
            let keys = &r.subs[0].keys;
            assert!(keys.spilled());
            assert_eq!(
                *seen.get_or_insert(keys.as_ptr()),
                keys.as_ptr(),
                "round {round}"
            );
            reuse.keep(r, 1, 256);
            // Takes a list of that size the allocator may have just got
            // back, so that a new one would be elsewhere.
            decoys.push(Vec::<u32>::with_capacity(10));
        }
    }

    #[test]
    fn a_retrieval_with_room_for_more_keys_than_allowed_is_not_kept() {
        let mut reuse = Reuse::default();
        let mut line = b"get".to_vec();
        for i in 0..20 {
            line.extend(format!(" k{i}").as_bytes());
        }
        line.extend(b"\r\n");
        let line: &'static [u8] = Vec::leak(line);
        let long = planned_in(&mut reuse, line, &[0; 20]);
        reuse.keep(long, 4, 10);
        assert!(reuse.retrievals.is_empty(), "room for 20 keys, 10 allowed");
        let short = planned_in(&mut reuse, b"get a b\r\n", &[0; 2]);
        reuse.keep(short, 4, 10);
        assert_eq!(reuse.retrievals.len(), 1);
    }

    #[test]
    fn kept_storage_plans_the_next_retrieval_as_new() {
        // A retrieval left half done: values held, an error, keys unsent.
        let mut kept = Box::new(retrieval(
            b"gets c a b a d\r\n",
            &[&[1], &[0], &[1], &[0], &[0]],
            false,
        ));
        let subs = kept.next_chunk(2, &mut RecycledBuf::new(64));
        kept.on_piece(subs[0].id, value("c", "3"));
        kept.on_done(subs[1].id, Err(failed("s0")), || 0);
        let mut reuse = Reuse::default();
        reuse.keep(kept, 1, 256);
        let mut again = reuse.retrievals.pop().unwrap();
        assert_eq!(again.held_bytes(), 0);
        assert!(!again.has_unsent());
        let (request, bytes) = request(b"get x y\r\n");
        again.reset(&request, bytes, false);
        again
            .candidates
            .extend([Servers::from_slice(&[3]), Servers::from_slice(&[4])]);
        let subs = again.next_chunk(100, &mut RecycledBuf::new(64));
        let lines: Vec<_> = subs.iter().map(|s| (s.server, s.line.clone())).collect();
        assert_eq!(
            lines,
            vec![
                (3, Bytes::from_static(b"get x\r\n")),
                (4, Bytes::from_static(b"get y\r\n"))
            ]
        );
        again.on_piece(subs[1].id, value("y", "2"));
        again.on_done(subs[1].id, Ok(Outcome::End), || 0);
        again.on_done(subs[0].id, Ok(Outcome::End), || 0);
        let mut out = OutQueue::default();
        assert!(again.emit(&mut out));
        assert_eq!(drain(&mut out), "VALUE y 0 1\r\n2\r\nEND\r\n");
        assert_eq!(again.counts(), (2, 1));
    }

    #[test]
    fn large_retrievals_go_out_in_chunks_in_key_order() {
        let mut r = retrieval(b"get a b c d e\r\n", &[&[0], &[1], &[0], &[1], &[0]], false);
        let first = r.next_chunk(2, &mut RecycledBuf::new(64));
        assert_eq!(first.len(), 2);
        assert_eq!(r.unsent_keys(), 3);
        let second = r.next_chunk(2, &mut RecycledBuf::new(64));
        assert_eq!(&second[0].line[..], b"get c\r\n");
        assert_eq!(&second[1].line[..], b"get d\r\n");
        let third = r.next_chunk(2, &mut RecycledBuf::new(64));
        assert_eq!(&third[0].line[..], b"get e\r\n");
        assert!(!r.has_unsent());
    }

    #[test]
    fn sub_request_lines_stay_under_the_bound() {
        let mut line = b"gat 10".to_vec();
        for i in 0..3000 {
            line.extend(format!(" key:{i:05}").as_bytes());
        }
        line.extend(b"\r\n");
        let bytes = Bytes::from(line);
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        let candidates = vec![Servers::from_slice(&[0]); 3000];
        let mut r = Retrieval::with_candidates(&request, bytes, candidates, false);
        let mut keys = 0;
        while r.has_unsent() {
            for sub in r.next_chunk(MAX_CHUNK_KEYS, &mut RecycledBuf::new(64)) {
                assert!(sub.line.len() <= MAX_SUB_LINE_BYTES, "{}", sub.line.len());
                assert!(sub.line.starts_with(b"gat 10 "));
                keys += sub.line.split(|&b| b == b' ').count() - 2;
            }
        }
        assert_eq!(keys, 3000);
    }

    #[test]
    fn failed_keys_fall_through_to_the_next_replica() {
        let mut r = retrieval(b"get a b\r\n", &[&[0, 1], &[1, 0]], false);
        let subs = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(subs.len(), 2);
        r.on_done(0, Err(failed("s0")), || 0);
        assert!(r.has_unsent());
        let retry = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(
            (retry[0].server, &retry[0].line[..]),
            (1, &b"get a\r\n"[..])
        );
        r.on_piece(1, value("b", "2"));
        r.on_done(1, Ok(Outcome::End), || 0);
        r.on_piece(retry[0].id, value("a", "1"));
        r.on_done(retry[0].id, Ok(Outcome::End), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(
            drain(&mut out),
            "VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nEND\r\n"
        );
    }

    #[test]
    fn misses_fall_through_only_when_asked() {
        let mut plain = retrieval(b"get a\r\n", &[&[0, 1]], false);
        plain.next_chunk(100, &mut RecycledBuf::new(64));
        plain.on_done(0, Ok(Outcome::End), || 0);
        assert!(!plain.has_unsent());
        let mut through = retrieval(b"get a\r\n", &[&[0, 1]], true);
        through.next_chunk(100, &mut RecycledBuf::new(64));
        through.on_done(0, Ok(Outcome::End), || 0);
        assert!(through.has_unsent());
    }

    #[test]
    fn every_server_failing_is_an_error_some_failing_is_a_miss() {
        let mut all = retrieval(b"get a b\r\n", &[&[0], &[1]], false);
        all.next_chunk(100, &mut RecycledBuf::new(64));
        all.on_done(0, Err(failed("s0")), || 0);
        all.on_done(1, Err(failed("s1")), || 0);
        let mut out = OutQueue::default();
        assert!(all.emit(&mut out));
        assert!(drain(&mut out).starts_with("SERVER_ERROR backend s0"));
        assert_eq!(all.counts(), (0, 0), "an error is no miss");

        let mut some = retrieval(b"get a b\r\n", &[&[0], &[1]], false);
        some.next_chunk(100, &mut RecycledBuf::new(64));
        some.on_done(0, Err(failed("s0")), || 0);
        some.on_piece(1, value("b", "2"));
        some.on_done(1, Ok(Outcome::End), || 0);
        assert!(some.emit(&mut out));
        assert_eq!(drain(&mut out), "VALUE b 0 1\r\n2\r\nEND\r\n");
        assert_eq!(some.counts(), (2, 1), "the client saw a miss for a");
    }

    #[test]
    fn one_servers_error_line_is_passed_on() {
        let mut r = retrieval(b"get a\r\n", &[&[0]], false);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_piece(
            0,
            Got::Line(Bytes::from_static(b"SERVER_ERROR out of memory\r\n")),
        );
        r.on_done(0, Ok(Outcome::ServerError), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "SERVER_ERROR out of memory\r\n");
        assert_eq!(r.counts(), (0, 0));
    }

    #[test]
    fn keys_without_servers_are_misses() {
        let mut r = retrieval(b"get a\r\n", &[&[]], false);
        assert!(r.next_chunk(100, &mut RecycledBuf::new(64)).is_empty());
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "END\r\n");
    }

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(crate::protocol::outcome::Reply::from_static(reply))
    }

    #[test]
    fn two_alike_of_three_answer_without_waiting_for_the_third() {
        let stored = ok(b"STORED\r\n");
        assert_eq!(
            decide(&[Some(&stored), None, Some(&stored)], 2),
            Decision::Answer(Reply::from_static(b"STORED\r\n"))
        );
        assert_eq!(decide(&[Some(&stored), None, None], 2), Decision::Wait);
    }

    #[test]
    fn two_failures_of_three_fail_at_once_naming_them() {
        let (a, b) = (Err(failed("a")), Err(failed("b")));
        assert_eq!(
            decide(&[Some(&a), None, Some(&b)], 2),
            Decision::Fail(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn disagreeing_replies_answer_the_owners_once_all_are_in() {
        let (stored, not_stored) = (ok(b"STORED\r\n"), ok(b"NOT_STORED\r\n"));
        assert_eq!(
            decide(&[Some(&not_stored), Some(&stored), None], 2),
            Decision::Wait
        );
        let error = Err(failed("c"));
        assert_eq!(
            decide(&[Some(&not_stored), Some(&stored), Some(&error)], 2),
            Decision::Answer(Reply::from_static(b"NOT_STORED\r\n"))
        );
    }

    #[test]
    fn a_write_every_replica_refused_answers_memcacheds_words() {
        let refused = ok(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        let Ok(words) = &refused else { unreachable!() };
        assert_eq!(
            decide(
                &[Some(&refused), Some(&refused), Some(&Err(failed("c")))],
                2
            ),
            Decision::Answer(words.clone())
        );
        assert_eq!(
            decide(&[Some(&Err(failed("a"))), Some(&refused), None], 2),
            Decision::Answer(words.clone())
        );
    }

    #[test]
    fn server_error_replies_do_not_count_toward_a_quorum() {
        let (stored, error) = (ok(b"STORED\r\n"), ok(b"SERVER_ERROR out of memory\r\n"));
        assert_eq!(
            decide(&[Some(&error), Some(&error), Some(&stored)], 2),
            Decision::Fail(vec![])
        );
    }

    #[test]
    fn broadcast_names_the_servers_that_did_not_answer() {
        let (good, bad) = (ok(b"OK\r\n"), Err(failed("b")));
        assert_eq!(
            broadcast_answer([("a", &good), ("b", &bad)].into_iter()),
            Broadcast::Failed(vec!["b"])
        );
        assert_eq!(
            broadcast_answer([("a", &good)].into_iter()),
            Broadcast::AllOk
        );
    }

    #[test]
    fn a_broadcast_a_server_refused_answers_memcacheds_words() {
        let (good, down) = (ok(b"OK\r\n"), Err(failed("b")));
        let refused = ok(b"CLIENT_ERROR flush_all not allowed\r\n");
        let server_error = ok(b"SERVER_ERROR out of memory\r\n");
        let Ok(words) = &refused else { unreachable!() };
        assert_eq!(
            broadcast_answer(
                [
                    ("a", &down),
                    ("b", &server_error),
                    ("c", &refused),
                    ("d", &good)
                ]
                .into_iter()
            ),
            Broadcast::Refused(words)
        );
        let Ok(words) = &server_error else {
            unreachable!()
        };
        assert_eq!(
            broadcast_answer([("a", &good), ("b", &server_error)].into_iter()),
            Broadcast::Refused(words)
        );
    }

    #[test]
    fn a_meta_copy_drops_cas_and_quiet_and_keeps_the_rest() {
        use crate::protocol::meta::parse_meta;
        let bytes = Bytes::from_static(b"ms k 3 T10 C99 q Oab F5\r\nabc\r\n");
        let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
        assert_eq!(
            &meta_copy(&request, &bytes)[..],
            b"ms k 3 T10 Oab F5\r\nabc\r\n"
        );
        let bytes = Bytes::from_static(b"md k C12 q\r\n");
        let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
        assert_eq!(&meta_copy(&request, &bytes)[..], b"md k\r\n");
    }

    /// The planner names a moved key's hand-off steps by command, without
    /// any socket: the same machine runs them for both dialects.
    #[test]
    fn meta_requests_on_moved_keys_plan_the_hand_off_steps_by_command() {
        use crate::plan::handoff::MetaMove;
        let (_runtime, old, new) = crate::pools::topology::tests::four_then_five();
        let owner = |t: &Topology, key: &str| t.owner_index(key.as_bytes()).unwrap();
        let moved = key_that(false, &old, &new);
        let stays = key_that(true, &old, &new);
        let plan = |line: String| {
            let bytes = Bytes::from(line);
            let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
            plan_meta(
                &request,
                &bytes,
                &request.routing_key(&bytes),
                &new,
                &HealthView::NONE,
                &mut Reuse::default(),
            )
        };
        // The plan holds the hand-off machine; the steps it was made for
        // are `meta_move`'s.
        let steps = |line: &str| {
            let line = line.replace("KEY", &moved);
            match plan(line.clone()) {
                Plan::Key(Placement::Moved {
                    owner: o, steps, ..
                }) => {
                    assert_eq!(o, owner(&new, &moved), "{line}");
                    assert_eq!(steps.copies(), crate::plan::handoff::Copies::ThroughLease);
                }
                other => panic!("{line}: {other:?}"),
            }
            let bytes = Bytes::from(line);
            let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
            meta_move(&request, &bytes).expect("a moved key's steps")
        };
        assert!(matches!(steps("mg KEY v\r\n"), MetaMove::Read { .. }));
        assert!(matches!(steps("md KEY\r\n"), MetaMove::Delete));
        assert!(matches!(steps("ms KEY 1\r\nx\r\n"), MetaMove::Overwrite));
        assert!(matches!(
            steps("ms KEY 1 C5\r\nx\r\n"),
            MetaMove::Cas { .. }
        ));
        assert!(matches!(
            steps("ms KEY 1 MA\r\nx\r\n"),
            MetaMove::RetryAfterCopy { replaces: false }
        ));
        // A replace, or a compare by cas in another mode, looks at the new
        // owner first; a key token that begins with `C` is no `C` flag.
        assert!(matches!(
            steps("ms KEY 1 MR\r\nx\r\n"),
            MetaMove::RetryAfterCopy { replaces: true }
        ));
        assert!(matches!(
            steps("ms KEY 1 MP C5\r\nx\r\n"),
            MetaMove::RetryAfterCopy { replaces: true }
        ));
        assert!(matches!(steps("ms KEY 1 ME\r\nx\r\n"), MetaMove::CopyFirst));
        assert!(matches!(
            steps("ma KEY\r\n"),
            MetaMove::RetryAfterCopy { replaces: false }
        ));
        assert!(matches!(steps("ma KEY N0\r\n"), MetaMove::CopyFirst));
        assert!(matches!(
            steps("mg KEY T30 v\r\n"),
            MetaMove::RetryAfterCopy { replaces: false }
        ));
        // A key token that begins with `C` is no `C` flag: its `ms … MA`
        // runs on the new owner at once, where a replace looks first.
        let c_moved = (0..2000)
            .map(|i| format!("C{i}"))
            .find(|k| new.backends[owner(&new, k)].name() != old.backends[owner(&old, k)].name())
            .unwrap();
        for (line, looks_first) in [
            (format!("ms {c_moved} 1 MA\r\nx\r\n"), false),
            (format!("ms {c_moved} 1 MR\r\nx\r\n"), true),
        ] {
            let Plan::Key(Placement::Moved { mut steps, .. }) = plan(line.clone()) else {
                panic!("{line}: not moved");
            };
            let crate::plan::handoff::Step::Send { lines, .. } = steps.start() else {
                panic!("{line}: answered at once");
            };
            assert_eq!(lines[0] != line.as_bytes(), looks_first, "{line}");
        }
        // A lease goes to the new owner alone (in a window, as the lease
        // retry), as does a key that stays.
        assert!(matches!(
            plan(format!("mg {moved} N30 v\r\n")),
            Plan::Lease { server, .. } if server == owner(&new, &moved)
        ));
        assert!(matches!(
            plan(format!("md {stays}\r\n")),
            Plan::Lease { server, .. } if server == owner(&new, &stays)
        ));
        // The read-through asks the previous owner for what a copy needs.
        let MetaMove::Read { wire, .. } = steps("mg KEY v q\r\n") else {
            unreachable!()
        };
        assert_eq!(
            wire.concat(),
            format!("mg {moved} v q f t\r\nmn\r\n").into_bytes()
        );
    }

    #[test]
    fn a_warming_server_gets_repeatable_meta_writes_and_loses_the_key_for_others() {
        let (_runtime, topology) = crate::pools::topology::tests::four_and_one_warming("");
        let mut warming = Servers::new();
        let key = (0..2000)
            .map(|i| format!("k{i}"))
            .find(|k| {
                topology.warming_replicas(k.as_bytes(), &mut warming);
                !warming.is_empty()
            })
            .unwrap();
        let plan = |line: &str| {
            let bytes = Bytes::from(line.replace("KEY", &key));
            let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
            plan_meta(
                &request,
                &bytes,
                &request.routing_key(&bytes),
                &topology,
                &HealthView::NONE,
                &mut Reuse::default(),
            )
        };
        let warm_and_forget = |line: &str| match plan(line) {
            Plan::Key(Placement::Quorum(write)) => {
                assert_eq!(write.servers.last(), Some(&4), "{line}");
                (write.warm, write.forget)
            }
            other => panic!("{line}: {other:?}"),
        };
        for line in [
            "ms KEY 2 T0\r\nab\r\n",
            "ms KEY 2 MS\r\nab\r\n",
            "md KEY q\r\n",
        ] {
            assert_eq!(warm_and_forget(line), (1, 0), "{line}");
        }
        for line in [
            "ms KEY 2 MA\r\nab\r\n",
            "ms KEY 2 ME\r\nab\r\n",
            "ms KEY 2 C5\r\nab\r\n",
            "md KEY C5\r\n",
            "ma KEY\r\n",
            "ma KEY N0\r\n",
        ] {
            assert_eq!(warm_and_forget(line), (0, 1), "{line}");
        }
        // Reads never go there.
        for line in ["mg KEY v\r\n", "mg KEY v N30\r\n", "me KEY\r\n"] {
            let server = match plan(line) {
                Plan::Key(Placement::Owner { server, .. }) => server,
                Plan::Retrieve(mg) => mg.owner(0).unwrap(),
                other => panic!("{line}: {other:?}"),
            };
            assert_ne!(server, 4, "{line}");
        }
    }

    /// A retrieval with `zone_fallback = "all_at_once"` over `owners`
    /// (each key's first candidate its local replica).
    fn all_at_once(line: &'static [u8], owners: &[&[usize]]) -> Retrieval {
        let mut r = retrieval(line, owners, true);
        r.all_at_once = true;
        r.asks.resize(owners.len(), 0);
        r
    }

    /// The sub-request ids of `subs` by server.
    fn ids(subs: &[SubRequest]) -> Vec<(usize, u32)> {
        subs.iter().map(|s| (s.server, s.id)).collect()
    }

    #[test]
    fn all_at_once_asks_every_other_replica_together_and_takes_the_first_hit() {
        let mut r = all_at_once(b"get a b\r\n", &[&[0, 1, 2], &[0, 2, 1]]);
        let first = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(ids(&first), [(0, 0)]);
        // The local replica misses both: each is asked of 1 and 2 at once.
        r.on_done(0, Ok(Outcome::End), || 0);
        let fan = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(ids(&fan), [(1, 1), (2, 2)]);
        assert!(fan.iter().all(|s| &s.line[..] == b"get a b\r\n"));
        assert!(!r.has_unsent());
        // Server 2 answers first: a's value, b missing there.
        r.on_piece(2, value("a", "from-2"));
        r.on_done(2, Ok(Outcome::End), || 0);
        assert!(!r.settled(), "b waits for server 1");
        // Server 1's a comes too late and is dropped; its b answers.
        r.on_piece(1, value("a", "from-1"));
        r.on_piece(1, value("b", "from-1"));
        r.on_done(1, Ok(Outcome::End), || 0);
        assert!(r.settled());
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(
            drain(&mut out),
            "VALUE a 0 6\r\nfrom-2\r\nVALUE b 0 6\r\nfrom-1\r\nEND\r\n"
        );
        assert_eq!(r.held_bytes(), 0);
        assert_eq!(r.counts(), (2, 2));
    }

    #[test]
    fn all_at_once_answers_before_a_slow_replica_and_misses_only_when_all_missed() {
        // A hit while another replica is still out: settled, answered.
        let mut r = all_at_once(b"get a\r\n", &[&[0, 1, 2]]);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_done(0, Err(failed("s0")), || 0);
        let fan = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(ids(&fan), [(1, 1), (2, 2)]);
        r.on_piece(2, value("a", "1"));
        assert!(r.settled(), "server 1 is not waited for");
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "VALUE a 0 1\r\n1\r\nEND\r\n");
        // A miss and a failure: a miss, once both answered.
        let mut r = all_at_once(b"get a\r\n", &[&[0, 1, 2]]);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_done(0, Err(failed("s0")), || 0);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_done(1, Ok(Outcome::End), || 0);
        assert!(!r.settled());
        r.on_done(2, Err(failed("s2")), || 0);
        assert!(r.settled());
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "END\r\n");
        // Every replica failed: the error.
        let mut r = all_at_once(b"get a\r\n", &[&[0, 1, 2]]);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_done(0, Err(failed("s0")), || 0);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_done(2, Err(failed("s2")), || 0);
        r.on_done(1, Err(failed("s1")), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert!(drain(&mut out).starts_with("SERVER_ERROR"));
    }

    /// `line` (an `mg`) planned as a one-key retrieval asking `server`.
    fn meta_get(line: &'static [u8], server: usize) -> Retrieval {
        let bytes = Bytes::from_static(line);
        let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
        let mut r = Retrieval::default();
        r.plan_meta_get(&request, bytes, server, None);
        r
    }

    #[test]
    fn an_mg_goes_as_the_clients_bytes_and_answers_the_servers_reply_as_it_came() {
        let mut r = meta_get(b"mg foo v k Oab\r\n", 2);
        assert!(r.is_meta() && !r.quiet());
        let mut subs = r.next_chunk(100, &mut RecycledBuf::new(64));
        let sent: Vec<_> = subs.iter().map(|s| (s.id, s.server, &s.line[..])).collect();
        assert_eq!(sent, vec![(0, 2, &b"mg foo v k Oab\r\n"[..])]);
        assert_eq!(
            r.expect_of(&mut subs[0]),
            Expect::meta(MetaCommand::Get, false)
        );
        assert!(!r.has_unsent());
        let reply = "VA 2 kfoo Oab\r\nhi\r\n";
        r.on_piece(0, Got::Line(Bytes::from_static(reply.as_bytes())));
        let mut out = OutQueue::default();
        assert!(!r.emit(&mut out), "not answered yet");
        r.on_done(0, Ok(Outcome::Va), || 0);
        assert_eq!(r.held_bytes(), reply.len(), "held until written");
        assert!(r.emit(&mut out));
        assert_eq!(r.held_bytes(), 0);
        // As the server said it: no `VALUE`, no `END`.
        assert_eq!(drain(&mut out), reply);
        assert_eq!(r.said(), Outcome::Va);
        assert_eq!(r.largest_block(), reply.len());
        assert!(!r.brought_no_value());
        assert!(matches!(r.meta_answer(), Some(Ok(answer)) if answer.outcome == Outcome::Va));
        // Its miss is memcached's too.
        let mut r = meta_get(b"mg foo v\r\n", 0);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_piece(0, Got::Line(Bytes::from_static(b"EN\r\n")));
        r.on_done(0, Ok(Outcome::En), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "EN\r\n");
        assert_eq!(r.said(), Outcome::En);
        assert!(r.brought_no_value());
    }

    #[test]
    fn a_quiet_mg_is_framed_up_to_its_mn_and_says_nothing_on_a_miss() {
        let mut r = meta_get(b"mg foo v q\r\n", 1);
        assert!(r.quiet());
        let mut subs = r.next_chunk(100, &mut RecycledBuf::new(64));
        assert_eq!(
            r.expect_of(&mut subs[0]),
            Expect::meta(MetaCommand::Get, true)
        );
        // Nothing came before the `MN`.
        r.on_done(0, Ok(Outcome::Nothing), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "");
        assert_eq!(r.said(), Outcome::Nothing);
        assert!(r.brought_no_value());
        // A hit comes as the one piece before the `MN`.
        let mut r = meta_get(b"mg foo v q\r\n", 1);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_piece(0, Got::Value(Bytes::from_static(b"VA 1\r\nx\r\n")));
        r.on_done(0, Ok(Outcome::Va), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "VA 1\r\nx\r\n");
    }

    #[test]
    fn an_mg_whose_server_failed_answers_the_error_and_asks_no_other() {
        let mut r = meta_get(b"mg foo v\r\n", 3);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_done(0, Err(failed("s3")), || 0);
        assert!(!r.has_unsent());
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert!(drain(&mut out).starts_with("SERVER_ERROR"));
        assert_eq!(r.said(), Outcome::ServerError);
        assert!(matches!(r.meta_answer(), Some(Err(_))));
        // memcached's own refusal is the client's, as it came.
        let mut r = meta_get(b"mg foo v\r\n", 3);
        r.next_chunk(100, &mut RecycledBuf::new(64));
        r.on_piece(0, Got::Line(Bytes::from_static(b"CLIENT_ERROR bad\r\n")));
        r.on_done(0, Ok(Outcome::ClientError), || 0);
        let mut out = OutQueue::default();
        assert!(r.emit(&mut out));
        assert_eq!(drain(&mut out), "CLIENT_ERROR bad\r\n");
    }

    #[test]
    fn kept_storage_serves_an_mg_then_a_get_without_mixing_dialects() {
        let mut reuse = Reuse::default();
        let bytes = Bytes::from_static(b"mg foo v\r\n");
        let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
        let mut mg = reuse.meta_get(&request, &bytes, 1, Some(7));
        assert_eq!((mg.owner(0), mg.key_hash(0)), (Some(1), Some(7)));
        mg.next_chunk(100, &mut RecycledBuf::new(64));
        mg.on_done(0, Ok(Outcome::Nothing), || 0);
        let storage = &*mg as *const Retrieval;
        reuse.keep(mg, 4, 32);
        let mut get = planned_in(&mut reuse, b"get a\r\n", &[0]);
        assert_eq!(&*get as *const Retrieval, storage, "the kept box");
        assert!(!get.is_meta() && get.meta_answer().is_none());
        get.next_chunk(100, &mut RecycledBuf::new(64));
        get.on_done(0, Ok(Outcome::End), || 0);
        let mut out = OutQueue::default();
        assert!(get.emit(&mut out));
        assert_eq!(drain(&mut out), "END\r\n");
    }

    #[test]
    fn a_plain_mg_is_planned_as_a_retrieval_and_other_meta_requests_on_one_key() {
        let (_runtime, old, new) = crate::pools::topology::tests::four_then_five();
        let plan = |line: &str, topology: &Topology| {
            let bytes = Bytes::from(line.to_string());
            let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
            let key = request.routing_key(&bytes);
            plan_meta(
                &request,
                &bytes,
                &key,
                topology,
                &HealthView::NONE,
                &mut Reuse::default(),
            )
        };
        let owner = old.owner_index(b"foo").unwrap();
        for line in ["mg foo v\r\n", "mg foo v q k\r\n", "mg foo N30 T10\r\n"] {
            match plan(line, &old) {
                Plan::Retrieve(mg) => {
                    assert!(mg.is_meta(), "{line}");
                    assert_eq!(mg.owner(0), Some(owner), "{line}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(matches!(
            plan("ms foo 1\r\nx\r\n", &old),
            Plan::Key(Placement::Owner { .. })
        ));
        // In a window, a key that stayed is read of its owner alone; one
        // that may meet a lease (`T`, `N`) is the lease retry on its owner,
        // and takes no kept storage.
        let stays = key_that(true, &old, &new);
        assert!(matches!(
            plan(&format!("mg {stays} v\r\n"), &new),
            Plan::Retrieve(_)
        ));
        let owner = new.owner_index(stays.as_bytes()).unwrap();
        for line in [
            format!("mg {stays} v T30\r\n"),
            format!("mg {stays} N30\r\n"),
        ] {
            let bytes = Bytes::from(line.clone());
            let (request, _) = parse_meta(&bytes, &Limits::default()).unwrap().unwrap();
            let mut reuse = Reuse::default();
            reuse.keep(Box::default(), 4, 32);
            let planned = plan_meta(
                &request,
                &bytes,
                &request.routing_key(&bytes),
                &new,
                &HealthView::NONE,
                &mut reuse,
            );
            assert!(
                matches!(planned, Plan::Lease { server, .. } if server == owner),
                "{line}: {planned:?}"
            );
            assert_eq!(reuse.retrievals.len(), 1, "{line}: the kept storage stays");
            // Outside a window the same `mg` is a plain one-key retrieval.
            assert!(matches!(plan(&line, &old), Plan::Retrieve(_)), "{line}");
        }
        // Other meta requests on one owner: the lease retry in a window when
        // a lease would mislead them, forwarded to the owner otherwise.
        for line in [
            format!("ma {stays}\r\n"),
            format!("ms {stays} 1 ME\r\nx\r\n"),
            format!("md {stays}\r\n"),
        ] {
            let planned = plan(&line, &new);
            assert!(
                matches!(planned, Plan::Lease { server, .. } if server == owner),
                "{line}: {planned:?}"
            );
            let planned = plan(&line, &old);
            assert!(
                matches!(planned, Plan::Key(Placement::Owner { .. })),
                "{line}: {planned:?}"
            );
        }
        assert!(matches!(
            plan(&format!("ms {stays} 1\r\nx\r\n"), &new),
            Plan::Key(Placement::Owner { server, .. }) if server == owner
        ));
        // With replicas an `mg` reads them (`meta_read`, on steps).
        let (_runtime, replicated, _) =
            crate::pools::topology::tests::four_then_five_with("replicas = 2\n");
        assert!(matches!(
            plan("mg foo v\r\n", &replicated),
            Plan::Key(Placement::ReadThrough { .. })
        ));
    }

    /// The first key `k<i>` whose owner is the same server in `new` as in
    /// `old` (`stays`), or another one.
    fn key_that(stays: bool, old: &Topology, new: &Topology) -> String {
        let owner = |t: &Topology, k: &str| t.owner_index(k.as_bytes()).unwrap();
        (0..2000)
            .map(|i| format!("k{i}"))
            .find(|k| {
                let same = new.backends[owner(new, k)].name() == old.backends[owner(old, k)].name();
                same == stays
            })
            .unwrap()
    }

    /// The classic request `line` planned on `topology` with `reuse`'s kept
    /// storage.
    fn plan_line(line: &str, topology: &Topology, reuse: &mut Reuse) -> Plan {
        let bytes = Bytes::from(line.to_string());
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        plan(&request, &bytes, topology, &HealthView::NONE, reuse)
    }

    #[test]
    fn a_plan_says_where_each_key_goes_as_the_hot_keys_count_it() {
        let (_runtime, old, new) = crate::pools::topology::tests::four_then_five();
        let plan =
            |line: &str, topology: &Topology| plan_line(line, topology, &mut Reuse::default());
        let owner = |t: &Topology, k: &str| t.owner_index(k.as_bytes()).unwrap();
        let stays = key_that(true, &old, &new);
        // A write to its owner: the owner, with the planner's hash; alone.
        let set = plan(&format!("set {stays} 0 0 1\r\nx\r\n"), &old);
        let Some((Some(server), Some(hash))) = set.key_target(0) else {
            panic!("{set:?}");
        };
        assert_eq!(server, owner(&old, &stays));
        assert!(set.owner_alone());
        assert_eq!(set.key_target(1), None);
        // In a window, as the lease retry: the same owner and hash, alone.
        let touch = plan(&format!("touch {stays} 10\r\n"), &new);
        assert!(matches!(touch, Plan::Lease { .. }), "{touch:?}");
        assert_eq!(
            touch.key_target(0),
            Some((Some(owner(&new, &stays)), Some(hash)))
        );
        assert!(touch.owner_alone());
        // A retrieval: each key's owner, in the client's order; never a
        // write to one owner alone.
        let keys = ["a", "b", "c", "d"];
        let get = plan(&format!("get {}\r\n", keys.join(" ")), &old);
        for (i, key) in keys.iter().enumerate() {
            let (server, _) = get.key_target(i).expect("a key of the get");
            assert_eq!(server, Some(owner(&old, key)), "{key}");
        }
        assert!(!get.owner_alone());
        // memring's own answers send no key anywhere.
        assert_eq!(plan("stats\r\n", &old).key_target(0), None);
        // With replicas a write is not the owner's alone.
        let (_runtime, replicated, _) =
            crate::pools::topology::tests::four_then_five_with("replicas = 2\n");
        let set = plan(&format!("set {stays} 0 0 1\r\nx\r\n"), &replicated);
        assert!(matches!(set.key_target(0), Some((Some(_), _))), "{set:?}");
        assert!(!set.owner_alone());
    }

    #[test]
    fn classic_commands_a_lease_would_mislead_are_planned_as_the_lease_retry_in_a_window() {
        let (_runtime, old, new) = crate::pools::topology::tests::four_then_five();
        let plan =
            |line: &str, topology: &Topology| plan_line(line, topology, &mut Reuse::default());
        let owner = |t: &Topology, k: &str| t.owner_index(k.as_bytes()).unwrap();
        let stays = key_that(true, &old, &new);
        let moved = key_that(false, &old, &new);
        let server = owner(&new, &stays);
        // The hash the hot keys count a key that stays by, as a `set` has it.
        let Plan::Key(Placement::Owner { hash, .. }) =
            plan(&format!("set {stays} 0 0 1\r\nx\r\n"), &new)
        else {
            panic!("a set of a key that stays goes to its owner");
        };
        assert!(hash.is_some());
        // A `set` meets no lease in a way it would not say; these would.
        for line in [
            format!("touch {stays} 10\r\n"),
            format!("incr {stays} 1\r\n"),
            format!("delete {stays}\r\n"),
            format!("delete {stays} noreply\r\n"),
            format!("add {stays} 0 0 1\r\nx\r\n"),
        ] {
            match plan(&line, &new) {
                Plan::Lease {
                    server: s,
                    hash: h,
                    retry,
                } => {
                    assert_eq!((s, h), (server, hash), "{line}");
                    assert!(!retry.is_retrieval(), "{line}");
                }
                other => panic!("{line}: {other:?}"),
            }
            // Outside a window the owner gets the request as it came.
            let planned = plan(&line, &old);
            assert!(
                matches!(planned, Plan::Key(Placement::Owner { .. })),
                "{line}: {planned:?}"
            );
        }
        // A `touch` goes as an `mg … T`, whose reply shows a lease.
        let Plan::Lease { retry, .. } = plan(&format!("touch {stays} 10\r\n"), &new) else {
            unreachable!()
        };
        let (wire, _) = retry.wire().expect("a touch goes as an mg");
        assert_eq!(wire, format!("mg {stays} T10 c\r\n").as_bytes());
        // A one-key `gat` asked of its owner alone is the lease retry too,
        // and gives back the kept storage its retrieval took.
        for line in [
            format!("gat 10 {stays}\r\n"),
            format!("gats 10 {stays}\r\n"),
        ] {
            let mut reuse = Reuse::default();
            reuse.keep(Box::default(), 4, 32);
            match plan_line(&line, &new, &mut reuse) {
                Plan::Lease {
                    server: s,
                    hash: h,
                    retry,
                } => {
                    assert_eq!((s, h), (server, hash), "{line}");
                    assert!(retry.is_retrieval(), "{line}");
                }
                other => panic!("{line}: {other:?}"),
            }
            assert_eq!(reuse.retrievals.len(), 1, "{line}: the kept storage stays");
            assert!(matches!(plan(&line, &old), Plan::Retrieve(_)), "{line}");
        }
        // None of these is: a `set`, a get, a `gat` of two keys, a moved
        // key's command (its hand-off machine, or its read-through).
        for line in [
            format!("set {stays} 0 0 1\r\nx\r\n"),
            format!("get {stays}\r\n"),
            format!("gat 10 {stays} {moved}\r\n"),
            format!("gat 10 {moved}\r\n"),
            format!("incr {moved} 1\r\n"),
            format!("touch {moved} 10\r\n"),
        ] {
            let planned = plan(&line, &new);
            assert!(
                !matches!(planned, Plan::Lease { .. }),
                "{line}: {planned:?}"
            );
        }
        assert!(matches!(
            plan(&format!("incr {moved} 1\r\n"), &new),
            Plan::Key(Placement::Moved { .. })
        ));
        // With replicas, a write is a quorum's, not the owner's alone.
        let (_runtime, _, replicated) =
            crate::pools::topology::tests::four_then_five_with("replicas = 2\n");
        let planned = plan(&format!("incr {stays} 1\r\n"), &replicated);
        assert!(
            !matches!(
                planned,
                Plan::Lease { .. } | Plan::Key(Placement::Owner { .. })
            ),
            "{planned:?}"
        );
    }
}
