//! `memring member`: the agent that runs beside one memcached and keeps its
//! record in etcd (`<prefix>members/<name>`, see `control::member_record`)
//! under a lease it keeps alive. It waits for memcached to answer, registers
//! it `JOINING` (warming) for `--warm-ms`, then `ACTIVE`; on SIGTERM or
//! SIGINT it sets `LEAVING`, waits `--drain-ms`, deletes the key, revokes
//! the lease and exits 0. If etcd cannot be reached it retries with backoff
//! and registers again under a new lease (the record stays the same), so a
//! lease lost while etcd was away is replaced. If the agent dies, the lease
//! expires after `--lease-ttl-s` and the key with it.

use std::time::Duration;

use anyhow::Context as _;
use etcd_client::{Client, PutOptions};
use memring::config::EtcdAccess;
use memring::control::member_record::{member_key, MemberRecord, MemberState};
use tokio::time::Instant;

/// What `memring member` was given.
#[derive(Debug, Clone)]
pub(crate) struct MemberArgs {
    pub(crate) etcd: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) name: String,
    pub(crate) addr: String,
    pub(crate) weight: u32,
    pub(crate) zone: Option<String>,
    pub(crate) tls: bool,
    pub(crate) warm: Duration,
    pub(crate) drain: Duration,
    pub(crate) lease_ttl_s: i64,
    pub(crate) wait: Duration,
    /// TLS and authentication to etcd, as a sidecar's `[discovery]`.
    pub(crate) access: EtcdAccess,
}

/// Longest pause between two attempts to reach etcd or memcached.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// First pause between two attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// How long one etcd call or one `version` may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a memcached that does not answer yet is logged again.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Runs the agent until it has left (a signal), or fails to start.
pub(crate) fn run(args: MemberArgs) -> anyhow::Result<()> {
    check(&args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(agent(args))
}

/// What clap cannot check alone.
fn check(args: &MemberArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.prefix.starts_with('/') && args.prefix.ends_with('/'),
        "--prefix {:?} must start and end with `/` (e.g. /memring/web/)",
        args.prefix
    );
    anyhow::ensure!(
        !args.name.is_empty()
            && !args
                .name
                .chars()
                .any(|c| c == '/' || c.is_whitespace() || c.is_control()),
        "--name {:?} must be non-empty, without `/`, whitespace or control characters",
        args.name
    );
    anyhow::ensure!(
        args.addr.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        }),
        "--addr {:?} must be host:port",
        args.addr
    );
    anyhow::ensure!(
        args.etcd.iter().all(|e| !e.trim().is_empty()),
        "--etcd has an empty endpoint"
    );
    let https = args.etcd.iter().any(|e| e.starts_with("https://"));
    anyhow::ensure!(
        !https || args.etcd.iter().all(|e| e.starts_with("https://")),
        "--etcd mixes http:// and https:// endpoints"
    );
    args.access
        .validate(
            https
                || (args.access.ca_file.is_some() && !args.etcd.iter().any(|e| e.contains("://"))),
        )
        .map_err(|why| anyhow::anyhow!("{}", flags(&why)))?;
    // The files now, so a wrong path fails at start rather than at each retry.
    memring::control::etcd::read_access(&args.access)
        .map_err(|why| anyhow::anyhow!("{}", flags(&why)))?;
    Ok(())
}

