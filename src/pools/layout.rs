//! The layout: the pools one process serves and the key-prefix routes
//! between them, which say on whose topology a request is planned. Immutable
//! and published through one `ArcSwap` by `control/pool_set.rs` (routes change with the
//! rest of a reload in one store); sessions load it once per request. It also
//! says which pools have a shadow pool, and which of their keys it gets.
//! No I/O.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::pools::topology::{SharedTopology, Topology};

/// One pool as sessions see it.
#[derive(Debug, Clone)]
pub struct PoolEntry {
    pub name: Arc<str>,
    pub topology: SharedTopology,
}

/// A pool's shadow as sessions see it (see `pools/shadow.rs`).
#[derive(Debug)]
pub struct ShadowLink {
    /// Index in [`Layout::pools`] of the shadow pool.
    pub pool: usize,
    pub(crate) sampler: crate::pools::shadow::Sampler,
    pub counters: Arc<crate::stats::ShadowCounters>,
}

/// A shadow pool that a new layout makes serve keys it did not serve: the
/// new default pool, or the pool of a new route (see
/// [`Layout::promotions`]).
#[derive(Debug)]
pub(crate) struct Promotion {
    pub(crate) shadow: Arc<str>,
    pub(crate) primary: Arc<str>,
    pub(crate) fraction: f64,
    pub(crate) counters: Arc<crate::stats::ShadowCounters>,
}

impl Promotion {
    /// Writes of its primary the shadow lacks so far.
    pub(crate) fn lost_writes(&self) -> u64 {
        self.counters.figures().lost_writes
    }

    /// Whether the shadow got every write of its primary's keys: none lost
    /// and every key sampled. Only then can it hold no value older than
    /// the primary's.
    pub(crate) fn complete(&self) -> bool {
        self.lost_writes() == 0 && self.fraction >= 1.0
    }
}

/// The routing table between pools.
#[derive(Debug)]
pub struct Layout {
    /// Per pool (as `pools`), its shadow; empty when no pool has one.
    shadows: Box<[Option<ShadowLink>]>,
    pools: Box<[PoolEntry]>,
    /// (prefix, index in `pools`), in config order: the first match wins.
    routes: Box<[(Box<[u8]>, usize)]>,
    /// Index in `pools` of the pool keys matching no route go to.
    default: usize,
    /// Per pool, the index of its gutter pool (`failover`), if it has one.
    gutters: Box<[Option<usize>]>,
}

/// The layout in force, shared by every session.
pub(crate) type SharedLayout = Arc<ArcSwap<Layout>>;

/// Which pool a key goes to now, as [`Layout::serving_key`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Serving {
    /// Index in [`Layout::pools`].
    pub(crate) pool: usize,
    /// When that pool is a gutter standing in for a DEAD server: the cap on
    /// expiry times of what is written there, in seconds.
    pub(crate) gutter_ttl: Option<u64>,
}

/// Runs of consecutive keys of one request that go to the same pool: (where
/// they go, key indexes).
pub(crate) type Runs = smallvec::SmallVec<[(Serving, std::ops::Range<usize>); 4]>;

impl Layout {
    /// A layout over `pools` with `routes` given as (prefix, pool name) and
    /// `default` the pool's name. Routes to a pool not in `pools` are left
    /// out, and an unknown default is the first pool (the config checks both).
    ///
    /// # Panics
    /// `pools` is empty.
    pub fn new(pools: Vec<PoolEntry>, routes: &[(String, String)], default: &str) -> Layout {
        assert!(!pools.is_empty(), "a layout has at least one pool");
        let index = |name: &str| pools.iter().position(|p| &*p.name == name);
        let routes = routes
            .iter()
            .filter_map(|(prefix, pool)| Some((prefix.as_bytes().into(), index(pool)?)))
            .collect();
        Layout {
            shadows: Box::new([]),
            default: index(default).unwrap_or(0),
            routes,
            gutters: vec![None; pools.len()].into_boxed_slice(),
            pools: pools.into_boxed_slice(),
        }
    }

