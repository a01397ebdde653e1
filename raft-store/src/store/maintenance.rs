//! Background upkeep of a member: alarms, automatic compaction, snapshots
//! and the election watchdog.
//!
//! As in etcd, a member that finds its database over the quota when a write
//! arrives refuses the write and raises a NOSPACE alarm through the log, so
//! every member lists it and refuses writes that add data until it is
//! cleared. Unlike etcd, a member also clears its own alarm once compaction
//! has brought its database back under the quota (see `run_alarm_clearer`):
//! no `etcdctl alarm disarm` is needed, though it works too.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use openraft::ServerState;

use super::{Inner, Retention, Store, StoreConfig};
use crate::error::StoreError;
use crate::mvcc::Reader;
use crate::types::{Alarm, AlarmKind, Command, NodeId, Output, Raft};

impl Store {
    /// Whether this member's database is over `--quota-backend-bytes`.
    pub fn over_quota(&self) -> bool {
        self.inner.sm.db_size() > self.inner.config.quota_backend_bytes
    }

    /// Proposes this member's NOSPACE alarm unless it is raised already or
    /// being raised. Does not wait for it.
    pub(super) fn raise_nospace(&self) {
        use std::sync::atomic::Ordering;
        let alarm = Alarm { member: self.id(), kind: AlarmKind::NoSpace };
        if self.alarms().is_ok_and(|raised| raised.contains(&alarm))
            || self.inner.raising_nospace.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let store = self.clone();
        self.spawn(async move {
            match store.change_alarm(alarm, true).await {
                Ok(_) => tracing::warn!(
                    quota = store.inner.config.quota_backend_bytes,
                    db_size = store.inner.sm.db_size(),
                    "database over --quota-backend-bytes: raised the NOSPACE alarm"
                ),
                Err(e) => tracing::warn!(error = %e, "raising the NOSPACE alarm failed; the next write retries"),
            }
            store.inner.raising_nospace.store(false, Ordering::Release);
        });
    }

    /// The raised alarms in this member's applied state, sorted.
    pub fn alarms(&self) -> Result<Vec<Alarm>, StoreError> {
        let db = self.inner.sm.db();
        let alarms = Reader::snapshot(&db).alarms().map_err(StoreError::from);
        alarms
    }

    /// Raises or clears `alarm` for the whole cluster; returns the alarms
    /// that changed (none if it already was as asked).
    pub async fn change_alarm(&self, alarm: Alarm, raise: bool) -> Result<Vec<Alarm>, StoreError> {
        match self.write(Command::Alarm { alarm, raise }).await? {
            Output::Alarm { changed } => Ok(changed),
            other => Err(StoreError::Internal(format!("unexpected answer to an alarm: {other:?}"))),
        }
    }
}

/// How often a member checks whether its alarms can be cleared.
const ALARM_CHECK: Duration = Duration::from_secs(1);

/// What decides whether a raised alarm may be cleared, as one member sees it.
struct AlarmClearer {
    id: NodeId,
    leads: bool,
    /// The members of the cluster now.
    members: BTreeSet<NodeId>,
    /// Whether this member's database is over the quota.
    over_quota: bool,
}

impl AlarmClearer {
    /// A member clears its own NOSPACE alarm once it is under the quota
    /// again; the leader clears the alarms of members no longer in the
    /// cluster (nothing else ever would).
    fn clears(&self, alarm: &Alarm) -> bool {
        match alarm.kind {
            AlarmKind::NoSpace if alarm.member == self.id => !self.over_quota,
            _ => self.leads && !self.members.contains(&alarm.member),
        }
    }
}

/// Clears this member's NOSPACE alarm once its database is back under the
/// quota; the leader also clears the alarms of members that were removed
/// from the cluster (nothing else ever would).
pub(super) async fn run_alarm_clearer(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(ALARM_CHECK);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let Ok(raised) = store.alarms() else { continue };
        if raised.is_empty() {
            continue;
        }
        store.inner.sm.refresh_db_size();
        let leads = store.leader() == Some(store.id());
        let members = store
            .inner
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect::<BTreeSet<_>>();
        let me = AlarmClearer { id: store.id(), leads, members, over_quota: store.over_quota() };
        for alarm in raised {
            if !me.clears(&alarm) {
                continue;
            }
            match store.change_alarm(alarm, false).await {
                Ok(_) => tracing::info!(member = alarm.member, kind = ?alarm.kind, "cleared an alarm"),
                Err(e) => tracing::warn!(error = %e, "clearing an alarm failed; will retry"),
            }
        }
    }
}

