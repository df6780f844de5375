//! Before a hand-off window ends, delete from every server the keys it holds
//! but no longer owns (the window ends once this is done: see
//! `publisher::close_window`).
//!
//! During a window the previous owners' copies of moved keys serve the
//! read-through. Once it is over nothing reads them, but they stay: and when
//! a later change gives such a key back to its old server (undoing the
//! change, a flip), that copy would be read as current although the key has
//! been written on its new owner since. memcached cannot delete a key range,
//! but it lists its keys (`lru_crawler metadump all`, memcached 1.4.31 and
//! later), so memring asks each server of the ring for its keys and deletes
//! those the ring in force places elsewhere. The sweep stops when the ring
//! changes under it (the next window's sweep covers what it left).
//!
//! A reload that sends keys to another pool (a route added or removed,
//! `default_pool` changed) lists the keys of the pool they go to the same
//! way and deletes those it takes from another pool (`delete_moved`): its
//! copies of them may be older than what was written in the other pool.
//!
//! The parsing and the choice of keys are pure; the I/O is short-lived
//! connections of its own to each server, off the request path, spoken as
//! the server's connections speak (TLS for a server with `tls = true`).

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use memchr::memchr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::backend::Backend;
use crate::pools::topology::{SharedTopology, Topology};
use crate::protocol::outcome::Outcome;
use crate::protocol::request::is_valid_key;

/// Deletes sent before memring waits for the server to take them.
const DELETES_PER_BATCH: usize = 512;
/// Listings of one server at most, for keys moving into its pool (see
/// [`delete_moved`]).
const MAX_LISTINGS: usize = 4;
/// Longest metadump line memring reads (a 250-byte key, URL-encoded, and
/// its metadata).
const MAX_DUMP_LINE_BYTES: u64 = 4096;

/// The key of one `lru_crawler metadump` line (`key=<url-encoded> exp=…`),
/// decoded; `None` for anything else.
pub(crate) fn dumped_key(line: &[u8]) -> Option<Vec<u8>> {
    let rest = line.strip_prefix(b"key=")?;
    let end = memchr(b' ', rest).unwrap_or(rest.len());
    let encoded = &rest[..end];
    let mut key = Vec::with_capacity(encoded.len());
    let mut at = 0;
    while at < encoded.len() {
        if encoded[at] == b'%' {
            let hex = encoded.get(at + 1..at + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            key.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            key.push(encoded[at]);
            at += 1;
        }
    }
    (!key.is_empty()).then_some(key)
}

/// Whether server `server` (a backend index) should hold `key` under
/// `topology`'s ring: it is the owner or one of the replicas.
pub(crate) fn belongs_on(topology: &Topology, key: &[u8], server: usize) -> bool {
    let mut replicas = smallvec::SmallVec::<[usize; 4]>::new();
    topology.replicas(key, &mut replicas);
    replicas.contains(&server)
}

/// The request that deletes `key` quietly: classic for a text key, meta with
/// a base64 key for any other bytes.
pub(crate) fn quiet_delete(key: &[u8], out: &mut BytesMut) {
    if is_valid_key(key) {
        out.put_slice(b"delete ");
        out.put_slice(key);
        out.put_slice(b" noreply\r\n");
    } else {
        out.put_slice(b"md ");
        out.put_slice(crate::protocol::meta::encode_key(key).as_bytes());
        out.put_slice(b" b q\r\n");
    }
}

/// Sweeps every server of `topology` (as published at `version`) of the
/// keys it no longer owns; stops when the published ring moves on. Returns
/// the keys deleted per server name.
pub(crate) async fn sweep(
    shared: SharedTopology,
    topology: Arc<Topology>,
    stats: Arc<crate::stats::Stats>,
) -> Vec<(Arc<str>, u64)> {
    let timeout = topology.config.connect_timeout + Duration::from_secs(60);
    let mut swept = Vec::new();
    for (index, backend) in topology.backends.iter().enumerate() {
        if !topology.ring_holds(index) {
            continue;
        }
        let still_current = || shared.load().version == topology.version;
        if !still_current() {
            break;
        }
        let work = sweep_one(backend, &topology, index, &still_current);
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(deleted)) => {
                stats.swept(deleted);
                swept.push((backend.name().into(), deleted));
            }
            Ok(Err(e)) => tracing::warn!(
                server = %backend.name(),
                "hand-off sweep: could not list or delete keys it no longer owns: {e}"
            ),
            Err(_) => tracing::warn!(
                server = %backend.name(),
                "hand-off sweep: gave up after {} s", timeout.as_secs()
            ),
        }
    }
    swept
}

