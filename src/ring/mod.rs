//! The consistent-hash ring: an immutable value mapping every key to one server.
//!
//! Ketama style: every server gets points on a circle of hashes; a key belongs
//! to the first point at or after its own hash, wrapping at the end. The ring
//! is built once and then only read (published through arc-swap by
//! `topology`), so lookups take no lock. No I/O here.
//!
//! A *flavour* decides how points are named and hashed, how many a server gets
//! for its weight, and how a key is hashed; everything else (the sorted array,
//! the bucketed search, the clockwise replica walk, shares and moved shares) is
//! shared by every flavour here:
//! - [`memring`]: memring's own ring (xxh3, 160 points per unit of weight);
//! - [`twemproxy`]: twemproxy (nutcracker) 0.5 ketama, with its key hashes in
//!   [`hashkit`];
//! - [`libmemcached`]: libmemcached's weighted ketama (pylibmc
//!   `ketama_weighted`, PHP memcached's libketama-compatible mode);
//! - [`dalli`]: Ruby Dalli's ring (SHA-1 points, CRC-32 keys, the point at
//!   or below the key's hash), kept complemented so the search is the same;
//! - [`php_memcache`]: PHP's `memcache` extension, consistent strategy (keys
//!   placed through its 1024 buckets);
//! - [`rendezvous`]: pymemcache's `HashClient` (highest random weight). It has
//!   no circle: a rendezvous ring keeps one score prefix per server instead of
//!   points, and a key goes to the server that scores it highest.
//!
//! 32-bit flavours keep their hashes in the top half of a `u64`: the order of
//! points and keys is unchanged, and shares are measured on one 2^64 circle.

pub mod dalli;
pub mod digest;
pub mod hashkit;
pub mod libmemcached;
pub mod memring;
pub mod php_memcache;
pub mod rendezvous;
pub mod sha1;
pub mod twemproxy;
pub mod zones;

pub use hashkit::HashFunction;

/// Points per server per unit of weight in the memring flavour (as in
/// libketama: 160 at weight 1).
pub const POINTS_PER_WEIGHT: u32 = memring::POINTS_PER_WEIGHT;

/// One server as the ring sees it: the identity its points are named after (its
/// `name`, or its address when unnamed) and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub identity: String,
    pub weight: u32,
}

/// A member with the `host:port` it is reached at, which the twemproxy and
/// libmemcached flavours name points after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub member: Member,
    pub addr: String,
    /// The server's zone (`zone`), which only the replica walk reads: with
    /// zones a key's replicas are in distinct zones while any remain.
    pub zone: Option<String>,
}

/// Whose ring to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavour {
    /// memring's own ring.
    #[default]
    Memring,
    /// twemproxy 0.5 `distribution: ketama`.
    Twemproxy,
    /// libmemcached's weighted ketama with MD5.
    Libmemcached,
    /// pymemcache `HashClient`'s rendezvous hashing with murmur3.
    Rendezvous,
    /// Ruby Dalli's ring.
    Dalli,
    /// PHP's `memcache` extension, `hash_strategy = consistent`.
    PhpMemcache,
}

impl Flavour {
    /// Every flavour, for listing the accepted names.
    pub const ALL: [Flavour; 6] = [
        Flavour::Memring,
        Flavour::Twemproxy,
        Flavour::Libmemcached,
        Flavour::Rendezvous,
        Flavour::Dalli,
        Flavour::PhpMemcache,
    ];

    /// The name used by the config's `ring =`.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Memring => "memring",
            Flavour::Twemproxy => "twemproxy",
            Flavour::Libmemcached => "libmemcached",
            Flavour::Rendezvous => "rendezvous",
            Flavour::Dalli => "dalli",
            Flavour::PhpMemcache => "php-memcache",
        }
    }

    /// Whether servers' `weight` means anything to this flavour's client
    /// (pymemcache's `HashClient` has no weights).
    pub fn has_weights(self) -> bool {
        self != Flavour::Rendezvous
    }

    /// The flavour called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Flavour> {
        Flavour::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// Everything besides the member list that decides where keys go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub flavour: Flavour,
    /// The key hash of the twemproxy flavour, and of the php-memcache one
    /// (`crc32a` or `fnv1a_32`); the others have a fixed one.
    pub hash: HashFunction,
    /// With `Some([open, close])`, a key containing `open`, then later
    /// `close`, with at least one byte between, is placed by those bytes only.
    pub hash_tag: Option<[u8; 2]>,
    /// A key starting with these bytes is hashed without them (the hash
    /// tag then applies to the rest); any other key is hashed whole. Empty
    /// when unset. For clients that hash a key before prefixing it, as
    /// pymemcache's `HashClient` does with its `key_prefix`.
    pub hash_without_prefix: Box<[u8]>,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            flavour: Flavour::Memring,
            hash: twemproxy::DEFAULT_HASH,
            hash_tag: None,
            hash_without_prefix: Box::default(),
        }
    }
}

impl Spec {
    fn key_hash(&self) -> KeyHash {
        match self.flavour {
            Flavour::Memring => KeyHash::Xxh3,
            Flavour::Twemproxy => KeyHash::Bits32(self.hash),
            Flavour::Libmemcached => KeyHash::Bits32(HashFunction::Md5),
            Flavour::Rendezvous => KeyHash::Rendezvous,
            Flavour::Dalli => KeyHash::Complement32(HashFunction::Crc32a),
            Flavour::PhpMemcache => KeyHash::Buckets(php_memcache::function(self.hash)),
        }
    }
}

/// How a ring hashes keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyHash {
    Xxh3,
    /// A 32-bit hash, kept in the top half of the `u64`.
    Bits32(HashFunction),
    /// No single hash: a murmur3 score per server (see [`rendezvous`]).
    Rendezvous,
    /// A 32-bit hash complemented, in the top half: for a ring that takes
    /// the point at or below the key's hash (see [`dalli`]).
    Complement32(HashFunction),
    /// A 32-bit hash placed at its bucket's position (see [`php_memcache`]).
    Buckets(HashFunction),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Point {
    hash: u64,
    server: u32,
}

impl Point {
    fn new(hash: u64, server: usize) -> Point {
        Point {
            hash,
            server: server as u32,
        }
    }

