//! What a pool is, as the request path reads it: immutable snapshots,
//! published by `control/` through an `ArcSwap` and loaded once per request.
//! No I/O, no tasks.
//!
//! - `topology`: one pool's snapshot: its ring, the backends it routes to,
//!   a version, the previous rings of a hand-off window; what a new server
//!   list does to the keyspace (`Change`).
//! - `layout`: the pools one process serves and the key-prefix routes
//!   between them, their shadows and their gutter (failover) pools.
//! - `shadow`: which keys a pool shares with its shadow pool, how the two
//!   answers to a get compare, the bound on shadow requests in flight.
//! - `failover`: the TTL cap of writes sent to a gutter pool.
//! - `in_flight`: the requests in flight on each topology, which the
//!   fleet's staged change waits for; `planned`: the topology a request
//!   holds, counted there while it lives.
//! - `window_state`: the hand-off windows in force, as saved in the state
//!   file so a restart takes them up again.
//!
//! A pool is a set of servers with one ring; a layout of several pools is
//! the pools. The config's `[[pools]]` are read in `config/pools.rs`; the
//! writers of these snapshots are in `control/` (`publisher`, `pool_set`).

pub(crate) mod failover;
pub(crate) mod in_flight;
pub(crate) mod layout;
pub(crate) mod planned;
pub(crate) mod shadow;
pub mod topology;
pub mod window_state;
