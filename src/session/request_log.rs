//! `[request_log]`: one log line (tracing target `memring::request_log`)
//! for a finished request that was sampled, slow, or answered with an
//! error. One per worker, on its thread (`Cell`s, no locks).
//!
//! What it costs: with the table absent (or `sample = 0`, `slow_ms = 0`,
//! `errors = false`) the request path reads one precomputed flag
//! ([`RequestLog::on`]) and nothing else. With it on, each finished request
//! compares its latency (already measured for the histograms) and steps a
//! per-worker xorshift for the sample: no syscall, no allocation. Only a
//! request that is sampled, slow, or (with `errors`) has its reply's first
//! line classified, and only a request that is logged formats anything.
//! A worker writes at most `max_lines_per_s` lines a second; the rest are
//! counted (`memring_request_log_dropped_total`) and not written, so a
//! storm of slow or failed requests cannot make the log the bottleneck.
//!
//! What a line says is what is cheaply known where the request finishes:
//! the server it was planned on (the first, for a request several servers
//! answer) and the path its plan took (`owner`, `replicas`, `handoff`,
//! `read_through`, `lease_retry`, `multi` for a multi-key get). A
//! multi-key get names its first key and its number of keys. Replies
//! memring makes itself before any plan (parse errors) are not logged.

use std::cell::Cell;
use std::net::SocketAddr;

use super::work::{Entry, Finish, Work};
use crate::config::RequestLogSettings;
use crate::plan::steps::Machine;
use crate::protocol::meta::parse_meta;
use crate::protocol::outcome::Outcome;
use crate::runtime::outbuf::OutQueue;

/// Nanoseconds in one second, the rate limit's window.
const WINDOW_NANOS: u64 = 1_000_000_000;

/// Makes each worker's sampling sequence its own.
static NEXT_SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One worker's request log.
pub(crate) struct RequestLog {
    /// Some request may be logged: the only thing the request path reads
    /// when the log is off.
    pub(crate) on: bool,
    /// A request at least this slow (ns) is logged; `u64::MAX`: none.
    slow_nanos: u64,
    /// A request is sampled when the next draw is below this (`None`: no
    /// sampling; `Some(u64::MAX)` with `sample = 1`: every one).
    sample_below: Option<u64>,
    errors: bool,
    plain_keys: bool,
    max_lines_per_s: u64,
    /// The per-worker xorshift64 state of the sampling draws.
    draw: Cell<u64>,
    /// The rate limit's current window (nanoseconds of the worker clock,
    /// divided by [`WINDOW_NANOS`]) and the lines written in it.
    window: Cell<u64>,
    lines: Cell<u64>,
    dropped: prometheus_client::metrics::counter::Counter,
}

/// Why a request is logged (the first that holds, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Error,
    Slow,
    Sampled,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Error => "error",
            Reason::Slow => "slow",
            Reason::Sampled => "sampled",
        }
    }
}

impl RequestLog {
    /// A worker's log, its dropped lines counted in `dropped`.
    pub(crate) fn new(
        settings: RequestLogSettings,
        dropped: prometheus_client::metrics::counter::Counter,
    ) -> RequestLog {
        // Exact enough: a share of 2^64.
        let sample_below = (settings.sample > 0.0).then_some(if settings.sample >= 1.0 {
            u64::MAX
        } else {
            (settings.sample * u64::MAX as f64) as u64
        });
        RequestLog {
            on: settings.any(),
            slow_nanos: match settings.slow_ms {
                0 => u64::MAX,
                ms => ms.saturating_mul(1_000_000),
            },
            sample_below,
            errors: settings.errors,
            plain_keys: settings.plain_keys,
            max_lines_per_s: settings.max_lines_per_s,
            // Any nonzero seed; each worker draws its own sequence.
            draw: Cell::new(
                0x9E37_79B9_7F4A_7C15
                    ^ (NEXT_SEED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 1),
            ),
            window: Cell::new(0),
            lines: Cell::new(0),
            dropped,
        }
    }

