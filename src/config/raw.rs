//! What serde reads from the TOML file, with the source span of each value
//! so that every error can say `file:line:column`; and the list of every
//! key the file accepts, derived from these structs.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Spanned<String>,
    pub(super) listen_mode: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) servers: Vec<Spanned<RawServer>>,
    pub(super) connections_per_server: Option<Spanned<u64>>,
    pub(super) connect_timeout_ms: Option<Spanned<u64>>,
    pub(super) request_timeout_ms: Option<Spanned<u64>>,
    pub(super) max_value_bytes: Option<Spanned<u64>>,
    pub(super) max_client_connections: Option<Spanned<u64>>,
    pub(super) max_pending_per_client: Option<Spanned<u64>>,
    pub(super) max_server_inflight: Option<Spanned<u64>>,
    pub(super) shutdown_grace_ms: Option<Spanned<u64>>,
    pub(super) auto_eject: Option<bool>,
    pub(super) failure_limit: Option<Spanned<u64>>,
    pub(super) ejection: Option<Spanned<String>>,
    pub(super) retry_timeout_ms: Option<Spanned<u64>>,
    pub(super) client_idle_timeout_ms: Option<Spanned<u64>>,
    pub(super) admin_listen: Option<Spanned<String>>,
    pub(super) replicas: Option<Spanned<u64>>,
    pub(super) read_miss_fallthrough: Option<bool>,
    pub(super) read_balance: Option<Spanned<String>>,
    pub(super) read_balance_epsilon: Option<Spanned<f64>>,
    pub(super) workers: Option<Spanned<u64>>,
    pub(super) max_client_buffer_bytes: Option<Spanned<u64>>,
    pub(super) max_buffer_bytes: Option<Spanned<u64>>,
    pub(super) client_write_timeout_ms: Option<Spanned<u64>>,
    pub(super) handoff_ms: Option<Spanned<u64>>,
    pub(super) shared_with: Option<Spanned<String>>,
    pub(super) flush_new_servers: Option<Spanned<String>>,
    pub(super) state_file: Option<Spanned<String>>,
    pub(super) failover: Option<Spanned<String>>,
    pub(super) failover_ttl_s: Option<Spanned<u64>>,
    pub(super) ring: Option<Spanned<String>>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) hash_tag: Option<Spanned<String>>,
    pub(super) hash_without_prefix: Option<Spanned<String>>,
    pub(super) hot_key_detect: Option<Spanned<bool>>,
    pub(super) hot_key_window_ms: Option<Spanned<u64>>,
    pub(super) hot_key_share: Option<Spanned<f64>>,
    pub(super) hot_key_top: Option<Spanned<u64>>,
    pub(super) hot_key_metrics: Option<bool>,
    pub(super) hot_key_coalesce: Option<bool>,
    pub(super) hot_key_cache_ms: Option<Spanned<u64>>,
    pub(super) hot_key_cache_bytes: Option<Spanned<u64>>,
    pub(super) tls_listen: Option<Spanned<RawTlsListen>>,
    pub(super) backend_tls: Option<Spanned<RawBackendTls>>,
    pub(super) discovery: Option<Spanned<RawDiscovery>>,
    #[serde(default)]
    pub(super) pools: Vec<Spanned<RawPool>>,
    #[serde(default)]
    pub(super) routes: Vec<Spanned<RawRoute>>,
    pub(super) default_pool: Option<Spanned<String>>,
    /// `[shadow]`: the top-level pool's shadow (see `pools.rs`).
    pub(super) shadow: Option<Spanned<RawShadow>>,
    pub(super) request_log: Option<Spanned<RawRequestLog>>,
    /// The sidecar's own zone (`MEMRING_ZONE` wins).
    pub(super) zone: Option<Spanned<String>>,
    /// Write a hit found in another zone back to the local replica.
    pub(super) zone_write_back: Option<bool>,
    /// How the other zones' replicas are asked after a local miss.
    pub(super) zone_fallback: Option<Spanned<String>>,
    /// Zones whose servers are warming (`ServerConfig::warming`).
    pub(super) warming_zones: Option<Spanned<Vec<String>>>,
}

/// `[request_log]`: which finished requests are logged, one line each.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequestLog {
    pub(super) sample: Option<Spanned<f64>>,
    pub(super) slow_ms: Option<Spanned<u64>>,
    pub(super) errors: Option<Spanned<bool>>,
    pub(super) keys: Option<Spanned<String>>,
    pub(super) max_lines_per_s: Option<Spanned<u64>>,
}

