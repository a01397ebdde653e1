//! A deterministic in-memory cluster for Deployment tests: it carries out
//! the actions of the Deployment and ReplicaSet reconciles as an apiserver
//! would (names, uids, resourceVersion checks, generations), marks pods
//! ready a fixed time after they are created, and checks the rollout bounds
//! after every single write.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use crate::expectations::Expectations;
use crate::ownership;
use crate::pod_state::{is_active, is_available};
use crate::{replicaset, Action};

/// Bounds the world asserts after every write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub max_pods: usize,
    pub min_available: usize,
}

pub(crate) struct World {
    pub now: DateTime<Utc>,
    pub deployment: Deployment,
    pub sets: Vec<Arc<ReplicaSet>>,
    pub pods: Vec<Arc<Pod>>,
    pub expectations: Expectations,
    /// Seconds from a pod's creation to its readiness.
    pub ready_after: i64,
    pub bounds: Option<Bounds>,
    /// Every ReplicaSet the world has seen created, by name, in order.
    pub created_sets: Vec<String>,
    /// Highest active pod count and lowest available count seen while
    /// bounds were checked.
    pub max_pods_seen: usize,
    pub min_available_seen: usize,
    /// Whether pods of two different templates ever ran at once.
    pub templates_overlapped: bool,
    /// ReplicaSet controllers run only every `rs_period` steps, so the
    /// Deployment controller acts on stale ReplicaSet status in between.
    pub rs_period: u64,
    steps: u64,
    next_id: u64,
}

/// Why the world refused a write (the runner would stop there).
#[derive(Debug)]
pub(crate) enum Refused {
    Conflict,
    AlreadyExists,
    NotFound,
}

