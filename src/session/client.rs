//! One client's requests between the I/O loop (`mod.rs`) and the servers:
//! parsed, started on the one road of both dialects (plan, shadow, hot
//! keys; the plan's work is built in `start.rs`) into entries of the FIFO,
//! dispatched in order while the byte budget allows and answered in order
//! into the client's write queue, each entry handed in turn to the
//! client's [`Exchange`] (`exchange.rs`), which sends and answers it. All
//! of the session's own methods are here; nothing here touches the socket.

use super::start::{self, Dialect};
use super::*;
use crate::plan::route::Split;
use crate::pools::planned::Planned;
use crate::protocol::request::{long_get_part, LongGetPart};
use crate::protocol::{ParseError, Rejection};

pub(super) struct ClientSession {
    pub(super) worker: Rc<WorkerCtx>,
    /// The client's requests, dispatched and answered in arrival order.
    pub(super) entries: Fifo<Entry>,
    /// What the entries send and owe: the servers' side of the client.
    pub(super) exchange: Exchange,
    /// Storage for the next multi-key get's keys, from a finished one's.
    pub(super) spare_keys: Keys,
    /// The largest request this client sent lately, in bytes (forgotten
    /// slowly), for the room its input buffer takes (see [`input_room`]).
    pub(super) largest_request: usize,
    /// No more requests will be read; close once the owed replies are written.
    pub(super) closing: bool,
    /// Bytes of a refused value still to be thrown away as they arrive.
    pub(super) discard: usize,
    /// Request bytes of entries not yet dispatched: they count against the
    /// budget too, or a client pipelining big `set`s would have up to
    /// `max_pending` values held here.
    pub(super) parsed_bytes: usize,
    /// The entry at the dispatch cursor was dispatched before without
    /// sending all it has to (held back by the budget, or waiting on a
    /// step): replies may have come for it since. An entry dispatched for
    /// the first time has nothing to take in.
    pub(super) held_back: bool,
    /// A client of a pool's own `listen`: every key goes to that pool.
    /// Otherwise the layout's routes say.
    pub(super) bound: Option<SharedTopology>,
    /// The servers' health as this turn's plans see it.
    pub(super) health: health::TurnHealth,
    /// The topology of this turn's requests, loaded by the first of them.
    pub(super) turn_topology: TurnTopology,
    /// A get line longer than `max_get_line_bytes` being served in parts.
    pub(super) long_get: Option<LongGet>,
    /// The client's address, for the request log (`None` while it is off).
    pub(super) peer: Option<std::net::SocketAddr>,
}

/// Where a client's long get line stands (see [`long_get_part`]).
pub(super) enum LongGet {
    /// Parts were served; the next bytes are more keys of the line, whose
    /// command and arguments are these.
    Head(Vec<u8>),
    /// A part was refused: the rest of the line is dropped.
    Skip,
}

/// What one step of a long get line did.
enum LongStep {
    /// The input does not continue or start a long get line.
    Not,
    /// More bytes are needed.
    Wait,
    /// A part was taken.
    Took,
}

/// Where the requests of one turn of a session are planned.
pub(super) enum TurnTopology {
    /// No request of this turn has asked yet.
    NotLoaded,
    /// Every key of this client goes to this topology's pool; `shadowed`:
    /// the layout has a shadow pool (else no request of the turn asks).
    Fixed { topology: Planned, shadowed: bool },
    /// The routes choose a pool per key: each request loads the layout.
    Routed,
}

impl ClientSession {
    pub(super) fn new(
        id: u64,
        worker: Rc<WorkerCtx>,
        bound: Option<SharedTopology>,
    ) -> ClientSession {
        let limits = worker.default_topology().limits();
        ClientSession {
            exchange: Exchange::new(id as usize, worker.clone(), limits),
            bound,
            worker,
            entries: Fifo::default(),
            spare_keys: Keys::new(),
            largest_request: 0,
            closing: false,
            discard: 0,
            parsed_bytes: 0,
            held_back: false,
            health: health::TurnHealth::default(),
            turn_topology: TurnTopology::NotLoaded,
            long_get: None,
            peer: None,
        }
    }

