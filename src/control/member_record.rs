//! A ring member as the membership store (etcd) holds it: the key
//! `<prefix>members/<name>` with a small JSON value. `memring member` writes
//! it and every sidecar reads it, so both sides share this one type.
//!
//! ```json
//! {"addr": "127.0.0.1:21211", "weight": 1, "state": "ACTIVE"}
//! ```
//! `weight` (default 1), `zone` and `tls` (default false) are optional and
//! mean what their `[[servers]]` counterparts mean. Unknown fields are
//! ignored, so a newer agent's record still reads.

use serde::{Deserialize, Serialize};

use crate::config::MAX_WEIGHT;

/// Where a member is in its life (Loki's lifecycle, for a cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum MemberState {
    /// Warming: takes writes for the keys it will own, serves no reads yet.
    Joining,
    /// A full member.
    Active,
    /// Still serves; its keys' new owners read through from it.
    Leaving,
}

impl MemberState {
    /// The name the record and `stats` use.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Joining => "JOINING",
            MemberState::Active => "ACTIVE",
            MemberState::Leaving => "LEAVING",
        }
    }
}

/// One member's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// `host:port` of the memcached server, as a `[[servers]]` addr.
    pub addr: String,
    #[serde(default = "default_weight")]
    pub weight: u32,
    pub state: MemberState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
}

fn default_weight() -> u32 {
    1
}

/// Why a record was not taken; said in the one log line naming its key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("not a member record: {0}")]
    Json(String),
    #[error("addr is empty")]
    EmptyAddr,
    #[error("weight {0} must be an integer from 1 to {MAX_WEIGHT}")]
    Weight(u32),
    #[error("member name is empty")]
    EmptyName,
    #[error("{0} bytes; a member record is at most {MAX_RECORD_BYTES}")]
    TooLarge(usize),
}

/// The largest record taken: a record is about a hundred bytes, and what it
/// holds (a name, an address, a zone) ends up in `stats` lines and logs.
pub const MAX_RECORD_BYTES: usize = 4096;

impl MemberRecord {
    /// Reads a record from an etcd value. A value that is not JSON, lacks
    /// `addr` or names an unknown `state` is an error, never a default.
    pub fn parse(value: &[u8]) -> Result<MemberRecord, RecordError> {
        if value.len() > MAX_RECORD_BYTES {
            return Err(RecordError::TooLarge(value.len()));
        }
        let record: MemberRecord =
            serde_json::from_slice(value).map_err(|e| RecordError::Json(e.to_string()))?;
        if record.addr.trim().is_empty() {
            return Err(RecordError::EmptyAddr);
        }
        if record.weight == 0 || record.weight > MAX_WEIGHT {
            return Err(RecordError::Weight(record.weight));
        }
        Ok(record)
    }

    /// The value to store.
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and an enum always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The etcd key of member `name` under `prefix` (which ends in `/`).
pub fn member_key(prefix: &str, name: &str) -> String {
    format!("{prefix}members/{name}")
}

/// The member name of an etcd key under `prefix`, or why it has none.
pub fn member_name<'k>(prefix: &str, key: &'k str) -> Result<&'k str, RecordError> {
    let name = key
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("members/"))
        .unwrap_or("");
    if name.is_empty() {
        Err(RecordError::EmptyName)
    } else {
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_record_takes_the_defaults() {
        let r = MemberRecord::parse(br#"{"addr":"127.0.0.1:21211","state":"ACTIVE"}"#).unwrap();
        assert_eq!(r.weight, 1);
        assert_eq!(r.state, MemberState::Active);
        assert_eq!(r.zone, None);
        assert!(!r.tls);
    }

    #[test]
    fn a_full_record_reads_back_what_it_wrote() {
        let r = MemberRecord {
            addr: "cache-01:11211".into(),
            weight: 3,
            state: MemberState::Joining,
            zone: Some("eu-1a".into()),
            tls: true,
        };
        assert_eq!(MemberRecord::parse(r.to_json().as_bytes()).unwrap(), r);
        assert!(r.to_json().contains(r#""state":"JOINING""#));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let r = MemberRecord::parse(br#"{"addr":"a:1","state":"LEAVING","since":5}"#).unwrap();
        assert_eq!(r.state, MemberState::Leaving);
    }

    #[test]
    fn bad_records_are_errors() {
        for bad in [
            &b"not json"[..],
            br#"{"state":"ACTIVE"}"#,
            br#"{"addr":"a:1","state":"PENDING"}"#,
            br#"{"addr":"a:1"}"#,
            br#"{"addr":"","state":"ACTIVE"}"#,
            br#"{"addr":"a:1","state":"ACTIVE","weight":0}"#,
            br#"{"addr":"a:1","state":"ACTIVE","weight":-1}"#,
            br#"["a:1"]"#,
            format!(
                r#"{{"addr":"a:1","state":"ACTIVE","zone":"{}"}}"#,
                "z".repeat(5000)
            )
            .as_bytes(),
        ] {
            assert!(
                MemberRecord::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn keys_and_names() {
        assert_eq!(
            member_key("/memring/web/", "cache-01"),
            "/memring/web/members/cache-01"
        );
        assert_eq!(
            member_name("/memring/web/", "/memring/web/members/cache-01"),
            Ok("cache-01")
        );
        assert!(member_name("/memring/web/", "/memring/web/members/").is_err());
        assert!(member_name("/memring/web/", "/memring/web/proxies/x").is_err());
    }
}
