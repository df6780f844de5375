//! One connection from one worker to one memcached server, driven by one
//! local task on that worker's runtime.
//!
//! Sessions of the worker queue requests on it directly (no channel, no other
//! thread): their bytes join the write queue and a waiter joins the FIFO.
//! The task writes what every session queued in one turn of the event loop
//! with one `writev`, frames each reply strictly against what its request
//! allows (`protocol::reply::next_piece`) and hands it, piece by piece, to the
//! oldest waiter's slot.
//!
//! After any timeout, EOF, I/O error or framing error the socket is dropped
//! and every request queued on it fails: a connection that erred is never
//! reused, so no reply can reach the wrong request. A request's timeout
//! measures the server, not the queue: it fires only when the server made no
//! progress (no byte read or written, no reply completed) for
//! `request_timeout` while it owed replies, so a server busy sending a large
//! reply is not failing.
//!
//! A connection holds at most its share of `max_server_inflight` requests
//! queued and unanswered; past it [`Conn::send`] refuses a request at once
//! (`SERVER_ERROR server busy`) rather than queue it behind a server that
//! stopped answering.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::backend::health::{HealthEvent, HealthState};
use crate::backend::slot::{Got, Slot};
use crate::backend::Shared;
use crate::error::BackendErrorKind;
use crate::protocol::lease;
use crate::protocol::meta::reply::MetaReplyError;
use crate::protocol::meta::tag::{echoes_opaque, tag_request, tag_revealing, untag, Tag};
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::Outcome;
use crate::protocol::reply::{
    item_size_max, next_piece, pending_value_len, Expect, Piece, ReplyError,
};
use crate::runtime::clock::TurnClock;
use crate::runtime::outbuf::OutQueue;
use crate::runtime::recycled::RecycledBuf;
use crate::runtime::wake::{Cancel, Wake};
use crate::tls::{write_or_flush, Flush};

const READ_CHUNK_BYTES: usize = 16 * 1024;
/// What a reply holds besides its value block, with room to spare: the
/// `END` line of a get, and the few bytes keys' lengths differ by.
const REPLY_SLACK_BYTES: usize = 32;
/// Most room one connection's read buffer takes at once (see
/// [`read_room`]).
const MAX_READ_ROOM_BYTES: usize = 1024 * 1024;
/// The largest spare allocation a connection's read buffer keeps (see
/// `RecycledBuf`): room for a few values of up to 64 KiB ([`read_room`]).
/// A client buffer's default bound (64 KiB) would let every such
/// allocation go (16 KiB values take 64 KiB and a little more) and make
/// each anew, in pages the allocator had given back: 0.1 to 0.26 page
/// faults per 16 KiB get, the kernel zeroing each page and the read
/// filling it. A worker has a few of these buffers, not one per client.
const READ_SPARE_BYTES: usize = 256 * 1024;
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// What a new connection asks first: it proves the server answers (a frozen
/// server's kernel still accepts connections) and tells its item size limit.
const PROBE: &[u8] = b"stats settings\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Connecting: requests queue and are written once connected.
    Connecting,
    Ready,
    /// The last attempt failed; requests fail at once with this until the
    /// next attempt.
    BackingOff(BackendErrorKind),
}

struct Waiting {
    expect: Expect,
    /// A meta request tagged with an opaque its reply must carry: the tag
    /// is the oldest in `State::tags`. Kept apart, as few requests have one
    /// and it would double the size of every waiter moved in and out.
    tagged: bool,
    /// `None` for the probe and for `noreply` requests (whose reply memring
    /// asked for, to stay in step, and drops here).
    slot: Option<Rc<Slot>>,
    probe: bool,
    /// When it was queued, in the worker clock's nanoseconds
    /// (`TurnClock::nanos`), for the server's latency histogram.
    queued: u64,
    /// What the value pieces handed on so far say (`Value`, or a quiet
    /// meta request's one reply); `Nothing` before any.
    said: Outcome,
}

struct State {
    phase: Phase,
    /// Bytes queued by sessions and not yet taken by the task.
    queued: OutQueue,
    /// Every request queued on this connection, oldest first.
    waiting: VecDeque<Waiting>,
    /// The tags of the `tagged` ones among them, oldest first.
    tags: VecDeque<Tag>,
    /// When the server last made progress on what it owes.
    progress: Instant,
    /// The task has ended; a new connection must be made.
    closed: bool,
    /// The opaque the next meta request is tagged with.
    next_tag: u32,
    /// Where tagged request lines are written, a block at a time.
    lines: BytesMut,
}

