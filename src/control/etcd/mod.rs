//! The membership store: with `[discovery] etcd_endpoints`, the default
//! pool's servers are the file's `[[servers]]` plus the members under
//! `<prefix>members/` in etcd (see `member_record`), kept up to date by a
//! watch. Runs on the control runtime; the request path never waits on
//! etcd: a change is published as a config edit is (same hand-off window,
//! same `ring vN: ...` line).
//!
//! - An initial range read, then a watch from the next revision; each
//!   change rebuilds the list: the file's servers, ACTIVE members, and
//!   JOINING members as warming servers (`ServerConfig::warming`). LEAVING
//!   members are left off the ring, so the hand-off window reads their keys
//!   through from them; their key's deletion is then nothing more.
//! - A record that is not JSON, lacks `addr`, names an unknown state or a
//!   bad address is ignored with one warning naming its key (what the key
//!   held before stays); it never empties the ring.
//! - A member whose key disappears without LEAVING (its lease expired) is
//!   SUSPECT: it stays on the ring for `member_grace_ms`. Back within the
//!   grace, nothing moves. Still missing then while memring's own health
//!   checks reach it (it is not DEAD), it stays one more grace (damping,
//!   logged); after that it leaves whatever its health.
//! - A lost connection or a compacted revision: reconnect with backoff and
//!   read everything again, so no change is missed. Meanwhile memring serves
//!   the membership it has, and suspects do not expire (etcd cannot say
//!   whether they came back).
//! - Every membership applied is written to `etcd_cache_file` (by rename),
//!   which memring starts from when etcd cannot be reached at start.
//! - Each sidecar keeps `<prefix>proxies/<id>` under a lease of its own,
//!   saying which revision it applied and its ring digest, the revision
//!   of a change it staged, and the server lists its writes reach
//!   (`writes`): a change that moves reads is staged first and switched to
//!   once every live sidecar writes its servers (`control/fleet.rs`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::backend::health::HealthState;
use crate::config::{Config, EtcdSource, ServerConfig};
use crate::control::fleet::{self, Pending};
use crate::control::member_record::{member_name, MemberRecord, MemberState};
use crate::control::publisher::Publisher;

mod access;
mod cut_off;
mod sidecars;

use access::connect;
pub use access::{chain, connect_options, read_access, AccessFiles};
use cut_off::Lease;
use sidecars::*;

/// How long one etcd request may take before the connection counts as lost.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The first and the longest wait before connecting again.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// How long the watch waits for more messages before applying what it
/// has: many members put at once make one change, not one per message.
const COALESCE: Duration = Duration::from_millis(20);
/// The lease of `<prefix>proxies/<id>`, in seconds.
const PROXY_LEASE_S: i64 = 10;

/// One member as this sidecar holds it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    record: MemberRecord,
    /// Its key vanished without LEAVING at this moment: SUSPECT.
    missing_since: Option<Instant>,
    /// It outlived its grace because it still answered: one more grace.
    damped: bool,
}

/// The members of the store, as the watch has them.
#[derive(Debug, Default)]
pub(crate) struct Members {
    entries: BTreeMap<String, Entry>,
    /// Keys whose bad value was logged, with that value's hash (logged
    /// once; a hash, so a store full of large bad values costs no copies).
    bad: HashMap<String, u64>,
    /// The etcd revision these members are at.
    revision: i64,
    /// Members left out for sharing an addr, as logged (logged once).
    shared: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

/// What the cache file holds.
#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    revision: i64,
    members: BTreeMap<String, MemberRecord>,
}

impl Members {
    fn from_cached(cached: Cached) -> Members {
        Members {
            entries: cached
                .members
                .into_iter()
                .map(|(name, record)| {
                    (
                        name,
                        Entry {
                            record,
                            missing_since: None,
                            damped: false,
                        },
                    )
                })
                .collect(),
            bad: HashMap::new(),
            revision: cached.revision,
            shared: Default::default(),
        }
    }

    fn cached(&self) -> Cached {
        Cached {
            revision: self.revision,
            members: self
                .entries
                .iter()
                .map(|(name, entry)| (name.clone(), entry.record.clone()))
                .collect(),
        }
    }

    /// `key` now holds `value`. A bad value is logged once and leaves the
    /// member as it was.
    fn put(&mut self, prefix: &str, key: &str, value: &[u8]) {
        let name = match member_name(prefix, key) {
            Ok(name) => name.to_string(),
            Err(e) => return self.ignore(key, value, &e.to_string()),
        };
        let record = match MemberRecord::parse(value) {
            Ok(record) => record,
            Err(e) => return self.ignore(key, value, &e.to_string()),
        };
        if let Err(e) = Config::check_server(&name, &record.addr) {
            return self.ignore(key, value, &e);
        }
        if let Some(Err(e)) = record.zone.as_deref().map(Config::check_zone) {
            return self.ignore(key, value, &format!("zone {e}"));
        }
        self.bad.remove(key);
        if let Some(old) = self.entries.get(&name) {
            if old.missing_since.is_some() {
                tracing::info!(
                    server = %name,
                    "etcd: member {name} is back ({}): nothing moves",
                    record.state.as_str()
                );
            }
        }
        self.entries.insert(
            name,
            Entry {
                record,
                missing_since: None,
                damped: false,
            },
        );
    }

    fn ignore(&mut self, key: &str, value: &[u8], why: &str) {
        let hash = twox_hash::XxHash3_64::oneshot(value);
        if self.bad.get(key) != Some(&hash) {
            tracing::warn!("etcd: {key}: ignored: {why}; the ring keeps what it had for it");
            self.bad.insert(key.to_string(), hash);
        }
    }

