//! CPU time of processes from `/proc/PID/stat`: how much of the machine the
//! members and the harness itself used during a measurement.

use std::time::Instant;

use anyhow::{Context, Result};

/// utime + stime of the process whose `stat` file is at `path`, in clock ticks.
pub fn cpu_ticks(path: &str) -> Result<u64> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) may hold spaces; fields 14 and 15 count from after it.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).with_context(|| format!("no ')' in {path}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        fields.get(n - 3).and_then(|v| v.parse().ok()).with_context(|| format!("field {n} of {path}"))
    };
    Ok(field(14)? + field(15)?)
}

/// `getconf CLK_TCK`: the unit of `/proc/PID/stat`'s CPU times (100 on Linux).
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// CPU used by the members and by this process from `start` to `finish`.
pub struct Sampler {
    pids: Vec<u32>,
    members: Vec<u64>,
    harness: u64,
    since: Instant,
}

/// What a [`Sampler`] measured, in seconds of CPU.
pub struct CpuUsed {
    pub members: Vec<f64>,
    pub harness: f64,
    pub wall: f64,
}

impl CpuUsed {
    /// Adds another sample of the same processes to this one.
    pub fn absorb(&mut self, other: &CpuUsed) {
        for (mine, theirs) in self.members.iter_mut().zip(&other.members) {
            *mine += theirs;
        }
        self.harness += other.harness;
        self.wall += other.wall;
    }
}

impl Sampler {
    pub fn start(pids: Vec<u32>) -> Result<Sampler> {
        let members = pids.iter().map(|pid| cpu_ticks(&format!("/proc/{pid}/stat"))).collect::<Result<_>>()?;
        Ok(Sampler { pids, members, harness: cpu_ticks("/proc/self/stat")?, since: Instant::now() })
    }

    pub fn finish(self) -> Result<CpuUsed> {
        let tick = 1.0 / clock_ticks_per_second() as f64;
        let mut members = Vec::with_capacity(self.pids.len());
        for (pid, before) in self.pids.iter().zip(&self.members) {
            members.push(cpu_ticks(&format!("/proc/{pid}/stat"))?.saturating_sub(*before) as f64 * tick);
        }
        let harness = cpu_ticks("/proc/self/stat")?.saturating_sub(self.harness) as f64 * tick;
        Ok(CpuUsed { members, harness, wall: self.since.elapsed().as_secs_f64() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_skips_a_command_name_with_spaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stat");
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        std::fs::write(&path, "42 (a b) S 1 42 42 0 -1 4194560 10 0 0 0 170 30 0 0 20 0 9 0\n").unwrap();
        assert_eq!(cpu_ticks(path.to_str().unwrap()).unwrap(), 200);
    }

    #[test]
    fn the_sampler_sees_this_process_work() {
        let sampler = Sampler::start(vec![std::process::id()]).unwrap();
        let until = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let used = sampler.finish().unwrap();
        assert!(used.members[0] > 0.1, "{}", used.members[0]);
        assert!(used.harness > 0.1);
        assert!(used.wall >= 0.3);
    }
}
