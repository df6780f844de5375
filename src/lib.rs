//! memring: a consistent-hashing memcached proxy.
//!
//! Clients speak memcached's text protocol to memring; each key is hashed onto a
//! ketama-style ring and its request is forwarded over pooled, pipelined
//! connections to the memcached server that owns it.
//!
//! # Layout
//! - [`protocol`]: request parsing, strict reply framing and encoding. Pure.
//! - [`ring`]: the consistent-hash ring. Pure.
//! - [`plan`]: the pure planner: where each key goes (`placement`), what
//!   each server is sent and how the replies combine (`route`), the
//!   hand-off's state machine (`handoff`) and the replicated `cas`.
//! - [`config`]: the TOML file, validated with `file:line:column` errors.
//! - [`inputs`]: what memring reads from outside, with limits: its own
//!   files (`regular_file`) and DNS (`resolve`). A leaf.
//! - [`runtime`]: what a worker's tasks are built from: the turn's `clock`,
//!   lock-free `wake`-ups, `recycled` buffers, `outbuf` write queues and
//!   the reply-byte `budget`. No I/O, no locks.
//! - [`backend`]: one server's shared state and health; per-worker pipelined
//!   connections and the reply slots they fill.
//! - [`pools`]: what a pool is, as the request path reads it: its
//!   `topology` (ring + backends + version; what a server-list change
//!   does), the `layout` of pools and routes, `shadow` and `failover`
//!   (gutter) decisions, the saved hand-off windows (`window_state`).
//! - [`control`]: the control plane: each pool's `publisher` (the one
//!   writer of its topology), the `pool_set`, `reload`, `discovery`,
//!   `newcomers`, `sweep`, the `fd_budget` and `client_slots`, and the
//!   `admin` listener.
//! - [`worker`]: one thread per core running its sessions and connections,
//!   and what its sessions share (`shard`).
//! - [`session`]: one client's I/O loop, replies in request order; its
//!   `client` holds the client's entries and budget (no socket), its
//!   `start` turns a request into work, its `dispatch` sends each kind of
//!   work and turns its replies into the client's reply.
//! - [`server`]: start-up, accept loop, connection limit, shutdown and drain.
//! - [`hotkeys`]: hot-key detection per server (space-saving sketches per
//!   worker), `stats hotkeys`, coalescing of concurrent gets, near cache.
//! - [`stats`]: counters behind both the `stats` reply and Prometheus, one
//!   file per job: the registry, the families by feature, process figures,
//!   the `/metrics` text and the latency histograms; a leaf.
//! - [`tls`]: rustls configs from PEM files for both sides (servers are
//!   verified, clients optionally), and the listener's certificate reload.
//! - [`error`]: backend and config errors.

// Denied, not forbidden: `runtime::trim` allows it for its one call into
// glibc.
#![deny(unsafe_code)]

pub mod backend;
pub mod config;
pub mod control;
pub mod error;
pub mod hotkeys;
pub mod inputs;
pub mod listener;
mod plan;
pub mod pools;
pub mod protocol;
pub mod ring;
mod runtime;
pub mod server;
mod session;
pub mod stats;
pub mod tls;
mod worker;

/// memring's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What `version` and `stats` report: the memcached protocol level memring
/// speaks, then its own version. Clients such as libmemcached parse the leading
/// `major.minor.micro`, so it must stay numeric.
pub const VERSION_STRING: &str = concat!("1.6.0-memring-", env!("CARGO_PKG_VERSION"));

/// The full `version` reply.
pub const VERSION_REPLY: &[u8] =
    concat!("VERSION 1.6.0-memring-", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes();
