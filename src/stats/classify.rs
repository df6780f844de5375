//! The one place in `stats/` that reads a reply's bytes to learn what it
//! says: whether a `touch`, `delete`, `incr`, `decr` or `cas` found its key,
//! and how an `ms` with `C` ended. Everything else in `stats/` is handed its
//! counts.
//!
//! TODO(#50): take the outcome the framer in `backend/conn.rs` classified
//! the reply as (issue 50 item 1) instead of matching its bytes here; then
//! `stats` counts by (command, outcome) and this file goes.

use crate::protocol::Command;
use crate::stats::families::client::HitMiss;
use crate::stats::Stats;

impl Stats {
    /// Counts hits and misses from a one-line backend reply to `command`
    /// (retrievals are counted by [`Stats::retrieval`]).
    pub fn reply(&self, command: Command, reply: &[u8]) {
        let found = |counters: &HitMiss, hit: &[u8], miss: &[u8]| {
            if reply.starts_with(hit) {
                counters.hits.inc();
            } else if reply.starts_with(miss) {
                counters.misses.inc();
            }
        };
        let client = &self.client;
        match command {
            Command::Touch => found(&client.touch, b"TOUCHED", b"NOT_FOUND"),
            Command::Cas => {
                if reply.starts_with(b"STORED") {
                    client.cas.hits.inc();
                } else if reply.starts_with(b"NOT_FOUND") {
                    client.cas.misses.inc();
                } else if reply.starts_with(b"EXISTS") {
                    client.cas.badval.inc();
                }
            }
            Command::Delete => found(&client.delete, b"DELETED", b"NOT_FOUND"),
            Command::Incr | Command::Decr => {
                let counters = if command == Command::Incr {
                    &client.incr
                } else {
                    &client.decr
                };
                if reply.first().is_some_and(u8::is_ascii_digit) {
                    counters.hits.inc();
                } else if reply.starts_with(b"NOT_FOUND") {
                    counters.misses.inc();
                }
            }
            _ => {}
        }
    }

    /// Counts the reply to an `ms` with `C` in set mode, the meta writes
    /// memcached counts in its `cas_*` stats. Empty is an `HD` that `q`
    /// suppressed (`q` never hides `NF` or `EX`).
    pub fn meta_cas(&self, reply: &[u8]) {
        let code = reply.get(..2).unwrap_or(reply);
        let ends = matches!(reply.get(2), None | Some(b' ' | b'\r'));
        let cas = &self.client.cas;
        match code {
            b"" => cas.hits.inc(),
            b"HD" if ends => cas.hits.inc(),
            b"NF" if ends => cas.misses.inc(),
            b"EX" if ends => cas.badval.inc(),
            _ => 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_replies_are_counted_by_result() {
        let stats = Stats::new();
        for reply in [
            &b"STORED\r\n"[..],
            b"EXISTS\r\n",
            b"NOT_FOUND\r\n",
            b"ERROR\r\n",
        ] {
            stats.reply(Command::Cas, reply);
        }
        assert_eq!(stats.cas_counts(), (1, 1, 1));
        for reply in [&b"HD\r\n"[..], b"", b"HD O1 k\r\n", b"EX\r\n", b"NF O2\r\n"] {
            stats.meta_cas(reply);
        }
        stats.meta_cas(b"NS\r\n");
        stats.meta_cas(b"SERVER_ERROR out of memory\r\n");
        assert_eq!(stats.cas_counts(), (4, 2, 2));
        let text = stats.prometheus_text();
        assert!(
            text.contains("memring_cas_total{result=\"badval\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE memring_cpu_seconds_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("memring_cpu_seconds_total{mode=\"user\"} "),
            "{text}"
        );
    }
}
