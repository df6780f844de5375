//! memring: a consistent-hashing memcached proxy.
//!
//! Clients speak memcached's text protocol to memring; each key is hashed onto a
//! ketama-style ring and its request is forwarded over pooled, pipelined
//! connections to the memcached server that owns it.
//!
//! # Layout
//! - [`protocol`]: request parsing, reply framing and encoding. Pure, no I/O.
//! - [`ring`]: the consistent-hash ring. Pure, no I/O.
//! - [`config`]: the TOML file, validated with `file:line:column` errors.
//! - [`topology`]: ring + backends + version, published through one `ArcSwap`;
//!   what a server-list change does.
//! - [`reload`]: watch the config file and SIGHUP, validate, swap the topology.
//! - [`backend`]: per-server pipelined connections and the health state machine.
//! - [`replication`]: replica sets, quorum writes, fall-through reads.
//! - [`session`]: one task per client, replies in request order.
//! - [`server`]: accept loop, connection limit, shutdown and drain.
//! - [`stats`]: counters behind both the `stats` reply and Prometheus.
//! - [`admin`]: optional HTTP listener for `/metrics`, `/live` and `/ready`.
//! - [`error`]: backend and config errors.

#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod admin;
pub mod backend;
pub mod config;
pub mod error;
pub mod protocol;
pub mod reload;
pub mod replication;
pub mod ring;
pub mod server;
pub mod session;
pub mod stats;
pub mod topology;

/// memring's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What `version` and `stats` report: the memcached protocol level memring
/// speaks, then its own version. Clients such as libmemcached parse the leading
/// `major.minor.micro`, so it must stay numeric.
pub const VERSION_STRING: &str = concat!("1.6.0-memring-", env!("CARGO_PKG_VERSION"));

/// The full `version` reply.
pub const VERSION_REPLY: &[u8] =
    concat!("VERSION 1.6.0-memring-", env!("CARGO_PKG_VERSION"), "\r\n").as_bytes();
