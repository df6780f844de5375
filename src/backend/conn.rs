//! One persistent, pipelined connection to a memcached server, driven by one task.
//!
//! Requests from many client sessions arrive on a bounded channel, are written
//! to the socket in batches, and wait in a FIFO; replies are framed in order and
//! handed to the oldest waiter. After any timeout, EOF, I/O or framing error the
//! socket is dropped and everything in flight fails: a connection that erred is
//! never reused, so no reply can reach the wrong request. Requests still in the
//! channel were never written and go out on the next connection.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant};

use crate::backend::health::HealthEvent;
use crate::backend::Shared;
use crate::error::{BackendError, BackendErrorKind};
use crate::protocol::encode::Outbound;
use crate::protocol::{frame_reply, ReplyError, ReplyKind};

/// The answer to one call: the complete reply bytes, or why there is none.
pub type CallResult = Result<Bytes, BackendError>;

/// One request for this connection.
pub struct Call {
    pub request: Outbound,
    pub kind: ReplyKind,
    /// `None` when the client sent `noreply`: memring stripped it, so the server
    /// still answers, and the answer is dropped here.
    pub reply: Option<oneshot::Sender<CallResult>>,
}

impl Call {
    fn finish(self, result: CallResult) {
        if let Some(reply) = self.reply {
            // The session may be gone (client disconnected); nothing to do then.
            let _ = reply.send(result);
        }
    }
}

struct Waiting {
    /// The `version` a new connection sends first (see `serve`).
    probe: bool,
    kind: ReplyKind,
    reply: Option<oneshot::Sender<CallResult>>,
    deadline: Instant,
}

