//! One client connection: read → parse → plan → dispatch → replies in request
//! order. This file is the I/O loop, the FIFO and the byte budget; what goes
//! where is decided by `route::plan`, turned into work by `start.rs` and sent
//! and answered per kind of work by `dispatch.rs`.
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
//! requests, and the replies already owed are still written; then the
//! session half-closes and drains the client's input before it closes (a
//! lingering close), so no reset cuts those replies off.

use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::backend::slot::{Got, Slot};
use crate::error::BackendError;
use crate::handoff::{copy_outcome, CopyOutcome, Moved, Owner, Step};
use crate::hotkeys::{GetShortcut, Unanswered, WriteGuard};
use crate::outbuf::OutQueue;
use crate::protocol::encode::{forwardable, write_server_error};
use crate::protocol::meta::{is_meta_request, parse_meta, MetaCommand, MetaRequest};
use crate::protocol::reply::{Expect, LineKind};
use crate::protocol::{parse_request, Command, Limits, Request};
use crate::route::{self, all_ok, decide, CallResult, Decision, MetaPlan, Plan, Retrieval};
use crate::shard::WorkerCtx;
use crate::topology::{SharedTopology, Topology};
use crate::wake::{Cancel, Wake};

mod dispatch;
mod shadow;
mod spares;
mod start;

/// First read buffer of a client: small, so that thousands of idle clients
/// cost little; it grows while a client sends more.
const FIRST_READ_BYTES: usize = 2 * 1024;
/// Room kept free before each read.
const MIN_READ_ROOM_BYTES: usize = 512;
/// Smallest reply size assumed for a key not yet answered.
const MIN_ESTIMATE_BYTES: usize = 1024;
/// How long a closing session keeps reading (and dropping) what its client
/// still sends after memring's last reply, so that closing sends no reset.
const LINGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
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
    bound: Option<SharedTopology>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.split();
    serve(reader, writer, id, worker, bound).await
}

/// [`run_session`] for a client that connected with TLS (handshake done).
/// Its lingering close sends TLS's `close_notify` before the TCP FIN.
pub(crate) async fn run_tls_session(
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    id: u64,
    worker: Rc<WorkerCtx>,
) -> io::Result<()> {
    let (reader, writer) = tokio::io::split(stream);
    serve(reader, writer, id, worker, None).await
}

