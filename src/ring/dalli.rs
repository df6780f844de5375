//! The Dalli flavour: the ring of Ruby's Dalli client (`Rails.cache` with
//! `:mem_cache_store`), so memring places every key on the server a Dalli
//! client picks.
//!
//! What Dalli 3.0 computes (`Dalli::Ring`):
//! - a server's name is `"<host>:<port>"`, the port always written (11211
//!   too) and an IPv6 host without brackets; names configured in memring play
//!   no part (the client has none);
//! - a server gets `floor(servers × 160 × weight / total_weight)` points (a
//!   double-precision division), point `i` the first four bytes, big-endian,
//!   of the SHA-1 of `"<name>:<i>"`;
//! - a key's hash is its CRC-32 (zlib's), and the key belongs to the point
//!   *at or below* that hash, wrapping to the highest point: the opposite
//!   direction to ketama's.
//!
//! The shared ring only searches upwards, so this flavour stores every point
//! and key hash complemented (`!h`): "the highest point at or below `h`" is
//! then "the lowest point at or above `!h`", wrapping alike. Shares and moved
//! shares measure the same arcs. Equal points of two servers are ordered by
//! config position (Dalli's order for them is that of Ruby's unstable sort,
//! which no config can pin down; at 32 bits they are rare). No I/O here.

use super::{sha1, Node, Point};

/// Points of a server at an average weight (Dalli's `POINTS_PER_SERVER`).
pub const POINTS_PER_SERVER: u64 = 160;

/// The name Dalli hashes a server's points by, for the `host:port` memring
/// connects to.
pub fn server_name(addr: &str) -> String {
    super::rendezvous::node_name(addr)
}

/// Points of a server of `weight` among `servers` weighing `total_weight`.
pub fn points_per_server(weight: u32, total_weight: u32, servers: usize) -> u32 {
    let product = servers as u64 * POINTS_PER_SERVER * u64::from(weight);
    (product as f64 / f64::from(total_weight)).floor() as u32
}

/// Point `index` of the server named `name`, before complementing.
pub fn point_value(name: &str, index: u32) -> u32 {
    let digest = sha1::digest(format!("{name}:{index}").as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// The points of every node (complemented), and each node's rank for
/// breaking ties (its position).
pub(super) fn points(nodes: &[Node]) -> (Vec<Point>, Vec<u32>) {
    let total_weight: u32 = nodes.iter().map(|n| n.member.weight).sum();
    let mut points = Vec::new();
    for (server, node) in nodes.iter().enumerate() {
        let name = server_name(&node.addr);
        for index in 0..points_per_server(node.member.weight, total_weight, nodes.len()) {
            points.push(Point::from_u32(!point_value(&name, index), server));
        }
    }
    (points, (0..nodes.len() as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{golden_nodes, golden_owners, Flavour, HashFunction, Member, Ring, Spec};

    fn spec() -> Spec {
        Spec {
            flavour: Flavour::Dalli,
            ..Spec::default()
        }
    }

    #[test]
    fn golden_owners_from_real_dalli() {
        // Produced by Dalli 3.0.6 (Debian ruby-dalli) on Ruby 3.1:
        // Dalli::Ring over Dalli::Protocol::Binary servers
        // "127.0.0.1:21301:<weight>".."127.0.0.1:21304:<weight>", then for each
        // key the index of ring.send(:server_for_hash_key, Zlib.crc32(key)).
        // Its continuum had 640 points at equal weights, 638 at 1:2:3:1.
        let equal = Ring::build_with(&spec(), golden_nodes([1, 1, 1, 1], None));
        assert_eq!(equal.point_count(), 640);
        assert_eq!(
            golden_owners(&equal),
            [3, 3, 2, 1, 2, 3, 2, 0, 1, 2, 1, 3, 0, 1, 0, 1]
        );
        // Names play no part.
        let names = Some(["d", "c", "b", "a"]);
        let weighted = Ring::build_with(&spec(), golden_nodes([1, 2, 3, 1], names));
        assert_eq!(weighted.point_count(), 638);
        assert_eq!(
            golden_owners(&weighted),
            [3, 3, 2, 1, 2, 3, 2, 1, 1, 1, 1, 3, 3, 1, 0, 1]
        );
    }

    #[test]
    fn owner_matches_a_linear_scan_of_dallis_continuum() {
        // Dalli's lookup written out: the highest point at or below the key's
        // CRC-32, else the highest point of all.
        for weights in [vec![1u32], vec![1, 1, 1], vec![2, 1, 5, 1, 1, 3, 1, 1]] {
            let nodes: Vec<Node> = weights
                .iter()
                .enumerate()
                .map(|(i, &weight)| Node {
                    member: Member {
                        identity: format!("s{i}"),
                        weight,
                    },
                    addr: format!("10.1.0.{i}:{}", 11211 + i),
                    zone: None,
                })
                .collect();
            let total: u32 = weights.iter().sum();
            let mut continuum: Vec<(u32, usize)> = Vec::new();
            for (server, node) in nodes.iter().enumerate() {
                let count = points_per_server(node.member.weight, total, nodes.len());
                for index in 0..count {
                    continuum.push((point_value(&server_name(&node.addr), index), server));
                }
            }
            let ring = Ring::build_with(&spec(), nodes);
            for i in 0..2000 {
                let key = format!("user:{i}:profile");
                let hash = HashFunction::Crc32a.hash(key.as_bytes());
                let below = continuum.iter().filter(|p| p.0 <= hash).max_by_key(|p| p.0);
                let oracle = below.or_else(|| continuum.iter().max_by_key(|p| p.0));
                assert_eq!(ring.owner(key.as_bytes()), oracle.map(|p| p.1), "{key}");
            }
        }
    }

    #[test]
    fn points_follow_dallis_formula_and_names() {
        assert_eq!(points_per_server(1, 4, 4), 160);
        assert_eq!(points_per_server(1, 7, 4), 91);
        assert_eq!(points_per_server(3, 7, 4), 274);
        assert_eq!(points_per_server(1, 3, 3), 160);
        assert_eq!(server_name("[::1]:11211"), "::1:11211");
        assert_eq!(server_name("cache.local:11211"), "cache.local:11211");
        // CRC-32 as zlib computes it (Zlib.crc32("abc") in Ruby).
        assert_eq!(HashFunction::Crc32a.hash(b"abc"), 0x3524_41c2);
    }
}
