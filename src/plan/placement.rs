//! Where one key's request goes on the ring, for both dialects: the owner,
//! the replicas, and in a hand-off window the previous owner and the older
//! rings' owners a write must delete the key from.
//!
//! [`place`] is the one decision classic and meta requests share: each
//! dialect describes its request as a [`KeyOp`] and turns the [`Placement`]
//! into its own plan (`route::plan`, `route::plan_meta`), which adds only
//! what the dialect spells differently. Pure: no I/O, no clock, and no live
//! health: what it knows of health is a [`HealthView`] taken once per turn.

use std::cell::Cell;
use std::rc::Rc;

use prometheus_client::metrics::counter::Counter;

use crate::config::ReadBalanceMode;
use crate::pools::topology::{OlderOwners, Topology};
use smallvec::SmallVec;

/// Server indexes (into `Topology::backends`).
pub(crate) type Servers = SmallVec<[usize; 4]>;

/// Replies needed to answer a replicated write: a majority.
pub(crate) fn quorum(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// Whether a key is hot: the worker's hot-key detector, as the planner
/// asks it (`hotkeys::HotWorker`). A hot key's reads are spread over its
/// replicas (see [`order_read`]).
pub(crate) trait HotKeys {
    /// Whether some key is hot now (nothing to ask otherwise).
    fn any_hot(&self) -> bool;
    /// Whether the key whose ring hash is `hash` is hot.
    fn is_hot(&self, hash: u64) -> bool;
}

/// What the planner goes by of the servers' live state: which servers
/// (indexes into `Topology::backends`) were DEAD when the view was taken,
/// and, where reads are balanced, each server's load on this worker. The
/// session takes one per turn and per topology (`session/health.rs`); only
/// replicated reads consult it (healthy replicas are asked first, the
/// least loaded of them first where reads are balanced), so without
/// replicas it is empty and costs nothing.
#[derive(Debug, Default)]
pub(crate) struct HealthView {
    /// One bit per server.
    dead: Vec<u64>,
    /// What reads are balanced by, kept between views for its storage.
    balancing: Option<Box<Balancing>>,
    /// Whether `balancing` holds this view's loads: reads are balanced.
    balanced: bool,
}

/// The loads a [`HealthView`] balances reads by.
struct Balancing {
    /// Per server: requests in flight to it from this worker when the view
    /// was taken, plus the reads this view placed on it since.
    loads: Vec<Cell<u32>>,
    /// The worker's hot keys, whose reads are spread; `None`: none is.
    hot: Option<Rc<dyn HotKeys>>,
    /// Where the next hot key's read starts among its replicas: hot keys'
    /// reads go round them even when none is loaded.
    next_hot: Cell<usize>,
    /// Counts reads placed off their first-choice replica by balancing
    /// (`read_balance_moved`).
    moved: Counter,
}

impl std::fmt::Debug for Balancing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancing")
            .field("loads", &self.loads)
            .field("hot", &self.hot.is_some())
            .finish_non_exhaustive()
    }
}

impl HealthView {
    /// Knows of no DEAD server, and balances nothing.
    pub(crate) const NONE: HealthView = HealthView {
        dead: Vec::new(),
        balancing: None,
        balanced: false,
    };

    /// A view with `dead` DEAD, reusing this one's storage; it balances
    /// nothing until [`HealthView::balance`].
    pub(crate) fn refill(&mut self, dead: impl IntoIterator<Item = usize>) {
        self.dead.clear();
        for server in dead {
            let (word, bit) = (server / 64, server % 64);
            if self.dead.len() <= word {
                self.dead.resize(word + 1, 0);
            }
            self.dead[word] |= 1 << bit;
        }
        self.balanced = false;
        if let Some(balancing) = &mut self.balancing {
            // The hot keys' worker is not kept alive by an old view.
            balancing.hot = None;
        }
    }

    /// Reads placed by this view are balanced: `loads` gives each server's
    /// requests in flight now, `hot` the hot keys, and `moved` counts the
    /// reads sent off their first-choice replica.
    pub(crate) fn balance(
        &mut self,
        loads: impl IntoIterator<Item = u32>,
        hot: Option<Rc<dyn HotKeys>>,
        moved: Counter,
    ) {
        let balancing = self.balancing.get_or_insert_with(|| {
            Box::new(Balancing {
                loads: Vec::new(),
                hot: None,
                next_hot: Cell::new(0),
                moved: moved.clone(),
            })
        });
        balancing.loads.clear();
        balancing.loads.extend(loads.into_iter().map(Cell::new));
        balancing.hot = hot;
        balancing.moved = moved;
        self.balanced = true;
    }

    /// Whether `server` was DEAD when the view was taken.
    pub(crate) fn is_dead(&self, server: usize) -> bool {
        self.dead
            .get(server / 64)
            .is_some_and(|word| word & (1 << (server % 64)) != 0)
    }

    /// What this view balances reads by, if it does.
    fn balancing(&self) -> Option<&Balancing> {
        self.balancing.as_deref().filter(|_| self.balanced)
    }

    /// How a read of `key` is balanced in `topology`: `None` when it goes
    /// in preference order (`read_balance = "local"` and the key not hot,
    /// or no loads known).
    fn read_balance(&self, key: &[u8], topology: &Topology) -> Option<Balance<'_>> {
        let balancing = self.balancing()?;
        let hot = balancing
            .hot
            .as_ref()
            .is_some_and(|hot| hot.any_hot() && hot.is_hot(crate::ring::key_hash(key)));
        let balance = topology.config.read_balance;
        let local = balance.mode == ReadBalanceMode::Local;
        if !hot && local {
            return None;
        }
        // With `"local"` and a zone to read in, a hot key's reads are spread
        // over the local zone's replicas only: other zones' reads cost
        // money, and the near cache and coalescing take a hot key's load
        // off its server. Elsewhere they take turns round the replicas.
        let within_local = local && topology.reads_local_first();
        let start = if hot && !within_local {
            let start = balancing.next_hot.get();
            balancing.next_hot.set(start.wrapping_add(1));
            start
        } else {
            0
        };
        Some(Balance {
            load: balancing,
            epsilon: balance.epsilon,
            start,
            within_local,
        })
    }

    /// Counts a read placed off its first-choice replica.
    fn moved(&self) {
        if let Some(balancing) = self.balancing() {
            balancing.moved.inc();
        }
    }
}

