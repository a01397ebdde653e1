//! The evaluator, table by table: rule matching, bindings' scopes,
//! subjects, aggregation, and the escalation check's coverage.

use serde_json::{json, Value};

use super::bootstrap::{cluster_role_bindings, cluster_roles};
use super::*;

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
}

fn res<'a>(verb: &'a str, group: &'a str, resource: &'a str, namespace: &'a str, name: &'a str) -> Action<'a> {
    Action::Resource { verb, group, resource, subresource: "", namespace, name }
}

fn sub<'a>(verb: &'a str, resource: &'a str, subresource: &'a str, namespace: &'a str) -> Action<'a> {
    Action::Resource { verb, group: "", resource, subresource, namespace, name: "p" }
}

fn rule(v: Value) -> Rule {
    Rule::from_json(&v)
}

#[test]
fn rules_match_verbs_groups_resources_subresources_and_names() {
    let pods = rule(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}));
    let any_scale = rule(json!({"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["update"]}));
    let logs = rule(json!({"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}));
    let named = rule(json!({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"], "verbs": ["*"]}));
    let everything = rule(json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}));
    let urls = rule(json!({"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]}));
    for (rule, action, allowed) in [
        (&pods, res("get", "", "pods", "ns", "p"), true),
        (&pods, res("list", "", "pods", "ns", ""), true),
        (&pods, res("delete", "", "pods", "ns", "p"), false),
        (&pods, res("get", "apps", "pods", "ns", "p"), false),
        (&pods, res("get", "", "services", "ns", "s"), false),
        // A subresource needs its own rule.
        (&pods, sub("get", "pods", "log", "ns"), false),
        (&logs, sub("get", "pods", "log", "ns"), true),
        (&logs, res("get", "", "pods", "ns", "p"), false),
        (
            &any_scale,
            Action::Resource {
                verb: "update",
                group: "apps",
                resource: "deployments",
                subresource: "scale",
                namespace: "n",
                name: "d",
            },
            true,
        ),
        (&any_scale, res("update", "apps", "deployments", "n", "d"), false),
        // Names narrow a rule; a collection request has no name to match.
        (&named, res("delete", "", "configmaps", "ns", "a"), true),
        (&named, res("delete", "", "configmaps", "ns", "b"), false),
        (&named, res("list", "", "configmaps", "ns", ""), false),
        (&everything, res("escalate", RBAC_GROUP, "clusterroles", "", "x"), true),
        (&everything, Action::Path { verb: "get", path: "/metrics" }, false),
        (&urls, Action::Path { verb: "get", path: "/healthz" }, true),
        (&urls, Action::Path { verb: "get", path: "/apis/apps/v1" }, true),
        (&urls, Action::Path { verb: "post", path: "/healthz" }, false),
        (&urls, Action::Path { verb: "get", path: "/healthz/etcd" }, false),
        (&urls, res("get", "", "pods", "ns", "p"), false),
    ] {
        assert_eq!(rule.allows(&action), allowed, "{rule:?} {action:?}");
    }
}

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

fn role(kind: &str, namespace: &str, name: &str, rules: Value) -> Value {
    json!({"kind": kind, "metadata": {"name": name, "namespace": namespace}, "rules": rules})
}

fn binding(namespace: &str, name: &str, role_kind: &str, role: &str, subjects: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": namespace},
           "roleRef": {"apiGroup": RBAC_GROUP, "kind": role_kind, "name": role}, "subjects": subjects})
}

fn reader(resource: &str) -> Value {
    json!([{"apiGroups": [""], "resources": [resource], "verbs": ["get", "list", "watch"]}])
}

#[test]
fn bindings_grant_in_their_scope_to_their_subjects() {
    let policy = Policy::new(
        &[role("Role", "a", "cm-reader", reader("configmaps"))],
        &[
            role("ClusterRole", "", "pod-reader", reader("pods")),
            role("ClusterRole", "", "node-reader", reader("nodes")),
        ],
        &[
            binding("a", "b1", "Role", "cm-reader", json!([{"kind": "User", "name": "alice"}])),
            binding("a", "b2", "ClusterRole", "pod-reader", json!([{"kind": "Group", "name": "devs"}])),
            // No namespace on a RoleBinding's service account: the binding's.
            binding("a", "b3", "ClusterRole", "pod-reader", json!([{"kind": "ServiceAccount", "name": "robot"}])),
            binding("a", "b4", "Role", "missing", json!([{"kind": "User", "name": "alice"}])),
        ],
        &[binding("", "c1", "ClusterRole", "node-reader", json!([{"kind": "User", "name": "carol"}]))],
    );
    let alice = user("alice", &["system:authenticated"]);
    let dev = user("dan", &["devs"]);
    let carol = user("carol", &[]);
    let robot = user("system:serviceaccount:a:robot", &["system:serviceaccounts"]);
    let other_robot = user("system:serviceaccount:b:robot", &[]);
    for (who, action, allowed) in [
        (&alice, res("get", "", "configmaps", "a", "x"), true),
        (&alice, res("get", "", "configmaps", "b", "x"), false),
        // A role binding never reaches across namespaces or the cluster scope.
        (&alice, res("list", "", "configmaps", "", ""), false),
        (&alice, res("get", "", "pods", "a", "x"), false),
        (&dev, res("get", "", "pods", "a", "x"), true),
        (&dev, res("get", "", "pods", "b", "x"), false),
        (&robot, res("list", "", "pods", "a", ""), true),
        (&other_robot, res("list", "", "pods", "a", ""), false),
        // A cluster binding reaches every namespace and the cluster scope.
        (&carol, res("get", "", "nodes", "", "n1"), true),
        (&carol, res("get", "", "pods", "a", "x"), false),
    ] {
        assert_eq!(policy.allows(who, &action), allowed, "{} {action:?}", who.name);
    }
    assert_eq!(policy.rules_for(&alice, "a").len(), 1);
    assert!(policy.rules_for(&alice, "b").is_empty());
}

#[test]
fn the_default_policy_makes_masters_admins_and_everyone_a_discoverer() {
    let policy = Policy::new(&[], &cluster_roles(), &[], &cluster_role_bindings());
    let master = user("root", &["system:masters"]);
    let someone = user("someone", &["system:authenticated"]);
    let anonymous = UserInfo::anonymous();
    assert!(policy.allows(&master, &res("delete", "", "nodes", "", "n1")));
    assert!(policy.allows(&master, &Action::Path { verb: "get", path: "/metrics" }));
    assert!(policy.allows(&someone, &Action::Path { verb: "get", path: "/apis/apps/v1" }));
    assert!(policy.allows(&someone, &res("create", "authorization.k8s.io", "selfsubjectaccessreviews", "", "")));
    assert!(!policy.allows(&someone, &res("list", "", "pods", "default", "")));
    assert!(!policy.allows(&someone, &Action::Path { verb: "get", path: "/metrics" }));
    assert!(policy.allows(&anonymous, &Action::Path { verb: "get", path: "/version" }));
    assert!(!policy.allows(&anonymous, &Action::Path { verb: "get", path: "/api" }));
}

/// `view` ⊂ `edit` ⊂ `admin` through nested aggregation, and a role a user
/// labels joins them.
#[test]
fn aggregation_is_followed_transitively() {
    let mut roles = cluster_roles();
    roles.push(
        json!({"metadata": {"name": "widgets", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
                      "rules": reader("widgets")}),
    );
    // A cycle ends, adding each role's rules once.
    roles.push(json!({"metadata": {"name": "loop-a", "labels": {"loop": "a"}},
                      "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"loop": "b"}}]}}));
    roles.push(json!({"metadata": {"name": "loop-b", "labels": {"loop": "b"}}, "rules": reader("gadgets"),
                      "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"loop": "a"}}]}}));
    let bind = |role: &str, who: &str| binding("t", who, "ClusterRole", role, json!([{"kind": "User", "name": who}]));
    let policy = Policy::new(&[], &roles, &[bind("view", "v"), bind("edit", "e"), bind("admin", "a")], &[]);
    let (v, e, a) = (user("v", &[]), user("e", &[]), user("a", &[]));
    let read_widgets = res("list", "", "widgets", "t", "");
    let delete_pods = res("delete", "", "pods", "t", "p");
    let bind_roles = res("create", RBAC_GROUP, "rolebindings", "t", "");
    assert!(policy.allows(&v, &read_widgets) && policy.allows(&e, &read_widgets) && policy.allows(&a, &read_widgets));
    assert!(!policy.allows(&v, &delete_pods) && policy.allows(&e, &delete_pods) && policy.allows(&a, &delete_pods));
    assert!(!policy.allows(&v, &bind_roles) && !policy.allows(&e, &bind_roles) && policy.allows(&a, &bind_roles));
    assert!(!policy.allows(&v, &res("get", "", "secrets", "t", "s")));
    assert_eq!(policy.role_rules("ClusterRole", "", "loop-a").unwrap(), &[rule(reader("gadgets")[0].clone())]);
    let admin = policy.role_rules("ClusterRole", "", "admin").unwrap();
    let mut unique = admin.to_vec();
    unique.dedup();
    assert_eq!(unique.len(), admin.len());
}

#[test]
fn coverage_for_escalation_checks() {
    let owned = vec![
        rule(json!({"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list"]})),
        rule(json!({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]})),
        rule(json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]})),
        rule(json!({"nonResourceURLs": ["/logs/*"], "verbs": ["get"]})),
    ];
    for (wanted, covered) in [
        (json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}), true),
        (json!({"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["list", "get"]}), true),
        (json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}), false),
        (json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}), false),
        (json!({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}), false),
        (json!({"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["update"]}), true),
        (json!({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]}), true),
        (json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mine"], "verbs": ["get"]}), true),
        (json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["yours"], "verbs": ["get"]}), false),
        (json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}), false),
        (json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["p"], "verbs": ["get"]}), true),
        (json!({"nonResourceURLs": ["/logs/kube"], "verbs": ["get"]}), true),
        (json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}), false),
    ] {
        assert_eq!(covers(&owned, &rule(wanted.clone())), covered, "{wanted}");
    }
}

#[test]
fn denials_read_as_kubernetes_words_them() {
    let alice = user("alice", &[]);
    assert_eq!(
        res("delete", "", "configmaps", "team", "c").denial(&alice),
        "User \"alice\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""
    );
    assert_eq!(
        res("list", "apps", "deployments", "", "").denial(&alice),
        "User \"alice\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
    );
    assert_eq!(
        sub("get", "pods", "log", "t").denial(&alice),
        "User \"alice\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"t\""
    );
    assert_eq!(
        Action::Path { verb: "get", path: "/metrics" }.denial(&alice),
        "User \"alice\" cannot get path \"/metrics\""
    );
}
