//! How each kind of work's replies become the client's answer, once they
//! are in: the answering half of a client's [`Exchange`] (`dispatch.rs`
//! sends), one function per kind of work, and the writers they share (the
//! one reply that answers a request in either dialect, `write_one`; a
//! quorum's failure).

use super::*;
use crate::plan::steps::Answer;
use crate::protocol::outcome::{Outcome, Reply};

impl Exchange {
    /// Writes the entry's reply if it is complete; true if it was. `now`
    /// is what [`Work::head_now`] said of it in this look.
    pub(super) fn finish(&mut self, entry: &mut Entry, now: HeadNow) -> bool {
        let Some(refusal) = entry.instead else {
            return self.finish_reply(entry, now);
        };
        let answer = refusal.reply();
        // The reply (or its error) is written aside and dropped; memring's
        // own answer goes in its place once it came.
        let out = std::mem::take(&mut self.out);
        let complete = self.finish_reply(entry, now);
        drop(std::mem::replace(&mut self.out, out));
        if complete {
            self.out.push_slice(answer);
            // memring's own refusal, classified where its lines are.
            entry.said = Reply::from_static(answer).outcome;
        }
        complete
    }

    /// [`Exchange::finish`] with the entry's own reply.
    fn finish_reply(&mut self, entry: &mut Entry, now: HeadNow) -> bool {
        let stats = &self.worker.stats;
        match &mut entry.work {
            Work::Ready(reply) => self.out.push(reply.clone()),
            Work::Stats => {
                super::report::write_stats(self.out.scratch(), stats, &self.worker.layout.load());
                entry.said = Outcome::Other;
            }
            Work::StatsReset => {
                super::report::reset_stats(stats);
                self.out.push_slice(b"RESET\r\n");
                entry.said = Outcome::Other;
            }
            Work::Lines { .. } => return self.finish_lines(entry),
            Work::Steps(_) => return self.finish_steps(entry),
            Work::Retrieve { .. } => return self.finish_retrieve(entry, now),
        }
        true
    }

    /// A forwarded request's replies (either dialect): the one server's,
    /// a quorum's, or a broadcast's.
    fn finish_lines(&mut self, entry: &mut Entry) -> bool {
        // Also for `noreply`: the former replicas' deletes still go.
        if !self.forget_last_lines(entry) {
            return false;
        }
        let Work::Lines {
            parts,
            finish,
            meta,
        } = &mut entry.work
        else {
            return true;
        };
        if OlderForget::pending(finish.older()) {
            return false;
        }
        if entry.noreply {
            // Nothing goes back for `noreply` and later replies need not
            // wait for it, but its bytes stay reserved until the servers
            // answered.
            if !entry.sent {
                return false;
            }
            let slots = parts
                .iter()
                .filter_map(|p| Some((p.server, p.slot.clone()?)))
                .collect();
            let planned = entry.topology.again_if_counted();
            self.unanswered
                .push((slots, std::mem::take(&mut entry.reserved), planned));
            return true;
        }
        let stats = &self.worker.stats;
        let answer = match finish {
            Finish::Quorum {
                quorum,
                forget,
                warm,
                ..
            } => {
                // Warming servers' replies are awaited like the deletes.
                let alone = entry.topology.config.replicas <= 1;
                let awaited = (*forget + *warm) as usize;
                match quorum_answer(stats, parts, *quorum as usize, awaited, alone) {
                    QuorumAnswer::Wait => return false,
                    QuorumAnswer::Reply(answer) => answer,
                    QuorumAnswer::NoQuorum(servers) => {
                        entry.said = Outcome::ServerError;
                        write_no_quorum(self.out.scratch(), &servers);
                        return true;
                    }
                }
            }
            _ if parts.iter().any(|p| p.result.is_none()) => return false,
            // Every part answered (above): the one server's reply.
            Finish::Forward => parts[0].result.take().expect("answered"),
            Finish::AllOk(joined) => {
                let names = parts
                    .iter()
                    .map(|p| entry.topology.backends[p.server].name());
                let results = parts.iter().filter_map(|p| p.result.as_ref());
                return self.finish_broadcast(&mut entry.said, names.zip(results), joined);
            }
        };
        let counts_cas = meta.as_ref().map(|meta| meta.counts_cas);
        entry.said = write_one(&mut self.out, stats, entry, counts_cas, answer);
        true
    }

