//! Logging for every subcommand: `--log-level` (or `RUST_LOG`) and
//! `--log-format`, to stderr.

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

pub(crate) fn init_logging(level: Option<&str>, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let directives = match level {
        Some(level) => level.to_string(),
        None => std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string()),
    };
    // notify logs every inotify event at trace level. With the log file next
    // to the config, each of those lines would be an event, logged in turn:
    // keep notify at info unless the filter names it.
    let directives = if directives.contains("notify") {
        directives
    } else {
        format!("{directives},notify=info")
    };
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("memring: bad log filter `{directives}` ({e}); using info");
        EnvFilter::new("info")
    });
    // A log reader that goes away (a closed stderr pipe) must not take the
    // proxy down: without this, tracing-subscriber reports the failed write
    // with eprintln!, which panics when stderr is gone.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}
