//! Hand-off decisions for keys whose owner changed: after a membership change
//! the topology keeps the previous ring for a window (`handoff_ms`), and a
//! key whose previous owner differs from its new one is "moved". Reads of a
//! moved key fall through to the previous owner on a miss and copy the hit
//! to the new owner (see `route::Retrieval`); every other command runs the
//! small state machine [`Moved`] so it behaves as if the key had never moved.
//!
//! Pure: the session sends what a [`Step`] says and feeds the reply back.

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::error::BackendError;
use crate::protocol::encode::{forwardable, value_block, Outbound};
use crate::protocol::reply::{Expect, LineKind};
use crate::protocol::{Command, Request};

/// A reply from one server (the same as `route::CallResult`; this module sits
/// below `route`).
pub(crate) type CallResult = Result<Bytes, BackendError>;

/// Which owner of a moved key a step talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    New,
    Previous,
}

/// What to do next for a command on a moved key.
#[derive(Debug)]
// A step is made and consumed at once, never stored: boxing would only add
// an allocation per step.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Step {
    /// Send `copy` (if any: an `add` carrying the previous owner's value, no
    /// reply awaited) and then `lines` to `to`; feed the reply to `lines` back
    /// with [`Moved::on_reply`].
    Send {
        to: Owner,
        copy: Option<Outbound>,
        lines: Outbound,
        expect: Expect,
    },
    /// The client's reply.
    Answer(CallResult),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Removed from the previous owner, then from the new one.
    Delete,
    /// Run on the new owner; if the key is absent there, copy it from the
    /// previous owner and run again (`incr`, `decr`, `append`, `prepend`,
    /// `touch`, `replace`).
    RetryAfterCopy,
    /// Copy from the previous owner first, then run (`add`: it must not
    /// store over a value the previous owner still holds).
    CopyFirst,
    /// `cas` on the new owner; if it did not store there (the unique came
    /// from the previous owner, or the key is not on the new owner yet),
    /// `cas` on the previous owner and, if that stored, `set` the same value
    /// on the new owner.
    Cas,
    /// `set` on the new owner.
    Overwrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Start,
    /// Waiting for the first reply (new owner, or the previous owner for
    /// `delete`).
    First,
    /// Waiting for the previous owner's `get`.
    Fetch,
    /// Waiting for the final reply.
    Last,
    /// The command changed the key on its new owner; waiting for the
    /// previous owner to `delete` its now older copy before answering.
    Forget,
}

/// Whether a command on a moved key needs more than the new owner.
///
/// Every command that changes the key on its new owner is answered only once
/// the previous owner has deleted its copy: the previous owner's value is now
/// older than an acknowledged write, and a sidecar still on the old ring, or
/// this one after the change is undone, would read it there. A miss is
/// always allowed; a value older than an acknowledged write never is.
pub(crate) fn needs_handoff(command: Command) -> bool {
    kind_of(command).is_some()
}

fn kind_of(command: Command) -> Option<Kind> {
    match command {
        Command::Delete => Some(Kind::Delete),
        Command::Incr
        | Command::Decr
        | Command::Append
        | Command::Prepend
        | Command::Touch
        | Command::Replace => Some(Kind::RetryAfterCopy),
        Command::Add => Some(Kind::CopyFirst),
        Command::Cas => Some(Kind::Cas),
        Command::Set => Some(Kind::Overwrite),
        _ => None,
    }
}

/// One command on a moved key, in progress.
#[derive(Debug)]
pub(crate) struct Moved {
    kind: Kind,
    stage: Stage,
    request: Outbound,
    line_kind: LineKind,
    key: Bytes,
    /// The first reply, answered if nothing better comes.
    first: Option<CallResult>,
    /// `cas` stored on the previous owner: its data as a `set`.
    as_set: Option<Outbound>,
}

impl Moved {
    /// `None` when the command needs only the new owner. `as_set` is the
    /// request rewritten as a `set` (for `cas`; see `route::cas_as_set`).
    pub(crate) fn new(request: &Request, bytes: &Bytes, as_set: Option<Outbound>) -> Option<Moved> {
        let kind = kind_of(request.command)?;
        let key = bytes.slice_ref(request.key(bytes, 0));
        Some(Moved {
            kind,
            stage: Stage::Start,
            request: forwardable(bytes, request),
            line_kind: request.command.reply_line().unwrap_or(LineKind::Storage),
            key,
            first: None,
            as_set: as_set.filter(|_| kind == Kind::Cas),
        })
    }

    /// The first step.
    pub(crate) fn start(&mut self) -> Step {
        match self.kind {
            Kind::Delete => {
                self.stage = Stage::First;
                self.send(Owner::Previous, None)
            }
            Kind::RetryAfterCopy | Kind::Cas | Kind::Overwrite => {
                self.stage = Stage::First;
                self.send(Owner::New, None)
            }
            Kind::CopyFirst => self.fetch(),
        }
    }

