//! A sidecar cut off from etcd past its registration's lease
//! (`etcd_cut_off`): once no keep-alive has been answered for the lease's
//! TTL, counted from the moment the last answered one was *sent* (so this
//! sidecar knows no later than etcd could have expired the lease), the
//! other sidecars may no longer wait for it and may move reads for a change
//! it has not seen. With `"miss"` the pool's requests are fenced off
//! (`Topology::cut_off`: retrievals miss, writes are refused) until the
//! registration is written again and, after that, every member is read
//! again and applied; with `"serve"` it only says so (`fleet_cut_off`).
//!
//! Nothing here is on the request path: the fence is one flag the
//! publisher shares with every topology.

use std::sync::Mutex;

use tokio::sync::Notify;

use super::*;
use crate::config::CutOff;

/// What the registration knows of its lease, and whether it is cut off.
#[derive(Debug)]
struct State {
    /// When the keep-alive (or the grant) etcd last answered was sent, and
    /// the lease's TTL it gave.
    acked: (Instant, Duration),
    /// When the registration was last written.
    put: Option<Instant>,
    /// Cut off since then.
    cut: Option<Instant>,
}

/// Shared by the registration (which reports answers and writes), the
/// watchdog (which says when the lease ran out) and the watch (which ends
/// the cut once it caught up).
#[derive(Debug)]
pub(super) struct Lease {
    mode: CutOff,
    state: Mutex<State>,
    /// Wakes the watchdog: an answer came, or the cut ended.
    wake: Notify,
    /// Wakes the watch: cut off, or registered again.
    pub(super) changed: Notify,
}

impl Lease {
    /// At start, as though a lease of `ttl` had been answered now: a
    /// sidecar that cannot register within one lease is cut off too (the
    /// fleet does not know it).
    pub(super) fn new(mode: CutOff, ttl: Duration) -> Lease {
        Lease {
            mode,
            state: Mutex::new(State {
                acked: (Instant::now(), ttl),
                put: None,
                cut: None,
            }),
            wake: Notify::new(),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// etcd answered a keep-alive (or a grant) sent at `sent` with `ttl`.
    pub(super) fn answered(&self, sent: Instant, ttl: Duration) {
        let mut state = self.state();
        if sent >= state.acked.0 {
            state.acked = (sent, ttl);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The registration was written now. With `"serve"` a cut ends here.
    pub(super) fn registered(&self, publisher: &Publisher) {
        let now = Instant::now();
        let mut state = self.state();
        state.put = Some(now);
        let ends = self.mode == CutOff::Serve && state.cut.take().is_some();
        drop(state);
        if ends {
            tracing::info!("etcd: registered again: no longer cut off");
            publisher.stats().fleet_cut_off(false);
            self.wake.notify_one();
        }
        self.changed.notify_one();
    }

    /// Whether this sidecar is cut off and fences its requests (`"miss"`).
    pub(super) fn fenced(&self) -> bool {
        self.mode == CutOff::Miss && self.state().cut.is_some()
    }

    /// Every member was read again from `read_at` on and applied: a cut
    /// (`"miss"`) ends if the registration was written again after it
    /// began and before that read. Whether requests are served.
    pub(super) fn caught_up(&self, publisher: &Publisher, read_at: Instant, revision: i64) -> bool {
        let mut state = self.state();
        let Some(cut) = state.cut else {
            return true;
        };
        if self.mode != CutOff::Miss {
            return true;
        }
        if !registered_between(state.put, cut, read_at) {
            return false;
        }
        state.cut = None;
        drop(state);
        publisher.fence(false);
        publisher.stats().fleet_cut_off(false);
        tracing::info!(
            "etcd: registered again and caught up (revision {revision}): serving again after {} ms cut off",
            cut.elapsed().as_millis()
        );
        self.wake.notify_one();
        true
    }
}

/// Watches the lease until `shutdown`: once the last answered keep-alive's
/// send time plus the lease's TTL is past, this sidecar is cut off (one log
/// line, `fleet_cut_off 1`, and with `"miss"` its requests fenced and the
/// watch told to read everything again).
pub(super) async fn watchdog(
    lease: Arc<Lease>,
    publisher: Arc<Publisher>,
    shutdown: CancellationToken,
) {
    loop {
        let deadline = {
            let state = lease.state();
            state.cut.is_none().then(|| state.acked.0 + state.acked.1)
        };
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            () = lease.wake.notified() => continue,
            () = shutdown.cancelled() => return,
        }
        let mut state = lease.state();
        let (sent, ttl) = state.acked;
        if state.cut.is_some() || sent.elapsed() < ttl {
            continue;
        }
        state.cut = Some(Instant::now());
        drop(state);
        publisher.stats().fleet_cut_off(true);
        match lease.mode {
            CutOff::Miss => {
                publisher.fence(true);
                tracing::warn!(
                    "etcd: no keep-alive answered for the registration's lease ({} s): the other sidecars may no longer wait for this one, so it is cut off: every key misses and writes are refused (etcd_cut_off = \"miss\") until it is registered again and has read every member",
                    ttl.as_secs()
                );
            }
            CutOff::Serve => tracing::warn!(
                "etcd: no keep-alive answered for the registration's lease ({} s): the other sidecars may no longer wait for this one; it serves the membership it has (etcd_cut_off = \"serve\"): a read through another sidecar may return a value older than a write through this one for keys a change made meanwhile moves",
                ttl.as_secs()
            ),
        }
        lease.changed.notify_one();
    }
}

/// Whether a registration written at `put` ends a cut that began at `cut`
/// for a full read from `read_at` on: written after the cut began (etcd
/// may have expired the one before) and before the read (a change made
/// before the registration is in the read; one made after waits for it).
fn registered_between(put: Option<Instant>, cut: Instant, read_at: Instant) -> bool {
    put.is_some_and(|put| put >= cut && put <= read_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_ends_with_a_registration_between_the_cut_and_a_full_read() {
        let cut = Instant::now();
        let at = |ms: u64| cut + Duration::from_millis(ms);
        assert!(!registered_between(None, cut, at(10)));
        assert!(
            !registered_between(Some(cut - Duration::from_millis(1)), cut, at(10)),
            "before the cut"
        );
        assert!(
            !registered_between(Some(at(5)), cut, at(1)),
            "read before it registered"
        );
        assert!(registered_between(Some(at(5)), cut, at(10)));
        let serve = Lease::new(CutOff::Serve, Duration::from_secs(10));
        serve.state().cut = Some(cut);
        assert!(!serve.fenced(), "\"serve\" never fences");
        let miss = Lease::new(CutOff::Miss, Duration::from_secs(10));
        assert!(!miss.fenced());
        miss.state().cut = Some(cut);
        assert!(miss.fenced());
    }
}
