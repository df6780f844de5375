//! A byte buffer that takes its earlier allocation back instead of making a
//! new one. No I/O here.
//!
//! memring hands out pieces split off its buffers without copying them:
//! requests from a client's input, reply pieces from a server's input,
//! sealed chunks of an output queue. Each piece keeps its buffer's
//! allocation alive while it is in flight. On a pipelining connection some
//! piece is nearly always in flight when the buffer runs out of room, so
//! `BytesMut::reserve` would allocate anew each time: a few allocations per
//! hundred requests. This buffer keeps the allocation it left as a spare and
//! moves back into it once all of that allocation's pieces are dropped. Two
//! allocations take turns, and a steady load allocates nothing; when more is
//! in flight than two of them carry, the next allocation is twice as large.

//!
//! A buffer can also be *parked* while its owner is idle ([`RecycledBuf::park`]):
//! its allocation goes to its thread's shelf, and the next owner on that
//! thread that needs room takes it from there. An idle client then holds no
//! buffer, and a busy worker still allocates none in steady state.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use bytes::BytesMut;

/// A spare larger than this is let go rather than kept: a client that once
/// sent a large value does not hold two buffers of its size for good. A
/// buffer may be given a larger bound ([`RecycledBuf::keeping_spares_up_to`]).
const MAX_SPARE_BYTES: usize = 64 * 1024;

/// The most a buffer grows to because its spare was still held when it ran
/// out of room (a larger `make_room` still gets what it asks).
const MAX_GROWN_BYTES: usize = 32 * 1024;

/// Most parked allocations a thread keeps (all sizes together): about as
/// many as its clients go from idle to busy at once. Beyond it a parked
/// buffer is freed.
const MAX_SHELVED: usize = 256;
/// A parked allocation larger than this is freed rather than shelved.
const MAX_SHELVED_BYTES: usize = 32 * 1024;
/// Most bytes a thread's shelf holds, all allocations together: 256 read
/// and reply buffers of the usual sizes, but not 256 of clients that once
/// grew theirs to 32 KiB. Beyond it a parked buffer is freed.
const MAX_SHELF_BYTES: usize = 1024 * 1024;

thread_local! {
    /// Parked allocations by the size they were made with: a few sizes
    /// (first sizes, and their doublings), each a stack.
    static SHELF: RefCell<Shelf> = const { RefCell::new(Shelf::new()) };
}

struct Shelf {
    sizes: Vec<(usize, Vec<BytesMut>)>,
    count: usize,
    /// The capacities of the allocations shelved, together.
    bytes: usize,
}

impl Shelf {
    const fn new() -> Self {
        Shelf {
            sizes: Vec::new(),
            count: 0,
            bytes: 0,
        }
    }

    /// The smallest allocation of at least `size` bytes (and at most four
    /// times that).
    fn take(&mut self, size: usize) -> Option<BytesMut> {
        let kept = self
            .sizes
            .iter_mut()
            .filter(|(s, stack)| *s >= size && *s <= size.saturating_mul(4) && !stack.is_empty())
            .min_by_key(|(s, _)| *s)
            .and_then(|(_, stack)| stack.pop());
        if let Some(kept) = &kept {
            self.count -= 1;
            self.bytes -= kept.capacity();
        }
        kept
    }

    /// Keeps `bytes` (empty, unshared) within the shelf's bounds, or gives
    /// it back when that would pass them.
    fn keep(&mut self, bytes: BytesMut) -> Result<(), BytesMut> {
        let size = bytes.capacity();
        if size == 0
            || size > MAX_SHELVED_BYTES
            || self.count >= MAX_SHELVED
            || self.bytes + size > MAX_SHELF_BYTES
        {
            return Err(bytes);
        }
        self.count += 1;
        self.bytes += size;
        match self.sizes.iter_mut().find(|(s, _)| *s == size) {
            Some((_, stack)) => stack.push(bytes),
            None => self.sizes.push((size, vec![bytes])),
        }
        Ok(())
    }

    /// Frees shelved allocations, the largest first, until `most` are left.
    fn shed(&mut self, most: usize) {
        self.sizes.sort_unstable_by_key(|(size, _)| *size);
        for (size, stack) in self.sizes.iter_mut().rev() {
            let over = self.count.saturating_sub(most).min(stack.len());
            stack.truncate(stack.len() - over);
            self.count -= over;
            self.bytes -= over * *size;
        }
    }
}

