//! The ring digest: one 64-bit number that is equal on two memring
//! processes exactly when they place every key on the same servers, so an
//! operator (or `memring healthcheck --digest`) can tell whether a fleet of
//! sidecars agrees. No I/O here.
//!
//! What is digested is placement itself, not the config that led to it: the
//! ring's points in ring order, each with the address of the server that owns
//! it. Two rings with the same points, owners and key hash send every key,
//! and every replica walk, to the same addresses, whatever the order of
//! servers in the file, the ports memring listens on, where the member list
//! came from (file or DNS) or how weights were scaled; and one server added,
//! removed, readdressed, renamed (where names name points) or reweighted
//! changes the points or their owners, so the digest. Ties between equal
//! points are in the ring's own order, so where a flavour breaks ties by
//! list position (libmemcached) and a tie exists, order matters, as it does
//! for placement.
//!
//! Encoding, version 1 (so another implementation can compute the same): XXH3
//! 64-bit, seed 0, of these bytes, each line ending in `\n`, hashes and
//! digests as 16 lowercase hex digits:
//! - a pool ([`pool_digest`]): `memring pool digest 1`, `key_hash <h>` (`xxh3`
//!   for the memring flavour, else the name of the 32-bit hash as in the
//!   config's `hash`), `hash_tag <two bytes as hex>` or `hash_tag none`,
//!   `hash_without_prefix <bytes as hex>` only when one is set (so the
//!   digest of a ring without one is unchanged), `replicas <n>` (the configured count, at most the number of servers in
//!   the ring), when servers have zones, some zone has two servers and
//!   n > 1, `zone <host:port> <z>` per
//!   member sorted by address, `z` numbering the zones in order of first
//!   appearance in that list (zone names do not count, which servers share
//!   a zone does; without zones or with one copy nothing is added, so the
//!   digest is as before zones), then one line `<point hash> <owner's host:port>` per point in
//!   ring order (32-bit hashes sit in the top half of the 64-bit number),
//!   and for a rendezvous ring (no points) `node <score prefix> <host:port>`
//!   per member, sorted; the Dalli and PHP rings name their key hash with
//!   ` at-or-below` and ` buckets`;
//! - a process ([`layout_digest`], what `stats` shows as `ring_digest`):
//!   `memring layout digest 1`, `pool <name> <pool digest>` for every pool
//!   sorted by name, `default <name>`, `route <prefix as hex> <pool>` for
//!   every route in config order (the first match wins, so order counts),
//!   `failover <pool> <gutter>` for every pool with a gutter, sorted.

use std::hash::Hasher;

use twox_hash::XxHash3_64;

use super::{KeyHash, Ring};

/// The digest of one pool's placement: `ring` with member `i` reached at
/// `addrs[i]`, and each key written to `replicas` servers.
///
/// # Panics
/// `addrs` is shorter than the ring's member list.
pub fn pool_digest(ring: &Ring, addrs: &[impl AsRef<str>], replicas: usize) -> u64 {
    assert!(addrs.len() >= ring.members.len(), "an address per member");
    let mut h = XxHash3_64::with_seed(0);
    let mut line = |text: &str| {
        h.write(text.as_bytes());
        h.write(b"\n");
    };
    line("memring pool digest 1");
    line(&match ring.key_hash {
        KeyHash::Xxh3 => "key_hash xxh3".to_string(),
        KeyHash::Bits32(function) => format!("key_hash {}", function.name()),
        KeyHash::Rendezvous => "key_hash rendezvous murmur3_32".to_string(),
        KeyHash::Complement32(function) => format!("key_hash {} at-or-below", function.name()),
        KeyHash::Buckets(function) => format!("key_hash {} buckets", function.name()),
    });
    line(&match ring.hash_tag {
        Some([open, close]) => format!("hash_tag {open:02x}{close:02x}"),
        None => "hash_tag none".to_string(),
    });
    if !ring.hash_without_prefix.is_empty() {
        let hex: String = ring
            .hash_without_prefix
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        line(&format!("hash_without_prefix {hex}"));
    }
    let copies = replicas.max(1).min(ring.members.len());
    line(&format!("replicas {copies}"));
    if ring.has_zones() && copies > 1 && ring.zone_names.len() < ring.members.len() {
        // Which servers share a zone decides where copies go (not what the
        // zones are called): each server's address with its zone's number
        // in order of first appearance among the addresses, sorted.
        let mut zoned: Vec<(&str, u16)> = ring
            .zones
            .iter()
            .enumerate()
            .map(|(member, &zone)| (addrs[member].as_ref(), zone))
            .collect();
        zoned.sort_unstable();
        let mut order: Vec<u16> = Vec::new();
        for (addr, zone) in zoned {
            let number = order.iter().position(|&z| z == zone).unwrap_or_else(|| {
                order.push(zone);
                order.len() - 1
            });
            line(&format!("zone {addr} {number}"));
        }
    }
    // One line per point (160 per server at weight 1, so thousands): the
    // same bytes as `format!("{:016x} {addr}\n")`, without formatting.
    for point in ring.points.iter() {
        let addr = addrs[point.server as usize].as_ref();
        h.write(&hex_digits(point.hash));
        h.write(b" ");
        h.write(addr.as_bytes());
        h.write(b"\n");
    }
    // A rendezvous ring has no points: each member's score prefix (its
    // node name) and address place keys, in the order of the prefixes.
    let mut nodes: Vec<(&[u8], &str)> = ring
        .prefixes
        .iter()
        .zip(addrs)
        .map(|(prefix, addr)| (&prefix[..], addr.as_ref()))
        .collect();
    nodes.sort_unstable();
    for (prefix, addr) in nodes {
        h.write(b"node ");
        h.write(prefix);
        h.write(b" ");
        h.write(addr.as_bytes());
        h.write(b"\n");
    }
    h.finish()
}

