//! The subcommands of the `memring` binary, one file each; `main.rs` parses
//! the command line and calls one of them. They take the clap definition and
//! their arguments from `main` rather than importing it, so nothing here
//! points back up at `main`.

use anyhow::Context as _;

pub(crate) mod check;
pub(crate) mod completions;
pub(crate) mod healthcheck;
pub(crate) mod import;
pub(crate) mod logging;
pub(crate) mod man;
pub(crate) mod plan;
pub(crate) mod run;
pub(crate) mod send;

/// The addresses `addr` (`host:port`) stands for, with what went wrong in
/// words when there are none.
fn resolve(addr: &str) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    use std::net::ToSocketAddrs;
    let found: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {addr} (DNS, or not host:port)"))?
        .collect();
    anyhow::ensure!(!found.is_empty(), "{addr} resolves to no address");
    Ok(found)
}
