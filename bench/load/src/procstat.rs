//! CPU time of a process from Linux's `/proc/PID/stat`, in clock ticks.
//! The caller converts ticks to seconds with `getconf CLK_TCK`, which this
//! crate does not call (it would need libc).

/// `utime + stime` of `pid` (`"self"` for this process), in clock ticks, or
/// `None` when the process is gone or the file cannot be read.
pub fn cpu_ticks(pid: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&text)
}

/// Parses the `stat` line. The command name (field 2) is in parentheses and
/// may itself contain spaces or `)`, so fields are counted after the last `)`:
/// field 3 (state) is the first there, so utime (14) and stime (15) are the
/// 12th and 13th.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_summed_past_an_odd_command_name() {
        let stat = "4242 (we ird) x) S 1 4242 4242 0 -1 4194560 120 0 0 0 \
                    37 5 0 0 20 0 3 0 100 1000000 200 18446744073709551615";
        assert_eq!(parse_cpu_ticks(stat), Some(42));
        assert_eq!(parse_cpu_ticks("1 (x) S 1"), None);
    }

    #[test]
    fn this_process_has_a_stat_line() {
        assert!(cpu_ticks("self").is_some());
    }
}