/// How often the leader considers compacting under `--history-retention`.
const COMPACTION_CHECK: Duration = Duration::from_secs(5);

/// How often [`run_snapshot_trigger`] looks at the log.
const SNAPSHOT_CHECK: Duration = Duration::from_millis(250);

/// Builds a snapshot (after which openraft purges the log it covers) once
/// [`StoreConfig::snapshot_logs`] entries, or [`StoreConfig::snapshot_log_bytes`]
/// bytes of entries (or the database's size, if larger), were appended since
/// the last one. A snapshot copies the whole database, so an entry count
/// alone made small writes pay dearly: 20,000 one-write entries are 9 MB,
/// and with a 200 MB database every 9 MB written cost a 200 MB copy, which
/// doubled the 1-client p99 while it ran. Members snapshot at different
/// points (up to 7/16 later, by id): a snapshot's checkpoint flushes every
/// memtable, and all members flushing at once stalled everyone's log fsyncs.
pub(super) async fn run_snapshot_trigger(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut trigger = SnapshotTrigger::default();
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let config = &inner.config;
        let (applied, snapshot) = {
            let metrics = inner.raft.metrics();
            let m = metrics.borrow();
            (m.last_applied.map_or(0, |l| l.index), m.snapshot.map_or(0, |l| l.index))
        };
        let log = LogProgress { applied, snapshot, appended_bytes: inner.log.appended_bytes() };
        if !trigger.step(config, log, inner.sm.db_size()) {
            continue;
        }
        tracing::debug!(applied, snapshot, "building a snapshot");
        if let Err(e) = inner.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "cannot trigger a snapshot");
            return;
        }
    }
}

/// Where the log stands, as the snapshot trigger sees it.
#[derive(Clone, Copy, Debug)]
struct LogProgress {
    applied: u64,
    /// The index the last snapshot covers.
    snapshot: u64,
    /// Bytes appended to the log since this process opened it.
    appended_bytes: u64,
}

/// The snapshot trigger's memory between checks.
#[derive(Debug, Default)]
struct SnapshotTrigger {
    /// Bytes appended when the last snapshot was asked for (since this
    /// process opened the log: a restart counts from zero, which only delays
    /// the next snapshot by bytes; the entry count still applies).
    bytes_base: u64,
}

impl SnapshotTrigger {
    /// One check: whether a snapshot is due now (and if so, counts bytes
    /// from here on).
    fn step(&mut self, config: &StoreConfig, log: LogProgress, db_size: u64) -> bool {
        if log.applied <= log.snapshot {
            return false;
        }
        let stagger = |n: u64| n.saturating_add(n / 16 * (config.id % 8));
        let byte_limit = config.snapshot_log_bytes.max(db_size);
        let due = log.applied - log.snapshot >= stagger(config.snapshot_logs)
            || log.appended_bytes.saturating_sub(self.bytes_base) >= stagger(byte_limit);
        if due {
            self.bytes_base = log.appended_bytes;
        }
        due
    }
}

/// While this member leads, compacts history beyond the retention: by
/// revision count, or to the revision that was current `retention` ago
/// (sampled every check, as etcd's periodic compactor does).
pub(super) async fn run_compactor(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(COMPACTION_CHECK);
    let mut compactor = Compactor::default();
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let retention = store.inner.config.history_retention;
        let Some(target) = compactor.step(retention, Instant::now(), store.inner.sm.revision()) else { continue };
        if store.leader() != Some(store.id()) || target <= store.inner.sm.compacted() {
            continue;
        }
        match store.write(Command::Compact { revision: target }).await {
            Ok(_) => tracing::info!(revision = target, "compacted history under --history-retention"),
            Err(StoreError::Apply(_)) => {}
            Err(e) => tracing::warn!(error = %e, "automatic compaction failed; will retry"),
        }
    }
}

/// The compactor's memory between checks: which revision was current when,
/// for a retention by time.
#[derive(Debug, Default)]
struct Compactor {
    samples: VecDeque<(Instant, i64)>,
}

