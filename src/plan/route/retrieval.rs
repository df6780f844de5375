//! A classic retrieval (`get`, `gets`, `gat`, `gats`) over one or more
//! keys: which server each key is asked of, in chunks, the read-through of
//! a moved key and the other zones' replicas after a miss, the copies a hit
//! found elsewhere makes, and the client's reply in the client's key order.
//! An `mg` on one server is the one-key case in the meta dialect (see
//! [`MetaGet`]): the server's reply, as it came, is the client's.

use super::*;

mod emit;

/// Where one key of a retrieval stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyState {
    /// Not asked yet (or to be asked of its next replica).
    Unsent,
    /// Asked in sub-request `sub`.
    Asked { sub: u32 },
    /// Its value block, waiting for the keys before it.
    Found(Bytes),
    /// No value will be written for it.
    Missed,
}

/// One sub-request of a retrieval.
#[derive(Debug)]
pub(super) struct Sub {
    /// Key indexes in the order they were sent.
    pub(super) keys: SmallVec<[u32; 8]>,
    /// Index in `keys` of the next key a value may be for.
    cursor: usize,
    /// The server answered with an error line instead of values.
    error_line: Option<Reply>,
    /// A one-line reply (a read-through's from a moved key's previous
    /// owner, or an error line), read once complete, with what the
    /// connection framed it as.
    read: Option<Bytes>,
    /// A read-through from a moved key's previous owner (one key, `mg`: see
    /// `handoff::fetch_line`).
    meta: bool,
    /// The server it went to (a backend index).
    server: usize,
}

/// The sub-requests of one chunk of a retrieval (see
/// [`Retrieval::next_chunk_into`]).
pub(crate) type Chunk = SmallVec<[SubRequest; 4]>;

/// A sub-request to send: `line` to server `server`; its reply is fed back
/// under `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubRequest {
    pub id: u32,
    pub server: usize,
    pub line: Bytes,
    /// `line` is one meta get (a hand-off read-through), not a classic one.
    pub meta: bool,
    /// How many keys `line` asks for.
    pub keys: usize,
}

/// A retrieval in progress (see the module doc).
#[derive(Debug)]
pub(crate) struct Retrieval {
    command: Command,
    bytes: Bytes,
    keys: Vec<Span>,
    exptime: Option<Span>,
    /// Per key, the servers to ask in order (owner first, healthy first);
    /// one entry per key without replicas.
    pub(super) candidates: Vec<Servers>,
    /// Per key, its xxh3 hash when the ring placed it by that (for hot-key
    /// counting); empty otherwise.
    hashes: Vec<u64>,
    /// Which candidate each key is on.
    round: Vec<u8>,
    fall_through_on_miss: bool,
    state: Vec<KeyState>,
    /// Keys before this index have been sent at least once.
    next_unsent: usize,
    /// Keys to be asked of their next replica.
    retry: VecDeque<u32>,
    pub(super) subs: Vec<Sub>,
    /// Empty key lists of earlier subs that outgrew their inline room, for
    /// the next ones.
    spare_sub_keys: Vec<SmallVec<[u32; 8]>>,
    /// The next key whose value (or miss) goes to the client.
    next_emit: usize,
    values_written: usize,
    /// What the reply [`Retrieval::emit`] finished says.
    said: Outcome,
    answered: bool,
    first_error: Option<BackendError>,
    /// Bytes of values held, waiting for the keys before them.
    held: usize,
    /// The largest value block seen, for the session's estimate.
    largest_block: usize,
    /// A hand-off window is open: some keys may be moved keys.
    handoff: bool,
    /// Per key, the index in its candidates from which they are previous
    /// owners (`NOT_MOVED`: none): a value found there is read through and
    /// copied to the first candidate (the new owner).
    previous_from: Vec<u8>,
    /// Copies to send to new owners (`add` lines), each checked once it
    /// has landed.
    copies: Vec<crate::plan::handoff::ReadCopy>,
    /// Read-through hits may be copied (`shared_with = "memring"`).
    copies_allowed: bool,
    /// Outside a window, with zones: a hit found in another zone is copied
    /// to the key's local replica (its first candidate) as a hand-off
    /// read-through hit is to its new owner (`zone_write_back`).
    write_back: bool,
    /// With local-first reads (zones, outside a window): per key, whether
    /// its first candidate is in this sidecar's zone; empty otherwise.
    first_local: Vec<bool>,
    /// Hits served by a key's local replica, and by another zone's.
    zone_hits: (usize, usize),
    /// With zones, `zone_fallback = "all_at_once"`: after its first
    /// candidate (the local replica) missed or failed, a key is asked of
    /// all its other candidates at once, and the first hit answers.
    pub(super) all_at_once: bool,
    /// With `all_at_once`, per key: the candidates asked at once whose
    /// answer has not come yet.
    pub(super) asks: Vec<u8>,
    /// With local-first reads, each hit: which replica served it, for the
    /// per-zone counters.
    zone_served: Vec<ZoneHit>,
    /// Keys asked of their previous owner, and values found there.
    read_through: (usize, usize),
    /// Whether this is the whole reply or one run of a retrieval whose
    /// keys go to several pools.
    split: Split,
    /// With [`Retrieval::record_answers`]: each key's answer as it went to
    /// the client (key index, its value block or `None` for a miss), for a
    /// shadow pool's comparison.
    answers: Option<Vec<(u32, Option<Bytes>)>>,
    /// The client asked in the meta dialect: an `mg`.
    meta: Option<MetaGet>,
}

