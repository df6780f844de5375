//! Every figure as text for `/metrics`: OpenMetrics 1.0 as prometheus-client
//! writes it, and the classic Prometheus format (0.0.4) rewritten from it,
//! with the content type each is served as.

use crate::stats::Stats;

/// Content type of [`Stats::prometheus_text`].
pub(crate) const PROMETHEUS_TEXT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of [`Stats::openmetrics_text`].
pub(crate) const OPENMETRICS_TEXT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Stats {
    /// Every metric in the classic Prometheus text format (version 0.0.4),
    /// served as [`PROMETHEUS_TEXT_TYPE`]: what every Prometheus version and
    /// `promtool check metrics` read.
    pub fn prometheus_text(&self) -> String {
        classic_from_openmetrics(&self.openmetrics_text())
    }

    /// Every metric in OpenMetrics 1.0 text, served as
    /// [`OPENMETRICS_TEXT_TYPE`] to scrapers that ask for it.
    pub fn openmetrics_text(&self) -> String {
        let mut text = String::with_capacity(16384);
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// Rewrites prometheus-client's OpenMetrics output as classic Prometheus text.
/// The two differ, for what memring registers, in two places: a counter's
/// family (its `# HELP`/`# TYPE` name) has no `_total` in OpenMetrics but must
/// carry it in the classic format, where HELP and TYPE name the sample; and
/// the classic format has no `# EOF` (nor `# UNIT`) line.
fn classic_from_openmetrics(openmetrics: &str) -> String {
    let mut counters: Vec<&str> = Vec::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, "counter")) = rest.split_once(' ') {
                counters.push(name);
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|prefix| line.starts_with(prefix));
        match meta {
            Some(prefix) => {
                let rest = &line[prefix.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(&name) && !name.ends_with("_total") {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Command;
    use crate::stats::HotKeySample;

    #[test]
    fn label_values_are_escaped_as_the_text_formats_require() {
        let stats = Stats::new();
        let metrics = stats.backend("default", "a\"b\\c\nd", &["timeout"], &["ACTIVE"]);
        metrics.requests.inc();
        stats.hot_keys(&[HotKeySample {
            server: "s\"1".into(),
            key: "k\\\"\n".into(),
            rate: 2.0,
            share: 0.5,
        }]);
        for text in [stats.prometheus_text(), stats.openmetrics_text()] {
            assert!(
                text.contains(
                    r#"memring_backend_requests_total{pool="default",server="a\"b\\c\nd"} 1"#
                ),
                "{text}"
            );
            assert!(
                text.contains(
                    r#"memring_hot_key_requests_per_second{server="s\"1",key="k\\\"\n"} 2.0"#
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn classic_text_names_counters_with_total_and_has_no_eof() {
        let stats = Stats::new();
        stats.request(Command::Get, 1);
        stats.latency_writer().observe(Command::Get, 300_000);
        let text = stats.prometheus_text();
        assert!(text.contains("# TYPE memring_client_requests_total counter\n"));
        assert!(text.contains("# HELP memring_client_requests_total "));
        assert!(text.contains("memring_client_requests_total{command=\"get\"} 1\n"));
        assert!(text.contains("# TYPE memring_request_duration_seconds histogram\n"));
        assert!(text.contains("memring_request_duration_seconds_count{command=\"get\"} 1\n"));
        assert!(!text.contains("# EOF"));
        // Every sample belongs to the family named by the TYPE line before it.
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name);
                assert!(name == family || base == family, "{line} under {family}");
            }
        }
        assert!(stats.openmetrics_text().ends_with("# EOF\n"));
    }

    /// Every family with one series of each label set, its values cut off:
    /// what a scraper, a dashboard and promtool read besides the numbers.
    fn exposition_without_values(stats: &Stats) -> String {
        stats.request(Command::Get, 1);
        stats.latency_writer().observe(Command::Get, 300_000);
        let backend = stats.backend("default", "cache-01", &["timeout"], &["ACTIVE", "DEAD"]);
        backend.error(0);
        stats.membership("default", "cache-01", "ACTIVE");
        stats.topology("default", 1, 1, 1);
        let _ = stats.pool_figures("default");
        let _ = stats.zone_figures("eu-west-1a");
        stats.zone_warming("eu-west-1a", false);
        let _ = stats.shadow_counters("default", "shadow");
        stats.reload(true);
        stats.hot_keys(&[HotKeySample {
            server: "cache-01".into(),
            key: "k".into(),
            rate: 1.0,
            share: 0.5,
        }]);
        stats.discovered("srv _memcache._tcp.cache", &["cache-01".into()], true);
        // A family's series come out in its hash map's order: sorted here.
        let mut out = String::new();
        let mut series: Vec<&str> = Vec::new();
        let text = stats.prometheus_text();
        for line in text.lines() {
            if line.starts_with('#') {
                series.sort_unstable();
                series.drain(..).for_each(|s| out.extend([s, "\n"]));
                out.extend([line, "\n"]);
            } else {
                series.push(line.rsplit_once(' ').map_or(line, |(s, _)| s));
            }
        }
        series.sort_unstable();
        series.drain(..).for_each(|s| out.extend([s, "\n"]));
        out
    }

    #[test]
    fn every_family_keeps_its_name_help_type_and_labels() {
        let text = exposition_without_values(&Stats::new());
        // A new family, or a new label, changes this file on purpose:
        // `MEMRING_WRITE_GOLDEN=1 cargo test --lib every_family` writes it.
        if std::env::var_os("MEMRING_WRITE_GOLDEN").is_some() {
            let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/src/stats/exposition.golden");
            std::fs::write(golden, &text).expect("the golden file is writable");
        }
        assert_eq!(text, include_str!("exposition.golden"));
    }
}