/// One worker's connection to one server.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    /// The worker's turn time: when a request was queued.
    clock: Rc<TurnClock>,
    state: RefCell<State>,
    /// Wakes the task: requests were queued (once per turn, however many).
    wake: Wake,
    /// This connection's part of the server's latency histogram.
    latency: crate::stats::latency::HistogramWriter,
    /// Requests it may have queued and unanswered before it refuses more
    /// (its share of `max_server_inflight`).
    max_inflight: usize,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("server", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl Conn {
    pub(crate) fn new(shared: Arc<Shared>, clock: Rc<TurnClock>) -> Rc<Conn> {
        Rc::new(Conn {
            latency: shared.metrics.latency.writer(),
            max_inflight: shared.settings.max_inflight_per_connection(),
            shared,
            clock,
            state: RefCell::new(State {
                phase: Phase::Connecting,
                queued: OutQueue::default(),
                waiting: VecDeque::new(),
                tags: VecDeque::new(),
                progress: Instant::now(),
                closed: false,
                next_tag: 0,
                lines: BytesMut::new(),
            }),
            wake: Wake::new(),
        })
    }

    /// The error a request queued here gets for `kind`, counted against the
    /// server: only for a failure a client actually sees.
    pub(crate) fn error(&self, kind: BackendErrorKind) -> crate::error::BackendError {
        self.shared.error(kind)
    }

    /// Requests queued on this connection and not yet answered.
    pub(crate) fn in_flight(&self) -> usize {
        self.state.borrow().waiting.len()
    }

    /// The task behind this connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.borrow().closed
    }

    /// Queues a request; its reply goes to `slot` (`None`: dropped).
    ///
    /// # Errors
    /// The server is DEAD or the last connection attempt failed (failing at
    /// once rather than after a timeout), this connection has closed, or it
    /// already has its share of `max_server_inflight` requests unanswered
    /// ([`BackendErrorKind::Busy`]).
    pub(crate) fn send(
        &self,
        request: &[Bytes],
        expect: Expect,
        slot: Option<Rc<Slot>>,
    ) -> Result<(), BackendErrorKind> {
        self.shared.metrics.requests.inc();
        if self.shared.state() == HealthState::Dead {
            return Err(BackendErrorKind::Dead);
        }
        let mut state = self.state.borrow_mut();
        if state.closed {
            return Err(BackendErrorKind::Gone);
        }
        if let Phase::BackingOff(kind) = state.phase {
            return Err(kind);
        }
        // A server that stopped answering (or answers slowly) must not
        // collect every request sent its way until its timeout: past the
        // limit, refuse at once. The probe is memring's own, not counted.
        let probing = state.waiting.front().is_some_and(|w| w.probe);
        if state.waiting.len() - usize::from(probing) >= self.max_inflight {
            return Err(BackendErrorKind::Busy);
        }
        if state.waiting.is_empty() {
            // The server owed nothing: its time starts now (the OS clock:
            // the turn's time may be older than the connection's last
            // progress).
            state.progress = Instant::now();
        }
        let tagged = match (&expect, request.first()) {
            (Expect::Meta { command, .. }, Some(first)) if echoes_opaque(*command) => {
                let value = state.next_tag;
                state.next_tag = value.wrapping_add(1);
                if *command == MetaCommand::Get && expect.hides_leases() {
                    tag_revealing(first, value, &mut state.lines)
                } else {
                    tag_request(first, value, &mut state.lines)
                }
            }
            _ => None,
        };
        // A tagged request's first part goes as its tagged line and the rest
        // of that part; every other part as it is.
        let is_tagged = tagged.is_some();
        let untouched = if is_tagged { &request[1..] } else { request };
        if let Some(tagged) = tagged {
            state.queued.push(tagged.line);
            if !tagged.rest.is_empty() {
                state.queued.push(tagged.rest);
            }
            state.tags.push_back(tagged.tag);
        }
        for part in untouched {
            state.queued.push_shared(part);
        }
        state.waiting.push_back(Waiting {
            expect,
            tagged: is_tagged,
            slot,
            probe: false,
            queued: self.clock.nanos(),
            said: Outcome::Nothing,
        });
        drop(state);
        self.wake.notify();
        Ok(())
    }

    /// Fails every queued request with `kind` and forgets their bytes.
    fn fail_all(&self, kind: BackendErrorKind) {
        let waiting = {
            let mut state = self.state.borrow_mut();
            state.queued = OutQueue::default();
            state.tags.clear();
            std::mem::take(&mut state.waiting)
        };
        for waiting in waiting {
            if let Some(slot) = waiting.slot {
                slot.finish(Err(self.shared.error(kind)));
            }
        }
    }

    /// Nothing is owed and the connection is no longer wanted.
    fn may_close(&self, drain: &CancellationToken) -> bool {
        let state = self.state.borrow();
        (self.shared.retired.is_cancelled() || drain.is_cancelled())
            && state.waiting.is_empty()
            && state.queued.is_empty()
    }
}

/// Runs the connection until its backend is retired (or the worker drains)
/// and nothing is owed; reconnects with backoff after failures.
pub(crate) async fn run(conn: Rc<Conn>, drain: CancellationToken) {
    let shared = conn.shared.clone();
    let mut backoff = MIN_BACKOFF;
    loop {
        if conn.may_close(&drain) {
            break;
        }
        conn.state.borrow_mut().phase = Phase::Connecting;
        let connected = match connect(&shared).await {
            Ok(stream) => secure(&shared, stream).await,
            Err(kind) => Err(kind),
        };
        let failure = match connected {
            Ok(stream) => match serve(&conn, stream, &drain).await {
                Ok(()) => break,
                Err((kind, answered)) => {
                    shared.report(HealthEvent::Failed(kind));
                    conn.fail_all(kind);
                    if answered {
                        // A connection that worked broke: reconnect at once.
                        backoff = MIN_BACKOFF;
                        continue;
                    }
                    kind
                }
            },
            Err(kind) => {
                shared.report(HealthEvent::Failed(kind));
                conn.fail_all(kind);
                kind
            }
        };
        // The server refuses, or accepts but never answers (frozen): try
        // again after a growing pause, and meanwhile fail requests at once
        // instead of letting them wait for a connection that will not work.
        conn.state.borrow_mut().phase = Phase::BackingOff(failure);
        let retry_at = Instant::now() + backoff;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            // Another connection reached the server: it is back.
            () = shared.heard_from.notified() => {}
            () = sleep_until(retry_at) => {}
            () = shared.retired.cancelled() => {}
            () = drain.cancelled() => {}
        }
    }
    conn.state.borrow_mut().closed = true;
    conn.fail_all(BackendErrorKind::Gone);
    conn.wake.forget_waiter();
}