impl Compactor {
    /// One check at `now` with `current` the store's revision: the revision
    /// to compact to under `retention` (not above what is already
    /// compacted: the caller checks), or `None` to keep everything.
    fn step(&mut self, retention: Retention, now: Instant, current: i64) -> Option<i64> {
        match retention {
            Retention::Unlimited => None,
            Retention::Revisions(n) => Some(current - n),
            Retention::Duration(d) => {
                self.samples.push_back((now, current));
                // The newest sample at least `d` old is the compaction point.
                let mut target = 0;
                while self.samples.front().is_some_and(|(t, _)| now.duration_since(*t) >= d) {
                    target = self.samples.pop_front().map_or(0, |(_, r)| r);
                }
                if target > 0 {
                    self.samples.push_front((now - d, target));
                }
                Some(target)
            }
        }
    }
}

/// Counts leader changes, and re-triggers an election if this member stays
/// candidate for more than twice the maximum election timeout (openraft 0.9 draws the timeout once
/// per process, so two survivors can otherwise keep splitting the vote).
pub(super) async fn run_election_watchdog(raft: Raft, election_max: Duration) {
    let mut metrics = raft.metrics();
    let mut watchdog = Watchdog::new(election_max);
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(election_max / 2) => {}
        }
        let (state, leader) = {
            let m = metrics.borrow();
            (m.state, m.current_leader)
        };
        let verdict = watchdog.step(Instant::now(), state, leader);
        if verdict.leader_changed {
            crate::metrics::metrics().leader_changes.inc();
        }
        if let Some(since) = verdict.reelect {
            let jitter = Duration::from_millis(rand::random::<u64>() % (election_max.as_millis() as u64 + 1));
            tokio::time::sleep(jitter).await;
            if metrics.borrow().state == ServerState::Candidate {
                tracing::info!("still candidate after {:?}: triggering a new election", since.elapsed());
                let _ = raft.trigger().elect().await;
            }
            watchdog.reelected(Instant::now());
        }
    }
}

/// The election watchdog's view of this member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Campaign {
    /// Follower, leader or learner.
    None,
    /// Candidate since then.
    Since(Instant),
}

/// The election watchdog as a state machine, stepped on each look at
/// Raft's metrics.
#[derive(Debug)]
struct Watchdog {
    campaign: Campaign,
    /// The last leader seen.
    leader: Option<NodeId>,
    election_max: Duration,
}

/// What the watchdog found on one step.
#[derive(Debug, Default, PartialEq, Eq)]
struct Verdict {
    /// A new leader is known.
    leader_changed: bool,
    /// Candidate for too long (since then): trigger a new election.
    reelect: Option<Instant>,
}

impl Watchdog {
    fn new(election_max: Duration) -> Watchdog {
        Watchdog { campaign: Campaign::None, leader: None, election_max }
    }

    fn step(&mut self, now: Instant, state: ServerState, leader: Option<NodeId>) -> Verdict {
        let mut verdict = Verdict { leader_changed: leader.is_some() && leader != self.leader, reelect: None };
        self.leader = leader.or(self.leader);
        self.campaign = match (state, self.campaign) {
            (ServerState::Candidate, Campaign::None) => Campaign::Since(now),
            (ServerState::Candidate, Campaign::Since(since)) => {
                if now.duration_since(since) > self.election_max * 2 {
                    verdict.reelect = Some(since);
                }
                Campaign::Since(since)
            }
            _ => Campaign::None,
        };
        verdict
    }

