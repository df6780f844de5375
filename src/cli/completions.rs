//! `memring completions SHELL`: print a completion script for bash, zsh,
//! fish, elvish or PowerShell to stdout, generated from the clap definition so
//! it cannot fall behind the real options. Packagers run it at build time
//! (`scripts/package`); a user can also source its output directly.

use std::io::Write;

use clap_complete::Shell;

/// Writes the completion script for `shell` to stdout.
///
/// # Errors
///
/// When stdout cannot be written (a closed pipe, a full disk).
pub(crate) fn print(shell: Shell, mut command: clap::Command) -> std::io::Result<()> {
    let name = command.get_name().to_string();
    let mut out = std::io::stdout().lock();
    // clap_complete panics when a write fails: render into memory first, so
    // that a closed pipe comes back as an error instead.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut script);
    out.write_all(&script)?;
    out.flush()
}
