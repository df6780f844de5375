//! `memring check FILE [--offline]`: validate a config as the daemon would
//! at start, look up its host names and `[discovery]` records, test its TLS
//! servers, and print what it describes (pools, routes, shadows, gutters).

use std::path::Path;

use anyhow::Context as _;

use memring::config::Config;

use super::plan::describe_ring;

pub(crate) fn run(file: &Path, offline: bool) -> anyhow::Result<()> {
    let mut config = if offline {
        let text = memring::inputs::regular_file::read_to_string(
            file,
            memring::inputs::regular_file::MAX_CONFIG_FILE_BYTES,
        )
        .with_context(|| format!("cannot read {}", file.display()))?;
        Config::parse(&text, &file.display().to_string())?
    } else {
        Config::load(file)?
    };
    for warning in config.warnings() {
        eprintln!("memring: warning: {}: {warning}", file.display());
    }
    if let (Some(source), false) = (&config.discovery.source, offline) {
        let dns = config.discovery.dns;
        let found =
            memring::control::discovery::servers_blocking(source, dns, config.discovery.tls)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{}: [discovery] {source}: {e}; memring could not start",
                        file.display()
                    )
                })?;
        println!(
            "{}: [discovery] {source} lists {} server{}: {}",
            file.display(),
            found.len(),
            if found.len() == 1 { "" } else { "s" },
            memring::control::discovery::names(&found)
        );
        // The targets of SRV records are host names that memring connects to.
        for server in &found {
            if let Some((host, port)) = memring::inputs::resolve::host_name(&server.addr) {
                if let Err(e) = memring::inputs::resolve::block_on(|| dns.addresses(host, port)) {
                    eprintln!(
                        "memring: warning: {}: server `{}` (from {source}): `{host}` does not resolve ({e}); it counts as failing until it does",
                        file.display(),
                        server.addr
                    );
                }
            }
        }
        config = config.with_servers(found);
    }
    if !offline {
        check_tls_servers(file, &config)?;
        for pool in config
            .pools
            .iter()
            .filter(|p| p.name != config.default_pool)
        {
            check_tls_servers(file, &pool.config)?;
        }
    }
    println!(
        "{}: ok ({} server{}, listen {}, ring {})",
        file.display(),
        config.servers.len(),
        if config.servers.len() == 1 { "" } else { "s" },
        config.listen,
        describe_ring(&config)
    );
    // With several pools, the line above is the default pool's.
    for pool in &config.pools {
        println!(
            "{}: pool {}{}: {} server{}{}, ring {}",
            file.display(),
            pool.name,
            if pool.name == config.default_pool {
                " (default)"
            } else {
                ""
            },
            pool.config.servers.len(),
            if pool.config.servers.len() == 1 {
                ""
            } else {
                "s"
            },
            pool.listen
                .map_or(String::new(), |addr| format!(", listen {addr}")),
            describe_ring(&pool.config)
        );
    }
    for route in &config.routes {
        println!(
            "{}: route `{}` -> pool {}",
            file.display(),
            route.prefix,
            route.pool
        );
    }
    for pool in &config.pools {
        if let Some(shadow) = &pool.shadow {
            println!(
                "{}: pool {} -> shadow pool {} ({}% of keys)",
                file.display(),
                pool.name,
                shadow.pool,
                // To a tenth of a percent: 0.1 reads 10, not 10.000000000000002.
                (shadow.fraction * 1000.0).round() / 10.0
            );
        }
        if let Some(failover) = &pool.config.failover {
            println!(
                "{}: pool {} -> gutter pool {} for DEAD servers' keys (writes keep at most {} s)",
                file.display(),
                pool.name,
                failover.pool,
                failover.ttl.as_secs()
            );
        }
    }
    Ok(())
}

/// The TLS part of `check`'s connectivity test: a handshake with every
/// server marked `tls = true` (or found by `[discovery]` with `tls = true`),
/// its name looked up and its certificate verified as memring will. A
/// certificate that does not verify is an error; a server that cannot be
/// reached at all is a warning (it may be down for now).
fn check_tls_servers(file: &Path, config: &Config) -> anyhow::Result<()> {
    use memring::tls::{ConnectError, Connector};
    let Some(files) = &config.backend_tls else {
        return Ok(());
    };
    let connector = Connector::new(files).context("backend_tls")?;
    let timeout = config
        .connect_timeout
        .max(std::time::Duration::from_secs(2));
    // A discovered server's name is its address; say where it came from.
    let origin = |server: &memring::config::ServerConfig| match &config.discovery.source {
        Some(source) => format!("from {source}"),
        None => server.addr.clone(),
    };
    let mut refused = Vec::new();
    for server in config.servers.iter().filter(|s| s.tls) {
        match connector.probe_blocking(&server.addr, config.discovery.dns, timeout) {
            Ok(version) => println!(
                "server `{}` ({}): TLS ok ({version})",
                server.name,
                origin(server)
            ),
            Err(ConnectError::Unreachable(e)) => eprintln!(
                "memring: warning: {}: server `{}` ({}): TLS not tested, cannot connect: {e}",
                file.display(),
                server.name,
                origin(server)
            ),
            Err(ConnectError::Handshake(_, words)) => refused.push(format!(
                "server `{}` ({}): {words}",
                server.name,
                origin(server)
            )),
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    anyhow::bail!("{}: {}", file.display(), refused.join("; "))
}
