//! The roles and bindings every cluster has, after Kubernetes' bootstrap
//! policy: `cluster-admin` for `system:masters`; the user-facing `admin`,
//! `edit` and `view`, aggregated from the `system:aggregate-to-*` roles so
//! that a ClusterRole labelled `rbac.authorization.k8s.io/aggregate-to-view`
//! extends `view` (and through it `edit` and `admin`); discovery, the
//! self-reviews and the public health paths for every authenticated user.
//! Every master creates the missing ones at start
//! ([`crate::registry::Registry::ensure_bootstrap_policy`]); ones an
//! operator changed are left as they are.

use serde_json::{json, Value};
use skiff_api::resources::RBAC;

const READ: [&str; 3] = ["get", "list", "watch"];
const WRITE: [&str; 5] = ["create", "delete", "deletecollection", "patch", "update"];
const ALL: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

const AGGREGATE_TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const AGGREGATE_TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const AGGREGATE_TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The group Kubernetes' superusers are in: allowed everything, before
/// and without RBAC.
pub const MASTERS: &str = "system:masters";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn urls(paths: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": paths, "verbs": verbs})
}

fn metadata(name: &str, labels: &[(&str, &str)]) -> Value {
    let mut l = serde_json::Map::new();
    l.insert("kubernetes.io/bootstrapping".into(), json!("rbac-defaults"));
    for (k, v) in labels {
        l.insert(k.to_string(), json!(v));
    }
    json!({"name": name, "labels": l, "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
}

fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({"apiVersion": format!("{RBAC}/v1"), "kind": "ClusterRole", "metadata": metadata(name, labels), "rules": rules})
}

fn aggregated(name: &str, labels: &[(&str, &str)], selects: &str) -> Value {
    let mut role = cluster_role(name, labels, Vec::new());
    role["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {selects: "true"}}]});
    role
}

/// `(kind, name)` pairs for a binding's subjects.
fn cluster_role_binding(name: &str, role: &str, subjects: &[(&str, &str)]) -> Value {
    let subjects: Vec<Value> =
        subjects.iter().map(|(kind, name)| json!({"kind": kind, "apiGroup": RBAC, "name": name})).collect();
    json!({"apiVersion": format!("{RBAC}/v1"), "kind": "ClusterRoleBinding", "metadata": metadata(name, &[]),
           "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role}, "subjects": subjects})
}

/// The default ClusterRoles.
pub fn cluster_roles() -> Vec<Value> {
    vec![
        cluster_role("cluster-admin", &[], vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])]),
        aggregated("admin", &[], AGGREGATE_TO_ADMIN),
        aggregated("edit", &[(AGGREGATE_TO_ADMIN, "true")], AGGREGATE_TO_EDIT),
        aggregated("view", &[(AGGREGATE_TO_EDIT, "true")], AGGREGATE_TO_VIEW),
        cluster_role(
            "system:aggregate-to-admin",
            &[(AGGREGATE_TO_ADMIN, "true")],
            vec![
                rule(&[RBAC], &["roles", "rolebindings"], &ALL),
                rule(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]),
                rule(&[""], &["resourcequotas", "limitranges"], &WRITE),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[(AGGREGATE_TO_EDIT, "true")],
            vec![
                rule(&[""], &["pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], &["create", "get"]),
                rule(&[""], &["pods/eviction"], &["create"]),
                rule(
                    &[""],
                    &[
                        "pods",
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                    ],
                    &WRITE,
                ),
                rule(&[""], &["secrets"], &READ),
                rule(&[""], &["serviceaccounts/token"], &["create"]),
                rule(
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                    &WRITE,
                ),
                rule(&["batch"], &["cronjobs", "jobs"], &WRITE),
                rule(&["discovery.k8s.io"], &["endpointslices"], &WRITE),
                rule(&["coordination.k8s.io"], &["leases"], &ALL),
                rule(&["autoscaling"], &["horizontalpodautoscalers"], &WRITE),
                rule(&["policy"], &["poddisruptionbudgets"], &WRITE),
                rule(&["networking.k8s.io"], &["ingresses", "networkpolicies"], &WRITE),
            ],
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[(AGGREGATE_TO_VIEW, "true")],
            vec![
                rule(
                    &[""],
                    &[
                        "pods",
                        "pods/log",
                        "pods/status",
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "replicationcontrollers/status",
                        "serviceaccounts",
                        "services",
                        "services/status",
                        "bindings",
                        "events",
                        "limitranges",
                        "resourcequotas",
                        "resourcequotas/status",
                        "namespaces",
                        "namespaces/status",
                    ],
                    &READ,
                ),
                rule(
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                    &READ,
                ),
                rule(&["batch"], &["cronjobs", "cronjobs/status", "jobs", "jobs/status"], &READ),
                rule(&["discovery.k8s.io"], &["endpointslices"], &READ),
                rule(&["autoscaling"], &["horizontalpodautoscalers", "horizontalpodautoscalers/status"], &READ),
                rule(&["policy"], &["poddisruptionbudgets", "poddisruptionbudgets/status"], &READ),
                rule(&["networking.k8s.io"], &["ingresses", "ingresses/status", "networkpolicies"], &READ),
            ],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![urls(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(&["authorization.k8s.io"], &["selfsubjectaccessreviews", "selfsubjectrulesreviews"], &["create"]),
                rule(&["authentication.k8s.io"], &["selfsubjectreviews"], &["create"]),
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![urls(&["/healthz", "/livez", "/readyz", "/version", "/version/"], &["get"])],
        ),
        cluster_role("system:monitoring", &[], vec![urls(&["/metrics", "/metrics/*", "/livez", "/readyz"], &["get"])]),
        // Skiff's controller manager runs every controller under one
        // identity (Kubernetes gives each its own service account), and
        // those controllers between them manage every kind: it may do
        // anything with resources, and nothing with non-resource URLs.
        cluster_role("system:kube-controller-manager", &[], vec![rule(&["*"], &["*"], &["*"])]),
        cluster_role(
            "system:kube-scheduler",
            &[],
            vec![
                rule(
                    &[""],
                    &[
                        "pods",
                        "nodes",
                        "namespaces",
                        "services",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                        "replicationcontrollers",
                    ],
                    &READ,
                ),
                rule(&[""], &["pods/binding", "bindings"], &["create"]),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                rule(&[""], &["pods"], &["delete"]),
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
                rule(&["apps"], &["replicasets", "statefulsets"], &READ),
                rule(&["policy"], &["poddisruptionbudgets"], &READ),
                rule(&["storage.k8s.io"], &["storageclasses", "csinodes", "csidrivers", "csistoragecapacities"], &READ),
                rule(&["scheduling.k8s.io"], &["priorityclasses"], &READ),
                rule(&["coordination.k8s.io"], &["leases"], &["create", "get", "list", "watch", "update", "patch"]),
            ],
        ),
        // What a node agent needs, as Kubernetes' `system:node`. No node
        // is bound to it: the Node authorizer grants nodes `node_rules`
        // and, object by object, what their pods reference.
        cluster_role("system:node", &[], {
            let mut rules = node_rules();
            rules.push(rule(&[""], &["configmaps", "secrets", "persistentvolumeclaims", "persistentvolumes"], &READ));
            rules.push(rule(&[""], &["serviceaccounts/token"], &["create"]));
            rules
        }),
    ]
}

/// What every node may do whatever its pods are: its own Node and Lease
/// (which ones, NodeRestriction decides), the pods bound to it, events,
/// and the cluster-wide reads a node agent and its service proxy make.
/// Secrets, ConfigMaps, claims and service account tokens are not here:
/// the Node authorizer grants them per object.
pub fn node_rules() -> Vec<Value> {
    vec![
        rule(&[""], &["nodes"], &["create", "get", "list", "watch", "patch", "update", "delete"]),
        rule(&[""], &["nodes/status"], &["patch", "update"]),
        rule(&[""], &["pods"], &["get", "list", "watch", "create", "delete"]),
        rule(&[""], &["pods/status"], &["patch", "update"]),
        rule(&[""], &["pods/eviction"], &["create"]),
        rule(&[""], &["services", "endpoints", "namespaces"], &READ),
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], &READ),
        rule(&["storage.k8s.io"], &["csidrivers", "csinodes", "volumeattachments"], &READ),
        rule(&["coordination.k8s.io"], &["leases"], &["create", "get", "list", "watch", "update", "patch", "delete"]),
        rule(&["node.k8s.io"], &["runtimeclasses"], &READ),
    ]
}

/// The default ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<Value> {
    vec![
        cluster_role_binding("cluster-admin", "cluster-admin", &[("Group", MASTERS)]),
        cluster_role_binding("system:discovery", "system:discovery", &[("Group", "system:authenticated")]),
        cluster_role_binding("system:basic-user", "system:basic-user", &[("Group", "system:authenticated")]),
        cluster_role_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[("Group", "system:authenticated"), ("Group", "system:unauthenticated")],
        ),
        cluster_role_binding("system:monitoring", "system:monitoring", &[("Group", "system:monitoring")]),
        cluster_role_binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            &[("User", "system:kube-controller-manager")],
        ),
        cluster_role_binding("system:kube-scheduler", "system:kube-scheduler", &[("User", "system:kube-scheduler")]),
        // As in Kubernetes, without subjects: nodes are authorized by the
        // Node authorizer (node_authorizer.rs), which narrows their reads.
        cluster_role_binding("system:node", "system:node", &[]),
    ]
}
