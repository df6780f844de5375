//! Docs that cannot drift: README.md and every page in docs/ are checked
//! against what memring itself says it accepts, exposes and prints.
//!
//! - every config key serde accepts (`memring::config::setting_names`, keys
//!   of tables such as `servers.addr` included) has a row in a table on some
//!   page;
//! - every metric family a running memring exposes on `/metrics` (with the
//!   features that add families turned on) is named on some page, and so is
//!   every line of its `stats`, `stats hotkeys` and `stats shadow`;
//! - every subcommand in `memring --help` has a page `docs/<name>.md`, listed
//!   in the index `docs/README.md`;
//! - every relative link resolves to a file, and its `#anchor` to a heading;
//! - every page is in the index;
//! - every command shown with its output is run and its output compared.
//!
//! The last check reads this convention (docs/README.md, "Examples that are
//! tested", says it for writers):
//!
//! - A block fenced as ```` ```console ```` holds commands (lines starting
//!   `$ `) each followed by exactly what it prints, stdout and stderr as one
//!   stream. It runs with `sh` in a scratch directory of its page, with the
//!   `memring` under test first on `PATH`, so `; echo $?` and `| grep` work.
//! - A block fenced as ```` ```toml file=NAME ```` (any language) is written to
//!   NAME in that directory before the page's commands run; the repository's
//!   `config/*.toml` are there as `config/`.
//! - Addresses stand for real processes this test starts: `127.0.0.1:21211`,
//!   `:21212` and `:21213` are memcached servers, `127.0.0.1:22122` is a
//!   memring over them and `127.0.0.1:9100` its admin listener
//!   (`localhost:21211` is the first memcached spelt another way). They are
//!   replaced with the real ports in files and commands, and back in output.
//! - `[..]` in an expected line matches any text within that line (a
//!   version, a commit, a resolver's wording).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::common::{Memcached, Proxy, TempDir, DEADLINE};

const BIN: &str = env!("CARGO_BIN_EXE_memring");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Pages other branches are writing, which the index and the README link to
/// already. Each is checked like any page once it exists; until then a link
/// to it is not a broken link.
const PENDING: &[&str] = &[];

/// One Markdown file, by its path relative to the repository.
struct Page {
    path: String,
    text: String,
}

/// README.md and every docs/*.md, in name order.
fn pages() -> Vec<Page> {
    let mut paths = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/ exists")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| Page {
            text: std::fs::read_to_string(Path::new(ROOT).join(&path))
                .unwrap_or_else(|e| panic!("{path}: {e}")),
            path,
        })
        .collect()
}

/// The text outside fenced code blocks, line by line, with line numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// Whether `text` names `word` inside a code span: `` `word` ``,
/// `` `word = 1` ``, `` `word{label}` ``, but not `` `word_more` `` or a bare
/// word in prose.
fn names_in_code(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
        let in_span = text[line_start..at].matches('`').count() % 2 == 1;
        in_span
            && !text[..at].chars().next_back().is_some_and(ident)
            && !text[at + word.len()..].chars().next().is_some_and(ident)
    })
}

/// The first cell of every table row that starts with code, with its page.
fn first_cells(pages: &[Page]) -> Vec<(&Page, String)> {
    pages
        .iter()
        .flat_map(|page| {
            prose(&page.text)
                .into_iter()
                .filter(|(_, line)| line.starts_with("| `"))
                .map(move |(_, line)| {
                    (
                        page,
                        line.split('|').nth(1).unwrap_or("").trim().to_string(),
                    )
                })
        })
        .collect()
}

