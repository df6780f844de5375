//! One client connection: read → parse → plan → dispatch → replies in request
//! order. This file is the I/O loop only (the socket, its deadlines, the
//! lingering close); the client's entries and byte budget, and the rounds
//! of parsing, dispatching and collecting, are `client.rs`. What goes where
//! is decided by `route::plan`, turned into work (`work.rs`) by `start.rs`,
//! and each entry is sent (`dispatch.rs`) and answered (`finish.rs`) by the
//! client's `Exchange` (`exchange.rs`).
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

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::backend::slot::{Got, Slot};

use crate::hotkeys::{GetShortcut, WriteGuard};
use crate::plan::handoff::Moved;
use crate::plan::placement::Placement;
use crate::plan::route::{self, broadcast_answer, decide, Broadcast, CallResult, Decision, Plan};
use crate::pools::topology::{SharedTopology, Topology};
use crate::protocol::encode::{forwardable, write_server_error};
use crate::protocol::meta::{is_meta_request, parse_meta, MetaCommand, MetaRequest};
use crate::protocol::reply::{Expect, LineKind};
use crate::protocol::request::{parse_request_reusing, Keys};
use crate::protocol::{parse_request, Command, Limits, Request};
use crate::runtime::clock::TurnClock;
use crate::runtime::outbuf::OutQueue;
use crate::runtime::wake::{Cancel, Wake};
use shard::WorkerCtx;

mod client;
mod copy_check;
mod deadline;
mod dispatch;
mod exchange;
mod fifo;
mod finish;
mod health;
pub(crate) mod report;
mod request_log;
mod shadow;
pub(crate) mod shard;
mod spares;
mod start;
mod work;

pub(crate) use spares::shed as shed_spares;

use crate::runtime::budget::{ClientBudget, Reservation};
use crate::runtime::recycled::RecycledBuf;
use client::{ClientSession, TurnTopology};
use copy_check::CopiesUnderWay;
use deadline::{Progress, Waiting};
use exchange::Exchange;
use fifo::{Before, Fifo};
use work::*;

/// The room to make in a client's input buffer before the next read, if
/// any: when it runs low, or at a request boundary with less room than the
/// client's large requests take. Made then, while the buffer holds nothing
/// to move, a big `set` is read into one allocation instead of being moved
/// to a larger one as its bytes arrive. Only requests up to
/// [`BOUNDARY_ROOM_BYTES`] count: room for a larger one made in advance
/// would stay with every client that once sent one, idle or not.
fn input_room(input: &BytesMut, largest_request: usize) -> Option<usize> {
    let room = input.capacity() - input.len();
    let ahead = largest_request.min(BOUNDARY_ROOM_BYTES);
    let low = room < MIN_READ_ROOM_BYTES || (input.is_empty() && room < ahead);
    low.then(|| input.capacity().max(FIRST_READ_BYTES).max(ahead))
}

/// The most room a client's input buffer takes in advance of a request
/// (see [`input_room`]): about what a buffer that once read a request of
/// this size keeps anyway.
const BOUNDARY_ROOM_BYTES: usize = 32 * 1024;

/// First read buffer of a client: small, so that thousands of idle clients
/// cost little; it grows while a client sends more.
const FIRST_READ_BYTES: usize = 2 * 1024;
/// Room kept free before each read.
const MIN_READ_ROOM_BYTES: usize = 512;
/// How long a closing session keeps reading (and dropping) what its client
/// still sends after memring's last reply, so that closing sends no reset.
const LINGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a client with nothing in flight keeps its read and reply
/// buffers before it gives them to its worker's shelf: long against the gap
/// between a busy client's requests, short against an idle one's life.
/// In the worker clock's nanoseconds.
const PARK_AFTER_IDLE_NANOS: u64 = 500_000_000;
/// What a closing session reads (and drops) at a time while it lingers.
const LINGER_READ_BYTES: usize = 4096;

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
    let peer = peer_for_log(&worker, &stream);
    let (reader, writer) = stream.split();
    serve(reader, writer, (id, peer), worker, bound).await
}

