//! The twemproxy flavour: twemproxy (nutcracker) 0.5's `distribution: ketama`,
//! so memring can take over a twemproxy pool with every key where it already
//! is.
//!
//! - A server's name is its configured `name`, else its host when the port is
//!   11211 (libmemcached's convention), else `host:port`; the weight is never
//!   part of it.
//! - A server gets `floor(weight / total × 40 × servers) × 4` points, computed
//!   in single precision as twemproxy does (this is not always 160 at equal
//!   weights), four from each MD5 digest of `"<name>-<index>"`.
//! - twemproxy sorts its servers by name (shorter first, then bytewise) and
//!   sorts points with a stable sort, so among equal points the server whose
//!   name sorts first owns the keys.
//! - Keys are hashed with the pool's `hash` (see [`super::hashkit`]).
//!
//! No I/O here.

use super::hashkit::{digest_word, md5_digest, HashFunction};
use super::{Node, Point};

/// twemproxy's default `hash:`.
pub const DEFAULT_HASH: HashFunction = HashFunction::Fnv1a64;

/// Points of a server at an average weight.
pub const POINTS_PER_SERVER: u32 = 160;

/// Points taken from one MD5 digest (one per 4-byte word).
pub const POINTS_PER_DIGEST: u32 = 4;

/// The port whose number is left out of an unnamed server's name.
pub const DEFAULT_PORT: u16 = 11211;

/// twemproxy formats `"<name>-<index>"` into a 273-byte buffer, so a longer
/// point name is hashed cut to 272 bytes.
const MAX_POINT_NAME_BYTES: usize = 272;

/// `host` and `port` of a `host:port` address (`[v6]` keeps its brackets).
pub fn split_addr(addr: &str) -> (&str, Option<u16>) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()),
        None => (addr, None),
    }
}

/// The name twemproxy hashes a server's points by. `identity` is the server's
/// configured name, or equal to `addr` when it has none.
pub fn server_name(identity: &str, addr: &str) -> String {
    if identity != addr {
        return identity.to_string();
    }
    match split_addr(addr) {
        (host, Some(DEFAULT_PORT)) => host.to_string(),
        _ => addr.to_string(),
    }
}

/// Points of a server of `weight` among `servers` live servers weighing
/// `total_weight` together, in twemproxy's (and libmemcached's) float
/// arithmetic: single-precision products, a tiny double-precision nudge, then
/// floor to a multiple of four.
pub fn points_per_server(weight: u32, total_weight: u32, servers: u32) -> u32 {
    let share = weight as f32 / total_weight as f32;
    let scaled = share * POINTS_PER_SERVER as f32 / POINTS_PER_DIGEST as f32 * servers as f32;
    let nudged = (f64::from(scaled) + 0.000_000_000_1) as f32;
    (nudged.floor() * POINTS_PER_DIGEST as f32) as u32
}

/// Adds `count` ketama points (rounded down to whole digests) named
/// `"<name>-<index>"` for `server`.
pub(super) fn push_digest_points(points: &mut Vec<Point>, name: &str, count: u32, server: usize) {
    for index in 0..count / POINTS_PER_DIGEST {
        let point_name = format!("{name}-{index}");
        let bytes = point_name.as_bytes();
        let digest = md5_digest(&bytes[..bytes.len().min(MAX_POINT_NAME_BYTES)]);
        for word in 0..POINTS_PER_DIGEST as usize {
            points.push(Point::from_u32(digest_word(&digest, word), server));
        }
    }
}