    /// `key` was deleted at `now`: a LEAVING member is gone; any other is
    /// SUSPECT for `grace`.
    fn delete(&mut self, prefix: &str, key: &str, now: Instant, grace: Duration) {
        self.bad.remove(key);
        let Ok(name) = member_name(prefix, key) else {
            return;
        };
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        if entry.record.state == MemberState::Leaving {
            tracing::info!(server = %name, "etcd: member {name} left (its key is deleted after LEAVING)");
            self.entries.remove(name);
        } else if entry.missing_since.is_none() {
            entry.missing_since = Some(now);
            tracing::warn!(
                server = %name,
                "etcd: member {name}'s key is gone without LEAVING (its lease expired?): SUSPECT, it stays on the ring for {} ms",
                grace.as_millis()
            );
        }
    }

    /// Takes a full read at store revision `at`: every key read is put,
    /// every member not read is deleted. The membership's revision is the
    /// last write to a key read, or `at` when a member went (a deletion
    /// leaves no key to date it).
    fn replace(
        &mut self,
        prefix: &str,
        at: i64,
        read: &[(String, Vec<u8>, i64)],
        now: Instant,
        grace: Duration,
    ) {
        let before = self.entries.clone();
        let names: Vec<String> = self.entries.keys().cloned().collect();
        for name in names {
            let key = crate::control::member_record::member_key(prefix, &name);
            if !read.iter().any(|(k, _, _)| *k == key) {
                self.delete(prefix, &key, now, grace);
            }
        }
        // A member went (or turned suspect) since the last read.
        let deleted = self.entries != before;
        self.bad
            .retain(|key, _| read.iter().any(|(k, _, _)| k == key));
        for (key, value, _) in read {
            self.put(prefix, key, value);
        }
        // The latest write to a member key counts even when it changed
        // nothing (a record put again), as the watch counts each event: a
        // sidecar that read everything again and one that watched then
        // show the same revision, which the fleet's gate compares.
        let latest = read.iter().map(|(_, _, r)| *r).max().unwrap_or(0);
        self.revision = if deleted {
            at.max(self.revision)
        } else {
            latest.max(self.revision)
        };
    }

    /// Suspects whose grace is over leave, unless `answers` says memring
    /// still reaches them and they were not given one more grace already.
    /// Whether any left.
    fn expire(&mut self, now: Instant, grace: Duration, answers: &dyn Fn(&str) -> bool) -> bool {
        let mut gone = Vec::new();
        for (name, entry) in &mut self.entries {
            let Some(since) = entry.missing_since else {
                continue;
            };
            if now.duration_since(since) < grace {
                continue;
            }
            if !entry.damped && answers(name) {
                entry.damped = true;
                entry.missing_since = Some(now);
                tracing::warn!(
                    server = %name,
                    "etcd: member {name}'s key is still missing after {} ms, but it answers memring's health checks: it stays {} ms more (damping), then leaves",
                    grace.as_millis(),
                    grace.as_millis()
                );
            } else {
                gone.push(name.clone());
            }
        }
        for name in &gone {
            tracing::warn!(server = %name, "etcd: member {name} is still missing after its grace: it leaves the ring");
            self.entries.remove(name);
        }
        !gone.is_empty()
    }

    /// When the next suspect's grace is over.
    fn next_deadline(&self, grace: Duration) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.missing_since)
            .min()
            .map(|since| since + grace)
    }

    /// The servers the members add to the file's, sorted by name: ACTIVE
    /// and SUSPECT members, and JOINING ones as warming; not LEAVING ones.
    /// A member named as a file server is left to the file.
    ///
    /// A member whose `addr` is a file server's, or an earlier member's (by
    /// name), is left out: two places on the ring on one memcached would
    /// let a hand-off delete what was just written there (the config file
    /// refuses the same). Logged once per member.
    fn servers(&self, file: &[ServerConfig]) -> Vec<ServerConfig> {
        let mut taken: std::collections::HashSet<&str> =
            file.iter().map(|s| s.addr.as_str()).collect();
        let mut servers = Vec::with_capacity(self.entries.len());
        for (name, e) in &self.entries {
            if file.iter().any(|s| &s.name == name) {
                continue;
            }
            // A LEAVING member still holds its addr: no other takes it.
            if !taken.insert(e.record.addr.as_str()) {
                let mut logged = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                if logged.insert((name.clone(), e.record.addr.clone())) {
                    tracing::warn!(
                        server = %name,
                        "etcd: member {name} is left out: its addr {} is another server's",
                        e.record.addr
                    );
                }
                continue;
            }
            if e.record.state == MemberState::Leaving {
                continue;
            }
            servers.push(ServerConfig {
                weight: e.record.weight,
                tls: e.record.tls,
                warming: e.record.state == MemberState::Joining,
                zone: e.record.zone.clone(),
                ..ServerConfig::plain(name.clone(), e.record.addr.clone())
            });
        }
        servers
    }

    /// Each member's state for `stats`.
    fn states(&self) -> BTreeMap<String, &'static str> {
        self.entries
            .iter()
            .map(|(name, e)| {
                let state = if e.missing_since.is_some() {
                    "SUSPECT"
                } else {
                    e.record.state.as_str()
                };
                (name.clone(), state)
            })
            .collect()
    }
}

/// The file's servers and the members' servers, as one list.
fn merged(file: &[ServerConfig], members: &[ServerConfig]) -> Vec<ServerConfig> {
    file.iter().chain(members).cloned().collect()
}

/// The membership memring starts from: what etcd holds now, or, when etcd
/// cannot be reached, the cache file.
pub struct Startup {
    members: Members,
    /// The file's servers.
    file: Vec<ServerConfig>,
    /// A change the fleet staged and has not switched to (`<prefix>staged`):
    /// the revision in force and its servers, which this sidecar starts
    /// on, the change staged.
    staged: Option<(i64, Vec<ServerConfig>)>,
}

