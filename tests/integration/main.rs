//! Every integration test of memring in one test binary, so that the suite
//! links once: each module is one area (sessions, hand-off, hostile servers,
//! the CLI, ...) and all of them talk to real memcached processes that
//! `common` starts on free loopback ports. The pure property tests are
//! `tests/properties.rs`, a binary of their own.
//!
//! Run one area with its module path: `cargo test --test integration handoff::`.

mod common;

mod cli;
mod compat;
mod control_files;
mod differential;
mod dns;
mod docs;
mod etcd;
mod etcd_fleet;
mod etcd_ops;
mod failure;
mod fleet;
mod handoff;
mod hostile;
mod hotkeys;
mod leases;
mod member;
mod meta_protocol;
mod meta_ring;
mod operations;
mod overload;
mod pools;
mod read_balance;
mod reload;
mod replication;
mod request_log;
mod resilience;
mod restart;
mod rings_dropin;
mod sessions;
mod shadow;
mod shared;
mod suite;
mod tls;
mod twemproxy;
mod unix_sockets;
mod warming;
mod zones;