    /// A new election was triggered (or found unneeded) at `now`: give it
    /// the full time again.
    fn reelected(&mut self, now: Instant) {
        self.campaign = Campaign::Since(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(id: NodeId) -> StoreConfig {
        let mut config = StoreConfig::new(id, "unused".into(), "127.0.0.1:1".into());
        config.snapshot_logs = 1_000;
        config.snapshot_log_bytes = 16_000;
        config
    }

    #[test]
    fn a_snapshot_is_due_after_enough_entries_or_bytes_staggered_by_member_id() {
        let log = |applied, appended_bytes| LogProgress { applied, snapshot: 0, appended_bytes };
        let mut first = SnapshotTrigger::default();
        assert!(!first.step(&config(8), log(999, 0), 0));
        assert!(first.step(&config(8), log(1_000, 0), 0));
        // Member 3 waits 3/16 longer.
        let mut third = SnapshotTrigger::default();
        assert!(!third.step(&config(3), log(1_000, 0), 0));
        assert!(third.step(&config(3), log(1_186, 0), 0));
        // Bytes count from the last snapshot asked for.
        let mut bytes = SnapshotTrigger::default();
        assert!(bytes.step(&config(8), log(10, 16_000), 0));
        assert!(!bytes.step(&config(8), log(20, 31_999), 0));
        assert!(bytes.step(&config(8), log(30, 32_000), 0));
        // A database larger than the byte limit raises it.
        let mut large = SnapshotTrigger::default();
        assert!(!large.step(&config(8), log(10, 16_000), 50_000));
        // Nothing applied since the last snapshot: nothing to do.
        let covered = LogProgress { applied: 5_000, snapshot: 5_000, appended_bytes: 1 << 30 };
        assert!(!SnapshotTrigger::default().step(&config(8), covered, 0));
    }

    #[test]
    fn the_compactor_keeps_the_configured_revisions() {
        let mut compactor = Compactor::default();
        let now = Instant::now();
        assert_eq!(compactor.step(Retention::Unlimited, now, 500), None);
        assert_eq!(compactor.step(Retention::Revisions(100), now, 500), Some(400));
    }

    #[test]
    fn the_compactor_compacts_to_the_revision_current_the_retention_ago() {
        let retention = Retention::Duration(Duration::from_secs(60));
        let mut compactor = Compactor::default();
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        // Nothing is a minute old yet.
        assert_eq!(compactor.step(retention, at(0), 10), Some(0));
        assert_eq!(compactor.step(retention, at(30), 20), Some(0));
        // At 60 s, the sample taken at 0 s is the compaction point.
        assert_eq!(compactor.step(retention, at(60), 30), Some(10));
        // At 95 s the one from 30 s; the one from 0 s is gone.
        assert_eq!(compactor.step(retention, at(95), 40), Some(20));
        // No new sample old enough: the last point stays.
        assert_eq!(compactor.step(retention, at(100), 50), Some(20));
    }

    #[test]
    fn the_watchdog_reelects_only_after_twice_the_election_timeout_as_candidate() {
        let max = Duration::from_millis(400);
        let mut dog = Watchdog::new(max);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(dog.step(at(0), ServerState::Candidate, None), Verdict::default());
        assert_eq!(dog.step(at(800), ServerState::Candidate, None), Verdict::default());
        assert_eq!(dog.step(at(801), ServerState::Candidate, None).reelect, Some(at(0)));
        dog.reelected(at(900));
        assert_eq!(dog.step(at(1_000), ServerState::Candidate, None).reelect, None);
        // Leaving candidacy resets the clock.
        dog.step(at(1_100), ServerState::Follower, Some(2));
        assert_eq!(dog.step(at(5_000), ServerState::Candidate, None).reelect, None);
    }

    #[test]
    fn the_watchdog_counts_each_new_leader_once() {
        let mut dog = Watchdog::new(Duration::from_millis(400));
        let now = Instant::now();
        assert!(dog.step(now, ServerState::Follower, Some(1)).leader_changed);
        assert!(!dog.step(now, ServerState::Follower, Some(1)).leader_changed);
        // An election in progress forgets no leader.
        assert!(!dog.step(now, ServerState::Candidate, None).leader_changed);
        assert!(!dog.step(now, ServerState::Follower, Some(1)).leader_changed);
        assert!(dog.step(now, ServerState::Leader, Some(3)).leader_changed);
    }

    #[test]
    fn a_member_clears_its_own_nospace_alarm_and_the_leader_those_of_removed_members() {
        let nospace = |member| Alarm { member, kind: AlarmKind::NoSpace };
        let clearer = |leads, over_quota| AlarmClearer { id: 1, leads, members: BTreeSet::from([1, 2]), over_quota };
        assert!(!clearer(false, true).clears(&nospace(1)));
        assert!(clearer(false, false).clears(&nospace(1)));
        // Another member's alarm is its own business while it is a member.
        assert!(!clearer(true, false).clears(&nospace(2)));
        // Member 3 was removed: only the leader clears its alarm.
        assert!(!clearer(false, false).clears(&nospace(3)));
        assert!(clearer(true, false).clears(&nospace(3)));
    }
}
