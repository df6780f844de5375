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

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::backend::health::{HealthEvent, HealthState};
use crate::backend::slot::{Got, Slot};
use crate::backend::Shared;
use crate::error::BackendErrorKind;
use crate::outbuf::OutQueue;
use crate::protocol::reply::{item_size_max, next_piece, Expect, Piece, ReplyError};

const READ_CHUNK_BYTES: usize = 16 * 1024;
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
    /// `None` for the probe and for `noreply` requests (whose reply memring
    /// asked for, to stay in step, and drops here).
    slot: Option<Rc<Slot>>,
    probe: bool,
    queued: Instant,
}

struct State {
    phase: Phase,
    /// Bytes queued by sessions and not yet taken by the task.
    queued: OutQueue,
    /// Every request queued on this connection, oldest first.
    waiting: VecDeque<Waiting>,
    /// When the server last made progress on what it owes.
    progress: Instant,
    /// The task has ended; a new connection must be made.
    closed: bool,
}

/// One worker's connection to one server.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    state: RefCell<State>,
    /// Wakes the task: requests were queued.
    wake: Notify,
}

impl Conn {
    pub(crate) fn new(shared: Arc<Shared>) -> Rc<Conn> {
        Rc::new(Conn {
            shared,
            state: RefCell::new(State {
                phase: Phase::Connecting,
                queued: OutQueue::default(),
                waiting: VecDeque::new(),
                progress: Instant::now(),
                closed: false,
            }),
            wake: Notify::new(),
        })
    }