/// The code spans of a table cell: `` `a`, `b = 1` `` gives `a` and `b = 1`.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Whether some row documents `name`: a top-level key as its first cell's
/// code (`` | `handoff_ms` | ``; a key that holds a table also counts when
/// a page shows `[key]`), a key of a table (`servers.addr`) as a code span
/// ending in it (`` `addr` ``, `` `servers.addr` ``, `` `[servers] addr` ``)
/// on a page that shows `[table]`.
fn documented(name: &str, names: &[String], pages: &[Page], cells: &[(&Page, String)]) -> bool {
    match name.split_once('.') {
        None => {
            let is_table = names.iter().any(|n| n.starts_with(&format!("{name}.")));
            (is_table && pages.iter().any(|p| p.text.contains(&format!("[{name}]"))))
                || cells
                    .iter()
                    .any(|(_, cell)| cell.split(", ").any(|item| item == format!("`{name}`")))
        }
        Some((table, key)) => cells.iter().any(|(page, cell)| {
            page.text.contains(&format!("[{table}]"))
                && code_spans(cell).iter().any(|span| {
                    let written = span.split(" = ").next().unwrap_or(span);
                    written.rsplit(['.', ' ', ']']).next() == Some(key)
                })
        }),
    }
}

#[test]
fn every_config_setting_has_a_row_in_a_table() {
    let names = memring::config::setting_names();
    assert!(names.len() > 20, "serde's keys: {names:?}");
    assert!(names.iter().any(|n| n == "servers.addr"), "{names:?}");
    let pages = pages();
    let cells = first_cells(&pages);
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !documented(name, &names, &pages, &cells))
        .collect();
    assert!(
        missing.is_empty(),
        "keys memring accepts with no `| `key` | default | meaning |` row on any page (a key of a table on a page that shows `[table]`): {missing:?}"
    );
}

