//! What a framed reply says, in one word: the first token of its first line
//! (both dialects), read here so that no other room matches reply bytes.
//! Meta statuses stay themselves (`HD` means stored to `ms`, deleted to
//! `md`, a hit to `mg`): the predicates below say what each reader needs,
//! in both dialects at once where the question is the same.
//!
//! The backend connection classifies each reply as it frames it and hands
//! the [`Outcome`] over with the bytes (the reply slot's result, then a
//! [`Reply`]): readers outside `protocol/` and `backend/` match the outcome,
//! never the bytes.

use bytes::Bytes;

/// The kind of a reply, from its first token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing: a quiet meta command's success, or a `noreply` write.
    Nothing,
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Touched,
    /// `OK` (`flush_all`, `verbosity`).
    Ok,
    /// A classic `VALUE` block (a hit).
    Value,
    /// A classic retrieval's `END` (after the values, or a miss).
    End,
    /// `incr`/`decr`'s new value.
    Number,
    Hd,
    Va,
    En,
    Ns,
    Ex,
    Nf,
    Mn,
    /// `CLIENT_ERROR cannot increment or decrement non-numeric value`.
    NotANumber,
    ClientError,
    ServerError,
    Error,
    /// Anything else.
    Other,
}

/// memcached's refusal of `incr`, `decr` or `ma` on a value that is not a
/// number (both dialects say it alike).
const NOT_A_NUMBER: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value";

impl Outcome {
    /// The outcome of `reply` (one reply, as framed).
    pub fn of(reply: &[u8]) -> Outcome {
        if reply.is_empty() {
            return Outcome::Nothing;
        }
        let end = reply
            .iter()
            .position(|&b| b == b' ' || b == b'\r')
            .unwrap_or(reply.len());
        match &reply[..end] {
            b"STORED" => Outcome::Stored,
            b"NOT_STORED" => Outcome::NotStored,
            b"EXISTS" => Outcome::Exists,
            b"NOT_FOUND" => Outcome::NotFound,
            b"DELETED" => Outcome::Deleted,
            b"TOUCHED" => Outcome::Touched,
            b"OK" => Outcome::Ok,
            b"VALUE" => Outcome::Value,
            b"END" => Outcome::End,
            b"HD" => Outcome::Hd,
            b"VA" => Outcome::Va,
            b"EN" => Outcome::En,
            b"NS" => Outcome::Ns,
            b"EX" => Outcome::Ex,
            b"NF" => Outcome::Nf,
            b"MN" => Outcome::Mn,
            b"CLIENT_ERROR" if reply.starts_with(NOT_A_NUMBER) => Outcome::NotANumber,
            b"CLIENT_ERROR" => Outcome::ClientError,
            b"SERVER_ERROR" => Outcome::ServerError,
            b"ERROR" => Outcome::Error,
            token if !token.is_empty() && token.iter().all(u8::is_ascii_digit) => Outcome::Number,
            _ => Outcome::Other,
        }
    }

    /// An error line: the request or the server failed.
    pub fn is_error(self) -> bool {
        matches!(
            self,
            Outcome::Error | Outcome::ClientError | Outcome::NotANumber | Outcome::ServerError
        )
    }

    /// A client error (the request was refused as written).
    pub fn is_client_error(self) -> bool {
        matches!(self, Outcome::ClientError | Outcome::NotANumber)
    }

    /// An `add`, `replace`, `append` or `prepend` (or `ms` in those modes)
    /// that did not store: `NOT_STORED`, `NS`.
    pub fn not_stored(self) -> bool {
        matches!(self, Outcome::NotStored | Outcome::Ns)
    }

    /// The key was not there: `NOT_FOUND`, `NF`.
    pub fn not_found(self) -> bool {
        matches!(self, Outcome::NotFound | Outcome::Nf)
    }

    /// A compare-and-swap whose unique did not match: `EXISTS`, `EX`.
    pub fn exists(self) -> bool {
        matches!(self, Outcome::Exists | Outcome::Ex)
    }

    /// A write that took effect, in either dialect: `STORED`, `DELETED`,
    /// `TOUCHED`, `HD`, and nothing (a quiet meta success).
    pub fn done(self) -> bool {
        matches!(
            self,
            Outcome::Stored | Outcome::Deleted | Outcome::Touched | Outcome::Hd | Outcome::Nothing
        )
    }

    /// A meta read's miss (`EN`, or nothing for a quiet `mg`).
    pub fn meta_miss(self) -> bool {
        matches!(self, Outcome::En | Outcome::Nothing)
    }

    /// A meta command that took effect: `HD`, `VA` (a value returned), or
    /// nothing (a quiet success).
    pub fn meta_succeeded(self) -> bool {
        matches!(self, Outcome::Hd | Outcome::Va | Outcome::Nothing)
    }

    /// A storage command that stored: `STORED`, or in the meta dialect
    /// (`meta`) a success (nothing, for a quiet `ms`). No meta status
    /// answers a classic command, nor `STORED` a meta one.
    pub fn stored_in(self, meta: bool) -> bool {
        if meta {
            self.meta_succeeded()
        } else {
            self == Outcome::Stored
        }
    }