    /// This layout with each (pool, gutter) pair of `failovers` (by name);
    /// pairs naming a pool not in the layout are left out.
    pub fn with_failovers(mut self, failovers: &[(String, String)]) -> Layout {
        for (pool, gutter) in failovers {
            let at = self.pools.iter().position(|p| &*p.name == pool);
            let to = self.pools.iter().position(|p| &*p.name == gutter);
            if let (Some(at), Some(to)) = (at, to) {
                self.gutters[at] = Some(to);
            }
        }
        self
    }

    /// Whether some pool has a gutter.
    #[inline]
    pub fn fails_over(&self) -> bool {
        self.gutters.iter().any(Option::is_some)
    }

    /// The pool that takes `key` now: `pool`, or its gutter when the
    /// server that owns `key` in `pool` is DEAD and failed over.
    fn serving(&self, pool: usize, key: &[u8]) -> usize {
        let Some(gutter) = self.gutters.get(pool).copied().flatten() else {
            return pool;
        };
        let topology = self.pools[pool].topology.load();
        match topology.owner_index(key) {
            Some(owner) if topology.failed_over(owner) => gutter,
            _ => pool,
        }
    }

    /// Where `key` goes now for a client bound to pool `bound` (of a pool's
    /// own listener), or chosen by the routes (`None`): that pool, or its
    /// gutter while the key's server there is DEAD and failed over.
    pub(crate) fn serving_key(&self, bound: Option<usize>, key: &[u8]) -> Serving {
        let pool = bound.unwrap_or_else(|| self.pool_of(key));
        let serving = self.serving(pool, key);
        let gutter_ttl = (serving != pool)
            .then(|| {
                let topology = self.pools[pool].topology.load();
                topology.config.failover.as_ref().map(|f| f.ttl.as_secs())
            })
            .flatten();
        Serving {
            pool: serving,
            gutter_ttl,
        }
    }

