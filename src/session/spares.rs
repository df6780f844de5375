//! What finished requests leave for the next ones on their worker: reply
//! slots, boxed meta and steps work, retrievals' storage and their lists of
//! sub-requests in flight. A request in steady state
//! then allocates none of them. They are kept per worker thread (every
//! session of a worker runs on its one thread), because a pipelining client
//! finishes a batch only after planning all of it: a session's own spares
//! would run dry at every batch. Only what nothing else still holds is kept
//! (a slot a hot-key reader or a connection still has is let go), and each
//! kind is bounded, so a worker keeps at most a few MiB, and a few hundred
//! KiB when its requests have one key each.

use std::cell::RefCell;

use super::*;
use crate::plan::placement::HealthView;
use crate::plan::route::Storage;
use crate::plan::steps::{Machine, ReadSteps};

/// Most slots and meta works a worker keeps: more than its clients usually
/// have in flight together.
const KEEP: usize = 1024;

/// Most retrievals a worker keeps: as many as a few pipelining clients
/// have in flight together (their per-key lists are plain vectors, so one
/// planned in fresh storage allocates for each).
const KEEP_RETRIEVALS: usize = 512;

/// Most keys a kept retrieval has room for: a longer multi-get's lists go
/// with it (it allocates per request, never per key), so kept retrievals
/// take about 2 MiB per worker at the most, and 0.6 MiB for one-key gets.
const KEEP_RETRIEVAL_KEYS: usize = 32;

/// Largest key list kept (a long multi-get's lets go of its storage).
const KEEP_KEYS_ROOM: usize = 256;

/// Largest list of sub-requests in flight kept (a few servers' worth).
const KEEP_IN_FLIGHT_ROOM: usize = 16;

struct Spares {
    slots: Vec<Rc<Slot>>,
    // Boxed, as entries hold them: kept boxes are reused.
    #[allow(clippy::vec_box)]
    metas: Vec<Box<MetaLines>>,
    /// Steps work (an `mg` over replicas or zones, a hand-off's steps).
    #[allow(clippy::vec_box)]
    steps: Vec<Box<StepsWork>>,
    /// Retrievals' storage, for `route::plan`.
    plans: route::Reuse,
    /// Empty lists of sub-requests in flight that outgrew their inline
    /// room (a multi-key get over several servers).
    in_flights: Vec<InFlight>,
    /// Empty key lists of finished multi-key gets, for the parser.
    keys: Vec<crate::protocol::request::Keys>,
    /// Entry queues of idle clients, for the next client that reads.
    entries: Vec<std::collections::VecDeque<Entry>>,
}

impl Spares {
    const EMPTY: Spares = Spares {
        slots: Vec::new(),
        metas: Vec::new(),
        steps: Vec::new(),
        plans: route::Reuse::EMPTY,
        in_flights: Vec::new(),
        keys: Vec::new(),
        entries: Vec::new(),
    };
}

/// Most entry queues a worker keeps, and the most entries one may have room
/// for: a queue that once held a long pipeline is let go.
const KEEP_ENTRIES: usize = 256;
pub(super) const KEEP_ENTRIES_ROOM: usize = 16;

/// Keeps an idle client's empty entry queue for another client.
pub(super) fn keep_entries(storage: std::collections::VecDeque<Entry>) {
    let bytes = storage.capacity() * std::mem::size_of::<Entry>();
    if storage.capacity() <= KEEP_ENTRIES_ROOM {
        let kept = SPARES.with(|spares| {
            let kept = &mut spares.borrow_mut().entries;
            let room = kept.len() < KEEP_ENTRIES;
            if room {
                kept.push(storage);
            }
            room
        });
        if kept {
            return;
        }
    }
    crate::runtime::trim::freed(bytes);
}

/// An empty entry queue an idle client gave up, when one is kept.
pub(super) fn entries() -> Option<std::collections::VecDeque<Entry>> {
    SPARES.with(|spares| spares.borrow_mut().entries.pop())
}

thread_local! {
    // Built empty without a call: each of a request's looks here skips the
    // lazy set-up's check.
    static SPARES: RefCell<Spares> = const { RefCell::new(Spares::EMPTY) };
}

/// Lets go of all but `most` of each kind this worker keeps. After a burst
/// of clients went idle together, what is kept was made during the burst
/// and sits scattered among the memory they freed: a few hundred bytes
/// each, but each keeps a whole page from going back to the kernel.
pub(crate) fn shed(most: usize) {
    SPARES.with(|spares| {
        let spares = &mut *spares.borrow_mut();
        spares.slots.truncate(most);
        spares.metas.truncate(most);
        spares.steps.truncate(most);
        spares.plans.shed(most);
        spares.in_flights.truncate(most);
        spares.keys.truncate(most);
        spares.entries.truncate(most);
    });
}

/// An empty slot that wakes `wake`.
pub(super) fn slot(wake: &Rc<crate::runtime::wake::Wake>) -> Rc<Slot> {
    let kept = SPARES.with(|spares| spares.borrow_mut().slots.pop());
    match kept {
        Some(mut slot) => {
            Slot::wake_on(&mut slot, wake);
            slot
        }
        None => Slot::new(wake.clone()),
    }
}

/// `work` in a kept box when there is one.
pub(super) fn meta_lines(work: MetaLines) -> Box<MetaLines> {
    match SPARES.with(|spares| spares.borrow_mut().metas.pop()) {
        Some(mut kept) => {
            *kept = work;
            kept
        }
        None => Box::new(work),
    }
}

