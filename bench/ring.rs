//! Consistent-hash ring benches: `Ring::owner` lookups and `Ring::build`.
//!
//! `owner` runs once per key of every request (for a multi-get, once per key),
//! so it is on the hot path; the target is under 50 ns per lookup at 100
//! servers. `build` runs only when the topology is loaded or reloaded, off the
//! request path, so it only needs to stay well below a reload's debounce time.
//! Both are measured at 4, 100 and 1000 servers of weight 1 (160 points each).
//!
//! Run: `cargo bench --bench ring -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use memring::ring::{Flavour, HashFunction, Member, Node, Ring, Spec, POINTS_PER_WEIGHT};

/// Server counts: a small pool, a large one, and an extreme one whose points no
/// longer fit in a core's L2 cache.
const SERVER_COUNTS: [usize; 3] = [4, 100, 1000];

/// Distinct keys cycled through by the lookup bench: enough that hashes land all
/// over the ring (so the binary search does not always take the same, cached
/// path), few enough that the keys themselves stay in cache. A power of two so
/// the cycle index is a mask.
const LOOKUP_KEYS: usize = 1024;

fn members(servers: usize) -> Vec<Member> {
    (0..servers)
        .map(|i| Member {
            identity: format!("10.0.{}.{}:11211", i / 256, i % 256),
            weight: 1,
        })
        .collect()
}

/// Keys shaped like real ones, built once outside the timed loop.
fn lookup_keys() -> Vec<Vec<u8>> {
    (0..LOOKUP_KEYS)
        .map(|i| format!("user:{i}:profile").into_bytes())
        .collect()
}

/// One `Ring::owner` per iteration (key hash plus binary search over the
/// points), cycling through the pre-generated keys.
fn ring_lookup(c: &mut Criterion) {
    let keys = lookup_keys();
    let mut group = c.benchmark_group("ring_owner");
    group.throughput(Throughput::Elements(1));
    for servers in SERVER_COUNTS {
        let ring = Ring::build(members(servers));
        assert_eq!(ring.point_count(), servers * POINTS_PER_WEIGHT as usize);
        group.bench_with_input(BenchmarkId::from_parameter(servers), &ring, |b, ring| {
            let mut next = 0usize;
            b.iter(|| {
                let key = &keys[next & (LOOKUP_KEYS - 1)];
                next = next.wrapping_add(1);
                ring.owner(black_box(key))
            })
        });
    }
    group.finish();
}

/// One `Ring::owner` per iteration on the compatibility rings at 100 servers:
/// the key hash differs (fnv1a_64, md5, crc32 and crc32a for twemproxy, md5
/// for libmemcached, crc32 for Dalli and PHP memcache), the binary search is
/// the same.
fn ring_lookup_flavours(c: &mut Criterion) {
    let keys = lookup_keys();
    let mut group = c.benchmark_group("ring_owner_flavour");
    group.throughput(Throughput::Elements(1));
    let nodes: Vec<Node> = members(100)
        .into_iter()
        .map(|member| Node {
            addr: member.identity.clone(),
            member,
            zone: None,
        })
        .collect();
    let flavours = [
        (
            "twemproxy_fnv1a_64",
            Flavour::Twemproxy,
            HashFunction::Fnv1a64,
        ),
        ("twemproxy_md5", Flavour::Twemproxy, HashFunction::Md5),
        ("twemproxy_crc32", Flavour::Twemproxy, HashFunction::Crc32),
        ("twemproxy_crc32a", Flavour::Twemproxy, HashFunction::Crc32a),
        ("libmemcached", Flavour::Libmemcached, HashFunction::Md5),
        ("dalli", Flavour::Dalli, HashFunction::Crc32a),
        (
            "php_memcache_crc32",
            Flavour::PhpMemcache,
            HashFunction::Crc32a,
        ),
    ];
    for (label, flavour, hash) in flavours {
        let spec = Spec {
            flavour,
            hash,
            ..Spec::default()
        };
        let ring = Ring::build_with(&spec, nodes.clone());
        group.bench_with_input(BenchmarkId::from_parameter(label), &ring, |b, ring| {
            let mut next = 0usize;
            b.iter(|| {
                let key = &keys[next & (LOOKUP_KEYS - 1)];
                next = next.wrapping_add(1);
                ring.owner(black_box(key))
            })
        });
    }
    group.finish();
}

/// One `Ring::owner` per iteration on a rendezvous ring (pymemcache's
/// `HashClient`), which scores the key on every server: its cost grows with
/// the server count, so it is measured at 4, 32 and 256 servers.
fn ring_lookup_rendezvous(c: &mut Criterion) {
    let keys = lookup_keys();
    let mut group = c.benchmark_group("ring_owner_rendezvous");
    group.throughput(Throughput::Elements(1));
    let spec = Spec {
        flavour: Flavour::Rendezvous,
        ..Spec::default()
    };
    for servers in [4usize, 32, 256] {
        let nodes: Vec<Node> = members(servers)
            .into_iter()
            .map(|member| Node {
                addr: member.identity.clone(),
                member,
                zone: None,
            })
            .collect();
        let ring = Ring::build_with(&spec, nodes);
        group.bench_with_input(BenchmarkId::from_parameter(servers), &ring, |b, ring| {
            let mut next = 0usize;
            b.iter(|| {
                let key = &keys[next & (LOOKUP_KEYS - 1)];
                next = next.wrapping_add(1);
                ring.owner(black_box(key))
            })
        });
    }
    group.finish();
}

/// One `Ring::build` per iteration: hashing every point's name, then sorting.
/// The member list is cloned outside the timing, since `build` consumes it.
/// Throughput is in points placed.
fn ring_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_build");
    // A 1000-server build takes milliseconds; ten samples keep the run short.
    group.sample_size(10);
    for servers in SERVER_COUNTS {
        let list = members(servers);
        group.throughput(Throughput::Elements(
            (servers * POINTS_PER_WEIGHT as usize) as u64,
        ));
        group.bench_with_input(BenchmarkId::from_parameter(servers), &list, |b, list| {
            b.iter_batched(|| list.clone(), Ring::build, BatchSize::SmallInput)
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    ring_lookup,
    ring_lookup_flavours,
    ring_lookup_rendezvous,
    ring_build
);
criterion_main!(benches);
