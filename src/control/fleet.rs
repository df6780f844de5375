//! Every sidecar switches together: with etcd, a membership change that
//! moves reads is first *staged* (reads stay on the ring in force, every
//! write also reaches the keys' owners on the new ring: the staged ring of
//! `Topology::warming_replicas`), and reads move to the new ring only once
//! every live sidecar under `<prefix>proxies/` says it staged the change
//! (or applied it), or after `fleet_switch_ms`. So no sidecar writes only
//! to a key's previous owner while another reads its new one.
//!
//! This module holds the decisions; `control/etcd/` runs them on its
//! watch (it publishes, registers and asks etcd).

use std::time::{Duration, Instant};

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
/// to read from: servers joining the ring or leaving it. A change of a
/// common server's weight is not staged (it is applied at once, as
/// before), nor one of warming servers or addresses only.
pub(crate) fn moves_reads(in_force: &[ServerConfig], target: &[ServerConfig]) -> bool {
    let (now, then) = (read_ring(in_force), read_ring(target));
    if now == then {
        return false;
    }
    let reweighted = now
        .iter()
        .any(|(name, w)| then.iter().any(|(n, v)| n == name && v != w));
    !reweighted
}

/// The servers of a staged change from `in_force` to `target`: every server
/// in force stays on the ring (`staged_out` when `target` drops it or
/// leaves it warming), every server of `target` not on the ring in force
/// is off it (`warming`), so the staged ring is `target`'s. Of those, a
/// server warming now (JOINING) keeps taking writes; any other is
/// `staged_in`: it takes deletes only (see `ServerConfig::staged_in`).
pub(crate) fn staged_servers(
    in_force: &[ServerConfig],
    target: &[ServerConfig],
) -> Vec<ServerConfig> {
    let mut staged = Vec::with_capacity(in_force.len() + target.len());
    for server in in_force.iter().filter(|s| !s.warming) {
        let then = target.iter().find(|t| t.name == server.name);
        let mut kept = server.clone();
        kept.staged_out = then.map_or(true, |t| t.warming);
        staged.push(kept);
    }
    for server in target {
        let on_ring = in_force.iter().any(|s| !s.warming && s.name == server.name);
        if !on_ring {
            let warmed = in_force.iter().any(|s| s.warming && s.name == server.name);
            let mut joining = server.clone();
            joining.staged_in = !server.warming && !warmed;
            joining.warming = true;
            staged.push(joining);
        }
    }
    staged
}

/// What a sidecar's registration says: the revision it applied and the
/// one it staged (0: none).
fn said(value: &[u8]) -> Option<(i64, i64)> {
    let value: serde_json::Value = serde_json::from_slice(value).ok()?;
    let revision = value.get("revision")?.as_i64()?;
    let staged = value.get("staged").and_then(|s| s.as_i64()).unwrap_or(0);
    Some((revision, staged))
}

/// The registrations under `<prefix>proxies/` (`read`: key and value) that
/// have neither staged nor applied `revision`, this sidecar's (`me`) aside.
/// A value that is not a sidecar's registration is not waited on.
pub(crate) fn lagging(read: &[(String, Vec<u8>)], me: &str, revision: i64) -> Vec<String> {
    read.iter()
        .filter(|(key, _)| key != me)
        .filter(|(_, value)| {
            said(value).is_some_and(|(applied, staged)| applied < revision && staged < revision)
        })
        .map(|(key, _)| key.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, warming: bool) -> ServerConfig {
        ServerConfig {
            addr: format!("127.0.0.1:{}", 1000 + name.len()),
            name: name.into(),
            weight: 1,
            tls: false,
            warming,
            staged_out: false,
            staged_in: false,
            zone: None,
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
                ("k", true, false, false),
            ]
        );
    }

    #[test]
    fn only_changes_of_the_read_ring_are_staged() {
        let in_force = [server("a", false), server("b", false)];
        let joining = [server("a", false), server("b", false), server("c", true)];
        assert!(!moves_reads(&in_force, &joining), "a JOINING member");
        let mut heavier = in_force.clone();
        heavier[1].weight = 2;
        assert!(!moves_reads(&in_force, &heavier), "a reweight");
        assert!(moves_reads(&in_force, &in_force[..1]));
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
        assert_eq!(lagging(&read, "me", 7), ["old"]);
    }
}
