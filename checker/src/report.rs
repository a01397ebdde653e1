//! The chaos run's report: what was done, which faults were injected and how
//! long the cluster was leaderless, what the checkers found. JSON for storage,
//! [`Report::summary`] for humans.

use serde::{Deserialize, Serialize};

use crate::error::CheckerError;
use crate::history::{Op, OpKind, Outcome};
use crate::linearizability::KvCheck;
use crate::verdict::{Unknown, Violation};

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// What was done (e.g. `kill`, `partition`, `pause`, `disk-stall`).
    pub kind: String,
    /// To what (e.g. `node-2`, `leader`, `node-1|node-3`).
    pub target: String,
    /// When it started, on the history's clock.
    pub at_ns: u64,
    /// When it was healed (`None`: never, or not healable).
    pub healed_at_ns: Option<u64>,
    /// How long the cluster had no leader because of it (`None`: not measured).
    #[serde(default)]
    pub leaderless_ms: Option<u64>,
}

/// Counts of the history's operations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationStats {
    pub total: u64,
    pub reads: u64,
    pub mutations: u64,
    /// Answered: reads with a value, mutations that took effect.
    pub ok: u64,
    /// Definitely not applied (including failed compares).
    pub failed: u64,
    /// Outcome unknown.
    pub indeterminate: u64,
}

impl OperationStats {
    /// Counts `history`.
    pub fn of(history: &[Op]) -> Self {
        let mut s = OperationStats::default();
        for op in history {
            s.total += 1;
            if matches!(op.kind, OpKind::Read) {
                s.reads += 1;
            } else {
                s.mutations += 1;
            }
            match op.result {
                Outcome::Read { .. } | Outcome::Ok { .. } => s.ok += 1,
                Outcome::Failed | Outcome::CasFailed => s.failed += 1,
                Outcome::Indeterminate => s.indeterminate += 1,
            }
        }
        s
    }
}

/// Failover times: how long the cluster stayed leaderless per fault that measured it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failover {
    pub samples: usize,
    pub p50_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

impl Failover {
    /// The median (nearest rank) and maximum of the faults' `leaderless_ms`.
    pub fn of(faults: &[Fault]) -> Self {
        let mut ms: Vec<u64> = faults.iter().filter_map(|f| f.leaderless_ms).collect();
        ms.sort_unstable();
        let p50 = ms.len().checked_sub(1).and_then(|last| ms.get(last / 2)).copied();
        Failover { samples: ms.len(), p50_ms: p50, max_ms: ms.last().copied() }
    }
}

/// Everything a chaos run reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The seed that reproduces the run.
    pub seed: u64,
    pub operations: OperationStats,
    pub faults: Vec<Fault>,
    pub failover_ms: Failover,
    pub violations: Vec<Violation>,
    /// Checks that ran out of budget.
    #[serde(default)]
    pub unknown: Vec<Unknown>,
}

impl Report {
    /// A report with the history's counts and the faults' failover times, and no findings yet.
    pub fn new(seed: u64, history: &[Op], faults: Vec<Fault>) -> Self {
        let failover_ms = Failover::of(&faults);
        Report { seed, operations: OperationStats::of(history), faults, failover_ms, ..Report::default() }
    }

    /// Adds the KV checker's violations and undecided keys.
    pub fn add_kv(&mut self, kv: &KvCheck) {
        self.violations.extend(kv.violations());
        self.unknown.extend(kv.unknown());
    }

    /// Adds violations from another check (watches, resource watches).
    pub fn add_violations(&mut self, violations: impl IntoIterator<Item = Violation>) {
        self.violations.extend(violations);
    }

    /// No violation was found (undecided keys do not fail a run; see [`Report::unknown`]).
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> Result<String, CheckerError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Parses [`Report::to_json`]'s output.
    pub fn from_json(json: &str) -> Result<Self, CheckerError> {
        Ok(serde_json::from_str(json)?)
    }

    /// A few human lines: verdict, counts, faults, failover, each violation.
    pub fn summary(&self) -> String {
        let o = &self.operations;
        let mut s = format!(
            "{} (seed {}): {} operations ({} reads, {} mutations; {} ok, {} failed, {} indeterminate), {} faults",
            if self.passed() { "PASS" } else { "FAIL" },
            self.seed,
            o.total,
            o.reads,
            o.mutations,
            o.ok,
            o.failed,
            o.indeterminate,
            self.faults.len()
        );
        let f = &self.failover_ms;
        if let (Some(p50), Some(max)) = (f.p50_ms, f.max_ms) {
            s.push_str(&format!("; failover p50 {p50} ms, max {max} ms over {} faults", f.samples));
        }
        for fault in &self.faults {
            let healed = fault.healed_at_ns.map_or_else(|| "never healed".to_string(), |h| format!("healed at {h} ns"));
            s.push_str(&format!("\n  fault {} {} at {} ns, {healed}", fault.kind, fault.target, fault.at_ns));
            if let Some(ms) = fault.leaderless_ms {
                s.push_str(&format!(", leaderless {ms} ms"));
            }
        }
        if !self.violations.is_empty() {
            s.push_str(&format!("\n{} violations:", self.violations.len()));
            for v in &self.violations {
                s.push_str(&format!("\n  {}", v.to_string().replace('\n', "\n  ")));
            }
        }
        for u in &self.unknown {
            s.push_str(&format!("\n  undecided: {:?}: {}", u.key, u.reason));
        }
        s
    }
}
