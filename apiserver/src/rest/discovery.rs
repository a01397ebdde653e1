//! Discovery for kubectl: `/version`, `/api`, `/apis` in both
//! the aggregated (apidiscovery.k8s.io/v2) and the legacy formats, the
//! per-group-version resource lists (the OpenAPI documents built from the
//! same catalog are in `openapi`). What kubectl sends and expects is in
//! KUBECTL.md §2. The resources CustomResourceDefinitions add are passed
//! in (`custom`), each group with its served versions, preferred first.

use serde_json::{json, Value};
use skiff_api::resources::{catalog, ResourceInfo};

use super::resource_metrics;

/// The Content-Type that tells kubectl a discovery answer is aggregated.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Groups served besides the catalog's: the review APIs `kubectl auth` uses.
const REVIEWS: [(&str, &str, &str, &str); 4] = [
    ("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview", "selfsubjectaccessreview"),
    ("authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview", "selfsubjectrulesreview"),
    ("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview", "subjectaccessreview"),
    ("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview", "selfsubjectreview"),
];

const VERBS: [&str; 7] = ["create", "delete", "get", "list", "patch", "update", "watch"];

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": concat!("v1.32.0-skiff.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// Every group served at v1 (with OpenAPI documents), core ("") first, then by name.
pub(super) fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&str> = catalog().iter().map(|r| r.group).collect();
    groups.extend(REVIEWS.iter().map(|r| r.0));
    groups.sort();
    groups.dedup();
    groups
}

/// Every group discovery lists: the v1 groups and the metrics API.
fn served_groups() -> Vec<&'static str> {
    let mut groups = groups();
    groups.push(resource_metrics::GROUP);
    groups.sort();
    groups
}

/// The one version a group is served at.
fn version_of(group: &str) -> &'static str {
    if group == resource_metrics::GROUP {
        resource_metrics::VERSION
    } else {
        "v1"
    }
}

/// The metrics API's resources (read only).
fn metrics_resources(group: &str) -> &'static [(&'static str, &'static str, &'static str, bool)] {
    if group == resource_metrics::GROUP {
        &resource_metrics::RESOURCES
    } else {
        &[]
    }
}

fn in_group(group: &str) -> impl Iterator<Item = &'static ResourceInfo> + '_ {
    catalog().iter().filter(move |r| r.group == group)
}

/// The kind a subresource answers with.
pub(super) fn subresource_kind(info: &ResourceInfo, sub: &str) -> (String, String, String) {
    match sub {
        "scale" => ("autoscaling".into(), "v1".into(), "Scale".into()),
        "binding" => (String::new(), "v1".into(), "Binding".into()),
        "eviction" => ("policy".into(), "v1".into(), "Eviction".into()),
        "token" => ("authentication.k8s.io".into(), "v1".into(), "TokenRequest".into()),
        "exec" => (String::new(), "v1".into(), "PodExecOptions".into()),
        "attach" => (String::new(), "v1".into(), "PodAttachOptions".into()),
        "portforward" => (String::new(), "v1".into(), "PodPortForwardOptions".into()),
        _ => (info.group.into(), info.version.into(), info.kind.into()),
    }
}

fn subresource_verbs(sub: &str) -> Vec<&'static str> {
    match sub {
        "binding" | "token" | "eviction" => vec!["create"],
        "log" => vec!["get"],
        "exec" | "attach" | "portforward" => vec!["create", "get"],
        "finalize" => vec!["update"],
        _ => vec!["get", "patch", "update"],
    }
}

fn aggregated_resource(info: &ResourceInfo) -> Value {
    let subresources: Vec<Value> = info
        .subresources
        .iter()
        .map(|s| {
            let (g, v, k) = subresource_kind(info, s);
            json!({"subresource": s, "responseKind": {"group": g, "version": v, "kind": k}, "verbs": subresource_verbs(s)})
        })
        .collect();
    let mut r = json!({
        "resource": info.plural,
        "responseKind": {"group": info.group, "version": info.version, "kind": info.kind},
        "scope": if info.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": info.singular,
        "verbs": VERBS,
    });
    if !info.short_names.is_empty() {
        r["shortNames"] = json!(info.short_names);
    }
    if !info.categories.is_empty() {
        r["categories"] = json!(info.categories);
    }
    if !subresources.is_empty() {
        r["subresources"] = json!(subresources);
    }
    r
}

