//! Scaling without a rollout (a paused Deployment, or `spec.replicas`
//! changed mid-rollout) and history cleanup, as Kubernetes' `sync.go`.
//!
//! A mid-rollout scale is shared out in proportion to each active
//! ReplicaSet's size against the `max-replicas` it was last scaled for, so
//! the rollout keeps its shape; what rounding leaves over goes to the
//! largest ReplicaSet.

use super::template::{self, DESIRED_REPLICAS, MAX_REPLICAS};
use super::Plan;
use crate::Action;

/// Whether some active ReplicaSet was last scaled for another
/// `spec.replicas` than the Deployment's now.
pub(crate) fn is_scaling_event(plan: &Plan<'_>) -> bool {
    let replicas = plan.replicas().to_string();
    plan.all()
        .filter(|p| p.replicas() > 0)
        .any(|p| template::annotation(&p.rs, DESIRED_REPLICAS).is_some_and(|desired| desired != replicas))
}

/// Which ReplicaSet, by position: `None` for the new one, `Some(i)` for
/// `old[i]`.
type Which = Option<usize>;

/// Scales the ReplicaSets to the Deployment's size (Kubernetes' `scale`).
pub(crate) fn scale(plan: &mut Plan<'_>) {
    let replicas = plan.replicas();
    let active: Vec<Which> = candidates(plan).into_iter().filter(|w| replicas_of(plan, *w) > 0).collect();
    // One active ReplicaSet (or none: then the newest) simply takes the size.
    let single = match active.as_slice() {
        [] => {
            if plan.new.is_some() {
                Some(None)
            } else {
                (!plan.old.is_empty()).then(|| Some(plan.old.len() - 1))
            }
        }
        [one] => Some(*one),
        _ => None,
    };
    if let Some(which) = single {
        if replicas_of(plan, which) != replicas {
            plan.set_replicas(which.is_none(), which, replicas);
        }
        return;
    }
    // The new ReplicaSet is complete: the old ones go.
    if let Some(new) = &plan.new {
        let saturated = new.replicas() == replicas
            && template::annotation(&new.rs, DESIRED_REPLICAS) == Some(replicas.to_string().as_str())
            && new.reported_available() == replicas;
        if saturated {
            for i in 0..plan.old.len() {
                if plan.old[i].replicas() != 0 {
                    plan.set_replicas(false, Some(i), 0);
                }
            }
            return;
        }
    }
    if plan.strategy_is_recreate() {
        // Only a rolling update shares a size out; Recreate scales the old
        // ReplicaSets down during its own rollout.
        return;
    }
    let allowed = if replicas > 0 { replicas + plan.max_surge() } else { 0 };
    let current: i32 = active.iter().map(|w| replicas_of(plan, *w)).sum();
    let to_add = allowed - current;
    if to_add == 0 {
        return;
    }
    // Scaling up favours the largest, then newest; down, the largest, then oldest.
    let mut order = active.clone();
    order.sort_by(|a, b| {
        let by_size = replicas_of(plan, *b).cmp(&replicas_of(plan, *a));
        let newer_first = created_rank(*b).cmp(&created_rank(*a));
        if to_add > 0 {
            by_size.then(newer_first)
        } else {
            by_size.then(newer_first.reverse())
        }
    });
    let mut sizes: Vec<(Which, i32)> = Vec::new();
    let mut added = 0;
    for which in &order {
        let proportion = proportion(plan, *which, to_add, added);
        sizes.push((*which, replicas_of(plan, *which) + proportion));
        added += proportion;
    }
    if let Some(first) = sizes.first_mut() {
        first.1 = (first.1 + to_add - added).max(0);
    }
    for (which, size) in sizes {
        plan.set_replicas(which.is_none(), which, size);
    }
}

/// New first, then old ReplicaSets.
fn candidates(plan: &Plan<'_>) -> Vec<Which> {
    plan.new.iter().map(|_| None).chain((0..plan.old.len()).map(Some)).collect()
}

fn replicas_of(plan: &Plan<'_>, which: Which) -> i32 {
    match which {
        None => plan.new.as_ref().map_or(0, |n| n.replicas()),
        Some(i) => plan.old[i].replicas(),
    }
}

/// Later-created ranks higher; the new ReplicaSet is the newest.
fn created_rank(which: Which) -> usize {
    which.map_or(usize::MAX, |i| i)
}

/// How many of `to_add` (negative: to remove) one ReplicaSet takes:
/// its size scaled from the `max-replicas` it was sized for to the
/// Deployment's now, capped at what is left.
fn proportion(plan: &Plan<'_>, which: Which, to_add: i32, added: i32) -> i32 {
    let size = replicas_of(plan, which);
    if size == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = {
        let replicas = plan.replicas();
        if replicas == 0 {
            -size
        } else {
            let rs = match which {
                None => plan.new.as_ref().map(|n| &n.rs),
                Some(i) => Some(&plan.old[i].rs),
            };
            let annotated = rs
                .and_then(|rs| template::annotation(rs, MAX_REPLICAS))
                .and_then(|m| m.parse::<i64>().ok())
                .unwrap_or_else(|| i64::from(plan.status.replicas.unwrap_or(0)));
            if annotated <= 0 {
                0
            } else {
                let max_now = i64::from(replicas + plan.max_surge());
                // Round half away from zero, as Go's math.Round.
                let scaled = (2 * i64::from(size) * max_now + annotated) / (2 * annotated);
                i32::try_from(scaled).unwrap_or(size) - size
            }
        }
    };
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

/// Deletes the oldest old ReplicaSets beyond `revisionHistoryLimit`, only
/// those fully scaled down and observed so (Kubernetes' `cleanupDeployment`).
pub(crate) fn cleanup(plan: &mut Plan<'_>) {
    let Some(limit) = plan.spec().revision_history_limit else { return };
    let mut alive: Vec<&super::Planned> =
        plan.old.iter().filter(|p| p.rs.metadata.deletion_timestamp.is_none()).collect();
    let surplus = alive.len().saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
    if surplus == 0 {
        return;
    }
    alive.sort_by_key(|p| (template::revision(&p.rs), p.rs.metadata.creation_timestamp.clone()));
    let mut deletes = Vec::new();
    for p in alive.into_iter().take(surplus) {
        let observed = p.rs.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
        if p.actual() != 0 || p.replicas() != 0 || p.rs.metadata.generation.unwrap_or(0) > observed {
            continue;
        }
        deletes.push(Action::Delete {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            namespace: p.rs.metadata.namespace.clone().unwrap_or_default(),
            name: p.name().to_string(),
            uid: p.rs.metadata.uid.clone(),
            propagation: None,
        });
    }
    plan.deletes.extend(deletes);
}
