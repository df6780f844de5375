//! Subcommands of the `memring` binary that live outside `main.rs`, one file
//! each. They take the clap definition from `main` rather than importing it,
//! so nothing here points back up at `main`.

pub(crate) mod completions;
pub(crate) mod man;