/// `config` with etcd's members added to its servers, for the first
/// topology, and what the watch starts from. Without etcd, `config` as it
/// is and `None`.
///
/// # Errors
/// etcd cannot be reached and there is no usable cache file.
pub async fn first(config: &Config) -> std::io::Result<(Config, Option<Startup>)> {
    let Some(etcd) = &config.discovery.etcd else {
        return Ok((config.clone(), None));
    };
    let mut record = None;
    let members = match read_all(etcd).await {
        Ok((at, read)) => {
            record = read_staged(etcd).await;
            let mut members = Members::default();
            members.replace(&etcd.prefix, at, &read, Instant::now(), etcd.member_grace);
            tracing::info!(
                "etcd: {} member{} at revision {} ({})",
                members.entries.len(),
                if members.entries.len() == 1 { "" } else { "s" },
                members.revision,
                etcd.endpoints.join(",")
            );
            save_cache(&etcd.cache_file, &members);
            members
        }
        Err(reached) => match load_cache(&etcd.cache_file) {
            Ok(cached) => {
                tracing::warn!(
                    "etcd at {} cannot be reached ({reached}): starting from the membership cached in {} (revision {}, {} members); it catches up when etcd answers",
                    etcd.endpoints.join(","),
                    etcd.cache_file.display(),
                    cached.revision,
                    cached.members.len()
                );
                Members::from_cached(cached)
            }
            Err(cache) => {
                return Err(std::io::Error::other(format!(
                    "etcd at {} cannot be reached ({reached}) and there is no membership cache to start from ({}: {cache}): memring needs etcd once to learn the members",
                    etcd.endpoints.join(","),
                    etcd.cache_file.display()
                )))
            }
        },
    };
    let servers = merged(&config.servers, &members.servers(&config.servers));
    let file = config.servers.clone();
    let staged = record
        .filter(|_| !etcd.fleet_switch.is_zero())
        .and_then(|r| Some((r.applied, r.in_force_for(&servers)?)));
    let servers = match &staged {
        Some((applied, in_force)) => {
            tracing::info!(
                "etcd: the fleet staged revision {} and has not switched to it yet ({}): starting on the servers in force (revision {applied}), the change staged",
                members.revision,
                staged_key(etcd)
            );
            fleet::staged_servers(in_force, &servers)
        }
        None => servers,
    };
    Ok((
        config.with_servers(servers),
        Some(Startup {
            members,
            file,
            staged,
        }),
    ))
}

/// The key of a change the fleet staged and has not switched to.
fn staged_key(etcd: &EtcdSource) -> String {
    format!("{}staged", etcd.prefix)
}

/// `<prefix>staged`, if etcd has one that reads (a bad one is ignored).
async fn read_staged(etcd: &EtcdSource) -> Option<fleet::StagedRecord> {
    let mut client = connect(etcd).await.ok()?;
    let got = tokio::time::timeout(REQUEST_TIMEOUT, client.get(staged_key(etcd), None)).await;
    let response = got.ok()?.ok()?;
    let value = response.kvs().first()?.value();
    serde_json::from_slice(value)
        .map_err(|e| tracing::warn!("etcd: {}: ignored: {e}", staged_key(etcd)))
        .ok()
}

/// The key every sidecar writes when it switches reads to a staged change
/// (`{"revision":N,"digest":"…"}`): a `<prefix>staged` record put after it
/// is refused (see [`put_staged`]).
fn switched_key(etcd: &EtcdSource) -> String {
    format!("{}switched", etcd.prefix)
}

/// Puts the change staged under `<prefix>staged` for a sidecar that starts
/// before the fleet switches to it; only if no sidecar switched reads
/// (wrote `<prefix>switched`) after store revision `seen`, at which this
/// sidecar read the others' registrations and found one not there yet.
/// So a put that lands late (from a sidecar cut off from etcd, or one that
/// timed out here and reached etcd later) cannot leave behind the record
/// of a change the fleet has switched to, which would start a sidecar on
/// a ring the others no longer write. Whether it was written.
async fn put_staged(
    client: &mut Client,
    etcd: &EtcdSource,
    record: &fleet::StagedRecord,
    seen: i64,
) -> bool {
    let Ok(value) = serde_json::to_string(record) else {
        return false;
    };
    let txn = Txn::new()
        .when([Compare::mod_revision(
            switched_key(etcd),
            CompareOp::Less,
            seen.saturating_add(1),
        )])
        .and_then([TxnOp::put(staged_key(etcd), value, None)]);
    match tokio::time::timeout(REQUEST_TIMEOUT, client.txn(txn)).await {
        Ok(Ok(done)) if done.succeeded() => true,
        Ok(Ok(_)) => {
            tracing::info!(
                "etcd: {} not written for revision {}: a sidecar switched reads after this one read the others (store revision {seen})",
                staged_key(etcd),
                record.revision
            );
            false
        }
        _ => {
            tracing::warn!(
                "etcd: cannot write {}: a sidecar that starts before the fleet switches to revision {} starts on it at once",
                staged_key(etcd),
                record.revision
            );
            false
        }
    }
}