/// An HTTP GET of `path` on `addr`; the body of a 200 answer.
fn http_body(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("admin listener");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: docs\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

#[test]
fn every_metric_family_on_metrics_is_documented() {
    let servers = [Memcached::start(), Memcached::start()];
    // The optional features that add families or their samples: the
    // hot-key gauges (a hot key and a short window), the near cache, and a
    // hand-off window (the reload below).
    let dir = TempDir::new("docs", "metrics");
    let config = dir.path("memring.toml");
    let text = |servers: &[&Memcached]| {
        crate::common::config_text(
            servers,
            "admin_listen = \"127.0.0.1:0\"\nhot_key_window_ms = 100\nhot_key_cache_ms = 1000\nhandoff_ms = 60000\n",
        )
    };
    std::fs::write(&config, text(&[&servers[0]])).unwrap();
    let proxy = Proxy::start_file(&config);
    let admin = proxy.running().admin_addr.expect("admin listener");
    let mut client = proxy.client();
    assert_eq!(client.set("hot", b"v"), b"STORED\r\n");
    let before = proxy.ring_version();
    std::fs::write(&config, text(&[&servers[0], &servers[1]])).unwrap();
    crate::common::wait_for("the reload with a second server", || {
        proxy.ring_version() > before
    });
    // Families are what `# TYPE` lines name; wait until the hot key has
    // samples, so the labelled gauges are filled in as well.
    let start = Instant::now();
    let mut body = http_body(admin, "/metrics");
    while !body.contains("\nmemring_hot_key_requests_per_second{") {
        assert!(
            start.elapsed() < DEADLINE,
            "no hot-key gauge appeared:\n{body}"
        );
        for _ in 0..50 {
            client.get("hot");
        }
        body = http_body(admin, "/metrics");
    }
    let seen: BTreeSet<String> = body
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(String::from)
        .collect();
    assert!(seen.len() > 15, "{seen:?}");

    let pages = pages();
    let missing: Vec<&String> = seen
        .iter()
        .filter(|family| {
            // a counter's family may be written with its samples' `_total`
            let total = format!("{family}_total");
            !pages.iter().any(|page| {
                names_in_code(&page.text, family)
                    || (!family.ends_with("_total") && names_in_code(&page.text, &total))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metric families on /metrics that no page names: {missing:?}"
    );
}

/// Whether `text` has `word` with no name character (letter, digit, `_`,
/// `:`) on either side, in prose or in a code block.
fn mentions(text: &str, word: &str) -> bool {
    let name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(name)
            && !text[at + word.len()..].chars().next().is_some_and(name)
    })
}

#[test]
fn every_stats_field_is_documented() {
    let servers = [Memcached::start(), Memcached::start()];
    let proxy = Proxy::start(&[&servers[0], &servers[1]], "hot_key_window_ms = 100\n");
    let mut client = proxy.client();
    assert_eq!(client.set("hot", b"v"), b"STORED\r\n");
    let start = Instant::now();
    let mut hotkeys = client.stats("hotkeys");
    while !hotkeys.iter().any(|(name, _)| name.starts_with("hotkey:")) {
        assert!(start.elapsed() < DEADLINE, "no hot key listed: {hotkeys:?}");
        for _ in 0..50 {
            client.get("hot");
        }
        hotkeys = client.stats("hotkeys");
    }
    // One server's lines stand for all (`server:<name>:state`), and the
    // hottest key's for every rank (`hotkey:1:key`).
    let server = format!("server:{}:", servers[0].addr());
    let fields: BTreeSet<String> = client
        .stats("")
        .into_iter()
        .chain(hotkeys)
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with("server:") || name.starts_with(&server))
        .filter(|name| !name.starts_with("hotkey:") || name.starts_with("hotkey:1:"))
        .map(|name| name.replace(&server, "server:<name>:"))
        .collect();
    assert!(fields.len() > 30, "{fields:?}");
    // `stats shadow`, from a pool with a shadow: one pool's lines stand for
    // all (`shadow:<pool>:compared`).
    let shadow = Memcached::start();
    let shadowed = Proxy::start_text(&format!(
        "{}[shadow]\npool = \"candidate\"\n[[pools]]\nname = \"candidate\"\n[[pools.servers]]\naddr = \"{}\"\n",
        crate::common::config_text(&[&servers[0]], ""),
        shadow.addr()
    ));
    let shadow_fields: Vec<String> = shadowed
        .client()
        .stats("shadow")
        .into_iter()
        .map(|(name, _)| name.replace("shadow:default:", "shadow:<pool>:"))
        .collect();
    assert!(shadow_fields.len() > 10, "{shadow_fields:?}");
    let fields: BTreeSet<String> = fields.into_iter().chain(shadow_fields).collect();
    let pages = pages();
    let missing: Vec<&String> = fields
        .iter()
        .filter(|field| !pages.iter().any(|page| mentions(&page.text, field)))
        .collect();
    assert!(
        missing.is_empty(),
        "STAT lines of `stats`, `stats hotkeys` and `stats shadow` that no page names: {missing:?}"
    );
}

/// The subcommands `memring --help` lists, without `help`.
fn subcommands() -> Vec<String> {
    let output = Command::new(BIN)
        .arg("--help")
        .output()
        .expect("memring runs");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let commands: Vec<String> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect();
    assert!(commands.len() >= 5, "{help}");
    commands
}

#[test]
fn every_subcommand_has_a_page_in_the_index() {
    let index = std::fs::read_to_string(Path::new(ROOT).join("docs/README.md")).unwrap();
    for command in subcommands() {
        let page = Path::new(ROOT).join(format!("docs/{command}.md"));
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|_| panic!("`memring {command}` has no page docs/{command}.md"));
        assert!(
            text.lines()
                .next()
                .is_some_and(|title| title.starts_with(&format!("# memring {command}"))),
            "docs/{command}.md does not start with `# memring {command}`"
        );
        assert!(
            index.contains(&format!("]({command}.md)")),
            "docs/README.md does not link docs/{command}.md"
        );
    }
}

#[test]
fn every_page_is_in_the_index_and_linked_from_the_readme() {
    let index = std::fs::read_to_string(Path::new(ROOT).join("docs/README.md")).unwrap();
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let mut unlisted = Vec::new();
    for page in pages() {
        let Some(name) = page.path.strip_prefix("docs/") else {
            continue;
        };
        if name != "README.md" && !index.contains(&format!("]({name})")) {
            unlisted.push(format!("docs/README.md does not link {name}"));
        }
        if !readme.contains(&format!("](docs/{name})")) {
            unlisted.push(format!("README.md does not link docs/{name}"));
        }
    }
    assert!(unlisted.is_empty(), "{}", unlisted.join("\n"));
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as
/// hyphens.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|(_, line)| line.strip_prefix('#'))
        .map(|rest| anchor_of(rest.trim_start_matches('#')))
        .collect()
}

