//! Cheap wake-ups for a worker's tasks: a [`Wake`] that one task waits on and
//! anything on the same thread sets (a session's reply slots, the requests
//! queued on a connection), and [`Cancel`], a cancellation token's wait that
//! registers once per loop rather than once per turn.
//!
//! The worker's loops (`session::serve`, `backend::conn::serve_on`) wake many
//! times per request. tokio's `Notify` takes a mutex to register a waiter on
//! every poll and again to unregister it when `select!` drops the future, and
//! `CancellationToken::cancelled` does the same on a mutex all workers share:
//! together about 3 % of memring's CPU under W1. A `Wake` is single-threaded
//! (`Cell`) and takes no lock, and notifying again before the task has run
//! costs one flag test, so a session woken by many slots in one turn is woken
//! once; a `Cancel` reads a flag of its own. No I/O, no clock.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// One task's wake-up on one thread, with `Notify::notify_one`'s permit: a
/// notify while the task is not waiting is kept for its next wait.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    /// A notify not yet seen by the task.
    notified: Cell<bool>,
    /// The waiting task's waker. Left in place when a wait ends unfired (a
    /// `select!` took another arm), so the next wait of the same task need
    /// not clone it again.
    waker: RefCell<Option<Waker>>,
}

impl Wake {
    pub(crate) fn new() -> Wake {
        Wake::default()
    }

    /// Wakes the task waiting in [`Wake::notified`], or lets its next wait
    /// end at once. Repeated notifies before it runs cost a flag test.
    pub(crate) fn notify(&self) {
        if self.notified.replace(true) {
            return;
        }
        // Taken out before waking: no borrow is held if waking runs code
        // that notifies again.
        let waker = self.waker.borrow_mut().take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Resolves once [`Wake::notify`] has been called since the last wait
    /// resolved. For one task: a second task waiting on the same `Wake`
    /// would take the first one's place.
    pub(crate) fn notified(&self) -> Notified<'_> {
        Notified(self)
    }

    /// Lets go of the waiting task's waker (its task is ending): a `Wake`
    /// that slots still hold must not keep a finished task's memory.
    pub(crate) fn forget_waiter(&self) {
        self.waker.borrow_mut().take();
    }
}

/// The future of [`Wake::notified`].
#[derive(Debug)]
pub(crate) struct Notified<'a>(&'a Wake);

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let wake = self.0;
        if wake.notified.replace(false) {
            return Poll::Ready(());
        }
        let mut waker = wake.waker.borrow_mut();
        match &mut *waker {
            Some(kept) if kept.will_wake(cx.waker()) => {}
            other => *other = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// Waits for a cancellation token, registering with it once: later polls
/// read a flag of its own (the token's `is_cancelled` takes the lock all
/// workers share). The token wakes a waker of this `Cancel`, which sets the
/// flag and wakes the task that first polled it; so one task polls it.
pub(crate) struct Cancel<'a> {
    wait: Pin<Box<WaitForCancellationFuture<'a>>>,
    fired: Arc<Fired>,
    /// `fired` as a waker, made once.
    waker: Waker,
    registered: bool,
    done: bool,
}

/// Set when the token wakes a [`Cancel`]'s registration.
#[derive(Default)]
struct Fired {
    fired: AtomicBool,
    task: OnceLock<Waker>,
}

impl std::task::Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        if let Some(task) = self.task.get() {
            task.wake_by_ref();
        }
    }
}

