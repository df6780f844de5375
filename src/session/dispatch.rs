//! What each kind of work sends, and how the replies that arrived are taken
//! into it: the sending half of a client's [`Exchange`] (`finish.rs` is
//! the answering half).

use super::*;
use crate::plan::steps::{Answer, Next};
use crate::pools::planned::UntilAnswered;
use crate::protocol::outcome::Outcome;

/// Smallest reply size assumed for a key not yet answered.
const MIN_ESTIMATE_BYTES: usize = 1024;

/// What a one-line reply is assumed to cost.
const LINE_REPLY_BYTES: usize = 64;

/// What dispatching reads of its entry, borrowed beside the entry's work.
struct Sending<'e> {
    topology: &'e Arc<Topology>,
    bytes: &'e Bytes,
    request: &'e Request,
    command: Command,
    /// Reply bytes reserved for the entry.
    reserved: &'e mut Reservation,
    /// The entry's first lines are written.
    sent: &'e mut bool,
    hot: Option<&'e Rc<WriteGuard>>,
}

impl Exchange {
    pub(super) fn dispatch_entry(&mut self, entry: &mut Entry, before: Before<'_, Entry>) -> bool {
        // Borrowed beside the work (disjoint fields): no refcount traffic.
        let Entry {
            topology,
            work,
            bytes,
            request,
            command,
            reserved,
            sent,
            hot,
            ..
        } = entry;
        let e = Sending {
            topology,
            bytes,
            request,
            command: *command,
            reserved,
            sent,
            hot: hot.as_ref(),
        };
        match work {
            Work::Ready(_) | Work::Stats | Work::StatsReset => true,
            Work::Lines {
                parts,
                finish,
                meta,
            } => self.dispatch_lines(e, parts, finish, meta.as_deref()),
            Work::Steps(steps) => self.dispatch_steps(e, steps),
            Work::Retrieve {
                plan,
                in_flight,
                owed,
            } => self.dispatch_retrieve(topology, plan, in_flight, owed, e.hot, before),
        }
    }

    /// A request forwarded (storage, delete, arithmetic, touch; a meta
    /// request other than a plain `mg`), to each replica, and deletes to
    /// owners in older rings first.
    fn dispatch_lines(
        &mut self,
        e: Sending<'_>,
        parts: &mut [Part],
        finish: &mut Finish,
        meta: Option<&MetaLines>,
    ) -> bool {
        let topology = e.topology;
        if *e.sent {
            return true;
        }
        // Its reply bytes: one line from each server and each older owner.
        let deletes = OlderForget::len(finish.older());
        let cost = || e.bytes.len() + LINE_REPLY_BYTES * (parts.len() + deletes);
        if !self.reserve_once(e.reserved, cost) {
            return false;
        }
        // The owners in older rings lose the key first.
        let forget = |server| self.forget_key(topology, server, e.bytes, e.request, meta);
        if !OlderForget::advance(finish.older_mut(), forget) {
            return false;
        }
        let classic;
        let (wire, expect) = match meta {
            Some(meta) => (&meta.wire[..], &meta.expect),
            None => {
                let line = e.command.reply_line().unwrap_or(LineKind::Ok);
                classic = (forwardable(e.bytes, e.request), Expect::Line(line));
                (&classic.0[..], &classic.1)
            }
        };
        let (forget, forget_last) = match finish {
            Finish::Quorum {
                forget,
                forget_last,
                ..
            } => (*forget as usize, *forget_last),
            _ => (0, false),
        };
        let replicas = parts.len() - forget;
        for part in parts[..replicas].iter_mut() {
            // A `noreply` request's reply is awaited too (and then
            // dropped), so that its bytes stay counted until the
            // server has them: see `unanswered`.
            self.send(topology, part, wire, expect.clone(), true, e.hot);
        }
        // With `forget_last`, `finish` sends them (see `forget_last_lines`).
        if !forget_last {
            for part in parts[replicas..].iter_mut() {
                *part = self.forget_key(topology, part.server, e.bytes, e.request, meta);
            }
        }
        *e.sent = true;
        true
    }

