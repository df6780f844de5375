//! This sidecar among the others: its registration under
//! `<prefix>proxies/`, the gate that waits until every live sidecar staged
//! a change and the switch to it, and the fleet's hand-off window kept
//! under `<prefix>window` for a sidecar that starts mid-change.

use super::*;

/// The key of the fleet's hand-off window.
pub(super) fn window_key(etcd: &EtcdSource) -> String {
    format!("{}window", etcd.prefix)
}

/// Puts the hand-off window just opened under `<prefix>window`, as the
/// state file keeps it: a sidecar that starts or restarts within it, even
/// without a state file of its own, takes it up (see [`join_window`]).
/// Every sidecar that switches writes it; they write the same rings.
pub(super) async fn share_window(publisher: &Publisher, etcd: &EtcdSource, client: &mut Client) {
    let Some(saved) = publisher.shared().load().saved_window() else {
        return;
    };
    let Ok(value) = serde_json::to_string(&saved) else {
        return;
    };
    let put =
        tokio::time::timeout(REQUEST_TIMEOUT, client.put(window_key(etcd), value, None)).await;
    if !matches!(put, Ok(Ok(_))) {
        tracing::warn!(
            "etcd: cannot write the hand-off window to {}: a sidecar that starts within it without a state file will not know it",
            window_key(etcd)
        );
    }
}

/// At start, when no window was resumed from the state file: takes up the
/// fleet's window from `<prefix>window` if it is not over and its ring in
/// force is this sidecar's, so that writes through it delete moved keys on
/// their previous owners and its reads read them through, as the other
/// sidecars do. Whether etcd answered.
pub(super) async fn join_window(
    publisher: &Publisher,
    etcd: &EtcdSource,
    client: &mut Client,
) -> bool {
    let got = tokio::time::timeout(REQUEST_TIMEOUT, client.get(window_key(etcd), None)).await;
    let Ok(Ok(response)) = got else {
        return false;
    };
    let topology = publisher.shared().load_full();
    let Some(kv) = response.kvs().first() else {
        return true;
    };
    if topology.previous.is_some() {
        return true;
    }
    let saved: crate::pools::window_state::SavedWindow = match serde_json::from_slice(kv.value()) {
        Ok(saved) => saved,
        Err(e) => {
            tracing::warn!("etcd: {}: ignored: {e}", window_key(etcd));
            return true;
        }
    };
    if saved.until_unix <= crate::runtime::clock::unix_now() {
        return true;
    }
    let sorted = |mut ring: crate::pools::window_state::SavedRing| {
        ring.servers.sort_by(|a, b| a.name.cmp(&b.name));
        ring
    };
    let ours =
        crate::pools::window_state::SavedRing::of(&topology.config.ring, &topology.ring_servers());
    if sorted(saved.ring.clone()) != sorted(ours) {
        tracing::info!(
            "etcd: the fleet's hand-off window in {} is not over ring in force here: not taken up",
            window_key(etcd)
        );
        return true;
    }
    tracing::info!(
        "etcd: joining the fleet's hand-off window from {} (previous ring of {} servers)",
        window_key(etcd),
        saved.previous.servers.len()
    );
    publisher.resume(&saved);
    true
}

/// Every sidecar's registration under `<prefix>proxies/`: key and value.
pub(super) async fn peers(
    client: &mut Client,
    etcd: &EtcdSource,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    Ok(peers_at(client, etcd).await?.1)
}

/// [`peers`], and the store revision of the read.
pub(super) async fn peers_at(
    client: &mut Client,
    etcd: &EtcdSource,
) -> Result<(i64, Vec<(String, Vec<u8>)>), String> {
    let (at, read) = read_prefix(client, format!("{}proxies/", etcd.prefix)).await?;
    let read = read
        .into_iter()
        .map(|(key, value, _)| (key, value))
        .collect();
    Ok((at, read))
}

/// A change is staged: switches to it once every live sidecar staged it
/// (or applied it), or once `fleet_switch_ms` is over.
pub(super) async fn gate(
    sidecar: &Sidecar<'_>,
    members: &Members,
    fleet: &mut Fleet,
    client: &mut Client,
) {
    let Sidecar {
        publisher, applied, ..
    } = *sidecar;
    record(publisher, members, fleet, applied);
    let Some(pending) = fleet.pending.as_mut() else {
        return;
    };
    if !pending.said() {
        let in_flight = publisher.in_flight_before(pending.staged_version);
        if !pending.drain(in_flight, Instant::now()) {
            return;
        }
        tracing::debug!(
            "etcd revision {}: staged, the requests planned before are over ({} ms after staging)",
            pending.revision,
            pending.since.elapsed().as_millis()
        );
        // Says so in the registration.
        record(publisher, members, fleet, applied);
    }
    check_peers(sidecar, members, fleet, client).await
}

