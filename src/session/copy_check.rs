//! Read-through copies, made through a lease (see `handoff::ReadCopy`). The
//! lease is sent at once, ahead of the client's later requests on the same
//! connection; what follows its reply runs on its own, and no client waits
//! for it: the source is read again, and the copy replaces the lease only if
//! the value is still there; otherwise the lease is taken back. Only the
//! client's later writes of moved keys wait (see [`CopiesUnderWay`]). A
//! copy under way counts in flight on its request's topology.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::slot::{Got, Slot};
use crate::plan::handoff::{
    copy_outcome, fill_outcome, landed_cas, meta_expect, CopyOutcome, ReadCopy,
};
use crate::plan::route::CallResult;
use crate::pools::planned::Planned;
use crate::pools::topology::Topology;
use crate::protocol::meta::MetaCommand;
use crate::protocol::outcome::{Outcome, Reply};
use crate::protocol::reply::Expect;
use crate::runtime::wake::Wake;
use crate::session::shard::WorkerCtx;

/// One client's copies whose lease is placed and not yet replaced or taken
/// back. A write of a moved key by the same client waits until there are
/// none: it would otherwise reach the lease (an `append` extends it, an
/// `incr` finds it non-numeric) and the copy would then fail, losing what
/// the client itself read and then changed.
#[derive(Debug)]
pub(super) struct CopiesUnderWay {
    count: Cell<usize>,
    /// The client's session, woken when the last copy is done.
    session: Rc<Wake>,
}

impl CopiesUnderWay {
    pub(super) fn new(session: Rc<Wake>) -> Rc<CopiesUnderWay> {
        Rc::new(CopiesUnderWay {
            count: Cell::new(0),
            session,
        })
    }

    pub(super) fn any(&self) -> bool {
        self.count.get() > 0
    }

    fn begin(self: &Rc<Self>) -> Ended {
        self.count.set(self.count.get() + 1);
        Ended(self.clone())
    }
}

/// Counts a copy done when dropped, however its task ends.
struct Ended(Rc<CopiesUnderWay>);

impl Drop for Ended {
    fn drop(&mut self) {
        let under_way = &self.0;
        under_way.count.set(under_way.count.get() - 1);
        if under_way.count.get() == 0 {
            under_way.session.notify();
        }
    }
}

/// Places `copy`'s lease on its new owner now, and makes the copy once the
/// lease is there and the source still holds the value.
pub(super) fn send(
    worker: &Rc<WorkerCtx>,
    topology: &Arc<Topology>,
    lane: usize,
    copy: ReadCopy,
    under_way: &Rc<CopiesUnderWay>,
) {
    let wake = Rc::new(Wake::new());
    let expect = meta_expect(MetaCommand::Set);
    let lease = [copy.lease_line()];
    let Some(slot) = call_now(worker, topology, lane, copy.owner, &lease, expect, &wake) else {
        super::count_copy(&worker.stats, CopyOutcome::Failed);
        return;
    };
    // The copy writes on behalf of a request planned on `topology`: it
    // counts in flight there until it is done, so that a fleet's staged
    // change is not said staged while it may still land on a previous
    // owner (`control/fleet.rs`). The request still counts at this point.
    let (worker, topology) = (worker.clone(), Planned::on(topology.clone()));
    let ended = under_way.begin();
    let checks = worker.checks.clone();
    checks.spawn_local(async move {
        let _ended = ended;
        let leased = reply(&slot, &wake).await;
        let outcome = copy_outcome(&leased);
        // Without its cas the lease can be neither replaced nor taken back
        // safely: it expires (a miss meanwhile).
        let lease = match (outcome, landed_cas(&leased)) {
            (CopyOutcome::Made, Some(lease)) => lease,
            (CopyOutcome::Made, None) => {
                super::count_copy(&worker.stats, CopyOutcome::Failed);
                return;
            }
            // `NS`: the new owner holds the key (a write, or another
            // copy's lease) already. A `gat`'s new TTL still goes there.
            (outcome, _) => {
                if outcome == CopyOutcome::Skipped {
                    if let Some(line) = copy.touch_line() {
                        touch_held(&worker, &topology, lane, &copy, line).await;
                    }
                }
                super::count_copy(&worker.stats, outcome);
                return;
            }
        };
        if still_at_source(&worker, &topology, lane, &copy).await {
            let expect = meta_expect(MetaCommand::Set);
            let filled = call(
                &worker,
                &topology,
                lane,
                copy.owner,
                &copy.fill(lease),
                expect,
            )
            .await;
            super::count_copy(&worker.stats, fill_outcome(&filled));
        } else {
            take_back(&worker, &topology, lane, &copy, lease).await;
        }
        worker.stats.copy_checked();
    });
}

