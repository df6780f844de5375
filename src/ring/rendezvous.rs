//! The rendezvous flavour: pymemcache's `HashClient` with its default hasher,
//! `RendezvousHash` (highest random weight), so memring places every key on
//! the server a Python client using `HashClient` picks.
//!
//! There is no circle: a key is scored on every server, and the highest score
//! wins. What pymemcache computes (3.x and 4.0 alike):
//! - a server's node name is `"<host>:<port>"` as the client was given it, the
//!   port always written (11211 too) and an IPv6 host without brackets; names
//!   configured in memring play no part (the client has none);
//! - the score of a key on a node is `murmur3_32("<node>-<key>", seed 0)`;
//! - on equal scores the node whose name is larger (Python string order, which
//!   for these ASCII names is bytewise) wins;
//! - keys are `str` in the client: each character is hashed as the low byte
//!   of its code point. The client sends an ASCII key as is, and a non-ASCII
//!   key (`allow_unicode_keys=True`) as UTF-8, so memring decodes a key that
//!   is valid UTF-8 back into characters; bytes that are not UTF-8 (which
//!   such a client cannot send) are hashed one byte per character.
//!
//! The client has no weights (every server takes an equal share) and hashes
//! the key without its `key_prefix`, so neither has a counterpart here:
//! `memring check` refuses weights other than 1 on this ring. No I/O here.

use smallvec::SmallVec;

/// The most servers over which a rendezvous lookup stays under 1 µs per key
/// (the `ring_owner_rendezvous` bench: about 20 ns per server on the
/// project's 2-core test machine); `memring check` warns above it.
pub const MAX_SERVERS_UNDER_A_MICROSECOND: usize = 50;

/// The node name pymemcache's `HashClient` hashes a server by, for the
/// `host:port` memring connects to.
pub fn node_name(addr: &str) -> String {
    let (host, port) = match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !port.contains(']') => (host, port),
        _ => (addr, "11211"),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    format!("{host}:{port}")
}

/// The score prefix of a node: its name and the `-` before the key.
pub(super) fn score_prefix(addr: &str) -> Box<[u8]> {
    let mut prefix = node_name(addr).into_bytes();
    prefix.push(b'-');
    prefix.into_boxed_slice()
}

/// The bytes the client hashes for `key`: one byte per character, the low
/// byte of its code point, when `key` is UTF-8; else `key` itself.
pub(super) fn hashed_key(key: &[u8]) -> SmallVec<[u8; 256]> {
    if key.is_ascii() {
        return SmallVec::from_slice(key);
    }
    match std::str::from_utf8(key) {
        Ok(text) => text.chars().map(|c| c as u32 as u8).collect(),
        Err(_) => SmallVec::from_slice(key),
    }
}

/// The score of the key whose hashed bytes are `key` on the node whose
/// prefix is `prefix`.
#[cfg(test)]
pub(super) fn score(prefix: &[u8], key: &[u8]) -> u32 {
    Scorer::new(prefix).score(key)
}

/// A node's score prefix with murmur3 already run over its whole 4-byte
/// blocks, so scoring a key hashes only the prefix's last 0-3 bytes and the
/// key: what a lookup does once per server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Scorer {
    state: u32,
    rest: [u8; 4],
    rest_len: usize,
    prefix_len: usize,
}

impl Scorer {
    pub(super) fn new(prefix: &[u8]) -> Scorer {
        let mut blocks = prefix.chunks_exact(4);
        let mut state = 0;
        for block in &mut blocks {
            state = mix_block(state, block);
        }
        let remainder = blocks.remainder();
        let mut rest = [0u8; 4];
        rest[..remainder.len()].copy_from_slice(remainder);
        Scorer {
            state,
            rest,
            rest_len: remainder.len(),
            prefix_len: prefix.len(),
        }
    }

