//! The Deployment controller: one ReplicaSet per pod template, rolled from
//! the old ones to the new one, as Kubernetes' `pkg/controller/deployment`.
//!
//! One reconcile, from the cache contents (the Deployment, the ReplicaSets
//! and pods of its namespace, the time):
//! 1. claim ReplicaSets as the ReplicaSet controller claims pods;
//! 2. find the new ReplicaSet (template equal but for `pod-template-hash`),
//!    the rest are old; give the new one the next revision;
//! 3. paused, or only scaled: scale the ReplicaSets proportionally
//!    ([`sync`]); otherwise roll out by the strategy ([`rolling`],
//!    [`recreate`]), one step per reconcile: each step's ReplicaSet update
//!    triggers the next reconcile through the ReplicaSet's watch event;
//! 4. drop old ReplicaSets beyond `revisionHistoryLimit`, and write status
//!    with the `Progressing` and `Available` conditions ([`status`]).
//!
//! Every change to a ReplicaSet lands in one [`Plan`]; each changed
//! ReplicaSet becomes one `Update` carrying its `resourceVersion`, so a
//! decision made on a stale cache ends in Conflict, not in a wrong scale.
//!
//! # Layout
//! - [`template`]: the template hash, template equality, annotations.
//! - [`sync`]: proportional scaling and history cleanup.
//! - [`rolling`]: the RollingUpdate strategy.
//! - [`recreate`]: the Recreate strategy.
//! - [`status`]: status and conditions.

pub mod recreate;
pub mod rolling;
#[cfg(test)]
mod simulation;
pub mod status;
pub mod sync;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, SubsecRound, Utc};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as ApiSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};
use skiff_api::selector::LabelSelector;

use crate::ownership::{self, Claim};
use crate::{Action, Reconciled};
use template::{DESIRED_REPLICAS, MAX_REPLICAS, POD_TEMPLATE_HASH, REVISION};

/// Reconciles one Deployment. `sets` are the ReplicaSets of its namespace
/// and `pods` the pods (both unfiltered; the reconcile claims what is its
/// own). Pods matter only to Recreate, which waits for old pods to go.
pub fn reconcile(
    deployment: &Deployment,
    sets: &[Arc<ReplicaSet>],
    pods: &[Arc<Pod>],
    now: DateTime<Utc>,
) -> Reconciled {
    let now = now.trunc_subsecs(0);
    let Some(spec) = deployment.spec.as_ref() else { return Reconciled::default() };
    let selector = serde_json::to_value(&spec.selector)
        .ok()
        .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()))
        .and_then(|s| LabelSelector::from_api(&s).ok())
        .filter(|s| !s.is_empty());
    // An empty selector would claim every ReplicaSet; validation forbids it.
    let Some(selector) = selector else { return Reconciled::default() };

    let out = Reconciled::default();
    let mut plan = Plan::new(deployment, now);
    let namespace = deployment.metadata.namespace.as_deref();
    let owner_ref = ownership::controller_ref("apps/v1", "Deployment", &deployment.metadata);
    let empty = BTreeMap::new();
    let mut owned = Vec::new();
    for rs in sets.iter().filter(|r| r.metadata.namespace.as_deref() == namespace) {
        let selected = selector.matches(rs.metadata.labels.as_ref().unwrap_or(&empty));
        match ownership::claim(&deployment.metadata, &rs.metadata, selected) {
            Claim::Owned => owned.push(rs.clone()),
            Claim::Adopt => {
                plan.actions.push(ownership::adopt("apps/v1", "ReplicaSet", &rs.metadata, &owner_ref));
                owned.push(rs.clone());
            }
            Claim::Release => {
                plan.actions.push(ownership::release("apps/v1", "ReplicaSet", &rs.metadata, &owner_ref.uid))
            }
            Claim::Ignore => {}
        }
    }
    plan.load(owned, pods);

    if deployment.metadata.deletion_timestamp.is_some() {
        status::write(&mut plan, false);
        return plan.finish(out);
    }
    status::check_paused(&mut plan);
    let paused = spec.paused == Some(true);
    plan.sync_new_revision();
    if paused || sync::is_scaling_event(&plan) {
        sync::scale(&mut plan);
        if paused {
            sync::cleanup(&mut plan);
        }
        status::write(&mut plan, false);
    } else if plan.strategy_is_recreate() {
        recreate::rollout(&mut plan, sets);
    } else {
        rolling::rollout(&mut plan, sets);
    }
    plan.finish(out)
}