    /// The reply to the last step's `lines`. `now` is the Unix time, for the
    /// remaining TTL of a copy beyond 30 days.
    pub(crate) fn on_reply(&mut self, result: CallResult, now: u64) -> Step {
        match (self.kind, self.stage) {
            (_, Stage::Forget) => {
                // Answered whatever the previous owner said: if it failed,
                // readers of the old ring cannot reach it either.
                Step::Answer(self.first.take().unwrap_or(result))
            }
            (Kind::Delete, Stage::First) => {
                self.first = Some(result);
                self.stage = Stage::Last;
                self.send(Owner::New, None)
            }
            (Kind::Delete, _) => {
                let previous = self.first.take().unwrap_or_else(|| result.clone());
                Step::Answer(merge_delete(result, previous))
            }
            (Kind::RetryAfterCopy, Stage::First) => {
                if is_absent(&result) {
                    self.first = Some(result);
                    self.fetch()
                } else {
                    self.answer_changed(result)
                }
            }
            (Kind::Overwrite, Stage::First) => self.answer_changed(result),
            (Kind::RetryAfterCopy | Kind::CopyFirst, Stage::Fetch) => {
                // The copy keeps the remaining TTL; an item that expires
                // within the second is not copied (0 would keep it forever).
                let copy = match &result {
                    Ok(reply) => read_through_hit(&self.key, reply, false, now)
                        .and_then(|hit| copy_block(&hit.block, hit.exptime.as_deref()?)),
                    Err(_) => None,
                };
                match (copy, self.first.take()) {
                    (Some(copy), _) => {
                        self.stage = Stage::Last;
                        self.send(Owner::New, Some(copy))
                    }
                    // Not on the previous owner either: the first answer
                    // stands (or, for `add`, run it now).
                    (None, Some(first)) => Step::Answer(first),
                    (None, None) => {
                        self.stage = Stage::Last;
                        self.send(Owner::New, None)
                    }
                }
            }
            (Kind::Cas, Stage::First) => {
                let retry = matches!(&result, Ok(r) if r.starts_with(b"NOT_FOUND") || r.starts_with(b"EXISTS"));
                if retry {
                    self.first = Some(result);
                    self.stage = Stage::Fetch;
                    self.send(Owner::Previous, None)
                } else {
                    self.answer_changed(result)
                }
            }
            (Kind::Cas, Stage::Fetch) => {
                let stored = matches!(&result, Ok(r) if r.as_ref() == b"STORED\r\n");
                match self.as_set.take() {
                    Some(set) if stored => {
                        self.stage = Stage::Last;
                        self.first = Some(result);
                        Step::Send {
                            to: Owner::New,
                            copy: None,
                            lines: set,
                            expect: Expect::Line(LineKind::Storage),
                        }
                    }
                    _ => Step::Answer(self.first.take().unwrap_or(result)),
                }
            }
            // The previous owner's STORED answers once the new owner holds
            // the same value (and the previous owner no longer does).
            (Kind::Cas, _) => self.answer_changed(result),
            (Kind::RetryAfterCopy, _) => self.answer_changed(result),
            (_, _) => Step::Answer(result),
        }
    }

    /// Answers `result`, first deleting the previous owner's copy when the
    /// command changed the key on the new owner.
    fn answer_changed(&mut self, result: CallResult) -> Step {
        if !changed(&result) {
            return Step::Answer(result);
        }
        self.first = Some(result);
        self.stage = Stage::Forget;
        let mut line = BytesMut::with_capacity(self.key.len() + 9);
        line.put_slice(b"delete ");
        line.put_slice(&self.key);
        line.put_slice(b"\r\n");
        Step::Send {
            to: Owner::Previous,
            copy: None,
            lines: smallvec::smallvec![line.freeze()],
            expect: Expect::Line(LineKind::Delete),
        }
    }

    /// Asks the previous owner for the key with what a copy needs: value,
    /// client flags and remaining TTL.
    fn fetch(&mut self) -> Step {
        self.stage = Stage::Fetch;
        Step::Send {
            to: Owner::Previous,
            copy: None,
            expect: Expect::Meta {
                command: crate::protocol::meta::MetaCommand::Get,
                quiet: false,
                replied: false,
            },
            lines: smallvec::smallvec![fetch_line(&self.key, false, false)],
        }
    }

    fn send(&self, to: Owner, copy: Option<Outbound>) -> Step {
        Step::Send {
            to,
            copy,
            lines: self.request.clone(),
            expect: Expect::Line(self.line_kind),
        }
    }
}

/// The reply says the command changed the key: stored, a new number,
/// touched. Misses, `EXISTS`, errors and failures changed nothing.
fn changed(result: &CallResult) -> bool {
    match result {
        Ok(reply) => {
            !(reply.starts_with(b"NOT_")
                || reply.starts_with(b"EXISTS")
                || reply.starts_with(b"ERROR")
                || reply.starts_with(b"CLIENT_ERROR")
                || reply.starts_with(b"SERVER_ERROR"))
        }
        Err(_) => false,
    }
}

