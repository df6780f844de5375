//! Every sidecar switches together: with etcd, a membership change that
//! moves reads is first *staged* (reads stay on the ring in force, every
//! write also reaches the keys' owners on the new ring: the staged ring of
//! `Topology::warming_replicas`), and reads move to the new ring only once
//! every live sidecar under `<prefix>proxies/` says it writes the new
//! servers (it staged the change or applied it: [`rings_written`]), or
//! after `fleet_switch_ms`. So no sidecar writes only
//! to a key's previous owner while another reads its new one.
//!
//! This module holds the decisions; `control/etcd/` runs them on its
//! watch (it publishes, registers and asks etcd).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::ServerConfig;

/// How often a staged change asks etcd whether every sidecar staged it.
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// How often a staged change looks whether the requests planned before it
/// have finished (a look reads a few counters, nothing leaves memring).
const DRAIN_POLL: Duration = Duration::from_millis(5);
/// Longest wait, after staging, before this sidecar says it staged even
/// though requests planned on a topology before the staged one are still
/// in flight: they have timed out by then (`request_timeout`, capped here).
const DRAIN_CAP: Duration = Duration::from_secs(5);

/// A change staged and not switched to yet.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The membership revision staged.
    pub(crate) revision: i64,
    /// The servers the fleet switches to.
    pub(crate) target: Vec<ServerConfig>,
    /// Their [`servers_digest`].
    pub(crate) digest: u64,
    /// The servers in force (without staging marks).
    pub(crate) in_force: Vec<ServerConfig>,
    /// When the first change of this chain was staged (the bound counts
    /// from here, so a stream of changes cannot postpone it for ever).
    pub(crate) since: Instant,
    /// The version of the staged topology: this sidecar says it staged the
    /// change once no request planned on an older one is in flight.
    pub(crate) staged_version: u64,
    /// ... or from then on, whatever is still in flight.
    drain_by: Instant,
    /// This sidecar says, in its registration, that it staged the change.
    drained: bool,
    /// The live sidecars not there yet at the last look.
    pub(crate) waiting: usize,
}

impl Pending {
    /// A change to `target` at `revision`, staged now over `in_force` in
    /// the topology of version `staged_version`; the requests planned
    /// before it are waited for at most `drain` (`request_timeout`).
    pub(crate) fn new(
        revision: i64,
        target: Vec<ServerConfig>,
        in_force: Vec<ServerConfig>,
        since: Option<Instant>,
        staged_version: u64,
        drain: Duration,
    ) -> Pending {
        let now = Instant::now();
        Pending {
            revision,
            digest: servers_digest(&target),
            target,
            in_force,
            since: since.unwrap_or(now),
            staged_version,
            drain_by: now + drain.min(DRAIN_CAP),
            drained: false,
            waiting: 0,
        }
    }

    /// Whether this sidecar says, in its registration, that it staged.
    pub(crate) fn said(&self) -> bool {
        self.drained
    }

    /// `in_flight` requests planned on a topology before the staged one are
    /// in flight at `now`: whether this sidecar says it staged from now on
    /// (none is left, or the bound is over; said once, said for good).
    pub(crate) fn drain(&mut self, in_flight: usize, now: Instant) -> bool {
        if !self.drained && (in_flight == 0 || now >= self.drain_by) {
            self.drained = true;
            if in_flight > 0 {
                tracing::warn!(
                    "etcd revision {}: {in_flight} request{} planned before the change was staged still in flight after request_timeout: saying it is staged anyway",
                    self.revision,
                    if in_flight == 1 { "" } else { "s" }
                );
            }
        }
        self.drained
    }

    /// When the gate looks again: soon while requests planned before are
    /// draining, at the pace of etcd reads once it waits for the others.
    pub(crate) fn poll(&self) -> Duration {
        if self.drained {
            POLL
        } else {
            DRAIN_POLL
        }
    }
}