/// How [`order_read`] balances a read by load.
pub(crate) struct Balance<'a> {
    /// Each server's load (requests in flight on this worker).
    pub(crate) load: &'a dyn Load,
    /// `read_balance_epsilon`.
    pub(crate) epsilon: f64,
    /// Where among the live replicas the walk starts (modulo their
    /// number): 0, the first choice, except for hot keys.
    pub(crate) start: usize,
    /// Only the live replicas in this sidecar's zone are balanced over
    /// (`read_balance = "local"` with a sidecar zone); all live ones when
    /// none is local.
    pub(crate) within_local: bool,
}

/// Servers' loads, as [`order_read`] reads and moves them.
pub(crate) trait Load {
    fn load(&self, server: usize) -> u32;
    /// A read was placed on `server`.
    fn took(&self, server: usize);
}

impl Load for Balancing {
    fn load(&self, server: usize) -> u32 {
        self.loads.get(server).map_or(0, Cell::get)
    }

    fn took(&self, server: usize) {
        if let Some(load) = self.loads.get(server) {
            load.set(load.get().saturating_add(1));
        }
    }
}

/// Orders a read's replicas `servers` (backend indexes, in ring order):
/// the live ones before the DEAD ones; among each, those in this sidecar's
/// zone (`local`) first, the others after them in ring order. That is the
/// preference order. With `balance`, the first replica asked is then the
/// first live one, walking the preference order from `balance.start`
/// (wrapping round), whose load with this read stays within the bound
///
/// `load + 1 <= ceil((1 + epsilon) * (L + 1) / n)`
///
/// where `L` is the sum of the loads of the key's `n` live replicas: the
/// rule of consistent hashing with bounded loads, applied among a key's
/// replicas. One always has room (the bound times `n` exceeds `L`). It
/// goes to the front; the others keep their order behind it. Returns
/// whether balancing moved the read off the first choice of the
/// preference order.
pub(crate) fn order_read(
    servers: &mut [usize],
    local: impl Fn(usize) -> bool,
    dead: impl Fn(usize) -> bool,
    balance: Option<Balance<'_>>,
) -> bool {
    // One stable sort: ring order within each group.
    servers.sort_by_key(|&s| (dead(s), !local(s)));
    let Some(balance) = balance else {
        return false;
    };
    // The live replicas balanced over: sorted first, so a prefix. The
    // local ones are counted only when balancing keeps to them.
    let local_live = || {
        servers
            .iter()
            .take_while(|&&s| !dead(s) && local(s))
            .count()
    };
    let live = match balance.within_local.then(local_live) {
        Some(local_live) if local_live > 0 => local_live,
        _ => servers.iter().take_while(|&&s| !dead(s)).count(),
    };
    if live == 0 {
        return false;
    }
    let chosen = if live == 1 {
        0
    } else {
        let total: u64 = servers[..live]
            .iter()
            .map(|&s| u64::from(balance.load.load(s)))
            .sum();
        // A hair under, so that a bound that is a whole number in exact
        // arithmetic is not rounded up past it.
        let bound = ((1.0 + balance.epsilon) * (total + 1) as f64 / live as f64 - 1e-9).ceil();
        let bound = (bound as u64).max(1);
        let start = balance.start % live;
        (0..live)
            .map(|i| (start + i) % live)
            .find(|&i| u64::from(balance.load.load(servers[i])) < bound)
            .unwrap_or(start)
    };
    balance.load.took(servers[chosen]);
    servers[..=chosen].rotate_right(1);
    chosen != 0
}

/// What the placement needs to know of a request on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyOp {
    pub(crate) kind: KeyKind,
    /// Only the owner may answer it, even with replicas: a recache lease or
    /// `me` (exactly one client wins), or a request memcached will refuse.
    pub(crate) owner_only: bool,
    /// The hand-off applies: moved keys are read through, copied and
    /// forgotten (not for a request memcached will refuse anyway).
    pub(crate) hands_off: bool,
    /// A delete (`delete`, `md` without `C`): with replicas, the previous
    /// ring's former replicas lose the key before the current ones.
    pub(crate) removes: bool,
    /// Sent as it is to a server that may lack the owner's item, it leaves
    /// that server with the owner's value or without the key (`set`,
    /// `delete`, `touch`, `ms` in set mode, `md`): a warming server gets the
    /// request itself. Any other write (`cas`, `add`, `replace`, `append`,
    /// `prepend`, `incr`, `decr`, `ma`, a mode of `ms`) would leave it a
    /// value the owner does not have, so the warming server loses the key
    /// instead (see [`place`]).
    pub(crate) repeatable: bool,
}

/// The part of a request the replicas care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// Reads the key (meta `mg`): with replicas, asked of one after another.
    Read,
    /// Changes the key: with replicas, a quorum write; in a hand-off window
    /// the older rings' owners delete the key.
    Write,
    /// A compare-and-swap (classic `cas`, meta `C`), decided on the owner
    /// and copied to the other replicas. `retry_elsewhere`: in a hand-off
    /// window it may be tried on the previous owner, whose cas the client
    /// may hold (only a store of the whole value can be: an append or `ma`
    /// needs the item on the new owner).
    Cas { retry_elsewhere: bool },
}

impl KeyOp {
    /// A classic retrieval's key (`get`, `gets`, `gat`, `gats`).
    pub(crate) const READ: KeyOp = KeyOp {
        kind: KeyKind::Read,
        owner_only: false,
        hands_off: true,
        removes: false,
        repeatable: false,
    };