/// A retrieval in the meta dialect: one `mg`, sent to its one server as the
/// client sent it (and an `mn` behind it when quiet, see `route::meta_wire`),
/// whose reply is the client's answer as it came (its flags, opaque, `k`
/// echo, `EN`, or nothing when quiet). Its key is settled (as a miss: no
/// `VALUE` block) once the reply is in.
#[derive(Debug)]
struct MetaGet {
    /// `q`: the reply may be nothing, ended by the `MN` of the `mn` sent.
    quiet: bool,
    /// `v`: the reply may carry the value (for the session's estimate).
    value: bool,
    /// The server's reply, once complete.
    reply: Option<Reply>,
}

/// A retrieval's part in the client's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    /// The whole reply: values, then `END` (or the error).
    Whole,
    /// A run of keys of one pool, not the last: its values only, and a
    /// failed server's keys read as misses (an error line cannot follow
    /// values another run wrote).
    Part,
    /// The last run: its values and the `END`, never an error line.
    Last,
}

impl Default for Retrieval {
    /// Storage for a retrieval, planned by [`Reuse`].
    fn default() -> Retrieval {
        Retrieval {
            command: Command::Get,
            bytes: Bytes::new(),
            keys: Vec::new(),
            exptime: None,
            candidates: Vec::new(),
            hashes: Vec::new(),
            round: Vec::new(),
            fall_through_on_miss: false,
            state: Vec::new(),
            next_unsent: 0,
            retry: VecDeque::new(),
            subs: Vec::new(),
            spare_sub_keys: Vec::new(),
            next_emit: 0,
            values_written: 0,
            said: Outcome::End,
            answered: false,
            first_error: None,
            held: 0,
            largest_block: 0,
            handoff: false,
            previous_from: Vec::new(),
            copies: Vec::new(),
            copies_allowed: false,
            write_back: false,
            first_local: Vec::new(),
            zone_hits: (0, 0),
            all_at_once: false,
            asks: Vec::new(),
            zone_served: Vec::new(),
            read_through: (0, 0),
            split: Split::Whole,
            answers: None,
            meta: None,
        }
    }
}

impl Retrieval {
    /// Plans the retrieval `request` (bytes `bytes`) on `topology` into
    /// this storage, keeping the capacity of its lists.
    pub(super) fn plan(
        &mut self,
        request: &Request,
        bytes: Bytes,
        topology: &Topology,
        health: &HealthView,
    ) {
        let replicas = topology.config.replicas.max(1);
        let handoff = topology.previous.is_some();
        // During a window a miss falls through every candidate: with
        // replicas, a replica that just joined the set has nothing yet.
        // With zones a miss on the local zone's replica asks the others.
        let fall_through = handoff
            || (replicas > 1
                && (topology.config.read_miss_fallthrough || topology.reads_local_first()));
        self.reset(request, bytes, fall_through);
        self.handoff = handoff;
        self.copies_allowed = topology.config.shared_with.copies();
        self.write_back = zone_writes_back(topology);
        self.all_at_once = !handoff
            && replicas > 1
            && topology.reads_local_first()
            && topology.config.zone_fallback == crate::config::ZoneFallback::AllAtOnce;
        if self.all_at_once {
            self.asks.resize(request.keys.len(), 0);
        }
        for i in 0..request.keys.len() {
            let key = request.key(&self.bytes, i);
            // The key's servers, and how many of them own it now (the rest
            // owned it in the previous ring: asked after a miss).
            let (servers, current) = match place(key, KeyOp::READ, Some(()), topology, health) {
                Placement::Owner { server, hash } => {
                    self.hashes.extend(hash);
                    (smallvec::smallvec![server], 1)
                }
                Placement::Moved {
                    owner,
                    previous,
                    hash,
                    ..
                } => {
                    self.hashes.extend(hash);
                    (smallvec::smallvec![owner, previous], 1)
                }
                Placement::ReadThrough {
                    servers, current, ..
                } => (servers, current),
                // A read is never a write's quorum or cas.
                Placement::NoServers | Placement::Quorum(_) | Placement::CasThenCopy { .. } => {
                    (Servers::new(), 0)
                }
            };
            if handoff {
                self.previous_from.push(if servers.len() > current {
                    current as u8
                } else {
                    NOT_MOVED
                });
            } else if topology.reads_local_first() {
                let local = servers.first().is_some_and(|&s| topology.is_local(s));
                self.first_local.push(local);
                if self.write_back {
                    // The replicas after a local first one are other
                    // zones': a hit there is read and copied as a previous
                    // owner's.
                    let from = if local && servers.len() > 1 {
                        1
                    } else {
                        NOT_MOVED
                    };
                    self.previous_from.push(from);
                }
            }
            self.candidates.push(servers);
        }
    }