    /// The topology a request with routing key `key` is planned on, and
    /// the gutter's TTL cap when it is a gutter (see
    /// `Layout::pool_for_key`).
    pub(super) fn topology_for<K: AsRef<[u8]>>(
        &mut self,
        key: Option<impl FnOnce() -> K>,
    ) -> (Planned, Option<u64>) {
        if let Some(topology) = self.turn_fixed() {
            return (topology.again(), None);
        }
        let (worker, bound) = (&self.worker, self.bound.as_ref());
        worker.with_layout(|layout| {
            let (pool, gutter_ttl) = layout.pool_for_key(bound, key);
            (worker.planned(layout, pool), gutter_ttl)
        })
    }

    /// The topology every request of this turn is planned on, loaded by
    /// the first to ask; `None` when the routes choose one per key.
    pub(super) fn turn_fixed(&mut self) -> Option<&Planned> {
        if let TurnTopology::NotLoaded = self.turn_topology {
            let (worker, bound) = (&self.worker, self.bound.as_ref());
            self.turn_topology = worker.with_layout(|layout| match layout.fixed_pool(bound) {
                Some(pool) => TurnTopology::Fixed {
                    topology: worker.planned(layout, pool),
                    shadowed: layout.shadowed(),
                },
                None => TurnTopology::Routed,
            });
        }
        match &self.turn_topology {
            TurnTopology::Fixed { topology, .. } => Some(topology),
            _ => None,
        }
    }

    /// The limits requests are parsed with: the default pool's. A client
    /// of no pool's own listener whose keys no route splits plans on the
    /// default pool, so its turn's topology gives them without a load of
    /// their own.
    pub(super) fn default_limits(&mut self) -> Limits {
        if self.bound.is_none() {
            if let Some(topology) = self.turn_fixed() {
                return topology.limits();
            }
        }
        self.worker.default_topology().limits()
    }

    /// The session is about to wait: the next turn loads its topology
    /// afresh (a reload meanwhile applies to it), and an idle client holds
    /// no ring a reload replaced.
    pub(super) fn end_turn(&mut self) {
        self.turn_topology = TurnTopology::NotLoaded;
    }

    /// Nothing in flight, nothing owed: the state in which an idle client
    /// waits for its next request.
    pub(super) fn is_idle(&self) -> bool {
        !self.closing && self.entries.is_empty() && self.exchange.out.is_empty()
    }

    /// Gives back the buffers only a request in flight or a reply uses
    /// (the reply queue's and the sub-request lines'), while idle.
    pub(super) fn park_buffers(&mut self) {
        self.exchange.out.park();
        self.exchange.lines.park();
        if let Some(storage) = self.entries.take_storage(spares::KEEP_ENTRIES_ROOM) {
            spares::keep_entries(storage);
        }
    }

    /// Input is there after a parked wait: takes kept entry storage back,
    /// so the requests about to be read are queued without allocating.
    pub(super) fn unpark(&mut self) {
        if !self.entries.has_storage() {
            if let Some(storage) = spares::entries() {
                self.entries.adopt_storage(storage);
            }
        }
    }

    /// Requests this client has outstanding: entries not yet answered, and
    /// `noreply` writes the servers have not answered. Both count against
    /// `max_pending`, or one client pipelining `noreply` writes could fill a
    /// server's `max_server_inflight` and leave others `server busy`.
    pub(super) fn outstanding(&self) -> usize {
        self.entries.len() + self.exchange.unanswered.len()
    }

    pub(super) fn can_read(&self) -> bool {
        !self.closing
            && self.outstanding() < self.worker.settings.max_pending
            && self.exchange.budget.owed() + self.exchange.out.len() + self.parsed_bytes
                <= self.exchange.client_limit()
    }

    /// Keeps the worker's count in step with this client's write queue.
    pub(super) fn count_out(&mut self) {
        self.exchange.budget.count_queued(self.exchange.out.len());
    }