    /// A classic command on one key that is not a retrieval: every one
    /// changes the key; `removes` for a `delete`. Not `repeatable`: see
    /// [`KeyOp::repeated`].
    pub(crate) fn classic(cas: bool, removes: bool) -> KeyOp {
        KeyOp {
            kind: if cas {
                KeyKind::Cas {
                    retry_elsewhere: true,
                }
            } else {
                KeyKind::Write
            },
            owner_only: false,
            hands_off: true,
            removes,
            repeatable: false,
        }
    }

    /// The same, `repeatable` when `repeatable` (see the field).
    pub(crate) fn repeated(self, repeatable: bool) -> KeyOp {
        KeyOp { repeatable, ..self }
    }
}

/// A write every server of `servers` gets, answered when `quorum` agree.
/// The last `forget` are replicas of the previous ring only (or warming
/// servers, for a write that is not `repeatable`): they get a delete of the
/// key instead, awaited before the answer; with `forget_last`, only once the
/// others answered. The `warm` before them are warming servers: they get
/// the request itself, awaited before the answer, and their replies are not
/// counted. `older`: the owners in older rings of chained changes, deleted
/// first (see [`OlderOwners`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct QuorumWrite {
    pub(crate) servers: Servers,
    pub(crate) quorum: usize,
    pub(crate) forget: usize,
    pub(crate) warm: usize,
    pub(crate) older: Option<Box<OlderOwners>>,
    pub(crate) forget_last: bool,
}

impl QuorumWrite {
    /// Whether an `add` so placed is the replicated add's machine (asked
    /// of one replica, then copied to the others as it answered): it goes
    /// to more than one replica, and no former owner loses the key.
    pub(crate) fn is_replicated_add(&self) -> bool {
        self.servers.len() > 1 && self.forget == 0 && self.older.is_none()
    }

    /// The servers that are the key's replicas now: neither a former
    /// replica losing the key nor a warming server.
    pub(crate) fn replicas(&self) -> &[usize] {
        &self.servers[..self.servers.len() - self.forget - self.warm]
    }
}

/// Where a request on one key goes. `M`: what the dialect's hand-off
/// machine needs to run a moved key's request (see [`place`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Placement<M> {
    /// No server to send it to.
    NoServers,
    /// The owner alone. `hash`: the key's xxh3 hash when the ring placed it
    /// by that, for hot-key counting.
    Owner { server: usize, hash: Option<u64> },
    /// A write to the key's replicas by quorum: see [`QuorumWrite`].
    Quorum(QuorumWrite),
    /// A compare-and-swap decided on `owner`, then copied to `copies`; in a
    /// window, tried on `previous` after the owner refused it; the key is
    /// deleted from the `older` owners first.
    CasThenCopy {
        owner: usize,
        copies: Servers,
        previous: Option<usize>,
        older: Option<Box<OlderOwners>>,
    },
    /// Replicas asked in order, the next after a failure (or a miss, with
    /// `on_miss`). The first `current` are replicas now, the rest only in
    /// the previous ring of a window.
    ReadThrough {
        servers: Servers,
        current: usize,
        on_miss: bool,
    },
    /// A moved key in a window: the hand-off machine runs the request on
    /// `owner` and `previous` by `steps`, once the `older` owners have
    /// lost the key. `hash` as for `Owner`. `copies_back`: a sidecar still
    /// on an older ring may be copying the key from `owner` to `previous`
    /// (see `Topology::copies_back`).
    Moved {
        owner: usize,
        previous: usize,
        steps: M,
        older: Option<Box<OlderOwners>>,
        hash: Option<u64>,
        copies_back: bool,
    },
}

impl<M> Placement<M> {
    /// The server that owns the key (the first asked), and the key's hash
    /// when the ring placed it by the hash hot keys count with; `None`
    /// without servers.
    pub(crate) fn owner(&self) -> Option<(usize, Option<u64>)> {
        match self {
            Placement::NoServers => None,
            Placement::Owner { server, hash } => Some((*server, *hash)),
            Placement::Moved { owner, hash, .. } => Some((*owner, *hash)),
            Placement::CasThenCopy { owner, .. } => Some((*owner, None)),
            Placement::Quorum(QuorumWrite { servers, .. })
            | Placement::ReadThrough { servers, .. } => servers.first().map(|&s| (s, None)),
        }
    }
}