    /// Plans the `mg` `request` (bytes `bytes`) into this storage: one key,
    /// asked of `server` (placed with the hash `hash`, when the ring took
    /// one), in the meta dialect (see [`MetaGet`]).
    pub(super) fn plan_meta_get(
        &mut self,
        request: &MetaRequest,
        bytes: Bytes,
        server: usize,
        hash: Option<u64>,
    ) {
        debug_assert!(
            self.bytes.is_empty() && self.keys.is_empty() && self.candidates.is_empty(),
            "a retrieval is planned only once cleared"
        );
        self.command = Command::MetaGet;
        // An `mg` without a key (memcached refuses it) has none to name.
        self.keys
            .push(request.key.unwrap_or(Span { start: 0, end: 0 }));
        self.bytes = bytes;
        self.round.push(0);
        self.state.push(KeyState::Unsent);
        self.hashes.extend(hash);
        self.candidates.push(smallvec::smallvec![server]);
        self.meta = Some(MetaGet {
            quiet: request.may_be_silent(),
            value: request.value,
            reply: None,
        });
    }

    /// The most sub-requests this retrieval has in flight at once: one per
    /// key (a key is asked of its next server only once the one before
    /// answered), unless its keys are asked of all their other zones at
    /// once.
    pub(crate) fn most_in_flight(&self) -> usize {
        if self.all_at_once {
            usize::MAX
        } else {
            self.keys.len()
        }
    }

    /// Whether the client asked in the meta dialect (an `mg`).
    #[inline]
    pub(crate) fn is_meta(&self) -> bool {
        self.meta.is_some()
    }

    /// For an `mg`, whether its reply may carry the value (`v`); `None`
    /// for a classic retrieval.
    pub(crate) fn meta_value(&self) -> Option<bool> {
        self.meta.as_ref().map(|meta| meta.value)
    }

    /// The request's bytes as the client sent them.
    pub(crate) fn request_len(&self) -> usize {
        self.bytes.len()
    }

    /// How the reply to `sub` is framed: the client's `mg` (quiet: an `mn`
    /// follows it), a moved key's read-through `mg`, or `VALUE` blocks.
    /// `VALUE` blocks are framed against the line sent, which the
    /// expectation keeps: the client's own bytes it takes from `sub` (one
    /// handle on them a get, not two), so the line to send is
    /// [`Retrieval::line_of`] `sub`, not `sub.line`.
    pub(crate) fn expect_of(&self, sub: &mut SubRequest) -> Expect {
        match &self.meta {
            Some(meta) => Expect::meta(MetaCommand::Get, meta.quiet),
            None if sub.meta => Expect::meta(MetaCommand::Get, false),
            None => {
                let cursor = self.keys_from(&sub.line);
                let request = if self.is_own(&sub.line) {
                    std::mem::take(&mut sub.line)
                } else {
                    sub.line.clone()
                };
                Expect::Values {
                    request,
                    cursor,
                    with_cas: matches!(self.command, Command::Gets | Command::Gats),
                }
            }
        }
    }

    /// The line to send for `sub`: its own, or the client's bytes when
    /// [`Retrieval::expect_of`] took them (a line sent is never empty).
    pub(crate) fn line_of<'a>(&'a self, sub: &'a SubRequest) -> &'a Bytes {
        if sub.line.is_empty() {
            &self.bytes
        } else {
            &sub.line
        }
    }

    /// Whether `line` is the client's own bytes (one server asked for every
    /// key), not a line built by `next_chunk`.
    fn is_own(&self, line: &Bytes) -> bool {
        line.as_ptr() == self.bytes.as_ptr() && line.len() == self.bytes.len()
    }

    /// Where the keys of a classic sub-request's `line` begin: the framer
    /// looks for each `VALUE`'s key from there. Known here, so the line is
    /// not scanned again for its command and exptime (`Expect::values`).
    fn keys_from(&self, line: &Bytes) -> usize {
        // The client's own bytes (one server asked for every key), or a
        // line built by `next_chunk`: the command, the exptime, the keys.
        match self.keys.first() {
            Some(first) if self.is_own(line) => first.start as usize,
            _ => self.line_start_len(),
        }
    }

    /// Whether an `mn` goes behind the line sent: a quiet `mg`'s.
    pub(crate) fn quiet(&self) -> bool {
        self.meta.as_ref().is_some_and(|meta| meta.quiet)
    }

    /// For an `mg` once answered: the server's reply, or why there is none.
    /// `None` for a classic retrieval.
    pub(crate) fn meta_answer(&self) -> Option<Result<&Reply, &BackendError>> {
        let meta = self.meta.as_ref()?;
        match (&meta.reply, &self.first_error) {
            (Some(reply), _) => Some(Ok(reply)),
            (None, Some(error)) => Some(Err(error)),
            (None, None) => None,
        }
    }

    /// Once every key is settled: whether what came back held no value to
    /// size the next ones by (every key of a get missed or failed; an
    /// `mg … v` missed).
    pub(crate) fn brought_no_value(&self) -> bool {
        match &self.meta {
            None => true,
            Some(meta) => {
                meta.value
                    && meta
                        .reply
                        .as_ref()
                        .is_some_and(|reply| reply.outcome.meta_miss())
            }
        }
    }

    /// Makes this retrieval one run of a retrieval across pools.
    pub(crate) fn split(&mut self, split: Split) {
        self.split = split;
    }

