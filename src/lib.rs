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
//! - [`topology`]: ring + backends + version; what a server-list change does.
//! - [`pool`]: the one writer of the published topology (reloads, ejections).
//! - [`backend`]: one server's shared state and health; per-worker pipelined
//!   connections and the reply slots they fill.
//! - [`worker`]: one thread per core running its sessions and connections.
//! - `wake`: lock-free wake-ups of a worker's tasks (a session by its reply
//!   slots, a connection by its queued requests) and a cancellation wait
//!   that registers once.
//! - [`shard`]: what one worker owns and its sessions share (its connection
//!   to each server, its share of the byte budget).
//! - [`session`]: one client's I/O loop, replies in request order; its
//!   `client` holds the client's entries and budget (no socket), its
//!   `start` turns a request into work, its `dispatch` sends each kind of
//!   work and turns its replies into the client's reply.
//! - [`server`]: start-up, accept loop, connection limit, shutdown and drain.
//! - `client_slots`: the client limit as a semaphore that can shrink while
//!   clients are connected, taking only free slots.
//! - [`fd_budget`]: the open file limit shared between memring, backend
//!   connections and clients; whether a new ring fits. Pure.
//! - [`outbuf`]: ordered write queues (client replies, server requests).
//! - `trim`: gives memory that idle clients' parked buffers freed back to
//!   the kernel (glibc's `malloc_trim`, the one `unsafe` call).
//! - [`reload`]: watch the config file and SIGHUP, validate, publish.
//! - [`regular_file`]: reads the config, certificate and key files: regular
//!   files only, within a size cap, never blocking on a FIFO.
//! - [`resolve`]: host names and SRV records through hickory-resolver; what
//!   one backend knows about its address between lookups.
//! - [`discovery`]: the periodic DNS rounds: the default pool from SRV or
//!   A/AAAA records (`[discovery]`), and host names whose address changed.
//! - `sweep`: before a hand-off window ends, delete from each server the keys
//!   it no longer owns, so a later change cannot bring them back.
//! - [`hotkeys`]: hot-key detection per server (space-saving sketches per
//!   worker), `stats hotkeys`, coalescing of concurrent gets, near cache.
//! - [`layout`]: the pools and the key-prefix routes between them.
//! - [`failover`]: TTL caps of writes sent to a gutter pool.
//! - [`pools`]: one publisher per pool; a reload's part for each.
//! - [`shadow`]: which keys a pool shares with its shadow pool, how the two
//!   answers to a get compare, the bound on shadow requests in flight. Pure.
//! - [`stats`]: counters behind both the `stats` reply and Prometheus; a leaf.
//! - [`report`]: memring's memcached-style `stats` reply.
//! - [`tls`]: rustls configs from PEM files for both sides (servers are
//!   verified, clients optionally), and the listener's certificate reload.
//! - [`admin`]: optional HTTP listener for `/metrics`, `/live` and `/ready`.
//! - [`error`]: backend and config errors.

// Denied, not forbidden: `trim` allows it for its one call into glibc.
#![deny(unsafe_code)]

pub mod admin;
pub mod backend;
mod budget;
mod client_slots;
mod clock;
pub mod config;
pub mod discovery;
pub mod error;
mod failover;
pub mod fd_budget;
pub mod hotkeys;
pub mod latency;
pub(crate) mod layout;
mod newcomers;
mod outbuf;
mod plan;
pub(crate) mod pool;
pub(crate) mod pools;
pub mod protocol;
mod recycled;
pub mod regular_file;
pub mod reload;
mod report;
pub mod resolve;
pub mod ring;
pub mod server;
mod session;
pub(crate) mod shadow;
mod shard;
pub(crate) mod stats;
mod sweep;
pub mod tls;
pub mod topology;
mod trim;
mod wake;
pub mod window_state;
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