pub(super) fn review_resources(
    group: &str,
) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str, &'static str)> + '_ {
    REVIEWS.iter().filter(move |r| r.0 == group)
}

fn aggregated_group(group: &str) -> Value {
    let mut resources: Vec<Value> = in_group(group).map(aggregated_resource).collect();
    for (g, plural, kind, singular) in review_resources(group) {
        resources.push(json!({
            "resource": plural,
            "responseKind": {"group": g, "version": "v1", "kind": kind},
            "scope": "Cluster",
            "singularResource": singular,
            "verbs": ["create"],
        }));
    }
    for (plural, kind, singular, namespaced) in metrics_resources(group) {
        resources.push(json!({
            "resource": plural,
            "responseKind": {"group": group, "version": resource_metrics::VERSION, "kind": kind},
            "scope": if *namespaced { "Namespaced" } else { "Cluster" },
            "singularResource": singular,
            "verbs": ["get", "list"],
        }));
    }
    let mut metadata = json!({"creationTimestamp": null});
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    let version = version_of(group);
    json!({"metadata": metadata, "versions": [{"version": version, "resources": resources, "freshness": "Current"}]})
}

/// `/api` (core) or `/apis` (every other group), aggregated.
pub fn aggregated(core: bool, custom: &[&'static ResourceInfo]) -> Value {
    let mut items: Vec<Value> =
        served_groups().into_iter().filter(|g| g.is_empty() == core).map(aggregated_group).collect();
    if !core {
        for (group, versions) in custom_groups(custom) {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = custom
                        .iter()
                        .filter(|r| r.group == group && r.version == *v)
                        .map(|r| aggregated_resource(r))
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            items.push(json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions}));
        }
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// The groups of custom resources, each with its versions, preferred
/// first (Kubernetes' order: GA, then beta, then alpha, newest first).
fn custom_groups(custom: &[&'static ResourceInfo]) -> std::collections::BTreeMap<&'static str, Vec<&'static str>> {
    let mut groups: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for r in custom {
        let versions = groups.entry(r.group).or_default();
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    for versions in groups.values_mut() {
        versions.sort_by_key(|v| version_priority(v));
    }
    groups
}

/// A sort key putting `v2` before `v1` before `v1beta2` before `v1beta1`
/// before `v1alpha1` before versions of any other form (by name).
fn version_priority(version: &str) -> (u8, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>, String) {
    use std::cmp::Reverse;
    let parsed = version.strip_prefix('v').and_then(|rest| {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        let (stage, minor) = if tail.is_empty() {
            (0, "0")
        } else if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (2, n)
        } else {
            return None;
        };
        Some((stage, major, minor.parse::<u64>().ok()?))
    });
    match parsed {
        Some((stage, major, minor)) => (stage, Reverse(major), Reverse(minor), String::new()),
        None => (3, Reverse(0), Reverse(0), version.to_string()),
    }
}

/// Legacy `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn api_group(group: &str) -> Value {
    let version = version_of(group);
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv], "preferredVersion": gv})
}

fn custom_api_group(group: &str, versions: &[&str]) -> Value {
    let gvs: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs, "preferredVersion": gvs[0]})
}