    /// `murmur3_32(prefix ++ key, 0)`.
    #[inline]
    pub(super) fn score(&self, key: &[u8]) -> u32 {
        let mut h = self.state;
        let total = self.prefix_len + key.len();
        let need = 4 - self.rest_len;
        let tail: &[u8];
        let mut carried = self.rest;
        let carried_tail;
        if key.len() < need {
            carried[self.rest_len..self.rest_len + key.len()].copy_from_slice(key);
            carried_tail = carried;
            tail = &carried_tail[..self.rest_len + key.len()];
        } else {
            let rest = if self.rest_len == 0 {
                key
            } else {
                carried[self.rest_len..].copy_from_slice(&key[..need]);
                h = mix_block(h, &carried);
                &key[need..]
            };
            let mut blocks = rest.chunks_exact(4);
            for block in &mut blocks {
                h = mix_block(h, block);
            }
            tail = blocks.remainder();
        }
        finish(h, tail, total)
    }
}

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

#[inline]
fn mix_block(h: u32, block: &[u8]) -> u32 {
    let k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    let h = h ^ k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline]
fn finish(mut h: u32, tail: &[u8], len: usize) -> u32 {
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, &b) in tail.iter().enumerate() {
            k |= u32::from(b) << (8 * i);
        }
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    h ^= len as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// MurmurHash3's x86 32-bit hash (Austin Appleby's public-domain design).
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        h = mix_block(h, block);
    }
    finish(h, blocks.remainder(), data.len())
}

/// Whether the node scoring `(score, prefix)` beats the one scoring
/// `(best, best_prefix)`: a higher score, or an equal one and a larger name.
#[inline]
pub(super) fn beats(score: u32, prefix: &[u8], best: u32, best_prefix: &[u8]) -> bool {
    score > best || (score == best && name_of(prefix) > name_of(best_prefix))
}