/// Switches to the staged change if every live sidecar staged it, or once
/// `fleet_switch_ms` is over.
async fn check_peers(
    sidecar: &Sidecar<'_>,
    members: &Members,
    fleet: &mut Fleet,
    client: &mut Client,
) {
    let Sidecar {
        publisher,
        etcd,
        applied,
        ..
    } = *sidecar;
    let Some(pending) = fleet.pending.as_mut() else {
        return;
    };
    let waiting = match peers(client, etcd).await {
        Ok(read) => Some(fleet::lagging(
            &read,
            &fleet.me,
            pending.revision,
            pending.digest,
        )),
        Err(e) => {
            tracing::debug!("etcd: the sidecars cannot be read: {e}");
            None
        }
    };
    if let Some(waiting) = &waiting {
        pending.waiting = waiting.len();
        publisher
            .stats()
            .membership_staged(pending.revision, waiting.len());
    }
    let why = if waiting.as_ref().is_some_and(Vec::is_empty) {
        "every live sidecar staged it"
    } else if pending.since.elapsed() >= etcd.fleet_switch
        && !fleet::moves_reads(&pending.in_force, &pending.target)
    {
        // Only a member's JOINING: no read moves, so it is no forced switch
        // of reads; the member takes the writes themselves from now on.
        tracing::warn!(
            "etcd revision {}: the JOINING member{} take{} writes after fleet_switch_ms = {} ms although {} sidecar{} did not stage it ({}): until they apply it, a value written there may be older than a write through them, and reads find it once the member is ACTIVE; no reads move now",
            pending.revision,
            if joining(pending) == 1 { "" } else { "s" },
            if joining(pending) == 1 { "s" } else { "" },
            etcd.fleet_switch.as_millis(),
            pending.waiting,
            if pending.waiting == 1 { "" } else { "s" },
            waiting.map_or_else(|| "etcd cannot say".to_string(), |w| w.join(", "))
        );
        "fleet_switch_ms is over"
    } else if pending.since.elapsed() >= etcd.fleet_switch {
        tracing::warn!(
            "etcd revision {}: switching reads after fleet_switch_ms = {} ms although {} sidecar{} did not stage it ({}): a read through this sidecar may return a value older than a write through them until they apply it",
            pending.revision,
            etcd.fleet_switch.as_millis(),
            pending.waiting,
            if pending.waiting == 1 { "" } else { "s" },
            waiting.map_or_else(|| "etcd cannot say".to_string(), |w| w.join(", "))
        );
        publisher.stats().fleet_switch_forced();
        "fleet_switch_ms is over"
    } else {
        return;
    };
    if let Some(pending) = fleet.pending.take() {
        switch(publisher, client, etcd, fleet, pending, why).await;
    }
    record(publisher, members, fleet, applied);
}

/// Moves reads to the staged change's servers (opening the hand-off window
/// from the ring in force).
pub(super) async fn switch(
    publisher: &Publisher,
    client: &mut Client,
    etcd: &EtcdSource,
    fleet: &mut Fleet,
    pending: Pending,
    why: &str,
) {
    let file = file_servers(publisher);
    let from_store: Vec<ServerConfig> = pending
        .target
        .iter()
        .filter(|s| !file.iter().any(|f| f.name == s.name))
        .cloned()
        .collect();
    if fleet::moves_reads(&pending.in_force, &pending.target) {
        tracing::info!(
            "etcd revision {}: switching reads to it ({why}, {} ms after staging)",
            pending.revision,
            pending.since.elapsed().as_millis()
        );
    } else {
        tracing::info!(
            "etcd revision {}: the JOINING member{} take{} writes from now on, no reads move ({why}, {} ms after staging)",
            pending.revision,
            if joining(&pending) == 1 { "" } else { "s" },
            if joining(&pending) == 1 { "s" } else { "" },
            pending.since.elapsed().as_millis()
        );
    }
    publish(
        publisher,
        client,
        etcd,
        &pending.target,
        pending.target.clone(),
        from_store,
        pending.revision,
    )
    .await;
    fleet.applied = pending.revision;
    drop_staged(client, etcd, pending.digest, pending.revision).await;
}

/// How many servers start warming (JOINING) with `pending`.
fn joining(pending: &Pending) -> usize {
    let new = |t: &&ServerConfig| t.warming && !pending.in_force.iter().any(|s| s.name == t.name);
    pending.target.iter().filter(new).count()
}

