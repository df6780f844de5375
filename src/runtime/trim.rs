//! Hands memory that idle clients' parked buffers freed back to the kernel.
//! No I/O here beyond the one allocator call.
//!
//! When thousands of clients are busy at once and then go idle together,
//! each parks its buffers (`RecycledBuf::park`): a worker's shelf keeps a
//! few hundred, the rest are freed. glibc's allocator keeps freed memory in
//! its heap for later allocations and gives back to the kernel only a free
//! top of the heap, so the process would keep the peak of that burst for
//! good (issue 48: 8 KiB per idle client after 5 000 were busy at once,
//! against 2.4 KiB for one that never sent anything). What parking frees is
//! counted per worker; the worker's [`run`] task then lets go of most of
//! what it keeps for the next requests (made during the burst, it sits
//! scattered among the freed memory and keeps those pages resident) and
//! asks the allocator to return its free pages. At most once per
//! [`TRIM_EVERY`], after [`TRIM_AFTER_FREED_BYTES`] were freed (and once
//! more for whatever the burst's last clients free after that), and never
//! on a request's path: a busy client does not park.

use std::cell::Cell;
use std::time::Duration;

/// Bytes parking must have freed on a worker before the heap is trimmed:
/// a few hundred idle clients' buffers. Less is not worth walking the heap
/// and giving up what the worker keeps.
pub(crate) const TRIM_AFTER_FREED_BYTES: usize = 1024 * 1024;

/// How often a worker looks at what was freed, and so the most often it
/// trims.
const TRIM_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// Bytes freed by parking on this thread since its last trim.
    static FREED: Freed = const { Freed::new() };
}

/// A count of bytes freed since the last trim.
struct Freed {
    bytes: Cell<usize>,
    /// A trim for enough freed bytes was made and no trim since: the
    /// clients that park after it (a burst's stragglers, less than
    /// [`TRIM_AFTER_FREED_BYTES`]) get one more.
    follow_up: Cell<bool>,
}

impl Freed {
    const fn new() -> Self {
        Freed {
            bytes: Cell::new(0),
            follow_up: Cell::new(false),
        }
    }

    fn add(&self, bytes: usize) {
        self.bytes.set(self.bytes.get().saturating_add(bytes));
    }

    /// The bytes freed when that is enough to trim now (or anything, once,
    /// after such a trim); starts the count again when so.
    fn take_due(&self) -> Option<usize> {
        let freed = self.bytes.get();
        if freed >= TRIM_AFTER_FREED_BYTES {
            self.follow_up.set(true);
        } else if freed > 0 && self.follow_up.get() {
            self.follow_up.set(false);
        } else {
            return None;
        }
        Some(self.bytes.replace(0))
    }
}

/// Counts `bytes` freed by a parked buffer on this thread (not on a
/// request's path: only an idle client parks).
pub(crate) fn freed(bytes: usize) {
    FREED.with(|freed| freed.add(bytes));
}

/// A worker's trimming task: once per [`TRIM_EVERY`], when parking on this
/// thread freed enough (or, once after that, anything), calls `shed` (which lets go of what the worker
/// keeps for later requests) and trims the heap. Ends with `drain`.
pub(crate) async fn run(drain: tokio_util::sync::CancellationToken, shed: impl Fn()) {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(freed) = FREED.with(Freed::take_due) {
                    shed();
                    trim();
                    tracing::debug!(freed, "idle clients' buffers freed: heap trimmed");
                }
            }
            () = drain.cancelled() => return,
        }
    }
}

/// Asks glibc to give every whole free page of its heaps back to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    // SAFETY: malloc_trim takes a plain integer, touches only the
    // allocator's own free lists (under their locks) and may be called from
    // any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators give free memory back their own way.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_once_enough_was_freed_and_then_not_again() {
        let freed = Freed::new();
        freed.add(TRIM_AFTER_FREED_BYTES - 1);
        assert_eq!(freed.take_due(), None);
        freed.add(1);
        assert_eq!(freed.take_due(), Some(TRIM_AFTER_FREED_BYTES));
        assert_eq!(freed.take_due(), None);
        // The stragglers of that burst: one more trim, then the threshold
        // again.
        freed.add(10);
        assert_eq!(freed.take_due(), Some(10));
        freed.add(10);
        assert_eq!(freed.take_due(), None);
        // Harmless at any time, on any thread.
        trim();
    }
}