    /// Parses every complete request in `input` into entries, up to the
    /// pending bound.
    pub(super) fn parse(&mut self, input: &mut BytesMut) {
        // Most turns of the loop are replies arriving: nothing to parse, and
        // no need to load the topology for its limits (an `ArcSwap` load and
        // an `Arc` every worker counts on).
        if input.is_empty() {
            return;
        }
        // Limits may change with a reload or when servers report their item
        // size; a copy is taken, no guard is held.
        self.exchange.limits = self.default_limits();
        while !self.closing && self.outstanding() < self.worker.settings.max_pending {
            // Every step below waits for more bytes on an empty input: stop
            // here rather than ask each of them (a request a turn is the
            // usual load, so this is the second pass of most turns).
            if input.is_empty() {
                return;
            }
            if self.discard > 0 {
                let n = self.discard.min(input.len());
                input.advance(n);
                self.discard -= n;
                if self.discard > 0 {
                    return;
                }
            }
            match self.long_get_step(input) {
                LongStep::Took => continue,
                LongStep::Wait => return,
                LongStep::Not => {}
            }
            if is_meta_request(input) {
                match parse_meta(input, &self.exchange.limits) {
                    Ok(None) => return,
                    Ok(Some((request, consumed))) => {
                        self.note_request_size(consumed);
                        let bytes = input.split_to(consumed).freeze();
                        self.start_meta(request, bytes);
                    }
                    Err(rejection) => self.refuse(input, rejection),
                }
                continue;
            }
            match parse_request_reusing(input, &self.exchange.limits, &mut self.spare_keys) {
                Ok(None) => return,
                Ok(Some((request, consumed))) => {
                    if request.keys.spilled() && !self.spare_keys.spilled() {
                        // It took the spare (or there was none to take).
                        self.spare_keys = spares::keys();
                    }
                    self.note_request_size(consumed);
                    let bytes = input.split_to(consumed).freeze();
                    self.start(request, bytes);
                }
                Err(rejection) => self.refuse(input, rejection),
            }
        }
    }

    /// Drops the refused request from `input` and answers it as memcached
    /// does, deleting the key of a refused oversized write first.
    fn refuse(&mut self, input: &mut BytesMut, rejection: Rejection) {
        let stale = rejection.stale_key.map(|stale| stale.key(input));
        input.advance(rejection.consumed);
        let reply = rejection.reply();
        let refusal = reply.map(|_| rejection.error);
        let answered = stale.is_some_and(|key| self.forget_stale(&key, refusal));
        self.reject(
            reply.filter(|_| !answered),
            rejection.discard,
            rejection.keeps_connection(),
        );
    }

    /// Serves the next part of a get line longer than `max_get_line_bytes`
    /// (memcached has no bound on a multi-get's line): each part, a request
    /// line of its own, is planned as it arrives, and only the last writes
    /// the `END`, so the client reads one reply with its values in key order
    /// while the input holds at most about one part.
    fn long_get_step(&mut self, input: &mut BytesMut) -> LongStep {
        if let Some(LongGet::Skip) = self.long_get {
            return match memchr::memchr(b'\n', input) {
                Some(at) => {
                    input.advance(at + 1);
                    self.long_get = None;
                    LongStep::Took
                }
                None => {
                    input.clear();
                    LongStep::Wait
                }
            };
        }
        let head = match &self.long_get {
            Some(LongGet::Head(head)) => Some(head.as_slice()),
            _ => None,
        };
        let continuing = head.is_some();
        let (line, consumed, head, last) = match long_get_part(input, head, &self.exchange.limits) {
            Ok(LongGetPart::Not) => return LongStep::Not,
            Ok(LongGetPart::Wait) => return LongStep::Wait,
            Ok(LongGetPart::Part {
                line,
                consumed,
                head,
                last,
            }) => (line, consumed, head, last),
            Err(error) => {
                input.clear();
                self.long_get = None;
                self.reject(Some(error.reply()), 0, error.keeps_connection());
                return LongStep::Took;
            }
        };
        input.advance(consumed);
        self.long_get = (!last).then_some(LongGet::Head(head));
        let split = if last { Split::Last } else { Split::Part };
        let bytes = Bytes::from(line);
        match parse_request(&bytes, &self.exchange.limits) {
            Ok(Some((request, _))) => {
                self.note_request_size(consumed);
                self.start_split(request, bytes, split);
            }
            // A part of no keys (only spaces): the last one still ends the
            // reply the earlier parts began.
            Err(rejection) if continuing && rejection.error == ParseError::UnknownCommand => {
                if last {
                    self.reject(Some(b"END\r\n"), 0, true);
                }
            }
            parsed => {
                let error = parsed.err().map_or(ParseError::BadCommandLine, |r| r.error);
                if !last {
                    self.long_get = Some(LongGet::Skip);
                }
                self.reject(Some(error.reply()), 0, error.keeps_connection());
            }
        }
        LongStep::Took
    }

