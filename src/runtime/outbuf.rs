//! Bytes waiting to be written to one socket, in order: small pieces are copied
//! together (cheaper than one iovec each), large ones are kept as the `Bytes`
//! they arrived in and written in place with `writev`. Used for client replies
//! and for requests on their way to a server. No I/O here.
//!
//! The small pieces since the last large one are written straight from the
//! buffer they were copied into, behind the chunks: a one-key reply is
//! written without making a chunk of it (a `BytesMut::split`, a reference
//! count taken and dropped, a list entry).

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use crate::runtime::recycled::RecycledBuf;

/// Pieces at least this long are written in place rather than copied.
const ZERO_COPY_BYTES: usize = 4096;
/// The least the small pieces' buffer allocates: a few dozen short replies
/// or requests, so that a busy queue takes back its earlier allocations
/// (see [`RecycledBuf`]) rather than growing from a few bytes.
const FIRST_SCRATCH_BYTES: usize = 1024;
/// Room made before memring's own lines are written.
const LINE_ROOM_BYTES: usize = 128;

/// An ordered queue of bytes to write.
#[derive(Debug)]
pub(crate) struct OutQueue {
    chunks: VecDeque<Bytes>,
    /// Small pieces since the last chunk.
    scratch: RecycledBuf,
    /// Bytes in `chunks` (not counting `scratch`).
    sealed: usize,
}

impl Default for OutQueue {
    fn default() -> Self {
        OutQueue {
            chunks: VecDeque::new(),
            scratch: RecycledBuf::new(FIRST_SCRATCH_BYTES),
            sealed: 0,
        }
    }
}

impl OutQueue {
    /// Appends `piece`, copying it if it is small.
    pub(crate) fn push(&mut self, piece: Bytes) {
        if piece.len() >= ZERO_COPY_BYTES {
            self.seal();
            self.sealed += piece.len();
            self.chunks.push_back(piece);
        } else {
            self.push_slice(&piece);
        }
    }

    /// Appends a piece its caller keeps: a small one is copied without
    /// taking a reference to it (no reference count touched), a large one
    /// is shared.
    pub(crate) fn push_shared(&mut self, piece: &Bytes) {
        if piece.len() >= ZERO_COPY_BYTES {
            self.push(piece.clone());
        } else {
            self.push_slice(piece);
        }
    }

    /// Appends a borrowed piece (always copied).
    pub(crate) fn push_slice(&mut self, piece: &[u8]) {
        self.scratch.make_room(piece.len());
        self.scratch.extend_from_slice(piece);
    }

    /// Where memring's own lines are written.
    pub(crate) fn scratch(&mut self) -> &mut BytesMut {
        self.scratch.make_room(LINE_ROOM_BYTES);
        &mut self.scratch
    }

    /// Gives back the scratch buffer's allocation while nothing is queued
    /// (see `RecycledBuf::park`), and the chunk list's: an idle client holds
    /// neither. The list's few dozen bytes matter less than where they sit:
    /// made during a burst of clients, one between each two parked buffers
    /// keeps the pages around it from going back to the kernel.
    pub(crate) fn park(&mut self) {
        if self.is_empty() {
            self.scratch.park();
            if self.chunks.capacity() > 0 {
                self.chunks = VecDeque::new();
            }
        }
    }

    /// Moves the small pieces into the chunk list; returns the bytes queued.
    /// Only needed before a large piece or an append: the writes take the
    /// small pieces where they are.
    pub(crate) fn seal(&mut self) -> usize {
        if !self.scratch.is_empty() {
            let small = self.scratch.split().freeze();
            self.sealed += small.len();
            self.chunks.push_back(small);
        }
        self.sealed
    }

    /// Moves everything queued in `other` to the end of this queue.
    pub(crate) fn append(&mut self, other: &mut OutQueue) {
        if other.is_empty() {
            return;
        }
        other.seal();
        self.seal();
        self.sealed += other.sealed;
        other.sealed = 0;
        self.chunks.append(&mut other.chunks);
    }

    /// Bytes queued, sealed or not.
    pub(crate) fn len(&self) -> usize {
        self.sealed + self.scratch.len()
    }

    /// Nothing queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A client's replies are rendered straight into its queue.
impl crate::protocol::encode::ReplyWriter for OutQueue {
    fn piece(&mut self, piece: Bytes) {
        self.push(piece);
    }

    fn text(&mut self) -> &mut BytesMut {
        self.scratch()
    }
}

/// The chunks, then the small pieces behind them, for `write_buf`
/// (vectored writes).
impl Buf for OutQueue {
    fn remaining(&self) -> usize {
        self.len()
    }

