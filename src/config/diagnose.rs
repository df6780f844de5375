//! Messages for people: serde's and toml's errors rewritten to name the key
//! and suggest the nearest known one, an example of each key's value, and
//! the `line:column` of a byte offset.

use std::ops::Range;

use super::raw::{struct_fields, RawConfig};
use crate::error::ConfigError;

/// Makes the error for a span of the config text (`file:line:column:
/// message`).
pub(super) type At<'a> = dyn Fn(Range<usize>, String) -> ConfigError + 'a;

/// The [`At`] of the file `path` whose text is `text`.
pub(super) fn at_in<'a>(
    text: &'a str,
    path: &'a str,
) -> impl Fn(Range<usize>, String) -> ConfigError + 'a {
    move |span: Range<usize>, message: String| {
        let (line, column) = line_column(text, span.start);
        ConfigError::Invalid {
            path: path.to_string(),
            line,
            column,
            message,
        }
    }
}

/// An example value of every key, for messages about a value of the wrong
/// type: the default where there is one, else a typical value.
pub(super) const EXAMPLES: &[(&str, &str)] = &[
    ("listen", "\"127.0.0.1:22122\""),
    ("listen_mode", "\"0660\""),
    ("connections_per_server", "1"),
    ("connect_timeout_ms", "500"),
    ("request_timeout_ms", "1000"),
    ("max_value_bytes", "1048576"),
    ("max_client_connections", "16384"),
    ("max_pending_per_client", "256"),
    ("max_server_inflight", "4096"),
    ("shutdown_grace_ms", "5000"),
    ("auto_eject", "true"),
    ("failure_limit", "3"),
    ("ejection", "\"twemproxy\""),
    ("retry_timeout_ms", "30000"),
    ("client_idle_timeout_ms", "60000"),
    ("admin_listen", "\"127.0.0.1:9100\""),
    ("replicas", "2"),
    ("read_miss_fallthrough", "true"),
    ("read_balance", "\"least_loaded\""),
    ("read_balance_epsilon", "0.25"),
    ("workers", "4"),
    ("max_client_buffer_bytes", "8388608"),
    ("max_buffer_bytes", "268435456"),
    ("client_write_timeout_ms", "30000"),
    ("handoff_ms", "300000"),
    ("shared_with", "\"writers\""),
    ("flush_new_servers", "\"auto\""),
    ("state_file", "\"/var/lib/memring/handoff-state\""),
    ("ring", "\"twemproxy\""),
    ("hash", "\"fnv1a_64\""),
    ("hash_tag", "\"{}\""),
    ("hash_without_prefix", "\"myapp:\""),
    ("hot_key_detect", "true"),
    ("hot_key_window_ms", "1000"),
    ("hot_key_share", "0.2"),
    ("hot_key_top", "20"),
    ("hot_key_metrics", "true"),
    ("hot_key_coalesce", "true"),
    ("hot_key_cache_ms", "100"),
    ("hot_key_cache_bytes", "67108864"),
    ("discovery", "{ interval_ms = 5000 }"),
    ("srv", "\"_memcache._tcp.cache.default.svc\""),
    ("a", "\"cache.default.svc:11211\""),
    ("interval_ms", "5000"),
    ("resolver", "\"127.0.0.1:5353\""),
    ("etcd_endpoints", "[\"http://127.0.0.1:2379\"]"),
    ("etcd_prefix", "\"/memring/web/\""),
    ("member_grace_ms", "10000"),
    ("fleet_switch_ms", "30000"),
    ("etcd_cut_off", "\"miss\""),
    ("etcd_cache_file", "\"/var/lib/memring/members.json\""),
    ("etcd_ca_file", "\"/etc/memring/etcd-ca.pem\""),
    ("etcd_cert_file", "\"/etc/memring/etcd-client.pem\""),
    ("etcd_key_file", "\"/etc/memring/etcd-client.key\""),
    ("etcd_username", "\"memring\""),
    ("etcd_password_file", "\"/etc/memring/etcd-password\""),
    ("addr", "\"10.0.0.1:11211\""),
    ("weight", "2"),
    ("name", "\"cache-01\""),
    ("tls", "true"),
    ("warming", "true"),
    ("zone", "\"eu-west-1a\""),
    ("zone_write_back", "false"),
    ("zone_fallback", "\"all_at_once\""),
    ("warming_zones", "[\"eu-west-1c\"]"),
    ("cert_file", "\"server.pem\""),
    ("key_file", "\"server.key\""),
    ("client_ca_file", "\"clients-ca.pem\""),
    ("ca_file", "\"ca.pem\""),
    ("server_name", "\"cache.internal\""),
    (
        "pools",
        "[{ name = \"sessions\", servers = [{ addr = \"10.0.0.9:11211\" }] }]",
    ),
    ("routes", "[{ prefix = \"sess:\", pool = \"default\" }]"),
    ("default_pool", "\"default\""),
    ("prefix", "\"sess:\""),
    ("failover", "\"gutter\""),
    ("failover_ttl_s", "10"),
    ("pool", "\"sessions\""),
    ("shadow", "{ pool = \"candidate\", fraction = 0.1 }"),
    ("fraction", "0.1"),
    ("request_log", "{ slow_ms = 50, errors = true }"),
    ("sample", "0.001"),
    ("slow_ms", "50"),
    ("errors", "true"),
    ("keys", "\"hash\""),
    ("max_lines_per_s", "100"),
];

