//! What the host is: CPUs, memory, disk and process figures read from
//! `/proc` and `statvfs`, and the facts the Node's `nodeInfo` reports.
//! Parsing is separate from reading so it is tested on fixed text.

use std::path::Path;

/// The host's figures at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFigures {
    /// CPUs the agent may use.
    pub cpus: u64,
    /// Total memory in bytes.
    pub memory_total: u64,
    /// Memory available to new work in bytes (MemAvailable).
    pub memory_available: u64,
    /// Size of the filesystem holding the data dir, in bytes.
    pub disk_total: u64,
    /// Bytes free on it for unprivileged use.
    pub disk_available: u64,
    /// Processes (threads) running now.
    pub pids_running: u64,
    /// The kernel's limit on pids.
    pub pids_max: u64,
}

/// Facts about the host for `status.nodeInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostInfo {
    /// `uname -r`.
    pub kernel_version: String,
    /// /etc/os-release's PRETTY_NAME.
    pub os_image: String,
    /// /etc/machine-id.
    pub machine_id: String,
    /// This boot's id.
    pub boot_id: String,
    /// e.g. "amd64".
    pub architecture: String,
}

/// Reads the host's figures; the disk figures are those of `data_dir`'s
/// filesystem.
pub fn figures(data_dir: &Path) -> HostFigures {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (memory_total, memory_available) = parse_meminfo(&meminfo);
    let (disk_total, disk_available) = match rustix::fs::statvfs(data_dir) {
        Ok(s) => (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize),
        Err(_) => (0, 0),
    };
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pids_max = read_trimmed("/proc/sys/kernel/pid_max").and_then(|s| s.parse().ok()).unwrap_or(32768);
    HostFigures {
        cpus: std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1),
        memory_total,
        memory_available,
        disk_total,
        disk_available,
        pids_running: parse_loadavg_threads(&loadavg),
        pids_max,
    }
}

/// Reads the facts `nodeInfo` reports.
pub fn info() -> HostInfo {
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    HostInfo {
        kernel_version: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
        os_image: parse_os_release(&os_release).unwrap_or_else(|| "Linux".to_string()),
        machine_id: read_trimmed("/etc/machine-id").unwrap_or_default(),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
        architecture: go_arch(std::env::consts::ARCH).to_string(),
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// (MemTotal, MemAvailable) in bytes.
fn parse_meminfo(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .unwrap_or(0)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The total of scheduling entities from `/proc/loadavg` ("0.1 0.2 0.3 2/345 6789").
fn parse_loadavg_threads(text: &str) -> u64 {
    text.split_whitespace().nth(3).and_then(|f| f.split('/').nth(1)).and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn parse_os_release(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|v| v.trim_matches('"').to_string())
}

/// Kubernetes names architectures as Go does.
fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_gives_total_and_available_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text), (24_000_000 * 1024, 20_000_000 * 1024));
        assert_eq!(parse_meminfo(""), (0, 0));
    }

    #[test]
    fn loadavg_gives_the_number_of_threads() {
        assert_eq!(parse_loadavg_threads("0.52 0.58 0.59 3/467 12345\n"), 467);
        assert_eq!(parse_loadavg_threads("garbage"), 0);
    }

    #[test]
    fn os_release_gives_the_pretty_name() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(parse_os_release(text).as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
    }

    #[test]
    fn architectures_are_named_as_go_names_them() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("riscv64"), "riscv64");
    }

    #[test]
    fn the_running_host_has_memory_and_cpus() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = figures(dir.path());
        assert!(f.cpus >= 1 && f.memory_total > 0 && f.disk_total > 0, "{f:?}");
    }
}
