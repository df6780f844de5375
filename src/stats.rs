//! Process-wide counters and the `stats` reply built from them. Counters are
//! relaxed atomics: exact totals matter, ordering between them does not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;

use crate::protocol::encode::write_stat;
use crate::topology::Topology;

/// Counters shared by every session.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_other: AtomicU64,
    pub backend_errors: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            started: Instant::now(),
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            cmd_get: AtomicU64::new(0),
            cmd_set: AtomicU64::new(0),
            cmd_other: AtomicU64::new(0),
            backend_errors: AtomicU64::new(0),
        }
    }
}

/// Adds one to a counter.
#[inline]
pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Stats {
    /// The `stats` reply: memring's own figures in memcached's format, then one
    /// line per server, then `END`.
    pub fn write_report(&self, out: &mut BytesMut, topology: &Topology) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        write_stat(out, "pid", &std::process::id());
        write_stat(out, "uptime", &self.started.elapsed().as_secs());
        write_stat(out, "time", &now);
        write_stat(out, "version", &crate::VERSION_STRING);
        write_stat(out, "curr_connections", &load(&self.curr_connections));
        write_stat(out, "total_connections", &load(&self.total_connections));
        write_stat(out, "cmd_get", &load(&self.cmd_get));
        write_stat(out, "cmd_set", &load(&self.cmd_set));
        write_stat(out, "backend_errors", &load(&self.backend_errors));
        write_stat(out, "ring_version", &topology.version);
        write_stat(out, "ring_servers", &topology.backends.len());
        write_stat(out, "ring_ejected", &topology.ejected.len());
        let shares = topology.shares();
        for (i, backend) in topology.backends.iter().enumerate() {
            let prefix = format!("server:{}", backend.name());
            write_stat(out, &format!("{prefix}:addr"), &backend.addr());
            write_stat(out, &format!("{prefix}:state"), &backend.state().as_str());
            let share = shares.get(i).copied().unwrap_or(0.0);
            write_stat(
                out,
                &format!("{prefix}:ring_share"),
                &format_args!("{share:.4}"),
            );
        }
        out.extend_from_slice(b"END\r\n");
    }
}
