//! Read-through copies, checked once they have landed (see
//! `handoff::ReadCopy`). A copy is sent at once, ahead of the client's later
//! requests on the same connection; what follows its reply runs on its own,
//! and no client waits for it: the source is read again, and if the value
//! changed or went there, the copy is taken back from the new owner.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::slot::{Got, Slot};
use crate::plan::handoff::{copy_outcome, landed_cas, meta_expect, CopyOutcome, ReadCopy};
use crate::plan::route::CallResult;
use crate::protocol::meta::MetaCommand;
use crate::protocol::reply::Expect;
use crate::shard::WorkerCtx;
use crate::topology::Topology;
use crate::wake::Wake;

/// Sends `copy` to its new owner now, and checks it once it has landed.
pub(super) fn send(worker: &Rc<WorkerCtx>, topology: &Arc<Topology>, lane: usize, copy: ReadCopy) {
    let wake = Rc::new(Wake::new());
    let expect = meta_expect(MetaCommand::Set);
    let Some(slot) = call_now(
        worker, topology, lane, copy.owner, &copy.wire, expect, &wake,
    ) else {
        super::count_copy(&worker.stats, CopyOutcome::Failed);
        return;
    };
    let (worker, topology) = (worker.clone(), topology.clone());
    let checks = worker.checks.clone();
    checks.spawn_local(async move {
        let landed = reply(&slot, &wake).await;
        let outcome = copy_outcome(&landed);
        super::count_copy(&worker.stats, outcome);
        if outcome != CopyOutcome::Made {
            return;
        }
        if !still_at_source(&worker, &topology, lane, &copy).await {
            take_back(&worker, &topology, lane, &copy, landed_cas(&landed)).await;
        }
        worker.stats.copy_checked();
    });
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

/// Deletes the copy from its new owner, compared by the cas it `landed`
/// with, so a write that replaced it in between stays.
async fn take_back(
    worker: &Rc<WorkerCtx>,
    topology: &Arc<Topology>,
    lane: usize,
    copy: &ReadCopy,
    landed: Option<u64>,
) {
    let expect = meta_expect(MetaCommand::Delete);
    let line = [copy.take_back_line(landed)];
    let undone = call(worker, topology, lane, copy.owner, &line, expect).await;
    if matches!(&undone, Ok(reply) if reply.starts_with(b"HD")) {
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
            done?;
            return match slot.take() {
                Some(Got::Line(line) | Got::Value(line)) => Ok(line),
                None => Ok(Bytes::new()),
            };
        }
        wake.notified().await;
    }
}