/// The revision and states for `stats`, and for the proxy registration.
pub(super) fn record(
    publisher: &Publisher,
    members: &Members,
    fleet: &Fleet,
    applied: &tokio::sync::watch::Sender<Applied>,
) {
    let stats = publisher.stats();
    stats.membership_applied(fleet.applied, members.states());
    let said = fleet.pending.as_ref().filter(|p| p.said());
    let staged = said.map_or(0, |p| p.revision);
    let waiting = fleet.pending.as_ref().map_or(0, |p| p.waiting);
    stats.membership_staged(staged, waiting);
    // The ring digest goes with it: a publish changes it.
    let topology = publisher.shared().load();
    let applied_digest = match &fleet.pending {
        Some(p) => fleet::servers_digest(&p.in_force),
        None => fleet::servers_digest(&topology.config.servers),
    };
    let now = Applied {
        revision: fleet.applied,
        digest: topology.ring_digest,
        staged,
        applied_digest,
        staged_digest: said.map_or(0, |p| p.digest),
    };
    applied.send_if_modified(|was| std::mem::replace(was, now) != now);
}

/// A lease's TTL as etcd gives it, in seconds.
fn ttl(seconds: i64) -> Duration {
    Duration::from_secs(seconds.max(0) as u64)
}

/// This sidecar's id under `<prefix>proxies/`: host name and process id
/// (and a number for a second memring in one process, as tests run them).
pub(super) fn proxy_id() -> String {
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    match nth {
        0 => format!("{host}-{}", std::process::id()),
        n => format!("{host}-{}-{n}", std::process::id()),
    }
}

/// What the registration writes and reports to.
pub(super) struct Registration {
    pub(super) etcd: EtcdSource,
    /// `<prefix>proxies/<id>`.
    pub(super) key: String,
    /// Told of every answered keep-alive and written registration.
    pub(super) lease: Arc<Lease>,
    pub(super) publisher: Arc<Publisher>,
}

/// Keeps `<prefix>proxies/<id>` under a lease until `shutdown`, its value
/// the revision and ring digest applied and the revision of a change
/// staged (`staged`, 0: none), rewritten when they change.
pub(super) async fn register(
    registration: Registration,
    mut applied: tokio::sync::watch::Receiver<Applied>,
    layout: crate::pools::layout::SharedLayout,
    shutdown: CancellationToken,
) {
    let Registration {
        etcd,
        key,
        lease: state,
        publisher,
    } = registration;
    let mut backoff = BACKOFF.0;
    loop {
        let kept = async {
            let mut client = connect(&etcd).await?;
            let sent = Instant::now();
            let granted =
                tokio::time::timeout(REQUEST_TIMEOUT, client.lease_grant(PROXY_LEASE_S, None))
                    .await
                    .map_err(|_| "lease grant timed out".to_string())?
                    .map_err(|e| e.to_string())?;
            let lease = granted.id();
            state.answered(sent, ttl(granted.ttl()));
            let (mut keeper, mut acks) = client
                .lease_keep_alive(lease)
                .await
                .map_err(|e| e.to_string())?;
            loop {
                let now = *applied.borrow_and_update();
                let value = serde_json::json!({
                    "revision": now.revision,
                    "staged": now.staged,
                    "applied_digest": crate::ring::digest::hex(now.applied_digest),
                    "staged_digest": crate::ring::digest::hex(now.staged_digest),
                    "writes": fleet::rings_written(now.applied_digest, now.staged_digest),
                    "ring_digest": crate::ring::digest::hex(layout.load().ring_digest()),
                    "version": crate::VERSION_STRING,
                })
                .to_string();
                tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    client.put(
                        key.as_str(),
                        value,
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                )
                .await
                .map_err(|_| "put timed out".to_string())?
                .map_err(|e| e.to_string())?;
                state.registered(&publisher);
                loop {
                    tokio::select! {
                        changed = applied.changed() => {
                            if changed.is_err() {
                                return Ok::<(), String>(());
                            }
                            break;
                        }
                        () = tokio::time::sleep(Duration::from_secs((PROXY_LEASE_S / 3) as u64)) => {
                            let sent = Instant::now();
                            keeper.keep_alive().await.map_err(|e| e.to_string())?;
                            match tokio::time::timeout(REQUEST_TIMEOUT, acks.message()).await {
                                Ok(Ok(Some(ack))) if ack.ttl() > 0 => state.answered(sent, ttl(ack.ttl())),
                                _ => return Err("the lease was lost".to_string()),
                            }
                        }
                        () = shutdown.cancelled() => {
                            let _ = tokio::time::timeout(REQUEST_TIMEOUT, client.lease_revoke(lease)).await;
                            return Ok(());
                        }
                    }
                }
            }
        };
        match kept.await {
            Ok(()) => return,
            Err(e) => tracing::debug!("etcd: {key}: {e}; registering again"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}