/// On a switch to the change of `digest` at `revision`: writes
/// `<prefix>switched` (so that a late `<prefix>staged` put is refused) and
/// deletes `<prefix>staged` if it is that change's record, in one
/// transaction that compares the record's mod revision (not a later
/// change's record another sidecar put meanwhile).
async fn drop_staged(client: &mut Client, etcd: &EtcdSource, digest: u64, revision: i64) {
    let marker = serde_json::json!({
        "revision": revision,
        "digest": crate::ring::digest::hex(digest),
    })
    .to_string();
    let got = tokio::time::timeout(REQUEST_TIMEOUT, client.get(staged_key(etcd), None)).await;
    let ours = got.ok().and_then(Result::ok).and_then(|response| {
        let kv = response.kvs().first()?;
        let record: fleet::StagedRecord = serde_json::from_slice(kv.value()).ok()?;
        (crate::ring::digest::parse_hex(&record.target_digest) == Some(digest))
            .then_some(kv.mod_revision())
    });
    let switched = TxnOp::put(switched_key(etcd), marker, None);
    let txn = match ours {
        Some(at) => Txn::new()
            .when([Compare::mod_revision(
                staged_key(etcd),
                CompareOp::Equal,
                at,
            )])
            .and_then([TxnOp::delete(staged_key(etcd), None), switched.clone()])
            .or_else([switched]),
        None => Txn::new().and_then([switched]),
    };
    if !matches!(
        tokio::time::timeout(REQUEST_TIMEOUT, client.txn(txn)).await,
        Ok(Ok(_))
    ) {
        tracing::warn!(
            "etcd: cannot write {} after switching to revision {revision}",
            switched_key(etcd)
        );
    }
}

/// What a range read gives: the store's revision, and each key with its
/// value and the revision that last changed it.
type Read = (i64, Vec<(String, Vec<u8>, i64)>);

/// Every key under `<prefix>members/` and the revision of the read.
async fn read_all(etcd: &EtcdSource) -> Result<Read, String> {
    let mut client = connect(etcd).await?;
    read_with(&mut client, etcd).await
}

async fn read_with(client: &mut Client, etcd: &EtcdSource) -> Result<Read, String> {
    read_prefix(client, format!("{}members/", etcd.prefix)).await
}

/// Every key under `prefix`, with its value and last revision, and the
/// store's revision at the read; within [`REQUEST_TIMEOUT`].
async fn read_prefix(client: &mut Client, prefix: String) -> Result<Read, String> {
    let response = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client.get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await
    .map_err(|_| "read timed out".to_string())?
    .map_err(|e| chain(&e))?;
    let revision = response.header().map_or(0, |h| h.revision());
    let read = response
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
                kv.mod_revision(),
            )
        })
        .collect();
    Ok((revision, read))
}

/// The revision and number of members that the cache file at `path` holds
/// (for `memring check`, which does not contact etcd).
///
/// # Errors
/// The file cannot be read or is not a membership cache.
pub fn cache_summary(path: &Path) -> Result<(i64, usize), String> {
    load_cache(path).map(|cached| (cached.revision, cached.members.len()))
}

fn load_cache(path: &Path) -> Result<Cached, String> {
    let text =
        crate::inputs::regular_file::read_to_string(path, 64 << 20).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// Writes the cache beside its final name, then renames it there: a crash
/// leaves the old cache or the new one, never half of one.
fn save_cache(path: &Path, members: &Members) {
    let text = match serde_json::to_string(&members.cached()) {
        Ok(text) => text,
        Err(e) => return tracing::warn!("etcd: membership cache: {e}"),
    };
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let written = std::fs::write(&temporary, text).and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = written {
        tracing::warn!(
            "etcd: cannot write the membership cache {}: {e}",
            path.display()
        );
    }
}

/// What the watch shares with the proxy registration: the revision and
/// ring digest applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Applied {
    revision: i64,
    digest: u64,
    /// The revision of a change staged (0: none).
    staged: i64,
    /// `fleet::servers_digest` of the servers reads use and of those
    /// staged (0: none), which the other sidecars' gates compare.
    applied_digest: u64,
    staged_digest: u64,
}

/// What the watch keeps for the fleet gating (`control/fleet.rs`).
struct Fleet {
    /// This sidecar's key under `<prefix>proxies/`.
    me: String,
    /// The revision of the membership in force (reads).
    applied: i64,
    /// A change staged and not switched to yet.
    pending: Option<Pending>,
    /// The fleet's hand-off window (`<prefix>window`) was looked for.
    window_read: bool,
}

/// Why a watch session ended.
enum Ended {
    Shutdown,
    /// Lost, with why; read everything again after a backoff.
    Lost(String),
    /// The revision was compacted: read everything again now.
    Compacted,
    /// Cut off past the lease with `etcd_cut_off = "miss"`: read
    /// everything again once registered again.
    CutOff,
}