/// [`run_session`] for a client of a Unix-socket listener.
pub(crate) async fn run_unix_session(
    mut stream: tokio::net::UnixStream,
    id: u64,
    worker: Rc<WorkerCtx>,
    bound: Option<SharedTopology>,
) -> io::Result<()> {
    let (reader, writer) = stream.split();
    // A Unix-socket client has no address: the request log shows `-`.
    serve(reader, writer, (id, None), worker, bound).await
}

/// [`run_session`] for a client that connected with TLS (handshake done).
/// Its lingering close sends TLS's `close_notify` before the TCP FIN.
pub(crate) async fn run_tls_session(
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    id: u64,
    worker: Rc<WorkerCtx>,
) -> io::Result<()> {
    let peer = peer_for_log(&worker, stream.get_ref().0);
    let (reader, writer) = tokio::io::split(stream);
    serve(reader, writer, (id, peer), worker, None).await
}

/// The client's address, for the request log's lines: asked of the kernel
/// once per client, and only when the log is on.
fn peer_for_log(worker: &WorkerCtx, stream: &TcpStream) -> Option<std::net::SocketAddr> {
    if worker.request_log.on {
        stream.peer_addr().ok()
    } else {
        None
    }
}

/// The session's loop on the two halves of its stream; monomorphised per
/// stream type, so the plain path pays nothing for TLS.
async fn serve<R, W>(
    mut reader: R,
    mut writer: W,
    (id, peer): (u64, Option<std::net::SocketAddr>),
    worker: Rc<WorkerCtx>,
    bound: Option<SharedTopology>,
) -> io::Result<()>
where
    R: crate::tls::Readable,
    W: crate::tls::Flush,
{
    // Reply bytes written into a TLS stream that it may not have sent yet.
    let mut unflushed = false;
    let mut client = ClientSession::new(id, worker.clone(), bound);
    client.peer = peer;
    // Allocated when the first bytes can be read (see `parked` below).
    let mut input = RecycledBuf::new(FIRST_READ_BYTES);
    // Set when the socket said it has input: the next turn reads it rather
    // than park again.
    let mut readable = false;
    // Idle for PARK_AFTER_IDLE_NANOS (the session timer fired for it), or not yet
    // read from: the next idle wait gives the buffers back. A busy client,
    // idle only between its requests, keeps them and pays nothing per
    // request for parking.
    let mut park_due = true;
    let settings = worker.settings;
    let clock = worker.clock.clone();
    let started = clock.tick();
    let mut progress = Progress::new(started, settings.idle_timeout, settings.write_timeout);
    let mut shutdown = Cancel::new(&worker.shutdown);
    // One timer for the session's deadlines, moved rather than made anew
    // each turn, and only when a deadline is earlier than the one it is
    // set to (see `until`).
    let timer = tokio::time::sleep_until(clock.instant_at(started));
    tokio::pin!(timer);
    // Where the timer is set (the clock's nanoseconds), and whether it
    // holds this task's waker (see `until`).
    let (timer_at, armed) = (std::cell::Cell::new(started), std::cell::Cell::new(false));
    // Whether the socket holds this task's waker for input (see `read_once`).
    let read_armed = std::cell::Cell::new(false);
    let result = loop {
        // One clock read per wake-up (at the end of the loop): what runs
        // for this session until it waits again takes that time.
        let now = clock.nanos();
        take_in(&mut client, &mut input, &mut progress, now);
        if client.exchange.out.has_remaining() {
            // A reply usually fits the socket at once: write it in this turn
            // rather than in one more pass of the loop just for the write.
            // The select below waits for whatever this leaves.
            match write_now(&mut writer, &mut client.exchange.out).await {
                Some(Ok(Some(n))) => {
                    worker.stats.written_bytes(n);
                    progress.wrote(now);
                    unflushed = W::BUFFERS;
                    // What was written left the budget: entries it held
                    // back may go now, and nothing else may wake the loop
                    // for them (their client waits for their replies).
                    if !client.entries.all_dispatched() {
                        continue;
                    }
                }
                Some(Ok(None)) | None => {}
                Some(Err(e)) => break Err(e),
            }
        }
        client.count_out();
        if client.exchange.out.is_empty() {
            progress.wrote(now);
        }
        if client.closing && client.entries.is_empty() && client.exchange.out.is_empty() {
            break linger(&mut reader, &mut writer).await;
        }
        client.end_turn();
        let can_read = client.can_read();
        // Idle, with nothing read ahead: wait for input without a buffer,
        // and give back the ones only requests and replies use, so an idle
        // client costs little more than its socket (issue 48). They go to
        // this worker's shelf, where the next busy session takes them.
        let idle = R::WAITS_WITHOUT_BUFFER && !readable && input.is_empty() && client.is_idle();
        let parked = idle && park_due;
        let park_at = (idle && !parked).then(|| now.saturating_add(PARK_AFTER_IDLE_NANOS));
        park_or_make_room(&mut client, &mut input, parked, readable, can_read);
        let waiting = Waiting {
            writing: client.exchange.out.has_remaining(),
            owed_nothing: client.entries.is_empty() && client.exchange.out.is_empty(),
            partial_input: !input.is_empty(),
        };
        let deadline = progress.deadline(waiting);
        // The one session timer serves both: the earlier of the two.
        let parks_first = park_at.is_some_and(|at| deadline.map_or(true, |d| at < d));
        let wake_at = if parks_first { park_at } else { deadline };
        // What the arm below did: bytes written, bytes read (the first of a
        // new request?).
        let (mut wrote, mut got) = (false, None);
        tokio::select! {
            biased;
            () = client.exchange.wake.notified() => {}
            written = crate::tls::write_or_flush(&mut writer, &mut client.exchange.out),
                if client.exchange.out.has_remaining() || (W::BUFFERS && unflushed) =>
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
            read = read_or_wait(&mut reader, &mut input, parked, &read_armed),
                if can_read || parked =>
            {
                match read {
                    // The next turn takes a buffer and reads.
                    Input::Readable(Ok(())) => readable = true,
                    Input::Read(Ok(0)) => client.closing = true,
                    Input::Read(Ok(n)) => {
                        readable = false;
                        park_due = false;
                        got = Some(n == input.len());
                        worker.stats.read_bytes(n);
                    }
                    Input::Read(Err(e)) | Input::Readable(Err(e)) => break Err(e),
                }
            }
            () = until(timer.as_mut(), &armed, &timer_at, wake_at, now, &clock), if wake_at.is_some() => {
                if parks_first {
                    park_due = true;
                } else {
                    // Idle, stuck mid-request, or not reading its replies.
                    break Ok(());
                }
            }
            () = shutdown.cancelled(), if !client.closing => {
                client.closing = true;
            }
        }
        let now = clock.tick();
        if wrote {
            progress.wrote(now);
        }
        if let Some(first_bytes) = got {
            progress.read(now, first_bytes);
        }
    };
    // Dropping the session gives back every reservation and its queue.
    client.exchange.wake.forget_waiter();
    result
}

