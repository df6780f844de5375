//! Each zone's figures (docs/zones.md, "Counters"): the hits of classic
//! retrievals by the zone of the replica that served them, local or from
//! another zone, the hits copied back from each zone, and the zones warming.
//! The totals, without a zone, are the hand-off family's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Text;
use crate::stats::Stats;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZoneLabels {
    zone: Text,
}

/// The per-zone families, and each zone's handles by name.
#[derive(Debug)]
pub(in crate::stats) struct ZoneFamilies {
    local: Family<ZoneLabels, Counter>,
    cross: Family<ZoneLabels, Counter>,
    write_backs: Family<ZoneLabels, Counter>,
    warming: Family<ZoneLabels, Gauge>,
    /// The handles made so far, in zone name order: the `stats` reply lists
    /// them (a family cannot list its series).
    figures: Mutex<BTreeMap<String, Arc<ZoneFigures>>>,
    /// Each pool's zones (those of its servers), for the `warming` series:
    /// a zone's goes once no pool has a server in it.
    pools: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl ZoneFamilies {
    pub(in crate::stats) fn register(registry: &mut Registry) -> ZoneFamilies {
        let families = ZoneFamilies {
            local: Family::default(),
            cross: Family::default(),
            write_backs: Family::default(),
            warming: Family::default(),
            figures: Mutex::default(),
            pools: Mutex::default(),
        };
        registry.register(
            "zone_reads_local_by_zone",
            "Hits served by the key's replica in this sidecar's zone, by that zone",
            families.local.clone(),
        );
        registry.register(
            "zone_reads_cross_zone_by_zone",
            "Hits served by a replica other than the key's local one, by the zone of the replica that served them",
            families.cross.clone(),
        );
        registry.register(
            "zone_write_backs_by_zone",
            "Hits found in another zone and copied back to the local replica, by the zone they were found in",
            families.write_backs.clone(),
        );
        registry.register(
            "zone_warming",
            "1 for each zone listed in warming_zones, 0 for the other zones of the servers",
            families.warming.clone(),
        );
        families
    }
}

/// One zone's counters. Handles made once per zone, so counting is an
/// atomic add with no label lookup.
#[derive(Debug, Default)]
pub struct ZoneFigures {
    local: Counter,
    cross: Counter,
    write_backs: Counter,
}

impl ZoneFigures {
    /// A hit served by a replica in this zone: the local one (asked first),
    /// or another zone's, then maybe copied back to the local replica.
    #[inline]
    pub fn hit(&self, local: bool, written_back: bool) {
        if local {
            self.local.inc();
        } else {
            self.cross.inc();
        }
        if written_back {
            self.write_backs.inc();
        }
    }
}

impl Stats {
    /// The counters of zone `zone`, made at the first call for it.
    pub fn zone_figures(&self, zone: &str) -> Arc<ZoneFigures> {
        let families = &self.zones;
        let mut figures = families.figures.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(made) = figures.get(zone) {
            return made.clone();
        }
        let labels = ZoneLabels { zone: zone.into() };
        let made = Arc::new(ZoneFigures {
            local: families.local.get_or_create(&labels).clone(),
            cross: families.cross.get_or_create(&labels).clone(),
            write_backs: families.write_backs.get_or_create(&labels).clone(),
        });
        figures.insert(zone.to_string(), made.clone());
        made
    }

    /// Whether zone `zone` is warming now (`warming_zones`).
    pub fn zone_warming(&self, zone: &str, warming: bool) {
        self.zones
            .warming
            .get_or_create(&ZoneLabels { zone: zone.into() })
            .set(i64::from(warming));
    }

    /// The servers of pool `pool` are in `zones` now (none: the pool is
    /// gone), each warming or not: sets each zone's `warming` gauge, and
    /// removes the series of a zone that no pool has a server in any more
    /// (a reload removed it), rather than leaving it at its last value.
    pub fn pool_zones<'z>(&self, pool: &str, zones: impl IntoIterator<Item = (&'z str, bool)>) {
        let families = &self.zones;
        let mut pools = families.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = BTreeSet::new();
        for (zone, warming) in zones {
            self.zone_warming(zone, warming);
            now.insert(zone.to_string());
        }
        let before = match now.is_empty() {
            true => pools.remove(pool),
            false => pools.insert(pool.to_string(), now),
        };
        for zone in before.unwrap_or_default() {
            if !pools.values().any(|zones| zones.contains(&zone)) {
                families.warming.remove(&ZoneLabels {
                    zone: zone.as_str().into(),
                });
            }
        }
    }

    /// The per-zone counters for `stats`, in zone name order:
    /// `zone:<zone>:reads_local`, `…:reads_cross_zone`, `…:write_backs`.
    pub fn zone_counters(&self) -> Vec<(String, u64)> {
        let figures = self.zones.figures.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(figures.len() * 3);
        for (zone, f) in figures.iter() {
            out.push((format!("zone:{zone}:reads_local"), f.local.get()));
            out.push((format!("zone:{zone}:reads_cross_zone"), f.cross.get()));
            out.push((format!("zone:{zone}:write_backs"), f.write_backs.get()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `memring_zone_warming` samples of `stats`, sorted.
    fn warming(stats: &Stats) -> Vec<String> {
        let mut lines: Vec<String> = stats
            .prometheus_text()
            .lines()
            .filter(|l| l.starts_with("memring_zone_warming{"))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn a_zone_no_pool_has_any_more_loses_its_warming_series() {
        let stats = Stats::new();
        stats.pool_zones("default", [("a", false), ("b", false), ("c", true)]);
        stats.pool_zones("other", [("c", true)]);
        assert_eq!(
            warming(&stats),
            [
                "memring_zone_warming{zone=\"a\"} 0",
                "memring_zone_warming{zone=\"b\"} 0",
                "memring_zone_warming{zone=\"c\"} 1",
            ]
        );
        // A reload takes zones b and c out of the default pool: b goes, c
        // stays while the other pool has it.
        stats.pool_zones("default", [("a", false)]);
        assert_eq!(
            warming(&stats),
            [
                "memring_zone_warming{zone=\"a\"} 0",
                "memring_zone_warming{zone=\"c\"} 1",
            ]
        );
        // The other pool is removed: c goes too.
        stats.pool_zones("other", []);
        assert_eq!(warming(&stats), ["memring_zone_warming{zone=\"a\"} 0"]);
    }
}