/// Watches the members until `shutdown`, from `startup` (what [`first`]
/// found). Also keeps this sidecar's `<prefix>proxies/<id>` key.
/// `layout`: every pool, whose digest (`stats`' `ring_digest`) the
/// registration carries.
pub async fn run(
    publisher: Arc<Publisher>,
    layout: crate::pools::layout::SharedLayout,
    startup: Startup,
    shutdown: CancellationToken,
) {
    let Some(etcd) = publisher.shared().load().config.discovery.etcd.clone() else {
        return;
    };
    let mut members = startup.members;
    let from_store = |servers: &[ServerConfig]| -> Vec<ServerConfig> {
        let file = &startup.file;
        let of_store = |s: &&ServerConfig| !file.iter().any(|f| f.name == s.name);
        servers.iter().filter(of_store).cloned().collect()
    };
    publisher.set_store_servers(from_store(&publisher.shared().load().config.servers));
    let (applied_tx, applied_rx) = tokio::sync::watch::channel(Applied::default());
    let mut fleet = Fleet::at_start(&publisher, &etcd, &members, &startup.file, startup.staged);
    record(&publisher, &members, &fleet, &applied_tx);
    let lease = Arc::new(Lease::new(
        etcd.cut_off,
        Duration::from_secs(PROXY_LEASE_S as u64),
    ));
    tokio::spawn(cut_off::watchdog(
        lease.clone(),
        publisher.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(register(
        Registration {
            etcd: etcd.clone(),
            key: fleet.me.clone(),
            lease: lease.clone(),
            publisher: publisher.clone(),
        },
        applied_rx,
        layout,
        shutdown.clone(),
    ));
    let sidecar = Sidecar {
        publisher: &publisher,
        etcd: &etcd,
        applied: &applied_tx,
        lease: &lease,
    };
    let mut backoff = BACKOFF.0;
    let mut failing: Option<String> = None;
    loop {
        let mut link = Link {
            failing: &mut failing,
            backoff: &mut backoff,
        };
        match session(&sidecar, &mut members, &mut fleet, &mut link, &shutdown).await {
            Ended::Shutdown => return,
            Ended::Compacted => {
                tracing::info!(
                    "etcd: the watched revision was compacted: reading every member again"
                );
                continue;
            }
            Ended::CutOff => continue,
            Ended::Lost(why) => {
                if failing.as_deref() != Some(why.as_str()) {
                    tracing::warn!(
                        "etcd at {}: {why}; serving the membership of revision {} until etcd answers",
                        etcd.endpoints.join(","),
                        members.revision
                    );
                    failing = Some(why);
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(BACKOFF.1);
                continue;
            }
        }
    }
}

/// What every step of the etcd loop reads: where it publishes, the etcd
/// settings, and where it says what it applied (the registration).
#[derive(Clone, Copy)]
struct Sidecar<'a> {
    publisher: &'a Publisher,
    etcd: &'a EtcdSource,
    applied: &'a tokio::sync::watch::Sender<Applied>,
    /// The registration's lease, for `etcd_cut_off`.
    lease: &'a Lease,
}

/// How the connection has fared: the failure logged, the next wait.
struct Link<'a> {
    failing: &'a mut Option<String>,
    backoff: &'a mut Duration,
}

/// One connection: a full read, then the watch, until it fails.
async fn session(
    sidecar: &Sidecar<'_>,
    members: &mut Members,
    fleet: &mut Fleet,
    link: &mut Link<'_>,
    shutdown: &CancellationToken,
) -> Ended {
    let Sidecar {
        publisher,
        etcd,
        applied,
        lease,
    } = *sidecar;
    let mut client = match connect(etcd).await {
        Ok(client) => client,
        Err(e) => return Ended::Lost(e),
    };
    // Cut off (`etcd_cut_off = "miss"`), the read counts once the
    // registration was written again before it: read until it was.
    let revision = loop {
        let read_at = Instant::now();
        let (revision, read) = match read_with(&mut client, etcd).await {
            Ok(read) => read,
            Err(e) => return Ended::Lost(e),
        };
        if link.failing.take().is_some() {
            tracing::info!("etcd answers again: reading every member (at revision {revision})");
        }
        *link.backoff = BACKOFF.0;
        members.replace(
            &etcd.prefix,
            revision,
            &read,
            Instant::now(),
            etcd.member_grace,
        );
        apply(sidecar, members, fleet, &mut client).await;
        if lease.caught_up(publisher, read_at, members.revision) {
            break revision;
        }
        tokio::select! {
            () = lease.changed.notified() => {}
            () = tokio::time::sleep(BACKOFF.1) => {}
            () = shutdown.cancelled() => return Ended::Shutdown,
        }
    };
    if !fleet.window_read {
        fleet.window_read = join_window(publisher, etcd, &mut client).await;
    }
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let watched = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client.watch(format!("{}members/", etcd.prefix), Some(options)),
    )
    .await;
    let mut stream = match watched {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Ended::Lost(e.to_string()),
        Err(_) => return Ended::Lost("watch timed out".into()),
    };
    loop {
        let deadline = members.next_deadline(etcd.member_grace);
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            message = stream.message() => {
                if let Err(ended) = take(message, members, etcd) {
                    return ended;
                }
                // Whatever else etcd has sent by now goes in the same
                // change (many members put at once: one publish).
                loop {
                    let more = tokio::time::timeout(COALESCE, stream.message()).await;
                    let Ok(message) = more else { break };
                    if let Err(ended) = take(message, members, etcd) {
                        apply(sidecar, members, fleet, &mut client).await;
                        return ended;
                    }
                }
                apply(sidecar, members, fleet, &mut client).await;
            }
            () = sleep => {
                let answers = |name: &str| answers(publisher, name);
                if members.expire(Instant::now(), etcd.member_grace, &answers) {
                    apply(sidecar, members, fleet, &mut client).await;
                } else {
                    record(publisher, members, fleet, applied);
                }
            }
            () = tokio::time::sleep(fleet.pending.as_ref().map_or(fleet::POLL, Pending::poll)), if fleet.pending.is_some() => {
                gate(sidecar, members, fleet, &mut client).await;
            }
            () = lease.changed.notified() => {
                if lease.fenced() {
                    return Ended::CutOff;
                }
            }
            () = shutdown.cancelled() => return Ended::Shutdown,
        }
    }
}

impl Fleet {
    /// This sidecar's part in the fleet at start: the revision it applied,
    /// and the change the fleet had staged when it started (`staged`: the
    /// revision in force and its servers, from `<prefix>staged`), staged
    /// here too; said at once: no request was planned before it.
    fn at_start(
        publisher: &Publisher,
        etcd: &EtcdSource,
        members: &Members,
        file: &[ServerConfig],
        staged: Option<(i64, Vec<ServerConfig>)>,
    ) -> Fleet {
        let mut fleet = Fleet {
            me: format!("{}proxies/{}", etcd.prefix, proxy_id()),
            applied: members.revision,
            pending: None,
            window_read: false,
        };
        if let Some((applied, in_force)) = staged {
            let target = merged(file, &members.servers(file));
            let version = publisher.shared().load().version;
            let mut pending = Pending::new(
                members.revision,
                target,
                in_force,
                None,
                version,
                Duration::ZERO,
            );
            pending.drain(0, Instant::now());
            fleet.applied = applied;
            fleet.pending = Some(pending);
        }
        fleet
    }
}