    /// Some key of this retrieval may be read through (and copied), so later
    /// requests of the client wait until it has its answers.
    pub(crate) fn has_moved_keys(&self) -> bool {
        self.handoff && self.previous_from.iter().any(|&p| p != NOT_MOVED)
    }

    /// Key `k` is now being asked of a previous owner.
    fn asking_previous(&self, k: usize) -> bool {
        self.previous_at(k, self.round[k] as usize)
    }

    /// Key `k`'s candidate `at` is a previous owner (or, with zone
    /// write-back, another zone's replica to copy from).
    fn previous_at(&self, k: usize, at: usize) -> bool {
        self.previous_from
            .get(k)
            .is_some_and(|&from| at >= from as usize)
    }

    /// Key `k` is asked of all its other zones' replicas at once
    /// (`all_at_once`, past its local replica).
    #[inline]
    fn fanned(&self, k: usize) -> bool {
        self.all_at_once && self.round[k] > 0
    }

    /// A fanned key's answer from the replica of sub-request `sub` is to be
    /// taken: no other replica's hit came first. Records that replica as
    /// the one the key is on now (for the copy and the zone counters).
    fn take_fanned(&mut self, k: usize, sub: usize) -> bool {
        if !self.fanned(k) {
            return true;
        }
        if !matches!(self.state[k], KeyState::Asked { .. }) {
            return false;
        }
        let server = self.subs[sub].server;
        if let Some(at) = self.candidates[k].iter().position(|&s| s == server) {
            self.round[k] = at as u8;
        }
        true
    }

    /// One of a fanned key's replicas answered without a value (a miss or
    /// a failure): once none is left to answer and none had it, a miss.
    fn fanned_without_value(&mut self, k: usize) {
        if !matches!(self.state[k], KeyState::Asked { .. }) {
            return;
        }
        self.asks[k] = self.asks[k].saturating_sub(1);
        if self.asks[k] == 0 {
            self.state[k] = KeyState::Missed;
        }
    }

    /// With `all_at_once`: every key has its answer, though replicas asked
    /// at once may still be answering; the client is answered without them
    /// (their replies are dropped as they come, like a quorum write's slower
    /// replicas).
    pub(crate) fn settled(&self) -> bool {
        self.all_at_once
            && !self.has_unsent()
            && self
                .state
                .iter()
                .all(|s| matches!(s, KeyState::Found(_) | KeyState::Missed))
    }

    /// Copies key `k`'s value, found on the server being asked now, to its
    /// new owner.
    fn copy(&mut self, k: usize, wire: crate::protocol::encode::Outbound) {
        if !self.copies_allowed {
            return;
        }
        let key = self.bytes.slice_ref(self.keys[k].of(&self.bytes));
        self.copies.push(crate::plan::handoff::ReadCopy {
            owner: self.candidates[k][0],
            wire,
            source: self.candidates[k][self.round[k] as usize],
            key,
            base64: false,
            touch: self
                .exptime
                .map(|exptime| self.bytes.slice_ref(exptime.of(&self.bytes))),
        });
    }

    /// Copies of read-through hits to send to the keys' new owners.
    pub(crate) fn take_copies(&mut self) -> Vec<crate::plan::handoff::ReadCopy> {
        std::mem::take(&mut self.copies)
    }

    /// Keys asked of their previous owner, and hits there.
    pub(crate) fn read_through(&self) -> (usize, usize) {
        if self.handoff {
            self.read_through
        } else {
            (0, 0)
        }
    }

    /// With zones: hits served by the key's replica in this sidecar's
    /// zone (asked first), and hits served by another replica.
    pub(crate) fn zone_hits(&self) -> (usize, usize) {
        self.zone_hits
    }

    /// Counts key `k` found on the candidate it is on now.
    #[inline]
    fn count_zone_hit(&mut self, k: usize) {
        if let Some(&local) = self.first_local.get(k) {
            let local = local && self.round[k] == 0;
            if local {
                self.zone_hits.0 += 1;
            } else {
                self.zone_hits.1 += 1;
            }
            self.zone_served.push(ZoneHit {
                server: self.candidates[k][self.round[k] as usize] as u32,
                local,
                written_back: self.write_back && self.asking_previous(k),
            });
        }
    }

    /// With zones: each hit's replica (see [`ZoneHit`]).
    pub(crate) fn zone_served(&self) -> &[ZoneHit] {
        &self.zone_served
    }

    /// Hits found in another zone after the local replica missed or
    /// failed, each copied back to the local replica (`zone_write_back`).
    pub(crate) fn written_back(&self) -> usize {
        if self.write_back {
            self.read_through.1
        } else {
            0
        }
    }

    /// A retrieval whose keys are asked of `candidates[i]` in order.
    #[cfg(test)]
    pub(crate) fn with_candidates(
        request: &Request,
        bytes: Bytes,
        candidates: Vec<Servers>,
        fall_through_on_miss: bool,
    ) -> Retrieval {
        let mut retrieval = Retrieval::default();
        retrieval.reset(request, bytes, fall_through_on_miss);
        retrieval.candidates = candidates;
        retrieval
    }