/// Requests written but not yet answered, per connection. Bounds the replies a
/// slow server can owe and the memory they hold.
const MAX_IN_FLIGHT: usize = 4096;
/// Stop taking calls while this much is still unwritten.
const WRITE_HIGH_WATER_BYTES: usize = 1024 * 1024;
const READ_CHUNK_BYTES: usize = 16 * 1024;
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Runs one connection slot until its channel closes (the backend was removed
/// and every queued request was answered).
pub(crate) async fn run(shared: Arc<Shared>, mut calls: mpsc::Receiver<Call>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let failure = match connect(&shared).await {
            Ok(stream) => match serve(&shared, stream, &mut calls).await {
                Served::Drained => return,
                Served::Broke { kind, answered } => {
                    shared.report(HealthEvent::Failed(kind));
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
                kind
            }
        };
        // The server refuses, or accepts but never answers (frozen): probe it
        // again after a growing pause, and meanwhile fail requests at once
        // instead of letting them wait for a connection that will not work.
        let retry_at = Instant::now() + backoff;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        let heard_from = shared.heard_from.notified();
        tokio::pin!(heard_from);
        loop {
            tokio::select! {
                biased;
                // Another lane reached the server: it is back, reconnect now.
                () = &mut heard_from => break,
                call = calls.recv() => match call {
                    Some(call) => call.finish(Err(shared.error(failure))),
                    None => return,
                },
                () = sleep_until(retry_at) => break,
            }
        }
    }
}

/// How a connection ended.
enum Served {
    /// The channel closed and everything queued was answered.
    Drained,
    /// The connection failed; `answered` says whether it ever got a reply.
    Broke {
        kind: BackendErrorKind,
        answered: bool,
    },
}

async fn connect(shared: &Shared) -> Result<TcpStream, BackendErrorKind> {
    let attempt = TcpStream::connect(shared.addr.as_str());
    match tokio::time::timeout(shared.settings.connect_timeout, attempt).await {
        Err(_) => Err(BackendErrorKind::ConnectTimeout),
        Ok(Err(e)) => Err(BackendErrorKind::Connect(e.kind())),
        Ok(Ok(stream)) => {
            // Requests are small and already batched; Nagle would only add delay.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
    }
}

/// Serves calls on one connected socket until the channel is closed and
/// drained, or the connection must be dropped.
async fn serve(shared: &Shared, mut stream: TcpStream, calls: &mut mpsc::Receiver<Call>) -> Served {
    let (mut reader, mut writer) = stream.split();
    let mut read_buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut write_buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut in_flight: VecDeque<Waiting> = VecDeque::new();
    let request_timeout = shared.settings.request_timeout;
    let timer = sleep_until(Instant::now() + request_timeout);
    tokio::pin!(timer);
    let mut channel_open = true;
    // A connect alone proves little (a frozen server's kernel still accepts),
    // so every new connection first asks `version`. Its answer lets a DEAD
    // server be tried again; only answers to real requests make it ACTIVE.
    write_buf.extend_from_slice(b"version\r\n");
    in_flight.push_back(Waiting {
        probe: true,
        kind: ReplyKind::Line,
        reply: None,
        deadline: Instant::now() + request_timeout,
    });
    let mut answered = false;
    shared.metrics.connections.inc();

    // Requests were added to `write_buf` since the last yield.
    let mut unbatched = false;
    let result = loop {
        if !channel_open && in_flight.is_empty() && write_buf.is_empty() {
            break Ok(());
        }
        if let Some(front) = in_flight.front() {
            if timer.deadline() != front.deadline {
                timer.as_mut().reset(front.deadline);
            }
        }
        if read_buf.capacity() - read_buf.len() < READ_CHUNK_BYTES / 4 {
            read_buf.reserve(READ_CHUNK_BYTES);
        }
        if unbatched {
            // New requests are waiting to be written. Let the other ready
            // sessions run first, so that their requests share this write: one
            // syscall for many clients, as twemproxy gets per event-loop turn.
            unbatched = false;
            tokio::task::yield_now().await;
            let deadline = Instant::now() + request_timeout;
            drain_queued(calls, deadline, &mut write_buf, &mut in_flight);
        }
        let can_take = channel_open
            && in_flight.len() < MAX_IN_FLIGHT
            && write_buf.len() < WRITE_HIGH_WATER_BYTES;
        tokio::select! {
            biased;
            read = reader.read_buf(&mut read_buf) => {
                match read {
                    Ok(0) => break Err(BackendErrorKind::Closed),
                    Err(e) => break Err(BackendErrorKind::Io(e.kind())),
                    Ok(_) => match deliver_replies(shared, &mut read_buf, &mut in_flight) {
                        Err(kind) => break Err(kind),
                        Ok(Delivered { probe, requests }) => {
                            if probe {
                                shared.report(HealthEvent::Probed);
                            }
                            if requests > 0 && !answered {
                                answered = true;
                                shared.report(HealthEvent::Answered);
                            }
                        }
                    },
                }
            }
            written = writer.write_buf(&mut write_buf), if !write_buf.is_empty() => {
                if let Err(e) = written {
                    break Err(BackendErrorKind::Io(e.kind()));
                }
            }
            call = calls.recv(), if can_take => {
                match call {
                    None => channel_open = false,
                    Some(call) => {
                        let deadline = Instant::now() + request_timeout;
                        enqueue(call, deadline, &mut write_buf, &mut in_flight);
                        // The rest of the queue is taken after the yield at the
                        // top of the loop, together with what arrives meanwhile.
                        unbatched = true;
                    }
                }
            }
            () = &mut timer, if !in_flight.is_empty() => {
                let expired = in_flight.front().is_some_and(|w| w.deadline <= Instant::now());
                if expired {
                    break Err(BackendErrorKind::Timeout);
                }
            }
        }
    };
    shared.metrics.connections.dec();
    match result {
        Ok(()) => Served::Drained,
        Err(kind) => {
            for waiting in in_flight.drain(..) {
                if let Some(reply) = waiting.reply {
                    let _ = reply.send(Err(shared.error(kind)));
                }
            }
            Served::Broke { kind, answered }
        }
    }
}

/// Moves every request already queued on the channel into the write buffer.
fn drain_queued(
    calls: &mut mpsc::Receiver<Call>,
    deadline: Instant,
    write_buf: &mut BytesMut,
    in_flight: &mut VecDeque<Waiting>,
) {
    while in_flight.len() < MAX_IN_FLIGHT && write_buf.len() < WRITE_HIGH_WATER_BYTES {
        match calls.try_recv() {
            Ok(call) => enqueue(call, deadline, write_buf, in_flight),
            Err(_) => break,
        }
    }
}

fn enqueue(
    call: Call,
    deadline: Instant,
    write_buf: &mut BytesMut,
    in_flight: &mut VecDeque<Waiting>,
) {
    for part in &call.request {
        write_buf.extend_from_slice(part);
    }
    in_flight.push_back(Waiting {
        probe: false,
        kind: call.kind,
        reply: call.reply,
        deadline,
    });
}

/// What one read delivered.
struct Delivered {
    /// The connection's `version` probe was answered.
    probe: bool,
    /// Replies to real requests.
    requests: usize,
}

/// Cuts every complete reply off the buffer and hands it to its waiter, oldest
/// first.
fn deliver_replies(
    shared: &Shared,
    read_buf: &mut BytesMut,
    in_flight: &mut VecDeque<Waiting>,
) -> Result<Delivered, BackendErrorKind> {
    let mut delivered = Delivered {
        probe: false,
        requests: 0,
    };
    let now = Instant::now();
    let request_timeout = shared.settings.request_timeout;
    while let Some(front) = in_flight.front() {
        match frame_reply(read_buf, front.kind) {
            Ok(Some(len)) => {
                let reply = read_buf.split_to(len).freeze();
                let waiting = in_flight.pop_front().expect("front exists");
                // The deadline was set when the request was written.
                let sent = waiting.deadline - request_timeout;
                shared
                    .metrics
                    .latency
                    .observe(now.saturating_duration_since(sent).as_secs_f64());
                if let Some(sender) = waiting.reply {
                    let _ = sender.send(Ok(reply));
                }
                if waiting.probe {
                    delivered.probe = true;
                } else {
                    delivered.requests += 1;
                }
            }
            Ok(None) => return Ok(delivered),
            Err(e) => return Err(BackendErrorKind::Protocol(e)),
        }
    }
    if read_buf.is_empty() {
        Ok(delivered)
    } else {
        // Bytes nobody asked for: the stream is out of step.
        Err(BackendErrorKind::Protocol(ReplyError::Unsolicited))
    }
}
