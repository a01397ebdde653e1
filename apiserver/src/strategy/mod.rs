//! Per-kind rules of the registry, as Kubernetes' `strategy.go` per
//! resource: what a kind does on create, update and delete beyond the
//! generic Kubernetes semantics the registry implements for every kind.
//!
//! The registry asks the kind's [`Strategy`] at fixed points of a write:
//! - create: [`Strategy::prepare_for_create`] on the body, then (after
//!   naming, defaulting and admission) [`Strategy::allocate`] and
//!   [`Strategy::validate_create`]; the store transaction also creates
//!   every key of [`Strategy::held`], each with a "must not exist" compare.
//! - update: [`Strategy::prepare_for_update`] on the merged body of the
//!   main resource, then [`Strategy::allocate`] and
//!   [`Strategy::validate_update`]; keys of [`Strategy::held`] that
//!   appear or disappear are created or deleted in the same transaction.
//! - delete: [`Strategy::grace_period`] and [`Strategy::prepare_for_delete`]
//!   decide whether the object is removed now or marked; removing it
//!   deletes the keys it [`held`](Strategy::held) and every key under its
//!   [`owned_prefixes`](Strategy::owned_prefixes).
//!
//! [`of`] picks the strategy of a kind. Its `match` is exhaustive, so a new
//! [`Kind`] does not compile until it is given one: [`Default`] for a kind
//! without rules of its own, or one file here beside the others.

use serde_json::Value;
use skiff_api::field::FieldError;
use skiff_api::resources::{Kind, ResourceInfo};
use skiff_api::validation;

mod custom;
mod job;
mod namespace;
mod node;
pub mod pod;
mod service;
mod workload;

/// A kind's rules. Every method has the behaviour of a kind without rules
/// of its own as its default.
pub trait Strategy: Send + Sync {
    /// Whether `metadata.generation` counts changes of the spec (starts at
    /// 1 and grows with every change a controller must act on).
    fn tracks_generation(&self) -> bool {
        false
    }