/// One ReplicaSet as this reconcile would leave it.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    /// What the cache holds; `None` for one this reconcile creates.
    pub original: Option<Arc<ReplicaSet>>,
    pub rs: ReplicaSet,
}

impl Planned {
    pub fn name(&self) -> &str {
        self.rs.metadata.name.as_deref().unwrap_or("")
    }

    pub fn replicas(&self) -> i32 {
        self.rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    /// Pods the ReplicaSet reports, `status.replicas`.
    pub fn actual(&self) -> i32 {
        self.rs.status.as_ref().map_or(0, |s| s.replicas)
    }

    pub fn ready(&self) -> i32 {
        self.rs.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0)
    }

    /// Available pods as reported (for the Deployment's status).
    pub fn reported_available(&self) -> i32 {
        self.rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
    }

    /// Available pods the rollout may count on: no more than the planned
    /// size, since a ReplicaSet just scaled down still reports the pods it
    /// is about to delete (and deletes unavailable ones first).
    pub fn available(&self) -> i32 {
        self.reported_available().min(self.replicas())
    }

    fn created_at(&self) -> Option<DateTime<Utc>> {
        self.rs.metadata.creation_timestamp.as_ref().map(|t| t.0)
    }
}

/// Everything a reconcile decides, applied at the end.
pub(crate) struct Plan<'a> {
    pub deployment: &'a Deployment,
    pub now: DateTime<Utc>,
    /// The new ReplicaSet, if it exists (or is being created).
    pub new: Option<Planned>,
    /// The old ReplicaSets, oldest first.
    pub old: Vec<Planned>,
    /// Pods by the uid of the ReplicaSet controlling them.
    pub pods_by_owner: HashMap<String, Vec<Arc<Pod>>>,
    /// The status to write (compared with the stored one at the end).
    pub status: k8s_openapi::api::apps::v1::DeploymentStatus,
    /// Writes other than ReplicaSet updates and the status, in order.
    pub actions: Vec<Action>,
    /// Old ReplicaSets to delete (history cleanup).
    pub deletes: Vec<Action>,
    pub events: Vec<(String, String)>,
    pub requeue_after: Option<std::time::Duration>,
}

impl<'a> Plan<'a> {
    fn new(deployment: &'a Deployment, now: DateTime<Utc>) -> Self {
        Plan {
            deployment,
            now,
            new: None,
            old: Vec::new(),
            pods_by_owner: HashMap::new(),
            status: deployment.status.clone().unwrap_or_default(),
            actions: Vec::new(),
            deletes: Vec::new(),
            events: Vec::new(),
            requeue_after: None,
        }
    }

    fn load(&mut self, owned: Vec<Arc<ReplicaSet>>, pods: &[Arc<Pod>]) {
        let mut sets: Vec<Planned> =
            owned.into_iter().map(|rs| Planned { rs: (*rs).clone(), original: Some(rs) }).collect();
        sets.sort_by(|a, b| a.created_at().cmp(&b.created_at()).then_with(|| a.name().cmp(b.name())));
        let template = self.spec().template.clone();
        let new_at = sets.iter().position(|p| {
            template::equal_ignoring_hash(Some(&template), p.rs.spec.as_ref().and_then(|s| s.template.as_ref()))
        });
        self.new = new_at.map(|i| sets.remove(i));
        self.old = sets;
        let uids: Vec<String> = self.all().filter_map(|p| p.rs.metadata.uid.clone()).collect();
        for pod in pods {
            if let Some(owner) = ownership::controller_of(&pod.metadata).filter(|r| uids.contains(&r.uid)) {
                self.pods_by_owner.entry(owner.uid.clone()).or_default().push(pod.clone());
            }
        }
    }

