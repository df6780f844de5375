//! Read-through copies, made through a lease (see `handoff::ReadCopy`): this
//! task drives the plan's `handoff::LeaseCopy` (the sequence is written
//! there once) and does its I/O. The lease is sent at once, ahead of the
//! client's later requests on the same connection; what follows its reply
//! runs on its own, and no client waits for it: the source is read again,
//! and the copy replaces the lease only if the value is still there;
//! otherwise the lease is taken back (a `gat`'s copy that found the key
//! held touches it instead). Only the client's later writes of moved keys
//! wait (see [`CopiesUnderWay`]). A copy under way counts in flight on its
//! request's topology.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::slot::{Got, Slot};
use crate::plan::handoff::{CopyEnd, CopyOutcome, CopyStep, Owner, ReadCopy};
use crate::plan::route::CallResult;
use crate::pools::planned::Planned;
use crate::pools::topology::Topology;
use crate::protocol::outcome::Reply;
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

/// Places `copy`'s lease on its new owner now, and drives the rest of its
/// `handoff::LeaseCopy` once the lease's reply is in.
pub(super) fn send(
    worker: &Rc<WorkerCtx>,
    topology: &Arc<Topology>,
    lane: usize,
    copy: ReadCopy,
    under_way: &Rc<CopiesUnderWay>,
) {
    let mut machine = copy.lease_copy();
    let CopyStep::Send { to, wire, expect } = machine.start() else {
        return;
    };
    let wake = Rc::new(Wake::new());
    let server = server_of(&copy, to);
    let Some(slot) = call_now(worker, topology, lane, server, &wire, expect, &wake) else {
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
        let mut step = machine.on_reply(reply(&slot, &wake).await);
        let end = loop {
            match step {
                CopyStep::Send { to, wire, expect } => {
                    let server = server_of(&copy, to);
                    let result = call(&worker, &topology, lane, server, &wire, expect).await;
                    step = machine.on_reply(result);
                }
                CopyStep::Done(end) => break end,
            }
        };
        match end {
            // `NS`: the new owner held the key (a write, or another copy's
            // lease) already; a `gat`'s copy touched it.
            CopyEnd::NotLeased(outcome) => super::count_copy(&worker.stats, outcome),
            CopyEnd::Filled(outcome) => {
                super::count_copy(&worker.stats, outcome);
                worker.stats.copy_checked();
            }
            CopyEnd::TakenBack(removed) => {
                if removed {
                    worker.stats.copy_taken_back();
                }
                worker.stats.copy_checked();
            }
        }
    });
}

/// The server a `handoff::LeaseCopy`'s message goes to: the new owner, or the
/// source the value was read from.
fn server_of(copy: &ReadCopy, to: Owner) -> usize {
    match to {
        Owner::New => copy.owner,
        Owner::Previous => copy.source,
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
