//! The memcached text protocol as pure functions over bytes.
//!
//! Nothing in this module performs I/O or knows about tokio: the session hands it
//! a buffer and gets back a parsed request (with key ranges into that buffer) or a
//! rejection that carries the exact reply memcached itself would give. Behaviour is
//! checked against memcached 1.6.18 (see `shared/PROTOCOL-NOTES.md` and the
//! differential tests in `tests/`).

/// Longest reply line memring accepts from a backend. memcached's longest lines
/// are `VALUE` headers (a 250-byte key plus three numbers) and error messages.
pub const MAX_REPLY_LINE_BYTES: usize = 8 * 1024;

/// Largest value a backend may return: memcached's own hard item size limit
/// (`-I` accepts at most 1 GiB).
pub const MAX_REPLY_VALUE_BYTES: usize = 1024 * 1024 * 1024;

pub mod base64_key;
pub mod encode;
pub mod lease;
pub mod meta;
pub mod outcome;
pub mod reply;
pub mod request;
pub(crate) mod scan;

pub use reply::{
    frame_reply, Expect, LineKind, Piece, ReplyError, ReplyKind, ValueBlock, ValueBlocks,
};
pub use request::{parse_request, Rejection, Request};

/// The longest key memcached accepts (`KEY_MAX_LENGTH` in memcached).
pub const MAX_KEY_BYTES: usize = 250;

/// memcached's largest accepted declared value length: `INT_MAX - 2`, so that
/// the length plus the trailing `\r\n` still fits a signed 32-bit integer.
pub const MAX_DECLARED_VALUE_BYTES: i64 = i32::MAX as i64 - 2;

/// Default bound on a non-get command line, as in memcached (2048 bytes).
pub const DEFAULT_MAX_LINE_BYTES: usize = 2048;

/// Default bound on a `get`/`gets`/`gat`/`gats` line: long enough for 250 keys of
/// 250 bytes, short enough that a line without a newline cannot grow the buffer
/// without bound.
pub const DEFAULT_MAX_GET_LINE_BYTES: usize = 64 * 1024;

/// Default bound on a stored value, memcached's default item size (1 MiB).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1024 * 1024;

/// Default bound on keys in one retrieval: far more than clients send, few
/// enough that one request's key list stays small.
pub const DEFAULT_MAX_KEYS_PER_GET: usize = 10_000;

/// Limits enforced while parsing, before any data block is buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest command line (without data block) for non-get commands.
    pub max_line_bytes: usize,
    /// Longest command line for `get`, `gets`, `gat` and `gats`.
    pub max_get_line_bytes: usize,
    /// Largest value a storage command may carry.
    pub max_value_bytes: usize,
    /// Most keys one `get`/`gets`/`gat`/`gats` may ask for.
    pub max_keys_per_get: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            max_get_line_bytes: DEFAULT_MAX_GET_LINE_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_keys_per_get: DEFAULT_MAX_KEYS_PER_GET,
        }
    }
}

/// Every command memring understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Get,
    Gets,
    Gat,
    Gats,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    Version,
    Verbosity,
    FlushAll,
    Stats,
    Quit,
    /// `mg`: meta get.
    MetaGet,
    /// `ms`: meta set.
    MetaSet,
    /// `md`: meta delete.
    MetaDelete,
    /// `ma`: meta arithmetic.
    MetaArithmetic,
    /// `mn`: meta no-op, answered by memring in order.
    MetaNoop,
    /// `me`: meta debug, forwarded to the key's owner.
    MetaDebug,
}

impl Command {
    /// Every command, in the order of [`Command::index`].
    pub const ALL: [Command; 25] = [
        Command::Get,
        Command::Gets,
        Command::Gat,
        Command::Gats,
        Command::Set,
        Command::Add,
        Command::Replace,
        Command::Append,
        Command::Prepend,
        Command::Cas,
        Command::Delete,
        Command::Incr,
        Command::Decr,
        Command::Touch,
        Command::Version,
        Command::Verbosity,
        Command::FlushAll,
        Command::Stats,
        Command::Quit,
        Command::MetaGet,
        Command::MetaSet,
        Command::MetaDelete,
        Command::MetaArithmetic,
        Command::MetaNoop,
        Command::MetaDebug,
    ];

    /// How many commands there are: the length of per-command counter tables.
    pub const COUNT: usize = Command::ALL.len();