/// `value` as 16 lowercase hex digits.
fn hex_digits(value: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// What decides which pool a key goes to, for [`layout_digest`].
#[derive(Debug, Clone, Default)]
pub struct LayoutParts<'a> {
    /// (name, [`pool_digest`]) of every pool, in any order.
    pub pools: Vec<(&'a str, u64)>,
    /// The pool keys matching no route go to.
    pub default: &'a str,
    /// (prefix, pool name), in config order.
    pub routes: Vec<(&'a [u8], &'a str)>,
    /// (pool, its gutter pool), in any order.
    pub failovers: Vec<(&'a str, &'a str)>,
}

/// The digest of a whole process's placement: every pool's digest and the
/// routes between them (see the module doc for the encoding).
pub fn layout_digest(parts: &LayoutParts<'_>) -> u64 {
    let mut h = XxHash3_64::with_seed(0);
    let mut line = |text: &str| {
        h.write(text.as_bytes());
        h.write(b"\n");
    };
    line("memring layout digest 1");
    let mut pools = parts.pools.clone();
    pools.sort_unstable();
    for (name, digest) in pools {
        line(&format!("pool {name} {}", hex(digest)));
    }
    line(&format!("default {}", parts.default));
    for (prefix, pool) in &parts.routes {
        let prefix: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
        line(&format!("route {prefix} {pool}"));
    }
    let mut failovers = parts.failovers.clone();
    failovers.sort_unstable();
    for (pool, gutter) in failovers {
        line(&format!("failover {pool} {gutter}"));
    }
    h.finish()
}

/// A digest as it is shown and compared: 16 lowercase hex digits.
pub fn hex(digest: u64) -> String {
    format!("{digest:016x}")
}

/// A digest given by an operator (16 hex digits, either case), or `None`.
pub fn parse_hex(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Flavour, HashFunction, Member, Node, Spec};

    fn node(name: &str, addr: &str, weight: u32) -> Node {
        Node {
            member: Member {
                identity: name.to_string(),
                weight,
            },
            addr: addr.to_string(),
            zone: None,
        }
    }

    /// The digest of `nodes` on a ring of `spec`, as a topology computes it.
    fn digest(spec: &Spec, nodes: &[Node], replicas: usize) -> u64 {
        let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
        let ring = Ring::build_with(spec, nodes.to_vec());
        pool_digest(&ring, &addrs, replicas)
    }

    fn three() -> Vec<Node> {
        vec![
            node("a", "10.0.0.1:11211", 1),
            node("b", "10.0.0.2:11211", 2),
            node("c", "10.0.0.3:11211", 1),
        ]
    }

    fn flavours() -> [Spec; Flavour::ALL.len()] {
        Flavour::ALL.map(|flavour| Spec {
            flavour,
            ..Spec::default()
        })
    }

    fn zoned(zones: [&str; 3]) -> Vec<Node> {
        let mut nodes = three();
        for (node, zone) in nodes.iter_mut().zip(zones) {
            node.zone = Some(zone.to_string());
        }
        nodes
    }

    #[test]
    fn zones_change_the_digest_when_they_place_copies() {
        for spec in flavours() {
            let plain = digest(&spec, &three(), 2);
            let apart = digest(&spec, &zoned(["x", "y", "z"]), 2);
            let two_together = digest(&spec, &zoned(["x", "x", "z"]), 2);
            assert_ne!(plain, two_together, "{spec:?}");
            assert_ne!(apart, two_together, "{spec:?}");
            // A zone per server walks as without zones.
            assert_eq!(plain, apart, "{spec:?}");
            // Renamed zones with the same servers together place alike.
            assert_eq!(
                two_together,
                digest(&spec, &zoned(["q", "q", "a"]), 2),
                "{spec:?}"
            );
            // One copy: zones place nothing, the digest is as without.
            assert_eq!(
                digest(&spec, &three(), 1),
                digest(&spec, &zoned(["x", "x", "z"]), 1),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn server_order_does_not_change_the_digest() {
        for spec in flavours() {
            let mut reversed = three();
            reversed.reverse();
            assert_eq!(
                digest(&spec, &three(), 1),
                digest(&spec, &reversed, 1),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn one_server_changed_changes_the_digest() {
        for spec in flavours() {
            let before = digest(&spec, &three(), 1);
            let mut readdressed = three();
            readdressed[1].addr = "10.0.0.9:11211".into();
            let mut reweighted = three();
            reweighted[1].member.weight = 3;
            let mut fewer = three();
            fewer.pop();
            for other in [readdressed, reweighted, fewer] {
                // Rendezvous (pymemcache) has no weights: one places no key
                // elsewhere, so the digest stays (`check` refuses one).
                if spec.flavour == Flavour::Rendezvous && other[1].member.weight == 3 {
                    assert_eq!(before, digest(&spec, &other, 1));
                    continue;
                }
                assert_ne!(before, digest(&spec, &other, 1), "{spec:?} {other:?}");
            }
        }
    }

    #[test]
    fn a_renamed_server_changes_the_digest_where_names_place_keys() {
        let mut renamed = three();
        renamed[0].member.identity = "z".into();
        let memring = Spec::default();
        assert_ne!(digest(&memring, &three(), 1), digest(&memring, &renamed, 1));
        // libmemcached names points by address only: the same placement.
        let [_, _, libmemcached, ..] = flavours();
        assert_eq!(
            digest(&libmemcached, &three(), 1),
            digest(&libmemcached, &renamed, 1)
        );
    }

    #[test]
    fn key_hash_hash_tag_and_replicas_are_part_of_it() {
        let [_, twemproxy, ..] = flavours();
        let base = digest(&twemproxy, &three(), 1);
        let murmur = Spec {
            hash: HashFunction::Md5,
            ..twemproxy.clone()
        };
        let tagged = Spec {
            hash_tag: Some(*b"{}"),
            ..twemproxy.clone()
        };
        assert_ne!(base, digest(&murmur, &three(), 1));
        assert_ne!(base, digest(&tagged, &three(), 1));
        let prefixed = Spec {
            hash_without_prefix: b"myapp:"[..].into(),
            ..twemproxy.clone()
        };
        assert_ne!(base, digest(&prefixed, &three(), 1));
        assert_ne!(base, digest(&twemproxy, &three(), 2));
        // More replicas than servers are as many as there are servers.
        assert_eq!(
            digest(&twemproxy, &three(), 3),
            digest(&twemproxy, &three(), 7)
        );
    }

    #[test]
    fn scaled_weights_place_alike_in_ketama_flavours_and_digest_alike() {
        let [_, twemproxy, ..] = flavours();
        let mut doubled = three();
        for n in &mut doubled {
            n.member.weight *= 2;
        }
        assert_eq!(
            digest(&twemproxy, &three(), 1),
            digest(&twemproxy, &doubled, 1)
        );
        assert_ne!(
            digest(&Spec::default(), &three(), 1),
            digest(&Spec::default(), &doubled, 1),
            "memring's flavour gives a server 160 points per unit of weight"
        );
    }

    #[test]
    fn layout_digest_ignores_pool_order_but_not_routes() {
        let parts = LayoutParts {
            pools: vec![("main", 1), ("sessions", 2)],
            default: "main",
            routes: vec![(b"s:", "sessions")],
            failovers: vec![],
        };
        let reordered = LayoutParts {
            pools: vec![("sessions", 2), ("main", 1)],
            ..parts.clone()
        };
        assert_eq!(layout_digest(&parts), layout_digest(&reordered));
        for changed in [
            LayoutParts {
                routes: vec![(b"t:", "sessions")],
                ..parts.clone()
            },
            LayoutParts {
                pools: vec![("main", 1), ("sessions", 3)],
                ..parts.clone()
            },
            LayoutParts {
                default: "sessions",
                ..parts.clone()
            },
            LayoutParts {
                failovers: vec![("main", "sessions")],
                ..parts.clone()
            },
        ] {
            assert_ne!(layout_digest(&parts), layout_digest(&changed));
        }
    }

    #[test]
    fn golden_digest_pins_the_encoding() {
        // Changing the encoding makes every fleet disagree with sidecars of
        // the previous release: change this value only with the version.
        let d = digest(&Spec::default(), &three(), 1);
        assert_eq!(hex(d).len(), 16);
        assert_eq!(parse_hex(&hex(d)), Some(d));
        assert_eq!(parse_hex(&hex(d).to_uppercase()), Some(d));
        assert_eq!(parse_hex("xyz"), None);
        assert_eq!(hex(d), GOLDEN);
    }

    const GOLDEN: &str = "bda8e4e8b83f9705";
}