    /// A 32-bit point of a ketama flavour, on the 2^64 circle.
    fn from_u32(hash: u32, server: usize) -> Point {
        Point::new(u64::from(hash) << 32, server)
    }
}

/// A built ring. Server indexes are positions in the member list it was built
/// from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    points: Box<[Point]>,
    /// Where the search for a hash starts: entry `b` is the index of the
    /// first point at or after `b << shift`, for about one bucket per point,
    /// so a lookup reads one bucket's few points instead of searching the
    /// whole ring (a binary search of 16 000 points misses the cache about
    /// 14 times in a row).
    starts: Box<[u32]>,
    /// `64 - log2(buckets)`.
    shift: u32,
    /// A rendezvous ring's score prefixes (`"<node>-"`), one per member;
    /// empty for the other flavours.
    prefixes: Box<[Box<[u8]>]>,
    /// The same prefixes, hashed as far as whole blocks go.
    scorers: Box<[rendezvous::Scorer]>,
    members: Box<[Member]>,
    /// Each member's zone as an index into `zone_names`; empty when no
    /// member has a zone (then the walk is the plain one).
    zones: Box<[u16]>,
    /// The distinct zones, sorted (a member without one is in `""`).
    zone_names: Box<[Box<str>]>,
    key_hash: KeyHash,
    hash_tag: Option<[u8; 2]>,
    /// [`Spec::hash_without_prefix`].
    hash_without_prefix: Box<[u8]>,
}

/// [`Ring::zones`] and [`Ring::zone_names`] of `nodes`: nothing when no node
/// has a zone.
fn zone_indexes(nodes: &[Node]) -> (Box<[u16]>, Box<[Box<str>]>) {
    if nodes.iter().all(|n| n.zone.is_none()) {
        return (Box::default(), Box::default());
    }
    fn zone(n: &Node) -> &str {
        n.zone.as_deref().unwrap_or("")
    }
    let mut names: Vec<&str> = nodes.iter().map(zone).collect();
    names.sort_unstable();
    names.dedup();
    let index = |n: &Node| names.binary_search(&zone(n)).unwrap_or(0) as u16;
    (
        nodes.iter().map(index).collect(),
        names.iter().map(|&n| n.into()).collect(),
    )
}

/// [`Ring::starts`] and [`Ring::shift`] for sorted `points`: a power of two
/// of buckets, at most one per point (at least two), each with the index of
/// its first point at or after the bucket's start, and one more entry for
/// the end.
fn bucket_starts(points: &[Point]) -> (Box<[u32]>, u32) {
    let bits = points.len().max(2).ilog2().min(24);
    let shift = 64 - bits;
    let buckets = 1usize << bits;
    let mut starts = Vec::with_capacity(buckets + 1);
    let mut next = 0usize;
    for bucket in 0..buckets as u64 {
        let from = bucket << shift;
        while next < points.len() && points[next].hash < from {
            next += 1;
        }
        starts.push(next as u32);
    }
    starts.push(points.len() as u32);
    (starts.into_boxed_slice(), shift)
}

/// The hash the memring flavour places a key by (ignoring any hash tag).
pub fn key_hash(key: &[u8]) -> u64 {
    memring::key_hash(key)
}

/// The part of `key` that is hashed: without `prefix` when the key starts
/// with it (an empty prefix strips nothing), then [`tagged_part`] of the
/// rest. Every lookup of a ring hashes this part, so placement, replicas,
/// hand-off's previous owner, `/route` and `memring where` agree.
#[inline]
pub fn hashed_part<'k>(key: &'k [u8], prefix: &[u8], tag: Option<[u8; 2]>) -> &'k [u8] {
    // Most rings strip no prefix: no `memcmp` call to compare none.
    let unprefixed = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix).unwrap_or(key)
    };
    tagged_part(unprefixed, tag)
}

/// The part of `key` that is hashed: with a tag `[open, close]`, the bytes
/// between the first `open` and the next `close` after it, when there is at
/// least one; otherwise the whole key (as twemproxy's `hash_tag`).
#[inline]
pub fn tagged_part(key: &[u8], tag: Option<[u8; 2]>) -> &[u8] {
    let Some([open, close]) = tag else {
        return key;
    };
    let Some(start) = memchr::memchr(open, key) else {
        return key;
    };
    match memchr::memchr(close, &key[start + 1..]) {
        Some(len) if len > 0 => &key[start + 1..start + 1 + len],
        _ => key,
    }
}

impl Ring {
    /// Builds a memring-flavour ring for `members`, in order. Building the
    /// same list twice yields identical rings, so every memring instance
    /// routes alike.
    pub fn build(members: Vec<Member>) -> Ring {
        let nodes = members
            .into_iter()
            .map(|member| Node {
                addr: member.identity.clone(),
                member,
                zone: None,
            })
            .collect();
        Ring::build_with(&Spec::default(), nodes)
    }

    /// Builds the ring `spec` describes for `nodes`, in order.
    pub fn build_with(spec: &Spec, nodes: Vec<Node>) -> Ring {
        let (mut points, rank) = match spec.flavour {
            Flavour::Memring => memring::points(&nodes),
            Flavour::Twemproxy => twemproxy::points(&nodes),
            Flavour::Libmemcached => libmemcached::points(&nodes),
            Flavour::Rendezvous => (Vec::new(), Vec::new()),
            Flavour::Dalli => dalli::points(&nodes),
            Flavour::PhpMemcache => php_memcache::points(&nodes, spec.hash),
        };
        let prefixes = match spec.flavour {
            Flavour::Rendezvous => nodes
                .iter()
                .map(|n| rendezvous::score_prefix(&n.addr))
                .collect(),
            _ => Box::default(),
        };
        let scorers = prefixes
            .iter()
            .map(|p| rendezvous::Scorer::new(p))
            .collect();
        // Equal hashes are ordered by the flavour's server rank (a stable sort
        // keeps one server's equal points in the order they were made), so
        // the first point of a tie, which owns the keys, is the flavour's.
        points.sort_by(|a, b| {
            a.hash
                .cmp(&b.hash)
                .then_with(|| rank[a.server as usize].cmp(&rank[b.server as usize]))
        });
        let (starts, shift) = bucket_starts(&points);
        let (zones, zone_names) = zone_indexes(&nodes);
        Ring {
            zones,
            zone_names,
            points: points.into_boxed_slice(),
            starts,
            shift,
            prefixes,
            scorers,
            members: nodes.into_iter().map(|n| n.member).collect(),
            key_hash: spec.key_hash(),
            hash_tag: spec.hash_tag,
            hash_without_prefix: spec.hash_without_prefix.clone(),
        }
    }

