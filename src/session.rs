//! One client connection: read → parse → plan → dispatch → replies in request
//! order. The I/O loop only: what goes where is decided by `route::plan`.
//!
//! Requests are parsed as they arrive and each becomes an entry in the
//! client's FIFO; entries are dispatched strictly in order (a later request
//! never reaches a server before an earlier one's last sub-request), and
//! replies are written in order, the head entry streaming its values as they
//! arrive.
//!
//! Meta commands (`mg` `ms` `md` `ma` `me`) take the same path, planned by
//! `route::plan_meta`; `mn` is answered in order by memring. A quiet (`q`)
//! meta request is sent with an `mn` behind it, so that memcached itself
//! decides which reply it leaves out and its `MN` marks where the reply ends.
//!
//! Every buffer has a bound. Up to `max_pending` requests are parsed ahead.
//! A request is dispatched only while the bytes the client is owed (replies
//! not yet written, and an estimate of the replies still to come) fit the
//! client's budget and the worker's share of the process-wide one; past it
//! memring stops reading from the client. A client owed bytes that reads
//! nothing for `write_timeout` is closed, as is one idle (or stuck halfway
//! through a request) for `idle_timeout`. Shutdown stops reading between
//! requests, and the replies already owed are still written.

use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::slot::{Got, Slot};
use crate::error::BackendError;
use crate::handoff::{copy_outcome, CopyOutcome, Moved, Owner, Step};
use crate::hotkeys::{GetShortcut, WriteGuard};
use crate::outbuf::OutQueue;
use crate::protocol::encode::{forwardable, write_server_error};
use crate::protocol::meta::{is_meta_request, parse_meta, MetaCommand, MetaRequest};
use crate::protocol::reply::{Expect, LineKind};
use crate::protocol::{parse_request, Command, Limits, Request};
use crate::route::{self, all_ok, decide, CallResult, Decision, MetaPlan, Plan, Retrieval};
use crate::shard::WorkerCtx;
use crate::topology::Topology;

/// First read buffer of a client: small, so that thousands of idle clients
/// cost little; it grows while a client sends more.
const FIRST_READ_BYTES: usize = 2 * 1024;
/// Room kept free before each read.
const MIN_READ_ROOM_BYTES: usize = 512;
/// Smallest reply size assumed for a key not yet answered.
const MIN_ESTIMATE_BYTES: usize = 1024;
/// What a one-line reply is assumed to cost.
const LINE_REPLY_BYTES: usize = 64;

