//! The `memring` command: run the proxy, check a config, plan a change,
//! import a twemproxy config, or print its own man page and completions.

#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};

use cli::logging::{init_logging, LogFormat};

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
/// the request to the server that owns it. The docs have one page per
/// subcommand and the configuration reference (configuration.md): docs/ in
/// the source, /usr/share/doc/memring/docs/ from the Debian package.
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

// Parsed once: `member`'s many flags make the largest variant, harmlessly.
#[allow(clippy::large_enum_variant)]
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
    /// are an error, since memring could not start. Every listen address
    /// (`listen`, `tls_listen`, `admin_listen`, pools' `listen`) is bound:
    /// one that cannot be (unless a running memring holds it) is an error
    /// naming the setting.
    Check {
        /// The config file to validate.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Ask DNS nothing and bind nothing: check the file alone (host
        /// names and `[discovery]` records are not looked up, listen
        /// addresses not bound).
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
        /// Also fail unless the running memring's `ring_digest` (its `stats`)
        /// is HEX: every sidecar of a fleet places keys alike.
        #[arg(long, value_name = "HEX")]
        digest: Option<String>,
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
        /// `unix:PATH` connects to a Unix-socket listener.
        #[arg(value_name = "ADDR")]
        addr: String,
        /// Protocol lines, e.g. `set k 0 0 2` `hi` `get k`.
        #[arg(value_name = "LINE", required = true)]
        lines: Vec<String>,
    },
    /// Print where each KEY lives: its pool, owner, replicas, previous owner
    /// (in a hand-off window) and gutter.
    ///
    /// With `--admin ADDR`, asks a running memring's admin listener
    /// (`/route`), which knows its hand-off windows and DEAD servers; with
    /// `--config FILE`, works it out from the file alone, as a memring
    /// started on it would place the keys. A key memcached would refuse is
    /// named with the reason, and the exit status is then 1.
    Where {
        /// host:port of a running memring's admin listener (`admin_listen`).
        #[arg(
            long,
            value_name = "ADDR",
            conflicts_with = "config",
            required_unless_present = "config"
        )]
        admin: Option<String>,
        /// A memring config file to place the keys by.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The keys are base64 (as a meta command's `b` flag), for keys that
        /// are not text.
        #[arg(long)]
        b64: bool,
        /// Print one JSON object per key, as `/route` answers.
        #[arg(long)]
        json: bool,
        /// The keys to place.
        #[arg(value_name = "KEY", required = true)]
        keys: Vec<String>,
    },
    /// Print a memring config equivalent to another proxy's (keys stay on
    /// the servers they are on), and list settings with no equivalent.
    Import {
        /// The proxy whose config to read.
        #[command(subcommand)]
        from: ImportFrom,
    },
    /// Keep one memcached's membership record in etcd (run beside it).
    ///
    /// Waits until memcached at --addr answers, registers
    /// `<prefix>members/<name>` as JOINING (warming) under a lease it keeps
    /// alive, sets it ACTIVE after --warm-ms; on SIGTERM or SIGINT sets it
    /// LEAVING, waits --drain-ms, deletes it and exits 0. If etcd is
    /// unreachable it retries and registers again. See docs/member.md.
    Member {
        /// etcd endpoints, comma-separated (e.g. http://127.0.0.1:2379).
        #[arg(long, value_name = "URL[,URL]", value_delimiter = ',', required = true)]
        etcd: Vec<String>,
        /// The cluster's key prefix, as the sidecars' `etcd_prefix`.
        #[arg(long, value_name = "PREFIX")]
        prefix: String,
        /// The member's name: its place on the ring.
        #[arg(long, value_name = "NAME")]
        name: String,
        /// memcached's host:port, as the sidecars connect to it.
        #[arg(long, value_name = "HOST:PORT")]
        addr: String,
        /// Share of the keyspace, 1 to 1000.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        weight: u32,
        /// The member's zone.
        #[arg(long, value_name = "ZONE")]
        zone: Option<String>,
        /// memcached speaks TLS (the sidecars connect with [backend_tls]).
        #[arg(long)]
        tls: bool,
        /// How long to stay JOINING (warming) before ACTIVE; 0: ACTIVE at once.
        #[arg(long, value_name = "MS", default_value_t = 30_000)]
        warm_ms: u64,
        /// How long to stay LEAVING after SIGTERM before deleting the key.
        #[arg(long, value_name = "MS", default_value_t = 10_000)]
        drain_ms: u64,
        /// The lease's TTL: the key goes this long after the agent dies.
        #[arg(long, value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..=3600))]
        lease_ttl_s: i64,
        /// How long to wait for memcached to answer before giving up (exit 1).
        #[arg(long, value_name = "MS", default_value_t = 120_000)]
        wait_ms: u64,
        #[command(flatten)]
        access: EtcdFlags,
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

/// TLS and authentication to etcd, as `[discovery]`'s `etcd_*` keys.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
struct EtcdFlags {
    /// The CA that signed etcd's certificate (PEM); the endpoints are then https://.
    #[arg(long, value_name = "FILE")]
    etcd_ca_file: Option<PathBuf>,
    /// A client certificate (PEM), for an etcd with --client-cert-auth.
    #[arg(long, value_name = "FILE", requires = "etcd_key_file")]
    etcd_cert_file: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert_file")]
    etcd_key_file: Option<PathBuf>,
    /// etcd user name, for an etcd with authentication enabled.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    etcd_username: Option<String>,
    /// A file holding the user's password (one line; never on the command line).
    #[arg(long, value_name = "FILE", requires = "etcd_username")]
    etcd_password_file: Option<PathBuf>,
}

impl EtcdFlags {
    fn access(&self) -> memring::config::EtcdAccess {
        memring::config::EtcdAccess {
            ca_file: self.etcd_ca_file.clone(),
            identity: self.etcd_cert_file.clone().zip(self.etcd_key_file.clone()),
            user: self
                .etcd_username
                .clone()
                .zip(self.etcd_password_file.clone()),
        }
    }
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            if error.use_stderr() {
                let args: Vec<String> = std::env::args().skip(1).collect();
                if let Some(hint) = cli::hints::nutcracker_flag(&args) {
                    eprintln!("memring: hint: {hint}");
                }
            }
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    init_logging(cli.log_level.as_deref(), cli.log_format);
    let result = match (&cli.command, &cli.config) {
        (Some(Action::Healthcheck { addr, digest }), _) => {
            return cli::healthcheck::run(addr, digest.as_deref())
        }
        (Some(Action::Check { file, offline }), _) => cli::check::run(file, *offline),
        (
            Some(Action::Plan {
                old,
                discovery: true,
                from,
                ..
            }),
            _,
        ) => cli::plan::plan_discovery(old, from.as_deref()),
        (Some(Action::Plan { old, new, .. }), _) => match new {
            Some(new) => cli::plan::run(old, new),
            None => Err(anyhow::anyhow!(
                "plan needs OLD and NEW, or --discovery CONFIG"
            )),
        },
        (Some(Action::Send { addr, lines }), _) => cli::send::run(addr, lines),
        (
            Some(Action::Where {
                admin,
                config,
                b64,
                json,
                keys,
            }),
            _,
        ) => {
            let source = match (admin, config) {
                (Some(admin), _) => cli::r#where::Source::Admin(admin),
                (None, Some(config)) => cli::r#where::Source::Config(config),
                (None, None) => unreachable!("clap requires --admin or --config"),
            };
            cli::r#where::run(source, keys, *b64, *json)
        }
        (
            Some(Action::Import {
                from: ImportFrom::Twemproxy { file, pool },
            }),
            _,
        ) => cli::import::run(file, pool.as_deref()),
        (
            Some(Action::Member {
                etcd,
                prefix,
                name,
                addr,
                weight,
                zone,
                tls,
                warm_ms,
                drain_ms,
                lease_ttl_s,
                wait_ms,
                access,
            }),
            _,
        ) => cli::member::run(cli::member::MemberArgs {
            etcd: etcd.clone(),
            prefix: prefix.clone(),
            name: name.clone(),
            addr: addr.clone(),
            weight: *weight,
            zone: zone.clone(),
            tls: *tls,
            warm: std::time::Duration::from_millis(*warm_ms),
            drain: std::time::Duration::from_millis(*drain_ms),
            lease_ttl_s: *lease_ttl_s,
            wait: std::time::Duration::from_millis(*wait_ms),
            access: access.access(),
        }),
        (Some(Action::Completions { shell }), _) => {
            cli::completions::print(*shell, Cli::command()).context("cannot write the script")
        }
        (Some(Action::Man { dir: None }), _) => {
            cli::man::print(Cli::command()).context("cannot write the page")
        }
        (Some(Action::Man { dir: Some(dir) }), _) => cli::man::print_pages(Cli::command(), dir),
        (None, Some(config)) => cli::run::run(config),
        (None, None) => {
            eprintln!("memring: no config given; run `memring --config FILE` (see --help)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memring: {}", cli::error_chain(&error));
            let file = match (&cli.command, &cli.config) {
                (Some(Action::Check { file, .. }), _) => Some(file),
                (None, Some(config)) => Some(config),
                _ => None,
            };
            if let Some(hint) = file.and_then(|f| cli::hints::nutcracker_yaml(f)) {
                eprintln!("memring: hint: {hint}");
            }
            ExitCode::from(1)
        }
    }
}