/// The ring a server list reads from: the servers that are not warming,
/// by name, with their weights.
fn read_ring(servers: &[ServerConfig]) -> Vec<(&str, u32)> {
    let mut ring: Vec<(&str, u32)> = servers
        .iter()
        .filter(|s| !s.warming)
        .map(|s| (s.name.as_str(), s.weight))
        .collect();
    ring.sort_unstable();
    ring
}

/// Whether going from `in_force` to `target` gives some key another owner
/// to read from: servers joining the ring or leaving it, or a server's
/// weight changing (it moves keys as a join does). A change of warming
/// servers or of addresses only is not staged.
pub(crate) fn moves_reads(in_force: &[ServerConfig], target: &[ServerConfig]) -> bool {
    read_ring(in_force) != read_ring(target)
}

/// Whether the fleet must agree on going from `in_force` to `target` before
/// this sidecar applies it: it moves reads, or a server starts warming
/// (JOINING) that the servers in force do not hold. Written by one sidecar
/// while another, that has not applied JOINING yet, writes a key only to
/// its owner, the warming server would hold an older value that reads find
/// once it turns ACTIVE; so it takes deletes only (`staged_in`) until every
/// live sidecar staged its JOINING, and warms from then on.
pub(crate) fn gated(in_force: &[ServerConfig], target: &[ServerConfig]) -> bool {
    moves_reads(in_force, target)
        || target
            .iter()
            .any(|t| t.warming && !in_force.iter().any(|s| s.name == t.name))
}

/// The servers of a staged change from `in_force` to `target`: every server
/// in force stays on the ring (`staged_out` when `target` drops it or
/// leaves it warming, `staged_weight` when `target` gives it another
/// weight), every server of `target` not on the ring in force is off it
/// (`warming`), so the staged ring is `target`'s. Of those, a server
/// warming now (JOINING in force) keeps taking writes; any other, JOINING
/// in `target` or not, is `staged_in`: it takes deletes only (see
/// `ServerConfig::staged_in` and [`gated`]).
pub(crate) fn staged_servers(
    in_force: &[ServerConfig],
    target: &[ServerConfig],
) -> Vec<ServerConfig> {
    let mut staged = Vec::with_capacity(in_force.len() + target.len());
    for server in in_force.iter().filter(|s| !s.warming) {
        let then = target.iter().find(|t| t.name == server.name);
        let mut kept = server.clone();
        kept.staged_out = then.map_or(true, |t| t.warming);
        kept.staged_weight = then
            .filter(|t| !t.warming && t.weight != server.weight)
            .map(|t| t.weight);
        staged.push(kept);
    }
    for server in target {
        let on_ring = in_force.iter().any(|s| !s.warming && s.name == server.name);
        if !on_ring {
            let warmed = in_force.iter().any(|s| s.warming && s.name == server.name);
            let mut joining = server.clone();
            joining.staged_in = !warmed;
            joining.warming = true;
            staged.push(joining);
        }
    }
    staged
}

/// The digest of a server list as sidecars compare it: each server's
/// name, address, weight, zone and whether it warms (JOINING), in name
/// order, so two sidecars that hold the same list have the same digest
/// however they learned it (a watch, a full read, a start) and whatever
/// revision that gave them. 0 is never a digest (it means none).
pub(crate) fn servers_digest(servers: &[ServerConfig]) -> u64 {
    let mut sorted: Vec<&ServerConfig> = servers.iter().collect();
    sorted.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut bytes = Vec::with_capacity(sorted.len() * 48);
    for s in sorted {
        for part in [
            s.name.as_bytes(),
            s.addr.as_bytes(),
            s.zone.as_deref().unwrap_or("").as_bytes(),
        ] {
            bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
            bytes.extend_from_slice(part);
        }
        bytes.extend_from_slice(&s.weight.to_le_bytes());
        bytes.extend_from_slice(&[u8::from(s.warming), u8::from(s.tls)]);
    }
    twox_hash::XxHash3_64::oneshot(&bytes).max(1)
}