async fn connect(shared: &Shared) -> Result<TcpStream, BackendErrorKind> {
    // Looked up at every connect, outside the connect timeout: DNS has its
    // own (inputs/resolve.rs), and a DNS outage falls back to the last answer.
    let addresses = shared
        .target
        .addresses(&shared.name)
        .await
        .map_err(BackendErrorKind::Resolve)?;
    let attempt = async {
        let mut failure = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => {
                    shared.target.connected(address);
                    return Ok(stream);
                }
                Err(e) => failure = e,
            }
        }
        Err(failure)
    };
    match tokio::time::timeout(shared.settings.connect_timeout, attempt).await {
        Err(_) => Err(BackendErrorKind::ConnectTimeout),
        Ok(Err(e)) => Err(BackendErrorKind::Connect(e.kind())),
        Ok(Ok(stream)) => {
            // Requests are already batched; Nagle would only add delay.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
    }
}

/// A connected socket, plain or with TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// The TLS handshake, for a server with `tls = true`; a failure is logged
/// once in rustls's words and fails the attempt like a refused connect.
async fn secure(shared: &Shared, stream: TcpStream) -> Result<Stream, BackendErrorKind> {
    let Some(tls) = &shared.tls else {
        return Ok(Stream::Plain(stream));
    };
    let Some(connector) = tls else {
        shared.note_tls(Some(
            "tls = true, but memring started without [backend_tls]: restart it to connect",
        ));
        return Err(BackendErrorKind::Tls(
            crate::error::TlsFailure::NotConfigured,
        ));
    };
    match connector
        .connect(&shared.addr, stream, shared.settings.connect_timeout)
        .await
    {
        // Cleared once the probe is answered: a server that wants a client
        // certificate refuses only after the handshake.
        Ok(stream) => Ok(Stream::Tls(Box::new(stream))),
        Err((kind, words)) => {
            shared.note_tls(Some(&words));
            Err(BackendErrorKind::Tls(kind))
        }
    }
}

/// Serves one connected socket. `Ok` when the connection is no longer
/// wanted and owes nothing; otherwise why it broke and whether it had
/// answered a request.
async fn serve(
    conn: &Conn,
    stream: Stream,
    drain: &CancellationToken,
) -> Result<(), (BackendErrorKind, bool)> {
    match stream {
        Stream::Plain(mut stream) => {
            let (reader, writer) = stream.split();
            serve_on(conn, reader, writer, drain).await
        }
        Stream::Tls(stream) => {
            let (reader, writer) = tokio::io::split(*stream);
            serve_on(conn, reader, writer, drain).await
        }
    }
}

/// [`serve`] on the two halves of a stream; monomorphised per stream type,
/// so the plain path pays nothing for TLS.
async fn serve_on<R, W>(
    conn: &Conn,
    mut reader: R,
    mut writer: W,
    drain: &CancellationToken,
) -> Result<(), (BackendErrorKind, bool)>
where
    R: tokio::io::AsyncRead + Unpin,
    W: Flush,
{
    let shared = &conn.shared;
    let timeout = shared.settings.request_timeout;
    // Bytes written into a TLS stream that it may not have sent yet.
    let mut unflushed = false;
    let mut read_buf =
        RecycledBuf::with_capacity(READ_CHUNK_BYTES).keeping_spares_up_to(READ_SPARE_BYTES);
    let mut writing = OutQueue::default();
    writing.push(Bytes::from_static(PROBE));
    {
        let mut state = conn.state.borrow_mut();
        let now = Instant::now();
        state.phase = Phase::Ready;
        state.progress = now;
        state.waiting.push_front(Waiting {
            expect: Expect::Stats,
            tagged: false,
            slot: None,
            probe: true,
            queued: conn.clock.nanos_at(now),
            said: Outcome::Nothing,
        });
    }
    shared.metrics.connections.inc();
    let mut answered = false;
    // The largest value piece this connection has delivered lately.
    let mut largest: usize = 0;
    // The timer fired once and the driver has been polled since.
    let mut confirmed = false;
    let retired = &shared.retired;
    let (mut retiring, mut draining) = (Cancel::new(retired), Cancel::new(drain));
    // One timer for the request deadline, moved rather than made anew each
    // turn (see `session::serve`).
    let timer = sleep_until(Instant::now());
    tokio::pin!(timer);
    let result = loop {
        let deadline = {
            let mut state = conn.state.borrow_mut();
            take_queued(&mut writing, &mut state.queued);
            if state.waiting.is_empty()
                && writing.is_empty()
                && (retired.is_cancelled() || drain.is_cancelled())
            {
                break Ok(());
            }
            (!state.waiting.is_empty()).then_some(state.progress + timeout)
        };
        match room_step(&read_buf, largest) {
            RoomStep::Whole(total) => {
                let mut whole = RecycledBuf::with_capacity(total + READ_CHUNK_BYTES)
                    .keeping_spares_up_to(READ_SPARE_BYTES);
                whole.extend_from_slice(&read_buf);
                read_buf = whole;
            }
            RoomStep::MakeRoom => read_buf.make_room(read_room(largest)),
            RoomStep::Keep => {}
        }
        tokio::select! {
            biased;
            read = reader.read_buf(&mut *read_buf) => {
                match read {
                    Ok(0) => break Err(BackendErrorKind::Closed),
                    Err(e) => match crate::tls::tls_error(&e).filter(|_| W::BUFFERS) {
                        Some((kind, words)) => {
                            shared.note_tls(Some(&words));
                            break Err(BackendErrorKind::Tls(kind));
                        }
                        None => break Err(BackendErrorKind::Io(e.kind())),
                    },
                    Ok(_) => {}
                }
                let now = Instant::now();
                conn.state.borrow_mut().progress = now;
                confirmed = false;
                match deliver(conn, &mut read_buf, now) {
                    Err(kind) => break Err(kind),
                    Ok(delivered) => {
                        // Forgotten slowly, so one big value does not keep
                        // a big buffer for good; only as smaller values come
                        // (a read that ended inside a value, or brought only
                        // lines, says nothing of their size).
                        if delivered.largest > 0 {
                            largest = delivered.largest.max(largest - largest / 8);
                        }
                        if delivered.probe {
                            shared.report(HealthEvent::Probed);
                            if W::BUFFERS {
                                shared.note_tls(None);
                            }
                        }
                        if delivered.requests > 0 && !answered {
                            answered = true;
                            shared.report(HealthEvent::Answered);
                        }
                    }
                }
            }
            written = write_or_flush(&mut writer, &mut writing),
                if writing.has_remaining() || (W::BUFFERS && unflushed) =>
            {
                match written {
                    Ok(Some(_)) => {
                        shared.metrics.writes.inc();
                        conn.state.borrow_mut().progress = Instant::now();
                        confirmed = false;
                        unflushed = W::BUFFERS;
                    }
                    Ok(None) => unflushed = false,
                    Err(e) => break Err(BackendErrorKind::Io(e.kind())),
                }
            }
            () = conn.wake.notified() => {
                // Sessions queued requests. Let the event loop poll its
                // sockets once more first: the sessions that wakes queue
                // theirs too, and all of them leave in one write.
                tokio::task::yield_now().await;
            }
            () = until(timer.as_mut(), deadline) => {
                let expired = {
                    let state = conn.state.borrow();
                    !state.waiting.is_empty() && Instant::now() >= state.progress + timeout
                };
                if expired {
                    if confirmed {
                        break Err(BackendErrorKind::Timeout);
                    }
                    // After a stall of this thread (a loaded machine) the
                    // timer can fire before the I/O driver has seen replies
                    // that did arrive: let it poll once, then judge again.
                    confirmed = true;
                    tokio::task::yield_now().await;
                }
            }
            () = retiring.cancelled(), if !retiring.is_done() => {}
            () = draining.cancelled(), if !draining.is_done() => {}
        }
    };
    shared.metrics.connections.dec();
    result.map_err(|kind| (kind, answered))
}