    /// Clears what a client may not set on create, before a name is
    /// generated. By default the status, for kinds with a status
    /// subresource: it is the controllers' to write, through it.
    fn prepare_for_create(&self, info: &ResourceInfo, obj: &mut Value) {
        if info.has_subresource("status") {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
    }

    /// Carries over from `old` what an update of the main resource may not
    /// change: by default the status, for kinds with a status subresource.
    fn prepare_for_update(&self, info: &ResourceInfo, obj: &mut Value, old: &Value) {
        if info.has_subresource("status") {
            match old.get("status") {
                Some(s) => obj["status"] = s.clone(),
                None => {
                    if let Some(m) = obj.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
    }

    /// Every problem with a normalized, defaulted object to be created.
    fn validate_create(&self, info: &ResourceInfo, obj: &Value) -> Vec<FieldError> {
        validation::validate(info, obj, None)
    }

    /// Every problem with an update of `old` to `obj` through `subresource`
    /// ("" for the main resource).
    fn validate_update(&self, info: &ResourceInfo, obj: &Value, old: &Value, subresource: &str) -> Vec<FieldError> {
        let _ = subresource;
        validation::validate(info, obj, Some(old))
    }

    /// Fills in what the object holds exclusively (a Service's cluster IP
    /// and node ports) and checks what the user chose; `old` is the stored
    /// object on update. Returns the user's choices, so one found taken is
    /// reported against its field instead of retried.
    fn allocate(&self, obj: &mut Value, old: Option<&Value>) -> Result<Vec<Claim>, FieldError> {
        let _ = (obj, old);
        Ok(Vec::new())
    }

    /// The keys `obj` holds exclusively: created with it, each under a
    /// "must not exist" compare, and deleted with it.
    fn held(&self, obj: &Value) -> Vec<String> {
        let _ = obj;
        Vec::new()
    }

    /// Key prefixes whose every key goes in the transaction that removes
    /// `obj` (a CRD's custom resources).
    fn owned_prefixes(&self, obj: &Value) -> Vec<String> {
        let _ = obj;
        Vec::new()
    }

    /// Seconds a delete waits for the object's owner to clean up; `asked`
    /// is the request's `gracePeriodSeconds`.
    fn grace_period(&self, obj: &Value, asked: Option<i64>) -> i64 {
        let _ = (obj, asked);
        0
    }

    /// Whether the kind's own finalization of `obj` (beyond
    /// `metadata.finalizers`) is still to be done: an update that leaves a
    /// marked object with no finalizers completes its delete only if not.
    fn finalizing(&self, obj: &Value) -> bool {
        let _ = obj;
        false
    }

    /// Prepares `obj` (the object as the delete will leave it) for its own
    /// finalization. `true`: the object is only marked for deletion and
    /// stays until that finalization is done.
    fn prepare_for_delete(&self, obj: &mut Value) -> bool {
        let _ = obj;
        false
    }
}

/// A key a user chose for an object to hold (a Service's `clusterIP` or
/// `nodePort`), with the error to answer if someone else holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub key: String,
    pub taken: FieldError,
}

/// The rules of a kind that has none beyond the generic ones.
pub struct Default;

impl Strategy for Default {}

/// The strategy of `kind`.
pub fn of(kind: Kind) -> &'static dyn Strategy {
    match kind {
        Kind::Namespace => &namespace::Namespace,
        Kind::Pod => &pod::Pod,
        Kind::Node => &node::Node,
        Kind::Service => &service::Service,
        Kind::Job => &job::Job,
        Kind::ReplicationController
        | Kind::ReplicaSet
        | Kind::Deployment
        | Kind::DaemonSet
        | Kind::CronJob
        | Kind::PodDisruptionBudget => &workload::Workload,
        Kind::Endpoints
        | Kind::EndpointSlice
        | Kind::ConfigMap
        | Kind::Secret
        | Kind::ServiceAccount
        | Kind::Event
        | Kind::Lease
        | Kind::ResourceQuota
        | Kind::LimitRange
        | Kind::PriorityClass
        | Kind::Role
        | Kind::ClusterRole
        | Kind::RoleBinding
        | Kind::ClusterRoleBinding => &Default,
        Kind::CustomResourceDefinition => &custom::Definition,
        Kind::Custom => &custom::Resource,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use skiff_api::resources;

    use super::*;

    #[test]
    fn status_is_cleared_on_create_only_for_kinds_with_a_status_subresource() {
        let mut deployment = json!({"spec": {}, "status": {"replicas": 3}});
        of(Kind::Deployment).prepare_for_create(resources::of(Kind::Deployment), &mut deployment);
        assert!(deployment.get("status").is_none());
        let mut config = json!({"data": {}, "status": {"x": 1}});
        of(Kind::ConfigMap).prepare_for_create(resources::of(Kind::ConfigMap), &mut config);
        assert_eq!(config["status"], json!({"x": 1}));
    }

    #[test]
    fn an_update_of_the_main_resource_keeps_the_stored_status() {
        let info = resources::of(Kind::Deployment);
        let mut next = json!({"spec": {"replicas": 2}, "status": {"replicas": 9}});
        of(Kind::Deployment).prepare_for_update(info, &mut next, &json!({"status": {"replicas": 1}}));
        assert_eq!(next["status"], json!({"replicas": 1}));
        let mut next = json!({"spec": {}, "status": {"replicas": 9}});
        of(Kind::Deployment).prepare_for_update(info, &mut next, &json!({"spec": {}}));
        assert!(next.get("status").is_none());
    }

    #[test]
    fn only_spec_driven_kinds_track_generation() {
        let tracking: Vec<Kind> =
            resources::catalog().iter().map(|r| r.kind_id).filter(|k| of(*k).tracks_generation()).collect();
        assert_eq!(
            tracking,
            vec![
                Kind::ReplicationController,
                Kind::ReplicaSet,
                Kind::Deployment,
                Kind::DaemonSet,
                Kind::Job,
                Kind::CronJob,
                Kind::PodDisruptionBudget
            ]
        );
    }
}