    /// A compare-and-swap refused for want of the key (`NOT_FOUND`, `NF`)
    /// or of its unique (`EXISTS`, `EX`): during a hand-off the unique may
    /// be another server's.
    pub fn cas_refused(self) -> bool {
        self.not_found() || self.exists()
    }
}

/// One server's reply as framed, with what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub outcome: Outcome,
    pub bytes: Bytes,
}

impl Reply {
    /// A reply whose outcome is known (the framer's, or memring's own line).
    pub fn new(outcome: Outcome, bytes: Bytes) -> Reply {
        Reply { outcome, bytes }
    }

    /// A reply memring writes itself (or a test's), classified here from
    /// its bytes: never a reply a server sent, which comes classified.
    pub fn made(bytes: Bytes) -> Reply {
        Reply {
            outcome: Outcome::of(&bytes),
            bytes,
        }
    }

    /// [`Reply::made`] of static bytes.
    pub fn from_static(bytes: &'static [u8]) -> Reply {
        Reply::made(Bytes::from_static(bytes))
    }

    /// Nothing: a quiet meta success, or a `noreply` write.
    pub fn nothing() -> Reply {
        Reply::new(Outcome::Nothing, Bytes::new())
    }
}

/// Nothing (see [`Reply::nothing`]).
impl Default for Reply {
    fn default() -> Reply {
        Reply::nothing()
    }
}

/// A reply equals the bytes it holds, whatever it says.
impl PartialEq<[u8]> for Reply {
    fn eq(&self, other: &[u8]) -> bool {
        self.bytes == other
    }
}

impl PartialEq<&[u8]> for Reply {
    fn eq(&self, other: &&[u8]) -> bool {
        self.bytes == *other
    }
}

/// The reply's bytes, to write or read a field from.
impl std::ops::Deref for Reply {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_and_cas_refusals_read_alike_in_both_dialects() {
        for (meta, yes, refused, other) in [
            (
                false,
                &b"STORED\r\n"[..],
                [&b"NOT_FOUND\r\n"[..], b"EXISTS\r\n"],
                &b"NOT_STORED\r\n"[..],
            ),
            (true, b"HD\r\n", [b"NF\r\n", b"EX\r\n"], b"NS\r\n"),
        ] {
            assert!(Outcome::of(yes).stored_in(meta));
            assert!(!Outcome::of(other).stored_in(meta) && !Outcome::of(other).cas_refused());
            for reply in refused {
                assert!(Outcome::of(reply).cas_refused() && !Outcome::of(reply).stored_in(meta));
            }
        }
        assert!(
            Outcome::of(b"").stored_in(true),
            "a quiet ms that stored says nothing"
        );
        assert!(
            !Outcome::of(b"HD\r\n").stored_in(false),
            "no meta status answers a classic set"
        );
    }

    #[test]
    fn each_first_token_names_its_outcome() {
        let cases: &[(&[u8], Outcome)] = &[
            (b"", Outcome::Nothing),
            (b"STORED\r\n", Outcome::Stored),
            (b"NOT_STORED\r\n", Outcome::NotStored),
            (b"EXISTS\r\n", Outcome::Exists),
            (b"NOT_FOUND\r\n", Outcome::NotFound),
            (b"DELETED\r\n", Outcome::Deleted),
            (b"TOUCHED\r\n", Outcome::Touched),
            (b"OK\r\n", Outcome::Ok),
            (b"VALUE k 0 1\r\na\r\n", Outcome::Value),
            (b"END\r\n", Outcome::End),
            (b"42\r\n", Outcome::Number),
            (b"HD\r\n", Outcome::Hd),
            (b"HD c4 f0\r\n", Outcome::Hd),
            (b"VA 1 f0\r\na\r\n", Outcome::Va),
            (b"EN\r\n", Outcome::En),
            (b"NS\r\n", Outcome::Ns),
            (b"EX k\r\n", Outcome::Ex),
            (b"NF O9\r\n", Outcome::Nf),
            (b"MN\r\n", Outcome::Mn),
            (
                b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                Outcome::NotANumber,
            ),
            (b"CLIENT_ERROR bad data chunk\r\n", Outcome::ClientError),
            (b"SERVER_ERROR out of memory\r\n", Outcome::ServerError),
            (b"ERROR\r\n", Outcome::Error),
            (b"ENDX\r\n", Outcome::Other),
            (b"HDX\r\n", Outcome::Other),
        ];
        for &(reply, outcome) in cases {
            assert_eq!(
                Outcome::of(reply),
                outcome,
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn the_predicates_ask_both_dialects_at_once() {
        assert!(Outcome::of(b"NS\r\n").not_stored() && Outcome::of(b"NOT_STORED\r\n").not_stored());
        assert!(Outcome::of(b"NF\r\n").not_found() && Outcome::of(b"NOT_FOUND\r\n").not_found());
        assert!(Outcome::of(b"EX\r\n").exists() && Outcome::of(b"EXISTS\r\n").exists());
        assert!(Outcome::of(b"").done() && Outcome::of(b"HD\r\n").done());
        assert!(!Outcome::of(b"END\r\n").meta_miss() && Outcome::of(b"EN\r\n").meta_miss());
        assert!(Outcome::of(b"SERVER_ERROR x\r\n").is_error());
        assert!(!Outcome::of(b"SERVER_ERROR x\r\n").is_client_error());
    }
}
