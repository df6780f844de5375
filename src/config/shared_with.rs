//! `shared_with`: who besides memring uses the servers, and so what a
//! hand-off window may do with a moved key.

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
