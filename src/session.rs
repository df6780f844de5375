//! One task per client connection: read, parse, route, and write the replies in
//! request order.
//!
//! A client may pipeline: every complete request in the read buffer is routed
//! at once, and its reply slot joins a FIFO; replies are written as the oldest
//! slots complete, coalesced into one write. The FIFO is bounded
//! (`max_pending_per_client`): when it is full memring stops reading from that
//! client, so a client that never reads its replies cannot make memring buffer
//! without bound. Shutdown stops reading between requests, never halfway
//! through one, and the replies already owed are still written.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, CallResult};
use crate::error::{BackendError, BackendErrorKind};
use crate::protocol::encode::{
    forwardable, write_merged_values, write_server_error, write_sub_get,
};
use crate::protocol::reply::is_error_reply;
use crate::protocol::request::Keys;
use crate::protocol::{parse_request, Command, ReplyKind, Request};
use crate::replication::{decide, quorum, replica_set, Cas, Decision, Read};
use crate::stats::Stats;
use crate::topology::{SharedTopology, Topology};

/// First read buffer of a client: small, so that thousands of idle clients
/// cost little; it grows (doubling) while a client sends more.
const FIRST_READ_BYTES: usize = 2 * 1024;
/// Room kept free before each read.
const MIN_READ_ROOM_BYTES: usize = 512;

/// What every session shares.
pub struct SessionContext {
    pub topology: SharedTopology,
    pub max_pending: usize,
    /// Close a client that sent nothing and is owed nothing for this long.
    pub idle_timeout: Option<std::time::Duration>,
    pub shutdown: CancellationToken,
    pub stats: Arc<Stats>,
}

/// Serves one client until it quits, disconnects, sends an unrecoverable line,
/// or shutdown is requested (then the replies already owed are written first).
///
/// # Errors
/// Only client-side I/O errors, which end the session.
pub async fn run_session(
    mut stream: TcpStream,
    id: u64,
    ctx: Arc<SessionContext>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.split();
    let mut session = ClientSession {
        lane: id as usize,
        ctx: &ctx,
        pending: VecDeque::new(),
        closing: false,
        discard: 0,
    };
    let mut input = BytesMut::with_capacity(FIRST_READ_BYTES);
    let mut output = ReplyQueue::default();
    let mut last_read = tokio::time::Instant::now();
    loop {
        let parsed_all = session.route_buffered(&mut input).await;
        while let Some(front) = session.pending.front_mut() {
            if !front.poll_ready() {
                break;
            }
            let done = session.pending.pop_front().expect("front exists");
            done.write_reply(&mut output, &ctx.stats);
        }
        if output.seal() > 0 {
            let len = output.remaining();
            // One write (writev) for every reply that is ready.
            writer.write_all_buf(&mut output).await?;
            ctx.stats.written_bytes(len);
        }
        if session.closing && session.pending.is_empty() {
            return writer.shutdown().await;
        }
        if !parsed_all && session.pending.len() < ctx.max_pending {
            // Requests already read are waiting for room in the FIFO, which
            // replies just made; route them before waiting on the socket.
            continue;
        }
        let can_read = !session.closing && session.pending.len() < ctx.max_pending;
        if input.capacity() - input.len() < MIN_READ_ROOM_BYTES {
            input.reserve(input.capacity().max(FIRST_READ_BYTES));
        }
        let idle = idle_deadline(ctx.idle_timeout, last_read, session.pending.is_empty());
        tokio::select! {
            biased;
            () = wait_front(&mut session.pending) => {}
            read = reader.read_buf(&mut input), if can_read => {
                match read? {
                    0 => session.closing = true,
                    n => ctx.stats.read_bytes(n),
                }
                last_read = tokio::time::Instant::now();
            }
            () = sleep_until_some(idle), if idle.is_some() && can_read => {
                // Idle and owed nothing: close, as memcached's idle_timeout.
                session.closing = true;
            }
            () = ctx.shutdown.cancelled(), if can_read => {
                session.closing = true;
            }
        }
    }
}

