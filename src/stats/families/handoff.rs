//! The figures of the writes and reads that take more than one server: the
//! replica writes still running after a quorum answered, and the hand-off's
//! read-through, copies, sweeps and state file (see docs/handoff.md).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::counter;
use crate::stats::Stats;

/// Hand-off: keys asked of their previous owner, values found there, and
/// copies to new owners stored, skipped (newer value there), failed.
#[derive(Debug)]
pub(in crate::stats) struct HandoffFamilies {
    replica_background: Counter,
    reads: Counter,
    hits: Counter,
    copies: Counter,
    copies_skipped: Counter,
    copy_failures: Counter,
    copies_checked: Counter,
    copies_taken_back: Counter,
    leftovers_deleted: Counter,
    sweeps: Counter,
    windows_resumed: Counter,
    state_errors: Counter,
    zone_local: Counter,
    zone_cross: Counter,
    zone_write_backs: Counter,
}

impl HandoffFamilies {
    pub(in crate::stats) fn register(registry: &mut Registry) -> HandoffFamilies {
        // Registered in this order, which is the order /metrics lists them in.
        let mut register = |name, help| counter(registry, name, help);
        HandoffFamilies {
            replica_background: register(
                "replica_writes_background",
                "Replica writes still running when the client was answered on a quorum",
            ),
            reads: register(
                "handoff_read_through",
                "Keys read from their previous owner after a miss on the new one (hand-off)",
            ),
            hits: register(
                "handoff_read_through_hits",
                "Read-through keys found on their previous owner",
            ),
            copies: register(
                "handoff_copies",
                "Values copied to their new owner during a hand-off window",
            ),
            copies_skipped: register(
                "handoff_copies_skipped",
                "Copies not stored because the new owner already had a value, or a write reached their lease first",
            ),
            copy_failures: register(
                "handoff_copy_failures",
                "Copies to a new owner that failed",
            ),
            copies_checked: register(
                "handoff_copies_checked",
                "Read-through copies whose lease was placed, then replaced by the copy or taken back",
            ),
            copies_taken_back: register(
                "handoff_copies_taken_back",
                "Leases and copies deleted again: the key changed where it was copied from",
            ),
            leftovers_deleted: register(
                "handoff_leftovers_deleted",
                "Keys deleted from servers that no longer own them, as a hand-off window closes",
            ),
            sweeps: register(
                "handoff_sweeps",
                "Servers swept of keys they no longer own as a hand-off window closes",
            ),
            windows_resumed: register(
                "handoff_windows_resumed",
                "Hand-off windows taken up again from the state file at start",
            ),
            state_errors: register(
                "handoff_state_errors",
                "Hand-off state files that could not be read at start or written since",
            ),
            zone_local: register(
                "zone_reads_local",
                "Hits served by the key's replica in this sidecar's zone",
            ),
            zone_cross: register(
                "zone_reads_cross_zone",
                "Hits served by a replica other than the key's local one (another zone's)",
            ),
            zone_write_backs: register(
                "zone_write_backs",
                "Hits found in another zone and copied back to the local replica",
            ),
        }
    }
}

impl Stats {
    /// Keys read through from their previous owner, and hits there.
    pub fn read_through(&self, reads: usize, hits: usize) {
        if reads > 0 {
            self.handoff.reads.inc_by(reads as u64);
            self.handoff.hits.inc_by(hits as u64);
        }
    }

    /// With zones: hits served locally and from other zones, and hits
    /// written back to the local replica.
    #[inline]
    pub fn zone_reads(&self, (local, cross): (usize, usize), written_back: usize) {
        super::add_some(&self.handoff.zone_local, local);
        super::add_some(&self.handoff.zone_cross, cross);
        super::add_some(&self.handoff.zone_write_backs, written_back);
    }

    /// Hand-off copies: stored, skipped, failed.
    pub fn copies(&self, made: usize, skipped: usize, failed: usize) {
        if made + skipped + failed > 0 {
            self.handoff.copies.inc_by(made as u64);
            self.handoff.copies_skipped.inc_by(skipped as u64);
            self.handoff.copy_failures.inc_by(failed as u64);
        }
    }

    /// A read-through copy's lease, or a command's copy, taken back: a write
    /// changed the key where it was copied from.
    pub fn copy_taken_back(&self) {
        self.handoff.copies_taken_back.inc();
    }

    /// A read-through copy whose lease was placed, then replaced by the
    /// copy or taken back.
    pub fn copy_checked(&self) {
        self.handoff.copies_checked.inc();
    }

    /// One server swept of `deleted` keys it no longer owns.
    pub fn swept(&self, deleted: u64) {
        self.handoff.sweeps.inc();
        self.handoff.leftovers_deleted.inc_by(deleted);
    }

    /// A pool's hand-off window taken up again from the state file.
    pub fn window_resumed(&self) {
        self.handoff.windows_resumed.inc();
    }

    /// The hand-off state file could not be read at start, or written.
    pub fn state_error(&self) {
        self.handoff.state_errors.inc();
    }

    /// Hand-off counters for `stats`: read-through keys, hits there, copies
    /// made, skipped and failed, servers swept and leftovers deleted,
    /// windows resumed at start and state file errors.
    pub fn handoff(&self) -> [(&'static str, u64); 14] {
        let h = &self.handoff;
        [
            ("handoff_read_through", h.reads.get()),
            ("handoff_read_through_hits", h.hits.get()),
            ("handoff_copies", h.copies.get()),
            ("handoff_copies_skipped", h.copies_skipped.get()),
            ("handoff_copy_failures", h.copy_failures.get()),
            ("handoff_copies_checked", h.copies_checked.get()),
            ("handoff_copies_taken_back", h.copies_taken_back.get()),
            ("handoff_sweeps", h.sweeps.get()),
            ("handoff_leftovers_deleted", h.leftovers_deleted.get()),
            ("handoff_windows_resumed", h.windows_resumed.get()),
            ("handoff_state_errors", h.state_errors.get()),
            ("zone_reads_local", h.zone_local.get()),
            ("zone_reads_cross_zone", h.zone_cross.get()),
            ("zone_write_backs", h.zone_write_backs.get()),
        ]
    }

    /// Replica writes left to finish after a quorum answered.
    pub fn replica_background(&self, outstanding: usize) {
        self.handoff.replica_background.inc_by(outstanding as u64);
    }
}