/// `(line, target)` of every Markdown link `[text](target)` outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose(text) {
        // code spans hold examples, not links
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        for (at, _) in plain.match_indices("](") {
            let rest = &plain[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push((number, rest[..end].to_string()));
            }
        }
    }
    found
}

#[test]
fn every_relative_link_resolves_to_a_file_and_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let dir = Path::new(&page.path).parent().unwrap_or(Path::new(""));
        for (line, target) in links(&page.text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let relative: PathBuf = if file.is_empty() {
                PathBuf::from(&page.path)
            } else {
                normalise(&dir.join(file))
            };
            let path = Path::new(ROOT).join(&relative);
            let shown = relative.to_string_lossy().into_owned();
            if !path.exists() {
                if !PENDING.contains(&shown.as_str()) {
                    broken.push(format!("{}:{line}: {target}: no such file", page.path));
                }
                continue;
            }
            if let (Some(anchor), true) = (anchor, shown.ends_with(".md")) {
                let text = std::fs::read_to_string(&path).unwrap();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{}:{line}: {target}: no such heading", page.path));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str()),
        }
    }
    parts.iter().collect()
}

/// One command of a console block and the lines it must print.
struct Example {
    page: String,
    line: usize,
    command: String,
    expected: Vec<String>,
}

/// A page's console examples and the files its `file=NAME` blocks define.
fn examples(page: &Page) -> (Vec<Example>, Vec<(String, String)>) {
    let mut examples: Vec<Example> = Vec::new();
    let mut files = Vec::new();
    let mut lines = page.text.lines().enumerate();
    while let Some((_, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let info = info.trim();
        let file = info
            .split_whitespace()
            .find_map(|word| word.strip_prefix("file="))
            .map(String::from);
        let mut body = Vec::new();
        for (number, line) in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            body.push((number + 1, line));
        }
        if let Some(name) = file {
            let text: String = body.iter().map(|(_, l)| format!("{l}\n")).collect();
            files.push((name, text));
        } else if info != "console" {
            // A command with its output outside a console block would not be
            // run: make it a console block, or show the command alone in sh.
            if let Some((number, line)) =
                body.iter().find(|(_, l)| l.trim_start().starts_with("$ "))
            {
                panic!(
                    "{}:{number}: `{line}` is shown with `$ ` in a ```{info} block, which is not tested; use ```console",
                    page.path
                );
            }
        } else {
            for (number, line) in body {
                match (line.strip_prefix("$ "), examples.last_mut()) {
                    (Some(command), _) => examples.push(Example {
                        page: page.path.clone(),
                        line: number,
                        command: command.to_string(),
                        expected: Vec::new(),
                    }),
                    (None, Some(example)) if example.page == page.path => {
                        example.expected.push(line.to_string())
                    }
                    (None, _) => panic!(
                        "{}:{number}: a console block must start with a `$ ` command",
                        page.path
                    ),
                }
            }
        }
    }
    (examples, files)
}

