//! The session's half of a shadow pool (see `pools/shadow.rs`): for a sampled key,
//! a copy of each write and a meta get for each read go to the key's owner
//! in the shadow pool, on this worker's connection to it, with a slot that
//! only a [`ShadowReply`] watches. Nothing here ever waits: the client's
//! answer comes from the primary alone, and a shadow request that finds no
//! room in the worker's bound is shed and counted.

use super::*;
use crate::error::BackendError;
use crate::hotkeys::{ClassicKeys, CountedKeys, MetaKey};
use crate::pools::shadow::{value_digest, Pair, Sampler, ShadowReply, Side};
use crate::protocol::encode::Outbound;
use crate::protocol::outcome::{Outcome, Reply};
use crate::stats::ShadowCounters;

/// The sampled keys of one request: (key index in the request, its pair).
pub(super) type Pairs = SmallVec<[(u32, Rc<Pair>); 1]>;

/// A pool's shadow as one request needs it.
struct Shadow {
    counters: Arc<ShadowCounters>,
    sampler: Sampler,
    topology: Arc<Topology>,
}

/// How a shadow get's reply is framed.
fn get_expect() -> Expect {
    Expect::meta(MetaCommand::Get, false)
}

/// `mg <key> v [b] [T<ttl>]`: the shadow's read of a key, whatever the
/// client asked (its value is what is compared; `T` keeps a `gat`'s or
/// `mg … T`'s new expiry in step on the shadow).
fn get_line(token: &[u8], base64: bool, ttl: Option<&[u8]>) -> Bytes {
    let mut line = BytesMut::with_capacity(token.len() + 24);
    line.extend_from_slice(b"mg ");
    line.extend_from_slice(token);
    line.extend_from_slice(b" v");
    if base64 {
        line.extend_from_slice(b" b");
    }
    if let Some(ttl) = ttl {
        line.extend_from_slice(b" T");
        line.extend_from_slice(ttl);
    }
    line.extend_from_slice(b"\r\n");
    line.freeze()
}

/// The primary's answers to a sampled retrieval, as written to the client,
/// go to their pairs (both lists are in key order).
pub(super) fn primary_answers(pairs: &Pairs, answers: &[(u32, Option<Bytes>)]) {
    for (index, pair) in pairs {
        if let Some((_, block)) = answers.iter().find(|(k, _)| k == index) {
            pair.primary(match block {
                Some(block) => Side::Hit(value_digest(block)),
                None => Side::Miss,
            });
        }
    }
}

/// The primary's answer to a sampled one-key `gat` answered in steps (the
/// lease retry) goes to its pair: a value, with or without the `END` after
/// it (a run of a reply across pools has none), a hit; `END` (or nothing)
/// a miss.
pub(super) fn primary_classic_answer(pairs: &Pairs, reply: Result<&Reply, &BackendError>) {
    let side = match reply {
        Ok(reply) if reply.outcome == Outcome::Value => {
            let block = reply.strip_suffix(b"END\r\n").unwrap_or(reply);
            Side::Hit(value_digest(block))
        }
        Ok(reply) if matches!(reply.outcome, Outcome::End | Outcome::Nothing) => Side::Miss,
        _ => Side::Failed,
    };
    primary_side(pairs, side);
}

/// The primary's answer to a sampled `mg` goes to its pair.
pub(super) fn primary_meta_answer(pairs: &Pairs, reply: Result<&Reply, &BackendError>) {
    let side = match reply {
        Ok(reply) => crate::pools::shadow::meta_side(reply),
        Err(_) => Side::Failed,
    };
    primary_side(pairs, side);
}

/// A one-key request's answer, as its pairs compare it.
fn primary_side(pairs: &Pairs, side: Side) {
    for (_, pair) in pairs {
        pair.primary(side);
    }
}

