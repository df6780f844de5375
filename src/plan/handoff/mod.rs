//! Hand-off decisions for keys whose owner changed: after a membership change
//! the topology keeps the previous ring for a window (`handoff_ms`), and a
//! key whose previous owner differs from its new one is "moved". Reads of a
//! moved key fall through to the previous owner on a miss and copy the hit
//! to the new owner (see `route::Retrieval`); every other command runs the
//! small state machine [`Moved`] so it behaves as if the key had never moved.
//! A `cas` the new owner refuses is taken over by [`cas::CasTakeover`],
//! which the replicated `cas` shares.
//!
//! Pure: the session sends what a [`Step`] says and feeds the reply back.
//!
//! - `moved.rs`: the [`Moved`] machine, one command on a moved key;
//! - `read_through.rs`: reading a moved key from its previous owner, and the
//!   copy that hit makes for the new owner;
//! - `copy.rs`: a copy made through a lease (lease, check, fill or take back),
//!   as the session's read-through drives it;
//! - `lines.rs`: the meta requests the machines send for themselves (probe,
//!   forget, delete by cas) and what their replies show;
//! - `cas.rs`: a refused `cas` taken over.

use crate::error::BackendError;
use crate::protocol::encode::Outbound;
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::Reply;
use crate::protocol::reply::Expect;

pub(crate) mod cas;
mod copy;
mod lines;
mod moved;
mod read_through;

pub(crate) use copy::{copy_block, CopyEnd, CopyOutcome, CopyStep, ReadCopy};
pub(crate) use lines::{delete_line, forget_line, probe_hand_back, probe_line, probed_lease};
pub(crate) use moved::{not_a_number, MetaMove, Moved, Tally};
use read_through::ValueReply;
pub(crate) use read_through::{
    fetch_line, meta_read_through_hit, meta_read_through_line, read_through_hit, AddedFlags,
};

/// A reply from one server (the same as `route::CallResult`; this module sits
/// below `route`).
pub(crate) type CallResult = Result<Reply, BackendError>;

/// Which owner of a moved key a step talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    New,
    Previous,
}

/// What a command on a moved key may do with the value its previous owner
/// holds (`shared_with`, see `config::SharedWith`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Copies {
    /// Copy it to the new owner through a lease when the command needs it
    /// there (memring sidecars alone share the servers).
    ThroughLease,
    /// Never write it anywhere: other clients would see the lease. The
    /// command runs on the new owner as on an absent key (`incr` answers
    /// `NOT_FOUND`, `add` stores), and the previous owner's copy is then
    /// deleted whatever it answered, so no later read finds it there.
    Never,
}

impl Copies {
    /// What `shared_with` allows.
    pub(crate) fn of(shared_with: crate::config::SharedWith) -> Copies {
        if shared_with.copies() {
            Copies::ThroughLease
        } else {
            Copies::Never
        }
    }
}

/// What to do next for a command on a moved key.
#[derive(Debug)]
// A step is made and consumed at once, never stored: boxing would only add
// an allocation per step.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Step {
    /// Send `lines` to `to`; feed the reply back with [`Moved::on_reply`].
    Send {
        to: Owner,
        lines: Outbound,
        expect: Expect,
    },
    /// The client's reply.
    Answer(CallResult),
}

/// How a meta reply to `command` is framed (never quiet: memring's own).
pub(crate) fn meta_expect(command: MetaCommand) -> Expect {
    Expect::meta(command, false)
}