/// A `gat` read through whose copy found the key held on the new owner: to
/// memcached another sidecar's lease there is an item, whose copy (filled
/// by the lease's cas, which a touch keeps) would put back the TTL the
/// previous owner had before this `gat`, losing it. So the held item is
/// touched with the `gat`'s exptime in a way that shows a lease; a lease is
/// replaced by this copy (which carries that TTL), by its cas, so the other
/// copy fails; a value is touched. If another copy's fill got in between
/// (this fill then fails), the value it left is touched once more.
async fn touch_held(
    worker: &Rc<WorkerCtx>,
    topology: &Arc<Topology>,
    lane: usize,
    copy: &ReadCopy,
    line: Bytes,
) {
    let shown = Expect::Meta {
        command: MetaCommand::Get,
        quiet: false,
        replied: false,
        leases_shown: true,
    };
    let touched = call(
        worker,
        topology,
        lane,
        copy.owner,
        std::slice::from_ref(&line),
        shown.clone(),
    )
    .await;
    let Some(lease) = touched.as_ref().ok().and_then(ReadCopy::touched_lease) else {
        return;
    };
    let expect = meta_expect(MetaCommand::Set);
    let filled = call(
        worker,
        topology,
        lane,
        copy.owner,
        &copy.fill(lease),
        expect,
    )
    .await;
    if !matches!(&filled, Ok(reply) if reply.outcome == Outcome::Hd) {
        call(worker, topology, lane, copy.owner, &[line], shown)
            .await
            .ok();
    }
}

/// Whether the source still holds the copied value. A failure there counts
/// as a change: when in doubt, the copy goes (a miss is always allowed).
async fn still_at_source(
    worker: &Rc<WorkerCtx>,
    topology: &Arc<Topology>,
    lane: usize,
    copy: &ReadCopy,
) -> bool {
    let line = [copy.check_line()];
    let at_source = call(
        worker,
        topology,
        lane,
        copy.source,
        &line,
        meta_expect(MetaCommand::Get),
    )
    .await;
    matches!(&at_source, Ok(reply) if copy.holds(reply))
}

/// Deletes the lease from the new owner, compared by its cas, so a write
/// that replaced it in between stays.
async fn take_back(
    worker: &Rc<WorkerCtx>,
    topology: &Arc<Topology>,
    lane: usize,
    copy: &ReadCopy,
    lease: u64,
) {
    let expect = meta_expect(MetaCommand::Delete);
    let line = [copy.take_back_line(lease)];
    let undone = call(worker, topology, lane, copy.owner, &line, expect).await;
    if matches!(&undone, Ok(reply) if reply.outcome == Outcome::Hd) {
        worker.stats.copy_taken_back();
    }
}

/// Sends `wire` to `server` and waits for its one reply.
async fn call(
    worker: &Rc<WorkerCtx>,
    topology: &Topology,
    lane: usize,
    server: usize,
    wire: &[Bytes],
    expect: Expect,
) -> CallResult {
    let wake = Rc::new(Wake::new());
    match call_now(worker, topology, lane, server, wire, expect, &wake) {
        Some(slot) => reply(&slot, &wake).await,
        None => Err(topology.backends[server].error(crate::error::BackendErrorKind::Closed)),
    }
}

/// Queues `wire` on this worker's connection to `server`; `None` when the
/// connection takes nothing now.
fn call_now(
    worker: &WorkerCtx,
    topology: &Topology,
    lane: usize,
    server: usize,
    wire: &[Bytes],
    expect: Expect,
    wake: &Rc<Wake>,
) -> Option<Rc<Slot>> {
    let backend = topology.backends.get(server)?;
    let slot = Slot::new(wake.clone());
    let conn = worker.conn(backend, lane);
    conn.send(wire, expect, Some(slot.clone())).ok()?;
    Some(slot)
}

/// The whole one-part reply `slot` gets.
async fn reply(slot: &Slot, wake: &Wake) -> CallResult {
    loop {
        if let Some(done) = slot.outcome() {
            let said = done?;
            return Ok(Reply::new(
                said,
                match slot.take() {
                    Some(Got::Line(line) | Got::Value(line)) => line,
                    None => Bytes::new(),
                },
            ));
        }
        wake.notified().await;
    }
}