    /// Has `server` lose a forwarded request's key: by `md` for a meta
    /// request, by `delete` for a classic one.
    fn forget_key(
        &self,
        topology: &Topology,
        server: usize,
        bytes: &Bytes,
        request: &Request,
        meta: Option<&MetaLines>,
    ) -> Part {
        match meta {
            Some(meta) => self.forget_on(topology, server, &meta.key),
            None => self.delete_on(topology, server, request.key(bytes, 0)),
        }
    }

    /// A plan machine's steps (see `plan::steps`), in either dialect: the
    /// older owners lose the key, then each step goes out once the one
    /// before is answered. False until the machine has settled, so the
    /// client's later requests go after every step that changes what they
    /// would see.
    // Rare: kept out of line so the common kinds' code stays together.
    #[inline(never)]
    fn dispatch_steps(&mut self, e: Sending<'_>, steps: &mut StepsWork) -> bool {
        let topology = e.topology;
        if !*e.sent {
            // This client's read-through copies replace their leases first
            // (see `CopiesUnderWay`).
            if steps.machine.after_copies() && self.copies.any() {
                return false;
            }
            // Its reply bytes: one line from each server of the first step
            // and from each older owner, and an `mg … v`'s value.
            let deletes = OlderForget::len(steps.older.as_ref());
            let value = match steps.meta.as_ref().is_some_and(|m| m.value) {
                true => self.estimate.max(MIN_ESTIMATE_BYTES),
                false => 0,
            };
            let cost = || e.bytes.len() + LINE_REPLY_BYTES * (steps.lines + deletes) + value;
            if !self.reserve_once(e.reserved, cost) {
                return false;
            }
            // By `md` for meta, by `delete` for classic.
            let key = &steps.key;
            let forget = |server| match key.1 {
                Some(base64) => self.forget_on(topology, server, &(key.0.clone(), base64)),
                None => self.delete_on(topology, server, &key.0),
            };
            if !OlderForget::advance(steps.older.as_mut(), forget) {
                return false;
            }
            *e.sent = true;
            let next = steps.machine.start();
            self.send_next(topology, steps, next, e.hot, e.reserved);
        }
        // One step at a time; later requests of the client wait (until the
        // machine settled), so they see the key as the steps left it.
        self.steps(topology, steps, e.hot, e.reserved) || steps.machine.settled()
    }

    /// Feeds a machine the replies of its step under way once they are all
    /// in (or, for a machine that takes them one by one, each as it comes),
    /// and sends what it says next, until a reply is awaited or the answer
    /// is known. True once it is: replies still awaited then are dropped.
    /// `reserved`: the entry's reservation, grown for each server asked
    /// beyond the first step's.
    pub(super) fn steps(
        &self,
        topology: &Arc<Topology>,
        steps: &mut StepsWork,
        hot: Option<&Rc<WriteGuard>>,
        reserved: &mut Reservation,
    ) -> bool {
        while steps.answer.is_none() {
            let StepsWork { machine, parts, .. } = &mut *steps;
            parts.iter_mut().for_each(Part::absorb);
            if machine.one_by_one() {
                // The first reply in: its part is done with.
                let Some(at) = parts.iter().position(|p| p.result.is_some()) else {
                    return false;
                };
                let Part {
                    server,
                    slot,
                    result,
                } = parts.remove(at);
                if let Some(slot) = slot {
                    spares::keep_slot(slot);
                }
                let Some(result) = result else {
                    return false;
                };
                let now = self.worker.clock.unix_seconds();
                let next = machine.on_reply_from(server, result, now);
                self.send_next(topology, steps, next, hot, reserved);
                continue;
            }
            if parts.iter().any(|p| p.result.is_none()) {
                return false;
            }
            let next = {
                let replies: SmallVec<[(usize, &CallResult); 3]> = parts
                    .iter()
                    .filter_map(|p| Some((p.server, p.result.as_ref()?)))
                    .collect();
                let lease = parts.first().and_then(|p| p.slot.as_ref()?.lease());
                let now = self.worker.clock.unix_seconds();
                machine.on_replies(&replies, lease, now)
            };
            self.send_next(topology, steps, next, hot, reserved);
        }
        true
    }

