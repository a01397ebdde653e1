//! The ReplicationController controller: the ReplicaSet controller's core
//! (`crate::replicaset`) seen through the older kind, whose selector is a
//! plain label map and whose pods point back with `apiVersion: v1`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use serde_json::Value;
use skiff_api::selector::LabelSelector;

use crate::expectations::Expectations;
use crate::replicaset::{reconcile_replicated, Replicated, BURST_REPLICAS};
use crate::Reconciled;

/// Reconciles one ReplicationController; as [`crate::replicaset::reconcile`].
pub fn reconcile(
    rc: &ReplicationController,
    pods: &[Arc<Pod>],
    expectations: &Expectations,
    now: DateTime<Utc>,
) -> Reconciled {
    let spec = rc.spec.as_ref();
    // An empty or missing selector selects nothing here: defaulting fills it
    // from the template, and adopting every pod would be far worse.
    let selector = spec
        .and_then(|s| s.selector.as_ref())
        .filter(|m| !m.is_empty())
        .and_then(|m| LabelSelector::from_labels(m).ok());
    let view = Replicated {
        api_version: "v1",
        kind: "ReplicationController",
        meta: &rc.metadata,
        replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
        selector,
        template: spec.and_then(|s| s.template.as_ref()),
        min_ready_seconds: spec.and_then(|s| s.min_ready_seconds).unwrap_or(0),
        object: || serde_json::to_value(rc).unwrap_or(Value::Null),
        status: rc.status.as_ref().and_then(|s| serde_json::to_value(s).ok()).unwrap_or(Value::Null),
    };
    reconcile_replicated(&view, pods, expectations, now, BURST_REPLICAS)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ReplicationControllerSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;
    use crate::ownership;
    use crate::pod_state::tests::{at, pod};
    use crate::replicaset::tests::{labels, template};
    use crate::Action;

    fn rc(replicas: i32) -> ReplicationController {
        ReplicationController {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("rc-uid".into()),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(ReplicationControllerSpec {
                replicas: Some(replicas),
                selector: Some(labels(&[("app", "web")])),
                template: Some(template("web", "nginx")),
                min_ready_seconds: None,
            }),
            status: None,
        }
    }

    #[test]
    fn a_replication_controller_creates_pods_owned_through_v1() {
        let r = reconcile(&rc(2), &[], &Expectations::new(), at(0));
        let created: Vec<&Value> = r
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Create(p) => Some(p),
                _ => None,
            })
            .collect();
        assert_eq!(created.len(), 2);
        assert_eq!(created[0]["metadata"]["ownerReferences"][0]["apiVersion"], "v1");
        assert_eq!(created[0]["metadata"]["ownerReferences"][0]["kind"], "ReplicationController");
        let Some(Action::UpdateStatus(obj)) = r.actions.last() else { panic!("status comes last") };
        assert_eq!(obj["kind"], "ReplicationController");
        assert_eq!(obj["status"], json!({"replicas": 0, "observedGeneration": 1}));
    }

    #[test]
    fn a_replication_controller_adopts_matching_orphans_and_scales_down() {
        let controller = rc(1);
        let mut orphan = pod("orphan", 0, "Running", Some("n"), Some(0));
        orphan.metadata.labels = Some(labels(&[("app", "web")]));
        let mut owned = pod("owned", 5, "Pending", None, None);
        owned.metadata.labels = Some(labels(&[("app", "web")]));
        owned.metadata.owner_references =
            Some(vec![ownership::controller_ref("v1", "ReplicationController", &controller.metadata)]);
        let r = reconcile(&controller, &[Arc::new(orphan), Arc::new(owned)], &Expectations::new(), at(10));
        assert!(matches!(&r.actions[0], Action::Patch { name, .. } if name == "orphan"));
        assert!(matches!(&r.actions[1], Action::Delete { name, .. } if name == "owned"));
    }

    #[test]
    fn an_empty_selector_selects_nothing() {
        let mut controller = rc(1);
        controller.spec.as_mut().unwrap().selector = Some(Default::default());
        let mut orphan = pod("orphan", 0, "Running", Some("n"), Some(0));
        orphan.metadata.labels = Some(labels(&[("app", "web")]));
        let r = reconcile(&controller, &[Arc::new(orphan)], &Expectations::new(), at(0));
        assert!(r.actions.iter().all(|a| !matches!(a, Action::Patch { .. })));
    }
}