/// `work` in a kept box when there is one.
pub(super) fn steps(work: StepsWork) -> Box<StepsWork> {
    match SPARES.with(|spares| spares.borrow_mut().steps.pop()) {
        Some(mut kept) => {
            *kept = work;
            kept
        }
        None => Box::new(work),
    }
}

/// An empty list for up to `most` sub-requests of a retrieval in flight at
/// once: kept storage when there is some and they would not fit inline (a
/// get of one or two keys, most gets, takes no look at the spares).
pub(super) fn in_flight(most: usize) -> InFlight {
    if most <= InFlight::new().inline_size() {
        return InFlight::new();
    }
    SPARES
        .with(|spares| spares.borrow_mut().in_flights.pop())
        .unwrap_or_default()
}

/// An empty key list with room for a multi-key get, when one is kept.
pub(super) fn keys() -> crate::protocol::request::Keys {
    SPARES
        .with(|spares| spares.borrow_mut().keys.pop())
        .unwrap_or_default()
}

/// Keeps the key list of a finished request for a later parse.
pub(super) fn keep_keys(mut keys: crate::protocol::request::Keys) {
    if keys.capacity() <= KEEP_KEYS_ROOM {
        keys.clear();
        SPARES.with(|spares| {
            let kept = &mut spares.borrow_mut().keys;
            if kept.len() < KEEP_RETRIEVALS {
                kept.push(keys);
            }
        });
    }
}

/// A worker's kept retrievals, looked at only when a retrieval is planned.
struct KeptRetrievals;

impl Storage for KeptRetrievals {
    fn take(&mut self) -> Option<Box<route::Retrieval>> {
        SPARES.with(|spares| spares.borrow_mut().plans.take())
    }

    fn give_back(&mut self, retrieval: Box<route::Retrieval>) {
        keep_retrieval(retrieval);
    }
}

/// Plans `request` with kept retrieval storage (see `route::plan`).
pub(super) fn plan(
    request: &Request,
    bytes: &Bytes,
    topology: &Topology,
    health: &HealthView,
) -> Plan {
    route::plan(request, bytes, topology, health, &mut KeptRetrievals)
}

/// Plans the meta `request` (routing key `key`) with kept retrieval storage
/// (see `route::plan_meta`).
pub(super) fn plan_meta(
    request: &MetaRequest,
    bytes: &Bytes,
    key: &[u8],
    topology: &Topology,
    health: &HealthView,
) -> Plan {
    route::plan_meta(request, bytes, key, topology, health, &mut KeptRetrievals)
}

/// Keeps what the finished `work` no longer needs.
pub(super) fn keep(work: Work) {
    match work {
        Work::Ready(_) | Work::Stats | Work::StatsReset => {}
        Work::Lines {
            parts,
            finish,
            meta,
        } => {
            parts.into_iter().for_each(keep_part);
            if let Finish::Quorum { older, .. } = finish {
                keep_older(older.map(|o| *o));
            }
            if let Some(mut meta) = meta {
                // Its bytes go now; the box waits for the next request.
                meta.wire.clear();
                meta.key = (Bytes::new(), false);
                SPARES.with(|spares| {
                    let metas = &mut spares.borrow_mut().metas;
                    if metas.len() < KEEP {
                        metas.push(meta);
                    }
                });
            }
        }
        Work::Steps(mut steps) => {
            steps.parts.drain(..).for_each(keep_part);
            keep_older(steps.older.take());
            // Its machine and bytes go now; the box waits for the next
            // request.
            steps.machine = Machine::Read(ReadSteps::idle());
            steps.key = (Bytes::new(), None);
            steps.answer = None;
            steps.meta = None;
            SPARES.with(|spares| {
                let kept = &mut spares.borrow_mut().steps;
                if kept.len() < KEEP {
                    kept.push(steps);
                }
            });
        }
        Work::Retrieve {
            plan,
            mut in_flight,
            ..
        } => {
            for sub in in_flight.drain(..) {
                keep_slot(sub.slot);
            }
            SPARES.with(|spares| {
                let spares = &mut *spares.borrow_mut();
                spares
                    .plans
                    .keep(plan, KEEP_RETRIEVALS, KEEP_RETRIEVAL_KEYS);
                if in_flight.spilled()
                    && in_flight.capacity() <= KEEP_IN_FLIGHT_ROOM
                    && spares.in_flights.len() < KEEP_RETRIEVALS
                {
                    spares.in_flights.push(in_flight);
                }
            });
        }
    }
}

/// Keeps the storage of a retrieval that was planned and not used.
fn keep_retrieval(plan: Box<route::Retrieval>) {
    SPARES.with(|spares| {
        spares
            .borrow_mut()
            .plans
            .keep(plan, KEEP_RETRIEVALS, KEEP_RETRIEVAL_KEYS);
    });
}

fn keep_older(older: Option<OlderForget>) {
    if let Some(older) = older {
        older.into_parts().into_iter().for_each(keep_part);
    }
}

fn keep_part(part: Part) {
    if let Some(slot) = part.slot {
        keep_slot(slot);
    }
}

/// Keeps `slot` if nothing else holds it and its reply is complete.
pub(super) fn keep_slot(mut slot: Rc<Slot>) {
    if Slot::empty_for_reuse(&mut slot) {
        SPARES.with(|spares| {
            let slots = &mut spares.borrow_mut().slots;
            if slots.len() < KEEP {
                slots.push(slot);
            }
        });
    }
}
