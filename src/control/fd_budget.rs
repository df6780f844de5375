//! The file-descriptor budget: how the open file limit (`RLIMIT_NOFILE`) is
//! shared between memring itself, its backend connections and its clients,
//! and whether a new ring fits next to the clients already connected.
//!
//! One budget, the soft limit: a fixed part for memring itself, the backend
//! connections of the ring (and, while a reload settles, of the ring before
//! it), and what is left for clients. A reload that needs more than the
//! clients leave is refused rather than taken from them: a backend connect or
//! an accept that fails with EMFILE hurts clients that were promised a slot.
//!
//! Pure arithmetic: no I/O, no rlimit calls, no tokio here.

use crate::config::Config;

/// Descriptors memring uses whatever its load: stdio, listeners, epoll and
/// its wakers per runtime, inotify, a log file, and a margin for DNS lookups
/// and the flush connection of a returning server.
pub const BASE_FDS: u64 = 64;

/// How the open file limit is shared. Built once at start from the settings
/// that are read only at start (workers, admin listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// The soft open file limit.
    pub nofile: u64,
    /// Descriptors for memring itself and its admin connections.
    pub fixed: u64,
    /// Worker threads: each has its own connections to every server.
    pub workers: u64,
}

/// A ring change that does not fit next to the clients connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the new ring needs {more} more file descriptors than the limit leaves (ulimit -n is {nofile}; raise it or lower connections_per_server)"
)]
pub struct FdShortage {
    /// Descriptors missing.
    pub more: u64,
    /// The open file limit.
    pub nofile: u64,
}

/// Admin connections served at once: a scraper and a few probes need a
/// handful; the rest is headroom. Counted in the budget when
/// `admin_listen` is set.
pub const ADMIN_CONNECTIONS: usize = 64;

impl FdBudget {
    /// The budget for `config` under the soft limit `nofile`.
    pub fn of(config: &Config, nofile: u64) -> FdBudget {
        let admin = if config.admin_listen.is_some() {
            ADMIN_CONNECTIONS as u64
        } else {
            0
        };
        FdBudget {
            nofile,
            fixed: BASE_FDS + admin,
            workers: config.worker_count() as u64,
        }
    }

    /// Descriptors for backends with these `connections_per_server`, one
    /// entry per backend: each worker opens that many to each.
    pub fn backend_fds(&self, connections_per_backend: impl IntoIterator<Item = usize>) -> u64 {
        connections_per_backend
            .into_iter()
            .map(|c| c.max(1) as u64 * self.workers)
            .sum()
    }

    /// Descriptors for the backends of `config`'s servers.
    pub fn config_backend_fds(&self, config: &Config) -> u64 {
        // Every pool's servers, each with its own connections per server.
        let pools = config.pool_list();
        self.backend_fds(pools.iter().flat_map(|pool| {
            let per_server = pool.config.connections_per_server;
            pool.config.servers.iter().map(move |_| per_server)
        }))
    }

    /// Descriptors neither memring itself nor `backend_fds` take.
    fn room_for_clients(&self, backend_fds: u64) -> u64 {
        self.nofile
            .saturating_sub(self.fixed)
            .saturating_sub(backend_fds)
    }

    /// Clients served at once next to `backend_fds`: `max_clients`, or fewer
    /// when the limit does not leave room for them, but at least one (at
    /// start, serving one client beats refusing to run).
    pub fn client_limit(&self, max_clients: usize, backend_fds: u64) -> usize {
        clamp(self.room_for_clients(backend_fds), max_clients).max(1)
    }

    /// The client limit once backends hold `backend_fds`, with `connected`
    /// clients (at least one slot is kept, so memring stays reachable), or
    /// what is missing when the clients connected do not fit.
    ///
    /// # Errors
    /// [`FdShortage`] with the descriptors missing.
    pub fn client_limit_for_ring(
        &self,
        max_clients: usize,
        connected: usize,
        backend_fds: u64,
    ) -> Result<usize, FdShortage> {
        let kept = connected.max(1) as u64;
        let needed = self.fixed.saturating_add(backend_fds).saturating_add(kept);
        if needed > self.nofile {
            return Err(FdShortage {
                more: needed - self.nofile,
                nofile: self.nofile,
            });
        }
        Ok(clamp(self.room_for_clients(backend_fds), max_clients).max(connected))
    }
}