/// When an idle client is to be closed: only with a timeout set and nothing owed.
fn idle_deadline(
    timeout: Option<std::time::Duration>,
    last_read: tokio::time::Instant,
    nothing_owed: bool,
) -> Option<tokio::time::Instant> {
    timeout.filter(|_| nothing_owed).map(|t| last_read + t)
}

async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn wait_front(pending: &mut VecDeque<Pending>) {
    match pending.front_mut() {
        Some(front) => front.wait().await,
        None => std::future::pending().await,
    }
}

struct ClientSession<'a> {
    /// Which connection of each server this client uses: always the same one,
    /// so its commands reach each server in the order sent.
    lane: usize,
    ctx: &'a SessionContext,
    pending: VecDeque<Pending>,
    /// No more requests will be read; close once the owed replies are written.
    closing: bool,
    /// Bytes of a refused value still to be thrown away as they arrive.
    discard: usize,
}

impl ClientSession<'_> {
    /// Routes every complete request in `input`, up to the pending bound.
    /// Returns false when it stopped at the bound with input left to parse.
    async fn route_buffered(&mut self, input: &mut BytesMut) -> bool {
        // Limits may change with a reload; a copy is taken, no guard is held.
        let limits = self.ctx.topology.load().limits;
        loop {
            if self.closing {
                return true;
            }
            if self.pending.len() >= self.ctx.max_pending {
                return input.is_empty();
            }
            if self.discard > 0 {
                let n = self.discard.min(input.len());
                input.advance(n);
                self.discard -= n;
                if self.discard > 0 {
                    return true;
                }
            }
            match parse_request(input, &limits) {
                Ok(None) => return true,
                Ok(Some((request, consumed))) => {
                    let bytes = input.split_to(consumed).freeze();
                    self.route(request, bytes).await;
                }
                Err(rejection) => {
                    input.advance(rejection.consumed);
                    self.discard = rejection.discard;
                    if !rejection.silent {
                        self.pending
                            .push_back(Pending::ready(Bytes::from_static(rejection.error.reply())));
                    }
                    if !rejection.error.keeps_connection() {
                        self.closing = true;
                    }
                }
            }
        }
    }

    async fn route(&mut self, request: Request, bytes: Bytes) {
        // One topology per request: it finishes on this ring even if a reload
        // lands meanwhile. `load_full` gives an owned Arc, so no arc-swap guard
        // is held across the awaits below.
        let topology = self.ctx.topology.load_full();
        let stats = &self.ctx.stats;
        stats.request(request.command, request.keys.len());
        let pending = match request.command {
            Command::Quit => {
                self.closing = true;
                return;
            }
            Command::Version => Some(Pending::ready(Bytes::from_static(crate::VERSION_REPLY))),
            Command::Verbosity => {
                // Accepted and not forwarded: memring's log level is its own.
                (!request.noreply).then(|| Pending::ready(Bytes::from_static(b"OK\r\n")))
            }
            Command::Stats if request.arg.is_some() => Some(Pending::ready(Bytes::from_static(
                b"CLIENT_ERROR memring answers plain 'stats' only; ask each memcached for the others\r\n",
            ))),
            Command::Stats => {
                let mut out = BytesMut::new();
                stats.write_report(&mut out, &topology);
                Some(Pending::ready(out.freeze()))
            }
            Command::FlushAll => self.broadcast(&topology, &request, &bytes).await,
            command if command.is_retrieval() => {
                Some(self.retrieve(&topology, request, bytes).await)
            }
            _ if topology.config.replicas > 1 => self.replicated_write(&topology, request, bytes).await,
            _ => self.forward_single_key(&topology, &request, &bytes).await,
        };
        if let Some(pending) = pending {
            self.pending.push_back(pending);
        }
    }

    async fn forward_single_key(
        &mut self,
        topology: &Topology,
        request: &Request,
        bytes: &Bytes,
    ) -> Option<Pending> {
        let key = request.key(bytes, 0);
        let Some(backend) = topology.owner(key) else {
            return (!request.noreply).then(Pending::no_servers);
        };
        let part = self
            .send(
                backend,
                forwardable(bytes, request),
                ReplyKind::Line,
                !request.noreply,
            )
            .await;
        part.map(|part| Pending {
            parts: smallvec::smallvec![part],
            finish: Finish::Forward {
                command: request.command,
                keys: 1,
            },
        })
    }

    /// `get`/`gets`/`gat`/`gats`: one request when every key has the same owner,
    /// otherwise one sub-request per owner, sent before any is awaited.
    async fn retrieve(
        &mut self,
        topology: &Arc<Topology>,
        request: Request,
        bytes: Bytes,
    ) -> Pending {
        if request.keys.is_empty() {
            return Pending::ready(Bytes::from_static(b"END\r\n"));
        }
        if topology.config.replicas > 1 {
            let (command, keys) = (request.command, request.keys.len());
            let fallthrough = topology.config.read_miss_fallthrough;
            let read = Read::start(topology.clone(), request, bytes, self.lane, fallthrough).await;
            return Pending::spawned("replicas", command, keys, read.finish());
        }
        let mut owner_of_key: SmallVec<[u32; 8]> = SmallVec::with_capacity(request.keys.len());
        for i in 0..request.keys.len() {
            let Some(owner) = topology.owner_index(request.key(&bytes, i)) else {
                return Pending::no_servers();
            };
            owner_of_key.push(owner as u32);
        }
        let first = owner_of_key[0];
        if owner_of_key.iter().all(|&o| o == first) {
            let backend = &topology.backends[first as usize];
            let part = self
                .send(backend, smallvec::smallvec![bytes], ReplyKind::Values, true)
                .await
                .expect("a reply was asked for");
            return Pending {
                parts: smallvec::smallvec![part],
                finish: Finish::Forward {
                    command: request.command,
                    keys: request.keys.len(),
                },
            };
        }

        // Number the owners in order of first appearance: part i is the i-th
        // distinct owner.
        let mut owners: SmallVec<[u32; 8]> = SmallVec::new();
        let mut part_of_key: SmallVec<[u16; 8]> = SmallVec::with_capacity(owner_of_key.len());
        for &owner in &owner_of_key {
            let part = match owners.iter().position(|&o| o == owner) {
                Some(part) => part,
                None => {
                    owners.push(owner);
                    owners.len() - 1
                }
            };
            part_of_key.push(part as u16);
        }
        let exptime = request.arg.map(|span| span.of(&bytes));
        let mut parts = SmallVec::with_capacity(owners.len());
        for (part, &owner) in owners.iter().enumerate() {
            let mut sub = BytesMut::new();
            let keys = (0..request.keys.len())
                .filter(|&i| part_of_key[i] as usize == part)
                .map(|i| request.key(&bytes, i));
            write_sub_get(&mut sub, request.command, exptime, keys);
            let backend = &topology.backends[owner as usize];
            let sent = self
                .send(
                    backend,
                    smallvec::smallvec![sub.freeze()],
                    ReplyKind::Values,
                    true,
                )
                .await
                .expect("a reply was asked for");
            parts.push(sent);
        }
        Pending {
            parts,
            finish: Finish::Merge(Box::new(Merge {
                bytes,
                keys: request.keys,
                part_of_key,
            })),
        }
    }

    /// A write with `replicas > 1`: sent to every replica at once and answered
    /// on a quorum; `cas` is checked on the owner and copied to the others.
    async fn replicated_write(
        &mut self,
        topology: &Arc<Topology>,
        request: Request,
        bytes: Bytes,
    ) -> Option<Pending> {
        let command = request.command;
        if command == Command::Cas {
            let noreply = request.noreply;
            let cas = Cas::start(topology.clone(), request, bytes, self.lane).await;
            if noreply {
                tokio::spawn(async move {
                    let _ = cas.finish().await;
                });
                return None;
            }
            return Some(Pending::spawned("owner", command, 1, cas.finish()));
        }
        let replicas = replica_set(topology, request.key(&bytes, 0));
        if replicas.is_empty() {
            return (!request.noreply).then(Pending::no_servers);
        }
        let outbound = forwardable(&bytes, &request);
        let mut parts = SmallVec::new();
        for &replica in &replicas {
            let backend = &topology.backends[replica];
            if let Some(part) = self
                .send(backend, outbound.clone(), ReplyKind::Line, !request.noreply)
                .await
            {
                parts.push(part);
            }
        }
        (!request.noreply).then(|| Pending {
            parts,
            finish: Finish::Quorum {
                quorum: quorum(replicas.len()),
                command,
            },
        })
    }

    /// `flush_all`: sent to every server; `OK` only when every server said so.
    async fn broadcast(
        &mut self,
        topology: &Topology,
        request: &Request,
        bytes: &Bytes,
    ) -> Option<Pending> {
        let mut parts = SmallVec::new();
        for backend in topology.backends.iter() {
            if let Some(part) = self
                .send(
                    backend,
                    forwardable(bytes, request),
                    ReplyKind::Line,
                    !request.noreply,
                )
                .await
            {
                parts.push(part);
            }
        }
        (!request.noreply).then_some(Pending {
            parts,
            finish: Finish::AllOk,
        })
    }

    /// Queues a request on this session's lane of `backend`. Returns the reply
    /// slot, or `None` when no reply was asked for.
    async fn send(
        &self,
        backend: &Arc<Backend>,
        request: crate::protocol::encode::Outbound,
        kind: ReplyKind,
        want_reply: bool,
    ) -> Option<Part> {
        let server = backend.shared_name();
        match backend.send(self.lane, request, kind, want_reply).await {
            Ok(Some(receiver)) => Some(Part {
                server,
                receiver: Some(receiver),
                result: None,
            }),
            Ok(None) => None,
            Err(error) => want_reply.then_some(Part {
                server,
                receiver: None,
                result: Some(Err(error)),
            }),
        }
    }
}

