//! `memring man [--dir DIR]`: the manual pages, generated from the clap
//! definition so they say what `--help` says. Without `--dir`, memring(1)
//! goes to stdout; with it, memring.1 and one memring-COMMAND.1 per
//! subcommand (which memring(1) refers to) are written into DIR. Packagers run
//! it at build time (`scripts/package`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Writes memring(1) to stdout.
///
/// # Errors
///
/// When stdout cannot be written.
pub(crate) fn print(command: clap::Command) -> std::io::Result<()> {
    let page = main_page(command)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&page)?;
    out.flush()
}

/// Writes memring.1 and a page per subcommand into `dir` (which must exist)
/// and returns their paths, memring.1 last.
///
/// # Errors
///
/// When a page cannot be written.
pub(crate) fn write_all(command: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut command = without_help(command);
    // Building names the subcommands `memring-check` and so on.
    command.build();
    let mut written = Vec::new();
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        written.push(clap_mangen::Man::new(sub.clone()).generate_to(dir)?);
    }
    let path = dir.join("memring.1");
    std::fs::write(&path, main_page(command)?)?;
    written.push(path);
    Ok(written)
}

/// Writes every page into `dir` ([`write_all`]) and prints their paths.
///
/// # Errors
///
/// When a page cannot be written.
pub(crate) fn print_pages(command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    let pages = write_all(command, dir)
        .with_context(|| format!("cannot write the pages into {}", dir.display()))?;
    for page in pages {
        println!("{}", page.display());
    }
    Ok(())
}

/// What an operator looks for in memring(1) that `--help` does not say.
const MAIN_PAGE_TAIL: &str = r".SH FILES
.TP
\fI/etc/memring/memring.toml\fR
The config that the Debian package installs and its memring.service runs.
memring reloads it when the file changes or on SIGHUP
(\fBsystemctl reload memring\fR); \fBmemring check\fR validates it.
.SH SEE ALSO
\fBmemcached\fR(1), \fBsystemctl\fR(1), \fBjournalctl\fR(1)
";

/// `help` is clap's, not memring's: it gets no page, and memring(1) must not
/// refer to a memring-help(1) that does not exist.
fn without_help(command: clap::Command) -> clap::Command {
    command.disable_help_subcommand(true)
}

fn main_page(command: clap::Command) -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(without_help(command)).render(&mut page)?;
    page.extend_from_slice(MAIN_PAGE_TAIL.as_bytes());
    Ok(page)
}
