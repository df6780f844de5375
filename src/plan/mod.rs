//! The pure planner: what to send for one client request, and how the
//! servers' replies become the client's. No I/O, no sockets, no output
//! queues: the session sends what a plan says and feeds the replies back.
//!
//! - [`placement`]: where one key's request goes on the ring(s), for both
//!   dialects: owner, replicas, and in a hand-off window the previous owner
//!   and the older owners a write deletes it from.
//! - [`route`]: the request plan: which servers get which bytes, and how
//!   their replies (multi-get merge, quorum, fall-through) become the
//!   client's.
//! - [`handoff`]: one state machine for a command on a key whose owner just
//!   changed (read through, copy, delete from both), in either dialect, and
//!   the takeover of a `cas` the new owner refuses.
//! - [`meta_read`]: an `mg` over its servers one at a time, in a one-key
//!   retrieval's order, copying a hit found past the first server to it as
//!   a get's read-through and zone write-back do.
//! - [`lease_retry`]: a command that met another sidecar's hand-off lease
//!   removes it by its cas and runs again, so it answers as for an absent
//!   key.
//! - [`replicated_cas`]: a compare-and-swap with replicas: decided on the
//!   owner, copied to the other replicas.
//! - [`replicated_add`]: an `add` with replicas: decided on the first
//!   replica, stored on every replica or on none.
//! - [`steps`]: one interface every multi-step machine above speaks (what
//!   to send, the replies back, the answer), so the session drives them
//!   with one loop.
//! - [`locate`]: where one key lives now (`/route`, `memring where`), from
//!   the same placement.

pub(crate) mod handoff;
pub(crate) mod lease_retry;
pub(crate) mod locate;
pub(crate) mod meta_read;
pub(crate) mod placement;
pub(crate) mod replicated_add;
pub(crate) mod replicated_cas;
pub(crate) mod route;
pub(crate) mod steps;