/// `NOT_FOUND` / `NOT_STORED`: the key is not on the server asked.
fn is_absent(result: &CallResult) -> bool {
    matches!(result, Ok(r) if r.starts_with(b"NOT_FOUND") || r.starts_with(b"NOT_STORED"))
}

/// A `delete` on both owners answers `DELETED` if either deleted; an error
/// of the new owner is passed on (the key may still be there); otherwise the
/// new owner's reply.
pub(crate) fn merge_delete(new: CallResult, previous: CallResult) -> CallResult {
    let deleted = |r: &CallResult| matches!(r, Ok(b) if b.as_ref() == b"DELETED\r\n");
    let failed = |r: &CallResult| match r {
        Ok(b) => b.starts_with(b"SERVER_ERROR") || b.starts_with(b"ERROR"),
        Err(_) => true,
    };
    if deleted(&new) || failed(&new) || !deleted(&previous) {
        new
    } else {
        previous
    }
}

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n` as an `add` (without
/// `noreply`): the header, then the data block shared with the value (no
/// copy). `None` for anything that is not one well-formed value block (a
/// miss).
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
    let mut line = BytesMut::with_capacity(header.len() + exptime.len() + 8);
    line.put_slice(b"add ");
    line.put_slice(key);
    line.put_u8(b' ');
    line.put_slice(flags);
    line.put_u8(b' ');
    line.put_slice(exptime);
    line.put_u8(b' ');
    line.put_slice(length);
    line.put_slice(b"\r\n");
    Some(smallvec::smallvec![
        line.freeze(),
        block.slice(header_end + 2..)
    ])
}

/// A read-through hit: the `VALUE` block the client gets (with the cas when
/// asked), and the exptime its copy is stored with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadThrough {
    pub block: Bytes,
    /// `None` when the item expires within the second: no copy then (an
    /// exptime of 0 would keep it forever).
    pub exptime: Option<Bytes>,
}

/// Longest relative exptime memcached takes; larger ones are Unix times.
const MAX_RELATIVE_EXPTIME: i64 = 60 * 60 * 24 * 30;

/// Reads the reply to a [`fetch_line`] asked with `with_cas` (`VA <len>
/// f<flags> t<ttl> [c<cas>]`, then the data) for a classic `get`/`gets`:
/// `Some` for a hit, `None` for anything else. `now` is the Unix time, for a
/// remaining TTL beyond 30 days.
pub(crate) fn read_through_hit(
    key: &[u8],
    reply: &[u8],
    with_cas: bool,
    now: u64,
) -> Option<ReadThrough> {
    let value = ValueReply::parse(reply)?;
    let flags = value.number::<u32>(b'f')?;
    let ttl = value.number::<i64>(b't')?;
    let cas = if with_cas {
        Some(value.number::<u64>(b'c')?)
    } else {
        None
    };
    Some(ReadThrough {
        block: value_block(key, flags, value.data, cas),
        exptime: copy_exptime(ttl, now).map(Bytes::from),
    })
}

/// A meta `VA` reply: its length token, its return flags, and its data (with
/// the `\r\n` after it).
struct ValueReply<'a> {
    length: &'a [u8],
    flags: SmallVec<[&'a [u8]; 8]>,
    data: &'a [u8],
}

impl<'a> ValueReply<'a> {
    /// `None` unless `reply` is one whole `VA` reply.
    fn parse(reply: &'a [u8]) -> Option<ValueReply<'a>> {
        let header_end = memchr::memmem::find(reply, b"\r\n")?;
        let mut tokens = reply[..header_end].split(|&b| b == b' ');
        if tokens.next()? != b"VA" {
            return None;
        }
        let length = tokens.next()?;
        let data_len: usize = std::str::from_utf8(length).ok()?.parse().ok()?;
        let data = reply.get(header_end + 2..)?;
        if data.len() != data_len + 2 || !data.ends_with(b"\r\n") {
            return None;
        }
        Some(ValueReply {
            length,
            flags: tokens.collect(),
            data,
        })
    }

    /// The value of the last return flag `flag` (asked last, so memring's
    /// own when it added it).
    fn number<T: std::str::FromStr>(&self, flag: u8) -> Option<T> {
        let token = self.flags.iter().rev().find(|t| t.first() == Some(&flag))?;
        std::str::from_utf8(&token[1..]).ok()?.parse().ok()
    }
}

/// The `mg` that fetches a moved key from its previous owner for a copy:
/// value, client flags and remaining TTL (see [`meta_read_through_hit`] with
/// [`AddedFlags::FETCH`]), and with `with_cas` its cas (for a classic `gets`,
/// [`read_through_hit`]).
pub(crate) fn fetch_line(key_token: &[u8], base64: bool, with_cas: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 10);
    line.put_slice(b"mg ");
    line.put_slice(key_token);
    if base64 {
        line.put_slice(b" b");
    }
    if with_cas {
        line.put_slice(b" c");
    }
    line.put_slice(b"\r\n");
    meta_read_through_line(&line, |_| false).0
}