/// SIGTERM or SIGINT, once.
async fn signalled() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the agent runs until killed; its lease
        // then expires.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn agent(args: MemberArgs) -> anyhow::Result<()> {
    let key = member_key(&args.prefix, &args.name);
    let mut record = MemberRecord {
        addr: args.addr.clone(),
        weight: args.weight,
        state: if args.warm.is_zero() {
            MemberState::Active
        } else {
            MemberState::Joining
        },
        zone: args.zone.clone(),
        tls: args.tls,
    };
    // What every sidecar would refuse is refused here, before it is stored.
    MemberRecord::parse(record.to_json().as_bytes())
        .map_err(|e| anyhow::anyhow!("member {}: {e}", args.name))?;
    let stop = signalled();
    tokio::pin!(stop);
    // memcached first: a member that cannot serve is not registered.
    tokio::select! {
        waited = wait_for_memcached(&args) => waited?,
        _ = &mut stop => {
            tracing::info!(member = %args.name, "stopped before memcached answered; nothing registered");
            return Ok(());
        }
    }
    let active_at = Instant::now() + args.warm;
    // Set on the signal: when the drain ends.
    let mut leave_at: Option<Instant> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        // One registration: a connection, a lease, the record under it.
        let registered = async {
            let mut client = connect(&args.etcd, &args.access).await?;
            let lease = timed(client.lease_grant(args.lease_ttl_s, None))
                .await
                .context("cannot grant a lease")?
                .id();
            put(&mut client, &key, &record, lease).await?;
            let (keeper, stream) = timed(client.lease_keep_alive(lease))
                .await
                .context("cannot keep the lease alive")?;
            anyhow::Ok((client, lease, keeper, stream))
        };
        let (mut client, lease, mut keeper, mut stream) = tokio::select! {
            registered = registered => match registered {
                Ok(registered) => registered,
                Err(e) => {
                    tracing::warn!(member = %args.name, "etcd: {}; trying again in {} ms", crate::cli::error_chain(&e), backoff.as_millis());
                    if let Some(until) = leave_at {
                        if Instant::now() >= until {
                            tracing::warn!(member = %args.name, "left without deleting its key (etcd unreachable); it goes when its lease expires");
                            return Ok(());
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut stop, if leave_at.is_none() => {
                            leave_at = Some(Instant::now() + args.drain);
                            record.state = MemberState::Leaving;
                        }
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            },
            _ = &mut stop, if leave_at.is_none() => {
                leave_at = Some(Instant::now() + args.drain);
                record.state = MemberState::Leaving;
                continue;
            }
        };
        backoff = FIRST_BACKOFF;
        tracing::info!(member = %args.name, key = %key, lease, state = record.state.as_str(), "registered");
        // Heartbeats at a third of the TTL: two may be lost before it expires.
        let beat = Duration::from_millis((args.lease_ttl_s as u64 * 1000 / 3).max(100));
        let mut heartbeat = tokio::time::interval(beat);
        let lost: anyhow::Error = loop {
            let activate = async {
                match (record.state, leave_at) {
                    (MemberState::Joining, None) => tokio::time::sleep_until(active_at).await,
                    _ => std::future::pending().await,
                }
            };
            let drained = async {
                match leave_at {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = heartbeat.tick() => {
                    let alive = async {
                        timed(keeper.keep_alive()).await?;
                        match timed(stream.message()).await? {
                            Some(reply) if reply.ttl() > 0 => Ok(()),
                            _ => Err(anyhow::anyhow!("lease {lease} expired")),
                        }
                    };
                    if let Err(e) = alive.await {
                        break e.context("heartbeat failed");
                    }
                }
                _ = activate => {
                    record.state = MemberState::Active;
                    if let Err(e) = put(&mut client, &key, &record, lease).await {
                        break e;
                    }
                    tracing::info!(member = %args.name, "warmed: ACTIVE");
                }
                _ = &mut stop, if leave_at.is_none() => {
                    leave_at = Some(Instant::now() + args.drain);
                    record.state = MemberState::Leaving;
                    if let Err(e) = put(&mut client, &key, &record, lease).await {
                        break e;
                    }
                    tracing::info!(member = %args.name, drain_ms = args.drain.as_millis() as u64, "LEAVING; draining");
                }
                _ = drained => {
                    let gone = async {
                        timed(client.delete(key.as_str(), None)).await?;
                        timed(client.lease_revoke(lease)).await?;
                        anyhow::Ok(())
                    };
                    match gone.await {
                        Ok(()) => tracing::info!(member = %args.name, "left: key deleted, lease revoked"),
                        Err(e) => tracing::warn!(member = %args.name, "left, but could not delete its key ({}); it goes when its lease expires", crate::cli::error_chain(&e)),
                    }
                    return Ok(());
                }
            }
        };
        tracing::warn!(member = %args.name, "etcd: {}; registering again", crate::cli::error_chain(&lost));
    }
}

/// The config keys of a message about etcd access, as this agent's flags.
fn flags(text: &str) -> String {
    text.replace("etcd_ca_file", "--etcd-ca-file")
        .replace("etcd_cert_file", "--etcd-cert-file")
        .replace("etcd_key_file", "--etcd-key-file")
        .replace("etcd_username", "--etcd-username")
        .replace("etcd_password_file", "--etcd-password-file")
        .replace("the config", "a flag")
}

/// A new etcd client for `endpoints`; fails fast when none answers.
async fn connect(endpoints: &[String], access: &EtcdAccess) -> anyhow::Result<Client> {
    let options = memring::control::etcd::connect_options(access)
        .map_err(|why| anyhow::anyhow!("{}", flags(&why)))?
        .with_connect_timeout(CALL_TIMEOUT)
        .with_timeout(CALL_TIMEOUT);
    timed(Client::connect(endpoints, Some(options)))
        .await
        .with_context(|| format!("cannot reach {}", endpoints.join(",")))
}

/// Stores `record` at `key` under `lease`.
async fn put(
    client: &mut Client,
    key: &str,
    record: &MemberRecord,
    lease: i64,
) -> anyhow::Result<()> {
    let options = PutOptions::new().with_lease(lease);
    timed(client.put(key, record.to_json(), Some(options)))
        .await
        .with_context(|| format!("cannot put {key}"))?;
    Ok(())
}

/// `call`, failing after [`CALL_TIMEOUT`].
async fn timed<T, E>(call: impl std::future::Future<Output = Result<T, E>>) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result.map_err(anyhow::Error::from),
        Err(_) => Err(anyhow::anyhow!(
            "no answer within {} ms",
            CALL_TIMEOUT.as_millis()
        )),
    }
}

/// Waits until memcached at `args.addr` answers `version` (with `--tls`,
/// until it accepts a connection), for at most `args.wait`.
async fn wait_for_memcached(args: &MemberArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut logged: Option<Instant> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let error = match tokio::time::timeout(CALL_TIMEOUT, answers(&args.addr, args.tls)).await {
            Ok(Ok(())) => {
                tracing::info!(member = %args.name, addr = %args.addr, "memcached answers");
                return Ok(());
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", CALL_TIMEOUT.as_millis()),
        };
        if started.elapsed() >= args.wait {
            anyhow::bail!(
                "memcached at {} did not answer within {} ms (last: {error}); not registered",
                args.addr,
                args.wait.as_millis()
            );
        }
        if logged.map_or(true, |at| at.elapsed() >= WAIT_LOG_EVERY) {
            tracing::info!(member = %args.name, addr = %args.addr, "waiting for memcached to answer: {error}");
            logged = Some(Instant::now());
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Whether memcached at `addr` answers `version` (`tls`: accepts a
/// connection).
async fn answers(addr: &str, tls: bool) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    if tls {
        return Ok(());
    }
    stream.write_all(b"version\r\n").await?;
    let mut reply = Vec::with_capacity(64);
    let mut chunk = [0u8; 64];
    while !reply.ends_with(b"\r\n") && reply.len() < 256 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..n]);
    }
    if reply.starts_with(b"VERSION ") {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "answered {:?} to version",
            String::from_utf8_lossy(&reply)
        )))
    }
}
