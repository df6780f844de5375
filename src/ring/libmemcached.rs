//! The libmemcached flavour: libmemcached's weighted ketama with MD5, which is
//! what pylibmc's `ketama_weighted` behavior and PHP memcached's
//! libketama-compatible mode compute on the client side.
//!
//! - Points are named by the server's host and port, `"<host>:<port>-<index>"`,
//!   or `"<host>-<index>"` when the port is 11211; configured names play no
//!   part (libmemcached has none).
//! - Points per server and four points per MD5 digest follow the same float
//!   arithmetic as twemproxy (both descend from libketama).
//! - Equal points are ordered by server position in the list the client was
//!   given, which is the config order here.
//! - A key's hash is the first little-endian word of its MD5 digest.
//!
//! No I/O here.

use super::twemproxy::{points_per_server, push_digest_points, split_addr, DEFAULT_PORT};
use super::{Node, Point};

/// The prefix of a server's point names.
pub fn point_prefix(addr: &str) -> String {
    let (host, port) = split_addr(addr);
    // libmemcached is given IPv6 hosts without brackets.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match port {
        Some(DEFAULT_PORT) => host.to_string(),
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// The points of every node, and each node's rank for breaking ties (its
/// position).
pub(super) fn points(nodes: &[Node]) -> (Vec<Point>, Vec<u32>) {
    let total_weight: u32 = nodes.iter().map(|n| n.member.weight).sum();
    let mut points = Vec::new();
    for (server, node) in nodes.iter().enumerate() {
        let count = points_per_server(node.member.weight, total_weight, nodes.len() as u32);
        push_digest_points(&mut points, &point_prefix(&node.addr), count, server);
    }
    (points, (0..nodes.len() as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_owners_from_real_libmemcached() {
        // Produced by pylibmc 1.6.3 over libmemcached 1.0.18 (Debian),
        // `ketama_weighted`, servers 127.0.0.1:21301..=21304 weighted 1:2:3:1.
        use crate::ring::{golden_nodes, golden_owners, Flavour, Ring, Spec};
        let spec = Spec {
            flavour: Flavour::Libmemcached,
            ..Spec::default()
        };
        let ring = Ring::build_with(&spec, golden_nodes([1, 2, 3, 1], None));
        assert_eq!(
            golden_owners(&ring),
            [0, 0, 1, 1, 3, 3, 0, 2, 0, 3, 1, 3, 3, 3, 2, 1]
        );
    }

    #[test]
    fn port_11211_is_left_out_of_point_names() {
        assert_eq!(point_prefix("10.0.0.1:11211"), "10.0.0.1");
        assert_eq!(point_prefix("10.0.0.1:11311"), "10.0.0.1:11311");
        assert_eq!(point_prefix("cache.local:11211"), "cache.local");
        assert_eq!(point_prefix("[::1]:11212"), "::1:11212");
    }
}