/// One backend reply a pending request waits for.
struct Part {
    server: Arc<str>,
    receiver: Option<oneshot::Receiver<CallResult>>,
    result: Option<CallResult>,
}

impl Part {
    fn lost(&self) -> CallResult {
        Err(BackendError {
            server: self.server.clone(),
            kind: BackendErrorKind::Gone,
        })
    }

    /// True once the reply (or the reason there is none) is known.
    fn is_done(&self) -> bool {
        self.result.is_some() || self.receiver.is_none()
    }

    /// Takes the reply if it has arrived, without registering for a wake-up.
    fn try_receive(&mut self) {
        if let (None, Some(receiver)) = (&self.result, &mut self.receiver) {
            match receiver.try_recv() {
                Ok(result) => self.result = Some(result),
                Err(oneshot::error::TryRecvError::Empty) => {}
                Err(oneshot::error::TryRecvError::Closed) => self.result = Some(self.lost()),
            }
        }
    }

    /// Polls for the reply; the result is kept in `self`, so waiting on it is
    /// cancel-safe.
    fn poll_receive(&mut self, cx: &mut std::task::Context<'_>) {
        if let (None, Some(receiver)) = (&self.result, &mut self.receiver) {
            if let std::task::Poll::Ready(result) =
                std::future::Future::poll(std::pin::Pin::new(receiver), cx)
            {
                self.result = Some(result.unwrap_or_else(|_| self.lost()));
            }
        }
    }