/// One turn's parsing: parses what `input` holds and moves the client's
/// entries on, and parses again while answers collected meanwhile made room
/// for requests `input` already holds, since no wake-up may come for them
/// (the client has sent everything and waits, and the replies still owed
/// may be quiet). One wake per turn, not one per reply slot, leaves no
/// spare turn to do it later.
#[inline]
fn take_in(client: &mut ClientSession, input: &mut BytesMut, progress: &mut Progress, now: u64) {
    let max_pending = client.worker.settings.max_pending;
    loop {
        let unparsed = input.len();
        client.parse(input);
        if input.len() < unparsed {
            progress.parsed(now);
        }
        let full = client.outstanding() >= max_pending;
        client.count_out();
        client.advance();
        if !(full && !input.is_empty() && client.outstanding() < max_pending) {
            return;
        }
    }
}

/// Before the session waits: with `parked`, gives its buffers back (see
/// `serve`); else takes them again once the socket is `readable`, and makes
/// room in `input` for what it `can_read`.
#[inline]
fn park_or_make_room(
    client: &mut ClientSession,
    input: &mut RecycledBuf,
    parked: bool,
    readable: bool,
    can_read: bool,
) {
    if parked {
        input.park();
        client.park_buffers();
        return;
    }
    if readable {
        client.unpark();
    }
    if let Some(room) = input_room(input, client.largest_request).filter(|_| can_read) {
        input.make_room(room);
    }
}

