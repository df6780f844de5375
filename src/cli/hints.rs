//! One-line hints for people coming from twemproxy (nutcracker): its flags
//! given to memring, and its YAML config given where memring wants TOML,
//! each get the memring way of doing the same.

use std::path::Path;

/// nutcracker's flags, each with what memring does instead.
const NUTCRACKER_FLAGS: [(&str, &str, &str); 7] = [
    ("-t", "--test-conf", "nutcracker's -t (test the config) is `memring check FILE`"),
    ("-c", "--conf-file", "memring's -c/--config takes a memring TOML file; for nutcracker's YAML, `memring import twemproxy FILE > memring.toml` writes the equivalent"),
    ("-s", "--stats-port", "nutcracker's -s (stats port) is `admin_listen = \"127.0.0.1:9100\"` in the config (Prometheus on /metrics; memcached's `stats` on the listen port)"),
    ("-v", "--verbose", "nutcracker's -v N (log level) is `--log-level debug` (or `info`, `warn`; RUST_LOG works too)"),
    ("-d", "--daemonize", "memring does not daemonize (-d): run it in the foreground under systemd (debian/memring.service) or a container"),
    ("-o", "--output", "nutcracker's -o (log file): memring logs to stderr; redirect it, or let systemd or the container runtime keep it"),
    ("-a", "--stats-addr", "nutcracker's -a (stats address) is the address part of `admin_listen` in the config"),
];

/// The hint for the first nutcracker flag among `args` (the command line
/// without the program name) that memring has not understood.
pub(crate) fn nutcracker_flag(args: &[String]) -> Option<&'static str> {
    args.iter().find_map(|arg| {
        NUTCRACKER_FLAGS.iter().find_map(|&(short, long, hint)| {
            let given = arg == short
                || arg == long
                || arg.starts_with(&format!("{long}="))
                // `-v6`, `-s22222`: nutcracker's short flags take their value glued on.
                || (arg.starts_with(short) && arg.len() > 2 && short != "-c");
            given.then_some(hint)
        })
    })
}

/// The hint for a config file that reads as nutcracker's YAML, when `path`
/// is one.
pub(crate) fn nutcracker_yaml(path: &Path) -> Option<String> {
    let text = memring::inputs::regular_file::read_to_string(
        path,
        memring::inputs::regular_file::MAX_CONFIG_FILE_BYTES,
    )
    .ok()?;
    looks_like_nutcracker_yaml(path, &text).then(|| {
        format!(
            "{} looks like a twemproxy (nutcracker) YAML config; `memring import twemproxy {} > memring.toml` writes the memring equivalent",
            path.display(),
            path.display()
        )
    })
}

fn looks_like_nutcracker_yaml(path: &Path, text: &str) -> bool {
    let yaml_name = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yml") || e.eq_ignore_ascii_case("yaml"));
    let lines = || {
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
    };
    // `alpha:` alone on a line, then indented `listen:` or `servers:`.
    let pool_header = lines().any(|l| {
        !l.starts_with([' ', '\t', '-', '[']) && l.trim_end().ends_with(':') && !l.contains('=')
    });
    let pool_keys = lines().any(|l| {
        let t = l.trim_start();
        l.starts_with([' ', '\t']) && (t.starts_with("listen:") || t.starts_with("servers:"))
    });
    (yaml_name || pool_header) && pool_keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_nutcracker_flag_gets_its_memring_way() {
        for (given, word) in [
            (&["-t"][..], "memring check"),
            (&["-t", "-c", "x.yml"], "memring check"),
            (&["--test-conf"], "memring check"),
            (&["-s", "22222"], "admin_listen"),
            (&["-s22222"], "admin_listen"),
            (&["-v", "6"], "--log-level"),
            (&["-v6"], "--log-level"),
            (&["-d"], "foreground"),
            (&["--conf-file=x.yml"], "memring import twemproxy"),
        ] {
            let hint = nutcracker_flag(&args(given)).unwrap_or("");
            assert!(hint.contains(word), "{given:?}: {hint}");
        }
        assert_eq!(nutcracker_flag(&args(&["--config", "m.toml"])), None);
        assert_eq!(nutcracker_flag(&args(&["check", "m.toml"])), None);
    }

    #[test]
    fn nutcracker_yaml_is_told_from_memring_toml() {
        let yaml = "alpha:\n  listen: 127.0.0.1:22121\n  hash: fnv1a_64\n  servers:\n   - 127.0.0.1:11211:1\n";
        assert!(looks_like_nutcracker_yaml(Path::new("n.conf"), yaml));
        assert!(looks_like_nutcracker_yaml(Path::new("n.yml"), yaml));
        let toml = "listen = \"127.0.0.1:22122\"\n[[servers]]\naddr = \"127.0.0.1:11211\"\n";
        assert!(!looks_like_nutcracker_yaml(Path::new("m.toml"), toml));
        assert!(!looks_like_nutcracker_yaml(Path::new("m.yml"), toml));
    }
}