/// What the shadow pool is sent of a request (its keys as the ring places
/// them, as the hot keys count them: [`CountedKeys`]).
pub(super) trait Shadowed: CountedKeys {
    /// A read whose answers are compared, a write that is copied, or
    /// neither.
    fn shadow_part(&self) -> ShadowPart<'_>;
    /// Key `i` as the client sent it, and whether that is base64.
    fn token(&self, i: usize) -> (&[u8], bool);
    /// A write's copy for the shadow and its reply's kind: the shadow's cas
    /// numbers are its own (a `cas` goes as a `set`, a meta `C` is
    /// dropped), and the copy always answers, so the shadow's connection
    /// stays in step (`noreply` and `q` are dropped too).
    fn copy(&self) -> (Outbound, Expect);
}

/// What a request is to the shadow.
pub(super) enum ShadowPart<'r> {
    /// A read: each sampled key is read from the shadow too (with a `gat`'s
    /// or an `mg … T`'s new expiry, `ttl`), and compared.
    Reads {
        ttl: Option<&'r [u8]>,
    },
    /// A write (storage, delete, arithmetic, touch): a sampled key's copy.
    Copy,
    Nothing,
}

impl Shadowed for ClassicKeys<'_> {
    fn shadow_part(&self) -> ShadowPart<'_> {
        let command = self.request.command;
        // A retrieval, or a one-key `gat` planned as the lease retry.
        if command.is_retrieval() {
            return ShadowPart::Reads {
                ttl: self.request.arg.map(|arg| arg.of(self.bytes)),
            };
        }
        // A write to its keys, as the hot keys count one (a `flush_all`
        // has no key to copy).
        match self.writes() && !self.flushes() {
            true => ShadowPart::Copy,
            false => ShadowPart::Nothing,
        }
    }

    fn token(&self, i: usize) -> (&[u8], bool) {
        (self.key(i), false)
    }

    fn copy(&self) -> (Outbound, Expect) {
        let (request, bytes) = (self.request, self.bytes);
        let wire = match request.command {
            Command::Cas => crate::protocol::encode::cas_as_set(request, bytes),
            _ => forwardable(bytes, request),
        };
        let line = request.command.reply_line().unwrap_or(LineKind::Ok);
        (wire, Expect::Line(line))
    }
}

impl Shadowed for MetaKey<'_> {
    fn shadow_part(&self) -> ShadowPart<'_> {
        match self.request.command {
            MetaCommand::Get => ShadowPart::Reads {
                ttl: self
                    .request
                    .flags(self.bytes)
                    .find(|(flag, _)| *flag == b'T')
                    .map(|(_, token)| &token[1..]),
            },
            MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arithmetic => ShadowPart::Copy,
            MetaCommand::Noop | MetaCommand::Debug => ShadowPart::Nothing,
        }
    }

    fn token(&self, _: usize) -> (&[u8], bool) {
        (self.request.key_token(self.bytes), self.request.base64)
    }

    fn copy(&self) -> (Outbound, Expect) {
        let copy = route::meta_copy(self.request, self.bytes);
        let expect = Expect::meta(self.request.command, false);
        (smallvec::smallvec![copy], expect)
    }
}

/// Where a client's requests of this turn are planned: its bound pool,
/// if any, and what this turn's topology load saw.
pub(super) type Turn<'s> = (Option<&'s SharedTopology>, &'s TurnTopology);

impl Exchange {
    /// The shadow of the pool a request with routing key `key` is planned
    /// on (the bound pool's, for a client of a pool's own listener).
    fn shadow_for(&self, (bound, turn): Turn<'_>, key: &[u8]) -> Option<Shadow> {
        // This turn's topology load already saw whether there are shadows.
        if let TurnTopology::Fixed {
            shadowed: false, ..
        } = turn
        {
            return None;
        }
        let layout = self.worker.layout.load();
        if !layout.shadowed() {
            return None;
        }
        let pool = match bound {
            Some(bound) => layout.index_of(bound)?,
            None => layout.pool_of(key),
        };
        let link = layout.shadow_of(pool)?;
        Some(Shadow {
            counters: link.counters.clone(),
            sampler: link.sampler,
            topology: layout.pools()[link.pool].topology.load_full(),
        })
    }

