//! `memring check FILE [--offline]`: validate a config as the daemon would
//! at start, look up its host names and `[discovery]` records, bind its
//! listen addresses, test its TLS servers, and print what it describes
//! (pools, routes, shadows, gutters).

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
            .with_zone_from_env(&file.display().to_string())?
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
    if let Some(etcd) = &config.discovery.etcd {
        check_etcd(file, etcd)?;
    }
    if !offline {
        check_listeners(file, &config)?;
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
                .as_ref()
                .map_or(String::new(), |addr| format!(", listen {addr}")),
            describe_ring(&pool.config)
        );
    }
    print_zones(file, &config);
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

/// `[discovery] etcd_endpoints`: `check` never contacts etcd (a check must
/// answer at once, and etcd may be down while memring can still start from
/// its cache). It reads the TLS and password files as memring will, and
/// says what the membership cache holds.
fn check_etcd(file: &Path, etcd: &memring::config::EtcdSource) -> anyhow::Result<()> {
    memring::control::etcd::read_access(&etcd.access)
        .map_err(|why| anyhow::anyhow!("{}: [discovery] {why}", file.display()))?;
    let cache = match memring::control::etcd::cache_summary(&etcd.cache_file) {
        Ok((revision, members)) => format!(
            "{members} member{} at revision {revision}",
            if members == 1 { "" } else { "s" }
        ),
        Err(e) => format!("none ({e}): memring needs etcd to start"),
    };
    println!(
        "{}: [discovery] {etcd}: members are read from etcd when memring starts, not by check; cache {}: {cache}",
        file.display(),
        etcd.cache_file.display()
    );
    Ok(())
}

/// Each zone's part of the ring and of the copies, per pool with zones, and
/// the sidecar's zone.
fn print_zones(file: &Path, config: &Config) {
    let pools: Vec<(String, &Config)> = if config.pools.is_empty() {
        vec![(String::new(), config)]
    } else {
        config
            .pools
            .iter()
            .map(|p| (format!("pool {}: ", p.name), &*p.config))
            .collect()
    };
    for (pool, pool_config) in pools {
        for share in pool_config.zone_shares() {
            println!(
                "{}: {pool}{} (replicas = {})",
                file.display(),
                memring::ring::zones::describe(&share),
                pool_config.replicas
            );
        }
    }
    if let Some(zone) = &config.zone {
        println!("{}: this sidecar is in zone {zone}", file.display());
    }
}

/// Binds every address memring would listen on (`listen`, `tls_listen`,
/// `admin_listen`, each pool's `listen`) as memring binds it, all at once,
/// so a port taken by another process, or given to two settings, fails the
/// check naming the setting. An address in use by a running memring passes:
/// that is the memring this config is for, about to be reloaded or
/// restarted.
fn check_listeners(file: &Path, config: &Config) -> anyhow::Result<()> {
    use memring::config::Listen;
    let mut wanted = vec![(
        "listen".to_string(),
        config.listen.clone(),
        Speaks::Memcached,
    )];
    if let Some(tls) = &config.tls_listen {
        wanted.push(("tls_listen".into(), Listen::Tcp(tls.addr), Speaks::Tls));
    }
    if let Some(admin) = config.admin_listen {
        wanted.push(("admin_listen".into(), Listen::Tcp(admin), Speaks::Http));
    }
    for pool in &config.pools {
        if let Some(addr) = &pool.listen {
            let setting = format!("listen of pool {}", pool.name);
            wanted.push((setting, addr.clone(), Speaks::Memcached));
        }
    }
    let mut bound = Vec::with_capacity(wanted.len());
    for (setting, listen, speaks) in wanted {
        let addr = match listen {
            Listen::Tcp(addr) => addr,
            Listen::Unix { path, .. } => {
                check_unix_listener(file, &setting, &path)?;
                continue;
            }
        };
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => bound.push(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && is_memring(addr, speaks) => {}
            Err(e) => anyhow::bail!(
                "{}: cannot listen on {addr}, the address of `{setting}`: {e}; memring could not start (`--offline` skips this test)",
                file.display()
            ),
        }
    }
    Ok(())
}

/// A Unix-socket listener's path, as memring would take it at start: its
/// directory exists, nothing but a socket is there, and a socket that
/// another process answers on is memring's (a stale one is replaced).
fn check_unix_listener(file: &Path, setting: &str, path: &Path) -> anyhow::Result<()> {
    use memring::listener::{socket_path, SocketPath};
    let problem = match socket_path(path) {
        Ok(SocketPath::Free | SocketPath::Stale) => return Ok(()),
        Ok(SocketPath::Live) if is_memring_unix(path) => return Ok(()),
        Ok(SocketPath::Live) => "in use: another process listens on this socket".to_string(),
        Err(e) => e.to_string(),
    };
    anyhow::bail!(
        "{}: cannot listen on unix:{}, the address of `{setting}`: {problem}; memring could not start (`--offline` skips this test)",
        file.display(),
        path.display()
    )
}

/// Whether what listens on the Unix socket at `path` is memring (asked
/// with `version`).
fn is_memring_unix(path: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(path) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(1)));
    if stream.write_all(b"version\r\n").is_err() {
        return false;
    }
    let mut answer = [0u8; 256];
    let mut got = 0;
    while got < answer.len() && !answer[..got].ends_with(b"\r\n") {
        match stream.read(&mut answer[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    String::from_utf8_lossy(&answer[..got]).contains("-memring")
}

/// What a listener of memring answers.
#[derive(Clone, Copy)]
enum Speaks {
    Memcached,
    Http,
    Tls,
}

/// Whether what listens at `addr` is memring (asked with `version`, or an
/// admin listener's `/metrics`); a TLS listener is not asked.
fn is_memring(addr: std::net::SocketAddr, speaks: Speaks) -> bool {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(1);
    let ask: &[u8] = match speaks {
        Speaks::Memcached => b"version\r\n",
        Speaks::Http => b"GET /metrics HTTP/1.1\r\nHost: memring\r\nConnection: close\r\n\r\n",
        Speaks::Tls => return false,
    };
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    if stream.write_all(ask).is_err() {
        return false;
    }
    // The answer's start says enough; never wait for more than a little.
    let mut answer = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < answer.len() {
        match stream.read(&mut answer[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        let text = String::from_utf8_lossy(&answer[..got]);
        let said = match speaks {
            Speaks::Memcached => text.contains("-memring"),
            _ => text.contains("memring_"),
        };
        if said {
            return true;
        }
        if matches!(speaks, Speaks::Memcached) && text.contains("\r\n") {
            return false;
        }
    }
    false
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