/// Whether `actual` is `expected`, where `[..]` in `expected` matches any text.
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || !actual[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &actual[first.len()..actual.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Replaces every `from` with its `to`, longest first, so that no address is
/// replaced inside a longer one.
fn replace_all(text: &str, pairs: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = pairs.iter().collect();
    pairs.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    // Through unique markers, so that a replacement is never replaced again.
    let mut text = text.to_string();
    for (i, (from, _)) in pairs.iter().enumerate() {
        text = text.replace(from.as_str(), &format!("\u{0}{i}\u{0}"));
    }
    for (i, (_, to)) in pairs.iter().enumerate() {
        text = text.replace(&format!("\u{0}{i}\u{0}"), to);
    }
    text
}

/// Runs `command` with `sh` in `dir`; stdout and stderr as one stream.
fn run_shell(command: &str, dir: &Path) -> String {
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_path = dir.join(".output");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new("sh");
    // Its own process group, so that a timeout kills memring with the shell.
    std::os::unix::process::CommandExt::process_group(&mut child, 0);
    let mut child = child
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("sh runs");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait for sh").is_some() {
            break;
        }
        if start.elapsed() > DEADLINE {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            panic!("`{command}` did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::fs::read_to_string(&out_path).unwrap()
}

#[test]
fn every_command_shown_with_its_output_prints_that_output() {
    let servers = [Memcached::start(), Memcached::start(), Memcached::start()];
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "admin_listen = \"127.0.0.1:0\"\n",
    );
    let admin = proxy.running().admin_addr.expect("admin listener");
    // Documented address -> the real one.
    let real: Vec<(String, String)> = vec![
        ("127.0.0.1:21211".into(), servers[0].addr()),
        ("127.0.0.1:21212".into(), servers[1].addr()),
        ("127.0.0.1:21213".into(), servers[2].addr()),
        (
            "localhost:21211".into(),
            format!("localhost:{}", servers[0].port),
        ),
        ("127.0.0.1:22122".into(), proxy.addr.to_string()),
        ("127.0.0.1:9100".into(), admin.to_string()),
    ];
    let back: Vec<(String, String)> = real.iter().map(|(d, r)| (r.clone(), d.clone())).collect();

    let mut failures = Vec::new();
    let mut shown = BTreeSet::new();
    let mut ran = 0;
    for page in pages() {
        let (examples, files) = examples(&page);
        if examples.is_empty() {
            continue;
        }
        let stem = page.path.replace(['/', '.'], "-");
        let dir = TempDir::new("docs", &stem);
        let scratch = dir.path("");
        std::fs::create_dir_all(scratch.join("config")).unwrap();
        for entry in std::fs::read_dir(Path::new(ROOT).join("config")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                std::fs::copy(
                    &path,
                    scratch.join("config").join(path.file_name().unwrap()),
                )
                .unwrap();
            }
        }
        for (name, text) in &files {
            std::fs::write(scratch.join(name), replace_all(text, &real)).unwrap();
        }
        for example in examples {
            ran += 1;
            if let Some(word) = example.command.split_whitespace().nth(1) {
                shown.insert(word.to_string());
            }
            let output = run_shell(&replace_all(&example.command, &real), &scratch);
            let output = replace_all(&output, &back);
            let actual: Vec<&str> = output.lines().collect();
            let same = actual.len() == example.expected.len()
                && actual
                    .iter()
                    .zip(&example.expected)
                    .all(|(a, e)| line_matches(e, a));
            if !same {
                failures.push(format!(
                    "{}:{}: $ {}\n--- the page shows\n{}\n--- memring printed\n{}",
                    example.page,
                    example.line,
                    example.command,
                    example.expected.join("\n"),
                    actual.join("\n")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} documented commands print something else:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    for command in ["check", "plan", "send", "import", "healthcheck"] {
        assert!(
            shown.contains(command),
            "no page shows `memring {command}` in a console block ({shown:?})"
        );
    }
}

#[test]
fn the_example_conventions_read_what_they_should() {
    assert!(line_matches(
        "memring [..] (commit [..])",
        "memring 0.1.0 (commit abc)"
    ));
    assert!(!line_matches("memring [..] (commit [..])", "memring 0.1.0"));
    assert!(line_matches("a[..]", "a"));
    assert!(!line_matches("ab", "abc"));
    let pairs = vec![
        ("127.0.0.1:1".to_string(), "127.0.0.1:12".to_string()),
        ("127.0.0.1:12".to_string(), "127.0.0.1:1".to_string()),
    ];
    assert_eq!(
        replace_all("127.0.0.1:12 127.0.0.1:1", &pairs),
        "127.0.0.1:1 127.0.0.1:12"
    );
    assert_eq!(
        anchor_of(" Prometheus, `/live` and `/ready`"),
        "prometheus-live-and-ready"
    );
    assert!(names_in_code(
        "see `memring_x_total{a}`.",
        "memring_x_total"
    ));
    assert!(!names_in_code(
        "see `memring_x_total_more`.",
        "memring_x_total"
    ));
    assert!(!names_in_code("see memring_x_total.", "memring_x_total"));
}