/// The session's loop on the two halves of its stream; monomorphised per
/// stream type, so the plain path pays nothing for TLS.
async fn serve<R, W>(
    mut reader: R,
    mut writer: W,
    id: u64,
    worker: Rc<WorkerCtx>,
    bound: Option<SharedTopology>,
) -> io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: crate::tls::Flush,
{
    // Reply bytes written into a TLS stream that it may not have sent yet.
    let mut unflushed = false;
    let mut client = ClientSession::new(id, worker.clone(), bound);
    let mut input = BytesMut::with_capacity(FIRST_READ_BYTES);
    let settings = worker.settings;
    let clock = worker.clock.clone();
    let mut last_read = clock.tick();
    // When the incomplete request at the head of `input` began. The idle
    // timeout runs from here, not from the last read: a client trickling a
    // request byte by byte reads as busy but never completes it.
    let mut partial_since = last_read;
    let mut last_write = last_read;
    let mut shutdown = Cancel::new(&worker.shutdown);
    // One timer for the session's deadlines, moved rather than made anew
    // each turn: each deadline is usually later than the last, which tokio
    // takes without touching its timer wheel.
    let timer = tokio::time::sleep_until(last_read);
    tokio::pin!(timer);
    let result = loop {
        // One clock read per wake-up (at the end of the loop): what runs
        // for this session until it waits again takes that time.
        let now = clock.now();
        loop {
            let unparsed = input.len();
            client.parse(&mut input);
            if input.len() < unparsed {
                partial_since = now;
            }
            let full = client.entries.len() >= settings.max_pending;
            client.count_out();
            client.advance();
            // Answers collected just now made room for requests `input`
            // already holds: parse them in this turn, since no wake-up may
            // come for them (the client has sent everything and waits, and
            // the replies still owed may be quiet). One wake per turn, not
            // one per reply slot, leaves no spare turn to do it later.
            if !(full && !input.is_empty() && client.entries.len() < settings.max_pending) {
                break;
            }
        }
        client.count_out();
        if client.out.is_empty() {
            last_write = now;
        }
        client.out.seal();
        if client.closing && client.entries.is_empty() && client.out.is_empty() {
            break linger(&mut reader, &mut writer).await;
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
        // What the arm below did: bytes written, bytes read (the first of a
        // new request?).
        let (mut wrote, mut got) = (false, None);
        tokio::select! {
            biased;
            () = client.wake.notified() => {}
            written = crate::tls::write_or_flush(&mut writer, &mut client.out),
                if client.out.has_remaining() || (W::BUFFERS && unflushed) =>
            {
                match written {
                    Ok(Some(n)) => {
                        worker.stats.written_bytes(n);
                        wrote = true;
                        unflushed = W::BUFFERS;
                    }
                    Ok(None) => unflushed = false,
                    Err(e) => break Err(e),
                }
            }
            read = reader.read_buf(&mut input), if can_read => {
                match read {
                    Ok(0) => client.closing = true,
                    Ok(n) => {
                        got = Some(n == input.len());
                        worker.stats.read_bytes(n);
                    }
                    Err(e) => break Err(e),
                }
            }
            () = until(timer.as_mut(), deadline), if deadline.is_some() => {
                // Idle, stuck mid-request, or not reading its replies.
                break Ok(());
            }
            () = shutdown.cancelled(), if !client.closing => {
                client.closing = true;
            }
        }
        let now = clock.tick();
        if wrote {
            last_write = now;
        }
        if let Some(first_bytes) = got {
            last_read = now;
            if first_bytes {
                partial_since = now;
            }
        }
    };
    client.release_all();
    client.wake.forget_waiter();
    result
}

/// Ends a session whose replies are all written: half-closes, so the client
/// reads every byte and then end of stream, and reads and drops whatever the
/// client still sends until it closes too or `LINGER_TIMEOUT` passes. Closing
/// a socket with unread input makes the kernel send a reset, which throws
/// away replies still in the send buffer.
async fn linger(
    reader: &mut (impl AsyncReadExt + Unpin),
    writer: &mut (impl AsyncWriteExt + Unpin),
) -> io::Result<()> {
    writer.shutdown().await?;
    let deadline = Instant::now() + LINGER_TIMEOUT;
    let mut scratch = [0u8; 4096];
    loop {
        tokio::select! {
            read = reader.read(&mut scratch) => match read {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            },
            () = tokio::time::sleep_until(deadline) => return Ok(()),
        }
    }
}

/// `timer`, moved to `deadline` when that differs, else never.
async fn until(mut timer: std::pin::Pin<&mut tokio::time::Sleep>, deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => {
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            timer.await
        }
        None => std::future::pending().await,
    }
}

struct ClientSession {
    /// Which connection of each server this client uses: always the same
    /// one, so its commands reach each server in the order sent.
    lane: usize,
    worker: Rc<WorkerCtx>,
    /// Woken by every reply slot of this client.
    wake: Rc<Wake>,
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
    /// on a server connection faster than the server takes them. Each slot
    /// with its server.
    unanswered: Vec<(ServerSlots, usize)>,
    /// Bytes of `out` included in the worker's `owed`.
    out_counted: usize,
    limits: Limits,
    /// A client of a pool's own `listen`: every key goes to that pool.
    /// Otherwise the layout's routes say.
    bound: Option<SharedTopology>,
}

