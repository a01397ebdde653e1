//! The writes a controller's logic asks for. Logic never calls the API: it
//! returns actions, so a reconcile is a function of the cache contents that
//! a unit test can check without a cluster, and the runner carries them out
//! (in order, stopping at the first failure, whose error requeues the key
//! with back-off).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// One write against the API. Objects are the JSON of the Kubernetes type,
/// with `apiVersion` and `kind` set, so the runner finds the resource from
/// the object itself (`skiff_api::resources::by_kind`).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create an object (`metadata.name` or `metadata.generateName` set).
    Create(Value),
    /// Replace an object; its `metadata.resourceVersion` makes this a
    /// compare-and-swap, so a stale cache ends in Conflict and a requeue.
    Update(Value),
    /// Replace an object's `status` subresource (compare-and-swap as above).
    UpdateStatus(Value),
    /// A JSON merge patch of one object.
    Patch { api_version: String, kind: String, namespace: String, name: String, patch: Value },
    /// Delete one object; `uid` (when set) is a precondition so a delete
    /// never hits a newer object of the same name.
    Delete {
        api_version: String,
        kind: String,
        namespace: String,
        name: String,
        uid: Option<String>,
        /// `Background`, `Foreground` or `Orphan`; `None` for the kind's default.
        propagation: Option<String>,
    },
    /// Delete one object at once (`gracePeriodSeconds: 0`, as `kubectl
    /// delete --force --grace-period=0`): for pods whose node is gone, whose
    /// kubelet will never finish a graceful delete. `uid` as for `Delete`.
    ForceDelete { api_version: String, kind: String, namespace: String, name: String, uid: Option<String> },
    /// Replace a namespace's `spec.finalizers` through its `finalize`
    /// subresource (the namespace controller's last step); the object
    /// carries `metadata.resourceVersion` for compare-and-swap. Kubernetes
    /// changes nothing but `spec.finalizers` through this subresource.
    Finalize(Value),
    /// Record an Event about an object (`Normal` or `Warning`).
    Event { regarding: Value, type_: String, reason: String, message: String },
}

/// What one reconcile asks for: the writes, in order, and when to look
/// again even if no event arrives (a pod becoming available after
/// `minReadySeconds`, expectations expiring, a progress deadline).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reconciled {
    pub actions: Vec<Action>,
    pub requeue_after: Option<std::time::Duration>,
}

impl Reconciled {
    /// Keeps the earlier of two requeue times.
    pub fn requeue_within(&mut self, after: std::time::Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |r| r.min(after)));
    }
}

impl Action {
    /// A delete of `obj` (a typed object of a namespaced or cluster-scoped
    /// kind), guarded by its uid.
    pub fn delete_of<K>(obj: &K, propagation: Option<&str>) -> Action
    where
        K: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>,
    {
        let meta = obj.metadata();
        Action::Delete {
            api_version: K::API_VERSION.to_string(),
            kind: K::KIND.to_string(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            propagation: propagation.map(str::to_string),
        }
    }

    /// An Event about `obj` (a typed object).
    pub fn event_about<K>(obj: &K, type_: &str, reason: &str, message: String) -> Action
    where
        K: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>,
    {
        let meta = obj.metadata();
        Action::Event {
            regarding: serde_json::json!({
                "apiVersion": K::API_VERSION,
                "kind": K::KIND,
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": meta.uid,
            }),
            type_: type_.to_string(),
            reason: reason.to_string(),
            message,
        }
    }
}