/// The node name in a score prefix (without its `-`).
#[inline]
pub(super) fn name_of(prefix: &[u8]) -> &[u8] {
    &prefix[..prefix.len().saturating_sub(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ring::{Flavour, Member, Node, Ring, Spec};

    fn spec() -> Spec {
        Spec {
            flavour: Flavour::Rendezvous,
            ..Spec::default()
        }
    }

    /// Nodes at `addrs`, named `s0`, `s1`, ... (names play no part).
    fn nodes(addrs: &[&str]) -> Vec<Node> {
        addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| Node {
                member: Member {
                    identity: format!("s{i}"),
                    weight: 1,
                },
                addr: addr.to_string(),
                zone: None,
            })
            .collect()
    }

    const GOLDEN_ADDRS: [&str; 6] = [
        "127.0.0.1:21301",
        "127.0.0.1:21302",
        "127.0.0.1:21303",
        "127.0.0.1:21304",
        "[::1]:11211",
        "cache.local:11211",
    ];

    /// The keys of the golden table, as a Python client sends them (UTF-8).
    const GOLDEN_KEYS: [&str; 17] = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "user:42",
        "session:9",
        "caf\u{e9}",
        "\u{43a}\u{43b}\u{44e}\u{447}",
        "\u{65e5}\u{672c}\u{8a9e}",
        "user:1",
        "user:2",
        "user:3",
        "user:4",
        "user:5",
        "user:6",
        "user:7",
        "user:8",
    ];

    #[test]
    fn golden_owners_from_real_pymemcache() {
        // Produced by pymemcache 3.5.2 (Debian python3-pymemcache) and 4.0.0
        // (PyPI), identically: HashClient([GOLDEN_ADDRS as "host:port"
        // strings], allow_unicode_keys=True), then for each str key the index
        // of hasher.get_node(key) among the client's node names.
        let ring = Ring::build_with(&spec(), nodes(&GOLDEN_ADDRS));
        let owners: Vec<usize> = GOLDEN_KEYS
            .iter()
            .map(|k| ring.owner(k.as_bytes()).unwrap())
            .collect();
        assert_eq!(owners, [2, 3, 2, 4, 2, 3, 0, 5, 2, 1, 4, 2, 2, 3, 3, 3, 2]);
    }

    #[test]
    fn golden_owners_of_prefixed_keys_from_real_pymemcache() {
        // pymemcache 3.5.2: HashClient([GOLDEN_ADDRS], allow_unicode_keys=True,
        // key_prefix=b"myapp:") hashes each key without its prefix (the
        // owners of the table above) and sends "myapp:<key>". Hashing what
        // is sent, as a ring without hash_without_prefix does, places it
        // elsewhere (the second table, from the same client's hasher).
        let prefixed = Spec {
            hash_without_prefix: b"myapp:"[..].into(),
            ..spec()
        };
        let owners = |ring: &Ring| -> Vec<usize> {
            GOLDEN_KEYS
                .iter()
                .map(|k| ring.owner(format!("myapp:{k}").as_bytes()).unwrap())
                .collect()
        };
        let ring = Ring::build_with(&prefixed, nodes(&GOLDEN_ADDRS));
        assert_eq!(
            owners(&ring),
            [2, 3, 2, 4, 2, 3, 0, 5, 2, 1, 4, 2, 2, 3, 3, 3, 2]
        );
        let whole = Ring::build_with(&spec(), nodes(&GOLDEN_ADDRS));
        assert_eq!(
            owners(&whole),
            [3, 1, 0, 2, 3, 4, 1, 1, 0, 1, 2, 5, 4, 3, 4, 5, 0]
        );
        // A key without the prefix (an unprefixed client's) is hashed whole.
        assert_eq!(ring.owner(b"alpha"), whole.owner(b"alpha"));
    }

    #[test]
    fn golden_scores_and_replica_order_from_real_pymemcache() {
        // pymemcache 3.5.2's murmur3_32("%s-%s" % (node, key)) for the first
        // two nodes, and every node sorted by descending score (the order in
        // which HashClient falls back when owners are removed).
        let ring = Ring::build_with(&spec(), nodes(&GOLDEN_ADDRS));
        let golden: [(&str, [u32; 2], [usize; 6]); 3] = [
            ("alpha", [0x4155_ed10, 0x4b24_1b2f], [2, 5, 3, 1, 0, 4]),
            ("caf\u{e9}", [0xe247_6319, 0x8725_c5c4], [0, 1, 3, 5, 4, 2]),
            ("user:7", [0x0d66_2375, 0xb43e_d90e], [3, 2, 1, 5, 4, 0]),
        ];
        let mut set = SmallVec::new();
        for (key, scores, order) in golden {
            let hashed = hashed_key(key.as_bytes());
            for (i, want) in scores.into_iter().enumerate() {
                assert_eq!(
                    score(&score_prefix(GOLDEN_ADDRS[i]), &hashed),
                    want,
                    "{key}"
                );
            }
            ring.replicas(key.as_bytes(), 6, &mut set);
            assert_eq!(set.as_slice(), order, "{key}");
            ring.replicas(key.as_bytes(), 2, &mut set);
            assert_eq!(set.as_slice(), &order[..2], "{key}");
        }
    }

    #[test]
    fn owner_matches_a_linear_scan_oracle() {
        // The oracle is pymemcache's get_node written out: the first node with
        // the highest score, replaced on an equal score by the larger name.
        for n in [1, 2, 3, 8, 25] {
            let addrs: Vec<String> = (0..n)
                .map(|i| format!("10.0.{i}.1:{}", 11211 + i))
                .collect();
            let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
            let ring = Ring::build_with(&spec(), nodes(&refs));
            for i in 0..2000 {
                let key = format!("user:{i}:profile");
                let mut winner: Option<(u32, String, usize)> = None;
                for (server, addr) in addrs.iter().enumerate() {
                    let name = node_name(addr);
                    let s = murmur3_32(format!("{name}-{key}").as_bytes(), 0);
                    winner = match winner {
                        Some((top, top_name, top_server))
                            if s < top || (s == top && name <= top_name) =>
                        {
                            Some((top, top_name, top_server))
                        }
                        _ => Some((s, name, server)),
                    };
                }
                assert_eq!(ring.owner(key.as_bytes()), winner.map(|w| w.2), "{n} {key}");
            }
        }
    }

    #[test]
    fn a_scorer_hashes_as_murmur3_over_prefix_and_key() {
        for prefix_len in 0..9 {
            let prefix: Vec<u8> = (0..prefix_len).map(|i| b'a' + i as u8).collect();
            let scorer = Scorer::new(&prefix);
            for key_len in 0..12 {
                let key: Vec<u8> = (0..key_len).map(|i| 0x80 + i as u8).collect();
                let joined = [prefix.clone(), key.clone()].concat();
                assert_eq!(
                    scorer.score(&key),
                    murmur3_32(&joined, 0),
                    "{prefix_len} {key_len}"
                );
            }
        }
    }

    #[test]
    fn equal_scores_go_to_the_larger_name() {
        assert!(beats(7, b"b:1-", 7, b"a:1-"));
        assert!(!beats(7, b"a:1-", 7, b"b:1-"));
        assert!(beats(8, b"a:1-", 7, b"b:1-"));
        // Compared as names, without the `-` after them ("h:1" < "h:1!").
        assert!(beats(7, b"h:1!-", 7, b"h:1-"));
    }

    #[test]
    fn shares_are_equal_and_moves_go_only_to_and_from_changed_servers() {
        let addrs: Vec<String> = (0..5).map(|i| format!("10.0.0.{i}:11211")).collect();
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let five = Ring::build_with(&spec(), nodes(&refs));
        let four = Ring::build_with(&spec(), nodes(&refs[..4]));
        assert_eq!(five.shares(), vec![0.2; 5]);
        let total = 20_000;
        let mut moved = 0;
        for i in 0..total {
            let key = format!("k{i}");
            let (before, after) = (four.owner(key.as_bytes()), five.owner(key.as_bytes()));
            if before != after {
                moved += 1;
                assert_eq!(after, Some(4), "a moved key must go to the new server");
            }
        }
        let sampled = moved as f64 / total as f64;
        let exact = Ring::moved_share(&four, &five);
        assert!((exact - 0.2).abs() < 1e-9, "{exact}");
        assert!((sampled - exact).abs() < 0.02, "{sampled} vs {exact}");
        assert!((Ring::moved_share(&five, &four) - 0.2).abs() < 1e-9);
        assert_eq!(Ring::moved_share(&five, &five.clone()), 0.0);
        // Towards another flavour: the expected share of keys whose owner
        // differs, 1 - 1/5 over the same five servers.
        let memring = Ring::build_with(&Spec::default(), nodes(&refs));
        let other = Ring::moved_share(&five, &memring);
        assert!((0.75..0.85).contains(&other), "{other}");
    }

    #[test]
    fn an_empty_ring_owns_nothing() {
        let ring = Ring::build_with(&spec(), Vec::new());
        assert_eq!(ring.owner(b"k"), None);
        assert_eq!(ring.point_count(), 0);
        let mut set = SmallVec::new();
        ring.replicas(b"k", 2, &mut set);
        assert!(set.is_empty());
    }

    #[test]
    fn murmur3_matches_the_reference_vectors() {
        // From the reference implementation's verification set.
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"", 0xffff_ffff), 0x81f1_6f39);
        assert_eq!(murmur3_32(b"\0\0\0\0", 0), 0x2362_f9de);
        assert_eq!(murmur3_32(b"aaaa", 0x9747_b28c), 0x5a97_808a);
        assert_eq!(murmur3_32(b"abc", 0), 0xb3dd_93fa);
        assert_eq!(murmur3_32(b"Hello, world!", 0x9747_b28c), 0x2488_4cba);
    }

    #[test]
    fn node_names_are_host_colon_port_without_brackets() {
        assert_eq!(node_name("127.0.0.1:11211"), "127.0.0.1:11211");
        assert_eq!(node_name("cache.local:11311"), "cache.local:11311");
        assert_eq!(node_name("[::1]:11212"), "::1:11212");
        assert_eq!(node_name("cache.local"), "cache.local:11211");
    }

    #[test]
    fn keys_are_hashed_one_low_byte_per_character() {
        assert_eq!(hashed_key(b"user:1").as_slice(), b"user:1");
        assert_eq!(hashed_key("caf\u{e9}".as_bytes()).as_slice(), b"caf\xe9");
        assert_eq!(hashed_key("\u{43a}".as_bytes()).as_slice(), b"\x3a");
        assert_eq!(hashed_key(b"\x80\xff").as_slice(), b"\x80\xff");
    }
}