    fn take(&mut self) -> CallResult {
        self.result.take().unwrap_or_else(|| self.lost())
    }
}

/// How the parts' replies become the client's reply.
enum Finish {
    /// A reply made by memring itself.
    Ready(Bytes),
    /// The one part's reply, as it came.
    Forward { command: Command, keys: usize },
    /// A multi-get split across servers.
    Merge(Box<Merge>),
    /// `OK` if every part answered `OK`.
    AllOk,
    /// A replicated write: the reply a quorum agrees on.
    Quorum { quorum: usize, command: Command },
}

struct Merge {
    bytes: Bytes,
    keys: Keys,
    part_of_key: SmallVec<[u16; 8]>,
}

/// A reply slot in the client's FIFO.
struct Pending {
    parts: SmallVec<[Part; 1]>,
    finish: Finish,
}

impl Pending {
    fn ready(reply: Bytes) -> Pending {
        Pending {
            parts: SmallVec::new(),
            finish: Finish::Ready(reply),
        }
    }

    fn no_servers() -> Pending {
        Pending::ready(Bytes::from_static(
            b"SERVER_ERROR no servers configured\r\n",
        ))
    }

    /// A reply slot filled by a spawned task (replicated reads and `cas`).
    fn spawned(
        label: &str,
        command: Command,
        keys: usize,
        work: impl std::future::Future<Output = CallResult> + Send + 'static,
    ) -> Pending {
        let (sender, receiver) = oneshot::channel();
        tokio::spawn(async move {
            let _ = sender.send(work.await);
        });
        Pending {
            parts: smallvec::smallvec![Part {
                server: label.into(),
                receiver: Some(receiver),
                result: None,
            }],
            finish: Finish::Forward { command, keys },
        }
    }