    /// The members, in the order given to [`Ring::build`].
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Number of points on the ring (a rendezvous ring counts one per
    /// server).
    pub fn point_count(&self) -> usize {
        self.points.len() + self.prefixes.len()
    }

    /// Whether this is a rendezvous ring, which places keys by a score per
    /// server rather than by one position on a circle.
    pub fn is_rendezvous(&self) -> bool {
        self.key_hash == KeyHash::Rendezvous
    }

    /// The position of `key` on this ring's circle (hash tag applied). A
    /// rendezvous ring has no circle: for it this is the murmur3 hash of the
    /// key alone, which places nothing ([`Ring::owner`] scores the key on
    /// every server instead).
    #[inline]
    pub fn hash_key(&self, key: &[u8]) -> u64 {
        let key = self.hashed_part(key);
        match self.key_hash {
            KeyHash::Xxh3 => memring::key_hash(key),
            KeyHash::Bits32(function) => u64::from(function.hash(key)) << 32,
            KeyHash::Rendezvous => u64::from(rendezvous::murmur3_32(key, 0)) << 32,
            KeyHash::Complement32(function) => u64::from(!function.hash(key)) << 32,
            KeyHash::Buckets(function) => {
                u64::from(php_memcache::key_position(function.hash(key))) << 32
            }
        }
    }

    /// [`Ring::owner`], and the key's xxh3 hash when the ring placed it by
    /// that hash (see [`Ring::hashes_whole_key_with_xxh3`]), so a caller that
    /// needs that hash too does not compute it again.
    #[inline]
    pub fn owner_hashed(&self, key: &[u8]) -> (Option<usize>, Option<u64>) {
        if self.is_rendezvous() {
            return (self.owner(key), None);
        }
        let hash = self.hash_key(key);
        (
            self.owner_of_hash(hash),
            self.hashes_whole_key_with_xxh3().then_some(hash),
        )
    }

    /// Whether [`Ring::hash_key`] is the xxh3 hash of the whole key (the
    /// memring flavour without a hash tag): the hash hot-key detection
    /// knows keys by, which callers may then reuse.
    #[inline]
    pub fn hashes_whole_key_with_xxh3(&self) -> bool {
        matches!(self.key_hash, KeyHash::Xxh3)
            && self.hash_tag.is_none()
            && self.hash_without_prefix.is_empty()
    }

    /// The part of `key` this ring hashes ([`hashed_part`]).
    #[inline]
    fn hashed_part<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        hashed_part(key, &self.hash_without_prefix, self.hash_tag)
    }

    /// Index of the server that owns `key`, or `None` for an empty ring.
    #[inline]
    pub fn owner(&self, key: &[u8]) -> Option<usize> {
        if self.is_rendezvous() {
            return self.rendezvous_owner(key);
        }
        self.owner_of_hash(self.hash_key(key))
    }

    /// The server scoring `key` highest on a rendezvous ring.
    fn rendezvous_owner(&self, key: &[u8]) -> Option<usize> {
        let hashed = rendezvous::hashed_key(self.hashed_part(key));
        let mut best: Option<(usize, u32)> = None;
        for (server, prefix) in self.prefixes.iter().enumerate() {
            let score = self.scorers[server].score(&hashed);
            let wins = match best {
                None => true,
                Some((b, top)) => rendezvous::beats(score, prefix, top, &self.prefixes[b]),
            };
            if wins {
                best = Some((server, score));
            }
        }
        best.map(|(server, _)| server)
    }

    /// Index of the server owning a hash: the first point at or after it,
    /// wrapping to the first point. A rendezvous ring has no points, so
    /// `None` there: place its keys with [`Ring::owner`].
    #[inline]
    pub fn owner_of_hash(&self, hash: u64) -> Option<usize> {
        let i = self.first_at_or_after(hash);
        let point = self.points.get(i).or_else(|| self.points.first())?;
        Some(point.server as usize)
    }

    /// The index of the first point at or after `hash` (the number of
    /// points when there is none): searched within `hash`'s bucket only, as
    /// every point before the bucket is below `hash` and the bucket's end is
    /// above it.
    #[inline]
    fn first_at_or_after(&self, hash: u64) -> usize {
        let bucket = (hash >> self.shift) as usize;
        let (Some(&start), Some(&end)) = (self.starts.get(bucket), self.starts.get(bucket + 1))
        else {
            return self.points.partition_point(|p| p.hash < hash);
        };
        let (start, end) = (start as usize, end as usize);
        start + self.points[start..end].partition_point(|p| p.hash < hash)
    }

    /// The replica set of `key`: its owner, then the next distinct servers
    /// clockwise (further points of servers already chosen are skipped), up to
    /// `count` servers or as many as the ring has. Because each server has many
    /// points, the replicas of one server's keys spread over many others.
    ///
    /// With zones, the next servers clockwise are taken in distinct zones
    /// while distinct zones remain, then any distinct servers, so that losing
    /// one zone loses at most one copy of a key while `count` is at most the
    /// number of zones. The owner is the same either way.
    pub fn replicas(&self, key: &[u8], count: usize, out: &mut smallvec::SmallVec<[usize; 4]>) {
        out.clear();
        let wanted = count.min(self.members.len());
        if self.is_rendezvous() {
            // The servers in descending order of score: the owner, then the
            // one that would own the key without it, and so on.
            let hashed = rendezvous::hashed_key(self.hashed_part(key));
            let mut scored: smallvec::SmallVec<[(u32, usize); 16]> = self
                .prefixes
                .iter()
                .enumerate()
                .map(|(server, _)| (self.scorers[server].score(&hashed), server))
                .collect();
            // Higher score first, then (on a tie) the larger name, as the
            // client picks; the index keeps the order total.
            scored.sort_by(|a, b| {
                b.0.cmp(&a.0)
                    .then_with(|| {
                        let name = |i: usize| rendezvous::name_of(&self.prefixes[i]);
                        name(b.1).cmp(name(a.1))
                    })
                    .then_with(|| a.1.cmp(&b.1))
            });
            self.pick(|| scored.iter().map(|&(_, server)| server), wanted, out);
            return;
        }
        if self.points.is_empty() {
            return;
        }
        let hash = self.hash_key(key);
        let start = self.first_at_or_after(hash);
        let len = self.points.len();
        let walk = || (0..len).map(move |step| self.points[(start + step) % len].server as usize);
        self.pick(walk, wanted, out);
    }