    /// A broadcast's answer (`flush_all`) from each server's `(name,
    /// result)`; one pool's part of a joined one writes nothing but hands
    /// its failures to the last.
    fn finish_broadcast<'a>(
        &mut self,
        said: &mut Outcome,
        results: impl Iterator<Item = (&'a str, &'a CallResult)>,
        joined: &Option<Box<Joined>>,
    ) -> bool {
        // A refusal answers before servers memring could not reach, across
        // every pool of a joined flush too.
        let (mut refused, mut failed): (Option<Reply>, Vec<String>) =
            match broadcast_answer(results) {
                Broadcast::AllOk => (None, Vec::new()),
                Broadcast::Refused(reply) => (Some(reply.clone()), Vec::new()),
                Broadcast::Failed(failed) => {
                    (None, failed.into_iter().map(str::to_owned).collect())
                }
            };
        if let Some(joined) = joined {
            let mut all = joined.failed.borrow_mut();
            all.append(&mut failed);
            let mut first_refusal = joined.refused.borrow_mut();
            if first_refusal.is_none() {
                *first_refusal = refused.take();
            }
            if !joined.last {
                return true;
            }
            failed = std::mem::take(&mut *all);
            refused = first_refusal.take();
        }
        if let Some(reply) = refused {
            *said = reply.outcome;
            self.out.push(reply.bytes);
        } else if failed.is_empty() {
            *said = Outcome::Ok;
            self.out.push_slice(b"OK\r\n");
        } else {
            *said = Outcome::ServerError;
            write_server_error(
                self.out.scratch(),
                &format_args!("failed on {}", failed.join(", ")),
            );
        }
        true
    }

    /// A plan machine's steps: its answer once the replies it waits for
    /// are in, in the dialect asked.
    fn finish_steps(&mut self, entry: &mut Entry) -> bool {
        let Work::Steps(steps) = &mut entry.work else {
            return true;
        };
        if OlderForget::pending(steps.older.as_ref()) {
            return false;
        }
        let reserved = &mut entry.reserved;
        if !self.steps(&entry.topology, steps, entry.hot.as_ref(), reserved) {
            return false;
        }
        let Some(answer) = steps.answer.take() else {
            return false;
        };
        let counts_cas = steps.meta.as_ref().map(|meta| meta.counts_cas);
        let stats = &self.worker.stats;
        match answer {
            Answer::NoQuorum(servers) => {
                if !entry.noreply {
                    entry.said = Outcome::ServerError;
                    write_no_quorum(self.out.scratch(), &servers);
                }
            }
            // A sampled `gat` run as the lease retry, or an `mg` answered
            // in steps, hands its answer to its shadow pair there.
            Answer::Reply(reply) => {
                entry.said = write_one(&mut self.out, stats, entry, counts_cas, reply);
            }
        }
        true
    }

    /// A retrieval: the rest of its values and its end, once `head_now`
    /// says it may finish (every key sent and answered); then its counts.
    fn finish_retrieve(&mut self, entry: &mut Entry, now: HeadNow) -> bool {
        let Work::Retrieve { plan, owed, .. } = &mut entry.work else {
            return true;
        };
        if !now.finishes() || !plan.emit(&mut self.out) {
            return false;
        }
        entry.said = plan.said();
        let stats = &self.worker.stats;
        if plan.is_meta() {
            // An `mg`: counted as a meta command's answer is (by what the
            // server said; the figures take a quiet miss for a miss).
            let answer = plan.meta_answer();
            if let (Some(pairs), Some(answer)) = (entry.shadow.take(), answer) {
                shadow::primary_meta_answer(&pairs, answer);
            }
            if let Some(Ok(reply)) = answer {
                stats.reply(entry.command, reply.outcome);
                let hit = !reply.outcome.meta_miss();
                entry.topology.figures.retrieval(1, usize::from(hit));
            }
            *owed = Reservation::default();
            return true;
        }
        if let Some(pairs) = entry.shadow.take() {
            shadow::primary_answers(&pairs, &plan.take_answers());
        }
        let (keys, hits) = plan.counts();
        stats.retrieval(keys, hits);
        entry.topology.figures.retrieval(keys, hits);
        let (reads, found) = plan.read_through();
        stats.read_through(reads, found);
        stats.zone_reads(plan.zone_hits(), plan.written_back());
        entry.topology.count_zone_hits(stats, plan.zone_served());
        *owed = Reservation::default();
        true
    }
}