/// Serves one client until it quits, disconnects, sends an unrecoverable line,
/// stops reading its replies, or shutdown is requested.
///
/// # Errors
/// Only client-side I/O errors, which end the session.
pub(crate) async fn run_session(
    mut stream: TcpStream,
    id: u64,
    worker: Rc<WorkerCtx>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.split();
    let mut client = ClientSession::new(id, worker.clone());
    let mut input = BytesMut::with_capacity(FIRST_READ_BYTES);
    let settings = worker.settings;
    let mut last_read = Instant::now();
    // When the incomplete request at the head of `input` began. The idle
    // timeout runs from here, not from the last read: a client trickling a
    // request byte by byte reads as busy but never completes it.
    let mut partial_since = Instant::now();
    let mut last_write = Instant::now();
    let result = loop {
        let unparsed = input.len();
        client.parse(&mut input);
        if input.len() < unparsed {
            partial_since = Instant::now();
        }
        client.count_out();
        client.pump();
        client.collect();
        client.count_out();
        if client.out.is_empty() {
            last_write = Instant::now();
        }
        client.out.seal();
        if client.closing && client.entries.is_empty() && client.out.is_empty() {
            break writer.shutdown().await;
        }
        let can_read = client.can_read();
        if can_read && input.capacity() - input.len() < MIN_READ_ROOM_BYTES {
            input.reserve(input.capacity().max(FIRST_READ_BYTES));
        }
        let idle = settings.idle_timeout.filter(|_| {
            // Idle and owed nothing, or stuck halfway through a request.
            (client.entries.is_empty() && client.out.is_empty()) || !input.is_empty()
        });
        let deadline = match (idle, client.out.has_remaining()) {
            (_, true) => Some(last_write + settings.write_timeout),
            (Some(idle), false) if input.is_empty() => Some(last_read + idle),
            (Some(idle), false) => Some(partial_since + idle),
            (None, false) => None,
        };
        tokio::select! {
            biased;
            () = client.wake.notified() => {}
            written = writer.write_buf(&mut client.out), if client.out.has_remaining() => {
                match written {
                    Ok(n) => {
                        worker.stats.written_bytes(n);
                        last_write = Instant::now();
                    }
                    Err(e) => break Err(e),
                }
            }
            read = reader.read_buf(&mut input), if can_read => {
                match read {
                    Ok(0) => client.closing = true,
                    Ok(n) => {
                        if n == input.len() {
                            // The first bytes of a new request.
                            partial_since = Instant::now();
                        }
                        worker.stats.read_bytes(n);
                    }
                    Err(e) => break Err(e),
                }
                last_read = Instant::now();
            }
            () = sleep_until_some(deadline), if deadline.is_some() => {
                // Idle, stuck mid-request, or not reading its replies.
                break Ok(());
            }
            () = worker.shutdown.cancelled(), if !client.closing => {
                client.closing = true;
            }
        }
    };
    client.release_all();
    result
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

struct ClientSession {
    /// Which connection of each server this client uses: always the same
    /// one, so its commands reach each server in the order sent.
    lane: usize,
    worker: Rc<WorkerCtx>,
    /// Woken by every reply slot of this client.
    wake: Rc<Notify>,
    entries: VecDeque<Entry>,
    /// Entries before this index have sent everything they will send.
    dispatched: usize,
    out: OutQueue,
    /// Reply bytes reserved for requests in flight and held for entries not
    /// yet at the head.
    owed: usize,
    /// Assumed reply size of one key not yet answered: starts at the largest
    /// value allowed and follows what this client's gets return.
    estimate: usize,
    /// No more requests will be read; close once the owed replies are written.
    closing: bool,
    /// Bytes of a refused value still to be thrown away as they arrive.
    discard: usize,
    /// Request bytes of entries not yet dispatched: they count against the
    /// budget too, or a client pipelining big `set`s would have up to
    /// `max_pending` values held here.
    parsed_bytes: usize,
    /// `noreply` requests written to servers and not yet answered, with the
    /// bytes reserved for them: without this, a client could queue writes
    /// on a server connection faster than the server takes them.
    unanswered: Vec<(SmallVec<[Rc<Slot>; 1]>, usize)>,
    /// Bytes of `out` included in the worker's `owed`.
    out_counted: usize,
    limits: Limits,
}

impl ClientSession {
    fn new(id: u64, worker: Rc<WorkerCtx>) -> ClientSession {
        let limits = worker.topology.load().limits();
        ClientSession {
            lane: id as usize,
            worker,
            wake: Rc::new(Notify::new()),
            entries: VecDeque::new(),
            dispatched: 0,
            out: OutQueue::default(),
            owed: 0,
            estimate: limits.max_value_bytes,
            closing: false,
            discard: 0,
            parsed_bytes: 0,
            unanswered: Vec::new(),
            out_counted: 0,
            limits,
        }
    }

    fn budget(&self) -> usize {
        self.worker
            .settings
            .client_buffer_bytes
            .unwrap_or(self.limits.max_value_bytes + crate::config::CLIENT_BUFFER_HEADROOM_BYTES)
    }

    fn can_read(&self) -> bool {
        !self.closing
            && self.entries.len() < self.worker.settings.max_pending
            && self.owed + self.out.len() + self.parsed_bytes <= self.budget()
    }

    /// Whether `cost` more bytes may be reserved now. A client with nothing
    /// in flight may always send one request, so every client progresses.
    fn may_reserve(&self, cost: usize) -> bool {
        let nothing_owed = self.owed == 0 && self.out.is_empty();
        nothing_owed
            || (self.owed + self.out.len() + cost <= self.budget()
                && self.worker.owed.get() + cost <= self.worker.budget)
    }

    fn reserve(&mut self, cost: usize) {
        self.owed += cost;
        self.worker.owed.set(self.worker.owed.get() + cost);
    }

    fn release(&mut self, cost: usize) {
        let cost = cost.min(self.owed);
        self.owed -= cost;
        self.worker
            .owed
            .set(self.worker.owed.get().saturating_sub(cost));
    }

    /// Gives back everything this client reserved (the session is ending).
    fn release_all(&mut self) {
        self.release(self.owed);
        let owed = self.worker.owed.get();
        self.worker.owed.set(owed.saturating_sub(self.out_counted));
        self.out_counted = 0;
    }

    /// Keeps the worker's count in step with the bytes waiting in this
    /// client's write queue: they are buffered replies too, and a client
    /// that does not read holds them for as long as it likes.
    fn count_out(&mut self) {
        let now = self.out.len();
        let owed = self.worker.owed.get();
        self.worker
            .owed
            .set((owed + now).saturating_sub(self.out_counted));
        self.out_counted = now;
    }

    /// Parses every complete request in `input` into entries, up to the
    /// pending bound.
    fn parse(&mut self, input: &mut BytesMut) {
        // Limits may change with a reload or when servers report their item
        // size; a copy is taken, no guard is held.
        self.limits = self.worker.topology.load().limits();
        while !self.closing && self.entries.len() < self.worker.settings.max_pending {
            if self.discard > 0 {
                let n = self.discard.min(input.len());
                input.advance(n);
                self.discard -= n;
                if self.discard > 0 {
                    return;
                }
            }
            if is_meta_request(input) {
                match parse_meta(input, &self.limits) {
                    Ok(None) => return,
                    Ok(Some((request, consumed))) => {
                        let bytes = input.split_to(consumed).freeze();
                        self.start_meta(request, bytes);
                    }
                    Err(rejection) => {
                        input.advance(rejection.consumed);
                        // Meta errors are never silenced by `q`.
                        self.reject(
                            Some(rejection.reply()),
                            rejection.discard,
                            rejection.keeps_connection(),
                        );
                    }
                }
                continue;
            }
            match parse_request(input, &self.limits) {
                Ok(None) => return,
                Ok(Some((request, consumed))) => {
                    let bytes = input.split_to(consumed).freeze();
                    self.start(request, bytes);
                }
                Err(rejection) => {
                    input.advance(rejection.consumed);
                    self.reject(
                        (!rejection.silent).then(|| rejection.error.reply()),
                        rejection.discard,
                        rejection.error.keeps_connection(),
                    );
                }
            }
        }
    }

    /// Answers a request the parser refused (`reply`, unless it is silent),
    /// throws away `discard` more bytes as they come, and closes the client
    /// once its earlier replies are written if the stream cannot be resumed.
    fn reject(&mut self, reply: Option<&'static [u8]>, discard: usize, keeps_connection: bool) {
        self.discard = discard;
        if let Some(reply) = reply {
            let topology = self.worker.topology.load_full();
            self.push(Entry::ready(reply, topology));
        }
        if !keeps_connection {
            self.closing = true;
        }
    }

    fn push(&mut self, entry: Entry) {
        self.parsed_bytes += entry.bytes.len();
        self.entries.push_back(entry);
    }

    /// Plans one request on the current topology and queues its entry.
    fn start(&mut self, request: Request, bytes: Bytes) {
        // One topology per request: it finishes on this ring even if a
        // reload lands meanwhile. `load_full` gives an owned Arc, so no
        // arc-swap guard is held.
        let topology = self.worker.topology.load_full();
        self.worker
            .stats
            .request(request.command, request.keys.len());
        let plan = route::plan(&request, &bytes, &topology);
        let hot = self
            .worker
            .hot
            .on_request(&request, &bytes, &plan, &topology);
        let work = match plan {
            Plan::Quit => {
                self.closing = true;
                return;
            }
            Plan::Reply(reply) if request.noreply => {
                let _ = reply;
                return;
            }
            Plan::Reply(reply) => Work::Ready(Bytes::from_static(reply)),
            Plan::NoServers if request.noreply => return,
            Plan::NoServers => Work::Ready(Bytes::from_static(route::NO_SERVERS)),
            Plan::Stats => Work::Stats,
            Plan::HotKeys => Work::Ready(self.worker.hot.report()),
            Plan::Forward { server } => Work::Lines {
                parts: smallvec::smallvec![Part::new(server)],
                finish: Finish::Forward,
            },
            Plan::Quorum { servers, quorum } => Work::Lines {
                parts: servers.into_iter().map(Part::new).collect(),
                finish: Finish::Quorum(quorum),
            },
            Plan::Broadcast { servers } => Work::Lines {
                parts: servers.into_iter().map(Part::new).collect(),
                finish: Finish::AllOk,
            },
            Plan::CasThenCopy { owner, copies } => Work::Cas {
                owner: Part::new(owner),
                copies: Some(copies),
            },
            Plan::Retrieve(retrieval) => Work::Retrieve {
                plan: retrieval,
                in_flight: SmallVec::new(),
                held: 0,
                copies: SmallVec::new(),
            },
            Plan::Moved { owner, previous } => {
                let as_set =
                    (request.command == Command::Cas).then(|| route::cas_as_set(&request, &bytes));
                match Moved::new(&request, &bytes, as_set) {
                    Some(machine) => Work::Moved(Box::new(MovedWork {
                        machine,
                        owner,
                        previous,
                        part: None,
                        copies: SmallVec::new(),
                        answer: None,
                    })),
                    None => Work::Lines {
                        parts: smallvec::smallvec![Part::new(owner)],
                        finish: Finish::Forward,
                    },
                }
            }
        };
        self.push(Entry {
            command: request.command,
            noreply: request.noreply,
            request,
            bytes,
            topology,
            work,
            sent: false,
            reserved: 0,
            started: Instant::now(),
            hot,
        });
    }

    /// Plans one meta request and queues its entry.
    fn start_meta(&mut self, request: MetaRequest, bytes: Bytes) {
        let topology = self.worker.topology.load_full();
        let command = Command::of_meta(request.command);
        self.worker
            .stats
            .request(command, usize::from(request.key.is_some()));
        let plan = route::plan_meta(&request, &bytes, &topology);
        let hot = self
            .worker
            .hot
            .on_meta_request(&request, &bytes, &plan, &topology);
        // A quiet request goes on with `q` and an `mn` behind it: memcached
        // then sends exactly the replies it would send the client, and `MN`
        // tells the connection that the rest was suppressed. A request
        // memcached refuses gets an error whatever `q` says.
        let quiet = request.may_be_silent() && request.backend_error.is_none();
        let mut wire: SmallVec<[Bytes; 3]> = smallvec::smallvec![bytes.clone()];
        if quiet {
            wire.push(Bytes::from_static(b"mn\r\n"));
        }
        let parts = |servers: &[usize]| servers.iter().map(|&s| Part::new(s)).collect();
        let mode = match plan {
            MetaPlan::Reply(reply) => {
                let mut entry = Entry::ready(reply, topology);
                entry.command = command;
                self.push(entry);
                return;
            }
            MetaPlan::NoServers => {
                let mut entry = Entry::ready(route::NO_SERVERS, topology);
                entry.command = command;
                self.push(entry);
                return;
            }
            MetaPlan::Forward { server } => (parts(&[server]), MetaMode::Forward),
            MetaPlan::Quorum { servers, quorum } => (parts(&servers), MetaMode::Quorum(quorum)),
            MetaPlan::CasThenCopy {
                owner,
                copies,
                copy,
            } => (
                parts(&[owner]),
                MetaMode::CasThenCopy {
                    copies: Some(copies),
                    copy,
                },
            ),
            MetaPlan::ReadThrough { servers, on_miss } => (
                parts(&servers[..1]),
                MetaMode::ReadThrough {
                    servers,
                    next: 1,
                    on_miss,
                },
            ),
        };
        let (parts, mode) = mode;
        let mut entry = Entry::ready(b"", topology);
        entry.command = command;
        entry.bytes = bytes;
        entry.sent = false;
        entry.hot = hot;
        entry.work = Work::Meta(Box::new(MetaWork {
            command: request.command,
            // Only `mg` with `v` can bring a large value back.
            value: request.command == MetaCommand::Get && request.value,
            expect: Expect::Meta {
                command: request.command,
                quiet,
                replied: false,
            },
            wire,
            parts,
            mode,
        }));
        self.push(entry);
    }

    /// Dispatches entries in order while the budget allows.
    fn pump(&mut self) {
        while self.dispatched < self.entries.len() {
            let index = self.dispatched;
            self.absorb(index);
            if !self.dispatch(index) {
                return;
            }
            self.parsed_bytes -= self.entries[index].bytes.len();
            self.dispatched += 1;
        }
    }

    /// Sends what entry `index` has to send now; true once it will send
    /// nothing more.
    fn dispatch(&mut self, index: usize) -> bool {
        let mut entry = self.entries.remove(index).expect("index in range");
        let complete = self.dispatch_entry(&mut entry);
        self.entries.insert(index, entry);
        complete
    }

    fn dispatch_entry(&mut self, entry: &mut Entry) -> bool {
        let topology = entry.topology.clone();
        match &mut entry.work {
            Work::Ready(_) | Work::Stats => true,
            Work::Lines { parts, .. } => {
                if entry.sent {
                    return true;
                }
                let cost = entry.bytes.len() + LINE_REPLY_BYTES * parts.len();
                if !self.may_reserve(cost) {
                    return false;
                }
                self.reserve(cost);
                entry.reserved = cost;
                let request = forwardable(&entry.bytes, &entry.request);
                let expect = entry.command.reply_line().unwrap_or(LineKind::Ok);
                for part in parts.iter_mut() {
                    // A `noreply` request's reply is awaited too (and then
                    // dropped), so that its bytes stay counted until the
                    // server has them: see `unanswered`.
                    let hot = entry.hot.as_ref();
                    self.send_line(&topology, part, &request, expect, true, hot);
                }
                entry.sent = true;
                true
            }
            Work::Cas { owner, copies } => {
                if !entry.sent {
                    let cost = entry.bytes.len() + LINE_REPLY_BYTES;
                    if !self.may_reserve(cost) {
                        return false;
                    }
                    self.reserve(cost);
                    entry.reserved = cost;
                    let request = forwardable(&entry.bytes, &entry.request);
                    let hot = entry.hot.as_ref();
                    self.send_line(&topology, owner, &request, LineKind::Storage, true, hot);
                    entry.sent = true;
                }
                // The copies go out before any later request of this client,
                // so a later write to the key cannot be overtaken by them.
                let Some(result) = &owner.result else {
                    return false;
                };
                if let Some(copies) = copies.take() {
                    if matches!(result, Ok(reply) if reply.as_ref() == b"STORED\r\n") {
                        let copy = route::cas_as_set(&entry.request, &entry.bytes);
                        for server in copies {
                            let mut part = Part::new(server);
                            // The client has its answer from the owner; a
                            // replica that fails here is counted by its
                            // backend and catches up on a later write.
                            self.send_line(
                                &topology,
                                &mut part,
                                &copy,
                                LineKind::Storage,
                                false,
                                None,
                            );
                        }
                    }
                }
                true
            }
            Work::Meta(meta) => {
                if !entry.sent {
                    let mut cost = entry.bytes.len() + LINE_REPLY_BYTES * meta.parts.len();
                    if meta.value {
                        cost += self.estimate.max(MIN_ESTIMATE_BYTES);
                    }
                    if !self.may_reserve(cost) {
                        return false;
                    }
                    self.reserve(cost);
                    entry.reserved = cost;
                    for part in meta.parts.iter_mut() {
                        let hot = entry.hot.as_ref();
                        self.send(&topology, part, &meta.wire, meta.expect.clone(), true, hot);
                    }
                    entry.sent = true;
                }
                match &mut meta.mode {
                    MetaMode::Forward | MetaMode::Quorum(_) => true,
                    MetaMode::CasThenCopy { copies, copy } => {
                        // The copies go out before any later request of this
                        // client, as for a replicated `cas`.
                        let Some(result) = &meta.parts[0].result else {
                            return false;
                        };
                        if let Some(copies) = copies.take() {
                            if matches!(result, Ok(reply) if route::meta_succeeded(reply)) {
                                let wire = [copy.clone()];
                                let expect = Expect::Meta {
                                    command: meta.command,
                                    quiet: false,
                                    replied: false,
                                };
                                for server in copies {
                                    let mut part = Part::new(server);
                                    self.send(
                                        &topology,
                                        &mut part,
                                        &wire,
                                        expect.clone(),
                                        false,
                                        None,
                                    );
                                }
                            }
                        }
                        true
                    }
                    MetaMode::ReadThrough {
                        servers,
                        next,
                        on_miss,
                    } => {
                        let Some(result) = &meta.parts[0].result else {
                            return false;
                        };
                        let fall = match result {
                            Ok(reply) => {
                                route::is_error_line(reply)
                                    || (*on_miss && route::meta_is_miss(reply))
                            }
                            Err(_) => true,
                        };
                        if !fall || *next >= servers.len() {
                            return true;
                        }
                        let mut part = Part::new(servers[*next]);
                        *next += 1;
                        self.send(
                            &topology,
                            &mut part,
                            &meta.wire,
                            meta.expect.clone(),
                            true,
                            None,
                        );
                        meta.parts[0] = part;
                        // Later requests wait until this read has its answer.
                        false
                    }
                }
            }
            Work::Moved(moved) => {
                if !entry.sent {
                    let cost = entry.bytes.len() + LINE_REPLY_BYTES;
                    if !self.may_reserve(cost) {
                        return false;
                    }
                    self.reserve(cost);
                    entry.reserved = cost;
                    entry.sent = true;
                    let step = moved.machine.start();
                    self.step(&topology, moved, step, entry.hot.as_ref());
                }
                // One step at a time; later requests of the client wait, so
                // they see the key as the steps left it.
                while moved.answer.is_none() {
                    let Some(part) = &mut moved.part else {
                        break;
                    };
                    part.absorb();
                    let Some(result) = part.result.take() else {
                        return false;
                    };
                    let step = moved.machine.on_reply(result);
                    self.step(&topology, moved, step, entry.hot.as_ref());
                }
                true
            }
            Work::Retrieve {
                plan,
                in_flight,
                copies,
                ..
            } => {
                while plan.has_unsent() {
                    let room = self
                        .budget()
                        .saturating_sub(self.owed + self.out.len())
                        .min(self.worker.budget.saturating_sub(self.worker.owed.get()));
                    let nothing_owed = self.owed == 0 && self.out.is_empty();
                    let estimate = self.estimate.max(MIN_ESTIMATE_BYTES);
                    let keys = (room / estimate).min(route::MAX_CHUNK_KEYS);
                    let keys = if keys == 0 && nothing_owed { 1 } else { keys };
                    if keys == 0 {
                        return false;
                    }
                    for sub in plan.next_chunk(keys) {
                        let keys_in_sub = sub.line.iter().filter(|&&b| b == b' ').count().max(1);
                        let cost = keys_in_sub * estimate;
                        self.reserve(cost);
                        let backend = &topology.backends[sub.server];
                        let slot = Slot::new(self.wake.clone());
                        let conn = self.worker.conn(backend, self.lane);
                        let ticket =
                            match self.worker.hot.before_send(&sub, &conn, &topology, &slot) {
                                GetShortcut::Send(ticket) => ticket,
                                GetShortcut::Joined => {
                                    in_flight.push((sub.id, slot, cost));
                                    continue;
                                }
                                GetShortcut::Cached(block) => {
                                    plan.on_piece(sub.id, Got::Value(block));
                                    plan.on_done(sub.id, Ok(()));
                                    self.release(cost);
                                    continue;
                                }
                            };
                        let expect = Expect::values(sub.line.clone());
                        match conn.send(std::slice::from_ref(&sub.line), expect, Some(slot.clone()))
                        {
                            Ok(()) => {
                                if let Some(ticket) = ticket {
                                    self.worker.hot.sent(ticket, &slot);
                                }
                                in_flight.push((sub.id, slot, cost));
                            }
                            Err(kind) => {
                                self.release(cost);
                                plan.on_done(sub.id, Err(backend.error(kind)));
                            }
                        }
                    }
                }
                // Read-through hits go to their new owner before any later
                // request of this client.
                for (server, copy) in plan.take_copies() {
                    let mut part = Part::new(server);
                    self.send(
                        &topology,
                        &mut part,
                        &copy,
                        Expect::Line(LineKind::Storage),
                        true,
                        None,
                    );
                    copies.push(part);
                }
                // With replicas (or moved keys), replies may send keys to
                // their next server: later requests wait until this one has
                // its answers.
                in_flight.is_empty() || (topology.config.replicas <= 1 && !plan.has_moved_keys())
            }
        }
    }

    /// Sends what a hand-off step says, or keeps its answer.
    fn step(
        &self,
        topology: &Topology,
        moved: &mut MovedWork,
        step: Step,
        write: Option<&Rc<WriteGuard>>,
    ) {
        match step {
            Step::Answer(result) => moved.answer = Some(result),
            Step::Send {
                to,
                copy,
                lines,
                expect,
            } => {
                let server = match to {
                    Owner::New => moved.owner,
                    Owner::Previous => moved.previous,
                };
                if let Some(copy) = copy {
                    let mut part = Part::new(server);
                    self.send(
                        topology,
                        &mut part,
                        &copy,
                        Expect::Line(LineKind::Storage),
                        true,
                        write,
                    );
                    moved.copies.push(part);
                }
                let mut part = Part::new(server);
                self.send(topology, &mut part, &lines, expect, true, write);
                moved.part = Some(part);
            }
        }
    }

    /// Queues a request with any expected reply on `part`'s server. A write
    /// watched for hot keys (`write`) keeps its slot even without a reply
    /// wanted: it stays pending until the server has answered what memring
    /// sent.
    fn send(
        &self,
        topology: &Topology,
        part: &mut Part,
        request: &[Bytes],
        expect: Expect,
        want_reply: bool,
        write: Option<&Rc<WriteGuard>>,
    ) {
        let backend = &topology.backends[part.server];
        let conn = self.worker.conn(backend, self.lane);
        let slot = (want_reply || write.is_some()).then(|| Slot::new(self.wake.clone()));
        if let (Some(slot), Some(write)) = (&slot, write) {
            write.watch(slot);
        }
        match conn.send(request, expect, slot.clone()) {
            Ok(()) => {
                if let Some(write) = write {
                    write.queued();
                }
                part.slot = slot;
            }
            Err(kind) => part.result = Some(Err(backend.error(kind))),
        }
    }

    /// Queues a one-line request on `part`'s server.
    fn send_line(
        &self,
        topology: &Topology,
        part: &mut Part,
        request: &[Bytes],
        expect: LineKind,
        want_reply: bool,
        write: Option<&Rc<WriteGuard>>,
    ) {
        self.send(
            topology,
            part,
            request,
            Expect::Line(expect),
            want_reply,
            write,
        );
    }

    /// Moves the replies that arrived for entry `index` into its plan.
    fn absorb(&mut self, index: usize) {
        let mut released = 0;
        let mut grown = 0;
        let mut estimate = None;
        let entry = &mut self.entries[index];
        match &mut entry.work {
            Work::Lines { parts, .. } => parts.iter_mut().for_each(Part::absorb),
            Work::Cas { owner, .. } => owner.absorb(),
            Work::Meta(meta) => {
                for part in meta.parts.iter_mut() {
                    part.absorb();
                    if let Some(Ok(reply)) = &part.result {
                        if meta.value && reply.starts_with(b"VA") {
                            estimate = Some(reply.len());
                        }
                    }
                }
            }
            Work::Retrieve {
                plan,
                in_flight,
                held,
                copies,
            } => {
                copies.iter_mut().for_each(Part::absorb);
                in_flight.retain(|(id, slot, cost)| {
                    while let Some(got) = slot.take() {
                        plan.on_piece(*id, got);
                    }
                    match slot.outcome() {
                        Some(result) => {
                            plan.on_done(*id, result);
                            released += *cost;
                            false
                        }
                        None => true,
                    }
                });
                if plan.largest_block() > 0 {
                    estimate = Some(plan.largest_block());
                }
                // Values waiting for earlier keys stay owed.
                let now = plan.held_bytes();
                if now > *held {
                    grown = now - *held;
                } else {
                    released += *held - now;
                }
                *held = now;
            }
            Work::Moved(moved) => moved.copies.iter_mut().for_each(Part::absorb),
            Work::Ready(_) | Work::Stats => {}
        }
        self.reserve(grown);
        self.release(released);
        if let Some(estimate) = estimate {
            self.estimate = estimate;
        }
    }

    /// Releases the bytes of `noreply` requests every server has answered.
    fn settle(&mut self) {
        let mut released = 0;
        self.unanswered.retain(|(slots, cost)| {
            let answered = slots.iter().all(|slot| slot.outcome().is_some());
            if answered {
                released += cost;
            }
            !answered
        });
        self.release(released);
    }

    /// Writes the replies of the entries at the head, in order.
    fn collect(&mut self) {
        self.settle();
        while !self.entries.is_empty() {
            self.absorb(0);
            let mut entry = self.entries.pop_front().expect("not empty");
            let complete = self.dispatched > 0 && self.finish(&mut entry);
            if !complete {
                if let Work::Retrieve { plan, held, .. } = &mut entry.work {
                    // The head streams: its values go out as they arrive
                    // (the END only when `finish` says it is complete).
                    plan.emit_values(&mut self.out);
                    let now = plan.held_bytes();
                    self.release(held.saturating_sub(now));
                    *held = now;
                }
                self.entries.push_front(entry);
                return;
            }
            self.dispatched -= 1;
            self.release(entry.reserved);
            // Replies memring makes itself (parse errors among them) are not
            // request latencies.
            if !matches!(entry.work, Work::Ready(_)) {
                self.worker
                    .stats
                    .command_latency(entry.command, entry.started.elapsed().as_secs_f64());
            }
        }
    }

    /// Writes the entry's reply if it is complete; true if it was.
    fn finish(&mut self, entry: &mut Entry) -> bool {
        let stats = &self.worker.stats;
        let noreply = entry.noreply;
        match &mut entry.work {
            Work::Ready(reply) => self.out.push(reply.clone()),
            Work::Stats => {
                crate::report::write_stats(self.out.scratch(), stats, &entry.topology);
            }
            // Nothing goes back for `noreply` and later replies need not
            // wait for it, but its bytes stay reserved until the servers
            // answered.
            Work::Lines { parts, .. } if noreply => {
                if !entry.sent {
                    return false;
                }
                let slots = parts.iter().filter_map(|p| p.slot.clone()).collect();
                self.unanswered
                    .push((slots, std::mem::take(&mut entry.reserved)));
                return true;
            }
            Work::Lines { parts, finish } => {
                let results: SmallVec<[Option<&CallResult>; 4]> =
                    parts.iter().map(|p| p.result.as_ref()).collect();
                match finish {
                    Finish::Quorum(quorum) => match decide(&results, *quorum) {
                        Decision::Wait => return false,
                        Decision::Answer(reply) => {
                            stats.reply(entry.command, &reply);
                            let outstanding = results.iter().filter(|r| r.is_none()).count();
                            // Slower replicas finish in the background on
                            // their own connections.
                            stats.replica_background(outstanding);
                            self.out.push(reply);
                        }
                        Decision::Fail(servers) => {
                            let names: Vec<&str> = servers.iter().map(|s| &**s).collect();
                            let reason = if names.is_empty() {
                                "no quorum: replicas answered with errors".to_string()
                            } else {
                                format!("no quorum: failed on {}", names.join(", "))
                            };
                            write_server_error(self.out.scratch(), &reason);
                        }
                    },
                    Finish::Forward | Finish::AllOk if results.iter().any(Option::is_none) => {
                        return false;
                    }
                    Finish::Forward => match &parts[0].result {
                        Some(Ok(reply)) => {
                            stats.reply(entry.command, reply);
                            self.out.push(reply.clone());
                        }
                        Some(Err(error)) => write_server_error(self.out.scratch(), error),
                        None => {}
                    },
                    Finish::AllOk => {
                        let names = parts
                            .iter()
                            .map(|p| entry.topology.backends[p.server].name());
                        let results = parts.iter().filter_map(|p| p.result.as_ref());
                        match all_ok(names.zip(results)) {
                            Ok(()) => self.out.push_slice(b"OK\r\n"),
                            Err(failed) => write_server_error(
                                self.out.scratch(),
                                &format_args!("failed on {}", failed.join(", ")),
                            ),
                        }
                    }
                }
            }
            Work::Cas { owner, copies } => {
                if copies.is_some() {
                    return false;
                }
                if !noreply {
                    match &owner.result {
                        Some(Ok(reply)) => {
                            stats.reply(entry.command, reply);
                            self.out.push(reply.clone());
                        }
                        Some(Err(error)) => write_server_error(self.out.scratch(), error),
                        None => return false,
                    }
                }
            }
            Work::Meta(meta) => {
                let reply = match &meta.mode {
                    MetaMode::Quorum(quorum) => {
                        let results: SmallVec<[Option<&CallResult>; 4]> =
                            meta.parts.iter().map(|p| p.result.as_ref()).collect();
                        match decide(&results, *quorum) {
                            Decision::Wait => return false,
                            Decision::Answer(reply) => {
                                let outstanding = results.iter().filter(|r| r.is_none()).count();
                                stats.replica_background(outstanding);
                                Ok(reply)
                            }
                            Decision::Fail(servers) => {
                                let names: Vec<&str> = servers.iter().map(|s| &**s).collect();
                                let reason = if names.is_empty() {
                                    "no quorum: replicas answered with errors".to_string()
                                } else {
                                    format!("no quorum: failed on {}", names.join(", "))
                                };
                                write_server_error(self.out.scratch(), &reason);
                                return true;
                            }
                        }
                    }
                    MetaMode::CasThenCopy {
                        copies: Some(_), ..
                    } => return false,
                    _ => match &meta.parts[0].result {
                        Some(result) => result.clone(),
                        None => return false,
                    },
                };
                match reply {
                    // Empty: `q` suppressed it, as memcached would.
                    Ok(reply) => {
                        stats.reply(entry.command, &reply);
                        if !reply.is_empty() {
                            self.out.push(reply);
                        }
                    }
                    Err(error) => write_server_error(self.out.scratch(), &error),
                }
            }
            Work::Moved(moved) => {
                let Some(answer) = moved.answer.take() else {
                    return false;
                };
                count_copies(stats, &moved.copies);
                if !noreply {
                    match answer {
                        Ok(reply) => {
                            stats.reply(entry.command, &reply);
                            self.out.push(reply);
                        }
                        Err(error) => write_server_error(self.out.scratch(), &error),
                    }
                }
            }
            Work::Retrieve {
                plan,
                held,
                in_flight,
                copies,
            } => {
                // Copies are answered on the same connections right after the
                // values they copy; the END waits for them to count them.
                if plan.has_unsent()
                    || !in_flight.is_empty()
                    || copies.iter().any(|c| c.result.is_none())
                    || !plan.emit(&mut self.out)
                {
                    return false;
                }
                let (keys, hits) = plan.counts();
                stats.retrieval(keys, hits);
                let (reads, found) = plan.read_through();
                stats.read_through(reads, found);
                count_copies(stats, copies);
                self.release(*held);
                *held = 0;
            }
        }
        true
    }
}

/// One client request on its way.
struct Entry {
    command: Command,
    noreply: bool,
    request: Request,
    bytes: Bytes,
    /// The topology the request was planned on; it finishes on it.
    topology: Arc<Topology>,
    work: Work,
    /// The request has been written (for one-line work).
    sent: bool,
    /// Reply bytes reserved when it was dispatched.
    reserved: usize,
    /// When it was parsed, for the per-command latency histogram.
    started: Instant,
    /// A write, pending for hot-key coalescing and the near cache until
    /// this entry and its reply slots are done.
    hot: Option<Rc<WriteGuard>>,
}

impl Entry {
    /// A reply memring makes itself.
    fn ready(reply: &'static [u8], topology: Arc<Topology>) -> Entry {
        let bytes = Bytes::new();
        Entry {
            command: Command::Version,
            noreply: false,
            request: Request {
                command: Command::Version,
                keys: SmallVec::new(),
                noreply: false,
                arg: None,
                args_end: 0,
                line_len: 0,
            },
            bytes,
            topology,
            work: Work::Ready(Bytes::from_static(reply)),
            sent: true,
            reserved: 0,
            started: Instant::now(),
            hot: None,
        }
    }
}

enum Work {
    /// memring's own reply.
    Ready(Bytes),
    /// memring's `stats`, rendered when it is the client's turn.
    Stats,
    /// One-line replies from one or more servers.
    Lines {
        parts: SmallVec<[Part; 1]>,
        finish: Finish,
    },
    /// A replicated `cas`: the owner, then copies once it stored.
    Cas {
        owner: Part,
        copies: Option<route::Servers>,
    },
    /// A meta command forwarded (see [`MetaWork`]).
    Meta(Box<MetaWork>),
    /// A retrieval, streamed.
    Retrieve {
        plan: Box<Retrieval>,
        /// Sub-requests in flight: id, reply slot, bytes reserved.
        in_flight: SmallVec<[(u32, Rc<Slot>, usize); 2]>,
        /// Value bytes the plan holds, counted as owed.
        held: usize,
        /// Read-through hits copied to their new owners.
        copies: SmallVec<[Part; 1]>,
    },
    /// A command on a moved key (hand-off), one step at a time.
    Moved(Box<MovedWork>),
}

struct MovedWork {
    machine: Moved,
    owner: usize,
    previous: usize,
    /// The step waiting for its reply.
    part: Option<Part>,
    copies: SmallVec<[Part; 1]>,
    answer: Option<CallResult>,
}

/// Counts the replies to hand-off copies.
fn count_copies(stats: &crate::stats::Stats, copies: &[Part]) {
    let (mut made, mut skipped, mut failed) = (0, 0, 0);
    for copy in copies {
        match copy.result.as_ref().map(copy_outcome) {
            Some(CopyOutcome::Made) => made += 1,
            Some(CopyOutcome::Skipped) => skipped += 1,
            _ => failed += 1,
        }
    }
    stats.copies(made, skipped, failed);
}

/// One meta request on its way to one or more servers.
struct MetaWork {
    command: MetaCommand,
    /// The reply may carry a stored value: budgeted like a get's key.
    value: bool,
    /// What each server is sent: the client's bytes, plus `mn` when quiet.
    wire: SmallVec<[Bytes; 3]>,
    expect: Expect,
    /// The servers asked (all replicas for a quorum; the one being read for
    /// a read-through; the owner otherwise).
    parts: SmallVec<[Part; 1]>,
    mode: MetaMode,
}

/// How a meta request's replies become the client's reply.
enum MetaMode {
    /// The one server's reply.
    Forward,
    /// A replicated write (see `route::decide`).
    Quorum(usize),
    /// The owner's reply; `copies` are sent `copy` once the owner succeeded.
    CasThenCopy {
        copies: Option<route::Servers>,
        copy: Bytes,
    },
    /// `mg` over replicas: the next server is asked while the last failed.
    ReadThrough {
        servers: route::Servers,
        next: usize,
        on_miss: bool,
    },
}

/// How the parts' one-line replies become the client's reply.
enum Finish {
    Forward,
    Quorum(usize),
    AllOk,
}

/// One server's one-line reply to wait for.
struct Part {
    server: usize,
    slot: Option<Rc<Slot>>,
    result: Option<CallResult>,
}

impl Part {
    fn new(server: usize) -> Part {
        Part {
            server,
            slot: None,
            result: None,
        }
    }

    /// Takes the reply if it has arrived.
    fn absorb(&mut self) {
        if self.result.is_some() {
            return;
        }
        let Some(slot) = &self.slot else {
            return;
        };
        let Some(outcome) = slot.outcome() else {
            return;
        };
        self.result = Some(match outcome {
            Ok(()) => match slot.take() {
                Some(Got::Line(line)) => Ok(line),
                // The connection always hands one-line replies as a line.
                Some(Got::Value(bytes)) => Ok(bytes),
                None => Ok(Bytes::new()),
            },
            Err(error) => Err::<Bytes, BackendError>(error),
        });
    }
}
