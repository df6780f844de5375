//! The `memring` command: run the proxy, check a config, plan a change, or
//! import a twemproxy config.

mod import;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use memring::config::Config;
use memring::reload::Reloader;
use memring::topology::Change;

/// A consistent-hashing memcached proxy.
#[derive(Debug, Parser)]
#[command(
    name = "memring",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Config file (TOML); runs the proxy in the foreground.
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
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Exit 0 if the admin listener at ADDR reports ready (for container
    /// health checks; needs `admin_listen` in the config).
    Healthcheck {
        #[arg(default_value = "127.0.0.1:9100")]
        addr: std::net::SocketAddr,
    },
    /// Validate a config file; exits non-zero with the error the daemon would log.
    Check { file: PathBuf },
    /// Show, without touching anything, how a config change moves the keyspace.
    Plan { old: PathBuf, new: PathBuf },
    /// Print a memring config equivalent to another proxy's (keys stay on
    /// the servers they are on), and list settings with no equivalent.
    Import {
        /// The config's format.
        #[arg(value_enum)]
        from: ImportFrom,
        /// The config file, e.g. nutcracker.yml.
        file: PathBuf,
        /// The pool to import, when the file has more than one.
        pool: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ImportFrom {
    /// twemproxy (nutcracker) YAML.
    Twemproxy,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level.as_deref(), cli.log_format);
    let result = match (&cli.command, &cli.config) {
        (Some(Action::Healthcheck { addr }), _) => {
            let timeout = std::time::Duration::from_secs(2);
            return match memring::admin::probe_ready(*addr, timeout) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("memring: not ready");
                    ExitCode::from(1)
                }
                Err(e) => {
                    eprintln!("memring: cannot reach {addr}: {e}");
                    ExitCode::from(1)
                }
            };
        }
        (Some(Action::Check { file }), _) => check(file),
        (Some(Action::Plan { old, new }), _) => plan(old, new),
        (Some(Action::Import { from, file, pool }), _) => import(*from, file, pool.as_deref()),
        (None, Some(config)) => run(config),
        (None, None) => {
            eprintln!("memring: no config given; run `memring --config FILE` (see --help)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memring: {error:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(level: Option<&str>, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
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

fn check(file: &Path) -> anyhow::Result<()> {
    let config = Config::load(file)?;
    println!(
        "{}: ok ({} server{}, listen {}, ring {})",
        file.display(),
        config.servers.len(),
        if config.servers.len() == 1 { "" } else { "s" },
        config.listen,
        describe_ring(&config)
    );
    Ok(())
}

fn plan(old: &Path, new: &Path) -> anyhow::Result<()> {
    let old_config = Config::load(old)?;
    let new_config = Config::load(new)?;
    let old_ring = old_config.build_ring();
    let new_ring = new_config.build_ring();
    if old_config.ring != new_config.ring {
        println!(
            "ring: {} -> {} (keys are placed by another hash; the moved share is the expected one)",
            describe_ring(&old_config),
            describe_ring(&new_config)
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
            show(share_of(&old_config, &old_shares, name)),
            show(share_of(&new_config, &new_shares, name))
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
    Ok(())
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

fn import(from: ImportFrom, file: &Path, pool: Option<&str>) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let (toml, unmapped) = match from {
        ImportFrom::Twemproxy => import::twemproxy(&text, pool)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?,
    };
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
    let config = Config::load(path)?;
    // Every client and backend connection is a file descriptor; the default
    // soft limit (often 1024) is far below max_client_connections.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!("open file limit: {limit}"),
        Err(e) => tracing::warn!("cannot raise the open file limit: {e}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
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
        let running = memring::server::start(&config, shutdown.clone())
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        tracing::info!(version = memring::VERSION, config = %path.display(), "memring started");
        let reloader = Reloader::new(
            path.to_path_buf(),
            config.clone(),
            running.publisher.clone(),
        );
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