    /// Whether the reply can be written: every part is in, or (for a
    /// replicated write) the quorum has decided.
    fn is_complete(&self) -> bool {
        match self.finish {
            Finish::Quorum { quorum, .. } => quorum_decision(&self.parts, quorum) != Decision::Wait,
            _ => self.parts.iter().all(Part::is_done),
        }
    }

    fn poll_ready(&mut self) -> bool {
        for part in self.parts.iter_mut() {
            part.try_receive();
        }
        self.is_complete()
    }

    /// Waits until the reply can be written; any part may answer first.
    async fn wait(&mut self) {
        std::future::poll_fn(|cx| {
            for part in self.parts.iter_mut() {
                part.poll_receive(cx);
            }
            if self.is_complete() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }

    fn write_reply(mut self, queue: &mut ReplyQueue, stats: &Stats) {
        match self.finish {
            Finish::Ready(reply) => queue.push(reply),
            Finish::Forward { command, keys } => match self.parts[0].take() {
                Ok(reply) => {
                    stats.reply(command, keys, &reply);
                    queue.push(reply);
                }
                Err(error) => {
                    write_server_error(queue.scratch(), &error);
                }
            },
            Finish::Merge(merge) => {
                let mut replies: SmallVec<[Option<Bytes>; 4]> = SmallVec::new();
                let mut first_error = None;
                for part in self.parts.iter_mut() {
                    match part.take() {
                        Ok(reply) if !is_error_reply(&reply) => replies.push(Some(reply)),
                        Ok(_) => replies.push(None),
                        Err(error) => {
                            first_error.get_or_insert(error);
                            replies.push(None);
                        }
                    }
                }
                // A multi-get answers with what the healthy servers hold; only
                // when every server failed is the whole reply an error.
                match first_error {
                    Some(error) if replies.iter().all(Option::is_none) => {
                        write_server_error(queue.scratch(), &error);
                    }
                    _ => {
                        let keys = merge
                            .keys
                            .iter()
                            .zip(merge.part_of_key.iter())
                            .map(|(span, &part)| (span.of(&merge.bytes), part as usize));
                        let hits = write_merged_values(queue.scratch(), keys, &replies);
                        stats.retrieval(merge.keys.len(), hits);
                    }
                }
            }
            Finish::Quorum { quorum, command } => match quorum_decision(&self.parts, quorum) {
                Decision::Answer(reply) => {
                    stats.reply(command, 1, &reply);
                    let outstanding = self.parts.iter().filter(|p| p.result.is_none()).count();
                    // Slower replicas finish in the background on their own
                    // connections (bounded by the request timeout).
                    stats.replica_background(outstanding);
                    queue.push(reply);
                }
                Decision::Fail(servers) if !servers.is_empty() => {
                    let names: Vec<&str> = servers.iter().map(|s| &**s).collect();
                    write_server_error(
                        queue.scratch(),
                        &format_args!("no quorum: failed on {}", names.join(", ")),
                    );
                }
                Decision::Fail(_) | Decision::Wait => {
                    write_server_error(
                        queue.scratch(),
                        &"no quorum: replicas answered with errors",
                    );
                }
            },
            Finish::AllOk => {
                let mut failed: Vec<String> = Vec::new();
                for part in self.parts.iter_mut() {
                    match part.take() {
                        Ok(reply) if reply.as_ref() == b"OK\r\n" => {}
                        Ok(_) | Err(_) => failed.push(part.server.to_string()),
                    }
                }
                if failed.is_empty() {
                    queue.scratch().extend_from_slice(b"OK\r\n");
                } else {
                    write_server_error(
                        queue.scratch(),
                        &format_args!("failed on {}", failed.join(", ")),
                    );
                }
            }
        }
    }
}

fn quorum_decision(parts: &[Part], quorum: usize) -> Decision {
    let results: SmallVec<[Option<&CallResult>; 4]> =
        parts.iter().map(|p| p.result.as_ref()).collect();
    decide(&results, quorum)
}

/// Replies ready to be written to one client, in order. Large replies (values)
/// are kept as the `Bytes` they arrived in and written with `writev`; small
/// ones are copied together, which is cheaper than one iovec each.
#[derive(Default)]
struct ReplyQueue {
    chunks: VecDeque<Bytes>,
    /// Small replies since the last chunk.
    scratch: BytesMut,
    remaining: usize,
}

/// Replies at least this long are written in place rather than copied.
const ZERO_COPY_REPLY_BYTES: usize = 4096;

impl ReplyQueue {
    fn push(&mut self, reply: Bytes) {
        if reply.len() >= ZERO_COPY_REPLY_BYTES {
            self.seal();
            self.remaining += reply.len();
            self.chunks.push_back(reply);
        } else {
            self.scratch.extend_from_slice(&reply);
        }
    }

    /// Where memring's own reply lines are written.
    fn scratch(&mut self) -> &mut BytesMut {
        &mut self.scratch
    }

    /// Moves the small replies into the chunk list; returns the bytes queued.
    fn seal(&mut self) -> usize {
        if !self.scratch.is_empty() {
            let small = self.scratch.split().freeze();
            self.remaining += small.len();
            self.chunks.push_back(small);
        }
        self.remaining
    }
}

impl Buf for ReplyQueue {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |chunk| &chunk[..])
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut filled = 0;
        for (slot, chunk) in dst.iter_mut().zip(self.chunks.iter()) {
            *slot = std::io::IoSlice::new(chunk);
            filled += 1;
        }
        filled
    }

