//! Write versions: what keeps reads after writes correct (the rules are in
//! the module doc of `hotkeys`, in mod.rs). A write is pending on its keys'
//! stripes from plan to reply and moves their versions; a shortcut checks
//! them before it answers. No I/O, no clock.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;
use smallvec::SmallVec;

use super::{HotShared, Local};
use crate::backend::slot::{Slot, Watch};
use crate::error::BackendError;
use crate::protocol::outcome::Outcome;
use crate::protocol::Command;

/// Stripes of write versions: a power of two. Keys sharing a stripe only
/// share invalidations, never values.
pub(super) const STRIPES: usize = 1 << 14;

#[derive(Debug, Default)]
pub(super) struct Stripe {
    /// Moves when a write to one of the stripe's keys is planned and when it
    /// completes.
    pub(super) version: AtomicU64,
    /// Writes planned and not yet complete.
    pub(super) pending: AtomicU32,
}

/// Key hashes a write touches, with the keys when there is a near cache to
/// drop them from.
pub(super) type WrittenKeys = SmallVec<[(u64, Option<Box<[u8]>>); 1]>;

impl HotShared {
    pub(super) fn stripe(&self, hash: u64) -> &Stripe {
        &self.stripes[hash as usize & (STRIPES - 1)]
    }

    /// The stripe's version, and whether no write to it is pending. Pending
    /// is read first: a write completes by moving the version and then
    /// leaving pending, so a reader that sees it gone sees the new version.
    pub(super) fn settled(&self, hash: u64) -> (u64, bool) {
        let stripe = self.stripe(hash);
        let quiet =
            stripe.pending.load(Ordering::SeqCst) == 0 && self.flushing.load(Ordering::SeqCst) == 0;
        (stripe.version.load(Ordering::SeqCst), quiet)
    }

    /// Moves the versions of `hashes` (or of every stripe, for `flush_all`)
    /// and drops their near-cache entries.
    fn bump(&self, target: &Target) -> u64 {
        let version = self.bump_versions(target);
        let live = self.live.load();
        match (target, &live.cache) {
            (_, None) => {}
            (Target::All, Some(cache)) => cache.invalidate_all(),
            (Target::Keys(keys), Some(cache)) => {
                for key in keys.iter().filter_map(|(_, key)| key.as_ref()) {
                    cache.invalidate(&key[..]);
                }
            }
        }
        version
    }

    /// Moves the versions of `hashes`, or of every stripe for `flush_all`;
    /// returns the last stripe's new version.
    fn bump_versions(&self, target: &Target) -> u64 {
        let mut version = 0;
        match target {
            Target::All => {
                for stripe in self.stripes.iter() {
                    version = stripe.version.fetch_add(1, Ordering::SeqCst) + 1;
                }
            }
            Target::Keys(keys) => {
                for (hash, _) in keys {
                    version = self.stripe(*hash).version.fetch_add(1, Ordering::SeqCst) + 1;
                }
            }
        }
        version
    }
}

/// What a write touches.
#[derive(Debug)]
pub(super) enum Target {
    /// `flush_all`.
    All,
    /// Key hashes, with the keys when there is a near cache to drop them from.
    Keys(WrittenKeys),
}

/// One write through this memring, from when it is planned until it is
/// complete: dropped when its entry is answered and every reply slot it
/// watches is done (see the module doc of `hotkeys`, in mod.rs).
#[derive(Debug)]
pub(crate) struct WriteGuard {
    /// The worker's handle: cloning it moves no counter other cores share.
    shared: Local,
    pub(super) target: Target,
    /// A hot key's new value, for the near cache if the write is stored.
    pub(super) fill: Option<WriteFill>,
    /// The stripe version this write last moved to (single-key writes).
    last_version: Cell<u64>,
    /// The server answered `STORED`.
    stored: Cell<bool>,
    /// Its end has been accounted (see [`WriteGuard::end`]).
    ended: bool,
}

/// What a storage command leaves in the near cache: the `VALUE` block a
/// `get` of its key would now be answered with.
#[derive(Debug)]
pub(super) struct WriteFill {
    pub(super) key: Box<[u8]>,
    pub(super) hash: u64,
    pub(super) block: Bytes,
}

