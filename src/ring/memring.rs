//! The memring flavour: each server gets `POINTS_PER_WEIGHT × weight` points,
//! each the xxh3 hash of `"<identity>-<index>"`, and a key is placed by its
//! xxh3 hash. 64-bit hashes make equal points vanishingly rare; when they do
//! meet, the smaller identity wins, so the order of the member list never
//! changes ownership. No I/O here.

use twox_hash::XxHash3_64;

use super::{Node, Point};

/// Points per server per unit of weight (as in libketama: 160 at weight 1).
pub const POINTS_PER_WEIGHT: u32 = 160;

/// The hash a key is placed by.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    XxHash3_64::oneshot(key)
}

fn point_hash(identity: &str, index: u32) -> u64 {
    // Names are short, so formatting into a stack buffer would save little; the
    // ring is built off the request path.
    XxHash3_64::oneshot(format!("{identity}-{index}").as_bytes())
}

/// The points of every node, and each node's rank for breaking ties (the
/// order of identities).
pub(super) fn points(nodes: &[Node]) -> (Vec<Point>, Vec<u32>) {
    let total: usize = nodes
        .iter()
        .map(|n| (n.member.weight * POINTS_PER_WEIGHT) as usize)
        .sum();
    let mut points = Vec::with_capacity(total);
    for (server, node) in nodes.iter().enumerate() {
        for index in 0..node.member.weight * POINTS_PER_WEIGHT {
            points.push(Point::new(point_hash(&node.member.identity, index), server));
        }
    }
    let mut by_identity: Vec<usize> = (0..nodes.len()).collect();
    by_identity.sort_by(|&a, &b| nodes[a].member.identity.cmp(&nodes[b].member.identity));
    let mut rank = vec![0u32; nodes.len()];
    for (position, &server) in by_identity.iter().enumerate() {
        rank[server] = position as u32;
    }
    (points, rank)
}
