//! Servers that join a ring memring has not seen them in: each is sent
//! `flush_all` first, over a connection of its own, so it holds nothing
//! from before an earlier removal. Blocking: reloads and discovery run off
//! the request path.

use crate::config::Config;
use crate::protocol::outcome::Outcome;

/// Flushes the servers `config` adds that the topology in force does not
/// know at all (neither in its ring nor leaving it): a server removed and
/// added again still holds what it had before its removal, older than what
/// was written meanwhile on the servers that stood in for it, and reads ask
/// the new owner first. A server still leaving in a hand-off window is kept
/// as it is: every write of a key it held deleted its copy. A server is
/// known by its ring identity: a named server given a new address keeps its
/// keys in the ring, and its data too (flushing it would lose every value
/// of a server that was only renumbered). A flush that fails is logged; the
/// server then joins as it is. With `flush_new_servers` off for this pool
/// (`"never"`, or `"auto"` beside clients that write) no server is flushed:
/// each is logged as joining with what it holds.
pub(crate) fn flush_newcomers(topology: &crate::pools::topology::Topology, config: &Config) {
    for server in &config.servers {
        if topology.backends.iter().any(|b| b.name() == server.name) {
            continue;
        }
        if !config.flush_new_servers.flushes(config.shared_with) {
            tracing::info!(
                server = %server.name,
                "joins unflushed, with what it holds (flush_new_servers = \"{}\", shared_with = \"{}\")",
                config.flush_new_servers.name(),
                config.shared_with.name()
            );
            continue;
        }
        let timeout = config.connect_timeout + config.request_timeout;
        let flushed = match (&config.backend_tls, server.tls) {
            (Some(files), true) => flush_tls(files, &server.addr, config.discovery.dns, timeout),
            _ => flush_now(&server.addr, config.discovery.dns, timeout),
        };
        match flushed {
            Ok(()) => {
                tracing::info!(server = %server.name, "joins: flushed first, so it holds nothing from before")
            }
            Err(e) => tracing::warn!(
                server = %server.name,
                "joins without the flush it needs (it may hold values from before its removal): {e}"
            ),
        }
    }
}

/// [`flush_newcomers`] on a thread of its own (the connects block), awaited
/// by the control task that publishes after it: discovery and the etcd
/// watch both flush before they publish.
pub(crate) async fn flush_newcomers_off_thread(
    topology: std::sync::Arc<crate::pools::topology::Topology>,
    config: Config,
) {
    let (done, flushed) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        flush_newcomers(&topology, &config);
        let _ = done.send(());
    });
    let _ = flushed.await;
}

/// Flushes every server of `config`'s pool, each over a connection of its
/// own; the failures, named, in one message. For a shadow pool that is to
/// serve keys after losing some of their writes (see `control/reload.rs`).
pub(crate) fn flush_every_server(config: &Config) -> Result<(), String> {
    let timeout = config.connect_timeout + config.request_timeout;
    let failed: Vec<String> = config
        .servers
        .iter()
        .filter_map(|server| {
            let flushed = match (&config.backend_tls, server.tls) {
                (Some(files), true) => {
                    flush_tls(files, &server.addr, config.discovery.dns, timeout)
                }
                _ => flush_now(&server.addr, config.discovery.dns, timeout),
            };
            flushed.err().map(|e| format!("{}: {e}", server.name))
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// [`flush_now`] for a server with `tls = true`, over a TLS connection of
/// its own (verified, and its name looked up, as the backend's connections
/// are).
fn flush_tls(
    files: &crate::tls::BackendFiles,
    addr: &str,
    dns: crate::inputs::resolve::Dns,
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    let connector = crate::tls::Connector::new(files)?;
    let mut stream = connector
        .connect_blocking(addr, dns, timeout)
        .map_err(std::io::Error::other)?;
    flush_over(&mut stream)
}

/// Sends `flush_all` on `stream` and reads memcached's one-line answer.
fn flush_over(stream: &mut (impl std::io::Read + std::io::Write)) -> std::io::Result<()> {
    stream.write_all(b"flush_all\r\n")?;
    stream.flush()?;
    let mut reply = [0u8; 64];
    let mut got = 0;
    while !reply[..got].ends_with(b"\r\n") && got < reply.len() {
        let n = stream.read(&mut reply[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    flush_answer(&reply[..got])
}

/// `flush_all` on `addr` over a connection of its own, waiting at most
/// `timeout`. Blocking: reloads run off the request path.
fn flush_now(
    addr: &str,
    dns: crate::inputs::resolve::Dns,
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    use std::net::ToSocketAddrs;
    // A host name is asked where memring's connections ask (`resolver`).
    let target = match crate::inputs::resolve::host_name(addr) {
        Some((host, port)) => crate::inputs::resolve::block_on(|| dns.addresses(host, port))
            .map_err(|e| std::io::Error::other(e.detail))?
            .first()
            .copied(),
        None => addr.to_socket_addrs()?.next(),
    }
    .ok_or_else(|| std::io::Error::other("the address resolves to nothing"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&target, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    flush_over(&mut stream)
}

/// Whether `reply` is `flush_all`'s success.
pub(crate) fn flush_answer(reply: &[u8]) -> std::io::Result<()> {
    if Outcome::of(reply) == Outcome::Ok {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "flush_all answered {:?}",
            String::from_utf8_lossy(reply)
        )))
    }
}