    /// memcached deletes the key of a `set` or `ms` whose value it refuses as
    /// too large, so that the value the client meant to replace is not read
    /// again (t/getset.t). memring refuses it before any server sees it, so
    /// it deletes the key itself: a delete planned like the client's own
    /// (its owner, the replicas, a hand-off window's previous owners) whose
    /// reply, once it came, is replaced by the reply to `refusal` (nothing
    /// with `noreply`: `None`), so the refusal means the key is gone, as in
    /// memcached. Returns false when no delete could be planned (the caller
    /// answers).
    pub(super) fn forget_stale(&mut self, key: &[u8], refusal: Option<ParseError>) -> bool {
        if key.is_empty() {
            return false;
        }
        let mut line = BytesMut::new();
        crate::protocol::encode::write_delete(key, refusal.is_none(), &mut line);
        let bytes = line.freeze();
        let before = self.entries.len();
        if is_meta_request(&bytes) {
            match parse_meta(&bytes, &self.exchange.limits) {
                Ok(Some((request, _))) => self.start_meta(request, bytes),
                _ => return false,
            }
        } else {
            match parse_request(&bytes, &self.exchange.limits) {
                Ok(Some((request, _))) => self.start(request, bytes),
                _ => return false,
            }
        }
        if self.entries.len() != before + 1 {
            // Nothing to wait for (no server to ask): answer at once.
            return false;
        }
        if let Some(entry) = self.entries.get_mut(before) {
            entry.instead = refusal;
        }
        true
    }

    pub(super) fn note_request_size(&mut self, size: usize) {
        let kept = self.largest_request - self.largest_request / 64;
        self.largest_request = size.max(kept);
    }

