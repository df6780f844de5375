//! What a worker's tasks are built from, below every room on the request
//! path: the time of the worker's turn (`clock`), wake-ups of its tasks
//! and a cancellation wait that registers once (`wake`), buffers that take
//! their allocation back (`recycled`), ordered write queues (`outbuf`) and
//! the reply-byte budget of a client and its worker (`budget`), and
//! memory a burst of idle clients freed given back to the kernel (`trim`).
//!
//! They live apart from `worker/` (the thread and what its sessions share)
//! because `backend/`, `pools/`, `plan/` and `session/` all use them while
//! the worker uses those rooms: in one room the arrows would point both
//! ways. No I/O, no locks; nothing outside this room but `protocol` is
//! imported here.

pub(crate) mod budget;
pub(crate) mod clock;
pub(crate) mod outbuf;
pub(crate) mod recycled;
pub(crate) mod trim;
pub(crate) mod wake;