    /// The first `wanted` distinct servers of the order `walk` makes: in
    /// distinct zones first while zones remain (with zones), then any.
    #[inline]
    fn pick<I: Iterator<Item = usize>>(
        &self,
        walk: impl Fn() -> I,
        wanted: usize,
        out: &mut smallvec::SmallVec<[usize; 4]>,
    ) {
        if wanted == 0 {
            return;
        }
        if !self.zones.is_empty() && wanted > 1 {
            let in_zones = wanted.min(self.zone_names.len());
            let mut taken: smallvec::SmallVec<[u16; 4]> = smallvec::SmallVec::new();
            for server in walk() {
                let zone = self.zones[server];
                if !taken.contains(&zone) {
                    taken.push(zone);
                    out.push(server);
                    if out.len() == in_zones {
                        break;
                    }
                }
            }
            if out.len() == wanted {
                return;
            }
        }
        for server in walk() {
            if !out.contains(&server) {
                out.push(server);
                if out.len() == wanted {
                    return;
                }
            }
        }
    }

    /// Whether any member has a zone (then [`Ring::replicas`] walks by zone).
    pub fn has_zones(&self) -> bool {
        !self.zones.is_empty()
    }

    /// The zone of member `index` (`""` for a member without one on a ring
    /// with zones), `None` on a ring without zones.
    pub fn zone_of(&self, index: usize) -> Option<&str> {
        let zone = *self.zones.get(index)?;
        Some(&self.zone_names[zone as usize])
    }

    /// The share of the hash space each member owns, in member order; the shares
    /// sum to 1 (or are empty for an empty ring).
    pub fn shares(&self) -> Vec<f64> {
        if self.is_rendezvous() {
            // Every server's scores are drawn from the same hash, so each owns
            // an equal share (pymemcache's client has no weights).
            let n = self.members.len();
            return vec![1.0 / n as f64; n];
        }
        let mut owned = vec![0u128; self.members.len()];
        let Some(last) = self.points.last() else {
            return Vec::new();
        };
        let mut previous = last.hash;
        for point in self.points.iter() {
            // The arc (previous, point] belongs to this point; the first point's
            // arc wraps around the top of the hash space.
            owned[point.server as usize] += arc_len(previous, point.hash);
            previous = point.hash;
        }
        owned.iter().map(|&n| n as f64 / HASH_SPACE).collect()
    }

    /// The share of the keyspace whose owner (by identity) differs between two
    /// rings: the fraction of keys that move when `old` is replaced by `new`.
    ///
    /// Between rings that hash keys the same way this is exact. Between rings
    /// that hash keys differently (another flavour, key hash or hash tag) a
    /// key's two positions are unrelated, so the result is the expected share:
    /// a key stays only when both rings happen to pick the same server.
    pub fn moved_share(old: &Ring, new: &Ring) -> f64 {
        let same_key_part =
            old.hash_tag == new.hash_tag && old.hash_without_prefix == new.hash_without_prefix;
        if old.is_rendezvous() && new.is_rendezvous() && same_key_part {
            return Ring::rendezvous_moved_share(old, new);
        }
        if old.point_count() == 0 || new.point_count() == 0 {
            return if old.point_count() == new.point_count() {
                0.0
            } else {
                1.0
            };
        };
        if old.key_hash != new.key_hash || !same_key_part {
            return Ring::independent_moved_share(old, new);
        }
        let mut bounds: Vec<u64> = old
            .points
            .iter()
            .chain(new.points.iter())
            .map(|p| p.hash)
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        let mut moved = 0u128;
        let mut previous = *bounds.last().expect("both rings have points");
        for &bound in &bounds {
            // Every hash in (previous, bound] has the same owner in each ring,
            // the owner of `bound` itself.
            let old_owner = old.identity_of_hash(bound);
            let new_owner = new.identity_of_hash(bound);
            if old_owner != new_owner {
                moved += arc_len(previous, bound);
            }
            previous = bound;
        }
        moved as f64 / HASH_SPACE
    }

    /// Between two rendezvous rings a key stays exactly when the server
    /// scoring it highest among the servers of either ring is in both (then
    /// it wins in each); scores being independent and uniform, that is the
    /// share of servers common to both among all of them.
    fn rendezvous_moved_share(old: &Ring, new: &Ring) -> f64 {
        let same =
            |a: (&Member, &[u8]), b: (&Member, &[u8])| a.0.identity == b.0.identity && a.1 == b.1;
        let old_servers: Vec<(&Member, &[u8])> = old
            .members
            .iter()
            .zip(old.prefixes.iter().map(|p| &p[..]))
            .collect();
        let new_servers: Vec<(&Member, &[u8])> = new
            .members
            .iter()
            .zip(new.prefixes.iter().map(|p| &p[..]))
            .collect();
        let common = old_servers
            .iter()
            .filter(|&&o| new_servers.iter().any(|&n| same(o, n)))
            .count();
        let union = old_servers.len() + new_servers.len() - common;
        if union == 0 {
            return 0.0;
        }
        1.0 - common as f64 / union as f64
    }

    fn independent_moved_share(old: &Ring, new: &Ring) -> f64 {
        let new_shares = new.shares();
        let stays: f64 = old
            .members
            .iter()
            .zip(old.shares())
            .map(|(member, share)| {
                let in_new = new
                    .members
                    .iter()
                    .position(|m| m.identity == member.identity)
                    .map_or(0.0, |i| new_shares[i]);
                share * in_new
            })
            .sum();
        (1.0 - stays).clamp(0.0, 1.0)
    }

