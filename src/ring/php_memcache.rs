//! The php-memcache flavour: PHP's `memcache` extension (PECL memcache 3.x
//! and 4.x) with `memcache.hash_strategy = consistent` (its default), so
//! memring places every key on the server a PHP client using `Memcache`
//! picks.
//!
//! What the extension computes:
//! - a server's points are named `"<host>:<port>-<i>"`, host and port as
//!   given to `addServer` (memring takes them from `addr`; `name` plays no
//!   part), `160 × weight` of them, each the hash of its name;
//! - the hash is `memcache.hash_function`: `crc32` (its default; zlib's
//!   CRC-32, memring's `crc32a`) or `fnv` (32-bit FNV-1a over key bytes read
//!   as signed `char`, memring's `fnv1a_32`), for points and keys alike;
//! - a key is not placed by its own hash: the extension precomputes 1024
//!   buckets, bucket `b` owned by the first point at or after
//!   `b × floor((2^32 - 1) / 1024)`, and a key goes to bucket
//!   `hash mod 1024`. So this flavour's key position is that bucket's
//!   position, and the shared search does the rest;
//! - the key hashed is the one sent (after the extension's own changes:
//!   its `memcache.key_prefix`, and bytes up to space replaced by `_`).
//!
//! Equal points of two servers go to the one listed first (the extension
//! sorts with `qsort`, whose order for them is unspecified). No I/O here.

use super::hashkit::HashFunction;
use super::{Node, Point};

/// Points per unit of weight (`MMC_CONSISTENT_POINTS`).
pub const POINTS_PER_WEIGHT: u32 = 160;

/// Buckets keys are placed through (`MMC_CONSISTENT_BUCKETS`).
pub const BUCKETS: u32 = 1024;

/// Distance between two buckets' positions on the circle.
const BUCKET_STEP: u32 = u32::MAX / BUCKETS;

/// The extension's hash for `memring`'s `hash` setting: `fnv1a_32` is its
/// `fnv`, anything else its default `crc32`.
pub fn function(hash: HashFunction) -> HashFunction {
    match hash {
        HashFunction::Fnv1a32 => HashFunction::Fnv1a32,
        _ => HashFunction::Crc32a,
    }
}

/// The PHP ini name of a hash this flavour uses.
pub fn ini_name(hash: HashFunction) -> &'static str {
    match function(hash) {
        HashFunction::Fnv1a32 => "fnv",
        _ => "crc32",
    }
}

/// The position a key whose hash is `hash` is placed at: its bucket's.
#[inline]
pub fn key_position(hash: u32) -> u32 {
    BUCKET_STEP * (hash % BUCKETS)
}

/// The points of every node, and each node's rank for breaking ties (its
/// position).
pub(super) fn points(nodes: &[Node], hash: HashFunction) -> (Vec<Point>, Vec<u32>) {
    let hash = function(hash);
    let mut points = Vec::new();
    for (server, node) in nodes.iter().enumerate() {
        let name = super::rendezvous::node_name(&node.addr);
        for index in 0..node.member.weight * POINTS_PER_WEIGHT {
            let point = hash.hash(format!("{name}-{index}").as_bytes());
            points.push(Point::from_u32(point, server));
        }
    }
    (points, (0..nodes.len() as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{golden_nodes, golden_owners, Flavour, Member, Ring, Spec};

    fn spec(hash: HashFunction) -> Spec {
        Spec {
            flavour: Flavour::PhpMemcache,
            hash,
            hash_tag: None,
        }
    }

    #[test]
    fn golden_owners_from_real_php_memcache() {
        // Produced by PHP 8.2 with Debian php-memcache 4.0.5.2: ini
        // memcache.hash_strategy = consistent and hash_function crc32 or fnv,
        // addServer("127.0.0.1", 21301..=21304, false, weight), then for
        // each key the index of findServer(key).
        let golden: [(HashFunction, [u32; 4], [usize; 16]); 4] = [
            (
                HashFunction::Crc32a,
                [1, 1, 1, 1],
                [1, 0, 3, 1, 2, 3, 0, 1, 1, 1, 3, 3, 3, 0, 0, 0],
            ),
            (
                HashFunction::Crc32a,
                [1, 2, 3, 1],
                [1, 0, 3, 2, 2, 2, 0, 1, 2, 1, 2, 1, 2, 0, 1, 0],
            ),
            (
                HashFunction::Fnv1a32,
                [1, 1, 1, 1],
                [0, 3, 1, 3, 3, 3, 2, 2, 0, 2, 0, 3, 3, 2, 3, 2],
            ),
            (
                HashFunction::Fnv1a32,
                [1, 2, 3, 1],
                [0, 2, 1, 3, 3, 3, 2, 1, 2, 2, 1, 3, 2, 2, 3, 2],
            ),
        ];
        for (hash, weights, owners) in golden {
            let ring = Ring::build_with(&spec(hash), golden_nodes(weights, None));
            assert_eq!(golden_owners(&ring), owners, "{hash:?} {weights:?}");
        }
    }

    #[test]
    fn owner_matches_a_linear_scan_of_the_extensions_buckets() {
        // The extension written out: 1024 buckets, each owned by the first
        // point at or after its position (else the lowest point); a key goes
        // to bucket hash mod 1024.
        for hash in [HashFunction::Crc32a, HashFunction::Fnv1a32] {
            for weights in [vec![1u32], vec![1, 1, 1], vec![2, 1, 5, 1, 1, 3, 1, 1]] {
                let nodes: Vec<Node> = weights
                    .iter()
                    .enumerate()
                    .map(|(i, &weight)| Node {
                        member: Member {
                            identity: format!("s{i}"),
                            weight,
                        },
                        addr: format!("10.2.0.{i}:{}", 11211 + i),
                        zone: None,
                    })
                    .collect();
                let mut points: Vec<(u32, usize)> = Vec::new();
                for (server, node) in nodes.iter().enumerate() {
                    for index in 0..node.member.weight * POINTS_PER_WEIGHT {
                        let name = format!("{}-{index}", node.addr);
                        points.push((hash.hash(name.as_bytes()), server));
                    }
                }
                let step = 0xffff_ffffu32 / 1024;
                let buckets: Vec<usize> = (0..1024u32)
                    .map(|b| {
                        let at = step * b;
                        let above = points.iter().filter(|p| p.0 >= at).min_by_key(|p| p.0);
                        above
                            .or_else(|| points.iter().min_by_key(|p| p.0))
                            .unwrap()
                            .1
                    })
                    .collect();
                let ring = Ring::build_with(&spec(hash), nodes);
                for i in 0..2000 {
                    let key = format!("user:{i}:profile\u{e9}");
                    let bucket = hash.hash(key.as_bytes()) % 1024;
                    assert_eq!(
                        ring.owner(key.as_bytes()),
                        Some(buckets[bucket as usize]),
                        "{hash:?} {key}"
                    );
                }
            }
        }
    }

    #[test]
    fn hash_names_follow_php() {
        assert_eq!(ini_name(HashFunction::Crc32a), "crc32");
        assert_eq!(ini_name(HashFunction::Fnv1a32), "fnv");
        assert_eq!(function(HashFunction::Fnv1a64), HashFunction::Crc32a);
        assert_eq!(key_position(1025), BUCKET_STEP);
    }
}