    /// Whether a request that took `took` ns and whose answer says `said`
    /// may be logged: inline, so a log that is on and finds nothing slow or
    /// failed (no sampling) costs the request path a comparison or two, not
    /// a call.
    #[inline]
    pub(super) fn may_log(&self, took: u64, said: Outcome) -> bool {
        took >= self.slow_nanos || (self.errors && said.is_error()) || self.sample_below.is_some()
    }

    /// The next sampling draw: xorshift64, a few instructions.
    fn next_draw(&self) -> u64 {
        let mut x = self.draw.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.draw.set(x);
        x
    }

    fn sampled(&self) -> bool {
        match self.sample_below {
            None => false,
            Some(u64::MAX) => true,
            Some(below) => self.next_draw() < below,
        }
    }

    /// Whether one more line fits this second's allowance at `now` (worker
    /// clock nanoseconds); a line that does not is counted as dropped.
    fn admit(&self, now: u64) -> bool {
        let window = now / WINDOW_NANOS;
        if window != self.window.get() {
            self.window.set(window);
            self.lines.set(0);
        }
        if self.lines.get() >= self.max_lines_per_s {
            self.dropped.inc();
            return false;
        }
        self.lines.set(self.lines.get() + 1);
        true
    }
}

/// Where a finished request's reply starts in the client's queue, taken
/// before it is finished; `None` when the log is off.
pub(super) fn mark(log: &RequestLog, out: &OutQueue) -> Option<usize> {
    log.on.then(|| out.len())
}

/// What is known of a finished request where it finishes.
pub(super) struct Finished<'a> {
    pub(super) entry: &'a Entry,
    /// The client's address, when it has one.
    pub(super) peer: Option<&'a SocketAddr>,
    /// The client's reply queue, with this request's reply from `from`.
    pub(super) out: &'a OutQueue,
    pub(super) from: usize,
    /// The request's latency, ns.
    pub(super) took: u64,
    /// The worker clock now, ns.
    pub(super) now: u64,
    /// The pool the request was planned on, looked up only when logged.
    pub(super) pool: &'a dyn Fn() -> String,
}

/// Logs `done` if it was sampled, slow, or an error the log asks for.
pub(super) fn finished(log: &RequestLog, done: Finished<'_>) {
    let slow = done.took >= log.slow_nanos;
    let sampled = !slow && log.sampled();
    if !(slow || sampled || log.errors) {
        return;
    }
    // What the answer says, as the connection (or memring) classified it.
    let outcome = done.entry.said;
    let reason = if log.errors && outcome.is_error() {
        Reason::Error
    } else if slow {
        Reason::Slow
    } else if sampled {
        Reason::Sampled
    } else {
        return;
    };
    if !log.admit(done.now) {
        return;
    }
    let entry = done.entry;
    let (server, path) = route_of(entry);
    let (key, keys) = key_of(entry);
    let key_text = match key {
        None => String::from("-"),
        Some(key) if log.plain_keys => String::from_utf8_lossy(&key).into_owned(),
        Some(key) => crate::hotkeys::top::hashed_label(crate::hotkeys::key_hash(&key)),
    };
    let server = server.map_or("-", |s| s);
    let client = done
        .peer
        .map_or_else(|| String::from("-"), ToString::to_string);
    tracing::info!(
        target: "memring::request_log",
        reason = reason.as_str(),
        client = %client,
        command = entry.command.name(),
        key = %key_text,
        keys,
        pool = %(done.pool)(),
        server,
        path,
        outcome = ?outcome,
        request_bytes = entry.bytes.len(),
        reply_bytes = done.out.len().saturating_sub(done.from),
        latency_us = done.took / 1000,
        "request"
    );
}