    /// Sends the shadow's part of a request (either dialect) planned as
    /// `plan`: a write's copy, or one `mg` per sampled key of a read, whose
    /// pairs it returns (see [`Shadowed`]).
    pub(super) fn shadow(
        &self,
        turn: Turn<'_>,
        request: &impl Shadowed,
        plan: &mut Plan,
    ) -> Option<Box<Pairs>> {
        if request.len() == 0 {
            return None;
        }
        // First whether its pool has a shadow: most have none, and this
        // turn's topology already knows.
        let shadow = self.shadow_for(turn, request.key(0))?;
        // Only a request the plan sends a key of to a server.
        let part = request.shadow_part();
        if matches!(part, ShadowPart::Nothing) || plan.key_target(0).is_none() {
            return None;
        }
        let ShadowPart::Reads { ttl } = part else {
            let key = request.key(0);
            if !shadow.sampler.sampled(key) {
                return None;
            }
            let (wire, expect) = request.copy();
            self.send_shadow(&shadow, key, &wire, expect, None);
            return None;
        };
        let mut pairs = Pairs::new();
        for i in 0..request.len() {
            let key = request.key(i);
            if !shadow.sampler.sampled(key) {
                continue;
            }
            let pair = Pair::new(shadow.counters.clone());
            let (token, base64) = request.token(i);
            let line = get_line(token, base64, ttl);
            if self.send_shadow(&shadow, key, &[line], get_expect(), Some(pair.clone())) {
                pairs.push((i as u32, pair));
            }
        }
        if pairs.is_empty() {
            return None;
        }
        // A classic retrieval's answers are compared key by key as they
        // go to the client; an `mg`'s one answer as it came.
        if let Plan::Retrieve(retrieval) = plan {
            if !retrieval.is_meta() {
                retrieval.record_answers();
            }
        }
        Some(Box::new(pairs))
    }

    /// Queues `wire` on the shadow owner of `key`, if the worker's bound
    /// has room (else it is shed); true if it went.
    fn send_shadow(
        &self,
        shadow: &Shadow,
        key: &[u8],
        wire: &[Bytes],
        expect: Expect,
        pair: Option<Rc<Pair>>,
    ) -> bool {
        let Some(server) = shadow.topology.owner_index(key) else {
            if pair.is_none() {
                shadow.counters.lost_write();
            }
            return false;
        };
        let size = wire.iter().map(Bytes::len).sum();
        // A write's copy that does not go leaves the shadow without it.
        let write = pair.is_none();
        let Some(ticket) = self.worker.shadow.admit(size) else {
            shadow.counters.shed();
            if write {
                shadow.counters.lost_write();
            }
            return false;
        };
        let backend = &shadow.topology.backends[server];
        let conn = self.worker.conn(backend, self.lane);
        let slot = Slot::new(self.worker.shadow.nobody());
        slot.watch(Rc::new(ShadowReply::new(
            shadow.counters.clone(),
            pair,
            ticket,
        )));
        shadow.counters.sent();
        match conn.send(wire, expect, Some(slot)) {
            Ok(()) => true,
            Err(_) => {
                // The slot (and its ticket) go with the refused request.
                shadow.counters.failed();
                if write {
                    shadow.counters.lost_write();
                }
                false
            }
        }
    }
}

/// The `stats shadow` reply.
pub(super) fn shadow_report(worker: &WorkerCtx) -> Bytes {
    let mut out = BytesMut::new();
    super::report::write_shadow_stats(&mut out, &worker.layout.load());
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shadow_get_asks_for_the_value_and_keeps_b_and_t() {
        assert_eq!(&get_line(b"k", false, None)[..], b"mg k v\r\n");
        assert_eq!(
            &get_line(b"a2V5", true, Some(b"30"))[..],
            b"mg a2V5 v b T30\r\n"
        );
    }
}