/// The `md` that removes a moved key from its previous owner before a write
/// replaces it on the new one.
pub(crate) fn forget_line(key_token: &[u8], base64: bool) -> Bytes {
    let mut line = BytesMut::with_capacity(key_token.len() + 8);
    line.put_slice(b"md ");
    line.put_slice(key_token);
    if base64 {
        line.put_slice(b" b");
    }
    line.put_slice(b"\r\n");
    line.freeze()
}

/// Which flags memring appended to a client's `mg` for its read-through from
/// the previous owner: what a copy needs (`v`, `f`, `t`) and the client did
/// not ask for. Their return tokens come last, in this order (memcached
/// answers flags in the order they were asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AddedFlags {
    pub value: bool,
    pub flags: bool,
    pub ttl: bool,
}

impl AddedFlags {
    /// What [`fetch_line`] adds: all three.
    pub(crate) const FETCH: AddedFlags = AddedFlags {
        value: true,
        flags: true,
        ttl: true,
    };
}

/// The client's `mg` line (`line`, with its `\r\n`) with `v f t` added where
/// missing, for asking a moved key's previous owner.
pub(crate) fn meta_read_through_line(line: &[u8], has: impl Fn(u8) -> bool) -> (Bytes, AddedFlags) {
    let added = AddedFlags {
        value: !has(b'v'),
        flags: !has(b'f'),
        ttl: !has(b't'),
    };
    let mut out = BytesMut::with_capacity(line.len() + 6);
    out.put_slice(line.strip_suffix(b"\r\n").unwrap_or(line));
    for (flag, add) in [(b'v', added.value), (b'f', added.flags), (b't', added.ttl)] {
        if add {
            out.put_slice(&[b' ', flag]);
        }
    }
    out.put_slice(b"\r\n");
    (out.freeze(), added)
}

/// The previous owner's hit (`VA`) to a [`meta_read_through_line`]: the reply
/// the client's own `mg` would have had (the added tokens, and the value if
/// it was not asked for, removed), and the `ms … ME` (add) that copies the
/// key to its new owner with its flags and remaining TTL (`None` when it
/// expires within the second). `None` for anything but such a hit.
pub(crate) fn meta_read_through_hit(
    reply: &[u8],
    added: AddedFlags,
    key_token: &[u8],
    base64: bool,
    now: u64,
) -> Option<(Bytes, Option<Outbound>)> {
    let value = ValueReply::parse(reply)?;
    // memcached puts its state markers (`W` win, `X` stale, `Z` a win
    // already handed out) after every flag: they stay in the client's reply,
    // and an item in such a state is not copied, since a copy would be a
    // fresh item and lose its invalidation or lease.
    let markers = value
        .flags
        .iter()
        .rev()
        .take_while(|t| matches!(t, [b'W' | b'X' | b'Z']))
        .count();
    let returned = value.flags.len() - markers;
    let ours = usize::from(added.flags) + usize::from(added.ttl);
    let kept = returned.checked_sub(ours)?;
    let (flags, ttl) = (value.number::<u32>(b'f')?, value.number::<i64>(b't')?);
    let mut client = BytesMut::with_capacity(reply.len());
    if added.value {
        client.put_slice(b"HD");
    } else {
        client.put_slice(b"VA ");
        client.put_slice(value.length);
    }
    for token in value.flags[..kept].iter().chain(&value.flags[returned..]) {
        client.put_u8(b' ');
        client.put_slice(token);
    }
    client.put_slice(b"\r\n");
    if !added.value {
        client.put_slice(value.data);
    }
    let exptime = if markers == 0 {
        copy_exptime(ttl, now)
    } else {
        None
    };
    let copy = exptime.map(|exptime| {
        let mut line = BytesMut::with_capacity(key_token.len() + 48);
        line.put_slice(b"ms ");
        line.put_slice(key_token);
        let data_len = value.data.len() - 2;
        line.put_slice(format!(" {data_len} F{flags} ME").as_bytes());
        if exptime != "0" {
            line.put_slice(b" T");
            line.put_slice(exptime.as_bytes());
        }
        if base64 {
            line.put_slice(b" b");
        }
        line.put_slice(b"\r\n");
        let copy: Outbound = smallvec::smallvec![line.freeze(), Bytes::copy_from_slice(value.data)];
        copy
    });
    Some((client.freeze(), copy))
}