/// The points of every node, and each node's rank for breaking ties
/// (twemproxy's server order).
pub(super) fn points(nodes: &[Node]) -> (Vec<Point>, Vec<u32>) {
    let names: Vec<String> = nodes
        .iter()
        .map(|n| server_name(&n.member.identity, &n.addr))
        .collect();
    let total_weight: u32 = nodes.iter().map(|n| n.member.weight).sum();
    let mut points = Vec::with_capacity(nodes.len() * POINTS_PER_SERVER as usize);
    for (server, (node, name)) in nodes.iter().zip(&names).enumerate() {
        let count = points_per_server(node.member.weight, total_weight, nodes.len() as u32);
        push_digest_points(&mut points, name, count, server);
    }
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (names[a].as_bytes(), names[b].as_bytes());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    });
    let mut rank = vec![0u32; nodes.len()];
    for (position, &server) in order.iter().enumerate() {
        rank[server] = position as u32;
    }
    (points, rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnamed_servers_drop_port_11211_only() {
        assert_eq!(server_name("10.0.0.1:11211", "10.0.0.1:11211"), "10.0.0.1");
        assert_eq!(
            server_name("10.0.0.1:11212", "10.0.0.1:11212"),
            "10.0.0.1:11212"
        );
        assert_eq!(server_name("cache-a", "10.0.0.1:11211"), "cache-a");
        assert_eq!(server_name("cache-b", "10.0.0.1:11212"), "cache-b");
    }

    #[test]
    fn equal_weights_give_160_points_except_where_float_rounding_takes_four() {
        // twemproxy's single-precision arithmetic: 1/n × 40 × n is not always
        // exactly 40, and flooring 39.99999 gives 39 digests (156 points).
        let mut short = Vec::new();
        for servers in 1..=30 {
            let points = points_per_server(1, servers, servers);
            assert!(points == 160 || points == 156, "{servers}: {points}");
            if points == 156 {
                short.push(servers);
            }
        }
        println!("server counts with 156 points per server: {short:?}");
        assert_eq!(short, SHORT_SERVER_COUNTS);
    }

    /// Server counts (1..=30, equal weights) whose servers get 156 points in
    /// twemproxy 0.5 (the same expression compiled as C agrees; tests/integration/compat.rs
    /// checks 25 servers against nutcracker).
    const SHORT_SERVER_COUNTS: [u32; 1] = [25];

    #[test]
    fn weights_split_points_in_proportion() {
        // Weights 1:2:3:1 (total 7, 4 servers): floor(w/7 × 160) rounded down
        // to a multiple of 4.
        let counts: Vec<u32> = [1, 2, 3, 1]
            .iter()
            .map(|&w| points_per_server(w, 7, 4))
            .collect();
        assert_eq!(counts, vec![88, 180, 272, 88]);
    }

    #[test]
    fn golden_owners_from_a_real_nutcracker() {
        // Produced by nutcracker 0.5.0 (Debian) over memcached on
        // 127.0.0.1:21301..=21304: each key set through nutcracker, then
        // looked for on every server. tests/integration/compat.rs checks the same
        // agreement live, over random ports.
        use crate::ring::{golden_nodes, golden_owners, Flavour, Ring, Spec};
        let named = Spec {
            flavour: Flavour::Twemproxy,
            ..Spec::default()
        };
        let names = ["cache-01", "cache-02", "cache-03", "cache-04"];
        let ring = Ring::build_with(&named, golden_nodes([1, 2, 3, 1], Some(names)));
        assert_eq!(
            golden_owners(&ring),
            [3, 2, 3, 1, 2, 1, 2, 1, 3, 3, 3, 3, 3, 3, 3, 3],
            "hash fnv1a_64, named servers, weights 1:2:3:1"
        );
        let md5 = Spec {
            hash: HashFunction::Md5,
            ..named
        };
        let ring = Ring::build_with(&md5, golden_nodes([1; 4], None));
        assert_eq!(
            golden_owners(&ring),
            [0, 0, 1, 1, 3, 3, 0, 2, 0, 3, 1, 3, 3, 3, 1, 3],
            "hash md5, unnamed servers"
        );
    }

    #[test]
    fn long_point_names_are_cut_like_twemproxys_buffer() {
        let long = "n".repeat(300);
        let mut cut = Vec::new();
        push_digest_points(&mut cut, &long, 4, 0);
        let mut same_prefix = Vec::new();
        push_digest_points(&mut same_prefix, &format!("{long}x"), 4, 0);
        assert_eq!(cut, same_prefix, "only the first 272 bytes are hashed");
    }
}
