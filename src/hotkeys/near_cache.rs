//! The near cache: hot keys' `VALUE` blocks kept for `hot_key_cache_ms`, each
//! with the stripe version it was fetched or stored at, so that a `get` takes
//! one only while its key's stripe still has that version (`versions.rs`).
//! No I/O here.

use bytes::Bytes;

use super::HotShared;
use crate::config::HotKeySettings;
use crate::pools::topology::Topology;
use crate::protocol::encode::value_block;
use crate::protocol::request::{parse_signed, parse_unsigned};
use crate::protocol::{Command, Request};
use crate::stats::Stats;

/// A near-cache entry: a `VALUE` block as the server sent it, and the stripe
/// version of the `get` that fetched it.
#[derive(Debug, Clone)]
pub(super) struct Cached {
    pub(super) version: u64,
    pub(super) block: Bytes,
}

pub(super) type NearCache = moka::sync::Cache<Box<[u8]>, Cached>;

/// The near cache's key for `key` of `topology`'s pool, in the pool's
/// current cut: two pools may hold one key name with different values (a
/// client of a pool's own listener asks its pool whatever the routes say),
/// and a value kept before the pool was cut off from etcd
/// ([`Topology::cuts`]) is never found after (others may have written it
/// meanwhile); it leaves with its life.
pub(super) fn cache_key(topology: &Topology, key: &[u8]) -> Box<[u8]> {
    let mut scoped = Vec::with_capacity(16 + key.len());
    scoped.extend_from_slice(&topology.pool_id.to_le_bytes());
    scoped.extend_from_slice(&topology.cuts().to_le_bytes());
    scoped.extend_from_slice(key);
    scoped.into_boxed_slice()
}

/// The near cache `settings` ask for, if any.
pub(super) fn near_cache(settings: &HotKeySettings, stats: &Stats) -> Option<NearCache> {
    settings.cache_ttl.map(|ttl| {
        let evictions = stats.hot.cache_evictions.clone();
        NearCache::builder()
            .max_capacity(settings.cache_bytes)
            .weigher(|key, value| {
                // Keys and values, plus a rough per-entry overhead.
                u32::try_from(key.len() + value.block.len() + 64).unwrap_or(u32::MAX)
            })
            .time_to_live(ttl)
            .eviction_listener(move |_key, _value, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    evictions.inc();
                }
            })
            .build()
    })
}

impl HotShared {
    /// Whether a near cache is on.
    pub(super) fn caching(&self) -> bool {
        self.live.load().cache.is_some()
    }

    /// Keeps a `get`'s value for its key if nothing wrote the key since the
    /// `get` was sent at `version`.
    pub(super) fn fill(&self, key: &[u8], hash: u64, version: u64, block: Bytes) {
        let live = self.live.load();
        let Some(cache) = &live.cache else {
            return;
        };
        // One value may not push out most of the others.
        if block.len() as u64 > live.settings.cache_bytes / 8 {
            return;
        }
        if self.settled(hash) == (version, true) {
            cache.insert(key.into(), Cached { version, block });
        }
    }
}

/// The `VALUE` block a `get` answers once memcached has stored what
/// `request` (`set`, `add`, `replace` or `cas`, never expiring) sends; `None`
/// for any other request.
pub(super) fn stored_value(request: &Request, bytes: &Bytes) -> Option<Bytes> {
    if !matches!(
        request.command,
        Command::Set | Command::Add | Command::Replace | Command::Cas
    ) {
        return None;
    }
    let line_len = request.line_len as usize;
    let line = bytes.get(..line_len)?.strip_suffix(b"\r\n")?;
    let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let (_, key) = (tokens.next()?, tokens.next()?);
    // memcached prints flags as the number it parsed ("007" comes back "7").
    let flags = u32::try_from(parse_unsigned(tokens.next()?)?).ok()?;
    // An expiry could end the item before the cache entry's life does.
    if parse_signed(tokens.next()?)? != 0 {
        return None;
    }
    let data = bytes.get(line_len..).filter(|d| d.ends_with(b"\r\n"))?;
    Some(value_block(key, flags, data, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_values_are_what_a_get_would_answer() {
        use crate::protocol::{request::parse_request, Limits};
        let value = |input: &'static [u8]| {
            let bytes = Bytes::from_static(input);
            let (request, used) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
            assert_eq!(used, bytes.len());
            stored_value(&request, &bytes)
        };
        assert_eq!(
            value(b"set k 007 0 2\r\nab\r\n").as_deref(),
            Some(&b"VALUE k 7 2\r\nab\r\n"[..])
        );
        assert_eq!(
            value(b"cas k +5 00 0 9 noreply\r\n\r\n").as_deref(),
            Some(&b"VALUE k 5 0\r\n\r\n"[..])
        );
        assert_eq!(
            value(b"add k 0 0 3 noreply\r\nx y\r\n").as_deref(),
            Some(&b"VALUE k 0 3\r\nx y\r\n"[..])
        );
        // Expiring, or not a plain store.
        assert_eq!(value(b"set k 0 10 1\r\na\r\n"), None);
        assert_eq!(value(b"set k 0 -1 1\r\na\r\n"), None);
        assert_eq!(value(b"append k 0 0 1\r\na\r\n"), None);
        assert_eq!(value(b"incr k 1\r\n"), None);
    }
}
