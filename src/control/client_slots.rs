//! The client connection limit: a semaphore the accept loop takes a slot
//! from before each accept, whose size can change while clients are
//! connected. Lowering it takes only slots nobody holds; a slot held by a
//! connected client is taken when that client leaves, never from it.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Client slots, shared by the accept loop and the publisher.
#[derive(Debug)]
pub(crate) struct ClientSlots {
    semaphore: Arc<Semaphore>,
    limit: Mutex<Limit>,
}

#[derive(Debug)]
struct Limit {
    /// Clients served at once.
    clients: usize,
    /// Slots still to be taken out of the semaphore because they were held
    /// when the limit was lowered: the next ones released are forgotten.
    /// The semaphore holds `clients + owed` slots in all.
    owed: usize,
}

impl ClientSlots {
    pub(crate) fn new(clients: usize) -> Arc<ClientSlots> {
        Arc::new(ClientSlots {
            semaphore: Arc::new(Semaphore::new(clients)),
            limit: Mutex::new(Limit { clients, owed: 0 }),
        })
    }

    /// Waits for a free slot; it is released when the permit drops.
    pub(crate) async fn acquire(&self) -> OwnedSemaphorePermit {
        loop {
            let permit = self
                .semaphore
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let mut limit = self.lock();
            if limit.owed == 0 {
                return permit;
            }
            limit.owed -= 1;
            permit.forget();
        }
    }

    /// Clients served at once now.
    pub(crate) fn limit(&self) -> usize {
        self.lock().clients
    }

    /// Slots held: connected clients, and the one the accept loop holds
    /// while it waits for the next (counted, since it becomes a client).
    pub(crate) fn in_use(&self) -> usize {
        let limit = self.lock();
        (limit.clients + limit.owed).saturating_sub(self.semaphore.available_permits())
    }

    /// Serves `clients` at once from now on. Lowering takes free slots at
    /// once and held ones as they are released.
    pub(crate) fn set_limit(&self, clients: usize) {
        let mut limit = self.lock();
        if clients < limit.clients {
            let fewer = limit.clients - clients;
            let taken = self.semaphore.forget_permits(fewer);
            limit.owed += fewer - taken;
        } else {
            let more = clients - limit.clients;
            let repaid = more.min(limit.owed);
            limit.owed -= repaid;
            self.semaphore.add_permits(more - repaid);
        }
        limit.clients = clients;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Limit> {
        self.limit.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn try_acquire(slots: &ClientSlots) -> Option<OwnedSemaphorePermit> {
        runtime().block_on(async {
            tokio::time::timeout(std::time::Duration::ZERO, slots.acquire())
                .await
                .ok()
        })
    }

    #[test]
    fn lowering_the_limit_takes_free_slots_and_keeps_held_ones() {
        let slots = ClientSlots::new(4);
        let held: Vec<_> = (0..3).map(|_| try_acquire(&slots).unwrap()).collect();
        assert_eq!(slots.in_use(), 3);
        // Down to 2 with 3 held: the free slot goes now, one held slot is owed.
        slots.set_limit(2);
        assert_eq!(slots.limit(), 2);
        assert_eq!(slots.in_use(), 3, "no client loses its slot");
        assert!(try_acquire(&slots).is_none());
        let mut held = held.into_iter();
        drop(held.next());
        // The first slot released pays what is owed: still full.
        assert!(try_acquire(&slots).is_none());
        assert_eq!(slots.in_use(), 2);
        drop(held.next());
        let again = try_acquire(&slots).expect("one slot below the limit");
        assert_eq!(slots.in_use(), 2);
        drop(again);
    }

    #[test]
    fn raising_the_limit_first_cancels_what_is_owed() {
        let slots = ClientSlots::new(2);
        let held: Vec<_> = (0..2).map(|_| try_acquire(&slots).unwrap()).collect();
        slots.set_limit(1);
        slots.set_limit(3);
        assert_eq!(slots.limit(), 3);
        let third = try_acquire(&slots).expect("room for a third");
        assert!(try_acquire(&slots).is_none());
        drop(held);
        drop(third);
        assert_eq!(slots.in_use(), 0);
        let all: Vec<_> = (0..3).map(|_| try_acquire(&slots).unwrap()).collect();
        assert!(try_acquire(&slots).is_none());
        assert_eq!(all.len(), 3);
    }
}