    /// Sends a machine's next step (its awaited messages become the work's
    /// parts), or keeps its answer. The request's hot-key guard (`hot`)
    /// watches what the machine says carries the client's write; the
    /// entry's reservation (`reserved`) grows by a reply for each message
    /// that says so.
    fn send_next(
        &self,
        topology: &Arc<Topology>,
        steps: &mut StepsWork,
        next: Next,
        hot: Option<&Rc<WriteGuard>>,
        reserved: &mut Reservation,
    ) {
        let tally = steps.machine.take_tally();
        let stats = &self.worker.stats;
        if let Some(hit) = tally.read_through {
            stats.read_through(1, usize::from(hit));
        }
        if let Some(outcome) = tally.copy {
            count_copy(stats, outcome);
        }
        if tally.taken_back {
            stats.copy_taken_back();
        }
        let messages = match next {
            Next::Answer(answer) => {
                steps.answer = Some(answer);
                // A meta read-through's copy for the new owner.
                if let Some(copy) = steps.machine.take_read_copy() {
                    copy_check::send(&self.worker, topology, self.lane, copy, &self.copies);
                }
                // An `mg` read's counts (read-throughs, zone hits).
                if let Some(tally) = steps.machine.read_tally() {
                    stats.read_through(tally.read_through.0, tally.read_through.1);
                    stats.zone_reads(tally.zone_hits, tally.written_back);
                    if let Some(hit) = tally.served {
                        topology.count_zone_hits(stats, &[hit]);
                    }
                }
                return;
            }
            Next::Send(messages) => messages,
        };
        // A step's replies are all taken; one taken as it came left its
        // part already, and the others are still awaited.
        if !steps.machine.one_by_one() {
            for part in steps.parts.drain(..) {
                if let Some(slot) = part.slot {
                    spares::keep_slot(slot);
                }
            }
        }
        // What each server asked beyond the first step's may bring back.
        let grown = messages.iter().filter(|m| m.grows).count();
        if grown > 0 {
            let value = match steps.meta.as_ref().is_some_and(|m| m.value) {
                true => self.estimate.max(MIN_ESTIMATE_BYTES),
                false => 0,
            };
            let more = grown * (LINE_REPLY_BYTES + value);
            self.budget.resize(reserved, reserved.bytes() + more);
        }
        for message in messages {
            let watch = hot.filter(|_| message.watched);
            let mut part = Part::new(message.server);
            let (wire, awaited) = (&message.wire, message.awaited);
            // A message wanting no reply (a `cas`'s copy, a lease's `md`)
            // still counts in flight until its server answered where a
            // fleet gate reads the count; machines watch only awaited ones.
            let counted = match awaited || watch.is_some() {
                true => None,
                false => UntilAnswered::on(topology),
            };
            let want_reply = awaited || counted.is_some();
            self.send(topology, &mut part, wire, message.expect, want_reply, watch);
            if awaited {
                steps.parts.push(part);
            } else if let (Some(slot), Some(counted)) = (&part.slot, counted) {
                slot.watch(counted);
            }
        }
    }

