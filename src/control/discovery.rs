//! The periodic DNS rounds, every `[discovery] interval_ms`:
//! - with `[discovery] srv` or `a`, the default pool's servers are the
//!   records of that name, and a new record set is published as a
//!   membership change exactly like a config edit (same hand-off window,
//!   same `ring vN: ...` line with the share of keys that move);
//! - every server whose `addr` is a host name is looked up again, and when
//!   DNS gives it another address (or says it has none), its backend is
//!   replaced: its connections move, its place on the ring (its name as
//!   written) does not.
//!
//! A DNS failure or an empty answer keeps the last good list: DNS never
//! empties the ring. Likewise, when DNS says that *none* of the servers'
//! host names exists or has an address (NXDOMAIN or an empty answer for
//! every one of them), that is taken for a resolver outage or a bad zone,
//! not for every server leaving at once: each keeps its last good
//! addresses. One name gone while others resolve is a server gone, from
//! the second round in a row that says so (one round may catch a zone
//! halfway through a reload). Each failure is logged once per episode.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, ServerConfig, Source, MAX_WEIGHT};
use crate::control::publisher::Publisher;
use crate::inputs::resolve::{Dns, DnsError, DnsFailure};

/// The servers DNS lists for `source`, sorted by name.
///
/// An SRV target `name:port` is a server named (and placed on the ring) by
/// that `name:port`, so a pod that comes back with a new address keeps its
/// keys; its weight is the record's (0, "no preference", counts as 1). An
/// A/AAAA address is a server named `ip:port`: another address is another
/// server.
///
/// # Errors
/// DNS did not answer, has no such records, or listed no server: the caller
/// keeps what it had.
/// `tls`: the servers are spoken to with TLS (`[discovery] tls`).
pub async fn servers(source: &Source, dns: Dns, tls: bool) -> Result<Vec<ServerConfig>, DnsError> {
    let mut servers: Vec<ServerConfig> = match source {
        Source::Srv(name) => {
            let targets: Vec<_> = dns
                .srv(name)
                .await?
                .into_iter()
                .filter(|target| !target.host.is_empty() && target.port > 0)
                .collect();
            let weights: Vec<u32> = targets.iter().map(|t| u32::from(t.weight)).collect();
            targets
                .iter()
                .zip(relative(&weights))
                .map(|(target, weight)| {
                    let addr = format!("{}:{}", target.host.to_ascii_lowercase(), target.port);
                    ServerConfig {
                        weight,
                        tls,
                        ..ServerConfig::plain(addr.clone(), addr)
                    }
                })
                .collect()
        }
        Source::A { host, port } => dns
            .addresses(host, *port)
            .await?
            .into_iter()
            .map(|socket| ServerConfig {
                tls,
                ..ServerConfig::plain(socket.to_string(), socket.to_string())
            })
            .collect(),
    };
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    servers.dedup_by(|a, b| a.name == b.name);
    if servers.is_empty() {
        return Err(DnsError {
            failure: DnsFailure::NoRecords,
            detail: format!("{source} lists no server"),
        });
    }
    Ok(servers)
}

/// SRV weights as ring weights: divided by their greatest common divisor,
/// within 1..=MAX_WEIGHT (0, "no preference", counts as 1). Kubernetes'
/// DNS gives each of N pods the weight 100/N: as written, every server's
/// weight would change with every scale, and keys would move between the
/// servers that stay; divided, equal records are weight 1 whatever N is.
fn relative(weights: &[u32]) -> Vec<u32> {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let weights: Vec<u32> = weights.iter().map(|&w| w.max(1)).collect();
    let divisor = weights.iter().copied().fold(0, gcd).max(1);
    weights
        .iter()
        .map(|w| (w / divisor).clamp(1, MAX_WEIGHT))
        .collect()
}

/// [`servers`] for blocking callers (`check`, `plan`, a reload).
///
/// # Errors
/// As [`servers`].
pub fn servers_blocking(
    source: &Source,
    dns: Dns,
    tls: bool,
) -> Result<Vec<ServerConfig>, DnsError> {
    crate::inputs::resolve::block_on(|| servers(source, dns, tls))
}