/// Takes one watch message into `members`.
fn take(
    message: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    members: &mut Members,
    etcd: &EtcdSource,
) -> Result<(), Ended> {
    let response = match message {
        Ok(Some(response)) => response,
        Ok(None) => return Err(Ended::Lost("the watch ended".into())),
        Err(e) => return Err(Ended::Lost(e.to_string())),
    };
    if response.compact_revision() > 0 {
        return Err(Ended::Compacted);
    }
    if response.canceled() {
        return Err(Ended::Lost(format!(
            "the watch was canceled: {}",
            response.cancel_reason()
        )));
    }
    let now = Instant::now();
    for event in response.events() {
        let Some(kv) = event.kv() else { continue };
        let key = String::from_utf8_lossy(kv.key());
        match event.event_type() {
            EventType::Put => members.put(&etcd.prefix, &key, kv.value()),
            EventType::Delete => members.delete(&etcd.prefix, &key, now, etcd.member_grace),
        }
        // A put or a deletion of a member key is a change of the membership
        // at its revision (writes elsewhere, as proxies/, do not count).
        members.revision = members.revision.max(kv.mod_revision());
    }
    Ok(())
}

/// Whether memring's health checks reach server `name` (it is not DEAD).
fn answers(publisher: &Publisher, name: &str) -> bool {
    publisher
        .shared()
        .load()
        .backends
        .iter()
        .any(|b| b.name() == name && b.state() != HealthState::Dead)
}

/// The servers of the config in force that the file lists (not etcd).
fn file_servers(publisher: &Publisher) -> Vec<ServerConfig> {
    let store = publisher.store_servers();
    publisher
        .shared()
        .load()
        .config
        .servers
        .iter()
        .filter(|s| !store.iter().any(|m| m.name == s.name))
        .cloned()
        .collect()
}

/// Publishes the members' servers beside the file's, if they changed, and
/// records the revision applied. A change that moves reads, while other
/// sidecars have not staged it yet, is staged instead (see
/// `control/fleet.rs`): [`gate`] switches to it once they have.
async fn apply(sidecar: &Sidecar<'_>, members: &Members, fleet: &mut Fleet, client: &mut Client) {
    let Sidecar {
        publisher,
        etcd,
        applied,
        ..
    } = *sidecar;
    let config = publisher.shared().load().config.clone();
    let file = file_servers(publisher);
    let target = merged(&file, &members.servers(&file));
    if fleet.pending.as_ref().is_some_and(|p| p.target == target) {
        save_cache(&etcd.cache_file, members);
        return record(publisher, members, fleet, applied);
    }
    let mut in_force = match &fleet.pending {
        Some(p) => p.in_force.clone(),
        None => config.servers.clone(),
    };
    let mut since = None;
    if !etcd.fleet_switch.is_zero() && fleet::gated(&in_force, &target) {
        if let Some(p) = fleet.pending.take() {
            // Another change before this sidecar switched to the one it
            // staged: if every sidecar had staged that one, some may read
            // its ring already, so this one switches to it first.
            let every = p.said()
                && peers(client, etcd).await.is_ok_and(|read| {
                    fleet::lagging(&read, &fleet.me, p.revision, p.digest).is_empty()
                });
            if every {
                switch(publisher, client, etcd, fleet, p, "every sidecar staged it").await;
                in_force = publisher.shared().load().config.servers.clone();
            } else {
                since = Some(p.since);
            }
        }
    }
    // The live sidecars that neither staged nor applied it (`None`: etcd
    // cannot say). None at all: nobody reads the ring in force without
    // writing the new one, so this sidecar switches at once.
    let mut waiting = Some(0);
    // Another sidecar reads from the new servers already.
    let mut in_service = false;
    // The store revision at which the others were read (see `put_staged`).
    let mut seen = members.revision;
    if !etcd.fleet_switch.is_zero() && fleet::gated(&in_force, &target) {
        waiting = match peers_at(client, etcd).await {
            Ok((at, read)) => {
                seen = at;
                let digest = fleet::servers_digest(&target);
                in_service = fleet::read_elsewhere(&read, &fleet.me, digest);
                Some(fleet::lagging(&read, &fleet.me, members.revision, digest).len())
            }
            Err(e) => {
                tracing::debug!("etcd: the sidecars cannot be read ({e}): staging");
                None
            }
        };
    }
    if waiting != Some(0) {
        let staged = fleet::staged_servers(&in_force, &target);
        let from_store: Vec<ServerConfig> = staged
            .iter()
            .filter(|s| !file.iter().any(|f| f.name == s.name))
            .cloned()
            .collect();
        // Servers that join are flushed now, before they take writes.
        publish(
            publisher,
            client,
            etcd,
            &target,
            staged,
            from_store,
            members.revision,
        )
        .await;
        let staged_version = publisher.shared().load().version;
        let mut pending = Pending::new(
            members.revision,
            target,
            in_force,
            since,
            staged_version,
            config.request_timeout,
        );
        pending.drain(publisher.in_flight_before(staged_version), Instant::now());
        tracing::info!(
            "etcd revision {}: staged; reads stay on the ring in force, writes also reach the new owners, until every live sidecar staged it (at most fleet_switch_ms = {} ms)",
            pending.revision,
            etcd.fleet_switch.as_millis()
        );
        pending.waiting = waiting.unwrap_or(0);
        // Before this sidecar says it staged (its registration), so that a
        // sidecar that starts while the fleet waits starts on this ring.
        let record = fleet::StagedRecord::of(&pending, fleet.applied);
        put_staged(client, etcd, &record, seen).await;
        fleet.pending = Some(pending);
    } else {
        let from_store = members.servers(&file);
        let servers = merged(&file, &from_store);
        // A sidecar that comes back after the fleet switched (held back, cut
        // off) flushes no newcomer: the others flushed it when they staged
        // it and have written it since.
        let flush_for = if in_service {
            &config.servers
        } else {
            &servers
        };
        if servers != config.servers {
            publish(
                publisher,
                client,
                etcd,
                flush_for,
                servers.clone(),
                from_store,
                members.revision,
            )
            .await;
        }
        fleet.pending = None;
        fleet.applied = members.revision;
    }
    save_cache(&etcd.cache_file, members);
    record(publisher, members, fleet, applied);
}