    fn identity_of_hash(&self, hash: u64) -> Option<&str> {
        self.owner_of_hash(hash)
            .map(|i| self.members[i].identity.as_str())
    }
}

const HASH_SPACE: f64 = 18_446_744_073_709_551_616.0; // 2^64

/// Length of the arc (from, to] going clockwise, wrapping at 2^64. A full circle
/// (from == to) is 2^64.
fn arc_len(from: u64, to: u64) -> u128 {
    if to > from {
        (to - from) as u128
    } else {
        (1u128 << 64) - (from - to) as u128
    }
}

/// Keys of the golden tables: plain, clustered (`user:1`..`user:8` differ in
/// their last byte only) and with bytes >= 0x80.
#[cfg(test)]
pub(crate) const GOLDEN_KEYS: [&[u8]; 16] = [
    b"alpha",
    b"beta",
    b"gamma",
    b"delta",
    b"user:42",
    b"session:9",
    b"\x80\xff\xfe",
    b"caf\xc3\xa9",
    b"user:1",
    b"user:2",
    b"user:3",
    b"user:4",
    b"user:5",
    b"user:6",
    b"user:7",
    b"user:8",
];

/// Nodes on 127.0.0.1:21301..=21304 with `weights` and optional names, as the
/// golden tables were produced with.
#[cfg(test)]
pub(crate) fn golden_nodes(weights: [u32; 4], names: Option<[&str; 4]>) -> Vec<Node> {
    (0..4)
        .map(|i| {
            let addr = format!("127.0.0.1:{}", 21301 + i);
            Node {
                member: Member {
                    identity: names.map_or(addr.clone(), |n| n[i].to_string()),
                    weight: weights[i],
                },
                addr,
                zone: None,
            }
        })
        .collect()
}

/// Checks that `spec`'s ring places 2 000 keys (`user:<i>:profile`, then
/// `suffix`) where `oracle` does: a linear scan of the client's own lookup,
/// made from the nodes and returning each key's owner. Over one server,
/// three of equal weight and eight of unequal weights, at
/// `10.<net>.0.<i>:<11211 + i>` and named `s<i>`.
#[cfg(test)]
pub(crate) fn assert_matches_linear_scan<O>(
    spec: &Spec,
    net: u8,
    suffix: &str,
    oracle: impl Fn(&[Node]) -> O,
) where
    O: Fn(&[u8]) -> Option<usize>,
{
    for weights in [vec![1u32], vec![1, 1, 1], vec![2, 1, 5, 1, 1, 3, 1, 1]] {
        let nodes: Vec<Node> = weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Node {
                member: Member {
                    identity: format!("s{i}"),
                    weight,
                },
                addr: format!("10.{net}.0.{i}:{}", 11211 + i),
                zone: None,
            })
            .collect();
        let owner_of = oracle(&nodes);
        let ring = Ring::build_with(spec, nodes);
        for i in 0..2000 {
            let key = format!("user:{i}:profile{suffix}");
            assert_eq!(
                ring.owner(key.as_bytes()),
                owner_of(key.as_bytes()),
                "{:?} {weights:?} {key}",
                spec.flavour
            );
        }
    }
}