/// Moves what sessions queued behind what the task is writing. With
/// nothing left to write, the two queues trade places instead: the
/// requests are written from the buffer they were copied into, with no
/// chunk made of them (a `BytesMut::split`, a reference count taken and
/// dropped, a list entry), and sessions queue into the other buffer
/// meanwhile. Either way the bytes keep their order.
fn take_queued(writing: &mut OutQueue, queued: &mut OutQueue) {
    if queued.is_empty() {
        return;
    }
    if writing.is_empty() {
        std::mem::swap(writing, queued);
    } else {
        writing.append(queued);
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

/// What one read delivered.
#[derive(Default)]
struct Delivered {
    /// The connection's probe was answered.
    probe: bool,
    /// Replies to real requests.
    requests: usize,
    /// The largest value piece, in bytes.
    largest: usize,
}

/// How much room the read buffer takes when it runs low. Its earlier pieces
/// are still held by the replies they went to, so it cannot grow in place:
/// a new buffer takes the bytes not yet delivered, which for a value larger
/// than the chunk is a copy of its first part. Room for a few of the largest
/// values this connection has delivered lately makes that copy once per few
/// values rather than once or twice per value (16 KiB values: 3 % of
/// memring's CPU with a fixed 16 KiB chunk). The room is a whole number of
/// replies (each value with its `END` line, [`REPLY_SLACK_BYTES`]): a read
/// that fills it then stops a few bytes into the next reply, where four
/// bare values' room stopped a few bytes short of the fourth reply's end,
/// and nearly all of that value moved to the next buffer (a quarter of the
/// 16 KiB values read were copied so, a fifth of memring's instructions).
fn read_room(largest: usize) -> usize {
    largest
        .saturating_add(REPLY_SLACK_BYTES)
        .saturating_mul(4)
        .clamp(READ_CHUNK_BYTES, MAX_READ_ROOM_BYTES)
}

/// What the read buffer needs before the next read.
#[derive(Debug, PartialEq, Eq)]
enum RoomStep {
    /// Enough room.
    Keep,
    /// Room for a few of the largest values ([`read_room`]), the bytes not
    /// yet delivered moved over.
    MakeRoom,
    /// A buffer of its own for a value of this total size: grown by
    /// `reserve`, it would double (and stay twice its size while its reply
    /// is owed), or be copied once per step if the buffer's earlier pieces
    /// are still held.
    Whole(usize),
}

/// Decides [`RoomStep`] for a buffer holding `buf` (bytes not yet
/// delivered) when this connection's values lately reached `largest` bytes.
fn room_step(buf: &BytesMut, largest: usize) -> RoomStep {
    let room = buf.capacity() - buf.len();
    let low = room < READ_CHUNK_BYTES / 4;
    match buf.is_empty() {
        // At a reply boundary with less room than the values lately read:
        // take the next allocation now, while there is nothing to move,
        // rather than read the start of a value that cannot fit and move
        // it once the room runs out (16 KiB values: a quarter of the value
        // bytes were copied so).
        true if low || room < largest => RoomStep::MakeRoom,
        true => RoomStep::Keep,
        false => match pending_value_len(buf) {
            Some(total) if total > buf.capacity() && total > read_room(largest) => {
                RoomStep::Whole(total)
            }
            // The value cannot finish in this allocation, so what is held
            // of it moves: now, while that is least, rather than once the
            // reads have filled the room left.
            Some(total) if total > buf.capacity() => RoomStep::MakeRoom,
            _ if low => RoomStep::MakeRoom,
            _ => RoomStep::Keep,
        },
    }
}

/// Cuts every complete reply piece off the buffer and hands it to its
/// waiter, oldest first.
/// `now` is when the bytes were read.
fn deliver(
    conn: &Conn,
    read_buf: &mut BytesMut,
    now: Instant,
) -> Result<Delivered, BackendErrorKind> {
    let shared = &conn.shared;
    let max_value = shared.max_reply_value();
    let mut delivered = Delivered::default();
    let mut guard = conn.state.borrow_mut();
    let state = &mut *guard;
    // `now` in the clock's nanoseconds, once a reply needs it.
    let mut now_nanos = None;
    loop {
        let Some(front) = state.waiting.front_mut() else {
            if read_buf.is_empty() {
                return Ok(delivered);
            }
            // Bytes nobody asked for: the stream is out of step.
            return Err(BackendErrorKind::Protocol(ReplyError::Unsolicited));
        };
        let tag = if front.tagged {
            state.tags.front()
        } else {
            None
        };
        let piece = match next_piece(read_buf, &mut front.expect, max_value) {
            Err(e) => return Err(BackendErrorKind::Protocol(e)),
            Ok(None) => return Ok(delivered),
            Ok(Some(piece)) => piece,
        };
        match piece {
            Piece::Value { len, key, .. } => {
                delivered.largest = delivered.largest.max(len);
                let bytes = read_buf.split_to(len);
                // Known before the tag goes: it may carry what shows a lease.
                let lease = holds_lease(&front.expect, &bytes, key.end);
                if lease {
                    note_lease(front.slot.as_deref(), &front.expect, &bytes);
                }
                let bytes = match tag {
                    // The one reply of a quiet meta request.
                    Some(tag) => untag(bytes, tag).map_err(protocol_error)?,
                    None => bytes.freeze(),
                };
                if lease {
                    // Another sidecar's hand-off lease: a miss, so nothing
                    // to hand on (a quiet `mg` says nothing on a miss).
                    continue;
                }
                if front.probe {
                    if let Some(limit) = item_size_max(&bytes) {
                        shared.item_size_max.store(limit, Ordering::Relaxed);
                    }
                } else if let Some(slot) = &front.slot {
                    // Classified here, once: a classic block is a hit; a
                    // quiet meta request's one reply says what it says.
                    front.said = match front.expect {
                        Expect::Values { .. } => Outcome::Value,
                        _ => Outcome::of(&bytes),
                    };
                    slot.push(Got::Value(bytes));
                }
            }
            Piece::Last { len } | Piece::Error { len } => {
                let quiet_end = matches!(front.expect, Expect::Meta { quiet: true, .. })
                    && matches!(piece, Piece::Last { .. });
                // A retrieval's `END` is memring's to write (once, after
                // merging); every other last line is the reply itself.
                // Likewise the `MN` that ends a quiet meta reply.
                let is_end = matches!(piece, Piece::Last { .. })
                    && matches!(
                        front.expect,
                        Expect::Values { .. } | Expect::Meta { quiet: true, .. }
                    );
                let wanted = !front.probe && front.slot.is_some() && !is_end;
                // A retrieval's `END` (or a quiet reply's `MN`) holds no lease.
                let lease = !is_end && holds_lease(&front.expect, &read_buf[..len], 0);
                if lease {
                    note_lease(front.slot.as_deref(), &front.expect, &read_buf[..len]);
                }
                let bytes = match (tag, quiet_end) {
                    (Some(tag), false) => {
                        Some(untag(read_buf.split_to(len), tag).map_err(protocol_error)?)
                    }
                    _ if wanted => Some(read_buf.split_to(len).freeze()),
                    // Nobody reads it: no piece to count references to.
                    _ => {
                        read_buf.advance(len);
                        None
                    }
                };
                // An `mg` that found another sidecar's hand-off lease
                // answers as memcached does for a miss.
                let bytes = match bytes {
                    Some(reply) if lease => {
                        let base64_key = tag.and_then(Tag::base64_key);
                        Some(lease::meta_miss(&reply, base64_key))
                    }
                    bytes => bytes,
                };
                let waiting = state.waiting.pop_front().expect("front exists");
                if waiting.tagged {
                    state.tags.pop_front();
                }
                // The next request's time starts when this one is answered.
                state.progress = now;
                if waiting.probe {
                    delivered.probe = true;
                    continue;
                }
                delivered.requests += 1;
                let now_nanos = *now_nanos.get_or_insert_with(|| conn.clock.nanos_at(now));
                conn.latency
                    .observe_nanos(now_nanos.saturating_sub(waiting.queued));
                if let Some(slot) = waiting.slot {
                    // What the reply says, classified once where it is
                    // framed: its line, or for a retrieval (and a quiet
                    // meta request) what its values said before the end.
                    let said = match (is_end, bytes) {
                        (false, Some(bytes)) => {
                            let said = Outcome::of(&bytes);
                            slot.push(Got::Line(bytes));
                            said
                        }
                        (true, _) if waiting.said == Outcome::Nothing && !quiet_end => Outcome::End,
                        _ => waiting.said,
                    };
                    slot.finish(Ok(said));
                }
            }
        }
    }
}

/// Whether a reply piece framed against `expect` is a hand-off lease
/// (`protocol::lease`) its reader takes for a miss: a classic `VALUE` block
/// (its key ending at `key_end`), or the reply of an `mg` (before its tag
/// and the flags memring added to show a lease are removed).
fn holds_lease(expect: &Expect, piece: &[u8], key_end: usize) -> bool {
    match expect {
        Expect::Values { .. } => lease::classic_value_is_lease(piece, key_end),
        Expect::Meta {
            command: MetaCommand::Get,
            ..
        } if expect.hides_leases() => lease::meta_reply_is_lease(piece),
        _ => false,
    }
}

/// Hands the cas of a lease an `mg` reply showed to the request's slot.
fn note_lease(slot: Option<&Slot>, expect: &Expect, reply: &[u8]) {
    if let (Some(slot), Expect::Meta { .. }) = (slot, expect) {
        if let Some(cas) = lease::meta_reply_cas(reply) {
            slot.met_lease(cas);
        }
    }
}

fn protocol_error(error: MetaReplyError) -> BackendErrorKind {
    BackendErrorKind::Protocol(ReplyError::Meta(error))
}

#[cfg(test)]
mod tests {
    //! The connection task against a scripted server: each test's server
    //! answers the probe like memcached, then misbehaves in one way. Every
    //! request must get exactly its own reply or an error, never another's.

    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;
    use crate::backend::{Backend, BackendSettings, PoolHooks};
    use crate::config::ServerConfig;
    use crate::error::BackendError;
    use crate::protocol::reply::LineKind;
    use crate::stats::Stats;
    use tokio::sync::Notify;

    const PROBE_REPLY: &[u8] = b"STAT item_size_max 1048576\r\nEND\r\n";

    /// A server on a free port: `script` gets each accepted socket (the
    /// `n`th, on a thread of its own) after the probe was read and answered.
    fn scripted(
        script: impl Fn(usize, &mut std::net::TcpStream) + Send + Sync + 'static,
    ) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let script = Arc::new(script);
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate().take(8) {
                let Ok(mut stream) = stream else { return };
                let script = script.clone();
                std::thread::spawn(move || {
                    let mut probe = [0u8; PROBE.len()];
                    if stream.read_exact(&mut probe).is_ok() {
                        let _ = stream.write_all(PROBE_REPLY);
                        script(n, &mut stream);
                    }
                });
            }
        });
        addr
    }

    /// Reads one request line from the socket.
    fn read_line(stream: &mut std::net::TcpStream) -> Vec<u8> {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while stream.read_exact(&mut byte).is_ok() {
            line.push(byte[0]);
            if byte[0] == b'\n' {
                break;
            }
        }
        line
    }

    /// Runs `test` on a current-thread runtime with a connection to `addr`.
    fn with_conn<F, Fut>(addr: &str, timeout_ms: u64, test: F)
    where
        F: FnOnce(Rc<Conn>, Rc<Wake>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        with_conn_limited(addr, timeout_ms, 0, test);
    }

    /// [`with_conn`] with `max_server_inflight = max_inflight`.
    fn with_conn_limited<F, Fut>(addr: &str, timeout_ms: u64, max_inflight: usize, test: F)
    where
        F: FnOnce(Rc<Conn>, Rc<Wake>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async {
            let hooks = PoolHooks {
                health_changed: Arc::new(Notify::new()),
                stats: Arc::new(Stats::new()),
                tls: None,
                pool: "default".into(),
            };
            let server = ServerConfig::plain("scripted", addr.to_string());
            let settings = BackendSettings {
                connections: 1,
                connect_timeout: Duration::from_millis(2000),
                request_timeout: Duration::from_millis(timeout_ms),
                failure_limit: 100,
                max_value_bytes: None,
                dns: crate::inputs::resolve::Dns::default(),
                max_inflight,
            };
            let backend = Backend::new(&server, settings, &hooks);
            let conn = Conn::new(backend.shared().clone(), Rc::new(TurnClock::new()));
            let drain = CancellationToken::new();
            tokio::task::spawn_local(run(conn.clone(), drain.clone()));
            let wake = Rc::new(Wake::new());
            tokio::time::timeout(Duration::from_secs(20), test(conn, wake))
                .await
                .expect("test finished in time");
            drain.cancel();
            drop(backend);
        });
    }

    fn get(key: &str) -> (Bytes, Expect) {
        let line = Bytes::from(format!("get {key}\r\n"));
        (line.clone(), Expect::values(line))
    }

    /// Waits until `slot` is done; returns its pieces and outcome.
    async fn outcome(slot: &Slot, wake: &Wake) -> (Vec<Got>, Result<Outcome, BackendError>) {
        loop {
            if let Some(result) = slot.outcome() {
                let mut pieces = Vec::new();
                while let Some(piece) = slot.take() {
                    pieces.push(piece);
                }
                return (pieces, result);
            }
            wake.notified().await;
        }
    }

    fn send(conn: &Conn, wake: &Rc<Wake>, request: (Bytes, Expect)) -> Rc<Slot> {
        let slot = Slot::new(wake.clone());
        // A connect may still be under way: retry a refused send briefly.
        conn.send(&[request.0], request.1, Some(slot.clone()))
            .expect("queued");
        slot
    }

    #[test]
    fn the_read_buffer_grows_by_a_few_of_the_largest_values() {
        assert_eq!(read_room(0), READ_CHUNK_BYTES);
        assert_eq!(read_room(100), READ_CHUNK_BYTES);
        // Four replies of 16 KiB values, each with its `END`, fit whole.
        assert_eq!(read_room(16_400), 65_728);
        assert!(read_room(16_400) >= 4 * (16_400 + b"END\r\n".len()));
        assert_eq!(read_room(usize::MAX), MAX_READ_ROOM_BYTES);
    }

    #[test]
    fn the_read_buffer_is_renewed_at_a_reply_boundary_before_a_value_cannot_fit() {
        let with = |capacity: usize, held: &[u8]| {
            let mut buf = BytesMut::with_capacity(capacity);
            buf.extend_from_slice(held);
            buf
        };
        let value = 16_400;
        // Nothing held, room for fewer bytes than the values lately read.
        assert_eq!(room_step(&with(10_000, b""), value), RoomStep::MakeRoom);
        // Nothing held and room enough, or small values.
        assert_eq!(room_step(&with(20_000, b""), value), RoomStep::Keep);
        assert_eq!(room_step(&with(10_000, b""), 40), RoomStep::Keep);
        // Mid-value, the rest fits: read on, nothing moved.
        let head = b"VALUE k 0 16384\r\n";
        assert_eq!(room_step(&with(20_000, head), value), RoomStep::Keep);
        // Little room left whatever is held.
        assert_eq!(room_step(&with(4_000, head), value), RoomStep::MakeRoom);
        // Room left, but not for the rest of this value: it moves now,
        // while only its header is held.
        assert_eq!(room_step(&with(16_000, head), value), RoomStep::MakeRoom);
        // A value larger than the room a buffer takes gets its own.
        let big = b"VALUE k 0 900000\r\n";
        assert_eq!(
            room_step(&with(20_000, big), value),
            RoomStep::Whole(900_020)
        );
    }

    #[test]
    fn a_reply_split_at_every_byte_reaches_its_request_whole() {
        let reply = b"VALUE k 0 5\r\nab\r\nc\r\nEND\r\n";
        let addr = scripted(move |_, stream| {
            assert_eq!(read_line(stream), b"get k\r\n");
            for byte in reply {
                let _ = stream.write_all(&[*byte]);
                let _ = stream.flush();
            }
            let _ = read_line(stream);
        });
        with_conn(&addr, 5000, |conn, wake| async move {
            let slot = send(&conn, &wake, get("k"));
            let (pieces, result) = outcome(&slot, &wake).await;
            assert_eq!(result, Ok(Outcome::Value));
            assert_eq!(
                pieces,
                vec![Got::Value(Bytes::from_static(
                    b"VALUE k 0 5\r\nab\r\nc\r\n"
                ))]
            );
        });
    }

    /// The connection classifies each reply where it frames it and hands
    /// the outcome over with the bytes: no reader looks at them again.
    #[test]
    fn each_reply_comes_with_what_it_says() {
        let addr = scripted(|_, stream| {
            assert_eq!(read_line(stream), b"set k 0 0 1\r\n");
            assert_eq!(read_line(stream), b"x\r\n");
            assert_eq!(read_line(stream), b"incr k 2\r\n");
            assert_eq!(read_line(stream), b"delete j\r\n");
            assert_eq!(read_line(stream), b"get j\r\n");
            assert_eq!(read_line(stream), b"get k\r\n");
            let _ = stream.write_all(
                b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n\
                  NOT_FOUND\r\nEND\r\nSERVER_ERROR out of memory\r\n",
            );
            let _ = read_line(stream);
        });
        with_conn(&addr, 5000, |conn, wake| async move {
            let line = |request: &'static [u8], kind| {
                let slot = Slot::new(wake.clone());
                conn.send(
                    &[Bytes::from_static(request)],
                    Expect::Line(kind),
                    Some(slot.clone()),
                )
                .expect("queued");
                slot
            };
            let set = line(b"set k 0 0 1\r\nx\r\n", LineKind::Storage);
            let incr = line(b"incr k 2\r\n", LineKind::Arithmetic);
            let delete = line(b"delete j\r\n", LineKind::Delete);
            let miss = send(&conn, &wake, get("j"));
            let failed = send(&conn, &wake, get("k"));
            for (slot, said) in [
                (&set, Outcome::Stored),
                (&incr, Outcome::NotANumber),
                (&delete, Outcome::NotFound),
                (&miss, Outcome::End),
                (&failed, Outcome::ServerError),
            ] {
                assert_eq!(outcome(slot, &wake).await.1, Ok(said));
            }
        });
    }

    #[test]
    fn a_stray_reply_fails_what_is_in_flight_and_reaches_nobody() {
        let addr = scripted(|n, stream| {
            if n == 0 {
                let _ = read_line(stream);
                let _ = stream.write_all(b"END\r\nEND\r\n");
                let _ = read_line(stream);
            } else {
                assert_eq!(read_line(stream), b"get b\r\n");
                let _ = stream.write_all(b"VALUE b 0 1\r\n2\r\nEND\r\n");
                let _ = read_line(stream);
            }
        });
        with_conn(&addr, 5000, |conn, wake| async move {
            let first = send(&conn, &wake, get("a"));
            let (_, result) = outcome(&first, &wake).await;
            // The first `END` answered `a`; the stray one broke the connection.
            assert_eq!(result, Ok(Outcome::End));
            // The next request goes out on a new connection and gets its own
            // reply, never the stray bytes.
            let second = loop {
                let slot = Slot::new(wake.clone());
                if conn
                    .send(&[get("b").0], get("b").1, Some(slot.clone()))
                    .is_ok()
                {
                    let (pieces, result) = outcome(&slot, &wake).await;
                    if result.is_ok() {
                        break pieces;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert_eq!(
                second,
                vec![Got::Value(Bytes::from_static(b"VALUE b 0 1\r\n2\r\n"))]
            );
        });
    }

    #[test]
    fn a_truncated_value_then_close_fails_the_request() {
        let addr = scripted(|_, stream| {
            let _ = read_line(stream);
            let _ = stream.write_all(b"VALUE k 0 5\r\nab");
        });
        with_conn(&addr, 5000, |conn, wake| async move {
            let slot = send(&conn, &wake, get("k"));
            let (pieces, result) = outcome(&slot, &wake).await;
            assert!(pieces.is_empty(), "{pieces:?}");
            assert_eq!(result.unwrap_err().kind, BackendErrorKind::Closed);
        });
    }

    #[test]
    fn a_reply_not_allowed_for_the_request_breaks_the_connection() {
        let addr = scripted(|_, stream| {
            let _ = read_line(stream);
            let _ = stream.write_all(b"HELLO I AM NOT MEMCACHED\r\n");
            let _ = read_line(stream);
        });
        with_conn(&addr, 5000, |conn, wake| async move {
            let slot = Slot::new(wake.clone());
            conn.send(
                &[Bytes::from_static(b"set k 0 0 1\r\nx\r\n")],
                Expect::Line(LineKind::Storage),
                Some(slot.clone()),
            )
            .expect("queued");
            let (pieces, result) = outcome(&slot, &wake).await;
            assert!(pieces.is_empty());
            assert!(matches!(
                result.unwrap_err().kind,
                BackendErrorKind::Protocol(ReplyError::UnexpectedLine)
            ));
        });
    }

    #[test]
    fn a_late_reply_after_the_timeout_reaches_nobody() {
        let addr = scripted(|n, stream| {
            let request = read_line(stream);
            if n == 0 {
                // Stall until memring timed out and closed the socket (a
                // fixed stall could end first on a loaded machine), then
                // answer on the dead socket.
                let _ = read_line(stream);
                let _ = stream.write_all(b"VALUE a 0 1\r\n1\r\nEND\r\n");
            } else {
                assert_eq!(request, b"get b\r\n");
                let _ = stream.write_all(b"END\r\n");
            }
            let _ = read_line(stream);
        });
        with_conn(&addr, 200, |conn, wake| async move {
            let first = send(&conn, &wake, get("a"));
            let (pieces, result) = outcome(&first, &wake).await;
            assert!(pieces.is_empty());
            assert_eq!(result.unwrap_err().kind, BackendErrorKind::Timeout);
            let second = loop {
                let slot = Slot::new(wake.clone());
                if conn
                    .send(&[get("b").0], get("b").1, Some(slot.clone()))
                    .is_ok()
                {
                    break outcome(&slot, &wake).await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert_eq!(second, (vec![], Ok(Outcome::End)));
        });
    }

    #[test]
    fn past_max_inflight_a_silent_server_gets_no_more_requests() {
        // Reads requests and answers none until the test's fourth request
        // was refused, then answers the two it holds.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Mutex::new(rx);
        let addr = scripted(move |_, stream| {
            assert_eq!(read_line(stream), b"get a\r\n");
            assert_eq!(read_line(stream), b"get b\r\n");
            let _ = rx.lock().expect("one connection").recv();
            let _ = stream.write_all(b"END\r\nEND\r\n");
            // The refused requests never reach the server.
            assert_eq!(read_line(stream), b"get e\r\n");
            let _ = stream.write_all(b"END\r\n");
            let _ = read_line(stream);
        });
        with_conn_limited(&addr, 5000, 2, |conn, wake| async move {
            let first = send(&conn, &wake, get("a"));
            let second = send(&conn, &wake, get("b"));
            for key in ["c", "d"] {
                let refused = conn.send(&[get(key).0], get(key).1, Some(Slot::new(wake.clone())));
                assert_eq!(refused, Err(BackendErrorKind::Busy));
                let error = conn.error(BackendErrorKind::Busy);
                assert_eq!(error.to_string(), "server busy");
            }
            assert_eq!(conn.shared.metrics.rejected_busy.get(), 2);
            // A refusal is memring's, not a failure of the server.
            assert_eq!(conn.shared.metrics.error_count(), 0);
            tx.send(()).expect("server waits");
            assert_eq!(outcome(&first, &wake).await, (vec![], Ok(Outcome::End)));
            assert_eq!(outcome(&second, &wake).await, (vec![], Ok(Outcome::End)));
            // Answered: room again.
            let third = send(&conn, &wake, get("e"));
            assert_eq!(outcome(&third, &wake).await, (vec![], Ok(Outcome::End)));
        });
    }

    #[test]
    fn max_inflight_is_shared_between_a_servers_connections() {
        let settings = |connections, max_inflight| BackendSettings {
            connections,
            connect_timeout: Duration::from_millis(1),
            request_timeout: Duration::from_millis(1),
            failure_limit: 1,
            max_value_bytes: None,
            dns: crate::inputs::resolve::Dns::default(),
            max_inflight,
        };
        assert_eq!(settings(1, 4096).max_inflight_per_connection(), 4096);
        assert_eq!(settings(3, 10).max_inflight_per_connection(), 4);
        assert_eq!(settings(4, 1).max_inflight_per_connection(), 1);
        assert_eq!(settings(2, 0).max_inflight_per_connection(), usize::MAX);
    }

    #[test]
    fn a_slow_big_reply_that_keeps_coming_is_not_a_timeout() {
        let addr = scripted(|_, stream| {
            let _ = read_line(stream);
            let _ = stream.write_all(b"VALUE k 0 15\r\n");
            // Fifteen bytes over 1.5 s, against a 1 s timeout: progress each
            // time (the gaps stay far under it on a loaded machine too).
            for _ in 0..15 {
                std::thread::sleep(Duration::from_millis(100));
                let _ = stream.write_all(b"x");
            }
            let _ = stream.write_all(b"\r\nEND\r\n");
            let _ = read_line(stream);
        });
        with_conn(&addr, 1000, |conn, wake| async move {
            let slot = send(&conn, &wake, get("k"));
            let (pieces, result) = outcome(&slot, &wake).await;
            assert_eq!(result, Ok(Outcome::Value));
            assert_eq!(pieces.len(), 1);
        });
    }

    /// What sessions queue goes behind what is being written, and is
    /// written where it was copied once nothing else is.
    #[test]
    fn queued_requests_follow_what_is_being_written_in_order() {
        let (mut writing, mut queued) = (OutQueue::default(), OutQueue::default());
        queued.push(Bytes::from_static(b"get a\r\n"));
        take_queued(&mut writing, &mut queued);
        assert!(queued.is_empty());
        assert_eq!(writing.chunk(), b"get a\r\n");
        // A partial write left some: the next requests go behind it.
        writing.advance(4);
        queued.push(Bytes::from_static(b"get b\r\n"));
        take_queued(&mut writing, &mut queued);
        assert!(queued.is_empty());
        let mut written = Vec::new();
        while writing.has_remaining() {
            let step = writing.chunk().len();
            written.extend_from_slice(writing.chunk());
            writing.advance(step);
        }
        assert_eq!(written, b"a\r\nget b\r\n");
        queued.push(Bytes::from_static(b"get c\r\n"));
        take_queued(&mut writing, &mut queued);
        assert_eq!(writing.chunk(), b"get c\r\n");
        assert!(queued.is_empty());
    }

    /// A waiter is moved in at each send and out at each reply: kept small
    /// (a tag, which only some meta requests have, lives apart).
    #[test]
    fn a_waiter_is_small() {
        let size = std::mem::size_of::<Waiting>();
        assert!(size <= 72, "{size} bytes");
    }
}
