//! The process's own figures, read from `/proc` when asked (per `stats` and
//! per scrape, never per request): the CPU time memring has used, as
//! `memring_cpu_seconds_total` and memcached's `rusage_user` and
//! `rusage_system`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// CPU time the process has used, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CpuTime {
    pub user_micros: u64,
    pub system_micros: u64,
}

/// The kernel reports `/proc` times in `USER_HZ` ticks, which Linux fixes at
/// 100 per second for user space on every architecture memring builds for
/// (`sysconf(_SC_CLK_TCK)` would need `unsafe` or another dependency).
const USER_HZ: u64 = 100;

/// This process's user and system CPU time from `/proc/self/stat` (all zero
/// where there is none). Read per `stats` and per scrape, never per request.
pub(crate) fn process_cpu() -> CpuTime {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| cpu_of_proc_stat(&stat))
        .unwrap_or_default()
}

/// `utime` and `stime`, fields 14 and 15 of `proc_pid_stat(5)`, counted after
/// the command name, which is in parentheses and may hold spaces or `)`.
fn cpu_of_proc_stat(stat: &str) -> Option<CpuTime> {
    let (_, after_name) = stat.rsplit_once(") ")?;
    // `after_name` starts at field 3 (the state).
    let mut fields = after_name.split_ascii_whitespace().skip(11);
    let mut micros = || -> Option<u64> {
        let ticks: u64 = fields.next()?.parse().ok()?;
        Some(ticks * (1_000_000 / USER_HZ))
    };
    Some(CpuTime {
        user_micros: micros()?,
        system_micros: micros()?,
    })
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: &'static str,
}

/// `memring_cpu_seconds_total{mode}`, read from `/proc` at each scrape.
#[derive(Debug)]
pub(super) struct ProcessCpu;

impl Collector for ProcessCpu {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let cpu = process_cpu();
        let counter = ConstCounter::new(0.0f64);
        let mut family = encoder.encode_descriptor(
            "cpu_seconds",
            "CPU time memring has used, user and system (memcached's rusage_user and rusage_system)",
            None,
            counter.metric_type(),
        )?;
        for (mode, micros) in [("user", cpu.user_micros), ("system", cpu.system_micros)] {
            let labels = ModeLabels { mode };
            let sample = family.encode_family(&labels)?;
            ConstCounter::new(micros as f64 / 1e6).encode(sample)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_the_command_name() {
        let stat = "4242 (mem ring) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    123 45 0 0 20 0 3 0 1000 2000000 300 18446744073709551615";
        assert_eq!(
            cpu_of_proc_stat(stat),
            Some(CpuTime {
                user_micros: 1_230_000,
                system_micros: 450_000,
            })
        );
        assert_eq!(cpu_of_proc_stat("4242 (memring) S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").expect("Linux procfs");
        assert!(cpu_of_proc_stat(&own).is_some(), "{own}");
    }
}