/// `<prefix>staged`: a change staged by the fleet and not switched to yet,
/// with the servers in force, so that a sidecar that starts meanwhile
/// starts on the ring the others read from, with the change staged, rather
/// than on the new ring (which a sidecar that has not staged the change
/// yet does not write).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StagedRecord {
    /// The revision staged.
    pub(crate) revision: i64,
    /// The revision in force.
    pub(crate) applied: i64,
    /// [`servers_digest`] of the servers staged, in hex.
    pub(crate) target_digest: String,
    /// The servers reads use.
    in_force: Vec<RecordedServer>,
}

/// One server in force, as [`StagedRecord`] keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RecordedServer {
    name: String,
    addr: String,
    weight: u32,
    #[serde(default)]
    tls: bool,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    warming: bool,
}

impl StagedRecord {
    /// The record of `pending`, staged over the revision `applied`.
    pub(crate) fn of(pending: &Pending, applied: i64) -> StagedRecord {
        StagedRecord {
            revision: pending.revision,
            applied,
            target_digest: crate::ring::digest::hex(pending.digest),
            in_force: pending
                .in_force
                .iter()
                .map(|s| RecordedServer {
                    name: s.name.clone(),
                    addr: s.addr.clone(),
                    weight: s.weight,
                    tls: s.tls,
                    zone: s.zone.clone(),
                    warming: s.warming,
                })
                .collect(),
        }
    }

    /// The servers in force to start on, when this record stages `target`
    /// (the servers a starting sidecar read) and that moves reads; `None`
    /// for a record of another change (an older one whose record was left,
    /// or one this sidecar read past).
    pub(crate) fn in_force_for(&self, target: &[ServerConfig]) -> Option<Vec<ServerConfig>> {
        let digest = crate::ring::digest::parse_hex(&self.target_digest)?;
        if digest != servers_digest(target) {
            return None;
        }
        let in_force: Vec<ServerConfig> = self
            .in_force
            .iter()
            .map(|s| ServerConfig {
                weight: s.weight,
                tls: s.tls,
                warming: s.warming,
                zone: s.zone.clone(),
                ..ServerConfig::plain(s.name.clone(), s.addr.clone())
            })
            .collect();
        moves_reads(&in_force, target).then_some(in_force)
    }
}

/// What one sidecar's registration says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    /// The revision it applied (reads).
    applied: i64,
    /// The revision it staged (0: none).
    staged: i64,
    /// [`servers_digest`] of the servers it reads from and of those it
    /// staged (0: none, or a sidecar that does not say).
    applied_digest: u64,
    staged_digest: u64,
    /// `writes`: the [`servers_digest`] of every server list each write
    /// through it reaches (see [`rings_written`]); `None` for a
    /// registration of a memring before this field, which is judged by
    /// its digests and revisions as then.
    writes: Option<Vec<u64>>,
}

fn said(value: &[u8]) -> Option<Said> {
    let value: serde_json::Value = serde_json::from_slice(value).ok()?;
    let digest = |name: &str| {
        value
            .get(name)
            .and_then(|d| d.as_str())
            .and_then(crate::ring::digest::parse_hex)
            .unwrap_or(0)
    };
    let writes = value.get("writes").and_then(|w| w.as_array()).map(|w| {
        w.iter()
            .filter_map(|d| d.as_str().and_then(crate::ring::digest::parse_hex))
            .collect()
    });
    Some(Said {
        applied: value.get("revision")?.as_i64()?,
        staged: value.get("staged").and_then(|s| s.as_i64()).unwrap_or(0),
        applied_digest: digest("applied_digest"),
        staged_digest: digest("staged_digest"),
        writes,
    })
}