    /// Starts over for `request`, with no candidates yet. The storage is new
    /// or was cleared when it was kept (`Reuse::keep`): clearing it again
    /// here cost a tenth of a pipelined get's planning.
    pub(super) fn reset(&mut self, request: &Request, bytes: Bytes, fall_through_on_miss: bool) {
        debug_assert!(
            self.bytes.is_empty()
                && self.keys.is_empty()
                && self.candidates.is_empty()
                && self.state.is_empty()
                && self.subs.is_empty()
                && self.copies.is_empty()
                && self.next_emit == 0,
            "a retrieval is reset only once cleared"
        );
        let keys = request.keys.len();
        self.command = request.command;
        self.exptime = request.arg;
        self.keys.extend_from_slice(&request.keys);
        self.bytes = bytes;
        self.fall_through_on_miss = fall_through_on_miss;
        // Pushed, not `resize`d: most retrievals have one key, and resize's
        // generic extend cost more than the rest of the reset.
        for _ in 0..keys {
            self.round.push(0);
            self.state.push(KeyState::Unsent);
        }
    }

    /// How many keys the per-key lists have room for.
    pub(super) fn room(&self) -> usize {
        self.keys
            .capacity()
            .max(self.candidates.capacity())
            .max(self.state.capacity())
    }

    /// Lets go of the request and its replies; the lists keep their
    /// capacity for the next retrieval planned here.
    pub(super) fn clear(&mut self) {
        self.bytes = Bytes::new();
        self.keys.clear();
        self.candidates.clear();
        self.hashes.clear();
        self.round.clear();
        self.state.clear();
        self.next_unsent = 0;
        self.retry.clear();
        // Looked at in place, then cleared: a `drain` cost its out-of-line
        // drop, about 30 instructions a get.
        for sub in &mut self.subs {
            if sub.keys.spilled() && self.spare_sub_keys.len() < MAX_SPARE_SUB_KEYS {
                let mut keys = std::mem::take(&mut sub.keys);
                keys.clear();
                self.spare_sub_keys.push(keys);
            }
        }
        self.subs.clear();
        self.next_emit = 0;
        self.values_written = 0;
        self.said = Outcome::End;
        self.answered = false;
        self.first_error = None;
        self.held = 0;
        self.largest_block = 0;
        self.handoff = false;
        self.previous_from.clear();
        self.copies.clear();
        self.copies_allowed = false;
        self.write_back = false;
        self.first_local.clear();
        self.zone_hits = (0, 0);
        self.all_at_once = false;
        self.asks.clear();
        self.zone_served.clear();
        self.read_through = (0, 0);
        self.split = Split::Whole;
        self.answers = None;
        self.meta = None;
    }

    /// Keeps each key's answer as it goes to the client, for
    /// [`Retrieval::take_answers`].
    pub(crate) fn record_answers(&mut self) {
        self.answers.get_or_insert_with(Vec::new);
    }