impl<'a> Cancel<'a> {
    /// One allocation per loop (a session, a connection), not per turn.
    pub(crate) fn new(token: &'a CancellationToken) -> Cancel<'a> {
        let fired = Arc::new(Fired::default());
        Cancel {
            wait: Box::pin(token.cancelled()),
            waker: Waker::from(fired.clone()),
            fired,
            registered: false,
            done: false,
        }
    }

    /// The wait has resolved: the token is cancelled.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Resolves when the token is cancelled.
    pub(crate) fn cancelled(&mut self) -> Cancelled<'_, 'a> {
        Cancelled(self)
    }

    /// Registers with the token the first time; afterwards, runs only once
    /// the token has woken the registration (or the wait is over).
    #[cold]
    fn poll_token(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.registered {
            self.fired.task.get_or_init(|| cx.waker().clone());
            self.registered = true;
        }
        let polled = self
            .wait
            .as_mut()
            .poll(&mut Context::from_waker(&self.waker));
        if polled.is_ready() {
            self.done = true;
        }
        polled
    }
}

/// The future of [`Cancel::cancelled`]: a plain struct rather than an
/// `async fn`, so that the wait every loop turn makes while nothing is
/// cancelled is a flag test inlined into the loop's `select!`, with no
/// state machine to set up (about 40 instructions a wait).
pub(crate) struct Cancelled<'c, 'a>(&'c mut Cancel<'a>);

impl Future for Cancelled<'_, '_> {
    type Output = ();

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let cancel = &mut *self.0;
        if cancel.registered && !cancel.done && !cancel.fired.fired.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        cancel.poll_token(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake as TaskWake;

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl TaskWake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn poll(future: &mut Pin<&mut impl Future<Output = ()>>, waker: &Waker) -> Poll<()> {
        future.as_mut().poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_notify_before_the_wait_is_kept_for_it() {
        let wake = Wake::new();
        wake.notify();
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(counter.clone());
        let mut first = std::pin::pin!(wake.notified());
        assert_eq!(poll(&mut first, &waker), Poll::Ready(()));
        let mut second = std::pin::pin!(wake.notified());
        assert_eq!(poll(&mut second, &waker), Poll::Pending, "used up");
    }

    #[test]
    fn many_notifies_in_one_turn_wake_the_task_once_and_none_is_lost() {
        let wake = Rc::new(Wake::new());
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(counter.clone());
        {
            let mut wait = std::pin::pin!(wake.notified());
            assert_eq!(poll(&mut wait, &waker), Poll::Pending);
            // The select! that waited took another arm: the wait is dropped.
        }
        let mut wait = std::pin::pin!(wake.notified());
        assert_eq!(poll(&mut wait, &waker), Poll::Pending);
        for _ in 0..5 {
            wake.notify();
        }
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(()));
        // A notify after the task ran wakes it again.
        let mut wait = std::pin::pin!(wake.notified());
        assert_eq!(poll(&mut wait, &waker), Poll::Pending);
        wake.notify();
        assert_eq!(counter.0.load(Ordering::Relaxed), 2);
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(()));
    }

    #[test]
    fn a_forgotten_waiter_is_not_woken_but_the_notify_is_kept() {
        let wake = Wake::new();
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(counter.clone());
        let mut wait = std::pin::pin!(wake.notified());
        assert_eq!(poll(&mut wait, &waker), Poll::Pending);
        wake.forget_waiter();
        wake.notify();
        assert_eq!(counter.0.load(Ordering::Relaxed), 0);
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(()));
    }

    #[test]
    fn cancel_resolves_when_the_token_is_cancelled_after_it_registered() {
        let token = CancellationToken::new();
        let mut cancel = Cancel::new(&token);
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(counter.clone());
        for _ in 0..3 {
            let mut wait = std::pin::pin!(cancel.cancelled());
            assert_eq!(poll(&mut wait, &waker), Poll::Pending);
        }
        token.cancel();
        assert_eq!(counter.0.load(Ordering::Relaxed), 1, "its waker was kept");
        {
            let mut wait = std::pin::pin!(cancel.cancelled());
            assert_eq!(poll(&mut wait, &waker), Poll::Ready(()));
        }
        assert!(cancel.is_done());
    }

    #[test]
    fn cancel_of_a_token_already_cancelled_resolves_at_once() {
        let token = CancellationToken::new();
        token.cancel();
        let mut cancel = Cancel::new(&token);
        let waker = Waker::from(Arc::new(Counter::default()));
        let mut wait = std::pin::pin!(cancel.cancelled());
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(()));
    }
}