    fn chunk(&self) -> &[u8] {
        self.chunks
            .front()
            .map_or(&self.scratch[..], |chunk| &chunk[..])
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let small = (!self.scratch.is_empty()).then_some(&self.scratch[..]);
        let pieces = self.chunks.iter().map(|chunk| &chunk[..]).chain(small);
        let mut filled = 0;
        for (slot, piece) in dst.iter_mut().zip(pieces) {
            *slot = std::io::IoSlice::new(piece);
            filled += 1;
        }
        filled
    }

    fn advance(&mut self, mut count: usize) {
        while count > 0 {
            let Some(front) = self.chunks.front_mut() else {
                assert!(count <= self.scratch.len(), "advance within remaining");
                if count == self.scratch.len() {
                    // The usual whole write: the buffer's room is free
                    // again from its start.
                    self.scratch.clear();
                } else {
                    self.scratch.advance(count);
                }
                return;
            };
            if count < front.len() {
                front.advance(count);
                self.sealed -= count;
                return;
            }
            count -= front.len();
            self.sealed -= front.len();
            self.chunks.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_kept_across_copied_and_zero_copy_pieces() {
        let mut queue = OutQueue::default();
        let large = Bytes::from(vec![b'v'; ZERO_COPY_BYTES]);
        queue.push(Bytes::from_static(b"STORED\r\n"));
        queue.push(large.clone());
        queue.scratch().extend_from_slice(b"OK\r\n");
        queue.push(Bytes::from_static(b"END\r\n"));
        assert_eq!(queue.len(), 8 + large.len() + 4 + 5);
        let total = queue.seal();
        assert_eq!(total, 8 + large.len() + 4 + 5);
        let mut written = Vec::new();
        // Drain it in uneven steps, as partial writes would.
        while queue.has_remaining() {
            let step = queue.chunk().len().min(1000);
            written.extend_from_slice(&queue.chunk()[..step]);
            queue.advance(step);
        }
        let mut expected = b"STORED\r\n".to_vec();
        expected.extend_from_slice(&large);
        expected.extend_from_slice(b"OK\r\nEND\r\n");
        assert_eq!(written, expected);
        assert_eq!(queue.seal(), 0);
        assert!(queue.is_empty());
    }

    #[test]
    fn small_pieces_are_written_in_place_behind_the_chunks() {
        let mut queue = OutQueue::default();
        queue.push(Bytes::from_static(b"VALUE k 0 1\r\n"));
        assert_eq!(queue.remaining(), 13, "unsealed bytes are written too");
        assert_eq!(queue.chunk(), b"VALUE k 0 1\r\n");
        queue.advance(6);
        let large = Bytes::from(vec![b'v'; ZERO_COPY_BYTES]);
        queue.push(large.clone());
        queue.push(Bytes::from_static(b"END\r\n"));
        let mut slices = [std::io::IoSlice::new(&[]); 4];
        assert_eq!(queue.chunks_vectored(&mut slices), 3);
        assert_eq!(&slices[0][..], b"k 0 1\r\n");
        assert_eq!(slices[1].as_ptr(), large.as_ptr());
        assert_eq!(&slices[2][..], b"END\r\n");
        // A write that ends inside the small pieces.
        queue.advance(7 + large.len() + 2);
        assert_eq!(queue.remaining(), 3);
        assert_eq!(queue.chunk(), b"D\r\n");
        queue.advance(3);
        assert!(queue.is_empty());
        assert!(!queue.has_remaining());
        // The buffer takes back the room the written pieces used.
        queue.push(Bytes::from_static(b"STORED\r\n"));
        assert_eq!(queue.chunk(), b"STORED\r\n");
    }

    /// A piece the caller keeps: a small one is copied and no reference to
    /// it stays in the queue; a large one is queued in place.
    #[test]
    fn a_kept_piece_is_copied_when_small_and_shared_when_large() {
        let mut queue = OutQueue::default();
        let small = Bytes::from(b"get k\r\n".to_vec());
        let large = Bytes::from(vec![b'v'; ZERO_COPY_BYTES]);
        queue.push_shared(&small);
        assert!(small.is_unique(), "the queue holds no reference to it");
        queue.push_shared(&large);
        assert!(!large.is_unique(), "queued in place");
        queue.seal();
        assert_eq!(queue.chunks.len(), 2);
        assert_eq!(&queue.chunks[0][..], &small[..]);
        assert_eq!(queue.chunks[1].as_ptr(), large.as_ptr());
    }
}
