//! `GET /route?key=K` (or `key_b64=B`) on the admin listener and
//! `memring where`: where one key lives now, as JSON. The placement comes
//! from `plan/locate.rs`; this file reads the key from a query, refuses a
//! key memcached would refuse, and writes the answer.
//!
//! ```json
//! {"key": "user:42", "pool": "default",
//!  "owner": {"name": "cache-a", "addr": "10.0.0.1:11211", "state": "ACTIVE"},
//!  "replicas": [{"name": "cache-a", "addr": "10.0.0.1:11211"}],
//!  "previous_owner": null, "gutter": null, "ring_digest": "5f0c2e9a41d7b3c8"}
//! ```
//!
//! A binary key (asked with `key_b64`) is shown as `"key_b64": "…"` in place
//! of `"key"`. `gutter`, while the owner is DEAD and its pool fails over:
//! `{"pool": …, "owner": {…}}`, where writes of the key go meanwhile.

use serde_json::{json, Value};

use crate::config::Config;
use crate::plan::locate::{locate, InPool};
use crate::pools::layout::{Layout, PoolEntry};
use crate::protocol::meta::{decode_key, encode_key};
use crate::protocol::request::is_valid_key;
use crate::ring::digest;

/// The key of a `/route` query: `key=` (URL-encoded) or `key_b64=`
/// (base64 as in a meta command's `b` flag, for keys that are not text).
///
/// # Errors
/// No key, or one memcached (or memring) would refuse, with the reason.
pub fn key_of_query(query: Option<&str>) -> Result<Vec<u8>, String> {
    use crate::control::query::{percent_decode, query_value};
    if let Some(b64) = query_value(query, "key_b64") {
        return key_of_base64(&b64);
    }
    let raw = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("key="))
        .ok_or("give the key as ?key=K (URL-encoded) or ?key_b64=B (base64)")?;
    let key = percent_decode(raw).ok_or("key= holds a bad %-escape")?;
    check_key(&key)?;
    Ok(key)
}

/// A key given in base64 (`key_b64`, `memring where --b64`), decoded as
/// memcached decodes a meta `b` key.
///
/// # Errors
/// Not base64 memcached decodes, or a key it would refuse.
pub fn key_of_base64(token: &str) -> Result<Vec<u8>, String> {
    if !is_valid_key(token.as_bytes()) {
        return Err(format!(
            "key_b64 must be 1 to {} bytes of base64",
            crate::protocol::MAX_KEY_BYTES
        ));
    }
    let key = decode_key(token.as_bytes())
        .ok_or("key_b64 is not base64 that memcached decodes")?
        .to_vec();
    if key.is_empty() {
        return Err("key_b64 decodes to an empty key".into());
    }
    Ok(key)
}

/// Whether a text key is one memring forwards; the reason when not.
///
/// # Errors
/// Empty, longer than 250 bytes, or with a space or control byte.
pub fn check_key(key: &[u8]) -> Result<(), String> {
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    if key.len() > crate::protocol::MAX_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes; memcached takes at most {} (CLIENT_ERROR bad command line format)",
            key.len(),
            crate::protocol::MAX_KEY_BYTES
        ));
    }
    if !is_valid_key(key) {
        return Err("the key holds a space or a control byte, which a text-protocol key cannot (use key_b64 and a meta command's b flag)".into());
    }
    Ok(())
}

/// `/route`'s answer: its HTTP status and body.
pub(crate) fn answer(layout: &Layout, query: Option<&str>) -> (u16, String) {
    match key_of_query(query) {
        Ok(key) => (200, format!("{}\n", location_json(layout, &key))),
        Err(reason) => (400, format!("{}\n", json!({ "error": reason }))),
    }
}

/// Where `key` lives in the layout `config` describes, as a memring started
/// on it would place it before any server is found DEAD (no hand-off
/// window, every server ACTIVE): `memring where --config`. Builds backends
/// but connects to nothing.
pub fn offline_location(config: &Config, key: &[u8]) -> Value {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime without drivers always builds");
    // Backends are made inside a runtime; none of their tasks ever runs.
    let _entered = runtime.enter();
    let layout = crate::control::pool_set::offline_layout(config);
    location_json(&layout, key)
}

/// The JSON of where `key` lives in `layout` now.
pub(crate) fn location_json(layout: &Layout, key: &[u8]) -> Value {
    let location = locate(layout, key);
    let pools = layout.pools();
    let server = |at: &InPool, i: usize| {
        let backend = &at.topology.backends[i];
        json!({ "name": backend.name(), "addr": backend.addr() })
    };
    let owner = |at: &InPool| {
        at.owner.map(|i| {
            let mut owner = server(at, i);
            owner["state"] = json!(at.topology.backends[i].state().as_str());
            owner
        })
    };
    let routed = &location.routed;
    let mut answer = serde_json::Map::new();
    match std::str::from_utf8(key) {
        Ok(text) if is_valid_key(key) => answer.insert("key".into(), json!(text)),
        _ => answer.insert("key_b64".into(), json!(encode_key(key))),
    };
    answer.insert("pool".into(), json!(pool_name(pools, routed.pool)));
    answer.insert("owner".into(), json!(owner(routed)));
    let replicas: Vec<Value> = routed.replicas.iter().map(|&i| server(routed, i)).collect();
    answer.insert("replicas".into(), json!(replicas));
    answer.insert(
        "previous_owner".into(),
        json!(routed.previous_owner.map(|i| server(routed, i))),
    );
    answer.insert(
        "gutter".into(),
        json!(location.gutter.as_ref().map(|g| json!({
            "pool": pool_name(pools, g.pool),
            "owner": owner(g),
        }))),
    );
    answer.insert(
        "ring_digest".into(),
        json!(digest::hex(layout.ring_digest())),
    );
    Value::Object(answer)
}

fn pool_name(pools: &[PoolEntry], i: usize) -> &str {
    &pools[i].name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_memcached_refuses_get_a_reason() {
        assert_eq!(key_of_query(Some("key=user%3A42")).unwrap(), b"user:42");
        assert_eq!(key_of_query(Some("key_b64=AP8=")).unwrap(), [0, 255]);
        let long = format!("key={}", "k".repeat(251));
        for bad in [
            None,
            Some("other=1"),
            Some("key="),
            Some(long.as_str()),
            Some("key=a%20b"),
            Some("key=a%0Db"),
            Some("key=%zz"),
            Some("key_b64=!!!"),
        ] {
            let error = key_of_query(bad).unwrap_err();
            assert!(!error.is_empty(), "{bad:?}");
        }
        assert!(key_of_query(Some(long.as_str()))
            .unwrap_err()
            .contains("251 bytes"));
    }
}