/// Deletes from every server of a pool (`topology`, leaving servers of a
/// hand-off window too: they serve the read-through) the keys `select`
/// picks, before a reload sends keys to this pool from another (see
/// `control/reload.rs`): a listing of each server, deletes of picked keys only, and
/// the server listed again while a listing finds keys to delete (at most
/// [`MAX_LISTINGS`]). Returns the keys deleted.
///
/// # Errors
/// Each server that could not be listed or swept, named, in one message:
/// the reload is then refused, as nothing may read what is left.
pub(crate) async fn delete_moved(
    topology: &Topology,
    select: &(dyn Fn(&[u8]) -> bool + Sync),
) -> Result<u64, String> {
    let timeout = topology.config.connect_timeout + Duration::from_secs(60);
    let mut deleted = 0u64;
    let mut failed = Vec::new();
    for backend in topology.backends.iter() {
        let work = async {
            // A listing is not a snapshot: memcached 1.6.18 left out 1 or 2
            // of 200 000 items in some listings, with nothing written
            // meanwhile. So a server is listed again while a listing finds
            // keys to delete: a key left out once is found by the next.
            let mut deleted = 0;
            for _ in 0..MAX_LISTINGS {
                let found = delete_listed(backend, select, &|| true).await?;
                deleted += found;
                if found == 0 {
                    break;
                }
            }
            Ok::<u64, std::io::Error>(deleted)
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(n)) => deleted += n,
            Ok(Err(e)) => failed.push(format!("{}: {e}", backend.name())),
            Err(_) => failed.push(format!(
                "{}: gave up after {} s",
                backend.name(),
                timeout.as_secs()
            )),
        }
    }
    if failed.is_empty() {
        Ok(deleted)
    } else {
        Err(failed.join("; "))
    }
}

async fn sweep_one(
    backend: &Backend,
    topology: &Topology,
    index: usize,
    still_current: &(dyn Fn() -> bool + Sync),
) -> std::io::Result<u64> {
    let leftover = |key: &[u8]| !belongs_on(topology, key, index);
    delete_listed(backend, &leftover, still_current).await
}

/// Lists `backend`'s keys (`lru_crawler metadump all`) and deletes those
/// `select` picks, quietly, in batches of [`DELETES_PER_BATCH`] over a
/// second connection of its own while the listing goes on: at most one
/// batch of keys is held, whatever the server holds. Stops (with what it
/// deleted) as soon as `still_current` says no. Returns the keys deleted.
///
/// # Errors
/// A connection that fails or closes, or a server that does not list its
/// keys (no `lru_crawler`, before memcached 1.4.31, or a crawler `BUSY`).
pub(crate) async fn delete_listed(
    backend: &Backend,
    select: &(dyn Fn(&[u8]) -> bool + Sync),
    still_current: &(dyn Fn() -> bool + Sync),
) -> std::io::Result<u64> {
    let (reader, mut writer) = tokio::io::split(backend.connect_own().await?);
    writer.write_all(b"lru_crawler metadump all\r\n").await?;
    // A TLS stream may hold written bytes until flushed.
    writer.flush().await?;
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    let mut batch = Vec::new();
    // Connected when the first batch is full: the dump streams on the
    // listing connection, and a delete sent on it would wait behind it.
    let mut deleter: Option<Deleter> = None;
    let mut deleted = 0u64;
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_DUMP_LINE_BYTES)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Err(std::io::Error::other("closed during the key listing"));
        }
        if Outcome::of(&line) == Outcome::End {
            break;
        }
        // `CLIENT_ERROR lru crawler disabled` from a server started with
        // `-o no_lru_crawler`.
        if [&b"BUSY"[..], b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR"]
            .iter()
            .any(|word| line.starts_with(word))
        {
            return Err(std::io::Error::other(format!(
                "lru_crawler metadump answered {}",
                String::from_utf8_lossy(&line).trim_end()
            )));
        }
        if let Some(key) = dumped_key(&line) {
            if select(&key) {
                batch.push(key);
            }
        }
        if batch.len() == DELETES_PER_BATCH {
            if !still_current() {
                return Ok(deleted);
            }
            let deleter = match &mut deleter {
                Some(deleter) => deleter,
                None => deleter.insert(Deleter::connect(backend).await?),
            };
            deleted += deleter.delete(&batch).await?;
            batch.clear();
        }
    }
    if !batch.is_empty() && still_current() {
        let deleter = match &mut deleter {
            Some(deleter) => deleter,
            None => deleter.insert(Deleter::connect(backend).await?),
        };
        deleted += deleter.delete(&batch).await?;
    }
    Ok(deleted)
}