impl World {
    pub fn new(deployment: Deployment, now: DateTime<Utc>) -> Self {
        World {
            now,
            deployment,
            sets: Vec::new(),
            pods: Vec::new(),
            expectations: Expectations::new(),
            ready_after: 3,
            bounds: None,
            created_sets: Vec::new(),
            max_pods_seen: 0,
            min_available_seen: usize::MAX,
            templates_overlapped: false,
            rs_period: 1,
            steps: 0,
            next_id: 0,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// One tick: time moves a second, pods become ready, every ReplicaSet
    /// controller reconciles, then the Deployment controller.
    pub fn step(&mut self) {
        self.now += chrono::Duration::seconds(1);
        let now = self.now;
        let ready_after = self.ready_after;
        for pod in &mut self.pods {
            let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(now);
            let ready = crate::pod_state::is_ready(pod);
            if !ready && created + chrono::Duration::seconds(ready_after) <= now {
                let p = Arc::make_mut(pod);
                p.status = Some(PodStatus {
                    phase: Some("Running".into()),
                    conditions: Some(vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(now)),
                        ..Default::default()
                    }]),
                    ..Default::default()
                });
            }
        }
        self.check();
        self.steps += 1;
        let mut sets = self.sets.clone();
        sets.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        if !self.steps.is_multiple_of(self.rs_period.max(1)) {
            sets.clear();
        }
        for rs in sets {
            let r = replicaset::reconcile(&rs, &self.pods, &self.expectations, self.now);
            self.run(r.actions);
        }
        self.reconcile_deployment();
    }

    pub fn reconcile_deployment(&mut self) -> crate::Reconciled {
        let r = super::reconcile(&self.deployment, &self.sets, &self.pods, self.now);
        self.run(r.actions.clone());
        r
    }

    /// Carries out actions in order, stopping at the first refused one.
    pub fn run(&mut self, actions: Vec<Action>) {
        for action in actions {
            if self.apply(action).is_err() {
                break;
            }
            self.check();
        }
    }

    /// Steps until `done` holds, failing after `limit` steps.
    pub fn must_settle(&mut self, limit: usize, done: impl Fn(&World) -> bool) -> usize {
        for i in 0..limit {
            if done(self) {
                return i;
            }
            self.step();
        }
        panic!("not settled after {limit} steps: sets {:#?}\nstatus {:#?}", self.summary(), self.deployment.status);
    }

    /// `(name, spec.replicas, status.replicas, revision)` of each ReplicaSet.
    pub fn summary(&self) -> Vec<(String, i32, i32, String)> {
        self.sets
            .iter()
            .map(|rs| {
                (
                    rs.metadata.name.clone().unwrap_or_default(),
                    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
                    rs.status.as_ref().map_or(0, |s| s.replicas),
                    super::template::annotation(rs, super::template::REVISION).unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    pub fn set(&self, name: &str) -> &ReplicaSet {
        self.sets.iter().find(|r| r.metadata.name.as_deref() == Some(name)).expect("no such replica set")
    }

    /// Whether `kubectl rollout status` would report success now.
    pub fn rolled_out(&self) -> bool {
        let d = &self.deployment;
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let s = d.status.clone().unwrap_or_default();
        s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
            && s.updated_replicas.unwrap_or(0) == replicas
            && s.replicas.unwrap_or(0) == replicas
            && s.available_replicas.unwrap_or(0) == replicas
    }

    /// Changes the Deployment's spec as a user would (generation moves).
    pub fn edit(&mut self, change: impl FnOnce(&mut k8s_openapi::api::apps::v1::DeploymentSpec)) {
        if let Some(spec) = self.deployment.spec.as_mut() {
            change(spec);
        }
        let generation = self.deployment.metadata.generation.unwrap_or(0) + 1;
        self.deployment.metadata.generation = Some(generation);
        self.bump_deployment();
    }

    fn bump_deployment(&mut self) {
        let rv = self.id();
        self.deployment.metadata.resource_version = Some(rv.to_string());
    }

    fn check(&mut self) {
        let Some(bounds) = self.bounds else { return };
        let active: Vec<&Arc<Pod>> = self.pods.iter().filter(|p| is_active(p)).collect();
        let available = active.iter().filter(|p| is_available(p, 0, self.now)).count();
        self.max_pods_seen = self.max_pods_seen.max(active.len());
        self.min_available_seen = self.min_available_seen.min(available);
        assert!(
            active.len() <= bounds.max_pods,
            "{} pods exceed the bound {} at {}: {:?}",
            active.len(),
            bounds.max_pods,
            self.now,
            self.summary()
        );
        assert!(
            available >= bounds.min_available,
            "{available} available pods are below the bound {} at {}: {:?}",
            bounds.min_available,
            self.now,
            self.summary()
        );
        let mut templates: Vec<&str> = active
            .iter()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(super::template::POD_TEMPLATE_HASH).map(String::as_str))
            .collect();
        templates.sort_unstable();
        templates.dedup();
        self.templates_overlapped |= templates.len() > 1;
    }

    fn apply(&mut self, action: Action) -> Result<(), Refused> {
        match action {
            Action::Create(obj) if obj["kind"] == "Pod" => {
                let mut pod: Pod = serde_json::from_value(obj).map_err(|_| Refused::NotFound)?;
                let id = self.id();
                let meta = &mut pod.metadata;
                meta.name = Some(format!("{}{id}", meta.generate_name.clone().unwrap_or_default()));
                meta.uid = Some(format!("pod-{id}"));
                meta.creation_timestamp = Some(Time(self.now));
                meta.resource_version = Some(id.to_string());
                if let Some(spec) = pod.spec.as_mut() {
                    spec.node_name = Some("node-1".into());
                }
                pod.status = Some(PodStatus { phase: Some("Pending".into()), ..Default::default() });
                if let Some(key) = ownership::owner_key(&pod.metadata, "ReplicaSet") {
                    self.expectations.creation_observed(&key);
                }
                self.pods.push(Arc::new(pod));
            }
            Action::Create(obj) => {
                let mut rs: ReplicaSet = serde_json::from_value(obj).map_err(|_| Refused::NotFound)?;
                if self.sets.iter().any(|r| r.metadata.name == rs.metadata.name) {
                    return Err(Refused::AlreadyExists);
                }
                let id = self.id();
                rs.metadata.uid = Some(format!("rs-{id}"));
                rs.metadata.creation_timestamp = Some(Time(self.now));
                rs.metadata.resource_version = Some(id.to_string());
                rs.metadata.generation = Some(1);
                self.created_sets.push(rs.metadata.name.clone().unwrap_or_default());
                self.sets.push(Arc::new(rs));
            }
            Action::Update(obj) => {
                let next: ReplicaSet = serde_json::from_value(obj).map_err(|_| Refused::NotFound)?;
                let id = self.id();
                let i = self.position(&next.metadata.name)?;
                let stored = &self.sets[i];
                if stored.metadata.resource_version != next.metadata.resource_version {
                    return Err(Refused::Conflict);
                }
                let mut updated = next.clone();
                updated.status = stored.status.clone();
                let spec_changed = stored.spec != next.spec;
                updated.metadata.generation = stored.metadata.generation.map(|g| g + i64::from(spec_changed));
                updated.metadata.resource_version = Some(id.to_string());
                self.sets[i] = Arc::new(updated);
            }
            Action::UpdateStatus(obj) if obj["kind"] == "Deployment" => {
                let next: Deployment = serde_json::from_value(obj).map_err(|_| Refused::NotFound)?;
                if next.metadata.resource_version != self.deployment.metadata.resource_version {
                    return Err(Refused::Conflict);
                }
                self.deployment.status = next.status;
                self.bump_deployment();
            }
            Action::UpdateStatus(obj) => {
                let next: ReplicaSet = serde_json::from_value(obj).map_err(|_| Refused::NotFound)?;
                let id = self.id();
                let i = self.position(&next.metadata.name)?;
                if self.sets[i].metadata.resource_version != next.metadata.resource_version {
                    return Err(Refused::Conflict);
                }
                let rs = Arc::make_mut(&mut self.sets[i]);
                rs.status = next.status;
                rs.metadata.resource_version = Some(id.to_string());
            }
            Action::Patch { kind, patch, .. } if kind == "Deployment" => {
                let annotations: BTreeMap<String, String> =
                    serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap_or_default();
                self.deployment.metadata.annotations.get_or_insert_with(BTreeMap::new).extend(annotations);
                self.bump_deployment();
            }
            Action::Patch { kind, name, patch, .. } => {
                let refs = serde_json::from_value(patch["metadata"]["ownerReferences"].clone()).ok();
                if kind == "Pod" {
                    let pod = self.pods.iter_mut().find(|p| p.metadata.name.as_deref() == Some(&name));
                    Arc::make_mut(pod.ok_or(Refused::NotFound)?).metadata.owner_references = refs;
                } else {
                    let i = self.position(&Some(name))?;
                    Arc::make_mut(&mut self.sets[i]).metadata.owner_references = refs;
                }
            }
            Action::Delete { kind, name, .. } if kind == "Pod" => {
                let i = self
                    .pods
                    .iter()
                    .position(|p| p.metadata.name.as_deref() == Some(&name))
                    .ok_or(Refused::NotFound)?;
                let pod = self.pods.remove(i);
                if let (Some(key), Some(uid)) = (ownership::owner_key(&pod.metadata, "ReplicaSet"), &pod.metadata.uid) {
                    self.expectations.deletion_observed(&key, uid);
                }
            }
            Action::Delete { name, .. } => {
                let i = self.position(&Some(name))?;
                self.sets.remove(i);
            }
            Action::Event { .. } => {}
            other @ (Action::ForceDelete { .. } | Action::Finalize(_)) => {
                panic!("a deployment never asks for {other:?}")
            }
        }
        Ok(())
    }

    fn position(&self, name: &Option<String>) -> Result<usize, Refused> {
        self.sets.iter().position(|r| &r.metadata.name == name).ok_or(Refused::NotFound)
    }
}

/// A JSON value's string at a pointer, for terse assertions.
pub(crate) fn str_at<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}