    /// The task behind this connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.borrow().closed
    }

    /// Queues a request; its reply goes to `slot` (`None`: dropped).
    ///
    /// # Errors
    /// The server is DEAD or the last connection attempt failed (failing at
    /// once rather than after a timeout), or this connection has closed.
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
        let now = Instant::now();
        if state.waiting.is_empty() {
            // The server owed nothing: its time starts now.
            state.progress = now;
        }
        for part in request {
            state.queued.push(part.clone());
        }
        state.waiting.push_back(Waiting {
            expect,
            slot,
            probe: false,
            queued: now,
        });
        drop(state);
        self.wake.notify_one();
        Ok(())
    }

    /// Fails every queued request with `kind` and forgets their bytes.
    fn fail_all(&self, kind: BackendErrorKind) {
        let waiting = {
            let mut state = self.state.borrow_mut();
            state.queued = OutQueue::default();
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
        let failure = match connect(&shared).await {
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
}

async fn connect(shared: &Shared) -> Result<TcpStream, BackendErrorKind> {
    let attempt = TcpStream::connect(shared.addr.as_str());
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

/// Serves one connected socket. `Ok` when the connection is no longer
/// wanted and owes nothing; otherwise why it broke and whether it had
/// answered a request.
async fn serve(
    conn: &Conn,
    mut stream: TcpStream,
    drain: &CancellationToken,
) -> Result<(), (BackendErrorKind, bool)> {
    let shared = &conn.shared;
    let timeout = shared.settings.request_timeout;
    let (mut reader, mut writer) = stream.split();
    let mut read_buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut writing = OutQueue::default();
    writing.push(Bytes::from_static(PROBE));
    {
        let mut state = conn.state.borrow_mut();
        let now = Instant::now();
        state.phase = Phase::Ready;
        state.progress = now;
        state.waiting.push_front(Waiting {
            expect: Expect::Stats,
            slot: None,
            probe: true,
            queued: now,
        });
    }
    shared.metrics.connections.inc();
    let mut answered = false;
    let retired = &shared.retired;
    let result = loop {
        let deadline = {
            let mut state = conn.state.borrow_mut();
            writing.append(&mut state.queued);
            if state.waiting.is_empty()
                && writing.is_empty()
                && (retired.is_cancelled() || drain.is_cancelled())
            {
                break Ok(());
            }
            (!state.waiting.is_empty()).then_some(state.progress + timeout)
        };
        writing.seal();
        if read_buf.capacity() - read_buf.len() < READ_CHUNK_BYTES / 4 {
            read_buf.reserve(READ_CHUNK_BYTES);
        }
        tokio::select! {
            biased;
            read = reader.read_buf(&mut read_buf) => {
                match read {
                    Ok(0) => break Err(BackendErrorKind::Closed),
                    Err(e) => break Err(BackendErrorKind::Io(e.kind())),
                    Ok(_) => {}
                }
                conn.state.borrow_mut().progress = Instant::now();
                match deliver(conn, &mut read_buf) {
                    Err(kind) => break Err(kind),
                    Ok(delivered) => {
                        if delivered.probe {
                            shared.report(HealthEvent::Probed);
                        }
                        if delivered.requests > 0 && !answered {
                            answered = true;
                            shared.report(HealthEvent::Answered);
                        }
                    }
                }
            }
            written = writer.write_buf(&mut writing), if writing.has_remaining() => {
                match written {
                    Ok(_) => conn.state.borrow_mut().progress = Instant::now(),
                    Err(e) => break Err(BackendErrorKind::Io(e.kind())),
                }
            }
            () = conn.wake.notified() => {}
            () = sleep_until_some(deadline) => {
                let state = conn.state.borrow();
                if !state.waiting.is_empty() && Instant::now() >= state.progress + timeout {
                    break Err(BackendErrorKind::Timeout);
                }
            }
            () = retired.cancelled(), if !retired.is_cancelled() => {}
            () = drain.cancelled(), if !drain.is_cancelled() => {}
        }
    };
    shared.metrics.connections.dec();
    result.map_err(|kind| (kind, answered))
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => sleep_until(deadline).await,
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
}

/// Cuts every complete reply piece off the buffer and hands it to its
/// waiter, oldest first.
fn deliver(conn: &Conn, read_buf: &mut BytesMut) -> Result<Delivered, BackendErrorKind> {
    let shared = &conn.shared;
    let max_value = shared.max_reply_value();
    let mut delivered = Delivered::default();
    let mut state = conn.state.borrow_mut();
    loop {
        let Some(front) = state.waiting.front_mut() else {
            if read_buf.is_empty() {
                return Ok(delivered);
            }
            // Bytes nobody asked for: the stream is out of step.
            return Err(BackendErrorKind::Protocol(ReplyError::Unsolicited));
        };
        let piece = match next_piece(read_buf, &mut front.expect, max_value) {
            Err(e) => return Err(BackendErrorKind::Protocol(e)),
            Ok(None) => return Ok(delivered),
            Ok(Some(piece)) => piece,
        };
        match piece {
            Piece::Value { len, .. } => {
                let bytes = read_buf.split_to(len).freeze();
                if front.probe {
                    if let Some(limit) = item_size_max(&bytes) {
                        shared.item_size_max.store(limit, Ordering::Relaxed);
                    }
                } else if let Some(slot) = &front.slot {
                    slot.push(Got::Value(bytes));
                }
            }
            Piece::Last { len } | Piece::Error { len } => {
                let bytes = read_buf.split_to(len).freeze();
                let waiting = state.waiting.pop_front().expect("front exists");
                let now = Instant::now();
                // The next request's time starts when this one is answered.
                state.progress = now;
                if waiting.probe {
                    delivered.probe = true;
                    continue;
                }
                delivered.requests += 1;
                shared
                    .metrics
                    .latency
                    .observe(now.saturating_duration_since(waiting.queued).as_secs_f64());
                if let Some(slot) = waiting.slot {
                    // A retrieval's `END` is memring's to write (once, after
                    // merging); every other last line is the reply itself.
                    let is_end = matches!(piece, Piece::Last { .. })
                        && matches!(waiting.expect, Expect::Values { .. });
                    if !is_end {
                        slot.push(Got::Line(bytes));
                    }
                    slot.finish(Ok(()));
                }
            }
        }
    }
}