/// serde's and toml's messages, rewritten for people where they are not:
/// an unknown key gets the nearest known one instead of the list of all, and
/// a value of the wrong type gets its key and an example. `at` is where the
/// error's span starts.
pub(super) fn explain_toml_error(message: &str, text: &str, at: usize) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let Some((unknown, expected)) = rest.split_once('`') else {
            return message.to_string();
        };
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let place = if known.contains(&"weight") {
            " in [[servers]]"
        } else if known.contains(&"srv") {
            " in [discovery]"
        } else if known.contains(&"slow_ms") {
            " in [request_log]"
        } else if known.contains(&"prefix") {
            " in [[routes]]"
        } else if known.contains(&"handoff_ms") && !known.contains(&"workers") {
            if struct_fields::<RawConfig>().contains(&unknown) {
                return format!(
                    "`{unknown}` is set for the whole process, not per pool: write it at the top of the file, before any [[pools]]"
                );
            }
            " in [[pools]]"
        } else {
            ""
        };
        return match nearest(unknown, &known) {
            Some(near) => format!("unknown key `{unknown}`{place}; did you mean `{near}`?"),
            None => format!(
                "unknown key `{unknown}`{place}: no key is spelt like it (docs/configuration.md lists them all)"
            ),
        };
    }
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return message.to_string();
    };
    let Some(key) = key_at(text, at) else {
        return message.to_string();
    };
    let wanted = match expected {
        "u64" => "a whole number, 0 or more",
        "i64" => "a whole number",
        "f64" => "a number",
        "a boolean" => "true or false",
        "a string" => "a quoted string",
        "a sequence" => "an array",
        other => other,
    };
    let found = if found == "map" { "a table" } else { found };
    if key == "servers" {
        return format!(
            "servers: expected {wanted}, found {found}; write one [[servers]] table (double brackets) per server, for example [[servers]] with addr = \"10.0.0.1:11211\" on the next line"
        );
    }
    match EXAMPLES.iter().find(|(name, _)| *name == key) {
        Some((_, example)) => {
            format!("{key}: expected {wanted}, found {found}; for example: {key} = {example}")
        }
        None => format!("{key}: expected {wanted}, found {found}"),
    }
}

/// The key whose value (or table header) starts at byte `at` of `text`: the
/// last part of `key =` before it on its line, or the name of a
/// `[table]` / `[[table]]` header that begins there.
pub(super) fn key_at(text: &str, at: usize) -> Option<&str> {
    let at = at.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |nl| nl + 1);
    let before = text[..at].trim_end();
    if before.len() <= line_start {
        let line = text[line_start..].lines().next().unwrap_or("");
        let name = line
            .trim()
            .trim_start_matches('[')
            .split(']')
            .next()?
            .trim();
        return (!name.is_empty()).then_some(name);
    }
    let key = before[line_start..].strip_suffix('=')?.trim_end();
    // The key ends the line's text; an inline table may come before it.
    let key = key
        .rsplit(|c: char| !(c.is_ascii_alphanumeric() || "_-.\"'".contains(c)))
        .next()?;
    let key = key
        .rsplit('.')
        .next()?
        .trim_matches(|c| c == '"' || c == '\'');
    (!key.is_empty()).then_some(key)
}

/// The known name nearest to `unknown`, if it is near enough to be a slip:
/// at most a third of the longer name's letters changed (rounded up), with
/// a swap of two neighbours counted as one change.
pub(super) fn nearest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let unknown = unknown.to_ascii_lowercase();
    let (distance, near) = known
        .iter()
        .map(|name| (edit_distance(&unknown, name), *name))
        .min_by_key(|(distance, _)| *distance)?;
    let longer = unknown.chars().count().max(near.chars().count());
    (distance <= longer.div_ceil(3)).then_some(near)
}

/// Insertions, deletions, substitutions and swaps of adjacent characters
/// that turn `a` into `b` (optimal string alignment distance).
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j]: distance between a[..i] and b[..j].
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// 1-based line and column of a byte offset.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, column)
}

/// Reads one integer setting: its value, a default, and its allowed range.
pub(super) type NumberSetting<'a> = dyn Fn(
        &Option<toml::Spanned<u64>>,
        &str,
        u64,
        std::ops::RangeInclusive<u64>,
    ) -> Result<u64, ConfigError>
    + 'a;