    fn advance(&mut self, mut count: usize) {
        self.remaining -= count;
        while count > 0 {
            let front = self.chunks.front_mut().expect("advance within remaining");
            if count < front.len() {
                front.advance(count);
                return;
            }
            count -= front.len();
            self.chunks.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_queue_keeps_order_across_copied_and_zero_copy_replies() {
        let mut queue = ReplyQueue::default();
        let large = Bytes::from(vec![b'v'; ZERO_COPY_REPLY_BYTES]);
        queue.push(Bytes::from_static(b"STORED\r\n"));
        queue.push(large.clone());
        queue.scratch().extend_from_slice(b"OK\r\n");
        queue.push(Bytes::from_static(b"END\r\n"));
        let total = queue.seal();
        assert_eq!(total, 8 + large.len() + 4 + 5);
        let mut written = Vec::new();
        // Drain it in uneven steps, as partial writes would.
        while queue.has_remaining() {
            let step = queue.chunk().len().min(1000);
            written.extend_from_slice(&queue.chunk()[..step]);
            queue.advance(step);
        }
        let mut expected = b"STORED\r\n".to_vec();
        expected.extend_from_slice(&large);
        expected.extend_from_slice(b"OK\r\nEND\r\n");
        assert_eq!(written, expected);
        assert_eq!(queue.seal(), 0);
    }
}
