//! The results table: one row per scenario and metric, Skiff next to etcd
//! with their ratio, the targets checked, and the machine the numbers
//! came from. Rendered as Markdown for the terminal and for bench/README.md.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::{Context, Result};

use crate::cluster::System;

/// Lines between these markers in bench/README.md are replaced by each run.
pub const BEGIN: &str = "<!-- skiff-bench results: begin (written by `make bench`) -->";
pub const END: &str = "<!-- skiff-bench results: end -->";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One number measured for one system.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub scenario: String,
    pub metric: &'static str,
    pub better: Better,
    pub value: f64,
}

/// Everything measured in one run, per system, in scenario order.
#[derive(Default)]
pub struct Report {
    pub results: BTreeMap<System, Vec<Measurement>>,
    /// One-line summaries per scenario (errors, samples), shown under the table.
    pub details: BTreeMap<System, Vec<String>>,
    /// How the run was configured (durations, clients, kills).
    pub settings: Vec<String>,
    pub machine: Vec<(String, String)>,
    pub command: String,
    pub date: String,
}

impl Report {
    pub fn record(&mut self, system: System, scenario: &str, metric: &'static str, better: Better, value: f64) {
        self.results.entry(system).or_default().push(Measurement {
            scenario: scenario.to_string(),
            metric,
            better,
            value,
        });
    }

    pub fn detail(&mut self, system: System, line: String) {
        self.details.entry(system).or_default().push(line);
    }

    fn value(&self, system: System, scenario: &str, metric: &str) -> Option<f64> {
        self.results.get(&system)?.iter().find(|m| m.scenario == scenario && m.metric == metric).map(|m| m.value)
    }

    /// The comparison table, rows in the order they were measured.
    pub fn table(&self) -> String {
        let mut rows: Vec<&Measurement> = Vec::new();
        for measurements in self.results.values() {
            for m in measurements {
                if !rows.iter().any(|r| r.scenario == m.scenario && r.metric == m.metric) {
                    rows.push(m);
                }
            }
        }
        let mut out = String::new();
        out.push_str("| scenario | metric | Skiff | etcd | Skiff/etcd |\n");
        out.push_str("| --- | --- | ---: | ---: | ---: |\n");
        for row in rows {
            let skiff = self.value(System::Skiff, &row.scenario, row.metric);
            let etcd = self.value(System::Etcd, &row.scenario, row.metric);
            let ratio = match (skiff, etcd) {
                (Some(s), Some(e)) if e > 0.0 => format!("{:.2}", s / e),
                _ => "-".to_string(),
            };
            let arrow = match row.better {
                Better::Higher => "higher is better",
                Better::Lower => "lower is better",
            };
            let _ = writeln!(
                out,
                "| {} | {} ({arrow}) | {} | {} | {ratio} |",
                row.scenario,
                row.metric,
                format_value(skiff),
                format_value(etcd)
            );
        }
        out
    }