/// The `writes` of a registration, in hex: the server lists every write
/// through the sidecar reaches, the value or a delete on each key's owner
/// in each: the servers it reads from (`applied_digest`) and, once it says
/// it staged a change (its requests planned before are over), the staged
/// ones (`staged_digest`, 0: none). A change staged in place of another
/// replaces it here: the sidecar no longer writes the first one's new
/// owners. The previous rings of a hand-off window are not listed: their
/// deletes end with the window, on a timer of each sidecar's own.
pub(crate) fn rings_written(applied_digest: u64, staged_digest: u64) -> Vec<String> {
    [applied_digest, staged_digest]
        .into_iter()
        .filter(|d| *d != 0)
        .map(crate::ring::digest::hex)
        .collect()
}

/// The registrations under `<prefix>proxies/` (`read`: key and value) not
/// there yet for a change to the servers of digest `digest` at `revision`,
/// this sidecar's (`me`) aside: those whose `writes` do not list those
/// servers (every write through them reaches the change's owners only if
/// they do). A value that is not a sidecar's registration is not waited on.
///
/// A registration without `writes` (a memring before it, during a rolling
/// upgrade) is there as it was then: when it holds those servers (applied
/// or staged: the same digest) or staged or applied a revision as late (a
/// later change). The revision alone does not say which servers a later
/// change's sidecar writes: one that staged a later change in place of
/// this one (over the ring in force) never wrote this one's new owners.
///
/// Digests, not revisions: a sidecar that read every member again after a
/// deletion dates it by the store's revision, later than the deletion's,
/// which a sidecar that watched it has; by revisions that one would wait
/// for the other until `fleet_switch_ms`.
pub(crate) fn lagging(
    read: &[(String, Vec<u8>)],
    me: &str,
    revision: i64,
    digest: u64,
) -> Vec<String> {
    read.iter()
        .filter(|(key, _)| key != me)
        .filter(|(_, value)| {
            said(value).is_some_and(|s| match &s.writes {
                Some(writes) => !writes.contains(&digest),
                None => {
                    let holds = s.applied_digest == digest || s.staged_digest == digest;
                    let later = s.applied >= revision || s.staged >= revision;
                    !holds && !later
                }
            })
        })
        .map(|(key, _)| key.clone())
        .collect()
}