    /// The pool every request of a client bound to `bound` is planned on,
    /// when no route splits its keys (one pool serves them all); `None`
    /// when each key must be routed by [`Layout::pool_for_key`].
    pub(crate) fn fixed_pool<'a>(
        &'a self,
        bound: Option<&'a SharedTopology>,
    ) -> Option<&'a SharedTopology> {
        match self.bound_index(bound) {
            Err(gone) => Some(gone),
            Ok(bound) if !self.may_split(bound) => {
                let pool = bound.unwrap_or(self.default);
                Some(&self.pools[pool].topology)
            }
            Ok(_) => None,
        }
    }

    /// The pool a request with routing key `key` is planned on, for a
    /// client bound to `bound` (of a pool's own listener) or routed
    /// (`None`): its own, or that pool's gutter when the key's server is
    /// DEAD and failed over, with the gutter's TTL cap. `key` is asked for only when the layout routes by
    /// key (a meta `b` key is decoded only then). A bound pool a reload
    /// removed still serves its clients, unrouted.
    pub(crate) fn pool_for_key<'a, K: AsRef<[u8]>>(
        &'a self,
        bound: Option<&'a SharedTopology>,
        key: Option<impl FnOnce() -> K>,
    ) -> (&'a SharedTopology, Option<u64>) {
        let bound = match self.bound_index(bound) {
            Ok(bound) => bound,
            Err(gone) => return (gone, None),
        };
        let key = match key {
            Some(key) if self.may_split(bound) => key(),
            _ => {
                let pool = bound.unwrap_or(self.default);
                return (&self.pools[pool].topology, None);
            }
        };
        let serving = self.serving_key(bound, key.as_ref());
        (&self.pools[serving.pool].topology, serving.gutter_ttl)
    }

    /// The index of the pool a client is bound to (`bound`, a client of a
    /// pool's own listener: every key goes there), `None` when the routes
    /// choose; `Err` with the bound pool's topology when that pool left
    /// this layout.
    pub(crate) fn bound_index<'b>(
        &self,
        bound: Option<&'b SharedTopology>,
    ) -> Result<Option<usize>, &'b SharedTopology> {
        match bound {
            None => Ok(None),
            Some(bound) => self.index_of(bound).map(Some).ok_or(bound),
        }
    }

    /// Whether the keys of one request may go to more than one pool.
    #[inline]
    pub(crate) fn may_split(&self, bound: Option<usize>) -> bool {
        (self.routed() && bound.is_none()) || self.fails_over()
    }

    /// The keys `key(0..count)` of one request in runs of the same pool, in
    /// key order; one run when every key goes to the same pool.
    pub(crate) fn runs<'k>(
        &self,
        bound: Option<usize>,
        count: usize,
        key: impl Fn(usize) -> &'k [u8],
    ) -> Runs {
        let mut runs = Runs::new();
        for i in 0..count {
            let serving = self.serving_key(bound, key(i));
            match runs.last_mut() {
                Some((last, range)) if *last == serving => range.end = i + 1,
                _ => runs.push((serving, i..i + 1)),
            }
        }
        runs
    }

    /// The pools a `flush_all` reaches for a client bound to pool `bound`
    /// (of a pool's own listener) or routed (`None`): every pool a key of
    /// that client can be read from, so the bound pool or the default pool
    /// and every route's pool, each followed by its gutter; each once, in
    /// that order.
    pub(crate) fn reachable(&self, bound: Option<usize>) -> smallvec::SmallVec<[usize; 4]> {
        let mut pools = smallvec::SmallVec::<[usize; 4]>::new();
        let first = bound.unwrap_or(self.default);
        let routed = self.routes.iter().map(|&(_, pool)| pool);
        let served = std::iter::once(first).chain(routed.filter(|_| bound.is_none()));
        for pool in served {
            let gutter = self.gutters.get(pool).copied().flatten();
            for pool in std::iter::once(pool).chain(gutter) {
                if !pools.contains(&pool) {
                    pools.push(pool);
                }
            }
        }
        pools
    }

    /// One pool, every key to it.
    pub fn single(name: &str, topology: SharedTopology) -> Layout {
        Layout::new(
            vec![PoolEntry {
                name: name.into(),
                topology,
            }],
            &[],
            name,
        )
    }

    /// Index in [`Layout::pools`] of the pool `key` goes to.
    #[inline]
    pub fn pool_of(&self, key: &[u8]) -> usize {
        self.routes
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix))
            .map_or(self.default, |&(_, pool)| pool)
    }

    /// The pool `topology` is (or was) the topology of; `None` when that
    /// pool left this layout.
    pub(crate) fn pool_of_topology(&self, topology: &Topology) -> Option<&SharedTopology> {
        self.pools
            .iter()
            .map(|p| &p.topology)
            .find(|t| t.load().pool_id == topology.pool_id)
    }

    /// The default pool's topology now (requests without a key, limits).
    pub fn default_topology(&self) -> Arc<Topology> {
        self.pools[self.default].topology.load_full()
    }

    /// Whether keys may go to more than one pool.
    #[inline]
    pub fn routed(&self) -> bool {
        !self.routes.is_empty()
    }

    /// The digest of what places keys in every pool now and routes them
    /// between pools (see `ring/digest.rs`): `stats`' `ring_digest`.
    pub fn ring_digest(&self) -> u64 {
        let topologies: Vec<_> = self.pools.iter().map(|p| p.topology.load()).collect();
        let name = |i: usize| &*self.pools[i].name;
        let parts = crate::ring::digest::LayoutParts {
            pools: (0..self.pools.len())
                .map(|i| (name(i), topologies[i].ring_digest))
                .collect(),
            default: name(self.default),
            routes: self.routes.iter().map(|(p, i)| (&**p, name(*i))).collect(),
            failovers: (0..self.pools.len())
                .filter_map(|i| Some((name(i), name(self.gutters[i]?))))
                .collect(),
        };
        crate::ring::digest::layout_digest(&parts)
    }

    /// Every pool, in config order.
    pub fn pools(&self) -> &[PoolEntry] {
        &self.pools
    }

    /// The layout with these shadows: (primary, shadow, fraction) by pool
    /// name, each with its counters; pairs naming a pool not in the layout
    /// are left out (the config checks them).
    pub(crate) fn with_shadows(
        mut self,
        shadows: impl IntoIterator<Item = (String, String, f64, crate::stats::ShadowCounters)>,
    ) -> Layout {
        let mut links: Vec<Option<ShadowLink>> = (0..self.pools.len()).map(|_| None).collect();
        let index = |name: &str| self.pools.iter().position(|p| &*p.name == name);
        let mut any = false;
        for (primary, shadow, fraction, counters) in shadows {
            if let (Some(primary), Some(shadow)) = (index(&primary), index(&shadow)) {
                any = true;
                links[primary] = Some(ShadowLink {
                    pool: shadow,
                    sampler: crate::pools::shadow::Sampler::new(fraction),
                    counters: Arc::new(counters),
                });
            }
        }
        if any {
            self.shadows = links.into_boxed_slice();
        }
        self
    }

    /// The shadow of pool `pool` (an index in [`Layout::pools`]), if any.
    #[inline]
    pub fn shadow_of(&self, pool: usize) -> Option<&ShadowLink> {
        self.shadows.get(pool)?.as_ref()
    }

    /// The shadows of this layout that a layout whose default pool is
    /// `default` and whose routes are `routes` (prefix, pool name) makes
    /// serve keys they do not serve now: it is the new default pool, or the
    /// pool of a route this layout does not have.
    pub(crate) fn promotions(&self, default: &str, routes: &[(String, String)]) -> Vec<Promotion> {
        let name = |pool: usize| &*self.pools[pool].name;
        let serves_new_keys = |shadow: &str| {
            (default == shadow && self.default_name() != shadow)
                || routes.iter().any(|(prefix, pool)| {
                    pool == shadow
                        && !self
                            .routes
                            .iter()
                            .any(|(p, at)| **p == *prefix.as_bytes() && name(*at) == shadow)
                })
        };
        (0..self.pools.len())
            .filter_map(|primary| {
                let link = self.shadow_of(primary)?;
                let shadow = &self.pools[link.pool].name;
                serves_new_keys(shadow).then(|| Promotion {
                    shadow: shadow.clone(),
                    primary: self.pools[primary].name.clone(),
                    fraction: link.sampler.fraction(),
                    counters: link.counters.clone(),
                })
            })
            .collect()
    }

    /// The pools keys move between when this layout's routing gives way to
    /// one whose default pool is `default` and whose routes are `routes`
    /// (prefix, pool name): each (pool before, pool after) once, by name.
    /// Which pool a key goes to depends only on which route prefixes it
    /// starts with, and those are the prefixes its longest matching prefix
    /// starts with; so the empty key and each prefix of either routing
    /// stand for every key.
    pub(crate) fn moves(
        &self,
        default: &str,
        routes: &[(String, String)],
    ) -> Vec<(Arc<str>, String)> {
        let after = |key: &[u8]| routed_to(key, default, routes);
        let keys = std::iter::once(&[][..])
            .chain(self.routes.iter().map(|(prefix, _)| &**prefix))
            .chain(routes.iter().map(|(prefix, _)| prefix.as_bytes()));
        let mut moves: Vec<(Arc<str>, String)> = Vec::new();
        for key in keys {
            let (from, to) = (&self.pools[self.pool_of(key)].name, after(key));
            if **from != *to && !moves.iter().any(|(f, t)| f == from && t == to) {
                moves.push((from.clone(), to.to_string()));
            }
        }
        moves
    }

    /// Whether `key` is one the routing with default pool `default` and
    /// `routes` (as for [`Layout::moves`]) sends to pool `to` while this
    /// layout sends it to another pool, other than those in `exempt`: a
    /// moved key `to` may hold an older value of.
    pub(crate) fn moves_into(
        &self,
        key: &[u8],
        default: &str,
        routes: &[(String, String)],
        to: &str,
        exempt: &[Arc<str>],
    ) -> bool {
        let from = &self.pools[self.pool_of(key)].name;
        routed_to(key, default, routes) == to && **from != *to && !exempt.contains(from)
    }

    /// Whether any pool has a shadow.
    #[inline]
    pub fn shadowed(&self) -> bool {
        !self.shadows.is_empty()
    }

    /// Index in [`Layout::pools`] of the pool whose topology is `topology`.
    pub fn index_of(&self, topology: &SharedTopology) -> Option<usize> {
        self.pools
            .iter()
            .position(|p| Arc::ptr_eq(&p.topology, topology))
    }

    /// The name of the pool keys matching no route go to.
    pub fn default_name(&self) -> &str {
        &self.pools[self.default].name
    }
}

