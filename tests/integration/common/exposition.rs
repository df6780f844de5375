//! Checks of Prometheus text (format 0.0.4) that do not let a broken line
//! pass: a strict reader written from the format's description, and
//! `promtool check metrics` when it is installed. prometheus-parse, the
//! other reader the suites use, skips lines it cannot read, so alone it
//! cannot show that every line is valid.

use std::collections::HashSet;
use std::io::Write;
use std::process::{Command, Stdio};

/// One sample line: metric name, labels with their values unescaped, value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of `text`; panics naming the first line that is not valid
/// text format, or a series that appears twice.
pub(crate) fn strict_samples(text: &str) -> Vec<Sample> {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "exposition does not end with a newline"
    );
    let mut samples = Vec::new();
    let mut series = HashSet::new();
    for (number, line) in text.lines().enumerate() {
        let fail = |why: &str| -> ! { panic!("line {}: {why}: {line:?}", number + 1) };
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            if let Some(kind @ ("HELP" | "TYPE")) = words.next() {
                let name = words.next().unwrap_or("");
                if !is_metric_name(name) {
                    fail(&format!("{kind} without a valid metric name"));
                }
                if kind == "TYPE" {
                    let types = ["counter", "gauge", "histogram", "summary", "untyped"];
                    if !types.contains(&words.next().unwrap_or("")) {
                        fail("unknown TYPE");
                    }
                }
            }
            continue;
        }
        let sample = parse_sample(line).unwrap_or_else(|why| fail(why));
        let mut key: Vec<String> = sample
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        key.sort();
        if !series.insert((sample.name.clone(), key)) {
            fail("the same series twice");
        }
        samples.push(sample);
    }
    samples
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(name: &str) -> bool {
    !name.contains(':') && is_metric_name(name)
}

fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err("invalid metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').ok_or("label without =")?;
            let label = &rest[..eq];
            if !is_label_name(label) {
                return Err("invalid label name");
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value without \"")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().ok_or("unterminated escape")?.1 {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        _ => return Err("unknown escape in label value"),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((label.to_string(), value));
            rest = &rest[end + 1..];
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err("labels not separated by ,");
            }
        }
    }
    let mut fields = rest
        .strip_prefix(' ')
        .ok_or("no space before the value")?
        .split(' ');
    let value = match fields.next().ok_or("no value")? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        number => number.parse().map_err(|_| "value is not a number")?,
    };
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| "timestamp is not an integer")?;
    }
    if fields.next().is_some() {
        return Err("text after the timestamp");
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Runs `promtool check metrics` on `text` and fails on any complaint;
/// says SKIPPED when promtool is not installed.
pub(crate) fn promtool_check(text: &str) {
    let spawned = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut promtool = match spawned {
        Ok(promtool) => promtool,
        Err(e) => {
            eprintln!(
                "SKIPPED promtool check: promtool not runnable ({e}); install the Debian package `prometheus` (scripts/test does)"
            );
            return;
        }
    };
    promtool
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let output = promtool.wait_with_output().expect("promtool runs");
    let problems = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && problems.trim().is_empty(),
        "promtool check metrics: {problems}"
    );
}