fn clamp(room: u64, max_clients: usize) -> usize {
    usize::try_from(room).unwrap_or(usize::MAX).min(max_clients)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(nofile: u64) -> FdBudget {
        FdBudget {
            nofile,
            fixed: BASE_FDS,
            workers: 2,
        }
    }

    #[test]
    fn the_budget_counts_admin_connections_and_every_workers_backends() {
        let text = "listen = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\nworkers = 3\nconnections_per_server = 2\n[[servers]]\naddr = \"127.0.0.1:3\"\n[[servers]]\naddr = \"127.0.0.1:4\"\n";
        let config = Config::parse(text, "t").unwrap();
        let budget = FdBudget::of(&config, 1024);
        assert_eq!(budget.fixed, BASE_FDS + ADMIN_CONNECTIONS as u64);
        assert_eq!(budget.config_backend_fds(&config), 2 * 2 * 3);
    }

    #[test]
    fn clients_get_what_memring_and_the_backends_leave() {
        let budget = budget(1024);
        assert_eq!(budget.client_limit(16384, 12), 1024 - 64 - 12);
        assert_eq!(budget.client_limit(100, 12), 100);
        assert_eq!(budget.client_limit(100, 5000), 1, "never zero at start");
    }

    #[test]
    fn a_ring_that_fits_next_to_the_connected_clients_lowers_the_limit_for_new_ones() {
        // 128 - 64 = 64 for backends and clients; 4 for two servers leaves
        // 60 clients. Ten connected, the ring grows to 40 descriptors.
        let budget = budget(128);
        assert_eq!(budget.client_limit(1000, 4), 60);
        assert_eq!(budget.client_limit_for_ring(1000, 10, 40), Ok(24));
        // A smaller ring gives the slots back, up to max_client_connections.
        assert_eq!(budget.client_limit_for_ring(1000, 10, 2), Ok(62));
        assert_eq!(budget.client_limit_for_ring(30, 10, 2), Ok(30));
    }

    #[test]
    fn a_ring_that_would_take_connected_clients_descriptors_is_refused() {
        let budget = budget(128);
        // 58 clients + 60 for backends + 64 = 182: 54 more than 128.
        assert_eq!(
            budget.client_limit_for_ring(1000, 58, 60),
            Err(FdShortage {
                more: 54,
                nofile: 128
            })
        );
        // Exactly full still fits, and keeps every connected client.
        assert_eq!(budget.client_limit_for_ring(1000, 4, 60), Ok(4));
        assert_eq!(
            budget.client_limit_for_ring(1000, 5, 60).unwrap_err().more,
            1
        );
    }

    #[test]
    fn with_no_client_connected_a_ring_must_still_leave_one_slot() {
        let budget = budget(128);
        assert_eq!(budget.client_limit_for_ring(1000, 0, 63), Ok(1));
        assert_eq!(
            budget.client_limit_for_ring(1000, 0, 64).unwrap_err().more,
            1
        );
    }

    #[test]
    fn the_refusal_says_how_many_descriptors_and_what_to_change() {
        let shortage = FdShortage {
            more: 54,
            nofile: 128,
        };
        assert_eq!(
            shortage.to_string(),
            "the new ring needs 54 more file descriptors than the limit leaves (ulimit -n is 128; raise it or lower connections_per_server)"
        );
    }

    #[test]
    fn a_huge_limit_never_overflows() {
        let budget = budget(u64::MAX);
        assert_eq!(budget.client_limit(16384, u64::MAX), 1);
        assert_eq!(budget.client_limit_for_ring(16384, 3, 100), Ok(16384));
    }
}