/// Places a request described by `op` on `key` (its routing key: a meta `b`
/// key decoded) in `topology`, whose servers' health is `health`, on the
/// rings in force (the warming servers aside). `steps`:
/// how the hand-off machine runs it on a moved key, `None` when the new
/// owner alone answers it.
fn place_on_ring<M>(
    key: &[u8],
    op: KeyOp,
    steps: Option<M>,
    topology: &Topology,
    health: &HealthView,
) -> Placement<M> {
    let replicas = topology.config.replicas.max(1);
    if replicas == 1 || op.owner_only {
        let (owner, hash) = topology.owner_index_hashed(key);
        let Some(owner) = owner else {
            return Placement::NoServers;
        };
        // A hand-off window (one replica): a moved key may still be only on
        // its previous owner. Beside other writers a read never asks there
        // (`shared_with`): their writes reach only the new owner.
        let shared_with = topology.config.shared_with;
        let handed_off = op.hands_off
            && replicas == 1
            && (op.kind != KeyKind::Read || shared_with.reads_through());
        let older = (handed_off && op.kind != KeyKind::Read)
            .then(|| topology.older_owners(key, &[owner]))
            .flatten();
        let previous = handed_off
            .then(|| topology.previous_owner(key, owner))
            .flatten();
        return match (previous, steps) {
            (Some(previous), Some(steps)) => Placement::Moved {
                owner,
                previous,
                steps,
                older,
                hash,
                copies_back: topology.copies_back(key, &[owner]),
            },
            // Not moved since the previous ring, but owned elsewhere in an
            // older one: deleted there first.
            _ if older.is_some() => Placement::Quorum(QuorumWrite {
                servers: smallvec::smallvec![owner],
                quorum: 1,
                forget: 0,
                warm: 0,
                older,
                forget_last: false,
            }),
            _ => Placement::Owner {
                server: owner,
                hash,
            },
        };
    }
    let mut servers = Servers::new();
    topology.replicas(key, &mut servers);
    let Some(&owner) = servers.first() else {
        return Placement::NoServers;
    };
    match op.kind {
        KeyKind::Read => {
            // With zones, the local zone's replica first, then the other
            // zones' in ring order; healthy replicas before DEAD ones; and
            // where reads are balanced, the first asked by load.
            let moved = order_read(
                &mut servers,
                |s| topology.is_local(s),
                |s| health.is_dead(s),
                health.read_balance(key, topology),
            );
            if moved {
                health.moved();
            }
            // In a window the previous ring's replicas come after the
            // current ones, and a miss falls through to them (unless other
            // writers share the servers).
            let current = servers.len();
            if topology.config.shared_with.reads_through() {
                topology.push_previous_only_replicas(key, &mut servers);
            }
            Placement::ReadThrough {
                servers,
                current,
                // A miss on the local zone's replica asks the other zones'.
                on_miss: topology.config.read_miss_fallthrough
                    || topology.previous.is_some()
                    || topology.reads_local_first(),
            }
        }
        KeyKind::Cas { retry_elsewhere } => {
            let (previous, older) = cas_handoff(key, owner, &mut servers, topology);
            Placement::CasThenCopy {
                owner,
                copies: servers[1..].iter().copied().collect(),
                // Tried there only where its value may then be copied.
                previous: previous
                    .filter(|_| retry_elsewhere && topology.config.shared_with.copies()),
                older,
            }
        }
        KeyKind::Write => {
            let quorum = quorum(servers.len());
            let current = servers.len();
            let mut forget = topology.push_previous_only_replicas(key, &mut servers);
            let mut older = topology.older_owners(key, &servers[..current]);
            // A sidecar still on an older ring may copy the key from a
            // current replica to a former one (a change undone): then the
            // former replicas lose it only once the current ones answered.
            let forget_last = forget > 0 && topology.copies_back(key, &servers[..current]);
            if op.removes && forget > 0 {
                // A delete reaches the former replicas before the current
                // ones: a read-through copy from a former replica to a
                // current one (another sidecar's) then either had its lease
                // removed by the delete or finds its source gone. Both at
                // once, the lease could land after the current replica's
                // delete and still find the value at its source.
                older = Some(OlderOwners::then(older, &servers[current..]));
                if !forget_last {
                    servers.truncate(current);
                    forget = 0;
                }
            }
            Placement::Quorum(QuorumWrite {
                older,
                servers,
                quorum,
                forget,
                warm: 0,
                forget_last,
            })
        }
    }
}

/// Places a request described by `op` on `key` as [`place_on_ring`] does,
/// and gives a write the warming servers that would hold `key` had they
/// joined (`Topology::warming_replicas`), so that they hold every value
/// written while they warm and serve it once they join; reads never go
/// there.
///
/// A `repeatable` write goes to them as it is (`warm` parts of a
/// [`Placement::Quorum`]); any other write deletes the key on them (its
/// `forget` parts), since repeating it there could leave a value the owner
/// does not have (an `incr` of an older count, an `add` the owner refused).
/// Either is awaited before the client's answer, which stays the owner's
/// (or the replicas' quorum's): once a server stops warming, no read finds
/// there a value older than an acknowledged write. A write planned as a
/// cas decided on the owner or as a moved key's hand-off steps deletes the
/// key on them first, as owners in older rings lose it. A miss there later
/// is read through from the previous owner in the hand-off window its
/// joining opens.
pub(crate) fn place<M>(
    key: &[u8],
    op: KeyOp,
    steps: Option<M>,
    topology: &Topology,
    health: &HealthView,
) -> Placement<M> {
    let placed = place_on_ring(key, op, steps, topology, health);
    if op.kind == KeyKind::Read || !topology.has_warming() {
        return placed;
    }
    let mut warming = Servers::new();
    topology.warming_replicas(key, &mut warming);
    if warming.is_empty() {
        return placed;
    }
    let repeats = op.repeatable && op.kind == KeyKind::Write && !op.owner_only;
    // Only a warming server gets the write itself; the owners a staged
    // change gives the key (`ServerConfig::staged_in`, `staged_out`) lose
    // it instead: a sidecar that has not staged the change writes only to
    // the owner now, so a value there could turn older than its write.
    let warms = |w: &usize| repeats && topology.is_warming(*w);
    warming.sort_by_key(|w| !warms(w));
    let warmed = warming.iter().filter(|w| warms(w)).count();
    match placed {
        Placement::NoServers => Placement::NoServers,
        Placement::Owner { server, .. } => {
            let mut servers: Servers = smallvec::smallvec![server];
            servers.extend(warming.iter().copied());
            let n = warming.len();
            Placement::Quorum(QuorumWrite {
                servers,
                quorum: 1,
                forget: n - warmed,
                warm: warmed,
                older: None,
                forget_last: false,
            })
        }
        Placement::Quorum(QuorumWrite {
            mut servers,
            quorum,
            mut forget,
            warm,
            older,
            forget_last,
        }) => {
            // A warming server is on no ring in force, but it may have been
            // on the previous one: then it loses the key already.
            warming.retain(|w| !servers.contains(w));
            let mut warm = warm;
            let at = servers.len() - forget;
            for (i, &w) in warming.iter().filter(|w| warms(w)).enumerate() {
                servers.insert(at + i, w);
                warm += 1;
            }
            for &w in warming.iter().filter(|w| !warms(w)) {
                servers.push(w);
                forget += 1;
            }
            Placement::Quorum(QuorumWrite {
                servers,
                quorum,
                forget,
                warm,
                older,
                forget_last,
            })
        }
        Placement::CasThenCopy {
            owner,
            copies,
            previous,
            older,
        } => Placement::CasThenCopy {
            owner,
            copies,
            previous,
            older: Some(OlderOwners::then(older, &warming)),
        },
        Placement::Moved {
            owner,
            previous,
            steps,
            older,
            hash,
            copies_back,
        } => {
            warming.retain(|w| *w != previous);
            Placement::Moved {
                owner,
                previous,
                steps,
                older: Some(OlderOwners::then(older, &warming)),
                hash,
                copies_back,
            }
        }
        read @ Placement::ReadThrough { .. } => read,
    }
}