    pub fn spec(&self) -> &'a k8s_openapi::api::apps::v1::DeploymentSpec {
        self.deployment.spec.as_ref().expect("checked at the start of reconcile")
    }

    pub fn replicas(&self) -> i32 {
        self.spec().replicas.unwrap_or(1)
    }

    pub fn name(&self) -> &str {
        self.deployment.metadata.name.as_deref().unwrap_or("")
    }

    pub fn all(&self) -> impl Iterator<Item = &Planned> {
        self.new.iter().chain(self.old.iter())
    }

    pub fn strategy_is_recreate(&self) -> bool {
        self.spec().strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate")
    }

    /// `(maxSurge, maxUnavailable)` resolved against `spec.replicas`, as
    /// Kubernetes' `ResolveFenceposts`: surge rounds up, unavailability
    /// down, and both zero means one may be unavailable. Recreate has
    /// neither.
    pub fn fenceposts(&self) -> (i32, i32) {
        if self.strategy_is_recreate() {
            return (0, 0);
        }
        let rolling = self.spec().strategy.as_ref().and_then(|s| s.rolling_update.as_ref());
        let quarter = IntOrString::String("25%".into());
        let surge = rolling.and_then(|r| r.max_surge.as_ref()).unwrap_or(&quarter);
        let unavailable = rolling.and_then(|r| r.max_unavailable.as_ref()).unwrap_or(&quarter);
        let replicas = self.replicas();
        let surge = scaled(surge, replicas, true);
        let unavailable = scaled(unavailable, replicas, false);
        if surge == 0 && unavailable == 0 {
            (0, 1)
        } else {
            (surge, unavailable)
        }
    }

    pub fn max_surge(&self) -> i32 {
        self.fenceposts().0
    }

    /// Kubernetes' `MaxUnavailable`: never more than the replicas.
    pub fn max_unavailable(&self) -> i32 {
        if self.strategy_is_recreate() || self.replicas() == 0 {
            return 0;
        }
        self.fenceposts().1.min(self.replicas())
    }

    /// The highest revision among the old ReplicaSets.
    fn max_old_revision(&self) -> i64 {
        self.old.iter().map(|p| template::revision(&p.rs)).max().unwrap_or(0)
    }

    /// Gives the new ReplicaSet the next revision if it has an older one
    /// (it was an old one, brought back by a rollback), and the
    /// Deployment's `minReadySeconds`.
    fn sync_new_revision(&mut self) {
        let next = self.max_old_revision() + 1;
        let min_ready = self.spec().min_ready_seconds;
        let has_deadline = self.spec().progress_deadline_seconds.is_some();
        let annotations = copied_annotations(self.deployment);
        let Some(new) = self.new.as_mut() else { return };
        let rs_annotations = new.rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
        rs_annotations.extend(annotations);
        if template::revision(&new.rs) < next {
            new.rs.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(REVISION.into(), next.to_string());
        }
        if let Some(spec) = new.rs.spec.as_mut() {
            spec.min_ready_seconds = min_ready;
        }
        let message = format!("Found new replica set \"{}\"", new.name());
        if has_deadline && status::condition(&self.status, status::PROGRESSING).is_none() {
            status::set_condition(
                &mut self.status,
                status::condition_of(status::PROGRESSING, "True", status::FOUND_NEW_RS, &message, self.now),
            );
        }
    }

    /// Creates the new ReplicaSet with `replicas`, unless its name is taken
    /// by another template (a hash collision: count it in the status so the
    /// next hash differs, and try again).
    pub fn create_new(&mut self, sets: &[Arc<ReplicaSet>], replicas: i32) -> bool {
        let d = self.deployment;
        let spec = self.spec();
        let collisions = self.status.collision_count;
        let hash = template::pod_template_hash(&spec.template, collisions);
        let name = format!("{}-{}", self.name(), hash);
        let namespace = d.metadata.namespace.clone();
        if sets.iter().any(|rs| rs.metadata.name.as_deref() == Some(&name) && rs.metadata.namespace == namespace) {
            self.status.collision_count = Some(collisions.unwrap_or(0) + 1);
            return false;
        }
        let mut template = spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let mut selector: ApiSelector = spec.selector.clone();
        selector.match_labels.get_or_insert_with(BTreeMap::new).insert(POD_TEMPLATE_HASH.into(), hash);
        let mut annotations = copied_annotations(d);
        annotations.insert(REVISION.into(), (self.max_old_revision() + 1).to_string());
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace,
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                annotations: Some(annotations),
                owner_references: Some(vec![ownership::controller_ref("apps/v1", "Deployment", &d.metadata)]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                selector,
                template: Some(template),
                min_ready_seconds: spec.min_ready_seconds,
            }),
            status: None,
        };
        self.new = Some(Planned { original: None, rs });
        self.set_replicas(true, None, replicas);
        if spec.progress_deadline_seconds.is_some() {
            let message = format!("Created new replica set \"{name}\"");
            status::set_condition(
                &mut self.status,
                status::condition_of(status::PROGRESSING, "True", status::NEW_RS_CREATED, &message, self.now),
            );
        }
        self.events.push(("ScalingReplicaSet".into(), format!("Scaled up replica set {name} to {replicas}")));
        true
    }

    /// Scales the new ReplicaSet (`new`) or old one `old[index]` to
    /// `replicas`, and stamps the desired/max annotations proportional
    /// scaling reads. Returns whether anything changed.
    pub fn set_replicas(&mut self, new: bool, index: Option<usize>, replicas: i32) -> bool {
        let desired = self.replicas().to_string();
        let max = (self.replicas() + self.max_surge()).to_string();
        let target = if new { self.new.as_mut() } else { index.and_then(|i| self.old.get_mut(i)) };
        let Some(target) = target else { return false };
        let before = target.replicas();
        let annotations = target.rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
        let mut changed =
            annotations.get(DESIRED_REPLICAS) != Some(&desired) || annotations.get(MAX_REPLICAS) != Some(&max);
        annotations.insert(DESIRED_REPLICAS.into(), desired);
        annotations.insert(MAX_REPLICAS.into(), max);
        if before != replicas {
            changed = true;
            if let Some(spec) = target.rs.spec.as_mut() {
                spec.replicas = Some(replicas);
            }
            if target.original.is_some() {
                let verb = if replicas > before { "up" } else { "down" };
                let message = format!("Scaled {verb} replica set {} to {replicas}", target.name());
                self.events.push(("ScalingReplicaSet".into(), message));
            }
        }
        changed
    }

    /// The actions: adoption first, then creates and ReplicaSet updates,
    /// deletes, status, and the Deployment's revision annotation last (after
    /// the status update, whose resourceVersion it would otherwise stale).
    fn finish(mut self, mut out: Reconciled) -> Reconciled {
        let mut actions = std::mem::take(&mut out.actions);
        actions.append(&mut self.actions);
        for p in self.all() {
            match &p.original {
                None => actions.push(Action::Create(to_json(&p.rs))),
                Some(orig) if **orig != p.rs => actions.push(Action::Update(to_json(&p.rs))),
                Some(_) => {}
            }
        }
        actions.append(&mut self.deletes);
        let stored = self.deployment.status.clone().unwrap_or_default();
        if stored != self.status {
            let mut obj = to_json(self.deployment);
            obj["status"] = serde_json::to_value(&self.status).unwrap_or(Value::Null);
            actions.push(Action::UpdateStatus(obj));
        }
        if let Some(revision) = self.new.as_ref().and_then(|n| template::annotation(&n.rs, REVISION)) {
            let current = self.deployment.metadata.annotations.as_ref().and_then(|a| a.get(REVISION));
            if current.map(String::as_str) != Some(revision) {
                actions.push(Action::Patch {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    namespace: self.deployment.metadata.namespace.clone().unwrap_or_default(),
                    name: self.name().to_string(),
                    patch: json!({"metadata": {"annotations": {REVISION: revision}}}),
                });
            }
        }
        let regarding = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "namespace": self.deployment.metadata.namespace,
            "name": self.deployment.metadata.name,
            "uid": self.deployment.metadata.uid,
        });
        for (reason, message) in self.events.drain(..) {
            actions.push(Action::Event { regarding: regarding.clone(), type_: "Normal".into(), reason, message });
        }
        out.actions = actions;
        if let Some(wait) = self.requeue_after {
            out.requeue_within(wait);
        }
        out
    }
}

fn to_json<T: serde::Serialize>(obj: &T) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// The Deployment's annotations a ReplicaSet carries (`kubectl`'s
/// `change-cause` among them), without the controller's own.
fn copied_annotations(d: &Deployment) -> BTreeMap<String, String> {
    d.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                REVISION | DESIRED_REPLICAS | MAX_REPLICAS | "kubectl.kubernetes.io/last-applied-configuration"
            ) && k.as_str() != "deployment.kubernetes.io/revision-history"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// An int-or-percent scaled against `total` (Kubernetes'
/// `GetScaledValueFromIntOrPercent`); malformed values count as 0.
pub fn scaled(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let Some(percent) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else { return 0 };
            let product = percent * i64::from(total);
            let v = if round_up { (product + 99).div_euclid(100) } else { product.div_euclid(100) };
            i32::try_from(v).unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests;