/// Legacy `/apis`.
pub fn api_group_list(custom: &[&'static ResourceInfo]) -> Value {
    let mut groups: Vec<Value> = served_groups().into_iter().filter(|g| !g.is_empty()).map(api_group).collect();
    groups.extend(custom_groups(custom).iter().map(|(g, versions)| custom_api_group(g, versions)));
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Legacy `/apis/<group>`, if served.
pub fn group(group: &str, custom: &[&'static ResourceInfo]) -> Option<Value> {
    if let Some(versions) = custom_groups(custom).get(group) {
        return Some(custom_api_group(group, versions));
    }
    served_groups().contains(&group).then(|| api_group(group)).filter(|_| !group.is_empty())
}

/// Legacy `/api/v1` or `/apis/<group>/<version>`, if served.
pub fn resource_list(group: &str, version: &str, custom: &[&'static ResourceInfo]) -> Option<Value> {
    let custom: Vec<&'static ResourceInfo> =
        custom.iter().copied().filter(|r| r.group == group && r.version == version).collect();
    if custom.is_empty() && (version != version_of(group) || !served_groups().contains(&group)) {
        return None;
    }
    let mut resources = Vec::new();
    for info in in_group(group).filter(|r| r.version == version).chain(custom) {
        let mut r = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": VERBS,
        });
        if !info.short_names.is_empty() {
            r["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            r["categories"] = json!(info.categories);
        }
        resources.push(r);
        for s in info.subresources {
            let (g, v, k) = subresource_kind(info, s);
            let mut sub = json!({"name": format!("{}/{s}", info.plural), "singularName": "", "namespaced": info.namespaced,
                "kind": k, "verbs": subresource_verbs(s)});
            if g != info.group || v != info.version {
                sub["group"] = json!(g);
                sub["version"] = json!(v);
            }
            resources.push(sub);
        }
    }
    for (_, plural, kind, singular) in review_resources(group) {
        resources.push(
            json!({"name": plural, "singularName": singular, "namespaced": false, "kind": kind, "verbs": ["create"]}),
        );
    }
    for (plural, kind, singular, namespaced) in metrics_resources(group) {
        resources.push(json!({"name": plural, "singularName": singular, "namespaced": namespaced, "kind": kind,
            "verbs": ["get", "list"]}));
    }
    let group_version = if group.is_empty() { "v1".to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregated_discovery_lists_every_resource_with_its_kind() {
        let core = aggregated(true, &[]);
        let resources = core["items"][0]["versions"][0]["resources"].as_array().unwrap();
        let pods = resources.iter().find(|r| r["resource"] == "pods").unwrap();
        assert_eq!(pods["responseKind"]["kind"], "Pod");
        assert_eq!(pods["categories"], json!(["all"]));
        let apis = aggregated(false, &[]);
        let names: Vec<&str> =
            apis["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"apps") && names.contains(&"authorization.k8s.io"));
        let apps = apis["items"].as_array().unwrap().iter().find(|i| i["metadata"]["name"] == "apps").unwrap();
        let deploy = apps["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "deployments")
            .unwrap();
        let scale = deploy["subresources"].as_array().unwrap().iter().find(|s| s["subresource"] == "scale").unwrap();
        assert_eq!(scale["responseKind"], json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}));
    }

    #[test]
    fn the_metrics_api_is_discovered_at_v1beta1_as_kubectl_top_looks_for_it() {
        let apis = aggregated(false, &[]);
        let metrics =
            apis["items"].as_array().unwrap().iter().find(|i| i["metadata"]["name"] == "metrics.k8s.io").unwrap();
        assert_eq!(metrics["versions"][0]["version"], "v1beta1");
        let kinds: Vec<&str> = metrics["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["responseKind"]["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["NodeMetrics", "PodMetrics"]);
        assert_eq!(group("metrics.k8s.io", &[]).unwrap()["preferredVersion"]["groupVersion"], "metrics.k8s.io/v1beta1");
        let list = resource_list("metrics.k8s.io", "v1beta1", &[]).unwrap();
        assert_eq!(list["resources"][1]["name"], "pods");
        assert!(resource_list("metrics.k8s.io", "v1", &[]).is_none());
    }

    #[test]
    fn custom_groups_list_their_versions_preferred_first() {
        let mut versions = vec!["v1alpha1", "v2", "v1beta2", "foo", "v1", "v1beta1", "v10"];
        versions.sort_by_key(|v| version_priority(v));
        assert_eq!(versions, ["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]);
    }
}