/// `config` with the servers its `[discovery]` records list now, for the
/// first topology. Without `srv` or `a`, `config` as it is.
///
/// # Errors
/// DNS gives no server: memring has no last good list to start from.
pub async fn first(config: &Config) -> std::io::Result<Config> {
    let Some(source) = &config.discovery.source else {
        return Ok(config.clone());
    };
    let found = servers(source, config.discovery.dns, config.discovery.tls)
        .await
        .map_err(|e| {
            std::io::Error::other(format!(
                "[discovery] {source}: {e}; memring needs at least one server to start"
            ))
        })?;
    tracing::info!(
        "discovery: {source} lists {} server{}: {}",
        found.len(),
        plural(found.len()),
        names(&found)
    );
    Ok(config.with_servers(found))
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `a:11211, b:11211`
pub fn names(servers: &[ServerConfig]) -> String {
    servers
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one round remembers for the next: which failures were logged.
#[derive(Default)]
struct Episodes {
    /// Why the discovery records could not be read, as logged: a failure
    /// of another kind (an outage, then an empty answer) is logged again.
    pool_failing: Option<DnsFailure>,
    /// Host names whose lookup failed (logged), by server name.
    names_failing: HashMap<String, bool>,
    /// DNS said no server's host name has an address (logged).
    names_outage: bool,
}

/// Runs the rounds until `shutdown`. Reads the published config each round,
/// so a reload that changes `[discovery]` takes effect at the next one.
pub async fn run(publisher: Arc<Publisher>, shutdown: CancellationToken) {
    let mut episodes = Episodes::default();
    record(&publisher, &publisher.shared().load().config, false);
    loop {
        let interval = publisher.shared().load().config.discovery.interval;
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.cancelled() => return,
        }
        pool_round(&publisher, &mut episodes).await;
        names_round(&publisher, &mut episodes).await;
    }
}

/// Puts the discovered list into the stats (`changed`: it just changed).
fn record(publisher: &Publisher, config: &Config, changed: bool) {
    if let Some(source) = &config.discovery.source {
        let names: Vec<String> = config.servers.iter().map(|s| s.name.clone()).collect();
        publisher
            .stats()
            .discovered(&source.to_string(), &names, changed);
    }
}

/// One look at the discovery records; a new list is published.
async fn pool_round(publisher: &Publisher, episodes: &mut Episodes) {
    let config = publisher.shared().load().config.clone();
    let Some(source) = config.discovery.source.clone() else {
        return;
    };
    let found = servers(&source, config.discovery.dns, config.discovery.tls).await;
    let found = match found {
        Ok(found) => found,
        Err(error) => {
            publisher.stats().discovery_failed(true);
            if episodes.pool_failing != Some(error.failure) {
                episodes.pool_failing = Some(error.failure);
                tracing::warn!(
                    "discovery: {source}: {error}; keeping the last good list of {} server{} ({})",
                    config.servers.len(),
                    plural(config.servers.len()),
                    names(&config.servers)
                );
            }
            return;
        }
    };
    publisher.stats().discovery_failed(false);
    if episodes.pool_failing.take().is_some() {
        tracing::info!("discovery: {source} answers again");
    }
    if found == config.servers {
        tracing::debug!("discovery: {source}: {} servers, unchanged", found.len());
        return;
    }
    // Servers that join are flushed first, as on a config edit
    // (control/reload.rs): a server that was in the pool before may hold values
    // older than what was written while it was out.
    let topology = publisher.shared().load_full();
    let joining = config.with_servers(found.clone());
    crate::control::newcomers::flush_newcomers_off_thread(topology, joining).await;
    // A reload may have published meanwhile: apply to what is in force,
    // if it still discovers from the same records.
    let latest = publisher.shared().load().config.clone();
    if latest.discovery != config.discovery {
        return;
    }
    match publisher.apply_config(latest.with_servers(found)) {
        Ok(published) => {
            tracing::info!(
                "ring v{}: {} (discovery: {source})",
                published.version,
                published.change
            );
            record(publisher, &publisher.shared().load().config, true);
        }
        Err(shortage) => tracing::error!(
            "discovery: {source}: new servers refused: {shortage}; still serving the previous list"
        ),
    }
}

/// One look at every server's host name; backends whose name moved are
/// replaced in one publish.
async fn names_round(publisher: &Publisher, episodes: &mut Episodes) {
    let topology = publisher.shared().load_full();
    let configured = &topology.backends[..topology.config.servers.len()];
    // Asked all at once: a DNS server that does not answer costs one
    // timeout per round, not one per name.
    let mut lookups = tokio::task::JoinSet::new();
    for (index, backend) in configured.iter().enumerate() {
        if let Some((host, port)) = backend.target().host_name() {
            let (host, dns) = (host.to_string(), backend.target().dns());
            lookups.spawn(async move { (index, dns.addresses(&host, port).await) });
        }
    }
    let mut answers = Vec::with_capacity(lookups.len());
    while let Some(joined) = lookups.join_next().await {
        if let Ok(answer) = joined {
            answers.push(answer);
        }
    }
    answers.sort_by_key(|(index, _)| *index);
    if every_name_missing(&answers) {
        if !std::mem::replace(&mut episodes.names_outage, true) {
            let first = answers
                .iter()
                .find_map(|(_, answer)| answer.as_ref().err())
                .map(|e| e.detail.clone())
                .unwrap_or_default();
            tracing::warn!(
                "discovery: DNS says none of the {} server host names has an address ({first}, ...): \
                 taken for a DNS outage or a bad zone, not a membership change; \
                 every server keeps its last good addresses",
                answers.len()
            );
        }
        return;
    }
    if std::mem::take(&mut episodes.names_outage) {
        tracing::info!("discovery: server host names resolve again");
    }
    let mut moved = 0;
    for (index, answer) in answers {
        let backend = &configured[index];
        let target = backend.target();
        let Some((host, _)) = target.host_name() else {
            continue;
        };
        let before = target.in_use();
        let failing = episodes
            .names_failing
            .entry(backend.name().to_string())
            .or_default();
        // A name missing in one round only may be a zone caught halfway
        // through a reload: it counts from its second round in a row.
        let missing_again = *failing;
        match &answer {
            Ok(found) => {
                if std::mem::take(failing) {
                    tracing::info!(server = %backend.name(), "`{host}` resolves again: {}", crate::inputs::resolve::list(found));
                }
            }
            Err(error) if !*failing => {
                *failing = true;
                if error.failure.is_authoritative() {
                    tracing::warn!(server = %backend.name(), "{error}: the server fails like a DEAD one until its name resolves again");
                } else {
                    tracing::warn!(server = %backend.name(), "{error}; its connections stay where they are");
                }
            }
            Err(_) => {}
        }
        if answer.is_err() && !missing_again {
            continue;
        }
        let was_readdressed = target.is_readdressed();
        if target.compare(&answer) && !was_readdressed {
            moved += 1;
            if let Ok(found) = &answer {
                tracing::info!(
                    server = %backend.name(),
                    "`{host}` now resolves to {} (connections were to {}): its connections move, its keys stay",
                    crate::inputs::resolve::list(found),
                    crate::inputs::resolve::list(&before)
                );
            }
        }
    }
    if moved == 0 {
        return;
    }
    let latest = publisher.shared().load().config.clone();
    match publisher.apply_config((*latest).clone()) {
        Ok(published) => tracing::info!(
            "ring v{}: {}; {} server{} readdressed by DNS",
            published.version,
            published.change,
            moved,
            plural(moved)
        ),
        Err(shortage) => {
            tracing::error!("cannot replace the connections of servers DNS moved: {shortage}")
        }
    }
}

/// Whether DNS said of every host name looked up that it has no address,
/// and answered for none: every server cannot leave in one round, so this
/// is a resolver or a zone at fault. (Lookups DNS did not answer say
/// nothing either way.)
fn every_name_missing(answers: &[(usize, Result<Vec<std::net::SocketAddr>, DnsError>)]) -> bool {
    let mut missing = false;
    for (_, answer) in answers {
        match answer {
            Ok(_) => return false,
            Err(error) => missing |= error.failure.is_authoritative(),
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srv_weights_are_relative_so_equal_records_stay_weight_one_as_n_changes() {
        assert_eq!(relative(&[33, 33, 33]), vec![1, 1, 1]);
        assert_eq!(relative(&[25, 25, 25, 25]), vec![1, 1, 1, 1]);
        assert_eq!(relative(&[10, 20, 30]), vec![1, 2, 3]);
        assert_eq!(relative(&[0, 0]), vec![1, 1]);
        assert_eq!(relative(&[0, 3]), vec![1, 3]);
        assert_eq!(relative(&[1, 65535]), vec![1, MAX_WEIGHT]);
        assert_eq!(relative(&[]), Vec::<u32>::new());
    }

    #[test]
    fn only_every_name_missing_is_taken_for_an_outage() {
        let gone = || {
            Err(DnsError {
                failure: DnsFailure::NoSuchName,
                detail: "x".into(),
            })
        };
        let empty = || {
            Err(DnsError {
                failure: DnsFailure::NoRecords,
                detail: "x".into(),
            })
        };
        let silent = || {
            Err(DnsError {
                failure: DnsFailure::Unanswered,
                detail: "x".into(),
            })
        };
        let found = || Ok(vec!["127.0.0.1:11211".parse().unwrap()]);
        assert!(every_name_missing(&[(0, gone()), (1, empty())]));
        assert!(every_name_missing(&[(0, gone()), (1, silent())]));
        assert!(!every_name_missing(&[(0, gone()), (1, found())]));
        assert!(!every_name_missing(&[(0, silent()), (1, silent())]));
        assert!(!every_name_missing(&[]));
    }

    #[test]
    fn a_dns_server_that_does_not_answer_lists_no_servers() {
        let dns = Dns {
            server: Some("127.0.0.1:9".parse().unwrap()),
        };
        let source = Source::Srv("_memcache._tcp.cache.test.local".into());
        let error = servers_blocking(&source, dns, false).unwrap_err();
        assert_eq!(error.failure, DnsFailure::Unanswered, "{error}");
    }
}
