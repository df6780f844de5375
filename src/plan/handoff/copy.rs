//! A copy of a moved key made through a lease, so it never brings back a
//! value older than a write: the lease, the check where it was read, then
//! the fill that replaces the lease or the take-back that removes it; and
//! how the new owner's replies to those count.

use bytes::{BufMut, Bytes, BytesMut};

use super::lines::{delete_line, hd_number, probed_lease};
use super::read_through::ValueReply;
use super::CallResult;
use crate::protocol::encode::Outbound;
use crate::protocol::lease;
use crate::protocol::outcome::{Outcome, Reply};

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n` as the copy its
/// new owner is sent: `ms <key> <bytes> F<flags> ME [T<exptime>] c`, stored
/// only where the key is absent (a newer value written there meanwhile is
/// never overwritten), answering the copy's cas, by which it can be taken
/// back exactly. The data block is shared with the value (no copy). `None`
/// for anything that is not one well-formed value block (a miss).
pub(crate) fn copy_block(block: &Bytes, exptime: &[u8]) -> Option<Outbound> {
    let header_end = memchr::memmem::find(block, b"\r\n")?;
    let header = &block[..header_end];
    let mut fields = header.split(|&b| b == b' ').filter(|f| !f.is_empty());
    if fields.next()? != b"VALUE" {
        return None;
    }
    let (key, flags, length) = (fields.next()?, fields.next()?, fields.next()?);
    let data_len: usize = std::str::from_utf8(length).ok()?.parse().ok()?;
    if block.len() != header_end + 2 + data_len + 2 {
        return None;
    }
    let mut line = BytesMut::with_capacity(header.len() + exptime.len() + 12);
    line.put_slice(b"ms ");
    line.put_slice(key);
    line.put_u8(b' ');
    line.put_slice(length);
    line.put_slice(b" F");
    line.put_slice(flags);
    line.put_slice(b" ME");
    if exptime != b"0" {
        line.put_slice(b" T");
        line.put_slice(exptime);
    }
    line.put_slice(b" c\r\n");
    Some(smallvec::smallvec![
        line.freeze(),
        block.slice(header_end + 2..)
    ])
}

/// A read-through copy of a moved key, made through a lease: a write of the
/// key (through another worker or sidecar) may reach the new owner before
/// the copy does, and the copy would then bring back a value older than
/// that write. So the new owner first gets a lease (a placeholder every
/// reader takes for a miss, stored only where the key is absent), the key
/// is read again where it was copied from, and only if it still holds the
/// value does the copy replace the lease, by the lease's cas: a write or
/// delete that reached the new owner after the lease makes the copy fail.
/// If the source changed, the lease is taken back (by its cas).
#[derive(Debug, Clone)]
pub(crate) struct ReadCopy {
    /// The new owner, and what it is sent (the last part is the value's data
    /// with its `\r\n`).
    pub owner: usize,
    pub wire: Outbound,
    /// The server the value was read from.
    pub source: usize,
    /// The key as a meta token, and whether that token is base64.
    pub key: Bytes,
    pub base64: bool,
    /// A `gat`'s or `gats`'s exptime: the read changed the key's TTL, which
    /// another sidecar's lease on the new owner must not keep from it (see
    /// [`ReadCopy::touch_line`]).
    pub touch: Option<Bytes>,
}

impl ReadCopy {
    /// For a `gat` copy whose lease found the key held on the new owner:
    /// `mg <key> T<exptime> c f s`, which touches what is there and shows
    /// whether it is another sidecar's lease (its cas then replaced by this
    /// copy, which carries the new TTL) or a value (now touched).
    pub(crate) fn touch_line(&self) -> Option<Bytes> {
        let exptime = self.touch.as_ref()?;
        let mut line = BytesMut::with_capacity(self.key.len() + exptime.len() + 16);
        line.put_slice(b"mg ");
        line.put_slice(&self.key);
        if self.base64 {
            line.put_slice(b" b");
        }
        line.put_slice(b" T");
        line.put_slice(exptime);
        line.put_slice(b" c f s\r\n");
        Some(line.freeze())
    }

    /// The cas of the lease a [`ReadCopy::touch_line`]'s reply shows.
    pub(crate) fn touched_lease(reply: &Reply) -> Option<u64> {
        probed_lease(reply)
    }

    /// See [`check_line`].
    pub(crate) fn check_line(&self) -> Bytes {
        check_line(&self.key, self.base64)
    }

    /// Whether `reply` to a [`ReadCopy::check_line`] holds the copied value.
    pub(crate) fn holds(&self, reply: &Reply) -> bool {
        holds(&self.wire, reply)
    }

    /// The `ms` that places the copy's lease on the new owner (see
    /// `protocol::lease`): only where the key is absent, answering its cas.
    pub(crate) fn lease_line(&self) -> Bytes {
        lease::lease_request(&self.key, self.base64)
    }

    /// The copy as the `ms` that replaces its lease, compared by the cas the
    /// lease landed with (`C<lease>` instead of `ME`): a write or delete that
    /// reached the lease in between makes it fail instead of being undone.
    pub(crate) fn fill(&self, lease: u64) -> Outbound {
        fill_wire(&self.wire, lease)
    }

    /// The `md` that takes the lease back from the new owner, by the cas it
    /// landed with, so a write that replaced it in between stays.
    pub(crate) fn take_back_line(&self, lease: u64) -> Bytes {
        delete_line(&self.key, self.base64, Some(lease))
    }
}

/// A copy (`ms … ME … c`, then its data) as the `ms` that replaces its lease
/// (cas `lease`).
pub(super) fn fill_wire(copy: &Outbound, lease: u64) -> Outbound {
    let mut wire = copy.clone();
    if let Some(line) = wire.first_mut() {
        *line = cas_instead_of_add(line, lease);
    }
    wire
}

/// A copy's `ms … ME … c` line with `ME` and `c` dropped and `C<cas>` added.
fn cas_instead_of_add(line: &[u8], cas: u64) -> Bytes {
    let line = line.strip_suffix(b"\r\n").unwrap_or(line);
    let mut out = BytesMut::with_capacity(line.len() + 24);
    for (i, token) in line.split(|&b| b == b' ').enumerate() {
        // After `ms <key> <len>`, memring's own flags.
        if i >= 3 && (token == b"ME" || token == b"c") {
            continue;
        }
        if i > 0 {
            out.put_u8(b' ');
        }
        out.put_slice(token);
    }
    out.put_slice(format!(" C{cas}\r\n").as_bytes());
    out.freeze()
}

/// The `mg` that reads a copied key again where it was copied from: its
/// value. `u` leaves the item where it is in the server's LRU: a check is
/// not a use, and an item moving between LRUs could be missed by the
/// window's closing sweep.
fn check_line(key_token: &[u8], base64: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 12);
    line.put_slice(b"mg ");
    line.put_slice(key_token);
    line.put_slice(if base64 { b" b v u\r\n" } else { b" v u\r\n" });
    line.freeze()
}

/// Whether `reply` to a [`check_line`] holds the value `copy` carried (its
/// last part is the data with its `\r\n`).
fn holds(copy: &Outbound, reply: &Reply) -> bool {
    let data = copy.last().map_or(&[][..], |d| &d[..]);
    ValueReply::parse(reply).is_some_and(|value| value.data == data)
}

/// Copies: how many a step sent, and how the new owner answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyOutcome {
    /// `HD`: the new owner now holds the value.
    Made,
    /// `NS`: the new owner already had a (newer) value; nothing lost.
    Skipped,
    /// Error or no answer.
    Failed,
}

/// How the reply to a copy (`ms … ME c`) counts.
pub(crate) fn copy_outcome(result: &CallResult) -> CopyOutcome {
    match result {
        Ok(r) if r.outcome == Outcome::Hd => CopyOutcome::Made,
        Ok(r) if r.outcome == Outcome::Ns => CopyOutcome::Skipped,
        _ => CopyOutcome::Failed,
    }
}

/// How the reply to a lease's fill (`ms … C<lease>`) counts: `EX` or `NF`
/// mean a write or delete reached the lease first, which the copy leaves as
/// it is, as an add that found the key does.
pub(crate) fn fill_outcome(result: &CallResult) -> CopyOutcome {
    match result {
        Ok(r) if matches!(r.outcome, Outcome::Ex | Outcome::Nf) => CopyOutcome::Skipped,
        _ => copy_outcome(result),
    }
}

/// The cas a copy landed with (`HD … c<cas>`).
pub(crate) fn landed_cas(result: &CallResult) -> Option<u64> {
    hd_number(result.as_ref().ok()?, b'c')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Reply::from_static(reply))
    }

    #[test]
    fn value_blocks_become_adds_that_answer_their_cas_and_misses_do_not() {
        let copy_of =
            |block: &'static [u8], exptime| copy_block(&Bytes::from_static(block), exptime);
        let copy = copy_of(b"VALUE key 5 3 99\r\nabc\r\n", b"60").unwrap();
        assert_eq!(copy.concat(), b"ms key 3 F5 ME T60 c\r\nabc\r\n");
        // No expiry: no `T` (`T0` would mean the same).
        let copy = copy_of(b"VALUE key 0 3\r\nabc\r\n", b"0").unwrap();
        assert_eq!(copy.concat(), b"ms key 3 F0 ME c\r\nabc\r\n");
        assert!(copy_of(b"", b"0").is_none());
        assert!(copy_of(b"VALUE key 5 4\r\nabc\r\n", b"0").is_none());
        assert!(copy_of(b"END\r\n", b"0").is_none());
    }

    #[test]
    fn copy_replies_are_counted_by_kind_and_give_the_copys_cas() {
        assert_eq!(copy_outcome(&ok(b"HD c41\r\n")), CopyOutcome::Made);
        assert_eq!(landed_cas(&ok(b"HD c41\r\n")), Some(41));
        assert_eq!(landed_cas(&ok(b"HD O5 c41\r\n")), Some(41));
        assert_eq!(copy_outcome(&ok(b"HD\r\n")), CopyOutcome::Made);
        assert_eq!(landed_cas(&ok(b"HD\r\n")), None);
        assert_eq!(copy_outcome(&ok(b"NS c0\r\n")), CopyOutcome::Skipped);
        assert_eq!(landed_cas(&ok(b"NS c0\r\n")), None);
        assert_eq!(
            copy_outcome(&ok(b"SERVER_ERROR x\r\n")),
            CopyOutcome::Failed
        );
        assert_eq!(copy_outcome(&ok(b"HDX\r\n")), CopyOutcome::Failed);
    }

    #[test]
    fn a_copy_replaces_its_lease_by_cas_and_takes_it_back_by_cas() {
        let copy = ReadCopy {
            owner: 1,
            wire: copy_block(&Bytes::from_static(b"VALUE k 3 2\r\nv1\r\n"), b"60").unwrap(),
            source: 0,
            key: Bytes::from_static(b"k"),
            base64: false,
            touch: None,
        };
        let lease = copy.lease_line();
        assert!(lease.starts_with(b"ms k 24 F1835821873 T5 ME c\r\n"));
        assert_eq!(&copy.check_line()[..], b"mg k v u\r\n");
        assert!(copy.holds(&Reply::from_static(b"VA 2\r\nv1\r\n")));
        // Changed or gone where it was read from.
        assert!(!copy.holds(&Reply::from_static(b"VA 2\r\nv2\r\n")));
        assert!(!copy.holds(&Reply::from_static(b"EN\r\n")));
        assert!(!copy.holds(&Reply::from_static(b"SERVER_ERROR out of memory\r\n")));
        // The value with its flags and TTL, stored only over the lease.
        let fill = copy.fill(41);
        assert_eq!(&fill[0][..], b"ms k 2 F3 T60 C41\r\n");
        assert_eq!(&fill[1][..], b"v1\r\n");
        assert_eq!(&copy.take_back_line(41)[..], b"md k C41\r\n");
        // A write or delete reached the lease first: the copy leaves it.
        for reply in [&b"EX\r\n"[..], b"NF\r\n", b"NS\r\n"] {
            assert_eq!(fill_outcome(&ok(reply)), CopyOutcome::Skipped);
        }
        assert_eq!(fill_outcome(&ok(b"HD\r\n")), CopyOutcome::Made);
        let base64 = ReadCopy {
            key: Bytes::from_static(b"aw=="),
            base64: true,
            wire: smallvec::smallvec![
                Bytes::from_static(b"ms aw== 2 F0 ME b c\r\n"),
                Bytes::from_static(b"v1\r\n")
            ],
            ..copy
        };
        assert!(base64
            .lease_line()
            .starts_with(b"ms aw== 24 F1835821873 T5 ME c b\r\n"));
        assert_eq!(&base64.check_line()[..], b"mg aw== b v u\r\n");
        assert_eq!(&base64.fill(7)[0][..], b"ms aw== 2 F0 b C7\r\n");
        assert_eq!(&base64.take_back_line(7)[..], b"md aw== b C7\r\n");
    }
}