/// What the session's read arm saw.
enum Input {
    /// Bytes read into the buffer (0: end of stream).
    Read(io::Result<usize>),
    /// Parked: the socket has input to read.
    Readable(io::Result<()>),
}

/// Reads into `input`, or, `parked`, waits for input without a buffer.
async fn read_or_wait<R: crate::tls::Readable>(
    reader: &mut R,
    input: &mut BytesMut,
    parked: bool,
    armed: &std::cell::Cell<bool>,
) -> Input {
    if parked {
        // Waits in tokio's list of waiters, not in the socket's reader slot.
        armed.set(false);
        Input::Readable(reader.readable().await)
    } else {
        Input::Read(read_once(reader, input, armed).await)
    }
}

/// Reads into `input`. `armed` says whether the socket holds the task's
/// waker for input: set by a poll that found nothing to read (it left the
/// waker in the socket's reader slot), cleared by any other outcome. tokio
/// sets a socket's read readiness before it takes that waker to wake the
/// task, and only this half's own reads clear it; so while the readiness
/// stays clear the waker is still there, and the read is not polled: a
/// busy client's every wait between its requests would lock the slot and
/// store the same waker again (about 170 instructions). The unit test
/// `a_read_found_empty_keeps_the_waker_until_input_shows_in_the_readiness`
/// pins that behaviour of tokio.
async fn read_once<R: crate::tls::Readable>(
    reader: &mut R,
    input: &mut BytesMut,
    armed: &std::cell::Cell<bool>,
) -> io::Result<usize> {
    std::future::poll_fn(|cx| {
        if armed.get() && reader.read_readiness_clear() {
            return std::task::Poll::Pending;
        }
        let read = std::pin::pin!(reader.read_buf(&mut *input));
        let polled = std::future::Future::poll(read, cx);
        // Past the task's cooperative budget a read returns pending without
        // taking the waker (the task is woken at once instead). Read after
        // the poll: a read that found the socket empty may try again and
        // spend the last of the budget on the way.
        armed.set(polled.is_pending() && tokio::task::coop::has_budget_remaining());
        polled
    })
    .await
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
    // On the heap, once per closing session: an array here would be part
    // of every session's future, idle or not, for its whole life.
    let mut scratch = vec![0u8; LINGER_READ_BYTES];
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

/// One attempt to write `out` without waiting: `None` when the socket takes
/// nothing now (the attempt registered for its readiness, as a select arm
/// would).
async fn write_now<W: crate::tls::Flush>(
    writer: &mut W,
    out: &mut OutQueue,
) -> Option<io::Result<Option<usize>>> {
    let write = crate::tls::write_or_flush(writer, out);
    tokio::pin!(write);
    std::future::poll_fn(|cx| match std::future::Future::poll(write.as_mut(), cx) {
        std::task::Poll::Ready(written) => std::task::Poll::Ready(Some(written)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// Whether a timer `set` to fire then is moved for `deadline`: a timer
/// still ahead of `now` and set earlier than `deadline` is left where it is
/// and moved on when it fires. A busy client's deadline moves later with
/// nearly every reply, and moving the timer then costs every request (a
/// timer-wheel update), while one that fires early wakes the session once
/// per earlier deadline.
fn timer_moves(set: u64, deadline: u64, now: u64) -> bool {
    set != deadline && !(now < set && set < deadline)
}

/// Waits on `timer` until `deadline`; never when there is none (see
/// `timer_moves`). `armed` says whether the timer holds the task's waker:
/// set by a poll that found it pending, cleared when it is moved (tokio
/// does not promise that a moved timer keeps its waker) or fires. An armed
/// timer left where it is wakes the task by itself when it fires, so until
/// then it is only asked whether it fired, not polled: a busy client's
/// every wait would register the same waker again (a timer-wheel lock and
/// the task budget, about 2 % of a one-key get). `set_at` is where the
/// timer is set, in `clock`'s nanoseconds like `deadline` and `now`: the
/// timer's `Instant` is made only when it moves.
async fn until(
    mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
    armed: &std::cell::Cell<bool>,
    set_at: &std::cell::Cell<u64>,
    deadline: Option<u64>,
    now: u64,
    clock: &TurnClock,
) {
    let Some(deadline) = deadline else {
        return std::future::pending().await;
    };
    if timer_moves(set_at.get(), deadline, now) {
        armed.set(false);
        set_at.set(deadline);
        timer.as_mut().reset(clock.instant_at(deadline));
    } else if armed.get() {
        let fired = timer.as_ref();
        std::future::poll_fn(|_| {
            if fired.is_elapsed() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }
    wait_armed(timer.as_mut(), armed).await;
    if set_at.get() < deadline {
        // It fired at the earlier deadline kept above: on to this one.
        set_at.set(deadline);
        timer.as_mut().reset(clock.instant_at(deadline));
        wait_armed(timer.as_mut(), armed).await;
    }
}

/// Awaits `timer`, keeping `armed` true only while it holds the task's
/// waker. A poll past the task's cooperative budget returns pending
/// without registering (the task is woken at once instead): not armed.
async fn wait_armed(
    mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
    armed: &std::cell::Cell<bool>,
) {
    std::future::poll_fn(|cx| {
        let registers = tokio::task::coop::has_budget_remaining();
        let polled = std::future::Future::poll(timer.as_mut(), cx);
        armed.set(polled.is_pending() && registers);
        polled
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A waker that only records that it was woken.
    struct Flag(AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Polls `until` once with a waker that records being woken.
    /// Yields until `flag`'s waker was woken, failing with `what` after 10 s.
    async fn woken(flag: &Flag, what: &str) {
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while !flag.0.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < give_up, "{what}");
            tokio::task::yield_now().await;
        }
    }

    fn poll_once(
        timer: std::pin::Pin<&mut tokio::time::Sleep>,
        (armed, set_at): (&Cell<bool>, &Cell<u64>),
        clock: &TurnClock,
        deadline: u64,
        flag: &Arc<Flag>,
    ) -> bool {
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let wait = until(timer, armed, set_at, Some(deadline), clock.tick(), clock);
        tokio::pin!(wait);
        std::future::Future::poll(wait.as_mut(), &mut cx).is_ready()
    }

    #[tokio::test]
    async fn an_armed_timer_wakes_its_task_when_it_fires_and_is_not_polled_till_then() {
        let clock = TurnClock::new();
        let deadline = clock.tick() + 20_000_000;
        let timer = tokio::time::sleep_until(clock.instant_at(clock.nanos()));
        tokio::pin!(timer);
        let armed = Cell::new(false);
        let timer_at = (&armed, &Cell::new(clock.nanos()));
        let first = Arc::new(Flag(AtomicBool::new(false)));
        assert!(!poll_once(
            timer.as_mut(),
            timer_at,
            &clock,
            deadline,
            &first
        ));
        assert!(
            armed.get(),
            "a pending poll leaves the waker with the timer"
        );
        // Asked again for the same deadline (or a later one, kept where it
        // is), the timer is not polled: the waker it holds is the first.
        let later = Arc::new(Flag(AtomicBool::new(false)));
        for at in [deadline, deadline + 1_000_000_000] {
            assert!(!poll_once(timer.as_mut(), timer_at, &clock, at, &later));
        }
        woken(&first, "the timer never woke its task").await;
        assert!(!later.0.load(Ordering::SeqCst));
        // Fired: the wait it woke ends.
        assert!(poll_once(
            timer.as_mut(),
            timer_at,
            &clock,
            deadline,
            &first
        ));
        assert!(!armed.get());
    }

    /// Polls `read_once` once with a waker that records being woken.
    fn poll_read(
        reader: &mut tokio::net::tcp::ReadHalf<'_>,
        input: &mut BytesMut,
        armed: &Cell<bool>,
        flag: &Arc<Flag>,
    ) -> std::task::Poll<io::Result<usize>> {
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let read = std::pin::pin!(read_once(reader, input, armed));
        std::future::Future::poll(read, &mut cx)
    }

    #[tokio::test]
    async fn a_read_found_empty_keeps_the_waker_until_input_shows_in_the_readiness() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (mut reader, _writer) = server.split();
        let mut input = BytesMut::with_capacity(64);
        let armed = Cell::new(false);
        let first = Arc::new(Flag(AtomicBool::new(false)));
        assert!(poll_read(&mut reader, &mut input, &armed, &first).is_pending());
        assert!(
            armed.get(),
            "an empty read leaves the waker with the socket"
        );
        assert!(crate::tls::Readable::read_readiness_clear(&reader));
        // Asked again, the read is not polled: the waker it holds is the
        // first one.
        let later = Arc::new(Flag(AtomicBool::new(false)));
        assert!(poll_read(&mut reader, &mut input, &armed, &later).is_pending());
        client.write_all(b"get k\r\n").await.unwrap();
        woken(&first, "input never woke the task").await;
        assert!(!later.0.load(Ordering::SeqCst));
        // The readiness shows the input, and asking did not clear it.
        assert!(!crate::tls::Readable::read_readiness_clear(&reader));
        assert!(!crate::tls::Readable::read_readiness_clear(&reader));
        match poll_read(&mut reader, &mut input, &armed, &first) {
            std::task::Poll::Ready(Ok(7)) => {}
            other => panic!("expected the 7 bytes sent, got {other:?}"),
        }
        assert!(!armed.get());
        assert_eq!(&input[..], b"get k\r\n");
    }

    #[test]
    fn a_timer_moves_only_for_an_earlier_deadline_or_once_it_is_due() {
        const MS: u64 = 1_000_000;
        let now = 7 * 86_400_000 * MS;
        let set = now + 100 * MS;
        assert!(!timer_moves(set, set, now));
        assert!(!timer_moves(set, set + MS, now));
        assert!(timer_moves(set, set - MS, now));
        assert!(timer_moves(set, set + MS, set));
    }

    fn holding(capacity: usize, held: usize) -> BytesMut {
        let mut buf = BytesMut::with_capacity(capacity);
        buf.resize(held, b'x');
        buf
    }

    #[test]
    fn an_input_buffer_makes_room_when_low_or_at_a_boundary_before_a_big_request() {
        // Small requests: only a buffer running low makes room.
        assert_eq!(input_room(&holding(4096, 0), 40), None);
        assert_eq!(input_room(&holding(4096, 3700), 40), Some(4096));
        // A client of 16 KiB sets: at a boundary with less room than one,
        // room for one is made; mid-request, the buffer reads on.
        assert_eq!(input_room(&holding(10_000, 0), 16_430), Some(16_430));
        assert_eq!(input_room(&holding(40_000, 0), 16_430), None);
        assert_eq!(input_room(&holding(20_000, 9_000), 16_430), None);
        // Room for a request larger than that is not made in advance.
        assert_eq!(input_room(&holding(40_000, 0), 900_000), None);
        assert_eq!(
            input_room(&holding(10_000, 0), 900_000),
            Some(BOUNDARY_ROOM_BYTES)
        );
        // A first buffer is never smaller than the first read's.
        assert_eq!(input_room(&holding(0, 0), 0), Some(FIRST_READ_BYTES));
    }
}