    /// A retrieval: its keys in chunks that fit the client's budget, each
    /// sub-request to its server (or joined to a hot key's get in flight,
    /// or answered by the near cache). An `mg` that may change its item
    /// (`T`, `N`) is watched by its hot-key guard (`hot`) as a write is.
    fn dispatch_retrieve(
        &mut self,
        topology: &Arc<Topology>,
        plan: &mut route::Retrieval,
        in_flight: &mut InFlight,
        owed: &mut Reservation,
        hot: Option<&Rc<WriteGuard>>,
        before: Before<'_, Entry>,
    ) -> bool {
        let write = hot.filter(|_| plan.is_meta());
        // Built in place by the plan and looked at here: the list is a few
        // hundred bytes, copied on every move.
        let mut chunk = route::Chunk::new();
        while plan.has_unsent() {
            let room = self.budget.room(self.client_limit(), self.out.len());
            let nothing_owed = self.budget.nothing_owed(self.out.len());
            let estimate = self.estimate.max(MIN_ESTIMATE_BYTES);
            let estimate = match plan.meta_value() {
                // An `mg` brings one line back, and a value only with `v`.
                Some(value) => {
                    plan.request_len() + LINE_REPLY_BYTES + if value { estimate } else { 0 }
                }
                None => estimate,
            };
            let keys = (room / estimate).min(route::MAX_CHUNK_KEYS);
            let keys = if keys == 0 && nothing_owed { 1 } else { keys };
            if keys == 0 {
                return false;
            }
            chunk.clear();
            plan.next_chunk_into(keys, &mut self.lines, &mut chunk);
            for sub in chunk.iter_mut() {
                // Sized to the room asked for above; reserved with the
                // chunk, below.
                let cost = sub.keys.max(1) * estimate;
                let backend = &topology.backends[sub.server];
                let slot = spares::slot(&self.wake);
                let conn = self.worker.conn(backend, self.lane);
                let earlier = Earlier {
                    entries: before,
                    unanswered: &self.unanswered,
                    current: in_flight,
                };
                let ticket = match self
                    .worker
                    .hot
                    .before_send(sub, &conn, topology, &slot, &earlier)
                {
                    GetShortcut::Send(ticket) => ticket,
                    GetShortcut::Joined => {
                        in_flight.push(SubInFlight {
                            id: sub.id,
                            server: sub.server as u32,
                            slot,
                            cost,
                        });
                        continue;
                    }
                    GetShortcut::Cached(block) => {
                        plan.on_piece(sub.id, Got::Value(block));
                        // A value from the near cache: a hit.
                        plan.on_done(sub.id, Ok(Outcome::Value), || 0);
                        continue;
                    }
                };
                // It may take the line (see `expect_of`): sent as `line_of`.
                let expect = plan.expect_of(sub);
                // A quiet `mg` goes with an `mn` behind it (`route::meta_wire`).
                let quiet;
                let wire = if plan.quiet() {
                    quiet = [plan.line_of(sub).clone(), Bytes::from_static(b"mn\r\n")];
                    &quiet[..]
                } else {
                    std::slice::from_ref(plan.line_of(sub))
                };
                if let Some(write) = write {
                    write.watch(&slot);
                }
                match conn.send(wire, expect, Some(slot.clone())) {
                    Ok(()) => {
                        if let Some(ticket) = ticket {
                            self.worker.hot.sent(ticket, &slot);
                        }
                        if let Some(write) = write {
                            write.queued();
                        }
                        in_flight.push(SubInFlight {
                            id: sub.id,
                            server: sub.server as u32,
                            slot,
                            cost,
                        });
                    }
                    Err(kind) => {
                        plan.on_done(sub.id, Err(backend.error(kind)), || 0);
                    }
                }
            }
            self.budget.resize(owed, retrieval_owed(in_flight, plan));
        }
        // Read-through hits go to their new owner before any later
        // request of this client.
        for copy in plan.take_copies() {
            copy_check::send(&self.worker, topology, self.lane, copy, &self.copies);
        }
        // With replicas (or moved keys), replies may send keys to
        // their next server: later requests wait until this one has
        // its answers (with zones read all at once, until every key has
        // its answer: a zone still answering is not waited for).
        // An `mg` asks its one server: later requests need not wait.
        in_flight.is_empty()
            || plan.settled()
            || plan.is_meta()
            || (topology.config.replicas <= 1 && !plan.has_moved_keys())
    }

    /// Sends `wire` to `server`, wanting its reply, as a new part.
    fn send_to(
        &self,
        topology: &Topology,
        server: usize,
        wire: &[Bytes],
        expect: &Expect,
        write: Option<&Rc<WriteGuard>>,
    ) -> Part {
        let mut part = Part::new(server);
        self.send(topology, &mut part, wire, expect.clone(), true, write);
        part
    }

    /// A forwarded write's [`forget_last`]: its deletes to the former
    /// replicas once the current ones answered. True when nothing is owed.
    pub(super) fn forget_last_lines(&self, entry: &mut Entry) -> bool {
        let Work::Lines {
            parts,
            finish:
                Finish::Quorum {
                    forget,
                    forget_last: true,
                    ..
                },
            meta,
        } = &mut entry.work
        else {
            return true;
        };
        let (topology, bytes, request) = (&entry.topology, &entry.bytes, &entry.request);
        forget_last(parts, *forget as usize, |server| {
            self.forget_key(topology, server, bytes, request, meta.as_deref())
        })
    }