/// An empty allocation of at least `size` bytes (and at most four times
/// that) from this thread's shelf, the smallest there is.
fn take_shelved(size: usize) -> Option<BytesMut> {
    SHELF.with(|shelf| shelf.borrow_mut().take(size))
}

/// Lets go of all but `most` of this thread's shelved allocations (see
/// `trim`), the largest first.
pub(crate) fn shed_shelf(most: usize) {
    SHELF.with(|shelf| shelf.borrow_mut().shed(most));
}

/// Keeps an empty, unshared allocation for a later [`take_shelved`], by its
/// capacity; frees it when the shelf is full (and counts it for a trim).
fn shelve(bytes: BytesMut) {
    if let Err(freed) = SHELF.with(|shelf| shelf.borrow_mut().keep(bytes)) {
        crate::runtime::trim::freed(freed.capacity());
    }
}

/// A `BytesMut` with a spare allocation (see the module text).
#[derive(Debug)]
pub(crate) struct RecycledBuf {
    bytes: BytesMut,
    /// The size `bytes` was allocated with here, and the least size of the
    /// next allocation.
    size: usize,
    /// Empty; shares an earlier allocation with the pieces still in flight.
    spare: BytesMut,
    spare_size: usize,
    /// The largest spare kept (see [`MAX_SPARE_BYTES`]).
    max_spare: usize,
    /// `bytes` has no allocation of its own: never used, or parked.
    unallocated: bool,
}

impl RecycledBuf {
    /// An empty buffer that allocates nothing until it needs room, then at
    /// least `first_size` bytes.
    pub(crate) fn new(first_size: usize) -> Self {
        let mut buf = Self::from_bytes(BytesMut::new(), first_size);
        buf.unallocated = true;
        buf
    }

    /// A buffer of `size` bytes, allocated now.
    pub(crate) fn with_capacity(size: usize) -> Self {
        Self::from_bytes(BytesMut::with_capacity(size), size)
    }

    fn from_bytes(bytes: BytesMut, size: usize) -> Self {
        RecycledBuf {
            bytes,
            size,
            spare: BytesMut::new(),
            spare_size: 0,
            max_spare: MAX_SPARE_BYTES,
            unallocated: false,
        }
    }

    /// Keeps a spare of up to `bytes` rather than [`MAX_SPARE_BYTES`]: for
    /// the few buffers whose every allocation is larger (a server
    /// connection's, reading large values), which would otherwise let each
    /// one go and make a fresh one, in pages the kernel must fault in
    /// again once the allocator gives them back.
    pub(crate) fn keeping_spares_up_to(mut self, bytes: usize) -> Self {
        self.max_spare = bytes;
        self
    }

    /// Makes room for at least `room` more bytes after the ones held, as
    /// `BytesMut::reserve` does, but allocates only when neither this
    /// allocation nor the spare is free to take back.
    pub(crate) fn make_room(&mut self, room: usize) {
        if self.bytes.try_reclaim(room) {
            return;
        }
        if self.unallocated {
            // Parked (or never used): an allocation of the usual size from
            // the shelf, or a new one; no spare comes of it.
            self.unallocated = false;
            let size = self.size.max(self.bytes.len() + room);
            let mut fresh = take_shelved(size).unwrap_or_else(|| BytesMut::with_capacity(size));
            fresh.extend_from_slice(&self.bytes);
            self.size = fresh.capacity();
            self.bytes = fresh;
            return;
        }
        let needed = self.bytes.len() + room;
        if self.spare_size >= needed && self.spare.try_reclaim(needed) {
            self.spare.extend_from_slice(&self.bytes);
            std::mem::swap(&mut self.bytes, &mut self.spare);
            std::mem::swap(&mut self.size, &mut self.spare_size);
        } else {
            // A spare still held means more is in flight than two
            // allocations of this size carry: the next ones are larger.
            let grown = match self.spare_size {
                0 => self.size,
                _ => (self.size * 2).min(MAX_GROWN_BYTES).max(self.size),
            };
            let mut size = needed.max(grown);
            let mut fresh = match take_shelved(size) {
                Some(shelved) => {
                    size = shelved.capacity();
                    shelved
                }
                None => BytesMut::with_capacity(size),
            };
            fresh.extend_from_slice(&self.bytes);
            self.spare = std::mem::replace(&mut self.bytes, fresh);
            self.spare_size = std::mem::replace(&mut self.size, size);
        }
        // The bytes held were copied over: the spare keeps only what its
        // split-off pieces hold.
        self.spare.clear();
        if self.spare_size > self.max_spare {
            self.spare = BytesMut::new();
            self.spare_size = 0;
        }
    }
}