    /// The targets, each with its verdict for this run.
    pub fn targets(&self) -> String {
        let mut out = String::new();
        let verdict = |ok: Option<bool>| match ok {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let put256 = self.value(System::Skiff, "put, 256 clients", "throughput ops/s");
        let put256_etcd = self.value(System::Etcd, "put, 256 clients", "throughput ops/s");
        let ratio = put256.zip(put256_etcd).filter(|(_, e)| *e > 0.0).map(|(s, e)| s / e);
        let _ = writeln!(
            out,
            "- Put throughput at 256 clients at least 1.5x etcd's: {} ({}x)",
            verdict(ratio.map(|r| r >= 1.5)),
            ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".into())
        );
        let p99 = self.value(System::Skiff, "put, 1 client", "p99 ms");
        let p99_etcd = self.value(System::Etcd, "put, 1 client", "p99 ms");
        let _ = writeln!(
            out,
            "- Put p99 at 1 client no worse than etcd's: {} ({} ms vs {} ms)",
            verdict(p99.zip(p99_etcd).map(|(s, e)| s <= e)),
            format_value(p99),
            format_value(p99_etcd)
        );
        let median = self.value(System::Skiff, "failover", "median ms");
        let max = self.value(System::Skiff, "failover", "max ms");
        let _ = writeln!(
            out,
            "- Failover median under 1 s: {} ({} ms); max under 2 s: {} ({} ms)",
            verdict(median.map(|m| m < 1000.0)),
            format_value(median),
            verdict(max.map(|m| m < 2000.0)),
            format_value(max)
        );
        let watch = self.results.get(&System::Skiff).and_then(|ms| {
            ms.iter().find(|m| m.scenario.starts_with("watch,") && m.metric == "p99 ms").map(|m| m.value)
        });
        let _ = writeln!(
            out,
            "- Watch p99 delivery under 50 ms with 1,000 watchers at 1,000 writes/s: {} ({} ms)",
            verdict(watch.map(|p| p < 50.0)),
            format_value(watch)
        );
        out
    }

    /// The whole results section as it goes into bench/README.md.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Last run: {}, with `{}`.\n", self.date, self.command);
        out.push_str(&self.table());
        out.push_str("\nTargets from issue 3 (Skiff's numbers):\n\n");
        out.push_str(&self.targets());
        out.push_str("\nSettings:\n\n");
        for setting in &self.settings {
            let _ = writeln!(out, "- {setting}");
        }
        out.push_str("\nMachine:\n\n");
        for (name, value) in &self.machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        for (system, lines) in &self.details {
            let _ = writeln!(out, "\n{} details:\n", system.name());
            for line in lines {
                let _ = writeln!(out, "- {line}");
            }
        }
        out
    }
}

fn format_value(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Replaces the results section of the README at `path` (between the
/// markers), or appends one when the markers are missing.
pub fn write_readme(path: &Path, section: &str) -> Result<()> {
    write_section(path, BEGIN, END, "Latest results", section)
}

/// Replaces what lies between the markers `begin` and `end` in the README
/// at `path`, or appends the markers under a `## heading` when they are
/// missing. Each command that writes results has its own pair of markers.
pub fn write_section(path: &Path, begin: &str, end: &str, heading: &str, section: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let block = format!("{begin}\n{section}{end}");
    let updated = match (text.find(begin), text.find(end)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{}\n## {heading}\n\n{block}\n", text.trim_end()),
    };
    std::fs::write(path, updated).with_context(|| format!("writing {}", path.display()))
}

/// The 1, 5 and 15 minute load averages: other work on the machine skews the numbers.
pub fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Facts about this machine that the numbers depend on.
pub fn machine_facts() -> Vec<(String, String)> {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    vec![
        ("CPU".into(), format!("{cpu}, {cores} cores")),
        ("memory".into(), memory),
        ("kernel".into(), kernel),
        ("load average before the run".into(), load_average()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pairs_systems_and_divides() {
        let mut report = Report::default();
        report.record(System::Skiff, "put, 1 client", "throughput ops/s", Better::Higher, 300.0);
        report.record(System::Etcd, "put, 1 client", "throughput ops/s", Better::Higher, 200.0);
        report.record(System::Skiff, "failover", "median ms", Better::Lower, 450.0);
        let table = report.table();
        assert!(
            table.contains("| put, 1 client | throughput ops/s (higher is better) | 300 | 200 | 1.50 |"),
            "{table}"
        );
        assert!(table.contains("| failover | median ms (lower is better) | 450 | - | - |"), "{table}");
        assert!(report.targets().contains("Failover median under 1 s: met (450 ms)"));
    }

    #[test]
    fn readme_section_is_replaced_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("README.md");
        std::fs::write(&path, format!("# Bench\n\nintro\n\n{BEGIN}\nold\n{END}\n\ntrailer\n")).unwrap();
        write_readme(&path, "new\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("# Bench\n\nintro\n\n{BEGIN}\nnew\n{END}\n\ntrailer\n"));
        std::fs::write(&path, "# Bench\n").unwrap();
        write_readme(&path, "first\n").unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().ends_with(&format!("{BEGIN}\nfirst\n{END}\n")));
    }
}