impl ClientSession {
    fn new(id: u64, worker: Rc<WorkerCtx>, bound: Option<SharedTopology>) -> ClientSession {
        let limits = worker.default_topology().limits();
        ClientSession {
            bound,
            lane: id as usize,
            worker,
            wake: Rc::new(Wake::new()),
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

    /// The topology a request with routing key `key` is planned on: its
    /// pool's now (one load, no guard kept), or that pool's gutter when the
    /// key's server is DEAD and failed over, with the gutter's TTL cap.
    fn topology_for(&self, key: Option<&[u8]>) -> (Arc<Topology>, Option<u64>) {
        let layout = self.worker.layout.load();
        let (pool, key) = match (self.pool_index(&layout, key), key) {
            (Some(pool), Some(key)) => (pool, key),
            _ => {
                let topology = match &self.bound {
                    Some(bound) => bound.load_full(),
                    None => layout.default_topology(),
                };
                return (topology, None);
            }
        };
        if layout.fails_over() {
            let serving = layout.serving(pool, key);
            if serving != pool {
                let ttl = layout.pools()[pool]
                    .topology
                    .load()
                    .config
                    .failover
                    .as_ref()
                    .map(|f| f.ttl.as_secs());
                return (layout.pools()[serving].topology.load_full(), ttl);
            }
        }
        (layout.pools()[pool].topology.load_full(), None)
    }

    /// The index in `layout` of the pool `key` goes to: the bound pool's for
    /// a client of a pool's own listener, else the routes' choice. `None`
    /// without a key, or when the bound pool is gone from the layout.
    fn pool_index(&self, layout: &crate::layout::Layout, key: Option<&[u8]>) -> Option<usize> {
        let key = key?;
        match &self.bound {
            Some(bound) => layout.index_of(bound),
            None => Some(layout.pool_of(key)),
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
        // Most turns of the loop are replies arriving: nothing to parse, and
        // no need to load the topology for its limits (an `ArcSwap` load and
        // an `Arc` every worker counts on).
        if input.is_empty() {
            return;
        }
        // Limits may change with a reload or when servers report their item
        // size; a copy is taken, no guard is held.
        self.limits = self.worker.default_topology().limits();
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
            let (topology, _) = self.topology_for(None);
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

    /// Dispatches and collects until neither makes progress. Collecting
    /// releases budget, and a quiet reply writes nothing that would wake the
    /// loop again: without another round here, entries held back by the
    /// budget would wait for the client's next bytes, which a client waiting
    /// for its `MN` never sends.
    fn advance(&mut self) {
        loop {
            self.pump();
            let (entries, owed) = (self.entries.len(), self.owed);
            self.collect();
            let progressed = self.entries.len() < entries || self.owed < owed;
            if !progressed || self.dispatched == self.entries.len() {
                return;
            }
        }
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

    /// Releases the bytes of `noreply` requests every server has answered.
    fn settle(&mut self) {
        let (mut released, mut i) = (0, 0);
        while i < self.unanswered.len() {
            let (slots, _) = &self.unanswered[i];
            if slots.iter().all(|(_, slot)| slot.outcome().is_some()) {
                let (slots, cost) = self.unanswered.remove(i);
                released += cost;
                slots
                    .into_iter()
                    .for_each(|(_, slot)| spares::keep_slot(slot));
            } else {
                i += 1;
            }
        }
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
                self.worker.stats.command_latency(
                    entry.command,
                    self.worker
                        .clock
                        .now()
                        .saturating_duration_since(entry.started)
                        .as_secs_f64(),
                );
            }
            spares::keep(entry.work);
            if let Some(guard) = entry.hot {
                self.worker.hot.write_done(guard);
            }
        }
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
    /// A sampled get: the pairs its answers go to (see `shadow.rs`).
    shadow: Option<Box<shadow::Pairs>>,
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
            shadow: None,
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
    Cas(Box<CasWork>),
    /// A meta command forwarded (see [`MetaWork`]).
    Meta(Box<MetaWork>),
    /// A retrieval, streamed.
    Retrieve {
        plan: Box<Retrieval>,
        /// Sub-requests sent (or joined) and not yet absorbed.
        in_flight: SmallVec<[SubInFlight; 2]>,
        /// Value bytes the plan holds, counted as owed.
        held: usize,
    },
    /// A command on a moved key (hand-off), one step at a time.
    Moved(Box<MovedWork>),
}

struct MovedWork {
    machine: Moved,
    owner: usize,
    previous: usize,
    /// Owners in older rings of chained changes: sent a `delete` with the
    /// first step (`waiting`), and the answer waits for them.
    forget: route::Servers,
    waiting: SmallVec<[Part; 1]>,
    /// The step waiting for its reply.
    part: Option<Part>,
    copies: SmallVec<[Part; 1]>,
    answer: Option<CallResult>,
}

/// A replicated `cas` (see `route::Plan::CasThenCopy`).
struct CasWork {
    /// The `cas` under way: on the owner, then on the previous owner.
    part: Part,
    owner: usize,
    /// The other replicas, sent the value once a `cas` stored (taken then).
    copies: Option<route::Servers>,
    /// The previous ring's owner of a moved key, not tried yet.
    previous: Option<usize>,
    /// The owner's `NOT_FOUND`/`EXISTS` while the previous owner is tried.
    first: Option<CallResult>,
    /// Owners in older rings of chained changes, sent a `delete` with the
    /// `cas`.
    forget: route::Servers,
    /// Replies the answer waits for: those deletes, and the copies of a
    /// `cas` the previous owner stored (the owner's first).
    waiting: SmallVec<[Part; 2]>,
    /// `waiting[copied..]` are copies.
    copied: Option<usize>,
}

/// The answer of a `cas` (classic or meta) that stored on a moved key's
/// previous owner, once its copies are in: that reply, unless the new
/// owner's copy (the first) did not take the value: a reader would still
/// find the older value there.
fn moved_cas_answer(stored: CallResult, owner_copy: Option<&CallResult>) -> CallResult {
    match owner_copy {
        Some(Ok(reply)) if reply.as_ref() == b"STORED\r\n" || route::meta_succeeded(reply) => {
            stored
        }
        Some(other) => other.clone(),
        None => stored,
    }
}

/// Counts a read-through copy's reply when it arrives, so the client's
/// answer never waits for the copy: a later request of the client for the
/// key goes to the new owner on the same connection, after the copy.
#[derive(Debug)]
struct CopyCount {
    stats: Arc<crate::stats::Stats>,
    reply: std::cell::RefCell<Option<Bytes>>,
}

impl crate::backend::slot::Watch for CopyCount {
    fn piece(&self, piece: &Got) {
        let (Got::Line(reply) | Got::Value(reply)) = piece;
        *self.reply.borrow_mut() = Some(reply.clone());
    }

    fn done(&self, result: &Result<(), BackendError>) {
        let outcome = match result {
            Ok(()) => copy_outcome(&Ok(self.reply.take().unwrap_or_default())),
            Err(_) => CopyOutcome::Failed,
        };
        count_copy(&self.stats, outcome);
    }
}

fn count_copy(stats: &crate::stats::Stats, outcome: CopyOutcome) {
    match outcome {
        CopyOutcome::Made => stats.copies(1, 0, 0),
        CopyOutcome::Skipped => stats.copies(0, 1, 0),
        CopyOutcome::Failed => stats.copies(0, 0, 1),
    }
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
    /// An `ms` with `C` in set mode: its reply feeds the `cas_*` stats, as
    /// memcached counts it (other modes with `C` it does not count).
    counts_cas: bool,
    /// The reply may carry a stored value: budgeted like a get's key.
    value: bool,
    /// What each server is sent: the client's bytes, plus `mn` when quiet.
    wire: SmallVec<[Bytes; 3]>,
    expect: Expect,
    /// The servers asked (all replicas for a quorum; the one being read for
    /// a read-through; the owner otherwise).
    parts: SmallVec<[Part; 1]>,
    mode: MetaMode,
    /// Owners in older rings of chained changes, sent an `md` with the
    /// first step (see `route::MetaPlan`), and the key token for it (and
    /// whether it is base64).
    forget: route::Servers,
    forget_key: (Bytes, bool),
    /// Replies the answer waits for besides the parts: those `md`s, and
    /// the copies of an `ms … C` the previous owner took.
    waiting: SmallVec<[Part; 1]>,
}

/// How a meta request's replies become the client's reply.
enum MetaMode {
    /// The one server's reply.
    Forward,
    /// A replicated write (see `route::decide`); the last `forget` parts
    /// delete the key from the previous ring's replicas (`key`: its token
    /// and whether it is base64).
    Quorum {
        quorum: usize,
        forget: usize,
        key: (Bytes, bool),
    },
    /// The owner's reply; `copies` are sent `copy` once the owner succeeded.
    /// In a hand-off window, an `EX`/`NF` of the owner tries `previous`
    /// (then taken) and keeps the owner's reply in `first`; when the
    /// previous owner succeeds, `copy` goes to `owner` and `copies` and the
    /// answer waits for them (`waiting[copied..]`).
    CasThenCopy {
        owner: usize,
        copies: Option<route::Servers>,
        copy: Bytes,
        previous: Option<usize>,
        first: Option<CallResult>,
        copied: Option<usize>,
    },
    /// `mg` over replicas: the next server is asked while the last failed.
    ReadThrough {
        servers: route::Servers,
        next: usize,
        on_miss: bool,
    },
    /// `mg` of a moved key: the owner (the part) first; after a miss the
    /// previous owner is sent `wire` (the request with `v f t` added), and
    /// a hit there is answered as the client asked and copied (`copy`).
    ReadMoved {
        owner: usize,
        previous: usize,
        wire: SmallVec<[Bytes; 3]>,
        added: crate::handoff::AddedFlags,
        /// The key token as sent, and whether it is base64 (`b`).
        key: (Bytes, bool),
        stage: MovedStage,
        /// The owner's miss, the answer unless the previous owner hits.
        miss: Option<CallResult>,
    },
    /// `ma`/`ms`/`mg` of a moved key that needs it on its new owner: run
    /// there (the part); if absent, fetched from `previous`, copied, and run
    /// again.
    RetryMoved {
        owner: usize,
        previous: usize,
        /// The key token as sent, and whether it is base64 (`b`).
        key: (Bytes, bool),
        stage: MovedStage,
        /// The new owner's first reply, the answer if there is nothing to
        /// copy; `None` when the copy comes first (`ms` in add mode).
        absent: Option<CallResult>,
    },
    /// `ms` of a moved key: `md` to the previous owner (the part), then the
    /// request to `owner`, whose reply answers.
    OverwriteMoved {
        owner: usize,
        /// The key token as sent, and whether it is base64 (`b`).
        key: (Bytes, bool),
        /// The previous owner has answered its `md`.
        forgotten: bool,
    },
    /// `ms` with `C` of a moved key (see `route::MetaPlan::CasMoved`): the
    /// part is the step under way.
    CasMoved {
        owner: usize,
        previous: usize,
        /// The key token as sent, and whether it is base64 (`b`).
        key: (Bytes, bool),
        /// The request without `C` and `q`: the set for the new owner once
        /// the previous owner stored.
        copy: Bytes,
        stage: CasStage,
        /// The reply that answers once the steps after it are done.
        answer: Option<CallResult>,
    },
    /// `md` of a moved key: sent to the previous owner (the part), then to
    /// `owner`; `previous` keeps the first reply.
    DeleteMoved {
        owner: usize,
        previous: Option<CallResult>,
    },
}

/// Where a meta request on a moved key ([`MetaMode::ReadMoved`],
/// [`MetaMode::RetryMoved`]) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MovedStage {
    /// Waiting for the new owner's first reply.
    Owner,
    /// Waiting for the previous owner's reply.
    Previous,
    /// Waiting for the new owner's reply to the request run again after
    /// the copy (`RetryMoved` only).
    Retry,
    /// The request changed the key on its new owner; waiting for the
    /// previous owner to delete its older copy (`RetryMoved` only).
    Forget,
    /// The answer is (or will be) the part's reply.
    Done,
}

/// Where a [`MetaMode::CasMoved`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CasStage {
    /// Waiting for the new owner's reply to the client's `ms … C`.
    Owner,
    /// Waiting for the previous owner's reply to the same.
    Previous,
    /// Waiting for the new owner to take the value the previous one stored.
    Copy,
    /// Waiting for the previous owner to delete its copy.
    Forget,
    Done,
}

/// How the parts' one-line replies become the client's reply.
enum Finish {
    Forward,
    /// A replicated write: the quorum, and how many of the last parts are
    /// `delete`s to the previous ring's replicas (see `route::Plan::Quorum`).
    Quorum {
        quorum: usize,
        forget: usize,
    },
    AllOk,
}

impl Work {
    /// Whether `ours` accepts the server and slot of every reply this work
    /// waits for that has not fully arrived (copies sent wanting no reply
    /// have no slot: they go to other replicas, where no hot-key shortcut is
    /// taken).
    fn all_unanswered(&self, ours: &mut dyn FnMut(usize, &Rc<Slot>) -> bool) -> bool {
        match self {
            Work::Ready(_) | Work::Stats => true,
            Work::Lines { parts, .. } => parts.iter().all(|p| p.all_unanswered(ours)),
            Work::Cas(cas) => std::iter::once(&cas.part)
                .chain(&cas.waiting)
                .all(|p| p.all_unanswered(ours)),
            Work::Meta(meta) => meta
                .parts
                .iter()
                .chain(&meta.waiting)
                .all(|p| p.all_unanswered(ours)),
            Work::Retrieve { in_flight, .. } => in_flight
                .iter()
                .filter(|sub| sub.slot.outcome().is_none())
                .all(|sub| ours(sub.server, &sub.slot)),
            Work::Moved(moved) => moved
                .part
                .iter()
                .chain(&moved.copies)
                .chain(&moved.waiting)
                .all(|p| p.all_unanswered(ours)),
        }
    }
}

/// What a session waits for from its servers while it dispatches one entry:
/// the entries before it, its `noreply` writes, and the entry's own
/// sub-requests already sent.
struct Earlier<'a> {
    entries: &'a VecDeque<Entry>,
    /// How many entries come before the one being dispatched.
    before: usize,
    unanswered: &'a [(ServerSlots, usize)],
    current: &'a [SubInFlight],
}

impl Unanswered for Earlier<'_> {
    fn all_to(&self, server: usize, ours: &mut dyn FnMut(&Rc<Slot>) -> bool) -> bool {
        let mut ours = |to: usize, slot: &Rc<Slot>| to != server || ours(slot);
        self.current
            .iter()
            .filter(|sub| sub.slot.outcome().is_none())
            .all(|sub| ours(sub.server, &sub.slot))
            && self
                .entries
                .range(..self.before)
                .all(|entry| entry.work.all_unanswered(&mut ours))
            && self
                .unanswered
                .iter()
                .flat_map(|(slots, _)| slots)
                .filter(|(_, slot)| slot.outcome().is_none())
                .all(|(to, slot)| ours(*to, slot))
    }
}

/// Reply slots, each with the server it waits for.
type ServerSlots = SmallVec<[(usize, Rc<Slot>); 1]>;

/// A retrieval's sub-request in flight.
struct SubInFlight {
    id: u32,
    server: usize,
    slot: Rc<Slot>,
    /// Reply bytes reserved for it.
    cost: usize,
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

    /// Whether `ours` accepts the slot of this part's reply, if it has not
    /// fully arrived (see [`Work::all_unanswered`]).
    fn all_unanswered(&self, ours: &mut dyn FnMut(usize, &Rc<Slot>) -> bool) -> bool {
        match &self.slot {
            Some(slot) if slot.outcome().is_none() => ours(self.server, slot),
            _ => true,
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