impl RecycledBuf {
    /// Gives the allocation in use back while the buffer holds nothing: to
    /// this thread's shelf when nothing else holds a piece of it (else it is
    /// left to those pieces). A buffer with a spare keeps both: only one
    /// that ran out of room with pieces in flight (a pipelining client's)
    /// has one, and taking turns between the two is what lets its bursts
    /// allocate nothing. The
    /// next [`RecycledBuf::make_room`] takes an allocation from the shelf
    /// (or makes one). Nothing happens while the buffer holds bytes.
    pub(crate) fn park(&mut self) {
        if !self.bytes.is_empty() || self.unallocated || self.spare_size > 0 {
            return;
        }
        let mut bytes = std::mem::take(&mut self.bytes);
        self.unallocated = true;
        if bytes.try_reclaim(self.size) {
            shelve(bytes);
        }
    }
}

impl Deref for RecycledBuf {
    type Target = BytesMut;

    fn deref(&self) -> &BytesMut {
        &self.bytes
    }
}

impl DerefMut for RecycledBuf {
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address of the allocation `buf` writes into next.
    fn spare_room_at(buf: &mut RecycledBuf) -> usize {
        buf.spare_capacity_mut().as_ptr() as usize
    }

    #[test]
    fn a_buffer_whose_pieces_are_dropped_is_used_again() {
        let mut buf = RecycledBuf::with_capacity(64);
        let first = spare_room_at(&mut buf);
        buf.extend_from_slice(&[b'a'; 60]);
        let piece = buf.split_to(60).freeze();
        drop(piece);
        buf.make_room(64);
        assert!(buf.capacity() >= 64);
        assert_eq!(spare_room_at(&mut buf), first);
    }

    #[test]
    fn two_allocations_take_turns_while_pieces_are_in_flight() {
        let mut buf = RecycledBuf::with_capacity(64);
        let first = spare_room_at(&mut buf);
        buf.extend_from_slice(&[b'a'; 60]);
        let held_first = buf.split_to(60).freeze();
        // The first allocation is held: a second one is made.
        buf.make_room(64);
        let second = spare_room_at(&mut buf);
        assert_ne!(first, second);
        buf.extend_from_slice(&[b'b'; 60]);
        let held_second = buf.split_to(56).freeze();
        drop(held_first);
        // The first is free again: the 4 bytes not split off move into it.
        buf.make_room(40);
        assert_eq!(&buf[..], b"bbbb");
        assert_eq!(buf.as_ptr() as usize, first);
        assert_eq!(&held_second[..], &[b'b'; 56][..]);
    }

    #[test]
    fn a_spare_still_held_is_left_alone_and_a_new_allocation_made() {
        let mut buf = RecycledBuf::with_capacity(64);
        buf.extend_from_slice(&[b'a'; 64]);
        let held_first = buf.split_to(64).freeze();
        buf.make_room(64);
        buf.extend_from_slice(&[b'b'; 64]);
        let held_second = buf.split_to(64).freeze();
        buf.make_room(64);
        buf.extend_from_slice(&[b'c'; 64]);
        // Every piece still reads what was written into it.
        assert_eq!(&held_first[..], &[b'a'; 64][..]);
        assert_eq!(&held_second[..], &[b'b'; 64][..]);
        assert_eq!(&buf[..], &[b'c'; 64][..]);
    }

    #[test]
    fn a_spare_still_held_makes_the_next_allocation_larger() {
        let mut buf = RecycledBuf::with_capacity(64);
        let mut held = Vec::new();
        for _ in 0..3 {
            let room = buf.capacity() - buf.len();
            buf.extend_from_slice(&vec![b'a'; room]);
            held.push(buf.split().freeze());
            buf.make_room(64);
        }
        // 64, then 64 (no spare yet), then 128 and 256 (the spare held).
        assert!(buf.capacity() >= 256, "capacity {}", buf.capacity());
        assert_eq!(buf.size, 256);
        assert!(held.iter().all(|piece| piece.iter().all(|&b| b == b'a')));
    }

    #[test]
    fn more_room_than_the_buffer_has_grows_it_and_keeps_its_bytes() {
        let mut buf = RecycledBuf::new(16);
        buf.extend_from_slice(b"partial");
        buf.make_room(1000);
        assert!(buf.capacity() - buf.len() >= 1000);
        assert_eq!(&buf[..], b"partial");
    }