impl WriteGuard {
    /// A write begins: it is pending on its keys (or on everything, for
    /// `flush_all`) until it ends. Made in `kept` (an ended guard nothing
    /// else holds) when there is one.
    pub(super) fn begin_in(
        kept: Option<Rc<WriteGuard>>,
        shared: &Local,
        target: Target,
        fill: Option<WriteFill>,
    ) -> Rc<WriteGuard> {
        match &target {
            Target::All => {
                shared.flushing.fetch_add(1, Ordering::SeqCst);
            }
            Target::Keys(keys) => {
                for (hash, _) in keys {
                    shared.stripe(*hash).pending.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let last_version = shared.bump(&target);
        let guard = WriteGuard {
            shared: shared.clone(),
            target,
            fill,
            last_version: Cell::new(last_version),
            stored: Cell::new(false),
            ended: false,
        };
        match kept {
            Some(mut kept) => {
                match Rc::get_mut(&mut kept) {
                    Some(slot) => *slot = guard,
                    None => return Rc::new(guard),
                }
                kept
            }
            None => Rc::new(guard),
        }
    }

    /// Accounts the end of this write, once: when its last holder lets go,
    /// or when a finished entry hands it back for reuse.
    pub(super) fn end(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        if self.complete_with_value() {
            return;
        }
        // Version first, then pending: see `HotShared::settled`.
        self.shared.bump(&self.target);
        match &self.target {
            Target::All => {
                self.shared.flushing.fetch_sub(1, Ordering::SeqCst);
            }
            Target::Keys(keys) => {
                for (hash, _) in keys {
                    self.shared
                        .stripe(*hash)
                        .pending
                        .fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// Keeps this write pending until `slot` is done too (for `noreply`
    /// writes, whose entries finish as soon as they are sent).
    pub(crate) fn watch(self: &Rc<Self>, slot: &Slot) {
        slot.watch(self.clone());
    }

    /// The write was queued on a connection: a `get` sent before this
    /// moment may reach the server ahead of it, so none may be joined from
    /// now on (see [`super::HotWorker::before_send`]).
    pub(crate) fn queued(&self) {
        self.last_version
            .set(self.shared.bump_versions(&self.target));
    }

    /// Completes a stored write of a hot key's value and keeps the value in
    /// the near cache, if no other write to its stripe was planned, queued,
    /// completed or pending during this one's life: then memcached now holds
    /// exactly this value. False (and nothing done) otherwise.
    fn complete_with_value(&self) -> bool {
        let (Some(fill), true) = (&self.fill, self.stored.get()) else {
            return false;
        };
        let shared = &self.shared;
        let stripe = shared.stripe(fill.hash);
        let last = self.last_version.get();
        if stripe.pending.load(Ordering::SeqCst) != 1
            || shared.flushing.load(Ordering::SeqCst) != 0
            || stripe
                .version
                .compare_exchange(last, last + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return false;
        }
        // As in `bump`: the old entry goes whatever happens next.
        if let Some(cache) = &shared.live.load().cache {
            cache.invalidate(&fill.key[..]);
        }
        stripe.pending.fetch_sub(1, Ordering::SeqCst);
        // Kept only if still nothing else wrote the stripe.
        shared.fill(&fill.key, fill.hash, last + 1, fill.block.clone());
        true
    }
}

impl Watch for WriteGuard {
    fn done(&self, result: &Result<Outcome, BackendError>) {
        self.stored.set(matches!(result, Ok(Outcome::Stored)));
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.end();
    }
}

/// Commands that change a key (its value or its expiry).
pub(super) fn is_write(command: Command) -> bool {
    command.is_storage()
        || matches!(
            command,
            Command::Delete
                | Command::Incr
                | Command::Decr
                | Command::Touch
                | Command::Gat
                | Command::Gats
                | Command::FlushAll
        )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::HotKeySettings;
    use crate::hotkeys::key_hash;
    use crate::stats::Stats;

    fn begin(shared: &Local, target: Target) -> Rc<WriteGuard> {
        WriteGuard::begin_in(None, shared, target, None)
    }

    #[test]
    fn writes_are_pending_until_complete_and_move_the_version() {
        let stats = Arc::new(Stats::new());
        let shared = Rc::new(HotShared::new(HotKeySettings::default(), 1, stats));
        let hash = key_hash(b"k");
        let (before, quiet) = shared.settled(hash);
        assert!(quiet);
        let guard = begin(&shared, Target::Keys(smallvec::smallvec![(hash, None)]));
        let (during, quiet) = shared.settled(hash);
        assert!(!quiet);
        assert_ne!(during, before);
        drop(guard);
        let (after, quiet) = shared.settled(hash);
        assert!(quiet);
        assert_ne!(after, during);
        let flush = begin(&shared, Target::All);
        assert!(!shared.settled(key_hash(b"other")).1);
        drop(flush);
        assert!(shared.settled(key_hash(b"other")).1);
    }
}
