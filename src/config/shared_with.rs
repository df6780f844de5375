//! `shared_with`: who besides memring uses the servers, and so what a
//! hand-off window may do with a moved key.

use std::ops::Range;

use super::raw::RawConfig;
use crate::error::ConfigError;
use crate::ring::{Flavour, Spec};

/// Who besides memring sidecars of this version uses the servers
/// (`shared_with`), and so what a hand-off window may do with a moved key
/// (docs/handoff.md, "Shared servers"). memcached has no item other clients
/// cannot see: a hand-off copy's lease is a value to anything that is not
/// this memring, and a copy made without one can land after a write it
/// should have lost to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharedWith {
    /// Only memring sidecars that know leases (the default): moved keys are
    /// read through from their previous owner and copied through a lease.
    #[default]
    Memring,
    /// Also clients that only read (direct readers, batch jobs, older
    /// sidecars during an upgrade): read through, never copied, so nothing
    /// but the clients' own values is ever written.
    Readers,
    /// Also clients that write (nutcracker, direct clients): a write that
    /// reaches only the new owner would not stop a read-through from the
    /// previous owner, so moved keys are misses, as for nutcracker.
    Writers,
}

impl SharedWith {
    /// The values of `shared_with`, in the order of the docs.
    pub const ALL: [SharedWith; 3] = [
        SharedWith::Memring,
        SharedWith::Readers,
        SharedWith::Writers,
    ];

    /// The value of `shared_with` in the file.
    pub fn name(self) -> &'static str {
        match self {
            SharedWith::Memring => "memring",
            SharedWith::Readers => "readers",
            SharedWith::Writers => "writers",
        }
    }

    /// A read of a moved key that misses on its new owner asks the
    /// previous owner.
    pub fn reads_through(self) -> bool {
        self != SharedWith::Writers
    }

    /// A moved key's value found on its previous owner is copied to the
    /// new one (through a lease).
    pub fn copies(self) -> bool {
        self == SharedWith::Memring
    }
}

/// Whether a server that joins a ring memring has not seen it in is sent
/// `flush_all` first (`flush_new_servers`; docs/handoff.md, "Servers
/// added"). The flush keeps values from an earlier membership from being
/// read as current; it also empties whatever another proxy or client put
/// on that server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushNewServers {
    /// Flush unless clients that write share the servers
    /// (`shared_with = "writers"`): their data is not memring's to drop.
    #[default]
    Auto,
    /// Always flush a newcomer.
    Always,
    /// Never flush: a newcomer joins with what it holds.
    Never,
}

impl FlushNewServers {
    /// The values of `flush_new_servers`, in the order of the docs.
    pub const ALL: [FlushNewServers; 3] = [
        FlushNewServers::Auto,
        FlushNewServers::Always,
        FlushNewServers::Never,
    ];

    /// The value of `flush_new_servers` in the file.
    pub fn name(self) -> &'static str {
        match self {
            FlushNewServers::Auto => "auto",
            FlushNewServers::Always => "always",
            FlushNewServers::Never => "never",
        }
    }

    /// Whether a newcomer is flushed, for servers shared as `shared_with` says.
    pub fn flushes(self, shared_with: SharedWith) -> bool {
        match self {
            FlushNewServers::Auto => shared_with != SharedWith::Writers,
            FlushNewServers::Always => true,
            FlushNewServers::Never => false,
        }
    }
}

/// `flush_new_servers`, validated.
pub(super) fn flush_new_servers(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<FlushNewServers, ConfigError> {
    match &raw.flush_new_servers {
        None => Ok(FlushNewServers::default()),
        Some(name) => FlushNewServers::ALL
            .into_iter()
            .find(|f| f.name() == name.get_ref())
            .ok_or_else(|| {
                at(
                    name.span(),
                    format!(
                        "flush_new_servers = \"{}\" is not a choice (one of: auto, always, never)",
                        name.get_ref()
                    ),
                )
            }),
    }
}

/// `shared_with`, validated; and the warning for a drop-in ring (twemproxy's
/// or libmemcached's) that hands keys off without saying who else uses the
/// servers.
pub(super) fn shared_with(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<SharedWith, ConfigError> {
    match &raw.shared_with {
        None => Ok(SharedWith::default()),
        Some(name) => SharedWith::ALL
            .into_iter()
            .find(|s| s.name() == name.get_ref())
            .ok_or_else(|| {
                at(
                    name.span(),
                    format!(
                        "shared_with = \"{}\" is not who shares the servers (one of: memring, readers, writers)",
                        name.get_ref()
                    ),
                )
            }),
    }
}

/// The warning for a twemproxy or libmemcached ring with hand-off on and
/// `shared_with` not set: such a ring usually has other clients.
pub(super) fn unshared_ring_warning(
    raw: &RawConfig,
    handoff_ms: u64,
    ring: &Spec,
) -> Option<String> {
    if raw.shared_with.is_none() && handoff_ms > 0 && ring.flavour != Flavour::Memring {
        return Some(format!(
            "ring = \"{}\" usually means other clients (nutcracker, libmemcached clients, scripts) use these servers too, and shared_with is not set: in a hand-off window memring copies moved keys through leases that those clients would read as values; set shared_with = \"writers\" if they write, \"readers\" if they only read, or shared_with = \"memring\" if only memring sidecars use the servers (docs/handoff.md, \"Shared servers\")",
            ring.flavour.name()
        ));
    }
    None
}