    pub(super) fn forget_on(
        &self,
        topology: &Topology,
        server: usize,
        key: &(Bytes, bool),
    ) -> Part {
        let line = [crate::plan::handoff::forget_line(&key.0, key.1)];
        let expect = Expect::meta(MetaCommand::Delete, false);
        self.send_to(topology, server, &line, &expect, None)
    }

    /// Sends `delete <key>` to `server`, wanting its reply: an older ring's
    /// copy of a key written elsewhere goes before the write is answered.
    fn delete_on(&self, topology: &Topology, server: usize, key: &[u8]) -> Part {
        let mut line = bytes::BytesMut::with_capacity(key.len() + 9);
        line.extend_from_slice(b"delete ");
        line.extend_from_slice(key);
        line.extend_from_slice(b"\r\n");
        let expect = Expect::Line(LineKind::Delete);
        self.send_to(topology, server, &[line.freeze()], &expect, None)
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
        let slot = (want_reply || write.is_some()).then(|| spares::slot(&self.wake));
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

    /// Moves the replies that arrived for `entry` into its work.
    pub(super) fn absorb(&mut self, entry: &mut Entry) {
        let mut estimate = None;
        match &mut entry.work {
            Work::Lines { parts, .. } => parts.iter_mut().for_each(Part::absorb),
            Work::Steps(steps) => {
                steps.parts.iter_mut().for_each(Part::absorb);
                // An `mg … v`'s step replies and its answer give the
                // estimate.
                let reply = steps.parts.first().and_then(|p| p.result.as_ref());
                let answer = match &steps.answer {
                    Some(Answer::Reply(answer)) => Some(answer),
                    _ => None,
                };
                if let (Some(Ok(reply)), true) = (
                    reply.or(answer),
                    steps.meta.as_ref().is_some_and(|m| m.value),
                ) {
                    if reply.outcome == Outcome::Va {
                        estimate = Some(reply.len());
                    } else if reply.outcome.meta_miss() {
                        // A miss brought no value: without this a client
                        // whose reads miss would keep reserving the
                        // largest value per request, a handful in flight.
                        estimate = Some(MIN_ESTIMATE_BYTES);
                    }
                }
            }
            Work::Retrieve {
                plan, in_flight, ..
            } if nothing_arrived(in_flight, plan) => {
                // Its reservation is already what the retrieval owes: each
                // change to what it holds or awaits resized it.
                return;
            }
            Work::Retrieve {
                plan,
                in_flight,
                owed,
            } => {
                let mut i = 0;
                while i < in_flight.len() {
                    let sub = &in_flight[i];
                    sub.slot.take_each(|got| plan.on_piece(sub.id, got));
                    match sub.slot.outcome() {
                        Some(result) => {
                            plan.on_done(sub.id, result, || self.worker.clock.unix_seconds());
                            spares::keep_slot(in_flight.remove(i).slot);
                        }
                        None => i += 1,
                    }
                }
                if plan.largest_block() > 0 {
                    estimate = Some(plan.largest_block());
                } else if in_flight.is_empty() && !plan.has_unsent() && plan.brought_no_value() {
                    // Every key missed (as for a meta miss above).
                    estimate = Some(MIN_ESTIMATE_BYTES);
                }
                // Answered sub-requests give their estimate back; values
                // waiting for earlier keys stay owed.
                self.budget.resize(owed, retrieval_owed(in_flight, plan));
            }
            Work::Ready(_) | Work::Stats | Work::StatsReset => {}
        }
        if let Some(estimate) = estimate {
            self.estimate = estimate;
        }
    }
}

/// A delete that reaches the previous ring's former replicas last (the last
/// `forget` of `parts`, see `placement::Placement::Quorum`): sends them with
/// `send` once every other part has answered. True when every part has.
pub(super) fn forget_last(
    parts: &mut [Part],
    forget: usize,
    mut send: impl FnMut(usize) -> Part,
) -> bool {
    let (replicas, former) = parts.split_at_mut(parts.len() - forget);
    replicas.iter_mut().for_each(Part::absorb);
    if replicas.iter().any(|p| p.result.is_none()) {
        return false;
    }
    for part in former.iter_mut() {
        // Not sent yet: no slot and no answer.
        if part.slot.is_none() && part.result.is_none() {
            *part = send(part.server);
        }
        part.absorb();
    }
    former.iter().all(|p| p.result.is_some())
}