/// What a replicated write's replicas decided.
enum QuorumAnswer {
    /// Not yet.
    Wait,
    /// The client's answer.
    Reply(CallResult),
    /// No quorum: the replicas that failed.
    NoQuorum(Vec<Arc<str>>),
}

/// The answer of a replicated write over `parts`, whose last `awaited` (the
/// previous ring's replicas losing the key, warming servers) are waited for
/// and not counted. With one replica and `alone` (no replicas configured: a
/// key owned elsewhere in an older ring of chained changes, deleted there),
/// the owner's reply as it came.
fn quorum_answer(
    stats: &crate::stats::Stats,
    parts: &[Part],
    quorum: usize,
    awaited: usize,
    alone: bool,
) -> QuorumAnswer {
    let (replicas, forgotten) = parts.split_at(parts.len() - awaited);
    if forgotten.iter().any(|p| p.result.is_none()) {
        return QuorumAnswer::Wait;
    }
    if alone && replicas.len() == 1 {
        return match &replicas[0].result {
            Some(result) => QuorumAnswer::Reply(result.clone()),
            None => QuorumAnswer::Wait,
        };
    }
    let results: SmallVec<[Option<&CallResult>; 4]> =
        replicas.iter().map(|p| p.result.as_ref()).collect();
    match decide(&results, quorum) {
        Decision::Wait => QuorumAnswer::Wait,
        Decision::Answer(reply) => {
            // Slower replicas finish in the background on their own
            // connections.
            let outstanding = results.iter().filter(|r| r.is_none()).count();
            stats.replica_background(outstanding);
            QuorumAnswer::Reply(Ok(reply))
        }
        Decision::Fail(servers) => QuorumAnswer::NoQuorum(servers),
    }
}

/// Writes the one reply that answers `entry` (a server's, or a quorum's
/// or machine's choice of one), counting it and handing it to the entry's
/// shadow pair; returns what it says. `counts_cas`: `None` for a classic
/// request, for a meta one whether its reply feeds the `cas_*` stats. A
/// `noreply` request's answer is neither written nor counted, and a meta
/// answer that is empty (`q` suppressed it, as memcached would) is counted
/// and not written.
fn write_one(
    out: &mut OutQueue,
    stats: &crate::stats::Stats,
    entry: &mut Entry,
    counts_cas: Option<bool>,
    reply: CallResult,
) -> Outcome {
    if let Some(pairs) = entry.shadow.take() {
        match counts_cas {
            Some(_) => shadow::primary_meta_answer(&pairs, reply.as_ref()),
            None => shadow::primary_classic_answer(&pairs, reply.as_ref()),
        }
    }
    if entry.noreply {
        return Outcome::Nothing;
    }
    match reply {
        Ok(reply) => {
            stats.reply(entry.command, reply.outcome);
            if entry.command == Command::MetaGet {
                // `mg` misses with `EN`, which `q` hides: an empty reply is
                // a quiet miss.
                let hit = !reply.outcome.meta_miss();
                entry.topology.figures.retrieval(1, usize::from(hit));
            }
            if counts_cas == Some(true) {
                stats.meta_cas(reply.outcome);
            }
            let said = reply.outcome;
            if !reply.is_empty() {
                out.push(reply.bytes);
            }
            said
        }
        Err(error) => {
            write_server_error(out.scratch(), &error);
            Outcome::ServerError
        }
    }
}

/// `SERVER_ERROR no quorum: …`, naming the replicas that failed (none named
/// when they all answered, with errors).
fn write_no_quorum(out: &mut BytesMut, servers: &[Arc<str>]) {
    let names: Vec<&str> = servers.iter().map(|s| &**s).collect();
    let reason = if names.is_empty() {
        "no quorum: replicas answered with errors".to_string()
    } else {
        format!("no quorum: failed on {}", names.join(", "))
    };
    write_server_error(out, &reason);
}