/// Publishes `servers` (`from_store`: those etcd adds to the file's),
/// flushing first the servers of `target` that join the ring in force
/// unknown to it; a warming (JOINING) one is not flushed: what
/// it holds is written to it for the keys it will own, nor is one that
/// warmed (or was staged) and now turns ACTIVE.
async fn publish(
    publisher: &Publisher,
    client: &mut Client,
    etcd: &EtcdSource,
    target: &[ServerConfig],
    servers: Vec<ServerConfig>,
    from_store: Vec<ServerConfig>,
    revision: i64,
) {
    let topology = publisher.shared().load_full();
    let config = &topology.config;
    let mut joining = config.with_servers(target.to_vec());
    let warmed = |name: &str| config.servers.iter().any(|c| c.name == name && c.warming);
    joining.servers.retain(|s| !s.warming && !warmed(&s.name));
    crate::control::newcomers::flush_newcomers_off_thread(topology, joining).await;
    // A reload during the flush may have changed the file's servers: they
    // are taken as they are now.
    let latest = publisher.shared().load().config.clone();
    let file = file_servers(publisher);
    let mut servers = servers;
    servers.retain(|s| {
        file.iter().any(|f| f.name == s.name) || from_store.iter().any(|m| m.name == s.name)
    });
    for f in &file {
        if !servers.iter().any(|s| s.name == f.name) {
            servers.insert(0, f.clone());
        }
    }
    match publisher.apply_config(latest.with_servers(servers)) {
        Ok(published) => {
            publisher.set_store_servers(from_store);
            tracing::info!(
                "ring v{}: {} (etcd revision {revision})",
                published.version,
                published.change,
            );
            if published.change.handoff.is_some() {
                share_window(publisher, etcd, client).await;
            }
        }
        Err(shortage) => {
            tracing::error!(
                "etcd: members of revision {revision} refused: {shortage}; still serving the previous list",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/m/";

    fn rec(addr: &str, state: &str) -> Vec<u8> {
        format!(r#"{{"addr":"{addr}","state":"{state}"}}"#).into_bytes()
    }

    #[test]
    fn states_make_the_server_list() {
        let mut m = Members::default();
        m.put(P, "/m/members/a", &rec("127.0.0.1:1", "ACTIVE"));
        m.put(P, "/m/members/b", &rec("127.0.0.1:2", "JOINING"));
        m.put(P, "/m/members/c", &rec("127.0.0.1:3", "LEAVING"));
        let servers = m.servers(&[]);
        let names: Vec<_> = servers
            .iter()
            .map(|s| (s.name.as_str(), s.warming))
            .collect();
        assert_eq!(names, vec![("a", false), ("b", true)]);
    }

    #[test]
    fn a_record_put_again_dates_a_full_read_as_the_watch_dates_it() {
        let (now, grace) = (Instant::now(), Duration::from_secs(1));
        let a = rec("127.0.0.1:1", "ACTIVE");
        let mut m = Members::default();
        m.replace(P, 5, &[("/m/members/a".into(), a.clone(), 5)], now, grace);
        assert_eq!(m.revision, 5);
        // The same record again at 8 (a sidecar that watched saw event 8).
        m.replace(P, 9, &[("/m/members/a".into(), a, 8)], now, grace);
        assert_eq!(m.revision, 8);
    }

    #[test]
    fn bad_records_keep_what_the_key_had() {
        let mut m = Members::default();
        m.put(P, "/m/members/a", &rec("127.0.0.1:1", "ACTIVE"));
        for bad in [
            &b"nope"[..],
            br#"{"state":"ACTIVE"}"#,
            &rec("127.0.0.1:1", "PENDING"),
            &rec("no port", "ACTIVE"),
        ] {
            m.put(P, "/m/members/a", bad);
            m.put(P, "/m/members/x", bad);
        }
        assert_eq!(m.servers(&[]).len(), 1);
        assert_eq!(m.servers(&[])[0].addr, "127.0.0.1:1");
    }

    #[test]
    fn a_vanished_member_is_suspect_for_its_grace_then_damped_once() {
        let grace = Duration::from_millis(100);
        let t0 = Instant::now();
        let mut m = Members::default();
        m.put(P, "/m/members/a", &rec("127.0.0.1:1", "ACTIVE"));
        m.delete(P, "/m/members/a", t0, grace);
        assert_eq!(m.states()["a"], "SUSPECT");
        assert!(!m.expire(t0 + grace / 2, grace, &|_| false));
        assert_eq!(m.servers(&[]).len(), 1);
        // Answers: one more grace.
        assert!(!m.expire(t0 + grace, grace, &|_| true));
        assert_eq!(m.servers(&[]).len(), 1);
        assert!(m.expire(t0 + grace * 2, grace, &|_| true));
        assert!(m.servers(&[]).is_empty());
    }

    #[test]
    fn a_member_on_another_servers_addr_is_left_out() {
        let mut m = Members::default();
        m.put(P, "/m/members/a", &rec("127.0.0.1:1", "ACTIVE"));
        m.put(P, "/m/members/b", &rec("127.0.0.1:1", "ACTIVE"));
        m.put(P, "/m/members/c", &rec("127.0.0.1:2", "ACTIVE"));
        let names = |servers: Vec<ServerConfig>| -> Vec<String> {
            servers.into_iter().map(|s| s.name).collect()
        };
        assert_eq!(names(m.servers(&[])), ["a", "c"]);
        let file = ServerConfig::plain("f", "127.0.0.1:2");
        assert_eq!(names(m.servers(&[file])), ["a"]);
    }

    #[test]
    fn a_leaving_member_goes_at_once_when_deleted() {
        let mut m = Members::default();
        m.put(P, "/m/members/a", &rec("127.0.0.1:1", "LEAVING"));
        m.delete(P, "/m/members/a", Instant::now(), Duration::from_secs(10));
        assert!(m.entries.is_empty());
    }

    /// A one-node etcd (`etcd` on free loopback ports, a temporary data
    /// dir), killed by PID and its dir removed on drop.
    struct RealEtcd {
        child: std::process::Child,
        dir: std::path::PathBuf,
        port: u16,
    }

    impl RealEtcd {
        fn start() -> RealEtcd {
            let free = || {
                let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
                socket.local_addr().expect("an addr").port()
            };
            let (port, peer) = (free(), free());
            let dir =
                std::env::temp_dir().join(format!("memring-staged-{}-{port}", std::process::id()));
            let client = format!("http://127.0.0.1:{port}");
            let peer = format!("http://127.0.0.1:{peer}");
            let child = std::process::Command::new("etcd")
                .args(["--name", "t", "--data-dir"])
                .arg(dir.join("data"))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &format!("t={peer}")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("etcd must be installed (scripts/test installs etcd-server)");
            RealEtcd { child, dir, port }
        }
    }

    impl Drop for RealEtcd {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn a_staged_record_put_after_a_sidecar_switched_is_refused() {
        let etcd = RealEtcd::start();
        let text = format!(
            "listen = \"127.0.0.1:0\"\n[discovery]\netcd_endpoints = [\"http://127.0.0.1:{}\"]\netcd_prefix = \"/s/\"\n",
            etcd.port
        );
        let config = Config::parse(&text, "t.toml").expect("a config");
        let source = config.discovery.etcd.clone().expect("etcd");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut client = loop {
                if let Ok(mut client) = connect(&source).await {
                    if client.get("/", None).await.is_ok() {
                        break client;
                    }
                }
                assert!(Instant::now() < deadline, "etcd did not answer");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let server =
                |name: &str| ServerConfig::plain(name, format!("127.0.0.1:{}", 1000 + name.len()));
            let pending = |target: Vec<ServerConfig>| {
                Pending::new(9, target, vec![server("a")], None, 1, Duration::ZERO)
            };
            let change = pending(vec![server("a"), server("bb")]);
            let record = fleet::StagedRecord::of(&change, 8);
            let now = |client: &mut Client| {
                let mut client = client.clone();
                async move {
                    let got = client.get("/", None).await.expect("a read");
                    got.header().expect("a header").revision()
                }
            };
            let staged = |client: &mut Client| {
                let mut client = client.clone();
                let key = staged_key(&source);
                async move { client.get(key, None).await.expect("a read").kvs().len() }
            };
            // Two sidecars read the others (one lagging) at `seen`.
            let seen = now(&mut client).await;
            assert!(put_staged(&mut client, &source, &record, seen).await);
            assert_eq!(staged(&mut client).await, 1);
            // One switches: the record goes, the switch is marked.
            drop_staged(&mut client, &source, change.digest, change.revision).await;
            assert_eq!(staged(&mut client).await, 0);
            // The other's put, decided at `seen`, lands late: refused.
            assert!(!put_staged(&mut client, &source, &record, seen).await);
            assert_eq!(staged(&mut client).await, 0, "no stale record");
            // A later change, staged after the switch, is recorded.
            let later = pending(vec![server("a"), server("ccc")]);
            let later_record = fleet::StagedRecord::of(&later, 9);
            let seen = now(&mut client).await;
            assert!(put_staged(&mut client, &source, &later_record, seen).await);
            // A switch to the earlier change leaves the later one's record.
            drop_staged(&mut client, &source, change.digest, change.revision).await;
            assert_eq!(staged(&mut client).await, 1, "another change's record");
            drop_staged(&mut client, &source, later.digest, later.revision).await;
            assert_eq!(staged(&mut client).await, 0);
        });
    }

    #[test]
    fn a_full_read_deletes_what_it_does_not_list() {
        let mut m = Members::default();
        m.put(P, "/m/members/a", &rec("127.0.0.1:1", "LEAVING"));
        m.put(P, "/m/members/b", &rec("127.0.0.1:2", "ACTIVE"));
        let read = [("/m/members/c".to_string(), rec("127.0.0.1:3", "ACTIVE"), 7)];
        let grace = Duration::from_secs(10);
        m.replace(P, 9, &read, Instant::now(), grace);
        assert_eq!(
            m.states().into_iter().collect::<Vec<_>>(),
            vec![("b".to_string(), "SUSPECT"), ("c".to_string(), "ACTIVE")]
        );
        assert_eq!(m.revision, 9, "a member went: dated by the read");
        m.replace(P, 12, &read, Instant::now(), grace);
        assert_eq!(m.revision, 9, "nothing changed: the revision stays");
    }
}
