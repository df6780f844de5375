//! The one place in `stats/` that counts by what a reply says (its
//! `protocol::outcome`, as the connection framed it): whether a `touch`,
//! `delete`, `incr`, `decr` or `cas` found its key, and how an `ms` with `C`
//! ended. Everything else in `stats/` is handed its counts.

use crate::protocol::outcome::Outcome;
use crate::protocol::Command;
use crate::stats::families::client::HitMiss;
use crate::stats::Stats;

impl Stats {
    /// Counts hits and misses from what a one-line backend reply to
    /// `command` said (retrievals are counted by [`Stats::retrieval`]).
    pub fn reply(&self, command: Command, outcome: Outcome) {
        let found = |counters: &HitMiss, hit: Outcome| {
            if outcome == hit {
                counters.hits.inc();
            } else if outcome == Outcome::NotFound {
                counters.misses.inc();
            }
        };
        let client = &self.client;
        match command {
            Command::Touch => found(&client.touch, Outcome::Touched),
            Command::Cas => {
                match outcome {
                    Outcome::Stored => client.cas.hits.inc(),
                    Outcome::NotFound => client.cas.misses.inc(),
                    Outcome::Exists => client.cas.badval.inc(),
                    _ => 0,
                };
            }
            Command::Delete => found(&client.delete, Outcome::Deleted),
            Command::Incr => found(&client.incr, Outcome::Number),
            Command::Decr => found(&client.decr, Outcome::Number),
            _ => {}
        }
    }

    /// Counts the reply to an `ms` with `C` in set mode, the meta writes
    /// memcached counts in its `cas_*` stats. Nothing is an `HD` that `q`
    /// suppressed (`q` never hides `NF` or `EX`).
    pub fn meta_cas(&self, outcome: Outcome) {
        let cas = &self.client.cas;
        match outcome {
            Outcome::Nothing | Outcome::Hd => cas.hits.inc(),
            Outcome::Nf => cas.misses.inc(),
            Outcome::Ex => cas.badval.inc(),
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
        for said in [
            Outcome::Stored,
            Outcome::Exists,
            Outcome::NotFound,
            Outcome::Error,
        ] {
            stats.reply(Command::Cas, said);
        }
        assert_eq!(stats.cas_counts(), (1, 1, 1));
        // A quiet `ms` that stored says nothing.
        for said in [
            Outcome::Hd,
            Outcome::Nothing,
            Outcome::Hd,
            Outcome::Ex,
            Outcome::Nf,
        ] {
            stats.meta_cas(said);
        }
        stats.meta_cas(Outcome::Ns);
        stats.meta_cas(Outcome::ServerError);
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