    /// A dense index for per-command tables. The match is exhaustive, so a new
    /// command cannot be added without an index (and `ALL` is checked against
    /// it in a test).
    #[inline]
    pub fn index(self) -> usize {
        match self {
            Command::Get => 0,
            Command::Gets => 1,
            Command::Gat => 2,
            Command::Gats => 3,
            Command::Set => 4,
            Command::Add => 5,
            Command::Replace => 6,
            Command::Append => 7,
            Command::Prepend => 8,
            Command::Cas => 9,
            Command::Delete => 10,
            Command::Incr => 11,
            Command::Decr => 12,
            Command::Touch => 13,
            Command::Version => 14,
            Command::Verbosity => 15,
            Command::FlushAll => 16,
            Command::Stats => 17,
            Command::Quit => 18,
            Command::MetaGet => 19,
            Command::MetaSet => 20,
            Command::MetaDelete => 21,
            Command::MetaArithmetic => 22,
            Command::MetaNoop => 23,
            Command::MetaDebug => 24,
        }
    }

    /// The command's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Command::Get => "get",
            Command::Gets => "gets",
            Command::Gat => "gat",
            Command::Gats => "gats",
            Command::Set => "set",
            Command::Add => "add",
            Command::Replace => "replace",
            Command::Append => "append",
            Command::Prepend => "prepend",
            Command::Cas => "cas",
            Command::Delete => "delete",
            Command::Incr => "incr",
            Command::Decr => "decr",
            Command::Touch => "touch",
            Command::Version => "version",
            Command::Verbosity => "verbosity",
            Command::FlushAll => "flush_all",
            Command::Stats => "stats",
            Command::Quit => "quit",
            Command::MetaGet => "mg",
            Command::MetaSet => "ms",
            Command::MetaDelete => "md",
            Command::MetaArithmetic => "ma",
            Command::MetaNoop => "mn",
            Command::MetaDebug => "me",
        }
    }

    /// The counter index of a meta command.
    pub fn of_meta(command: meta::MetaCommand) -> Command {
        match command {
            meta::MetaCommand::Get => Command::MetaGet,
            meta::MetaCommand::Set => Command::MetaSet,
            meta::MetaCommand::Delete => Command::MetaDelete,
            meta::MetaCommand::Arithmetic => Command::MetaArithmetic,
            meta::MetaCommand::Noop => Command::MetaNoop,
            meta::MetaCommand::Debug => Command::MetaDebug,
        }
    }

    /// Retrieval commands answer with `VALUE` blocks and one `END`; every other
    /// forwarded command answers with exactly one line.
    pub fn is_retrieval(self) -> bool {
        matches!(
            self,
            Command::Get | Command::Gets | Command::Gat | Command::Gats
        )
    }

    /// Commands that carry a data block after their line.
    pub fn is_storage(self) -> bool {
        matches!(
            self,
            Command::Set
                | Command::Add
                | Command::Replace
                | Command::Append
                | Command::Prepend
                | Command::Cas
        )
    }

    /// How a client finds the end of the reply to this command (lenient; the
    /// proxy itself frames strictly with [`reply::Expect`]).
    pub fn reply_kind(self) -> ReplyKind {
        if self.is_retrieval() {
            ReplyKind::Values
        } else {
            ReplyKind::Line
        }
    }

    /// Which one-line replies a server may send to this (non-retrieval)
    /// command; `None` for commands memring never forwards as one line.
    pub fn reply_line(self) -> Option<LineKind> {
        Some(match self {
            Command::Set
            | Command::Add
            | Command::Replace
            | Command::Append
            | Command::Prepend
            | Command::Cas => LineKind::Storage,
            Command::Delete => LineKind::Delete,
            Command::Incr | Command::Decr => LineKind::Arithmetic,
            Command::Touch => LineKind::Touch,
            Command::FlushAll | Command::Verbosity => LineKind::Ok,
            Command::Version => LineKind::Version,
            _ => return None,
        })
    }
}