/// `[discovery]`: where host names are looked up, how often, and whether the
/// default pool's servers come from DNS.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDiscovery {
    pub(super) srv: Option<Spanned<String>>,
    pub(super) a: Option<Spanned<String>>,
    pub(super) interval_ms: Option<Spanned<u64>>,
    pub(super) resolver: Option<Spanned<String>>,
    pub(super) tls: Option<Spanned<bool>>,
    pub(super) etcd_endpoints: Option<Spanned<Vec<String>>>,
    pub(super) etcd_prefix: Option<Spanned<String>>,
    pub(super) member_grace_ms: Option<Spanned<u64>>,
    pub(super) fleet_switch_ms: Option<Spanned<u64>>,
    pub(super) etcd_cut_off: Option<Spanned<String>>,
    pub(super) etcd_cache_file: Option<Spanned<String>>,
    pub(super) etcd_ca_file: Option<Spanned<String>>,
    pub(super) etcd_cert_file: Option<Spanned<String>>,
    pub(super) etcd_key_file: Option<Spanned<String>>,
    pub(super) etcd_username: Option<Spanned<String>>,
    pub(super) etcd_password_file: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) addr: Spanned<String>,
    pub(super) weight: Option<Spanned<i64>>,
    pub(super) name: Option<Spanned<String>>,
    pub(super) tls: Option<Spanned<bool>>,
    /// Takes writes beside the ring, serves no reads (see
    /// `ServerConfig::warming`).
    pub(super) warming: Option<Spanned<bool>>,
    /// The server's zone (see `ServerConfig::zone`).
    pub(super) zone: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTlsListen {
    pub(super) addr: Spanned<String>,
    pub(super) cert_file: Spanned<String>,
    pub(super) key_file: Spanned<String>,
    pub(super) client_ca_file: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackendTls {
    pub(super) ca_file: Option<Spanned<String>>,
    pub(super) cert_file: Option<Spanned<String>>,
    pub(super) key_file: Option<Spanned<String>>,
    pub(super) server_name: Option<Spanned<String>>,
}

/// Every key the config file accepts, derived from the serde structs: each
/// top-level setting (`listen`, `servers`, ...) and, for a key that holds a
/// table or an array of tables, each of its keys as `table.key`
/// (`servers.addr`). The docs checks (tests/integration/docs.rs) use them,
/// so a new key cannot go undocumented.
pub fn setting_names() -> Vec<String> {
    let mut names = Vec::new();
    for key in struct_fields::<RawConfig>() {
        names.push(key.to_string());
        for header in [format!("[{key}]"), format!("[[{key}]]")] {
            names.extend(
                table_keys(&header)
                    .into_iter()
                    .map(|k| format!("{key}.{k}")),
            );
        }
    }
    names
}

/// The keys serde accepts in the table that `header` opens, read from its
/// unknown-key message; none when that key is not a table.
pub(super) fn table_keys(header: &str) -> Vec<String> {
    const PROBE: &str = "memring_probe_not_a_key";
    let text = format!("listen = \"127.0.0.1:1\"\n{header}\n{PROBE} = 1\n");
    let Err(error) = toml::from_str::<RawConfig>(&text) else {
        return Vec::new();
    };
    match error
        .message()
        .strip_prefix(&format!("unknown field `{PROBE}`, expected "))
    {
        Some(list) => list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect(),
        None => Vec::new(),
    }
}

/// The field names that a derived `Deserialize` passes to
/// `deserialize_struct`, caught by a deserializer that reads nothing.
pub(super) fn struct_fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Fields<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Fields<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("only the field names were wanted"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

/// One `[[pools]]` entry: a name, an optional listener of its own, its
/// servers, and the pool settings it sets for itself (the rest it takes from
/// the top level).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) name: Spanned<String>,
    pub(super) listen: Option<Spanned<String>>,
    pub(super) listen_mode: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) servers: Vec<Spanned<RawServer>>,
    pub(super) connections_per_server: Option<Spanned<u64>>,
    pub(super) connect_timeout_ms: Option<Spanned<u64>>,
    pub(super) request_timeout_ms: Option<Spanned<u64>>,
    pub(super) auto_eject: Option<bool>,
    pub(super) failure_limit: Option<Spanned<u64>>,
    pub(super) ejection: Option<Spanned<String>>,
    pub(super) retry_timeout_ms: Option<Spanned<u64>>,
    pub(super) replicas: Option<Spanned<u64>>,
    pub(super) read_miss_fallthrough: Option<bool>,
    pub(super) read_balance: Option<Spanned<String>>,
    pub(super) read_balance_epsilon: Option<Spanned<f64>>,
    pub(super) handoff_ms: Option<Spanned<u64>>,
    pub(super) shared_with: Option<Spanned<String>>,
    pub(super) flush_new_servers: Option<Spanned<String>>,
    pub(super) failover: Option<Spanned<String>>,
    pub(super) failover_ttl_s: Option<Spanned<u64>>,
    pub(super) ring: Option<Spanned<String>>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) hash_tag: Option<Spanned<String>>,
    pub(super) hash_without_prefix: Option<Spanned<String>>,
    pub(super) shadow: Option<Spanned<RawShadow>>,
}

/// `[pools.shadow]` (or the top-level `[shadow]` for the pool `default`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShadow {
    pub(super) pool: Spanned<String>,
    pub(super) fraction: Option<Spanned<f64>>,
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) prefix: Spanned<String>,
    pub(super) pool: Spanned<String>,
}