/// Whether a registration under `<prefix>proxies/` (`read`) other than
/// `me` reads from the servers of digest `digest` (it applied them): then
/// the fleet has written them since they joined.
pub(crate) fn read_elsewhere(read: &[(String, Vec<u8>)], me: &str, digest: u64) -> bool {
    read.iter()
        .filter(|(key, _)| key != me)
        .any(|(_, value)| said(value).is_some_and(|s| s.applied_digest == digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, warming: bool) -> ServerConfig {
        ServerConfig {
            warming,
            ..ServerConfig::plain(name, format!("127.0.0.1:{}", 1000 + name.len()))
        }
    }

    /// Name, warming, staged out, staged in.
    fn marks(servers: &[ServerConfig]) -> Vec<(&str, bool, bool, bool)> {
        servers
            .iter()
            .map(|s| (s.name.as_str(), s.warming, s.staged_out, s.staged_in))
            .collect()
    }

    #[test]
    fn a_staged_change_keeps_the_ring_in_force_and_stages_the_target() {
        let in_force = [server("a", false), server("b", false), server("j", true)];
        // b leaves, c joins, j turns ACTIVE, k starts JOINING.
        let target = [
            server("a", false),
            server("c", false),
            server("j", false),
            server("k", true),
        ];
        assert!(moves_reads(&in_force, &target));
        let staged = staged_servers(&in_force, &target);
        assert_eq!(
            marks(&staged),
            [
                ("a", false, false, false),
                ("b", false, true, false),
                ("c", true, false, true),
                ("j", true, false, false),
                ("k", true, false, true),
            ]
        );
    }

    #[test]
    fn a_server_that_starts_joining_is_gated_and_takes_deletes_until_the_switch() {
        let in_force = [server("a", false), server("b", false)];
        let joining = [server("a", false), server("b", false), server("j", true)];
        assert!(!moves_reads(&in_force, &joining));
        assert!(gated(&in_force, &joining), "nobody wrote j yet");
        assert_eq!(
            marks(&staged_servers(&in_force, &joining))[2],
            ("j", true, false, true),
            "deletes only"
        );
        assert!(!gated(&joining, &joining), "j warms in force: nothing new");
        let mut heavier = joining.clone();
        heavier[0].weight = 2;
        assert!(gated(&joining, &heavier), "a reweight moves reads");
        let active = [server("a", false), server("b", false), server("j", false)];
        assert_eq!(
            marks(&staged_servers(&joining, &active))[2],
            ("j", true, false, false),
            "warmed: it keeps taking writes while ACTIVE is staged"
        );
        assert_eq!(
            marks(&staged_servers(&in_force, &active))[2],
            ("j", true, false, true),
            "never warmed here: a plain join"
        );
    }

    #[test]
    fn only_changes_of_the_read_ring_are_staged() {
        let in_force = [server("a", false), server("b", false)];
        let joining = [server("a", false), server("b", false), server("c", true)];
        assert!(!moves_reads(&in_force, &joining), "a JOINING member");
        let mut heavier = in_force.clone();
        heavier[1].weight = 2;
        assert!(moves_reads(&in_force, &heavier), "a reweight");
        let staged = staged_servers(&in_force, &heavier);
        let weights: Vec<_> = staged.iter().map(|s| (s.weight, s.staged_weight)).collect();
        assert_eq!(
            weights,
            [(1, None), (1, Some(2))],
            "on the ring in force with its weight"
        );
        assert!(moves_reads(&in_force, &in_force[..1]));
        let mut moved = in_force.clone();
        moved[1].addr = "127.0.0.1:9".into();
        assert!(!moves_reads(&in_force, &moved), "an address only");
    }

    #[test]
    fn a_staged_change_is_said_once_the_requests_planned_before_are_over() {
        let t0 = Instant::now();
        let drain = Duration::from_secs(1);
        let mut p = Pending::new(7, Vec::new(), Vec::new(), None, 3, drain);
        assert!(!p.said(), "not before it looked");
        assert!(!p.drain(2, t0));
        assert!(!p.drain(1, t0 + drain / 2));
        assert!(p.drain(0, t0 + drain / 2), "none left: at once");
        assert!(p.drain(5, t0 + drain / 2), "said for good");
        assert!(p.said());
        assert_eq!(p.poll(), POLL);
        // Requests that never end: the bound.
        let mut stuck = Pending::new(7, Vec::new(), Vec::new(), None, 3, drain);
        assert_eq!(stuck.poll(), DRAIN_POLL);
        assert!(!stuck.drain(1, Instant::now()));
        assert!(stuck.drain(1, Instant::now() + drain));
        // The bound is capped.
        let mut capped = Pending::new(7, Vec::new(), Vec::new(), None, 3, drain * 60);
        assert!(capped.drain(1, Instant::now() + DRAIN_CAP));
    }

    #[test]
    fn a_staged_record_gives_the_servers_in_force_for_its_change_only() {
        let in_force = vec![server("a", false), server("b", false), server("j", true)];
        let target = vec![server("a", false), server("b", false), server("j", false)];
        let pending = Pending::new(9, target.clone(), in_force.clone(), None, 2, Duration::ZERO);
        let text = serde_json::to_string(&StagedRecord::of(&pending, 8)).expect("json");
        let record: StagedRecord = serde_json::from_str(&text).expect("read back");
        assert_eq!(record.in_force_for(&target), Some(in_force.clone()));
        assert_eq!(record.in_force_for(&in_force), None, "another change");
        assert_eq!(record.in_force_for(&target[..2]), None, "another change");
        assert_eq!((record.revision, record.applied), (9, 8));
    }

    #[test]
    fn lagging_sidecars_are_those_neither_staged_nor_applied() {
        let read = vec![
            ("me".to_string(), br#"{"revision":1}"#.to_vec()),
            ("old".to_string(), br#"{"revision":4}"#.to_vec()),
            (
                "staged".to_string(),
                br#"{"revision":4,"staged":7}"#.to_vec(),
            ),
            ("applied".to_string(), br#"{"revision":7}"#.to_vec()),
            ("ahead".to_string(), br#"{"revision":9}"#.to_vec()),
            ("junk".to_string(), b"not json".to_vec()),
        ];
        assert_eq!(lagging(&read, "me", 7, 42), ["old"]);
    }

    #[test]
    fn a_sidecar_holding_the_same_servers_at_an_earlier_revision_is_not_waited_on() {
        let target = [server("a", false), server("b", false)];
        let digest = servers_digest(&target);
        let hex = crate::ring::digest::hex(digest);
        let other = crate::ring::digest::hex(servers_digest(&target[..1]));
        let read = vec![
            // Started after the deletion: read a and b at revision 5.
            (
                "started".to_string(),
                format!(r#"{{"revision":5,"applied_digest":"{hex}"}}"#).into_bytes(),
            ),
            // Staged them, dated by an earlier revision.
            (
                "staged".to_string(),
                format!(r#"{{"revision":4,"staged":6,"staged_digest":"{hex}"}}"#).into_bytes(),
            ),
            (
                "other".to_string(),
                format!(r#"{{"revision":5,"applied_digest":"{other}"}}"#).into_bytes(),
            ),
        ];
        assert_eq!(lagging(&read, "me", 9, digest), ["other"]);
    }

    #[test]
    fn a_sidecar_that_staged_a_later_change_in_place_of_this_one_is_waited_on() {
        let (d0, d1, d2) = (11, 12, 13);
        let hex = crate::ring::digest::hex;
        let registration = |writes: &[u64]| {
            let writes: Vec<String> = writes.iter().map(|d| hex(*d)).collect();
            let value = serde_json::json!({
                "revision": 4,
                "staged": 9,
                "applied_digest": hex(d0),
                "staged_digest": hex(d2),
                "writes": writes,
            });
            ("other".to_string(), value.to_string().into_bytes())
        };
        // Staged change 2 (revision 9) over the ring in force: it writes
        // d0 and d2, not change 1's servers (revision 7).
        let in_place = [registration(&[d0, d2])];
        assert_eq!(lagging(&in_place, "me", 7, d1), ["other"]);
        assert!(lagging(&in_place, "me", 9, d2).is_empty());
        assert!(lagging(&[registration(&[d1, d2])], "me", 7, d1).is_empty());
        // Without `writes` (an older memring): by its revision, as before.
        let old = format!(
            r#"{{"revision":4,"staged":9,"applied_digest":"{}","staged_digest":"{}"}}"#,
            hex(d0),
            hex(d2)
        );
        assert!(lagging(&[("old".into(), old.into_bytes())], "me", 7, d1).is_empty());
        // What a registration writes: the ring in force, and the staged one
        // once said.
        assert_eq!(rings_written(d0, 0), [hex(d0)]);
        assert_eq!(rings_written(d0, d2), [hex(d0), hex(d2)]);
    }

    #[test]
    fn the_servers_digest_is_the_lists_whatever_its_order() {
        let (a, b) = (server("a", false), server("b", false));
        let digest = servers_digest(&[a.clone(), b.clone()]);
        assert_eq!(digest, servers_digest(&[b.clone(), a.clone()]));
        let mut heavier = b.clone();
        heavier.weight = 2;
        let mut joining = b.clone();
        joining.warming = true;
        for changed in [
            vec![a.clone()],
            vec![a.clone(), heavier],
            vec![a.clone(), joining],
        ] {
            assert_ne!(servers_digest(&changed), digest);
        }
    }
}