/// The pool a routing with default pool `default` and `routes` (prefix,
/// pool name; the first match wins) sends `key` to.
fn routed_to<'r>(key: &[u8], default: &'r str, routes: &'r [(String, String)]) -> &'r str {
    routes
        .iter()
        .find(|(prefix, _)| key.starts_with(prefix.as_bytes()))
        .map_or(default, |(_, pool)| pool.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(routes: &[(&str, &str)], default: &str) -> Layout {
        let config = crate::config::Config::parse(
            "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n",
            "t.toml",
        )
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let hooks = crate::backend::PoolHooks {
            health_changed: Arc::new(tokio::sync::Notify::new()),
            stats: Arc::new(crate::stats::Stats::new()),
            tls: None,
            pool: "a".into(),
        };
        let config = Arc::new(config);
        let entry = |name: &str| PoolEntry {
            name: name.into(),
            topology: Arc::new(ArcSwap::from_pointee(Topology::assemble(
                config.clone(),
                1,
                Topology::backends_for(&config, None, &hooks),
                Vec::new(),
            ))),
        };
        let routes: Vec<(String, String)> = routes
            .iter()
            .map(|(p, n)| (p.to_string(), n.to_string()))
            .collect();
        Layout::new(vec![entry("a"), entry("b"), entry("c")], &routes, default)
    }

    #[test]
    fn keys_of_one_request_go_in_runs_of_the_same_pool_in_key_order() {
        let layout = layout(&[("b:", "b"), ("c:", "c")], "a");
        let keys: [&[u8]; 6] = [b"b:1", b"b:2", b"x", b"c:1", b"b:3", b"y"];
        let pool = |pool| Serving {
            pool,
            gutter_ttl: None,
        };
        let runs = layout.runs(None, keys.len(), |i| keys[i]);
        assert_eq!(
            runs.to_vec(),
            vec![
                (pool(1), 0..2),
                (pool(0), 2..3),
                (pool(2), 3..4),
                (pool(1), 4..5),
                (pool(0), 5..6)
            ]
        );
        assert!(layout.may_split(None));
        // A client of pool c's own listener: every key to c, one run.
        assert_eq!(
            layout.runs(Some(2), keys.len(), |i| keys[i]).to_vec(),
            vec![(pool(2), 0..6)]
        );
        assert!(!layout.may_split(Some(2)), "no routes for a bound client");
        let unrouted = super::Layout::new(layout.pools().to_vec(), &[], "a");
        assert!(!unrouted.may_split(None));
    }

    #[test]
    fn the_first_matching_prefix_wins_and_the_rest_go_to_the_default() {
        let layout = layout(&[("sess:", "b"), ("se", "c"), ("user:", "a")], "c");
        assert_eq!(layout.pool_of(b"sess:1"), 1);
        assert_eq!(layout.pool_of(b"sex"), 2);
        assert_eq!(layout.pool_of(b"user:9"), 0);
        assert_eq!(layout.pool_of(b"other"), 2);
        assert_eq!(layout.pool_of(b"sess"), 2, "a key shorter than the prefix");
        assert!(layout.routed());
        assert_eq!(layout.default_name(), "c");
    }

    #[test]
    fn flush_all_reaches_every_pool_a_client_can_read_and_their_gutters() {
        let layout = layout(&[("b:", "b"), ("b2:", "b")], "a")
            .with_failovers(&[("b".to_string(), "c".to_string())]);
        assert_eq!(layout.reachable(None).to_vec(), vec![0, 1, 2]);
        assert_eq!(layout.reachable(Some(1)).to_vec(), vec![1, 2], "bound to b");
        assert_eq!(layout.reachable(Some(0)).to_vec(), vec![0], "bound to a");
        let unrouted = Layout::new(layout.pools().to_vec(), &[], "b");
        assert_eq!(unrouted.reachable(None).to_vec(), vec![1]);
    }

    #[test]
    fn a_shadow_is_promoted_when_it_becomes_the_default_pool_or_gets_a_new_route() {
        let stats = crate::stats::Stats::new();
        let layout = layout(&[("b:", "b")], "a").with_shadows([
            (
                "a".to_string(),
                "c".to_string(),
                1.0,
                stats.shadow_counters("a", "c"),
            ),
            (
                "b".to_string(),
                "a".to_string(),
                0.5,
                stats.shadow_counters("b", "a"),
            ),
        ]);
        let routes = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(p, n)| (p.to_string(), n.to_string()))
                .collect()
        };
        let names = |promotions: Vec<Promotion>| -> Vec<(String, String)> {
            promotions
                .iter()
                .map(|p| (p.shadow.to_string(), p.primary.to_string()))
                .collect()
        };
        assert!(layout.promotions("a", &routes(&[("b:", "b")])).is_empty());
        assert_eq!(
            names(layout.promotions("c", &routes(&[("b:", "b")]))),
            [("c".to_string(), "a".to_string())]
        );
        // `a` is b's shadow and already the default: a new route to it is
        // a promotion, its old ones are not.
        assert_eq!(
            names(layout.promotions("a", &routes(&[("b:", "b"), ("x:", "a")]))),
            [("a".to_string(), "b".to_string())]
        );
        let promotions = layout.promotions("c", &routes(&[("b:", "c")]));
        assert_eq!(promotions.len(), 1);
        assert!(promotions[0].complete(), "nothing lost, every key sampled");
        promotions[0].counters.lost_write();
        assert!(!promotions[0].complete());
        let half = layout.promotions("a", &routes(&[("x:", "a")]));
        assert!(!half[0].complete(), "half the keys were never copied");
    }

    #[test]
    fn the_pools_keys_move_between_are_found_for_every_routing_change() {
        let layout = layout(&[("b:", "b"), ("c:", "c")], "a");
        let routes = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(p, n)| (p.to_string(), n.to_string()))
                .collect()
        };
        let moves = |default: &str, list: &[(&str, &str)]| -> Vec<(String, String)> {
            layout
                .moves(default, &routes(list))
                .into_iter()
                .map(|(from, to)| (from.to_string(), to))
                .collect()
        };
        let pair = |from: &str, to: &str| (from.to_string(), to.to_string());
        assert!(moves("a", &[("b:", "b"), ("c:", "c")]).is_empty());
        // A route removed: its keys go back to the default pool.
        assert_eq!(moves("a", &[("c:", "c")]), [pair("b", "a")]);
        // A route added, also one longer than an existing one.
        assert_eq!(
            moves("a", &[("b:x", "c"), ("b:", "b"), ("c:", "c"), ("d:", "b")]),
            [pair("b", "c"), pair("a", "b")]
        );
        // The default pool changed: keys matching no route move.
        assert_eq!(moves("c", &[("b:", "b"), ("c:", "c")]), [pair("a", "c")]);
        // Routes reordered so that another one wins.
        let nested = super::Layout::new(
            layout.pools().to_vec(),
            &routes(&[("b:", "b"), ("b:1", "c")]),
            "a",
        );
        let swapped = nested.moves("a", &routes(&[("b:1", "c"), ("b:", "b")]));
        assert_eq!(swapped.len(), 1);
        assert_eq!((&*swapped[0].0, swapped[0].1.as_str()), ("b", "c"));
    }

    #[test]
    fn only_keys_that_another_pool_served_move_into_a_pool() {
        let layout = layout(&[("b:", "b"), ("c:", "c")], "a");
        let routes = vec![("c:".to_string(), "c".to_string())];
        let none: &[Arc<str>] = &[];
        // The `b:` route removed: its keys move into a, a's own keys stay.
        assert!(layout.moves_into(b"b:1", "a", &routes, "a", none));
        assert!(!layout.moves_into(b"user:1", "a", &routes, "a", none));
        assert!(!layout.moves_into(b"c:1", "a", &routes, "a", none));
        assert!(!layout.moves_into(b"b:1", "a", &routes, "c", none));
        // Nothing for keys of a pool it is the complete shadow of.
        assert!(!layout.moves_into(b"b:1", "a", &routes, "a", &["b".into()]));
        // default_pool switched to c: keys matching no route move into c.
        let all = vec![
            ("b:".to_string(), "b".to_string()),
            ("c:".to_string(), "c".to_string()),
        ];
        assert!(layout.moves_into(b"user:1", "c", &all, "c", none));
        assert!(!layout.moves_into(b"c:1", "c", &all, "c", none));
        assert!(!layout.moves_into(b"b:1", "c", &all, "c", none));
    }

    #[test]
    fn without_routes_every_key_goes_to_the_default_pool() {
        let layout = layout(&[], "b");
        assert!(!layout.routed());
        assert_eq!(layout.pool_of(b"sess:1"), 1);
    }

    #[test]
    fn a_request_is_planned_on_its_pools_topology_and_a_removed_bound_pool_still_serves() {
        let layout = layout(&[("b:", "b")], "a");
        let on = |bound: Option<&SharedTopology>, key: &'static [u8]| {
            let (pool, ttl) = layout.pool_for_key(bound, Some(|| key));
            assert_eq!(ttl, None, "no gutter here");
            layout
                .pools()
                .iter()
                .position(|p| Arc::ptr_eq(&p.topology, pool))
        };
        assert_eq!(on(None, b"b:1"), Some(1), "routed by prefix");
        assert_eq!(on(None, b"x"), Some(0), "the default pool");
        let c = layout.pools()[2].topology.clone();
        assert_eq!(
            on(Some(&c), b"b:1"),
            Some(2),
            "a bound client ignores routes"
        );
        // Pool c leaves the layout: its clients keep being served by it.
        let without_c = Layout::new(layout.pools()[..2].to_vec(), &[], "a");
        assert!(without_c.bound_index(Some(&c)).is_err());
        let (pool, _) = without_c.pool_for_key(Some(&c), Some(|| b"b:1"));
        assert!(Arc::ptr_eq(pool, &c));
    }

    #[test]
    fn a_topology_is_fixed_for_a_client_only_when_no_route_can_split_its_keys() {
        let layout = layout(&[("b:", "b")], "a");
        assert!(layout.fixed_pool(None).is_none(), "routes choose per key");
        let c = layout.pools()[2].topology.clone();
        let bound = layout.fixed_pool(Some(&c)).expect("bound to c");
        assert!(Arc::ptr_eq(bound, &c));
        let unrouted = Layout::new(layout.pools().to_vec(), &[], "a");
        let fixed = unrouted.fixed_pool(None).expect("no routes");
        assert!(Arc::ptr_eq(fixed, &layout.pools()[0].topology));
        // Pool c leaves: its bound clients stay on it.
        let without_c = Layout::new(layout.pools()[..2].to_vec(), &[], "a");
        let gone = without_c.fixed_pool(Some(&c)).expect("still c");
        assert!(Arc::ptr_eq(gone, &c));
    }
}
