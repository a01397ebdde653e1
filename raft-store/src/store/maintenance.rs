//! Background upkeep of a member: alarms, automatic compaction, snapshots
//! and the election watchdog.
//!
//! As in etcd, a member that finds its database over the quota when a write
//! arrives refuses the write and raises a NOSPACE alarm through the log, so
//! every member lists it and refuses writes that add data until it is
//! cleared. Unlike etcd, a member also clears its own alarm once compaction
//! has brought its database back under the quota (see `run_alarm_clearer`):
//! no `etcdctl alarm disarm` is needed, though it works too.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::ServerState;

use super::{Inner, Retention, Store};
use crate::error::StoreError;
use crate::mvcc::Reader;
use crate::types::{Alarm, AlarmKind, Command, Output, Raft};

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
        let alarms = Reader::snapshot(&db).alarms().map_err(|e| StoreError::Internal(e.to_string()));
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
        for alarm in raised {
            let clear = match alarm.kind {
                AlarmKind::NoSpace if alarm.member == store.id() => !store.over_quota(),
                _ => leads && !members.contains(&alarm.member),
            };
            if !clear {
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
    // Bytes appended when the last snapshot was asked for (since this
    // process opened the log: a restart counts from zero, which only delays
    // the next snapshot by bytes; the entry count still applies).
    let mut bytes_base = 0;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let config = &inner.config;
        let stagger = |n: u64| n.saturating_add(n / 16 * (config.id % 8));
        let (applied, snapshot) = {
            let metrics = inner.raft.metrics();
            let m = metrics.borrow();
            (m.last_applied.map_or(0, |l| l.index), m.snapshot.map_or(0, |l| l.index))
        };
        if applied <= snapshot {
            continue;
        }
        let appended = inner.log.appended_bytes();
        let byte_limit = config.snapshot_log_bytes.max(inner.sm.db_size());
        let due = applied - snapshot >= stagger(config.snapshot_logs)
            || appended.saturating_sub(bytes_base) >= stagger(byte_limit);
        if !due {
            continue;
        }
        bytes_base = appended;
        tracing::debug!(applied, snapshot, "building a snapshot");
        if let Err(e) = inner.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "cannot trigger a snapshot");
            return;
        }
    }
}

/// While this member leads, compacts history beyond the retention: by
/// revision count, or to the revision that was current `retention` ago
/// (sampled every check, as etcd's periodic compactor does).
pub(super) async fn run_compactor(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(COMPACTION_CHECK);
    let mut samples: std::collections::VecDeque<(Instant, i64)> = std::collections::VecDeque::new();
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let retention = store.inner.config.history_retention;
        let current = store.inner.sm.revision();
        let now = Instant::now();
        let target = match retention {
            Retention::Unlimited => continue,
            Retention::Revisions(n) => current - n,
            Retention::Duration(d) => {
                samples.push_back((now, current));
                // The newest sample at least `d` old is the compaction point.
                let mut target = 0;
                while samples.front().is_some_and(|(t, _)| now.duration_since(*t) >= d) {
                    target = samples.pop_front().map_or(0, |(_, r)| r);
                }
                if target > 0 {
                    samples.push_front((now - d, target));
                }
                target
            }
        };
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

/// Counts leader changes, and re-triggers an election if this member stays
/// candidate for more than twice the maximum election timeout (openraft 0.9 draws the timeout once
/// per process, so two survivors can otherwise keep splitting the vote).
pub(super) async fn run_election_watchdog(raft: Raft, election_max: Duration) {
    let mut metrics = raft.metrics();
    let mut candidate_since: Option<Instant> = None;
    let mut leader = None;
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(election_max / 2) => {}
        }
        let now_leader = metrics.borrow().current_leader;
        if now_leader.is_some() && now_leader != leader {
            crate::metrics::metrics().leader_changes.inc();
        }
        leader = now_leader.or(leader);
        let state = metrics.borrow().state;
        match (state, candidate_since) {
            (ServerState::Candidate, None) => candidate_since = Some(Instant::now()),
            (ServerState::Candidate, Some(since)) if since.elapsed() > election_max * 2 => {
                let jitter = Duration::from_millis(rand::random::<u64>() % (election_max.as_millis() as u64 + 1));
                tokio::time::sleep(jitter).await;
                if metrics.borrow().state == ServerState::Candidate {
                    tracing::info!("still candidate after {:?}: triggering a new election", since.elapsed());
                    let _ = raft.trigger().elect().await;
                }
                candidate_since = Some(Instant::now());
            }
            (ServerState::Candidate, Some(_)) => {}
            _ => candidate_since = None,
        }
    }
}