/// What a replicated compare-and-swap of `key` (replica set `servers`,
/// `owner` first) needs in a hand-off window: the previous ring's owner when
/// it differs (the cas may be its number), and the older rings' owners to
/// delete the key from first. The previous ring's replicas that are not replicas
/// now are appended to `servers`: they get the copy too, since a later miss
/// may fall through to them and must not find the value this cas replaced.
fn cas_handoff(
    key: &[u8],
    owner: usize,
    servers: &mut Servers,
    topology: &Topology,
) -> (Option<usize>, Option<Box<OlderOwners>>) {
    if topology.previous.is_none() {
        return (None, None);
    }
    let current = servers.len();
    let mut before = Servers::new();
    topology.previous_replicas(key, &mut before);
    let previous = before.first().copied().filter(|&p| p != owner);
    topology.push_previous_only_replicas(key, servers);
    (previous, topology.older_owners(key, &servers[..current]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::topology::tests::{four_then_five, four_then_five_with};

    const READ: KeyOp = KeyOp::READ;

    /// A view with `dead` DEAD.
    fn with_dead(dead: impl IntoIterator<Item = usize>) -> HealthView {
        let mut view = HealthView::default();
        view.refill(dead);
        view
    }

    #[test]
    fn quorum_is_a_majority() {
        assert_eq!((quorum(1), quorum(2), quorum(3), quorum(5)), (1, 2, 2, 3));
    }

    /// What the tests give as a moved key's steps.
    const STEPS: Option<&str> = Some("steps");

    /// A key the change moved, and one it left on its server.
    fn moved_and_stayed(old: &Topology, new: &Topology) -> (String, String) {
        let name = |t: &Topology, key: &str| {
            t.backends[t.owner_index(key.as_bytes()).unwrap()]
                .name()
                .to_string()
        };
        let keys: Vec<String> = (0..2000).map(|i| format!("k{i}")).collect();
        let moved = keys.iter().find(|k| name(new, k) != name(old, k)).unwrap();
        let stayed = keys.iter().find(|k| name(new, k) == name(old, k)).unwrap();
        (moved.clone(), stayed.clone())
    }

    #[test]
    fn one_replica_goes_to_the_owner_and_a_moved_key_to_the_hand_off() {
        let (_runtime, old, new) = four_then_five();
        let (moved, stayed) = moved_and_stayed(&old, &new);
        let owner = new.owner_index(moved.as_bytes()).unwrap();
        let previous = new.previous_owner(moved.as_bytes(), owner).unwrap();
        for op in [
            KeyOp::classic(false, false),
            KeyOp::classic(true, false),
            READ,
        ] {
            assert_eq!(
                place(moved.as_bytes(), op, STEPS, &new, &HealthView::NONE),
                Placement::Moved {
                    owner,
                    previous,
                    steps: "steps",
                    older: None,
                    hash: new.owner_index_hashed(moved.as_bytes()).1,
                    copies_back: false,
                },
                "{op:?}"
            );
            assert!(
                matches!(
                    place(stayed.as_bytes(), op, STEPS, &new, &HealthView::NONE),
                    Placement::Owner { .. }
                ),
                "{op:?}"
            );
            // Outside a window: the owner, with the hash hot keys count.
            let placed = place(moved.as_bytes(), op, STEPS, &old, &HealthView::NONE);
            let (server, hash) = old.owner_index_hashed(moved.as_bytes());
            assert_eq!(
                placed,
                Placement::Owner {
                    server: server.unwrap(),
                    hash
                }
            );
            assert!(hash.is_some(), "the default ring hashes by xxh3");
        }
        // What the new owner alone answers (no steps), and what memcached
        // will refuse.
        let refused = KeyOp {
            hands_off: false,
            ..KeyOp::classic(false, false)
        };
        for (op, steps) in [(READ, None), (refused, STEPS)] {
            assert!(
                matches!(place(moved.as_bytes(), op, steps, &new, &HealthView::NONE), Placement::Owner { server, .. } if server == owner),
                "{op:?}"
            );
        }
    }

    #[test]
    fn replicas_get_a_quorum_write_a_cas_on_the_owner_and_a_read_in_order() {
        let (_runtime, _old, new) = four_then_five_with("replicas = 2\n");
        let key = b"some-key";
        let mut replicas = Servers::new();
        new.replicas(key, &mut replicas);
        assert_eq!(replicas.len(), 2);
        match place(
            key,
            KeyOp::classic(false, false),
            STEPS,
            &new,
            &HealthView::NONE,
        ) {
            Placement::Quorum(QuorumWrite {
                servers,
                quorum,
                forget,
                older,
                forget_last,
                warm: 0,
            }) => {
                assert!(!forget_last, "a write, not a delete");
                assert_eq!(servers[..2], replicas[..]);
                assert_eq!(quorum, 2);
                assert_eq!(older, None, "one change: no older ring");
                // The previous ring's replicas that are not replicas now.
                assert_eq!(servers.len(), 2 + forget);
            }
            other => panic!("{other:?}"),
        }
        match place(
            key,
            KeyOp::classic(true, false),
            STEPS,
            &new,
            &HealthView::NONE,
        ) {
            Placement::CasThenCopy { owner, copies, .. } => {
                assert_eq!(owner, replicas[0]);
                assert_eq!(copies[0], replicas[1]);
            }
            other => panic!("{other:?}"),
        }
        match place(key, READ, STEPS, &new, &HealthView::NONE) {
            Placement::ReadThrough {
                servers,
                current,
                on_miss,
            } => {
                assert_eq!(servers[..2], replicas[..]);
                assert_eq!(current, 2);
                assert!(on_miss, "in a window a miss falls through");
            }
            other => panic!("{other:?}"),
        }
        // A delete of a key whose replicas changed: the former replicas lose
        // it first, as a last group of older owners.
        let mut now = Servers::new();
        let moved = (0..2000)
            .map(|i| format!("k{i}"))
            .find(|k| {
                let mut before = Servers::new();
                new.previous_replicas(k.as_bytes(), &mut before);
                new.replicas(k.as_bytes(), &mut now);
                before.iter().any(|b| !now.contains(b))
            })
            .unwrap();
        new.replicas(moved.as_bytes(), &mut now);
        let delete = KeyOp::classic(false, true);
        match place(moved.as_bytes(), delete, STEPS, &new, &HealthView::NONE) {
            Placement::Quorum(QuorumWrite {
                servers,
                forget,
                older,
                ..
            }) => {
                assert_eq!((&servers[..], forget), (&now[..], 0));
                let older = older.expect("the former replicas");
                let mut before = Servers::new();
                new.previous_replicas(moved.as_bytes(), &mut before);
                let former: Vec<usize> = before.into_iter().filter(|b| !now.contains(b)).collect();
                assert_eq!(older.group(0), Some(&former[..]));
                assert_eq!(older.group(1), None);
            }
            other => panic!("{other:?}"),
        }
        // A lease: the owner alone, and no hand-off with replicas.
        let lease = KeyOp {
            owner_only: true,
            ..READ
        };
        assert!(matches!(
            place(key, lease, STEPS, &new, &HealthView::NONE),
            Placement::Owner { server, .. } if server == replicas[0]
        ));
    }

    #[test]
    fn a_cas_is_tried_on_the_previous_owner_only_when_it_can_be() {
        let (_runtime, old, new) = four_then_five_with("replicas = 2\n");
        let moved = (0..2000)
            .map(|i| format!("k{i}"))
            .find(|k| {
                let (mut now, mut before) = (Servers::new(), Servers::new());
                new.replicas(k.as_bytes(), &mut now);
                old.replicas(k.as_bytes(), &mut before);
                new.backends[now[0]].name() != old.backends[before[0]].name()
            })
            .unwrap();
        let cas = |retry_elsewhere| {
            let op = KeyOp {
                kind: KeyKind::Cas { retry_elsewhere },
                ..KeyOp::classic(true, false)
            };
            match place(moved.as_bytes(), op, STEPS, &new, &HealthView::NONE) {
                Placement::CasThenCopy { previous, .. } => previous,
                other => panic!("{other:?}"),
            }
        };
        assert!(cas(true).is_some());
        assert_eq!(cas(false), None);
    }

    #[test]
    fn a_replicated_read_asks_the_replicas_the_view_holds_dead_last() {
        let (_runtime, _old, new) = four_then_five_with("replicas = 2\n");
        let key = b"some-key";
        let mut replicas = Servers::new();
        new.replicas(key, &mut replicas);
        let read = |health: &HealthView| match place(key, READ, STEPS, &new, health) {
            Placement::ReadThrough { servers, .. } => servers,
            other => panic!("{other:?}"),
        };
        assert_eq!(read(&HealthView::NONE)[..2], replicas[..]);
        let owner_dead = with_dead([replicas[0]]);
        assert_eq!(read(&owner_dead)[..2], [replicas[1], replicas[0]]);
        // Writes and a cas go by the ring alone: health decides only the
        // order a read asks in.
        assert_eq!(
            place(key, KeyOp::classic(false, false), STEPS, &new, &owner_dead),
            place(
                key,
                KeyOp::classic(false, false),
                STEPS,
                &new,
                &HealthView::NONE
            )
        );
    }

    #[test]
    fn a_write_of_a_warming_servers_key_reaches_it_and_a_read_never_does() {
        use crate::pools::topology::tests::four_and_one_warming;
        let (_runtime, topology) = four_and_one_warming("");
        let mut warming = Servers::new();
        let (theirs, not_theirs) = {
            let keys: Vec<String> = (0..2000).map(|i| format!("k{i}")).collect();
            let mut theirs = keys.iter().filter(|k| {
                topology.warming_replicas(k.as_bytes(), &mut warming);
                !warming.is_empty()
            });
            let first = theirs.next().unwrap().clone();
            let other = keys
                .iter()
                .find(|k| {
                    topology.warming_replicas(k.as_bytes(), &mut warming);
                    warming.is_empty()
                })
                .unwrap()
                .clone();
            (first, other)
        };
        let owner = topology.owner_index(theirs.as_bytes()).unwrap();
        let at =
            |op: KeyOp, key: &str| place(key.as_bytes(), op, STEPS, &topology, &HealthView::NONE);
        let set = KeyOp::classic(false, false).repeated(true);
        assert_eq!(
            at(set, &theirs),
            Placement::Quorum(QuorumWrite {
                servers: smallvec::smallvec![owner, 4],
                quorum: 1,
                forget: 0,
                warm: 1,
                older: None,
                forget_last: false,
            })
        );
        // An incr, a cas: deleted there.
        for op in [KeyOp::classic(false, false), KeyOp::classic(true, false)] {
            assert_eq!(
                at(op, &theirs),
                Placement::Quorum(QuorumWrite {
                    servers: smallvec::smallvec![owner, 4],
                    quorum: 1,
                    forget: 1,
                    warm: 0,
                    older: None,
                    forget_last: false,
                }),
                "{op:?}"
            );
        }
        assert!(matches!(at(READ, &theirs), Placement::Owner { server, .. } if server == owner));
        assert!(matches!(at(set, &not_theirs), Placement::Owner { .. }));

        // With replicas: a warming server among the staged replicas gets
        // the write beside the replicas now, uncounted.
        let (_runtime, topology) = four_and_one_warming("replicas = 2\n");
        let key = (0..2000)
            .map(|i| format!("k{i}"))
            .find(|k| {
                topology.warming_replicas(k.as_bytes(), &mut warming);
                !warming.is_empty()
            })
            .unwrap();
        let mut now = Servers::new();
        topology.replicas(key.as_bytes(), &mut now);
        let placed = place(key.as_bytes(), set, STEPS, &topology, &HealthView::NONE);
        let Placement::Quorum(QuorumWrite {
            servers,
            quorum,
            warm,
            forget,
            ..
        }) = placed
        else {
            panic!("{placed:?}")
        };
        assert_eq!((quorum, warm, forget), (2, 1, 0));
        assert_eq!(servers[..2], now[..]);
        assert_eq!(servers[2], 4);
        match place(key.as_bytes(), READ, STEPS, &topology, &HealthView::NONE) {
            Placement::ReadThrough { servers, .. } => assert!(!servers.contains(&4)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_health_view_knows_exactly_the_servers_it_was_given() {
        let mut view = with_dead([0, 3, 64, 130]);
        for server in 0..200 {
            assert_eq!(
                view.is_dead(server),
                [0, 3, 64, 130].contains(&server),
                "{server}"
            );
        }
        view.refill([5]);
        assert!(view.is_dead(5) && !view.is_dead(0) && !view.is_dead(130));
        assert!(!HealthView::NONE.is_dead(0));
    }

    #[test]
    fn beside_other_writers_a_moved_key_is_read_on_its_new_owner_alone() {
        for (setting, reads_through) in [("", true), ("readers", true), ("writers", false)] {
            let settings = if setting.is_empty() {
                String::new()
            } else {
                format!("shared_with = \"{setting}\"\n")
            };
            let (_runtime, old, new) = four_then_five_with(&settings);
            let (moved, _) = moved_and_stayed(&old, &new);
            let owner = new.owner_index(moved.as_bytes()).unwrap();
            let read = place(moved.as_bytes(), READ, STEPS, &new, &HealthView::NONE);
            assert_eq!(
                matches!(read, Placement::Moved { .. }),
                reads_through,
                "{setting}: {read:?}"
            );
            if !reads_through {
                assert!(matches!(read, Placement::Owner { server, .. } if server == owner));
            }
            // A write still deletes the previous owner's copy.
            let write = KeyOp::classic(false, false);
            assert!(matches!(
                place(moved.as_bytes(), write, STEPS, &new, &HealthView::NONE),
                Placement::Moved { .. }
            ));
        }
        // With replicas: the previous ring's replicas are asked only where
        // reads go through, and a cas is retried there only where it may
        // be copied.
        for (setting, falls_back, retries) in [
            ("memring", true, true),
            ("readers", true, false),
            ("writers", false, false),
        ] {
            let (_runtime, old, new) =
                four_then_five_with(&format!("replicas = 2\nshared_with = \"{setting}\"\n"));
            let moved = (0..2000)
                .map(|i| format!("k{i}"))
                .find(|k| {
                    let (mut now, mut before) = (Servers::new(), Servers::new());
                    new.replicas(k.as_bytes(), &mut now);
                    old.replicas(k.as_bytes(), &mut before);
                    let name = |t: &Topology, s: &usize| t.backends[*s].name().to_string();
                    name(&new, &now[0]) != name(&old, &before[0])
                        && before
                            .iter()
                            .any(|b| !now.iter().any(|n| name(&new, n) == name(&old, b)))
                })
                .unwrap();
            match place(moved.as_bytes(), READ, STEPS, &new, &HealthView::NONE) {
                Placement::ReadThrough {
                    servers, current, ..
                } => {
                    assert_eq!(servers.len() > current, falls_back, "{setting}")
                }
                other => panic!("{other:?}"),
            }
            match place(
                moved.as_bytes(),
                KeyOp::classic(true, false),
                STEPS,
                &new,
                &HealthView::NONE,
            ) {
                Placement::CasThenCopy { previous, .. } => {
                    assert_eq!(previous.is_some(), retries, "{setting}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// Loads for [`order_read`] tests: fixed per server, moved by `took`.
    struct Loads(Vec<Cell<u32>>);

    impl Loads {
        fn of(loads: &[u32]) -> Loads {
            Loads(loads.iter().copied().map(Cell::new).collect())
        }
    }

    impl Load for Loads {
        fn load(&self, server: usize) -> u32 {
            self.0[server].get()
        }
        fn took(&self, server: usize) {
            self.0[server].set(self.0[server].get() + 1);
        }
    }

    fn balance(load: &dyn Load, epsilon: f64, start: usize) -> Option<Balance<'_>> {
        Some(Balance {
            load,
            epsilon,
            start,
            within_local: false,
        })
    }

    #[test]
    fn within_the_local_zone_a_busy_local_replica_keeps_its_reads() {
        // Servers 0 and 2 are local: balanced over them only, however busy
        // they are and however idle the far ones.
        let loads = Loads::of(&[12, 0, 6, 0]);
        let mut servers = vec![0, 1, 2, 3];
        let local = |s: usize| s % 2 == 0;
        let within = Some(Balance {
            load: &loads,
            epsilon: 0.25,
            start: 0,
            within_local: true,
        });
        assert!(order_read(&mut servers, local, |_| false, within));
        assert_eq!(servers, vec![2, 0, 1, 3]);
        // With every local replica DEAD, the far ones are balanced over.
        let mut servers = vec![0, 1, 2, 3];
        let far = Loads::of(&[0, 7, 0, 1]);
        let within = Some(Balance {
            load: &far,
            epsilon: 0.25,
            start: 0,
            within_local: true,
        });
        assert!(order_read(&mut servers, local, |s| s % 2 == 0, within));
        assert_eq!(servers, vec![3, 1, 0, 2]);
        // Without it, the idle far replica takes the read.
        let mut servers = vec![0, 1, 2, 3];
        let loads = Loads::of(&[12, 0, 6, 0]);
        assert!(order_read(
            &mut servers,
            local,
            |_| false,
            balance(&loads, 0.25, 0)
        ));
        assert_eq!(servers[0], 1);
    }

    #[test]
    fn without_balancing_a_read_is_ordered_as_the_two_sorts_ordered_it() {
        // Every set of local and DEAD servers among four replicas in every
        // ring order: the order of a local-first stable sort, then a stable
        // sort putting DEAD last.
        let orders = [[0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0], [1, 3, 0, 2]];
        for ring in orders {
            for local in 0..16u32 {
                for dead in 0..16u32 {
                    let is_local = |s: usize| local & (1 << s) != 0;
                    let is_dead = |s: usize| dead & (1 << s) != 0;
                    let mut oracle = ring.to_vec();
                    oracle.sort_by_key(|&s| !is_local(s));
                    oracle.sort_by_key(|&s| is_dead(s));
                    let mut servers = ring;
                    assert!(!order_read(&mut servers, is_local, is_dead, None));
                    assert_eq!(servers[..], oracle[..], "{ring:?} {local:b} {dead:b}");
                }
            }
        }
    }

    #[test]
    fn a_balanced_read_takes_the_first_replica_within_the_bound() {
        let none = |_| false;
        // (loads of servers 0, 1, 2; epsilon; the order after).
        let cases: [(&[u32], f64, [usize; 3]); 10] = [
            // Idle: the first choice, and with epsilon 0 too.
            (&[0, 0, 0], 0.25, [0, 1, 2]),
            (&[0, 0, 0], 0.0, [0, 1, 2]),
            // One in flight on the first: (1.25 * 2 / 3) rounds up to 1.
            (&[1, 0, 0], 0.25, [1, 0, 2]),
            // Bound ceil(1.25 * 4 / 3) = 2: the first still has room.
            (&[1, 1, 1], 0.25, [0, 1, 2]),
            (&[2, 1, 0], 0.25, [1, 0, 2]),
            (&[2, 2, 0], 0.25, [0, 1, 2]),
            (&[2, 2, 0], 0.0, [2, 0, 1]),
            // A slow replica holding many: the others take the reads.
            (&[40, 0, 0], 0.25, [1, 0, 2]),
            (&[40, 3, 0], 0.25, [1, 0, 2]),
            // A large epsilon keeps the first choice longer.
            (&[2, 0, 0], 10.0, [0, 1, 2]),
        ];
        for (loads, epsilon, after) in cases {
            let load = Loads::of(loads);
            let mut servers = [0, 1, 2];
            let moved = order_read(&mut servers, none, none, balance(&load, epsilon, 0));
            assert_eq!(servers, after, "{loads:?} {epsilon}");
            assert_eq!(moved, after[0] != 0);
            // The read is counted on the replica it went to.
            assert_eq!(load.0[after[0]].get(), loads[after[0]] + 1);
        }
    }

    #[test]
    fn balancing_never_picks_a_dead_replica_and_prefers_the_local_zone() {
        let load = Loads::of(&[0, 9, 0, 0]);
        // Server 1 is local but loaded; 0 is DEAD: 2 comes first, in ring
        // order behind the local one.
        let mut servers = [0, 1, 2, 3];
        let moved = order_read(
            &mut servers,
            |s| s == 1,
            |s| s == 0,
            balance(&load, 0.25, 0),
        );
        assert!(moved);
        assert_eq!(servers, [2, 1, 3, 0]);
        // One live replica takes every read, however loaded.
        let mut servers = [0, 1];
        assert!(!order_read(
            &mut servers,
            |_| false,
            |s| s == 0,
            balance(&load, 0.0, 0)
        ));
        assert_eq!(servers, [1, 0]);
        // At equal load the local replica comes first.
        let load = Loads::of(&[0, 0, 0]);
        let mut servers = [0, 1, 2];
        order_read(&mut servers, |s| s == 2, |_| false, balance(&load, 0.0, 0));
        assert_eq!(servers[0], 2);
    }

    #[test]
    fn reads_that_never_finish_stay_within_the_bound() {
        // The bound holds at every read, loads only growing: no replica
        // ever goes above (1 + epsilon) times the average (rounded up).
        for epsilon in [0.0, 0.25, 1.0] {
            for start in [0, 1] {
                let load = Loads::of(&[0, 0, 0]);
                for n in 1..=300u32 {
                    let mut servers = [0, 1, 2];
                    order_read(
                        &mut servers,
                        |_| false,
                        |_| false,
                        balance(&load, epsilon, start),
                    );
                    let most = load.0.iter().map(Cell::get).max().unwrap();
                    let bound = ((1.0 + epsilon) * f64::from(n) / 3.0 - 1e-9).ceil() as u32;
                    assert!(most <= bound.max(1), "{epsilon} {n}: {most} > {bound}");
                }
            }
        }
    }

    #[test]
    fn a_hot_keys_reads_go_round_its_replicas_when_idle() {
        let load = Loads::of(&[0, 0, 0]);
        let mut first = [0u32; 3];
        for start in 0..300 {
            let mut servers = [0, 1, 2];
            order_read(
                &mut servers,
                |_| false,
                |_| false,
                balance(&load, 0.25, start),
            );
            first[servers[0]] += 1;
            // Answered at once: idle again.
            load.0.iter().for_each(|l| l.set(0));
        }
        assert_eq!(first, [100, 100, 100]);
    }

    #[test]
    fn least_loaded_places_a_replicated_read_by_the_views_loads() {
        let (_runtime, _old, new) =
            four_then_five_with("replicas = 2\nread_balance = \"least_loaded\"\n");
        let key = b"some-key";
        let mut replicas = Servers::new();
        new.replicas(key, &mut replicas);
        let read = |health: &HealthView| match place(key, READ, STEPS, &new, health) {
            Placement::ReadThrough { servers, .. } => servers,
            other => panic!("{other:?}"),
        };
        let moved = Counter::default();
        let mut view = HealthView::default();
        view.refill([]);
        let mut loads = vec![0; new.backends.len()];
        loads[replicas[0]] = 5;
        view.balance(loads, None, moved.clone());
        assert_eq!(read(&view)[..2], [replicas[1], replicas[0]]);
        assert_eq!(moved.get(), 1);
        // The view counts the reads it placed: the second replica fills up
        // until the first has room again (5 < ceil(1.25 * 9 / 2) = 6).
        for _ in 0..2 {
            assert_eq!(read(&view)[0], replicas[1]);
        }
        assert_eq!(view.balancing().unwrap().load(replicas[1]), 3);
        assert_eq!(read(&view)[0], replicas[0]);
        // Without loads (no balancing), the ring's order.
        assert_eq!(read(&HealthView::NONE)[..2], replicas[..]);
    }
}