/// The exptime a copy of an item with `ttl` seconds left is stored with
/// (`-1`: none): `None` when it expires within the second, since 0 would
/// keep it forever; beyond 30 days a Unix time, as memcached reads it.
fn copy_exptime(ttl: i64, now: u64) -> Option<String> {
    match ttl {
        -1 => Some("0".into()),
        t if t <= 0 => None,
        t if t <= MAX_RELATIVE_EXPTIME => Some(t.to_string()),
        t => Some(now.saturating_add(t.unsigned_abs()).to_string()),
    }
}

/// A read-through copy of a moved key, and what checks it once it has
/// landed: a write of the key (through another worker or sidecar) may have
/// reached the new owner before the copy did, and the copy would then bring
/// back a value older than that write. The check reads the key again where
/// it was copied from; if it changed there (the write's hand-off deletes
/// it), the copy is taken back from the new owner, unless something newer
/// replaced it meanwhile.
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
}

impl ReadCopy {
    /// The `mg` that reads the copied key back: its value, and with
    /// `with_cas` its cas (to take the copy back with).
    pub(crate) fn check_line(&self, with_cas: bool) -> Bytes {
        let mut line = BytesMut::with_capacity(self.key.len() + 12);
        line.put_slice(b"mg ");
        line.put_slice(&self.key);
        line.put_slice(if self.base64 { b" b v" } else { b" v" });
        if with_cas {
            line.put_slice(b" c");
        }
        line.put_slice(b"\r\n");
        line.freeze()
    }

    /// Whether `reply` to a [`ReadCopy::check_line`] holds the copied value.
    pub(crate) fn holds(&self, reply: &[u8]) -> bool {
        let data = self.wire.last().map_or(&[][..], |d| &d[..]);
        ValueReply::parse(reply).is_some_and(|value| value.data == data)
    }

    /// The `md` that takes the copy back, given the new owner's reply to a
    /// [`ReadCopy::check_line`] with cas: only while it still holds the
    /// copied value, and compared by cas, so a newer write that replaced it
    /// in between stays.
    pub(crate) fn undo_line(&self, owner_reply: &[u8]) -> Option<Bytes> {
        if !self.holds(owner_reply) {
            return None;
        }
        let cas = ValueReply::parse(owner_reply)?.number::<u64>(b'c')?;
        let mut line = BytesMut::with_capacity(self.key.len() + 28);
        line.put_slice(b"md ");
        line.put_slice(&self.key);
        if self.base64 {
            line.put_slice(b" b");
        }
        line.put_slice(format!(" C{cas}\r\n").as_bytes());
        Some(line.freeze())
    }
}

/// Copies: how many `add`s a step sent, and how the new owner answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyOutcome {
    /// `STORED`: the new owner now holds the value.
    Made,
    /// `NOT_STORED`: the new owner already had a (newer) value; nothing lost.
    Skipped,
    /// Error or no answer.
    Failed,
}