/// The server a request was planned on (the first of several) and the path
/// its plan took.
fn route_of(entry: &Entry) -> (Option<&str>, &'static str) {
    let backends = &entry.topology.backends;
    let name = |server: usize| backends.get(server).map(|b| b.name());
    let first = |parts: &[super::work::Part]| parts.first().and_then(|p| name(p.server));
    match &entry.work {
        Work::Lines { parts, finish, .. } => {
            let path = match finish {
                Finish::Forward => "owner",
                // Warming servers and former replicas losing the key are
                // sent the write too, but only the replicas count for it.
                Finish::Quorum { forget, warm, .. }
                    if parts.len() > (*forget + *warm) as usize + 1 =>
                {
                    "replicas"
                }
                Finish::Quorum { .. } => "owner",
                Finish::AllOk(_) => "all",
            };
            (first(parts), path)
        }
        Work::Steps(steps) => {
            let path = match steps.machine {
                Machine::Cas(_) | Machine::Add(_) => "replicas",
                Machine::Lease(_) => "lease_retry",
                Machine::Moved(_) => "handoff",
                Machine::Read(_) => "read_through",
            };
            (name(steps.machine.first_server()), path)
        }
        Work::Retrieve { plan, .. } => {
            let many = entry.request.keys.len() > 1;
            let owner = match entry.request.keys.first() {
                // An `mg` (its entry holds no classic request): the server
                // its plan asked.
                None => plan.owner(0).and_then(name),
                Some(_) if many => None,
                Some(key) => entry.topology.owner(key.of(&entry.bytes)).map(|b| b.name()),
            };
            (owner, if many { "multi" } else { "owner" })
        }
        Work::Ready(_) | Work::Stats | Work::StatsReset => (None, "memring"),
    }
}

/// The request's (first) key and how many keys it has. A meta request's
/// key is read again from its bytes by the meta parser (only for a request
/// that is logged).
fn key_of(entry: &Entry) -> (Option<Vec<u8>>, usize) {
    if let Some(first) = entry.request.keys.first() {
        return (
            Some(first.of(&entry.bytes).to_vec()),
            entry.request.keys.len(),
        );
    }
    let limits = entry.topology.limits();
    match parse_meta(&entry.bytes, &limits) {
        Ok(Some((request, _))) if request.key.is_some() => {
            (Some(request.routing_key(&entry.bytes).as_ref().to_vec()), 1)
        }
        _ => (None, 0),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use smallvec::smallvec;

    use super::route_of;
    use crate::pools::planned::Planned;
    use crate::protocol::reply::Expect;
    use crate::session::work::{Entry, Finish, MetaLines, Part, Work};

    /// A replicated write's parts on `servers` (of s1..s5), `forget` and
    /// `warm` of them not replicas, in either dialect (with the runtime
    /// its backends were built in, to outlive them).
    fn quorum_entry(
        servers: &[usize],
        forget: u32,
        warm: u32,
        meta: bool,
    ) -> (tokio::runtime::Runtime, Entry) {
        let (runtime, topology) = crate::pools::topology::tests::four_and_one_warming("");
        let mut entry = Entry::ready(b"", Planned::on(Arc::new(topology)));
        entry.work = Work::Lines {
            parts: servers.iter().map(|&s| Part::new(s)).collect(),
            finish: Finish::Quorum {
                quorum: 1,
                forget,
                warm,
                older: None,
                forget_last: false,
            },
            meta: meta.then(|| {
                Box::new(MetaLines {
                    counts_cas: false,
                    wire: smallvec![Bytes::from_static(b"ms k 1\r\nv\r\n")],
                    expect: Expect::meta(crate::protocol::meta::MetaCommand::Set, false),
                    key: (Bytes::new(), false),
                })
            }),
        };
        (runtime, entry)
    }

    #[test]
    fn a_write_to_one_replica_logs_its_owner_in_both_dialects() {
        for meta in [false, true] {
            // One replica (an older ring's owner forgotten first), then one
            // replica beside a former one losing the key and a warming one.
            for (servers, forget, warm) in [(&[1][..], 0, 0), (&[1, 2, 4][..], 1, 1)] {
                let (_runtime, entry) = quorum_entry(servers, forget, warm, meta);
                assert_eq!(route_of(&entry), (Some("s2"), "owner"), "meta {meta}");
            }
            let (_runtime, entry) = quorum_entry(&[2, 0, 3], 1, 0, meta);
            assert_eq!(route_of(&entry), (Some("s3"), "replicas"), "meta {meta}");
        }
    }
}