/// Why a request was refused by the parser, in either dialect (classic and
/// meta). Each variant knows the reply memcached gives for it, so the proxy
/// answers bad input exactly as memcached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Unknown command or wrong number of tokens.
    #[error("ERROR")]
    UnknownCommand,
    /// A malformed line: bad key, bad number, bad length.
    #[error("CLIENT_ERROR bad command line format")]
    BadCommandLine,
    /// `delete` with a non-zero hold time or extra tokens.
    #[error("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]")]
    BadDeleteLine,
    /// `incr`/`decr` with a delta that is not an unsigned 64-bit number.
    #[error("CLIENT_ERROR invalid numeric delta argument")]
    InvalidDelta,
    /// `touch`, `gat`, `gats` or `flush_all` with a bad exptime.
    #[error("CLIENT_ERROR invalid exptime argument")]
    InvalidExptime,
    /// The data block was not followed by `\r\n`.
    #[error("CLIENT_ERROR bad data chunk")]
    BadDataChunk,
    /// The declared value length exceeds the configured item size.
    #[error("SERVER_ERROR object too large for cache")]
    ValueTooLarge,
    /// A retrieval with more keys than `Limits::max_keys_per_get`.
    #[error("CLIENT_ERROR bad command line format")]
    TooManyKeys,
    /// A binary-protocol request: memring speaks text only, and closes.
    #[error("CLIENT_ERROR binary protocol is not supported")]
    BinaryProtocol,
    /// No newline within the line bound: the connection is closed afterwards.
    #[error("CLIENT_ERROR line too long")]
    LineTooLong,
    /// An HTTP request line (an unknown command whose last token starts with
    /// `HTTP/`): closed without a reply, as memcached does.
    #[error("HTTP request line")]
    HttpRequest,
    // The meta dialect's own refusals (memcached 1.6.18's proto_text.c);
    // the shared ones above answer meta requests too.
    /// More than 19 tokens on an `ms`, `md` or `ma` line.
    #[error("CLIENT_ERROR options flags too long")]
    FlagsTooLong,
    /// More than 19 tokens on an `mg` line (its message has an extra word).
    #[error("CLIENT_ERROR options flags are too long")]
    GetFlagsTooLong,
    /// A flag seen twice, or a flag byte of 127 or more.
    #[error("CLIENT_ERROR duplicate flag")]
    DuplicateFlag,
    #[error("CLIENT_ERROR invalid flag")]
    InvalidFlag,
    /// `md` and `ma` report every flag error this way.
    #[error("CLIENT_ERROR invalid or duplicate flag")]
    InvalidOrDuplicateFlag,
    #[error("CLIENT_ERROR error decoding key")]
    KeyDecode,
    /// A bad number after `T`, `N`, `R` or `C`.
    #[error("CLIENT_ERROR bad token in command line format")]
    BadToken,
    #[error("CLIENT_ERROR incorrect length for M token")]
    ModeLength,
    #[error("CLIENT_ERROR invalid numeric initial value")]
    InitialValue,
    #[error("CLIENT_ERROR invalid numeric delta value")]
    DeltaValue,
    #[error("CLIENT_ERROR invalid mode for ms M token")]
    SetMode,
    #[error("CLIENT_ERROR invalid mode for ma M token")]
    ArithmeticMode,
    /// An `O` token longer than 32 bytes, `O` included.
    #[error("CLIENT_ERROR opaque token too long")]
    OpaqueTooLong,
}

impl ParseError {
    /// The reply line, including `\r\n`.
    pub fn reply(self) -> &'static [u8] {
        match self {
            ParseError::UnknownCommand => b"ERROR\r\n",
            ParseError::BadCommandLine | ParseError::TooManyKeys => {
                b"CLIENT_ERROR bad command line format\r\n"
            }
            ParseError::BadDeleteLine => {
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
            }
            ParseError::InvalidDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            ParseError::InvalidExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            ParseError::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            ParseError::ValueTooLarge => b"SERVER_ERROR object too large for cache\r\n",
            ParseError::LineTooLong => b"CLIENT_ERROR line too long\r\n",
            ParseError::BinaryProtocol => b"CLIENT_ERROR binary protocol is not supported\r\n",
            // Never sent: the rejection is silent.
            ParseError::HttpRequest => b"",
            ParseError::FlagsTooLong => b"CLIENT_ERROR options flags too long\r\n",
            ParseError::GetFlagsTooLong => b"CLIENT_ERROR options flags are too long\r\n",
            ParseError::DuplicateFlag => b"CLIENT_ERROR duplicate flag\r\n",
            ParseError::InvalidFlag => b"CLIENT_ERROR invalid flag\r\n",
            ParseError::InvalidOrDuplicateFlag => b"CLIENT_ERROR invalid or duplicate flag\r\n",
            ParseError::KeyDecode => b"CLIENT_ERROR error decoding key\r\n",
            ParseError::BadToken => b"CLIENT_ERROR bad token in command line format\r\n",
            ParseError::ModeLength => b"CLIENT_ERROR incorrect length for M token\r\n",
            ParseError::InitialValue => b"CLIENT_ERROR invalid numeric initial value\r\n",
            ParseError::DeltaValue => b"CLIENT_ERROR invalid numeric delta value\r\n",
            ParseError::SetMode => b"CLIENT_ERROR invalid mode for ms M token\r\n",
            ParseError::ArithmeticMode => b"CLIENT_ERROR invalid mode for ma M token\r\n",
            ParseError::OpaqueTooLong => b"CLIENT_ERROR opaque token too long\r\n",
        }
    }

    /// Whether the client connection stays usable after this error. Only a line
    /// that never ends cannot be resynchronised (memcached closes it too), and
    /// after an HTTP request line nothing the peer sends is a command.
    pub fn keeps_connection(self) -> bool {
        !matches!(
            self,
            ParseError::LineTooLong | ParseError::BinaryProtocol | ParseError::HttpRequest
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_indexes_are_dense_and_match_all() {
        for (i, command) in Command::ALL.iter().enumerate() {
            assert_eq!(command.index(), i, "{command:?}");
        }
    }
}