    /// Answers a request the parser refused (`reply`, unless it is silent),
    /// throws away `discard` more bytes as they come, and closes the client
    /// once its earlier replies are written if the stream cannot be resumed.
    pub(super) fn reject(
        &mut self,
        reply: Option<&'static [u8]>,
        discard: usize,
        keeps_connection: bool,
    ) {
        self.discard = discard;
        if let Some(reply) = reply {
            let (topology, _) = self.topology_for(None::<fn() -> &'static [u8]>);
            self.push(Entry::ready(reply, topology));
        }
        if !keeps_connection {
            self.closing = true;
        }
    }

    pub(super) fn push(&mut self, entry: Entry) {
        self.parsed_bytes += entry.bytes.len();
        self.entries.push(entry);
    }

    /// Dispatches and collects until neither makes progress. Collecting
    /// releases budget, and a quiet reply writes nothing that would wake the
    /// loop again: without another round here, entries held back by the
    /// budget would wait for the client's next bytes, which a client waiting
    /// for its `MN` never sends.
    pub(super) fn advance(&mut self) {
        loop {
            self.pump();
            let (entries, owed) = (self.entries.len(), self.exchange.budget.owed());
            self.collect();
            let progressed = self.entries.len() < entries || self.exchange.budget.owed() < owed;
            if !progressed || self.entries.all_dispatched() {
                return;
            }
        }
    }

    /// Dispatches entries in order while the budget allows.
    pub(super) fn pump(&mut self) {
        while let Some(index) = self.entries.next_to_dispatch() {
            // Only an entry dispatched before can have replies to take in.
            if self.held_back {
                self.absorb(index);
            }
            let Some(bytes) = self.dispatch(index) else {
                self.held_back = true;
                return;
            };
            self.held_back = false;
            self.parsed_bytes -= bytes;
            self.entries.dispatched_one();
        }
    }

    /// Sends what entry `index` has to send now; once it will send nothing
    /// more, the size of its request.
    pub(super) fn dispatch(&mut self, index: usize) -> Option<usize> {
        // Dispatched in place, the entries before it readable beside it.
        let (before, entry) = self.entries.split_at(index)?;
        let complete = self.exchange.dispatch_entry(entry, before);
        complete.then_some(entry.bytes.len())
    }

    /// Moves the replies that arrived for entry `index` into its work.
    fn absorb(&mut self, index: usize) {
        if let Some(entry) = self.entries.get_mut(index) {
            self.exchange.absorb(entry);
        }
    }

    /// Writes the replies of the entries at the head, in order.
    pub(super) fn collect(&mut self) {
        self.exchange.settle();
        while !self.entries.is_empty() {
            // Returns at once when nothing arrived (`nothing_arrived`).
            self.absorb(0);
            let now = match self.entries.head() {
                Some((entry, dispatched)) => entry.work.head_now(dispatched),
                None => return,
            };
            if now == HeadNow::Waits {
                return;
            }
            let reply_from = super::request_log::mark(&self.worker.request_log, &self.exchange.out);
            let exchange = &mut self.exchange;
            let complete = self.entries.head().is_some_and(|(entry, dispatched)| {
                let complete = dispatched && exchange.finish(entry, now);
                if !complete && matches!(now, HeadNow::Streams { .. }) {
                    if let Work::Retrieve {
                        plan,
                        in_flight,
                        owed,
                    } = &mut entry.work
                    {
                        // Its values go out as they arrive (the END only
                        // when `finish` says it is complete).
                        plan.emit_values(&mut exchange.out);
                        exchange
                            .budget
                            .resize(owed, retrieval_owed(in_flight, plan));
                    }
                }
                complete
            });
            // Popped straight into place: the entry is a few hundred bytes,
            // and `bool::then` and `flatten` each moved it once more.
            let finished = if complete {
                self.entries.pop_head()
            } else {
                None
            };
            let Some((entry, _)) = finished else {
                return;
            };
            // Its reservation goes back as the entry drops, below.
            // Replies memring makes itself (parse errors among them) are not
            // request latencies.
            if !matches!(entry.work, Work::Ready(_)) {
                let now = self.worker.clock.nanos();
                let took = now.saturating_sub(entry.started);
                self.worker.latency.observe(entry.command, took);
                if let Some(from) = reply_from {
                    if self.worker.request_log.may_log(took, entry.said) {
                        self.log_request(&entry, from, took, now);
                    }
                }
            }
            spares::keep(entry.work);
            if entry.request.keys.spilled() {
                spares::keep_keys(entry.request.keys);
            }
            if let Some(guard) = entry.hot {
                self.worker.hot.write_done(guard);
            }
        }
    }

    /// Hands a finished request to the request log (see `request_log.rs`).
    /// Out of line and cold: `collect` runs per request, and this only with
    /// the log on.
    #[cold]
    #[inline(never)]
    fn log_request(&self, entry: &Entry, from: usize, took: u64, now: u64) {
        let pool = || {
            let layout = self.worker.layout.load();
            layout
                .pools()
                .iter()
                .find(|p| p.topology.load().pool_id == entry.topology.pool_id)
                .map_or_else(|| String::from("-"), |p| p.name.to_string())
        };
        let done = super::request_log::Finished {
            entry,
            peer: self.peer.as_ref(),
            out: &self.exchange.out,
            from,
            took,
            now,
            pool: &pool,
        };
        super::request_log::finished(&self.worker.request_log, done);
    }

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
            Some(ttl) => request.capped((&self.worker, &self.exchange.limits), bytes, ttl),
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
            .map(|&pool| self.worker.planned(&layout, &layout.pools()[pool].topology))
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
                Some(ttl) => start::capped(
                    (&self.worker, &self.exchange.limits),
                    sub,
                    line.freeze(),
                    ttl,
                ),
                None => (sub, line.freeze()),
            };
            let topology = self
                .worker
                .planned(layout, &layout.pools()[serving.pool].topology);
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
        if let Plan::Quit = plan {
            // Nothing is queued: the replies owed are written, then the
            // client is closed.
            self.closing = true;
            return;
        }
        plan.split(split);
        let shadow =
            self.exchange
                .shadow((self.bound.as_ref(), &self.turn_topology), &keys, &mut plan);
        let hot = self.worker.hot.on_request(&keys, &plan, &topology);
        drop(keys);
        if let Some(entry) = request.entry(&self.worker, bytes, topology, plan, (hot, shadow)) {
            self.push(entry);
        }
    }
}
