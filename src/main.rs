//! The `memring` command: run the proxy, check a config, plan a change,
//! import a twemproxy config, or print its own man page and completions.

#![forbid(unsafe_code)]

mod cli;
mod import;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use memring::config::Config;
use memring::fd_budget::FdBudget;
use memring::reload::Reloader;
use memring::topology::Change;

/// What `memring --version` prints: the version and the commit built from.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MEMRING_GIT_COMMIT"),
    ")"
);

/// A consistent-hashing memcached proxy.
///
/// Clients speak the memcached text protocol to memring as to one memcached;
/// memring places each key on a consistent-hash ring of servers and forwards
/// the request to the server that owns it. See docs/ for one page per
/// subcommand and docs/configuration.md for the configuration reference.
#[derive(Debug, Parser)]
#[command(
    name = "memring",
    version = LONG_VERSION,
    about,
    long_about,
    args_conflicts_with_subcommands = true,
    after_help = "Run the proxy: memring --config FILE. Exit status: 0 ok, 1 error, 2 usage error."
)]
struct Cli {
    /// Config file (TOML); runs the proxy in the foreground until SIGINT or
    /// SIGTERM, following edits to the file.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Log level or filter (overrides RUST_LOG), e.g. `info` or `memring=debug`.
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,

    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Option<Action>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Validate a config file and exit.
    ///
    /// Prints `FILE: ok (N servers, listen ADDR)`, or the error the daemon
    /// would give at start (`file:line:column: problem`) and exits 1. Settings
    /// that are valid but probably wrong (more replicas than servers, a host
    /// name that does not resolve, one memcached listed under two spellings)
    /// are printed as warnings. Every host name is looked up where memring
    /// would look it up (`[discovery] resolver`, or the system's resolver),
    /// and so are the `[discovery]` records: records that list no server
    /// are an error, since memring could not start.
    Check {
        /// The config file to validate.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Ask DNS nothing: check the file alone (host names and
        /// `[discovery]` records are not looked up).
        #[arg(long)]
        offline: bool,
    },
    /// Show how a config change would move the keyspace, without touching anything.
    ///
    /// Prints each server's share of the keyspace before and after, the share
    /// of keys that move, every setting that changes (old -> new), and which
    /// of those take effect only after a restart.
    ///
    /// With `--discovery CONFIG`: the change the next `[discovery]` round
    /// would make, from the servers the running memring uses (asked with
    /// `stats` at `--from`) to what the DNS records list now.
    Plan {
        /// The config running now (with --discovery: the config whose
        /// [discovery] records to ask).
        #[arg(value_name = "OLD")]
        old: PathBuf,
        /// The config you intend to deploy.
        #[arg(value_name = "NEW", required_unless_present = "discovery")]
        new: Option<PathBuf>,
        /// Plan what DNS would change now, for the config OLD.
        #[arg(long, conflicts_with = "new")]
        discovery: bool,
        /// Where the running memring listens (default: the config's
        /// `listen`, on 127.0.0.1 when it listens on every address).
        #[arg(long, value_name = "ADDR", requires = "discovery")]
        from: Option<String>,
    },
    /// Exit 0 if memring's admin listener at ADDR reports ready.
    ///
    /// For container health checks (the image has no curl). Prints the answer
    /// (`ready`, or why not, e.g. `not ready: every server is DEAD`) and exits
    /// 1 when not ready or unreachable. Needs `admin_listen` in the config.
    Healthcheck {
        /// host:port of memring's admin listener (`admin_listen`).
        #[arg(default_value = "127.0.0.1:9100", value_name = "ADDR")]
        addr: String,
    },
    /// Send memcached commands to ADDR and print the replies.
    ///
    /// Each LINE is sent followed by \r\n; then the connection is half-closed
    /// and everything the server answers is printed. A client for trying
    /// memring (or any memcached) without nc or telnet:
    /// `memring send 127.0.0.1:22122 'set k 0 0 2' hi 'get k'`.
    Send {
        /// host:port of memring (its `listen`) or of a memcached; a host
        /// name is resolved, and each of its addresses tried in turn.
        #[arg(value_name = "ADDR")]
        addr: String,
        /// Protocol lines, e.g. `set k 0 0 2` `hi` `get k`.
        #[arg(value_name = "LINE", required = true)]
        lines: Vec<String>,
    },
    /// Print a memring config equivalent to another proxy's (keys stay on
    /// the servers they are on), and list settings with no equivalent.
    Import {
        /// The proxy whose config to read.
        #[command(subcommand)]
        from: ImportFrom,
    },
    /// Print a shell completion script to stdout.
    ///
    /// For bash: `memring completions bash > /etc/bash_completion.d/memring`
    /// (the Debian package installs bash, zsh and fish scripts).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the memring(1) man page (roff) to stdout.
    ///
    /// `memring man | man -l -` shows it. With `--dir DIR`, writes memring.1
    /// and one memring-COMMAND.1 per subcommand into DIR instead.
    Man {
        /// Write every page into this directory (it must exist).
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
enum ImportFrom {
    /// twemproxy (nutcracker) YAML: `memring import twemproxy nutcracker.yml
    /// [POOL]`.
    Twemproxy {
        /// The config file, e.g. nutcracker.yml.
        file: PathBuf,
        /// The pool to import alone; without it, every pool of the file, in
        /// one config.
        pool: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level.as_deref(), cli.log_format);
    let result = match (&cli.command, &cli.config) {
        (Some(Action::Healthcheck { addr }), _) => return healthcheck(addr),
        (Some(Action::Check { file, offline }), _) => check(file, *offline),
        (
            Some(Action::Plan {
                old,
                discovery: true,
                from,
                ..
            }),
            _,
        ) => plan_discovery(old, from.as_deref()),
        (Some(Action::Plan { old, new, .. }), _) => match new {
            Some(new) => plan(old, new),
            None => Err(anyhow::anyhow!(
                "plan needs OLD and NEW, or --discovery CONFIG"
            )),
        },
        (Some(Action::Send { addr, lines }), _) => send(addr, lines),
        (Some(Action::Import { from }), _) => import(from),
        (Some(Action::Completions { shell }), _) => {
            cli::completions::print(*shell, Cli::command()).context("cannot write the script")
        }
        (Some(Action::Man { dir: None }), _) => {
            cli::man::print(Cli::command()).context("cannot write the page")
        }
        (Some(Action::Man { dir: Some(dir) }), _) => man_pages(dir),
        (None, Some(config)) => run(config),
        (None, None) => {
            eprintln!("memring: no config given; run `memring --config FILE` (see --help)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memring: {}", error_chain(&error));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line, each cause once: an error whose
/// message already quotes its source (`cannot read: No such file or
/// directory`) does not get the source appended a second time.
fn error_chain(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn man_pages(dir: &Path) -> anyhow::Result<()> {
    let pages = cli::man::write_all(Cli::command(), dir)
        .with_context(|| format!("cannot write the pages into {}", dir.display()))?;
    for page in pages {
        println!("{}", page.display());
    }
    Ok(())
}

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

fn healthcheck(addr: &str) -> ExitCode {
    let timeout = std::time::Duration::from_secs(2);
    let target = match resolve(addr) {
        Ok(found) => found[0],
        Err(e) => {
            eprintln!("memring: {e:#}");
            return ExitCode::from(1);
        }
    };
    match memring::admin::probe_ready(target, timeout) {
        Ok((true, reason)) => {
            println!("memring: {reason}");
            ExitCode::SUCCESS
        }
        Ok((false, reason)) => {
            eprintln!("memring: {reason}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("memring: cannot reach the admin listener at {addr}: {e}");
            ExitCode::from(1)
        }
    }
}

fn send(addr: &str, lines: &[String]) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let mut last = None;
    let mut connected = None;
    for target in resolve(addr)? {
        match std::net::TcpStream::connect_timeout(&target, timeout) {
            Ok(stream) => {
                connected = Some(stream);
                break;
            }
            Err(e) => last = Some((target, e)),
        }
    }
    let mut stream = match (connected, last) {
        (Some(stream), _) => stream,
        (None, Some((target, e))) => {
            return Err(e).with_context(|| format!("cannot connect to {addr} ({target})"))
        }
        (None, None) => anyhow::bail!("{addr} resolves to no address"),
    };
    stream.set_read_timeout(Some(timeout))?;
    let mut request = Vec::new();
    for line in lines {
        request.extend_from_slice(line.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    // The server answers everything sent before the half-close, then closes.
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .with_context(|| format!("no complete answer from {addr} within {timeout:?}"))?;
    std::io::stdout().write_all(&reply)?;
    Ok(())
}

fn init_logging(level: Option<&str>, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let directives = match level {
        Some(level) => level.to_string(),
        None => std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string()),
    };
    // notify logs every inotify event at trace level. With the log file next
    // to the config, each of those lines would be an event, logged in turn:
    // keep notify at info unless the filter names it.
    let directives = if directives.contains("notify") {
        directives
    } else {
        format!("{directives},notify=info")
    };
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("memring: bad log filter `{directives}` ({e}); using info");
        EnvFilter::new("info")
    });
    // A log reader that goes away (a closed stderr pipe) must not take the
    // proxy down: without this, tracing-subscriber reports the failed write
    // with eprintln!, which panics when stderr is gone.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

fn check(file: &Path, offline: bool) -> anyhow::Result<()> {
    let mut config = if offline {
        let text = memring::regular_file::read_to_string(
            file,
            memring::regular_file::MAX_CONFIG_FILE_BYTES,
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
        let found = memring::discovery::servers_blocking(source, dns, config.discovery.tls)
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
            memring::discovery::names(&found)
        );
        // The targets of SRV records are host names that memring connects to.
        for server in &found {
            if let Some((host, port)) = memring::resolve::host_name(&server.addr) {
                if let Err(e) = memring::resolve::block_on(|| dns.addresses(host, port)) {
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

fn plan(old: &Path, new: &Path) -> anyhow::Result<()> {
    let old_config = Config::load(old)?;
    let new_config = Config::load(new)?;
    print_plan(&old_config, &new_config, &new.display().to_string())
}

/// The plan of the change the next `[discovery]` round would make: from the
/// servers the running memring at `from` uses to what DNS lists now.
fn plan_discovery(file: &Path, from: Option<&str>) -> anyhow::Result<()> {
    let config = Config::load(file)?;
    let Some(source) = &config.discovery.source else {
        anyhow::bail!(
            "{}: no [discovery] srv or a: its servers do not come from DNS",
            file.display()
        );
    };
    let from = match from {
        Some(addr) => addr.to_string(),
        None if config.listen.ip().is_unspecified() => {
            format!("127.0.0.1:{}", config.listen.port())
        }
        None => config.listen.to_string(),
    };
    let running = running_servers(&from).with_context(|| {
        format!("cannot ask the running memring at {from} which servers it uses")
    })?;
    let found =
        memring::discovery::servers_blocking(source, config.discovery.dns, config.discovery.tls)
            .map_err(|e| {
                anyhow::anyhow!(
                    "[discovery] {source}: {e}; the running memring keeps its {} servers",
                    running.len()
                )
            })?;
    println!(
        "discovery: {source}: {} server{} in use at {from}, {} listed now",
        running.len(),
        if running.len() == 1 { "" } else { "s" },
        found.len()
    );
    print_plan(
        &config.with_servers(running),
        &config.with_servers(found),
        &file.display().to_string(),
    )
}

/// The servers the memring at `addr` discovered (its `stats`): names from
/// `discovery_server_list`, weights from `server:NAME:weight`.
fn running_servers(addr: &str) -> anyhow::Result<Vec<memring::config::ServerConfig>> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let target = resolve(addr)?[0];
    let mut stream = std::net::TcpStream::connect_timeout(&target, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"stats\r\n")?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !reply.ends_with(b"END\r\n") {
        let n = stream.read(&mut chunk)?;
        anyhow::ensure!(n > 0, "the connection closed before the end of the stats");
        reply.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("STAT ")?
                    .strip_prefix(name)?
                    .strip_prefix(' ')
            })
            .map(str::to_string)
    };
    let list = stat("discovery_server_list").ok_or_else(|| {
        anyhow::anyhow!("it reports no discovered servers (no [discovery] srv or a?)")
    })?;
    Ok(list
        .split(',')
        .filter(|name| !name.is_empty())
        .map(|name| memring::config::ServerConfig {
            addr: name.to_string(),
            name: name.to_string(),
            weight: stat(&format!("server:{name}:weight"))
                .and_then(|w| w.parse().ok())
                .unwrap_or(1),
            tls: false,
        })
        .collect())
}

/// `plan`'s output for a change from `old_config` to `new_config` (the
/// file `new` is named in warnings).
fn print_plan(old_config: &Config, new_config: &Config, new: &str) -> anyhow::Result<()> {
    if old_config.pools.is_empty() && new_config.pools.is_empty() {
        print_pool_plan(old_config, new_config);
    } else {
        print_pools_plan(old_config, new_config);
    }
    let settings = memring::reload::setting_changes(old_config, new_config);
    for setting in &settings {
        let when = if setting.restart_only {
            "needs a restart"
        } else {
            "applied on reload"
        };
        println!("setting: {setting} ({when})");
    }
    let restart: Vec<&str> = settings
        .iter()
        .filter(|s| s.restart_only)
        .map(|s| s.name)
        .collect();
    if !restart.is_empty() {
        println!(
            "restart needed: {} {} read only at start; a reload keeps the old value",
            restart.join(", "),
            if restart.len() == 1 { "is" } else { "are" }
        );
    }
    for warning in new_config.warnings() {
        println!("warning: {new}: {warning}");
    }
    Ok(())
}

/// One pool's part of a plan: each server's share before and after, what
/// moves, and the hand-off window.
fn print_pool_plan(old_config: &Config, new_config: &Config) {
    let old_ring = old_config.build_ring();
    let new_ring = new_config.build_ring();
    if old_config.ring != new_config.ring {
        println!(
            "ring: {} -> {} (keys are placed by another hash; the moved share is the expected one)",
            describe_ring(old_config),
            describe_ring(new_config)
        );
    }
    let old_shares = old_ring.shares();
    let new_shares = new_ring.shares();
    let mut names: Vec<&str> = old_config.servers.iter().map(|s| s.name.as_str()).collect();
    for server in &new_config.servers {
        if !names.contains(&server.name.as_str()) {
            names.push(&server.name);
        }
    }
    let share_of = |config: &Config, shares: &[f64], name: &str| {
        config
            .servers
            .iter()
            .position(|s| s.name == name)
            .map(|i| shares[i])
    };
    println!("{:<32} {:>9} {:>9}", "server", "before", "after");
    for name in names {
        let show =
            |share: Option<f64>| share.map_or("-".to_string(), |s| format!("{:.2}%", s * 100.0));
        println!(
            "{:<32} {:>9} {:>9}",
            name,
            show(share_of(old_config, &old_shares, name)),
            show(share_of(new_config, &new_shares, name))
        );
    }
    let change = Change::between(
        &old_config.servers,
        &old_ring,
        &new_config.servers,
        &new_ring,
    );
    println!("keyspace that moves: {:.2}%", change.moved_share * 100.0);
    println!("change: {change}");
    if change.moved_share > 0.0 {
        let window = new_config.handoff.as_secs();
        if window == 0 {
            println!("hand-off: off (handoff_ms = 0): moved keys miss once");
        } else if !new_config.shared_with.reads_through() {
            println!(
                "hand-off: for {window} s, writes of moved keys (about {} per 100000 stored keys) \
                 delete their previous owner's copy; reads of them miss (shared_with = \"writers\")",
                (change.moved_share * 100_000.0).round() as u64
            );
        } else if !new_config.shared_with.copies() {
            println!(
                "hand-off: for {window} s, reads of moved keys (about {} per 100000 stored keys) \
                 fall through to their previous owner, never copied (shared_with = \"readers\")",
                (change.moved_share * 100_000.0).round() as u64
            );
        } else {
            println!(
                "hand-off: for {window} s, reads of moved keys (about {} per 100000 stored keys) \
                 fall through to their previous owner and are copied on a hit",
                (change.moved_share * 100_000.0).round() as u64
            );
        }
    }
}

/// A plan over configs with several pools: each pool's part under its name,
/// pools added and removed, and the route prefixes whose pool changes.
fn print_pools_plan(old_config: &Config, new_config: &Config) {
    let (old_pools, new_pools) = (old_config.pool_list(), new_config.pool_list());
    let mut names: Vec<String> = old_pools.iter().map(|p| p.name.clone()).collect();
    for pool in &new_pools {
        if !names.contains(&pool.name) {
            names.push(pool.name.clone());
        }
    }
    for name in &names {
        let before = old_pools.iter().find(|p| &p.name == name);
        let after = new_pools.iter().find(|p| &p.name == name);
        match (before, after) {
            (Some(before), Some(after)) => {
                println!("pool {name}:");
                print_pool_plan(&before.config, &after.config);
            }
            (None, Some(after)) => println!(
                "pool {name}: added, {} server{}",
                after.config.servers.len(),
                if after.config.servers.len() == 1 {
                    ""
                } else {
                    "s"
                }
            ),
            (Some(_), None) => println!("pool {name}: removed"),
            (None, None) => {}
        }
    }
    // Where each prefix either file routes goes, under each file's routes.
    let pool_of = |config: &Config, key: &str| {
        config
            .routes
            .iter()
            .find(|r| key.starts_with(&r.prefix))
            .map_or(config.default_pool.clone(), |r| r.pool.clone())
    };
    let mut prefixes: Vec<&str> = old_config
        .routes
        .iter()
        .map(|r| r.prefix.as_str())
        .collect();
    for route in &new_config.routes {
        if !prefixes.contains(&route.prefix.as_str()) {
            prefixes.push(&route.prefix);
        }
    }
    for prefix in prefixes {
        let (from, to) = (pool_of(old_config, prefix), pool_of(new_config, prefix));
        if from != to {
            println!(
                "route `{prefix}`: keys move from pool {from} to pool {to} (not handed off: their copies in pool {to} are deleted first, unless {to} is {from}'s complete shadow)"
            );
        }
    }
    if old_config.default_pool != new_config.default_pool {
        println!(
            "default_pool: keys that match no route move from pool {} to pool {} (not handed off: their copies in pool {} are deleted first, unless {} is {}'s complete shadow)",
            old_config.default_pool,
            new_config.default_pool,
            new_config.default_pool,
            new_config.default_pool,
            old_config.default_pool
        );
    }
}

/// `twemproxy (hash fnv1a_64, hash_tag "{}")`
fn describe_ring(config: &Config) -> String {
    use memring::ring::Flavour;
    let mut text = config.ring.flavour.name().to_string();
    let mut details = Vec::new();
    if config.ring.flavour == Flavour::Twemproxy {
        details.push(format!("hash {}", config.ring.hash.name()));
    }
    if let Some(tag) = config.ring.hash_tag {
        details.push(format!("hash_tag \"{}\"", String::from_utf8_lossy(&tag)));
    }
    if !details.is_empty() {
        text.push_str(&format!(" ({})", details.join(", ")));
    }
    text
}

fn import(from: &ImportFrom) -> anyhow::Result<()> {
    let ImportFrom::Twemproxy { file, pool } = from;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let (toml, unmapped) = import::twemproxy(&text, pool.as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    // Print only what memring itself accepts.
    Config::parse(&toml, "imported config")
        .map_err(|e| anyhow::anyhow!("the imported config does not load: {e}"))?;
    print!("{toml}");
    for note in &unmapped {
        eprintln!("memring import: no equivalent for {note}");
    }
    Ok(())
}

fn run(path: &Path) -> anyhow::Result<()> {
    let config = Config::load(path)?.with_default_state_file(path);
    for warning in config.warnings() {
        tracing::warn!("{}: {warning}", path.display());
    }
    // Every client and backend connection is a file descriptor; the default
    // soft limit (often 1024) is far below max_client_connections.
    let nofile = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!("cannot raise the open file limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    };
    let fds = nofile.map(|nofile| FdBudget::of(&config, nofile));
    if let Some(budget) = fds {
        let backends = budget.config_backend_fds(&config);
        let reserved = budget.fixed + backends;
        let clients = budget.client_limit(config.max_client_connections, backends);
        if clients < config.max_client_connections {
            tracing::warn!(
                "open file limit {} is below max_client_connections {} + {reserved} for backends ({backends}), the admin listener and memring itself; serving at most {clients} clients at once (raise the limit: ulimit -n, LimitNOFILE=, or lower max_client_connections)",
                budget.nofile,
                config.max_client_connections,
            );
        } else {
            tracing::debug!(
                "open file limit {}: room for {clients} clients and {reserved} other descriptors",
                budget.nofile
            );
        }
    }
    // The control plane (accept, reloads, health, /metrics) is light: one
    // thread of its own, so it never competes with the workers for cores.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async {
        let stop = shutdown_signal().context("cannot watch SIGTERM and SIGINT")?;
        // Taking over SIGHUP now (tokio keeps it for the process lifetime)
        // means an early SIGHUP is ignored rather than fatal; the reload task
        // listens for it once it runs.
        let _early_hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot watch SIGHUP")?;
        let shutdown = CancellationToken::new();
        let running = memring::server::start_within(&config, fds, shutdown.clone())
            .await
            .context("cannot start")?;
        tracing::info!(
            version = memring::VERSION,
            commit = env!("MEMRING_GIT_COMMIT"),
            config = %path.display(),
            "memring started"
        );
        let reloader = Reloader::new(path.to_path_buf(), config.clone(), running.pools.clone());
        memring::reload::spawn(reloader, shutdown.clone());
        stop.await;
        tracing::info!("shutdown requested");
        shutdown.cancel();
        running.wait().await;
        tracing::info!("stopped");
        Ok(())
    })
}

/// SIGINT or SIGTERM, as one future. The handlers are installed when this is
/// called, not when it is first polled, so call it before announcing readiness:
/// a SIGTERM that arrives early must still mean a clean shutdown.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_printed_once() {
        let missing = Config::load(Path::new("/nonexistent/memring.toml")).unwrap_err();
        let text = error_chain(&anyhow::Error::new(missing));
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
        let wrapped = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&wrapped), "outer: inner");
    }
}
