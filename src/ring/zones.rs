//! How a ring with zones spreads copies over its zones: for `memring plan`,
//! `memring check` and the config's warnings. No I/O here.
//!
//! With zones and `replicas = N`, a key's copies go to the next servers
//! clockwise in distinct zones ([`Ring::replicas`]), so each zone holds a
//! copy of (nearly) every key while N is at least the number of zones,
//! whatever its servers' weight. A zone whose servers hold a small part of
//! the ring then stores far more than its share: that is what is warned of.

use super::Ring;

/// Keys sampled to measure where copies go.
const SAMPLE_KEYS: usize = 20_000;

/// A zone holding this many times its ring share of the copies is warned
/// of.
pub const OVERLOAD: f64 = 1.25;

/// One zone of a ring: its servers, its share of the ring (by weight), and
/// the copies it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneShare {
    pub zone: String,
    pub servers: usize,
    /// The zone's servers' share of the ring (what they would own with one
    /// copy per key).
    pub ring_share: f64,
    /// The share of keys with a copy in the zone.
    pub keys: f64,
    /// The zone's share of all copies: what its servers store together.
    pub copies: f64,
}

impl ZoneShare {
    /// How many times its ring share the zone stores (1 is fair).
    pub fn load(&self) -> f64 {
        if self.ring_share > 0.0 {
            self.copies / self.ring_share
        } else {
            f64::INFINITY
        }
    }
}

/// Every zone of `ring` with `replicas` copies per key, in zone name order;
/// empty for a ring without zones. Copies are counted on a fixed sample of
/// keys, so the figures are to about a percent.
pub fn zone_shares(ring: &Ring, replicas: usize) -> Vec<ZoneShare> {
    if !ring.has_zones() {
        return Vec::new();
    }
    let names = &ring.zone_names;
    let mut servers = vec![0usize; names.len()];
    let mut ring_share = vec![0.0; names.len()];
    for (member, share) in ring.shares().into_iter().enumerate() {
        let zone = ring.zones[member] as usize;
        servers[zone] += 1;
        ring_share[zone] += share;
    }
    let mut keys = vec![0usize; names.len()];
    let mut copies = vec![0usize; names.len()];
    let mut total = 0usize;
    let mut set = smallvec::SmallVec::new();
    let mut seen: smallvec::SmallVec<[u16; 4]> = smallvec::SmallVec::new();
    for i in 0..SAMPLE_KEYS {
        ring.replicas(
            format!("zone-sample:{i}").as_bytes(),
            replicas.max(1),
            &mut set,
        );
        seen.clear();
        for &member in &set {
            let zone = ring.zones[member];
            copies[zone as usize] += 1;
            total += 1;
            if !seen.contains(&zone) {
                seen.push(zone);
                keys[zone as usize] += 1;
            }
        }
    }
    (0..names.len())
        .map(|z| ZoneShare {
            zone: names[z].to_string(),
            servers: servers[z],
            ring_share: ring_share[z],
            keys: keys[z] as f64 / SAMPLE_KEYS as f64,
            copies: copies[z] as f64 / total.max(1) as f64,
        })
        .collect()
}

/// The zones of `shares` that store more than [`OVERLOAD`] times their
/// ring share, each said in one sentence.
pub fn overloaded(shares: &[ZoneShare], replicas: usize) -> Vec<String> {
    shares
        .iter()
        .filter(|z| z.load() > OVERLOAD)
        .map(|z| {
            format!(
                "zone `{}` holds {:.1}% of the ring by weight ({} server{}) but, with replicas = {replicas} placed one per zone, a copy of {:.1}% of the keys ({:.1}% of all copies): its servers store {:.1}x their share; give the zone more servers or weight",
                z.zone,
                z.ring_share * 100.0,
                z.servers,
                if z.servers == 1 { "" } else { "s" },
                z.keys * 100.0,
                z.copies * 100.0,
                z.load()
            )
        })
        .collect()
}

/// One line per zone for `plan` and `check`.
pub fn describe(share: &ZoneShare) -> String {
    format!(
        "zone {}: {} server{}, {:.2}% of the ring, a copy of {:.2}% of the keys, {:.2}% of all copies",
        share.zone,
        share.servers,
        if share.servers == 1 { "" } else { "s" },
        share.ring_share * 100.0,
        share.keys * 100.0,
        share.copies * 100.0
    )
}
