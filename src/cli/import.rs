//! `memring import twemproxy FILE [POOL]`: print the memring config that
//! keeps every key of a twemproxy pool where it is. The translation itself
//! (text in, text out) is `twemproxy.rs`; this reads the file, checks that
//! memring loads the result, and prints it.

use std::path::Path;

use anyhow::Context as _;

use memring::config::Config;

mod twemproxy;

/// Translates the twemproxy config `file` (its pool `pool`, or every pool)
/// and prints it, with a note on stderr for each setting with no equivalent.
pub(crate) fn run(file: &Path, pool: Option<&str>) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let (toml, unmapped) = twemproxy::twemproxy(&text, pool)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    // Print only what memring itself accepts.
    Config::parse(&toml, "imported config")
        .map_err(|e| anyhow::anyhow!("the imported config does not load: {e}"))?;
    print!("{toml}");
    for note in &unmapped {
        eprintln!("memring import: no equivalent for {note}");
    }
    Ok(())
}