#[cfg(test)]
pub(crate) fn golden_owners(ring: &Ring) -> Vec<usize> {
    GOLDEN_KEYS
        .iter()
        .map(|k| ring.owner(k).expect("a non-empty ring"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> Vec<Member> {
        names
            .iter()
            .map(|name| Member {
                identity: name.to_string(),
                weight: 1,
            })
            .collect()
    }

    fn servers(n: usize) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                identity: format!("cache-{i:02}"),
                weight: 1,
            })
            .collect()
    }

    /// [`servers`] as nodes whose address is their name.
    fn nodes(n: usize) -> Vec<Node> {
        servers(n)
            .into_iter()
            .map(|member| Node {
                addr: member.identity.clone(),
                member,
                zone: None,
            })
            .collect()
    }

    fn sample_keys(n: usize) -> impl Iterator<Item = String> {
        (0..n).map(|i| format!("user:{i}:profile"))
    }

    fn owner_identity<'r>(ring: &'r Ring, key: &str) -> &'r str {
        &ring.members()[ring.owner(key.as_bytes()).unwrap()].identity
    }

    #[test]
    fn two_rings_from_the_same_list_are_identical() {
        assert_eq!(Ring::build(servers(5)), Ring::build(servers(5)));
    }

    #[test]
    fn member_order_does_not_change_ownership() {
        let forward = Ring::build(members(&["a", "b", "c"]));
        let backward = Ring::build(members(&["c", "b", "a"]));
        for key in sample_keys(2000) {
            assert_eq!(
                owner_identity(&forward, &key),
                owner_identity(&backward, &key)
            );
        }
    }

    #[test]
    fn golden_owners_pin_the_hash_and_point_naming() {
        // A change to the key hash or to how points are named must fail here:
        // it would move every key of every deployed memring.
        let ring = Ring::build(members(&["cache-01", "cache-02", "cache-03", "cache-04"]));
        assert_eq!(ring.point_count(), 640);
        let owners: Vec<&str> = ["alpha", "beta", "gamma", "delta", "user:42", "session:9"]
            .iter()
            .map(|k| owner_identity(&ring, k))
            .collect();
        assert_eq!(owners, GOLDEN_OWNERS);
        assert_eq!(key_hash(b"alpha"), GOLDEN_ALPHA_HASH);
    }

    const GOLDEN_OWNERS: [&str; 6] = [
        "cache-04", "cache-02", "cache-04", "cache-03", "cache-01", "cache-01",
    ];
    const GOLDEN_ALPHA_HASH: u64 = 13_720_501_819_814_554_458;

    #[test]
    fn lookup_matches_a_linear_scan_oracle() {
        let ring = Ring::build(servers(7));
        let mut sorted: Vec<Point> = ring.points.to_vec();
        sorted.sort_by_key(|p| p.hash);
        for key in sample_keys(3000) {
            let hash = key_hash(key.as_bytes());
            let oracle = sorted
                .iter()
                .find(|p| p.hash >= hash)
                .unwrap_or(&sorted[0])
                .server as usize;
            assert_eq!(ring.owner(key.as_bytes()), Some(oracle));
        }
    }

    #[test]
    fn the_bucketed_search_finds_what_a_whole_ring_search_finds() {
        let flavours = [
            Flavour::Memring,
            Flavour::Twemproxy,
            Flavour::Dalli,
            Flavour::PhpMemcache,
        ];
        for (servers, flavour) in [0usize, 1, 2, 3, 50]
            .into_iter()
            .flat_map(|n| flavours.map(|f| (n, f)))
        {
            let nodes = nodes(servers);
            let spec = Spec {
                flavour,
                ..Spec::default()
            };
            let ring = Ring::build_with(&spec, nodes);
            let whole = |hash: u64| ring.points.partition_point(|p| p.hash < hash);
            let mut probes: Vec<u64> = vec![0, 1, u64::MAX, u64::MAX - 1];
            for b in 0..ring.starts.len() as u64 - 1 {
                let edge = b << ring.shift;
                probes.extend([edge, edge.wrapping_sub(1), edge + 1]);
            }
            probes.extend(
                ring.points
                    .iter()
                    .flat_map(|p| [p.hash, p.hash.wrapping_sub(1), p.hash.wrapping_add(1)]),
            );
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..5000 {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                probes.push(x);
            }
            for hash in probes {
                assert_eq!(
                    ring.first_at_or_after(hash),
                    whole(hash),
                    "{flavour:?} {servers} {hash:#x}"
                );
            }
        }
    }

    #[test]
    fn wraps_to_the_first_point_past_the_last() {
        let ring = Ring::build(servers(3));
        let first = ring.points[0].server as usize;
        assert_eq!(ring.owner_of_hash(u64::MAX), Some(first));
        assert_eq!(ring.owner_of_hash(0), Some(first));
    }

    #[test]
    fn replicas_start_at_the_owner_and_are_distinct() {
        let ring = Ring::build(servers(5));
        let mut set = smallvec::SmallVec::new();
        for key in sample_keys(2000) {
            ring.replicas(key.as_bytes(), 3, &mut set);
            assert_eq!(set.len(), 3);
            assert_eq!(Some(set[0]), ring.owner(key.as_bytes()));
            assert!(set[0] != set[1] && set[1] != set[2] && set[0] != set[2]);
        }
        ring.replicas(b"k", 9, &mut set);
        assert_eq!(set.len(), 5, "never more replicas than servers");
    }

    #[test]
    fn one_servers_replicas_spread_over_many_others() {
        let ring = Ring::build(servers(10));
        let mut set = smallvec::SmallVec::new();
        let mut partners = std::collections::HashSet::new();
        for key in sample_keys(5000) {
            ring.replicas(key.as_bytes(), 2, &mut set);
            if set[0] == 0 {
                partners.insert(set[1]);
            }
        }
        println!(
            "server 0's second copies live on {} of 9 other servers",
            partners.len()
        );
        assert!(partners.len() >= 7, "{partners:?}");
    }

    #[test]
    fn empty_ring_owns_nothing() {
        assert_eq!(Ring::build(Vec::new()).owner(b"k"), None);
    }

    #[test]
    fn ten_servers_share_the_keyspace_evenly() {
        let ring = Ring::build(servers(10));
        let shares = ring.shares();
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let mean = 1.0 / 10.0;
        let max = shares.iter().cloned().fold(0.0, f64::max);
        let min = shares.iter().cloned().fold(1.0, f64::min);
        println!(
            "10 servers x 160 points: max/mean {:.3}, min/mean {:.3}",
            max / mean,
            min / mean
        );
        assert!(max / mean < 1.35, "max/mean {}", max / mean);
        assert!(min / mean > 0.65, "min/mean {}", min / mean);

        let mut counts = [0usize; 10];
        for key in sample_keys(100_000) {
            counts[ring.owner(key.as_bytes()).unwrap()] += 1;
        }
        let max_keys = *counts.iter().max().unwrap() as f64;
        println!(
            "10 servers, 100k keys: max/mean load {:.3}",
            max_keys / 10_000.0
        );
        assert!(max_keys / 10_000.0 < 1.35);
    }

    #[test]
    fn weight_two_server_owns_about_twice_the_keyspace() {
        let mut list = servers(4);
        list[0].weight = 2;
        let ring = Ring::build(list);
        let shares = ring.shares();
        let others = (shares[1] + shares[2] + shares[3]) / 3.0;
        let ratio = shares[0] / others;
        println!("weight-2 share / weight-1 share = {ratio:.3}");
        assert!((1.6..2.4).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn adding_fifth_server_moves_about_a_fifth_all_to_it() {
        let four = Ring::build(servers(4));
        let five = Ring::build(servers(5));
        let mut moved = 0;
        let total = 50_000;
        for key in sample_keys(total) {
            let before = owner_identity(&four, &key);
            let after = owner_identity(&five, &key);
            if before != after {
                moved += 1;
                assert_eq!(after, "cache-04", "a moved key must go to the new server");
            }
        }
        let fraction = moved as f64 / total as f64;
        println!("4 -> 5 servers: {:.1}% of keys moved", fraction * 100.0);
        assert!((0.15..0.25).contains(&fraction), "moved {fraction}");
        let exact = Ring::moved_share(&four, &five);
        assert!(
            (exact - fraction).abs() < 0.02,
            "exact {exact} sampled {fraction}"
        );
    }

    #[test]
    fn removing_a_server_moves_only_its_keys() {
        let five = Ring::build(servers(5));
        let mut list = servers(5);
        list.remove(2);
        let four = Ring::build(list);
        for key in sample_keys(20_000) {
            let before = owner_identity(&five, &key);
            let after = owner_identity(&four, &key);
            if before != "cache-02" {
                assert_eq!(before, after);
            }
        }
        let share_removed = five.shares()[2];
        assert!((Ring::moved_share(&five, &four) - share_removed).abs() < 1e-9);
    }

    #[test]
    fn hash_tag_hashes_only_a_non_empty_tagged_part() {
        let tag = Some(*b"{}");
        assert_eq!(tagged_part(b"user:{42}:name", tag), b"42");
        assert_eq!(tagged_part(b"}{a}{b}", tag), b"a");
        assert_eq!(tagged_part(b"user:{}:name", tag), b"user:{}:name");
        assert_eq!(tagged_part(b"user:{42", tag), b"user:{42");
        assert_eq!(tagged_part(b"user:42}", tag), b"user:42}");
        assert_eq!(tagged_part(b"user:{42}", None), b"user:{42}");

        let spec = Spec {
            hash_tag: tag,
            ..Spec::default()
        };
        let ring = Ring::build_with(&spec, nodes(5));
        for i in 0..200 {
            let key = format!("order:{i}:{{customer-7}}");
            assert_eq!(ring.owner(key.as_bytes()), ring.owner(b"customer-7"));
        }
    }

    #[test]
    fn a_key_starting_with_the_prefix_is_hashed_without_it() {
        let p: &[u8] = b"myapp:";
        assert_eq!(hashed_part(b"myapp:user:1", p, None), b"user:1");
        assert_eq!(hashed_part(b"other:user:1", p, None), b"other:user:1");
        assert_eq!(hashed_part(b"myapp", p, None), b"myapp");
        assert_eq!(hashed_part(b"xmyapp:1", p, None), b"xmyapp:1");
        // The key equal to the prefix: pymemcache's empty key, hashed empty.
        assert_eq!(hashed_part(b"myapp:", p, None), b"");
        assert_eq!(hashed_part(b"myapp:user:1", b"", None), b"myapp:user:1");
        // The prefix goes first, then the hash tag applies to the rest.
        let tag = Some(*b"{}");
        assert_eq!(hashed_part(b"myapp:a{42}b", p, tag), b"42");
        assert_eq!(hashed_part(b"my{app}:x", p, tag), b"app");

        for flavour in Flavour::ALL {
            let plain = Spec {
                flavour,
                ..Spec::default()
            };
            let prefixed = Spec {
                hash_without_prefix: p.into(),
                ..plain.clone()
            };
            let (plain, prefixed) = (
                Ring::build_with(&plain, nodes(8)),
                Ring::build_with(&prefixed, nodes(8)),
            );
            let (mut a, mut b) = (smallvec::SmallVec::new(), smallvec::SmallVec::new());
            let mut moved = 0;
            for key in sample_keys(2000) {
                let sent = format!("myapp:{key}");
                let (sent, key) = (sent.as_bytes(), key.as_bytes());
                assert_eq!(prefixed.owner(sent), plain.owner(key), "{flavour:?}");
                assert_eq!(prefixed.hash_key(sent), plain.hash_key(key));
                assert_eq!(prefixed.owner_hashed(sent).0, plain.owner(key));
                prefixed.replicas(sent, 3, &mut a);
                plain.replicas(key, 3, &mut b);
                assert_eq!(a, b, "{flavour:?}");
                // Keys without the prefix are hashed whole.
                assert_eq!(prefixed.owner(key), plain.owner(key));
                moved += usize::from(plain.owner(sent) != plain.owner(key));
            }
            // Without the setting, most prefixed keys would land elsewhere.
            assert!(moved > 1000, "{flavour:?}: {moved}");
            assert!(Ring::moved_share(&plain, &prefixed) > 0.5, "{flavour:?}");
            assert!(!prefixed.hashes_whole_key_with_xxh3());
        }
    }

    #[test]
    fn only_an_untagged_memring_ring_places_keys_by_their_whole_xxh3_hash() {
        let plain = Ring::build_with(&Spec::default(), nodes(3));
        assert!(plain.hashes_whole_key_with_xxh3());
        assert_eq!(plain.hash_key(b"user:{42}"), key_hash(b"user:{42}"));
        let tagged = Spec {
            hash_tag: Some(*b"{}"),
            ..Spec::default()
        };
        assert!(!Ring::build_with(&tagged, nodes(3)).hashes_whole_key_with_xxh3());
        let twemproxy = Spec {
            flavour: Flavour::Twemproxy,
            ..Spec::default()
        };
        assert!(!Ring::build_with(&twemproxy, nodes(3)).hashes_whole_key_with_xxh3());
    }

    #[test]
    fn moved_share_between_key_hashes_is_the_expected_share() {
        let twemproxy = Spec {
            flavour: Flavour::Twemproxy,
            ..Spec::default()
        };
        let old = Ring::build_with(&twemproxy, nodes(4));
        let new = Ring::build(servers(4));
        let total = 20_000;
        let moved = sample_keys(total)
            .filter(|k| owner_identity(&old, k) != owner_identity(&new, k))
            .count();
        let sampled = moved as f64 / total as f64;
        let expected = Ring::moved_share(&old, &new);
        println!(
            "twemproxy -> memring ring, 4 servers: {expected:.3} expected, {sampled:.3} sampled"
        );
        assert!((expected - sampled).abs() < 0.02, "{expected} vs {sampled}");
        assert!((0.65..0.85).contains(&expected), "{expected}");
    }

    #[test]
    fn every_flavour_matches_a_linear_scan_oracle() {
        let mut list = servers(6);
        list[2].weight = 3;
        for flavour in Flavour::ALL {
            if flavour == Flavour::Rendezvous {
                continue; // no points: its own oracle is in rendezvous_tests
            }
            for hash in [HashFunction::Fnv1a64, HashFunction::Murmur] {
                let spec = Spec {
                    flavour,
                    hash,
                    ..Spec::default()
                };
                let nodes = list
                    .iter()
                    .enumerate()
                    .map(|(i, member)| Node {
                        member: member.clone(),
                        addr: format!("10.0.0.{i}:11211"),
                        zone: None,
                    })
                    .collect();
                let ring = Ring::build_with(&spec, nodes);
                for key in sample_keys(2000) {
                    let hash = ring.hash_key(key.as_bytes());
                    // The first point at or after the hash; ties go to the
                    // point sorted first, which the flavour decided.
                    let oracle = ring
                        .points
                        .iter()
                        .find(|p| p.hash >= hash)
                        .unwrap_or(&ring.points[0])
                        .server as usize;
                    assert_eq!(ring.owner(key.as_bytes()), Some(oracle), "{flavour:?}");
                }
                assert!(ring.points.windows(2).all(|w| w[0].hash <= w[1].hash));
            }
        }
    }

    #[test]
    fn twemproxy_ranks_servers_by_name_length_then_bytes() {
        // The rank decides which server owns keys at a point two servers
        // share (build_with sorts equal hashes by it), as twemproxy's server
        // order does after its stable sort of the continuum.
        let nodes: Vec<Node> = ["bb", "a", "ab"]
            .iter()
            .map(|name| Node {
                member: Member {
                    identity: name.to_string(),
                    weight: 1,
                },
                addr: format!("{name}.local:11211"),
                zone: None,
            })
            .collect();
        let (points, rank) = twemproxy::points(&nodes);
        assert_eq!(rank, vec![2, 0, 1], "a, ab, bb");
        assert_eq!(points.len(), 3 * 160);
    }

    #[test]
    fn replicas_walk_a_twemproxy_ring_too() {
        let spec = Spec {
            flavour: Flavour::Twemproxy,
            ..Spec::default()
        };
        let ring = Ring::build_with(&spec, nodes(4));
        let mut set = smallvec::SmallVec::new();
        for key in sample_keys(500) {
            ring.replicas(key.as_bytes(), 2, &mut set);
            assert_eq!(Some(set[0]), ring.owner(key.as_bytes()));
            assert_eq!(set.len(), 2);
            assert_ne!(set[0], set[1]);
        }
    }

    /// Six servers of weights 1..=3 in zones a (3 servers), b (2), c (1).
    fn zoned_nodes() -> Vec<Node> {
        let zones = ["a", "b", "a", "c", "b", "a"];
        servers(6)
            .into_iter()
            .enumerate()
            .map(|(i, mut member)| {
                member.weight = 1 + (i as u32 % 3);
                Node {
                    addr: format!("10.0.0.{i}:11211"),
                    member,
                    zone: Some(zones[i].to_string()),
                }
            })
            .collect()
    }

    /// The zone walk by a linear scan: the points from the first at or after
    /// the key's hash, round once; servers in zones not yet taken, then
    /// servers not yet taken.
    fn zoned_oracle(ring: &Ring, nodes: &[Node], key: &[u8], count: usize) -> Vec<usize> {
        let hash = ring.hash_key(key);
        let start = ring.points.iter().position(|p| p.hash >= hash).unwrap_or(0);
        let order: Vec<usize> = (0..ring.points.len())
            .map(|i| ring.points[(start + i) % ring.points.len()].server as usize)
            .collect();
        let wanted = count.min(nodes.len());
        let mut zones_taken: Vec<&Option<String>> = Vec::new();
        let mut out: Vec<usize> = Vec::new();
        for &server in &order {
            if out.len() < wanted && !zones_taken.contains(&&nodes[server].zone) {
                zones_taken.push(&nodes[server].zone);
                out.push(server);
            }
        }
        for &server in &order {
            if out.len() < wanted && !out.contains(&server) {
                out.push(server);
            }
        }
        out
    }

    #[test]
    fn zoned_replicas_match_a_linear_walk_oracle() {
        for flavour in [Flavour::Memring, Flavour::Twemproxy, Flavour::Libmemcached] {
            let spec = Spec {
                flavour,
                ..Spec::default()
            };
            let nodes = zoned_nodes();
            let ring = Ring::build_with(&spec, nodes.clone());
            let mut set = smallvec::SmallVec::new();
            for count in 1..=7 {
                for key in sample_keys(1500) {
                    ring.replicas(key.as_bytes(), count, &mut set);
                    let oracle = zoned_oracle(&ring, &nodes, key.as_bytes(), count);
                    assert_eq!(set.to_vec(), oracle, "{flavour:?} {count} {key}");
                }
            }
        }
    }

    #[test]
    fn zoned_replicas_keep_the_owner_and_take_each_zone_once() {
        for flavour in [Flavour::Memring, Flavour::Rendezvous, Flavour::Dalli] {
            let spec = Spec {
                flavour,
                ..Spec::default()
            };
            let nodes = zoned_nodes();
            let ring = Ring::build_with(&spec, nodes.clone());
            let plain = Ring::build_with(
                &spec,
                nodes
                    .iter()
                    .map(|n| Node {
                        zone: None,
                        ..n.clone()
                    })
                    .collect(),
            );
            let mut set = smallvec::SmallVec::new();
            for key in sample_keys(2000) {
                ring.replicas(key.as_bytes(), 3, &mut set);
                assert_eq!(Some(set[0]), plain.owner(key.as_bytes()), "{flavour:?}");
                let mut zones: Vec<_> = set.iter().map(|&s| ring.zone_of(s).unwrap()).collect();
                zones.sort_unstable();
                assert_eq!(zones, ["a", "b", "c"], "{flavour:?} {key}");
                ring.replicas(key.as_bytes(), 6, &mut set);
                let mut all = set.to_vec();
                all.sort_unstable();
                assert_eq!(all, [0, 1, 2, 3, 4, 5], "every server, each once");
            }
        }
    }

    #[test]
    fn a_zone_per_server_walks_as_without_zones() {
        let nodes: Vec<Node> = zoned_nodes()
            .into_iter()
            .enumerate()
            .map(|(i, n)| Node {
                zone: Some(format!("z{i}")),
                ..n
            })
            .collect();
        let plain: Vec<Node> = nodes
            .iter()
            .map(|n| Node {
                zone: None,
                ..n.clone()
            })
            .collect();
        let (zoned, plain) = (
            Ring::build_with(&Spec::default(), nodes),
            Ring::build_with(&Spec::default(), plain),
        );
        let (mut a, mut b) = (smallvec::SmallVec::new(), smallvec::SmallVec::new());
        for key in sample_keys(1000) {
            zoned.replicas(key.as_bytes(), 4, &mut a);
            plain.replicas(key.as_bytes(), 4, &mut b);
            assert_eq!(a, b);
        }
    }

    #[test]
    fn moved_share_of_identical_rings_is_zero() {
        assert_eq!(
            Ring::moved_share(&Ring::build(servers(3)), &Ring::build(servers(3))),
            0.0
        );
    }
}
