//! CPU accounting from /proc: a process's utime+stime and the machine's per-CPU busy time,
//! sampled at the edges of the measured window so the report can say what limited the run.
//! Linux only; readings that fail are reported as absent, never guessed.

use std::fs;

/// Kernel clock ticks per second (the unit of /proc times).
pub fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf takes no pointers and only reads a configuration constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (utime, stime) of `pid` ("self" for this process) in clock ticks.
pub fn process_cpu_ticks(pid: &str) -> Option<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) is parenthesised and may hold spaces: split after the last ')'.
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    // After ')' the first field is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// (busy, total) ticks for one CPU line of /proc/stat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub busy: u64,
    pub total: u64,
}

/// Index 0 is the aggregate "cpu" line, then cpu0, cpu1, ...
pub fn machine_cpu_ticks() -> Vec<CpuTicks> {
    let Ok(text) = fs::read_to_string("/proc/stat") else {
        return Vec::new();
    };
    parse_proc_stat(&text)
}

pub fn parse_proc_stat(text: &str) -> Vec<CpuTicks> {
    let mut out = Vec::new();
    for line in text.lines() {
        if !line.starts_with("cpu") {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest is already inside user).
        let nums: Vec<u64> = line.split_ascii_whitespace().skip(1).take(8).filter_map(|f| f.parse().ok()).collect();
        if nums.len() < 4 {
            continue;
        }
        let total: u64 = nums.iter().sum();
        let idle = nums[3] + nums.get(4).copied().unwrap_or(0);
        out.push(CpuTicks { busy: total - idle, total });
    }
    out
}

/// Busy percentage per CPU line between two samples.
pub fn busy_pct(before: &[CpuTicks], after: &[CpuTicks]) -> Vec<f64> {
    before
        .iter()
        .zip(after.iter())
        .map(|(b, a)| {
            let total = a.total.saturating_sub(b.total);
            if total == 0 {
                0.0
            } else {
                100.0 * a.busy.saturating_sub(b.busy) as f64 / total as f64
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_lines() {
        let t = "cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 5 0 5 35 5 0 0 0 0 0\nintr 1 2\n";
        let v = parse_proc_stat(t);
        assert_eq!(v, vec![CpuTicks { busy: 20, total: 100 }, CpuTicks { busy: 10, total: 50 }]);
        let after = vec![CpuTicks { busy: 70, total: 200 }, CpuTicks { busy: 10, total: 100 }];
        assert_eq!(busy_pct(&v, &after), vec![50.0, 0.0]);
    }

    #[test]
    fn reads_own_cpu_time() {
        assert!(process_cpu_ticks("self").is_some());
        assert!(!machine_cpu_ticks().is_empty());
    }
}