/// How the reply to a copy counts.
pub(crate) fn copy_outcome(result: &CallResult) -> CopyOutcome {
    match result {
        // `add` answers STORED / NOT_STORED, `ms … ME` HD / NS.
        Ok(r) if r.as_ref() == b"STORED\r\n" || r.as_ref() == b"HD\r\n" => CopyOutcome::Made,
        Ok(r) if r.as_ref() == b"NOT_STORED\r\n" || r.as_ref() == b"NS\r\n" => CopyOutcome::Skipped,
        _ => CopyOutcome::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_through_hits_become_value_blocks_and_keep_their_expiry() {
        let now = 1_800_000_000;
        let hit = |reply: &[u8], with_cas| read_through_hit(b"k", reply, with_cas, now);
        let got = hit(b"VA 2 f5 t100\r\n10\r\n", false).unwrap();
        assert_eq!(&got.block[..], b"VALUE k 5 2\r\n10\r\n");
        assert_eq!(got.exptime.as_deref(), Some(&b"100"[..]));
        let got = hit(b"VA 1 f0 t-1 c77\r\nx\r\n", true).unwrap();
        assert_eq!(&got.block[..], b"VALUE k 0 1 77\r\nx\r\n");
        assert_eq!(got.exptime.as_deref(), Some(&b"0"[..]), "no expiry");
        // Expiring within the second: served, not copied.
        assert_eq!(hit(b"VA 1 f0 t0\r\nx\r\n", false).unwrap().exptime, None);
        // Beyond 30 days memcached reads an exptime as a Unix time.
        let far = 60 * 60 * 24 * 40;
        let got = hit(format!("VA 1 f0 t{far}\r\nx\r\n").as_bytes(), false).unwrap();
        assert_eq!(got.exptime, Some(Bytes::from((now + far).to_string())));
        // Misses, errors, and replies that do not add up are not hits.
        for reply in [
            &b"EN\r\n"[..],
            b"SERVER_ERROR out of memory\r\n",
            b"VA 3 f0 t-1\r\nx\r\n",
            b"VA 1 t-1\r\nx\r\n",
            b"VA 1 f0 t-1\r\nx\r\n",
        ] {
            let with_cas = reply == b"VA 1 f0 t-1\r\nx\r\n";
            assert_eq!(
                hit(reply, with_cas),
                None,
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
        assert_eq!(&fetch_line(b"k", false, true)[..], b"mg k c v f t\r\n");
    }

    #[test]
    fn meta_read_throughs_answer_as_the_client_asked_and_copy_with_the_ttl() {
        let now = 1_800_000_000;
        let asked = |line: &[u8], flags: &[u8]| {
            let flags = flags.to_vec();
            meta_read_through_line(line, move |f| flags.contains(&f))
        };
        // Nothing a copy needs was asked for: all three added.
        let (line, added) = asked(b"mg k s O7 k\r\n", b"sOk");
        assert_eq!(&line[..], b"mg k s O7 k v f t\r\n");
        let (reply, copy) =
            meta_read_through_hit(b"VA 2 s2 O7 kk f5 t100\r\nab\r\n", added, b"k", false, now)
                .unwrap();
        assert_eq!(&reply[..], b"HD s2 O7 kk\r\n");
        let copy = copy.unwrap();
        assert_eq!(&copy[0][..], b"ms k 2 F5 ME T100\r\n");
        assert_eq!(&copy[1][..], b"ab\r\n");
        // The client's own v, f and t stay; a base64 key is copied as one.
        let (line, added) = asked(b"mg Zm9v t v b f q\r\n", b"tvbfq");
        assert_eq!(&line[..], b"mg Zm9v t v b f q\r\n");
        let (reply, copy) =
            meta_read_through_hit(b"VA 1 t-1 b f0\r\nx\r\n", added, b"Zm9v", true, now).unwrap();
        assert_eq!(&reply[..], b"VA 1 t-1 b f0\r\nx\r\n");
        assert_eq!(&copy.unwrap()[0][..], b"ms Zm9v 1 F0 ME b\r\n");
        // Expiring within the second: answered, not copied; misses are not hits.
        let (_, added) = asked(b"mg k v\r\n", b"v");
        let (reply, copy) =
            meta_read_through_hit(b"VA 1 f0 t0\r\nx\r\n", added, b"k", false, now).unwrap();
        assert_eq!((&reply[..], copy), (&b"VA 1\r\nx\r\n"[..], None));
        assert_eq!(
            meta_read_through_hit(b"EN\r\n", added, b"k", false, now),
            None
        );
        assert_eq!(
            &fetch_line(b"Zm9v", true, false)[..],
            b"mg Zm9v b v f t\r\n"
        );
        assert_eq!(asked(b"mg k\r\n", b"").1, AddedFlags::FETCH);
    }

    #[test]
    fn an_invalidated_or_leased_item_keeps_its_markers_and_is_not_copied() {
        let now = 1_800_000_000;
        let (_, added) = meta_read_through_line(b"mg k v c\r\n", |f| b"vc".contains(&f));
        // As memcached 1.6.18 answers `mg k v c f t` after `md k I`.
        for (reply, client) in [
            (
                &b"VA 2 c5 f0 t-1 X W\r\nhi\r\n"[..],
                &b"VA 2 c5 X W\r\nhi\r\n"[..],
            ),
            (b"VA 2 c5 f0 t-1 Z X\r\nhi\r\n", b"VA 2 c5 Z X\r\nhi\r\n"),
            (b"VA 0 c6 f0 t30 W\r\n\r\n", b"VA 0 c6 W\r\n\r\n"),
        ] {
            let (answer, copy) = meta_read_through_hit(reply, added, b"k", false, now).unwrap();
            assert_eq!(&answer[..], client, "{reply:?}");
            assert!(copy.is_none(), "{reply:?} copied");
        }
    }
    use crate::protocol::{parse_request, Limits};

    fn moved(line: &'static [u8]) -> Moved {
        let bytes = Bytes::from_static(line);
        let (request, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        // What `route::cas_as_set` makes of the cas request in these tests.
        let as_set: Outbound = smallvec::smallvec![
            Bytes::from_static(b"set k 0 0 1\r\n"),
            Bytes::from_static(b"z\r\n")
        ];
        Moved::new(&request, &bytes, Some(as_set)).unwrap()
    }

    fn ok(reply: &'static [u8]) -> CallResult {
        Ok(Bytes::from_static(reply))
    }

    fn sent(step: &Step) -> (Owner, bool, Vec<u8>) {
        match step {
            Step::Send {
                to, copy, lines, ..
            } => (*to, copy.is_some(), lines.concat()),
            Step::Answer(r) => panic!("answered {r:?}"),
        }
    }

    fn answer(step: Step) -> CallResult {
        match step {
            Step::Answer(r) => r,
            other => panic!("still sending {other:?}"),
        }
    }

    const NOW: u64 = 1_800_000_000;

    /// The step that deletes the previous owner's copy, answered `reply`.
    fn forgets(step: Step, m: &mut Moved, expected: &[u8]) {
        assert_eq!(
            sent(&step),
            (Owner::Previous, false, b"delete k\r\n".to_vec())
        );
        // Whatever the previous owner says, the new owner's reply answers.
        assert_eq!(
            answer(m.on_reply(ok(b"NOT_FOUND\r\n"), NOW)).unwrap(),
            expected
        );
    }

    #[test]
    fn every_command_but_reads_needs_a_hand_off() {
        assert!(needs_handoff(Command::Set));
        assert!(!needs_handoff(Command::Get));
        assert!(needs_handoff(Command::Incr));
    }

    #[test]
    fn set_stores_on_the_new_owner_then_deletes_the_previous_owners_copy() {
        let mut m = moved(b"set k 0 0 1\r\nx\r\n");
        assert_eq!(
            sent(&m.start()),
            (Owner::New, false, b"set k 0 0 1\r\nx\r\n".to_vec())
        );
        let step = m.on_reply(ok(b"STORED\r\n"), NOW);
        forgets(step, &mut m, b"STORED\r\n");
        // A set that did not store leaves the previous owner alone.
        let mut failed = moved(b"set k 0 0 1\r\nx\r\n");
        failed.start();
        let reply = ok(b"SERVER_ERROR out of memory\r\n");
        assert!(answer(failed.on_reply(reply, NOW)).is_ok());
    }

    #[test]
    fn delete_removes_from_both_and_reports_either() {
        let mut m = moved(b"delete k\r\n");
        assert_eq!(sent(&m.start()).0, Owner::Previous);
        assert_eq!(sent(&m.on_reply(ok(b"DELETED\r\n"), NOW)).0, Owner::New);
        assert_eq!(
            answer(m.on_reply(ok(b"NOT_FOUND\r\n"), NOW)).unwrap(),
            &b"DELETED\r\n"[..]
        );
    }

    #[test]
    fn delete_failing_on_the_new_owner_is_an_error() {
        let failed: CallResult = Err(BackendError {
            server: "new".into(),
            kind: crate::error::BackendErrorKind::Timeout,
        });
        assert!(merge_delete(failed, ok(b"DELETED\r\n")).is_err());
        let not_found = merge_delete(ok(b"NOT_FOUND\r\n"), ok(b"NOT_FOUND\r\n"));
        assert_eq!(not_found.unwrap(), &b"NOT_FOUND\r\n"[..]);
    }

    #[test]
    fn incr_copies_from_the_previous_owner_with_its_ttl_then_runs_again() {
        let mut m = moved(b"incr k 1\r\n");
        assert_eq!(
            sent(&m.start()),
            (Owner::New, false, b"incr k 1\r\n".to_vec())
        );
        let fetch = sent(&m.on_reply(ok(b"NOT_FOUND\r\n"), NOW));
        assert_eq!(fetch, (Owner::Previous, false, b"mg k v f t\r\n".to_vec()));
        let step = m.on_reply(ok(b"VA 2 f3 t4\r\n41\r\n"), NOW);
        match &step {
            Step::Send {
                to, copy, lines, ..
            } => {
                assert_eq!(*to, Owner::New);
                assert_eq!(copy.as_ref().unwrap().concat(), b"add k 3 4 2\r\n41\r\n");
                assert_eq!(lines.concat(), b"incr k 1\r\n");
            }
            other => panic!("{other:?}"),
        }
        let step = m.on_reply(ok(b"42\r\n"), NOW);
        forgets(step, &mut m, b"42\r\n");
    }

    #[test]
    fn a_copy_keeps_no_expiry_and_one_about_to_expire_is_not_made() {
        let mut m = moved(b"append k 0 0 1\r\nx\r\n");
        m.start();
        m.on_reply(ok(b"NOT_STORED\r\n"), NOW);
        let step = m.on_reply(ok(b"VA 1 f0 t-1\r\ny\r\n"), NOW);
        let Step::Send { copy, .. } = &step else {
            panic!("{step:?}")
        };
        assert_eq!(copy.as_ref().unwrap().concat(), b"add k 0 0 1\r\ny\r\n");
        let mut expiring = moved(b"append k 0 0 1\r\nx\r\n");
        expiring.start();
        expiring.on_reply(ok(b"NOT_STORED\r\n"), NOW);
        assert_eq!(
            answer(expiring.on_reply(ok(b"VA 1 f0 t0\r\ny\r\n"), NOW)).unwrap(),
            &b"NOT_STORED\r\n"[..]
        );
    }

    #[test]
    fn incr_on_a_key_nowhere_answers_the_new_owners_not_found() {
        let mut m = moved(b"incr k 1\r\n");
        m.start();
        m.on_reply(ok(b"NOT_FOUND\r\n"), NOW);
        assert_eq!(
            answer(m.on_reply(ok(b"EN\r\n"), NOW)).unwrap(),
            &b"NOT_FOUND\r\n"[..]
        );
    }

    #[test]
    fn add_checks_the_previous_owner_first() {
        let mut m = moved(b"add k 0 0 1\r\nx\r\n");
        assert_eq!(sent(&m.start()).0, Owner::Previous);
        let (to, copy, _) = sent(&m.on_reply(ok(b"VA 1 f0 t-1\r\ny\r\n"), NOW));
        assert_eq!((to, copy), (Owner::New, true));
        let mut fresh = moved(b"add k 0 0 1\r\nx\r\n");
        fresh.start();
        let (to, copy, lines) = sent(&fresh.on_reply(ok(b"EN\r\n"), NOW));
        assert_eq!((to, copy), (Owner::New, false));
        assert_eq!(lines, b"add k 0 0 1\r\nx\r\n");
    }

    #[test]
    fn cas_with_a_previous_owners_unique_stores_there_then_sets_the_new_owner() {
        let mut m = moved(b"cas k 0 0 1 7\r\nz\r\n");
        assert_eq!(sent(&m.start()).0, Owner::New);
        assert_eq!(sent(&m.on_reply(ok(b"EXISTS\r\n"), NOW)).0, Owner::Previous);
        let (to, _, lines) = sent(&m.on_reply(ok(b"STORED\r\n"), NOW));
        assert_eq!((to, lines), (Owner::New, b"set k 0 0 1\r\nz\r\n".to_vec()));
        let step = m.on_reply(ok(b"STORED\r\n"), NOW);
        forgets(step, &mut m, b"STORED\r\n");
        let mut stale = moved(b"cas k 0 0 1 7\r\nz\r\n");
        stale.start();
        stale.on_reply(ok(b"EXISTS\r\n"), NOW);
        assert_eq!(
            answer(stale.on_reply(ok(b"EXISTS\r\n"), NOW)).unwrap(),
            &b"EXISTS\r\n"[..]
        );
    }

    #[test]
    fn value_blocks_become_adds_and_misses_do_not() {
        let copy_as_add =
            |block: &'static [u8], exptime| copy_block(&Bytes::from_static(block), exptime);
        let copy = copy_as_add(b"VALUE key 5 3 99\r\nabc\r\n", b"60").unwrap();
        assert_eq!(copy.concat(), b"add key 5 60 3\r\nabc\r\n");
        assert!(copy_as_add(b"", b"0").is_none());
        assert!(copy_as_add(b"VALUE key 5 4\r\nabc\r\n", b"0").is_none());
        assert!(copy_as_add(b"END\r\n", b"0").is_none());
    }

    #[test]
    fn copy_replies_are_counted_by_kind() {
        assert_eq!(copy_outcome(&ok(b"STORED\r\n")), CopyOutcome::Made);
        assert_eq!(copy_outcome(&ok(b"NOT_STORED\r\n")), CopyOutcome::Skipped);
        assert_eq!(
            copy_outcome(&ok(b"SERVER_ERROR x\r\n")),
            CopyOutcome::Failed
        );
    }

    #[test]
    fn a_copy_is_checked_by_value_and_taken_back_only_by_its_own_cas() {
        let copy = ReadCopy {
            owner: 1,
            wire: copy_block(&Bytes::from_static(b"VALUE k 0 2\r\nv1\r\n"), b"0").unwrap(),
            source: 0,
            key: Bytes::from_static(b"k"),
            base64: false,
        };
        assert_eq!(&copy.check_line(false)[..], b"mg k v\r\n");
        assert_eq!(&copy.check_line(true)[..], b"mg k v c\r\n");
        assert!(copy.holds(b"VA 2\r\nv1\r\n"));
        // Changed or gone where it was read from.
        assert!(!copy.holds(b"VA 2\r\nv2\r\n"));
        assert!(!copy.holds(b"EN\r\n"));
        assert!(!copy.holds(b"SERVER_ERROR out of memory\r\n"));
        assert_eq!(
            copy.undo_line(b"VA 2 c41\r\nv1\r\n").as_deref(),
            Some(&b"md k C41\r\n"[..])
        );
        // Something newer replaced the copy on the new owner: it stays.
        assert_eq!(copy.undo_line(b"VA 2 c42\r\nv3\r\n"), None);
        assert_eq!(copy.undo_line(b"EN\r\n"), None);
        let base64 = ReadCopy {
            key: Bytes::from_static(b"aw=="),
            base64: true,
            ..copy
        };
        assert_eq!(&base64.check_line(true)[..], b"mg aw== b v c\r\n");
        assert_eq!(
            base64.undo_line(b"VA 2 c7\r\nv1\r\n").as_deref(),
            Some(&b"md aw== b C7\r\n"[..])
        );
    }
}