    #[test]
    fn a_parked_buffer_holds_nothing_and_its_allocation_serves_the_next_owner() {
        let mut first = RecycledBuf::with_capacity(2048);
        let at = spare_room_at(&mut first);
        first.extend_from_slice(b"get k\r\n");
        let piece = first.split().freeze();
        drop(piece);
        first.park();
        assert_eq!(first.capacity(), 0);
        // Another buffer of the same size on this thread takes it.
        let mut second = RecycledBuf::new(2048);
        second.make_room(512);
        assert_eq!(spare_room_at(&mut second), at);
        // A buffer that holds bytes, or a piece still held, is not shelved.
        second.extend_from_slice(b"x");
        second.park();
        assert_eq!(&second[..], b"x");
        let mut third = RecycledBuf::with_capacity(2048);
        third.extend_from_slice(b"held");
        let held = third.split().freeze();
        third.park();
        let mut fourth = RecycledBuf::new(2048);
        fourth.make_room(512);
        assert_ne!(fourth.as_ptr(), held.as_ptr());
        assert_eq!(&held[..], b"held");
    }

    #[test]
    fn a_shelf_keeps_at_most_its_count_and_its_bytes() {
        // Many small buffers parked at once: the count bounds them.
        let mut shelf = Shelf::new();
        let kept = (0..MAX_SHELVED + 50)
            .filter(|_| shelf.keep(BytesMut::with_capacity(1024)).is_ok())
            .count();
        assert_eq!(kept, MAX_SHELVED);
        assert_eq!(shelf.count, MAX_SHELVED);
        // Many large ones: the bytes do, long before the count.
        let mut shelf = Shelf::new();
        let kept = (0..MAX_SHELVED)
            .filter(|_| {
                shelf
                    .keep(BytesMut::with_capacity(MAX_SHELVED_BYTES))
                    .is_ok()
            })
            .count();
        assert_eq!(kept, MAX_SHELF_BYTES / MAX_SHELVED_BYTES);
        assert!(shelf.bytes <= MAX_SHELF_BYTES);
        // Taking one makes room for one again; too large a one is never kept.
        let taken = shelf.take(MAX_SHELVED_BYTES).expect("a shelved buffer");
        assert!(shelf.keep(taken).is_ok());
        assert!(shelf
            .keep(BytesMut::with_capacity(MAX_SHELVED_BYTES + 1))
            .is_err());
        assert!(shelf.keep(BytesMut::new()).is_err());
        let held = |shelf: &Shelf| -> (usize, usize) {
            let stacks = shelf.sizes.iter().flat_map(|(_, stack)| stack.iter());
            (stacks.clone().count(), stacks.map(BytesMut::capacity).sum())
        };
        assert_eq!(held(&shelf), (shelf.count, shelf.bytes));
        // Shed to a few: the largest go first, and the counts follow.
        shelf.shed(1);
        assert_eq!(held(&shelf), (1, MAX_SHELVED_BYTES));
        shelf.keep(BytesMut::with_capacity(1024)).unwrap();
        shelf.shed(1);
        assert_eq!(held(&shelf), (1, 1024));
        assert_eq!((shelf.count, shelf.bytes), (1, 1024));
    }

    #[test]
    fn a_large_spare_is_let_go() {
        let mut buf = RecycledBuf::with_capacity(MAX_SPARE_BYTES + 1);
        buf.extend_from_slice(b"x");
        let held = buf.split_to(1).freeze();
        buf.make_room(MAX_SPARE_BYTES + 1);
        assert_eq!(buf.spare_size, 0);
        drop(held);
    }

    #[test]
    fn a_buffer_may_keep_a_larger_spare() {
        let mut buf = RecycledBuf::with_capacity(MAX_SPARE_BYTES + 1)
            .keeping_spares_up_to(4 * MAX_SPARE_BYTES);
        let first = spare_room_at(&mut buf);
        buf.extend_from_slice(b"x");
        let held = buf.split_to(1).freeze();
        buf.make_room(MAX_SPARE_BYTES + 1);
        assert_eq!(buf.spare_size, MAX_SPARE_BYTES + 1);
        // Once its piece is dropped, the spare takes the bytes back.
        drop(held);
        buf.extend_from_slice(&vec![b'y'; MAX_SPARE_BYTES]);
        let held_second = buf.split_to(MAX_SPARE_BYTES).freeze();
        buf.make_room(MAX_SPARE_BYTES + 1);
        assert_eq!(spare_room_at(&mut buf), first);
        drop(held_second);
    }
}