    /// The answers written since the last call: (key index, value block, or
    /// `None` for a miss). Empty unless [`Retrieval::record_answers`].
    pub(crate) fn take_answers(&mut self) -> Vec<(u32, Option<Bytes>)> {
        self.answers
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Key `i`'s xxh3 hash, when planning it took that hash.
    pub(crate) fn key_hash(&self, i: usize) -> Option<u64> {
        self.hashes.get(i).copied()
    }

    /// The one server this retrieval asks, when it is of one key that did
    /// not move and has no replica to fall back on.
    pub(crate) fn lone_owner(&self) -> Option<usize> {
        let [servers] = &self.candidates[..] else {
            return None;
        };
        let moved = self.handoff && self.previous_from.first() != Some(&NOT_MOVED);
        match &servers[..] {
            [server] if self.keys.len() == 1 && !moved => Some(*server),
            _ => None,
        }
    }

    /// The first server key `i` is asked of (its owner), if any.
    pub(crate) fn owner(&self, i: usize) -> Option<usize> {
        self.candidates.get(i)?.first().copied()
    }

    /// Keys are waiting to be sent (a first time, or to a next replica).
    pub(crate) fn has_unsent(&self) -> bool {
        !self.retry.is_empty() || self.next_unsent < self.keys.len()
    }

    /// Keys waiting to be sent.
    #[cfg(test)]
    pub(crate) fn unsent_keys(&self) -> usize {
        self.retry.len() + (self.keys.len() - self.next_unsent)
    }

    /// Value bytes held for keys not yet written.
    pub(crate) fn held_bytes(&self) -> usize {
        self.held
    }

    /// The largest value block received so far.
    pub(crate) fn largest_block(&self) -> usize {
        self.largest_block
    }

    /// [`Retrieval::next_chunk_into`] a new list.
    #[cfg(test)]
    pub(crate) fn next_chunk(&mut self, max_keys: usize, lines: &mut RecycledBuf) -> Chunk {
        let mut out = Chunk::new();
        self.next_chunk_into(max_keys, lines, &mut out);
        out
    }

    /// The sub-requests for up to `max_keys` of the keys waiting to be sent:
    /// retries first, then unsent keys in the client's order, grouped by
    /// server, each line under [`MAX_SUB_LINE_BYTES`]. Lines memring builds
    /// are written into `lines`, the caller's, which takes its allocation
    /// back once the lines sent before are dropped. They go into `out`
    /// (empty), the caller's, so that the list (a few hundred bytes) is not
    /// copied on its way back.
    pub(crate) fn next_chunk_into(
        &mut self,
        max_keys: usize,
        lines: &mut RecycledBuf,
        out: &mut Chunk,
    ) {
        debug_assert!(out.is_empty(), "a chunk is built into an empty list");
        if self.first_of_one_key(out) {
            return;
        }
        let max_keys = max_keys.max(1);
        // Each key picked with the candidate it is asked of; a fanned key
        // with every candidate it has left, all at once.
        let mut asks: SmallVec<[(u32, u8); 16]> = SmallVec::new();
        let mut picked = 0;
        while picked < max_keys {
            let key = if let Some(key) = self.retry.pop_front() {
                key
            } else if self.next_unsent < self.keys.len() {
                self.next_unsent += 1;
                self.next_unsent as u32 - 1
            } else {
                break;
            };
            picked += 1;
            let k = key as usize;
            let first = self.round[k];
            if self.fanned(k) {
                let end = self.candidates[k].len() as u8;
                self.asks[k] = end.saturating_sub(first);
                asks.extend((first..end).map(|c| (key, c)));
            } else {
                asks.push((key, first));
            }
        }
        // The whole request to one server, first time: forward the client's
        // own bytes (no copy).
        let whole = picked == self.keys.len() && self.subs.is_empty() && self.forwards_as_is();
        // Per server of this chunk: its sub-request, and its line's length.
        let mut open: SmallVec<[(usize, u32, usize); 4]> = SmallVec::new();
        for (n, &(key, c)) in asks.iter().enumerate() {
            let k = key as usize;
            let Some(&server) = self.candidates[k].get(c as usize) else {
                // No server left to ask.
                self.state[k] = KeyState::Missed;
                continue;
            };
            let name = self.keys[k].of(&self.bytes);
            if self.previous_at(k, c as usize) {
                self.read_through.0 += 1;
                if self.exptime.is_none() {
                    // A get of a moved key asks its previous owner with a
                    // meta get, which tells the remaining TTL for the copy.
                    // (`gat`/`gats` set the expiry themselves.)
                    let id = self.subs.len() as u32;
                    self.subs.push(Sub {
                        keys: smallvec::smallvec![key],
                        cursor: 0,
                        error_line: None,
                        read: None,
                        meta: true,
                        server,
                    });
                    self.state[k] = KeyState::Asked { sub: id };
                    let with_cas = self.command == Command::Gets;
                    out.push(SubRequest {
                        id,
                        server,
                        line: crate::plan::handoff::fetch_line(name, false, with_cas),
                        meta: true,
                        keys: 1,
                    });
                    continue;
                }
            }
            let at = open.iter().position(|&(s, id, len)| {
                s == server
                    && (whole || len + name.len() + 3 <= MAX_SUB_LINE_BYTES)
                    && self.subs[id as usize].keys.len() < MAX_CHUNK_KEYS.max(max_keys)
            });
            let at = match at {
                Some(at) => at,
                None => {
                    let id = self.subs.len() as u32;
                    let keys = self.spare_sub_keys.pop().unwrap_or_default();
                    self.subs.push(Sub {
                        keys,
                        cursor: 0,
                        error_line: None,
                        read: None,
                        meta: false,
                        server,
                    });
                    open.push((server, id, self.line_start_len()));
                    open.len() - 1
                }
            };
            let (_, id, len) = &mut open[at];
            *len += 1 + name.len();
            let keys = &mut self.subs[*id as usize].keys;
            if keys.len() == keys.inline_size() {
                // Grown once, to what this chunk can still give it.
                keys.reserve_exact(asks.len() - n);
            }
            keys.push(key);
            self.state[k] = KeyState::Asked { sub: *id };
        }
        // A whole request to one server goes as the client's bytes; lines
        // are built only for one that goes to several.
        let single = open.len() == 1 && out.is_empty();
        for (server, id, len) in open {
            let line = if whole && single {
                self.bytes.clone()
            } else {
                lines.make_room(len + 2);
                self.write_line_start(lines);
                for &key in &self.subs[id as usize].keys {
                    lines.put_u8(b' ');
                    lines.put_slice(self.keys[key as usize].of(&self.bytes));
                }
                lines.put_slice(b"\r\n");
                lines.split().freeze()
            };
            out.push(SubRequest {
                id,
                server,
                line,
                meta: false,
                keys: self.subs[id as usize].keys.len(),
            });
        }
    }

    /// The first send of a one-key retrieval to its owner (most requests):
    /// the client's own bytes to one server, without the grouping of
    /// [`Retrieval::next_chunk_into`], whose code is most of what a one-key get
    /// would otherwise run, into `out`. False when the general path is
    /// needed (more keys, a retry, a moved key's previous owner, a line to
    /// rebuild).
    fn first_of_one_key(&mut self, out: &mut Chunk) -> bool {
        let plain = self.keys.len() == 1
            && self.next_unsent == 0
            && self.subs.is_empty()
            && self.retry.is_empty()
            && !self.asking_previous(0)
            && (self.meta.is_some() || self.forwards_as_is());
        if !plain {
            return false;
        }
        self.next_unsent = 1;
        let Some(&server) = self.candidates[0].get(self.round[0] as usize) else {
            self.state[0] = KeyState::Missed;
            return true;
        };
        self.subs.push(Sub {
            keys: smallvec::smallvec![0],
            cursor: 0,
            error_line: None,
            read: None,
            meta: false,
            server,
        });
        self.state[0] = KeyState::Asked { sub: 0 };
        out.push(SubRequest {
            id: 0,
            server,
            line: self.bytes.clone(),
            meta: false,
            keys: 1,
        });
        true
    }

    /// The client's bytes can go to a server as they are, when all of
    /// them go to one: a line short enough, ending in `\r\n`.
    fn forwards_as_is(&self) -> bool {
        self.bytes.len() <= MAX_SUB_LINE_BYTES && self.bytes.ends_with(b"\r\n")
    }

    /// Writes a sub-request line up to its first key: the command, and the
    /// exptime of `gat`/`gats`.
    fn write_line_start(&self, line: &mut BytesMut) {
        line.put_slice(self.command.name().as_bytes());
        if let Some(exptime) = self.exptime {
            line.put_u8(b' ');
            line.put_slice(exptime.of(&self.bytes));
        }
    }

    /// The length of what [`Retrieval::write_line_start`] writes.
    fn line_start_len(&self) -> usize {
        let exptime = self.exptime.map_or(0, |e| 1 + e.of(&self.bytes).len());
        self.command.name().len() + exptime
    }

    /// A piece of sub-request `sub`'s reply arrived (a one-line reply is
    /// read in [`Retrieval::on_done`], with what it says).
    pub(crate) fn on_piece(&mut self, sub: u32, got: Got) {
        let Some(entry) = self.subs.get_mut(sub as usize) else {
            return;
        };
        match got {
            // Read in `on_done`, once what it says is known.
            Got::Line(reply) => {
                entry.read = Some(reply);
                return;
            }
            // A quiet `mg`'s one reply, framed before its `MN`.
            Got::Value(reply) if self.meta.is_some() => {
                entry.read = Some(reply);
                return;
            }
            Got::Value(_) => {}
        }
        if entry.meta {
            return;
        }
        match got {
            Got::Value(block) => {
                self.answered = true;
                let name = value_key(&block);
                // The connection checked that the key was asked for, in
                // order; keys skipped on the way are misses in this reply.
                let (at, mut found) = (sub as usize, None);
                while let Some(&key) = self.subs[at].keys.get(self.subs[at].cursor) {
                    let k = key as usize;
                    self.subs[at].cursor += 1;
                    if self.keys[k].of(&self.bytes) == name {
                        found = Some(k);
                        break;
                    }
                    self.missed(k);
                }
                if let Some(k) = found {
                    if !self.take_fanned(k, sub as usize) {
                        // Another zone's replica had it first.
                        return;
                    }
                    if self.asking_previous(k) {
                        // Found on the previous owner: copy it to the new
                        // one with an add (`ms … ME`), so a newer value
                        // written there meanwhile is never overwritten. Only `gat`/`gats`
                        // read through with a classic request (`get`/`gets`
                        // use `mg`, see `on_read_through`): the copy takes
                        // their new expiry.
                        self.read_through.1 += 1;
                        let exptime = self.exptime.map_or(&b"0"[..], |e| e.of(&self.bytes));
                        if let Some(wire) = crate::plan::handoff::copy_block(&block, exptime) {
                            self.copy(k, wire);
                        }
                    }
                    self.count_zone_hit(k);
                    self.largest_block = self.largest_block.max(block.len());
                    self.held += block.len();
                    self.state[k] = KeyState::Found(block);
                }
            }
            Got::Line(_) => {}
        }
    }

    /// The previous owner's reply to a read-through `mg` (sub-request `sub`).
    fn on_read_through(&mut self, sub: u32, reply: &Reply, now: impl FnOnce() -> u64) {
        let entry = &mut self.subs[sub as usize];
        let k = entry.keys[0] as usize;
        if reply.outcome == Outcome::En {
            // A miss: `on_done` settles the key.
            return;
        }
        if !self.take_fanned(k, sub as usize) {
            // Another zone's replica had it first.
            return;
        }
        let entry = &mut self.subs[sub as usize];
        let name = self.keys[k].of(&self.bytes);
        let with_cas = self.command == Command::Gets;
        let Some(hit) = crate::plan::handoff::read_through_hit(name, reply, with_cas, now()) else {
            // An error line (or a reply memring cannot use): as a failure.
            entry.error_line = Some(reply.clone());
            return;
        };
        entry.cursor = 1;
        self.answered = true;
        self.read_through.1 += 1;
        // Copied to the new owner with an add (`ms … ME`), so a newer value
        // written there meanwhile is never overwritten, and with the
        // remaining TTL.
        if let Some(exptime) = &hit.exptime {
            if let Some(wire) = crate::plan::handoff::copy_block(&hit.block, exptime) {
                self.copy(k, wire);
            }
        }
        self.count_zone_hit(k);
        self.largest_block = self.largest_block.max(hit.block.len());
        self.held += hit.block.len();
        self.state[k] = KeyState::Found(hit.block);
    }

    /// Sub-request `sub` is complete (`Ok`, saying what it says) or
    /// failed. `now` gives the Unix time a read-through copy's remaining TTL
    /// is counted from; it is asked only for such a copy, so a plain get
    /// reads no clock.
    pub(crate) fn on_done(
        &mut self,
        sub: u32,
        result: Result<Outcome, BackendError>,
        now: impl FnOnce() -> u64,
    ) {
        if self.meta.is_some() {
            self.meta_done(sub, result);
            return;
        }
        let Some(entry) = self.subs.get_mut(sub as usize) else {
            return;
        };
        if let (Some(line), Ok(said)) = (entry.read.take(), &result) {
            let reply = Reply::new(*said, line);
            if entry.meta {
                self.on_read_through(sub, &reply, now);
            } else {
                entry.error_line = Some(reply);
            }
        }
        let entry = &mut self.subs[sub as usize];
        let failed = match result {
            Ok(_) if entry.error_line.is_none() => {
                self.answered = true;
                false
            }
            Ok(_) => true,
            Err(error) => {
                self.first_error.get_or_insert(error);
                true
            }
        };
        let rest: SmallVec<[u32; 8]> = entry.keys[entry.cursor..].iter().copied().collect();
        entry.cursor = entry.keys.len();
        for key in rest {
            let k = key as usize;
            if failed {
                self.fall_through(k);
            } else {
                self.missed(k);
            }
        }
    }

    /// An `mg`'s one sub-request is complete: its reply (or failure) is
    /// the answer, and its key is settled (a retrieval's `VALUE` blocks do
    /// not carry it). No other server is asked: an `mg` planned as a
    /// retrieval has one.
    fn meta_done(&mut self, sub: u32, result: Result<Outcome, BackendError>) {
        let Some(entry) = self.subs.get_mut(sub as usize) else {
            return;
        };
        let line = entry.read.take();
        entry.cursor = entry.keys.len();
        let Some(meta) = &mut self.meta else {
            return;
        };
        match result {
            Ok(said) => {
                // A quiet request's miss: nothing before its `MN`.
                let reply = Reply::new(said, line.unwrap_or_default());
                if meta.value && said == Outcome::Va {
                    self.largest_block = self.largest_block.max(reply.len());
                }
                // Held until written, as a value waiting for earlier keys.
                self.held += reply.len();
                self.answered = true;
                meta.reply = Some(reply);
            }
            Err(error) => {
                self.first_error.get_or_insert(error);
            }
        }
        self.state[0] = KeyState::Missed;
    }

    /// A key the server answered without a value.
    fn missed(&mut self, k: usize) {
        if self.fanned(k) {
            self.fanned_without_value(k);
        } else if self.fall_through_on_miss {
            self.fall_through(k);
        } else {
            self.state[k] = KeyState::Missed;
        }
    }

    /// Asks the key's next replica, if there is one.
    fn fall_through(&mut self, k: usize) {
        if self.fanned(k) {
            self.fanned_without_value(k);
            return;
        }
        let next = self.round[k] as usize + 1;
        if next < self.candidates[k].len() {
            self.round[k] = next as u8;
            self.state[k] = KeyState::Unsent;
            self.retry.push_back(k as u32);
        } else {
            self.state[k] = KeyState::Missed;
        }
    }
}

/// The key of a `VALUE <key> ...` block.
fn value_key(block: &[u8]) -> &[u8] {
    let rest = block.get(6..).unwrap_or(&[]);
    let end = memchr::memchr(b' ', rest).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{parse_request, Limits};

    /// The framer's cursor set from what the retrieval knows is where
    /// `Expect::values`, scanning the line, would put it (or further on,
    /// before the first key), for lines sent as they came and lines built.
    #[test]
    fn a_sub_requests_expectation_finds_the_keys_the_line_asks_for() {
        let cases: [(&'static [u8], &[&[usize]]); 6] = [
            (b"get a\r\n", &[&[0]]),
            (b"gets  a\r\n", &[&[0]]),
            (b"gat 10 a\r\n", &[&[0]]),
            (b"gats  10  a b\r\n", &[&[0], &[0]]),
            (b"get a b c\r\n", &[&[0], &[1], &[0]]),
            (b"gats 10 a b c\r\n", &[&[1], &[0], &[1]]),
        ];
        for (line, owners) in cases {
            let bytes = Bytes::from_static(line);
            let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
            let candidates = owners.iter().map(|o| o.iter().copied().collect()).collect();
            let mut r = Retrieval::with_candidates(&request, bytes, candidates, false);
            for mut sub in r.next_chunk(100, &mut RecycledBuf::new(64)) {
                let Expect::Values {
                    request,
                    cursor,
                    with_cas,
                } = r.expect_of(&mut sub)
                else {
                    panic!("a classic retrieval expects values");
                };
                assert_eq!(&request, r.line_of(&sub), "{line:?}: the line sent");
                sub.line = request.clone();
                let Expect::Values {
                    cursor: scanned,
                    with_cas: scanned_cas,
                    ..
                } = Expect::values(sub.line.clone())
                else {
                    unreachable!()
                };
                assert_eq!(request, sub.line);
                assert_eq!(with_cas, scanned_cas, "{line:?}");
                let first_key = memchr::memmem::find(&sub.line[scanned..], b"a")
                    .or_else(|| memchr::memmem::find(&sub.line[scanned..], b"b"))
                    .map(|at| scanned + at)
                    .unwrap();
                assert!(
                    (scanned..=first_key).contains(&cursor),
                    "{line:?}: {cursor} not in {scanned}..={first_key}"
                );
            }
        }
    }
}