/// A connection of memring's own that deletes keys quietly, a batch at a
/// time.
struct Deleter {
    reader: BufReader<tokio::io::ReadHalf<Box<dyn crate::backend::Duplex>>>,
    writer: tokio::io::WriteHalf<Box<dyn crate::backend::Duplex>>,
}

impl Deleter {
    async fn connect(backend: &Backend) -> std::io::Result<Deleter> {
        let (reader, writer) = tokio::io::split(backend.connect_own().await?);
        Ok(Deleter {
            reader: BufReader::new(reader),
            writer,
        })
    }

    /// Deletes `batch` and waits until the server took every delete.
    async fn delete(&mut self, batch: &[Vec<u8>]) -> std::io::Result<u64> {
        let mut out = BytesMut::with_capacity(batch.len() * 32 + 4);
        for key in batch {
            quiet_delete(key, &mut out);
        }
        // memcached answers `mn` once every request before it is done.
        out.put_slice(b"mn\r\n");
        self.writer.write_all(&out).await?;
        self.writer.flush().await?;
        let mut line = Vec::new();
        loop {
            line.clear();
            if (&mut self.reader)
                .take(MAX_DUMP_LINE_BYTES)
                .read_until(b'\n', &mut line)
                .await?
                == 0
            {
                return Err(std::io::Error::other("closed while deleting"));
            }
            if Outcome::of(&line) == Outcome::Mn {
                return Ok(batch.len() as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadump_lines_give_their_decoded_keys() {
        // Lines as memcached 1.6.18 sent them for `k`, `a%20b` and the meta
        // key `foo\0bar`.
        for (line, key) in [
            (
                &b"key=k exp=-1 la=1796120934 cas=1 fetch=no cls=1 size=62\n"[..],
                &b"k"[..],
            ),
            (
                b"key=a%2520b exp=1796121035 la=1 cas=2 fetch=no cls=1 size=66\n",
                b"a%20b",
            ),
            (
                b"key=foo%00bar exp=-1 la=1 cas=3 fetch=no cls=1 size=68\n",
                b"foo\0bar",
            ),
        ] {
            assert_eq!(dumped_key(line).as_deref(), Some(key), "{line:?}");
        }
        for line in [
            &b"END\r\n"[..],
            b"key= exp=-1\n",
            b"key=a%2 exp=-1\n",
            b"key=a%zz\n",
        ] {
            assert_eq!(dumped_key(line), None, "{line:?}");
        }
    }

    #[test]
    fn text_keys_are_deleted_classically_and_others_by_base64() {
        let mut out = BytesMut::new();
        quiet_delete(b"user:1", &mut out);
        quiet_delete(b"foo\0bar", &mut out);
        assert_eq!(
            &out[..],
            b"delete user:1 noreply\r\nmd Zm9vAGJhcg== b q\r\n"
        );
    }
}
